/* SPDX-License-Identifier: Apache-2.0 */
/* gshm_copy on real GPUs: every method, within one GPU and between two
 * (push, pull, both directions), on random data at sizes and offsets that
 * hit the kernels' head, body and tail paths (1 B, 4095 B, 1 MiB + 3 B,
 * 256 MiB, misaligned and mutually misaligned source/destination), with
 * guard bytes around each destination that must stay untouched.  Plus the
 * argument errors, and a first SM copy made inside a stream capture.  Exit 77 (skip) without a GPU; the peer cases need two
 * and are skipped, said so, with one. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "gshm.h"

#define GUARD 64
#define GUARD_BYTE 0xA5

#include "gpu_check.h"

static const struct gshm_cudadrv *drv;
static CUcontext ctx[2];
static CUstream stream[2];
static CUdeviceptr src[2], dst[2];
static unsigned char *rnd, *back;
static size_t cap;

static const char *mname(gshm_copy_method_t m) {
  return m == GSHM_COPY_ENGINE ? "ENGINE" : m == GSHM_COPY_SM ? "SM" : "AUTO";
}

/* Copies n bytes GPU s (offset os) -> GPU d (offset od) with method m on
 * the stream of GPU `on`, and checks the bytes and the guards. */
static void one(int s, int d, int on, size_t n, size_t os, size_t od, gshm_copy_method_t m,
                uint64_t seed) {
  const unsigned char *data = rnd + seed % 1024; /* a different window each case */
  size_t span = n + 2 * GUARD;
  int e, bad = 0;

  CU(drv->cuCtxSetCurrent(ctx[s]));
  /* From pageable memory cuMemcpyHtoD may return before its DMA is done,
   * and cuMemsetD8 is asynchronous: finish both before a copy on a
   * non-blocking stream reads them. */
  CU(drv->cuMemcpyHtoD(src[s], data, n + os));
  CU(drv->cuStreamSynchronize(NULL));
  CU(drv->cuCtxSetCurrent(ctx[d]));
  CU(drv->cuMemsetD8(dst[d], GUARD_BYTE, span + od));
  CU(drv->cuStreamSynchronize(NULL));
  CU(drv->cuCtxSetCurrent(ctx[on]));
  e = gshm_copy((void *)(uintptr_t)(dst[d] + GUARD + od), (const void *)(uintptr_t)(src[s] + os), n,
                m, stream[on]);
  CHECK(e == 0, "gshm_copy %s GPU%d->GPU%d on GPU%d %zu B: %d", mname(m), s, d, on, n, e);
  CU(drv->cuStreamSynchronize(stream[on]));
  CU(drv->cuCtxSetCurrent(ctx[d]));
  CU(drv->cuMemcpyDtoH(back, dst[d], span + od));
  for (size_t i = 0; i < GUARD + od; i++)
    bad += back[i] != GUARD_BYTE;
  for (size_t i = 0; i < GUARD; i++)
    bad += back[GUARD + od + n + i] != GUARD_BYTE;
  CHECK(!bad, "%s GPU%d->GPU%d on GPU%d, %zu B, src+%zu dst+%zu: %d guard bytes overwritten",
        mname(m), s, d, on, n, os, od, bad);
  if (memcmp(back + GUARD + od, data + os, n)) {
    size_t i = 0;
    while (back[GUARD + od + i] == data[os + i])
      i++;
    CHECK(0, "%s GPU%d->GPU%d on GPU%d, %zu B, src+%zu dst+%zu: first wrong byte at %zu", mname(m),
          s, d, on, n, os, od, i);
  }
}

/* The first SM copy of a context, captured into a CUDA graph in global
 * mode (torch.cuda.graph's default): libgshm loads its module then, and
 * with two GPUs also enables peer access (GPU 1 pushes to GPU 0), calls a
 * capture forbids, which it makes with this thread's capture mode relaxed
 * (copy.c gshm__capture_relax, as PyTorch's cudaMallocMaybeCapturing).
 * The capture must end valid and its graph copy the bytes.  Run before
 * any other copy of this process, so that the set-up happens inside; on
 * GPU 1's context, so that GPU 0's peer access to GPU 1 is still first
 * enabled by the flag case below, which checks that. */
static void first_copy_captured(int n) {
  const int g = n >= 2 ? 1 : 0;
  unsigned char v[4096];
  CUgraph graph = NULL;
  CUgraphExec ge = NULL;
  CUresult r;
  CUstream cs;
  int e;

  if (!drv->cuStreamBeginCapture || !drv->cuStreamEndCapture || !drv->cuGraphInstantiate ||
      !drv->cuGraphLaunch || !drv->cuGraphDestroy || !drv->cuGraphExecDestroy) {
    fprintf(stderr, "first copy captured: SKIPPED (the driver lacks the graph entry points)\n");
    return;
  }
  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuMemsetD8(dst[0], 0, sizeof(v)));
  CU(drv->cuCtxSynchronize());
  CU(drv->cuCtxSetCurrent(ctx[g]));
  CU(drv->cuMemsetD8(src[g], 0x2A, sizeof(v)));
  CU(drv->cuCtxSynchronize());
  CU(drv->cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  CU(drv->cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  e = gshm_copy((void *)(uintptr_t)dst[0], (void *)(uintptr_t)src[g], sizeof(v), GSHM_COPY_SM,
                cs);
  r = drv->cuStreamEndCapture(cs, &graph);
  CHECK(e == 0, "first SM copy (GPU %d -> GPU 0) inside a capture: %d", g, e);
  CHECK(r == CUDA_SUCCESS && graph,
        "the capture around the first SM copy ended with %d (invalidated?)", (int)r);
  if (r == CUDA_SUCCESS && graph && drv->cuGraphInstantiate(&ge, graph, 0) == CUDA_SUCCESS) {
    CU(drv->cuGraphLaunch(ge, cs));
    CU(drv->cuStreamSynchronize(cs));
    CU(drv->cuMemcpyDtoH(v, dst[0], sizeof(v)));
    CHECK(v[0] == 0x2A && v[sizeof(v) - 1] == 0x2A, "the captured copy's bytes: %x %x", v[0],
          v[sizeof(v) - 1]);
    CU(drv->cuGraphExecDestroy(ge));
  } else if (r == CUDA_SUCCESS && graph) {
    CHECK(0, "the graph of the first SM copy does not instantiate");
  }
  if (graph)
    drv->cuGraphDestroy(graph);
  CU(drv->cuStreamDestroy(cs));
  CU(drv->cuCtxSetCurrent(ctx[0]));
  fprintf(stderr, "first copy captured: done (%d failures so far)\n", failures);
}

int main(void) {
  static const size_t sizes[] = {1, 15, 16, 17, 31, 4095, 4096, 65536 + 5, (1u << 20) + 3,
                                 (4u << 20) + 9, 256u << 20};
  static const size_t offs[][2] = {{0, 0}, {1, 0}, {0, 1}, {3, 7}, {5, 5}, {8, 0}, {15, 1}, {4, 12}};
  static const gshm_copy_method_t methods[] = {GSHM_COPY_ENGINE, GSHM_COPY_SM, GSHM_COPY_AUTO};
  int n = 0, e, cases = 0;
  uint64_t seed = 1;
  char host[64];

  if (gshm__cudadrv_load(7, &drv) || drv->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
    printf("SKIP: no CUDA GPU\n");
    return SKIP;
  }
  if (n > 2)
    n = 2;
  cap = (256u << 20) + 64 + 2 * GUARD;
  rnd = malloc(cap + 1024);
  back = malloc(cap);
  if (!rnd || !back)
    return 1;
  gpu_fill_random(rnd, cap + 1024, 42);
  for (int g = 0; g < n; g++) {
    CUdevice dev;
    CU(drv->cuDeviceGet(&dev, g));
    CU(drv->cuDevicePrimaryCtxRetain(&ctx[g], dev));
    CU(drv->cuCtxSetCurrent(ctx[g]));
    CU(drv->cuStreamCreate(&stream[g], CU_STREAM_NON_BLOCKING));
    CU(drv->cuMemAlloc(&src[g], cap));
    CU(drv->cuMemAlloc(&dst[g], cap));
  }

  first_copy_captured(n); /* (first: no copy may have loaded the module before) */

  /* argument errors and trivial cases */
  CU(drv->cuCtxSetCurrent(ctx[0]));
  CHECK(gshm_copy(NULL, (void *)(uintptr_t)src[0], 8, GSHM_COPY_AUTO, NULL) == -EINVAL, "NULL dst");
  CHECK(gshm_copy((void *)(uintptr_t)dst[0], NULL, 8, GSHM_COPY_AUTO, NULL) == -EINVAL, "NULL src");
  CHECK(gshm_copy((void *)(uintptr_t)dst[0], (void *)(uintptr_t)src[0], 8, (gshm_copy_method_t)7,
                  NULL) == -EINVAL,
        "bad method");
  CHECK(gshm_copy((void *)(uintptr_t)dst[0], (void *)(uintptr_t)src[0], 0, GSHM_COPY_SM, NULL) == 0,
        "0 bytes");
  e = gshm_copy((void *)(uintptr_t)dst[0], host, sizeof(host), GSHM_COPY_SM, NULL);
  CHECK(e == -EINVAL, "SM from pageable host memory: %d", e);
  CHECK(gshm_signal((uint64_t *)(uintptr_t)(dst[0] + 4), 1, NULL) == -EINVAL, "misaligned flag");
  CHECK(gshm_wait(NULL, 1, NULL) == -EINVAL, "NULL flag");
  {
    /* a flag in pageable memory: refused before the GPU sees it (the
     * fallback kernel's store to it was an illegal address that poisoned
     * this context); the context still works after (the copies below) */
    static uint64_t pageable[2];
    e = gshm_signal(&pageable[0], 1, stream[0]);
    CHECK(e == -EINVAL, "signal of a pageable flag: %d", e);
    e = gshm_copy_signal((void *)(uintptr_t)dst[0], (void *)(uintptr_t)src[0], 4096,
                         GSHM_COPY_SM, &pageable[0], 1, stream[0]);
    CHECK(e == -EINVAL, "copy_signal to a pageable flag: %d", e);
    e = gshm_wait(&pageable[0], 1, stream[0]);
    CHECK(e == -EINVAL, "wait on a pageable flag: %d", e);
    CU(drv->cuStreamSynchronize(stream[0]));
    CHECK(pageable[0] == 0, "a pageable flag was written");
  }

  /* pageable host -> device and back through AUTO (the copy engine) */
  memset(host, 0x5C, sizeof(host));
  CHECK(gshm_copy((void *)(uintptr_t)dst[0], host, sizeof(host), GSHM_COPY_AUTO, NULL) == 0, "HtoD");
  memset(host, 0, sizeof(host));
  CHECK(gshm_copy(host, (void *)(uintptr_t)dst[0], sizeof(host), GSHM_COPY_AUTO, NULL) == 0, "DtoH");
  CU(drv->cuStreamSynchronize(NULL));
  CHECK(host[0] == 0x5C && host[63] == 0x5C, "host round trip: %x %x", host[0], host[63]);

  /* NULL stream, no current context: the source GPU's primary context */
  {
    CUcontext popped;
    unsigned char v[32];
    CU(drv->cuMemsetD8(src[0], 0x3E, 32));
    CU(drv->cuMemsetD8(dst[0], 0, 32));
    CU(drv->cuStreamSynchronize(NULL));
    CU(drv->cuCtxSetCurrent(NULL));
    e = gshm_copy((void *)(uintptr_t)dst[0], (void *)(uintptr_t)src[0], 32, GSHM_COPY_SM, NULL);
    CHECK(e == 0, "SM with no current context: %d", e);
    CU(drv->cuCtxGetCurrent(&popped));
    CHECK(popped == NULL, "gshm_copy left a context current");
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuStreamSynchronize(NULL));
    CU(drv->cuMemcpyDtoH(v, dst[0], 32));
    CHECK(v[0] == 0x3E && v[31] == 0x3E, "no-context copy: %x %x", v[0], v[31]);
  }

  /* A flag on the other GPU, before any peer copy enabled peer access:
   * gshm_signal / gshm_copy_signal / gshm_wait on GPU 0's stream must
   * reach it (libgshm enables peer access), not fault. */
  if (n >= 2) {
    CUdeviceptr flag;
    uint64_t got = 0;
    CU(drv->cuCtxSetCurrent(ctx[1]));
    CU(drv->cuMemAlloc(&flag, 8));
    CU(drv->cuMemsetD8(flag, 0, 8));
    CU(drv->cuCtxSetCurrent(ctx[0]));
    e = gshm_signal((uint64_t *)(uintptr_t)flag, 5, stream[0]);
    CHECK(e == 0, "signal of a flag on GPU 1 from GPU 0: %d", e);
    e = gshm_wait((const uint64_t *)(uintptr_t)flag, 5, stream[0]);
    CHECK(e == 0, "wait on a flag on GPU 1 from GPU 0: %d", e);
    e = gshm_copy_signal((void *)(uintptr_t)dst[0], (void *)(uintptr_t)src[0], 4096, GSHM_COPY_SM,
                         (uint64_t *)(uintptr_t)flag, 6, stream[0]);
    CHECK(e == 0, "fused copy-signal with the flag on GPU 1: %d", e);
    CHECK(drv->cuStreamSynchronize(stream[0]) == CUDA_SUCCESS, "GPU 0's stream faulted");
    CU(drv->cuCtxSetCurrent(ctx[1]));
    CU(drv->cuMemcpyDtoH(&got, flag, 8));
    CHECK(got == 6, "flag on GPU 1 reads %llu, want 6", (unsigned long long)got);
    CU(drv->cuMemFree(flag));
    CU(drv->cuCtxSetCurrent(ctx[0]));
  }

  /* Stream order through programmatic dependent launch: each round sets A
   * (a memset), copies A to B and B to slot i of C with SM kernels, back to
   * back with no host sync; a kernel that read before the previous one's
   * stores landed leaves a wrong byte in some slot. */
  {
    const size_t slot = 64 << 10;
    const int rounds = 200;
    size_t bad = 0;
    CUdeviceptr a = src[0], b = src[0] + slot, c = dst[0];
    CU(drv->cuCtxSetCurrent(ctx[0]));
    for (int i = 0; i < rounds && !bad; i++) {
      CU(drv->cuMemsetD8Async(a, (unsigned char)(i + 1), slot, stream[0]));
      bad += gshm_copy((void *)(uintptr_t)b, (void *)(uintptr_t)a, slot, GSHM_COPY_SM, stream[0]) != 0;
      bad += gshm_copy((void *)(uintptr_t)(c + (size_t)i * slot), (void *)(uintptr_t)b, slot,
                       GSHM_COPY_SM, stream[0]) != 0;
    }
    CHECK(bad == 0, "SM copies in the chain failed");
    CU(drv->cuStreamSynchronize(stream[0]));
    CU(drv->cuMemcpyDtoH(back, c, (size_t)rounds * slot));
    for (int i = 0; i < rounds; i++)
      for (size_t k = 0; k < slot; k++)
        bad += back[(size_t)i * slot + k] != (unsigned char)(i + 1);
    CHECK(bad == 0, "memset -> SM copy -> SM copy chain: %zu bytes out of order", bad);
  }

  for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
    for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
      if (sizes[si] >= (4u << 20) && oi > 3)
        continue; /* big sizes: fewer offsets, for time */
      for (size_t mi = 0; mi < 3; mi++) {
        /* within GPU0, push 0->1, pull 0->1 (run by GPU1), push 1->0 */
        one(0, 0, 0, sizes[si], offs[oi][0], offs[oi][1], methods[mi], seed++);
        cases++;
        if (n >= 2) {
          one(0, 1, 0, sizes[si], offs[oi][0], offs[oi][1], methods[mi], seed++);
          one(0, 1, 1, sizes[si], offs[oi][0], offs[oi][1], methods[mi], seed++);
          one(1, 0, 1, sizes[si], offs[oi][0], offs[oi][1], methods[mi], seed++);
          cases += 3;
        }
      }
    }
  if (n < 2)
    printf("note: one GPU: peer cases skipped\n");

  /* After a primary context reset (what cudaDeviceReset does) the handle
   * is the same but libgshm's module and events are gone: SM copies must
   * work again, not fail with a stale module. */
  {
    CUdevice dev;
    CUdeviceptr s2, d2;
    unsigned char v[4096];
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuCtxSynchronize());
    CU(drv->cuDeviceGet(&dev, 0));
    CU(drv->cuDevicePrimaryCtxReset(dev));
    /* the old handle is dead until retained again (what the runtime does
     * on its next call after cudaDeviceReset) */
    CU(drv->cuDevicePrimaryCtxRetain(&ctx[0], dev));
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuMemAlloc(&s2, sizeof(v)));
    CU(drv->cuMemAlloc(&d2, sizeof(v)));
    CU(drv->cuMemsetD8(s2, 0x6B, sizeof(v)));
    CU(drv->cuMemsetD8(d2, 0, sizeof(v)));
    e = gshm_copy((void *)(uintptr_t)d2, (void *)(uintptr_t)s2, sizeof(v), GSHM_COPY_SM, NULL);
    CHECK(e == 0, "SM copy after a primary context reset: %d", e);
    CU(drv->cuCtxSynchronize());
    CU(drv->cuMemcpyDtoH(v, d2, sizeof(v)));
    CHECK(v[0] == 0x6B && v[sizeof(v) - 1] == 0x6B, "copy after reset: %x %x", v[0],
          v[sizeof(v) - 1]);
  }
  printf("%d copies checked, %d failures\n", cases, failures);
  return failures ? 1 : 0;
}
