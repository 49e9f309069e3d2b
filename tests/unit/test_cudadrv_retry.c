/* SPDX-License-Identifier: Apache-2.0 */
/* common/cudadrv.c's load when the driver is not ready at the first call:
 * no libcuda.so.1 yet, then one whose cuInit fails once (fake_libcuda.c's
 * driver, its cuInit failed through $FAKE_CUDA_FAIL_FILE).  Each failure
 * is tried again by the first call a second or more after the last try,
 * never sooner; a load that succeeds is kept.  The fake library is
 * dlopen'ed by its path after the first load: the loader's
 * dlopen("libcuda.so.1") then finds it by its soname.  Where a real
 * driver is installed the first load finds it, and the test is skipped.
 * A child forked before the load succeeded loads the driver itself; one
 * forked after it gets -ECHILD, for good (CUDA does not survive fork). */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cudadrv.h"

#define PAST_RETRY_US 1100000 /* a little over cudadrv.c's one second */

/* Forks a child whose loads return `want`, then `then` past the retry
 * delay (and, when 0, a driver that answers); waits for it. */
static void child_loads(int want, int then) {
  const struct gshm_cudadrv *drv = NULL;
  pid_t pid = fork();
  int status, n = 0;

  if (pid == 0) {
    alarm(10);
    if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) != want)
      _exit(1);
    usleep(PAST_RETRY_US);
    if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) != then)
      _exit(2);
    _exit(then || (drv && drv->cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 2) ? 0 : 3);
  }
  assert_true(pid > 0);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_failed_load_is_tried_again(void **state) {
  const struct gshm_cudadrv *drv = NULL;
  char fail_file[] = "/tmp/gshm-cudadrv-retry-XXXXXX";
  int fd = mkstemp(fail_file), n = 0;
  (void)state;

  assert_true(fd >= 0);
  assert_int_equal(write(fd, "cuInit 100\n", 11), 11); /* CUDA_ERROR_NO_DEVICE, once */
  close(fd);
  setenv("FAKE_CUDA_FAIL_FILE", fail_file, 1);
  if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) != -ENOENT) {
    unlink(fail_file);
    skip(); /* a libcuda.so.1 is installed here */
  }
  assert_non_null(dlopen(FAKE_LIBCUDA, RTLD_NOW | RTLD_GLOBAL));
  /* tried less than a second ago: the same answer, no dlopen */
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), -ENOENT);
  usleep(PAST_RETRY_US);
  /* the library is found now; its cuInit fails (this once) */
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), -ENODEV);
  assert_int_equal(access(fail_file, F_OK), -1); /* the fake read it */
  /* cuInit would succeed now, but is not called again within the second */
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), -ENODEV);
  assert_null(drv);
  /* a child of this process, which has not initialized CUDA, may */
  child_loads(-ENODEV, 0);
  usleep(PAST_RETRY_US);
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), 0);
  assert_non_null(drv);
  assert_int_equal(drv->cuDeviceGetCount(&n), CUDA_SUCCESS);
  assert_int_equal(n, 2);
  /* kept: at once, whatever the clock */
  drv = NULL;
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), 0);
  assert_non_null(drv);
  /* a child of this process, which has, may not: ever (the load of an old
   * libgshm succeeded there, and the child went on into CUDA) */
  child_loads(-ECHILD, -ECHILD);
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), 0); /* the parent still may */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_failed_load_is_tried_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
