/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of daemon/cluster/ above the link layer share: the
 * cluster's state and each file's entry points.  Arrows point down:
 * cluster.c (front door) -> hello.c -> serve.c -> link.c, stage.c;
 * cluster.c -> peers.c, pullset.c -> pull.c (pull.h) -> link.c, stage.c;
 * serve.c, serve_list.c, pull.c, pullset.c -> relay.c (relay.h: serving
 * what is still being pulled), which serves parked reads again through
 * cl->serve_again (set by cluster.c), not by calling serve.c; hello.c ->
 * lane.c (lane.h) -> link.c; conf.c stands alone (pull.c and cluster.c
 * word peers' errors with it).  The link layer calls
 * up only through struct link_hooks, which cluster.c fills. */
#ifndef GSHMD_CLUSTER_INTERNAL_H
#define GSHMD_CLUSTER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "cluster.h"
#include "errors.h"
#include "link.h"
#include "stage.h"
#include "subkeys.h"

struct gshmd_segment;

#define GSHMD_PULLS_SHOWN 64 /* pulls in flight that PEERS lists at most (its first page) */
#define GSHMD_LIST_PAGE_SEGMENTS 256 /* segments in one list answer at most */

/* One rule of cluster.export: segments whose name matches pattern, of
 * the owners it names, that their mode lets peers read
 * (gshmd__serve_exported). */
struct export_rule {
  char *pattern;  /* fnmatch */
  enum {
    EXPORT_ADMINS,  /* PATTERN: owned by root or the user that started gshmd, mode o+r */
    EXPORT_USER,    /* PATTERN:USER: owned by uid id, mode o+r */
    EXPORT_GROUP,   /* PATTERN:@GROUP: of group id, mode g+r */
  } owner;
  uint32_t id;    /* uid or gid */
};

struct gshmd_cluster {
  struct links ll;
  struct stage_pool stage;
  uv_loop_t *loop;
  const struct gshmd_config *cfg;
  struct gshmd_registry *reg;
  gshmd_cluster_reply_fn reply; /* to local clients (the daemon's server) */
  void *reply_arg;
  struct gshmd_loglimit *loglimit; /* the server's: peers' lines charged to them (NULL: none) */
  struct subkeys keys;       /* the cluster key and its subkeys (subkeys.h) */
  uid_t started_uid;         /* gshmd's euid at gshmd_cluster_start, before any switch to
                                daemon.user: whose segments PATTERN rules export with root's */
  struct gshm_list pulls;    /* struct pull_set.node */
  struct gshm_list lists;    /* struct remote_list.node */
  struct gshm_list peer_queries; /* struct peers_query.node (peers.c) */
  struct gshm_list relays;   /* relay.c: segments pulled here that peers may read meanwhile */
  void *relay_names;         /* relay.c: the same by name (relay_names.h) */
  /* gshmd__serve_handle, set by cluster.c: relay.c serves a parked
   * request again through it (relay.c sits below serve.c) */
  bool (*serve_again)(struct gshmd_cluster *cl, struct link *l, const Gshm__Cluster__Msg *m);
  struct gshm_list relay_lists; /* relay.c: Lists waiting for a set's listing */
  int64_t relay_expiry_ns;   /* relay.c: when the first parked read's wait ends (0: none) */
  uint64_t relay_landed;     /* relay.c: bytes of relayed segments landed here, ever */
  uint64_t list_pages;       /* pages of peers' lists this node's sets took, ever (with
                                relay_landed: the progress of a relay's busy answers) */
  uint64_t next_set_seq;     /* struct pull_set.seq */
  /* serve_list.c: the segments peers may see, counted at reg->changes
   * == exported_at (+1: exported_at is that plus one; 0: never) */
  unsigned exported;
  uint64_t exported_at;
  unsigned pull_maps_ahead;  /* landing mappings made at listings (pull.h PULL_MAPS_AHEAD) */
  /* pullset.c: listed segments made a few a loop turn (pull.h) */
  uv_idle_t create_idle;
  bool create_idle_init, create_idle_on;
  /* prefault.c: pulls whose new host pages are faulted in ahead of their lanes */
  struct gshm_list prefaults; /* struct pull.pf_node, oldest first */
  unsigned pf_jobs;           /* prefault.c jobs on libuv's pool now: pieces (no more start
                                 past PREFAULT_JOBS) and pulls' pages built again */
  uint64_t pf_ahead;          /* bytes faulted in past the chunks asked for (at most
                                 PREFAULT_AHEAD) */
  bool pf_on;                 /* cluster.prefault, until the kernel says it has no such madvise */
  bool grants_held_back;      /* a set found a peer's LINK_MAX_GRANTS held (grants.c):
                                 gshmd__pull_reap asks again after its pass */
  bool pf_build;              /* gshmd_backend_host_collapse: pulls build their 2 MiB pages
                                 (prefault pieces and the lanes, before the bytes) */
  uint64_t pf_bytes;          /* faulted in, ever (metrics) */
  /* pull.c: pinned staging bytes counted for pulls into GPUs (at most
   * PULL_PINNED_FULL staging_bytes but for one), and their high water */
  uint64_t pull_pinned, pull_pinned_max;
  /* grants.c: bytes of new host segments pulls in flight made and have
   * not landed yet */
  uint64_t pull_host_owed;
  bool have_pull_gid;
  gid_t pull_gid;
  char pull_refused[160];      /* what a non-member is told (the group named) */
  char reply_msg[320];         /* a refusal naming a segment, until its reply is sent */
  struct export_rule *exports; /* cluster.export */
  unsigned nexport;
  /* metrics */
  uint64_t served_grants;
  uint64_t relay_waits;      /* reads parked by relay.c, ever */
  uint64_t relay_busy;       /* ... of them answered busy after half the request timeout */
  uint64_t registrations;    /* segments registered with UCX, ever */
  uint32_t registered;       /* registered now */
  /* host segments' serving mappings that no grant uses now, oldest
   * first (serve.c: kept so that the next grant finds its pages mapped) */
  struct gshm_list serve_idle;
  uint64_t serve_idle_bytes;
  unsigned serve_idle_count;
  uint64_t pull_errors[GSHM_PULL_FAIL_N]; /* by cause (common/errors.h) */
  /* PEERS reply storage */
  Gshm__ClusterPeerList peer_list;
  Gshm__ClusterPeer *peer_infos;
  Gshm__ClusterPeer **peer_ptrs;
  Gshm__ClusterPull pull_infos[GSHMD_PULLS_SHOWN];
  Gshm__ClusterPull *pull_ptrs[GSHMD_PULLS_SHOWN];
};

static inline struct gshmd_cluster *cluster_of(struct links *ll) {
  return (struct gshmd_cluster *)((char *)ll - offsetof(struct gshmd_cluster, ll));
}

/* ---- conf.c: the [cluster] keys ---- */

/* "HOST:PORT" or "[V6]:PORT" to a socket address.  Returns 0, or -EINVAL
 * with *why_out (static text) saying what is wrong with s. */
int gshmd__cluster_parse_address(const char *s, struct sockaddr_storage *sa, socklen_t *len,
                                 const char **why_out);
/* cluster.peers into ll->peers; cluster.export into cl's patterns; the
 * key from cluster.secret_file; cluster.pull_group.  Errors (logged):
 * -EINVAL, -ENOMEM. */
int gshmd__cluster_conf(struct gshmd_cluster *cl);
/* At start: whether cluster.listen is free to listen on.  Returns 0 (also
 * for errors the listener itself reports, such as an address this host
 * does not have yet), or -EADDRINUSE (logged): something listens there. */
int gshmd__cluster_listen_check(const struct links *ll);
#define GSHMD_PEER_ERROR_LEN 320
/* The message for a local client whose request req to a peer failed
 * with err: "peer 'NAME': WHY" when the peer answered m with an error,
 * else "peer 'NAME' (ADDRESS): WHY", with "unreachable" (the link did not
 * come up) or "lost" (the request was sent) before the colon when err
 * says the connection failed.  Written into buf (size bytes, at least
 * GSHMD_PEER_ERROR_LEN); returns buf. */
char *gshmd__peer_error(const struct peer_req *req, int err, const Gshm__Cluster__Msg *m,
                        const char *why, char *buf, size_t size);
/* A node name: 1 to 63 bytes of UTF-8, no blanks, control characters
 * (C0, C1, invisible or bidi ones), commas, colons, quotes or
 * backslashes, and not "?" (relay_path.h; conf.c says why). */
bool gshmd__cluster_name_ok(const char *s);
#define GSHMD_CLUSTER_NAME_RULE                                                                  \
  "1 to 63 bytes of UTF-8, no blanks, control bytes or characters, commas, colons, quotes or "   \
  "backslashes, not '?'"

/* ---- hello.c: the authenticated hello ---- */

/* Outbound link l has its endpoint: sends the Hello. */
void gshmd__hello_begin(struct link *l);
/* A hello step (Hello, Challenge, Auth, AuthOk) on a link that is not up
 * yet.  Returns false when m is not the step the link waits for. */
bool gshmd__hello_handle(struct gshmd_cluster *cl, struct link *l, const Gshm__Cluster__Msg *m);

/* ---- serve.c: what peers read from this node ---- */

/* Whether peers may see and read seg: not unlinked, and a rule of
 * cluster.export allows its name, its owner and its mode. */
bool gshmd__serve_exported(const struct gshmd_cluster *cl, const struct gshmd_segment *seg);
/* Segments peers may see now (counted again only after the registry
 * changed: reg->changes). */
unsigned gshmd__serve_count(struct gshmd_cluster *cl);
/* seg as peers see it (strings point into seg). */
void gshmd__serve_segment_to_wire(const struct gshmd_segment *seg, Gshm__Cluster__Segment *s);
/* serve_list.c: answers a peer's List on its link l (request rid): a
 * page of exported segments, or later (parked by relay.c while a set of
 * this node is still listing). */
void gshmd__serve_list(struct link *l, uint32_t rid, const Gshm__Cluster__ListRequest *req);
/* Inbound link l proved the key: the internal client "peer:NAME" that
 * will hold its leases.  Errors: -ENOMEM. */
int gshmd__serve_link_up(struct gshmd_cluster *cl, struct link *l);
/* A request from a peer on its up inbound link.  Returns false when m is
 * not a request. */
bool gshmd__serve_handle(struct gshmd_cluster *cl, struct link *l, const Gshm__Cluster__Msg *m);
/* A failed link has nothing in flight: its grants and leases end. */
void gshmd__serve_link_idle(struct gshmd_cluster *cl, struct link *l);
/* l failed: the staging buffers its grants wait for are not made if
 * not started yet (the grants end once l is idle). */
void gshmd__serve_link_lost(struct gshmd_cluster *cl, struct link *l);
/* Registry hook: a segment's memory is about to be freed. */
void gshmd__serve_segment_free(struct gshmd_registry *r, struct gshmd_segment *seg);
/* Drops every registration (cluster stop). */
void gshmd__serve_stop(struct gshmd_cluster *cl);

/* ---- peers.c: the PEERS request ---- */

/* Client c went away: its PEERS answers are dropped. */
void gshmd__peers_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c);
/* Cluster stop: every PEERS query is answered now and its timer closed
 * (freed in the loop turn that follows). */
void gshmd__peers_stop(struct gshmd_cluster *cl);

/* ---- pull.c, pullset.c: what this node reads from peers ---- */

/* Starts a pull for local client c (see gshmd_cluster_handle_pull). */
int gshmd__pull_start(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                      const Gshm__PullRequest *m, const char **msg_out);
/* The link under running pulls failed with err and why (gshmd__link_fail's):
 * they fail, with -ETIMEDOUT or -EPROTO where err is that, else
 * -ECONNRESET (a lost peer), and a message that says why. */
void gshmd__pull_link_lost(struct gshmd_cluster *cl, struct link *l, int err, const char *why);
/* Fails c's pulls in flight (-ECANCELED): every one, c gone (request_id
 * NULL: none is answered), or the one of *request_id, answered with the
 * error once it has let go of what it holds.  0, or -ENOENT: none. */
int gshmd__pull_cancel(struct gshmd_cluster *cl, struct gshmd_client *c, const uint32_t *request_id);
/* Finishes pulls that are done or failed and have nothing in flight (run
 * outside UCX callbacks). */
void gshmd__pull_reap(struct gshmd_cluster *cl);
/* Makes the hidden segments of a set's listed items a few a loop turn
 * (pull.h create_listed) until none is left, from cl->create_idle (made
 * on first use, closed by gshmd__pull_create_stop as gshmd stops). */
void gshmd__pull_create_start(struct gshmd_cluster *cl);
void gshmd__pull_create_stop(struct gshmd_cluster *cl);
/* Every pull fails at once (shutdown); in-flight gets are cancelled. */
void gshmd__pull_stop_all(struct gshmd_cluster *cl);
/* As gshmd stops, after the last reap: the sets still there (waiting
 * for their prefault pieces, which end them as they end, after the
 * server closed every connection) answer their requesters now. */
void gshmd__pull_stop_answer(struct gshmd_cluster *cl);
/* Describes up to max pulls in flight (sets count once) that viewer may
 * see (its own uid's; every one for an admin) into out; the strings
 * point into the pulls (valid until the loop runs again).  Returns how
 * many; *seen_out: how many viewer may see in all. */
size_t gshmd__pull_describe(struct gshmd_cluster *cl, const struct gshmd_client *viewer,
                            Gshm__ClusterPull *out, size_t max, uint32_t *seen_out);

/* The gauges of pinned slots held by pulls into GPUs (Prometheus text)
 * to f (grants.c). */
void gshmd__pull_pinned_metrics(const struct gshmd_cluster *cl, FILE *f);

/* Sets cl->pf_on (cluster.prefault: always, or auto where host, the
 * host backend, makes pulls in 2 MiB pages) and cl->pf_build (host builds
 * them: gshmd_backend_host_collapse).  cl->cfg set.  Loop only. */
void gshmd__prefault_init(struct gshmd_cluster *cl, const struct gshmd_backend *host);

#endif
