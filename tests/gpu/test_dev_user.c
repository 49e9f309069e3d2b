/* SPDX-License-Identifier: Apache-2.0 */
/* Device segments across gshmd's switch to daemon.user (daemon/user_switch.h):
 * a device segment made while gshmd ran as root is taken back by a gshmd
 * that becomes uid 61007 once set up (the CUDA backend, and the driver's
 * threads, started before the switch) and reads the same; a device
 * segment made after the switch (cuMemCreate and its POSIX fd export as
 * that user) is written, read, and taken back after a SIGKILL.  Every
 * thread of gshmd, the CUDA driver's too, runs as 61007 with no
 * capability after each start: glibc's setresuid reaches the threads
 * libcuda started (a thread it made otherwise would keep root's
 * CAP_CHOWN, CAP_SETUID and CAP_SETGID).
 *
 * Root only (the switch; the clients run as nobody).  One GPU; exit 77
 * without a driver or a GPU.  With $GSHM_DEV_USER_HOST=1 the same steps run
 * on host segments (gshmd --backend host), which checks the test's own
 * logic on every CI build. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gpu_check.h"
#include "gpu_count.h"
#include "gshm.h"
#include "harness.h"

#define USER 61007u                /* no passwd entry: its group is the same number */
#define SIZE ((4u << 20) + 4097)   /* not a multiple of the granularity */
#define OLD "t/dev-user-old"       /* made while gshmd ran as root */
#define NEW "t/dev-user-new"       /* made after the switch */
#define SEED_OLD 0x6107
#define SEED_NEW 0x6108

/* Whether segment name (opened read-only through c) holds seed's bytes. */
static bool holds(gshm_client_t *c, const char *name, unsigned long long seed) {
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE);
  gshm_segment_t *s;
  bool ok = false;
  int e;

  REQUIRE(want && got, "malloc");
  e = gshm_open(c, name, GSHM_ACCESS_READ, &s);
  CHECK(e == 0, "open %s: %s (%s)", name, gshm_strerror(e), gshm_last_error(c));
  if (e == 0) {
    gpu_fill_random(want, SIZE, seed);
    ok = gshm_read(s, 0, got, SIZE) == 0 && memcmp(got, want, SIZE) == 0;
    gshm_close(s);
  }
  free(want);
  free(got);
  return ok;
}

/* Creates segment name at loc (mode 0644) filled from seed. */
static void make(gshm_client_t *c, const char *name, const char *loc, unsigned long long seed) {
  unsigned char *buf = malloc(SIZE);
  gshm_segment_t *s;
  int e;

  REQUIRE(buf, "malloc");
  e = gshm_create(c, name, SIZE, loc, 0644, 0, &s);
  REQUIRE(e == 0, "create %s on %s: %s (%s)", name, loc, gshm_strerror(e), gshm_last_error(c));
  gpu_fill_random(buf, SIZE, seed);
  REQUIRE(gshm_write(s, 0, buf, SIZE) == 0, "fill %s", name);
  gshm_close(s);
  free(buf);
}

/* The client's steps (as nobody, in a child: CUDA never starts in the
 * test's own process, which forks gshmd). */
static int before_switch(const char *loc) {
  gshm_client_t *c;

  REQUIRE(gshm_connect(NULL, "dev-user", &c) == 0, "connect");
  make(c, OLD, loc, SEED_OLD);
  gshm_disconnect(c);
  return 0;
}

static int after_switch(const char *loc) {
  gshm_client_t *c;

  failures = 0; /* (the parent's, copied by the fork) */
  REQUIRE(gshm_connect(NULL, "dev-user", &c) == 0, "connect");
  CHECK(holds(c, OLD, SEED_OLD), "%s (made before the switch) reads other bytes", OLD);
  make(c, NEW, loc, SEED_NEW);
  CHECK(holds(c, NEW, SEED_NEW), "%s (made after the switch) reads other bytes", NEW);
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

static int after_kill(const char *loc) {
  gshm_client_t *c;

  (void)loc;
  failures = 0; /* (the parent's, copied by the fork) */
  REQUIRE(gshm_connect(NULL, "dev-user", &c) == 0, "connect");
  CHECK(holds(c, OLD, SEED_OLD), "%s after the SIGKILL", OLD);
  CHECK(holds(c, NEW, SEED_NEW), "%s after the SIGKILL", NEW);
  CHECK(gshm_unlink(c, OLD) == 0 && gshm_unlink(c, NEW) == 0, "unlink");
  gshm_disconnect(c);
  return failures ? 1 : 0;
}

/* Every thread of pid runs as USER with no capability (said on stderr
 * where not).  Returns how many threads it looked at. */
static int check_threads(pid_t pid) {
  int n = 0, bad = harness_threads_not_as(pid, USER, USER, &n);

  CHECK(bad == 0, "%d thread(s) of gshmd (of %d) not uid %u with no capability", bad, n, USER);
  return n;
}

int main(void) {
  const char *host = getenv("GSHM_DEV_USER_HOST");
  bool on_host = host && !strcmp(host, "1");
  const char *loc = on_host ? "host" : "cuda:0";
  char set_user[64];
  const char *const args[] = {"--backend", on_host ? "host" : "cuda", "--set",
                              "daemon.socket_mode=0666", NULL};
  const char *const args_user[] = {"--backend", on_host ? "host" : "cuda", "--set",
                                   "daemon.socket_mode=0666", "--set", set_user, NULL};
  struct harness h;
  int count, st, n;

  if (geteuid() != 0) {
    fprintf(stderr, "SKIP: gshmd's switch to daemon.user needs root\n");
    return SKIP;
  }
  if ((count = on_host ? 1 : gpu_count()) < 1) {
    fprintf(stderr, "SKIP: needs a CUDA driver and a GPU (have %d)\n", count);
    return SKIP;
  }
  snprintf(set_user, sizeof(set_user), "daemon.user=%u", USER);
  REQUIRE(harness_start(&h, args) == 0, "gshmd --backend %s did not start", args[1]);
  harness_set_leftover(&h);
  atexit(harness_kill_leftover);
  st = harness_as_nobody(before_switch, loc);
  REQUIRE(st == 0, "the client before the switch failed: exit %d", st);

  /* gshmd.service's bounding set (CAP_CHOWN, CAP_SETGID, CAP_SETUID) */
  REQUIRE(gshm__spawn_unit_caps(&h.sp) == 0, "gshm__spawn_unit_caps");
  REQUIRE(harness_restart(&h, SIGTERM, args_user) == 0, "gshmd did not come back as %u", USER);
  n = check_threads(h.sp.pid);
  fprintf(stderr, "dev_user: %d thread(s) of gshmd checked after the switch\n", n);
  st = harness_as_nobody(after_switch, loc);
  CHECK(st == 0, "the client after the switch failed: exit %d", st);

  REQUIRE(harness_restart(&h, SIGKILL, args_user) == 0, "gshmd did not come back after SIGKILL");
  check_threads(h.sp.pid);
  st = harness_as_nobody(after_kill, loc);
  CHECK(st == 0, "the client after the SIGKILL failed: exit %d", st);

  harness_set_leftover(NULL);
  st = harness_stop(&h);
  CHECK(st == 0, "gshmd exit status %d", st);
  fprintf(stderr, "dev_user: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
