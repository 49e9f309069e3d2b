/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/seg_index.c: where a listing resumes after its cursor's segment
 * was freed.  Against a brute-force model over random adds and frees, and
 * the cost of resuming past a long run of freed segments (before: a walk
 * of the segment list from its head for every page). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "seg_index.h"

/* Stand-ins: the index only stores and returns the pointers. */
static struct gshmd_segment *seg_of(uint64_t id) { return (struct gshmd_segment *)(uintptr_t)(id * 16); }

static void add(struct gshmd_seg_index *x, uint64_t id) {
  assert_int_equal(gshmd_seg_index_reserve(x), 0);
  gshmd_seg_index_add(x, seg_of(id), id);
}

static void test_matches_a_model(void **state) {
  enum { N = 4000 };
  static bool live[N + 2];
  struct gshmd_seg_index x = {0};
  uint64_t next = 1;

  (void)state;
  srand(7);
  for (int op = 0; op < 40000; op++) {
    int r = rand() % 10;
    if (r < 4 && next <= N) {
      live[next] = true;
      add(&x, next++);
    } else if (r < 8 && next > 1) {
      uint64_t id = 1 + (uint64_t)rand() % (next - 1);
      live[id] = false;
      gshmd_seg_index_remove(&x, id);
    } else {
      uint64_t after = (uint64_t)rand() % (next + 1), want = after + 1;
      while (want < next && !live[want])
        want++;
      assert_ptr_equal(gshmd_seg_index_after(&x, after), want < next ? seg_of(want) : NULL);
    }
  }
  /* an adoption out of order lands in place */
  gshmd_seg_index_remove(&x, 2);
  add(&x, 2);
  assert_ptr_equal(gshmd_seg_index_after(&x, 1), seg_of(2));
  gshmd_seg_index_free(&x);
}

/* 100,000 segments, the first 49,999 freed (fewer holes than segments:
 * no compaction), 10,000 listings resumed from a freed cursor: the holes
 * stepped over stay linear in the run, not 10,000 times it. */
static void test_resuming_past_freed_segments_is_not_quadratic(void **state) {
  enum { N = 100000, RUN = 49999, Q = 10000 };
  struct gshmd_seg_index x = {0};

  (void)state;
  for (uint64_t id = 1; id <= N; id++)
    add(&x, id);
  for (uint64_t id = 1; id <= RUN; id++)
    gshmd_seg_index_remove(&x, id);
  for (int q = 0; q < Q; q++)
    assert_ptr_equal(gshmd_seg_index_after(&x, (uint64_t)q % RUN), seg_of(RUN + 1));
  print_message("    %d lookups past a run of %d freed segments: %llu holes stepped over\n", Q,
                RUN, (unsigned long long)x.hops);
  assert_true(x.hops < 4 * (uint64_t)RUN + 4 * (uint64_t)Q);
  gshmd_seg_index_free(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_a_model),
      cmocka_unit_test(test_resuming_past_freed_segments_is_not_quadratic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
