/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU tests' assertions: plain C, since the GPU machines lack cmocka.
 * CHECK counts a failure and goes on (the test's main returns failures ?
 * 1 : 0); REQUIRE stops the process. */
#ifndef GSHM_TESTS_GPU_CHECK_H
#define GSHM_TESTS_GPU_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77

static int failures;

/* Each evaluates `cond` exactly once: conditions are often calls with side
 * effects (REQUIRE(run_role(...) == 0, ...)).  An earlier REQUIRE expanded
 * to CHECK(cond) followed by if (!(cond)), which ran such calls twice: two
 * producers and two daemons in gpu.segments' legacy step. */
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      failures++;                                                              \
    }                                                                          \
  } while (0)

#define REQUIRE(cond, ...)                                                     \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: REQUIRE(%s) failed: ", __FILE__, __LINE__,       \
              #cond);                                                          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* A CUDA driver call that must succeed; else the process exits 1.  (The
 * file that uses it includes cudadrv.h.) */
#define CU(call)                                                                \
  do {                                                                          \
    CUresult r_ = (call);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                   \
      fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)r_);  \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* Fills p[0..n-1] with xorshift64 bytes from `seed`: fresh, non-zero-ish
 * data for the GPU tests (never measure or compare on zeros). */
static inline void gpu_fill_random(unsigned char *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, n - i < 8 ? n - i : 8);
  }
}

#endif
