/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA backend: device segments through the driver's virtual memory API.
 *
 * At start gshmd loads libcuda.so.1 (common/cudadrv.c, dlopen), enumerates
 * the GPUs it can see, retains each one's primary context, enables peer
 * access between every pair that supports it, and records the P2P matrix
 * (access, native atomics, performance rank) and the NVLink link counts
 * that NVML reports (libnvidia-ml.so.1, also dlopen'ed; -1 without it):
 * that part is backend_cuda_devices.c's.
 *
 * A device segment is one cuMemCreate allocation made exportable as a POSIX
 * file descriptor.  gshmd keeps the only owning handle and exports it once,
 * at allocation; every open gets a dup() of that fd.  Measured on H200s
 * (driver 580), cuMemExportToShareableHandle costs about 600 us per call,
 * 40 times a daemon round trip, and a handle imported from a parked fd
 * after a restart cannot be exported again at all (CUDA_ERROR_INVALID_VALUE):
 * the one fd serves both.  The fd alone keeps the physical memory alive,
 * which is what lets gshmd park it in systemd's fd store and re-import it
 * after a restart (adopt_fd).
 *
 * Segments created with SEGMENT_FLAG_LEGACY_IPC are different: a legacy
 * cudaIpcMemHandle only works on cuMemAlloc'ed memory, not on VMM
 * allocations, so those are cuMemAlloc'ed in the owning GPU's primary
 * context and exported with cuIpcGetMemHandle only.  A legacy handle is a
 * 64-byte bearer token: any process on the node that learns the bytes can
 * open the memory read-write, bypassing gshm's permission checks, which is
 * why the config must enable it (daemon.legacy_ipc, off by default).
 * Such segments have no fd: they cannot be opened as cuMem fds and cannot
 * survive a daemon restart.
 *
 * Device messages start with the GPU's PCI bus id (docs/ARCHITECTURE.md
 * "Errors and logging"). */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "cudadrv.h"
#include "backend_cuda_internal.h"
#include "log.h"

struct cuda_alloc {
  struct gshmd_alloc base;
  struct cuda_dev *d;
  bool legacy;
  CUmemGenericAllocationHandle handle; /* VMM segments */
  int fd;                              /* VMM segments: its POSIX fd, exported once; else -1 */
  CUdeviceptr ptr;                     /* LEGACY_IPC segments (cuMemAlloc) */
  CUdeviceptr va;                      /* local_ptr: gshmd's own mapping, 0 until asked */
  pthread_mutex_t va_lock;             /* making va (copies on libuv's pool may race) */
};

static struct cuda_backend *cuda_of(struct gshmd_backend *b) { return (struct cuda_backend *)b; }

static void cuda_free(struct gshmd_backend *b, struct gshmd_alloc *mem);
static int export_once(struct cuda_backend *cb, struct cuda_alloc *a);
static int local_va(struct cuda_backend *cb, struct cuda_alloc *a, CUdeviceptr *va_out);

static struct cuda_dev *dev_by_uuid(struct cuda_backend *cb, const char *uuid) {
  for (unsigned i = 0; i < cb->n; i++)
    if (!strcasecmp(cb->devs[i].uuid, uuid))
      return &cb->devs[i];
  return NULL;
}

static struct cuda_dev *dev_by_location(struct cuda_backend *cb, const struct gshm_location *loc) {
  if (loc->kind == GSHM_LOCATION_CUDA_INDEX)
    return loc->index >= 0 && (unsigned)loc->index < cb->n ? &cb->devs[loc->index] : NULL;
  if (loc->kind == GSHM_LOCATION_CUDA_UUID)
    return dev_by_uuid(cb, loc->uuid);
  return NULL;
}

static struct cuda_alloc *wrap(struct cuda_backend *cb, struct cuda_dev *d, uint64_t size,
                               uint64_t gran) {
  struct cuda_alloc *a = calloc(1, sizeof(*a));

  if (!a)
    return NULL;
  a->base.backend = &cb->base;
  a->base.size = size;
  a->base.granularity = gran;
  a->base.device_index = (int)(d - cb->devs);
  snprintf(a->base.location, sizeof(a->base.location), "cuda:%s", d->uuid);
  a->base.priv = a;
  a->d = d;
  a->fd = -1;
  pthread_mutex_init(&a->va_lock, NULL);
  return a;
}

/* The GPU of loc (*d_out) and size (> 0) rounded up to its granularity
 * (*alloc_out).  0, -EINVAL (size 0), -ENODEV (no such GPU) or -EFBIG. */
static int alloc_where(struct cuda_backend *cb, const struct gshm_location *loc, uint64_t size,
                       struct cuda_dev **d_out, uint64_t *alloc_out) {
  struct cuda_dev *d;

  if (size == 0)
    return -EINVAL;
  if (!(d = dev_by_location(cb, loc)))
    return -ENODEV;
  if (size > UINT64_MAX - d->granularity)
    return -EFBIG;
  *d_out = d;
  *alloc_out = (size + d->granularity - 1) / d->granularity * d->granularity;
  return 0;
}

/* cuMemCreate of size bytes (a multiple of d's granularity) on d, into
 * *h.  0, -ENOTSUP (no POSIX-fd VMM allocations on d) or the driver's
 * error as an errno (logged, naming debug_name). */
static int vmm_create(struct cuda_backend *cb, struct cuda_dev *d, uint64_t size,
                      const char *debug_name, CUmemGenericAllocationHandle *h) {
  CUmemAllocationProp prop;
  CUresult r;

  if (!d->vmm) {
    gshm_log_err("%s: '%s': this GPU does not support POSIX-fd cuMem allocations", d->pci,
                 debug_name);
    return -ENOTSUP;
  }
  prop = device_prop(d);
  if ((r = cb->drv->cuMemCreate(h, size, &prop, 0)) != CUDA_SUCCESS) {
    char what[128]; /* one line: the GPU, the segment, the size and the driver's error */
    snprintf(what, sizeof(what), "'%s': cuMemCreate of %" PRIu64 " bytes", debug_name, size);
    return gshmd__cuda_failed(cb, d, r, GSHM_LOG_WARNING, what, __FILE__, __LINE__);
  }
  return 0;
}

static int cuda_alloc(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
                      uint32_t flags, const char *debug_name, struct gshmd_alloc **out) {
  struct cuda_backend *cb = cuda_of(b);
  bool legacy = flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC;
  struct cuda_dev *d;
  struct cuda_alloc *a;
  CUmemGenericAllocationHandle h;
  CUdeviceptr ptr;
  uint64_t gran;
  int e;

  /* Legacy segments use the same granularity, so that sizes do not depend
   * on the flag (cuMemAlloc itself rounds to 2 MiB pages for large sizes). */
  if ((e = alloc_where(cb, loc, size, &d, &size)))
    return e;
  gran = d->granularity;

  if (legacy) {
    if ((e = set_ctx(cb, d)))
      return e;
    if ((e = CU_ERR(cb, cuMemAlloc, &ptr, size)))
      return e;
    if ((e = CU_ERR(cb, cuMemsetD8, ptr, 0, size)) || (e = CU_ERR(cb, cuStreamSynchronize, NULL))) {
      CU_UNDO(cb, cuMemFree, ptr);
      return e;
    }
    if (!(a = wrap(cb, d, size, gran))) {
      CU_UNDO(cb, cuMemFree, ptr);
      return -ENOMEM;
    }
    a->legacy = true;
    a->ptr = ptr;
    gshm_log_debug("%s: '%s': %" PRIu64 " bytes cuMemAlloc'ed for legacy IPC", d->pci,
                   debug_name, size);
    *out = &a->base;
    return 0;
  }

  if ((e = vmm_create(cb, d, size, debug_name, &h)))
    return e;
  if (!(a = wrap(cb, d, size, gran))) {
    CU_UNDO(cb, cuMemRelease, h);
    return -ENOMEM;
  }
  a->handle = h;
  /* Zeroed: the driver does not promise zeroed memory, and physical
   * memory released by one user's segment may come back in another
   * user's, all inside this one process: never hand out what a previous
   * owner left there.  Through gshmd's own mapping, kept for the staging
   * copies (local_va): a temporary one here, unmapped, then made again at
   * the segment's first staged serve, cost a set of hundreds of tensors
   * hundreds of maps on its first pull. */
  if ((e = local_va(cb, a, &ptr)) || (e = CU_ERR(cb, cuMemsetD8, ptr, 0, size)) ||
      (e = CU_ERR(cb, cuStreamSynchronize, NULL)) || (e = export_once(cb, a))) {
    cuda_free(b, &a->base);
    return e;
  }
  *out = &a->base;
  return 0;
}

/* Exports the allocation's POSIX fd, once, into a->fd. */
static int export_once(struct cuda_backend *cb, struct cuda_alloc *a) {
  int fd = -1, e;

  if ((e = CU_ERR(cb, cuMemExportToShareableHandle, &fd, a->handle,
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)))
    return e;
  /* The driver's fd is not close-on-exec; ours never leak into children. */
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
    e = -errno;
    gshm_log_err("%s: F_SETFD on an exported fd: %m", a->d->pci);
    close(fd);
    return e;
  }
  a->fd = fd;
  return 0;
}

/* The segment's one exported fd, lent (backend.h); the export is made once
 * per segment because cuMemExportToShareableHandle costs about 600 us
 * (gshm-bench attach on H200s).  `writable`
 * cannot be enforced here: a cuMem POSIX fd carries no access mode, and
 * whoever holds it can map it read-write.  Read-only leases are enforced
 * by libgshm (cuMemSetAccess PROT_READ on its own mapping), which protects
 * against mistakes, not against a hostile client of a read-only lease. */
static int cuda_export_fd(struct gshmd_backend *b, struct gshmd_alloc *mem, bool writable,
                          int *fd_out) {
  struct cuda_alloc *a = mem->priv;

  (void)b;
  (void)writable;
  if (a->legacy || a->fd < 0)
    return -ENOTSUP; /* cuMemAlloc memory has no POSIX fd */
  *fd_out = a->fd;
  return 0;
}

/* The legacy cudaIpcMemHandle of a LEGACY_IPC segment: a bearer token (see
 * the top of this file).  Repeated calls return the same bytes. */
static int cuda_export_legacy_ipc(struct gshmd_backend *b, struct gshmd_alloc *mem,
                                  uint8_t handle_out[64]) {
  struct cuda_backend *cb = cuda_of(b);
  struct cuda_alloc *a = mem->priv;
  CUipcMemHandle h;
  int e;

  if (!a->legacy)
    return -ENOTSUP;
  if ((e = set_ctx(cb, a->d)))
    return e;
  if ((e = CU_ERR(cb, cuIpcGetMemHandle, &h, a->ptr)))
    return e;
  _Static_assert(sizeof(h.reserved) == 64, "cudaIpcMemHandle is 64 bytes");
  memcpy(handle_out, h.reserved, 64);
  return 0;
}

/* The fd for systemd's fd store: the same lent export; it alone keeps the
 * memory alive across a gshmd restart.  Legacy segments cannot be parked. */
static int cuda_park_fd(struct gshmd_backend *b, struct gshmd_alloc *mem, int *fd_out) {
  struct cuda_alloc *a = mem->priv;

  if (a->legacy) {
    gshm_log_debug("%s: legacy IPC segments cannot be parked in the fd store", a->d->pci);
    return -ENOTSUP;
  }
  return cuda_export_fd(b, mem, true, fd_out);
}

/* Checks that the imported allocation holds at least `size` bytes by
 * mapping that many: cuMemMap refuses a range past the allocation's end.
 * The driver has no call that returns an allocation's size. */
static int check_size(struct cuda_backend *cb, struct cuda_dev *d, CUmemGenericAllocationHandle h,
                      uint64_t size, uint64_t gran) {
  CUdeviceptr va = 0;
  int e;

  if ((e = set_ctx(cb, d)))
    return e;
  if ((e = CU_ERR(cb, cuMemAddressReserve, &va, size, gran, 0, 0)))
    return e;
  /* A refusal is the answer (the caller says what it means): debug. */
  if (!(e = CU_CALL(cb, NULL, GSHM_LOG_DEBUG, cuMemMap, va, size, 0, h, 0)))
    CU_UNDO(cb, cuMemUnmap, va, size);
  CU_UNDO(cb, cuMemAddressFree, va, size);
  return e;
}

/* Re-imports a parked fd after a restart.  Nothing handed back is trusted:
 * it must be a device allocation on the GPU the saved location
 * names (matched by UUID: indexes may change across a reboot of the
 * driver or a different CUDA_VISIBLE_DEVICES), at least `size` bytes. */
static int cuda_adopt_fd(struct gshmd_backend *b, int fd, const char *location, uint64_t size,
                         struct gshmd_alloc **out) {
  struct cuda_backend *cb = cuda_of(b);
  struct gshm_location loc;
  CUmemAllocationProp prop;
  CUmemGenericAllocationHandle h;
  struct cuda_dev *d;
  struct cuda_alloc *a;
  int e;

  if (gshm__location_parse(location, &loc) || loc.kind != GSHM_LOCATION_CUDA_UUID || size == 0)
    return -EINVAL;
  if (!(d = dev_by_uuid(cb, loc.uuid))) {
    gshm_log_err("%s: not among this daemon's GPUs", loc.uuid);
    return -ENODEV;
  }
  if (size % d->granularity)
    return -EINVAL;
  /* (no context needed: the GPU is named for a sticky error's message) */
  if ((e = CU_CALL(cb, d, GSHM_LOG_ERR, cuMemImportFromShareableHandle, &h,
                   (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)))
    return e;
  memset(&prop, 0, sizeof(prop));
  if ((e = CU_CALL(cb, d, GSHM_LOG_ERR, cuMemGetAllocationPropertiesFromHandle, &prop, h)))
    goto release_handle;
  /* (requestedHandleTypes is not reported for imported handles.) */
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != d->dev) {
    gshm_log_err("%s: parked fd is not a device allocation of this GPU (location type %d id %d)",
                 d->pci, (int)prop.location.type, prop.location.id);
    e = -EINVAL;
    goto release_handle;
  }
  if ((e = check_size(cb, d, h, size, d->granularity))) {
    gshm_log_err("%s: parked allocation is smaller than the recorded %" PRIu64 " bytes", d->pci,
                 size);
    e = -EINVAL;
    goto release_handle;
  }
  if (!(a = wrap(cb, d, size, d->granularity))) {
    e = -ENOMEM;
    goto release_handle;
  }
  a->handle = h;
  /* Kept: an imported handle cannot be exported again, so this fd is what
   * later opens get dups of (and what is parked again). */
  a->fd = fd;
  *out = &a->base;
  return 0;

release_handle:
  CU_UNDO(cb, cuMemRelease, h);
  return e;
}

static void cuda_free(struct gshmd_backend *b, struct gshmd_alloc *mem) {
  struct cuda_backend *cb = cuda_of(b);
  struct cuda_alloc *a;

  if (!mem)
    return;
  a = mem->priv;
  if (gshmd_backend_needs_restart(b)) {
    /* No driver call: the memory stays where the fd store keeps it, as
     * after a SIGKILL; the process's end releases our handle. */
  } else if (a->legacy) {
    /* cuMemFree needs the owning context current. */
    if (!set_ctx(cb, a->d))
      CU_UNDO(cb, cuMemFree, a->ptr);
  } else if (a->handle) {
    if (a->va) {
      CU_UNDO(cb, cuMemUnmap, a->va, a->base.size);
      CU_UNDO(cb, cuMemAddressFree, a->va, a->base.size);
    }
    /* Exported fds that clients still hold keep the physical memory
     * until they are closed; ours goes now. */
    CU_UNDO(cb, cuMemRelease, a->handle);
  }
  if (a->fd >= 0)
    close(a->fd);
  pthread_mutex_destroy(&a->va_lock);
  free(a);
}

/* ---- the cluster's access from gshmd itself ---- */

/* gshmd's own mapping of an allocation, made once (copies run on libuv's
 * pool: the first two may race to make it).  Each allocation has its own
 * lock: with one for all, a set's first staged serve mapped its hundreds
 * of segments one after another while the pool threads waited (on the
 * lent H200 machine, the 398 tensors of a model: 69 ms of maps, 484 ms
 * of the pool threads' time waiting). */

static int local_va(struct cuda_backend *cb, struct cuda_alloc *a, CUdeviceptr *va_out) {
  CUmemAccessDesc acc;
  CUdeviceptr va = 0;
  int e = 0;

  if (a->legacy) {
    *va_out = a->ptr;
    return 0;
  }
  pthread_mutex_lock(&a->va_lock);
  if (a->va)
    goto out;
  if ((e = set_ctx(cb, a->d)))
    goto out;
  if ((e = CU_ERR(cb, cuMemAddressReserve, &va, a->base.size, a->base.granularity, 0, 0)))
    goto out;
  if ((e = CU_ERR(cb, cuMemMap, va, a->base.size, 0, a->handle, 0)))
    goto release_va_range;
  memset(&acc, 0, sizeof(acc));
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = a->d->dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((e = CU_ERR(cb, cuMemSetAccess, va, a->base.size, &acc, 1)))
    goto unmap_range;
  a->va = va;
  goto out;
unmap_range:
  CU_UNDO(cb, cuMemUnmap, va, a->base.size);
release_va_range:
  CU_UNDO(cb, cuMemAddressFree, va, a->base.size);
out:
  *va_out = a->va;
  pthread_mutex_unlock(&a->va_lock);
  return e;
}

/* ->alloc_pull: a device segment for a pull, which writes every byte of
 * [0, size) before anyone but gshmd can read it (the segment is hidden
 * until then, and freed if the pull fails).  Only the granularity's tail
 * past size is zeroed, through gshmd's own mapping, made now and kept for
 * the staging copies (as cuda_alloc keeps the one it zeroes through):
 * zeroing all of it cost a set of hundreds of tensors made on the loop
 * one after another most of each segment's time.  uid: unused (no
 * recycling of device memory).  Errors as cuda_alloc. */
static int cuda_alloc_pull(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
                           uint32_t uid, struct gshmd_alloc **out) {
  struct cuda_backend *cb = cuda_of(b);
  CUmemGenericAllocationHandle h;
  struct cuda_alloc *a;
  struct cuda_dev *d;
  CUdeviceptr va;
  uint64_t gran, alloc;
  int e;

  (void)uid;
  if ((e = alloc_where(cb, loc, size, &d, &alloc)))
    return e;
  gran = d->granularity;
  if ((e = vmm_create(cb, d, alloc, "pull", &h)))
    return e;
  if (!(a = wrap(cb, d, alloc, gran))) {
    CU_UNDO(cb, cuMemRelease, h);
    return -ENOMEM;
  }
  a->handle = h;
  if ((e = local_va(cb, a, &va)) ||
      (alloc > size && ((e = CU_ERR(cb, cuMemsetD8, va + size, 0, alloc - size)) ||
                        (e = CU_ERR(cb, cuStreamSynchronize, NULL)))) ||
      (e = export_once(cb, a))) {
    cuda_free(b, &a->base);
    return e;
  }
  *out = &a->base;
  return 0;
}

static int cuda_local_ptr(struct gshmd_backend *b, struct gshmd_alloc *mem, void **ptr_out) {
  CUdeviceptr va;
  int e = local_va(cuda_of(b), mem->priv, &va);
  if (!e)
    *ptr_out = (void *)(uintptr_t)va;
  return e;
}

/* A stream of d's for one staging copy (the context of d current): a free
 * one, a new one while fewer than CUDA_COPY_STREAMS were made, else NULL
 * (the legacy default stream). */
static CUstream copy_stream_take(struct cuda_backend *cb, struct cuda_dev *d) {
  CUstream s = NULL;

  pthread_mutex_lock(&d->copy_lock);
  if (d->ncopy_free) {
    s = d->copy_free[--d->ncopy_free];
  } else if (d->ncopy_made < CUDA_COPY_STREAMS &&
             !CU_ERR(cb, cuStreamCreate, &s, CU_STREAM_NON_BLOCKING)) {
    d->ncopy_made++;
  }
  pthread_mutex_unlock(&d->copy_lock);
  return s;
}

/* Gives s back after a copy (ok: it ended without an error; a stream
 * that saw one is destroyed). */
static void copy_stream_put(struct cuda_backend *cb, struct cuda_dev *d, CUstream s, bool ok) {
  if (!s)
    return;
  pthread_mutex_lock(&d->copy_lock);
  if (ok) {
    d->copy_free[d->ncopy_free++] = s;
  } else {
    CU_UNDO(cb, cuStreamDestroy, s);
    d->ncopy_made--;
  }
  pthread_mutex_unlock(&d->copy_lock);
}

/* Each copy on a stream of its own, so that the pool threads' copies (the
 * serving side's into its slots, the pulling side's out of them, both
 * directions at once) overlap on the copy engines instead of queueing on
 * the legacy default stream, which cuMemcpyHtoD/DtoH use and which
 * serializes them within the context. */
static int cuda_copy_host(struct gshmd_backend *b, struct gshmd_alloc *mem, uint64_t offset,
                          void *host, uint64_t len, bool to_device) {
  struct cuda_backend *cb = cuda_of(b);
  struct cuda_alloc *a = mem->priv;
  CUdeviceptr va;
  CUstream s;
  int e;

  if (offset > mem->size || len > mem->size - offset)
    return -EINVAL;
  if ((e = local_va(cb, a, &va)) || (e = set_ctx(cb, a->d)))
    return e;
  s = copy_stream_take(cb, a->d);
  e = to_device ? CU_ERR(cb, cuMemcpyHtoDAsync, va + offset, host, len, s)
                : CU_ERR(cb, cuMemcpyDtoHAsync, host, va + offset, len, s);
  if (!e)
    e = CU_ERR(cb, cuStreamSynchronize, s);
  copy_stream_put(cb, a->d, s, !e);
  return e;
}

/* ---- device list ---- */

static int cuda_devices(struct gshmd_backend *b, Gshm__DeviceList *list_out) {
  struct cuda_backend *cb = cuda_of(b);

  for (unsigned i = 0; i < cb->n; i++) {
    size_t fr = 0, total = 0;
    if (!set_ctx(cb, &cb->devs[i]) && !CU_ERR(cb, cuMemGetInfo, &fr, &total))
      cb->info[i].free_memory = fr;
  }
  list_out->n_devices = cb->n;
  list_out->devices = cb->infop;
  return 0;
}

static void cuda_destroy(struct gshmd_backend *b) {
  struct cuda_backend *cb = cuda_of(b);

  if (!cb)
    return;
  for (unsigned i = 0; cb->devs && i < cb->n && !gshmd_backend_needs_restart(b); i++) {
    struct cuda_dev *d = &cb->devs[i];
    if (d->ncopy_free && !set_ctx(cb, d))
      while (d->ncopy_free)
        CU_UNDO(cb, cuStreamDestroy, d->copy_free[--d->ncopy_free]);
    if (d->ctx)
      cb->drv->cuDevicePrimaryCtxRelease(d->dev);
  }
  free(cb->devs);
  free(cb->info);
  free(cb->infop);
  free(cb->peers);
  free(cb->peerp);
  free(cb);
}

static const struct gshmd_backend_ops cuda_ops = {
    .alloc = cuda_alloc,
    .alloc_pull = cuda_alloc_pull,
    .export_fd = cuda_export_fd,
    .export_legacy_ipc = cuda_export_legacy_ipc,
    .park_fd = cuda_park_fd,
    .adopt_fd = cuda_adopt_fd,
    .free = cuda_free,
    .local_ptr = cuda_local_ptr,
    .copy_host = cuda_copy_host,
    .host_alloc = gshmd__cuda_host_alloc,
    .host_free = gshmd__cuda_host_free,
    .devices = cuda_devices,
    .destroy = cuda_destroy,
};

int gshmd_backend_cuda_create(const struct gshmd_config *cfg, struct gshmd_backend **out,
                              char *fault_out) {
  struct cuda_backend *cb;
  int e;

  (void)cfg;
  cb = calloc(1, sizeof(*cb));
  if (!cb)
    return -ENOMEM;
  cb->base.name = "cuda";
  cb->base.ops = &cuda_ops;
  cb->base.priv = cb;
  /* The caller logs the outcome once at notice level; the driver loader
   * adds its reason at info. */
  if ((e = gshm__cudadrv_load(GSHM_LOG_INFO, &cb->drv)))
    goto fail;
  if ((e = gshmd__cuda_setup_devices(cb)))
    goto fail;
  {
    char thp[32];
    cb->host_thp = gshmd_thp_policy("enabled", thp, sizeof(thp)) &&
                   (!strcmp(thp, "madvise") || !strcmp(thp, "always"));
  }
  *out = &cb->base;
  return 0;

fail:
  /* a sticky error (logged): this process can do nothing on a GPU, and
   * only another can tell whether the GPU works (main.c's start) */
  if (cb->base.needs_restart) {
    e = -ENOTRECOVERABLE;
    if (fault_out)
      memcpy(fault_out, cb->base.fault, GSHMD_FAULT_MAX);
  }
  if (cb->drv)
    cuda_destroy(&cb->base);
  else
    free(cb);
  return e;
}
