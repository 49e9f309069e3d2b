/* SPDX-License-Identifier: Apache-2.0 */
/* A libcuda.so.1 for a whole gshmd without a GPU: cuGetProcAddress_v2
 * hands out tests/unit/fake_cuda_gpus.c's driver (two GPUs) for every
 * entry point of common/cudadrv.h's list, and a stand-in that returns
 * CUDA_SUCCESS for those the fake leaves out (the calls gshmd makes
 * without reading an output: cuInit, cuDriverGetVersion, ...).  Found
 * through LD_LIBRARY_PATH before any real driver.
 *
 * $FAKE_CUDA_FAIL_FILE names a file; when it exists at the first lookup,
 * it holds "NAME CODE" (a driver call and a CUresult): the process's
 * first call of NAME fails with CODE, and the file is removed (so the
 * next gshmd started with the same environment has no failure).
 *
 * $FAKE_CUDA_STICKY_FILE names a file read the same way but kept: while
 * it exists, every process's first call of NAME fails with CODE (a GPU
 * that stays broken; removing the file mends it for the next process).
 * A failure armed by $FAKE_CUDA_FAIL_FILE goes first: that process gets
 * no sticky one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudadrv.h"
#include "fake_cuda_gpus.h"

static CUresult stand_in(void) { return CUDA_SUCCESS; }

/* Arms the failure that the file named by $env holds ("NAME CODE");
 * removes the file when once.  Returns whether one was armed. */
static int arm_from(const char *env, int once) {
  static char name[64];
  const char *path = getenv(env);
  FILE *f = path ? fopen(path, "r") : NULL;
  int code, armed = 0;

  if (!f)
    return 0;
  if (fscanf(f, "%63s %d", name, &code) == 2) {
    fake_fail_call = name;
    fake_fail_with = (CUresult)code;
    armed = 1;
  }
  fclose(f);
  if (once)
    unlink(path);
  return armed;
}

static void arm_failure(void) {
  if (!arm_from("FAKE_CUDA_FAIL_FILE", 1))
    arm_from("FAKE_CUDA_STICKY_FILE", 0);
}

__attribute__((visibility("default"))) CUresult
cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                    CUdriverProcAddressQueryResult *status) {
  static int armed;
  const struct gshm_cudadrv *t;

  (void)flags;
  if (!armed++)
    arm_failure();
  gshm__cudadrv_load(0, &t);
  /* the optional entries first: their names are also required ones' */
#define FAKE_V(member, sym, ver)                                 \
  if (version == (ver) && !strcmp(symbol, sym)) {                \
    *pfn = (void *)t->member;                                    \
    goto out;                                                    \
  }
#define FAKE_X(name)                                             \
  if (!strcmp(symbol, #name)) {                                  \
    *pfn = t->name ? (void *)t->name : (void *)stand_in;         \
    goto out;                                                    \
  }
  GSHM_CUDADRV_MAP(FAKE_X, FAKE_V)
#undef FAKE_X
#undef FAKE_V
  *pfn = NULL;
out:
  if (status)
    *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
