/* SPDX-License-Identifier: Apache-2.0 */
/* A sticky CUDA error and what gshmd does about it (docs/ARCHITECTURE.md
 * "A sticky CUDA error restarts gshmd" and "A sticky CUDA error at start:
 * host served, GPUs probed"): met at start (or a CUDA driver that does
 * not start at all while the fd store holds device segments), gshmd serves host segments,
 * keeps every device segment parked, refuses device creates, and probes
 * the GPUs in a child process (never CUDA in gshmd itself after the
 * error) until one succeeds; then it stops for a restart that adopts the
 * device segments again.  Met at run time, it stops for that restart at
 * once. */
#ifndef GSHMD_GPU_FAULT_H
#define GSHMD_GPU_FAULT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "util.h"

struct gshmd_registry;
struct gshmd_fdstore;

/* main's status when gshmd stops for a restart (a sticky CUDA error at
 * run time, or the GPUs working again after one at start): EX_TEMPFAIL, a
 * failure that gshmd.service's Restart=on-failure restarts. */
#define GSHMD_EXIT_RESTART 75

/* Seconds daemon.sticky_start = restart waits before that exit, when the
 * error came at start (gshmd_gpu_fault_start_wait). */
#define GSHMD_STICKY_START_DELAY_S 10

/* gshmd's hidden first argument that makes it a GPU probe
 * (gshmd_gpu_fault_probe_main), followed by its log level. */
#define GSHMD_PROBE_FLAG "--probe-gpus"

/* A probe still running after this many milliseconds (a driver hung on a
 * broken GPU) is killed and counts as failed. */
#define GSHMD_PROBE_TIMEOUT_MS 60000

/* registry.gpu_fault's start where the CUDA driver did not start at all
 * (gshmd_gpu_fault_take_backend): util.h's, which gshmctl reads too. */
#define GSHMD_NO_DRIVER_PREFIX GSHM_GPU_FAULT_NO_DRIVER

/* The probes of one gshmd, on its loop. */
struct gshmd_gpu_fault {
  uv_loop_t *loop;
  struct gshmd_registry *reg;  /* its gpu_fault and gpu_probes */
  int log_level;               /* gshmd's: a probe logs only where it is debug */
  uv_timer_t timer;
  uv_process_t proc;           /* the probe running (running) or closing */
  bool timer_on, running, closing;
  uint64_t started_ms;         /* the running probe's start, uv_now */
  uint64_t begun_ms;           /* probing's start, uv_now: a restart for working
                                * GPUs comes no sooner than
                                * GSHMD_STICKY_START_DELAY_S after it */
  bool back;                   /* a probe succeeded: the GPUs work again */
  bool restarting;             /* gshmd stops for a restart because of back */
  bool said;                   /* said once why gshmd does not restart by itself */
  const char *no_driver;       /* why the CUDA backend did not start (static text),
                                * NULL when it did or was not wanted: set by main */
};

/* Records a sticky CUDA error at start in r (r->gpu_fault: fault, as
 * gshmd_backend.fault) and logs once what gshmd does now: serves host
 * segments, device segments parked, device creates refused, the GPUs
 * probed every probe_ms milliseconds. */
void gshmd_gpu_fault_set(struct gshmd_registry *r, const char *fault, uint32_t probe_ms);

/* After the restore: where it met a sticky CUDA error (r->cuda's
 * needs_restart; the fd store parked the device segments after it), the
 * segments adopted before it are parked too (gshmd_registry_park_all), the
 * CUDA backend destroyed without a driver call (r->cuda NULL) and the
 * error recorded (gshmd_gpu_fault_set).  Where the CUDA backend did not
 * start at all (g->no_driver: cuInit failing, libcuda.so.1 missing) and
 * the restore parked device segments, r->gpu_fault is set to
 * GSHMD_NO_DRIVER_PREFIX and g->no_driver, r->gpu_no_driver true, and
 * logged once: the probes (gshmd_gpu_fault_probe_start) and the restart
 * once they work are then a sticky error's.  Nothing otherwise; probe_ms
 * (milliseconds) is only said in the log. */
void gshmd_gpu_fault_take_backend(struct gshmd_gpu_fault *g, struct gshmd_registry *r,
                                  uint32_t probe_ms);

/* Starts probing the GPUs every interval_ms milliseconds, on loop, where
 * r->gpu_fault says they are unusable (a sticky error or no driver at
 * start; else nothing).  Each probe is
 * gshmd itself run again as a child (/proc/self/exe GSHMD_PROBE_FLAG),
 * which sets up every GPU as gshmd's start does and exits 0 when that
 * works.  Returns 0, or a negative errno from libuv (nothing started). */
int gshmd_gpu_fault_probe_start(struct gshmd_gpu_fault *g, uv_loop_t *loop,
                                struct gshmd_registry *r, uint32_t interval_ms, int log_level);

/* Stops probing: the timer closed, a running probe killed (SIGKILL).  The
 * handles finish closing on the loop.  Accepts a g never started. */
void gshmd_gpu_fault_probe_stop(struct gshmd_gpu_fault *g);

/* Whether gshmd should stop now for a restart (exit GSHMD_EXIT_RESTART,
 * every segment kept in the fd store): r->cuda met a sticky error at run
 * time, or a probe found the GPUs working (g->back; g->restarting set).
 * Only while fs would bring back every segment (gshmd_fdstore_keeps_all);
 * without a service manager's store, said once why not.  Logs and sends
 * STATUS= when true.  Call once a second, on the loop. */
bool gshmd_gpu_fault_restart_due(struct gshmd_gpu_fault *g, struct gshmd_registry *r,
                                 const struct gshmd_fdstore *fs);

/* daemon.sticky_start = restart: the wait before exiting for a restart
 * after a sticky error at start (GSHMD_STICKY_START_DELAY_S, petting the
 * watchdog), said in the log and STATUS=. */
void gshmd_gpu_fault_start_wait(void);

/* Sleeps GSHMD_STICKY_START_DELAY_S seconds, telling the service manager
 * WATCHDOG=1 each second: the wait of a start that failed before it exits
 * (gshmd_gpu_fault_start_wait; main.c start_failed_wait, for any other
 * failed start while the fd store holds segments), so that
 * Restart=on-failure never reaches the unit's start limit.  No errors. */
void gshmd_start_delay(void);

/* The probe: gshmd run as `gshmd --probe-gpus LEVEL` (argv[2], the log
 * level; its stderr is gshmd's).  Sets up the CUDA backend as gshmd's
 * start does and releases it, and ends the process (_exit): status 0 the
 * GPUs work, 1 not (any error: no driver, no GPU, a sticky error). */
_Noreturn void gshmd_gpu_fault_probe_main(int argc, char **argv);

#endif
