/* SPDX-License-Identifier: Apache-2.0 */
/* The reading side of a pull: one segment, or a set (every segment a peer
 * exports under a prefix, listed page by page).  Each segment gets a read
 * grant from the peer, a new hidden local segment owned by the requesting
 * user, and pipelined chunk reads whose bytes are received straight into
 * it; grants for the next segments are asked while earlier ones read
 * (GRANTS_AHEAD), and one budget of chunks in flight (cluster.pull_depth)
 * serves the whole set.  Progress replies go to the requester.  Nobody
 * sees a new segment until every byte of every segment is in: then the
 * set is published in one step (gshmd_registry_publish); on any failure
 * the hidden segments are freed, and a restart cannot bring one back (the
 * fd store never hears of them).  docs/CLUSTER.md. */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "config.h"
#include "errors.h"
#include "log.h"
#include "registry.h"
#include "internal.h"
#include "util.h"
#include "wire.h"

#define PROGRESS_NS 200000000LL /* a progress reply at most every 200 ms */
#define GRANTS_AHEAD 16         /* segments of a set granted (or asked for) at once */
/* Segments in one set: its pull_items replies (about 100 bytes a segment
 * with names of 30 bytes, 350 at most) must fit what a connection may
 * queue (limits.max_inflight packets of 64 KiB beyond the socket's
 * buffer) while the client reads them. */
#define PULL_SET_MAX 4096

struct pull;
struct pull_set;

/* One chunk in flight: asked for (Read, or Stage: copied into a slot on
 * the peer first) -> its bytes received -> [copied into the local device
 * segment from a local slot]. */
struct chunk {
  struct pull *p;
  uint64_t off, len;
  uint32_t slot;             /* staging slot (both sides), when staging */
  struct peer_req req;              /* Read, or Stage when the peer stages */
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__Stage st;
  Gshm__Cluster__Read rd;
  struct stage_copy sc;      /* slot -> local device segment */
};

/* One segment of a set: started (grant asked) -> granted -> every byte
 * in (finished) -> closed (grant released, mapping gone; its hidden
 * segment waits for the set). */
struct pull {
  struct pull_set *s;
  struct gshm_list link_node; /* link->pulls, once granted */
  struct link *link;          /* the link the grant came on; NULL when lost */
  struct peer_req req;        /* the grant request */
  bool req_pending;           /* submitted, its done still to come */
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__GrantRequest greq;
  char remote_name[256];
  char local_name[256];
  char location[GSHM_LOCATION_MAX];
  bool started, granted, finished, closed, on_link;
  struct pull *next_retry;    /* s->retry: refused for now (busy peer), asked again later */
  uint64_t grant_id, remote_id, remote_gen;
  Gshm__Cluster__Path path;
  char path_reason[160];
  uint64_t listed;               /* its size in the peer's listing (0: not listed) */
  uint64_t total, next_off, done;
  unsigned inflight;             /* chunks in any step */
  bool remote_staged, local_staged;
  uint64_t chunk_size;
  uint32_t nslots, nfree;
  uint32_t *free_slots;
  struct stage_buf *lsb;         /* local slots (local_staged) */
  struct gshmd_segment *seg;     /* the new segment, hidden until the set is published */
  struct gshmd_alloc *mem;       /* its memory */
  ucp_mem_h memh;
  void *dst;                     /* where gets land without staging */
  size_t dst_len;
  bool dst_mapped;               /* dst is our mmap of a host segment */
};

/* One request: a segment, or every segment under a prefix. */
struct pull_set {
  struct gshm_list node;      /* cl->pulls */
  struct gshmd_cluster *cl;
  struct peer *peer;
  struct gshmd_client *requester; /* NULL once gone */
  uint32_t request_id;
  struct gshmd_client *holder; /* internal client with the requester's cred */
  char name[256];             /* the segment, or the prefix */
  char local[256];            /* its local name, or the local prefix */
  char location[GSHM_LOCATION_MAX];
  uint32_t mode;
  bool prefix, replace;
  /* the listing of a prefix, page by page */
  struct peer_req lreq;
  Gshm__Cluster__Msg lmsg;
  Gshm__Cluster__ListRequest lr;
  bool listing, lreq_pending;
  struct pull **items;
  size_t n, cap;
  size_t next_start;          /* items[next_start] is the next to ask a grant for */
  size_t first_open;          /* items before it are closed */
  size_t nclosed;
  unsigned active;            /* started, not closed */
  unsigned window;            /* grants held or asked at once: GRANTS_AHEAD, less for a
                                 peer that said it is busy */
  struct pull *retry, **retry_tail; /* segments to ask again, in order */
  unsigned inflight;          /* chunks in flight, all items */
  uint64_t total, done;       /* bytes */
  int64_t start_ns, last_progress_ns;
  int err;
  char why[256];
};

static void set_fail(struct pull_set *s, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_fail(struct pull_set *s, int err, const char *fmt, ...) {
  va_list ap;

  if (!s->err) {
    s->err = err;
    va_start(ap, fmt);
    vsnprintf(s->why, sizeof(s->why), fmt, ap);
    va_end(ap);
    /* what is not sent yet is withdrawn; what is sent ends with its answer */
    if (s->lreq_pending && gshmd__link_req_cancel(&s->lreq))
      s->lreq_pending = false;
    for (size_t i = s->first_open; i < s->next_start; i++) {
      struct pull *p = s->items[i];
      if (p->req_pending && gshmd__link_req_cancel(&p->req))
        p->req_pending = false;
    }
  }
  gshmd__link_kick(&s->cl->ll);
}

/* A failure of one segment fails its set. */
#define pull_fail(p, err, ...) set_fail((p)->s, err, __VA_ARGS__)

static void send_progress(struct pull_set *s) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullProgress pr = GSHM__PULL_PROGRESS__INIT;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);

  if (!s->requester || now - s->last_progress_ns < PROGRESS_NS)
    return;
  s->last_progress_ns = now;
  pr.bytes_done = s->done;
  pr.bytes_total = s->total;
  pr.elapsed_ns = now - s->start_ns;
  pr.segments_done = (uint32_t)s->nclosed;
  pr.segments_total = s->listing ? 0 : (uint32_t)s->n;
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_PROGRESS;
  reply.pull_progress = &pr;
  s->cl->reply(s->cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
}

static void set_issue(struct pull_set *s);

/* A chunk left every step (err 0: its bytes are in place). */
static void chunk_end(struct chunk *c, int err, const char *why) {
  struct pull *p = c->p;
  struct pull_set *s = p->s;

  p->inflight--;
  s->inflight--;
  if (p->nslots)
    p->free_slots[p->nfree++] = c->slot;
  if (err) {
    pull_fail(p, err, "%s", why);
  } else {
    p->done += c->len;
    s->done += c->len;
  }
  free(c);
  if (!s->err) {
    if (p->done == p->total)
      p->finished = true;
    set_issue(s);
    send_progress(s);
  }
  gshmd__link_kick(&s->cl->ll);
}

static void on_copied(struct stage_copy *sc, int err) {
  chunk_end(sc->arg, err, "copying into the local device segment failed");
}

/* The chunk's bytes are where the answer put them: into the local
 * device segment from its slot, or done. */
static void chunk_landed(struct chunk *c) {
  struct pull *p = c->p;

  if (!p->local_staged) {
    chunk_end(c, 0, NULL);
    return;
  }
  c->sc.mem = p->mem;
  c->sc.offset = c->off;
  c->sc.len = c->len;
  c->sc.host = (uint8_t *)p->lsb->addr + (uint64_t)c->slot * p->lsb->slot_size;
  c->sc.to_segment = true;
  c->sc.done = on_copied;
  c->sc.arg = c;
  if (gshmd_stage_copy(&p->s->cl->stage, &c->sc))
    chunk_end(c, -ENOMEM, "out of memory");
}

static void on_recv_done(void *request, ucs_status_t status, size_t length, void *user_data) {
  struct chunk *c = user_data;
  char why[200];

  ucp_request_free(request);
  if (status != UCS_OK || length != c->len) {
    snprintf(why, sizeof(why), "receiving from peer '%s' failed: %s", c->p->s->peer->name,
             status != UCS_OK ? ucs_status_string(status) : "short message");
    chunk_end(c, -ECONNRESET, why);
    return;
  }
  chunk_landed(c);
}

/* The answer's bytes: copied (eager), or received by rendezvous straight
 * into place (the segment, or the local slot). */
static void on_chunk_data(struct peer_req *req, void *data, size_t len, const ucp_am_recv_param_t *param) {
  struct chunk *c = req->arg;
  struct pull *p = c->p;
  void *dst = p->local_staged ? (uint8_t *)p->lsb->addr + (uint64_t)c->slot * p->lsb->slot_size
                              : (uint8_t *)p->dst + c->off;
  ucp_mem_h memh = p->local_staged ? p->lsb->memh : p->memh;

  if (len != c->len) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
      ucp_am_data_release(p->s->cl->ll.worker, data);
    chunk_end(c, -EPROTO, "the peer sent a chunk of the wrong size");
    return;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_am = on_recv_done,
                              .user_data = c};
    ucs_status_ptr_t sp;
    if (memh) {
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      rp.memh = memh;
    }
    sp = ucp_am_recv_data_nbx(p->s->cl->ll.worker, data, dst, len, &rp);
    if (UCS_PTR_IS_PTR(sp))
      return;
    if (UCS_PTR_STATUS(sp) != UCS_OK) {
      chunk_end(c, -ECONNRESET, "receiving from the peer failed");
      return;
    }
  } else if (p->mem->device_index >= 0 && !p->local_staged) {
    /* the direct path, a small chunk: into device memory by the driver */
    int e = p->mem->backend->ops->copy_host(p->mem->backend, p->mem, c->off, data, len, true);
    if (e) {
      chunk_end(c, e, "copying into the local device segment failed");
      return;
    }
  } else {
    memcpy(dst, data, len);
  }
  chunk_landed(c);
}

static void on_chunk_answer(struct peer_req *req, int err, const char *why,
                            const Gshm__Cluster__Msg *m) {
  struct chunk *c = req->arg;
  char buf[240];

  (void)m;
  if (!err) { /* an answer without bytes */
    err = -EPROTO;
    why = "the peer answered a read without the bytes";
  }
  snprintf(buf, sizeof(buf), "peer '%s': %s", c->p->s->peer->name, why);
  chunk_end(c, err, buf);
}

/* Keeps the set's chunks in flight (cluster.pull_depth over the whole
 * set, and no more than p has staging slots) from p: each a Read (or,
 * from a staging peer, a Stage) answered with its bytes. */
static void issue_chunks(struct pull *p) {
  struct pull_set *s = p->s;
  struct gshmd_cluster *cl = s->cl;

  while (!s->err && s->inflight < cl->cfg->cluster_pull_depth && p->next_off < p->total &&
         (!p->nslots || p->nfree)) {
    struct chunk *c = calloc(1, sizeof(*c));
    if (!c) {
      pull_fail(p, -ENOMEM, "out of memory");
      break;
    }
    c->p = p;
    c->off = p->next_off;
    c->len = p->total - c->off < p->chunk_size ? p->total - c->off : p->chunk_size;
    if (p->nslots)
      c->slot = p->free_slots[--p->nfree];
    p->next_off += c->len;
    p->inflight++;
    s->inflight++;
    gshm__cluster__msg__init(&c->msg);
    if (p->remote_staged) {
      gshm__cluster__stage__init(&c->st);
      c->st.grant_id = p->grant_id;
      c->st.offset = c->off;
      c->st.length = c->len;
      c->st.slot = c->slot;
      c->msg.body_case = GSHM__CLUSTER__MSG__BODY_STAGE;
      c->msg.stage = &c->st;
    } else {
      gshm__cluster__read__init(&c->rd);
      c->rd.grant_id = p->grant_id;
      c->rd.offset = c->off;
      c->rd.length = c->len;
      c->msg.body_case = GSHM__CLUSTER__MSG__BODY_READ;
      c->msg.read = &c->rd;
    }
    c->req.msg = &c->msg;
    c->req.done = on_chunk_answer;
    c->req.on_data = on_chunk_data;
    c->req.arg = c;
    c->req.peer = s->peer;
    if (!p->link) {
      chunk_end(c, -ECONNRESET, "peer lost");
      break;
    }
    gshmd__link_req_send(p->link, &c->req);
  }
}

/* Chunks for the open segments, oldest first, while the budget lasts. */
static void set_issue(struct pull_set *s) {
  for (size_t i = s->first_open; i < s->next_start && !s->err; i++) {
    struct pull *p = s->items[i];
    if (s->inflight >= s->cl->cfg->cluster_pull_depth)
      break;
    if (p->granted && !p->closed && !p->finished && p->total)
      issue_chunks(p);
  }
  gshmd__link_kick(&s->cl->ll);
}

/* The new local segment, mapped and registered for the gets. */
static int make_local(struct pull *p, const Gshm__Cluster__Segment *s) {
  struct gshmd_cluster *cl = p->s->cl;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  ucp_mem_map_params_t mp = {0};
  struct gshmd_alloc *mem;
  const char *msg = NULL;
  char src[400];
  int e, fd;

  cr.name = p->local_name;
  cr.size = s->size;
  cr.location = p->location;
  cr.mode = p->s->mode;
  if ((e = gshmd_registry_create_hidden(cl->reg, p->s->holder, &cr, &p->seg, &msg))) {
    pull_fail(p, e, "cannot create '%s': %s", p->local_name, msg ? msg : gshm__strerror(e));
    return e;
  }
  /* (the fd store's record, written at publish, says where it came from) */
  snprintf(src, sizeof(src), "%s:%s#%" PRIu64 ".%" PRIu64, p->s->peer->name, s->name, s->id,
           s->generation);
  p->seg->source = strdup(src);
  mem = p->mem = p->seg->mem;
  if (mem->device_index >= 0) {
    if (p->local_staged)
      return 0; /* written by copies from the local slots */
    /* a CUDA-aware UCX writes the device segment itself */
    if ((e = mem->backend->ops->local_ptr(mem->backend, mem, &p->dst))) {
      pull_fail(p, e, "cannot map the new device segment");
      return e;
    }
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = p->dst;
    mp.length = mem->size;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    if (ucp_mem_map(cl->ll.ctx, &mp, &p->memh) != UCS_OK) {
      p->memh = NULL;
      pull_fail(p, -EIO, "cannot register the new device segment with UCX");
      return -EIO;
    }
    return 0;
  }
  if ((e = mem->backend->ops->export_fd(mem->backend, mem, true, &fd))) {
    pull_fail(p, e, "cannot get the new segment's memory");
    return e;
  }
  p->dst_len = mem->size;
  p->dst = mmap(NULL, p->dst_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p->dst == MAP_FAILED) {
    p->dst = NULL;
    p->dst_len = 0;
    pull_fail(p, -ENOMEM, "cannot map the new segment: %s", strerror(errno));
    return -ENOMEM;
  }
  p->dst_mapped = true;
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = p->dst;
  mp.length = p->dst_len;
  if (ucp_mem_map(cl->ll.ctx, &mp, &p->memh) != UCS_OK) {
    p->memh = NULL;
    pull_fail(p, -EIO, "cannot register the new segment with UCX");
    return -EIO;
  }
  return 0;
}

static const char *path_name(Gshm__Cluster__Path path) {
  switch (path) {
  case GSHM__CLUSTER__PATH__PATH_HOST: return "host";
  case GSHM__CLUSTER__PATH__PATH_DIRECT: return "direct";
  case GSHM__CLUSTER__PATH__PATH_STAGED: return "staged";
  default: return "none";
  }
}

/* Decides where the bytes go on each side and says why (the pull's
 * path and path_reason).  Returns 0 or a negative errno (the pull failed). */
static int choose_path(struct pull *p, const Gshm__Cluster__Grant *g) {
  struct gshm_location loc;
  bool remote_device = strcmp(g->segment->location, "host") != 0;

  /* (a set's location is for its device segments: a host one, such as a
   * published model's manifest, stays on the host) */
  if (!p->location[0] || (p->s->prefix && !remote_device))
    snprintf(p->location, sizeof(p->location), "%s", remote_device ? "cuda:0" : "host");
  if (gshm__location_parse(p->location, &loc)) {
    pull_fail(p, -EINVAL, "bad location '%s'", p->location);
    return -EINVAL;
  }
  p->remote_staged = g->path == GSHM__CLUSTER__PATH__PATH_STAGED;
  p->local_staged = loc.kind != GSHM_LOCATION_HOST && !p->s->cl->ll.cuda_memory;
  if (p->local_staged && !p->s->cl->reg->cuda) {
    pull_fail(p, -ENOTSUP, "this node has no CUDA backend for location '%s'", p->location);
    return -ENOTSUP;
  }
  if (p->remote_staged && p->local_staged)
    snprintf(p->path_reason, sizeof(p->path_reason),
             "staged through pinned host slots on both nodes (UCX without CUDA memory "
             "support, or cluster.staging = always on the peer)");
  else if (p->remote_staged)
    snprintf(p->path_reason, sizeof(p->path_reason),
             "staged through pinned host slots on the peer (%s segment; its UCX has no CUDA "
             "memory support, or cluster.staging = always)",
             remote_device ? "device" : "host");
  else if (p->local_staged)
    snprintf(p->path_reason, sizeof(p->path_reason),
             "into device memory through pinned host slots here (this UCX has no CUDA "
             "memory support)");
  else if (g->path == GSHM__CLUSTER__PATH__PATH_DIRECT)
    snprintf(p->path_reason, sizeof(p->path_reason),
             "device segment registered by the peer's CUDA-aware UCX, sent directly");
  else
    snprintf(p->path_reason, sizeof(p->path_reason),
             "host segment: registered once by the peer, sent zero-copy by rendezvous");
  if (p->remote_staged || p->local_staged)
    p->path = GSHM__CLUSTER__PATH__PATH_STAGED;
  return 0;
}

/* The chunk size and the staging slots of both sides.  Returns 0 or a
 * negative errno (the pull failed). */
static int setup_slots(struct pull *p, const Gshm__Cluster__Grant *g) {
  int e;

  p->chunk_size = p->s->cl->cfg->cluster_pull_chunk;
  if (p->remote_staged) {
    if (!g->slots || !g->slot_size || g->length < (uint64_t)g->slots * g->slot_size) {
      pull_fail(p, -EPROTO, "peer '%s' granted malformed staging slots", p->s->peer->name);
      return -EPROTO;
    }
    p->nslots = g->slots;
    if (g->slot_size < p->chunk_size)
      p->chunk_size = g->slot_size;
  } else if (g->length < g->segment->size) {
    pull_fail(p, -EPROTO, "peer '%s' granted %" PRIu64 " of %" PRIu64 " bytes", p->s->peer->name,
              g->length, g->segment->size);
    return -EPROTO;
  }
  if (p->local_staged) {
    if ((e = gshmd_stage_buf_new(&p->s->cl->stage, p->chunk_size, false, &p->lsb))) {
      pull_fail(p, e, "cannot set up the local staging buffer");
      return e;
    }
    if (!p->nslots || p->lsb->slots < p->nslots)
      p->nslots = p->lsb->slots;
  }
  if (p->nslots) {
    if (!(p->free_slots = calloc(p->nslots, sizeof(*p->free_slots)))) {
      pull_fail(p, -ENOMEM, "out of memory");
      return -ENOMEM;
    }
    for (uint32_t i = 0; i < p->nslots; i++)
      p->free_slots[p->nfree++] = p->nslots - 1 - i;
  }
  return 0;
}

static bool grant_later(struct pull *p);

/* The peer answered the grant request: set up and start reading. */
static void grant_done(struct peer_req *req, int err, const char *why,
                       const Gshm__Cluster__Msg *m) {
  struct pull *p = req->arg;
  struct pull_set *s = p->s;
  const Gshm__Cluster__Grant *g;

  p->req_pending = false;
  if (err == -EBUSY && !s->err && grant_later(p))
    return;
  if (err) {
    pull_fail(p, err, "peer '%s': %s (segment '%s')", s->peer->name, why, p->remote_name);
    return;
  }
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_GRANT || !m->grant->segment) {
    pull_fail(p, -EPROTO, "peer '%s' answered a grant request with something else",
              s->peer->name);
    return;
  }
  g = m->grant;
  p->granted = true;
  p->grant_id = g->grant_id;
  p->remote_id = g->segment->id;
  p->remote_gen = g->segment->generation;
  p->path = g->path;
  p->link = s->peer->out;
  if (p->link) {
    gshm_list_add_tail(&p->link->pulls, &p->link_node);
    p->on_link = true;
  }
  if (s->err) /* the set failed while we waited: the grant goes back */
    return;
  if (!p->link) {
    pull_fail(p, -ECONNRESET, "peer '%s' lost", s->peer->name);
    return;
  }
  if (choose_path(p, g) || setup_slots(p, g) || make_local(p, g->segment))
    return;
  p->total = g->segment->size;
  s->total += p->total - p->listed; /* the grant's size, not the listing's */
  gshm_log_info("cluster: pulling '%s' from peer '%s' into '%s' at %s: %" PRIu64
                " bytes, path %s (%s)",
                p->remote_name, s->peer->name, p->local_name, p->location, p->total,
                path_name(p->path), p->path_reason);
  set_issue(s);
}

/* Asks grants for the next segments (those a busy peer refused first)
 * while fewer than s->window are open (run outside UCX callbacks). */
static void set_start_grants(struct pull_set *s) {
  while (!s->err && s->active < s->window && (s->retry || s->next_start < s->n)) {
    struct pull *p = s->retry;
    if (p) {
      if (!(s->retry = p->next_retry))
        s->retry_tail = &s->retry;
    } else {
      p = s->items[s->next_start++];
    }
    p->started = true;
    p->req_pending = true;
    s->active++;
    gshmd__link_req_submit(&s->cl->ll, s->peer, &p->req);
  }
}

/* The peer refused p's grant as busy (it caps grants per link, e.g.
 * staged ones) while other segments of the set hold grants: p waits for
 * one of them to close, and the set asks no more at once than it holds
 * now.  Returns false when nothing else is open (a real failure). */
static bool grant_later(struct pull *p) {
  struct pull_set *s = p->s;

  if (s->active <= 1)
    return false;
  s->active--;
  if (s->window == GRANTS_AHEAD)
    gshm_log_info("cluster: peer '%s' is busy: the pull of '%s' waits for its grants to end "
                  "before it asks more",
                  s->peer->name, s->name);
  s->window = s->active;
  p->started = false;
  p->next_retry = NULL;
  *s->retry_tail = p;
  s->retry_tail = &p->next_retry;
  return true;
}

/* A new item of the set: remote segment `name`, `size` bytes.  Returns 0
 * or a negative errno (the set failed). */
static int set_add(struct pull_set *s, const char *name, uint64_t size) {
  struct gshmd_cluster *cl = s->cl;
  struct pull *p;
  int e;

  if (s->n == PULL_SET_MAX) {
    set_fail(s, -E2BIG, "more than %u segments under '%s' on peer '%s'", PULL_SET_MAX, s->name,
             s->peer->name);
    return -E2BIG;
  }
  if (s->n == s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 16;
    struct pull **a = realloc(s->items, ncap * sizeof(*a));
    if (!a) {
      set_fail(s, -ENOMEM, "out of memory");
      return -ENOMEM;
    }
    s->items = a;
    s->cap = ncap;
  }
  if (!(p = calloc(1, sizeof(*p)))) {
    set_fail(s, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  s->items[s->n++] = p;
  p->s = s;
  snprintf(p->remote_name, sizeof(p->remote_name), "%s", name);
  if (!s->prefix)
    snprintf(p->local_name, sizeof(p->local_name), "%s", s->local);
  else if ((size_t)snprintf(p->local_name, sizeof(p->local_name), "%s%s", s->local,
                            name + strlen(s->name)) >= sizeof(p->local_name))
    p->local_name[0] = '\0';
  if ((e = gshm__name_check(p->local_name, cl->cfg->max_name))) {
    set_fail(s, e, "segment '%s' of peer '%s' would be '%s' here: not a valid name", name,
             s->peer->name, p->local_name);
    return e;
  }
  if (!s->replace && gshmd_registry_find_name(cl->reg, p->local_name)) {
    set_fail(s, -EEXIST, "a local segment named '%s' exists (replace it with --replace)",
             p->local_name);
    return -EEXIST;
  }
  snprintf(p->location, sizeof(p->location), "%s", s->location);
  p->listed = size;
  s->total += size;
  gshm__cluster__msg__init(&p->msg);
  gshm__cluster__grant_request__init(&p->greq);
  p->greq.name = p->remote_name;
  p->msg.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  p->msg.grant_request = &p->greq;
  p->req.msg = &p->msg;
  p->req.done = grant_done;
  p->req.arg = p;
  return 0;
}

static void list_page_done(struct peer_req *req, int err, const char *why,
                           const Gshm__Cluster__Msg *m);

/* Asks the peer for its next page of exported segments. */
static void list_next(struct pull_set *s, uint64_t after) {
  gshm__cluster__msg__init(&s->lmsg);
  gshm__cluster__list_request__init(&s->lr);
  s->lr.after = after;
  s->lmsg.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  s->lmsg.list = &s->lr;
  s->lreq.msg = &s->lmsg;
  s->lreq.done = list_page_done;
  s->lreq.arg = s;
  s->lreq_pending = true;
  gshmd__link_req_submit(&s->cl->ll, s->peer, &s->lreq);
}

/* A page of the peer's exported segments: the ones under the prefix join
 * the set; the next page is asked for at once (the grants of this one
 * start meanwhile). */
static void list_page_done(struct peer_req *req, int err, const char *why,
                           const Gshm__Cluster__Msg *m) {
  struct pull_set *s = req->arg;
  const Gshm__Cluster__ListReply *r;
  size_t plen = strlen(s->name);

  s->lreq_pending = false;
  if (s->err)
    return;
  if (err) {
    set_fail(s, err, "peer '%s': %s", s->peer->name, why);
    return;
  }
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_LIST_REPLY) {
    set_fail(s, -EPROTO, "peer '%s' answered a list with something else", s->peer->name);
    return;
  }
  r = m->list_reply;
  for (size_t i = 0; i < r->n_segments; i++) {
    const Gshm__Cluster__Segment *g = r->segments[i];
    if (!g || !g->name || gshm__name_check(g->name, 255) || strncmp(g->name, s->name, plen))
      continue;
    if (set_add(s, g->name, g->size))
      return;
  }
  if (r->next) {
    if (r->next <= s->lr.after) { /* a cursor must advance */
      set_fail(s, -EPROTO, "peer '%s' sent a list cursor that does not advance",
               s->peer->name);
      return;
    }
    list_next(s, r->next);
  } else {
    s->listing = false;
    if (!s->n)
      set_fail(s, -ENOENT, "peer '%s' exports no segment under '%s'", s->peer->name, s->name);
  }
  gshmd__link_kick(&s->cl->ll);
}

/* A prefix: "" (everything) or the start of a valid name of at most max
 * bytes (what it would be with one more byte).  0, -EINVAL or
 * -ENAMETOOLONG. */
static int prefix_check(const char *prefix, unsigned max) {
  char name[258];
  size_t n = strlen(prefix);

  if (!n)
    return 0;
  if (n >= max || n > 255)
    return -ENAMETOOLONG;
  snprintf(name, sizeof(name), "%sx", prefix);
  return gshm__name_check(name, max);
}

int gshmd__pull_start(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                      const Gshm__PullRequest *m, const char **msg_out) {
  struct peer *peer = gshmd__link_peer_find(&cl->ll, m->peer);
  const char *local = m->local_name && *m->local_name ? m->local_name : m->name;
  struct gshm_location loc;
  struct pull_set *s;
  int e;

  if (!peer) {
    *msg_out = "no such peer in cluster.peers";
    return -ENOENT;
  }
  if (m->prefix) {
    if ((e = prefix_check(m->name, 255)) || (e = prefix_check(local, cl->cfg->max_name))) {
      *msg_out = e == -ENAMETOOLONG ? "prefix too long" : "bad prefix: the start of a name";
      return e;
    }
  } else if ((e = gshm__name_check(m->name, 255)) ||
             (e = gshm__name_check(local, cl->cfg->max_name))) {
    *msg_out = e == -ENAMETOOLONG ? "name too long" : "bad segment name";
    return e;
  }
  if (m->location && *m->location && gshm__location_parse(m->location, &loc)) {
    *msg_out = "bad location: use host, cuda:N or cuda:GPU-<uuid>";
    return -EINVAL;
  }
  if (m->mode > 0777) {
    *msg_out = "mode: permission bits, at most 0777";
    return -EINVAL;
  }
  if (!m->prefix && !m->replace && gshmd_registry_find_name(cl->reg, local)) {
    *msg_out = "a local segment of that name exists (replace it with --replace)";
    return -EEXIST;
  }
  if (!(s = calloc(1, sizeof(*s))))
    return -ENOMEM;
  if ((e = gshmd_registry_client_add(cl->reg, &c->cred, &s->holder))) {
    free(s);
    return e;
  }
  snprintf(s->holder->name, sizeof(s->holder->name), "pull:%.58s", peer->name);
  s->cl = cl;
  s->peer = peer;
  s->requester = c;
  s->request_id = request_id;
  s->prefix = m->prefix;
  s->replace = m->replace;
  snprintf(s->name, sizeof(s->name), "%s", m->name);
  snprintf(s->local, sizeof(s->local), "%s", local);
  snprintf(s->location, sizeof(s->location), "%s", m->location ? m->location : "");
  s->mode = m->mode;
  s->start_ns = s->last_progress_ns = gshm__now_ns(CLOCK_MONOTONIC);
  s->window = GRANTS_AHEAD;
  s->retry_tail = &s->retry;
  gshm_list_add_tail(&cl->pulls, &s->node);
  gshm_log_info("cluster: uid %u pid %d asks to pull %s'%s' from peer '%s' as '%s'%s",
                (unsigned)c->cred.uid, (int)c->cred.pid, s->prefix ? "every segment under " : "",
                s->name, peer->name, s->local, s->replace ? " (replacing)" : "");
  if (s->prefix) {
    s->listing = true;
    list_next(s, 0);
  } else if (!set_add(s, s->name, 0)) {
    set_start_grants(s);
  }
  return 0;
}

enum pull_failure gshmd__pull_failure(int err) {
  switch (-err) {
  case ECONNRESET: case ETIMEDOUT: case ESHUTDOWN: return PULL_FAIL_PEER_LOST;
  case ENOENT: return PULL_FAIL_NOT_FOUND;
  case EACCES: case EPERM: return PULL_FAIL_REFUSED;
  case EEXIST: return PULL_FAIL_EXISTS;
  case ECANCELED: return PULL_FAIL_CANCELED;
  case ENOMEM: case EDQUOT: return PULL_FAIL_NO_MEMORY;
  case EPROTO: case EPROTONOSUPPORT: return PULL_FAIL_PROTOCOL;
  default: return PULL_FAIL_OTHER;
  }
}

#define ITEMS_PAGE 49152 /* bytes of PulledSegment per pull_items reply (packets: 64 KiB) */

/* Sends `items` pages of the set's segments items[first..n): as many as
 * fit one reply each. */
static void reply_items(struct pull_set *s) {
  Gshm__PulledSegment *items = calloc(s->n, sizeof(*items));
  Gshm__PulledSegment **ptrs = calloc(s->n, sizeof(*ptrs));
  size_t first = 0, used = 0;

  if (!items || !ptrs) {
    free(items);
    free(ptrs);
    return; /* the final result still comes (count says what is missing) */
  }
  for (size_t i = 0; i <= s->n; i++) {
    if (i < s->n) {
      struct pull *p = s->items[i];
      Gshm__PulledSegment *o = &items[i];
      gshm__pulled_segment__init(o);
      o->name = p->seg->name;
      o->id = p->seg->id;
      o->generation = p->seg->generation;
      o->size = p->seg->mem->size;
      o->bytes = p->total;
      o->location = (char *)p->seg->mem->location;
      o->path = (char *)path_name(p->path);
      o->remote_id = p->remote_id;
      o->remote_generation = p->remote_gen;
      o->device_index = p->seg->mem->device_index;
      ptrs[i] = o;
      used += gshm__pulled_segment__get_packed_size(o) + 4;
    }
    if ((i == s->n && i > first) || used > ITEMS_PAGE) {
      Gshm__Reply reply = GSHM__REPLY__INIT;
      Gshm__PullItems pi = GSHM__PULL_ITEMS__INIT;
      size_t end = i == s->n ? i : i + 1;
      pi.items = &ptrs[first];
      pi.n_items = end - first;
      pi.first = (uint32_t)first;
      reply.status = GSHM__STATUS__STATUS_OK;
      reply.body_case = GSHM__REPLY__BODY_PULL_ITEMS;
      reply.pull_items = &pi;
      s->cl->reply(s->cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
      first = end;
      used = 0;
    }
  }
  free(items);
  free(ptrs);
}

/* The result that ends the request: the (first) segment's, and for a set
 * the whole set's count, bytes and time. */
static void reply_result(struct pull_set *s, int64_t ns) {
  struct pull *p = s->items[0];
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullResult res = GSHM__PULL_RESULT__INIT;
  Gshm__SegmentInfo info;

  if (s->prefix)
    reply_items(s);
  gshmd_segment_to_info(p->seg, &info);
  res.segment = &info;
  res.bytes = p->total;
  res.elapsed_ns = ns;
  res.path = (char *)path_name(p->path);
  res.path_reason = p->path_reason;
  res.peer = s->peer->name;
  res.remote_id = p->remote_id;
  res.remote_generation = p->remote_gen;
  if (s->prefix) {
    res.count = (uint32_t)s->n;
    res.set_bytes = s->done;
  }
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_RESULT;
  reply.pull_result = &res;
  s->cl->reply(s->cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
}

/* Every byte of the set is in: its segments appear at once, and the
 * requester gets their results.  Returns 0 or the publish's error. */
static int set_succeeded(struct pull_set *s, int64_t ns) {
  struct gshmd_segment **segs = calloc(s->n, sizeof(*segs));
  const char *msg = NULL;
  char sz[32];
  int e;

  if (!segs) {
    set_fail(s, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  for (size_t i = 0; i < s->n; i++)
    segs[i] = s->items[i]->seg;
  e = gshmd_registry_publish(s->cl->reg, s->holder, segs, s->n, s->replace, &msg);
  free(segs);
  if (e) {
    set_fail(s, e, "cannot publish the pulled segments: %s", msg ? msg : gshm__strerror(e));
    return e;
  }
  for (size_t i = 0; i < s->n; i++) {
    struct pull *p = s->items[i];
    s->peer->pulls_ok++;
    if (p->path == GSHM__CLUSTER__PATH__PATH_HOST)
      s->peer->bytes_host += p->total;
    else if (p->path == GSHM__CLUSTER__PATH__PATH_STAGED)
      s->peer->bytes_staged += p->total;
    else
      s->peer->bytes_direct += p->total;
  }
  gshm_log_info("cluster: pulled %s'%s' from peer '%s' into '%s': %zu segment(s), %s in "
                "%.3f s (%.2f GB/s)",
                s->prefix ? "every segment under " : "", s->name, s->peer->name, s->local, s->n,
                gshm__format_size(s->done, sz, sizeof(sz)), (double)ns / 1e9,
                ns > 0 ? (double)s->done / (double)ns : 0.0);
  if (s->requester) /* (each seg is live until the loop runs again) */
    reply_result(s, ns);
  for (size_t i = 0; i < s->n; i++)
    s->items[i]->seg = NULL; /* the registry's now */
  return 0;
}

/* The set failed: its hidden segments go, the requester gets why. */
static void set_failed(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;
  Gshm__Reply reply = GSHM__REPLY__INIT;

  s->peer->pulls_failed++;
  cl->pull_errors[gshmd__pull_failure(s->err)]++;
  for (size_t i = 0; i < s->n; i++)
    if (s->items[i]->seg) {
      gshmd_registry_discard_hidden(cl->reg, s->items[i]->seg);
      s->items[i]->seg = NULL;
    }
  gshm_log_warn("cluster: pull of %s'%s' from peer '%s' failed: %s",
                s->prefix ? "the set under " : "", s->name, s->peer->name, s->why);
  if (s->requester) {
    reply.status = gshm__errno_to_status(s->err);
    reply.message = s->why;
    cl->reply(cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
  }
}

/* A segment has nothing in flight and is done (or its set failed): the
 * grant goes back, the mapping and the slots go; the hidden segment
 * stays with the set. */
static void item_close(struct pull *p) {
  struct pull_set *s = p->s;
  struct gshmd_cluster *cl = s->cl;

  if (p->granted && p->link && p->link->state == LINK_UP) {
    Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
    Gshm__Cluster__Release r = GSHM__CLUSTER__RELEASE__INIT;
    r.grant_id = p->grant_id;
    m.body_case = GSHM__CLUSTER__MSG__BODY_RELEASE;
    m.release = &r;
    gshmd__link_send(p->link, &m);
  }
  if (p->on_link)
    gshm_list_del(&p->link_node);
  p->on_link = false;
  if (p->memh)
    ucp_mem_unmap(cl->ll.ctx, p->memh);
  p->memh = NULL;
  if (p->dst_mapped)
    munmap(p->dst, p->dst_len);
  p->dst_mapped = false;
  gshmd_stage_free(&cl->stage, p->lsb);
  p->lsb = NULL;
  free(p->free_slots);
  p->free_slots = NULL;
  p->closed = true;
  s->active--;
  s->nclosed++;
}

/* Ends a set with nothing in flight: published or freed, answered, gone. */
static void set_end(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;
  int64_t ns = gshm__now_ns(CLOCK_MONOTONIC) - s->start_ns;

  if (s->err || set_succeeded(s, ns))
    set_failed(s);
  gshmd_registry_client_remove(cl->reg, s->holder);
  for (size_t i = 0; i < s->n; i++)
    free(s->items[i]);
  free(s->items);
  gshm_list_del(&s->node);
  free(s);
}

/* Closes the finished segments of s, starts the next grants, and ends s
 * when nothing of it is left in flight.  Returns true when s was freed. */
static bool set_reap(struct pull_set *s) {
  for (size_t i = s->first_open; i < s->next_start; i++) {
    struct pull *p = s->items[i];
    if (!p->closed && (p->finished || s->err) && p->inflight == 0 && !p->req_pending)
      item_close(p);
    if (p->closed && i == s->first_open)
      s->first_open++;
  }
  set_start_grants(s);
  if (!s->err)
    set_issue(s);
  if (s->active == 0 && !s->lreq_pending &&
      (s->err || (!s->listing && s->nclosed == s->n))) {
    set_end(s);
    return true;
  }
  return false;
}

void gshmd__pull_reap(struct gshmd_cluster *cl) {
  struct gshm_list *pos, *tmp;
  gshm_list_foreach_safe(pos, tmp, &cl->pulls)
      set_reap(gshm_list_entry(pos, struct pull_set, node));
}

void gshmd__pull_link_lost(struct gshmd_cluster *cl, struct link *l) {
  struct gshm_list *pos, *tmp;
  (void)cl;
  gshm_list_foreach_safe(pos, tmp, &l->pulls) {
    struct pull *p = gshm_list_entry(pos, struct pull, link_node);
    gshm_list_del(&p->link_node);
    p->on_link = false;
    p->link = NULL;
    pull_fail(p, -ECONNRESET,
              "peer '%s' lost mid-pull (%" PRIu64 " of %" PRIu64 " bytes of '%s' read)",
              p->s->peer->name, p->done, p->total, p->remote_name);
  }
}

void gshmd__pull_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    if (s->requester == c) {
      s->requester = NULL;
      set_fail(s, -ECANCELED, "the requesting client went away");
    }
  }
}

void gshmd__pull_stop_all(struct gshmd_cluster *cl) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls)
      set_fail(gshm_list_entry(pos, struct pull_set, node), -ESHUTDOWN, "gshmd is stopping");
}

size_t gshmd__pull_describe(struct gshmd_cluster *cl, Gshm__ClusterPull *out, size_t max) {
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  struct gshm_list *pos;
  size_t n = 0;

  gshm_list_foreach(pos, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    Gshm__ClusterPull *o = &out[n];
    if (n == max)
      break;
    gshm__cluster_pull__init(o);
    o->peer = s->peer->name;
    o->name = s->name;
    o->prefix = s->prefix;
    o->uid = (uint32_t)s->holder->cred.uid;
    o->bytes_done = s->done;
    o->bytes_total = s->total;
    o->segments_done = (uint32_t)s->nclosed;
    o->segments_total = s->listing ? 0 : (uint32_t)s->n;
    o->elapsed_ns = now - s->start_ns;
    n++;
  }
  return n;
}
