/* SPDX-License-Identifier: Apache-2.0 */
/* GHASH on 512-bit registers (ghash.h says why and from where). */
#include "ghash.h"

#include <pthread.h>
#include <string.h>

#include <immintrin.h>

/* Every feature the compiler may use here is checked by wide_check (GCC
 * 12 emits EVEX forms of 128-bit moves, AVX-512VL, once AVX-512BW is on). */
#define WIDE __attribute__((target("sse4.1,pclmul,avx2,avx512f,avx512bw,avx512vl,vpclmulqdq")))

static bool wide;
static pthread_once_t wide_once = PTHREAD_ONCE_INIT;

static void wide_check(void) {
  __builtin_cpu_init();
  wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("pclmul");
}

bool gshmd__ghash_wide_usable(void) {
  pthread_once(&wide_once, wide_check);
  return wide;
}

/* The shuffle that reverses the bytes of a block (GCM's bit order
 * becomes the multiplier's). */
#define BSWAP_MASK _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

WIDE static inline __m128i bswap(__m128i x) { return _mm_shuffle_epi8(x, BSWAP_MASK); }

/* The 256-bit product hi:lo of two reflected blocks, shifted left one
 * bit and reduced (Gueron and Kounavis, Figure 5 from "shift"). */
WIDE static inline __m128i reduce(__m128i lo, __m128i hi) {
  __m128i t7 = _mm_srli_epi32(lo, 31), t8 = _mm_srli_epi32(hi, 31), t9, t2, t4, t5;

  lo = _mm_slli_epi32(lo, 1);
  hi = _mm_slli_epi32(hi, 1);
  t9 = _mm_srli_si128(t7, 12);
  t8 = _mm_slli_si128(t8, 4);
  t7 = _mm_slli_si128(t7, 4);
  lo = _mm_or_si128(lo, t7);
  hi = _mm_or_si128(_mm_or_si128(hi, t8), t9);
  /* first phase */
  t7 = _mm_slli_epi32(lo, 31);
  t8 = _mm_slli_epi32(lo, 30);
  t9 = _mm_slli_epi32(lo, 25);
  t7 = _mm_xor_si128(_mm_xor_si128(t7, t8), t9);
  t8 = _mm_srli_si128(t7, 4);
  t7 = _mm_slli_si128(t7, 12);
  lo = _mm_xor_si128(lo, t7);
  /* second phase */
  t2 = _mm_srli_epi32(lo, 1);
  t4 = _mm_srli_epi32(lo, 2);
  t5 = _mm_srli_epi32(lo, 7);
  t2 = _mm_xor_si128(_mm_xor_si128(t2, t4), _mm_xor_si128(t5, t8));
  lo = _mm_xor_si128(lo, t2);
  return _mm_xor_si128(hi, lo);
}

/* a * b of two reflected blocks, reduced. */
WIDE static inline __m128i gfmul(__m128i a, __m128i b) {
  __m128i lo = _mm_clmulepi64_si128(a, b, 0x00), hi = _mm_clmulepi64_si128(a, b, 0x11);
  __m128i mid = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x10), _mm_clmulepi64_si128(a, b, 0x01));

  return reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)), _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

WIDE void gshmd__ghash_init(struct ghash_key *k, const uint8_t h[16]) {
  __m128i h1 = bswap(_mm_loadu_si128((const __m128i *)h)), p = h1;

  /* pow[i] = H^(GHASH_POWERS - i): the first block of a stride meets the highest */
  for (int i = GHASH_POWERS - 1; i >= 0; i--) {
    _mm_storeu_si128((__m128i *)k->pow[i], p);
    p = gfmul(p, h1);
  }
  _mm256_zeroall(); /* H and its powers live in k only (as at update's end) */
}

/* The four 128-bit lanes of v, added. */
WIDE static inline __m128i fold(__m512i v) {
  __m256i w = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

WIDE void gshmd__ghash_update(const struct ghash_key *k, uint8_t y[16], const uint8_t *in, size_t len) {
  const __m512i bs = _mm512_broadcast_i32x4(BSWAP_MASK);
  __m128i acc = bswap(_mm_loadu_si128((const __m128i *)y));
  const __m128i hn = _mm_loadu_si128((const __m128i *)k->pow[0]); /* H^GHASH_POWERS */

  /* the powers are read from k in the loop, not copied into locals: the
   * compiler would spill such a copy of the key to the stack */
  for (; len >= 16 * GHASH_POWERS; in += 16 * GHASH_POWERS, len -= 16 * GHASH_POWERS) {
    /* the stride's products do not wait for acc: acc * H^n joins them
     * before the one reduction (only that stays serial) */
    __m512i lo = _mm512_setzero_si512(), hi = lo, mid = lo;
    for (int i = 0; i < GHASH_POWERS / 4; i++) {
      __m512i x = _mm512_shuffle_epi8(_mm512_loadu_si512((const void *)(in + 64 * i)), bs);
      __m512i pw = _mm512_loadu_si512((const void *)k->pow[4 * i]);
      lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, pw, 0x00));
      hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, pw, 0x11));
      mid = _mm512_xor_si512(mid, _mm512_xor_si512(_mm512_clmulepi64_epi128(x, pw, 0x10),
                                                   _mm512_clmulepi64_epi128(x, pw, 0x01)));
    }
    __m128i l = _mm_xor_si128(fold(lo), _mm_clmulepi64_si128(acc, hn, 0x00));
    __m128i h = _mm_xor_si128(fold(hi), _mm_clmulepi64_si128(acc, hn, 0x11));
    __m128i m = _mm_xor_si128(_mm_xor_si128(fold(mid), _mm_clmulepi64_si128(acc, hn, 0x10)),
                              _mm_clmulepi64_si128(acc, hn, 0x01));
    acc = reduce(_mm_xor_si128(l, _mm_slli_si128(m, 8)), _mm_xor_si128(h, _mm_srli_si128(m, 8)));
  }
  /* the rest a block at a time, the last padded with zeros */
  const __m128i h1 = _mm_loadu_si128((const __m128i *)k->pow[GHASH_POWERS - 1]);
  for (; len; ) {
    uint8_t last[16] = {0};
    const uint8_t *b = in;
    size_t n = len < 16 ? len : 16;
    if (n < 16) {
      memcpy(last, in, n);
      b = last;
    }
    acc = gfmul(_mm_xor_si128(acc, bswap(_mm_loadu_si128((const __m128i *)b))), h1);
    in += n;
    len -= n;
  }
  _mm_storeu_si128((__m128i *)y, bswap(acc));
  _mm256_zeroall(); /* no power of H left in a register (zmm0-15: all this code uses) */
}
