/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench: one program, one subcommand per file (bench_<name>.c). */
#ifndef GSHM_BENCH_H
#define GSHM_BENCH_H

#include <getopt.h>
#include <stddef.h>

int bench_copy_main(int argc, char **argv);      /* bench_copy.c */
int bench_broadcast_main(int argc, char **argv); /* bench_broadcast.c */
int bench_attach_main(int argc, char **argv);    /* bench_attach.c */
int bench_control_main(int argc, char **argv);   /* bench_control.c */
int bench_pull_main(int argc, char **argv);      /* bench_pull.c */
int bench_seal_main(int argc, char **argv);      /* bench_seal.c */

/* Runs the rest of gshm-bench in a child and makes this process its
 * supervisor (supervise.c): when the benchmark ends, or SIGTERM, SIGINT or
 * SIGHUP (those not ignored at start) comes, every process the benchmark
 * started is sent SIGTERM (SIGKILL 10 s later, or at a second signal) and
 * reaped, then the supervisor exits with the benchmark's status, or dies
 * by the signal (the benchmark's, or the one received: $? 128 + it).
 * The benchmark runs with TMPDIR set to a directory the supervisor made
 * and removes at the end, signal or not; a SIGKILLed supervisor stops the
 * benchmark and its children (but leaves that directory).
 * GSHM_BENCH_SUPERVISE=0 in the environment: no supervisor (for a
 * profiler or debugger that follows only the process it started), returns
 * 0 at once.  Call before any thread exists.  Returns 0 in the child;
 * -errno (prctl, fork) when no supervisor could be made: the caller runs
 * unsupervised.  Never returns in the supervisor. */
int bench_supervise(void);

/* ---- shared by the subcommands (bench_util.c) ---- */

/* The value of subcommand cmd's integer option opt ("--reps"), text s:
 * a decimal integer from min to INT_MAX.  Anything else (no number,
 * junk after it, below min) prints "gshm-bench CMD: OPT takes an integer
 * ..." and exits 2, a usage error: atoi made "--runs x" 0 and ran. */
int bench_int_arg(const char *cmd, const char *opt, const char *s, int min);

/* Refuses an option given twice on one command line, where the second
 * value would silently replace the first (--set, --iters): seen[c]
 * (zeroed by the caller, one array per parse) marks option code c, the
 * code getopt_long returned or the one a hand-written parser gives it in
 * its table lo (terminated by a NULL name), as given.  Options that may
 * repeat (--gshmd-set, --size) are not passed.  The second time prints
 * "gshm-bench CMD: --NAME given twice ..." and exits 2, a usage error. */
void bench_opt_once(const char *cmd, const struct option *lo, int c, unsigned char seen[256]);
/* The same for a hand-written parser at argv word arg ("--reps"): an arg
 * that is no "--NAME" of lo is left to the parser. */
void bench_opt_once_arg(const char *cmd, const struct option *lo, const char *arg,
                        unsigned char seen[256]);

/* Median of v[0..n-1] (n >= 1); sorts v in place. */
double bench_median(double *v, int n);

/* Fills the n bytes at p with pseudo-random bytes (splitmix64 from a
 * fixed seed: not zeros, not one repeated byte, the same every run). */
void bench_fill_random(void *p, size_t n);
/* CPU time (user + system, seconds) a process has used so far, all its
 * threads, those that ended included: pid > 0 from its CPU clock
 * (clock_getcpuclockid: nanoseconds), else /proc/PID/stat (clock ticks:
 * 10 ms steps at 100 Hz); pid 0 this process (getrusage).  -1 where it
 * cannot be read. */
double bench_cpu_s(int pid);
/* Thread classes of a gshmd: its loop (the main thread), the data lanes'
 * receiving and sending threads (named by daemon/cluster/lane.c), the
 * rest (libuv's pool); bench_thr_name[class] names them. */
enum { BENCH_THR_LOOP, BENCH_THR_RX, BENCH_THR_TX, BENCH_THR_POOL, BENCH_THR_N };
extern const char *const bench_thr_name[BENCH_THR_N];
/* Adds the user and system CPU seconds of each live thread of process
 * pid to v[class][0] and v[class][1] (/proc/PID/task/TID/stat fields 14
 * and 15; threads that ended are not counted).  A pid that is gone adds
 * nothing. */
void bench_thread_cpu(int pid, double v[BENCH_THR_N][2]);

/* Runs a CUDA driver call through `drv` (a struct gshm_cudadrv *, see
 * common/cudadrv.h); on failure prints "gshm-bench PROG: CALL failed: NAME"
 * with the place and exits 1. */
#define BENCH_CU(drv, prog, call)                                                        \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char *n_ = "?";                                                            \
      (drv)->cuGetErrorName(r_, &n_);                                                  \
      fprintf(stderr, "gshm-bench %s: %s failed: %s (%s:%d)\n", prog, #call, n_,       \
              __FILE__, __LINE__);                                                     \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

#endif
