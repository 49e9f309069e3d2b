/* SPDX-License-Identifier: Apache-2.0 */
/* The constructions that protect a data frame between two gshmd
 * (daemon/cluster/stream.c gshmd__stream_seal / _unseal), every mode:
 * a frame sealed as number n with key k opens only as number n with key
 * k, and one flipped bit anywhere (header, payload, tag) is refused;
 * libcrypto (what gshmd uses) and libsodium (the reference) give the
 * same bytes for every mode, and each opens what the other sealed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "stream.h"

#define LEN (1u << 20) /* a frame's payload: 1 MiB plus odd tails below */

static const enum stream_mode modes[] = {STREAM_AUTH, STREAM_GMAC, STREAM_AES256GCM,
                                         STREAM_CHACHA20};

static bool usable(enum stream_mode m) {
  return (m != STREAM_GMAC && m != STREAM_AES256GCM) || crypto_aead_aes256gcm_is_available();
}

/* Seals payload (len bytes) as frame n; returns the bytes as they go on
 * the wire (ciphertext where the mode encrypts), malloc'd. */
static uint8_t *seal(enum stream_mode m, const uint8_t *key, uint64_t n, const struct frame_hdr *h,
                     const uint8_t *payload, size_t len, uint8_t tag[STREAM_TAG]) {
  uint8_t *wire = malloc(len ? len : 1);
  assert_non_null(wire);
  assert_int_equal(gshmd__stream_seal(m, key, n, h, payload, wire, len, tag), 0);
  if (!gshmd__stream_encrypts(m))
    memcpy(wire, payload, len);
  else if (len >= 64)
    assert_memory_not_equal(wire, payload, 64); /* encrypting modes hide the bytes */
  return wire;
}

static int open_copy(enum stream_mode m, const uint8_t *key, uint64_t n, const struct frame_hdr *h,
                     const uint8_t *wire, size_t len, const uint8_t tag[STREAM_TAG]) {
  uint8_t *buf = malloc(len ? len : 1);
  int r;
  assert_non_null(buf);
  memcpy(buf, wire, len);
  r = gshmd__stream_unseal(m, key, n, h, buf, len, tag);
  free(buf);
  return r;
}

static void one_mode(enum stream_mode m, size_t len) {
  uint8_t key[STREAM_KEY], key2[STREAM_KEY], tag[STREAM_TAG], tag2[STREAM_TAG];
  uint8_t *payload = malloc(len ? len : 1), *wire, *buf;
  struct frame_hdr h = gshmd__frame_data(7, 3 * LEN, len), h2;

  assert_non_null(payload);
  randombytes_buf(key, sizeof(key));
  randombytes_buf(key2, sizeof(key2));
  randombytes_buf(payload, len);
  wire = seal(m, key, 41, &h, payload, len, tag);

  /* opens as sealed, and gives the payload back */
  buf = malloc(len ? len : 1);
  assert_non_null(buf);
  memcpy(buf, wire, len);
  assert_int_equal(gshmd__stream_unseal(m, key, 41, &h, buf, len, tag), 0);
  assert_memory_equal(buf, payload, len);
  free(buf);

  /* another frame number, another key */
  assert_int_equal(open_copy(m, key, 42, &h, wire, len, tag), -EBADMSG);
  assert_int_equal(open_copy(m, key2, 41, &h, wire, len, tag), -EBADMSG);
  /* each bit of the header */
  for (size_t bit = 0; bit < 8 * sizeof(h); bit++) {
    h2 = h;
    ((uint8_t *)&h2)[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    assert_int_equal(open_copy(m, key, 41, &h2, wire, len, tag), -EBADMSG);
  }
  /* a bit of the payload: first, last, and 64 spread between */
  for (size_t i = 0; len && i < 66; i++) {
    size_t at = i == 0 ? 0 : i == 65 ? len - 1 : (len / 64) * (i - 1) + i;
    if (at >= len)
      continue;
    wire[at] ^= 0x20;
    assert_int_equal(open_copy(m, key, 41, &h, wire, len, tag), -EBADMSG);
    wire[at] ^= 0x20;
  }
  /* each bit of the tag */
  for (size_t bit = 0; bit < 8 * STREAM_TAG; bit++) {
    memcpy(tag2, tag, sizeof(tag2));
    tag2[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    assert_int_equal(open_copy(m, key, 41, &h, wire, len, tag2), -EBADMSG);
  }
  /* another mode's tag never opens under this one */
  for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
    if (modes[k] == m || !usable(modes[k]))
      continue;
    uint8_t *w2 = seal(modes[k], key, 41, &h, payload, len, tag2);
    assert_int_equal(open_copy(m, key, 41, &h, w2, len, tag2), -EBADMSG);
    free(w2);
  }
  free(wire);
  free(payload);
}

static void test_every_mode(void **state) {
  size_t lens[] = {LEN, LEN + 13, 1, 0};
  unsigned ran = 0;
  (void)state;

  assert_true(gshmd__seal_openssl_ready()); /* else gshmd would compute with libsodium */
  for (int lib = 0; lib < 2; lib++) {
    gshmd__seal_openssl = lib == 0;
    for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
      if (!usable(modes[k]))
        continue;
      for (size_t i = lib; i < sizeof(lens) / sizeof(lens[0]); i++) /* libsodium: not 1 MiB */
        one_mode(modes[k], lens[i]);
      ran++;
    }
  }
  gshmd__seal_openssl = true;
  assert_true(ran >= 4); /* Poly1305 and ChaCha20-Poly1305 run everywhere */
}

/* The same frame sealed by libcrypto and by libsodium: the same tag and
 * ciphertext, and each library opens the other's. */
static void test_libraries_agree(void **state) {
  size_t lens[] = {LEN + 13, 64, 1, 0};
  uint8_t key[STREAM_KEY], tag1[STREAM_TAG], tag2[STREAM_TAG];
  uint8_t *payload = malloc(LEN + 13), *w1, *w2;
  struct frame_hdr h;
  (void)state;

  assert_non_null(payload);
  randombytes_buf(key, sizeof(key));
  randombytes_buf(payload, LEN + 13);
  for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
    if (!usable(modes[k]))
      continue;
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
      h = gshmd__frame_data(9, 5 * LEN, lens[i]);
      gshmd__seal_openssl = true;
      w1 = seal(modes[k], key, 1000003, &h, payload, lens[i], tag1);
      gshmd__seal_openssl = false;
      w2 = seal(modes[k], key, 1000003, &h, payload, lens[i], tag2);
      assert_memory_equal(tag1, tag2, STREAM_TAG);
      if (lens[i])
        assert_memory_equal(w1, w2, lens[i]);
      assert_int_equal(open_copy(modes[k], key, 1000003, &h, w1, lens[i], tag1), 0);
      gshmd__seal_openssl = true;
      assert_int_equal(open_copy(modes[k], key, 1000003, &h, w2, lens[i], tag2), 0);
      free(w1);
      free(w2);
    }
  }
  free(payload);
}

/* The hello's choice: GMAC only when both sides said CAP_GMAC (and so
 * have AES-NI) and nobody asked for encryption. */
static void test_mode_choice(void **state) {
  (void)state;
  assert_int_equal(gshmd__stream_mode(false, false, false), STREAM_AUTH);
  assert_int_equal(gshmd__stream_mode(false, true, false), STREAM_AUTH);
  assert_int_equal(gshmd__stream_mode(false, true, true), STREAM_GMAC);
  assert_int_equal(gshmd__stream_mode(true, true, true), STREAM_AES256GCM);
  assert_int_equal(gshmd__stream_mode(true, false, true), STREAM_CHACHA20);
  assert_false(gshmd__stream_encrypts(STREAM_GMAC));
  assert_false(gshmd__stream_encrypts(STREAM_AUTH));
  assert_true(gshmd__stream_encrypts(STREAM_AES256GCM));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_mode),
      cmocka_unit_test(test_libraries_agree),
      cmocka_unit_test(test_mode_choice),
  };
  if (sodium_init() < 0)
    return 1;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
