/* SPDX-License-Identifier: Apache-2.0 */
/* Prefaulting a pull's new host memory ahead of its lanes.
 *
 * A byte that lands in a new memfd page costs the kernel a page
 * allocation and its zeroing first, on the lane thread that receives it
 * (clear_page_erms was 9% of all CPU in a 1 GiB pull on the lent 16-core
 * machine, and TCP into memory written before pays none:
 * docs/PERFORMANCE.md "The suite's pull step at the end of the day").
 * Here libuv's pool faults those pages in (madvise MADV_POPULATE_WRITE,
 * Linux 5.14: allocates and maps them writable without touching their
 * bytes) on otherwise idle CPUs, in PREFAULT_PIECE pieces, in the order
 * the chunks will be asked for, starting past the chunks already asked
 * for: their lanes write those at once, and racing them for the same
 * pages gained nothing.  A lane that catches up faults as before: the
 * kernel serializes both on each page, and populating never changes a
 * byte.
 *
 * Measured on the lent 16-core H100 machine (2 MiB pages, 8 lanes, A/B
 * interleaved in one call, medians of 7): a 1 GiB pull 11.2-11.6 GB/s
 * without, 12.9-13.1 with; faulting from the segment's start instead
 * (racing the first chunks) 12.5-13.7; 8 pieces at once instead of 4
 * the same; 64 MiB (all of it asked for at once) unchanged by design.
 * With 4 KiB pages (shmem_enabled never) nothing changed but CPU time
 * (2.67 s/GB against 2.1): one segment's 4 KiB pages enter its page
 * cache one at a time under one lock, whoever faults them, so
 * cluster.prefault's default (auto) is on only where the host backend
 * makes pulls in 2 MiB pages: the kernel's (shmem_enabled advise or
 * more), or built here where it is never (cl->pf_build: each piece's
 * 2 MiB pages built with MADV_COLLAPSE, host_memory.h; pieces start and
 * end on 2 MiB pages there, the segment's size being whole 2 MiB pages).
 *
 * At most PREFAULT_AHEAD bytes are faulted in past the chunks asked for,
 * over all pulls (cl->pf_ahead): the sizes are the peer's word, and a set
 * is listed (its host segments made) before any grant, so a peer that
 * listed segments and then granted none, or sent no byte, had every
 * listed page allocated here, up to the requester's quota or, without
 * one, until memory ran out (the bytes, had they come, would have
 * allocated them the same, each on its lane).  Such a pull, first in the queue, holds the others' prefaulting back
 * with it until its set fails (cluster.request_timeout_ms): they pull as
 * they would without.
 *
 * Only CPUs the data lanes leave free fault pages in: at most
 * PREFAULT_JOBS pieces, and no more than gshmd's CPUs (its affinity)
 * less the lane threads at work (an outbound link's lanes while pulls use
 * it, an inbound link's while it serves grants).  A
 * page costs the same zeroing on either thread, so where the lanes use
 * every CPU faulting ahead only takes their CPU.  Four gshmd on 4 CPUs
 * each, 2 lanes, a 1 GiB set along a chain (lent 16-core H100 machine,
 * interleaved): 4 pieces on every node, 0.294-0.311 s; this rule (none
 * on the relays, whose 4 lane threads use their 4 CPUs, 2 on the last
 * node), 0.266-0.273 s, and one pull 0.146-0.156 s against 0.178-0.196
 * (docs/PERFORMANCE.md "Prefault on the CPUs the lanes leave").
 *
 * Lifetime: a piece is faulted through the pull's own landing mapping;
 * an item is not closed (its mapping may go) and a set not ended while
 * a piece of it is on the pool (pull->pf_jobs, pull_set->pf_jobs).
 *
 * With daemon.host_populate, a segment whose bytes are all in has the
 * pages past them (its allocation's rounding) allocated on the loop
 * (gshmd__prefault_all_in): the backend populates no pull at its making.
 *
 * Pages built here (cl->pf_build) whose build failed are built once the
 * segment's bytes are all in, on the pool, before the item closes (so
 * before its set is published): a lane whose collapse failed
 * (peer_req.build_left) and a piece whose collapse failed mark theirs
 * (p->unbuilt_off, unbuilt_end; gshmd_host_collapse_again, host_memory.h).
 * Lanes that share a page (chunks that do not start and end on 2 MiB
 * pages: a segment of fewer than two 4 MiB chunks a lane, pull_chunk
 * not a multiple of 2 MiB) build it at once, and each may find it busy
 * (MADV_COLLAPSE's EAGAIN: another's collapse holds a page's lock, or
 * another's bytes filled a hole while it looked) and go on writing 4 KiB
 * pages: on a 2-core machine under load 2 of 30 pulls of 5 MiB (384 KiB
 * chunks) left a page so.  Pages never tried (the bytes over UCX or the
 * link's own stream came before the pool) stay 4 KiB ones: building
 * them afterwards copies them (a 1 GiB pull over UCX on a 2-core
 * machine, nothing built ahead: 1.06 s more). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "host_memory.h"
#include "log.h"
#include "pull.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PREFAULT_PIECE (8u << 20) /* bytes a job: 128 jobs for 1 GiB, each about 1 ms */
#define PREFAULT_JOBS 4            /* pieces on libuv's pool at once (it has 16 threads) */
/* Bytes faulted in past the chunks asked for, all pulls: some 40 ms of
 * a 13 GB/s pull, which the pieces (about 8 GB/s a thread) stay ahead of */
#define PREFAULT_AHEAD (512ull << 20)

struct prefault_job {
  uv_work_t w;
  struct pull *p;
  void *addr;
  size_t len;
  bool build;                 /* cl->pf_build: 2 MiB pages built (host_memory.h) */
  bool built;                 /* ... all of them (or found built) */
  bool again;                 /* not a piece: the pages a first build left */
  int fd;                     /* through the pull's memfd (not taken) */
  uint64_t foff;              /* the file offset at addr */
  int err;
};

static void pf_work(uv_work_t *w) {
  struct prefault_job *j = w->data;

  if (j->again) {
    j->err = -gshmd_host_collapse_again(j->addr, j->len);
    return;
  }
  /* (no 2 MiB page now: the 4 KiB ones, as where none are built) */
  if (j->build && (j->built = !gshmd_host_collapse(j->addr, j->len, j->fd, j->foff)))
    return;
  if (madvise(j->addr, j->len, MADV_POPULATE_WRITE) < 0)
    j->err = errno;
}

static void rebuild(struct pull *p);

static void pf_done(uv_work_t *w, int status) {
  struct prefault_job *j = w->data;
  struct pull *p = j->p;
  struct gshmd_cluster *cl = p->s->cl;

  (void)status;
  p->pf_jobs--;
  p->s->pf_jobs--;
  cl->pf_jobs--;
  if (j->build && !j->built)
    gshmd__prefault_unbuilt(p, j->foff, j->len);
  if (j->again) {
    if (j->err) /* (its pages stay 4 KiB ones, as where none are built) */
      gshm_log_debug("cluster: 2 MiB pages of '%s' left in 4 KiB pages: %s", p->local_name,
                     strerror(j->err));
  } else if (j->err == EINVAL || j->err == ENOSYS) {
    /* a kernel before 5.14: nothing to gain, nothing lost */
    if (cl->pf_on)
      gshm_log_info("cluster: prefaulting pulled memory is off: madvise(MADV_POPULATE_WRITE): %s",
                    strerror(j->err));
    cl->pf_on = false;
  } else if (!j->err) {
    cl->pf_bytes += j->len;
  }
  /* (other errors, ENOMEM or EFAULT where memory ran short: the lanes'
   * own faults meet the same and fail the pull as they did without) */
  free(j);
  rebuild(p); /* (a piece that ended after the bytes) */
  gshmd__prefault_more(cl);
  /* an item or set that waited for it is reaped (at once while gshmd
   * stops: the link layer's turns are over) */
  if (cl->ll.stopping)
    gshmd__pull_reap(cl);
  else
    gshmd__link_kick(&cl->ll);
}

/* Where p's chunks asked for so far end, in whole huge pages. */
static uint64_t asked_end(const struct pull *p) {
  return (p->next_off + GSHMD_HUGE_PAGE - 1) / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;
}

/* p's bytes faulted in (or on the pool) past its chunks asked for are
 * counted again in p->pf_ahead and cl->pf_ahead. */
static void count_ahead(struct pull *p) {
  struct gshmd_cluster *cl = p->s->cl;
  uint64_t asked = asked_end(p), ahead = p->pf_off > asked ? p->pf_off - asked : 0;

  cl->pf_ahead = cl->pf_ahead - p->pf_ahead + ahead;
  p->pf_ahead = ahead;
}

/* The next piece of p to fault in: its offset in *off, its length
 * returned (0: nothing more of p). */
static size_t next_piece(const struct pull *p, uint64_t *off) {
  uint64_t size = p->mem ? p->mem->size : 0, start = p->pf_off;
  uint64_t asked = asked_end(p); /* (past the chunks already asked for) */

  if (p->s->err || p->finished || p->closed || !p->dst_mapped || p->local_staged)
    return 0;
  /* (pages built here: from past each lane's first chunk, the lanes
   * building those themselves: gshmd__prefault_add) */
  if (asked > start && !p->s->cl->pf_build)
    start = asked;
  if (start >= size)
    return 0;
  *off = start;
  return size - start < PREFAULT_PIECE ? (size_t)(size - start) : PREFAULT_PIECE;
}

/* Lane threads at work now: an outbound link's lanes (up or in their
 * hello) receive while pulls use it, an inbound link's send while it
 * serves grants or has bytes of reads to send; a link without lanes
 * counts one (its stream, on the loop). */
static unsigned lanes_at_work(const struct gshmd_cluster *cl) {
  const struct gshm_list *it;
  unsigned n = 0;

  gshm_list_foreach(it, &cl->ll.links) {
    const struct link *l = gshm_list_entry(it, struct link, node);
    if (l->is_lane || l->state != LINK_UP)
      continue;
    unsigned lanes = l->nlanes + (!l->inbound && l->peer ? l->peer->lanes_connecting : 0);
    if (l->inbound ? l->bytes_busy > 0 || !gshm_list_empty(&l->grants) : !gshm_list_empty(&l->pulls))
      n += lanes ? lanes : 1; /* (none: the loop moves the bytes on the link's stream) */
  }
  return n;
}

/* Pieces that may be on the pool now: PREFAULT_JOBS, or the CPUs the
 * loop thread may run on (gshmd's affinity, which its threads inherit)
 * less the lanes at work, if fewer. */
static unsigned jobs_allowed(const struct gshmd_cluster *cl) {
  cpu_set_t set;
  unsigned cpus, busy;

  if (sched_getaffinity(0, sizeof(set), &set))
    return PREFAULT_JOBS;
  cpus = (unsigned)CPU_COUNT(&set);
  busy = lanes_at_work(cl);
  if (busy >= cpus)
    return 0;
  return cpus - busy < PREFAULT_JOBS ? cpus - busy : PREFAULT_JOBS;
}

/* Puts a job for [off, off + len) of p on libuv's pool: a piece, or
 * (again) the pages a first build left; p, its set and cl count it.
 * Returns false when it could not (out of memory). */
static bool job_queue(struct pull *p, uint64_t off, size_t len, bool again) {
  struct gshmd_cluster *cl = p->s->cl;
  struct prefault_job *j = calloc(1, sizeof(*j));

  if (!j)
    return false;
  j->p = p;
  j->addr = (uint8_t *)p->dst + off;
  j->len = len;
  j->again = again;
  j->fd = gshmd_backend_host_memfd(p->mem);
  j->build = !again && cl->pf_build && j->fd >= 0 && off % GSHMD_HUGE_PAGE == 0 &&
             len % GSHMD_HUGE_PAGE == 0;
  j->foff = off;
  j->w.data = j;
  if (uv_queue_work(cl->loop, &j->w, pf_work, pf_done)) {
    free(j);
    return false;
  }
  p->pf_jobs++;
  p->s->pf_jobs++;
  cl->pf_jobs++;
  return true;
}

/* Once p's bytes are all in and no piece of it is on the pool: the pages
 * a first build left go on the pool (p is not closed meanwhile). */
static void rebuild(struct pull *p) {
  uint64_t off = p->unbuilt_off, len = p->unbuilt_end - p->unbuilt_off;

  if (!len || p->pf_jobs || p->done != p->total || p->s->err || p->closed || !p->dst_mapped ||
      p->s->cl->ll.stopping)
    return;
  p->unbuilt_off = p->unbuilt_end = 0;
  (void)job_queue(p, off, (size_t)len, true); /* (out of memory: 4 KiB pages stay) */
}

void gshmd__prefault_unbuilt(struct pull *p, uint64_t off, uint64_t len) {
  uint64_t whole = p->mem ? p->mem->size / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE : 0;
  uint64_t first = off / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;
  uint64_t end = (off + len + GSHMD_HUGE_PAGE - 1) / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;

  if (end > whole)
    end = whole;
  if (first >= end)
    return;
  if (p->unbuilt_end == p->unbuilt_off || first < p->unbuilt_off)
    p->unbuilt_off = first;
  if (end > p->unbuilt_end)
    p->unbuilt_end = end;
}

void gshmd__prefault_more(struct gshmd_cluster *cl) {
  /* (the affinity and the links are looked at only when a piece could go:
   * this runs for every batch of chunks a pull asks for) */
  unsigned allowed = cl->pf_on && cl->pf_jobs < PREFAULT_JOBS && !gshm_list_empty(&cl->prefaults)
                         ? jobs_allowed(cl)
                         : 0;

  while (cl->pf_jobs < allowed && !gshm_list_empty(&cl->prefaults)) {
    struct pull *p = gshm_list_entry(cl->prefaults.next, struct pull, pf_node);
    uint64_t off;
    size_t len = next_piece(p, &off);

    if (!len) {
      gshm_list_del(&p->pf_node);
      p->pf_queued = false;
      continue;
    }
    /* (the cap waits for chunks asked for: gshmd__prefault_add) */
    if (off + len > asked_end(p) &&
        cl->pf_ahead - p->pf_ahead + (off + len - asked_end(p)) > PREFAULT_AHEAD)
      return;
    if (!job_queue(p, off, len, false))
      return;
    p->pf_off = off + len;
    count_ahead(p);
  }
}

void gshmd__prefault_init(struct gshmd_cluster *cl, const struct gshmd_backend *host) {
  cl->pf_on = !strcmp(cl->cfg->cluster_prefault, "always") ||
              (!strcmp(cl->cfg->cluster_prefault, "auto") && gshmd_backend_host_huge_pulls(host));
  cl->pf_build = gshmd_backend_host_collapse(host);
}

void gshmd__prefault_add(struct pull *p) {
  struct gshmd_cluster *cl = p->s->cl;

  count_ahead(p); /* (chunks asked for since: less is ahead) */
  if (!cl->pf_on || p->local_staged || !p->dst_mapped || p->mem->size < GSHMD_HUGE_PAGE)
    return;
  if (cl->pf_build && !p->pf_off && p->link) {
    /* Each lane builds the pages of the chunk it receives before its
     * bytes, and then waits for nothing else: the pages of its next
     * chunks, asked for already, are built here meanwhile (a 64 MiB
     * pull, all of it asked for at once, had each lane build all of its
     * pages between its bytes).  Without lanes (UCX, cluster.streams=1)
     * nothing else builds them: from the start */
    uint64_t skip = (uint64_t)p->link->nlanes * p->chunk_size;
    skip = (skip + GSHMD_HUGE_PAGE - 1) / GSHMD_HUGE_PAGE * GSHMD_HUGE_PAGE;
    p->pf_off = skip < p->mem->size ? skip : p->mem->size;
  }
  if (!p->pf_queued) {
    gshm_list_add_tail(&cl->prefaults, &p->pf_node);
    p->pf_queued = true;
  }
  gshmd__prefault_more(cl);
}

void gshmd__prefault_forget(struct pull *p) {
  if (p->pf_queued)
    gshm_list_del(&p->pf_node);
  p->pf_queued = false;
  p->s->cl->pf_ahead -= p->pf_ahead;
  p->pf_ahead = 0;
}

int gshmd__prefault_all_in(struct pull *p) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start = (p->total + page - 1) / page * page;

  /* (EINVAL: a kernel before 5.14; its bytes fault in as they are written) */
  if (p->s->cl->cfg->host_populate && p->dst_mapped && !p->local_staged &&
      start < p->mem->size &&
      madvise((uint8_t *)p->dst + start, p->mem->size - start, MADV_POPULATE_WRITE) < 0 &&
      (errno == ENOMEM || errno == EFAULT)) {
    gshmd__pull_set_fail_here(p->s, -ENOMEM, "out of memory for '%s' (daemon.host_populate)",
                              p->local_name);
    return -ENOMEM;
  }
  rebuild(p);
  return 0;
}
