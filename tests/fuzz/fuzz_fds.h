/* SPDX-License-Identifier: Apache-2.0 */
/* What the fuzz targets that check for leaked fds share. */
#ifndef GSHM_FUZZ_FDS_H
#define GSHM_FUZZ_FDS_H

#include <dirent.h>
#include <stdlib.h>

/* The fds this process holds now (libFuzzer opens files between inputs:
 * count per input). */
static inline int fuzz_fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (!d)
    abort();
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* (d's own) */
}

#endif
