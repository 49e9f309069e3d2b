/* SPDX-License-Identifier: Apache-2.0 */
/* The seam between gshmd's connection I/O (server.c: sockets, queues,
 * accept, timers) and its request handlers (requests.c: one function per
 * message type, the list pager).  Internal to gshmd. */
#ifndef GSHMD_REQUESTS_H
#define GSHMD_REQUESTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "gshm.pb-c.h"
#include "list.h"
#include "registry.h"

struct gshmd_server;

/* One client connection (server.c owns it: accept creates it, the loop
 * frees it after gshmd_conn_close). */
struct conn {
  struct gshmd_server *srv;
  uv_poll_t poll;
  int fd;
  struct gshmd_cred cred;
  struct gshmd_client *client; /* set by hello */
  bool closing;
  struct gshm_list node;
  /* Packets that did not fit in the socket buffer.  While any wait we
   * read nothing more from this client (backpressure): the queue holds at
   * most one reply plus the events sent meanwhile (and a cluster request's
   * later answers); its replies are capped at the config's
   * limits.max_inflight (then the client is dropped), its events only by
   * the leases the connection holds (server.c conn_send). */
  struct gshm_list outq;
  unsigned noutq;
  unsigned nevents;             /* of noutq, events */
  int64_t accepted_ns, last_ns; /* CLOCK_MONOTONIC: timeouts */
  uint64_t notify_mark;         /* gshmd_notify_lease_holders: already a target */
  bool sent_fd;                 /* an fd went on it (gshmd_closer_close_client) */
  int64_t stalled_ns;           /* CLOCK_MONOTONIC: when outq last went from empty */
  int pidfd;                    /* cred.pid's, while outq waits (server.c stalled_gone); -1 */
};

/* ---- server.c ---- */

/* Ends the connection: its client and leases go now, the socket when the
 * loop has closed the watcher.  why (may be NULL) goes to the log.  A
 * second call does nothing. */
void gshmd_conn_close(struct conn *c, const char *why);

/* Sends the packet of len bytes already in c->srv->txbuf, or queues a
 * copy behind earlier ones when the client's socket buffer is full.  fd
 * (>= 0: sent along) stays the caller's; a queued packet keeps a dup.
 * Returns 0; -ETOOMANYREFS (gshmd's fds in flight are over its
 * RLIMIT_NOFILE) or -EMFILE (no fd for the dup of a queued packet) when
 * the packet could not go with its fd: nothing was sent or queued and the
 * connection stays (the caller answers without the fd); or a negative
 * errno after closing the connection: -ENOBUFS limits.max_inflight
 * replies already wait (events do not count), -ENOMEM, or the send's
 * error (-EPIPE, -ECONNRESET, ...). */
int gshmd_conn_send_packet(struct conn *c, size_t len, int fd);

/* Packs reply as the answer (type | GSHM_WIRE_REPLY) to request_id and
 * sends it as gshmd_conn_send_packet does, with its errors, and -EMSGSIZE when
 * the reply does not fit in one packet (the connection is closed). */
int gshmd_conn_send(struct conn *c, uint16_t type, uint32_t request_id, const Gshm__Reply *reply,
                    int fd);

/* Marks the reply that gshmd_conn_send just queued (when it queued it:
 * nothing otherwise) as granting c's lease lease_id with its fd (created:
 * in answer to a create).  If that fd cannot go when the queue is flushed
 * (gshmd's fds in flight over its RLIMIT_NOFILE: ETOOMANYREFS), the grant
 * is taken back (gshmd_registry_grant_undo) and the reply becomes an
 * -EMFILE refusal, as for a reply refused at once; the connection stays. */
void gshmd_conn_queued_grant(struct conn *c, uint64_t lease_id, bool created);

/* The message of that refusal. */
#define GSHMD_FD_REFUSED "gshmd cannot pass an fd now (fds in flight at its limit): try again"

/* Answers a request that breaks the protocol with status and message,
 * then drops the client; counts a protocol error. */
void gshmd_conn_fail(struct conn *c, uint16_t type, uint32_t request_id, Gshm__Status status,
                     const char *message);

/* Tells every connection with a lease on seg, but `except` (the requester,
 * which learns it from its reply; may be NULL), that the segment's name
 * went away (kind).  No connection is closed here (an event that cannot
 * be sent now is queued; a peer that went away is closed by its poll), so
 * leases and segments are as they were: callable from inside a registry
 * change. */
void gshmd_notify_lease_holders(struct gshmd_server *s, struct gshmd_segment *seg,
                                Gshm__EventKind kind, const struct conn *except);

/* ---- requests_revoke.c ---- */

/* Handles c's RevokeRequest m (gshm_revoke, gshm_revoke_id): tells the
 * segment's lease holders, then gshmd_registry_revoke.  A revoke with a
 * token (GSHM_REVOKE_TOKEN_BYTES) is noted in the fd store's resend memo
 * before the segment goes; the same token again from the same admin uid
 * (libgshm's resend after a restart lost the reply) acts on the first
 * one's segment only: 0 when it is gone, else it is revoked now.
 * Errors: as gshmd_registry_revoke; -EINVAL a token of another length.
 * *msg_out may point at a static or registry buffer. */
int gshmd_request_revoke(struct conn *c, const Gshm__RevokeRequest *m, const char **msg_out);

/* Handles c's UnlinkRequest m (gshm_unlink): tells the segment's lease
 * holders, then gshmd_registry_unlink.  An unlink with a token
 * (GSHM_UNLINK_TOKEN_BYTES) is noted in the fd store's resend memo with
 * the segment's id before the name goes; the same token again from the
 * same uid (libgshm's resend after a restart lost the reply) acts on the
 * first one's segment only: 0 when it is gone or unlinked, else (killed
 * between the note and the unlink) it is unlinked now; a segment that
 * took the name since is left alone.  Errors: as gshmd_registry_unlink;
 * -EINVAL a token of another length.  *msg_out may point at a static or
 * registry buffer. */
int gshmd_request_unlink(struct conn *c, const Gshm__UnlinkRequest *m, const char **msg_out);

/* Handles c's PublishRequest m (gshm_publish): gshmd_registry_publish_lease.
 * A publish with a token (GSHM_PUBLISH_TOKEN_BYTES) has the published
 * segment's new id noted in the fd store's resend memo before the publish
 * reaches the store; the same token again from the same uid (libgshm's
 * resend after a restart lost the reply) publishes nothing: it gets a new
 * read-write lease on the first one's segment
 * (gshmd_registry_publish_resent), or -ESTALE when that segment is gone
 * (the restart came before the publish was stored).  *lease_out: the lease
 * to grant (no fd: the client holds the segment's).  Errors: as
 * gshmd_registry_publish_lease and gshmd_registry_publish_resent; -EINVAL
 * a token of another length.  *msg_out may point at a static or registry
 * buffer. */
int gshmd_request_publish(struct conn *c, const Gshm__PublishRequest *m,
                          struct gshmd_lease **lease_out, const char **msg_out);

/* ---- server_admit.c ---- */

/* The peer's credentials on socket fd into *cred (its groups malloc'ed:
 * freed with the connection), admin set for root and s's admin group.
 * Returns 0, or -ENOMEM. */
int gshmd__peer_credentials(struct gshmd_server *s, int fd, struct gshmd_cred *cred);

/* Whether a peer of cred must be refused at accept: its uid holds
 * quota.connections already / gshmd holds limits.max_connections (less
 * the admins' reserve for others).  Each logs the refusal. */
bool gshmd__over_uid_quota(struct gshmd_server *s, const struct gshmd_cred *cred);
bool gshmd__over_global_limit(struct gshmd_server *s, const struct gshmd_cred *cred);

/* Whether a connected peer of cred, which just sent fds (queued for
 * closing), must be dropped: its uid's connections and fds still to be
 * closed now exceed quota.connections, or everyone's exceed
 * limits.max_connections (less the admins' reserve for others).  Checked
 * per packet, or one connection allowed fds
 * (limits.max_fds_per_connection) could start blocked closes, each
 * holding a thread and its fds, without end.  Logs the refusal. */
bool gshmd__fds_over_limits(struct gshmd_server *s, const struct gshmd_cred *cred);

/* ---- server_close.c: clients' fds closed off the loop ---- */

/* Starts the closer of s on loop (no thread yet: the first close makes
 * one).  0, -ENOMEM, or libuv's negative error. */
int gshmd_closer_start(struct gshmd_server *s, uv_loop_t *loop);

/* Closes fds[0..n) (taking them; n <= 0: nothing) that uid's client gave,
 * on a closer thread: never on the loop, where a close that lingers would
 * stall every client, unless no thread exists and none can be made (then
 * here).  Each fd counts as a connection of uid until it is closed. */
void gshmd_closer_close(struct gshmd_server *s, const int *fds, int n, uid_t uid);

/* Closes client socket fd (taking it) of a connection gshmd ended, as
 * gshmd_closer_close; but where an fd went on it (sent_fds) and the client
 * has not read all gshmd sent (SIOCOUTQ > 0), first keeps it, shut down
 * (the client reads the rest, then the end), until the client has read
 * all or closed its end (looked at every DRAIN_CHECK_MS, 500 ms): unread
 * packets' fds count against gshmd's user's RLIMIT_NOFILE in the kernel
 * (ETOOMANYREFS) while the client keeps its end, and meanwhile the socket
 * counts as a connection of uid, so quota.connections bounds them.  A
 * closer thread first empties fd's own receive queue (the kernel closes
 * its fds there): a packet carrying the client's end, never read, kept
 * that end, and the socket, alive after the client exited. */
void gshmd_closer_close_client(struct gshmd_server *s, int fd, uid_t uid, bool sent_fds);

/* The fds uid's clients gave that are not closed yet (queued, or behind
 * or in a close still blocked in the kernel), or every uid's where uid is
 * (uid_t)-1; batches that ended are freed first.  Each fd counts as a
 * connection of its uid for quota.connections and limits.max_connections. */
uint32_t gshmd__closes_pending(struct gshmd_server *s, uid_t uid);

/* Closes the closer's loop handles (gshmd_server_stop); closes still
 * queued after it run as before, without waking the loop. */
void gshmd_closer_stop(struct gshmd_server *s);

/* Frees the closer (gshmd_server_free).  Threads still blocked in a close
 * keep it until the last one returns, then free it (and never touch s). */
void gshmd_closer_free(struct gshmd_server *s);

/* Polls the listener again after an fd-limit pause (server.c; an fd was
 * freed). */
void gshmd__accept_resume(struct gshmd_server *s);

/* ---- requests.c ---- */

/* Handles one received packet of len bytes (header and body) from c:
 * checks the header, decodes the body, runs the handler and sends the
 * reply (with the backend's fd, which stays the backend's).  A packet
 * that breaks the protocol, or a refused hello, closes the connection. */
void gshmd_request_handle(struct conn *c, const uint8_t *pkt, size_t len);

#endif
