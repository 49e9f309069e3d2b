/* SPDX-License-Identifier: Apache-2.0 */
/* A fake CUDA driver of FAKE_NDEV GPUs for the unit tests of gshmd's CUDA
 * backend (test_backend_cuda, test_fdstore): enough of the table for
 * gshmd_backend_cuda_create, allocations, exports and adopts, with every
 * call that makes or frees something counted and any of them made to
 * fail once (fake_cuda_gpus.h).  It defines gshm__cudadrv_load, so
 * common/cudadrv.c is not linked: fake_cuda_log.c goes with it. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cudadrv.h"
#include "fake_cuda_gpus.h"

const char *fake_fail_call;
CUresult fake_fail_with;
unsigned fake_calls;
static int current = -1;        /* the GPU whose primary context is current */
static int contexts[FAKE_NDEV]; /* what the primary contexts point at */

/* Every fake call that makes, maps, frees or fails starts here: counted,
 * and failed when asked. */
#define CALL(name)                                         \
  do {                                                     \
    fake_calls++;                                          \
    if (fake_fail_call && !strcmp(fake_fail_call, name)) { \
      fake_fail_call = NULL;                               \
      return fake_fail_with;                               \
    }                                                      \
  } while (0)

static CUresult f_init(unsigned flags) {
  (void)flags;
  CALL("cuInit");
  return CUDA_SUCCESS;
}
static CUresult f_count(int *n) {
  CALL("cuDeviceGetCount");
  *n = FAKE_NDEV;
  return CUDA_SUCCESS;
}
static CUresult f_get(CUdevice *d, int ordinal) {
  *d = ordinal;
  return CUDA_SUCCESS;
}
static CUresult f_uuid(CUuuid *u, CUdevice d) {
  memset(u->bytes, 0x10 + d, sizeof(u->bytes));
  return CUDA_SUCCESS;
}
static CUresult f_pci(char *buf, int len, CUdevice d) {
  snprintf(buf, (size_t)len, "0000:%02x:00.0", 0x18 + d);
  return CUDA_SUCCESS;
}
static CUresult f_name(char *buf, int len, CUdevice d) {
  snprintf(buf, (size_t)len, "Fake GPU %d", d);
  return CUDA_SUCCESS;
}
static CUresult f_total(size_t *b, CUdevice d) {
  (void)d;
  *b = (size_t)1 << 30;
  return CUDA_SUCCESS;
}
static CUresult f_attr(int *v, CUdevice_attribute a, CUdevice d) {
  (void)a, (void)d;
  *v = 1; /* VMM and POSIX fds supported; 1 for the rest is harmless */
  return CUDA_SUCCESS;
}
static CUresult f_gran(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f) {
  (void)p, (void)f;
  *g = FAKE_GRAN;
  return CUDA_SUCCESS;
}
static CUresult f_retain(CUcontext *c, CUdevice d) {
  CALL("cuDevicePrimaryCtxRetain");
  *c = (CUcontext)&contexts[d];
  return CUDA_SUCCESS;
}
static CUresult f_release(CUdevice d) {
  (void)d;
  CALL("cuDevicePrimaryCtxRelease");
  return CUDA_SUCCESS;
}
static CUresult f_can_peer(int *can, CUdevice d, CUdevice p) {
  (void)d, (void)p;
  *can = 0; /* no peer setup to fake */
  return CUDA_SUCCESS;
}
static CUresult f_p2p(int *v, CUdevice_P2PAttribute a, CUdevice s, CUdevice d) {
  (void)a, (void)s, (void)d;
  *v = 0;
  return CUDA_SUCCESS;
}
static CUresult f_set_current(CUcontext c) {
  CALL("cuCtxSetCurrent");
  current = (int)((int *)c - contexts);
  return CUDA_SUCCESS;
}
static CUresult f_get_current(CUcontext *c) {
  *c = current < 0 ? NULL : (CUcontext)&contexts[current];
  return CUDA_SUCCESS;
}
static CUresult f_create(CUmemGenericAllocationHandle *h, size_t size,
                         const CUmemAllocationProp *p, unsigned long long flags) {
  (void)size, (void)p, (void)flags;
  CALL("cuMemCreate");
  *h = 1;
  return CUDA_SUCCESS;
}
static CUresult f_reserve(CUdeviceptr *va, size_t size, size_t align, CUdeviceptr addr,
                          unsigned long long flags) {
  (void)size, (void)align, (void)addr, (void)flags;
  CALL("cuMemAddressReserve");
  *va = 0x7f0000000000ull;
  return CUDA_SUCCESS;
}
static CUresult f_addr_free(CUdeviceptr va, size_t size) {
  (void)va, (void)size;
  CALL("cuMemAddressFree");
  return CUDA_SUCCESS;
}
static CUresult f_map(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
  (void)va, (void)size, (void)off, (void)h, (void)flags;
  CALL("cuMemMap");
  return CUDA_SUCCESS;
}
static CUresult f_unmap(CUdeviceptr va, size_t size) {
  (void)va, (void)size;
  CALL("cuMemUnmap");
  return CUDA_SUCCESS;
}
static CUresult f_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *d, size_t n) {
  (void)va, (void)size, (void)d, (void)n;
  CALL("cuMemSetAccess");
  return CUDA_SUCCESS;
}
static CUresult f_memset(CUdeviceptr va, unsigned char v, size_t n) {
  (void)va, (void)v, (void)n;
  CALL("cuMemsetD8");
  return CUDA_SUCCESS;
}
static CUresult f_sync(CUstream s) {
  (void)s;
  CALL("cuStreamSynchronize");
  return CUDA_SUCCESS;
}
static CUresult f_mem_release(CUmemGenericAllocationHandle h) {
  (void)h;
  CALL("cuMemRelease");
  return CUDA_SUCCESS;
}
static CUresult f_export(void *fd, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
                         unsigned long long flags) {
  (void)h, (void)t, (void)flags;
  CALL("cuMemExportToShareableHandle");
  *(int *)fd = open("/dev/null", O_RDONLY); /* an fd the backend sets FD_CLOEXEC on */
  return CUDA_SUCCESS;
}
static CUresult f_import(CUmemGenericAllocationHandle *h, void *fd, CUmemAllocationHandleType t) {
  (void)fd, (void)t;
  CALL("cuMemImportFromShareableHandle");
  *h = 2;
  return CUDA_SUCCESS;
}
static CUresult f_props(CUmemAllocationProp *p, CUmemGenericAllocationHandle h) {
  (void)h;
  CALL("cuMemGetAllocationPropertiesFromHandle");
  p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->location.id = 0; /* every imported allocation is GPU 0's */
  return CUDA_SUCCESS;
}
static CUresult f_error_name(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_ILLEGAL_ADDRESS  ? "CUDA_ERROR_ILLEGAL_ADDRESS"
       : r == CUDA_ERROR_LAUNCH_FAILED  ? "CUDA_ERROR_LAUNCH_FAILED"
       : r == CUDA_ERROR_OUT_OF_MEMORY  ? "CUDA_ERROR_OUT_OF_MEMORY"
       : r == CUDA_ERROR_ECC_UNCORRECTABLE ? "CUDA_ERROR_ECC_UNCORRECTABLE"
                                        : "CUDA_ERROR_?";
  return CUDA_SUCCESS;
}

static const struct gshm_cudadrv fake_drv = {
    .cuInit = f_init,
    .cuDeviceGetCount = f_count,
    .cuDeviceGet = f_get,
    .cuDeviceGetUuid = f_uuid,
    .cuDeviceGetPCIBusId = f_pci,
    .cuDeviceGetName = f_name,
    .cuDeviceTotalMem = f_total,
    .cuDeviceGetAttribute = f_attr,
    .cuMemGetAllocationGranularity = f_gran,
    .cuDevicePrimaryCtxRetain = f_retain,
    .cuDevicePrimaryCtxRelease = f_release,
    .cuDeviceCanAccessPeer = f_can_peer,
    .cuDeviceGetP2PAttribute = f_p2p,
    .cuCtxSetCurrent = f_set_current,
    .cuCtxGetCurrent = f_get_current,
    .cuMemCreate = f_create,
    .cuMemAddressReserve = f_reserve,
    .cuMemAddressFree = f_addr_free,
    .cuMemMap = f_map,
    .cuMemUnmap = f_unmap,
    .cuMemSetAccess = f_set_access,
    .cuMemsetD8 = f_memset,
    .cuStreamSynchronize = f_sync,
    .cuMemRelease = f_mem_release,
    .cuMemExportToShareableHandle = f_export,
    .cuMemImportFromShareableHandle = f_import,
    .cuMemGetAllocationPropertiesFromHandle = f_props,
    .cuGetErrorName = f_error_name,
};

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  (void)prio;
  *drv_out = &fake_drv;
  return 0;
}
