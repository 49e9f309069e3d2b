# SPDX-License-Identifier: Apache-2.0
"""The ctypes glue shared by the client, segment and info modules: name
encoding, error raising, access codes, optional symbols and the reference
counted handles of the C objects.  The public classes live in _client.py,
_segment.py, _info.py and _copy.py; the package (gshm/__init__.py) is
their API."""

import contextlib
import ctypes
import errno
import operator
import os
import sys
import threading
import weakref
from typing import Any, Iterator, List, NoReturn, Optional, Tuple

from . import _dlpack, _lib as L
from ._errors import error_for

# ---------------------------------------------------------------- helpers

def _enc(s, what="name"):
    """s (str, bytes or path-like; None stays None) as the bytes C sees.
    An embedded NUL byte raises ValueError: ctypes would pass a shorter
    string, and unlink("app/x\\0.tmp") would remove "app/x"."""
    if s is None:
        return None
    if isinstance(s, os.PathLike):
        s = os.fspath(s)
    if isinstance(s, str):
        b = s.encode("utf-8", "surrogateescape")
    elif isinstance(s, bytes):
        b = s
    else:
        raise TypeError("gshm: %s must be str or bytes, not %s" % (what, type(s).__name__))
    if b"\0" in b:
        raise ValueError("gshm: %s %r contains a NUL byte" % (what, s))
    return b


_C_BITS = {"uint64_t": 64, "size_t": 8 * ctypes.sizeof(ctypes.c_size_t)}


def _whole(v, what):
    """v as an int: an int as it is, a float (or another number) only when
    it is integral (1e9), never rounded: ValueError naming `what` and the
    rule for 1.5, nan or inf (int() made 1.5 a 1 silently)."""
    try:
        return operator.index(v)
    except TypeError:
        pass
    try:
        n = int(v)
        whole = n == v
    except (ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError("%s is a whole number, not %r: a float is taken only when it is "
                         "integral (1e9), never rounded" % (what, v))
    return n


def _count(v, what, ctype="uint64_t"):
    """v as a non-negative int that fits the C type; ValueError for a
    negative one, one of 2**64 and up (ctypes would wrap it silently) or
    a non-integral one (_whole)."""
    n = _whole(v, "gshm: " + what)
    if n < 0:
        raise ValueError("gshm: %s %d is negative" % (what, n))
    if n >> _C_BITS[ctype]:
        raise ValueError("gshm: %s %d does not fit in %d bits (%s)" % (what, n, _C_BITS[ctype],
                                                                      ctype))
    return n


def _dec(b):
    return b.decode("utf-8", "surrogateescape")


def _strerror(rc):
    try:
        s = L.lib().gshm_strerror(rc)
        return _dec(s) if s else None
    except Exception:
        return None


# A request to a cluster peer that failed with one of these lost the peer,
# not this process's gshmd, whose text the errno's would give ("connection
# to gshmd reset"): gshmctl's words for it (common/errors.h,
# GSHM_PULL_FAILURE_MAP's PEER_LOST), unless libgshm lost gshmd itself.
_PEER_LOST = (errno.ECONNRESET, errno.ETIMEDOUT, errno.ESHUTDOWN)
_PEER_LOST_TEXT = "peer lost or unreachable"
_LOST_GSHMD_TEXT = "connection to gshmd lost"  # (GSHM_LOST_GSHMD_TEXT)


def _raise(rc, function, client_ptr=None, filename=None, cls=None, hint=None, peer=False):
    """Raises the exception for rc, with the daemon's explanation of the
    client's last request; hint(message), when given, rewrites that.
    peer: the request went on to a cluster peer (a pull, a remote list)."""
    message = ""
    if client_ptr:
        m = L.lib().gshm_last_error(client_ptr)
        message = _dec(m) if m else ""
    description = _strerror(rc)
    if peer and abs(rc) in _PEER_LOST and message != _LOST_GSHMD_TEXT:
        description = _PEER_LOST_TEXT
    if hint is not None:
        message = hint(message)
    if isinstance(filename, bytes):
        filename = _dec(filename)
    raise error_for(rc, function=function, filename=filename, message=message,
                    description=description, cls=cls)


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

# Guards the handles' counts and sets.  gshm_close and gshm_disconnect are
# never called with it held: they wait for the client's lock, which
# another thread's request (a pull: minutes) holds, and with this lock held
# every other thread's gshm call, and a finalizer run by the garbage
# collector inside that request's progress callback, would wait too (the
# latter for ever).  A segment whose last reference goes while this thread
# holds it (the collector runs at any allocation) has its close put off
# (_SegHandle.decref).
_state_lock = L.fork_safe(threading.RLock())


class _PutOffLock(object):
    """A reentrant lock that a request of another thread (a pull's
    progress callback) may want: the segment closes that finalizers make
    while this thread holds one (the collector runs at any allocation) are
    put off as under _state_lock (_SegHandle.decref; their wait for a
    client's lock, held by another thread's request whose callback waited
    for this lock, hung both for ever), and made once this thread has let
    go of the outermost (outside a capture).  wait() and notify_all(), with
    the lock held: a condition over it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)

    def wait(self) -> None:
        """Lets go of the lock (all of this thread's holds) until another
        thread's notify_all(), and takes it again."""
        self._cond.wait()

    def notify_all(self) -> None:
        self._cond.notify_all()

    def __enter__(self) -> "_PutOffLock":
        self._lock.acquire()
        _tls.putting_off = getattr(_tls, "putting_off", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        _put_off_end()


def _put_off_end() -> None:
    """Ends one of this thread's put-off scopes (_PutOffLock, _putting_off);
    the outermost makes what was put off (outside a capture and
    _state_lock)."""
    _tls.putting_off -= 1
    _flush_when_free()


def _put_off_here() -> bool:
    """Whether a segment close or a client's last disconnect made on this
    thread now is put off (_deferred): during a CUDA graph capture (their
    wait for the GPU's queued work would invalidate it), with _state_lock
    or _dlpack._LIVE_LOCK held or in a put-off scope (_PutOffLock,
    _putting_off: their wait for a client's lock or the GPU would stall
    every thread that wants that lock, and for ever where another thread's
    request waits for it in a progress callback: a DLPack tensor let go of
    there takes _LIVE_LOCK).  What is put off under _LIVE_LOCK is made at
    the next call's end, as under _state_lock."""
    return bool(_state_lock._is_owned() or _dlpack._LIVE_LOCK._is_owned()
                or getattr(_tls, "putting_off", 0) or _capturing())


def _flush_when_free() -> None:
    """Makes what was put off, unless this thread must put off still
    (_put_off_here)."""
    if _deferred and not _put_off_here():
        _flush_deferred()


@contextlib.contextmanager
def _putting_off() -> Iterator[None]:
    """with _putting_off(): the closes that finalizers make on this thread
    meanwhile (a gc.collect() here) are put off as under a _PutOffLock, and
    made at its end; for a client that a request with callbacks holds (a
    pull's, whose callback may be waiting for this thread), at that
    request's end."""
    _tls.putting_off = getattr(_tls, "putting_off", 0) + 1
    try:
        yield
    finally:
        _put_off_end()


class _Handle(object):
    """What both handles share: use(), the C object for the length of one
    call (ptr, refs, owner_released and decref() are the subclass's)."""

    def __reduce_ex__(self, protocol):
        _refuse_pickle(self, "handle of a libgshm object")

    @contextlib.contextmanager
    def use(self, closed_message):
        """with handle.use(message) as ptr: ptr stays valid until the block
        ends, whatever another thread's close() does meanwhile (ctypes lets
        go of the GIL in every call, and a close that freed the C object
        under a call was a use after free).  ValueError(closed_message)
        when the owner has closed it already."""
        with _state_lock:
            if self.owner_released or not self.ptr:
                raise ValueError(closed_message)
            self.refs += 1
        try:
            yield self.ptr
        finally:
            self.decref()
            _flush_when_free()  # (put off under _state_lock: see _SegHandle.decref)


# Segment closes put off while a CUDA graph capture ran on the closing
# thread, or while that thread was inside a request of the segment's client
# that calls back into Python (_calling_back), or held a lock where they
# must not wait (_put_off_here): (segment ptr, its client handle, pid); and
# clients' last disconnects put off likewise: (client ptr, None, pid).
# libgshm's last unmap of
# a device mapping waits for the GPU's queued work (cuCtxSynchronize), which
# CUDA refuses during a capture and which may invalidate it; PyTorch puts
# off its own frees during a capture the same way.  A view's last reference
# can go there (the garbage collector runs at any allocation).  Closed at
# the next close outside a capture, or when the client is closed.
_deferred: List[Tuple[int, Optional["_ClientHandle"], int]] = []


def _capturing() -> bool:
    """Whether this thread's current CUDA stream is capturing a graph, as
    torch says (False where torch is not imported or has no CUDA yet)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized()
                    and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def _close_segment(ptr: int, client: "_ClientHandle") -> None:
    L.lib().gshm_close(ptr)
    client.decref()  # after the close, which needs the client


def _flush_deferred() -> None:
    """Closes the segments _deferred holds and disconnects its clients
    (this process's; a forked child's copies are dropped: the parent's to
    close), but the segments of a client that a thread is in a request of
    (_calling_back): its close would wait for that request (this thread's
    own for ever, another's for minutes), and the request's end makes it.
    (A client is disconnected after its segments: each holds it.)"""
    while True:
        with _state_lock:
            i = next((i for i, d in enumerate(_deferred)
                      if d[1] is None or not d[1].calling_back), None)
            if i is None:
                return
            ptr, client, pid = _deferred.pop(i)
        if pid != os.getpid():
            continue
        if client is None:
            L.lib().gshm_disconnect(ptr)
        else:
            _close_segment(ptr, client)


# The clients this thread is in a request of that calls back into Python
# (a pull's progress callback, where Python also runs signal handlers):
# libgshm holds the client's lock, which is not recursive, until the
# request returns.  A segment of that client whose last reference went on
# this thread meanwhile (the garbage collector runs at any allocation, a
# DLPack deleter when a tensor goes, the callback may drop one) was closed
# there, and gshm_close waited for that lock, held by its own thread: for
# ever.  Its close is put off (_deferred) to the request's end.
_tls = threading.local()


def _busy_clients() -> List["_ClientHandle"]:
    return getattr(_tls, "calling_back", [])


@contextlib.contextmanager
def _calling_back(client: "_ClientHandle") -> Iterator[None]:
    """with _calling_back(handle): around a libgshm request on client
    `handle` whose callbacks run Python on this thread; the closes put off
    meanwhile are made once it has returned (outside a capture)."""
    busy = getattr(_tls, "calling_back", None)
    if busy is None:
        busy = _tls.calling_back = []
    busy.append(client)
    with _state_lock:
        client.calling_back += 1
    try:
        yield
    finally:
        busy.pop()
        with _state_lock:
            client.calling_back -= 1
        _flush_when_free()


class _ClientHandle(_Handle):
    def __init__(self, ptr):
        self.ptr = ptr
        self.refs = 1
        self.owner_released = False
        self.pid = os.getpid()
        self.segments = set()
        self.calling_back = 0  # threads in a request of it that calls back (_calling_back)

    def incref(self):
        with _state_lock:
            self.refs += 1

    def decref(self):
        with _state_lock:
            self.refs -= 1
            if self.refs or not self.ptr:
                return
            ptr, self.ptr = self.ptr, None
        if self.pid != os.getpid():
            return  # a forked child must not touch the parent's connection
        # Outside the lock (see _state_lock): it waits for the client's
        # lock and, for the device mappings whose unmap it finishes, for the
        # GPU's queued work.  Put off where a segment's close is
        # (_put_off_here: the last reference dropped by a finalizer that
        # the garbage collector ran at an allocation under a lock, or
        # during a capture), to the end of the next call, lock or capture.
        if _put_off_here():
            with _state_lock:
                _deferred.append((ptr, None, self.pid))
            return
        L.lib().gshm_disconnect(ptr)

    def release_owner(self):
        _flush_when_free()  # (they hold their clients: this one's may be among them)
        with _state_lock:
            if self.owner_released:
                return
            self.owner_released = True  # from now on no segment joins (_SegHandle)
            segments = list(self.segments)
        for s in segments:
            s.release_owner()
        self.decref()


class _SegHandle(_Handle):
    def __init__(self, ptr, client_handle):
        self.ptr = ptr
        self.client = client_handle
        self.refs = 1
        self.owner_released = False
        self.unmapping = False  # DeviceSegment.unmap under way: no new view
        self.pid = os.getpid()
        with _state_lock:
            # Client.close() on another thread while this segment was being
            # opened: it closed every segment it knew of, so this one too.
            if client_handle.owner_released:
                raise ValueError("gshm: client is closed")
            client_handle.incref()
            client_handle.segments.add(self)

    def incref(self):
        with _state_lock:
            if not self.ptr:
                raise ValueError("gshm: segment is closed")
            if self.unmapping:
                raise BufferError("gshm: segment is being unmapped (unmap() on another thread)")
            self.refs += 1

    def decref(self):
        with _state_lock:
            self.refs -= 1
            if self.refs or not self.ptr:
                return
            ptr, self.ptr = self.ptr, None
            self.client.segments.discard(self)
        if self.pid != os.getpid():  # a forked child's copy: the parent's to close
            self.client.decref()
            return
        # (_deferred: the close's wait would break the capture, or wait for
        # this very thread's request, or, where this thread holds
        # _state_lock (a finalizer the garbage collector ran at an
        # allocation under it), stall every thread's gshm call behind
        # another's request, and for ever where that request's callback
        # wants the lock, or, likewise, a _PutOffLock; made at the next
        # call's end, or the _PutOffLock's)
        if self.client in _busy_clients() or _put_off_here():
            with _state_lock:
                _deferred.append((ptr, self.client, self.pid))
            return
        _flush_deferred()
        _close_segment(ptr, self.client)  # outside the lock, as for the client

    def release_owner(self):
        with _state_lock:
            if self.owner_released:
                return
            self.owner_released = True
        self.decref()


def _refuse_pickle(obj: Any, what: str) -> NoReturn:
    """__reduce_ex__ of the objects that stand for C objects of this
    process (a Client, a Segment, a DeviceArray): TypeError.  Pickled, one
    carried a raw libgshm pointer into another process (multiprocessing's
    "spawn", torch.multiprocessing), whose first call on it crashed; copied
    (copy.copy, copy.deepcopy), two objects each closed the one C object,
    the second close a use after free."""
    raise TypeError("gshm: cannot pickle or copy a %s: it is this process's %s; in another "
                    "process make its own (gshm.Client(socket), then open the segment by "
                    "name) and pass names, not objects" % (type(obj).__name__, what))


def _finalizer(obj, fn, *args):
    f = weakref.finalize(obj, fn, *args)
    f.atexit = False  # at exit the process ending ends every lease anyway
    return f
