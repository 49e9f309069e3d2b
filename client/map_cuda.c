/* SPDX-License-Identifier: Apache-2.0 */
/* Device segments in libgshm: mapping a cuMem POSIX fd, staging copies for
 * byte access, and the legacy cudaIpcMemHandle open.
 *
 * A device segment's fd (from gshmd, one per lease) is imported once per
 * lease, given a virtual address range of its own, mapped, and made
 * accessible to the requested devices.  The lease cache in client.c shares
 * this one mapping between every gshm_open() of the same segment in this
 * process, so a re-open costs no import.
 *
 * Devices are matched by UUID, never by index: the daemon's "cuda:1" and
 * this process's ordinal 1 differ whenever CUDA_VISIBLE_DEVICES (or a
 * container's device list) renumbers them.  The segment's canonical
 * location, "cuda:GPU-<uuid>", names the owning GPU. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "client_internal.h"
#include "cudadrv.h"
#include "fork.h"
#include "log.h"
#include "util.h"

/* Most devices one mapping gives access to (a node's GPUs); its
 * MapReport names each (gshmd serves a request of at most
 * GSHM_WIRE_REQUEST_FIELDS_MAX fields). */
#define MAP_MAX_DEVICES GSHM_WIRE_MAP_DEVICES_MAX

struct device_map {
  const struct gshm_cudadrv *drv;
  CUmemGenericAllocationHandle handle; /* imported; keeps the memory until unmap */
  CUdeviceptr va;
  uint64_t size;
  CUdevice owner;                      /* the segment's GPU, local ordinal */
  CUdevice copy_dev;                   /* a device with access: owner when listed */
  CUcontext copy_ctx;                  /* its primary context, retained */
  unsigned copy_retains;               /* retains of it to release at unmap (1, more after
                                          resets: copy_ctx_live) */
  size_t ndevices;
  CUdevice devices[MAP_MAX_DEVICES];
  char uuid_buf[MAP_MAX_DEVICES][48];
  char *uuids[MAP_MAX_DEVICES];
  unsigned fork_gen;                   /* gshm__fork_gen() when mapped: see mapped_by_parent */
  bool read_only;                      /* every device's access is PROT_READ */
  struct device_map *next;             /* in `mappings`, under GSHM__LOCK_GPUS */
};

/* This process's device mappings, for gshm__map_access. */
static struct device_map *mappings;

static void mappings_add(struct device_map *m) {
  gshm__fork_lock(GSHM__LOCK_GPUS);
  m->next = mappings;
  mappings = m;
  gshm__fork_unlock(GSHM__LOCK_GPUS);
}

static void mappings_remove(struct device_map *m) {
  gshm__fork_lock(GSHM__LOCK_GPUS);
  for (struct device_map **pp = &mappings; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  gshm__fork_unlock(GSHM__LOCK_GPUS);
}

int gshm__map_access(uintptr_t addr, size_t bytes, int dev, unsigned long long *flags_out) {
  int found = 0;

  gshm__fork_lock(GSHM__LOCK_GPUS);
  for (struct device_map *m = mappings; m && !found; m = m->next) {
    if (addr < m->va && bytes > m->va - addr) {
      found = 2; /* starts before the mapping and runs into it */
      *flags_out = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      break;
    }
    if (addr < m->va || addr - m->va >= m->size)
      continue;
    found = 1;
    *flags_out = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    if (bytes > m->size - (addr - m->va)) {
      found = 2; /* runs past the mapping: no access covers it */
      break;
    }
    for (size_t i = 0; i < m->ndevices; i++)
      if (m->devices[i] == (CUdevice)dev)
        *flags_out = m->read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                  : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  gshm__fork_unlock(GSHM__LOCK_GPUS);
  return found;
}

#define CU_LIB(drv, fn, ...) GSHM_CU_ERR(drv, fn, __VA_ARGS__)
#define CU_UNDO(drv, fn, ...) GSHM_CU_WARN(drv, fn, __VA_ARGS__) /* unwinding */

/* Whether m was made by a process this one was forked from.  Its handle,
 * address range and context are that process's CUDA state, which a forked
 * child cannot use (common/fork.h): no driver call may touch them here. */
static bool mapped_by_parent(const struct device_map *m) {
  return m->fork_gen != gshm__fork_gen();
}

/* The driver for mapping device segments: -ENOTSUP when there is none
 * (reason logged at INFO once: a host-only machine is no error), -ECHILD
 * in a child forked from a process that had loaded it (cudadrv.h). */
static int map_driver_load(const struct gshm_cudadrv **drv_out) {
  int e = gshm__cudadrv_load(GSHM_LOG_INFO, drv_out);
  /* No driver (or no GPU) here: device segments cannot be mapped. */
  return e == -ECHILD ? e : e ? -ENOTSUP : 0;
}

static int device_uuid(const struct gshm_cudadrv *drv, CUdevice dev, char buf[48]) {
  CUuuid u;
  int e = CU_LIB(drv, cuDeviceGetUuid, &u, dev);
  if (!e)
    gshm__format_gpu_uuid((const unsigned char *)u.bytes, buf);
  return e;
}

/* This process's GPUs by UUID, kept once read in full: a first map should
 * cost the driver's import and map, not an enumeration.  A list that could
 * not be read in full (a transient cuDeviceGetCount, cuDeviceGet or
 * cuDeviceGetUuid failure) serves the map that read it and is read again
 * by the next one, never kept for the life of the process.  Under lock
 * GSHM__LOCK_GPUS (common/fork.h: a fork waits for a read to end, and the
 * child gets the list whole; a child whose parent read it cannot use
 * CUDA, and its maps end with -ECHILD before they look). */
static struct {
  bool complete; /* read in full: kept */
  int count;
  CUdevice dev[MAP_MAX_DEVICES];
  char uuid[MAP_MAX_DEVICES][48];
} local;

/* Reads the list unless it is kept; its lock held.  Returns 0, or the
 * error of a cuDeviceGetCount that failed (the list is then empty). */
static int local_devices_read(const struct gshm_cudadrv *drv) {
  int count = 0, e;

  if (local.complete)
    return 0;
  local.count = 0;
  if ((e = CU_LIB(drv, cuDeviceGetCount, &count)))
    return e;
  local.complete = true;
  for (int i = 0; i < count && local.count < MAP_MAX_DEVICES; i++) {
    CUdevice d;
    if (CU_LIB(drv, cuDeviceGet, &d, i) || device_uuid(drv, d, local.uuid[local.count])) {
      local.complete = false; /* that GPU is left out of this map only */
      continue;
    }
    local.dev[local.count++] = d;
  }
  return 0;
}

/* Copies the UUID of local ordinal d to buf; -ENODEV when it is not known. */
static int local_uuid(CUdevice d, char buf[48]) {
  int e = -ENODEV;

  gshm__fork_lock(GSHM__LOCK_GPUS);
  for (int i = 0; i < local.count; i++) {
    if (local.dev[i] == d) {
      snprintf(buf, 48, "%s", local.uuid[i]);
      e = 0;
      break;
    }
  }
  gshm__fork_unlock(GSHM__LOCK_GPUS);
  return e;
}

/* The local ordinal of the GPU named by location "cuda:GPU-<uuid>". */
static int owner_device(const struct gshm_cudadrv *drv, const char *location, CUdevice *dev_out) {
  struct gshm_location loc;
  int e;

  if (gshm__location_parse(location, &loc) || loc.kind != GSHM_LOCATION_CUDA_UUID)
    return -EPROTO; /* a device segment's reply always names its GPU's UUID */
  gshm__fork_lock(GSHM__LOCK_GPUS);
  if (!(e = local_devices_read(drv))) {
    e = -ENODEV;
    for (int i = 0; i < local.count; i++) {
      if (!strcasecmp(local.uuid[i], loc.uuid)) {
        *dev_out = local.dev[i];
        e = 0;
        break;
      }
    }
  }
  gshm__fork_unlock(GSHM__LOCK_GPUS);
  if (e == -ENODEV)
    gshm_log_info("%s: not visible to this process (CUDA_VISIBLE_DEVICES?)", loc.uuid);
  return e;
}

/* Fills m->uuid_buf[i] and m->uuids[i] for m->devices[i]. */
static int name_device(struct device_map *m, size_t i) {
  if (local_uuid(m->devices[i], m->uuid_buf[i]) &&
      device_uuid(m->drv, m->devices[i], m->uuid_buf[i]))
    return -EIO;
  m->uuids[i] = m->uuid_buf[i];
  return 0;
}

/* Fills m->devices: the listed client-local ordinals, or every visible
 * device that can reach the owner (the owner first).  Each must reach the
 * owner: itself or by peer access. */
static int pick_devices(const struct gshm_cudadrv *drv, struct device_map *m, const int *devices,
                        size_t ndevices) {
  int count = 0, e;

  if ((e = CU_LIB(drv, cuDeviceGetCount, &count)))
    return e;
  m->ndevices = 0;
  if (!devices) {
    m->devices[m->ndevices++] = m->owner;
    for (int i = 0; i < count && m->ndevices < MAP_MAX_DEVICES; i++) {
      CUdevice d;
      int can = 0;
      if (CU_LIB(drv, cuDeviceGet, &d, i) || d == m->owner)
        continue;
      if (!GSHM_CU(drv, GSHM_LOG_DEBUG, cuDeviceCanAccessPeer, &can, d, m->owner) && can)
        m->devices[m->ndevices++] = d;
    }
    return 0;
  }
  if (ndevices == 0 || ndevices > MAP_MAX_DEVICES)
    return -EINVAL;
  for (size_t k = 0; k < ndevices; k++) {
    CUdevice d;
    int can = 0;
    bool dup = false;
    if (devices[k] < 0 || devices[k] >= count)
      return -EINVAL;
    if ((e = CU_LIB(drv, cuDeviceGet, &d, devices[k])))
      return e;
    for (size_t j = 0; j < m->ndevices; j++)
      dup |= m->devices[j] == d;
    if (dup)
      continue;
    if (d != m->owner &&
        (GSHM_CU(drv, GSHM_LOG_DEBUG, cuDeviceCanAccessPeer, &can, d, m->owner) || !can)) {
      gshm_log_info("device %d cannot reach the segment's GPU (no peer access)", devices[k]);
      return -EXDEV; /* (gshm_copy's errno for no peer path; -ENODEV: no such GPU here) */
    }
    m->devices[m->ndevices++] = d;
  }
  return 0;
}

/* Whether device d's primary context is active (made by the CUDA
 * runtime, torch, CuPy, or a retain of ours). */
static bool primary_active(const struct gshm_cudadrv *drv, CUdevice d) {
  unsigned flags = 0;
  int active = 0;
  return drv->cuDevicePrimaryCtxGetState(d, &flags, &active) == CUDA_SUCCESS && active;
}

/* The device of m->devices whose primary context the mapping retains (for
 * gshm_read/gshm_write's staging copies): the calling thread's current
 * device where its primary context is active, else the first listed
 * whose primary context is active (the owner first), else the current
 * device, the owner or the first listed.  A retain of an inactive primary
 * context creates it, hundreds of MiB of the GPU's memory for as long as
 * the mapping: a worker of GPU 1 mapping a GPU 0 segment for every device
 * must not leave a context on GPU 0, nor a thread whose current context
 * is one of its own (cuCtxCreate) make a primary one beside it while a
 * listed GPU's primary context is active (where none is, one is made: on
 * the current context's GPU). */
static CUdevice pick_copy_dev(const struct gshm_cudadrv *drv, const struct device_map *m) {
  CUdevice cur = -1, fallback = m->devices[0];
  CUcontext ctx = NULL;
  bool listed = false;

  if (drv->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx &&
      drv->cuCtxGetDevice(&cur) == CUDA_SUCCESS)
    for (size_t i = 0; i < m->ndevices; i++)
      listed |= m->devices[i] == cur;
  if (listed && primary_active(drv, cur))
    return cur;
  for (size_t i = 0; i < m->ndevices; i++)
    if (m->devices[i] == m->owner) {
      fallback = m->owner;
      if (primary_active(drv, m->owner))
        return m->owner;
    }
  for (size_t i = 0; i < m->ndevices; i++)
    if (primary_active(drv, m->devices[i]))
      return m->devices[i];
  return listed ? cur : fallback;
}

/* The reply's size and granularity (*gran_out; 2 MiB where it gives
 * none) go to the driver as they are: one that cannot describe a cuMem
 * allocation is the daemon's error (-EPROTO), not an -EINVAL of the
 * caller's arguments (the driver refuses a range past the allocation's
 * end itself: cuMemMap). */
static int map_geometry(const struct gshm__lease *l, size_t *gran_out) {
  size_t gran = l->info.granularity ? l->info.granularity : 2u << 20;

  if (!l->info.size || (gran & (gran - 1)) || l->info.size % gran) {
    gshm_log_err("segment '%s': the daemon's size %llu is no multiple of its granularity %llu",
                 l->info.name, (unsigned long long)l->info.size, (unsigned long long)gran);
    return -EPROTO;
  }
  *gran_out = gran;
  return 0;
}

/* Imports l's fd into m->handle and checks that the allocation is where
 * the daemon says: its location.id is an ordinal of this process, which
 * we compare by UUID.  Returns 0, or a negative errno with no handle
 * held. */
static int map_import(const struct gshm_cudadrv *drv, struct device_map *m,
                      const struct gshm__lease *l) {
  CUmemAllocationProp prop;
  char owner_uuid[48];
  int e;

  if ((e = CU_LIB(drv, cuMemImportFromShareableHandle, &m->handle, (void *)(uintptr_t)l->fd,
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)))
    return e;
  memset(&prop, 0, sizeof(prop));
  if ((e = CU_LIB(drv, cuMemGetAllocationPropertiesFromHandle, &prop, m->handle)))
    goto release_handle;
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != m->owner) {
    if (!device_uuid(drv, prop.location.id, owner_uuid))
      gshm_log_err("segment '%s' is on %s, not on %s", l->info.name, owner_uuid,
                   l->info.location);
    e = -ENODEV;
    goto release_handle;
  }
  return 0;

release_handle:
  CU_UNDO(drv, cuMemRelease, m->handle);
  return e;
}

/* Maps m->handle at a new range m->va (alignment gran) with access for
 * every device of m (read-only for a read lease), and names the devices.
 * Returns 0, or a negative errno with nothing mapped or reserved. */
static int map_range(const struct gshm_cudadrv *drv, struct device_map *m, size_t gran,
                     gshm_access_t access) {
  CUmemAccessDesc acc[MAP_MAX_DEVICES];
  int e;

  if ((e = CU_LIB(drv, cuMemAddressReserve, &m->va, m->size, gran, 0, 0)))
    return e;
  if ((e = CU_LIB(drv, cuMemMap, m->va, m->size, 0, m->handle, 0)))
    goto release_va_range;
  memset(acc, 0, sizeof(acc));
  for (size_t i = 0; i < m->ndevices; i++) {
    acc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[i].location.id = m->devices[i];
    /* Read-only leases get a read-only mapping: the driver refuses writes
     * through it (a kernel store faults, a copy into it fails). */
    acc[i].flags = access == GSHM_ACCESS_READ ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                              : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if ((e = CU_LIB(drv, cuMemSetAccess, m->va, m->size, acc, m->ndevices)))
    goto unmap_range;
  for (size_t i = 0; i < m->ndevices; i++)
    if ((e = name_device(m, i)))
      goto unmap_range;
  return 0;

unmap_range:
  CU_UNDO(drv, cuMemUnmap, m->va, m->size);
release_va_range:
  CU_UNDO(drv, cuMemAddressFree, m->va, m->size);
  return e;
}

int gshm__map_device(struct gshm__lease *l, const int *devices, size_t ndevices,
                     char ***uuids_out, size_t *n_out) {
  const struct gshm_cudadrv *drv;
  struct device_map *m;
  CUcontext ctx = NULL;
  size_t gran;
  int e;

  if (l->fd < 0)
    return -EBADF; /* a legacy IPC lease: no fd to map */
  if ((e = map_driver_load(&drv)))
    return e;
  if (!(m = calloc(1, sizeof(*m))))
    return -ENOMEM;
  m->drv = drv;
  m->fork_gen = gshm__fork_gen();
  m->size = l->info.size;
  if ((e = map_geometry(l, &gran)))
    goto free_map;
  if ((e = owner_device(drv, l->info.location, &m->owner)))
    goto free_map;
  if ((e = pick_devices(drv, m, devices, ndevices)))
    goto free_map;
  m->copy_dev = pick_copy_dev(drv, m);
  /* The VMM calls need no context, but the staging copies and the peer
   * mappings want a live one on a device with access: retain its primary
   * context (the CUDA runtime shares it) for as long as the mapping. */
  if ((e = CU_LIB(drv, cuDevicePrimaryCtxRetain, &m->copy_ctx, m->copy_dev)))
    goto free_map;
  m->copy_retains = 1;
  if ((e = CU_LIB(drv, cuCtxPushCurrent, m->copy_ctx)))
    goto release_ctx;
  if ((e = map_import(drv, m, l)))
    goto pop_ctx;
  if ((e = map_range(drv, m, gran, l->access)))
    goto release_handle;
  CU_LIB(drv, cuCtxPopCurrent, &ctx);
  m->read_only = l->access == GSHM_ACCESS_READ;
  mappings_add(m);
  l->addr = (void *)(uintptr_t)m->va;
  l->map_size = m->size;
  l->device_map = m;
  *uuids_out = m->uuids;
  *n_out = m->ndevices;
  gshm_log_debug("segment '%s' mapped at 0x%llx on %zu device(s)", l->info.name,
                 (unsigned long long)m->va, m->ndevices);
  return 0;

release_handle:
  CU_UNDO(drv, cuMemRelease, m->handle);
pop_ctx:
  CU_UNDO(drv, cuCtxPopCurrent, &ctx);
release_ctx:
  CU_UNDO(drv, cuDevicePrimaryCtxRelease, m->copy_dev);
free_map:
  free(m);
  return e;
}

int gshm__map_device_add(struct gshm__lease *l, const int *devices, size_t ndevices,
                         char ***uuids_out, size_t *n_out) {
  struct device_map *m = l->device_map, want;
  CUmemAccessDesc acc[MAP_MAX_DEVICES];
  size_t nacc = 0, first = m ? m->ndevices : 0;
  int e;

  *n_out = 0;
  if (!m)
    return -EINVAL;
  if (mapped_by_parent(m))
    return -ECHILD;
  memset(&want, 0, sizeof(want));
  want.drv = m->drv;
  want.owner = m->owner;
  if ((e = pick_devices(m->drv, &want, devices, ndevices)))
    return e;
  memset(acc, 0, sizeof(acc));
  for (size_t k = 0; k < want.ndevices; k++) {
    bool have = false;
    for (size_t j = 0; j < m->ndevices; j++)
      have |= m->devices[j] == want.devices[k];
    if (have || first + nacc >= MAP_MAX_DEVICES)
      continue;
    acc[nacc].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[nacc].location.id = want.devices[k];
    acc[nacc].flags = l->access == GSHM_ACCESS_READ ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                                    : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    nacc++;
  }
  if (!nacc)
    return 0;
  if ((e = CU_LIB(m->drv, cuMemSetAccess, m->va, m->size, acc, nacc)))
    return e;
  for (size_t k = 0; k < nacc; k++) {
    size_t i = m->ndevices + k; /* past ndevices: gshm__map_access reads none of it yet */
    m->devices[i] = acc[k].location.id;
    if (name_device(m, i)) { /* it has access: named by ordinal then */
      snprintf(m->uuid_buf[i], sizeof(m->uuid_buf[0]), "cuda:%d", (int)acc[k].location.id);
      m->uuids[i] = m->uuid_buf[i];
    }
  }
  gshm__fork_lock(GSHM__LOCK_GPUS); /* gshm__map_access reads ndevices */
  m->ndevices += nacc;
  gshm__fork_unlock(GSHM__LOCK_GPUS);
  gshm_log_debug("segment '%s': access added for %zu device(s)", l->info.name, nacc);
  *uuids_out = m->uuids;
  *n_out = m->ndevices;
  return 0;
}

size_t gshm__map_device_uuids(const struct gshm__lease *l, char ***uuids_out) {
  struct device_map *m = l->device_map;
  if (!m)
    return 0;
  *uuids_out = m->uuids;
  return m->ndevices;
}

int gshm__unmap_device(struct gshm__lease *l) {
  struct device_map *m = l->device_map;

  if (!m)
    return 0;
  mappings_remove(m); /* (copies refuse the range from here on) */
  if (mapped_by_parent(m)) {
    free(m); /* the child's copy of the record goes; the parent's mapping stays */
  } else {
    m->next = l->client->retired; /* unmapped by gshm__client_unlock, after a wait */
    l->client->retired = m;
  }
  l->device_map = NULL;
  l->addr = NULL;
  l->map_size = 0;
  return 0;
}

/* Waits for the work queued in every context that may use m's range:
 * the calling thread's current one, and the primary context of each
 * device m gave access to where it is active (gshm__cuda_ctx_wait: no
 * wait in a context where a capture it can see runs; then the mapping
 * waits for a later flush).  CUDA_SUCCESS, or the first failed or
 * skipped wait's result (the other contexts are still waited for). */
static CUresult wait_users(struct device_map *m) {
  const struct gshm_cudadrv *drv = m->drv;
  CUcontext cur = NULL, ctx, popped;
  CUresult first = CUDA_SUCCESS, r;

  if (drv->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur && (r = gshm__cuda_ctx_wait(drv)))
    first = r;
  for (size_t i = 0; i < m->ndevices; i++) {
    unsigned flags = 0;
    int active = 0;

    if (drv->cuDevicePrimaryCtxGetState(m->devices[i], &flags, &active) != CUDA_SUCCESS ||
        !active || CU_LIB(drv, cuDevicePrimaryCtxRetain, &ctx, m->devices[i]))
      continue;
    if (ctx != cur && (r = drv->cuCtxPushCurrent(ctx)) == CUDA_SUCCESS) {
      r = gshm__cuda_ctx_wait(drv);
      CU_LIB(drv, cuCtxPopCurrent, &popped);
    }
    if (ctx != cur && r != CUDA_SUCCESS && first == CUDA_SUCCESS)
      first = r;
    CU_LIB(drv, cuDevicePrimaryCtxRelease, m->devices[i]);
  }
  return first;
}

/* Unmaps, frees the range of and releases one retired mapping; 0 or -EIO
 * (the mapping is then leaked, and logged by CU_LIB). */
static int unmap_now(struct device_map *m) {
  const struct gshm_cudadrv *drv = m->drv;
  int e = 0, r;

  if ((r = CU_LIB(drv, cuMemUnmap, m->va, m->size)))
    e = r;
  if (!r && (r = CU_LIB(drv, cuMemAddressFree, m->va, m->size)))
    e = r;
  if ((r = CU_LIB(drv, cuMemRelease, m->handle)))
    e = e ? e : r;
  for (; m->copy_retains; m->copy_retains--)
    CU_LIB(drv, cuDevicePrimaryCtxRelease, m->copy_dev);
  free(m);
  return e ? -EIO : 0;
}

int gshm__retire_device_maps(struct gshm_client *c, struct device_map *list, bool last) {
  struct device_map *kept = NULL, *m;
  int e = 0;

  while ((m = list)) {
    CUresult r;

    list = m->next;
    if (mapped_by_parent(m)) { /* (retired before a fork, flushed in the child) */
      free(m);
      continue;
    }
    r = wait_users(m);
    /* a context that failed for good (a sticky error) runs nothing more:
     * its range can go; another failure (a stream capture under way
     * refuses a context's wait) keeps it for the next flush */
    if (r == CUDA_SUCCESS || gshm__cuda_sticky(r)) {
      int u = unmap_now(m);
      e = e ? e : u;
    } else if (last) { /* the range and the memory stay this process's */
      gshm_log_err("a device mapping of %" PRIu64 " bytes is left mapped: the wait for its "
                   "queued work failed (CUresult %d)", m->size, (int)r);
      free(m);
      e = e ? e : -EIO;
    } else {
      m->next = kept;
      kept = m;
    }
  }
  if (kept) {
    pthread_mutex_lock(&c->lock);
    for (m = kept; m->next; m = m->next)
      ;
    m->next = c->retired;
    c->retired = kept;
    pthread_mutex_unlock(&c->lock);
  }
  return e;
}

/* m's context, live again where a reset of the primary context
 * (cuDevicePrimaryCtxReset, cudaDeviceReset) destroyed it since the map:
 * the handle stays that of the device's primary context, and a retain
 * makes the context again (the mapping survives a reset: checked on an
 * H100, driver 580).  A reset does not release a retain (the driver API's
 * cuDevicePrimaryCtxReset), so this one is released at unmap as well.
 * 0 or the retain's error. */
static int copy_ctx_live(struct device_map *m) {
  unsigned flags = 0;
  int active = 0, e;

  if (m->drv->cuDevicePrimaryCtxGetState(m->copy_dev, &flags, &active) == CUDA_SUCCESS && active)
    return 0;
  if ((e = CU_LIB(m->drv, cuDevicePrimaryCtxRetain, &m->copy_ctx, m->copy_dev)))
    return e;
  m->copy_retains++;
  return 0;
}

int gshm__device_rw(struct gshm__lease *l, uint64_t offset, void *host, size_t bytes, bool write) {
  struct device_map *m = l->device_map;
  CUcontext ctx = NULL;
  int e;

  if (!m)
    return -EINVAL;
  if (offset > m->size || bytes > m->size - offset)
    return -ERANGE;
  if (mapped_by_parent(m))
    return -ECHILD;
  if ((e = copy_ctx_live(m)) || (e = CU_LIB(m->drv, cuCtxPushCurrent, m->copy_ctx)))
    return e;
  /* From pageable memory cuMemcpyHtoD may return once the bytes are in
   * the driver's staging buffers, before they reach the GPU (CUDA "API
   * synchronization behavior"): gshm_write promises they are there, so
   * wait for the (legacy default) stream it ran on.  DtoH into pageable
   * memory returns with the bytes in place. */
  if (write) {
    e = CU_LIB(m->drv, cuMemcpyHtoD, m->va + offset, host, bytes);
    if (!e)
      e = CU_LIB(m->drv, cuStreamSynchronize, NULL);
  } else {
    e = CU_LIB(m->drv, cuMemcpyDtoH, host, m->va + offset, bytes);
  }
  CU_LIB(m->drv, cuCtxPopCurrent, &ctx);
  return e;
}

/* ---- legacy IPC ---- */

int gshm_open_legacy_ipc(gshm_client_t *c, const char *name,
                         uint8_t handle_out[GSHM_LEGACY_IPC_HANDLE_SIZE],
                         gshm_segment_t **seg_out) {
  Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  int fd = -1, e;

  if (!c || !name || !handle_out || !seg_out)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  m.name = (char *)name;
  m.access = GSHM__ACCESS__ACCESS_READ_WRITE; /* a legacy handle maps read-write */
  m.legacy_ipc = true;
  if ((e = gshm__client_lock(c)))
    return e;
  if ((e = gshm__request(c, GSHM_WIRE_OPEN, &m.base, &reply, &fd)))
    goto unlock;
  /* gshm__lease_from_grant takes a grant with the handle and no fd, or one
   * with an fd and no handle: only the first answers this request (an fd
   * grant from a confused daemon is -EPROTO, not a read of a NULL handle) */
  if (reply->body_case == GSHM__REPLY__BODY_GRANT &&
      reply->grant->legacy_ipc_handle.len != GSHM_LEGACY_IPC_HANDLE_SIZE) {
    if (fd >= 0)
      close(fd);
    e = -EPROTO;
  } else if (!(e = gshm__lease_from_grant(c, reply, fd, seg_out))) {
    memcpy(handle_out, reply->grant->legacy_ipc_handle.data, GSHM_LEGACY_IPC_HANDLE_SIZE);
  }
  gshm__reply__free_unpacked(reply, NULL);
unlock:
  pthread_mutex_unlock(&c->lock);
  return e;
}
