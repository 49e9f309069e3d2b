# SPDX-License-Identifier: Apache-2.0
"""gshm.Client: a connection to gshmd and the requests that name segments
or list the daemon's state."""

import contextlib
import ctypes
import errno
import os

from . import _lib as L
from ._core import (_ClientHandle, _SegHandle, _access_code, _access_name, _count, _dec, _enc,
                    _finalizer, _optional, _raise)
from ._errors import InvalidArgument, Unreachable
from ._info import (ClientInfo, ClusterPeer, DeviceInfo, LeaseInfo, PullResult, SegmentInfo,
                    StatusInfo)
from ._segment import DeviceSegment, HostSegment

__all__ = ["Client"]


@contextlib.contextmanager
def _unlink_on_error(client, name, seg):
    """For the body that fills segment `name` (seg, just created): when the
    body raises anything (KeyboardInterrupt included), closes seg, unlinks
    `name` and re-raises the body's exception.  A failed unlink (an
    Exception) is ignored, so it never hides that exception; seg.close()
    does not raise.  Nothing is done when the body succeeds."""
    try:
        yield seg
    except BaseException:
        seg.close()
        try:
            client.unlink(name)
        except Exception:
            pass
        raise


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
    def create(self, name, size, location="host", mode=0o600, flags=0, legacy_ipc=False):
        """Creates segment `name` of `size` bytes and opens it read-write.

        location  "host" (the default, as for gshm_create and gshmctl create),
                  "cuda:N" (the daemon's device index), "cuda:GPU-<uuid>",
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
        size = _count(size, "size")
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

    # ---- cluster (docs/CLUSTER.md) ----

    def peers(self):
        """The daemon's peer nodes (list of ClusterPeer; empty when its cluster
        is off)."""
        fn = _optional("gshm_cluster_peers")
        p = self._ptr()
        arr = ctypes.POINTER(L.ClusterPeerC)()
        n = ctypes.c_size_t(0)
        rc = fn(p, None, ctypes.byref(arr), ctypes.byref(n))
        if rc < 0:
            _raise(rc, "gshm_cluster_peers", p)
        try:
            return [ClusterPeer._from_c(arr[i]) for i in range(n.value)]
        finally:
            L.lib().gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    def remote_segments(self, peer):
        """The segments peer node `peer` exports (list of SegmentInfo: the
        peer's ids, names, sizes and locations)."""
        fn = _optional("gshm_list_remote")
        p = self._ptr()
        arr = ctypes.POINTER(L.SegmentInfoC)()
        n = ctypes.c_size_t(0)
        rc = fn(p, _enc(peer), ctypes.byref(arr), ctypes.byref(n))
        if rc < 0:
            _raise(rc, "gshm_list_remote", p, peer)
        try:
            return [SegmentInfo._from_c(arr[i]) for i in range(n.value)]
        finally:
            L.lib().gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    def pull(self, peer, name, local_name=None, location=None, mode=0o600, progress=None):
        """Copies segment `name` that peer node `peer` exports into a new local
        segment owned by this user (`local_name`, default the same name; at
        `location`, default host for a host segment, cuda:0 for a device
        one).  The daemons move the bytes; this blocks until they are all
        there and returns a PullResult.  `progress(bytes_done, bytes_total,
        elapsed_ns)` is called about five times a second meanwhile (it must
        not use this client).  Errors as gshm_pull: NotFound (no such peer,
        or not exported), Exists, PermissionDenied, Unreachable
        (the peer went away; the partial segment is removed)."""
        fn = _optional("gshm_pull")
        p = self._ptr()
        opts = L.PullOptsC()
        opts.local_name = _enc(local_name) if local_name else None
        opts.location = _enc(location) if location else None
        opts.mode = int(mode)
        cb = None
        if progress is not None:
            def _cb(pr, arg):
                try:
                    progress(pr.contents.bytes_done, pr.contents.bytes_total,
                             pr.contents.elapsed_ns)
                except Exception:  # an exception cannot cross the C frame
                    pass
            cb = L.PULL_PROGRESS_FN(_cb)
            opts.progress = cb
        res = L.PullResultC()
        rc = fn(p, _enc(peer), _enc(name), ctypes.byref(opts), ctypes.byref(res))
        if rc < 0:
            _raise(rc, "gshm_pull", p, "%s:%s" % (peer, name))
        return PullResult._from_c(res)

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
