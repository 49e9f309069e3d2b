/* SPDX-License-Identifier: Apache-2.0 */
/* Host backend: one sealed memfd per segment.
 *
 * The memfd is sized with ftruncate and sealed against shrinking, growing
 * and further sealing, so a client can never truncate it under another
 * client's mapping (SIGBUS).  Memory is committed lazily by the kernel as
 * pages are touched, unless daemon.host_populate asks for every page at
 * create time; either way a segment larger than the memory the machine
 * (RAM + swap) or gshmd's cgroup can give is refused up front, since its
 * pages could never all exist and a write into it would take SIGBUS.
 *
 * Recycling (daemon.host_recycle): a pull's memory, once freed, may keep
 * its pages and gshmd's mapping for a later pull of the same size, which
 * then lands without a page-table fault per page (docs/CLUSTER.md).  Only
 * when no other process can reach it: see recycle_keep. */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "host_memory.h"
#include "host_reap.h"
#include "list.h"
#include "log.h"
#include "util.h"

#define HOST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* The backend's state: the config's choice and the node's memory
 * figures (host_memory.h: re-read at most every 100 ms). */
struct host_backend {
  struct gshmd_backend base;
  bool populate;
  struct gshmd_host_memory mem;
  /* the recycling pool: struct pooled, oldest first */
  uint64_t recycle_cap;        /* bytes (daemon.host_recycle); 0: off */
  bool huge;                   /* daemon.host_huge_pages: MADV_HUGEPAGE on gshmd's mappings */
  bool collapse;               /* and shmem_enabled never: pulls' 2 MiB pages are built
                                  with MADV_COLLAPSE (host_memory.h) */
  uint64_t pull_page;          /* bytes: what a pull of at least one 2 MiB page rounds to
                                  (GSHMD_HUGE_PAGE where the kernel gives shared memory 2 MiB pages
                                  under huge; else the system page) */
  unsigned kept_live;          /* live allocations whose mapping is kept (at most POOL_MAX) */
  struct gshm_list pool;
  struct gshmd_host_recycle_stats stats;
  bool lease_warned;           /* a lease refused for another reason than a holder: said once */
  struct gshmd_host_reaper *reaper; /* large frees off the loop (host_reap.h); NULL: none */
  uint64_t reap_steps;              /* its punch steps that mem was read after */
  uid_t memory_uid;                 /* whose memfds are (config.h memory_uid) */
  unsigned foreign;                 /* adopted memfds left another uid's (said once) */
};

/* Most allocations in the pool (a take scans it). */
#define POOL_MAX GSHMD_HOST_RECYCLE_MAX

struct host_alloc {
  struct gshmd_alloc base;
  int memfd; /* gshmd's own open file description: never sent to a client */
  int ro_fd; /* O_RDONLY reopen for read-only leases, made on first use */
  int rw_fd; /* O_RDWR reopen for read-write leases, made on first use */
  void *map; /* gshmd's mapping of memfd (local_ptr), NULL until asked */
  bool kept; /* map kept past local_done for recycling (counted in kept_live) */
  bool recyclable; /* alloc_pull's, by this process, recycling on: may enter the pool */
};

/* Freed memory in the pool: its memfd and gshmd's mapping of it. */
struct pooled {
  struct gshm_list node;
  int memfd;
  void *map;
  uint64_t size;
  enum gshmd_reach reach;
  uint32_t reach_uid;
};

static int host_wrap(struct gshmd_backend *b, int fd, uint64_t size, struct gshmd_alloc **out) {
  struct host_alloc *h = calloc(1, sizeof(*h));
  if (!h)
    return -ENOMEM;
  h->base.backend = b;
  h->base.size = size;
  h->base.granularity = (uint64_t)sysconf(_SC_PAGESIZE);
  h->base.device_index = -1;
  strcpy(h->base.location, "host");
  h->base.priv = h;
  h->memfd = fd;
  h->ro_fd = h->rw_fd = -1;
  *out = &h->base;
  return 0;
}

static uint64_t sum_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Refuses a host segment larger than what the machine (RAM + swap) or
 * gshmd's cgroup (its memory limit + what swap it may use) can give,
 * with the figures. */
static int host_check_size(struct gshmd_backend *b, const struct gshm_location *loc,
                           uint64_t size, char *msg, size_t cap) {
  struct host_backend *hb = (struct host_backend *)b;
  uint64_t machine, cgroup, swap;
  char a[32], r[32], w[32];

  if (loc->kind != GSHM_LOCATION_HOST)
    return 0;
  gshmd_host_memory_update(&hb->mem);
  machine = sum_sat(hb->mem.ram, hb->mem.swap);
  swap = hb->mem.cg_swap < hb->mem.swap ? hb->mem.cg_swap : hb->mem.swap;
  cgroup = hb->mem.cg_mem == UINT64_MAX ? UINT64_MAX : sum_sat(hb->mem.cg_mem, swap);
  if (size > machine) {
    snprintf(msg, cap, "a host segment of %s is larger than this machine's memory: %s RAM + %s "
             "swap",
             gshm__format_size(size, a, sizeof(a)), gshm__format_size(hb->mem.ram, r, sizeof(r)),
             gshm__format_size(hb->mem.swap, w, sizeof(w)));
    return -EFBIG;
  }
  if (size > cgroup) {
    snprintf(msg, cap, "a host segment of %s is larger than gshmd's cgroup may use: memory limit "
             "%s + %s swap",
             gshm__format_size(size, a, sizeof(a)),
             gshm__format_size(hb->mem.cg_mem, r, sizeof(r)),
             gshm__format_size(swap, w, sizeof(w)));
    return -EFBIG;
  }
  return 0;
}

/* A new memfd of size bytes; populate: every page allocated now
 * (daemon.host_populate: clients' creates, never a pull's). */
static int host_alloc_memfd(struct gshmd_backend *b, const struct gshm_location *loc,
                            uint64_t size, uint32_t flags, const char *debug_name, bool populate,
                            struct gshmd_alloc **out) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  char label[64];
  int fd, r;

  if (loc->kind != GSHM_LOCATION_HOST || size == 0)
    return -EINVAL;
  if (flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC)
    return -ENOTSUP;
  if (size > UINT64_MAX - page || size > (uint64_t)INT64_MAX - page)
    return -EFBIG;
  size = (size + page - 1) / page * page;
  /* The label shows in /proc/PID/maps of every client ("memfd:gshm:NAME"). */
  snprintf(label, sizeof(label), "gshm:%s", debug_name);
  fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    r = -errno;
    gshm_log_err("host: memfd_create: %m");
    return r;
  }
  /* memfd_create makes the inode 0777: a client holding a read-only fd
   * could reopen it read-write through /proc/self/fd.  Only gshmd's uid
   * may open it by path. */
  if (fchmod(fd, 0600) < 0) {
    r = -errno;
    gshm_log_err("host: fchmod of a memfd: %m");
    close(fd);
    return r;
  }
  if (ftruncate(fd, (off_t)size) < 0) {
    r = errno == EFBIG || errno == EINVAL ? -EFBIG : -ENOMEM;
    gshm_log_err("host: ftruncate %llu bytes: %m", (unsigned long long)size);
    close(fd);
    return r;
  }
  /* daemon.host_populate: every page now, so that a create fails at once
   * when memory is short instead of a later write taking SIGBUS. */
  if (populate && fallocate(fd, 0, 0, (off_t)size) < 0) {
    r = errno == ENOSPC || errno == ENOMEM ? -ENOMEM : -errno;
    gshm_log_notice("host: populating %llu bytes: %m", (unsigned long long)size);
    close(fd);
    return r;
  }
  if (fcntl(fd, F_ADD_SEALS, HOST_SEALS) < 0) {
    r = -errno;
    gshm_log_err("host: F_ADD_SEALS: %m");
    close(fd);
    return r;
  }
  r = host_wrap(b, fd, size, out);
  if (r)
    close(fd);
  return r;
}

static int host_alloc(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
                      uint32_t flags, const char *debug_name, struct gshmd_alloc **out) {
  return host_alloc_memfd(b, loc, size, flags, debug_name, ((struct host_backend *)b)->populate,
                          out);
}

/* A new open file description of h's memfd (O_RDONLY or O_RDWR) in
 * *fd, made on first use.  The kernel refuses PROT_WRITE shared mappings
 * and write(2) on an O_RDONLY one (EACCES), so a read-only lease cannot
 * write, whatever the client does; and neither kind is gshmd's own, so
 * recycle_keep can tell whether a client still holds one. */
static int host_reopen(struct host_alloc *h, int flags, int *fd) {
  char path[64];

  if (*fd < 0) {
    snprintf(path, sizeof(path), "/proc/self/fd/%d", h->memfd);
    if ((*fd = open(path, flags | O_CLOEXEC)) < 0) {
      int r = -errno;
      gshm_log_err("host: reopen of a memfd: %m");
      return r;
    }
  }
  return 0;
}

/* A read-write lease of memory that may be recycled gets a reopen too
 * (else gshmd's own description: one fd per segment, which the fd
 * store's limits count on: docs/ARCHITECTURE.md "The fd store"). */
static int host_export_fd(struct gshmd_backend *b, struct gshmd_alloc *a, bool writable,
                          int *fd_out) {
  struct host_alloc *h = a->priv;
  int *fd = writable ? &h->rw_fd : &h->ro_fd;
  int r;

  (void)b;
  if (writable && !h->recyclable) {
    *fd_out = h->memfd;
    return 0;
  }
  if ((r = host_reopen(h, writable ? O_RDWR : O_RDONLY, fd)))
    return r;
  *fd_out = *fd;
  return 0;
}

static int host_park_fd(struct gshmd_backend *b, struct gshmd_alloc *a, int *fd_out) {
  struct host_alloc *h = a->priv;
  (void)b;
  *fd_out = h->memfd;
  return 0;
}

/* A memfd stored by a gshmd of another user (root before daemon.user, or
 * the other way) is given to gshmd's: each lease reopens it through
 * /proc/self/fd (host_reopen), and its mode 0600 lets only its owner in.
 * fchown needs CAP_CHOWN, which gshmd has before its switch
 * (gshmd.service); refused, the segment is kept (a client holding its fd
 * keeps its bytes) but opening it fails EACCES: said once, with the way
 * out. */
static void adopt_owner(struct host_backend *hb, int fd, struct stat *st) {
  if (st->st_uid == hb->memory_uid)
    return;
  if (fchown(fd, hb->memory_uid, (gid_t)-1) == 0) {
    st->st_uid = hb->memory_uid;
    return;
  }
  if (hb->foreign++ == 0)
    gshm_log_err("host: a restored segment's memory belongs to uid %u, not to gshmd's user (uid "
                 "%u), and cannot be given to it (fchown: %m; CAP_CHOWN, which gshmd.service "
                 "grants until gshmd's switch to daemon.user): opening it fails EACCES until "
                 "gshmd runs as uid %u again", (unsigned)st->st_uid, (unsigned)hb->memory_uid,
                 (unsigned)st->st_uid);
}

static int host_adopt_fd(struct gshmd_backend *b, int fd, const char *location, uint64_t size,
                         struct gshmd_alloc **out) {
  struct stat st;
  int seals;

  if (strcmp(location, "host"))
    return -EINVAL;
  /* Trust nothing we are handed back: it must be our sealed memfd of the
   * recorded size. */
  seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & HOST_SEALS) != HOST_SEALS || fstat(fd, &st) < 0 ||
      (uint64_t)st.st_size != size)
    return -EINVAL;
  /* parked by a gshmd that left memfds 0777 (see host_alloc); before the
   * file is given away: root without CAP_FOWNER may chmod only its own */
  if ((st.st_mode & 07777) != 0600 && fchmod(fd, 0600) < 0)
    return -errno;
  adopt_owner((struct host_backend *)b, fd, &st);
  return host_wrap(b, fd, size, out);
}

/* gshmd's mapping of the allocation, read-write, made on first use: a
 * pull's chunks land in it.  Kept until ->free (or ->local_done of
 * memory that may not be recycled), and into the pool with the memory. */
static int host_local_ptr(struct gshmd_backend *b, struct gshmd_alloc *a, void **ptr_out) {
  struct host_alloc *h = a->priv;
  void *p;

  if (!h->map) {
    /* (2 MiB aligned: a 2 MiB page maps whole only there) */
    p = gshm__map_shared_aligned(h->memfd, a->size, PROT_READ | PROT_WRITE);
    if (p == MAP_FAILED) {
      gshm_log_err("host: mapping %llu bytes of a memfd: %m", (unsigned long long)a->size);
      return -ENOMEM;
    }
    gshmd_host_map_advise(p, a->size, ((struct host_backend *)b)->huge);
    h->map = p;
  }
  *ptr_out = h->map;
  return 0;
}

/* A pull is done with the mapping: kept for recycling (each mapping is a
 * VMA of gshmd's vm.max_map_count, 65530 by default: at most POOL_MAX
 * live ones are kept, as many as the pool holds), else unmapped. */
static void host_local_done(struct gshmd_backend *b, struct gshmd_alloc *a) {
  struct host_backend *hb = (struct host_backend *)b;
  struct host_alloc *h = a->priv;

  if (!h->map || h->kept)
    return;
  if (h->recyclable && hb->recycle_cap && !a->no_recycle && hb->kept_live < POOL_MAX) {
    h->kept = true;
    hb->kept_live++;
    return;
  }
  munmap(h->map, a->size);
  h->map = NULL;
}

/* h's mapping is no longer kept past local_done (pooled or freed). */
static void unkeep(struct host_backend *hb, struct host_alloc *h) {
  if (h->kept) {
    h->kept = false;
    hb->kept_live--;
  }
}

static void *host_local_take(struct gshmd_backend *b, struct gshmd_alloc *a) {
  struct host_alloc *h = a->priv;
  void *map = h->map;

  unkeep((struct host_backend *)b, h);
  h->map = NULL; /* (not pooled without it: recycle_keep) */
  a->no_recycle = true;
  return map;
}

static void pooled_free(struct host_backend *hb, struct pooled *e) {
  gshm_list_del(&e->node);
  hb->stats.bytes_held -= e->size;
  hb->stats.entries--;
  /* (punched: the pool's memory is gshmd's alone, so the punch frees it
   * as the close would, and counts among what is coming back) */
  gshmd_host_reap(hb->reaper, (const int[3]){e->memfd, -1, -1}, e->map, e->size, true);
  free(e);
}

/* Whether any open file description of h's memfd but gshmd's own is
 * left, anywhere: a client's fd (or a copy in flight in a socket), a
 * mapping (which holds its description), a reopen through /proc.  The
 * kernel grants a write lease only to a description whose inode has no
 * other reader or writer description (fs/locks.c check_conflicting_open:
 * i_writecount and i_readcount must be the lease taker's own).
 * memfd_create's own description counts in neither (alloc_file_pseudo
 * takes no write access; checked on 6.18: a lease on it is refused even
 * alone), so the lease is asked on a fresh O_RDWR reopen, which counts
 * itself once; gshmd's description, its dups (the fd store's) and
 * gshmd's mapping count nothing, and no client ever gets them
 * (host_export_fd reopens).  Leases off (fs.leases-enable = 0) or
 * refused: held (said once: then nothing is ever kept). */
static bool others_hold(struct host_backend *hb, struct host_alloc *h) {
  int probe = -1;
  bool held = true;

  if (host_reopen(h, O_RDWR, &probe))
    return true;
  if (fcntl(probe, F_SETLEASE, F_WRLCK) == 0) {
    held = false;
    fcntl(probe, F_SETLEASE, F_UNLCK);
  } else if (errno != EAGAIN && !hb->lease_warned) {
    hb->lease_warned = true;
    /* (said once: not held back by the log limit of the uid whose
     * close or unlink this is, docs/SECURITY.md) */
    gshm__log(GSHM_LOG_NOTICE | GSHM_LOG_UNGATED,
              "host: no write lease on a memfd (%m): daemon.host_recycle keeps nothing "
              "(fs.leases-enable?)");
  }
  close(probe);
  return held;
}

/* At discard: moves h's memfd and mapping into the pool when that is
 * safe, evicting the oldest beyond daemon.host_recycle.  Safe means: made
 * by alloc_pull in this process (an adopted memfd may have gone to
 * clients as itself from an older gshmd: nothing could tell), and no
 * open file description but gshmd's own is left (others_hold).  What
 * neither shows, page references a mapping let a process take (a pipe's
 * after vmsplice, io_uring fixed buffers, RDMA or CUDA registrations),
 * is why the memory keeps its reach: it goes back only to a pull by the
 * one user its fds went to.  Returns whether h's memory is pooled. */
static bool recycle_keep(struct host_backend *hb, struct host_alloc *h) {
  uint64_t size = h->base.size;
  struct pooled *e;

  if (!hb->recycle_cap || !h->recyclable || !h->map || !h->kept || h->base.no_recycle ||
      size > hb->recycle_cap)
    return false;
  /* gshmd's reopens go now (free would close them): what is left of
   * them is a client's */
  if (h->ro_fd >= 0)
    close(h->ro_fd);
  if (h->rw_fd >= 0)
    close(h->rw_fd);
  h->ro_fd = h->rw_fd = -1;
  if (others_hold(hb, h)) {
    hb->stats.refused_held++;
    return false;
  }
  if (!(e = calloc(1, sizeof(*e))))
    return false;
  e->memfd = h->memfd;
  e->map = h->map;
  e->size = size;
  e->reach = h->base.reach;
  e->reach_uid = h->base.reach_uid;
  unkeep(hb, h);
  h->memfd = -1;
  h->map = NULL;
  gshm_list_add_tail(&hb->pool, &e->node);
  hb->stats.bytes_held += size;
  hb->stats.entries++;
  while (hb->stats.bytes_held > hb->recycle_cap || hb->stats.entries > POOL_MAX)
    pooled_free(hb, gshm_list_entry(hb->pool.next, struct pooled, node));
  return true;
}

/* Punches every page out of the memfd (the seals forbid growing and
 * shrinking, not this): a client that kept its own copy of the fd after
 * the segment was freed keeps no memory: the node's memory accounting
 * stays true once the segment is gone.  Unless the memory is recycled. */
static void host_discard(struct gshmd_backend *b, struct gshmd_alloc *a) {
  struct host_alloc *h = a->priv;

  if (recycle_keep((struct host_backend *)b, h))
    return;
  /* now, not at host_free: a peer's grant keeps the allocation after its
   * segment is revoked or freed (cluster/serve_reg.c export_reg_wipe),
   * and must keep no pages meanwhile; on the reaper thread when large */
  gshmd_host_reap_punch(((struct host_backend *)b)->reaper, h->memfd, a->size);
}

/* The newest pooled memory of exactly size bytes that uid may have (no
 * other user's client ever had its fd), or NULL. */
static struct pooled *pool_find(struct host_backend *hb, uint64_t size, uint32_t uid) {
  struct gshm_list *pos;

  for (pos = hb->pool.prev; pos != &hb->pool; pos = pos->prev) {
    struct pooled *e = gshm_list_entry(pos, struct pooled, node);
    if (e->size == size &&
        (e->reach == GSHMD_REACH_NONE || (e->reach == GSHMD_REACH_ONE && e->reach_uid == uid)))
      return e;
  }
  return NULL;
}

static int host_alloc_pull(struct gshmd_backend *b, const struct gshm_location *loc,
                           uint64_t size, uint32_t uid, struct gshmd_alloc **out) {
  struct host_backend *hb = (struct host_backend *)b;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), alloc;
  struct host_alloc *h;
  struct pooled *e;
  int r;

  /* A pull of 2 MiB or more is made in whole 2 MiB pages where the kernel
   * gives them: the last page's 4 KiB pieces would each take a fault while
   * the pull's lane threads write them (a 5.5 MiB tensor's 1.5 MiB tail
   * took 1.73 ms against 0.98 ms for a whole 2 MiB frame,
   * docs/PERFORMANCE.md "What a set of small segments waits on"); the
   * segment's size says so, its requested size stays, as a device
   * segment's granularity does.  Smaller pulls keep 4 KiB rounding: they
   * would grow up to 512 times. */
  if (size >= GSHMD_HUGE_PAGE)
    page = hb->pull_page;
  if (size > UINT64_MAX - page || size > (uint64_t)INT64_MAX - page)
    return -EFBIG;
  alloc = (size + page - 1) / page * page;
  /* Never populated here, daemon.host_populate or not: a set's host
   * segments are made at its listing, their sizes the peer's word, and
   * one whose peer then sent no byte had every listed page allocated.  A
   * pull's pages come as its bytes land, each before it is named; the
   * pull populates the tail past its bytes (gshmd__prefault_all_in). */
  if (loc->kind == GSHM_LOCATION_HOST && size && (e = pool_find(hb, alloc, uid))) {
    if ((r = host_wrap(b, e->memfd, e->size, out)))
      return r;
    h = (*out)->priv;
    h->map = e->map;
    /* page references of the earlier holders stay: so does their reach */
    h->base.reach = e->reach;
    h->base.reach_uid = e->reach_uid;
    /* the pull writes [0, size); the page's tail is the old owner's */
    memset((uint8_t *)e->map + size, 0, e->size - size);
    e->memfd = -1;
    gshm_list_del(&e->node);
    hb->stats.bytes_held -= e->size;
    hb->stats.entries--;
    hb->stats.pulls++;
    free(e);
  } else if ((r = host_alloc_memfd(b, loc, alloc, 0, "pull", false, out))) {
    return r;
  }
  ((struct host_alloc *)(*out)->priv)->recyclable = hb->recycle_cap != 0;
  return 0;
}

static void host_free(struct gshmd_backend *b, struct gshmd_alloc *a) {
  struct host_alloc *h;

  if (!a)
    return;
  h = a->priv;
  unkeep((struct host_backend *)b, h);
  gshmd_host_reap(((struct host_backend *)b)->reaper, (const int[3]){h->memfd, h->ro_fd, h->rw_fd},
                  h->map, a->size, false);
  free(h);
}

static void host_destroy(struct gshmd_backend *b) {
  struct host_backend *hb = (struct host_backend *)b;

  while (!gshm_list_empty(&hb->pool))
    pooled_free(hb, gshm_list_entry(hb->pool.next, struct pooled, node));
  gshmd_host_reap_stop(hb->reaper);
  gshmd_host_memory_close(&hb->mem);
  free(b);
}

static const struct gshmd_backend_ops host_ops = {
    .check_size = host_check_size,
    .alloc = host_alloc,
    .alloc_pull = host_alloc_pull,
    .export_fd = host_export_fd,
    .park_fd = host_park_fd,
    .adopt_fd = host_adopt_fd,
    .discard = host_discard,
    .local_ptr = host_local_ptr,
    .local_done = host_local_done,
    .local_take = host_local_take,
    .free = host_free,
    .destroy = host_destroy,
};

void gshmd_backend_host_recycle_stats(const struct gshmd_backend *b,
                                      struct gshmd_host_recycle_stats *out) {
  memset(out, 0, sizeof(*out));
  if (b && b->ops == &host_ops)
    *out = ((const struct host_backend *)b)->stats;
}

void gshmd_host_map_advise(void *addr, uint64_t len, bool huge) {
  (void)madvise(addr, len, MADV_DONTDUMP);
  if (huge)
    (void)madvise(addr, len, MADV_HUGEPAGE);
}

bool gshmd_thp_policy(const char *file, char *out, size_t cap) {
  char path[128], buf[128] = "", *l, *r;
  FILE *f;

  snprintf(path, sizeof(path), "/sys/kernel/mm/transparent_hugepage/%s", file);
  if ((f = fopen(path, "re"))) {
    if (!fgets(buf, sizeof(buf), f))
      buf[0] = 0;
    fclose(f);
  }
  if (cap)
    out[0] = 0;
  if (!(l = strchr(buf, '[')) || !(r = strchr(l, ']')))
    return false;
  *r = 0;
  snprintf(out, cap, "%s", l + 1);
  return true;
}

/* Says once at start how gshmd's mappings of pulled host segments get
 * 2 MiB pages, and returns it: 1 MADV_HUGEPAGE (the kernel's policy for
 * shared memory lets it), 2 built with MADV_COLLAPSE (the policy is
 * never: host_memory.h), 0 none. */
static int huge_report(void) {
  char word[64];

  if (!gshmd_thp_policy("shmem_enabled", word, sizeof(word))) {
    gshm_log_info("host: no transparent huge pages for shared memory here: host segments "
                  "use 4 KiB pages");
    return 0;
  }
  if (!strcmp(word, "never") && gshmd_host_collapse_works()) {
    gshm_log_info("host: transparent_hugepage/shmem_enabled is never: a pull of 2 MiB or more "
                  "builds its segment's 2 MiB pages (MADV_COLLAPSE) as its bytes come; clients' "
                  "own host segments use 4 KiB pages");
    return 2;
  }
  if (!strcmp(word, "never") || !strcmp(word, "deny")) {
    gshm_log_info("host: host segments use 4 KiB pages (transparent_hugepage/shmem_enabled is "
                  "%s%s; with advise, pulls into new host segments make their pages several "
                  "times faster: docs/CLUSTER.md)", word,
                  strcmp(word, "deny") ? " and MADV_COLLAPSE builds no 2 MiB page here: it "
                                         "needs Linux 6.5 and a free 2 MiB page" : "");
    return 0;
  }
  gshm_log_info("host: 2 MiB pages where gshmd maps host segments (pulls, serving; a pull of "
                "2 MiB or more is made in whole 2 MiB pages): "
                "transparent_hugepage/shmem_enabled is %s", word);
  return 1;
}

uint64_t gshmd_backend_host_room(struct gshmd_backend *b) {
  struct host_backend *hb = (struct host_backend *)b;

  if (!b || b->ops != &host_ops)
    return UINT64_MAX;
  uint64_t steps = gshmd_host_reap_steps(hb->reaper), coming, room;

  if (steps != hb->reap_steps) /* (a punch gave pages back: the figures are stale) */
    hb->mem.read_ns = 0;
  hb->reap_steps = steps;
  gshmd_host_memory_update(&hb->mem);
  /* (read after the figures: a step that ends between is counted in
   * neither, rather than in both) */
  coming = gshmd_host_reap_pending(hb->reaper);
  /* Punches queued count for the node only: a client's pages are charged
   * to the client's cgroup, not to gshmd's, and which pages of a memfd
   * are gshmd's is not known. */
  room = sum_sat(hb->mem.avail, coming);
  return room < hb->mem.cg_room ? room : hb->mem.cg_room;
}

bool gshmd_backend_host_huge_pulls(const struct gshmd_backend *b) {
  return b && ((const struct host_backend *)b)->pull_page >= GSHMD_HUGE_PAGE;
}

int gshmd_backend_host_memfd(const struct gshmd_alloc *a) {
  return a && a->backend && a->backend->ops == &host_ops ? ((const struct host_alloc *)a->priv)->memfd
                                                         : -1;
}

bool gshmd_backend_host_collapse(const struct gshmd_backend *b) {
  return b && b->ops == &host_ops && ((const struct host_backend *)b)->collapse;
}

int gshmd_backend_host_create(const struct gshmd_config *cfg, struct gshmd_backend **out) {
  struct host_backend *hb = calloc(1, sizeof(*hb));
  int huge = 0;

  if (!hb)
    return -ENOMEM;
  hb->base.name = "host";
  hb->base.ops = &host_ops;
  hb->populate = cfg && cfg->host_populate;
  hb->recycle_cap = cfg ? cfg->host_recycle : 0;
  hb->huge = cfg && cfg->host_huge_pages;
  hb->memory_uid = cfg ? (uid_t)cfg->memory_uid : geteuid();
  hb->pull_page = (uint64_t)sysconf(_SC_PAGESIZE);
  if (hb->huge && (huge = huge_report()) && hb->pull_page < GSHMD_HUGE_PAGE)
    hb->pull_page = GSHMD_HUGE_PAGE;
  hb->collapse = huge == 2 && hb->pull_page == GSHMD_HUGE_PAGE;
  gshm_list_init(&hb->pool);
  (void)gshmd_host_reap_start(&hb->reaper); /* (without it: at once, on the loop) */
  gshmd_host_memory_update(&hb->mem); /* (its files opened now: gshmd's fds settle at start) */
  *out = &hb->base;
  return 0;
}
