/* SPDX-License-Identifier: Apache-2.0 */
/* PEERS: the configured peers, their state and the segments each exports
 * now.  The count a peer gave in its hello goes stale as segments come
 * and go there, so each PEERS asks every up peer again (a List that
 * returns no segment, only the total) and answers when all have, or
 * after GSHMD_PEERS_WAIT_MS with the last known count of the others. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "internal.h"
#include "wire.h"
#include "util.h"

/* One peer's count being asked for. */
struct count_req {
  struct peer_req preq;
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__ListRequest req;
  struct peers_query *q;
};

/* One PEERS waiting for the counts. */
struct peers_query {
  struct gshmd_cluster *cl;
  struct gshmd_client *client; /* NULL: went away, nothing to answer */
  uint32_t request_id;
  unsigned pending;            /* count requests whose done has not run */
  bool answered;
  bool timer_open;             /* until its close callback ran */
  uv_timer_t timer;
  struct count_req *reqs;      /* one per up peer */
  unsigned nreqs;
  struct gshm_list node;       /* cl->peer_queries */
};

/* Peer p as row ci (its strings stay p's); an up peer with the protocol
 * its hello announced and whether its link uses the subkeys. */
static void peer_row(struct peer *p, Gshm__ClusterPeer *ci) {
  gshm__cluster_peer__init(ci);
  ci->name = p->name;
  ci->address = p->address;
  ci->state = p->state == PEER_UP ? "up" : p->state == PEER_CONNECTING ? "connecting" : "down";
  ci->exported = p->exported;
  gshm__text_clean(p->why); /* may hold a peer's refusal */
  ci->message = p->why;
  if (p->state == PEER_UP && p->out) { /* (what the hello of the link in use said) */
    snprintf(p->protocol, sizeof(p->protocol), "%u.%u", p->out->major_theirs,
             p->out->minor_theirs);
    ci->protocol = p->protocol;
    ci->subkeys = p->out->subkeys;
  }
}

/* The first page's pulls in flight that viewer may see (its uid's, or
 * all for an admin: docs/SECURITY.md): the first GSHMD_PULLS_SHOWN of
 * them, as many as fit in room bytes (the rest of the page is the
 * peers'); pulls_total counts them all.  A pull has no stable place in a
 * list that changes as pulls end, so pulls are bounded, not paged. */
static void fill_pulls(struct gshmd_cluster *cl, const struct gshmd_client *viewer, size_t room) {
  size_t n = gshmd__pull_describe(cl, viewer, cl->pull_infos, GSHMD_PULLS_SHOWN,
                                  &cl->peer_list.pulls_total),
         used = 0, kept = 0;

  for (; kept < n; kept++) {
    const Gshm__ClusterPull *o = &cl->pull_infos[kept];
    size_t sz = gshm__wire_embedded_size(gshm__cluster_pull__get_packed_size(o));
    if (used + sz > room)
      break;
    used += sz;
    cl->pull_ptrs[kept] = &cl->pull_infos[kept];
  }
  cl->peer_list.n_pulls = kept;
  cl->peer_list.pulls = cl->pull_ptrs;
}

/* Fills reply->cluster_peers from what is known now: the peers after
 * cursor `after` (peer i of cluster.peers is i + 1), as many as fit one
 * packet (the first always: a row is under 420 bytes), next the cursor of
 * the last one (0: it was the last); after 0 adds the pulls in flight
 * that viewer may see.
 * Any cursor from the wire: one past the last peer or more is an empty,
 * last page; the work is one page's. */
static void fill_peers(struct gshmd_cluster *cl, const struct gshmd_client *viewer,
                       Gshm__Reply *reply, uint64_t after) {
  size_t budget = gshm__wire_list_budget(cl->cfg->max_packet), used;
  unsigned n = 0;

  gshm__cluster_peer_list__init(&cl->peer_list);
  cl->peer_list.node_name = cl->ll.node_name;
  cl->peer_list.listen = cl->cfg->cluster_listen ? cl->cfg->cluster_listen : "";
  cl->peer_list.cuda_memory = cl->ll.cuda_memory;
  if (after == 0)
    fill_pulls(cl, viewer, budget / 2);
  cl->peer_list.next = UINT64_MAX; /* (sized at its largest) */
  used = gshm__cluster_peer_list__get_packed_size(&cl->peer_list);
  cl->peer_list.next = 0;
  for (uint64_t i = after; i < cl->ll.npeers; i++) {
    Gshm__ClusterPeer *ci = &cl->peer_infos[n];
    size_t sz;
    peer_row(&cl->ll.peers[i], ci);
    sz = gshm__wire_embedded_size(gshm__cluster_peer__get_packed_size(ci));
    if (n && used + sz > budget) {
      cl->peer_list.next = i; /* (the cursor of peer i - 1) */
      break;
    }
    used += sz;
    cl->peer_ptrs[n++] = ci;
  }
  cl->peer_list.n_peers = n;
  cl->peer_list.peers = cl->peer_ptrs;
  reply->body_case = GSHM__REPLY__BODY_CLUSTER_PEERS;
  reply->cluster_peers = &cl->peer_list;
}

static void query_free_if_done(struct peers_query *q) {
  if (q->answered && !q->pending && !q->timer_open) {
    gshm_list_del(&q->node);
    free(q->reqs);
    free(q);
  }
}

static void on_timer_closed(uv_handle_t *h) {
  struct peers_query *q = h->data;
  q->timer_open = false;
  query_free_if_done(q);
}

/* Answers the query (once) with what is known now. */
static void query_answer(struct peers_query *q) {
  Gshm__Reply reply = GSHM__REPLY__INIT;

  if (q->answered)
    return;
  q->answered = true;
  if (q->client) {
    reply.status = GSHM__STATUS__STATUS_OK;
    fill_peers(q->cl, q->client, &reply, 0);
    q->cl->reply(q->cl->reply_arg, q->client, GSHM_WIRE_PEERS, q->request_id, &reply);
  }
  uv_timer_stop(&q->timer);
  uv_close((uv_handle_t *)&q->timer, on_timer_closed);
}

static void on_wait_over(uv_timer_t *t) { query_answer(t->data); }

static void count_done(struct peer_req *req, int err, const char *why,
                       const Gshm__Cluster__Msg *m) {
  struct count_req *cr = req->arg;
  struct peers_query *q = cr->q;

  (void)why;
  if (!err && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST_REPLY)
    req->peer->exported = m->list_reply->total;
  if (--q->pending == 0)
    query_answer(q);
  query_free_if_done(q);
}

/* Asks each up peer for its count on behalf of q.  Returns how many were
 * asked. */
static unsigned ask_up_peers(struct gshmd_cluster *cl, struct peers_query *q) {
  for (unsigned i = 0; i < cl->ll.npeers; i++) {
    struct peer *p = &cl->ll.peers[i];
    struct count_req *cr = &q->reqs[q->nreqs];
    if (p->state != PEER_UP)
      continue;
    cr->q = q;
    gshm__cluster__msg__init(&cr->msg);
    gshm__cluster__list_request__init(&cr->req);
    cr->req.after = UINT64_MAX; /* no segment, only the total */
    cr->msg.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
    cr->msg.list = &cr->req;
    cr->preq.msg = &cr->msg;
    cr->preq.done = count_done;
    cr->preq.arg = cr;
    q->nreqs++;
    q->pending++;
    gshmd__link_req_submit(&cl->ll, p, &cr->preq);
  }
  return q->nreqs;
}

/* The queries whose counts are still asked for (answered or not). */
static unsigned queries_waiting(struct gshmd_cluster *cl) {
  struct gshm_list *pos;
  unsigned n = 0;
  gshm_list_foreach(pos, &cl->peer_queries) {
    n += gshm_list_entry(pos, struct peers_query, node)->pending > 0;
  }
  return n;
}

int gshmd_cluster_handle_peers(struct gshmd_cluster *cl, struct gshmd_client *c,
                               uint32_t request_id, uint64_t after, Gshm__Reply *reply,
                               bool *deferred_out) {
  static Gshm__ClusterPeerList empty;
  struct peers_query *q;
  unsigned up = 0;

  *deferred_out = false;
  if (!cl) {
    gshm__cluster_peer_list__init(&empty);
    reply->body_case = GSHM__REPLY__BODY_CLUSTER_PEERS;
    reply->cluster_peers = &empty;
    return 0;
  }
  for (unsigned i = 0; i < cl->ll.npeers; i++)
    up += cl->ll.peers[i].state == PEER_UP;
  /* (a query stays until its peers' counts came, or their links failed:
   * a peer that answers none would otherwise have a local user without
   * any right make it a query, a timer and a request a PEERS; a later
   * page answers at once: its counts are those the first page asked) */
  if (!up || after || cl->ll.stopping || queries_waiting(cl) >= GSHMD_PEERS_QUERIES) {
    fill_peers(cl, c, reply, after);
    return 0;
  }
  if (!(q = calloc(1, sizeof(*q))) || !(q->reqs = calloc(up, sizeof(*q->reqs)))) {
    free(q);
    return -ENOMEM;
  }
  q->cl = cl;
  q->client = c;
  q->request_id = request_id;
  uv_timer_init(cl->loop, &q->timer);
  q->timer.data = q;
  q->timer_open = true;
  gshm_list_add_tail(&cl->peer_queries, &q->node);
  uv_timer_start(&q->timer, on_wait_over, GSHMD_PEERS_WAIT_MS, 0);
  *deferred_out = true;
  ask_up_peers(cl, q); /* a done may run at once: the query then answers */
  return 0;
}

void gshmd__peers_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c) {
  struct gshm_list *pos;

  gshm_list_foreach(pos, &cl->peer_queries) {
    struct peers_query *q = gshm_list_entry(pos, struct peers_query, node);
    if (q->client == c)
      q->client = NULL;
  }
}

void gshmd__peers_stop(struct gshmd_cluster *cl) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &cl->peer_queries) {
    query_answer(gshm_list_entry(pos, struct peers_query, node));
  }
}
