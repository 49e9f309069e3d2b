/* SPDX-License-Identifier: Apache-2.0 */
/* The reaper thread (host_reap.h). */
#include "host_reap.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "list.h"
#include "log.h"

struct reap {
  struct gshm_list node;
  int fds[3];
  void *map;
  uint64_t size;
  uint64_t counted; /* bytes of pending this entry still holds (punches only) */
  bool punch;
};

struct gshmd_host_reaper {
  pthread_t thread;
  uint64_t pending; /* bytes counted for queued punches and not given back yet (atomic) */
  uint64_t steps;   /* punch steps finished (atomic) */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct gshm_list queue; /* struct reap, oldest first */
  bool stop;
  uint64_t allowed; /* punch steps the reaper may start (gshmd_host_reap_hold) */
  char *hold_file;  /* GSHMD_TEST_REAP_HOLD: no step starts while it exists; NULL: none */
};

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Bytes of memory (and swap) the memfd fd holds now; 0 where unknown. */
static uint64_t held_bytes(int fd) {
  struct stat sb;
  return fstat(fd, &sb) == 0 && sb.st_blocks > 0 ? (uint64_t)sb.st_blocks * 512 : 0;
}

static void punch_now(int fd, uint64_t off, uint64_t len) {
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
    gshm_log_warn("host: punching out a freed segment's %llu bytes at %llu: %m",
                  (unsigned long long)len, (unsigned long long)off);
}

static void close_all(const int fds[3], void *map, uint64_t size) {
  if (map)
    munmap(map, size);
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0)
      close(fds[i]);
}

/* Waits before a punch step while a test holds the reaper (never once
 * stopping), and takes one of the steps allowed. */
static void hold_wait(struct gshmd_host_reaper *r) {
  pthread_mutex_lock(&r->lock);
  while (!r->stop) {
    if (r->hold_file && !access(r->hold_file, F_OK)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 2000000; /* (a test's hold: looked at every 2 ms) */
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&r->cond, &r->lock, &ts);
    } else if (!r->allowed) {
      pthread_cond_wait(&r->cond, &r->lock);
    } else {
      break;
    }
  }
  if (r->allowed && r->allowed != UINT64_MAX)
    r->allowed--;
  pthread_mutex_unlock(&r->lock);
}

/* Punches e's memfd in GSHMD_REAP_STEP steps.  Before each, what it may
 * free (at most the step's length) leaves pending, so that pending never
 * counts a page the kernel has freed already (MemAvailable shows it);
 * after it, what it did not free comes back: the step's bytes, measured
 * (st_blocks before and after), have left pending then. */
static void punch_steps(struct gshmd_host_reaper *r, struct reap *e) {
  int fd = e->fds[0];

  for (uint64_t off = 0; off < e->size; off += GSHMD_REAP_STEP) {
    uint64_t len = min_u64(GSHMD_REAP_STEP, e->size - off), bound, before, after, freed;

    hold_wait(r);
    bound = min_u64(e->counted, len);
    __atomic_sub_fetch(&r->pending, bound, __ATOMIC_RELAXED);
    before = held_bytes(fd);
    punch_now(fd, off, len);
    after = held_bytes(fd);
    freed = before > after ? before - after : 0;
    if (freed < bound) /* (counted again: still to be freed by a later step) */
      __atomic_add_fetch(&r->pending, bound - freed, __ATOMIC_RELAXED);
    e->counted -= min_u64(freed, bound);
    __atomic_add_fetch(&r->steps, 1, __ATOMIC_RELEASE);
  }
  __atomic_sub_fetch(&r->pending, e->counted, __ATOMIC_RELAXED); /* (the rest: none left) */
  e->counted = 0;
}

static void *reaper_main(void *arg) {
  struct gshmd_host_reaper *r = arg;

  pthread_mutex_lock(&r->lock);
  for (;;) {
    struct reap *e;
    while (gshm_list_empty(&r->queue) && !r->stop)
      pthread_cond_wait(&r->cond, &r->lock);
    if (gshm_list_empty(&r->queue))
      break; /* (stopping, and all done) */
    e = gshm_list_entry(r->queue.next, struct reap, node);
    gshm_list_del(&e->node);
    pthread_mutex_unlock(&r->lock);
    if (e->punch && e->fds[0] >= 0)
      punch_steps(r, e);
    close_all(e->fds, e->map, e->size);
    free(e);
    pthread_mutex_lock(&r->lock);
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

int gshmd_host_reap_start(struct gshmd_host_reaper **out) {
  struct gshmd_host_reaper *r = calloc(1, sizeof(*r));
  const char *hold = getenv("GSHMD_TEST_REAP_HOLD");
  int e;

  *out = NULL;
  if (!r)
    return -ENOMEM;
  gshm_list_init(&r->queue);
  r->allowed = UINT64_MAX;
  if (hold && *hold && !(r->hold_file = strdup(hold))) {
    free(r);
    return -ENOMEM;
  }
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  if ((e = pthread_create(&r->thread, NULL, reaper_main, r))) {
    gshm_log_warn("host: no reaper thread (%s): large segments are given back on the loop",
                  strerror(e));
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r->hold_file);
    free(r);
    return -e;
  }
  *out = r;
  return 0;
}

void gshmd_host_reap(struct gshmd_host_reaper *r, const int fds[3], void *map, uint64_t size,
                     bool punch) {
  struct reap *e = r && size >= GSHMD_REAP_ASYNC_MIN ? malloc(sizeof(*e)) : NULL;

  if (!e) {
    if (punch && fds[0] >= 0)
      punch_now(fds[0], 0, size);
    close_all(fds, map, size);
    return;
  }
  for (int i = 0; i < 3; i++)
    e->fds[i] = fds[i];
  e->map = map;
  e->size = size;
  e->punch = punch;
  /* (the pages present, not the size: a sparse segment frees no more) */
  e->counted = punch && fds[0] >= 0 ? held_bytes(fds[0]) : 0;
  __atomic_add_fetch(&r->pending, e->counted, __ATOMIC_RELAXED);
  pthread_mutex_lock(&r->lock);
  gshm_list_add_tail(&r->queue, &e->node);
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

void gshmd_host_reap_punch(struct gshmd_host_reaper *r, int fd, uint64_t size) {
  int copy = r && size >= GSHMD_REAP_ASYNC_MIN ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;

  if (copy < 0)
    punch_now(fd, 0, size);
  else
    gshmd_host_reap(r, (const int[3]){copy, -1, -1}, NULL, size, true);
}

uint64_t gshmd_host_reap_pending(const struct gshmd_host_reaper *r) {
  return r ? __atomic_load_n(&r->pending, __ATOMIC_RELAXED) : 0;
}

uint64_t gshmd_host_reap_steps(const struct gshmd_host_reaper *r) {
  return r ? __atomic_load_n(&r->steps, __ATOMIC_ACQUIRE) : 0;
}

void gshmd_host_reap_hold(struct gshmd_host_reaper *r, uint64_t steps) {
  if (!r)
    return;
  pthread_mutex_lock(&r->lock);
  r->allowed = steps;
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

void gshmd_host_reap_stop(struct gshmd_host_reaper *r) {
  if (!r)
    return;
  pthread_mutex_lock(&r->lock);
  r->stop = true;
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
  pthread_join(r->thread, NULL);
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  free(r->hold_file);
  free(r);
}
