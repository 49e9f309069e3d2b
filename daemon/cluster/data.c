/* SPDX-License-Identifier: Apache-2.0 */
/* Data messages: the bytes answering a Read or a Stage, sent from
 * registered memory (by rendezvous when large) and received into the
 * request's destination by its on_data. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "link.h"

/* One data message being sent. */
struct data_send {
  struct data_hdr hdr;
  struct link *l;
  void (*done)(void *arg, ucs_status_t st);
  void *arg;
};

static void on_data_sent(void *request, ucs_status_t status, void *user_data) {
  struct data_send *ds = user_data;
  struct link *l = ds->l;

  if (request)
    ucp_request_free(request);
  l->busy--;
  if (ds->done)
    ds->done(ds->arg, status);
  free(ds);
  gshmd__link_unbusy(l);
}

int gshmd__link_send_data(struct link *l, uint32_t rid, uint64_t offset, const void *src,
                          uint64_t len, ucp_mem_h memh, void (*done)(void *arg, ucs_status_t st),
                          void *arg) {
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA,
                            .flags = UCP_AM_SEND_FLAG_REPLY,
                            .cb.send = on_data_sent};
  struct data_send *ds;
  ucs_status_ptr_t sp;

  if (!l->ep || l->state != LINK_UP)
    return -ENOTCONN;
  if (!(ds = calloc(1, sizeof(*ds))))
    return -ENOMEM;
  ds->hdr.request_id = rid;
  ds->hdr.offset = offset;
  ds->l = l;
  ds->done = done;
  ds->arg = arg;
  rp.user_data = ds;
  if (memh) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = memh;
  }
  l->busy++;
  sp = ucp_am_send_nbx(l->ep, GSHMD_CLUSTER_DATA_AM_ID, &ds->hdr, sizeof(ds->hdr), src, len, &rp);
  gshmd__link_kick(l->ll);
  if (!UCS_PTR_IS_PTR(sp))
    on_data_sent(NULL, UCS_PTR_STATUS(sp), ds);
  return 0;
}

/* The bytes answering one of our Reads or Stages. */
static ucs_status_t on_data_am(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param) {
  struct links *ll = arg;
  struct link *l = param->reply_ep ? gshmd__link_by_ep(ll, param->reply_ep) : NULL;
  struct data_hdr hdr;
  struct gshm_list *pos;

  if (!l || l->inbound || l->state != LINK_UP || header_length != sizeof(hdr)) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
      ucp_am_data_release(ll->worker, data);
    if (l && l->state == LINK_UP)
      gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "unexpected data message");
    else if (!l)
      gshmd__link_refused(ll, REFUSE_PROTOCOL, "a data message from an unknown endpoint",
                          "dropped");
    return UCS_OK;
  }
  memcpy(&hdr, header, sizeof(hdr));
  gshm_list_foreach(pos, &l->reqs) {
    struct peer_req *req = gshm_list_entry(pos, struct peer_req, node);
    if (req->request_id == hdr.request_id && req->on_data) {
      gshm_list_del(&req->node);
      req->queued = false;
      req->on_data(req, data, length, param);
      return UCS_OK;
    }
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
    ucp_am_data_release(ll->worker, data);
  gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "data for no request");
  return UCS_OK;
}

int gshmd__link_data_start(struct links *ll) {
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB |
                                             UCP_AM_HANDLER_PARAM_FIELD_ARG,
                               .id = GSHMD_CLUSTER_DATA_AM_ID, .cb = on_data_am, .arg = ll};
  return ucp_worker_set_am_recv_handler(ll->worker, &ap) == UCS_OK ? 0 : -EIO;
}
