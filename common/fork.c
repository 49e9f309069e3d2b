/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm's process-wide locks across fork() (fork.h says why). */
#include "fork.h"

#include <pthread.h>

static pthread_mutex_t locks[GSHM__LOCK_COUNT] = {
    [0 ... GSHM__LOCK_COUNT - 1] = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t handlers_once = PTHREAD_ONCE_INIT;
static unsigned fork_gen;
/* This thread's locks, by bit: those it holds, and those its fork's
 * prepare handler took (released after the fork in both processes: the
 * child's one thread is the forking thread's copy). */
static __thread unsigned held, taken_for_fork;

static void fork_prepare(void) {
  taken_for_fork = 0;
  if (held)
    return; /* a fork from under one of them: take none (fork.h) */
  for (int i = 0; i < GSHM__LOCK_COUNT; i++) {
    pthread_mutex_lock(&locks[i]);
    taken_for_fork |= 1u << i;
  }
}

static void fork_release(void) {
  for (int i = GSHM__LOCK_COUNT - 1; i >= 0; i--)
    if (taken_for_fork >> i & 1)
      pthread_mutex_unlock(&locks[i]);
  taken_for_fork = 0;
}

static void fork_child(void) {
  __atomic_add_fetch(&fork_gen, 1, __ATOMIC_RELAXED);
  fork_release();
}

static void handlers_register(void) {
  (void)pthread_atfork(fork_prepare, fork_release, fork_child);
}

void gshm__fork_lock(enum gshm__fork_lock_id id) {
  pthread_once(&handlers_once, handlers_register);
  pthread_mutex_lock(&locks[id]);
  held |= 1u << id;
}

void gshm__fork_unlock(enum gshm__fork_lock_id id) {
  held &= ~(1u << id);
  pthread_mutex_unlock(&locks[id]);
}

unsigned gshm__fork_gen(void) {
  pthread_once(&handlers_once, handlers_register);
  return __atomic_load_n(&fork_gen, __ATOMIC_RELAXED);
}
