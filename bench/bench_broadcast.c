#include <stdio.h>

#include "bench.h"

/* Placeholder until the broadcast benchmark lands. */
int bench_broadcast_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "gshm-bench broadcast: not built yet\n");
  return 1;
}
