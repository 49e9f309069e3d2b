/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster's link layer: the configured peers, the connections to and
 * from them on the cluster port (links: gshm's own framed TCP streams,
 * stream.h), the requests this node sends to peers (queued until the link
 * is up, matched with their answers), data frames, the UCP worker on the
 * libuv loop, and the sweep (hello and request timeouts, reconnects).  It knows nothing of what the messages mean: everything
 * above it (the hello, serving, pulls) is reached through struct
 * link_hooks, as libuv reaches its handles through their callbacks. */
#ifndef GSHMD_CLUSTER_LINK_H
#define GSHMD_CLUSTER_LINK_H

#include <netinet/in.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "cluster.pb-c.h"
#include "list.h"
#include "stream.h"

#define GSHMD_CLUSTER_MAJOR 2
#define GSHMD_CLUSTER_MINOR 6
#define GSHMD_CLUSTER_NONCE 32
#define GSHMD_CLUSTER_MAX_MSG STREAM_CTRL_MAX /* larger control messages are refused */

/* Bounds on what peers, and hosts that are not peers yet, can make this
 * node hold. */
#define LINK_MAX_PENDING 64      /* inbound connections in their hello, in all (but from
                                    peers' addresses: admit.c) */
#define LINK_MAX_PENDING_ADDR 4  /* ... from one source address */
#define LINK_MAX_PER_PEER 4      /* inbound links of one peer that passed the hello; and
                                    failed outbound links to it that linger (UCX receives) */
#define LINK_MAX_LANES 16        /* data lanes of one link (lane.h) */
#define LINK_MAX_READS 64        /* Reads and Stages in flight per link: the serving side
                                    refuses more as busy (serve.c) */
#define LINK_MAX_GRANTS 64       /* grants live at once per link: the serving side refuses more
                                    as busy (serve.c), and a puller asks no more of one peer at
                                    once over all its sets (grants.c) */
#define LINK_MAX_READ_BYTES (64ull << 20)      /* the largest Read (or Stage) a peer may ask */
#define LINK_MAX_BYTES_INFLIGHT (256ull << 20) /* bytes of Reads and Stages in flight per link:
                                                  with encryption each holds a ciphertext
                                                  buffer of its length until written */
#define PEER_BYTES_BUDGET (192ull << 20)       /* ... and a puller keeps at most this many to
                                                  one peer over all its pulls (pull.c) */
#define PEER_READ_BUDGET 48      /* ... and a puller keeps at most this many in flight to one
                                    peer over all its pulls (pull.c): the serving side counts a
                                    read until its send completes, which it may hear of after
                                    the bytes arrived and the next Read did */
#define LINK_LANE_TOKEN 16       /* bytes of a link's lane token */
#define LINK_MAX_FDS 256         /* cluster connections in all, at least (link.c conn_budget) */
#define LINK_HELLO_NS 3000000000LL     /* an inbound hello not done by then is closed */
/* cluster.request_timeout_ms (links.request_timeout_ns, 60 s by default)
 * bounds a request left unanswered (counted from when every older
 * request's answer has begun: reqwait.c), a data lane stopped midway or
 * not read (lane.h), and a peer that does not read its answers. */

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
  REFUSE_TAMPERED,  /* a frame failed its authentication after the hello */
  REFUSE_N,
};

struct link;
struct links;

/* One configured peer node. */
struct peer {
  char name[64];
  char address[136];
  struct sockaddr_storage sa;
  socklen_t salen;
  enum peer_state state;
  struct link *out;          /* our endpoint to it, while connecting or up */
  char why[160];             /* why it is down */
  char protocol[24];         /* PEERS: "MAJOR.MINOR" of its up link (peers.c) */
  uint32_t exported;
  int64_t retry_ns;          /* CLOCK_MONOTONIC: next connect attempt */
  struct gshm_list waiting;  /* struct peer_req: sent when the link is up */
  unsigned lanes_connecting;  /* our lanes to it in their hello (lane.h) */
  unsigned reads_inflight;    /* our Reads and Stages to it not yet ended (pull.c) */
  unsigned grants_out;        /* our grants asked of it or held, all sets (grants.c) */
  uint64_t bytes_inflight;    /* ... and their bytes */
  /* metrics */
  uint64_t pulls_ok, pulls_failed, bytes_host, bytes_staged, bytes_direct;
  uint64_t passed_over;       /* segments of sets with several sources it did not grant */
  uint64_t not_exported;      /* its grant requests of names this node does not export */
};

/* What keeps a request's destination valid after the request ended:
 * taken (peer_req.data_hold) when a UCX rendezvous receive into it
 * begins, put back (gshmd__data_hold_put) when UCX ends that receive,
 * however late: its link may have failed, and the request ended, long
 * before (data.c).  Whoever made it sets refs and release; the last put
 * runs release. */
struct data_hold {
  unsigned refs;
  void (*release)(struct data_hold *h);
};

static inline void gshmd__data_hold_put(struct data_hold *h) {
  if (h && --h->refs == 0)
    h->release(h);
}

/* An answer to one of our requests, or the link's failure (m NULL). */
struct peer_req;
typedef void (*peer_req_done_fn)(struct peer_req *req, int err, const char *msg,
                                 const Gshm__Cluster__Msg *m);

/* A request this node sends to a peer: queued until the link is up, then
 * sent, then answered (or failed with the link).  Owned by whoever made
 * it; done runs once, after which the request is off every list. */
struct peer_req {
  struct gshm_list node;     /* peer->waiting or link->reqs */
  struct peer *peer;
  uint32_t request_id;
  Gshm__Cluster__Msg *msg;   /* what to send (owned by the maker) */
  peer_req_done_fn done;
  /* Read and Stage: where the len bytes of the answer at offset go (NULL:
   * they are refused; the link fails).  The request is off every list
   * when it is called; data_done follows once, when the bytes are in
   * place and verified (err 0) or not. */
  void *(*data_dest)(struct peer_req *req, uint64_t offset, uint64_t len);
  void (*data_done)(struct peer_req *req, int err);
  /* Read and Stage over UCX: a reference (refs taken for the caller) to
   * what keeps data_dest's memory valid, taken when a rendezvous
   * receive into it begins and put when UCX ends it, or NULL (no
   * memory: the bytes are refused) */
  struct data_hold *(*data_hold)(struct peer_req *req);
  /* Read and Stage: the offset and length the answer's bytes must have
   * (data_dest(req, data_offset, data_len) is where they go); a link
   * without UCX lists the request in its landings when it sends it, so
   * that a lane's thread finds where they go without the loop */
  uint64_t data_offset, data_len;
  /* Read into new host memory whose 2 MiB pages gshmd builds itself
   * (gshmd_backend_host_collapse): the 2 MiB pages the answer's bytes
   * fall in, from data_dest's start plus build_off (as int64_t: the
   * first page may begin before it), build_len bytes (0: none), built by
   * the lane thread that claims the answer before its bytes land
   * (gshmd_host_collapse, host_memory.h), through build_fd (not taken:
   * the memory's memfd, valid while the bytes may land) at file offset
   * build_foff; build_left: that thread's gshmd_host_collapse failed (a
   * page left in 4 KiB pages), written by it before data_done */
  uint64_t build_off, build_len, build_foff;
  int build_fd;
  bool build_left;
  struct landings *landing;  /* the table listing it (data.c), or NULL */
  void *arg;
  int64_t sent_ns;           /* CLOCK_MONOTONIC, when sent */
  uint64_t progress;         /* a busy refusal's Msg.progress (relay.h), else 0 */
  bool queued;               /* on a list */
  bool sent;                 /* on the link: only the answer or the link's end completes it */
  bool answered;             /* done was called with the peer's answer (an error status
                                included: its m is NULL then), not the link's end */
};

/* One connection on the cluster port, either direction. */
struct link {
  struct links *ll;
  struct stream st;          /* the TCP connection; freed with the link */
  uv_connect_t connect;
  bool inbound;
  bool pending;              /* inbound, in its hello: until its AuthOk or its end
                                (gshmd__link_hello_passed, gshmd__link_pending_end;
                                admit.c counts them) */
  bool from_peer;            /* inbound from an address of cluster.peers (admit.c) */
  bool stranger;             /* inbound from another address, its hello not passed: its
                                connection is held beside the fd budget (admit.c) */
  enum link_state state;
  struct peer *peer;         /* outbound: from the start; inbound: after hello */
  uint8_t nonce_mine[GSHMD_CLUSTER_NONCE], nonce_theirs[GSHMD_CLUSTER_NONCE];
  char remote[64];           /* "ADDRESS:PORT" as seen */
  struct sockaddr_storage remote_sa;
  int64_t since_ns;          /* CLOCK_MONOTONIC */
  int64_t active_ns;         /* CLOCK_MONOTONIC: the last frame received or sent */
  uint32_t caps_theirs;      /* the hello's capabilities (hello.c) */
  uint32_t major_theirs, minor_theirs; /* the protocol its hello announced (hello.c) */
  bool subkeys;              /* the hello's MACs and keys come from the subkeys (hello.c) */
  struct gshm_list reqs;     /* outbound: sent, awaiting answers */
  uint32_t wait_rid;         /* outbound: the oldest request whose answer has not begun,
                                as the sweep last saw it (reqwait.c) ... */
  int64_t wait_since_ns;     /* ... since when it is (CLOCK_MONOTONIC), and the look */
  int64_t wait_checked_ns;
  struct gshm_list node;     /* ll->links */
  uint32_t next_request;
  unsigned busy;             /* inbound: staging copies and data sends running; the
                                link's serving state waits for them; outbound: its
                                receives over UCX (ucx_recvs) */
  unsigned stage_waits;      /* inbound: of them, staged grants waiting for their buffer
                                (serve.c: not reads, for the read caps) */
  uint64_t bytes_busy;       /* inbound: bytes of the Reads and Stages among them */
  bool stream_closed;        /* the stream is closed: freed when busy is 0 */
  /* UCX for the bytes (data.c), decided after the hello (hello.c) */
  bool ucx;                  /* outbound: the peer sends our Reads' bytes over UCX */
  bool ucx_offered;          /* outbound: UcxOffer sent, UcxAnswer awaited */
  bool ucx_offer_seen;        /* inbound: the peer's UcxOffer came (one a link; more refuse it) */
  uint64_t ucx_token;        /* marks this link's UCX data messages */
  ucp_ep_h ucx_ep;           /* inbound: to the peer's worker, from its UcxOffer */
  bool ucx_eager;            /* inbound: ucx_ep cannot tell a dead peer: no rendezvous */
  struct gshm_list ucx_sends; /* inbound: data sends UCX has not completed */
  struct gshm_list ucx_recvs; /* outbound: rendezvous receives UCX has not completed */
  /* owned by the layers above (serve.c, pull.c) */
  struct gshmd_client *serve_client; /* inbound, up: holds the serving leases */
  struct gshm_list grants;   /* inbound: struct serve_grant */
  unsigned parked;           /* inbound: requests parked by relay.c ... */
  struct gshm_list parked_waits; /* ... its struct relay_wait (made by relay.c when parked
                                    goes from 0: what link_gone drops) */
  struct gshm_list pulls;    /* outbound: struct pull.link_node using this link */
  /* data lanes (lane.h) */
  bool is_lane;              /* this connection is a data lane of lane_of */
  struct link *lane_of;      /* a lane: its link (NULL once that link failed) */
  struct lane *lane;         /* a lane after its hello: its thread's state */
  uint8_t lane_token[LINK_LANE_TOKEN]; /* a link: from its session key (hello.c); an inbound
                                          lane in its hello: the token its Hello named */
  struct landings *landings; /* outbound without UCX: its Reads and Stages whose bytes may
                                come on a lane (data.c); NULL until the first */
  struct link *lanes[LINK_MAX_LANES];  /* a link: its lanes that are up */
  unsigned nlanes;
  unsigned lane_failures;    /* outbound link: lanes that failed in their hello */
};

/* What the link layer calls above it (on the loop thread).  A hook may
 * send and fail links; the link layer frees a link itself. */
struct link_hooks {
  /* A new outbound endpoint to l->peer: say hello. */
  void (*on_connect)(struct link *l);
  /* A control message that is not an answer to one of our requests
   * (hello steps before the link is up, requests after). */
  void (*on_message)(struct link *l, Gshm__Cluster__Msg *m);
  /* l failed (was up or not) with err and why (gshmd__link_fail's): what
   * runs on it fails. */
  void (*on_lost)(struct link *l, int err, const char *why);
  /* A failed link has nothing in flight any more: its serving state goes. */
  void (*on_idle)(struct link *l);
  /* Data frames on l's stream (data.c): where a frame's bytes go, and
   * their end (stream.h's data_dest and data_done). */
  void *(*data_dest)(struct link *l, uint32_t rid, uint64_t offset, uint64_t len, void **tok_out);
  void (*data_done)(struct link *l, void *tok, int err);
  /* Data lanes (lane.c, above this layer): an outbound link came up (its
   * puller opens its lanes); l fails, was its state (its lanes stop; a
   * lane leaves its link); why lane l is overdue at now (bytes queued
   * without progress, or a frame stopped midway, for request_timeout_ns),
   * or NULL: the sweep then fails l's link with -ETIMEDOUT and that
   * reason.  Each may be NULL (no lanes). */
  void (*on_up)(struct link *l);
  void (*on_fail)(struct link *l, enum link_state was);
  const char *(*lane_overdue)(const struct link *l, int64_t now);
  /* After each batch of worker progress, outside UCX callbacks. */
  void (*after_progress)(void *arg);
  /* What l sent is being handled (on), or no more: the lines logged
   * meanwhile are the doing of its peer where l is inbound and its hello
   * named one (held to the peer's rate: cluster.c). */
  void (*charge)(void *arg, const struct link *l, bool on);
  void *arg;
};

/* The link layer's state (one per gshmd, in struct gshmd_cluster). */
struct links {
  uv_loop_t *loop;
  struct link_hooks hooks;
  char node_name[64];
  ucp_context_h ctx;
  ucp_worker_h worker;
  int efd;
  uv_tcp_t *listener;        /* cluster.listen: the one TCP port gshmd listens on */
  uv_poll_t poll;
  uv_idle_t idle;
  uv_timer_t sweep;
  bool handles_on, idle_on, stopping;
  bool worker_handles;       /* poll and idle are open */
  bool ucx_allowed;          /* cluster.transport auto or ucx, and encryption off; false:
                                no UCP context or worker (ctx, worker NULL) */
  bool ucx_without_peer_errors; /* cluster.transport = ucx: also endpoints that cannot
                                   tell a dead peer */
  char ucx_tls[256];         /* UCX_TLS as gshmd set it */
  ucp_ep_h *ep_closing;      /* endpoints to close outside UCX callbacks, then their requests */
  void **ep_close_reqs;
  unsigned nep_closing, nep_close_reqs;
  ucp_datatype_t send_dt;    /* data.c: how UCX packs a send on an eager endpoint */
  bool send_dt_made;
  void *abandoned;           /* data.c: sends UCX had not ended at exit (first word: next) */
  void *abandoned_recvs;     /* data.c: ... and receives (first word: next) */
  bool encrypt;              /* cluster.encrypt */
  bool gmac;                 /* cluster.mac = auto: AES-GMAC where both nodes have AES-NI */
  uint32_t caps_required;    /* cluster.min_protocol: CAP_* bits a peer's hello must have
                                (hello.c refuses it before any MAC otherwise) */
  unsigned nconns;           /* links with a socket (the fd budget) */
  unsigned max_conns;
  bool cuda_memory;          /* UCX registers CUDA memory (UCS_MEMORY_TYPE_CUDA) */
  const char *listen;        /* cluster.listen, "" or NULL: none */
  struct sockaddr_storage listen_sa; /* cluster.listen parsed */
  socklen_t listen_salen;
  bool listen_pending;       /* cluster.listen could not be bound yet: retried by the sweep */
  int64_t hello_timeout_ns;  /* a hello not done by then is dropped */
  int64_t request_timeout_ns; /* cluster.request_timeout_ms (reqwait.c) */
  struct peer *peers;
  unsigned npeers;
  struct gshm_list links;
  uint64_t refusals[REFUSE_N];
  unsigned streams;          /* cluster.streams: lanes a puller opens per link */
  struct lane_queue *lanes_q; /* lane.c: the threads' events for the loop */
};

/* Inbound l is no longer in its hello: its AuthOk went, or it ends
 * (admit.c counts the links in their hello by this flag, never by their
 * state: a link refused once up is LINK_REFUSED too). */
static inline void gshmd__link_pending_end(struct link *l) { l->pending = false; }
/* Inbound l passed its hello (its AuthOk goes): no longer pending, and
 * its connection counts in the fd budget whatever its address (a key
 * holder's). */
static inline void gshmd__link_hello_passed(struct link *l) {
  l->pending = false;
  l->stranger = false;
}

/* admit.c: why inbound l, just accepted (ll->links holds it, pending),
 * may not go into its hello (gshmd stopping; from a peer's address: the
 * cluster's fd budget spent by the peers' own connections and this
 * node's; from another address: gshmd__link_strangers' bound; from
 * either, LINK_MAX_PENDING_ADDR from l's address), or NULL: it may.
 * Sets l->from_peer. */
const char *gshmd__link_admit(struct links *ll, struct link *l);
/* admit.c: the connections of strangers (inbound from addresses that
 * are not peers', their hello not passed), in their hello or closing:
 * they are held beside the cluster's fd budget (ll->max_conns), which
 * bounds the connections of the peers and this node's own links and
 * lanes (ll->nconns less these).  At most LINK_MAX_PENDING of them, and
 * a quarter of the budget, are in their hello at once. */
unsigned gshmd__link_strangers(const struct links *ll);
/* admit.c: the connections the cluster's fd budget (ll->max_conns)
 * bounds: ll->nconns less the strangers'.  O(links): per connect and
 * per metrics scrape, not on a data path. */
unsigned gshmd__link_peer_conns(const struct links *ll);

/* Sets up the UCP context and worker (never with UCX's tcp transport;
 * none when ll->ucx_allowed is false),
 * the TCP listener on ll->listen_sa and the loop handles; the caller
 * filled loop, hooks, node_name, listen (with listen_sa),
 * hello_timeout_ns, encrypt and peers.  Errors (logged): -EIO UCX failed. */
int gshmd__link_start(struct links *ll);
/* Fails every link and request and closes the connections, the listener
 * and the loop handles (they finish on the next loop run).  Accepts a
 * half-started ll. */
void gshmd__link_stop(struct links *ll);
/* Frees what is left of the links, the worker and the context (after
 * gshmd__link_stop and a run of the loop). */
void gshmd__link_destroy(struct links *ll);

/* Queues req for peer p (sent at once when its link is up; connects when
 * it is down).  The request id is set when it is sent. */
void gshmd__link_req_submit(struct links *ll, struct peer *p, struct peer_req *req);
/* Withdraws a request that has not been sent yet; its done is then never
 * called.  Returns true when it is not pending (withdrawn or already
 * completed), false when it was sent and its done is still to come. */
bool gshmd__link_req_cancel(struct peer_req *req);
/* Sends req on link l, which is up (a request of a running pull: never
 * queued for a new endpoint).  Its done reports a failure. */
void gshmd__link_req_send(struct link *l, struct peer_req *req);
/* Sends a message on a link (fire and forget).  Returns 0, -ENOTCONN,
 * -EMSGSIZE, -ENOMEM or -EIO. */
int gshmd__link_send(struct link *l, const Gshm__Cluster__Msg *m);
/* An answer or refusal with status (negative errno) and message. */
void gshmd__link_send_status(struct link *l, uint32_t request_id, int err, const char *message);
/* data.c: the bytes of Reads and Stages.
 *
 * Sends the bytes [src, src + len) answering request rid on l: over UCX
 * when the peer's UcxOffer made l->ucx_ep (memh: their registration, or
 * NULL), else as a data frame of the stream.  src stays valid and
 * unchanged until done.  l->busy counts the send until it completes; then
 * done(arg, err) runs.  Returns 0 or a negative errno (done not called). */
int gshmd__link_send_data(struct link *l, uint32_t rid, uint64_t offset, const void *src,
                          uint64_t len, ucp_mem_h memh, void (*done)(void *arg, int err),
                          void *arg);
/* The link_hooks data_dest and data_done for the stream (and lanes:
 * data_done). */
void *gshmd__link_data_dest(struct link *l, uint32_t rid, uint64_t offset, uint64_t len,
                            void **tok_out);
void gshmd__link_data_done(struct link *l, void *tok, int err);

/* Landings: the Reads and Stages of an outbound link whose bytes may come
 * on one of its data lanes, each with where its bytes go, shared with the
 * lanes' threads under a mutex.  A lane's thread that has read a frame's
 * header claims the request there and reads the bytes straight into
 * place; before, it asked the loop and waited (a wakeup of the loop per
 * frame: 12-18% of a pulling lane's time in a 398-tensor model's pull on
 * the lent 16-core machine, 24-43% on a 2-core one: docs/PERFORMANCE.md
 * "What a set of small segments waits on").  Entries are only made by
 * this node's own requests, which its budgets bound (PEER_READ_BUDGET):
 * a peer cannot add one.  A frame is checked against its request's
 * offset and length before a byte of it is read.  A claimed request
 * stays on its link's reqs until its bytes are in; a frame that stops
 * midway is ended by the sweep (lane_overdue: nothing received on its
 * lane for request_timeout_ns), not by the link's request timeout
 * (reqwait.c), which counts only answers that have not begun.
 *
 * l's landings, made if it has none (l holds them until it is freed,
 * each lane of it until its thread is gone, each frame of those lanes
 * being checked on libuv's pool until its check is done).  NULL: out of memory.  Loop
 * only. */
struct landings *gshmd__link_landings(struct link *l);
/* Lists req (sent on l, which has no UCX) in l's landings, making them
 * if l has none: its bytes go to req->data_dest(req, req->data_offset,
 * req->data_len).  Returns 0, -ENOMEM, or -EPROTO when data_dest refuses
 * that range.  Loop only. */
int gshmd__landing_add(struct link *l, struct peer_req *req);
/* Takes req out of its landings unless a lane claimed it.  Returns false
 * when one did: its bytes are being read into place and data_done
 * completes req (the caller must not); true otherwise (also when req is
 * in none).  Loop only. */
bool gshmd__landing_withdraw(struct peer_req *req);
/* Whether a lane's thread claimed req (its bytes are being read into
 * place).  Loop only. */
bool gshmd__landing_claimed(struct peer_req *req);
/* reqwait.c: why outbound link l (up) is overdue at now (CLOCK_MONOTONIC
 * ns): its oldest request whose answer has not begun has been the oldest
 * for over ll->request_timeout_ns, however busy the link is otherwise;
 * or NULL.  The text names what went unanswered (a static buffer, valid
 * until the next call).  Loop only (the sweep). */
const char *gshmd__link_req_overdue(struct link *l, int64_t now);
/* A lane's thread: the request of a frame that answers rid with len
 * bytes at offset, claimed (no other frame nor the loop takes it then),
 * and the request's 2 MiB pages built (peer_req.build_off, build_len:
 * gshmd_host_collapse, on this thread, the landings unlocked; one left
 * sets peer_req.build_left).  *dst:
 * where the bytes go; *tok: the request, for the link's data_done.
 * Returns 0, or -EPROTO when no listed request is rid or its range is
 * not [offset, offset + len) (the peer sent what nobody asked for). */
int gshmd__landing_claim(struct landings *lt, uint32_t rid, uint64_t offset, uint64_t len,
                         void **dst, void **tok);
/* Another holder of lt (a lane's thread), and its end.  Loop only; the
 * last unref frees lt. */
void gshmd__landings_ref(struct landings *lt);
void gshmd__landings_unref(struct landings *lt);
/* Takes UCX data messages (after gshmd__link_start), and makes the
 * datatype of the sends on eager endpoints; nothing without a worker
 * (!ll->ucx_allowed).  Returns 0 or -EIO. */
int gshmd__link_data_start(struct links *ll);
/* l failed (err, a negative errno): its UCX endpoint goes (closed by
 * force: UCX cancels what sends it can; an eager one stays open, as UCX
 * 1.13 cannot close it so).  Its sends over UCX stay on l->ucx_sends
 * until UCX calls back for each, with any status; until then, what they
 * read stays mapped (and their slots unused), counted in l->busy, except
 * on an eager endpoint: there each one's bytes are copied now (UCX packs
 * the copy), and its caller's done runs now with err, so that the link's
 * grants end (a peer that died never takes those sends).  Its receives
 * over UCX end their requests now, with err (their data_done), and stay
 * on l->ucx_recvs, counted in l->busy, holding their destinations
 * (peer_req.data_hold), until UCX calls back: UCX 1.13 cannot cancel an
 * active message's receive, and gshmd has no endpoint of its own to the
 * sender to close. */
void gshmd__link_data_lost(struct link *l, int err);
/* l is freed at exit with sends or receives UCX never ended: their
 * records go to ll->abandoned and ll->abandoned_recvs, freed after the
 * worker (a callback during ucp_worker_destroy touches nothing else). */
void gshmd__link_data_orphan(struct link *l);
/* Frees the records gshmd__link_data_orphan left (after the worker is
 * destroyed): the receives' holds and the sends' copies go with them;
 * and the datatype of gshmd__link_data_start. */
void gshmd__link_data_abandoned_free(struct links *ll);
/* Whether the oldest of l's sends over UCX was posted over limit_ns before
 * now (CLOCK_MONOTONIC ns) and has not completed: the peer does not take
 * the bytes it asked for (a rendezvous waits for the receiver; a worker
 * that nobody progresses never answers it).  Loop only. */
bool gshmd__link_ucx_overdue(const struct link *l, int64_t now, int64_t limit_ns);
/* Whether the oldest of l's receives over UCX began (its header came)
 * over limit_ns before now and has not completed: the peer does not send
 * the bytes it announced (a rendezvous whose data never comes: its
 * worker stopped, or it never answers our ready-to-receive; UCX reports
 * no progress of a receive before its end).  Loop only. */
bool gshmd__link_ucx_recv_overdue(const struct link *l, int64_t now, int64_t limit_ns);
/* Outbound links to p that failed with receives over UCX not yet ended
 * by UCX (they hold the memory those write into: gshmd__link_data_lost):
 * no new link to p is made while LINK_MAX_PER_PEER of them linger. */
unsigned gshmd__link_count_lingering(struct links *ll, const struct peer *p);
/* Inbound links of peer p that passed the hello and are up, refused
 * since (closed by the sweep; their grants and sends stay until then), or
 * failed with sends over UCX not yet ended by UCX (their memory stays:
 * gshmd__link_data_lost): at most LINK_MAX_PER_PEER of them. */
unsigned gshmd__link_count_up(struct links *ll, const struct peer *p);
/* A new outbound connection to parent's peer that will say hello as a
 * data lane of parent (its lane token; lane.h), counted in the peer's
 * lanes_connecting.  Returns it, or NULL (gshmd stopping, the cluster's
 * fd budget spent, no memory, or the connect failed at once: then the
 * link already failed).  Owned by the link layer: freed when it fails. */
struct link *gshmd__link_connect_lane(struct link *parent);
/* l->busy went down: when it reaches 0 on a failed link, on_idle runs. */
void gshmd__link_unbusy(struct link *l);
/* worker.c: the UCP context and worker (never UCX's tcp transport; a
 * refusing handler for every active message id), polled from the loop;
 * none at all without ll->ucx_allowed (the worker calls below then
 * answer -EIO or -EHOSTUNREACH).  Start errors (logged): -EIO.  Stop closes the handles; destroy frees
 * the worker and the context. */
int gshmd__link_worker_start(struct links *ll);
void gshmd__link_worker_stop(struct links *ll);
void gshmd__link_worker_destroy(struct links *ll);
/* This worker's address (ucp_worker_get_address; release with
 * ucp_worker_release_address).  Returns 0 or -EIO. */
int gshmd__link_worker_address(struct links *ll, ucp_address_t **addr_out, size_t *len_out);
/* An endpoint to the worker at addr (a peer's, from its authenticated
 * UcxOffer), with peer error handling (err_cb(arg) when it fails) where
 * the transports have it, else without, and then *eager_out: send eagerly
 * only.
 * Returns 0, or -EHOSTUNREACH when no transport of this UCX reaches it. */
int gshmd__link_worker_ep(struct links *ll, const void *addr, size_t len,
                          ucp_err_handler_cb_t err_cb, void *arg, ucp_ep_h *ep_out,
                          bool *eager_out);
/* Closes ep soon, outside UCX callbacks, by force: its sends fail.  Only
 * an endpoint with peer failure detection: UCX 1.13 refuses to close any
 * other so (UCS_ERR_INVALID_PARAM), and it stays open. */
void gshmd__link_worker_ep_close(struct links *ll, ucp_ep_h ep);
/* Sets the handler of active message id (instead of the refusing one). */
int gshmd__link_worker_am(struct links *ll, unsigned id, ucp_am_recv_callback_t cb, void *arg);
/* Makes sure the worker is progressed soon (after posting operations
 * outside a UCX callback). */
void gshmd__link_kick(struct links *ll);
/* The outbound link to p finished its hello: it is up, and the requests
 * that waited for it go. */
void gshmd__link_up(struct link *l, uint32_t exported);
/* Ends a link: its requests fail, on_lost runs, its peer goes down; the
 * endpoint is closed outside UCX callbacks. */
void gshmd__link_fail(struct link *l, int err, const char *why);
/* Refuses a peer: tells it why, counts and logs it, closes the link. */
void gshmd__link_refuse(struct link *l, enum refusal why, int err, const char *message);
/* Counts a refusal; logs the first of each cause and then at powers of two. */
void gshmd__link_refused(struct links *ll, enum refusal why, const char *who, const char *what);
/* The configured peer of that name, or NULL. */
struct peer *gshmd__link_peer_find(struct links *ll, const char *name);
/* gshm.Status number -> negative errno, as the local protocol. */
int gshmd__link_status_errno(uint32_t status);

#endif
