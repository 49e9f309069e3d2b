/* SPDX-License-Identifier: Apache-2.0 */
/* Size, location and name parsing. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

static void test_sizes(void **state) {
  uint64_t v;
  (void)state;
  assert_int_equal(gshm__parse_size("4096", &v), 0);
  assert_int_equal(v, 4096);
  assert_int_equal(gshm__parse_size("4K", &v), 0);
  assert_int_equal(v, 4096);
  assert_int_equal(gshm__parse_size("64M", &v), 0);
  assert_int_equal(v, 64ull << 20);
  assert_int_equal(gshm__parse_size("2G", &v), 0);
  assert_int_equal(v, 2ull << 30);
  assert_int_equal(gshm__parse_size("3GiB", &v), 0);
  assert_int_equal(v, 3ull << 30);
  assert_int_equal(gshm__parse_size("1t", &v), 0);
  assert_int_equal(v, 1ull << 40);
  /* K, KB and KiB all mean 1024 (issue 16: "4KB" was not a size) */
  assert_int_equal(gshm__parse_size("4KB", &v), 0);
  assert_int_equal(v, 4096);
  assert_int_equal(gshm__parse_size("4kib", &v), 0);
  assert_int_equal(v, 4096);
  assert_int_equal(gshm__parse_size("2MB", &v), 0);
  assert_int_equal(v, 2ull << 20);
  assert_int_equal(gshm__parse_size("1gb", &v), 0);
  assert_int_equal(v, 1ull << 30);
  assert_int_equal(gshm__parse_size("1TB", &v), 0);
  assert_int_equal(v, 1ull << 40);
  assert_int_equal(gshm__parse_size("4KiBB", &v), -EINVAL);
  assert_int_equal(gshm__parse_size("", &v), -EINVAL);
  assert_int_equal(gshm__parse_size("-1", &v), -EINVAL);
  assert_int_equal(gshm__parse_size("12Q", &v), -EINVAL);
  assert_int_equal(gshm__parse_size("1 K", &v), -EINVAL);
  assert_int_equal(gshm__parse_size("99999999999999999999", &v), -ERANGE);
  assert_int_equal(gshm__parse_size("17000000T", &v), -ERANGE);
}

static void test_locations(void **state) {
  struct gshm_location l;
  (void)state;
  assert_int_equal(gshm__location_parse("host", &l), 0);
  assert_int_equal(l.kind, GSHM_LOCATION_HOST);
  assert_int_equal(gshm__location_parse("cuda:1", &l), 0);
  assert_int_equal(l.kind, GSHM_LOCATION_CUDA_INDEX);
  assert_int_equal(l.index, 1);
  assert_int_equal(gshm__location_parse("cuda:GPU-1a2b3c4d-0000-1111-2222-333344445555", &l), 0);
  assert_int_equal(l.kind, GSHM_LOCATION_CUDA_UUID);
  assert_string_equal(l.uuid, "GPU-1a2b3c4d-0000-1111-2222-333344445555");
  assert_int_equal(gshm__location_parse("cuda:", &l), -EINVAL);
  assert_int_equal(gshm__location_parse("cuda:-1", &l), -EINVAL);
  assert_int_equal(gshm__location_parse("cuda:GPU-zz", &l), -EINVAL);
  assert_int_equal(gshm__location_parse("gpu0", &l), -EINVAL);
}

static void test_names(void **state) {
  char long_name[300];
  (void)state;
  assert_int_equal(gshm__name_check("weights", 255), 0);
  assert_int_equal(gshm__name_check("llama/70b/layer.0", 255), 0);
  assert_int_equal(gshm__name_check("", 255), -EINVAL);
  assert_int_equal(gshm__name_check("/abs", 255), -EINVAL);
  assert_int_equal(gshm__name_check("a//b", 255), -EINVAL);
  assert_int_equal(gshm__name_check("a/../b", 255), -EINVAL);
  assert_int_equal(gshm__name_check("a/.", 255), -EINVAL);
  assert_int_equal(gshm__name_check("tab\there", 255), -EINVAL);
  memset(long_name, 'n', sizeof(long_name) - 1);
  long_name[255] = '\0';
  assert_int_equal(gshm__name_check(long_name, 255), 0);
  long_name[255] = 'n';
  long_name[256] = '\0';
  assert_int_equal(gshm__name_check(long_name, 255), -ENAMETOOLONG);
}

static void test_format(void **state) {
  char b[32];
  (void)state;
  assert_string_equal(gshm__format_size(512, b, sizeof(b)), "512 B");
  assert_string_equal(gshm__format_size(64ull << 20, b, sizeof(b)), "64 MiB");
  assert_string_equal(gshm__format_size(1536, b, sizeof(b)), "1.5 KiB");
  /* against a scale: its unit, one decimal, whatever the part */
  assert_string_equal(gshm__format_size_as(4ull << 20, (64ull << 20) + 7, b, sizeof(b)),
                      "4.0 MiB");
  assert_string_equal(gshm__format_size_as(7, (64ull << 20) + 7, b, sizeof(b)), "0.0 MiB");
  assert_string_equal(gshm__format_size_as(64ull << 20, 64ull << 20, b, sizeof(b)), "64.0 MiB");
  assert_string_equal(gshm__format_size_as(3ull << 30, 5ull << 30, b, sizeof(b)), "3.0 GiB");
  assert_string_equal(gshm__format_size_as(7, 700, b, sizeof(b)), "7 B");
  {
    const unsigned char u[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
                                 0, 1, 2, 3, 4, 5, 6, 7};
    char s[48];
    gshm__format_gpu_uuid(u, s);
    assert_string_equal(s, "GPU-12345678-9abc-def0-0001-020304050607");
  }
}

/* Issue 15 item 10: what gshmctl tables print of other users' names. */
static void test_escape(void **state) {
  char buf[64];
  (void)state;
  assert_string_equal(gshm__escape_text("plain/name", buf, sizeof(buf)), "plain/name");
  assert_string_equal(gshm__escape_text("caf\xc3\xa9", buf, sizeof(buf)), "caf\xc3\xa9");
  assert_string_equal(gshm__escape_text("a\x1b[2Jb", buf, sizeof(buf)), "a\\x1B[2Jb");
  assert_string_equal(gshm__escape_text("c1\xc2\x9b", buf, sizeof(buf)), "c1\\xC2\\x9B");
  assert_string_equal(gshm__escape_text("raw\x9b", buf, sizeof(buf)), "raw\\x9B");
  assert_string_equal(gshm__escape_text("\xe2\x80\xae", buf, sizeof(buf)), "\\xE2\\x80\\xAE");
  assert_string_equal(gshm__escape_text("\xc0\xaf", buf, sizeof(buf)), "\\xC0\\xAF"); /* overlong */
  assert_string_equal(gshm__escape_text("\xed\xa0\x80", buf, sizeof(buf)), "\\xED\\xA0\\x80");
  assert_string_equal(gshm__escape_text("back\\slash", buf, sizeof(buf)), "back\\\\slash");
  assert_string_equal(gshm__escape_text("del\x7f", buf, sizeof(buf)), "del\\x7F");
  /* U+061C ARABIC LETTER MARK, a bidi control (it went raw), and its
   * neighbours, Arabic letters, that stay */
  assert_string_equal(gshm__escape_text("alm\xd8\x9c", buf, sizeof(buf)), "alm\\xD8\\x9C");
  assert_string_equal(gshm__escape_text("\xd8\x9b\xd8\x9d", buf, sizeof(buf)), "\xd8\x9b\xd8\x9d");
  {
    char *j = gshm__json_escape_unprintable("\"a\xd8\x9c" "b\"");
    char clean[] = "x\xd8\x9cy";
    assert_non_null(j);
    assert_string_equal(j, "\"a\\u061Cb\"");
    free(j);
    gshm__text_clean(clean);
    assert_string_equal(clean, "x??y");
  }
  /* cut at a whole character, never inside an escape */
  assert_string_equal(gshm__escape_text("ab\x9b", buf, 6), "ab");
  assert_string_equal(gshm__escape_text("ab\x9b", buf, 7), "ab\\x9B");
}

/* What gshmd hands clients of a peer's words: what escape_text escapes,
 * made '?' byte for byte; UTF-8 text and lengths kept. */
/* gshm__map_shared_aligned: 2 MiB aligned from 2 MiB up, every byte of
 * the file reachable, and nothing of its reservation left around it
 * (a length that is not a whole page once left 2 MiB reserved past it). */
static void test_map_aligned(void **state) {
  static const uint64_t lens[] = {4096, (2u << 20) - 1, 2u << 20, (2u << 20) + 123, 6u << 20};
  const uint64_t huge = 2u << 20, page = (uint64_t)sysconf(_SC_PAGESIZE);
  (void)state;

  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    uint64_t len = lens[i], mapped = (len + page - 1) / page * page;
    int fd = memfd_create("map-aligned", MFD_CLOEXEC);
    uint8_t *p;

    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    p = gshm__map_shared_aligned(fd, len, PROT_READ | PROT_WRITE);
    assert_true(p != MAP_FAILED);
    if (len >= huge)
      assert_int_equal((uintptr_t)p % huge, 0);
    p[0] = 1;
    p[len - 1] = 2;
    assert_int_equal(p[len - 1], 2);
    /* past the mapping, what was reserved: nothing (madvise says ENOMEM
     * for an unmapped page) */
    if (len >= huge) {
      assert_int_equal(madvise(p + mapped, page, MADV_NORMAL), -1);
      assert_int_equal(errno, ENOMEM);
    }
    assert_int_equal(munmap(p, len), 0);
    assert_int_equal(madvise(p, page, MADV_NORMAL), -1);
    close(fd);
  }
}

static void test_text_clean(void **state) {
  char s[64];
  (void)state;
  snprintf(s, sizeof(s), "%s", "caf\xc3\xa9 x\xc2\x9b" "2J\xe2\x80\xae" "e\x1b\x9b\xed\xa0\x80!");
  gshm__text_clean(s);
  assert_string_equal(s, "caf\xc3\xa9 x??2J???e?????" "!"); /* (apart: "??!" is a trigraph) */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_clean),
      cmocka_unit_test(test_map_aligned),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_locations),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_escape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
