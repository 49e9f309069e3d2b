/* SPDX-License-Identifier: Apache-2.0 */
#include "seg_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The first slot at index >= i that holds a segment (x->n when none);
 * every hole on the way is then linked straight to it (path compression,
 * as in a disjoint-set forest). */
static size_t live_from(struct gshmd_seg_index *x, size_t i) {
  size_t end = i;
  while (end < x->n && !x->slots[end].seg) {
    end = x->slots[end].next;
    x->hops++;
  }
  while (i < end) {
    size_t next = x->slots[i].next;
    x->slots[i].next = end;
    i = next;
  }
  return end;
}

/* The first index whose id is above id (holes keep their ids: sorted). */
static size_t upper(const struct gshmd_seg_index *x, uint64_t id) {
  size_t lo = 0, hi = x->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->slots[mid].id <= id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void compact(struct gshmd_seg_index *x) {
  size_t k = 0;
  for (size_t i = 0; i < x->n; i++)
    if (x->slots[i].seg)
      x->slots[k++] = x->slots[i];
  x->n = k;
  x->holes = 0;
}

int gshmd_seg_index_reserve(struct gshmd_seg_index *x) { return gshmd_seg_index_reserve_n(x, 1); }

int gshmd_seg_index_reserve_n(struct gshmd_seg_index *x, size_t more) {
  if (more > x->cap - x->n) {
    size_t cap = x->cap ? 2 * x->cap : 64;
    struct seg_index_slot *s;
    while (cap - x->n < more)
      cap *= 2;
    s = realloc(x->slots, cap * sizeof(*s));
    if (!s)
      return -ENOMEM;
    x->slots = s;
    x->cap = cap;
  }
  return 0;
}

void gshmd_seg_index_add(struct gshmd_seg_index *x, void *seg, uint64_t id) {
  size_t at;

  if (x->n == x->cap && gshmd_seg_index_reserve(x))
    abort(); /* (callers reserve first) */
  at = x->n;
  if (x->n && x->slots[x->n - 1].id > id) {
    /* Out of order (an adoption): O(n), without holes whose links the
     * shift would make skip the new slot. */
    compact(x);
    at = upper(x, id);
    memmove(&x->slots[at + 1], &x->slots[at], (x->n - at) * sizeof(*x->slots));
  }
  x->slots[at] = (struct seg_index_slot){id, seg, 0};
  x->n++;
}

void gshmd_seg_index_remove(struct gshmd_seg_index *x, uint64_t id) {
  size_t i = upper(x, id);

  if (!i || x->slots[i - 1].id != id || !x->slots[i - 1].seg)
    return;
  x->slots[i - 1].seg = NULL;
  x->slots[i - 1].next = i;
  x->holes++;
  if (x->holes > x->n - x->holes)
    compact(x);
}

void *gshmd_seg_index_after(struct gshmd_seg_index *x, uint64_t after) {
  size_t i = live_from(x, upper(x, after));
  return i < x->n ? x->slots[i].seg : NULL;
}

void gshmd_seg_index_free(struct gshmd_seg_index *x) {
  free(x->slots);
  memset(x, 0, sizeof(*x));
}
