/* SPDX-License-Identifier: Apache-2.0 */
/* The reaper thread (host_reap.h). */
#include "host_reap.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "list.h"
#include "log.h"

struct reap {
  struct gshm_list node;
  int fds[3];
  void *map;
  uint64_t size;
  bool punch;
};

struct gshmd_host_reaper {
  pthread_t thread;
  uint64_t pending; /* bytes of queued punches (atomic) */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct gshm_list queue; /* struct reap, oldest first */
  bool stop;
};

static void punch_now(int fd, uint64_t size) {
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)size) < 0)
    gshm_log_warn("host: punching out a freed segment's %llu bytes: %m",
                  (unsigned long long)size);
}

static void reap_now(const int fds[3], void *map, uint64_t size, bool punch) {
  if (punch && fds[0] >= 0)
    punch_now(fds[0], size);
  if (map)
    munmap(map, size);
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0)
      close(fds[i]);
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
    reap_now(e->fds, e->map, e->size, e->punch);
    if (e->punch)
      __atomic_sub_fetch(&r->pending, e->size, __ATOMIC_RELAXED);
    free(e);
    pthread_mutex_lock(&r->lock);
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

int gshmd_host_reap_start(struct gshmd_host_reaper **out) {
  struct gshmd_host_reaper *r = calloc(1, sizeof(*r));
  int e;

  *out = NULL;
  if (!r)
    return -ENOMEM;
  gshm_list_init(&r->queue);
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  if ((e = pthread_create(&r->thread, NULL, reaper_main, r))) {
    gshm_log_warn("host: no reaper thread (%s): large segments are given back on the loop",
                  strerror(e));
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
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
    reap_now(fds, map, size, punch);
    return;
  }
  for (int i = 0; i < 3; i++)
    e->fds[i] = fds[i];
  e->map = map;
  e->size = size;
  e->punch = punch;
  if (punch)
    __atomic_add_fetch(&r->pending, size, __ATOMIC_RELAXED);
  pthread_mutex_lock(&r->lock);
  gshm_list_add_tail(&r->queue, &e->node);
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

void gshmd_host_reap_punch(struct gshmd_host_reaper *r, int fd, uint64_t size) {
  int copy = r && size >= GSHMD_REAP_ASYNC_MIN ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;

  if (copy < 0)
    punch_now(fd, size);
  else
    gshmd_host_reap(r, (const int[3]){copy, -1, -1}, NULL, size, true);
}

uint64_t gshmd_host_reap_pending(const struct gshmd_host_reaper *r) {
  return r ? __atomic_load_n(&r->pending, __ATOMIC_RELAXED) : 0;
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
  free(r);
}
