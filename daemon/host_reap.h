/* SPDX-License-Identifier: Apache-2.0 */
/* Giving a large freed host segment's memory back off the event loop.
 *
 * Punching a freed segment's pages out of its memfd (backend_host.c
 * host_discard) and the last close and munmap of a large one cost the
 * kernel about 46 ms a GB (4 KiB pages, measured by the session 26
 * attacker's review: 4 GiB 0.18 s).  On the loop, a client's unlink of a
 * segment of hundreds of GB held every other request that long, past
 * systemd's WatchdogSec=30s.  From GSHMD_REAP_ASYNC_MIN bytes the fds
 * and mapping go to one reaper thread instead, which punches (when asked)
 * and closes in order; smaller ones are done at once, as before (a punch
 * of 256 MiB is about 12 ms). */
#ifndef GSHMD_HOST_REAP_H
#define GSHMD_HOST_REAP_H

#include <stdbool.h>
#include <stdint.h>

#define GSHMD_REAP_ASYNC_MIN ((uint64_t)256 << 20) /* bytes */

struct gshmd_host_reaper;

/* Starts the reaper thread; *out NULL (everything done at once by
 * gshmd_host_reap) when it cannot start.  Returns 0 or -ENOMEM / -EAGAIN. */
int gshmd_host_reap_start(struct gshmd_host_reaper **out);

/* Gives back one freed memfd of size bytes: punches every page out of
 * fds[0] when punch (FALLOC_FL_PUNCH_HOLE: a client that kept a copy of
 * the fd keeps no memory), unmaps map (NULL: none) and closes fds[0..2]
 * (each -1: none).  Takes ownership of the fds and the mapping.  On the
 * reaper thread from GSHMD_REAP_ASYNC_MIN bytes (r not NULL), else at
 * once; a failed punch is logged.  Never fails: without memory for the
 * queue entry it is done at once. */
void gshmd_host_reap(struct gshmd_host_reaper *r, const int fds[3], void *map, uint64_t size,
                     bool punch);

/* Punches every page out of memfd fd (size bytes) and keeps the fd: at
 * once below GSHMD_REAP_ASYNC_MIN bytes or without r, else on the reaper
 * thread through a copy of fd that it closes (at once where no copy or
 * queue entry can be made).  A failed punch is logged; never fails. */
void gshmd_host_reap_punch(struct gshmd_host_reaper *r, int fd, uint64_t size);

/* Bytes whose punch is queued and not done yet (r NULL: 0): memory the
 * node gets back within moments, which MemAvailable and the cgroup's
 * usage do not show yet (backend_host.c gshmd_backend_host_room adds
 * it, so a pull right after a large free is not refused -ENOMEM). */
uint64_t gshmd_host_reap_pending(const struct gshmd_host_reaper *r);

/* Does what is queued, then stops and frees r (NULL: nothing).  Called at
 * the backend's end: nothing freed before it stays unpunched. */
void gshmd_host_reap_stop(struct gshmd_host_reaper *r);

#endif
