/* SPDX-License-Identifier: Apache-2.0 */
/* Device segments on real GPUs, against a real gshmd (tests/harness.h),
 * every role in its own process (this program re-executed with a role):
 *
 *   p2p       producer on GPU 0 fills fresh random data; consumer on GPU 1
 *             (mapped for GPU 1 only) verifies every byte over the peer
 *             link and writes new data; a third process on GPU 0 verifies it.
 *             On one GPU the consumer is another process on GPU 0.
 *   readonly  a read-only open maps, reads, and cannot write: the driver
 *             refuses the store (error reaches the caller), gshm_write says
 *             -EACCES, and the bytes are unchanged afterwards.
 *   cache     a re-open of a held segment is served by the lease cache (same
 *             fd, same address, no daemon lease, microseconds); after the
 *             name is unlinked and created again, the new generation is
 *             never served from the cache.
 *   sigkill   a consumer SIGKILLed while mapping leaves no lease behind and
 *             the segment's bytes intact for the next consumer.
 *   memory    after every client is gone and every segment unlinked,
 *             cuMemGetInfo's free memory is back within 1 MiB.
 *   legacy    legacy IPC export is refused unless gshmd runs with
 *             --legacy-ipc, and then a cuIpcOpenMemHandle on GPU 1 (GPU 0
 *             in another process on one GPU) of the handle reads what GPU 0
 *             wrote.
 *   restart   (argv[1] == "restart") gshmd SIGKILLed and restarted with its
 *             fd store: device segments come back byte for byte with the
 *             same ids and generations (issue 4).
 *
 * Needs a GPU; exits 77 (skip) without one.  With one GPU, or two without
 * peer access, every role that would run on GPU 1 runs on GPU 0 in its own
 * process, and only the steps that need a second GPU are skipped (the
 * orchestrator prints which): reads over the peer link, the cached
 * mapping's access added for GPU 1, and GPU 1's memory check. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gshm.h"
#include "harness.h"
#include "util.h"

#define MiB (1024ull * 1024)
#define SEG_SIZE (64 * MiB + 4097) /* not a multiple of the granularity */

#include "gpu_check.h"

static const struct gshm_cudadrv *drv;
static const char *self_exe;
static char uuid[2][48], loc[2][128];
/* The GPU a "consumer on the other GPU" uses: "1" with two GPUs that reach
 * each other, else "0" (another process on the same GPU). */
static const char *other = "1";
static bool have_peer;

/* ---- helpers ---- */

static CUcontext ctx_of(int ordinal) {
  static CUcontext ctx[8];
  CUdevice d;
  if (!ctx[ordinal]) {
    REQUIRE(drv->cuDeviceGet(&d, ordinal) == CUDA_SUCCESS, "cuDeviceGet %d", ordinal);
    REQUIRE(drv->cuDevicePrimaryCtxRetain(&ctx[ordinal], d) == CUDA_SUCCESS, "retain %d",
            ordinal);
  }
  REQUIRE(drv->cuCtxSetCurrent(ctx[ordinal]) == CUDA_SUCCESS, "set ctx %d", ordinal);
  return ctx[ordinal];
}

static size_t free_mem(int ordinal) {
  size_t fr = 0, total = 0;
  ctx_of(ordinal);
  REQUIRE(drv->cuMemGetInfo(&fr, &total) == CUDA_SUCCESS, "cuMemGetInfo");
  return fr;
}

static gshm_client_t *connect_or_die(void) {
  gshm_client_t *c = NULL;
  int e = gshm_connect(NULL, "test_segments", &c);
  REQUIRE(e == 0, "gshm_connect: %s", gshm_strerror(e));
  return c;
}

/* Copies the segment's bytes to host through GPU `ordinal`'s context (the
 * copy engine of that GPU reads them, over the peer link when remote) and
 * compares them with the seeded random stream. */
static void verify_on(int ordinal, void *addr, size_t n, unsigned long long seed, const char *what) {
  unsigned char *want = malloc(n), *got = malloc(n);
  size_t bad = 0, first = 0;
  CUresult r;

  REQUIRE(want && got, "malloc");
  harness_random(want, n, seed);
  memset(got, 0, n);
  ctx_of(ordinal);
  r = drv->cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)addr, n);
  CHECK(r == CUDA_SUCCESS, "%s: cuMemcpyDtoH on GPU %d: %d", what, ordinal, (int)r);
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i] && !bad++)
      first = i;
  CHECK(bad == 0, "%s: %zu of %zu bytes differ on GPU %d, first at %zu", what, bad, n, ordinal,
        first);
  free(want);
  free(got);
}

static void fill_on(int ordinal, void *addr, size_t n, unsigned long long seed) {
  unsigned char *buf = malloc(n);
  CUresult r;
  REQUIRE(buf, "malloc");
  harness_random(buf, n, seed);
  ctx_of(ordinal);
  r = drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)addr, buf, n);
  REQUIRE(r == CUDA_SUCCESS, "cuMemcpyHtoD on GPU %d: %d", ordinal, (int)r);
  free(buf);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs this program with a role; returns its exit status (or -1).  With
 * out_fd, the child's stdout is a pipe whose read end goes there and the
 * child's pid to *pid_out, and the caller waits. */
static int run_role(const char *const *args, int *out_fd, pid_t *pid_out) {
  const char *argv[16];
  int p[2] = {-1, -1}, st;
  int n = 0;
  pid_t pid;

  argv[n++] = self_exe;
  argv[n++] = "--role";
  for (int i = 0; args[i] && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  if (out_fd && pipe(p) < 0)
    return -1;
  fflush(NULL);
  pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    if (out_fd) {
      dup2(p[1], STDOUT_FILENO);
      close(p[0]);
      close(p[1]);
    }
    execv(self_exe, (char *const *)argv);
    _exit(127);
  }
  if (out_fd) {
    close(p[1]);
    *out_fd = p[0];
    *pid_out = pid;
    return 0;
  }
  if (waitpid(pid, &st, 0) < 0)
    return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define ROLE(...)                                                        \
  do {                                                                   \
    const char *const a_[] = {__VA_ARGS__, NULL};                        \
    int rc_ = run_role(a_, NULL, NULL);                                  \
    CHECK(rc_ == 0, "role %s exited with %d", a_[0], rc_);               \
  } while (0)

/* ---- roles (child processes) ---- */

/* produce NAME LOCATION SIZE SEED: create, map on the local GPU that owns
 * LOCATION, fill, close (the segment stays with gshmd). */
static int role_produce(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  const gshm_segment_info_t *info;
  uint64_t size = strtoull(a[2], NULL, 0);
  int dev = !strcmp(a[1], loc[0]) ? 0 : 1;
  void *addr = NULL;
  int e;

  e = gshm_create(c, a[0], size, a[1], 0666, 0, &s);
  REQUIRE(e == 0, "create %s at %s: %s (%s)", a[0], a[1], gshm_strerror(e), gshm_last_error(c));
  info = gshm_segment_info(s);
  CHECK(info->requested_size == size, "requested %" PRIu64 " vs %" PRIu64, info->requested_size,
        size);
  CHECK(info->granularity && info->size % info->granularity == 0 && info->size >= size,
        "size %" PRIu64 " granularity %" PRIu64, info->size, info->granularity);
  CHECK(!strcmp(info->location, loc[dev]), "location %s, want %s", info->location, loc[dev]);
  CHECK(info->device_index >= 0, "device_index %d", info->device_index);
  e = gshm_map(s, &dev, 1, &addr);
  REQUIRE(e == 0, "map on %d: %s", dev, gshm_strerror(e));
  fill_on(dev, addr, info->size, strtoull(a[3], NULL, 0));
  gshm_close(s);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* consume NAME DEVICE SEED NEWSEED: open read-write, map for DEVICE only,
 * verify every byte from DEVICE, then write NEWSEED's data from DEVICE. */
static int role_consume(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  gshm_lease_info_t *leases = NULL;
  size_t nleases = 0;
  int dev = atoi(a[1]);
  void *addr = NULL;
  bool found = false;
  int e;

  e = gshm_open(c, a[0], GSHM_ACCESS_READ_WRITE, &s);
  REQUIRE(e == 0, "open %s: %s", a[0], gshm_strerror(e));
  e = gshm_map(s, &dev, 1, &addr);
  REQUIRE(e == 0, "map on %d: %s", dev, gshm_strerror(e));
  verify_on(dev, addr, gshm_segment_info(s)->size, strtoull(a[2], NULL, 0), "consumer");
  /* The daemon knows which GPU this lease mapped on. */
  e = gshm_list_leases(c, &leases, &nleases);
  CHECK(e == 0, "list leases: %s", gshm_strerror(e));
  for (size_t i = 0; i < nleases; i++)
    if (leases[i].pid == getpid() && !strcmp(leases[i].segment_name, a[0])) {
      found = true;
      CHECK(leases[i].mapped && !strcmp(leases[i].mapped_devices, uuid[dev]),
            "lease mapped %d on '%s', want %s", leases[i].mapped, leases[i].mapped_devices,
            uuid[dev]);
    }
  CHECK(found, "no lease of ours in gshm_list_leases");
  gshm_free(leases);
  fill_on(dev, addr, gshm_segment_info(s)->size, strtoull(a[3], NULL, 0));
  gshm_close(s);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* verify NAME DEVICE SEED: read-only open, map on DEVICE, verify. */
static int role_verify(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  int dev = atoi(a[1]);
  void *addr = NULL;
  int e;

  e = gshm_open(c, a[0], GSHM_ACCESS_READ, &s);
  REQUIRE(e == 0, "open %s: %s", a[0], gshm_strerror(e));
  e = gshm_map(s, &dev, 1, &addr);
  REQUIRE(e == 0, "map on %d: %s", dev, gshm_strerror(e));
  verify_on(dev, addr, gshm_segment_info(s)->size, strtoull(a[2], NULL, 0), "verify");
  gshm_close(s);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* readonly NAME SEED: a read-only lease maps and reads, and cannot write. */
static int role_readonly(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  unsigned char junk[4096];
  void *addr = NULL;
  CUresult r;
  int e;

  e = gshm_open(c, a[0], GSHM_ACCESS_READ, &s);
  REQUIRE(e == 0, "open %s read-only: %s", a[0], gshm_strerror(e));
  e = gshm_map(s, NULL, 0, &addr); /* default: every device that can reach it */
  REQUIRE(e == 0, "map: %s", gshm_strerror(e));
  verify_on(0, addr, gshm_segment_info(s)->size, strtoull(a[1], NULL, 0), "read-only reader");
  e = gshm_write(s, 0, junk, sizeof(junk));
  CHECK(e == -EACCES, "gshm_write on a read-only lease: %d, want -EACCES", e);
  {
    /* A flag in the read-only mapping: copy_signal with the copy engine
     * refuses before it queues the copy (before, the copy ran and only the
     * signal failed: a consumer waiting on the flag would wait for ever) */
    CUdeviceptr src = 0, dst = 0;
    unsigned char back[64];
    ctx_of(0);
    REQUIRE(drv->cuMemAlloc(&src, 4096) == CUDA_SUCCESS && drv->cuMemAlloc(&dst, 4096) ==
            CUDA_SUCCESS, "cuMemAlloc");
    REQUIRE(drv->cuMemsetD8(src, 0x77, 4096) == CUDA_SUCCESS &&
            drv->cuMemsetD8(dst, 0, 4096) == CUDA_SUCCESS, "cuMemsetD8");
    for (int m = GSHM_COPY_AUTO; m <= GSHM_COPY_SM; m++) {
      e = gshm_copy_signal((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, 4096,
                           (gshm_copy_method_t)m, (uint64_t *)addr, 1, NULL);
      CHECK(e == -EACCES, "copy_signal (method %d) to a read-only flag: %d, want -EACCES", m, e);
    }
    e = gshm_signal((uint64_t *)addr, 1, NULL);
    CHECK(e == -EACCES, "signal of a read-only flag: %d, want -EACCES", e);
    REQUIRE(drv->cuStreamSynchronize(NULL) == CUDA_SUCCESS, "sync");
    REQUIRE(drv->cuMemcpyDtoH(back, dst, sizeof(back)) == CUDA_SUCCESS, "read back");
    CHECK(back[0] == 0 && back[63] == 0, "a refused copy_signal copied (%#x)", back[0]);
    drv->cuMemFree(src);
    drv->cuMemFree(dst);
  }
  /* The driver itself must refuse a store through the read-only mapping. */
  memset(junk, 0x5a, sizeof(junk));
  ctx_of(0);
  r = drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)addr, junk, sizeof(junk));
  if (r == CUDA_SUCCESS)
    r = drv->cuStreamSynchronize(NULL);
  CHECK(r != CUDA_SUCCESS, "a copy into a read-only mapping succeeded");
  fprintf(stderr, "readonly: the driver refused the write with CUresult %d\n", (int)r);
  /* The context may be unusable now (a fault is sticky): just leave. */
  return failures ? 1 : 0;
}

/* hostro NAME: a host segment opened read-only (PROT_READ mapping) is no
 * destination of gshm_copy (every method): -EACCES before the driver is
 * asked (before session 35 only a device segment's read-only mapping was
 * refused: the driver was handed a store through PROT_READ, and the role
 * died of SIGSEGV, H200); page-locked read-only (cuMemHostRegister
 * READ_ONLY), no copy's destination nor gshm_signal's or
 * gshm_copy_signal's flag either; copying out of it works, and the
 * context still works after. */
static int role_hostro(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  unsigned char want[4096], back[4096];
  CUdeviceptr dev = 0;
  void *addr = NULL;
  int e;

  e = gshm_open(c, a[0], GSHM_ACCESS_READ, &s);
  REQUIRE(e == 0, "open %s read-only: %s", a[0], gshm_strerror(e));
  e = gshm_map(s, NULL, 0, &addr);
  REQUIRE(e == 0, "map: %s", gshm_strerror(e));
  memcpy(want, addr, sizeof(want));
  ctx_of(0);
  REQUIRE(drv->cuMemAlloc(&dev, 4096) == CUDA_SUCCESS, "cuMemAlloc");
  REQUIRE(drv->cuMemsetD8(dev, 0x3c, 4096) == CUDA_SUCCESS, "cuMemsetD8");
  REQUIRE(drv->cuCtxSynchronize() == CUDA_SUCCESS, "sync");
  for (int m = GSHM_COPY_AUTO; m <= GSHM_COPY_SM; m++) {
    e = gshm_copy(addr, (const void *)(uintptr_t)dev, 4096, (gshm_copy_method_t)m, NULL);
    CHECK(e == -EACCES, "copy (method %d) into a read-only host segment: %d, want -EACCES", m, e);
  }
  /* a flag in pageable memory is refused as such (-EINVAL, gshm.h); page-locked
   * read-only (cuMemHostRegister READ_ONLY: the GPU may read it), as read-only */
  e = gshm_signal((uint64_t *)addr, 1, NULL);
  CHECK(e == -EINVAL, "signal in a pageable read-only host segment: %d, want -EINVAL", e);
  if (drv->cuMemHostRegister(addr, 8192, CU_MEMHOSTREGISTER_READ_ONLY) == CUDA_SUCCESS) {
    e = gshm_signal((uint64_t *)addr, 1, NULL);
    CHECK(e == -EACCES, "signal in a registered read-only host segment: %d, want -EACCES", e);
    e = gshm_copy_signal((void *)(uintptr_t)dev, (const void *)(uintptr_t)dev, 64,
                         GSHM_COPY_SM, (uint64_t *)addr + 8, 1, NULL);
    CHECK(e == -EACCES, "copy_signal with its flag in a registered read-only host segment: %d",
          e);
    for (int m = GSHM_COPY_AUTO; m <= GSHM_COPY_SM; m++) {
      e = gshm_copy(addr, (const void *)(uintptr_t)dev, 4096, (gshm_copy_method_t)m, NULL);
      CHECK(e == -EACCES, "copy (method %d) into a registered read-only host segment: %d", m,
            e);
    }
    REQUIRE(drv->cuMemHostUnregister(addr) == CUDA_SUCCESS, "cuMemHostUnregister");
  } else {
    fprintf(stderr, "hostro: cuMemHostRegister READ_ONLY refused here: its steps skipped\n");
  }
  e = gshm_copy((void *)(uintptr_t)dev, addr, 4096, GSHM_COPY_ENGINE, NULL);
  CHECK(e == 0, "copy out of a read-only host segment: %d", e);
  REQUIRE(drv->cuCtxSynchronize() == CUDA_SUCCESS, "the context faulted after the refusals");
  REQUIRE(drv->cuMemcpyDtoH(back, dev, sizeof(back)) == CUDA_SUCCESS, "read back");
  CHECK(!memcmp(back, want, sizeof(back)), "copy out of a read-only host segment: wrong bytes");
  CHECK(!memcmp(addr, want, sizeof(want)), "a refused copy changed the read-only segment");
  drv->cuMemFree(dev);
  gshm_close(s);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* cache NAME LOCATION SEED NEWSEED: re-opens of a held segment come from
 * the lease cache; a new generation never does. */
static int role_cache(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s1 = NULL, *s2 = NULL, *s3 = NULL, *s4 = NULL;
  gshm_segment_info_t st;
  void *a1 = NULL, *a2 = NULL, *a3 = NULL;
  int dev = 0, e;
  int64_t t0, t1, first_ns, cached_ns;
  uint64_t gen1;

  t0 = now_ns();
  e = gshm_open(c, a[0], GSHM_ACCESS_READ_WRITE, &s1);
  REQUIRE(e == 0, "open: %s", gshm_strerror(e));
  e = gshm_map(s1, &dev, 1, &a1);
  REQUIRE(e == 0, "map: %s", gshm_strerror(e));
  first_ns = now_ns() - t0;
  gen1 = gshm_segment_info(s1)->generation;

  t0 = now_ns();
  e = gshm_open(c, a[0], GSHM_ACCESS_READ_WRITE, &s2);
  if (!e)
    e = gshm_map(s2, &dev, 1, &a2);
  t1 = now_ns();
  cached_ns = t1 - t0;
  REQUIRE(e == 0, "cached re-open/map: %s", gshm_strerror(e));
  CHECK(a2 == a1, "cached map at %p, first at %p", a2, a1);
  CHECK(gshm_segment_fd(s2) == gshm_segment_fd(s1), "cached open got fd %d, first %d (a new "
        "lease and import)", gshm_segment_fd(s2), gshm_segment_fd(s1));
  CHECK(cached_ns < 200000, "cached open+map took %" PRId64 " ns", cached_ns);
  e = gshm_stat(s1, &st);
  CHECK(e == 0 && st.leases == 1, "daemon sees %u leases (want 1: no round trip)", st.leases);
  fprintf(stderr, "cache: first open+map %.1f us, cached %.2f us\n", first_ns / 1e3,
          cached_ns / 1e3);

  /* A cached open mapped for another device: same address, and that
   * device gets access (it reads the bytes). */
  {
    int one = 1;
    if (have_peer) {
      gshm_segment_t *s5 = NULL;
      void *a5 = NULL;
      e = gshm_open(c, a[0], GSHM_ACCESS_READ_WRITE, &s5);
      REQUIRE(e == 0, "cached open: %s", gshm_strerror(e));
      e = gshm_map(s5, &one, 1, &a5);
      REQUIRE(e == 0, "cached map for GPU 1: %s", gshm_strerror(e));
      CHECK(a5 == a1, "cached map for GPU 1 at %p, first at %p", a5, a1);
      verify_on(1, a1, gshm_segment_info(s1)->size, strtoull(a[2], NULL, 0),
                "cached mapping read on GPU 1");
      gshm_close(s5);
    }
  }

  /* The name is reused: a new segment, a new generation. */
  e = gshm_unlink(c, a[0]);
  REQUIRE(e == 0, "unlink: %s", gshm_strerror(e));
  e = gshm_create(c, a[0], 2 * MiB, a[1], 0666, 0, &s3);
  REQUIRE(e == 0, "re-create: %s", gshm_strerror(e));
  gshm_close(s3);
  e = gshm_open(c, a[0], GSHM_ACCESS_READ_WRITE, &s4);
  REQUIRE(e == 0, "open of the new generation: %s", gshm_strerror(e));
  CHECK(gshm_segment_info(s4)->generation != gen1, "stale generation %" PRIu64 " served",
        gen1);
  CHECK(gshm_segment_fd(s4) != gshm_segment_fd(s1), "the new generation shares the old fd");
  e = gshm_map(s4, &dev, 1, &a3);
  REQUIRE(e == 0, "map new: %s", gshm_strerror(e));
  CHECK(a3 != a1, "the new generation mapped at the old address");
  CHECK(gshm_segment_info(s4)->size == 2 * MiB, "new size %" PRIu64,
        gshm_segment_info(s4)->size);
  /* The old mapping still holds the old bytes; the new segment is zeroed. */
  verify_on(0, a1, gshm_segment_info(s1)->size, strtoull(a[2], NULL, 0), "old generation");
  {
    unsigned char z[4096], zero[4096] = {0};
    ctx_of(0);
    CHECK(drv->cuMemcpyDtoH(z, (CUdeviceptr)(uintptr_t)a3, sizeof(z)) == CUDA_SUCCESS, "read new");
    CHECK(!memcmp(z, zero, sizeof(z)), "a new segment is not zeroed");
  }
  gshm_close(s4);
  gshm_close(s2);
  gshm_close(s1);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* hold NAME DEVICE: open, map, say "ready" on stdout, wait to be killed. */
static int role_hold(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  int dev = atoi(a[1]);
  void *addr = NULL;
  int e;

  e = gshm_open(c, a[0], GSHM_ACCESS_READ_WRITE, &s);
  REQUIRE(e == 0, "open: %s", gshm_strerror(e));
  e = gshm_map(s, &dev, 1, &addr);
  REQUIRE(e == 0, "map: %s", gshm_strerror(e));
  printf("ready\n");
  fflush(stdout);
  for (;;)
    pause();
}

/* legacy-refused LOCATION: creating a legacy segment is refused. */
static int role_legacy_refused(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL;
  uint8_t h[64];
  int e = gshm_create(c, "t/legacy-refused", 2 * MiB, a[0], 0600, GSHM_CREATE_LEGACY_IPC, &s);

  CHECK(e == -ENOTSUP, "legacy create without --legacy-ipc: %d (%s)", e, gshm_last_error(c));
  if (!e)
    gshm_close(s);
  /* And a plain segment never yields a legacy handle. */
  e = gshm_create(c, "t/plain", 2 * MiB, a[0], 0600, 0, &s);
  CHECK(e == 0, "plain create: %s", gshm_strerror(e));
  if (!e)
    gshm_close(s);
  e = gshm_open_legacy_ipc(c, "t/plain", h, &s);
  CHECK(e == -ENOTSUP, "legacy open of a plain segment: %d", e);
  gshm_unlink(c, "t/plain");
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* legacy-produce NAME LOCATION SEED: create with GSHM_CREATE_LEGACY_IPC,
 * fill through the handle on GPU 0, print the handle in hex. */
static int role_legacy_produce(char **a) {
  gshm_client_t *c = connect_or_die();
  gshm_segment_t *s = NULL, *l = NULL;
  uint8_t h[64];
  CUipcMemHandle ih;
  CUdeviceptr p = 0;
  int e;

  e = gshm_create(c, a[0], 2 * MiB, a[1], 0666, GSHM_CREATE_LEGACY_IPC, &s);
  REQUIRE(e == 0, "legacy create: %s (%s)", gshm_strerror(e), gshm_last_error(c));
  e = gshm_open_legacy_ipc(c, a[0], h, &l);
  REQUIRE(e == 0, "legacy open: %s (%s)", gshm_strerror(e), gshm_last_error(c));
  memcpy(ih.reserved, h, 64);
  ctx_of(0);
  {
    CUresult r = drv->cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    const char *name = "?";
    drv->cuGetErrorName(r, &name);
    CHECK(r == CUDA_SUCCESS, "cuIpcOpenMemHandle on GPU 0: %d %s", (int)r, name);
  }
  if (p) {
    fill_on(0, (void *)(uintptr_t)p, 2 * MiB, strtoull(a[2], NULL, 0));
    drv->cuIpcCloseMemHandle(p);
  }
  for (int i = 0; i < 64; i++)
    printf("%02x", h[i]);
  printf("\n");
  gshm_close(l);
  gshm_close(s);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* legacy-consume HEX SEED DEVICE: open the handle on DEVICE and verify. */
static int role_legacy_consume(char **a) {
  CUipcMemHandle ih;
  CUdeviceptr p = 0;
  CUresult r;
  int dev = atoi(a[2]);

  for (int i = 0; i < 64; i++) {
    unsigned v = 0;
    REQUIRE(sscanf(a[0] + 2 * i, "%2x", &v) == 1, "bad hex");
    ih.reserved[i] = (char)v;
  }
  ctx_of(dev);
  r = drv->cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  REQUIRE(r == CUDA_SUCCESS, "cuIpcOpenMemHandle on GPU %d: %d", dev, (int)r);
  verify_on(dev, (void *)(uintptr_t)p, 2 * MiB, strtoull(a[1], NULL, 0), "legacy consumer");
  drv->cuIpcCloseMemHandle(p);
  return failures ? 1 : 0;
}

static int run_child_role(int argc, char **argv) {
  static const struct {
    const char *name;
    int nargs;
    int (*fn)(char **);
  } roles[] = {
      {"produce", 4, role_produce},   {"consume", 4, role_consume},
      {"verify", 3, role_verify},     {"readonly", 2, role_readonly},
      {"hostro", 1, role_hostro},
      {"cache", 4, role_cache},       {"hold", 2, role_hold},
      {"legacy-refused", 1, role_legacy_refused},
      {"legacy-produce", 3, role_legacy_produce},
      {"legacy-consume", 3, role_legacy_consume},
  };
  for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
    if (!strcmp(argv[0], roles[i].name)) {
      REQUIRE(argc - 1 == roles[i].nargs, "role %s takes %d args", argv[0], roles[i].nargs);
      return roles[i].fn(argv + 1);
    }
  fprintf(stderr, "unknown role %s\n", argv[0]);
  return 2;
}

/* ---- orchestrator ---- */

static bool lease_of_pid(gshm_client_t *c, pid_t pid) {
  gshm_lease_info_t *l = NULL;
  size_t n = 0;
  bool found = false;
  if (gshm_list_leases(c, &l, &n))
    return true;
  for (size_t i = 0; i < n; i++)
    found |= l[i].pid == pid;
  gshm_free(l);
  return found;
}

/* Waits until gshmd holds no lease and no segment (it notices the
 * children's hangups asynchronously). */
static bool wait_idle(gshm_client_t *c) {
  for (int i = 0; i < 500; i++) {
    gshm_status_info_t st;
    if (!gshm_status(c, &st) && st.leases == 0 && st.segments == 0)
      return true;
    usleep(10000);
  }
  return false;
}

static void rand_seed(char *buf, size_t cap) {
  unsigned long long s = (unsigned long long)now_ns() ^ ((unsigned long long)getpid() << 32);
  snprintf(buf, cap, "%llu", s * 0x9E3779B97F4A7C15ull | 1);
}

/* gpuDirectRDMACapable of the allocation behind an imported fd. */
static int imported_rdma_flag(int fd) {
  CUmemGenericAllocationHandle hnd;
  CUmemAllocationProp prop;

  CU(drv->cuMemImportFromShareableHandle(&hnd, (void *)(uintptr_t)fd,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  memset(&prop, 0, sizeof(prop));
  CU(drv->cuMemGetAllocationPropertiesFromHandle(&prop, hnd));
  CU(drv->cuMemRelease(hnd));
  return prop.allocFlags.gpuDirectRDMACapable;
}

/* gshmd's device allocations may be registered by a NIC (GPUDirect RDMA,
 * the cluster path's direct reads) where the GPU supports it for cuMem
 * allocations.  Compared with an allocation of this test's, made with the
 * flag and read back through an fd the same way: where the driver does
 * not report the flag through an import, nothing can be told (said). */
static void check_rdma_capable(gshm_client_t *c, const char *name) {
  CUmemAllocationProp prop;
  CUmemGenericAllocationHandle own;
  gshm_segment_t *s = NULL;
  CUdevice d;
  size_t gran = 0;
  int want = 0, fd = -1, mine, theirs;

  ctx_of(0);
  REQUIRE(drv->cuDeviceGet(&d, 0) == CUDA_SUCCESS, "cuDeviceGet");
  if (drv->cuDeviceGetAttribute(&want, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                d) != CUDA_SUCCESS || !want) {
    fprintf(stderr, "rdma: GPU 0 has no GPUDirect RDMA for cuMem: SKIPPED\n");
    return;
  }
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = d;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.allocFlags.gpuDirectRDMACapable = 1;
  CU(drv->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CU(drv->cuMemCreate(&own, gran, &prop, 0));
  CU(drv->cuMemExportToShareableHandle(&fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  mine = imported_rdma_flag(fd);
  close(fd);
  CU(drv->cuMemRelease(own));
  CHECK(gshm_open(c, name, GSHM_ACCESS_READ, &s) == 0, "open %s", name);
  if (!s)
    return;
  theirs = imported_rdma_flag(gshm_segment_fd(s));
  gshm_close(s);
  fprintf(stderr, "rdma: gpuDirectRDMACapable through an import: this test's allocation %d, "
          "gshmd's %d\n", mine, theirs);
  if (!mine)
    fprintf(stderr, "rdma: the driver does not report the flag through an import: SKIPPED\n");
  else
    CHECK(theirs, "gshmd's device allocation is not GPUDirect-RDMA-capable");
}

/* A hidden device segment (GSHM_CREATE_HIDDEN), filled on GPU 0 and
 * published over name (ours, no lease left): another process then reads
 * the new bytes under the name. */
static void step_publish(gshm_client_t *c, const char *name) {
  gshm_segment_t *s = NULL, *o = NULL;
  char seed[32];
  void *addr = NULL;
  int dev = 0, e;

  rand_seed(seed, sizeof(seed));
  e = gshm_create(c, name, SEG_SIZE, loc[0], 0666, GSHM_CREATE_HIDDEN, &s);
  REQUIRE(e == 0, "hidden create at %s: %s (%s)", loc[0], gshm_strerror(e), gshm_last_error(c));
  CHECK(gshm_segment_info(s)->id == 0, "a hidden segment has id %" PRIu64,
        gshm_segment_info(s)->id);
  e = gshm_map(s, &dev, 1, &addr);
  REQUIRE(e == 0, "map hidden on 0: %s", gshm_strerror(e));
  fill_on(0, addr, gshm_segment_info(s)->size, strtoull(seed, NULL, 0));
  e = gshm_publish(s, 0);
  CHECK(e == -EEXIST, "publish over %s without replace: %s", name, gshm_strerror(e));
  e = gshm_publish(s, GSHM_PUBLISH_REPLACE);
  CHECK(e == 0, "publish over %s: %s (%s)", name, gshm_strerror(e), gshm_last_error(c));
  CHECK(gshm_open(c, name, GSHM_ACCESS_READ, &o) == 0 &&
            gshm_segment_info(o)->id == gshm_segment_info(s)->id,
        "%s is not the published segment", name);
  gshm_close(o);
  gshm_close(s);
  ROLE("verify", name, "0", seed);
}

static void test_main(struct harness *h) {
  gshm_client_t *c;
  char seed[32], seed2[32], seed3[32], size[32];
  size_t base0, base1, after0, after1;
  int outfd = -1;
  pid_t pid = 0;
  char line[64] = {0};
  ssize_t n;
  int st;

  (void)h;
  snprintf(size, sizeof(size), "%llu", (unsigned long long)SEG_SIZE);
  c = connect_or_die();

  /* Warm-up: the daemon's first allocation on each GPU sets up state it
   * keeps (page tables); the baseline is taken after it. */
  ROLE("produce", "t/warm0", loc[0], "2097152", "1");
  CHECK(gshm_unlink(c, "t/warm0") == 0, "unlink warm-up");
  if (have_peer) {
    ROLE("produce", "t/warm1", loc[1], "2097152", "1");
    CHECK(gshm_unlink(c, "t/warm1") == 0, "unlink warm-up");
  }
  CHECK(wait_idle(c), "gshmd not idle after warm-up");
  base0 = free_mem(0);
  base1 = have_peer ? free_mem(1) : 0;

  /* p2p */
  rand_seed(seed, sizeof(seed));
  rand_seed(seed2, sizeof(seed2));
  ROLE("produce", "t/p2p", loc[0], size, seed);
  check_rdma_capable(c, "t/p2p");
  ROLE("consume", "t/p2p", other, seed, seed2);
  ROLE("verify", "t/p2p", "0", seed2);
  fprintf(stderr, "p2p: done (%d failures so far)\n", failures);

  /* readonly */
  ROLE("readonly", "t/p2p", seed2);
  ROLE("verify", "t/p2p", other, seed2);
  fprintf(stderr, "readonly: done (%d failures so far)\n", failures);

  /* a host segment opened read-only is no copy's destination */
  {
    gshm_segment_t *hs = NULL;
    unsigned char bytes[8192];
    gpu_fill_random(bytes, sizeof(bytes), 35);
    CHECK(gshm_create(c, "t/hostro", sizeof(bytes), "host", 0644, 0, &hs) == 0 &&
              gshm_write(hs, 0, bytes, sizeof(bytes)) == 0,
          "host segment t/hostro");
    gshm_close(hs);
    ROLE("hostro", "t/hostro");
    CHECK(gshm_unlink(c, "t/hostro") == 0, "unlink t/hostro");
    fprintf(stderr, "hostro: done (%d failures so far)\n", failures);
  }

  /* cache (unlinks t/p2p and creates it again, 2 MiB) */
  ROLE("cache", "t/p2p", loc[0], seed2, seed);
  fprintf(stderr, "cache: done (%d failures so far)\n", failures);

  /* sigkill */
  rand_seed(seed3, sizeof(seed3));
  ROLE("produce", "t/kill", loc[0], size, seed3);
  {
    const char *const a[] = {"hold", "t/kill", other, NULL};
    CHECK(run_role(a, &outfd, &pid) == 0, "start holder");
  }
  n = read(outfd, line, sizeof(line) - 1);
  CHECK(n > 0 && !strncmp(line, "ready", 5), "holder not ready: '%s'", line);
  close(outfd);
  CHECK(lease_of_pid(c, pid), "holder's lease not listed");
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  {
    bool gone = false;
    for (int i = 0; i < 500 && !gone; i++) {
      gone = !lease_of_pid(c, pid);
      if (!gone)
        usleep(10000);
    }
    CHECK(gone, "a SIGKILLed consumer's lease is still listed");
  }
  ROLE("verify", "t/kill", other, seed3);
  ROLE("verify", "t/kill", "0", seed3);
  fprintf(stderr, "sigkill: done (%d failures so far)\n", failures);

  /* publish: a hidden device segment replaces t/kill */
  step_publish(c, "t/kill");
  fprintf(stderr, "publish: done (%d failures so far)\n", failures);

  /* memory */
  CHECK(gshm_unlink(c, "t/p2p") == 0, "unlink t/p2p");
  CHECK(gshm_unlink(c, "t/kill") == 0, "unlink t/kill");
  CHECK(wait_idle(c), "gshmd still holds leases or segments");
  after0 = free_mem(0);
  after1 = have_peer ? free_mem(1) : 0;
  fprintf(stderr, "memory: GPU 0 free %zu -> %zu, GPU 1 free %zu -> %zu bytes\n", base0, after0,
          base1, after1);
  CHECK(after0 + MiB >= base0 && after0 <= base0 + MiB, "GPU 0 free memory off by %lld bytes",
        (long long)after0 - (long long)base0);
  CHECK(after1 + MiB >= base1 && after1 <= base1 + MiB, "GPU 1 free memory off by %lld bytes",
        (long long)after1 - (long long)base1); /* 0 and 0 without GPU 1 */

  /* legacy, refused on this daemon */
  ROLE("legacy-refused", loc[0]);
  gshm_disconnect(c);
}

static void test_legacy(struct harness *h) {
  const char *const args[] = {"--backend", "cuda", "--legacy-ipc", NULL};
  char seed[32], hex[160] = {0};
  int outfd = -1, st;
  pid_t pid = 0;
  size_t got = 0;
  ssize_t n;

  harness_stop(h);
  REQUIRE(harness_start(h, args) == 0, "gshmd --legacy-ipc did not start");
  rand_seed(seed, sizeof(seed));
  {
    const char *const a[] = {"legacy-produce", "t/legacy", loc[0], seed, NULL};
    REQUIRE(run_role(a, &outfd, &pid) == 0, "start legacy producer");
  }
  while (got < sizeof(hex) - 1 && (n = read(outfd, hex + got, sizeof(hex) - 1 - got)) > 0)
    got += (size_t)n;
  close(outfd);
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "legacy producer failed");
  if (got >= 128) {
    hex[128] = '\0';
    ROLE("legacy-consume", hex, seed, other);
  } else {
    CHECK(0, "no legacy handle printed");
  }
  fprintf(stderr, "legacy: done (%d failures so far)\n", failures);
}

/* A gshmd restarted without its CUDA backend (--backend host: as where
 * the driver does not start) keeps the device segments parked with their
 * fds: listed as before, opens refused (-ENODEV); the next gshmd with the
 * backend adopts them with their bytes (ARCHITECTURE.md "Device segments
 * no GPU here takes are parked"; dropped before efb7065). */
static void parked_restart(struct harness *h, const char *names[2],
                           const gshm_segment_info_t before[2]) {
  const char *const host[] = {"--backend", "host", NULL}, *const cuda[] = {"--backend", "cuda",
                                                                           NULL};
  gshm_segment_info_t after;
  gshm_segment_t *s = NULL;
  gshm_client_t *c;

  REQUIRE(harness_restart(h, SIGKILL, host) == 0, "gshmd --backend host did not come back");
  c = connect_or_die();
  for (int i = 0; i < 2; i++) {
    int e = gshm_stat_name(c, names[i], &after);
    CHECK(e == 0 && after.id == before[i].id && !strcmp(after.location, before[i].location),
          "%s without the CUDA backend: %s", names[i], gshm_strerror(e));
    e = gshm_open(c, names[i], GSHM_ACCESS_READ, &s);
    CHECK(e == -ENODEV, "open of parked %s: %s, want ENODEV", names[i], gshm_strerror(e));
    if (!e)
      gshm_close(s);
  }
  gshm_disconnect(c);
  REQUIRE(harness_restart(h, SIGTERM, cuda) == 0, "gshmd --backend cuda did not come back");
  fprintf(stderr, "parked: both device segments kept without the CUDA backend, opens refused\n");
}

/* Device segments survive a gshmd SIGKILL and restart (issue 4, item 3);
 * and a restart without the CUDA backend (parked_restart). */
static void test_restart(struct harness *h) {
  const char *const args[] = {"--backend", "cuda", NULL};
  char seed0[32], seed1[32], size[32];
  gshm_segment_info_t before[2], after;
  gshm_client_t *c;
  const char *names[2] = {"t/restart0", "t/restart1"};

  snprintf(size, sizeof(size), "%llu", (unsigned long long)SEG_SIZE);
  rand_seed(seed0, sizeof(seed0));
  rand_seed(seed1, sizeof(seed1));
  ROLE("produce", names[0], loc[0], size, seed0);
  ROLE("produce", names[1], loc[1], "2097152", seed1); /* loc[0] on one GPU */
  c = connect_or_die();
  for (int i = 0; i < 2; i++)
    CHECK(gshm_stat_name(c, names[i], &before[i]) == 0, "stat %s", names[i]);
  gshm_disconnect(c);

  REQUIRE(harness_restart(h, SIGKILL, args) == 0, "gshmd did not come back");
  c = connect_or_die();
  for (int i = 0; i < 2; i++) {
    int e = gshm_stat_name(c, names[i], &after);
    CHECK(e == 0, "%s not restored: %s", names[i], gshm_strerror(e));
    if (e)
      continue;
    CHECK(after.id == before[i].id && after.generation == before[i].generation &&
              after.size == before[i].size && !strcmp(after.location, before[i].location),
          "%s restored as id %" PRIu64 " gen %" PRIu64 " size %" PRIu64 " at %s", names[i],
          after.id, after.generation, after.size, after.location);
  }
  ROLE("verify", names[0], other, seed0);
  ROLE("verify", names[1], "0", seed1);
  gshm_disconnect(c);
  parked_restart(h, names, before);
  ROLE("verify", names[0], other, seed0); /* (the bytes, after the parked run) */
  ROLE("verify", names[1], "0", seed1);
  c = connect_or_die();
  CHECK(gshm_unlink(c, names[0]) == 0 && gshm_unlink(c, names[1]) == 0, "unlink");
  gshm_disconnect(c);
  fprintf(stderr, "restart: done (%d failures so far)\n", failures);
}

int main(int argc, char **argv) {
  const char *const args[] = {"--backend", "cuda", NULL};
  struct harness h;
  int count = 0, can01 = 0, can10 = 0, st;
  bool restart = argc > 1 && !strcmp(argv[1], "restart");

  self_exe = "/proc/self/exe";
  if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) || drv->cuDeviceGetCount(&count) != CUDA_SUCCESS ||
      count < 1) {
    fprintf(stderr, "SKIP: needs a CUDA driver and a GPU (have %d)\n", count);
    return SKIP;
  }
  if (count >= 2) {
    drv->cuDeviceCanAccessPeer(&can01, 0, 1);
    drv->cuDeviceCanAccessPeer(&can10, 1, 0);
  }
  have_peer = can01 && can10;
  other = have_peer ? "1" : "0";
  for (int i = 0; i < 2; i++) {
    CUdevice d;
    CUuuid u;
    drv->cuDeviceGet(&d, have_peer ? i : 0);
    drv->cuDeviceGetUuid(&u, d);
    gshm__format_gpu_uuid((const unsigned char *)u.bytes, uuid[i]);
    snprintf(loc[i], sizeof(loc[i]), "cuda:%s", uuid[i]);
  }
  if (argc > 2 && !strcmp(argv[1], "--role")) {
    /* Who runs which role (the legacy step has seen two producers). */
    fprintf(stderr, "role %s: pid %d, parent %d, GSHM_SOCKET=%s\n", argv[2], (int)getpid(),
            (int)getppid(), getenv("GSHM_SOCKET") ? getenv("GSHM_SOCKET") : "(unset)");
    return run_child_role(argc - 2, argv + 2);
  }
  fprintf(stderr, "orchestrator: pid %d\n", (int)getpid());
  if (!have_peer)
    fprintf(stderr, "%s: %s: the consumers run on GPU 0, each in its own process; SKIPPED "
                    "(they need two GPUs with peer access): %s\n",
            restart ? "dev_restart" : "segments",
            count < 2 ? "one GPU" : "GPUs 0 and 1 have no peer access",
            restart ? "a segment on GPU 1, read from GPU 0, and GPU 0's read from GPU 1"
                    : "reads and writes over the peer link (GPU 1 <-> GPU 0), access added for "
                      "GPU 1 to a cached mapping, GPU 1's free-memory check, the legacy handle "
                      "opened on GPU 1");
  if (harness_start(&h, args)) {
    fprintf(stderr, "FAIL: gshmd --backend cuda did not start\n");
    return 1;
  }
  if (restart) {
    test_restart(&h);
  } else {
    test_main(&h);
    test_legacy(&h);
  }
  st = harness_stop(&h);
  CHECK(st == 0, "gshmd exit status %d", st);
  fprintf(stderr, "%s: %d failure(s)\n", restart ? "dev_restart" : "segments", failures);
  return failures ? 1 : 0;
}
