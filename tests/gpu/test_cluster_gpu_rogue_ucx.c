/* SPDX-License-Identifier: Apache-2.0 */
/* tests/cluster/test_cluster_rogue_ucx.c's rogue serving peer (it holds
 * the cluster key; its bytes go over UCX from a worker of its own in a
 * child process) against a pull into device memory: gshmd P (cuda
 * backend) pulls "pub/stuck" into cuda:0, through its local staging
 * slots; the rogue answers the Read with a rendezvous that it does not
 * complete (the child stops).  The pull fails -ETIMEDOUT after
 * cluster.request_timeout_ms, and P keeps the slots UCX may still write
 * into (gshm_cluster_registered_staging_buffers: 1).  Then the rogue
 * resumes and UCX writes its bytes late, into those slots: nothing
 * anyone sees changes (a device and a host segment a user made on P,
 * device pulls from the honest node H before and after, whose slots are
 * the ones kept for the next pull), P stays up, the slots go once UCX
 * ended the receive (0 registered) and P stops cleanly.  The host pull's
 * steps are test_rendezvous_never_completed and
 * test_late_writes_change_nothing there.
 *
 * Plain C (no cmocka on the GPU machines); exit 77 without a driver or a
 * GPU.  GSHM_ROGUE_UCX_FAKE_CUDA=1: run under tests/integration's
 * fake_libcuda (no GPU: its device memory holds no bytes), where every
 * step runs but the device segments' bytes are not compared. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gshm.h"
#include "harness.h"
#include "rogue.h"
#include "rogue_ucx.h"
#include "util.h"

#include "gpu_check.h"
#include "gpu_cluster.h"

#define MiB (1ull << 20)
#define SEG (1 * MiB)     /* the rogue's segment: one Read (cluster.pull_chunk 64M) */
#define TIMEOUT_MS 2000   /* P's cluster.request_timeout_ms */
#define ROGUE_SEED 0x5a5a /* the rogue's bytes */
#define STR_(x) #x
#define STR(x) STR_(x)

static const struct gshm_cudadrv *drv;
static bool fake; /* fake_libcuda: device memory holds no bytes */
static struct harness P, H;
static struct rogue_ucx_child kid;
static uint8_t *want, *got;

static int64_t mono_ms(void) { return gshm__now_ns(CLOCK_MONOTONIC) / 1000000; }

static void kill_kid(void) { rogue_ucx_child_kill(&kid); }

/* (atexit: a failed REQUIRE leaves no gshmd behind; harness_kill_leftover
 * takes P) */
static void kill_h(void) {
  if (H.sp.pid > 0)
    kill(H.sp.pid, SIGKILL);
}

/* P's pull of `name` from peer into location, waited for: its error. */
static int pull(const char *peer, const char *name, const char *location) {
  struct rogue_ucx_pull bg = {
      .sock = P.socket_path, .peer = peer, .name = name, .location = location};

  REQUIRE(rogue_ucx_pull_start(&bg) == 0, "thread");
  pthread_join(bg.t, NULL);
  printf("pull of '%s' from %s into %s: %d %s\n", name, peer, location, bg.err, bg.msg);
  return bg.err;
}

/* A segment of size bytes from seed at location ("host", "cuda:0"),
 * made through c. */
static void make_at(gshm_client_t *c, const char *name, uint64_t size, const char *location,
                    unsigned long long seed) {
  gshm_segment_t *seg;
  void *p;

  harness_random(want, size, seed);
  REQUIRE(gshm_create(c, name, size, location, 0644, 0, &seg) == 0, "create %s: %s", name,
          gshm_last_error(c));
  REQUIRE(gshm_map(seg, NULL, 0, &p) == 0, "map %s", name);
  if (strcmp(location, "host"))
    CU(drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)p, want, size));
  else
    memcpy(p, want, size);
  CU(drv->cuCtxSynchronize());
  gshm_close(seg);
}

/* Checks every byte of segment name (size bytes of seed) on c, wherever
 * it is (device bytes: not under the fake driver). */
static void check_at(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed) {
  gshm_segment_t *seg;
  bool device;
  void *p;

  REQUIRE(gshm_open(c, name, GSHM_ACCESS_READ, &seg) == 0, "open %s: %s", name,
          gshm_last_error(c));
  CHECK(gshm_segment_info(seg)->requested_size == size, "%s: size %" PRIu64, name,
        gshm_segment_info(seg)->requested_size);
  device = strncmp(gshm_segment_info(seg)->location, "cuda:", 5) == 0;
  REQUIRE(gshm_map(seg, NULL, 0, &p) == 0, "map %s", name);
  if (!device || !fake) {
    harness_random(want, size, seed);
    memset(got, 0, size);
    if (device)
      CU(drv->cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)p, size));
    else
      memcpy(got, p, size);
    CHECK(memcmp(got, want, size) == 0, "%s (%s): its bytes changed", name,
          gshm_segment_info(seg)->location);
  }
  gshm_close(seg);
}

/* A counter or gauge (no labels) of P's metrics, or -1. */
static long p_metric(gshm_client_t *c, const char *name) {
  char *text = NULL, key[160];
  const char *m;
  long v = -1;

  snprintf(key, sizeof(key), "\n%s ", name);
  if (gshm_metrics(c, &text) == 0 && (m = strstr(text, key)))
    v = atol(m + strlen(key));
  gshm_free(text);
  return v;
}

#define HELD "gshm_cluster_registered_staging_buffers"

/* The rogue takes P's link and answers the Read of P's pull of
 * "pub/stuck" into cuda:0 with a rendezvous that its child does not
 * complete; the pull fails within about cluster.request_timeout_ms. */
static void stuck_pull(struct rogue *ra, int lfd, const uint8_t rkey[32]) {
  static uint8_t addr[8192];
  struct rogue_ucx_pull bg = {
      .sock = P.socket_path, .peer = "ra", .name = "pub/stuck", .location = "cuda:0"};
  uint64_t token = 0, len = 0;
  int64_t sent_ms = 0;

  REQUIRE(rogue_ucx_take_link(ra, lfd, "ra", rkey, addr, sizeof(addr), &token) > 2,
          "P's link to the rogue, with UCX");
  REQUIRE(rogue_ucx_child_start(&kid, addr, token) == 0, "the rogue's UCX worker");
  REQUIRE(rogue_ucx_pull_start(&bg) == 0, "thread");
  REQUIRE(rogue_ucx_stuck_read(ra, &kid, 1, "pub/stuck", SEG, ROGUE_SEED, &bg.done, &len,
                               &sent_ms) == 0,
          "the Read answered by a rendezvous: %d %s", bg.err, bg.msg);
  printf("Read of %" PRIu64 " bytes answered by a rendezvous\n", len);
  while (!bg.done && mono_ms() - sent_ms < 20000) { /* (what P sends is dropped) */
    Gshm__Cluster__Msg *m = rogue_recv(ra, 50);
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  printf("pull: %s after %" PRId64 " ms: %d %s\n", bg.done ? "ended" : "still running",
         (bg.done ? bg.done_ms : mono_ms()) - sent_ms, bg.err, bg.msg);
  REQUIRE(bg.done, "the pull did not end");
  pthread_join(bg.t, NULL);
  CHECK(len == SEG, "Read of %" PRIu64 " bytes", len);
  CHECK(bg.err == -ETIMEDOUT, "pull: %d", bg.err);
  CHECK(strstr(bg.msg, "peer 'ra'") && strstr(bg.msg, "UCX"), "message: %s", bg.msg);
  CHECK(bg.done_ms - sent_ms >= TIMEOUT_MS - 100 && bg.done_ms - sent_ms < TIMEOUT_MS + 4000,
        "failed after %" PRId64 " ms", bg.done_ms - sent_ms);
}

/* The late writes, and what must not change. */
static void late_writes(gshm_client_t *c) {
  gshm_status_info_t st;
  gshm_segment_info_t info;
  long held = -1;
  int s;

  make_at(c, "own/dev", SEG, "cuda:0", 31);
  make_at(c, "own/host", SEG, "host", 32);
  REQUIRE(pull("h", "pub/same", "cuda:0") == 0, "honest pull");
  check_at(c, "pub/same", SEG, 33);
  held = p_metric(c, HELD);
  printf("staging buffers P holds before the late writes: %ld\n", held);
  CHECK(held == 1, "slots held before the late writes: %ld", held);
  s = rogue_ucx_child_resume(&kid, 10000);
  printf("the rogue's rendezvous resumed: UCX status %d\n", s);
  CHECK(s == 0, "the rogue's late writes: UCX status %d", s);
  for (int64_t t0 = mono_ms(); mono_ms() - t0 < 5000 && (held = p_metric(c, HELD)) != 0;)
    usleep(20000);
  printf("staging buffers P holds after the late writes: %ld\n", held);
  CHECK(held == 0, "slots held after UCX ended the receive: %ld", held);
  check_at(c, "own/dev", SEG, 31);
  check_at(c, "own/host", SEG, 32);
  check_at(c, "pub/same", SEG, 33);
  check_at(c, "pub/ok", 3 * MiB + 5, 7);
  CHECK(gshm_stat_name(c, "pub/stuck", &info) == -ENOENT, "pub/stuck is there");
  CHECK(gshm_status(c, &st) == 0 && st.segments == 4, "P's segments: %" PRIu64,
        (uint64_t)st.segments);
  /* the next pull (into the slots kept for it) */
  CHECK(gshm_unlink(c, "pub/same") == 0, "unlink pub/same");
  REQUIRE(pull("h", "pub/same", "cuda:0") == 0, "honest pull after the late writes");
  check_at(c, "pub/same", SEG, 33);
  CHECK(p_metric(c, HELD) == 0, "slots held: %ld", p_metric(c, HELD));
  CHECK(kill(P.sp.pid, 0) == 0, "gshmd p is not running");
}

/* Starts H (exports "pub/" names) and P (pulls from the rogue "ra" on port and
 * from H), both on the cuda backend, over UCX. */
static void nodes_start(const char *key, int port) {
  static char sp[GPU_NODE_ARGS][512], sh[GPU_NODE_ARGS][512];
  const char *ap[GPU_NODE_ARGS + 1], *ah[GPU_NODE_ARGS + 1];
  char pp[96], ph[64];
  int port_p = gpu_free_port(), port_h = gpu_free_port();

  snprintf(pp, sizeof(pp), "ra=127.0.0.1:%d,h=127.0.0.1:%d", port, port_h);
  snprintf(ph, sizeof(ph), "p=127.0.0.1:%d", port_p);
  gpu_node_args(sh, ah, "cuda", "h", port_h, ph, key, "pub/*", "cluster.transport=ucx", NULL);
  gpu_node_args(sp, ap, "cuda", "p", port_p, pp, key, "", "cluster.transport=ucx",
                "cluster.pull_chunk=64M", "cluster.request_timeout_ms=" STR(TIMEOUT_MS), NULL);
  REQUIRE(harness_start(&H, ah) == 0, "gshmd h");
  atexit(kill_h);
  REQUIRE(harness_start(&P, ap) == 0, "gshmd p");
  harness_set_leftover(&P);
}

int main(void) {
  char dir[] = "/tmp/gshm-rogue-ucx-gpu-XXXXXX", key[300];
  struct rogue ra = {0};
  uint8_t rkey[32];
  gshm_client_t *c, *h;
  int lfd, port, ps;

  (void)gpu_cluster_gpu0(&drv);
  fake = getenv("GSHM_ROGUE_UCX_FAKE_CUDA") && !strcmp(getenv("GSHM_ROGUE_UCX_FAKE_CUDA"), "1");
  if (fake)
    printf("fake CUDA driver: the device segments' bytes are not compared\n");
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  REQUIRE((want = malloc(3 * MiB + 5)) && (got = malloc(3 * MiB + 5)), "buffers");
  /* (no blank in the key: gshmd trims those, rogue_key does not) */
  gpu_key_file(dir, key, sizeof(key), "gpu-test-rogue-ucx-key-012345678");
  rogue_key(key, rkey);
  REQUIRE((lfd = rogue_listener(&port)) >= 0, "listener");
  atexit(harness_kill_leftover);
  atexit(kill_kid);
  nodes_start(key, port);

  REQUIRE(gshm_connect(H.socket_path, "gpu-h", &h) == 0, "connect h");
  make_at(h, "pub/ok", 3 * MiB + 5, "cuda:0", 7);
  make_at(h, "pub/same", SEG, "cuda:0", 33);
  stuck_pull(&ra, lfd, rkey);
  REQUIRE(gshm_connect(P.socket_path, "gpu-p", &c) == 0, "connect p");
  {
    gshm_cluster_pull_t *pulls = NULL;
    gshm_status_info_t st;
    size_t npulls = 99;
    CHECK(gshm_status(c, &st) == 0 && st.segments == 0, "P's segments after the failed pull");
    CHECK(gshm_cluster_pulls(c, &pulls, &npulls) == 0 && npulls == 0, "pulls in flight: %zu",
          npulls);
    gshm_free(pulls);
  }
  REQUIRE(pull("h", "pub/ok", "cuda:0") == 0, "honest pull");
  check_at(c, "pub/ok", 3 * MiB + 5, 7);
  late_writes(c);
  gshm_disconnect(c);
  gshm_disconnect(h);
  ps = harness_stop(&P);
  printf("gshmd p stopped: %d\n", ps);
  CHECK(ps == 0, "gshmd p exit");
  harness_set_leftover(NULL);
  CHECK(harness_stop(&H) == 0, "gshmd h exit");
  H.sp.pid = 0;
  kill_kid();
  rogue_close(&ra);
  close(lfd);
  free(want);
  free(got);
  return gpu_cluster_end(dir, key);
}
