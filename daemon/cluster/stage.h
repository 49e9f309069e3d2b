/* SPDX-License-Identifier: Apache-2.0 */
/* Staging through pinned host memory (docs/CLUSTER.md "Device memory"):
 * host buffers (registered with UCX while a grant or pull over UCX holds
 * them), kept in a small pool between pulls,
 * and copies between a segment and host memory on libuv's thread pool.
 * Who uses the slots for what is serve.c's and pull.c's business. */
#ifndef GSHMD_CLUSTER_STAGE_H
#define GSHMD_CLUSTER_STAGE_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "arena.h"

struct gshmd_alloc;
struct gshmd_backend;

#define STAGE_POOL_KEEP 32    /* staging buffers kept for the next pulls (and at most
                               * STAGE_KEEP_FULL staging_bytes of them) */
/* Pinned bytes kept at most, in staging_bytes: what a node's pulls into
 * GPUs may hold at once (pull.h PULL_PINNED_FULL), so that the pulls of
 * a model after its first make none.  With 4, each later pull of a
 * 12.3 GiB model of 290 tensors into GPU 1 (2x H100) made its buffers of
 * the other shapes again: 40-42 buffers (3.6-3.9 GiB pinned, 0.85-1.17 s
 * on the loop, 22-64 ms a 128 MiB buffer) over 10 pulls, against 21-22
 * (0.26-0.34 s: the first pull's, both nodes) with 8 (docs/PERFORMANCE.md
 * "Whole-model sizes").  The price: up to 1 GiB (8 x 128 MiB) stays
 * pinned after a node's first pull into a GPU, until the cluster stops. */
#define STAGE_KEEP_FULL 8
#define STAGE_MAX_SLOTS 256   /* slots per staging buffer */
#define STAGE_MIN_SLOT_SIZE 4096ull      /* a slot is cluster.pull_chunk bytes: */
#define STAGE_MAX_SLOT_SIZE (1ull << 30) /* the option table's bounds */

/* Whether a peer's staged grant (slots of slot_size bytes within length
 * bytes) is one a gshmd's staging could have made.  The puller sizes its
 * slot table by slots: a peer's word alone must not (2^26 slots took
 * 256 MiB). */
static inline bool gshmd_stage_grant_ok(uint64_t slots, uint64_t slot_size, uint64_t length) {
  return slots >= 1 && slots <= STAGE_MAX_SLOTS && slot_size >= STAGE_MIN_SLOT_SIZE &&
         slot_size <= STAGE_MAX_SLOT_SIZE && slots * slot_size <= length;
}

/* Host slots: page-locked (the CUDA backend's host_alloc) when there is
 * one, else plain pages; registered with UCX only while a grant or pull
 * whose bytes go over UCX holds them. */
struct stage_buf {
  void *addr;
  uint64_t len;
  uint32_t slots;
  uint64_t slot_size;
  bool pinned;
  bool carved;         /* slots of the pool's arena (sp->arena): given back to it, never freed */
  ucp_mem_h memh;      /* NULL: not registered */
};

/* The pool's arena: one region of pinned host memory (cluster.staging_arena
 * bytes) made on libuv's pool when the cluster starts, from which staging
 * buffers of any shape are carved (best fit, common/arena.h) while it has
 * room; others are made (or taken from the kept ones) as before.  A node's
 * first staged pull otherwise pinned each buffer of a new shape as it went
 * (22 buffers, 0.26-0.34 s of a 12.3 GiB model's first pull into a GPU on
 * 2x H100: docs/PERFORMANCE.md "Whole-model sizes"). */
struct stage_arena {
  uint8_t *base;              /* NULL until made (or never: 0 bytes, or its making failed) */
  uint64_t len;               /* bytes asked for (4 KiB multiple) */
  bool pinned;                /* by the backend's host_alloc (else plain pages) */
  bool making;                /* its job is on libuv's pool */
  struct gshm__arena carve;   /* offsets handed out */
  uint64_t carves;            /* buffers carved since start, for the metrics */
};

/* Buffers made or freed on libuv's pool at once (stage.c): pinning
 * 128 MiB took 22-64 ms on the lent 2x H100 machine, on the loop until
 * it went to the pool; two at a time leave the pool's other threads to
 * the copies, and bound the pinned bytes no grant counts (a buffer being
 * freed, or made for a grant that went meanwhile). */
#define STAGE_JOBS 2

struct stage_job;

/* The staging state of one gshmd. */
struct stage_pool {
  uv_loop_t *loop;
  ucp_context_h ctx;
  struct gshmd_backend *pin;  /* backend that pins host memory, or NULL */
  uint64_t staging_bytes;     /* cluster.staging_bytes: one buffer */
  bool stopping;              /* buffers given back are freed, not kept */
  unsigned registered;        /* buffers registered with UCX now */
  struct stage_buf *kept[STAGE_POOL_KEEP];
  unsigned nkept;
  uint64_t kept_bytes;        /* of the kept buffers */
  uint64_t made;              /* buffers made (not taken from the kept ones), for the metrics */
  struct stage_arena arena;
  /* jobs waiting for the pool, oldest first: frees go before makes */
  struct stage_job *frees, **frees_tail, *makes, **makes_tail;
  unsigned running;           /* jobs on the pool now (at most STAGE_JOBS) */
  unsigned delay_ms;          /* tests: each make and free takes this much longer */
};

/* Sets up sp (pin: the backend whose ->host_alloc pins host memory, or
 * NULL for plain pages).  GSHMD_TEST_STAGE_DELAY_MS in the environment
 * (tests only: 0 to 10000) makes each buffer's making and freeing that
 * many milliseconds slower, as pinning is on a GPU machine. */
void gshmd_stage_pool_init(struct stage_pool *sp, uv_loop_t *loop, ucp_context_h ctx,
                           uint64_t staging_bytes, struct gshmd_backend *pin);

/* Starts making sp's arena of arena_bytes (0: none; rounded up to 4 KiB)
 * on libuv's pool: pinned by sp->pin, or plain pages without one.  Until
 * it is made, and where its making fails (logged once: -ENOMEM or the
 * driver's refusal), buffers are made as without an arena.  Call once,
 * after gshmd_stage_pool_init. */
void gshmd_stage_arena_start(struct stage_pool *sp, uint64_t arena_bytes);

/* Slots of slot_size bytes for a segment of seg_bytes (> 0): as many as
 * it takes, rounded up to a power of two (so that buffers are kept and
 * taken again by a few sizes), at most sp->staging_bytes of them (at
 * least one, at most STAGE_MAX_SLOTS); registered with UCX when ucx (the
 * bytes go over UCX; for gshm's TCP stream nothing is registered).  A
 * set of small tensors thus holds a slot or two each where every grant
 * held staging_bytes.
 *
 * Slots carved from the arena where it has room, else a kept buffer of
 * that shape when there is one: returns 0 with it in *sb_out (the
 * caller's, until gshmd_stage_free), and ready is never called.  Else
 * the buffer is made on libuv's pool (pinning costs tens
 * of milliseconds: never on the loop), STAGE_JOBS at a time, in the
 * order asked: returns 1 with the job in *job_out, and ready(arg, err,
 * sb) runs once on the loop later: err 0 with the buffer (the caller's),
 * or -ENOMEM, -EIO, -ECANCELED (gshmd_stage_job_cancel, or the cluster
 * stops) with sb NULL.  *job_out is valid until ready runs.  The caller
 * counts the buffer's bytes (gshmd_stage_buf_len) against its caps
 * before asking.  Errors (nothing queued): -ENOMEM, -EIO. */
typedef void (*stage_ready_fn)(void *arg, int err, struct stage_buf *sb);
int gshmd_stage_buf_get(struct stage_pool *sp, uint64_t slot_size, uint64_t seg_bytes, bool ucx,
                        stage_ready_fn ready, void *arg, struct stage_buf **sb_out,
                        struct stage_job **job_out);
/* The buffer of job j (before its ready ran) is no longer wanted: one
 * not yet started is not made; ready still runs, with -ECANCELED. */
void gshmd_stage_job_cancel(struct stage_job *j);
/* The length of the buffer gshmd_stage_buf_get would give (bytes), for
 * budgets checked before making it. */
uint64_t gshmd_stage_buf_len(const struct stage_pool *sp, uint64_t slot_size, uint64_t seg_bytes);
/* Gives a staging buffer back: deregistered (UCX holds no slots that no
 * grant or pull uses); a buffer carved from the arena goes back to it;
 * another is kept for the next staged pull (pinning 64 MiB
 * costs tens of milliseconds, more than a small pull), or freed when
 * STAGE_POOL_KEEP wait already or the kept ones would pass
 * STAGE_KEEP_FULL times staging_bytes (on libuv's pool, before any
 * buffer is made there), or the cluster stops (at once).  Accepts NULL. */
void gshmd_stage_free(struct stage_pool *sp, struct stage_buf *sb);
/* The pool's metrics (Prometheus text) to f: buffers made since start,
 * bytes kept now, the arena's bytes, bytes carved now and carves since
 * start. */
void gshmd_stage_metrics(const struct stage_pool *sp, FILE *f);
/* Frees the kept buffers, and the arena once nothing carved from it is
 * held (else when the last carve comes back: gshmd_stage_free), at the
 * cluster's stop; again at its destroy, when nothing is held. */
void gshmd_stage_pool_drain(struct stage_pool *sp);

/* One copy between a segment and host memory, on libuv's thread pool.
 * host_map: the segment's mapping in gshmd for a host segment (NULL for
 * a device segment, copied by its backend).  done runs on the loop with
 * err 0 or a negative errno. */
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
/* Queues the copy.  Returns 0 or -ENOMEM (done not called). */
int gshmd_stage_copy(struct stage_pool *sp, struct stage_copy *sc);

#endif
