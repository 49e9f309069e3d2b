"""Client, segments and views: the Python face of libgshm."""

import ctypes
import dataclasses
import datetime
import errno
import mmap
import os
import threading
import weakref

from . import _cuda, _dlpack
from . import _lib as L
from ._dtypes import DType, dtype as _to_dtype
from ._errors import error_for, InvalidArgument, Unreachable

__all__ = [
    "Client", "Segment", "HostSegment", "DeviceSegment", "DeviceArray",
    "SegmentInfo", "LeaseInfo", "ClientInfo", "StatusInfo", "DeviceInfo", "PeerInfo",
    "copy", "copy_signal", "signal", "wait",
]

# ---------------------------------------------------------------- helpers

def _enc(s, what="name"):
    if s is None:
        return None
    if isinstance(s, bytes):
        return s
    if isinstance(s, os.PathLike):
        s = os.fspath(s)
        if isinstance(s, bytes):
            return s
    if not isinstance(s, str):
        raise TypeError("gshm: %s must be str or bytes, not %s" % (what, type(s).__name__))
    return s.encode("utf-8", "surrogateescape")


def _dec(b):
    return b.decode("utf-8", "surrogateescape")


def _strerror(rc):
    try:
        s = L.lib().gshm_strerror(rc)
        return _dec(s) if s else None
    except Exception:
        return None


def _raise(rc, function, client_ptr=None, filename=None, cls=None):
    message = ""
    if client_ptr:
        m = L.lib().gshm_last_error(client_ptr)
        message = _dec(m) if m else ""
    if isinstance(filename, bytes):
        filename = _dec(filename)
    raise error_for(rc, function=function, filename=filename, message=message,
                    description=_strerror(rc), cls=cls)


def _access_code(access):
    if access in (L.GSHM_ACCESS_READ, L.GSHM_ACCESS_READ_WRITE):
        return access
    a = str(access).lower().replace("-", "").replace("_", "")
    if a in ("r", "ro", "read", "readonly", "rb"):
        return L.GSHM_ACCESS_READ
    if a in ("rw", "w", "wr", "readwrite", "r+", "rb+", "wb"):
        return L.GSHM_ACCESS_READ_WRITE
    raise ValueError("gshm: access must be 'r' or 'rw', not %r" % (access,))


def _access_name(code):
    return "r" if code == L.GSHM_ACCESS_READ else "rw"


# ------------------------------------------------------------------ infos

def _ns_to_datetime(ns):
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    """gshm_segment_info_t."""
    id: int
    generation: int
    name: str
    size: int             #: bytes allocated (requested rounded up to granularity)
    requested_size: int   #: bytes asked for at create
    granularity: int
    location: str         #: "host" or "cuda:GPU-<uuid>"
    device_index: int     #: the daemon's GPU index; -1 for host
    uid: int
    gid: int
    mode: int
    flags: int
    unlinked: bool
    leases: int
    created_ns: int

    @classmethod
    def _from_c(cls, c):
        return cls(id=c.id, generation=c.generation, name=_dec(c.name), size=c.size,
                   requested_size=c.requested_size, granularity=c.granularity,
                   location=_dec(c.location), device_index=c.device_index, uid=c.uid,
                   gid=c.gid, mode=c.mode, flags=c.flags, unlinked=bool(c.unlinked),
                   leases=c.leases, created_ns=c.created_ns)

    @property
    def is_host(self):
        return self.location == "host"

    @property
    def gpu_uuid(self):
        """"GPU-<uuid>" of a device segment's GPU, None for host segments."""
        if self.location.startswith("cuda:"):
            rest = self.location[5:]
            if rest.upper().startswith("GPU-"):
                return rest
        return None

    @property
    def created(self):
        return _ns_to_datetime(self.created_ns)

    def asdict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    """gshm_lease_info_t: one client connection's open of one segment."""
    lease_id: int
    segment_id: int
    segment: str
    location: str
    session_id: int
    pid: int
    uid: int
    client: str
    access: str           #: "r" or "rw"
    since_ns: int
    mapped: bool
    devices: tuple        #: GPU UUIDs it mapped on; () for CPU or unmapped

    @classmethod
    def _from_c(cls, c):
        devs = _dec(c.mapped_devices)
        return cls(lease_id=c.lease_id, segment_id=c.segment_id, segment=_dec(c.segment_name),
                   location=_dec(c.location), session_id=c.session_id, pid=c.pid, uid=c.uid,
                   client=_dec(c.client_name), access=_access_name(c.access),
                   since_ns=c.since_ns, mapped=bool(c.mapped),
                   devices=tuple(d for d in devs.split(",") if d))

    @property
    def since(self):
        return _ns_to_datetime(self.since_ns)

    def asdict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ClientInfo:
    """gshm_client_info_t: one client connection."""
    session_id: int
    pid: int
    uid: int
    gid: int
    name: str
    since_ns: int
    leases: int

    @classmethod
    def _from_c(cls, c):
        return cls(session_id=c.session_id, pid=c.pid, uid=c.uid, gid=c.gid, name=_dec(c.name),
                   since_ns=c.since_ns, leases=c.leases)

    def asdict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StatusInfo:
    """gshm_status_info_t: the daemon as a whole."""
    version: str
    pid: int
    started_ns: int
    clients: int
    segments: int
    leases: int
    devices: int
    bytes: int
    backends: tuple

    @classmethod
    def _from_c(cls, c):
        return cls(version=_dec(c.version), pid=c.pid, started_ns=c.started_ns, clients=c.clients,
                   segments=c.segments, leases=c.leases, devices=c.devices, bytes=c.bytes,
                   backends=tuple(b for b in _dec(c.backends).split(",") if b))

    def asdict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PeerInfo:
    """gshm_peer_info_t: reachability of one GPU from another (daemon indexes)."""
    index: int
    access: bool
    native_atomics: bool
    performance_rank: int
    nvlinks: int          #: -1 unknown

    @classmethod
    def _from_c(cls, c):
        return cls(index=c.index, access=bool(c.access), native_atomics=bool(c.native_atomics),
                   performance_rank=c.performance_rank, nvlinks=c.nvlinks)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """gshm_device_info_t: one GPU as gshmd enumerated it."""
    index: int            #: the daemon's index: location "cuda:N"
    uuid: str
    pci_bus_id: str
    name: str
    total_memory: int
    free_memory: int
    granularity: int
    cc_major: int
    cc_minor: int
    peers: tuple          #: PeerInfo

    @classmethod
    def _from_c(cls, c):
        n = max(0, min(c.npeers, len(c.peers)))
        return cls(index=c.index, uuid=_dec(c.uuid), pci_bus_id=_dec(c.pci_bus_id),
                   name=_dec(c.name), total_memory=c.total_memory, free_memory=c.free_memory,
                   granularity=c.granularity, cc_major=c.cc_major, cc_minor=c.cc_minor,
                   peers=tuple(PeerInfo._from_c(c.peers[i]) for i in range(n)))

    @property
    def location(self):
        return "cuda:" + self.uuid

    def asdict(self):
        return dataclasses.asdict(self)


def _optional(name):
    fn = L.optional_symbol(name)
    if fn is None:
        raise NotImplementedError("gshm: %s does not export %s" % (L.library_path(), name))
    return fn


# ---------------------------------------------------------------- handles
#
# The C objects are reference counted here so that memory handed to other
# libraries (DLPack, __cuda_array_interface__) is never unmapped under them:
#
#   _ClientHandle  refs = the Client object + one per open segment handle;
#                  gshm_disconnect at zero.
#   _SegHandle     refs = the Segment object ("owner") + one per live device
#                  view; gshm_close at zero.
#
# Segment.close() (and Client.close(), for every segment of the client)
# releases the owner reference: the lease ends at once unless device views
# are alive, and then when the last of them goes.  Host segments are mapped
# by Python's own mmap of the segment fd, which stays valid for as long as a
# buffer export needs it, so their leases always end at close().

_state_lock = threading.RLock()


class _ClientHandle(object):
    def __init__(self, ptr):
        self.ptr = ptr
        self.refs = 1
        self.owner_released = False
        self.pid = os.getpid()
        self.segments = set()

    def incref(self):
        with _state_lock:
            self.refs += 1

    def decref(self):
        with _state_lock:
            self.refs -= 1
            if self.refs == 0 and self.ptr:
                ptr, self.ptr = self.ptr, None
                if self.pid == os.getpid():  # a forked child must not touch the parent's connection
                    L.lib().gshm_disconnect(ptr)

    def release_owner(self):
        with _state_lock:
            if self.owner_released:
                return
            self.owner_released = True
            for s in list(self.segments):
                s.release_owner()
            self.decref()


class _SegHandle(object):
    def __init__(self, ptr, client_handle):
        self.ptr = ptr
        self.client = client_handle
        self.refs = 1
        self.owner_released = False
        self.pid = os.getpid()
        with _state_lock:
            client_handle.incref()
            client_handle.segments.add(self)

    def incref(self):
        with _state_lock:
            if not self.ptr:
                raise ValueError("gshm: segment is closed")
            self.refs += 1

    def decref(self):
        with _state_lock:
            self.refs -= 1
            if self.refs == 0 and self.ptr:
                ptr, self.ptr = self.ptr, None
                if self.pid == os.getpid():
                    L.lib().gshm_close(ptr)
                self.client.segments.discard(self)
                self.client.decref()

    def release_owner(self):
        with _state_lock:
            if self.owner_released:
                return
            self.owner_released = True
            self.decref()


def _finalizer(obj, fn, *args):
    f = weakref.finalize(obj, fn, *args)
    f.atexit = False  # at exit the process ending ends every lease anyway
    return f


# ----------------------------------------------------------------- client

class Client(object):
    """A connection to gshmd.

    socket  path of the daemon's socket; None: $GSHM_SOCKET, else
            /run/gshm/gshmd.sock.
    name    shown by `gshmctl clients`; None: the program's name.

    Use as a context manager, or call close(): that ends every lease of this
    client (segments with live device views keep theirs until those go).
    """

    def __init__(self, socket=None, name=None):
        lib = L.lib()
        out = ctypes.c_void_p()
        rc = lib.gshm_connect(_enc(socket, "socket"), _enc(name, "name"), ctypes.byref(out))
        if rc < 0:
            # no daemon at the path (ENOENT) is a connection failure here, not a missing segment
            cls = Unreachable if -rc in (errno.ENOENT, errno.ECONNREFUSED, errno.ECONNRESET,
                                         errno.EPIPE) else None
            _raise(rc, "gshm_connect", filename=socket or os.environ.get("GSHM_SOCKET")
                   or "/run/gshm/gshmd.sock", cls=cls)
        self._h = _ClientHandle(out.value)
        self._fin = _finalizer(self, self._h.release_owner)
        self.socket = os.fspath(socket) if socket is not None else (
            os.environ.get("GSHM_SOCKET") or "/run/gshm/gshmd.sock")
        self.name = name

    # -- lifetime
    def close(self):
        """Closes every segment of this client and disconnects."""
        self._fin()

    @property
    def closed(self):
        return self._h.owner_released

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<gshm.Client %s%s>" % (self.socket, " closed" if self.closed else "")

    def _ptr(self):
        if self._h.owner_released or not self._h.ptr:
            raise ValueError("gshm: client is closed")
        return self._h.ptr

    @property
    def last_error(self):
        """The daemon's explanation of this client's last failed request, or ""."""
        m = L.lib().gshm_last_error(self._ptr())
        return _dec(m) if m else ""

    # -- segments
    def create(self, name, size, location="cuda:0", mode=0o600, flags=0, legacy_ipc=False):
        """Creates segment `name` of `size` bytes and opens it read-write.

        location  "host", "cuda:N" (the daemon's device index), "cuda:GPU-<uuid>",
                  or an int N for "cuda:N".
        mode      permission bits like chmod (0o600, 0o640, ...).
        Raises Exists (EEXIST), InvalidArgument, NoDevice, NotSupported,
        OutOfMemory, LimitExceeded, ..."""
        if isinstance(location, int) and not isinstance(location, bool):
            location = "cuda:%d" % location
        elif location is not None and not isinstance(location, (str, bytes)):
            location = str(location)
        size = int(size)
        if size <= 0:
            raise InvalidArgument(22, "gshm_create: size must be > 0, not %d" % size, name)
        if flags is None:
            flags = 0
        if legacy_ipc:
            flags |= L.GSHM_CREATE_LEGACY_IPC
        p = self._ptr()
        out = ctypes.c_void_p()
        rc = L.lib().gshm_create(p, _enc(name), size, _enc(location, "location"), int(mode),
                                 int(flags), ctypes.byref(out))
        if rc < 0:
            _raise(rc, "gshm_create", p, name)
        return self._wrap(out.value)

    def open(self, name, access="rw"):
        """Opens segment `name` ("r": read-only, "rw": read-write).
        Raises NotFound (ENOENT), PermissionDenied (EACCES), ..."""
        code = _access_code(access)
        p = self._ptr()
        out = ctypes.c_void_p()
        rc = L.lib().gshm_open(p, _enc(name), code, ctypes.byref(out))
        if rc < 0:
            _raise(rc, "gshm_open", p, name)
        return self._wrap(out.value)

    def _wrap(self, ptr):
        try:
            handle = _SegHandle(ptr, self._h)
        except BaseException:
            L.lib().gshm_close(ptr)
            raise
        try:
            info = SegmentInfo._from_c(L.lib().gshm_segment_info(ptr).contents)
            access = _access_name(L.lib().gshm_segment_access(ptr))
            if info.is_host:
                return HostSegment(self, handle, info, access)
            return DeviceSegment(self, handle, info, access)
        except BaseException:
            handle.release_owner()
            raise

    def unlink(self, name):
        """Removes segment `name`; leases keep its memory until they end."""
        p = self._ptr()
        rc = L.lib().gshm_unlink(p, _enc(name))
        if rc < 0:
            _raise(rc, "gshm_unlink", p, name)

    def stat(self, name):
        """SegmentInfo of segment `name`, without opening it."""
        p = self._ptr()
        info = L.SegmentInfoC()
        rc = L.lib().gshm_stat_name(p, _enc(name), ctypes.byref(info))
        if rc < 0:
            _raise(rc, "gshm_stat_name", p, name)
        return SegmentInfo._from_c(info)

    def exists(self, name):
        try:
            self.stat(name)
            return True
        except FileNotFoundError:
            return False

    def _list(self, fn_name, ctype, cls):
        p = self._ptr()
        arr = ctypes.POINTER(ctype)()
        n = ctypes.c_size_t(0)
        lib = L.lib()
        rc = _optional(fn_name)(p, ctypes.byref(arr), ctypes.byref(n))
        if rc < 0:
            _raise(rc, fn_name, p)
        try:
            return [cls._from_c(arr[i]) for i in range(n.value)]
        finally:
            lib.gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    def segments(self):
        """Every segment this client may see (list of SegmentInfo, id order)."""
        return self._list("gshm_list", L.SegmentInfoC, SegmentInfo)

    def leases(self):
        """Every lease (list of LeaseInfo): one per client per open segment."""
        return self._list("gshm_list_leases", L.LeaseInfoC, LeaseInfo)

    def clients(self):
        """Every client connection (list of ClientInfo)."""
        return self._list("gshm_list_clients", L.ClientInfoC, ClientInfo)

    def devices(self):
        """The daemon's GPUs with their P2P reachability (list of DeviceInfo);
        empty without a CUDA backend."""
        return self._list("gshm_list_devices", L.DeviceInfoC, DeviceInfo)

    def metrics(self):
        """The daemon's metrics, Prometheus text format."""
        fn = _optional("gshm_metrics")
        p = self._ptr()
        text = ctypes.c_void_p()
        rc = fn(p, ctypes.byref(text))
        if rc < 0:
            _raise(rc, "gshm_metrics", p)
        try:
            return _dec(ctypes.string_at(text.value)) if text.value else ""
        finally:
            L.lib().gshm_free(text)

    def open_legacy_ipc(self, name):
        """(handle, segment): the 64-byte legacy CUDA IPC handle of a segment
        created with legacy_ipc=True (for cudaIpcOpenMemHandle), and a segment
        object holding the lease; close it after every importer closed its
        mapping.  The daemon must allow legacy IPC (gshmd --legacy-ipc)."""
        fn = _optional("gshm_open_legacy_ipc")
        p = self._ptr()
        handle = (ctypes.c_uint8 * 64)()
        out = ctypes.c_void_p()
        rc = fn(p, _enc(name), ctypes.byref(handle), ctypes.byref(out))
        if rc < 0:
            _raise(rc, "gshm_open_legacy_ipc", p, name)
        return bytes(handle), self._wrap(out.value)

    def status(self):
        """The daemon's totals and version (StatusInfo)."""
        p = self._ptr()
        st = L.StatusInfoC()
        rc = L.lib().gshm_status(p, ctypes.byref(st))
        if rc < 0:
            _raise(rc, "gshm_status", p)
        return StatusInfo._from_c(st)


# ---------------------------------------------------------------- segments

def _check_view(size, dt, shape, offset):
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
    elif isinstance(shape, int) and not isinstance(shape, bool):
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


class Segment(object):
    """An open segment (a lease).  Returned by Client.create / Client.open;
    a HostSegment or a DeviceSegment.

    Use as a context manager or call close().  Attributes: name, size,
    requested_size, location, access ("r"/"rw"), readonly, info (a
    SegmentInfo from when it was opened; stat() asks the daemon again)."""

    def _init(self, client, handle, info, access):
        self._client = client
        self._h = handle
        self._info = info
        self.access = access
        self._address = None

    # -- attributes
    @property
    def info(self):
        return self._info

    @property
    def name(self):
        return self._info.name

    @property
    def size(self):
        return self._info.size

    @property
    def requested_size(self):
        return self._info.requested_size

    @property
    def location(self):
        return self._info.location

    @property
    def is_host(self):
        return self._info.is_host

    @property
    def readonly(self):
        return self.access == "r"

    @property
    def client(self):
        return self._client

    @property
    def closed(self):
        return self._h.owner_released

    @property
    def address(self):
        """The address returned by map(), or None while not mapped."""
        return self._address

    def _ptr(self):
        if self._h.owner_released or not self._h.ptr:
            raise ValueError("gshm: segment %r is closed" % self._info.name)
        return self._h.ptr

    def fileno(self):
        """The segment's fd (borrowed: closed by close(); os.dup() it to keep it)."""
        fd = L.lib().gshm_segment_fd(self._ptr())
        if fd < 0:
            _raise(fd, "gshm_segment_fd", filename=self.name)
        return fd

    fd = property(fileno)

    def stat(self):
        """Fresh SegmentInfo from the daemon (lease count, unlinked state)."""
        info = L.SegmentInfoC()
        p = self._ptr()
        rc = L.lib().gshm_stat(p, ctypes.byref(info))
        if rc < 0:
            _raise(rc, "gshm_stat", self._h.client.ptr, self.name)
        return SegmentInfo._from_c(info)

    def __len__(self):
        return self._info.size

    def read(self, offset=0, nbytes=None):
        """Copies nbytes (default: to the end) from byte offset into a new
        bytes object, for host and device segments alike (gshm_read)."""
        if nbytes is None:
            nbytes = self.size - offset
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError("gshm: range [%d, %d) is outside the segment (%d bytes)"
                             % (offset, offset + nbytes, self.size))
        fn = _optional("gshm_read")
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        rc = fn(self._ptr(), offset, buf, nbytes)
        if rc < 0:
            _raise(rc, "gshm_read", self._h.client.ptr, self.name)
        return buf.raw[:nbytes]

    def write(self, data, offset=0):
        """Copies data (bytes-like) into the segment at byte offset (gshm_write)."""
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if offset < 0 or offset + n > self.size:
            raise ValueError("gshm: range [%d, %d) is outside the segment (%d bytes)"
                             % (offset, offset + n, self.size))
        fn = _optional("gshm_write")
        src = (ctypes.c_char * max(n, 1)).from_buffer_copy(mv) if n else None
        rc = fn(self._ptr(), offset, src, n)
        if rc < 0:
            _raise(rc, "gshm_write", self._h.client.ptr, self.name)

    # -- mapping
    def map(self, devices=None):
        """Maps the segment; returns its address (an int).

        Host segments: devices must be None (a CPU mapping).  Device
        segments: the CUDA ordinals of this process (as CUDA_VISIBLE_DEVICES
        numbers them) that get access; None: every visible device that can
        reach the segment's GPU.  Mapping again returns the same address."""
        p = self._ptr()
        if devices is not None:
            if isinstance(devices, int):
                devices = [devices]
            devices = [int(getattr(d, "index", d) if not isinstance(d, int) else d) for d in devices]
            arr = (ctypes.c_int * len(devices))(*devices)
            n = len(devices)
        else:
            arr, n = None, 0
        addr = ctypes.c_void_p()
        rc = L.lib().gshm_map(p, arr, n, ctypes.byref(addr))
        if rc < 0:
            _raise(rc, "gshm_map", self._h.client.ptr, self.name)
        self._address = addr.value or 0
        self._mapped_devices = devices
        return self._address

    def unmap(self):
        """Undoes map()."""
        p = self._ptr()
        rc = L.lib().gshm_unmap(p)
        if rc < 0:
            _raise(rc, "gshm_unmap", self._h.client.ptr, self.name)
        self._address = None

    @property
    def mapped(self):
        return self._address is not None

    # -- lifetime
    def close(self):
        """Ends the lease (see the class documentation for live views)."""
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<gshm.%s %r %s %d bytes %s%s>" % (
            type(self).__name__, self._info.name, self._info.location, self._info.size,
            self.access, " closed" if self.closed else "")


class HostSegment(Segment, mmap.mmap):
    """A host (memfd) segment.  It is also a Python mmap of the segment, so it
    has the buffer protocol: numpy.frombuffer(seg, dtype), memoryview(seg),
    seg.view(), gshm.torch.tensor_view(seg, ...) and seg[a:b] all see the
    shared memory (read-only for "r" leases).  Those views stay valid after
    close(): the memory stays mapped until the last of them goes, while the
    lease ends at close().  torch.frombuffer(seg, ...) keeps no buffer export
    (only the object): a tensor made with it must not outlive close(); use
    gshm.torch.tensor_view for one that may."""

    def __new__(cls, client, handle, info, access):
        fd = L.lib().gshm_segment_fd(handle.ptr)
        if fd < 0:
            _raise(fd, "gshm_segment_fd", filename=info.name)
        acc = mmap.ACCESS_READ if access == "r" else mmap.ACCESS_WRITE
        return mmap.mmap.__new__(cls, fd, info.size, access=acc)

    def __init__(self, client, handle, info, access):
        self._init(client, handle, info, access)
        self._fin = _finalizer(self, handle.release_owner)

    __len__ = Segment.__len__

    def close(self):
        """Ends the lease now; views already taken keep the memory mapped."""
        self._fin()
        try:
            mmap.mmap.close(self)
        except BufferError:
            pass  # exported buffers alive: unmapped when the last one goes

    @property
    def closed(self):
        return self._h.owner_released

    def view(self, dtype="uint8", shape=None, offset=0, device=None):
        """A NumPy array of `dtype` and `shape` (default: as many items as fit)
        on the segment's memory from byte `offset`.  Raises ValueError when it
        would reach past the segment, when offset is not a multiple of the item
        size, or for a dtype NumPy lacks (bfloat16, float8: view as uint16/uint8)."""
        if device is not None and str(device) not in ("cpu", "host"):
            raise ValueError("gshm: host segment %r has no device view; use device=None" % self.name)
        self._ptr()
        dt = _to_dtype(dtype)
        shape, nbytes, offset = _check_view(self.size, dt, shape, offset)
        if dt.typestr is None:
            raise ValueError("gshm: NumPy has no %s; view the bytes as %s instead"
                             % (dt.name, "uint16" if dt.itemsize == 2 else "uint8"))
        import numpy
        count = nbytes // dt.itemsize
        return numpy.frombuffer(self, dtype=numpy.dtype(dt.typestr), count=count,
                                offset=offset).reshape(shape)


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

    def __init__(self, client, handle, info, access):
        self._init(client, handle, info, access)
        self._mapped_devices = None
        self._fin = _finalizer(self, handle.release_owner)
        self._pinned = False

    @property
    def device(self):
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

    def view(self, dtype="uint8", shape=None, offset=0, device=None):
        """A DeviceArray of `dtype` and `shape` (default: as many items as fit)
        from byte `offset`.  device: the CUDA ordinal the view is reported on
        (default: self.device).  Raises ValueError when the view would reach
        past the segment or offset is not a multiple of the item size."""
        self._ptr()
        dt = _to_dtype(dtype)
        shape, nbytes, offset = _check_view(self.size, dt, shape, offset)
        if self._address is None:
            self.map()
        if device is None:
            dev = self.device
        else:
            dev = getattr(device, "index", device)
            if dev is None:
                dev = self.device
            dev = int(dev)
        return DeviceArray(self, self._address + offset, offset, shape, dt, dev, self.readonly)

    def unmap(self):
        """Undoes map().  Raises BufferError while views of it are alive."""
        with _state_lock:
            if self._h.refs > 1:
                raise BufferError("gshm: segment %r has live views; cannot unmap" % self.name)
            Segment.unmap(self)

    def _pin(self):
        # A consumer may now hold the segment object alone: keep the mapping
        # until this object is collected, whatever close() says.
        if not self._pinned:
            self._h.incref()
            self._pinned = True
            _finalizer(self, self._h.decref)

    @property
    def __cuda_array_interface__(self):
        cai = self.view("uint8").__cuda_array_interface__
        self._pin()
        return cai

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.view("uint8").__dlpack__(stream=stream, max_version=max_version,
                                             dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return (_dlpack.kDLCUDA, self.device)


class DeviceArray(object):
    """A typed, C-contiguous view of a mapped device segment, for CUDA array
    consumers: __cuda_array_interface__ (version 3) and DLPack (__dlpack__,
    __dlpack_device__).  Holds the segment mapped while it lives."""

    def __init__(self, segment, ptr, offset, shape, dt, device, readonly):
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

    def data_ptr(self):
        return self.ptr

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d view")
        return self.shape[0]

    @property
    def __cuda_array_interface__(self):
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

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("gshm: DLPack export never copies (copy=True)")
        if dl_device is not None:
            dl_device = tuple(dl_device)
            if dl_device != (_dlpack.kDLCUDA, self.device):
                raise BufferError("gshm: view lives on %r, not %r"
                                  % ((_dlpack.kDLCUDA, self.device), dl_device))
        # stream: the memory is written by other processes under their own
        # synchronisation; we have no pending work to order against it.
        return _dlpack.make_capsule(self, self.ptr, _dlpack.kDLCUDA, self.device,
                                    self.dtype.dl_code, self.dtype.dl_bits, self.shape)

    def __dlpack_device__(self):
        return (_dlpack.kDLCUDA, self.device)

    def __repr__(self):
        return "<gshm.DeviceArray %s%r on cuda:%d at 0x%x (segment %r + %d)>" % (
            self.dtype.name, self.shape, self.device, self.ptr, self.segment.name, self.offset)


# ------------------------------------------------------------------- copy

_COPY_METHODS = {"auto": 0, "copy_engine": 1, "ce": 1, "sm": 2}


def _addr_and_size(obj, what):
    if isinstance(obj, bool):
        raise TypeError("gshm.copy: %s must be an address, a segment or an array" % what)
    if isinstance(obj, int):
        return obj, None
    if isinstance(obj, Segment):
        if obj.address is None:
            obj.map()
        return obj.address, obj.size
    if isinstance(obj, DeviceArray):
        return obj.ptr, obj.nbytes
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("gshm.copy: %s tensor is not contiguous" % what)
        return obj.data_ptr(), obj.numel() * obj.element_size()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") is not None:
            raise ValueError("gshm.copy: %s array is not C-contiguous" % what)
        n = 1
        for d in cai["shape"]:
            n *= d
        return cai["data"][0], n * int(cai["typestr"][2:])
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        n = 1
        for d in ai["shape"]:
            n *= d
        return ai["data"][0], n * int(ai["typestr"][2:])
    raise TypeError("gshm.copy: cannot take the address of %s (%s)" % (what, type(obj).__name__))


def _stream_handle(stream):
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, cupy, cuda-python
        v = getattr(stream, attr, None)
        if v is not None:
            return int(v) or None
    raise TypeError("gshm.copy: stream must be an int, a torch or cupy stream, not %s"
                    % type(stream).__name__)


def copy(dst, src, nbytes=None, stream=None, method="auto"):
    """Copies `nbytes` bytes from `src` to `dst` on a CUDA stream with
    gshm_copy (enqueued: synchronise the stream before reading dst).

    dst, src   addresses (int), segments (mapped on first use), DeviceArray
               views, torch tensors or objects with __cuda_array_interface__.
    nbytes     default: the smaller of the two sizes, where known.
    stream     None (the legacy default stream), an int CUstream, a
               torch.cuda.Stream or a cupy stream.
    method     "auto", "copy_engine" or "sm".
    Raises NotImplementedError when this libgshm has no gshm_copy."""
    fn = _optional("gshm_copy")
    try:
        m = _COPY_METHODS[str(method).lower()]
    except KeyError:
        raise ValueError("gshm.copy: method must be one of auto, copy_engine, sm") from None
    d, dsize = _addr_and_size(dst, "dst")
    s, ssize = _addr_and_size(src, "src")
    if nbytes is None:
        known = [x for x in (dsize, ssize) if x is not None]
        if not known:
            raise ValueError("gshm.copy: nbytes is needed for raw addresses")
        nbytes = min(known)
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError("gshm.copy: nbytes is negative")
    for size, what in ((dsize, "dst"), (ssize, "src")):
        if size is not None and nbytes > size:
            raise ValueError("gshm.copy: %d bytes do not fit %s (%d bytes)" % (nbytes, what, size))
    rc = fn(d, s, nbytes, m, _stream_handle(stream))
    if rc < 0:
        _raise(rc, "gshm_copy")


def _flag_address(flag):
    addr, size = _addr_and_size(flag, "flag")
    if size is not None and size < 8:
        raise ValueError("gshm: a flag needs 8 bytes")
    if addr % 8:
        raise ValueError("gshm: flag address 0x%x is not 8-byte aligned" % addr)
    return addr


def signal(flag, value, stream=None):
    """Writes the 64-bit `value` to `flag` on `stream` after the work queued
    before it (gshm_signal).  flag: an address, a DeviceArray (its first 8
    bytes), a segment or a tensor."""
    rc = _optional("gshm_signal")(_flag_address(flag), int(value), _stream_handle(stream))
    if rc < 0:
        _raise(rc, "gshm_signal")


def wait(flag, value, stream=None):
    """Makes `stream` wait, without the host, until the 64-bit word at
    `flag` is >= value (gshm_wait)."""
    rc = _optional("gshm_wait")(_flag_address(flag), int(value), _stream_handle(stream))
    if rc < 0:
        _raise(rc, "gshm_wait")


def copy_signal(dst, src, nbytes, flag, value, stream=None, method="auto"):
    """copy() then signal(flag, value), fused into one kernel where possible."""
    fn = _optional("gshm_copy_signal")
    try:
        m = _COPY_METHODS[str(method).lower()]
    except KeyError:
        raise ValueError("gshm.copy: method must be one of auto, copy_engine, sm") from None
    d, dsize = _addr_and_size(dst, "dst")
    s, ssize = _addr_and_size(src, "src")
    for size, what in ((dsize, "dst"), (ssize, "src")):
        if size is not None and nbytes > size:
            raise ValueError("gshm.copy: %d bytes do not fit %s (%d bytes)" % (nbytes, what, size))
    rc = fn(d, s, int(nbytes), m, _flag_address(flag), int(value), _stream_handle(stream))
    if rc < 0:
        _raise(rc, "gshm_copy_signal")
