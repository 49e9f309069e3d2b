/* SPDX-License-Identifier: Apache-2.0 */
/* A fixed-bucket latency histogram and its Prometheus text form: the
 * daemon's request service time (server.c feeds it, metrics.c renders it),
 * and any other latency a subsystem wants to export (the cluster's, for
 * one) without reaching into metrics.c.  Plain data, no locking: one
 * thread observes and renders. */
#ifndef GSHMD_HISTOGRAM_H
#define GSHMD_HISTOGRAM_H

#include <stdint.h>
#include <stdio.h>

#define GSHMD_NBUCKETS 12

/* Upper bounds in seconds: 5 us .. 1 s, about 3x apart. */
extern const double gshmd_duration_bounds[GSHMD_NBUCKETS];

/* Bucket i counts observations <= gshmd_duration_bounds[i], the last one
 * the rest.  Zero-initialise to start empty. */
struct gshmd_histogram {
  uint64_t buckets[GSHMD_NBUCKETS + 1];
  uint64_t count;
  double sum; /* seconds */
};

/* Counts one observation of ns nanoseconds (negative counts as 0) in h. */
void gshmd_histogram_observe(struct gshmd_histogram *h, int64_t ns);

/* Writes the "# HELP" and "# TYPE ... histogram" lines of family name
 * (a Prometheus metric name in base units, e.g. "gshm_x_seconds") to f.
 * Write them once per family, before its first series. */
void gshmd_histogram_write_family(FILE *f, const char *name, const char *help);

/* Writes one series of family name to f: the cumulative _bucket lines
 * (le="..." up to "+Inf"), _sum (seconds) and _count.  labels is NULL or
 * "" for none, else the text inside the braces without le, already
 * escaped, such as `peer="b"`. */
void gshmd_histogram_write_series(FILE *f, const char *name, const char *labels,
                                  const struct gshmd_histogram *h);

#endif
