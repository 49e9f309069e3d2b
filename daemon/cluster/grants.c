/* SPDX-License-Identifier: Apache-2.0 */
/* A set's grants, paced (pull.h): GRANTS_AHEAD segments asked at once,
 * fewer while a busy peer refuses, and the node's pulls into GPUs held
 * to PULL_PINNED_FULL staging_bytes of pinned slots; and their Releases. */
#include "pull.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "stage.h"
#include "util.h"

/* What p counts in its source's open bytes: its size as listed (a
 * single pull's, unknown before its grant, counts 1). */
static uint64_t open_cost(const struct pull *p) { return p->listed ? p->listed : 1; }

/* Asks grants for the next segments (those a busy peer refused first)
 * while fewer than s->window are open, this node's sets hold or ask
 * fewer than LINK_MAX_GRANTS of the peer (its cap: more would be refused
 * busy), and the node's pulls into GPUs hold less than PULL_PINNED_FULL
 * staging_bytes of pinned slots with the next one's (one always goes;
 * gshmd__pull_reap asks again after each close, of any set).  Run
 * outside UCX callbacks. */

void gshmd__pull_set_start_grants(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;
  int k;

  if (!s->active && s->retry_ns && gshm__now_ns(CLOCK_MONOTONIC) < s->retry_ns)
    return; /* (refused busy with nothing open: a moment first) */
  while (!s->err && s->active < s->window && (s->retry || s->next_start < s->n)) {
    struct pull *p = s->retry ? s->retry : s->items[s->next_start];
    if ((k = gshmd__pull_source_pick(s, p)) < 0) {
      cl->grants_held_back = true; /* (gshmd__pull_reap asks again) */
      break;
    }
    uint64_t pin = gshmd__pull_pin_need(p);
    if (pin && cl->pull_pinned &&
        cl->pull_pinned + pin > PULL_PINNED_FULL * cl->stage.staging_bytes)
      break;
    if (p == s->retry) {
      if (!(s->retry = p->next_retry))
        s->retry_tail = &s->retry;
    } else {
      s->next_start++;
    }
    gshmd__pull_pin(p, pin);
    p->started = true;
    p->req_pending = true;
    p->src = (unsigned)k;
    p->peer = s->peers[k];
    /* (in flight there: the lister's word; another source grants its
     * published copy, else the one it is pulling) */
    p->greq.in_flight = k == 0 && p->listed_in_flight;
    s->active++;
    s->open_bytes[k] += open_cost(p);
    p->peer->grants_out++;
    gshmd__link_req_submit(&s->cl->ll, p->peer, &p->req);
  }
}

/* The peer refused p's grant as busy (it caps grants per link, staged
 * ones by their bytes; a grant it still counts until its last send ends,
 * after this node closed it): p waits for one of the set's open ones to
 * close, and the set asks no more at once than it holds now; with none
 * open, it asks again after GRANT_BUSY_RETRY_NS (set_reap: the next
 * progress, or the sweep's second).  Returns false, a real failure, once
 * the set was refused so for a whole cluster.request_timeout_ms. */
#define GRANT_BUSY_RETRY_NS (20 * 1000000LL)
bool gshmd__pull_grant_later(struct pull *p) {
  struct pull_set *s = p->s;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);

  if (s->active <= 1) {
    if (!s->busy_since_ns)
      s->busy_since_ns = now;
    if (now - s->busy_since_ns > s->cl->ll.request_timeout_ns)
      return false;
    s->retry_ns = now + GRANT_BUSY_RETRY_NS;
  }
  gshmd__pull_requeue(p);
  if (s->window == GRANTS_AHEAD)
    gshm_log_info("cluster: peer '%s' is busy: the pull of '%s' waits for its grants to end "
                  "before it asks more",
                  p->peer->name, s->name);
  s->window = s->active ? s->active : 1;
  return true;
}

void gshmd__pull_requeue(struct pull *p) {
  struct pull_set *s = p->s;

  gshmd__pull_grant_off(p);
  gshmd__pull_unpin(p);
  p->started = false;
  p->next_retry = NULL;
  *s->retry_tail = p;
  s->retry_tail = &p->next_retry;
}

void gshmd__pull_grant_off(struct pull *p) {
  struct pull_set *s = p->s;

  s->active--;
  s->open_bytes[p->src] -= open_cost(p);
  p->peer->grants_out--;
}

void gshmd__pull_release_send(const struct pull *p) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Release r = GSHM__CLUSTER__RELEASE__INIT;

  if (!p->granted || !p->link || p->link->state != LINK_UP)
    return;
  r.grant_id = p->grant_id;
  m.body_case = GSHM__CLUSTER__MSG__BODY_RELEASE;
  m.release = &r;
  gshm_log_debug("cluster: grant %" PRIu64 " of '%s' released to peer '%s'", p->grant_id,
                 p->remote_name, p->peer->name);
  gshmd__link_send(p->link, &m);
}

void gshmd__pull_release_owed(struct pull *p) {
  if (!p->release_owed)
    return;
  p->release_owed = false;
  gshmd__pull_release_send(p);
}

uint64_t gshmd__pull_pin_need(struct pull *p) {
  struct gshmd_cluster *cl = p->s->cl;
  bool device = p->listed ? gshmd__pull_lands_on_device(p, p->listed_device)
                          : p->location[0] && gshmd__pull_location_device(p->location);

  if (!device || !cl->reg->cuda)
    return 0;
  return gshmd_stage_buf_len(&cl->stage, cl->cfg->cluster_pull_chunk,
                             p->listed ? p->listed : cl->stage.staging_bytes);
}

void gshmd__pull_pin(struct pull *p, uint64_t bytes) {
  struct gshmd_cluster *cl = p->s->cl;

  p->pinned += bytes;
  cl->pull_pinned += bytes;
  if (cl->pull_pinned > cl->pull_pinned_max)
    cl->pull_pinned_max = cl->pull_pinned;
}

void gshmd__pull_unpin(struct pull *p) {
  p->s->cl->pull_pinned -= p->pinned;
  p->pinned = 0;
}

/* What pulls may land in now: the host backend's room
 * (gshmd_backend_host_room) and the memory daemon.host_recycle keeps,
 * which is gshmd's to land pulls in; UINT64_MAX: no bound known. */
static uint64_t pull_room(struct gshmd_cluster *cl) {
  struct gshmd_host_recycle_stats st;
  uint64_t room = gshmd_backend_host_room(cl->reg->host);

  gshmd_backend_host_recycle_stats(cl->reg->host, &st);
  if (room == UINT64_MAX)
    return room;
  return st.bytes_held >= UINT64_MAX - room ? UINT64_MAX - 1 : room + st.bytes_held;
}

int gshmd__pull_host_room(struct pull *p, uint64_t size) {
  struct gshmd_cluster *cl = p->s->cl;
  uint64_t room = cl->cfg->cluster_memory_check ? pull_room(cl) : UINT64_MAX;

  if (room != UINT64_MAX && (size > room || cl->pull_host_owed > room - size)) {
    gshmd__pull_set_fail_here(p->s, -ENOMEM,
                         "segment '%s' of peer '%s' needs %" PRIu64 " bytes of host memory: this "
                         "node has %" PRIu64 " available (with swap), and pulls in flight will "
                         "still take %" PRIu64,
                         p->remote_name, (p->peer ? p->peer : p->s->peer)->name, size, room,
                         cl->pull_host_owed); /* (at its listing: no source chosen yet) */
    return -ENOMEM;
  }
  p->host_owed += size;
  cl->pull_host_owed += size;
  return 0;
}

void gshmd__pull_host_paid(struct pull *p, uint64_t n) {
  struct gshmd_cluster *cl = p->s->cl;

  if (n > p->host_owed)
    n = p->host_owed;
  p->host_owed -= n;
  cl->pull_host_owed -= n;
}

void gshmd__pull_pinned_metrics(const struct gshmd_cluster *cl, FILE *f) {
  fprintf(f, "# HELP gshm_cluster_pull_pinned_bytes Pinned staging bytes held by this node's pulls into GPUs now (at most 8 x cluster.staging_bytes but for one).\n"
             "# TYPE gshm_cluster_pull_pinned_bytes gauge\n"
             "gshm_cluster_pull_pinned_bytes %" PRIu64 "\n"
             "# HELP gshm_cluster_pull_pinned_bytes_max The most pinned staging bytes this node's pulls into GPUs held at once since gshmd started.\n"
             "# TYPE gshm_cluster_pull_pinned_bytes_max gauge\n"
             "gshm_cluster_pull_pinned_bytes_max %" PRIu64 "\n"
             "# HELP gshm_cluster_pull_host_owed_bytes Bytes of new host segments this node's pulls made and have not landed yet (each pull's room is checked against the node's memory with them).\n"
             "# TYPE gshm_cluster_pull_host_owed_bytes gauge\n"
             "gshm_cluster_pull_host_owed_bytes %" PRIu64 "\n",
          cl->pull_pinned, cl->pull_pinned_max, cl->pull_host_owed);
}
