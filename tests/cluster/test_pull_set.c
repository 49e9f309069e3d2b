/* SPDX-License-Identifier: Apache-2.0 */
/* Pulls are all or nothing, with real gshmd on 127.0.0.1 (UCX tcp): a
 * pull in progress is invisible under its final name (list, stat, open
 * from another client); a puller SIGKILLed mid-pull and restarted through
 * the fd store brings nothing partial back; a set under a prefix appears
 * at once and byte-exact; a set whose peer dies mid-set leaves nothing;
 * --replace swaps a set while a reader of the old one keeps its bytes;
 * gshmctl pull --prefix --json and gshmctl peers (pulls in flight). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"
#include "proxy.h"
#include "raw.h"
#include "util.h"
#include "wire.h"

#define NSET 24 /* segments in the test set */

static char dir[] = "/tmp/gshm-pullset-XXXXXX";
static char key_path[300];
static struct node A, B; /* A serves pub/ *; B pulls slowly (small chunks, one at a time) */

/* The set: NSET segments pub/set/NN of mixed sizes (one of 96 MiB, so that
 * the slow puller takes a while), seeds from base. */
static uint64_t set_size(int i) { return i == 3 ? 96 * MiB : 4096 * (uint64_t)(i + 1) + 7; }

static void make_set(gshm_client_t *c, unsigned long long base) {
  set_make(c, "pub/set/", NSET, set_size, base);
}

static void check_set(gshm_client_t *c, const char *prefix, unsigned long long base) {
  set_check(c, prefix, NSET, set_size, base);
}

static void unlink_set(gshm_client_t *c, const char *prefix) { set_unlink(c, prefix, NSET); }

static int group_setup(void **state) {
  struct group *g = getgrgid(getegid());
  char pa[64], pb[64];
  (void)state;

  assert_non_null(mkdtemp(dir));
  snprintf(key_path, sizeof(key_path), "%s/key", dir);
  write_key(key_path, 5);
  assert_non_null(g);
  snprintf(node_group, sizeof(node_group), "%s", g->gr_name);
  A.port = free_port();
  B.port = free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", B.port);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d", A.port);
  node_start(&A, "a", pa, key_path, "pub/*", NULL);
  /* small gets, one at a time: a pull lasts long enough to be watched */
  node_start(&B, "b", pb, key_path, "", "cluster.pull_chunk=32K", "cluster.pull_depth=1", NULL);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  assert_int_equal(harness_stop(&B.h), 0);
  assert_int_equal(harness_stop(&A.h), 0);
  unlink(key_path);
  rmdir(dir);
  return 0;
}

/* A pull in the background, with a hook at its first progress reply. */
struct bg_pull {
  pthread_t t;
  struct node *puller;
  const char *peer, *name, *local;
  bool prefix;
  int replace;
  void (*hook)(void *);
  void *hook_arg;
  unsigned calls;
  uint32_t max_segments_total;
  gshm_pull_result_t r, *v;
  size_t n;
  int err;
};

static void bg_progress(const gshm_pull_progress_t *p, void *arg) {
  struct bg_pull *bg = arg;
  if (p->segments_total > bg->max_segments_total)
    bg->max_segments_total = p->segments_total;
  if (bg->calls++ == 0 && bg->hook)
    bg->hook(bg->hook_arg);
}

static void *bg_thread(void *arg) {
  struct bg_pull *bg = arg;
  gshm_client_t *c;
  gshm_pull_opts_t po = {.local_name = bg->local, .progress = bg_progress, .progress_arg = bg,
                         .replace = bg->replace};
  bg->err = gshm_connect(bg->puller->h.socket_path, "bg", &c);
  if (!bg->err) {
    bg->err = bg->prefix ? gshm_pull_prefix(c, bg->peer, bg->name, &po, &bg->v, &bg->n)
                         : gshm_pull(c, bg->peer, bg->name, &po, &bg->r);
    gshm_disconnect(c);
  }
  return NULL;
}

/* Looks at B from another client while the pull runs. */
struct watch {
  const char *name;     /* the final name (single pull) */
  const char *prefix;   /* the set's local prefix */
  unsigned looks;
  unsigned partial;     /* sets seen with some but not all names */
  atomic_bool stop;
  pthread_t t;
  int stat_rc, open_rc;   /* look_unnamed's findings */
  unsigned listed, segments;
  uint64_t bytes;
};

/* (hooks run on the pulling thread: they record, the test asserts) */
static void look_unnamed(void *arg) {
  struct watch *w = arg;
  gshm_client_t *c;
  gshm_segment_info_t st;
  gshm_segment_t *seg = NULL;
  gshm_status_info_t s;

  if (gshm_connect(B.h.socket_path, "look", &c))
    return;
  w->stat_rc = gshm_stat_name(c, w->name, &st);
  w->open_rc = gshm_open(c, w->name, GSHM_ACCESS_READ, &seg);
  if (!w->open_rc)
    gshm_close(seg);
  w->listed = count_named(c, w->name);
  if (!gshm_status(c, &s)) {
    w->segments = s.segments;
    w->bytes = s.bytes;
  }
  w->looks++;
  gshm_disconnect(c);
}

/* While a 128 MiB pull runs, its name is not there: not listed, stat'ed or
 * opened; afterwards it is, byte for byte. */
static void test_invisible_while_pulling(void **state) {
  static struct watch w = {.name = "hidden"};
  struct bg_pull bg = {.puller = &B, .peer = "a", .name = "pub/hidden", .local = "hidden",
                       .hook = look_unnamed, .hook_arg = &w};
  gshm_client_t *a = connect_to(&A), *b;
  (void)state;

  make_segment(a, "pub/hidden", 128 * MiB, 31);
  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  pthread_join(bg.t, NULL);
  assert_int_equal(bg.err, 0);
  assert_int_equal(w.looks, 1); /* looked at mid-pull */
  assert_int_equal(w.stat_rc, -ENOENT);
  assert_int_equal(w.open_rc, -ENOENT);
  assert_int_equal(w.listed, 0);
  assert_int_equal(w.segments, 0);
  assert_true(w.bytes >= 128 * MiB); /* the hidden segment's memory is counted */
  b = connect_to(&B);
  check_segment(b, "hidden", 128 * MiB, 31);
  assert_int_equal(gshm_unlink(b, "hidden"), 0);
  assert_int_equal(gshm_unlink(a, "pub/hidden"), 0);
  gshm_disconnect(a);
  gshm_disconnect(b);
}

static void tell_parent(const gshm_pull_progress_t *pr, void *arg) {
  (void)pr;
  if (write(*(int *)arg, "p", 1) < 0)
    _exit(3);
}

/* B is SIGKILLed mid-pull and restarted with what it left in the fd
 * store: no partial segment comes back, no memory is held. */
static void test_killed_mid_pull_restart(void **state) {
  gshm_client_t *a = connect_to(&A), *b;
  gshm_segment_info_t st;
  gshm_status_info_t s;
  pid_t child;
  int status, pipefd[2];
  char ch;
  (void)state;

  make_segment(a, "pub/partial", 96 * MiB, 41);
  assert_int_equal(pipe(pipefd), 0);
  child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    gshm_client_t *c;
    gshm_pull_opts_t po = {.local_name = "partial", .progress = tell_parent,
                           .progress_arg = &pipefd[1]};
    close(pipefd[0]);
    if (gshm_connect(B.h.socket_path, "doomed", &c))
      _exit(1);
    gshm_pull(c, "a", "pub/partial", &po, NULL);
    _exit(0);
  }
  close(pipefd[1]);
  assert_int_equal(read(pipefd[0], &ch, 1), 1); /* the pull is under way */
  assert_int_equal(harness_restart(&B.h, SIGKILL, B.argv), 0);
  waitpid(child, &status, 0);
  close(pipefd[0]);
  b = connect_to(&B);
  assert_int_equal(gshm_stat_name(b, "partial", &st), -ENOENT);
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, 0);
  assert_true(s.bytes == 0);
  gshm_disconnect(b);
  assert_int_equal(gshm_unlink(a, "pub/partial"), 0);
  gshm_disconnect(a);
}

static void *watch_thread(void *arg) {
  struct watch *w = arg;
  gshm_client_t *c = connect_to(&B);
  while (!atomic_load(&w->stop)) {
    unsigned k = count_named(c, w->prefix);
    w->partial += k != 0 && k != NSET;
    w->looks++;
    usleep(2000);
  }
  gshm_disconnect(c);
  return NULL;
}

/* gshmctl peers (text and JSON) while the set's pull is in flight. */
static char *peers_out[2];
static int peers_rc[2] = {-1, -1}; /* (their exit codes: checked by the test) */

static void peers_shows_pull(void *arg) {
  (void)arg;
  peers_rc[0] = harness_gshmctl(&B.h, &peers_out[0], (const char *[]){"peers", NULL});
  peers_rc[1] = harness_gshmctl(&B.h, &peers_out[1], (const char *[]){"--json", "peers", NULL});
}

/* One request pulls the set under pub/set/ into set/: while it runs no
 * name of it exists (a watcher lists B all along), then all do, each
 * byte-exact, and the result has one entry per segment. */
static void test_set_all_at_once(void **state) {
  static struct watch w = {.prefix = "set/"};
  struct bg_pull bg = {.puller = &B, .peer = "a", .name = "pub/set/", .local = "set/",
                       .prefix = true, .hook = peers_shows_pull};
  gshm_client_t *a = connect_to(&A), *b;
  (void)state;

  make_set(a, 100);
  make_segment(a, "pub/settle", 4096, 1); /* under pub/set but not pub/set/: not pulled */
  assert_int_equal(pthread_create(&w.t, NULL, watch_thread, &w), 0);
  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  pthread_join(bg.t, NULL);
  atomic_store(&w.stop, true);
  pthread_join(w.t, NULL);
  assert_int_equal(bg.err, 0);
  assert_true(bg.calls > 0);
  assert_int_equal(bg.max_segments_total, NSET);
  assert_int_equal(peers_rc[0], 0);
  assert_int_equal(peers_rc[1], 0);
  assert_non_null(peers_out[0]);
  assert_non_null(strstr(peers_out[0], "1 pull in flight"));
  assert_non_null(strstr(peers_out[0], "pub/set/"));
  /* every column has its heading: the time's had none */
  assert_non_null(strstr(peers_out[0], " SEGMENTS "));
  assert_non_null(strstr(peers_out[0], " TIME"));
  assert_non_null(peers_out[1]);
  assert_non_null(strstr(peers_out[1], "\"prefix\": true"));
  free(peers_out[0]);
  free(peers_out[1]);
  assert_int_equal(bg.n, NSET);
  print_message("watcher listed B %u times during the pull, %u partial\n", w.looks, w.partial);
  assert_true(w.looks > 2);
  assert_int_equal(w.partial, 0);
  b = connect_to(&B);
  assert_int_equal(count_named(b, "set/"), NSET);
  assert_int_equal(count_named(b, "settle"), 0);
  for (size_t i = 0; i < bg.n; i++) {
    gshm_segment_info_t st;
    assert_string_equal(bg.v[i].path, "host");
    assert_non_null(strstr(bg.v[i].path_reason, "host segment")); /* each its own (was "") */
    assert_true(bg.v[i].bytes == bg.v[i].segment.requested_size);
    assert_non_null(strstr(bg.v[i].segment.source, "a:pub/set/"));
    /* granularity and creation time as stat says (were 0: created in 1970) */
    assert_int_equal(gshm_stat_name(b, bg.v[i].segment.name, &st), 0);
    assert_true(bg.v[i].segment.granularity > 0);
    assert_int_equal(bg.v[i].segment.granularity, st.granularity);
    assert_int_equal(bg.v[i].segment.created_ns, st.created_ns);
    assert_true(gshm__now_ns(CLOCK_REALTIME) - st.created_ns < 60 * 1000000000LL);
  }
  gshm_free(bg.v);
  check_set(b, "set/", 100);
  /* a second set pull into the same names is refused, changing nothing */
  {
    gshm_pull_result_t *v = NULL;
    size_t n = 0;
    gshm_pull_opts_t po = {.local_name = "set/"};
    assert_int_equal(gshm_pull_prefix(b, "a", "pub/set/", &po, &v, &n), -EEXIST);
    assert_int_equal(gshm_pull_prefix(b, "a", "pub/none/", NULL, &v, &n), -ENOENT);
    /* why a published model may not show: its mode (a pool's 0600) */
    assert_non_null(strstr(gshm_last_error(b), "0600"));
    /* a prefix is the start of a valid name: no control bytes, no "//" */
    assert_int_equal(gshm_pull_prefix(b, "a", "pub/\n<0>x", NULL, &v, &n), -EINVAL);
    assert_int_equal(gshm_pull_prefix(b, "a", "pub//", NULL, &v, &n), -EINVAL);
    po.local_name = "bad\x01/";
    assert_int_equal(gshm_pull_prefix(b, "a", "pub/set/", &po, &v, &n), -EINVAL);
  }
  check_set(b, "set/", 100);
  { /* every byte landed: the pulls owe the host room check nothing */
    long owed = -1;
    for (int i = 0; i < 30 && owed; i++, usleep(100000)) /* (metrics: up to 1 s old) */
      owed = metric(b, "gshm_cluster_pull_host_owed_bytes");
    assert_int_equal(owed, 0);
  }
  gshm_disconnect(a);
  gshm_disconnect(b);
}

/* The most significant digits of a fraction or exponent number in text
 * (JSON): gshmctl writes at most 15 (0.0055776619999999997 was
 * jansson's 17 for 0.005577662). */
static int most_real_digits(const char *text) {
  int most = 0;

  for (const char *q = text; *q; q++) {
    int digits = 0;
    bool real = false, leading = true;

    if (!(*q >= '0' && *q <= '9') || (q > text && (isalpha((unsigned char)q[-1]) || q[-1] == '/')))
      continue; /* (not one in a name) */
    for (; (*q >= '0' && *q <= '9') || *q == '.'; q++) {
      if (*q == '.') {
        real = true;
        continue;
      }
      if (*q != '0')
        leading = false;
      digits += !leading;
    }
    real = real || *q == 'e' || *q == 'E';
    if (real && digits > most)
      most = digits;
    if (!*q)
      break;
  }
  return most;
}

/* --replace while a reader maps the old set/03: the reader keeps the old
 * bytes; new opens get the new ones, the reader's own too (it learns of
 * the replace as of an unlink); the old copy goes when let go. */
static void test_replace(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B), *reader = connect_to(&B);
  gshm_segment_t *old;
  gshm_status_info_t s;
  uint8_t *want = malloc(set_size(3));
  char *out = NULL;
  void *p;
  (void)state;

  assert_non_null(want);
  assert_int_equal(gshm_open(reader, "set/03", GSHM_ACCESS_READ, &old), 0);
  assert_int_equal(gshm_map(old, NULL, 0, &p), 0);
  unlink_set(a, "pub/set/");
  make_set(a, 200);
  assert_int_equal(harness_gshmctl(&B.h, &out,
                                   (const char *[]){"--json", "pull", "a:pub/set/", "--prefix",
                                                    "--as", "set/", "--replace", NULL}),
                   0);
  assert_non_null(strstr(out, "\"count\": 24"));
  assert_non_null(strstr(out, "\"gb_per_s\""));
  assert_in_range(most_real_digits(out), 1, 15);
  assert_non_null(strstr(out, "\"path\": \"host\""));
  assert_non_null(strstr(out, "\"remote_name\": \"pub/set/03\""));
  free(out);
  check_set(b, "set/", 200);
  harness_random(want, set_size(3), 103); /* the old bytes, still mapped */
  assert_int_equal(memcmp(p, want, set_size(3)), 0);
  /* The reader opens the name again while it holds the old one: gshmd
   * told it of the replace (an unlinked event), so its lease cache sends
   * the open to gshmd, which gives the new segment.  Without the event
   * the cache served the old segment under the name. */
  {
    gshm_segment_t *again;
    uint8_t got[64];
    assert_int_equal(gshm_open(reader, "set/03", GSHM_ACCESS_READ, &again), 0);
    assert_true(gshm_segment_info(old)->unlinked);
    assert_true(gshm_segment_info(again)->id != gshm_segment_info(old)->id);
    harness_random(want, set_size(3), 203);
    assert_int_equal(gshm_read(again, 0, got, sizeof(got)), 0);
    assert_memory_equal(got, want, sizeof(got));
    gshm_close(again);
  }
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, NSET + 1); /* the old set/03, unlinked, held */
  gshm_close(old);
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, NSET);
  free(want);
  /* the text says where the set landed, --as being another prefix */
  assert_int_equal(harness_gshmctl(&B.h, &out,
                                   (const char *[]){"pull", "a:pub/set/", "--prefix", "--as",
                                                    "set/", "--replace", NULL}),
                   0);
  assert_non_null(strstr(out, "pulled 24 segments under a:pub/set/ as 'set/'"));
  free(out);
  unlink_set(b, "set/");
  gshm_disconnect(reader);
  gshm_disconnect(a);
  gshm_disconnect(b);
}

/* 300 segments with 200-byte names: the peer's listing comes in several
 * pages and so does the result (pull_items); every name and source is
 * right, in order.  Published as one set, they are stored in the fd store
 * (two buckets: at most 253 a bucket, written once each at the publish's
 * end): B SIGKILLed and restarted has every one, byte for byte. */
static void test_set_pages(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  gshm_pull_result_t *v = NULL;
  gshm_pull_opts_t po = {.local_name = "many/"};
  char pad[192], name[256], want[GSHM_SOURCE_MAX];
  size_t n = 0;
  (void)state;

  memset(pad, 'x', sizeof(pad) - 1);
  pad[sizeof(pad) - 1] = '\0';
  for (int i = 0; i < 300; i++) {
    snprintf(name, sizeof(name), "pub/many/%s%03d", pad, i);
    make_segment(a, name, 64 + (uint64_t)i, 500 + (unsigned long long)i);
  }
  assert_int_equal(gshm_pull_prefix(b, "a", "pub/many/", &po, &v, &n), 0);
  assert_int_equal(n, 300);
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "many/%s%03zu", pad, i);
    assert_string_equal(v[i].segment.name, name);
    assert_true(v[i].bytes == 64 + i);
    snprintf(want, sizeof(want), "a:pub/many/%s%03zu#", pad, i);
    assert_memory_equal(v[i].segment.source, want, strlen(want));
  }
  gshm_disconnect(b);
  assert_int_equal(harness_restart(&B.h, SIGKILL, B.argv), 0);
  b = connect_to(&B);
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "many/%s%03zu", pad, i);
    check_segment(b, name, 64 + i, 500 + i);
    assert_int_equal(gshm_unlink(b, name), 0);
    snprintf(name, sizeof(name), "pub/many/%s%03zu", pad, i);
    assert_int_equal(gshm_unlink(a, name), 0);
  }
  gshm_free(v);
  gshm_disconnect(a);
  gshm_disconnect(b);
}

/* --replace during the grace period after a restart: the replaced
 * segment came back through the fd store and its holder has not
 * reconnected yet (nothing tells gshmd it still maps it).  The holder's
 * mapping keeps the old bytes: the replaced segment is kept, unlinked,
 * until the grace period ends, never punched out (it was, with
 * discard, before: the holder read zeros), and the new one has the new
 * bytes. */
static void test_replace_in_grace(void **state) {
  const uint64_t size = 1 * MiB;
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B), *holder = connect_to(&B);
  gshm_pull_opts_t po = {.local_name = "grace/"};
  gshm_pull_result_t *v = NULL;
  gshm_segment_t *old;
  uint8_t *want = malloc(size);
  size_t n = 0;
  void *p;
  (void)state;

  assert_non_null(want);
  make_segment(a, "pub/grace/x", size, 700);
  assert_int_equal(gshm_pull_prefix(b, "a", "pub/grace/", &po, &v, &n), 0);
  gshm_free(v);
  assert_int_equal(gshm_open(holder, "grace/x", GSHM_ACCESS_READ, &old), 0);
  assert_int_equal(gshm_map(old, NULL, 0, &p), 0);
  gshm_disconnect(b);
  /* the holder makes no call until the end: it has not reconnected */
  assert_int_equal(harness_restart(&B.h, SIGKILL, B.argv), 0);
  assert_int_equal(gshm_unlink(a, "pub/grace/x"), 0);
  make_segment(a, "pub/grace/x", size, 701);
  b = connect_to(&B);
  po.replace = 1;
  assert_int_equal(gshm_pull_prefix(b, "a", "pub/grace/", &po, &v, &n), 0);
  gshm_free(v);
  check_segment(b, "grace/x", size, 701);
  harness_random(want, size, 700);
  assert_int_equal(memcmp(p, want, size), 0);
  gshm_close(old); /* (reconnects, re-takes the unlinked lease, ends it) */
  free(want);
  assert_int_equal(gshm_unlink(b, "grace/x"), 0);
  assert_int_equal(gshm_unlink(a, "pub/grace/x"), 0);
  gshm_disconnect(holder);
  gshm_disconnect(a);
  gshm_disconnect(b);
}

static void kill_node(void *arg) { kill(((struct node *)arg)->h.sp.pid, SIGKILL); }

/* A serving node (k) that caps staged grants: the set waits for them.
 * Then another one (j) dies mid-set: the pull fails and leaves nothing (no
 * name, no segment, no memory), then and after a restart. */
static void test_set_peer_killed(void **state) {
  static struct node k, j;
  struct bg_pull bg = {.puller = &B, .peer = "j", .name = "pub/set/", .local = "lost/",
                       .prefix = true, .hook = kill_node, .hook_arg = &j};
  gshm_pull_result_t *v = NULL;
  gshm_client_t *c, *b;
  gshm_status_info_t s;
  char pk[64], pb[200];
  size_t n = 0;
  (void)state;

  /* B again, knowing k and j too */
  k.port = free_port();
  j.port = free_port();
  snprintf(pk, sizeof(pk), "b=127.0.0.1:%d", B.port);
  /* k stages every read, and holds at most 4 staged grants per link: a set
   * asks for more at once, and must wait for them instead of failing */
  node_start(&k, "k", pk, key_path, "pub/*", "cluster.staging=always", "cluster.staging_bytes=4M",
             NULL);
  node_start(&j, "j", pk, key_path, "pub/*", NULL);
  assert_int_equal(harness_stop(&B.h), 0);
  memset(&B.h, 0, sizeof(B.h));
  B.port = free_port();
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d,k=127.0.0.1:%d,j=127.0.0.1:%d", A.port, k.port,
           j.port);
  node_start(&B, "b", pb, key_path, "", "cluster.pull_chunk=32K", "cluster.pull_depth=1", NULL);
  c = connect_to(&k);
  make_set(c, 300);
  gshm_disconnect(c);
  c = connect_to(&j);
  make_set(c, 400);
  gshm_disconnect(c);
  b = connect_to(&B);
  assert_int_equal(
      gshm_pull_prefix(b, "k", "pub/set/", &(gshm_pull_opts_t){.local_name = "staged/"}, &v, &n),
      0);
  assert_int_equal(n, NSET);
  for (size_t i = 0; i < n; i++)
    assert_string_equal(v[i].path, "staged");
  gshm_free(v);
  check_set(b, "staged/", 300);
  unlink_set(b, "staged/");
  gshm_disconnect(b);
  gshm__spawn_stop(&k.h.sp, SIGTERM);
  gshm__spawn_cleanup(&k.h.sp);

  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  pthread_join(bg.t, NULL);
  assert_true(bg.calls > 0);
  assert_int_equal(bg.err, -ECONNRESET);
  b = connect_to(&B);
  assert_int_equal(count_named(b, "lost/"), 0);
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, 0);
  assert_true(s.bytes == 0);
  gshm_disconnect(b);
  assert_int_equal(harness_restart(&B.h, SIGKILL, B.argv), 0);
  b = connect_to(&B);
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, 0);
  gshm_disconnect(b);
  gshm__spawn_stop(&j.h.sp, SIGKILL);
  gshm__spawn_cleanup(&j.h.sp);
}

/* A set that crosses a limit of the pulling node midway (here
 * limits.max_segments: root, as the tests run, has no quota) fails whole:
 * the segments already in are freed, no name appears. */
static void test_set_over_limit(void **state) {
  gshm_client_t *b;
  gshm_pull_result_t *v = NULL;
  gshm_status_info_t s;
  size_t n = 0;
  char pb[64];
  (void)state;

  assert_int_equal(harness_stop(&B.h), 0);
  memset(&B.h, 0, sizeof(B.h));
  B.port = free_port();
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d", A.port);
  node_start(&B, "b", pb, key_path, "", "limits.max_segments=12", NULL);
  b = connect_to(&B);
  assert_int_equal(gshm_pull_prefix(b, "a", "pub/set/", NULL, &v, &n), -EMFILE);
  assert_non_null(strstr(gshm_last_error(b), "limit"));
  assert_int_equal(count_named(b, "pub/set/"), 0);
  assert_int_equal(gshm_status(b, &s), 0);
  assert_int_equal(s.segments, 0);
  assert_true(s.bytes == 0);
  gshm_disconnect(b);
}

/* Many sets pulled from one peer at once: MANY_SETS prefixes of
 * MANY_EACH segments, each set asking all its grants at once, more in all
 * than the peer keeps for one link (LINK_MAX_GRANTS: it refuses more as
 * busy).  Every set completes, byte-exact.  Before, the sets whose every
 * ask was refused failed, or hung: a failing set closed the segments
 * waiting to be asked again and its count of open ones wrapped below
 * zero, so it never ended (seen with gshm-bench pull --fanout 3 --split:
 * 40 sets of 10, 17 of them hung). */
#define MANY_SETS 8
#define MANY_EACH 12
static uint64_t many_size(int i) { return 4096 + 512 * (uint64_t)i; }

static void test_many_sets_at_once(void **state) {
  static struct bg_pull bg[MANY_SETS];
  static char names[MANY_SETS][32];
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  (void)state;

  for (int k = 0; k < MANY_SETS; k++) {
    snprintf(names[k], sizeof(names[k]), "pub/many/%d/", k);
    set_make(a, names[k], MANY_EACH, many_size, 1000 + 100 * (unsigned long long)k);
    bg[k] = (struct bg_pull){.puller = &B, .peer = "a", .name = names[k], .prefix = true};
  }
  for (int k = 0; k < MANY_SETS; k++)
    assert_int_equal(pthread_create(&bg[k].t, NULL, bg_thread, &bg[k]), 0);
  for (int k = 0; k < MANY_SETS; k++) {
    int waited = 0;
    while (pthread_tryjoin_np(bg[k].t, NULL) == EBUSY && waited++ < 600)
      usleep(100000);
    if (waited > 600)
      fail_msg("the pull of %s did not end in 60 s", names[k]);
    if (bg[k].err)
      fail_msg("the pull of %s: %s", names[k], gshm_strerror(bg[k].err));
    assert_int_equal(bg[k].n, MANY_EACH);
    gshm_free(bg[k].v);
  }
  for (int k = 0; k < MANY_SETS; k++) {
    set_check(b, names[k], MANY_EACH, many_size, 1000 + 100 * (unsigned long long)k);
    set_unlink(b, names[k], MANY_EACH);
    set_unlink(a, names[k], MANY_EACH);
  }
  gshm_disconnect(a);
  gshm_disconnect(b);
}

/* A pull whose result a restart of b lost (b pulled and published the
 * segment, and stored it, then was SIGKILLed before its client read the
 * result; libgshm reconnects and sends the pull again), through the
 * reply-losing proxy of tests/integration (proxy.h), which restarts b
 * with its own arguments.  The segment fits one chunk (b's pull_chunk is
 * 32K or more in this file): no progress reply goes first, so the reply
 * kept is the result, sent after the publish.  Before pull tokens the resend met the segment
 * the first one published: -EEXIST. */
#define ONE_SIZE ((16u << 10) + 3)

/* After a pull through proxy p whose first reply a restart of B lost:
 * B holds one segment under local_name's folder, local_name, of ONE_SIZE
 * bytes of seed, and res names it as pulled from peer a's remote_name
 * (remote: its info there).  Returns a connection to B. */
static gshm_client_t *check_lost_reply(const struct proxy *p, const gshm_pull_result_t *res,
                                       const char *local_name, const char *remote_name,
                                       const gshm_segment_info_t *remote,
                                       unsigned long long seed) {
  gshm_client_t *b = connect_to(&B);
  gshm_segment_info_t local;
  char folder[64];

  snprintf(folder, sizeof(folder), "%.*s", (int)(strrchr(local_name, '/') - local_name + 1),
           local_name);
  assert_true(p->kept);
  assert_int_equal(p->restarted, 0);
  assert_int_equal(count_named(b, folder), 1);
  check_segment(b, local_name, ONE_SIZE, seed);
  assert_int_equal(gshm_stat_name(b, local_name, &local), 0);
  assert_string_equal(res->segment.name, local_name);
  assert_int_equal(res->segment.id, local.id);
  assert_int_equal(res->segment.generation, local.generation);
  assert_string_equal(res->segment.source, local.source);
  assert_int_equal(res->segment.granularity, local.granularity); /* (a set's was 0) */
  assert_int_equal(res->segment.created_ns, local.created_ns);
  assert_int_equal(res->bytes, ONE_SIZE);
  assert_string_equal(res->peer, "a");
  assert_string_equal(res->remote_name, remote_name);
  assert_int_equal(res->remote_id, remote->id);
  assert_int_equal(res->remote_generation, remote->generation);
  return b;
}

/* The first pull is published, its result kept by the proxy, b killed
 * and restarted: libgshm's resend is answered with the first one's
 * segment, one segment and the bytes of a; a pull of its own (a new
 * token) still meets the name (-EEXIST). */
static void test_pull_reply_lost_to_a_restart(void **state) {
  gshm_pull_opts_t po = {.local_name = "got/one"};
  gshm_pull_result_t res, again;
  gshm_segment_info_t remote;
  gshm_client_t *a = connect_to(&A), *c, *b;
  struct proxy p = {.restart_args = B.argv};
  (void)state;

  make_segment(a, "pub/one", ONE_SIZE, 11);
  assert_int_equal(gshm_stat_name(a, "pub/one", &remote), 0);
  proxy_start(&p, &B.h, GSHM_WIRE_PULL);
  assert_int_equal(gshm_connect(p.path, "puller", &c), 0);
  assert_int_equal(gshm_pull(c, "a", "pub/one", &po, &res), 0);
  b = check_lost_reply(&p, &res, "got/one", "pub/one", &remote, 11);
  assert_int_equal(gshm_pull(c, "a", "pub/one", &po, &again), -EEXIST);
  assert_int_equal(gshm_unlink(b, "got/one"), 0);
  assert_int_equal(gshm_unlink(a, "pub/one"), 0);
  gshm_disconnect(c);
  gshm_disconnect(b);
  gshm_disconnect(a);
  unlink(p.path);
  proxy_stop(&p);
}

/* The same for a set (gshm_pull_prefix) that is one chunk, one segment
 * of ONE_SIZE: its first reply is its items page, sent after the
 * publish, and that is the one the proxy keeps.  libgshm's resend is
 * answered with the first one's segment (before: -EEXIST, the set's
 * members were not in the memo); a set pull of its own (a new token)
 * still meets the name. */
static void test_set_reply_lost_to_a_restart(void **state) {
  gshm_pull_opts_t po = {.local_name = "gotset/"};
  gshm_pull_result_t *v = NULL, *again = NULL;
  gshm_segment_info_t remote;
  gshm_client_t *a = connect_to(&A), *c, *b;
  struct proxy p = {.restart_args = B.argv};
  size_t n = 0;
  (void)state;

  make_segment(a, "pub/lost/one", ONE_SIZE, 12);
  assert_int_equal(gshm_stat_name(a, "pub/lost/one", &remote), 0);
  proxy_start(&p, &B.h, GSHM_WIRE_PULL);
  assert_int_equal(gshm_connect(p.path, "puller", &c), 0);
  assert_int_equal(gshm_pull_prefix(c, "a", "pub/lost/", &po, &v, &n), 0);
  assert_int_equal(n, 1);
  b = check_lost_reply(&p, &v[0], "gotset/one", "pub/lost/one", &remote, 12);
  assert_int_equal(gshm_pull_prefix(c, "a", "pub/lost/", &po, &again, &n), -EEXIST);
  gshm_free(v);
  assert_int_equal(gshm_unlink(b, "gotset/one"), 0);
  assert_int_equal(gshm_unlink(a, "pub/lost/one"), 0);
  gshm_disconnect(c);
  gshm_disconnect(b);
  gshm_disconnect(a);
  unlink(p.path);
  proxy_stop(&p);
}

/* One PULL on raw connection fd (request id, token tok, local name and
 * mode): replies read up to its end.  Returns the status; *id_out the
 * new segment's id when OK. */
static int raw_pull(int fd, uint32_t id, const uint8_t *tok, const char *local, uint32_t mode,
                    uint64_t *id_out) {
  Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
  Gshm__Reply *r;
  int status;

  m.peer = "a";
  m.name = "pub/tok";
  m.local_name = (char *)local;
  m.mode = mode;
  m.token.data = (uint8_t *)tok;
  m.token.len = GSHM_PULL_TOKEN_BYTES;
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_PULL, id, &m.base, -1), 0);
  while ((r = raw_reply(fd))->status == GSHM__STATUS__STATUS_OK &&
         r->body_case == GSHM__REPLY__BODY_PULL_PROGRESS)
    gshm__reply__free_unpacked(r, NULL);
  status = r->status;
  if (status == GSHM__STATUS__STATUS_OK) {
    assert_int_equal(r->body_case, GSHM__REPLY__BODY_PULL_RESULT);
    *id_out = r->pull_result->segment->id;
  }
  gshm__reply__free_unpacked(r, NULL);
  return status;
}

/* The resend memo answers only the same pull: the same token and every
 * field the same (the key is a hash of them all), for the same uid.  The
 * same request again is answered with the segment the first published
 * (no restart is needed for that: the memo is asked on every pull);
 * another local name or mode with that token, or a pull without it,
 * is a pull of its own. */
static void test_pull_token_names_one_request(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  uint8_t tok[GSHM_PULL_TOKEN_BYTES];
  gshm_pull_opts_t po = {.local_name = "got/tok"};
  gshm_pull_result_t res;
  uint64_t first = 0, id = 0;
  int fd = raw_connect(B.h.socket_path);
  (void)state;

  memset(tok, 0x5a, sizeof(tok));
  make_segment(a, "pub/tok", 4099, 21);
  assert_int_equal(raw_pull(fd, 2, tok, "got/tok", 0, &first), GSHM__STATUS__STATUS_OK);
  assert_int_equal(raw_pull(fd, 3, tok, "got/tok", 0, &id), GSHM__STATUS__STATUS_OK);
  assert_int_equal(id, first);
  assert_int_equal(raw_pull(fd, 4, tok, "got/tok", 0644, &id), GSHM__STATUS__STATUS_EXISTS);
  assert_int_equal(gshm_pull(b, "a", "pub/tok", &po, &res), -EEXIST);
  assert_int_equal(raw_pull(fd, 5, tok, "got/tok2", 0, &id), GSHM__STATUS__STATUS_OK);
  assert_true(id != first);
  check_segment(b, "got/tok2", 4099, 21);
  close(fd);
  assert_int_equal(gshm_unlink(b, "got/tok"), 0);
  assert_int_equal(gshm_unlink(b, "got/tok2"), 0);
  assert_int_equal(gshm_unlink(a, "pub/tok"), 0);
  gshm_disconnect(b);
  gshm_disconnect(a);
}

/* A set's answer is many packets (progress reports, then pull_items
 * pages, then the result), all to one PULL.  A client that reads them
 * only at the end (busy, or a progress callback that takes its time)
 * owes gshmd no read meanwhile: its other requests are not read either.
 * gshmd counted each packet against limits.max_inflight (16) and closed
 * the connection ("client does not read its replies"), and with it the
 * client's leases, once 16 were queued: a set of 4,000 segments of long
 * names is about 25 pages.  Now the pages of one answer count once and a
 * progress report waits for nothing (one is dropped while the client has
 * replies unread): the raw client reads every page and the result. */
static void test_answer_pages_unread(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
  char pad[232], name[256];
  const int n = 4000;
  size_t items = 0;
  Gshm__Reply *r;
  int fd = raw_connect(B.h.socket_path);
  (void)state;

  memset(pad, 'u', sizeof(pad) - 1);
  pad[sizeof(pad) - 1] = '\0';
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "pub/unread/%s%04d", pad, i);
    make_segment(a, name, 64, 900 + (unsigned long long)i);
  }
  m.peer = "a";
  m.name = "pub/unread/";
  m.local_name = "unread/";
  m.prefix = true;
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_PULL, 7, &m.base, -1), 0);
  /* nothing read until the set is published and its answer all sent */
  for (int t = 0; count_named(b, "unread/") < (unsigned)n; t++) {
    assert_true(t < 1200); /* (2 minutes) */
    usleep(100 * 1000);
  }
  usleep(300 * 1000);
  while ((r = raw_reply(fd))->status == GSHM__STATUS__STATUS_OK &&
         r->body_case != GSHM__REPLY__BODY_PULL_RESULT) {
    if (r->body_case == GSHM__REPLY__BODY_PULL_ITEMS) {
      assert_int_equal(r->pull_items->first, items);
      items += r->pull_items->n_items;
    }
    gshm__reply__free_unpacked(r, NULL);
  }
  assert_int_equal(r->status, GSHM__STATUS__STATUS_OK);
  assert_int_equal(r->pull_result->count, n);
  assert_int_equal(items, n);
  gshm__reply__free_unpacked(r, NULL);
  close(fd);
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "unread/%s%04d", pad, i);
    assert_int_equal(gshm_unlink(b, name), 0);
    snprintf(name, sizeof(name), "pub/unread/%s%04d", pad, i);
    assert_int_equal(gshm_unlink(a, name), 0);
  }
  gshm_disconnect(a);
  gshm_disconnect(b);
}

/* Every name under prefix on c's node unlinked. */
static void unlink_under(gshm_client_t *c, const char *prefix) {
  gshm_segment_info_t *v = NULL;
  size_t n = 0;
  assert_int_equal(gshm_list(c, &v, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (!strncmp(v[i].name, prefix, strlen(prefix)))
      assert_int_equal(gshm_unlink(c, v[i].name), 0);
  gshm_free(v);
}

/* Whether c's node has a pull in flight. */
static bool pulls_in_flight(gshm_client_t *c) {
  gshm_cluster_pull_t *v = NULL;
  size_t n = 0;
  assert_int_equal(gshm_cluster_pulls(c, &v, &n), 0);
  gshm_free(v);
  return n > 0;
}

/* PULL_CANCEL at any moment of a set pull, with or without --replace,
 * then the replies read to the end, or the connection closed at once:
 * the node stays up, each pull ends (published whole or gone whole), and
 * nothing is left in flight or owed. */
static void test_cancel_races(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  Gshm__PullCancel cx = GSHM__PULL_CANCEL__INIT;
  char name[64];
  (void)state;

  for (int i = 0; i < 24; i++) {
    snprintf(name, sizeof(name), "pub/race/%02d", i);
    make_segment(a, name, 96 * 1024, 700 + (unsigned long long)i);
  }
  srand(7);
  for (int it = 0; it < 120; it++) {
    Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
    int fd = raw_connect(B.h.socket_path), how = it % 4;
    Gshm__Reply *r;

    m.peer = "a";
    m.name = "pub/race/";
    m.local_name = "race/";
    m.prefix = true;
    m.replace = it % 3 == 0;
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_PULL, 5, &m.base, -1), 0);
    usleep((useconds_t)(rand() % 15000));
    cx.request_id = how == 3 ? 6 : 5;
    if (how != 2)
      assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_PULL_CANCEL, 0, &cx.base, -1), 0);
    if (how == 0 || how == 3) {
      while ((r = raw_reply(fd))->status == GSHM__STATUS__STATUS_OK &&
             r->body_case != GSHM__REPLY__BODY_PULL_RESULT)
        gshm__reply__free_unpacked(r, NULL);
      assert_true(r->status == GSHM__STATUS__STATUS_OK ||
                  r->status == GSHM__STATUS__STATUS_CANCELED);
      gshm__reply__free_unpacked(r, NULL);
    }
    close(fd);
    for (int t = 0; pulls_in_flight(b); t++) {
      assert_true(t < 3000);
      usleep(10 * 1000);
    }
    if ((it + 1) % 3) /* (kept for the next one, a --replace) */
      unlink_under(b, "race/");
  }
  assert_int_equal(metric(b, "gshm_cluster_pull_host_owed_bytes"), 0);
  unlink_under(b, "race/");
  unlink_under(a, "pub/race/");
  gshm_disconnect(a);
  gshm_disconnect(b);
}

/* The empty prefix, every segment the peer exports (docs/CLUSTER.md,
 * gshmctl pull PEER: --prefix): gshmctl names the set "from a (all it
 * exports)", and a failure "every segment from peer 'a'".  Before, it
 * said "pulled 2 segments under a:: 12 KiB" and "pull of the set under
 * '' from peer 'a' failed". */
static void test_empty_prefix_named(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  const char *pull[] = {"pull", "a:", "--prefix", "--as", "all/", NULL};
  char *out = NULL;
  (void)state;

  make_segment(a, "pub/all/one", 4096, 301);
  make_segment(a, "pub/all/two", 8192, 302);
  assert_int_equal(harness_gshmctl(&B.h, &out, pull), 0);
  assert_non_null(strstr(out, " segments from a (all it exports) as 'all/': "));
  assert_null(strstr(out, "a::"));
  free(out);
  assert_int_equal(count_named(b, "all/pub/all/"), 2);
  /* again: the names are taken here now */
  assert_int_equal(harness_gshmctl_stderr(&B.h, &out, pull, true), 1);
  assert_non_null(strstr(out, "pull of every segment from peer 'a' failed: segment exists"));
  assert_null(strstr(out, "''"));
  free(out);
  unlink_under(b, "all/");
  unlink_under(a, "pub/all/");
  gshm_disconnect(a);
  gshm_disconnect(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* first: it pulls all A exports, which the others leave more of,
       * into B, whose limits test_set_over_limit lowers */
      cmocka_unit_test(test_empty_prefix_named),
      cmocka_unit_test(test_invisible_while_pulling),
      cmocka_unit_test(test_killed_mid_pull_restart),
      cmocka_unit_test(test_set_all_at_once),
      cmocka_unit_test(test_replace),
      cmocka_unit_test(test_set_pages),
      cmocka_unit_test(test_answer_pages_unread),
      cmocka_unit_test(test_cancel_races),
      cmocka_unit_test(test_replace_in_grace),
      cmocka_unit_test(test_set_peer_killed),
      cmocka_unit_test(test_many_sets_at_once),
      cmocka_unit_test(test_set_over_limit),
      cmocka_unit_test(test_pull_reply_lost_to_a_restart),
      cmocka_unit_test(test_set_reply_lost_to_a_restart),
      cmocka_unit_test(test_pull_token_names_one_request),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
