/* SPDX-License-Identifier: Apache-2.0 */
/* Hidden segments and their publishing in one step, for cluster pulls and
 * for a client's own hidden creates (PUBLISH). */
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

int gshmd_registry_create_hidden(struct gshmd_registry *r, struct gshmd_client *c,
                                 const Gshm__CreateRequest *req, struct gshmd_segment **seg_out,
                                 const char **msg_out) {
  struct gshmd_segment *seg;
  int e;

  if ((e = gshmd__reg_segment_new(r, c, req, true, &seg, msg_out)))
    return e;
  gshm_list_add_tail(&r->hidden, &seg->node);
  r->nhidden++;
  seg->hidden = true;
  *seg_out = seg;
  return 0;
}

void gshmd_registry_discard_hidden(struct gshmd_registry *r, struct gshmd_segment *seg) {
  /* Peers' grants of it end with it, as a revoke's do (r->on_free leaves
   * the memory to their sends in flight).  Kept for them, it stayed
   * charged to its owner for as long as a peer held a grant, and had no
   * id or name an admin could revoke. */
  for (unsigned n = seg->nleases; n > 0; n--)
    gshmd__reg_lease_end(r, gshm_list_entry(seg->leases.next, struct gshmd_lease, seg_node), true);
  gshm_list_del(&seg->node);
  r->nhidden--;
  gshmd__reg_segment_drop(r, seg);
}

int gshmd_registry_lease_hidden(struct gshmd_registry *r, struct gshmd_client *c,
                                struct gshmd_segment *seg, int access,
                                struct gshmd_lease **lease_out, const char **msg_out) {
  if (!seg->hidden || seg->unlinked) {
    *msg_out = "the segment's pull failed here";
    return -ESTALE;
  }
  return gshmd__reg_lease_add(r, c, seg, access, lease_out, msg_out);
}

static int cmp_seg_ptr_name(const void *a, const void *b) {
  return gshmd__reg_cmp_name(*(struct gshmd_segment *const *)a, *(struct gshmd_segment *const *)b);
}

/* A segment of segs[0..n) whose name another one has too, or NULL;
 * scratch: room for n pointers. */
static struct gshmd_segment *duplicate_name(struct gshmd_segment *const *segs, size_t n,
                                            struct gshmd_segment **scratch) {
  memcpy(scratch, segs, n * sizeof(*scratch));
  qsort(scratch, n, sizeof(*scratch), cmp_seg_ptr_name);
  for (size_t i = 1; i < n; i++)
    if (!gshmd__reg_cmp_name(scratch[i - 1], scratch[i]))
      return scratch[i];
  return NULL;
}

/* The live segment that holds seg's name, or NULL. */
static struct gshmd_segment *name_holder(struct gshmd_registry *r, struct gshmd_segment *seg) {
  struct gshmd_segment **slot = tfind(seg, &r->by_name, gshmd__reg_cmp_name);
  return slot ? *slot : NULL;
}

/* Undoes the tree insertions of publish for segs[0..n): ids from id0. */
static void publish_undo(struct gshmd_registry *r, struct gshmd_segment *const *segs, size_t n,
                         size_t named, size_t ided, uint64_t id0) {
  for (size_t i = 0; i < ided; i++)
    tdelete(segs[i], &r->by_id, gshmd__reg_cmp_seg_id);
  for (size_t i = 0; i < named; i++)
    if (segs[i]->unlinked) /* (marks the ones publish named) */
      tdelete(segs[i], &r->by_name, gshmd__reg_cmp_name);
  for (size_t i = 0; i < n; i++) {
    segs[i]->unlinked = false;
    segs[i]->id = 0;
  }
  r->next_segment_id = id0;
}

/* Fills old[i] with the segment that holds segs[i]'s name, NULL for none;
 * each must be c's to replace, and replace asked.  0, or -EEXIST or
 * -EACCES with *msg_out set. */
static int name_holders(struct gshmd_registry *r, struct gshmd_client *c,
                        struct gshmd_segment *const *segs, size_t n, bool replace,
                        struct gshmd_segment **old, const char **msg_out) {
  for (size_t i = 0; i < n; i++) {
    if (!(old[i] = name_holder(r, segs[i])))
      continue;
    if (!replace) {
      *msg_out = gshmd__reg_fmt_msg(r, "segment '%s' exists", segs[i]->name);
      return -EEXIST;
    }
    if (!gshmd_registry_may_manage(c, old[i])) {
      *msg_out = gshmd__reg_fmt_msg(r, "segment '%s' is not yours to replace", segs[i]->name);
      return -EACCES;
    }
  }
  return 0;
}

/* The last step of a publish: the segments old[0..n) (NULL: none) lost
 * their names to the new ones and are unlinked, as by an unlink.  Their
 * holders are told first, as an unlink's are: each one's lease cache must
 * stop serving the old segment under the name.  One the fd store holds
 * (fs_replaced: its publish is not yet recorded complete) has its unlink
 * written already, and stays until gshmd_registry_release_replaced. */
static void unlink_replaced(struct gshmd_registry *r, struct gshmd_segment **old, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (old[i] && old[i]->nleases && r->on_replaced)
      r->on_replaced(r->on_replaced_arg, old[i]);
  for (size_t i = 0; i < n; i++) {
    if (!old[i])
      continue;
    old[i]->unlinked = true; /* its name node is the new segment's now */
    r->changes++;
    gshm_log_info("segment '%s' id %" PRIu64 " replaced (%u %s%s)", old[i]->name, old[i]->id,
                  old[i]->nleases, old[i]->nleases == 1 ? "lease remains" : "leases remain",
                  old[i]->fs_replaced ? "; kept until the fd store has the new set" : "");
    /* as an unlink (restored ones kept through the grace period) */
    if (old[i]->fs_replaced || (old[i]->nleases == 0 && gshmd__reg_segment_release(r, old[i])) ||
        !r->on_event)
      continue;
    r->on_event(r, old[i], GSHMD_SEGMENT_UNLINKED);
  }
}

void gshmd_registry_release_replaced(struct gshmd_registry *r, struct gshmd_segment *seg) {
  if (seg->unlinked && seg->nleases == 0 && !seg->hidden)
    gshmd__reg_segment_release(r, seg);
}

int gshmd_registry_publish(struct gshmd_registry *r, struct gshmd_client *c,
                           struct gshmd_segment *const *segs, size_t n, bool replace,
                           const char **msg_out) {
  struct gshmd_segment **old = calloc(n ? n : 1, sizeof(*old)), *dup;
  uint64_t id0 = r->next_segment_id;
  size_t named = 0, ided = 0;
  char sz[32];
  int e;

  if (!old)
    return -ENOMEM;
  if ((dup = duplicate_name(segs, n, old))) { /* (old: scratch space, cleared after) */
    *msg_out = gshmd__reg_fmt_msg(r, "two segments of the set are named '%s'", dup->name);
    free(old);
    return -EINVAL;
  }
  memset(old, 0, n * sizeof(*old));
  if ((e = name_holders(r, c, segs, n, replace, old, msg_out))) {
    free(old);
    return e;
  }
  /* Every allocation first (tree nodes), undone on failure: nothing is
   * visible until the last one succeeded.  seg->unlinked marks, for the
   * undo, the ones given a name node of their own. */
  if (gshmd_seg_index_reserve_n(&r->seg_index, n)) { /* (so that the adds below cannot fail) */
    free(old);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++)
    segs[i]->id = r->next_segment_id++;
  for (; ided < n; ided++)
    if (!tsearch(segs[ided], &r->by_id, gshmd__reg_cmp_seg_id))
      goto nomem;
  for (; named < n; named++) {
    if (old[named])
      continue;
    if (!tsearch(segs[named], &r->by_name, gshmd__reg_cmp_name))
      goto nomem;
    segs[named]->unlinked = true;
  }
  /* The swap: no failure from here on.  A replaced name's tree node is
   * given the new segment in place (same name, so the tree stays
   * ordered). */
  for (size_t i = 0; i < n; i++) {
    struct gshmd_segment *seg = segs[i];
    seg->unlinked = false;
    seg->hidden = false;
    if (old[i])
      *(struct gshmd_segment **)tfind(seg, &r->by_name, gshmd__reg_cmp_name) = seg;
    seg->generation = r->next_generation++;
    gshm_list_del(&seg->node); /* off r->hidden */
    r->nhidden--;
    gshm_list_add_tail(&r->segments, &seg->node);
    /* in the id index too: a listing resumes through it (new ids: appended) */
    gshmd_seg_index_add(&r->seg_index, seg, seg->id);
    r->nsegments++;
    r->changes++;
    gshm_log_info("segment '%s' id %" PRIu64 " published: %s at %s, mode %04o, uid %u%s", seg->name,
                  seg->id, gshm__format_size(seg->mem->size, sz, sizeof(sz)), seg->mem->location,
                  seg->mode, (unsigned)seg->uid, old[i] ? " (replaces the old one)" : "");
  }
  /* The fd store learns of the new segments and of the old ones' unlink
   * as one publish: all or nothing across a crash (fdstore_publish.c). */
  if (r->on_event) {
    r->on_event(r, NULL, GSHMD_PUBLISH_BEGIN);
    for (size_t i = 0; i < n; i++)
      r->on_event(r, segs[i], GSHMD_SEGMENT_CREATED);
    for (size_t i = 0; i < n; i++)
      if (old[i])
        r->on_event(r, old[i], GSHMD_SEGMENT_REPLACED);
    r->on_event(r, NULL, GSHMD_PUBLISH_END);
  }
  unlink_replaced(r, old, n);
  free(old);
  return 0;
nomem:
  publish_undo(r, segs, n, named, ided, id0);
  free(old);
  return -ENOMEM;
}

int gshmd__reg_create_local_hidden(struct gshmd_registry *r, struct gshmd_client *c,
                                   const Gshm__CreateRequest *req, struct gshmd_lease **lease_out,
                                   const char **msg_out) {
  struct gshmd_segment *seg;
  int e;

  if ((e = gshmd_registry_create_hidden(r, c, req, &seg, msg_out)))
    return e;
  seg->local = true;
  if ((e = gshmd__reg_lease_add(r, c, seg, GSHM__ACCESS__ACCESS_READ_WRITE, lease_out, msg_out))) {
    gshmd_registry_discard_hidden(r, seg);
    return e;
  }
  gshm_log_info("hidden segment '%s' created by pid %d, to be published", seg->name,
                (int)c->cred.pid);
  return 0;
}

int gshmd_registry_publish_lease(struct gshmd_registry *r, struct gshmd_client *c,
                                 uint64_t lease_id, bool replace, struct gshmd_lease **lease_out,
                                 const char **msg_out) {
  struct gshmd_lease *l = gshmd_registry_find_lease(r, lease_id);
  struct gshmd_segment *seg;
  int e;

  if (!l || l->client != c) {
    *msg_out = "no such lease on this connection (a hidden segment ends with its lease and with "
               "a gshmd restart)";
    return -ESTALE;
  }
  seg = l->seg;
  /* Only the creator's own hidden segment: not one a pull fills (a peer
   * relaying it holds a lease on it), not a published one. */
  if (!seg->hidden || !seg->local || l->access != GSHM__ACCESS__ACCESS_READ_WRITE) {
    *msg_out = seg->hidden ? "not a hidden segment of this client's create"
                           : gshmd__reg_fmt_msg(r, "segment '%s' is published already", seg->name);
    return -EINVAL;
  }
  if ((e = gshmd_registry_publish(r, c, &seg, 1, replace, msg_out)))
    return e;
  seg->local = false;
  /* The grant's token named the hidden segment (id 0): re-takes after a
   * restart need the live one's. */
  if (r->token_make)
    r->token_make(r->token_arg, seg, c->cred.uid, l->access, l->token);
  *lease_out = l;
  return 0;
}

int gshmd_registry_publish_resent(struct gshmd_registry *r, struct gshmd_client *c, uint64_t id,
                                  struct gshmd_lease **lease_out, const char **msg_out) {
  struct gshmd_segment *seg = gshmd_registry_find_id(r, id);
  int e;

  /* (ids never recur: one noted by a publish that the store never got
   * is nobody's after the restart).  Only for its owner, as a resent
   * create's or pull's: the memo is keyed by the publisher's uid, and a
   * segment an admin gave to another user since must not come back to
   * the old owner read-write, with a lease token that opens it by id. */
  if (!seg || seg->hidden || seg->uid != c->cred.uid) {
    gshm_log_notice("publish sent again by pid %d (its token is an earlier publish's: a reply "
                    "lost to a restart): its segment id %" PRIu64 " is gone, the restart came "
                    "before the publish was stored, or it was freed or given to another user "
                    "since", (int)c->cred.pid, id);
    *msg_out = "the hidden segment is gone: gshmd restarted before its publish was stored (or "
               "the published segment was freed or given to another user since)";
    return -ESTALE;
  }
  if ((e = gshmd__reg_lease_add(r, c, seg, GSHM__ACCESS__ACCESS_READ_WRITE, lease_out, msg_out)))
    return e;
  gshm_log_notice("publish of '%s' sent again by pid %d (its token is an earlier publish's: a "
                  "reply lost to a restart): that one published it as id %" PRIu64
                  "; lease %" PRIu64 " given",
                  seg->name, (int)c->cred.pid, seg->id, (*lease_out)->id);
  return 0;
}
