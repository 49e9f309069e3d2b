/* SPDX-License-Identifier: Apache-2.0 */
/* What the CUDA backend's files share: backend_cuda.c (segments:
 * allocate, export, adopt, free; the ops table), backend_cuda_devices.c
 * (the GPUs: probe, peer access, NVLink counts, the device list) and
 * backend_cuda_host.c (page-locked host memory). */
#ifndef GSHMD_BACKEND_CUDA_INTERNAL_H
#define GSHMD_BACKEND_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "cudadrv.h"

/* Most staging-copy streams a GPU gets: one per libuv pool thread
 * (daemon/main.c GSHMD_THREADPOOL_SIZE); a copy past them waits on the
 * legacy default stream. */
#define CUDA_COPY_STREAMS 16

struct cuda_dev {
  CUdevice dev;
  CUcontext ctx;               /* primary context, retained */
  char uuid[48];               /* "GPU-..." */
  char pci[32];                /* "0000:18:00.0": the log prefix */
  unsigned pci_domain, pci_bus, pci_device;
  char name[256];
  uint64_t total;
  int cc_major, cc_minor;
  uint64_t granularity;        /* minimum for POSIX-fd device allocations */
  /* Streams for staging copies (cuda_copy_host), one per copy in flight,
   * made on first use: the legacy default stream would serialize the
   * copies of every pool thread.  Under copy_lock. */
  pthread_mutex_t copy_lock;
  CUstream copy_free[CUDA_COPY_STREAMS];
  unsigned ncopy_free, ncopy_made;
  bool vmm;                    /* VMM + POSIX fd handles supported */
  bool rdma_vmm;               /* GPUDirect RDMA of cuMem allocations supported */
  /* NVML view, for the link counts. */
  int gpu_links[32];           /* links of this GPU whose far end is GPU j (direct) */
  int switch_links;            /* links to an NVSwitch */
};

struct cuda_backend {
  struct gshmd_backend base;
  const struct gshm_cudadrv *drv;
  unsigned n;
  struct cuda_dev *devs;
  bool nvml_ok;
  /* `gshmctl devices`: built once, free memory refreshed per call. */
  Gshm__DeviceInfo *info;
  Gshm__DeviceInfo **infop;
  Gshm__PeerInfo *peers;       /* n * n, row i column j; diagonal unused */
  Gshm__PeerInfo **peerp;      /* n rows of n - 1 pointers */
  bool host_thp;               /* host_alloc: 2 MiB pages registered (cuda_host_alloc) */
};

/* A driver call of the backend failed with r: logs it at prio (the call
 * text, file and line: GSHM_CU's line), and returns gshm__cuda_errno(r).
 * The first sticky error (gshm__cuda_sticky) is logged instead as one
 * error that names the GPU (d; NULL: the one whose primary context is
 * current on this thread), and sets cb->base.needs_restart; later ones
 * are logged at debug level.  Any thread.  backend_cuda_devices.c. */
int gshmd__cuda_failed(struct cuda_backend *cb, struct cuda_dev *d, CUresult r, int prio,
                       const char *call, const char *file, int line);

/* Driver calls through the backend's table, as common/cudadrv.h's GSHM_CU
 * but through gshmd__cuda_failed: CU_ERR for a call whose failure fails
 * the operation, CU_UNDO for one that undoes or frees; CU_CALL names the
 * GPU d (NULL: the current context's; for calls made with no context of
 * theirs) and the log level (GSHM_LOG_DEBUG for a probe). */
#define CU_CALL(cb, d, prio, fn, ...)                                                \
  __extension__({                                                                    \
    CUresult cu_r_ = (cb)->drv->fn(__VA_ARGS__);                                     \
    cu_r_ == CUDA_SUCCESS ? 0                                                        \
                          : gshmd__cuda_failed((cb), (d), cu_r_, (prio),             \
                                               #fn "(" #__VA_ARGS__ ")", __FILE__,   \
                                               __LINE__);                            \
  })
#define CU_ERR(cb, fn, ...) CU_CALL(cb, NULL, GSHM_LOG_ERR, fn, __VA_ARGS__)
#define CU_UNDO(cb, fn, ...) CU_CALL(cb, NULL, GSHM_LOG_WARNING, fn, __VA_ARGS__)

/* The properties of a POSIX-fd-exportable pinned allocation on d, which a
 * NIC may register (GPUDirect RDMA: the cluster path's direct reads) where
 * the GPU allows it for cuMem allocations: without gpuDirectRDMACapable
 * such memory cannot be pinned for a NIC (cuda.h, CUmemAllocationProp). */
static inline CUmemAllocationProp device_prop(const struct cuda_dev *d) {
  CUmemAllocationProp p;

  memset(&p, 0, sizeof(p));
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = d->dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.allocFlags.gpuDirectRDMACapable = d->rdma_vmm;
  return p;
}

/* Makes d's primary context current on this thread: 0 or -EIO (logged). */
static inline int set_ctx(struct cuda_backend *cb, struct cuda_dev *d) {
  return CU_ERR(cb, cuCtxSetCurrent, d->ctx);
}

/* Finds every GPU the driver shows and fills cb->devs, cb->n (as far as
 * setup got: cuda_destroy releases what was retained), peer access, the
 * NVLink counts and the device list of `gshmctl devices`.  Returns 0;
 * -ENODEV with no GPU; -EIO when a driver call fails (logged); -ENOMEM. */
int gshmd__cuda_setup_devices(struct cuda_backend *cb);

/* backend_cuda_host.c: ->host_alloc and ->host_free (backend.h). */
int gshmd__cuda_host_alloc(struct gshmd_backend *b, uint64_t size, void **ptr_out);
void gshmd__cuda_host_free(struct gshmd_backend *b, void *ptr, uint64_t size);

#endif
