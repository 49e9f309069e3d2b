/* SPDX-License-Identifier: Apache-2.0 */
/* LD_PRELOAD shim for test_bench_pull.sh: memfd_create of the name in
 * $FAIL_MEMFD_NAME fails with EMFILE (every other name is the real
 * call's), so that a benchmark's anchor that needs one fails.  Exported
 * by name: the project builds with hidden visibility. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

__attribute__((visibility("default"))) int memfd_create(const char *name, unsigned int flags) {
  int (*real)(const char *, unsigned int) =
      (int (*)(const char *, unsigned int))dlsym(RTLD_NEXT, "memfd_create");
  const char *fail = getenv("FAIL_MEMFD_NAME");

  if (fail && name && !strcmp(name, fail)) {
    errno = EMFILE;
    return -1;
  }
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(name, flags);
}
