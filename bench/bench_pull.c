/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench pull: pulling a segment from a peer gshmd (docs/CLUSTER.md)
 * against the best anchors on the same transport, in the same run, on
 * the same sizes: K plain TCP connections (K = --streams, the data lanes
 * the pull uses; a sender and a receiver thread each) moving the same
 * bytes into new memory (a memfd's, as a pull must) and into memory
 * written before, taking turns with the pull, and UCX's own ucx_perftest
 * tag_bw and ucp_am_bw over the same UCX_TLS (tcp unless set).
 *
 * It starts two gshmd (A exports, B pulls) with cluster ports on
 * 127.0.0.1 (--encrypt sets cluster.encrypt on both, --streams
 * cluster.streams).  For each size a segment at --location (host, or
 * cuda:N: the staging path without a CUDA-aware UCX) is created on A and
 * written with pseudo-random bytes (gshm_write); B pulls it (into --to,
 * default the same location) --iters times after one warm-up pull; the
 * median wall time of gshm_pull (request to result, control round trips
 * included) gives the rate.  After each pull, untimed, the copy is read
 * back (gshm_read) and compared with the source's bytes: a short or wrong
 * copy prints FAIL and ends the run (exit 1).  tag_bw and ucp_am_bw are
 * the medians of as many ucx_perftest runs as timed pulls; an anchor that
 * fails prints "fail" and the run exits 1.  A 4 KiB pull's median time is
 * compared with ucx_perftest's 4 KiB ucp_get latency.  ucx_perftest is
 * not run for 4 GiB and more (its results there are garbage).
 *
 * ucx_perftest: --perftest PATH, else $GSHM_UCX_PERFTEST, else
 * ucx_perftest next to the carried UCX (../ucx-lib of gshmd, for a
 * GSHM_STATIC_DEPS build), else the one on PATH. */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bench_pull.h"
#include "bench_tcp.h"
#include "cudadrv.h"
#include "gshm.h"
#include "spawn.h"
#include "util.h"


/* (below the kernel's ephemeral range: gshm__spawn_free_port says why) */
int bench_free_port(void) {
  int port = gshm__spawn_free_port();
  return port > 0 ? port : 0;
}

double bench_now_s(void) { return (double)gshm__now_ns(CLOCK_MONOTONIC) / 1e9; }

static int parse_sizes(const char *s, struct pull_opts *o) {
  char *copy = strdup(s), *save = NULL;
  o->nsizes = 0;
  for (char *t = strtok_r(copy, ",", &save); t && o->nsizes < 32; t = strtok_r(NULL, ",", &save)) {
    char *end;
    uint64_t v = strtoull(t, &end, 10);
    switch (*end) {
    case 'K': case 'k': v <<= 10; break;
    case 'M': case 'm': v <<= 20; break;
    case 'G': case 'g': v <<= 30; break;
    case '\0': break;
    default:
      free(copy);
      return -1;
    }
    o->sizes[o->nsizes++] = v;
  }
  free(copy);
  return o->nsizes ? 0 : -1;
}

/* Finds ucx_perftest; *ldpath_out gets the carried UCX directory (for
 * LD_LIBRARY_PATH) when it is that one. */
static const char *find_perftest(const struct pull_opts *o, const char *gshmd, char *buf, size_t cap,
                                 char *ldpath, size_t ldcap) {
  const char *env = getenv("GSHM_UCX_PERFTEST");
  const char *slash;

  ldpath[0] = '\0';
  if (o->perftest)
    return o->perftest;
  if (env && *env)
    return env;
  if (gshmd && (slash = strrchr(gshmd, '/'))) {
    snprintf(ldpath, ldcap, "%.*s/../ucx-lib", (int)(slash - gshmd), gshmd);
    snprintf(buf, cap, "%s/ucx_perftest", ldpath);
    if (access(buf, X_OK) == 0)
      return buf;
    ldpath[0] = '\0';
  }
  return "ucx_perftest";
}

/* Runs ucx_perftest -t test (ucp_get, tag_bw, ucp_am_bw) once for size
 * bytes: a server process and a client on 127.0.0.1.  *mbs_out: overall
 * bandwidth of the run, MB/s (2^20); *lat_us_out: its median latency, us.
 * Returns 0, or -1 (no result line, or the client did not exit 0). */
static int perftest_once(const char *bin, const char *ldpath, const char *test, uint64_t size,
                         int iters, double *mbs_out, double *lat_us_out) {
  char ssize[32], siters[16], swarm[16], sport[16], line[512];
  int port = bench_free_port(), pipefd[2], status;
  pid_t srv, cli;
  FILE *f;
  double best_mbs = -1, lat = -1;

  snprintf(ssize, sizeof(ssize), "%" PRIu64, size);
  snprintf(siters, sizeof(siters), "%d", iters);
  snprintf(swarm, sizeof(swarm), "%d", iters / 5 + 1);
  snprintf(sport, sizeof(sport), "%d", port);
  if (ldpath[0])
    setenv("LD_LIBRARY_PATH", ldpath, 1);
  if ((srv = fork()) == 0) {
    int dn = open("/dev/null", O_WRONLY);
    dup2(dn, 1);
    dup2(dn, 2);
    execlp(bin, bin, "-t", test, "-s", ssize, "-n", siters, "-w", swarm, "-p", sport, "-f",
           "-v", (char *)NULL);
    _exit(127);
  }
  usleep(300000); /* the server's listening socket: ucx_perftest has no readiness signal */
  if (pipe(pipefd) < 0) {
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return -1;
  }
  if ((cli = fork()) == 0) {
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    execlp(bin, bin, "127.0.0.1", "-t", test, "-s", ssize, "-n", siters, "-w", swarm, "-p",
           sport, "-f", "-v", (char *)NULL);
    _exit(127);
  }
  close(pipefd[1]);
  f = fdopen(pipefd[0], "r");
  while (f && fgets(line, sizeof(line), f)) {
    double it, p50, avg, overall, avg_bw, overall_bw;
    if (sscanf(line, "%lf,%lf,%lf,%lf,%lf,%lf", &it, &p50, &avg, &overall, &avg_bw,
               &overall_bw) == 6) {
      best_mbs = overall_bw;
      lat = p50;
    }
  }
  if (f)
    fclose(f);
  if (cli < 0 || waitpid(cli, &status, 0) < 0)
    status = -1;
  if (best_mbs < 0 || status) { /* why, for the failure the caller reports */
    fprintf(stderr, "gshm-bench pull: %s -t %s -s %s: %s", bin, test, ssize,
            best_mbs < 0 ? "no result line" : "a result line");
    if (status == -1)
      fprintf(stderr, ", no client\n");
    else if (WIFSIGNALED(status))
      fprintf(stderr, ", client killed by signal %d\n", WTERMSIG(status));
    else
      fprintf(stderr, ", client exit %d\n", WEXITSTATUS(status));
    best_mbs = -1;
  }
  kill(srv, SIGTERM);
  waitpid(srv, NULL, 0);
  if (ldpath[0])
    unsetenv("LD_LIBRARY_PATH");
  if (best_mbs < 0)
    return -1;
  *mbs_out = best_mbs;
  *lat_us_out = lat;
  return 0;
}

/* perftest_once `runs` times (1..64): *mbs_out and *lat_us_out get the
 * medians of the runs' figures, as the pull's are medians of its
 * iterations (one run's figure is a mean over its messages).  Returns 0,
 * or -1 when any run failed. */
static int perftest(const char *bin, const char *ldpath, const char *test, uint64_t size,
                    int iters, int runs, double *mbs_out, double *lat_us_out) {
  double mbs[64], lat[64];

  runs = runs < 1 ? 1 : runs > 64 ? 64 : runs;
  for (int i = 0; i < runs; i++)
    if (perftest_once(bin, ldpath, test, size, iters, &mbs[i], &lat[i]))
      return -1;
  *mbs_out = bench_median(mbs, runs);
  *lat_us_out = bench_median(lat, runs);
  return 0;
}

/* An anchor's GB/s for the table, 8 wide: "-" not run (v -2), "fail"
 * (v -1), else the figure. */
static const char *anchor_str(double v, char buf[16]) {
  if (v == -2)
    return "-";
  if (v < 0)
    return "fail";
  snprintf(buf, 16, "%.2f", v);
  return buf;
}

/* Node k (the k-th started by this process) and every thread it has
 * (its later threads inherit the mask) on CPUs [k*n, (k+1)*n) modulo the
 * machine's: nodes that share no core, as machines would. */
static void pin_node(pid_t pid, const char *name, unsigned n) {
  static unsigned started;
  cpu_set_t set;
  unsigned first = bench_node_cpus(started++, n, &set);
  char path[64];
  DIR *d;
  struct dirent *de;

  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  if (!(d = opendir(path)))
    return;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.' && sched_setaffinity(atoi(de->d_name), sizeof(set), &set))
      fprintf(stderr, "gshm-bench pull: cannot pin gshmd %s: %s\n", name, strerror(errno));
  closedir(d);
  printf("gshm-bench pull: gshmd %s on CPUs %u-%u\n", name, first, first + n - 1);
}

int bench_pull_node_start(struct gshm_spawn *sp, const char *gshmd, const char *name, int port,
                          const char *peers, const char *key, const char *exports,
                          const struct pull_opts *o) {
  char a[18][320];
  const char *args[20];
  struct group *g = getgrgid(getegid());
  int n = 0, e;

  snprintf(a[n++], 320, "--set=cluster.listen=127.0.0.1:%d", port);
  snprintf(a[n++], 320, "--set=cluster.node_name=%s", name);
  snprintf(a[n++], 320, "--set=cluster.peers=%s", peers);
  snprintf(a[n++], 320, "--set=cluster.secret_file=%s", key);
  snprintf(a[n++], 320, "--set=cluster.export=%s", exports);
  snprintf(a[n++], 320, "--set=cluster.pull_group=%s", g ? g->gr_name : "root");
  snprintf(a[n++], 320, "--set=daemon.log_level=4");
  snprintf(a[n++], 320, "--set=daemon.backend=%s",
           strncmp(o->location, "cuda", 4) && strncmp(o->to, "cuda", 4) ? "host" : "cuda");
  if (o->chunk)
    snprintf(a[n++], 320, "--set=cluster.pull_chunk=%s", o->chunk);
  if (o->depth)
    snprintf(a[n++], 320, "--set=cluster.pull_depth=%s", o->depth);
  snprintf(a[n++], 320, "--set=cluster.streams=%u", o->streams);
  if (o->encrypt)
    snprintf(a[n++], 320, "--set=cluster.encrypt=true");
  for (unsigned i = 0; i < o->nsets; i++)
    snprintf(a[n++], 320, "--set=%.300s", o->sets[i]);
  if (o->recycle)
    snprintf(a[n++], 320, "--set=daemon.host_recycle=%s", o->recycle);
  for (int i = 0; i < n; i++)
    args[i] = a[i];
  args[n] = NULL;
  if ((e = gshm__spawn_init(sp)) || (e = gshm__spawn_start(sp, gshmd, args, false, 30000))) {
    fprintf(stderr, "gshm-bench pull: cannot start gshmd %s: %s\n", name, strerror(-e));
    return e;
  }
  if (o->cpus_per_node)
    pin_node(sp->pid, name, o->cpus_per_node);
  return 0;
}

/* gshm_cluster_recycled_pulls_total of c's gshmd; -1 unknown. */
static long recycled_pulls(gshm_client_t *c) {
  static const char key[] = "\ngshm_cluster_recycled_pulls_total ";
  char *text = NULL, *m;
  long v = -1;

  if (gshm_metrics(c, &text))
    return -1;
  if ((m = strstr(text, key)))
    v = atol(m + strlen(key));
  gshm_free(text);
  return v;
}

/* The source segment bench/src on c's gshmd at o->location, its size
 * bytes written from bytes (pseudo-random: never zeros or one repeated
 * byte, which a device's memset gave before) so that its pages exist
 * before the first pull.  0 or a negative errno. */
static int make_source(gshm_client_t *c, const struct pull_opts *o, const uint8_t *bytes,
                       uint64_t size) {
  gshm_segment_t *seg;
  int e;

  if ((e = gshm_create(c, "bench/src", size, o->location, 0644, 0, &seg)))
    return e;
  e = gshm_write(seg, 0, bytes, size);
  gshm_close(seg);
  return e;
}

/* Holds (hold) or lets go (!hold) a retain of the primary context of each
 * GPU of --location and --to, so that the bench's gshm_write and gshm_read
 * of device segments, each mapping and unmapping one, find it active
 * rather than make and destroy one every call (133 ms each on an H200,
 * gshm.h): untimed, but it would stretch a run past the suite's limits.
 * Returns 0, or -EIO (printed) when a GPU cannot be held. */
static int hold_gpus(const struct pull_opts *o, bool hold) {
  const char *locs[2] = {o->location, o->to};
  const struct gshm_cudadrv *drv;
  CUcontext ctx;
  CUdevice dev;

  for (int i = 0; i < 2; i++) {
    if (strncmp(locs[i], "cuda:", 5) || (i && !strcmp(locs[0], locs[1])))
      continue;
    if (gshm__cudadrv_load(GSHM_LOG_ERR, &drv) ||
        drv->cuDeviceGet(&dev, atoi(locs[i] + 5)) != CUDA_SUCCESS ||
        (hold ? drv->cuDevicePrimaryCtxRetain(&ctx, dev) : drv->cuDevicePrimaryCtxRelease(dev)) !=
            CUDA_SUCCESS) {
      fprintf(stderr, "gshm-bench pull: cannot %s %s's primary context\n",
              hold ? "retain" : "release", locs[i]);
      return -EIO;
    }
  }
  return 0;
}

/* Every byte of the pulled bench/dst on b's gshmd is want's (size bytes),
 * read back into scratch (host or device segment alike).  0, or -1
 * (printed: a short segment, a read that failed, bytes that differ). */
static int check_pull(gshm_client_t *b, const uint8_t *want, uint8_t *scratch, uint64_t size) {
  gshm_segment_t *seg;
  const char *why = NULL;
  int e;

  if ((e = gshm_open(b, "bench/dst", GSHM_ACCESS_READ, &seg))) {
    fprintf(stderr, "gshm-bench pull: cannot open the pulled copy: %s\n", gshm_strerror(e));
    return -1;
  }
  if (gshm_segment_info(seg)->requested_size != size)
    why = "its size is not the source's";
  else if ((e = gshm_read(seg, 0, scratch, size)))
    why = gshm_strerror(e);
  else if (memcmp(scratch, want, size))
    why = "its bytes differ from the source's";
  gshm_close(seg);
  if (why)
    fprintf(stderr, "gshm-bench pull: FAIL: the pulled copy: %s\n", why);
  return why ? -1 : 0;
}

int bench_pull_main(int argc, char **argv) {
  static const struct option lo[] = {{"sizes", required_argument, NULL, 's'},
                                     {"iters", required_argument, NULL, 'n'},
                                     {"location", required_argument, NULL, 'l'},
                                     {"to", required_argument, NULL, 't'},
                                     {"perftest", required_argument, NULL, 'P'},
                                     {"no-perftest", no_argument, NULL, 'N'},
                                     {"gshmd", required_argument, NULL, 'g'},
                                     {"chunk", required_argument, NULL, 'c'},
                                     {"depth", required_argument, NULL, 'd'},
                                     {"encrypt", no_argument, NULL, 'e'},
                                     {"fanout", required_argument, NULL, 'F'},
                                     {"model", required_argument, NULL, 'M'},
                                     {"set", required_argument, NULL, 'S'},
                                     {"streams", required_argument, NULL, 'k'},
                                     {"cpus-per-node", required_argument, NULL, 'C'},
                                     {"gshmd-set", required_argument, NULL, 'D'},
                                     {"no-plain", no_argument, NULL, 'X'},
                                     {"split", no_argument, NULL, 'Y'},
                                     {"sources", no_argument, NULL, 'W'},
                                     {"recycle", required_argument, NULL, 'R'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  struct pull_opts o = {.iters = 5, .location = "host", .streams = 8};
  struct gshm_spawn A = {0}, B = {0};
  char dir[PATH_MAX - 8], key[PATH_MAX], pa[64], pb[64], ptbuf[PATH_MAX], ldpath[PATH_MAX];
  const char *gshmd, *pt, *tmp = getenv("TMPDIR");
  gshm_client_t *a = NULL, *b = NULL;
  int c, fd, rc = 1, port_a, port_b, failed_anchors = 0;
  bool held = false; /* hold_gpus */
  double lat4k_pull = -1;
  unsigned char seen[256] = {0};

  parse_sizes("1M,4M,16M,64M,256M,1G,4G", &o);
  while ((c = getopt_long(argc, argv, "s:n:l:t:P:Ng:c:d:ek:F:M:S:C:D:R:XYh", lo, NULL)) != -1) {
    if (c != 'D') /* --gshmd-set repeats */
      bench_opt_once("pull", lo, c, seen);
    switch (c) {
    case 's':
      if (parse_sizes(optarg, &o)) {
        fprintf(stderr, "gshm-bench pull: bad --sizes '%s'\n", optarg);
        return 2;
      }
      break;
    case 'n':
      /* the medians' arrays hold 63; more ran 63 under a header saying more */
      if ((o.iters = bench_int_arg("pull", "--iters", optarg, 1)) > 63) {
        fprintf(stderr, "gshm-bench pull: --iters takes 1 to 63\n");
        return 2;
      }
      break;
    case 'l': o.location = optarg; break;
    case 't': o.to = optarg; break;
    case 'P': o.perftest = optarg; break;
    case 'N': o.no_perftest = true; break;
    case 'g': o.gshmd = optarg; break;
    case 'c': o.chunk = optarg; break;
    case 'd': o.depth = optarg; break;
    case 'e': o.encrypt = true; break;
    case 'F': o.fanout = bench_int_arg("pull", "--fanout", optarg, 1); break;
    case 'M':
    case 'S':
      if (seen['M'] && seen['S']) { /* the set is one or the other */
        fprintf(stderr, "gshm-bench pull: --model and --set both given: give one\n");
        return 2;
      }
      if (bench_fanout_set_opt(&o, c == 'M', optarg)) {
        fprintf(stderr, "gshm-bench pull: bad --%s '%s'\n", c == 'M' ? "model" : "set", optarg);
        return 2;
      }
      break;
    case 'Y': o.split = true; break;
    case 'W': o.sources = true; break;
    case 'C': o.cpus_per_node = (unsigned)bench_int_arg("pull", "--cpus-per-node", optarg, 0); break;
    case 'D':
      if (o.nsets == 4 || !strchr(optarg, '=')) {
        fprintf(stderr, "gshm-bench pull: --gshmd-set takes KEY=VALUE, at most 4 times\n");
        return 2;
      }
      o.sets[o.nsets++] = optarg;
      break;
    case 'R': o.recycle = optarg; break;
    case 'X': o.no_plain = true; break;
    case 'k':
      o.streams = (unsigned)bench_int_arg("pull", "--streams", optarg, 1);
      if (o.streams < 1 || o.streams > 16) {
        fprintf(stderr, "gshm-bench pull: --streams takes 1 to 16\n");
        return 2;
      }
      break;
    case 'h':
      printf("usage: gshm-bench pull [--sizes 1M,4M,...,4G] [--iters N] [--location host|cuda:N]\n"
             "                       [--to host|cuda:N (default: --location)]\n"
             "                       [--perftest PATH | --no-perftest] [--gshmd PATH]\n"
             "                       [--chunk BYTES] [--depth N] [--encrypt] [--streams N]\n"
             "                       [--cpus-per-node N (node k on CPUs k*N..k*N+N-1)]\n"
             "                       [--gshmd-set KEY=VALUE (every gshmd; up to 4 times)]\n"
             "                       [--recycle BYTES (daemon.host_recycle: the first pull\n"
             "                        of a size is timed apart from the later, recycled ones)]\n"
             "         Two gshmd on 127.0.0.1; for each size B pulls A's segment of random bytes\n"
             "         --iters times (default 5) after a warm-up, each copy read back and compared\n"
             "         (untimed).  Per size: PULL GB/s (1e9 bytes/s: size / the median wall time\n"
             "         of gshm_pull, request to result) and PULL ms; taking turns with the pulls,\n"
             "         --streams plain TCP connections moving the same bytes into new memory\n"
             "         (TCPxK new) and into memory written before (TCPxK warm), GB/s of their\n"
             "         medians, and the pull's ratio to each (vs); ucx_perftest tag_bw and\n"
             "         ucp_am_bw, GB/s, the median of --iters runs (\"-\" not run, \"fail\": the\n"
             "         run exits 1); vsBEST: the pull over the best anchor; PATH host, direct or\n"
             "         staged.  Then CPU s/GB (CPU seconds per 1e9 bytes moved) of each gshmd and\n"
             "         of the TCP anchors, and by gshmd thread; PULL ms split into gshmd's own\n"
             "         elapsed time (acceptance to the set's end) and the rest (the request's way\n"
             "         in, the publish, the answer's way out); last, the median 4 KiB pull in us\n"
             "         against ucp_get's 4 KiB latency.\n"
             "       gshm-bench pull --fanout N [--model LAYERSxHIDDEN | --set COUNTxSIZE]\n"
             "                       [--iters N] [--chunk BYTES] [--depth N] [--encrypt] [--streams N]\n"
             "                       [--no-plain (gshm's pulls only, no plain TCP anchors)]\n"
             "                       [--split (--fanout 3: n1, n2 pull from n0, n3 half from\n"
             "                        each of them, instead of a chain)]\n"
             "                       [--sources (node i pulls from every node before it at\n"
             "                        once, each segment from the least busy)]\n"
             "                       [--location cuda:N [--to cuda:M]: the set in device\n"
             "                        segments, pulled into GPU M (staged), read back and checked]\n"
             "         N+1 gshmd: node i+1 pulls a set from node i, all at once (a chain),\n"
             "         against one plain pull; default --model 8x1536 (bf16 tensors of\n"
             "         8 transformer layers, hidden size 1536: about 550 MB); taking\n"
             "         turns with them, the same set over plain TCP (--streams connections\n"
             "         a hop, --chunk chunks, a process per node, with --cpus-per-node on\n"
             "         its gshmd's CPUs):\n"
             "         one hop, the chain (each node sends on what it received) and N\n"
             "         hops apart; the pull's ratio over the plain chain's is gshm's part\n");
      return 0;
    default:
      return 2;
    }
  }
  if (!o.to)
    o.to = o.location;
  if ((strncmp(o.location, "cuda:", 5) && strcmp(o.location, "host")) ||
      (strncmp(o.to, "cuda:", 5) && strcmp(o.to, "host"))) {
    fprintf(stderr, "gshm-bench pull: --location and --to take host or cuda:N\n");
    return 2;
  }
  setenv("UCX_TLS", getenv("UCX_TLS") ? getenv("UCX_TLS") : "tcp", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  gshmd = o.gshmd ? o.gshmd : gshm__find_gshmd();
  /* under TMPDIR: the supervisor's, which it removes after a signal too */
  snprintf(dir, sizeof(dir), "%s/gshm-bench-pull-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir))
    return 1;
  snprintf(key, sizeof(key), "%s/key", dir);
  if ((fd = open(key, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0 ||
      write(fd, "gshm-bench-pull-key-0123456789ab\n", 33) != 33)
    return 1;
  close(fd);
  port_a = bench_free_port();
  port_b = bench_free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", port_b);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d", port_a);
  if (o.fanout) { /* bench_fanout.c */
    rc = bench_fanout_run(&o, gshmd, key);
    unlink(key);
    rmdir(dir);
    return rc;
  }
  if (bench_pull_node_start(&A, gshmd, "a", port_a, pa, key, "bench/*", &o) ||
      bench_pull_node_start(&B, gshmd, "b", port_b, pb, key, "", &o))
    goto out;
  if (gshm_connect(A.socket_path, "bench-src", &a) || gshm_connect(B.socket_path, "bench-dst", &b))
    goto out;
  if (hold_gpus(&o, true))
    goto out;
  held = true;
  pt = find_perftest(&o, gshmd, ptbuf, sizeof(ptbuf), ldpath, sizeof(ldpath));
  printf("gshm-bench pull: from %s to %s, %s, cluster.streams=%u, UCX_TLS=%s for ucx_perftest, "
         "%d iterations after 1 warm-up, medians; every pulled copy read back and compared "
         "with the source's random bytes (untimed)\n",
         o.location, o.to, o.encrypt ? "cluster.encrypt on" : "authenticated", o.streams,
         getenv("UCX_TLS"), o.iters);
  printf("TCPxK new: %u plain TCP connections into new memory (a memfd's, as a pull's), warm: "
         "into memory written before; tag_bw, ucp_am_bw: ucx_perftest's overall bandwidth, the "
         "median of %d runs; BEST: the best of those anchors\n",
         o.streams, o.iters);
  printf("%8s %9s %9s %10s %6s %10s %6s %8s %8s %6s  %s\n", "SIZE", "PULL GB/s", "PULL ms",
         "TCPxK new", "vs", "TCPxK warm", "vs", "tag_bw", "am_bw", "vsBEST", "PATH");
  for (int i = 0; i < o.nsizes; i++) {
    uint64_t size = o.sizes[i];
    double t[64], t_in[64], t_out[64], t_new[64], t_warm[64], med, gbs, tcp_new, tcp_warm, best,
        tag = -2, am = -2,
        mbs, lat, cpu_a = 0, cpu_b = 0, cpu_new = 0, cpu_warm = 0, c0, c1, c2, c3, t_first = 0;
    double thr_a[BENCH_THR_N][2] = {{0}}, thr_b[BENCH_THR_N][2] = {{0}}; /* by thread, summed */
    long recycled0 = recycled_pulls(b);
    uint8_t *tsrc, *twarm;
    gshm_pull_result_t r;
    char sz[32], stag[16], sam[16];
    int e, n = o.iters;

    if (!(tsrc = malloc(size)) || !(twarm = malloc(size))) {
      free(tsrc);
      goto out;
    }
    bench_fill_random(tsrc, size);
    memset(twarm, 1, size);
    if ((e = make_source(a, &o, tsrc, size))) {
      fprintf(stderr, "gshm-bench pull: source of %" PRIu64 " bytes: %s (%s)\n", size,
              gshm_strerror(e), gshm_last_error(a));
      free(tsrc);
      free(twarm);
      goto out;
    }
    /* the pull and the TCP baselines take turns, so that a machine whose
     * speed drifts (a shared host) shifts all three alike */
    for (int k = -1; k < n; k++) {
      gshm_pull_opts_t po = {.local_name = "bench/dst",
                             .location = strncmp(o.to, "cuda", 4) ? NULL : o.to};
      double t0, tn, tw, a0 = bench_cpu_s(A.pid), b0 = bench_cpu_s(B.pid);
      double ta0[BENCH_THR_N][2] = {{0}}, tb0[BENCH_THR_N][2] = {{0}};
      bench_thread_cpu(A.pid, ta0);
      bench_thread_cpu(B.pid, tb0);
      /* after the CPU readings: reading every thread's /proc stat of both
       * gshmd took 0.3-0.4 ms (2-core VM), 7% of a 64 MiB pull on 2x H100 */
      t0 = bench_now_s();
      if ((e = gshm_pull(b, "a", "bench/src", &po, &r))) {
        fprintf(stderr, "gshm-bench pull: %s (%s)\n", gshm_strerror(e), gshm_last_error(b));
        free(tsrc);
        free(twarm);
        goto out;
      }
      if (k >= 0) {
        t[k] = bench_now_s() - t0;
        t_in[k] = (double)r.elapsed_ns / 1e9;
        t_out[k] = t[k] - t_in[k];
        cpu_a += bench_cpu_s(A.pid) - a0;
        cpu_b += bench_cpu_s(B.pid) - b0;
        bench_thread_cpu(A.pid, thr_a);
        bench_thread_cpu(B.pid, thr_b);
        for (int k2 = 0; k2 < BENCH_THR_N; k2++)
          for (int u = 0; u < 2; u++) {
            thr_a[k2][u] -= ta0[k2][u];
            thr_b[k2][u] -= tb0[k2][u];
          }
      } else {
        t_first = bench_now_s() - t0;
      }
      if (check_pull(b, tsrc, twarm, size)) { /* outside the timing and the CPU figures */
        free(tsrc);
        free(twarm);
        goto out;
      }
      gshm_unlink(b, "bench/dst");
      c0 = bench_cpu_s(0);
      tn = bench_tcp_once(tsrc, NULL, size, o.streams);
      c1 = bench_cpu_s(0);
      tw = bench_tcp_once(tsrc, twarm, size, o.streams);
      c2 = bench_cpu_s(0);
      if (tn < 0 || tw < 0) { /* a failure, not a time to take the median of */
        fprintf(stderr, "gshm-bench pull: the plain TCP anchor into %s memory failed at %s\n",
                tn < 0 ? "new" : "written", gshm__format_size(size, sz, sizeof(sz)));
        free(tsrc);
        free(twarm);
        goto out;
      }
      if (k >= 0) {
        t_new[k] = tn;
        t_warm[k] = tw;
        cpu_new += c1 - c0;
        cpu_warm += c2 - c1;
      }
    }
    free(tsrc);
    free(twarm);
    gshm_unlink(a, "bench/src");
    med = bench_median(t, n);
    gbs = (double)size / med / 1e9;
    /* ucx_perftest 1.13 printed nonsense for 4 GiB (13510798 GB/s on
     * the H100 run): its message size does not reach that far */
    if (!o.no_perftest && size < (4ull << 30)) {
      int it = size >= (1ull << 30) ? 5 : size >= (256ull << 20) ? 10 : 50;
      tag = perftest(pt, ldpath, "tag_bw", size, it, n, &mbs, &lat) ? -1 : mbs * 1048576.0 / 1e9;
      am = perftest(pt, ldpath, "ucp_am_bw", size, it, n, &mbs, &lat) ? -1 : mbs * 1048576.0 / 1e9;
      for (int k2 = 0; k2 < 2; k2++)
        if ((k2 ? am : tag) == -1) {
          fprintf(stderr, "gshm-bench pull: %s -t %s at %s failed (--no-perftest skips it)\n", pt,
                  k2 ? "ucp_am_bw" : "tag_bw", gshm__format_size(size, sz, sizeof(sz)));
          failed_anchors++;
        }
    }
    tcp_new = (double)size / bench_median(t_new, n) / 1e9;
    tcp_warm = (double)size / bench_median(t_warm, n) / 1e9;
    best = tcp_new > tcp_warm ? tcp_new : tcp_warm;
    best = tag > best ? tag : best;
    best = am > best ? am : best;
    printf("%8s %9.2f %9.2f %10.2f %6.2f %10.2f %6.2f %8s %8s %6.2f  %s\n",
           gshm__format_size(size, sz, sizeof(sz)), gbs, med * 1e3, tcp_new,
           tcp_new > 0 ? gbs / tcp_new : 0, tcp_warm, tcp_warm > 0 ? gbs / tcp_warm : 0,
           anchor_str(tag, stag), anchor_str(am, sam), best > 0 ? gbs / best : 0, r.path);
    /* CPU seconds per GB moved (both ends): what bounds several pulls on
     * one host (fan-out) is the host's cores over this */
    c3 = (double)size * n / 1e9;
    printf("%8s CPU s/GB: pull %.2f (source %.2f, puller %.2f), TCPxK new %.2f, warm %.2f\n", "",
           (cpu_a + cpu_b) / c3, cpu_a / c3, cpu_b / c3, cpu_new / c3, cpu_warm / c3);
    for (int side = 0; side < 2; side++) {
      double (*v)[2] = side ? thr_b : thr_a;
      printf("%8s %s by thread, user + system s/GB:", "", side ? "puller" : "source");
      for (int k2 = 0; k2 < BENCH_THR_N; k2++)
        printf("  %s %.3f + %.3f", bench_thr_name[k2], v[k2][0] / c3, v[k2][1] / c3);
      printf("\n");
    }
    /* gshmd's elapsed_ns: from its acceptance of the request to the set's
     * end (every byte in, every segment closed); the rest of the wall
     * time is the request's way in, the publish and the answer's way out */
    printf("%8s PULL ms: %.3f in gshmd to the last segment's close, %.3f around it (request, "
           "publish, answer), medians\n",
           "", bench_median(t_in, n) * 1e3, bench_median(t_out, n) * 1e3);
    if (o.recycle) /* the warm-up is the first pull of the size: new memory */
      printf("%8s first pull (new memory) %.2f GB/s (%.2f ms); the %d timed: %ld of them into "
             "recycled memory\n",
             "", (double)size / t_first / 1e9, t_first * 1e3, n, recycled_pulls(b) - recycled0);
    fflush(stdout);
  }
  /* 4 KiB: latency */
  {
    double t[64], pt_mbs = 0, pt_lat = 0;
    int n = 50, e;
    gshm_pull_result_t r;
    struct pull_opts small = o;
    uint8_t want[4096], back[4096];
    small.location = "host";
    bench_fill_random(want, sizeof(want));
    if ((e = make_source(a, &small, want, sizeof(want)))) {
      fprintf(stderr, "gshm-bench pull: 4 KiB source: %s (%s)\n", gshm_strerror(e),
              gshm_last_error(a));
      goto out;
    }
    for (int k = -5; k < n; k++) {
      gshm_pull_opts_t po = {.local_name = "bench/dst"};
      double t0 = bench_now_s();
      if ((e = gshm_pull(b, "a", "bench/src", &po, &r))) {
        fprintf(stderr, "gshm-bench pull: 4 KiB: %s (%s)\n", gshm_strerror(e), gshm_last_error(b));
        goto out;
      }
      if (k >= 0)
        t[k] = bench_now_s() - t0;
      if (check_pull(b, want, back, sizeof(want)))
        goto out;
      gshm_unlink(b, "bench/dst");
    }
    gshm_unlink(a, "bench/src");
    lat4k_pull = bench_median(t, n) * 1e6;
    if (!o.no_perftest && !perftest(pt, ldpath, "ucp_get", 4096, 2000, 1, &pt_mbs, &pt_lat)) {
      printf("4 KiB host pull: %.1f us median (request to result); ucp_get 4 KiB latency %.1f us "
             "(%.2fx)\n",
             lat4k_pull, pt_lat, lat4k_pull / pt_lat);
    } else {
      printf("4 KiB host pull: %.1f us median (request to result)%s\n", lat4k_pull,
             o.no_perftest ? "" : "; ucp_get: fail");
      if (!o.no_perftest) {
        fprintf(stderr, "gshm-bench pull: %s -t ucp_get at 4 KiB failed\n", pt);
        failed_anchors++;
      }
    }
  }
  rc = 0;
  if (failed_anchors) { /* the table is printed; the run still failed */
    fprintf(stderr, "gshm-bench pull: %d anchor run(s) failed (\"fail\" in their columns)\n",
            failed_anchors);
    rc = 1;
  }
out:
  if (held)
    hold_gpus(&o, false);
  if (a)
    gshm_disconnect(a);
  if (b)
    gshm_disconnect(b);
  gshm__spawn_stop(&B, SIGTERM);
  gshm__spawn_cleanup(&B);
  gshm__spawn_stop(&A, SIGTERM);
  gshm__spawn_cleanup(&A);
  unlink(key);
  rmdir(dir);
  return rc;
}
