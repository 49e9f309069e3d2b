/* SPDX-License-Identifier: Apache-2.0 */
/* A peer that holds the cluster key, against a real gshmd on 127.0.0.1
 * (rogue.h): as a puller it opens more links than a peer may, asks
 * 100,000 grants and thousands of reads without waiting for answers and
 * without reading them; gshmd keeps at most its caps in flight per link,
 * refuses the rest as busy, its memory stays bounded, and a local
 * client's stat stays under 100 ms throughout.  And an honest puller
 * with many pulls at once keeps within those caps.  And worker addresses
 * in UcxOffers that UCX cannot read, or mutations of a real one, leave
 * the node up; a link takes at most 16 data lanes. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"
#include "rogue.h"
#include "wire.h"

/* gshmd's caps (docs/SECURITY.md): links of one peer, grants (staged
 * ones) and reads in flight per link. */
#define LINKS_PER_PEER 4
#define GRANTS_PER_LINK 64
/* staged grants hold at most 4 x cluster.staging_bytes of slots per link:
 * 4 of a segment that fills a staging buffer, 16 of one that takes one
 * slot of a quarter of it */
#define STAGED_FULL_PER_LINK 4
#define READS_PER_LINK 64

/* Under AddressSanitizer freed memory sits in a quarantine (up to 256
 * MiB) before it is reused, so gshmd's RSS says nothing there (its leak
 * checker does that job): reported, not checked. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_BOUND_KIB(k) LONG_MAX
#else
#define RSS_BOUND_KIB(k) (k)
#endif

static struct cluster_keys keys;
static struct node S; /* serves pub/ *; "r" is the rogue's name in its peers */
static uint8_t key[32];

static long refusals(gshm_client_t *c, const char *cause) {
  char name[96];
  snprintf(name, sizeof(name), "gshm_cluster_refusals_total{cause=\"%s\"}", cause);
  return metric(c, name);
}

/* A local client's stats and S's memory, sampled while an attack runs:
 * the slowest stat (raw_ms), and the slowest less the time the watching
 * thread and gshmd's loop thread waited for a CPU (slowest_ms: the
 * machine runs other work too; what is left is gshmd's doing). */
struct watch {
  pthread_t t;
  struct node *n; /* (S unless set) */
  atomic_bool stop;
  int64_t slowest_ms, raw_ms;
  long rss_max_kib;
  unsigned samples; /* (0 when it could not connect: checked by watch_stop) */
  int stat_err;     /* a stat's error, which ends the watch: cmocka's asserts
                     * belong to the main thread, so watch_stop fails on it */
};

static void *watch_thread(void *arg) {
  struct watch *w = arg;
  gshm_client_t *c;
  if (gshm_connect(w->n->h.socket_path, "watch", &c))
    return NULL;
  while (!w->stop) {
    int64_t raw, ms = slowest_stat_busy(c, "pub/probe", 5, w->n->h.sp.pid, &raw);
    long rss;
    if (ms < 0) {
      w->stat_err = (int)ms;
      break;
    }
    rss = harness_rss_kib(w->n->h.sp.pid);
    if (ms > w->slowest_ms)
      w->slowest_ms = ms;
    if (raw > w->raw_ms)
      w->raw_ms = raw;
    if (rss > w->rss_max_kib)
      w->rss_max_kib = rss;
    w->samples++;
    usleep(2000);
  }
  gshm_disconnect(c);
  return NULL;
}

static void watch_start_on(struct watch *w, struct node *n) {
  memset(w, 0, sizeof(*w));
  w->n = n;
  assert_int_equal(pthread_create(&w->t, NULL, watch_thread, w), 0);
}

static void watch_start(struct watch *w) { watch_start_on(w, &S); }

/* Its figures are checked by the caller: a watch that took no sample (its
 * client could not connect, or gshmd never answered a stat before the
 * attack ended) left them 0, which every bound passes. */
static void watch_stop(struct watch *w) {
  w->stop = true;
  pthread_join(w->t, NULL);
  if (w->stat_err)
    fail_msg("the watching client's stat of pub/probe failed after %u samples: %s", w->samples,
             gshm_strerror(w->stat_err));
  if (!w->samples)
    fail_msg("the watching client took no stat during the attack (connect refused?)");
}

static int group_setup(void **state) {
  gshm_client_t *s;
  (void)state;
  keys_make(&keys, "gshm-rogue");
  rogue_key(keys.key, key);
  node_start(&S, "s", "r=127.0.0.1:1", keys.key, "pub/*", NULL);
  harness_set_leftover(&S.h);
  s = connect_to(&S);
  make_segment(s, "pub/probe", 4096, 1);
  make_segment(s, "pub/big", 8 * MiB, 2);
  gshm_disconnect(s);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  assert_int_equal(harness_stop(&S.h), 0);
  harness_set_leftover(NULL);
  keys_remove(&keys);
  return 0;
}

/* ---- links per peer ------------------------------------------------------ */

/* Six links of peer "r": four pass the hello, the fifth and sixth are
 * refused while those are up; one closed makes room for one more. */
static void test_links_per_peer(void **state) {
  static struct rogue r[LINKS_PER_PEER + 2];
  gshm_client_t *s = connect_to(&S);
  long before = refusals(s, "limit");
  (void)state;

  for (int i = 0; i < LINKS_PER_PEER; i++)
    assert_int_equal(rogue_connect(&r[i], S.port, "r", "s", key), 0);
  for (int i = LINKS_PER_PEER; i < LINKS_PER_PEER + 2; i++) {
    assert_int_equal(rogue_connect(&r[i], S.port, "r", "s", key), -1);
    assert_non_null(strstr(r[i].refusal, "connections up already"));
    rogue_close(&r[i]);
  }
  assert_int_equal(refusals(s, "limit"), before + 2);
  rogue_close(&r[0]); /* room again once gshmd has seen it go */
  for (int tries = 0;; tries++) {
    memset(&r[0], 0, sizeof(r[0]));
    if (rogue_connect(&r[0], S.port, "r", "s", key) == 0)
      break;
    assert_true(tries < 50 && strstr(r[0].refusal, "connections up already"));
    rogue_close(&r[0]);
    usleep(100000);
  }
  for (int i = 0; i < LINKS_PER_PEER; i++)
    rogue_close(&r[i]);
  gshm_disconnect(s);
}

/* ---- connections in their hello ------------------------------------------ */

/* gshmd's bounds on connections in their hello: in all (from hosts that
 * are not peers' addresses), and from one source address. */
#define HELLOS 64
#define HELLOS_PER_ADDR 4

/* A TCP connection to S's cluster port from source address `from`
 * (127.0.0.0/8 is all this host's): its fd. */
static int connect_from_port(const char *from, int port) {
  struct sockaddr_in me = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  assert_true(fd >= 0);
  inet_pton(AF_INET, from, &me.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  to.sin_port = htons((uint16_t)port);
  assert_int_equal(bind(fd, (struct sockaddr *)&me, sizeof(me)), 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&to, sizeof(to)), 0);
  return fd;
}

static int connect_from(const char *from) { return connect_from_port(from, S.port); }

/* How many of fds[0..n) S has not closed. */
static int open_of(const int *fds, int n) {
  int kept = 0;

  for (int i = 0; i < n; i++) {
    struct pollfd p = {.fd = fds[i], .events = POLLIN};
    char c;
    kept += !(poll(&p, 1, 0) == 1 && recv(fds[i], &c, 1, MSG_DONTWAIT) <= 0);
  }
  return kept;
}

/* n connections that say nothing, HELLOS_PER_ADDR from each of the
 * addresses 127.0.0.3, 127.0.0.4, ... into fds; once S took them, how
 * many it keeps open (in their hello) rather than closed.  A connection
 * still in S's accept queue looks open too: counted once two counts
 * 200 ms apart agree (5 s at most), not after a fixed wait that 2 busy
 * cores under ASan may not have drained the queue in. */
static int silent_hellos(int *fds, int n) {
  int kept = -1, last;
  char from[32];

  for (int i = 0; i < n; i++) {
    snprintf(from, sizeof(from), "127.0.0.%d", 3 + i / HELLOS_PER_ADDR);
    fds[i] = connect_from(from);
  }
  usleep(300000);
  for (int t = 0; t < 25; t++) {
    last = kept;
    if ((kept = open_of(fds, n)) == last)
      break;
    usleep(200000);
  }
  return kept;
}

/* Hosts that are not peers (no key) fill every hello slot of S, 4 from
 * each of 16 addresses (an IPv6 host has 2^64 of them): a peer connecting
 * from its own address in cluster.peers still passes the hello.  Before,
 * it was closed at accept ("too many connections in their hello") for as
 * long as they renewed their connections every 3 s. */
static void test_hello_slots_spare_peers(void **state) {
  static struct rogue r;
  int fds[HELLOS], kept, rc;
  (void)state;

  kept = silent_hellos(fds, HELLOS);
  rc = rogue_connect(&r, S.port, "r", "s", key);
  rogue_close(&r);
  for (int i = 0; i < HELLOS; i++) /* (before any check: they hold S's slots) */
    close(fds[i]);
  assert_int_equal(kept, HELLOS);
  assert_int_equal(rc, 0);
}

/* The cluster's fd budget of node n (link.c conn_budget). */
static int budget_of(struct node *n) {
  struct rlimit rl;
  assert_int_equal(prlimit(n->h.sp.pid, RLIMIT_NOFILE, NULL, &rl), 0);
  return rl.rlim_cur / 4 < 256 ? (int)(rl.rlim_cur / 4) : 256;
}

/* What peers may hold of a node's budget: links of the peers NAMES,
 * 4 each, and 16 data lanes on each link. */
#define NAMES 4
static struct rogue fill_links[NAMES][LINKS_PER_PEER], fill_lanes[NAMES][LINKS_PER_PEER][16];

/* Peers "r", "r2", ... hold want connections of node n (or as many as it
 * takes, want -1: until it refuses one); returns how many they hold. */
static int peers_fill(struct node *n, int want) {
  const char *names[NAMES] = {"r", "r2", "r3", "r4"};
  int held = 0;

  memset(fill_links, 0, sizeof(fill_links));
  memset(fill_lanes, 0, sizeof(fill_lanes));
  for (int k = 0; k < NAMES; k++)
    for (int i = 0; i < LINKS_PER_PEER; i++) {
      if (held == want || rogue_connect(&fill_links[k][i], n->port, names[k], n->name, key))
        return held;
      held++;
      for (int j = 0; j < 16; j++) {
        if (held == want || rogue_connect_lane(&fill_links[k][i], n->port, &fill_lanes[k][i][j]))
          return held;
        held++;
      }
    }
  return held;
}

static void peers_unfill(void) {
  for (int k = 0; k < NAMES; k++)
    for (int i = 0; i < LINKS_PER_PEER; i++) {
      for (int j = 0; j < 16; j++)
        rogue_close(&fill_lanes[k][i][j]);
      rogue_close(&fill_links[k][i]);
    }
}

#define FILL_PEERS "r=127.0.0.1:1,r2=127.0.0.1:1,r3=127.0.0.1:1,r4=127.0.0.1:1"

/* Hosts that are not peers hold their 64 hello slots on a node whose
 * peers' own links and data lanes use most of its cluster fd budget (a
 * cluster of 12 nodes or more at cluster.streams = 8: 18 connections a
 * peer, a link and 8 lanes each way): a peer's new link still passes the
 * hello.  Before, the strangers' slots came out of the same budget, and
 * the peer was closed at accept ("no cluster connection left in gshmd's
 * budget") for as long as they renewed them every 3 s. */
static void test_hello_slots_spare_peers_budget(void **state) {
  static struct node s4;
  static struct rogue late;
  int fds[HELLOS], rc, budget;
  (void)state;

  node_start(&s4, "s4", FILL_PEERS ",r5=127.0.0.1:1", keys.key, "pub/*", NULL);
  budget = budget_of(&s4);
  /* the peers' own: all but 56 of the budget (the strangers' 64 pass it) */
  assert_int_equal(peers_fill(&s4, budget - 56), budget - 56);
  for (int i = 0; i < HELLOS; i++) {
    char from[32];
    snprintf(from, sizeof(from), "127.0.0.%d", 3 + i / HELLOS_PER_ADDR);
    fds[i] = connect_from_port(from, s4.port);
  }
  usleep(500000); /* (s4 took them: it closes those past a bound at once) */
  rc = rogue_connect(&late, s4.port, "r5", "s4", key);
  if (rc)
    print_message("refused: %s\n", late.refusal);
  rogue_close(&late);
  for (int i = 0; i < HELLOS; i++)
    close(fds[i]);
  peers_unfill();
  assert_int_equal(harness_stop(&s4.h), 0);
  assert_int_equal(rc, 0);
}

/* A pull from a peer whose link cannot even be tried: the node's peers'
 * links and lanes hold its whole cluster fd budget (a cluster of 15
 * nodes at cluster.streams = 8 needs 252 of 256).  The pull fails at
 * once, and says why, and so does a listing of that peer; before, its
 * grant request waited on the peer's queue, where only a link's end fails
 * requests, and the pull hung until the budget had room again. */
struct budget_pull {
  pthread_t t;
  struct node *n;
  int err, list_err;
  char msg[256];
  atomic_bool done;
};

static void *budget_pull_thread(void *arg) {
  struct budget_pull *b = arg;
  gshm_pull_opts_t po = {.mode = 0644};
  gshm_pull_result_t res;
  gshm_client_t *c;

  if (!(b->err = gshm_connect(b->n->h.socket_path, "budget", &c))) {
    gshm_segment_info_t *infos = NULL;
    size_t n = 0;
    b->err = gshm_pull(c, "src", "pub/x", &po, &res);
    snprintf(b->msg, sizeof(b->msg), "%s", gshm_last_error(c));
    /* (a listing of that peer too: answered at once, the connection kept) */
    b->list_err = gshm_list_remote(c, "src", &infos, &n);
    gshm_free(infos);
    gshm_disconnect(c);
  }
  b->done = true;
  return NULL;
}

static void test_pull_with_no_budget_fails(void **state) {
  static struct node p6;
  static struct budget_pull b;
  int budget, held, waited = 0;
  (void)state;

  node_start(&p6, "p6", FILL_PEERS ",src=127.0.0.1:1", keys.key, "", NULL);
  budget = budget_of(&p6);
  held = peers_fill(&p6, -1);
  print_message("budget %d, peers hold %d\n", budget, held);
  assert_true(held >= budget - 4);
  memset(&b, 0, sizeof(b));
  b.n = &p6;
  assert_int_equal(pthread_create(&b.t, NULL, budget_pull_thread, &b), 0);
  while (!b.done && waited < 10000) {
    usleep(50000);
    waited += 50;
  }
  peers_unfill(); /* (a pull still waiting gets its link now, refused: it ends) */
  pthread_join(b.t, NULL);
  print_message("the pull and a listing ended after %d ms: %d %s; listing %d\n", waited, b.err,
                b.msg, b.list_err);
  assert_int_equal(harness_stop(&p6.h), 0);
  assert_true(waited < 10000);
  assert_true(b.err < 0);
  assert_non_null(strstr(b.msg, "budget"));
  assert_true(b.list_err < 0);
}

/* The cluster's fd budget holds every peer of cluster.peers: 20 peers at
 * 8 streams (4 + 2 x 8 connections each) get 400, not the 256 that held
 * 14 of them; a node of few peers keeps 256; both as its metric says
 * (and a quarter of RLIMIT_NOFILE at most). */
static void test_budget_grows_with_peers(void **state) {
  static struct node big;
  char peers[20 * 24];
  gshm_client_t *c;
  long got, few;
  int quarter, want;
  (void)state;

  for (int i = 0, k = 0; i < 20; i++)
    k += snprintf(peers + k, sizeof(peers) - (size_t)k, "%sq%d=127.0.0.1:1", i ? "," : "", i);
  node_start(&big, "big", peers, keys.key, "", NULL);
  {
    struct rlimit rl; /* (gshmd's own limit: it raises its soft one to the hard one) */
    assert_int_equal(prlimit(big.h.sp.pid, RLIMIT_NOFILE, NULL, &rl), 0);
    quarter = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur / 4 > (1u << 30) ? 1 << 30
                                                                           : (int)(rl.rlim_cur / 4);
  }
  want = 20 * (4 + 2 * 8) < quarter ? 20 * (4 + 2 * 8) : quarter;
  c = connect_to(&big);
  got = metric(c, "gshm_cluster_connections{kind=\"budget\"}");
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&big.h), 0);
  c = connect_to(&S);
  few = metric(c, "gshm_cluster_connections{kind=\"budget\"}");
  gshm_disconnect(c);
  print_message("budget with 20 peers %ld (want %d), with S's %ld\n", got, want, few);
  assert_int_equal(got, want);
  assert_int_equal(few, budget_of(&S));
}

/* Sends on r, up, a message with no body (what a newer gshmd's message
 * of a kind unknown here decodes to), which S refuses; returns once S
 * said so (the link is refused then, and closed by S's sweep within 2 s). */
static void refused_once_up(struct rogue *r) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT, *got;

  m.request_id = 7;
  rogue_send(r, &m);
  got = rogue_recv(r, 5000);
  assert_non_null(got);
  assert_non_null(strstr(got->message, "unexpected message"));
  gshm__cluster__msg__free_unpacked(got, NULL);
}

/* A key holder's link that gshmd refuses once it is up (refused_once_up)
 * must leave the count of connections in their
 * hello as it was.  Before, it was taken off that count a second time
 * when it closed, and the count (unsigned) wrapped: from the second such
 * link on, every connection to the cluster port was closed at accept
 * ("too many connections in their hello"), every peer's link included,
 * until gshmd restarted.  After 8 of them a peer still connects, and
 * silent connections still get no more than the 64 hello slots. */
static void test_refused_link_counted_once(void **state) {
  static struct rogue r;
  enum { LINKS = 8, SILENT = 160 };
  int fds[SILENT], kept, rc;
  (void)state;

  for (int i = 0; i < LINKS; i++) {
    memset(&r, 0, sizeof(r));
    rc = rogue_connect(&r, S.port, "r", "s", key);
    if (rc)
      print_message("link %d refused: %s\n", i, r.refusal);
    assert_int_equal(rc, 0);
    refused_once_up(&r);
    rogue_close(&r);
  }
  usleep(200000); /* S sees the last ones close */
  memset(&r, 0, sizeof(r));
  rc = rogue_connect(&r, S.port, "r", "s", key);
  rogue_close(&r);
  assert_int_equal(rc, 0);
  kept = silent_hellos(fds, SILENT);
  for (int i = 0; i < SILENT; i++)
    close(fds[i]);
  print_message("silent connections kept in their hello: %d of %d\n", kept, SILENT);
  assert_true(kept <= HELLOS);
  assert_true(kept >= HELLOS / 2);
}

/* A refused link stays until S's sweep closes it (up to 2 s), with its
 * grants, leases and the sends of its reads: it counts among its peer's 4
 * links meanwhile.  Before, it did not (only LINK_UP counted), so a key
 * holder that had each link refused once its reads were queued opened
 * as many more as it liked in that time, each holding up to 64 grants
 * and 256 MiB of reads (with cluster.encrypt, ciphertext buffers). */
static void test_refused_links_count_as_up(void **state) {
  static struct rogue r[LINKS_PER_PEER + 1];
  int rc;
  (void)state;

  for (int i = 0; i < LINKS_PER_PEER; i++) {
    assert_int_equal(rogue_connect(&r[i], S.port, "r", "s", key), 0);
    refused_once_up(&r[i]);
  }
  rc = rogue_connect(&r[LINKS_PER_PEER], S.port, "r", "s", key);
  if (rc)
    print_message("5th link: %s\n", r[LINKS_PER_PEER].refusal);
  for (int i = 0; i <= LINKS_PER_PEER; i++)
    rogue_close(&r[i]);
  assert_int_equal(rc, -1);
  assert_non_null(strstr(r[LINKS_PER_PEER].refusal, "connections up already"));
  /* once S closed them, the peer links again */
  for (int tries = 0;; tries++) {
    memset(&r[0], 0, sizeof(r[0]));
    if (rogue_connect(&r[0], S.port, "r", "s", key) == 0)
      break;
    assert_true(tries < 50);
    rogue_close(&r[0]);
    usleep(100000);
  }
  rogue_close(&r[0]);
}

/* ---- grants and reads in flight ------------------------------------------ */

/* Answers counted by what they say. */
struct tally {
  uint64_t answers, grants, busy, other;
  uint64_t first_grant;
  char other_msg[200];
};

static void count_answer(struct rogue *r, const Gshm__Cluster__Msg *m) {
  struct tally *t = r->arg;
  t->answers++;
  if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT) {
    if (!t->grants++)
      t->first_grant = m->grant->grant_id;
  } else if (m->status != 1 && m->message &&
             strstr(m->message, "too many")) {
    t->busy++;
  } else {
    t->other++;
    snprintf(t->other_msg, sizeof(t->other_msg), "status %u: %s", m->status,
             m->message ? m->message : "");
  }
}

static uint64_t want_answers;

static bool all_answered(struct rogue *r) {
  return ((struct tally *)r->arg)->answers + r->data_frames >= want_answers;
}

/* 100,000 grant requests at once from a peer that does not read its
 * answers, then thousands of reads of one grant: at most the caps are
 * held, every other request is refused as busy, gshmd's memory stays
 * within a bound and local stats within 100 ms. */
static void test_grant_and_read_flood(void **state) {
  static struct rogue r;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  struct tally t = {0};
  struct watch w;
  long rss0;
  const uint32_t ngrants = 100000, nreads = 1000; /* (1000 refusals stay below the answers gshmd queues before it stops reading) */
  (void)state;

  assert_int_equal(rogue_connect(&r, S.port, "r", "s", key), 0);
  r.on_msg = count_answer;
  r.arg = &t;
  rss0 = harness_rss_kib(S.h.sp.pid);
  watch_start(&w);
  rogue_reading(&r, false);
  gr.name = "pub/big";
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  for (uint32_t i = 1; i <= ngrants; i++) {
    m.request_id = i;
    rogue_send(&r, &m);
    if (i % 1000 == 0)
      rogue_run(&r, 1);
  }
  rogue_run(&r, 3000); /* gshmd takes what it will while nobody reads its answers */
  rogue_reading(&r, true);
  want_answers = ngrants;
  assert_true(rogue_run_until(&r, all_answered, 120000));
  printf("grants: %" PRIu64 " granted, %" PRIu64 " busy, %" PRIu64 " other (%s); "
         "rss +%ld KiB, slowest stat %" PRId64 " ms (%" PRId64 " ms with waits for a CPU)\n",
         t.grants, t.busy, t.other, t.other_msg, w.rss_max_kib - rss0, w.slowest_ms, w.raw_ms);
  assert_int_equal(t.grants, GRANTS_PER_LINK);
  assert_int_equal(t.busy, ngrants - GRANTS_PER_LINK);
  assert_int_equal(t.other, 0);
  assert_true(w.slowest_ms < 100);
  /* its answers wait in the sockets, not in gshmd: it stopped reading */
  assert_true(w.rss_max_kib - rss0 < RSS_BOUND_KIB(8 * 1024));
  w.slowest_ms = w.raw_ms = 0;

  /* reads of one grant (2 MiB each), none of whose bytes the
   * rogue takes until it has sent them all */
  rd.grant_id = t.first_grant;
  rd.length = 2 * MiB;
  memset(&t, 0, sizeof(t));
  r.data_frames = 0;
  rogue_reading(&r, false);
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  for (uint32_t i = 1; i <= nreads; i++) {
    m.request_id = ngrants + i;
    rogue_send(&r, &m);
    if (i % 100 == 0)
      rogue_run(&r, 1);
  }
  rogue_run(&r, 3000);
  rogue_reading(&r, true);
  want_answers = nreads;
  assert_true(rogue_run_until(&r, all_answered, 120000));
  watch_stop(&w);
  printf("reads: %" PRIu64 " sent, %" PRIu64 " busy, %" PRIu64 " other (%s); "
         "rss +%ld KiB, slowest stat %" PRId64 " ms (%" PRId64 " ms with waits for a CPU)\n",
         r.data_frames, t.busy, t.other, t.other_msg, w.rss_max_kib - rss0, w.slowest_ms, w.raw_ms);
  /* (a few more may have gone into the sockets' buffers before the rogue
   * stopped taking them) */
  assert_true(r.data_frames >= 1 && r.data_frames <= READS_PER_LINK + 4);
  assert_int_equal(r.data_bad, 0);
  assert_int_equal(t.busy, nreads - r.data_frames);
  assert_int_equal(t.other, 0);
  assert_true(w.slowest_ms < 100);
  assert_true(w.rss_max_kib - rss0 < RSS_BOUND_KIB(16 * 1024));
  rogue_close(&r);
}

/* Connects r to node n (called `node`) as peer "r", its answers counted
 * in t, and asks one grant of segment name.  Returns its grant id. */
static uint64_t connect_and_grant(struct rogue *r, struct node *n, const char *node,
                                  const char *name, struct tally *t) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;

  assert_int_equal(rogue_connect(r, n->port, "r", node, key), 0);
  r->on_msg = count_answer;
  r->arg = t;
  gr.name = (char *)name;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  m.request_id = 1;
  rogue_send(r, &m);
  want_answers = 1;
  assert_true(rogue_run_until(r, all_answered, 10000));
  assert_int_equal(t->grants, 1);
  return t->first_grant;
}

/* Reads large in bytes: one over 64 MiB is refused outright; of eight of
 * 64 MiB that the rogue does not take, four (256 MiB, what an encrypted
 * link would hold as ciphertext) are in flight and four refused as busy. */
static void test_read_bytes_capped(void **state) {
  static struct rogue r;
  gshm_client_t *s = connect_to(&S);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  struct tally t = {0};
  (void)state;

  make_segment(s, "pub/huge", 80 * MiB, 4);
  rd.grant_id = connect_and_grant(&r, &S, "s", "pub/huge", &t);
  rd.length = 65 * MiB;
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  m.request_id = 2;
  rogue_send(&r, &m);
  want_answers = 2;
  assert_true(rogue_run_until(&r, all_answered, 10000));
  assert_int_equal(t.other, 1);
  assert_non_null(strstr(t.other_msg, "more than 64 MiB"));
  memset(&t, 0, sizeof(t));
  rogue_reading(&r, false);
  rd.length = 64 * MiB;
  for (uint32_t i = 0; i < 8; i++) {
    m.request_id = 3 + i;
    rogue_send(&r, &m);
  }
  rogue_run(&r, 2000);
  rogue_reading(&r, true);
  want_answers = 8;
  assert_true(rogue_run_until(&r, all_answered, 60000));
  printf("64 MiB reads: %" PRIu64 " sent, %" PRIu64 " busy, %" PRIu64 " other (%s)\n",
         r.data_frames, t.busy, t.other, t.other_msg);
  assert_int_equal(r.data_frames, 4);
  assert_int_equal(t.busy, 4);
  assert_int_equal(r.data_bad, 0);
  rogue_close(&r);
  assert_int_equal(gshm_unlink(s, "pub/huge"), 0);
  gshm_disconnect(s);
}

/* 100 staged grants of name asked at once on a new link to s2: how many
 * were granted (the rest must be refused as busy). */
static unsigned staged_grants(struct node *s2, const char *name) {
  static struct rogue r;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  struct tally t = {0};

  memset(&r, 0, sizeof(r));
  assert_int_equal(rogue_connect(&r, s2->port, "r", "s2", key), 0);
  r.on_msg = count_answer;
  r.arg = &t;
  gr.name = (char *)name;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  for (uint32_t i = 1; i <= 100; i++) {
    m.request_id = i;
    rogue_send(&r, &m);
  }
  want_answers = 100;
  if (!rogue_run_until(&r, all_answered, 30000))
    print_message("%s: %llu answers, %llu grants, %llu busy, other: %s\n", name,
                  (unsigned long long)t.answers, (unsigned long long)t.grants,
                  (unsigned long long)t.busy, t.other_msg);
  assert_int_equal(t.grants + t.busy, 100);
  rogue_close(&r);
  return (unsigned)t.grants;
}

/* Staged grants (cluster.staging = always) hold slots for their segment,
 * at most STAGED_FULL_PER_LINK staging buffers' worth per link, the rest
 * refused as busy: 4 of a segment as large as a buffer, 16 of one that
 * takes one slot of four; none registers anything with UCX, as their
 * bytes would go on the TCP stream. */
static void test_staged_grants(void **state) {
  static struct node s2;
  gshm_client_t *c;
  (void)state;

  node_start(&s2, "s2", "r=127.0.0.1:1", keys.key, "pub/*", "cluster.staging=always",
             "cluster.staging_bytes=1M", "cluster.pull_chunk=256K", NULL);
  c = connect_to(&s2);
  make_segment(c, "pub/st", 1 * MiB, 3);
  make_segment(c, "pub/st-slot", 256 * 1024, 5);
  assert_int_equal(staged_grants(&s2, "pub/st"), STAGED_FULL_PER_LINK);
  assert_int_equal(staged_grants(&s2, "pub/st-slot"), 4 * STAGED_FULL_PER_LINK);
  /* their bytes would go on the TCP stream: nothing is registered with UCX */
  assert_int_equal(metric(c, "gshm_cluster_registered_staging_buffers"), 0);
  assert_int_equal(metric(c, "gshm_cluster_registered_segments"), 0);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&s2.h), 0);
}

/* Staging buffers are made and freed on gshmd's thread pool, never on
 * its loop: with each taking 400 ms (GSHMD_TEST_STAGE_DELAY_MS, as
 * pinning 128 MiB takes tens of ms on a GPU machine), 100 staged grants
 * asked at once still get STAGED_FULL_PER_LINK granted (those whose
 * buffers are being made count against the cap), the rest refused as
 * busy, while a local stat stays under 100 ms (on the loop it waited
 * 400 ms a buffer); a link that goes while its buffers are being made,
 * and a Release of each grant before its answer, leave no lease and at
 * most 8 buffers kept; gshmd stopped meanwhile exits cleanly (and, under
 * AddressSanitizer, leaks none). */
#define SLOW_MS "400"
static bool no_leases(gshm_client_t *c, int ms) {
  for (int64_t end = now_ms() + ms; metric(c, "gshm_leases") != 0; usleep(50000))
    if (now_ms() > end)
      return false;
  return true;
}

/* 100 staged grants of name asked at once on a new link to s3 (each
 * answer counted in t), and then, with release_from, a Release of every
 * lease id from it on (as a rogue would guess them) before any answer is
 * read.  Returns once every request was refused as busy or answered
 * (busy ones only with release_from: a released grant is not), the link
 * closed; or, with keep, with the link still up once s3 had time to read
 * the requests (in *r). */
static void slow_grants(struct rogue *r, struct node *s3, const char *name, struct tally *t,
                        uint64_t release_from, bool keep) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Release rel = GSHM__CLUSTER__RELEASE__INIT;

  memset(r, 0, sizeof(*r));
  assert_int_equal(rogue_connect(r, s3->port, "r", "s3", key), 0);
  r->on_msg = count_answer;
  r->arg = t;
  gr.name = (char *)name;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  for (uint32_t i = 1; i <= 100; i++) {
    m.request_id = i;
    rogue_send(r, &m);
  }
  if (keep) {
    rogue_run(r, 300);
    return;
  }
  m.body_case = GSHM__CLUSTER__MSG__BODY_RELEASE;
  m.release = &rel;
  m.request_id = 0;
  for (uint64_t id = release_from; release_from && id < release_from + 300; id++) {
    rel.grant_id = id;
    rogue_send(r, &m);
  }
  want_answers = release_from ? 100 - 2 * STAGED_FULL_PER_LINK : 100;
  if (!rogue_run_until(r, all_answered, 30000))
    print_message("%s: %llu answers, %llu grants, %llu busy, other: %s\n", name,
                  (unsigned long long)t->answers, (unsigned long long)t->grants,
                  (unsigned long long)t->busy, t->other_msg);
  rogue_run(r, 200);
  rogue_close(r);
}

static void test_staged_buffers_off_loop(void **state) {
  static struct node s3;
  static struct rogue r;
  struct tally t = {0}, t2 = {0}, t3 = {0};
  gshm_client_t *c;
  struct watch w;
  (void)state;

  setenv("GSHMD_TEST_STAGE_DELAY_MS", SLOW_MS, 1);
  /* (no staging arena: every buffer is made, as where the arena is full) */
  node_start(&s3, "s3", "r=127.0.0.1:1", keys.key, "pub/*", "cluster.staging=always",
             "cluster.staging_bytes=1M", "cluster.pull_chunk=256K", "cluster.staging_arena=0",
             NULL);
  unsetenv("GSHMD_TEST_STAGE_DELAY_MS");
  c = connect_to(&s3);
  make_segment(c, "pub/probe", 4096, 1);
  make_segment(c, "pub/st", 1 * MiB, 3);
  make_segment(c, "pub/st-half", 512 * 1024, 4);
  watch_start_on(&w, &s3);
  slow_grants(&r, &s3, "pub/st", &t, 0, false);
  watch_stop(&w);
  printf("staged grants while their buffers take %s ms each: %llu granted, %llu busy; "
         "slowest stat %lld ms (%lld raw)\n", SLOW_MS, (unsigned long long)t.grants,
         (unsigned long long)t.busy, (long long)w.slowest_ms, (long long)w.raw_ms);
  assert_int_equal(t.grants, STAGED_FULL_PER_LINK);
  assert_int_equal(t.busy, 100 - STAGED_FULL_PER_LINK);
  assert_true(w.slowest_ms < 100);
  assert_true(no_leases(c, 10000));
  assert_int_equal(metric(c, "gshm_cluster_staging_buffers_made_total"), STAGED_FULL_PER_LINK);
  /* 8 grants of half a buffer, released before their answers, then the
   * link gone, while their buffers are being made */
  slow_grants(&r, &s3, "pub/st-half", &t2, t.first_grant, false);
  assert_int_equal(t2.busy, 100 - 2 * STAGED_FULL_PER_LINK);
  assert_true(no_leases(c, 10000));
  assert_true(metric(c, "gshm_cluster_staging_kept_bytes") <= 8 * (long)MiB);
  /* gshmd stops while buffers are being made: a clean exit */
  slow_grants(&r, &s3, "pub/st-half", &t3, 0, true);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&s3.h), 0);
  rogue_close(&r);
}

/* Data lanes of one link: at most LANES_PER_LINK (each a connection and
 * a thread of the node); one more is refused; they all go with their
 * link, and the node's fds with them. */
#define LANES_PER_LINK 16
static bool failed_or_closed(struct rogue *r) { return r->failed || r->closed; }

static void test_lanes_per_link(void **state) {
  static struct rogue r, lanes[LANES_PER_LINK + 1];
  int fds0 = harness_stable_fd_count(S.h.sp.pid), fds, fds1, rc, up = 0;
  (void)state;

  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_LANES;
  assert_int_equal(rogue_connect(&r, S.port, "r", "s", key), 0);
  for (int i = 0; i < LANES_PER_LINK; i++)
    up += rogue_connect_lane(&r, S.port, &lanes[i]) == 0;
  assert_int_equal(up, LANES_PER_LINK);
  /* one more: refused (at its AuthOk the node finds the link full) */
  rc = rogue_connect_lane(&r, S.port, &lanes[LANES_PER_LINK]);
  assert_true(rc != 0 ||
              rogue_run_until(&lanes[LANES_PER_LINK], failed_or_closed, 5000));
  for (int i = 0; i < LANES_PER_LINK; i++) {
    rogue_run(&lanes[i], 1);
    assert_false(lanes[i].failed);
  }
  fds = harness_fd_count(S.h.sp.pid);
  /* the link goes: its lanes with it */
  rogue_close(&r);
  for (int i = 0; i < LANES_PER_LINK; i++)
    assert_true(rogue_run_until(&lanes[i], failed_or_closed, 10000));
  for (int i = 0; i <= LANES_PER_LINK; i++)
    rogue_close(&lanes[i]);
  fds1 = harness_stable_fd_count(S.h.sp.pid);
  printf("a link and %d lanes: node fds %d before, %d with them, %d after; lane %d refused\n",
         LANES_PER_LINK, fds0, fds, fds1, LANES_PER_LINK + 1);
  /* (fds0 may still count a connection of the test before, closing) */
  assert_true(fds >= fds1 + LANES_PER_LINK + 1);
  assert_true(fds1 <= fds0);
}

static bool got_answer(struct rogue *r) { return ((struct tally *)r->arg)->answers > 0; }

/* On a new link to node s (as a puller that offers UCX), a UcxOffer of
 * the len bytes at addr: 0 when the node answered it (whatever it said),
 * -1 when it gave no answer (the old code: gshmd aborted inside UCX). */
static int ucx_offer(struct node *s, const uint8_t *addr, size_t len) {
  static struct rogue r;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxOffer o = GSHM__CLUSTER__UCX_OFFER__INIT;
  struct tally t = {0};
  int answered;

  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_UCX;
  assert_int_equal(rogue_connect(&r, s->port, "r", s->name, key), 0);
  r.on_msg = count_answer;
  r.arg = &t;
  o.worker_address.data = (uint8_t *)addr;
  o.worker_address.len = len;
  o.token = 42;
  m.body_case = GSHM__CLUSTER__MSG__BODY_UCX_OFFER;
  m.ucx_offer = &o;
  rogue_send(&r, &m);
  answered = rogue_run_until(&r, got_answer, 5000);
  rogue_close(&r);
  return answered ? 0 : -1;
}

/* A UcxOffer is parsed by UCX, which takes no length and aborts on a
 * format it does not know: a key holder's one-byte worker address crashed
 * a node with the default cluster.transport (auto; UCX 1.13: "Assertion
 * `*addr_version == UCP_OBJECT_VERSION_V2' failed").  Offers of 1 to 300
 * bytes of junk, and 300 random ones of either format UCX reads, are
 * refused or answered; the node stays up throughout. */
static void test_ucx_offer_junk(void **state) {
  static uint8_t junk[4096];
  const size_t lens[] = {1, 2, 8, 17, 64, 300};
  gshm_client_t *c = connect_to(&S);
  gshm_segment_info_t st;
  unsigned answered = 0;
  (void)state;

  randombytes_buf(junk, sizeof(junk));
  junk[0] = 0xa5; /* (a format UCX does not know: 5) */
  for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
    assert_int_equal(ucx_offer(&S, junk, lens[k]), 0);
    assert_int_equal(gshm_stat_name(c, "pub/probe", &st), 0);
  }
  for (int i = 0; i < 300; i++) {
    size_t len = 2 + randombytes_uniform(600);
    randombytes_buf(junk, len);
    junk[0] = (uint8_t)((junk[0] & 0xf0) | (i & 1)); /* UCX's format 0 or 1 */
    answered += ucx_offer(&S, junk, len) == 0;
    assert_int_equal(gshm_stat_name(c, "pub/probe", &st), 0);
  }
  printf("300 random worker addresses: %u answered, node up\n", answered);
  assert_int_equal(answered, 300);
  gshm_disconnect(c);
}

/* A link takes one UcxOffer: a second on the same link refuses it ("an
 * unexpected message").  Before, a key holder could repeat a failing
 * offer on one link without end, each one a line in the node's log
 * (12,000 lines for 12,000 offers: the session 27 attacker review). */
static void test_ucx_offer_once_a_link(void **state) {
  static struct rogue r;
  static uint8_t junk[17];
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxOffer o = GSHM__CLUSTER__UCX_OFFER__INIT;
  struct tally t = {0};
  (void)state;

  memset(&r, 0, sizeof(r));
  junk[0] = 0xa5; /* (a format UCX does not know: refused, logged) */
  r.caps = GSHM__CLUSTER__CAP__CAP_UCX;
  assert_int_equal(rogue_connect(&r, S.port, "r", S.name, key), 0);
  r.on_msg = count_answer;
  r.arg = &t;
  o.worker_address.data = junk;
  o.worker_address.len = sizeof(junk);
  m.body_case = GSHM__CLUSTER__MSG__BODY_UCX_OFFER;
  m.ucx_offer = &o;
  for (int i = 0; i < 2; i++) {
    rogue_send(&r, &m);
    want_answers = (uint64_t)i + 1;
    assert_true(rogue_run_until(&r, all_answered, 5000));
    print_message("offer %d: %s\n", i + 1, t.other_msg);
  }
  assert_non_null(strstr(t.other_msg, "unexpected message"));
  rogue_close(&r);
}

/* Node q (its one peer "ra" a rogue that claims CAP_UCX, *lfd_out the
 * rogue's listener) up, with transport ("cluster.transport=ucx", say;
 * NULL: the default) as its one extra setting, and the worker address of
 * the UcxOffer it made when its link came up into addr (cap bytes); its
 * length. */
static size_t worker_of(struct node *q, struct rogue *ra, const char *transport, int *lfd_out,
                        uint8_t *addr, size_t cap) {
  char peers[64];
  uint8_t rkey[32];
  size_t len = 0;
  int port;

  rogue_key(keys.key, rkey);
  assert_true((*lfd_out = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "ra=127.0.0.1:%d", port);
  node_start(q, "q", peers, keys.key, "", transport, NULL);
  memset(ra, 0, sizeof(*ra));
  ra->caps = GSHM__CLUSTER__CAP__CAP_UCX;
  assert_int_equal(rogue_accept(ra, *lfd_out, "ra", rkey), 0);
  len = rogue_ucx_offer(ra, addr, cap, NULL, 5000);
  return len;
}

/* A real worker address: the UcxOffer a node q of the default transport
 * makes (worker_of), q stopped since.  Returns its length, the bytes in
 * addr (cap bytes). */
static size_t real_worker_address(uint8_t *addr, size_t cap) {
  static struct node q;
  static struct rogue ra;
  int lfd;
  size_t len = worker_of(&q, &ra, NULL, &lfd, addr, cap);

  rogue_close(&ra);
  assert_int_equal(harness_stop(&q.h), 0);
  close(lfd);
  return len;
}

/* Offers made from a real worker address, MUTATIONS of them: a few
 * bytes past the format byte flipped, cut short, a byte set to 0xff or
 * 0x7f, the rest random from some byte on.  Each is answered and the
 * node stays up (UCX reads the padded copy). */
#define MUTATIONS 1000
static void test_ucx_offer_mutated(void **state) {
  static uint8_t real[4096], mut[4096];
  gshm_client_t *c = connect_to(&S);
  gshm_segment_info_t st;
  size_t rlen = real_worker_address(real, sizeof(real));
  (void)state;

  printf("a real worker address: %zu bytes\n", rlen);
  assert_true(rlen > 2);
  assert_int_equal(ucx_offer(&S, real, rlen), 0);
  for (int i = 0; i < MUTATIONS; i++) {
    uint32_t body = (uint32_t)rlen - 1; /* (bytes past the format byte) */
    size_t len = rlen, at = 1 + randombytes_uniform(body);
    memcpy(mut, real, rlen);
    if (i % 4 == 0) {
      for (uint32_t k = 0, n = 1 + randombytes_uniform(4); k < n; k++)
        mut[1 + randombytes_uniform(body)] ^= (uint8_t)(1 + randombytes_uniform(255));
    } else if (i % 4 == 1) {
      len = 2 + randombytes_uniform((uint32_t)rlen - 2);
    } else if (i % 4 == 2) {
      mut[at] = randombytes_uniform(2) ? 0xff : 0x7f;
    } else {
      randombytes_buf(mut + at, rlen - at);
    }
    if (ucx_offer(&S, mut, len) || gshm_stat_name(c, "pub/probe", &st)) {
      printf("mutation %d (kind %d, %zu bytes) took the node down:\n", i, i % 4, len);
      for (size_t k = 0; k < len; k++)
        printf("%02x", mut[k]);
      printf("\n");
      fail();
    }
  }
  gshm_disconnect(c);
}

/* ---- honest pullers stay within the caps ------------------------------ */

struct honest_pull {
  pthread_t t;
  struct node *puller;
  int i, err;
  char msg[320];
};

static void *honest_thread(void *arg) {
  struct honest_pull *x = arg;
  char name[32], local[32];
  gshm_pull_opts_t po = {.local_name = local};
  gshm_client_t *c;

  snprintf(name, sizeof(name), "pub/c%d", x->i);
  snprintf(local, sizeof(local), "l/c%d", x->i);
  if ((x->err = gshm_connect(x->puller->h.socket_path, "honest", &c)))
    return NULL;
  x->err = gshm_pull(c, "s", name, &po, NULL);
  snprintf(x->msg, sizeof(x->msg), "%s", gshm_last_error(c));
  gshm_disconnect(c);
  return NULL;
}

/* 16 pulls at once from one peer, 8 reads in flight each (more than a
 * serving node takes on one link): the puller keeps to the serving
 * node's cap, and every pull succeeds (8 of 16 failed as busy before). */
static void test_honest_pulls_within_caps(void **state) {
  static struct node p;
  static struct honest_pull th[16];
  gshm_client_t *s = connect_to(&S), *c;
  char peers[64], name[32];
  (void)state;

  for (int i = 0; i < 16; i++) {
    snprintf(name, sizeof(name), "pub/c%d", i);
    make_segment(s, name, 16 * MiB, 10 + (unsigned)i);
  }
  snprintf(peers, sizeof(peers), "s=127.0.0.1:%d", S.port);
  node_start(&p, "r", peers, keys.key, "", "cluster.pull_chunk=256K", "cluster.pull_depth=8",
             NULL);
  for (int i = 0; i < 16; i++) {
    th[i].puller = &p;
    th[i].i = i;
    assert_int_equal(pthread_create(&th[i].t, NULL, honest_thread, &th[i]), 0);
  }
  for (int i = 0; i < 16; i++) {
    pthread_join(th[i].t, NULL);
    if (th[i].err)
      printf("pull %d: %d %s\n", i, th[i].err, th[i].msg);
    assert_int_equal(th[i].err, 0);
  }
  c = connect_to(&p);
  for (int i = 0; i < 16; i++) {
    snprintf(name, sizeof(name), "l/c%d", i);
    check_segment(c, name, 16 * MiB, 10 + (unsigned)i);
    snprintf(name, sizeof(name), "pub/c%d", i);
    assert_int_equal(gshm_unlink(s, name), 0);
  }
  gshm_disconnect(c);
  gshm_disconnect(s);
  assert_int_equal(harness_stop(&p.h), 0);
}

/* ---- a revoke under a peer's grant --------------------------------------- */

/* An admin revokes a segment a peer holds a grant of, with reads of it
 * queued that the peer does not take yet: the serving lease ends, the
 * segment is freed; the grant's record (which pointed at the segment)
 * and the sends from its mapping must not outlive it.  The node runs
 * with glibc's malloc perturbation so that memory read after its free
 * is junk: before, the grant's Release and the link's end read the freed
 * segment's record, and the node crashed. */
static void test_revoke_under_grant(void **state) {
  static struct node t;
  static struct rogue r;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  Gshm__Cluster__Release rel = GSHM__CLUSTER__RELEASE__INIT;
  gshm_segment_info_t info;
  struct tally tl = {0};
  gshm_client_t *c;
  (void)state;

  setenv("GLIBC_TUNABLES", "glibc.malloc.perturb=165:glibc.malloc.tcache_count=0", 1);
  node_start(&t, "t", "r=127.0.0.1:1", keys.key, "pub/*", NULL);
  unsetenv("GLIBC_TUNABLES");
  c = connect_to(&t);
  make_segment(c, "pub/probe", 4096, 1);
  make_segment(c, "pub/rv", 32 * MiB, 5);
  rd.grant_id = connect_and_grant(&r, &t, "t", "pub/rv", &tl);
  /* 32 MiB of reads the rogue does not take: most wait in the node */
  rogue_reading(&r, false);
  rd.length = 8 * MiB;
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  for (uint32_t i = 0; i < 4; i++) {
    rd.offset = i * 8 * MiB;
    m.request_id = 2 + i;
    rogue_send(&r, &m);
  }
  rogue_run(&r, 300);
  assert_int_equal(gshm_revoke(c, "pub/rv"), 0);
  /* the reads go on (or fail), the grant is released, the link ends */
  rogue_reading(&r, true);
  rogue_run(&r, 1000);
  m.body_case = GSHM__CLUSTER__MSG__BODY_RELEASE;
  m.release = &rel;
  m.request_id = 0;
  rel.grant_id = tl.first_grant;
  rogue_send(&r, &m);
  rogue_run(&r, 300);
  printf("revoked under a grant: %" PRIu64 " of 4 reads' frames came, %" PRIu64 " failing "
         "their tag, %" PRIu64 " with a page of zeros\n", r.data_frames, r.data_bad,
         r.data_zero);
  /* reads admitted before the revoke carry the segment's bytes: its
   * memory is discarded once they are sent (before, at the revoke: their
   * frames went out as zeros, or failed their tag where the discard came
   * after the seal) */
  assert_int_equal(r.data_bad, 0);
  assert_int_equal(r.data_zero, 0);
  rogue_close(&r);
  usleep(300000);
  /* the node is up, serves, and exits cleanly */
  assert_int_equal(gshm_stat_name(c, "pub/probe", &info), 0);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&t.h), 0);
}

/* What a node says of a peer that would not prove the key may quote the
 * name that peer sent ("calls itself 'NAME'"): whoever answers on the
 * peer's address chooses those bytes.  gshmd makes every control of them
 * '?' before any client gets them: C0 and C1 controls, Unicode's bidi
 * controls (U+202E would reorder what follows) and bytes of no
 * well-formed UTF-8 (before, it did C0 only); `gshmctl peers` escapes
 * what is left (as `segments` shows names). */
static void test_peer_message_escaped(void **state) {
  static struct node q;
  static struct rogue ra;
  char peers[64], *out = NULL;
  uint8_t rkey[32];
  int port, lfd2;
  bool seen = false, seen_api = false;
  (void)state;

  rogue_key(keys.key, rkey);
  assert_true((lfd2 = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "ra=127.0.0.1:%d", port);
  node_start(&q, "q", peers, keys.key, "", NULL);
  memset(&ra, 0, sizeof(ra));
  /* every attempt of q's (one 2 s after each failure) meets the same
   * name, so that its message says it whenever the checks look: what
   * gshmctl shows and what the C API (and Python) get */
  for (int i = 0; i < 200 && !(seen && seen_api); i++) {
    struct pollfd pf = {.fd = lfd2, .events = POLLIN};
    gshm_client_t *c;
    gshm_cluster_peer_t *v = NULL;
    size_t n = 0;
    if (i == 0 || poll(&pf, 1, 0) == 1) {
      rogue_close(&ra);
      memset(&ra, 0, sizeof(ra));
      assert_int_not_equal(rogue_accept(&ra, lfd2, "x\xC2\x9B" "2J\xE2\x80\xAE" "evil", rkey), 0);
    }
    free(out);
    out = NULL;
    assert_int_equal(harness_gshmctl(&q.h, &out, (const char *[]){"peers", NULL}), 0);
    if (strstr(out, "calls itself")) {
      seen = true;
      printf("%s", out);
      /* C1 (U+009B, CSI) and the bidi override (U+202E) are valid UTF-8:
       * gshmd made C0 controls alone '?' before */
      assert_null(strstr(out, "\xC2\x9B"));
      assert_null(strstr(out, "\xE2\x80\xAE"));
      assert_non_null(strstr(out, "'x??2J???evil'"));
    }
    c = connect_to(&q);
    assert_int_equal(gshm_cluster_peers(c, NULL, &v, &n), 0);
    assert_int_equal(n, 1);
    if (strstr(v[0].message, "calls itself")) {
      seen_api = true;
      printf("peer 'ra' (C API): %s\n", v[0].message);
      assert_non_null(strstr(v[0].message, "'x??2J???evil'"));
    }
    gshm_free(v);
    gshm_disconnect(c);
    usleep(50000);
  }
  free(out);
  assert_true(seen && seen_api);
  rogue_close(&ra);
  assert_int_equal(harness_stop(&q.h), 0);
  close(lfd2);
}

/* ---- listings ------------------------------------------------------------ */

/* A List of the peer's, answered: its segments' names, its cursor. */
struct list_walk {
  uint64_t answers, next, segments, total;
  bool probe, big;
};

static void list_answer(struct rogue *r, const Gshm__Cluster__Msg *m) {
  struct list_walk *w = r->arg;
  w->answers++;
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_LIST_REPLY)
    return;
  w->next = m->list_reply->next;
  w->total = m->list_reply->total;
  w->segments += m->list_reply->n_segments;
  for (size_t i = 0; i < m->list_reply->n_segments; i++) {
    w->probe |= !strcmp(m->list_reply->segments[i]->name, "pub/probe");
    w->big |= !strcmp(m->list_reply->segments[i]->name, "pub/big");
  }
}

static bool list_answered(struct rogue *r) {
  return ((struct list_walk *)r->arg)->answers >= want_answers;
}

/* Sends List(after) as request rid from r. */
static void send_list(struct rogue *r, uint32_t rid, uint64_t after) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListRequest lr = GSHM__CLUSTER__LIST_REQUEST__INIT;
  lr.after = after;
  m.request_id = rid;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  m.list = &lr;
  rogue_send(r, &m);
}

/* The count a List from r (request rid) says now. */
static uint64_t list_total(struct rogue *r, uint32_t rid) {
  struct list_walk *w = r->arg;
  send_list(r, rid, 0);
  want_answers = w->answers + 1;
  assert_true(rogue_run_until(r, list_answered, 10000));
  return w->total;
}

enum { QUIET = 5000 };

/* Local segments that no rule exports (mode 0600), made (make) or
 * unlinked on S. */
static void quiet_segments(bool make) {
  gshm_client_t *s = connect_to(&S);
  char name[32];
  for (int i = 0; i < QUIET; i++) {
    gshm_segment_t *seg;
    snprintf(name, sizeof(name), "quiet/%05d", i);
    if (!make) {
      assert_int_equal(gshm_unlink(s, name), 0);
      continue;
    }
    assert_int_equal(gshm_create(s, name, 4096, NULL, 0600, 0, &seg), 0);
    assert_int_equal(gshm_close(seg), 0);
  }
  gshm_disconnect(s);
}

/* A peer's List walked the node's segments from the first one on, every
 * segment, exported or not, and each answer counted the exported ones
 * over all of them again (fnmatch of every rule): a List of a few bytes
 * cost the serving loop O(segments), so a peer pipelining Lists held
 * it (and local clients waited), and a set's listing of a node with many
 * segments took O(segments) a page.  A page now starts at its cursor,
 * looks at a bounded number of segments past it, and the count is kept. */
static void test_list_walks_a_bounded_part(void **state) {
  static struct rogue r;
  struct list_walk lw = {0};
  struct watch w;
  uint64_t pages = 0;
  int64_t t0, ms;
  const uint32_t nlists = 2000;
  (void)state;

  quiet_segments(true);
  assert_int_equal(rogue_connect(&r, S.port, "r", "s", key), 0);
  r.on_msg = list_answer;
  r.arg = &lw;
  /* the whole listing, page by page: every exported segment once */
  do {
    send_list(&r, (uint32_t)pages + 1, lw.next);
    want_answers = ++pages;
    assert_true(rogue_run_until(&r, list_answered, 10000));
  } while (lw.next && pages < 100);
  printf("listing of 2 exported among %d segments: %" PRIu64 " pages\n", QUIET + 2, pages);
  assert_int_equal(lw.next, 0);
  assert_true(lw.probe && lw.big);
  assert_int_equal(lw.segments, 2);
  /* a flood of first pages, answers read */
  memset(&lw, 0, sizeof(lw));
  watch_start(&w);
  t0 = now_ms();
  for (uint32_t i = 1; i <= nlists; i++) {
    send_list(&r, 1000 + i, 0);
    if (i % 100 == 0)
      rogue_run(&r, 1);
  }
  want_answers = nlists;
  assert_true(rogue_run_until(&r, list_answered, 120000));
  ms = now_ms() - t0;
  watch_stop(&w);
  printf("%u Lists answered in %" PRId64 " ms; slowest stat %" PRId64 " ms (%" PRId64
         " ms with waits for a CPU)\n", nlists, ms, w.slowest_ms, w.raw_ms);
  assert_true(pages >= 3);
  assert_true(w.slowest_ms < 100);
  /* the count, kept between changes, follows each one */
  {
    gshm_client_t *s = connect_to(&S);
    assert_int_equal(list_total(&r, 5000), 2);
    assert_int_equal(gshm_chmod(s, "pub/probe", 0600), 0);
    assert_int_equal(list_total(&r, 5001), 1);
    assert_int_equal(gshm_chmod(s, "pub/probe", 0644), 0);
    make_segment(s, "pub/more", 4096, 3);
    assert_int_equal(list_total(&r, 5002), 3);
    assert_int_equal(gshm_unlink(s, "pub/more"), 0);
    assert_int_equal(list_total(&r, 5003), 2);
    gshm_disconnect(s);
  }
  rogue_close(&r);
  quiet_segments(false);
}

/* One List answer: its cursor, its segments' count and first name. */
struct cursor_page {
  uint64_t answers, next;
  size_t n;
  char first[64];
};

static void cursor_answer(struct rogue *r, const Gshm__Cluster__Msg *m) {
  struct cursor_page *p = r->arg;
  p->answers++;
  if (m->body_case != GSHM__CLUSTER__MSG__BODY_LIST_REPLY)
    return;
  p->next = m->list_reply->next;
  p->n = m->list_reply->n_segments;
  snprintf(p->first, sizeof(p->first), "%s", p->n ? m->list_reply->segments[0]->name : "");
}

static bool cursor_answered(struct rogue *r) {
  return ((struct cursor_page *)r->arg)->answers >= want_answers;
}

/* r's List after `after` (with_in_flight: published keys from
 * RELAY_KEY_END on), answered into *p. */
static void cursor_list(struct rogue *r, struct cursor_page *p, uint64_t after, bool in_flight) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListRequest lr = GSHM__CLUSTER__LIST_REQUEST__INIT;
  lr.after = after;
  lr.with_in_flight = in_flight;
  m.request_id = (uint32_t)p->answers + 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  m.list = &lr;
  rogue_send(r, &m);
  want_answers = p->answers + 1;
  assert_true(rogue_run_until(r, cursor_answered, 10000));
}

/* A created segment's id (its handle closed). */
static uint64_t created_id(gshm_client_t *c, const char *name, uint32_t mode) {
  gshm_segment_t *seg;
  uint64_t id;
  assert_int_equal(gshm_create(c, name, 4096, NULL, mode, 0, &seg), 0);
  id = gshm_segment_info(seg)->id;
  assert_int_equal(gshm_close(seg), 0);
  return id;
}

#define KEY_END (1ull << 62) /* relay.h RELAY_KEY_END */

/* A peer's List page that looked at GSHMD_LIST_VISITS segments and
 * stopped at an exported one gives that one's key less one as its
 * cursor, not the last key it looked at: there an unexported segment's
 * id in use.  S holds pub/cur-v0 (exported), 2,048 of mode 0600, the
 * last of them unlinked, then pub/cur-v1: a page from v0 looks at v0 and
 * 2,047 unexported ones and stops at v1.  Its cursor was the id of the
 * 2,047th (in use, never listed); now it is v1's less one (the unlinked
 * one's: nobody's).  With and without with_in_flight (keys from
 * RELAY_KEY_END).  The stop at an unexported segment still tells the
 * last one's id: SECURITY.md. */
static void test_list_cursor_tells_no_id(void **state) {
  static struct rogue r;
  struct cursor_page pg = {0};
  gshm_client_t *s = connect_to(&S);
  uint64_t v0, v1, hidden_last = 0;
  char name[32];
  (void)state;

  v0 = created_id(s, "pub/cur-v0", 0644);
  for (unsigned i = 0; i < GSHM_WIRE_LIST_VISITS; i++) {
    snprintf(name, sizeof(name), "cur/%04u", i);
    if (i == GSHM_WIRE_LIST_VISITS - 2)
      hidden_last = created_id(s, name, 0600);
    else
      (void)created_id(s, name, 0600);
  }
  assert_int_equal(gshm_unlink(s, name), 0); /* (the last: freed) */
  v1 = created_id(s, "pub/cur-v1", 0644);
  assert_int_equal(rogue_connect(&r, S.port, "r", "s", key), 0);
  r.on_msg = cursor_answer;
  r.arg = &pg;
  for (int k = 0; k < 2; k++) {
    uint64_t base = k ? KEY_END : 0;
    cursor_list(&r, &pg, base + v0 - 1, k);
    printf("with_in_flight %d: a page of %zu (%s), cursor %" PRIu64 " (v1 %" PRIu64
           ", the last unexported one looked at %" PRIu64 ")\n",
           k, pg.n, pg.first, pg.next - base, v1, hidden_last);
    assert_int_equal(pg.n, 1);
    assert_string_equal(pg.first, "pub/cur-v0");
    assert_int_not_equal(pg.next, base + hidden_last); /* (the old cursor) */
    assert_int_equal(pg.next, base + v1 - 1);
    cursor_list(&r, &pg, pg.next, k);
    assert_true(pg.n >= 1);
    assert_string_equal(pg.first, "pub/cur-v1");
  }
  rogue_close(&r);
  for (unsigned i = 0; i + 1 < GSHM_WIRE_LIST_VISITS; i++) {
    snprintf(name, sizeof(name), "cur/%04u", i);
    assert_int_equal(gshm_unlink(s, name), 0);
  }
  assert_int_equal(gshm_unlink(s, "pub/cur-v0"), 0);
  assert_int_equal(gshm_unlink(s, "pub/cur-v1"), 0);
  gshm_disconnect(s);
}

/* ---- UCX sends a peer never takes ---------------------------------------- */

static bool closed_or_failed(struct rogue *r) { return r->failed || r->closed; }

/* A key holder pulls with UCX (its UcxOffer names a worker: here one of
 * a node it stopped, SIGSTOP, so that nothing takes the rendezvous of
 * its Reads' bytes) and keeps its link's connection open: the serving
 * node's sends never completed and nothing timed them out (the check of
 * a peer that does not read looked at the TCP stream's bytes only), so
 * the link held its grants, their reads and, for a segment revoked
 * meanwhile, its pages, for as long as the peer liked.  Now a send over
 * UCX that has not completed in cluster.request_timeout_ms fails the
 * link, as a stream's unread bytes do.  The endpoint (one host: no peer
 * failure detection, eager sends only) cannot be closed by force, and
 * UCX keeps its sends: they read copies of their bytes from then on, so
 * the grant, its lease and its registered mapping go with the link (a
 * stopped worker that wakes, or a dead one that never does, holds none
 * of them), and when the worker wakes UCX sends the copies (before, the
 * sends read the grant's mapping: kept until UCX's callback, and freed
 * under them, a SIGSEGV in ucp_dt_pack). */
static void test_ucx_sends_not_taken(void **state) {
  static struct node t, q;
  static struct rogue r, ra;
  static uint8_t addr[4096];
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxOffer o = GSHM__CLUSTER__UCX_OFFER__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  struct tally tl = {0};
  gshm_client_t *c;
  size_t len;
  long held, left = -1;
  int qlfd;
  bool ended;
  (void)state;

  len = worker_of(&q, &ra, "cluster.transport=ucx", &qlfd, addr, sizeof(addr));
  assert_true(len > 2);
  node_start(&t, "t", "r=127.0.0.1:1", keys.key, "pub/*", "cluster.transport=ucx",
             "cluster.request_timeout_ms=2000", NULL);
  c = connect_to(&t);
  make_segment(c, "pub/probe", 4096, 1);
  make_segment(c, "pub/u", 8 * MiB, 6);
  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_UCX;
  assert_int_equal(kill(q.h.sp.pid, SIGSTOP), 0);
  assert_int_equal(rogue_connect(&r, t.port, "r", "t", key), 0);
  r.on_msg = count_answer;
  r.arg = &tl;
  o.worker_address.data = addr;
  o.worker_address.len = len;
  o.token = 42;
  m.body_case = GSHM__CLUSTER__MSG__BODY_UCX_OFFER;
  m.ucx_offer = &o;
  rogue_send(&r, &m);
  want_answers = 1;
  assert_true(rogue_run_until(&r, all_answered, 10000)); /* (the UcxAnswer) */
  printf("UcxAnswer: %s\n", tl.other_msg);
  gr.name = "pub/u";
  m.request_id = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  rogue_send(&r, &m);
  want_answers = 2;
  assert_true(rogue_run_until(&r, all_answered, 10000));
  assert_int_equal(tl.grants, 1);
  rd.grant_id = tl.first_grant;
  rd.length = 2 * MiB;
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  for (uint32_t i = 0; i < 4; i++) {
    rd.offset = i * 2 * MiB;
    m.request_id = 10 + i;
    rogue_send(&r, &m);
  }
  ended = rogue_run_until(&r, closed_or_failed, 8000); /* (4 x the request timeout) */
  printf("UCX sends nobody takes, the link's connection open: link %s after 8 s\n",
         ended ? "ended" : "still up");
  rogue_close(&r);
  /* the sends UCX still holds read copies: the grant's registered
   * mapping went with the link */
  held = metric(c, "gshm_cluster_registered_segments");
  assert_int_equal(kill(q.h.sp.pid, SIGCONT), 0);
  /* the worker wakes, UCX sends (or drops) the copies, and calls back
   * (a send that read the freed mapping: SIGSEGV in ucp_dt_pack here) */
  for (int i = 0; i < 200 && (left = metric(c, "gshm_cluster_registered_segments")); i++)
    usleep(50000);
  printf("registered once the link failed, the worker asleep: %ld; after it woke: %ld\n", held,
         left);
  rogue_close(&ra);
  assert_int_equal(harness_stop(&q.h), 0);
  close(qlfd);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&t.h), 0);
  assert_true(ended);
  assert_int_equal(held, 0);
  assert_int_equal(left, 0);
}

/* ---- the log ------------------------------------------------------------- */

/* The grants of one link, recorded to be released. */
struct grant_ids {
  uint64_t ids[GRANTS_PER_LINK];
  unsigned n, answers;
};

static void record_grant(struct rogue *r, const Gshm__Cluster__Msg *m) {
  struct grant_ids *g = r->arg;
  g->answers++;
  if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT && g->n < GRANTS_PER_LINK)
    g->ids[g->n++] = m->grant->grant_id;
}

static bool grants_answered(struct rogue *r) {
  return ((struct grant_ids *)r->arg)->answers >= want_answers;
}

/* Lines of the file at path that hold what. */
static unsigned lines_with(const char *path, const char *what) {
  FILE *f = fopen(path, "re");
  char line[2048];
  unsigned n = 0;

  assert_non_null(f);
  while (fgets(line, sizeof(line), f))
    n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

/* A key holder's grant of one exported segment, released at once, over
 * and over: each grant was a line of the serving node's log ("granted
 * read of"), as fast as it liked, and journald keeps 10,000 lines of
 * gshmd per 30 s: the node's other lines (other peers', local users',
 * gshmd's own warnings) went unwritten.  The lines a peer's requests
 * make are held to a rate of the peer's own, as a local user's are to
 * its uid's (loglimit.h); the drops are counted in the peer's next line. */
#define LOG_ROUNDS 100
#define LOG_GRANTS_A_ROUND 50
static void test_grant_lines_held(void **state) {
  static struct node L;
  static struct rogue r;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Release rel = GSHM__CLUSTER__RELEASE__INIT;
  struct grant_ids g = {0};
  char path[160];
  unsigned granted = 0, lines, told;
  uint32_t rid = 0;
  gshm_client_t *c;
  int fd, saved;
  (void)state;

  snprintf(path, sizeof(path), "%s/l.log", keys.dir);
  assert_true((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) >= 0);
  assert_true((saved = harness_stderr_onto(fd)) >= 0);
  memset(&L, 0, sizeof(L));
  node_start(&L, "l", "r=127.0.0.1:1", keys.key, "pub/*", NULL);
  harness_stderr_back(saved);
  close(fd);
  c = connect_to(&L);
  make_segment(c, "pub/logged", 4096, 3);
  assert_int_equal(rogue_connect(&r, L.port, "r", "l", key), 0);
  r.on_msg = record_grant;
  r.arg = &g;
  for (int round = 0; round < LOG_ROUNDS; round++) {
    g.n = g.answers = 0;
    gr.name = "pub/logged";
    m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
    m.grant_request = &gr;
    for (int i = 0; i < LOG_GRANTS_A_ROUND; i++) {
      m.request_id = ++rid;
      rogue_send(&r, &m);
    }
    want_answers = LOG_GRANTS_A_ROUND;
    assert_true(rogue_run_until(&r, grants_answered, 10000));
    granted += g.n;
    m.body_case = GSHM__CLUSTER__MSG__BODY_RELEASE;
    m.release = &rel;
    m.request_id = 0;
    for (unsigned i = 0; i < g.n; i++) {
      rel.grant_id = g.ids[i];
      rogue_send(&r, &m);
    }
  }
  rogue_run(&r, 200);
  rogue_close(&r);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&L.h), 0);
  lines = lines_with(path, "granted read of");
  told = lines_with(path, "log lines about its requests not written");
  printf("%u grants of one segment, released at once: %u lines of them in the node's log, "
         "%u line(s) counting those not written\n",
         granted, lines, told);
  unlink(path);
  assert_int_equal(granted, LOG_ROUNDS * LOG_GRANTS_A_ROUND);
  /* the burst (1,000) and 20 a second after; the rest counted, the count
   * written with the peer's next line (its link gone) */
  assert_true(lines >= 100 && lines <= 1100);
  assert_true(told >= 1);
}

/* ---- key separation (protocol 2.6) ---------------------------------------- */

static bool refused_or_closed(struct rogue *r) { return r->failed || r->closed; }

/* c's daemon's refusals of cause once past was (up to 3 s). */
static long refusals_past(gshm_client_t *c, const char *cause, long was) {
  char name[96];
  snprintf(name, sizeof(name), "gshm_cluster_refusals_total{cause=\"%s\"}", cause);
  return metric_past(c, name, was);
}

/* The cluster key was both the hello's MAC key and the key of each
 * link's master key.  Between nodes that both say CAP_SUBKEYS (protocol
 * 2.6) each has its own subkey (daemon/cluster/subkeys.h), and the key
 * itself is used for neither: a peer that says CAP_SUBKEYS and MACs its
 * hello with the key itself is refused (bad_key), and S's Challenge to
 * it is not under the key itself either; one that passes the hello but
 * keys its frames from the key itself is refused at its first frame
 * (tampered).  A peer of 2.5 (no CAP_SUBKEYS: the rogue of every other
 * test here) still links with the key itself, and one of 2.6 with the
 * subkeys; both are answered. */
static void test_subkeys(void **state) {
  static struct rogue r;
  static const uint32_t honest[] = {GSHM__CLUSTER__CAP__CAP_SUBKEYS, 0};
  struct list_walk lw = {0};
  gshm_client_t *s = connect_to(&S);
  long bad_key = refusals(s, "bad_key"), tampered = refusals(s, "tampered");
  int rc;
  (void)state;

  for (size_t i = 0; i < sizeof(honest) / sizeof(honest[0]); i++) {
    memset(&r, 0, sizeof(r));
    r.caps = honest[i];
    rc = rogue_connect(&r, S.port, "r", "s", key);
    if (rc)
      print_message("caps %#x: %s\n", honest[i], r.refusal);
    assert_int_equal(rc, 0);
    r.on_msg = list_answer;
    r.arg = &lw;
    assert_int_equal(list_total(&r, 1), 2); /* pub/probe, pub/big */
    rogue_close(&r);
  }

  /* the hello's MACs under the key itself */
  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  r.raw_hello = true;
  rc = rogue_connect(&r, S.port, "r", "s", key);
  print_message("hello MAC'd with the key itself: %s\n", r.refusal);
  rogue_close(&r);
  assert_int_equal(rc, -1);
  assert_true(r.challenge_bad); /* (S's own MAC was not under the key itself) */
  assert_non_null(strstr(r.refusal, "did not prove the shared key"));
  assert_true(refusals_past(s, "bad_key", bad_key) > bad_key);

  /* the hello right, the link's keys from the key itself */
  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  r.raw_session = true;
  assert_int_equal(rogue_connect(&r, S.port, "r", "s", key), 0); /* (AuthOk in the clear:
                                                                     no CAP_AUTH_OK_KEYED) */
  lw = (struct list_walk){0};
  r.on_msg = list_answer;
  r.arg = &lw;
  send_list(&r, 2, 0);
  assert_true(rogue_run_until(&r, refused_or_closed, 5000));
  rogue_close(&r);
  assert_int_equal(lw.answers, 0);
  assert_true(refusals_past(s, "tampered", tampered) > tampered);
  gshm_disconnect(s);
}

/* Starts node q whose one peer "ra" is a rogue's listener (the rogue
 * serves: rogue_accept on the fd returned, which the caller closes),
 * rkey the rogue's key; connects to q as *c_out. */
static int q_with_serving_rogue(struct node *q, uint8_t rkey[32], gshm_client_t **c_out) {
  char peers[64];
  int port, lfd;

  rogue_key(keys.key, rkey);
  assert_true((lfd = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "ra=127.0.0.1:%d", port);
  node_start(q, "q", peers, keys.key, "", NULL);
  *c_out = connect_to(q);
  return lfd;
}

/* The same with the node as the connecting side (node q, peer "ra" the
 * rogue's listener): a serving peer of 2.6 passes q's check of its
 * Challenge and q's Auth passes the rogue's, both under the hello
 * subkey; one that MACs its Challenge with the key itself is refused
 * (bad_key on q). */
static void test_subkeys_connecting(void **state) {
  static struct node q;
  static struct rogue ra;
  uint8_t rkey[32];
  gshm_client_t *c;
  long bad_key;
  int lfd2 = q_with_serving_rogue(&q, rkey, &c), rc;
  (void)state;

  memset(&ra, 0, sizeof(ra));
  ra.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  rc = rogue_accept(&ra, lfd2, "ra", rkey);
  if (rc)
    print_message("honest serving peer of 2.6: %s\n", ra.refusal);
  rogue_close(&ra);
  assert_int_equal(rc, 0);
  bad_key = refusals(c, "bad_key");
  memset(&ra, 0, sizeof(ra));
  ra.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  ra.raw_hello = true;
  rc = rogue_accept(&ra, lfd2, "ra", rkey); /* (q tries again 2 s after the link closed) */
  rogue_close(&ra);
  assert_int_equal(rc, -1);
  assert_true(refusals_past(c, "bad_key", bad_key) > bad_key);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&q.h), 0);
  close(lfd2);
}

/* ---- cluster.min_protocol = 2.6 -------------------------------------------- */

/* Node m listening with cluster.min_protocol = 2.6 (its stderr into
 * keys.dir/m.log): a peer of 2.5 (the rogue without CAP_SUBKEYS) is
 * refused at its Hello, before m sends a Challenge (no MAC under the
 * cluster key itself leaves m: the rogue never sees one), counted as
 * version and logged naming the peer and the setting; a peer of 2.6
 * links. */
static void test_min_protocol(void **state) {
  static struct node m;
  static struct rogue r;
  char path[160];
  gshm_client_t *c;
  long version, bad_key;
  int fd, saved, rc;
  (void)state;

  snprintf(path, sizeof(path), "%s/m.log", keys.dir);
  assert_true((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) >= 0);
  assert_true((saved = harness_stderr_onto(fd)) >= 0);
  memset(&m, 0, sizeof(m));
  node_start(&m, "m", "r=127.0.0.1:1", keys.key, "pub/*", "cluster.min_protocol=2.6", NULL);
  harness_stderr_back(saved);
  close(fd);
  c = connect_to(&m);
  version = refusals(c, "version");
  bad_key = refusals(c, "bad_key");

  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_LANES; /* 2.5: no CAP_SUBKEYS */
  rc = rogue_connect(&r, m.port, "r", "m", key);
  print_message("peer of 2.5: %s\n", r.refusal);
  rogue_close(&r);
  assert_int_equal(rc, -1);
  assert_true(sodium_is_zero(r.nonce_theirs, sizeof(r.nonce_theirs))); /* no Challenge came */
  assert_non_null(strstr(r.refusal, "cluster.min_protocol"));
  assert_true(refusals_past(c, "version", version) > version);
  assert_int_equal(refusals(c, "bad_key"), bad_key);

  memset(&r, 0, sizeof(r));
  r.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  rc = rogue_connect(&r, m.port, "r", "m", key);
  if (rc)
    print_message("peer of 2.6: %s\n", r.refusal);
  rogue_close(&r);
  assert_int_equal(rc, 0);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&m.h), 0);
  assert_true(lines_with(path, "node 'r' speaks cluster protocol") == 1);
  assert_true(lines_with(path, "update gshmd on 'r'") == 1);
  unlink(path);
}

/* The same with the node as the connecting side (node q, peer "ra" the
 * rogue's listener): a serving peer of 2.5 is refused at its Challenge,
 * whose MAC q does not check (here it is under another key: version,
 * not bad_key) and does not answer (the rogue gets q's refusal, no
 * Auth); one of 2.6 links. */
static void test_min_protocol_connecting(void **state) {
  static struct node q;
  static struct rogue ra;
  char peers[64];
  uint8_t rkey[32], wrong[32];
  gshm_client_t *c;
  long version, bad_key;
  int port, lfd2, rc;
  (void)state;

  rogue_key(keys.key, rkey);
  rogue_key(keys.other_key, wrong);
  assert_true((lfd2 = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "ra=127.0.0.1:%d", port);
  node_start(&q, "q", peers, keys.key, "", "cluster.min_protocol=2.6", NULL);
  c = connect_to(&q);
  version = refusals(c, "version");
  bad_key = refusals(c, "bad_key");
  memset(&ra, 0, sizeof(ra));
  ra.caps = GSHM__CLUSTER__CAP__CAP_LANES; /* 2.5 */
  rc = rogue_accept(&ra, lfd2, "ra", wrong);
  rogue_run_until(&ra, refused_or_closed, 5000);
  print_message("serving peer of 2.5: %s\n", ra.refusal);
  rogue_close(&ra);
  assert_int_equal(rc, -1);
  assert_non_null(strstr(ra.refusal, "cluster.min_protocol"));
  assert_true(refusals_past(c, "version", version) > version);
  assert_int_equal(refusals(c, "bad_key"), bad_key);

  memset(&ra, 0, sizeof(ra));
  ra.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
  rc = rogue_accept(&ra, lfd2, "ra", rkey); /* (q tries again 2 s after the link closed) */
  if (rc)
    print_message("serving peer of 2.6: %s\n", ra.refusal);
  rogue_close(&ra);
  assert_int_equal(rc, 0);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&q.h), 0);
  close(lfd2);
}

/* gshmctl peers shows what an up peer's hello announced and whether its
 * link uses the subkeys: node q connected to a serving peer "ra" that
 * says 2.5 without CAP_SUBKEYS shows 2.5 and no (the node an operator
 * must update before cluster.min_protocol = 2.6), to one of 2.6 2.6 and
 * yes; text, --json and the C API. */
static void test_peers_protocol(void **state) {
  static struct node q;
  static struct rogue ra;
  static const struct {
    uint32_t caps, minor;
    const char *row, *json;
  } cases[] = {
      {0, 5, " up         2.5   no      ", "\"subkeys\": false"},
      {GSHM__CLUSTER__CAP__CAP_SUBKEYS, 6, " up         2.6   yes     ", "\"subkeys\": true"},
  };
  char want[32], *out = NULL;
  uint8_t rkey[32];
  gshm_client_t *c;
  int lfd2 = q_with_serving_rogue(&q, rkey, &c);
  (void)state;

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    gshm_cluster_peer_t *v = NULL;
    size_t n = 0;
    memset(&ra, 0, sizeof(ra));
    ra.caps = cases[i].caps;
    ra.minor = cases[i].minor;
    /* (q connects again 2 s after the last link closed) */
    if (rogue_accept(&ra, lfd2, "ra", rkey))
      fail_msg("serving peer of 2.%u: %s", cases[i].minor, ra.refusal);
    assert_int_equal(gshm_cluster_peers(c, NULL, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].state, "up");
    assert_int_equal(v[0].protocol_major, 2);
    assert_int_equal(v[0].protocol_minor, cases[i].minor);
    assert_int_equal(v[0].subkeys, cases[i].caps == GSHM__CLUSTER__CAP__CAP_SUBKEYS);
    gshm_free(v);
    assert_int_equal(harness_gshmctl(&q.h, &out, (const char *[]){"peers", NULL}), 0);
    if (!strstr(out, cases[i].row))
      fail_msg("peers lacks '%s': %s", cases[i].row, out);
    free(out);
    assert_int_equal(harness_gshmctl(&q.h, &out, (const char *[]){"--json", "peers", NULL}), 0);
    snprintf(want, sizeof(want), "\"protocol\": \"2.%u\"", cases[i].minor);
    if (!strstr(out, want) || !strstr(out, cases[i].json))
      fail_msg("peers --json lacks %s, %s: %s", want, cases[i].json, out);
    free(out);
    rogue_close(&ra);
  }
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&q.h), 0);
  close(lfd2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_peer_message_escaped),
      cmocka_unit_test(test_peers_protocol),
      cmocka_unit_test(test_links_per_peer),
      cmocka_unit_test(test_hello_slots_spare_peers),
      cmocka_unit_test(test_hello_slots_spare_peers_budget),
      cmocka_unit_test(test_pull_with_no_budget_fails),
      cmocka_unit_test(test_budget_grows_with_peers),
      cmocka_unit_test(test_refused_link_counted_once),
      cmocka_unit_test(test_refused_links_count_as_up),
      cmocka_unit_test(test_grant_and_read_flood),
      cmocka_unit_test(test_read_bytes_capped),
      cmocka_unit_test(test_staged_grants),
      cmocka_unit_test(test_staged_buffers_off_loop),
      cmocka_unit_test(test_honest_pulls_within_caps),
      cmocka_unit_test(test_ucx_offer_junk),
      cmocka_unit_test(test_ucx_offer_once_a_link),
      cmocka_unit_test(test_ucx_offer_mutated),
      cmocka_unit_test(test_lanes_per_link),
      cmocka_unit_test(test_revoke_under_grant),
      cmocka_unit_test(test_list_walks_a_bounded_part),
      cmocka_unit_test(test_list_cursor_tells_no_id),
      cmocka_unit_test(test_ucx_sends_not_taken),
      cmocka_unit_test(test_grant_lines_held),
      cmocka_unit_test(test_subkeys),
      cmocka_unit_test(test_subkeys_connecting),
      cmocka_unit_test(test_min_protocol),
      cmocka_unit_test(test_min_protocol_connecting),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
