/* SPDX-License-Identifier: Apache-2.0 */
/* The constructions that protect a frame between two gshmd (stream.h):
 * which one a link uses, and sealing and checking one frame.
 *
 * The bytes go through OpenSSL's libcrypto, whose Poly1305 uses AVX-512
 * and AES-GCM AES-NI with 128-bit PCLMULQDQ (Debian 12's OpenSSL 3.0);
 * AES-GMAC's GHASH is gshm's own on 512-bit registers where the CPU has
 * them (ghash.h: 2.3x libcrypto's).  libsodium 1.0.18, Debian 12's, is
 * slower at each: on the lent H200 hosts' Xeons
 * libcrypto authenticates 4 MiB at 11.1 GB/s (GMAC) and 5.7 GB/s
 * (Poly1305) a core where libsodium does 4.8 and 1.8-2.3, and encrypts
 * with AES-256-GCM at 3.6 GB/s where libsodium does 1.5 (probe in
 * docs/PERFORMANCE.md "Frame crypto"); a pull seals and checks every
 * byte, so that is most of what a pull's CPU goes to past the copies.
 * Every construction is a standard one, so libcrypto and libsodium give
 * the same bytes: libsodium computes them where libcrypto's are missing,
 * and unit_test_stream_seal checks each mode across the two libraries.
 * libsodium keeps the hello, the keys and the one-time Poly1305 keys. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <openssl/evp.h>

#include "ghash.h"
#include "stream.h"

bool gshmd__seal_openssl = true;
bool gshmd__seal_wide_ghash = true;

/* libcrypto's algorithms, fetched once (an implicit fetch at every
 * EVP_EncryptInit_ex would look the provider up per frame); NULL where
 * this libcrypto lacks one. */
static struct {
  EVP_CIPHER *gcm, *chacha, *ecb;
  EVP_MAC *poly;
} ossl;
static pthread_once_t ossl_once = PTHREAD_ONCE_INIT;

static void ossl_fetch(void) {
  ossl.gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
  ossl.chacha = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
  ossl.poly = EVP_MAC_fetch(NULL, "POLY1305", NULL);
  ossl.ecb = EVP_CIPHER_fetch(NULL, "AES-256-ECB", NULL);
}

bool gshmd__seal_openssl_ready(void) {
  pthread_once(&ossl_once, ossl_fetch);
  return ossl.gcm && ossl.chacha && ossl.poly;
}

enum stream_mode gshmd__stream_mode(bool encrypt, bool aes_both, bool gmac_both) {
  if (!encrypt)
    return gmac_both ? STREAM_GMAC : STREAM_AUTH;
  return aes_both ? STREAM_AES256GCM : STREAM_CHACHA20;
}

const char *gshmd__stream_mode_name(enum stream_mode m) {
  switch (m) {
  case STREAM_AUTH: return "authenticated (Poly1305)";
  case STREAM_AES256GCM: return "encrypted (AES-256-GCM)";
  case STREAM_CHACHA20: return "encrypted (ChaCha20-Poly1305)";
  case STREAM_GMAC: return "authenticated (AES-GMAC)";
  default: return "plain";
  }
}

static void nonce_of(uint64_t n, uint8_t nonce[12]) {
  memset(nonce, 0, 12);
  memcpy(nonce, &n, sizeof(n));
}

/* EVP takes int lengths: longer inputs go in steps. */
#define EVP_STEP ((size_t)1 << 30)

/* Starts an AEAD operation through libcrypto: ad (adlen bytes)
 * authenticated.  Returns the context or NULL (libcrypto failed). */
static EVP_CIPHER_CTX *ossl_begin(const EVP_CIPHER *ci, bool enc, const uint8_t *key,
                                  const uint8_t nonce[12], const uint8_t *ad, size_t adlen) {
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  int l, ok;

  if (!c)
    return NULL;
  ok = EVP_CipherInit_ex2(c, ci, key, nonce, enc, NULL);
  for (size_t o = 0, k; ok && o < adlen; o += k) {
    k = adlen - o < EVP_STEP ? adlen - o : EVP_STEP;
    ok = EVP_CipherUpdate(c, NULL, &l, ad + o, (int)k);
  }
  if (!ok) {
    EVP_CIPHER_CTX_free(c);
    return NULL;
  }
  return c;
}

/* in (len bytes) en- or decrypted into out (may be in).  0 or -ENOMEM. */
static int ossl_update(EVP_CIPHER_CTX *c, const uint8_t *in, uint8_t *out, size_t len) {
  int l, ok = 1;

  for (size_t o = 0, k; ok && o < len; o += k) {
    k = len - o < EVP_STEP ? len - o : EVP_STEP;
    ok = EVP_CipherUpdate(c, out + o, &l, in + o, (int)k);
  }
  return ok ? 0 : -ENOMEM;
}

/* The tag written (enc) or checked (!enc); frees c (libcrypto wipes its
 * key schedule).  Returns 0, -EBADMSG (the tag does not match) or
 * -ENOMEM. */
static int ossl_end(EVP_CIPHER_CTX *c, bool enc, uint8_t tag[STREAM_TAG]) {
  uint8_t fin[32];
  int l, r = -ENOMEM;

  if (enc || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, STREAM_TAG, tag)) {
    r = EVP_CipherFinal_ex(c, fin, &l) ? 0 : enc ? -ENOMEM : -EBADMSG;
    if (!r && enc && !EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, STREAM_TAG, tag))
      r = -ENOMEM;
  }
  EVP_CIPHER_CTX_free(c);
  return r;
}

/* One AEAD operation through libcrypto: ad (adlen bytes) authenticated,
 * in (len bytes) en- or decrypted into out (may be in), tag written
 * (enc) or checked (!enc).  Returns 0, -EBADMSG (the tag does not
 * match) or -ENOMEM (libcrypto failed otherwise). */
static int ossl_aead(const EVP_CIPHER *ci, bool enc, const uint8_t *key, const uint8_t nonce[12],
                     const uint8_t *ad, size_t adlen, const uint8_t *in, uint8_t *out, size_t len,
                     uint8_t tag[STREAM_TAG]) {
  EVP_CIPHER_CTX *c = ossl_begin(ci, enc, key, nonce, ad, adlen);

  if (!c)
    return -ENOMEM;
  if (ossl_update(c, in, out, len)) {
    EVP_CIPHER_CTX_free(c);
    return -ENOMEM;
  }
  return ossl_end(c, enc, tag);
}

bool gshmd__frame_aead_inline(enum stream_mode mode) {
  return gshmd__stream_encrypts(mode) && gshmd__seal_openssl && gshmd__seal_openssl_ready();
}

int gshmd__frame_aead_begin(struct frame_aead *a, enum stream_mode mode, bool enc,
                            const uint8_t *key, uint64_t n, const struct frame_hdr *hdr) {
  uint8_t nonce[12];

  nonce_of(n, nonce);
  a->enc = enc;
  a->c = ossl_begin(mode == STREAM_AES256GCM ? ossl.gcm : ossl.chacha, enc, key, nonce,
                    (const uint8_t *)hdr, sizeof(*hdr));
  return a->c ? 0 : -ENOMEM;
}

int gshmd__frame_aead_update(struct frame_aead *a, const uint8_t *in, uint8_t *out, size_t len) {
  return ossl_update(a->c, in, out, len);
}

int gshmd__frame_aead_end(struct frame_aead *a, uint8_t tag[STREAM_TAG]) {
  int r = ossl_end(a->c, a->enc, tag);
  a->c = NULL;
  return r;
}

void gshmd__frame_aead_abort(struct frame_aead *a) {
  EVP_CIPHER_CTX_free(a->c);
  a->c = NULL;
}

/* Poly1305 over hdr and in, keyed with otk.  Returns 0 or -ENOMEM. */
static int poly1305(const uint8_t otk[32], const struct frame_hdr *hdr, const uint8_t *in,
                    size_t len, uint8_t tag[STREAM_TAG]) {
  crypto_onetimeauth_state st;
  EVP_MAC_CTX *m;
  size_t tl;
  int ok;

  if (!gshmd__seal_openssl || !gshmd__seal_openssl_ready()) {
    crypto_onetimeauth_init(&st, otk);
    crypto_onetimeauth_update(&st, (const uint8_t *)hdr, sizeof(*hdr));
    crypto_onetimeauth_update(&st, in, len);
    crypto_onetimeauth_final(&st, tag);
    return 0;
  }
  if (!(m = EVP_MAC_CTX_new(ossl.poly)))
    return -ENOMEM;
  ok = EVP_MAC_init(m, otk, 32, NULL) && EVP_MAC_update(m, (const uint8_t *)hdr, sizeof(*hdr)) &&
       EVP_MAC_update(m, in, len) && EVP_MAC_final(m, tag, &tl, STREAM_TAG) && tl == STREAM_TAG;
  EVP_MAC_CTX_free(m);
  return ok ? 0 : -ENOMEM;
}

/* Sealing (enc) or checking (!enc) frame n with libsodium, the same
 * constructions as below.  Returns 0 or -EBADMSG. */
static int sodium_aead(enum stream_mode mode, bool enc, const uint8_t *key, const uint8_t nonce[12],
                       const struct frame_hdr *hdr, const uint8_t *in, uint8_t *out, size_t len,
                       uint8_t tag[STREAM_TAG]) {
  const uint8_t *h = (const uint8_t *)hdr;
  uint8_t hdr_ct[sizeof(*hdr)];

  if (mode == STREAM_GMAC) /* (checked by the caller, by sealing again) */
    return crypto_aead_aes256gcm_encrypt_detached(hdr_ct, tag, NULL, h, sizeof(*hdr), in, len,
                                                  NULL, nonce, key) ? -EBADMSG : 0;
  if (mode == STREAM_AES256GCM)
    return (enc ? crypto_aead_aes256gcm_encrypt_detached(out, tag, NULL, in, len, h, sizeof(*hdr),
                                                         NULL, nonce, key)
                : crypto_aead_aes256gcm_decrypt_detached(out, NULL, in, len, tag, h, sizeof(*hdr),
                                                         nonce, key)) ? -EBADMSG : 0;
  return (enc ? crypto_aead_chacha20poly1305_ietf_encrypt_detached(out, tag, NULL, in, len, h,
                                                                   sizeof(*hdr), NULL, nonce, key)
              : crypto_aead_chacha20poly1305_ietf_decrypt_detached(out, NULL, in, len, tag, h,
                                                                   sizeof(*hdr), nonce, key))
             ? -EBADMSG : 0;
}

bool gshmd__frame_mac_inline(enum stream_mode mode) {
  return mode == STREAM_GMAC && gshmd__seal_openssl && gshmd__seal_wide_ghash &&
         gshmd__ghash_wide_usable() && gshmd__seal_openssl_ready() && ossl.ecb;
}

/* How much of the calling thread's stack to wipe after H's powers were
 * made or used there (ghash.c's frames and spills are a few hundred
 * bytes; the callers' struct frame_mac is wiped on its own). */
#define MAC_STACK_WIPE 4096

/* AES-GMAC of frame n as ossl_aead computes it (the payload the
 * associated data, the header the plaintext), with GHASH on 512-bit
 * registers (ghash.h): AES-256 (libcrypto) makes the hash key H =
 * E_K(0), E_K(J0) for the tag and the two counter blocks that encrypt
 * the header; tag = GHASH_H(payload, ciphertext of the header, lengths)
 * + E_K(J0) (SP 800-38D, Algorithm 4, a 96-bit IV). */
int gshmd__frame_mac_begin(struct frame_mac *m, const uint8_t *key, uint64_t n,
                           const struct frame_hdr *hdr) {
  _Static_assert(sizeof(struct frame_hdr) <= 32, "the header is two counter blocks at most");
  uint8_t blk[64] = {0}, ks[64 + 16];
  const uint8_t *h = (const uint8_t *)hdr;
  EVP_CIPHER_CTX *c;
  int l, ok;

  if (!gshmd__seal_openssl_ready() || !ossl.ecb || !(c = EVP_CIPHER_CTX_new()))
    return -ENOMEM;
  for (int i = 1; i < 4; i++) { /* J0 = nonce || 1, then counters 2 and 3 */
    nonce_of(n, blk + 16 * i);
    blk[16 * i + 15] = (uint8_t)i;
  }
  ok = EVP_EncryptInit_ex2(c, ossl.ecb, key, NULL, NULL) && EVP_CIPHER_CTX_set_padding(c, 0) &&
       EVP_EncryptUpdate(c, ks, &l, blk, sizeof(blk)) && l == (int)sizeof(blk);
  EVP_CIPHER_CTX_free(c);
  if (ok) {
    for (size_t i = 0; i < sizeof(m->hdr_ct); i++)
      m->hdr_ct[i] = h[i] ^ ks[32 + i];
    memcpy(m->ekj0, ks + 16, sizeof(m->ekj0));
    gshmd__ghash_init(&m->key, ks);
    memset(m->y, 0, sizeof(m->y));
    m->len = 0;
    m->broken = false;
  }
  sodium_memzero(ks, sizeof(ks));
  if (ok)
    return 0;
  sodium_stackzero(MAC_STACK_WIPE);
  return -ENOMEM;
}

void gshmd__frame_mac_update(struct frame_mac *m, const uint8_t *p, size_t len) {
  if (m->len % 16) /* a short piece before: its padding would be hashed */
    m->broken = true;
  gshmd__ghash_update(&m->key, m->y, p, len);
  m->len += len;
}

void gshmd__frame_mac_abort(struct frame_mac *m) {
  sodium_memzero(m, sizeof(*m));
  sodium_stackzero(MAC_STACK_WIPE);
}

void gshmd__frame_mac_end(struct frame_mac *m, uint8_t tag[STREAM_TAG]) {
  uint8_t lens[16];

  for (int i = 0; i < 8; i++) { /* bit lengths, big-endian: associated data, ciphertext */
    lens[i] = (uint8_t)(m->len * 8 >> (56 - 8 * i));
    lens[8 + i] = (uint8_t)((uint64_t)sizeof(m->hdr_ct) * 8 >> (56 - 8 * i));
  }
  gshmd__ghash_update(&m->key, m->y, m->hdr_ct, sizeof(m->hdr_ct));
  gshmd__ghash_update(&m->key, m->y, lens, sizeof(lens));
  for (int i = 0; i < STREAM_TAG; i++)
    tag[i] = m->y[i] ^ m->ekj0[i];
  if (m->broken) /* a caller's bug: a tag that matches nothing, never a wrong one */
    randombytes_buf(tag, STREAM_TAG);
  gshmd__frame_mac_abort(m);
}

static int gmac_wide(const uint8_t *key, uint64_t n, const struct frame_hdr *hdr,
                     const uint8_t *in, size_t len, uint8_t tag[STREAM_TAG]) {
  struct frame_mac m;
  int r = gshmd__frame_mac_begin(&m, key, n, hdr);

  if (r)
    return r;
  gshmd__frame_mac_update(&m, in, len);
  gshmd__frame_mac_end(&m, tag);
  return 0;
}

/* Seals (enc) or checks an AEAD mode's frame. */
static int aead(enum stream_mode mode, bool enc, const uint8_t *key, const uint8_t nonce[12],
                const struct frame_hdr *hdr, const uint8_t *in, uint8_t *out, size_t len,
                uint8_t tag[STREAM_TAG]) {
  uint8_t hdr_ct[sizeof(*hdr)];

  if (!gshmd__seal_openssl || !gshmd__seal_openssl_ready())
    return sodium_aead(mode, enc, key, nonce, hdr, in, out, len, tag);
  if (mode == STREAM_GMAC)
    return ossl_aead(ossl.gcm, true, key, nonce, in, len, (const uint8_t *)hdr, hdr_ct,
                     sizeof(*hdr), tag);
  return ossl_aead(mode == STREAM_AES256GCM ? ossl.gcm : ossl.chacha, enc, key, nonce,
                   (const uint8_t *)hdr, sizeof(*hdr), in, out, len, tag);
}

int gshmd__stream_seal(enum stream_mode mode, const uint8_t *key, uint64_t n,
                       const struct frame_hdr *hdr, const uint8_t *in, uint8_t *out, size_t len,
                       uint8_t tag[STREAM_TAG]) {
  uint8_t nonce[12], otk[crypto_onetimeauth_KEYBYTES];
  int r;

  if (gshmd__frame_mac_inline(mode))
    return gmac_wide(key, n, hdr, in, len, tag);
  nonce_of(n, nonce);
  if (mode != STREAM_AUTH)
    return aead(mode, true, key, nonce, hdr, in, out, len, tag);
  /* Poly1305 with a one-time key from ChaCha20 at this frame's nonce:
   * ChaCha20-Poly1305 without the encryption. */
  crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key);
  r = poly1305(otk, hdr, in, len, tag);
  sodium_memzero(otk, sizeof(otk));
  return r;
}

int gshmd__stream_unseal(enum stream_mode mode, const uint8_t *key, uint64_t n,
                         const struct frame_hdr *hdr, uint8_t *buf, size_t len,
                         const uint8_t tag[STREAM_TAG]) {
  uint8_t nonce[12], want[STREAM_TAG];
  int r;

  if (mode == STREAM_AES256GCM || mode == STREAM_CHACHA20) {
    nonce_of(n, nonce);
    memcpy(want, tag, sizeof(want)); /* (aead takes it writable) */
    return aead(mode, false, key, nonce, hdr, buf, buf, len, want);
  }
  /* the MACs: sealed again, compared in constant time */
  if ((r = gshmd__stream_seal(mode, key, n, hdr, buf, NULL, len, want)))
    return r;
  return crypto_verify_16(want, tag) == 0 ? 0 : -EBADMSG;
}
