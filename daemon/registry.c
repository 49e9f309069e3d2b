/* SPDX-License-Identifier: Apache-2.0 */
/* The registry: init/destroy, clients, permissions, find, leases, create/open/close/unlink. */
#include "registry.h"

#include <errno.h>
#include <inttypes.h>
#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "registry_internal.h"
#include "util.h"

bool gshmd__reg_on_gpu(const struct gshmd_alloc *m) {
  return m->device_index >= 0 || !strncmp(m->location, "cuda:", 5);
}

/* Adds (sign +1) or removes (-1) segment memory m, NULL for none, to u's
 * usage: one segment and its bytes on the host or the GPUs
 * (gshmd__reg_on_gpu). */
void gshmd__reg_usage_charge(struct usage *u, const struct gshmd_alloc *m, int sign) {
  uint64_t size = m ? m->size : 0;

  if (m && gshmd__reg_on_gpu(m))
    u->cuda_bytes += sign > 0 ? size : -size;
  else
    u->host_bytes += sign > 0 ? size : -size;
  u->segments += sign > 0 ? 1u : -1u;
}

int gshmd__reg_cmp_name(const void *a, const void *b) {
  return strcmp(((const struct gshmd_segment *)a)->name, ((const struct gshmd_segment *)b)->name);
}

int gshmd__reg_cmp_seg_id(const void *a, const void *b) {
  uint64_t x = ((const struct gshmd_segment *)a)->id, y = ((const struct gshmd_segment *)b)->id;
  return x < y ? -1 : x > y;
}

static int cmp_lease_id(const void *a, const void *b) {
  uint64_t x = ((const struct gshmd_lease *)a)->id, y = ((const struct gshmd_lease *)b)->id;
  return x < y ? -1 : x > y;
}

static int cmp_usage(const void *a, const void *b) {
  uid_t x = ((const struct usage *)a)->uid, y = ((const struct usage *)b)->uid;
  return x < y ? -1 : x > y;
}

/* The usage record of uid, created on first use; NULL only on ENOMEM. */
struct usage *gshmd__reg_usage_get(struct gshmd_registry *r, uid_t uid) {
  struct usage key = {.uid = uid}, *u, **slot;

  slot = tfind(&key, &r->usage_root, cmp_usage);
  if (slot)
    return *slot;
  if (!(u = calloc(1, sizeof(*u))))
    return NULL;
  u->uid = uid;
  slot = tsearch(u, &r->usage_root, cmp_usage);
  if (!slot) {
    free(u);
    return NULL;
  }
  return u;
}

static void usage_free_node(void *p) { free(p); }

void gshmd_registry_init(struct gshmd_registry *r, const struct gshmd_config *cfg) {
  memset(r, 0, sizeof(*r));
  r->cfg = cfg;
  gshm_list_init(&r->segments);
  gshm_list_init(&r->clients);
  gshm_list_init(&r->leases);
  gshm_list_init(&r->hidden);
  r->next_segment_id = 1;
  r->next_generation = 1;
  r->next_lease_id = 1;
  r->next_session_id = 1;
}

static void noop_free(void *p) { (void)p; }

/* Frees seg; discard (every caller but shutdown) also gives its pages
 * back now, whoever still holds a copy of its fd. */
void gshmd__reg_segment_free(struct gshmd_registry *r, struct gshmd_segment *seg, bool discard) {
  struct usage *u = gshmd__reg_usage_get(r, seg->uid);
  uint64_t size = seg->mem ? seg->mem->size : 0;

  if (!seg->unlinked)
    tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
  tdelete(seg, &r->by_id, gshmd__reg_cmp_seg_id);
  gshmd_seg_index_remove(&r->seg_index, seg->id);
  gshm_list_del(&seg->node);
  r->nsegments--;
  r->changes++;
  r->bytes -= size;
  if (u)
    gshmd__reg_usage_charge(u, seg->mem, -1);
  if (r->on_event)
    r->on_event(r, seg, GSHMD_SEGMENT_FREED);
  if (r->on_free)
    r->on_free(r, seg);
  gshm_log_info("segment '%s' id %" PRIu64 " freed (%" PRIu64 " bytes)", seg->name, seg->id, size);
  if (seg->fs_revoked) { /* (kept by the fd store: GSHMD_SEGMENT_REVOKED) */
    if (seg->mem) { /* its pages go now, never to the recycling pool: the store has its fd */
      seg->mem->no_recycle = true;
      if (seg->mem->backend->ops->discard)
        seg->mem->backend->ops->discard(seg->mem->backend, seg->mem);
    }
    return;
  }
  gshmd__reg_segment_dispose(seg, discard && !r->stopping);
}

/* seg is unlinked and unleased: frees it, unless it came through a
 * restart whose grace period is still on (a holder that has not
 * reconnected yet may re-take it).  A restored segment's pages are not
 * punched: such a holder may still map them, and gshmd cannot tell (the
 * kernel frees them with the last mapping and fd).  Nor while the fd
 * store holds it (fs_replaced; GSHMD_SEGMENT_RELEASE may make it hold a
 * member of a publish it has not recorded complete).  Returns whether seg
 * was freed. */
bool gshmd__reg_segment_release(struct gshmd_registry *r, struct gshmd_segment *seg) {
  if (seg->fs_replaced || (seg->restored && !r->restore_grace_over)) /* (held: the fd store's) */
    return false;
  if (seg->fs_publish && r->on_event) {
    r->on_event(r, seg, GSHMD_SEGMENT_RELEASE); /* (frees nothing) */
    if (seg->fs_replaced)
      return false;
  }
  gshmd__reg_segment_free(r, seg, !seg->restored);
  return true;
}

/* Ends lease l; the last lease of an unlinked segment releases it unless
 * `keep` (revoke frees the segment itself). */
void gshmd__reg_lease_end(struct gshmd_registry *r, struct gshmd_lease *l, bool keep) {
  struct gshmd_segment *seg = l->seg;
  struct usage *u = gshmd__reg_usage_get(r, l->client->cred.uid);

  tdelete(l, &r->lease_by_id, cmp_lease_id);
  gshmd_seg_index_remove(&r->lease_index, l->id);
  gshm_list_del(&l->seg_node);
  gshm_list_del(&l->client_node);
  gshm_list_del(&l->node);
  seg->nleases--;
  l->client->nleases--;
  r->nleases--;
  if (u)
    u->leases--;
  free(l->mapped_devices);
  free(l);
  if (seg->hidden && seg->local && seg->nleases == 0 && !keep)
    gshmd_registry_discard_hidden(r, seg); /* its creator let go before publishing */
  else if (seg->unlinked && seg->nleases == 0 && !keep) {
    if (seg->hidden) /* discarded while a peer relayed it */
      gshmd_registry_discard_hidden(r, seg);
    else
      gshmd__reg_segment_release(r, seg);
  }
}

void gshmd_registry_destroy(struct gshmd_registry *r) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &r->clients)
      gshmd_registry_client_remove(r, gshm_list_entry(pos, struct gshmd_client, node));
  gshm_list_foreach_safe(pos, tmp, &r->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    /* Shutting down is not freeing: parked fds stay in the fd store so
     * that the next gshmd gets the memory back. */
    r->on_event = NULL;
    gshmd__reg_segment_free(r, seg, false);
  }
  gshm_list_foreach_safe(pos, tmp, &r->hidden)
      gshmd_registry_discard_hidden(r, gshm_list_entry(pos, struct gshmd_segment, node));
  tdestroy(r->by_name, noop_free);
  tdestroy(r->by_id, noop_free);
  gshmd_seg_index_free(&r->seg_index);
  gshmd_seg_index_free(&r->lease_index);
  tdestroy(r->lease_by_id, noop_free);
  tdestroy(r->usage_root, usage_free_node);
  r->usage_root = NULL;
  r->by_name = r->by_id = r->lease_by_id = NULL;
}

const char *gshmd__reg_fmt_msg(struct gshmd_registry *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msgbuf, sizeof(r->msgbuf), fmt, ap);
  va_end(ap);
  return r->msgbuf;
}

int gshmd__reg_name_check(struct gshmd_registry *r, const char *name, const char **msg_out) {
  int e = gshm__name_check(name, r->cfg->max_name);

  if (e)
    *msg_out = e == -ENAMETOOLONG
                   ? gshmd__reg_fmt_msg(r, "name is longer than %u bytes", r->cfg->max_name)
                   : "bad name: 1..255 bytes, '/'-separated components, none empty, '.' or '..', "
                     "no control characters";
  return e;
}

/* (the name is checked only here, on a miss: only names valid at create
 * are in the tree, and a lookup that hits pays nothing: callgrind, 6% of
 * an open) */
int gshmd_registry_no_segment(struct gshmd_registry *r, const char *name, const char **msg_out) {
  int e = gshmd__reg_name_check(r, name, msg_out);

  if (e)
    return e;
  *msg_out = gshmd__reg_fmt_msg(r, "no segment named '%s'", name);
  return -ENOENT;
}

/* Unlink, chmod, chown: the segment's owner or an admin. */
bool gshmd_registry_may_manage(const struct gshmd_client *c, const struct gshmd_segment *seg) {
  return c->cred.admin || c->cred.uid == seg->uid;
}

/* A refusal says who owns the segment only to a client that may see it
 * in listings anyway; to others only "permission denied": an error must
 * not reveal what `segments` hides. */
int gshmd__reg_not_owner(struct gshmd_registry *r, const struct gshmd_client *c,
                         const struct gshmd_segment *seg, const char **msg_out) {
  *msg_out =
      gshmd_registry_may_see(c, seg)
          ? gshmd__reg_fmt_msg(r, "segment '%s' belongs to uid %u", seg->name, (unsigned)seg->uid)
          : "permission denied";
  return -EACCES;
}

int gshmd_registry_client_add(struct gshmd_registry *r, const struct gshmd_cred *cred,
                              struct gshmd_client **c_out) {
  struct gshmd_client *c;

  if (!(c = calloc(1, sizeof(*c))))
    return -ENOMEM;
  c->cred = *cred;
  c->cred.groups = NULL;
  if (cred->ngroups > 0) {
    if (!(c->cred.groups = malloc(sizeof(gid_t) * (size_t)cred->ngroups))) {
      free(c);
      return -ENOMEM;
    }
    memcpy(c->cred.groups, cred->groups, sizeof(gid_t) * (size_t)cred->ngroups);
  }
  c->session_id = r->next_session_id++;
  if (r->on_event)
    r->on_event(r, NULL, GSHMD_IDS_USED);
  c->since_ns = gshm__now_ns(CLOCK_REALTIME);
  gshm_list_init(&c->leases);
  gshm_list_add_tail(&r->clients, &c->node);
  r->nclients++;
  *c_out = c;
  return 0;
}

void gshmd_registry_client_remove(struct gshmd_registry *r, struct gshmd_client *c) {
  struct gshm_list *pos, *tmp;

  if (!c)
    return;
  gshm_list_foreach_safe(pos, tmp, &c->leases)
      gshmd__reg_lease_end(r, gshm_list_entry(pos, struct gshmd_lease, client_node), false);
  gshm_list_del(&c->node);
  r->nclients--;
  free(c->cred.groups);
  free(c);
}

bool gshmd__reg_cred_in_group(const struct gshmd_cred *cred, gid_t gid) {
  if (cred->gid == gid)
    return true;
  for (int i = 0; i < cred->ngroups; i++)
    if (cred->groups[i] == gid)
      return true;
  return false;
}

bool gshmd_registry_may_access(const struct gshmd_client *c, const struct gshmd_segment *seg,
                               int access) {
  uint32_t need = access == GSHM__ACCESS__ACCESS_READ_WRITE ? 06 : 04, bits;

  if (c->cred.admin)
    return true;
  /* POSIX order: the first class that matches decides. */
  if (c->cred.uid == seg->uid)
    bits = (seg->mode >> 6) & 7;
  else if (gshmd__reg_cred_in_group(&c->cred, seg->gid))
    bits = (seg->mode >> 3) & 7;
  else
    bits = seg->mode & 7;
  return (bits & need) == need;
}

bool gshmd_registry_may_see(const struct gshmd_client *c, const struct gshmd_segment *seg) {
  return c->cred.admin || c->cred.uid == seg->uid ||
         gshmd_registry_may_access(c, seg, GSHM__ACCESS__ACCESS_READ);
}

struct gshmd_segment *gshmd_registry_find_id_for(struct gshmd_registry *r,
                                                 const struct gshmd_client *c, uint64_t id) {
  struct gshmd_segment *seg = gshmd_registry_find_id(r, id);

  return seg && (gshmd_registry_may_see(c, seg) || gshmd_registry_holds(c, seg)) ? seg : NULL;
}

bool gshmd_registry_holds(const struct gshmd_client *c, const struct gshmd_segment *seg) {
  const struct gshm_list *head = c->nleases < seg->nleases ? &c->leases : &seg->leases;
  bool by_client = head == &c->leases;
  const struct gshm_list *pos;

  /* (the shorter list: a client that holds nothing walks nothing) */
  for (pos = head->next; pos != head; pos = pos->next) {
    const struct gshmd_lease *l = by_client ? gshm_list_entry(pos, struct gshmd_lease, client_node)
                                            : gshm_list_entry(pos, struct gshmd_lease, seg_node);
    if (l->seg == seg && l->client == c)
      return true;
  }
  return false;
}

struct gshmd_segment *gshmd_registry_find_name(struct gshmd_registry *r, const char *name) {
  struct gshmd_segment key = {.name = (char *)name}, **slot;
  slot = tfind(&key, &r->by_name, gshmd__reg_cmp_name);
  return slot ? *slot : NULL;
}

struct gshmd_segment *gshmd_registry_find_id(struct gshmd_registry *r, uint64_t id) {
  struct gshmd_segment key = {.id = id}, **slot;
  slot = tfind(&key, &r->by_id, gshmd__reg_cmp_seg_id);
  return slot ? *slot : NULL;
}

struct gshmd_segment *gshmd_registry_find_after(struct gshmd_registry *r, uint64_t after) {
  return gshmd_seg_index_after(&r->seg_index, after);
}

struct gshmd_lease *gshmd_registry_find_lease_after(struct gshmd_registry *r, uint64_t after) {
  return gshmd_seg_index_after(&r->lease_index, after);
}

struct gshmd_lease *gshmd_registry_find_lease(struct gshmd_registry *r, uint64_t lease_id) {
  struct gshmd_lease key = {.id = lease_id}, **slot;
  slot = tfind(&key, &r->lease_by_id, cmp_lease_id);
  return slot ? *slot : NULL;
}

int gshmd__reg_lease_add(struct gshmd_registry *r, struct gshmd_client *c, struct gshmd_segment *seg,
                         int access, struct gshmd_lease **out, const char **msg_out) {
  struct usage *u = gshmd__reg_usage_get(r, c->cred.uid);
  struct gshmd_lease *l;

  if (!u)
    return -ENOMEM;
  if (r->cfg->quota_leases && c->cred.uid && u->leases >= r->cfg->quota_leases) {
    *msg_out = gshmd__reg_fmt_msg(r, "uid %u holds %u lease%s, limit %u (quota.leases)",
                                  (unsigned)c->cred.uid, u->leases, gshm__plural(u->leases),
                                  r->cfg->quota_leases);
    return -EDQUOT;
  }
  if (gshmd_seg_index_reserve(&r->lease_index) || !(l = calloc(1, sizeof(*l))))
    return -ENOMEM;
  l->id = r->next_lease_id++;
  if (r->on_event)
    r->on_event(r, NULL, GSHMD_IDS_USED);
  l->seg = seg;
  l->client = c;
  l->access = access;
  l->since_ns = gshm__now_ns(CLOCK_REALTIME);
  if (r->token_make) {
    r->token_make(r->token_arg, seg, c->cred.uid, access, l->token);
    l->has_token = true;
  }
  if (!tsearch(l, &r->lease_by_id, cmp_lease_id)) {
    free(l);
    return -ENOMEM;
  }
  gshmd_seg_index_add(&r->lease_index, l, l->id);
  gshm_list_add_tail(&seg->leases, &l->seg_node);
  gshm_list_add_tail(&c->leases, &l->client_node);
  gshm_list_add_tail(&r->leases, &l->node);
  seg->nleases++;
  c->nleases++;
  r->nleases++;
  u->leases++;
  *out = l;
  return 0;
}

/* An open of seg by c that its mode refuses (by id when by_id): -EACCES
 * with the owner, group and mode in *msg_out only for a client that may
 * see them; by id, to one that may not, the answer of an id not in use
 * (-ESTALE, GSHMD_ID_GONE): ids are counted up, and -EACCES told which of
 * them are other users' live segments. */
static int open_refused(struct gshmd_registry *r, const struct gshmd_client *c,
                        const struct gshmd_segment *seg, bool by_id, int access,
                        const char **msg_out) {
  bool unseen = !gshmd_registry_may_see(c, seg);
  const char *how = access == GSHM__ACCESS__ACCESS_READ ? "read" : "read-write";

  gshm_log_notice("denied: pid %d uid %u %s open of '%s'", (int)c->cred.pid,
                  (unsigned)c->cred.uid, access == GSHM__ACCESS__ACCESS_READ ? "read" : "rw",
                  seg->name);
  if (unseen && by_id) {
    *msg_out = GSHMD_ID_GONE;
    return -ESTALE;
  }
  *msg_out = unseen ? "permission denied"
                    : gshmd__reg_fmt_msg(r, "segment '%s' (uid %u, gid %u, mode %04o) refuses %s "
                                         "access to uid %u", seg->name, (unsigned)seg->uid,
                                         (unsigned)seg->gid, seg->mode, how,
                                         (unsigned)c->cred.uid);
  return -EACCES;
}

int gshmd_registry_open(struct gshmd_registry *r, struct gshmd_client *c,
                        const Gshm__OpenRequest *req, struct gshmd_lease **lease_out,
                        const char **msg_out) {
  struct gshmd_segment *seg;
  int access = req->access;
  bool granted = false;

  if (access != GSHM__ACCESS__ACCESS_READ && access != GSHM__ACCESS__ACCESS_READ_WRITE) {
    *msg_out = "access must be read or read-write";
    return -EINVAL;
  }
  /* A legacy IPC handle always opens read-write (cuIpcOpenMemHandle has no
   * read-only mode), whatever the request says: check for that. */
  if (req->legacy_ipc)
    access = GSHM__ACCESS__ACCESS_READ_WRITE;
  if (req->segment_id) {
    seg = gshmd_registry_find_id(r, req->segment_id);
    if (!seg || (req->generation && seg->generation != req->generation)) {
      *msg_out = GSHMD_ID_GONE;
      return -ESTALE;
    }
    /* A re-take that proves its grant keeps the grant's access: a lease is
     * a capability given once, as an open file is, and a later chmod,
     * chown or unlink does not take it back (revoke does: it frees the
     * segment, and ids are never reused).  A legacy IPC re-open is not a
     * re-take. */
    granted = !req->legacy_ipc && r->token_check && req->generation &&
              r->token_check(r->token_arg, seg, c->cred.uid, access, req->lease_token.data,
                             req->lease_token.len);
  } else {
    seg = gshmd_registry_find_name(r, req->name);
    if (!seg)
      return gshmd_registry_no_segment(r, req->name, msg_out);
  }
  if (!granted && !gshmd_registry_may_access(c, seg, access))
    return open_refused(r, c, seg, req->segment_id != 0, access, msg_out);
  /* An unlinked segment has no name: like an unlinked file, nobody opens
   * it anew, only its holders re-take their grants with their tokens.
   * Else any user its mode allowed could open it by id (ids are counted
   * up) and keep memory its owner had let go, charged to the owner, who
   * can no longer chmod it.  The owner and admins may (they can manage
   * it anyway), and so may anyone during a restart's grace period, for
   * re-takes where the lease key was lost (the modes then decide); not
   * where it came back, for the holders' tokens then still check (before,
   * any user the mode allowed could open an unlinked segment by id for
   * 30 s after every restart and keep it). */
  if (seg->unlinked && !granted &&
      !(seg->restored && !r->restore_grace_over && !r->tokens_restored) &&
      !gshmd_registry_may_manage(c, seg)) {
    *msg_out = "segment is unlinked: only a re-take with its lease token reaches it";
    return -ESTALE;
  }
  if (req->legacy_ipc && !(seg->flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC)) {
    *msg_out = "segment was not created with legacy IPC export";
    return -ENOTSUP;
  }
  return gshmd__reg_lease_add(r, c, seg, access, lease_out, msg_out);
}

int gshmd_registry_close(struct gshmd_registry *r, struct gshmd_client *c, uint64_t lease_id) {
  struct gshmd_lease *l = gshmd_registry_find_lease(r, lease_id);

  if (!l || l->client != c)
    return -ENOENT;
  gshmd__reg_lease_end(r, l, false);
  return 0;
}

int gshmd_registry_unlink(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                          const char **msg_out) {
  struct gshmd_segment *seg = gshmd_registry_find_name(r, name);

  if (!seg)
    return gshmd_registry_no_segment(r, name, msg_out);
  if (!gshmd_registry_may_manage(c, seg))
    return gshmd__reg_not_owner(r, c, seg, msg_out);
  tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
  seg->unlinked = true;
  r->changes++;
  gshm_log_info("segment '%s' id %" PRIu64 " unlinked by pid %d (%u %s)", seg->name, seg->id,
                (int)c->cred.pid, seg->nleases,
                seg->nleases == 1 ? "lease remains" : "leases remain");
  if (seg->nleases == 0 && gshmd__reg_segment_release(r, seg))
    return 0;
  if (r->on_event)
    r->on_event(r, seg, GSHMD_SEGMENT_UNLINKED);
  return 0;
}

void gshmd_segment_to_info(const struct gshmd_segment *seg, Gshm__SegmentInfo *info) {
  gshm__segment_info__init(info);
  info->id = seg->id;
  info->generation = seg->generation;
  info->name = seg->name;
  info->size = seg->mem->size;
  info->requested_size = seg->requested_size;
  info->location = (char *)seg->mem->location;
  info->uid = seg->uid;
  info->gid = seg->gid;
  info->mode = seg->mode;
  info->flags = seg->flags;
  info->state = seg->unlinked ? GSHM__SEGMENT_STATE__SEGMENT_STATE_UNLINKED
                              : GSHM__SEGMENT_STATE__SEGMENT_STATE_LIVE;
  info->leases = seg->nleases;
  info->created_ns = seg->created_ns;
  info->device_index = seg->mem->device_index;
  info->granularity = seg->mem->granularity;
  if (seg->source)
    info->source = seg->source;
}
