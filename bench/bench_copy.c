/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench copy: P2P bandwidth and latency, modelled on CUDA samples'
 * p2pBandwidthLatencyTest: the copy engine (cuMemcpyAsync with peer access
 * enabled, what cudaMemcpyPeerAsync does), libgshm's SM kernels (push: run
 * by the source GPU; pull: by the destination GPU) and gshm_copy AUTO, in
 * one run, on the same buffers.
 *
 * Method, for every cell: fresh non-zero data (a hash fill with a new seed)
 * in the source and zeros in the destination; the stream is held at a
 * cuStreamWaitValue64 gate while a batch of `n` copies is queued between two
 * CUDA events, so that host launch costs are not timed; the gate opens; the
 * events give the batch's time.  One warm-up batch, then the destination
 * is zeroed again and `--reps` timed batches run; the median batch time / n
 * is reported.  Afterwards every destination is compared with its source
 * on the GPU (any mismatch: the cell prints FAIL and the program exits 1):
 * what the timed batches wrote, not the warm-up's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "copy_internal.h"
#include "cudadrv.h"
#include "gshm.h"

#define MAX_GPUS 16
#define SLACK 4096

static const struct gshm_cudadrv *drv;
static int ngpus, reps = 11, failures;
static size_t batch_traffic = (size_t)256 << 20; /* bytes per timed batch */
static size_t max_bytes = (size_t)1 << 30;

struct gpu {
  CUcontext ctx;
  CUstream stream, release;
  CUdeviceptr a, b, gate; /* a: source buffer, b: destination buffer */
  uint64_t gate_value;
  CUevent ev[4];
  int sm_count;
  char name[64];
};
static struct gpu gpus[MAX_GPUS];

#define CK(call) BENCH_CU(drv, "copy", call)
#define CKE(call)                                                                         \
  do {                                                                                    \
    int e_ = (call);                                                                      \
    if (e_) {                                                                             \
      fprintf(stderr, "gshm-bench copy: %s failed: %s (%s:%d)\n", #call, gshm_strerror(e_), \
              __FILE__, __LINE__);                                                        \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static void use(int g) { CK(drv->cuCtxSetCurrent(gpus[g].ctx)); }

/* What one stream does in a batch. */
enum how { CE, SM, AUTO, SHAPE };
struct lane {
  int run_on;   /* GPU whose stream queues the copies */
  int src, dst; /* GPUs */
  size_t off_src, off_dst;
  enum how how;
  struct gshm__copy_shape shape; /* for SHAPE */
  int pdl;                       /* for SHAPE */
};

static void *addr(CUdeviceptr base, size_t off) { return (void *)(uintptr_t)(base + off); }

static void enqueue(const struct lane *l, size_t bytes, int n) {
  struct gpu *g = &gpus[l->run_on];
  void *d = addr(gpus[l->dst].b, l->off_dst);
  const void *s = addr(gpus[l->src].a, l->off_src);

  use(l->run_on);
  for (int i = 0; i < n; i++) {
    switch (l->how) {
    case CE:
      CKE(gshm_copy(d, s, bytes, GSHM_COPY_ENGINE, g->stream));
      break;
    case SM:
      CKE(gshm_copy(d, s, bytes, GSHM_COPY_SM, g->stream));
      break;
    case AUTO:
      CKE(gshm_copy(d, s, bytes, GSHM_COPY_AUTO, g->stream));
      break;
    case SHAPE:
      CKE(gshm__copy_launch(d, s, bytes, l->shape.kernel, l->shape.blocks, l->shape.threads,
                            l->pdl, g->stream));
      break;
    }
  }
}

/* One timed batch of n copies on each of nl lanes (lanes run concurrently,
 * each on its own GPU's stream); returns milliseconds from the gate's
 * opening until the last lane finished. */
static float batch(const struct lane *l, int nl, size_t bytes, int n) {
  struct gpu *g0 = &gpus[l[0].run_on];
  float ms = 0;

  use(l[0].run_on);
  g0->gate_value++;
  CK(drv->cuStreamWaitValue64(g0->stream, g0->gate, g0->gate_value, CU_STREAM_WAIT_VALUE_GEQ));
  CK(drv->cuEventRecord(g0->ev[0], g0->stream));
  for (int i = 1; i < nl; i++) {
    use(l[i].run_on);
    CK(drv->cuStreamWaitEvent(gpus[l[i].run_on].stream, g0->ev[0], 0));
  }
  for (int i = 0; i < nl; i++)
    enqueue(&l[i], bytes, n);
  for (int i = 1; i < nl; i++) {
    struct gpu *gi = &gpus[l[i].run_on];
    use(l[i].run_on);
    CK(drv->cuEventRecord(gi->ev[1], gi->stream));
    use(l[0].run_on);
    CK(drv->cuStreamWaitEvent(g0->stream, gi->ev[1], 0));
  }
  use(l[0].run_on);
  CK(drv->cuEventRecord(g0->ev[2], g0->stream));
  CK(drv->cuStreamWriteValue64(g0->release, g0->gate, g0->gate_value,
                               CU_STREAM_WRITE_VALUE_DEFAULT));
  CK(drv->cuEventSynchronize(g0->ev[2]));
  CK(drv->cuEventElapsedTime(&ms, g0->ev[0], g0->ev[2]));
  return ms;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Zeros every lane's destination (bytes and the slack past them). */
static void zero_dsts(const struct lane *l, int nl, size_t bytes) {
  for (int i = 0; i < nl; i++) {
    use(l[i].dst);
    CK(drv->cuMemsetD8Async(gpus[l[i].dst].b, 0, bytes + l[i].off_dst + 16, gpus[l[i].dst].stream));
    CK(drv->cuStreamSynchronize(gpus[l[i].dst].stream));
  }
}

/* Median seconds per copy of `bytes` on every lane at once; verifies. */
static double measure(const struct lane *l, int nl, size_t bytes, int *ok) {
  static uint32_t seed = 12345;
  float t[64];
  int n, r = reps; /* 1..64 (bench_copy_main) */

  /* copies per batch: about batch_traffic bytes, 1..100 copies (all are
   * queued behind the gate, so the queue must hold them) */
  n = (int)(batch_traffic / bytes);
  n = n < 1 ? 1 : n > 100 ? 100 : n;
  for (int i = 0; i < nl; i++) {
    use(l[i].src);
    CKE(gshm__copy_fill(addr(gpus[l[i].src].a, 0), (bytes + l[i].off_src + 3) / 4 * 4, ++seed,
                        gpus[l[i].src].stream));
    CK(drv->cuStreamSynchronize(gpus[l[i].src].stream));
  }
  zero_dsts(l, nl, bytes);
  batch(l, nl, bytes, n); /* warm-up */
  /* zeros again, so that the compare below proves the timed batches
   * wrote every byte (the warm-up's copies would pass it otherwise) */
  zero_dsts(l, nl, bytes);
  for (int i = 0; i < r; i++)
    t[i] = batch(l, nl, bytes, n);
  qsort(t, (size_t)r, sizeof(t[0]), cmp_float);
  *ok = 1;
  for (int i = 0; i < nl; i++) {
    uint64_t bad = 0;
    use(l[i].dst);
    CKE(gshm__copy_compare(addr(gpus[l[i].dst].b, l[i].off_dst), addr(gpus[l[i].src].a, l[i].off_src),
                           bytes, gpus[l[i].dst].stream, &bad));
    if (bad) {
      *ok = 0;
      failures++;
      fprintf(stderr, "gshm-bench copy: FAIL %zu B GPU%d->GPU%d: %" PRIu64 " bytes differ\n", bytes,
              l[i].src, l[i].dst, bad);
    }
  }
  /* the median: of an even count the mean of the two middle batches */
  return (r % 2 ? t[r / 2] : (t[r / 2 - 1] + t[r / 2]) / 2) / 1e3 / n;
}

static double gbps(size_t bytes, int lanes, double s) { return (double)bytes * lanes / s / 1e9; }

static const char *size_str(size_t b, char *buf) {
  if (b >= (1u << 30) && b % (1u << 30) == 0)
    sprintf(buf, "%zu GiB", b >> 30);
  else if (b >= (1u << 20) && b % (1u << 20) == 0)
    sprintf(buf, "%zu MiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    sprintf(buf, "%zu KiB", b >> 10);
  else
    sprintf(buf, "%zu B", b);
  return buf;
}

/* Unidirectional sweep s->d over sizes: CE, SM push, SM pull, AUTO. */
static void table_uni(int s, int d, size_t from, size_t to) {
  char sb[32];
  int peer = s != d;

  printf("\n### Unidirectional GPU%d -> GPU%d (GB/s; 1e9 bytes/s)\n\n", s, d);
  printf("| size | copy engine | SM push | SM pull | AUTO | AUTO picks | AUTO / best | verified |\n");
  printf("|---:|---:|---:|---:|---:|:---|---:|:---|\n");
  for (size_t b = from; b <= to; b *= 2) {
    struct lane l = {.run_on = s, .src = s, .dst = d};
    double ce, push, pull, aut, best;
    int ok1, ok2, ok3 = 1, ok4, all;

    l.how = CE;
    ce = gbps(b, 1, measure(&l, 1, b, &ok1));
    l.how = SM;
    push = gbps(b, 1, measure(&l, 1, b, &ok2));
    if (peer) {
      l.run_on = d;
      pull = gbps(b, 1, measure(&l, 1, b, &ok3));
      l.run_on = s;
    } else {
      pull = push;
    }
    l.how = AUTO;
    aut = gbps(b, 1, measure(&l, 1, b, &ok4));
    best = ce > push ? ce : push;
    all = ok1 && ok2 && ok3 && ok4;
    printf("| %s | %.1f | %.1f | %s%.1f | %.1f | %s | %.3f | %s |\n", size_str(b, sb), ce, push,
           peer ? "" : "=", pull, aut,
           gshm__copy_auto_method(b, peer ? GSHM__COPY_PUSH : GSHM__COPY_LOCAL) == GSHM_COPY_SM
               ? "SM"
               : "CE",
           aut / best,
           all ? "ok" : "FAIL");
    fflush(stdout);
  }
}

/* Bidirectional a<->b: both GPUs copy to each other at once. */
static void table_bidi(int a, int b, size_t from, size_t to) {
  char sb[32];

  printf("\n### Bidirectional GPU%d <-> GPU%d (GB/s, both directions summed)\n\n", a, b);
  printf("| size | copy engine | SM push | AUTO | AUTO / best | verified |\n");
  printf("|---:|---:|---:|---:|---:|:---|\n");
  for (size_t s = from; s <= to; s *= 2) {
    struct lane l[2] = {{.run_on = a, .src = a, .dst = b}, {.run_on = b, .src = b, .dst = a}};
    double r[3];
    int ok[3];
    for (int m = 0; m < 3; m++) {
      l[0].how = l[1].how = m == 0 ? CE : m == 1 ? SM : AUTO;
      r[m] = gbps(s, 2, measure(l, 2, s, &ok[m]));
    }
    printf("| %s | %.1f | %.1f | %.1f | %.3f | %s |\n", size_str(s, sb), r[0], r[1], r[2],
           r[2] / (r[0] > r[1] ? r[0] : r[1]), ok[0] && ok[1] && ok[2] ? "ok" : "FAIL");
    fflush(stdout);
  }
}

/* Latency: GPU time per copy of back-to-back small copies (as
 * p2pBandwidthLatencyTest's latency matrix), in microseconds. */
static void table_latency(int s, int d) {
  char sb[32];

  printf("\n### Latency GPU%d -> GPU%d (microseconds per copy, GPU-timed, back to back)\n\n", s, d);
  printf("| size | copy engine | SM push | SM pull | SM push, no PDL | AUTO | verified |\n");
  printf("|---:|---:|---:|---:|---:|---:|:---|\n");
  for (size_t b = 16; b <= 64 * 1024; b *= 4) {
    struct lane l = {.run_on = s, .src = s, .dst = d};
    double r[5];
    int ok[5];
    for (int m = 0; m < 5; m++) {
      l.how = m == 0 ? CE : m == 4 ? AUTO : m == 3 ? SHAPE : SM;
      l.run_on = m == 2 ? d : s;
      l.shape = gshm__copy_pick_shape(b, gpus[s].sm_count, 0);
      l.pdl = 0;
      r[m] = measure(&l, 1, b, &ok[m]) * 1e6;
    }
    printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", size_str(b, sb), r[0], r[1], r[2],
           r[3], r[4], ok[0] && ok[1] && ok[2] && ok[3] && ok[4] ? "ok" : "FAIL");
    fflush(stdout);
  }
}

/* Matrix for every ordered pair at one size (p2pBandwidthLatencyTest's
 * layout): one table per method. */
static void table_matrix(size_t bytes) {
  char sb[32];
  static const char *names[3] = {"copy engine", "SM push", "AUTO"};

  for (int m = 0; m < 3; m++) {
    printf("\n### Unidirectional matrix, %s, %s (GB/s; row: source, column: destination)\n\n",
           names[m], size_str(bytes, sb));
    printf("| src \\ dst |");
    for (int d = 0; d < ngpus; d++)
      printf(" GPU%d |", d);
    printf("\n|---|");
    for (int d = 0; d < ngpus; d++)
      printf("---:|");
    printf("\n");
    for (int s = 0; s < ngpus; s++) {
      printf("| GPU%d |", s);
      for (int d = 0; d < ngpus; d++) {
        struct lane l = {.run_on = s, .src = s, .dst = d, .how = m == 0 ? CE : m == 1 ? SM : AUTO};
        int ok;
        double r = gbps(bytes, 1, measure(&l, 1, bytes, &ok));
        printf(" %.1f%s |", r, ok ? "" : " FAIL");
      }
      printf("\n");
      fflush(stdout);
    }
  }
}

/* Launch-shape sweep for the SM kernels: picks SM_* in kernels/copy.c. */
static void table_sweep(int s, int d) {
  static const size_t sizes[] = {(size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20,
                                 (size_t)256 << 20};
  static const unsigned threads[] = {256, 512, 1024};
  static const unsigned blocks[] = {1, 4, 8, 16, 32, 66, 132, 264, 528};
  static const enum gshm__kernel kernels[] = {GSHM__K_COPY_U1, GSHM__K_COPY_U4, GSHM__K_COPY_U8};
  char sb[32];
  int saved_reps = reps;
  size_t saved_traffic = batch_traffic;

  reps = 3;
  batch_traffic = (size_t)64 << 20;
  printf("\n### SM kernel shape sweep GPU%d -> GPU%d (GB/s, median of 3)\n\n", s, d);
  printf("| size | dir | kernel | threads |");
  for (size_t i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++)
    printf(" %u blk |", blocks[i]);
  printf("\n|---|---|---|---:|");
  for (size_t i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++)
    printf("---:|");
  printf("\n");
  for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
    for (int pull = 0; pull < 2; pull++)
      for (size_t ki = 0; ki < 3; ki++)
        for (size_t ti = 0; ti < 3; ti++) {
          printf("| %s | %s | u%d | %u |", size_str(sizes[si], sb), pull ? "pull" : "push",
                 kernels[ki] == GSHM__K_COPY_U1 ? 1 : kernels[ki] == GSHM__K_COPY_U4 ? 4 : 8,
                 threads[ti]);
          for (size_t bi = 0; bi < sizeof(blocks) / sizeof(blocks[0]); bi++) {
            struct lane l = {.run_on = pull ? d : s, .src = s, .dst = d, .how = SHAPE};
            int ok;
            double r;
            l.shape.kernel = kernels[ki];
            l.shape.threads = threads[ti];
            l.shape.blocks = blocks[bi];
            l.pdl = 1;
            r = gbps(sizes[si], 1, measure(&l, 1, sizes[si], &ok));
            printf(" %.1f%s |", r, ok ? "" : "!");
          }
          printf("\n");
          fflush(stdout);
        }
  reps = saved_reps;
  batch_traffic = saved_traffic;
}

/* Misaligned copies: bandwidth with source/destination offsets. */
static void table_misaligned(int s, int d, size_t bytes) {
  static const size_t offs[][2] = {{0, 0}, {1, 1}, {0, 4}, {3, 0}, {1, 7}, {8, 0}};
  char sb[32];

  printf("\n### Misaligned GPU%d -> GPU%d, %s (GB/s; offsets in bytes)\n\n", s, d,
         size_str(bytes, sb));
  printf("| src off | dst off | copy engine | SM push | SM pull | AUTO | verified |\n");
  printf("|---:|---:|---:|---:|---:|---:|:---|\n");
  for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
    struct lane l = {.run_on = s, .src = s, .dst = d, .off_src = offs[i][0], .off_dst = offs[i][1]};
    double r[4];
    int ok[4];
    for (int m = 0; m < 4; m++) {
      l.how = m == 0 ? CE : m == 3 ? AUTO : SM;
      l.run_on = m == 2 ? d : s;
      r[m] = gbps(bytes, 1, measure(&l, 1, bytes, &ok[m]));
    }
    printf("| %zu | %zu | %.1f | %.1f | %.1f | %.1f | %s |\n", offs[i][0], offs[i][1], r[0], r[1],
           r[2], r[3], ok[0] && ok[1] && ok[2] && ok[3] ? "ok" : "FAIL");
    fflush(stdout);
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gshm-bench copy [--reps N] [--max BYTES] [--sweep] [--only TABLES]\n"
          "  --reps N      timed batches per cell, median reported (default 11, max 64)\n"
          "  --max BYTES   largest size (default 1073741824)\n"
          "  --sweep       also sweep the SM kernels' launch shapes\n"
          "  --only LIST   comma list of: uni,bidi,latency,matrix,local,misaligned\n");
}

int bench_copy_main(int argc, char **argv) {
  const char *only = "uni,bidi,latency,matrix,local,misaligned";
  static const struct option once[] = {{"reps", required_argument, NULL, 'r'},
                                       {"max", required_argument, NULL, 'm'},
                                       {"sweep", no_argument, NULL, 'w'},
                                       {"only", required_argument, NULL, 'o'},
                                       {NULL, 0, NULL, 0}};
  unsigned char seen[256] = {0};
  int sweep = 0, e, drv_version = 0;

  for (int i = 1; i < argc; i++) {
    bench_opt_once_arg("copy", once, argv[i], seen);
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = bench_int_arg("copy", "--reps", argv[++i], 1);
      if (reps > 64) { /* measure() holds 64; more ran 64 under a header saying more */
        fprintf(stderr, "gshm-bench copy: --reps takes 1 to 64\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--max") && i + 1 < argc)
      max_bytes = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--sweep"))
      sweep = 1;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (reps < 1 || max_bytes < 4096) {
    usage(stderr);
    return 2;
  }
  e = gshm__cudadrv_load(3, &drv);
  if (e) {
    fprintf(stderr, "gshm-bench copy: no CUDA driver: %s\n", gshm_strerror(e));
    return 1;
  }
  CK(drv->cuDeviceGetCount(&ngpus));
  if (ngpus < 1) {
    fprintf(stderr, "gshm-bench copy: no GPU\n");
    return 1;
  }
  if (ngpus > MAX_GPUS)
    ngpus = MAX_GPUS;
  if (!gshm__copy_have_kernels()) {
    fprintf(stderr, "gshm-bench copy: libgshm was built without the copy kernels\n");
    return 1;
  }
  drv->cuDriverGetVersion(&drv_version);
  for (int g = 0; g < ngpus; g++) {
    struct gpu *p = &gpus[g];
    CUdevice dev;
    CK(drv->cuDeviceGet(&dev, g));
    CK(drv->cuDevicePrimaryCtxRetain(&p->ctx, dev));
    use(g);
    CK(drv->cuDeviceGetName(p->name, sizeof(p->name), dev));
    CK(drv->cuDeviceGetAttribute(&p->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(drv->cuStreamCreate(&p->stream, CU_STREAM_NON_BLOCKING));
    CK(drv->cuStreamCreate(&p->release, CU_STREAM_NON_BLOCKING));
    CK(drv->cuMemAlloc(&p->a, max_bytes + SLACK));
    CK(drv->cuMemAlloc(&p->b, max_bytes + SLACK));
    CK(drv->cuMemAlloc(&p->gate, 8));
    CK(drv->cuMemsetD8(p->gate, 0, 8));
    for (int i = 0; i < 4; i++)
      CK(drv->cuEventCreate(&p->ev[i], CU_EVENT_DEFAULT));
  }
  for (int g = 0; g < ngpus; g++) {
    use(g);
    for (int h = 0; h < ngpus; h++)
      if (h != g && gshm__copy_enable_peer(h))
        fprintf(stderr, "gshm-bench copy: no peer access GPU%d -> GPU%d\n", g, h);
  }
  printf("## gshm-bench copy\n\n%d x %s (%d SMs), driver %d.%d; median of %d batches after a "
         "warm-up\n",
         ngpus, gpus[0].name, gpus[0].sm_count, drv_version / 1000, drv_version % 1000 / 10, reps);

  if (sweep && ngpus >= 2)
    table_sweep(0, 1);
  if (ngpus >= 2 && strstr(only, "uni"))
    table_uni(0, 1, 4096, max_bytes);
  if (ngpus >= 2 && strstr(only, "bidi"))
    table_bidi(0, 1, 4096, max_bytes);
  if (ngpus >= 2 && strstr(only, "latency"))
    table_latency(0, 1);
  if (strstr(only, "matrix")) {
    table_matrix((size_t)256 << 20 < max_bytes ? (size_t)256 << 20 : max_bytes);
    table_matrix(max_bytes);
  }
  if (strstr(only, "local"))
    table_uni(0, 0, 4096, max_bytes);
  if (ngpus >= 2 && strstr(only, "misaligned"))
    table_misaligned(0, 1, (size_t)64 << 20);
  if (failures) {
    fprintf(stderr, "gshm-bench copy: %d cells FAILED verification\n", failures);
    return 1;
  }
  return 0;
}
