/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/host_memory.c gshmd_host_collapse on a real memfd: which 2 MiB
 * pages it builds, which it leaves (built already, written whole), that no
 * byte changes, and that a length ending inside a page builds that page
 * whole (a pull's memfd covers it: the pool's last piece ends at the
 * segment's requested size, and test_cluster:test_huge_pages wants its
 * tail page built).  Skipped where the kernel cannot build them
 * (before Linux 6.5, shmem_enabled deny, no transparent huge pages).
 * Also daemon/host_reap.c's count of punches queued (what the room check
 * of a pull adds to the node's free memory). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "host_memory.h"
#include "host_reap.h"
#include "util.h"

#define MiB (1024ull * 1024)
#define PAGE GSHM__HUGE_PAGE

/* KiB of the mapping at addr that are mapped in 2 MiB entries
 * (/proc/self/smaps ShmemPmdMapped of its VMA), or -1. */
static long pmd_mapped_kib(const void *addr) {
  FILE *f = fopen("/proc/self/smaps", "re");
  char line[256];
  bool in = false;
  long kib = -1;

  while (f && fgets(line, sizeof(line), f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
    else if (in && sscanf(line, "ShmemPmdMapped: %ld kB", &kib) == 1)
      break;
  }
  if (f)
    fclose(f);
  return kib;
}

static uint8_t pattern(uint64_t i) { return (uint8_t)(i * 131 + (i >> 12) * 7 + 1); }

static void test_builds_runs_and_leaves_pages(void **state) {
  (void)state;
  const uint64_t npages = 10, len = npages * PAGE;
  uint64_t before;
  uint8_t *p;
  int fd;

  if (!gshmd_host_collapse_works())
    skip();
  fd = memfd_create("test-collapse", MFD_CLOEXEC);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)len), 0);
  p = gshm__map_shared_aligned(fd, len, PROT_READ | PROT_WRITE);
  assert_true(p != MAP_FAILED);
  /* page 2 written whole in 4 KiB pages (left: its bytes are the point),
   * page 5 built before, a pattern on its first 4 KiB; page 7 holds bytes
   * in its first 4 KiB only (built around them) */
  for (uint64_t i = 2 * PAGE; i < 3 * PAGE; i++)
    p[i] = pattern(i);
  assert_int_equal(gshmd_host_collapse(p + 5 * PAGE, PAGE, fd, 5 * PAGE), 0);
  for (uint64_t i = 5 * PAGE; i < 5 * PAGE + 4096; i++)
    p[i] = pattern(i);
  for (uint64_t i = 7 * PAGE; i < 7 * PAGE + 4096; i++)
    p[i] = pattern(i);
  before = gshmd_host_collapsed_bytes();
  /* the whole mapping but its last 1 MiB: page 9 is built whole too */
  assert_int_equal(gshmd_host_collapse(p, len - PAGE / 2, fd, 0), 0);
  /* pages 0-1, 3-4, 6-9 */
  assert_int_equal(gshmd_host_collapsed_bytes() - before, 8 * PAGE);
  for (uint64_t i = 0; i < len; i++) {
    bool written = (i >= 2 * PAGE && i < 3 * PAGE) || (i >= 5 * PAGE && i < 5 * PAGE + 4096) ||
                   (i >= 7 * PAGE && i < 7 * PAGE + 4096);
    if (p[i] != (written ? pattern(i) : 0))
      fail_msg("byte %llu: %u", (unsigned long long)i, p[i]);
  }
  /* every page but the one written whole is mapped in a 2 MiB entry */
  assert_int_equal(pmd_mapped_kib(p), (long)((npages - 1) * PAGE / 1024));
  munmap(p, len);
  close(fd);
}

/* ---- threads that build the same pages at once --------------------- */

#define RACERS 4
#define RACE_PAGES 8
#define RACE_ROUNDS 16

struct race {
  pthread_barrier_t start;
  uint8_t *p;
  int fd;
};

static void *racer(void *arg) {
  struct race *r = arg;

  pthread_barrier_wait(&r->start);
  (void)gshmd_host_collapse(r->p, RACE_PAGES * PAGE, r->fd, 0);
  return NULL;
}

/* Pages of [p, p + n pages) built: the last 4 KiB of each in the page
 * cache (nothing here writes a byte, so only a build puts it there). */
static uint64_t pages_built(uint8_t *p, uint64_t n) {
  uint64_t built = 0;

  for (uint64_t i = 0; i < n; i++) {
    unsigned char last = 0;
    assert_int_equal(mincore(p + (i + 1) * PAGE - 4096, 4096, &last), 0);
    built += last & 1;
  }
  return built;
}

/* Threads that build the same pages at once (a pull's lanes, its
 * prefault pool) count each page built once: gshm_host_huge_built_bytes_total
 * counted a page again for each thread whose MADV_COLLAPSE came after
 * another's had built it (the call succeeds on a page built already). */
static void test_racing_builds_count_once(void **state) {
  (void)state;
  const uint64_t len = RACE_PAGES * PAGE;
  uint64_t counted = 0, built = 0;

  if (!gshmd_host_collapse_works())
    skip();
  for (int round = 0; round < RACE_ROUNDS; round++) {
    struct race r;
    pthread_t t[RACERS];
    uint64_t before = gshmd_host_collapsed_bytes();

    r.fd = memfd_create("test-collapse-race", MFD_CLOEXEC);
    assert_true(r.fd >= 0);
    assert_int_equal(ftruncate(r.fd, (off_t)len), 0);
    r.p = gshm__map_shared_aligned(r.fd, len, PROT_READ | PROT_WRITE);
    assert_true(r.p != MAP_FAILED);
    assert_int_equal(pthread_barrier_init(&r.start, NULL, RACERS), 0);
    for (int i = 0; i < RACERS; i++)
      assert_int_equal(pthread_create(&t[i], NULL, racer, &r), 0);
    for (int i = 0; i < RACERS; i++)
      pthread_join(t[i], NULL);
    pthread_barrier_destroy(&r.start);
    counted += gshmd_host_collapsed_bytes() - before;
    built += pages_built(r.p, RACE_PAGES) * PAGE;
    munmap(r.p, len);
    close(r.fd);
  }
  printf("%d rounds of %d threads: %llu MiB built, %llu MiB counted\n", RACE_ROUNDS, RACERS,
         (unsigned long long)(built / MiB), (unsigned long long)(counted / MiB));
  assert_true(built > 0);
  assert_int_equal(counted, built);
}

/* Polls until r has finished n punch steps (5 s at most), then waits a
 * moment more: the steps it finished (n where a hold stops it there). */
static uint64_t steps_reach(struct gshmd_host_reaper *r, uint64_t n) {
  for (int i = 0; i < 500 && gshmd_host_reap_steps(r) < n; i++)
    usleep(10000);
  usleep(20000);
  return gshmd_host_reap_steps(r);
}

/* Four freed memfds of GSHMD_REAP_ASYNC_MIN bytes each, every page made,
 * punched on the reaper, held: it counts the four exactly (their pages,
 * st_blocks), nothing punched; let go, it counts 0 again and every fd is
 * empty.  Before, the bytes a punch would free were not counted anywhere:
 * a pull right after a free of hundreds of GB was refused -ENOMEM; and
 * the test hoped the reaper had not finished the 45 ms of punches before
 * it looked. */
static void test_reap_counts_queued_punches(void **state) {
  const uint64_t size = GSHMD_REAP_ASYNC_MIN;
  struct gshmd_host_reaper *r;
  int fds[4];
  uint64_t pending, held = 0;
  (void)state;

  assert_int_equal(gshmd_host_reap_start(&r), 0);
  assert_int_equal(gshmd_host_reap_pending(r), 0);
  gshmd_host_reap_hold(r, 0);
  for (int i = 0; i < 4; i++) {
    struct stat sb;
    fds[i] = memfd_create("reap", MFD_CLOEXEC);
    assert_true(fds[i] >= 0);
    assert_int_equal(fallocate(fds[i], 0, 0, (off_t)size), 0);
    assert_int_equal(fstat(fds[i], &sb), 0);
    held += (uint64_t)sb.st_blocks * 512;
  }
  assert_true(held >= 4 * size);
  for (int i = 0; i < 4; i++)
    gshmd_host_reap_punch(r, fds[i], size);
  usleep(20000); /* (held: nothing punched meanwhile) */
  pending = gshmd_host_reap_pending(r);
  printf("queued 4 x %llu MiB, held: %llu MiB counted\n", (unsigned long long)(size / MiB),
         (unsigned long long)(pending / MiB));
  assert_int_equal(pending, held);
  assert_int_equal(gshmd_host_reap_steps(r), 0);
  gshmd_host_reap_hold(r, UINT64_MAX);
  assert_int_equal(steps_reach(r, 4), 4); /* (all done within 5 s) */
  assert_int_equal(gshmd_host_reap_pending(r), 0);
  for (int i = 0; i < 4; i++) {
    struct stat sb;
    assert_int_equal(fstat(fds[i], &sb), 0);
    assert_int_equal(sb.st_blocks, 0);
    close(fds[i]);
  }
  gshmd_host_reap_stop(r);
  assert_int_equal(gshmd_host_reap_pending(NULL), 0);
}

/* A freed memfd of 4 GiB with a few pages in three of its four
 * GSHMD_REAP_STEP ranges: the reaper counts the pages present (st_blocks),
 * not the size; let one step go at a time, the count falls by exactly
 * that range's pages at each.  Before, it counted all 4 GiB until the
 * whole punch ended: a sparse segment's size is not memory that comes
 * back, and the kernel frees a long punch's pages as it goes (the node's
 * MemAvailable shows them while the count still had them: counted
 * twice). */
static void test_reap_counts_pages_step_by_step(void **state) {
  enum { STEPS = 4 };
  static const unsigned pages[STEPS] = {3, 5, 0, 2}; /* 2 MiB apart in each range */
  const uint64_t size = STEPS * GSHMD_REAP_STEP;
  uint64_t in_range[STEPS], held = 0, left;
  struct gshmd_host_reaper *r;
  struct stat sb;
  int fd = memfd_create("sparse", MFD_CLOEXEC);
  (void)state;

  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  for (int s = 0; s < STEPS; s++) {
    for (unsigned p = 0; p < pages[s]; p++)
      assert_int_equal(pwrite(fd, "x", 1, (off_t)(s * GSHMD_REAP_STEP + p * PAGE + 4096)), 1);
    assert_int_equal(fstat(fd, &sb), 0);
    in_range[s] = (uint64_t)sb.st_blocks * 512 - held; /* (4 KiB pages or 2 MiB ones) */
    held += in_range[s];
  }
  assert_true(held > 0 && held < size / 100);
  assert_int_equal(gshmd_host_reap_start(&r), 0);
  gshmd_host_reap_hold(r, 0);
  gshmd_host_reap_punch(r, fd, size);
  printf("4 GiB memfd, %llu KiB present: %llu KiB counted\n", (unsigned long long)(held >> 10),
         (unsigned long long)(gshmd_host_reap_pending(r) >> 10));
  assert_int_equal(gshmd_host_reap_pending(r), held);
  left = held;
  for (int s = 0; s < STEPS; s++) {
    gshmd_host_reap_hold(r, 1);
    left -= in_range[s];
    assert_int_equal(steps_reach(r, (uint64_t)s + 1), s + 1); /* (and held there) */
    assert_int_equal(gshmd_host_reap_pending(r), left);
  }
  gshmd_host_reap_stop(r);
  assert_int_equal(fstat(fd, &sb), 0);
  assert_int_equal(sb.st_blocks, 0);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_builds_runs_and_leaves_pages),
      cmocka_unit_test(test_racing_builds_count_once),
      cmocka_unit_test(test_reap_counts_queued_punches),
      cmocka_unit_test(test_reap_counts_pages_step_by_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
