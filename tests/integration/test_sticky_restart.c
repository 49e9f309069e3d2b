/* SPDX-License-Identifier: Apache-2.0 */
/* A sticky CUDA error restarts gshmd and loses nothing (docs/ARCHITECTURE.md
 * "A sticky CUDA error restarts gshmd"), with a whole gshmd on a fake
 * driver: fake_libcuda.c (two fake GPUs), found through LD_LIBRARY_PATH.
 * The driver's first cuMemsetD8 (a device segment's zeroing) fails with
 * CUDA_ERROR_ILLEGAL_ADDRESS: the create is -EIO, gshmd stops by itself
 * and exits 75; the harness, in systemd's part of Restart=on-failure,
 * starts it again with what it parked in the fd store: the host segment
 * made before is back with its bytes, and device segments work again.
 * A sticky error met at start (the restore's first device import) exits
 * 75 too, with the store as it was, but only after main.c's wait, so that
 * a GPU broken for good does not restart gshmd past the unit's start
 * limit (which would fail the unit and lose its fd store). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"

#define SIZE (1u << 20)

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Waits up to 20 s for gshmd to exit on its own, leaving it to be reaped
 * (harness_restart's kill and wait); its siginfo in *si. */
static bool exited_by_itself(struct harness *h, siginfo_t *si) {
  for (int i = 0; i < 2000; i++) {
    memset(si, 0, sizeof(*si));
    if (waitid(P_PID, (id_t)h->sp.pid, si, WEXITED | WNOHANG | WNOWAIT) == 0 && si->si_pid)
      return true;
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
  return false;
}

/* Connects as `name` and makes host segment "keep", of bytes want (seed). */
static gshm_client_t *connect_and_keep(struct harness *h, const char *name, unsigned char *want,
                                       unsigned long long seed) {
  gshm_client_t *c;
  gshm_segment_t *s;

  assert_int_equal(gshm_connect(h->socket_path, name, &c), 0);
  assert_int_equal(gshm_create(c, "keep", SIZE, NULL, 0600, 0, &s), 0);
  harness_random(want, SIZE, seed);
  assert_int_equal(gshm_write(s, 0, want, SIZE), 0);
  return c;
}

/* Whether c reads host segment "keep" back as want (got: SIZE bytes). */
static void keep_reads(gshm_client_t *c, const unsigned char *want, unsigned char *got) {
  gshm_segment_t *s;

  assert_int_equal(gshm_open(c, "keep", GSHM_ACCESS_READ, &s), 0);
  assert_int_equal(gshm_read(s, 0, got, SIZE), 0);
  assert_memory_equal(got, want, SIZE);
  assert_int_equal(gshm_close(s), 0);
}

/* Starts gshmd (args) with host segment "keep" (bytes want, seed) and
 * device segment "dev" on cuda:0, made by a client gone since. */
static void start_keeping_two(struct harness *h, const char *const *args, unsigned char *want,
                              unsigned long long seed) {
  gshm_client_t *c;
  gshm_segment_t *dev;

  assert_int_equal(harness_start(h, args), 0);
  harness_set_leftover(h);
  c = connect_and_keep(h, "sticky", want, seed);
  assert_int_equal(gshm_create(c, "dev", 2u << 20, "cuda:0", 0600, 0, &dev), 0);
  gshm_disconnect(c);
}

/* Writes a fake driver's failure ("NAME CODE") to path (fake_libcuda.c). */
static void put_failure(const char *path, const char *call, int code) {
  FILE *f;

  assert_non_null(f = fopen(path, "w"));
  fprintf(f, "%s %d\n", call, code);
  fclose(f);
}

static void test_sticky_error_restarts_keeping_segments(void **state) {
  const char *const args[] = {"--backend", "cuda", NULL};
  char dir[] = "/tmp/gshm-sticky-XXXXXX", trigger[64];
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE);
  gshm_client_t *c, *fresh;
  gshm_segment_t *dev;
  static struct harness h; /* (static: harness_kill_leftover reads it after a failure) */
  siginfo_t si;
  (void)state;

  assert_non_null(mkdtemp(dir));
  snprintf(trigger, sizeof(trigger), "%s/fail", dir);
  put_failure(trigger, "cuMemsetD8", 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */);
  setenv("FAKE_CUDA_FAIL_FILE", trigger, 1);

  assert_int_equal(harness_start(&h, args), 0);
  harness_set_leftover(&h);
  c = connect_and_keep(&h, "sticky", want, 42);
  assert_int_equal(gshm_create(c, "dev", 2u << 20, "cuda:0", 0600, 0, &dev), -EIO);
  assert_true(exited_by_itself(&h, &si));
  assert_int_equal(si.si_code, CLD_EXITED);
  assert_int_equal(si.si_status, 75);

  /* systemd's part: Restart=on-failure, with the fd store */
  assert_int_equal(harness_restart(&h, SIGKILL, args), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &fresh), 0);
  keep_reads(fresh, want, got);
  assert_int_equal(gshm_create(fresh, "dev", 2u << 20, "cuda:0", 0600, 0, &dev), 0);
  assert_int_equal(gshm_close(dev), 0);
  gshm_disconnect(fresh);
  gshm_disconnect(c);
  harness_set_leftover(NULL);
  assert_int_equal(harness_stop(&h), 0); /* this one exits cleanly */
  unsetenv("FAKE_CUDA_FAIL_FILE");
  rmdir(dir);
  free(want);
  free(got);
}

/* With daemon.sticky_start = restart, a sticky error in the restore: no
 * READY=1, the store untouched, exit 75 after GSHMD_STICKY_START_DELAY_S
 * (10 s; it was at once); the next start adopts every segment. */
static void test_sticky_error_at_start_waits(void **state) {
  const char *const args[] = {"--backend", "cuda", "--set", "daemon.sticky_start=restart", NULL};
  char dir[] = "/tmp/gshm-sticky-XXXXXX", trigger[64];
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE);
  static struct harness h;
  gshm_client_t *c;
  gshm_segment_t *dev;
  struct timespec t0, t1;
  (void)state;

  assert_non_null(mkdtemp(dir));
  snprintf(trigger, sizeof(trigger), "%s/fail", dir);
  setenv("FAKE_CUDA_FAIL_FILE", trigger, 1); /* (none yet) */
  start_keeping_two(&h, args, want, 43);
  put_failure(trigger, "cuMemImportFromShareableHandle", 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(harness_restart(&h, SIGKILL, args), -ECHILD); /* never ready */
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_int_equal(access(trigger, F_OK), -1); /* (the fake read it) */
  assert_true(WIFEXITED(h.sp.exit_status));
  assert_int_equal(WEXITSTATUS(h.sp.exit_status), 75);
  assert_true(t1.tv_sec - t0.tv_sec >= 9);
  assert_non_null(strstr(h.sp.status, "sticky CUDA error at start"));

  /* systemd's part again; the GPU works now */
  assert_int_equal(harness_restart(&h, SIGKILL, args), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &c), 0);
  keep_reads(c, want, got);
  assert_int_equal(gshm_open(c, "dev", GSHM_ACCESS_READ, &dev), 0);
  gshm_disconnect(c);
  harness_set_leftover(NULL);
  assert_int_equal(harness_stop(&h), 0);
  unsetenv("FAKE_CUDA_FAIL_FILE");
  rmdir(dir);
  free(want);
  free(got);
}

/* Waits up to 10 s for metric name (a sample without labels) to reach at
 * least min; false if it never does or gshmd stops answering. */
static bool metric_reaches(gshm_client_t *c, const char *name, unsigned long long min) {
  char want[128];

  snprintf(want, sizeof(want), "\n%s ", name);
  for (int i = 0; i < 1000; i++) {
    char *text = NULL, *at;
    unsigned long long v = 0;
    if (gshm_metrics(c, &text))
      return false;
    if ((at = strstr(text, want)))
      v = strtoull(at + strlen(want), NULL, 10);
    gshm_free(text);
    if (at && v >= min)
      return true;
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
  return false;
}

/* Whether `gshmctl VERB` ($GSHMCTL, as ctest sets it) prints text. */
static bool ctl_says(struct harness *h, const char *verb, const char *text) {
  char cmd[768], out[4096] = "";
  const char *ctl = getenv("GSHMCTL");
  size_t n;
  FILE *p;

  assert_non_null(ctl);
  snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' %s", ctl, h->socket_path, verb);
  assert_non_null(p = popen(cmd, "r"));
  n = fread(out, 1, sizeof(out) - 1, p);
  out[n] = '\0';
  assert_int_equal(pclose(p), 0);
  return strstr(out, text) != NULL;
}

/* What a gshmd started with broken GPUs serves (daemon.sticky_start =
 * serve, the default): host segment "keep" (bytes want), device segment
 * "dev" listed but parked (-ENODEV, its fd still in the store), device
 * creates refused -ENODEV with the reason, the fault in gshm_status and
 * gshmctl's status and devices, STATUS= and the metrics; and it keeps
 * serving while the probes fail. */
static void check_degraded(struct harness *h, const unsigned char *want, unsigned char *got) {
  gshm_client_t *c;
  gshm_segment_t *dev;
  gshm_segment_info_t info;
  gshm_status_info_t st;

  assert_int_equal(gshm_connect(h->socket_path, "degraded", &c), 0);
  keep_reads(c, want, got);
  assert_int_equal(gshm_stat_name(c, "dev", &info), 0);
  assert_int_equal(strncmp(info.location, "cuda:GPU-", 9), 0);
  assert_int_equal(gshm_open(c, "dev", GSHM_ACCESS_READ, &dev), -ENODEV);
  assert_non_null(strstr(gshm_last_error(c), "sticky CUDA error"));
  assert_int_equal(gshm__spawn_store_memory_fds(&h->sp), 2); /* keep's and dev's */
  assert_int_equal(gshm_create(c, "dev2", 2u << 20, "cuda:0", 0600, 0, &dev), -ENODEV);
  assert_non_null(strstr(gshm_last_error(c), "sticky CUDA error"));
  assert_non_null(strstr(gshm_last_error(c), "CUDA_ERROR_ECC_UNCORRECTABLE"));
  assert_int_equal(gshm_status(c, &st), 0);
  assert_non_null(strstr(st.gpu_fault, "0000:18:00.0: CUDA_ERROR_ECC_UNCORRECTABLE"));
  assert_string_equal(st.backends, "host");
  assert_true(ctl_says(h, "status", "GPUs unusable: a sticky CUDA error at gshmd's start "
                                    "(0000:18:00.0: CUDA_ERROR_ECC_UNCORRECTABLE)"));
  assert_true(ctl_says(h, "devices", "no usable GPUs: a sticky CUDA error"));
  gshm__spawn_poll(&h->sp, 0);
  assert_non_null(strstr(h->sp.status, "GPUs unusable"));
  assert_true(metric_reaches(c, "gshm_gpu_fault", 1));
  assert_true(metric_reaches(c, "gshm_gpu_probes_total", 3)); /* failed, gshmd still up */
  assert_int_equal(gshm_status(c, &st), 0);
  gshm_disconnect(c);
}

/* The GPUs mended (sticky removed) in a gshmd serving degraded since t0
 * (mono_ns): the next probe works, and gshmd exits 75 for its restart,
 * but not sooner than 10 s after its start (GSHMD_STICKY_START_DELAY_S:
 * probes every 200 ms must not restart it 5 times in 30 s, which would
 * fail the unit and drop its store); the restart (args) adopts device
 * segment "dev" on its GPU and serves "keep" (bytes want). */
static void mended_restarts(struct harness *h, const char *sticky, int64_t t0,
                            const char *const *args, const unsigned char *want,
                            unsigned char *got) {
  gshm_client_t *c;
  gshm_segment_t *dev;
  gshm_status_info_t st;
  siginfo_t si;
  int64_t t1;

  assert_int_equal(unlink(sticky), 0);
  assert_true(exited_by_itself(h, &si));
  t1 = mono_ns();
  print_message("    exited for its restart %.1f s after its degraded start\n",
                (double)(t1 - t0) / 1e9);
  assert_true(t1 - t0 >= 9 * 1000000000ll);
  assert_int_equal(si.si_code, CLD_EXITED);
  assert_int_equal(si.si_status, 75);
  assert_int_equal(harness_restart(h, SIGKILL, args), 0);
  assert_int_equal(gshm_connect(h->socket_path, "fresh", &c), 0);
  assert_int_equal(gshm_open(c, "dev", GSHM_ACCESS_READ, &dev), 0); /* on its GPU again */
  keep_reads(c, want, got);
  assert_int_equal(gshm_status(c, &st), 0);
  assert_string_equal(st.gpu_fault, "");
  gshm_disconnect(c);
  harness_set_leftover(NULL);
  assert_int_equal(harness_stop(h), 0);
}

/* A sticky error at start (in the CUDA backend's setup when fail is NULL,
 * else fail's call, in the restore) with the default daemon.sticky_start
 * = serve: gshmd serves what it can (check_degraded; it exited 75 after
 * 10 s, serving nothing, before), probes the GPUs every 200 ms, and once
 * they work (the sticky file removed) exits 75 by itself; the restart
 * adopts the device segment on its GPU. */
static void degraded_start(const char *fail) {
  const char *const args[] = {"--backend", "cuda", "--set", "daemon.gpu_probe_ms=200", NULL};
  char dir[] = "/tmp/gshm-sticky-XXXXXX", sticky[64], trigger[64];
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE);
  static struct harness h;
  int64_t t0;

  assert_non_null(mkdtemp(dir));
  snprintf(sticky, sizeof(sticky), "%s/sticky", dir);
  snprintf(trigger, sizeof(trigger), "%s/fail", dir);
  setenv("FAKE_CUDA_STICKY_FILE", sticky, 1); /* (none yet) */
  setenv("FAKE_CUDA_FAIL_FILE", trigger, 1);
  start_keeping_two(&h, args, want, 44);

  /* the GPU breaks for good: every process's first context fails */
  put_failure(sticky, "cuDevicePrimaryCtxRetain", 214 /* CUDA_ERROR_ECC_UNCORRECTABLE */);
  if (fail) /* (this gshmd's: its probes get the sticky file's) */
    put_failure(trigger, fail, 214);
  assert_int_equal(harness_restart(&h, SIGKILL, args), 0);
  t0 = mono_ns();
  check_degraded(&h, want, got);

  mended_restarts(&h, sticky, t0, args, want, got);
  unsetenv("FAKE_CUDA_STICKY_FILE");
  unsetenv("FAKE_CUDA_FAIL_FILE");
  rmdir(dir);
  free(want);
  free(got);
}

static void test_sticky_error_at_start_serves_host(void **state) {
  (void)state;
  degraded_start(NULL);
}

static void test_sticky_error_in_restore_serves_host(void **state) {
  (void)state;
  degraded_start("cuMemImportFromShareableHandle");
}

/* cuInit itself failing at start (CUDA_ERROR_NO_DEVICE: a driver
 * reloaded, its module not loaded yet) with a device segment in the fd
 * store, daemon.backend = auto: gshmd serves host segment "keep", keeps
 * "dev" parked, refuses device creates -ENODEV, says why as for a sticky
 * error (gshm_status, gshmctl status, STATUS=, the metrics) and probes
 * the GPUs; once the driver works, it exits 75 and the restart adopts
 * "dev".  (It parked "dev" and probed nothing before: only a restart by
 * hand brought it back.) */
static void test_no_driver_at_start_probes(void **state) {
  const char *const args[] = {"--backend", "auto", "--set", "daemon.gpu_probe_ms=200", NULL};
  char dir[] = "/tmp/gshm-sticky-XXXXXX", sticky[64];
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE);
  static struct harness h;
  gshm_client_t *c;
  gshm_segment_t *dev;
  gshm_status_info_t st;
  int64_t t0;
  (void)state;

  assert_non_null(mkdtemp(dir));
  snprintf(sticky, sizeof(sticky), "%s/sticky", dir);
  setenv("FAKE_CUDA_STICKY_FILE", sticky, 1); /* (none yet) */
  start_keeping_two(&h, args, want, 45);
  put_failure(sticky, "cuInit", 100 /* CUDA_ERROR_NO_DEVICE */);
  assert_int_equal(harness_restart(&h, SIGKILL, args), 0);
  t0 = mono_ns();

  assert_int_equal(gshm_connect(h.socket_path, "degraded", &c), 0);
  keep_reads(c, want, got);
  assert_int_equal(gshm_open(c, "dev", GSHM_ACCESS_READ, &dev), -ENODEV);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 2); /* keep's and dev's */
  assert_int_equal(gshm_create(c, "dev2", 2u << 20, "cuda:0", 0600, 0, &dev), -ENODEV);
  assert_non_null(strstr(gshm_last_error(c), "cuInit failed"));
  assert_int_equal(gshm_status(c, &st), 0);
  assert_string_equal(st.gpu_fault, "no driver: cuInit failed: no NVIDIA GPU, or its driver is "
                                    "not loaded");
  assert_true(ctl_says(&h, "status", "GPUs unusable: the CUDA driver did not start with "
                                     "gshmd (cuInit failed"));
  assert_true(ctl_says(&h, "devices", "no usable GPUs: the CUDA driver did not start"));
  gshm__spawn_poll(&h.sp, 0);
  assert_non_null(strstr(h.sp.status, "GPUs unusable"));
  assert_true(metric_reaches(c, "gshm_gpu_fault", 1));
  assert_true(metric_reaches(c, "gshm_gpu_probes_total", 3)); /* failed, gshmd still up */
  gshm_disconnect(c);

  mended_restarts(&h, sticky, t0, args, want, got);
  unsetenv("FAKE_CUDA_STICKY_FILE");
  rmdir(dir);
  free(want);
  free(got);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sticky_error_restarts_keeping_segments),
      cmocka_unit_test(test_sticky_error_at_start_waits),
      cmocka_unit_test(test_sticky_error_at_start_serves_host),
      cmocka_unit_test(test_sticky_error_in_restore_serves_host),
      cmocka_unit_test(test_no_driver_at_start_probes),
  };
  atexit(harness_kill_leftover);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
