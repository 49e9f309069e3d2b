/* SPDX-License-Identifier: Apache-2.0 */
/* Best-fit carving of one address range (a pool segment of
 * client/torch_alloc.c; gshmd's pinned staging arena,
 * daemon/cluster/stage.c): offsets only, no memory is touched.  Not
 * thread-safe: each user keeps it under its own lock or on one thread. */
#ifndef GSHM_COMMON_ARENA_H
#define GSHM_COMMON_ARENA_H

#include <stddef.h>
#include <stdint.h>

struct gshm__extent {
  uint64_t off, size;
  struct gshm__extent *next;
};

struct gshm__arena {
  uint64_t size;              /* bytes of the range */
  uint64_t live_bytes;        /* handed out */
  size_t nlive;               /* blocks handed out */
  struct gshm__extent *free;  /* sorted by offset, neighbours merged */
  struct gshm__extent *live;  /* handed out, newest first */
};

/* An arena of `size` bytes, all free.  Errors: -EINVAL size 0; -ENOMEM. */
int gshm__arena_init(struct gshm__arena *a, uint64_t size);

/* Frees the lists (the arena is then empty and unusable).  Accepts an
 * arena that init failed on or zeroed. */
void gshm__arena_fini(struct gshm__arena *a);

/* How well `size` bytes (> 0) fit: *leftover_out gets the bytes the
 * smallest free extent that holds them would have left.  Errors: -ENOMEM
 * no free extent is large enough; -EINVAL size 0. */
int gshm__arena_fit(struct gshm__arena *a, uint64_t size, uint64_t *leftover_out);

/* Takes `size` bytes (> 0) from the start of the smallest free extent
 * that holds them (best fit; the lowest offset among equals); *off_out
 * gets their offset.  Errors: -ENOMEM no free extent is large enough (or
 * malloc failed); -EINVAL size 0. */
int gshm__arena_carve(struct gshm__arena *a, uint64_t size, uint64_t *off_out);

/* Gives back the block that starts at `off`, merging it with free
 * neighbours.  Errors: -EINVAL no live block starts there (freed twice, or
 * never handed out); nothing changes then. */
int gshm__arena_return(struct gshm__arena *a, uint64_t off);

#endif
