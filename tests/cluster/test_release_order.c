/* SPDX-License-Identifier: Apache-2.0 */
/* When a pull's grant goes back to its peer, with real gshmd on
 * 127.0.0.1 (the puller's log, at debug level, in a file): the Release
 * of a segment that ends its set is written after the set is published
 * and answered (before, it was written when the segment closed, a write
 * to the peer between the last byte and the requester's answer:
 * docs/PERFORMANCE.md "Session 35"), and it does go back (the serving
 * node holds no lease of the segment after). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
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

static struct cluster_keys keys;
static struct node A, B; /* A serves pub/ *; B pulls, logging to log_path */
static char log_path[128];

static int group_setup(void **state) {
  char pa[64], pb[64];
  int saved, fd;
  (void)state;

  keys_make(&keys, "gshm-release-order");
  snprintf(log_path, sizeof(log_path), "%s/b.log", keys.dir);
  A.port = free_port();
  B.port = free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", B.port);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d", A.port);
  node_start(&A, "a", pa, keys.key, "pub/*", NULL);
  /* B's stderr (its log) into the file, for the test to read */
  fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  saved = harness_stderr_onto(fd);
  assert_true(saved >= 0);
  node_start(&B, "b", pb, keys.key, "", "daemon.log_level=7", "cluster.pull_chunk=1M", NULL);
  harness_stderr_back(saved);
  close(fd);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  nodes_stop(&A, &B);
  unlink(log_path);
  keys_remove(&keys);
  return 0;
}

/* B's log from offset `from` on (malloc'ed); *end_out: its length now. */
static char *log_since(long from, long *end_out) {
  FILE *f = fopen(log_path, "re");
  char *text;
  long end;

  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  end = ftell(f);
  assert_true(end >= from);
  assert_non_null(text = calloc(1, (size_t)(end - from) + 1));
  assert_int_equal(fseek(f, from, SEEK_SET), 0);
  assert_int_equal(fread(text, 1, (size_t)(end - from), f), (size_t)(end - from));
  fclose(f);
  *end_out = end;
  return text;
}

/* Where B's log (text) says the grant of `remote` went back, or NULL. */
static const char *released(const char *text, const char *remote) {
  char needle[160];
  snprintf(needle, sizeof(needle), " of '%s' released to peer 'a'", remote);
  return strstr(text, needle);
}

/* Leases of A's segment name (its peer b's grant holds one until it goes
 * back). */
static uint32_t leases_of(gshm_client_t *a, const char *name) {
  gshm_segment_info_t info;

  assert_int_equal(gshm_stat_name(a, name, &info), 0);
  return info.leases;
}

/* One segment (four chunks): its Release comes after "pulled", which
 * B logs as it publishes the set, just before the answer. */
static void test_release_after_answer(void **state) {
  gshm_client_t *a = connect_to(&A), *b = connect_to(&B);
  gshm_pull_opts_t po = {.mode = 0644};
  gshm_pull_result_t r;
  const char *pulled, *rel;
  char *text;
  long from, end;
  int64_t t_end;
  (void)state;

  make_segment(a, "pub/one", 4 * MiB, 1);
  free(log_since(0, &from)); /* (what B logged so far is not this pull's) */
  assert_int_equal(gshm_pull(b, "a", "pub/one", &po, &r), 0);
  check_segment(b, "pub/one", 4 * MiB, 1);
  for (t_end = now_ms() + 10000; leases_of(a, "pub/one") && now_ms() < t_end;)
    usleep(10000);
  assert_int_equal(leases_of(a, "pub/one"), 0); /* the grant went back */
  text = log_since(from, &end);
  pulled = strstr(text, "cluster: pulled 'pub/one' from peer 'a'");
  rel = released(text, "pub/one");
  printf("B's log of the pull:\n%s", text);
  assert_non_null(pulled);
  assert_non_null(rel);
  assert_true(rel > pulled); /* (before: the Release came first) */
  free(text);
  assert_int_equal(gshm_unlink(b, "pub/one"), 0);
  assert_int_equal(gshm_unlink(a, "pub/one"), 0);
  gshm_disconnect(b);
  gshm_disconnect(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_release_after_answer),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
