/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's GPUs: at start, each device's identity, memory,
 * granularity and primary context; peer access between every pair that
 * supports it; the NVLink link counts that NVML reports (libnvidia-ml.so.1,
 * dlopen'ed; -1 without it); the device list with its P2P matrix that
 * `gshmctl devices` shows; and, at any time, what a failed driver call
 * means (gshmd__cuda_failed: a sticky error asks for a restart).  Device
 * messages start with the GPU's PCI bus id (docs/ARCHITECTURE.md "Errors
 * and logging"). */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_internal.h"
#include "log.h"

/* ---- NVML, the few entry points we need (no nvml.h at build time) ---- */

typedef struct nvml_device_st *nvml_device_t;
typedef struct {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_subsystem_id;
  char bus_id[32];
} nvml_pci_info_t; /* nvmlPciInfo_t */

enum {
  NVML_SUCCESS = 0,
  NVML_FEATURE_ENABLED = 1,
  NVML_NVLINK_DEVICE_TYPE_GPU = 0,
  NVML_NVLINK_DEVICE_TYPE_SWITCH = 2,
  NVML_MAX_LINKS = 64, /* upper bound for the probe loop; NVML says when to stop */
};

struct nvml {
  void *lib;
  int (*init)(void);
  int (*shutdown)(void);
  int (*by_uuid)(const char *uuid, nvml_device_t *dev);
  int (*link_state)(nvml_device_t dev, unsigned link, int *enabled);
  int (*remote_pci)(nvml_device_t dev, unsigned link, nvml_pci_info_t *pci);
  int (*remote_type)(nvml_device_t dev, unsigned link, int *type); /* optional */
};

static int attr(struct cuda_backend *cb, CUdevice dev, CUdevice_attribute a) {
  int v = 0;
  if (GSHM_CU(cb->drv, GSHM_LOG_DEBUG, cuDeviceGetAttribute, &v, a, dev))
    return 0;
  return v;
}

static int setup_device(struct cuda_backend *cb, int ordinal, struct cuda_dev *d) {
  CUmemAllocationProp prop;
  CUuuid uuid;
  size_t gran = 0, total = 0;
  int e;

  pthread_mutex_init(&d->copy_lock, NULL); /* (a default mutex holds nothing to destroy) */
  if ((e = CU_ERR(cb, cuDeviceGet, &d->dev, ordinal)))
    return e;
  if ((e = CU_ERR(cb, cuDeviceGetUuid, &uuid, d->dev)))
    return e;
  gshm__format_gpu_uuid((const unsigned char *)uuid.bytes, d->uuid);
  if ((e = CU_ERR(cb, cuDeviceGetPCIBusId, d->pci, (int)sizeof(d->pci), d->dev)))
    return e;
  if ((e = CU_ERR(cb, cuDeviceGetName, d->name, (int)sizeof(d->name), d->dev)))
    return e;
  if ((e = CU_ERR(cb, cuDeviceTotalMem, &total, d->dev)))
    return e;
  d->total = total;
  d->cc_major = attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  d->cc_minor = attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  d->pci_domain = (unsigned)attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  d->pci_bus = (unsigned)attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  d->pci_device = (unsigned)attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  d->vmm = attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) &&
           attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  d->rdma_vmm = attr(cb, d->dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) > 0;
  prop = device_prop(d);
  if (d->vmm && !GSHM_CU(cb->drv, GSHM_LOG_WARNING, cuMemGetAllocationGranularity, &gran, &prop,
                         CU_MEM_ALLOC_GRANULARITY_MINIMUM) && gran)
    d->granularity = gran;
  else
    d->granularity = 2u << 20; /* cuMemAlloc's large-page size */
  /* (d named: no context is current yet to name it) */
  if ((e = CU_CALL(cb, d, GSHM_LOG_ERR, cuDevicePrimaryCtxRetain, &d->ctx, d->dev))) {
    d->ctx = NULL;
    return e;
  }
  gshm_log_info("%s: cuda:%d %s %s, %.1f GiB, cc %d.%d, granularity %" PRIu64 " KiB%s%s", d->pci,
                ordinal, d->uuid, d->name, (double)d->total / (1 << 30), d->cc_major, d->cc_minor,
                d->granularity >> 10, d->vmm ? "" : ", no POSIX-fd cuMem (legacy IPC only)",
                d->rdma_vmm ? ", GPUDirect RDMA-capable allocations" : "");
  return 0;
}

/* Enables peer access from every GPU's primary context to every other
 * that it can reach, so that anything gshmd itself does across GPUs works,
 * and reports the pairs that cannot. */
static void setup_peer_access(struct cuda_backend *cb) {
  for (unsigned i = 0; i < cb->n; i++) {
    for (unsigned j = 0; j < cb->n; j++) {
      int can = 0;
      CUresult r;
      if (i == j)
        continue;
      if (GSHM_CU(cb->drv, GSHM_LOG_WARNING, cuDeviceCanAccessPeer, &can, cb->devs[i].dev,
                  cb->devs[j].dev) || !can) {
        gshm_log_info("%s: no peer access to %s", cb->devs[i].pci, cb->devs[j].pci);
        continue;
      }
      if (set_ctx(cb, &cb->devs[i]))
        continue;
      r = cb->drv->cuCtxEnablePeerAccess(cb->devs[j].ctx, 0);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        gshm__cuda_log(GSHM_LOG_WARNING, r, "cuCtxEnablePeerAccess", __FILE__, __LINE__);
    }
  }
}

/* Loads NVML and counts, for each GPU, its active NVLinks to each other
 * GPU (direct links) and to NVSwitches.  Best effort: without NVML the
 * counts stay -1. */
static void setup_nvml(struct cuda_backend *cb) {
  struct nvml nv = {0};

  nv.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nv.lib) {
    gshm_log_info("nvml: cannot load libnvidia-ml.so.1 (%s); NVLink counts unavailable",
                  dlerror());
    return;
  }
  nv.init = (int (*)(void))dlsym(nv.lib, "nvmlInit_v2");
  nv.shutdown = (int (*)(void))dlsym(nv.lib, "nvmlShutdown");
  nv.by_uuid = (int (*)(const char *, nvml_device_t *))dlsym(nv.lib, "nvmlDeviceGetHandleByUUID");
  nv.link_state = (int (*)(nvml_device_t, unsigned, int *))dlsym(nv.lib, "nvmlDeviceGetNvLinkState");
  nv.remote_pci = (int (*)(nvml_device_t, unsigned, nvml_pci_info_t *))dlsym(
      nv.lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  nv.remote_type = (int (*)(nvml_device_t, unsigned, int *))dlsym(
      nv.lib, "nvmlDeviceGetNvLinkRemoteDeviceType");
  if (!nv.init || !nv.shutdown || !nv.by_uuid || !nv.link_state || !nv.remote_pci) {
    gshm_log_info("nvml: missing entry points; NVLink counts unavailable");
    return; /* keep the library loaded: dlclose of NVML is not worth the risk */
  }
  if (nv.init() != NVML_SUCCESS) {
    gshm_log_info("nvml: nvmlInit failed; NVLink counts unavailable");
    return;
  }
  for (unsigned i = 0; i < cb->n; i++) {
    struct cuda_dev *d = &cb->devs[i];
    nvml_device_t h;
    int r = nv.by_uuid(d->uuid, &h);
    if (r != NVML_SUCCESS) {
      gshm_log_info("%s: nvml does not know %s (%d)", d->pci, d->uuid, r);
      goto out;
    }
    for (unsigned link = 0; link < NVML_MAX_LINKS; link++) {
      nvml_pci_info_t pci;
      int on = 0, type = -1;
      if (nv.link_state(h, link, &on) != NVML_SUCCESS)
        break; /* past the last link, or no NVLink at all */
      if (on != NVML_FEATURE_ENABLED)
        continue;
      if (nv.remote_type && nv.remote_type(h, link, &type) == NVML_SUCCESS &&
          type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
        d->switch_links++;
        continue;
      }
      memset(&pci, 0, sizeof(pci));
      if (nv.remote_pci(h, link, &pci) != NVML_SUCCESS)
        continue;
      for (unsigned j = 0; j < cb->n && j < 32; j++)
        if (j != i && cb->devs[j].pci_domain == pci.domain && cb->devs[j].pci_bus == pci.bus &&
            cb->devs[j].pci_device == pci.device)
          d->gpu_links[j]++;
    }
  }
  cb->nvml_ok = true;
out:
  nv.shutdown();
}

/* Links between GPUs i and j: direct links, plus, when both reach the
 * NVSwitch fabric, the fewer of their switch links (nvidia-smi topo's NV#). */
static int nvlinks_between(struct cuda_backend *cb, unsigned i, unsigned j) {
  struct cuda_dev *a = &cb->devs[i], *b = &cb->devs[j];
  int sw = a->switch_links < b->switch_links ? a->switch_links : b->switch_links;

  if (!cb->nvml_ok)
    return -1;
  return (j < 32 ? a->gpu_links[j] : 0) + sw;
}

static int setup_device_list(struct cuda_backend *cb) {
  unsigned n = cb->n;

  cb->info = calloc(n, sizeof(*cb->info));
  cb->infop = calloc(n, sizeof(*cb->infop));
  cb->peers = calloc((size_t)n * n, sizeof(*cb->peers));
  cb->peerp = calloc((size_t)n * n, sizeof(*cb->peerp));
  if (!cb->info || !cb->infop || !cb->peers || !cb->peerp)
    return -ENOMEM;
  for (unsigned i = 0; i < n; i++) {
    struct cuda_dev *d = &cb->devs[i];
    Gshm__DeviceInfo *di = &cb->info[i];
    Gshm__PeerInfo **row = &cb->peerp[(size_t)i * n];
    size_t np = 0;

    gshm__device_info__init(di);
    di->index = (int32_t)i;
    di->uuid = d->uuid;
    di->pci_bus_id = d->pci;
    di->name = d->name;
    di->total_memory = d->total;
    di->cc_major = d->cc_major;
    di->cc_minor = d->cc_minor;
    di->granularity = d->granularity;
    for (unsigned j = 0; j < n; j++) {
      Gshm__PeerInfo *p = &cb->peers[(size_t)i * n + j];
      int v = 0;
      if (i == j)
        continue;
      gshm__peer_info__init(p);
      p->index = (int32_t)j;
      if (!GSHM_CU(cb->drv, GSHM_LOG_DEBUG, cuDeviceGetP2PAttribute, &v,
                   CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, d->dev, cb->devs[j].dev))
        p->access = v != 0;
      v = 0;
      if (!GSHM_CU(cb->drv, GSHM_LOG_DEBUG, cuDeviceGetP2PAttribute, &v,
                   CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, d->dev, cb->devs[j].dev))
        p->native_atomics = v != 0;
      v = 0;
      if (!GSHM_CU(cb->drv, GSHM_LOG_DEBUG, cuDeviceGetP2PAttribute, &v,
                   CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, d->dev, cb->devs[j].dev))
        p->performance_rank = v;
      p->nvlinks = nvlinks_between(cb, i, j);
      row[np++] = p;
      gshm_log_info("%s: peer %s: access %s, native atomics %s, rank %d, nvlinks %d", d->pci,
                    cb->devs[j].pci, p->access ? "yes" : "no", p->native_atomics ? "yes" : "no",
                    p->performance_rank, p->nvlinks);
    }
    di->n_peers = np;
    di->peers = row;
    cb->infop[i] = di;
  }
  return 0;
}

/* The GPU whose primary context is current on this thread (every call
 * of the backend's on a GPU follows a set_ctx), for a message; NULL when
 * none of ours is. */
static struct cuda_dev *current_dev(struct cuda_backend *cb) {
  CUcontext c = NULL;

  if (!cb->drv->cuCtxGetCurrent || cb->drv->cuCtxGetCurrent(&c) != CUDA_SUCCESS || !c)
    return NULL;
  for (unsigned i = 0; i < cb->n; i++)
    if (cb->devs[i].ctx == c)
      return &cb->devs[i];
  return NULL;
}

/* backend_cuda_internal.h.  A sticky error is every later call's error
 * too, until the process ends: only a restart helps, and it loses
 * nothing (the fd store keeps every segment's memory; docs/ARCHITECTURE.md
 * "A sticky CUDA error restarts gshmd"). */
int gshmd__cuda_failed(struct cuda_backend *cb, struct cuda_dev *d, CUresult r, int prio,
                       const char *call, const char *file, int line) {
  const char *name = NULL;

  if (!gshm__cuda_sticky(r) ||
      __atomic_exchange_n(&cb->base.needs_restart, true, __ATOMIC_ACQ_REL)) {
    char what[192];
    if (d) /* (named by the caller: the message starts with it) */
      snprintf(what, sizeof(what), "%s: %s", d->pci, call);
    /* a sticky error but the first: the first one said it all */
    gshm__cuda_log(gshm__cuda_sticky(r) ? GSHM_LOG_DEBUG : prio, r, d ? what : call, file, line);
    return gshm__cuda_errno(r);
  }
  if (!d)
    d = current_dev(cb);
  if (cb->drv->cuGetErrorName)
    cb->drv->cuGetErrorName(r, &name);
  snprintf(cb->base.fault, sizeof(cb->base.fault), "%s: %s", d ? d->pci : "cuda",
           name ? name : "CUDA_ERROR_?");
  gshm_log_err("%s: %s failed: %s at %s:%d: the CUDA context is unusable until gshmd restarts "
               "(cuda.h: the process must be terminated and relaunched); device requests fail "
               "until then (-EIO; -ENODEV where gshmd met it at its start)",
               d ? d->pci : "cuda", call, name ? name : "CUDA_ERROR_?", file, line);
  return gshm__cuda_errno(r);
}

/* backend_cuda_internal.h */
int gshmd__cuda_setup_devices(struct cuda_backend *cb) {
  int count = 0, e;

  if ((e = GSHM_CU(cb->drv, GSHM_LOG_INFO, cuDeviceGetCount, &count)))
    return e;
  if (count <= 0)
    return -ENODEV;
  if (!(cb->devs = calloc((size_t)count, sizeof(*cb->devs))))
    return -ENOMEM;
  for (int i = 0; i < count; i++) {
    if ((e = setup_device(cb, i, &cb->devs[i])))
      return e;
    cb->n = (unsigned)i + 1;
  }
  cb->base.ndevices = cb->n;
  gshm_log_info("cuda: driver %d.%d, %u GPU(s)", cb->drv->driver_version / 1000,
                cb->drv->driver_version % 1000 / 10, cb->n);
  setup_peer_access(cb);
  setup_nvml(cb);
  return setup_device_list(cb);
}
