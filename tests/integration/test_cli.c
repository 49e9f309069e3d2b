/* SPDX-License-Identifier: Apache-2.0 */
/* gshmctl as users run it: real gshmctl processes against a real gshmd.
 * Byte-exact read/write round trips, exit codes, and --json documents. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"

#define CTL(h, out, ...) harness_gshmctl(h, out, (const char *const[]){__VA_ARGS__, NULL})

static char *write_random_file(struct harness *h, const char *name, size_t n, unsigned seed) {
  char *path = malloc(512);
  unsigned char *buf = malloc(n);
  int fd;
  snprintf(path, 512, "%s/%s", h->sp.dir, name);
  harness_random(buf, n, seed);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, buf, n), (ssize_t)n);
  close(fd);
  free(buf);
  return path;
}

static unsigned char *slurp(const char *path, size_t *n) {
  struct stat st;
  unsigned char *buf;
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(fstat(fd, &st), 0);
  buf = malloc((size_t)st.st_size + 1);
  assert_int_equal(read(fd, buf, (size_t)st.st_size), st.st_size);
  close(fd);
  *n = (size_t)st.st_size;
  return buf;
}

static void test_read_write_roundtrip(void **state) {
  struct harness *h = *state;
  const size_t n = 3u << 20;
  char *in = write_random_file(h, "in.bin", n, 1234), out[512];
  unsigned char *a, *b;
  size_t na, nb;

  snprintf(out, sizeof(out), "%s/out.bin", h->sp.dir);
  assert_int_equal(CTL(h, NULL, "create", "blob", "3M", "--mode", "0640"), 0);
  assert_int_equal(CTL(h, NULL, "write", "blob", "-i", in), 0);
  assert_int_equal(CTL(h, NULL, "read", "blob", "-o", out), 0);
  a = slurp(in, &na);
  b = slurp(out, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, na);
  free(b);

  /* A window, through stdout: --offset and --length. */
  {
    char *text = NULL;
    assert_int_equal(CTL(h, &text, "read", "blob", "--offset", "1K", "--length", "4096"), 0);
    assert_memory_equal(text, a + 1024, 4096);
    free(text);
  }
  /* Input larger than the segment is refused with exit 1, not truncated silently. */
  {
    char *big = write_random_file(h, "big.bin", n + 1, 5);
    assert_int_equal(CTL(h, NULL, "write", "blob", "-i", big), 1);
    unlink(big);
    free(big);
  }
  free(a);
  /* the harness removes its directory only when nothing else is in it */
  unlink(in);
  unlink(out);
  free(in);
}

static void test_exit_codes(void **state) {
  struct harness *h = *state;
  char *text = NULL;

  assert_int_equal(CTL(h, NULL, "read", "no-such-segment"), 5);
  assert_int_equal(CTL(h, NULL, "unlink", "no-such-segment"), 5);
  assert_int_equal(CTL(h, NULL, "create", "x", "0"), 2);          /* size 0: usage */
  assert_int_equal(CTL(h, NULL, "create", "x", "12Q"), 2);        /* not a size */
  assert_int_equal(CTL(h, NULL, "create", "x"), 2);               /* missing SIZE */
  assert_int_equal(CTL(h, NULL, "frobnicate"), 2);                /* unknown verb */
  assert_int_equal(CTL(h, NULL, "create", "dup", "4K"), 0);
  assert_int_equal(CTL(h, NULL, "create", "dup", "4K"), 1);       /* exists */
  assert_int_equal(CTL(h, &text, "--help"), 0);
  assert_non_null(strstr(text, "mappings"));
  free(text);
  /* A daemon that is not there: exit 3. */
  {
    struct harness fake = *h;
    fake.socket_path = "/nonexistent/gshmd.sock";
    assert_int_equal(CTL(&fake, NULL, "status"), 3);
    assert_int_equal(CTL(&fake, NULL, "create", "x", "4K"), 3);
    /* bad arguments are a usage error whether or not gshmd runs */
    assert_int_equal(CTL(&fake, NULL, "create", "x", "12Q"), 2);
    assert_int_equal(CTL(&fake, NULL, "create", "x"), 2);
    assert_int_equal(CTL(&fake, NULL, "chmod", "x", "999"), 2);
    assert_int_equal(CTL(&fake, NULL, "unlink"), 2);
    assert_int_equal(CTL(&fake, NULL, "read"), 2);
  }
}

static json_t *ctl_json(struct harness *h, const char *verb) {
  char *text = NULL;
  json_error_t err;
  json_t *doc;
  assert_int_equal(CTL(h, &text, "--json", verb), 0);
  doc = json_loads(text, 0, &err);
  if (!doc)
    fprintf(stderr, "not JSON (%s): %s\n", err.text, text);
  assert_non_null(doc);
  free(text);
  assert_int_equal(json_integer_value(json_object_get(doc, "schema_version")), 1);
  return doc;
}

static void assert_keys(json_t *o, const char *const *keys) {
  for (int i = 0; keys[i]; i++) {
    if (!json_object_get(o, keys[i]))
      fprintf(stderr, "missing key '%s'\n", keys[i]);
    assert_non_null(json_object_get(o, keys[i]));
  }
}

static void test_json_documents(void **state) {
  struct harness *h = *state;
  gshm_client_t *c;
  gshm_segment_t *s;
  void *addr;
  json_t *doc, *arr, *row;

  assert_int_equal(gshm_connect(h->socket_path, "json-holder", &c), 0);
  assert_int_equal(gshm_create(c, "j/seg", 10000, "host", 0644, 0, &s), 0);
  assert_int_equal(gshm_map(s, NULL, 0, &addr), 0);

  doc = ctl_json(h, "segments");
  arr = json_object_get(doc, "segments");
  assert_int_equal(json_array_size(arr), 1);
  row = json_array_get(arr, 0);
  assert_keys(row, (const char *const[]){"name", "id", "generation", "size", "requested_size",
                                         "location", "uid", "gid", "mode", "state", "leases",
                                         "created", NULL});
  assert_string_equal(json_string_value(json_object_get(row, "name")), "j/seg");
  assert_int_equal(json_integer_value(json_object_get(row, "size")), 12288);
  assert_int_equal(json_integer_value(json_object_get(row, "requested_size")), 10000);
  assert_string_equal(json_string_value(json_object_get(row, "mode")), "0644");
  json_decref(doc);

  doc = ctl_json(h, "mappings");
  arr = json_object_get(doc, "mappings");
  assert_int_equal(json_array_size(arr), 1);
  row = json_array_get(arr, 0);
  assert_keys(row, (const char *const[]){"segment", "pid", "uid", "client", "access", "since",
                                         "mapped", "devices", NULL});
  assert_int_equal(json_integer_value(json_object_get(row, "pid")), getpid());
  assert_string_equal(json_string_value(json_object_get(row, "client")), "json-holder");
  assert_string_equal(json_string_value(json_object_get(row, "access")), "rw");
  assert_true(json_is_true(json_object_get(row, "mapped")));
  json_decref(doc);

  doc = ctl_json(h, "clients");
  arr = json_object_get(doc, "clients");
  assert_true(json_array_size(arr) >= 2); /* us and gshmctl itself */
  assert_keys(json_array_get(arr, 0),
              (const char *const[]){"session_id", "pid", "uid", "gid", "name", "since", "leases",
                                    NULL});
  json_decref(doc);

  doc = ctl_json(h, "status");
  assert_keys(doc, (const char *const[]){"version", "pid", "clients", "segments", "leases", "bytes",
                                         "backends", NULL});
  assert_int_equal(json_integer_value(json_object_get(doc, "segments")), 1);
  assert_int_equal(json_integer_value(json_object_get(doc, "pid")), h->sp.pid);
  json_decref(doc);

  doc = ctl_json(h, "devices");
  assert_true(json_is_array(json_object_get(doc, "devices")));
  json_decref(doc);

  gshm_close(s);
  gshm_disconnect(c);
}

static void test_tables(void **state) {
  struct harness *h = *state;
  char *text = NULL;

  assert_int_equal(CTL(h, NULL, "create", "t/one", "64M"), 0);
  assert_int_equal(CTL(h, &text, "segments"), 0);
  assert_non_null(strstr(text, "t/one"));
  assert_non_null(strstr(text, "64 MiB"));
  free(text);
  assert_int_equal(CTL(h, &text, "status"), 0);
  assert_non_null(strstr(text, "1 segment (64 MiB)")); /* one: not "1 segments" */
  free(text);
  assert_int_equal(CTL(h, &text, "metrics"), 0);
  assert_non_null(strstr(text, "gshm_segments 1\n"));
  free(text);
  assert_int_equal(CTL(h, NULL, "unlink", "t/one"), 0);
  assert_int_equal(CTL(h, &text, "segments"), 0);
  assert_null(strstr(text, "t/one"));
  free(text);
}

/* Names that other users chose reach the table and JSON output
 * escaped: a C1 CSI (U+009B, and a raw 0x9B byte), a bidi override and
 * ESC never arrive raw at the terminal. */
static void test_names_escaped(void **state) {
  struct harness *h = *state;
  static const char seg_name[] = "esc/\xc2\x9b" "2J\xe2\x80\xae" "gpj.exe";
  static const char client_name[] = "evil\x9b" "31m";
  gshm_client_t *c;
  gshm_segment_t *s;
  char *text = NULL;

  assert_int_equal(gshm_connect(h->socket_path, client_name, &c), 0);
  assert_int_equal(gshm_create(c, seg_name, 4096, NULL, 0644, 0, &s), 0);
  /* --json too (the attack4 review): jansson escapes only C0 controls, so
   * a C1 CSI and a bidi override in a name reached the terminal raw, in
   * valid JSON; now as \u escapes, the same JSON value. */
  for (int k = 0; k < 6; k++) {
    static const char *const verbs[] = {"segments", "mappings", "clients"};
    const char *verb = verbs[k % 3], *how = k < 3 ? "" : "--json ";
    assert_int_equal(k < 3 ? CTL(h, &text, verb) : CTL(h, &text, "--json", verb), 0);
    print_message("    gshmctl %s%s:\n%s", how, verb, text);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
      assert_true(*p == '\n' || (*p >= 0x20 && *p != 0x7f && *p != 0x9b));
    assert_null(strstr(text, "\xc2\x9b"));
    assert_null(strstr(text, "\xe2\x80\xae"));
    if (k % 3 < 2)
      assert_non_null(strstr(text, k < 3 ? "esc/\\xC2\\x9B2J\\xE2\\x80\\xAEgpj.exe"
                                         : "esc/\\u009B2J\\u202Egpj.exe"));
    if (k == 1 || k == 2)
      assert_non_null(strstr(text, "evil\\x9B31m"));
    free(text);
  }
  gshm_close(s);
  gshm_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_read_write_roundtrip, harness_cmocka_setup, harness_cmocka_teardown),
      cmocka_unit_test_setup_teardown(test_exit_codes, harness_cmocka_setup, harness_cmocka_teardown),
      cmocka_unit_test_setup_teardown(test_json_documents, harness_cmocka_setup, harness_cmocka_teardown),
      cmocka_unit_test_setup_teardown(test_tables, harness_cmocka_setup, harness_cmocka_teardown),
      cmocka_unit_test_setup_teardown(test_names_escaped, harness_cmocka_setup, harness_cmocka_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
