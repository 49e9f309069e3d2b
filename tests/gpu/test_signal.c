/* SPDX-License-Identifier: Apache-2.0 */
/* Cross-process copy-then-signal ordering (issue 8): a producer process on
 * GPU0 copies into a consumer's buffer on GPU1 and signals a flag there
 * (gshm_copy_signal); the consumer process has already queued, on its own
 * stream, gshm_wait(flag >= round) and a read-back of the buffer before it
 * tells the producer to go.  Over 1,000 rounds, with every method and with
 * sizes on both sides of the fused-kernel limit, the consumer must never
 * read data older than the round it waited for: without a working wait its
 * read-back would run at once and see the previous round's bytes.
 *
 * The buffers travel as legacy CUDA IPC handles (cuIpcGetMemHandle) over a
 * pipe, so the test needs no gshmd.  Needs a GPU (exit 77 otherwise); with
 * one, or two without peer access, both processes use GPU 0 (the copy is
 * then within one GPU, and only the copy over a peer link is skipped). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gshm.h"

#define SKIP 77
#define ROUNDS 1000
#define BUF (4u << 20)

#define CU(call)                                                                \
  do {                                                                          \
    CUresult r_ = (call);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                   \
      fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)r_);  \
      _exit(2);                                                                 \
    }                                                                           \
  } while (0)
#define CHECK(cond, ...)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);  \
      fprintf(stderr, __VA_ARGS__);                                             \
      fprintf(stderr, "\n");                                                    \
      _exit(1);                                                                 \
    }                                                                           \
  } while (0)

static const struct gshm_cudadrv *drv;
static int consumer_gpu = 1; /* 0 when there is no second GPU with peer access */

static size_t round_size(uint32_t r) { return r % 2 ? BUF : (64u << 10) + 7; }
static unsigned char round_byte(uint32_t r) { return (unsigned char)(r * 7 + 1); }
static gshm_copy_method_t round_method(uint32_t r) { return (gshm_copy_method_t)((r / 2) % 3); }

static void xread(int fd, void *p, size_t n) {
  CHECK(read(fd, p, n) == (ssize_t)n, "short read from pipe");
}
static void xwrite(int fd, const void *p, size_t n) {
  CHECK(write(fd, p, n) == (ssize_t)n, "short write to pipe");
}

static CUcontext setup(int ordinal) {
  CUcontext ctx;
  CUdevice dev;

  CHECK(gshm__cudadrv_load(7, &drv) == 0, "no driver");
  CU(drv->cuDeviceGet(&dev, ordinal));
  CU(drv->cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(drv->cuCtxSetCurrent(ctx));
  return ctx;
}

/* consumer_gpu: owns the data buffer and the flag; waits and reads back. */
static void consumer(int to_producer, int from_producer) {
  CUdeviceptr data, flag;
  CUipcMemHandle h[2];
  CUstream s;
  unsigned char *host;
  char go;

  setup(consumer_gpu);
  CU(drv->cuMemAlloc(&data, BUF));
  CU(drv->cuMemAlloc(&flag, 8));
  CU(drv->cuMemsetD8(data, 0, BUF));
  CU(drv->cuMemsetD8(flag, 0, 8));
  CU(drv->cuMemAllocHost((void **)&host, BUF));
  CU(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU(drv->cuIpcGetMemHandle(&h[0], data));
  CU(drv->cuIpcGetMemHandle(&h[1], flag));
  xwrite(to_producer, h, sizeof(h));
  xread(from_producer, &go, 1);

  for (uint32_t r = 1; r <= ROUNDS; r++) {
    size_t n = round_size(r);
    int e = gshm_wait((const uint64_t *)(uintptr_t)flag, r, s);
    CHECK(e == 0, "gshm_wait: %d", e);
    CU(drv->cuMemcpyAsync((CUdeviceptr)(uintptr_t)host, data, n, s));
    xwrite(to_producer, &r, sizeof(r)); /* only now may the producer write round r */
    CU(drv->cuStreamSynchronize(s));
    for (size_t i = 0; i < n; i++)
      CHECK(host[i] == round_byte(r),
            "round %u (%zu B, method %d): byte %zu is %#x, want %#x", r, n,
            (int)round_method(r), i, host[i], round_byte(r));
  }
  _exit(0);
}

/* GPU 0: fills its source and copies-and-signals into the consumer's GPU. */
static int producer(int from_consumer, int to_consumer) {
  CUipcMemHandle h[2];
  CUdeviceptr src, data, flag;
  CUstream s;
  char go = 1;

  setup(0);
  CU(drv->cuMemAlloc(&src, BUF));
  CU(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  xread(from_consumer, h, sizeof(h));
  CU(drv->cuIpcOpenMemHandle(&data, h[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CU(drv->cuIpcOpenMemHandle(&flag, h[1], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  xwrite(to_consumer, &go, 1);
  for (uint32_t r = 1; r <= ROUNDS; r++) {
    uint32_t ready;
    int e;
    xread(from_consumer, &ready, sizeof(ready));
    CHECK(ready == r, "consumer at round %u, producer at %u", ready, r);
    CU(drv->cuMemsetD8Async(src, round_byte(r), round_size(r), s));
    e = gshm_copy_signal((void *)(uintptr_t)data, (const void *)(uintptr_t)src, round_size(r),
                         round_method(r), (uint64_t *)(uintptr_t)flag, r, s);
    CHECK(e == 0, "gshm_copy_signal round %u method %d: %d", r, (int)round_method(r), e);
  }
  CU(drv->cuStreamSynchronize(s));
  return 0;
}

/* Counts GPUs, and whether GPUs 0 and 1 reach each other, in a child, so
 * that this process forks before cuInit.  Returns the count; *peer_out. */
static int gpu_count(int *peer_out) {
  int p[2], n = 0;
  pid_t pid;

  *peer_out = 0;
  if (pipe(p))
    return 0;
  pid = fork();
  if (pid == 0) {
    int r[2] = {0, 0}, a = 0, b = 0;
    if (!gshm__cudadrv_load(7, &drv) && drv->cuDeviceGetCount(&r[0]) == CUDA_SUCCESS &&
        r[0] >= 2 && drv->cuDeviceCanAccessPeer(&a, 0, 1) == CUDA_SUCCESS &&
        drv->cuDeviceCanAccessPeer(&b, 1, 0) == CUDA_SUCCESS)
      r[1] = a && b;
    _exit(write(p[1], r, sizeof(r)) == sizeof(r) ? 0 : 1);
  }
  close(p[1]);
  if (pid > 0) {
    int r[2];
    if (read(p[0], r, sizeof(r)) == sizeof(r)) {
      n = r[0];
      *peer_out = r[1];
    }
    waitpid(pid, NULL, 0);
  }
  close(p[0]);
  return n;
}

int main(void) {
  int c2p[2], p2c[2], st, peer, n = gpu_count(&peer);
  pid_t pid;

  if (n < 1) {
    printf("SKIP: needs a CUDA GPU\n");
    return SKIP;
  }
  if (!peer) {
    consumer_gpu = 0;
    printf("%s: producer and consumer processes both on GPU 0; SKIPPED (needs two GPUs with "
           "peer access): the copy and signal over the peer link\n",
           n < 2 ? "one GPU" : "no peer access between GPUs 0 and 1");
  }
  fflush(stdout);
  if (pipe(c2p) || pipe(p2c))
    return 2;
  pid = fork();
  if (pid < 0)
    return 2;
  if (pid == 0) {
    close(c2p[0]);
    close(p2c[1]);
    consumer(c2p[1], p2c[0]);
  }
  close(c2p[1]);
  close(p2c[0]);
  producer(c2p[0], p2c[1]);
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "consumer failed (status %#x)\n", st);
    return 1;
  }
  printf("%d rounds across processes (GPU 0 -> GPU %d): consumer never saw stale data\n", ROUNDS,
         consumer_gpu);
  return 0;
}
