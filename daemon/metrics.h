/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition of gshmd's state (metrics.c), used by the
 * METRICS request (requests.c), the textfile timer (main.c) and the HTTP
 * endpoint's snapshot (metrics_http.c), and the request latency histogram
 * that server.c feeds.  Loop thread only, but for
 * gshmd_metrics_store_textfile. */
#ifndef GSHMD_METRICS_H
#define GSHMD_METRICS_H

#include <stdint.h>

struct gshmd_server;

#define GSHMD_NBUCKETS 12

/* Upper bounds in seconds: 5 us .. 1 s, about 3x apart. */
extern const double gshmd_duration_bounds[GSHMD_NBUCKETS];

/* Request service time (receive to reply sent), a fixed-bucket histogram:
 * bucket i counts requests <= gshmd_duration_bounds[i], the last one the
 * rest. */
struct gshmd_histogram {
  uint64_t buckets[GSHMD_NBUCKETS + 1];
  uint64_t count;
  double sum; /* seconds */
};

/* Counts one request that took ns nanoseconds in h. */
void gshmd_histogram_observe(struct gshmd_histogram *h, int64_t ns);

/* Renders the exposition (format 0.0.4) of s into *text_out, a
 * NUL-terminated malloc'ed string the caller frees.  Errors: -ENOMEM. */
int gshmd_metrics_render(struct gshmd_server *s, char **text_out);

/* Writes `text` (an exposition from gshmd_metrics_render) to `path`
 * atomically: a new temporary file in the same directory (mkostemp; named
 * so that node_exporter's *.prom glob never reads it half-written), fsync,
 * mode 0644, rename over the target.  Touches no daemon state, so it may
 * run off the loop (main.c runs it on libuv's thread pool: the fsync must
 * not stall the clients), one call at a time.  Returns 0 or a negative
 * errno (logged once per distinct error). */
int gshmd_metrics_store_textfile(const char *path, const char *text);

#endif
