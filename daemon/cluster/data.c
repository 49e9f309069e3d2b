/* SPDX-License-Identifier: Apache-2.0 */
/* Data frames: the bytes answering a Read or a Stage, sent from the
 * granted memory and received straight into the request's destination
 * (link.h, stream.h). */
#include <errno.h>
#include <stdlib.h>

#include "link.h"
#include "util.h"

/* One data frame being sent. */
struct data_send {
  struct link *l;
  void (*done)(void *arg, int err);
  void *arg;
};

static void on_data_sent(void *arg, int err) {
  struct data_send *ds = arg;
  struct link *l = ds->l;

  l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  l->busy--;
  if (ds->done)
    ds->done(ds->arg, err);
  free(ds);
  gshmd__link_unbusy(l);
}

int gshmd__link_send_data(struct link *l, uint32_t rid, uint64_t offset, const void *src,
                          uint64_t len, void (*done)(void *arg, int err), void *arg) {
  struct data_send *ds;
  int e;

  if (l->state != LINK_UP)
    return -ENOTCONN;
  if (!(ds = calloc(1, sizeof(*ds))))
    return -ENOMEM;
  ds->l = l;
  ds->done = done;
  ds->arg = arg;
  if ((e = gshmd__stream_send_data(&l->st, rid, offset, src, len, on_data_sent, ds))) {
    free(ds);
    return e;
  }
  l->busy++;
  return 0;
}

void *gshmd__link_data_dest(struct stream *s, uint32_t rid, uint64_t offset, uint64_t len,
                            void **tok_out) {
  struct link *l = s->owner;
  struct gshm_list *pos;
  void *dst;

  if (l->inbound || l->state != LINK_UP)
    return NULL;
  gshm_list_foreach(pos, &l->reqs) {
    struct peer_req *req = gshm_list_entry(pos, struct peer_req, node);
    if (req->request_id != rid || !req->data_dest)
      continue;
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

void gshmd__link_data_done(struct stream *s, void *tok, int err) {
  struct link *l = s->owner;
  struct peer_req *req = tok;

  l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  req->data_done(req, err);
  gshmd__link_kick(l->ll);
}
