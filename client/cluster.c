/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm's cluster calls: peers, a peer's segments, pulls
 * (docs/CLUSTER.md).  The daemons move the bytes; these only ask. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

#define GSHM_CLUSTER_PEERS_MAX 16384 /* rows of all pages (cluster.peers holds ~1400) */

/* One page of the PEERS reply (its body checked): the peers after
 * cursor `after`; 0: the first page, with the pulls in flight. */
static int peers_request(gshm_client_t *c, uint64_t after, Gshm__Reply **reply_out) {
  Gshm__PeersRequest m = GSHM__PEERS_REQUEST__INIT;

  m.after = after;
  return gshm__request_body(c, GSHM_WIRE_PEERS, &m.base, GSHM__REPLY__BODY_CLUSTER_PEERS,
                            reply_out);
}

/* An up peer's "MAJOR.MINOR" and subkeys into o (left 0 where the
 * daemon said none, or something else). */
static void proto_parse(const Gshm__ClusterPeer *p, gshm_cluster_peer_t *o) {
  unsigned long major, minor;
  char *end;

  if (!p->protocol || !p->protocol[0])
    return;
  major = strtoul(p->protocol, &end, 10);
  if (*end != '.' || major == 0)
    return;
  minor = strtoul(end + 1, &end, 10);
  if (*end)
    return;
  o->protocol_major = major > 255 ? 255 : (uint8_t)major;
  o->protocol_minor = minor > 255 ? 255 : (uint8_t)minor;
  o->subkeys = p->subkeys ? 1 : 0;
}

/* Appends page's peers to *a (*n of them, room for *cap). */
static int peers_add(const Gshm__ClusterPeerList *page, gshm_cluster_peer_t **a, size_t *n,
                     size_t *cap) {
  if (*n + page->n_peers > *cap) {
    size_t want = *cap ? *cap * 2 : 64;
    gshm_cluster_peer_t *b;
    while (want < *n + page->n_peers)
      want *= 2;
    if (!(b = realloc(*a, want * sizeof(*b))))
      return -ENOMEM;
    *a = b;
    *cap = want;
  }
  for (size_t i = 0; i < page->n_peers; i++) {
    const Gshm__ClusterPeer *p = page->peers[i];
    gshm_cluster_peer_t *o = &(*a)[(*n)++];
    memset(o, 0, sizeof(*o));
    snprintf(o->name, sizeof(o->name), "%s", p->name);
    snprintf(o->address, sizeof(o->address), "%s", p->address);
    snprintf(o->state, sizeof(o->state), "%s", p->state);
    o->exported = p->exported;
    proto_parse(p, o);
    snprintf(o->message, sizeof(o->message), "%s", p->message);
  }
  return 0;
}

/* The peers, page after page: a daemon's cursor must move forward, and
 * the pages may not add up to more than GSHM_CLUSTER_PEERS_MAX rows (a
 * daemon that never ends its list fails the call, -EPROTO). */
int gshm_cluster_peers(gshm_client_t *c, char *node_name_out, gshm_cluster_peer_t **peers_out,
                       size_t *count_out) {
  gshm_cluster_peer_t *a = NULL;
  size_t n = 0, cap = 0;
  uint64_t after = 0;
  char node[64] = "";
  int e;

  if (!c || !peers_out || !count_out)
    return -EINVAL;
  do {
    Gshm__Reply *reply = NULL;
    const Gshm__ClusterPeerList *page;
    if ((e = peers_request(c, after, &reply)))
      break;
    page = reply->cluster_peers;
    if (after == 0) /* (written out on success only, as every *_out) */
      snprintf(node, sizeof(node), "%s", page->node_name);
    if ((page->next && page->next <= after) || n + page->n_peers > GSHM_CLUSTER_PEERS_MAX)
      e = -EPROTO;
    else
      e = peers_add(page, &a, &n, &cap);
    after = page->next;
    gshm__reply__free_unpacked(reply, NULL);
  } while (!e && after);
  if (e) {
    free(a);
    return e;
  }
  if (node_name_out)
    memcpy(node_name_out, node, sizeof(node));
  *peers_out = a;
  *count_out = n;
  return 0;
}

int gshm_cluster_pulls(gshm_client_t *c, gshm_cluster_pull_t **pulls_out, size_t *count_out) {
  uint64_t total;

  return gshm_cluster_pulls_counted(c, pulls_out, count_out, &total);
}

int gshm_cluster_pulls_counted(gshm_client_t *c, gshm_cluster_pull_t **pulls_out,
                               size_t *count_out, uint64_t *total_out) {
  Gshm__Reply *reply = NULL;
  gshm_cluster_pull_t *a = NULL;
  uint64_t total;
  size_t n;
  int e;

  if (!c || !pulls_out || !count_out || !total_out)
    return -EINVAL;
  if ((e = peers_request(c, 0, &reply)))
    return e;
  n = reply->cluster_peers->n_pulls;
  /* (a daemon before pulls_total sends 0) */
  total = reply->cluster_peers->pulls_total > n ? reply->cluster_peers->pulls_total : n;
  if (n && !(a = calloc(n, sizeof(*a)))) {
    gshm__reply__free_unpacked(reply, NULL);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const Gshm__ClusterPull *p = reply->cluster_peers->pulls[i];
    snprintf(a[i].peer, sizeof(a[i].peer), "%s", p->peer);
    snprintf(a[i].name, sizeof(a[i].name), "%s", p->name);
    snprintf(a[i].local_name, sizeof(a[i].local_name), "%s",
             p->local_name && *p->local_name ? p->local_name : p->name);
    a[i].prefix = p->prefix;
    a[i].uid = p->uid;
    a[i].bytes_done = p->bytes_done;
    a[i].bytes_total = p->bytes_total;
    a[i].segments_done = p->segments_done;
    a[i].segments_total = p->segments_total;
    a[i].elapsed_ns = p->elapsed_ns;
    snprintf(a[i].ending, sizeof(a[i].ending), "%s", p->ending ? p->ending : "");
  }
  gshm__reply__free_unpacked(reply, NULL);
  *pulls_out = a;
  *count_out = n;
  *total_out = total;
  return 0;
}

int gshm_list_remote(gshm_client_t *c, const char *peer, gshm_segment_info_t **infos_out,
                     size_t *count_out) {
  if (!peer)
    return -EINVAL;
  return gshm__list_all(c, GSHM_WIRE_REMOTE_LIST, peer, GSHM__REPLY__BODY_SEGMENTS,
                        gshm__list_add_segments, (void **)infos_out, count_out);
}

/* A single pull's result; name: the peer's name of the segment. */
static void result_from_wire(gshm_pull_result_t *out, const Gshm__PullResult *r,
                             const char *name) {
  memset(out, 0, sizeof(*out));
  gshm__info_from_wire(&out->segment, r->segment);
  out->bytes = r->bytes;
  out->elapsed_ns = r->elapsed_ns;
  snprintf(out->path, sizeof(out->path), "%s", r->path);
  snprintf(out->path_reason, sizeof(out->path_reason), "%s", r->path_reason);
  snprintf(out->peer, sizeof(out->peer), "%s", r->peer);
  out->remote_id = r->remote_id;
  out->remote_generation = r->remote_generation;
  snprintf(out->remote_name, sizeof(out->remote_name), "%s", name);
  out->relayed = r->relayed;
}

/* One segment of a set from its pull_items entry; its name on the peer
 * from the request (prefix, local prefix); its peer the entry's, else
 * the request's; its source as the entry gives it, else (the peer's own
 * segment) the peer's name and ids; its
 * owner and mode, which the entry does not carry, as gshmd makes them:
 * the caller's and the mode asked for (0: 0600). */
static void item_from_wire(gshm_pull_result_t *out, const Gshm__PulledSegment *it,
                           const char *peer, const char *prefix, const char *local,
                           uint32_t mode) {
  size_t ll = strlen(local);

  if (it->peer && *it->peer) /* (one of several the request named) */
    peer = it->peer;
  memset(out, 0, sizeof(*out));
  out->segment.uid = geteuid();
  out->segment.gid = getegid();
  out->segment.mode = mode ? mode : 0600;
  snprintf(out->segment.name, sizeof(out->segment.name), "%s", it->name);
  out->segment.id = it->id;
  out->segment.generation = it->generation;
  out->segment.size = it->size;
  out->segment.requested_size = it->bytes;
  snprintf(out->segment.location, sizeof(out->segment.location), "%s", it->location);
  out->segment.device_index = it->device_index;
  out->segment.granularity = it->granularity;
  out->segment.created_ns = it->created_ns;
  snprintf(out->remote_name, sizeof(out->remote_name), "%s%s", prefix,
           strncmp(it->name, local, ll) ? "" : it->name + ll);
  if (it->source && *it->source)
    snprintf(out->segment.source, sizeof(out->segment.source), "%s", it->source);
  else
    snprintf(out->segment.source, sizeof(out->segment.source), "%s:%s#%" PRIu64 ".%" PRIu64,
             peer, out->remote_name, it->remote_id, it->remote_generation);
  out->bytes = it->bytes;
  snprintf(out->path, sizeof(out->path), "%s", it->path);
  if (it->path_reason) /* (an older gshmd sends none) */
    snprintf(out->path_reason, sizeof(out->path_reason), "%s", it->path_reason);
  snprintf(out->peer, sizeof(out->peer), "%s", peer);
  out->remote_id = it->remote_id;
  out->remote_generation = it->remote_generation;
  out->relayed = it->relayed;
}

/* A set's items so far (pull_items pages, in order). */
struct pulled {
  gshm_pull_result_t *v;
  size_t n, cap;
};

static int add_items(struct pulled *pd, const Gshm__PullItems *pi, const Gshm__PullRequest *m) {
  const char *local = m->local_name && *m->local_name ? m->local_name : m->name;

  if (pi->first != pd->n || pi->n_items > 4096 || pd->n + pi->n_items > 4096)
    return -EPROTO;
  if (pd->n + pi->n_items > pd->cap) {
    size_t cap = pd->n + pi->n_items + 256;
    gshm_pull_result_t *v = realloc(pd->v, cap * sizeof(*v));
    if (!v)
      return -ENOMEM;
    pd->v = v;
    pd->cap = cap;
  }
  for (size_t i = 0; i < pi->n_items; i++)
    item_from_wire(&pd->v[pd->n++], pi->items[i], m->peer, m->name, local, m->mode);
  return 0;
}

/* The result r that ends a pull of name (prefix: a set, whose items came
 * before it into pd): a single pull's one entry made, a set's completed.
 * Returns 0, -ENOMEM, or -EPROTO (a set's pages missing). */
static int result_take(struct pulled *pd, const Gshm__PullResult *r, bool prefix,
                       const char *name) {
  if (!prefix) {
    if (!(pd->v = calloc(1, sizeof(*pd->v))))
      return -ENOMEM;
    result_from_wire(&pd->v[0], r, name);
    pd->n = 1;
    return 0;
  }
  if (r->count != pd->n || !pd->n)
    return -EPROTO; /* pages missing */
  /* each segment's path and reason came with its item (an older gshmd:
   * only the first one's, in the result) */
  if (!pd->v[0].path_reason[0])
    snprintf(pd->v[0].path_reason, sizeof(pd->v[0].path_reason), "%s", r->path_reason);
  for (size_t i = 0; i < pd->n; i++)
    pd->v[i].elapsed_ns = r->elapsed_ns;
  return 0;
}

int gshm_pull_cancel(gshm_client_t *c) {
  if (!c)
    return -EINVAL;
  atomic_store(&c->pull_cancel, true);
  return 0;
}

/* The pull's progress callback again, with the last report's figures,
 * when a signal cut its wait short (struct gshm__pull_wait). */
struct pull_signal {
  const gshm_pull_opts_t *opts;
  gshm_pull_progress_t last;
};

static void pull_on_signal(void *arg) {
  struct pull_signal *ps = arg;
  ps->opts->progress(&ps->last, ps->opts->progress_arg);
}

/* One PULL request: progress replies, then (a set) pull_items pages, then
 * the result.  *results_out (malloc'ed) gets one entry per segment. */
static int pull_request(gshm_client_t *c, const char *peer, const char *name, bool prefix,
                        const gshm_pull_opts_t *opts, gshm_pull_result_t **results_out,
                        size_t *count_out) {
  Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  struct pulled pd = {0};
  struct pull_signal ps = {.opts = opts, .last.segments_total = prefix ? 0 : 1};
  struct gshm__pull_wait wait = {.on_signal = opts && opts->progress ? pull_on_signal : NULL,
                                 .arg = &ps};
  uint8_t token[GSHM_PULL_TOKEN_BYTES];
  int e;

  m.peer = (char *)peer;
  m.name = (char *)name;
  m.prefix = prefix;
  if (opts) {
    m.local_name = (char *)(opts->local_name ? opts->local_name : "");
    m.location = (char *)(opts->location ? opts->location : "");
    m.mode = opts->mode;
    m.replace = opts->replace != 0;
  }
  /* a resend after a gshmd restart of a single pull, or of a set of one
   * segment, is answered with the segment the first one published (gshmd
   * notes it under the token) */
  if (gshm__draw_token(token, sizeof(token))) {
    m.token.data = token;
    m.token.len = sizeof(token);
  }
  if ((e = gshm__client_lock(c)))
    return e;
  atomic_store(&c->pull_cancel, false); /* (a cancel asked before this pull is not for it) */
  c->pull_wait = &wait;
  e = gshm__request(c, GSHM_WIRE_PULL, &m.base, &reply, NULL);
  while (!e) {
    if (reply->body_case == GSHM__REPLY__BODY_PULL_PROGRESS) {
      const Gshm__PullProgress *p = reply->pull_progress;
      ps.last = (gshm_pull_progress_t){.bytes_done = p->bytes_done,
                                       .bytes_total = p->bytes_total,
                                       .elapsed_ns = p->elapsed_ns,
                                       .segments_done = p->segments_done,
                                       .segments_total = prefix ? p->segments_total : 1};
      if (opts && opts->progress)
        opts->progress(&ps.last, opts->progress_arg);
    } else if (prefix && reply->body_case == GSHM__REPLY__BODY_PULL_ITEMS) {
      if ((e = add_items(&pd, reply->pull_items, &m)))
        break;
    } else if (reply->body_case == GSHM__REPLY__BODY_PULL_RESULT && reply->pull_result->segment) {
      e = result_take(&pd, reply->pull_result, prefix, name);
      break;
    } else {
      e = -EPROTO;
      break;
    }
    gshm__reply__free_unpacked(reply, NULL);
    reply = NULL;
    e = gshm__request_more(c, GSHM_WIRE_PULL, &reply);
  }
  c->pull_wait = NULL;
  pthread_mutex_unlock(&c->lock);
  if (reply)
    gshm__reply__free_unpacked(reply, NULL);
  if (e) {
    free(pd.v);
    return e;
  }
  *results_out = pd.v;
  *count_out = pd.n;
  return 0;
}

int gshm_pull(gshm_client_t *c, const char *peer, const char *name, const gshm_pull_opts_t *opts,
              gshm_pull_result_t *result_out) {
  gshm_pull_result_t *res;
  size_t n;
  int e;

  if (!c || !peer || !name)
    return -EINVAL;
  if ((e = pull_request(c, peer, name, false, opts, &res, &n)))
    return e;
  if (result_out)
    *result_out = res[0];
  free(res);
  return 0;
}

int gshm_pull_prefix(gshm_client_t *c, const char *peer, const char *prefix,
                     const gshm_pull_opts_t *opts, gshm_pull_result_t **results_out,
                     size_t *count_out) {
  if (!c || !peer || !prefix || !results_out || !count_out)
    return -EINVAL;
  return pull_request(c, peer, prefix, true, opts, results_out, count_out);
}
