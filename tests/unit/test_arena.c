/* SPDX-License-Identifier: Apache-2.0 */
/* The best-fit carving behind gshm's PyTorch pool (common/arena.c),
 * checked against a byte map of the range after every step. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "arena.h"

static void test_first_fit_and_merge(void **state) {
  struct gshm__arena a;
  uint64_t o1, o2, o3, o4;
  (void)state;

  assert_int_equal(gshm__arena_init(&a, 0), -EINVAL);
  gshm__arena_fini(&a);
  assert_int_equal(gshm__arena_init(&a, 1000), 0);
  assert_int_equal(gshm__arena_carve(&a, 0, &o1), -EINVAL);
  assert_int_equal(gshm__arena_carve(&a, 300, &o1), 0);
  assert_int_equal(gshm__arena_carve(&a, 300, &o2), 0);
  assert_int_equal(gshm__arena_carve(&a, 300, &o3), 0);
  assert_int_equal(o1, 0);
  assert_int_equal(o2, 300);
  assert_int_equal(o3, 600);
  assert_int_equal(gshm__arena_carve(&a, 101, &o4), -ENOMEM); /* 100 left */
  assert_int_equal(a.nlive, 3);
  assert_int_equal(a.live_bytes, 900);
  /* a hole in the middle is found first */
  assert_int_equal(gshm__arena_return(&a, 300), 0);
  assert_int_equal(gshm__arena_return(&a, 300), -EINVAL); /* twice */
  assert_int_equal(gshm__arena_return(&a, 301), -EINVAL); /* not a block start */
  assert_int_equal(gshm__arena_carve(&a, 200, &o4), 0);
  assert_int_equal(o4, 300);
  /* 100 at 500 and 100 at 900: 150 fits nowhere until neighbours merge */
  assert_int_equal(gshm__arena_carve(&a, 150, &o2), -ENOMEM);
  assert_int_equal(gshm__arena_return(&a, 600), 0); /* merges 500..1000 */
  assert_int_equal(gshm__arena_carve(&a, 500, &o2), 0);
  assert_int_equal(o2, 500);
  assert_int_equal(gshm__arena_return(&a, 0), 0);
  assert_int_equal(gshm__arena_return(&a, 300), 0);
  assert_int_equal(gshm__arena_return(&a, 500), 0);
  assert_int_equal(a.nlive, 0);
  assert_int_equal(a.live_bytes, 0);
  /* everything merged back into one extent */
  assert_non_null(a.free);
  assert_null(a.free->next);
  assert_int_equal(a.free->off, 0);
  assert_int_equal(a.free->size, 1000);
  gshm__arena_fini(&a);
  gshm__arena_fini(&a); /* twice is harmless */
}

/* A block goes to the smallest hole that holds it, the lowest of equals,
 * not to the first: first fit spent the large holes on small blocks. */
static void test_best_fit(void **state) {
  struct gshm__arena a;
  uint64_t o, left;
  (void)state;

  assert_int_equal(gshm__arena_init(&a, 1000), 0);
  for (uint64_t want = 0, size[] = {300, 100, 300, 100, 200}; want < 5; want++)
    assert_int_equal(gshm__arena_carve(&a, size[want], &o), 0);
  /* holes: 0..300, 400..700, 700..800 (merged with its neighbour: 400..800) */
  assert_int_equal(gshm__arena_return(&a, 0), 0);
  assert_int_equal(gshm__arena_return(&a, 400), 0);
  assert_int_equal(gshm__arena_return(&a, 700), 0);
  assert_int_equal(gshm__arena_fit(&a, 0, &left), -EINVAL);
  assert_int_equal(gshm__arena_fit(&a, 401, &left), -ENOMEM);
  assert_int_equal(gshm__arena_fit(&a, 250, &left), 0);
  assert_int_equal(left, 50); /* the 300 hole, not the 400 one */
  assert_int_equal(gshm__arena_carve(&a, 250, &o), 0);
  assert_int_equal(o, 0);
  assert_int_equal(gshm__arena_carve(&a, 50, &o), 0); /* the 50 left at 250 */
  assert_int_equal(o, 250);
  assert_int_equal(gshm__arena_fit(&a, 400, &left), 0);
  assert_int_equal(left, 0);
  /* equal holes: the lowest offset */
  assert_int_equal(gshm__arena_carve(&a, 100, &o), 0);
  assert_int_equal(o, 400);
  assert_int_equal(gshm__arena_carve(&a, 100, &o), 0);
  assert_int_equal(gshm__arena_carve(&a, 100, &o), 0);
  assert_int_equal(gshm__arena_return(&a, 400), 0);
  assert_int_equal(gshm__arena_return(&a, 600), 0); /* holes 400..500, 600..800 */
  assert_int_equal(gshm__arena_carve(&a, 100, &o), 0);
  assert_int_equal(o, 400);
  gshm__arena_fini(&a);
}

/* Random carves and returns; a byte map says which bytes are taken, and
 * every block handed out must be free in it. */
static void test_random(void **state) {
  enum { SIZE = 1 << 16, N = 64 };
  static unsigned char map[SIZE];
  struct gshm__arena a;
  uint64_t off[N], len[N];
  unsigned seed = 12345;
  (void)state;

  memset(map, 0, sizeof(map));
  memset(len, 0, sizeof(len));
  assert_int_equal(gshm__arena_init(&a, SIZE), 0);
  for (int step = 0; step < 20000; step++) {
    int i = (int)((seed = seed * 1103515245u + 12345u) >> 16) % N;
    if (len[i]) {
      assert_int_equal(gshm__arena_return(&a, off[i]), 0);
      memset(map + off[i], 0, len[i]);
      len[i] = 0;
    } else {
      uint64_t want = 1 + ((seed >> 8) % 4096), o;
      int e = gshm__arena_carve(&a, want, &o);
      if (e == -ENOMEM)
        continue;
      assert_int_equal(e, 0);
      assert_true(o + want <= SIZE);
      for (uint64_t b = o; b < o + want; b++)
        assert_int_equal(map[b], 0);
      memset(map + o, 1, want);
      off[i] = o;
      len[i] = want;
    }
  }
  for (int i = 0; i < N; i++)
    if (len[i])
      assert_int_equal(gshm__arena_return(&a, off[i]), 0);
  assert_int_equal(a.nlive, 0);
  assert_null(a.free->next);
  assert_int_equal(a.free->size, SIZE);
  gshm__arena_fini(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_fit_and_merge),
      cmocka_unit_test(test_best_fit),
      cmocka_unit_test(test_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
