/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's fd limit at start: see fd_limit.h. */
#include "fd_limit.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "backend.h"
#include "log.h"

#ifndef GSHMD_UNIT_LIMIT_NOFILE
#define GSHMD_UNIT_LIMIT_NOFILE 1048576 /* LimitNOFILE= of gshmd.service */
#endif

void gshmd_fd_limit_setup(const struct gshmd_config *cfg, char *warning, size_t warning_size) {
  /* a connection: 1 fd; a segment: its memory and a read-only reopen (host)
   * or a cached export (cuda); plus the loop, the listener, logging,
   * sd_notify and the fd store's records in flight */
  uint64_t need = (uint64_t)cfg->max_connections + 2 * (uint64_t)cfg->max_segments + 64;
  /* daemon.host_recycle: a pulled segment's read-write reopen too, and the
   * pool's memfds */
  if (cfg->host_recycle)
    need += (uint64_t)cfg->max_segments + GSHMD_HOST_RECYCLE_MAX;
  /* systemd sets INVOCATION_ID for its services (v232 on), NOTIFY_SOCKET
   * for Type=notify ones and whoever else reads STATUS=.  NOTIFY_SOCKET
   * alone is no service: gshm's own spawner (gshm-demo, gshm-bench, the
   * tests) sets it to wait for READY=1; the shortfall goes in its STATUS=
   * but the log does not send anyone to a gshmd.service that is not there. */
  const char *invocation = getenv("INVOCATION_ID"), *notify = getenv("NOTIFY_SOCKET");
  bool service = invocation && *invocation;
  bool by_hand = !service && !(notify && *notify);
  struct rlimit rl;

  if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
    return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
      gshm_log_info("fd limit raised from %llu to %llu", (unsigned long long)was,
                    (unsigned long long)rl.rlim_cur);
    else
      getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
    return;
  if (by_hand && rl.rlim_cur < GSHMD_UNIT_LIMIT_NOFILE) {
    gshm_log_debug("fd limit %llu is below the %llu that limits.max_connections=%u and "
                   "limits.max_segments=%u may need (gshmd.service gives %llu)",
                   (unsigned long long)rl.rlim_cur, (unsigned long long)need,
                   cfg->max_connections, cfg->max_segments,
                   (unsigned long long)GSHMD_UNIT_LIMIT_NOFILE);
    return;
  }
  snprintf(warning, warning_size,
           "fd limit %llu is below the %llu that limits.max_connections=%u and "
           "limits.max_segments=%u may need",
           (unsigned long long)rl.rlim_cur, (unsigned long long)need, cfg->max_connections,
           cfg->max_segments);
  if (service || by_hand) /* (by hand here: at or above the unit's limit, still short) */
    gshm_log_warn("%s: raise LimitNOFILE= in gshmd.service or lower the limits", warning);
  else
    gshm_log_debug("%s (gshmd.service gives %llu)", warning,
                   (unsigned long long)GSHMD_UNIT_LIMIT_NOFILE);
}

