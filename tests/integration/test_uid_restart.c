/* SPDX-License-Identifier: Apache-2.0 */
/* gshm_client_uid across a gshmd restart that another thread's request
 * meets between the client list and the session read.  gshm_client_uid
 * lists the clients (under the client's lock), lets the lock go, then
 * reads its session (under the lock again) and looks for it in the list:
 * a reconnect in between gives the connection a new session, which the
 * list, from the old gshmd, does not show.  Before the fix that returned
 * -ENOENT to a caller that had done nothing wrong.
 *
 * The window is made certain, not hoped for: this program defines
 * pthread_mutex_lock, which libgshm's calls reach before libc's (the
 * executable comes first in the lookup).  Armed for the calling thread,
 * it lets that thread's first lock of a mutex (the list's, of the
 * client's lock) through, and on its next lock of the same mutex (the
 * session read's) first restarts gshmd (SIGKILL, restored from the fd
 * store) and has a second thread make a request on the same client,
 * which reconnects; then it takes the lock. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"

typedef int (*lock_fn)(pthread_mutex_t *);

static lock_fn real_lock;
static struct {
  struct harness *h;
  gshm_client_t *c;
  pthread_t victim;
  atomic_bool armed;
  pthread_mutex_t *first; /* the victim's first lock after arming */
  bool fired;
  int restarted, status; /* harness_restart's and the other thread's results */
} race;

/* libgshm's (and everyone's) pthread_mutex_lock in this program: exported
 * (the build hides symbols by default), so libgshm's calls bind to it. */
__attribute__((visibility("default"))) int pthread_mutex_lock(pthread_mutex_t *m);

static void *other_thread(void *arg) {
  gshm_status_info_t st;

  (void)arg;
  race.status = gshm_status(race.c, &st); /* meets the dead connection: reconnects */
  return NULL;
}

int pthread_mutex_lock(pthread_mutex_t *m) {
  if (!real_lock) /* (a constructor's lock, before main) */
    real_lock = (lock_fn)dlsym(RTLD_NEXT, "pthread_mutex_lock");
  if (atomic_load(&race.armed) && pthread_equal(pthread_self(), race.victim)) {
    if (!race.first) {
      race.first = m;
    } else if (m == race.first) {
      pthread_t t;
      atomic_store(&race.armed, false);
      race.fired = true;
      race.restarted = harness_restart(race.h, SIGKILL, NULL);
      race.status = -EINPROGRESS;
      if (pthread_create(&t, NULL, other_thread, NULL) == 0)
        pthread_join(t, NULL);
    }
  }
  return real_lock(m);
}

static void test_uid_across_a_restart_between_list_and_session(void **state) {
  struct harness *h = *state; /* (stopped by the teardown, whatever fails) */
  gshm_client_t *c;
  uint32_t uid = 0;
  int e;

  assert_int_equal(gshm_connect(h->socket_path, "uid-reader", &c), 0);
  race.h = h;
  race.c = c;
  race.victim = pthread_self();
  race.first = NULL;
  race.fired = false;
  atomic_store(&race.armed, true);
  e = gshm_client_uid(c, &uid);
  atomic_store(&race.armed, false);
  assert_true(race.fired); /* the restart came in the window */
  assert_int_equal(race.restarted, 0);
  assert_int_equal(race.status, 0); /* the other thread reconnected */
  assert_int_equal(e, 0);           /* was -ENOENT */
  assert_int_equal(uid, (uint32_t)geteuid());
  gshm_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_uid_across_a_restart_between_list_and_session,
                                      harness_cmocka_setup, harness_cmocka_teardown),
  };

  if (!real_lock)
    real_lock = (lock_fn)dlsym(RTLD_NEXT, "pthread_mutex_lock");
  if (!real_lock) {
    fprintf(stderr, "no pthread_mutex_lock after this program's\n");
    return 1;
  }
  return cmocka_run_group_tests(tests, NULL, NULL);
}
