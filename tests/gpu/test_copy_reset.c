/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm's retain of a primary context across resets, on a real GPU.
 * This process never retains GPU 0's primary context itself: gshm_copy
 * with no current context and a NULL stream uses (and retains) it.  The
 * context is then reset (cuDevicePrimaryCtxReset, what cudaDeviceReset
 * does) several times, each followed by such a copy, which must work and
 * leave the context active; at the end exactly one retain must be
 * outstanding (counted by releasing until the driver refuses:
 * cuDevicePrimaryCtxRelease of a context not retained is
 * CUDA_ERROR_INVALID_CONTEXT).  libgshm used to retain again after each
 * reset without giving its earlier count back (the driver keeps a retain
 * across a reset): one more count per reset.  Then a reset that another
 * retain (the test's, as cudart's or torch's) makes good before the next
 * copy: the copy must work on the live context, one count still libgshm's.
 * Exit 77 (skip) without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cudadrv.h"
#include "gshm.h"

#include "gpu_check.h"

#define RESETS 3

static const struct gshm_cudadrv *drv;

/* A host-to-host gshm_copy with no current context: libgshm makes GPU
 * 0's primary context current for it (and retains it where it holds
 * none live), and leaves no context current. */
static void copy_without_context(int round) {
  char a[64], b[64];
  CUcontext cur = (CUcontext)1;
  unsigned flags = 0;
  int active = 0, e;
  CUdevice dev;

  memset(a, 'a' + round, sizeof(a));
  memset(b, 0, sizeof(b));
  CU(drv->cuCtxSetCurrent(NULL));
  e = gshm_copy(b, a, sizeof(a), GSHM_COPY_ENGINE, NULL);
  CHECK(e == 0, "round %d: gshm_copy with no current context: %d", round, e);
  CU(drv->cuCtxGetCurrent(&cur));
  CHECK(cur == NULL, "round %d: gshm_copy left a context current", round);
  CU(drv->cuDeviceGet(&dev, 0));
  CU(drv->cuDevicePrimaryCtxGetState(dev, &flags, &active));
  CHECK(active, "round %d: GPU 0's primary context is not active after the copy", round);
}

int main(void) {
  CUdevice dev;
  CUresult r;
  int n = 0, releases = 0;

  if (gshm__cudadrv_load(7, &drv) || drv->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
    printf("SKIP: no CUDA GPU\n");
    return SKIP;
  }
  CU(drv->cuDeviceGet(&dev, 0));
  copy_without_context(0);
  for (int i = 1; i <= RESETS; i++) {
    CU(drv->cuDevicePrimaryCtxReset(dev));
    copy_without_context(i);
  }
  /* a reset, then another user (cudart, torch) makes the context again
   * before libgshm's next copy: libgshm must use the live context, and
   * keep its one count (the test's retain is the second) */
  {
    CUcontext before = NULL, mine = NULL;
    unsigned long long id0 = 0, id1 = 0;
    CU(drv->cuDevicePrimaryCtxRetain(&before, dev));
    (void)drv->cuCtxGetId(before, &id0);
    CU(drv->cuDevicePrimaryCtxRelease(dev));
    CU(drv->cuDevicePrimaryCtxReset(dev));
    CU(drv->cuDevicePrimaryCtxRetain(&mine, dev));
    (void)drv->cuCtxGetId(mine, &id1);
    printf("after a reset and another retain: handle %s, id %llu -> %llu\n",
           mine == before ? "the same" : "another", id0, id1);
    copy_without_context(RESETS + 1);
  }
  /* count the retains outstanding: libgshm's and the test's last one */
  while (releases < 100 && (r = drv->cuDevicePrimaryCtxRelease(dev)) == CUDA_SUCCESS)
    releases++;
  printf("retains outstanding after %d resets: %d\n", RESETS + 1, releases);
  CHECK(releases == 2,
        "%d retains of GPU 0's primary context outstanding, want 2 (libgshm's and the test's)",
        releases);
  printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
