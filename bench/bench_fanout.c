/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench pull --fanout N: one set moved to N nodes at once against
 * one plain pull of it, and both against the same shapes over plain TCP,
 * in the same run (docs/CLUSTER.md "Moving a model to several nodes").
 *
 * N + 1 gshmd on 127.0.0.1 (n0 .. nN, each a peer of the one before and
 * the one after).  n0 holds the set fan/NNNNN: host segments of random
 * bytes (libsodium's deterministic stream, one seed per segment), the
 * bf16 tensors of a transformer (--model LAYERSxHIDDEN: per layer q, k, v,
 * o of HIDDEN^2, gate, up, down of HIDDEN x 8/3 HIDDEN, two norms; an
 * embedding of 32000 x HIDDEN and a final norm) or COUNT segments of SIZE
 * bytes (--set COUNTxSIZE).  Each iteration times one plain pull n0 -> n1
 * alone (into one/), then the chain: node i pulls the set from node i - 1,
 * every hop started as soon as the one before it has its request (a
 * relaying node answers a listing once its own listing is done), timed
 * from the first start to the last hop's result.  Every byte of every
 * copy is compared with n0's.  With --location cuda:N the set is made of
 * device segments on n0's GPU N (filled from the same random bytes) and
 * each hop pulls into --to (default: the same GPU): the staged path, a
 * model pulled into a new node's GPU; each copy is read back and
 * compared.
 *
 * All N + 1 nodes share one host's CPUs and memory, so three copies at
 * once cost more than one even without gshm.  Taking turns with the
 * pulls, each iteration therefore moves the same set without gshm
 * (bench_tcp.c): send -> recv over --streams connections per hop, in
 * chunks of --chunk bytes (the pull's default, 4 MiB, without it), into
 * new memfds of the set's sizes (with --recycle written through before
 * the start, as the pulls land in memory made before), one process per
 * node (on the CPUs its
 * gshmd has under --cpus-per-node): one hop n0 -> n1 alone; the chain,
 * where node i's process sends on each chunk as soon as it received it;
 * and N independent hops at once, each sending n0's bytes.  Every byte
 * of those copies is checked too.
 *
 * After one warm-up iteration, prints the medians: one-pull seconds,
 * fan-out seconds, their ratio (the target is <= 1.3) and GB/s; the plain
 * one hop, chain and independent hops; the plain chain's ratio (what the
 * host alone allows) and the pull's ratio over it (what gshm adds). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_pull.h"
#include "bench_tcp.h"
#include "cudadrv.h"
#include "gshm.h"
#include "util.h"

#define FAN_MAX 16 /* hops at most */
#define FAN_CHUNK (4ull << 20) /* cluster.pull_chunk's default */

int bench_fanout_set_opt(struct pull_opts *o, bool model, const char *arg) {
  char *end;
  unsigned long a = strtoul(arg, &end, 10), b;
  uint64_t size;

  if (!a || (*end != 'x' && *end != 'X'))
    return -1;
  size = b = strtoul(end + 1, &end, 10);
  if (!b)
    return -1;
  if (model) {
    if (*end || a > 1000 || b > 65536)
      return -1;
    o->layers = (unsigned)a;
    o->hidden = (unsigned)b;
    o->set_count = 0;
    return 0;
  }
  switch (*end) {
  case 'K': case 'k': size <<= 10; break;
  case 'M': case 'm': size <<= 20; break;
  case 'G': case 'g': size <<= 30; break;
  case '\0': break;
  default: return -1;
  }
  if (a > 4096)
    return -1;
  o->set_count = (unsigned)a;
  o->set_size = size;
  return 0;
}

/* The sizes of the set's segments (heap; *n_out of them). */
static uint64_t *set_sizes(const struct pull_opts *o, unsigned *n_out) {
  uint64_t h = o->hidden ? o->hidden : 1536, ffn = (h * 8 / 3 + 255) / 256 * 256;
  unsigned layers = o->layers ? o->layers : 8, n = 0;
  unsigned count = o->set_count ? o->set_count : layers * 9 + 2;
  uint64_t *v = calloc(count, sizeof(*v));

  if (!v)
    return NULL;
  if (o->set_count) {
    for (; n < count; n++)
      v[n] = o->set_size;
  } else {
    v[n++] = 32000 * h * 2; /* embedding */
    for (unsigned l = 0; l < layers; l++) {
      for (int k = 0; k < 4; k++)
        v[n++] = h * h * 2; /* q, k, v, o */
      for (int k = 0; k < 3; k++)
        v[n++] = h * ffn * 2; /* gate, up, down */
      v[n++] = h * 2;         /* two norms */
      v[n++] = h * 2;
    }
    v[n++] = h * 2; /* final norm */
  }
  *n_out = n;
  return v;
}

/* The run: nodes, the set's sizes and n0's mappings of it. */
struct fan {
  const struct pull_opts *o;
  int nodes;
  struct gshm_spawn sp[FAN_MAX + 1];
  gshm_client_t *c[FAN_MAX + 1];
  uint64_t *sizes, total, largest;
  uint64_t chunk; /* the plain TCP anchor's chunks: --chunk, else the pull's default */
  unsigned count;
  gshm_segment_t **src;
  void **src_map;                  /* the set's bytes: n0's mappings, or host copies of them */
  const struct gshm_cudadrv *drv;  /* device segments (--location cuda:N) */
  CUcontext src_ctx, dst_ctx;      /* primary contexts of n0's GPU and of --to's */
  bool device;
  /* CPU seconds of each gshmd (bench_cpu_s) in each timed iteration
   * ([node][iteration]): during one pull, during the fan-out */
  double cpu_one[FAN_MAX + 1][64], cpu_fan[FAN_MAX + 1][64];
  /* the fan-out's, by thread: [node][class][user, system] */
  double thr_fan[FAN_MAX + 1][BENCH_THR_N][2];
  /* each hop's start and end, seconds after the first hop's start, summed */
  double hop_start[FAN_MAX + 1], hop_end[FAN_MAX + 1];
  /* bytes each node served in the fan-outs, by the pulls' results */
  uint64_t served[FAN_MAX + 1];
  bool timed; /* the iteration running counts (not the warm-up) */
  int iter;   /* which timed iteration it is, 0 .. --iters - 1 */
};


/* Stores each gshmd's CPU seconds since before[] (taken by cpu_mark) as
 * this iteration's, per[node][f->iter]; per NULL: fills before[] instead. */
static void cpu_mark(const struct fan *f, double before[FAN_MAX + 1], double (*per)[64]) {
  for (int i = 0; i < f->nodes; i++) {
    double c = bench_cpu_s(f->sp[i].pid);
    if (per)
      per[i][f->iter] = c - before[i];
    else
      before[i] = c;
  }
}

/* The median of node's iters figures in per (copied: per stays in order). */
static double node_median(const double (*per)[64], int node, int iters) {
  double v[64];
  memcpy(v, per[node], sizeof(double) * (size_t)iters);
  return bench_median(v, iters);
}

/* The primary context of GPU "cuda:N" (loc), made current; 0 or -EIO. */
static int cuda_ctx(struct fan *f, const char *loc, CUcontext *ctx) {
  CUdevice dev;

  if (!f->drv && gshm__cudadrv_load(GSHM_LOG_ERR, &f->drv))
    return -EIO;
  if (f->drv->cuDeviceGet(&dev, atoi(loc + 5)) != CUDA_SUCCESS ||
      f->drv->cuDevicePrimaryCtxRetain(ctx, dev) != CUDA_SUCCESS ||
      f->drv->cuCtxSetCurrent(*ctx) != CUDA_SUCCESS)
    return -EIO;
  return 0;
}

static int start_nodes(struct fan *f, const char *gshmd, const char *key) {
  int port[FAN_MAX + 1];
  char name[16], peers[FAN_MAX * 32];
  bool mesh = f->o->split || f->o->sources;

  for (int i = 0; i < f->nodes; i++)
    port[i] = bench_free_port();
  for (int i = 0; i < f->nodes; i++) {
    int k = 0;
    peers[0] = '\0';
    for (int j = 0; mesh && j < f->nodes; j++) /* (every other node) */
      if (j != i)
        k += snprintf(peers + k, sizeof(peers) - k, "%sn%d=127.0.0.1:%d", k ? "," : "", j, port[j]);
    if (i > 0 && !mesh)
      k += snprintf(peers + k, sizeof(peers) - k, "n%d=127.0.0.1:%d", i - 1, port[i - 1]);
    if (i + 1 < f->nodes && !mesh)
      snprintf(peers + k, sizeof(peers) - k, "%sn%d=127.0.0.1:%d", k ? "," : "", i + 1,
               port[i + 1]);
    snprintf(name, sizeof(name), "n%d", i);
    if (bench_pull_node_start(&f->sp[i], gshmd, name, port[i], peers, key, "fan/*", f->o) ||
        gshm_connect(f->sp[i].socket_path, "bench-fanout", &f->c[i]))
      return -1;
  }
  return 0;
}

/* n0's set: created, filled with random bytes, kept open and mapped. */
static int make_set(struct fan *f) {
  unsigned char seed[randombytes_SEEDBYTES] = {0};
  char name[64];
  int e;

  if (!(f->src = calloc(f->count, sizeof(*f->src))) ||
      !(f->src_map = calloc(f->count, sizeof(*f->src_map))))
    return -ENOMEM;
  if (f->device && (e = cuda_ctx(f, f->o->location, &f->src_ctx)))
    return e;
  for (unsigned i = 0; i < f->count; i++) {
    void *p = NULL;
    snprintf(name, sizeof(name), "fan/%05u", i);
    if ((e = gshm_create(f->c[0], name, f->sizes[i], f->o->location, 0644, 0, &f->src[i])) ||
        (e = gshm_map(f->src[i], NULL, 0, &p)) ||
        (f->device && !(f->src_map[i] = malloc(f->sizes[i])) && (e = -ENOMEM))) {
      fprintf(stderr, "gshm-bench pull: cannot make %s: %s\n", name, gshm_strerror(e));
      return e;
    }
    if (!f->device)
      f->src_map[i] = p;
    memcpy(seed, &i, sizeof(i));
    randombytes_buf_deterministic(f->src_map[i], f->sizes[i], seed);
    if (f->device && (f->drv->cuCtxSetCurrent(f->src_ctx) != CUDA_SUCCESS ||
                      f->drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)p, f->src_map[i],
                                           f->sizes[i]) != CUDA_SUCCESS)) {
      fprintf(stderr, "gshm-bench pull: cannot fill %s on %s\n", name, f->o->location);
      return -EIO;
    }
    f->total += f->sizes[i];
    if (f->sizes[i] > f->largest)
      f->largest = f->sizes[i];
  }
  return 0;
}

/* Every byte of node's copy under prefix is n0's; then it is unlinked.
 * Returns 0 or -1 (printed). */
static int check_copy(struct fan *f, int node, const char *prefix) {
  char name[64];
  int bad = 0;
  void *back = NULL; /* a device copy's bytes, read back */

  if (f->device && (f->drv->cuCtxSetCurrent(f->dst_ctx) != CUDA_SUCCESS ||
                    !(back = malloc(f->largest))))
    return -1;
  for (unsigned i = 0; i < f->count; i++) {
    gshm_segment_t *seg;
    void *p;
    snprintf(name, sizeof(name), "%s%05u", prefix, i);
    if (gshm_open(f->c[node], name, GSHM_ACCESS_READ, &seg) == 0) {
      if (gshm_map(seg, NULL, 0, &p) || gshm_segment_info(seg)->requested_size != f->sizes[i])
        bad++;
      else if (f->device)
        bad += f->drv->cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)p, f->sizes[i]) != CUDA_SUCCESS ||
               memcmp(back, f->src_map[i], f->sizes[i]);
      else if (memcmp(p, f->src_map[i], f->sizes[i]))
        bad++;
      gshm_close(seg);
      gshm_unlink(f->c[node], name);
    } else {
      bad++;
    }
  }
  free(back);
  if (bad)
    fprintf(stderr, "gshm-bench pull: %d segment(s) of n%d's copy differ or are missing\n", bad,
            node);
  return bad ? -1 : 0;
}

/* One hop: a set pull on its own connection, in a thread. */
struct hop {
  pthread_t t;
  const char *sock, *local;
  char prefix[16]; /* the remote names pulled ("fan/", or part of it with --split) */
  const char *location; /* the copy's: NULL (host) or --to */
  char peer[FAN_MAX * 8]; /* "n0" or, --sources, "n0,n1,..." */
  uint64_t from[FAN_MAX + 1]; /* bytes from each node (the results' peer "nK") */
  double t0, t1;
  int err;
  bool done;
};

static void *hop_thread(void *arg) {
  struct hop *h = arg;
  gshm_pull_opts_t po = {.local_name = h->local, .mode = 0644, .location = h->location};
  gshm_pull_result_t *v = NULL;
  gshm_client_t *c;
  size_t n = 0;

  h->t0 = bench_now_s();
  if (!(h->err = gshm_connect(h->sock, "bench-hop", &c))) {
    if (!(h->err = gshm_pull_prefix(c, h->peer, h->prefix, &po, &v, &n))) {
      for (size_t i = 0; i < n; i++) {
        int k = atoi(v[i].peer + 1);
        if (v[i].peer[0] == 'n' && k >= 0 && k <= FAN_MAX)
          h->from[k] += v[i].bytes;
      }
      gshm_free(v);
    }
    gshm_disconnect(c);
  }
  h->t1 = bench_now_s();
  __atomic_store_n(&h->done, true, __ATOMIC_RELEASE);
  return NULL;
}

/* node pulls from node `from` (--sources, prefix NULL: from every node
 * before it) the names under prefix (NULL: "fan/"),
 * into local (NULL: the same names). */
static int hop_start_from(struct fan *f, struct hop *h, int node, int from, const char *prefix,
                          const char *local) {
  snprintf(h->prefix, sizeof(h->prefix), "%s", prefix ? prefix : "fan/");
  h->sock = f->sp[node].socket_path;
  h->local = local ? local : h->prefix;
  h->location = f->device ? f->o->to : NULL;
  snprintf(h->peer, sizeof(h->peer), "n%d", from);
  if (f->o->sources && !prefix) /* every node before it, n0 first (the lister) */
    for (int j = 0, k = 0; j < node; j++)
      k += snprintf(h->peer + k, sizeof(h->peer) - (size_t)k, "%sn%d", j ? "," : "", j);
  return pthread_create(&h->t, NULL, hop_thread, h) ? -1 : 0;
}

static int hop_start(struct fan *f, struct hop *h, int node, const char *local) {
  return hop_start_from(f, h, node, node - 1, NULL, local);
}

/* Waits (up to 60 s) until node shows a pull in flight, or hop h (node's)
 * ended: the next hop may list the set there. */
static void wait_listed(struct fan *f, int node, struct hop *h) {
  for (int k = 0; k < 60000 && !__atomic_load_n(&h->done, __ATOMIC_ACQUIRE); k++) {
    gshm_cluster_pull_t *v = NULL;
    size_t n = 0;
    bool listed = false;
    if (gshm_cluster_pulls(f->c[node], &v, &n) == 0) {
      listed = n > 0;
      gshm_free(v);
    }
    if (listed)
      return;
    usleep(1000);
  }
}

/* n0 -> n1 alone (into one/), every byte checked: *s_out seconds. */
static int pull_one(struct fan *f, double *s_out) {
  struct hop one = {0};
  double c0[FAN_MAX + 1];

  cpu_mark(f, c0, NULL);
  if (hop_start(f, &one, 1, "one/"))
    return -1;
  pthread_join(one.t, NULL);
  if (f->timed)
    cpu_mark(f, c0, f->cpu_one);
  if (one.err || check_copy(f, 1, "one/")) {
    fprintf(stderr, "gshm-bench pull: the plain pull failed: %s\n", gshm_strerror(one.err));
    return -1;
  }
  *s_out = one.t1 - one.t0;
  return 0;
}

/* --split: n1 and n2 pull the set from n0 at once; once both have
 * listed it, n3 pulls it in groups of names (fan/NNNN: ten segments a
 * group, or a hundred where that makes over SPLIT_GROUPS), the groups up
 * to half the set's bytes from n1, the rest from n2, each group a set
 * pull of its own, all at once.  hops[1], hops[2]: n1's and n2's;
 * hops[3]: n3's first start and last end.  *s_out: from the first start
 * to the last end.  0 or -1 (printed). */
#define SPLIT_GROUPS 64
static int split_run(struct fan *f, struct hop hops[FAN_MAX + 1], double *s_out) {
  static struct hop g[SPLIT_GROUPS];
  unsigned per = 10, ngroups, digits = 4;
  uint64_t half = f->total / 2, sent = 0;
  char prefix[16];
  int e = 0;

  while ((ngroups = (f->count - 1) / per + 1) > SPLIT_GROUPS && digits > 1)
    per *= 10, digits--;
  if (ngroups > SPLIT_GROUPS || hop_start_from(f, &hops[1], 1, 0, NULL, NULL) ||
      hop_start_from(f, &hops[2], 2, 0, NULL, NULL))
    return -1;
  wait_listed(f, 1, &hops[1]);
  wait_listed(f, 2, &hops[2]);
  memset(g, 0, sizeof(g));
  for (unsigned k = 0; k < ngroups; k++) {
    int from = sent < half ? 1 : 2;
    for (unsigned i = k * per; i < f->count && i < (k + 1) * per; i++)
      sent += f->sizes[i];
    snprintf(prefix, sizeof(prefix), "fan/%0*u", (int)digits, k);
    if (hop_start_from(f, &g[k], 3, from, prefix, NULL))
      return -1;
  }
  hops[3].t0 = 1e300;
  for (unsigned k = 0; k < ngroups; k++) {
    pthread_join(g[k].t, NULL);
    if (g[k].err) {
      fprintf(stderr, "gshm-bench pull: n3's pull of %s* from %s failed: %s\n", g[k].prefix,
              g[k].peer, gshm_strerror(g[k].err));
      e = -1;
    }
    hops[3].t0 = g[k].t0 < hops[3].t0 ? g[k].t0 : hops[3].t0;
    hops[3].t1 = g[k].t1 > hops[3].t1 ? g[k].t1 : hops[3].t1;
  }
  for (int i = 1; i <= 2; i++) {
    pthread_join(hops[i].t, NULL);
    if (hops[i].err) {
      fprintf(stderr, "gshm-bench pull: n%d's pull from n0 failed: %s\n", i,
              gshm_strerror(hops[i].err));
      e = -1;
    }
  }
  *s_out = 0;
  for (int i = 1; i <= 3; i++)
    if (hops[i].t1 - hops[1].t0 > *s_out)
      *s_out = hops[i].t1 - hops[1].t0;
  return e;
}

/* The chain (each hop started once the one before has its request),
 * every byte of every copy checked: *s_out seconds. */
static int pull_fan(struct fan *f, double *s_out) {
  struct hop hops[FAN_MAX + 1];
  double c0[FAN_MAX + 1], t0[FAN_MAX + 1][BENCH_THR_N][2], t1[FAN_MAX + 1][BENCH_THR_N][2];
  int e = 0;

  memset(hops, 0, sizeof(hops));
  memset(t0, 0, sizeof(t0));
  memset(t1, 0, sizeof(t1));
  for (int i = 0; i < f->nodes; i++)
    bench_thread_cpu(f->sp[i].pid, t0[i]);
  cpu_mark(f, c0, NULL);
  if (f->o->split) {
    if (split_run(f, hops, s_out))
      e = -1;
    goto timed;
  }
  for (int i = 1; i < f->nodes; i++) {
    if (hop_start(f, &hops[i], i, "fan/"))
      return -1;
    if (i + 1 < f->nodes)
      wait_listed(f, i, &hops[i]);
  }
  *s_out = 0;
  for (int i = 1; i < f->nodes; i++) {
    pthread_join(hops[i].t, NULL);
    if (hops[i].err) {
      fprintf(stderr, "gshm-bench pull: hop n%d -> n%d failed: %s\n", i - 1, i,
              gshm_strerror(hops[i].err));
      e = -1;
    }
    if (hops[i].t1 - hops[1].t0 > *s_out)
      *s_out = hops[i].t1 - hops[1].t0;
  }
timed:
  if (f->timed) {
    cpu_mark(f, c0, f->cpu_fan);
    for (int i = 1; i < f->nodes; i++) {
      f->hop_start[i] += hops[i].t0 - hops[1].t0;
      f->hop_end[i] += hops[i].t1 - hops[1].t0;
      for (int k = 0; k < f->nodes; k++)
        f->served[k] += hops[i].from[k];
    }
    for (int i = 0; i < f->nodes; i++) {
      bench_thread_cpu(f->sp[i].pid, t1[i]);
      for (int k = 0; k < BENCH_THR_N; k++)
        for (int u = 0; u < 2; u++)
          f->thr_fan[i][k][u] += t1[i][k][u] - t0[i][k][u];
    }
  }
  for (int i = 1; i < f->nodes && !e; i++)
    e = check_copy(f, i, "fan/");
  return e;
}

/* The set over plain TCP from n0 along hops hops (bench_tcp.c): relay,
 * a chain; else independent transfers of n0's bytes.  Seconds or -1. */
static double plain(struct fan *f, int hops, bool relay) {
  struct bench_chain_params p = {.src = f->src_map,
                                 .sizes = f->sizes,
                                 .count = f->count,
                                 .hops = (unsigned)hops,
                                 .lanes = f->o->streams,
                                 .chunk = f->chunk,
                                 .cpus_per_node = f->o->cpus_per_node,
                                 .relay = relay,
                                 .written = f->o->recycle != NULL};
  return bench_tcp_chain(&p);
}

/* What an iteration times, in the order it runs them: gshm and the plain
 * TCP anchor take turns, so that a host whose speed drifts shifts both. */
enum { T_ONE, T_PLAIN_ONE, T_FAN, T_PLAIN_CHAIN, T_PLAIN_APART, T_N };

static int iteration(struct fan *f, double t[T_N]) {
  if (f->o->no_plain) {
    t[T_PLAIN_ONE] = t[T_PLAIN_CHAIN] = t[T_PLAIN_APART] = 0;
    return pull_one(f, &t[T_ONE]) || pull_fan(f, &t[T_FAN]) ? -1 : 0;
  }
  if (pull_one(f, &t[T_ONE]) || (t[T_PLAIN_ONE] = plain(f, 1, true)) < 0 ||
      pull_fan(f, &t[T_FAN]) || (t[T_PLAIN_CHAIN] = plain(f, f->nodes - 1, true)) < 0 ||
      (t[T_PLAIN_APART] = plain(f, f->nodes - 1, false)) < 0)
    return -1;
  return 0;
}

static void fan_free(struct fan *f) {
  for (unsigned i = 0; f->src && i < f->count; i++) {
    if (f->src[i])
      gshm_close(f->src[i]);
    if (f->device)
      free(f->src_map[i]);
  }
  for (int i = 0; i < f->nodes; i++) {
    if (f->c[i])
      gshm_disconnect(f->c[i]);
    gshm__spawn_stop(&f->sp[i], SIGTERM);
    gshm__spawn_cleanup(&f->sp[i]);
  }
  free(f->src);
  free(f->src_map);
  free(f->sizes);
}

/* The medians (m[T_*], seconds) and their ratios; first: the warm-up's
 * one pull (the nodes' first: nothing made yet, pinned slots included);
 * t: each iteration's seconds, in order. */
static void report(const struct fan *f, const double m[T_N], double first, int iters,
                   double t[T_N][64]) {
  double gb = (double)f->total / 1e9, ratio = m[T_FAN] / m[T_ONE];
  double plain_ratio = m[T_PLAIN_CHAIN] / m[T_PLAIN_ONE];
  int hops = f->nodes - 1;

  printf("one pull n0 -> n1:           %8.3f s  %6.2f GB/s\n", m[T_ONE], gb / m[T_ONE]);
  printf("  the first of them (warm-up): %7.3f s  %6.2f GB/s\n", first, gb / first);
  printf("fan-out to %2d nodes:         %8.3f s  %6.2f GB/s per copy, %.2f GB/s in all\n", hops,
         m[T_FAN], gb / m[T_FAN], gb * hops / m[T_FAN]);
  printf("ratio fan-out / one pull:    %8.2f    (target <= 1.3); every byte of every copy "
         "checked\n",
         ratio);
  printf("  each iteration, one pull / fan-out%s (s):", f->o->no_plain ? "" : " / plain one hop");
  for (int k = 0; k < iters; k++)
    if (f->o->no_plain)
      printf(" %.3f / %.3f", t[T_ONE][k], t[T_FAN][k]);
    else
      printf(" %.3f / %.3f / %.3f", t[T_ONE][k], t[T_FAN][k], t[T_PLAIN_ONE][k]);
  printf("\n");
  if (f->o->no_plain)
    goto cpu;
  printf("plain TCP one hop:           %8.3f s  %6.2f GB/s\n", m[T_PLAIN_ONE],
         gb / m[T_PLAIN_ONE]);
  printf("plain TCP chain to %2d nodes: %8.3f s  %6.2f GB/s per copy, %.2f GB/s in all\n", hops,
         m[T_PLAIN_CHAIN], gb / m[T_PLAIN_CHAIN], gb * hops / m[T_PLAIN_CHAIN]);
  printf("plain TCP %2d hops apart:     %8.3f s  %6.2f GB/s per copy (%.2fx one hop)\n", hops,
         m[T_PLAIN_APART], gb / m[T_PLAIN_APART], m[T_PLAIN_APART] / m[T_PLAIN_ONE]);
  printf("plain ratio chain / one hop: %8.2f    (what the host alone allows)\n", plain_ratio);
  printf("fan-out ratio / plain ratio: %8.2f    (what gshm adds to it)\n", ratio / plain_ratio);
cpu:
  /* where the CPU goes: a node whose CPU seconds come near its share of
   * the machine times the wall time is what bounds the chain */
  printf("gshmd CPU s per iteration (median), one pull / fan-out:");
  for (int i = 0; i < f->nodes; i++)
    printf("  n%d %.3f / %.3f", i, node_median(f->cpu_one, i, iters),
           node_median(f->cpu_fan, i, iters));
  printf("\n");
  if (f->o->cpus_per_node)
    printf("  busy (median CPU s / (median s x %u CPUs)), fan-out:", f->o->cpus_per_node);
  for (int i = 0; f->o->cpus_per_node && i < f->nodes; i++)
    printf("  n%d %.0f%%", i,
           100 * node_median(f->cpu_fan, i, iters) / (m[T_FAN] * f->o->cpus_per_node));
  if (f->o->cpus_per_node)
    printf("\n");
  if (f->o->sources) {
    printf("  served, in copies of the set (mean):");
    for (int i = 0; i < f->nodes; i++)
      printf("  n%d %.2f", i, (double)f->served[i] / iters / (double)f->total);
    printf("\n");
  }
  printf("  each hop, from the first hop's start (mean s): ");
  for (int i = 1; i < f->nodes; i++)
    printf("%sn%d started %.3f, done %.3f", i > 1 ? "; " : "", i, f->hop_start[i] / iters,
           f->hop_end[i] / iters);
  printf("\n");
  printf("  fan-out CPU s by thread, user + system (threads that ended are not counted):\n");
  for (int i = 0; i < f->nodes; i++) {
    printf("    n%d", i);
    for (int k = 0; k < BENCH_THR_N; k++)
      printf("  %s %.3f + %.3f", bench_thr_name[k], f->thr_fan[i][k][0] / iters,
             f->thr_fan[i][k][1] / iters);
    printf("\n");
  }
}

int bench_fanout_run(const struct pull_opts *o, const char *gshmd, const char *key) {
  struct fan f = {.o = o, .nodes = o->fanout + 1, .chunk = FAN_CHUNK};
  double t[T_N][64], v[T_N], m[T_N], first = 0;
  int n = o->iters, rc = 1; /* 1..63 (bench_pull_main) */
  char sz[32], ck[32];

  f.device = !strncmp(o->location, "cuda:", 5);
  if ((o->split && o->fanout != 3) || (o->split && o->sources)) {
    fprintf(stderr, "gshm-bench pull: --split takes --fanout 3, and not --sources\n");
    return 2;
  }
  if (o->fanout < 1 || o->fanout > FAN_MAX || f.device != !strncmp(o->to, "cuda:", 5) ||
      sodium_init() < 0 || (o->chunk && gshm__parse_size(o->chunk, &f.chunk)) || !f.chunk) {
    fprintf(stderr, "gshm-bench pull: --fanout takes 1 to %d, host segments or device ones "
            "to device ones (and a --chunk in bytes)\n", FAN_MAX);
    return 2;
  }
  if (!(f.sizes = set_sizes(o, &f.count)) || start_nodes(&f, gshmd, key) || make_set(&f) ||
      (f.device && cuda_ctx(&f, o->to, &f.dst_ctx)))
    goto out;
  printf("gshm-bench pull --fanout %d: %u %s segments, %s (%s), chunk %s, depth %s, "
         "%u streams, %s; %d iteration(s) after 1 warm-up, medians\n",
         o->fanout, f.count, f.device ? o->location : "host",
         gshm__format_size(f.total, sz, sizeof(sz)),
         o->set_count ? "--set" : "--model", o->chunk ? o->chunk : "default",
         o->depth ? o->depth : "default", o->streams, o->encrypt ? "encrypted" : "authenticated",
         n);
  if (o->split)
    printf("split: n1 and n2 pull from n0, n3 half the set from each of them (not a chain)\n");
  if (o->sources)
    printf("sources: node i pulls the set from n0..n(i-1) at once, each segment from the one "
           "with the fewest of its bytes open (not a chain)\n");
  if (!o->no_plain)
    printf("plain TCP: the same segments, send -> recv over %u connections per hop in chunks of "
         "%s, into %s, a process per node%s; chain: each node sends on each chunk as it "
         "lands; apart: every hop sends n0's bytes\n",
         o->streams, gshm__format_size(f.chunk, ck, sizeof(ck)),
         o->recycle ? "memfds written before (as --recycle's pulls land in recycled memory)"
                    : "new memfds",
         o->cpus_per_node ? " on its gshmd's CPUs" : "");
  for (int k = -1; k < n; k++) {
    f.timed = k >= 0;
    f.iter = k;
    if (iteration(&f, v))
      goto out;
    if (k < 0)
      first = v[T_ONE];
    for (int i = 0; k >= 0 && i < T_N; i++)
      t[i][k] = v[i];
  }
  for (int i = 0; i < T_N; i++)
    m[i] = bench_median(t[i], n);
  report(&f, m, first, n, t);
  rc = 0;
out:
  fan_free(&f);
  return rc;
}
