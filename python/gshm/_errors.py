# SPDX-License-Identifier: Apache-2.0
"""gshm exceptions: OSError subclasses carrying the errno and gshm's message."""

import errno as _errno
from typing import Optional, Type

__all__ = [
    "Error", "NotFound", "Exists", "PermissionDenied", "InvalidArgument",
    "Unreachable", "NoDevice", "NotSupported", "OutOfMemory", "LimitExceeded",
    "Revoked", "ProtocolError", "TimedOut", "ForkedChild", "Canceled", "error_for",
]


class Error(OSError):
    """Base of every gshm error.

    ``errno`` is the positive errno, ``strerror`` gshm's description of it
    followed by the daemon's explanation when it gave one, ``gshm_message``
    the daemon's explanation alone ("" if none), ``function`` the C function
    that failed and ``filename`` the segment name or socket path involved
    (or None)."""

    gshm_message: str = ""
    function: Optional[str] = None


class NotFound(Error, FileNotFoundError):
    """ENOENT: no such segment."""


class Exists(Error, FileExistsError):
    """EEXIST: the name is in use."""


class PermissionDenied(Error, PermissionError):
    """EACCES / EPERM: the segment's owner and mode bits refuse this."""


class InvalidArgument(Error, ValueError):
    """EINVAL / ENAMETOOLONG: a bad name, size, location, mode or access;
    ERANGE: a range (gshm_read, gshm_write, gshm_copy) outside its segment."""


class Unreachable(Error, ConnectionError):
    """No daemon at the socket, or it (or a cluster peer) went away
    (ECONNREFUSED, ECONNRESET, EPIPE, ENOTCONN), or the socket is another
    program's (EPROTOTYPE)."""


class NoDevice(Error):
    """ENODEV: no such GPU, or it is not visible to this process."""


class NotSupported(Error):
    """ENOTSUP (= EOPNOTSUPP): backend or feature not available on this daemon or machine;
    EXDEV: two GPUs without a peer path; ENOSYS: a CUDA driver too old for it."""


class OutOfMemory(Error, MemoryError):
    """ENOMEM: the backend or the library could not allocate."""


class LimitExceeded(Error):
    """EDQUOT / EFBIG / EMFILE: a quota or limit would be crossed; E2BIG: more
    segments than one request may hold (a set pull of more than 4096)."""


class Revoked(Error):
    """ESTALE: the segment or lease is gone: revoked by an administrator,
    or lost to a gshmd restart (a hidden segment not yet published, a
    lease that could not be taken back)."""


class TimedOut(Error, TimeoutError):
    """ETIMEDOUT: the daemon gave up waiting (a cluster peer that does not answer)."""


class ForkedChild(Error, ChildProcessError):
    """ECHILD: the client, segment or pool was made before this process
    forked (it belongs to the parent; connect again in the child), or CUDA
    was in use when it forked (the driver does not survive a fork: use a
    process started with ``multiprocessing``'s "spawn")."""


class ProtocolError(Error):
    """EPROTO / EPROTONOSUPPORT / EBADMSG: the daemon speaks another protocol,
    or sent a malformed message."""


class Canceled(Error):
    """ECANCELED: the pull was cancelled (gshm_pull_cancel; Client.pull's
    Ctrl-C where SIGINT's handler does not raise).  Nothing is left behind."""


_BY_ERRNO = {
    _errno.ENOENT: NotFound,
    _errno.EEXIST: Exists,
    _errno.EACCES: PermissionDenied,
    _errno.EPERM: PermissionDenied,
    _errno.EINVAL: InvalidArgument,
    _errno.ENAMETOOLONG: InvalidArgument,
    _errno.ERANGE: InvalidArgument,  # a range outside its segment
    _errno.ECONNREFUSED: Unreachable,
    _errno.ECONNRESET: Unreachable,
    _errno.EPIPE: Unreachable,
    _errno.ENOTCONN: Unreachable,
    _errno.EPROTOTYPE: Unreachable,  # a stream or datagram socket: not gshmd's
    _errno.ETIMEDOUT: TimedOut,
    _errno.ENODEV: NoDevice,
    _errno.ENOTSUP: NotSupported,
    _errno.EOPNOTSUPP: NotSupported,
    _errno.EXDEV: NotSupported,  # no peer path between two GPUs
    _errno.ENOSYS: NotSupported,  # a CUDA driver too old
    _errno.ENOMEM: OutOfMemory,
    _errno.EDQUOT: LimitExceeded,
    _errno.EFBIG: LimitExceeded,
    _errno.EMFILE: LimitExceeded,
    _errno.E2BIG: LimitExceeded,  # STATUS_TOO_MANY (read as EFBIG before it had its own)
    _errno.ESTALE: Revoked,
    _errno.ECHILD: ForkedChild,
    _errno.EPROTO: ProtocolError,
    _errno.EPROTONOSUPPORT: ProtocolError,
    _errno.EBADMSG: ProtocolError,
    _errno.ECANCELED: Canceled,
}


def error_for(err: int, function: Optional[str] = None, filename: Optional[str] = None,
              message: str = "", description: Optional[str] = None,
              cls: Optional[Type[Error]] = None) -> Error:
    """The exception for a gshm return value ``err`` (negative or positive errno)."""
    code = -err if err < 0 else err
    if cls is None:
        cls = _BY_ERRNO.get(code, Error)
    if description is None:
        try:
            import os
            description = os.strerror(code)
        except ValueError:
            description = "error %d" % code
    text = description
    if message and message != description:
        text = "%s: %s" % (description, message)
    if function:
        text = "%s: %s" % (function, text)
    if filename is not None:
        exc = cls(code, text, filename)
    else:
        exc = cls(code, text)
    exc.gshm_message = message or ""
    exc.function = function
    return exc
