/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/host_memory.c gshmd_host_collapse on a real memfd: which 2 MiB
 * pages it builds, which it leaves (built already, written whole), that no
 * byte changes, and that a length ending inside a page builds that page
 * whole (a pull's memfd covers it: the pool's last piece ends at the
 * segment's requested size, and test_cluster:test_huge_pages wants its
 * tail page built).  Skipped where the kernel cannot build them
 * (before Linux 6.5, shmem_enabled deny, no transparent huge pages).
 * Also daemon/host_reap.c's count of punches queued (what the room check
 * of a pull adds to the node's free memory), and host_memory.c's figures
 * (/proc/meminfo, the memory cgroup), read from files held open. */
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
#include <dirent.h>
#include <limits.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* ---- The node's memory figures ---- */

/* This process's open fds. */
static int fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = -1; /* (the DIR's own fd) */

  assert_non_null(d);
  while (readdir(d))
    n++;
  closedir(d);
  return n - 2; /* (. and ..) */
}

/* key's figure in /proc/meminfo ("MemTotal:"), bytes. */
static uint64_t meminfo(const char *key) {
  char line[160];
  unsigned long long kib = 0;
  FILE *f = fopen("/proc/meminfo", "re");

  assert_non_null(f);
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, key, strlen(key)) && sscanf(line + strlen(key), "%llu", &kib) == 1)
      break;
  fclose(f);
  return (uint64_t)kib * 1024;
}

/* The figures are those of the files; a read after the first opens no
 * file: under an fd limit that leaves none free they are still read.
 * Before, each read opened /proc/meminfo and every cgroup file again
 * (72-73 us a read on the 2-core VM, 14 us held open), and under that
 * limit knew nothing (UINT64_MAX: no bound on a create or a pull). */
static void test_memory_figures_read_from_held_files(void **state) {
  struct gshmd_host_memory m = {0};
  struct rlimit old, tight;
  int before = fd_count(), held;
  (void)state;

  gshmd_host_memory_update(&m);
  held = fd_count();
  assert_true(held > before);
  assert_int_equal(m.ram, meminfo("MemTotal:"));
  assert_int_equal(m.swap, meminfo("SwapTotal:"));
  assert_true(m.avail > 0 && m.avail <= m.ram + m.swap);
  for (int i = 0; i < 100; i++) { /* (and none left open by a read) */
    m.read_ns = 0;
    gshmd_host_memory_update(&m);
  }
  assert_int_equal(fd_count(), held);
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
  tight = old;
  tight.rlim_cur = (rlim_t)held + 3; /* (fds 0-2 and the held ones numbered low) */
  while (tight.rlim_cur > 0 && fcntl((int)tight.rlim_cur - 1, F_GETFD) < 0)
    tight.rlim_cur--;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &tight), 0);
  assert_int_equal(open("/dev/null", O_RDONLY | O_CLOEXEC), -1); /* (none free) */
  m.read_ns = 0;
  m.ram = m.swap = m.avail = 0;
  gshmd_host_memory_update(&m);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
  assert_int_equal(m.ram, meminfo("MemTotal:"));
  assert_true(m.avail > 0 && m.avail != UINT64_MAX);
  gshmd_host_memory_close(&m);
  assert_null(m.files);
  assert_int_equal(fd_count(), before);
}

/* Writes text to dir/file in one write (a cgroup file takes one value a
 * write); false when it cannot. */
static bool write_file(const char *dir, const char *file, const char *text) {
  char path[PATH_MAX + 64];
  int fd;
  bool ok;

  snprintf(path, sizeof(path), "%s/%s", dir, file);
  if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
    return false;
  ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
  return close(fd) == 0 && ok;
}

/* This process's memory cgroup folder (v2 where /sys/fs/cgroup is the
 * unified hierarchy, else v1's memory controller) into dir, its limit
 * file's name into *limit; false where there is none. */
static bool own_memory_cgroup(char *dir, size_t cap, const char **limit) {
  bool v2 = !access("/sys/fs/cgroup/cgroup.controllers", F_OK);
  char line[512];
  FILE *f = fopen("/proc/self/cgroup", "re");
  bool found = false;

  while (f && !found && fgets(line, sizeof(line), f)) {
    char *p = strchr(line, ':'), *q = p ? strchr(p + 1, ':') : NULL;
    if (!q)
      continue;
    q[strcspn(q, "\n")] = '\0';
    if ((found = v2 && !strncmp(line, "0::", 3)))
      snprintf(dir, cap, "/sys/fs/cgroup%s", q + 1), *limit = "memory.max";
    else if ((found = !v2 && (strstr(p, ":memory:") || strstr(p, ",memory:") ||
                              strstr(p, ":memory,") || strstr(p, ",memory,"))))
      snprintf(dir, cap, "/sys/fs/cgroup/memory%s", q + 1), *limit = "memory.limit_in_bytes";
  }
  if (f)
    fclose(f);
  return found && !access(dir, W_OK);
}

/* A move into another memory cgroup (test_cluster_rogue_server's
 * test_host_set_beyond_cgroup moves gshmd so) is seen at the next read:
 * /proc/self/cgroup, held open, is read at each, and the levels' files
 * are opened again when it changed, the old ones closed.  Skipped where
 * no child cgroup with a memory limit can be made (not root). */
static void test_memory_figures_follow_a_cgroup_move(void **state) {
  struct gshmd_host_memory m = {0};
  char home[PATH_MAX], cg[PATH_MAX + 32], pid[32];
  const char *limit = NULL;
  uint64_t cg_mem;
  int held;
  (void)state;

  if (!own_memory_cgroup(home, sizeof(home), &limit)) {
    printf("no writable memory cgroup here: skipped\n");
    skip();
  }
  snprintf(cg, sizeof(cg), "%s/gshm-unit-%d", home, (int)getpid());
  if (mkdir(cg, 0755) || !write_file(cg, limit, "201326592\n")) {
    rmdir(cg);
    printf("no child memory cgroup with a limit can be made here: skipped\n");
    skip();
  }
  gshmd_host_memory_update(&m);
  cg_mem = m.cg_mem;
  held = fd_count();
  assert_true(cg_mem > 201326592);
  snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
  assert_true(write_file(cg, "cgroup.procs", pid));
  m.read_ns = 0;
  gshmd_host_memory_update(&m);
  assert_true(write_file(home, "cgroup.procs", pid));
  assert_int_equal(rmdir(cg), 0);
  assert_int_equal(m.cg_mem, 201326592);
  assert_true(m.cg_room <= 201326592);
  m.read_ns = 0;
  gshmd_host_memory_update(&m);
  assert_int_equal(m.cg_mem, cg_mem);
  assert_int_equal(fd_count(), held);
  gshmd_host_memory_close(&m);
}

/* The lowest fd of this process open on a file whose path ends in
 * suffix ("/memory.max"), or on exactly that path where exact; its path
 * into path (cap bytes).  -1 where none is. */
static int fd_on(const char *suffix, bool exact, char *path, size_t cap) {
  size_t len = strlen(suffix);

  for (int fd = 3; fd < 1024; fd++) {
    char link[64];
    ssize_t n;
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    if ((n = readlink(link, path, cap - 1)) <= 0)
      continue;
    path[n] = '\0';
    if (exact ? !strcmp(path, suffix) : (size_t)n > len && !strcmp(path + n - len, suffix))
      return fd;
  }
  return -1;
}

/* A cgroup level's file whose read fails (here: its fd made a folder's,
 * pread EISDIR) is opened again at the next read, and its figure read
 * from it.  Before, read_text closed it and nothing opened it again
 * until gshmd moved to another cgroup: the level's limit unknown (no
 * limit, for a create's size check and a pull's room) for good.
 * Skipped where no memory cgroup file is held (none mounted). */
static void test_memory_figures_reopen_after_failed_read(void **state) {
  bool v2 = !access("/sys/fs/cgroup/cgroup.controllers", F_OK);
  struct gshmd_host_memory m = {0};
  char path[PATH_MAX], again[PATH_MAX];
  uint64_t cg_mem;
  int held, fd, dir;
  (void)state;

  gshmd_host_memory_update(&m);
  cg_mem = m.cg_mem;
  held = fd_count();
  if ((fd = fd_on(v2 ? "/memory.max" : "/memory.limit_in_bytes", false, path, sizeof(path))) < 0) {
    gshmd_host_memory_close(&m);
    printf("no memory cgroup file held here: skipped\n");
    skip();
  }
  assert_true((dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0);
  assert_int_equal(dup2(dir, fd), fd); /* (its reads now fail) */
  close(dir);
  m.read_ns = 0;
  gshmd_host_memory_update(&m); /* the read fails: the file is closed */
  m.read_ns = 0;
  gshmd_host_memory_update(&m);
  print_message("    %s (fd %d): held again: %s\n", path, fd,
                fd_on(path, true, again, sizeof(again)) >= 0 ? "yes" : "no");
  assert_true(fd_on(path, true, again, sizeof(again)) >= 0);
  assert_int_equal(m.cg_mem, cg_mem);
  assert_int_equal(fd_count(), held);
  gshmd_host_memory_close(&m);
}

/* The fds the figures hold for gshmd in the root of its cgroup
 * namespace: /proc/meminfo, /proc/self/cgroup, the root level's files
 * that exist and its folder where one is missing. */
static int root_level_fds(void) {
  bool v2 = !access("/sys/fs/cgroup/cgroup.controllers", F_OK);
  const char *root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
  const char *file[3] = {v2 ? "memory.max" : "memory.limit_in_bytes",
                         v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes",
                         v2 ? "memory.current" : "memory.usage_in_bytes"};
  int n = 2, missing = 0;

  for (int k = 0; k < 3; k++) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", root, file[k]);
    if (access(path, R_OK))
      missing = 1;
    else
      n++;
  }
  return n + missing;
}

/* gshmd in the root of its cgroup namespace (a container's own, Docker's
 * default on cgroup v2: /proc/self/cgroup says "0::/") holds that one
 * level's files once.  Its folder, the mount's root with a '/' after it,
 * was taken for a level of its own and then, the '/' cut, for its
 * parent: the same files opened and read twice.  In a child that
 * unshares its cgroup namespace; skipped where it may not (not root). */
static void test_memory_figures_namespace_root_once(void **state) {
  int status;
  pid_t pid;
  (void)state;

  if ((pid = fork()) == 0) {
    struct gshmd_host_memory m = {0};
    int before;
    if (unshare(CLONE_NEWCGROUP))
      _exit(77);
    before = fd_count();
    gshmd_host_memory_update(&m);
    fprintf(stderr, "fds held: %d, want %d\n", fd_count() - before, root_level_fds());
    _exit(fd_count() - before == root_level_fds() ? 0 : 1);
  }
  assert_true(pid > 0);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    printf("no cgroup namespace can be made here: skipped\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_builds_runs_and_leaves_pages),
      cmocka_unit_test(test_racing_builds_count_once),
      cmocka_unit_test(test_reap_counts_queued_punches),
      cmocka_unit_test(test_reap_counts_pages_step_by_step),
      cmocka_unit_test(test_memory_figures_read_from_held_files),
      cmocka_unit_test(test_memory_figures_follow_a_cgroup_move),
      cmocka_unit_test(test_memory_figures_reopen_after_failed_read),
      cmocka_unit_test(test_memory_figures_namespace_root_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
