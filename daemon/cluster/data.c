/* SPDX-License-Identifier: Apache-2.0 */
/* The bytes of Reads and Stages (link.h): sent from the granted memory
 * as one data frame on one of the link's data lanes (lane.h), or of its
 * own stream while it has none, or, where the hello set up UCX for the
 * link (hello.c), as one UCX active message whose bytes UCX moves by
 * rendezvous (shared memory, RDMA); received straight into the request's
 * destination either way. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lane.h"
#include "host_memory.h"
#include "link.h"
#include "log.h"
#include "util.h"

#define DATA_AM_ID 0x68 /* the only UCX message id gshm takes */

/* The header of a UCX data message. */
struct ucx_data_hdr {
  uint64_t token;           /* the receiving link's (its UcxOffer) */
  uint32_t request_id;
  uint32_t reserved;
  uint64_t offset;
};

/* One send of bytes.  Over UCX it stays on its link's ucx_sends until
 * UCX's callback, whatever came first, and the memory it reads (a
 * grant's mapping, a staging slot) lives until then, counted in l->busy;
 * on an eager endpoint, until its link fails: it reads a copy then
 * (gshmd__link_data_lost). */
struct data_send {
  void *next_orphan;        /* first: ll->abandoned's list (gshmd__link_data_orphan) */
  struct ucx_data_hdr hdr;  /* UCX: sent with the bytes */
  struct gshm_list node;    /* UCX: l->ucx_sends until it completes */
  int64_t sent_ns;          /* UCX: when it was posted (CLOCK_MONOTONIC) */
  struct link *l;           /* NULL: orphaned, its link freed at exit */
  const uint8_t *src;       /* UCX: its bytes (eager: what send_pack reads) */
  uint64_t len;
  void *copy;               /* eager, its link failed: src, a copy; done ran, busy not counted */
  void (*done)(void *arg, int err);
  void *arg;
};

static void data_sent(struct data_send *ds, int err) {
  struct link *l = ds->l;

  l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  l->busy--;
  if (ds->done)
    ds->done(ds->arg, err);
  free(ds);
  gshmd__link_unbusy(l);
}

static void on_stream_sent(void *arg, int err) { data_sent(arg, err); }

/* A send of a failed link that UCX ended (its copy's): the link may go
 * with the last. */
static void copy_sent(struct data_send *ds) {
  struct link *l = ds->l;

  free(ds->copy);
  free(ds);
  gshmd__link_unbusy(l);
}

static void on_ucx_sent(void *request, ucs_status_t status, void *user_data) {
  struct data_send *ds = user_data;

  if (request)
    ucp_request_free(request);
  if (!ds->l)
    return; /* freed with the worker (ll->abandoned) */
  gshm_list_del(&ds->node);
  if (ds->copy)
    copy_sent(ds);
  else
    data_sent(ds, status == UCS_OK ? 0 : -ECONNRESET);
}

/* The bytes of a send on an eager endpoint, as UCX packs them (a generic
 * datatype: ds->src is the granted memory, or the copy that replaced it
 * when the link failed). */
static void *send_start_pack(void *context, const void *buffer, size_t count) {
  (void)context, (void)count;
  return (void *)buffer; /* (the data_send) */
}

static void *send_start_unpack(void *context, void *buffer, size_t count) {
  (void)context, (void)buffer, (void)count;
  return NULL; /* (gshm receives into contiguous memory: never called) */
}

static size_t send_packed_size(void *state) { return ((struct data_send *)state)->len; }

static size_t send_pack(void *state, size_t offset, void *dest, size_t max_length) {
  const struct data_send *ds = state;
  size_t n = offset < ds->len ? (size_t)(ds->len - offset) : 0;

  if (n > max_length)
    n = max_length;
  memcpy(dest, ds->src + offset, n);
  return n;
}

static ucs_status_t send_unpack(void *state, size_t offset, const void *src, size_t length) {
  (void)state, (void)offset, (void)src, (void)length;
  return UCS_ERR_UNSUPPORTED;
}

static void send_finish(void *state) { (void)state; }

static const ucp_generic_dt_ops_t send_dt_ops = {.start_pack = send_start_pack,
                                                 .start_unpack = send_start_unpack,
                                                 .packed_size = send_packed_size,
                                                 .pack = send_pack,
                                                 .unpack = send_unpack,
                                                 .finish = send_finish};

/* Over UCX: the bytes go by rendezvous when large (zero-copy where the
 * transport reads memory itself); on an eager endpoint, packed by
 * send_pack. */
static int send_ucx(struct data_send *ds, const void *src, uint64_t len, ucp_mem_h memh) {
  struct link *l = ds->l;
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA |
                                            UCP_OP_ATTR_FIELD_FLAGS,
                            .cb.send = on_ucx_sent,
                            .user_data = ds,
                            .flags = l->ucx_eager ? UCP_AM_SEND_FLAG_EAGER : 0};
  const void *buf = src;
  ucs_status_ptr_t sp;

  ds->src = src;
  ds->len = len;
  if (l->ucx_eager) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    rp.datatype = l->ll->send_dt;
    buf = ds;
  } else if (memh) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = memh;
  }
  l->busy++;
  ds->sent_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshm_list_add_tail(&l->ucx_sends, &ds->node);
  sp = ucp_am_send_nbx(l->ucx_ep, DATA_AM_ID, &ds->hdr, sizeof(ds->hdr), buf, len, &rp);
  gshmd__link_kick(l->ll);
  if (!UCS_PTR_IS_PTR(sp))
    on_ucx_sent(NULL, UCS_PTR_STATUS(sp), ds);
  return 0;
}

int gshmd__link_send_data(struct link *l, uint32_t rid, uint64_t offset, const void *src,
                          uint64_t len, ucp_mem_h memh, void (*done)(void *arg, int err),
                          void *arg) {
  struct data_send *ds;
  int e;

  if (l->state != LINK_UP)
    return -ENOTCONN;
  if (!(ds = calloc(1, sizeof(*ds))))
    return -ENOMEM;
  ds->l = l;
  ds->done = done;
  ds->arg = arg;
  ds->hdr.token = l->ucx_token;
  ds->hdr.request_id = rid;
  ds->hdr.offset = offset;
  if (l->ucx_ep)
    return send_ucx(ds, src, len, memh);
  e = gshmd__lane_send(l, rid, offset, src, len, on_stream_sent, ds);
  if (e == -ENOTCONN) /* no lane up (yet): the link's own stream */
    e = gshmd__stream_send_data(&l->st, rid, offset, src, len, on_stream_sent, ds);
  if (e) {
    free(ds);
    return e;
  }
  l->busy++;
  return 0;
}

/* ---- landings ----------------------------------------------------------- */

struct landing {
  struct peer_req *req;
  uint32_t rid;
  bool claimed;               /* by a lane's thread: data_done ends it */
  uint64_t offset, len;
  void *dst;
  uint64_t build_off, build_len, build_foff; /* peer_req's */
  int build_fd;
};

struct landings {
  pthread_mutex_t mu;
  struct landing *v;          /* under mu: n of cap, unordered */
  size_t n, cap;
  unsigned refs;              /* loop only: the link and its lanes */
};

void gshmd__landings_ref(struct landings *lt) { lt->refs++; }

void gshmd__landings_unref(struct landings *lt) {
  if (!lt || --lt->refs)
    return;
  pthread_mutex_destroy(&lt->mu);
  free(lt->v);
  free(lt);
}

struct landings *gshmd__link_landings(struct link *l) {
  struct landings *lt = l->landings;

  if (!lt && (lt = calloc(1, sizeof(*lt)))) {
    pthread_mutex_init(&lt->mu, NULL);
    lt->refs = 1; /* l's, until link_maybe_free */
    l->landings = lt;
  }
  return lt;
}

int gshmd__landing_add(struct link *l, struct peer_req *req) {
  struct landings *lt = gshmd__link_landings(l);
  void *dst;
  int e = 0;

  if (!lt)
    return -ENOMEM;
  if (!(dst = req->data_dest(req, req->data_offset, req->data_len)))
    return -EPROTO;
  pthread_mutex_lock(&lt->mu);
  if (lt->n == lt->cap) {
    size_t ncap = lt->cap ? lt->cap * 2 : 64;
    struct landing *v = realloc(lt->v, ncap * sizeof(*v));
    if (v) {
      lt->v = v;
      lt->cap = ncap;
    } else {
      e = -ENOMEM;
    }
  }
  if (!e) {
    lt->v[lt->n++] = (struct landing){.req = req,
                                      .rid = req->request_id,
                                      .offset = req->data_offset,
                                      .len = req->data_len,
                                      .dst = dst,
                                      .build_off = req->build_off,
                                      .build_len = req->build_len,
                                      .build_foff = req->build_foff,
                                      .build_fd = req->build_fd};
    req->landing = lt;
  }
  pthread_mutex_unlock(&lt->mu);
  return e;
}

/* req's entry in lt (under lt->mu), or NULL. */
static struct landing *landing_of(struct landings *lt, const struct peer_req *req) {
  for (size_t i = 0; i < lt->n; i++)
    if (lt->v[i].req == req)
      return &lt->v[i];
  return NULL;
}

/* Takes req out of its landings unless a lane claimed it, or even then
 * (claimed_too: its bytes are in), or leaves it (peek).  Returns whether
 * a lane claimed it. */
static bool landing_take(struct peer_req *req, bool claimed_too, bool peek) {
  struct landings *lt = req->landing;
  struct landing *x;
  bool claimed, take;

  if (!lt)
    return false;
  pthread_mutex_lock(&lt->mu);
  x = landing_of(lt, req);
  claimed = x && x->claimed;
  take = !peek && (claimed_too || !claimed);
  if (x && take)
    *x = lt->v[--lt->n];
  pthread_mutex_unlock(&lt->mu);
  if (take)
    req->landing = NULL;
  return claimed;
}

bool gshmd__landing_withdraw(struct peer_req *req) { return !landing_take(req, false, false); }

bool gshmd__landing_claimed(struct peer_req *req) { return landing_take(req, false, true); }

int gshmd__landing_claim(struct landings *lt, uint32_t rid, uint64_t offset, uint64_t len,
                         void **dst, void **tok) {
  struct peer_req *req = NULL;
  uint8_t *build = NULL;
  uint64_t build_len = 0, build_foff = 0;
  int build_fd = -1, e = -EPROTO;

  pthread_mutex_lock(&lt->mu);
  for (size_t i = 0; i < lt->n; i++) {
    struct landing *x = &lt->v[i];
    if (x->rid != rid || x->claimed)
      continue;
    if (x->offset == offset && x->len == len) {
      x->claimed = true;
      *dst = x->dst;
      *tok = req = x->req;
      build = (uint8_t *)x->dst + (int64_t)x->build_off;
      build_len = x->build_len;
      build_foff = x->build_foff;
      build_fd = x->build_fd;
      e = 0;
    }
    break;
  }
  pthread_mutex_unlock(&lt->mu);
  /* new host memory: its 2 MiB pages first, on the lane's thread (where
   * none is built the bytes fault 4 KiB pages in as they land, and the
   * pull builds it once they are all in: prefault.c) */
  if (build_len)
    req->build_left = gshmd_host_collapse(build, build_len, build_fd, build_foff) != 0;
  return e;
}

/* ---- receiving ----------------------------------------------------------- */

void *gshmd__link_data_dest(struct link *l, uint32_t rid, uint64_t offset, uint64_t len,
                            void **tok_out) {
  struct gshm_list *pos;
  void *dst;

  if (l->inbound || l->state != LINK_UP)
    return NULL;
  gshm_list_foreach(pos, &l->reqs) {
    struct peer_req *req = gshm_list_entry(pos, struct peer_req, node);
    if (req->request_id != rid || !req->data_dest)
      continue;
    if (!gshmd__landing_withdraw(req))
      return NULL; /* a lane has its bytes: these are for no request */
    gshm_list_del(&req->node);
    req->queued = false;
    if (!(dst = req->data_dest(req, offset, len))) {
      req->done(req, -EPROTO, "the peer sent bytes that do not fit the request", NULL);
      return NULL;
    }
    *tok_out = req;
    return dst;
  }
  return NULL;
}

void gshmd__link_data_done(struct link *l, void *tok, int err) {
  struct peer_req *req = tok;

  /* a lane's frame: its request is still listed (and on its link's
   * reqs, unless that link failed meanwhile) */
  landing_take(req, true, false);
  if (req->queued) {
    gshm_list_del(&req->node);
    req->queued = false;
  }
  l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  req->data_done(req, err);
  gshmd__link_kick(l->ll);
}

/* The link a UCX data message is for: an outbound link that is up and
 * took UCX, by its token. */
static struct link *link_by_token(struct links *ll, uint64_t token) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (!l->inbound && l->ucx && l->state == LINK_UP &&
        sodium_memcmp(&l->ucx_token, &token, sizeof(token)) == 0)
      return l;
  }
  return NULL;
}

/* One rendezvous receive over UCX.  It stays on its link's ucx_recvs,
 * counted in l->busy and holding its destination (req->data_hold), until
 * UCX's callback, whatever came first: a failed link ends its request at
 * once (gshmd__link_data_lost), not the memory UCX may still write. */
struct data_recv {
  void *next_orphan;        /* first: ll->abandoned_recvs (gshmd__link_data_orphan) */
  struct gshm_list node;    /* l->ucx_recvs until UCX ends it */
  struct link *l;           /* NULL: orphaned, its link freed at exit */
  struct peer_req *req;     /* NULL once its request ended without it */
  struct data_hold *hold;   /* its destination's */
  int64_t posted_ns;        /* when its header came (CLOCK_MONOTONIC) */
};

/* UCX ended rec (err 0: every byte in place): its request, if it still
 * waits, and its hold end, and its link may go. */
static void recv_end(struct data_recv *rec, int err) {
  struct link *l = rec->l;

  gshm_list_del(&rec->node);
  l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  if (rec->req)
    rec->req->data_done(rec->req, err);
  gshmd__data_hold_put(rec->hold);
  free(rec);
  l->busy--;
  gshmd__link_unbusy(l); /* (a failed link may go with its last receive) */
}

static void on_ucx_received(void *request, ucs_status_t status, size_t length, void *user_data) {
  struct data_recv *rec = user_data;

  ucp_request_free(request);
  if (rec->l) /* (else freed with the worker: ll->abandoned_recvs) */
    recv_end(rec, status == UCS_OK && length ? 0 : -ECONNRESET);
}

/* The bytes of a rendezvous into dst, for req on l (none where nothing
 * can hold dst: req fails -ENOMEM, and UCX drops data when on_data_am
 * returns). */
static void recv_ucx(struct link *l, struct peer_req *req, void *data, void *dst, size_t length) {
  struct links *ll = l->ll;
  struct data_recv *rec = calloc(1, sizeof(*rec));
  struct data_hold *hold = rec && req->data_hold ? req->data_hold(req) : NULL;
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA,
                            .cb.recv_am = on_ucx_received,
                            .user_data = rec};
  ucs_status_ptr_t sp;

  if (!hold) { /* (UCX would write where nothing keeps the memory) */
    free(rec);
    req->data_done(req, -ENOMEM); /* (on_data_am's UCS_OK drops data: no release here) */
    return;
  }
  *rec = (struct data_recv){.l = l, .req = req, .hold = hold,
                            .posted_ns = gshm__now_ns(CLOCK_MONOTONIC)};
  gshm_list_add_tail(&l->ucx_recvs, &rec->node);
  l->busy++;
  sp = ucp_am_recv_data_nbx(ll->worker, data, dst, length, &rp);
  if (!UCS_PTR_IS_PTR(sp))
    recv_end(rec, UCS_PTR_STATUS(sp) == UCS_OK ? 0 : -ECONNRESET);
}

static ucs_status_t on_data_am(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param) {
  struct links *ll = arg;
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  struct ucx_data_hdr hdr;
  struct peer_req *req = NULL;
  struct link *l = NULL;
  void *dst = NULL;

  if (header_length == sizeof(hdr)) {
    memcpy(&hdr, header, sizeof(hdr));
    l = link_by_token(ll, hdr.token);
  }
  if (l)
    dst = gshmd__link_data_dest(l, hdr.request_id, hdr.offset, length, (void **)&req);
  if (!dst) {
    /* (a rendezvous not received is dropped by UCX itself when the
     * handler returns UCS_OK, ucp_def.h: a ucp_am_data_release here as
     * well dropped it twice, and the sender's UCX 1.13 aborted on the
     * second acknowledgement, ucp_rndv_ats_handler) */
    if (l)
      gshmd__link_fail(l, -EPROTO, "the peer sent bytes for no request over UCX");
    else
      gshmd__link_refused(ll, REFUSE_PROTOCOL, "a UCX data message", "for no link");
    return UCS_OK;
  }
  if (rndv) {
    recv_ucx(l, req, data, dst, length);
  } else {
    memcpy(dst, data, length);
    req->data_done(req, 0);
  }
  gshmd__link_kick(ll);
  return UCS_OK;
}

int gshmd__link_data_start(struct links *ll) {
  if (!ll->worker) /* (no UCX on this node: cluster.transport = tcp or encrypt) */
    return 0;
  if (ucp_dt_create_generic(&send_dt_ops, NULL, &ll->send_dt) != UCS_OK)
    return -EIO;
  ll->send_dt_made = true;
  return gshmd__link_worker_am(ll, DATA_AM_ID, on_data_am, ll);
}

bool gshmd__link_ucx_overdue(const struct link *l, int64_t now, int64_t limit_ns) {
  const struct data_send *ds;

  if (gshm_list_empty(&l->ucx_sends))
    return false;
  /* (posted in order: the oldest first) */
  ds = gshm_list_entry(l->ucx_sends.next, struct data_send, node);
  return now - ds->sent_ns > limit_ns;
}

bool gshmd__link_ucx_recv_overdue(const struct link *l, int64_t now, int64_t limit_ns) {
  const struct data_recv *rec;

  if (gshm_list_empty(&l->ucx_recvs))
    return false;
  /* (begun in order: the oldest first) */
  rec = gshm_list_entry(l->ucx_recvs.next, struct data_recv, node);
  return now - rec->posted_ns > limit_ns;
}

/* The sends of failed link l on an eager endpoint (no peer failure
 * detection) end now, err to their callers: each one's bytes are copied,
 * UCX packs the copy from now on (send_pack), and the copy stays until
 * UCX ends the send.  Such an endpoint cannot be closed by force (UCX
 * 1.13 refuses), and a flush waits for its sends, which a peer that died
 * never takes: they held their grants, the grants' leases and so the
 * segments' memory (an unlinked one's too) for as long as gshmd ran.
 * Returns how many still read the memory they were given (no memory for
 * a copy: they end with UCX's callback, as before). */
static size_t sends_copy(struct link *l, int err) {
  struct gshm_list *pos;
  struct data_send *ds;
  size_t held = 0;

  gshm_list_foreach(pos, &l->ucx_sends) {
    ds = gshm_list_entry(pos, struct data_send, node);
    if (ds->copy)
      continue;
    if (!(ds->copy = malloc(ds->len ? ds->len : 1))) {
      held++;
      continue;
    }
    memcpy(ds->copy, ds->src, ds->len);
    ds->src = ds->copy;
    l->busy--;
  }
  /* (their callers' ends one at a time, each found from the head: an end
   * frees grants and segments, and the list is not walked across it) */
  for (;;) {
    void (*done)(void *arg, int err);
    ds = NULL;
    gshm_list_foreach(pos, &l->ucx_sends) {
      struct data_send *d = gshm_list_entry(pos, struct data_send, node);
      if (d->copy && d->done) {
        ds = d;
        break;
      }
    }
    if (!ds)
      return held;
    done = ds->done;
    ds->done = NULL;
    done(ds->arg, err);
  }
}

void gshmd__link_data_lost(struct link *l, int err) {
  size_t n = 0, nr = 0, held = 0;
  struct gshm_list *pos;
  bool eager = l->ucx_eager;

  gshm_list_foreach(pos, &l->ucx_sends) n++;
  if (l->ucx_ep) {
    /* (closed out of this callback, by force: UCX cancels the sends it
     * can, and calls back for each.  Not an eager one: UCX 1.13 refuses
     * (UCS_ERR_INVALID_PARAM), and a flush waits for the peer, which,
     * dead, never answers, and kept the loop spinning: it stays open
     * until the worker goes, as it did when its close was refused) */
    if (!eager)
      gshmd__link_worker_ep_close(l->ll, l->ucx_ep);
    l->ucx_ep = NULL;
  }
  /* The link's sends over UCX stay on l->ucx_sends until UCX calls back,
   * however late: UCX may replay a send from the same address when the
   * peer's worker answers (a worker stopped, then woken).  Those of an
   * endpoint with peer failure detection stay counted in l->busy: the
   * link's grants, their mappings and slots, and a revoked segment's
   * pages stay until then (gshmd__link_unbusy frees them with the last);
   * those of an eager one read copies from now on (sends_copy).  The
   * peer's links that linger so count among its LINK_MAX_PER_PEER
   * (gshmd__link_count_up). */
  held = eager ? sends_copy(l, err) : n;
  /* Its receives end their requests now (their pulls fail and go), but
   * UCX may still write their bytes: each keeps its destination
   * (data_hold) until UCX calls back, and the link lingers until the
   * last; no new link to the peer is made while LINK_MAX_PER_PEER
   * linger so (gshmd__link_count_lingering). */
  gshm_list_foreach(pos, &l->ucx_recvs) {
    struct data_recv *rec = gshm_list_entry(pos, struct data_recv, node);
    struct peer_req *req = rec->req;
    nr++;
    rec->req = NULL;
    if (req)
      req->data_done(req, err);
  }
  if (n || nr)
    gshm_log_info("cluster: peer '%s': %zu send%s (%zu of them copied: their grants end now) "
                  "and %zu receive%s over UCX not ended by UCX yet: the memory they read or "
                  "write stays until it ends them",
                  l->peer ? l->peer->name : l->remote, n, n == 1 ? "" : "s", n - held, nr,
                  nr == 1 ? "" : "s");
}

void gshmd__link_data_orphan(struct link *l) {
  while (!gshm_list_empty(&l->ucx_sends)) {
    struct data_send *ds = gshm_list_entry(l->ucx_sends.next, struct data_send, node);
    gshm_list_del(&ds->node);
    ds->l = NULL;
    ds->next_orphan = l->ll->abandoned;
    l->ll->abandoned = ds;
  }
  while (!gshm_list_empty(&l->ucx_recvs)) {
    struct data_recv *rec = gshm_list_entry(l->ucx_recvs.next, struct data_recv, node);
    gshm_list_del(&rec->node);
    rec->l = NULL;
    rec->next_orphan = l->ll->abandoned_recvs;
    l->ll->abandoned_recvs = rec;
  }
}

void gshmd__link_data_abandoned_free(struct links *ll) {
  while (ll->abandoned) { /* sends UCX never completed: no callback comes now */
    struct data_send *ds = ll->abandoned;
    ll->abandoned = ds->next_orphan;
    free(ds->copy);
    free(ds);
  }
  while (ll->abandoned_recvs) { /* ... and receives: their memory may go now */
    struct data_recv *rec = ll->abandoned_recvs;
    ll->abandoned_recvs = rec->next_orphan;
    gshmd__data_hold_put(rec->hold);
    free(rec);
  }
  if (ll->send_dt_made)
    ucp_dt_destroy(ll->send_dt);
  ll->send_dt_made = false;
}
