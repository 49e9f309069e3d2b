/* SPDX-License-Identifier: Apache-2.0 */
/* A sticky CUDA error, or no CUDA driver at start while the fd store holds
 * device segments: the degraded start (host served, device segments
 * parked, the GPUs probed in a child process) and the stop for a restart
 * (gpu_fault.h). */
#include "gpu_fault.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "backend.h"
#include "fdstore.h"
#include "log.h"
#include "registry.h"

void gshmd_gpu_fault_set(struct gshmd_registry *r, const char *fault, uint32_t probe_ms) {
  snprintf(r->gpu_fault, sizeof(r->gpu_fault), "%s", *fault ? fault : "cuda: CUDA_ERROR_?");
  gshm_log_err("the GPUs are unusable: a sticky CUDA error at start (%s); serving host segments "
               "only, device segments kept parked in the fd store and device creates refused "
               "until a probe (every %u ms, in a child process) finds the GPUs working",
               r->gpu_fault, probe_ms);
}

/* No CUDA backend at start (why: g->no_driver) and device segments the
 * restore parked: probed as after a sticky error, since a driver loaded
 * later (a reload, a module loaded after gshmd) serves them only after a
 * restart.  Without parked segments nothing waits for the GPUs. */
static void take_no_driver(struct gshmd_gpu_fault *g, struct gshmd_registry *r,
                           uint32_t probe_ms) {
  struct gshm_list *pos;
  unsigned n = 0;

  gshm_list_foreach(pos, &r->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    n += seg->mem && seg->mem->backend == gshmd_backend_parked();
  }
  if (!n)
    return;
  snprintf(r->gpu_fault, sizeof(r->gpu_fault), GSHMD_NO_DRIVER_PREFIX "%s", g->no_driver);
  r->gpu_no_driver = true;
  gshm_log_err("the CUDA driver did not start (%s) while the fd store holds %u device "
               "segment(s): serving host segments only, device segments kept parked and device "
               "creates refused until a probe (every %u ms, in a child process) finds the GPUs "
               "working; then gshmd restarts to adopt them",
               g->no_driver, n, probe_ms);
}

void gshmd_gpu_fault_take_backend(struct gshmd_gpu_fault *g, struct gshmd_registry *r,
                                  uint32_t probe_ms) {
  struct gshmd_backend *b = r->cuda;
  char fault[GSHMD_FAULT_MAX];
  unsigned n;

  if (!b && g->no_driver && !*r->gpu_fault)
    take_no_driver(g, r, probe_ms);
  if (!gshmd_backend_needs_restart(b))
    return;
  if ((n = gshmd_registry_park_all(r, b)))
    gshm_log_notice("%u device segment(s) adopted before the CUDA error kept parked", n);
  memcpy(fault, b->fault, sizeof(fault));
  fault[sizeof(fault) - 1] = '\0';
  r->cuda = NULL;
  b->ops->destroy(b); /* (no driver call after a sticky error) */
  gshmd_gpu_fault_set(r, fault, probe_ms);
}

static void probe_closed(uv_handle_t *h) {
  struct gshmd_gpu_fault *g = h->data;
  g->closing = false;
}

static void probe_exited(uv_process_t *p, int64_t status, int sig) {
  struct gshmd_gpu_fault *g = p->data;

  g->running = false;
  g->closing = true;
  uv_close((uv_handle_t *)p, probe_closed);
  g->reg->gpu_probes++;
  if (status != 0 || sig) {
    gshm_log_debug("gpu probe: the GPUs are still unusable (probe %s %d)",
                   sig ? "killed by signal" : "exit status", sig ? sig : (int)status);
    return;
  }
  g->back = true;
  if (g->timer_on)
    uv_timer_stop(&g->timer);
  gshm_log_notice("gpu probe: the GPUs work again (a child process set every one up)");
}

/* One probe: gshmd again, as a child, with GSHMD_PROBE_FLAG; its stdin
 * and stdout nowhere, its stderr gshmd's (it logs only at debug level). */
static void probe_spawn(struct gshmd_gpu_fault *g) {
  char level[8];
  char *args[] = {"gshmd", GSHMD_PROBE_FLAG, level, NULL};
  uv_stdio_container_t io[3] = {
      {.flags = UV_IGNORE}, {.flags = UV_IGNORE}, {.flags = UV_INHERIT_FD, .data.fd = 2}};
  uv_process_options_t o = {.exit_cb = probe_exited, .file = "/proc/self/exe", .args = args,
                             .stdio = io, .stdio_count = 3};
  int e;

  snprintf(level, sizeof(level), "%d", g->log_level >= GSHM_LOG_DEBUG ? GSHM_LOG_DEBUG : 0);
  g->proc.data = g;
  if ((e = uv_spawn(g->loop, &g->proc, &o))) {
    gshm_log_warn("gpu probe: cannot start /proc/self/exe: %s", uv_strerror(e));
    g->closing = true;
    uv_close((uv_handle_t *)&g->proc, probe_closed);
    return;
  }
  g->running = true;
  g->started_ms = uv_now(g->loop);
}

static void probe_tick(uv_timer_t *t) {
  struct gshmd_gpu_fault *g = t->data;

  if (g->back || g->closing)
    return;
  if (!g->running)
    probe_spawn(g);
  else if (uv_now(g->loop) - g->started_ms > GSHMD_PROBE_TIMEOUT_MS)
    uv_process_kill(&g->proc, SIGKILL); /* (probe_exited counts it failed) */
}

int gshmd_gpu_fault_probe_start(struct gshmd_gpu_fault *g, uv_loop_t *loop,
                                struct gshmd_registry *r, uint32_t interval_ms, int log_level) {
  int e;

  if (!*r->gpu_fault)
    return 0;
  g->loop = loop;
  g->reg = r;
  g->log_level = log_level;
  if ((e = uv_timer_init(loop, &g->timer)))
    return e;
  g->timer.data = g;
  g->timer_on = true;
  g->begun_ms = uv_now(loop);
  uv_unref((uv_handle_t *)&g->timer);
  return uv_timer_start(&g->timer, probe_tick, interval_ms, interval_ms);
}

void gshmd_gpu_fault_probe_stop(struct gshmd_gpu_fault *g) {
  if (g->timer_on)
    uv_close((uv_handle_t *)&g->timer, NULL);
  g->timer_on = false;
  if (g->running) {
    uv_process_kill(&g->proc, SIGKILL);
    g->running = false;
    g->closing = true;
    uv_close((uv_handle_t *)&g->proc, probe_closed);
  }
}

bool gshmd_gpu_fault_restart_due(struct gshmd_gpu_fault *g, struct gshmd_registry *r,
                                 const struct gshmd_fdstore *fs) {
  bool sticky = gshmd_backend_needs_restart(r->cuda);

  if (!sticky && !g->back)
    return false;
  /* (a probe that works where the next start still fails, e.g. imports,
   * would restart gshmd each gpu_probe_ms: at 100 ms systemd's
   * StartLimitBurst would fail the unit and drop its store, every segment;
   * waiting GSHMD_STICKY_START_DELAY_S from the start keeps such a loop
   * to 3 starts in StartLimitIntervalSec=30s, whatever gpu_probe_ms) */
  if (!sticky && uv_now(g->loop) - g->begun_ms < GSHMD_STICKY_START_DELAY_S * 1000ull)
    return false;
  /* without the store (started by hand, in a container) a restart would
   * lose every name, host segments' too: gshmd serves on and says so; a
   * store behind catches up first (retried each second) */
  if (!gshmd_fdstore_keeps_all(fs)) {
    if (!fs->enabled && !g->said && sticky)
      gshm_log_err("device requests fail until gshmd is restarted (a sticky CUDA error, above); "
                   "it does not restart by itself without systemd's fd store, which would lose "
                   "every segment");
    else if (!fs->enabled && !g->said)
      gshm_log_notice("restart gshmd to serve device segments again; it does not restart by "
                      "itself without systemd's fd store, which would lose every segment");
    g->said = true;
    return false;
  }
  g->restarting = !sticky;
  gshm_log_notice("stopping for a restart (exit status %d)%s; every segment stays in the fd "
                  "store",
                  GSHMD_EXIT_RESTART, sticky ? "" : " that adopts the device segments again");
  sd_notify(0, sticky ? "STATUS=stopping for a restart after a sticky CUDA error (see the log)"
                      : "STATUS=the GPUs work again: stopping for a restart");
  return true;
}

void gshmd_gpu_fault_start_wait(void) {
  gshm_log_err("a sticky CUDA error at start (above): restart in %d s (daemon.sticky_start = "
               "restart); nothing is served, every segment kept in the fd store, until the GPU "
               "works", GSHMD_STICKY_START_DELAY_S);
  sd_notify(0, "STATUS=a sticky CUDA error at start: restarting until the GPU works");
  gshmd_start_delay();
}

void gshmd_start_delay(void) {
  for (int i = 0; i < GSHMD_STICKY_START_DELAY_S; i++) {
    sd_notify(0, "WATCHDOG=1");
    sleep(1);
  }
}

_Noreturn void gshmd_gpu_fault_probe_main(int argc, char **argv) {
  static const char *const gone[] = {"NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID",
                                     "LISTEN_FDNAMES", "WATCHDOG_USEC", "WATCHDOG_PID"};
  struct gshmd_backend *b = NULL;
  int level = argc > 2 ? atoi(argv[2]) : GSHM_LOG_ERR;

  /* a child, not gshmd: nothing to tell the service manager */
  for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
    unsetenv(gone[i]);
  gshm__log_setup("gshmd-probe", level, !isatty(STDERR_FILENO));
  if (gshmd_backend_cuda_create(NULL, &b, NULL))
    _exit(1);
  b->ops->destroy(b);
  /* (no exit handlers: the exit status is the answer, and a sanitizer's
   * report at exit must not turn working GPUs into a failed probe) */
  _exit(0);
}
