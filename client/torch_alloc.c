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
 * unregisters a pool and then waits, on the pool's condition, for every
 * thread still at work on it before freeing it.  A thread's active pool is
 * checked against the registry (pointer and serial number) on every
 * malloc, so a pool released by another thread is never dereferenced; a
 * released pool's memory is kept (graveyard), so that no later pool has
 * its address.
 *
 * Neither lock is held across a request on the pool's client (a create,
 * map, stat, unlink or close: each waits for the client's lock, which a
 * gshm_pull of another thread holds for minutes and calls its progress
 * callback under; a callback that lists the pool's segments or activates
 * it would wait for a lock held by a thread that waits for the pull).  A
 * growth marks the pool growing (one at a time: a malloc that finds no
 * room meanwhile waits for it, with the lock dropped, then looks again),
 * makes its requests on a segment no other thread can see, and inserts it
 * under the lock, whole and carved, unless the pool was released
 * meanwhile (it then drops it).  A segment to close (a free emptied it, or
 * a release) leaves p->segs under the lock, so no malloc can carve it, for
 * p->closing, which keeps its number from growths until it is closed
 * without the lock.
 *
 * Fork: the registry's lock is common/fork.h's GSHM__LOCK_POOLS, so a fork
 * waits for the thread that holds it (which may itself wait for a pool's
 * lock: held across no request, but across a free's wait for the
 * device).  A child
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
  pthread_cond_t cond; /* broadcast when growing, closing or waiters goes down */
  struct pool_seg *segs;
  struct pool_seg *closing; /* out of segs, being closed without the lock */
  bool growing;             /* a thread grows the pool without the lock */
  unsigned waiters;         /* mallocs waiting for that growth */
  uint32_t next_index;
  uint32_t uid;    /* gshm_client_uid of client, once uid_known (the growing thread's) */
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

/* Removes name, unless it now belongs to another segment than id (it was
 * unlinked by someone else and created again).  Requests: see "Threads". */
static void pool_name_unlink(gshm_pool_t *p, const char *name, uint64_t id) {
  gshm_segment_info_t now;

  if (!gshm_stat_name(p->client, name, &now) && now.id == id)
    gshm_unlink(p->client, name);
}

/* Removes s's name, if it still has one of p's (pool_name_unlink). */
static void pool_seg_unlink(gshm_pool_t *p, struct pool_seg *s) {
  const gshm_segment_info_t *mine = gshm_segment_info(s->seg);

  if (!s->named)
    return;
  s->named = false;
  pool_name_unlink(p, mine->name, mine->id);
}

/* Unmaps and closes one segment; unlinks its name when asked. */
static void pool_seg_drop(gshm_pool_t *p, struct pool_seg *s, bool unlink) {
  if (unlink)
    pool_seg_unlink(p, s);
  gshm_close(s->seg);
  gshm__arena_fini(&s->arena);
  free(s);
}

/* Moves s from p->segs to p->closing: no malloc carves it any more, and
 * its number stays taken until pool_seg_close.  Caller holds p->lock. */
static void pool_seg_retire(gshm_pool_t *p, struct pool_seg *s) {
  struct pool_seg **pp;

  for (pp = &p->segs; *pp != s; pp = &(*pp)->next)
    ;
  *pp = s->next;
  s->next = p->closing;
  p->closing = s;
}

/* Drops s, which the caller retired (pool_seg_retire) and no longer holds
 * p->lock: its requests are made without the lock (see "Threads"); then,
 * under it, s leaves p->closing and the pool's waiters are woken. */
static void pool_seg_close(gshm_pool_t *p, struct pool_seg *s, bool unlink) {
  struct pool_seg **pp;

  if (unlink)
    pool_seg_unlink(p, s);
  gshm_close(s->seg);
  pthread_mutex_lock(&p->lock);
  for (pp = &p->closing; *pp != s; pp = &(*pp)->next)
    ;
  *pp = s->next;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  gshm__arena_fini(&s->arena);
  free(s);
}

/* Whether one of p's segments, or one it is closing, has number index.
 * Caller holds p->lock. */
static bool pool_index_used(const gshm_pool_t *p, uint32_t index) {
  for (const struct pool_seg *s = p->segs; s; s = s->next)
    if (s->index == index)
      return true;
  for (const struct pool_seg *s = p->closing; s; s = s->next)
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
 * a row were other users' (logged).  Caller holds p->lock and grows p
 * (p->growing): the lock is dropped for the requests, held on return. */
static int pool_name_create(gshm_pool_t *p, uint64_t size, char name[GSHM_NAME_MAX + 1],
                            gshm_segment_t **seg_out, uint32_t *index_out) {
  unsigned taken;
  uint32_t index;
  bool others;
  int e = -EEXIST;

  for (taken = 0; taken < POOL_NAME_TRIES; taken++) {
    index = pool_name_next(p, taken);
    if (index >= POOL_MAX_SEGMENTS)
      return -EMFILE;
    if ((e = segment_name(p->prefix, index, name)))
      return e;
    pthread_mutex_unlock(&p->lock);
    e = gshm_create(p->client, name, size, p->location, p->mode, 0, seg_out);
    others = e == -EEXIST && pool_name_others(p, name);
    pthread_mutex_lock(&p->lock);
    if (e != -EEXIST) {
      if (!e)
        *index_out = index;
      return e;
    }
    if (!others)
      return -EEXIST;
    gshm_log_info("pool '%s': %s is another user's; trying another name", p->prefix, name);
    if (index == p->next_index)
      p->next_index++; /* (never ours to take) */
  }
  gshm_log_err("pool '%s': %u names under the prefix in a row were other users' (names are "
               "first come, first served): use a prefix of your own", p->prefix, taken);
  return e;
}

/* Makes new segment s (named `name`, created for `want` bytes, seen by no
 * other thread: no lock needed) ready to join its pool: its size checked,
 * its name removed for a non-persistent pool, mapped, and `size` bytes
 * carved at *off_out.  On failure s's segment is closed and its name
 * removed. */
static int pool_seg_setup(gshm_pool_t *p, struct pool_seg *s, const char *name, uint64_t want,
                          uint64_t size, uint64_t *off_out) {
  bool named = true;
  void *addr = NULL;
  int e;

  /* The block that asked for this growth must fit in it: a segment the
   * daemon made shorter than asked would be kept, empty, at every try. */
  if (gshm_segment_info(s->seg)->size < want) {
    gshm_log_err("pool '%s': %s has %llu bytes, %llu asked", p->prefix, name,
                 (unsigned long long)gshm_segment_info(s->seg)->size, (unsigned long long)want);
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
  if ((e = gshm__arena_carve(&s->arena, size, off_out)))
    goto fini_arena;
  return 0;

fini_arena:
  gshm__arena_fini(&s->arena);
close_seg:
  /* the segment is ours and new: its name must not outlive the failure */
  if (named)
    gshm_unlink(p->client, name);
  gshm_close(s->seg);
  return e;
}

/* Grows p by a segment of at least `want` bytes (under the pool's next
 * free name: pool_name_create), mapped (and for a non-persistent pool
 * unlinked), with `size` bytes carved from it at *off_out.  Caller holds
 * p->lock and set p->growing: the lock is dropped for the requests and
 * held on return.  The segment joins p->segs whole and carved; when p was
 * released meanwhile it is dropped (-EBADF).  A failed growth leaves
 * nothing behind, nor burns its number. */
static int pool_grow(gshm_pool_t *p, uint64_t want, uint64_t size, struct pool_seg **seg_out,
                     uint64_t *off_out) {
  char name[GSHM_NAME_MAX + 1];
  struct pool_seg *s;
  uint32_t index = 0;
  int e;

  if (p->next_index >= POOL_MAX_SEGMENTS)
    return -EMFILE;
  if (!(s = calloc(1, sizeof(*s))))
    return -ENOMEM;
  if ((e = pool_name_create(p, want, name, &s->seg, &index)))
    goto free_seg;
  pthread_mutex_unlock(&p->lock);
  e = pool_seg_setup(p, s, name, want, size, off_out);
  pthread_mutex_lock(&p->lock);
  if (e)
    goto free_seg;
  s->named = p->flags & GSHM_POOL_PERSISTENT;
  if (p->released) { /* by another thread, meanwhile: no malloc may have it */
    pthread_mutex_unlock(&p->lock);
    pool_seg_drop(p, s, true);
    pthread_mutex_lock(&p->lock);
    return -EBADF;
  }
  s->index = index;
  if (index == p->next_index)
    p->next_index++;
  s->next = p->segs;
  p->segs = s;
  *seg_out = s;
  gshm_log_debug("pool '%s': segment %s of %llu bytes at 0x%llx", p->prefix, name,
                 (unsigned long long)s->size, (unsigned long long)s->base);
  return 0;

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
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
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

/* Carves `size` bytes out of the best fit of p's segments: the free
 * extent that the block leaves least of (the oldest segment among
 * equals); NULL when none fits.  First fit from the newest segment left
 * the tails of older arenas empty for good: a 16 GiB Llama took 86 arenas
 * of 256 MiB, 71 this way (32% and 9% over its weights;
 * docs/PERFORMANCE.md).  Caller holds p->lock. */
static struct pool_seg *pool_fit(gshm_pool_t *p, uint64_t size, uint64_t *off_out) {
  struct pool_seg *s, *best = NULL;
  uint64_t left, best_left = 0;

  if (p->flags & GSHM_POOL_SEGMENT_PER_ALLOC)
    return NULL;
  for (s = p->segs; s; s = s->next)
    if (!gshm__arena_fit(&s->arena, size, &left) && (!best || left <= best_left)) {
      best = s;
      best_left = left;
    }
  return best && !gshm__arena_carve(&best->arena, size, off_out) ? best : NULL;
}

/* Carves `size` bytes out of p, growing it when nothing fits.  Caller
 * holds p->lock (dropped while it waits for another thread's growth and
 * while it grows: see "Threads"). */
static int pool_malloc(gshm_pool_t *p, uint64_t size, void **ptr_out) {
  struct pool_seg *s;
  uint64_t off = 0;
  int e;

  for (;;) {
    if (p->released)
      return -EBADF;
    if ((s = pool_fit(p, size, &off)))
      break;
    if (!p->growing) {
      uint64_t want = round_up(size, POOL_SEG_ROUND);
      if (!(p->flags & GSHM_POOL_SEGMENT_PER_ALLOC) && want < p->granule)
        want = p->granule;
      /* A growth inside a stream capture (a PyTorch that calls allocators
       * outside its own relaxed-mode guard) imports, maps and gives access
       * to memory outside any stream, calls that end a global-mode capture
       * of any thread: this thread may make them, as PyTorch's own
       * allocator does (cudaMallocMaybeCapturing), and its unwinding too. */
      CUstreamCaptureMode mode = gshm__capture_relax(p->drv);
      p->growing = true;
      e = pool_grow(p, want, size, &s, &off);
      p->growing = false;
      pthread_cond_broadcast(&p->cond);
      gshm__capture_restore(p->drv, mode);
      if (e)
        return e;
      break;
    }
    /* Another thread grows p: its segment may take this block too (as when
     * the growth held the lock), so wait for it and look again. */
    p->waiters++;
    pthread_cond_wait(&p->cond, &p->lock);
    if (!--p->waiters)
      pthread_cond_broadcast(&p->cond); /* (a release may wait for none) */
  }
  p->allocations++;
  *ptr_out = (void *)(uintptr_t)(s->base + off);
  return 0;
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
   * a persistent one keeps it under its names until gshm_pool_release.
   * Closed without the lock (see "Threads"). */
  if (!e && !s->arena.nlive && (!(p->flags & GSHM_POOL_PERSISTENT) || p->released)) {
    bool unlink = p->release_unlinks;
    pool_seg_retire(p, s);
    pthread_mutex_unlock(&p->lock);
    pool_seg_close(p, s, unlink);
  } else {
    pthread_mutex_unlock(&p->lock);
  }
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

/* A name that a release removes once it dropped the pool's lock. */
struct pool_name {
  char name[GSHM_NAME_MAX + 1];
  uint64_t id;
};

/* The names of p's segments that hold live blocks, taken from them (their
 * close then removes none) into a malloc'ed array of *count_out entries,
 * for a release to remove without the lock; NULL when there are none, or
 * no memory for them (their names then go when their segments close, as
 * p->release_unlinks asks).  Caller holds p->lock. */
static struct pool_name *pool_names_take(gshm_pool_t *p, size_t *count_out) {
  struct pool_name *v;
  struct pool_seg *s;
  size_t n = 0;

  *count_out = 0;
  for (s = p->segs; s; s = s->next)
    n += s->arena.nlive && s->named;
  if (!n || !(v = calloc(n, sizeof(*v))))
    return NULL;
  for (s = p->segs; s; s = s->next)
    if (s->arena.nlive && s->named) {
      const gshm_segment_info_t *info = gshm_segment_info(s->seg);
      struct pool_name *o = &v[(*count_out)++];
      snprintf(o->name, sizeof(o->name), "%s", info->name);
      o->id = info->id;
      s->named = false;
    }
  return v;
}

int gshm_pool_release(gshm_pool_t *pool, int unlink) {
  struct pool_name *names = NULL;
  struct pool_seg *s;
  gshm_pool_t **pp;
  size_t nnames = 0;
  bool busy;

  if (!pool)
    return -EINVAL;
  if (pool_forked(pool))
    return -ECHILD; /* its names, mappings and context are the parent's */
  pthread_mutex_lock(&pool->lock);
  __atomic_store_n(&pool->released, true, __ATOMIC_RELEASE);
  pool->release_unlinks = unlink != 0;
  if (active_pool == pool)
    active_pool = NULL;
  /* Live blocks stay mapped; only the name goes. */
  if (unlink)
    names = pool_names_take(pool, &nnames);
  /* Each empty segment is closed without the lock (see "Threads"); a free
   * meanwhile closes the one it empties itself (p->released). */
  for (;;) {
    for (s = pool->segs; s && s->arena.nlive; s = s->next)
      ;
    if (!s)
      break;
    pool_seg_retire(pool, s);
    pthread_mutex_unlock(&pool->lock);
    pool_seg_close(pool, s, unlink);
    pthread_mutex_lock(&pool->lock);
  }
  busy = pool->segs != NULL;
  pthread_mutex_unlock(&pool->lock);
  for (size_t i = 0; i < nnames; i++)
    pool_name_unlink(pool, names[i].name, names[i].id);
  free(names);
  if (busy)
    return -EBUSY;
  gshm__fork_lock(GSHM__LOCK_POOLS);
  for (pp = &registry; *pp && *pp != pool; pp = &(*pp)->next)
    ;
  if (*pp)
    *pp = pool->next;
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  /* A malloc or free that found the pool before it left the registry holds
   * (or waits for) its lock; a growth, a close or a malloc waiting for that
   * growth is under way without it: let them all finish before the lock
   * goes. */
  pthread_mutex_lock(&pool->lock);
  while (pool->growing || pool->closing || pool->waiters)
    pthread_cond_wait(&pool->cond, &pool->lock);
  pthread_mutex_unlock(&pool->lock);
  GSHM_CU(pool->drv, GSHM_LOG_ERR, cuDevicePrimaryCtxRelease, pool->cu_device);
  pthread_cond_destroy(&pool->cond);
  pthread_mutex_destroy(&pool->lock);
  gshm__fork_lock(GSHM__LOCK_POOLS);
  pool->next = graveyard; /* kept: see graveyard */
  graveyard = pool;
  gshm__fork_unlock(GSHM__LOCK_POOLS);
  return 0;
}
