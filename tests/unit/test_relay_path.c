/* SPDX-License-Identifier: Apache-2.0 */
/* The path of relayed bytes (daemon/cluster/relay_path.h), as it comes
 * from a peer's Grant.upstream: what is refused, what "?" means, and
 * that a name is matched whole (a relay that took "n1" for a part of
 * "n10" would refuse a peer it may serve, and the other way round grant
 * a peer on the path: a ring of relays waiting on itself). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/relay_path.h"

static void test_good_paths(void **state) {
  static const struct {
    const char *path;
    bool known;
    unsigned names;
  } good[] = {{"", true, 0},          {"a", true, 1},          {"n1,n0", true, 2},
              {"?", false, 0},        {"n1,?", false, 1},      {"a,b,c,d,e,f,g,h", true, 8},
              {"a,b,c,d,e,f,g,h,?", false, 8}, {"node-7.example:x", true, 1}};
  (void)state;

  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    bool known = !good[i].known;
    assert_true(gshmd__relay_path_ok(good[i].path, &known));
    assert_int_equal(known, good[i].known);
    assert_int_equal(gshmd__relay_path_names(good[i].path), good[i].names);
  }
}

static void test_bad_paths(void **state) {
  char longest[RELAY_PATH_LEN + 64], name63[64];
  static const char *const bad[] = {
      ",",  "a,",  ",a",    "a,,b",  "?,a", "?,?", "a,?,b", "a?,", "a,b,c,d,e,f,g,h,i",
      "a b", "a,\x1b", "a,\x7f", "\t", "?,", "a,?,"};
  bool known;
  (void)state;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_false(gshmd__relay_path_ok(bad[i], &known));
  }
  /* a name of 64 bytes, and names of 63 bytes as many as fit */
  memset(name63, 'x', 63);
  name63[63] = 0;
  snprintf(longest, sizeof(longest), "%sx", name63);
  assert_false(gshmd__relay_path_ok(longest, &known));
  longest[0] = 0;
  for (int i = 0; i < RELAY_PATH_MAX; i++)
    snprintf(longest + strlen(longest), sizeof(longest) - strlen(longest), "%s%s", i ? "," : "",
             name63);
  assert_true(gshmd__relay_path_ok(longest, &known));
  assert_true(known);
  strcat(longest, ",?");
  assert_true(gshmd__relay_path_ok(longest, &known));
  assert_false(known);
}

static void test_whole_names(void **state) {
  (void)state;
  assert_true(gshmd__relay_path_has("n1,n0", "n1"));
  assert_true(gshmd__relay_path_has("n1,n0", "n0"));
  assert_false(gshmd__relay_path_has("n10,n0", "n1"));
  assert_false(gshmd__relay_path_has("n1,n0", "n"));
  assert_false(gshmd__relay_path_has("n1,n0", "n1,n0"));
  assert_false(gshmd__relay_path_has("n1,?", "?"));
  assert_false(gshmd__relay_path_has("", "n1"));
  assert_true(gshmd__relay_path_has("a,b,c,d,e,f,g,h", "h"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_paths),
      cmocka_unit_test(test_bad_paths),
      cmocka_unit_test(test_whole_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
