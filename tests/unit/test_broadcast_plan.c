/* SPDX-License-Identifier: Apache-2.0 */
/* kernels/broadcast.c without a GPU: its plans and their ordering run
 * against a fake driver whose streams are queues of copies, event
 * records and event waits over host memory, drained in a random order
 * that respects only what CUDA promises (each stream in order; a wait
 * holds its stream until the record it captured has run).  A copy out of
 * a destination before the copy into it, a copy before the caller's
 * earlier work, or a caller's later work before the broadcast's end
 * shows as wrong bytes under some order; an event recorded on a stream of
 * another context is refused as the driver refuses it.  The GPU half of
 * this is tests/gpu/test_broadcast.c (real copies, real timings).  A fork
 * while another thread broadcasts leaves the child a broadcast that
 * works. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "copy_internal.h"
#include "cudadrv.h"
#include "gshm.h"

#define KiB 1024u
#define NGPUS 4

/* ---- contexts, streams, events ---- */

struct CUctx_st {
  int ordinal;
  CUevent order_ev; /* gshm__copy_ctx_event's */
};

enum op_kind { OP_COPY, OP_RECORD, OP_WAIT };
struct op {
  enum op_kind kind;
  void *dst;
  const void *src;
  size_t len;
  unsigned rec; /* OP_RECORD: the record's id; OP_WAIT: the one it waits for (0: none) */
};

struct CUstream_st {
  CUcontext ctx;
  struct op *q;
  size_t head, n, cap;
};

struct CUevent_st {
  CUcontext ctx;
  unsigned last; /* id of its latest record, 0: never recorded */
};

#define MAX_STREAMS 512
#define MAX_RECORDS (1u << 20)
static struct CUctx_st ctxs[NGPUS];
static struct CUstream_st *streams[MAX_STREAMS];
static int nstreams;
static unsigned char rec_done[MAX_RECORDS];
static unsigned nrec;
static CUcontext current; /* the fake's one thread */
static int cross_ctx_records, foreign_stream_ops;
static CUstream caller; /* the user's stream, on GPU 0 */

/* CU_STREAM_PER_THREAD names the calling thread's own stream: per_thread
 * here (made by the test's thread that uses it). */
static __thread CUstream per_thread;
static CUstream resolve(CUstream s) { return s == CU_STREAM_PER_THREAD ? per_thread : s; }

static void enqueue(CUstream s, struct op o) {
  s = resolve(s);
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->q = realloc(s->q, s->cap * sizeof(*s->q));
    assert_non_null(s->q);
  }
  s->q[s->n++] = o;
}

static CUstream stream_new(CUcontext ctx) {
  CUstream s = calloc(1, sizeof(*s));
  assert_non_null(s);
  assert_true(nstreams < MAX_STREAMS);
  s->ctx = ctx;
  streams[nstreams++] = s;
  return s;
}

/* Runs every queued operation, choosing at each step at random among the
 * streams whose next operation may run.  Fails the test on a deadlock. */
static void drain(unsigned seed) {
  for (;;) {
    int ready[MAX_STREAMS], nready = 0, left = 0;
    for (int i = 0; i < nstreams; i++) {
      struct CUstream_st *s = streams[i];
      if (s->head == s->n)
        continue;
      left++;
      if (s->q[s->head].kind != OP_WAIT || rec_done[s->q[s->head].rec])
        ready[nready++] = i;
    }
    if (!left)
      break;
    if (!nready)
      fail_msg("the streams wait for each other: deadlock");
    struct CUstream_st *s = streams[ready[rand_r(&seed) % (unsigned)nready]];
    struct op *o = &s->q[s->head++];
    if (o->kind == OP_COPY)
      memcpy(o->dst, o->src, o->len);
    else if (o->kind == OP_RECORD)
      rec_done[o->rec] = 1;
  }
  for (int i = 0; i < nstreams; i++)
    streams[i]->head = streams[i]->n = 0;
}

/* ---- the fake driver ---- */

static CUresult f_get_current(CUcontext *c) {
  *c = current;
  return CUDA_SUCCESS;
}
static CUresult f_set_current(CUcontext c) {
  current = c;
  return CUDA_SUCCESS;
}
static CUcontext pushed_stack[16];
static int npushed;
static CUresult f_push(CUcontext c) {
  pushed_stack[npushed++] = current;
  current = c;
  return CUDA_SUCCESS;
}
static CUresult f_pop(CUcontext *c) {
  *c = current;
  current = pushed_stack[--npushed];
  return CUDA_SUCCESS;
}
/* The stream being captured into a graph (NULL: none). */
static CUstream capturing_stream;
static CUresult f_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
  s = resolve(s);
  *st = s && s == capturing_stream ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
static CUresult f_stream_create(CUstream *s, unsigned flags) {
  (void)flags;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  *s = stream_new(current);
  return CUDA_SUCCESS;
}
static int streams_destroyed; /* (a destroyed stream's queued work still runs, as in CUDA) */
static CUresult f_stream_destroy(CUstream s) {
  (void)s;
  streams_destroyed++;
  return CUDA_SUCCESS;
}
static CUresult f_event_create(CUevent *e, unsigned flags) {
  (void)flags;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  *e = calloc(1, sizeof(**e));
  (*e)->ctx = current;
  return CUDA_SUCCESS;
}
/* cuEventRecord: event and stream of one context, that context current. */
static CUresult f_event_record(CUevent e, CUstream s) {
  s = resolve(s);
  if (e->ctx != s->ctx) {
    cross_ctx_records++;
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (s->ctx != current) {
    foreign_stream_ops++;
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  assert_true(nrec + 1 < MAX_RECORDS);
  e->last = ++nrec;
  enqueue(s, (struct op){.kind = OP_RECORD, .rec = e->last});
  return CUDA_SUCCESS;
}
/* cuStreamWaitEvent: captures the event's latest record now (an event
 * of any context). */
static CUresult f_wait_event(CUstream s, CUevent e, unsigned flags) {
  (void)flags;
  enqueue(s, (struct op){.kind = OP_WAIT, .rec = e->last});
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t len, CUstream s) {
  s = resolve(s);
  if (s->ctx != current) {
    foreign_stream_ops++;
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  enqueue(s, (struct op){.kind = OP_COPY,
                         .dst = (void *)(uintptr_t)dst,
                         .src = (const void *)(uintptr_t)src,
                         .len = len});
  return CUDA_SUCCESS;
}

static struct gshm_cudadrv fake_drv;

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  (void)prio;
  fake_drv.cuCtxGetCurrent = f_get_current;
  fake_drv.cuCtxSetCurrent = f_set_current;
  fake_drv.cuCtxPushCurrent = f_push;
  fake_drv.cuCtxPopCurrent = f_pop;
  fake_drv.cuStreamCreate = f_stream_create;
  fake_drv.cuStreamDestroy = f_stream_destroy;
  fake_drv.cuEventCreate = f_event_create;
  fake_drv.cuEventRecord = f_event_record;
  fake_drv.cuStreamWaitEvent = f_wait_event;
  fake_drv.cuMemcpyAsync = f_memcpy_async;
  fake_drv.cuStreamIsCapturing = f_is_capturing;
  fake_drv.cuCtxGetId = NULL; /* optional: the reset check is skipped */
  *drv_out = &fake_drv;
  return 0;
}

/* ---- the fake kernels/copy.c: buffers registered with their GPU ---- */

#define MAX_BUFS 160
static struct {
  const char *p;
  size_t len;
  int ordinal; /* -1: pinned host memory */
} bufs[MAX_BUFS];
static int nbufs;

static void *buf_new(size_t len, int ordinal) {
  char *p = calloc(1, len);
  assert_non_null(p);
  assert_true(nbufs < MAX_BUFS);
  bufs[nbufs].p = p;
  bufs[nbufs].len = len;
  bufs[nbufs++].ordinal = ordinal;
  return p;
}

static void bufs_free(void) {
  for (int i = 0; i < nbufs; i++)
    free((void *)bufs[i].p);
  nbufs = 0;
}

void gshm__copy_where(const struct gshm_cudadrv *drv, const void *p, struct gshm__where *w) {
  (void)drv;
  memset(w, 0, sizeof(*w));
  w->ordinal = -1;
  w->addr = (uintptr_t)p;
  for (int i = 0; i < nbufs; i++)
    if ((const char *)p >= bufs[i].p && (const char *)p < bufs[i].p + bufs[i].len) {
      w->device = bufs[i].ordinal >= 0;
      w->pinned = bufs[i].ordinal < 0;
      w->ordinal = bufs[i].ordinal;
    }
}

int gshm__copy_enter_ctx(const struct gshm_cudadrv *drv, CUstream stream, int fallback,
                         int *pushed) {
  (void)drv, (void)fallback;
  *pushed = 0;
  stream = resolve(stream);
  if (stream->ctx != current) {
    f_push(stream->ctx);
    *pushed = 1;
  }
  return 0;
}

void gshm__copy_leave_ctx(const struct gshm_cudadrv *drv, int pushed) {
  CUcontext ignored;
  (void)drv;
  if (pushed)
    f_pop(&ignored);
}

int gshm__copy_primary_ctx(const struct gshm_cudadrv *drv, int ordinal, CUcontext *out) {
  (void)drv;
  if (ordinal < 0 || ordinal >= NGPUS)
    return -ENODEV;
  *out = &ctxs[ordinal];
  return 0;
}

/* The next gshm__copy_ctx_event (broadcast.c calls it under its lock)
 * posts ctx_event_entered and stalls this long first. */
static unsigned ctx_event_stall_us;
static sem_t ctx_event_entered;

int gshm__copy_ctx_event(const struct gshm_cudadrv *drv, CUevent *out) {
  (void)drv;
  if (ctx_event_stall_us) {
    unsigned us = ctx_event_stall_us;
    ctx_event_stall_us = 0;
    sem_post(&ctx_event_entered);
    usleep(us);
  }
  if (!current)
    return -EINVAL;
  if (!current->order_ev)
    f_event_create(&current->order_ev, 0);
  *out = current->order_ev;
  return 0;
}

static bool no_peer_access; /* every cuCtxEnablePeerAccess refused (GPUs without P2P) */
static unsigned peer_enables;
int gshm__copy_enable_peer(int ordinal) {
  (void)ordinal;
  peer_enables++;
  return no_peer_access ? -EXDEV : 0;
}

/* gshm__copy_reach: the buffer at no_access_addr is a gshm mapping that
 * only GPU no_access_gpu may write.  Calls made while the current context
 * is not GPU me's are counted: the real one asks the driver for the
 * access flags of memory gshm_map did not map, which are the current
 * context's GPU's. */
static uintptr_t no_access_addr;
static int no_access_gpu = -1;
static unsigned reach_wrong_ctx;
int gshm__copy_reach(const struct gshm__where *w, size_t bytes, int me, int write) {
  (void)bytes;
  if (w->device && (me < 0 || me >= NGPUS || current != &ctxs[me]))
    reach_wrong_ctx++;
  return w->addr && w->addr == no_access_addr && write && me != no_access_gpu ? -EXDEV : 0;
}

/* STAR's copies (gshm_copy AUTO in the stream's context): one queued copy */
int gshm__copy_in_ctx(const struct gshm_cudadrv *drv, void *dst, const void *src, size_t bytes,
                      gshm_copy_method_t method, CUstream stream, const struct gshm__where *ws,
                      const struct gshm__where *wd) {
  (void)drv, (void)method, (void)ws, (void)wd;
  return f_memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, stream)
             ? -EIO
             : 0;
}

int gshm_copy(void *dst, const void *src, size_t bytes, gshm_copy_method_t method, void *stream) {
  int pushed, e;
  (void)method;
  gshm__copy_enter_ctx(&fake_drv, stream, 0, &pushed);
  e = f_memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, stream)
          ? -EIO
          : 0;
  gshm__copy_leave_ctx(&fake_drv, pushed);
  return e;
}

/* ---- tests ---- */

static int setup(void **state) {
  (void)state;
  for (int i = 0; i < NGPUS; i++)
    ctxs[i].ordinal = i;
  caller = stream_new(&ctxs[0]);
  return 0;
}

/* One broadcast of `bytes` from GPU 0 to `n` destinations spread over the
 * four GPUs (GPU 0 too), ordered as a user orders it: the source written
 * on the caller's stream just before, each destination read on it just
 * after.  Every random order of the queued work must deliver the bytes. */
static void broadcast_once(const gshm_broadcast_opts_t *o, int n, size_t bytes, unsigned seed) {
  unsigned char *want = buf_new(bytes, -1), *src = buf_new(bytes, 0);
  unsigned char *dsts[8], *seen[8];
  int e;

  assert_true(n <= 8);
  for (size_t i = 0; i < bytes; i++)
    want[i] = (unsigned char)(i * 7 + seed + 1);
  for (int i = 0; i < n; i++) {
    dsts[i] = buf_new(bytes, (i + 1) % NGPUS);
    seen[i] = buf_new(bytes, -1);
  }
  current = &ctxs[0];
  f_memcpy_async((CUdeviceptr)(uintptr_t)src, (CUdeviceptr)(uintptr_t)want, bytes, caller);
  current = NULL; /* no context on this thread: the caller's stream's is pushed */
  foreign_stream_ops = cross_ctx_records = reach_wrong_ctx = 0;
  e = gshm_broadcast_ex(src, (void *const *)dsts, n, bytes, caller, o);
  assert_int_equal(e, 0);
  assert_null(current); /* the thread's context is back */
  assert_int_equal(reach_wrong_ctx, 0); /* each check in its issuing GPU's context */
  assert_int_equal(cross_ctx_records, 0);
  assert_int_equal(foreign_stream_ops, 0);
  current = &ctxs[0];
  for (int i = 0; i < n; i++)
    f_memcpy_async((CUdeviceptr)(uintptr_t)seen[i], (CUdeviceptr)(uintptr_t)dsts[i], bytes,
                   caller);
  current = NULL;
  drain(seed);
  for (int i = 0; i < n; i++)
    if (memcmp(seen[i], want, bytes))
      fail_msg("algo %d lanes %d pull %d chunk %zu, %d dsts, %zu B, seed %u: destination %d "
               "read wrong bytes on the caller's stream",
               o->algo, o->lanes, o->pull, o->chunk_bytes, n, bytes, seed, i);
  bufs_free();
}

/* Every algorithm, lane count and issuing side, sizes that leave a short
 * last chunk and parts shorter than a chunk, under many orders. */
static void test_every_plan_delivers_in_order(void **state) {
  const gshm_broadcast_algo_t algos[] = {GSHM_BCAST_AUTO, GSHM_BCAST_STAR, GSHM_BCAST_CHAIN,
                                         GSHM_BCAST_SPLIT};
  const size_t sizes[] = {1, 4097, 64 * KiB, 300 * KiB + 5};
  unsigned seed = 1;
  (void)state;

  for (size_t a = 0; a < 4; a++)
    for (int lanes = 0; lanes <= GSHM_BCAST_MAX_LANES; lanes += 2)
      for (int pull = 0; pull < 2; pull++)
        for (size_t z = 0; z < 4; z++)
          for (int n = 1; n <= 5; n += 2)
            for (int rep = 0; rep < 4; rep++) {
              gshm_broadcast_opts_t o = {algos[a], 64 * KiB, pull, lanes};
              broadcast_once(&o, n, sizes[z], seed++);
            }
}

/* On a stream being captured into a graph, a CHAIN is a copy per
 * destination on the caller's stream: libgshm's shared pair streams must
 * not join the capture (another broadcast's copies on them would be
 * captured or refused until it ends).  They used to: a stream per pair,
 * events between them and the caller's. */
static void test_captured_broadcast_stays_on_its_stream(void **state) {
  const gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, 64 * KiB, 0, 2};
  unsigned char *want = buf_new(300 * KiB, -1), *src = buf_new(300 * KiB, 0), *dsts[3];
  int before = nstreams;
  (void)state;

  for (size_t i = 0; i < 300 * KiB; i++)
    want[i] = (unsigned char)(i * 13 + 5);
  for (int i = 0; i < 3; i++)
    dsts[i] = buf_new(300 * KiB, i + 1);
  current = &ctxs[0];
  f_memcpy_async((CUdeviceptr)(uintptr_t)src, (CUdeviceptr)(uintptr_t)want, 300 * KiB, caller);
  current = NULL;
  capturing_stream = caller;
  foreign_stream_ops = 0;
  assert_int_equal(gshm_broadcast_ex(src, (void *const *)dsts, 3, 300 * KiB, caller, &chain), 0);
  capturing_stream = NULL;
  assert_int_equal(nstreams, before);
  assert_int_equal(caller->n, 1 + 3); /* the source's write, then one copy per destination */
  drain(7);
  for (int i = 0; i < 3; i++)
    assert_memory_equal(dsts[i], want, 300 * KiB);
  bufs_free();
}

/* A destination mapped (gshm_map) for its own GPU alone, pushed to by
 * another GPU in a CHAIN: -EXDEV before anything is queued (the copy
 * engine of the pushing GPU would fault on it), and the same broadcast
 * pulled (the receiver issues) goes.  The push used to be queued. */
static void test_unreachable_destination_is_refused(void **state) {
  const gshm_broadcast_opts_t push = {GSHM_BCAST_CHAIN, 64 * KiB, 0, 1};
  const gshm_broadcast_opts_t pull = {GSHM_BCAST_CHAIN, 64 * KiB, 1, 1};
  unsigned char *src = buf_new(200 * KiB, 0), *dsts[2] = {buf_new(200 * KiB, 1),
                                                          buf_new(200 * KiB, 2)};
  int before = nstreams, queued = caller->n;
  (void)state;

  current = NULL;
  no_access_addr = (uintptr_t)dsts[1];
  no_access_gpu = 2;
  reach_wrong_ctx = 0;
  assert_int_equal(gshm_broadcast_ex(src, (void *const *)dsts, 2, 200 * KiB, caller, &push),
                   -EXDEV);
  assert_int_equal(nstreams, before);
  assert_int_equal(caller->n, queued);
  assert_int_equal(reach_wrong_ctx, 0);
  assert_null(current);
  assert_int_equal(gshm_broadcast_ex(src, (void *const *)dsts, 2, 200 * KiB, caller, &pull), 0);
  no_access_addr = 0;
  no_access_gpu = -1;
  drain(3);
  bufs_free();
}

/* GPUs without peer access between them: a CHAIN of the copy engine
 * (AUTO above 12 MiB in all) still goes, the driver copying through the
 * host; it failed -EXDEV at its first pair stream before.  Every plan,
 * both issuing sides. */
static void test_chain_without_peer_access(void **state) {
  (void)state;
  no_peer_access = true;
  peer_enables = 0;
  for (int pull = 0; pull < 2; pull++) {
    gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, 64 * KiB, pull, 2};
    gshm_broadcast_opts_t split = {GSHM_BCAST_SPLIT, 64 * KiB, pull, 1};
    broadcast_once(&chain, 3, 300 * KiB + 5, 40 + (unsigned)pull);
    broadcast_once(&split, 3, 300 * KiB + 5, 50 + (unsigned)pull);
  }
  no_peer_access = false;
  assert_true(peer_enables > 0); /* (asked, refused, copied anyway) */
}

/* A size no memory can have is refused before any arithmetic on it: it
 * used to return 0 with nothing copied (n * bytes and the chunk count
 * wrapped), or divide by a chunk rounded up to 0 (SIGFPE). */
static void test_impossible_sizes_are_refused(void **state) {
  const gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, SIZE_MAX, 0, 0};
  const gshm_broadcast_opts_t star = {GSHM_BCAST_STAR, 0, 0, 0};
  void *src = buf_new(64, 0), *dsts[2] = {buf_new(64, 1), buf_new(64, 2)};
  (void)state;

  current = NULL;
  assert_int_equal(gshm_broadcast(src, dsts, 1, SIZE_MAX, caller), -EINVAL);
  assert_int_equal(gshm_broadcast_ex(src, dsts, 2, SIZE_MAX, caller, &star), -EINVAL);
  assert_int_equal(gshm_broadcast_ex(src, dsts, 2, SIZE_MAX - 100, caller, &chain), -EINVAL);
  assert_int_equal(gshm_broadcast_ex(src, dsts, 2, (size_t)1 << 62, caller, NULL), -EINVAL);
  assert_int_equal(caller->n, 0); /* nothing queued */
  bufs_free();
}

/* Marks in used[] the streams other than the callers' whose queues grew
 * since before[] (queue lengths, nbefore streams) was taken. */
static void streams_grown(const size_t *before, int nbefore, const CUstream *callers, int ncallers,
                          unsigned char *used) {
  for (int i = 0; i < nstreams; i++) {
    bool is_caller = false;
    for (int c = 0; c < ncallers; c++)
      is_caller |= streams[i] == callers[c];
    used[i] = !is_caller && (i >= nbefore || streams[i]->n > before[i]);
  }
}

static void queue_lengths(size_t *n) {
  for (int i = 0; i < nstreams; i++)
    n[i] = streams[i]->n;
}

/* Broadcasts on two callers' streams use no stream in common (they used
 * to share every pair stream of the process: a hidden order between
 * independent broadcasts of different threads or streams, and a wait
 * between them could deadlock); a second broadcast on the first caller's
 * stream uses its streams again, making none. */
static void test_broadcasts_of_other_callers_share_no_stream(void **state) {
  const gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, 64 * KiB, 0, 2};
  static size_t before[MAX_STREAMS];
  static unsigned char used[3][MAX_STREAMS];
  const size_t len = 300 * KiB;
  CUstream other = stream_new(&ctxs[0]), callers[2] = {caller, other};
  unsigned char *want = buf_new(len, -1), *src = buf_new(len, 0), *d[3][3];
  int nb, n0 = 0, n1 = 0;
  (void)state;

  for (size_t i = 0; i < len; i++)
    want[i] = (unsigned char)(i * 11 + 3);
  memcpy(src, want, len);
  for (int b = 0; b < 3; b++)
    for (int i = 0; i < 3; i++)
      d[b][i] = buf_new(len, i + 1);
  current = NULL;
  for (int b = 0; b < 3; b++) {
    nb = nstreams;
    queue_lengths(before);
    assert_int_equal(gshm_broadcast_ex(src, (void *const *)d[b], 3, len, b == 1 ? other : caller,
                                       &chain),
                     0);
    streams_grown(before, nb, callers, 2, used[b]);
    if (b == 2)
      assert_int_equal(nstreams, nb); /* the first caller's streams, again */
  }
  for (int i = 0; i < nstreams; i++) {
    if (used[0][i] && used[1][i])
      fail_msg("stream %d carried copies of broadcasts on two callers' streams", i);
    if (used[2][i] && !used[0][i])
      fail_msg("stream %d: the first caller's second broadcast used another set", i);
    n0 += used[0][i];
    n1 += used[1][i];
  }
  assert_true(n0 > 0 && n1 > 0);
  drain(11);
  for (int b = 0; b < 3; b++)
    for (int i = 0; i < 3; i++)
      assert_memory_equal(d[b][i], want, len);
  bufs_free();
}

/* Two threads broadcast on CU_STREAM_PER_THREAD, one after the other:
 * the same handle, each thread's own stream, so their pair streams are
 * disjoint as for two streams.  Before: keyed by the handle alone, the
 * threads shared a set (the hidden order between independent broadcasts
 * that per-caller sets remove). */
struct pt_job {
  CUstream own;
  void *src, *d[3];
  size_t len;
  int err;
  sem_t done, go; /* its broadcast queued; it may end (the threads overlap:
                   * an ended thread's id may be the next one's) */
};

static void *pt_thread(void *arg) {
  const gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, 64 * KiB, 0, 2};
  struct pt_job *j = arg;

  per_thread = j->own;
  j->err = gshm_broadcast_ex(j->src, (void *const *)j->d, 3, j->len, CU_STREAM_PER_THREAD, &chain);
  sem_post(&j->done);
  sem_wait(&j->go);
  return NULL;
}

static void test_per_thread_streams_share_no_set(void **state) {
  static size_t before[MAX_STREAMS];
  static unsigned char used[2][MAX_STREAMS];
  const size_t len = 300 * KiB;
  struct pt_job j[2];
  unsigned char *want = buf_new(len, -1);
  (void)state;

  for (size_t i = 0; i < len; i++)
    want[i] = (unsigned char)(i * 13 + 5);
  pthread_t th[2];

  current = NULL;
  for (int t = 0; t < 2; t++) {
    int nb = nstreams;
    j[t] = (struct pt_job){.own = stream_new(&ctxs[0]), .src = buf_new(len, 0), .len = len};
    sem_init(&j[t].done, 0, 0);
    sem_init(&j[t].go, 0, 0);
    memcpy(j[t].src, want, len);
    for (int i = 0; i < 3; i++)
      j[t].d[i] = buf_new(len, i + 1);
    queue_lengths(before);
    assert_int_equal(pthread_create(&th[t], NULL, pt_thread, &j[t]), 0);
    sem_wait(&j[t].done);
    assert_int_equal(j[t].err, 0);
    streams_grown(before, nb, &j[t].own, 1, used[t]);
  }
  for (int t = 0; t < 2; t++) {
    sem_post(&j[t].go);
    assert_int_equal(pthread_join(th[t], NULL), 0);
  }
  for (int i = 0; i < nstreams; i++)
    if (used[0][i] && used[1][i])
      fail_msg("stream %d carried copies of two threads' per-thread-stream broadcasts", i);
  drain(13);
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < 3; i++)
      assert_memory_equal(j[t].d[i], want, len);
  bufs_free();
}

/* More callers' streams than sets kept (40 > 32): the least recently
 * used set's streams are destroyed and made again for the new caller
 * (their queued copies still run), and every broadcast delivers.  And 16
 * callers in rotation keep their sets: the second round destroys no
 * stream (with 8 sets kept, every call of it made its streams again). */
#define MANY 40
#define ROTATION 16
static void test_many_callers_reuse_the_oldest_set(void **state) {
  const gshm_broadcast_opts_t chain = {GSHM_BCAST_CHAIN, 64 * KiB, 0, 1};
  const size_t len = 200 * KiB;
  unsigned char *want = buf_new(len, -1), *src = buf_new(len, 0), *d[MANY + ROTATION][2];
  CUstream own[ROTATION];
  unsigned destroyed;
  (void)state;

  for (size_t i = 0; i < len; i++)
    want[i] = (unsigned char)(i * 5 + 9);
  memcpy(src, want, len);
  current = NULL;
  streams_destroyed = 0;
  for (int b = 0; b < MANY + ROTATION; b++) {
    CUstream s = b < MANY ? stream_new(&ctxs[0]) : own[(b - MANY) % ROTATION];
    if (b == MANY) {
      assert_true(streams_destroyed > 0);
      destroyed = (unsigned)streams_destroyed;
    }
    if (b >= MANY - ROTATION && b < MANY)
      own[b - (MANY - ROTATION)] = s;
    d[b][0] = buf_new(len, 1);
    d[b][1] = buf_new(len, 2);
    assert_int_equal(gshm_broadcast_ex(src, (void *const *)d[b], 2, len, s, &chain), 0);
    assert_null(current);
  }
  if ((unsigned)streams_destroyed != destroyed)
    fail_msg("%d callers in rotation: %u pair streams destroyed and made again", ROTATION,
             (unsigned)streams_destroyed - destroyed);
  drain(12);
  for (int b = 0; b < MANY + ROTATION; b++)
    for (int i = 0; i < 2; i++)
      assert_memory_equal(d[b][i], want, len);
  bufs_free();
}

struct bcast_args {
  void *src;
  void **dsts;
};

static void *broadcast_in_thread(void *arg) {
  struct bcast_args *a = arg;
  return (void *)(intptr_t)gshm_broadcast(a->src, a->dsts, 2, 4096, caller);
}

/* fork() while another thread broadcasts (broadcast.c's lock held): the
 * child's broadcast must run, not wait for a lock whose holder is not in
 * the child (it did, for good: alarm() ends such a child with SIGALRM). */
static void test_fork_while_another_thread_broadcasts(void **state) {
  void *src = buf_new(4096, 0), *dsts[2] = {buf_new(4096, 1), buf_new(4096, 2)};
  struct bcast_args a = {src, dsts};
  pthread_t t;
  void *ret;
  pid_t pid;
  int status;
  (void)state;

  current = NULL;
  assert_int_equal(sem_init(&ctx_event_entered, 0, 0), 0);
  ctx_event_stall_us = 300000;
  assert_int_equal(pthread_create(&t, NULL, broadcast_in_thread, &a), 0);
  assert_int_equal(sem_wait(&ctx_event_entered), 0); /* the thread holds the lock */
  pid = fork();
  if (pid == 0) {
    alarm(5);
    _exit(gshm_broadcast(src, dsts, 2, 4096, caller) == 0 ? 0 : 1);
  }
  assert_true(pid > 0);
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_int_equal((int)(intptr_t)ret, 0);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status)); /* not killed by its alarm */
  assert_int_equal(WEXITSTATUS(status), 0);
  drain(1);
  sem_destroy(&ctx_event_entered);
  bufs_free();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_while_another_thread_broadcasts),
      cmocka_unit_test(test_every_plan_delivers_in_order),
      cmocka_unit_test(test_impossible_sizes_are_refused),
      cmocka_unit_test(test_captured_broadcast_stays_on_its_stream),
      cmocka_unit_test(test_unreachable_destination_is_refused),
      cmocka_unit_test(test_chain_without_peer_access),
      cmocka_unit_test(test_broadcasts_of_other_callers_share_no_stream),
      cmocka_unit_test(test_many_callers_reuse_the_oldest_set),
      cmocka_unit_test(test_per_thread_streams_share_no_set),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
