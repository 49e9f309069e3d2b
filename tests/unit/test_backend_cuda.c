/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's CUDA backend (daemon/backend_cuda*.c, all of it) against a fake
 * driver of two GPUs (fake_cuda_gpus.c): a sticky context error (gshm__cuda_sticky) from any
 * driver call makes the backend log one error that names the GPU, the
 * call and the error, and set needs_restart, once; other errors do not;
 * after it, freeing a segment or the backend makes no driver call (the
 * memory stays where the fd store keeps it, as after a SIGKILL).  What
 * gshmd does with needs_restart (stop, exit for a restart) is main.c's. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "cudadrv.h"
#include "fake_cuda_gpus.h"
#include "log.h"

/* ---- the log, read back: stderr goes to a file for each test ---- */

static FILE *log_file;
static int saved_stderr = -1;

static void log_capture(void) {
  fflush(stderr);
  log_file = tmpfile();
  assert_non_null(log_file);
  saved_stderr = dup(STDERR_FILENO);
  dup2(fileno(log_file), STDERR_FILENO);
}

/* Stops capturing and shows what was captured; returns how many lines
 * contain every word of the NULL-terminated list (none: -1). */
static int log_lines_with(const char *const *words) {
  char line[1024];
  int n = 0;

  if (saved_stderr < 0)
    return -1;
  fflush(stderr);
  dup2(saved_stderr, STDERR_FILENO);
  close(saved_stderr);
  saved_stderr = -1;
  rewind(log_file);
  while (fgets(line, sizeof(line), log_file)) {
    bool all = words != NULL;
    for (const char *const *w = words; w && *w; w++)
      all &= strstr(line, *w) != NULL;
    n += all;
    fputs(line, stderr); /* (for the test's own output) */
  }
  fclose(log_file);
  return n;
}

/* A failed test's captured lines (its failure among them) are shown. */
static int log_release(void **state) {
  (void)state;
  log_lines_with(NULL);
  gshm__log_setup("test", -1, 0);
  return 0;
}

static struct gshmd_backend *backend_new(void) {
  struct gshmd_backend *b = NULL;
  assert_int_equal(gshmd_backend_cuda_create(NULL, &b, NULL), 0);
  assert_int_equal(b->ndevices, FAKE_NDEV);
  assert_false(b->needs_restart);
  return b;
}

static int alloc_on(struct gshmd_backend *b, const char *where, struct gshmd_alloc **out) {
  struct gshm_location loc;
  assert_int_equal(gshm__location_parse(where, &loc), 0);
  return b->ops->alloc(b, &loc, FAKE_GRAN, 0, "seg", out);
}

/* ---- tests ---- */

/* A sticky error in a segment's zeroing on GPU 1: -EIO, one error line
 * naming GPU 1's bus id, the call and the error, needs_restart set; a
 * second sticky error (another call, the other GPU) logs no second error
 * line. */
static void test_sticky_error_asks_for_restart_once(void **state) {
  static const char *const first[] = {"0000:19:00.0", "cuMemsetD8", "CUDA_ERROR_ILLEGAL_ADDRESS",
                                      "restart", NULL};
  static const char *const any_restart[] = {"restart", NULL};
  struct gshmd_backend *b;
  struct gshmd_alloc *a = NULL;
  (void)state;

  gshm__log_setup("test", GSHM_LOG_INFO, 0);
  b = backend_new();
  log_capture();
  fake_fail_call = "cuMemsetD8";
  fake_fail_with = CUDA_ERROR_ILLEGAL_ADDRESS;
  assert_int_equal(alloc_on(b, "cuda:1", &a), -EIO);
  assert_null(fake_fail_call);
  assert_true(b->needs_restart);
  assert_int_equal(log_lines_with(first), 1);

  log_capture();
  fake_fail_call = "cuMemAddressReserve";
  fake_fail_with = CUDA_ERROR_LAUNCH_FAILED;
  assert_int_equal(alloc_on(b, "cuda:0", &a), -EIO);
  assert_true(b->needs_restart);
  assert_int_equal(log_lines_with(any_restart), 0);
  b->ops->destroy(b);
}

/* A sticky error while the backend sets up its GPUs is told apart from a
 * missing driver or GPU (it was -EIO, as any error of one call, and
 * gshmd served on without the backend, its device segments dropped from
 * the fd store by the restore): -ENOTRECOVERABLE, for main.c's start. */
static void test_sticky_error_in_setup_is_told_apart(void **state) {
  struct gshmd_backend *b = NULL;
  (void)state;

  fake_fail_call = "cuDevicePrimaryCtxRetain";
  fake_fail_with = CUDA_ERROR_ECC_UNCORRECTABLE;
  assert_int_equal(gshmd_backend_cuda_create(NULL, &b, NULL), -ENOTRECOVERABLE);
  assert_null(fake_fail_call);
  assert_null(b);
  fake_fail_call = "cuDevicePrimaryCtxRetain";
  fake_fail_with = CUDA_ERROR_OUT_OF_MEMORY; /* one call's error: as before */
  assert_int_equal(gshmd_backend_cuda_create(NULL, &b, NULL), -ENOMEM);
  assert_null(b);
}

/* Errors of one call (out of memory, a bad value) are the request's: no
 * restart, and the next allocation works. */
static void test_other_errors_do_not(void **state) {
  struct gshmd_backend *b = backend_new();
  struct gshmd_alloc *a = NULL;
  (void)state;

  fake_fail_call = "cuMemCreate";
  fake_fail_with = CUDA_ERROR_OUT_OF_MEMORY;
  assert_int_equal(alloc_on(b, "cuda:0", &a), -ENOMEM);
  fake_fail_call = "cuMemMap";
  fake_fail_with = CUDA_ERROR_INVALID_VALUE;
  assert_int_equal(alloc_on(b, "cuda:0", &a), -EINVAL);
  assert_false(b->needs_restart);
  assert_int_equal(alloc_on(b, "cuda:0", &a), 0);
  b->ops->free(b, a);
  b->ops->destroy(b);
}

/* Once a sticky error is seen, a segment freed on the way out (gshmd's
 * shutdown frees every segment's record) and the backend itself make no
 * driver call: no cuMemRelease of memory that the fd store keeps, as
 * after a SIGKILL. */
static void test_after_sticky_error_free_makes_no_driver_call(void **state) {
  struct gshmd_backend *b = backend_new();
  struct gshmd_alloc *a = NULL, *other = NULL;
  (void)state;

  assert_int_equal(alloc_on(b, "cuda:0", &a), 0);
  fake_fail_call = "cuMemCreate"; /* (the one call whose GPU the backend names itself) */
  fake_fail_with = CUDA_ERROR_ECC_UNCORRECTABLE;
  assert_int_equal(alloc_on(b, "cuda:1", &other), -EIO);
  assert_true(b->needs_restart);
  fake_calls = 0;
  b->ops->free(b, a);
  b->ops->destroy(b);
  assert_int_equal(fake_calls, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_sticky_error_asks_for_restart_once, log_release),
      cmocka_unit_test(test_other_errors_do_not),
      cmocka_unit_test(test_sticky_error_in_setup_is_told_apart),
      cmocka_unit_test(test_after_sticky_error_free_makes_no_driver_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
