/* SPDX-License-Identifier: Apache-2.0 */
/* A set's grants, paced (pull.h): GRANTS_AHEAD segments asked at once,
 * fewer while a busy peer refuses, and the node's pulls into GPUs held
 * to PULL_PINNED_FULL staging_bytes of pinned slots. */
#include "pull.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "stage.h"
#include "util.h"

/* Asks grants for the next segments (those a busy peer refused first)
 * while fewer than s->window are open and the node's pulls into GPUs
 * hold less than PULL_PINNED_FULL staging_bytes of pinned slots with
 * the next one's (one always goes; set_reap asks again after each
 * close).  Run outside UCX callbacks. */
void gshmd__pull_set_start_grants(struct pull_set *s) {
  struct gshmd_cluster *cl = s->cl;

  while (!s->err && s->active < s->window && (s->retry || s->next_start < s->n)) {
    struct pull *p = s->retry ? s->retry : s->items[s->next_start];
    uint64_t pin = gshmd__pull_pin_need(p);
    if (pin && cl->pull_pinned &&
        cl->pull_pinned + pin > PULL_PINNED_FULL * cl->stage.staging_bytes)
      break;
    if (p == s->retry) {
      if (!(s->retry = p->next_retry))
        s->retry_tail = &s->retry;
    } else {
      s->next_start++;
    }
    gshmd__pull_pin(p, pin);
    p->started = true;
    p->req_pending = true;
    s->active++;
    gshmd__link_req_submit(&s->cl->ll, s->peer, &p->req);
  }
}

/* The peer refused p's grant as busy (it caps grants per link, e.g.
 * staged ones) while other segments of the set hold grants: p waits for
 * one of them to close, and the set asks no more at once than it holds
 * now.  Returns false when nothing else is open (a real failure). */
bool gshmd__pull_grant_later(struct pull *p) {
  struct pull_set *s = p->s;

  if (s->active <= 1)
    return false;
  s->active--;
  gshmd__pull_unpin(p);
  if (s->window == GRANTS_AHEAD)
    gshm_log_info("cluster: peer '%s' is busy: the pull of '%s' waits for its grants to end "
                  "before it asks more",
                  s->peer->name, s->name);
  s->window = s->active;
  p->started = false;
  p->next_retry = NULL;
  *s->retry_tail = p;
  s->retry_tail = &p->next_retry;
  return true;
}

uint64_t gshmd__pull_pin_need(struct pull *p) {
  struct gshmd_cluster *cl = p->s->cl;
  bool device = p->listed ? gshmd__pull_lands_on_device(p, p->listed_device)
                          : p->location[0] && gshmd__pull_location_device(p->location);

  if (!device || !cl->reg->cuda)
    return 0;
  return gshmd_stage_buf_len(&cl->stage, cl->cfg->cluster_pull_chunk,
                             p->listed ? p->listed : cl->stage.staging_bytes);
}

void gshmd__pull_pin(struct pull *p, uint64_t bytes) {
  struct gshmd_cluster *cl = p->s->cl;

  p->pinned += bytes;
  cl->pull_pinned += bytes;
  if (cl->pull_pinned > cl->pull_pinned_max)
    cl->pull_pinned_max = cl->pull_pinned;
}

void gshmd__pull_unpin(struct pull *p) {
  p->s->cl->pull_pinned -= p->pinned;
  p->pinned = 0;
}

/* The first number in file path (cgroup v2's memory.max, memory.current),
 * or UINT64_MAX ("max", or unreadable). */
static uint64_t read_u64(const char *path) {
  unsigned long long v;
  FILE *f = fopen(path, "re");
  int n = f ? fscanf(f, "%llu", &v) : 0;

  if (f)
    fclose(f);
  return n == 1 ? (uint64_t)v : UINT64_MAX;
}

/* What gshmd's cgroup (v2; a systemd MemoryMax=, a container's limit)
 * lets it charge more, or UINT64_MAX without a limit: pages of the
 * memfds its lanes write are charged to it. */
static uint64_t cgroup_avail(void) {
  char line[512], path[600];
  uint64_t max, cur;
  FILE *f = fopen("/proc/self/cgroup", "re");
  bool found = false;

  while (f && !found && fgets(line, sizeof(line), f))
    found = !strncmp(line, "0::", 3);
  if (f)
    fclose(f);
  if (!found)
    return UINT64_MAX;
  line[strcspn(line, "\n")] = '\0';
  snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", line + 3);
  if ((max = read_u64(path)) == UINT64_MAX)
    return UINT64_MAX;
  snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.current", line + 3);
  cur = read_u64(path);
  return cur == UINT64_MAX ? UINT64_MAX : max > cur ? max - cur : 0;
}

/* /proc/meminfo's MemAvailable + SwapFree in bytes, at most what gshmd's
 * cgroup allows; UINT64_MAX when neither can be read. */
static uint64_t host_avail(void) {
  unsigned long long kb, sum = 0;
  unsigned found = 0;
  char line[160];
  FILE *f = fopen("/proc/meminfo", "re");
  uint64_t cg;

  if (!f)
    return cgroup_avail();
  while (found < 2 && fgets(line, sizeof(line), f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 ||
        sscanf(line, "SwapFree: %llu kB", &kb) == 1) {
      sum += kb;
      found++;
    }
  fclose(f);
  cg = cgroup_avail();
  return found == 2 && (uint64_t)sum << 10 < cg ? (uint64_t)sum << 10 : cg;
}

int gshmd__pull_host_room(struct pull *p, uint64_t size) {
  struct gshmd_cluster *cl = p->s->cl;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);

  if (!cl->host_avail_ns || now - cl->host_avail_ns > 100 * 1000 * 1000) {
    struct gshmd_host_recycle_stats st;
    /* memory daemon.host_recycle keeps is gshmd's to land pulls in */
    gshmd_backend_host_recycle_stats(cl->reg->host, &st);
    cl->host_avail = host_avail();
    if (cl->host_avail != UINT64_MAX)
      cl->host_avail += st.bytes_held;
    cl->host_avail_ns = now;
  }
  if (cl->cfg->cluster_memory_check && cl->host_avail != UINT64_MAX &&
      (size > cl->host_avail || cl->pull_host_owed > cl->host_avail - size)) {
    gshmd__pull_set_fail(p->s, -ENOMEM,
                         "segment '%s' of peer '%s' needs %" PRIu64 " bytes of host memory: this "
                         "node has %" PRIu64 " available (with swap), and pulls in flight will "
                         "still take %" PRIu64,
                         p->remote_name, p->s->peer->name, size, cl->host_avail,
                         cl->pull_host_owed);
    return -ENOMEM;
  }
  p->host_owed += size;
  cl->pull_host_owed += size;
  return 0;
}

void gshmd__pull_host_paid(struct pull *p, uint64_t n) {
  struct gshmd_cluster *cl = p->s->cl;

  if (n > p->host_owed)
    n = p->host_owed;
  p->host_owed -= n;
  cl->pull_host_owed -= n;
}

void gshmd__pull_pinned_metrics(const struct gshmd_cluster *cl, FILE *f) {
  fprintf(f, "# HELP gshm_cluster_pull_pinned_bytes Pinned staging bytes held by this node's pulls into GPUs now (at most 8 x cluster.staging_bytes but for one).\n"
             "# TYPE gshm_cluster_pull_pinned_bytes gauge\n"
             "gshm_cluster_pull_pinned_bytes %" PRIu64 "\n"
             "# HELP gshm_cluster_pull_pinned_bytes_max The most pinned staging bytes this node's pulls into GPUs held at once since gshmd started.\n"
             "# TYPE gshm_cluster_pull_pinned_bytes_max gauge\n"
             "gshm_cluster_pull_pinned_bytes_max %" PRIu64 "\n"
             "# HELP gshm_cluster_pull_host_owed_bytes Bytes of new host segments this node's pulls made and have not landed yet (each pull's room is checked against the node's memory with them).\n"
             "# TYPE gshm_cluster_pull_host_owed_bytes gauge\n"
             "gshm_cluster_pull_host_owed_bytes %" PRIu64 "\n",
          cl->pull_pinned, cl->pull_pinned_max, cl->pull_host_owed);
}
