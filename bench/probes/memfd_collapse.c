/* SPDX-License-Identifier: Apache-2.0 */
/* memfd_collapse: can new memfd memory get 2 MiB pages where the machine's
 * shmem_enabled is "never", and how fast (docs/PERFORMANCE.md "Pulls from a
 * peer gshmd").  MADV_COLLAPSE (Linux 6.1) builds a huge page from a range
 * of a file's pages whatever shmem_enabled says, short of "deny"; one page
 * present in each 2 MiB range is enough (the rest are cleared).
 * An experiment, kept so that its numbers can be reproduced; not built with
 * the project:
 *
 *   gcc -O2 -pthread -o memfd_collapse bench/probes/memfd_collapse.c
 *   ./memfd_collapse [GIB]
 *
 * Each row: new memfd memory of GIB GiB, its pages made by T threads
 * (disjoint ranges, the mapping 2 MiB aligned), then one memset over it
 * (warm) and ShmemHugePages gained, from /proc/meminfo. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define HUGE (2ul << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long meminfo_kb(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r"); char line[256]; long v = -1; size_t n = strlen(key);
  while (f && fgets(line, sizeof line, f)) if (!strncmp(line, key, n) && line[n] == ':') v = atol(line + n + 1);
  if (f)
    fclose(f);
  return v;
}
enum { M_TOUCH, M_FALLOC, M_COLLAPSE, M_FCOLLAPSE, M_COLLAPSE_EMPTY, M_PCOLLAPSE, M_AGAIN, M_PCOLLAPSE8 };
struct job { char *p; int fd; size_t off, len; int mode; int fails; int err; };
static void *run(void *a) {
  struct job *j = a;
  if (j->mode == M_PCOLLAPSE8) {
    for (size_t o = j->off; o < j->off + j->len; o += 4 * HUGE) {
      size_t n = j->off + j->len - o < 4 * HUGE ? j->off + j->len - o : 4 * HUGE;
      for (size_t k = 0; k < n; k += HUGE)
        if (madvise(j->p + o + k, 4096, MADV_POPULATE_WRITE)) { j->fails++; j->err = errno; }
      if (madvise(j->p + o, n, MADV_COLLAPSE)) { j->fails++; j->err = errno; }
    }
    return 0;
  }
  for (size_t o = j->off; o < j->off + j->len; o += HUGE) {
    if (j->mode == M_TOUCH) { for (size_t i = 0; i < HUGE; i += 4096) j->p[o + i] = 1; continue; }
    if (j->mode == M_FALLOC) { if (fallocate(j->fd, 0, o, HUGE)) { j->fails++; j->err = errno; } continue; }
    if (j->mode == M_COLLAPSE) j->p[o] = 1;
    if (j->mode == M_FCOLLAPSE && fallocate(j->fd, 0, o, 4096)) { j->fails++; j->err = errno; }
    if (j->mode == M_PCOLLAPSE && madvise(j->p + o, 4096, MADV_POPULATE_WRITE)) { j->fails++; j->err = errno; }
    if (madvise(j->p + o, HUGE, MADV_COLLAPSE)) { j->fails++; j->err = errno; }
  }
  return 0;
}
static void test(const char *name, size_t total, int T, int mode) {
  pthread_t th[64]; struct job jb[64];
  int fd = memfd_create("collapse", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, total)) { perror("memfd"); exit(1); }
  char *r = mmap(0, total + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *p = (char *)(((uintptr_t)r + HUGE - 1) & ~(HUGE - 1));
  if (r == MAP_FAILED || mmap(p, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != p) { perror("mmap"); exit(1); }
  long h0 = meminfo_kb("ShmemHugePages");
  size_t per = total / T;
  if (mode == M_AGAIN) {
    for (size_t o = 0; o < total; o += HUGE) { madvise(p + o, 4096, MADV_POPULATE_WRITE); madvise(p + o, HUGE, MADV_COLLAPSE); }
    h0 = meminfo_kb("ShmemHugePages");
  }
  double t0 = now();
  for (int i = 0; i < T; i++) { jb[i] = (struct job){p, fd, i * per, per, mode, 0, 0}; pthread_create(&th[i], 0, run, &jb[i]); }
  int fails = 0, err = 0;
  for (int i = 0; i < T; i++) { pthread_join(th[i], 0); fails += jb[i].fails; if (jb[i].err) err = jb[i].err; }
  double t = now() - t0;
  long h1 = meminfo_kb("ShmemHugePages");
  double t1 = now(); memset(p, 2, total); double tw = now() - t1;
  for (size_t i = 0; i < total; i += 4096) if (p[i] != 2) { printf("bad byte at %zu\n", i); exit(1); }
  printf("%-22s T=%2d %6.2f GB/s  warm memset %5.2f GB/s  huge +%ld MiB  fails %d (%s)\n", name, T,
         total / t / 1e9, total / tw / 1e9, (h1 - h0) / 1024, fails, fails ? strerror(err) : "-");
  munmap(r, total + HUGE); close(fd);
}
int main(int c, char **v) {
  size_t total = (size_t)(c > 1 ? atoi(v[1]) : 1) << 30;
  char buf[128] = "?"; FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (f) { if (!fgets(buf, sizeof buf, f)) buf[0] = 0; fclose(f); }
  printf("shmem_enabled: %s", buf);
  int ts[] = {1, 2, 4, 8, 16};
  for (int k = 0; k < 5; k++) {
    test("touch 4 KiB", total, ts[k], M_TOUCH);
    test("fallocate", total, ts[k], M_FALLOC);
    test("touch+collapse", total, ts[k], M_COLLAPSE);
    test("fallocate 4K+collapse", total, ts[k], M_FCOLLAPSE);
    test("populate 4K+collapse", total, ts[k], M_PCOLLAPSE);
    test("populate, collapse 8M", total, ts[k], M_PCOLLAPSE8);
    test("collapse, already huge", total, ts[k], M_AGAIN);
  }
  test("collapse empty", total, 1, M_COLLAPSE_EMPTY);
  return 0;
}
