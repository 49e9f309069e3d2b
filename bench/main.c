/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench: benchmarks are programs, not timed tests (docs/ARCHITECTURE.md
 * "Configuration, metrics, tools").
 * Each subcommand prints a table (and --json where it has one) and writes
 * nothing else; docs/PERFORMANCE.md records what it printed.  It runs under
 * a supervisor (supervise.c) that stops whatever it started when it ends or
 * is stopped. */
#include <stdio.h>
#include <string.h>

#include "bench.h"

#ifndef GSHM_VERSION
#error "GSHM_VERSION comes from project() in CMakeLists.txt"
#endif

static const struct {
  const char *name;
  int (*main)(int, char **);
  const char *help;
} subcommands[] = {
    {"copy", bench_copy_main, "P2P bandwidth/latency: copy engine vs SM kernels vs gshm_copy AUTO"},
    {"broadcast", bench_broadcast_main, "one GPU to many: gshm_broadcast vs ncclBroadcast"},
    {"attach", bench_attach_main, "create/open/map costs vs raw driver import and cudaIpc"},
    {"control", bench_control_main, "control-plane throughput and latency with N clients"},
    {"pull", bench_pull_main, "a peer gshmd's segment pulled vs K TCP streams, ucx_perftest"},
    {"seal", bench_seal_main, "a core tagging data frames per construction (seal.c) vs memcpy"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: gshm-bench SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n"
             "       gshm-bench --version\n\n");
  for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
    fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].help);
  fprintf(f, "\nEach measures against its anchor in the same run and prints medians after a\n"
             "warm-up, with units (GB/s = 1e9 bytes/s); SUBCOMMAND --help says what it times.\n");
  fprintf(f, "\nSIGTERM, SIGINT or SIGHUP stops the benchmark and every gshmd and process it\n"
             "started; gshm-bench then dies by that signal ($? 128 + the signal).  The benchmark\n"
             "runs in a child of a small supervisor: for a profiler or debugger that follows\n"
             "only the process it starts (nsys, gdb) set GSHM_BENCH_SUPERVISE=0.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
    printf("gshm-bench " GSHM_VERSION "\n");
    return 0;
  }
  for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
    if (!strcmp(argv[1], subcommands[i].name)) {
      int e = bench_supervise(); /* a signal mid-run leaves no gshmd behind */
      if (e)
        fprintf(stderr, "gshm-bench: no supervisor (%s): a signal may leave gshmd running\n",
                strerror(-e));
      return subcommands[i].main(argc - 1, argv + 1);
    }
  fprintf(stderr, "gshm-bench: unknown subcommand '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
