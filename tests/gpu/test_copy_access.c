/* SPDX-License-Identifier: Apache-2.0 */
/* gshm_copy, gshm_signal, gshm_wait and gshm_broadcast on cuMem memory
 * that gshm_map did not map (made here with cuMemCreate + cuMemMap, as
 * PyTorch's expandable segments are): a range mapped without
 * cuMemSetAccess gives GPU 0 no access, a second mapping of the same
 * memory gives it read-only access, and a third read-write.  Every
 * method refuses the first (-EXDEV) and writing the second (-EACCES)
 * before anything is queued; the context must still work after (a copy
 * that reached the GPU would fault: an illegal address, a sticky error
 * that ends the context).  Reading the read-only mapping works and reads
 * what was written through the read-write one.  With two GPUs, a range of
 * GPU 1 that only GPU 1 may access is refused on GPU 0's stream, and
 * cuMemAlloc memory of GPU 1 (which reads "no access" from GPU 0 until
 * peer access is enabled) still copies.  Exit 77 (skip) without a GPU. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "gshm.h"

#include "gpu_check.h"

static const struct gshm_cudadrv *drv;

static const char *mname(gshm_copy_method_t m) {
  return m == GSHM_COPY_ENGINE ? "ENGINE" : m == GSHM_COPY_SM ? "SM" : "AUTO";
}

/* Memory of `size` bytes on GPU `ordinal`, mapped three times: *none with
 * no access given, *ro read-only and *rw read-write for GPU `access`. */
static void make_ranges(int ordinal, int access, size_t size, CUmemGenericAllocationHandle *h,
                        CUdeviceptr *none, CUdeviceptr *ro, CUdeviceptr *rw) {
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;

  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  CU(drv->cuMemCreate(h, size, &prop, 0));
  CU(drv->cuMemAddressReserve(none, size, 0, 0, 0));
  CU(drv->cuMemAddressReserve(ro, size, 0, 0, 0));
  CU(drv->cuMemAddressReserve(rw, size, 0, 0, 0));
  CU(drv->cuMemMap(*none, size, 0, *h, 0));
  CU(drv->cuMemMap(*ro, size, 0, *h, 0));
  CU(drv->cuMemMap(*rw, size, 0, *h, 0));
  memset(&acc, 0, sizeof(acc));
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = access;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  CU(drv->cuMemSetAccess(*ro, size, &acc, 1));
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(drv->cuMemSetAccess(*rw, size, &acc, 1));
}

static void free_ranges(size_t size, CUmemGenericAllocationHandle h, CUdeviceptr none,
                        CUdeviceptr ro, CUdeviceptr rw) {
  CUdeviceptr r[3] = {none, ro, rw};
  for (int i = 0; i < 3; i++) {
    CU(drv->cuMemUnmap(r[i], size));
    CU(drv->cuMemAddressFree(r[i], size));
  }
  CU(drv->cuMemRelease(h));
}

#define P(x) ((void *)(uintptr_t)(x))

int main(void) {
  static const gshm_copy_method_t methods[] = {GSHM_COPY_ENGINE, GSHM_COPY_SM, GSHM_COPY_AUTO};
  CUmemAllocationProp prop;
  CUmemGenericAllocationHandle h;
  CUcontext ctx[2];
  CUstream stream;
  CUdeviceptr a, none, ro, rw;
  size_t gran = 0, size;
  unsigned char host[4096], back[4096];
  int n = 0, e;
  CUresult r;

  if (gshm__cudadrv_load(7, &drv) || drv->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
    printf("SKIP: no CUDA GPU\n");
    return SKIP;
  }
  for (int g = 0; g < (n < 2 ? n : 2); g++) {
    CUdevice dev;
    CU(drv->cuDeviceGet(&dev, g));
    CU(drv->cuDevicePrimaryCtxRetain(&ctx[g], dev));
  }
  CU(drv->cuCtxSetCurrent(ctx[0]));
  CU(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CU(drv->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size = gran;
  make_ranges(0, 0, size, &h, &none, &ro, &rw);
  CU(drv->cuMemAlloc(&a, size));
  gpu_fill_random(host, sizeof(host), 96);
  CU(drv->cuMemcpyHtoD(rw, host, sizeof(host)));
  CU(drv->cuCtxSynchronize());

  for (size_t m = 0; m < 3; m++) {
    e = gshm_copy(P(a), P(none), 4096, methods[m], stream);
    CHECK(e == -EXDEV, "%s from a range without access: %d, want -EXDEV", mname(methods[m]), e);
    e = gshm_copy(P(none), P(a), 4096, methods[m], stream);
    CHECK(e == -EXDEV, "%s into a range without access: %d, want -EXDEV", mname(methods[m]), e);
    e = gshm_copy(P(ro), P(a), 4096, methods[m], stream);
    CHECK(e == -EACCES, "%s into a read-only range: %d, want -EACCES", mname(methods[m]), e);
    e = gshm_copy(P(none + 64), P(host), 64, methods[m] == GSHM_COPY_SM ? GSHM_COPY_ENGINE
                                                                       : methods[m], stream);
    CHECK(e == -EXDEV, "%s from host memory into a range without access: %d", mname(methods[m]),
          e);
  }
  e = gshm_signal((uint64_t *)P(ro), 1, stream);
  CHECK(e == -EACCES, "signal in a read-only range: %d, want -EACCES", e);
  e = gshm_signal((uint64_t *)P(none), 1, stream);
  CHECK(e == -EXDEV, "signal in a range without access: %d, want -EXDEV", e);
  e = gshm_wait((const uint64_t *)P(none), 1, stream);
  CHECK(e == -EXDEV, "wait in a range without access: %d, want -EXDEV", e);
  e = gshm_copy_signal(P(a), P(rw), 64, GSHM_COPY_SM, (uint64_t *)P(ro + 128), 1, stream);
  CHECK(e == -EACCES, "copy_signal with its flag in a read-only range: %d", e);
  {
    void *d1[1] = {P(ro)}, *d2[1] = {P(none)};
    e = gshm_broadcast(P(a), d1, 1, 4096, stream);
    CHECK(e == -EACCES, "broadcast into a read-only range: %d, want -EACCES", e);
    e = gshm_broadcast(P(a), d2, 1, 4096, stream);
    CHECK(e == -EXDEV, "broadcast into a range without access: %d, want -EXDEV", e);
  }
  r = drv->cuStreamSynchronize(stream);
  CHECK(r == CUDA_SUCCESS, "the stream faulted (%d): a refused copy reached the GPU", (int)r);
  r = drv->cuCtxSynchronize();
  REQUIRE(r == CUDA_SUCCESS, "the context faulted (%d): a refused copy reached the GPU", (int)r);

  /* what the access allows: reading the read-only mapping, every method */
  for (size_t m = 0; m < 3; m++) {
    CU(drv->cuMemsetD8(a, 0, 4096));
    CU(drv->cuCtxSynchronize());
    e = gshm_copy(P(a), P(ro), 4096, methods[m], stream);
    CHECK(e == 0, "%s from a read-only range: %d", mname(methods[m]), e);
    CU(drv->cuStreamSynchronize(stream));
    CU(drv->cuMemcpyDtoH(back, a, 4096));
    CHECK(!memcmp(back, host, 4096), "%s from a read-only range read wrong bytes",
          mname(methods[m]));
    e = gshm_copy(P(rw + 4096), P(a), 4096, methods[m], stream);
    CHECK(e == 0, "%s into the read-write range: %d", mname(methods[m]), e);
  }
  CU(drv->cuStreamSynchronize(stream));
  CU(drv->cuMemFree(a));
  free_ranges(size, h, none, ro, rw);

  if (n >= 2) {
    /* GPU 1's memory that only GPU 1 may access, copied on GPU 0's stream */
    CUdeviceptr none1, ro1, rw1, b1;
    CUmemGenericAllocationHandle h1;
    CU(drv->cuCtxSetCurrent(ctx[1]));
    make_ranges(1, 1, size, &h1, &none1, &ro1, &rw1);
    CU(drv->cuMemAlloc(&b1, size));
    CU(drv->cuMemsetD8(b1, 0x2F, size));
    CU(drv->cuCtxSynchronize());
    CU(drv->cuCtxSetCurrent(ctx[0]));
    CU(drv->cuMemAlloc(&a, size));
    for (size_t m = 0; m < 3; m++) {
      e = gshm_copy(P(a), P(rw1), 4096, methods[m], stream);
      CHECK(e == -EXDEV, "%s on GPU 0 from GPU 1's range only GPU 1 may access: %d",
            mname(methods[m]), e);
      e = gshm_copy(P(rw1), P(a), 4096, methods[m], stream);
      CHECK(e == -EXDEV, "%s on GPU 0 into GPU 1's range only GPU 1 may access: %d",
            mname(methods[m]), e);
    }
    CU(drv->cuStreamSynchronize(stream));
    /* cuMemAlloc memory of GPU 1: the copy engine first (no peer access
     * enabled yet by libgshm), then the SM kernels */
    for (size_t m = 0; m < 3; m++) {
      CU(drv->cuMemsetD8(a, 0, 4096));
      CU(drv->cuCtxSynchronize());
      e = gshm_copy(P(a), P(b1), 4096, methods[m], stream);
      CHECK(e == 0, "%s on GPU 0 from GPU 1's cuMemAlloc memory: %d", mname(methods[m]), e);
      CU(drv->cuStreamSynchronize(stream));
      CU(drv->cuMemcpyDtoH(back, a, 4096));
      CHECK(back[0] == 0x2F && back[4095] == 0x2F, "%s from GPU 1: %x %x", mname(methods[m]),
            back[0], back[4095]);
    }
    r = drv->cuCtxSynchronize();
    REQUIRE(r == CUDA_SUCCESS, "GPU 0's context faulted (%d)", (int)r);
    CU(drv->cuMemFree(a));
    CU(drv->cuCtxSetCurrent(ctx[1]));
    CU(drv->cuMemFree(b1));
    free_ranges(size, h1, none1, ro1, rw1);
  } else {
    printf("note: one GPU: the cases between two GPUs skipped\n");
  }
  printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
