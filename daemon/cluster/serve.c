/* SPDX-License-Identifier: Apache-2.0 */
/* Serving peers: which segments are exported (the list itself is
 * serve_list.c's), read grants (a read
 * lease held by the internal client "peer:NAME" of the link, and the
 * segment's UCX registration), Read and Stage requests answered with data
 * messages, and Release (docs/CLUSTER.md). */
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "errors.h"
#include "internal.h"
#include "log.h"
#include "registry.h"
#include "relay.h"
#include "serve.h"

/* Per link: the pinned memory its staged grants hold, in staging_bytes
 * (each holds slots for its segment, gshmd_stage_buf_get: a large one
 * all of staging_bytes, a small tensor a slot or two), those whose
 * buffer is still being made included */
#define STAGED_LINK_FULL 4
#define MAX_ANSWERS_QUEUED (1u << 20) /* per link: answers not yet written (bytes, stream.h) */
#define BUSY_MESSAGE "too many pulls from this node at once; try again"

/* One grant being served: its data sends (and copies) in flight, and for
 * a staged grant its slots. */
struct serve_grant {
  uint64_t grant_id;
  struct export_reg *x;  /* its segment's mapping, which it holds (x->grants) */
  struct link *l;
  Gshm__Cluster__Path path;
  uint64_t length;       /* host or direct: the bytes granted */
  uint64_t staged_len;   /* staged: the bytes of its slots (0: not staged) */
  struct stage_buf *sb;  /* staged: its slots, once made */
  struct stage_job *job; /* staged: its slots being made (the grant's answer waits) */
  uint32_t rid;          /* ... for grant request rid */
  unsigned busy;         /* sends and copies of its bytes running, and the making of its slots */
  bool released;         /* Release came while busy: ends when they do */
  struct gshm_list node; /* link->grants */
};

/* Whether a rule's pattern matches seg's name (for the log: why a
 * segment of that name is not exported). */
static bool name_matches(const struct gshmd_cluster *cl, const struct gshmd_segment *seg) {
  for (unsigned i = 0; i < cl->nexport; i++)
    if (fnmatch(cl->exports[i].pattern, seg->name, 0) == 0)
      return true;
  return false;
}

int gshmd__serve_link_up(struct gshmd_cluster *cl, struct link *l) {
  /* uid 0, not gshmd's own: the serving is gshmd's work, which the
   * per-uid quotas exempt as root's; gshmd's user (daemon.user) would put
   * every peer's serving leases under one uid's quota.leases */
  struct gshmd_cred cred = {.pid = getpid(), .uid = 0, .gid = 0, .admin = true};

  /* The serving leases of this link belong to an internal client that
   * gshmctl clients and mappings show as "peer:NAME". */
  if (gshmd_registry_client_add(cl->reg, &cred, &l->serve_client))
    return -ENOMEM;
  snprintf(l->serve_client->name, sizeof(l->serve_client->name), "peer:%.58s", l->peer->name);
  l->st.ctrl_queued_max = MAX_ANSWERS_QUEUED;
  return 0;
}

void gshmd__serve_segment_to_wire(const struct gshmd_segment *seg, Gshm__Cluster__Segment *s) {
  gshm__cluster__segment__init(s);
  s->id = seg->id;
  s->generation = seg->generation;
  s->name = seg->name;
  s->size = seg->requested_size;
  s->allocated = seg->mem->size;
  s->location = (char *)seg->mem->location;
  s->created_ns = seg->created_ns;
  s->source = seg->source ? seg->source : (char *)"";
}

/* ---- grant records ---------------------------------------------------- */

/* l's grants, and the bytes of the staging buffers they hold in *staged. */
static unsigned grants_of(struct link *l, uint64_t *staged) {
  struct gshm_list *pos;
  unsigned n = 0;
  *staged = 0;
  gshm_list_foreach(pos, &l->grants) {
    const struct serve_grant *g = gshm_list_entry(pos, struct serve_grant, node);
    *staged += g->staged_len;
    n++;
  }
  return n;
}

static void on_grant_slots(void *arg, int err, struct stage_buf *sb);

/* The record of a grant on link l (made at grant time, freed at release
 * or when the link ends); staged: with its slots, taken from the kept
 * ones, or being made (g->job: counted in l's staged bytes meanwhile).
 * Errors: -EBUSY the link's staged grants hold STAGED_LINK_FULL
 * staging_bytes already (with this one's), -ENOMEM, as
 * gshmd_stage_buf_get. */
static int grant_new(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                     uint64_t grant_id, bool staged, struct serve_grant **g_out) {
  uint64_t held, len = gshmd_stage_buf_len(&cl->stage, cl->cfg->cluster_pull_chunk,
                                           seg->requested_size);
  struct serve_grant *g;
  int e;

  grants_of(l, &held);
  /* (one always goes: a slot may be larger than staging_bytes) */
  if (staged && held && held + len > STAGED_LINK_FULL * cl->stage.staging_bytes)
    return -EBUSY;
  if (!(g = calloc(1, sizeof(*g))))
    return -ENOMEM;
  g->l = l;
  g->staged_len = staged ? len : 0;
  if (staged &&
      (e = gshmd_stage_buf_get(&cl->stage, cl->cfg->cluster_pull_chunk, seg->requested_size,
                               l->ucx_ep != NULL, on_grant_slots, g, &g->sb, &g->job)) < 0) {
    free(g);
    return e;
  }
  if ((g->x = seg->cluster_export))
    g->x->grants++;
  g->grant_id = grant_id;
  gshm_list_add_tail(&l->grants, &g->node);
  *g_out = g;
  return 0;
}

/* The grant record of l, released or not; NULL when none. */
static struct serve_grant *grant_find(struct link *l, uint64_t grant_id) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &l->grants) {
    struct serve_grant *g = gshm_list_entry(pos, struct serve_grant, node);
    if (g->grant_id == grant_id)
      return g;
  }
  return NULL;
}

static void grant_free(struct gshmd_cluster *cl, struct serve_grant *g) {
  if (g->x && g->busy)
    gshmd__export_reg_unbusy(cl, g->x, g->busy);
  gshmd__export_reg_unref(cl, g->x); /* (its segment may be gone: revoked) */
  gshm_list_del(&g->node);
  gshmd_stage_free(&cl->stage, g->sb);
  free(g);
}

#define REVOKED_MESSAGE "the segment was revoked at its source"
#define PULL_FAILED_MESSAGE "this node's own pull of that segment failed"

/* Whether g (NULL: none) is a grant of a segment revoked since (or
 * relayed in flight, and its pull failed here). */
static bool revoked(const struct serve_grant *g) { return g && g->x && !g->x->seg; }

/* Refuses request rid of grant g (NULL: none), which has no lease: as a
 * lost peer (relay.h) where its segment's pull failed here, else -ESTALE
 * (revoked, or `otherwise`). */
static void send_gone(struct link *l, uint32_t rid, const struct serve_grant *g,
                      const char *otherwise) {
  if (revoked(g) && g->x->pull_failed)
    gshmd__link_send_status(l, rid, -ECONNRESET, PULL_FAILED_MESSAGE);
  else
    gshmd__link_send_status(l, rid, -ESTALE, revoked(g) ? REVOKED_MESSAGE : otherwise);
}

/* One more send, copy or slot making of g's bytes, until grant_unbusy;
 * its segment's record counts it too (a revoke's wipe waits for it). */
static void grant_busy(struct serve_grant *g) {
  g->busy++;
  if (g->x)
    g->x->busy++;
}

/* One send or copy of the grant ended: a Release that came meanwhile
 * takes effect with the last, and the grant's lease ends. */
static void grant_unbusy(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id) {
  struct serve_grant *g = grant_find(l, grant_id);

  if (!g)
    return;
  if (g->x)
    gshmd__export_reg_unbusy(cl, g->x, 1);
  if (--g->busy == 0 && g->released) {
    grant_free(cl, g);
    if (l->serve_client)
      gshmd_registry_close(cl->reg, l->serve_client, grant_id);
  }
}

void gshmd__serve_link_lost(struct gshmd_cluster *cl, struct link *l) {
  struct gshm_list *pos;
  (void)cl;
  gshm_list_foreach(pos, &l->grants) {
    struct serve_grant *g = gshm_list_entry(pos, struct serve_grant, node);
    if (g->job)
      gshmd_stage_job_cancel(g->job);
  }
}

void gshmd__serve_link_idle(struct gshmd_cluster *cl, struct link *l) {
  gshmd__relay_link_gone(cl, l);
  while (!gshm_list_empty(&l->grants))
    grant_free(cl, gshm_list_entry(l->grants.next, struct serve_grant, node));
  if (l->serve_client) {
    gshmd_registry_client_remove(cl->reg, l->serve_client); /* ends its grants */
    l->serve_client = NULL;
  }
}

/* ---- requests --------------------------------------------------------- */

/* Why a grant could not be made (e from grant_path's steps). */
static const char *grant_why(int e, const char *otherwise) {
  if (e == -EBUSY)
    return BUSY_MESSAGE;
  if (e == -ENODEV) /* (the parked backend: a device segment whose GPU gshmd cannot reach) */
    return "the segment's GPU is not available on this node";
  return otherwise;
}

/* The grant's record, with its path: registered and read directly
 * (host segments; device segments where UCX registers CUDA memory), or
 * staged (its slots may still be being made: sg->job).  Returns 0, or a
 * negative errno with *why_out. */
static int grant_path(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                      uint64_t grant_id, struct serve_grant **sg, const char **why_out) {
  struct export_reg *x = NULL;
  int e;

  /* the streams read host memory: device segments go through slots.  The
   * grant holds the segment's mapping record either way: a revoke while
   * its copies run leaves the memory they read to the record (for a
   * device segment it is the backend's memory and its mapping in gshmd;
   * before, a revoke freed it under the copies) */
  if (!strcmp(cl->cfg->cluster_staging, "always") || seg->mem->device_index >= 0) {
    if ((e = gshmd__export_reg_get(cl, seg, false, &x)) ||
        (e = grant_new(cl, l, seg, grant_id, true, sg))) {
      gshmd__export_reg_idle(cl, seg); /* no grant took it */
      *why_out = grant_why(e, "cannot set up the staging buffer");
      return e;
    }
    (*sg)->path = GSHM__CLUSTER__PATH__PATH_STAGED;
    return 0;
  }
  /* registered with UCX only where the bytes go over UCX (the peer's
   * UcxOffer made l->ucx_ep); on gshm's TCP stream they are read from the
   * mapping */
  if ((e = gshmd__export_reg_get(cl, seg, l->ucx_ep != NULL, &x)) ||
      (e = grant_new(cl, l, seg, grant_id, false, sg))) {
    gshmd__export_reg_idle(cl, seg); /* no grant took it */
    *why_out = grant_why(e, "cannot register the segment with UCX");
    return e;
  }
  (*sg)->path = x->device ? GSHM__CLUSTER__PATH__PATH_DIRECT : GSHM__CLUSTER__PATH__PATH_HOST;
  (*sg)->length = seg->requested_size < x->len ? seg->requested_size : x->len;
  return 0;
}

/* The serving lease of a grant this link holds; NULL when it has none. */
static struct gshmd_lease *link_lease(struct link *l, uint64_t grant_id) {
  struct gshmd_lease *lease = gshmd_registry_find_lease(cluster_of(l->ll)->reg, grant_id);
  return lease && lease->client == l->serve_client ? lease : NULL;
}

/* Answers grant request rid with g, whose lease is seg's (and slots, if
 * staged, are there). */
static void grant_answer(struct gshmd_cluster *cl, struct link *l, const struct serve_grant *g,
                         struct gshmd_segment *seg, uint32_t rid) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Grant gr = GSHM__CLUSTER__GRANT__INIT;
  Gshm__Cluster__Segment s;
  char up[RELAY_PATH_LEN];

  gshmd__serve_segment_to_wire(seg, &s);
  s.in_flight = seg->hidden;
  gr.segment = &s;
  gr.upstream = (char *)gshmd__relay_upstream(seg, up, sizeof(up));
  gr.grant_id = g->grant_id;
  gr.path = g->path;
  gr.length = g->sb ? g->sb->len : g->length;
  gr.slots = g->sb ? g->sb->slots : 0;
  gr.slot_size = g->sb ? g->sb->slot_size : 0;
  cl->served_grants++;
  gshm_log_info("cluster: peer '%s' granted read of '%s' id %" PRIu64 " (%s, grant %" PRIu64 ")",
                l->peer->name, seg->name, seg->id,
                g->path == GSHM__CLUSTER__PATH__PATH_HOST     ? "host"
                : g->path == GSHM__CLUSTER__PATH__PATH_DIRECT ? "direct"
                                                              : "staged",
                g->grant_id);
  m.request_id = rid;
  m.status = GSHM__STATUS__STATUS_OK;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
  m.grant = &gr;
  gshmd__link_send(l, &m);
}

/* A staged grant's slots were made (or not, err): its answer goes, unless
 * it was released or its link failed meanwhile; it ends as released then,
 * or when its link is idle. */
static void on_grant_slots(void *arg, int err, struct stage_buf *sb) {
  struct serve_grant *g = arg;
  struct link *l = g->l;
  struct gshmd_cluster *cl = cluster_of(l->ll);
  struct gshmd_lease *lease = link_lease(l, g->grant_id);

  g->job = NULL;
  g->sb = sb;
  l->busy--;
  l->stage_waits--;
  if (!g->released && l->state == LINK_UP) {
    if (!err && !lease)
      err = -ESTALE;
    if (err) {
      g->released = true; /* (ends below) */
      gshmd__link_send_status(l, g->rid, err, err == -ESTALE ? "the segment went meanwhile"
                                                             : "cannot set up the staging buffer");
    } else {
      grant_answer(cl, l, g, lease->seg, g->rid);
    }
  }
  grant_unbusy(cl, l, g->grant_id);
  gshmd__link_unbusy(l); /* (l may be gone after it) */
}

/* A read lease of l's client on seg: opened as a local client would, or,
 * on a segment this node is still pulling, taken on the hidden segment
 * (relay.h).  Errors as gshmd_registry_open, gshmd_registry_lease_hidden. */
static int grant_lease(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                       struct gshmd_lease **lease_out, const char **msg_out) {
  Gshm__OpenRequest open = GSHM__OPEN_REQUEST__INIT;

  if (seg->hidden)
    return gshmd_registry_lease_hidden(cl->reg, l->serve_client, seg, GSHM__ACCESS__ACCESS_READ,
                                       lease_out, msg_out);
  open.segment_id = seg->id;
  open.generation = seg->generation;
  open.access = GSHM__ACCESS__ACCESS_READ;
  return gshmd_registry_open(cl->reg, l->serve_client, &open, lease_out, msg_out);
}

static void serve_grant(struct link *l, uint32_t rid, const Gshm__Cluster__GrantRequest *req) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  /* (published, or one this node is still pulling: relay.h) */
  bool later;
  struct gshmd_segment *seg =
      gshmd__relay_grant_find(cl, req->name, req->in_flight, l->peer, &later);
  struct serve_grant *g;
  struct gshmd_lease *lease;
  const char *msg = NULL;
  char buf[480]; /* (node_name < 64, a name <= 255, the rules) */
  int e;

  /* the cap first: a refusal costs the loop next to nothing */
  if (grants_of(l, &(uint64_t){0}) >= LINK_MAX_GRANTS) {
    gshmd__link_send_status(l, rid, -EBUSY, BUSY_MESSAGE);
    return;
  }
  if (!seg && later) { /* (relay.h: its bytes are coming from a source of this node's set) */
    snprintf(buf, sizeof(buf), "'%.255s' is still coming here from another source; try again",
             req->name);
    gshmd__link_send_status(l, rid, -EBUSY, buf);
    return;
  }
  /* A segment that is not exported does not exist for peers. */
  if (!seg || !gshmd__serve_exported(cl, seg)) {
    /* (the puller's user may have made it 0600, as a pull set's message says) */
    snprintf(buf, sizeof(buf),
             "node '%s' exports no segment named '%.255s' (its cluster.export rules decide by "
             "name, owner and mode: a segment of mode 0600 is never exported)",
             cl->ll.node_name, req->name);
    uint64_t n = ++l->peer->not_exported;
    if ((n & (n - 1)) == 0) /* (the 1st, 2nd, 4th...: a peer's asks must not flood the log) */
      gshm_log_notice("cluster: peer '%s' asked for '%.255s': not exported%s (%" PRIu64
                      " such ask%s from it so far)",
                      l->peer->name, req->name,
                      seg && name_matches(cl, seg)
                          ? " (its name matches cluster.export, its owner or mode does not: see "
                            "the rules in docs/CLUSTER.md)"
                          : "",
                      n, n == 1 ? "" : "s");
    gshmd__link_send_status(l, rid, -ENOENT, buf);
    return;
  }
  if ((e = grant_lease(cl, l, seg, &lease, &msg))) {
    gshmd__link_send_status(l, rid, e, msg);
    return;
  }
  if ((e = grant_path(cl, l, seg, lease->id, &g, &msg))) {
    gshmd_registry_close(cl->reg, l->serve_client, lease->id);
    gshmd__link_send_status(l, rid, e, msg);
    return;
  }
  if (g->job) { /* answered once its slots are made (on_grant_slots) */
    g->rid = rid;
    grant_busy(g);
    l->busy++;
    l->stage_waits++;
    return;
  }
  grant_answer(cl, l, g, seg, rid);
}

static void serve_release(struct link *l, const Gshm__Cluster__Release *r) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  struct gshmd_lease *lease = link_lease(l, r->grant_id);
  struct serve_grant *g = grant_find(l, r->grant_id);

  /* (a grant whose lease a revoke ended goes too: it may keep the
   * revoked segment's memory, export_reg_detach) */
  if (!lease && (!g || g->released))
    return;
  gshm_log_debug("cluster: peer '%s' released grant %" PRIu64, l->peer->name, r->grant_id);
  if (g && g->busy) {
    /* with bytes of the grant still being sent, the lease (which keeps
     * their memory) ends with the last send; slots not yet being made
     * are not made */
    g->released = true;
    if (g->job)
      gshmd_stage_job_cancel(g->job);
    return;
  }
  if (g)
    grant_free(cl, g);
  if (lease)
    gshmd_registry_close(cl->reg, l->serve_client, lease->id);
}

/* A send of a grant's bytes: when it ends, the grant is one send less busy. */
struct grant_send {
  struct stage_copy sc;  /* Stage: the copy into the slot first */
  struct gshmd_cluster *cl;
  struct link *l;
  uint64_t grant_id;
  uint32_t rid;
  uint64_t len;          /* counted in l->bytes_busy until sent */
};

static void on_grant_sent(void *arg, int err) {
  struct grant_send *gs = arg;
  (void)err;
  gs->l->bytes_busy -= gs->len;
  grant_unbusy(gs->cl, gs->l, gs->grant_id);
  free(gs);
}

/* A send of len bytes for request rid, counted in l->bytes_busy until
 * on_grant_sent (the caller frees it without that only before it
 * counted: see grant_send_drop). */
static struct grant_send *grant_send_new(struct link *l, struct serve_grant *g, uint32_t rid,
                                         uint64_t len) {
  struct grant_send *gs = calloc(1, sizeof(*gs));
  if (!gs)
    return NULL;
  gs->cl = cluster_of(l->ll);
  gs->l = l;
  gs->grant_id = g->grant_id;
  gs->rid = rid;
  gs->len = len;
  l->bytes_busy += len;
  return gs;
}

static void grant_send_drop(struct grant_send *gs) {
  gs->l->bytes_busy -= gs->len;
  free(gs);
}

/* Whether request rid (len bytes) must be refused by the caps of link l:
 * then it is, with its reason. */
static bool over_caps(struct link *l, uint32_t rid, uint64_t len) {
  const char *why = NULL;
  int err = -EBUSY;

  if (l->busy - l->stage_waits >= LINK_MAX_READS)
    why = "too many reads in flight on this link";
  else if (len > LINK_MAX_READ_BYTES)
    why = "a read of more than 64 MiB", err = -EINVAL;
  else if (l->bytes_busy + len > LINK_MAX_BYTES_INFLIGHT)
    why = "too many bytes of reads in flight on this link";
  if (why)
    gshmd__link_send_status(l, rid, err, why);
  return why != NULL;
}

/* Read: the bytes of a host (or directly registered device) grant. */
static void serve_read(struct link *l, uint32_t rid, const Gshm__Cluster__Read *r) {
  struct gshmd_lease *lease = link_lease(l, r->grant_id);
  struct serve_grant *g = grant_find(l, r->grant_id);
  struct grant_send *gs;
  struct export_reg *x;
  struct gshmd_segment *seg;
  const char *why;
  int e;

  if (over_caps(l, rid, r->length)) /* the caps first: never queued */
    return;
  if (!lease || !g || g->released || g->staged_len || !(seg = lease->seg) ||
      !(x = seg->cluster_export)) {
    send_gone(l, rid, g, "no such grant (or a staged one: use Stage)");
    return;
  }
  if (r->length == 0 || r->offset > seg->requested_size ||
      r->length > seg->requested_size - r->offset || r->offset + r->length > x->len) {
    gshmd__link_send_status(l, rid, -EINVAL, "read outside the segment");
    return;
  }
  /* a segment still being pulled here: the range waits until it landed */
  if ((e = gshmd__relay_gate(cluster_of(l->ll), l, seg, rid, r, NULL, &why))) {
    if (e < 0)
      gshmd__link_send_status(l, rid, e, why);
    return;
  }
  if (!(gs = grant_send_new(l, g, rid, r->length))) {
    gshmd__link_send_status(l, rid, -ENOMEM, "out of memory");
    return;
  }
  grant_busy(g);
  if ((e = gshmd__link_send_data(l, rid, r->offset, (uint8_t *)x->addr + r->offset, r->length,
                                 x->memh, on_grant_sent, gs))) {
    grant_send_drop(gs);
    grant_unbusy(cluster_of(l->ll), l, g->grant_id);
    gshmd__link_send_status(l, rid, e, "cannot send");
  }
}

/* A Stage's copy into its slot finished: the slot goes out. */
static void on_slot_filled(struct stage_copy *sc, int err) {
  struct grant_send *gs = sc->arg;
  struct link *l = gs->l;
  struct serve_grant *g = grant_find(l, gs->grant_id);

  const char *why = "the staging copy failed";

  if (!err && (!g || g->released || l->state != LINK_UP))
    err = -ESTALE;
  /* revoked while it was copied: its bytes (a host segment's wiped) are
   * not the segment's any more, and the puller must not take them */
  if (!err && revoked(g)) {
    err = g->x->pull_failed ? -ECONNRESET : -ESTALE;
    why = g->x->pull_failed ? PULL_FAILED_MESSAGE : REVOKED_MESSAGE;
  }
  if (!err)
    err = gshmd__link_send_data(l, gs->rid, sc->offset, sc->host, sc->len, g->sb->memh,
                                on_grant_sent, gs);
  l->busy--; /* the copy's count; a send counts itself */
  if (err) {
    if (l->state == LINK_UP)
      gshmd__link_send_status(l, gs->rid, err, why);
    on_grant_sent(gs, err);
  }
  gshmd__link_unbusy(l);
}

/* Copies the chunk a Stage names into its slot and sends it from there
 * as the data message answering request rid.  Errors (nothing sent):
 * -ESTALE no such staged grant, -EINVAL range or slot, -ENOMEM. */
static int stage_chunk(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                       struct gshmd_segment *seg, const Gshm__Cluster__Stage *s) {
  struct serve_grant *g = grant_find(l, s->grant_id);
  struct grant_send *gs;
  struct export_reg *x = NULL;
  int e;

  if (!g || g->released || !g->sb)
    return -ESTALE;
  if (s->slot >= g->sb->slots || s->length == 0 || s->length > g->sb->slot_size ||
      s->offset > seg->requested_size || s->length > seg->requested_size - s->offset)
    return -EINVAL;
  if (!(x = g->x)) /* (each staged grant holds its segment's record: grant_path) */
    return -ESTALE;
  if (!(gs = grant_send_new(l, g, rid, s->length)))
    return -ENOMEM;
  gs->sc.mem = seg->mem;
  gs->sc.host_map = x->device ? NULL : x->addr;
  gs->sc.offset = s->offset;
  gs->sc.len = s->length;
  gs->sc.host = (uint8_t *)g->sb->addr + (uint64_t)s->slot * g->sb->slot_size;
  gs->sc.to_segment = false;
  gs->sc.done = on_slot_filled;
  gs->sc.arg = gs;
  if ((e = gshmd_stage_copy(&cl->stage, &gs->sc))) {
    grant_send_drop(gs);
    return e;
  }
  l->busy++;
  grant_busy(g);
  return 0;
}

static void serve_stage(struct link *l, uint32_t rid, const Gshm__Cluster__Stage *s) {
  struct gshmd_lease *lease = link_lease(l, s->grant_id);
  const char *why;
  int e;

  if (over_caps(l, rid, s->length)) /* the caps first, as for a Read */
    return;
  if (!lease) {
    send_gone(l, rid, grant_find(l, s->grant_id), "no such grant");
    return;
  }
  if ((e = gshmd__relay_gate(cluster_of(l->ll), l, lease->seg, rid, NULL, s, &why))) {
    if (e < 0)
      gshmd__link_send_status(l, rid, e, why);
    return;
  }
  if ((e = stage_chunk(cluster_of(l->ll), l, rid, lease->seg, s)))
    gshmd__link_send_status(l, rid, e, "cannot stage that chunk");
}

bool gshmd__serve_handle(struct gshmd_cluster *cl, struct link *l, const Gshm__Cluster__Msg *m) {
  (void)cl;
  if (!l->inbound || l->state != LINK_UP)
    return false;
  switch (m->body_case) {
  case GSHM__CLUSTER__MSG__BODY_LIST:
    gshmd__serve_list(l, m->request_id, m->list);
    return true;
  case GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST:
    serve_grant(l, m->request_id, m->grant_request);
    return true;
  case GSHM__CLUSTER__MSG__BODY_STAGE:
    serve_stage(l, m->request_id, m->stage);
    return true;
  case GSHM__CLUSTER__MSG__BODY_RELEASE:
    serve_release(l, m->release);
    return true;
  case GSHM__CLUSTER__MSG__BODY_READ:
    serve_read(l, m->request_id, m->read);
    return true;
  default:
    return false;
  }
}
