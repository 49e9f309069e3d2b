/* SPDX-License-Identifier: Apache-2.0 */
/* A cluster node that runs as daemon.user (daemon/user_switch.h): its
 * serving of peers' pulls is gshmd's own work, under no user's quota.
 * Root only (the switch). */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"

#define USER 61008u /* gshmd's user on node a: no passwd entry, its group the same number */
#define NSET 8

static char dir[] = "/tmp/gshm-cluster-user-XXXXXX";
static char key_path[300];
static struct node A, B;

static uint64_t set_size(int i) { return 4096 * (uint64_t)(i + 1) + 7; }

static int group_setup(void **state) {
  struct group *g = getgrgid(getegid());

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(key_path, sizeof(key_path), "%s/key", dir);
  write_key(key_path, 7);
  assert_non_null(g);
  snprintf(node_group, sizeof(node_group), "%s", g->gr_name);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  unlink(key_path);
  rmdir(dir);
  return 0;
}

/* c's pull of every segment under prefix from peer, tried again while
 * the link to it is not up yet.  Returns gshm_pull_prefix's result. */
static int pull_set(gshm_client_t *c, const char *peer, const char *prefix) {
  gshm_pull_result_t *res = NULL;
  size_t n = 0;
  int e = -ECONNREFUSED;

  for (int i = 0; i < 100 && (e == -ECONNREFUSED || e == -ECONNRESET || e == -ETIMEDOUT); i++) {
    if (i)
      usleep(50000);
    e = gshm_pull_prefix(c, peer, prefix, NULL, &res, &n);
  }
  if (e)
    fprintf(stderr, "pull of %s from %s: %s (%s)\n", prefix, peer, gshm_strerror(e),
            gshm_last_error(c));
  gshm_free(res);
  return e;
}

/* In a child that becomes USER (its group the same number, no other), a
 * segment `name` of 4 KiB, mode 0644, on n: what any process running as
 * daemon.user could make.  Returns the child's exit status (0: made). */
static int create_as_user(struct node *n, const char *name) {
  pid_t pid = fork();
  int st = -1;

  assert_true(pid >= 0);
  if (!pid) {
    gshm_client_t *c = NULL;
    gshm_segment_t *seg = NULL;
    if (setgroups(0, NULL) || setresgid(USER, USER, USER) || setresuid(USER, USER, USER))
      _exit(90);
    if (gshm_connect(n->h.socket_path, "daemon-user", &c))
      _exit(91);
    _exit(gshm_create(c, name, 4096, "host", 0644, 0, &seg) ? 92 : 0);
  }
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Node a runs as USER with quota.leases=2: a peer's pull of a set of 8
 * segments holds a serving lease of each segment it reads, which the
 * quota must not count (root is exempt, and serving is gshmd's own work).
 * The serving client had gshmd's effective uid: uid 0 before daemon.user,
 * USER after it, and the pull failed "peer 'a': uid 61008 holds 2 leases,
 * limit 2 (quota.leases)". */
static void test_serving_is_under_no_quota(void **state) {
  const char *extra_a[] = {"--set=daemon.user=61008", "--set=quota.leases=2"};
  char pa[64], pb[64];
  gshm_client_t *a, *b;
  int k = 0;

  (void)state;
  if (geteuid() != 0)
    skip();
  A.port = free_port();
  B.port = free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", B.port);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d", A.port);
  node_start(&A, "a", pa, key_path, "pub/*", NULL);
  /* again with gshmd.service's bounding set, as daemon.user */
  while (A.argv[k])
    k++;
  A.argv[k] = extra_a[0];
  A.argv[k + 1] = extra_a[1];
  A.argv[k + 2] = NULL;
  assert_int_equal(gshm__spawn_unit_caps(&A.h.sp), 0);
  assert_int_equal(harness_restart(&A.h, SIGTERM, A.argv), 0);
  assert_int_equal(harness_threads_not_as(A.h.sp.pid, USER, USER, NULL), 0);
  node_start(&B, "b", pb, key_path, "", NULL);

  a = connect_to(&A);
  set_make(a, "pub/set/", NSET, set_size, 0x6108);
  b = connect_to(&B);
  assert_int_equal(pull_set(b, "a", "pub/set/"), 0);
  set_check(b, "pub/set/", NSET, set_size, 0x6108); /* (under the peer's names) */
  /* A PATTERN rule exports root's segments and those of the user that
   * started gshmd (root here), not daemon.user's: any other process of
   * that user (nobody, say) would have been an admin for the export */
  assert_int_equal(create_as_user(&A, "pub/own"), 0);
  {
    gshm_pull_result_t r;
    assert_int_equal(gshm_pull(b, "a", "pub/own", NULL, &r), -ENOENT);
  }
  assert_int_equal(gshm_unlink(a, "pub/own"), 0);
  set_unlink(b, "pub/set/", NSET);
  set_unlink(a, "pub/set/", NSET);
  gshm_disconnect(b);
  gshm_disconnect(a);
  nodes_stop(&A, &B);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serving_is_under_no_quota),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
