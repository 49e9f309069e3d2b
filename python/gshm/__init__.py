# SPDX-License-Identifier: Apache-2.0
"""gshm: named, permissioned GPU and host memory segments shared between
processes through gshmd, from Python (ctypes over libgshm.so).

    import gshm, numpy
    with gshm.Client() as c:
        with c.create("demo/buf", 1 << 20, location="host", mode=0o640) as seg:
            a = seg.view("float32", (512, 512))       # numpy, on the shared memory
        with c.open("demo/buf", "r") as seg:
            b = numpy.frombuffer(seg, numpy.float32)   # buffer protocol
        c.unlink("demo/buf")

Device segments give views with __cuda_array_interface__ and DLPack:

    with c.open("kv/0", "rw") as seg:
        seg.map(devices=[1])
        t = torch.from_dlpack(seg.view("float16", (4096, 128)))

See gshm.torch for sharing whole state_dicts.  The library is found through
$GSHM_LIBRARY, then libgshm.so* next to this package or in ../build/client of
the source tree, then the dynamic linker's search path.
"""

from typing import Any

from ._errors import (Error, NotFound, Exists, PermissionDenied, InvalidArgument,
                      Unreachable, NoDevice, NotSupported, OutOfMemory, LimitExceeded,
                      Revoked, ProtocolError, TimedOut, ForkedChild, Canceled)
from ._dtypes import DType, DTypeLike, DTYPES, dtype
from ._info import (SegmentInfo, LeaseInfo, ClientInfo, StatusInfo, DeviceInfo, PeerInfo,
                    ClusterPeer, PullResult)
from ._segment import Segment, HostSegment, DeviceSegment, DeviceArray, Shape, Devices
from ._client import Client, AnySegment, Location
from ._copy import copy, copy_signal, signal, wait
from ._lib import (GSHM_ACCESS_READ as ACCESS_READ, GSHM_ACCESS_READ_WRITE as ACCESS_READ_WRITE,
                   GSHM_CREATE_LEGACY_IPC as CREATE_LEGACY_IPC, GSHM_NAME_MAX as NAME_MAX,
                   library_path)

__version__ = "0.1.0"

__all__ = [
    "Client", "Segment", "HostSegment", "DeviceSegment", "DeviceArray",
    "SegmentInfo", "LeaseInfo", "ClientInfo", "StatusInfo", "DeviceInfo", "PeerInfo",
    "ClusterPeer", "PullResult",
    "copy", "copy_signal", "signal", "wait",
    "Error", "NotFound", "Exists", "PermissionDenied", "InvalidArgument", "Unreachable",
    "NoDevice", "NotSupported", "OutOfMemory", "LimitExceeded", "Revoked", "ProtocolError",
    "TimedOut", "ForkedChild", "Canceled",
    "DType", "DTYPES", "dtype", "ACCESS_READ", "ACCESS_READ_WRITE", "CREATE_LEGACY_IPC",
    "NAME_MAX", "library_path", "location_of_device",
    # type aliases for annotations (py.typed)
    "AnySegment", "Location", "DTypeLike", "Shape", "Devices",
]


def location_of_device(ordinal: Any = None) -> str:
    """The gshm location ("cuda:GPU-<uuid>") of this process's CUDA device
    `ordinal`: unlike "cuda:N" (the daemon's numbering) it names the same GPU
    whatever CUDA_VISIBLE_DEVICES says.  ordinal: an int, "cuda:N" or a
    torch.device; None, "cuda" or torch.device("cuda"): this thread's
    current device (torch.cuda.set_device's), as Segment.view takes them.
    Raises ValueError for no such device here, or for anything else."""
    from . import _cuda
    from ._segment import _ordinal
    current = _cuda.current_device()
    return "cuda:" + _cuda.device_uuid(current if ordinal is None else _ordinal(ordinal, current))
