/* SPDX-License-Identifier: Apache-2.0 */
/* A device lease is the same lease after a gshmd restart: a holder's
 * leases on a device segment, taken before a chmod that refuses them now,
 * come back after gshmd is SIGKILLed and restarted through the fd store
 * with their access (the owner's read-write create lease still writes), are
 * counted by gshmd, and keep every byte, also once the segment is
 * unlinked.
 *
 * The holder is a non-root process: uid 65534 when run as root (an admin
 * passes every mode check, so root would prove nothing), else this uid.
 * One GPU is enough; exit 77 without a driver or a GPU.  With
 * $GSHM_DEV_LEASE_HOST=1 the same steps run on a host segment (gshmd
 * --backend host), which checks the test's own logic on every CI build. */
#include <errno.h>
#include <inttypes.h>
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

#define NAME "t/dev-lease"
#define SIZE ((8u << 20) + 4097) /* not a multiple of the granularity */
#define SEED 0x2626

/* Whether the segment's bytes, read through seg's lease, are the pattern
 * (with byte 0 = first). */
static bool bytes_ok(gshm_segment_t *seg, unsigned char first) {
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE);
  bool ok;

  REQUIRE(want && got, "malloc");
  gpu_fill_random(want, SIZE, SEED);
  want[0] = first;
  memset(got, 0, SIZE);
  ok = gshm_read(seg, 0, got, SIZE) == 0 && memcmp(got, want, SIZE) == 0;
  free(want);
  free(got);
  return ok;
}

/* The holder: creates (rw lease) and opens (read lease) the segment on
 * GPU 0, fills and maps it, chmods it 0000, and after the restart checks
 * both leases. */
static void holder(struct harness_kid *k, void *arg) {
  const char *loc = arg;
  unsigned char *buf = malloc(SIZE);
  gshm_client_t *c;
  gshm_segment_t *rw, *ro;
  gshm_segment_info_t info;
  void *addr_rw, *addr_ro;
  int e;

  REQUIRE(buf, "malloc");
  REQUIRE(gshm_connect(NULL, "dev-lease", &c) == 0, "connect");
  e = gshm_create(c, NAME, SIZE, loc, 0644, 0, &rw);
  REQUIRE(e == 0, "create on %s: %s (%s)", loc, gshm_strerror(e), gshm_last_error(c));
  gpu_fill_random(buf, SIZE, SEED);
  REQUIRE(gshm_write(rw, 0, buf, SIZE) == 0, "fill");
  REQUIRE(gshm_open(c, NAME, GSHM_ACCESS_READ, &ro) == 0, "open read");
  REQUIRE(gshm_map(rw, NULL, 0, &addr_rw) == 0, "map rw");
  REQUIRE(gshm_map(ro, NULL, 0, &addr_ro) == 0, "map read");
  REQUIRE(gshm_chmod(c, NAME, 0) == 0, "chmod 0000"); /* refuses both leases now */
  harness_kid_step(k->out);
  REQUIRE(harness_kid_await(k->in, 120000), "no restart");

  /* The first call reconnects and re-takes both leases. */
  e = gshm_stat(rw, &info);
  CHECK(e == 0, "stat after the restart: %s (%s)", gshm_strerror(e), gshm_last_error(c));
  CHECK(e || info.leases >= 2, "gshmd counts %u leases, want 2", info.leases);
  CHECK(info.mode == 0, "mode %04o after the restart, want 0000", info.mode);
  CHECK(bytes_ok(rw, buf[0]), "bytes through the rw lease after the restart");
  CHECK(bytes_ok(ro, buf[0]), "bytes through the read lease after the restart");
  e = gshm_write(rw, 0, "\x5a", 1);
  CHECK(e == 0, "the rw lease no longer writes: %s", gshm_strerror(e));
  CHECK(gshm_write(ro, 0, "\x5a", 1) == -EACCES, "the read lease writes");
  {
    void *p;
    CHECK(gshm_map(rw, NULL, 0, &p) == 0 && p == addr_rw, "rw mapping moved");
    CHECK(gshm_map(ro, NULL, 0, &p) == 0 && p == addr_ro, "read mapping moved");
  }
  /* Unlinked: both leases keep the memory and gshmd still counts them. */
  CHECK(gshm_unlink(c, NAME) == 0, "unlink");
  CHECK(gshm_stat(rw, &info) == 0 && info.unlinked && info.leases >= 2,
        "after unlink: leases %u unlinked %d", info.leases, (int)info.unlinked);
  CHECK(bytes_ok(ro, 0x5a), "bytes after the unlink");
  gshm_close(ro);
  gshm_close(rw);
  gshm_disconnect(c);
  free(buf);
  _exit(failures ? 1 : 0);
}

int main(void) {
  const char *host = getenv("GSHM_DEV_LEASE_HOST");
  bool on_host = host && !strcmp(host, "1");
  const char *const args[] = {"--backend", on_host ? "host" : "cuda", "--set",
                              "daemon.socket_mode=0666", NULL};
  struct harness h;
  struct harness_kid k;
  uid_t uid = geteuid() == 0 ? 65534 : (uid_t)-1;
  int count = on_host ? 1 : gpu_count(), st;

  if (count < 1) {
    fprintf(stderr, "SKIP: needs a CUDA driver and a GPU (have %d)\n", count);
    return SKIP;
  }
  REQUIRE(harness_start(&h, args) == 0, "gshmd --backend cuda did not start");
  /* GPU 0 in gshmd's numbering (CUDA_VISIBLE_DEVICES is inherited). */
  REQUIRE(harness_kid_start(&k, uid, uid, holder, on_host ? "host" : "cuda:0") == 0, "fork");
  harness_set_leftover(&h); /* after the fork: the holder's exit must not kill gshmd */
  atexit(harness_kill_leftover);
  CHECK(harness_kid_await(k.from_kid, 120000), "the holder did not get ready");
  REQUIRE(harness_restart(&h, SIGKILL, args) == 0, "gshmd did not come back");
  harness_kid_step(k.to_kid);
  st = harness_kid_wait(&k);
  CHECK(st == 0, "the holder (uid %d) failed: exit %d", (int)(uid == (uid_t)-1 ? getuid() : uid),
        st);
  harness_set_leftover(NULL);
  st = harness_stop(&h);
  CHECK(st == 0, "gshmd exit status %d", st);
  fprintf(stderr, "dev_lease_restart: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
