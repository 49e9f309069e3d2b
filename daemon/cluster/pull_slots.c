/* SPDX-License-Identifier: Apache-2.0 */
/* Where a granted segment's bytes go (pull.h): the path on each side,
 * the chunk size, and the staging slots, those of this node made on
 * libuv's pool while the pull's other segments move (pinning 128 MiB
 * took 22-64 ms: never on the loop). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "pull.h"
#include "registry.h"
#include "stage.h"

/* p's slot table: the fewer of the peer's slots and its own.  Returns 0
 * or -ENOMEM (the pull failed). */
static int slots_ready(struct pull *p) {
  if (p->lsb && (!p->nslots || p->lsb->slots < p->nslots))
    p->nslots = p->lsb->slots;
  if (!p->nslots)
    return 0;
  if (!(p->free_slots = calloc(p->nslots, sizeof(*p->free_slots)))) {
    pull_fail_here(p, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < p->nslots; i++)
    p->free_slots[p->nfree++] = p->nslots - 1 - i;
  return 0;
}

/* p's local slots were made (or not: err): its chunks go, or the slots
 * go back when its set failed meanwhile (it closes once they are
 * back: set_reap). */
static void on_local_slots(void *arg, int err, struct stage_buf *sb) {
  struct pull *p = arg;
  struct pull_set *s = p->s;

  p->lsb_job = NULL;
  if (err || s->err) {
    gshmd_stage_free(&s->cl->stage, sb);
    if (err)
      pull_fail_here(p, err, "cannot set up the local staging buffer");
  } else {
    p->lsb = sb;
    if (!slots_ready(p))
      gshmd__pull_set_issue(s);
  }
  gshmd__link_kick(&s->cl->ll);
}

/* Decides where the bytes go on each side and says why (the pull's
 * path and path_reason).  Returns 0 or a negative errno (the pull failed). */
int gshmd__pull_choose_path(struct pull *p, const Gshm__Cluster__Grant *g) {
  struct gshm_location loc;
  char via[96];
  bool remote_device = strcmp(g->segment->location, "host") != 0;

  (void)gshmd__pull_lands_on_device(p, remote_device); /* (p->location) */
  if (gshm__location_parse(p->location, &loc)) {
    pull_fail_here(p, -EINVAL, "bad location '%s'", p->location);
    return -EINVAL;
  }
  p->remote_staged = g->path == GSHM__CLUSTER__PATH__PATH_STAGED;
  /* the streams write host memory: a device segment fills from slots */
  p->local_staged = loc.kind != GSHM_LOCATION_HOST;
  if (p->local_staged && !p->s->cl->reg->cuda) {
    pull_fail_here(p, -ENOTSUP, "this node has no CUDA backend for location '%s'", p->location);
    return -ENOTSUP;
  }
  if (p->link->ucx)
    snprintf(via, sizeof(via), "UCX (transports %.60s)", p->s->cl->ll.ucx_tls);
  else if (p->link->nlanes)
    snprintf(via, sizeof(via), "gshm's TCP stream and %u data lanes, %s", p->link->nlanes,
             gshmd__stream_mode_name(p->link->st.mode_rx));
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
int gshmd__pull_setup_slots(struct pull *p, const Gshm__Cluster__Grant *g) {
  struct stage_pool *stage;
  int e;

  p->chunk_size = p->s->cl->cfg->cluster_pull_chunk;
  if (p->remote_staged) {
    if (!gshmd_stage_grant_ok(g->slots, g->slot_size, g->length)) {
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
  } else if (p->link && p->link->nlanes > 1 && p->s->n == 1) {
    /* A chunk moves on one lane at one connection's speed: a pull of one
     * segment of fewer than two chunks a lane goes in smaller ones, so
     * that every lane carries some (8 MiB over 8 lanes: 0.47x eight plain
     * connections in 4 MiB chunks, 0.96x in 1 MiB ones on the lent
     * 16-core machine; docs/PERFORMANCE.md "Lane threads tag as they
     * copy").  Not below PULL_CHUNK_MIN: each chunk is a request.  A set
     * keeps its lanes busy with other segments: there smaller chunks only
     * cost requests (a 398-tensor model 0.185 -> 0.388 s when they were
     * split too). */
    uint64_t per = (g->length + 2ull * p->link->nlanes - 1) / (2ull * p->link->nlanes);
    per = (per + PULL_CHUNK_ALIGN - 1) & ~(uint64_t)(PULL_CHUNK_ALIGN - 1);
    if (per < PULL_CHUNK_MIN)
      per = PULL_CHUNK_MIN;
    if (per < p->chunk_size)
      p->chunk_size = per;
  }
  if (!p->local_staged)
    return slots_ready(p);
  stage = &p->s->cl->stage;
  if (!p->pinned) /* (not counted before its grant: a single pull's location followed the peer's) */
    gshmd__pull_pin(p, gshmd_stage_buf_len(stage, p->chunk_size, g->segment->size));
  e = gshmd_stage_buf_get(stage, p->chunk_size, g->segment->size, p->link->ucx, on_local_slots, p,
                          &p->lsb, &p->lsb_job);
  if (e < 0) {
    pull_fail_here(p, e, "cannot set up the local staging buffer");
    return e;
  }
  return e == 0 ? slots_ready(p) : 0; /* (else its chunks wait for on_local_slots) */
}

