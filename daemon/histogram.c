/* SPDX-License-Identifier: Apache-2.0 */
/* Fixed-bucket latency histograms and their Prometheus text form. */
#include "histogram.h"

#include <inttypes.h>

const double gshmd_duration_bounds[GSHMD_NBUCKETS] = {
    5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 25e-3, 100e-3, 1.0};

void gshmd_histogram_observe(struct gshmd_histogram *h, int64_t ns) {
  double sec = ns > 0 ? (double)ns / 1e9 : 0.0;
  unsigned i = 0;

  while (i < GSHMD_NBUCKETS && sec > gshmd_duration_bounds[i])
    i++;
  h->buckets[i]++;
  h->count++;
  h->sum += sec;
}

void gshmd_histogram_write_family(FILE *f, const char *name, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
}

void gshmd_histogram_write_series(FILE *f, const char *name, const char *labels,
                                  const struct gshmd_histogram *h) {
  const char *sep = labels && *labels ? "," : "";
  uint64_t cum = 0;

  if (!labels)
    labels = "";
  for (int i = 0; i < GSHMD_NBUCKETS; i++) {
    cum += h->buckets[i];
    fprintf(f, "%s_bucket{%s%sle=\"%g\"} %" PRIu64 "\n", name, labels, sep,
            gshmd_duration_bounds[i], cum);
  }
  cum += h->buckets[GSHMD_NBUCKETS];
  fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, sep, cum);
  if (*labels) {
    fprintf(f, "%s_sum{%s} %.9f\n", name, labels, h->sum);
    fprintf(f, "%s_count{%s} %" PRIu64 "\n", name, labels, h->count);
  } else {
    fprintf(f, "%s_sum %.9f\n", name, h->sum);
    fprintf(f, "%s_count %" PRIu64 "\n", name, h->count);
  }
}
