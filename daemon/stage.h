/* Staging device segments through pinned host memory for pulls, when the
 * UCX in use cannot register CUDA memory (daemon/stage.c). */
#ifndef GSHMD_STAGE_H
#define GSHMD_STAGE_H

#include <stdint.h>

#include "cluster_internal.h"

struct gshmd_segment;

/* Pinned host slots registered with UCX. */
struct stage_buf {
  void *addr;
  uint64_t len;
  uint32_t slots;
  uint64_t slot_size;
  ucp_mem_h memh;
  void *rkey;         /* packed */
  size_t rkey_len;
};

/* The serving side's staging buffer of link l (made on first use).
 * Errors: -ENOTSUP no CUDA backend, -ENOMEM, -EIO. */
int gshmd_stage_serve_buf(struct gshmd_cluster *cl, struct link *l, struct stage_buf **sb_out);
/* Copies the chunk a Stage message names from seg into its slot and
 * answers Staged (request_id rid) when the bytes are in host memory.
 * Errors (nothing sent): -EINVAL range or slot, -ENOTSUP, -EIO. */
int gshmd_stage_serve(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                      struct gshmd_segment *seg, const Gshm__Cluster__Stage *s);
/* Frees a staging buffer; accepts NULL. */
void gshmd_stage_free(struct gshmd_cluster *cl, struct stage_buf *sb);
/* Ends the staging machinery (copy thread, streams); accepts a cluster
 * that never staged. */
void gshmd_stage_destroy(struct gshmd_cluster *cl);

#endif
