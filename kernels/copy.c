/* SPDX-License-Identifier: Apache-2.0 */
/* Host side of the copy kernels: gshm_copy, gshm_signal, gshm_wait.
 *
 * The kernels (kernels/copy.cu) are embedded as a fatbin and loaded with
 * cuModuleLoadData lazily, once per CUcontext, through the dlopen'ed driver
 * table (common/cudadrv.h); libgshm links neither cudart nor libcuda. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "copy_internal.h"
#include "cudadrv.h"
#include "fork.h"
#include "gshm.h"
#include "log.h"

#ifdef GSHM_HAVE_COPY_FATBIN
extern const unsigned long long gshm__copy_fatbin[];

static const char *const kernel_names[GSHM__K_COUNT] = {
    [GSHM__K_COPY_U1] = "gshm_copy_u1",         [GSHM__K_COPY_U4] = "gshm_copy_u4",
    [GSHM__K_COPY_U8] = "gshm_copy_u8",         [GSHM__K_COPY_SIGNAL] = "gshm_copy_signal",
    [GSHM__K_SIGNAL] = "gshm_signal",           [GSHM__K_FILL32] = "gshm_fill32",
    [GSHM__K_COMPARE] = "gshm_compare",
};
#endif

/* Largest copy done by the one-block fused copy-then-signal kernel; above
 * it a copy is followed by a separate gshm_signal (docs/PERFORMANCE.md
 * "AUTO thresholds"). */
#define FUSED_SIGNAL_MAX (256u << 10)
#define MAX_CONTEXTS 64
#define MAX_DEVICES 64

/* One loaded module per context, found by handle and checked by the
 * context's unique id (cuCtxGetId, CUDA 12.0+): a primary context reset
 * (cudaDeviceReset) keeps the handle but not the module, events or peer
 * access, and a context destroyed and created again can get the old
 * handle; either way the entry is rebuilt.  Entries are never removed: a
 * process that uses more than MAX_CONTEXTS contexts over its life gets
 * -ENOMEM from then on (an entry that could not be made takes no slot).
 * Fields are written under the table's lock; dev, sm_count, can_flush
 * and fn are also read without it (KLOAD), by a caller holding the entry,
 * while another thread may be remaking it: written with KSTORE, they read
 * as the old value or the new, never torn (what such a caller then does
 * is bounded: kctx_current). */
struct kctx {
  CUcontext ctx;
  unsigned long long ctx_id; /* 0: cuCtxGetId unavailable */
  CUdevice dev;
  int sm_count;
  int can_flush;         /* CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES */
  int module_state;      /* 0 not tried, 1 loaded, <0 errno */
  CUmodule module;
  CUfunction fn[GSHM__K_COUNT];
  CUdeviceptr scratch;   /* 8 bytes: gshm_compare's counter */
  CUevent order_ev;      /* gshm__copy_ctx_event's, created on first use */
  uint64_t peer_tried, peer_ok; /* by GPU ordinal */
  /* the peer's primary context (cuCtxGetId) when access was enabled: a
   * reset there ends the access, which is then enabled again */
  unsigned long long peer_ctx_id[MAX_DEVICES];
  CUcontext peer_ctx[MAX_DEVICES];
  int peer_err[MAX_DEVICES]; /* the failed first try's error, given again */
};

#define KLOAD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)
#define KSTORE(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)

/* Under GSHM__LOCK_COPY (common/fork.h).  A fork waits for its holder
 * (which may be loading a module: seconds where the PTX is compiled); the
 * child of a process that used them has the parent's contexts, modules,
 * events and primary contexts here, none of which it can use (CUDA does
 * not survive fork): every entry point loads the driver first, which
 * there is -ECHILD, so the child never looks at them. */
static struct kctx table[MAX_CONTEXTS];
static int table_len;
static CUcontext primary[MAX_DEVICES]; /* retained once (again after a reset), never released */
static unsigned long long primary_id[MAX_DEVICES]; /* its cuCtxGetId at the retain (0: unknown) */

int gshm__copy_have_kernels(void) {
#ifdef GSHM_HAVE_COPY_FATBIN
  return 1;
#else
  return 0;
#endif
}

/* ---- tuning, from measurements ----
 *
 * Every threshold below (launch shape, AUTO's sizes) and the gshm-bench
 * runs behind it are in docs/PERFORMANCE.md "AUTO thresholds"; change
 * them there and here together.  The grid is spread: one 16-byte vector
 * per thread until SM_BLOCKS_PER_SM blocks per SM, grid-stride past it
 * (too few blocks is what hurts, pulls most); small copies use the
 * unroll-free kernel. */
#define SM_SMALL_MAX (64u << 10) /* up to here: unroll-free kernel */
#define SM_THREADS 512
#define SM_BLOCKS_PER_SM 2

struct gshm__copy_shape gshm__copy_pick_shape(size_t bytes, int sm_count, int pull) {
  struct gshm__copy_shape s;
  size_t n16 = bytes / 16 + 2, blocks, cap;

  (void)pull; /* same shape: pulls need the spread most, pushes don't mind */
  if (sm_count <= 0)
    sm_count = 1;
  if (bytes <= SM_SMALL_MAX) {
    size_t t = (n16 + 31) / 32 * 32;
    s.kernel = GSHM__K_COPY_U1;
    s.threads = (unsigned)(t < 32 ? 32 : t > 1024 ? 1024 : t);
  } else {
    s.kernel = GSHM__K_COPY_U4;
    s.threads = SM_THREADS;
  }
  blocks = (n16 + s.threads - 1) / s.threads;
  cap = (size_t)sm_count * SM_BLOCKS_PER_SM;
  s.blocks = (unsigned)(blocks < 1 ? 1 : blocks > cap ? cap : blocks);
  return s;
}

/* AUTO: the largest size (bytes, inclusive) up to which the SM kernel beat
 * the copy engine, by kind of copy (docs/PERFORMANCE.md "AUTO
 * thresholds"); the copy engine above it. */
static const size_t auto_sm_max_push = 2u << 20;
static const size_t auto_sm_max_pull = 512u << 10;
static const size_t auto_sm_max_local = 32u << 20;

int gshm__copy_auto_method(size_t bytes, enum gshm__copy_peer peer) {
  size_t max = peer == GSHM__COPY_LOCAL  ? auto_sm_max_local
               : peer == GSHM__COPY_PUSH ? auto_sm_max_push
                                         : auto_sm_max_pull;

  if (!gshm__copy_have_kernels())
    return GSHM_COPY_ENGINE;
  return bytes <= max ? GSHM_COPY_SM : GSHM_COPY_ENGINE;
}

/* ---- contexts and modules ---- */

/* The device of a context that need not be current: cuCtxGetDevice_v2
 * (CUDA 13.0) takes the context; older drivers only answer for the current
 * one, so push it around the v1 call. */
static int ctx_device(const struct gshm_cudadrv *drv, CUcontext ctx, CUdevice *dev) {
  CUcontext popped;
  int e;

  if (drv->cuCtxGetDevice_v2)
    return GSHM_CU(drv, GSHM_LOG_ERR, cuCtxGetDevice_v2, dev, ctx);
  if ((e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxPushCurrent, ctx)))
    return e;
  e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxGetDevice, dev);
  drv->cuCtxPopCurrent(&popped);
  return e;
}

/* The context a stream belongs to; the 12.5 variant also reports a green
 * context, which we do not use. */
static int stream_ctx(const struct gshm_cudadrv *drv, CUstream stream, CUcontext *ctx) {
  CUgreenCtx green = NULL;

  if (drv->cuStreamGetCtx_v2)
    return GSHM_CU(drv, GSHM_LOG_ERR, cuStreamGetCtx_v2, stream, ctx, &green);
  return GSHM_CU(drv, GSHM_LOG_ERR, cuStreamGetCtx, stream, ctx);
}

/* The driver for copies, signals and broadcasts: its absence is an error
 * of the call (logged at ERR once). */
static int copy_driver_load(const struct gshm_cudadrv **drv) {
  return gshm__cudadrv_load(GSHM_LOG_ERR, drv);
}

/* Loads the module into k's context (which is current).  Under the table's lock. */
static int module_load(const struct gshm_cudadrv *drv, struct kctx *k) {
#ifdef GSHM_HAVE_COPY_FATBIN
  CUstreamCaptureMode mode;
  bool loaded;
  int e;

  if (k->module_state)
    return k->module_state < 0 ? k->module_state : 0;
  /* the first copy of a context may come inside a stream capture, where
   * loading a module is a call the capture forbids (it would end the
   * capture): this thread may make it (as PyTorch's allocator does), and
   * the lookups too, which is where a driver that loads lazily
   * (CUDA_MODULE_LOADING=LAZY, Linux's default from CUDA 12.2) loads each
   * kernel */
  mode = gshm__capture_relax(drv);
  e = GSHM_CU(drv, GSHM_LOG_ERR, cuModuleLoadData, &k->module, gshm__copy_fatbin);
  loaded = !e;
  for (int i = 0; loaded && i < GSHM__K_COUNT && !e; i++) {
    CUfunction f = NULL;
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuModuleGetFunction, &f, k->module, kernel_names[i]);
    KSTORE(k->fn[i], f);
  }
  if (loaded && e)
    drv->cuModuleUnload(k->module); /* (in the relaxed span too: unsafe as a load) */
  gshm__capture_restore(drv, mode);
  if (!loaded && e == -ENOMEM)
    return e; /* maybe transient (the GPU is full now): try again next time */
  if (!loaded) {
    /* NO_BINARY_FOR_GPU and friends: an architecture our fatbin lacks */
    k->module_state = e == -EIO ? -ENOTSUP : e;
    return k->module_state;
  }
  if (e) {
    if (e != -ENOMEM && e != -EIO)
      k->module_state = e; /* else maybe transient: try again next time */
    return e;
  }
  k->module_state = 1;
  return 0;
#else
  (void)drv;
  (void)k;
  return -ENOTSUP;
#endif
}

/* Forgets what k held for a context that is gone (nothing to free: it
 * went with the context).  Under the table's lock. */
static void kctx_forget(struct kctx *k) {
  k->ctx = NULL; /* an unused slot (matches no context) until kctx_fill */
  k->ctx_id = 0;
  k->module_state = 0;
  k->module = NULL;
  k->scratch = 0;
  k->order_ev = NULL;
  k->peer_tried = k->peer_ok = 0;
  memset(k->peer_ctx_id, 0, sizeof(k->peer_ctx_id));
  memset(k->peer_ctx, 0, sizeof(k->peer_ctx));
  memset(k->peer_err, 0, sizeof(k->peer_err));
  for (int i = 0; i < GSHM__K_COUNT; i++)
    KSTORE(k->fn[i], (CUfunction)NULL);
}

/* Makes k the entry of ctx (id: its cuCtxGetId, 0 unknown), forgotten
 * before.  Under the table's lock.  Returns 0 or the driver's error (k
 * then stays an unused slot). */
static int kctx_fill(const struct gshm_cudadrv *drv, struct kctx *k, CUcontext ctx,
                     unsigned long long id) {
  CUdevice dev;
  int sm_count = 0, can_flush = 0, e;

  e = ctx_device(drv, ctx, &dev);
  if (!e)
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuDeviceGetAttribute, &sm_count,
                CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  if (e)
    return e;
  if (drv->cuDeviceGetAttribute(&can_flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, dev) !=
      CUDA_SUCCESS)
    can_flush = 0;
  KSTORE(k->dev, dev);
  KSTORE(k->sm_count, sm_count);
  KSTORE(k->can_flush, can_flush);
  k->ctx = ctx;
  k->ctx_id = id;
  return 0;
}

/* The table entry of the current context (created on first use).  The
 * context's id is read under the table's lock, so that the entry's is
 * always the latest any thread saw: an entry is remade only for a context
 * reset or re-created after it was made, never because a thread read the
 * id before another remade the entry for the new context (the two would
 * remake it in turn, each wiping what the other's copies were using).  A
 * caller still using an entry being remade uses a context that is gone:
 * its launches fail (the module went with the context) whatever it reads
 * (KLOAD: the old values or the new). */
static int kctx_current(const struct gshm_cudadrv *drv, struct kctx **k_out) {
  CUcontext ctx = NULL;
  struct kctx *k = NULL;
  unsigned long long id = 0;
  bool fresh = false;
  int e;

  e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxGetCurrent, &ctx);
  if (e)
    return e;
  if (!ctx)
    return -EINVAL;
  gshm__fork_lock(GSHM__LOCK_COPY);
  if (drv->cuCtxGetId && drv->cuCtxGetId(ctx, &id) != CUDA_SUCCESS)
    id = 0;
  for (int i = 0; i < table_len; i++)
    if (table[i].ctx == ctx) {
      k = &table[i];
      break;
    }
  if (k && id && k->ctx_id != id) {
    /* another context behind the same handle: what the entry held went
     * with the old one (nothing to free) */
    gshm_log_info("copy: context %p was reset or re-created; reloading", (void *)ctx);
    fresh = true;
  } else if (!k) {
    /* a slot whose entry could not be made (below) is free again: else
     * every such failure would keep one, and 64 would end all copies */
    for (int i = 0; i < table_len && !k; i++)
      if (!table[i].ctx)
        k = &table[i];
    if (!k && table_len == MAX_CONTEXTS) {
      gshm__fork_unlock(GSHM__LOCK_COPY);
      gshm_log_err("copy: more than %d CUDA contexts", MAX_CONTEXTS);
      return -ENOMEM;
    }
    if (!k)
      k = &table[table_len++];
    fresh = true;
  }
  if (fresh) {
    kctx_forget(k);
    if ((e = kctx_fill(drv, k, ctx, id))) {
      gshm__fork_unlock(GSHM__LOCK_COPY);
      return e;
    }
  }
  gshm__fork_unlock(GSHM__LOCK_COPY);
  *k_out = k;
  return 0;
}

int gshm__copy_ctx_event(const struct gshm_cudadrv *drv, CUevent *out) {
  struct kctx *k;
  int e = kctx_current(drv, &k);

  if (e)
    return e;
  gshm__fork_lock(GSHM__LOCK_COPY);
  if (!k->order_ev)
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuEventCreate, &k->order_ev, CU_EVENT_DISABLE_TIMING);
  if (!e)
    *out = k->order_ev;
  gshm__fork_unlock(GSHM__LOCK_COPY);
  return e;
}

/* k with its module loaded. */
static int kctx_module(const struct gshm_cudadrv *drv, struct kctx **k_out) {
  struct kctx *k;
  int e = kctx_current(drv, &k);

  if (e)
    return e;
  gshm__fork_lock(GSHM__LOCK_COPY);
  e = module_load(drv, k);
  gshm__fork_unlock(GSHM__LOCK_COPY);
  if (!e)
    *k_out = k;
  return e;
}

/* Notes the id of primary[ordinal] (cuCtxGetId, CUDA 12.0; 0 without). */
static void primary_id_note(const struct gshm_cudadrv *drv, int ordinal) {
  primary_id[ordinal] = 0;
  if (drv->cuCtxGetId && drv->cuCtxGetId(primary[ordinal], &primary_id[ordinal]) != CUDA_SUCCESS)
    primary_id[ordinal] = 0;
}

/* Whether active primary[ordinal] is no longer the context it was at its
 * retain: reset since and made again by someone else's retain (the
 * handle dead, CUDA_ERROR_CONTEXT_IS_DESTROYED, or another context's id:
 * a new context gets a new id).  False where the driver cannot tell. */
static bool primary_ctx_remade(const struct gshm_cudadrv *drv, int ordinal) {
  unsigned long long id = 0;
  CUresult r;

  if (!drv->cuCtxGetId)
    return false;
  r = drv->cuCtxGetId(primary[ordinal], &id);
  return r == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
         (r == CUDA_SUCCESS && primary_id[ordinal] && id != primary_id[ordinal]);
}

int gshm__copy_primary_ctx(const struct gshm_cudadrv *drv, int ordinal, CUcontext *out) {
  CUstreamCaptureMode mode;
  int e = 0;

  if (ordinal < 0 || ordinal >= MAX_DEVICES)
    return -ENODEV;
  /* a retain that makes the context (or a release that ends it)
   * allocates device memory outside any stream, as cudaMalloc, the
   * example CUDA gives of a "potentially unsafe" call (it lists no
   * others): one refused while a global-mode capture runs in any thread,
   * and that ends the capture.  This thread may make them (as
   * module_load) */
  mode = gshm__capture_relax(drv);
  gshm__fork_lock(GSHM__LOCK_COPY);
  if (primary[ordinal]) {
    /* reset since (cuDevicePrimaryCtxReset, cudaDeviceReset), and nobody
     * retained it again: inactive although we hold a retain, and the
     * handle is dead until the next retain.  A reset does not release a
     * retain (the driver API's cuDevicePrimaryCtxReset), so ours is given
     * back before the retain below takes another: else each reset kept
     * one more count, and the context could never go.  (A driver whose
     * reset did drop the count refuses the release: nothing lost.) */
    unsigned flags = 0;
    int active = 1;
    CUdevice dev;
    if (drv->cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS) {
      /* (keeps the handle: the copy will say what is wrong) */
    } else if (drv->cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active) {
      (void)GSHM_CU(drv, GSHM_LOG_DEBUG, cuDevicePrimaryCtxRelease, dev);
      primary[ordinal] = NULL;
    } else if (primary_ctx_remade(drv, ordinal)) {
      /* reset, then made again by another retain (cudart, torch): our
       * count still stands; a retain gives the live handle and its
       * release the count back */
      CUcontext now;
      if (!(e = GSHM_CU(drv, GSHM_LOG_ERR, cuDevicePrimaryCtxRetain, &now, dev))) {
        (void)GSHM_CU(drv, GSHM_LOG_WARNING, cuDevicePrimaryCtxRelease, dev);
        primary[ordinal] = now;
        primary_id_note(drv, ordinal);
      }
    }
  }
  if (!e && !primary[ordinal]) {
    CUdevice dev;
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuDeviceGet, &dev, ordinal);
    if (!e)
      e = GSHM_CU(drv, GSHM_LOG_ERR, cuDevicePrimaryCtxRetain, &primary[ordinal], dev);
    if (!e)
      primary_id_note(drv, ordinal);
  }
  if (!e)
    *out = primary[ordinal];
  gshm__fork_unlock(GSHM__LOCK_COPY);
  gshm__capture_restore(drv, mode);
  return e;
}

int gshm__copy_enable_peer(int ordinal) {
  const struct gshm_cudadrv *drv;
  struct kctx *k;
  CUcontext peer;
  uint64_t bit;
  unsigned long long was, id = 0;
  bool tried, ok;
  int can = 0, e, cached;
  CUstreamCaptureMode mode;
  CUresult r;

  e = copy_driver_load(&drv);
  if (!e)
    e = kctx_current(drv, &k);
  if (e)
    return e;
  if (ordinal == (int)KLOAD(k->dev))
    return 0;
  if (ordinal < 0 || ordinal >= MAX_DEVICES)
    return -ENODEV;
  bit = 1ull << ordinal;
  gshm__fork_lock(GSHM__LOCK_COPY);
  tried = k->peer_tried & bit;
  ok = k->peer_ok & bit;
  was = k->peer_ctx_id[ordinal];
  peer = k->peer_ctx[ordinal];
  cached = k->peer_err[ordinal];
  gshm__fork_unlock(GSHM__LOCK_COPY);
  if (tried && (!ok || !was))
    return ok ? 0 : cached ? cached : -EXDEV;
  /* one driver call: the context access was enabled to is still there (a
   * reset destroys it or gives the handle a new id) */
  if (tried && drv->cuCtxGetId(peer, &id) == CUDA_SUCCESS && id == was)
    return 0;

  e = GSHM_CU(drv, GSHM_LOG_ERR, cuDeviceCanAccessPeer, &can, KLOAD(k->dev), (CUdevice)ordinal);
  if (!e && !can)
    e = -EXDEV;
  mode = gshm__capture_relax(drv); /* as module_load */
  if (!e)
    e = gshm__copy_primary_ctx(drv, ordinal, &peer);
  if (!e) {
    if (!drv->cuCtxGetId || drv->cuCtxGetId(peer, &id) != CUDA_SUCCESS)
      id = 0; /* cannot tell a reset: trust the first answer */
    r = drv->cuCtxEnablePeerAccess(peer, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
      gshm__cuda_log(GSHM_LOG_ERR, r, "cuCtxEnablePeerAccess", __FILE__, __LINE__);
      e = r == CUDA_ERROR_TOO_MANY_PEERS ? -EXDEV : gshm__cuda_errno(r);
    }
  }
  gshm__capture_restore(drv, mode);
  if (e == -ENOMEM || e == -EIO)
    return e; /* maybe transient: try again next time */
  gshm__fork_lock(GSHM__LOCK_COPY);
  k->peer_tried |= bit;
  k->peer_ok &= ~bit;
  if (!e)
    k->peer_ok |= bit;
  k->peer_ctx_id[ordinal] = id;
  k->peer_ctx[ordinal] = peer;
  k->peer_err[ordinal] = e;
  gshm__fork_unlock(GSHM__LOCK_COPY);
  return e;
}

/* ---- launches ---- */

/* Launches kernel `kern` of k's module.  pdl: with programmatic stream
 * serialization (the kernel may be scheduled while the previous kernel on
 * the stream still runs; copy.cu's pdl_prologue keeps stream order).  It
 * saves about a microsecond per back-to-back copy on H200 (gshm-bench copy,
 * latency table, "SM" vs "SM no PDL"). */
static int launch_ex(const struct gshm_cudadrv *drv, struct kctx *k, enum gshm__kernel kern,
                     unsigned blocks, unsigned threads, CUstream stream, void **args, int pdl) {
  CUlaunchAttribute attr;
  CUlaunchConfig cfg;

  if (!pdl)
    return GSHM_CU(drv, GSHM_LOG_ERR, cuLaunchKernel, KLOAD(k->fn[kern]), blocks, 1, 1, threads,
                   1, 1, 0, stream, args, NULL);
  memset(&attr, 0, sizeof(attr));
  memset(&cfg, 0, sizeof(cfg));
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  cfg.gridDimX = blocks;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = threads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return GSHM_CU(drv, GSHM_LOG_ERR, cuLaunchKernelEx, &cfg, KLOAD(k->fn[kern]), args,
                 NULL);
}

static int launch(const struct gshm_cudadrv *drv, struct kctx *k, enum gshm__kernel kern,
                  unsigned blocks, unsigned threads, CUstream stream, void **args) {
  return launch_ex(drv, k, kern, blocks, threads, stream, args, 0);
}

int gshm__copy_launch(void *dst, const void *src, size_t bytes, enum gshm__kernel kernel,
                      unsigned blocks, unsigned threads, int pdl, CUstream stream) {
  const struct gshm_cudadrv *drv;
  struct kctx *k;
  void *args[3] = {&dst, &src, &bytes};
  int e;

  if (kernel > GSHM__K_COPY_U8 || !blocks || threads < 32 || threads > 1024)
    return -EINVAL;
  e = copy_driver_load(&drv);
  if (!e)
    e = kctx_module(drv, &k);
  if (e)
    return e;
  return launch_ex(drv, k, kernel, blocks, threads, stream, args, pdl);
}

int gshm__copy_fill(void *p, size_t bytes, uint32_t seed, CUstream stream) {
  const struct gshm_cudadrv *drv;
  struct kctx *k;
  size_t n32 = bytes / 4;
  void *args[3] = {&p, &n32, &seed};
  int e;

  if (bytes % 4 || (uintptr_t)p % 4)
    return -EINVAL;
  e = copy_driver_load(&drv);
  if (!e)
    e = kctx_module(drv, &k);
  if (e)
    return e;
  return launch(drv, k, GSHM__K_FILL32, (unsigned)KLOAD(k->sm_count) * 4, 512, stream, args);
}

int gshm__copy_compare(const void *a, const void *b, size_t bytes, CUstream stream,
                       uint64_t *bad_out) {
  const struct gshm_cudadrv *drv;
  struct kctx *k;
  unsigned long long bad = 0;
  CUdeviceptr scratch;
  void *counter;
  void *args[4] = {&a, &b, &bytes, &counter};
  int e;

  e = copy_driver_load(&drv);
  if (!e)
    e = kctx_module(drv, &k);
  if (e)
    return e;
  /* the counter: made on the first compare (a test's), not with the
   * module, whose load a copy inside a stream capture may trigger */
  gshm__fork_lock(GSHM__LOCK_COPY);
  if (!k->scratch)
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuMemAlloc, &k->scratch, 8);
  scratch = k->scratch; /* (k may be remade once the lock is let go) */
  gshm__fork_unlock(GSHM__LOCK_COPY);
  if (e)
    return e;
  counter = (void *)(uintptr_t)scratch;
  e = GSHM_CU(drv, GSHM_LOG_ERR, cuMemsetD8Async, scratch, 0, 8, stream);
  if (!e)
    e = launch(drv, k, GSHM__K_COMPARE, (unsigned)KLOAD(k->sm_count) * 4, 512, stream, args);
  if (!e)
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuMemcpyAsync, (CUdeviceptr)(uintptr_t)&bad, scratch, 8,
                stream);
  if (!e)
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuStreamSynchronize, stream);
  if (!e)
    *bad_out = bad;
  return e;
}

/* ---- gshm_copy ---- */

void gshm__copy_where(const struct gshm_cudadrv *drv, const void *p, struct gshm__where *w) {
  CUmemorytype type = 0;
  int ordinal = -1;

  memset(w, 0, sizeof(*w));
  w->ordinal = -1;
  w->addr = (uintptr_t)p;
  if (drv->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
    return; /* pageable host memory (or garbage: the copy will say) */
  if (type == CU_MEMORYTYPE_DEVICE &&
      drv->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS) {
    w->device = 1;
    w->ordinal = ordinal;
  } else {
    w->pinned = 1;
  }
}

/* Whether device memory at addr, which the current context's GPU cannot
 * use as asked (with peer access enabled, where it is another GPU's), is a
 * cuMem range (cuMemMap's, or a memory pool's), whose access is given per
 * device, rather than cuMemAlloc memory of a context this one does not
 * reach (another context of its GPU, or one other than the primary
 * context peer access goes to).  Up to three driver calls, on that
 * refusal path only. */
static bool cumem_range(const struct gshm_cudadrv *drv, uintptr_t addr) {
  unsigned long long legacy = 0; /* a boolean: the driver writes 4 bytes or 8 */
  CUmemoryPool pool = NULL;
  CUmemGenericAllocationHandle h;

  if (drv->cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                 (CUdeviceptr)addr) == CUDA_SUCCESS &&
      legacy)
    return false; /* cuMemAlloc's */
  if (drv->cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)addr) ==
          CUDA_SUCCESS &&
      pool)
    return true;
  if (drv->cuMemRetainAllocationHandle(&h, (void *)addr) != CUDA_SUCCESS)
    return false; /* not cuMemMap's, or unknown */
  (void)GSHM_CU(drv, GSHM_LOG_WARNING, cuMemRelease, h);
  return true;
}

/* CU_POINTER_ATTRIBUTE_ACCESS_FLAGS of addr for the current context's GPU
 * (CU_POINTER_ATTRIBUTE_ACCESS_FLAG_*), or -1 where the driver does not
 * say. */
static int access_flags(const struct gshm_cudadrv *drv, uintptr_t addr) {
  unsigned long long flags = 0; /* an enum: the driver writes 4 bytes or 8 */

  if (drv->cuPointerGetAttribute(&flags, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, (CUdeviceptr)addr) !=
      CUDA_SUCCESS)
    return -1;
  return (int)(unsigned)flags;
}

/* gshm__copy_reach for device memory gshm_map did not map (cuMemAlloc's,
 * PyTorch's expandable segments, a memory pool's, legacy IPC imports):
 * the access flags the driver reports for the current context's GPU `me`
 * (one driver call where they allow the use: the common path).  Where
 * they do not and the memory is on another GPU, cuMemAlloc memory and
 * legacy IPC imports read "no access" until peer access is enabled, which
 * the copy paths do anyway: it is enabled here and the flags read again
 * (no peer path: 0, the driver's rules, which copy through the host on the
 * copy engine).  Still short (or short on the memory's own GPU, where
 * memory of another context of that GPU is the one case that is not a
 * cuMem range), the memory is refused where it is a cuMem range
 * (cumem_range).  Returns 0, -EXDEV (no access) or -EACCES (read-only, to
 * be written), as for a gshm mapping. */
static int foreign_reach(const struct gshm__where *w, size_t bytes, int me, int write) {
  const struct gshm_cudadrv *drv;
  int f;

  if (copy_driver_load(&drv) || (f = access_flags(drv, w->addr)) < 0)
    return 0;
  if (f == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE ||
      (!write && f == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ))
    return 0;
  if (w->ordinal != me &&
      (gshm__copy_enable_peer(w->ordinal) || (f = access_flags(drv, w->addr)) < 0 ||
       f == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE ||
       (!write && f == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ)))
    return 0;
  if (!cumem_range(drv, w->addr))
    return 0;
  gshm_log_err("GPU %d has %s access to 0x%llx (+%zu bytes), cuMem memory of GPU %d that "
               "gshm_map did not map: give that GPU access (cuMemSetAccess)",
               me, f == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ ? "read-only" : "no",
               (unsigned long long)w->addr, bytes, w->ordinal);
  return f == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ ? -EACCES : -EXDEV;
}

int gshm__copy_reach(const struct gshm__where *w, size_t bytes, int me, int write) {
  unsigned long long flags = 0;
  int found;

  if (!w->device) {
    /* (the driver would write through a PROT_READ mapping: a fault in
     * its own thread, or an error of its choosing) */
    if (write && gshm__host_read_only && gshm__host_read_only(w->addr, bytes)) {
      gshm_log_err("0x%llx (+%zu bytes) is in a host segment mapped read-only (a read-only "
                   "lease): it cannot be written",
                   (unsigned long long)w->addr, bytes);
      return -EACCES;
    }
    return 0;
  }
  if (me < 0)
    return 0;
  if (!gshm__map_access || !(found = gshm__map_access(w->addr, bytes, me, &flags)))
    return foreign_reach(w, bytes, me, write); /* the driver's own rules, and its access flags */
  if (found == 2) {
    gshm_log_err("0x%llx (+%zu bytes) is partly in a segment gshm_map mapped: it starts "
                 "before the segment or runs past its end",
                 (unsigned long long)w->addr, bytes);
    return -ERANGE;
  }
  if (flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ||
      (!write && flags == CU_MEM_ACCESS_FLAGS_PROT_READ))
    return 1; /* its access covers `me`: no peer access needed */
  gshm_log_err("GPU %d has %s access to 0x%llx (+%zu bytes), a segment of GPU %d mapped by "
               "gshm_map: map it for that GPU too (gshm_map's devices)",
               me, flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? "read-only" : "no",
               (unsigned long long)w->addr, bytes, w->ordinal);
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? -EACCES : -EXDEV;
}

/* Makes the context of `stream` current (pushing it if it is not), or, for
 * a NULL stream without a current context, the primary context of GPU
 * `fallback`.  *pushed tells the caller to pop. */
int gshm__copy_enter_ctx(const struct gshm_cudadrv *drv, CUstream stream, int fallback, int *pushed) {
  CUcontext cur = NULL, want = NULL;
  int e;

  *pushed = 0;
  e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxGetCurrent, &cur);
  if (e)
    return e;
  if (stream) {
    e = stream_ctx(drv, stream, &want);
    if (e)
      return e;
  } else {
    want = cur;
  }
  if (!want) {
    e = gshm__copy_primary_ctx(drv, fallback < 0 ? 0 : fallback, &want);
    if (e)
      return e;
  }
  if (want == cur)
    return 0;
  e = GSHM_CU(drv, GSHM_LOG_ERR, cuCtxPushCurrent, want);
  if (!e)
    *pushed = 1;
  return e;
}

void gshm__copy_leave_ctx(const struct gshm_cudadrv *drv, int pushed) {
  CUcontext ignored;

  if (pushed)
    drv->cuCtxPopCurrent(&ignored);
}

/* A flag must be memory the GPU can reach: device memory or page-locked
 * host memory (gshm.h).  In pageable memory cuStreamWriteValue64 refuses
 * it and the fallback kernel's store to it faults on the GPU, an illegal
 * address that poisons the caller's context for good: -EINVAL first. */
static int flag_addressable(const struct gshm__where *wf) {
  return wf->device || wf->pinned ? 0 : -EINVAL;
}

/* A flag on another GPU than the current context's: that GPU must be
 * reachable (peer access enabled from here), or the write or wait faults
 * on the GPU (an illegal address that poisons the context).  Returns 0 or
 * -EXDEV (no peer path) and gshm__copy_enable_peer's errors. */
static int flag_reachable(const struct gshm__where *wf, int me, int write) {
  int e = gshm__copy_reach(wf, 8, me, write);
  return e < 0 ? e : !e && wf->device ? gshm__copy_enable_peer(wf->ordinal) : 0;
}

static int signal_in_ctx(const struct gshm_cudadrv *drv, uint64_t *flag, uint64_t value,
                         CUstream stream, const struct gshm__where *wf) {
  struct kctx *k;
  CUresult r;
  void *args[2] = {&flag, &value};
  int e;

  if ((e = kctx_current(drv, &k)) || (e = flag_reachable(wf, (int)KLOAD(k->dev), 1)))
    return e;
  r = drv->cuStreamWriteValue64(stream, (CUdeviceptr)(uintptr_t)flag, value,
                                CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r == CUDA_SUCCESS)
    return 0;
  gshm__cuda_log(GSHM_LOG_DEBUG, r, "cuStreamWriteValue64", __FILE__, __LINE__);
  e = kctx_module(drv, &k);
  if (e) /* (-ENOTSUP: no kernels in this libgshm; else the module's load) */
    return e;
  return launch_ex(drv, k, GSHM__K_SIGNAL, 1, 1, stream, args, 1);
}

/* One copy (and maybe a signal after it) for copy_in_ctx, its addresses
 * classified. */
struct copy_params {
  void *dst;
  const void *src;
  size_t bytes;
  gshm_copy_method_t method;
  const struct gshm__where *ws, *wd; /* where src and dst live */
  uint64_t *flag;                    /* NULL: no signal */
  uint64_t value;                    /* stored at flag after the copy */
  const struct gshm__where *wf;      /* where flag lives (with flag only) */
};

static int copy_in_ctx(const struct gshm_cudadrv *drv, const struct copy_params *p,
                       CUstream stream) {
  /* locals: the kernel's arguments are their addresses */
  void *dst = p->dst;
  const void *src = p->src;
  size_t bytes = p->bytes;
  gshm_copy_method_t method = p->method;
  uint64_t *flag = p->flag;
  uint64_t value = p->value;
  const struct gshm__where *ws = p->ws, *wd = p->wd, *wf = p->wf;
  struct kctx *k;
  int e, peer, me, gs, gd, fused = 0, ready = 0; /* ready: peers enabled, module loaded */

  e = kctx_current(drv, &k);
  if (e)
    return e;
  me = (int)KLOAD(k->dev);
  peer = ws->device && wd->device && ws->ordinal != wd->ordinal;
  /* either method runs on this GPU (its SMs or its copy engine); a gshm
   * mapping with access for it needs no peer access (gs, gd: 1), which
   * would retain, and so make, a primary context on its GPU */
  if ((gs = gshm__copy_reach(ws, bytes, me, 0)) < 0)
    return gs;
  if ((gd = gshm__copy_reach(wd, bytes, me, 1)) < 0)
    return gd;

  if (method == GSHM_COPY_AUTO) {
    if (!ws->device || !wd->device || (ws->ordinal != me && wd->ordinal != me))
      method = GSHM_COPY_ENGINE; /* host memory, or a third GPU's context */
    else
      method = gshm__copy_auto_method(bytes, !peer                ? GSHM__COPY_LOCAL
                                             : ws->ordinal == me ? GSHM__COPY_PUSH
                                                                 : GSHM__COPY_PULL);
    if (method == GSHM_COPY_SM &&
        ((ws->device && !gs && gshm__copy_enable_peer(ws->ordinal)) ||
         (wd->device && !gd && gshm__copy_enable_peer(wd->ordinal)) || kctx_module(drv, &k)))
      method = GSHM_COPY_ENGINE;
    else
      ready = method == GSHM_COPY_SM;
  }

  if (method == GSHM_COPY_SM) {
    struct gshm__copy_shape s;
    void *args[5] = {&dst, &src, &bytes, &flag, &value};

    if ((!ws->device && !ws->pinned) || (!wd->device && !wd->pinned))
      return -EINVAL;
    if (!gshm__copy_have_kernels())
      return -ENOTSUP;
    if (!ready && ws->device && !gs && (e = gshm__copy_enable_peer(ws->ordinal)))
      return e;
    if (!ready && wd->device && !gd && (e = gshm__copy_enable_peer(wd->ordinal)))
      return e;
    if (!ready && (e = kctx_module(drv, &k)))
      return e;
    if (flag && (e = flag_reachable(wf, me, 1)))
      return e;
    if (flag && bytes <= FUSED_SIGNAL_MAX) {
      s = gshm__copy_pick_shape(bytes, 1, 0);
      s.blocks = 1;
      if (s.threads < 1024 && bytes > SM_SMALL_MAX)
        s.threads = 1024;
      s.kernel = GSHM__K_COPY_SIGNAL;
      fused = 1;
    } else {
      if (!bytes)
        goto signal;
      s = gshm__copy_pick_shape(bytes, KLOAD(k->sm_count), wd->device && wd->ordinal == me && peer);
    }
    e = launch_ex(drv, k, s.kernel, s.blocks, s.threads, stream, args, 1);
  } else {
    /* (the flag before the copy: a flag this GPU cannot write would fail
     * the signal after a copy already queued, and whoever waits on it
     * would wait for ever) */
    if (flag && (e = flag_reachable(wf, me, 1)))
      return e;
    if (peer) {
      /* direct NVLink/PCIe P2P instead of staging through the host;
       * without peer access the driver still copies, only slower */
      if (ws->ordinal != me && !gs)
        (void)gshm__copy_enable_peer(ws->ordinal);
      if (wd->ordinal != me && !gd)
        (void)gshm__copy_enable_peer(wd->ordinal);
    }
    e = bytes ? GSHM_CU(drv, GSHM_LOG_ERR, cuMemcpyAsync, (CUdeviceptr)(uintptr_t)dst,
                        (CUdeviceptr)(uintptr_t)src, bytes, stream)
              : 0;
  }
signal:
  if (!e && flag && !fused)
    e = signal_in_ctx(drv, flag, value, stream, wf);
  return e;
}

int gshm__copy_in_ctx(const struct gshm_cudadrv *drv, void *dst, const void *src, size_t bytes,
                      gshm_copy_method_t method, CUstream stream, const struct gshm__where *ws,
                      const struct gshm__where *wd) {
  struct copy_params p = {
      .dst = dst, .src = src, .bytes = bytes, .method = method, .ws = ws, .wd = wd};

  return copy_in_ctx(drv, &p, stream);
}

static int copy_common(void *dst, const void *src, size_t bytes, gshm_copy_method_t method,
                       uint64_t *flag, uint64_t value, void *stream) {
  const struct gshm_cudadrv *drv;
  struct gshm__where ws, wd, wf = {0};
  int e, pushed;

  if (!dst || !src || (unsigned)method > GSHM_COPY_SM || ((uintptr_t)flag & 7))
    return -EINVAL;
  if (!bytes && !flag)
    return 0;
  e = copy_driver_load(&drv);
  if (e)
    return e;
  gshm__copy_where(drv, src, &ws);
  gshm__copy_where(drv, dst, &wd);
  if (flag) {
    gshm__copy_where(drv, flag, &wf);
    if ((e = flag_addressable(&wf)))
      return e;
  }
  e = gshm__copy_enter_ctx(drv, (CUstream)stream, ws.device ? ws.ordinal : wd.ordinal, &pushed);
  if (e)
    return e;
  {
    struct copy_params p = {.dst = dst,
                            .src = src,
                            .bytes = bytes,
                            .method = method,
                            .ws = &ws,
                            .wd = &wd,
                            .flag = flag,
                            .value = value,
                            .wf = &wf};
    e = copy_in_ctx(drv, &p, (CUstream)stream);
  }
  gshm__copy_leave_ctx(drv, pushed);
  return e;
}

GSHM_EXTERN int gshm_copy(void *dst, const void *src, size_t bytes, gshm_copy_method_t method,
                          void *stream) {
  return copy_common(dst, src, bytes, method, NULL, 0, stream);
}

GSHM_EXTERN int gshm_copy_signal(void *dst, const void *src, size_t bytes,
                                 gshm_copy_method_t method, uint64_t *flag, uint64_t value,
                                 void *stream) {
  if (!flag)
    return -EINVAL;
  /* Nothing to copy: a caller that only signals has no buffers to give. */
  if (!bytes && (!dst || !src))
    return (unsigned)method > GSHM_COPY_SM ? -EINVAL : gshm_signal(flag, value, stream);
  return copy_common(dst, src, bytes, method, flag, value, stream);
}

/* What gshm_signal and gshm_wait do first: flag checked (8-byte aligned,
 * memory the GPU can reach), the driver loaded into *drv, where flag is
 * into *w, and stream's context made current (a NULL stream without a
 * current context: the primary context of flag's GPU; *pushed:
 * gshm__copy_leave_ctx undoes it).  Returns 0 or their errors. */
static int flag_enter(const uint64_t *flag, void *stream, const struct gshm_cudadrv **drv,
                      struct gshm__where *w, int *pushed) {
  int e;

  if (!flag || ((uintptr_t)flag & 7))
    return -EINVAL;
  if ((e = copy_driver_load(drv)))
    return e;
  gshm__copy_where(*drv, flag, w);
  if ((e = flag_addressable(w)))
    return e;
  return gshm__copy_enter_ctx(*drv, (CUstream)stream, w->ordinal, pushed);
}

GSHM_EXTERN int gshm_signal(uint64_t *flag, uint64_t value, void *stream) {
  const struct gshm_cudadrv *drv;
  struct gshm__where w;
  int e, pushed;

  if ((e = flag_enter(flag, stream, &drv, &w, &pushed)))
    return e;
  e = signal_in_ctx(drv, flag, value, (CUstream)stream, &w);
  gshm__copy_leave_ctx(drv, pushed);
  return e;
}

GSHM_EXTERN int gshm_wait(const uint64_t *flag, uint64_t value, void *stream) {
  const struct gshm_cudadrv *drv;
  struct kctx *k;
  struct gshm__where w;
  unsigned flags = CU_STREAM_WAIT_VALUE_GEQ;
  int e, pushed;

  if ((e = flag_enter(flag, stream, &drv, &w, &pushed)))
    return e;
  e = kctx_current(drv, &k);
  if (!e)
    e = flag_reachable(&w, (int)KLOAD(k->dev), 0);
  if (!e) {
    if (KLOAD(k->can_flush))
      flags |= CU_STREAM_WAIT_VALUE_FLUSH;
    e = GSHM_CU(drv, GSHM_LOG_ERR, cuStreamWaitValue64, (CUstream)stream,
                (CUdeviceptr)(uintptr_t)flag, value, flags);
  }
  gshm__copy_leave_ctx(drv, pushed);
  return e;
}
