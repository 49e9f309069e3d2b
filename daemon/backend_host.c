/* Host backend: one sealed memfd per segment.
 *
 * The memfd is sized with ftruncate and sealed against shrinking, growing
 * and further sealing, so a client can never truncate it under another
 * client's mapping (SIGBUS).  Memory is committed lazily by the kernel as
 * pages are touched. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"

#define HOST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct host_alloc {
  struct gshmd_alloc base;
  int memfd;
  int ro_fd; /* O_RDONLY reopen for read-only leases, made on first use */
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
  h->ro_fd = -1;
  *out = &h->base;
  return 0;
}

static int host_alloc(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
                      uint32_t flags, const char *debug_name, struct gshmd_alloc **out) {
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

static int host_export_fd(struct gshmd_backend *b, struct gshmd_alloc *a, bool writable,
                          int *fd_out) {
  struct host_alloc *h = a->priv;
  char path[64];

  (void)b;
  if (writable) {
    *fd_out = h->memfd;
    return 0;
  }
  if (h->ro_fd < 0) {
    /* A new open file description with O_RDONLY: the kernel then refuses
     * PROT_WRITE shared mappings and write(2) on it (EACCES), so a
     * read-only lease cannot write, whatever the client does. */
    snprintf(path, sizeof(path), "/proc/self/fd/%d", h->memfd);
    h->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (h->ro_fd < 0) {
      int r = -errno;
      gshm_log_err("host: read-only reopen of a memfd: %m");
      return r;
    }
  }
  *fd_out = h->ro_fd;
  return 0;
}

static int host_park_fd(struct gshmd_backend *b, struct gshmd_alloc *a, int *fd_out) {
  struct host_alloc *h = a->priv;
  (void)b;
  *fd_out = fcntl(h->memfd, F_DUPFD_CLOEXEC, 3);
  return *fd_out < 0 ? -errno : 0;
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
  /* parked by a gshmd that left memfds 0777 (see host_alloc) */
  if ((st.st_mode & 07777) != 0600 && fchmod(fd, 0600) < 0)
    return -errno;
  return host_wrap(b, fd, size, out);
}

static void host_free(struct gshmd_backend *b, struct gshmd_alloc *a) {
  struct host_alloc *h;

  (void)b;
  if (!a)
    return;
  h = a->priv;
  if (h->memfd >= 0)
    close(h->memfd);
  if (h->ro_fd >= 0)
    close(h->ro_fd);
  free(h);
}

static void host_destroy(struct gshmd_backend *b) { free(b); }

static const struct gshmd_backend_ops host_ops = {
    .alloc = host_alloc,
    .export_fd = host_export_fd,
    .park_fd = host_park_fd,
    .adopt_fd = host_adopt_fd,
    .free = host_free,
    .destroy = host_destroy,
};

int gshmd_backend_host_create(const struct gshmd_config *cfg, struct gshmd_backend **out) {
  struct gshmd_backend *b = calloc(1, sizeof(*b));

  (void)cfg;
  if (!b)
    return -ENOMEM;
  b->name = "host";
  b->ops = &host_ops;
  *out = b;
  return 0;
}
