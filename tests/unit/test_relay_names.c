/* SPDX-License-Identifier: Apache-2.0 */
/* The relayed segments by name (daemon/cluster/relay_names.h): a name's
 * entries come back in their sets' start order, whatever order they were
 * added in, and each removal (the head of its name, the middle, the
 * last) leaves the others found.  (relay.c's grant by name walked every
 * item of every pull in flight before.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/relay_names.h"

/* Whether the entries named name are exactly want[0..n), in that order. */
static void check_chain(void *root, const char *name, struct relay_name **want, size_t n) {
  struct relay_name *e = gshmd__relay_names_get(&root, name);

  for (size_t i = 0; i < n; i++, e = e->same)
    assert_ptr_equal(e, want[i]);
  assert_null(e);
}

static void test_order_and_removal(void **state) {
  char *x1 = strdup("pub/x"), *x2 = strdup("pub/x"), *x3 = strdup("pub/x");
  struct relay_name a = {x1, 2, NULL}, b = {x2, 1, NULL}, c = {x3, 3, NULL};
  struct relay_name d = {"pub/y", 1, NULL}, e = {"pub/x", 2, NULL};
  void *root = NULL;
  (void)state;

  assert_null(gshmd__relay_names_get(&root, "pub/x"));
  assert_int_equal(gshmd__relay_names_add(&root, &a), 0);
  assert_int_equal(gshmd__relay_names_add(&root, &d), 0);
  assert_int_equal(gshmd__relay_names_add(&root, &c), 0);
  assert_int_equal(gshmd__relay_names_add(&root, &b), 0); /* (a new head) */
  assert_int_equal(gshmd__relay_names_add(&root, &e), 0); /* (after a: the same order) */
  check_chain(root, "pub/x", (struct relay_name *[]){&b, &a, &e, &c}, 4);
  check_chain(root, "pub/y", (struct relay_name *[]){&d}, 1);
  assert_null(gshmd__relay_names_get(&root, "pub/z"));

  gshmd__relay_names_remove(&root, &b); /* the head: the tree's key was b's name */
  free(x2);
  check_chain(root, "pub/x", (struct relay_name *[]){&a, &e, &c}, 3);
  gshmd__relay_names_remove(&root, &e); /* the middle */
  gshmd__relay_names_remove(&root, &c); /* the last */
  check_chain(root, "pub/x", (struct relay_name *[]){&a}, 1);
  gshmd__relay_names_remove(&root, &a);
  assert_null(gshmd__relay_names_get(&root, "pub/x"));
  check_chain(root, "pub/y", (struct relay_name *[]){&d}, 1);
  gshmd__relay_names_remove(&root, &d);
  assert_null(root);
  free(x1);
  free(x3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_and_removal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
