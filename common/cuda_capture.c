/* SPDX-License-Identifier: Apache-2.0 */
/* This thread's stream capture mode, relaxed around lazy set-up
 * (cudadrv.h gshm__capture_relax): kernels/copy.c (modules, primary
 * contexts, peer access) and client/torch_alloc.c (a pool's growth) both
 * may be called inside a capture. */
#include "cudadrv.h"

CUstreamCaptureMode gshm__capture_relax(const struct gshm_cudadrv *drv) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

  if (drv->cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
    mode = CU_STREAM_CAPTURE_MODE_RELAXED; /* nothing to restore */
  return mode;
}

void gshm__capture_restore(const struct gshm_cudadrv *drv, CUstreamCaptureMode mode) {
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    drv->cuThreadExchangeStreamCaptureMode(&mode);
}
