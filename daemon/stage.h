/* SPDX-License-Identifier: Apache-2.0 */
/* Staging through pinned host memory (docs/CLUSTER.md "Device memory"):
 * the serving side copies chunks of a segment into host slots that the
 * reader gets, the reading side copies the slots it got into its device
 * segment.  The copies run on libuv's thread pool. */
#ifndef GSHMD_STAGE_H
#define GSHMD_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster_internal.h"

struct gshmd_segment;
struct gshmd_alloc;

/* Host slots registered with UCX: page-locked (cuMemAllocHost) when the
 * CUDA backend is there, else plain pages. */
struct stage_buf {
  void *addr;
  uint64_t len;
  uint32_t slots;
  uint64_t slot_size;
  bool pinned;
  ucp_mem_h memh;
  void *rkey;          /* packed, when made for peers */
  size_t rkey_len;
};

/* One grant being served: its data sends (and copies) in flight, and for
 * a staged grant its slots. */
struct stage_grant {
  uint64_t grant_id;
  struct stage_buf *sb;  /* NULL: not staged */
  unsigned busy;         /* copies into its slots running */
  bool released;         /* Release came while busy: ends when the copies do */
  struct gshm_list node; /* link->staged */
};

/* cluster.staging_bytes in slots of slot_size bytes (at least one),
 * registered; with_rkey packs its rkey for a peer.  A kept buffer of the
 * same slot size and kind when there is one.  Errors: -ENOMEM, -EIO. */
int gshmd_stage_buf_new(struct gshmd_cluster *cl, uint64_t slot_size, bool with_rkey,
                        struct stage_buf **sb_out);
/* Gives a staging buffer back: kept for the next staged pull (pinning
 * and registering 64 MiB costs tens of milliseconds, more than a small
 * pull), or freed when four wait already or the cluster stops.  Accepts
 * NULL. */
void gshmd_stage_free(struct gshmd_cluster *cl, struct stage_buf *sb);
/* Frees the kept buffers (cluster stop). */
void gshmd_stage_pool_drain(struct gshmd_cluster *cl);

/* One copy between a segment and host memory, on libuv's thread pool.
 * host_map: the segment's mapping in gshmd for a host segment (NULL for
 * a device segment, copied by its backend).  done runs on the loop with
 * err 0 or a negative errno.  Returns 0 or -ENOMEM (done not called). */
struct stage_copy;
typedef void (*stage_done_fn)(struct stage_copy *sc, int err);
struct stage_copy {
  uv_work_t work;
  struct gshmd_alloc *mem;
  uint8_t *host_map;
  uint64_t offset, len;
  void *host;
  bool to_segment;
  int err;
  stage_done_fn done;
  void *arg;
};
int gshmd_stage_copy(struct gshmd_cluster *cl, struct stage_copy *sc);

/* Serving: the record of a grant on link l (made at grant time, freed at
 * release or when the link ends); staged: with its slots.  Errors:
 * -EBUSY too many staged grants on this link, -ENOMEM, as
 * gshmd_stage_buf_new. */
int gshmd_stage_grant_new(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id,
                          bool staged, struct stage_grant **g_out);
/* The grant record of l, NULL when none (or released). */
struct stage_grant *gshmd_stage_grant_find(struct link *l, uint64_t grant_id);
/* One send or copy of the grant ended: a Release that came meanwhile
 * takes effect with the last. */
void gshmd_stage_grant_unbusy(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id);
/* Release of a grant: ends it now, or when its copies finish.  Returns
 * true when the grant ended now (or was not staged): the caller closes
 * its lease; false: stage.c closes it later. */
bool gshmd_stage_grant_release(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id);
/* Frees every staged grant of l (the link ended, no copy running). */
void gshmd_stage_link_end(struct gshmd_cluster *cl, struct link *l);
/* Copies the chunk a Stage message names from seg into its slot and
 * sends them from there as the data message answering request rid.
 * Errors (nothing sent): -ESTALE no such staged grant, -EINVAL range or
 * slot, -ENOMEM. */
int gshmd_stage_serve(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                      struct gshmd_segment *seg, const Gshm__Cluster__Stage *s);

#endif
