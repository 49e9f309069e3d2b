/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by cluster.c (context, endpoints, peers, trust, serving) and
 * pull.c (the reading side of a pull). */
#ifndef GSHMD_CLUSTER_INTERNAL_H
#define GSHMD_CLUSTER_INTERNAL_H

#include <netinet/in.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "cluster.h"
#include "cluster.pb-c.h"
#include "list.h"

#define GSHMD_CLUSTER_AM_ID 0x67      /* control: one Msg per message */
#define GSHMD_CLUSTER_DATA_AM_ID 0x68 /* bytes: struct data_hdr, then the bytes */

/* The header of a data message. */
struct data_hdr {
  uint32_t request_id;      /* of the Read or Stage it answers */
  uint32_t reserved;
  uint64_t offset;          /* in the segment */
};
#define GSHMD_CLUSTER_MAJOR 1
#define GSHMD_CLUSTER_MINOR 0
#define GSHMD_CLUSTER_NONCE 32
#define GSHMD_CLUSTER_MAX_MSG 65536 /* larger control messages are refused */

enum peer_state { PEER_DOWN, PEER_CONNECTING, PEER_UP };
enum link_state {
  LINK_HELLO,   /* outbound: hello sent; inbound: waiting for hello */
  LINK_AUTH,    /* outbound: auth sent; inbound: challenge sent */
  LINK_UP,
  LINK_REFUSED, /* refusal sent; closed by the sweep */
  LINK_CLOSED,  /* endpoint closing; freed when the close completes */
};

/* Counted refusals, for metrics and the once-logging. */
enum refusal {
  REFUSE_PROTOCOL,  /* undecodable, out of order, too large */
  REFUSE_VERSION,
  REFUSE_UNKNOWN_PEER,
  REFUSE_BAD_KEY,
  REFUSE_TIMEOUT,
  REFUSE_LIMIT,
  REFUSE_N,
};

struct link;
struct gshmd_segment;

/* One configured peer node. */
struct peer {
  char name[64];
  char address[136];
  struct sockaddr_storage sa;
  socklen_t salen;
  enum peer_state state;
  struct link *out;          /* our endpoint to it, while connecting or up */
  char why[160];             /* why it is down */
  uint32_t exported;
  int64_t retry_ns;          /* CLOCK_MONOTONIC: next connect attempt */
  struct gshm_list waiting;  /* struct op: sent when the link is up */
  /* metrics */
  uint64_t pulls_ok, pulls_failed, bytes_host, bytes_staged, bytes_direct;
};

/* An answer to one of our requests, or the link's failure (m NULL). */
struct op;
typedef void (*op_done_fn)(struct op *op, int err, const char *msg,
                           const Gshm__Cluster__Msg *m);

/* A request to a peer: queued until the link is up, then sent, then
 * answered (or failed with the link).  Owned by whoever made it; the
 * done callback runs once, after which the op is off every list. */
struct op {
  struct gshm_list node;     /* peer->waiting or link->ops */
  struct peer *peer;
  uint32_t request_id;
  Gshm__Cluster__Msg *msg;   /* what to send (owned by the maker) */
  op_done_fn done;
  /* Read and Stage: the bytes of the answer (data is UCX's: copy it, or
   * start ucp_am_recv_data_nbx on it when param says RNDV, before
   * returning).  The op is off every list when it is called. */
  void (*on_data)(struct op *op, void *data, size_t len, const ucp_am_recv_param_t *param);
  void *arg;
  bool queued;               /* on a list */
  bool sent;                 /* on the link: only the answer or the link's end completes it */
};

/* One UCP endpoint, either direction. */
struct link {
  struct gshmd_cluster *cl;
  ucp_ep_h ep;
  bool inbound;
  enum link_state state;
  struct peer *peer;         /* outbound: from the start; inbound: after hello */
  uint8_t nonce_mine[GSHMD_CLUSTER_NONCE], nonce_theirs[GSHMD_CLUSTER_NONCE];
  char remote[64];           /* "ADDRESS:PORT" as seen */
  int64_t since_ns;          /* CLOCK_MONOTONIC */
  struct gshmd_client *serve_client; /* inbound, up: holds the serving leases */
  struct gshm_list ops;      /* outbound: sent, awaiting answers */
  struct gshm_list pulls;    /* struct pull.link_node using this link */
  struct gshm_list node;     /* cl->links */
  uint32_t next_request;
  unsigned busy;             /* inbound: staging copies and data sends running; the
                                link's leases and buffers wait for them */
  struct gshm_list staged;   /* inbound: struct stage_grant (stage.c) */
  void *close_req;           /* ucp_ep_close_nbx's request while closing */
};

struct gshmd_cluster {
  uv_loop_t *loop;
  const struct gshmd_config *cfg;
  struct gshmd_registry *reg;
  struct gshmd_server *srv;
  char node_name[64];
  uint8_t key[crypto_auth_KEYBYTES];
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_listener_h listener;
  int efd;
  uv_poll_t poll;
  uv_idle_t idle;
  uv_timer_t sweep;
  bool handles_on, idle_on, stopping;
  bool cuda_memory;          /* UCX registers CUDA memory (UCS_MEMORY_TYPE_CUDA) */
  bool listen_pending;       /* cluster.listen could not be bound yet: retried by the sweep */
  struct peer *peers;
  unsigned npeers;
  struct gshm_list links;
  unsigned ninbound_pending; /* inbound links not yet up */
  struct gshm_list pulls;    /* struct pull.node */
  struct gshm_list lists;    /* struct remote_list.node */
  struct gshm_list closing;  /* links whose endpoint is closing */
  bool have_pull_gid;
  gid_t pull_gid;
  char **export_patterns;
  unsigned nexport;
  /* metrics */
  uint64_t refusals[REFUSE_N];
  uint64_t served_grants, served_bytes_staged;
  struct stage_buf *stage_pool[4]; /* stage.c: free staging buffers, kept for the next pull */
  unsigned nstage_pool;
  uint64_t registrations;    /* segments registered with UCX, ever */
  uint32_t registered;       /* registered now */
  uint64_t pull_errors[8];   /* by cause: see gshmd__pull_error_cause */
  /* PEERS reply storage */
  Gshm__ClusterPeerList peer_list;
  Gshm__ClusterPeer *peer_infos;
  Gshm__ClusterPeer **peer_ptrs;
  char (*peer_state_buf)[16];
};

/* ---- cluster.c, for pull.c ---- */

/* Queues op for peer (sends at once when its link is up; connects when
 * it is down).  The op's msg request_id is set here.  Returns 0 or
 * -ENOMEM. */
int gshmd__cluster_op_submit(struct gshmd_cluster *cl, struct peer *p, struct op *op);
/* Withdraws an op that has not been sent yet; its done is then never
 * called.  Returns true when the op is not pending (withdrawn or already
 * completed), false when it was sent and its done is still to come. */
bool gshmd__cluster_op_cancel(struct op *op);
/* Sends a message on a link that is up (fire and forget).  Returns 0 or
 * a negative errno. */
int gshmd__cluster_send(struct link *l, const Gshm__Cluster__Msg *m);
/* Makes sure the worker is progressed soon (after posting operations
 * outside a UCX callback). */
void gshmd__cluster_kick(struct gshmd_cluster *cl);
struct peer *gshmd__cluster_peer(struct gshmd_cluster *cl, const char *name);
/* Sends op on link l, which is up (an op of a running pull: never queued
 * for a new endpoint).  Its done reports a failure. */
void gshmd__cluster_op_send(struct link *l, struct op *op);
/* Sends the bytes [src, src + len) answering request rid on l (data
 * message; memh: their registration, or NULL).  l->busy counts the send
 * until it completes; then done(arg, status) runs.  Returns 0 or a
 * negative errno (done not called). */
int gshmd__cluster_send_data(struct link *l, uint32_t rid, uint64_t offset, const void *src,
                             uint64_t len, ucp_mem_h memh, void (*done)(void *arg, ucs_status_t st),
                             void *arg);
/* A busy link's count went down: when it reaches 0 on a failed link, its
 * cleanup happens. */
void gshmd__cluster_link_unbusy(struct gshmd_cluster *cl, struct link *l);
/* A host segment's read-only mapping in gshmd (made with its UCX
 * registration, kept until the segment is freed).  Errors: -ENOMEM, -EIO. */
int gshmd__cluster_host_map(struct gshmd_cluster *cl, struct gshmd_segment *seg,
                            uint8_t **map_out);
/* Ends a grant's lease (stage.c, after copies that outlived a Release). */
void gshmd__cluster_grant_close(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id);
/* The last staging copy of a failed link finished: its leases and
 * staging buffers go now. */
void gshmd__cluster_link_idle(struct gshmd_cluster *cl, struct link *l);
/* gshm.Status number <-> negative errno, as the local protocol. */
int gshmd__cluster_status_errno(uint32_t status);

/* ---- pull.c ---- */

/* Starts a pull for local client c (see gshmd_cluster_handle_pull). */
int gshmd__pull_start(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                      const Gshm__PullRequest *m, const char **msg_out);
/* The link under running pulls failed: they fail. */
void gshmd__pull_link_lost(struct gshmd_cluster *cl, struct link *l);
/* Pulls of client c fail (it went away). */
void gshmd__pull_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c);
/* Finishes pulls that are done or failed and have nothing in flight (run
 * outside UCX callbacks). */
void gshmd__pull_reap(struct gshmd_cluster *cl);
/* The metrics label of a failed pull's errno, and its index in
 * cl->pull_errors (< 8). */
const char *gshmd__pull_error_cause(int err, unsigned *index_out);
/* Every pull fails at once (shutdown); in-flight gets are cancelled. */
void gshmd__pull_stop_all(struct gshmd_cluster *cl);

#endif
