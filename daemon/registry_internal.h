/* SPDX-License-Identifier: Apache-2.0 */
/* The registry's helpers shared by registry.c, registry_admin.c and
 * registry_publish.c. */
#ifndef GSHMD_REGISTRY_INTERNAL_H
#define GSHMD_REGISTRY_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "registry.h"

/* Per-uid usage, for quotas (docs/ARCHITECTURE.md "Security model"). */
struct usage {
  uid_t uid;
  uint64_t host_bytes, cuda_bytes;
  uint32_t segments, leases;
};

/* Whether segment memory m (not NULL) is a GPU's: on a device, or a
 * parked device segment (device_index -1, its location "cuda:..."). */
bool gshmd__reg_on_gpu(const struct gshmd_alloc *m);

/* Adds (sign +1) or removes (-1) segment memory m, NULL for none, to u's usage.
 */
void gshmd__reg_usage_charge(struct usage *u, const struct gshmd_alloc *m, int sign);
/* uid's usage record, made on first use; NULL when out of memory. */
struct usage *gshmd__reg_usage_get(struct gshmd_registry *r, uid_t uid);
/* Tree orders: segments by name, by id. */
int gshmd__reg_cmp_name(const void *a, const void *b);
int gshmd__reg_cmp_seg_id(const void *a, const void *b);
/* Formats a message into r->msgbuf and returns it (valid until the next call).
 */
const char *gshmd__reg_fmt_msg(struct gshmd_registry *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Checks name as a create does (gshm__name_check against limits.max_name):
 * 0, or -EINVAL (empty; an empty, "." or ".." component; a control byte)
 * or -ENAMETOOLONG with *msg_out saying why. */
int gshmd__reg_name_check(struct gshmd_registry *r, const char *name, const char **msg_out);
/* Sets *msg_out to the refusal (owner named only to one who may see seg);
 * returns -EACCES. */
int gshmd__reg_not_owner(struct gshmd_registry *r, const struct gshmd_client *c,
                         const struct gshmd_segment *seg, const char **msg_out);
/* Whether cred's primary or supplementary groups hold gid. */
bool gshmd__reg_cred_in_group(const struct gshmd_cred *cred, gid_t gid);
/* Frees seg (out of every tree and list); discard also gives its pages back
 * now. */
void gshmd__reg_segment_free(struct gshmd_registry *r, struct gshmd_segment *seg, bool discard);
/* The end of seg itself, in no tree or list and its usage uncharged: its
 * pages given back first when discard (backend discard), its memory
 * freed (backend free), its strings and seg freed. */
void gshmd__reg_segment_dispose(struct gshmd_segment *seg, bool discard);
/* Frees an unlinked, unleased seg unless a restart's grace period keeps it;
 * returns whether freed. */
bool gshmd__reg_segment_release(struct gshmd_registry *r, struct gshmd_segment *seg);
/* Ends lease l; the last lease of an unlinked segment releases it unless keep.
 */
void gshmd__reg_lease_end(struct gshmd_registry *r, struct gshmd_lease *l, bool keep);
/* Checks req and c's quotas, allocates and charges a segment in no tree or list
 * (hidden: the name may be taken); 0 or negative errno with *msg_out set. */
int gshmd__reg_segment_new(struct gshmd_registry *r, struct gshmd_client *c,
                           const Gshm__CreateRequest *req, bool hidden,
                           struct gshmd_segment **seg_out, const char **msg_out);
/* Adds a lease of c on seg (no permission check); 0, -EDQUOT (with
 * *msg_out) or -ENOMEM. */
int gshmd__reg_lease_add(struct gshmd_registry *r, struct gshmd_client *c,
                         struct gshmd_segment *seg, int access, struct gshmd_lease **out,
                         const char **msg_out);
/* Frees a segment of segment_new that is in no tree or list (r->on_free
 * first: it may take the memory). */
void gshmd__reg_segment_drop(struct gshmd_registry *r, struct gshmd_segment *seg);
/* gshmd_registry_create of a SEGMENT_FLAG_HIDDEN request
 * (registry_publish.c): a hidden segment (seg->local) and c's read-write
 * lease on it; errors as gshmd_registry_create_hidden and
 * gshmd__reg_lease_add (nothing left then). */
int gshmd__reg_create_local_hidden(struct gshmd_registry *r, struct gshmd_client *c,
                                   const Gshm__CreateRequest *req, struct gshmd_lease **lease_out,
                                   const char **msg_out);
/* Gives seg its id and puts it in the trees, list and index; 0 or -ENOMEM. */
int gshmd__reg_segment_insert(struct gshmd_registry *r, struct gshmd_segment *seg);

#endif
