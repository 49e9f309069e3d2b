/* SPDX-License-Identifier: Apache-2.0 */
// gshm-demo-gpu: one device segment shared across processes and GPUs.
//
//   process A (this program) creates a segment on GPU 0 and fills it with
//   a kernel;
//   process B (this program re-executed with --consumer) opens the segment
//   by name, maps it for GPU 1 only, and verifies every element with a
//   kernel on GPU 1 that reads GPU 0's memory over the peer link (NVLink
//   or PCIe).  With one GPU (or no peer access) B maps it on GPU 0 too:
//   two processes share the segment on one GPU.
//
// It talks to the gshmd at --socket, $GSHM_SOCKET or /run/gshm/gshmd.sock,
// or starts a private one with --spawn (found as $GSHMD, next to this
// program, or on PATH).  Exits 77 when there is no GPU.
#include <cuda_runtime.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gshm.h"
extern "C" {
#include "spawn.h" /* internal C headers without their own extern "C" */
#include "util.h"
}

#define SKIP 77
#define NAME "demo/gpu-shared"

__device__ static uint32_t expected_d(uint64_t i, uint32_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 29;
  return (uint32_t)(x * 0xBF58476D1CE4E5B9ull >> 32);
}

__global__ void fill(uint32_t *p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = expected_d(i, seed);
}

__global__ void check(const uint32_t *p, uint64_t n, uint32_t seed, unsigned long long *bad,
                      unsigned long long *first) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    if (p[i] != expected_d(i, seed)) {
      if (atomicAdd(bad, 1ull) == 0)
        *first = i;
    }
}

#define CUDA_OK(call)                                                                 \
  do {                                                                                \
    cudaError_t r_ = (call);                                                          \
    if (r_ != cudaSuccess) {                                                          \
      fprintf(stderr, "gshm-demo-gpu: %s: %s\n", #call, cudaGetErrorString(r_));      \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#define GSHM_OK(call, c)                                                              \
  do {                                                                                \
    int e_ = (call);                                                                  \
    if (e_) {                                                                         \
      fprintf(stderr, "gshm-demo-gpu: %s: %s %s\n", #call, gshm_strerror(e_),         \
              (c) ? gshm_last_error(c) : "");                                         \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static int consumer(const char *socket, uint32_t seed, int dev) {
  gshm_client_t *c = NULL;
  gshm_segment_t *s = NULL;
  unsigned long long *d_bad, bad = 0, first = 0;
  void *addr = NULL;
  uint64_t n;
  cudaEvent_t t0, t1;
  float ms = 0;

  GSHM_OK(gshm_connect(socket, "gshm-demo-gpu B", &c), (gshm_client_t *)NULL);
  GSHM_OK(gshm_open(c, NAME, GSHM_ACCESS_READ, &s), c);
  const gshm_segment_info_t *info = gshm_segment_info(s);
  CUDA_OK(cudaSetDevice(dev));
  GSHM_OK(gshm_map(s, &dev, 1, &addr), c);
  printf("B (pid %d): opened '%s' read-only (%s), mapped it for GPU %d at %p\n", (int)getpid(),
         info->name, info->location, dev, addr);
  n = info->requested_size / sizeof(uint32_t);
  CUDA_OK(cudaMalloc(&d_bad, 2 * sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(d_bad, 0, 2 * sizeof(unsigned long long)));
  CUDA_OK(cudaEventCreate(&t0));
  CUDA_OK(cudaEventCreate(&t1));
  CUDA_OK(cudaEventRecord(t0));
  check<<<264, 512>>>((const uint32_t *)addr, n, seed, d_bad, d_bad + 1);
  CUDA_OK(cudaEventRecord(t1));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaEventSynchronize(t1));
  CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
  CUDA_OK(cudaMemcpy(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&first, d_bad + 1, sizeof(first), cudaMemcpyDeviceToHost));
  if (bad) {
    printf("B: %llu of %llu elements differ (first at %llu)\n", bad, (unsigned long long)n,
           first);
  } else {
    printf("B: a kernel on GPU %d read all %llu elements from GPU 0%s in %.3f ms (%.1f GB/s): "
           "every one is right\n",
           dev, (unsigned long long)n, dev ? " over the peer link" : " (the same GPU)", ms,
           n * 4.0 / (ms * 1e6));
  }
  cudaFree(d_bad);
  gshm_close(s);
  gshm_disconnect(c);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *socket = getenv("GSHM_SOCKET");
  uint64_t bytes = 256ull << 20;
  bool spawn = false;
  struct gshm_spawn sp;
  int ndev = 0, can = 0, st, cdev = 0;
  uint32_t seed;

  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--consumer") && i + 3 < argc)
      return consumer(argv[i + 1], (uint32_t)strtoul(argv[i + 2], NULL, 0), atoi(argv[i + 3]));
    if (!strcmp(argv[i], "--socket") && i + 1 < argc)
      socket = argv[++i];
    else if (!strcmp(argv[i], "--spawn"))
      spawn = true;
    else if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
      bytes = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: gshm-demo-gpu [--socket PATH | --spawn] [--bytes N]\n");
      return 2;
    }
  }
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("gshm-demo-gpu: no GPU found (no CUDA driver, or no device visible); skipping\n");
    return SKIP;
  }
  if (ndev >= 2 && cudaDeviceCanAccessPeer(&can, 1, 0) == cudaSuccess && can)
    cdev = 1;
  else
    printf("gshm-demo-gpu: %s: process B uses GPU 0 as well\n",
           ndev < 2 ? "one GPU" : "GPU 1 cannot reach GPU 0 (no peer access)");
  bytes = bytes / 4 * 4;
  if (spawn) {
    const char *args[] = {"--backend", "cuda", NULL};
    if (gshm__spawn_init(&sp) || gshm__spawn_start(&sp, gshm__find_gshmd(), args, false, 30000)) {
      fprintf(stderr, "gshm-demo-gpu: could not start gshmd\n");
      return 1;
    }
    socket = sp.socket_path;
    printf("started a private gshmd at %s\n", socket);
  }
  if (!socket)
    socket = GSHM_DEFAULT_SOCKET;

  gshm_client_t *c = NULL;
  gshm_segment_t *s = NULL;
  void *addr = NULL;
  int dev = 0;
  char loc[GSHM_LOCATION_MAX], uuid[48];
  cudaDeviceProp prop;
  /* By UUID: the daemon's GPU numbering may differ from ours. */
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  gshm__format_gpu_uuid((const unsigned char *)prop.uuid.bytes, uuid);
  snprintf(loc, sizeof(loc), "cuda:%s", uuid);
  GSHM_OK(gshm_connect(socket, "gshm-demo-gpu A", &c), (gshm_client_t *)NULL);
  gshm_unlink(c, NAME); /* a leftover from an interrupted run */
  GSHM_OK(gshm_create(c, NAME, bytes, loc, 0644, 0, &s), c);
  const gshm_segment_info_t *info = gshm_segment_info(s);
  CUDA_OK(cudaSetDevice(dev));
  GSHM_OK(gshm_map(s, &dev, 1, &addr), c);
  seed = (uint32_t)getpid() * 2654435761u;
  fill<<<264, 512>>>((uint32_t *)addr, bytes / 4, seed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  printf("A (pid %d): created '%s', %llu bytes on %s (daemon's GPU %d), filled it with a "
         "kernel on GPU 0\n",
         (int)getpid(), NAME, (unsigned long long)info->size, info->location, info->device_index);

  char seedbuf[16], devbuf[16];
  snprintf(seedbuf, sizeof(seedbuf), "%u", seed);
  snprintf(devbuf, sizeof(devbuf), "%d", cdev);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "--consumer", socket, seedbuf, devbuf, (char *)NULL);
    _exit(127);
  }
  waitpid(pid, &st, 0);
  int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  printf("A: process B %s; unlinking '%s'\n", ok ? "verified every element" : "FAILED", NAME);
  gshm_close(s);
  gshm_unlink(c, NAME);
  gshm_disconnect(c);
  if (spawn) {
    gshm__spawn_stop(&sp, SIGTERM);
    gshm__spawn_cleanup(&sp);
  }
  return ok ? 0 : 1;
}
