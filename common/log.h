/* SPDX-License-Identifier: Apache-2.0 */
/* Logging shared by gshmd, libgshm and the tools.
 *
 * Levels are syslog priorities (0 emerg .. 7 debug).  The daemon prints
 * "<N>" prefixes that journald understands (sd-daemon.h); the library is
 * silent unless $GSHM_LOG_LEVEL asks for messages (docs/ARCHITECTURE.md
 * "Errors and logging": a library does not log errors its caller handles). */
#ifndef GSHM_COMMON_LOG_H
#define GSHM_COMMON_LOG_H

#include <stdarg.h>

enum {
  GSHM_LOG_ERR = 3,
  GSHM_LOG_WARNING = 4,
  GSHM_LOG_NOTICE = 5,
  GSHM_LOG_INFO = 6,
  GSHM_LOG_DEBUG = 7,
};

/* Configures the process-wide logger: messages with priority <= level are
 * written to stderr as "<prio>ident: text" when prefix_priority is set and
 * stderr is not a terminal (journald reads the prefix), else "ident: text".
 * ident is not copied and must outlive the logger. */
void gshm__log_setup(const char *ident, int level, int prefix_priority);

/* Current threshold; -1 means silent. */
int gshm__log_level(void);

/* A gate that may hold back a line: called with the line's priority for
 * every line the level lets through, from whichever thread logs it;
 * returns false to drop the line.  gshmd's holds the lines a local user's
 * clients make it write to a rate per uid (daemon/loglimit.c). */
typedef _Bool (*gshm_log_gate_fn)(void *arg, int prio);

/* Installs gate (NULL: none) with its argument; the logger calls it until
 * another is installed.  Install it before, and remove it after, any
 * thread that may log and call into arg's owner runs. */
void gshm__log_set_gate(gshm_log_gate_fn gate, void *arg);

/* OR'd into a line's priority: a line about gshmd's own state, not about
 * the client whose request the loop serves when it is written (the fd
 * store falling behind, say): no gate holds it back. */
#define GSHM_LOG_UNGATED 0x100

/* Between gshm__log_ungated_begin() and its gshm__log_ungated_end(), every
 * line the calling thread writes is as if marked GSHM_LOG_UNGATED: a
 * stretch of gshmd's own work that a client's request only happened to
 * run (the fd store catching up on sends that failed before, at that
 * request's event), whose lines are not that client's.  Pairs nest; a
 * thread-local count, so other threads are not affected. */
void gshm__log_ungated_begin(void);
void gshm__log_ungated_end(void);

/* Writes one line; errno is preserved so "%m" works in callers' formats. */
void gshm__log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define gshm_log_err(...) gshm__log(GSHM_LOG_ERR, __VA_ARGS__)
#define gshm_log_warn(...) gshm__log(GSHM_LOG_WARNING, __VA_ARGS__)
#define gshm_log_notice(...) gshm__log(GSHM_LOG_NOTICE, __VA_ARGS__)
/* Info and debug check the level first, so that their arguments (sizes
 * formatted for humans, ...) cost nothing on the request path when off. */
#define gshm_log_info(...)                                    \
  do {                                                        \
    if (gshm__log_level() >= GSHM_LOG_INFO)                   \
      gshm__log(GSHM_LOG_INFO, __VA_ARGS__);                  \
  } while (0)
#define gshm_log_debug(...)                                   \
  do {                                                        \
    if (gshm__log_level() >= GSHM_LOG_DEBUG)                  \
      gshm__log(GSHM_LOG_DEBUG, __VA_ARGS__);                 \
  } while (0)

#endif
