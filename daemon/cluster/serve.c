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

/* Per link: the pinned memory its staged grants hold, in staging_bytes
 * (each holds slots for its segment, gshmd_stage_buf_new: a large one
 * all of staging_bytes, a small tensor a slot or two) */
#define STAGED_LINK_FULL 4
#define MAX_GRANTS 64       /* per link: grants live at once */
#define MAX_ANSWERS_QUEUED (1u << 20) /* per link: answers not yet written (bytes, stream.h) */
#define BUSY_MESSAGE "too many pulls from this node at once; try again"

/* A served segment's mapping, made at its first grant, and its UCX
 * registration, made at its first grant whose bytes go over UCX (a
 * grant whose bytes go on gshm's TCP stream registers nothing); shared
 * by the grants that overlap.  The registration goes with the last of
 * them: UCX never holds a segment that no grant covers.  A host
 * segment's mapping that UCX never registered stays (cl->serve_idle, up
 * to SERVE_IDLE_MAX bytes and SERVE_IDLE_MAX_COUNT mappings, oldest
 * dropped first) until the segment is freed, so that the next
 * grant of a segment served again and again (every node of a fleet
 * pulling one model) finds its pages mapped: on the lent machines a
 * fresh mapping's read faults cost the source about 0.1 CPU s per GB. */
struct export_reg {
  void *addr;       /* mmap of the host segment (read-only); device: the backend's mapping */
  bool device;
  size_t len;
  ucp_mem_h memh;   /* NULL: not registered with UCX */
  unsigned grants;  /* live grants of the segment: the registration ends with the last */
  struct gshmd_segment *seg;
  struct gshm_list idle_node; /* on cl->serve_idle while grants == 0 */
  bool idle;
};

/* Idle serving mappings kept: their page tables (2 MiB per GiB served)
 * are what they cost in bytes, and each is a VMA of gshmd's
 * vm.max_map_count (65530 by default), which a peer pulling many small
 * segments once each would otherwise use up. */
#define SERVE_IDLE_MAX (64ull << 30)
#define SERVE_IDLE_MAX_COUNT 4096

/* One grant being served: its data sends (and copies) in flight, and for
 * a staged grant its slots. */
struct serve_grant {
  uint64_t grant_id;
  struct gshmd_segment *seg; /* host segment: holds seg->cluster_export */
  struct stage_buf *sb;  /* NULL: not staged */
  unsigned busy;         /* sends and copies of its bytes running */
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
  struct gshmd_cred cred = {.pid = getpid(), .uid = geteuid(), .gid = getegid(), .admin = true};

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

/* ---- registrations ---------------------------------------------------- */

/* Drops x (NULL: nothing): its registration, if any, and its mapping. */
/* Takes x off cl->serve_idle (a grant uses it again, or it goes). */
static void export_reg_unidle(struct gshmd_cluster *cl, struct export_reg *x) {
  if (!x->idle)
    return;
  gshm_list_del(&x->idle_node);
  cl->serve_idle_bytes -= x->len;
  cl->serve_idle_count--;
  x->idle = false;
}

static void export_reg_free(struct gshmd_cluster *cl, struct export_reg *x) {
  if (!x)
    return;
  export_reg_unidle(cl, x);
  if (x->memh) {
    ucp_mem_unmap(cl->ll.ctx, x->memh);
    cl->registered--;
  }
  if (x->addr && !x->device)
    munmap(x->addr, x->len);
  free(x);
}

/* seg's last grant ended (or its first failed): the UCX registration
 * goes; a host segment's mapping is kept on cl->serve_idle, the oldest
 * idle ones dropped beyond SERVE_IDLE_MAX. */
static void export_reg_idle(struct gshmd_cluster *cl, struct gshmd_segment *seg) {
  struct export_reg *x = seg->cluster_export;

  if (!x || x->grants)
    return;
  /* a mapping UCX registered stays out: its registration cache may keep
   * the registration (and a peer's rkey) for as long as it is mapped */
  if (x->device || !x->addr || x->len > SERVE_IDLE_MAX || x->memh) {
    export_reg_free(cl, x);
    seg->cluster_export = NULL;
    return;
  }
  if (!x->idle) {
    x->idle = true;
    gshm_list_add_tail(&cl->serve_idle, &x->idle_node);
    cl->serve_idle_bytes += x->len;
    cl->serve_idle_count++;
  }
  while (cl->serve_idle_bytes > SERVE_IDLE_MAX || cl->serve_idle_count > SERVE_IDLE_MAX_COUNT) {
    struct export_reg *old = gshm_list_entry(cl->serve_idle.next, struct export_reg, idle_node);
    old->seg->cluster_export = NULL;
    export_reg_free(cl, old);
  }
}

void gshmd__serve_segment_free(struct gshmd_registry *r, struct gshmd_segment *seg) {
  struct gshmd_cluster *cl = r->on_free_arg;
  if (seg->cluster_export) {
    gshm_log_debug("cluster: segment '%s' id %" PRIu64 " unmapped", seg->name, seg->id);
    export_reg_free(cl, seg->cluster_export);
    seg->cluster_export = NULL;
  }
}

void gshmd__serve_stop(struct gshmd_cluster *cl) {
  struct gshm_list *pos;

  gshm_list_foreach(pos, &cl->reg->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    export_reg_free(cl, seg->cluster_export);
    seg->cluster_export = NULL;
  }
  if (cl->reg->on_free == gshmd__serve_segment_free) {
    cl->reg->on_free = NULL;
    cl->reg->on_free_arg = NULL;
  }
}

/* Registers x (seg's mapping) with UCX, once. */
static int export_register(struct gshmd_cluster *cl, struct gshmd_segment *seg,
                           struct export_reg *x) {
  ucp_mem_map_params_t mp = {0};

  if (x->memh)
    return 0;
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  if (x->device) { /* the direct path: UCX registers device memory (GPUDirect RDMA) */
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  mp.address = x->addr;
  mp.length = x->len;
  if (ucp_mem_map(cl->ll.ctx, &mp, &x->memh) != UCS_OK) {
    x->memh = NULL;
    gshm_log_err("cluster: cannot register segment '%s' with UCX", seg->name);
    return -EIO;
  }
  gshm_log_debug("cluster: segment '%s' id %" PRIu64 " registered (%zu bytes)", seg->name,
                 seg->id, x->len);
  cl->registrations++;
  cl->registered++;
  return 0;
}

/* seg's mapping for peers' reads, made once per segment; registered with
 * UCX too when ucx (the grant's bytes go over UCX).  Errors: -ENOMEM,
 * -ENOTSUP, -EIO, the backend's. */
static int export_reg_get(struct gshmd_cluster *cl, struct gshmd_segment *seg, bool ucx,
                          struct export_reg **out) {
  struct gshmd_alloc *mem = seg->mem;
  struct export_reg *x = seg->cluster_export;
  int fd, e;

  if (x) /* served before: its mapping was kept */
    export_reg_unidle(cl, x);
  if (!x) {
    if (!(x = calloc(1, sizeof(*x))))
      return -ENOMEM;
    x->seg = seg;
    x->len = mem->size;
    x->device = mem->device_index >= 0;
    if (x->device)
      e = mem->backend->ops->local_ptr ? mem->backend->ops->local_ptr(mem->backend, mem, &x->addr)
                                       : -ENOTSUP;
    else if (!(e = mem->backend->ops->export_fd(mem->backend, mem, false, &fd)) &&
             (x->addr = mmap(NULL, x->len, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
      e = -errno;
      x->addr = NULL;
      gshm_log_err("cluster: mmap of segment '%s': %m", seg->name);
    } else if (!x->device) {
      gshmd_host_map_advise(x->addr, x->len, cl->cfg->host_huge_pages);
    }
    if (e) {
      export_reg_free(cl, x);
      return e;
    }
    seg->cluster_export = x;
  }
  if (ucx && (e = export_register(cl, seg, x)))
    return e; /* (the mapping stays for the grants it has, or idles: export_reg_idle) */
  *out = x;
  return 0;
}

/* ---- grant records ---------------------------------------------------- */

/* l's grants, and the bytes of the staging buffers they hold in *staged. */
static unsigned grants_of(struct link *l, uint64_t *staged) {
  struct gshm_list *pos;
  unsigned n = 0;
  *staged = 0;
  gshm_list_foreach(pos, &l->grants) {
    const struct serve_grant *g = gshm_list_entry(pos, struct serve_grant, node);
    *staged += g->sb ? g->sb->len : 0;
    n++;
  }
  return n;
}

/* The record of a grant on link l (made at grant time, freed at release
 * or when the link ends); staged: with its slots.  Errors: -EBUSY the
 * link's staged grants hold STAGED_LINK_FULL staging_bytes already (with
 * this one's), -ENOMEM, as gshmd_stage_buf_new. */
static int grant_new(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                     uint64_t grant_id, bool staged, struct serve_grant **g_out) {
  struct serve_grant *g;
  uint64_t held;
  int e;

  if (staged) {
    grants_of(l, &held);
    /* (one always goes: a slot may be larger than staging_bytes) */
    if (held && held + gshmd_stage_buf_len(&cl->stage, cl->cfg->cluster_pull_chunk,
                                           seg->requested_size) >
                    STAGED_LINK_FULL * cl->stage.staging_bytes)
      return -EBUSY;
  }
  if (!(g = calloc(1, sizeof(*g))))
    return -ENOMEM;
  if (staged && (e = gshmd_stage_buf_new(&cl->stage, cl->cfg->cluster_pull_chunk,
                                         seg->requested_size, l->ucx_ep != NULL, &g->sb))) {
    free(g);
    return e;
  }
  if (seg->cluster_export) {
    g->seg = seg;
    ((struct export_reg *)seg->cluster_export)->grants++;
  }
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
  struct export_reg *x = g->seg ? g->seg->cluster_export : NULL;

  if (x && --x->grants == 0) { /* the segment's last grant */
    gshm_log_debug("cluster: segment '%s' id %" PRIu64 " idle%s", g->seg->name, g->seg->id,
                   x->memh ? ", unregistered" : "");
    export_reg_idle(cl, g->seg);
  }
  gshm_list_del(&g->node);
  gshmd_stage_free(&cl->stage, g->sb);
  free(g);
}

/* One send or copy of the grant ended: a Release that came meanwhile
 * takes effect with the last, and the grant's lease ends. */
static void grant_unbusy(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id) {
  struct serve_grant *g = grant_find(l, grant_id);

  if (g && --g->busy == 0 && g->released) {
    grant_free(cl, g);
    if (l->serve_client)
      gshmd_registry_close(cl->reg, l->serve_client, grant_id);
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

/* Fills the grant's path fields: registered and read directly (host
 * segments; device segments where UCX registers CUDA memory), or staged.
 * Returns 0, or a negative errno with *why_out. */
static int grant_path(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                      uint64_t grant_id, Gshm__Cluster__Grant *g, const char **why_out) {
  struct serve_grant *sg;
  struct export_reg *x = NULL;
  int e;

  /* the streams read host memory: device segments go through slots */
  if (!strcmp(cl->cfg->cluster_staging, "always") || seg->mem->device_index >= 0) {
    if ((seg->mem->device_index < 0 && (e = export_reg_get(cl, seg, false, &x))) ||
        (e = grant_new(cl, l, seg, grant_id, true, &sg))) {
      export_reg_idle(cl, seg); /* no grant took it */
      *why_out = e == -EBUSY ? BUSY_MESSAGE : "cannot set up the staging buffer";
      return e;
    }
    g->path = GSHM__CLUSTER__PATH__PATH_STAGED;
    g->length = sg->sb->len;
    g->slots = sg->sb->slots;
    g->slot_size = sg->sb->slot_size;
    return 0;
  }
  /* registered with UCX only where the bytes go over UCX (the peer's
   * UcxOffer made l->ucx_ep); on gshm's TCP stream they are read from the
   * mapping */
  if ((e = export_reg_get(cl, seg, l->ucx_ep != NULL, &x)) ||
      (e = grant_new(cl, l, seg, grant_id, false, &sg))) {
    export_reg_idle(cl, seg); /* no grant took it */
    *why_out = e == -EBUSY ? BUSY_MESSAGE : "cannot register the segment with UCX";
    return e;
  }
  g->path = x->device ? GSHM__CLUSTER__PATH__PATH_DIRECT : GSHM__CLUSTER__PATH__PATH_HOST;
  g->length = seg->requested_size < x->len ? seg->requested_size : x->len;
  return 0;
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
  struct gshmd_segment *seg = gshmd__relay_grant_find(cl, req->name, req->in_flight);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
  Gshm__Cluster__Segment s;
  struct gshmd_lease *lease;
  const char *msg = NULL;
  char buf[400];
  int e;

  /* the cap first: a refusal costs the loop next to nothing */
  if (grants_of(l, &(uint64_t){0}) >= MAX_GRANTS) {
    gshmd__link_send_status(l, rid, -EBUSY, BUSY_MESSAGE);
    return;
  }
  /* A segment that is not exported does not exist for peers. */
  if (!seg || !gshmd__serve_exported(cl, seg)) {
    snprintf(buf, sizeof(buf), "node '%s' exports no segment named '%.255s'", cl->ll.node_name,
             req->name);
    gshm_log_notice("cluster: peer '%s' asked for '%.255s': not exported%s", l->peer->name,
                    req->name, seg && name_matches(cl, seg)
                                   ? " (its name matches cluster.export, its owner or mode "
                                     "does not: see the rules in docs/CLUSTER.md)"
                                   : "");
    gshmd__link_send_status(l, rid, -ENOENT, buf);
    return;
  }
  if ((e = grant_lease(cl, l, seg, &lease, &msg))) {
    gshmd__link_send_status(l, rid, e, msg);
    return;
  }
  gshmd__serve_segment_to_wire(seg, &s);
  s.in_flight = seg->hidden;
  g.segment = &s;
  g.grant_id = lease->id;
  if ((e = grant_path(cl, l, seg, lease->id, &g, &msg))) {
    gshmd_registry_close(cl->reg, l->serve_client, lease->id);
    gshmd__link_send_status(l, rid, e, msg);
    return;
  }
  cl->served_grants++;
  gshm_log_info("cluster: peer '%s' granted read of '%s' id %" PRIu64 " (%s, grant %" PRIu64 ")",
                l->peer->name, seg->name, seg->id,
                g.path == GSHM__CLUSTER__PATH__PATH_HOST     ? "host"
                : g.path == GSHM__CLUSTER__PATH__PATH_DIRECT ? "direct"
                                                             : "staged",
                lease->id);
  m.request_id = rid;
  m.status = GSHM__STATUS__STATUS_OK;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
  m.grant = &g;
  gshmd__link_send(l, &m);
}

/* The serving lease of a grant this link holds; NULL when it has none. */
static struct gshmd_lease *link_lease(struct link *l, uint64_t grant_id) {
  struct gshmd_lease *lease = gshmd_registry_find_lease(cluster_of(l->ll)->reg, grant_id);
  return lease && lease->client == l->serve_client ? lease : NULL;
}

static void serve_release(struct link *l, const Gshm__Cluster__Release *r) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  struct gshmd_lease *lease = link_lease(l, r->grant_id);
  struct serve_grant *g;

  if (!lease)
    return;
  gshm_log_debug("cluster: peer '%s' released grant %" PRIu64, l->peer->name, r->grant_id);
  if ((g = grant_find(l, r->grant_id)) && g->busy) {
    /* with bytes of the grant still being sent, the lease (which keeps
     * their memory) ends with the last send */
    g->released = true;
    return;
  }
  if (g)
    grant_free(cl, g);
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

  if (l->busy >= LINK_MAX_READS)
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
  if (!lease || !g || g->released || g->sb || !(seg = lease->seg) || !(x = seg->cluster_export)) {
    gshmd__link_send_status(l, rid, -ESTALE, "no such grant (or a staged one: use Stage)");
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
  g->busy++;
  if ((e = gshmd__link_send_data(l, rid, r->offset, (uint8_t *)x->addr + r->offset, r->length,
                                 x->memh, on_grant_sent, gs))) {
    g->busy--;
    grant_send_drop(gs);
    gshmd__link_send_status(l, rid, e, "cannot send");
  }
}

/* A Stage's copy into its slot finished: the slot goes out. */
static void on_slot_filled(struct stage_copy *sc, int err) {
  struct grant_send *gs = sc->arg;
  struct link *l = gs->l;
  struct serve_grant *g = grant_find(l, gs->grant_id);

  if (!err && (!g || g->released || l->state != LINK_UP))
    err = -ESTALE;
  if (!err)
    err = gshmd__link_send_data(l, gs->rid, sc->offset, sc->host, sc->len, g->sb->memh,
                                on_grant_sent, gs);
  l->busy--; /* the copy's count; a send counts itself */
  if (err) {
    if (l->state == LINK_UP)
      gshmd__link_send_status(l, gs->rid, err, "the staging copy failed");
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
  if (seg->mem->device_index < 0 && (e = export_reg_get(cl, seg, false, &x)))
    return e;
  if (!(gs = grant_send_new(l, g, rid, s->length)))
    return -ENOMEM;
  gs->sc.mem = seg->mem;
  gs->sc.host_map = x ? x->addr : NULL;
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
  g->busy++;
  return 0;
}

static void serve_stage(struct link *l, uint32_t rid, const Gshm__Cluster__Stage *s) {
  struct gshmd_lease *lease = link_lease(l, s->grant_id);
  const char *why;
  int e;

  if (over_caps(l, rid, s->length)) /* the caps first, as for a Read */
    return;
  if (!lease) {
    gshmd__link_send_status(l, rid, -ESTALE, "no such grant");
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
