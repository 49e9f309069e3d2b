/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench broadcast: one GPU's buffer to every other GPU, gshm_broadcast
 * (each algorithm) against NCCL's ncclBroadcast on the same GPUs, buffers
 * and sizes, in one run.
 *
 * NCCL is loaded with dlopen (libnccl.so.2; GSHM_NCCL names another file)
 * and run the way nccl-tests runs one process over several GPUs:
 * ncclCommInitAll over the GPUs, one ncclBroadcast per GPU inside
 * ncclGroupStart/End, in place at the root (the root's receive buffer is
 * its send buffer, so it moves no bytes of its own).  Without NCCL its rows
 * say so and the rest runs.
 *
 * Method, per cell: the source is refilled with fresh non-zero data (a hash
 * fill with a new seed) before every timed run; a CUDA event on the root's
 * stream opens the run, the other GPUs' streams wait for it, the broadcast
 * is queued, every stream's end joins the root's stream, and a second event
 * closes it.  Two timings: "queued live" starts the events before the host
 * queues the broadcast, so the host's queueing cost counts where the GPUs
 * would otherwise wait for it (what an application sees); "gated" holds
 * the root's stream at a cuStreamWaitValue64 gate until everything is
 * queued (the GPUs' time alone).  Two warm-up runs, then --reps timed ones;
 * medians reported.  After every timed run each destination is compared
 * with the source on the GPU; any mismatch prints FAIL and exits 1.
 * algbw = bytes / time, as nccl-tests defines it for broadcast. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "copy_internal.h"
#include "cudadrv.h"
#include "gshm.h"

#define MAX_GPUS 8
#define MAX_REPS 101

static const struct gshm_cudadrv *drv;
static int ngpus, reps = 11, failures;
static size_t max_bytes = (size_t)1 << 30;

struct gpu {
  CUcontext ctx;
  CUstream stream, release;
  CUdeviceptr buf, gate;
  uint64_t gate_value;
  CUevent ev[3]; /* 0 start, 1 end of this GPU's part, 2 stop */
};
static struct gpu gpus[MAX_GPUS];

#define CK(call) BENCH_CU(drv, "broadcast", call)

static void use(int g) { CK(drv->cuCtxSetCurrent(gpus[g].ctx)); }

/* ---- NCCL, through dlopen (nccl.h's declarations, as of NCCL 2.x) ---- */

typedef struct ncclComm *ncclComm_t;
#define NCCL_UINT8 1 /* ncclUint8 */
static struct {
  void *lib;
  int (*GetVersion)(int *);
  int (*CommInitAll)(ncclComm_t *, int, const int *);
  int (*CommDestroy)(ncclComm_t);
  int (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
  int (*GroupStart)(void);
  int (*GroupEnd)(void);
  const char *(*GetErrorString)(int);
  ncclComm_t comm[MAX_GPUS];
  int version;
} nccl;

static void nccl_load(void) {
  const char *path = getenv("GSHM_NCCL") ? getenv("GSHM_NCCL") : "libnccl.so.2";
  int dev[MAX_GPUS], r;

  if (!(nccl.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
    printf("NCCL: not loaded (%s); its rows are skipped\n", dlerror());
    return;
  }
#define SYM(f)                                                      \
  if (!(*(void **)&nccl.f = dlsym(nccl.lib, "nccl" #f))) {          \
    printf("NCCL: no nccl%s in %s; its rows are skipped\n", #f, path); \
    nccl.lib = NULL;                                                \
    return;                                                         \
  }
  SYM(GetVersion)
  SYM(CommInitAll)
  SYM(CommDestroy)
  SYM(Broadcast)
  SYM(GroupStart)
  SYM(GroupEnd)
  SYM(GetErrorString)
#undef SYM
  nccl.GetVersion(&nccl.version);
  for (int g = 0; g < ngpus; g++)
    dev[g] = g;
  if ((r = nccl.CommInitAll(nccl.comm, ngpus, dev))) {
    printf("NCCL: ncclCommInitAll failed: %s; its rows are skipped\n", nccl.GetErrorString(r));
    nccl.lib = NULL;
    return;
  }
  printf("NCCL: %s, version code %d (NCCL_NVLS_ENABLE=%s)\n", path, nccl.version,
         getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "unset");
}

/* ---- methods ---- */

struct method {
  const char *name;
  int nccl;
  gshm_broadcast_opts_t o;
};

static void queue(const struct method *m, size_t bytes) {
  void *dsts[MAX_GPUS];
  int e;

  if (m->nccl) {
    nccl.GroupStart();
    for (int g = 0; g < ngpus; g++) {
      void *p = (void *)(uintptr_t)gpus[g].buf;
      use(g);
      e = nccl.Broadcast(p, p, bytes, NCCL_UINT8, 0, nccl.comm[g], gpus[g].stream);
      if (e) {
        fprintf(stderr, "ncclBroadcast: %s\n", nccl.GetErrorString(e));
        exit(1);
      }
    }
    if ((e = nccl.GroupEnd())) {
      fprintf(stderr, "ncclGroupEnd: %s\n", nccl.GetErrorString(e));
      exit(1);
    }
    return;
  }
  for (int g = 1; g < ngpus; g++)
    dsts[g - 1] = (void *)(uintptr_t)gpus[g].buf;
  use(0);
  e = gshm_broadcast_ex((const void *)(uintptr_t)gpus[0].buf, dsts, ngpus - 1, bytes,
                        gpus[0].stream, &m->o);
  if (e) {
    fprintf(stderr, "gshm_broadcast %s: %s\n", m->name, gshm_strerror(e));
    exit(1);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One run; returns GPU milliseconds, and the host's queueing time in *host_us. */
static float run_once(const struct method *m, size_t bytes, int gated, double *host_us) {
  struct gpu *g0 = &gpus[0];
  float ms = 0;
  double t0;

  use(0);
  if (gated) {
    g0->gate_value++;
    CK(drv->cuStreamWaitValue64(g0->stream, g0->gate, g0->gate_value, CU_STREAM_WAIT_VALUE_GEQ));
  }
  CK(drv->cuEventRecord(g0->ev[0], g0->stream));
  t0 = now_s();
  if (m->nccl)
    for (int g = 1; g < ngpus; g++) {
      use(g);
      CK(drv->cuStreamWaitEvent(gpus[g].stream, g0->ev[0], 0));
    }
  queue(m, bytes);
  if (m->nccl)
    for (int g = 1; g < ngpus; g++) {
      use(g);
      CK(drv->cuEventRecord(gpus[g].ev[1], gpus[g].stream));
      use(0);
      CK(drv->cuStreamWaitEvent(g0->stream, gpus[g].ev[1], 0));
    }
  *host_us = (now_s() - t0) * 1e6;
  use(0);
  CK(drv->cuEventRecord(g0->ev[2], g0->stream));
  if (gated)
    CK(drv->cuStreamWriteValue64(g0->release, g0->gate, g0->gate_value,
                                 CU_STREAM_WRITE_VALUE_DEFAULT));
  CK(drv->cuEventSynchronize(g0->ev[2]));
  CK(drv->cuEventElapsedTime(&ms, g0->ev[0], g0->ev[2]));
  return ms;
}

struct result {
  double ms, gated_ms, host_us;
  int ok;
};

static struct result measure(const struct method *m, size_t bytes) {
  static uint32_t seed = 4242;
  double live[MAX_REPS], gated[MAX_REPS], host[MAX_REPS], h;
  struct result r = {0, 0, 0, 1};

  for (int i = -2; i < reps; i++) {
    /* fresh data; the compare below proves every byte arrived */
    use(0);
    if (gshm__copy_fill((void *)(uintptr_t)gpus[0].buf, bytes, ++seed, gpus[0].stream)) {
      fprintf(stderr, "fill failed\n");
      exit(1);
    }
    CK(drv->cuStreamSynchronize(gpus[0].stream));
    for (int gate = 0; gate < 2; gate++) {
      float ms = run_once(m, bytes, gate, &h);
      if (i >= 0) {
        (gate ? gated : live)[i] = ms;
        if (!gate)
          host[i] = h;
      }
      for (int g = 1; g < ngpus; g++) {
        uint64_t bad = 0;
        use(g);
        if (gshm__copy_compare((const void *)(uintptr_t)gpus[g].buf,
                               (const void *)(uintptr_t)gpus[0].buf, bytes, gpus[g].stream,
                               &bad) ||
            bad) {
          fprintf(stderr, "FAIL: %s, %zu B: GPU %d has %" PRIu64 " wrong bytes\n", m->name,
                  bytes, g, bad);
          r.ok = 0;
          failures++;
        }
      }
      /* the next run must not find the previous bytes already there */
      for (int g = 1; g < ngpus; g++) {
        use(g);
        CK(drv->cuMemsetD8Async(gpus[g].buf, 0, bytes, gpus[g].stream));
        CK(drv->cuStreamSynchronize(gpus[g].stream));
      }
    }
  }
  r.ms = bench_median(live, reps);
  r.gated_ms = bench_median(gated, reps);
  r.host_us = bench_median(host, reps);
  return r;
}

static const char *size_str(size_t b, char *buf) {
  if (b >= ((size_t)1 << 30) && b % ((size_t)1 << 30) == 0)
    sprintf(buf, "%zu GiB", b >> 30);
  else if (b >= ((size_t)1 << 20))
    sprintf(buf, "%zu MiB", b >> 20);
  else
    sprintf(buf, "%zu KiB", b >> 10);
  return buf;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gshm-bench broadcast [--reps N] [--max BYTES] [--gpus N] [--sweep]\n"
          "  GPU 0's buffer to GPUs 1..N-1: gshm_broadcast vs ncclBroadcast.\n"
          "  --reps N      timed runs per cell, median reported (default 11, max %d)\n"
          "  --max BYTES   largest size (default 1073741824)\n"
          "  --gpus N      use GPUs 0..N-1 (default: all, at most %d)\n"
          "  --sweep       also CHAIN and SPLIT x chunk (2-32 MiB) x push/pull\n"
          "  --sizes LIST  comma list of sizes in bytes (default 256 KiB..1 GiB, x4)\n"
          "  --methods L   comma list replacing the default methods: nccl, auto, star,\n"
          "                or ALGO:CHUNK_MIB[:pull][:lanesN] with ALGO chain|split\n",
          MAX_REPS, MAX_GPUS);
}

int bench_broadcast_main(int argc, char **argv) {
  static const size_t default_sizes[] = {(size_t)256 << 10, (size_t)1 << 20,  (size_t)4 << 20,
                                 (size_t)16 << 20,  (size_t)64 << 20, (size_t)256 << 20,
                                 (size_t)1 << 30};
  static const size_t chunks[] = {(size_t)2 << 20, (size_t)4 << 20, (size_t)8 << 20,
                                  (size_t)16 << 20, (size_t)32 << 20};
  struct method ms[64];
  size_t sizes[32];
  int nm = 0, nsizes = 0, count = 0, want = 0, sweep = 0;
  const char *methods = NULL;
  char sb[32];
  static const struct option once[] = {
      {"reps", required_argument, NULL, 'r'},    {"max", required_argument, NULL, 'm'},
      {"gpus", required_argument, NULL, 'g'},    {"sweep", no_argument, NULL, 'w'},
      {"methods", required_argument, NULL, 'M'}, {"sizes", required_argument, NULL, 's'},
      {NULL, 0, NULL, 0}};
  unsigned char seen[256] = {0};

  for (int i = 1; i < argc; i++) {
    bench_opt_once_arg("broadcast", once, argv[i], seen);
    if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = bench_int_arg("broadcast", "--reps", argv[++i], 1);
    else if (!strcmp(argv[i], "--max") && i + 1 < argc)
      max_bytes = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--gpus") && i + 1 < argc)
      want = bench_int_arg("broadcast", "--gpus", argv[++i], 1);
    else if (!strcmp(argv[i], "--sweep"))
      sweep = 1;
    else if (!strcmp(argv[i], "--methods") && i + 1 < argc)
      methods = argv[++i];
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      char *p = argv[++i], *end;
      while (*p && nsizes < 32) {
        sizes[nsizes++] = strtoull(p, &end, 0);
        if (end == p || (*end && *end != ',')) {
          usage(stderr);
          return 2;
        }
        p = *end ? end + 1 : end;
      }
    }
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (reps < 1 || reps > MAX_REPS || max_bytes < 4096) {
    usage(stderr);
    return 2;
  }
  if (gshm__cudadrv_load(GSHM_LOG_ERR, &drv) || drv->cuDeviceGetCount(&count) != CUDA_SUCCESS ||
      count < 2) {
    fprintf(stderr, "gshm-bench broadcast: needs a CUDA driver and 2 GPUs (have %d)\n", count);
    return 77;
  }
  ngpus = want > 1 && want < count ? want : count;
  if (ngpus > MAX_GPUS)
    ngpus = MAX_GPUS;
  for (int g = 0; g < ngpus; g++) {
    CUdevice d;
    char name[64];
    CK(drv->cuDeviceGet(&d, g));
    CK(drv->cuDevicePrimaryCtxRetain(&gpus[g].ctx, d));
    use(g);
    CK(drv->cuDeviceGetName(name, sizeof(name), d));
    CK(drv->cuStreamCreate(&gpus[g].stream, CU_STREAM_NON_BLOCKING));
    CK(drv->cuStreamCreate(&gpus[g].release, CU_STREAM_NON_BLOCKING));
    CK(drv->cuMemAlloc(&gpus[g].buf, max_bytes));
    CK(drv->cuMemAlloc(&gpus[g].gate, 8));
    CK(drv->cuMemsetD8(gpus[g].gate, 0, 8));
    for (int k = 0; k < 3; k++)
      CK(drv->cuEventCreate(&gpus[g].ev[k], CU_EVENT_DEFAULT));
    printf("GPU %d: %s\n", g, name);
  }
  /* peer access for the compare kernels (and NCCL's own, which it sets) */
  for (int g = 1; g < ngpus; g++) {
    use(g);
    if (gshm__copy_enable_peer(0)) {
      fprintf(stderr, "gshm-bench broadcast: GPU %d cannot reach GPU 0\n", g);
      return 1;
    }
  }
  nccl_load();

  if (!nsizes)
    for (size_t i = 0; i < sizeof(default_sizes) / sizeof(default_sizes[0]); i++)
      sizes[nsizes++] = default_sizes[i];
  if (methods) {
    static char names[64][64];
    char buf[512], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", methods);
    for (char *t = strtok_r(buf, ",", &save); t && nm < 64; t = strtok_r(NULL, ",", &save)) {
      struct method m = {names[nm], 0, {GSHM_BCAST_AUTO, 0, 0, 0}};
      char *colon = strchr(t, ':');
      snprintf(names[nm], sizeof(names[nm]), "%s", t);
      if (!strcmp(t, "nccl")) {
        if (!nccl.lib)
          continue;
        m.nccl = 1;
        m.name = "ncclBroadcast";
      } else if (!strcmp(t, "auto")) {
        m.name = "gshm AUTO";
      } else if (!strcmp(t, "star")) {
        m.o.algo = GSHM_BCAST_STAR;
      } else if (colon && (!strncmp(t, "chain:", 6) || !strncmp(t, "split:", 6))) {
        char *rest;
        m.o.algo = t[0] == 'c' ? GSHM_BCAST_CHAIN : GSHM_BCAST_SPLIT;
        m.o.chunk_bytes = strtoull(colon + 1, &rest, 0) << 20;
        m.o.pull = strstr(rest, ":pull") != NULL;
        if (strstr(rest, ":lanes"))
          m.o.lanes = atoi(strstr(rest, ":lanes") + 6);
      } else {
        fprintf(stderr, "gshm-bench broadcast: unknown method '%s'\n", t);
        return 2;
      }
      ms[nm++] = m;
    }
  } else {
    if (nccl.lib)
      ms[nm++] = (struct method){"ncclBroadcast", 1, {0, 0, 0, 0}};
    ms[nm++] = (struct method){"gshm AUTO", 0, {GSHM_BCAST_AUTO, 0, 0, 0}};
    ms[nm++] = (struct method){"STAR", 0, {GSHM_BCAST_STAR, 0, 0, 0}};
    ms[nm++] = (struct method){"CHAIN, AUTO's chunk", 0, {GSHM_BCAST_CHAIN, 0, 0, 0}};
    ms[nm++] = (struct method){"CHAIN 2 lanes", 0, {GSHM_BCAST_CHAIN, 0, 0, 2}};
    ms[nm++] = (struct method){"SPLIT 8 MiB", 0, {GSHM_BCAST_SPLIT, (size_t)8 << 20, 0, 0}};
  }
  if (sweep && !methods) {
    static char names[64][40];
    for (int a = GSHM_BCAST_CHAIN; a <= GSHM_BCAST_SPLIT; a++)
      for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++)
        for (int pull = 0; pull < 2; pull++) {
          if (a == GSHM_BCAST_SPLIT && chunks[c] == ((size_t)8 << 20) && !pull)
            continue; /* already in */
          snprintf(names[nm], sizeof(names[nm]), "%s %zu MiB%s",
                   a == GSHM_BCAST_CHAIN ? "CHAIN" : "SPLIT", chunks[c] >> 20,
                   pull ? " pull" : "");
          ms[nm] = (struct method){names[nm], 0, {(gshm_broadcast_algo_t)a, chunks[c], pull, 0}};
          nm++;
        }
  }

  printf("\n## Broadcast: GPU 0 -> GPUs 1..%d (%d destinations), medians of %d runs\n\n",
         ngpus - 1, ngpus - 1, reps);
  printf("algbw = bytes / time (GB/s = 1e9 B/s).  live: timed from before the host queues; "
         "gated: GPUs' time alone.  vs NCCL: live algbw / ncclBroadcast's live algbw.\n\n");
  printf("| size | method | live us | live algbw | gated us | gated algbw | host queue us | vs "
         "NCCL | check |\n");
  printf("|---:|:---|---:|---:|---:|---:|---:|---:|:---|\n");
  for (int si = 0; si < nsizes; si++) {
    size_t b = sizes[si];
    double nccl_bw = 0;
    if (b > max_bytes || b % 4)
      continue; /* the fill writes 32-bit words */
    for (int k = 0; k < nm; k++) {
      struct result r = measure(&ms[k], b);
      double bw = (double)b / (r.ms * 1e-3) / 1e9, gbw = (double)b / (r.gated_ms * 1e-3) / 1e9;
      char ratio[16] = "";
      if (ms[k].nccl)
        nccl_bw = bw;
      else if (nccl_bw > 0)
        snprintf(ratio, sizeof(ratio), "%.3f", bw / nccl_bw);
      printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s |\n", size_str(b, sb),
             ms[k].name, r.ms * 1e3, bw, r.gated_ms * 1e3, gbw, r.host_us, ratio,
             r.ok ? "ok" : "FAIL");
      fflush(stdout);
    }
  }
  if (nccl.lib)
    for (int g = 0; g < ngpus; g++)
      nccl.CommDestroy(nccl.comm[g]);
  return failures ? 1 : 0;
}
