/* SPDX-License-Identifier: Apache-2.0 */
/* Best-fit carving of one address range; see arena.h.  The lists are
 * short (PyTorch's blocks are 2 MiB and up, a segment 256 MiB; a staging
 * arena's carves are pull_chunk slots, at most a few hundred), so plain
 * linked lists do. */
#include "arena.h"

#include <errno.h>
#include <stdlib.h>

static void extents_free(struct gshm__extent *e) {
  while (e) {
    struct gshm__extent *n = e->next;
    free(e);
    e = n;
  }
}

int gshm__arena_init(struct gshm__arena *a, uint64_t size) {
  a->size = size;
  a->live_bytes = 0;
  a->nlive = 0;
  a->live = NULL;
  a->free = NULL;
  if (!size)
    return -EINVAL;
  if (!(a->free = calloc(1, sizeof(*a->free))))
    return -ENOMEM;
  a->free->size = size;
  return 0;
}

void gshm__arena_fini(struct gshm__arena *a) {
  extents_free(a->free);
  extents_free(a->live);
  a->free = a->live = NULL;
  a->nlive = 0;
  a->live_bytes = 0;
}

/* The link to the smallest free extent of at least size bytes (the first
 * of equals), or NULL. */
static struct gshm__extent **best_fit(struct gshm__arena *a, uint64_t size) {
  struct gshm__extent **pp, **best = NULL;

  for (pp = &a->free; *pp; pp = &(*pp)->next)
    if ((*pp)->size >= size && (!best || (*pp)->size < (*best)->size))
      best = pp;
  return best;
}

int gshm__arena_fit(struct gshm__arena *a, uint64_t size, uint64_t *leftover_out) {
  struct gshm__extent **pp;

  if (!size)
    return -EINVAL;
  if (!(pp = best_fit(a, size)))
    return -ENOMEM;
  *leftover_out = (*pp)->size - size;
  return 0;
}

int gshm__arena_carve(struct gshm__arena *a, uint64_t size, uint64_t *off_out) {
  struct gshm__extent **pp, *x, *blk;

  if (!size)
    return -EINVAL;
  if (!(pp = best_fit(a, size)) || !(blk = malloc(sizeof(*blk))))
    return -ENOMEM;
  x = *pp;
  blk->off = x->off;
  blk->size = size;
  blk->next = a->live;
  a->live = blk;
  x->off += size;
  x->size -= size;
  if (!x->size) {
    *pp = x->next;
    free(x);
  }
  a->nlive++;
  a->live_bytes += size;
  *off_out = blk->off;
  return 0;
}

int gshm__arena_return(struct gshm__arena *a, uint64_t off) {
  struct gshm__extent **pp, *x, *prev = NULL, *blk;

  for (pp = &a->live; (blk = *pp); pp = &blk->next)
    if (blk->off == off)
      break;
  if (!blk)
    return -EINVAL;
  *pp = blk->next;
  a->nlive--;
  a->live_bytes -= blk->size;
  /* into the free list, in offset order, merged with its neighbours */
  for (pp = &a->free; (x = *pp) && x->off < blk->off; pp = &x->next)
    prev = x;
  blk->next = x;
  *pp = blk;
  if (x && blk->off + blk->size == x->off) {
    blk->size += x->size;
    blk->next = x->next;
    free(x);
  }
  if (prev && prev->off + prev->size == blk->off) {
    prev->size += blk->size;
    prev->next = blk->next;
    free(blk);
  }
  return 0;
}
