/* SPDX-License-Identifier: Apache-2.0 */
/* The node's memory as the host backend (backend_host.c) sees it: the
 * machine's (/proc/meminfo) and that of gshmd's memory cgroup and its
 * ancestors (v2 or v1), re-read at most every GSHMD_HOST_MEMORY_REREAD_NS.
 * One reader for both of its uses: a create's size check (limits) and a
 * pull's room check (gshmd_backend_host_room: what is left). */
#ifndef GSHMD_HOST_MEMORY_H
#define GSHMD_HOST_MEMORY_H

#include <stdint.h>

/* How old the figures may be: a cgroup's limit may change at run time,
 * and each landed pull's pages leave MemAvailable (the pull's room check
 * counts only pulls not landed yet); a read costs tens of microseconds
 * (/proc/meminfo, two files per cgroup level). */
#define GSHMD_HOST_MEMORY_REREAD_NS 100000000LL

/* Every figure in bytes; UINT64_MAX where it could not be read (or, for
 * the cgroup ones, where no level has a limit). */
struct gshmd_host_memory {
  int64_t read_ns;          /* CLOCK_MONOTONIC of the last read; 0: never */
  uint64_t ram, swap;       /* MemTotal, SwapTotal */
  uint64_t avail;           /* MemAvailable + SwapFree (tmpfs pages can swap) */
  uint64_t cg_mem, cg_swap; /* the tightest limits of gshmd's cgroup and its ancestors: v2
                               memory.max, memory.swap.max; v1 memory.limit_in_bytes,
                               memory.memsw.limit_in_bytes less the former */
  uint64_t cg_room;         /* the least any of those levels with a memory limit leaves:
                               limit less v2 memory.current / v1 memory.usage_in_bytes */
};

/* Reads every figure of *m again when it is older than
 * GSHMD_HOST_MEMORY_REREAD_NS (or was never read).  A file that cannot
 * be read leaves its figure UINT64_MAX: nothing to fail. */
void gshmd_host_memory_update(struct gshmd_host_memory *m);

#endif
