/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by gshm-bench's subcommands (bench.h). */
#include <stdlib.h>

#include "bench.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
