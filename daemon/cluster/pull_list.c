/* SPDX-License-Identifier: Apache-2.0 */
/* A set pull's listing (pull.h): the peer's exported segments asked page
 * by page; those under the prefix join the set (pullset.c); a page a
 * peer could make wrong (too long, a bad segment, a name twice, a cursor
 * that does not advance) fails the set, and so does a listing that adds
 * nothing for too long.  docs/CLUSTER.md. */
#include <errno.h>
#include <string.h>

#include "pull.h"
#include "relay.h"
#include "util.h"
#include "wire.h"

static void list_page_done(struct peer_req *req, int err, const char *why,
                           const Gshm__Cluster__Msg *m);

/* A page of the peer's list is refused as a whole (the set fails with
 * -EPROTO, naming the peer and the entry; returns true) when it holds
 * more than a page, a segment gshm would not make
 * (gshmd__pull_segment_bad), or a name twice (in the page, or already in
 * the set unless the peer lists segments in flight). */
static bool list_page_bad(struct pull_set *s, const Gshm__Cluster__ListReply *r) {
  const char *why = NULL;
  size_t i;

  if (r->n_segments > GSHMD_LIST_PAGE_SEGMENTS) {
    gshmd__pull_set_fail(s, -EPROTO, "peer '%s' listed %zu segments in one page (at most %u)",
                         s->peer->name, r->n_segments, GSHMD_LIST_PAGE_SEGMENTS);
    return true;
  }
  for (i = 0; i < r->n_segments && !why; i++) {
    const Gshm__Cluster__Segment *g = r->segments[i];
    /* (a listing with segments in flight lists one again once it is
     * published, and its cursor is a listing key, not a segment id) */
    if (g->id == 0 && !g->in_flight) /* (one in flight has no id yet) */
      why = "a segment id of 0";
    else if (!(why = gshmd__pull_segment_bad(s->cl, g)) && !s->relayed &&
             gshmd__pull_set_has(s, g->name))
      why = "a name listed twice";
    for (size_t j = 0; j < i && !why; j++)
      if (!strcmp(g->name, r->segments[j]->name))
        why = "a name listed twice";
  }
  if (!why)
    return false;
  /* (the peer's name for it is not repeated: it may be anything) */
  gshmd__pull_set_fail(s, -EPROTO, "peer '%s' sent a list of segments with %s (entry %zu of %zu)",
                       s->peer->name, why, i, r->n_segments);
  return true;
}

void gshmd__pull_list_next(struct pull_set *s, uint64_t after) {
  gshm__cluster__msg__init(&s->lmsg);
  gshm__cluster__list_request__init(&s->lr);
  s->lr.after = after;
  s->lr.with_in_flight = true;
  s->lmsg.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  s->lmsg.list = &s->lr;
  s->lreq.msg = &s->lmsg;
  s->lreq.done = list_page_done;
  s->lreq.arg = s;
  s->lask = (struct relay_ask){0};
  s->lreq_pending = true;
  s->list_asked_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshmd__link_req_submit(&s->cl->ll, s->peer, &s->lreq);
}

/* Whether the set's listing failed (-ETIMEDOUT) for its pages having
 * added no segment to the set for both cluster.request_timeout_ms and
 * PULL_LIST_IDLE_PAGES pages (n_before: the set's items before this page;
 * last: the peer's last page).  A key holder's pages of no segment, or of
 * names outside the prefix, under cursors that advance, each answered at
 * once, kept a listing, a registry client and one of its user's
 * GSHMD_PULLS_PER_USER pulls going for ever.  Both, because an honest
 * peer's listing may take longer than the timeout (a page a second,
 * each within it: test_cluster_rogue_held's test_relay_list_slow), and a
 * large one many pages (its 16,777,216 segments make 8,192 pages that
 * list none).  A relaying peer's busy answer restarts its page's clock
 * (relay.c bounds those by the relay's progress). */
static bool list_stalled(struct pull_set *s, size_t n_before, bool last) {
  s->list_idle_ns += gshm__now_ns(CLOCK_MONOTONIC) - s->list_asked_ns;
  s->list_idle_pages++;
  if (s->n > n_before) {
    s->list_idle_ns = 0;
    s->list_idle_pages = 0;
    return false;
  }
  if (last || s->list_idle_ns <= s->cl->ll.request_timeout_ns ||
      s->list_idle_pages <= PULL_LIST_IDLE_PAGES)
    return false;
  gshmd__pull_set_fail(s, -ETIMEDOUT,
                       "peer '%s' listed no segment under '%s' in %u pages over %lld ms "
                       "(cluster.request_timeout_ms): a listing that adds nothing is given up",
                       s->peer->name, s->name, s->list_idle_pages,
                       (long long)(s->list_idle_ns / 1000000));
  return true;
}

/* A page of the peer's exported segments: the ones under the prefix join
 * the set; the next page is asked for at once (the grants of this one
 * start meanwhile). */
static void list_page_done(struct peer_req *req, int err, const char *why,
                           const Gshm__Cluster__Msg *m) {
  struct pull_set *s = req->arg;
  const Gshm__Cluster__ListReply *r;
  size_t plen = strlen(s->name), n_before;

  s->lreq_pending = false;
  if (s->err)
    return;
  /* a relaying peer that waited for its own set's listing: asked again */
  if (err == -EBUSY && !(err = gshmd__relay_ask_again(s->peer->out, req, &s->lask, &why))) {
    s->lreq_pending = true;
    s->list_asked_ns = gshm__now_ns(CLOCK_MONOTONIC);
    return;
  }
  if (err) { /* (as a single pull says it: the peer named once, with its address) */
    char buf[GSHMD_PEER_ERROR_LEN];
    gshmd__pull_set_fail(s, err, "%s", gshmd__peer_error(req, err, m, why, buf, sizeof(buf)));
    return;
  }
  s->cl->list_pages++;
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_LIST_REPLY) {
    gshmd__pull_set_fail(s, -EPROTO, "peer '%s' answered a list with something else", s->peer->name);
    return;
  }
  r = m->list_reply;
  if (list_page_bad(s, r))
    return;
  n_before = s->n;
  for (size_t i = 0; i < r->n_segments; i++) {
    const Gshm__Cluster__Segment *g = r->segments[i];
    if (strncmp(g->name, s->name, plen) || (s->relayed && gshmd__pull_set_has(s, g->name)))
      continue;
    s->relayed |= g->in_flight;
    if (gshmd__pull_set_add(s, g->name, g->size, g))
      return;
  }
  if (list_stalled(s, n_before, !r->next))
    return;
  if (r->next) {
    if (r->next <= s->lr.after) { /* a cursor must advance */
      gshmd__pull_set_fail(s, -EPROTO, "peer '%s' sent a list cursor that does not advance",
               s->peer->name);
      return;
    }
    gshmd__pull_list_next(s, r->next);
  } else {
    s->listing = false;
    if (!s->n)
      /* (a model published with a pool's default mode, 0600, is such) */
      gshmd__pull_set_fail(s, -ENOENT,
                           "peer '%s' exports no segment under '%s' (its cluster.export rules "
                           "decide by name, owner and mode: a segment of mode 0600 is never "
                           "exported)",
                           s->peer->name, s->name);
  }
  gshmd__link_kick(&s->cl->ll);
}
