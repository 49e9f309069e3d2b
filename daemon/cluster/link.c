/* SPDX-License-Identifier: Apache-2.0 */
/* The link layer (link.h): the cluster port (one TCP listener, libuv),
 * connections to and from peers as gshm streams, requests to peers and
 * their answers, and the sweep.  The UCP worker is worker.c. */
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "wire.h"

#define RECONNECT_DELAY_NS 2000000000LL /* after a link to a peer fails */
#define RETRY_DELAY_NS 5000000000LL     /* between attempts on an absent peer */
#define REFUSED_LINGER_NS 1000000000LL  /* a refused link is closed after this */
#define SWEEP_MS 1000
#define LISTEN_BACKLOG 64

static int setup_listener(struct links *ll);
static void link_maybe_free(struct link *l);

/* ---- sending ---------------------------------------------------------- */

int gshmd__link_send(struct link *l, const Gshm__Cluster__Msg *m) {
  size_t len = gshm__cluster__msg__get_packed_size(m);
  uint8_t *buf;
  int e;

  if (l->state == LINK_CLOSED)
    return -ENOTCONN;
  if (len > GSHMD_CLUSTER_MAX_MSG)
    return -EMSGSIZE;
  if (!(buf = malloc(len ? len : 1)))
    return -ENOMEM;
  gshm__cluster__msg__pack(m, buf);
  e = gshmd__stream_send_ctrl(&l->st, buf, len);
  free(buf);
  return e;
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
    else {
      l->state = LINK_REFUSED; /* the sweep closes it; the peer usually first */
      l->since_ns = gshm__now_ns(CLOCK_MONOTONIC); /* (its linger counts from now) */
      /* Parsed, what it sent on kept the loop busy for all its linger:
       * a host without the key sent empty frames, 24 bytes a read. */
      gshmd__stream_drain(&l->st);
    }
  }
}

void gshmd__link_unbusy(struct link *l) {
  if (l->busy)
    return;
  if (l->state != LINK_UP && l->ll->hooks.on_idle)
    l->ll->hooks.on_idle(l); /* the cleanup gshmd__link_fail left for us */
  gshmd__link_kick(l->ll);
  link_maybe_free(l);
}

/* ---- requests to peers ------------------------------------------------ */

static void peer_connect(struct links *ll, struct peer *p);

void gshmd__link_req_send(struct link *l, struct peer_req *req) {
  int e;

  req->request_id = ++l->next_request ? l->next_request : ++l->next_request;
  req->msg->request_id = req->request_id;
  req->sent_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshm_list_add_tail(&l->reqs, &req->node);
  req->queued = true;
  req->sent = true;
  req->answered = false;
  /* listed before it goes: its bytes may come on a lane at once */
  if (req->data_dest && !l->ucx && (e = gshmd__landing_add(l, req))) {
    gshm_list_del(&req->node);
    req->queued = false;
    req->done(req, e, e == -ENOMEM ? "out of memory" : "no place for the bytes asked for", NULL);
    return;
  }
  if (gshmd__link_send(l, req->msg)) {
    gshm_list_del(&req->node);
    req->queued = false;
    /* a lane may have it even so: a peer can send a frame for the next
     * request id before it is asked (ids are sequential), and then
     * data_done ends req, not this */
    if (gshmd__landing_withdraw(req))
      req->done(req, -EIO, "cannot send to the peer", NULL);
  }
}

void gshmd__link_req_submit(struct links *ll, struct peer *p, struct peer_req *req) {
  req->peer = p;
  req->sent = req->answered = false; /* (one submitted again, to another peer say: not sent yet) */
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

/* Fails the requests of list (a peer's waiting ones, or a link's sent
 * ones); one whose bytes a lane is reading ends with them instead
 * (gshmd__link_data_done). */
static void reqs_fail(struct gshm_list *list, int err, const char *why) {
  while (!gshm_list_empty(list)) {
    struct peer_req *req = gshm_list_entry(list->next, struct peer_req, node);
    gshm_list_del(&req->node);
    req->queued = false;
    if (gshmd__landing_withdraw(req))
      req->done(req, err, why, NULL);
  }
}

/* ---- links ------------------------------------------------------------ */

static void on_stream_ctrl(struct stream *s, const uint8_t *payload, size_t len);

static void on_stream_error(struct stream *s, int err, const char *why) {
  struct link *l = s->owner;
  char buf[160];

  l->ll->hooks.charge(l->ll->hooks.arg, l, true);
  if (err == -EBADMSG) {
    gshmd__link_refused(l->ll, REFUSE_TAMPERED, l->remote, why);
    gshmd__link_fail(l, -EPROTO, why);
  } else {
    if (err == -EPROTO)
      gshmd__link_refused(l->ll, REFUSE_PROTOCOL, l->remote, why);
    snprintf(buf, sizeof(buf), "connection lost (%s)", why);
    gshmd__link_fail(l, err == -EPROTO ? -EPROTO : -ECONNRESET, buf);
  }
  l->ll->hooks.charge(l->ll->hooks.arg, l, false);
}

static void on_stream_closed(struct stream *s) {
  struct link *l = s->owner;
  l->stream_closed = true;
  l->ll->nconns--;
  link_maybe_free(l);
}

static void *on_stream_data_dest(struct stream *s, uint32_t rid, uint64_t offset, uint64_t len,
                                 void **tok_out) {
  struct link *l = s->owner;
  return l->ll->hooks.data_dest(l, rid, offset, len, tok_out);
}

static void on_stream_data_done(struct stream *s, void *tok, int err) {
  struct link *l = s->owner;
  l->ll->hooks.data_done(l, tok, err);
}

static const struct stream_ops link_stream_ops = {
    .on_ctrl = on_stream_ctrl,
    .data_dest = on_stream_data_dest,
    .data_done = on_stream_data_done,
    .on_error = on_stream_error,
    .on_closed = on_stream_closed,
};

static struct link *link_new(struct links *ll, bool inbound) {
  struct link *l = calloc(1, sizeof(*l));
  if (!l)
    return NULL;
  if (gshmd__stream_init(&l->st, ll->loop, &link_stream_ops, l)) {
    free(l);
    return NULL;
  }
  ll->nconns++;
  l->ll = ll;
  l->inbound = inbound;
  l->state = LINK_HELLO;
  l->since_ns = l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshm_list_init(&l->reqs);
  gshm_list_init(&l->pulls);
  gshm_list_init(&l->grants);
  gshm_list_init(&l->ucx_sends);
  gshm_list_init(&l->ucx_recvs);
  gshm_list_add_tail(&ll->links, &l->node);
  randombytes_buf(l->nonce_mine, sizeof(l->nonce_mine));
  l->pending = inbound;
  return l;
}

/* Frees a failed link once its stream is closed and nothing it started
 * runs any more. */
static void link_maybe_free(struct link *l) {
  if (l->state == LINK_CLOSED && l->stream_closed && l->busy == 0 &&
      gshm_list_empty(&l->ucx_sends)) {
    gshmd__landings_unref(l->landings); /* (lanes may still hold it) */
    gshm_list_del(&l->node);
    free(l);
  }
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
  gshmd__link_pending_end(l);
  if (ll->hooks.on_fail) /* its data lanes stop, or, a lane, it leaves its link */
    ll->hooks.on_fail(l, was);
  if (l->peer && l->peer->out == l)
    peer_down(l, was, err, why);
  else if (l->inbound && was == LINK_UP && l->peer && !l->is_lane)
    gshm_log_info("cluster: peer '%s' (%s) disconnected: %s", l->peer->name, l->remote, why);
  reqs_fail(&l->reqs, err, why);
  if (ll->hooks.on_lost)
    ll->hooks.on_lost(l, err, why);
  /* Copies and sends still running read the granted segments: the
   * serving state goes with the last of them. */
  if (l->busy == 0 && ll->hooks.on_idle)
    ll->hooks.on_idle(l);
  gshmd__stream_close(&l->st); /* on_stream_closed frees the link */
  gshmd__link_kick(ll);
}

void gshmd__link_up(struct link *l, uint32_t exported) {
  struct peer *p = l->peer;

  l->state = LINK_UP;
  p->state = PEER_UP;
  p->exported = exported;
  p->why[0] = '\0';
  gshm_log_info("cluster: peer '%s' (%s) up, %u exported segment(s), %s", p->name, p->address,
                exported, gshmd__stream_mode_name(l->st.mode_tx));
  while (!gshm_list_empty(&p->waiting) && l->state == LINK_UP) {
    struct peer_req *req = gshm_list_entry(p->waiting.next, struct peer_req, node);
    gshm_list_del(&req->node);
    req->queued = false;
    gshmd__link_req_send(l, req);
  }
  if (l->ll->hooks.on_up)
    l->ll->hooks.on_up(l);
}

unsigned gshmd__link_count_up(struct links *ll, const struct peer *p) {
  struct gshm_list *pos;
  unsigned n = 0;
  gshm_list_foreach(pos, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    /* (a link refused once up keeps its grants and sends until the sweep
     * closes it; a failed link whose sends UCX has not ended holds their
     * memory, or on an eager endpoint copies of their bytes) */
    bool held = l->state == LINK_UP || (l->state == LINK_REFUSED && !l->pending) ||
                (l->state == LINK_CLOSED && !gshm_list_empty(&l->ucx_sends));
    n += l->inbound && held && l->peer == p && !l->is_lane;
  }
  return n;
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

static void on_connected(uv_connect_t *c, int status) {
  struct link *l = c->data;
  char why[160];

  if (l->state == LINK_CLOSED)
    return;
  if (status) {
    snprintf(why, sizeof(why), "%s%s", uv_strerror(status),
             status == UV_ECONNREFUSED ? " (nothing listens there: is the peer's daemon running, "
                                         "with this address as its cluster.listen?)" : "");
    /* ECONNRESET: the status a client reads as "the peer cannot be
     * reached" (ECONNREFUSED has none: it would reach it as EPROTO) */
    gshmd__link_fail(l, -ECONNRESET, why);
    return;
  }
  if (gshmd__stream_start(&l->st)) {
    gshmd__link_fail(l, -EIO, "cannot read the connection");
    return;
  }
  l->ll->hooks.on_connect(l);
}

/* A new outbound link to p (NULL: stopping, no fd left, no memory);
 * lane: a data lane of p's link with that lane token (lane.h), else p's
 * link.  Connecting: on_connected says hello. */
static struct link *link_connect(struct links *ll, struct peer *p, const uint8_t *lane) {
  struct link *l;
  int e;

  if (ll->stopping || gshmd__link_peer_conns(ll) >= ll->max_conns ||
      !(l = link_new(ll, false)))
    return NULL;
  l->peer = p;
  snprintf(l->remote, sizeof(l->remote), "%.63s", p->address);
  if (lane) {
    l->is_lane = true;
    memcpy(l->lane_token, lane, LINK_LANE_TOKEN);
    p->lanes_connecting++;
  } else {
    p->out = l;
    p->state = PEER_CONNECTING;
  }
  l->connect.data = l;
  if ((e = uv_tcp_connect(&l->connect, &l->st.tcp, (const struct sockaddr *)&p->sa,
                          on_connected))) {
    gshmd__link_fail(l, -EIO, uv_strerror(e));
    return NULL;
  }
  return l;
}

struct link *gshmd__link_connect_lane(struct link *parent) {
  return link_connect(parent->ll, parent->peer, parent->lane_token);
}

unsigned gshmd__link_count_lingering(struct links *ll, const struct peer *p) {
  struct gshm_list *pos;
  unsigned n = 0;
  gshm_list_foreach(pos, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    n += !l->inbound && l->peer == p && l->state == LINK_CLOSED &&
         !gshm_list_empty(&l->ucx_recvs);
  }
  return n;
}

/* A link to p, unless it has one.  What waits for it fails when
 * LINK_MAX_PER_PEER failed ones still hold memory UCX may write, or when
 * none could even be tried (the cluster's fd budget held by the peers'
 * links and lanes, no memory): only a link's end fails p->waiting, and a
 * pull waited there, silent, until the budget had room again. */
static void peer_connect(struct links *ll, struct peer *p) {
  if (p->out)
    return;
  if (gshmd__link_count_lingering(ll, p) >= LINK_MAX_PER_PEER) {
    snprintf(p->why, sizeof(p->why), "%u failed links to it still wait for UCX to end receives "
             "of its bytes (its UCX worker stopped?)", LINK_MAX_PER_PEER);
  } else if (link_connect(ll, p, NULL) || ll->stopping || gshm_list_empty(&p->waiting)) {
    return; /* (a connect that failed at once failed them: peer_down) */
  } else {
    snprintf(p->why, sizeof(p->why), "%s",
             gshmd__link_peer_conns(ll) >= ll->max_conns
                 ? "no cluster connection left in gshmd's budget (its peers' links and data "
                   "lanes hold all of it)"
                 : "out of memory");
  }
  reqs_fail(&p->waiting, -ECONNRESET, p->why);
}

/* A connection on the cluster port: taken into its hello, or closed at
 * once when a bound says no (no byte is read from it then). */
static void on_connection(uv_stream_t *server, int status) {
  struct links *ll = server->data;
  struct link *l;
  int salen = sizeof(struct sockaddr_storage);
  const char *no;

  if (status || !(l = link_new(ll, true)))
    return; /* the kernel keeps the connection queued; the next one retries */
  if (uv_accept(server, (uv_stream_t *)&l->st.tcp)) {
    gshmd__link_fail(l, -EIO, "accept failed");
    return;
  }
  uv_tcp_getpeername(&l->st.tcp, (struct sockaddr *)&l->remote_sa, &salen);
  sockaddr_text((const struct sockaddr *)&l->remote_sa, l->remote, sizeof(l->remote));
  if ((no = gshmd__link_admit(ll, l)) || gshmd__stream_start(&l->st)) {
    gshmd__link_refused(ll, REFUSE_LIMIT, l->remote, no ? no : "cannot read the connection");
    gshmd__link_fail(l, -EAGAIN, no ? no : "cannot read");
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
      if (!gshmd__landing_withdraw(req)) {
        /* its bytes are coming on a lane: an answer too is a lie */
        gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO,
                           "the peer answered a request whose bytes it is sending");
        return true;
      }
      gshm_list_del(&req->node);
      req->queued = false;
      req->progress = m->progress;
      req->answered = true;
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

static void on_stream_ctrl(struct stream *s, const uint8_t *payload, size_t len) {
  struct link *l = s->owner;
  Gshm__Cluster__Msg *m;

  l->active_ns = gshm__now_ns(CLOCK_MONOTONIC);
  if (l->state == LINK_CLOSED || l->state == LINK_REFUSED)
    return;
  l->ll->hooks.charge(l->ll->hooks.arg, l, true);
  if ((m = gshm__cluster__msg__unpack(NULL, len, payload)))
    link_handle(l, m);
  else
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "message does not decode");
  gshm__cluster__msg__free_unpacked(m, NULL);
  l->ll->hooks.charge(l->ll->hooks.arg, l, false);
}

/* ---- the sweep: timeouts, reconnects ---------------------------------- */

/* A link that waits too long: a hello not done, a refused link the peer
 * did not close, requests the peer leaves unanswered, a peer that
 * stopped reading what we send, or a data lane of it that waits too
 * long (lane.h: whose link then fails, counted as a timeout: the
 * link's own activity says nothing of its lanes). */
static const char *link_overdue(struct link *l, int64_t now) {
  struct links *ll = l->ll;
  int64_t hello = l->inbound && ll->hello_timeout_ns > LINK_HELLO_NS ? LINK_HELLO_NS
                                                                     : ll->hello_timeout_ns;
  const char *why;

  if (l->state == LINK_REFUSED && now - l->since_ns > REFUSED_LINGER_NS)
    return "refused";
  if ((l->state == LINK_HELLO || l->state == LINK_AUTH) && now - l->since_ns > hello) {
    if (l->inbound)
      gshmd__link_refused(ll, REFUSE_TIMEOUT, l->remote, "no hello in time");
    return "no answer to the hello in time";
  }
  if (l->is_lane) {
    why = l->state == LINK_UP && ll->hooks.lane_overdue ? ll->hooks.lane_overdue(l, now) : NULL;
    if (why)
      gshmd__link_refused(ll, REFUSE_TIMEOUT, l->remote, why);
    return why;
  }
  if (l->state != LINK_UP)
    return NULL;
  /* (a data frame's request is off l->reqs: the next check misses it) */
  if (!l->inbound && gshmd__stream_rx_stalled(&l->st, now, ll->request_timeout_ns)) {
    why = "the peer stopped sending a data frame midway on the link's connection";
    gshmd__link_refused(ll, REFUSE_TIMEOUT, l->peer->name, why);
    return why;
  }
  if (!l->inbound && (why = gshmd__link_req_overdue(l, now))) {
    gshmd__link_refused(ll, REFUSE_TIMEOUT, l->peer->name, why);
    return why;
  }
  if (now - l->active_ns > ll->request_timeout_ns && l->busy && l->st.tx_bytes)
    return "the peer did not read what it asked for in time";
  /* (UCX's sends are not the stream's bytes: a peer that keeps its
   * connection open and never takes them held them, and what they read,
   * for as long as it liked) */
  if (gshmd__link_ucx_overdue(l, now, ll->request_timeout_ns))
    return "the peer did not take over UCX what it asked for in time";
  /* (a receive over UCX is off l->reqs once its header came, and only
   * UCX ends it: gshmd__link_data_lost) */
  if (gshmd__link_ucx_recv_overdue(l, now, ll->request_timeout_ns)) {
    why = "the peer did not complete over UCX in time bytes it began to send";
    gshmd__link_refused(ll, REFUSE_TIMEOUT, l->peer ? l->peer->name : l->remote, why);
    return why;
  }
  return NULL;
}

static void on_sweep(uv_timer_t *t) {
  struct links *ll = t->data;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  struct gshm_list *pos, *tmp;
  const char *why;

  if (ll->listen_pending)
    setup_listener(ll);
  gshm_list_foreach_safe(pos, tmp, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->state != LINK_CLOSED && (why = link_overdue(l, now)))
      /* an overdue lane: its link, with the reason (the lane goes with it) */
      gshmd__link_fail(l->is_lane && l->lane_of ? l->lane_of : l, -ETIMEDOUT, why);
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

static void free_handle(uv_handle_t *h) { free(h); }

static int setup_listener(struct links *ll) {
  uv_tcp_t *t;
  int e;

  if (!ll->listen || !*ll->listen || ll->listener)
    return 0;
  if (!(t = malloc(sizeof(*t))))
    return -ENOMEM;
  uv_tcp_init(ll->loop, t);
  t->data = ll;
  if ((e = uv_tcp_bind(t, (const struct sockaddr *)&ll->listen_sa, 0)) ||
      (e = uv_listen((uv_stream_t *)t, LISTEN_BACKLOG, on_connection))) {
    /* Usually the port of a gshmd that just died, still in TIME_WAIT:
     * local clients must not wait for it, so the sweep tries again on a
     * new socket. */
    if (!ll->listen_pending)
      gshm_log_warn("cluster: cannot listen on %s yet (%s); trying again every second",
                    ll->listen, uv_strerror(e));
    ll->listen_pending = true;
    uv_close((uv_handle_t *)t, free_handle);
    return 0;
  }
  if (ll->listen_pending)
    gshm_log_notice("cluster: listening on %s now", ll->listen);
  ll->listen_pending = false;
  ll->listener = t;
  gshm_log_info("cluster: node '%s' listening on %s, %u peer(s), %u connections at most",
                ll->node_name, ll->listen, ll->npeers, ll->max_conns);
  return 0;
}

/* The cluster's connections (strangers' hellos aside: admit.c): what
 * every peer of cluster.peers holds at once, its link and this node's
 * (2) and their cluster.streams data lanes (2 x streams), and 2 more
 * while a lost link is replaced; at least LINK_MAX_FDS, at most a quarter
 * of gshmd's fds (the rest stays for local clients).  LINK_MAX_FDS alone
 * (256) held 14 peers' at 8 streams: from the 15th, peers' links were
 * closed at accept (the session 27 attacker review). */
static unsigned conn_budget(const struct links *ll) {
  uint64_t n = (uint64_t)ll->npeers * (4 + 2 * (uint64_t)ll->streams);
  struct rlimit rl;

  if (n < LINK_MAX_FDS)
    n = LINK_MAX_FDS;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < n)
    n = rl.rlim_cur / 4;
  return n ? (unsigned)n : 1;
}

int gshmd__link_start(struct links *ll) {
  int e;

  ll->max_conns = conn_budget(ll);
  gshm_list_init(&ll->links);
  if ((e = gshmd__link_worker_start(ll)) || (e = setup_listener(ll)))
    return e;
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
  }
  if (ll->listener) {
    uv_close((uv_handle_t *)ll->listener, free_handle);
    ll->listener = NULL;
  }
  ll->listen_pending = false;
  if (ll->handles_on) {
    ll->handles_on = false;
    uv_close((uv_handle_t *)&ll->sweep, NULL);
  }
  gshmd__link_worker_stop(ll);
}

void gshmd__link_destroy(struct links *ll) {
  while (ll->links.next && !gshm_list_empty(&ll->links)) {
    struct link *l = gshm_list_entry(ll->links.next, struct link, node);
    gshm_list_del(&l->node);
    gshmd__link_data_orphan(l);
    gshmd__landings_unref(l->landings); /* (its lanes are gone: gshmd__lanes_stop) */
    free(l);
  }
  gshmd__link_worker_destroy(ll);
}
