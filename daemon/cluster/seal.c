/* SPDX-License-Identifier: Apache-2.0 */
/* The constructions that protect a frame between two gshmd (stream.h):
 * which one a link uses, and sealing and checking one frame.
 *
 * The bytes go through OpenSSL's libcrypto, whose Poly1305, GHASH and
 * AES-GCM use AVX-512 (VPCLMULQDQ, VAES) where the CPU has it; libsodium
 * 1.0.18, Debian 12's, has no such code: on the lent H200 hosts' Xeons
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

#include "stream.h"

bool gshmd__seal_openssl = true;

/* libcrypto's algorithms, fetched once (an implicit fetch at every
 * EVP_EncryptInit_ex would look the provider up per frame); NULL where
 * this libcrypto lacks one. */
static struct {
  EVP_CIPHER *gcm, *chacha;
  EVP_MAC *poly;
} ossl;
static pthread_once_t ossl_once = PTHREAD_ONCE_INIT;

static void ossl_fetch(void) {
  ossl.gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
  ossl.chacha = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
  ossl.poly = EVP_MAC_fetch(NULL, "POLY1305", NULL);
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

/* One AEAD operation through libcrypto: ad (adlen bytes) authenticated,
 * in (len bytes) en- or decrypted into out (may be in), tag written
 * (enc) or checked (!enc).  Returns 0, -EBADMSG (the tag does not
 * match) or -ENOMEM (libcrypto failed otherwise). */
static int ossl_aead(const EVP_CIPHER *ci, bool enc, const uint8_t *key, const uint8_t nonce[12],
                     const uint8_t *ad, size_t adlen, const uint8_t *in, uint8_t *out, size_t len,
                     uint8_t tag[STREAM_TAG]) {
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  uint8_t fin[32];
  int l, ok, r = -ENOMEM;

  if (!c)
    return -ENOMEM;
  ok = EVP_CipherInit_ex2(c, ci, key, nonce, enc, NULL);
  for (size_t o = 0, k; ok && o < adlen; o += k) {
    k = adlen - o < EVP_STEP ? adlen - o : EVP_STEP;
    ok = EVP_CipherUpdate(c, NULL, &l, ad + o, (int)k);
  }
  for (size_t o = 0, k; ok && o < len; o += k) {
    k = len - o < EVP_STEP ? len - o : EVP_STEP;
    ok = EVP_CipherUpdate(c, out + o, &l, in + o, (int)k);
  }
  if (ok && !enc)
    ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, STREAM_TAG, tag);
  if (ok) {
    r = EVP_CipherFinal_ex(c, fin, &l) ? 0 : enc ? -ENOMEM : -EBADMSG;
    if (!r && enc && !EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, STREAM_TAG, tag))
      r = -ENOMEM;
  }
  EVP_CIPHER_CTX_free(c);
  return r;
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
