/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench control: control-plane throughput and latency with N clients.
 *
 * For each operation and each N (default 1,2,4,8,16,32,64,128,256), N
 * client processes each connect to gshmd and loop on the operation:
 *   stat         gshm_stat_name of a segment made by the bench (1 request)
 *   open+close   gshm_open (read-write) + gshm_close of a segment made by
 *                the bench: the daemon exports a fresh fd for each open and
 *                it travels with the reply (2 requests).  Nothing is held
 *                between iterations, so libgshm's lease cache never serves
 *                an open; the daemon's gshm_requests_total{op="open",
 *                status="ok"} is read before and after and must have grown
 *                by exactly the opens the clients made.
 *   create+unlink  gshm_create of a 4 KiB host segment, gshm_unlink,
 *                gshm_close (3 requests; the memory goes with the close)
 * All clients run --warmup seconds, then --duration seconds are measured:
 * throughput over all clients, and p50/p99/p999 of the per-iteration
 * latencies (CLOCK_MONOTONIC around each iteration, kept per process in a
 * shared mapping and merged by the parent).  Each point runs --repeat R
 * times (default 3) and the medians are reported.
 *
 * The floor, per N, in the same run: N pairs of processes over
 * SOCK_SEQPACKET Unix sockets, one sending a small request and the other
 * answering with a reply carrying an fd (a memfd dup'ed for each reply, as
 * gshmd's open does); a round trip per iteration.  Also, as a second
 * reference, one epoll echo process answering all N clients (gshmd's
 * shape: one process, one loop).
 *
 * --idle N: hold N idle connections (each said hello), report gshmd's RSS
 * (VmRSS) before and with them, and the latency of stat from one more
 * client meanwhile.
 *
 * It starts its own gshmd (--gshmd PATH, $GSHMD or the build tree's, with
 * --backend host --log-level 4) unless --socket names a running one. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "gshm.h"
#include "gshm.pb-c.h"
#include "spawn.h"
#include "wire.h"

#define MAX_NS 32
#define SAMPLES_TOTAL (8u << 20) /* latency samples kept per point, all clients */
#define FLOOR_REQ_BYTES 48       /* about a stat or open request */
#define FLOOR_REPLY_BYTES 160    /* about a grant reply */
#define IDLE_PER_PROC 2500       /* idle connections per holder process */

enum op { OP_STAT, OP_OPEN, OP_CREATE, OP_FLOOR, OP_FLOOR1, NOPS };

static const char *const op_names[NOPS] = {"stat", "open+close", "create+unlink", "floor",
                                           "floor-1proc"};
static const unsigned op_requests[NOPS] = {1, 2, 3, 1, 1}; /* round trips per iteration */

struct opts {
  unsigned ns[MAX_NS];
  int nns;
  bool run_op[3];
  bool floor;
  double duration, warmup;
  int repeat;
  const char *socket;
  const char *gshmd;
  unsigned idle;
  double idle_duration;
  bool json;
};

/* One client process's results, in the shared mapping. */
struct slot {
  uint64_t iterations; /* measured */
  uint64_t total;      /* warm-up included (the open count check) */
  uint64_t nsamples;
  uint64_t errors;
  int first_error;
};

struct shared {
  _Atomic unsigned ready;
  _Atomic int64_t t_start, t_end; /* CLOCK_MONOTONIC ns; 0 until set */
  _Atomic int go;                 /* 1: run; -1: abort */
  struct slot slots[];
};

struct point {
  double ops_s, p50_us, p99_us, p999_us;
  uint64_t iterations, errors;
  int first_error;
  uint64_t opens; /* all opens made, for the metrics check */
  double daemon_cpu, clients_cpu; /* CPU seconds per wall second in the window (1 = a core) */
};

struct result {
  enum op op;
  unsigned n;
  struct point p;
  double floor_s, floor1_s, floor_p99_us;
  bool opens_checked, opens_ok;
  int64_t opens_delta;
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* CPU time (user + system) of a process, in seconds; -1 when unknown. */
/* CPU seconds of process pid so far (its CPU clock, ns; bench.h), -1
 * where it cannot be read: /proc's 10 ms ticks were 5% of a core over a
 * 0.2 s point, per process, and the clients' are summed. */
static double proc_cpu_s(pid_t pid) { return bench_cpu_s((int)pid); }

static double procs_cpu_s(const pid_t *pids, unsigned n) {
  double sum = 0;
  for (unsigned i = 0; i < n; i++) {
    double v = proc_cpu_s(pids[i]);
    if (v > 0)
      sum += v;
  }
  return sum;
}

static void sleep_until(int64_t t) {
  int64_t d = t - now_ns();
  if (d > 0) {
    struct timespec ts = {d / 1000000000, d % 1000000000};
    nanosleep(&ts, NULL);
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted samples (ns), in microseconds. */
static double pct_us(const uint32_t *s, size_t n, double p) {
  size_t k;
  if (!n)
    return NAN;
  k = (size_t)ceil(p * (double)n);
  k = k ? k - 1 : 0;
  return (double)s[k < n ? k : n - 1] / 1e3;
}

/* ---- the floor: raw SOCK_SEQPACKET ping-pong with an fd in each reply ---- */

static int floor_memfd(void) {
  int fd = memfd_create("gshm-bench-floor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, 4096) < 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
    return -1;
  return fd;
}

/* Answers one request on sock with a reply carrying a fresh dup of memfd.
 * Returns 1 answered, 0 end of stream, -1 nothing to read / error. */
static int floor_answer(int sock, int memfd) {
  uint8_t req[256], reply[FLOOR_REPLY_BYTES];
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } cm;
  struct iovec iov = {reply, sizeof(reply)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                      .msg_controllen = sizeof(cm.buf)};
  struct cmsghdr *c;
  ssize_t n = recv(sock, req, sizeof(req), 0);
  int fd, r;

  if (n <= 0)
    return n == 0 ? 0 : -1;
  memset(reply, 0xab, sizeof(reply));
  memcpy(reply, req, 16); /* echo the "header" */
  if ((fd = fcntl(memfd, F_DUPFD_CLOEXEC, 3)) < 0)
    return -1;
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  r = sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(reply) ? 1 : -1;
  close(fd);
  return r;
}

/* One pair's echoing side: blocking, one socket. */
static void floor_echo(int sock) {
  int memfd = floor_memfd();
  if (memfd < 0)
    _exit(1);
  while (floor_answer(sock, memfd) == 1)
    ;
  _exit(0);
}

/* One process answering every client through epoll (level-triggered; up
 * to 32 packets per socket per wake-up, as gshmd does). */
static void floor_server(int *socks, unsigned n) {
  struct epoll_event evs[256];
  int memfd = floor_memfd(), ep = epoll_create1(EPOLL_CLOEXEC);
  unsigned open_socks = n;

  if (memfd < 0 || ep < 0)
    _exit(1);
  for (unsigned i = 0; i < n; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = socks[i]};
    fcntl(socks[i], F_SETFL, fcntl(socks[i], F_GETFL) | O_NONBLOCK);
    if (epoll_ctl(ep, EPOLL_CTL_ADD, socks[i], &ev) < 0)
      _exit(1);
  }
  while (open_socks) {
    int k = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < k; i++)
      for (int j = 0; j < 32; j++) {
        int r = floor_answer(evs[i].data.fd, memfd);
        if (r == 0) {
          epoll_ctl(ep, EPOLL_CTL_DEL, evs[i].data.fd, NULL);
          close(evs[i].data.fd);
          open_socks--;
        }
        if (r != 1)
          break;
      }
  }
  _exit(0);
}

/* One floor round trip from the client side. */
static int floor_call(int sock, uint32_t seq) {
  uint8_t req[FLOOR_REQ_BYTES], reply[512];
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } cm;
  struct iovec iov = {reply, sizeof(reply)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                      .msg_controllen = sizeof(cm.buf)};
  struct cmsghdr *c;
  ssize_t n;
  int got = 0;

  memset(req, 0x5a, sizeof(req));
  memcpy(req + 8, &seq, sizeof(seq));
  if (send(sock, req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req))
    return -errno;
  n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  if (n <= 0)
    return n == 0 ? -ECONNRESET : -errno;
  for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < nfd; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        close(fd);
        got++;
      }
    }
  if (got != 1 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || memcmp(reply + 8, &seq, 4))
    return -EPROTO;
  return 0;
}

/* ---- client processes ---- */

struct client_ctx {
  enum op op;
  const char *socket;
  const char *name; /* stat/open: the segment; create: a prefix */
  int floor_sock;
};

/* One iteration of the operation; 0 or a negative errno. */
static int one_iteration(struct client_ctx *x, gshm_client_t *c, const char *cname, uint32_t seq) {
  gshm_segment_info_t info;
  gshm_segment_t *s;
  int e;

  switch (x->op) {
  case OP_STAT:
    return gshm_stat_name(c, x->name, &info);
  case OP_OPEN:
    if ((e = gshm_open(c, x->name, GSHM_ACCESS_READ_WRITE, &s)))
      return e;
    if (gshm_segment_fd(s) < 0)
      e = -EBADF;
    gshm_close(s);
    return e;
  case OP_CREATE:
    if ((e = gshm_create(c, cname, 4096, "host", 0600, 0, &s)))
      return e;
    e = gshm_unlink(c, cname);
    gshm_close(s);
    return e;
  case OP_FLOOR:
  case OP_FLOOR1:
    return floor_call(x->floor_sock, seq);
  default:
    return -EINVAL;
  }
}

static void client_main(struct client_ctx *x, struct shared *sh, uint32_t *samples, size_t cap,
                        unsigned idx) {
  struct slot *sl = &sh->slots[idx];
  gshm_client_t *c = NULL;
  char cname[128];
  int64_t t_start, t_end;
  uint32_t seq = 0;
  int e;

  snprintf(cname, sizeof(cname), "%s/%u", x->name, idx);
  if (x->op != OP_FLOOR && x->op != OP_FLOOR1 && (e = gshm_connect(x->socket, "bench", &c))) {
    sl->first_error = e;
    sl->errors++;
    atomic_fetch_add(&sh->ready, 1);
    _exit(1);
  }
  atomic_fetch_add(&sh->ready, 1);
  while (atomic_load(&sh->go) == 0)
    sleep_ms(1);
  if (atomic_load(&sh->go) < 0)
    _exit(1);
  t_start = atomic_load(&sh->t_start);
  t_end = atomic_load(&sh->t_end);
  for (;;) {
    int64_t t0 = now_ns(), t1;
    if (t0 >= t_end)
      break;
    e = one_iteration(x, c, cname, ++seq);
    t1 = now_ns();
    sl->total++;
    if (e) {
      if (!sl->errors++)
        sl->first_error = e;
      if (sl->errors > 1000)
        break;
      continue;
    }
    if (t0 >= t_start) {
      int64_t d = t1 - t0;
      sl->iterations++;
      if (sl->nsamples < cap)
        samples[sl->nsamples++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
    }
  }
  gshm_disconnect(c);
  _exit(0);
}

static int wait_children(pid_t *pids, unsigned n) {
  int bad = 0;
  for (unsigned i = 0; i < n; i++) {
    int status;
    if (pids[i] <= 0)
      continue;
    while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR)
      ;
    if (!WIFEXITED(status) || WEXITSTATUS(status))
      bad++;
  }
  return bad;
}

/* Runs one point: N clients of op for warmup + duration seconds. */
static pid_t daemon_pid; /* for the CPU columns; 0 when unknown */

static int run_point(const struct opts *o, enum op op, unsigned n, const char *segname,
                     struct point *pt) {
  size_t cap = SAMPLES_TOTAL / n;
  size_t shsize = sizeof(struct shared) + sizeof(struct slot) * n;
  size_t bytes = shsize + sizeof(uint32_t) * SAMPLES_TOTAL;
  struct shared *sh;
  uint32_t *samples, *all;
  pid_t *pids = calloc(n * 2 + 1, sizeof(*pids));
  int *socks = calloc(n, sizeof(int)); /* floor-1proc: the server's ends */
  unsigned npids = 0;
  size_t total = 0;
  uint64_t iters = 0, opens = 0, errors = 0;
  int first_error = 0, e = 0;
  int64_t deadline;
  double d0 = -1, d1 = -1, c0 = 0, c1 = 0;

  shsize = (shsize + 63) & ~(size_t)63;
  sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED || !pids || !socks) {
    free(pids);
    free(socks);
    return -ENOMEM;
  }
  samples = (uint32_t *)((char *)sh + shsize);
  for (unsigned i = 0; i < n; i++) {
    struct client_ctx x = {.op = op, .socket = o->socket, .name = segname, .floor_sock = -1};
    int sv[2] = {-1, -1};
    pid_t pid;
    if ((op == OP_FLOOR || op == OP_FLOOR1) &&
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
      e = -errno;
      break;
    }
    if (op == OP_FLOOR) {
      if ((pid = fork()) == 0) {
        close(sv[0]);
        floor_echo(sv[1]);
      }
      if (pid > 0)
        pids[npids++] = pid;
      close(sv[1]);
    } else if (op == OP_FLOOR1) {
      socks[i] = sv[1];
    }
    x.floor_sock = sv[0];
    if ((pid = fork()) == 0)
      client_main(&x, sh, samples + cap * i, cap, i);
    if (pid < 0) {
      e = -errno;
      break;
    }
    pids[npids++] = pid;
    if (sv[0] >= 0)
      close(sv[0]);
  }
  if (op == OP_FLOOR1 && !e) {
    pid_t pid = fork();
    if (pid == 0)
      floor_server(socks, n);
    if (pid > 0)
      pids[npids++] = pid;
    for (unsigned i = 0; i < n; i++)
      close(socks[i]);
  }
  /* Everyone connected (or failed), then a common start and end. */
  deadline = now_ns() + 60 * (int64_t)1000000000;
  while (!e && atomic_load(&sh->ready) < n && now_ns() < deadline)
    sleep_ms(1);
  if (e || atomic_load(&sh->ready) < n) {
    atomic_store(&sh->go, -1);
    e = e ? e : -ETIMEDOUT;
  } else {
    int64_t t0 = now_ns() + (int64_t)(o->warmup * 1e9);
    atomic_store(&sh->t_start, t0);
    atomic_store(&sh->t_end, t0 + (int64_t)(o->duration * 1e9));
    atomic_store(&sh->go, 1);
    /* CPU of the daemon (or the floor's echoers) and of the clients over
     * the measured window, from /proc. */
    sleep_until(t0);
    d0 = op == OP_FLOOR || op == OP_FLOOR1 ? 0 : proc_cpu_s(daemon_pid);
    c0 = procs_cpu_s(pids, npids);
    sleep_until(t0 + (int64_t)(o->duration * 1e9));
    d1 = op == OP_FLOOR || op == OP_FLOOR1 ? 0 : proc_cpu_s(daemon_pid);
    c1 = procs_cpu_s(pids, npids);
  }
  wait_children(pids, npids);

  for (unsigned i = 0; i < n; i++)
    total += sh->slots[i].nsamples;
  all = malloc(sizeof(*all) * (total ? total : 1));
  total = 0;
  for (unsigned i = 0; all && i < n; i++) {
    struct slot *sl = &sh->slots[i];
    memcpy(all + total, samples + cap * i, sizeof(*all) * sl->nsamples);
    total += sl->nsamples;
    iters += sl->iterations;
    opens += sl->total;
    errors += sl->errors;
    if (sl->errors && !first_error)
      first_error = sl->first_error;
  }
  if (all) {
    qsort(all, total, sizeof(*all), cmp_u32);
    pt->ops_s = (double)iters / o->duration;
    pt->p50_us = pct_us(all, total, 0.50);
    pt->p99_us = pct_us(all, total, 0.99);
    pt->p999_us = pct_us(all, total, 0.999);
    pt->iterations = iters;
    pt->errors = errors;
    pt->first_error = first_error;
    pt->opens = opens;
    pt->daemon_cpu = d0 >= 0 && d1 >= 0 ? (d1 - d0) / o->duration : NAN;
    pt->clients_cpu = (c1 - c0) / o->duration;
  } else if (!e) {
    e = -ENOMEM;
  }
  free(all);
  free(pids);
  free(socks);
  munmap(sh, bytes);
  return e;
}

/* Medians over repeats of each field (ops/s and each percentile alone). */
static int run_point_repeated(const struct opts *o, enum op op, unsigned n, const char *segname,
                              struct point *out) {
  double v[6][16];
  int reps = o->repeat, e; /* 1..16 (parse_opts) */
  struct point p;

  memset(out, 0, sizeof(*out));
  for (int r = 0; r < reps; r++) {
    memset(&p, 0, sizeof(p));
    if ((e = run_point(o, op, n, segname, &p)))
      return e;
    v[0][r] = p.ops_s;
    v[1][r] = p.p50_us;
    v[2][r] = p.p99_us;
    v[3][r] = p.p999_us;
    v[4][r] = p.daemon_cpu;
    v[5][r] = p.clients_cpu;
    out->iterations += p.iterations;
    out->errors += p.errors;
    out->opens += p.opens;
    if (!out->first_error)
      out->first_error = p.first_error;
  }
  out->ops_s = bench_median(v[0], reps); /* of two middle ones their mean, not the upper */
  out->p50_us = bench_median(v[1], reps);
  out->p99_us = bench_median(v[2], reps);
  out->p999_us = bench_median(v[3], reps);
  out->daemon_cpu = bench_median(v[4], reps);
  out->clients_cpu = bench_median(v[5], reps);
  return 0;
}

/* ---- the daemon's counters ---- */

/* Value of gshm_requests_total with op="<op>" and status="ok" in the
 * Prometheus text (any label order); -1 when the series is absent. */
static int64_t metric_requests_ok(const char *text, const char *op) {
  char want_op[64];
  const char *line = text;

  snprintf(want_op, sizeof(want_op), "op=\"%s\"", op);
  while (line && *line) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[512];
    if (len < sizeof(buf)) {
      memcpy(buf, line, len);
      buf[len] = '\0';
      if (!strncmp(buf, "gshm_requests_total{", 20) && strstr(buf, want_op) &&
          strstr(buf, "status=\"ok\"")) {
        char *close_brace = strrchr(buf, '}');
        if (close_brace)
          return (int64_t)strtod(close_brace + 1, NULL);
      }
    }
    line = end ? end + 1 : NULL;
  }
  return 0; /* no series yet: nothing counted */
}

static int64_t read_opens(gshm_client_t *c) {
  char *text = NULL;
  int64_t v;
  if (gshm_metrics(c, &text))
    return -1;
  v = metric_requests_ok(text, "open");
  gshm_free(text);
  return v;
}

/* ---- idle connections ---- */

/* Opens n raw connections that each say hello, then waits for EOF on
 * ctl (the parent's "let go").  Reports how many it holds through ok. */
static void idle_holder(const char *path, unsigned n, int ctl, _Atomic unsigned *ok) {
  Gshm__Hello m = GSHM__HELLO__INIT;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  static uint8_t pkt[512], rx[GSHM_WIRE_MAX_PACKET + 1];
  int *fds = calloc(n, sizeof(int));
  size_t len;
  char byte;

  m.major = GSHM_PROTO_MAJOR;
  m.minor = GSHM_PROTO_MINOR;
  m.client_name = "bench-idle";
  if (!fds || gshm__wire_pack(GSHM_WIRE_HELLO, 1, &m.base, pkt, sizeof(pkt), &len))
    _exit(1);
  if (strlen(path) >= sizeof(sa.sun_path))
    _exit(1);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  for (unsigned i = 0; i < n; i++) {
    fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        gshm__wire_sendmsg(fds[i], pkt, len, -1))
      _exit(2);
  }
  /* Hellos are all out; now the welcomes. */
  for (unsigned i = 0; i < n; i++) {
    struct gshm_wire_header h;
    int nfds = 0, rfds[4];
    ssize_t k = gshm__wire_recv(fds[i], rx, sizeof(rx), rfds, 4, &nfds, 0);
    Gshm__Reply *r;
    if (k <= 0 || gshm__wire_parse_header(rx, (size_t)k, &h) ||
        h.type != (GSHM_WIRE_HELLO | GSHM_WIRE_REPLY) ||
        !(r = gshm__reply__unpack(NULL, h.length, rx + GSHM_WIRE_HEADER_SIZE)))
      _exit(3);
    if (r->status != GSHM__STATUS__STATUS_OK)
      _exit(4);
    gshm__reply__free_unpacked(r, NULL);
    atomic_fetch_add(ok, 1);
  }
  while (read(ctl, &byte, 1) < 0 && errno == EINTR)
    ;
  _exit(0);
}

struct idle_result {
  unsigned held;
  long rss_before_kib, rss_idle_kib;
  struct point stat;
  int error;
};

static int run_idle(const struct opts *o, const char *segname, struct idle_result *ir) {
  unsigned nproc = (o->idle + IDLE_PER_PROC - 1) / IDLE_PER_PROC, started = 0;
  _Atomic unsigned *ok = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                              -1, 0);
  pid_t *pids = calloc(nproc + 1, sizeof(*pids));
  int ctl[2];
  int64_t deadline;
  struct opts so = *o;
  int e = 0;

  memset(ir, 0, sizeof(*ir));
  if (ok == MAP_FAILED || !pids || pipe2(ctl, O_CLOEXEC) < 0)
    return -ENOMEM;
  ir->rss_before_kib = gshm__proc_rss_kib(daemon_pid);
  for (unsigned i = 0; i < nproc; i++) {
    unsigned n = i + 1 < nproc ? IDLE_PER_PROC : o->idle - IDLE_PER_PROC * (nproc - 1);
    pid_t pid = fork();
    if (pid == 0) {
      close(ctl[1]);
      idle_holder(o->socket, n, ctl[0], ok);
    }
    if (pid < 0) {
      e = -errno;
      break;
    }
    pids[started++] = pid;
  }
  close(ctl[0]);
  deadline = now_ns() + 120 * (int64_t)1000000000;
  while (!e && atomic_load(ok) < o->idle && now_ns() < deadline) {
    int status;
    for (unsigned i = 0; i < started; i++)
      if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        pids[i] = 0;
        e = -ECONNREFUSED; /* a holder gave up: gshmd refused or hung up */
      }
    sleep_ms(5);
  }
  ir->held = atomic_load(ok);
  if (!e && ir->held < o->idle)
    e = -ETIMEDOUT;
  sleep_ms(200); /* let gshmd settle before reading its RSS */
  ir->rss_idle_kib = gshm__proc_rss_kib(daemon_pid);
  if (!e) {
    so.duration = o->idle_duration;
    e = run_point_repeated(&so, OP_STAT, 1, segname, &ir->stat);
  }
  close(ctl[1]);
  wait_children(pids, started);
  munmap((void *)ok, 4096);
  free(pids);
  ir->error = e;
  return e;
}

/* ---- output ---- */

static void fmt_rate(char *b, size_t cap, double v) {
  if (isnan(v) || v <= 0)
    snprintf(b, cap, "-");
  else
    snprintf(b, cap, "%.0f", v);
}

static void print_table(const struct opts *o, const struct result *res, int nres) {
  printf("| op | N | ops/s | req/s | p50 µs | p99 µs | p999 µs | floor rt/s | floor p99 µs | "
         "req/s ÷ floor | "
         "1-proc floor rt/s | gshmd CPU | gshmd µs/req | clients CPU |\n");
  printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int i = 0; i < nres; i++) {
    const struct result *r = &res[i];
    double req = r->p.ops_s * op_requests[r->op];
    char a[32], b[32], f[32], f1[32], ratio[32];
    fmt_rate(a, sizeof(a), r->p.ops_s);
    fmt_rate(b, sizeof(b), req);
    fmt_rate(f, sizeof(f), r->floor_s);
    fmt_rate(f1, sizeof(f1), r->floor1_s);
    if (r->floor_s > 0)
      snprintf(ratio, sizeof(ratio), "%.2f", req / r->floor_s);
    else
      snprintf(ratio, sizeof(ratio), "-");
    printf("| %s | %u | %s | %s | %.1f | %.1f | %.1f | %s | %.1f | %s | %s | %.0f%% | %.1f | "
           "%.0f%% |\n",
           op_names[r->op], r->n, a, b, r->p.p50_us, r->p.p99_us, r->p.p999_us, f,
           r->floor_p99_us, ratio, f1,
           r->p.daemon_cpu * 100, req > 0 ? r->p.daemon_cpu * 1e6 / req : NAN,
           r->p.clients_cpu * 100);
  }
  (void)o;
}

static void print_notes(const struct result *res, int nres) {
  printf("\n");
  for (int i = 0; i < nres; i++) {
    const struct result *r = &res[i];
    if (r->p.errors)
      printf("%s N=%u: %" PRIu64 " failed iterations (first: %s)\n", op_names[r->op], r->n,
             r->p.errors, gshm_strerror(r->p.first_error));
    if (r->opens_checked)
      printf("open+close N=%u: daemon counted %" PRId64 " opens, clients made %" PRIu64 " (%s)\n",
             r->n, r->opens_delta, r->p.opens, r->opens_ok ? "every open was a round trip" :
                                                             "MISMATCH");
  }
}

/* A JSON number, or null for NaN/Inf. */
static const char *jnum(char *buf, size_t cap, double v) {
  if (!isfinite(v))
    snprintf(buf, cap, "null");
  else
    snprintf(buf, cap, "%.3f", v);
  return buf;
}

static void print_json(const struct opts *o, const struct result *res, int nres,
                       const struct idle_result *ir) {
  char b[10][32];

  printf("{\"schema_version\":1,\"duration_s\":%.3f,\"warmup_s\":%.3f,\"repeat\":%d,"
         "\"nproc\":%ld,\"points\":[",
         o->duration, o->warmup, o->repeat, sysconf(_SC_NPROCESSORS_ONLN));
  for (int i = 0; i < nres; i++) {
    const struct result *r = &res[i];
    printf("%s{\"op\":\"%s\",\"n\":%u,\"ops_s\":%s,\"requests_s\":%s,\"p50_us\":%s,"
           "\"p99_us\":%s,\"p999_us\":%s,\"floor_rt_s\":%s,\"floor_p99_us\":%s,"
           "\"floor_1proc_rt_s\":%s,\"gshmd_cpu\":%s,\"clients_cpu\":%s,\"errors\":%" PRIu64,
           i ? "," : "", op_names[r->op], r->n, jnum(b[0], 32, r->p.ops_s),
           jnum(b[1], 32, r->p.ops_s * op_requests[r->op]), jnum(b[2], 32, r->p.p50_us),
           jnum(b[3], 32, r->p.p99_us), jnum(b[4], 32, r->p.p999_us),
           jnum(b[5], 32, o->floor ? r->floor_s : NAN), jnum(b[6], 32, r->floor_p99_us),
           jnum(b[7], 32, o->floor ? r->floor1_s : NAN), jnum(b[8], 32, r->p.daemon_cpu),
           jnum(b[9], 32, r->p.clients_cpu), r->p.errors);
    if (r->opens_checked)
      printf(",\"opens_counted\":%" PRId64 ",\"opens_made\":%" PRIu64, r->opens_delta, r->p.opens);
    printf("}");
  }
  printf("]");
  if (ir)
    printf(",\"idle\":{\"connections\":%u,\"gshmd_rss_before_kib\":%ld,\"gshmd_rss_kib\":%ld,"
           "\"stat_ops_s\":%s,\"stat_p50_us\":%s,\"stat_p99_us\":%s,\"stat_p999_us\":%s,"
           "\"error\":%d}",
           ir->held, ir->rss_before_kib, ir->rss_idle_kib, jnum(b[0], 32, ir->stat.ops_s),
           jnum(b[1], 32, ir->stat.p50_us), jnum(b[2], 32, ir->stat.p99_us),
           jnum(b[3], 32, ir->stat.p999_us), ir->error);
  printf("}\n");
}

/* ---- options ---- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: gshm-bench control [options]\n"
          "  --clients LIST    client counts, comma-separated (default "
          "1,2,4,8,16,32,64,128,256)\n"
          "  --ops LIST        stat,open,create (default all three)\n"
          "  --duration SEC    measured seconds per point (default 2)\n"
          "  --warmup SEC      warm-up seconds per point, all clients busy (default 0.5)\n"
          "  --repeat R        runs per point, 1 to 16; medians reported (default 3)\n"
          "  --no-floor        skip the raw ping-pong floors\n"
          "  --idle N          also hold N idle connections and measure stat meanwhile;\n"
          "                    --idle N alone (no --clients/--ops) runs only that\n"
          "  --idle-duration SEC  stat measuring time with the idle connections (default 2)\n"
          "  --socket PATH     use a running gshmd instead of starting one\n"
          "  --gshmd PATH      gshmd to start (default $GSHMD, else next to gshm-bench)\n"
          "  --json            JSON instead of the Markdown table\n");
}

static int parse_list(const char *s, unsigned *out, int max) {
  int n = 0;
  char *end;
  while (*s && n < max) {
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || v == 0 || v > 4096)
      return -1;
    out[n++] = (unsigned)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      return -1;
  }
  return n;
}

static int parse_opts(int argc, char **argv, struct opts *o) {
  static const struct option lo[] = {
      {"clients", required_argument, NULL, 'n'}, {"ops", required_argument, NULL, 'o'},
      {"duration", required_argument, NULL, 'd'}, {"warmup", required_argument, NULL, 'w'},
      {"repeat", required_argument, NULL, 'r'},  {"no-floor", no_argument, NULL, 'F'},
      {"idle", required_argument, NULL, 'i'},    {"idle-duration", required_argument, NULL, 'D'},
      {"socket", required_argument, NULL, 's'},  {"gshmd", required_argument, NULL, 'g'},
      {"json", no_argument, NULL, 'j'},          {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  static const unsigned defaults[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  bool clients_given = false, ops_given = false;
  unsigned char seen[256] = {0};
  int ch;

  memset(o, 0, sizeof(*o));
  o->duration = 2;
  o->warmup = 0.5;
  o->repeat = 3; /* medians over repeated runs, as every figure of the bench's */
  o->floor = true;
  o->idle_duration = 2;
  o->run_op[0] = o->run_op[1] = o->run_op[2] = true;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    bench_opt_once("control", lo, ch, seen);
    switch (ch) {
    case 'n':
      if ((o->nns = parse_list(optarg, o->ns, MAX_NS)) <= 0) {
        fprintf(stderr, "gshm-bench control: bad --clients '%s'\n", optarg);
        return 2;
      }
      clients_given = true;
      break;
    case 'o': {
      char *dup = strdup(optarg), *save = NULL;
      o->run_op[0] = o->run_op[1] = o->run_op[2] = false;
      for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "stat"))
          o->run_op[OP_STAT] = true;
        else if (!strcmp(t, "open") || !strcmp(t, "open+close"))
          o->run_op[OP_OPEN] = true;
        else if (!strcmp(t, "create") || !strcmp(t, "create+unlink"))
          o->run_op[OP_CREATE] = true;
        else {
          fprintf(stderr, "gshm-bench control: unknown op '%s'\n", t);
          free(dup);
          return 2;
        }
      }
      free(dup);
      ops_given = true;
      break;
    }
    case 'd':
      o->duration = atof(optarg);
      break;
    case 'w':
      o->warmup = atof(optarg);
      break;
    case 'r':
      if ((o->repeat = bench_int_arg("control", "--repeat", optarg, 1)) > 16) {
        fprintf(stderr, "gshm-bench control: --repeat takes 1 to 16\n"); /* v[6][16] */
        return 2;
      }
      break;
    case 'F':
      o->floor = false;
      break;
    case 'i':
      o->idle = (unsigned)strtoul(optarg, NULL, 10);
      break;
    case 'D':
      o->idle_duration = atof(optarg);
      break;
    case 's':
      o->socket = optarg;
      break;
    case 'g':
      o->gshmd = optarg;
      break;
    case 'j':
      o->json = true;
      break;
    case 'h':
      usage(stdout);
      return 1;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (o->duration <= 0 || o->warmup < 0 || o->idle_duration <= 0) {
    fprintf(stderr, "gshm-bench control: durations must be positive\n");
    return 2;
  }
  if (!clients_given) {
    o->nns = (int)(sizeof(defaults) / sizeof(defaults[0]));
    memcpy(o->ns, defaults, sizeof(defaults));
    if (o->idle && !ops_given)
      o->nns = 0; /* --idle alone */
  }
  return 0;
}

/* Raises the soft fd limit to the hard one (gshmd, started after this,
 * inherits it and needs one fd per idle connection). */
static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int bench_control_main(int argc, char **argv) {
  static struct gshm_spawn sp;
  static struct result res[MAX_NS * 3];
  struct idle_result ir;
  struct opts o;
  gshm_client_t *admin = NULL;
  gshm_segment_t *seg_stat = NULL, *seg_open = NULL;
  gshm_status_info_t st;
  bool spawned = false;
  char maxconn[64];
  int nres = 0, rc = 1, e;

  if ((e = parse_opts(argc, argv, &o)))
    return e == 1 ? 0 : e;
  signal(SIGPIPE, SIG_IGN);
  raise_nofile();
  if (!o.socket) {
    const char *args[] = {"--backend", "host", "--log-level", "4", "--set", maxconn,
                          "--set", "quota.connections=0", NULL};
    snprintf(maxconn, sizeof(maxconn), "limits.max_connections=%u", o.idle + 1024);
    if ((e = gshm__spawn_init(&sp))) {
      fprintf(stderr, "gshm-bench control: %s\n", strerror(-e));
      return 1;
    }
    if ((e = gshm__spawn_start(&sp, o.gshmd ? o.gshmd : gshm__find_gshmd(), args, false,
                               20000))) {
      fprintf(stderr, "gshm-bench control: gshmd did not start: %s\n", strerror(-e));
      gshm__spawn_cleanup(&sp);
      return 1;
    }
    spawned = true;
    o.socket = sp.socket_path;
  }
  if ((e = gshm_connect(o.socket, "bench-control", &admin)) || (e = gshm_status(admin, &st))) {
    fprintf(stderr, "gshm-bench control: %s: %s\n", o.socket, gshm_strerror(e));
    goto out;
  }
  daemon_pid = st.pid; /* meaningful when gshmd runs in this pid namespace */
  /* The segments stat and open work on; held here so they stay. */
  gshm_unlink(admin, "bench/control/stat");
  gshm_unlink(admin, "bench/control/open");
  if ((e = gshm_create(admin, "bench/control/stat", 4096, "host", 0666, 0, &seg_stat)) ||
      (e = gshm_create(admin, "bench/control/open", 4096, "host", 0666, 0, &seg_open))) {
    fprintf(stderr, "gshm-bench control: create: %s (%s)\n", gshm_strerror(e),
                    gshm_last_error(admin));
    goto out;
  }

  for (int i = 0; i < o.nns; i++) {
    unsigned n = o.ns[i];
    struct point fp = {0}, fp1 = {0};
    if (o.floor) {
      if ((e = run_point_repeated(&o, OP_FLOOR, n, "", &fp)) ||
          (e = run_point_repeated(&o, OP_FLOOR1, n, "", &fp1)))
        fprintf(stderr, "gshm-bench control: floor N=%u: %s\n", n, strerror(-e));
    }
    for (int op = 0; op < 3; op++) {
      struct result *r;
      int64_t before = -1, after = -1;
      const char *name = op == OP_STAT   ? "bench/control/stat"
                         : op == OP_OPEN ? "bench/control/open"
                                         : "bench/control/c";
      if (!o.run_op[op])
        continue;
      r = &res[nres++];
      memset(r, 0, sizeof(*r));
      r->op = (enum op)op;
      r->n = n;
      r->floor_s = fp.ops_s;
      r->floor1_s = fp1.ops_s;
      r->floor_p99_us = o.floor ? fp.p99_us : NAN;
      if (op == OP_OPEN)
        before = read_opens(admin);
      if ((e = run_point_repeated(&o, (enum op)op, n, name, &r->p)))
        fprintf(stderr, "gshm-bench control: %s N=%u: %s\n", op_names[op], n, strerror(-e));
      if (op == OP_OPEN) {
        after = read_opens(admin);
        r->opens_checked = before >= 0 && after >= 0;
        r->opens_delta = after - before;
        r->opens_ok = r->opens_checked && (uint64_t)r->opens_delta == r->p.opens;
      }
      if (!o.json)
        fprintf(stderr, "%s N=%u: %.0f ops/s, p99 %.1f µs (floor %.0f rt/s)\n", op_names[op], n,
                r->p.ops_s, r->p.p99_us, r->floor_s);
    }
  }

  if (o.idle) {
    e = run_idle(&o, "bench/control/stat", &ir);
    if (e)
      fprintf(stderr, "gshm-bench control: idle: %s (held %u of %u)\n", strerror(-e), ir.held,
              o.idle);
  }
  if (o.json) {
    print_json(&o, res, nres, o.idle ? &ir : NULL);
  } else {
    if (nres) {
      print_table(&o, res, nres);
      print_notes(res, nres);
    }
    if (o.idle)
      printf("idle: %u connections held; gshmd RSS %.1f MiB (%.1f MiB before, %.2f KiB per "
             "connection); stat from another client meanwhile: %.0f ops/s, p50 %.1f µs, p99 "
             "%.1f µs, p999 %.1f µs\n",
             ir.held, ir.rss_idle_kib / 1024.0, ir.rss_before_kib / 1024.0,
             ir.held ? (double)(ir.rss_idle_kib - ir.rss_before_kib) / ir.held : 0.0,
             ir.stat.ops_s, ir.stat.p50_us, ir.stat.p99_us, ir.stat.p999_us);
  }
  rc = 0;
  for (int i = 0; i < nres; i++) {
    if (res[i].opens_checked && !res[i].opens_ok)
      rc = 1;
    if (res[i].p.errors) { /* a failed iteration is a failed run, whatever the table says */
      fprintf(stderr, "gshm-bench control: %s N=%u: %" PRIu64 " failed iterations (first: %s)\n",
              op_names[res[i].op], res[i].n, res[i].p.errors, gshm_strerror(res[i].p.first_error));
      rc = 1;
    }
  }
  if (o.idle && ir.error)
    rc = 1;

out:
  gshm_close(seg_stat);
  gshm_close(seg_open);
  if (admin) {
    gshm_unlink(admin, "bench/control/stat");
    gshm_unlink(admin, "bench/control/open");
  }
  gshm_disconnect(admin);
  if (spawned)
    gshm__spawn_cleanup(&sp);
  return rc;
}
