/* SPDX-License-Identifier: Apache-2.0 */
/* The GPUs a test may use, counted in a child: CUDA must not start in a
 * test's own process when it forks clients that use it. */
#ifndef GSHM_TESTS_GPU_COUNT_H
#define GSHM_TESTS_GPU_COUNT_H

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"

/* The CUDA devices a forked child sees (at most 100); 0 without a driver
 * or a GPU, or when the child could not run. */
static inline int gpu_count(void) {
  const struct gshm_cudadrv *drv;
  pid_t pid = fork();
  int count = 0, st;

  if (pid == 0) {
    if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) || drv->cuDeviceGetCount(&count) != CUDA_SUCCESS)
      _exit(0);
    _exit(count > 100 ? 100 : count);
  }
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
    return 0;
  return WEXITSTATUS(st);
}

#endif
