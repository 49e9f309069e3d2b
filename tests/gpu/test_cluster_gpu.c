/* SPDX-License-Identifier: Apache-2.0 */
/* A device segment pulled between two gshmd on one GPU (issue 13, "Done
 * when" 2): gshmd A exports a cuda:0 segment of 1 GiB of random bytes,
 * gshmd B pulls it into a cuda:0 segment of its own through UCX (tcp on
 * 127.0.0.1) and the staging path (Debian's UCX has no CUDA support), and
 * the test reads B's segment back from the GPU and compares every byte.
 * With two GPUs the same source is pulled again onto GPU 1 (cuda:1) and
 * read back the same way; with one GPU that step is skipped and says so.
 * Then fan-out with device segments: a third gshmd C pulls a set of
 * device segments from B while B is still pulling it from A (B relays
 * each chunk as it lands: staged on both sides), onto GPU 1 when there is
 * one; every byte of B's and C's copies is read back.
 * Prints the pull's rate.  Plain C (no cmocka on the GPU machines); exit 77
 * without a driver or a GPU.
 *
 *   test_cluster_gpu [BYTES]      default 1 GiB */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gshm.h"
#include "harness.h"
#include "util.h"

#include "gpu_check.h"
#include "gpu_cluster.h"

#define FAN_N 6 /* segments of the fan-out set: fan/00 .. fan/05 */

static uint64_t fan_size(int i, uint64_t size) { return i == 2 ? size / 2 : size / 16 + 4099; }

/* Every byte of node c's fan/NN is seed base + i. */
static void fan_check(const struct gshm_cudadrv *drv, gshm_client_t *c, const char *who,
                      uint64_t size, uint8_t *want, uint8_t *got) {
  for (int i = 0; i < FAN_N; i++) {
    gshm_segment_t *seg;
    void *dptr;
    char name[32];
    uint64_t n = fan_size(i, size);
    snprintf(name, sizeof(name), "fan/%02d", i);
    harness_random(want, n, 500 + (unsigned)i);
    REQUIRE(gshm_open(c, name, GSHM_ACCESS_READ, &seg) == 0, "%s: open %s", who, name);
    REQUIRE(gshm_map(seg, NULL, 0, &dptr) == 0, "%s: map %s", who, name);
    memset(got, 0, n);
    CU(drv->cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)dptr, n));
    CHECK(memcmp(got, want, n) == 0, "%s: %s differs from the source", who, name);
    gshm_close(seg);
    CHECK(gshm_unlink(c, name) == 0, "%s: unlink %s", who, name);
  }
}

/* One hop of the fan-out chain, in a thread. */
struct hop {
  pthread_t t;
  const char *sock, *peer, *location;
  int err;
  int64_t t0, t1;
};

static void *hop_thread(void *arg) {
  struct hop *h = arg;
  gshm_pull_opts_t po = {.location = h->location, .mode = 0644};
  gshm_pull_result_t *v = NULL;
  gshm_client_t *c;
  size_t n = 0;

  h->t0 = gshm__now_ns(CLOCK_MONOTONIC);
  if (!(h->err = gshm_connect(h->sock, "gpu-hop", &c))) {
    if (!(h->err = gshm_pull_prefix(c, h->peer, "fan/", &po, &v, &n)))
      gshm_free(v);
    gshm_disconnect(c);
  }
  h->t1 = gshm__now_ns(CLOCK_MONOTONIC);
  return NULL;
}

/* A's set of device segments to B and, relayed by B as it lands, to C. */
static void fan_out(const struct gshm_cudadrv *drv, gshm_client_t *a, gshm_client_t *b,
                    struct harness *B, struct harness *C, int gpus, uint64_t size,
                    uint8_t *want, uint8_t *got) {
  struct hop hb = {.sock = B->socket_path, .peer = "a", .location = "cuda:0"};
  struct hop hc = {.sock = C->socket_path, .peer = "b", .location = gpus > 1 ? "cuda:1" : "cuda:0"};
  gshm_client_t *c;
  bool listed = false;

  for (int i = 0; i < FAN_N; i++) {
    gshm_segment_t *seg;
    void *dptr;
    char name[32];
    snprintf(name, sizeof(name), "fan/%02d", i);
    harness_random(want, fan_size(i, size), 500 + (unsigned)i);
    REQUIRE(gshm_create(a, name, fan_size(i, size), "cuda:0", 0644, 0, &seg) == 0, "create %s",
            name);
    REQUIRE(gshm_map(seg, NULL, 0, &dptr) == 0, "map %s", name);
    CU(drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dptr, want, fan_size(i, size)));
    gshm_close(seg);
  }
  CU(drv->cuCtxSynchronize());
  REQUIRE(pthread_create(&hb.t, NULL, hop_thread, &hb) == 0, "thread");
  for (int k = 0; k < 10000 && !listed; k++) { /* B has listed the set: C may list B */
    gshm_cluster_pull_t *v = NULL;
    size_t n = 0;
    if (gshm_cluster_pulls(b, &v, &n) == 0) {
      listed = n == 1 && v[0].segments_total == FAN_N;
      gshm_free(v);
    }
    usleep(1000);
  }
  REQUIRE(listed, "B's pull of the set did not show in its pulls in flight");
  REQUIRE(pthread_create(&hc.t, NULL, hop_thread, &hc) == 0, "thread");
  pthread_join(hb.t, NULL);
  pthread_join(hc.t, NULL);
  printf("fan-out of %d device segments: B %.3f s, C %.3f s (%s), C started %.3f s before B "
         "ended\n",
         FAN_N, (double)(hb.t1 - hb.t0) / 1e9, (double)(hc.t1 - hc.t0) / 1e9, hc.location,
         (double)(hb.t1 - hc.t0) / 1e9);
  REQUIRE(hb.err == 0, "B's pull: %s", gshm_strerror(hb.err));
  REQUIRE(hc.err == 0, "C's pull (relayed by B): %s", gshm_strerror(hc.err));
  CHECK(hc.t0 < hb.t1, "C started after B's pull ended: nothing was relayed");
  fan_check(drv, b, "B", size, want, got);
  REQUIRE(gshm_connect(C->socket_path, "gpu-c", &c) == 0, "connect c");
  fan_check(drv, c, "C", size, want, got);
  gshm_disconnect(c);
  for (int i = 0; i < FAN_N; i++) {
    char name[32];
    snprintf(name, sizeof(name), "fan/%02d", i);
    CHECK(gshm_unlink(a, name) == 0, "unlink %s", name);
  }
}

int main(int argc, char **argv) {
  static char sa[GPU_NODE_ARGS][512], sb[GPU_NODE_ARGS][512], sc[GPU_NODE_ARGS][512];
  const struct gshm_cudadrv *drv;
  uint64_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : (1ull << 30);
  char dir[] = "/tmp/gshm-cluster-gpu-XXXXXX", key[300], pa[64], pb[96], pc[64];
  const char *aa[GPU_NODE_ARGS + 1], *ab[GPU_NODE_ARGS + 1], *ac[GPU_NODE_ARGS + 1];
  struct harness A = {0}, B = {0}, C = {0};
  gshm_client_t *a, *b;
  gshm_segment_t *src, *dst;
  gshm_pull_result_t r;
  gshm_pull_opts_t po = {.local_name = "pulled/weights", .location = "cuda:0"};
  uint8_t *want, *got;
  void *dptr;
  int count, port_a, port_b, port_c;

  count = gpu_cluster_gpu0(&drv);
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  gpu_key_file(dir, key, sizeof(key), "gpu-test-cluster-key-0123456789\n");
  port_a = gpu_free_port();
  port_b = gpu_free_port();
  port_c = gpu_free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", port_b);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d,c=127.0.0.1:%d", port_a, port_c);
  snprintf(pc, sizeof(pc), "b=127.0.0.1:%d", port_b);
  gpu_node_args(sa, aa, "cuda", "a", port_a, pa, key, "pub/* fan/*", NULL);
  /* B relays the fan-out set to C */
  gpu_node_args(sb, ab, "cuda", "b", port_b, pb, key, "fan/*", NULL);
  gpu_node_args(sc, ac, "cuda", "c", port_c, pc, key, "", NULL);
  REQUIRE(harness_start(&A, aa) == 0, "gshmd a");
  harness_set_leftover(&A);
  atexit(harness_kill_leftover);
  REQUIRE(harness_start(&B, ab) == 0, "gshmd b");
  REQUIRE(harness_start(&C, ac) == 0, "gshmd c");
  REQUIRE(gshm_connect(A.socket_path, "gpu-src", &a) == 0, "connect a");
  REQUIRE(gshm_connect(B.socket_path, "gpu-dst", &b) == 0, "connect b");

  /* the source: random bytes on the GPU through gshmd a */
  REQUIRE((want = malloc(size)) && (got = malloc(size)), "host buffers");
  harness_random(want, size, 13);
  REQUIRE(gshm_create(a, "pub/weights", size, "cuda:0", 0644, 0, &src) == 0, "create: %s",
          gshm_last_error(a));
  REQUIRE(gshm_map(src, NULL, 0, &dptr) == 0, "map source");
  CU(drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dptr, want, size));
  CU(drv->cuCtxSynchronize());
  gshm_close(src);

  /* the pull */
  {
    int e = gshm_pull(b, "a", "pub/weights", &po, &r);
    REQUIRE(e == 0, "pull: %s: %s", gshm_strerror(e), gshm_last_error(b));
  }
  printf("pulled %" PRIu64 " bytes cuda:0 -> cuda:0 in %.3f s: %.2f GB/s, path %s (%s)\n",
         r.bytes, (double)r.elapsed_ns / 1e9, (double)r.bytes / (double)r.elapsed_ns, r.path,
         r.path_reason);
  CHECK(r.bytes == size, "bytes %" PRIu64, r.bytes);
  CHECK(strcmp(r.path, "staged") == 0 || strcmp(r.path, "direct") == 0, "path %s", r.path);
  CHECK(strncmp(r.segment.location, "cuda:", 5) == 0, "location %s", r.segment.location);

  /* the reference for the staged path: pinned device-to-host copies */
  {
    void *pinned;
    uint64_t n = size < (256ull << 20) ? size : (256ull << 20);
    double t0, t1;
    CU(drv->cuMemAllocHost(&pinned, n));
    REQUIRE(gshm_open(b, "pulled/weights", GSHM_ACCESS_READ, &dst) == 0, "open pulled");
    REQUIRE(gshm_map(dst, NULL, 0, &dptr) == 0, "map pulled");
    CU(drv->cuMemcpyDtoH(pinned, (CUdeviceptr)(uintptr_t)dptr, n)); /* warm-up */
    t0 = (double)gshm__now_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < 4; i++)
      CU(drv->cuMemcpyDtoH(pinned, (CUdeviceptr)(uintptr_t)dptr, n));
    t1 = (double)gshm__now_ns(CLOCK_MONOTONIC);
    printf("device-to-host copy into pinned memory: %.2f GB/s (%" PRIu64 " bytes x 4)\n",
           4.0 * (double)n / (t1 - t0), n);
    gshm_close(dst);
    CU(drv->cuMemFreeHost(pinned));
  }

  /* read back from the GPU: every byte */
  REQUIRE(gshm_open(b, "pulled/weights", GSHM_ACCESS_READ, &dst) == 0, "open pulled");
  REQUIRE(gshm_map(dst, NULL, 0, &dptr) == 0, "map pulled");
  memset(got, 0, size);
  CU(drv->cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)dptr, size));
  CHECK(memcmp(got, want, size) == 0, "pulled bytes differ from the source");
  gshm_close(dst);

  /* two GPUs: the segment of GPU 0 (gshmd a) pulled onto GPU 1 by gshmd b */
  if (count < 2) {
    fprintf(stderr, "one GPU: the pull from cuda:0 onto cuda:1 SKIPPED (needs a second GPU)\n");
  } else {
    gshm_pull_opts_t p1 = {.local_name = "pulled/gpu1", .location = "cuda:1"};
    int e = gshm_pull(b, "a", "pub/weights", &p1, &r);
    REQUIRE(e == 0, "pull onto cuda:1: %s: %s", gshm_strerror(e), gshm_last_error(b));
    printf("pulled %" PRIu64 " bytes cuda:0 -> cuda:1 in %.3f s: %.2f GB/s, path %s\n", r.bytes,
           (double)r.elapsed_ns / 1e9, (double)r.bytes / (double)r.elapsed_ns, r.path);
    CHECK(r.bytes == size, "bytes %" PRIu64, r.bytes);
    REQUIRE(gshm_open(b, "pulled/gpu1", GSHM_ACCESS_READ, &dst) == 0, "open pulled/gpu1");
    {
      CUdevice dev1;
      CUuuid u;
      char ustr[48], want_loc[64];
      CU(drv->cuDeviceGet(&dev1, 1));
      CU(drv->cuDeviceGetUuid(&u, dev1));
      gshm__format_gpu_uuid((const unsigned char *)u.bytes, ustr);
      snprintf(want_loc, sizeof(want_loc), "cuda:%s", ustr);
      CHECK(strcmp(gshm_segment_info(dst)->location, want_loc) == 0, "location %s, not %s",
            gshm_segment_info(dst)->location, want_loc);
    }
    REQUIRE(gshm_map(dst, NULL, 0, &dptr) == 0, "map pulled/gpu1");
    memset(got, 0, size);
    CU(drv->cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)dptr, size)); /* (unified addressing) */
    CHECK(memcmp(got, want, size) == 0, "bytes pulled onto GPU 1 differ from the source");
    gshm_close(dst);
    CHECK(gshm_unlink(b, "pulled/gpu1") == 0, "unlink pulled/gpu1");
  }

  CHECK(gshm_unlink(b, "pulled/weights") == 0, "unlink pulled");
  CHECK(gshm_unlink(a, "pub/weights") == 0, "unlink source");
  fan_out(drv, a, b, &B, &C, count, size, want, got);
  gshm_disconnect(a);
  gshm_disconnect(b);
  CHECK(harness_stop(&C) == 0, "gshmd c exit");
  CHECK(harness_stop(&B) == 0, "gshmd b exit");
  CHECK(harness_stop(&A) == 0, "gshmd a exit");
  harness_set_leftover(NULL);
  free(want);
  free(got);
  return gpu_cluster_end(dir, key);
}
