/* SPDX-License-Identifier: Apache-2.0 */
/* Served segments' mappings for peers' reads, kept while idle, and their
 * UCX registrations (serve.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "serve.h"

/* Takes x off cl->serve_idle (a grant uses it again, or it goes). */
static void export_reg_unidle(struct gshmd_cluster *cl, struct export_reg *x) {
  if (!x->idle)
    return;
  gshm_list_del(&x->idle_node);
  cl->serve_idle_bytes -= x->len;
  cl->serve_idle_count--;
  x->idle = false;
}

/* Drops x (NULL: nothing): its registration, if any, and its mapping,
 * and the memory of a freed segment it kept for its grants. */
static void export_reg_free(struct gshmd_cluster *cl, struct export_reg *x) {
  if (!x)
    return;
  export_reg_unidle(cl, x);
  if (x->memh) {
    ucp_mem_unmap(cl->ll.ctx, x->memh);
    cl->registered--;
  }
  if (x->addr && !x->device)
    munmap(x->addr, x->len);
  if (x->mem)
    x->mem->backend->ops->free(x->mem->backend, x->mem);
  free(x);
}

/* seg's last grant ended (or its first failed): the UCX registration
 * goes; a host segment's mapping is kept on cl->serve_idle, the oldest
 * idle ones dropped beyond SERVE_IDLE_MAX. */
void gshmd__export_reg_idle(struct gshmd_cluster *cl, struct gshmd_segment *seg) {
  struct export_reg *x = seg->cluster_export;

  if (!x || x->grants)
    return;
  /* a mapping UCX registered stays out: its registration cache may keep
   * the registration (and a peer's rkey) for as long as it is mapped */
  if (x->device || !x->addr || x->len > SERVE_IDLE_MAX || x->memh) {
    export_reg_free(cl, x);
    seg->cluster_export = NULL;
    return;
  }
  if (!x->idle) {
    x->idle = true;
    gshm_list_add_tail(&cl->serve_idle, &x->idle_node);
    cl->serve_idle_bytes += x->len;
    cl->serve_idle_count++;
  }
  while (cl->serve_idle_bytes > SERVE_IDLE_MAX || cl->serve_idle_count > SERVE_IDLE_MAX_COUNT) {
    struct export_reg *old = gshm_list_entry(cl->serve_idle.next, struct export_reg, idle_node);
    old->seg->cluster_export = NULL;
    export_reg_free(cl, old);
  }
}

void gshmd__export_reg_unref(struct gshmd_cluster *cl, struct export_reg *x) {
  if (!x || --x->grants)
    return;
  if (!x->seg) {
    export_reg_free(cl, x);
    return;
  }
  gshm_log_debug("cluster: segment '%s' id %" PRIu64 " idle%s", x->seg->name, x->seg->id,
                 x->memh ? ", unregistered" : "");
  gshmd__export_reg_idle(cl, x->seg);
}

/* Discards the memory a revoke left to x (its pages go; the mapping and
 * the allocation stay until x's last grant). */
static void export_reg_wipe(struct gshmd_cluster *cl, struct export_reg *x) {
  x->wipe = false;
  if (!cl->reg->stopping && x->mem && x->mem->backend->ops->discard)
    x->mem->backend->ops->discard(x->mem->backend, x->mem);
}

void gshmd__export_reg_unbusy(struct gshmd_cluster *cl, struct export_reg *x, unsigned n) {
  x->busy -= n < x->busy ? n : x->busy;
  if (!x->busy && x->wipe)
    export_reg_wipe(cl, x);
}

/* seg goes (NULL: nothing): its mapping with it, unless grants still hold
 * it (seg was revoked under them: its lease ended, not their sends and
 * copies in flight); then x keeps the mapping, and the memory itself
 * until the last of them (gshmd__export_reg_unref).  The memory is
 * discarded, as its free would, once no send or copy of theirs runs:
 * those admitted before the revoke carry the segment's bytes (discarded
 * under them, a send went out as zeros the puller took for the
 * segment's), and a grant held without reading keeps no pages. */
static void export_reg_detach(struct gshmd_cluster *cl, struct gshmd_segment *seg, bool take) {
  struct export_reg *x = seg->cluster_export;

  if (!x)
    return;
  seg->cluster_export = NULL;
  if (!x->grants) {
    export_reg_free(cl, x);
    return;
  }
  x->seg = NULL;
  x->pull_failed = seg->hidden;
  if (take && seg->mem) {
    x->mem = seg->mem;
    seg->mem = NULL; /* (the registry frees no memory then) */
    x->wipe = true;
    if (!x->busy)
      export_reg_wipe(cl, x);
  }
}

void gshmd__serve_segment_free(struct gshmd_registry *r, struct gshmd_segment *seg) {
  struct gshmd_cluster *cl = r->on_free_arg;
  if (seg->cluster_export)
    gshm_log_debug("cluster: segment '%s' id %" PRIu64 " unmapped", seg->name, seg->id);
  export_reg_detach(cl, seg, true);
}

void gshmd__serve_stop(struct gshmd_cluster *cl) {
  struct gshm_list *pos;

  /* (a mapping grants still hold goes with the last of them) */
  gshm_list_foreach(pos, &cl->reg->segments)
      export_reg_detach(cl, gshm_list_entry(pos, struct gshmd_segment, node), false);
  if (cl->reg->on_free == gshmd__serve_segment_free) {
    cl->reg->on_free = NULL;
    cl->reg->on_free_arg = NULL;
  }
}

/* Registers x (seg's mapping) with UCX, once. */
static int export_register(struct gshmd_cluster *cl, struct gshmd_segment *seg,
                           struct export_reg *x) {
  ucp_mem_map_params_t mp = {0};

  if (x->memh)
    return 0;
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  if (x->device) { /* the direct path: UCX registers device memory (GPUDirect RDMA) */
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  mp.address = x->addr;
  mp.length = x->len;
  if (ucp_mem_map(cl->ll.ctx, &mp, &x->memh) != UCS_OK) {
    x->memh = NULL;
    gshm_log_err("cluster: cannot register segment '%s' with UCX", seg->name);
    return -EIO;
  }
  gshm_log_debug("cluster: segment '%s' id %" PRIu64 " registered (%zu bytes)", seg->name,
                 seg->id, x->len);
  cl->registrations++;
  cl->registered++;
  return 0;
}

/* seg's mapping for peers' reads, made once per segment; registered with
 * UCX too when ucx (the grant's bytes go over UCX).  Errors: -ENOMEM,
 * -ENOTSUP, -EIO, the backend's. */
int gshmd__export_reg_get(struct gshmd_cluster *cl, struct gshmd_segment *seg, bool ucx,
                          struct export_reg **out) {
  struct gshmd_alloc *mem = seg->mem;
  struct export_reg *x = seg->cluster_export;
  int fd, e;

  if (x) /* served before: its mapping was kept */
    export_reg_unidle(cl, x);
  if (!x) {
    if (!(x = calloc(1, sizeof(*x))))
      return -ENOMEM;
    x->seg = seg;
    x->len = mem->size;
    x->device = mem->device_index >= 0;
    if (x->device)
      e = mem->backend->ops->local_ptr ? mem->backend->ops->local_ptr(mem->backend, mem, &x->addr)
                                       : -ENOTSUP;
    else if (!(e = mem->backend->ops->export_fd(mem->backend, mem, false, &fd)) &&
             (x->addr = mmap(NULL, x->len, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
      e = -errno;
      x->addr = NULL;
      gshm_log_err("cluster: mmap of segment '%s': %m", seg->name);
    } else if (!x->device) {
      gshmd_host_map_advise(x->addr, x->len, cl->cfg->host_huge_pages);
    }
    if (e) {
      export_reg_free(cl, x);
      return e;
    }
    seg->cluster_export = x;
  }
  if (ucx && (e = export_register(cl, seg, x)))
    return e; /* (the mapping stays for the grants it has, or idles: export_reg_idle) */
  *out = x;
  return 0;
}

