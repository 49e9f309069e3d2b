# SPDX-License-Identifier: Apache-2.0
"""Open segments (leases) and their views: HostSegment (an mmap of the
memfd), DeviceSegment and DeviceArray (__cuda_array_interface__, DLPack)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import operator
from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, NoReturn, Optional, Sequence,
                    SupportsIndex, Tuple, TypeVar, Union)

from . import _cuda, _dlpack
from . import _lib as L
from ._core import (_finalizer, _optional, _raise, _refuse_pickle, _state_lock, _strerror,
                    _whole)
from ._dtypes import DType, DTypeLike, dtype as _to_dtype
from ._info import SegmentInfo
from ._errors import NotSupported, error_for

if TYPE_CHECKING:
    import numpy
    from ._client import Client

__all__ = ["Segment", "HostSegment", "DeviceSegment", "DeviceArray", "Shape", "Devices"]

# A view's shape: one int, a sequence of ints, or None (as many items as fit).
Shape = Union[int, Sequence[int], None]
# CUDA devices of this process: an ordinal, a sequence of them (ints or
# objects with .index, such as torch.device), or None (every device that
# can reach the segment's GPU).
Devices = Union[int, Sequence[Any], None]

_S = TypeVar("_S", bound="Segment")

# A bytes object of n uninitialised bytes, and the address of its data:
# CPython's way for C code to fill a fresh bytes object (nothing else holds
# it until read() returns it).  n >= 1: n = 0 gives the shared empty bytes.
_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_FromStringAndSize.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t]
_PyBytes_AsString = ctypes.pythonapi.PyBytes_AsString
_PyBytes_AsString.restype = ctypes.c_void_p
_PyBytes_AsString.argtypes = [ctypes.py_object]


def _new_bytes(n: int) -> bytes:
    out: bytes = _PyBytes_FromStringAndSize(None, n)
    return out


def _bytes_address(b: bytes) -> int:
    address: int = _PyBytes_AsString(b)
    return address


def _check_view(size: int, dt: DType, shape: Any, offset: Any) -> Tuple[Tuple[int, ...], int, int]:
    """Validates a view of `size` bytes; returns (shape tuple, nbytes)."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        try:
            offset = offset.__index__()
        except AttributeError:
            raise TypeError("gshm: offset must be an int, not %s" % type(offset).__name__) from None
    if offset < 0:
        raise ValueError("gshm: offset %d is negative" % offset)
    if offset > size:
        raise ValueError("gshm: offset %d is past the end of the segment (%d bytes)" % (offset, size))
    if offset % dt.itemsize:
        raise ValueError("gshm: offset %d is not a multiple of the %s item size (%d)"
                         % (offset, dt.name, dt.itemsize))
    if shape is None:
        shape = ((size - offset) // dt.itemsize,)
    elif isinstance(shape, int):
        if isinstance(shape, bool):
            raise TypeError("gshm: shape must be an int or a sequence of ints")
        shape = (shape,)
    else:
        try:
            shape = tuple(shape)
        except TypeError:
            raise TypeError("gshm: shape must be an int or a sequence of ints") from None
    dims = []
    for d in shape:
        if isinstance(d, bool):
            raise TypeError("gshm: shape must hold ints, not bool")
        try:
            d = d.__index__()
        except AttributeError:
            raise TypeError("gshm: shape must hold ints, not %s" % type(d).__name__) from None
        if d < 0:
            raise ValueError("gshm: negative dimension %d in shape %r" % (d, shape))
        dims.append(d)
    n = 1
    for d in dims:
        n *= d
    nbytes = n * dt.itemsize
    if offset + nbytes > size:
        raise ValueError("gshm: a %s view of shape %r at offset %d needs %d bytes; the segment has %d"
                         % (dt.name, tuple(dims), offset, offset + nbytes, size))
    return tuple(dims), nbytes, offset


def _ordinal(device: Any, default: Optional[int] = None) -> int:
    """A CUDA ordinal from an int, "cuda:N" (or "N"), or an object with
    .index (torch.device); `default` for a device that names no ordinal
    ("cuda", torch.device("cuda")).  ValueError for anything else."""
    if isinstance(device, bool):
        raise ValueError("gshm: %r is no CUDA device" % (device,))
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, num = device.partition(":")
        if kind.isdigit() and not num:
            return int(kind)
        if kind == "cuda" and (num.isdigit() or (not num and default is not None)):
            return int(num) if num else int(default)  # type: ignore[arg-type]
        raise ValueError("gshm: %r is no CUDA device (\"cuda:N\" or an ordinal)" % device)
    index = getattr(device, "index", None)
    if index is None and default is not None and getattr(device, "type", None) == "cuda":
        return int(default)
    if index is None:
        try:  # numpy integers, cupy.cuda.Device (its __int__)
            return operator.index(device)
        except TypeError:
            pass
        try:
            return int(device)
        except (TypeError, ValueError):
            raise ValueError("gshm: %r is no CUDA device" % (device,)) from None
    return int(index)


class Segment(object):
    """An open segment (a lease).  Returned by Client.create / Client.open;
    a HostSegment or a DeviceSegment.

    Use as a context manager or call close().  Attributes: name, size,
    requested_size, location, access ("r"/"rw"), readonly, info (a
    SegmentInfo from when the lease was granted: an open of a name this
    client already holds shares that lease and its record, whose mode and
    owner may predate a chmod or chown; stat() asks the daemon again)."""

    access: str
    _address: Optional[int]
    _fin: Any

    def _init(self, client: Client, handle: Any, info: SegmentInfo, access: str) -> None:
        self._client = client
        self._h = handle
        self._info = info
        self.access = access
        self._address = None

    # -- attributes
    @property
    def info(self) -> SegmentInfo:
        return self._info

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def size(self) -> int:
        return self._info.size

    @property
    def requested_size(self) -> int:
        return self._info.requested_size

    @property
    def location(self) -> str:
        return self._info.location

    @property
    def is_host(self) -> bool:
        return self._info.is_host

    @property
    def readonly(self) -> bool:
        return self.access == "r"

    @property
    def client(self) -> Client:
        return self._client

    @property
    def closed(self) -> bool:
        return bool(self._h.owner_released)

    @property
    def address(self) -> Optional[int]:
        """The address returned by map(), or None while not mapped and once
        closed (close() unmaps it, or leaves it to the views that hold it:
        theirs to use, not this object's)."""
        return None if self._h.owner_released else self._address

    def _ptr(self) -> int:
        if self._h.owner_released or not self._h.ptr:
            raise ValueError("gshm: segment %r is closed" % self._info.name)
        return self._h.ptr

    def _use(self):
        """with self._use() as p: the C segment (and its client) for one
        call, kept alive against a close() from another thread."""
        return self._h.use("gshm: segment %r is closed" % self._info.name)

    def fileno(self) -> int:
        """The segment's fd (borrowed: closed by close(); os.dup() it to keep it)."""
        with self._use() as p:
            fd = L.lib().gshm_segment_fd(p)
        if fd < 0:
            _raise(fd, "gshm_segment_fd", filename=self.name)
        return fd

    fd = property(fileno)

    def stat(self) -> SegmentInfo:
        """Fresh SegmentInfo from the daemon (lease count, unlinked state,
        mode and owner now), of this very segment (by id and generation).
        Raises Revoked (ESTALE) for a revoked segment, PermissionDenied when
        a chmod since hides it from this user."""
        info = L.SegmentInfoC()
        with self._use() as p:
            rc = L.lib().gshm_stat(p, ctypes.byref(info))
            if rc < 0:
                _raise(rc, "gshm_stat", self._h.client.ptr, self.name)
        return SegmentInfo._from_c(info)

    def publish(self, replace: bool = False) -> None:
        """Gives a hidden segment (Client.create(..., hidden=True)) its
        name, in one step of gshmd (gshm_publish): with replace, the
        segment that held the name is unlinked in the same step (its
        holders keep it), so a reader never finds the name missing; after
        a gshmd crash the name holds the old segment or this one.  info
        then has the live segment's id and generation.
        Raises Exists (the name is held and not replace), PermissionDenied
        (replace of a segment this user may not unlink: it stays),
        InvalidArgument (not hidden, or published already), Revoked (the
        hidden segment is gone: gshmd restarted since the create)."""
        fn = _optional("gshm_publish")
        with self._use() as p:
            rc = fn(p, L.GSHM_PUBLISH_REPLACE if replace else 0)
            if rc < 0:
                _raise(rc, "gshm_publish", self._h.client.ptr, self.name)
            self._info = SegmentInfo._from_c(L.lib().gshm_segment_info(p).contents)

    def __len__(self) -> int:
        return self._info.size

    def read(self, offset: int = 0, nbytes: Optional[int] = None) -> bytes:
        """Copies nbytes (default: to the end) from byte offset into a new
        bytes object, for host and device segments alike (gshm_read).
        ValueError for a range outside the segment or a count that is no
        whole number (TypeError for no number at all)."""
        offset = _whole(offset, "gshm: offset")
        if nbytes is not None:
            nbytes = _whole(nbytes, "gshm: nbytes")
        if nbytes is None:
            nbytes = self.size - offset
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError("gshm: range [%d, %d) is outside the segment (%d bytes)"
                             % (offset, offset + nbytes, self.size))
        fn = _optional("gshm_read")
        if nbytes == 0:
            return b""
        # gshm_read fills the bytes object itself: one copy of the data,
        # never two (a ctypes buffer and then its .raw copy)
        out = _new_bytes(nbytes)
        with self._use() as p:
            rc = fn(p, offset, _bytes_address(out), nbytes)
            if rc < 0:
                _raise(rc, "gshm_read", self._h.client.ptr, self.name)
        return out

    def write(self, data: Any, offset: int = 0) -> None:
        """Copies data (bytes-like) into the segment at byte offset (gshm_write).
        ValueError for a range outside the segment or an offset that is no
        whole number (TypeError for no number at all)."""
        offset = _whole(offset, "gshm: offset")
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if offset < 0 or offset + n > self.size:
            raise ValueError("gshm: range [%d, %d) is outside the segment (%d bytes)"
                             % (offset, offset + n, self.size))
        fn = _optional("gshm_write")
        # gshm_write reads the caller's buffer in place: one copy of the
        # data, as read() makes (a temporary copy of it doubled the peak
        # memory of writing a model's bytes).  A read-only buffer other
        # than a bytes object has no address ctypes gives: copied.
        if not n:
            src: Any = None
        elif not mv.readonly:
            src = (ctypes.c_char * n).from_buffer(mv)
        elif type(data) is bytes:
            src = _bytes_address(data)
        else:
            src = (ctypes.c_char * n).from_buffer_copy(mv)
        try:
            with self._use() as p:
                rc = fn(p, offset, src, n)
                if rc < 0:
                    _raise(rc, "gshm_write", self._h.client.ptr, self.name)
        finally:
            del src  # (the buffer export from_buffer holds, before mv goes)
            mv.release()

    # -- mapping
    def map(self, devices: Devices = None) -> int:
        """Maps the segment; returns its address (an int).

        Host segments: devices must be None (a CPU mapping).  Device
        segments: the CUDA ordinals of this process (as CUDA_VISIBLE_DEVICES
        numbers them) that get access; None: every visible device that can
        reach the segment's GPU.  Mapping again returns the same address."""
        ordinals: Optional[List[int]] = None
        arr: Any = None
        n = 0
        if devices is not None:
            if isinstance(devices, int):
                devices = [devices]
            ordinals = [_ordinal(d) for d in devices]
            arr = (ctypes.c_int * len(ordinals))(*ordinals)
            n = len(ordinals)
        addr = ctypes.c_void_p()
        with self._use() as p:
            rc = L.lib().gshm_map(p, arr, n, ctypes.byref(addr))
            if rc < 0:
                _raise(rc, "gshm_map", self._h.client.ptr, self.name)
        self._address = addr.value or 0
        self._mapped_devices = ordinals
        return self._address

    def unmap(self) -> None:
        """Undoes map(); also ends the mapping read() and write() keep."""
        with self._use() as p:
            rc = L.lib().gshm_unmap(p)
            if rc < 0:
                _raise(rc, "gshm_unmap", self._h.client.ptr, self.name)
        self._address = None

    @property
    def mapped(self) -> bool:
        """Whether address is an address: mapped, and not closed."""
        return self.address is not None

    # -- lifetime
    def close(self) -> None:
        """Ends the lease (see the class documentation for live views)."""
        self._fin()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<gshm.%s %r %s %d bytes %s%s>" % (
            type(self).__name__, self._info.name, self._info.location, self._info.size,
            self.access, " closed" if self.closed else "")

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """TypeError: a Segment is this process's lease (pickle or copy
        would share its C object); open the name again in the other process."""
        _refuse_pickle(self, "lease")


# Segment.read/write (offset, nbytes) come first in the MRO, before mmap's
# file-like read/write; typeshed's mmap has no __new__ and a plain `closed`.
class HostSegment(Segment, mmap.mmap):  # type: ignore[misc]
    """A host (memfd) segment.  It is also a Python mmap of the segment, so it
    has the buffer protocol: numpy.frombuffer(seg, dtype), memoryview(seg),
    seg.view(), gshm.torch.tensor_view(seg, ...) and seg[a:b] all see the
    shared memory (read-only for "r" leases).  Those views stay valid after
    close(): the memory stays mapped until the last of them goes, while the
    lease ends at close().  torch.frombuffer(seg, ...) keeps no buffer export
    (only the object): a tensor made with it must not outlive close(); use
    gshm.torch.tensor_view for one that may.

    The memory is mapped from the start, so the segment is mapped in
    libgshm too (gshm_map) and the daemon lists the lease as mapped
    (`gshmctl mappings`) until close(); address is that mapping's address,
    of the same memory."""

    def __new__(cls, client: Client, handle: Any, info: SegmentInfo, access: str) -> HostSegment:
        fd = L.lib().gshm_segment_fd(handle.ptr)
        if fd < 0:
            _raise(fd, "gshm_segment_fd", filename=info.name)
        acc = mmap.ACCESS_READ if access == "r" else mmap.ACCESS_WRITE
        return mmap.mmap.__new__(cls, fd, info.size, access=acc)  # type: ignore[call-arg]

    def __init__(self, client: Client, handle: Any, info: SegmentInfo, access: str) -> None:
        self._init(client, handle, info, access)
        self._fin = _finalizer(self, handle.release_owner)
        # the memory is mapped (this object is an mmap of it): say so to gshmd
        self.map()

    __len__ = Segment.__len__

    def close(self) -> None:
        """Ends the lease now; views already taken keep the memory mapped."""
        self._fin()
        try:
            mmap.mmap.close(self)
        except BufferError:
            pass  # exported buffers alive: unmapped when the last one goes

    @property  # type: ignore[override]
    def closed(self) -> bool:
        return bool(self._h.owner_released)

    def view(self, dtype: DTypeLike = "uint8", shape: Shape = None, offset: int = 0,
             device: Any = None) -> numpy.ndarray[Any, Any]:
        """A NumPy array of `dtype` and `shape` (default: as many items as fit)
        on the segment's memory from byte `offset`.  Raises ValueError when it
        would reach past the segment, when offset is not a multiple of the item
        size, or for a dtype NumPy lacks (bfloat16, float8: view as uint16/uint8)."""
        if device is not None and str(device) not in ("cpu", "host"):
            raise ValueError("gshm: host segment %r has no device view; use device=None" % self.name)
        self._ptr()
        dt = _to_dtype(dtype)
        dims, nbytes, offset = _check_view(self.size, dt, shape, offset)
        if dt.typestr is None:
            raise ValueError("gshm: NumPy has no %s; view the bytes as %s instead"
                             % (dt.name, "uint16" if dt.itemsize == 2 else "uint8"))
        import numpy
        count = nbytes // dt.itemsize
        return numpy.frombuffer(self, dtype=numpy.dtype(dt.typestr), count=count,
                                offset=offset).reshape(dims)

    def _private_bytes(self, offset: int, nbytes: int) -> numpy.ndarray[Any, Any]:
        """A writable uint8 array of nbytes (> 0) at byte offset on a
        private copy-on-write mapping (MAP_PRIVATE) of the segment: reads
        see the shared memory until a page is written; a write copies that
        page for this process alone and never reaches the segment.  For
        consumers that cannot honour a read-only buffer (torch has no
        read-only tensors: its writes through a read-only mapping are a
        SIGSEGV).  The array keeps its mapping until it goes."""
        import numpy
        fd = self.fileno()
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        m = _SegmentMmap(fd, offset + nbytes - start, access=mmap.ACCESS_COPY, offset=start)
        m.segment = self  # the array holds m, m holds the lease
        return numpy.frombuffer(m, dtype=numpy.uint8, count=nbytes, offset=offset - start)


class _SegmentMmap(mmap.mmap):
    """An mmap that keeps `segment` (the Segment it maps) alive, and so its
    lease, for as long as the mapping is referenced (by a NumPy array or a
    tensor over it)."""
    segment: Optional[Segment] = None


class DeviceSegment(Segment):
    """A GPU segment.  After map() (view() maps on first use), view(dtype,
    shape, offset) gives DeviceArray objects with __cuda_array_interface__ and
    DLPack, for torch.from_dlpack / torch.as_tensor / cupy.asarray; each keeps
    the segment mapped (and its lease held) for as long as it, or any tensor
    made from it, lives.

    The segment itself also exposes DLPack and __cuda_array_interface__ (the
    whole segment as uint8).  A consumer of the segment's own
    __cuda_array_interface__ holds only the segment object, so after that
    close() defers unmapping until the segment object is garbage collected."""

    _mapped_devices: Optional[List[int]]

    def __init__(self, client: Client, handle: Any, info: SegmentInfo, access: str) -> None:
        self._init(client, handle, info, access)
        self._mapped_devices = None
        self._fin = _finalizer(self, handle.release_owner)
        self._pinned = False

    @property
    def device(self) -> int:
        """The ordinal of this process's CUDA device that views are reported on
        (DLPack device id): the first device given to map(), else the segment's
        own GPU when visible here, else the current device."""
        if self._mapped_devices:
            return self._mapped_devices[0]
        uuid = self._info.gpu_uuid
        if uuid is not None:
            ordinal = _cuda.ordinal_of_uuid(uuid)
            if ordinal is not None:
                return ordinal
        return _cuda.current_device()

    def view(self, dtype: DTypeLike = "uint8", shape: Shape = None, offset: int = 0,
             device: Any = None) -> DeviceArray:
        """A DeviceArray of `dtype` and `shape` (default: as many items as fit)
        from byte `offset`.

        device  the CUDA ordinal of this process the view is on (its DLPack
                device): an int, "cuda:N" or an object with .index
                (torch.device("cuda", N)).  None (default): self.device,
                the segment's own GPU when visible here.  "cuda" or
                torch.device("cuda") without an index: the calling thread's
                current CUDA device, as torch means it, not the segment's
                GPU (torch.cuda.current_device() once torch has initialized
                CUDA; else the device of the thread's current context,
                which cupy's Device.use selects); gshm.torch's tensor_view,
                load_state_dict and attach read it the same way.  A GPU
                other than the segment's gets access to the mapping first
                (peer access over NVLink or PCIe).

        Raises ValueError when the view would reach past the segment, when
        offset is not a multiple of the item size, or for a device that is
        no CUDA device ("cpu": a device segment has no CPU view; copy it);
        gshm.NoDevice for an ordinal this process does not have;
        gshm.NotSupported (errno EXDEV) for a GPU with no peer path to the
        segment's (view it on the segment's own GPU, device=None, and copy
        from there)."""
        self._ptr()
        dt = _to_dtype(dtype)
        dims, nbytes, offset = _check_view(self.size, dt, shape, offset)
        dev = None if device is None else _ordinal(device, _cuda.current_device())
        base = self._address if self._address is not None else self.map()
        if dev is None:
            dev = self.device
        elif dev != self.device and dev not in (self._mapped_devices or ()):
            self._grant(dev)
        arr = DeviceArray(self, base + offset, offset, dims, dt, dev, self.readonly)
        if self._address != base:  # unmap() on another thread ended between
            arr._fin()
            raise BufferError("gshm: segment %r was unmapped while the view was made" % self.name)
        return arr

    def _grant(self, dev: int) -> None:
        """Gives CUDA device dev of this process access to the mapping, for
        a view on it: without it, the first kernel on the view would fault
        (an illegal address, the end of the process's CUDA).  Errors of
        view()."""
        n = _cuda.device_count()
        if not 0 <= dev < n:
            raise error_for(-errno.ENODEV, "gshm_map", self.name,
                            "no CUDA device %d in this process (%d visible)" % (dev, n),
                            description=_strerror(-errno.ENODEV))
        kept = self._mapped_devices
        try:
            self.map(devices=[dev])
        except NotSupported as e:
            if e.errno != errno.EXDEV:
                raise
            uuid = self._info.gpu_uuid
            own = _cuda.ordinal_of_uuid(uuid) if uuid is not None else None
            raise error_for(-errno.EXDEV, "gshm_map", self.name,
                            "cuda:%d has no peer path to the segment's GPU (%s): view it on "
                            "that GPU (device=None) and copy the tensor from there"
                            % (dev, "cuda:%d here" % own if own is not None else uuid),
                            description=_strerror(-errno.EXDEV)) from None
        self._mapped_devices = None if kept is None else kept + [dev]

    def unmap(self) -> None:
        """Undoes map().  Raises BufferError while views of it are alive (or
        while another thread unmaps it)."""
        with _state_lock:
            if self._h.refs > 1 or self._h.unmapping:
                raise BufferError("gshm: segment %r has live views; cannot unmap" % self.name)
            self._h.unmapping = True  # a view() meanwhile fails, not points at unmapped memory
        # Outside the lock (see _state_lock): gshm_unmap waits for the
        # client's lock, which a pull holds across its progress callback.
        try:
            Segment.unmap(self)
        finally:
            with _state_lock:
                self._h.unmapping = False

    def _pin(self):
        # A consumer may now hold the segment object alone: keep the mapping
        # until this object is collected, whatever close() says.
        if not self._pinned:
            self._h.incref()
            self._pinned = True
            _finalizer(self, self._h.decref)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        cai = self.view("uint8").__cuda_array_interface__
        self._pin()
        return cai

    def __dlpack__(self, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        return self.view("uint8").__dlpack__(stream=stream, max_version=max_version,
                                             dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_dlpack.kDLCUDA, self.device)


class DeviceArray(object):
    """A typed, C-contiguous view of a mapped device segment, for CUDA array
    consumers: __cuda_array_interface__ (version 3) and DLPack (__dlpack__,
    __dlpack_device__).  Holds the segment mapped while it lives."""

    def __init__(self, segment: DeviceSegment, ptr: int, offset: int, shape: Sequence[int],
                 dt: DType, device: int, readonly: bool) -> None:
        handle = segment._h
        handle.incref()
        self._fin = _finalizer(self, handle.decref)
        self.segment = segment
        self.ptr = ptr
        self.offset = offset
        self.shape = tuple(shape)
        self.dtype = dt
        self.device = device
        self.readonly = readonly
        n = 1
        for d in self.shape:
            n *= d
        self.size = n
        self.nbytes = n * dt.itemsize

    def data_ptr(self) -> int:
        return self.ptr

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d view")
        return self.shape[0]

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if self.dtype.typestr is None:
            # AttributeError: consumers then fall back to DLPack
            raise AttributeError("gshm: %s has no __cuda_array_interface__ typestr; use DLPack"
                                 % self.dtype.name)
        return {
            "shape": self.shape,
            "typestr": self.dtype.typestr,
            "data": (self.ptr if self.nbytes else 0, self.readonly),
            "strides": None,
            "version": 3,
            "stream": None,  # nothing pending on any stream of ours
        }

    def __dlpack__(self, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        if copy:
            raise BufferError("gshm: DLPack export never copies (copy=True)")
        if dl_device is not None:
            want = tuple(dl_device)
            if want != (_dlpack.kDLCUDA, self.device):
                raise BufferError("gshm: view lives on %r, not %r"
                                  % ((_dlpack.kDLCUDA, self.device), want))
        # stream: the memory is written by other processes under their own
        # synchronisation; we have no pending work to order against it.
        return _dlpack.make_capsule(self, self.ptr, _dlpack.kDLCUDA, self.device,
                                    self.dtype.dl_code, self.dtype.dl_bits, self.shape)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_dlpack.kDLCUDA, self.device)

    def __repr__(self) -> str:
        return "<gshm.DeviceArray %s%r on cuda:%d at 0x%x (segment %r + %d)>" % (
            self.dtype.name, self.shape, self.device, self.ptr, self.segment.name, self.offset)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """TypeError: an address in this process's mapping, and a reference
        on its lease (pickle or copy would share them)."""
        _refuse_pickle(self, "view of a mapping")


def map_for_writers(seg: "DeviceSegment", device: Optional[int] = None,
                    writers: Optional[Iterable[int]] = ()) -> int:
    """Maps device segment `seg` for GPU `device` (None: every visible GPU
    that can reach the segment's) and for each GPU in `writers` that can
    reach it; writers None: every such GPU.  Returns the address.

    A cuMem mapping gives access per device (cuMemSetAccess), which peer
    access does not widen, and PyTorch copies between GPUs on the *source*
    GPU (aten/native/cuda/Copy.cu): a tensor over memory mapped for its own
    GPU only, written by a copy from another GPU, faults there (an illegal
    address that ends the context).  Reads need no more: such a copy runs
    on the segment's GPU.  Each extra GPU costs its page tables: 4 GiB
    mapped for two H200s took 10.4 ms against 0.8 ms for one
    (docs/PERFORMANCE.md "Attach"), so read-only views map for their own
    GPU alone."""
    if writers is None or device is None:
        addr = seg.map(devices=None)
        if device is not None:
            addr = seg.map(devices=[device])
        return addr
    for w in sorted(set(writers) - {device}):
        try:
            seg.map(devices=[w])
        except NotSupported as e:  # EXDEV: no peer path from w (NoDevice before)
            if e.errno != errno.EXDEV:
                raise
            # torch's copy from it goes its own way
    return seg.map(devices=[device])  # last: seg.device is this one
