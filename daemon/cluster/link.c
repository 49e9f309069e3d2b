/* SPDX-License-Identifier: Apache-2.0 */
/* The link layer (link.h): the UCP worker driven from the libuv loop
 * through its event fd (ucp_worker_get_efd + ucp_worker_arm: nothing
 * busy-polls), the listener, endpoints in both directions, requests to
 * peers and their answers, data messages, and the sweep. */
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "log.h"
#include "util.h"
#include "wire.h"

/* The worker loop: at most PROGRESS_ROUNDS batches of at most
 * PROGRESS_BATCH ucp_worker_progress calls per loop turn, so that local
 * clients are served between two batches during a pull. */
#define PROGRESS_ROUNDS 4
#define PROGRESS_BATCH 256
#define RECONNECT_DELAY_NS 2000000000LL /* after a link to a peer fails */
#define RETRY_DELAY_NS 5000000000LL     /* between attempts on an absent peer */
#define REFUSED_LINGER_NS 1000000000LL  /* a refused link is closed after this */
#define SWEEP_MS 1000
#define MAX_INBOUND_PENDING 64          /* inbound links in their hello at once */
#define STOP_SPINS 2000                 /* progress rounds while stopping (about 2 s) */

static int setup_listener(struct links *ll);

/* ---- driving the worker from the loop --------------------------------- */

static void drive(struct links *ll);

static void on_idle(uv_idle_t *h) { drive(h->data); }

static void on_efd(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drive(h->data);
}

void gshmd__link_kick(struct links *ll) {
  if (ll->handles_on && !ll->idle_on) {
    uv_idle_start(&ll->idle, on_idle);
    ll->idle_on = true;
  }
}

/* Closes the endpoints of links that failed inside a callback; returns
 * true while closes are still running. */
static bool close_failed(struct links *ll) {
  struct gshm_list *pos, *tmp;
  bool busy = false;

  gshm_list_foreach_safe(pos, tmp, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->state == LINK_CLOSED && l->ep && l->busy == 0) {
      ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                .flags = UCP_EP_CLOSE_FLAG_FORCE};
      ucs_status_ptr_t sp = ucp_ep_close_nbx(l->ep, &rp);
      l->ep = NULL;
      gshm_list_del(&l->node);
      if (UCS_PTR_IS_PTR(sp)) {
        l->close_req = sp; /* finished by a later progress */
        gshm_list_add_tail(&ll->closing, &l->node);
      } else {
        free(l);
      }
    }
  }
  gshm_list_foreach_safe(pos, tmp, &ll->closing) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (ucp_request_check_status(l->close_req) != UCS_INPROGRESS) {
      ucp_request_free(l->close_req);
      gshm_list_del(&l->node);
      free(l);
    } else {
      busy = true;
    }
  }
  return busy;
}

/* Progresses the worker a bounded number of times, does the work UCX
 * callbacks left for outside them, then arms the event fd; when there is
 * more to do, the idle handle keeps the loop from blocking. */
static void drive(struct links *ll) {
  bool busy = false;

  for (int round = 0; round < PROGRESS_ROUNDS && !busy; round++) {
    unsigned n = 0;
    while (ucp_worker_progress(ll->worker))
      if (++n >= PROGRESS_BATCH) {
        busy = true;
        break;
      }
    busy |= close_failed(ll);
    if (ll->hooks.after_progress)
      ll->hooks.after_progress(ll->hooks.arg);
    if (busy)
      break;
    if (ucp_worker_arm(ll->worker) == UCS_OK) {
      if (ll->idle_on) {
        uv_idle_stop(&ll->idle);
        ll->idle_on = false;
      }
      return;
    }
  }
  gshmd__link_kick(ll);
}

/* ---- sending ---------------------------------------------------------- */

static void on_am_sent(void *request, ucs_status_t status, void *user_data) {
  (void)status;
  free(user_data);
  ucp_request_free(request);
}

int gshmd__link_send(struct link *l, const Gshm__Cluster__Msg *m) {
  size_t len = gshm__cluster__msg__get_packed_size(m);
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA,
                            .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                            .cb.send = on_am_sent};
  ucs_status_ptr_t sp;
  uint8_t *buf;

  if (!l->ep || l->state == LINK_CLOSED)
    return -ENOTCONN;
  if (len > GSHMD_CLUSTER_MAX_MSG)
    return -EMSGSIZE;
  if (!(buf = malloc(len ? len : 1)))
    return -ENOMEM;
  gshm__cluster__msg__pack(m, buf);
  rp.user_data = buf;
  sp = ucp_am_send_nbx(l->ep, GSHMD_CLUSTER_AM_ID, NULL, 0, buf, len, &rp);
  gshmd__link_kick(l->ll);
  if (UCS_PTR_IS_PTR(sp))
    return 0; /* buf is freed by on_am_sent */
  free(buf);
  return UCS_PTR_STATUS(sp) == UCS_OK ? 0 : -EIO;
}

void gshmd__link_send_status(struct link *l, uint32_t request_id, int err, const char *message) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;

  m.request_id = request_id;
  m.status = (uint32_t)gshm__errno_to_status(err);
  m.message = (char *)(message ? message : "");
  gshmd__link_send(l, &m);
}

void gshmd__link_refused(struct links *ll, enum refusal why, const char *who, const char *what) {
  uint64_t n = ++ll->refusals[why];
  /* random bytes must not flood the log */
  if ((n & (n - 1)) == 0)
    gshm_log_warn("cluster: refused %s: %s (%" PRIu64 " refusal%s of this kind so far)", who,
                  what, n, n == 1 ? "" : "s");
}

void gshmd__link_refuse(struct link *l, enum refusal why, int err, const char *message) {
  gshmd__link_refused(l->ll, why, l->remote[0] ? l->remote : "a peer", message);
  if (l->state != LINK_CLOSED && l->state != LINK_REFUSED) {
    gshmd__link_send_status(l, 0, err, message);
    if (!l->inbound)
      gshmd__link_fail(l, err, message);
    else
      l->state = LINK_REFUSED; /* the sweep closes it; the peer usually first */
  }
}

void gshmd__link_unbusy(struct link *l) {
  if (l->busy)
    return;
  if (l->state != LINK_UP && l->ll->hooks.on_idle)
    l->ll->hooks.on_idle(l); /* the cleanup gshmd__link_fail left for us */
  gshmd__link_kick(l->ll);
}

/* ---- requests to peers ------------------------------------------------ */

static void peer_connect(struct links *ll, struct peer *p);

void gshmd__link_req_send(struct link *l, struct peer_req *req) {
  req->request_id = ++l->next_request ? l->next_request : ++l->next_request;
  req->msg->request_id = req->request_id;
  gshm_list_add_tail(&l->reqs, &req->node);
  req->queued = true;
  req->sent = true;
  if (gshmd__link_send(l, req->msg)) {
    gshm_list_del(&req->node);
    req->queued = false;
    req->done(req, -EIO, "cannot send to the peer", NULL);
  }
}

void gshmd__link_req_submit(struct links *ll, struct peer *p, struct peer_req *req) {
  req->peer = p;
  if (p->state == PEER_UP && p->out) {
    gshmd__link_req_send(p->out, req);
    return;
  }
  gshm_list_add_tail(&p->waiting, &req->node);
  req->queued = true;
  if (p->state == PEER_DOWN)
    peer_connect(ll, p);
}

bool gshmd__link_req_cancel(struct peer_req *req) {
  if (req->queued && !req->sent) {
    gshm_list_del(&req->node);
    req->queued = false;
  }
  return !req->queued;
}

static void reqs_fail(struct gshm_list *list, int err, const char *why) {
  while (!gshm_list_empty(list)) {
    struct peer_req *req = gshm_list_entry(list->next, struct peer_req, node);
    gshm_list_del(&req->node);
    req->queued = false;
    req->done(req, err, why, NULL);
  }
}

/* ---- links ------------------------------------------------------------ */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  struct link *l = arg;
  char why[96];

  (void)ep;
  snprintf(why, sizeof(why), "connection lost (%s)", ucs_status_string(status));
  gshmd__link_fail(l, -ECONNRESET, why);
}

static struct link *link_new(struct links *ll, bool inbound) {
  struct link *l = calloc(1, sizeof(*l));
  if (!l)
    return NULL;
  l->ll = ll;
  l->inbound = inbound;
  l->state = LINK_HELLO;
  l->since_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshm_list_init(&l->reqs);
  gshm_list_init(&l->pulls);
  gshm_list_init(&l->grants);
  gshm_list_add_tail(&ll->links, &l->node);
  randombytes_buf(l->nonce_mine, sizeof(l->nonce_mine));
  if (inbound)
    ll->ninbound_pending++;
  return l;
}

/* The peer of a failed outbound link goes down (logged on each change,
 * not on every retry of an absent peer). */
static void peer_down(struct link *l, enum link_state was, int err, const char *why) {
  struct peer *p = l->peer;

  p->out = NULL;
  p->state = PEER_DOWN;
  p->retry_ns = gshm__now_ns(CLOCK_MONOTONIC) + RECONNECT_DELAY_NS;
  if (was == LINK_UP)
    gshm_log_warn("cluster: peer '%s' (%s) down: %s", p->name, p->address, why);
  else if (strcmp(p->why, why))
    gshm_log_info("cluster: cannot reach peer '%s' (%s): %s", p->name, p->address, why);
  snprintf(p->why, sizeof(p->why), "%s", why);
  reqs_fail(&p->waiting, err, why);
}

void gshmd__link_fail(struct link *l, int err, const char *why) {
  struct links *ll = l->ll;
  enum link_state was = l->state;

  if (was == LINK_CLOSED)
    return;
  l->state = LINK_CLOSED;
  if (l->inbound && was != LINK_UP)
    ll->ninbound_pending--;
  if (l->peer && l->peer->out == l)
    peer_down(l, was, err, why);
  else if (l->inbound && was == LINK_UP && l->peer)
    gshm_log_info("cluster: peer '%s' (%s) disconnected: %s", l->peer->name, l->remote, why);
  reqs_fail(&l->reqs, err, why);
  if (ll->hooks.on_lost)
    ll->hooks.on_lost(l);
  /* Copies and sends still running read the granted segments: the
   * serving state goes with the last of them. */
  if (l->busy == 0 && ll->hooks.on_idle)
    ll->hooks.on_idle(l);
  gshmd__link_kick(ll);
}

void gshmd__link_up(struct link *l, uint32_t exported) {
  struct peer *p = l->peer;

  l->state = LINK_UP;
  p->state = PEER_UP;
  p->exported = exported;
  p->why[0] = '\0';
  gshm_log_info("cluster: peer '%s' (%s) up, %u exported segment(s)", p->name, p->address,
                exported);
  while (!gshm_list_empty(&p->waiting) && l->state == LINK_UP) {
    struct peer_req *req = gshm_list_entry(p->waiting.next, struct peer_req, node);
    gshm_list_del(&req->node);
    req->queued = false;
    gshmd__link_req_send(l, req);
  }
}

struct link *gshmd__link_by_ep(struct links *ll, ucp_ep_h ep) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->ep == ep)
      return l;
  }
  return NULL;
}

static void sockaddr_text(const struct sockaddr *sa, char *buf, size_t size) {
  char host[64] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, sizeof(host));
    port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof(host));
    port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
  }
  snprintf(buf, size, "%s:%d", host, port);
}

static void peer_connect(struct links *ll, struct peer *p) {
  ucp_ep_params_t ep = {0};
  struct link *l;
  ucs_status_t st;

  if (ll->stopping || p->out)
    return;
  if (!(l = link_new(ll, false)))
    return;
  l->peer = p;
  snprintf(l->remote, sizeof(l->remote), "%.63s", p->address);
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = (const struct sockaddr *)&p->sa;
  ep.sockaddr.addrlen = p->salen;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = l;
  p->out = l;
  p->state = PEER_CONNECTING;
  if ((st = ucp_ep_create(ll->worker, &ep, &l->ep)) != UCS_OK) {
    l->ep = NULL;
    gshmd__link_fail(l, -EIO, ucs_status_string(st));
    return;
  }
  ll->hooks.on_connect(l);
}

static void on_conn_request(ucp_conn_request_h req, void *arg) {
  struct links *ll = arg;
  ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
  ucp_ep_params_t ep = {0};
  struct link *l;
  char remote[64] = "?";

  if (ucp_conn_request_query(req, &attr) == UCS_OK)
    sockaddr_text((const struct sockaddr *)&attr.client_address, remote, sizeof(remote));
  if (ll->stopping || ll->ninbound_pending >= MAX_INBOUND_PENDING || !(l = link_new(ll, true))) {
    gshmd__link_refused(ll, REFUSE_LIMIT, remote, "too many connections in their hello");
    ucp_listener_reject(ll->listener, req);
    return;
  }
  snprintf(l->remote, sizeof(l->remote), "%s", remote);
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = l;
  if (ucp_ep_create(ll->worker, &ep, &l->ep) != UCS_OK) {
    l->ep = NULL;
    gshmd__link_fail(l, -EIO, "cannot create the endpoint");
  }
}

struct peer *gshmd__link_peer_find(struct links *ll, const char *name) {
  for (unsigned i = 0; ll && i < ll->npeers; i++)
    if (!strcmp(ll->peers[i].name, name))
      return &ll->peers[i];
  return NULL;
}

int gshmd__link_status_errno(uint32_t status) { return gshm__status_to_errno((int)status); }

/* ---- receiving -------------------------------------------------------- */

/* An answer to one of our requests on outbound link l; false: none waits
 * for it. */
static bool answer(struct link *l, Gshm__Cluster__Msg *m) {
  struct gshm_list *pos;

  gshm_list_foreach(pos, &l->reqs) {
    struct peer_req *req = gshm_list_entry(pos, struct peer_req, node);
    if (req->request_id == m->request_id) {
      int err = m->status == GSHM__STATUS__STATUS_OK ? 0 : gshmd__link_status_errno(m->status);
      gshm_list_del(&req->node);
      req->queued = false;
      req->done(req, err, err ? (m->message[0] ? m->message : "refused by the peer") : NULL,
                err ? NULL : m);
      return true;
    }
  }
  return false;
}

static bool is_answer(const Gshm__Cluster__Msg *m) {
  switch (m->body_case) {
  case GSHM__CLUSTER__MSG__BODY_LIST_REPLY:
  case GSHM__CLUSTER__MSG__BODY_GRANT:
  case GSHM__CLUSTER__MSG__BODY_STAGED:
  case GSHM__CLUSTER__MSG__BODY__NOT_SET:
    return true;
  default:
    return false;
  }
}

static void link_handle(struct link *l, Gshm__Cluster__Msg *m) {
  /* A refusal before the link is up ends it (the peer says why). */
  if (m->request_id == 0 && m->status && m->status != GSHM__STATUS__STATUS_OK &&
      m->body_case == GSHM__CLUSTER__MSG__BODY__NOT_SET) {
    char why[224];
    snprintf(why, sizeof(why), "refused by the peer: %.200s", m->message);
    gshmd__link_fail(l, gshmd__link_status_errno(m->status), why);
    return;
  }
  if (!l->inbound && l->state == LINK_UP && is_answer(m)) {
    if (!answer(l, m))
      gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "answer to no request");
    return;
  }
  l->ll->hooks.on_message(l, m);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param) {
  struct links *ll = arg;
  struct link *l = param->reply_ep ? gshmd__link_by_ep(ll, param->reply_ep) : NULL;
  Gshm__Cluster__Msg *m;

  (void)header;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ucp_am_data_release(ll->worker, data); /* we only ever send eager */
    if (l)
      gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "rendezvous control message");
    return UCS_OK;
  }
  if (!l) {
    gshmd__link_refused(ll, REFUSE_PROTOCOL, "a message from an unknown endpoint",
                        "no reply endpoint");
    return UCS_OK;
  }
  if (l->state == LINK_CLOSED || l->state == LINK_REFUSED)
    return UCS_OK;
  if (header_length || length > GSHMD_CLUSTER_MAX_MSG ||
      !(m = gshm__cluster__msg__unpack(NULL, length, data))) {
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "message does not decode");
    return UCS_OK;
  }
  link_handle(l, m);
  gshm__cluster__msg__free_unpacked(m, NULL);
  return UCS_OK;
}

/* ---- the sweep: handshake timeouts, reconnects ------------------------ */

static void on_sweep(uv_timer_t *t) {
  struct links *ll = t->data;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  struct gshm_list *pos, *tmp;

  if (ll->listen_pending)
    setup_listener(ll);
  gshm_list_foreach_safe(pos, tmp, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->state == LINK_REFUSED && now - l->since_ns > REFUSED_LINGER_NS)
      gshmd__link_fail(l, -EACCES, "refused");
    else if ((l->state == LINK_HELLO || l->state == LINK_AUTH) &&
             now - l->since_ns > ll->hello_timeout_ns) {
      if (l->inbound)
        gshmd__link_refused(ll, REFUSE_TIMEOUT, l->remote, "no hello in time");
      gshmd__link_fail(l, -ETIMEDOUT, "no answer to the hello in time");
    }
  }
  for (unsigned i = 0; i < ll->npeers; i++) {
    struct peer *p = &ll->peers[i];
    if (p->state == PEER_DOWN && now >= p->retry_ns) {
      p->retry_ns = now + RETRY_DELAY_NS;
      peer_connect(ll, p);
    }
  }
  gshmd__link_kick(ll);
}

/* ---- start and stop --------------------------------------------------- */

static int setup_ucp(struct links *ll) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                    /* No UCP_FEATURE_RMA: with it UCX 1.13 answers software
                     * GET requests (transports without RMA, such as tcp) from
                     * any endpoint at any address, before gshm's hello, and
                     * aborts gshmd when the reader died meanwhile
                     * (ucp_get_req_handler: "unexpected error: Endpoint
                     * timeout").  The bytes go as active messages, by
                     * rendezvous when large. */
                    .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                    .mt_workers_shared = 0};
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB |
                                             UCP_AM_HANDLER_PARAM_FIELD_ARG,
                               .id = GSHMD_CLUSTER_AM_ID, .cb = on_am, .arg = ll};
  ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  ucp_config_t *config;
  ucs_status_t st;

  if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK)
    goto fail;
  st = ucp_init(&p, config, &ll->ctx);
  ucp_config_release(config);
  if (st != UCS_OK)
    goto fail;
  if (ucp_context_query(ll->ctx, &attr) == UCS_OK)
    ll->cuda_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  if ((st = ucp_worker_create(ll->ctx, &wp, &ll->worker)) != UCS_OK)
    goto fail;
  if ((st = ucp_worker_get_efd(ll->worker, &ll->efd)) != UCS_OK)
    goto fail;
  if ((st = ucp_worker_set_am_recv_handler(ll->worker, &ap)) != UCS_OK)
    goto fail;
  gshm_log_info("cluster: UCX %s; device memory %s", ucp_get_version_string(),
                ll->cuda_memory ? "registered directly (UCX has CUDA support)"
                                : "staged through pinned host buffers (this UCX has no CUDA "
                                  "memory support)");
  return 0;
fail:
  gshm_log_err("cluster: UCX setup failed: %s", ucs_status_string(st));
  return -EIO;
}

static int setup_listener(struct links *ll) {
  ucp_listener_params_t lp = {0};
  ucs_status_t st;

  if (!ll->listen || !*ll->listen)
    return 0;
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = (const struct sockaddr *)&ll->listen_sa;
  lp.sockaddr.addrlen = ll->listen_salen;
  lp.conn_handler.cb = on_conn_request;
  lp.conn_handler.arg = ll;
  if ((st = ucp_listener_create(ll->worker, &lp, &ll->listener)) != UCS_OK) {
    /* Usually the port of a gshmd that just died, still in TIME_WAIT:
     * local clients must not wait for it, so the sweep tries again. */
    if (!ll->listen_pending)
      gshm_log_warn("cluster: cannot listen on %s yet (%s); trying again every second",
                    ll->listen, ucs_status_string(st));
    ll->listener = NULL;
    ll->listen_pending = true;
    return 0;
  }
  if (ll->listen_pending)
    gshm_log_notice("cluster: listening on %s now", ll->listen);
  ll->listen_pending = false;
  gshm_log_info("cluster: node '%s' listening on %s, %u peer(s)", ll->node_name, ll->listen,
                ll->npeers);
  return 0;
}

int gshmd__link_start(struct links *ll) {
  int e;

  ll->efd = -1;
  gshm_list_init(&ll->links);
  gshm_list_init(&ll->closing);
  if ((e = setup_ucp(ll)) || (e = setup_listener(ll)))
    return e;
  uv_poll_init(ll->loop, &ll->poll, ll->efd);
  ll->poll.data = ll;
  uv_poll_start(&ll->poll, UV_READABLE, on_efd);
  uv_idle_init(ll->loop, &ll->idle);
  ll->idle.data = ll;
  uv_timer_init(ll->loop, &ll->sweep);
  ll->sweep.data = ll;
  uv_timer_start(&ll->sweep, on_sweep, 0, SWEEP_MS);
  uv_unref((uv_handle_t *)&ll->sweep);
  ll->handles_on = true;
  gshmd__link_kick(ll);
  return 0;
}

void gshmd__link_stop(struct links *ll) {
  struct gshm_list *pos, *tmp;

  ll->stopping = true;
  if (ll->links.next) {
    /* Failing the links completes every request, sent or waiting. */
    gshm_list_foreach_safe(pos, tmp, &ll->links)
        gshmd__link_fail(gshm_list_entry(pos, struct link, node), -ESHUTDOWN,
                         "gshmd is stopping");
    for (unsigned i = 0; i < ll->npeers; i++)
      reqs_fail(&ll->peers[i].waiting, -ESHUTDOWN, "gshmd is stopping");
    /* Close the endpoints and let the closes finish (bounded). */
    for (int i = 0; ll->worker && i < STOP_SPINS &&
                    (!gshm_list_empty(&ll->links) || !gshm_list_empty(&ll->closing));
         i++) {
      drive(ll);
      if (i > 100)
        usleep(1000);
    }
  }
  if (ll->listener) {
    ucp_listener_destroy(ll->listener);
    ll->listener = NULL;
  }
  if (ll->handles_on) {
    ll->handles_on = false;
    uv_close((uv_handle_t *)&ll->poll, NULL);
    uv_close((uv_handle_t *)&ll->idle, NULL);
    uv_close((uv_handle_t *)&ll->sweep, NULL);
  }
}

void gshmd__link_destroy(struct links *ll) {
  if (ll->listener)
    ucp_listener_destroy(ll->listener);
  ll->listener = NULL;
  if (ll->worker)
    ucp_worker_destroy(ll->worker);
  ll->worker = NULL;
  if (ll->ctx)
    ucp_cleanup(ll->ctx);
  ll->ctx = NULL;
}
