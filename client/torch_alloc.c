/* SPDX-License-Identifier: Apache-2.0 */
/* gshm as PyTorch's allocator: pools of device segments carved up in
 * libgshm, behind PyTorch's pluggable-allocator signatures.
 *
 * A pool allocates from "arena" segments of pool->granule bytes (256 MiB
 * by default) named "<prefix>/seg-NNNNNN" (pool_name_create: in order,
 * past other users' names), each created by gshmd, mapped
 * once on the pool's device and carved up here by best fit over the free
 * extents of all its segments.  An allocation larger than the granule gets a
 * segment of its own, rounded up to 2 MiB.  Why arenas rather than one
 * segment per allocation: a gshm_create of a device segment plus its
 * import and map costs about a millisecond and one daemon round trip,
 * and every segment is a name, a lease and an fd (daemon limits); PyTorch's
 * caching allocator asks for blocks of 2 MiB and up, so a 16 GiB model
 * built tensor by tensor would pay hundreds of them, an arena pool 64
 * (docs/PERFORMANCE.md "PyTorch pool" has the measured costs; the flag
 * GSHM_POOL_SEGMENT_PER_ALLOC keeps the other choice for comparison).
 *
 * No block ever crosses a segment boundary, so a published tensor is
 * always (segment, offset) and another process maps each segment on its
 * own.  The allocator's entry points cannot carry a pool argument (their
 * signatures are PyTorch's), which is why the pools of a process are kept
 * in one process-wide registry: malloc takes the calling thread's active
 * pool, free finds the pool by address.
 *
 * Threads: PyTorch may free from any thread (an OOM retry, empty_cache, a
 * MemPool's destructor).  A pool is found, from malloc and free alike, only
 * under the registry's lock, and its own lock is taken before that is
 * dropped (the one lock order: registry, then pool); gshm_pool_release
 * unregisters a pool and then waits for its lock before freeing it.  A
 * thread's active pool is checked against the registry (pointer and serial
 * number) on every malloc, so a pool released by another thread is never
 * dereferenced; a released pool's memory is kept (graveyard), so that no
 * later pool has its address.
 *
 * Fork: the registry's lock is common/fork.h's GSHM__LOCK_POOLS, so a fork
 * waits for the thread that holds it (which may itself wait for a pool's
 * lock, held across a growth: a daemon round trip and a map).  A child
 * inherits the parent's pools, but their segments, mappings, client and
 * primary context are the parent's and CUDA does not survive fork, so in
 * the child every call on them returns -ECHILD (a free ignores the
 * pointer), and none takes a pool's lock (which a thread of the parent
 * may have held at the fork).  A child cannot make pools of its own either
 * (the driver's load is -ECHILD there), so its registry holds only the
 * parent's. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "arena.h"
#include "client_internal.h"
#include "cudadrv.h"
#include "fork.h"
#include "log.h"
#include "util.h"

#define POOL_ALIGN 512u                     /* PyTorch's smallest block size */
#define POOL_SEG_ROUND (2ull << 20)         /* device granularity */
#define POOL_MAX_SEGMENTS 1000000u          /* seg-NNNNNN */
/* Names a growth tries when another user holds the one it wanted (see
 * pool_name_next): with every other name drawn at random, a user who
 * wants them all to fail must hold most of the million, far past
 * limits.max_segments (65,536 by default). */
#define POOL_NAME_TRIES 32u

struct pool_seg {
  gshm_segment_t *seg;
  uint64_t base, size;
  uint32_t index;
  bool named;          /* its name is still ours to unlink */
  struct gshm__arena arena;
  struct pool_seg *next;
};

struct gshm_pool {
  gshm_client_t *client;
  char prefix[GSHM_NAME_MAX + 1];
  char location[GSHM_LOCATION_MAX];
  int device;
  CUdevice cu_device;
  CUcontext ctx; /* the device's primary context, retained */
  const struct gshm_cudadrv *drv;
  uint32_t mode, flags;
  uint64_t granule;
  pthread_mutex_t lock;
  struct pool_seg *segs;
  uint32_t next_index;
  uint32_t uid;    /* gshm_client_uid of client, once uid_known (pool_name_others) */
  bool uid_known;
  uint64_t serial; /* unique in the process: tells a new pool from a freed one */
  unsigned fork_gen; /* gshm__fork_gen() at create: see pool_forked */
  bool released;   /* written under lock; read atomically by pool_for_malloc */
  bool release_unlinks; /* gshm_pool_release asked to unlink */
  uint64_t allocations;
  struct gshm_pool *next; /* in the registry */
};

/* The registry (see the top of the file for why it is process-wide),
 * under GSHM__LOCK_POOLS. */
static struct gshm_pool *registry;
/* Released pools, never freed: a handle is only a pointer, and a freed
 * pool's address handed to a later pool would let a stale handle
 * (gshm_pool_activate's `prev`, restored) activate that pool. */
static struct gshm_pool *graveyard;
static uint64_t registry_serial;
static __thread gshm_pool_t *active_pool;
static __thread uint64_t active_serial;
static __thread int last_error;

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Whether p was made by a process this one was forked from: nothing of it
 * can be used here (see the top of the file).  fork_gen never changes, and
 * a pool is never freed: read without a lock. */
static bool pool_forked(const gshm_pool_t *p) { return p->fork_gen != gshm__fork_gen(); }

/* "<prefix>/seg-NNNNNN" into buf; -ENAMETOOLONG when it does not fit. */
static int segment_name(const char *prefix, uint32_t index, char buf[GSHM_NAME_MAX + 1]) {
  size_t len = strnlen(prefix, GSHM_NAME_MAX + 1);

  if (len + sizeof("/seg-000000") - 1 > GSHM_NAME_MAX)
    return -ENAMETOOLONG;
  memcpy(buf, prefix, len);
  snprintf(buf + len, GSHM_NAME_MAX + 1 - len, "/seg-%06u", index % POOL_MAX_SEGMENTS);
  return 0;
}

/* Removes s's name, unless the name now belongs to another segment (it was
 * unlinked by someone else and created again). */
static void pool_seg_unlink(gshm_pool_t *p, struct pool_seg *s) {
  const gshm_segment_info_t *mine = gshm_segment_info(s->seg);
  gshm_segment_info_t now;

  if (!s->named)
    return;
  s->named = false;
  if (!gshm_stat_name(p->client, mine->name, &now) && now.id == mine->id)
    gshm_unlink(p->client, mine->name);
}

/* Unmaps and closes one segment; unlinks its name when asked. */
static void pool_seg_drop(gshm_pool_t *p, struct pool_seg *s, bool unlink) {
  if (unlink)
    pool_seg_unlink(p, s);
  gshm_close(s->seg);
  gshm__arena_fini(&s->arena);
  free(s);
}

/* Unlinks s from p->segs and drops it.  Caller holds p->lock. */
static void pool_remove(gshm_pool_t *p, struct pool_seg *s, bool unlink) {
  struct pool_seg **pp;
  for (pp = &p->segs; *pp != s; pp = &(*pp)->next)
    ;
  *pp = s->next;
  pool_seg_drop(p, s, unlink);
}

/* Whether one of p's segments has number index.  Caller holds p->lock. */
static bool pool_index_used(const gshm_pool_t *p, uint32_t index) {
  for (const struct pool_seg *s = p->segs; s; s = s->next)
    if (s->index == index)
      return true;
  return false;
}

/* Whether the name that a create of p found taken (-EEXIST) is another
 * user's: not the uid gshmd knows p's client by (stat refused, or its
 * owner another uid, or gone again since).  Names are first come, first
 * served: any user may create "<prefix>/seg-NNNNNN" before the pool does
 * (docs/SECURITY.md).  One of p's own uid is a pool not released. */
static bool pool_name_others(gshm_pool_t *p, const char *name) {
  gshm_segment_info_t info;

  if (!p->uid_known && !gshm_client_uid(p->client, &p->uid))
    p->uid_known = true; /* (a round trip: asked once) */
  if (!p->uid_known || gshm_stat_name(p->client, name, &info))
    return true;
  return info.uid != p->uid;
}

/* The number of p's next segment: p->next_index, past numbers p's own
 * segments hold (drawn before); after a name another user held
 * (taken > 0), one drawn at random that none of p's holds.  Caller holds
 * p->lock. */
static uint32_t pool_name_next(gshm_pool_t *p, unsigned taken) {
  uint32_t r;

  while (!taken && p->next_index < POOL_MAX_SEGMENTS && pool_index_used(p, p->next_index))
    p->next_index++;
  if (!taken)
    return p->next_index;
  for (uint32_t salt = 0;; salt++) {
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) /* (no entropy yet) */
      r = (uint32_t)((p->serial + taken) * 2654435761u + salt * 40503u + p->next_index);
    r %= POOL_MAX_SEGMENTS;
    if (!pool_index_used(p, r)) /* (p holds far fewer than the million: 2 MiB of a GPU each) */
      return r;
  }
}

/* Creates a segment of at least `size` bytes for p under the next name
 * no one holds (pool_name_next), into *seg_out with its number in
 * *index_out.  Errors: gshm_create's; -EEXIST the name is p's own uid's
 * (a pool of this prefix was not released), or POOL_NAME_TRIES names in
 * a row were other users' (logged).  Caller holds p->lock. */
static int pool_name_create(gshm_pool_t *p, uint64_t size, char name[GSHM_NAME_MAX + 1],
                            gshm_segment_t **seg_out, uint32_t *index_out) {
  unsigned taken;
  uint32_t index;
  int e = -EEXIST;

  for (taken = 0; taken < POOL_NAME_TRIES; taken++) {
    index = pool_name_next(p, taken);
    if (index >= POOL_MAX_SEGMENTS)
      return -EMFILE;
    if ((e = segment_name(p->prefix, index, name)))
      return e;
    e = gshm_create(p->client, name, size, p->location, p->mode, 0, seg_out);
    if (e != -EEXIST) {
      if (!e)
        *index_out = index;
      return e;
    }
    if (!pool_name_others(p, name))
      return -EEXIST;
    gshm_log_info("pool '%s': %s is another user's; trying another name", p->prefix, name);
    if (index == p->next_index)
      p->next_index++; /* (never ours to take) */
  }
  gshm_log_err("pool '%s': %u names under the prefix in a row were other users' (names are "
               "first come, first served): use a prefix of your own", p->prefix, taken);
  return e;
}

/* Creates, maps (and for a non-persistent pool at once unlinks) a
 * segment of at least `size` bytes, under the pool's next free name
 * (pool_name_create).  Caller holds p->lock. */
static int pool_grow(gshm_pool_t *p, uint64_t size, struct pool_seg **seg_out) {
  char name[GSHM_NAME_MAX + 1];
  struct pool_seg *s;
  void *addr = NULL;
  bool named = false;
  uint32_t index = 0;
  int e;

  if (p->next_index >= POOL_MAX_SEGMENTS)
    return -EMFILE;
  if (!(s = calloc(1, sizeof(*s))))
    return -ENOMEM;
  if ((e = pool_name_create(p, size, name, &s->seg, &index)))
    goto free_seg;
  named = true;
  /* The block that asked for this growth must fit in it: a segment the
   * daemon made shorter than asked would be kept, empty, at every try. */
  if (gshm_segment_info(s->seg)->size < size) {
    gshm_log_err("pool '%s': %s has %llu bytes, %llu asked", p->prefix, name,
                 (unsigned long long)gshm_segment_info(s->seg)->size, (unsigned long long)size);
    e = -EPROTO;
    goto close_seg;
  }
  /* Without a name the memory goes with this process's lease. */
  if (!(p->flags & GSHM_POOL_PERSISTENT)) {
    if ((e = gshm_unlink(p->client, name)))
      goto close_seg;
    named = false;
  }
  /* For every GPU that can reach it, not p->device alone: PyTorch copies
   * between GPUs on the source GPU (pool_tensor.copy_(t_on_gpu1) is GPU
   * 1's copy into this memory), and a cuMem mapping gives access per
   * device, which peer access does not widen (gshm_copy in gshm.h). */
  if ((e = gshm_map(s->seg, NULL, 0, &addr)))
    goto close_seg;
  s->base = (uint64_t)(uintptr_t)addr;
  s->size = gshm_segment_info(s->seg)->size;
  if ((e = gshm__arena_init(&s->arena, s->size)))
    goto close_seg;
  s->index = index;
  if (index == p->next_index)
    p->next_index++;
  s->named = p->flags & GSHM_POOL_PERSISTENT;
  s->next = p->segs;
  p->segs = s;
  *seg_out = s;
  gshm_log_debug("pool '%s': segment %s of %llu bytes at 0x%llx", p->prefix, name,
                 (unsigned long long)s->size, (unsigned long long)s->base);
  return 0;

close_seg:
  /* the segment is ours and new: its name must not outlive the failure */
  if (named)
    gshm_unlink(p->client, name);
  gshm_close(s->seg);
free_seg:
  free(s);
  return e;
}

int gshm_pool_create(gshm_client_t *client, const gshm_pool_config_t *cfg,
                     gshm_pool_t **pool_out) {
  char name[GSHM_NAME_MAX + 1], uuid[48];
  gshm_segment_info_t info;
  gshm_pool_t *p;
  int count = 0, e;
  CUuuid u;

  if (!client || !cfg || !cfg->prefix || !pool_out)
    return -EINVAL;
  if (cfg->flags & ~(GSHM_POOL_PERSISTENT | GSHM_POOL_SEGMENT_PER_ALLOC))
    return -EINVAL;
  if (cfg->granule % POOL_SEG_ROUND || cfg->mode > 0777 || cfg->device < 0)
    return -EINVAL;
  /* The longest name the pool makes must be a valid segment name. */
  if ((e = segment_name(cfg->prefix, POOL_MAX_SEGMENTS - 1, name)) ||
      (e = gshm__name_check(name, GSHM_NAME_MAX)) ||
      (e = gshm__name_check(cfg->prefix, GSHM_NAME_MAX)))
    return e;
  if (!(p = calloc(1, sizeof(*p))))
    return -ENOMEM;
  p->client = client;
  snprintf(p->prefix, sizeof(p->prefix), "%s", cfg->prefix);
  p->device = cfg->device;
  p->mode = cfg->mode ? cfg->mode : 0600;
  p->flags = cfg->flags;
  p->granule = cfg->granule ? cfg->granule : GSHM_POOL_DEFAULT_GRANULE;
  pthread_mutex_init(&p->lock, NULL);
  p->fork_gen = gshm__fork_gen();
  if ((e = gshm__cudadrv_load(GSHM_LOG_INFO, &p->drv))) {
    if (e != -ECHILD)
      e = -ENOTSUP;
    goto free_pool;
  }
  if ((e = GSHM_CU(p->drv, GSHM_LOG_ERR, cuDeviceGetCount, &count)))
    goto free_pool;
  if (cfg->device >= count) {
    gshm_log_info("pool '%s': no CUDA device %d here (%d visible)", p->prefix, cfg->device,
                  count);
    e = -ENODEV;
    goto free_pool;
  }
  if ((e = GSHM_CU(p->drv, GSHM_LOG_ERR, cuDeviceGet, &p->cu_device, cfg->device)) ||
      (e = GSHM_CU(p->drv, GSHM_LOG_ERR, cuDeviceGetUuid, &u, p->cu_device)))
    goto free_pool;
  gshm__format_gpu_uuid((const unsigned char *)u.bytes, uuid);
  snprintf(p->location, sizeof(p->location), "cuda:%s", uuid);
  if ((e = GSHM_CU(p->drv, GSHM_LOG_ERR, cuDevicePrimaryCtxRetain, &p->ctx, p->cu_device)))
    goto free_pool;
  /* A persistent prefix in use (a pool of this user that was not
   * released) is refused here, not at the first allocation inside
   * PyTorch.  Not for a name of another user's: any user may create
   * "<prefix>/seg-000000" first, and the pool then takes other names
   * (pool_name_create). */
  if (p->flags & GSHM_POOL_PERSISTENT) {
    segment_name(p->prefix, 0, name);
    e = gshm_stat_name(client, name, &info);
    if (e == 0 && !pool_name_others(p, name)) {
      gshm_log_info("pool '%s': %s exists already", p->prefix, name);
      e = -EEXIST;
      goto release_ctx;
    }
    if (e && e != -ENOENT && e != -EACCES)
      goto release_ctx;
  }
  gshm__fork_lock(GSHM__LOCK_POOLS);
  p->serial = ++registry_serial;
  p->next = registry;
  registry = p;
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  *pool_out = p;
  return 0;

release_ctx:
  GSHM_CU(p->drv, GSHM_LOG_ERR, cuDevicePrimaryCtxRelease, p->cu_device);
free_pool:
  pthread_mutex_destroy(&p->lock);
  free(p);
  return e;
}

/* Whether p is a registered pool (compared as a pointer: p may be freed).
 * Caller holds the registry's lock. */
static bool pool_registered(const gshm_pool_t *p) {
  for (const gshm_pool_t *q = registry; q; q = q->next)
    if (q == p)
      return true;
  return false;
}

gshm_pool_t *gshm_pool_activate(gshm_pool_t *pool) {
  gshm_pool_t *prev = active_pool;

  active_pool = NULL;
  active_serial = 0;
  if (pool) {
    gshm__fork_lock(GSHM__LOCK_POOLS);
    if (pool_registered(pool)) {
      active_pool = pool;
      active_serial = pool->serial;
    }
    gshm__fork_unlock(GSHM__LOCK_POOLS);
  }
  return prev;
}

/* The pool malloc uses, returned with its lock held: the thread's active
 * one, else the process's only pool that still allocates.  NULL with
 * *err_out set when there is none: -EBADF the active pool was released
 * (by any thread), -EINVAL no active pool and not exactly one other,
 * -ECHILD the pool is a parent process's (its lock is never taken). */
static gshm_pool_t *pool_for_malloc(int *err_out) {
  gshm_pool_t *p, *only = NULL;
  int n = 0;

  gshm__fork_lock(GSHM__LOCK_POOLS);
  if (active_pool) {
    if (pool_registered(active_pool) && active_pool->serial == active_serial) {
      only = active_pool;
      n = 1;
    } else {
      *err_out = -EBADF;
    }
  } else {
    for (p = registry; p; p = p->next)
      if (!__atomic_load_n(&p->released, __ATOMIC_ACQUIRE)) {
        only = p;
        n++;
      }
    if (n != 1)
      *err_out = -EINVAL;
  }
  if (n == 1 && pool_forked(only)) {
    *err_out = -ECHILD;
    n = 0;
  }
  if (n == 1)
    pthread_mutex_lock(&only->lock);
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  return n == 1 ? only : NULL;
}

/* Carves `size` bytes out of p, growing it when nothing fits.  Caller
 * holds p->lock. */
static int pool_malloc(gshm_pool_t *p, uint64_t size, void **ptr_out) {
  struct pool_seg *s;
  uint64_t off = 0;
  int e = -ENOMEM;

  if (p->released) {
    e = -EBADF;
    goto unlock;
  }
  if (!(p->flags & GSHM_POOL_SEGMENT_PER_ALLOC)) {
    /* Best fit over every segment: the free extent that the block leaves
     * least of (the oldest segment among equals).  First fit from the
     * newest segment left the tails of older arenas empty for good: a
     * 16 GiB Llama took 86 arenas of 256 MiB, 71 this way (32% and 9%
     * over its weights; docs/PERFORMANCE.md). */
    struct pool_seg *best = NULL;
    uint64_t left, best_left = 0;
    for (s = p->segs; s; s = s->next)
      if (!gshm__arena_fit(&s->arena, size, &left) && (!best || left <= best_left)) {
        best = s;
        best_left = left;
      }
    if ((s = best))
      e = gshm__arena_carve(&s->arena, size, &off);
  }
  if (e) {
    uint64_t want = round_up(size, POOL_SEG_ROUND);
    if (!(p->flags & GSHM_POOL_SEGMENT_PER_ALLOC) && want < p->granule)
      want = p->granule;
    uint32_t next = p->next_index;
    /* A growth inside a stream capture (a PyTorch that calls allocators
     * outside its own relaxed-mode guard) imports, maps and gives access
     * to memory outside any stream, calls that end a global-mode capture
     * of any thread: this thread may make them, as PyTorch's own
     * allocator does (cudaMallocMaybeCapturing), and its unwinding too. */
    CUstreamCaptureMode mode = gshm__capture_relax(p->drv);
    if (!(e = pool_grow(p, want, &s)) && (e = gshm__arena_carve(&s->arena, size, &off))) {
      /* a failed growth leaves nothing behind, nor burns its index */
      pool_remove(p, s, true);
      p->next_index = next;
    }
    gshm__capture_restore(p->drv, mode);
    if (e)
      goto unlock;
  }
  p->allocations++;
  *ptr_out = (void *)(uintptr_t)(s->base + off);
unlock:
  return e;
}

void *gshm_torch_malloc(ssize_t size, int device, void *stream) {
  gshm_pool_t *p;
  void *ptr = NULL;
  int e = 0;

  (void)stream; /* a range is reused only after its free synchronised */
  if (size == 0) {
    last_error = 0; /* nothing to allocate: NULL, as for any allocator */
    return NULL;
  }
  if (size < 0) {
    last_error = -EINVAL;
    gshm_log_err("gshm_torch_malloc(%zd): negative size", size);
    return NULL;
  }
  if ((p = pool_for_malloc(&e))) {
    if (device != p->device)
      e = -ENODEV;
    else
      e = pool_malloc(p, round_up((uint64_t)size, POOL_ALIGN), &ptr);
    if (e)
      gshm_log_err("gshm_torch_malloc(%zd, device %d): %s, pool %s", size, device,
                   gshm_strerror(e), p->prefix);
    pthread_mutex_unlock(&p->lock);
  } else {
    gshm_log_err("gshm_torch_malloc(%zd, device %d): %s", size, device,
                 e == -EBADF    ? "the thread's pool was released"
                 : e == -ECHILD ? "the pool is the process's this one was forked from"
                                : "no active pool");
  }
  last_error = e;
  return e ? NULL : ptr;
}

/* The segment of p holding address a, or NULL.  Caller holds p->lock. */
static struct pool_seg *pool_find(gshm_pool_t *p, uint64_t a) {
  for (struct pool_seg *s = p->segs; s; s = s->next)
    if (a >= s->base && a < s->base + s->size)
      return s;
  return NULL;
}

void gshm_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  uint64_t a = (uint64_t)(uintptr_t)ptr;
  struct pool_seg *s = NULL;
  CUcontext ctx = NULL;
  CUresult r;
  gshm_pool_t *p;
  bool forked = false;
  int e = -EINVAL;

  (void)size;
  (void)device;
  if (!ptr)
    return;
  gshm__fork_lock(GSHM__LOCK_POOLS);
  for (p = registry; p; p = p->next) {
    if (pool_forked(p)) {
      forked = true; /* a parent's: its lock may be held for good */
      continue;
    }
    pthread_mutex_lock(&p->lock);
    if ((s = pool_find(p, a)))
      break; /* keeps p->lock */
    pthread_mutex_unlock(&p->lock);
  }
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  if (!s) {
    /* Never handed out by a pool of this process: leave it alone. */
    gshm_log_err("gshm_torch_free(%p): not memory of a gshm pool%s; ignored", ptr,
                 forked ? " made in this process" : "");
    last_error = forked ? -ECHILD : -EINVAL;
    return;
  }
  /* Order after the GPU's work: kernels queued on `stream` (the stream the
   * block was allocated on, as PyTorch's pluggable allocator passes it) or
   * on another stream that used the block may still read or write it.
   * PyTorch's own allocator frees with cudaFree, which waits for the whole
   * device; so does this, on the pool's context (pushed: whatever context
   * is current on this thread, on whichever device), before the block can
   * be reused or its segment unmapped.  The whole context rather than
   * `stream`: that handle may be a stream destroyed since the block was
   * allocated.  PyTorch frees pool blocks only when it empties its cache
   * (release, OOM retry), never on the allocation path, so the wait is
   * rare.  Not made while a capture it can see runs in the context
   * (gshm__cuda_ctx_wait: the wait would invalidate it). */
  (void)stream;
  if ((r = p->drv->cuCtxPushCurrent(p->ctx)) == CUDA_SUCCESS) {
    r = gshm__cuda_ctx_wait(p->drv);
    GSHM_CU(p->drv, GSHM_LOG_ERR, cuCtxPopCurrent, &ctx);
  }
  /* A wait that failed, or was not made, but not for good (a stream
   * capture under way: CUDA's "prohibited operations"), leaves work on
   * the block that may still run: it stays live (leaked) rather than
   * reused or unmapped under that work.  After a sticky error the context
   * runs nothing more. */
  if (r != CUDA_SUCCESS && !gshm__cuda_sticky(r)) {
    gshm__cuda_log(GSHM_LOG_ERR, r, "cuCtxSynchronize()", __FILE__, __LINE__);
    gshm_log_err("gshm_torch_free(%p): no wait for the device (it failed, or a stream "
                 "capture is under way): the block is kept (leaked), not reused under work "
                 "that may still use it", ptr);
    pthread_mutex_unlock(&p->lock);
    last_error = gshm__cuda_errno(r);
    return;
  }
  e = gshm__arena_return(&s->arena, a - s->base);
  if (e)
    gshm_log_err("gshm_torch_free(%p): no block starts there (freed twice?); ignored", ptr);
  /* A non-persistent pool gives memory back as soon as a segment is empty;
   * a persistent one keeps it under its names until gshm_pool_release. */
  else if (!s->arena.nlive && (!(p->flags & GSHM_POOL_PERSISTENT) || p->released))
    pool_remove(p, s, p->release_unlinks);
  pthread_mutex_unlock(&p->lock);
  last_error = e;
}

int gshm_torch_last_error(void) { return last_error; }

int gshm_pool_segments(gshm_pool_t *pool, gshm_pool_segment_t **segs_out, size_t *count_out) {
  gshm_pool_segment_t *v;
  struct pool_seg *s;
  size_t n = 0, i = 0;

  if (!pool || !segs_out || !count_out)
    return -EINVAL;
  if (pool_forked(pool))
    return -ECHILD;
  pthread_mutex_lock(&pool->lock);
  for (s = pool->segs; s; s = s->next)
    n++;
  if (!(v = calloc(n ? n : 1, sizeof(*v)))) {
    pthread_mutex_unlock(&pool->lock);
    return -ENOMEM;
  }
  /* pool->segs is newest first; callers get them in creation order */
  for (s = pool->segs; s; s = s->next) {
    const gshm_segment_info_t *info = gshm_segment_info(s->seg);
    gshm_pool_segment_t *o = &v[n - 1 - i++];
    snprintf(o->name, sizeof(o->name), "%s", info->name);
    o->id = info->id;
    o->generation = info->generation;
    o->size = s->size;
    o->address = s->base;
    o->live_bytes = s->arena.live_bytes;
    o->live_blocks = s->arena.nlive;
  }
  pthread_mutex_unlock(&pool->lock);
  if (!n) {
    free(v);
    v = NULL;
  }
  *segs_out = v;
  *count_out = n;
  return 0;
}

int gshm_pool_release(gshm_pool_t *pool, int unlink) {
  struct pool_seg *s, *next;
  gshm_pool_t **pp;
  bool busy = false;

  if (!pool)
    return -EINVAL;
  if (pool_forked(pool))
    return -ECHILD; /* its names, mappings and context are the parent's */
  pthread_mutex_lock(&pool->lock);
  __atomic_store_n(&pool->released, true, __ATOMIC_RELEASE);
  pool->release_unlinks = unlink != 0;
  if (active_pool == pool)
    active_pool = NULL;
  for (s = pool->segs; s; s = next) {
    next = s->next;
    if (!s->arena.nlive) {
      pool_remove(pool, s, unlink);
    } else {
      /* Live blocks stay mapped; only the name goes. */
      if (unlink)
        pool_seg_unlink(pool, s);
      busy = true;
    }
  }
  pthread_mutex_unlock(&pool->lock);
  if (busy)
    return -EBUSY;
  gshm__fork_lock(GSHM__LOCK_POOLS);
  for (pp = &registry; *pp && *pp != pool; pp = &(*pp)->next)
    ;
  if (*pp)
    *pp = pool->next;
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  /* A malloc or free that found the pool before it left the registry holds
   * (or waits for) its lock: let it finish before the lock goes. */
  pthread_mutex_lock(&pool->lock);
  pthread_mutex_unlock(&pool->lock);
  GSHM_CU(pool->drv, GSHM_LOG_ERR, cuDevicePrimaryCtxRelease, pool->cu_device);
  pthread_mutex_destroy(&pool->lock);
  gshm__fork_lock(GSHM__LOCK_POOLS);
  pool->next = graveyard; /* kept: see graveyard */
  graveyard = pool;
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  return 0;
}
