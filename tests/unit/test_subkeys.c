/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster key's subkeys (daemon/cluster/subkeys.h): known answers,
 * computed apart from libsodium with Python's hashlib, which reproduces
 * crypto_kdf_derive_from_key (libsodium 1.0.18,
 * crypto_kdf/blake2b/kdf_blake2b.c: BLAKE2b of no message, keyed with
 * the key, salt = the id as 8 bytes little-endian then 8 zeros,
 * personalisation = the context then 8 zeros, 32 bytes out):
 *
 *   import hashlib, struct
 *   def sub(key, i, ctx):
 *       return hashlib.blake2b(b'', digest_size=32, key=key,
 *                              salt=struct.pack('<Q', i) + bytes(8),
 *                              person=ctx + bytes(8)).hexdigest()
 *   sub(bytes(range(32)), 1, b'gshmhelo'), sub(bytes(range(32)), 2, b'gshmsess')
 *   raw = hashlib.blake2b(b'gshm-subkeys-test-key-file', digest_size=32).digest()
 *   sub(raw, 1, b'gshmhelo'), sub(raw, 2, b'gshmsess')
 *
 * A node that derived them otherwise could not talk to its peers; one
 * that used the key itself for either would not be separating keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "cluster/subkeys.h"

static void hex_of(const uint8_t *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void check(const struct subkeys *k, const char *hello, const char *session) {
  char got[2 * SUBKEY_BYTES + 1];

  hex_of(k->hello, sizeof(k->hello), got);
  assert_string_equal(got, hello);
  hex_of(k->session, sizeof(k->session), got);
  assert_string_equal(got, session);
}

/* The key 00 01 .. 1f. */
static void test_known_answers_counting_key(void **state) {
  struct subkeys k;
  (void)state;

  for (int i = 0; i < SUBKEY_BYTES; i++)
    k.raw[i] = (uint8_t)i;
  gshmd__subkeys_derive(&k);
  check(&k, "c0f352cdfcc37b4f7f54613628cb4404ae6ec8c3b95b4496719bb20322a2b101",
        "ad47332b08b0e54f0468f89ec368b28e63bc728a0344db9df4be6adc851f6b37");
}

/* The key as gshmd reads it from a key file (conf.c: crypto_generichash
 * of the file's bytes, blanks around them dropped). */
static void test_known_answers_key_file(void **state) {
  static const char file[] = "gshm-subkeys-test-key-file";
  char got[2 * SUBKEY_BYTES + 1];
  struct subkeys k;
  (void)state;

  crypto_generichash(k.raw, sizeof(k.raw), (const uint8_t *)file, sizeof(file) - 1, NULL, 0);
  hex_of(k.raw, sizeof(k.raw), got);
  assert_string_equal(got, "5382b3bc02b91d6290db88f17300f084c24d2c59ff15094e69adfc62e38d5036");
  gshmd__subkeys_derive(&k);
  check(&k, "1bd520596188cad9474d70191e72bd01116f45738d5f7aab0dc108c933a2e6c7",
        "d670427594565405f81c83cfb0db7511c6365322d3ac2c3dbd94f92338678fd1");
}

/* No two purposes share a key, and the key itself is none of them;
 * wiping leaves nothing. */
static void test_separate_and_wiped(void **state) {
  static const uint8_t zero[sizeof(struct subkeys)];
  struct subkeys k;
  (void)state;

  randombytes_buf(k.raw, sizeof(k.raw));
  gshmd__subkeys_derive(&k);
  assert_memory_not_equal(k.hello, k.raw, SUBKEY_BYTES);
  assert_memory_not_equal(k.session, k.raw, SUBKEY_BYTES);
  assert_memory_not_equal(k.hello, k.session, SUBKEY_BYTES);
  gshmd__subkeys_wipe(&k);
  assert_memory_equal(&k, zero, sizeof(k));
  gshmd__subkeys_wipe(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_answers_counting_key),
      cmocka_unit_test(test_known_answers_key_file),
      cmocka_unit_test(test_separate_and_wiped),
  };
  if (sodium_init() < 0)
    return 1;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
