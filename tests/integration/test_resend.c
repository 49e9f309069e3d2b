/* SPDX-License-Identifier: Apache-2.0 */
/* Requests whose reply a gshmd restart lost.  A create: gshmd made the segment
 * (and stored it in the fd store) and was killed before the client read
 * its reply: libgshm, reconnecting, sends the create again.  Before
 * create tokens that resend met the segment the first one made and
 * failed -EEXIST, so the creator had no lease of its own segment.  Now
 * the resend carries the first one's token and gets a read-write lease
 * of that segment.
 *
 * An unlink: the first one removed the name, the resend met -ENOENT for a
 * name that its caller had just seen; libgshm now returns 0 for it.
 *
 * A revoke: the first one revoked the segment, the resend met -ENOENT
 * (by name) or -ESTALE (by id); worse, a segment that took the name
 * between the restart and the resend was revoked by it.  Now the revoke
 * carries a token that gshmd notes in the fd store's journal with the
 * segment it revokes: the resend says 0 and touches nothing else.
 *
 * A publish of a hidden create: the first one published the segment, the
 * resend met no lease (the first one's ended with its gshmd) and said
 * -ESTALE, as if the hidden segment were lost.  Now it carries a token
 * that gshmd notes with the published segment's id: the resend gets that
 * segment and a new lease on it, and publishes nothing again.
 *
 * Real gshmd and real libgshm; between them a proxy thread (proxy.h) that
 * passes every packet (and its fd) through, except the reply to the first
 * request of one type (create, unlink, revoke): that one it keeps,
 * SIGKILLs gshmd, has the harness restart it from the fd store (as
 * systemd would), and drops both connections.  Through a kept create reply's fd the test
 * then writes bytes that the client's lease must show: the same memory. */
#include <errno.h>
#include <poll.h>
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"
#include "proxy.h"

#define SIZE ((1u << 20) + 5)

/* Each test's gshmd and proxy, set up and taken down by cmocka: a failed
 * check skips the rest of the test, and a gshmd left running would hold
 * ctest's output pipe until its timeout (harness_set_leftover). */
struct fx {
  struct harness h; /* (first: harness_cmocka_start) */
  struct proxy p;
  bool proxied;
};

static int setup(void **state) {
  return harness_cmocka_start(state, sizeof(struct fx), NULL) ? 0 : -1;
}

/* gshmd's socket open to every user (another uid's client connects) */
static const char *const open_socket[] = {"--set", "daemon.socket_mode=0666", NULL};

static int setup_open(void **state) {
  return harness_cmocka_start(state, sizeof(struct fx), open_socket) ? 0 : -1;
}

/* gshmd stops first (its end ends the proxy's connection to it, which a
 * failed test's client may still hold), then the proxy.  -1 when gshmd
 * did not exit cleanly. */
static int teardown(void **state) {
  struct fx *f = *state;
  int status;

  if (!f)
    return 0;
  if (f->proxied)
    unlink(f->p.path); /* (before harness_stop removes its directory) */
  status = harness_stop(&f->h);
  if (f->proxied)
    proxy_stop(&f->p);
  harness_set_leftover(NULL);
  free(f);
  *state = NULL;
  return status == 0 ? 0 : -1;
}

static void test_create_reply_lost_to_a_restart(void **state) {
  struct fx *f = *state;
  struct harness *h = &f->h;
  struct proxy *p = &f->p;
  gshm_client_t *c, *other;
  gshm_segment_t *s, *s2;
  gshm_status_info_t st;
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE), *m;

  assert_non_null(want);
  assert_non_null(got);
  proxy_start(p, h, GSHM_WIRE_CREATE);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "resender", &c), 0);
  /* the first create is made, its reply kept by the proxy, gshmd killed
   * and restarted; libgshm reconnects and sends the create again */
  assert_int_equal(gshm_create(c, "lost/reply", SIZE, NULL, 0640, 0, &s), 0);
  assert_int_equal(p->restarted, 0);
  assert_true(p->kept_fd >= 0);
  /* the lease is of the first create's memory: what its fd writes shows */
  m = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, p->kept_fd, 0);
  assert_true(m != MAP_FAILED);
  harness_random(want, SIZE, 0x5e5e);
  memcpy(m, want, SIZE);
  munmap(m, SIZE);
  assert_int_equal(gshm_read(s, 0, got, SIZE), 0);
  assert_memory_equal(got, want, SIZE);
  /* one segment, and the name is still taken for any other create */
  assert_int_equal(gshm_connect(h->socket_path, "other", &other), 0);
  assert_int_equal(gshm_status(other, &st), 0);
  assert_int_equal(st.segments, 1);
  assert_int_equal(gshm_create(other, "lost/reply", SIZE, NULL, 0640, 0, &s2), -EEXIST);
  assert_int_equal(gshm_create(c, "lost/reply", SIZE, NULL, 0640, 0, &s2), -EEXIST);
  assert_int_equal(gshm_unlink(other, "lost/reply"), 0);
  gshm_close(s);
  gshm_disconnect(other);
  gshm_disconnect(c);
  close(p->kept_fd);
  free(want);
  free(got);
}

/* The create's reply is lost to a restart, and so is its resend's (two
 * kills within one request, as a crash loop or test_crash_torture's kill
 * during a restart gives): libgshm sends it once more, within
 * GSHM_RECONNECT_MS of the first loss, and gets the first create's
 * segment, one segment in all.  Before: two sends at most, the create
 * failed -ECONNRESET with its segment made. */
static void test_create_reply_lost_to_two_restarts(void **state) {
  struct fx *f = *state;
  struct proxy *p = &f->p;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_status_info_t st;
  uint64_t id;

  p->losses = 2;
  proxy_start(p, &f->h, GSHM_WIRE_CREATE);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "resender", &c), 0);
  assert_int_equal(gshm_create(c, "lost/twice", 4096, NULL, 0640, 0, &s), 0);
  assert_int_equal(p->lost, 2);
  assert_int_equal(p->restarted, 0);
  id = gshm_segment_info(s)->id;
  assert_int_equal(gshm_status(c, &st), 0);
  assert_int_equal(st.segments, 1);
  assert_int_equal(gshm_close(s), 0);
  assert_int_equal(gshm_unlink(c, "lost/twice"), 0);
  assert_true(id > 0);
  close(p->kept_fd);
  gshm_disconnect(c);
}

/* The first unlink of a segment is done and stored, its reply lost:
 * libgshm's resend meets -ENOENT and says 0; the name is gone (and an
 * unlink of a name that never was still says -ENOENT). */
static void test_unlink_reply_lost_to_a_restart(void **state) {
  struct fx *f = *state;
  struct proxy *p = &f->p;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;

  proxy_start(p, &f->h, GSHM_WIRE_UNLINK);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "unlinker", &c), 0);
  assert_int_equal(gshm_create(c, "gone/soon", 4096, NULL, 0600, 0, &s), 0);
  assert_int_equal(gshm_close(s), 0);
  assert_int_equal(gshm_unlink(c, "gone/soon"), 0);
  assert_true(p->kept);
  assert_int_equal(p->restarted, 0);
  assert_int_equal(gshm_stat_name(c, "gone/soon", &info), -ENOENT);
  assert_int_equal(gshm_unlink(c, "never/was"), -ENOENT);
  gshm_disconnect(c);
}

/* Between the restart and the resend: another client makes a segment of
 * the revoked one's name (*(bool *)p->arg: made). */
static void make_newcomer(struct proxy *p) {
  gshm_client_t *o;
  gshm_segment_t *s;

  if (gshm_connect(p->h->socket_path, "newcomer", &o))
    return;
  /* (the segment outlives its creator: only its lease ends) */
  if (!gshm_create(o, "rv/seg", 4096, NULL, 0644, 0, &s)) {
    *(bool *)p->arg = true;
    gshm_close(s);
  }
  gshm_disconnect(o);
}

/* A holder's lease of "rv/seg" (a direct connection: no proxy). */
static gshm_segment_t *held_segment(struct harness *h, gshm_client_t **holder_out) {
  gshm_segment_t *s;

  assert_int_equal(gshm_connect(h->socket_path, "holder", holder_out), 0);
  assert_int_equal(gshm_create(*holder_out, "rv/seg", 8192, NULL, 0644, 0, &s), 0);
  assert_int_equal(gshm_write(s, 0, "held", 4), 0);
  return s;
}

/* The first revoke (by name or by id) is done and stored, its reply lost:
 * libgshm's resend is answered 0, as the first was; the holder's lease
 * is gone after the restart (the first one's work); with newcomer, a
 * segment that took the name before the resend is left alone. */
static void revoke_reply_lost(void **state, bool by_id, bool newcomer) {
  struct fx *f = *state;
  struct proxy *p = &f->p;
  gshm_client_t *c, *holder;
  gshm_segment_t *s;
  gshm_segment_info_t info, now;
  bool made = false;

  p->after_restart = newcomer ? make_newcomer : NULL;
  p->arg = &made;
  proxy_start(p, &f->h, GSHM_WIRE_REVOKE);
  f->proxied = true;
  s = held_segment(&f->h, &holder);
  info = *gshm_segment_info(s);
  assert_int_equal(gshm_connect(p->path, "revoker", &c), 0);
  if (by_id)
    assert_int_equal(gshm_revoke_id(c, info.id), 0);
  else
    assert_int_equal(gshm_revoke(c, "rv/seg"), 0);
  assert_true(p->kept);
  assert_int_equal(p->restarted, 0);
  assert_int_equal(gshm_stat(s, &now), -ESTALE);
  if (newcomer) {
    assert_true(made);
    assert_int_equal(gshm_stat_name(c, "rv/seg", &now), 0);
    assert_true(now.id > info.id);
  } else {
    assert_int_equal(gshm_stat_name(c, "rv/seg", &now), -ENOENT);
  }
  /* a revoke of its own (a new token) says what it meets */
  assert_int_equal(gshm_revoke_id(c, info.id), -ESTALE);
  gshm_close(s);
  gshm_disconnect(holder);
  gshm_disconnect(c);
}

static void test_revoke_reply_lost_to_a_restart(void **state) {
  revoke_reply_lost(state, false, false);
}

static void test_revoke_id_reply_lost_to_a_restart(void **state) {
  revoke_reply_lost(state, true, false);
}

static void test_revoke_resend_spares_a_newer_segment(void **state) {
  revoke_reply_lost(state, false, true);
}

/* Between the restart and the resend: another client of the same uid
 * makes "gone/soon" again (*(uint64_t *)p->arg: its id). */
static void remake_name(struct proxy *p) {
  gshm_client_t *o;
  gshm_segment_t *s;

  if (gshm_connect(p->h->socket_path, "remaker", &o))
    return;
  if (!gshm_create(o, "gone/soon", 4096, NULL, 0600, 0, &s)) {
    *(uint64_t *)p->arg = gshm_segment_info(s)->id;
    gshm_close(s);
  }
  gshm_disconnect(o);
}

/* The first unlink is done and stored, its reply lost; after the
 * restart after_restart runs (remake_name last: *(uint64_t *)p->arg is
 * the newer segment's id), gshmd restarted with restart_args. */
static void unlink_resend_after(void **state, void (*after_restart)(struct proxy *p),
                                const char *const *restart_args) {
  struct fx *f = *state;
  struct proxy *p = &f->p;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;
  uint64_t first, newer = 0;

  p->restart_args = restart_args;
  p->after_restart = after_restart;
  p->arg = &newer;
  proxy_start(p, &f->h, GSHM_WIRE_UNLINK);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "unlinker", &c), 0);
  assert_int_equal(gshm_create(c, "gone/soon", 4096, NULL, 0600, 0, &s), 0);
  first = gshm_segment_info(s)->id;
  assert_int_equal(gshm_close(s), 0);
  assert_int_equal(gshm_unlink(c, "gone/soon"), 0);
  assert_true(p->kept);
  assert_int_equal(p->restarted, 0);
  assert_true(newer > first);
  assert_int_equal(gshm_stat_name(c, "gone/soon", &info), 0);
  assert_int_equal(info.id, newer);
  gshm_disconnect(c);
}

/* Before libgshm's resend another process of the same uid creates the
 * name again (its create acknowledged by the new gshmd).  The resend is
 * the first unlink's, not a new one: it must leave the newer segment
 * alone, as a revoke's resend does.  It unlinked it. */
static void test_unlink_resend_spares_a_newer_segment(void **state) {
  unlink_resend_after(state, remake_name, NULL);
}

#define CHURN_UID 60001
#define CHURN_UNLINKS 80 /* more than GSHMD_MEMO_ENTRIES (64) */

/* A user of another uid (CHURN_UID) unlinks CHURN_UNLINKS segments of its
 * own, each a create and an unlink (an entry each in the fd store's
 * resend memo); exits 0 when all went through. */
static void churn_as_another_user(const char *socket_path) {
  gshm_client_t *o;
  gshm_segment_t *s;
  char name[32];
  int done = 0;

  if (setgroups(0, NULL) || setresgid(CHURN_UID, CHURN_UID, CHURN_UID) ||
      setresuid(CHURN_UID, CHURN_UID, CHURN_UID))
    _exit(2);
  if (gshm_connect(socket_path, "churner", &o))
    _exit(3);
  for (int i = 0; i < CHURN_UNLINKS; i++) {
    snprintf(name, sizeof(name), "churn/%d", i);
    if (!gshm_create(o, name, 4096, NULL, 0600, 0, &s) && !gshm_close(s) &&
        !gshm_unlink(o, name))
      done++;
  }
  gshm_disconnect(o);
  _exit(done == CHURN_UNLINKS ? 0 : 1);
}

static int churn_status = -1;

/* Between the restart and the resend: another user churns the memo
 * (churn_status: its exit status), then a client of the unlinker's uid
 * makes "gone/soon" again (remake_name). */
static void churn_then_remake(struct proxy *p) {
  pid_t pid = fork();

  if (pid == 0)
    churn_as_another_user(p->h->socket_path);
  if (pid > 0 && waitpid(pid, &churn_status, 0) != pid)
    churn_status = -1;
  remake_name(p);
}

/* As test_unlink_resend_spares_a_newer_segment, and between the restart
 * and the resend another local user unlinks 80 segments of its own: the
 * memo's 64 entries were shared oldest first, so the unlinker's entry
 * was gone, its resend met the newer segment under the name and unlinked
 * it.  Now one user overwrites its own entries past its share
 * (GSHMD_MEMO_PER_UID), and the resend leaves the newer segment alone.
 * Needs root (another uid); skipped otherwise. */
static void test_unlink_resend_survives_another_users_unlinks(void **state) {
  if (geteuid() != 0)
    skip();
  unlink_resend_after(state, churn_then_remake, open_socket);
  assert_int_equal(churn_status, 0);
}

/* A publish through the proxy: c makes "pub/weights" a visible segment
 * with bytes old (old_id), then a hidden one of that name (s) with bytes
 * want, and publishes it over the old one (GSHM_PUBLISH_REPLACE) while
 * the proxy loses the reply (or with lose_request the request) to a
 * restart; e: what gshm_publish said.  got: room for SIZE bytes. */
struct pub {
  gshm_client_t *c;
  gshm_segment_t *s;
  unsigned char *old, *want, *got;
  uint64_t old_id;
  int e;
};

static void publish_lost(struct fx *f, bool lose_request, struct pub *t) {
  struct proxy *p = &f->p;
  gshm_segment_t *v;

  assert_non_null(t->old = malloc(SIZE));
  assert_non_null(t->want = malloc(SIZE));
  assert_non_null(t->got = malloc(SIZE));
  harness_random(t->old, SIZE, 0x01d);
  harness_random(t->want, SIZE, 0x2ee);
  p->lose_request = lose_request;
  proxy_start(p, &f->h, GSHM_WIRE_PUBLISH);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "publisher", &t->c), 0);
  assert_int_equal(gshm_create(t->c, "pub/weights", SIZE, NULL, 0644, 0, &v), 0);
  assert_int_equal(gshm_write(v, 0, t->old, SIZE), 0);
  t->old_id = gshm_segment_info(v)->id;
  assert_int_equal(gshm_close(v), 0);
  assert_int_equal(
      gshm_create(t->c, "pub/weights", SIZE, NULL, 0644, GSHM_CREATE_HIDDEN, &t->s), 0);
  assert_int_equal(gshm_write(t->s, 0, t->want, SIZE), 0);
  t->e = gshm_publish(t->s, GSHM_PUBLISH_REPLACE);
  assert_true(p->kept);
  assert_int_equal(p->restarted, 0);
}

static void pub_end(struct pub *t) {
  gshm_close(t->s);
  gshm_disconnect(t->c);
  free(t->old);
  free(t->want);
  free(t->got);
}

/* What a fresh client of h's gshmd finds under "pub/weights": its id
 * (*id_out), its bytes (got, SIZE) and how many segments there are. */
static void look(struct harness *h, uint64_t *id_out, unsigned char *got, uint32_t *n_out) {
  gshm_client_t *o;
  gshm_segment_t *r;
  gshm_status_info_t st;

  assert_int_equal(gshm_connect(h->socket_path, "looker", &o), 0);
  assert_int_equal(gshm_open(o, "pub/weights", GSHM_ACCESS_READ, &r), 0);
  *id_out = gshm_segment_info(r)->id;
  assert_int_equal(gshm_read(r, 0, got, SIZE), 0);
  assert_int_equal(gshm_status(o, &st), 0);
  *n_out = st.segments;
  gshm_close(r);
  gshm_disconnect(o);
}

/* The publish is done and stored, its reply lost: the resend says 0, seg
 * is the published segment, read-write, on a lease that a later restart
 * re-takes; the name holds its bytes, one segment in all, and a publish
 * again is -EINVAL (published already).  Before: the resend said -ESTALE
 * although the segment was published. */
static void test_publish_reply_lost_to_a_restart(void **state) {
  struct fx *f = *state;
  struct pub t;
  gshm_segment_info_t info;
  gshm_status_info_t st;
  uint64_t id;
  uint32_t n;

  publish_lost(f, false, &t);
  assert_int_equal(t.e, 0);
  assert_true(gshm_segment_info(t.s)->id > t.old_id);
  look(&f->h, &id, t.got, &n);
  assert_int_equal(id, gshm_segment_info(t.s)->id);
  assert_memory_equal(t.got, t.want, SIZE);
  assert_int_equal(n, 1);
  assert_int_equal(gshm_publish(t.s, GSHM_PUBLISH_REPLACE), -EINVAL);
  /* the lease is valid: its writes are the name's, and a restart
   * re-takes it (not revoked) */
  t.want[7] ^= 0xff;
  assert_int_equal(gshm_write(t.s, 7, &t.want[7], 1), 0);
  assert_int_equal(harness_restart(&f->h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_status(t.c, &st), 0); /* (reconnects and re-takes) */
  assert_int_equal(gshm_stat(t.s, &info), 0);
  assert_int_equal(info.id, id);
  look(&f->h, &id, t.got, &n);
  assert_memory_equal(t.got, t.want, SIZE);
  assert_int_equal(n, 1);
  pub_end(&t);
}

/* The restart comes before gshmd got the publish (the proxy loses the
 * request): the hidden segment is lost, the resend says -ESTALE and
 * nothing is published; the name keeps the old segment and its bytes. */
static void test_publish_lost_before_gshmd_got_it(void **state) {
  struct fx *f = *state;
  struct pub t;
  uint64_t id;
  uint32_t n;

  publish_lost(f, true, &t);
  assert_int_equal(t.e, -ESTALE);
  look(&f->h, &id, t.got, &n);
  assert_int_equal(id, t.old_id);
  assert_memory_equal(t.got, t.old, SIZE);
  assert_int_equal(n, 1);
  pub_end(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_create_reply_lost_to_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_create_reply_lost_to_two_restarts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_reply_lost_to_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_resend_spares_a_newer_segment, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_resend_survives_another_users_unlinks,
                                      setup_open, teardown),
      cmocka_unit_test_setup_teardown(test_revoke_reply_lost_to_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_revoke_id_reply_lost_to_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_revoke_resend_spares_a_newer_segment, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_reply_lost_to_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_lost_before_gshmd_got_it, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
