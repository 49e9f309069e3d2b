/* SPDX-License-Identifier: Apache-2.0 */
/* Staging through pinned host memory: buffers and copies on libuv's
 * thread pool (stage.h). */
#include "stage.h"

#include <errno.h>
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

int gshmd_stage_buf_new(struct stage_pool *sp, uint64_t slot_size, bool ucx,
                        struct stage_buf **sb_out) {
  struct gshmd_backend *b = sp->pin;
  struct stage_buf *sb = NULL;
  int e = -ENOMEM;

  for (unsigned i = 0; i < sp->nkept && !sb; i++)
    if (sp->kept[i]->slot_size == slot_size) {
      sb = sp->kept[i];
      sp->kept[i] = sp->kept[--sp->nkept];
    }
  if (!sb) {
    if (!(sb = calloc(1, sizeof(*sb))))
      return -ENOMEM;
    sb->slot_size = slot_size;
    sb->slots = (uint32_t)(sp->staging_bytes / slot_size);
    if (sb->slots == 0)
      sb->slots = 1;
    if (sb->slots > STAGE_MAX_SLOTS)
      sb->slots = STAGE_MAX_SLOTS;
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
  if (!sp->stopping && sp->nkept < STAGE_POOL_KEEP) {
    stage_buf_register(sp, sb, false);
    sp->kept[sp->nkept++] = sb;
    return;
  }
  stage_buf_destroy(sp, sb);
}

void gshmd_stage_pool_drain(struct stage_pool *sp) {
  while (sp->nkept)
    stage_buf_destroy(sp, sp->kept[--sp->nkept]);
}

static void stage_buf_destroy(struct stage_pool *sp, struct stage_buf *sb) {
  stage_buf_register(sp, sb, false);
  if (sb->addr) {
    if (sb->pinned)
      sp->pin->ops->host_free(sp->pin, sb->addr);
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

