/* SPDX-License-Identifier: Apache-2.0 */
/* Kill points (issue 5, "Done when" 3): a client SIGKILLed at any step of
 * connect / create / map / write / open / close / unlink leaves no lease,
 * no fd and no memory behind in gshmd.
 *
 * A forked child runs the sequence and raises SIGKILL right after step k,
 * for every k; then a child runs the sequence in a loop and the parent
 * kills it at random moments, 200 times, so that some kills land while a
 * request is in flight; then raw clients send a create or an open and die
 * before the reply arrives.  After each kill a watcher client checks that
 * gshmd is back to its baseline: only the watcher connected, no lease, no
 * segment but the named ones the dead client created and had not
 * unlinked (named segments outlive their creator by design, like POSIX
 * shm; the watcher unlinks them and they must then free at once), zero
 * bytes allocated, and gshmd's fd count as before.
 *
 * Host segments here; device segments are covered by the GPU suite. */
#include <errno.h>
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"

#define SEG_BYTES (1u << 20)

struct fx {
  struct harness h;
  gshm_client_t *watcher;
  int baseline_fds;
};

static int setup(void **state) {
  struct fx *f = harness_cmocka_start(state, sizeof(*f), NULL);

  if (!f || gshm_connect(f->h.socket_path, "watcher", &f->watcher))
    return -1;
  f->baseline_fds = harness_stable_fd_count(f->h.sp.pid) - harness_store_bucket_fds(&f->h);
  return 0;
}

static int teardown(void **state) {
  struct fx *f = *state;

  gshm_disconnect(f->watcher);
  return harness_cmocka_teardown(state);
}

/* The steps of one client's life.  Each returns 0 or fails the child
 * (exit 3), which the parent reports. */
enum step {
  STEP_CONNECT,
  STEP_CREATE,
  STEP_MAP,
  STEP_WRITE,
  STEP_PUBLISH,     /* hidden sequence only: the segment takes its name */
  STEP_OPEN,        /* a second lease on the same segment */
  STEP_MAP2,
  STEP_CLOSE2,
  STEP_UNLINK,      /* name gone, memory kept for the first lease */
  STEP_UNMAP,
  STEP_CLOSE,
  STEP_DISCONNECT,
  STEP_COUNT
};

static const char *const step_names[STEP_COUNT] = {
    "connect", "create", "map", "write", "publish", "open", "map2", "close2", "unlink", "unmap", "close",
    "disconnect"};

/* Runs the steps, raising SIGKILL right after step kill_after (-1: never);
 * hidden: the create is GSHM_CREATE_HIDDEN and STEP_PUBLISH names it.
 * Child side: never returns. */
static void child_sequence(const char *socket_path, const char *name, int kill_after, bool loop,
                           bool hidden) {
  static unsigned char buf[SEG_BYTES];
  unsigned iter = 0;

  memset(buf, 0x5a, sizeof(buf));
  do {
    gshm_client_t *c = NULL;
    gshm_segment_t *s1 = NULL, *s2 = NULL;
    void *addr = NULL;
    char nm[128];

    snprintf(nm, sizeof(nm), "%s-%u", name, iter++);
    for (int k = 0; k < STEP_COUNT; k++) {
      int e = 0;
      switch (k) {
      case STEP_CONNECT: e = gshm_connect(socket_path, "victim", &c); break;
      case STEP_CREATE:
        e = gshm_create(c, nm, SEG_BYTES, "host", 0600, hidden ? GSHM_CREATE_HIDDEN : 0, &s1);
        break;
      case STEP_MAP: e = gshm_map(s1, NULL, 0, &addr); break;
      case STEP_WRITE: e = gshm_write(s1, 0, buf, sizeof(buf)); break;
      case STEP_PUBLISH: e = hidden ? gshm_publish(s1, 0) : 0; break;
      case STEP_OPEN: e = gshm_open(c, nm, GSHM_ACCESS_READ, &s2); break;
      case STEP_MAP2: e = gshm_map(s2, NULL, 0, &addr); break;
      case STEP_CLOSE2: e = gshm_close(s2); break;
      case STEP_UNLINK: e = gshm_unlink(c, nm); break;
      case STEP_UNMAP: e = gshm_unmap(s1); break;
      case STEP_CLOSE: e = gshm_close(s1); break;
      case STEP_DISCONNECT: gshm_disconnect(c); break;
      }
      if (e) {
        fprintf(stderr, "child: step %s failed: %s\n", step_names[k], gshm_strerror(e));
        _exit(3);
      }
      if (k == kill_after)
        raise(SIGKILL);
    }
  } while (loop);
  _exit(0);
}

/* The watcher lost gshmd: say whether gshmd is still alive, and if not,
 * how it ended (it is this process's child). */
static void report_gshmd_state(struct fx *f, const char *what, int e) {
  int status = 0;
  pid_t r = waitpid(f->h.sp.pid, &status, WNOHANG);

  print_message("after %s: the watcher's status request failed: %s\n", what, gshm_strerror(e));
  if (r == f->h.sp.pid) {
    f->h.sp.pid = 0;
    if (WIFSIGNALED(status))
      print_message("gshmd died of signal %d (%s)\n", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
      print_message("gshmd exited with status %d\n", WEXITSTATUS(status));
  } else {
    print_message("gshmd (pid %d) is still running\n", (int)f->h.sp.pid);
  }
}

/* Waits until gshmd is back to the baseline; named segments the dead
 * client left are unlinked (and must then be freed).  Returns how many
 * named segments were left. */
static int expect_baseline(struct fx *f, const char *what) {
  gshm_status_info_t st = {0};
  int fds = -1, left = 0;

  /* gshmd notices the death (EOF) on its next loop turn. */
  for (int i = 0; i < 300; i++) {
    int e = gshm_status(f->watcher, &st);
    if (e)
      report_gshmd_state(f, what, e);
    assert_int_equal(e, 0);
    if (st.clients == 1 && st.leases == 0)
      break;
    usleep(10000);
  }
  if (st.clients != 1 || st.leases != 0)
    print_message("after %s: %u clients, %u leases\n", what, st.clients, st.leases);
  assert_int_equal(st.clients, 1);
  assert_int_equal(st.leases, 0);
  /* Only named, live segments may remain: unlink them. */
  if (st.segments) {
    gshm_segment_info_t *infos = NULL;
    size_t n = 0;
    assert_int_equal(gshm_list(f->watcher, &infos, &n), 0);
    for (size_t i = 0; i < n; i++) {
      if (infos[i].unlinked || infos[i].leases)
        print_message("after %s: segment '%s' unlinked=%d leases=%u left behind\n", what,
                      infos[i].name, infos[i].unlinked, infos[i].leases);
      assert_false(infos[i].unlinked);
      assert_int_equal(infos[i].leases, 0);
      assert_int_equal(gshm_unlink(f->watcher, infos[i].name), 0);
      left++;
    }
    gshm_free(infos);
  }
  assert_int_equal(gshm_status(f->watcher, &st), 0);
  assert_int_equal(st.segments, 0);
  assert_int_equal(st.bytes, 0);
  /* Its own fds, less the fd store's bucket ends it holds: an emptied
   * bucket stays stored for a second or two (gshmd__bucket_drop_idle), and
   * waiting for it at every step took the test past its 300 s. */
  for (int i = 0; i < 300; i++) {
    fds = harness_fd_count(f->h.sp.pid) - harness_store_bucket_fds(&f->h);
    if (fds == f->baseline_fds)
      break;
    usleep(10000);
  }
  if (fds != f->baseline_fds)
    print_message("after %s: gshmd has %d fds, baseline %d\n", what, fds, f->baseline_fds);
  assert_int_equal(fds, f->baseline_fds);
  /* Nor in the fd store: a memory fd left in a bucket's datagram would
   * keep the memory alive in systemd after gshmd freed it. */
  {
    int parked = -1;
    for (int i = 0; i < 300 && parked; i++) {
      gshm__spawn_poll(&f->h.sp, 10);
      parked = gshm__spawn_store_memory_fds(&f->h.sp);
    }
    if (parked)
      print_message("after %s: %d segment fds still parked in the fd store\n", what, parked);
    assert_int_equal(parked, 0);
  }
  return left;
}

static void reap_killed(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
    print_message("child exited with status 0x%x, not killed\n", status);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

/* Killed right after each step in turn; then the same with a hidden
 * create, which leaves nothing before its publish. */
static void test_kill_after_each_step(void **state) {
  struct fx *f = *state;

  for (int hidden = 0; hidden < 2; hidden++)
    for (int k = 0; k < STEP_COUNT; k++) {
      char what[64];
      pid_t pid;
      int left;

      if (k == STEP_PUBLISH && !hidden)
        continue; /* (no step there) */
      snprintf(what, sizeof(what), "kill after %s%s", step_names[k], hidden ? " (hidden)" : "");
      pid = fork();
      assert_true(pid >= 0);
      if (pid == 0)
        child_sequence(f->h.socket_path, "kp-step", k, false, hidden);
      reap_killed(pid);
      left = expect_baseline(f, what);
      /* The name outlives its creator exactly between its create (a
       * hidden one's publish) and its unlink. */
      assert_int_equal(left, k >= (hidden ? STEP_PUBLISH : STEP_CREATE) && k < STEP_UNLINK);
      print_message("    %-37s ok (%d named segment left, unlinked by the watcher)\n", what, left);
    }
}

/* A child loops through the whole sequence; the parent kills it at a
 * random moment, 200 times.  Many kills land inside a request. */
static void test_kill_at_random_moments(void **state) {
  struct fx *f = *state;
  unsigned long long seed = 0xc0ffee;
  int named_left = 0;
  struct timespec t0, t1;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 200; i++) {
    uint32_t r;
    pid_t pid;
    char name[32];

    harness_random(&r, sizeof(r), seed += 0x9e3779b97f4a7c15ull);
    snprintf(name, sizeof(name), "kp-loop-%d", i);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
      child_sequence(f->h.socket_path, name, -1, true, i % 2); /* (every other: hidden) */
    usleep(r % 20000); /* 0-20 ms: a few iterations at most */
    kill(pid, SIGKILL);
    reap_killed(pid);
    /* Check every time (cheap) so that a leak is tied to its kill. */
    named_left += expect_baseline(f, "random kill");
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  print_message("    200 random kills: %d named segments left over (unlinked by the watcher); "
                "%.1f s\n",
                named_left, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
}

static int raw_connect_hello(struct fx *f) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Gshm__Hello m = GSHM__HELLO__INIT;
  uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), fds[8], nfds = 0;

  strcpy(sa.sun_path, f->h.socket_path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    _exit(4);
  m.major = GSHM_PROTO_MAJOR;
  m.client_name = "raw-victim";
  if (gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &m.base, -1) ||
      gshm__wire_recv(fd, buf, sizeof(buf), fds, 8, &nfds, 0) <= 0)
    _exit(5);
  return fd;
}

/* Requests in flight when the client dies: gshmd reads the request after
 * the peer is gone, grants a lease and sends an fd into a dead socket. */
static void test_kill_with_request_in_flight(void **state) {
  struct fx *f = *state;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  Gshm__OpenRequest op = GSHM__OPEN_REQUEST__INIT;
  gshm_segment_t *shared;

  /* A segment of the watcher's for the raw clients to open. */
  assert_int_equal(gshm_create(f->watcher, "kp-shared", SEG_BYTES, NULL, 0600, 0, &shared), 0);
  cr.size = SEG_BYTES;
  cr.location = "host";
  op.name = "kp-shared";
  op.access = GSHM__ACCESS__ACCESS_READ_WRITE;
  for (int i = 0; i < 100; i++) {
    char name[32];
    pid_t pid;

    snprintf(name, sizeof(name), "kp-flight-%d", i);
    cr.name = name;
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      int fd = raw_connect_hello(f);
      /* Several requests back to back, none of their replies read. */
      if (gshm__wire_send(fd, GSHM_WIRE_CREATE, 2, &cr.base, -1) ||
          gshm__wire_send(fd, GSHM_WIRE_OPEN, 3, &op.base, -1) ||
          gshm__wire_send(fd, GSHM_WIRE_OPEN, 4, &op.base, -1))
        _exit(6);
      if (i % 2)
        usleep((useconds_t)(i * 37 % 1000)); /* sometimes after gshmd answered */
      raise(SIGKILL);
    }
    reap_killed(pid);
    /* The watcher's own segment and lease stay; only the dead client's
     * leases go. */
    {
      gshm_status_info_t st = {0};
      gshm_segment_info_t info;
      for (int k = 0; k < 300; k++) {
        assert_int_equal(gshm_status(f->watcher, &st), 0);
        if (st.clients == 1 && st.leases == 1)
          break;
        usleep(10000);
      }
      assert_int_equal(st.clients, 1);
      assert_int_equal(st.leases, 1);
      assert_int_equal(gshm_stat(shared, &info), 0);
      assert_int_equal(info.leases, 1);
      if (gshm_stat_name(f->watcher, name, &info) == 0) {
        assert_int_equal(info.leases, 0);
        assert_int_equal(gshm_unlink(f->watcher, name), 0);
      }
    }
  }
  assert_int_equal(gshm_close(shared), 0);
  assert_int_equal(gshm_unlink(f->watcher, "kp-shared"), 0);
  expect_baseline(f, "requests in flight");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_kill_after_each_step, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill_at_random_moments, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill_with_request_in_flight, setup, teardown),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
