/* SPDX-License-Identifier: Apache-2.0 */
/* A strict parser of the Prometheus text exposition format 0.0.4, for
 * the metrics tests: every line checked (names, labels and their escapes,
 * values, HELP and TYPE placement), histograms checked for cumulative
 * buckets, +Inf, _sum and _count. */
#ifndef GSHM_TESTS_PROMETHEUS_H
#define GSHM_TESTS_PROMETHEUS_H

#include <stdbool.h>
#include <stddef.h>

struct sample {
  char *name;   /* as written: gshm_x_bucket */
  char *labels; /* canonical: sorted k=v joined by ',' (values unescaped) */
  double value;
};

struct family {
  char *name;
  char type[16]; /* "" when no TYPE line */
  bool help;
  bool closed; /* a later family started: no more samples may come */
};

struct exposition {
  struct sample *s;
  size_t ns, caps;
  struct family *f;
  size_t nf, capf;
  char err[256];
  int line;
};

/* Parses a whole exposition into *x (which it overwrites); returns 0, or
 * -1 with the reason in x->err (and x->line).  Free x with expo_free
 * either way. */
int expo_parse(struct exposition *x, const char *text);

/* Frees what expo_parse allocated in *x. */
void expo_free(struct exposition *x);

/* A sample's value; NAN when absent.  labels: canonical ("a=x,b=y") or NULL
 * for none. */
double expo_get(const struct exposition *x, const char *name, const char *labels);

/* The TYPE of family ("" when it had none), NULL when there is no such
 * family. */
const char *expo_type(const struct exposition *x, const char *family);

#endif
