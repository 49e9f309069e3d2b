/* SPDX-License-Identifier: Apache-2.0 */
/* Internal interface of kernels/copy.c, for libgshm, gshm-bench and the GPU
 * tests (never installed).  Functions here run in the calling thread's
 * current CUDA context and take CUstream handles. */
#ifndef GSHM_KERNELS_COPY_INTERNAL_H
#define GSHM_KERNELS_COPY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "cudadrv.h"
#include "gshm.h"

/* The entry points of kernels/copy.cu, in the order copy.c resolves them. */
enum gshm__kernel {
  GSHM__K_COPY_U1 = 0, /* no unroll: small copies, latency */
  GSHM__K_COPY_U4,     /* 4 x 16 B in flight per thread */
  GSHM__K_COPY_U8,     /* 8 x 16 B in flight per thread */
  GSHM__K_COPY_SIGNAL, /* one block: copy, fence.sys, release store of a flag */
  GSHM__K_SIGNAL,      /* fence.sys, release store of a flag */
  GSHM__K_FILL32,      /* hash fill */
  GSHM__K_COMPARE,     /* count differing bytes */
  GSHM__K_COUNT
};

/* The launch shape the SM method picks for `bytes` (what gshm_copy uses). */
struct gshm__copy_shape {
  enum gshm__kernel kernel;
  unsigned blocks, threads;
};

/* 1 when this build embeds the kernels (nvcc was found), else 0. */
int gshm__copy_have_kernels(void);

/* The shape gshm_copy's SM method uses for `bytes` on a GPU with sm_count
 * multiprocessors; `pull` is 1 when the launching GPU is the destination's
 * and the source is another GPU's. */
struct gshm__copy_shape gshm__copy_pick_shape(size_t bytes, int sm_count, int pull);

/* Which GPUs a device-to-device copy spans, seen from the GPU that
 * launches it. */
enum gshm__copy_peer {
  GSHM__COPY_LOCAL = 0, /* within one GPU */
  GSHM__COPY_PUSH = 1,  /* two GPUs, launched on the source's */
  GSHM__COPY_PULL = 2,  /* two GPUs, launched on the destination's */
};

/* GSHM_COPY_ENGINE or GSHM_COPY_SM: what GSHM_COPY_AUTO picks for a
 * device-to-device copy of `bytes` across `peer` (thresholds: see
 * docs/PERFORMANCE.md "AUTO"). */
int gshm__copy_auto_method(size_t bytes, enum gshm__copy_peer peer);

/* Launches copy kernel `kernel` (U1/U4/U8) with an explicit shape, in the
 * current context, on `stream`, with programmatic dependent launch when
 * `pdl` is 1 (gshm_copy always uses it).  No peer-access set-up: the caller has
 * made both addresses reachable.  For gshm-bench's sweeps.
 * Errors: -ENOTSUP no kernels; -EINVAL bad kernel or shape; driver errors. */
int gshm__copy_launch(void *dst, const void *src, size_t bytes, enum gshm__kernel kernel,
                      unsigned blocks, unsigned threads, int pdl, CUstream stream);

/* Fills `bytes` (a multiple of 4, 4-byte aligned) at p with a non-zero hash
 * of (seed, word index), on `stream`, in the current context. */
int gshm__copy_fill(void *p, size_t bytes, uint32_t seed, CUstream stream);

/* Counts the bytes that differ between a and b, in the current context, on
 * `stream`, and waits for the answer (synchronizes `stream`).  One at a
 * time per context: every compare in a context counts into its one 8-byte
 * device counter (zeroed, added to, read back on `stream`), so two at once
 * on different streams or threads would add into each other's count.  Its
 * callers (gshm-bench copy and broadcast) run one thread. */
int gshm__copy_compare(const void *a, const void *b, size_t bytes, CUstream stream,
                       uint64_t *bad_out);

/* Enables peer access from the current context to GPU `ordinal`'s primary
 * context, once per (context, GPU); 0 also when it was already enabled or
 * ordinal is the current context's own GPU.  -EXDEV no P2P path. */
int gshm__copy_enable_peer(int ordinal);

/* ---- shared with kernels/broadcast.c ---- */

/* Where an address lives: device memory of GPU `ordinal`, page-locked host
 * memory, or pageable host memory the driver does not know. */
struct gshm__where {
  int device; /* 1: device memory */
  int pinned; /* 1: host memory known to the driver */
  int ordinal;
  uintptr_t addr; /* the address classified */
};

/* Whether GPU `me`, the current context's, may touch `bytes` of device
 * memory at w (read, or write when `write`): a cuMem mapping gives access
 * per device (cuMemSetAccess), which peer access (cuCtxEnablePeerAccess)
 * does not cover, and an SM kernel or copy engine of a GPU without it
 * faults (an illegal address that ends the context).  A device segment
 * this process mapped with gshm_map is judged by its mapping's access
 * (no driver call); other device memory by the access flags the driver
 * reports for the current context (CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: one
 * driver call where they allow the use; the current context must be on
 * GPU `me`), refused only where it is a cuMem range (cuMemMap's, a memory
 * pool's: PyTorch's expandable segments, cudaMallocAsync): cuMemAlloc
 * memory and legacy IPC imports on another GPU read "no access" until
 * peer access is enabled, so where the flags fall short on another GPU
 * peer access is enabled (as the copy paths would) and they are read
 * again.  Returns 1 (a gshm mapping whose access covers
 * `me`: no peer access is needed, none should be enabled for it), 0 (host
 * memory, other memory the flags allow or that is not a cuMem range: the
 * driver's rules), -EXDEV no access from `me` (a gshm mapping: map the
 * segment for it, gshm_map's devices; other cuMem memory: cuMemSetAccess),
 * -EACCES a read-only mapping or range to be written (host memory too: a
 * host segment gshm_map mapped read-only, gshm__host_read_only), -ERANGE
 * a range partly in a gshm mapping (it starts in one and runs past its
 * end, or starts before one and runs into it). */
int gshm__copy_reach(const struct gshm__where *w, size_t bytes, int me, int write);

/* client/map_cuda.c (client_internal.h has its comment): 1 and the access
 * GPU dev has where [addr, addr + bytes) is a gshm device mapping, 2 where
 * it is partly in one (starts in it and runs past its end, or starts
 * before it and runs into it), else 0.
 * Weak: a program that links the kernels without the client (gshm-bench's
 * own copy of them) maps nothing through them, and judges nothing. */
__attribute__((weak)) int gshm__map_access(uintptr_t addr, size_t bytes, int dev,
                                           unsigned long long *flags_out);
/* client/map.c: 1 where [addr, addr + bytes) overlaps a host segment
 * mapped read-only by gshm_map, else 0 (weak, as above). */
__attribute__((weak)) int gshm__host_read_only(uintptr_t addr, size_t bytes);

/* Fills *w for address p (cuPointerGetAttribute; unknown memory: all 0). */
void gshm__copy_where(const struct gshm_cudadrv *drv, const void *p, struct gshm__where *w);

/* Makes the context of `stream` current (pushing it if it is not), or, for
 * a NULL stream without a current context, the primary context of GPU
 * `fallback`; *pushed tells the caller to call gshm__copy_leave_ctx. */
int gshm__copy_enter_ctx(const struct gshm_cudadrv *drv, CUstream stream, int fallback,
                         int *pushed);
void gshm__copy_leave_ctx(const struct gshm_cudadrv *drv, int pushed);

/* GPU `ordinal`'s primary context, retained once for the process's life
 * (after a reset that left it inactive, released and retained again: one
 * count held at any time).  The retain and release are made with this
 * thread's capture mode relaxed (gshm__capture_relax): a call that may
 * come inside a stream capture. */
int gshm__copy_primary_ctx(const struct gshm_cudadrv *drv, int ordinal, CUcontext *out);

/* An event of the current context, created on first use and kept with the
 * context's entry in copy.c's table (so the same caveat applies: a
 * context destroyed and re-created at the same address finds a stale
 * event).  For ordering other streams after a caller's stream: record it,
 * then wait for it (cuStreamWaitEvent captures the record at call time, so
 * it may be recorded again at once).  Errors: -EINVAL no current context;
 * -ENOMEM the table is full; driver errors. */
int gshm__copy_ctx_event(const struct gshm_cudadrv *drv, CUevent *out);

/* gshm_copy's body in the current context (which runs the copy), with the
 * addresses already classified.  Errors as gshm_copy. */
int gshm__copy_in_ctx(const struct gshm_cudadrv *drv, void *dst, const void *src, size_t bytes,
                      gshm_copy_method_t method, CUstream stream, const struct gshm__where *ws,
                      const struct gshm__where *wd);

#endif
