/* SPDX-License-Identifier: Apache-2.0 */
/* Staging through pinned host memory: buffers, copies on libuv's thread
 * pool, and the serving side of Stage requests (docs/CLUSTER.md "Device
 * memory"). */
#include "stage.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "wire.h"

#define MAX_STAGED_GRANTS 4 /* per link: each holds staging_bytes of pinned memory */

static struct gshmd_backend *pinning_backend(struct gshmd_cluster *cl) {
  struct gshmd_backend *b = cl->reg->cuda;
  return b && b->ops->host_alloc && b->ops->host_free ? b : NULL;
}

static void stage_buf_destroy(struct gshmd_cluster *cl, struct stage_buf *sb);

int gshmd_stage_buf_new(struct gshmd_cluster *cl, uint64_t slot_size, bool with_rkey,
                        struct stage_buf **sb_out) {
  struct gshmd_backend *b = pinning_backend(cl);
  ucp_mem_map_params_t mp = {0};
  struct stage_buf *sb;
  int e = -ENOMEM;

  /* A buffer whose rkey went to a peer serves peers only: a kept one
   * never holds what this node pulls for its own users. */
  for (unsigned i = 0; i < cl->nstage_pool; i++)
    if (cl->stage_pool[i]->slot_size == slot_size &&
        (cl->stage_pool[i]->rkey != NULL) == with_rkey) {
      *sb_out = cl->stage_pool[i];
      cl->stage_pool[i] = cl->stage_pool[--cl->nstage_pool];
      return 0;
    }
  if (!(sb = calloc(1, sizeof(*sb))))
    return -ENOMEM;
  sb->slot_size = slot_size;
  sb->slots = (uint32_t)(cl->cfg->cluster_staging_bytes / slot_size);
  if (sb->slots == 0)
    sb->slots = 1;
  if (sb->slots > 256)
    sb->slots = 256;
  sb->len = sb->slots * slot_size;
  if (b) {
    if ((e = b->ops->host_alloc(b, sb->len, &sb->addr)))
      goto fail;
    sb->pinned = true;
  } else if (posix_memalign(&sb->addr, 4096, sb->len)) {
    sb->addr = NULL;
    goto fail;
  }
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = sb->addr;
  mp.length = sb->len;
  e = -EIO;
  if (ucp_mem_map(cl->ctx, &mp, &sb->memh) != UCS_OK) {
    sb->memh = NULL;
    goto fail;
  }
  if (with_rkey && ucp_rkey_pack(cl->ctx, sb->memh, &sb->rkey, &sb->rkey_len) != UCS_OK) {
    sb->rkey = NULL;
    goto fail;
  }
  *sb_out = sb;
  return 0;
fail:
  gshm_log_err("cluster: cannot set up %llu bytes of staging memory",
               (unsigned long long)sb->len);
  stage_buf_destroy(cl, sb);
  return e;
}

void gshmd_stage_free(struct gshmd_cluster *cl, struct stage_buf *sb) {
  if (!sb)
    return;
  if (!cl->stopping && cl->nstage_pool < sizeof(cl->stage_pool) / sizeof(cl->stage_pool[0])) {
    cl->stage_pool[cl->nstage_pool++] = sb;
    return;
  }
  stage_buf_destroy(cl, sb);
}

void gshmd_stage_pool_drain(struct gshmd_cluster *cl) {
  while (cl->nstage_pool)
    stage_buf_destroy(cl, cl->stage_pool[--cl->nstage_pool]);
}

static void stage_buf_destroy(struct gshmd_cluster *cl, struct stage_buf *sb) {
  if (sb->rkey)
    ucp_rkey_buffer_release(sb->rkey);
  if (sb->memh)
    ucp_mem_unmap(cl->ctx, sb->memh);
  if (sb->addr) {
    if (sb->pinned)
      pinning_backend(cl)->ops->host_free(pinning_backend(cl), sb->addr);
    else
      free(sb->addr);
  }
  free(sb);
}

static void copy_work(uv_work_t *w) {
  struct stage_copy *sc = w->data;
  struct gshmd_alloc *mem = sc->mem;

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

int gshmd_stage_copy(struct gshmd_cluster *cl, struct stage_copy *sc) {
  sc->work.data = sc;
  return uv_queue_work(cl->loop, &sc->work, copy_work, copy_done) ? -ENOMEM : 0;
}

int gshmd_stage_grant_new(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id,
                          bool staged, struct stage_grant **g_out) {
  struct stage_grant *g;
  struct gshm_list *pos;
  unsigned n = 0;
  int e;

  gshm_list_foreach(pos, &l->staged) {
    n += gshm_list_entry(pos, struct stage_grant, node)->sb != NULL;
  }
  if (staged && n >= MAX_STAGED_GRANTS)
    return -EBUSY;
  if (!(g = calloc(1, sizeof(*g))))
    return -ENOMEM;
  if (staged && (e = gshmd_stage_buf_new(cl, cl->cfg->cluster_pull_chunk, true, &g->sb))) {
    free(g);
    return e;
  }
  g->grant_id = grant_id;
  gshm_list_add_tail(&l->staged, &g->node);
  *g_out = g;
  return 0;
}

static struct stage_grant *grant_find(struct link *l, uint64_t grant_id) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &l->staged) {
    struct stage_grant *g = gshm_list_entry(pos, struct stage_grant, node);
    if (g->grant_id == grant_id)
      return g;
  }
  return NULL;
}

struct stage_grant *gshmd_stage_grant_find(struct link *l, uint64_t grant_id) {
  struct stage_grant *g = grant_find(l, grant_id);
  return g && !g->released ? g : NULL;
}

static void grant_free(struct gshmd_cluster *cl, struct stage_grant *g) {
  gshm_list_del(&g->node);
  gshmd_stage_free(cl, g->sb);
  free(g);
}

bool gshmd_stage_grant_release(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id) {
  struct stage_grant *g = grant_find(l, grant_id);
  if (!g)
    return true;
  if (g->busy) {
    g->released = true;
    return false;
  }
  grant_free(cl, g);
  return true;
}

void gshmd_stage_link_end(struct gshmd_cluster *cl, struct link *l) {
  while (!gshm_list_empty(&l->staged))
    grant_free(cl, gshm_list_entry(l->staged.next, struct stage_grant, node));
}

/* A Stage being served: the copy, then the answer. */
struct serve_job {
  struct stage_copy sc;
  struct gshmd_cluster *cl;
  struct link *l;
  uint64_t grant_id;
  uint32_t rid, slot;
};

void gshmd_stage_grant_unbusy(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id) {
  struct stage_grant *g = grant_find(l, grant_id);

  if (g && --g->busy == 0 && g->released) {
    /* a Release that came mid-send: the grant and its lease end now */
    grant_free(cl, g);
    gshmd__cluster_grant_close(cl, l, grant_id);
  }
}

/* The grant's part of a Stage ends (its bytes sent, or not). */
static void serve_end(struct serve_job *j) {
  gshmd_stage_grant_unbusy(j->cl, j->l, j->grant_id);
  free(j);
}

static void on_slot_sent(void *arg, ucs_status_t st) {
  (void)st;
  serve_end(arg);
}

static void serve_done(struct stage_copy *sc, int err) {
  struct serve_job *j = sc->arg;
  struct link *l = j->l;
  struct gshmd_cluster *cl = j->cl;
  struct stage_grant *g = grant_find(l, j->grant_id);

  if (!err && (!g || g->released || l->state != LINK_UP))
    err = -ESTALE;
  if (!err)
    err = gshmd__cluster_send_data(l, j->rid, j->sc.offset, j->sc.host, j->sc.len, g->sb->memh,
                                   on_slot_sent, j);
  l->busy--; /* the copy's count; a send counts itself */
  if (err) {
    if (l->state == LINK_UP) {
      Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
      m.request_id = j->rid;
      m.status = (uint32_t)gshm__errno_to_status(err);
      m.message = "the staging copy failed";
      gshmd__cluster_send(l, &m);
    }
    serve_end(j);
  }
  gshmd__cluster_link_unbusy(cl, l);
}

int gshmd_stage_serve(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                      struct gshmd_segment *seg, const Gshm__Cluster__Stage *s) {
  struct stage_grant *g = grant_find(l, s->grant_id);
  struct serve_job *j;
  uint8_t *map = NULL;
  int e;

  if (!g || g->released || !g->sb)
    return -ESTALE;
  if (s->slot >= g->sb->slots || s->length == 0 || s->length > g->sb->slot_size ||
      s->offset > seg->requested_size || s->length > seg->requested_size - s->offset)
    return -EINVAL;
  if (seg->mem->device_index < 0 && (e = gshmd__cluster_host_map(cl, seg, &map)))
    return e;
  if (!(j = calloc(1, sizeof(*j))))
    return -ENOMEM;
  j->cl = cl;
  j->l = l;
  j->rid = rid;
  j->grant_id = s->grant_id;
  j->slot = s->slot;
  j->sc.mem = seg->mem;
  j->sc.host_map = map;
  j->sc.offset = s->offset;
  j->sc.len = s->length;
  j->sc.host = (uint8_t *)g->sb->addr + (uint64_t)s->slot * g->sb->slot_size;
  j->sc.to_segment = false;
  j->sc.done = serve_done;
  j->sc.arg = j;
  if ((e = gshmd_stage_copy(cl, &j->sc))) {
    free(j);
    return e;
  }
  l->busy++;
  g->busy++;
  return 0;
}
