/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's fd limit at start (moved out of main.c). */
#ifndef GSHMD_FD_LIMIT_H
#define GSHMD_FD_LIMIT_H

#include <stddef.h>

#include "config.h"

/* Raises the soft RLIMIT_NOFILE to the hard limit (systemd's default soft
 * limit is 1024, far below what 4096 connections and 65536 segments
 * need) and says once when even that cannot cover the configured
 * maximums: at the limit accept fails and gshmd serves nobody new.  Under
 * systemd that is a warning (and part of STATUS=).  Started by hand (no
 * INVOCATION_ID or NOTIFY_SOCKET from a service manager) under
 * a shell's limit below the unit's LimitNOFILE= it is expected (a test, a
 * try-out): said at debug level only, unless the unit's limit would not
 * suffice either.
 *   cfg      limits.max_connections, limits.max_segments, daemon.host_recycle
 *   warning  out: the shortfall in words when there is one (part of
 *            STATUS=), left as it was otherwise; warning_size bytes */
void gshmd_fd_limit_setup(const struct gshmd_config *cfg, char *warning, size_t warning_size);

#endif
