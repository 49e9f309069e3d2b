/* The one error table (libuv's UV_ERRNO_MAP pattern): every negative errno
 * that gshm returns, with its message.  gshm_strerror() and the daemon's
 * replies both read it. */
#ifndef GSHM_COMMON_ERRORS_H
#define GSHM_COMMON_ERRORS_H

#define GSHM_ERRNO_MAP(X)                                                          \
  X(EPERM, "operation not permitted (admin only)")                                 \
  X(ENOENT, "not found")                    \
  X(EINTR, "interrupted")                                                          \
  X(EIO, "input/output error in the backend or driver")                            \
  X(EBADF, "bad file descriptor")                                                  \
  X(EAGAIN, "resource temporarily unavailable")                                    \
  X(ENOMEM, "out of memory")                                                       \
  X(EACCES, "permission denied")                                                   \
  X(EBUSY, "busy")                                                                 \
  X(EEXIST, "segment exists")                                                      \
  X(ENODEV, "no such GPU, or the segment's GPU cannot be reached")                 \
  X(EINVAL, "invalid argument")                                                    \
  X(EMFILE, "a limit on segments, leases or connections was reached")              \
  X(EFBIG, "size over a limit")                                                    \
  X(ENOSPC, "no space")                                                            \
  X(EPIPE, "connection to gshmd lost")                                             \
  X(ERANGE, "value out of range")                                                  \
  X(ENAMETOOLONG, "name too long")                                                 \
  X(ENOSYS, "not implemented by this driver")                                      \
  X(EPROTO, "protocol error")                                                      \
  X(EBADMSG, "malformed message")                                                  \
  X(EMSGSIZE, "message too long")                                                  \
  X(EPROTONOSUPPORT, "protocol version not supported by gshmd")                    \
  X(ENOTSUP, "not supported here (backend or feature unavailable)")                \
  X(ECONNRESET, "connection to gshmd reset")                                       \
  X(ECONNREFUSED, "gshmd is not running (connection refused)")                     \
  X(ETIMEDOUT, "timed out")                                                        \
  X(ESTALE, "segment or lease is gone (revoked, or freed across a daemon restart)") \
  X(EDQUOT, "quota exceeded")

/* Message for a negative (or positive) errno; never NULL. */
const char *gshm__strerror(int err);

/* Symbolic name, e.g. "EACCES"; "E?" when unknown. */
const char *gshm__errname(int err);

#endif
