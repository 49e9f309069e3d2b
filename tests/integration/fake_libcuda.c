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
 * next gshmd started with the same environment has no failure). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudadrv.h"
#include "fake_cuda_gpus.h"

static CUresult stand_in(void) { return CUDA_SUCCESS; }

static void arm_failure(void) {
  static char name[64];
  const char *path = getenv("FAKE_CUDA_FAIL_FILE");
  FILE *f = path ? fopen(path, "r") : NULL;
  int code;

  if (!f)
    return;
  if (fscanf(f, "%63s %d", name, &code) == 2) {
    fake_fail_call = name;
    fake_fail_with = (CUresult)code;
  }
  fclose(f);
  unlink(path);
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
