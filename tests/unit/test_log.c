/* SPDX-License-Identifier: Apache-2.0 */
/* The logger writes one line per message whatever the message holds: a
 * peer's node name or a client's text with a newline and a "<0>" prefix
 * must not become a line of its own at a priority of its choosing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* What one gshm__log call writes to stderr (journald form: "<N>" prefix). */
static void logged(char *buf, size_t size, const char *arg) {
  int fds[2], saved = dup(STDERR_FILENO);
  ssize_t n;

  assert_int_equal(pipe(fds), 0);
  assert_true(saved >= 0);
  assert_true(dup2(fds[1], STDERR_FILENO) >= 0);
  close(fds[1]);
  gshm__log_setup("t", GSHM_LOG_DEBUG, 1); /* stderr is a pipe: prefixed */
  gshm__log(GSHM_LOG_NOTICE, "peer '%s'", arg);
  assert_true(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  n = read(fds[0], buf, size - 1);
  close(fds[0]);
  assert_true(n > 0);
  buf[n] = '\0';
}

static void test_one_line(void **state) {
  char buf[4096];
  (void)state;

  logged(buf, sizeof(buf), "x\n<0>gshmd: forged\r\x1b[2J");
  assert_string_equal(buf, "<5>t: peer 'x\\x0A<0>gshmd: forged\\x0D\\x1B[2J'\n");
  /* C1 (U+009B, CSI) and a bidi override (U+202E): escaped too (they
   * passed before: only C0 and DEL were) */
  logged(buf, sizeof(buf), "x\xC2\x9B" "2J\xE2\x80\xAE" "evil");
  assert_string_equal(buf, "<5>t: peer 'x\\xC2\\x9B2J\\xE2\\x80\\xAEevil'\n");
}

/* A message whose every byte is escaped still fits and ends the line. */
static void test_long(void **state) {
  char big[1100], buf[8192];
  (void)state;

  memset(big, '\n', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  logged(buf, sizeof(buf), big);
  assert_non_null(strchr(buf, '\n'));
  assert_true(strchr(buf, '\n') == buf + strlen(buf) - 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_line),
      cmocka_unit_test(test_long),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
