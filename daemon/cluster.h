/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's cluster side: daemon to daemon (docs/CLUSTER.md); the code is
 * in daemon/cluster/, one job per file (cluster/internal.h).
 *
 * gshmd listens on cluster.listen with its own TCP socket and opens one
 * connection to each configured peer for its own requests; peers prove
 * the cluster key there (the hello), and every frame after it is
 * authenticated (and encrypted with cluster.encrypt).  Control messages
 * (proto/cluster.proto) and, by default, the bytes go on that stream; the
 * bytes go over UCX (RDMA, shared memory) where the hello sets it up.  The
 * UCP worker is driven from the libuv loop through its event fd: nothing
 * busy-polls.
 *
 * The cluster is on when cluster.listen or cluster.peers is set. */
#ifndef GSHMD_CLUSTER_H
#define GSHMD_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "gshm.pb-c.h"

struct gshmd_config;
struct gshmd_registry;
struct gshmd_client;
struct gshmd_cluster;

/* How the cluster answers a local client's deferred request (REMOTE_LIST
 * progress and result, PULL progress and result): the daemon's server
 * sends reply to client c as message type with request_id.  Returns 0 or
 * a negative errno (the cluster ignores it: the client went away). */
typedef int (*gshmd_cluster_reply_fn)(void *arg, struct gshmd_client *c, uint16_t type,
                                      uint32_t request_id, const Gshm__Reply *reply);

/* Starts the cluster when the config asks for it: reads the secret file,
 * creates the UCP context and worker, listens on cluster.listen and
 * connects to the peers.  *cl_out is NULL when the cluster is off.
 * Replies to local requests go out through reply(reply_arg, ...).
 * Errors (logged): -EINVAL bad config (address, peers, secret file mode
 * or length), -EADDRINUSE cluster.listen is taken, -EIO UCX failed,
 * -ENOMEM. */
int gshmd_cluster_start(uv_loop_t *loop, const struct gshmd_config *cfg,
                        struct gshmd_registry *reg, gshmd_cluster_reply_fn reply,
                        void *reply_arg, struct gshmd_cluster **cl_out);

/* --check-config: reads the [cluster] keys as gshmd_cluster_start does
 * (listen and peers addresses, node names, export rules and their users
 * and groups, the secret file's owner, mode and length, pull_group) and
 * logs what is wrong, without starting anything.  Run it as gshmd's
 * user: the secret file must be that user's.  Returns 0 (also when the
 * cluster is off), -EINVAL (logged), -EIO libsodium does not initialise,
 * or -ENOMEM. */
int gshmd_cluster_check_config(const struct gshmd_config *cfg);

/* With the cluster off (neither cluster.listen nor cluster.peers), the
 * first other [cluster] key that is set anyway (it does nothing then),
 * as "cluster.export"; else NULL.  Static storage. */
const char *gshmd_cluster_unused_key(const struct gshmd_config *cfg);
/* What gshmd says of it (a format with one %s: the key), at start and in
 * --check-config. */
#define GSHMD_CLUSTER_UNUSED_KEY_FMT                                                  \
  "%s is set but the cluster is off (no cluster.listen, no cluster.peers): it does nothing"

/* Ends every pull (their partial segments are removed, their requesters
 * get an error), closes every connection and the listener, unregisters
 * every served segment and closes the loop handles; the caller runs the
 * loop once more and then calls gshmd_cluster_destroy.  Accepts NULL. */
void gshmd_cluster_stop(struct gshmd_cluster *cl);

/* Frees the UCP worker and context and cl.  Accepts NULL. */
void gshmd_cluster_destroy(struct gshmd_cluster *cl);

/* From now on the lines each peer's messages make gshmd write (a grant,
 * a link up or gone) are held to that peer's rate in l (loglimit.h:
 * gshmd_loglimit_charge_peer); l (the server's) must outlive cl.
 * Accepts a NULL cl (the cluster off). */
struct gshmd_loglimit;
void gshmd_cluster_loglimit(struct gshmd_cluster *cl, struct gshmd_loglimit *l);

/* ---- local requests (the daemon's request dispatch calls these) ---- */

#define GSHMD_PEERS_WAIT_MS 1000 /* PEERS waits this long at most for peers' counts */
/* PEERS whose count requests are in flight, all clients: one more is
 * answered at once with the counts last known (PEERS needs no right, and
 * each asks every up peer) */
#define GSHMD_PEERS_QUERIES 16
/* Set and single pulls in flight of one user, and remote listings, each
 * (admins: no bound); more are refused busy.  Each holds memory here and
 * a request to a peer until the peer answers (or its link fails). */
#define GSHMD_PULLS_PER_USER 64

/* PEERS for client c: one page of the peers, their state and their
 * exported segments now.  after: the cursor from the request
 * (PeersRequest.after; 0: the first page, with the pulls in flight; peer
 * i of cluster.peers has cursor i + 1; any value is safe: past the last
 * peer, an empty last page).  A page holds as many peers as fit one
 * reply of limits.max_packet (at least one); its next is the cursor for
 * the following page, 0 on the last.  When no peer is up, on a later
 * page (after != 0), or when cl is NULL (the cluster is off: an empty
 * list) it fills reply->cluster_peers (storage in cl, valid until the
 * next call) and sets *deferred_out false; otherwise (the first page) it
 * asks every up peer for its count and the reply goes later through the
 * reply function to c with request_id (at most GSHMD_PEERS_WAIT_MS later:
 * a peer that has not answered by then shows its last known count),
 * *deferred_out true; while GSHMD_PEERS_QUERIES earlier ones still wait
 * for counts, it answers at once with the counts last known.  Returns 0,
 * or -ENOMEM (nothing deferred). */
int gshmd_cluster_handle_peers(struct gshmd_cluster *cl, struct gshmd_client *c,
                               uint32_t request_id, uint64_t after, Gshm__Reply *reply,
                               bool *deferred_out);

/* REMOTE_LIST and PULL take the request: on 0 the reply (for PULL:
 * progress replies, then the result) comes later through the reply
 * function to client c with request_id.  Errors, with
 * *msg_out: -ENOTSUP cluster off, -ENOENT no such peer, -EACCES
 * not in cluster.pull_group nor admin, -EINVAL bad argument, -EBUSY the
 * user (not an admin) has GSHMD_PULLS_PER_USER of that kind in flight,
 * -ENOMEM. */
int gshmd_cluster_handle_remote_list(struct gshmd_cluster *cl, struct gshmd_client *c,
                                     uint32_t request_id, const Gshm__RemoteListRequest *m,
                                     const char **msg_out);
int gshmd_cluster_handle_pull(struct gshmd_cluster *cl, struct gshmd_client *c,
                              uint32_t request_id, const Gshm__PullRequest *m,
                              const char **msg_out);

/* Client c's PULL of request_id fails with -ECANCELED (its requester asked:
 * PULL_CANCEL), leaving nothing, as when c goes away; its error is c's
 * answer to the PULL.  0, or -ENOENT: no pull of c's in flight has that
 * request id (it ended meanwhile), or cl is NULL. */
int gshmd_cluster_pull_cancel(struct gshmd_cluster *cl, struct gshmd_client *c,
                              uint32_t request_id);

/* A local client is going away: its pending remote lists are dropped and
 * its pulls fail (the partial segments are removed).  Accepts cl NULL. */
void gshmd_cluster_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c);

/* Appends the cluster's Prometheus metrics to f.  Accepts cl NULL. */
void gshmd_cluster_metrics(struct gshmd_cluster *cl, FILE *f);

#endif
