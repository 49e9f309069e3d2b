# SPDX-License-Identifier: Apache-2.0
"""gshm.copy, signal, wait and copy_signal: stream-ordered copies and flags
between segments, arrays and raw device addresses."""

import contextlib
import errno
from typing import Any, Optional

from ._core import _count, _optional, _raise
from ._errors import error_for
from ._segment import DeviceArray, Segment

__all__ = ["copy", "copy_signal", "signal", "wait"]


_COPY_METHODS = {"auto": 0, "copy_engine": 1, "ce": 1, "sm": 2}


def _addr_and_size(obj, what, held, writes=False):
    """(address, size in bytes or None) of a copy's `what` ("dst", "src",
    "flag"); a segment's lease is held in `held` (an ExitStack the caller
    keeps open until the call has queued its work: ValueError for a closed
    segment, whose address was its unmapped memory's, and a close on
    another thread meanwhile waits for the call).  An array interface must
    describe C-contiguous memory (strides
    None: a reversed or transposed array's data pointer is not where its
    bytes start, and a copy from it runs past them), and one the GPU
    `writes` must not be marked read-only (data[1]).  ValueError
    otherwise; gshm.PermissionDenied for a host segment that `writes` on a
    read-only lease (libgshm's copy refuses a device one so)."""
    if isinstance(obj, bool):
        raise TypeError("gshm.copy: %s must be an address, a segment or an array" % what)
    if isinstance(obj, int):
        return obj, None
    if isinstance(obj, Segment) and obj.is_host and writes and obj.readonly:
        # Its mapping is PROT_READ: libgshm refuses it too (-EACCES,
        # gshm__copy_reach), this gives the same refusal before the CUDA
        # driver is loaded or asked anything.
        raise error_for(-errno.EACCES, filename=obj.name,
                        message="gshm.copy: %s, host segment %r, is read-only here (opened "
                        "with access 'r')" % (what, obj.name))
    if isinstance(obj, Segment):
        held.enter_context(obj._use())
        if obj.address is None:
            obj.map()
        return obj.address, obj.size
    if isinstance(obj, DeviceArray):
        return obj.ptr, obj.nbytes
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("gshm.copy: %s tensor is not contiguous" % what)
        return obj.data_ptr(), obj.numel() * obj.element_size()
    for attr in ("__cuda_array_interface__", "__array_interface__"):
        iface = getattr(obj, attr, None)
        if iface is None:
            continue
        if iface.get("strides") is not None:
            raise ValueError("gshm.copy: %s array is not C-contiguous" % what)
        if writes and iface["data"][1]:
            raise ValueError("gshm.copy: %s array is read-only" % what)
        n = 1
        for d in iface["shape"]:
            n *= d
        return iface["data"][0], n * int(iface["typestr"][2:])
    raise TypeError("gshm.copy: cannot take the address of %s (%s)" % (what, type(obj).__name__))


def _torch_cuda_device(o):
    """The CUDA ordinal of o where it is a torch CUDA tensor, else None."""
    dev = getattr(o, "device", None)
    if type(o).__module__.startswith("torch") and getattr(dev, "type", None) == "cuda":
        return dev.index if dev.index is not None else 0
    return None


def _cai_stream(objs):
    """The producer's stream of the first object in objs whose
    __cuda_array_interface__ (v3) names one: 1 the legacy default stream
    (None here), 2 the per-thread default stream, else a CUstream; None
    where none names one."""
    for o in objs:
        if isinstance(o, (Segment, DeviceArray)) or type(o).__module__.startswith("torch"):
            continue  # (gshm's own report none; asking a segment would pin its lease)
        cai = getattr(o, "__cuda_array_interface__", None)
        if cai is None:
            continue
        st = cai.get("stream")
        if st is not None:
            return int(st)
    return None


def _stream_handle(stream, *objs):
    """(CUstream, device) for `stream`.  CUstream None is the legacy default
    stream (NULL), which libgshm takes as the current context's: device is
    then the CUDA ordinal whose context must be current for the call (the
    stream's, or the tensor's), else None.

    stream None: torch's current stream on the GPU of the first CUDA
    tensor in objs (the source first, as torch runs a copy between GPUs;
    torch's own streams are non-blocking: the legacy default stream would
    not be ordered after their work), else the stream an array's
    __cuda_array_interface__ names (its producer's, which the copy must
    follow), else the legacy default stream."""
    if stream is None:
        for o in objs:
            dev = _torch_cuda_device(o)
            if dev is not None:
                import torch
                return torch.cuda.current_stream(dev).cuda_stream or None, dev
        st = _cai_stream(objs)
        return (None if st in (None, 1) else st), None
    if isinstance(stream, int):
        return stream or None, None
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, cupy, cuda-python
        v = getattr(stream, attr, None)
        if v is not None:
            dev = getattr(stream, "device", None)  # torch: a torch.device
            dev = getattr(dev, "index", None)
            if dev is None:
                dev = getattr(stream, "device_id", None)  # cupy (-1: the null stream's)
            return int(v) or None, (dev if dev is not None and dev >= 0 else None)
    raise TypeError("gshm.copy: stream must be an int, a torch or cupy stream, not %s"
                    % type(stream).__name__)


def _on_stream(fn, args, stream, *objs):
    """fn(*args, CUstream) on `stream` (_stream_handle), with the stream's
    GPU current where the stream is its legacy default one (handle 0:
    libgshm would take the current context's, maybe another GPU's).  A
    torch tensor among objs used on a torch stream other than its own is
    recorded on it (tensor.record_stream), so that torch's caching
    allocator does not hand its memory out while the copy may still read
    or write it.  With stream None, torch tensors among objs on other GPUs
    than the one whose current stream runs fn get torch's own barrier of a
    copy between GPUs (Tensor.copy_): that stream waits for their GPUs'
    current streams before fn, and their current streams wait for it after
    (the work already queued there on them comes first; the work queued
    there next, a read of dst or the caching allocator's reuse of a freed
    tensor, comes after).  Returns fn's result."""
    handle, dev = _stream_handle(stream, *objs)
    if stream is not None and type(stream).__module__.startswith("torch"):
        for o in objs:
            if _torch_cuda_device(o) is not None:
                o.record_stream(stream)
    others = []
    if stream is None and dev is not None:  # (dev: the first CUDA tensor's GPU)
        others = sorted({d for d in map(_torch_cuda_device, objs) if d not in (None, dev)})
    if not others:
        return _call_on(fn, args, handle, dev)
    import torch
    runs_on = torch.cuda.current_stream(dev)
    for d in others:
        runs_on.wait_stream(torch.cuda.current_stream(d))
    rc = _call_on(fn, args, handle, dev)
    if rc >= 0:
        for d in others:
            torch.cuda.current_stream(d).wait_stream(runs_on)
    return rc


def _call_on(fn, args, handle, dev):
    """fn(*args, handle), with GPU `dev` current where handle is None (the
    legacy default stream: libgshm takes the current context's) and dev is
    known."""
    if handle is not None or dev is None:
        return fn(*args, handle)
    try:
        import torch
        ctx = torch.cuda.device(dev)
    except ImportError:  # (a cupy stream)
        import cupy
        ctx = cupy.cuda.Device(dev)
    with ctx:
        return fn(*args, None)


def _method(method: Any) -> int:
    """The GSHM_COPY_* value of a method name; ValueError for any other."""
    try:
        return _COPY_METHODS[str(method).lower()]
    except KeyError:
        raise ValueError("gshm.copy: method must be one of auto, copy_engine, sm") from None


def copy(dst: Any, src: Any, nbytes: Optional[int] = None, stream: Any = None,
         method: str = "auto") -> None:
    """Copies `nbytes` bytes from `src` to `dst` on a CUDA stream with
    gshm_copy (enqueued: synchronise the stream before reading dst).

    dst, src   addresses (int), segments (mapped on first use; ValueError
               once closed, and held open until the copy is queued), DeviceArray
               views, torch tensors or objects with __cuda_array_interface__.
    nbytes     default: the smaller of the two sizes, where known.
    stream     None: torch's current stream on the source's GPU (the
               destination's) where either is a CUDA tensor, else the
               stream an array's __cuda_array_interface__ names, else
               the legacy default stream; an int CUstream, a
               torch.cuda.Stream or a cupy stream (a default stream runs
               with its own GPU current).  A tensor used on a torch
               stream other than its own is recorded on it
               (record_stream).  With stream None and tensors on two
               GPUs, the streams are ordered as torch orders its own copy
               between GPUs: the copy runs on the source GPU's current
               stream after the work queued before on the destination
               GPU's current stream, and the work queued there after it
               waits for the copy.
    method     "auto", "copy_engine" or "sm".
    Raises NotImplementedError when this libgshm has no gshm_copy."""
    fn = _optional("gshm_copy")
    m = _method(method)
    with contextlib.ExitStack() as held:
        _copy(fn, m, dst, src, nbytes, stream, held)


def _copy(fn: Any, m: int, dst: Any, src: Any, nbytes: Optional[int], stream: Any,
          held: contextlib.ExitStack) -> None:
    """copy(), with the segments among dst and src held in `held`."""
    d, dsize = _addr_and_size(dst, "dst", held, writes=True)
    s, ssize = _addr_and_size(src, "src", held)
    if nbytes is None:
        known = [x for x in (dsize, ssize) if x is not None]
        if not known:
            raise ValueError("gshm.copy: nbytes is needed for raw addresses")
        nbytes = min(known)
    n: int = _count(nbytes, "gshm.copy: nbytes", "size_t")
    for size, what in ((dsize, "dst"), (ssize, "src")):
        if size is not None and n > size:
            raise ValueError("gshm.copy: %d bytes do not fit %s (%d bytes)" % (n, what, size))
    rc = _on_stream(fn, (d, s, n, m), stream, src, dst)
    if rc < 0:
        _raise(rc, "gshm_copy")


def _flag_address(flag, held, writes=True):
    addr, size = _addr_and_size(flag, "flag", held, writes)
    if size is not None and size < 8:
        raise ValueError("gshm: a flag needs 8 bytes")
    if addr % 8:
        raise ValueError("gshm: flag address 0x%x is not 8-byte aligned" % addr)
    return addr


def _flag_value(value):
    """value as the uint64_t the flag holds; ValueError where ctypes would
    wrap it (a negative one, 2**64 and up)."""
    return _count(value, "gshm: flag value")


def signal(flag: Any, value: int, stream: Any = None) -> None:
    """Writes the 64-bit `value` to `flag` on `stream` after the work queued
    before it (gshm_signal).  flag: an address, a DeviceArray (its first 8
    bytes), a segment or a tensor."""
    fn = _optional("gshm_signal")
    with contextlib.ExitStack() as held:
        rc = _on_stream(fn, (_flag_address(flag, held), _flag_value(value)), stream, flag)
    if rc < 0:
        _raise(rc, "gshm_signal")


def wait(flag: Any, value: int, stream: Any = None) -> None:
    """Makes `stream` wait, without the host, until the 64-bit word at
    `flag` is >= value (gshm_wait)."""
    fn = _optional("gshm_wait")
    with contextlib.ExitStack() as held:
        rc = _on_stream(fn, (_flag_address(flag, held, False), _flag_value(value)), stream, flag)
    if rc < 0:
        _raise(rc, "gshm_wait")


def copy_signal(dst: Any, src: Any, nbytes: int, flag: Any, value: int,
                stream: Any = None, method: str = "auto") -> None:
    """copy() then signal(flag, value), fused into one kernel where possible.
    nbytes 0: the signal alone; dst and src may then be None (as
    gshm_copy_signal's NULL: then it is signal(flag, value, stream))."""
    fn = _optional("gshm_copy_signal")
    m = _method(method)
    n: int = _count(nbytes, "gshm.copy_signal: nbytes", "size_t")
    if n == 0 and (dst is None or src is None):
        dst, src = (0 if dst is None else dst), (0 if src is None else src)
    with contextlib.ExitStack() as held:
        d, dsize = _addr_and_size(dst, "dst", held, writes=True)
        s, ssize = _addr_and_size(src, "src", held)
        for size, what in ((dsize, "dst"), (ssize, "src")):
            if size is not None and n > size:
                raise ValueError("gshm.copy: %d bytes do not fit %s (%d bytes)" % (n, what, size))
        rc = _on_stream(fn, (d, s, n, m, _flag_address(flag, held), _flag_value(value)), stream,
                        src, dst, flag)
    if rc < 0:
        _raise(rc, "gshm_copy_signal")
