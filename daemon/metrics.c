/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (format 0.0.4) of gshmd's state and counters.
 * Names follow Prometheus practice: base units (bytes, seconds), _total
 * for counters. */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "gshm.pb-c.h"
#include "metrics.h"
#include "host_memory.h"
#include "cluster.h"
#include "registry.h"
#include "server.h"
#include "log.h"
#include "util.h"

static const char *const op_names[GSHM_WIRE_TYPE_MAX + 1] = {
    [GSHM_WIRE_HELLO] = "hello",
    [GSHM_WIRE_CREATE] = "create",
    [GSHM_WIRE_OPEN] = "open",
    [GSHM_WIRE_CLOSE] = "close",
    [GSHM_WIRE_UNLINK] = "unlink",
    [GSHM_WIRE_STAT] = "stat",
    [GSHM_WIRE_LIST_SEGMENTS] = "list_segments",
    [GSHM_WIRE_LIST_LEASES] = "list_leases",
    [GSHM_WIRE_LIST_CLIENTS] = "list_clients",
    [GSHM_WIRE_STATUS] = "status",
    [GSHM_WIRE_DEVICES] = "devices",
    [GSHM_WIRE_MAP_REPORT] = "map_report",
    [GSHM_WIRE_METRICS] = "metrics",
    [GSHM_WIRE_CHMOD] = "chmod",
    [GSHM_WIRE_CHOWN] = "chown",
    [GSHM_WIRE_REVOKE] = "revoke",
    [GSHM_WIRE_PEERS] = "peers",
    [GSHM_WIRE_REMOTE_LIST] = "remote_list",
    [GSHM_WIRE_PULL] = "pull",
    [GSHM_WIRE_PULL_CANCEL] = "pull_cancel",
    [GSHM_WIRE_PUBLISH] = "publish",
};

/* Status label: the enum's name without its prefix, lowercase. */
static const char *status_label(int status, char *buf, size_t cap) {
  const ProtobufCEnumValue *v =
      protobuf_c_enum_descriptor_get_value(&gshm__status__descriptor, status);
  const char *name = v ? v->name : "unknown";
  size_t i;

  if (!strncmp(name, "STATUS_", 7))
    name += 7;
  for (i = 0; name[i] && i + 1 < cap; i++)
    buf[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + 32 : name[i]);
  buf[i] = '\0';
  return buf;
}

/* One sample with its HELP and TYPE lines: type is "gauge" or "counter". */
static void write_one(FILE *f, const char *type, const char *name, const char *help,
                      uint64_t value) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, value);
}

/* gshm_segment_bytes: one series per location, host first, then each GPU
 * in first-seen order (few locations; a small linear merge is cheaper than
 * a map).  The walk of every segment is kept until the registry changes
 * (r->changes: a segment made, published, freed, or its memory adopted):
 * before, each METRICS request walked them all, and any local user's
 * stream of METRICS on a node of 20,000 segments held other clients'
 * requests for 0.6 s (about 0.4 ms a walk, 32 requests a connection a turn
 * of the loop). */
static struct {
  const struct gshmd_registry *r;
  uint64_t changes;
  char locs[64][GSHM_LOCATION_MAX]; /* (copies: a segment's may go before the next walk) */
  uint64_t bytes[64], host_bytes;
  unsigned nloc;
} seg_bytes; /* (the loop's thread only) */

static void count_segment_bytes(struct gshmd_registry *r) {
  struct gshm_list *pos;

  seg_bytes.r = r;
  seg_bytes.changes = r->changes;
  seg_bytes.nloc = 0;
  seg_bytes.host_bytes = 0;
  gshm_list_foreach(pos, &r->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    unsigned i, n = seg_bytes.nloc;
    if (!strcmp(seg->mem->location, "host")) { /* (a parked device segment has no GPU index) */
      seg_bytes.host_bytes += seg->mem->size;
      continue;
    }
    for (i = 0; i < n && strcmp(seg_bytes.locs[i], seg->mem->location); i++)
      ;
    if (i == n && n < 64) {
      snprintf(seg_bytes.locs[n], sizeof(seg_bytes.locs[n]), "%s", seg->mem->location);
      seg_bytes.bytes[seg_bytes.nloc++] = 0;
    }
    if (i < seg_bytes.nloc)
      seg_bytes.bytes[i] += seg->mem->size;
  }
}

static void write_segment_bytes(FILE *f, struct gshmd_registry *r) {
  if (seg_bytes.r != r || seg_bytes.changes != r->changes)
    count_segment_bytes(r);
  fprintf(f, "# HELP gshm_segment_bytes Bytes allocated by segments, by location.\n"
             "# TYPE gshm_segment_bytes gauge\n");
  fprintf(f, "gshm_segment_bytes{location=\"host\"} %" PRIu64 "\n", seg_bytes.host_bytes);
  for (unsigned i = 0; i < seg_bytes.nloc; i++)
    fprintf(f, "gshm_segment_bytes{location=\"%s\"} %" PRIu64 "\n", seg_bytes.locs[i],
            seg_bytes.bytes[i]);
}

/* gshm_requests_total: series appear with their first request; the
 * family's metadata with its first series (no metadata without samples). */
static void write_requests(FILE *f, struct gshmd_server *s) {
  for (int op = 1, any = 0; op <= GSHM_WIRE_TYPE_MAX; op++)
    for (unsigned st = 0; st < s->nstatus; st++) {
      uint64_t *n = gshmd_server_requests(s, (unsigned)op, st);
      char b[32];
      if (!n || !*n)
        continue;
      if (!any++)
        fprintf(f, "# HELP gshm_requests_total Requests answered, by operation and status.\n"
                   "# TYPE gshm_requests_total counter\n");
      fprintf(f, "gshm_requests_total{op=\"%s\",status=\"%s\"} %" PRIu64 "\n", op_names[op],
              status_label((int)st, b, sizeof(b)), *n);
    }
}

static void write_server_counters(FILE *f, struct gshmd_server *s) {
  write_one(f, "counter", "gshm_protocol_errors_total",
            "Clients dropped for breaking the protocol.", s->protocol_errors);
  write_one(f, "counter", "gshm_quota_denials_total", "Requests refused by a quota.",
            s->quota_denials);
  write_one(f, "counter", "gshm_access_denials_total", "Requests refused by permissions.",
            s->access_denials);
  write_one(f, "counter", "gshm_timeouts_total",
            "Connections dropped for no hello in time or idleness.", s->timeouts);
  write_one(f, "counter", "gshm_accept_pauses_total",
            "Times gshmd stopped accepting at its fd limit.", s->accept_pauses);
  write_one(f, "counter", "gshm_fds_sent_total", "File descriptors handed to clients.",
            s->fds_sent);
  write_one(f, "counter", "gshm_log_lines_dropped_total",
            "Log lines not written: a uid's clients, or a cluster peer's messages, made gshmd "
            "log more than its rate.",
            s->loglimit.dropped);
}

/* The host backend's recycling of pulled memory (daemon.host_recycle). */
static void write_recycle(FILE *f, const struct gshmd_backend *host) {
  struct gshmd_host_recycle_stats st;

  gshmd_backend_host_recycle_stats(host, &st);
  write_one(f, "counter", "gshm_cluster_recycled_pulls_total",
            "Pulled host segments that landed in memory kept by daemon.host_recycle.", st.pulls);
  write_one(f, "gauge", "gshm_cluster_recycle_bytes",
            "Bytes of freed pulled memory kept for later pulls (daemon.host_recycle).",
            st.bytes_held);
  write_one(f, "gauge", "gshm_cluster_recycle_segments",
            "Freed pulled segments whose memory is kept for later pulls.", st.entries);
  write_one(f, "counter", "gshm_cluster_recycle_refused_total",
            "Freed pulled segments not kept because another process could still reach them.",
            st.refused_held);
  write_one(f, "gauge", "gshm_host_pull_huge_pages",
            "How pulled host segments of 2 MiB and up get 2 MiB pages: 0 not at all (4 KiB "
            "pages), 1 the kernel's (transparent_hugepage/shmem_enabled lets MADV_HUGEPAGE), "
            "2 built by gshmd with MADV_COLLAPSE (shmem_enabled is never).",
            !gshmd_backend_host_huge_pulls(host) ? 0 : gshmd_backend_host_collapse(host) ? 2 : 1);
  write_one(f, "counter", "gshm_host_huge_built_bytes_total",
            "Bytes of 2 MiB pages of pulled host segments built with MADV_COLLAPSE (each "
            "page once, however many threads asked for it).",
            gshmd_host_collapsed_bytes());
  write_one(f, "counter", "gshm_host_huge_rebuilt_bytes_total",
            "Bytes of pulled host segments collapsed again once their bytes were all in, "
            "where every thread that built a 2 MiB page of them found it busy (a page "
            "built meanwhile counts here too).",
            gshmd_host_collapsed_again_bytes());
  write_one(f, "counter", "gshm_host_huge_nomem_total",
            "Collapses (MADV_COLLAPSE) that found no free 2 MiB page, each followed by a "
            "second without building: the pages left are 4 KiB ones.",
            gshmd_host_collapse_nomem());
}

int gshmd_metrics_render(struct gshmd_server *s, char **text_out) {
  struct gshmd_registry *r = s->reg;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);

  if (!f)
    return -ENOMEM;
  fprintf(f, "# HELP gshm_up Whether gshmd is serving.\n# TYPE gshm_up gauge\ngshm_up 1\n");
  fprintf(f, "# HELP gshm_start_time_seconds When gshmd started (Unix time).\n"
             "# TYPE gshm_start_time_seconds gauge\ngshm_start_time_seconds %.3f\n",
          (double)s->started_ns / 1e9);
  write_one(f, "gauge", "gshm_segments", "Segments held, live or unlinked-but-leased.",
            r->nsegments);
  write_segment_bytes(f, r);
  write_one(f, "gauge", "gshm_leases", "Leases held by clients.", r->nleases);
  write_one(f, "gauge", "gshm_clients", "Client connections that said hello.", r->nclients);
  write_one(f, "gauge", "gshm_connections", "Open connections, including before hello.",
            s->nconns);
  write_one(f, "counter", "gshm_connections_total", "Connections accepted.",
            s->connections_total);
  write_requests(f, s);
  gshmd_histogram_write_family(f, "gshm_request_duration_seconds",
                               "Time from a request's receipt to its reply.");
  gshmd_histogram_write_series(f, "gshm_request_duration_seconds", NULL, &s->duration);
  write_server_counters(f, s);
  write_one(f, "gauge", "gshm_gpu_fault",
            "1 while the GPUs are unusable: a sticky CUDA error at gshmd's start, or no CUDA "
            "driver at its start with device segments in the fd store (device segments "
            "parked, device creates refused; STATUS= and gshmctl status name it).",
            *r->gpu_fault ? 1 : 0);
  write_one(f, "counter", "gshm_gpu_probes_total",
            "GPU probes (child processes) run since such an error.", r->gpu_probes);
  write_one(f, "gauge", "gshm_fdstore_pending", "Segments whose state the fd store is behind by.",
            r->fdstore_pending);
  write_one(f, "gauge", "gshm_fdstore_fds_held",
            "Segment fds queued in the fd store's buckets: fds in flight counted against gshmd's "
            "uid (docs/SECURITY.md).",
            r->fdstore_fds_held);
  write_one(f, "counter", "gshm_fdstore_failed_sends_total",
            "Notifications to the fd store that failed.", r->fdstore_failed_sends);
  gshmd_cluster_metrics(s->cluster, f);
  write_recycle(f, r->host);
  if (fclose(f) != 0) {
    free(text);
    return -ENOMEM;
  }
  *text_out = text;
  return 0;
}

/* metrics.h */
int gshmd_metrics_store_textfile(const char *path, const char *text) {
  static int last_err; /* one call at a time (see metrics.h) */
  char tmp[4200];
  size_t len = strlen(text);
  int fd, e;

  /* A new file of a random name next to the target (mkostemp: O_EXCL, so
   * never through a symlink someone planted there; gshmd may run as
   * root in a directory others write), then renamed over it. */
  if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-gshmd-XXXXXX", path) >= sizeof(tmp))
    return -ENAMETOOLONG;
  fd = mkostemp(tmp, O_CLOEXEC);
  e = fd < 0 ? -errno : 0;
  if (!e && (write(fd, text, len) != (ssize_t)len || fchmod(fd, 0644) < 0 || fsync(fd) < 0))
    e = errno ? -errno : -EIO;
  if (fd >= 0 && close(fd) < 0 && !e)
    e = -errno;
  if (!e && rename(tmp, path) < 0)
    e = -errno;
  if (e) {
    if (fd >= 0)
      unlink(tmp); /* ours (mkostemp made it) */
    if (e != last_err)
      gshm_log_err("metrics textfile %s: %s", path, strerror(-e));
  }
  last_err = e;
  return e;
}

int gshmd_metrics_memfd(const char *text, size_t len) {
  int fd = memfd_create("gshm-metrics", MFD_CLOEXEC | MFD_ALLOW_SEALING), e;

  if (fd < 0)
    return -errno;
  for (size_t done = 0; done < len;) {
    ssize_t n = write(fd, text + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      e = n < 0 ? -errno : -EIO;
      close(fd);
      return e;
    }
    done += (size_t)n;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
    e = -errno;
    close(fd);
    return e;
  }
  return fd;
}
