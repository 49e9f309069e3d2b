/* SPDX-License-Identifier: Apache-2.0 */
/* A request's own deadline (link.h links.request_timeout_ns): the oldest
 * request of an outbound link whose answer has not begun fails the link
 * once it has been the oldest for cluster.request_timeout_ms, however
 * busy the link is with the peer's other answers.  A peer that holds the
 * cluster key could otherwise keep one of our requests (a grant, a read)
 * forever while it answers the rest, and the pull waiting on it with it.
 *
 * Counted from when it became the oldest, not from when it was sent: a
 * serving node answers a link's requests in the order they came (its
 * lanes send the bytes of older reads first), so a read behind a budget
 * of others on a slow network waits for them, and only the one before it
 * on its lane once it is the oldest.  An answer that has begun (a lane
 * claimed its frame) is no longer this file's: the lane's own stall
 * timeout (lane_io.h) ends a frame that stops midway.  A serving node
 * that waits longer on purpose (a read of bytes it is still pulling,
 * relay.h) answers busy within half the timeout, and the reader asks
 * again. */
#include <inttypes.h>
#include <stdio.h>

#include "link.h"

/* What req asked for, for the log and the pull's error. */
static void req_text(const struct peer_req *req, char *buf, size_t len) {
  const Gshm__Cluster__Msg *m = req->msg;

  switch (m->body_case) {
  case GSHM__CLUSTER__MSG__BODY_LIST:
    snprintf(buf, len, "a listing");
    break;
  case GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST:
    snprintf(buf, len, "the grant of '%.100s'", m->grant_request->name);
    break;
  case GSHM__CLUSTER__MSG__BODY_READ:
  case GSHM__CLUSTER__MSG__BODY_STAGE:
    snprintf(buf, len, "%s of bytes %" PRIu64 "+%" PRIu64 " of grant %" PRIu64,
             m->body_case == GSHM__CLUSTER__MSG__BODY_READ ? "a read" : "a staged read",
             req->data_offset, req->data_len,
             m->body_case == GSHM__CLUSTER__MSG__BODY_READ ? m->read->grant_id
                                                           : m->stage->grant_id);
    break;
  default:
    snprintf(buf, len, "request %" PRIu32, req->request_id);
  }
}

const char *gshmd__link_req_overdue(struct link *l, int64_t now) {
  static char why[256]; /* (the loop's only) */
  struct peer_req *w = NULL;
  struct gshm_list *pos;
  char what[160];

  gshm_list_foreach(pos, &l->reqs) {
    struct peer_req *req = gshm_list_entry(pos, struct peer_req, node);
    if (!req->landing || !gshmd__landing_claimed(req)) {
      w = req;
      break;
    }
  }
  if (!w) {
    l->wait_rid = 0;
  } else if (w->request_id != l->wait_rid) {
    /* it became the oldest since the last look (or was sent since) */
    l->wait_rid = w->request_id;
    l->wait_since_ns = w->sent_ns > l->wait_checked_ns ? w->sent_ns : l->wait_checked_ns;
  }
  l->wait_checked_ns = now;
  if (!w || now - l->wait_since_ns <= l->ll->request_timeout_ns)
    return NULL;
  req_text(w, what, sizeof(what));
  snprintf(why, sizeof(why),
           "the peer left %s unanswered for %" PRId64 " ms (cluster.request_timeout_ms)",
           what, (now - l->wait_since_ns) / 1000000);
  return why;
}
