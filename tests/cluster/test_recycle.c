/* SPDX-License-Identifier: Apache-2.0 */
/* daemon.host_recycle, with real gshmd on 127.0.0.1 over gshm's TCP
 * stream: a pull of the same size lands in the memory of a freed pulled
 * segment, byte-exact, the page's tail past the size zeroed; memory that
 * a client can still reach (its fd, a dup, a mapping, read-write or
 * read-only) is never taken, and its writes never appear in the new
 * segment; memory another user's client mapped (and could have kept
 * pages of, through a pipe) goes back to no other user; a segment over
 * the cap is not kept; a failed pull into recycled memory leaves nothing
 * visible; a peer relaying a pull into recycled memory serves only what
 * has landed. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"

#define SIZE (8 * MiB + 123) /* not a page multiple: the last page's tail; each
                             * test pulls a size of its own (the pool keeps sizes),
                             * STEP apart */
#define CAP "48M"
#define BIG (56 * MiB)       /* over the cap */
#define PAGE 4096
/* Sizes of pulls apart by this much are kept apart by the pool: a pull of
 * 2 MiB or more is made in whole 2 MiB pages where shared memory gets
 * them (its segment's size says what it got: alloc_size) */
#define STEP (2 * MiB)

static struct cluster_keys keys;
static struct node A, J, B, C; /* A and J serve pub/ *; B pulls and recycles, and
                                * relays r/ * to C */

static int group_setup(void **state) {
  char pa[64], pb[128];
  (void)state;

  keys_make(&keys, "gshm-recycle");
  A.port = free_port();
  J.port = free_port();
  B.port = free_port();
  C.port = free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", B.port);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d,j=127.0.0.1:%d,c=127.0.0.1:%d", A.port, J.port,
           C.port);
  node_start(&A, "a", pa, keys.key, "pub/*", NULL);
  node_start(&J, "j", pa, keys.key, "pub/*", NULL);
  /* small reads, one at a time: a pull lasts long enough to kill its
   * peer, or to be relayed */
  node_start(&B, "b", pb, keys.key, "r/*", "daemon.host_recycle=" CAP, "cluster.pull_chunk=16K",
             "cluster.pull_depth=1", NULL);
  node_start(&C, "c", pa, keys.key, "", "cluster.pull_chunk=1M", NULL);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  assert_int_equal(harness_stop(&C.h), 0);
  assert_int_equal(harness_stop(&B.h), 0);
  if (J.h.sp.pid > 0)
    assert_int_equal(harness_stop(&J.h), 0);
  assert_int_equal(harness_stop(&A.h), 0);
  keys_remove(&keys);
  return 0;
}

/* A's pub/NAME holds size bytes of seed (made again when it exists). */
static void source(const char *name, uint64_t size, unsigned long long seed) {
  gshm_client_t *a = connect_to(&A);
  char full[128];

  snprintf(full, sizeof(full), "pub/%s", name);
  gshm_unlink(a, full);
  make_segment(a, full, size, seed);
  gshm_disconnect(a);
}

/* B pulls pub/NAME from peer into NAME (0644); returns the pull's status. */
static int pull(const char *peer, const char *name, int replace) {
  gshm_client_t *b = connect_to(&B);
  gshm_pull_opts_t po = {.local_name = name, .mode = 0644, .replace = replace};
  char full[128];
  int e;

  snprintf(full, sizeof(full), "pub/%s", name);
  e = gshm_pull(b, peer, full, &po, NULL);
  gshm_disconnect(b);
  return e;
}

static long b_metric(const char *name) {
  gshm_client_t *b = connect_to(&B);
  long v = metric(b, name);
  gshm_disconnect(b);
  return v;
}

/* Unlinks NAME on B and waits until gshmd has freed it (a client's
 * lease may end a moment after it said so). */
static void drop(const char *name) {
  gshm_client_t *b = connect_to(&B);
  gshm_status_info_t s;
  uint32_t before;

  assert_int_equal(gshm_status(b, &s), 0);
  before = s.segments;
  assert_int_equal(gshm_unlink(b, name), 0);
  for (int i = 0; i < 500; i++) {
    assert_int_equal(gshm_status(b, &s), 0);
    if (s.segments < before)
      break;
    usleep(10000);
  }
  assert_int_equal(s.segments, before - 1);
  gshm_disconnect(b);
}

static void check(const char *name, uint64_t size, unsigned long long seed) {
  gshm_client_t *b = connect_to(&B);
  check_segment(b, name, size, seed);
  gshm_disconnect(b);
}

/* The bytes B allocated for NAME (its size past the requested one). */
static uint64_t alloc_size(const char *name) {
  gshm_client_t *b = connect_to(&B);
  gshm_segment_info_t st;

  assert_int_equal(gshm_stat_name(b, name, &st), 0);
  gshm_disconnect(b);
  assert_true(st.size >= st.requested_size && st.size % PAGE == 0);
  return st.size;
}

/* Writes 0xEE over the tail of NAME on B (past its size to the end of
 * what was allocated), through a read-write lease of this process. */
static void dirty_tail(const char *name, uint64_t size) {
  uint64_t alloc = alloc_size(name);
  gshm_client_t *b = connect_to(&B);
  gshm_segment_t *seg;
  uint8_t *p;

  assert_true(alloc > size);
  assert_int_equal(gshm_open(b, name, GSHM_ACCESS_READ_WRITE, &seg), 0);
  assert_int_equal(gshm_map(seg, NULL, 0, (void **)&p), 0);
  memset(p + size, 0xEE, alloc - size);
  gshm_close(seg);
  gshm_disconnect(b);
}

/* Asserts that this process's mapping at p shows the neutral label of
 * pulled memory ("memfd:gshm:pull"), no segment's name. */
static void check_label(const void *p) {
  char line[512], want[32];
  bool found = false;
  FILE *f = fopen("/proc/self/maps", "r");

  assert_non_null(f);
  snprintf(want, sizeof(want), "%lx-", (unsigned long)(uintptr_t)p);
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, want, strlen(want))) {
      assert_non_null(strstr(line, "memfd:gshm:pull "));
      found = true;
    }
  fclose(f);
  assert_true(found);
}

/* Whether the tail of NAME on B, past size, reads zeros. */
static bool tail_is_zero(const char *name, uint64_t size) {
  uint64_t alloc = alloc_size(name);
  gshm_client_t *b = connect_to(&B);
  gshm_segment_t *seg;
  uint8_t *p;
  bool zero = true;

  assert_int_equal(gshm_open(b, name, GSHM_ACCESS_READ, &seg), 0);
  assert_int_equal(gshm_map(seg, NULL, 0, (void **)&p), 0);
  check_label(p);
  for (uint64_t i = size; i < alloc; i++)
    zero = zero && p[i] == 0;
  gshm_close(seg);
  gshm_disconnect(b);
  return zero;
}

/* A pull, dropped, then pulled again at the same size: it lands in the
 * first one's memory (the metrics say so) and holds the new bytes, with
 * the page's tail zeroed although a client wrote there.  Then --replace:
 * the replaced copy's memory serves the next replace. */
/* Whether gshmd pid ignores signal sig (/proc/PID/status SigIgn). */
static bool ignores(pid_t pid, int sig) {
  char path[64], line[256];
  unsigned long long mask = 0;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  assert_non_null(f = fopen(path, "re"));
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "SigIgn: %llx", &mask) == 1)
      break;
  fclose(f);
  return (mask >> (sig - 1)) & 1;
}

/* The lease that tells whether memory may be recycled is held for an
 * instant; a memfd opened then (by root) signals its holder SIGIO, which
 * must not end gshmd. */
static void test_sigio_ignored(void **state) {
  (void)state;
  assert_true(ignores(B.h.sp.pid, SIGIO));
  assert_true(ignores(B.h.sp.pid, SIGPIPE));
}

static void test_recycled(void **state) {
  long pulls0 = b_metric("gshm_cluster_recycled_pulls_total");
  uint64_t alloc;
  (void)state;

  source("w", SIZE, 1);
  assert_int_equal(pull("a", "w", 0), 0);
  check("w", SIZE, 1);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0); /* cold */
  dirty_tail("w", SIZE);
  alloc = alloc_size("w");
  drop("w");
  assert_int_equal(b_metric("gshm_cluster_recycle_bytes"), alloc);
  assert_int_equal(b_metric("gshm_cluster_recycle_segments"), 1);

  source("w", SIZE, 3);
  assert_int_equal(pull("a", "w", 0), 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0 + 1);
  assert_int_equal(b_metric("gshm_cluster_recycle_bytes"), 0);
  check("w", SIZE, 3);
  assert_true(tail_is_zero("w", SIZE));

  /* weight updates: --replace, the old copy freed at the publish */
  source("w", SIZE, 5);
  assert_int_equal(pull("a", "w", 1), 0); /* (the pool is empty: new memory) */
  check("w", SIZE, 5);
  assert_int_equal(b_metric("gshm_cluster_recycle_segments"), 1); /* the replaced one */
  source("w", SIZE, 7);
  assert_int_equal(pull("a", "w", 1), 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0 + 2);
  check("w", SIZE, 7);
  drop("w");
}

/* ---- a client that keeps the memory after its lease ---- */

enum keep { KEEP_RW_MAP, KEEP_RO_MAP, KEEP_DUP };

/* The attacker: opens NAME on B, keeps a mapping (or a dup of the fd),
 * lets go of its lease and connection, says so on `ready`, then at `go`
 * writes 0xAB over the first page through what it kept, and says so. */
static void attacker(const char *name, uint64_t size, enum keep keep, int ready, int go) {
  gshm_client_t *c;
  gshm_segment_t *seg;
  uint8_t *p = NULL;
  int fd = -1;
  char ch = 'r';

  if (gshm_connect(B.h.socket_path, "attacker", &c) ||
      gshm_open(c, name, keep == KEEP_RO_MAP ? GSHM_ACCESS_READ : GSHM_ACCESS_READ_WRITE, &seg))
    _exit(2);
  if (keep == KEEP_DUP)
    fd = dup(gshm_segment_fd(seg));
  else
    p = mmap(NULL, size, keep == KEEP_RO_MAP ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED,
             gshm_segment_fd(seg), 0);
  if (fd < 0 && (p == NULL || p == MAP_FAILED))
    _exit(3);
  gshm_close(seg);
  gshm_disconnect(c);
  if (write(ready, &ch, 1) != 1 || read(go, &ch, 1) != 1)
    _exit(4);
  if (keep == KEEP_DUP)
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (keep != KEEP_RO_MAP && p != MAP_FAILED)
    memset(p, 0xAB, PAGE);
  if (write(ready, &ch, 1) != 1)
    _exit(5);
  _exit(0);
}

/* w is pulled; a client keeps it past its lease (keep); w is freed: its
 * memory is not kept, so the next pull of that size (one no other test
 * uses) is not recycled, and the client's writes never reach the new w. */
static void attack(enum keep keep) {
  long pulls0 = b_metric("gshm_cluster_recycled_pulls_total");
  long refused0 = b_metric("gshm_cluster_recycle_refused_total");
  long held0 = b_metric("gshm_cluster_recycle_bytes");
  uint64_t size = SIZE + (1 + (uint64_t)keep) * STEP;
  int up[2], down[2], status;
  pid_t child;
  char ch;

  source("w", size, 11 + 2 * (unsigned)keep);
  assert_int_equal(pull("a", "w", 0), 0);
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  child = fork();
  assert_true(child >= 0);
  if (child == 0)
    attacker("w", size, keep, up[1], down[0]);
  assert_int_equal(read(up[0], &ch, 1), 1); /* it let go of its lease, kept the rest */
  drop("w");
  assert_int_equal(b_metric("gshm_cluster_recycle_refused_total"), refused0 + 1);
  assert_int_equal(b_metric("gshm_cluster_recycle_bytes"), held0);
  source("w", size, 21 + 2 * (unsigned)keep);
  assert_int_equal(pull("a", "w", 0), 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0);
  assert_int_equal(write(down[1], "g", 1), 1);
  assert_int_equal(read(up[0], &ch, 1), 1); /* it wrote through what it kept */
  check("w", size, 21 + 2 * (unsigned)keep);
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(up[0]);
  close(up[1]);
  close(down[0]);
  close(down[1]);
  drop("w");
}

static void test_attack_rw_mapping(void **state) {
  (void)state;
  attack(KEEP_RW_MAP);
}

static void test_attack_ro_mapping(void **state) {
  (void)state;
  attack(KEEP_RO_MAP);
}

static void test_attack_dup(void **state) {
  (void)state;
  attack(KEEP_DUP);
}

/* Another user's client maps w read-only and splices its first pages
 * into a pipe (the pipe holds the pages themselves, which no fd or
 * mapping shows), then lets go of everything but the pipe.  w is freed:
 * no open file description is left, so its memory is kept; but not for
 * the next pull of root, whose bytes the pipe would show: the pipe still
 * reads w's old bytes. */
static void test_attack_other_user_pipe(void **state) {
  long pulls0 = b_metric("gshm_cluster_recycled_pulls_total");
  const uint64_t size = SIZE + 8 * STEP; /* (no other test's) */
  long refused0 = b_metric("gshm_cluster_recycle_refused_total");
  uint8_t old[64], now[64], fresh[64];
  int up[2], down[2], status;
  pid_t child;
  char ch;
  (void)state;

  source("w", size, 31);
  assert_int_equal(pull("a", "w", 0), 0);
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    gshm_client_t *c;
    gshm_segment_t *seg;
    int pp[2];
    void *p;
    struct iovec iov;
    if (setgroups(0, NULL) || setgid(65534) || setuid(65534) || pipe(pp) ||
        gshm_connect(B.h.socket_path, "nobody", &c) ||
        gshm_open(c, "w", GSHM_ACCESS_READ, &seg) || gshm_map(seg, NULL, 0, &p))
      _exit(2);
    iov.iov_base = p;
    iov.iov_len = 16 * PAGE;
    if (vmsplice(pp[1], &iov, 1, 0) != (ssize_t)iov.iov_len)
      _exit(3);
    gshm_close(seg);
    gshm_disconnect(c);
    if (write(up[1], "r", 1) != 1 || read(down[0], &ch, 1) != 1 ||
        read(pp[0], now, sizeof(now)) != (ssize_t)sizeof(now) ||
        write(up[1], now, sizeof(now)) != (ssize_t)sizeof(now))
      _exit(4);
    _exit(0);
  }
  assert_int_equal(read(up[0], &ch, 1), 1);
  drop("w");
  /* no open file description was left: kept (not refused), but not for root */
  assert_int_equal(b_metric("gshm_cluster_recycle_refused_total"), refused0);
  source("w", size, 33);
  assert_int_equal(pull("a", "w", 0), 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0);
  assert_int_equal(write(down[1], "g", 1), 1);
  assert_int_equal(read(up[0], now, sizeof(now)), (ssize_t)sizeof(now));
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  harness_random(fresh, sizeof(fresh), 33);
  harness_random(old, sizeof(old), 31);
  assert_memory_not_equal(now, fresh, sizeof(now));
  assert_memory_equal(now, old, sizeof(now));
  check("w", size, 33);
  close(up[0]);
  close(up[1]);
  close(down[0]);
  close(down[1]);
  drop("w");
}

/* A segment larger than daemon.host_recycle is not kept; of two that fit
 * one at a time, the older goes. */
static void test_cap(void **state) {
  long pulls0;
  (void)state;

  source("big", BIG, 41);
  assert_int_equal(pull("a", "big", 0), 0);
  drop("big");
  assert_true(b_metric("gshm_cluster_recycle_bytes") <= 48 * (long)MiB);
  pulls0 = b_metric("gshm_cluster_recycled_pulls_total");
  assert_int_equal(pull("a", "big", 0), 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0);
  check("big", BIG, 41);
  drop("big");
  /* 24 MiB and then 32 MiB freed: 56 MiB is over the cap, the older ones
   * go (with what the tests before left) */
  source("x", 24 * MiB, 43);
  source("y", 32 * MiB, 45);
  assert_int_equal(pull("a", "x", 0), 0);
  assert_int_equal(pull("a", "y", 0), 0);
  drop("x");
  drop("y");
  assert_int_equal(b_metric("gshm_cluster_recycle_bytes"), 32 * (long)MiB);
  assert_int_equal(b_metric("gshm_cluster_recycle_segments"), 1);
  assert_int_equal(pull("a", "y", 0), 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0 + 1);
  check("y", 32 * MiB, 45);
  drop("y");
}

/* B's pull of pub/NAME from peer (NULL: a) as local (NULL: r/NAME), in
 * the background. */
struct bg {
  pthread_t t;
  const char *name, *peer, *local;
  int err;
};

static void *bg_pull(void *arg) {
  struct bg *g = arg;
  char local[64];

  snprintf(local, sizeof(local), "r/%s", g->name);
  {
    gshm_client_t *b = connect_to(&B);
    gshm_pull_opts_t po = {.local_name = g->local ? g->local : local, .mode = 0644};
    char full[64];
    snprintf(full, sizeof(full), "pub/%s", g->name);
    g->err = gshm_pull(b, g->peer ? g->peer : "a", full, &po, NULL);
    gshm_disconnect(b);
  }
  return NULL;
}

/* Waits until B has a pull in flight with some bytes in. */
static void wait_under_way(void) {
  gshm_client_t *b = connect_to(&B);
  bool seen = false;

  for (int k = 0; k < 5000 && !seen; k++) {
    gshm_cluster_pull_t *v = NULL;
    size_t n = 0;
    assert_int_equal(gshm_cluster_pulls(b, &v, &n), 0);
    seen = n == 1 && v[0].bytes_done > 0;
    gshm_free(v);
    if (!seen)
      usleep(1000);
  }
  assert_true(seen);
  gshm_disconnect(b);
}

/* A pull into recycled memory whose peer dies midway (once some bytes
 * are in: B's 16 KiB reads one at a time leave most to come, where a
 * progress report, 200 ms in, came after the last byte once B's lanes
 * stopped asking its loop for each frame): nothing is visible, and the
 * next pull of that size lands whole. */
static void test_failed_pull(void **state) {
  struct bg g = {.name = "f", .peer = "j", .local = "f"};
  gshm_client_t *b;
  gshm_status_info_t s;
  long pulls0;
  (void)state;

  source("f", 32 * MiB, 51);
  assert_int_equal(pull("a", "f", 0), 0);
  drop("f");
  pulls0 = b_metric("gshm_cluster_recycled_pulls_total");
  b = connect_to(&J);
  make_segment(b, "pub/f", 32 * MiB, 53);
  gshm_disconnect(b);
  assert_int_equal(pthread_create(&g.t, NULL, bg_pull, &g), 0);
  wait_under_way();
  kill(J.h.sp.pid, SIGKILL);
  pthread_join(g.t, NULL);
  assert_int_equal(g.err, -ECONNRESET);
  gshm__spawn_cleanup(&J.h.sp);
  J.h.sp.pid = 0;
  b = connect_to(&B);
  assert_int_equal(count_named(b, "f"), 0);
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, 0);
  gshm_disconnect(b);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0 + 1);
  source("f", 32 * MiB, 55);
  assert_int_equal(pull("a", "f", 0), 0);
  check("f", 32 * MiB, 55);
  drop("f");
}

/* C pulls r/rel from B while B still pulls it into recycled memory that
 * holds another segment's bytes: B relays only chunks that have landed,
 * so C gets the new bytes, every one. */
static void test_relay_no_stale_bytes(void **state) {
  struct bg g = {.name = "rel"};
  gshm_client_t *c;
  gshm_pull_opts_t po = {.local_name = "rel", .mode = 0644};
  long pulls0;
  (void)state;

  source("rel", 30 * MiB - 4096, 61); /* (no other test's size) */
  assert_int_equal(pull("a", "rel", 0), 0);
  drop("rel"); /* its memory, holding seed 61's bytes, is pooled */
  pulls0 = b_metric("gshm_cluster_recycled_pulls_total");
  source("rel", 30 * MiB - 4096, 63);
  assert_int_equal(pthread_create(&g.t, NULL, bg_pull, &g), 0);
  wait_under_way();
  c = connect_to(&C);
  assert_int_equal(gshm_pull(c, "b", "r/rel", &po, NULL), 0);
  pthread_join(g.t, NULL);
  assert_int_equal(g.err, 0);
  assert_int_equal(b_metric("gshm_cluster_recycled_pulls_total"), pulls0 + 1);
  check_segment(c, "rel", 30 * MiB - 4096, 63);
  assert_int_equal(gshm_unlink(c, "rel"), 0);
  gshm_disconnect(c);
  check("r/rel", 30 * MiB - 4096, 63);
  drop("r/rel");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigio_ignored),
      cmocka_unit_test(test_recycled),
      cmocka_unit_test(test_attack_rw_mapping),
      cmocka_unit_test(test_attack_ro_mapping),
      cmocka_unit_test(test_attack_dup),
      cmocka_unit_test(test_attack_other_user_pipe),
      cmocka_unit_test(test_cap),
      cmocka_unit_test(test_failed_pull),
      cmocka_unit_test(test_relay_no_stale_bytes),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
