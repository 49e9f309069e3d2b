/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd_user_resolve's trial switch (daemon/user_switch.h): where the
 * capabilities allow the switch but the kernel refuses it -- a user
 * namespace that maps root alone, whose uid 61004 is unmapped -- the
 * switch, tried in a child process, fails and resolve says so (-EPERM,
 * nothing to switch to), before gshmd gives the stored memory away and
 * while it can still drop its capabilities on every thread.  Before,
 * resolve said yes and the switch failed later with gshmd serving as root
 * with every capability (helper-116's finding).  Root only (writing the
 * namespace's maps of uid 0 needs CAP_SETUID and CAP_SETFCAP). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "user_switch.h"

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC), ok;

  if (fd < 0)
    return -1;
  ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
  close(fd);
  return ok ? 0 : -1;
}

/* In a forked child: a user namespace (its maps, root to root alone,
 * written by the parent, which has the capabilities in the namespace
 * above), then resolve.  Exit 0: refused as wanted; 1: resolve said yes;
 * 77: no user namespace here; 2: something else. */
static void in_namespace(int ready_fd, int go_fd) {
  struct gshmd_user u;
  char c = 0;
  int e;

  if (unshare(CLONE_NEWUSER) < 0)
    _exit(77);
  if (write(ready_fd, "r", 1) != 1 || read(go_fd, &c, 1) != 1 || c != 'g')
    _exit(77);
  e = gshmd_user_resolve("61004", &u, false);
  if (e == -EPERM && !u.on && u.uid == 0)
    _exit(0);
  _exit(e == 0 && u.on ? 1 : 2);
}

static void test_unmapped_user_refused_by_the_trial(void **state) {
  int status, ready[2], go[2];
  char c = 0, path[64];
  bool mapped;
  pid_t pid;

  (void)state;
  if (geteuid() != 0)
    skip();
  assert_int_equal(pipe(ready), 0);
  assert_int_equal(pipe(go), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    in_namespace(ready[1], go[0]);
  mapped = read(ready[0], &c, 1) == 1;
  snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
  mapped = mapped && write_file(path, "0 0 1") == 0;
  snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)pid);
  mapped = mapped && write_file(path, "0 0 1") == 0;
  assert_int_equal(write(go[1], mapped ? "g" : "n", 1), 1);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77)
    skip();
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* The same user, with the capabilities and nothing refusing it: resolve
 * says yes (the trial's child switched and exited; this process did not). */
static void test_possible_switch_passes_the_trial(void **state) {
  struct gshmd_user u;

  (void)state;
  if (geteuid() != 0)
    skip();
  assert_int_equal(gshmd_user_resolve("61004", &u, false), 0);
  assert_true(u.on);
  assert_int_equal(u.uid, 61004);
  assert_int_equal(geteuid(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unmapped_user_refused_by_the_trial),
      cmocka_unit_test(test_possible_switch_passes_the_trial),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
