/* SPDX-License-Identifier: Apache-2.0 */
/* Items with an id (segments, leases) in id order with a lower-bound
 * lookup: the first item whose id is above a listing's cursor, also when
 * the cursor's own item was freed meanwhile, in O(log n) amortized
 * (glibc's tsearch has no lower bound, and the id-ordered list would be
 * walked from its head).
 *
 * A sorted array: ids only grow, so a new segment is appended; a freed one
 * leaves a hole that points past itself (followed with path compression,
 * as in a disjoint-set forest) until the array is compacted, once the holes
 * outnumber the segments (amortized O(1) per free). */
#ifndef GSHMD_SEG_INDEX_H
#define GSHMD_SEG_INDEX_H

#include <stddef.h>
#include <stdint.h>

struct gshmd_seg_index {
  struct seg_index_slot {
    uint64_t id;
    void *seg;                 /* the item; NULL: a hole */
    size_t next;               /* a hole: an index further on to look at */
  } *slots;
  size_t n, cap, holes;
  uint64_t hops;               /* holes stepped over by lookups (tests) */
};

/* Makes room for one more segment, so that the next add cannot fail.
 * Returns 0 or -ENOMEM. */
int gshmd_seg_index_reserve(struct gshmd_seg_index *x);
/* The same for `more` of them (a publish's set). */
int gshmd_seg_index_reserve_n(struct gshmd_seg_index *x, size_t more);

/* Adds seg, an item of id (id order is kept; appending is O(1)), in the
 * room a reserve made. */
void gshmd_seg_index_add(struct gshmd_seg_index *x, void *seg, uint64_t id);

/* Removes the segment of id (none: nothing happens). */
void gshmd_seg_index_remove(struct gshmd_seg_index *x, uint64_t id);

/* The item with the smallest id above `after`, or NULL. */
void *gshmd_seg_index_after(struct gshmd_seg_index *x, uint64_t after);

void gshmd_seg_index_free(struct gshmd_seg_index *x);

#endif
