/* SPDX-License-Identifier: Apache-2.0 */
/* common/cudadrv.c against a libcuda.so.1 older than CUDA 12.0: one that
 * exports every entry point under its first name (cuMemAlloc, ...) but no
 * cuGetProcAddress_v2, as drivers before 12.0 do.  The table's members
 * have the prototypes of <cuda.h>'s current variants (cuMemAlloc is
 * cuMemAlloc_v2: 64-bit pointer and size), and dlsym of the first name
 * gives the oldest variant (cuMemAlloc of CUDA 3.1: 32-bit), so such a
 * driver must be refused (-ENOSYS), never bound.  The stand-in library is
 * generated from cudadrv.h's list (tests/unit/CMakeLists.txt) and loaded
 * here first by its path: the loader's dlopen("libcuda.so.1") then finds
 * it by its soname, whatever driver the machine has. */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cudadrv.h"

static void test_driver_older_than_12_is_refused(void **state) {
  const struct gshm_cudadrv *drv = NULL;
  void *fake = dlopen(FAKE_LIBCUDA, RTLD_NOW | RTLD_GLOBAL);
  (void)state;

  assert_non_null(fake);
  assert_null(dlsym(fake, "cuGetProcAddress_v2"));
  assert_non_null(dlsym(fake, "cuMemAlloc"));
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), -ENOSYS);
  assert_null(drv);
  /* the same answer on every call */
  assert_int_equal(gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv), -ENOSYS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_driver_older_than_12_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
