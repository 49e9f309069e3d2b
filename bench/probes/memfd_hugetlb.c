/* SPDX-License-Identifier: Apache-2.0 */
/* memfd_hugetlb: can gshmd's pulls take 2 MiB hugetlbfs pages (MFD_HUGETLB)
 * where the admin reserved them, and how fast are they made against the
 * 4 KiB + MADV_COLLAPSE pages gshmd builds today.
 *   gcc -O2 -pthread -o memfd_hugetlb bench/probes/memfd_hugetlb.c && ./memfd_hugetlb [GIB]
 * An experiment (docs/PERFORMANCE.md "Session 35"), not built with the
 * project; as root it reserves the 2 MiB pages it needs and gives them
 * back. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
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
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long readl(const char *p) { FILE *f = fopen(p, "r"); long v = -1; if (f) { if (fscanf(f, "%ld", &v) != 1) v = -1; fclose(f); } return v; }
enum { M_TLB_TOUCH, M_TLB_FALLOC, M_COLL };
struct job { char *p; int fd; size_t off, len; int mode, fails, err; };
static void *run(void *a) {
  struct job *j = a;
  for (size_t o = j->off; o < j->off + j->len; o += HUGE) {
    if (j->mode == M_TLB_TOUCH) { j->p[o] = 1; continue; }
    if (j->mode == M_TLB_FALLOC) { if (fallocate(j->fd, 0, o, HUGE)) { j->fails++; j->err = errno; } continue; }
    if (fallocate(j->fd, 0, o, 4096)) { j->fails++; j->err = errno; }
    if (madvise(j->p + o, HUGE, MADV_COLLAPSE)) { j->fails++; j->err = errno; }
  }
  return 0;
}
static void test(const char *name, size_t total, int T, int mode) {
  pthread_t th[64]; struct job jb[64];
  int fd = memfd_create("h", MFD_CLOEXEC | MFD_ALLOW_SEALING | (mode != M_COLL ? MFD_HUGETLB | MFD_HUGE_2MB : 0));
  if (fd < 0) { printf("%-22s memfd_create: %s\n", name, strerror(errno)); return; }
  if (ftruncate(fd, total)) { printf("%-22s ftruncate: %s\n", name, strerror(errno)); close(fd); return; }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) printf("  seals: %s\n", strerror(errno));
  char *r = mmap(0, total + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *p = (char *)(((uintptr_t)r + HUGE - 1) & ~(HUGE - 1));
  if (mmap(p, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != p) { printf("%-22s mmap: %s\n", name, strerror(errno)); close(fd); return; }
  size_t per = total / T;
  double t0 = now();
  for (int i = 0; i < T; i++) { jb[i] = (struct job){p, fd, i * per, per, mode, 0, 0}; pthread_create(&th[i], 0, run, &jb[i]); }
  int fails = 0, err = 0;
  for (int i = 0; i < T; i++) { pthread_join(th[i], 0); fails += jb[i].fails; if (jb[i].err) err = jb[i].err; }
  double t = now() - t0;
  double t1 = now(); memset(p, 2, total); double tw = now() - t1;
  printf("%-22s T=%2d %6.2f GB/s  warm memset %5.2f GB/s  fails %d (%s)\n", name, T, total / t / 1e9, total / tw / 1e9, fails, fails ? strerror(err) : "-");
  munmap(r, total + HUGE); close(fd);
}
int main(int c, char **v) {
  size_t total = (size_t)(c > 1 ? atoi(v[1]) : 1) << 30;
  long want = (long)(total / HUGE) + 16, before = readl("/proc/sys/vm/nr_hugepages");
  FILE *f = fopen("/proc/sys/vm/nr_hugepages", "w");
  int werr = 0;
  if (!f || fprintf(f, "%ld\n", want) < 0 || fclose(f)) werr = errno;
  printf("nr_hugepages before %ld, asked %ld: %s, now %ld, free %ld\n", before, want, werr ? strerror(werr) : "ok",
         readl("/proc/sys/vm/nr_hugepages"), readl("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"));
  int ts[] = {1, 4, 8, 16};
  for (int k = 0; k < 4; k++) {
    test("hugetlb touch", total, ts[k], M_TLB_TOUCH);
    test("hugetlb fallocate", total, ts[k], M_TLB_FALLOC);
    test("4K fallocate+collapse", total, ts[k], M_COLL);
  }
  f = fopen("/proc/sys/vm/nr_hugepages", "w");
  if (f) { fprintf(f, "%ld\n", before < 0 ? 0 : before); fclose(f); }
  return 0;
}
