/* SPDX-License-Identifier: Apache-2.0 */
/* GHASH, GCM's universal hash (NIST SP 800-38D, section 6.4), on
 * 512-bit registers (VPCLMULQDQ, AVX-512BW), for the AES-GMAC frame tags
 * of seal.c.
 *
 * Why gshm computes it and not a library: a pull tags every byte on the
 * serving side and checks it on the pulling side, and GHASH was 40% of
 * gshmd's CPU in a staged 1 GiB pull on the lent 16-core H200 machine
 * (perf; docs/PERFORMANCE.md "GHASH on 512-bit registers").  Debian 12's libraries do
 * it on 128-bit registers only: OpenSSL 3.0's gcm_ghash_avx (its
 * VPCLMULQDQ code came with 3.2), libgcrypt 1.10's and nettle 3.8's
 * PCLMUL code, libsodium 1.0.18's AES-GCM.  The algorithm is the one in
 * Gueron and Kounavis, "Intel Carry-Less Multiplication Instruction and
 * its Usage for Computing the GCM Mode" (Intel, rev. 2.02, 2014):
 * byte-reflected blocks, the 256-bit product shifted left one bit, then
 * reduced modulo x^128 + x^7 + x^2 + x + 1 in two phases (their
 * Figure 5), with the aggregated reduction of their Algorithm 5 over
 * GHASH_POWERS blocks at a time (Y' = Y H^32 + X1 H^32 + X2 H^31 + ... +
 * X32 H: the running hash's product apart, so that only the reduction
 * waits for it; 32 blocks a stride measured 19.9 GB/s on a core of the
 * 2-core AMD EPYC VM against 18.4 for 32 with Y in the first block and
 * 13.0 for 16).
 * unit_test_stream_seal checks every tag it makes against OpenSSL's and
 * libsodium's GMAC of the same frame (lengths 0 to 4 KiB + 1 and 1 MiB,
 * every alignment of the input; 400 random lengths to 256 KiB at random
 * offsets against EVP and libsodium called by the test itself), a
 * bit-by-bit GHASH from the standard's definition, and the GCM
 * specification's published GHASH values (its test cases 2 and 14).  `gshm-bench seal` times it against libcrypto. */
#ifndef GSHMD_CLUSTER_GHASH_H
#define GSHMD_CLUSTER_GHASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GHASH_POWERS 32 /* blocks folded per reduction */

/* The hash key's powers H^GHASH_POWERS .. H^1, byte-reflected (what the
 * multiplier takes; read unaligned, so any storage will do).  Secret:
 * wiped by its owner (sodium_memzero), and the stack of the thread that
 * used it (sodium_stackzero: the compiler may spill key material). */
struct ghash_key {
  uint8_t pow[GHASH_POWERS][16];
};

/* Whether this CPU (and the kernel's saved register state) runs the
 * 512-bit code: AVX-512F, -BW and -VL, VPCLMULQDQ, AVX2, SSE4.1 and
 * PCLMULQDQ.  Checked once, thread-safe. */
bool gshmd__ghash_wide_usable(void);

/* Expands the hash key h (16 bytes: AES_K(0^128)) into k, leaving no
 * power of it in a vector register.  Only where
 * gshmd__ghash_wide_usable(). */
void gshmd__ghash_init(struct ghash_key *k, const uint8_t h[16]);

/* Y = GHASH over the len bytes of in, continued from y (16 bytes: the
 * hash so far, zeros to start), in's last partial block padded with
 * zeros (as GCM pads its associated data and its ciphertext, each on
 * its own).  in needs no alignment; len any.  Only where
 * gshmd__ghash_wide_usable(). */
void gshmd__ghash_update(const struct ghash_key *k, uint8_t y[16], const uint8_t *in, size_t len);

#endif
