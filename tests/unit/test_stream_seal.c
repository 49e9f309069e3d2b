/* SPDX-License-Identifier: Apache-2.0 */
/* The constructions that protect a data frame between two gshmd
 * (daemon/cluster/stream.c gshmd__stream_seal / _unseal), every mode:
 * a frame sealed as number n with key k opens only as number n with key
 * k, and one flipped bit anywhere (header, payload, tag) is refused;
 * libcrypto (what gshmd uses) and libsodium (the reference) give the
 * same bytes for every mode, and each opens what the other sealed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ghash.h"
#include "lane_io.h"
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

/* GHASH from the standard's definition (SP 800-38D, Algorithm 1, a bit
 * at a time): X * Y in GF(2^128), bit 0 the leftmost. */
static void ref_mul(uint8_t x[16], const uint8_t y[16]) {
  uint8_t z[16] = {0}, v[16];
  memcpy(v, y, 16);
  for (int i = 0; i < 128; i++) {
    if (x[i / 8] >> (7 - i % 8) & 1)
      for (int j = 0; j < 16; j++)
        z[j] ^= v[j];
    int lsb = v[15] & 1;
    for (int j = 15; j > 0; j--)
      v[j] = (uint8_t)(v[j] >> 1 | v[j - 1] << 7);
    v[0] >>= 1;
    if (lsb)
      v[0] ^= 0xe1;
  }
  memcpy(x, z, 16);
}

static void ref_ghash(const uint8_t h[16], uint8_t y[16], const uint8_t *in, size_t len) {
  for (size_t o = 0; o < len; o += 16) {
    for (size_t j = 0; j < 16 && o + j < len; j++)
      y[j] ^= in[o + j];
    ref_mul(y, h);
  }
}

/* ghash.h's GHASH equals the definition's, for every length to 600
 * bytes and some longer, at every alignment, continued across calls. */
static void test_ghash_reference(void **state) {
  enum { MAX = 4096 + 64 };
  uint8_t *buf = malloc(MAX + 64), h[16], y1[16], y2[16];
  struct ghash_key k;
  (void)state;

  if (!gshmd__ghash_wide_usable()) {
    print_message("this CPU lacks AVX-512BW/VPCLMULQDQ: gshmd uses libcrypto's GMAC here\n");
    free(buf);
    skip();
  }
  assert_non_null(buf);
  randombytes_buf(buf, MAX + 64);
  for (int round = 0; round < 3; round++) {
    randombytes_buf(h, sizeof(h));
    if (round == 2)
      memset(h, 0xff, sizeof(h));
    gshmd__ghash_init(&k, h);
    for (size_t len = 0; len < MAX; len += len < 600 ? 1 : 173) {
      size_t align = len % 64;
      memset(y1, 0, 16);
      memset(y2, 0, 16);
      ref_ghash(h, y1, buf + align, len);
      gshmd__ghash_update(&k, y2, buf + align, len);
      assert_memory_equal(y1, y2, 16);
      /* continued: a second call from where the first ended */
      ref_ghash(h, y1, buf, 16 * (len % 40));
      gshmd__ghash_update(&k, y2, buf, 16 * (len % 40));
      assert_memory_equal(y1, y2, 16);
    }
  }
  free(buf);
}

/* xmm0-15 as the caller finds them just after gshmd__ghash_init returns
 * (every vector register is the caller's to save, so none is restored). */
__attribute__((noinline, target("avx"))) static void regs_after_init(struct ghash_key *k,
                                                                    const uint8_t h[16],
                                                                    uint8_t out[16][16]) {
  gshmd__ghash_init(k, h);
  __asm__ volatile("vmovdqu %%xmm0, 0(%0)\n\tvmovdqu %%xmm1, 16(%0)\n\t"
                   "vmovdqu %%xmm2, 32(%0)\n\tvmovdqu %%xmm3, 48(%0)\n\t"
                   "vmovdqu %%xmm4, 64(%0)\n\tvmovdqu %%xmm5, 80(%0)\n\t"
                   "vmovdqu %%xmm6, 96(%0)\n\tvmovdqu %%xmm7, 112(%0)\n\t"
                   "vmovdqu %%xmm8, 128(%0)\n\tvmovdqu %%xmm9, 144(%0)\n\t"
                   "vmovdqu %%xmm10, 160(%0)\n\tvmovdqu %%xmm11, 176(%0)\n\t"
                   "vmovdqu %%xmm12, 192(%0)\n\tvmovdqu %%xmm13, 208(%0)\n\t"
                   "vmovdqu %%xmm14, 224(%0)\n\tvmovdqu %%xmm15, 240(%0)"
                   :
                   : "r"(out)
                   : "memory");
}

/* The hash key's powers stay in struct ghash_key (which its owner
 * wipes), never in a vector register after gshmd__ghash_init returns:
 * a frame given up between begin and the first update (its socket
 * failed, gshmd__frame_mac_abort) left H and H^2 there for whatever ran
 * next on the thread (ghash.h, docs/SECURITY.md "no power of the hash
 * key in registers"). */
static void test_ghash_init_leaves_no_power(void **state) {
  uint8_t h[16], regs[16][16];
  struct ghash_key k;
  (void)state;

  if (!gshmd__ghash_wide_usable())
    skip();
  for (int round = 0; round < 8; round++) {
    randombytes_buf(h, sizeof(h));
    regs_after_init(&k, h, regs);
    for (int r = 0; r < 16; r++)
      for (int i = 0; i < GHASH_POWERS; i++)
        if (!memcmp(regs[r], k.pow[i], 16))
          fail_msg("xmm%d holds H^%d after gshmd__ghash_init", r, GHASH_POWERS - i);
  }
  sodium_memzero(&k, sizeof(k));
}

/* AES-GMAC with ghash.h's GHASH gives libcrypto's tag (and libsodium's)
 * for every length to 4 KiB + 1, 1 MiB + 13, and each alignment. */
static void test_gmac_wide_agrees(void **state) {
  uint8_t key[STREAM_KEY], t1[STREAM_TAG], t2[STREAM_TAG], t3[STREAM_TAG];
  uint8_t *payload = malloc(LEN + 13 + 64); /* (the longest frame at offset 60 of it) */
  (void)state;

  if (!gshmd__ghash_wide_usable() || !crypto_aead_aes256gcm_is_available()) {
    free(payload);
    skip();
  }
  assert_non_null(payload);
  randombytes_buf(payload, LEN + 13 + 64);
  for (size_t len = 0; len <= LEN + 13; len += len <= 4097 ? 1 : LEN + 13 - 4098) {
    const uint8_t *p = payload + len % 61;
    struct frame_hdr h = gshmd__frame_data((uint32_t)len, 77 * len, len);
    randombytes_buf(key, sizeof(key));
    gshmd__seal_wide_ghash = true;
    assert_int_equal(gshmd__stream_seal(STREAM_GMAC, key, len * 3 + 1, &h, p, NULL, len, t1), 0);
    gshmd__seal_wide_ghash = false;
    assert_int_equal(gshmd__stream_seal(STREAM_GMAC, key, len * 3 + 1, &h, p, NULL, len, t2), 0);
    gshmd__seal_openssl = false;
    if (len % 64 == 0 || len > 4097)
      assert_int_equal(gshmd__stream_seal(STREAM_GMAC, key, len * 3 + 1, &h, p, NULL, len, t3), 0);
    else
      memcpy(t3, t2, sizeof(t3));
    gshmd__seal_openssl = true;
    gshmd__seal_wide_ghash = true;
    assert_memory_equal(t1, t2, STREAM_TAG);
    assert_memory_equal(t1, t3, STREAM_TAG);
  }
  free(payload);
}

/* GHASH of the GCM specification's test cases 2 (AES-128) and 14
 * (AES-256): H, one block of ciphertext, no associated data (McGrew and
 * Viega, "The Galois/Counter Mode of Operation", appendix B); the
 * hand-written code and the bit-by-bit definition both give the
 * published value. */
static void test_ghash_known_answers(void **state) {
  static const struct {
    const char *h, *c, *ghash;
  } tc[] = {
      {"66e94bd4ef8a2c3b884cfa59ca342b2e", "0388dace60b6a392f328c2b971b2fe78",
       "f38cbb1ad69223dcc3457ae5b6b0f885"},
      {"dc95c078a2408989ad48a21492842087", "cea7403d4d606b6e074ec5d3baf39d18",
       "83de425c5edc5d498f382c441041ca92"},
  };
  (void)state;

  if (!gshmd__ghash_wide_usable())
    skip();
  for (size_t i = 0; i < sizeof(tc) / sizeof(tc[0]); i++) {
    uint8_t h[16], in[32] = {0}, want[16], y1[16] = {0}, y2[16] = {0}, y3[16] = {0};
    struct ghash_key k;
    assert_int_equal(sodium_hex2bin(h, 16, tc[i].h, 32, NULL, NULL, NULL), 0);
    assert_int_equal(sodium_hex2bin(in, 16, tc[i].c, 32, NULL, NULL, NULL), 0);
    assert_int_equal(sodium_hex2bin(want, 16, tc[i].ghash, 32, NULL, NULL, NULL), 0);
    in[16 + 15] = 128; /* len(A) = 0, len(C) = 128 bits, big-endian */
    gshmd__ghash_init(&k, h);
    gshmd__ghash_update(&k, y1, in, sizeof(in));
    gshmd__ghash_update(&k, y2, in, 16); /* the same, in two calls */
    gshmd__ghash_update(&k, y2, in + 16, 16);
    ref_ghash(h, y3, in, sizeof(in));
    assert_memory_equal(y1, want, 16);
    assert_memory_equal(y2, want, 16);
    assert_memory_equal(y3, want, 16);
    sodium_memzero(&k, sizeof(k));
  }
}

/* AES-GMAC of frame n as the standard defines it, through libcrypto's
 * EVP here in the test (not seal.c's code): AES-256-GCM, IV = n
 * little-endian then 4 zero bytes, the payload the associated data, the
 * header the plaintext (its ciphertext not sent). */
static void evp_gmac(const uint8_t *key, uint64_t n, const struct frame_hdr *h, const uint8_t *p,
                     size_t len, uint8_t tag[STREAM_TAG]) {
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  uint8_t iv[12] = {0}, ct[sizeof(*h)];
  int l;

  memcpy(iv, &n, sizeof(n));
  assert_non_null(c);
  assert_int_equal(EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv), 1);
  for (size_t o = 0, k; o < len; o += k) {
    k = len - o < (1u << 20) ? len - o : (1u << 20);
    assert_int_equal(EVP_EncryptUpdate(c, NULL, &l, p + o, (int)k), 1);
  }
  assert_int_equal(EVP_EncryptUpdate(c, ct, &l, (const uint8_t *)h, sizeof(*h)), 1);
  assert_int_equal(EVP_EncryptFinal_ex(c, ct, &l), 1);
  assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, STREAM_TAG, tag), 1);
  EVP_CIPHER_CTX_free(c);
}

/* Every way gshmd computes frame n's AES-GMAC at payload p (len bytes)
 * gives want, and each opens it: the 512-bit GHASH whole and in pieces
 * of random multiples of 16 bytes (a lane's thread), libcrypto whole
 * (the fallback where the CPU lacks VPCLMULQDQ), libsodium (where
 * libcrypto lacks an algorithm); a flipped payload bit fails each. */
static void gmac_every_path(const uint8_t *key, uint64_t n, const struct frame_hdr *h,
                            uint8_t *p, size_t len, const uint8_t want[STREAM_TAG]) {
  uint8_t t[STREAM_TAG];
  struct frame_mac m;

  for (int path = 0; path < 3; path++) {
    gshmd__seal_wide_ghash = path == 0;
    gshmd__seal_openssl = path != 2;
    assert_int_equal(gshmd__stream_seal(STREAM_GMAC, key, n, h, p, NULL, len, t), 0);
    assert_memory_equal(t, want, STREAM_TAG);
    assert_int_equal(gshmd__stream_unseal(STREAM_GMAC, key, n, h, p, len, want), 0);
    if (len) {
      size_t at = randombytes_uniform((uint32_t)len);
      uint8_t bit = (uint8_t)(1u << randombytes_uniform(8));
      p[at] ^= bit;
      assert_int_equal(gshmd__stream_unseal(STREAM_GMAC, key, n, h, p, len, want), -EBADMSG);
      p[at] ^= bit;
    }
  }
  gshmd__seal_wide_ghash = true;
  gshmd__seal_openssl = true;
  if (!gshmd__frame_mac_inline(STREAM_GMAC))
    return;
  assert_int_equal(gshmd__frame_mac_begin(&m, key, n, h), 0);
  for (size_t off = 0, k; off < len; off += k) {
    k = 16 * (size_t)randombytes_uniform(300);
    if (k > len - off || randombytes_uniform(8) == 0)
      k = len - off;
    gshmd__frame_mac_update(&m, p + off, k);
  }
  gshmd__frame_mac_end(&m, t);
  assert_memory_equal(t, want, STREAM_TAG);
}

/* The frame's AES-GMAC, every way gshmd computes it, against
 * libcrypto's EVP AES-256-GCM called here: the lengths around GHASH's
 * block (16), the 512-bit register (64) and the 32-block stride (512),
 * 4 KiB and 1 MiB, then 400 random ones to 256 KiB, each at a random
 * offset of 0 to 63 bytes (unaligned), a random key and a random 64-bit
 * frame number. */
static void test_gmac_random_vs_evp(void **state) {
  static const size_t fixed[] = {0,    1,    15,   16,   17,   31,   32,   33,       63,
                                 64,   65,   127,  128,  129,  511,  512,  513,      1023,
                                 1024, 1025, 4095, 4096, 4097, 8191, 8192, LEN - 1, LEN + 13};
  const size_t max = LEN + 13;
  uint8_t key[STREAM_KEY], want[STREAM_TAG], want2[STREAM_TAG], hdr_ct[sizeof(struct frame_hdr)];
  uint8_t *buf = malloc(max + 64);
  unsigned nfixed = sizeof(fixed) / sizeof(fixed[0]);
  (void)state;

  if (!crypto_aead_aes256gcm_is_available()) {
    free(buf);
    skip();
  }
  assert_non_null(buf);
  randombytes_buf(buf, max + 64);
  for (unsigned i = 0; i < nfixed + 400; i++) {
    size_t len = i < nfixed ? fixed[i] : randombytes_uniform(256 << 10);
    uint8_t *p = buf + randombytes_uniform(64);
    uint64_t n = ((uint64_t)randombytes_random() << 32) | randombytes_random();
    struct frame_hdr h = gshmd__frame_data(randombytes_random(), n >> 3, len);
    randombytes_buf(key, sizeof(key));
    evp_gmac(key, n, &h, p, len, want);
    /* and libsodium's AES-256-GCM, called here too */
    uint8_t iv[12] = {0};
    memcpy(iv, &n, sizeof(n));
    assert_int_equal(crypto_aead_aes256gcm_encrypt_detached(hdr_ct, want2, NULL,
                                                            (const uint8_t *)&h, sizeof(h), p,
                                                            len, NULL, iv, key),
                     0);
    assert_memory_equal(want, want2, STREAM_TAG);
    gmac_every_path(key, n, &h, p, len, want);
  }
  free(buf);
}

/* A frame tagged piece by piece (what a lane's thread does, lane_io.c)
 * has the one-shot tag, for pieces of any multiple of 16 bytes and frame
 * numbers past 2^32; a short piece before another never gives a tag that
 * matches. */
static void test_frame_mac_pieces(void **state) {
  uint8_t key[STREAM_KEY], t1[STREAM_TAG], t2[STREAM_TAG];
  uint8_t *payload = malloc(LEN + 13);
  struct frame_mac m;
  (void)state;

  if (!gshmd__frame_mac_inline(STREAM_GMAC)) {
    free(payload);
    skip();
  }
  assert_non_null(payload);
  randombytes_buf(payload, LEN + 13);
  for (int round = 0; round < 200; round++) {
    size_t len = round < 100 ? randombytes_uniform(70000) : LEN + 13 - randombytes_uniform(4096);
    uint64_t n = ((uint64_t)randombytes_random() << 32) | randombytes_random();
    struct frame_hdr h = gshmd__frame_data(round, 4096 * (uint64_t)round, len);
    randombytes_buf(key, sizeof(key));
    assert_int_equal(gshmd__stream_seal(STREAM_GMAC, key, n, &h, payload, NULL, len, t1), 0);
    assert_int_equal(gshmd__frame_mac_begin(&m, key, n, &h), 0);
    for (size_t off = 0, k; off < len; off += k) {
      k = 16 * (1 + randombytes_uniform(round % 2 ? 40 : 20000));
      if (k > len - off)
        k = len - off;
      gshmd__frame_mac_update(&m, payload + off, k);
    }
    gshmd__frame_mac_end(&m, t2);
    assert_memory_equal(t1, t2, STREAM_TAG);
  }
  /* 17 bytes, then the rest: the padding of the first piece is not the
   * frame's bytes, so the tag must not match */
  struct frame_hdr h = gshmd__frame_data(1, 0, 4096);
  assert_int_equal(gshmd__stream_seal(STREAM_GMAC, key, 5, &h, payload, NULL, 4096, t1), 0);
  assert_int_equal(gshmd__frame_mac_begin(&m, key, 5, &h), 0);
  gshmd__frame_mac_update(&m, payload, 17);
  gshmd__frame_mac_update(&m, payload + 17, 4096 - 17);
  gshmd__frame_mac_end(&m, t2);
  assert_memory_not_equal(t1, t2, STREAM_TAG);
  free(payload);
}

/* A frame of an encrypting mode sealed piece by piece (a lane's thread,
 * lane_io.c) is the frame gshmd__stream_seal makes whole (ciphertext and
 * tag), for pieces of any length; opened piece by piece in place, a
 * whole-sealed frame gives its payload back, and one flipped bit of its
 * ciphertext, or another frame number, is refused. */
static void test_frame_aead_pieces(void **state) {
  const enum stream_mode em[] = {STREAM_AES256GCM, STREAM_CHACHA20};
  uint8_t key[STREAM_KEY], t1[STREAM_TAG], t2[STREAM_TAG];
  uint8_t *payload = malloc(LEN + 13), *ct = malloc(LEN + 13), *ct2 = malloc(LEN + 13);
  struct frame_aead a;
  (void)state;

  assert_true(payload && ct && ct2);
  randombytes_buf(payload, LEN + 13);
  for (int round = 0; round < 120; round++) {
    enum stream_mode m = em[round % 2];
    size_t len = round < 60 ? 1 + randombytes_uniform(70000) : LEN + 13 - randombytes_uniform(4096);
    uint64_t n = ((uint64_t)randombytes_random() << 32) | randombytes_random();
    struct frame_hdr h = gshmd__frame_data(round, 4096 * (uint64_t)round, len);
    if (!gshmd__frame_aead_inline(m) || !usable(m))
      continue;
    randombytes_buf(key, sizeof(key));
    assert_int_equal(gshmd__stream_seal(m, key, n, &h, payload, ct, len, t1), 0);
    assert_int_equal(gshmd__frame_aead_begin(&a, m, true, key, n, &h), 0);
    for (size_t off = 0, k; off < len; off += k) {
      k = 1 + randombytes_uniform(round % 3 ? 300 : 300000);
      if (k > len - off)
        k = len - off;
      assert_int_equal(gshmd__frame_aead_update(&a, payload + off, ct2 + off, k), 0);
    }
    assert_int_equal(gshmd__frame_aead_end(&a, t2), 0);
    assert_memory_equal(ct, ct2, len);
    assert_memory_equal(t1, t2, STREAM_TAG);
    /* opened in pieces, in place */
    assert_int_equal(gshmd__frame_aead_begin(&a, m, false, key, n, &h), 0);
    for (size_t off = 0, k; off < len; off += k) {
      k = len - off < 65536 ? len - off : 65536;
      assert_int_equal(gshmd__frame_aead_update(&a, ct2 + off, ct2 + off, k), 0);
    }
    assert_int_equal(gshmd__frame_aead_end(&a, t1), 0);
    assert_memory_equal(ct2, payload, len);
    /* tampered, or read as another frame */
    ct[len / 2] ^= 0x10;
    assert_int_equal(gshmd__frame_aead_begin(&a, m, false, key, n, &h), 0);
    assert_int_equal(gshmd__frame_aead_update(&a, ct, ct2, len), 0);
    assert_int_equal(gshmd__frame_aead_end(&a, t2), -EBADMSG);
    ct[len / 2] ^= 0x10;
    assert_int_equal(gshmd__frame_aead_begin(&a, m, false, key, n + 1, &h), 0);
    assert_int_equal(gshmd__frame_aead_update(&a, ct, ct2, len), 0);
    assert_int_equal(gshmd__frame_aead_end(&a, t2), -EBADMSG);
  }
  /* given up midway: nothing leaks (ASan) */
  assert_int_equal(gshmd__frame_aead_begin(&a, STREAM_CHACHA20, true, key, 1,
                                           &(struct frame_hdr){0}), 0);
  gshmd__frame_aead_abort(&a);
  free(payload);
  free(ct);
  free(ct2);
}

/* Frames through a socket pair as the lanes move them (lane_io.c): each
 * mode written by a lane's thread piece by piece is read whole and
 * checked by the pool's path (gshmd__stream_unseal), and a frame sealed
 * whole (the pool's path) is read piece by piece by a lane's thread; a
 * flipped bit on the wire is refused either way.  So the two paths
 * interwork, and nodes that take either do. */
struct wr {
  int fd;
  enum stream_mode m;
  const uint8_t *key, *src, *wire; /* wire: sealed whole, written plainly */
  size_t len;
  struct frame_hdr h;
  uint8_t tag[STREAM_TAG];
  int err;
};

static void *writer(void *arg) {
  struct wr *w = arg;
  struct iovec iov[3] = {{&w->h, sizeof(w->h)}, {(void *)w->wire, w->len}, {w->tag, STREAM_TAG}};

  w->err = w->wire ? gshmd__lane_write_all(w->fd, iov, 3)
                   : gshmd__lane_write_inline(w->fd, w->m, w->key, 9, &w->h, w->src, w->tag);
  return NULL;
}

static void test_lane_io_modes(void **state) {
  const size_t len = 3 * LANE_PIECE + 77;
  uint8_t key[STREAM_KEY], tag[STREAM_TAG];
  uint8_t *src = malloc(len), *dst = malloc(len), *wire = malloc(len);
  struct frame_hdr h = gshmd__frame_data(3, 0, len), got;
  int sv[2], tested = 0;
  (void)state;

  assert_true(src && dst && wire);
  randombytes_buf(src, len);
  randombytes_buf(key, sizeof(key));
  for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
    enum stream_mode m = modes[k];
    if (!gshmd__lane_inline(m) || !usable(m))
      continue;
    tested++;
    for (int way = 0; way < 4; way++) {
      struct wr w = {.m = m, .key = key, .src = src, .len = len, .h = h};
      pthread_t t;
      bool flip = way % 2;
      if (way >= 2) { /* sealed whole (the pool's path), maybe flipped */
        assert_int_equal(gshmd__stream_seal(m, key, 9, &h, src, wire, len, w.tag), 0);
        if (!gshmd__stream_encrypts(m))
          memcpy(wire, src, len);
        wire[len - 1] ^= flip;
        w.wire = wire;
      }
      assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
      w.fd = sv[0];
      assert_int_equal(pthread_create(&t, NULL, writer, &w), 0);
      assert_int_equal(gshmd__lane_read_all(sv[1], &got, sizeof(got)), 0);
      assert_memory_equal(&got, &h, sizeof(h));
      if (way < 2) { /* read whole, checked by the pool's path */
        assert_int_equal(gshmd__lane_read_all(sv[1], dst, len), 0);
        assert_int_equal(gshmd__lane_read_all(sv[1], tag, sizeof(tag)), 0);
        dst[len - 1] ^= flip;
        assert_int_equal(gshmd__stream_unseal(m, key, 9, &h, dst, len, tag),
                         flip ? -EBADMSG : 0);
      } else { /* read by a lane's thread */
        assert_int_equal(gshmd__lane_read_inline(sv[1], m, key, 9, &h, dst),
                         flip ? -EBADMSG : 0);
      }
      pthread_join(t, NULL);
      assert_int_equal(w.err, 0);
      if (!flip)
        assert_memory_equal(dst, src, len);
      close(sv[0]);
      close(sv[1]);
    }
  }
  assert_true(tested >= 2); /* GMAC where the CPU has AES-NI, the encrypting modes */
  free(src);
  free(dst);
  free(wire);
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
      cmocka_unit_test(test_ghash_reference),
      cmocka_unit_test(test_ghash_init_leaves_no_power),
      cmocka_unit_test(test_gmac_wide_agrees),
      cmocka_unit_test(test_ghash_known_answers),
      cmocka_unit_test(test_gmac_random_vs_evp),
      cmocka_unit_test(test_frame_mac_pieces),
      cmocka_unit_test(test_frame_aead_pieces),
      cmocka_unit_test(test_lane_io_modes),
  };
  if (sodium_init() < 0)
    return 1;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
