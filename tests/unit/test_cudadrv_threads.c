/* SPDX-License-Identifier: Apache-2.0 */
/* common/cudadrv.c's loader called from many threads at once, each with
 * its own log level, as libgshm's threads do (map, copy, pool: each loads
 * the table on first use).  Built with -fsanitize=thread, cudadrv.c
 * included (tests/unit/CMakeLists.txt): ThreadSanitizer fails the run
 * (exit 66) on any data race in the loader, such as a level written by one
 * caller while another's load reads it.  The driver is test_cudadrv's
 * stand-in older than CUDA 12.0, so every load is -ENOSYS, logged at the
 * caller's level (the log is off: the level is only read). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "cudadrv.h"

#define NTHREADS 8

static void *load(void *arg) {
  const struct gshm_cudadrv *drv = NULL;
  int prio = (int)(intptr_t)arg;
  return (void *)(intptr_t)gshm__cudadrv_load(prio, &drv);
}

int main(void) {
  pthread_t t[NTHREADS];
  int fails = 0;

  if (!dlopen(FAKE_LIBCUDA, RTLD_NOW | RTLD_GLOBAL)) {
    fprintf(stderr, "cannot load %s: %s\n", FAKE_LIBCUDA, dlerror());
    return 1;
  }
  for (int i = 0; i < NTHREADS; i++)
    if (pthread_create(&t[i], NULL, load,
                       (void *)(intptr_t)(i % 2 ? GSHM_LOG_DEBUG : GSHM_LOG_INFO))) {
      fprintf(stderr, "pthread_create failed\n");
      return 1;
    }
  for (int i = 0; i < NTHREADS; i++) {
    void *ret;
    pthread_join(t[i], &ret);
    if ((intptr_t)ret != -ENOSYS) {
      fprintf(stderr, "thread %d: load returned %d, not -ENOSYS\n", i, (int)(intptr_t)ret);
      fails++;
    }
  }
  return fails ? 1 : 0;
}
