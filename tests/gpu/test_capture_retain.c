/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm's retain of a GPU's primary context (kernels/copy.c
 * gshm__copy_primary_ctx: a NULL stream without a current context, peer
 * access, gshm_broadcast's GPUs) while another thread runs a stream
 * capture in global mode (torch.cuda.graph's default), which forbids every
 * thread "potentially unsafe" calls and is ended by one.  CUDA does not
 * list those calls; copy.c makes the retain with this thread's capture
 * mode relaxed (gshm__capture_relax), as it loads its module.  Two cases,
 * each its own capture on GPU 0 by the main thread, the retain made by a
 * second thread with no current context: GPU 0's primary context, which
 * the capture's own context is (a retain that only counts), then GPU 1's,
 * which no one has made in this process (a retain that creates the
 * context).  Each capture must end valid, each retain succeed, and the
 * captured graph, launched, must write its memset.  One GPU runs the
 * first case; the second needs a second GPU and is skipped, said so,
 * with one.  Exit 77 (skip) without a GPU or the driver's capture entry
 * points.  To learn
 * whether the relax matters, run it once with copy.c's relax taken out of
 * gshm__copy_primary_ctx: a capture that then ends invalidated says so. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "copy_internal.h"
#include "cudadrv.h"

#include "gpu_check.h"

static const struct gshm_cudadrv *drv;

struct retain_arg {
  int ordinal;
  int ret;
};

/* A thread of its own: no context is current on it. */
static void *retain_in_thread(void *p) {
  struct retain_arg *a = p;
  CUcontext c = NULL;

  a->ret = gshm__copy_primary_ctx(drv, a->ordinal, &c);
  return NULL;
}

/* A global-mode capture on GPU 0 (its primary context current here) with
 * a memset in it, around another thread's retain of GPU `ordinal`'s
 * primary context. */
static void retain_during_capture(CUcontext ctx0, CUdeviceptr buf, int ordinal) {
  struct retain_arg a = {.ordinal = ordinal, .ret = -1};
  CUgraph graph = NULL;
  CUstream cs;
  CUresult r;
  pthread_t t;

  CU(drv->cuCtxSetCurrent(ctx0));
  CU(drv->cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  CU(drv->cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU(drv->cuMemsetD8Async(buf, 0x5A, 4096, cs));
  REQUIRE(pthread_create(&t, NULL, retain_in_thread, &a) == 0, "pthread_create");
  REQUIRE(pthread_join(t, NULL) == 0, "pthread_join");
  r = drv->cuStreamEndCapture(cs, &graph);
  CHECK(a.ret == 0, "GPU %d's primary context retained during a capture: %d", ordinal, a.ret);
  CHECK(r == CUDA_SUCCESS && graph,
        "the capture around the retain of GPU %d's primary context ended with %d "
        "(invalidated by it?)",
        ordinal, (int)r);
  if (graph) {
    unsigned char got[4096];
    CUgraphExec ge = NULL;
    size_t bad = 0;

    CU(drv->cuMemsetD8(buf, 0, sizeof(got)));
    if (drv->cuGraphInstantiate(&ge, graph, 0) == CUDA_SUCCESS) {
      CU(drv->cuGraphLaunch(ge, cs));
      CU(drv->cuStreamSynchronize(cs));
      CU(drv->cuMemcpyDtoH(got, buf, sizeof(got)));
      for (size_t i = 0; i < sizeof(got); i++)
        bad += got[i] != 0x5A;
      CHECK(bad == 0, "the graph captured around GPU %d's retain: %zu of 4096 bytes not set",
            ordinal, bad);
      CU(drv->cuGraphExecDestroy(ge));
    } else {
      CHECK(0, "the graph captured around GPU %d's retain does not instantiate", ordinal);
    }
    drv->cuGraphDestroy(graph);
  }
  CU(drv->cuStreamDestroy(cs));
  fprintf(stderr, "retain of GPU %d during a capture: done (%d failures so far)\n", ordinal,
          failures);
}

int main(void) {
  CUcontext ctx0;
  CUdeviceptr buf;
  CUdevice dev;
  int n = 0;

  if (gshm__cudadrv_load(7, &drv) || drv->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
    printf("SKIP: needs a CUDA GPU (have %d)\n", n);
    return SKIP;
  }
  if (!drv->cuStreamBeginCapture || !drv->cuStreamEndCapture || !drv->cuGraphInstantiate ||
      !drv->cuGraphLaunch || !drv->cuGraphDestroy || !drv->cuGraphExecDestroy) {
    printf("SKIP: the driver lacks the capture entry points\n");
    return SKIP;
  }
  CU(drv->cuDeviceGet(&dev, 0));
  CU(drv->cuDevicePrimaryCtxRetain(&ctx0, dev));
  CU(drv->cuCtxSetCurrent(ctx0));
  CU(drv->cuMemAlloc(&buf, 4096));
  retain_during_capture(ctx0, buf, 0); /* GPU 0's exists: the retain counts */
  if (n >= 2)
    retain_during_capture(ctx0, buf, 1); /* GPU 1's is made by it */
  else
    fprintf(stderr, "one GPU: the retain that creates GPU 1's primary context SKIPPED (needs a "
                    "second GPU)\n");
  CU(drv->cuMemFree(buf));
  return failures ? 1 : 0;
}
