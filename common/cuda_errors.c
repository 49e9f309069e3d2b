/* SPDX-License-Identifier: Apache-2.0 */
/* What a CUresult means to gshm, apart from the loader (cudadrv.c): the
 * unit tests that fake the driver table link this file and so see the
 * product's mapping, not a stand-in of their own. */
#include <errno.h>

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
