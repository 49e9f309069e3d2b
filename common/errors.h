/* SPDX-License-Identifier: Apache-2.0 */
/* The one error table (libuv's UV_ERRNO_MAP pattern): every negative errno
 * that gshm returns, with its message.  gshm_strerror(), gshm_err_name()
 * and the daemon's replies all read it.  One errno per meaning: on Linux
 * ENOTSUP and EOPNOTSUPP are the same value (95), so gshm uses only
 * ENOTSUP (a backend or feature is unavailable) and EXDEV for "these two
 * GPUs have no peer path". */
#ifndef GSHM_COMMON_ERRORS_H
#define GSHM_COMMON_ERRORS_H

#include <stdbool.h>
#include <stddef.h>

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
  X(EPROTOTYPE, "not gshmd's socket (a stream or datagram socket)")                \
  X(ETIMEDOUT, "timed out")                                                        \
  X(ESTALE, "segment or lease is gone (revoked, or freed across a daemon restart)") \
  X(EDQUOT, "quota exceeded")                                                      \
  X(EREMOTEIO, "gshmd failed (its message says why)")                              \
  X(ECHILD, "made before this process forked: connect again here (CUDA: not after a fork)") \
  X(ENOBUFS, "the text did not fit the buffer")                                   \
  X(E2BIG, "too many segments for one request")                                    \
  X(ECANCELED, "canceled (gshm_pull_cancel)")

/* libgshm's gshm_last_error() when the connection to gshmd itself was
 * lost (no answer of gshmd's to show): gshmctl tells it from an answer. */
#define GSHM_LOST_GSHMD_TEXT "connection to gshmd lost"

/* Message for a negative (or positive) errno; never NULL. */
const char *gshm__strerror(int err);

/* Symbolic name of a negative (or positive) errno of the table, e.g.
 * "EACCES"; "E?" for any other value. */
const char *gshm__errname(int err);

/* Why a pull from a cluster peer failed, by the errno that ended it: one
 * table for gshmd's gshm_cluster_pull_errors_total{cause} label, its log
 * line and gshmctl pull's message, so that both say the same thing
 * (the errno's own text would speak of the local gshmd: "connection to
 * gshmd reset" for a peer that went away).  X(NAME, label, text); text
 * NULL: the errno's own (gshm__strerror). */
#define GSHM_PULL_FAILURE_MAP(X)                                   \
  X(PEER_LOST, "peer_lost", "peer lost or unreachable")            \
  X(NOT_FOUND, "not_found", "not found")                           \
  X(REFUSED, "refused", "permission denied")                       \
  X(EXISTS, "exists", "segment exists")                            \
  X(CANCELED, "canceled", "canceled")                              \
  X(NO_MEMORY, "no_memory", "out of memory or quota")              \
  X(PROTOCOL, "protocol", "protocol error")                        \
  X(OTHER, "other", NULL)

enum gshm_pull_failure {
#define GSHM_PULL_FAILURE_ENUM(name, label, text) GSHM_PULL_FAIL_##name,
  GSHM_PULL_FAILURE_MAP(GSHM_PULL_FAILURE_ENUM)
#undef GSHM_PULL_FAILURE_ENUM
  GSHM_PULL_FAIL_N
};

/* The cause of a failed pull's negative errno: PEER_LOST for -ECONNRESET,
 * -ETIMEDOUT, -ESHUTDOWN; NOT_FOUND -ENOENT; REFUSED -EACCES, -EPERM;
 * EXISTS -EEXIST; CANCELED -ECANCELED; NO_MEMORY -ENOMEM, -EDQUOT;
 * PROTOCOL -EPROTO, -EPROTONOSUPPORT; OTHER any other. */
enum gshm_pull_failure gshm__pull_failure(int err);

/* A cause's metrics label ("peer_lost"); "other" out of range. */
const char *gshm__pull_failure_label(enum gshm_pull_failure f);

/* What err means when a request to a cluster peer failed with it: the
 * table's text for its cause ("peer lost or unreachable" for
 * -ECONNRESET), else its errno text (gshm__strerror).  Never NULL. */
const char *gshm__peer_failure_text(int err);

/* What a pull asked for, in words, into buf (len bytes, truncated,
 * NUL-terminated): "'NAME'" (one segment), "the set under 'PREFIX'"
 * (prefix), or "every segment" for the empty prefix (all a peer
 * exports: "under ''" said nothing).  Returns buf.  GSHM__PULL_WHAT_CAP
 * holds the words around a name of up to 255 bytes (gshm.h's
 * GSHM_NAME_MAX, which common/ does not include). */
#define GSHM__PULL_WHAT_CAP 288
char *gshm__pull_what(char *buf, size_t len, bool prefix, const char *name);

/* The one wording of a failed pull, into buf (len bytes, truncated,
 * NUL-terminated): "pull of [the set under ]'NAME' from peer 'PEER'
 * failed: CAUSE: WHY" (CAUSE: the table's text for err, else its errno
 * text; ": WHY" left out when why is NULL or empty; "from peers 'A,B'"
 * where PEER lists several; the set as gshm__pull_what says it).
 * prefix: a set pull (NAME is its prefix).  Returns buf. */
char *gshm__pull_failure_message(char *buf, size_t len, bool prefix, const char *name,
                                 const char *peer, int err, const char *why);

#endif
