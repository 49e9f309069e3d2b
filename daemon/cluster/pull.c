/* SPDX-License-Identifier: Apache-2.0 */
/* The reading side of a pull: a read grant from the peer, a new local
 * segment owned by the requesting user, pipelined chunk reads whose bytes
 * are received straight into it, progress replies to the requester, and
 * on any failure the partial segment removed (docs/CLUSTER.md). */
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

struct pull;

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

struct pull {
  struct gshm_list node;      /* cl->pulls */
  struct gshm_list link_node; /* link->pulls, once granted */
  struct gshmd_cluster *cl;
  struct peer *peer;
  struct link *link;          /* the link the grant came on; NULL when lost */
  struct gshmd_client *requester; /* NULL once gone */
  uint32_t request_id;
  struct gshmd_client *holder; /* internal client with the requester's cred */
  struct gshmd_lease *lease;  /* holder's lease on the new segment */
  struct peer_req req;
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__GrantRequest greq;
  char remote_name[256];
  char local_name[256];
  char location[GSHM_LOCATION_MAX];
  uint32_t mode;
  bool granted, finished, on_link;
  uint64_t grant_id, remote_id, remote_gen;
  Gshm__Cluster__Path path;
  char path_reason[160];
  uint64_t total, next_off, done;
  unsigned inflight;             /* chunks in any step */
  bool remote_staged, local_staged;
  uint64_t chunk_size;
  uint32_t nslots, nfree;
  uint32_t *free_slots;
  struct stage_buf *lsb;         /* local slots (local_staged) */
  struct gshmd_alloc *mem;       /* the new segment's memory */
  void *dst;                     /* where gets land without staging */
  size_t dst_len;
  bool dst_mapped;               /* dst is our mmap of a host segment */
  int64_t start_ns, last_progress_ns;
  int err;
  char why[256];
};

static void pull_fail(struct pull *p, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pull_fail(struct pull *p, int err, const char *fmt, ...) {
  va_list ap;

  if (!p->err) {
    p->err = err;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof(p->why), fmt, ap);
    va_end(ap);
  }
  if (p->inflight == 0 && !p->req.queued)
    p->finished = true;
  gshmd__link_kick(&p->cl->ll);
}

static void send_progress(struct pull *p) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullProgress pr = GSHM__PULL_PROGRESS__INIT;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);

  if (!p->requester || now - p->last_progress_ns < PROGRESS_NS)
    return;
  p->last_progress_ns = now;
  pr.bytes_done = p->done;
  pr.bytes_total = p->total;
  pr.elapsed_ns = now - p->start_ns;
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_PROGRESS;
  reply.pull_progress = &pr;
  p->cl->reply(p->cl->reply_arg, p->requester, GSHM_WIRE_PULL, p->request_id, &reply);
}

static void issue_chunks(struct pull *p);

/* A chunk left every step (err 0: its bytes are in place). */
static void chunk_end(struct chunk *c, int err, const char *why) {
  struct pull *p = c->p;

  p->inflight--;
  if (p->nslots)
    p->free_slots[p->nfree++] = c->slot;
  if (err)
    pull_fail(p, err, "%s", why);
  else
    p->done += c->len;
  free(c);
  if (p->err) {
    if (p->inflight == 0 && !p->req.queued)
      p->finished = true;
    gshmd__link_kick(&p->cl->ll);
    return;
  }
  issue_chunks(p);
  send_progress(p);
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
  if (gshmd_stage_copy(&p->cl->stage, &c->sc))
    chunk_end(c, -ENOMEM, "out of memory");
}

/* Where the answer's bytes go: straight into the new segment, or into
 * the chunk's local slot.  NULL when they are not the chunk's. */
static void *chunk_dest(struct peer_req *req, uint64_t offset, uint64_t len) {
  struct chunk *c = req->arg;
  struct pull *p = c->p;

  if (offset != c->off || len != c->len)
    return NULL;
  return p->local_staged ? (uint8_t *)p->lsb->addr + (uint64_t)c->slot * p->lsb->slot_size
                         : (uint8_t *)p->dst + c->off;
}

/* The answer's bytes are in place and authentic, or not. */
static void chunk_data_done(struct peer_req *req, int err) {
  struct chunk *c = req->arg;
  char why[200];

  if (err) {
    snprintf(why, sizeof(why), "receiving from peer '%s' failed: %s", c->p->peer->name,
             err == -EBADMSG ? "a chunk failed its authentication" : "connection lost");
    chunk_end(c, err == -EBADMSG ? -EPROTO : -ECONNRESET, why);
    return;
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
  snprintf(buf, sizeof(buf), "peer '%s': %s", c->p->peer->name, why);
  chunk_end(c, err, buf);
}

/* Keeps cluster.pull_depth chunks in flight (and no more than there are
 * staging slots): each a Read (or, from a staging peer, a Stage) answered
 * with its bytes. */
static void issue_chunks(struct pull *p) {
  struct gshmd_cluster *cl = p->cl;

  while (!p->err && p->inflight < cl->cfg->cluster_pull_depth && p->next_off < p->total &&
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
    c->req.data_dest = chunk_dest;
    c->req.data_done = chunk_data_done;
    c->req.arg = c;
    c->req.peer = p->peer;
    if (!p->link) {
      chunk_end(c, -ECONNRESET, "peer lost");
      break;
    }
    gshmd__link_req_send(p->link, &c->req);
  }
  if (!p->err && p->done == p->total && p->inflight == 0)
    p->finished = true;
  gshmd__link_kick(&cl->ll);
}

/* The new local segment, mapped for the chunks to land in. */
static int make_local(struct pull *p, const Gshm__Cluster__Segment *s) {
  struct gshmd_cluster *cl = p->cl;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  struct gshmd_alloc *mem;
  const char *msg = NULL;
  char src[400];
  int e, fd;

  cr.name = p->local_name;
  cr.size = s->size;
  cr.location = p->location;
  cr.mode = p->mode;
  if ((e = gshmd_registry_create(cl->reg, p->holder, &cr, &p->lease, &msg))) {
    pull_fail(p, e, "cannot create '%s': %s", p->local_name, msg ? msg : gshm__strerror(e));
    return e;
  }
  snprintf(src, sizeof(src), "%s:%s#%" PRIu64 ".%" PRIu64, p->peer->name, s->name, s->id,
           s->generation);
  p->lease->seg->source = strdup(src);
  /* the fd store's record of the segment says where it came from */
  if (cl->reg->on_event)
    cl->reg->on_event(cl->reg, p->lease->seg, GSHMD_SEGMENT_CHANGED);
  mem = p->mem = p->lease->seg->mem;
  if (mem->device_index >= 0)
    return 0; /* written by copies from the local slots */
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
  char via[96];
  bool remote_device = strcmp(g->segment->location, "host") != 0;

  if (!p->location[0])
    snprintf(p->location, sizeof(p->location), "%s", remote_device ? "cuda:0" : "host");
  if (gshm__location_parse(p->location, &loc)) {
    pull_fail(p, -EINVAL, "bad location '%s'", p->location);
    return -EINVAL;
  }
  p->remote_staged = g->path == GSHM__CLUSTER__PATH__PATH_STAGED;
  /* the streams write host memory: a device segment fills from slots */
  p->local_staged = loc.kind != GSHM_LOCATION_HOST;
  if (p->local_staged && !p->cl->reg->cuda) {
    pull_fail(p, -ENOTSUP, "this node has no CUDA backend for location '%s'", p->location);
    return -ENOTSUP;
  }
  if (p->link->ucx)
    snprintf(via, sizeof(via), "UCX (transports %.60s)", p->cl->ll.ucx_tls);
  else
    snprintf(via, sizeof(via), "gshm's TCP stream, %s",
             gshmd__stream_mode_name(p->link->st.mode_rx));
  snprintf(p->path_reason, sizeof(p->path_reason), "%.72s; over %.80s",
           p->remote_staged && p->local_staged
               ? "staged through pinned host slots on both nodes"
           : p->remote_staged ? (remote_device ? "device segment staged through pinned host "
                                                 "slots on the peer"
                                               : "staged through pinned host slots on the peer "
                                                 "(cluster.staging = always)")
           : p->local_staged ? "into device memory through pinned host slots here"
                             : "host segment, sent from the peer's mapping",
           via);
  if (p->remote_staged || p->local_staged)
    p->path = GSHM__CLUSTER__PATH__PATH_STAGED;
  return 0;
}

/* The chunk size and the staging slots of both sides.  Returns 0 or a
 * negative errno (the pull failed). */
static int setup_slots(struct pull *p, const Gshm__Cluster__Grant *g) {
  int e;

  p->chunk_size = p->cl->cfg->cluster_pull_chunk;
  if (p->remote_staged) {
    if (!g->slots || !g->slot_size || g->length < (uint64_t)g->slots * g->slot_size) {
      pull_fail(p, -EPROTO, "peer '%s' granted malformed staging slots", p->peer->name);
      return -EPROTO;
    }
    p->nslots = g->slots;
    if (g->slot_size < p->chunk_size)
      p->chunk_size = g->slot_size;
  } else if (g->length < g->segment->size) {
    pull_fail(p, -EPROTO, "peer '%s' granted %" PRIu64 " of %" PRIu64 " bytes", p->peer->name,
              g->length, g->segment->size);
    return -EPROTO;
  }
  if (p->local_staged) {
    if ((e = gshmd_stage_buf_new(&p->cl->stage, p->chunk_size, false, &p->lsb))) {
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

/* The peer answered the grant request: set up and start reading. */
static void grant_done(struct peer_req *req, int err, const char *why,
                       const Gshm__Cluster__Msg *m) {
  struct pull *p = req->arg;
  const Gshm__Cluster__Grant *g;

  if (err) {
    pull_fail(p, err, "peer '%s': %s", p->peer->name, why);
    return;
  }
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_GRANT || !m->grant->segment) {
    pull_fail(p, -EPROTO, "peer '%s' answered a grant request with something else",
              p->peer->name);
    return;
  }
  g = m->grant;
  p->granted = true;
  p->grant_id = g->grant_id;
  p->remote_id = g->segment->id;
  p->remote_gen = g->segment->generation;
  p->path = g->path;
  p->link = p->peer->out;
  if (p->link) {
    gshm_list_add_tail(&p->link->pulls, &p->link_node);
    p->on_link = true;
  }
  if (p->err) { /* the requester left while we waited: give the grant back */
    p->finished = true;
    return;
  }
  if (!p->link) {
    pull_fail(p, -ECONNRESET, "peer '%s' lost", p->peer->name);
    return;
  }
  if (choose_path(p, g) || setup_slots(p, g) || make_local(p, g->segment))
    return;
  p->total = g->segment->size;
  gshm_log_info("cluster: pulling '%s' from peer '%s' into '%s' at %s: %" PRIu64
                " bytes, path %s (%s)",
                p->remote_name, p->peer->name, p->local_name, p->location, p->total,
                path_name(p->path), p->path_reason);
  issue_chunks(p);
}

int gshmd__pull_start(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                      const Gshm__PullRequest *m, const char **msg_out) {
  struct peer *peer = gshmd__link_peer_find(&cl->ll, m->peer);
  const char *local = m->local_name && *m->local_name ? m->local_name : m->name;
  struct gshm_location loc;
  struct pull *p;
  int e;

  if (!peer) {
    *msg_out = "no such peer in cluster.peers";
    return -ENOENT;
  }
  if ((e = gshm__name_check(m->name, 255)) || (e = gshm__name_check(local, cl->cfg->max_name))) {
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
  if (gshmd_registry_find_name(cl->reg, local)) {
    *msg_out = "a local segment of that name exists";
    return -EEXIST;
  }
  if (!(p = calloc(1, sizeof(*p))))
    return -ENOMEM;
  if ((e = gshmd_registry_client_add(cl->reg, &c->cred, &p->holder))) {
    free(p);
    return e;
  }
  snprintf(p->holder->name, sizeof(p->holder->name), "pull:%.58s", peer->name);
  p->cl = cl;
  p->peer = peer;
  p->requester = c;
  p->request_id = request_id;
  snprintf(p->remote_name, sizeof(p->remote_name), "%s", m->name);
  snprintf(p->local_name, sizeof(p->local_name), "%s", local);
  snprintf(p->location, sizeof(p->location), "%s", m->location ? m->location : "");
  p->mode = m->mode;
  p->start_ns = p->last_progress_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshm__cluster__msg__init(&p->msg);
  gshm__cluster__grant_request__init(&p->greq);
  p->greq.name = p->remote_name;
  p->msg.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  p->msg.grant_request = &p->greq;
  p->req.msg = &p->msg;
  p->req.done = grant_done;
  p->req.arg = p;
  gshm_list_add_tail(&cl->pulls, &p->node);
  gshm_log_info("cluster: uid %u pid %d asks to pull '%s' from peer '%s' as '%s'",
                (unsigned)c->cred.uid, (int)c->cred.pid, p->remote_name, peer->name,
                p->local_name);
  gshmd__link_req_submit(&cl->ll, peer, &p->req);
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

/* A pull got every byte: the requester gets its result. */
static void pull_succeeded(struct pull *p, int64_t ns) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullResult res = GSHM__PULL_RESULT__INIT;
  Gshm__SegmentInfo info;
  char sz[32];
  double gbs = ns > 0 ? (double)p->total / (double)ns : 0;

  p->peer->pulls_ok++;
  if (p->path == GSHM__CLUSTER__PATH__PATH_HOST)
    p->peer->bytes_host += p->total;
  else if (p->path == GSHM__CLUSTER__PATH__PATH_STAGED)
    p->peer->bytes_staged += p->total;
  else
    p->peer->bytes_direct += p->total;
  gshm_log_info("cluster: pulled '%s' from peer '%s' into '%s': %s in %.3f s (%.2f GB/s), "
                "path %s: %s",
                p->remote_name, p->peer->name, p->local_name,
                gshm__format_size(p->total, sz, sizeof(sz)), (double)ns / 1e9, gbs,
                path_name(p->path), p->path_reason);
  gshmd_segment_to_info(p->lease->seg, &info);
  res.segment = &info;
  res.bytes = p->total;
  res.elapsed_ns = ns;
  res.path = (char *)path_name(p->path);
  res.path_reason = p->path_reason;
  res.peer = p->peer->name;
  res.remote_id = p->remote_id;
  res.remote_generation = p->remote_gen;
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_RESULT;
  reply.pull_result = &res;
  if (p->requester)
    p->cl->reply(p->cl->reply_arg, p->requester, GSHM_WIRE_PULL, p->request_id, &reply);
}

/* A pull failed: the partial segment goes, the requester gets why. */
static void pull_failed(struct pull *p) {
  struct gshmd_cluster *cl = p->cl;
  Gshm__Reply reply = GSHM__REPLY__INIT;
  const char *msg;

  p->peer->pulls_failed++;
  cl->pull_errors[gshmd__pull_failure(p->err)]++;
  /* The partial segment goes, if the name is still ours. */
  if (p->lease && !p->lease->seg->unlinked &&
      gshmd_registry_find_name(cl->reg, p->local_name) == p->lease->seg)
    gshmd_registry_unlink(cl->reg, p->holder, p->local_name, &msg);
  gshm_log_warn("cluster: pull of '%s' from peer '%s' failed: %s", p->remote_name,
                p->peer->name, p->why);
  if (p->requester) {
    reply.status = gshm__errno_to_status(p->err);
    reply.message = p->why;
    cl->reply(cl->reply_arg, p->requester, GSHM_WIRE_PULL, p->request_id, &reply);
  }
}

/* Ends a finished pull: the grant goes back, the segment stays (success)
 * or goes (failure), the requester gets its answer. */
static void pull_end(struct pull *p) {
  struct gshmd_cluster *cl = p->cl;
  int64_t ns = gshm__now_ns(CLOCK_MONOTONIC) - p->start_ns;

  gshmd__link_req_cancel(&p->req);
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
  if (p->dst_mapped)
    munmap(p->dst, p->dst_len);
  gshmd_stage_free(&cl->stage, p->lsb);
  free(p->free_slots);
  if (!p->err)
    pull_succeeded(p, ns);
  else
    pull_failed(p);
  gshmd_registry_client_remove(cl->reg, p->holder); /* ends the lease */
  gshm_list_del(&p->node);
  free(p);
}

void gshmd__pull_reap(struct gshmd_cluster *cl) {
  struct gshm_list *pos, *tmp;
  gshm_list_foreach_safe(pos, tmp, &cl->pulls) {
    struct pull *p = gshm_list_entry(pos, struct pull, node);
    if (p->finished && p->inflight == 0)
      pull_end(p);
  }
}

void gshmd__pull_link_lost(struct gshmd_cluster *cl, struct link *l) {
  struct gshm_list *pos, *tmp;
  (void)cl;
  gshm_list_foreach_safe(pos, tmp, &l->pulls) {
    struct pull *p = gshm_list_entry(pos, struct pull, link_node);
    gshm_list_del(&p->link_node);
    p->on_link = false;
    p->link = NULL;
    pull_fail(p, -ECONNRESET, "peer '%s' lost mid-pull (%" PRIu64 " of %" PRIu64 " bytes read)",
              p->peer->name, p->done, p->total);
  }
}

void gshmd__pull_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls) {
    struct pull *p = gshm_list_entry(pos, struct pull, node);
    if (p->requester == c) {
      p->requester = NULL;
      gshmd__link_req_cancel(&p->req); /* sent: its answer ends the pull */
      pull_fail(p, -ECANCELED, "the requesting client went away");
    }
  }
}

void gshmd__pull_stop_all(struct gshmd_cluster *cl) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls) {
    struct pull *p = gshm_list_entry(pos, struct pull, node);
    gshmd__link_req_cancel(&p->req);
    pull_fail(p, -ESHUTDOWN, "gshmd is stopping");
  }
}
