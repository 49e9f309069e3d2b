/* SPDX-License-Identifier: Apache-2.0 */
/* The registry's creates: the checks of a create request, its segment's
 * allocation (named or hidden), and a create sent again after a restart
 * lost its reply (create tokens: docs/ARCHITECTURE.md). */
#include "registry.h"

#include <errno.h>
#include <inttypes.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gpu_fault.h"
#include "log.h"
#include "registry_internal.h"
#include "util.h"

/* The quota check of segment_new, made twice: on the size asked and again
 * on the size rounded up to the granularity.  where ("host" or "cuda",
 * which also names the quota's key) and what ("asked", "after rounding")
 * word the message.  0, or -EDQUOT with *msg_out set. */
static int quota_check(struct gshmd_registry *r, uid_t uid, uint64_t quota, uint64_t used,
                       uint64_t size, const char *where, const char *what, const char **msg_out) {
  char a[32], q[32], s[32];

  if (!quota || !uid || (size <= quota && used <= quota - size))
    return 0;
  *msg_out = gshmd__reg_fmt_msg(r, "uid %u uses %s of %s on %s, %s more %s (quota.%s_bytes)",
                                (unsigned)uid, gshm__format_size(used, a, sizeof(a)),
                                gshm__format_size(quota, q, sizeof(q)), where,
                                gshm__format_size(size, s, sizeof(s)), what, where);
  return -EDQUOT;
}

/* limits.max_segments, of which the last limits.admin_segments (at most
 * a quarter) only root and the admin group may take: one user (or all
 * together) filling the rest leaves an admin room to create and pull.
 * 0, or -EMFILE with *msg_out saying which limit, to a user who is not
 * an admin what to do. */
static int segments_check(struct gshmd_registry *r, const struct gshmd_client *c,
                          const char **msg_out) {
  uint32_t max = r->cfg->max_segments;
  uint32_t reserve = gshmd_config_admin_reserve(max, r->cfg->admin_segments);
  uint32_t n = r->nsegments + r->nhidden;

  if (!max || n < (c->cred.admin ? max : max - reserve))
    return 0;
  if (c->cred.admin || !reserve)
    *msg_out = gshmd__reg_fmt_msg(r, "the daemon holds %u segment%s, its limit "
                                  "(limits.max_segments)", n, gshm__plural(n));
  else
    *msg_out = gshmd__reg_fmt_msg(r, "the daemon holds %u segment%s: the last %u of its limit "
                                  "of %u (limits.max_segments) are kept for root and "
                                  "daemon.admin_group (limits.admin_segments); unlink segments "
                                  "no longer needed, or ask an admin to raise "
                                  "limits.max_segments", n, gshm__plural(n), reserve, max);
  return -EMFILE;
}

/* The checks of a create request on its own: name, size, mode, flags,
 * the daemon's size limit and the location, parsed into *loc.  0 or
 * negative errno with *msg_out set. */
static int request_check(struct gshmd_registry *r, const Gshm__CreateRequest *req, uint32_t mode,
                         struct gshm_location *loc, const char **msg_out) {
  const struct gshmd_config *cfg = r->cfg;
  char q[32], s[32];
  int e;

  if ((e = gshmd__reg_name_check(r, req->name, msg_out)))
    return e;
  if (req->size == 0) {
    *msg_out = "size must be at least 1 byte";
    return -EINVAL;
  }
  if (mode & ~0777u) {
    *msg_out = gshmd__reg_fmt_msg(r, "mode %o has bits outside 0777", mode);
    return -EINVAL;
  }
  if (req->flags & ~(uint32_t)(GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC |
                               GSHM__SEGMENT_FLAG__SEGMENT_FLAG_HIDDEN)) {
    *msg_out = "unknown segment flags";
    return -EINVAL;
  }
  if (req->create_token.len && req->create_token.len != GSHM_CREATE_TOKEN_BYTES) {
    *msg_out = "create_token must be 16 bytes";
    return -EINVAL;
  }
  if (cfg->max_segment_size && req->size > cfg->max_segment_size) {
    *msg_out = gshmd__reg_fmt_msg(r, "size %s is over the daemon's limit of %s "
                                  "(limits.max_segment_size)",
                                  gshm__format_size(req->size, s, sizeof(s)),
                                  gshm__format_size(cfg->max_segment_size, q, sizeof(q)));
    return -EFBIG;
  }
  if (gshm__location_parse(req->location, loc)) {
    *msg_out = "bad location: use host, cuda:N or cuda:GPU-<uuid>";
    return -EINVAL;
  }
  return 0;
}

/* Asks backend b for req->size bytes at loc into *mem_out (owned by the
 * caller); puller: the client of a pull (a hidden segment, whose every
 * byte the pull writes: the backend's alloc_pull may recycle memory),
 * NULL for a create.  0 or the backend's negative errno with *msg_out
 * set. */
static int backend_alloc(struct gshmd_registry *r, struct gshmd_backend *b,
                         const struct gshm_location *loc, const Gshm__CreateRequest *req,
                         const struct gshmd_client *puller, struct gshmd_alloc **mem_out,
                         const char **msg_out) {
  int e;

  if (b->ops->check_size &&
      (e = b->ops->check_size(b, loc, req->size, r->msgbuf, sizeof(r->msgbuf)))) {
    *msg_out = r->msgbuf;
    return e;
  }
  if (puller && b->ops->alloc_pull)
    e = b->ops->alloc_pull(b, loc, req->size, (uint32_t)puller->cred.uid, mem_out);
  else
    e = b->ops->alloc(b, loc, req->size, req->flags, req->name, mem_out);
  if (e) {
    *msg_out = e == -ENODEV   ? "no such GPU"
               : e == -ENOMEM ? "out of memory at that location"
                              : "the backend could not allocate";
    return e;
  }
  return 0;
}

/* Whether req (of c, for loc) is the create that made seg, sent again
 * after a restart lost its reply: the same uid, token (128 random bits
 * name one create), size, flags and kind of location as that create's.
 * The uid is compared first: the token is never compared for another
 * user (so a plain memcmp's timing tells nothing to anyone who could not
 * open the segment anyway, as its owner). */
static bool create_resent(const struct gshmd_segment *seg, const struct gshmd_client *c,
                          const Gshm__CreateRequest *req, const struct gshm_location *loc) {
  if (seg->uid != c->cred.uid || !seg->has_token ||
      req->create_token.len != GSHM_CREATE_TOKEN_BYTES ||
      memcmp(seg->create_token, req->create_token.data, GSHM_CREATE_TOKEN_BYTES))
    return false;
  return seg->requested_size == req->size && seg->flags == req->flags && !seg->hidden &&
         !seg->unlinked && (loc->kind == GSHM_LOCATION_HOST) == !gshmd__reg_on_gpu(seg->mem);
}

/* A create (req of c, for loc) of a name seg holds: 1 when req is the
 * resent create of seg (*seg_out: seg), -ENODEV when it is but seg is
 * parked (gshmd cannot hand its memory out: the resend learns why rather
 * than -EEXIST, as if the segment were another's), else -EEXIST; *msg_out
 * says which. */
static int name_taken(struct gshmd_registry *r, const struct gshmd_client *c,
                      const Gshm__CreateRequest *req, const struct gshm_location *loc,
                      struct gshmd_segment *seg, struct gshmd_segment **seg_out,
                      const char **msg_out) {
  if (!create_resent(seg, c, req, loc)) {
    *msg_out = gshmd__reg_fmt_msg(r, "segment '%s' exists", req->name);
    return -EEXIST;
  }
  if (seg->mem->backend == gshmd_backend_parked()) {
    *msg_out = gshmd__reg_fmt_msg(r, "segment '%s', made by this create before gshmd restarted, "
                                  "is parked: %s", req->name,
                                  gshmd_backend_parked_why(*r->gpu_fault && !r->gpu_no_driver));
    return -ENODEV;
  }
  *seg_out = seg;
  return 1;
}

/* The backend a create at a device (cuda) or host location allocates
 * from.  Errors: -ENODEV the GPUs are unusable (a sticky CUDA error at
 * start, or no driver at start with device segments parked:
 * registry.gpu_fault), -ENOTSUP no CUDA backend; *msg_out says which. */
static int create_backend(struct gshmd_registry *r, bool cuda, struct gshmd_backend **b_out,
                          const char **msg_out) {
  if (cuda && r->gpu_no_driver) {
    *msg_out = gshmd__reg_fmt_msg(r, "device segments are unavailable: the CUDA driver did not "
                                  "start with gshmd (%s); gshmd probes the GPUs and restarts "
                                  "once they work", r->gpu_fault + strlen(GSHMD_NO_DRIVER_PREFIX));
    return -ENODEV;
  }
  if (cuda && *r->gpu_fault) {
    *msg_out = gshmd__reg_fmt_msg(r, "device segments are unavailable: the GPUs are in a sticky "
                                  "CUDA error state since gshmd started (%s; a GPU reset may be "
                                  "needed); gshmd probes them and restarts once they work",
                                  r->gpu_fault);
    return -ENODEV;
  }
  if (cuda && !r->cuda) {
    *msg_out = "device segments are unavailable: this gshmd has no CUDA backend (no driver or no "
               "GPU, or --backend host)";
    return -ENOTSUP;
  }
  *b_out = cuda ? r->cuda : r->host;
  return 0;
}

/* Checks a create request of c and allocates its segment, charged to c's
 * usage and r->bytes but in no tree or list and without an id yet.
 * hidden: the name may be taken now (a hidden segment's name is checked
 * when it is published).  Returns 0, 1 when req is the resent create of
 * the segment of its name (*seg_out: that one, nothing allocated:
 * create_resent; -ENODEV where that segment is parked), or an error as
 * gshmd_registry_create. */
int gshmd__reg_segment_new(struct gshmd_registry *r, struct gshmd_client *c,
                           const Gshm__CreateRequest *req, bool hidden,
                           struct gshmd_segment **seg_out, const char **msg_out) {
  const struct gshmd_config *cfg = r->cfg;
  struct gshm_location loc;
  struct gshmd_backend *b;
  struct gshmd_segment *seg;
  struct gshmd_alloc *mem = NULL;
  struct usage *u;
  uint32_t mode = req->mode ? req->mode : 0600;
  uint64_t quota, used;
  bool local = (req->flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_HIDDEN) != 0, cuda;
  int e;

  if ((e = request_check(r, req, mode, &loc, msg_out)))
    return e;
  if (!hidden && (seg = gshmd_registry_find_name(r, req->name)))
    return name_taken(r, c, req, &loc, seg, seg_out, msg_out);
  if ((e = segments_check(r, c, msg_out)))
    return e;
  cuda = loc.kind != GSHM_LOCATION_HOST;
  if ((e = create_backend(r, cuda, &b, msg_out)))
    return e;
  if ((req->flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC) && !cfg->legacy_ipc) {
    *msg_out = "legacy IPC export is disabled (daemon.legacy_ipc = false)";
    return -ENOTSUP;
  }
  if (!(u = gshmd__reg_usage_get(r, c->cred.uid)))
    return -ENOMEM;
  if (cfg->quota_segments && c->cred.uid && u->segments >= cfg->quota_segments) {
    *msg_out = gshmd__reg_fmt_msg(r, "uid %u owns %u segment%s, limit %u (quota.segments)",
                                  (unsigned)c->cred.uid, u->segments, gshm__plural(u->segments),
                                  cfg->quota_segments);
    return -EDQUOT;
  }
  quota = cuda ? cfg->quota_cuda_bytes : cfg->quota_host_bytes;
  used = cuda ? u->cuda_bytes : u->host_bytes;
  if ((e = quota_check(r, c->cred.uid, quota, used, req->size, cuda ? "cuda" : "host", "asked",
                       msg_out)))
    return e;

  /* (a client's hidden create gets fresh memory, as any create: it need
   * not write every byte, as a pull does) */
  if ((e = backend_alloc(r, b, &loc, req, hidden && !local ? c : NULL, &mem, msg_out)))
    return e;
  /* Rounding up to the granularity may cross the quota after all. */
  if ((e = quota_check(r, c->cred.uid, quota, used, mem->size, cuda ? "cuda" : "host",
                       "after rounding", msg_out))) {
    b->ops->free(b, mem);
    return e;
  }
  if (!(seg = calloc(1, sizeof(*seg))) || !(seg->name = strdup(req->name))) {
    free(seg);
    b->ops->free(b, mem);
    return -ENOMEM;
  }
  seg->requested_size = req->size;
  seg->mem = mem;
  seg->uid = c->cred.uid;
  seg->gid = c->cred.gid;
  seg->mode = mode;
  seg->flags = req->flags & ~(uint32_t)GSHM__SEGMENT_FLAG__SEGMENT_FLAG_HIDDEN;
  seg->created_ns = gshm__now_ns(CLOCK_REALTIME);
  if ((seg->has_token = req->create_token.len == GSHM_CREATE_TOKEN_BYTES))
    memcpy(seg->create_token, req->create_token.data, GSHM_CREATE_TOKEN_BYTES);
  gshm_list_init(&seg->leases);
  r->bytes += mem->size;
  gshmd__reg_usage_charge(u, mem, +1);
  *seg_out = seg;
  return 0;
}

/* Frees a segment of gshmd__reg_segment_new that is in no tree or list: its usage,
 * its pages (discarded) and its memory, unless r->on_free took that (a
 * peer's sends in flight of a hidden segment still read it).  Not the
 * pages while gshmd stops: a client's hidden create goes there with its
 * lease, and its creator, whose mapping outlives the stop, must not find
 * zeros where it wrote (as after a SIGKILL; the kernel frees them with
 * its last fd and mapping).  A pull's hidden segment reached no client. */
void gshmd__reg_segment_drop(struct gshmd_registry *r, struct gshmd_segment *seg) {
  struct usage *u = gshmd__reg_usage_get(r, seg->uid);

  r->bytes -= seg->mem->size;
  if (u)
    gshmd__reg_usage_charge(u, seg->mem, -1);
  if (r->on_free)
    r->on_free(r, seg); /* (a served segment's mapping and registration) */
  gshmd__reg_segment_dispose(seg, !r->stopping);
}

void gshmd__reg_segment_dispose(struct gshmd_segment *seg, bool discard) {
  if (seg->mem && discard && seg->mem->backend->ops->discard)
    seg->mem->backend->ops->discard(seg->mem->backend, seg->mem);
  if (seg->mem)
    seg->mem->backend->ops->free(seg->mem->backend, seg->mem);
  free(seg->fs_record);
  free(seg->source);
  free(seg->name);
  free(seg);
}

/* Gives seg (from gshmd__reg_segment_new, its name free) its id and generation and
 * makes it live: in the name and id trees and the id-ordered list.
 * Errors: -ENOMEM (seg untouched, in no tree). */
int gshmd__reg_segment_insert(struct gshmd_registry *r, struct gshmd_segment *seg) {
  if (gshmd_seg_index_reserve(&r->seg_index)) /* so that the index add cannot fail */
    return -ENOMEM;
  seg->id = r->next_segment_id;
  if (!tsearch(seg, &r->by_name, gshmd__reg_cmp_name) ||
      !tsearch(seg, &r->by_id, gshmd__reg_cmp_seg_id)) {
    tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
    seg->id = 0;
    return -ENOMEM;
  }
  r->next_segment_id++;
  seg->generation = r->next_generation++;
  gshm_list_add_tail(&r->segments, &seg->node);
  gshmd_seg_index_add(&r->seg_index, seg, seg->id);
  r->nsegments++;
  r->changes++;
  return 0;
}

int gshmd_registry_create(struct gshmd_registry *r, struct gshmd_client *c,
                          const Gshm__CreateRequest *req, struct gshmd_lease **lease_out,
                          bool *resent_out, const char **msg_out) {
  struct gshmd_segment *seg;
  char s[32];
  int e;

  if (resent_out)
    *resent_out = false;
  if (req->flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_HIDDEN)
    return gshmd__reg_create_local_hidden(r, c, req, lease_out, msg_out);
  if ((e = gshmd__reg_segment_new(r, c, req, false, &seg, msg_out)) == 1) {
    gshm_log_notice("segment '%s' id %" PRIu64 ": its create sent again by pid %d (a reply lost "
                    "to a restart): a read-write lease of it",
                    seg->name, seg->id, (int)c->cred.pid);
    if (resent_out)
      *resent_out = true;
    return gshmd__reg_lease_add(r, c, seg, GSHM__ACCESS__ACCESS_READ_WRITE, lease_out, msg_out);
  }
  if (e)
    return e;
  if ((e = gshmd__reg_segment_insert(r, seg))) {
    gshmd__reg_segment_drop(r, seg);
    return e;
  }
  gshm_log_info("segment '%s' id %" PRIu64 " created: %s at %s, mode %04o, uid %u, by pid %d",
                seg->name, seg->id, gshm__format_size(seg->mem->size, s, sizeof(s)),
                seg->mem->location, seg->mode, (unsigned)seg->uid, (int)c->cred.pid);
  if (r->on_event)
    r->on_event(r, seg, GSHMD_SEGMENT_CREATED);

  e = gshmd__reg_lease_add(r, c, seg, GSHM__ACCESS__ACCESS_READ_WRITE, lease_out, msg_out);
  if (e) {
    /* No lease, no segment: the create did not happen. */
    seg->unlinked = true;
    tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
    gshmd__reg_segment_free(r, seg, true);
  }
  return e;
}
