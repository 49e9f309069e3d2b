/* SPDX-License-Identifier: Apache-2.0 */
/* Staging through pinned host memory: buffers and copies on libuv's
 * thread pool (stage.h). */
#include "stage.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "util.h"

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

/* The slots of a buffer for a segment of seg_bytes (gshmd_stage_buf_get). */
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

/* A buffer made, or freed, on libuv's pool (gshmd_stage_buf_get,
 * gshmd_stage_free). */
struct stage_job {
  uv_work_t work;
  struct stage_pool *sp;
  struct stage_job *next;   /* sp->frees or sp->makes, while queued */
  struct stage_buf *sb;     /* made, taken from the kept ones, or (free) to free */
  uint64_t slot_size;
  uint32_t slots;
  bool ucx, free_only, cancelled, made;
  int err;
  stage_ready_fn ready;
  void *arg;
};

void gshmd_stage_pool_init(struct stage_pool *sp, uv_loop_t *loop, ucp_context_h ctx,
                           uint64_t staging_bytes, struct gshmd_backend *pin) {
  const char *env = getenv("GSHMD_TEST_STAGE_DELAY_MS");
  long ms = env ? strtol(env, NULL, 10) : 0;

  *sp = (struct stage_pool){.loop = loop, .ctx = ctx, .staging_bytes = staging_bytes, .pin = pin};
  sp->frees_tail = &sp->frees;
  sp->makes_tail = &sp->makes;
  sp->delay_ms = ms > 0 && ms <= 10000 ? (unsigned)ms : 0;
}

/* Slots carved from the arena, or NULL: none made (yet), no room, or
 * the cluster stops.  Carves are whole 4 KiB pages (UCX registers them). */
static struct stage_buf *take_carved(struct stage_pool *sp, uint64_t slot_size, uint32_t slots) {
  uint64_t len = slots * slot_size, off;
  struct stage_buf *sb;

  if (!sp->arena.base || sp->stopping ||
      gshm__arena_carve(&sp->arena.carve, (len + 4095) & ~(uint64_t)4095, &off))
    return NULL;
  if (!(sb = calloc(1, sizeof(*sb)))) {
    (void)gshm__arena_return(&sp->arena.carve, off);
    return NULL;
  }
  *sb = (struct stage_buf){.addr = sp->arena.base + off, .len = len, .slots = slots,
                           .slot_size = slot_size, .pinned = sp->arena.pinned, .carved = true};
  sp->arena.carves++;
  return sb;
}

/* A buffer of that shape that needs no making: carved from the arena, or
 * a kept one, taken; NULL when none. */
static struct stage_buf *take_ready(struct stage_pool *sp, uint64_t slot_size, uint32_t slots) {
  struct stage_buf *carved = take_carved(sp, slot_size, slots);

  if (carved)
    return carved;
  for (unsigned i = 0; i < sp->nkept; i++)
    if (sp->kept[i]->slot_size == slot_size && sp->kept[i]->slots == slots) {
      struct stage_buf *sb = sp->kept[i];
      sp->kept[i] = sp->kept[--sp->nkept];
      sp->kept_bytes -= sb->len;
      return sb;
    }
  return NULL;
}

/* The memory of sb and sb itself (any thread). */
static void buf_release(struct stage_pool *sp, struct stage_buf *sb) {
  if (sb->addr) {
    if (sb->pinned)
      sp->pin->ops->host_free(sp->pin, sb->addr, sb->len);
    else
      free(sb->addr);
  }
  free(sb);
}

/* On libuv's pool: the job's buffer freed, or made (unless the loop
 * gave it one, or an error). */
static void job_work(uv_work_t *w) {
  struct stage_job *j = w->data;
  struct stage_pool *sp = j->sp;
  struct stage_buf *sb;

  gshm__name_thread_once("gshmd-pool");
  if (sp->delay_ms && (j->free_only || (!j->sb && !j->err)))
    usleep(sp->delay_ms * 1000u);
  if (j->free_only) {
    buf_release(sp, j->sb);
    j->sb = NULL;
    return;
  }
  if (j->sb || j->err)
    return;
  if (!(sb = calloc(1, sizeof(*sb)))) {
    j->err = -ENOMEM;
    return;
  }
  sb->slot_size = j->slot_size;
  sb->slots = j->slots;
  sb->len = sb->slots * sb->slot_size;
  if (sp->pin) {
    if (!(j->err = sp->pin->ops->host_alloc(sp->pin, sb->len, &sb->addr)))
      sb->pinned = true;
  } else if (posix_memalign(&sb->addr, 4096, sb->len)) {
    j->err = -ENOMEM;
  }
  if (j->err) {
    sb->addr = NULL;
    buf_release(sp, sb);
    return;
  }
  j->sb = sb;
  j->made = true;
}

static void pump(struct stage_pool *sp);

/* Back on the loop: the buffer registered as asked and handed over. */
static void job_done(uv_work_t *w, int status) {
  struct stage_job *j = w->data;
  struct stage_pool *sp = j->sp;
  struct stage_buf *sb = j->sb;
  int err = j->err;

  sp->running--;
  if (!j->free_only) {
    if (sb && j->made)
      sp->made++;
    if (sb && (status || j->cancelled || (err = stage_buf_register(sp, sb, j->ucx)))) {
      gshmd_stage_free(sp, sb); /* kept, or freed */
      sb = NULL;
      if (!err)
        err = -ECANCELED;
    }
    if (err && err != -ECANCELED)
      gshm_log_err("cluster: cannot set up %llu bytes of staging memory",
                   (unsigned long long)(j->slots * j->slot_size));
    j->ready(j->arg, err, sb);
  }
  free(j);
  pump(sp);
}

/* Starts waiting jobs while fewer than STAGE_JOBS run: frees first; a
 * make finds a buffer kept meanwhile, or none when cancelled. */
static void pump(struct stage_pool *sp) {
  while (sp->running < STAGE_JOBS && (sp->frees || sp->makes)) {
    struct stage_job *j = sp->frees ? sp->frees : sp->makes;
    if (j == sp->frees) {
      if (!(sp->frees = j->next))
        sp->frees_tail = &sp->frees;
    } else if (!(sp->makes = j->next)) {
      sp->makes_tail = &sp->makes;
    }
    if (!j->free_only && (j->cancelled || sp->stopping))
      j->err = -ECANCELED;
    else if (!j->free_only)
      j->sb = take_ready(sp, j->slot_size, j->slots);
    j->work.data = j;
    sp->running++;
    (void)uv_queue_work(sp->loop, &j->work, job_work, job_done); /* (fails without a work_cb only) */
  }
}

int gshmd_stage_buf_get(struct stage_pool *sp, uint64_t slot_size, uint64_t seg_bytes, bool ucx,
                        stage_ready_fn ready, void *arg, struct stage_buf **sb_out,
                        struct stage_job **job_out) {
  uint32_t slots = buf_slots(sp, slot_size, seg_bytes);
  struct stage_buf *sb = take_ready(sp, slot_size, slots);
  struct stage_job *j;
  int e;

  if (sb) {
    if ((e = stage_buf_register(sp, sb, ucx))) {
      gshmd_stage_free(sp, sb);
      return e;
    }
    *sb_out = sb;
    return 0;
  }
  if (!(j = calloc(1, sizeof(*j))))
    return -ENOMEM;
  *j = (struct stage_job){.sp = sp, .slot_size = slot_size, .slots = slots, .ucx = ucx,
                          .ready = ready, .arg = arg};
  *sp->makes_tail = j;
  sp->makes_tail = &j->next;
  *job_out = j;
  pump(sp);
  return 1;
}

void gshmd_stage_job_cancel(struct stage_job *j) { j->cancelled = true; }

/* The arena's memory given back (on the loop), once nothing carved from
 * it is held. */
static void arena_release(struct stage_pool *sp) {
  struct stage_arena *a = &sp->arena;

  if (!a->base || a->carve.nlive)
    return;
  if (a->pinned)
    sp->pin->ops->host_free(sp->pin, a->base, a->len);
  else
    free(a->base);
  a->base = NULL;
  gshm__arena_fini(&a->carve);
}

/* The arena's making, on libuv's pool (gshmd_stage_arena_start). */
struct arena_job {
  uv_work_t work;
  struct stage_pool *sp;
  void *addr;
  int err;
  int64_t ns;
};

static void arena_work(uv_work_t *w) {
  struct arena_job *j = w->data;
  struct stage_pool *sp = j->sp;
  int64_t t0 = gshm__now_ns(CLOCK_MONOTONIC);

  gshm__name_thread_once("gshmd-pool");
  if (sp->delay_ms)
    usleep(sp->delay_ms * 1000u);
  if (sp->pin)
    j->err = sp->pin->ops->host_alloc(sp->pin, sp->arena.len, &j->addr);
  else if (posix_memalign(&j->addr, 4096, sp->arena.len))
    j->err = -ENOMEM;
  j->ns = gshm__now_ns(CLOCK_MONOTONIC) - t0;
}

static void arena_done(uv_work_t *w, int status) {
  struct arena_job *j = w->data;
  struct stage_pool *sp = j->sp;
  struct stage_arena *a = &sp->arena;
  int e = status ? status : j->err;

  a->making = false;
  if (!e && !(e = gshm__arena_init(&a->carve, a->len))) {
    a->base = j->addr;
    a->pinned = sp->pin != NULL;
    gshm_log_info("cluster: %.1f MiB of %s staging memory made in %.0f ms",
                  (double)a->len / 1048576, a->pinned ? "pinned" : "host", (double)j->ns / 1e6);
    if (sp->stopping)
      arena_release(sp);
  } else {
    if (j->addr && sp->pin)
      sp->pin->ops->host_free(sp->pin, j->addr, a->len);
    else
      free(j->addr);
    gshm_log_warn("cluster: cannot make %.1f MiB of staging memory (%s): staged pulls make "
                  "their buffers as they go",
                  (double)a->len / 1048576, strerror(-e));
  }
  free(j);
}

void gshmd_stage_arena_start(struct stage_pool *sp, uint64_t arena_bytes) {
  struct arena_job *j;

  sp->arena.len = (arena_bytes + 4095) & ~(uint64_t)4095;
  if (!sp->arena.len || sp->arena.making || sp->arena.base || !(j = calloc(1, sizeof(*j))))
    return;
  j->sp = sp;
  j->work.data = j;
  sp->arena.making = true;
  (void)uv_queue_work(sp->loop, &j->work, arena_work, arena_done); /* (fails without a work_cb only) */
}

void gshmd_stage_free(struct stage_pool *sp, struct stage_buf *sb) {
  struct stage_job *j;

  if (!sb)
    return;
  stage_buf_register(sp, sb, false);
  if (sb->carved) {
    (void)gshm__arena_return(&sp->arena.carve, (uint64_t)((uint8_t *)sb->addr - sp->arena.base));
    free(sb);
    if (sp->stopping)
      arena_release(sp);
    return;
  }
  if (!sp->stopping && sp->nkept < STAGE_POOL_KEEP &&
      sp->kept_bytes + sb->len <= STAGE_KEEP_FULL * sp->staging_bytes) {
    sp->kept[sp->nkept++] = sb;
    sp->kept_bytes += sb->len;
    return;
  }
  if (sp->stopping || !(j = calloc(1, sizeof(*j)))) {
    buf_release(sp, sb);
    return;
  }
  *j = (struct stage_job){.sp = sp, .sb = sb, .free_only = true};
  *sp->frees_tail = j;
  sp->frees_tail = &j->next;
  pump(sp);
}

void gshmd_stage_metrics(const struct stage_pool *sp, FILE *f) {
  fprintf(f, "# HELP gshm_cluster_staging_buffers_made_total Staging buffers made (pinned where a GPU is; the others were kept ones taken again).\n"
             "# TYPE gshm_cluster_staging_buffers_made_total counter\n"
             "gshm_cluster_staging_buffers_made_total %" PRIu64 "\n"
             "# HELP gshm_cluster_staging_kept_bytes Bytes of staging buffers kept for the next grants and pulls (at most 8 x cluster.staging_bytes).\n"
             "# TYPE gshm_cluster_staging_kept_bytes gauge\n"
             "gshm_cluster_staging_kept_bytes %" PRIu64 "\n"
             "# HELP gshm_cluster_staging_arena_bytes Bytes of the staging arena (cluster.staging_arena; 0 until made, or without one).\n"
             "# TYPE gshm_cluster_staging_arena_bytes gauge\n"
             "gshm_cluster_staging_arena_bytes %" PRIu64 "\n"
             "# HELP gshm_cluster_staging_arena_carved_bytes Bytes of the staging arena held by grants and pulls now.\n"
             "# TYPE gshm_cluster_staging_arena_carved_bytes gauge\n"
             "gshm_cluster_staging_arena_carved_bytes %" PRIu64 "\n"
             "# HELP gshm_cluster_staging_arena_carves_total Staging buffers carved from the arena (none made).\n"
             "# TYPE gshm_cluster_staging_arena_carves_total counter\n"
             "gshm_cluster_staging_arena_carves_total %" PRIu64 "\n",
          sp->made, sp->kept_bytes, sp->arena.base ? sp->arena.len : 0,
          sp->arena.base ? sp->arena.carve.live_bytes : 0, sp->arena.carves);
}

void gshmd_stage_pool_drain(struct stage_pool *sp) {
  while (sp->nkept) {
    struct stage_buf *sb = sp->kept[--sp->nkept];
    stage_buf_register(sp, sb, false);
    buf_release(sp, sb);
  }
  sp->kept_bytes = 0;
  arena_release(sp);
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

