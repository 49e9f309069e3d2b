/* SPDX-License-Identifier: Apache-2.0 */
/* Staging through pinned host memory: buffers and copies on libuv's
 * thread pool (stage.h). */
#include "stage.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "log.h"
#include "util.h"

static void stage_buf_destroy(struct stage_pool *sp, struct stage_buf *sb);

/* Registers sb with UCX (ucx) or deregisters it (!ucx), as asked. */
static int stage_buf_register(struct stage_pool *sp, struct stage_buf *sb, bool ucx) {
  ucp_mem_map_params_t mp = {0};

  if (!ucx && sb->memh) {
    ucp_mem_unmap(sp->ctx, sb->memh);
    sb->memh = NULL;
    sp->registered--;
  } else if (ucx && !sb->memh) {
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = sb->addr;
    mp.length = sb->len;
    if (ucp_mem_map(sp->ctx, &mp, &sb->memh) != UCS_OK) {
      sb->memh = NULL;
      return -EIO;
    }
    sp->registered++;
  }
  return 0;
}

/* The slots of a buffer for a segment of seg_bytes (gshmd_stage_buf_new). */
static uint32_t buf_slots(const struct stage_pool *sp, uint64_t slot_size, uint64_t seg_bytes) {
  uint64_t most = sp->staging_bytes / slot_size, want = 1;

  if (most > STAGE_MAX_SLOTS)
    most = STAGE_MAX_SLOTS;
  if (most == 0)
    most = 1;
  while (want < most && want * slot_size < seg_bytes)
    want *= 2;
  return (uint32_t)(want < most ? want : most);
}

uint64_t gshmd_stage_buf_len(const struct stage_pool *sp, uint64_t slot_size, uint64_t seg_bytes) {
  return buf_slots(sp, slot_size, seg_bytes) * slot_size;
}

int gshmd_stage_buf_new(struct stage_pool *sp, uint64_t slot_size, uint64_t seg_bytes, bool ucx,
                        struct stage_buf **sb_out) {
  struct gshmd_backend *b = sp->pin;
  struct stage_buf *sb = NULL;
  uint32_t slots = buf_slots(sp, slot_size, seg_bytes);
  int e = -ENOMEM;
  bool kept = false;

  for (unsigned i = 0; i < sp->nkept && !sb; i++)
    if (sp->kept[i]->slot_size == slot_size && sp->kept[i]->slots == slots) {
      sb = sp->kept[i];
      sp->kept[i] = sp->kept[--sp->nkept];
      sp->kept_bytes -= sb->len;
      kept = true;
    }
  if (!sb) {
    if (!(sb = calloc(1, sizeof(*sb))))
      return -ENOMEM;
    sb->slot_size = slot_size;
    sb->slots = slots;
    sb->len = sb->slots * slot_size;
    if (b) {
      if ((e = b->ops->host_alloc(b, sb->len, &sb->addr)))
        goto fail;
      sb->pinned = true;
    } else if (posix_memalign(&sb->addr, 4096, sb->len)) {
      sb->addr = NULL;
      goto fail;
    }
  }
  if ((e = stage_buf_register(sp, sb, ucx)))
    goto fail;
  if (!kept)
    sp->made++;
  *sb_out = sb;
  return 0;
fail:
  gshm_log_err("cluster: cannot set up %llu bytes of staging memory",
               (unsigned long long)sb->len);
  stage_buf_destroy(sp, sb);
  return e;
}

void gshmd_stage_free(struct stage_pool *sp, struct stage_buf *sb) {
  if (!sb)
    return;
  if (!sp->stopping && sp->nkept < STAGE_POOL_KEEP &&
      sp->kept_bytes + sb->len <= STAGE_KEEP_FULL * sp->staging_bytes) {
    stage_buf_register(sp, sb, false);
    sp->kept[sp->nkept++] = sb;
    sp->kept_bytes += sb->len;
    return;
  }
  stage_buf_destroy(sp, sb);
}

void gshmd_stage_metrics(const struct stage_pool *sp, FILE *f) {
  fprintf(f, "# HELP gshm_cluster_staging_buffers_made_total Staging buffers made (pinned where a GPU is; the others were kept ones taken again).\n"
             "# TYPE gshm_cluster_staging_buffers_made_total counter\n"
             "gshm_cluster_staging_buffers_made_total %" PRIu64 "\n"
             "# HELP gshm_cluster_staging_kept_bytes Bytes of staging buffers kept for the next grants and pulls (at most 8 x cluster.staging_bytes).\n"
             "# TYPE gshm_cluster_staging_kept_bytes gauge\n"
             "gshm_cluster_staging_kept_bytes %" PRIu64 "\n",
          sp->made, sp->kept_bytes);
}

void gshmd_stage_pool_drain(struct stage_pool *sp) {
  while (sp->nkept)
    stage_buf_destroy(sp, sp->kept[--sp->nkept]);
  sp->kept_bytes = 0;
}

static void stage_buf_destroy(struct stage_pool *sp, struct stage_buf *sb) {
  stage_buf_register(sp, sb, false);
  if (sb->addr) {
    if (sb->pinned)
      sp->pin->ops->host_free(sp->pin, sb->addr, sb->len);
    else
      free(sb->addr);
  }
  free(sb);
}

static void copy_work(uv_work_t *w) {
  struct stage_copy *sc = w->data;
  struct gshmd_alloc *mem = sc->mem;

  gshm__name_thread_once("gshmd-pool");
  if (sc->offset > mem->size || sc->len > mem->size - sc->offset) {
    sc->err = -EINVAL;
  } else if (sc->host_map) {
    if (sc->to_segment)
      memcpy(sc->host_map + sc->offset, sc->host, sc->len);
    else
      memcpy(sc->host, sc->host_map + sc->offset, sc->len);
    sc->err = 0;
  } else if (mem->backend->ops->copy_host) {
    sc->err = mem->backend->ops->copy_host(mem->backend, mem, sc->offset, sc->host, sc->len,
                                           sc->to_segment);
  } else {
    sc->err = -ENOTSUP;
  }
}

static void copy_done(uv_work_t *w, int status) {
  struct stage_copy *sc = w->data;
  sc->done(sc, status ? -ECANCELED : sc->err);
}

int gshmd_stage_copy(struct stage_pool *sp, struct stage_copy *sc) {
  sc->work.data = sc;
  return uv_queue_work(sp->loop, &sc->work, copy_work, copy_done) ? -ENOMEM : 0;
}

