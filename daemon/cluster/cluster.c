/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster's front door: start and stop, the link layer's hooks
 * (which file above it gets what), the local requests REMOTE_LIST and
 * PULL (PEERS: peers.c), and the metrics.  docs/CLUSTER.md states the
 * protocol and the trust model. */
#include "cluster.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "errors.h"
#include "internal.h"
#include "lane.h"
#include "log.h"
#include "loglimit.h"
#include "registry.h"
#include "util.h"
#include "wire.h"

/* ---- the link layer's hooks ------------------------------------------- */

static void on_connect(struct link *l) { gshmd__hello_begin(l); }

/* A message that is not an answer: a hello step, or a peer's request. */
static void on_message(struct link *l, Gshm__Cluster__Msg *m) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  bool up = l->state == LINK_UP;

  if ((up && gshmd__serve_handle(cl, l, m)) || gshmd__hello_handle(cl, l, m))
    return;
  gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO,
                     up ? "unexpected message" : "message before the hello");
}

static void on_lost(struct link *l, int err, const char *why) {
  gshmd__serve_link_lost(cluster_of(l->ll), l);
  /* (the pulls fail with why before their UCX receives end them) */
  gshmd__pull_link_lost(cluster_of(l->ll), l, err, why);
  gshmd__link_data_lost(l, err == -ETIMEDOUT || err == -EPROTO ? err : -ECONNRESET);
}

static void on_idle(struct link *l) { gshmd__serve_link_idle(cluster_of(l->ll), l); }

static void after_progress(void *arg) { gshmd__pull_reap(arg); }

/* The lines l's peer makes gshmd write, held to its rate (loglimit.h). */
static void charge(void *arg, const struct link *l, bool on) {
  struct gshmd_cluster *cl = arg;
  if (cl->loglimit && l->inbound && l->peer)
    gshmd_loglimit_charge_peer(cl->loglimit, on ? l->peer->name : NULL);
}

/* ---- local requests ---------------------------------------------------- */

/* Whether local client c may see and pull what peers export: admins and
 * members of cluster.pull_group.  Returns 0 or -EACCES with *msg_out. */
static int may_pull(const struct gshmd_cluster *cl, const struct gshmd_client *c,
                    const char **msg_out) {
  bool member = c->cred.admin || (cl->have_pull_gid && c->cred.gid == cl->pull_gid);

  for (int i = 0; cl->have_pull_gid && i < c->cred.ngroups && !member; i++)
    member = c->cred.groups[i] == cl->pull_gid;
  if (member)
    return 0;
  *msg_out = cl->have_pull_gid ? cl->pull_refused
                               : "listing and pulling peers' segments is for admins "
                                 "(cluster.pull_group is empty)";
  return -EACCES;
}

/* One REMOTE_LIST in flight: the local client's request and ours to the peer. */
struct remote_list {
  struct peer_req preq;
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__ListRequest req;
  struct gshmd_cluster *cl;
  struct gshmd_client *client;
  uint32_t uid;           /* the requester's (it may go first) */
  uint32_t request_id;
  struct gshm_list node;  /* cl->lists */
};

/* Whether c's user has GSHMD_PULLS_PER_USER remote listings in flight
 * (admins: never); then *msg_out says so. */
static bool lists_full(struct gshmd_cluster *cl, const struct gshmd_client *c,
                       const char **msg_out) {
  struct gshm_list *pos;
  unsigned n = 0;

  if (c->cred.admin)
    return false;
  gshm_list_foreach(pos, &cl->lists) {
    n += gshm_list_entry(pos, struct remote_list, node)->uid == c->cred.uid;
  }
  if (n < GSHMD_PULLS_PER_USER)
    return false;
  *msg_out = "too many listings of peers in flight for this user; try again";
  return true;
}

static void remote_list_done(struct peer_req *req, int err, const char *why,
                             const Gshm__Cluster__Msg *m) {
  struct remote_list *rl = req->arg;
  struct gshmd_cluster *cl = rl->cl;
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__SegmentList list = GSHM__SEGMENT_LIST__INIT;
  Gshm__SegmentInfo *infos = NULL, **ptrs = NULL;
  char msg[GSHMD_PEER_ERROR_LEN];
  size_t n = 0;

  gshm_list_del(&rl->node);
  if (!err && m->body_case != GSHM__CLUSTER__MSG__BODY_LIST_REPLY) {
    err = -EPROTO;
    why = "the peer answered a list with something else";
  }
  /* a page of gshmd's holds at most GSHMD_LIST_PAGE_SEGMENTS; thousands
   * of tiny ones (a 64 KiB frame holds 2,500) made a reply that did not
   * fit the client's packet, and its connection was closed for it */
  if (!err && m->list_reply->n_segments > GSHMD_LIST_PAGE_SEGMENTS) {
    err = -EPROTO;
    why = "the peer listed more segments in one page than a page holds";
  }
  if (!err) {
    const Gshm__Cluster__ListReply *r = m->list_reply;
    n = r->n_segments;
    infos = calloc(n ? n : 1, sizeof(*infos));
    ptrs = calloc(n ? n : 1, sizeof(*ptrs));
    if (!infos || !ptrs) {
      err = -ENOMEM;
      why = "out of memory";
      n = 0;
    }
    for (size_t i = 0; i < n; i++) {
      const Gshm__Cluster__Segment *s = r->segments[i];
      struct gshm_location loc;
      /* what the peer says goes to a local client (and a terminal) */
      if (gshm__name_check(s->name, 255) || gshm__location_parse(s->location, &loc)) {
        err = -EPROTO;
        why = "the peer listed a segment with a malformed name or location";
        n = 0;
        break;
      }
      gshm__segment_info__init(&infos[i]);
      infos[i].id = s->id;
      infos[i].generation = s->generation;
      infos[i].name = s->name;
      infos[i].size = s->allocated;
      infos[i].requested_size = s->size;
      infos[i].location = s->location;
      infos[i].created_ns = s->created_ns;
      infos[i].state = GSHM__SEGMENT_STATE__SEGMENT_STATE_LIVE;
      infos[i].device_index = strcmp(s->location, "host") ? 0 : -1;
      ptrs[i] = &infos[i];
    }
  }
  if (!err) {
    const Gshm__Cluster__ListReply *r = m->list_reply;
    list.n_segments = n;
    list.segments = ptrs;
    list.next = r->next;
    req->peer->exported = r->total;
    reply.body_case = GSHM__REPLY__BODY_SEGMENTS;
    reply.segments = &list;
  }
  if (err) {
    reply.status = gshm__errno_to_status(err);
    reply.message = gshmd__peer_error(req, err, m, why, msg, sizeof(msg));
  } else {
    reply.status = GSHM__STATUS__STATUS_OK;
  }
  if (rl->client)
    cl->reply(cl->reply_arg, rl->client, GSHM_WIRE_REMOTE_LIST, rl->request_id, &reply);
  free(infos);
  free(ptrs);
  free(rl);
}

int gshmd_cluster_handle_remote_list(struct gshmd_cluster *cl, struct gshmd_client *c,
                                     uint32_t request_id, const Gshm__RemoteListRequest *m,
                                     const char **msg_out) {
  struct remote_list *rl;
  struct peer *p;
  int e;

  if (!cl) {
    *msg_out = "the cluster is off on this node (cluster.listen and cluster.peers are empty)";
    return -ENOTSUP;
  }
  if ((e = may_pull(cl, c, msg_out)))
    return e;
  if (!(p = gshmd__link_peer_find(&cl->ll, m->peer))) {
    *msg_out = "no such peer in cluster.peers";
    return -ENOENT;
  }
  if (lists_full(cl, c, msg_out))
    return -EBUSY;
  if (!(rl = calloc(1, sizeof(*rl))))
    return -ENOMEM;
  rl->cl = cl;
  rl->client = c;
  rl->uid = (uint32_t)c->cred.uid;
  rl->request_id = request_id;
  gshm__cluster__msg__init(&rl->msg);
  gshm__cluster__list_request__init(&rl->req);
  rl->req.after = m->after;
  rl->msg.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  rl->msg.list = &rl->req;
  rl->preq.msg = &rl->msg;
  rl->preq.done = remote_list_done;
  rl->preq.arg = rl;
  gshm_list_add_tail(&cl->lists, &rl->node);
  gshmd__link_req_submit(&cl->ll, p, &rl->preq);
  return 0;
}

int gshmd_cluster_handle_pull(struct gshmd_cluster *cl, struct gshmd_client *c,
                              uint32_t request_id, const Gshm__PullRequest *m,
                              const char **msg_out) {
  int e;

  if (!cl) {
    *msg_out = "the cluster is off on this node (cluster.listen and cluster.peers are empty)";
    return -ENOTSUP;
  }
  if ((e = may_pull(cl, c, msg_out)))
    return e;
  return gshmd__pull_start(cl, c, request_id, m, msg_out);
}

void gshmd_cluster_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c) {
  struct gshm_list *pos, *tmp;

  if (!cl)
    return;
  gshm_list_foreach_safe(pos, tmp, &cl->lists) {
    struct remote_list *rl = gshm_list_entry(pos, struct remote_list, node);
    if (rl->client == c) {
      rl->client = NULL; /* an answer on its way is dropped */
      if (gshmd__link_req_cancel(&rl->preq)) {
        gshm_list_del(&rl->node);
        free(rl);
      }
    }
  }
  gshmd__peers_client_gone(cl, c);
  gshmd__pull_cancel(cl, c, NULL);
}

int gshmd_cluster_pull_cancel(struct gshmd_cluster *cl, struct gshmd_client *c,
                              uint32_t request_id) {
  return cl ? gshmd__pull_cancel(cl, c, &request_id) : -ENOENT;
}

/* ---- metrics ---------------------------------------------------------- */

/* The pulls from each peer: by result, segments passed over, bytes by
 * path. */
static void peer_pull_metrics(const struct gshmd_cluster *cl, FILE *f) {
  fprintf(f, "# HELP gshm_cluster_pulls_total Pulls (a set pull or a single one) from each peer, "
             "by result: once for each peer it took any segment from (ok), once for the peer "
             "whose segment failed it first, else its first peer (error); a failure of this "
             "node's own (memory, names, quota, the requester gone) counts for no peer, only in "
             "gshm_cluster_pull_errors_total.\n"
             "# TYPE gshm_cluster_pulls_total counter\n");
  for (unsigned i = 0; i < cl->ll.npeers; i++)
    fprintf(f,
            "gshm_cluster_pulls_total{peer=\"%s\",result=\"ok\"} %" PRIu64 "\n"
            "gshm_cluster_pulls_total{peer=\"%s\",result=\"error\"} %" PRIu64 "\n",
            cl->ll.peers[i].name, cl->ll.peers[i].pulls_ok, cl->ll.peers[i].name,
            cl->ll.peers[i].pulls_failed);
  fprintf(f, "# HELP gshm_cluster_sources_passed_over_total Segments of set pulls naming several "
             "sources that each peer did not grant (asked of another).\n"
             "# TYPE gshm_cluster_sources_passed_over_total counter\n");
  for (unsigned i = 0; i < cl->ll.npeers; i++)
    fprintf(f, "gshm_cluster_sources_passed_over_total{peer=\"%s\"} %" PRIu64 "\n",
            cl->ll.peers[i].name, cl->ll.peers[i].passed_over);
  fprintf(f, "# HELP gshm_cluster_pulled_bytes_total Bytes pulled from each peer, by path.\n"
             "# TYPE gshm_cluster_pulled_bytes_total counter\n");
  for (unsigned i = 0; i < cl->ll.npeers; i++)
    fprintf(f,
            "gshm_cluster_pulled_bytes_total{peer=\"%s\",path=\"host\"} %" PRIu64 "\n"
            "gshm_cluster_pulled_bytes_total{peer=\"%s\",path=\"staged\"} %" PRIu64 "\n"
            "gshm_cluster_pulled_bytes_total{peer=\"%s\",path=\"direct\"} %" PRIu64 "\n",
            cl->ll.peers[i].name, cl->ll.peers[i].bytes_host, cl->ll.peers[i].name,
            cl->ll.peers[i].bytes_staged, cl->ll.peers[i].name, cl->ll.peers[i].bytes_direct);
}

void gshmd_cluster_metrics(struct gshmd_cluster *cl, FILE *f) {
  static const char *const causes[REFUSE_N] = {
      [REFUSE_PROTOCOL] = "protocol", [REFUSE_VERSION] = "version",
      [REFUSE_UNKNOWN_PEER] = "unknown_peer", [REFUSE_BAD_KEY] = "bad_key",
      [REFUSE_TIMEOUT] = "timeout", [REFUSE_LIMIT] = "limit", [REFUSE_TAMPERED] = "tampered"};
  if (!cl)
    return;
  fprintf(f, "# HELP gshm_cluster_peer_up 1 when the endpoint to the peer is authenticated.\n"
             "# TYPE gshm_cluster_peer_up gauge\n");
  for (unsigned i = 0; i < cl->ll.npeers; i++)
    fprintf(f, "gshm_cluster_peer_up{peer=\"%s\"} %d\n", cl->ll.peers[i].name,
            cl->ll.peers[i].state == PEER_UP);
  fprintf(f, "# HELP gshm_cluster_lanes Data lanes (extra TCP connections, cluster.streams) up "
             "on this node's link to each peer.\n"
             "# TYPE gshm_cluster_lanes gauge\n");
  for (unsigned i = 0; i < cl->ll.npeers; i++) {
    const struct link *out = cl->ll.peers[i].out;
    fprintf(f, "gshm_cluster_lanes{peer=\"%s\"} %u\n", cl->ll.peers[i].name,
            out && out->state == LINK_UP ? out->nlanes : 0);
  }
  fprintf(f, "# HELP gshm_cluster_connections Cluster connections (links and data lanes, both "
             "ways; hosts that are not peers in their hello apart), and the most gshmd keeps "
             "(enough for every peer of cluster.peers, at least 256).\n"
             "# TYPE gshm_cluster_connections gauge\n"
             "gshm_cluster_connections{kind=\"open\"} %u\n"
             "gshm_cluster_connections{kind=\"budget\"} %u\n",
          gshmd__link_peer_conns(&cl->ll), cl->ll.max_conns);
  peer_pull_metrics(cl, f);
  fprintf(f, "# HELP gshm_cluster_refusals_total Peers and packets refused on the cluster "
             "endpoint, by cause.\n"
             "# TYPE gshm_cluster_refusals_total counter\n");
  for (int i = 0; i < REFUSE_N; i++)
    fprintf(f, "gshm_cluster_refusals_total{cause=\"%s\"} %" PRIu64 "\n", causes[i],
            cl->ll.refusals[i]);
  fprintf(f, "# HELP gshm_cluster_pull_errors_total Failed pulls, by cause.\n"
             "# TYPE gshm_cluster_pull_errors_total counter\n");
  for (int i = 0; i < GSHM_PULL_FAIL_N; i++)
    fprintf(f, "gshm_cluster_pull_errors_total{cause=\"%s\"} %" PRIu64 "\n",
            gshm__pull_failure_label((enum gshm_pull_failure)i), cl->pull_errors[i]);
  fprintf(f, "# HELP gshm_cluster_registrations_total Registrations of served segments with UCX (one per run of overlapping grants whose bytes go over UCX; none for gshm's TCP stream).\n"
             "# TYPE gshm_cluster_registrations_total counter\n"
             "gshm_cluster_registrations_total %" PRIu64 "\n"
             "# HELP gshm_cluster_registered_segments Served segments registered with UCX now (under a live grant).\n"
             "# TYPE gshm_cluster_registered_segments gauge\n"
             "gshm_cluster_registered_segments %u\n"
             "# HELP gshm_cluster_registered_staging_buffers Staging buffers registered with UCX now (held by a grant or pull over UCX).\n"
             "# TYPE gshm_cluster_registered_staging_buffers gauge\n"
             "gshm_cluster_registered_staging_buffers %u\n",
          cl->registrations, cl->registered, cl->stage.registered);
  gshmd_stage_metrics(&cl->stage, f);
  gshmd__pull_pinned_metrics(cl, f);
  fprintf(f, "# HELP gshm_cluster_grants_total Read grants given to peers.\n"
             "# TYPE gshm_cluster_grants_total counter\n"
             "gshm_cluster_grants_total %" PRIu64 "\n"
             "# HELP gshm_cluster_relay_waits_total Peers' reads of a segment still being "
             "pulled here that waited for its chunks (fan-out).\n"
             "# TYPE gshm_cluster_relay_waits_total counter\n"
             "gshm_cluster_relay_waits_total %" PRIu64 "\n"
             "# HELP gshm_cluster_relay_busy_total Of those, waits that lasted half of "
             "cluster.request_timeout_ms and were answered busy (the reader asks again).\n"
             "# TYPE gshm_cluster_relay_busy_total counter\n"
             "gshm_cluster_relay_busy_total %" PRIu64 "\n",
          cl->served_grants, cl->relay_waits, cl->relay_busy);
  fprintf(f, "# HELP gshm_cluster_prefault_bytes_total Bytes of pulled host segments faulted in "
             "on the thread pool ahead of their chunks (cluster.prefault).\n"
             "# TYPE gshm_cluster_prefault_bytes_total counter\n"
             "gshm_cluster_prefault_bytes_total %" PRIu64 "\n",
          cl->pf_bytes);
}

/* ---- start and stop --------------------------------------------------- */

/* Whether the config turns the cluster on. */
static bool cluster_on(const struct gshmd_config *cfg) {
  return (cfg->cluster_listen && *cfg->cluster_listen) ||
         (cfg->cluster_peers && *cfg->cluster_peers);
}

const char *gshmd_cluster_unused_key(const struct gshmd_config *cfg) {
  const struct {
    const char *key, *value;
  } keys[] = {{"cluster.export", cfg->cluster_export},
              {"cluster.pull_group", cfg->cluster_pull_group},
              {"cluster.secret_file", cfg->cluster_secret_file},
              {"cluster.node_name", cfg->cluster_node_name}};

  if (cluster_on(cfg))
    return NULL;
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    if (keys[i].value && *keys[i].value)
      return keys[i].key;
  return NULL;
}

int gshmd_cluster_check_config(const struct gshmd_config *cfg) {
  struct gshmd_cluster *cl;
  int e;

  if (!cluster_on(cfg))
    return 0;
  if (sodium_init() < 0)
    return -EIO;
  if (!(cl = calloc(1, sizeof(*cl))))
    return -ENOMEM;
  cl->cfg = cfg;
  e = gshmd__cluster_conf(cl);
  gshmd_cluster_destroy(cl);
  return e;
}

/* The links' settings that come straight from cfg's [cluster] keys (the
 * rest, peers and listen address, from gshmd__cluster_conf). */
static void link_settings(struct links *ll, const struct gshmd_config *cfg) {
  ll->encrypt = cfg->cluster_encrypt;
  ll->gmac = strcmp(cfg->cluster_mac, "poly1305") != 0;
  ll->caps_required =
      strcmp(cfg->cluster_min_protocol, "2.6") ? 0 : GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  ll->streams = cfg->cluster_streams;
  ll->ucx_allowed = !cfg->cluster_encrypt && strcmp(cfg->cluster_transport, "tcp");
  ll->ucx_without_peer_errors = !strcmp(cfg->cluster_transport, "ucx");
  ll->request_timeout_ns = (int64_t)cfg->cluster_request_timeout_ms * 1000000;
  ll->hello_timeout_ns =
      (int64_t)(cfg->partial_timeout_ms ? cfg->partial_timeout_ms : 5000) * 1000000;
}

int gshmd_cluster_start(uv_loop_t *loop, const struct gshmd_config *cfg,
                        struct gshmd_registry *reg, gshmd_cluster_reply_fn reply,
                        void *reply_arg, struct gshmd_cluster **cl_out) {
  const char *unused = gshmd_cluster_unused_key(cfg);
  struct gshmd_cluster *cl;
  int e;

  *cl_out = NULL;
  if (unused)
    gshm_log_warn(GSHMD_CLUSTER_UNUSED_KEY_FMT, unused);
  if (!cluster_on(cfg))
    return 0;
  if (sodium_init() < 0) {
    gshm_log_err("cluster: libsodium does not initialise");
    return -EIO;
  }
  if (!(cl = calloc(1, sizeof(*cl))))
    return -ENOMEM;
  cl->loop = loop;
  cl->cfg = cfg;
  cl->reg = reg;
  cl->reply = reply;
  cl->reply_arg = reply_arg;
  cl->started_uid = geteuid(); /* (the switch to daemon.user comes after) */
  gshm_list_init(&cl->pulls);
  cl->serve_again = gshmd__serve_handle;
  gshm_list_init(&cl->lists);
  gshm_list_init(&cl->peer_queries);
  gshm_list_init(&cl->relays);
  gshm_list_init(&cl->serve_idle);
  gshm_list_init(&cl->relay_lists);
  gshm_list_init(&cl->prefaults);
  gshmd__prefault_init(cl, reg->host);
  cl->ll.loop = loop;
  cl->ll.hooks = (struct link_hooks){.on_connect = on_connect, .on_message = on_message,
                                     .on_lost = on_lost, .on_idle = on_idle,
                                     .data_dest = gshmd__link_data_dest,
                                     .data_done = gshmd__link_data_done,
                                     .on_up = gshmd__lanes_open,
                                     .on_fail = gshmd__lanes_link_failed,
                                     .lane_overdue = gshmd__lane_overdue,
                                     .after_progress = after_progress, .charge = charge,
                                     .arg = cl};
  link_settings(&cl->ll, cfg);
  if ((e = gshmd__cluster_conf(cl)) || (e = gshmd__cluster_listen_check(&cl->ll)))
    goto fail;
  cl->peer_infos = calloc(cl->ll.npeers + 1, sizeof(*cl->peer_infos));
  cl->peer_ptrs = calloc(cl->ll.npeers + 1, sizeof(*cl->peer_ptrs));
  if (!cl->peer_infos || !cl->peer_ptrs) {
    e = -ENOMEM;
    goto fail;
  }
  if ((e = gshmd__lanes_init(&cl->ll)) || (e = gshmd__link_start(&cl->ll)) ||
      (e = gshmd__link_data_start(&cl->ll)))
    goto fail;
  gshmd_stage_pool_init(&cl->stage, loop, cl->ll.ctx, cfg->cluster_staging_bytes,
                        reg->cuda && reg->cuda->ops->host_alloc && reg->cuda->ops->host_free
                            ? reg->cuda
                            : NULL);
  if (cl->stage.pin || !strcmp(cfg->cluster_staging, "always"))
    gshmd_stage_arena_start(&cl->stage, cfg->cluster_staging_arena);
  reg->on_free = gshmd__serve_segment_free;
  reg->on_free_arg = cl;
  gshm_log_info("cluster: node '%s': %u peer(s), %u export rule(s)", cl->ll.node_name,
                cl->ll.npeers, cl->nexport);
  *cl_out = cl;
  return 0;
fail:
  gshmd_cluster_stop(cl);
  gshmd_cluster_destroy(cl);
  return e;
}

void gshmd_cluster_stop(struct gshmd_cluster *cl) {
  if (!cl || cl->ll.stopping)
    return;
  cl->stage.stopping = true;
  gshmd__peers_stop(cl);
  gshmd__pull_stop_all(cl);
  gshmd__pull_create_stop(cl);
  gshmd__link_stop(&cl->ll);
  gshmd__lanes_stop(&cl->ll); /* the links failed: waits for their lanes' threads */
  gshmd__pull_reap(cl);
  gshmd__pull_stop_answer(cl);
  gshmd_stage_pool_drain(&cl->stage);
  gshmd__serve_stop(cl);
}

void gshmd_cluster_loglimit(struct gshmd_cluster *cl, struct gshmd_loglimit *l) {
  if (cl)
    cl->loglimit = l;
}

void gshmd_cluster_destroy(struct gshmd_cluster *cl) {
  if (!cl)
    return;
  gshmd_stage_pool_drain(&cl->stage);
  gshmd__link_destroy(&cl->ll);
  gshmd__lanes_destroy(&cl->ll);
  for (unsigned i = 0; i < cl->nexport; i++)
    free(cl->exports[i].pattern);
  free(cl->exports);
  free(cl->ll.peers);
  free(cl->peer_infos);
  free(cl->peer_ptrs);
  gshmd__subkeys_wipe(&cl->keys);
  free(cl);
}
