/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench attach: what it costs to get at a shared device segment.
 *
 * For each size (default 2 MiB, 64 MiB, 4 GiB), medians over --runs runs,
 * each measurement after one untimed warm-up run of it:
 *   create      gshm_create of a device segment on --device (daemon
 *               cuMemCreate + zeroing + fd export + one round trip)
 *   rtt         a no-op daemon round trip (gshm_status)
 *   export      cuMemExportToShareableHandle alone, what gshmd pays per open
 *   open        gshm_open of a segment this process does not hold: the
 *               daemon round trip, with the fd export and SCM_RIGHTS
 *   map         gshm_map for --map-device: the driver's import, reserve,
 *               map and set-access, plus libgshm's checks and its mapping
 *               report to the daemon
 *   open+map    the two together: what a consumer waits for
 *   raw         the driver calls alone on an fd we already have:
 *               cuMemImportFromShareableHandle + cuMemAddressReserve +
 *               cuMemMap + cuMemSetAccess (the floor for open+map)
 *   cached      gshm_open + gshm_map of a segment this process already
 *               holds and maps (the lease cache: no round trip, no import)
 *   cuIpc       cuIpcOpenMemHandle of a legacy handle of the same size,
 *               exported by another process (the legacy path, for
 *               comparison)
 *
 * Then, per size, where a first open+map's time goes (second table): the
 * round trip and the open with and without libgshm's reply polling
 * (GSHM_POLL_US), and each driver call gshm_map makes, timed one by one on
 * the fd a fresh gshm_open received.
 *
 * It starts its own gshmd (--gshmd PATH or $GSHMD, with --backend cuda)
 * unless --socket names a running one. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "cudadrv.h"
#include "gshm.h"
#include "spawn.h"
#include "util.h"

#define MAX_SIZES 8

struct opts {
  const char *socket;
  const char *gshmd;
  int runs;
  int device, map_device;
  uint64_t sizes[MAX_SIZES];
  int nsizes;
};

static const struct gshm_cudadrv *drv;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define DIE(...)                                  \
  do {                                            \
    fprintf(stderr, "gshm-bench attach: ");       \
    fprintf(stderr, __VA_ARGS__);                 \
    fprintf(stderr, "\n");                        \
    exit(1);                                      \
  } while (0)

/* ---- a private gshmd ----
 * Started through common/spawn.c, which plays the service manager for as
 * long as gshmd runs (READY=1, and the fd store that every create and
 * unlink writes to).  A notify socket closed after READY=1 (as this bench
 * once did) makes every store send fail, and gshmd then retries what it
 * owes on each request: that work is not what an attach costs. */

static int daemon_start(struct gshm_spawn *sp, const char *gshmd) {
  static const char *const args[] = {"--backend", "cuda", "--legacy-ipc", "--log-level", "4",
                                     NULL};
  int e = gshm__spawn_init(sp);
  if (!e)
    e = gshm__spawn_start(sp, gshmd, args, false, 30000);
  if (e)
    DIE("gshmd (%s) did not become ready: %s", gshmd, strerror(-e));
  return 0;
}

/* ---- the legacy exporter: another process (a process cannot open its
 * own IPC handle) ---- */

static int ipc_exporter(uint64_t size, int dev) {
  CUcontext ctx;
  CUdevice d;
  CUdeviceptr p;
  CUipcMemHandle h;
  char c;

  if (gshm__cudadrv_load(GSHM_LOG_ERR, &drv) || drv->cuDeviceGet(&d, dev) ||
      drv->cuDevicePrimaryCtxRetain(&ctx, d) || drv->cuCtxSetCurrent(ctx) ||
      drv->cuMemAlloc(&p, size) || drv->cuIpcGetMemHandle(&h, p))
    return 1;
  for (int i = 0; i < 64; i++)
    printf("%02x", (unsigned char)h.reserved[i]);
  printf("\n");
  fflush(stdout);
  while (read(STDIN_FILENO, &c, 1) > 0) /* until the parent is done */
    ;
  drv->cuMemFree(p);
  return 0;
}

static double bench_cuipc(const struct opts *o, uint64_t size, CUcontext map_ctx) {
  int in[2], out[2];
  char hex[160] = {0}, sz[32], dev[16];
  double *t = calloc((size_t)o->runs, sizeof(double)), m;
  CUipcMemHandle h;
  size_t got = 0;
  ssize_t n;
  pid_t pid;

  if (pipe(in) || pipe(out))
    DIE("pipe");
  snprintf(sz, sizeof(sz), "%" PRIu64, size);
  snprintf(dev, sizeof(dev), "%d", o->device);
  fflush(NULL);
  if ((pid = fork()) == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[1]);
    close(out[0]);
    execl("/proc/self/exe", "gshm-bench", "attach", "--ipc-exporter", sz, dev, (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  while (got < 129 && (n = read(out[0], hex + got, sizeof(hex) - 1 - got)) > 0)
    got += (size_t)n;
  if (got < 128)
    DIE("legacy exporter failed");
  for (int i = 0; i < 64; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    h.reserved[i] = (char)v;
  }
  drv->cuCtxSetCurrent(map_ctx);
  for (int r = -1; r < o->runs; r++) { /* r -1: the warm-up, untimed */
    CUdeviceptr p;
    double t0 = now_us();
    if (GSHM_CU(drv, GSHM_LOG_ERR, cuIpcOpenMemHandle, &p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
      DIE("cuIpcOpenMemHandle failed");
    if (r >= 0)
      t[r] = now_us() - t0;
    drv->cuIpcCloseMemHandle(p);
  }
  close(in[1]); /* the exporter frees and exits */
  close(out[0]);
  waitpid(pid, NULL, 0);
  m = bench_median(t, o->runs);
  free(t);
  return m;
}

/* A no-op daemon round trip (gshm_status). */
static double bench_rtt(const struct opts *o, gshm_client_t *c) {
  double *t = calloc((size_t)o->runs, sizeof(double)), m;
  for (int r = -1; r < o->runs; r++) { /* r -1: the warm-up, untimed */
    gshm_status_info_t st;
    double t0 = now_us();
    if (gshm_status(c, &st))
      DIE("status failed");
    if (r >= 0)
      t[r] = now_us() - t0;
  }
  m = bench_median(t, o->runs);
  free(t);
  return m;
}

/* What gshmd's driver call per open costs: cuMemExportToShareableHandle of
 * an allocation of this size (our own, on the same GPU). */
static double bench_export(const struct opts *o, uint64_t size, uint64_t gran) {
  double *t = calloc((size_t)o->runs, sizeof(double)), m;
  CUmemAllocationProp prop;
  CUmemGenericAllocationHandle h;

  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = o->device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size = (size + gran - 1) / gran * gran;
  if (GSHM_CU(drv, GSHM_LOG_ERR, cuMemCreate, &h, size, &prop, 0))
    DIE("cuMemCreate failed");
  for (int r = -1; r < o->runs; r++) { /* r -1: the warm-up, untimed */
    int fd = -1;
    double t0 = now_us();
    if (GSHM_CU(drv, GSHM_LOG_ERR, cuMemExportToShareableHandle, &fd, h,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
      DIE("export failed");
    if (r >= 0)
      t[r] = now_us() - t0;
    close(fd);
  }
  drv->cuMemRelease(h);
  m = bench_median(t, o->runs);
  free(t);
  return m;
}

/* The driver calls of a first map, alone, on an fd this process has not
 * imported (every run imports it afresh and releases it). */
static double bench_raw(const struct opts *o, int fd, uint64_t size, uint64_t gran,
                        CUdevice map_dev, CUcontext map_ctx) {
  double *t = calloc((size_t)o->runs, sizeof(double)), m;

  drv->cuCtxSetCurrent(map_ctx);
  for (int r = -1; r < o->runs; r++) { /* r -1: the warm-up, untimed */
    CUmemGenericAllocationHandle h;
    CUmemAccessDesc acc;
    CUdeviceptr va;
    double t0 = now_us();
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = map_dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (GSHM_CU(drv, GSHM_LOG_ERR, cuMemImportFromShareableHandle, &h, (void *)(uintptr_t)fd,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
        GSHM_CU(drv, GSHM_LOG_ERR, cuMemAddressReserve, &va, size, gran, 0, 0) ||
        GSHM_CU(drv, GSHM_LOG_ERR, cuMemMap, va, size, 0, h, 0) ||
        GSHM_CU(drv, GSHM_LOG_ERR, cuMemSetAccess, va, size, &acc, 1))
      DIE("raw driver import/map failed");
    if (r >= 0)
      t[r] = now_us() - t0;
    drv->cuMemUnmap(va, size);
    drv->cuMemAddressFree(va, size);
    drv->cuMemRelease(h);
  }
  m = bench_median(t, o->runs);
  free(t);
  return m;
}

#define STEPS 8
static const char *const step_names[STEPS] = {"retain", "push", "import", "props",
                                              "reserve", "map", "access", "pop"};

/* Times, one call at a time, what gshm_map does on the fd of a fresh
 * gshm_open (a lease this process does not hold yet): medians into
 * step_us[], and the whole of it into *total_us. */
static void bench_steps(const struct opts *o, gshm_client_t *c, const char *name,
                        CUdevice map_dev, double step_us[STEPS], double *total_us) {
  double *t[STEPS + 1];
  for (int k = 0; k <= STEPS; k++)
    t[k] = calloc((size_t)o->runs, sizeof(double));
  for (int r = -1; r < o->runs; r++) { /* r -1: the warm-up, untimed */
    gshm_segment_t *seg;
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    CUcontext ctx, popped;
    CUdeviceptr va;
    uint64_t size, gran;
    double ts[STEPS + 1];
    int e;

    if ((e = gshm_open(c, name, GSHM_ACCESS_READ_WRITE, &seg)))
      DIE("open: %s", gshm_strerror(e));
    size = gshm_segment_info(seg)->size;
    gran = gshm_segment_info(seg)->granularity;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = map_dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    memset(&prop, 0, sizeof(prop));
    ts[0] = now_us();
    BENCH_CU(drv, "attach", drv->cuDevicePrimaryCtxRetain(&ctx, map_dev));
    ts[1] = now_us();
    BENCH_CU(drv, "attach", drv->cuCtxPushCurrent(ctx));
    ts[2] = now_us();
    BENCH_CU(drv, "attach", drv->cuMemImportFromShareableHandle(
                                &h, (void *)(uintptr_t)gshm_segment_fd(seg),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ts[3] = now_us();
    BENCH_CU(drv, "attach", drv->cuMemGetAllocationPropertiesFromHandle(&prop, h));
    ts[4] = now_us();
    BENCH_CU(drv, "attach", drv->cuMemAddressReserve(&va, size, gran, 0, 0));
    ts[5] = now_us();
    BENCH_CU(drv, "attach", drv->cuMemMap(va, size, 0, h, 0));
    ts[6] = now_us();
    BENCH_CU(drv, "attach", drv->cuMemSetAccess(va, size, &acc, 1));
    ts[7] = now_us();
    BENCH_CU(drv, "attach", drv->cuCtxPopCurrent(&popped));
    ts[8] = now_us();
    for (int k = 0; r >= 0 && k < STEPS; k++)
      t[k][r] = ts[k + 1] - ts[k];
    if (r >= 0)
      t[STEPS][r] = ts[STEPS] - ts[0];
    drv->cuMemUnmap(va, size);
    drv->cuMemAddressFree(va, size);
    drv->cuMemRelease(h);
    drv->cuDevicePrimaryCtxRelease(map_dev);
    gshm_close(seg);
  }
  for (int k = 0; k < STEPS; k++)
    step_us[k] = bench_median(t[k], o->runs);
  *total_us = bench_median(t[STEPS], o->runs);
  for (int k = 0; k <= STEPS; k++)
    free(t[k]);
}

/* Median gshm_open of a segment not held (then closed), on client c. */
static double bench_open(const struct opts *o, gshm_client_t *c, const char *name) {
  double *t = calloc((size_t)o->runs, sizeof(double)), m;
  for (int r = -1; r < o->runs; r++) { /* r -1: the warm-up, untimed */
    gshm_segment_t *seg;
    double t0 = now_us();
    int e = gshm_open(c, name, GSHM_ACCESS_READ_WRITE, &seg);
    if (e)
      DIE("open: %s", gshm_strerror(e));
    if (r >= 0)
      t[r] = now_us() - t0;
    gshm_close(seg);
  }
  m = bench_median(t, o->runs);
  free(t);
  return m;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gshm-bench attach [--socket PATH | --gshmd PATH] [--runs N] [--device N]\n"
          "                         [--map-device N] [--size BYTES]...\n"
          "  --socket PATH     use a running gshmd (it must have the cuda backend; legacy\n"
          "                    IPC is measured with a process of our own)\n"
          "  --gshmd PATH      start this gshmd (default $GSHMD, else gshmd on PATH)\n"
          "  --runs N          runs per measurement after a warm-up one, median reported\n"
          "                    (default 20)\n"
          "  --device N        GPU the segments live on (default 0)\n"
          "  --map-device N    GPU the consumer maps on (default 1 when there are two)\n"
          "  --size BYTES      a size (K/M/G suffixes); repeat; default 2M 64M 4G\n");
}

int bench_attach_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'}, {"gshmd", required_argument, NULL, 'g'},
      {"runs", required_argument, NULL, 'r'},   {"device", required_argument, NULL, 'd'},
      {"map-device", required_argument, NULL, 'm'}, {"size", required_argument, NULL, 'z'},
      {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
  struct opts o = {.runs = 20, .device = 0, .map_device = -1};
  static struct gshm_spawn d; /* (4096 stored fds: not on the stack) */
  gshm_client_t *c = NULL, *c0 = NULL;
  double steps[MAX_SIZES][STEPS], steps_total[MAX_SIZES], poll_open[MAX_SIZES][2];
  double poll_rtt[MAX_SIZES][2];
  int poll_default_us;
  CUdevice map_dev;
  CUcontext map_ctx;
  char loc[64], ustr[48], sbuf[32];
  int count = 0, opt, e;
  unsigned char seen[256] = {0};

  if (argc == 4 && !strcmp(argv[1], "--ipc-exporter"))
    return ipc_exporter(strtoull(argv[2], NULL, 0), atoi(argv[3]));
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    if (opt != 'z') /* --size repeats */
      bench_opt_once("attach", longopts, opt, seen);
    switch (opt) {
    case 's': o.socket = optarg; break;
    case 'g': o.gshmd = optarg; break;
    case 'r': o.runs = bench_int_arg("attach", "--runs", optarg, 1); break;
    case 'd': o.device = bench_int_arg("attach", "--device", optarg, 0); break;
    case 'm': o.map_device = bench_int_arg("attach", "--map-device", optarg, 0); break;
    case 'z':
      if (o.nsizes == MAX_SIZES || gshm__parse_size(optarg, &o.sizes[o.nsizes]) ||
          !o.sizes[o.nsizes])
        DIE("bad --size %s", optarg);
      o.nsizes++;
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (o.runs < 1)
    DIE("--runs must be at least 1");
  if (!o.nsizes) {
    o.sizes[0] = 2ull << 20;
    o.sizes[1] = 64ull << 20;
    o.sizes[2] = 4ull << 30;
    o.nsizes = 3;
  }
  if ((e = gshm__cudadrv_load(GSHM_LOG_ERR, &drv)) || drv->cuDeviceGetCount(&count) || !count) {
    fprintf(stderr, "gshm-bench attach: no CUDA driver or GPU here\n");
    return 77;
  }
  if (o.map_device < 0)
    o.map_device = count > 1 ? 1 : 0;
  if (o.device >= count || o.map_device >= count)
    DIE("only %d GPU(s)", count);
  {
    CUdevice dev;
    CUuuid u;
    drv->cuDeviceGet(&dev, o.device);
    drv->cuDeviceGetUuid(&u, dev);
    gshm__format_gpu_uuid((const unsigned char *)u.bytes, ustr);
    snprintf(loc, sizeof(loc), "cuda:%s", ustr);
  }
  drv->cuDeviceGet(&map_dev, o.map_device);
  drv->cuDevicePrimaryCtxRetain(&map_ctx, map_dev);
  drv->cuCtxSetCurrent(map_ctx);

  if (!o.socket) {
    const char *g = o.gshmd ? o.gshmd : getenv("GSHMD");
    daemon_start(&d, g && *g ? g : gshm__find_gshmd());
    o.socket = d.socket_path;
  }
  if ((e = gshm_connect(o.socket, "gshm-bench-attach", &c)))
    DIE("connect %s: %s", o.socket, gshm_strerror(e));
  {
    /* a second client that never polls for replies (for the breakdown) */
    const char *env = getenv("GSHM_POLL_US");
    char *saved = env ? strdup(env) : NULL;
    setenv("GSHM_POLL_US", "0", 1);
    if ((e = gshm_connect(o.socket, "gshm-bench-attach-nopoll", &c0)))
      DIE("connect %s: %s", o.socket, gshm_strerror(e));
    if (saved)
      setenv("GSHM_POLL_US", saved, 1);
    else
      unsetenv("GSHM_POLL_US");
    free(saved);
    poll_default_us = env && *env ? atoi(env) : sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 30 : 0;
  }

  printf("gshm-bench attach: segments on GPU %d (%s), mapped on GPU %d, median of %d runs "
         "after a warm-up run, microseconds\n",
         o.device, ustr, o.map_device, o.runs);
  printf("%-8s %9s %9s %9s %9s %9s %9s %9s %7s %9s %9s\n", "size", "create", "rtt", "export",
         "open", "map", "open+map", "raw", "ratio", "cached", "cuIpc");
  for (int s = 0; s < o.nsizes; s++) {
    uint64_t size = o.sizes[s];
    double *tc = calloc((size_t)o.runs, sizeof(double));
    double *to = calloc((size_t)o.runs, sizeof(double));
    double *tm = calloc((size_t)o.runs, sizeof(double));
    double *tom = calloc((size_t)o.runs, sizeof(double));
    double *tk = calloc((size_t)o.runs, sizeof(double));
    double raw, ipc, rtt, exp_us;
    uint64_t seg_size, gran;
    int fd;
    gshm_segment_t *held = NULL;
    void *addr;
    char name[64];

    snprintf(name, sizeof(name), "bench/attach-%d", s);
    /* create */
    for (int r = -1; r < o.runs; r++) { /* r -1: the warm-up, untimed */
      gshm_segment_t *seg;
      double t0 = now_us();
      if ((e = gshm_create(c, name, size, loc, 0600, 0, &seg)))
        DIE("create %s: %s (%s)", name, gshm_strerror(e), gshm_last_error(c));
      if (r >= 0)
        tc[r] = now_us() - t0;
      gshm_close(seg);
      if (r + 1 < o.runs)
        gshm_unlink(c, name);
    }
    /* first open + map (the segment is held by the daemon only) */
    for (int r = -1; r < o.runs; r++) { /* r -1: the warm-up, untimed */
      gshm_segment_t *seg;
      double t0 = now_us(), t1, t2;
      if ((e = gshm_open(c, name, GSHM_ACCESS_READ_WRITE, &seg)))
        DIE("open: %s", gshm_strerror(e));
      t1 = now_us();
      if ((e = gshm_map(seg, &o.map_device, 1, &addr)))
        DIE("map: %s", gshm_strerror(e));
      t2 = now_us();
      if (r >= 0) {
        to[r] = t1 - t0;
        tm[r] = t2 - t1;
        tom[r] = t2 - t0;
      }
      gshm_close(seg);
    }
    /* cached re-open of a held, mapped segment */
    if ((e = gshm_open(c, name, GSHM_ACCESS_READ_WRITE, &held)) ||
        (e = gshm_map(held, &o.map_device, 1, &addr)))
      DIE("open/map: %s", gshm_strerror(e));
    for (int r = -1; r < o.runs; r++) { /* r -1: the warm-up, untimed */
      gshm_segment_t *seg;
      void *a2;
      double t0 = now_us();
      if ((e = gshm_open(c, name, GSHM_ACCESS_READ_WRITE, &seg)) ||
          (e = gshm_map(seg, &o.map_device, 1, &a2)))
        DIE("cached open/map: %s", gshm_strerror(e));
      if (r >= 0)
        tk[r] = now_us() - t0;
      if (a2 != addr)
        DIE("the cache did not serve the re-open");
      gshm_close(seg);
    }
    /* Where the time goes: polling or not, and gshm_map's calls one by
     * one on a freshly received fd (the held lease is closed first, so
     * that every open is a first one). */
    gshm_close(held);
    bench_steps(&o, c, name, map_dev, steps[s], &steps_total[s]);
    poll_open[s][0] = bench_open(&o, c0, name);
    poll_open[s][1] = bench_open(&o, c, name);
    poll_rtt[s][0] = bench_rtt(&o, c0);
    poll_rtt[s][1] = bench_rtt(&o, c);
    if ((e = gshm_open(c, name, GSHM_ACCESS_READ_WRITE, &held)))
      DIE("open: %s", gshm_strerror(e));
    /* The raw driver calls on a copy of the fd, after our own mapping is
     * gone: the driver short-cuts an import of memory already imported. */
    seg_size = gshm_segment_info(held)->size;
    gran = gshm_segment_info(held)->granularity;
    fd = dup(gshm_segment_fd(held));
    gshm_close(held);
    gshm_unlink(c, name);
    if (fd < 0)
      DIE("dup");
    raw = bench_raw(&o, fd, seg_size, gran, map_dev, map_ctx);
    close(fd);
    rtt = bench_rtt(&o, c);
    exp_us = bench_export(&o, size, gran);
    ipc = bench_cuipc(&o, size, map_ctx);
    {
      double mc = bench_median(tc, o.runs), mo = bench_median(to, o.runs), mm = bench_median(tm, o.runs);
      double mom = bench_median(tom, o.runs), mk = bench_median(tk, o.runs);
      printf("%-8s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7.2f %9.2f %9.1f\n",
             gshm__format_size(size, sbuf, sizeof(sbuf)), mc, rtt, exp_us, mo, mm, mom, raw,
             mom / raw, mk, ipc);
      fflush(stdout);
    }
    free(tc);
    free(to);
    free(tm);
    free(tom);
    free(tk);
  }
  printf("rtt = a no-op request (gshm_status); export = cuMemExportToShareableHandle alone;\n"
         "open = gshm_open (round trip + gshmd's lent fd + SCM_RIGHTS); map = gshm_map (import,\n"
         "reserve, map, set access, checks, and the mapping report, sent without a reply);\n"
         "raw = cuMemImportFromShareableHandle + cuMemAddressReserve + cuMemMap + cuMemSetAccess;\n"
         "ratio = open+map / raw\n");
  printf("\nwhere a first open+map goes, medians in microseconds: rtt and open without reply\n"
         "polling (GSHM_POLL_US=0) and with this process's default (%d us); gshm_map's driver\n"
         "calls one by one on the fd of a fresh open\n",
         poll_default_us);
  printf("%-8s %8s %8s %8s %8s", "size", "rtt/0", "rtt/poll", "open/0", "open/pol");
  for (int k = 0; k < STEPS; k++)
    printf(" %8s", step_names[k]);
  printf(" %8s\n", "calls");
  for (int s = 0; s < o.nsizes; s++) {
    printf("%-8s %8.1f %8.1f %8.1f %8.1f", gshm__format_size(o.sizes[s], sbuf, sizeof(sbuf)),
           poll_rtt[s][0], poll_rtt[s][1], poll_open[s][0], poll_open[s][1]);
    for (int k = 0; k < STEPS; k++)
      printf(" %8.1f", steps[s][k]);
    printf(" %8.1f\n", steps_total[s]);
  }
  gshm_disconnect(c0);
  gshm_disconnect(c);
  if (d.pid)
    gshm__spawn_cleanup(&d); /* SIGTERM, reap, close the store */
  return 0;
}
