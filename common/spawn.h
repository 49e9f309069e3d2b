/* SPDX-License-Identifier: Apache-2.0 */
/* Starting a private gshmd and playing the service manager's part for it:
 * a NOTIFY_SOCKET that receives READY=1, STATUS=, WATCHDOG=1 and fd-store
 * entries (FDSTORE=1 / FDSTOREREMOVE=1 with FDNAME=), and LISTEN_FDS /
 * LISTEN_FDNAMES to hand stored fds (and optionally a listening socket)
 * back on the next start (sd_listen_fds(3) protocol).  Used by gshm-demo,
 * the tests and gshm-bench; readiness is the READY=1 datagram, never a
 * sleep. */
#ifndef GSHM_COMMON_SPAWN_H
#define GSHM_COMMON_SPAWN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct gshm_spawn {
  pid_t pid;                 /* 0 when not running */
  char dir[256];             /* private mkdtemp directory */
  char socket_path[300];     /* dir/gshmd.sock */
  char notify_path[300];
  int notify_fd;
  bool ready, stopping;
  char status[256];          /* last STATUS= */
  int exit_status;           /* wait status of a gshmd that exited before READY=1 */
  unsigned watchdog_pings;
  /* The fd store, as systemd keeps it: fds[i] stored under names[i]
   * (FDSTORE=1, FDNAME=), nopoll[i] when sent with FDPOLL=0.  Past
   * store_max fds (FileDescriptorStoreMax=; 0: no limit) a new one is
   * closed, as systemd does while sd_notify succeeds. */
  int *fds;
  char **names;
  bool *nopoll;
  int nfds, cap;
  int store_max;
  unsigned store_refused;    /* fds closed for store_max */
  /* A kill point: the kill_count-th datagram (from 1) whose text holds
   * kill_after SIGKILLs gshmd once handled, and every datagram after it
   * until the next start is dropped (its fds closed), as if gshmd had
   * died right after that send.  NULL: none.  killed: it fired. */
  const char *kill_after;
  int kill_count;
  bool killed;
  int listen_fd;             /* >= 0: pass as a socket-activated listener */
  bool unit_caps;            /* keep gshmd.service's bounding set (gshm__spawn_unit_caps) */
  /* > 0: the RLIMIT_NOFILE (soft and hard, fds) each start gives gshmd,
   * as LimitNOFILE= would; 0: this process's */
  unsigned long nofile;
  /* A thread drains the notify socket all the time, as a service manager
   * does: gshmd blocks in sd_notify when the datagram queue is full.  The
   * fields above that it writes are read under `lock`. */
  pthread_t thread;
  bool thread_running, thread_stop;
  pthread_mutex_t lock;
  pthread_cond_t changed;
};

/* Makes the private directory and the notify socket.  Returns 0 or a
 * negative errno. */
int gshm__spawn_init(struct gshm_spawn *s);

/* For starts as gshmd.service makes them (gshmd given daemon.user):
 * the notify socket is made writable by anyone, as systemd's is (gshmd
 * sends fd store entries before its switch and READY=1 after it), and
 * each start keeps gshmd.service's capability bounding set (CAP_CHOWN,
 * CAP_SETGID, CAP_SETUID) instead of none.  Returns 0 or chmod's -errno. */
int gshm__spawn_unit_caps(struct gshm_spawn *s);

/* Adds fd (taken) to the fd store under name, as FDSTORE=1 would: to
 * build a store written by another program (an earlier format) for the
 * next start.  Returns 0, -ENOSPC (store_max: fd closed) or -ENOMEM. */
int gshm__spawn_store_add(struct gshm_spawn *s, const char *name, int fd, bool nopoll);

/* Memory fds the store holds for gshmd: one per "seg-<id>" entry plus
 * those carried by the datagrams queued in its buckets (b<n>a / b<n>b:
 * peeked, the copies closed).  -1 on error. */
int gshm__spawn_store_memory_fds(struct gshm_spawn *s);

/* Fds carried by the datagram queued first in the receive queue of the
 * socket stored under name (a bucket's end, b<n>a or b<n>b: peeked, the
 * copies closed); 0 when none is queued or nothing has that name. */
int gshm__spawn_store_queued_fds(struct gshm_spawn *s, const char *name);

/* Takes every fd stored under name out of the fd store and closes it, as
 * FDSTOREREMOVE=1 does (while gshmd is stopped: a store that lost an
 * entry).  Returns how many there were. */
int gshm__spawn_store_drop(struct gshm_spawn *s, const char *name);

/* Bytes of LISTEN_FDNAMES the next start would pass (names joined by ':',
 * "gshmd" first when socket_activation), without the terminating NUL. */
size_t gshm__spawn_fdnames_len(struct gshm_spawn *s, bool socket_activation);

/* Starts gshmd_path with "--socket <dir>/gshmd.sock" (unless
 * socket_activation, which binds it here and passes it as LISTEN_FDS
 * "gshmd") and extra args (NULL-terminated, may be NULL), handing back the
 * fd store, and waits up to timeout_ms for READY=1.
 * Returns 0; -ETIMEDOUT; -ECHILD gshmd exited first; -E2BIG execve
 * refused the environment (LISTEN_FDNAMES past MAX_ARG_STRLEN, 131072
 * bytes, as it would under systemd); other -errno. */
int gshm__spawn_start(struct gshm_spawn *s, const char *gshmd_path, const char *const *extra_args,
                      bool socket_activation, int timeout_ms);

/* Waits up to timeout_ms for notify datagrams to be processed (0: lets the
 * thread catch up with what is queued now). */
void gshm__spawn_poll(struct gshm_spawn *s, int timeout_ms);

/* Sends sig (SIGTERM, SIGKILL) and reaps.  Returns the wait status, or -1
 * when not running.  The fd store is kept for the next start. */
int gshm__spawn_stop(struct gshm_spawn *s, int sig);

/* Closes the fd store, removes the directory; stops gshmd if running. */
void gshm__spawn_cleanup(struct gshm_spawn *s);

/* Resident set of a process in KiB (/proc/PID/status VmRSS); -1 on error. */
long gshm__proc_rss_kib(pid_t pid);

/* CPU time a process has used so far, user + system (fields 14 and 15 of
 * /proc/PID/stat, proc(5)), in clock ticks: divide by sysconf(_SC_CLK_TCK)
 * for seconds.  The fields are counted from the LAST ')' of the line, so a
 * command name holding spaces or ')' does not shift them.
 *   pid        in: the process (any process this one may read /proc of)
 *   ticks_out  out: the ticks; written only on success
 * Returns 0; -EINVAL pid <= 0; -ENOENT no such process; -EBADMSG the line
 * does not parse; other -errno from open/read. */
int gshm__proc_cpu_ticks(pid_t pid, uint64_t *ticks_out);

/* Finds gshmd: $GSHMD, then next to this executable (build tree:
 * ../daemon/gshmd; install: ../sbin/gshmd), then "gshmd" on PATH.
 * Returns a static string. */
const char *gshm__find_gshmd(void);

/* A TCP port of 127.0.0.1 that was free a moment ago (bound and closed),
 * or a negative errno (-EADDRINUSE: none free).  Below the kernel's
 * ephemeral range (ip_local_port_range): a port the kernel picks there,
 * bound and closed, is picked again by the next caller and may be taken
 * by any outbound connection meanwhile (another gshmd's link, a test's
 * client: a node of gshm-bench then could not listen, "the port is in
 * use", with a concurrent ctest test).  Each process walks 10000 up to
 * that range from a start of its own (by pid), never handing out a port
 * twice.  For tests and benchmarks (the harness, gshm-bench). */
int gshm__spawn_free_port(void);

#endif
