/* SPDX-License-Identifier: Apache-2.0 */
/* The node's memory figures (host_memory.h): /proc/meminfo and gshmd's
 * memory cgroup, v2 or v1, with every ancestor's limit. */
#include "host_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define COLLAPSE_BACKOFF_NS 1000000000LL

/* ---- The figures ----------------------------------------------------------
 * Each file is opened once and read again from offset 0 (a seq_file, as
 * /proc's and the cgroup files are, makes its text again for a read at 0):
 * opening, reading and closing /proc/meminfo, /proc/self/cgroup and three
 * files of each of three cgroup levels took 72-73 us on the 2-core VM, 60%
 * of it the path walks, opens and closes; held open, 14 us (docs/PERFORMANCE.md
 * "Session 36: a pull's fixed costs"). */

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

#define CGROUP_TEXT 8192 /* bytes of /proc/self/cgroup looked at */

/* The files of one cgroup version's memory controller. */
struct cg_files {
  const char *root, *file[3]; /* file[]: limit, swap limit, usage */
  bool memsw; /* v1: the swap limit counts memory and swap together */
};

static const struct cg_files cg_v2 = {"/sys/fs/cgroup",
                                      {"memory.max", "memory.swap.max", "memory.current"},
                                      false};
static const struct cg_files cg_v1 = {"/sys/fs/cgroup/memory",
                                      {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                                       "memory.usage_in_bytes"},
                                      true};

/* One level of gshmd's cgroup (its own, then each ancestor's). */
struct cg_level {
  int fd[3];  /* cg_files.file[]; -1: missing, or its read failed (looked up again at each read) */
  int dir;    /* the level's folder (O_PATH) while one of them is missing; else -1 */
  char *path; /* the level's folder (heap), to open dir again after a failed read */
};

struct gshmd_host_memory_files {
  int meminfo, self_cgroup;  /* /proc/meminfo, /proc/self/cgroup; -1: opened again at a read */
  const struct cg_files *cg; /* the levels' version; NULL: no memory cgroup */
  struct cg_level *level;    /* gshmd's cgroup first, the root last */
  unsigned nlevels;
  ssize_t text_len;          /* of text; -1: /proc/self/cgroup could not be read */
  char text[CGROUP_TEXT];    /* /proc/self/cgroup when the levels were opened */
};

/* *fd's text from offset 0 into buf (cap bytes, NUL-terminated; what
 * does not fit is left).  Returns its length, or -1 (*fd closed, -1:
 * opened again at the next read). */
static ssize_t read_text(int *fd, char *buf, size_t cap) {
  ssize_t n;

  if (*fd < 0)
    return -1;
  while ((n = pread(*fd, buf, cap - 1, 0)) < 0 && errno == EINTR)
    ;
  if (n < 0) {
    close(*fd);
    *fd = -1;
    return -1;
  }
  buf[n] = '\0';
  return n;
}

/* A number from a one-line cgroup file: "max" and v1's near-2^63 values
 * mean no limit (UINT64_MAX); a missing or unreadable file too. */
static uint64_t read_limit(int *fd) {
  char line[64], *end;
  unsigned long long v;

  if (read_text(fd, line, sizeof(line)) <= 0)
    return UINT64_MAX;
  v = strtoull(line, &end, 10);
  return end == line || v >= (1ull << 62) ? UINT64_MAX : v;
}

/* gshmd's memory cgroup folder into dir (cap bytes), from text
 * (/proc/self/cgroup), and its version's files; NULL where it has none.
 * v2 where the unified hierarchy is mounted at /sys/fs/cgroup
 * (cgroup.controllers there: the root cgroup has no memory.max), else the
 * v1 memory controller's line (a hybrid host's "0::" line is a v2
 * hierarchy without that controller). */
static const struct cg_files *cgroup_dir(char *text, char *dir, size_t cap) {
  bool v2 = !access("/sys/fs/cgroup/cgroup.controllers", F_OK);
  const struct cg_files *cg = NULL;
  char *line = text, *next;

  for (; line && *line && !cg; line = next) {
    char *p, *q;
    if ((next = strchr(line, '\n')))
      *next++ = '\0';
    if (!(p = strchr(line, ':')) || !(q = strchr(p + 1, ':')))
      continue;
    if (v2 && !strncmp(line, "0::", 3))
      cg = &cg_v2;
    else if (!v2 && (!strncmp(p, ":memory:", 8) || !strncmp(p, ":memory,", 8) ||
                     strstr(p, ",memory:") || strstr(p, ",memory,")))
      cg = &cg_v1;
    if (cg)
      snprintf(dir, cap, "%s%s", cg->root, q + 1);
  }
  if (!cg)
    return NULL;
  /* Inside a cgroup namespace the path may not exist under the mount:
   * then the mount's root is ours. */
  if (access(dir, F_OK))
    snprintf(dir, cap, "%s", cg->root);
  /* The root of a cgroup namespace ("0::/": a container's own) is the
   * mount's root, without the '/', which levels_open took for a level
   * and then, cut, for its parent: its files held and read twice. */
  for (size_t n = strlen(dir); n > strlen(cg->root) && dir[n - 1] == '/';)
    dir[--n] = '\0';
  return cg;
}

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

static void levels_close(struct gshmd_host_memory_files *f) {
  for (unsigned i = 0; i < f->nlevels; i++) {
    for (int k = 0; k < 3; k++)
      close_fd(&f->level[i].fd[k]);
    close_fd(&f->level[i].dir);
    free(f->level[i].path);
  }
  free(f->level);
  f->level = NULL;
  f->nlevels = 0;
  f->cg = NULL;
}

/* Opens the files of each level of the cgroup text (/proc/self/cgroup,
 * n bytes, kept in f->text; n -1: none) names, gshmd's own up to the
 * hierarchy's root.  Out of memory: no level (no limit known). */
static void levels_open(struct gshmd_host_memory_files *f, const char *text, ssize_t n) {
  char dir[PATH_MAX], copy[CGROUP_TEXT];
  unsigned levels = 1;

  levels_close(f);
  f->text_len = n;
  if (n < 0)
    return;
  memcpy(f->text, text, (size_t)n + 1);
  memcpy(copy, text, (size_t)n + 1);
  if (!(f->cg = cgroup_dir(copy, dir, sizeof(dir))))
    return;
  for (const char *p = dir + strlen(f->cg->root); *p; p++)
    levels += *p == '/';
  if (!(f->level = calloc(levels, sizeof(*f->level)))) {
    f->text_len = -2; /* (tried again at the next read) */
    return;
  }
  for (;;) {
    struct cg_level *l = &f->level[f->nlevels++];
    char *slash;
    l->dir = -1;
    l->path = strdup(dir); /* (NULL: a failed read is not retried) */
    for (int k = 0; k < 3; k++) {
      char path[PATH_MAX + 40];
      snprintf(path, sizeof(path), "%s/%s", dir, f->cg->file[k]);
      if ((l->fd[k] = open(path, O_RDONLY | O_CLOEXEC)) < 0 && l->dir < 0)
        l->dir = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (f->nlevels == levels || strlen(dir) <= strlen(f->cg->root) ||
        !(slash = strrchr(dir, '/')))
      break;
    *slash = '\0';
  }
}

/* After a read of level l: a file whose read failed (read_text closed it)
 * is opened again at the next read, through the level's folder, as one
 * missing at the start is; before, it stayed closed, its figure unknown
 * (no limit), until gshmd moved to another cgroup.  The folder is closed
 * again once every file is open. */
static void level_keep(struct cg_level *l) {
  bool missing = l->fd[0] < 0 || l->fd[1] < 0 || l->fd[2] < 0;

  if (missing && l->dir < 0 && l->path)
    l->dir = open(l->path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  else if (!missing)
    close_fd(&l->dir);
}

/* The tightest limits of gshmd's cgroup and its ancestors, and the least
 * room any of them leaves; the levels' files opened again first where
 * /proc/self/cgroup changed (gshmd moved). */
static void read_cgroup(struct gshmd_host_memory *m, struct gshmd_host_memory_files *f) {
  char text[CGROUP_TEXT];
  ssize_t n;

  if (f->self_cgroup < 0)
    f->self_cgroup = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
  n = read_text(&f->self_cgroup, text, sizeof(text));
  if (n != f->text_len || (n >= 0 && memcmp(text, f->text, (size_t)n)))
    levels_open(f, text, n);
  m->cg_mem = m->cg_swap = m->cg_room = UINT64_MAX;
  for (unsigned i = 0; i < f->nlevels; i++) {
    struct cg_level *l = &f->level[i];
    uint64_t lim, w, used;
    for (int k = 0; k < 3 && l->dir >= 0; k++) /* (a controller enabled since) */
      if (l->fd[k] < 0)
        l->fd[k] = openat(l->dir, f->cg->file[k], O_RDONLY | O_CLOEXEC);
    lim = read_limit(&l->fd[0]);
    w = read_limit(&l->fd[1]);
    if (lim != UINT64_MAX && (used = read_limit(&l->fd[2])) != UINT64_MAX)
      m->cg_room = min_u64(m->cg_room, lim > used ? lim - used : 0);
    level_keep(l);
    m->cg_mem = min_u64(m->cg_mem, lim);
    if (f->cg->memsw && w != UINT64_MAX)
      w = w > lim ? w - lim : 0;
    m->cg_swap = min_u64(m->cg_swap, w);
  }
}

/* MemTotal, SwapTotal, and MemAvailable + SwapFree from /proc/meminfo. */
static void read_meminfo(struct gshmd_host_memory *m, struct gshmd_host_memory_files *f) {
  static const char *const key[4] = {"MemTotal:", "SwapTotal:", "MemAvailable:", "SwapFree:"};
  char buf[8192], *line = buf, *next;
  unsigned long long avail = 0;
  unsigned navail = 0;

  m->ram = m->swap = m->avail = UINT64_MAX;
  if (f->meminfo < 0)
    f->meminfo = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (read_text(&f->meminfo, buf, sizeof(buf)) < 0)
    return;
  for (; *line; line = next) {
    if (!(next = strchr(line, '\n')))
      next = line + strlen(line);
    else
      *next++ = '\0';
    for (int k = 0; k < 4; k++) {
      size_t len = strlen(key[k]);
      char *end;
      unsigned long long kib;
      if (strncmp(line, key[k], len))
        continue;
      kib = strtoull(line + len, &end, 10);
      if (end == line + len)
        break;
      if (k == 0)
        m->ram = (uint64_t)kib * 1024;
      else if (k == 1)
        m->swap = (uint64_t)kib * 1024;
      else {
        avail += kib;
        navail++;
      }
      break;
    }
  }
  if (navail == 2)
    m->avail = (uint64_t)avail * 1024;
}

void gshmd_host_memory_update(struct gshmd_host_memory *m) {
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  struct gshmd_host_memory_files *f = m->files;

  if (m->read_ns && now - m->read_ns <= GSHMD_HOST_MEMORY_REREAD_NS)
    return;
  if (!f && (f = m->files = malloc(sizeof(*f)))) {
    f->meminfo = f->self_cgroup = -1;
    f->cg = NULL;
    f->level = NULL;
    f->nlevels = 0;
    f->text_len = -2; /* (never read: opened at this read whatever it finds) */
  }
  if (!f) { /* (out of memory: nothing known, nothing to fail) */
    m->ram = m->swap = m->avail = m->cg_mem = m->cg_swap = m->cg_room = UINT64_MAX;
    return;
  }
  read_meminfo(m, f);
  read_cgroup(m, f);
  m->read_ns = now;
}

void gshmd_host_memory_close(struct gshmd_host_memory *m) {
  if (!m || !m->files)
    return;
  levels_close(m->files);
  close_fd(&m->files->meminfo);
  close_fd(&m->files->self_cgroup);
  free(m->files);
  m->files = NULL;
}

/* ---- 2 MiB pages where shmem_enabled is never -------------------------- */

static pthread_once_t collapse_once = PTHREAD_ONCE_INIT;
static bool collapse_ok;
static atomic_uint_fast64_t collapsed;      /* bytes built */
static atomic_uint_fast64_t collapsed_again; /* bytes of gshmd_host_collapse_again's ranges */
static atomic_int_fast64_t collapse_resume; /* CLOCK_MONOTONIC ns: none before this */
static atomic_uint_fast64_t collapse_nomem;  /* collapses that found no free 2 MiB page */

/* Whether a collapse that found no free 2 MiB page stops building now. */
static bool backing_off(void) {
  int64_t resume = atomic_load_explicit(&collapse_resume, memory_order_relaxed);
  return resume && gshm__now_ns(CLOCK_MONOTONIC) < resume;
}

/* A collapse failed with err (a negative errno): no free 2 MiB page
 * (after compaction) stops building for a while. */
static void collapse_failed(int err) {
  if (err != -ENOMEM)
    return;
  atomic_fetch_add_explicit(&collapse_nomem, 1, memory_order_relaxed);
  atomic_store_explicit(&collapse_resume, gshm__now_ns(CLOCK_MONOTONIC) + COLLAPSE_BACKOFF_NS,
                        memory_order_relaxed);
}

static void collapse_try(void) {
  struct utsname u;
  int major = 0, minor = 0, fd;
  void *p;

  /* Before 6.5 a collapse took the address space's lock for writing to
   * map its page (collapse_pte_mapped_thp), stalling every lane's faults
   * on each 2 MiB page: not measured there, so not used there */
  if (uname(&u) || sscanf(u.release, "%d.%d", &major, &minor) != 2 ||
      (major < 6 || (major == 6 && minor < 5)))
    return;
  if ((fd = memfd_create("gshmd-collapse-probe", MFD_CLOEXEC)) < 0)
    return;
  if (ftruncate(fd, (off_t)GSHM__HUGE_PAGE) == 0 &&
      (p = gshm__map_shared_aligned(fd, GSHM__HUGE_PAGE, PROT_READ | PROT_WRITE)) != MAP_FAILED) {
    collapse_ok = madvise(p, 4096, MADV_POPULATE_WRITE) == 0 &&
                  madvise(p, GSHM__HUGE_PAGE, MADV_COLLAPSE) == 0;
    munmap(p, GSHM__HUGE_PAGE);
  }
  close(fd);
}

bool gshmd_host_collapse_works(void) {
  pthread_once(&collapse_once, collapse_try);
  return collapse_ok;
}

/* Pages being built now, by address (gshmd maps a pull's memfd once, and
 * its lanes and prefault pool build through that mapping): a thread
 * claims a page before it builds it (waiting while another holds it) and
 * looks at it again once it holds the claim, so that of threads racing
 * for one page one builds and counts it, and the others find it built
 * (or try it themselves where that one failed).  (MADV_COLLAPSE succeeds
 * on a page built already: counting its successes counted such a page
 * again for each thread that came after its builder.)  A thread holds
 * one claim at a time, for one page's build. */
#define BUILDING_SLOTS 128
static pthread_mutex_t building_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t building_done = PTHREAD_COND_INITIALIZER;
static uintptr_t building[BUILDING_SLOTS];

/* The slot of the page at p, or -1. */
static int page_slot(uintptr_t p) {
  for (int i = 0; i < BUILDING_SLOTS; i++)
    if (building[i] == p)
      return i;
  return -1;
}

/* Claims the page at p for this thread, once no other thread holds it:
 * 0, or -EAGAIN (no slot free: more builders at once than slots). */
static int page_claim(const uint8_t *p) {
  int slot;

  pthread_mutex_lock(&building_lock);
  while (page_slot((uintptr_t)p) >= 0)
    pthread_cond_wait(&building_done, &building_lock);
  if ((slot = page_slot(0)) >= 0)
    building[slot] = (uintptr_t)p;
  pthread_mutex_unlock(&building_lock);
  return slot >= 0 ? 0 : -EAGAIN;
}

/* Ends this thread's claim of the page at p (page_claim). */
static void page_release(const uint8_t *p) {
  pthread_mutex_lock(&building_lock);
  building[page_slot((uintptr_t)p)] = 0;
  pthread_cond_broadcast(&building_done);
  pthread_mutex_unlock(&building_lock);
}

/* Whether the 2 MiB page at p is in the page cache already: its last
 * 4 KiB is (built, by the pool or another lane, or written whole):
 * nothing to gain, and each MADV_COLLAPSE drains every CPU's LRU
 * batches first (lru_add_drain_all, one lock for the machine). */
static bool page_present(const uint8_t *p) {
  unsigned char last = 0;
  return mincore((void *)(p + GSHM__HUGE_PAGE - 4096), 4096, &last) == 0 && (last & 1);
}

/* Builds the claimed page at p (file offset foff of fd, or fd -1) and
 * counts it: 0 or a negative errno. */
static int page_build(uint8_t *p, int fd, uint64_t foff) {
  /* its first 4 KiB made through the fd where there is one: a page made
   * through the mapping is mapped, and the collapse's unmapping of it
   * flushes the TLB of every CPU gshmd's threads ran on (the lanes') */
  if ((fd < 0 || fallocate(fd, 0, (off_t)foff, 4096) < 0) &&
      madvise(p, 4096, MADV_POPULATE_WRITE) < 0)
    return -errno;
  if (madvise(p, GSHM__HUGE_PAGE, MADV_COLLAPSE) < 0)
    return -errno;
  atomic_fetch_add_explicit(&collapsed, GSHM__HUGE_PAGE, memory_order_relaxed);
  return 0;
}

int gshmd_host_collapse(void *addr, uint64_t len, int fd, uint64_t foff) {
  uint8_t *p = addr;
  int err = 0;

  for (uint64_t off = 0; off < len; off += GSHM__HUGE_PAGE) {
    int e;

    if (backing_off())
      return -EAGAIN;
    if (page_present(p + off))
      continue;
    if (!(e = page_claim(p + off))) {
      /* looked at again under the claim: a builder releases its claim
       * after its page is in the page cache */
      if (!page_present(p + off))
        e = page_build(p + off, fd, foff + off);
      page_release(p + off);
    }
    if (!e)
      continue;
    err = e;
    collapse_failed(err);
    if (err != -EAGAIN)
      return err;
    /* (EAGAIN: its pages busy, a writer holding one, say; the next page
     * is another matter) */
  }
  return err;
}

int gshmd_host_collapse_again(void *addr, uint64_t len) {
  int err;

  len = (len + GSHM__HUGE_PAGE - 1) / GSHM__HUGE_PAGE * GSHM__HUGE_PAGE;
  if (backing_off())
    return -EAGAIN;
  /* (one call: each MADV_COLLAPSE drains every CPU's LRU batches first,
   * and a page built already costs a look) */
  if (!len || madvise(addr, len, MADV_COLLAPSE) == 0) {
    atomic_fetch_add_explicit(&collapsed_again, len, memory_order_relaxed);
    return 0;
  }
  err = -errno;
  collapse_failed(err);
  return err;
}

uint64_t gshmd_host_collapsed_bytes(void) {
  return atomic_load_explicit(&collapsed, memory_order_relaxed);
}

uint64_t gshmd_host_collapsed_again_bytes(void) {
  return atomic_load_explicit(&collapsed_again, memory_order_relaxed);
}

uint64_t gshmd_host_collapse_nomem(void) {
  return atomic_load_explicit(&collapse_nomem, memory_order_relaxed);
}
