/* SPDX-License-Identifier: Apache-2.0 */
/* gshm_map / gshm_unmap and byte access (gshm_read / gshm_write). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "client_internal.h"
#include "fork.h"
#include "log.h"
#include "util.h"

static bool is_host(const struct gshm__lease *l) { return l->info.device_index < 0; }

/* Whether a host segment's fd can back a mapping of info.size bytes: a
 * memfd at least that long, sealed against shrinking.  The size comes
 * from the daemon's reply; a mapping past the file's end, or a file that
 * any holder of a writable fd could truncate later, gives SIGBUS on
 * access instead of an error.  gshmd seals every host segment
 * (F_SEAL_SHRINK | F_SEAL_GROW): anything else is -EPROTO. */
static int host_fd_check(const struct gshm__lease *l) {
  struct stat st;
  int seals = fcntl(l->fd, F_GET_SEALS);

  if (fstat(l->fd, &st) < 0)
    return -errno;
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || st.st_size < 0 ||
      (uint64_t)st.st_size < l->info.size || l->info.size == 0) {
    gshm_log_err("segment '%s': the daemon's fd does not hold its %llu bytes (%lld, seals %#x)",
                 l->info.name, (unsigned long long)l->info.size, (long long)st.st_size,
                 (unsigned)seals);
    return -EPROTO;
  }
  return 0;
}

/* This process's read-only host mappings (gshm_map of a read-only
 * lease), newest first, for gshm__host_read_only.  Under GSHM__LOCK_GPUS
 * (the device mappings' lock: kernels/copy.c asks both at one point). */
static struct gshm__lease *ro_host;

static void ro_host_add(struct gshm__lease *l) {
  gshm__fork_lock(GSHM__LOCK_GPUS);
  l->ro_next = ro_host;
  ro_host = l;
  l->ro_listed = true;
  gshm__fork_unlock(GSHM__LOCK_GPUS);
}

static void ro_host_remove(struct gshm__lease *l) {
  if (!l->ro_listed)
    return;
  gshm__fork_lock(GSHM__LOCK_GPUS);
  for (struct gshm__lease **pp = &ro_host; *pp; pp = &(*pp)->ro_next)
    if (*pp == l) {
      *pp = l->ro_next;
      break;
    }
  l->ro_listed = false;
  gshm__fork_unlock(GSHM__LOCK_GPUS);
}

int gshm__host_read_only(uintptr_t addr, size_t bytes) {
  int found = 0;

  gshm__fork_lock(GSHM__LOCK_GPUS);
  for (struct gshm__lease *l = ro_host; l && !found; l = l->ro_next) {
    uintptr_t va = (uintptr_t)l->addr;
    found = addr <= va ? bytes > va - addr : addr - va < l->map_size;
  }
  gshm__fork_unlock(GSHM__LOCK_GPUS);
  return found;
}

/* Maps l once; later callers share the mapping, and devices they list
 * that lack access get it.  Caller holds the lock. */
static int lease_map(struct gshm__lease *l, const int *devices, size_t ndevices) {
  char **uuids = NULL;
  size_t nuuids = 0;
  int e;

  if (l->addr && is_host(l))
    return devices || ndevices ? -EINVAL : 0;
  if (l->addr) {
    if ((e = gshm__map_device_add(l, devices, ndevices, &uuids, &nuuids)))
      return e;
    if (nuuids) /* access added: the report lists every device now */
      gshm__report_mapping(l->client, l, uuids, nuuids, false);
    return 0;
  }
  if (is_host(l)) {
    int prot = PROT_READ | (l->access == GSHM_ACCESS_READ_WRITE ? PROT_WRITE : 0);
    void *p;
    if (devices || ndevices)
      return -EINVAL;
    if ((e = host_fd_check(l)))
      return e;
    /* (2 MiB aligned from 2 MiB up: a 2 MiB page gshmd built maps whole) */
    p = gshm__map_shared_aligned(l->fd, l->info.size, prot);
    if (p == MAP_FAILED)
      return -errno;
    /* 2 MiB pages where the kernel gives shared memory huge pages on
     * request (transparent_hugepage/shmem_enabled = advise): fewer faults
     * when this process fills a new segment, fewer TLB misses when it
     * reads one (gshmd asks the same for the mappings pulls land in);
     * nothing where the kernel says never */
    if (l->info.size >= GSHM__HUGE_PAGE)
      (void)madvise(p, l->info.size, MADV_HUGEPAGE);
    l->addr = p;
    l->map_size = l->info.size;
    if (!(prot & PROT_WRITE))
      ro_host_add(l);
  } else if ((e = gshm__map_device(l, devices, ndevices, &uuids, &nuuids))) {
    return e;
  }
  gshm__report_mapping(l->client, l, uuids, nuuids, false);
  return 0;
}

int gshm__lease_unmap(struct gshm__lease *l, bool report) {
  int e = 0;

  if (!l->addr)
    return 0;
  ro_host_remove(l); /* (before the range may be mapped again) */
  if (l->device_map)
    e = gshm__unmap_device(l);
  else if (munmap(l->addr, l->map_size) < 0)
    e = -errno;
  l->addr = NULL;
  l->map_size = 0;
  l->map_refs = 0;
  if (report)
    gshm__report_mapping(l->client, l, NULL, 0, true);
  return e;
}

/* Ends the mapping gshm_read / gshm_write kept on l (segment_rw), if
 * there is one and no gshm_map holds it.  Caller holds the lock. */
static int drop_kept(struct gshm__lease *l) {
  return l->addr && !l->map_refs ? gshm__lease_unmap(l, true) : 0;
}

int gshm_map(gshm_segment_t *seg, const int *devices, size_t ndevices, void **addr_out) {
  struct gshm_client *c;
  int e = 0;

  if (!seg || !addr_out || (!devices && ndevices))
    return -EINVAL;
  c = seg->lease->client;
  gshm__last_error_local(c);
  if ((e = gshm__client_lock(c)))
    return e;
  gshm__drain_events(c, false); /* a revoke (or a restart) is learnt here */
  if (seg->lease->revoked) { /* never a mapping of memory gshmd took back */
    drop_kept(seg->lease);
    e = -ESTALE;
  }
  else if (!(e = lease_map(seg->lease, devices, ndevices)) && !seg->mapped) {
    seg->mapped = true;
    seg->lease->map_refs++;
  }
  if (!e)
    *addr_out = seg->lease->addr;
  gshm__client_unlock(c); /* (a revoked lease's kept mapping, retired above) */
  return e;
}

int gshm_unmap(gshm_segment_t *seg) {
  struct gshm__lease *l;
  struct gshm_client *c;
  int e = 0, e2;

  if (!seg)
    return -EINVAL;
  l = seg->lease;
  c = l->client;
  gshm__last_error_local(c);
  if ((e = gshm__client_lock(c)))
    return e;
  if (seg->mapped) {
    seg->mapped = false;
    if (--l->map_refs == 0)
      e = gshm__lease_unmap(l, true);
  } else {
    e = drop_kept(l); /* gshm_read / gshm_write's, no gshm_map's */
  }
  e2 = gshm__client_unlock(c); /* the device mapping ends there, after a wait */
  return e ? e : e2;
}

/* Shared body of gshm_read and gshm_write. */
static int segment_rw(gshm_segment_t *seg, uint64_t offset, void *buf, size_t bytes, bool write) {
  struct gshm__lease *l;
  struct gshm_client *c;
  int e = 0;

  if (!seg || (!buf && bytes))
    return -EINVAL;
  l = seg->lease;
  c = l->client;
  gshm__last_error_local(c);
  if (offset > l->info.size || bytes > l->info.size - offset)
    return -ERANGE;
  if (write && l->access != GSHM_ACCESS_READ_WRITE)
    return -EACCES;
  if (bytes == 0)
    return 0;
  if ((e = gshm__client_lock(c)))
    return e;
  gshm__drain_events(c, false); /* one non-blocking recv: learns of a revoke or a restart */
  if (l->revoked) {
    /* a mapping kept by an earlier call (below) goes with the lease's
     * memory: nothing of this process holds it but that mapping */
    drop_kept(l);
    e = -ESTALE;
    goto out;
  }
  /* An unmapped segment is mapped here and the mapping kept on the lease
   * (no gshm_map reference: the last close, an unmap of the last
   * gshm_map, or a revoke seen here ends it).  Mapped and unmapped for
   * each call, a device segment in a process with no CUDA context made
   * and destroyed a primary context every time: 133 ms a call on an H200
   * (docs/PERFORMANCE.md "Attach"), for a few KiB. */
  if (!l->addr && (e = lease_map(l, NULL, 0)))
    goto out;
  if (is_host(l)) {
    if (write)
      memcpy((char *)l->addr + offset, buf, bytes);
    else
      memcpy(buf, (const char *)l->addr + offset, bytes);
  } else {
    e = gshm__device_rw(l, offset, buf, bytes, write);
  }
out:
  gshm__client_unlock(c); /* (a revoked lease's kept mapping, retired above) */
  return e;
}

int gshm_read(gshm_segment_t *seg, uint64_t offset, void *buf, size_t bytes) {
  return segment_rw(seg, offset, buf, bytes, false);
}

int gshm_write(gshm_segment_t *seg, uint64_t offset, const void *buf, size_t bytes) {
  return segment_rw(seg, offset, (void *)buf, bytes, true);
}
