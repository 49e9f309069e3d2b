/* SPDX-License-Identifier: Apache-2.0 */
/* gshm_broadcast: one buffer to several GPUs with copy-engine copies,
 * pipelined in chunks and ordered by events (gshm.h documents the API).
 *
 * A broadcast is a plan: the buffer is cut into parts, and each part has a
 * tree over the nodes (node 0 is the source, node 1 + i is dsts[i]) given
 * by parent[]; every part is cut into chunks.  For each chunk of each part
 * and each destination node, one cuMemcpyAsync copies the chunk from the
 * node's parent; it is issued on the stream that libgshm keeps for the
 * caller's stream, the ordered pair (issuing GPU, other GPU) and lane
 * (chunk index modulo the lanes; struct bset), where the issuing GPU is the sender's (a push, the default) or
 * the receiver's (a pull).  A copy out of a node that is itself a
 * destination waits for the event recorded after the copy into it.  The three algorithms are three shapes of plan:
 *
 *   STAR   1 part, every parent is the source, 1 chunk.
 *   CHAIN  1 part, parent of dsts[i] is dsts[i-1] (dsts[0]'s the source).
 *   SPLIT  n parts; in part i, dsts[i]'s parent is the source and every
 *          other destination's parent is dsts[i].  The source sends each
 *          byte once, every destination receives each byte once, and a
 *          destination sends (n-1)/n of the bytes, so on paper it needs
 *          bytes / link rate plus one chunk of fill; measured, it is
 *          slower than CHAIN behind NVSwitch (docs/PERFORMANCE.md "AUTO
 *          thresholds").
 *
 * Chunks are queued chunk-major (chunk 0 of every part and node, then chunk
 * 1, ...) so that every stream has work from the start.  That order also
 * lets one event per (part, node) serve all chunks: the copies that wait for
 * chunk c of a node are queued before the node's event is recorded again
 * for chunk c + 1, and cuStreamWaitEvent waits for the record that was the
 * latest when it was called (CUDA driver API, cuStreamWaitEvent).
 *
 * Streams and events belong to the GPUs' primary contexts, created on first
 * use; events are kept for the life of the process (like the primary
 * contexts, which gshm__copy_primary_ctx retains), streams as long as
 * their caller stream's set (struct bset); one lock (common/fork.h
 * GSHM__LOCK_BROADCAST) covers a whole queueing, so the pools need no
 * finer locking.  The event that orders the streams after the caller's is
 * the caller context's (gshm__copy_ctx_event), and peer access is what
 * gshm__copy_enable_peer caches per context.
 *
 * A fork waits for a queueing to end.  The child of a process that
 * broadcast has the parent's streams and events here, which it cannot use
 * (CUDA does not survive fork): its broadcasts end with -ECHILD at the
 * driver's load, before they look at them. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "copy_internal.h"
#include "cudadrv.h"
#include "fork.h"
#include "gshm.h"
#include "log.h"

#define MAX_DSTS 64
#define MAX_GPUS 64
#define CHUNK_ALIGN ((size_t)64 << 10)

/* AUTO's chunk: sqrt(bytes * AUTO_T0_BYTES / (n - 1)); AUTO's STAR: while
 * the source sends at most AUTO_STAR_MAX_TOTAL in all (n * bytes).  Why
 * these values: docs/PERFORMANCE.md "AUTO thresholds". */
#define AUTO_T0_BYTES ((size_t)2 << 20)
#define AUTO_STAR_MAX_TOTAL ((size_t)12 << 20)
#define MAX_CHUNK ((size_t)64 << 20)
/* More than any memory: below it n * bytes, a chunk rounded up and a part
 * plus a chunk cannot wrap (MAX_DSTS * 2^58 < 2^64). */
#define TOO_MANY_BYTES ((size_t)1 << 58)

struct bgpu {
  CUcontext ctx;            /* primary, retained by gshm__copy_primary_ctx */
  unsigned long long ctx_id; /* its cuCtxGetId when the pools were made (0: unknown) */
  CUevent *ev;              /* pool, in ctx */
  int nev, used;            /* created, handed out in this broadcast */
  uint64_t used_mask[GSHM_BCAST_MAX_LANES]; /* the set's [lane][other] used in this broadcast */
};

static struct bgpu bgpus[MAX_GPUS]; /* under GSHM__LOCK_BROADCAST */

/* The pair streams of one caller stream: broadcasts queued on one caller
 * stream share them, those of different caller streams never do.  Sharing
 * adds no order between the broadcasts of one caller stream (each already
 * waits for the caller's earlier work, the caller's stream for each), and
 * none between those of different callers: two independent broadcasts
 * (other threads, other streams) run side by side, and no broadcast's
 * copies wait behind another's.  MAX_SETS are kept; a caller stream
 * beyond them takes the set used least recently, whose streams are
 * destroyed (their queued work still runs: cuStreamDestroy) and made
 * afresh.  32: an engine's streams or a thread pool's per-thread streams
 * in rotation (8 kept made every call of 9 or more callers create its
 * pair streams again); a set's streams are made only for the pairs it
 * uses, so an unused set costs its slot here. */
#define MAX_SETS 32
struct bset {
  CUcontext caller_ctx; /* NULL: unused (the legacy stream NULL is one per context) */
  CUstream caller;
  pthread_t thread;     /* caller CU_STREAM_PER_THREAD: whose (one handle, a stream per thread) */
  uint64_t last; /* bset_clock at its last use */
  CUstream *stream[MAX_GPUS]; /* [g]: NULL, or [lane * MAX_GPUS + other]: copies g issues */
};

static struct bset bsets[MAX_SETS]; /* under GSHM__LOCK_BROADCAST */
static uint64_t bset_clock;

/* Destroys set s's streams of GPU g (live: made in bgpus[g].ctx, which
 * has not been reset since) and forgets them. */
static void set_drop_gpu(const struct gshm_cudadrv *drv, struct bset *s, int g) {
  CUcontext ignored;

  if (!s->stream[g])
    return;
  if (drv->cuCtxPushCurrent(bgpus[g].ctx) == CUDA_SUCCESS) {
    for (int i = 0; i < GSHM_BCAST_MAX_LANES * MAX_GPUS; i++)
      if (s->stream[g][i])
        (void)GSHM_CU(drv, GSHM_LOG_WARNING, cuStreamDestroy, s->stream[g][i]);
    drv->cuCtxPopCurrent(&ignored);
  }
  free(s->stream[g]);
  s->stream[g] = NULL;
}

/* The set of the caller's stream `caller` in context caller_ctx: its own,
 * a free one, or the least recently used one emptied.  Under the
 * broadcast lock, after the reset check (every stream left is live). */
static struct bset *set_for(const struct gshm_cudadrv *drv, CUcontext caller_ctx,
                            CUstream caller) {
  struct bset *s = NULL;

  /* CU_STREAM_PER_THREAD is one handle that names each thread's own
   * stream: two threads' broadcasts on it are independent, as on two
   * streams (the legacy NULL stream is one stream of the context) */
  bool per_thread = caller == CU_STREAM_PER_THREAD;
  pthread_t me = pthread_self();

  for (int i = 0; i < MAX_SETS && !s; i++)
    if (bsets[i].caller_ctx == caller_ctx && bsets[i].caller == caller &&
        (!per_thread || pthread_equal(bsets[i].thread, me)))
      s = &bsets[i];
  for (int i = 0; i < MAX_SETS && !s; i++)
    if (!bsets[i].caller_ctx)
      s = &bsets[i];
  if (!s) {
    s = &bsets[0];
    for (int i = 1; i < MAX_SETS; i++)
      if (bsets[i].last < s->last)
        s = &bsets[i];
    for (int g = 0; g < MAX_GPUS; g++)
      set_drop_gpu(drv, s, g);
  }
  s->caller_ctx = caller_ctx;
  s->caller = caller;
  s->thread = me;
  s->last = ++bset_clock;
  return s;
}

/* Stream `lane` of set s on which GPU g issues copies to or from GPU
 * `other` (g == other: a copy within g).  Under the broadcast lock. */
static int pair_stream(const struct gshm_cudadrv *drv, struct bset *set, int g, int other,
                       int lane, CUstream *out) {
  struct bgpu *b = &bgpus[g];
  CUstream *slot;
  int e;

  if (!b->ctx && (e = gshm__copy_primary_ctx(drv, g, &b->ctx)))
    return e;
  if (!b->ctx_id && drv->cuCtxGetId && drv->cuCtxGetId(b->ctx, &b->ctx_id) != CUDA_SUCCESS)
    b->ctx_id = 0;
  if (!set->stream[g] &&
      !(set->stream[g] = calloc(GSHM_BCAST_MAX_LANES * MAX_GPUS, sizeof(CUstream))))
    return -ENOMEM;
  slot = &set->stream[g][lane * MAX_GPUS + other];
  if (!*slot) {
    if ((e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxPushCurrent, b->ctx)))
      return e;
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuStreamCreate, slot, CU_STREAM_NON_BLOCKING);
    {
      CUcontext ignored;
      drv->cuCtxPopCurrent(&ignored);
    }
    if (e) {
      if (*slot)
        drv->cuStreamDestroy(*slot);
      *slot = NULL;
      return e;
    }
  }
  *out = *slot;
  return 0;
}

/* Peer access from GPU `me` (current) for a copy engine copy of len bytes
 * from ws to wd, so that it goes over NVLink directly: to the GPU of
 * either that is not `me`'s nor a gshm mapping `me` reaches (which needs
 * none: enabling it would retain, and so make, a primary context on that
 * GPU, hundreds of MiB, or fail where another process owns it).  Best
 * effort: without peer access (none between the two GPUs) the driver
 * copies through the host, slower; before, such a broadcast failed
 * -EXDEV where its copies would have worked. */
static void peer_for_ce(int me, const struct gshm__where *ws, const struct gshm__where *wd,
                        size_t len) {
  if (ws->device && ws->ordinal != me && gshm__copy_reach(ws, len, me, 0) == 0)
    (void)gshm__copy_enable_peer(ws->ordinal);
  if (wd->device && wd->ordinal != me && gshm__copy_reach(wd, len, me, 1) == 0)
    (void)gshm__copy_enable_peer(wd->ordinal);
}

/* A fresh event of GPU g's pool for this broadcast.  Under the broadcast
 * lock. */
static int pool_event(const struct gshm_cudadrv *drv, int g, CUevent *out) {
  struct bgpu *b = &bgpus[g];
  int e = 0;

  if (b->used == b->nev) {
    CUevent *grown = realloc(b->ev, sizeof(*grown) * (size_t)(b->nev + 8));
    CUcontext ignored;

    if (!grown)
      return -ENOMEM;
    b->ev = grown;
    if ((e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxPushCurrent, b->ctx)))
      return e;
    for (int i = 0; i < 8 && !e; i++) {
      e = GSHM_CU(drv, GSHM_LOG_ERR, cuEventCreate, &b->ev[b->nev], CU_EVENT_DISABLE_TIMING);
      if (!e)
        b->nev++;
    }
    drv->cuCtxPopCurrent(&ignored);
    if (e && b->used == b->nev)
      return e;
  }
  *out = b->ev[b->used++];
  return 0;
}

/* The plan (see the top of this file). */
struct plan {
  int n;                      /* destinations */
  int nparts;
  size_t part_off[MAX_DSTS], part_len[MAX_DSTS];
  unsigned char parent[MAX_DSTS][MAX_DSTS + 1]; /* [part][node] */
  unsigned char order[MAX_DSTS][MAX_DSTS];      /* [part][k]: nodes, parents first */
  unsigned char has_children[MAX_DSTS][MAX_DSTS + 1];
  size_t chunk;
};

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* floor(sqrt(x)), Newton's method on integers (no libm in libgshm). */
static uint64_t isqrt(uint64_t x) {
  uint64_t r = x, y = (x + 1) / 2;

  if (x < 2)
    return x;
  while (y < r) {
    r = y;
    y = (r + x / r) / 2;
  }
  return r;
}

/* AUTO's chunk for `bytes` to n GPUs, in [CHUNK_ALIGN, MAX_CHUNK]; from 8
 * TiB per hop up the product would wrap (bytes may be 2^58): its root is
 * far above MAX_CHUNK there, so MAX_CHUNK. */
static size_t auto_chunk(size_t bytes, int n) {
  uint64_t per = n > 1 ? (uint64_t)bytes / (uint64_t)(n - 1) : 0;
  size_t c = n <= 1                            ? bytes
             : per > UINT64_MAX / AUTO_T0_BYTES ? MAX_CHUNK
                                               : (size_t)isqrt(per * AUTO_T0_BYTES);
  return c < CHUNK_ALIGN ? CHUNK_ALIGN : c > MAX_CHUNK ? MAX_CHUNK : c;
}

static void make_plan(struct plan *p, gshm_broadcast_algo_t algo, int n, size_t bytes,
                      size_t chunk) {
  memset(p, 0, sizeof(*p));
  p->n = n;
  p->chunk = chunk;
  if (algo == GSHM_BCAST_SPLIT && n > 1) {
    /* parts of equal length, cut at CHUNK_ALIGN where the size allows */
    size_t per = round_up((bytes + (size_t)n - 1) / (size_t)n, bytes >= (size_t)n * CHUNK_ALIGN
                                                                   ? CHUNK_ALIGN
                                                                   : 1);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
      size_t len = off >= bytes ? 0 : bytes - off < per ? bytes - off : per;
      int k = 0;
      p->part_off[p->nparts] = off;
      p->part_len[p->nparts] = len;
      off += len;
      p->parent[p->nparts][1 + i] = 0;
      p->order[p->nparts][k++] = (unsigned char)(1 + i);
      for (int j = 0; j < n; j++)
        if (j != i) {
          p->parent[p->nparts][1 + j] = (unsigned char)(1 + i);
          p->order[p->nparts][k++] = (unsigned char)(1 + j);
        }
      p->has_children[p->nparts][1 + i] = 1;
      p->nparts++;
    }
    return;
  }
  p->nparts = 1;
  p->part_len[0] = bytes;
  for (int i = 0; i < n; i++) {
    p->order[0][i] = (unsigned char)(1 + i);
    if (algo == GSHM_BCAST_CHAIN && i > 0) {
      p->parent[0][1 + i] = (unsigned char)i;
      p->has_children[0][i] = 1;
    } else {
      p->parent[0][1 + i] = 0;
    }
  }
  if (algo == GSHM_BCAST_STAR || n == 1)
    p->chunk = bytes; /* nothing to pipeline */
}

/* The buffers and streams of one broadcast, for run_plan. */
struct run_params {
  const void *src;
  void *const *dsts;                 /* the plan's n destinations */
  const struct gshm__where *where;   /* [node]: 0 the source, 1 + i dsts[i] */
  CUcontext caller;                  /* the caller's context, current on entry */
  CUstream stream;                   /* the caller's stream */
  CUevent start;                     /* recorded on stream before the call */
  int push;                          /* 1: the sending GPU issues each copy, 0: the receiver */
  int lanes;                         /* streams per GPU pair, 1..GSHM_BCAST_MAX_LANES */
  int ce_only;                       /* 1: cuMemcpyAsync; 0: gshm_copy AUTO (STAR) */
};

/* Before a broadcast's queueing: no event handed out, no stream used, and
 * a GPU whose primary context was reset (cudaDeviceReset) since its
 * streams and events were made has them forgotten (they went with it; new
 * ones are made in the context there is now).  Under the broadcast lock. */
static void pools_refresh(const struct gshm_cudadrv *drv) {
  for (int g = 0; g < MAX_GPUS; g++) {
    struct bgpu *b = &bgpus[g];
    unsigned long long id = 0;
    CUcontext now;
    b->used = 0;
    memset(b->used_mask, 0, sizeof(b->used_mask));
    if (!b->ctx || !drv->cuCtxGetId || gshm__copy_primary_ctx(drv, g, &now))
      continue;
    if (now != b->ctx || drv->cuCtxGetId(now, &id) != CUDA_SUCCESS || id != b->ctx_id) {
      free(b->ev);
      for (int i = 0; i < MAX_SETS; i++) {
        free(bsets[i].stream[g]);
        bsets[i].stream[g] = NULL;
      }
      b->ev = NULL;
      b->nev = 0;
      b->ctx = now;
      b->ctx_id = id;
    }
  }
}

/* The caller's `stream` (in context `caller`) waits for the end of every
 * stream of set s this broadcast used.  Returns the first error. */
static int join(const struct gshm_cudadrv *drv, const struct bset *s, CUcontext caller,
                CUstream stream) {
  int e = 0;

  for (int g = 0; g < MAX_GPUS; g++)
    for (int i = 0; i < GSHM_BCAST_MAX_LANES * MAX_GPUS; i++) {
      int lane = i / MAX_GPUS, other = i % MAX_GPUS;
      CUevent end;
      int e2;

      if (!(bgpus[g].used_mask[lane] >> other & 1))
        continue;
      if ((e2 = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxSetCurrent, bgpus[g].ctx)) ||
          (e2 = pool_event(drv, g, &end)) ||
          (e2 = GSHM_CU(drv, GSHM_LOG_ERR, cuEventRecord, end, s->stream[g][i])) ||
          (e2 = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxSetCurrent, caller)) ||
          (e2 = GSHM_CU(drv, GSHM_LOG_ERR, cuStreamWaitEvent, stream, end, 0)))
        e = e ? e : e2;
    }
  return e;
}

/* Queues the plan.  Under the broadcast lock; r->start has been recorded
 * on the caller's r->stream in context r->caller.  Before returning, also
 * on error (so that what was queued stays ordered before the caller's
 * later work), the caller's stream is made to wait for the end of every
 * stream used; the caller's context is current again on return. */
static int run_plan(const struct gshm_cudadrv *drv, const struct plan *p,
                    const struct run_params *r) {
  const struct gshm__where *where = r->where;
  CUevent start = r->start;
  int push = r->push, lanes = r->lanes, ce_only = r->ce_only;
  const char *node_addr[MAX_DSTS + 1];
  CUevent node_ev[MAX_DSTS][MAX_DSTS + 1];
  struct bset *set;
  size_t nchunks = 0;
  int e = 0, e2;

  memset(node_ev, 0, sizeof(node_ev));
  node_addr[0] = r->src;
  for (int i = 0; i < p->n; i++)
    node_addr[1 + i] = r->dsts[i];
  for (int q = 0; q < p->nparts; q++) {
    size_t c = (p->part_len[q] + p->chunk - 1) / p->chunk;
    if (c > nchunks)
      nchunks = c;
  }
  pools_refresh(drv);
  set = set_for(drv, r->caller, r->stream);

  for (size_t c = 0; c < nchunks && !e; c++) {
    for (int q = 0; q < p->nparts && !e; q++) {
      size_t off = c * p->chunk, len;
      if (off >= p->part_len[q])
        continue; /* a short part, or an empty one (bytes < n) */
      len = p->part_len[q] - off < p->chunk ? p->part_len[q] - off : p->chunk;
      off += p->part_off[q];
      for (int k = 0; k < p->n && !e; k++) {
        int node = p->order[q][k], par = p->parent[q][node];
        int from = where[par].ordinal, to = where[node].ordinal;
        int issuer = push ? from : to, other = push ? to : from;
        CUstream s;
        int lane = (int)(c % (size_t)lanes);

        if ((e = pair_stream(drv, set, issuer, other, lane, &s)))
          break;
        if ((e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxSetCurrent, bgpus[issuer].ctx)))
          break;
        if (!(bgpus[issuer].used_mask[lane] >> other & 1)) {
          /* first use in this broadcast: after the caller's earlier work */
          if ((e = GSHM_CU(drv, GSHM_LOG_ERR, cuStreamWaitEvent, s, start, 0)))
            break;
          bgpus[issuer].used_mask[lane] |= 1ull << other;
        }
        if (par != 0 &&
            (e = GSHM_CU(drv, GSHM_LOG_ERR, cuStreamWaitEvent, s, node_ev[q][par], 0)))
          break;
        if (ce_only) {
          if (other != issuer)
            peer_for_ce(issuer, &where[par], &where[node], len);
          e = GSHM_CU(drv, GSHM_LOG_ERR, cuMemcpyAsync,
                      (CUdeviceptr)(uintptr_t)(node_addr[node] + off),
                      (CUdeviceptr)(uintptr_t)(node_addr[par] + off), len, s);
        } else {
          /* STAR: gshm_copy AUTO, SM kernels where they are faster */
          e = gshm__copy_in_ctx(drv, (void *)(node_addr[node] + off), node_addr[par] + off, len,
                                GSHM_COPY_AUTO, s, &where[par], &where[node]);
        }
        if (e)
          break;
        if (p->has_children[q][node]) {
          if (!node_ev[q][node] && (e = pool_event(drv, issuer, &node_ev[q][node])))
            break;
          e = GSHM_CU(drv, GSHM_LOG_ERR, cuEventRecord, node_ev[q][node], s);
        }
      }
    }
  }

  if ((e2 = join(drv, set, r->caller, r->stream)))
    e = e ? e : e2;
  drv->cuCtxSetCurrent(r->caller);
  return e;
}

/* Whether every copy of plan p may run where it is issued: the issuing
 * GPU (the sender when push, else the receiver) reads the parent's buffer
 * and writes the child's, and cuMem memory it has no access to would
 * fault there (gshm__copy_reach, asked in each issuing GPU's primary
 * context, which the broadcast's streams belong to: the access flags of
 * memory gshm_map did not map are the current context's GPU's).  0,
 * -EXDEV or -EACCES before anything is queued, or the errors of making
 * an issuer's primary context current. */
static int plan_reach(const struct gshm_cudadrv *drv, const struct plan *p,
                      const struct gshm__where *where, int push, size_t bytes) {
  uint64_t issuers = 0;
  int e = 0;

  for (int q = 0; q < p->nparts; q++)
    for (int k = 0; k < p->n; k++) {
      int node = p->order[q][k];
      issuers |= 1ull << (push ? where[p->parent[q][node]].ordinal : where[node].ordinal);
    }
  for (int g = 0; g < MAX_GPUS && !e; g++) {
    CUcontext ctx, ignored;

    if (!(issuers >> g & 1))
      continue;
    if ((e = gshm__copy_primary_ctx(drv, g, &ctx)) ||
        (e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxPushCurrent, ctx)))
      break;
    for (int q = 0; q < p->nparts && !e; q++)
      for (int k = 0; k < p->n && !e; k++) {
        int node = p->order[q][k], par = p->parent[q][node];
        if ((push ? where[par].ordinal : where[node].ordinal) != g)
          continue;
        if ((e = gshm__copy_reach(&where[par], bytes, g, 0)) >= 0)
          e = gshm__copy_reach(&where[node], bytes, g, 1);
        e = e < 0 ? e : 0;
      }
    drv->cuCtxPopCurrent(&ignored);
  }
  return e;
}

/* Whether `stream` is being captured into a CUDA graph (the legacy
 * stream, NULL, cannot be). */
static bool capturing(const struct gshm_cudadrv *drv, CUstream stream) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;

  return stream && drv->cuStreamIsCapturing(stream, &st) == CUDA_SUCCESS &&
         st != CU_STREAM_CAPTURE_STATUS_NONE;
}

GSHM_EXTERN int gshm_broadcast_ex(const void *src, void *const dsts[], int n, size_t bytes,
                                  void *stream, const gshm_broadcast_opts_t *opts) {
  const struct gshm_cudadrv *drv;
  gshm_broadcast_opts_t o = {GSHM_BCAST_AUTO, 0, 0, 0};
  struct gshm__where where[MAX_DSTS + 1]; /* [node]: 0 the source, 1 + i dsts[i] */
  int all_device = 1, pushed = 0, e;
  CUcontext caller = NULL;
  CUevent start;
  struct plan *p;

  if (opts)
    o = *opts;
  if (!src || !dsts || n < 1 || n > MAX_DSTS || (unsigned)o.algo > GSHM_BCAST_SPLIT ||
      o.lanes < 0 || o.lanes > GSHM_BCAST_MAX_LANES)
    return -EINVAL;
  for (int i = 0; i < n; i++)
    if (!dsts[i])
      return -EINVAL;
  if (!bytes)
    return 0;
  if (bytes >= TOO_MANY_BYTES)
    return -EINVAL; /* no memory is that large; the plan's arithmetic would wrap */
  if ((e = gshm__cudadrv_load(GSHM_LOG_ERR, &drv)))
    return e;
  gshm__copy_where(drv, src, &where[0]);
  if (!where[0].device || where[0].ordinal < 0 || where[0].ordinal >= MAX_GPUS)
    return -EINVAL;
  for (int i = 0; i < n; i++) {
    struct gshm__where *w = &where[1 + i];
    gshm__copy_where(drv, dsts[i], w);
    all_device &= w->device && w->ordinal >= 0 && w->ordinal < MAX_GPUS;
  }
  if (o.algo == GSHM_BCAST_AUTO)
    o.algo = !all_device || n == 1 || bytes * (size_t)n <= AUTO_STAR_MAX_TOTAL ? GSHM_BCAST_STAR
                                                                             : GSHM_BCAST_CHAIN;
  if (!all_device) {
    /* host memory somewhere: plain gshm_copy per destination, in order */
    if (o.algo != GSHM_BCAST_STAR)
      return -EINVAL;
    for (int i = 0; i < n && !e; i++)
      e = gshm_copy(dsts[i], src, bytes, GSHM_COPY_AUTO, stream);
    return e;
  }
  if (capturing(drv, (CUstream)stream)) {
    /* Into a graph: the caller's pair streams would join the capture and
     * stay in it until it ends, and their next use after it would queue
     * behind nodes of a graph rather than work (capture isolation keeps
     * other streams out meanwhile).  So one gshm_copy per destination on the caller's
     * stream: nodes of its graph alone. */
    for (int i = 0; i < n && !e; i++)
      e = gshm_copy(dsts[i], src, bytes, GSHM_COPY_AUTO, stream);
    return e;
  }
  /* a chunk beyond the buffer is the buffer (and cannot overflow below) */
  if (o.chunk_bytes > bytes)
    o.chunk_bytes = bytes;
  o.chunk_bytes = round_up(o.chunk_bytes ? o.chunk_bytes : auto_chunk(bytes, n), CHUNK_ALIGN);
  if (!o.lanes)
    o.lanes = 1;

  if (!(p = malloc(sizeof(*p))))
    return -ENOMEM;
  make_plan(p, o.algo, n, bytes, o.chunk_bytes);
  if ((e = plan_reach(drv, p, where, !o.pull, bytes))) {
    free(p);
    return e;
  }

  if ((e = gshm__copy_enter_ctx(drv, (CUstream)stream, where[0].ordinal, &pushed))) {
    free(p);
    return e;
  }
  drv->cuCtxGetCurrent(&caller);
  gshm__fork_lock(GSHM__LOCK_BROADCAST);
  e = gshm__copy_ctx_event(drv, &start);
  if (!e)
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuEventRecord, start, (CUstream)stream);
  if (!e) {
    struct run_params r = {.src = src,
                           .dsts = dsts,
                           .where = where,
                           .caller = caller,
                           .stream = (CUstream)stream,
                           .start = start,
                           .push = !o.pull,
                           .lanes = o.lanes,
                           .ce_only = o.algo != GSHM_BCAST_STAR};
    e = run_plan(drv, p, &r);
  }
  gshm__fork_unlock(GSHM__LOCK_BROADCAST);
  gshm__copy_leave_ctx(drv, pushed);
  free(p);
  return e;
}

GSHM_EXTERN int gshm_broadcast(const void *src, void *const dsts[], int n, size_t bytes,
                               void *stream) {
  return gshm_broadcast_ex(src, dsts, n, bytes, stream, NULL);
}
