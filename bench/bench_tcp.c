/* SPDX-License-Identifier: Apache-2.0 */
/* Plain TCP anchors for gshm-bench pull (bench_tcp.h): the bytes of a
 * pull, or of a fan-out along a chain of nodes, moved by send -> recv
 * over as many connections as the pull's lanes, into new memfd memory
 * as a pull lands in, with nothing of gshm in the way (no frames, no
 * authentication, no daemon).  What a pull costs over one of these is
 * gshm's; what these cost is the host's. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "bench_pull.h"
#include "bench_tcp.h"

#define TCP_MAX_LANES 16
#define CHAIN_MAX_HOPS 16
#define CHAIN_WAIT_MS 300000 /* a node that says nothing for this long failed */

uint8_t *bench_fresh_memfd(uint64_t size) {
  int fd = memfd_create("gshm-bench-tcp", MFD_CLOEXEC);
  uint8_t *p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)size) == 0)
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) /* as gshmd asks for its (daemon.host_huge_pages) */
    (void)madvise(p, size, MADV_HUGEPAGE);
  if (fd >= 0)
    close(fd);
  return p == MAP_FAILED ? NULL : p;
}

unsigned bench_node_cpus(unsigned k, unsigned n, cpu_set_t *set_out) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned m = (unsigned)(ncpu > 0 ? ncpu : 1), first = (k * n) % m;

  CPU_ZERO(set_out);
  for (unsigned i = 0; i < n; i++)
    CPU_SET((first + i) % m, set_out);
  return first;
}

/* All len bytes of p sent on fd (at most 1 GiB a call); 0 or -1. */
static int send_all(int fd, const uint8_t *p, uint64_t len) {
  while (len) {
    ssize_t w = send(fd, p, len > (1u << 30) ? (1u << 30) : len, MSG_NOSIGNAL);
    if (w <= 0) {
      if (w < 0 && errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    len -= (uint64_t)w;
  }
  return 0;
}

/* All len bytes received from fd into p; 0 or -1 (EOF included). */
static int recv_all(int fd, uint8_t *p, uint64_t len) {
  while (len) {
    ssize_t r = recv(fd, p, len > (1u << 30) ? (1u << 30) : len, 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR)
        continue;
      return -1;
    }
    p += r;
    len -= (uint64_t)r;
  }
  return 0;
}

/* A listening socket on 127.0.0.1 (its address in *sa), or -1. */
static int tcp_listen(struct sockaddr_in *sa) {
  socklen_t len = sizeof(*sa);
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (lfd >= 0 && (bind(lfd, (struct sockaddr *)sa, sizeof(*sa)) || listen(lfd, 16) ||
                   getsockname(lfd, (struct sockaddr *)sa, &len))) {
    close(lfd);
    lfd = -1;
  }
  return lfd;
}

/* One connection to lfd: its two ends in *sfd and *rfd.  0 or -1 (none
 * left open). */
static int tcp_pair(int lfd, const struct sockaddr_in *sa, int *sfd, int *rfd) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r = -1;

  if (s >= 0 && connect(s, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
    r = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (r < 0) {
    if (s >= 0)
      close(s);
    return -1;
  }
  *sfd = s;
  *rfd = r;
  return 0;
}

/* One connection of bench_tcp_once: a sender and a receiver thread
 * moving [off, off + len) of src into dst. */
struct tcp_lane {
  int sfd, rfd;
  const uint8_t *src;
  uint8_t *dst;
  uint64_t len;
  int serr, rerr;
  pthread_t st, rt;
  struct tcp_gate *gate;
};

/* bench_tcp_once's threads wait here until all are up: the clock starts
 * then (a pull's lane threads are up before it begins, too). */
struct tcp_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned up; /* threads waiting */
  int state;   /* 0 wait, 1 go, -1 give up */
};

static bool gate_pass(struct tcp_gate *g) {
  int st;
  pthread_mutex_lock(&g->mu);
  g->up++;
  pthread_cond_broadcast(&g->cv);
  while (!(st = g->state))
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  return st > 0;
}

/* Waits until `up` threads wait (state 1) or at once (state -1), then
 * lets them go with that state. */
static void gate_open(struct tcp_gate *g, unsigned up, int state) {
  pthread_mutex_lock(&g->mu);
  while (state > 0 && g->up < up)
    pthread_cond_wait(&g->cv, &g->mu);
  g->state = state;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void *tcp_tx_thread(void *arg) {
  struct tcp_lane *t = arg;
  t->serr = gate_pass(t->gate) ? send_all(t->sfd, t->src, t->len) : -1;
  return NULL;
}

static void *tcp_rx_thread(void *arg) {
  struct tcp_lane *t = arg;
  t->rerr = gate_pass(t->gate) ? recv_all(t->rfd, t->dst, t->len) : -1;
  return NULL;
}

double bench_tcp_once(const uint8_t *src, uint8_t *dst, uint64_t size, unsigned k) {
  struct sockaddr_in sa;
  int lfd = tcp_listen(&sa);
  uint8_t *mem = dst ? dst : bench_fresh_memfd(size);
  struct tcp_lane t[TCP_MAX_LANES];
  struct tcp_gate gate = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  uint64_t per = (size / k + 4095) & ~4095ull;
  unsigned made = 0, started = 0;
  double t0, el = -1;
  int bad = 0;

  memset(t, 0, sizeof(t));
  if (!mem || lfd < 0 || k < 1 || k > TCP_MAX_LANES)
    goto out;
  for (; made < k; made++) {
    uint64_t off = per * made;
    if (tcp_pair(lfd, &sa, &t[made].sfd, &t[made].rfd))
      goto out;
    t[made].src = src + (off < size ? off : size);
    t[made].dst = mem + (off < size ? off : size);
    t[made].len = off >= size ? 0 : size - off < per ? size - off : per;
  }
  for (; started < 2 * k; started++) {
    struct tcp_lane *l = &t[started / 2];
    l->gate = &gate;
    if (pthread_create(started % 2 ? &l->st : &l->rt, NULL,
                       started % 2 ? tcp_tx_thread : tcp_rx_thread, l))
      break;
  }
  gate_open(&gate, started, started == 2 * k ? 1 : -1);
  t0 = bench_now_s();
  for (unsigned i = 0; i < started; i++) {
    pthread_join(i % 2 ? t[i / 2].st : t[i / 2].rt, NULL);
    bad |= i % 2 ? t[i / 2].serr : t[i / 2].rerr;
  }
  if (started == 2 * k && !bad)
    el = bench_now_s() - t0;
out:
  for (unsigned i = 0; i < made; i++) {
    close(t[i].sfd);
    close(t[i].rfd);
  }
  if (lfd >= 0)
    close(lfd);
  if (mem && !dst)
    munmap(mem, size);
  return el;
}

/* ---- bench_tcp_chain: one process per node ---- */

/* Bytes [off, off + len) of segment seg. */
struct chain_chunk {
  unsigned seg;
  uint64_t off, len;
};

/* Connection j of a node: receiving hop `node` on rfd, sending hop
 * node + 1 on sfd (-1: not this node's).  landed counts the chunks
 * received, which the sender may forward. */
struct chain_lane {
  struct chain_node *nd;
  unsigned j;
  int rfd, sfd;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t landed; /* under mu */
  bool rx_failed;  /* under mu */
  int rerr, serr;
  pthread_t rt, st;
};

struct chain_node {
  const struct bench_chain_params *p;
  const struct chain_chunk *ck;
  uint64_t nck;
  unsigned node;
  uint8_t **dst; /* node >= 1: its new memfds */
  bool forward;   /* its senders send from dst what its receivers landed */
  struct chain_lane lane[TCP_MAX_LANES];
};

/* What a node's process tells the parent, once per stage. */
enum { CHAIN_READY = 1, CHAIN_DONE, CHAIN_CHECKED };
struct chain_msg {
  int node, stage, err;
  unsigned bad; /* CHAIN_CHECKED: segments that differ from node 0's */
  double t;     /* CHAIN_DONE: when its last byte arrived, bench_now_s() */
};

static void *chain_rx(void *arg) {
  struct chain_lane *l = arg;
  const struct chain_node *nd = l->nd;

  for (uint64_t c = l->j; c < nd->nck; c += nd->p->lanes) {
    const struct chain_chunk *k = &nd->ck[c];
    int e = recv_all(l->rfd, nd->dst[k->seg] + k->off, k->len);
    pthread_mutex_lock(&l->mu);
    if (e)
      l->rx_failed = true;
    else
      l->landed++;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if ((l->rerr = e))
      break;
  }
  return NULL;
}

static void *chain_tx(void *arg) {
  struct chain_lane *l = arg;
  const struct chain_node *nd = l->nd;
  uint64_t i = 0;

  for (uint64_t c = l->j; c < nd->nck; c += nd->p->lanes, i++) {
    const struct chain_chunk *k = &nd->ck[c];
    const uint8_t *from = nd->forward ? nd->dst[k->seg] : (const uint8_t *)nd->p->src[k->seg];
    bool ok = true;
    if (nd->forward) {
      pthread_mutex_lock(&l->mu);
      while (l->landed <= i && !l->rx_failed)
        pthread_cond_wait(&l->cv, &l->mu);
      ok = l->landed > i;
      pthread_mutex_unlock(&l->mu);
    }
    if (!ok || send_all(l->sfd, from + k->off, k->len)) {
      l->serr = -1;
      break;
    }
  }
  return NULL;
}

/* The node's receive and send threads, started together, then joined;
 * *t_out: when the receivers ended.  0 or -1 (a connection failed, or a
 * thread did not start). */
static int node_move(struct chain_node *nd, double *t_out) {
  int bad = 0;

  for (unsigned j = 0; j < nd->p->lanes; j++) {
    struct chain_lane *l = &nd->lane[j];
    if ((l->rfd >= 0 && pthread_create(&l->rt, NULL, chain_rx, l)) ||
        (l->sfd >= 0 && pthread_create(&l->st, NULL, chain_tx, l)))
      return -1; /* the process exits: the peers see the connections close */
  }
  for (unsigned j = 0; j < nd->p->lanes; j++)
    if (nd->lane[j].rfd >= 0) {
      pthread_join(nd->lane[j].rt, NULL);
      bad |= nd->lane[j].rerr;
    }
  *t_out = bench_now_s();
  for (unsigned j = 0; j < nd->p->lanes; j++)
    if (nd->lane[j].sfd >= 0) {
      pthread_join(nd->lane[j].st, NULL);
      bad |= nd->lane[j].serr;
    }
  return bad ? -1 : 0;
}

static void node_say(int res_w, struct chain_msg *m, int stage) {
  m->stage = stage;
  if (write(res_w, m, sizeof(*m)) != (ssize_t)sizeof(*m))
    _exit(1);
}

/* A node's process: pinned, its new memfds made, ready; on the parent's
 * go (go_r closed) moves its bytes, done; on the next (check_r closed)
 * compares its copy with node 0's, checked.  Never returns. */
static void node_main(struct chain_node *nd, int go_r, int check_r, int res_w) {
  const struct bench_chain_params *p = nd->p;
  struct chain_msg m = {.node = (int)nd->node};
  char b;

  if (p->cpus_per_node) {
    cpu_set_t set;
    bench_node_cpus(nd->node, p->cpus_per_node, &set);
    if (sched_setaffinity(0, sizeof(set), &set))
      m.err = -errno;
  }
  for (unsigned s = 0; nd->node > 0 && s < p->count && !m.err; s++)
    if (!(nd->dst[s] = bench_fresh_memfd(p->sizes[s])))
      m.err = -ENOMEM;
    else if (p->written) /* its pages made, as a recycled segment's are */
      memset(nd->dst[s], 1, p->sizes[s]);
  nd->forward = p->relay && nd->node > 0;
  node_say(res_w, &m, CHAIN_READY);
  if (m.err || read(go_r, &b, 1) != 0)
    _exit(1);
  m.err = node_move(nd, &m.t) ? -ECONNRESET : 0;
  node_say(res_w, &m, CHAIN_DONE);
  if (m.err || read(check_r, &b, 1) != 0)
    _exit(1);
  for (unsigned s = 0; nd->node > 0 && s < p->count; s++)
    m.bad += memcmp(nd->dst[s], p->src[s], p->sizes[s]) != 0;
  node_say(res_w, &m, CHAIN_CHECKED);
  _exit(0);
}

/* The set cut into chunks, in set order (heap; *n_out of them). */
static struct chain_chunk *chain_chunks(const struct bench_chain_params *p, uint64_t *n_out) {
  uint64_t n = 0, k = 0;
  struct chain_chunk *v;

  for (unsigned s = 0; s < p->count; s++)
    n += (p->sizes[s] + p->chunk - 1) / p->chunk;
  if (!(v = calloc(n ? n : 1, sizeof(*v))))
    return NULL;
  for (unsigned s = 0; s < p->count; s++)
    for (uint64_t off = 0; off < p->sizes[s]; off += p->chunk)
      v[k++] = (struct chain_chunk){
          s, off, p->sizes[s] - off < p->chunk ? p->sizes[s] - off : p->chunk};
  *n_out = n;
  return v;
}

/* The chain's processes and what the parent holds of them. */
struct chain_run {
  const struct bench_chain_params *p;
  int sfd[CHAIN_MAX_HOPS + 1][TCP_MAX_LANES]; /* hop h's lane j: sender's end */
  int rfd[CHAIN_MAX_HOPS + 1][TCP_MAX_LANES]; /* and receiver's; -1: none */
  pid_t pid[CHAIN_MAX_HOPS + 1];
  int go[2], check[2], res[2];
};

/* Connections of every hop, made beforehand.  0 or -1. */
static int chain_connect(struct chain_run *r) {
  struct sockaddr_in sa;
  int lfd = tcp_listen(&sa), e = 0;

  for (unsigned h = 1; h <= r->p->hops && !e; h++)
    for (unsigned j = 0; j < r->p->lanes && !e; j++)
      e = tcp_pair(lfd, &sa, &r->sfd[h][j], &r->rfd[h][j]);
  if (lfd >= 0)
    close(lfd);
  return lfd < 0 || e ? -1 : 0;
}

/* Closes every connection's end except node's own (all when node < 0). */
static void chain_close_others(struct chain_run *r, int node) {
  for (unsigned h = 1; h <= r->p->hops; h++)
    for (unsigned j = 0; j < r->p->lanes; j++) {
      if (r->sfd[h][j] >= 0 && (int)h - 1 != node)
        close(r->sfd[h][j]);
      if (r->rfd[h][j] >= 0 && (int)h != node)
        close(r->rfd[h][j]);
    }
}

/* Forks node's process (in the child: its connections, then node_main). */
static int chain_fork(struct chain_run *r, unsigned node, const struct chain_chunk *ck,
                      uint64_t nck) {
  struct chain_node *nd;

  if ((r->pid[node] = fork()) != 0)
    return r->pid[node] < 0 ? -1 : 0;
  close(r->go[1]);
  close(r->check[1]);
  close(r->res[0]);
  chain_close_others(r, (int)node);
  if (!(nd = calloc(1, sizeof(*nd))) || !(nd->dst = calloc(r->p->count, sizeof(*nd->dst))))
    _exit(1);
  nd->p = r->p;
  nd->ck = ck;
  nd->nck = nck;
  nd->node = node;
  for (unsigned j = 0; j < r->p->lanes; j++) {
    struct chain_lane *l = &nd->lane[j];
    l->nd = nd;
    l->j = j;
    l->rfd = node > 0 ? r->rfd[node][j] : -1;
    l->sfd = node < r->p->hops ? r->sfd[node + 1][j] : -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
  }
  node_main(nd, r->go[0], r->check[0], r->res[1]);
  _exit(1);
}

/* Whether a node's process that has not answered this stage yet
 * (answered[n] false) has ended (it stays to be reaped): node 0 checks
 * nothing and ends at once, while the others may compare for seconds
 * (12 GiB: about 2 s). */
static bool chain_any_ended(const struct chain_run *r, const bool *answered) {
  for (unsigned n = 0; n <= r->p->hops; n++) {
    siginfo_t si;
    if (answered[n])
      continue;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)r->pid[n], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid)
      return true;
  }
  return false;
}

/* Waits for a node's next message: > 0 when one is there, 0 when none
 * will come (a node ended without it, or CHAIN_WAIT_MS of silence). */
static int chain_wait(const struct chain_run *r, const bool *answered) {
  struct pollfd pfd = {.fd = r->res[0], .events = POLLIN};

  for (int waited = 0;; waited += 1000) {
    int rc = poll(&pfd, 1, 1000);
    if (rc > 0 || (rc < 0 && errno != EINTR))
      return rc;
    /* a node writes its last message before it ends: look once more */
    if (rc == 0 && (waited >= CHAIN_WAIT_MS || chain_any_ended(r, answered)))
      return poll(&pfd, 1, 0);
  }
}

/* One message of `stage` from every node; *t_out: the latest CHAIN_DONE
 * time, *bad_out: the CHAIN_CHECKED segments that differ.  0 or -1. */
static int chain_collect(struct chain_run *r, int stage, double *t_out, unsigned *bad_out) {
  static const char *const what[] = {"", "setting up", "moving its bytes", "checking them"};
  bool answered[CHAIN_MAX_HOPS + 1] = {false};

  for (unsigned n = 0; n <= r->p->hops; n++) {
    struct chain_msg m = {.node = -1, .err = -ETIMEDOUT};
    int rc = chain_wait(r, answered);
    if (rc <= 0 || read(r->res[0], &m, sizeof(m)) != (ssize_t)sizeof(m) || m.stage != stage ||
        m.err) {
      if (rc > 0 && m.err)
        fprintf(stderr, "gshm-bench pull: plain TCP node n%d failed %s: %s\n", m.node,
                what[stage], strerror(-m.err));
      else
        fprintf(stderr, "gshm-bench pull: a plain TCP node ended or went silent %s\n",
                what[stage]);
      return -1;
    }
    if (m.node >= 0 && m.node <= (int)r->p->hops)
      answered[m.node] = true;
    if (stage == CHAIN_DONE && m.node > 0 && m.t > *t_out)
      *t_out = m.t;
    if (m.bad)
      fprintf(stderr, "gshm-bench pull: n%d's plain TCP copy: %u segment(s) differ from n0's\n",
              m.node, m.bad);
    *bad_out += m.bad;
  }
  return 0;
}

/* The parent's side of a run: the nodes' stages in order; the seconds
 * or -1. */
static double chain_drive(struct chain_run *r) {
  double t0, t_end = 0;
  unsigned bad = 0;

  if (chain_collect(r, CHAIN_READY, &t_end, &bad))
    return -1;
  t0 = bench_now_s();
  close(r->go[1]);
  r->go[1] = -1;
  if (chain_collect(r, CHAIN_DONE, &t_end, &bad))
    return -1;
  close(r->check[1]);
  r->check[1] = -1;
  if (chain_collect(r, CHAIN_CHECKED, &t_end, &bad))
    return -1;
  return bad ? -1 : t_end - t0;
}

double bench_tcp_chain(const struct bench_chain_params *p) {
  struct chain_run r = {.p = p, .go = {-1, -1}, .check = {-1, -1}, .res = {-1, -1}};
  struct chain_chunk *ck = NULL;
  uint64_t nck = 0;
  unsigned forked = 0;
  double el = -1;

  memset(r.sfd, 0xff, sizeof(r.sfd));
  memset(r.rfd, 0xff, sizeof(r.rfd));
  if (p->hops < 1 || p->hops > CHAIN_MAX_HOPS || p->lanes < 1 || p->lanes > TCP_MAX_LANES ||
      !p->chunk || !p->count || !(ck = chain_chunks(p, &nck)) || chain_connect(&r) ||
      pipe2(r.go, O_CLOEXEC) || pipe2(r.check, O_CLOEXEC) || pipe2(r.res, O_CLOEXEC))
    goto out;
  fflush(NULL);
  for (; forked <= p->hops; forked++)
    if (chain_fork(&r, forked, ck, nck))
      goto out;
  close(r.res[1]);
  r.res[1] = -1;
  chain_close_others(&r, -1);
  memset(r.sfd, 0xff, sizeof(r.sfd));
  memset(r.rfd, 0xff, sizeof(r.rfd));
  el = chain_drive(&r);
out:
  for (unsigned n = 0; n < forked; n++) {
    if (el < 0)
      kill(r.pid[n], SIGKILL);
    while (waitpid(r.pid[n], NULL, 0) < 0 && errno == EINTR)
      ;
  }
  chain_close_others(&r, -1);
  for (int i = 0; i < 2; i++) {
    if (r.go[i] >= 0)
      close(r.go[i]);
    if (r.check[i] >= 0)
      close(r.check[i]);
    if (r.res[i] >= 0)
      close(r.res[i]);
  }
  if (!ck || forked <= p->hops)
    fprintf(stderr, "gshm-bench pull: cannot set up the plain TCP run: %s\n",
            !ck ? "bad parameters or out of memory" : strerror(errno));
  free(ck);
  return el;
}
