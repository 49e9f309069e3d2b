/* SPDX-License-Identifier: Apache-2.0 */
/* The node's memory as the host backend (backend_host.c) sees it: the
 * machine's (/proc/meminfo) and that of gshmd's memory cgroup and its
 * ancestors (v2 or v1), re-read at most every GSHMD_HOST_MEMORY_REREAD_NS.
 * One reader for both of its uses: a create's size check (limits) and a
 * pull's room check (gshmd_backend_host_room: what is left). */
#ifndef GSHMD_HOST_MEMORY_H
#define GSHMD_HOST_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How old the figures may be: a cgroup's limit may change at run time,
 * and each landed pull's pages leave MemAvailable (the pull's room check
 * counts only pulls not landed yet); a read costs tens of microseconds
 * (/proc/meminfo, three files per cgroup level, each held open:
 * docs/PERFORMANCE.md "Session 36: a pull's fixed costs"). */
#define GSHMD_HOST_MEMORY_REREAD_NS 100000000LL

struct gshmd_host_memory_files;

/* Every figure in bytes; UINT64_MAX where it could not be read (or, for
 * the cgroup ones, where no level has a limit). */
struct gshmd_host_memory {
  int64_t read_ns;          /* CLOCK_MONOTONIC of the last read; 0: never (set it 0
                               to have the next update read again) */
  uint64_t ram, swap;       /* MemTotal, SwapTotal */
  uint64_t avail;           /* MemAvailable + SwapFree (tmpfs pages can swap) */
  uint64_t cg_mem, cg_swap; /* the tightest limits of gshmd's cgroup and its ancestors: v2
                               memory.max, memory.swap.max; v1 memory.limit_in_bytes,
                               memory.memsw.limit_in_bytes less the former */
  uint64_t cg_room;         /* the least any of those levels with a memory limit leaves:
                               limit less v2 memory.current / v1 memory.usage_in_bytes */
  struct gshmd_host_memory_files *files; /* the files read, held open between reads
                                            (host_memory.c); NULL: opened at the next read */
};

/* Reads every figure of *m again when it is older than
 * GSHMD_HOST_MEMORY_REREAD_NS (or was never read).  A file that cannot
 * be read leaves its figure UINT64_MAX: nothing to fail.  The first read
 * opens the files and keeps them open (m->files: /proc/meminfo and
 * /proc/self/cgroup, each cgroup level's files that exist, up to 3, and
 * the folder of a level one of whose files is missing: 9 fds for a
 * systemd service on cgroup v2); each later one reads them again from
 * offset 0, opens again those found missing or whose read failed at the
 * read before (a level's files through its folder), and the cgroup
 * levels' files again when /proc/self/cgroup says gshmd moved.  Make the
 * first call at start, so that gshmd's fd count is settled from there. */
void gshmd_host_memory_update(struct gshmd_host_memory *m);

/* Closes the files m holds open (m->files, NULL after); its figures
 * stay.  m may be NULL. */
void gshmd_host_memory_close(struct gshmd_host_memory *m);

/* ---- 2 MiB pages for new memfd memory where shmem_enabled is never ----
 *
 * Where /sys/kernel/mm/transparent_hugepage/shmem_enabled is "never"
 * (most distributions' default) MADV_HUGEPAGE gets a memfd no 2 MiB
 * pages, and one memfd's new 4 KiB pages enter its page cache one at a
 * time under its locks: 4.3-5.0 GB/s touched by 4-16 threads, 6.3-9.1
 * GB/s by fallocate, on the lent 16-core H200 machine (kernel 6.18).
 * MADV_COLLAPSE (Linux 6.1) builds a 2 MiB page from a file range
 * whatever shmem_enabled says short of "deny" (mm/khugepaged.c: the
 * collapse asks with the sysfs policy not enforced); a range with one
 * page present is enough, the rest is cleared.  One 4 KiB page made with
 * MADV_POPULATE_WRITE and the collapse: 19-21 GB/s on 4 threads, 31-36
 * on 8, 34-52 on 16, the same machine (bench/probes/memfd_collapse.c,
 * docs/PERFORMANCE.md "2 MiB pages where shmem_enabled is never").  A
 * collapse keeps every byte already in the range (the kernel copies the
 * present pages under their page locks, as khugepaged does in running
 * processes), so it may race writers of the same range. */

/* Whether MADV_COLLAPSE builds 2 MiB memfd pages here: tried once (the
 * first call) on a 2 MiB memfd of its own, mapped 2 MiB aligned, then
 * remembered.  false on a kernel before 6.5 (from 6.1 to 6.4 each
 * collapse took the address space's lock for writing to map its page:
 * not tried there), with shmem_enabled deny,
 * without transparent huge pages, or where no 2 MiB page was free at
 * that moment.  Thread-safe after the first call (make it on the loop
 * at start). */
bool gshmd_host_collapse_works(void);

/* Builds the 2 MiB pages of [addr, addr + len): addr and len multiples
 * of 2 MiB, inside a shared mapping of a memfd made by
 * gshm__map_shared_aligned (util.h: file offsets 2 MiB aligned with
 * addresses); fd: that memfd (not taken), or -1, and foff the file
 * offset at addr.  Each page: its first 4 KiB made (fallocate of fd, or
 * without one MADV_POPULATE_WRITE; neither changes a byte), then
 * MADV_COLLAPSE: a page made through the mapping is mapped, and the
 * collapse's unmapping of it flushes the TLB of every CPU gshmd's threads
 * ran on (fallocate then collapse: 19-51 GB/s on 4-16 threads, populate
 * then collapse 15-39, the lent 16-core H200 machine); one whose last 4 KiB is in
 * the page cache already (built, or written whole) is left (mincore: each
 * MADV_COLLAPSE drains every CPU's LRU batches first; one call for runs
 * of 4 pages instead measured no faster in pulls: docs/PERFORMANCE.md).
 * A len that ends inside a page builds that page whole: the memfd must
 * cover it (a pull's does: its size is whole pages, and the pool's last
 * piece ends at the segment's requested size).  Never changes a byte.
 * A page that another thread of gshmd is building is waited for, then
 * left where that one built it; one that fails with EAGAIN (its pages
 * busy: a writer holding one; or more than 128 threads building at once)
 * is left and the next tried; the call returns -EAGAIN then (a pull
 * builds such pages again once its bytes are all in:
 * gshmd_host_collapse_again).  Stops at any other failure and returns
 * it: -ENOMEM (no free 2 MiB page, counted in gshmd_host_collapse_nomem:
 * after it every call does nothing and returns -EAGAIN for 1 s, a failed
 * collapse having compacted memory first, which transparent_hugepage/
 * defrag does not bound for MADV_COLLAPSE), -EINVAL (the mapping cannot hold one),
 * -EFAULT.  Where a page is not built the caller's writes fault 4 KiB
 * pages in as without.  Safe on any thread: of threads that ask for one
 * page at once (a pull's lanes, its prefault pool), one claims and builds
 * it while the others wait (a claim per page address, process-wide:
 * gshmd maps each pull's memfd once).  Adds the bytes of
 * each page this call built to gshmd_host_collapsed_bytes: a page once,
 * however many asked. */
int gshmd_host_collapse(void *addr, uint64_t len, int fd, uint64_t foff);

/* Builds the 2 MiB pages of [addr, addr + len) that a first build left
 * (gshmd_host_collapse's -EAGAIN: threads building or writing one page
 * at once may each find it busy, and all go on in 4 KiB pages), once the
 * range's bytes are all in and nothing writes them any more: one
 * MADV_COLLAPSE for the range, which copies each page's 4 KiB pages into
 * a 2 MiB one and passes over a page built already.  addr, len: as for
 * gshmd_host_collapse (multiples of 2 MiB, in such a mapping).  Never
 * changes a byte.  Returns 0, -EAGAIN (within the second after a
 * collapse found no free 2 MiB page: nothing tried; or a page busy
 * still), -ENOMEM (no free 2 MiB page: that second starts), -EINVAL,
 * -EFAULT.  Safe on any thread.  Adds len to
 * gshmd_host_collapsed_again_bytes when it succeeds (one call: it cannot
 * tell a page it built from one built already, so these bytes are not
 * gshmd_host_collapsed_bytes', which counts each page once). */
int gshmd_host_collapse_again(void *addr, uint64_t len);

/* Bytes of the ranges gshmd_host_collapse_again collapsed since start
 * (for the metrics and tests). */
uint64_t gshmd_host_collapsed_again_bytes(void);

/* Bytes of 2 MiB pages built by gshmd_host_collapse since start (for
 * the metrics and tests). */
uint64_t gshmd_host_collapsed_bytes(void);

/* Collapses that found no free 2 MiB page (-ENOMEM) since start, each
 * followed by a second without building: the pages left stay 4 KiB ones
 * (for the metrics and tests). */
uint64_t gshmd_host_collapse_nomem(void);

#endif
