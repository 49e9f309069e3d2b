/* SPDX-License-Identifier: Apache-2.0 */
/* LD_PRELOAD shim for test_bench_pull.sh, faults a benchmark must report:
 * memfd_create of the name in $FAIL_MEMFD_NAME fails with EMFILE (every
 * other name is the real call's), so that an anchor that needs one fails;
 * with $FLIP_READ set, gshm_read returns its bytes with one bit flipped,
 * as a wrong copy would read.  For test_read_signal.sh, $SLOW_READ_MS
 * makes each gshm_read first sleep that many milliseconds (a read long
 * enough to interrupt).  For test_read_swap.sh, $SWAP_AFTER_LSTAT
 * "PATH:NEW" renames NEW over PATH right after an lstat of PATH returns
 * (what another user of a group-writable directory may do between
 * gshmctl's lstat and its open).  Exported by name: the project builds
 * with hidden visibility. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHIM_API __attribute__((visibility("default")))

typedef struct gshm_segment gshm_segment_t;
SHIM_API int memfd_create(const char *name, unsigned int flags);
SHIM_API int gshm_read(gshm_segment_t *seg, uint64_t offset, void *buf, size_t bytes);
SHIM_API int lstat(const char *path, struct stat *st);

int memfd_create(const char *name, unsigned int flags) {
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

int gshm_read(gshm_segment_t *seg, uint64_t offset, void *buf, size_t bytes) {
  int (*real)(gshm_segment_t *, uint64_t, void *, size_t) =
      (int (*)(gshm_segment_t *, uint64_t, void *, size_t))dlsym(RTLD_NEXT, "gshm_read");
  const char *slow = getenv("SLOW_READ_MS");
  int e;

  if (slow)
    usleep((useconds_t)atoi(slow) * 1000);
  e = real ? real(seg, offset, buf, bytes) : -ENOSYS;
  if (!e && bytes && getenv("FLIP_READ"))
    ((uint8_t *)buf)[bytes / 2] ^= 1;
  return e;
}

int lstat(const char *path, struct stat *st) {
  int (*real)(const char *, struct stat *) =
      (int (*)(const char *, struct stat *))dlsym(RTLD_NEXT, "lstat");
  const char *swap = getenv("SWAP_AFTER_LSTAT"), *colon = swap ? strchr(swap, ':') : NULL;
  int r, e;

  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  r = real(path, st);
  e = errno;
  if (colon && strlen(path) == (size_t)(colon - swap) && !strncmp(path, swap, strlen(path)))
    (void)rename(colon + 1, path); /* (once: NEW is gone after) */
  errno = e;
  return r;
}
