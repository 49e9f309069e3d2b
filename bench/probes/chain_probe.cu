/* SPDX-License-Identifier: Apache-2.0 */
// chain_probe: where a pipelined chain broadcast of 1 GiB loses time
// against the link (issue 8; docs/PERFORMANCE.md "Broadcast", "Why a chain
// stops near ncclBroadcast").  An experiment, kept so that the numbers it
// produced can be reproduced; not built with the project and not part of
// gshm-bench (it uses the CUDA runtime, which libgshm does not):
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o chain_probe bench/probes/chain_probe.cu -lcuda
//   ./chain_probe [REPS]        # 2 GPUs: the one-hop rows; 4 GPUs: all rows
//
// Every row: GPU 0's 1 GiB buffer refilled with fresh hash data, the
// destinations zeroed, every stream held at a host gate until all is
// queued (GPU time alone), CUDA events from the gate's opening to the end
// of the last stream, median of REPS (default 7) after 2 warm-ups, and a
// GPU compare of every destination ("ok" or "BAD").
//
// Rows: one copy-engine copy 0->1; the same cut into 16/32 MiB copies on
// one stream, on two streams, and with an SM kernel copying the last 1/8
// or 2/8 at the same time; the SM kernel alone, and with a flag written
// every 8 MiB; copy-engine chains 0->1->2->3 (events between hops, 1 or 2
// streams per hop); SM chains (one kernel per GPU that waits on a flag per
// chunk, copies it with the whole grid and raises the next GPU's flag),
// pushed and pulled, and a copy-engine first hop with SM forwards.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1);} } while (0)
#define DK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char *s_; cuGetErrorString(e_, &s_); fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); exit(1);} } while (0)

static int NG = 4;
static size_t B = (size_t)1 << 30;
static char *buf[8];
static unsigned long long *flags[8];   // per GPU: a flag per chunk (8 x 4096)
static unsigned *counters[8];          // per GPU: blocks done per chunk (4096)
static cudaStream_t st[8][8];          // [gpu][lane]
static unsigned *gate;                 // host pinned
static unsigned gatev = 0;
static unsigned long long gen = 0;
static int reps = 7;

__device__ __forceinline__ uint32_t hashw(size_t i, uint32_t seed) {
  uint32_t x = (uint32_t)i * 2654435761u ^ seed ^ (uint32_t)(i >> 32) * 40503u;
  x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16;
  return x | 1u;
}
__global__ void fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = hashw(i, seed);
}
__global__ void check(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) b += p[i] != hashw(i, seed);
  if (b) atomicAdd(bad, b);
}

__device__ __forceinline__ unsigned long long ld_acq(const unsigned long long *p) {
  unsigned long long v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void st_rel(unsigned long long *p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// One kernel per GPU.  src: where chunks are read; dst: where written (one of the two
// remote).  inflag (or NULL): wait for inflag[k] >= g before chunk k.  outflag (or NULL):
// set to g once every block has copied chunk k (the last block to count it in cnt[k]).
template <int U>
__global__ void __launch_bounds__(512) chain_kernel(const uint4 *src, uint4 *dst, size_t bytes, size_t chunk,
                             const unsigned long long *inflag, unsigned long long *outflag,
                             unsigned *cnt, unsigned long long g) {
  const size_t nch = (bytes + chunk - 1) / chunk;
  for (size_t k = 0; k < nch; k++) {
    if (inflag) {
      if (threadIdx.x == 0) while (ld_acq(&inflag[k]) < g) {}
      __syncthreads();
    }
    size_t off = k * chunk / 16, len = ((bytes < (k + 1) * chunk ? bytes : (k + 1) * chunk) - k * chunk) / 16;
    const uint4 *s = src + off; uint4 *d = dst + off;
    size_t nt = (size_t)gridDim.x * blockDim.x, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i < len; i += U * nt) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; u++) if (i + u * nt < len) v[u] = __ldcg(s + i + u * nt);
#pragma unroll
      for (int u = 0; u < U; u++) if (i + u * nt < len) d[i + u * nt] = v[u];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      unsigned old = atomicAdd(&cnt[k], 1u);
      if (old == gridDim.x - 1) {
        cnt[k] = 0;
        __threadfence_system();
        if (outflag) st_rel(&outflag[k], g);
      }
    }
  }
}

static void onctx(cudaStream_t s) { CUcontext c; DK(cuStreamGetCtx((CUstream)s, &c)); DK(cuCtxSetCurrent(c)); }
// Holds every stream at the host gate.  The whole row is queued behind it,
// so a row must stay under the driver's queue depth (about a thousand
// operations per stream: beyond it the host blocks in the queueing call and
// never opens the gate).
static void gate_streams(std::vector<cudaStream_t> &ss) {
  gatev++;
  for (auto s : ss) { onctx(s); DK(cuStreamWaitValue32((CUstream)s, (CUdeviceptr)gate, gatev, CU_STREAM_WAIT_VALUE_GEQ)); }
  CK(cudaSetDevice(0));
}

struct timing { cudaEvent_t a, b; };

// Runs `queue` reps times: each rep refills the source (seed), clears dsts, gates streams,
// records start on st[0][0], queues, joins to st[0][0], records end, opens gate.  Returns median us.
template <class F>
static double run(const char *name, std::vector<cudaStream_t> ss, int ndst, F queue, bool verify = true) {
  std::vector<double> t;
  unsigned long long bad_total = 0;
  static unsigned long long *bad[8];
  for (int g = 0; g < NG; g++) if (!bad[g]) { CK(cudaSetDevice(g)); CK(cudaMalloc(&bad[g], 8)); }
  for (int r = 0; r < reps + 2; r++) {
    uint32_t seed = 0x9e3779b9u * (r + 1) ^ (uint32_t)(uintptr_t)name;
    CK(cudaSetDevice(0));
    fill<<<1024, 512>>>((uint32_t *)buf[0], B / 4, seed);
    for (int g = 1; g <= ndst; g++) { CK(cudaSetDevice(g)); CK(cudaMemset(buf[g], 0, B)); }
    for (int g = 0; g < NG; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
    CK(cudaSetDevice(0));
    cudaEvent_t e0, e1, ev[64]; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    gate_streams(ss);
    CK(cudaEventRecord(e0, ss[0]));
    for (auto s : ss) { onctx(s); CK(cudaStreamWaitEvent(s, e0, 0)); }
    queue();
    int ne = 0;
    for (auto s : ss) { int dev; CUcontext c; DK(cuStreamGetCtx((CUstream)s, &c)); DK(cuCtxPushCurrent(c)); cuCtxGetDevice(&dev);
      CK(cudaEventCreateWithFlags(&ev[ne], cudaEventDisableTiming)); CK(cudaEventRecord(ev[ne], s)); CUcontext x; cuCtxPopCurrent(&x); ne++; }
    CK(cudaSetDevice(0));
    for (int i = 0; i < ne; i++) CK(cudaStreamWaitEvent(ss[0], ev[i], 0));
    CK(cudaEventRecord(e1, ss[0]));
    __atomic_store_n(gate, gatev, __ATOMIC_SEQ_CST);
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 2) t.push_back(ms * 1000.0);
    if (verify) for (int g = 1; g <= ndst; g++) {
      CK(cudaSetDevice(g)); CK(cudaMemset(bad[g], 0, 8));
      check<<<1024, 512>>>((const uint32_t *)buf[g], B / 4, seed, bad[g]);
      unsigned long long h; CK(cudaMemcpy(&h, bad[g], 8, cudaMemcpyDeviceToHost)); bad_total += h;
    }
    for (int i = 0; i < ne; i++) cudaEventDestroy(ev[i]);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
  }
  std::sort(t.begin(), t.end());
  double med = t[t.size() / 2];
  printf("%-44s %9.1f us  %7.1f GB/s  min %7.1f  %s\n", name, med, B / med / 1e3, B / t[0] / 1e3,
         !verify ? "unchecked" : bad_total ? "BAD" : "ok");
  fflush(stdout);
  return med;
}

int main(int argc, char **argv) {
  CK(cudaGetDeviceCount(&NG));
  if (NG > 4) NG = 4;
  if (argc > 1) reps = atoi(argv[1]);
  printf("GPUs %d, bytes %zu, reps %d\n", NG, B, reps);
  CK(cudaHostAlloc((void **)&gate, 64, cudaHostAllocMapped)); *gate = 0;
  for (int g = 0; g < NG; g++) {
    CK(cudaSetDevice(g));
    for (int p = 0; p < NG; p++) if (p != g) CK(cudaDeviceEnablePeerAccess(p, 0));
    CK(cudaMalloc(&buf[g], B));
    CK(cudaMalloc(&flags[g], 8 * 4096 * 8)); CK(cudaMemset(flags[g], 0, 8 * 4096 * 8));
    CK(cudaMalloc(&counters[g], 4096 * 4)); CK(cudaMemset(counters[g], 0, 4096 * 4));
    for (int l = 0; l < 8; l++) CK(cudaStreamCreateWithFlags(&st[g][l], cudaStreamNonBlocking));
  }
  int nd = NG - 1;
  std::vector<cudaStream_t> s01 = {st[0][0]}, s01b = {st[0][0], st[0][1]};
  run("CE 0->1 one copy", s01, 1, [&] { CK(cudaMemcpyAsync(buf[1], buf[0], B, cudaMemcpyDefault, st[0][0])); });
  for (size_t c : {4u << 20, 8u << 20, 16u << 20, 32u << 20, 64u << 20}) {
    char nm[80];
    snprintf(nm, sizeof nm, "CE 0->1 %zu MiB chunks", c >> 20);
    run(nm, s01, 1, [&] { for (size_t o = 0; o < B; o += c) CK(cudaMemcpyAsync(buf[1] + o, buf[0] + o, c, cudaMemcpyDefault, st[0][0])); });
    snprintf(nm, sizeof nm, "CE 0->1 %zu MiB chunks + event", c >> 20);
    cudaEvent_t e; CK(cudaSetDevice(0)); CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    run(nm, s01, 1, [&] { for (size_t o = 0; o < B; o += c) { CK(cudaMemcpyAsync(buf[1] + o, buf[0] + o, c, cudaMemcpyDefault, st[0][0])); CK(cudaEventRecord(e, st[0][0])); } });
    snprintf(nm, sizeof nm, "CE 0->1 %zu MiB chunks + writevalue", c >> 20);
    run(nm, s01, 1, [&] { size_t k = 0; gen++; for (size_t o = 0; o < B; o += c, k++) { CK(cudaMemcpyAsync(buf[1] + o, buf[0] + o, c, cudaMemcpyDefault, st[0][0]));
      DK(cuStreamWriteValue64((CUstream)st[0][0], (CUdeviceptr)(flags[1] + k), gen, 0)); } });
    if (c != (16u << 20) && c != (32u << 20)) continue;
    snprintf(nm, sizeof nm, "CE 0->1 %zu MiB chunks, 2 lanes", c >> 20);
    run(nm, s01b, 1, [&] { size_t k = 0; for (size_t o = 0; o < B; o += c, k++) CK(cudaMemcpyAsync(buf[1] + o, buf[0] + o, c, cudaMemcpyDefault, st[0][k & 1])); });
    for (int eighths : {1, 2}) {
      size_t sm = B / 8 * eighths;
      snprintf(nm, sizeof nm, "CE 0->1 %zu MiB chunks + SM %d/8 beside", c >> 20, eighths);
      run(nm, s01b, 1, [&] { gen++; CK(cudaSetDevice(0));
        chain_kernel<4><<<132, 512, 0, st[0][1]>>>((const uint4 *)(buf[0] + B - sm), (uint4 *)(buf[1] + B - sm), sm, sm, nullptr, nullptr, counters[0] + 2048, gen);
        for (size_t o = 0; o < B - sm; o += c) CK(cudaMemcpyAsync(buf[1] + o, buf[0] + o, std::min(c, B - sm - o), cudaMemcpyDefault, st[0][0])); });
    }
  }
  run("SM push 0->1 132 blocks", s01, 1, [&] { gen++; CK(cudaSetDevice(0)); chain_kernel<4><<<132, 512, 0, st[0][0]>>>((const uint4 *)buf[0], (uint4 *)buf[1], B, B, nullptr, nullptr, counters[0], gen); });
  run("SM push 0->1 132 blocks, 8 MiB signalled", s01, 1, [&] { gen++; CK(cudaSetDevice(0)); chain_kernel<4><<<132, 512, 0, st[0][0]>>>((const uint4 *)buf[0], (uint4 *)buf[1], B, 8 << 20, nullptr, flags[1], counters[0], gen); });
  if (nd < 2) return 0;
  std::vector<cudaStream_t> sall, sall2;
  for (int g = 0; g < nd; g++) { sall.push_back(st[g][0]); sall2.push_back(st[g][0]); sall2.push_back(st[g][1]); }
  static cudaEvent_t evs[8][1024];
  for (int g = 0; g < NG; g++) { CK(cudaSetDevice(g)); for (int k = 0; k < 256; k++) CK(cudaEventCreateWithFlags(&evs[g][k], cudaEventDisableTiming)); }
  for (size_t c : {8u << 20, 16u << 20, 32u << 20}) {
    char nm[80];
    snprintf(nm, sizeof nm, "CE chain %d dst %zu MiB, write/wait value", nd, c >> 20);
    run(nm, sall, nd, [&] { size_t k = 0; gen++; for (size_t o = 0; o < B; o += c, k++) for (int g = 0; g < nd; g++) {
        CK(cudaSetDevice(g));
        if (g) DK(cuStreamWaitValue64((CUstream)st[g][0], (CUdeviceptr)(flags[g] + k), gen, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cudaMemcpyAsync(buf[g + 1] + o, buf[g] + o, c, cudaMemcpyDefault, st[g][0]));
        if (g + 1 < nd) DK(cuStreamWriteValue64((CUstream)st[g][0], (CUdeviceptr)(flags[g + 1] + k), gen, 0)); } });
  }
  for (size_t c : {8u << 20, 16u << 20, 24u << 20, 32u << 20}) for (int lanes : {1, 2}) {
    if (lanes == 2 && c < (24u << 20)) continue;
    char nm[80];
    snprintf(nm, sizeof nm, "CE chain %d dst %zu MiB, %d lanes", nd, c >> 20, lanes);
    run(nm, lanes == 1 ? sall : sall2, nd, [&] { size_t k = 0; for (size_t o = 0; o < B; o += c, k++) for (int g = 0; g < nd; g++) {
        cudaStream_t s = st[g][k % lanes];
        CK(cudaSetDevice(g)); if (g) CK(cudaStreamWaitEvent(s, evs[g - 1][k], 0));
        CK(cudaMemcpyAsync(buf[g + 1] + o, buf[g] + o, std::min(c, B - o), cudaMemcpyDefault, s)); CK(cudaEventRecord(evs[g][k], s)); } });
  }
  std::vector<cudaStream_t> spull;
  spull.push_back(st[0][0]);
  for (int g = 1; g <= nd; g++) spull.push_back(st[g][0]);
  for (size_t c : {2u << 20, 4u << 20, 8u << 20, 16u << 20}) for (int blocks : {132, 264}) {
    char nm[80];
    if (blocks == 264 && c != (8u << 20)) continue;
    snprintf(nm, sizeof nm, "SM push chain %zu MiB, %d blocks", c >> 20, blocks);
    run(nm, sall, nd, [&] { gen++; for (int g = 0; g < nd; g++) { CK(cudaSetDevice(g));
        chain_kernel<4><<<blocks, 512, 0, st[g][0]>>>((const uint4 *)buf[g], (uint4 *)buf[g + 1], B, c, g ? flags[g] : nullptr,
                                                     g + 1 < nd ? flags[g + 1] : nullptr, counters[g], gen); CK(cudaGetLastError()); } });
    snprintf(nm, sizeof nm, "SM pull chain %zu MiB, %d blocks", c >> 20, blocks);
    run(nm, spull, nd, [&] { gen++; for (int g = 1; g <= nd; g++) { CK(cudaSetDevice(g));
        chain_kernel<4><<<blocks, 512, 0, st[g][0]>>>((const uint4 *)buf[g - 1], (uint4 *)buf[g], B, c, g > 1 ? flags[g] : nullptr,
                                                     g < nd ? flags[g + 1] : nullptr, counters[g], gen); CK(cudaGetLastError()); } });
    if (c < (8u << 20)) continue;
    snprintf(nm, sizeof nm, "CE src + SM push fwd %zu MiB, %d blocks", c >> 20, blocks);
    run(nm, sall, nd, [&] { gen++; CK(cudaSetDevice(0)); size_t k = 0;
        for (size_t o = 0; o < B; o += c, k++) { CK(cudaMemcpyAsync(buf[1] + o, buf[0] + o, c, cudaMemcpyDefault, st[0][0]));
          DK(cuStreamWriteValue64((CUstream)st[0][0], (CUdeviceptr)(flags[1] + k), gen, 0)); }
        for (int g = 1; g < nd; g++) { CK(cudaSetDevice(g));
        chain_kernel<4><<<blocks, 512, 0, st[g][0]>>>((const uint4 *)buf[g], (uint4 *)buf[g + 1], B, c, flags[g],
                                                     g + 1 < nd ? flags[g + 1] : nullptr, counters[g], gen); CK(cudaGetLastError()); } });
  }
  return 0;
}
