# SPDX-License-Identifier: Apache-2.0
"""gshm.Client: a connection to gshmd and the requests that name segments
or list the daemon's state."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import warnings
from types import FrameType
from typing import (Callable, Iterator, List, Literal, NoReturn, Optional, Sequence,
                    SupportsIndex, Tuple, TypeVar, Union, cast, overload)

from . import _lib as L
from ._core import (_ClientHandle, _SegHandle, _access_code, _access_name, _calling_back,
                    _count, _dec, _enc, _finalizer, _optional, _raise, _refuse_pickle,
                    _strerror, _whole)
from ._errors import InvalidArgument, Unreachable, error_for
from ._info import (ClientInfo, ClusterPeer, DeviceInfo, LeaseInfo, PullResult, SegmentInfo,
                    StatusInfo)
from ._segment import DeviceSegment, HostSegment, Segment

__all__ = ["Client", "Location", "AnySegment"]

# Where a segment lives: "host", "cuda:N" (the daemon's device index),
# "cuda:GPU-<uuid>", or an int N for "cuda:N".
Location = Union[str, int]
# What create and open return: HostSegment or DeviceSegment by location.
AnySegment = Union[HostSegment, DeviceSegment]
_Seg = TypeVar("_Seg", bound=Segment)
# What Client.pull's progress callback takes: (bytes_done, bytes_total, elapsed_ns).
_Progress = Optional[Callable[[int, int, int], object]]


def _cancel_pull(client_ptr: int) -> None:
    """gshm_pull_cancel: the pull on client_ptr stops within 0.1 s
    (nothing where libgshm predates it: the pull then runs to its end)."""
    try:
        _optional("gshm_pull_cancel")(client_ptr)
    except NotImplementedError:
        pass


@contextlib.contextmanager
def _cancel_on_sigint(calling: List[int], interrupted: List[BaseException]) -> Iterator[None]:
    """While a pull runs on the main thread: SIGINT's Python handler is
    wrapped so that whatever it raises (KeyboardInterrupt, by default)
    cancels the pull and is kept in `interrupted` (raised again once the
    pull has returned) instead of escaping the ctypes callback where Python runs
    handlers during a pull (at the callback's first line, before any
    try: ctypes would print "Exception ignored" and drop it).  Elsewhere
    (another thread, a handler that is SIG_DFL or SIG_IGN), nothing."""
    import signal
    import threading
    old = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(old):
        yield
        return

    prev = cast(Callable[[int, Optional[FrameType]], object], old)

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        try:
            prev(signum, frame)
        except BaseException as e:
            interrupted.append(e)
            if calling:
                _cancel_pull(calling[0])

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _progress_interrupted(raised: List[BaseException],
                          interrupted: Sequence[BaseException]) -> None:
    """Raises again what a SIGINT handler raised during the pull
    (`interrupted`, from _cancel_on_sigint), else the KeyboardInterrupt or
    SystemExit the progress callback caught, whatever the pull's own result
    (its cancel's error)."""
    if interrupted:
        raise interrupted[0]
    if raised and not isinstance(raised[0], Exception):
        raise raised[0]


def _progress_raised(raised: List[BaseException], what: str,
                     interrupted: Sequence[BaseException]) -> None:
    """After a pull: _progress_interrupted, else warns of the exception the
    progress callback raised, if any."""
    _progress_interrupted(raised, interrupted)
    if raised:
        warnings.warn("gshm: the progress callback of the pull of %s raised %r; it was not called "
                      "again" % (what, raised[0]), RuntimeWarning, stacklevel=3)


def _pull_hint(rc: int, replace: bool) -> Optional[Callable[[str], str]]:
    """For a pull refused with Exists (a local segment holds the name): a
    rewrite of gshmd's message that names the way out in this API's words.
    gshmd names no option (an older one named gshmctl's --replace)."""
    if rc != -errno.EEXIST or replace:
        return None

    def hint(message: str) -> str:
        message = message.replace(" (replace it with --replace)", "")
        return message + " (replace it with replace=True)"
    return hint


@contextlib.contextmanager
def _unlink_on_error(client: Client, name: str, seg: _Seg) -> Iterator[_Seg]:
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


def _connect_hint(path: str, err: int) -> str:
    """libgshm's explanation of gshm_connect's failure err (negative errno)
    at path: why, and what the user can do (gshmctl says the same); the
    error's description alone from a libgshm too old to explain."""
    fn = L.optional_symbol("gshm_connect_explain")
    if fn is None:
        return _strerror(err)
    buf = ctypes.create_string_buffer(1024)
    fn(os.fsencode(path), err, buf, len(buf))  # a cut text is still worth showing
    return buf.value.decode("utf-8", "replace")


def _check_new_mode(mode: int, function: str, name: str) -> None:
    """Refuses mode 0 for a new segment: gshm_create, gshm_pull and gshmd
    take 0 for the default, 0600 (the wire cannot tell them apart), so
    mode=0 gave 0600, silently.  `gshmctl chmod NAME 0` sets 0.  A mode
    that is no int (as os.chmod) is a TypeError: int() read the string
    "444" (gshmctl's --mode 444) as decimal, 0o674, group-writable."""
    if isinstance(mode, (str, bytes, float)):
        raise TypeError("%s: mode is permission bits as an int, such as 0o640 (as os.chmod "
                        "takes them), not %r" % (function, mode))
    if int(mode) == 0:
        e = InvalidArgument(errno.EINVAL, "%s: mode 0 cannot be given to a new segment (gshmd "
                            "takes 0 for its default, 0600): give another mode, then "
                            "'gshmctl chmod NAME 0' to take every access away" % function, name)
        e.function = function
        raise e


def _check_pull_names(name: str, local_name: Optional[str], prefix: bool) -> None:
    """Refuses what gshmctl pull refuses before asking gshmd, in this API's
    words: a name ending in '/' without prefix=True (gshmd's answer said
    only that it is not a name), and a local prefix without the '/' that
    ends the peer's (local_name="v2" for "llama/" made "v2seg-000001",
    not "v2/seg-000001", silently).  Looked at as str, whatever they came
    as (str, bytes or path-like, as _enc takes them)."""
    function, text = "gshm_pull", None
    name = _dec(_enc(name))
    local_name = _dec(_enc(local_name)) if local_name else None
    if not prefix and name.endswith("/"):
        text = "%r ends in '/': to pull every segment under it, pass prefix=True" % name
    elif prefix and name.endswith("/") and local_name and not local_name.endswith("/"):
        function = "gshm_pull_prefix"
        text = ("local_name %r does not end in '/' as %r does: each local name would be %r and "
                "the rest of the peer's name, with no '/' between; write local_name=%r"
                % (local_name, name, local_name, local_name + "/"))
    if text:
        e = InvalidArgument(errno.EINVAL, "%s: %s" % (function, text), name)
        e.function = function
        raise e


class Client(object):
    """A connection to gshmd.

    socket  path of the daemon's socket; None: $GSHM_SOCKET, else
            /run/gshm/gshmd.sock.
    name    shown by `gshmctl clients`; None: the program's name.

    Use as a context manager, or call close(): that ends every lease of this
    client (segments with live device views keep theirs until those go).
    """

    def __init__(self, socket: Optional[Union[str, os.PathLike[str]]] = None,
                 name: Optional[str] = None) -> None:
        lib = L.lib()
        out = ctypes.c_void_p()
        rc = lib.gshm_connect(_enc(socket, "socket"), _enc(name, "name"), ctypes.byref(out))
        if rc < 0:
            # no daemon at the path (ENOENT) is a connection failure here, not a missing segment
            cls = Unreachable if -rc in (errno.ENOENT, errno.ECONNREFUSED, errno.ECONNRESET,
                                         errno.EPIPE) else None
            path = os.fspath(socket) if socket is not None else (
                os.environ.get("GSHM_SOCKET") or "/run/gshm/gshmd.sock")
            why = _connect_hint(path, rc)
            raise error_for(rc, function="gshm_connect", filename=path, cls=cls,
                            description=why, message=why)
        self._h = _ClientHandle(out.value)
        self._fin = _finalizer(self, self._h.release_owner)
        self.socket = os.fspath(socket) if socket is not None else (
            os.environ.get("GSHM_SOCKET") or "/run/gshm/gshmd.sock")
        self.name = name

    # -- lifetime
    def close(self) -> None:
        """Closes every segment of this client and disconnects."""
        self._fin()

    @property
    def closed(self) -> bool:
        return self._h.owner_released

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<gshm.Client %s%s>" % (self.socket, " closed" if self.closed else "")

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """TypeError: a Client is this process's connection (pickle or
        copy would share its C object); connect again in the other process."""
        _refuse_pickle(self, "connection to gshmd")

    def _ptr(self) -> int:
        if self._h.owner_released or not self._h.ptr:
            raise ValueError("gshm: client is closed")
        return self._h.ptr

    def _use(self):
        """with self._use() as p: the C client for one call, kept alive
        against a close() from another thread (ValueError when closed)."""
        return self._h.use("gshm: client is closed")

    @property
    def last_error(self) -> str:
        """The daemon's explanation of the last request this thread made on
        this client, if it failed, or "" (gshm_last_error: another thread's
        request since does not change it; the exceptions carry it as
        gshm_message)."""
        with self._use() as p:
            m = L.lib().gshm_last_error(p)
            return _dec(m) if m else ""

    # -- segments
    def create(self, name: str, size: int, location: Optional[Location] = "host", mode: int = 0o600,
               flags: Optional[int] = 0, legacy_ipc: bool = False,
               hidden: bool = False) -> AnySegment:
        """Creates segment `name` of `size` bytes and opens it read-write.

        size      bytes, an int (1 << 30 for gshmctl's "1G"): a str or bytes
                  ("1G", even "4096") is a TypeError, as a mode string is;
                  a float only when it is integral (1e9), never rounded: 1.5
                  (or nan, inf) is a ValueError.
        location  "host" (the default, as for gshm_create and gshmctl create),
                  "cuda:N" (the daemon's device index), "cuda:GPU-<uuid>",
                  or an int N for "cuda:N".
        mode      permission bits like chmod (0o600, 0o640, ...); not 0, which
                  gshm_create and gshmd take for the default 0600
                  (InvalidArgument; `gshmctl chmod NAME 0` sets 0 afterwards).
        hidden    the segment has no name anyone sees (nobody else opens,
                  stats or lists it) until seg.publish(); closing it (or
                  this client, or a gshmd restart) before frees it.  Fill
                  it, then publish(replace=True) to replace `name` in one
                  step: readers find the old segment or the new one, never
                  none.  NotImplementedError where libgshm lacks
                  gshm_publish, NotSupported where gshmd is too old.
        Raises Exists (EEXIST), InvalidArgument, NoDevice, NotSupported,
        OutOfMemory, LimitExceeded, ..."""
        _check_new_mode(mode, "gshm_create", name)
        if isinstance(location, int) and not isinstance(location, bool):
            location = "cuda:%d" % location
        elif location is not None and not isinstance(location, (str, bytes)):
            location = str(location)
        if isinstance(size, (str, bytes, bytearray)):
            raise TypeError("gshm_create: size is bytes as an int, such as 1 << 30 (gshmctl's "
                            "'1G'), not %r" % (size,))
        size = _whole(size, "gshm_create: size (bytes)")
        if size <= 0:
            raise InvalidArgument(22, "gshm_create: size must be > 0, not %d" % size, name)
        size = _count(size, "size")
        if flags is None:
            flags = 0
        if legacy_ipc:
            flags |= L.GSHM_CREATE_LEGACY_IPC
        if hidden:
            _optional("gshm_publish")  # (an older libgshm would send the flag as it is)
            flags |= L.GSHM_CREATE_HIDDEN
        cflags = int(flags)
        with self._use() as p:
            return self._new_segment(
                p, lambda out: L.lib().gshm_create(p, _enc(name), size, _enc(location, "location"),
                                                   int(mode), cflags, ctypes.byref(out)),
                "gshm_create", name, None if hidden else _enc(name))

    def open(self, name: str, access: str = "rw") -> AnySegment:
        """Opens segment `name` ("r": read-only, "rw": read-write) and
        returns its Segment (HostSegment or DeviceSegment; close it, or use
        it as a context manager).  Whose the segment is, is not checked:
        names are first come, first served, so another user may hold
        `name`; compare seg.stat().uid and .mode before using its bytes as
        data, as gshm.torch.load_state_dict and attach do through their
        owner= (not seg.info's: a name this client already holds is served
        from that lease, and its record may predate a chmod or chown).
        Raises NotFound (ENOENT), PermissionDenied (EACCES), ValueError for
        an unknown access or a closed client, ..."""
        code = _access_code(access)
        with self._use() as p:
            return self._new_segment(
                p, lambda out: L.lib().gshm_open(p, _enc(name), code, ctypes.byref(out)),
                "gshm_open", name, None)

    def _new_segment(self, p: int, call: Callable[[ctypes.c_void_p], int], function: str,
                     name: str, unlink: Optional[bytes]) -> AnySegment:
        """The Segment of the gshm_segment_t that call(out), a libgshm
        create or open on the C client p, writes to out; raises its error.
        Whatever is raised once the call has returned (a signal's
        KeyboardInterrupt, which Python raises as the call ends, before
        its result is stored; a failed mmap in _wrap) leaves nothing of
        it: the C segment is closed (it kept its lease until the client
        closed) and a create's new name, `unlink`, unlinked (it kept the
        memory, a device segment's GiBs, until someone unlinked it)."""
        out = ctypes.c_void_p()
        owned = [False]
        try:
            rc = call(out)
            if rc < 0:
                _raise(rc, function, p, name)
            return self._wrap(out.value, owned)
        except BaseException:
            if out.value:
                if not owned[0]:
                    L.lib().gshm_close(out.value)
                if unlink is not None:
                    L.lib().gshm_unlink(p, unlink)  # (its own error: the one raised is the news)
            raise

    def _wrap(self, ptr: Optional[int], owned: Optional[List[bool]] = None) -> AnySegment:
        """The Segment object for a new gshm_segment_t; called inside
        self._use(), so that the C client (and ptr with it) is alive.
        Closes ptr when it fails; sets owned[0] once it is ptr's to
        close (no step of Python's between the two)."""
        try:
            if owned is not None:
                owned[0] = True
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

    def unlink(self, name: str) -> None:
        """Removes segment `name`; leases keep its memory until they end.
        Raises NotFound (ENOENT) where no segment holds a well-formed
        name, InvalidArgument for a name no segment can have (as open,
        stat, chmod, chown and revoke: EINVAL malformed, ENAMETOOLONG),
        PermissionDenied (EACCES) another user's, ..."""
        with self._use() as p:
            rc = L.lib().gshm_unlink(p, _enc(name))
            if rc < 0:
                _raise(rc, "gshm_unlink", p, name)

    def stat(self, name: str) -> SegmentInfo:
        """SegmentInfo of segment `name`, without opening it."""
        info = L.SegmentInfoC()
        with self._use() as p:
            rc = L.lib().gshm_stat_name(p, _enc(name), ctypes.byref(info))
            if rc < 0:
                _raise(rc, "gshm_stat_name", p, name)
        return SegmentInfo._from_c(info)

    def exists(self, name: str) -> bool:
        """Whether a segment of that name exists and this user may see it.
        False also for a name no segment can have: longer than NAME_MAX
        bytes, or malformed ("", "a//b", a "." or ".." component, a
        control character), for which stat() raises InvalidArgument
        (ENAMETOOLONG, EINVAL), or ValueError before asking gshmd (a NUL
        byte, a lone surrogate: no bytes C could be given).  TypeError for
        a name that is no str, bytes or path; ValueError for a closed
        client."""
        try:
            _enc(name)
        except ValueError:  # (UnicodeEncodeError is one)
            return False
        try:
            self.stat(name)
            return True
        except FileNotFoundError:
            return False
        except InvalidArgument as e:
            if e.errno in (errno.ENAMETOOLONG, errno.EINVAL):
                return False
            raise

    def _list(self, fn_name, ctype, cls):
        arr = ctypes.POINTER(ctype)()
        n = ctypes.c_size_t(0)
        lib = L.lib()
        with self._use() as p:
            rc = _optional(fn_name)(p, ctypes.byref(arr), ctypes.byref(n))
            if rc < 0:
                _raise(rc, fn_name, p)
        try:
            return [cls._from_c(arr[i]) for i in range(n.value)]
        finally:
            lib.gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    def segments(self) -> List[SegmentInfo]:
        """Every segment this client may see (list of SegmentInfo, id order)."""
        return self._list("gshm_list", L.SegmentInfoC, SegmentInfo)

    def leases(self) -> List[LeaseInfo]:
        """Every lease (list of LeaseInfo): one per client per open segment."""
        return self._list("gshm_list_leases", L.LeaseInfoC, LeaseInfo)

    def uid(self) -> int:
        """The uid gshmd knows this connection by: the owner of the segments
        it creates (in a user namespace the outer uid, which os.getuid()
        does not say; docs/CONTAINERS.md).  gshm.torch.attach() expects a
        prefix of this owner unless told another."""
        out = ctypes.c_uint32()
        with self._use() as p:
            rc = _optional("gshm_client_uid")(p, ctypes.byref(out))
            if rc < 0:
                _raise(rc, "gshm_client_uid", p)
        return out.value

    def clients(self) -> List[ClientInfo]:
        """Every client connection (list of ClientInfo)."""
        return self._list("gshm_list_clients", L.ClientInfoC, ClientInfo)

    def devices(self) -> List[DeviceInfo]:
        """The daemon's GPUs with their P2P reachability (list of DeviceInfo);
        empty without a CUDA backend."""
        return self._list("gshm_list_devices", L.DeviceInfoC, DeviceInfo)

    def metrics(self) -> str:
        """The daemon's metrics, Prometheus text format."""
        fn = _optional("gshm_metrics")
        text = ctypes.c_void_p()
        with self._use() as p:
            rc = fn(p, ctypes.byref(text))
            if rc < 0:
                _raise(rc, "gshm_metrics", p)
        try:
            return _dec(ctypes.string_at(text.value)) if text.value else ""
        finally:
            L.lib().gshm_free(text)

    # ---- cluster (docs/CLUSTER.md) ----

    def peers(self) -> List[ClusterPeer]:
        """The daemon's peer nodes, every one of cluster.peers in its order
        (list of ClusterPeer; empty when its cluster is off).  libgshm asks
        the daemon page after page (hundreds of peers do not fit one reply)
        and returns them all; raises as gshm_cluster_peers fails."""
        fn = _optional("gshm_cluster_peers")
        arr = ctypes.POINTER(L.ClusterPeerC)()
        n = ctypes.c_size_t(0)
        with self._use() as p:
            rc = fn(p, None, ctypes.byref(arr), ctypes.byref(n))
            if rc < 0:
                _raise(rc, "gshm_cluster_peers", p)
        try:
            return [ClusterPeer._from_c(arr[i]) for i in range(n.value)]
        finally:
            L.lib().gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    def remote_segments(self, peer: str) -> List[SegmentInfo]:
        """The segments peer node `peer` exports (list of SegmentInfo: the
        peer's ids, names, sizes and locations)."""
        fn = _optional("gshm_list_remote")
        arr = ctypes.POINTER(L.SegmentInfoC)()
        n = ctypes.c_size_t(0)
        with self._use() as p:
            rc = fn(p, _enc(peer), ctypes.byref(arr), ctypes.byref(n))
            if rc < 0:
                _raise(rc, "gshm_list_remote", p, peer, peer=True)
        try:
            return [SegmentInfo._from_c(arr[i]) for i in range(n.value)]
        finally:
            L.lib().gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    # pull's result: one PullResult, or a list of them with prefix=True
    # (mypy knew only the union, so every caller had to narrow or cast it).
    @overload
    def pull(self, peer: Union[str, Sequence[str]], name: str, local_name: Optional[str] = ...,
             location: Optional[str] = ..., mode: int = ..., progress: _Progress = ...,
             prefix: Literal[False] = ..., replace: bool = ...) -> PullResult: ...

    @overload
    def pull(self, peer: Union[str, Sequence[str]], name: str, local_name: Optional[str] = ...,
             location: Optional[str] = ..., mode: int = ..., progress: _Progress = ..., *,
             prefix: Literal[True], replace: bool = ...) -> List[PullResult]: ...

    @overload
    def pull(self, peer: Union[str, Sequence[str]], name: str, local_name: Optional[str] = ...,
             location: Optional[str] = ..., mode: int = ..., progress: _Progress = ...,
             prefix: bool = ..., replace: bool = ...) -> Union[PullResult, List[PullResult]]: ...

    def pull(self, peer: Union[str, Sequence[str]], name: str,
             local_name: Optional[str] = None,
             location: Optional[str] = None, mode: int = 0o600,
             progress: Optional[Callable[[int, int, int], object]] = None,
             prefix: bool = False, replace: bool = False
             ) -> Union[PullResult, List[PullResult]]:
        """Copies segment `name` that peer node `peer` exports into a new local
        segment owned by this user (`local_name`, default the same name; at
        `location`, default host for a host segment, cuda:0 for a device
        one).  The daemons move the bytes; this blocks until they are all
        there and returns a PullResult.  Nobody sees the new name before its
        last byte is in.

        prefix=True pulls every segment the peer exports whose name starts
        with `name` ("llama/": a published gshm.torch model, manifest and
        segments) in one pipelined request and returns a list of
        PullResult, one per segment; `local_name` is then the local prefix
        (ending in '/' where `name` does: InvalidArgument otherwise).
        With prefix=True, `peer` may list several nodes that hold the set
        (["n0", "n1"], at most 8): the first lists it, and each segment
        comes from the one with the fewest of the set's bytes open (each
        result's `peer` says which); a copy must have the first's source
        (where its bytes came from first), else, as a source that refuses
        or cannot be reached, it is passed over for the others (never the
        first: its refusal fails the pull).
        All or nothing: the names appear together once every byte is in, or
        none does.  replace=True swaps out local segments holding those
        names in the same step (their holders keep them) instead of failing
        with Exists.

        `mode`: the new segments' permission bits, not 0 (InvalidArgument,
        as for create).

        `progress(bytes_done, bytes_total, elapsed_ns)` is called about five
        times a second meanwhile (it must not use this client; a segment of
        it whose last reference goes meanwhile on this thread is closed
        when the pull returns).  Once it
        raised it is called no more; any exception but a KeyboardInterrupt
        or SystemExit is reported as a RuntimeWarning once the pull has
        ended.  Ctrl-C while the pull runs (with or without a callback, the
        peer still being reached included) cancels the pull within about
        0.1 s (gshm_pull_cancel: nothing is left behind, unless it ended
        meanwhile) and KeyboardInterrupt is raised (a SIGINT handler of the
        program's that does not raise leaves the pull running).  Errors as
        gshm_pull: NotFound (no such peer, or nothing exported under that
        name), Exists (a local segment holds a name: pass replace=True),
        PermissionDenied, Unreachable (the peer went away; nothing is left
        behind)."""
        _check_new_mode(mode, "gshm_pull", name)
        _check_pull_names(name, local_name, prefix)
        fn = _optional("gshm_pull_prefix" if prefix else "gshm_pull")
        if not isinstance(peer, str):
            peer = ",".join(peer)
        opts = L.PullOptsC()
        opts.local_name = _enc(local_name) if local_name else None
        opts.location = _enc(location) if location else None
        opts.mode = int(mode)
        opts.replace = 1 if replace else 0
        raised: List[BaseException] = []
        interrupted: List[BaseException] = []
        calling: List[int] = []  # the C client while the pull runs
        seen = [0]  # elapsed_ns of the last report passed on

        def _cb(pr, arg):
            # Also called when a signal cut the pull's wait short (the last
            # report's figures again, all 0 before the first): running here
            # is what lets Python raise a Ctrl-C's KeyboardInterrupt while
            # the pull waits, with or without `progress`.
            if raised:
                return  # (called no more once it raised)
            try:
                if progress is not None and pr.contents.elapsed_ns != seen[0]:
                    seen[0] = pr.contents.elapsed_ns
                    progress(pr.contents.bytes_done, pr.contents.bytes_total,
                             pr.contents.elapsed_ns)
            except BaseException as e:  # an exception cannot cross the C frame
                raised.append(e)
                if not isinstance(e, Exception) and calling:
                    _cancel_pull(calling[0])  # Ctrl-C: the pull stops
        cb = L.PULL_PROGRESS_FN(_cb)
        opts.progress = cb
        what = "%s:%s" % (peer, name)
        if not prefix:
            res = L.PullResultC()
            with self._use() as p:
                calling.append(p)
                with _cancel_on_sigint(calling, interrupted), _calling_back(self._h):
                    rc = fn(p, _enc(peer), _enc(name), ctypes.byref(opts), ctypes.byref(res))
                if rc < 0:
                    _progress_interrupted(raised, interrupted)  # (before the cancel's error)
                    _raise(rc, "gshm_pull", p, what, hint=_pull_hint(rc, replace), peer=True)
            _progress_raised(raised, what, interrupted)
            return PullResult._from_c(res)
        arr = ctypes.POINTER(L.PullResultC)()
        n = ctypes.c_size_t(0)
        with self._use() as p:
            calling.append(p)
            with _cancel_on_sigint(calling, interrupted), _calling_back(self._h):
                rc = fn(p, _enc(peer), _enc(name), ctypes.byref(opts), ctypes.byref(arr),
                        ctypes.byref(n))
            if rc < 0:
                _progress_interrupted(raised, interrupted)  # (before the cancel's error)
                _raise(rc, "gshm_pull_prefix", p, what, hint=_pull_hint(rc, replace),
                       peer=True)
        try:
            _progress_raised(raised, what, interrupted)
            return [PullResult._from_c(arr[i]) for i in range(n.value)]
        finally:
            L.lib().gshm_free(ctypes.cast(arr, ctypes.c_void_p))

    def open_legacy_ipc(self, name: str) -> Tuple[bytes, AnySegment]:
        """(handle, segment): the 64-byte legacy CUDA IPC handle of a segment
        created with legacy_ipc=True (for cudaIpcOpenMemHandle), and a segment
        object holding the lease; close it after every importer closed its
        mapping.  The daemon must allow legacy IPC (gshmd --legacy-ipc)."""
        fn = _optional("gshm_open_legacy_ipc")
        handle = (ctypes.c_uint8 * 64)()
        with self._use() as p:
            seg = self._new_segment(
                p, lambda out: fn(p, _enc(name), ctypes.byref(handle), ctypes.byref(out)),
                "gshm_open_legacy_ipc", name, None)
            return bytes(handle), seg

    def status(self) -> StatusInfo:
        """The daemon's totals and version (StatusInfo)."""
        st = L.StatusInfoC()
        with self._use() as p:
            rc = L.lib().gshm_status(p, ctypes.byref(st))
            if rc < 0:
                _raise(rc, "gshm_status", p)
        return StatusInfo._from_c(st)
