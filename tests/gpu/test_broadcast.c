/* SPDX-License-Identifier: Apache-2.0 */
/* gshm_broadcast on real GPUs: every algorithm (AUTO, STAR, CHAIN, SPLIT),
 * pushed and pulled, with the default chunk and with 64 KiB chunks (many
 * pipeline steps) taken in turn by three lanes, on random data at sizes
 * and offsets that hit the edges (1 B, 4095 B, 1 MiB + 3 B, 256 MiB,
 * misaligned source and destinations), to
 * one destination on every other GPU and to destinations that share GPUs
 * (the source's included), with guard bytes around every destination.
 *
 * Ordering is part of what is checked: the source is written by an
 * asynchronous copy queued on the caller's stream just before the
 * broadcast (a broadcast that did not wait for it would copy old bytes),
 * and only the caller's stream is synchronized before the destinations are
 * read (one that did not join its internal streams back would be read
 * half-done; libgshm's streams are non-blocking, so nothing else orders
 * them).  Plus the argument errors.  Needs a GPU; exits 77 without one.
 * With one GPU (or GPUs that lack peer access to GPU 0) every destination
 * is on GPU 0, beside the source, and only the destinations on other GPUs
 * are skipped (it says so). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gshm.h"

#include "gpu_check.h"

#define MiB ((size_t)1 << 20)
#define GUARD 64
#define GUARD_BYTE 0x5A
#define MAX_GPUS 8
#define MAX_N 8
#define CAP (256 * MiB + 4096)

static const struct gshm_cudadrv *drv;
static int ngpus;
static int ndistinct; /* slots on distinct GPUs: one on each other GPU, or one on GPU 0 */
static CUcontext ctx[MAX_GPUS];
static CUstream stream[MAX_GPUS];
static CUdeviceptr src;          /* on GPU 0 */
static CUdeviceptr dbuf[MAX_N];  /* destination slots; slot_gpu[] says where */
static int slot_gpu[MAX_N];
static unsigned char *pinned;    /* source bytes, page-locked */
static unsigned char *back;

static const char *aname(gshm_broadcast_algo_t a) {
  static const char *const n[] = {"AUTO", "STAR", "CHAIN", "SPLIT"};
  return n[a];
}

/* Broadcasts n bytes from src + os to the slots listed in slots[0..nd-1]
 * (each at + GUARD + od) and checks every destination and its guards. */
static void one(const int *slots, int nd, size_t n, size_t os, size_t od,
                const gshm_broadcast_opts_t *o, int on, uint64_t seed) {
  void *dsts[MAX_N];
  int e;

  gpu_fill_random(pinned, n + os, seed);
  for (int i = 0; i < nd; i++) {
    CU(drv->cuCtxSetCurrent(ctx[slot_gpu[slots[i]]]));
    CU(drv->cuMemsetD8(dbuf[slots[i]], GUARD_BYTE, n + od + 2 * GUARD));
    CU(drv->cuCtxSynchronize());
    dsts[i] = (void *)(uintptr_t)(dbuf[slots[i]] + GUARD + od);
  }
  /* the source written on the caller's stream, right before the broadcast */
  CU(drv->cuCtxSetCurrent(ctx[on]));
  CU(drv->cuMemcpyAsync(src, (CUdeviceptr)(uintptr_t)pinned, n + os, stream[on]));
  e = gshm_broadcast_ex((const void *)(uintptr_t)(src + os), dsts, nd, n, stream[on], o);
  CHECK(e == 0, "broadcast %s pull %d chunk %zu, %d dsts, %zu B: %d (%s)", aname(o->algo),
        o->pull, o->chunk_bytes, nd, n, e, gshm_strerror(e));
  CU(drv->cuStreamSynchronize(stream[on]));
  for (int i = 0; i < nd; i++) {
    size_t bad = 0, guards = 0, first = (size_t)-1;
    CU(drv->cuCtxSetCurrent(ctx[slot_gpu[slots[i]]]));
    CU(drv->cuMemcpyDtoH(back, dbuf[slots[i]], n + od + 2 * GUARD));
    for (size_t k = 0; k < GUARD + od; k++)
      guards += back[k] != GUARD_BYTE;
    for (size_t k = 0; k < GUARD; k++)
      guards += back[GUARD + od + n + k] != GUARD_BYTE;
    for (size_t k = 0; k < n; k++)
      if (back[GUARD + od + k] != pinned[os + k] && !bad++)
        first = k;
    CHECK(!bad && !guards,
          "%s pull %d chunk %zu on GPU%d, %zu B src+%zu dst+%zu, dst %d (GPU%d) of %d: %zu bytes "
          "differ (first at %zu), %zu guard bytes overwritten",
          aname(o->algo), o->pull, o->chunk_bytes, on, n, os, od, i, slot_gpu[slots[i]], nd, bad,
          first, guards);
  }
}

static void errors(void) {
  void *d[2] = {(void *)(uintptr_t)dbuf[0], NULL};
  void *host = pinned;
  gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, 0, 0, 0};
  gshm_broadcast_opts_t bad = {(gshm_broadcast_algo_t)9, 0, 0, 0};
  gshm_broadcast_opts_t lanes = {GSHM_BCAST_CHAIN, 0, 0, GSHM_BCAST_MAX_LANES + 1};
  const void *s = (const void *)(uintptr_t)src;

  CU(drv->cuCtxSetCurrent(ctx[0]));
  CHECK(gshm_broadcast(s, d, 0, 16, stream[0]) == -EINVAL, "n = 0");
  CHECK(gshm_broadcast(s, d, 65, 16, stream[0]) == -EINVAL, "n = 65");
  CHECK(gshm_broadcast(s, d, 2, 16, stream[0]) == -EINVAL, "a NULL destination");
  CHECK(gshm_broadcast(NULL, d, 1, 16, stream[0]) == -EINVAL, "NULL source");
  CHECK(gshm_broadcast(s, NULL, 1, 16, stream[0]) == -EINVAL, "NULL dsts");
  CHECK(gshm_broadcast(pinned, d, 1, 16, stream[0]) == -EINVAL, "host source");
  CHECK(gshm_broadcast_ex(s, d, 1, 16, stream[0], &bad) == -EINVAL, "unknown algorithm");
  CHECK(gshm_broadcast_ex(s, &host, 1, 16, stream[0], &chain) == -EINVAL, "CHAIN to host");
  CHECK(gshm_broadcast_ex(s, d, 1, 16, stream[0], &lanes) == -EINVAL, "too many lanes");
  CHECK(gshm_broadcast(s, d, 1, 0, stream[0]) == 0, "0 bytes");
  /* more than any memory: refused, not a wrapped plan that copies nothing */
  CHECK(gshm_broadcast(s, d, 1, SIZE_MAX, stream[0]) == -EINVAL, "SIZE_MAX bytes");
  fprintf(stderr, "errors: done (%d failures so far)\n", failures);
}

/* AUTO with a page-locked host destination next to a device one. */
static void host_destination(void) {
  const size_t n = MiB + 3;
  unsigned char *h;
  void *d[2];

  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuMemAllocHost((void **)&h, n));
  memset(h, 0, n);
  gpu_fill_random(pinned, n, 77);
  CU(drv->cuMemcpyAsync(src, (CUdeviceptr)(uintptr_t)pinned, n, stream[0]));
  d[0] = h;
  d[1] = (void *)(uintptr_t)dbuf[0];
  CHECK(gshm_broadcast((const void *)(uintptr_t)src, d, 2, n, stream[0]) == 0, "host dst");
  CU(drv->cuStreamSynchronize(stream[0]));
  CHECK(!memcmp(h, pinned, n), "host destination differs");
  CU(drv->cuMemcpyDtoH(back, dbuf[0], n));
  CHECK(!memcmp(back, pinned, n), "device destination next to a host one differs");
  CU(drv->cuMemFreeHost(h));
  fprintf(stderr, "host destination: done (%d failures so far)\n", failures);
}

/* A broadcast captured into a CUDA graph, and an eager one queued before
 * the capture ends: each lands where it should.  The captured one used to
 * put libgshm's shared pair streams into the capture, and the eager one's
 * copies queued on them were captured too or refused (capture isolation). */
static void captured_and_eager(void) {
  gshm_broadcast_opts_t o = {GSHM_BCAST_CHAIN, 256 << 10, 0, 0};
  size_t n = 8 * MiB + 3;
  CUdeviceptr da = dbuf[0], db = dbuf[ndistinct > 1 ? 1 : 0];
  void *dsa[1] = {(void *)(uintptr_t)da}, *dsb[1] = {(void *)(uintptr_t)(db + 16 * MiB)};
  CUgraph g = NULL;
  CUgraphExec ge = NULL;
  CUstream sa;
  int e;

  if (!drv->cuStreamBeginCapture || !drv->cuStreamEndCapture || !drv->cuGraphInstantiate ||
      !drv->cuGraphLaunch || !drv->cuGraphDestroy || !drv->cuGraphExecDestroy) {
    fprintf(stderr, "capture: SKIPPED (the driver lacks the graph entry points)\n");
    return;
  }
  gpu_fill_random(pinned, n, 4242);
  CU(drv->cuCtxSetCurrent(ctx[slot_gpu[0]]));
  CU(drv->cuMemsetD8(da, 0, n));
  CU(drv->cuCtxSetCurrent(ctx[slot_gpu[ndistinct > 1 ? 1 : 0]]));
  CU(drv->cuMemsetD8(db + 16 * MiB, 0, n));
  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuMemcpyHtoD(src, pinned, n));
  CU(drv->cuStreamCreate(&sa, CU_STREAM_NON_BLOCKING));
  CU(drv->cuStreamBeginCapture(sa, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  e = gshm_broadcast_ex((const void *)(uintptr_t)src, dsa, 1, n, sa, &o);
  CHECK(e == 0, "captured broadcast: %d", e);
  e = gshm_broadcast_ex((const void *)(uintptr_t)src, dsb, 1, n, stream[0], &o);
  CHECK(e == 0, "eager broadcast during a capture: %d", e);
  /* (no synchronize before the capture ends: a capturing thread may not) */
  CHECK(drv->cuStreamEndCapture(sa, &g) == CUDA_SUCCESS && g, "end capture");
  CHECK(drv->cuStreamSynchronize(stream[0]) == CUDA_SUCCESS, "eager broadcast's stream");
  if (g && drv->cuGraphInstantiate(&ge, g, 0) == CUDA_SUCCESS) {
    CU(drv->cuGraphLaunch(ge, sa));
    CU(drv->cuStreamSynchronize(sa));
    CU(drv->cuCtxSetCurrent(ctx[slot_gpu[0]]));
    CU(drv->cuMemcpyDtoH(back, da, n));
    CHECK(!memcmp(back, pinned, n), "the captured broadcast's destination differs");
    CU(drv->cuGraphExecDestroy(ge));
  } else {
    CHECK(0, "the captured broadcast's graph does not instantiate");
  }
  CU(drv->cuCtxSetCurrent(ctx[slot_gpu[ndistinct > 1 ? 1 : 0]]));
  CU(drv->cuMemcpyDtoH(back, db + 16 * MiB, n));
  CHECK(!memcmp(back, pinned, n), "the eager broadcast's destination differs");
  if (g)
    drv->cuGraphDestroy(g);
  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuStreamDestroy(sa));
  fprintf(stderr, "capture: done (%d failures so far)\n", failures);
}

/* Broadcasts on two callers' streams are independent: caller stream A is
 * held by a gshm_wait on a page-locked host flag, a CHAIN is queued on A,
 * then one on B (both within GPU 0, so one GPU does); B's must end (a
 * gshm_signal after it on B sets a second host flag) while A is still
 * held.  libgshm used to issue both on its one set of pair streams, B's
 * copies behind A's, which wait for A: B's broadcast never ended while A
 * was held (a deadlock, had the flag waited for B).  A is released at the
 * end either way. */
static void independent_callers(void) {
  gshm_broadcast_opts_t o = {GSHM_BCAST_CHAIN, 256 << 10, 0, 0};
  size_t n = 4 * MiB + 1;
  CUdeviceptr s, d[4];
  volatile uint64_t *flags;
  void *da[2], *db[2];
  CUstream a, b;
  int waited = 0;

  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuMemAllocHost((void **)&flags, 16));
  flags[0] = flags[1] = 0;
  CU(drv->cuMemAlloc(&s, n));
  CU(drv->cuMemsetD8(s, 0x3C, n));
  for (int i = 0; i < 4; i++) {
    CU(drv->cuMemAlloc(&d[i], n));
    CU(drv->cuMemsetD8(d[i], 0, n));
  }
  CU(drv->cuCtxSynchronize());
  da[0] = (void *)(uintptr_t)d[0], da[1] = (void *)(uintptr_t)d[1];
  db[0] = (void *)(uintptr_t)d[2], db[1] = (void *)(uintptr_t)d[3];
  CU(drv->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CU(drv->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CHECK(gshm_wait((const uint64_t *)&flags[0], 1, a) == 0, "wait on A");
  CHECK(gshm_broadcast_ex((const void *)(uintptr_t)s, da, 2, n, a, &o) == 0, "broadcast on A");
  CHECK(gshm_broadcast_ex((const void *)(uintptr_t)s, db, 2, n, b, &o) == 0, "broadcast on B");
  CHECK(gshm_signal((uint64_t *)&flags[1], 1, b) == 0, "signal after B");
  for (; waited < 10000 && !flags[1]; waited++) /* up to 10 s */
    usleep(1000);
  CHECK(flags[1] == 1, "the broadcast on B did not end while A was held (it waited behind A's)");
  CHECK(!flags[0], "A was released early");
  flags[0] = 1; /* release A */
  CU(drv->cuStreamSynchronize(a));
  CU(drv->cuStreamSynchronize(b));
  for (int i = 0; i < 4; i++) {
    CU(drv->cuMemcpyDtoH(back, d[i], n));
    CHECK(back[0] == 0x3C && back[n - 1] == 0x3C, "independent callers: destination %d", i);
    CU(drv->cuMemFree(d[i]));
  }
  CU(drv->cuMemFree(s));
  CU(drv->cuStreamDestroy(a));
  CU(drv->cuStreamDestroy(b));
  CU(drv->cuMemFreeHost((void *)flags));
  fprintf(stderr, "independent callers: done after %d ms (%d failures so far)\n", waited,
          failures);
}

int main(void) {
  static const size_t sizes[] = {1, 4095, MiB + 3, 256 * MiB};
  static const size_t offs[][2] = {{0, 0}, {3, 0}, {0, 5}, {7, 13}};
  int count = 0, distinct[MAX_N], nd = 0, shared[4], ns = 0;
  uint64_t seed = 1;

  if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) || drv->cuDeviceGetCount(&count) != CUDA_SUCCESS ||
      count < 1) {
    fprintf(stderr, "SKIP: needs a CUDA driver and a GPU (have %d)\n", count);
    return SKIP;
  }
  ngpus = count > MAX_GPUS ? MAX_GPUS : count;
  for (int g = 0; g < ngpus; g++) {
    CUdevice dev;
    int can = 1;
    CU(drv->cuDeviceGet(&dev, g));
    if (g)
      CU(drv->cuDeviceCanAccessPeer(&can, 0, dev));
    if (!can) { /* the GPUs GPU 0 reaches are 0..g-1 */
      fprintf(stderr, "GPU 0 has no peer access to GPU %d: using GPUs 0..%d only\n", g, g - 1);
      ngpus = g;
      break;
    }
    CU(drv->cuDevicePrimaryCtxRetain(&ctx[g], dev));
    CU(drv->cuCtxSetCurrent(ctx[g]));
    CU(drv->cuStreamCreate(&stream[g], CU_STREAM_NON_BLOCKING));
  }
  if (ngpus < 2)
    fprintf(stderr, "one GPU: every destination is on GPU 0 beside the source; SKIPPED (needs a "
                    "second GPU with peer access): destinations on other GPUs, copies over peer "
                    "links\n");
  /* slots: one on every other GPU (one on GPU 0 when there is no other),
   * then two more on GPU 1 and one on GPU 0 (all on GPU 0 with one GPU) */
  for (int g = ngpus > 1 ? 1 : 0; g < ngpus && nd < MAX_N - 3; g++) {
    slot_gpu[nd] = g;
    distinct[nd] = nd;
    nd++;
  }
  ndistinct = nd;
  slot_gpu[nd] = 1 % ngpus, shared[ns++] = 0, shared[ns++] = nd++;
  slot_gpu[nd] = 0, shared[ns++] = nd++;
  slot_gpu[nd] = 1 % ngpus, shared[ns++] = nd++;
  for (int i = 0; i < nd; i++) {
    CU(drv->cuCtxSetCurrent(ctx[slot_gpu[i]]));
    CU(drv->cuMemAlloc(&dbuf[i], CAP + 2 * GUARD));
  }
  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuMemAlloc(&src, CAP));
  CU(drv->cuMemAllocHost((void **)&pinned, CAP));
  back = malloc(CAP + 2 * GUARD);
  REQUIRE(back, "malloc");
  fprintf(stderr, "%d GPU(s); %d destination(s) on distinct GPUs, %d sharing GPUs\n", ngpus,
          ndistinct, ns);

  errors();
  for (int a = GSHM_BCAST_AUTO; a <= GSHM_BCAST_SPLIT; a++)
    for (int pull = 0; pull < 2; pull++)
      for (int ch = 0; ch < 2; ch++) {
        /* default chunk and lanes, or 64 KiB chunks taken in turn by 3 lanes */
        gshm_broadcast_opts_t o = {(gshm_broadcast_algo_t)a, ch ? 64 << 10 : 0, pull, ch ? 3 : 0};
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
          for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
            /* 256 MiB: aligned only, default chunk; the small chunk
             * pipelines 1 MiB + 3 B in 17 steps already */
            if (sizes[si] > 64 * MiB && (oi || ch))
              continue;
            one(distinct, ndistinct, sizes[si], offs[oi][0], offs[oi][1], &o, 0, seed++);
            one(shared, ns, sizes[si], offs[oi][0], offs[oi][1], &o, (int)(seed % 2), seed);
            seed++;
          }
        fprintf(stderr, "%s pull %d chunk %s: done (%d failures so far)\n", aname(o.algo), pull,
                ch ? "64 KiB, 3 lanes" : "default", failures);
      }
  /* a chunk far beyond the buffer (up to SIZE_MAX) is the whole buffer */
  {
    gshm_broadcast_opts_t o = {GSHM_BCAST_CHAIN, (size_t)-1, 0, 0};
    one(distinct, ndistinct, MiB + 3, 0, 0, &o, 0, seed++);
    o.algo = GSHM_BCAST_SPLIT;
    o.chunk_bytes = (size_t)-1 - 100;
    one(shared, ns, MiB + 3, 0, 0, &o, 0, seed++);
  }
  host_destination();
  captured_and_eager();
  independent_callers();
  /* NULL stream with the source's context current: the legacy stream */
  {
    gshm_broadcast_opts_t o = {GSHM_BCAST_SPLIT, 0, 0, 0};
    void *d[MAX_N];
    size_t n = 64 * MiB;
    for (int i = 0; i < ndistinct; i++)
      d[i] = (void *)(uintptr_t)dbuf[distinct[i]];
    gpu_fill_random(pinned, n, 99);
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuMemcpyHtoD(src, pinned, n));
    CHECK(gshm_broadcast_ex((const void *)(uintptr_t)src, d, ndistinct, n, NULL, &o) == 0,
          "NULL stream");
    CU(drv->cuStreamSynchronize(NULL));
    for (int i = 0; i < ndistinct; i++) {
      CU(drv->cuCtxSetCurrent(ctx[slot_gpu[distinct[i]]]));
      CU(drv->cuMemcpyDtoH(back, dbuf[distinct[i]], n));
      CHECK(!memcmp(back, pinned, n), "NULL stream: destination %d differs", i);
    }
  }
  /* After GPU 0's primary context is reset (cudaDeviceReset), libgshm's
   * streams and events there are gone: a CHAIN from a new buffer on GPU 0
   * must make new ones, not fail on stale handles.  (With one GPU the
   * reset frees the destinations too: they are allocated again.) */
  {
    gshm_broadcast_opts_t o = {GSHM_BCAST_CHAIN, 256 << 10, 0, 0};
    void *d[MAX_N];
    size_t n = 4 * MiB + 5;
    unsigned char *want = malloc(n);
    CUdevice dev;
    CUdeviceptr src2;
    REQUIRE(want, "malloc");
    gpu_fill_random(want, n, 1234);
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuCtxSynchronize());
    CU(drv->cuDeviceGet(&dev, 0));
    CU(drv->cuDevicePrimaryCtxReset(dev)); /* frees src, pinned, GPU 0's slots */
    /* the old handle is dead until retained again (what the runtime does
     * on its next call after cudaDeviceReset) */
    CU(drv->cuDevicePrimaryCtxRetain(&ctx[0], dev));
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuMemAlloc(&src2, n));
    CU(drv->cuMemcpyHtoD(src2, want, n));
    for (int i = 0; i < ndistinct; i++) {
      if (slot_gpu[distinct[i]] == 0)
        CU(drv->cuMemAlloc(&dbuf[distinct[i]], n));
      d[i] = (void *)(uintptr_t)dbuf[distinct[i]];
    }
    CHECK(gshm_broadcast_ex((const void *)(uintptr_t)src2, d, ndistinct, n, NULL, &o) == 0,
          "CHAIN after a primary context reset");
    CU(drv->cuCtxSynchronize());
    for (int i = 0; i < ndistinct; i++) {
      CU(drv->cuCtxSetCurrent(ctx[slot_gpu[distinct[i]]]));
      CU(drv->cuMemcpyDtoH(back, dbuf[distinct[i]], n));
      CHECK(!memcmp(back, want, n), "after reset: destination %d differs", i);
    }
    free(want);
  }
  fprintf(stderr, "broadcast: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
