/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench seal: what tagging (and checking) one data frame costs a
 * core, per construction a link can use (daemon/cluster/seal.c), against
 * memcpy of the same bytes in the same run.  AES-GMAC runs twice: with
 * ghash.h's 512-bit GHASH (what gshmd uses where the CPU has it) and
 * whole through libcrypto (the baseline it replaced).  Random bytes,
 * medians of --reps timed runs after a warm-up, each run --bytes of
 * frames of --frame bytes (4 MiB, the default chunk, unless told). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "bench.h"
#include "ghash.h"
#include "stream.h"
#include "util.h"

struct seal_opts {
  size_t frame, bytes;
  int reps;
};

/* GB/s of one construction (mode; -1: memcpy), the median of o->reps. */
static double rate(const struct seal_opts *o, int mode, const uint8_t *key, const uint8_t *src,
                   uint8_t *dst) {
  double r[64];
  struct frame_hdr h = gshmd__frame_data(1, 0, o->frame);
  uint8_t tag[STREAM_TAG];
  size_t frames = o->bytes / o->frame ? o->bytes / o->frame : 1;
  uint64_t n = 0;

  for (int rep = -1; rep < o->reps; rep++) {
    int64_t t0 = gshm__now_ns(CLOCK_MONOTONIC);
    for (size_t f = 0; f < frames; f++) {
      if (mode < 0)
        memcpy(dst, src, o->frame);
      else if (gshmd__stream_seal((enum stream_mode)mode, key, n++, &h, src,
                                  gshmd__stream_encrypts((enum stream_mode)mode) ? dst : NULL,
                                  o->frame, tag))
        return -1;
    }
    if (rep >= 0)
      r[rep] = (double)(frames * o->frame) / (double)(gshm__now_ns(CLOCK_MONOTONIC) - t0);
  }
  return bench_median(r, o->reps);
}

/* One line of the table: label and GB/s, or "fail" where the
 * construction failed (v < 0; said on stderr, counted in *failed). */
static void show(const char *label, double v, const char *note, int *failed) {
  if (v < 0) {
    printf("  %-44s %8s\n", label, "fail");
    fprintf(stderr, "gshm-bench seal: %s failed\n", label);
    (*failed)++;
    return;
  }
  printf("  %-44s %8.2f%s\n", label, v, note);
}

int bench_seal_main(int argc, char **argv) {
  struct seal_opts o = {.frame = 4u << 20, .bytes = 1u << 30, .reps = 7};
  uint8_t key[STREAM_KEY], *src, *dst;
  uint64_t v;
  int failed = 0;
  static const struct option once[] = {{"frame", required_argument, NULL, 'f'},
                                       {"bytes", required_argument, NULL, 'b'},
                                       {"reps", required_argument, NULL, 'r'},
                                       {NULL, 0, NULL, 0}};
  unsigned char seen[256] = {0};

  for (int i = 1; i < argc; i++) {
    bench_opt_once_arg("seal", once, argv[i], seen);
    if ((!strcmp(argv[i], "--frame") || !strcmp(argv[i], "--bytes")) && i + 1 < argc) {
      if (gshm__parse_size(argv[i + 1], &v) || v > SIZE_MAX) {
        fprintf(stderr, "gshm-bench seal: bad size '%s'\n", argv[i + 1]);
        return 2;
      }
      *(!strcmp(argv[i], "--frame") ? &o.frame : &o.bytes) = (size_t)v;
      i++;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      o.reps = bench_int_arg("seal", "--reps", argv[++i], 1);
    else {
      fprintf(strcmp(argv[i], "--help") ? stderr : stdout,
              "usage: gshm-bench seal [--frame BYTES (4M)] [--bytes BYTES per run (1G)] "
              "[--reps N (7, at most 64)]\n"
              "  one core tagging data frames with each construction a link can use, beside\n"
              "  memcpy; AES-GMAC with gshmd's 512-bit GHASH and whole through libcrypto\n");
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  if (!o.frame || o.frame > UINT32_MAX || o.reps < 1 || o.reps > 64) {
    fprintf(stderr, "gshm-bench seal: --frame must be 1..4G-1 and --reps 1..64\n");
    return 2;
  }
  if (sodium_init() < 0 || !(src = malloc(o.frame)) || !(dst = malloc(o.frame)))
    return 1;
  randombytes_buf(src, o.frame);
  randombytes_buf(key, sizeof(key));
  memset(dst, 1, o.frame);
  printf("gshm-bench seal: one core, frames of %zu bytes, %zu bytes a run, medians of %d, GB/s\n",
         o.frame, o.bytes, o.reps);
  show("memcpy (the same bytes)", rate(&o, -1, key, src, dst), "", &failed);
  bool wide = gshmd__ghash_wide_usable();
  double w = -1, l;
  char note[48];
  if (wide)
    w = rate(&o, STREAM_GMAC, key, src, dst);
  gshmd__seal_wide_ghash = false;
  l = rate(&o, STREAM_GMAC, key, src, dst);
  gshmd__seal_wide_ghash = true;
  snprintf(note, sizeof(note), "  (%.2fx libcrypto's)", l > 0 ? w / l : 0);
  if (wide)
    show("AES-GMAC, 512-bit GHASH (gshmd)", w, l > 0 ? note : "", &failed);
  else
    printf("  %-44s %8s  (this CPU lacks AVX-512BW/VPCLMULQDQ)\n", "AES-GMAC, 512-bit GHASH", "-");
  show("AES-GMAC, libcrypto whole (baseline)", l, "", &failed);
  show("Poly1305 (cluster.mac = poly1305)", rate(&o, STREAM_AUTH, key, src, dst), "", &failed);
  show("AES-256-GCM (cluster.encrypt)", rate(&o, STREAM_AES256GCM, key, src, dst), "", &failed);
  show("ChaCha20-Poly1305 (encrypt, no AES-NI)", rate(&o, STREAM_CHACHA20, key, src, dst), "",
       &failed);
  free(src);
  free(dst);
  return failed ? 1 : 0; /* a construction that failed is no figure */
}
