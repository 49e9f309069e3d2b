/* SPDX-License-Identifier: Apache-2.0 */
/* The one error table (libuv's UV_ERRNO_MAP pattern): every negative errno
 * that gshm returns, with its message.  gshm_strerror(), gshm_err_name()
 * and the daemon's replies all read it.  One errno per meaning: on Linux
 * ENOTSUP and EOPNOTSUPP are the same value (95), so gshm uses only
 * ENOTSUP (a backend or feature is unavailable) and EXDEV for "these two
 * GPUs have no peer path". */
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
  X(EXDEV, "the two GPUs have no peer (P2P) path")                                 \
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

/* Symbolic name of a negative (or positive) errno of the table, e.g.
 * "EACCES"; "E?" for any other value. */
const char *gshm__errname(int err);

#endif
