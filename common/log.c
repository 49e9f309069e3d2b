/* SPDX-License-Identifier: Apache-2.0 */
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static const char *log_ident = "gshm";
static int log_threshold = -1;
static int log_prefix;
static _Atomic(gshm_log_gate_fn) log_gate;
static void *_Atomic log_gate_arg;
static _Thread_local unsigned log_ungated; /* gshm__log_ungated_begin's depth */

void gshm__log_set_gate(gshm_log_gate_fn gate, void *arg) {
  if (gate)
    log_gate_arg = arg; /* (first: a thread that sees the gate sees its arg) */
  log_gate = gate;
}

void gshm__log_ungated_begin(void) { log_ungated++; }

void gshm__log_ungated_end(void) {
  if (log_ungated)
    log_ungated--;
}

void gshm__log_setup(const char *ident, int level, int prefix_priority) {
  log_ident = ident;
  log_threshold = level;
  /* "<6>" is for journald; a person at a terminal reads the line without it */
  log_prefix = prefix_priority && !isatty(STDERR_FILENO);
}

int gshm__log_level(void) { return log_threshold; }

void gshm__log(int prio, const char *fmt, ...) {
  int saved = errno;
  char line[1024], text[4 * sizeof(line)];
  gshm_log_gate_fn gate = prio & GSHM_LOG_UNGATED || log_ungated ? NULL : log_gate;
  va_list ap;
  int n;

  prio &= ~GSHM_LOG_UNGATED;
  if (prio > log_threshold || (gate && !gate(log_gate_arg, prio))) {
    errno = saved;
    return;
  }
  va_start(ap, fmt);
  errno = saved; /* for %m */
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  n = (int)strlen(line);
  while (n > 0 && line[n - 1] == '\n')
    line[--n] = '\0';
  /* a name or a peer's text in a message ("x\n<0>...") never starts a
   * line of its own at a priority of its choosing, nor moves or reorders
   * a terminal showing the log (C1 and bidi controls too: gshmctl's own
   * escaping) */
  gshm__escape_text(line, text, sizeof(text));
  /* One fprintf per line: stderr is unbuffered, so lines from several
   * threads do not interleave within a line. */
  if (log_prefix)
    fprintf(stderr, "<%d>%s: %s\n", prio, log_ident, text);
  else
    fprintf(stderr, "%s: %s\n", log_ident, text);
  errno = saved;
}
