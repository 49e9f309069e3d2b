/* SPDX-License-Identifier: Apache-2.0 */
/* SM-driven copy kernels for libgshm (docs/ARCHITECTURE.md "Kernels").
 *
 * Built with nvcc into a fatbin (SASS for each GSHM_CUDA_ARCHS entry plus PTX
 * of the highest), embedded as a byte array into libgshm and loaded with
 * cuModuleLoadData by kernels/copy.c; the entry points are extern "C" so the
 * host finds them by name.  Nothing here is called from host code directly.
 *
 * Push and pull are the same instructions: a push runs on the source's GPU
 * (local loads, remote stores over NVLink), a pull on the destination's GPU
 * (remote loads, local stores).  Which GPU runs the kernel is decided on the
 * host by the stream's context.  What differs between the instantiations is
 * the unroll: how many independent 16-byte loads each thread has in flight
 * before it stores, which is what hides NVLink's latency for remote loads. */
#include <stdint.h>

/* Five consecutive 32-bit words w[q..q+4] of the 8 words of two uint4,
 * with q in 0..3 known only at run time: selects, not a local-memory
 * array, so the words stay in registers. */
__device__ __forceinline__ void pick5(const uint4 &lo, const uint4 &hi, unsigned q, uint32_t o[5]) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int k = 0; k < 5; k++) {
    uint32_t v = w[k];
    v = q == 1 ? w[k + 1] : v;
    v = q == 2 ? w[k + 2] : v;
    v = q == 3 ? w[k + 3] : v;
    o[k] = v;
  }
}

/* 16 bytes starting `shift` (1..15) bytes into lo, continuing into hi. */
__device__ __forceinline__ uint4 funnel16(const uint4 &lo, const uint4 &hi, unsigned shift) {
  uint32_t a[5];
  unsigned r = (shift & 3u) * 8u;
  uint4 v;
  pick5(lo, hi, shift >> 2, a);
  v.x = __funnelshift_r(a[0], a[1], r);
  v.y = __funnelshift_r(a[1], a[2], r);
  v.z = __funnelshift_r(a[2], a[3], r);
  v.w = __funnelshift_r(a[3], a[4], r);
  return v;
}

/* Copies the bytes before dst's first 16-byte boundary and after its last
 * one, one byte per thread of block 0 (at most 15 + 15 bytes).  Needs
 * blockDim.x >= 32. */
__device__ __forceinline__ void copy_edges(char *dst, const char *src, size_t n, size_t head,
                                           size_t tail_off) {
  unsigned t = threadIdx.x;
  if (blockIdx.x != 0)
    return;
  if (t < head)
    dst[t] = src[t];
  else if (t >= 16 && tail_off + (t - 16) < n)
    dst[tail_off + (t - 16)] = src[tail_off + (t - 16)];
}

/* The body: dst is 16-byte aligned, n16 vectors.  src is aligned too
 * (shift 0: plain 16-byte loads, U in flight per thread) or not (two
 * aligned loads per vector and a funnel shift; each aligned 16-byte block
 * that holds a wanted byte lies in the same page as that byte, so the
 * over-read never faults). */
template <int U>
__device__ __forceinline__ void copy_body(uint4 *__restrict__ d, const char *__restrict__ s, size_t n16) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;
  const unsigned shift = (unsigned)((uintptr_t)s & 15u);

  if (shift == 0) {
    const uint4 *__restrict__ sv = (const uint4 *)s;
    /* Chunk c covers vectors [c*nthreads*U, (c+1)*nthreads*U): thread tid
     * takes tid, tid+nthreads, ...: coalesced across the grid. */
    const size_t step = nthreads * U;
    size_t i = tid;
    for (; i + (U - 1) * nthreads < n16; i += step) {
      uint4 v[U];
#pragma unroll
      for (int k = 0; k < U; k++)
        v[k] = __ldcs(sv + i + k * nthreads); /* streamed: read once */
#pragma unroll
      for (int k = 0; k < U; k++)
        __stcs(d + i + k * nthreads, v[k]);
    }
    for (; i < n16; i += nthreads)
      __stcs(d + i, __ldcs(sv + i));
  } else {
    const uint4 *__restrict__ sa = (const uint4 *)(s - shift);
    for (size_t i = tid; i < n16; i += nthreads) {
      uint4 lo = __ldcs(sa + i), hi = __ldcs(sa + i + 1);
      __stcs(d + i, funnel16(lo, hi, shift));
    }
  }
}

/* Programmatic dependent launch (sm_90+).  kernels/copy.c launches the copy
 * kernels with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so a
 * copy may be scheduled while the previous kernel on its stream is still
 * running.  Stream order is kept by griddepcontrol.wait, which returns only
 * when every prerequisite grid has completed and its memory operations are
 * visible; nothing is read or written before it.  Right after it the next
 * launch is allowed to start its own scheduling (it too waits for us).
 * Without the attribute (or before sm_90) this is a no-op. */
__device__ __forceinline__ void pdl_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Any size, any alignment.  Grid-stride: any grid size works. */
template <int U>
__device__ __forceinline__ void copy_any(char *dst, const char *src, size_t n) {
  size_t head = (16 - ((uintptr_t)dst & 15u)) & 15u;
  size_t n16, tail_off;

  pdl_prologue();
  if (head > n)
    head = n;
  n16 = (n - head) >> 4;
  tail_off = head + n16 * 16;
  copy_edges(dst, src, n, head, tail_off);
  copy_body<U>((uint4 *)(dst + head), src + head, n16);
}

extern "C" {

/* Bulk copy, 4 vectors in flight per thread (the default for pushes). */
__global__ void __launch_bounds__(1024) gshm_copy_u4(char *dst, const char *src, size_t n) {
  copy_any<4>(dst, src, n);
}

/* Bulk copy, 8 vectors in flight per thread (deeper, for remote loads). */
__global__ void __launch_bounds__(1024) gshm_copy_u8(char *dst, const char *src, size_t n) {
  copy_any<8>(dst, src, n);
}

/* Small copies where latency is what counts: no unroll, so a thread issues
 * its one load as soon as it starts; launched with one thread per 16-byte
 * vector, in blocks of up to 1024 threads (5 blocks at 64 KiB:
 * gshm__copy_pick_shape; gshm-bench gives shapes of its own). */
__global__ void __launch_bounds__(1024) gshm_copy_u1(char *dst, const char *src, size_t n) {
  copy_any<1>(dst, src, n);
}

/* Copy then signal, in one block (the host launches it with gridDim 1):
 * every thread's stores are made visible system-wide (fence.sc.sys, which
 * also covers stores to a peer GPU and to host memory), the block meets at
 * a barrier, and only then does thread 0 write `value` to *flag with a
 * system-scope release store.  A consumer in another process that waits
 * for *flag >= value with cuStreamWaitValue64 therefore reads the copied
 * bytes, never older ones. */
__global__ void __launch_bounds__(1024) gshm_copy_signal(char *dst, const char *src, size_t n,
                                                         unsigned long long *flag,
                                                         unsigned long long value) {
  copy_any<4>(dst, src, n);
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

/* Signal alone (fallback where cuStreamWriteValue64 refuses the address):
 * orders everything this stream did before (stream order) and then writes
 * the flag with a system-scope release store. */
__global__ void gshm_signal(unsigned long long *flag, unsigned long long value) {
  pdl_prologue();
  __threadfence_system();
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

/* Fills n32 32-bit words with a hash of (seed, index): fresh, non-zero,
 * position-dependent data for benchmarks and tests. */
__global__ void gshm_fill32(uint32_t *p, size_t n32, uint32_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n32;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = x | 1u; /* never zero */
  }
}

/* How many of the four bytes of two 32-bit words differ. */
__device__ __forceinline__ unsigned bytes_differ(uint32_t x, uint32_t y) {
  uint32_t d = x ^ y;
  /* a byte's high bit set where that byte of d is nonzero */
  uint32_t nz = ((d & 0x7f7f7f7fu) + 0x7f7f7f7fu | d) & 0x80808080u;
  return __popc(nz);
}

/* Counts the bytes that differ between a and b (n bytes each) into *bad. */
__global__ void gshm_compare(const unsigned char *a, const unsigned char *b, size_t n,
                             unsigned long long *bad) {
  unsigned long long mine = 0;
  size_t n16 = n >> 4;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;
  int aligned = (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;

  if (aligned) {
    for (size_t i = tid; i < n16; i += nthreads) {
      uint4 x = ((const uint4 *)a)[i], y = ((const uint4 *)b)[i];
      mine += bytes_differ(x.x, y.x) + bytes_differ(x.y, y.y) + bytes_differ(x.z, y.z) +
              bytes_differ(x.w, y.w);
    }
  } else {
    n16 = 0;
  }
  for (size_t i = n16 * 16 + tid; i < n; i += nthreads)
    mine += a[i] != b[i];
  if (mine)
    atomicAdd(bad, mine);
}

} /* extern "C" */
