/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA driver API, loaded at run time.
 *
 * gshmd and libgshm never link libcuda: the same binaries must start on nodes
 * without a driver (docs/ARCHITECTURE.md "Backends").  libcuda.so.1 is dlopen'ed once
 * and every entry point is resolved through cuGetProcAddress_v2 at
 * GSHM_CUDADRV_ABI (optional ones at their own version), so a versioned
 * symbol (cuMemAlloc_v2, cuStreamWaitValue64_v2, ...) always matches the
 * prototype in <cuda.h>; a driver without cuGetProcAddress_v2 (before
 * CUDA 12.0) is refused, never bound by name (dlsym gives a name's first
 * variant).  Only cuda.h's types are used at build time.
 *
 * Add an entry point by appending one X(...) line to GSHM_CUDADRV_MAP. */
#ifndef GSHM_COMMON_CUDADRV_H
#define GSHM_COMMON_CUDADRV_H

#include <cuda.h>
#include <stdbool.h>

#include "log.h"

#define GSHM_CUDADRV_ABI 12000

/* X(name): required, at GSHM_CUDADRV_ABI.  V(member, "name", version):
 * optional (NULL when the driver is older), the variant current at
 * version, typed as cuda.h's `member`. */
#define GSHM_CUDADRV_MAP(X, V)          \
  X(cuInit)                             \
  X(cuDriverGetVersion)                 \
  X(cuGetErrorName)                     \
  X(cuGetErrorString)                   \
  X(cuDeviceGet)                        \
  X(cuDeviceGetCount)                   \
  X(cuDeviceGetName)                    \
  X(cuDeviceGetUuid)                    \
  X(cuDeviceGetAttribute)               \
  X(cuDeviceTotalMem)                   \
  X(cuDeviceGetPCIBusId)                \
  X(cuDeviceCanAccessPeer)              \
  X(cuDeviceGetP2PAttribute)            \
  X(cuDevicePrimaryCtxRetain)           \
  X(cuDevicePrimaryCtxRelease)          \
  X(cuCtxSetCurrent)                    \
  X(cuCtxGetCurrent)                    \
  X(cuCtxGetDevice)                     \
  X(cuCtxSynchronize)                   \
  X(cuCtxEnablePeerAccess)              \
  X(cuMemGetInfo)                       \
  X(cuMemGetAllocationGranularity)      \
  X(cuMemCreate)                        \
  X(cuMemRelease)                       \
  X(cuMemExportToShareableHandle)       \
  X(cuMemImportFromShareableHandle)     \
  X(cuMemAddressReserve)                \
  X(cuMemAddressFree)                   \
  X(cuMemMap)                           \
  X(cuMemUnmap)                         \
  X(cuMemSetAccess)                     \
  X(cuMemAlloc)                         \
  X(cuMemFree)                          \
  X(cuMemAllocHost)                     \
  X(cuMemFreeHost)                      \
  X(cuMemHostRegister)                  \
  X(cuMemHostUnregister)                \
  X(cuMemcpy)                           \
  X(cuMemcpyAsync)                      \
  X(cuMemcpyPeerAsync)                  \
  X(cuMemcpyHtoD)                       \
  X(cuMemcpyDtoH)                       \
  X(cuMemcpyHtoDAsync)                  \
  X(cuMemcpyDtoHAsync)                  \
  X(cuMemsetD8)                         \
  X(cuMemsetD8Async)                    \
  X(cuPointerGetAttribute)              \
  X(cuStreamCreate)                     \
  X(cuStreamDestroy)                    \
  X(cuStreamSynchronize)                \
  X(cuStreamWaitValue64)                \
  X(cuStreamWriteValue64)               \
  X(cuEventCreate)                      \
  X(cuEventDestroy)                     \
  X(cuEventRecord)                      \
  X(cuEventSynchronize)                 \
  X(cuEventElapsedTime)                 \
  X(cuModuleLoadData)                   \
  X(cuModuleUnload)                     \
  X(cuModuleGetFunction)                \
  X(cuFuncGetAttribute)                 \
  X(cuOccupancyMaxPotentialBlockSize)   \
  X(cuLaunchKernel)                     \
  X(cuIpcGetMemHandle)                  \
  X(cuIpcOpenMemHandle)                 \
  X(cuIpcCloseMemHandle)               \
  X(cuStreamGetCtx)                     \
  X(cuStreamWaitEvent)                  \
  X(cuCtxPushCurrent)                   \
  X(cuCtxPopCurrent)                    \
  X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuMemRetainAllocationHandle)        \
  X(cuLaunchKernelEx)                   \
  X(cuDevicePrimaryCtxReset)            \
  X(cuDevicePrimaryCtxGetState)         \
  X(cuThreadExchangeStreamCaptureMode)  \
  X(cuStreamIsCapturing)                \
  V(cuCtxGetDevice_v2, "cuCtxGetDevice", 13000) \
  V(cuCtxGetId, "cuCtxGetId", 12000)    \
  V(cuStreamGetCtx_v2, "cuStreamGetCtx", 12050) \
  /* only gpu.test_broadcast's capture step: never required */ \
  V(cuStreamBeginCapture, "cuStreamBeginCapture", 12000) \
  V(cuStreamEndCapture, "cuStreamEndCapture", 12000) \
  /* (cuda.h's cuGraphInstantiate is cuGraphInstantiateWithFlags, 3      \
   * arguments; the driver's symbol of that name at 12000 is CUDA 11's 5 \
   * argument one: called with 3 it wrote its log to a stray pointer,    \
   * SIGSEGV on 2x H200, driver 580.159) */                               \
  V(cuGraphInstantiate, "cuGraphInstantiateWithFlags", 11040) \
  V(cuGraphLaunch, "cuGraphLaunch", 12000) \
  V(cuGraphDestroy, "cuGraphDestroy", 12000) \
  V(cuGraphExecDestroy, "cuGraphExecDestroy", 12000)

struct gshm_cudadrv {
#define GSHM_CUDADRV_MEMBER(name) __typeof__(&name) name;
#define GSHM_CUDADRV_VMEMBER(member, sym, ver) __typeof__(&member) member;
  GSHM_CUDADRV_MAP(GSHM_CUDADRV_MEMBER, GSHM_CUDADRV_VMEMBER)
#undef GSHM_CUDADRV_MEMBER
#undef GSHM_CUDADRV_VMEMBER
  int driver_version; /* e.g. 13000 */
};

/* Loads libcuda.so.1, resolves every entry point and calls cuInit(0)
 * (thread-safe, fork-safe).  On success *drv_out points at the
 * process-wide table, which lives until exit, and every later call of
 * the process succeeds at once.
 * Errors: -ENOSYS a driver older than CUDA 12.0, or an entry point
 * missing at GSHM_CUDADRV_ABI: for the life of the process.  -ENOENT
 * libcuda.so.1 is not installed; -ENODEV cuInit failed (no device, driver
 * not loaded yet): both tried again by the first call a second or more
 * after the last try (never more often; calls in between return the same
 * error at once), so a process that started before the driver was ready
 * gets it later.  -ECHILD: this process was forked from one whose load
 * had succeeded (cuInit ran there): CUDA cannot serve a forked child
 * (common/fork.h), for the life of the process; a child of a process
 * that had not loaded the driver loads it as any process does.  Each
 * try's reason is logged at level `prio`. */
int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out);

/* Maps a CUresult to a negative errno: OUT_OF_MEMORY -ENOMEM,
 * INVALID_VALUE/INVALID_HANDLE -EINVAL, NOT_SUPPORTED -ENOTSUP,
 * NOT_PERMITTED -EPERM, INVALID_DEVICE/NO_DEVICE -ENODEV,
 * PEER_ACCESS_UNSUPPORTED -EXDEV (no peer path), everything else -EIO. */
int gshm__cuda_errno(CUresult r);

/* Whether r leaves this process's CUDA state unusable for good: cuda.h
 * documents each such error as "the process must be terminated and
 * relaunched" (a kernel's fault, an uncorrectable ECC or contained
 * error, a terminated MPS client; ASSERT: "the context cannot be used
 * anymore"), and every later call of the process fails the same way.
 * false for CUDA_SUCCESS and for errors of one call. */
bool gshm__cuda_sticky(CUresult r);

/* cuCtxSynchronize of the current context, its failure logged at debug
 * (the caller says what it does about it): CUDA_SUCCESS, or the result
 * that the caller must not take as "done".  Not while a stream capture
 * the driver shows is under way in the context: a cuCtxSynchronize during
 * any thread's capture in the context fails
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates that capture,
 * whatever its mode and the caller's (cuThreadExchangeStreamCaptureMode
 * relaxed too; measured on an H200, driver 580, CUDA 13.0: a probe of
 * every mode, stream kind and thread).  cuStreamIsCapturing of the legacy
 * stream tells, without harm, of a capture on a blocking stream
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): that is returned then, and no
 * wait is made.  A capture on a non-blocking stream (cuStreamCreate's
 * CU_STREAM_NON_BLOCKING: PyTorch's side streams) shows nowhere outside
 * its stream, and is invalidated.  common/cuda_capture.c. */
CUresult gshm__cuda_ctx_wait(const struct gshm_cudadrv *drv);

/* Lets this thread make calls a stream capture forbids (an allocation, a
 * mapping, a module load: cuThreadExchangeStreamCaptureMode RELAXED, as
 * PyTorch's cudaMallocMaybeCapturing), for lazy set-up that a call inside
 * a capture may trigger (kernels/copy.c's first copy of a context,
 * client/torch_alloc.c's pool growth); returns the mode to give
 * gshm__capture_restore, which sets it back (nothing where the exchange
 * failed).  common/cuda_capture.c. */
CUstreamCaptureMode gshm__capture_relax(const struct gshm_cudadrv *drv);
void gshm__capture_restore(const struct gshm_cudadrv *drv, CUstreamCaptureMode mode);

/* Logs a failed driver call as "TEXT: NAME (description)" at prio. */
void gshm__cuda_log(int prio, CUresult r, const char *call_text, const char *file, int line);

/* Calls a driver function through table `drv`, and on failure logs the call
 * text with cuGetErrorName at `prio` and evaluates to a negative errno
 * (0 on success).  Feature probes pass GSHM_LOG_DEBUG. */
#define GSHM_CU(drv, prio, fn, ...)                                         \
  __extension__({                                                           \
    CUresult gshm_cu_r_ = (drv)->fn(__VA_ARGS__);                           \
    int gshm_cu_e_ = 0;                                                     \
    if (gshm_cu_r_ != CUDA_SUCCESS) {                                       \
      gshm__cuda_log((prio), gshm_cu_r_, #fn "(" #__VA_ARGS__ ")", __FILE__, \
                     __LINE__);                                             \
      gshm_cu_e_ = gshm__cuda_errno(gshm_cu_r_);                            \
    }                                                                       \
    gshm_cu_e_;                                                             \
  })

/* The two levels of UCX's UCT_CUDADRV_FUNC_LOG_ERR / _LOG_WARN: a call
 * whose failure fails the operation logs at ERR; a call that undoes work
 * (unwinding after a failure, or freeing: its failure at worst leaks)
 * logs at WARNING.  Probes whose failure is an answer, and calls whose
 * failure the caller reports in its own words, pass GSHM_LOG_DEBUG to
 * GSHM_CU: each failure is logged once. */
#define GSHM_CU_ERR(drv, fn, ...) GSHM_CU(drv, GSHM_LOG_ERR, fn, __VA_ARGS__)
#define GSHM_CU_WARN(drv, fn, ...) GSHM_CU(drv, GSHM_LOG_WARNING, fn, __VA_ARGS__)

#endif
