/* SPDX-License-Identifier: Apache-2.0 */
/* Hidden creates and PUBLISH (gshm.h GSHM_CREATE_HIDDEN, gshm_publish):
 * a segment replaced in place is never missing nor half-written to a
 * reader; a hidden segment is nobody else's to see, open or publish; it
 * counts in its owner's quota and goes with its creator or with a gshmd
 * restart; a replace follows the rules of an unlink; and a gshmd killed
 * around publishes leaves the name with the old segment or the new one.
 * Real gshmd, real processes of other uids (needs root; skipped
 * otherwise). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "raw.h"
#include "wire.h"

#define UID_A 60001
#define UID_B 60002
#define SEG 16384u /* bytes of the replaced segments: four pages */

static struct harness *h; /* the group fixture; NULL when the tests skip */

/* A failed check in a kid (cmocka's asserts belong to the parent). */
#define KCHECK(cond)                                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "kid %d: %s:%d: check failed: %s\n", (int)getpid(), __FILE__, \
              __LINE__, #cond);                                                     \
      _exit(3);                                                                     \
    }                                                                               \
  } while (0)

/* gshmd's settings, at its start and its restarts */
static const char *const args[] = {"--set", "daemon.socket_mode=0666", "--set",
                                   "quota.host_bytes=1M", NULL};

static int setup(void **state) {
  if (geteuid() != 0)
    return 0; /* the tests skip */
  h = harness_cmocka_start(state, sizeof(*h), args);
  return h ? 0 : -1;
}

static int teardown(void **state) {
  h = NULL;
  return harness_cmocka_teardown(state);
}

static void need_root(void) {
  if (!h)
    skip();
}

/* Whether the SEG bytes of name hold one value v, 1..255, all through
 * (*v_out: it); false when some byte differs (a half-written segment). */
static bool read_uniform(gshm_client_t *c, const char *name, int *err_out, int *v_out) {
  static uint8_t buf[SEG];
  gshm_segment_t *seg;
  bool ok = true;

  if ((*err_out = gshm_open(c, name, GSHM_ACCESS_READ, &seg)))
    return false;
  *err_out = gshm_read(seg, 0, buf, SEG);
  for (size_t i = 0; !*err_out && i < SEG; i++)
    ok = ok && buf[i] == buf[0];
  *v_out = buf[0];
  gshm_close(seg);
  return !*err_out && ok && buf[0] != 0;
}

/* Makes name's next version, all bytes v, hidden; fills it; publishes it
 * over the old one.  0 or the first error. */
static int republish(gshm_client_t *c, const char *name, uint8_t v) {
  static uint8_t buf[SEG];
  gshm_segment_t *seg;
  int e;

  memset(buf, v, sizeof(buf));
  if ((e = gshm_create(c, name, SEG, "host", 0644, GSHM_CREATE_HIDDEN, &seg)))
    return e;
  if (!(e = gshm_write(seg, 0, buf, SEG)))
    e = gshm_publish(seg, GSHM_PUBLISH_REPLACE);
  gshm_close(seg);
  return e;
}

/* The reader: opens and reads the name until told to stop; every open
 * must find it and every read must be whole.  Steps once when it has
 * read the first version. */
struct reader {
  const char *socket, *name;
};

static void reader_body(struct harness_kid *k, void *arg) {
  const struct reader *r = arg;
  gshm_client_t *c;
  int e, v, last = -1, versions = 0;
  long reads = 0;

  KCHECK(gshm_connect(r->socket, "reader", &c) == 0);
  for (;;) {
    bool ok = read_uniform(c, r->name, &e, &v);
    if (!ok)
      fprintf(stderr, "reader: open/read %d (%s), value %d\n", e, gshm_strerror(e), v);
    KCHECK(ok);
    if (v != last)
      versions++;
    if (reads++ == 0)
      KCHECK(harness_kid_step(k->out) == 0);
    last = v;
    if (harness_kid_await(k->in, 0))
      break;
  }
  fprintf(stderr, "reader: %ld reads, %d versions seen\n", reads, versions);
  KCHECK(versions >= 2); /* it read while the name changed */
  gshm_disconnect(c);
}

/* Starts reader_body as UID_B on r->name and waits for its first read. */
static void reader_start(struct harness_kid *k, const struct reader *r) {
  assert_int_equal(harness_kid_start(k, UID_B, UID_B, reader_body, (void *)r), 0);
  assert_true(harness_kid_await(k->from_kid, 10000));
}

/* Stops it: it must have met no missing name, no partial segment. */
static void reader_stop(struct harness_kid *k) {
  assert_int_equal(harness_kid_step(k->to_kid), 0);
  assert_int_equal(harness_kid_wait(k), 0);
}

/* 200 republishes under a reader of another uid that polls the name:
 * never ENOENT, never a partial segment (with unlink-then-create, the
 * reader met ENOENT between the two). */
static void test_republish_is_atomic(void **state) {
  const struct reader r = {h->socket_path, "w/model"};
  struct harness_kid k;
  gshm_client_t *c;
  gshm_status_info_t st;
  (void)state;

  need_root();
  assert_int_equal(gshm_connect(h->socket_path, "publisher", &c), 0);
  assert_int_equal(republish(c, "w/model", 1), 0);
  reader_start(&k, &r);
  for (int i = 0; i < 200; i++)
    assert_int_equal(republish(c, "w/model", (uint8_t)(2 + i % 250)), 0);
  reader_stop(&k);
  /* nothing left but the last version */
  assert_int_equal(gshm_status(c, &st), 0);
  assert_int_equal(st.segments, 1);
  assert_int_equal(st.bytes, SEG);
  assert_int_equal(gshm_unlink(c, "w/model"), 0);
  gshm_disconnect(c);
}

struct racer {
  const char *socket;
  uint8_t first;   /* values first .. first + 99 */
  int want;        /* what each publish must return: 0, or -EACCES for another user's name */
};

/* 100 republishes of r/x as fast as it can, each publish answered want. */
static void racer_body(struct harness_kid *k, void *arg) {
  const struct racer *r = arg;
  gshm_client_t *c;

  KCHECK(gshm_connect(r->socket, "racer", &c) == 0);
  KCHECK(harness_kid_await(k->in, 10000)); /* all start together */
  for (int i = 0; i < 100; i++) {
    int e = republish(c, "r/x", (uint8_t)(r->first + i));
    if (e != r->want)
      fprintf(stderr, "racer %u: publish %d (%s): %s\n", r->first, e, gshm_strerror(e),
              gshm_last_error(c));
    KCHECK(e == r->want);
  }
  gshm_disconnect(c);
}

/* Publishes of one name racing: two clients of one uid replace it 100
 * times each while a user who may not unlink it tries to (EACCES every
 * time: the name is never found free) and a reader polls it (never
 * missing, never partial).  One segment and its bytes are left. */
static void test_racing_publishes(void **state) {
  struct racer rs[3] = {{h->socket_path, 1, 0}, {h->socket_path, 101, 0},
                        {h->socket_path, 201, -EACCES}};
  uid_t uids[3] = {(uid_t)-1, (uid_t)-1, UID_A};
  const struct reader r = {h->socket_path, "r/x"};
  struct harness_kid k[3], reader;
  gshm_client_t *c;
  gshm_status_info_t st;
  (void)state;

  need_root();
  assert_int_equal(gshm_connect(h->socket_path, "root", &c), 0);
  assert_int_equal(republish(c, "r/x", 250), 0);
  reader_start(&reader, &r);
  for (int i = 0; i < 3; i++)
    assert_int_equal(harness_kid_start(&k[i], uids[i], uids[i], racer_body, &rs[i]), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(harness_kid_step(k[i].to_kid), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(harness_kid_wait(&k[i]), 0);
  reader_stop(&reader);
  assert_int_equal(gshm_status(c, &st), 0);
  assert_int_equal(st.segments, 1);
  assert_int_equal(st.bytes, SEG);
  assert_int_equal(gshm_unlink(c, "r/x"), 0);
  gshm_disconnect(c);
}

/* The creator of a hidden segment, stepped by the parent:
 * 1: made (id 0), 2: refused by a name B holds (EEXIST, EACCES with
 * replace), 3: published (once: a second publish is EINVAL). */
static void hidden_owner_body(struct harness_kid *k, void *arg) {
  static uint8_t buf[SEG];
  gshm_client_t *c;
  gshm_segment_t *seg;

  memset(buf, 'A', sizeof(buf));
  KCHECK(gshm_connect((const char *)arg, "owner", &c) == 0);
  KCHECK(gshm_create(c, "h/x", SEG, "host", 0666, GSHM_CREATE_HIDDEN, &seg) == 0);
  KCHECK(gshm_segment_info(seg)->id == 0);
  KCHECK(gshm_write(seg, 0, buf, SEG) == 0);
  /* not even its creator opens it by name */
  {
    gshm_segment_t *other;
    KCHECK(gshm_open(c, "h/x", GSHM_ACCESS_READ, &other) == -ENOENT);
  }
  KCHECK(harness_kid_step(k->out) == 0 && harness_kid_await(k->in, 10000));
  KCHECK(gshm_publish(seg, 0) == -EEXIST);
  KCHECK(gshm_publish(seg, GSHM_PUBLISH_REPLACE) == -EACCES);
  KCHECK(harness_kid_step(k->out) == 0 && harness_kid_await(k->in, 10000));
  KCHECK(gshm_publish(seg, 0) == 0);
  KCHECK(gshm_segment_info(seg)->id != 0);
  KCHECK(gshm_publish(seg, 0) == -EINVAL);
  KCHECK(gshm_publish(seg, GSHM_PUBLISH_REPLACE) == -EINVAL);
  KCHECK(harness_kid_step(k->out) == 0 && harness_kid_await(k->in, 10000));
  gshm_close(seg);
  gshm_disconnect(c);
}

/* B, another uid: the hidden name is not there to open, stat or list;
 * B may take the name meanwhile. */
static void other_user_body(struct harness_kid *k, void *arg) {
  static uint8_t buf[4096];
  gshm_client_t *c;
  gshm_segment_t *seg;
  gshm_segment_info_t info, *infos = NULL;
  size_t n = 0;

  (void)k;
  memset(buf, 'B', sizeof(buf));
  KCHECK(gshm_connect((const char *)arg, "other", &c) == 0);
  KCHECK(gshm_open(c, "h/x", GSHM_ACCESS_READ, &seg) == -ENOENT);
  KCHECK(gshm_open(c, "h/x", GSHM_ACCESS_READ_WRITE, &seg) == -ENOENT);
  KCHECK(gshm_stat_name(c, "h/x", &info) == -ENOENT);
  KCHECK(gshm_list(c, &infos, &n) == 0 && n == 0);
  gshm_free(infos);
  KCHECK(gshm_create(c, "h/x", sizeof(buf), "host", 0644, 0, &seg) == 0);
  KCHECK(gshm_write(seg, 0, buf, sizeof(buf)) == 0);
  gshm_close(seg);
  gshm_disconnect(c);
}

/* PUBLISH of lease_id on a raw connection of the caller: its status. */
static int raw_publish(uint64_t lease_id, bool replace) {
  Gshm__PublishRequest m = GSHM__PUBLISH_REQUEST__INIT;
  int fd = raw_connect(h->socket_path), status;
  Gshm__Reply *r;

  m.lease_id = lease_id;
  m.replace = replace;
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_PUBLISH, 7, &m.base, -1), 0);
  r = raw_reply(fd);
  status = r->status;
  gshm__reply__free_unpacked(r, NULL);
  close(fd);
  return status;
}

/* The lease id of the hidden segment named name (an admin's listing). */
static uint64_t hidden_lease(gshm_client_t *c, const char *name) {
  gshm_lease_info_t *ls = NULL;
  size_t n = 0;
  uint64_t id = 0;

  assert_int_equal(gshm_list_leases(c, &ls, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(ls[i].segment_name, name) && ls[i].segment_id == 0)
      id = ls[i].lease_id;
  gshm_free(ls);
  assert_true(id != 0);
  return id;
}

static void test_hidden_is_nobody_elses(void **state) {
  struct harness_kid a, b;
  gshm_client_t *c;
  gshm_segment_info_t info, *infos = NULL;
  gshm_status_info_t st;
  size_t n = 0;
  uint8_t byte;
  gshm_segment_t *seg;
  (void)state;

  need_root();
  assert_int_equal(gshm_connect(h->socket_path, "root", &c), 0);
  assert_int_equal(harness_kid_start(&a, UID_A, UID_A, hidden_owner_body, (void *)h->socket_path),
                   0);
  assert_true(harness_kid_await(a.from_kid, 10000));
  /* an admin neither lists it nor opens it, nor publishes it by its lease */
  assert_int_equal(gshm_list(c, &infos, &n), 0);
  assert_int_equal(n, 0);
  gshm_free(infos);
  assert_int_equal(gshm_stat_name(c, "h/x", &info), -ENOENT);
  assert_int_equal(raw_publish(hidden_lease(c, "h/x"), true), GSHM__STATUS__STATUS_STALE);
  assert_int_equal(gshm_status(c, &st), 0);
  assert_int_equal(st.bytes, SEG); /* counted */
  assert_int_equal(harness_kid_start(&b, UID_B, UID_B, other_user_body, (void *)h->socket_path),
                   0);
  assert_int_equal(harness_kid_wait(&b), 0);
  /* A may neither take B's name nor replace B's segment: B's stays */
  assert_int_equal(harness_kid_step(a.to_kid), 0);
  assert_true(harness_kid_await(a.from_kid, 10000));
  assert_int_equal(gshm_stat_name(c, "h/x", &info), 0);
  assert_int_equal(info.uid, UID_B);
  assert_int_equal(gshm_unlink(c, "h/x"), 0);
  /* the name free: A publishes, once */
  assert_int_equal(harness_kid_step(a.to_kid), 0);
  assert_true(harness_kid_await(a.from_kid, 10000));
  assert_int_equal(gshm_stat_name(c, "h/x", &info), 0);
  assert_int_equal(info.uid, UID_A);
  assert_int_equal(info.flags, 0); /* (hidden is no segment flag) */
  assert_int_equal(gshm_open(c, "h/x", GSHM_ACCESS_READ, &seg), 0);
  assert_int_equal(gshm_read(seg, SEG - 1, &byte, 1), 0);
  assert_int_equal(byte, 'A');
  gshm_close(seg);
  assert_int_equal(harness_kid_step(a.to_kid), 0);
  assert_int_equal(harness_kid_wait(&a), 0);
  assert_int_equal(gshm_unlink(c, "h/x"), 0);
  gshm_disconnect(c);
}

/* quota.host_bytes is 1M: a hidden segment counts until it goes. */
static void quota_body(struct harness_kid *k, void *arg) {
  gshm_client_t *c;
  gshm_segment_t *hidden, *seg;

  (void)k;
  KCHECK(gshm_connect((const char *)arg, "quota", &c) == 0);
  KCHECK(gshm_create(c, "q/h", 768 << 10, "host", 0600, GSHM_CREATE_HIDDEN, &hidden) == 0);
  KCHECK(gshm_create(c, "q/p", 512 << 10, "host", 0600, 0, &seg) == -EDQUOT);
  KCHECK(gshm_create(c, "q/h2", 512 << 10, "host", 0600, GSHM_CREATE_HIDDEN, &seg) == -EDQUOT);
  gshm_close(hidden); /* unpublished: it goes with its lease */
  KCHECK(gshm_create(c, "q/p", 512 << 10, "host", 0600, 0, &seg) == 0);
  gshm_close(seg);
  KCHECK(gshm_unlink(c, "q/p") == 0);
  gshm_disconnect(c);
}

static void test_quota_counts_hidden(void **state) {
  struct harness_kid k;
  (void)state;

  need_root();
  assert_int_equal(harness_kid_start(&k, UID_A, UID_A, quota_body, (void *)h->socket_path), 0);
  assert_int_equal(harness_kid_wait(&k), 0);
}

/* Makes a hidden segment and fills it through its mapping, steps, then
 * waits; stepped again (after a gshmd restart), its bytes are still what
 * it wrote (a graceful stop punched them: zeros) and its publish finds
 * the segment gone. */
static void doomed_body(struct harness_kid *k, void *arg) {
  gshm_client_t *c;
  gshm_segment_t *seg;
  uint8_t *p;
  int e;

  KCHECK(gshm_connect((const char *)arg, "doomed", &c) == 0);
  KCHECK(gshm_create(c, "d/x", SEG, "host", 0644, GSHM_CREATE_HIDDEN, &seg) == 0);
  KCHECK(gshm_map(seg, NULL, 0, (void **)&p) == 0);
  memset(p, 0xa5, SEG);
  KCHECK(harness_kid_step(k->out) == 0 && harness_kid_await(k->in, 30000));
  for (size_t i = 0; i < SEG; i++)
    if (p[i] != 0xa5) {
      fprintf(stderr, "doomed: byte %zu of the hidden segment is 0x%02x after the restart\n", i,
              p[i]);
      _exit(4);
    }
  e = gshm_publish(seg, GSHM_PUBLISH_REPLACE);
  if (e != -ESTALE)
    fprintf(stderr, "doomed: publish %d (%s): %s\n", e, gshm_strerror(e), gshm_last_error(c));
  KCHECK(e == -ESTALE);
  gshm_close(seg);
  gshm_disconnect(c);
}

/* gshmd back to nothing: no segment, no byte, only c connected (waited
 * for: a dead client's connection ends when gshmd reads its hangup). */
static void await_empty(gshm_client_t *c) {
  gshm_status_info_t st;
  gshm_segment_info_t info;

  for (int i = 0; i < 500; i++) {
    assert_int_equal(gshm_status(c, &st), 0);
    if (st.clients == 1)
      break;
    usleep(10000);
  }
  assert_int_equal(st.clients, 1);
  assert_int_equal(st.segments, 0);
  assert_int_equal(st.bytes, 0);
  assert_int_equal(gshm_stat_name(c, "d/x", &info), -ENOENT);
}

static void test_creator_gone_leaves_nothing(void **state) {
  struct harness_kid k;
  gshm_client_t *c;
  (void)state;

  need_root();
  /* killed before its publish */
  assert_int_equal(harness_kid_start(&k, UID_A, UID_A, doomed_body, (void *)h->socket_path), 0);
  assert_true(harness_kid_await(k.from_kid, 10000));
  kill(k.pid, SIGKILL);
  assert_int_equal(harness_kid_wait(&k), 128 + SIGKILL);
  assert_int_equal(gshm_connect(h->socket_path, "watcher", &c), 0);
  await_empty(c);
  gshm_disconnect(c);
  /* gshmd killed, then stopped, before its publish: nothing after the
   * restart, the creator's bytes stay, and the publish says the segment
   * is gone */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(harness_kid_start(&k, UID_A, UID_A, doomed_body, (void *)h->socket_path), 0);
    assert_true(harness_kid_await(k.from_kid, 10000));
    assert_int_equal(harness_restart(h, i ? SIGTERM : SIGKILL, args), 0);
    assert_int_equal(harness_kid_step(k.to_kid), 0);
    assert_int_equal(harness_kid_wait(&k), 0);
    assert_int_equal(gshm_connect(h->socket_path, "watcher", &c), 0);
    await_empty(c);
    gshm_disconnect(c);
  }
}

/* Republishes c/x until stepped, through gshmd's restarts (errors of a
 * restart in the middle are retried). */
static void publisher_body(struct harness_kid *k, void *arg) {
  gshm_client_t *c;
  unsigned v = 0, done = 0;

  KCHECK(gshm_connect((const char *)arg, "publisher", &c) == 0);
  KCHECK(harness_kid_step(k->out) == 0);
  while (!harness_kid_await(k->in, 0))
    if (republish(c, "c/x", (uint8_t)(1 + v++ % 255)) == 0)
      done++;
  fprintf(stderr, "publisher: %u of %u republishes done\n", done, v);
  gshm_disconnect(c);
}

/* gshmd SIGKILLed 20 times while a client republishes: after each restart
 * the name holds one whole version (the fd store journals the publish:
 * the old segment's unlink and the new one's record are one change). */
static void test_killed_around_publish(void **state) {
  struct harness_kid k;
  gshm_client_t *c;
  int e, v;
  (void)state;

  need_root();
  setenv("GSHM_RECONNECT_MS", "10000", 1); /* (the kid's, inherited) */
  assert_int_equal(gshm_connect(h->socket_path, "first", &c), 0);
  assert_int_equal(republish(c, "c/x", 255), 0);
  gshm_disconnect(c);
  assert_int_equal(harness_kid_start(&k, (uid_t)-1, 0, publisher_body, (void *)h->socket_path), 0);
  assert_true(harness_kid_await(k.from_kid, 10000));
  srand((unsigned)time(NULL));
  for (int i = 0; i < 20; i++) {
    usleep((useconds_t)(1000 + rand() % 20000));
    assert_int_equal(harness_restart(h, SIGKILL, args), 0);
    assert_int_equal(gshm_connect(h->socket_path, "check", &c), 0);
    if (!read_uniform(c, "c/x", &e, &v))
      fail_msg("after restart %d: '%s' read %d (%s), value %d", i, "c/x", e, gshm_strerror(e), v);
    gshm_disconnect(c);
  }
  assert_int_equal(harness_kid_step(k.to_kid), 0);
  assert_int_equal(harness_kid_wait(&k), 0);
  assert_int_equal(gshm_connect(h->socket_path, "last", &c), 0);
  assert_int_equal(gshm_unlink(c, "c/x"), 0);
  gshm_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_republish_is_atomic),
      cmocka_unit_test(test_racing_publishes),
      cmocka_unit_test(test_hidden_is_nobody_elses),
      cmocka_unit_test(test_quota_counts_hidden),
      cmocka_unit_test(test_creator_gone_leaves_nothing),
      cmocka_unit_test(test_killed_around_publish),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
