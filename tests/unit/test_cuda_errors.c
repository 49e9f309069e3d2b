/* SPDX-License-Identifier: Apache-2.0 */
/* common/cuda_errors.c: which CUresults leave the process's CUDA state
 * unusable until it restarts (gshm__cuda_sticky; gshmd restarts on them,
 * docs/ARCHITECTURE.md "A sticky CUDA error restarts gshmd"), and the
 * errno each one maps to. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cudadrv.h"

/* cuda.h: "This leaves the process in an inconsistent state and any
 * further CUDA work will return the same error.  To continue using CUDA,
 * the process must be terminated and relaunched." (or, for ASSERT, "The
 * context cannot be used anymore"), and the uncorrectable ECC error. */
static const CUresult sticky[] = {
    CUDA_ERROR_ECC_UNCORRECTABLE,      CUDA_ERROR_CONTAINED,
    CUDA_ERROR_ILLEGAL_ADDRESS,        CUDA_ERROR_LAUNCH_TIMEOUT,
    CUDA_ERROR_ASSERT,                 CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUDA_ERROR_ILLEGAL_INSTRUCTION,    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_INVALID_ADDRESS_SPACE,  CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_LAUNCH_FAILED,          CUDA_ERROR_TENSOR_MEMORY_LEAK,
    CUDA_ERROR_MPS_CLIENT_TERMINATED,  CUDA_ERROR_EXTERNAL_DEVICE,
};

/* Errors of one call: the next call may work. */
static const CUresult not_sticky[] = {
    CUDA_SUCCESS,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CUDA_ERROR_TOO_MANY_PEERS,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_NVLINK_UNCORRECTABLE, /* (cuda.h does not say the process must go) */
    CUDA_ERROR_UNKNOWN,
};

static void test_sticky_errors(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(sticky) / sizeof(sticky[0]); i++) {
    if (!gshm__cuda_sticky(sticky[i]))
      fail_msg("CUresult %d is sticky, not classified so", (int)sticky[i]);
    /* what a caller of the failed call gets */
    assert_int_equal(gshm__cuda_errno(sticky[i]), -EIO);
  }
  for (size_t i = 0; i < sizeof(not_sticky) / sizeof(not_sticky[0]); i++)
    if (gshm__cuda_sticky(not_sticky[i]))
      fail_msg("CUresult %d is no sticky error, classified as one", (int)not_sticky[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sticky_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
