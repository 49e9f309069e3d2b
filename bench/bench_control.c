#include <stdio.h>

#include "bench.h"

/* Placeholder until the control benchmark lands. */
int bench_control_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "gshm-bench control: not built yet\n");
  return 1;
}
