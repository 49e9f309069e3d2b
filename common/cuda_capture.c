/* SPDX-License-Identifier: Apache-2.0 */
/* What libgshm's driver calls do around a stream capture (cudadrv.h):
 * this thread's capture mode relaxed around lazy set-up
 * (gshm__capture_relax: kernels/copy.c's modules, primary contexts and
 * peer access, client/torch_alloc.c's pool growth), and the one wait for
 * a context's queued work, which leaves a capture it can see alone
 * (gshm__cuda_ctx_wait: an unmap of a device mapping, client/map_cuda.c,
 * and a free of a pool block, client/torch_alloc.c). */
#include "cudadrv.h"
#include "log.h"

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

CUresult gshm__cuda_ctx_wait(const struct gshm_cudadrv *drv) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = drv->cuStreamIsCapturing(CU_STREAM_LEGACY, &st);

  if (r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    r = drv->cuCtxSynchronize();
  if (r != CUDA_SUCCESS)
    gshm__cuda_log(GSHM_LOG_DEBUG, r, "cuCtxSynchronize()", __FILE__, __LINE__);
  return r;
}
