/* SPDX-License-Identifier: Apache-2.0 */
/* A peer's staged grant is checked before the puller sizes anything by
 * it: hostile slot counts and sizes are refused, what a gshmd's staging
 * makes is accepted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cluster/stage.h"

static void test_hostile(void **state) {
  (void)state;
  /* 2^26 slots of 1 byte: the slot table would take 256 MiB */
  assert_false(gshmd_stage_grant_ok(1u << 26, 1, 1u << 26));
  assert_false(gshmd_stage_grant_ok(STAGE_MAX_SLOTS + 1, 4096, UINT64_MAX));
  assert_false(gshmd_stage_grant_ok(UINT32_MAX, 4096, UINT64_MAX));
  assert_false(gshmd_stage_grant_ok(0, 4096, 4096));
  assert_false(gshmd_stage_grant_ok(1, 0, 4096));
  assert_false(gshmd_stage_grant_ok(1, 4095, 4096));
  assert_false(gshmd_stage_grant_ok(1, STAGE_MAX_SLOT_SIZE + 1, UINT64_MAX));
  /* slots beyond the buffer the grant describes */
  assert_false(gshmd_stage_grant_ok(8, 8u << 20, (8u << 23) - 1));
}

static void test_what_staging_makes(void **state) {
  (void)state;
  assert_true(gshmd_stage_grant_ok(8, 8u << 20, 64u << 20)); /* the defaults */
  assert_true(gshmd_stage_grant_ok(1, 4096, 4096));
  assert_true(gshmd_stage_grant_ok(STAGE_MAX_SLOTS, STAGE_MAX_SLOT_SIZE,
                                   (uint64_t)STAGE_MAX_SLOTS * STAGE_MAX_SLOT_SIZE));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_what_staging_makes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
