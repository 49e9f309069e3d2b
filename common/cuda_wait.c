/* SPDX-License-Identifier: Apache-2.0 */
/* The one way libgshm waits for a context's queued work (cudadrv.h
 * gshm__cuda_ctx_wait): an unmap of a device mapping (client/map_cuda.c)
 * and a free of a pool block (client/torch_alloc.c) both make it, and
 * both must leave a stream capture they can see alone. */
#include "cudadrv.h"
#include "log.h"

CUresult gshm__cuda_ctx_wait(const struct gshm_cudadrv *drv) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = drv->cuStreamIsCapturing(CU_STREAM_LEGACY, &st);

  if (r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    r = drv->cuCtxSynchronize();
  if (r != CUDA_SUCCESS)
    gshm__cuda_log(GSHM_LOG_DEBUG, r, "cuCtxSynchronize()", __FILE__, __LINE__);
  return r;
}
