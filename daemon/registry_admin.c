/* SPDX-License-Identifier: Apache-2.0 */
/* The registry's administration: adopt at restore, unname, reap, chmod, chown, revoke. */
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "registry_internal.h"
#include "util.h"

int gshmd_registry_adopt(struct gshmd_registry *r, const Gshm__StateRecord *rec,
                         struct gshmd_alloc *mem) {
  struct gshmd_segment *seg;
  struct usage *u;

  if (rec->id == 0 || rec->id == UINT64_MAX || rec->generation == UINT64_MAX)
    return -EINVAL; /* ids and generations must stay increasing */
  if (gshmd_registry_find_id(r, rec->id) ||
      (!rec->unlinked && gshmd_registry_find_name(r, rec->name)))
    return -EEXIST;
  if (gshmd_seg_index_reserve(&r->seg_index) || !(u = gshmd__reg_usage_get(r, rec->uid)))
    return -ENOMEM;
  if (!(seg = calloc(1, sizeof(*seg))) || !(seg->name = strdup(rec->name))) {
    free(seg);
    return -ENOMEM;
  }
  seg->id = rec->id;
  seg->generation = rec->generation;
  seg->requested_size = rec->requested_size;
  seg->mem = mem;
  seg->uid = rec->uid;
  seg->gid = rec->gid;
  seg->mode = rec->mode & 0777;
  seg->flags = rec->flags;
  seg->created_ns = rec->created_ns;
  seg->unlinked = rec->unlinked;
  seg->restored = true;
  if ((seg->has_token = rec->create_token.len == GSHM_CREATE_TOKEN_BYTES))
    memcpy(seg->create_token, rec->create_token.data, GSHM_CREATE_TOKEN_BYTES);
  if (rec->source && *rec->source && !(seg->source = strdup(rec->source))) {
    free(seg->name);
    free(seg);
    return -ENOMEM;
  }
  gshm_list_init(&seg->leases);
  if ((!seg->unlinked && !tsearch(seg, &r->by_name, gshmd__reg_cmp_name)) ||
      !tsearch(seg, &r->by_id, gshmd__reg_cmp_seg_id)) {
    if (!seg->unlinked)
      tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
    free(seg->source);
    free(seg->name);
    free(seg);
    return -ENOMEM;
  }
  /* Keep id order in the list (state records come sorted, but be safe). */
  {
    struct gshm_list *pos = r->segments.prev;
    while (pos != &r->segments && gshm_list_entry(pos, struct gshmd_segment, node)->id > seg->id)
      pos = pos->prev;
    gshm_list_add_tail(pos->next, &seg->node);
  }
  gshmd_seg_index_add(&r->seg_index, seg, seg->id);
  r->nsegments++;
  r->changes++;
  r->bytes += mem->size;
  gshmd__reg_usage_charge(u, mem, +1);
  if (seg->id >= r->next_segment_id)
    r->next_segment_id = seg->id + 1;
  if (seg->generation >= r->next_generation)
    r->next_generation = seg->generation + 1;
  return 0;
}

unsigned gshmd_registry_park_all(struct gshmd_registry *r, struct gshmd_backend *b) {
  struct gshmd_backend *p = gshmd_backend_parked();
  struct gshm_list *pos;
  unsigned n = 0;

  gshm_list_foreach(pos, &r->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    struct gshmd_alloc *was = seg->mem, *mem;
    int lent, fd, e;

    if (!was || was->backend != b)
      continue;
    if ((e = b->ops->park_fd(b, was, &lent)))
      ;
    else if ((fd = fcntl(lent, F_DUPFD_CLOEXEC, 3)) < 0)
      e = -errno;
    else if ((e = p->ops->adopt_fd(p, fd, was->location, was->size, &mem)))
      close(fd);
    if (e) {
      gshm_log_err("segment '%s' id %" PRIu64 " (%s) not parked: %s", seg->name, seg->id,
                   was->location, strerror(-e));
      continue;
    }
    seg->mem = mem;
    b->ops->free(b, was);
    n++;
    r->changes++; /* (its memory is another: metrics.c walks again) */
  }
  return n;
}

void gshmd_registry_unname(struct gshmd_registry *r, struct gshmd_segment *seg) {
  if (seg->unlinked)
    return;
  tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
  seg->unlinked = true;
  r->changes++;
}

uint64_t gshmd_registry_grace_begin(struct gshmd_registry *r) {
  struct gshm_list *pos;

  gshm_list_foreach(pos, &r->segments) {
    if (gshm_list_entry(pos, struct gshmd_segment, node)->restored)
      return GSHMD_RESTART_GRACE_MS;
  }
  r->restore_grace_over = true;
  return 0;
}

unsigned gshmd_registry_reap_unlinked(struct gshmd_registry *r) {
  struct gshmd_segment *seg;
  unsigned n = 0;

  r->restore_grace_over = true;
  /* By id, each step looked up again: a free's event may let the fd store
   * catch up and let go of the segments it held, any of them (the list's
   * next one, kept across the free, was then freed under the walk). */
  for (seg = gshmd_registry_find_after(r, 0); seg;) {
    uint64_t id = seg->id;
    if (seg->unlinked && seg->nleases == 0)
      n += gshmd__reg_segment_release(r, seg);
    seg = gshmd_registry_find_after(r, id);
  }
  return n;
}

int gshmd_registry_chmod(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                         uint32_t mode, const char **msg_out) {
  struct gshmd_segment *seg = gshmd_registry_find_name(r, name);

  if (!seg)
    return gshmd_registry_no_segment(r, name, msg_out);
  if (mode & ~0777u) {
    *msg_out = gshmd__reg_fmt_msg(r, "mode %o has bits outside 0777", mode);
    return -EINVAL;
  }
  if (!gshmd_registry_may_manage(c, seg))
    return gshmd__reg_not_owner(r, c, seg, msg_out);
  gshm_log_info("segment '%s' mode %04o -> %04o by pid %d uid %u", seg->name, seg->mode, mode,
                (int)c->cred.pid, (unsigned)c->cred.uid);
  seg->mode = mode;
  r->changes++;
  if (r->on_event)
    r->on_event(r, seg, GSHMD_SEGMENT_CHANGED);
  return 0;
}

int gshmd_registry_chown(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                         int64_t uid, int64_t gid, const char **msg_out) {
  struct gshmd_segment *seg = gshmd_registry_find_name(r, name);
  struct usage *from, *to;

  if (!seg)
    return gshmd_registry_no_segment(r, name, msg_out);
  if (uid < -1 || uid > (int64_t)UINT32_MAX - 1 || gid < -1 || gid > (int64_t)UINT32_MAX - 1) {
    *msg_out = "uid and gid must be 0..4294967294, or -1 to keep";
    return -EINVAL;
  }
  if (!gshmd_registry_may_manage(c, seg))
    return gshmd__reg_not_owner(r, c, seg, msg_out);
  if (uid >= 0 && (uid_t)uid != seg->uid && !c->cred.admin) {
    *msg_out = "only an admin (root or a member of daemon.admin_group) gives a segment to "
               "another user";
    return -EPERM;
  }
  if (gid >= 0 && !c->cred.admin && !gshmd__reg_cred_in_group(&c->cred, (gid_t)gid)) {
    *msg_out =
        gshmd__reg_fmt_msg(r, "uid %u is not in group %u", (unsigned)c->cred.uid, (unsigned)gid);
    return -EPERM;
  }
  if (uid >= 0 && (uid_t)uid != seg->uid) {
    /* Quota usage follows the owner. */
    if (!(from = gshmd__reg_usage_get(r, seg->uid)) || !(to = gshmd__reg_usage_get(r, (uid_t)uid)))
      return -ENOMEM;
    gshmd__reg_usage_charge(from, seg->mem, -1);
    gshmd__reg_usage_charge(to, seg->mem, +1);
    seg->uid = (uid_t)uid;
  }
  if (gid >= 0)
    seg->gid = (gid_t)gid;
  r->changes++;
  gshm_log_info("segment '%s' owner now %u:%u, by pid %d uid %u", seg->name, (unsigned)seg->uid,
                (unsigned)seg->gid, (int)c->cred.pid, (unsigned)c->cred.uid);
  if (r->on_event)
    r->on_event(r, seg, GSHMD_SEGMENT_CHANGED);
  return 0;
}

int gshmd_registry_revoke(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                          uint64_t segment_id, const char **msg_out) {
  struct gshmd_segment *seg;
  unsigned n;

  /* (an admin check first: an id says nothing to others of what exists) */
  if (segment_id && !c->cred.admin) {
    *msg_out = "revoke is for admins (root or a member of daemon.admin_group)";
    return -EPERM;
  }
  seg = segment_id ? gshmd_registry_find_id(r, segment_id) : gshmd_registry_find_name(r, name);
  if (!seg && segment_id) {
    *msg_out = gshmd__reg_fmt_msg(r, "no segment has id %" PRIu64, segment_id);
    return -ESTALE;
  }
  if (!seg)
    return gshmd_registry_no_segment(r, name, msg_out);
  if (!c->cred.admin) {
    *msg_out = "revoke is for admins (root or a member of daemon.admin_group)";
    return -EPERM;
  }
  /* Unlink first so that ending the last lease frees the memory. */
  if (!seg->unlinked)
    tdelete(seg, &r->by_name, gshmd__reg_cmp_name);
  seg->unlinked = true;
  r->changes++;
  gshm_log_notice("segment '%s' id %" PRIu64 " revoked by pid %d uid %u (%u lease%s ended)",
                  seg->name, seg->id, (int)c->cred.pid, (unsigned)c->cred.uid, seg->nleases,
                  gshm__plural(seg->nleases));
  /* Count first: the list head goes with seg (found by
   * tests/fuzz/fuzz_server, corpus revoke_two_leases). */
  for (n = seg->nleases; n > 0; n--)
    gshmd__reg_lease_end(r, gshm_list_entry(seg->leases.next, struct gshmd_lease, seg_node), true);
  /* Revoke takes the memory back, restored or not: the pages go now.  A
   * member of a set the fd store has not recorded complete leaves its
   * record (and fd) there until it has, so that a crash meanwhile does
   * not take the set for one cut short (registry.h GSHMD_SEGMENT_REVOKED). */
  if (seg->fs_publish && r->on_event)
    r->on_event(r, seg, GSHMD_SEGMENT_REVOKED);
  gshmd__reg_segment_free(r, seg, true);
  return 0;
}

void gshmd_registry_drop_revoked(struct gshmd_registry *r, struct gshmd_segment *seg) {
  gshmd__reg_segment_free(r, seg, true); /* (seg->fs_revoked: only out of the registry) */
}

void gshmd_registry_revoked_dispose(struct gshmd_segment *seg) {
  gshmd__reg_segment_dispose(seg, false);
}

_Static_assert(GSHM_WIRE_MAP_DEVICES_MAX == 64, "gshmd_registry_map_report's message names 64");

int gshmd_registry_map_report(struct gshmd_registry *r, struct gshmd_client *c, uint64_t lease_id,
                              const char *const *uuids, size_t n, bool unmapped,
                              const char **msg_out) {
  struct gshmd_lease *l = gshmd_registry_find_lease(r, lease_id);
  size_t total = 1;
  char *devs;

  if (!l || l->client != c) {
    *msg_out = "no such lease on this connection";
    return -ENOENT;
  }
  if (n > GSHM_WIRE_MAP_DEVICES_MAX) {
    *msg_out = "at most 64 devices per mapping report";
    return -EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(uuids[i]);
    /* printable ASCII without blanks: an admin's listing shows them
     * (bytes past 0x7e, no UTF-8, vanished from gshmctl's JSON) */
    for (size_t k = 0; k < len && len <= 47; k++)
      if ((unsigned char)uuids[i][k] <= 0x20 || (unsigned char)uuids[i][k] >= 0x7f ||
          uuids[i][k] == ',')
        len = SIZE_MAX;
    if (len == 0 || len > 47) {
      *msg_out = "bad device uuid";
      return -EINVAL;
    }
    total += len + 1;
  }
  if (!(devs = malloc(total)))
    return -ENOMEM;
  devs[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (i)
      strcat(devs, ",");
    strcat(devs, uuids[i]);
  }
  free(l->mapped_devices);
  l->mapped_devices = devs;
  l->mapped_count = (uint32_t)n;
  l->mapped = !unmapped;
  return 0;
}

int gshmd_registry_grant_undo(struct gshmd_registry *r, struct gshmd_client *c, uint64_t lease_id,
                              bool created) {
  struct gshmd_lease *l = gshmd_registry_find_lease(r, lease_id);
  struct gshmd_segment *seg;
  const char *msg = NULL;
  char *name = NULL;
  uint64_t seg_id;
  int e = 0;

  if (!l || l->client != c)
    return -ENOENT;
  seg_id = l->seg->id;
  if (created && !l->seg->unlinked && !(name = strdup(l->seg->name)))
    e = -ENOMEM;
  gshmd_registry_close(r, c, lease_id);
  /* (the segment may be gone with the lease: looked up again by name) */
  if (name && (seg = gshmd_registry_find_name(r, name)) && seg->id == seg_id)
    gshmd_registry_unlink(r, c, name, &msg);
  free(name);
  return e;
}
