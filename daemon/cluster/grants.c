/* SPDX-License-Identifier: Apache-2.0 */
/* A set's grants, paced (pull.h): GRANTS_AHEAD segments asked at once,
 * fewer while a busy peer refuses, and the node's pulls into GPUs held
 * to PULL_PINNED_FULL staging_bytes of pinned slots. */
#include "pull.h"

#include <inttypes.h>
#include <stdio.h>

#include "config.h"
#include "log.h"
#include "registry.h"
#include "stage.h"

/* Asks grants for the next segments (those a busy peer refused first)
 * while fewer than s->window are open and the node's pulls into GPUs
 * hold less than PULL_PINNED_FULL staging_bytes of pinned slots with
 * the next one's (one always goes; set_reap asks again after each
 * close).  Run outside UCX callbacks. */
void gshmd__pull_set_start_grants(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;

  while (!s->err && s->active < s->window && (s->retry || s->next_start < s->n)) {
    struct pull *p = s->retry ? s->retry : s->items[s->next_start];
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
    s->active++;
    gshmd__link_req_submit(&s->cl->ll, s->peer, &p->req);
  }
}

/* The peer refused p's grant as busy (it caps grants per link, e.g.
 * staged ones) while other segments of the set hold grants: p waits for
 * one of them to close, and the set asks no more at once than it holds
 * now.  Returns false when nothing else is open (a real failure). */
bool gshmd__pull_grant_later(struct pull *p) {
  struct pull_set *s = p->s;

  if (s->active <= 1)
    return false;
  s->active--;
  gshmd__pull_unpin(p);
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

void gshmd__pull_pinned_metrics(const struct gshmd_cluster *cl, FILE *f) {
  fprintf(f, "# HELP gshm_cluster_pull_pinned_bytes Pinned staging bytes held by this node's pulls into GPUs now (at most 8 x cluster.staging_bytes but for one).\n"
             "# TYPE gshm_cluster_pull_pinned_bytes gauge\n"
             "gshm_cluster_pull_pinned_bytes %" PRIu64 "\n"
             "# HELP gshm_cluster_pull_pinned_bytes_max The most pinned staging bytes this node's pulls into GPUs held at once since gshmd started.\n"
             "# TYPE gshm_cluster_pull_pinned_bytes_max gauge\n"
             "gshm_cluster_pull_pinned_bytes_max %" PRIu64 "\n",
          cl->pull_pinned, cl->pull_pinned_max);
}
