/* SPDX-License-Identifier: Apache-2.0 */
/* A lease is the same lease after a gshmd restart (SIGKILL, then the fd
 * store): same access, counted, its bytes intact, whatever chmod, chown or
 * unlink happened meanwhile; a revoked one fails its holder's next call; a
 * lease token proves one grant to one uid and nothing else.  Clients run as
 * other uids in forked children (setresuid, as test_users does), so this
 * needs root; skipped otherwise. */
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"

#define UID_OWNER 65534 /* nobody, as in the report */
#define UID_A 60011
#define UID_B 60012
#define SIZE (1u << 20)

/* In a child: a failed check exits 1 with the line (no cmocka there). */
#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d (uid %u): check failed: %s (%s)\n", __FILE__, __LINE__,     \
              (unsigned)getuid(), #cond, gshm_last_error(NULL));                         \
      _exit(1);                                                                          \
    }                                                                                    \
  } while (0)


static const char *const daemon_args[] = {"--set", "daemon.socket_mode=0666", NULL};

static int setup(void **state) {
  if (geteuid() != 0)
    return 0; /* the tests skip */
  return harness_cmocka_start(state, sizeof(struct harness), daemon_args) ? 0 : -1;
}

static int teardown(void **state) { return *state ? harness_cmocka_teardown(state) : 0; }

static void need_root(void) {
  if (geteuid() != 0)
    skip();
}

/* How many of the bytes at p equal b. */
static size_t count_byte(const uint8_t *p, size_t n, uint8_t b) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += p[i] == b;
  return k;
}

/* How many leases gshmd counts on segment id (asked as root). */
static size_t leases_on(struct harness *h, uint64_t id) {
  gshm_client_t *c;
  gshm_lease_info_t *v;
  size_t n, k = 0;

  assert_int_equal(gshm_connect(h->socket_path, "root", &c), 0);
  assert_int_equal(gshm_list_leases(c, &v, &n), 0);
  for (size_t i = 0; i < n; i++)
    k += v[i].segment_id == id;
  gshm_free(v);
  gshm_disconnect(c);
  return k;
}

/* ---- 1: an owner's read-write create lease on a 0444 segment ---- */

static void owner_0444(struct harness_kid *k, void *arg) {
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;
  uint8_t *p;
  uint64_t *id = arg;

  CHECK(gshm_connect(NULL, "owner", &c) == 0);
  CHECK(gshm_create(c, "ro/own", SIZE, NULL, 0444, 0, &s) == 0);
  CHECK(gshm_map(s, NULL, 0, (void **)&p) == 0);
  memset(p, 0xab, SIZE);
  *id = gshm_segment_info(s)->id;
  CHECK(write(k->out, id, sizeof(*id)) == sizeof(*id));
  CHECK(harness_kid_await(k->in, 60000)); /* gshmd was SIGKILLed and restarted */
  CHECK(gshm_stat(s, &info) == 0); /* reconnects, re-takes */
  CHECK(info.leases == 1);
  CHECK(gshm_write(s, 0, "\xab", 1) == 0); /* still read-write */
  CHECK(gshm_unlink(c, "ro/own") == 0);
  CHECK(count_byte(p, SIZE, 0xab) == SIZE);
  CHECK(gshm_stat(s, &info) == 0 && info.unlinked && info.leases == 1);
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* counted by gshmd after the unlink */
  CHECK(count_byte(p, SIZE, 0xab) == SIZE);
  gshm_close(s);
  gshm_disconnect(c);
}

/* The report's reproduction: uid 65534 creates a 1 MiB 0444 segment, fills
 * it, gshmd restarts, the owner stats and unlinks: its mapping keeps all
 * 1,048,576 bytes and gshmd counts its lease. */
static void test_owner_keeps_rw_lease_on_0444(void **state) {
  struct harness *h = *state;
  struct harness_kid k;
  uint64_t id;

  need_root();
  assert_int_equal(harness_kid_start(&k, UID_OWNER, UID_OWNER, owner_0444, &id), 0);
  assert_int_equal(read(k.from_kid, &id, sizeof(id)), (ssize_t)sizeof(id));
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  harness_kid_step(k.to_kid);
  assert_true(harness_kid_await(k.from_kid, 60000));
  assert_int_equal(leases_on(h, id), 1);
  harness_kid_step(k.to_kid);
  assert_int_equal(harness_kid_wait(&k), 0);
}

/* ---- 2: a reader whose access a chmod removed; the unlink lands before
 * it reconnects ---- */

static void fill_and_close(struct harness_kid *k, void *arg) {
  const char *name = arg;
  gshm_client_t *c;
  gshm_segment_t *s;
  uint8_t *buf = malloc(SIZE);

  CHECK(buf && gshm_connect(NULL, "writer", &c) == 0);
  CHECK(gshm_create(c, name, SIZE, NULL, 0644, 0, &s) == 0);
  harness_random(buf, SIZE, 26);
  CHECK(gshm_write(s, 0, buf, SIZE) == 0);
  CHECK(gshm_close(s) == 0); /* the segment stays; only the reader leases it */
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000));
  CHECK(gshm_chmod(c, name, 0600) == 0); /* the reader may not open it any more */
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* gshmd restarted */
  CHECK(gshm_unlink(c, name) == 0); /* before the reader has reconnected */
  harness_kid_step(k->out);
  gshm_disconnect(c);
  free(buf);
}

static void reader(struct harness_kid *k, void *arg) {
  const char *name = arg;
  gshm_client_t *c;
  gshm_segment_t *s;
  uint8_t *p, *want = malloc(SIZE), b;

  CHECK(want && gshm_connect(NULL, "reader", &c) == 0);
  harness_random(want, SIZE, 26);
  CHECK(gshm_open(c, name, GSHM_ACCESS_READ, &s) == 0);
  CHECK(gshm_map(s, NULL, 0, (void **)&p) == 0);
  CHECK(memcmp(p, want, SIZE) == 0);
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* chmod 0600, restart and unlink happened */
  CHECK(memcmp(p, want, SIZE) == 0);
  CHECK(gshm_read(s, SIZE - 1, &b, 1) == 0 && b == want[SIZE - 1]); /* re-takes */
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* counted */
  CHECK(memcmp(p, want, SIZE) == 0);
  gshm_close(s);
  gshm_disconnect(c);
  free(want);
}

static void test_reader_keeps_lease_after_chmod_and_unlink(void **state) {
  struct harness *h = *state;
  struct harness_kid w, r;
  gshm_client_t *root;
  gshm_segment_info_t info;
  uint64_t id;

  need_root();
  assert_int_equal(harness_kid_start(&w, UID_A, UID_A, fill_and_close, "chm/x"), 0);
  assert_true(harness_kid_await(w.from_kid, 60000));
  assert_int_equal(harness_kid_start(&r, UID_B, UID_B, reader, "chm/x"), 0);
  assert_true(harness_kid_await(r.from_kid, 60000)); /* mapped and checked */
  assert_int_equal(gshm_connect(h->socket_path, "root", &root), 0);
  assert_int_equal(gshm_stat_name(root, "chm/x", &info), 0);
  id = info.id;
  gshm_disconnect(root);
  harness_kid_step(w.to_kid);
  assert_true(harness_kid_await(w.from_kid, 60000)); /* chmod 0600 */
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  harness_kid_step(w.to_kid);
  assert_true(harness_kid_await(w.from_kid, 60000)); /* unlinked */
  assert_int_equal(harness_kid_wait(&w), 0);
  harness_kid_step(r.to_kid);
  assert_true(harness_kid_await(r.from_kid, 60000));
  assert_int_equal(leases_on(h, id), 1);
  harness_kid_step(r.to_kid);
  assert_int_equal(harness_kid_wait(&r), 0);
}

/* ---- 3: given away (chown) and unlinked by root while gshmd was down ---- */

static void chowned_holder(struct harness_kid *k, void *arg) {
  const char *name = arg;
  gshm_client_t *c;
  gshm_segment_t *s;
  uint8_t *p, b = 0;

  CHECK(gshm_connect(NULL, "chowned", &c) == 0);
  CHECK(gshm_create(c, name, SIZE, NULL, 0600, 0, &s) == 0);
  CHECK(gshm_map(s, NULL, 0, (void **)&p) == 0);
  memset(p, 0x3c, SIZE);
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* chown to B, restart, unlink */
  CHECK(gshm_read(s, 1, &b, 1) == 0 && b == 0x3c); /* re-takes: no longer ours, 0600 */
  CHECK(gshm_write(s, 0, "\x3c", 1) == 0);          /* and still read-write */
  CHECK(count_byte(p, SIZE, 0x3c) == SIZE);
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* counted */
  CHECK(count_byte(p, SIZE, 0x3c) == SIZE);
  gshm_close(s);
  gshm_disconnect(c);
}

static void test_holder_keeps_lease_after_chown(void **state) {
  struct harness *h = *state;
  struct harness_kid k;
  gshm_client_t *root;
  gshm_segment_info_t info;

  need_root();
  assert_int_equal(harness_kid_start(&k, UID_A, UID_A, chowned_holder, "cho/x"), 0);
  assert_true(harness_kid_await(k.from_kid, 60000));
  assert_int_equal(gshm_connect(h->socket_path, "root", &root), 0);
  assert_int_equal(gshm_chown(root, "cho/x", UID_B, UID_B), 0);
  assert_int_equal(gshm_stat_name(root, "cho/x", &info), 0);
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  assert_int_equal(gshm_unlink(root, "cho/x"), 0); /* root reconnects first */
  gshm_disconnect(root);
  harness_kid_step(k.to_kid);
  assert_true(harness_kid_await(k.from_kid, 60000));
  assert_int_equal(leases_on(h, info.id), 1);
  harness_kid_step(k.to_kid);
  assert_int_equal(harness_kid_wait(&k), 0);
}

/* ---- 4: revoked while gshmd was down ---- */

static void revoked_reader(struct harness_kid *k, void *arg) {
  const char *name = arg;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;
  void *p;
  uint8_t b;

  CHECK(gshm_connect(NULL, "revoked", &c) == 0);
  CHECK(gshm_open(c, name, GSHM_ACCESS_READ, &s) == 0);
  CHECK(gshm_map(s, NULL, 0, &p) == 0);
  harness_kid_step(k->out);
  CHECK(harness_kid_await(k->in, 60000)); /* restarted, then revoked before we reconnect */
  CHECK(gshm_read(s, 0, &b, 1) == -ESTALE);
  CHECK(gshm_map(s, NULL, 0, &p) == -ESTALE);
  CHECK(gshm_stat(s, &info) == -ESTALE);
  gshm_close(s);
  gshm_disconnect(c);
}

static void test_revoked_while_down_fails_next_call(void **state) {
  struct harness *h = *state;
  struct harness_kid r;
  gshm_client_t *root;
  gshm_segment_t *s;

  need_root();
  assert_int_equal(gshm_connect(h->socket_path, "root", &root), 0);
  assert_int_equal(gshm_create(root, "rv/x", 4096, NULL, 0644, 0, &s), 0);
  assert_int_equal(gshm_close(s), 0);
  assert_int_equal(harness_kid_start(&r, UID_B, UID_B, revoked_reader, "rv/x"), 0);
  assert_true(harness_kid_await(r.from_kid, 60000));
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  assert_int_equal(gshm_revoke(root, "rv/x"), 0); /* root reconnects first */
  harness_kid_step(r.to_kid);
  assert_int_equal(harness_kid_wait(&r), 0);
  gshm_disconnect(root);
}

/* ---- 5: what a token proves (the raw protocol) ---- */

static int raw_connect(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct timeval tv = {.tv_sec = 10};
  Gshm__Hello m = GSHM__HELLO__INIT;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  CHECK(fd >= 0);
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", getenv("GSHM_SOCKET"));
  CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  m.major = GSHM_PROTO_MAJOR;
  m.client_name = "raw";
  CHECK(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &m.base, -1) == 0);
  return fd;
}

/* The next reply (events skipped); its fd, if any, closed. */
static Gshm__Reply *raw_reply(int fd) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  struct gshm_wire_header h;
  int fds[4], nfds = 0;
  ssize_t n;

  do {
    n = gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    CHECK(n > 0 && gshm__wire_parse_header(buf, (size_t)n, &h) == 0);
  } while (h.type == GSHM_WIRE_EVENT);
  return gshm__reply__unpack(NULL, h.length, buf + GSHM_WIRE_HEADER_SIZE);
}

struct grant {
  uint64_t id, generation;
  uint8_t token[32];
};

/* A re-take of g with access and token (len bytes): the reply's status. */
static int raw_retake(int fd, const struct grant *g, int access, const uint8_t *token,
                      size_t len) {
  Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
  Gshm__Reply *r;
  int st;

  m.name = "";
  m.segment_id = g->id;
  m.generation = g->generation;
  m.access = access;
  m.lease_token.data = (uint8_t *)token;
  m.lease_token.len = len;
  CHECK(gshm__wire_send(fd, GSHM_WIRE_OPEN, 7, &m.base, -1) == 0);
  CHECK((r = raw_reply(fd)));
  st = r->status;
  gshm__reply__free_unpacked(r, NULL);
  return st;
}

/* Owner A: a 0000 segment whose create lease (read-write) carries a
 * token; only that token, for that access and uid, re-takes it. */
static void token_owner(struct harness_kid *k, void *arg) {
  Gshm__CreateRequest m = GSHM__CREATE_REQUEST__INIT;
  struct grant g, other;
  Gshm__Reply *r;
  uint8_t bad[32];
  int fd = raw_connect();

  (void)arg;
  gshm__reply__free_unpacked(raw_reply(fd), NULL);
  m.name = "tok/x";
  m.size = 4096;
  m.location = "host";
  m.mode = 0; /* 0 is the default 0600: chmod below */
  CHECK(gshm__wire_send(fd, GSHM_WIRE_CREATE, 2, &m.base, -1) == 0);
  CHECK((r = raw_reply(fd)) && r->status == GSHM__STATUS__STATUS_OK && r->grant);
  CHECK(r->grant->lease_token.len == sizeof(g.token));
  g.id = r->grant->segment->id;
  g.generation = r->grant->segment->generation;
  memcpy(g.token, r->grant->lease_token.data, sizeof(g.token));
  gshm__reply__free_unpacked(r, NULL);
  {
    gshm_client_t *c;
    CHECK(gshm_connect(NULL, "chmod", &c) == 0);
    CHECK(gshm_chmod(c, "tok/x", 0) == 0);
    gshm_disconnect(c);
  }
  /* The token re-takes exactly its grant, without a restart too. */
  CHECK(raw_retake(fd, &g, GSHM__ACCESS__ACCESS_READ_WRITE, g.token, 32) ==
        GSHM__STATUS__STATUS_OK);
  /* Not another access, not a changed token, not a short one, not none. */
  CHECK(raw_retake(fd, &g, GSHM__ACCESS__ACCESS_READ, g.token, 32) ==
        GSHM__STATUS__STATUS_PERMISSION_DENIED);
  memcpy(bad, g.token, 32);
  bad[31] ^= 1;
  CHECK(raw_retake(fd, &g, GSHM__ACCESS__ACCESS_READ_WRITE, bad, 32) ==
        GSHM__STATUS__STATUS_PERMISSION_DENIED);
  CHECK(raw_retake(fd, &g, GSHM__ACCESS__ACCESS_READ_WRITE, g.token, 31) ==
        GSHM__STATUS__STATUS_PERMISSION_DENIED);
  CHECK(raw_retake(fd, &g, GSHM__ACCESS__ACCESS_READ_WRITE, NULL, 0) ==
        GSHM__STATUS__STATUS_PERMISSION_DENIED);
  /* Not another generation or segment. */
  other = g;
  other.generation++;
  CHECK(raw_retake(fd, &other, GSHM__ACCESS__ACCESS_READ_WRITE, g.token, 32) ==
        GSHM__STATUS__STATUS_STALE);
  CHECK(write(k->out, &g, sizeof(g)) == sizeof(g)); /* to the other uid */
  CHECK(harness_kid_await(k->in, 60000)); /* gshmd restarted: the key came back with it */
  close(fd);
  fd = raw_connect();
  gshm__reply__free_unpacked(raw_reply(fd), NULL);
  CHECK(raw_retake(fd, &g, GSHM__ACCESS__ACCESS_READ_WRITE, g.token, 32) ==
        GSHM__STATUS__STATUS_OK);
  close(fd);
}

/* Another uid with A's token: refused, and (the 0000 segment being one
 * it may not see) as an id not in use, STALE, not PERMISSION_DENIED. */
static void token_thief(struct harness_kid *k, void *arg) {
  const struct grant *g = arg;
  int fd = raw_connect();

  (void)k;
  gshm__reply__free_unpacked(raw_reply(fd), NULL);
  CHECK(raw_retake(fd, g, GSHM__ACCESS__ACCESS_READ_WRITE, g->token, 32) ==
        GSHM__STATUS__STATUS_STALE);
  CHECK(raw_retake(fd, g, GSHM__ACCESS__ACCESS_READ, g->token, 32) ==
        GSHM__STATUS__STATUS_STALE);
  close(fd);
}

static void test_token_proves_one_grant_to_one_uid(void **state) {
  struct harness *h = *state;
  struct harness_kid a, b;
  struct grant g;

  need_root();
  assert_int_equal(harness_kid_start(&a, UID_A, UID_A, token_owner, NULL), 0);
  assert_int_equal(read(a.from_kid, &g, sizeof(g)), (ssize_t)sizeof(g));
  assert_int_equal(harness_kid_start(&b, UID_B, UID_B, token_thief, &g), 0);
  assert_int_equal(harness_kid_wait(&b), 0);
  /* ...and the key survives a restart: A's token still re-takes. */
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  harness_kid_step(a.to_kid);
  assert_int_equal(harness_kid_wait(&a), 0);
}

/* gshmd killed again while libgshm re-takes its leases after a restart
 * (a crash loop, or a second SIGKILL soon after the first): the call that
 * reconnected must wait for the next gshmd (within GSHM_RECONNECT_MS) and
 * re-take there.  It failed -ECONNRESET: the re-take swallowed the broken
 * connection, reconnect said it was back, and the call's one resend went
 * to the dead socket; a create whose first attempt the killed gshmd had
 * made was then reported failed while its segment stayed, unleased. */
#define MANY 3000

struct call {
  gshm_client_t *c;
  gshm_segment_t *s;
  int err;
};

static void *create_after(void *arg) {
  struct call *k = arg;
  k->err = gshm_create(k->c, "after-two-kills", 4096, NULL, 0600, 0, &k->s);
  return NULL;
}

static void test_killed_again_during_retake(void **state) {
  struct harness *h = *state;
  gshm_segment_t **segs = calloc(MANY, sizeof(*segs));
  struct call k = {0};
  gshm_status_info_t st = {0};
  gshm_client_t *w;
  pthread_t t;
  char name[32];

  need_root();
  assert_non_null(segs);
  assert_int_equal(gshm_connect(h->socket_path, "many", &k.c), 0);
  for (int i = 0; i < MANY; i++) {
    snprintf(name, sizeof(name), "many/%d", i);
    assert_int_equal(gshm_create(k.c, name, 4096, NULL, 0600, 0, &segs[i]), 0);
  }
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  assert_int_equal(gshm_connect(h->socket_path, "watch", &w), 0);
  assert_int_equal(pthread_create(&t, NULL, create_after, &k), 0);
  /* the first re-takes are in: kill this gshmd too */
  for (int i = 0; i < 100000 && st.leases == 0; i++)
    assert_int_equal(gshm_status(w, &st), 0);
  print_message("    killed with %u of %d leases re-taken\n", st.leases, MANY);
  assert_true(st.leases > 0 && st.leases < MANY);
  assert_int_equal(harness_restart(h, SIGKILL, daemon_args), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  gshm_disconnect(w);
  assert_int_equal(k.err, 0);
  /* every lease came back in the third gshmd, with the create's */
  assert_int_equal(gshm_connect(h->socket_path, "watch", &w), 0);
  assert_int_equal(gshm_status(w, &st), 0);
  assert_int_equal(st.leases, MANY + 1);
  gshm_disconnect(w);
  gshm_close(k.s);
  for (int i = 0; i < MANY; i++)
    gshm_close(segs[i]);
  free(segs);
  gshm_disconnect(k.c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_owner_keeps_rw_lease_on_0444, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reader_keeps_lease_after_chmod_and_unlink, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_holder_keeps_lease_after_chown, setup, teardown),
      cmocka_unit_test_setup_teardown(test_revoked_while_down_fails_next_call, setup, teardown),
      cmocka_unit_test_setup_teardown(test_token_proves_one_grant_to_one_uid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_killed_again_during_retake, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
