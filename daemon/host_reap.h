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
/* A punch on the reaper goes in steps of this many bytes (about 46 ms
 * each), and what each gave back leaves gshmd_host_reap_pending as it
 * ends: the kernel frees a punch's pages as it goes. */
#define GSHMD_REAP_STEP ((uint64_t)1 << 30) /* bytes */

struct gshmd_host_reaper;

/* Starts the reaper thread; *out NULL (everything done at once by
 * gshmd_host_reap) when it cannot start.  Returns 0 or -ENOMEM / -EAGAIN.
 * For tests: where the environment has GSHMD_TEST_REAP_HOLD=PATH the
 * thread starts no punch step while a file PATH exists (looked at every
 * 2 ms), so that a test sees exactly what a free left queued. */
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

/* Bytes that queued punches will give back and that the node's figures
 * do not show free yet (r NULL: 0): memory the node gets back within
 * moments (backend_host.c gshmd_backend_host_room adds it to
 * MemAvailable, so a pull right after a large free is not refused
 * -ENOMEM).  Each memfd counts the pages it held when queued (st_blocks:
 * a sparse one frees no more than those), less what each finished step
 * gave back; a step running counts as if it freed all it may, so the
 * figure is never more than what is still to be freed (short of a client
 * faulting pages into a freed memfd it kept, during its punch). */
uint64_t gshmd_host_reap_pending(const struct gshmd_host_reaper *r);

/* Punch steps (GSHMD_REAP_STEP) finished since r started (r NULL: 0):
 * when it changes, pages were given back and gshmd_host_reap_pending
 * fell, so the node's cached figures are stale (the room check reads
 * them again). */
uint64_t gshmd_host_reap_steps(const struct gshmd_host_reaper *r);

/* For unit tests: from now the reaper starts at most steps more punch
 * steps, then waits for the next call (UINT64_MAX: no bound, as at
 * start; gshmd_host_reap_stop ends any hold).  r NULL: nothing. */
void gshmd_host_reap_hold(struct gshmd_host_reaper *r, uint64_t steps);

/* Does what is queued (whatever holds a test set), then stops and frees r
 * (NULL: nothing).  Called at the backend's end: nothing freed before it
 * stays unpunched. */
void gshmd_host_reap_stop(struct gshmd_host_reaper *r);

#endif
