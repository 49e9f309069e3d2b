/* SPDX-License-Identifier: Apache-2.0 */
/* Metrics (issue 7): gshmd's Prometheus text exposition against a real
 * daemon.  The values must match what the test did (segments, bytes,
 * leases, clients, requests, quota and permission denials, with a
 * non-root client made by setresuid in a child); the text must pass a
 * strict parser of the text format 0.0.4 (and `promtool check metrics`
 * where promtool is installed); and the textfile that gshmd writes every
 * interval_sec must be replaced atomically (rename over the old file: a
 * reader never sees a partial file, the inode changes, no write lands on
 * the .prom name itself). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "prometheus.h"


/* ---- harness ---- */

static int setup(void **state) {
  /* A non-root client must reach the socket (the harness directory is
   * 0755) and may own one segment. */
  static const char *const args[] = {"--set", "daemon.socket_mode=0666", "--set",
                                     "quota.segments=1", NULL};
  return harness_cmocka_start(state, sizeof(struct harness), args) ? 0 : -1;
}

/* The daemon's metrics, parsed; fails the test when they do not parse. */
static void scrape(gshm_client_t *c, struct exposition *x, char **text_out) {
  char *text = NULL;
  assert_int_equal(gshm_metrics(c, &text), 0);
  if (expo_parse(x, text)) {
    fprintf(stderr, "%s\n--- exposition ---\n%s", x->err, text);
    fail_msg("metrics do not parse: %s", x->err);
  }
  if (text_out)
    *text_out = text;
  else
    gshm_free(text);
}

static void assert_metric(const struct exposition *x, const char *name, const char *labels,
                          double want) {
  double v = expo_get(x, name, labels);
  if (isnan(v) && want == 0)
    v = 0; /* a counter that never moved may be left out */
  if (v != want)
    fail_msg("%s{%s} = %g, want %g", name, labels ? labels : "", v, want);
}

/* ---- the format ---- */

static void test_parser_rejects(void **state) {
  /* The parser must catch what it is there to catch, or the other tests
   * prove nothing. */
  static const char *const bad[] = {
      "# HELP a_total x\n# TYPE a_total counter\na_total 1", /* no final \n */
      "# HELP a x\n# TYPE a gauge\na 1\na 2\n",              /* duplicate */
      "# HELP a x\n# TYPE a gauge\na{b=\"1\",b=\"2\"} 1\n",  /* label twice */
      "# HELP a x\n# TYPE a gauge\na{b=\"\\x\"} 1\n",        /* bad escape */
      "# HELP a x\n# TYPE a gauge\na{b=\"1} 1\n",            /* unterminated */
      "# HELP a x\n# TYPE a gauge\na 1x\n",                  /* bad value */
      "# HELP a x\n# TYPE a gauge\n1a 1\n",                  /* bad name */
      "# HELP a x\n# TYPE a gauge\na{__b=\"1\"} 1\n",        /* reserved label */
      "a 1\n",                                               /* no metadata */
      "# HELP a x\n# TYPE a counter\na 1\n",                 /* counter without _total */
      "# HELP a_total x\n# TYPE a_total counter\na_total -1\n",
      "# HELP a x\n# TYPE a gauge\n# TYPE a gauge\na 1\n",
      "# HELP a x\n# TYPE a gauge\na 1\n# HELP b x\n# TYPE b gauge\nb 1\na{c=\"1\"} 2\n",
      ("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
       "h_sum 1\nh_count 1\n"), /* decreasing buckets */
      "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", /* no +Inf */
      "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
      "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n", /* no _sum */
      "# HELP a x\n# TYPE a gauge\na 1 \n", /* trailing blank */
  };
  static const char *const good =
      "# HELP a_total x \\\\ y\\n\n# TYPE a_total counter\na_total{x=\"q\\\"\\\\\\n\",y=\"\"} 1e3\n"
      "# HELP g x\n# TYPE g gauge\ng NaN\ng{l=\"1\"} -Inf 1700000000000\n"
      "# HELP h x\n# TYPE h histogram\nh_bucket{op=\"a\",le=\"0.5\"} 1\n"
      "h_bucket{op=\"a\",le=\"+Inf\"} 3\nh_sum{op=\"a\"} 2.5\nh_count{op=\"a\"} 3\n";
  struct exposition x;

  (void)state;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (expo_parse(&x, bad[i]) == 0)
      fail_msg("accepted bad exposition #%zu:\n%s", i, bad[i]);
    expo_free(&x);
  }
  if (expo_parse(&x, good))
    fail_msg("rejected a good exposition: %s", x.err);
  assert_true(expo_get(&x, "a_total", "x=q\"\\\n,y=") == 1000);
  assert_true(expo_get(&x, "h_count", "op=a") == 3);
  expo_free(&x);
}

/* Runs `promtool check metrics` on text when promtool is installed.
 * Debian's prometheus package (which has it) is ~100 MB installed with
 * its dependencies, so CI relies on the parser above; this is extra. */
static void promtool_check(const char *text) {
  char path[] = "/tmp/gshm-metrics-XXXXXX", cmd[256];
  int fd, status;
  FILE *f;

  if (system("command -v promtool >/dev/null 2>&1") != 0)
    return;
  assert_true((fd = mkstemp(path)) >= 0);
  assert_true((f = fdopen(fd, "w")) != NULL);
  fputs(text, f);
  fclose(f);
  snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
  status = system(cmd);
  unlink(path);
  assert_int_equal(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
}

/* Non-root: one segment within its quota, then one quota denial (a
 * second segment) and one permission denial (an open of root's 0600
 * segment). */
static int nobody_denials(const char *sock) {
  gshm_client_t *c;
  gshm_segment_t *s;
  int e;

  if (gshm_connect(sock, "nobody", &c))
    return 10;
  if (gshm_create(c, "m/nobody", 8192, "host", 0600, 0, &s))
    return 11;
  gshm_close(s); /* named: stays */
  if ((e = gshm_create(c, "m/nobody2", 4096, "host", 0600, 0, &s)) != -EDQUOT)
    return 12; /* quota.segments = 1 */
  if ((e = gshm_open(c, "m/private", GSHM_ACCESS_READ, &s)) != -EACCES)
    return 13;
  gshm_disconnect(c);
  return 0;
}

static void test_values(void **state) {
  struct harness *h = *state;
  struct exposition x;
  gshm_client_t *c, *c2;
  gshm_segment_t *a, *b, *a2;
  uint64_t sa, sb, sn;

  assert_int_equal(gshm_connect(h->socket_path, "metrics", &c), 0);
  scrape(c, &x, NULL);
  assert_metric(&x, "gshm_up", NULL, 1);
  assert_metric(&x, "gshm_segments", NULL, 0);
  assert_metric(&x, "gshm_segment_bytes", "location=host", 0);
  assert_metric(&x, "gshm_leases", NULL, 0);
  assert_metric(&x, "gshm_clients", NULL, 1);
  assert_metric(&x, "gshm_quota_denials_total", NULL, 0);
  /* The families the issue names, with their types. */
  assert_string_equal(expo_type(&x, "gshm_segments"), "gauge");
  assert_string_equal(expo_type(&x, "gshm_segment_bytes"), "gauge");
  assert_string_equal(expo_type(&x, "gshm_leases"), "gauge");
  assert_string_equal(expo_type(&x, "gshm_clients"), "gauge");
  assert_string_equal(expo_type(&x, "gshm_requests_total"), "counter");
  assert_string_equal(expo_type(&x, "gshm_quota_denials_total"), "counter");
  if (!expo_type(&x, "gshm_request_duration_seconds"))
    fail_msg("no gshm_request_duration_seconds family (a histogram, issue 7)");
  assert_string_equal(expo_type(&x, "gshm_request_duration_seconds"), "histogram");
  expo_free(&x);

  /* Two segments (one with a size that rounds up), one more client with a
   * read-only lease: three leases in all. */
  assert_int_equal(gshm_create(c, "m/public", 10000, "host", 0644, 0, &a), 0);
  assert_int_equal(gshm_create(c, "m/private", 4096, "host", 0600, 0, &b), 0);
  sa = gshm_segment_info(a)->size;
  sb = gshm_segment_info(b)->size;
  assert_true(sa >= 10000);
  assert_int_equal(gshm_connect(h->socket_path, "metrics-2", &c2), 0);
  assert_int_equal(gshm_open(c2, "m/public", GSHM_ACCESS_READ, &a2), 0);
  scrape(c, &x, NULL);
  assert_metric(&x, "gshm_segments", NULL, 2);
  assert_metric(&x, "gshm_segment_bytes", "location=host", (double)(sa + sb));
  assert_metric(&x, "gshm_leases", NULL, 3);
  assert_metric(&x, "gshm_clients", NULL, 2);
  assert_metric(&x, "gshm_requests_total", "op=create,status=ok", 2);
  assert_metric(&x, "gshm_requests_total", "op=open,status=ok", 1);
  assert_metric(&x, "gshm_requests_total", "op=hello,status=ok", 2);
  assert_metric(&x, "gshm_fds_sent_total", NULL, 3);
  expo_free(&x);

  /* A non-root client: one segment of its own, a quota denial, a
   * permission denial. */
  assert_int_equal(harness_as_nobody(nobody_denials, h->socket_path), 0);
  scrape(c, &x, NULL);
  sn = 8192;
  assert_metric(&x, "gshm_segments", NULL, 3);
  assert_metric(&x, "gshm_segment_bytes", "location=host", (double)(sa + sb + sn));
  assert_metric(&x, "gshm_leases", NULL, 3); /* nobody's lease ended with its close */
  assert_metric(&x, "gshm_clients", NULL, 2);
  assert_metric(&x, "gshm_quota_denials_total", NULL, 1);
  assert_metric(&x, "gshm_access_denials_total", NULL, 1);
  assert_metric(&x, "gshm_requests_total", "op=create,status=ok", 3);
  assert_metric(&x, "gshm_requests_total", "op=create,status=quota_exceeded", 1);
  assert_metric(&x, "gshm_requests_total", "op=open,status=permission_denied", 1);
  assert_metric(&x, "gshm_requests_total", "op=open,status=ok", 1);
  expo_free(&x);

  /* Leases and clients go with closes and disconnects; bytes with
   * unlinks of unleased segments. */
  gshm_close(a2);
  gshm_disconnect(c2);
  assert_int_equal(gshm_unlink(c, "m/nobody"), 0); /* root may */
  gshm_close(b);
  assert_int_equal(gshm_unlink(c, "m/private"), 0);
  assert_int_equal(gshm_unlink(c, "m/public"), 0); /* a still leased: memory stays */
  scrape(c, &x, NULL);
  assert_metric(&x, "gshm_segments", NULL, 1);
  assert_metric(&x, "gshm_segment_bytes", "location=host", (double)sa);
  assert_metric(&x, "gshm_leases", NULL, 1);
  assert_metric(&x, "gshm_clients", NULL, 1);
  assert_metric(&x, "gshm_requests_total", "op=unlink,status=ok", 3);
  assert_metric(&x, "gshm_requests_total", "op=close,status=ok", 3);
  expo_free(&x);
  gshm_close(a);
  scrape(c, &x, NULL);
  assert_metric(&x, "gshm_segments", NULL, 0);
  assert_metric(&x, "gshm_segment_bytes", "location=host", 0);
  assert_metric(&x, "gshm_leases", NULL, 0);
  expo_free(&x);
  gshm_disconnect(c);
}

static void test_format(void **state) {
  struct harness *h = *state;
  struct exposition x;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;
  char *text = NULL;
  double count = 0, requests = 0;

  /* Some traffic with several statuses, so that every family has series. */
  assert_int_equal(gshm_connect(h->socket_path, "format", &c), 0);
  assert_int_equal(gshm_create(c, "m/fmt", 4096, "host", 0600, 0, &s), 0);
  assert_int_equal(gshm_stat_name(c, "m/fmt", &info), 0);
  assert_int_equal(gshm_stat_name(c, "m/none", &info), -ENOENT);
  assert_int_equal(gshm_create(c, "m/fmt", 4096, "host", 0600, 0, &s), -EEXIST);
  scrape(c, &x, &text);
  promtool_check(text);
  /* Histogram totals: every answered request is in the duration histogram
   * (the scrape itself may be counted or not). */
  for (size_t i = 0; i < x.ns; i++) {
    if (!strcmp(x.s[i].name, "gshm_request_duration_seconds_count"))
      count += x.s[i].value;
    if (!strcmp(x.s[i].name, "gshm_requests_total"))
      requests += x.s[i].value;
  }
  assert_true(requests >= 5);
  if (count < requests || count > requests + 1)
    fail_msg("duration histogram counts %g requests, gshm_requests_total %g", count, requests);
  expo_free(&x);
  gshm_free(text);
  gshm_unlink(c, "m/fmt");
  gshm_close(s);
  gshm_disconnect(c);
}

/* ---- the textfile ---- */

struct textfile_state {
  struct harness h;
  char dir[64];
  char path[128];
};

static int setup_textfile(void **state) {
  struct textfile_state *t;
  char dir[sizeof(t->dir)] = "/tmp/gshm-textfile.XXXXXX", set[192];
  const char *args[] = {"--set", set, "--set", "metrics.interval_sec=1", NULL};

  if (!mkdtemp(dir))
    return -1;
  snprintf(set, sizeof(set), "metrics.textfile=%s/gshm.prom", dir);
  if (!(t = harness_cmocka_start(state, sizeof(*t), args))) {
    rmdir(dir);
    return -1;
  }
  snprintf(t->dir, sizeof(t->dir), "%s", dir);
  snprintf(t->path, sizeof(t->path), "%s/gshm.prom", dir);
  return 0;
}

static int teardown_textfile(void **state) {
  struct textfile_state *t = *state;
  char cmd[192];
  int status;

  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
  status = harness_cmocka_teardown(state);
  return system(cmd) == 0 && status == 0 ? 0 : -1;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads the whole file at path; NULL when it does not exist.  *ino_out is
 * the inode of what was read. */
static char *read_file(const char *path, ino_t *ino_out, mode_t *mode_out) {
  struct stat st;
  size_t len = 0, cap = 65536;
  char *buf;
  int fd = open(path, O_RDONLY | O_CLOEXEC);

  if (fd < 0)
    return NULL;
  buf = malloc(cap + 1);
  assert_non_null(buf);
  assert_int_equal(fstat(fd, &st), 0);
  for (;;) {
    ssize_t n;
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
      assert_non_null(buf);
    }
    n = read(fd, buf + len, cap - len);
    assert_true(n >= 0);
    if (n == 0)
      break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  close(fd);
  if (ino_out)
    *ino_out = st.st_ino;
  if (mode_out)
    *mode_out = st.st_mode;
  return buf;
}

struct watch_counts {
  unsigned moved_to;   /* renames onto gshm.prom */
  unsigned direct;     /* IN_MODIFY / IN_CLOSE_WRITE on gshm.prom itself */
  unsigned prom_temps; /* other names ending in .prom (node_exporter reads them) */
};

/* Drains inotify events (waiting up to timeout_ms for the first). */
static void watch_drain(int ifd, int timeout_ms, struct watch_counts *w) {
  char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
  struct pollfd pfd = {ifd, POLLIN, 0};

  while (poll(&pfd, 1, timeout_ms) > 0) {
    ssize_t n = read(ifd, buf, sizeof(buf));
    timeout_ms = 0;
    for (char *p = buf; n > 0 && p < buf + n;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      const char *name = ev->len ? ev->name : "";
      size_t nl = strlen(name);
      if (!strcmp(name, "gshm.prom")) {
        if (ev->mask & IN_MOVED_TO)
          w->moved_to++;
        if (ev->mask & (IN_MODIFY | IN_CLOSE_WRITE))
          w->direct++;
      } else if (nl > 5 && !strcmp(name + nl - 5, ".prom") && (ev->mask & IN_CREATE)) {
        w->prom_temps++;
      }
      p += sizeof(*ev) + ev->len;
    }
  }
}

static void test_textfile(void **state) {
  struct textfile_state *t = *state;
  struct watch_counts w = {0, 0, 0};
  struct exposition x;
  gshm_client_t *c;
  gshm_segment_t *s;
  ino_t ino, inos[64];
  mode_t mode;
  unsigned ninos = 0, reads = 0;
  int64_t deadline;
  char *text = NULL;
  int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);

  assert_true(ifd >= 0);
  assert_true(inotify_add_watch(ifd, t->dir, IN_MOVED_TO | IN_CREATE | IN_MODIFY |
                                                 IN_CLOSE_WRITE) >= 0);
  /* The file appears within a few intervals of 1 s. */
  deadline = mono_ms() + 5000;
  while (!(text = read_file(t->path, &ino, &mode)) && mono_ms() < deadline)
    watch_drain(ifd, 100, &w);
  if (!text)
    fail_msg("%s did not appear within 5 s (metrics.interval_sec=1)", t->path);
  if (expo_parse(&x, text))
    fail_msg("textfile does not parse: %s", x.err);
  assert_metric(&x, "gshm_up", NULL, 1);
  /* node_exporter runs as another user: the file must be world-readable. */
  if ((mode & 0444) != 0444)
    fail_msg("textfile mode %04o: node_exporter (another user) cannot read it", mode & 07777);
  expo_free(&x);
  free(text);

  /* A change shows in the file within two intervals. */
  assert_int_equal(gshm_connect(t->h.socket_path, "textfile", &c), 0);
  assert_int_equal(gshm_create(c, "m/textfile", 4096, "host", 0600, 0, &s), 0);
  deadline = mono_ms() + 3500;
  for (;;) {
    double v;
    text = read_file(t->path, &ino, NULL);
    assert_non_null(text);
    if (expo_parse(&x, text))
      fail_msg("textfile does not parse: %s", x.err);
    v = expo_get(&x, "gshm_segments", NULL);
    expo_free(&x);
    free(text);
    if (v == 1)
      break;
    if (mono_ms() > deadline)
      fail_msg("gshm_segments in the textfile is %g, 1 expected, after 3.5 s", v);
    watch_drain(ifd, 100, &w);
  }

  /* A reader looping for 3.5 s: every read is a whole, parseable file;
   * the inode changes (rename over the old file, not a rewrite in place). */
  memset(&w, 0, sizeof(w));
  deadline = mono_ms() + 3500;
  while (mono_ms() < deadline) {
    text = read_file(t->path, &ino, NULL);
    if (!text)
      fail_msg("%s vanished (%s): a replacement must be a rename over it", t->path,
               strerror(errno));
    if (expo_parse(&x, text))
      fail_msg("read #%u of the textfile does not parse (partial write?): %s", reads, x.err);
    expo_free(&x);
    free(text);
    reads++;
    if ((!ninos || inos[ninos - 1] != ino) && ninos < 64)
      inos[ninos++] = ino;
    watch_drain(ifd, 0, &w);
  }
  watch_drain(ifd, 0, &w);
  assert_true(reads > 100);
  if (ninos < 3)
    fail_msg("the textfile's inode changed %u times in 3.5 s at interval 1 s", ninos - 1);
  if (w.moved_to < 2)
    fail_msg("%u renames onto gshm.prom in 3.5 s", w.moved_to);
  if (w.direct)
    fail_msg("%u writes landed on gshm.prom itself, not through a rename", w.direct);
  if (w.prom_temps)
    fail_msg("temporary files named *.prom: node_exporter would read them half-written");
  close(ifd);
  gshm_unlink(c, "m/textfile");
  gshm_close(s);
  gshm_disconnect(c);
}

/* A symlink planted where a predictable temporary name would be is not
 * followed (gshmd may run as root in a directory others can write), and
 * the textfile goes away with gshmd (no stale gshm_up 1). */
static void test_textfile_no_symlink_and_removed_at_stop(void **state) {
  char dir[64], path[128], link_path[160], victim[128], set[192], buf[16] = {0};
  const char *args[] = {"--set", set, "--set", "metrics.interval_sec=1", NULL};
  struct harness h;
  struct stat st;
  int fd;

  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/gshm-textfile.XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/gshm.prom", dir);
  snprintf(victim, sizeof(victim), "%s/victim", dir);
  snprintf(link_path, sizeof(link_path), "%s.tmp-gshmd", path); /* the old fixed name */
  fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "victim", 6), 6);
  close(fd);
  assert_int_equal(symlink(victim, link_path), 0);
  snprintf(set, sizeof(set), "metrics.textfile=%s", path);
  assert_int_equal(harness_start(&h, args), 0);
  usleep(1500 * 1000);
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  fd = open(victim, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(read(fd, buf, sizeof(buf) - 1), 6);
  close(fd);
  assert_string_equal(buf, "victim");
  assert_int_equal(stat(victim, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0600);
  assert_int_equal(harness_stop(&h), 0);
  assert_int_equal(access(path, F_OK), -1); /* removed at stop */
  unlink(link_path);
  unlink(victim);
  assert_int_equal(rmdir(dir), 0); /* nothing else left behind */
}

/* A cluster of many peers makes the text larger than one reply (64 KiB:
 * 130 peers of 13-byte names, 73 KB).  gshmd closed the connection of
 * every client that asked ("reply too large"; libgshm's resend met the
 * same), and with it the client's leases: an unlinked segment it still
 * mapped was freed.  Now the text comes whole in a memfd beside the
 * reply, and the connection and its leases stay. */
static void test_too_large_keeps_the_connection(void **state) {
  char key[] = "/tmp/gshm-metrics-key.XXXXXX", listen[64], keyset[96], *peers, *text = NULL;
  const char *args[] = {"--set", listen, "--set", keyset, "--set", "cluster.node_name=me",
                        "--set", "daemon.log_level=warning", "--set", NULL, NULL};
  size_t len = 0, cap = 8192;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;
  struct harness h;
  int fd;

  (void)state;
  assert_true((fd = mkstemp(key)) >= 0);
  assert_int_equal(write(fd, "0123456789abcdef0123456789abcdef", 32), 32);
  close(fd);
  snprintf(keyset, sizeof(keyset), "cluster.secret_file=%s", key);
  snprintf(listen, sizeof(listen), "cluster.listen=127.0.0.1:%d", harness_free_port());
  assert_non_null(peers = malloc(cap));
  len = (size_t)snprintf(peers, cap, "cluster.peers=");
  for (int i = 0; i < 130; i++) /* unreachable: only their series count */
    len += (size_t)snprintf(peers + len, cap - len, "%sgpu-node-%04d=127.0.0.1:1", i ? "," : "",
                            i);
  assert_true(len < cap);
  args[9] = peers;
  assert_int_equal(harness_start(&h, args), 0);
  assert_int_equal(gshm_connect(h.socket_path, "metrics-big", &c), 0);
  assert_int_equal(gshm_create(c, "big/held", 4096, NULL, 0600, 0, &s), 0);
  assert_int_equal(gshm_unlink(c, "big/held"), 0); /* freed with the lease */
  assert_int_equal(gshm_metrics(c, &text), 0);
  assert_true(strlen(text) > 65536);
  assert_non_null(strstr(text, "gshm_cluster_pulls_total{peer=\"gpu-node-0129\",result=\"error\"}"));
  assert_non_null(strstr(text, "gshm_segments"));
  gshm_free(text);
  assert_int_equal(gshm_stat(s, &info), 0); /* the lease is still held */
  gshm_close(s);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
  free(peers);
  unlink(key);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_too_large_keeps_the_connection),
      cmocka_unit_test(test_textfile_no_symlink_and_removed_at_stop),
      cmocka_unit_test(test_parser_rejects),
      cmocka_unit_test_setup_teardown(test_values, setup, harness_cmocka_teardown),
      cmocka_unit_test_setup_teardown(test_format, setup, harness_cmocka_teardown),
      cmocka_unit_test_setup_teardown(test_textfile, setup_textfile, teardown_textfile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
