/* SPDX-License-Identifier: Apache-2.0 */
/* The reading side of a pull, one segment at a time (its set is
 * pullset.c's): a read grant from the peer, a new hidden local segment
 * owned by the requesting user, pipelined chunk reads whose bytes are
 * received straight into it (every data-moving call of the pull is
 * here), the set's chunk budget (cluster.pull_depth over all its
 * segments), and the grant's release.  docs/CLUSTER.md. */
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
#include "pull.h"
#include "relay.h"
#include "util.h"
#include "wire.h"

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
  struct relay_ask ask;      /* the busy answers to it (a relay's; a link cap's) */
};

__attribute__((format(printf, 4, 0)))
static void set_vfail(struct pull_set *s, int err, bool here, const char *fmt, va_list ap) {
  if (!s->err) {
    s->err = err;
    s->failed_here = here && !s->failed_by;
    vsnprintf(s->why, sizeof(s->why), fmt, ap);
    /* (to the requester's terminal: a peer's refusal in it may hold any byte) */
    gshm__text_clean(s->why);
    /* what is not sent yet is withdrawn; what is sent ends with its answer */
    if (s->lreq_pending && gshmd__link_req_cancel(&s->lreq))
      s->lreq_pending = false;
    for (size_t i = s->first_open; i < s->next_start; i++) {
      struct pull *p = s->items[i];
      if (p->req_pending && gshmd__link_req_cancel(&p->req))
        p->req_pending = false;
      if (p->lsb_job) /* (not made if not started yet) */
        gshmd_stage_job_cancel(p->lsb_job);
    }
  }
  gshmd__link_kick(&s->cl->ll);
}

void gshmd__pull_set_fail(struct pull_set *s, int err, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  set_vfail(s, err, false, fmt, ap);
  va_end(ap);
}

void gshmd__pull_set_fail_here(struct pull_set *s, int err, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  set_vfail(s, err, true, fmt, ap);
  va_end(ap);
}

void gshmd__pull_send_progress(struct pull_set *s) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullProgress pr = GSHM__PULL_PROGRESS__INIT;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);

  if (!s->requester || now - s->last_progress_ns < PROGRESS_NS ||
      (!s->listing && s->done == s->total)) /* the answer comes next */
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

/* The length of p's next chunk. */
static uint64_t next_chunk_len(const struct pull *p) {
  return p->total - p->next_off < p->chunk_size ? p->total - p->next_off : p->chunk_size;
}

/* Whether peer's budget (PEER_READ_BUDGET reads, PEER_BYTES_BUDGET
 * bytes in flight over all pulls) takes p's next chunk; one chunk always
 * goes when nothing is in flight.  Sets that wait for it are asked again
 * by gshmd__pull_reap after each kick. */
static bool peer_budget_left(const struct peer *peer, const struct pull *p) {
  uint64_t len = next_chunk_len(p);
  return peer->reads_inflight < PEER_READ_BUDGET &&
         (peer->bytes_inflight == 0 || peer->bytes_inflight + len <= PEER_BYTES_BUDGET);
}

/* A chunk left every step (err 0: its bytes are in place); here: its
 * failure was this node's own (its memory, its device copy), charged to
 * no peer (pull_fail_here). */
static void chunk_close(struct chunk *c, int err, const char *why, bool here) {
  struct pull *p = c->p;
  struct pull_set *s = p->s;

  p->inflight--;
  s->inflight--;
  p->peer->reads_inflight--;
  p->peer->bytes_inflight -= c->len; /* (other sets waiting for it: the kick's reap) */
  if (p->nslots)
    p->free_slots[p->nfree++] = c->slot;
  if (err && here) {
    pull_fail_here(p, err, "%s", why);
  } else if (err) {
    pull_fail(p, err, "%s", why);
  } else {
    p->done += c->len;
    s->done += c->len;
    gshmd__pull_host_paid(p, c->len);
    gshmd__relay_landed(s->cl, p->seg, c->off, c->len); /* peers reading it meanwhile */
  }
  free(c);
  if (!s->err && p->done == p->total && !gshmd__prefault_all_in(p))
    p->finished = true;
  if (!s->err) {
    gshmd__pull_set_issue(s);
    gshmd__pull_send_progress(s);
  }
  gshmd__link_kick(&s->cl->ll);
}

/* chunk_close; out of memory is always this node's own. */
static void chunk_end(struct chunk *c, int err, const char *why) {
  chunk_close(c, err, why, err == -ENOMEM);
}

static void on_copied(struct stage_copy *sc, int err) {
  chunk_close(sc->arg, err, "copying into the local device segment failed", true);
}

/* The chunk's bytes are where the answer put them: into the local
 * device segment from its slot, or done. */
static void chunk_landed(struct chunk *c) {
  struct pull *p = c->p;

  if (!p->local_staged) {
    chunk_end(c, 0, NULL);
    return;
  }
  if (!p->mem) { /* its device segment could not be made: the set failed */
    chunk_end(c, -ECANCELED, "the pull failed");
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

/* Where p's 2 MiB pages are built as its bytes come (cl->pf_build): the
 * pages c's bytes fall in, built by the lane that receives them before
 * they land (the pages of chunks past those asked for are built ahead on
 * the pool: prefault.c).  A chunk smaller than a page shares it with
 * others, on other lanes: each asks for it before writing, the first
 * builds it, the others find it built (or being built: their writes wait
 * for it); a collapse keeps every byte written meanwhile. */
static void chunk_build(struct chunk *c) {
  const struct pull *p = c->p;
  uint64_t first, end, whole;
  int fd = gshmd_backend_host_memfd(p->mem);

  /* (host memory only: the memfd says so) */
  if (!p->s->cl->pf_build || p->local_staged || !p->dst_mapped || fd < 0)
    return;
  whole = p->mem->size / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;
  first = c->off / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;
  end = (c->off + c->len + GSHMD_HUGE_PAGE - 1) / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;
  if (end > whole)
    end = whole;
  if (first >= end)
    return;
  /* (from data_dest's start: the first page may begin before it) */
  c->req.build_off = first - c->off;
  c->req.build_len = end - first;
  c->req.build_foff = first;
  c->req.build_fd = fd;
}

/* The answer's bytes are in place and authentic, or not. */
static void chunk_data_done(struct peer_req *req, int err) {
  struct chunk *c = req->arg;
  char why[200];

  if (err) {
    const char *what = "connection lost";
    if (err == -EBADMSG) {
      what = "a chunk failed its authentication";
      err = -EPROTO;
    } else if (err == -ENOMEM) {
      what = "out of memory";
    } else if (err == -ETIMEDOUT) { /* (its link's why came first: gshmd__pull_link_lost) */
      what = "its bytes did not come in time";
    } else {
      err = -ECONNRESET;
    }
    snprintf(why, sizeof(why), "receiving from peer '%s' failed: %s", c->p->peer->name, what);
    chunk_end(c, err, why);
    return;
  }
  if (c->req.build_left) /* (its lane's collapse found a page busy) */
    gshmd__prefault_unbuilt(c->p, c->req.build_foff, c->req.build_len);
  chunk_landed(c);
}

/* What p's UCX receives may still write into after their chunks ended
 * (their link failed): p's mapping or local slots, handed over when p
 * lets them go (unmap_local, gshmd__pull_item_close) while a receive
 * runs, released by the last of them (data.c calls back when UCX ends
 * each, however late).  refs: p's own (until its set ends) and one per
 * receive. */
struct pull_hold {
  struct data_hold h;        /* first */
  struct gshmd_cluster *cl;
  void *map;                 /* p's host mapping (backend local_take), map_len bytes */
  uint64_t map_len;
  struct stage_buf *lsb;     /* p's local slots */
};

static void hold_release(struct data_hold *h) {
  struct pull_hold *ph = (struct pull_hold *)h;

  if (ph->map)
    munmap(ph->map, ph->map_len);
  gshmd_stage_free(&ph->cl->stage, ph->lsb);
  free(ph);
}

/* A reference to p's hold for a receive into c's destination (made at
 * the first), or NULL: out of memory. */
static struct data_hold *chunk_hold(struct peer_req *req) {
  struct pull *p = ((struct chunk *)req->arg)->p;

  if (!p->hold && (p->hold = calloc(1, sizeof(*p->hold)))) {
    p->hold->h = (struct data_hold){.refs = 1, .release = hold_release};
    p->hold->cl = p->s->cl;
  }
  if (!p->hold)
    return NULL;
  p->hold->h.refs++;
  return &p->hold->h;
}

/* Whether receives UCX has not ended still write into p's memory. */
static bool held(const struct pull *p) { return p->hold && p->hold->h.refs > 1; }

void gshmd__pull_hold_drop(struct pull *p) {
  if (p->hold)
    gshmd__data_hold_put(&p->hold->h);
  p->hold = NULL;
}

static void on_chunk_answer(struct peer_req *req, int err, const char *why,
                            const Gshm__Cluster__Msg *m) {
  struct chunk *c = req->arg;
  char buf[240];

  (void)m;
  /* a relaying peer that waited for the bytes itself: asked again; so is
   * a peer's link at its read cap (PULL_BUSY_RETRIES) */
  if (err == -EBUSY && c->p->relayed && !c->p->s->err &&
      !(err = gshmd__relay_ask_again(c->p->link, req, &c->ask, &why)))
    return;
  if (err == -EBUSY && !c->p->relayed && !c->p->s->err && c->ask.busy++ < PULL_BUSY_RETRIES &&
      c->p->link && c->p->link->state == LINK_UP) {
    gshmd__link_req_send(c->p->link, req);
    return;
  }
  if (!err) { /* an answer without bytes */
    err = -EPROTO;
    why = "the peer answered a read without the bytes";
  }
  snprintf(buf, sizeof(buf), "peer '%s': %s", c->p->peer->name, why);
  chunk_end(c, err, buf);
}

/* Keeps the set's chunks in flight (cluster.pull_depth a source over
 * the whole set, and no more than p has staging slots) from p: each a
 * Read (or, from a staging peer, a Stage) answered with its bytes. */
static void issue_chunks(struct pull *p) {
  struct pull_set *s = p->s;
  struct link *l = p->link; /* (its reads leave together: gshmd__stream_cork) */

  if (l)
    gshmd__stream_cork(&l->st, true);

  while (!s->err && s->inflight < gshmd__pull_set_depth(s) && p->next_off < p->total &&
         (!p->nslots || p->nfree) && peer_budget_left(p->peer, p)) {
    struct chunk *c = calloc(1, sizeof(*c));
    if (!c) {
      pull_fail_here(p, -ENOMEM, "out of memory");
      break;
    }
    c->p = p;
    c->off = p->next_off;
    c->len = next_chunk_len(p);
    if (p->nslots)
      c->slot = p->free_slots[--p->nfree];
    p->next_off += c->len;
    p->inflight++;
    s->inflight++;
    p->peer->reads_inflight++;
    p->peer->bytes_inflight += c->len;
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
    c->req.data_offset = c->off;
    c->req.data_len = c->len;
    chunk_build(c);
    c->req.data_done = chunk_data_done;
    c->req.data_hold = chunk_hold;
    c->req.arg = c;
    c->req.peer = p->peer;
    if (!p->link) {
      chunk_end(c, -ECONNRESET, "peer lost");
      break;
    }
    gshmd__link_req_send(p->link, &c->req);
  }
  if (l)
    gshmd__stream_cork(&l->st, false);
  gshmd__prefault_add(p); /* (its pages past the chunks just asked for) */
}

/* Chunks for the open segments, oldest first, while the budget lasts. */
void gshmd__pull_set_issue(struct pull_set *s) {
  for (size_t i = gshmd__pull_set_open(s, s->first_open); i < s->next_start && !s->err;
       i = gshmd__pull_set_open(s, i + 1)) {
    struct pull *p = s->items[i];
    if (s->inflight >= gshmd__pull_set_depth(s))
      break;
    /* (the bytes' budget is checked per chunk; into local slots: once
     * they are made) */
    if (p->granted && !p->closed && !p->finished && p->total && !p->lsb_job &&
        p->peer->reads_inflight < PEER_READ_BUDGET)
      issue_chunks(p);
  }
  gshmd__link_kick(&s->cl->ll);
}

/* Where a segment of the set goes here: the location asked for (a set's
 * applies to its device segments; host ones, such as a published
 * model's manifest, stay on the host), else where it is on the peer. */
static void local_location(struct pull *p, bool remote_device) {
  if (!p->location[0] || (p->s->prefix && !remote_device))
    snprintf(p->location, sizeof(p->location), "%s", remote_device ? "cuda:0" : "host");
}

bool gshmd__pull_lands_on_device(struct pull *p, bool remote_device) {
  local_location(p, remote_device);
  return gshmd__pull_location_device(p->location);
}

/* p's copy's source is src (gshmd__pull_source_text's). */
static void set_source_text(struct pull *p, const char *src) {
  free(p->seg->source);
  p->seg->source = strdup(src);
}

/* Maps p's new host segment for the chunks to land in (the host
 * backend's own mapping: memory it recycled is mapped already), once.
 * Made when the segment is: a set's at its listing, before any byte
 * comes, and unmapped at its end (gshmd__pull_set_unmap), because
 * mapping and unmapping take the mmap lock that a lane's page fault may
 * wait for; one that did so at each segment's grant and close left a
 * 398-tensor model's 4 KiB pages at a quarter of their speed
 * (docs/PERFORMANCE.md "What a set of small segments waits on").  Past
 * PULL_MAPS_AHEAD of them (all sets), at its grant, unmapped at its
 * close.  Returns 0 or the backend's negative errno. */
static int map_local(struct pull *p) {
  struct gshmd_alloc *mem = p->seg->mem;
  int e;

  if (p->dst_mapped || mem->device_index >= 0)
    return 0; /* (device: written by copies from the local slots) */
  if ((e = mem->backend->ops->local_ptr ? mem->backend->ops->local_ptr(mem->backend, mem, &p->dst)
                                        : -ENOTSUP))
    return e;
  p->mem = mem;
  p->dst_mapped = true;
  return 0;
}

/* p's mapping goes (the backend keeps it if it may recycle the memory),
 * or to p's hold while UCX receives may still write there. */
static void unmap_local(struct pull *p) {
  const struct gshmd_backend_ops *ops = p->dst_mapped ? p->mem->backend->ops : NULL;

  if (ops && held(p) && ops->local_take && !p->hold->map) {
    p->hold->map = ops->local_take(p->mem->backend, p->mem);
    p->hold->map_len = p->mem->size;
  } else if (ops && ops->local_done) {
    ops->local_done(p->mem->backend, p->mem);
  }
  if (p->dst_mapped && p->mapped_ahead)
    p->s->cl->pull_maps_ahead--;
  p->dst_mapped = p->mapped_ahead = false;
}

void gshmd__pull_set_unmap(struct pull_set *s) {
  for (size_t i = 0; i < s->n; i++)
    unmap_local(s->items[i]);
}

int gshmd__pull_item_create(struct pull *p, uint64_t size, bool remote_device, const char *source) {
  struct gshmd_cluster *cl = p->s->cl;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  const char *msg = NULL;
  int e;

  local_location(p, remote_device);
  if (!gshmd__pull_location_device(p->location) && (e = gshmd__pull_host_room(p, size)))
    return e;
  cr.name = p->local_name;
  cr.size = size;
  cr.location = p->location;
  cr.mode = p->s->mode;
  if ((e = gshmd_registry_create_hidden(cl->reg, p->s->holder, &cr, &p->seg, &msg))) {
    pull_fail_here(p, e, "cannot create '%s': %s", p->local_name, msg ? msg : gshm__strerror(e));
    return e;
  }
  set_source_text(p, source); /* (a peer relaying it shows it) */
  if ((e = gshmd__relay_new(cl, p)) ||
      (cl->pull_maps_ahead < PULL_MAPS_AHEAD && (e = map_local(p)))) {
    pull_fail_here(p, e, e == -ENOMEM ? "out of memory" : "cannot map the new segment");
    return e;
  }
  if (p->dst_mapped) {
    p->mapped_ahead = true;
    cl->pull_maps_ahead++;
    if (!p->granted) /* (at a grant, once its first chunks are asked for) */
      gshmd__prefault_add(p);
  }
  return 0;
}

int gshmd__pull_item_create_listed(struct pull *p) {
  int e;

  p->create_listed = false;
  p->s->to_create--;
  e = gshmd__pull_item_create(p, p->listed, p->listed_device, p->listed_source);
  free(p->listed_source);
  p->listed_source = NULL;
  return e;
}

/* The new local segment (made now, as listed or as granted, or since
 * its listing), mapped for the chunks to land in. */
static int make_local(struct pull *p, const Gshm__Cluster__Segment *s) {
  struct gshmd_alloc *mem;
  char src[400];
  int e;

  if (p->create_listed && (e = gshmd__pull_item_create_listed(p)))
    return e;
  if (!p->seg) {
    gshmd__pull_source_text(p, s, src, sizeof(src));
    if ((e = gshmd__pull_item_create(p, s->size, gshmd__pull_location_device(s->location), src)))
      return e;
  }
  if (p->seg->requested_size != s->size || (p->seg->mem->device_index >= 0) != p->local_staged) {
    pull_fail(p, -ESTALE, "segment '%s' of peer '%s' changed since it was listed", p->remote_name,
              p->peer->name);
    return -ESTALE;
  }
  /* (its source, the fd store's record at publish, is the grant's: made
   * from it here, or from the listing that gshmd__pull_grant_is_listed matched) */
  mem = p->mem = p->seg->mem;
  if (mem->device_index >= 0)
    return 0; /* written by copies from the local slots */
  if ((e = map_local(p))) {
    pull_fail_here(p, e, "cannot map the new segment");
    return e;
  }
  /* bytes over UCX land through its registration cache: the mapping
   * must go with the pull (backend.h no_recycle) */
  if (p->link && p->link->ucx)
    mem->no_recycle = true;
  return 0;
}

const char *gshmd__pull_path_name(Gshm__Cluster__Path path) {
  switch (path) {
  case GSHM__CLUSTER__PATH__PATH_HOST: return "host";
  case GSHM__CLUSTER__PATH__PATH_DIRECT: return "direct";
  case GSHM__CLUSTER__PATH__PATH_STAGED: return "staged";
  default: return "none";
  }
}

const char *gshmd__pull_segment_bad(const struct gshmd_cluster *cl,
                                    const Gshm__Cluster__Segment *seg) {
  uint64_t max = cl->cfg->max_segment_size ? cl->cfg->max_segment_size : PULL_SIZE_MAX;
  struct gshm_location loc;

  if (gshm__name_check(seg->name, 255))
    return "a malformed name";
  if (seg->size == 0 || seg->size > max)
    return seg->size ? "a size beyond this node's limits" : "a size of 0";
  if (gshm__location_parse(seg->location, &loc))
    return "a malformed location";
  return NULL;
}

/* The peer answered the grant request: set up and start reading. */
void gshmd__pull_grant_done(struct peer_req *req, int err, const char *why,
                       const Gshm__Cluster__Msg *m) {
  struct pull *p = req->arg;
  struct pull_set *s = p->s;
  const Gshm__Cluster__Grant *g;

  p->req_pending = false;
  /* (busy: the lister's refusal waits; another source's passes it over,
   * as any of its refusals: a busy one chosen again for its few bytes
   * open would be asked and refuse in a loop) */
  if (err == -EBUSY && p->src == 0 && !s->err && gshmd__pull_grant_later(p))
    return;
  if (!err)
    s->busy_since_ns = s->retry_ns = 0;
  if (err && p->src && !s->err) { /* (not the lister: the others may serve it) */
    char msg[GSHMD_PEER_ERROR_LEN];
    gshmd__pull_grant_elsewhere(p, req->answered,
                                gshmd__peer_error(req, err, m, why, msg, sizeof(msg)));
    return;
  }
  if (err) {
    char msg[GSHMD_PEER_ERROR_LEN];
    pull_fail(p, err, "%s", gshmd__peer_error(req, err, m, why, msg, sizeof(msg)));
    return;
  }
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_GRANT || !m->grant->segment) {
    pull_fail(p, -EPROTO, "peer '%s' answered a grant request with something else",
              p->peer->name);
    return;
  }
  g = m->grant;
  /* the peer's word becomes a local segment's size and source: the one asked for and
   * sane, else the set fails and goes on: the grant is taken below to go back (s->err) */
  if ((why = gshmd__pull_segment_bad(s->cl, g->segment)) ||
      strcmp(g->segment->name, p->remote_name)) {
    pull_fail(p, -EPROTO, "peer '%s' granted '%s' with %s", p->peer->name, p->remote_name,
              why ? why : "another segment's name");
  }
  p->granted = true;
  p->grant_id = g->grant_id;
  p->remote_id = g->segment->id;
  p->remote_gen = g->segment->generation;
  p->relayed = g->segment->in_flight;
  p->path = g->path;
  p->link = p->peer->out;
  if (p->link) {
    gshm_list_add_tail(&p->link->pulls, &p->link_node);
    p->on_link = true;
  }
  if (s->err) /* the set failed while we waited: the grant goes back */
    return;
  if (!p->link) {
    pull_fail(p, -ECONNRESET, "peer '%s' lost", p->peer->name);
    return;
  }
  if (!gshmd__pull_grant_is_listed(p, g->segment)) {
    gshmd__pull_grant_not_listed(p);
    return;
  }
  if (!gshmd__pull_upstream_take(p, g))
    return;
  if (gshmd__pull_choose_path(p, g) || gshmd__pull_setup_slots(p, g))
    return;
  p->total = g->segment->size;
  s->total += p->total - p->listed; /* the grant's size, not the listing's */
  /* Into device memory, the first chunks go out before its segment is
   * made: they land in the pinned slots (the lanes need nothing of the
   * loop for that) while this loop makes it (cuMemCreate, map, export:
   * about 0.9 ms for 64 MiB on the lent H200 machine, where a staged 64
   * MiB pull took 5.6 ms), and their copies start once it is there. */
  if (p->local_staged)
    gshmd__pull_set_issue(s);
  if (make_local(p, g->segment))
    return;
  gshm_log_info("cluster: pulling '%s' from peer '%s' into '%s' at %s: %" PRIu64
                " bytes, path %s (%s)",
                p->remote_name, p->peer->name, p->local_name, p->location, p->total,
                gshmd__pull_path_name(p->path), p->path_reason);
  gshmd__pull_set_issue(s);
}

/* A segment has nothing in flight and is done (or its set failed): the
 * grant is owed back, the slots go, and its mapping unless made at the
 * listing; the hidden segment stays with the set. */
void gshmd__pull_item_close(struct pull *p) {
  struct pull_set *s = p->s;
  struct gshmd_cluster *cl = s->cl;

  p->release_owed = true;
  if (p->on_link)
    gshm_list_del(&p->link_node);
  p->on_link = false;
  gshmd__pull_host_paid(p, UINT64_MAX);
  gshmd__prefault_forget(p);
  if (!p->mapped_ahead)
    unmap_local(p); /* (one made at its grant: PULL_MAPS_AHEAD were already) */
  if (held(p) && !p->hold->lsb) /* (UCX may still write into its slots) */
    p->hold->lsb = p->lsb;
  else
    gshmd_stage_free(&cl->stage, p->lsb);
  p->lsb = NULL;
  gshmd__pull_unpin(p);
  free(p->free_slots);
  p->free_slots = NULL;
  p->closed = true;
  p->skip_to = p->index + 1;
  /* (one a busy peer refused waits unstarted: grants.c counted it off,
   * and a set that fails closes it too) */
  if (p->started)
    gshmd__pull_grant_off(p);
  s->nclosed++;
}

void gshmd__pull_link_lost(struct gshmd_cluster *cl, struct link *l, int err, const char *why) {
  struct gshm_list *pos, *tmp;
  (void)cl;
  /* a peer that stopped midway or broke the protocol says so; any other
   * end of the link is a lost peer */
  if (err != -ETIMEDOUT && err != -EPROTO)
    err = -ECONNRESET;
  gshm_list_foreach_safe(pos, tmp, &l->pulls) {
    struct pull *p = gshm_list_entry(pos, struct pull, link_node);
    gshm_list_del(&p->link_node);
    p->on_link = false;
    p->link = NULL;
    pull_fail(p, err,
              "peer '%s' lost mid-pull: %s; %" PRIu64 " of %" PRIu64 " bytes of '%s' read",
              p->peer->name, why, p->done, p->total, p->remote_name);
  }
}

