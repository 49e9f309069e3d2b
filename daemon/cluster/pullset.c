/* SPDX-License-Identifier: Apache-2.0 */
/* A pull request as a whole (pull.h): one segment, or every segment a
 * peer exports under a prefix (listed page by page: pull_list.c); grants asked
 * GRANTS_AHEAD segments ahead (fewer for a busy peer); all of them
 * published at once when every byte is in, or all freed; the results in
 * pages; the pulls in flight for PEERS.  pull.c moves each segment's
 * bytes.  docs/CLUSTER.md. */
#include <errno.h>
#include <inttypes.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "errors.h"
#include "log.h"
#include "pull.h"
#include "registry.h"
#include "relay.h"
#include "util.h"
#include "wire.h"

/* The set's index of its items' remote names (s->names). */
static int cmp_remote_name(const void *a, const void *b) { return strcmp(a, b); }

static void name_node_keep(void *name) { (void)name; /* (p->remote_name, freed with p) */ }

bool gshmd__pull_set_has(const struct pull_set *s, const char *name) {
  return tfind(name, &s->names, cmp_remote_name) != NULL;
}

/* p was listed (listed: the peer's entry, size bytes): its hidden
 * segment is made now, or soon.  Returns 0 or a negative errno (the set
 * failed). */
static int item_listed(struct pull *p, uint64_t size, const Gshm__Cluster__Segment *listed) {
  struct pull_set *s = p->s;
  char src[400];

  gshmd__pull_source_text(p, listed, src, sizeof(src));
  p->listed_device = gshmd__pull_location_device(listed->location);
  /* A host segment (a peer's device segment pulled into host memory
   * too) is made (and mapped) now, before any byte comes: made a few a
   * loop turn instead, their mmaps met the lanes' page faults on the mmap
   * lock and the 398-tensor model's host set took 0.133-0.166 s against
   * 0.101-0.121 (lent 16-core H100 machine, interleaved). */
  if (!gshmd__pull_lands_on_device(p, p->listed_device))
    return gshmd__pull_item_create(p, size, p->listed_device, src);
  /* A device segment is made a few a loop turn from now (or at its
   * grant): the model's 398 made here at once held the loop for 40-64
   * ms on the lent H200 machine before the first grant went out; made so,
   * its pull into a GPU took 0.116-0.123 s against 0.126-0.133 (H100,
   * interleaved). */
  if (!(p->listed_source = strdup(src))) {
    gshmd__pull_set_fail_here(s, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  p->create_listed = true;
  s->to_create++;
  gshmd__pull_create_start(s->cl);
  return 0;
}

int gshmd__pull_set_add(struct pull_set *s, const char *name, uint64_t size,
                        const Gshm__Cluster__Segment *listed) {
  struct gshmd_cluster *cl = s->cl;
  struct gshmd_segment *old;
  struct pull *p;
  int e;

  if (s->n == PULL_SET_MAX) {
    gshmd__pull_set_fail(s, -E2BIG, "more than %u segments under '%s' on peer '%s'", PULL_SET_MAX, s->name,
             s->peer->name);
    return -E2BIG;
  }
  if (s->n == s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 16;
    struct pull **a = realloc(s->items, ncap * sizeof(*a));
    if (!a) {
      gshmd__pull_set_fail_here(s, -ENOMEM, "out of memory");
      return -ENOMEM;
    }
    s->items = a;
    s->cap = ncap;
  }
  if (!(p = calloc(1, sizeof(*p)))) {
    gshmd__pull_set_fail_here(s, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  p->index = s->n;
  s->items[s->n++] = p;
  p->s = s;
  snprintf(p->remote_name, sizeof(p->remote_name), "%s", name);
  if (!tsearch(p->remote_name, &s->names, cmp_remote_name)) {
    gshmd__pull_set_fail_here(s, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  if (!s->prefix)
    snprintf(p->local_name, sizeof(p->local_name), "%s", s->local);
  else if ((size_t)snprintf(p->local_name, sizeof(p->local_name), "%s%s", s->local,
                            name + strlen(s->name)) >= sizeof(p->local_name))
    p->local_name[0] = '\0';
  if ((e = gshm__name_check(p->local_name, cl->cfg->max_name))) {
    gshmd__pull_set_fail(s, e, "segment '%s' of peer '%s' would be '%s' here: not a valid name", name,
             s->peer->name, p->local_name);
    return e;
  }
  if (!s->replace && gshmd_registry_find_name(cl->reg, p->local_name)) {
    gshmd__pull_set_fail_here(s, -EEXIST, "a local segment named '%s' exists", p->local_name);
    return -EEXIST;
  }
  /* (the publish checks it again; here before a byte moves, not after all of them) */
  if (s->replace && (old = gshmd_registry_find_name(cl->reg, p->local_name)) &&
      !gshmd_registry_may_manage(s->holder, old)) {
    gshmd__pull_set_fail_here(s, -EACCES, "segment '%s' is not yours to replace (its owner or "
                              "an admin may; or pull it under another name with --as)",
                              p->local_name);
    return -EACCES;
  }
  snprintf(p->location, sizeof(p->location), "%s", s->location);
  p->listed = size;
  p->listed_id = listed ? listed->id : 0;
  p->listed_gen = listed ? listed->generation : 0;
  s->total += size;
  gshm__cluster__msg__init(&p->msg);
  gshm__cluster__grant_request__init(&p->greq);
  p->greq.name = p->remote_name;
  /* (the one listed: in flight there, not the segment its pull replaces;
   * grants.c sets greq.in_flight for the source it asks) */
  p->listed_in_flight = listed && listed->in_flight;
  p->msg.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  p->msg.grant_request = &p->greq;
  p->req.msg = &p->msg;
  p->req.done = gshmd__pull_grant_done;
  p->req.arg = p;
  return listed ? item_listed(p, size, listed) : 0;
}

/* ---- listed segments made a few a loop turn ---- */

/* Hidden segments made in one loop turn, over all sets: about 1 ms of
 * device segments (0.1-0.16 ms each), so that the lanes' landings and
 * the grants go on between them. */
#define CREATE_BATCH 8

static void on_create_idle(uv_idle_t *h) {
  struct gshmd_cluster *cl = h->data;
  unsigned budget = CREATE_BATCH;
  bool more = false;
  struct gshm_list *pos;

  gshm_list_foreach(pos, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    while (budget && !s->err && s->to_create && s->next_create < s->n) {
      struct pull *p = s->items[s->next_create++];
      if (!p->create_listed)
        continue; /* (made at its grant) */
      budget--;
      if (gshmd__pull_item_create_listed(p))
        break; /* (the set failed) */
    }
    more |= !s->err && s->to_create;
  }
  if (!more) {
    uv_idle_stop(h);
    cl->create_idle_on = false;
  }
  gshmd__link_kick(&cl->ll); /* (grants, and Lists that waited for the set) */
}

void gshmd__pull_create_start(struct gshmd_cluster *cl) {
  if (cl->ll.stopping || cl->create_idle_on)
    return;
  if (!cl->create_idle_init) {
    uv_idle_init(cl->loop, &cl->create_idle);
    cl->create_idle.data = cl;
    cl->create_idle_init = true;
  }
  uv_idle_start(&cl->create_idle, on_create_idle);
  cl->create_idle_on = true;
}

void gshmd__pull_create_stop(struct gshmd_cluster *cl) {
  if (cl->create_idle_init)
    uv_close((uv_handle_t *)&cl->create_idle, NULL);
  cl->create_idle_init = cl->create_idle_on = false;
}

/* A prefix: "" (everything) or the start of a valid name of at most max
 * bytes (what it would be with one more byte).  0, -EINVAL or
 * -ENAMETOOLONG. */
static int prefix_check(const char *prefix, unsigned max) {
  char name[258];
  size_t n = strlen(prefix);

  if (!n)
    return 0;
  if (n >= max || n > 255)
    return -ENAMETOOLONG;
  snprintf(name, sizeof(name), "%sx", prefix);
  return gshm__name_check(name, max);
}

/* The peer's name (or prefix) of m, then the local one: 0, or -EINVAL or
 * -ENAMETOOLONG with *msg_out (cl->reply_msg) saying which is wrong, why. */
static int names_check(struct gshmd_cluster *cl, const Gshm__PullRequest *m, const char *local,
                       const char **msg_out) {
  unsigned max[2] = {255, cl->cfg->max_name};
  const char *name[2] = {m->name, local};
  int e = 0, i = -1;
  while (!e && ++i < 2)
    e = m->prefix ? prefix_check(name[i], max[i]) : gshm__name_check(name[i], max[i]);
  if (!e)
    return 0;
  if (e == -ENAMETOOLONG) /* (a prefix leaves a byte for the rest of a name) */
    snprintf(cl->reply_msg, sizeof(cl->reply_msg), "the %s %s is longer than %u bytes%s",
             i ? "local" : "peer's", m->prefix ? "prefix" : "name",
             m->prefix ? (max[i] > 255 ? 255 : max[i] - 1) : max[i], i ? " (limits.max_name)" : "");
  else
    snprintf(cl->reply_msg, sizeof(cl->reply_msg),
             "the %s %s '%.160s' is not %s: '/'-separated components, none empty, '.' or '..', "
             "no control characters",
             i ? "local" : "peer's", m->prefix ? "prefix" : "name", name[i],
             m->prefix ? "the start of a name" : "a name");
  *msg_out = cl->reply_msg;
  return e;
}

/* The pulls in flight of uid (its requester gone or not: a set holds
 * its memory and its requests until they end). */
static unsigned pulls_of(struct gshmd_cluster *cl, uid_t uid) {
  struct gshm_list *pos;
  unsigned n = 0;
  gshm_list_foreach(pos, &cl->pulls) {
    n += gshm_list_entry(pos, struct pull_set, node)->holder->cred.uid == uid;
  }
  return n;
}

int gshmd__pull_start(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                      const Gshm__PullRequest *m, const char **msg_out) {
  const char *local = m->local_name && *m->local_name ? m->local_name : m->name;
  struct peer *peers[PULL_MAX_SOURCES], *peer;
  unsigned npeers;
  struct gshm_location loc;
  struct pull_set *s;
  char what[GSHM__PULL_WHAT_CAP];
  int e;

  if ((e = gshmd__pull_sources_parse(cl, m, peers, &npeers, msg_out)))
    return e;
  peer = peers[0];
  if (!c->cred.admin && pulls_of(cl, c->cred.uid) >= GSHMD_PULLS_PER_USER) {
    *msg_out = "too many pulls in flight for this user; try again";
    return -EBUSY;
  }
  if ((e = names_check(cl, m, local, msg_out)))
    return e;
  if (m->location && *m->location && gshm__location_parse(m->location, &loc)) {
    *msg_out = "bad location: use host, cuda:N or cuda:GPU-<uuid>";
    return -EINVAL;
  }
  if (m->mode > 0777) {
    *msg_out = "mode: permission bits, at most 0777";
    return -EINVAL;
  }
  if ((e = gshmd__pull_resent(cl, c, request_id, m, local, msg_out)))
    return e < 0 ? e : 0;
  if (!m->prefix && !m->replace && gshmd_registry_find_name(cl->reg, local)) {
    /* the local name: with --as it is not the one the user pulled */
    snprintf(cl->reply_msg, sizeof(cl->reply_msg), "a local segment named '%s' exists", local);
    *msg_out = cl->reply_msg;
    return -EEXIST;
  }
  if (!(s = calloc(1, sizeof(*s))))
    return -ENOMEM;
  if ((e = gshmd_registry_client_add(cl->reg, &c->cred, &s->holder))) {
    free(s);
    return e;
  }
  snprintf(s->holder->name, sizeof(s->holder->name), "pull:%.58s", peer->name);
  s->cl = cl;
  s->seq = cl->next_set_seq++;
  gshmd__pull_set_sources(s, peers, npeers);
  s->requester = c;
  s->request_id = request_id;
  s->prefix = m->prefix;
  s->replace = m->replace;
  snprintf(s->name, sizeof(s->name), "%s", m->name);
  snprintf(s->local, sizeof(s->local), "%s", local);
  snprintf(s->location, sizeof(s->location), "%s", m->location ? m->location : "");
  s->mode = m->mode;
  s->memo = gshmd__pull_memo_key(m, s->memo_key);
  s->start_ns = gshm__now_ns(CLOCK_MONOTONIC);
  /* the first report goes with the first chunk in (bytes are moving),
   * the next ones PROGRESS_NS apart */
  s->last_progress_ns = s->start_ns - PROGRESS_NS;
  s->window = GRANTS_AHEAD;
  s->retry_tail = &s->retry;
  gshm_list_add_tail(&cl->pulls, &s->node);
  gshm_log_info("cluster: uid %u pid %d asks to pull %s from peer%s '%s' as '%s'%s",
                (unsigned)c->cred.uid, (int)c->cred.pid,
                gshm__pull_what(what, sizeof(what), s->prefix, s->name), npeers > 1 ? "s" : "",
                s->peers_text, s->local, s->replace ? " (replacing)" : "");
  if (s->prefix) {
    s->listing = true;
    gshmd__pull_list_next(s, 0);
  } else if (!gshmd__pull_set_add(s, s->name, 0, NULL)) {
    gshmd__pull_set_start_grants(s);
  }
  return 0;
}

/* Every byte of the set is in: its segments appear at once, and the
 * requester gets their results.  Returns 0 or the publish's error. */
static int set_succeeded(struct pull_set *s, int64_t ns) {
  struct gshmd_segment **segs = calloc(s->n, sizeof(*segs));
  const char *msg = NULL;
  unsigned served = 0; /* (bits of s->peers) */
  char sz[32], what[GSHM__PULL_WHAT_CAP];
  int e;

  if (!segs) {
    gshmd__pull_set_fail_here(s, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  for (size_t i = 0; i < s->n; i++)
    segs[i] = s->items[i]->seg;
  gshmd__pull_memo_arm(s, true);
  e = gshmd_registry_publish(s->cl->reg, s->holder, segs, s->n, s->replace, &msg);
  gshmd__pull_memo_arm(s, false);
  free(segs);
  if (e) {
    gshmd__pull_set_fail_here(s, e, "cannot publish the pulled segments: %s",
                              msg ? msg : gshm__strerror(e));
    return e;
  }
  for (size_t i = 0; i < s->n; i++) {
    struct pull *p = s->items[i];
    struct peer *from = p->peer ? p->peer : s->peer;
    for (unsigned k = 0; k < s->npeers; k++) /* (a pull counts once for each peer it took from) */
      served |= from == s->peers[k] ? 1u << k : 0;
    if (p->path == GSHM__CLUSTER__PATH__PATH_HOST)
      from->bytes_host += p->total;
    else if (p->path == GSHM__CLUSTER__PATH__PATH_STAGED)
      from->bytes_staged += p->total;
    else
      from->bytes_direct += p->total;
  }
  for (unsigned k = 0; k < s->npeers; k++)
    s->peers[k]->pulls_ok += (served >> k) & 1;
  gshm_log_info("cluster: pulled %s from peer%s '%s' into '%s': %zu segment(s), %s in "
                "%.3f s (%.2f GB/s)",
                gshm__pull_what(what, sizeof(what), s->prefix, s->name), s->npeers > 1 ? "s" : "",
                s->peers_text, s->local, s->n,
                gshm__format_size(s->done, sz, sizeof(sz)), (double)ns / 1e9,
                ns > 0 ? (double)s->done / (double)ns : 0.0);
  if (s->requester) /* (each seg is live until the loop runs again) */
    gshmd__pull_reply_result(s, ns);
  for (size_t i = 0; i < s->n; i++) {
    gshmd__relay_end(s->cl, s->items[i]->seg, 0, NULL);
    s->items[i]->seg = NULL; /* the registry's now */
  }
  return 0;
}

/* The failed set's requester gets why (s->err, s->why), once. */
static void answer_failed(struct pull_set *s) {
  Gshm__Reply reply = GSHM__REPLY__INIT;

  if (!s->requester || !s->err)
    return;
  reply.status = gshm__errno_to_status(s->err);
  reply.message = s->why;
  s->cl->reply(s->cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
  s->requester = NULL;
}

/* The set failed: its hidden segments go, the requester gets why. */
static void set_failed(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;
  char msg[512];

  if (!s->failed_here)
    (s->failed_by ? s->failed_by : s->peer)->pulls_failed++;
  cl->pull_errors[gshm__pull_failure(s->err)]++;
  /* peers reading the set through this node lost their source: so they
   * are told (-ECONNRESET), with this node's reason (its own errno would
   * read as theirs: "not found", "protocol error") */
  snprintf(msg, sizeof(msg), "the relaying node's own pull of the set failed: %s", s->why);
  for (size_t i = 0; i < s->n; i++)
    if (s->items[i]->seg) {
      gshmd__relay_end(cl, s->items[i]->seg, -ECONNRESET, msg);
      gshmd_registry_discard_hidden(cl->reg, s->items[i]->seg);
      s->items[i]->seg = NULL;
    }
  gshm_log_warn("cluster: %s", gshm__pull_failure_message(msg, sizeof(msg), s->prefix, s->name,
                                                          s->peers_text, s->err, s->why));
  answer_failed(s);
}

/* Ends a set with nothing in flight: published or freed, answered, gone. */
static void set_end(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;
  int64_t ns = gshm__now_ns(CLOCK_MONOTONIC) - s->start_ns;

  bool ok = !s->err && !set_succeeded(s, ns);

  /* the landing mappings go after a published set's answer (munmap of a
   * 398-tensor model's: 9 ms on a 2-core machine), before a failed one's
   * segments are freed */
  gshmd__pull_set_unmap(s);
  if (!ok)
    set_failed(s);
  for (size_t i = 0; i < s->n; i++) /* (answered: the grants its last reap closed) */
    gshmd__pull_release_owed(s->items[i]);
  gshmd_registry_client_remove(cl->reg, s->holder);
  for (size_t i = 0; i < s->n; i++) {
    gshmd__prefault_forget(s->items[i]);
    gshmd__pull_unpin(s->items[i]); /* (closed ones already were) */
    gshmd__pull_host_paid(s->items[i], UINT64_MAX); /* (those never granted) */
    gshmd__pull_hold_drop(s->items[i]); /* (UCX receives that still run keep theirs) */
    free(s->items[i]->listed_source);
    free(s->items[i]->upstream);
    free(s->items[i]);
  }
  tdestroy(s->names, name_node_keep);
  free(s->items);
  gshm_list_del(&s->node);
  free(s);
}

size_t gshmd__pull_set_open(struct pull_set *s, size_t i) {
  size_t j = i, k;

  while (j < s->next_start && s->items[j]->closed)
    j = s->items[j]->skip_to;
  for (; i < j; i = k) { /* (all closed: the next walk jumps straight to j) */
    k = s->items[i]->skip_to;
    s->items[i]->skip_to = j;
  }
  return j;
}

/* Whether s has nothing left in flight and nothing left to start. */
static bool set_over(const struct pull_set *s) {
  return s->active == 0 && !s->lreq_pending && !s->pf_jobs &&
         (s->err || (!s->listing && s->nclosed == s->n));
}

/* Closes the finished segments of s, starts the next grants, and ends s
 * when nothing of it is left in flight.  The grants of the segments it
 * closes go back before the next grants are asked (the peer caps those
 * it holds for a link), or, when s ends, after its answer: a Release
 * written on the way cost the last segment's requester a write to the
 * peer (docs/PERFORMANCE.md "Session 35").  Returns true when s was
 * freed. */
static bool set_reap(struct pull_set *s) {
  struct pull *owed = NULL, **owed_tail = &owed;

  for (size_t i = gshmd__pull_set_open(s, s->first_open); i < s->next_start;
       i = gshmd__pull_set_open(s, i + 1)) {
    struct pull *p = s->items[i];
    if ((p->finished || s->err) && p->inflight == 0 && !p->req_pending && !p->pf_jobs &&
        !p->lsb_job) {
      gshmd__pull_item_close(p);
      p->next_owed = NULL;
      *owed_tail = p;
      owed_tail = &p->next_owed;
    }
  }
  s->first_open = gshmd__pull_set_open(s, s->first_open);
  if (!set_over(s)) {
    for (; owed; owed = owed->next_owed)
      gshmd__pull_release_owed(owed);
    gshmd__pull_set_start_grants(s);
    if (!s->err)
      gshmd__pull_set_issue(s);
  }
  if (set_over(s)) {
    set_end(s);
    return true;
  }
  return false;
}

void gshmd__pull_reap(struct gshmd_cluster *cl) {
  struct gshm_list *pos, *tmp;
  cl->grants_held_back = false;
  gshm_list_foreach_safe(pos, tmp, &cl->pulls)
      set_reap(gshm_list_entry(pos, struct pull_set, node));
  /* a set the peer's budget (LINK_MAX_GRANTS over all sets) held back:
   * grants a later set closed in that pass may have made room */
  if (cl->grants_held_back) {
    cl->grants_held_back = false;
    gshm_list_foreach(pos, &cl->pulls)
        gshmd__pull_set_start_grants(gshm_list_entry(pos, struct pull_set, node));
  }
  gshmd__relay_poll(cl); /* Lists that waited for a set's listing */
}

int gshmd__pull_cancel(struct gshmd_cluster *cl, struct gshmd_client *c, const uint32_t *request_id) {
  struct gshm_list *pos, *tmp;
  int e = -ENOENT;
  gshm_list_foreach_safe(pos, tmp, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    if (s->requester != c || (request_id && s->request_id != *request_id))
      continue;
    if (!request_id)
      s->requester = NULL; /* gone: nobody to answer */
    /* (a set that failed already keeps its own error, answered below) */
    gshmd__pull_set_fail_here(s, -ECANCELED, "%s", request_id ? "cancelled by its requester"
                                                               : "the requesting client went away");
    e = 0;
    /* What was asked of a peer ends with its answer (grants go back):
     * up to cluster.request_timeout_ms for a peer slow to answer.  The
     * requester does not wait for that, also where the set failed before
     * the cancel and waits on its peers: its names were never visible,
     * and the set's hidden segments go when it ends (PEERS shows it
     * ending meanwhile, and it counts in its uid's pulls in flight). */
    if (request_id && !set_reap(s))
      answer_failed(s);
  }
  return e;
}

void gshmd__pull_stop_all(struct gshmd_cluster *cl) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls)
    gshmd__pull_set_fail_here(gshm_list_entry(pos, struct pull_set, node), -ESHUTDOWN,
                              "gshmd is stopping");
}

void gshmd__pull_stop_answer(struct gshmd_cluster *cl) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls)
      answer_failed(gshm_list_entry(pos, struct pull_set, node));
}

size_t gshmd__pull_describe(struct gshmd_cluster *cl, const struct gshmd_client *viewer,
                            Gshm__ClusterPull *out, size_t max, uint32_t *seen_out) {
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  struct gshm_list *pos;
  uint32_t seen = 0;
  size_t n = 0;

  gshm_list_foreach(pos, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    Gshm__ClusterPull *o = &out[n];
    /* another user's names (where a model lands here, under which uid)
     * are the requester's and the admins' to see, as its segments are */
    if (!viewer->cred.admin && s->holder->cred.uid != viewer->cred.uid)
      continue;
    seen++;
    if (n == max)
      continue; /* (counted, not shown) */
    gshm__cluster_pull__init(o);
    o->peer = s->peers_text;
    o->name = s->name;
    o->local_name = s->local;
    o->prefix = s->prefix;
    o->uid = (uint32_t)s->holder->cred.uid;
    o->bytes_done = s->done;
    o->bytes_total = s->total;
    o->segments_done = (uint32_t)s->nclosed;
    o->segments_total = s->listing ? 0 : (uint32_t)s->n;
    o->elapsed_ns = now - s->start_ns;
    o->ending = s->err ? s->why : "";
    n++;
  }
  *seen_out = seen;
  return n;
}
