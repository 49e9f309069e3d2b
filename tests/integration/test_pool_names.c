/* SPDX-License-Identifier: Apache-2.0 */
/* The PyTorch pool's segment names against another user, with a whole
 * gshmd and libgshm's pool (client/torch_alloc.c) on the fake driver
 * (fake_libcuda.c: two fake GPUs, found through LD_LIBRARY_PATH, as in
 * test_sticky_restart), each user a process of its own uid.
 *
 * A pool names its segments "<prefix>/seg-NNNNNN", and names are first
 * come, first served: another user who created "<prefix>/seg-000000"
 * first made the owner's pool fail at its creation (-EEXIST, as if a
 * pool of the owner's had not been released: gshm.torch.MemPool raised
 * gshm.Exists), and names further on made its growths fail
 * (docs/SECURITY.md).  Now the pool passes over names other users hold.
 * Needs root (to switch uids); skipped otherwise. */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"

#define UID_OWNER 60021    /* the pool's user */
#define UID_SQUATTER 60022 /* who took its names first */
#define SQUATTED 64        /* "pl/seg-000000" .. "pl/seg-000063": past 32 in a row */
#define MiB (1ull << 20)

static struct harness h; /* (static: harness_kill_leftover reads it after a failure) */

/* fn(arg) in a child process of uid (its gid and only group the same);
 * its exit status, 128 when it did not exit. */
static int child_as(uid_t uid, int (*fn)(const char *), const char *arg) {
  gid_t g = (gid_t)uid;
  int status;
  pid_t pid = fork();

  if (pid == 0) {
    if (setgroups(1, &g) || setresgid(g, g, g) || setresuid(uid, uid, uid))
      _exit(120);
    _exit(fn(arg));
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The squatter: host segments of 1 byte, 0600, named as the pool's first
 * SQUATTED would be; kept by name after it exits.  0, or 10 + i. */
static int squat(const char *prefix) {
  gshm_client_t *c;
  gshm_segment_t *s;
  char name[GSHM_NAME_MAX + 1];

  if (gshm_connect(h.socket_path, "squatter", &c))
    return 9;
  for (int i = 0; i < SQUATTED; i++) {
    snprintf(name, sizeof(name), "%s/seg-%06d", prefix, i);
    if (gshm_create(c, name, 1, NULL, 0600, 0, &s) || gshm_close(s))
      return 10 + i;
  }
  gshm_disconnect(c);
  return 0;
}

/* The owner: a persistent pool of 2 MiB arenas on cuda:0 under prefix,
 * three arenas' worth of blocks; each segment under the prefix, the
 * owner's own (gshm_stat_name: the squatter's 0600 ones refuse it), none
 * a squatted name.  0, or what failed: 2 the pool's creation (-EEXIST
 * before), 3 an allocation, 4-6 a segment. */
static int grow_pool(const char *prefix) {
  gshm_pool_config_t cfg = {.prefix = prefix, .device = 0, .flags = GSHM_POOL_PERSISTENT,
                            .granule = 2 * MiB};
  gshm_pool_segment_t *segs;
  gshm_segment_info_t info;
  gshm_client_t *c;
  gshm_pool_t *p;
  size_t n, len = strlen(prefix);
  void *a[3];
  int e;

  if (gshm_connect(h.socket_path, "owner", &c))
    return 9;
  if ((e = gshm_pool_create(c, &cfg, &p))) {
    fprintf(stderr, "gshm_pool_create: %s\n", gshm_strerror(e));
    return 2;
  }
  gshm_pool_activate(p);
  for (int i = 0; i < 3; i++)
    if (!(a[i] = gshm_torch_malloc(2 * MiB, 0, NULL))) {
      fprintf(stderr, "gshm_torch_malloc: %s\n", gshm_strerror(gshm_torch_last_error()));
      return 3;
    }
  if (gshm_pool_segments(p, &segs, &n) || n != 3)
    return 4;
  for (size_t i = 0; i < n; i++) {
    unsigned k = 0;
    fprintf(stderr, "owner's segment %s\n", segs[i].name);
    if (strncmp(segs[i].name, prefix, len) || strncmp(segs[i].name + len, "/seg-", 5))
      return 5;
    if (gshm_stat_name(c, segs[i].name, &info) || info.id != segs[i].id ||
        info.uid != UID_OWNER || (sscanf(segs[i].name + len, "/seg-%u", &k) == 1 && k < SQUATTED))
      return 6;
  }
  gshm_free(segs);
  /* No free nor release: the fake driver maps every segment at one
   * address, so a block's address names no one segment.  The process's
   * end ends its leases; the persistent names stay. */
  return 0;
}

/* The squatter's names stay its own, and the owner's pool is made and
 * grows past them (2 at its creation before the fix); its 3 segments
 * stay under the prefix for attach. */
static void test_other_users_names_passed_over(void **state) {
  const char *const args[] = {"--backend", "cuda", "--set", "daemon.socket_mode=0666", NULL};
  gshm_client_t *root;
  gshm_segment_info_t info, *list = NULL;
  char name[GSHM_NAME_MAX + 1];
  size_t n = 0, owners = 0;

  (void)state;
  if (geteuid() != 0)
    skip();
  assert_int_equal(harness_start(&h, args), 0);
  harness_set_leftover(&h);
  assert_int_equal(child_as(UID_SQUATTER, squat, "pl"), 0);
  assert_int_equal(child_as(UID_OWNER, grow_pool, "pl"), 0);
  assert_int_equal(gshm_connect(h.socket_path, "root", &root), 0);
  for (int i = 0; i < SQUATTED; i++) {
    snprintf(name, sizeof(name), "pl/seg-%06d", i);
    assert_int_equal(gshm_stat_name(root, name, &info), 0);
    assert_int_equal(info.uid, UID_SQUATTER);
  }
  assert_int_equal(gshm_list(root, &list, &n), 0);
  for (size_t i = 0; i < n; i++)
    owners += list[i].uid == UID_OWNER && !strncmp(list[i].name, "pl/seg-", 7);
  assert_int_equal(owners, 3);
  gshm_free(list);
  gshm_disconnect(root);
  assert_int_equal(harness_stop(&h), 0);
  harness_set_leftover(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_other_users_names_passed_over),
  };
  atexit(harness_kill_leftover);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
