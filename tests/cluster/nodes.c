/* SPDX-License-Identifier: Apache-2.0 */
/* What the cluster tests share (nodes.h). */
#include "nodes.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

char node_group[64];

/* Every node started, so that a failed check leaves no gshmd behind. */
static struct node *started[32]; /* (test_cluster_hostile starts 17) */
static unsigned nstarted;

void nodes_kill(void) {
  for (unsigned i = 0; i < nstarted; i++)
    if (started[i]->h.sp.pid > 0)
      kill(started[i]->h.sp.pid, SIGKILL);
}

int nodes_run_group(const char *name, const struct CMUnitTest *tests, size_t n,
                    int (*setup)(void **), int (*teardown)(void **)) {
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  atexit(harness_kill_leftover);
  atexit(nodes_kill);
  if (getenv("GSHM_TEST_FILTER"))
    cmocka_set_test_filter(getenv("GSHM_TEST_FILTER"));
  return _cmocka_run_group_tests(name, tests, n, setup, teardown);
}

int free_port(void) {
  int port = harness_free_port();

  assert_true(port > 0);
  return port;
}

int listen_local(int backlog, int *port_out) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_int_equal(listen(fd, backlog), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  *port_out = ntohs(sa.sin_port);
  return fd;
}

void write_key(const char *path, unsigned long long seed) {
  char key[44];
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

  assert_true(fd >= 0);
  harness_random(key, sizeof(key), seed);
  for (size_t i = 0; i < sizeof(key); i++)
    key[i] = (char)('a' + (unsigned char)key[i] % 26);
  assert_int_equal(write(fd, key, sizeof(key)), (ssize_t)sizeof(key));
  close(fd);
}

/* Starts node n with its cluster settings; extra "--set" values follow. */
void node_start(struct node *n, const char *name, const char *peers, const char *key,
                       const char *exports, ...) {
  va_list ap;
  const char *extra;
  int k = 0;

  /* a test that failed between this node's start and its stop left it
   * running: started again over it, it would be orphaned (its pid gone
   * from n), hold the output pipe, and ctest would wait out the
   * timeout instead of showing the failure */
  if (n->h.sp.pid > 0) {
    kill(n->h.sp.pid, SIGKILL);
    harness_stop(&n->h);
  }
  snprintf(n->name, sizeof(n->name), "%s", name);
  if (!n->port)
    n->port = free_port();
#define SET(...) snprintf(n->argv_store[k], sizeof(n->argv_store[k]), __VA_ARGS__), k++
  SET("--set=cluster.listen=127.0.0.1:%d", n->port);
  SET("--set=cluster.node_name=%s", name);
  SET("--set=cluster.peers=%s", peers);
  SET("--set=cluster.secret_file=%s", key);
  SET("--set=cluster.export=%s", exports);
  SET("--set=cluster.pull_group=%s", node_group);
  SET("--set=daemon.socket_mode=0666"); /* nobody's clients (test_least_privilege) */
  if (getenv("GSHM_TEST_CLUSTER_TRANSPORT")) /* every node of the run: ctest runs it twice */
    SET("--set=cluster.transport=%s", getenv("GSHM_TEST_CLUSTER_TRANSPORT"));
  va_start(ap, exports);
  while ((extra = va_arg(ap, const char *)) && k < 16)
    SET("--set=%s", extra);
  va_end(ap);
#undef SET
  for (int i = 0; i < k; i++)
    n->argv[i] = n->argv_store[i];
  n->argv[k] = NULL;
  for (unsigned i = 0; i < nstarted; i++)
    if (started[i] == n) { /* (started before: nodes_kill reads its pid at exit) */
      assert_int_equal(harness_start(&n->h, n->argv), 0);
      return;
    }
  /* (checked before the start: a node past the table was left running) */
  assert_true(nstarted < sizeof(started) / sizeof(started[0]));
  started[nstarted++] = n;
  assert_int_equal(harness_start(&n->h, n->argv), 0);
}

gshm_client_t *connect_to(struct node *n) {
  gshm_client_t *c;
  assert_int_equal(gshm_connect(n->h.socket_path, "test_cluster", &c), 0);
  return c;
}

/* A host segment of size bytes filled from seed, created on n. */
void make_segment(gshm_client_t *c, const char *name, uint64_t size,
                         unsigned long long seed) {
  gshm_segment_t *seg;
  void *p;
  /* readable by others: what a plain export rule lets peers read */
  assert_int_equal(gshm_create(c, name, size, "host", 0644, 0, &seg), 0);
  assert_int_equal(gshm_map(seg, NULL, 0, &p), 0);
  harness_random(p, size, seed);
  gshm_close(seg);
}

/* Does segment name on c hold exactly the bytes of seed? */
void check_segment(gshm_client_t *c, const char *name, uint64_t size,
                          unsigned long long seed) {
  gshm_segment_t *seg;
  uint8_t *want = malloc(size);
  void *p;
  assert_non_null(want);
  harness_random(want, size, seed);
  assert_int_equal(gshm_open(c, name, GSHM_ACCESS_READ, &seg), 0);
  assert_true(gshm_segment_info(seg)->requested_size == size);
  assert_int_equal(gshm_map(seg, NULL, 0, &p), 0);
  assert_int_equal(memcmp(p, want, size), 0);
  gshm_close(seg);
  free(want);
}

unsigned count_named(gshm_client_t *c, const char *prefix) {
  gshm_segment_info_t *v = NULL;
  size_t n = 0;
  unsigned k = 0;
  assert_int_equal(gshm_list(c, &v, &n), 0);
  for (size_t i = 0; i < n; i++)
    k += strncmp(v[i].name, prefix, strlen(prefix)) == 0;
  gshm_free(v);
  return k;
}

void set_make(gshm_client_t *c, const char *prefix, int n, uint64_t (*size)(int),
              unsigned long long base) {
  char name[300];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "%s%02d", prefix, i);
    make_segment(c, name, size(i), base + (unsigned long long)i);
  }
}

void set_check(gshm_client_t *c, const char *prefix, int n, uint64_t (*size)(int),
               unsigned long long base) {
  char name[300];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "%s%02d", prefix, i);
    check_segment(c, name, size(i), base + (unsigned long long)i);
  }
}

void set_unlink(gshm_client_t *c, const char *prefix, int n) {
  char name[300];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "%s%02d", prefix, i);
    assert_int_equal(gshm_unlink(c, name), 0);
  }
}

/* A counter or gauge (no labels) from c's daemon's metrics. */
void assert_nothing_left(gshm_client_t *c, const char *name) {
  gshm_status_info_t st;
  gshm_segment_info_t info;

  assert_int_equal(gshm_status(c, &st), 0);
  assert_int_equal(st.segments, 0);
  assert_int_equal(st.bytes, 0);
  if (name)
    assert_int_equal(gshm_stat_name(c, name, &info), -ENOENT);
}

long metric(gshm_client_t *c, const char *name) {
  char *text = NULL, key[160];
  const char *m;
  long v;
  assert_int_equal(gshm_metrics(c, &text), 0);
  snprintf(key, sizeof(key), "\n%s ", name);
  m = strstr(text, key);
  assert_non_null(m);
  v = atol(m + strlen(key));
  gshm_free(text);
  return v;
}

long metric_past(gshm_client_t *c, const char *name, long floor) {
  long v = metric(c, name);
  for (int i = 0; i < 150 && v <= floor; i++) {
    usleep(20000);
    v = metric(c, name);
  }
  return v;
}

void keys_make(struct cluster_keys *k, const char *prefix) {
  struct group *g = getgrgid(getegid());

  snprintf(k->dir, sizeof(k->dir), "/tmp/%s-XXXXXX", prefix);
  assert_non_null(mkdtemp(k->dir));
  snprintf(k->key, sizeof(k->key), "%s/key", k->dir);
  snprintf(k->other_key, sizeof(k->other_key), "%s/other-key", k->dir);
  write_key(k->key, 1);
  write_key(k->other_key, 2);
  assert_non_null(g);
  snprintf(node_group, sizeof(node_group), "%s", g->gr_name);
}

void keys_remove(struct cluster_keys *k) {
  unlink(k->key);
  unlink(k->other_key);
  rmdir(k->dir);
}

void nodes_stop(struct node *serving, struct node *puller) {
  assert_int_equal(harness_stop(&puller->h), 0);
  assert_int_equal(harness_stop(&serving->h), 0);
  harness_set_leftover(NULL);
}

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Nanoseconds thread tid of process pid has waited for a CPU so far. */
static int64_t run_delay_ns(pid_t pid, pid_t tid) {
  char path[96];
  long long on_cpu = 0, delay = 0;
  FILE *f;
  snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, (int)tid);
  if (!(f = fopen(path, "r")))
    return 0;
  if (fscanf(f, "%lld %lld", &on_cpu, &delay) != 2)
    delay = 0;
  fclose(f);
  return delay;
}

int64_t slowest_stat_busy(gshm_client_t *c, const char *name, int n, pid_t gshmd,
                          int64_t *raw_out) {
  pid_t me = getpid(), tid = (pid_t)syscall(SYS_gettid);
  int64_t worst = 0, raw_worst = 0;
  for (int i = 0; i < n; i++) {
    gshm_segment_info_t info;
    int64_t d0 = run_delay_ns(me, tid) + run_delay_ns(gshmd, gshmd), t0 = now_ms(), raw;
    int err = gshm_stat_name(c, name, &info);
    if (err)
      return err < 0 ? err : -EIO; /* (no cmocka assert: watch threads call this) */
    raw = now_ms() - t0;
    if (raw > raw_worst)
      raw_worst = raw;
    raw -= (run_delay_ns(me, tid) + run_delay_ns(gshmd, gshmd) - d0) / 1000000;
    if (raw > worst)
      worst = raw;
  }
  if (raw_out)
    *raw_out = raw_worst;
  return worst;
}

static void *peers_monitor_thread(void *arg) {
  struct peers_monitor *m = arg;
  gshm_client_t *c;

  if (gshm_connect(m->n->h.socket_path, "monitor", &c))
    return NULL;
  while (!atomic_load(m->stop)) {
    gshm_cluster_peer_t *v = NULL;
    size_t n = 0;
    gshm_cluster_peers(c, NULL, &v, &n);
    gshm_free(v);
    usleep(200000);
  }
  gshm_disconnect(c);
  return NULL;
}

void peers_monitor_start(struct peers_monitor *m, struct node *n, const atomic_bool *stop) {
  m->n = n;
  m->stop = stop;
  assert_int_equal(pthread_create(&m->t, NULL, peers_monitor_thread, m), 0);
}

void peers_monitor_join(struct peers_monitor *m) { pthread_join(m->t, NULL); }

uint64_t node_memfd_bytes(pid_t pid, const char *label) {
  char dir[64], path[320], link[256];
  uint64_t sum = 0;
  struct dirent *d;
  DIR *dp;

  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
  assert_non_null(dp = opendir(dir));
  while ((d = readdir(dp))) {
    struct stat st;
    ssize_t n;
    snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
    if ((n = readlink(path, link, sizeof(link) - 1)) <= 0)
      continue;
    link[n] = '\0';
    if (strstr(link, label) && stat(path, &st) == 0)
      sum += (uint64_t)st.st_blocks * 512;
  }
  closedir(dp);
  return sum;
}
