/* SPDX-License-Identifier: Apache-2.0 */
/* What a CUresult means to gshm, apart from the loader (cudadrv.c): its
 * errno, and whether the process's CUDA state survives it.  The unit
 * tests that fake the driver table link this file and so see the
 * product's answers, not a stand-in of their own. */
#include <errno.h>
#include <stdbool.h>

#include "cudadrv.h"

int gshm__cuda_errno(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS:
    return 0;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return -ENOMEM;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE:
    return -EINVAL;
  case CUDA_ERROR_NOT_SUPPORTED:
    return -ENOTSUP;
  case CUDA_ERROR_NOT_PERMITTED:
    return -EPERM;
  case CUDA_ERROR_INVALID_DEVICE:
  case CUDA_ERROR_NO_DEVICE:
    return -ENODEV;
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
    return -EXDEV;
  default:
    return -EIO;
  }
}

/* cuda.h's words for each: "This leaves the process in an inconsistent
 * state and any further CUDA work will return the same error.  To continue
 * using CUDA, the process must be terminated and relaunched." */
bool gshm__cuda_sticky(CUresult r) {
  switch (r) {
  case CUDA_ERROR_ECC_UNCORRECTABLE:     /* (not in those words: memory under the context) */
  case CUDA_ERROR_CONTAINED:             /* contained by the GPU's error containment */
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_LAUNCH_TIMEOUT:
  case CUDA_ERROR_ASSERT:                /* "the context cannot be used anymore" */
  case CUDA_ERROR_HARDWARE_STACK_ERROR:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_INVALID_ADDRESS_SPACE:
  case CUDA_ERROR_INVALID_PC:
  case CUDA_ERROR_LAUNCH_FAILED:
  case CUDA_ERROR_TENSOR_MEMORY_LEAK:
  case CUDA_ERROR_MPS_CLIENT_TERMINATED:
  case CUDA_ERROR_EXTERNAL_DEVICE:
    return true;
  default:
    return false;
  }
}
