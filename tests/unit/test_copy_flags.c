/* SPDX-License-Identifier: Apache-2.0 */
/* kernels/copy.c's flags without a GPU: gshm_signal, gshm_copy_signal and
 * gshm_wait against a fake driver that knows which addresses are device
 * memory and page-locked host memory (cuPointerGetAttribute), refuses
 * stream memory operations on anything else as the real one does, and
 * records each kernel launch.  A flag in pageable memory used to reach
 * the GPU anyway: cuStreamWriteValue64 refused it, and the fallback
 * signal kernel (or the fused copy-then-signal kernel) was launched to
 * store to it, which on a GPU is an illegal address that poisons the
 * caller's context.  tests/gpu/test_copy.c checks the same on GPUs.  A
 * fork while another thread makes a context's entry leaves the child
 * calls that work. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "copy_internal.h"
#include "cudadrv.h"
#include "gshm.h"
#include "log.h"

/* The embedded kernels: a stand-in, the fake loader reads nothing. */
const unsigned long long gshm__copy_fatbin[1] = {0};

/* ---- memory the fake GPU knows ---- */

static uint64_t device_mem[512]; /* "device memory of GPU 0" */
static uint64_t pinned_mem[8];   /* "page-locked host memory" */
static uint64_t pageable_mem[8]; /* ordinary memory: the driver does not know it */

static int in(const void *p, const void *base, size_t len) {
  return (const char *)p >= (const char *)base && (const char *)p < (const char *)base + len;
}

/* ---- the fake driver ---- */

static int launches, stream_writes, stream_waits, copies;
static int fail_get_device; /* the next N cuCtxGetDevice calls fail */
static CUcontext ctx0 = (CUcontext)0x6001; /* the thread's current context */
/* The next cuCtxGetDevice (copy.c calls it under its table's lock, making
 * a context's entry) posts get_device_entered and stalls this long. */
static unsigned get_device_stall_us;
static sem_t get_device_entered;

/* Device memory gshm_map did not map, as the driver describes it:
 * device_mem[128..143] a memory pool's (cudaMallocAsync) on GPU 1 that GPU
 * 0 has no access to, [160..191] cuMemAlloc memory of GPU 1 (no access
 * from GPU 0 until peer access is enabled), [192..207] a cuMem range
 * (cuMemMap) of GPU 0 with no access for GPU 0, [208..223] one of GPU 1
 * with no access for GPU 0, [224..255] one of GPU 0 that GPU 0 may only
 * read, [144..159] cuMemAlloc memory of GPU 0 made in another context
 * (which this one cannot use); the rest of [0..255] GPU 0's cuMemAlloc
 * memory. */
#define FOREIGN(lo, n) in(p, &device_mem[lo], (n) * sizeof(uint64_t))
static int access_queries, class_queries, handle_retains, handle_releases, peer_enabled;
static CUresult f_pointer_attr(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  const void *p = (const void *)(uintptr_t)ptr;
  if (!in(p, device_mem, sizeof(device_mem)) && !in(p, pinned_mem, sizeof(pinned_mem)))
    return CUDA_ERROR_INVALID_VALUE; /* pageable memory: unknown to the driver */
  if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *(CUmemorytype *)data =
        in(p, device_mem, sizeof(device_mem)) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  } else if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
    *(int *)data = in(p, &device_mem[448], 48 * sizeof(uint64_t)) || FOREIGN(128, 16) ||
                           FOREIGN(160, 32) || FOREIGN(208, 16)
                       ? 1
                       : 0;
  } else if (attr == CU_POINTER_ATTRIBUTE_ACCESS_FLAGS) {
    __atomic_add_fetch(&access_queries, 1, __ATOMIC_RELAXED); /* (two threads copy) */
    *(unsigned *)data = FOREIGN(128, 32) || (FOREIGN(160, 32) && !peer_enabled) ||
                                FOREIGN(192, 32)
                            ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE
                        : FOREIGN(224, 32) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                           : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
  } else if (attr == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) {
    class_queries++;
    *(int *)data = !FOREIGN(128, 16) && !FOREIGN(192, 64);
  } else if (attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
    class_queries++;
    *(CUmemoryPool *)data = FOREIGN(128, 16) ? (CUmemoryPool)0x5001 : NULL;
  }
  return CUDA_SUCCESS;
}
static CUresult f_retain_handle(CUmemGenericAllocationHandle *h, void *addr) {
  const void *p = addr;
  class_queries++;
  if (!FOREIGN(192, 64))
    return CUDA_ERROR_INVALID_VALUE; /* not cuMemMap's */
  handle_retains++;
  *h = 0x4001;
  return CUDA_SUCCESS;
}
static CUresult f_mem_release(CUmemGenericAllocationHandle h) {
  (void)h;
  handle_releases++;
  return CUDA_SUCCESS;
}
/* cuStreamWriteValue64 / WaitValue64: device or registered host memory only. */
static CUresult f_write_value(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags) {
  const void *p = (const void *)(uintptr_t)addr;
  (void)s, (void)flags;
  if (!in(p, device_mem, sizeof(device_mem)) && !in(p, pinned_mem, sizeof(pinned_mem)))
    return CUDA_ERROR_INVALID_VALUE;
  stream_writes++;
  *(uint64_t *)(uintptr_t)addr = v;
  return CUDA_SUCCESS;
}
static CUresult f_wait_value(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags) {
  const void *p = (const void *)(uintptr_t)addr;
  (void)s, (void)v, (void)flags;
  if (!in(p, device_mem, sizeof(device_mem)) && !in(p, pinned_mem, sizeof(pinned_mem)))
    return CUDA_ERROR_INVALID_VALUE;
  stream_waits++;
  return CUDA_SUCCESS;
}
static CUresult f_get_current(CUcontext *c) {
  *c = ctx0;
  return CUDA_SUCCESS;
}
static CUresult f_push(CUcontext c) {
  (void)c;
  return CUDA_SUCCESS;
}
static CUresult f_pop(CUcontext *c) {
  *c = ctx0;
  return CUDA_SUCCESS;
}
static CUresult f_get_device(CUdevice *d) {
  if (get_device_stall_us) {
    unsigned us = get_device_stall_us;
    get_device_stall_us = 0;
    sem_post(&get_device_entered);
    usleep(us);
  }
  if (fail_get_device) {
    fail_get_device--;
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *d = 0;
  return CUDA_SUCCESS;
}
static CUresult f_attr(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 0;
  return CUDA_SUCCESS;
}
/* This thread's stream capture mode (cuThreadExchangeStreamCaptureMode
 * swaps it; GLOBAL is a thread's default), and how many module calls were
 * made in another mode than RELAXED: inside a capture those would be
 * refused, and the capture ended (CUDA's "prohibited operations"). */
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static int module_calls_unrelaxed, module_loads;
static CUresult f_module_load(CUmodule *m, const void *image) {
  (void)image;
  __atomic_add_fetch(&module_loads, 1, __ATOMIC_SEQ_CST);
  module_calls_unrelaxed += thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  *m = (CUmodule)0x7001;
  return CUDA_SUCCESS;
}
static int module_unloads;
static CUresult f_module_unload(CUmodule m) {
  (void)m;
  module_unloads++;
  module_calls_unrelaxed += thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  return CUDA_SUCCESS;
}
static int fail_get_function; /* the next cuModuleGetFunction fails */
static CUresult f_get_function(CUfunction *f, CUmodule m, const char *name) {
  (void)m, (void)name;
  module_calls_unrelaxed += thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  if (fail_get_function) {
    fail_get_function = 0;
    return CUDA_ERROR_NOT_FOUND;
  }
  *f = (CUfunction)0x8001;
  return CUDA_SUCCESS;
}
static CUresult f_mem_alloc(CUdeviceptr *p, size_t n) {
  (void)n;
  *p = (CUdeviceptr)(uintptr_t)&device_mem[500];
  return CUDA_SUCCESS;
}
static CUresult f_launch_ex(const CUlaunchConfig *cfg, CUfunction f, void **args, void **extra) {
  (void)cfg, (void)f, (void)args, (void)extra;
  __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shmem, CUstream s, void **args,
                         void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s;
  (void)args, (void)extra;
  launches++;
  return CUDA_SUCCESS;
}
/* gshm_map's mappings (client/map_cuda.c's list, faked): device_mem
 * [256..383] one GPU 0 has no access to, [384..447] one it may only read,
 * [448..495] a segment of GPU 1 mapped read-write for GPU 0; the rest is
 * not a gshm mapping (as cuMemAlloc's memory). */
int gshm__map_access(uintptr_t addr, size_t bytes, int dev, unsigned long long *flags_out) {
  const void *p = (const void *)addr;
  (void)dev;
  if ((const char *)p < (const char *)&device_mem[448] &&
      (const char *)p + bytes > (const char *)&device_mem[448]) {
    *flags_out = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return 2; /* starts before the mapping and runs into it */
  }
  if (in(p, &device_mem[256], 128 * sizeof(uint64_t)))
    *flags_out = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  else if (in(p, &device_mem[384], 64 * sizeof(uint64_t)))
    *flags_out = CU_MEM_ACCESS_FLAGS_PROT_READ;
  else if (in(p, &device_mem[448], 48 * sizeof(uint64_t)))
    *flags_out = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  else
    return 0;
  if (in(p, &device_mem[448], 48 * sizeof(uint64_t)) &&
      (const char *)p + bytes > (const char *)&device_mem[496]) {
    *flags_out = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return 2; /* runs past the mapping's end */
  }
  return 1;
}
/* Peer access: counted (a retain of GPU 1's primary context makes one,
 * hundreds of MiB, on a real GPU). */
static int peer_calls;
static CUresult f_device_get(CUdevice *d, int ordinal) {
  peer_calls++;
  *d = ordinal;
  return CUDA_SUCCESS;
}
/* Primary contexts: a retain count per GPU, and whether a reset
 * (cuDevicePrimaryCtxReset) left it inactive; as the driver API documents,
 * a reset keeps the count, and the handle is dead until the next retain. */
static int primary_count[8], primary_reset[8];
/* new_handles: a retain that makes a reset context again gives a new
 * handle (primary_gen[d] counts them; the older handles are dead), as a
 * driver may; else the handle stays 0x6100 + d. */
static int new_handles, primary_gen[8];
static CUcontext primary_handle(CUdevice d) {
  return (CUcontext)(uintptr_t)(0x6100 + d + 0x1000 * primary_gen[d]);
}
static int primary_calls_unrelaxed; /* retains and releases made in another mode than RELAXED */
static CUresult f_primary_retain(CUcontext *c, CUdevice d) {
  peer_calls++;
  primary_calls_unrelaxed += thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  primary_count[d]++;
  if (primary_reset[d] && new_handles)
    primary_gen[d]++;
  primary_reset[d] = 0;
  *c = primary_handle(d);
  return CUDA_SUCCESS;
}
static CUresult f_primary_release(CUdevice d) {
  primary_calls_unrelaxed += thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  if (!primary_count[d])
    return CUDA_ERROR_INVALID_CONTEXT;
  primary_count[d]--;
  return CUDA_SUCCESS;
}
static CUresult f_primary_state(CUdevice d, unsigned *flags, int *active) {
  *flags = 0;
  *active = primary_count[d] > 0 && !primary_reset[d];
  return CUDA_SUCCESS;
}
/* Context ids: a primary context's handle is destroyed while reset; every
 * other context keeps one id, but for remade_ctx, whose id grows by
 * remade_by (a reset: the handle stays, the context is a new one).  The
 * next call for remade_ctx after id_stall_us is set answers, then posts
 * id_entered and stalls that long (the answer already read). */
static CUcontext remade_ctx;
static unsigned long long remade_by;
static unsigned id_stall_us;
static sem_t id_entered;
static CUresult f_ctx_id(CUcontext c, unsigned long long *id) {
  uintptr_t v = (uintptr_t)c;
  for (int d = 0; d < 8; d++)
    for (int g = 0; g <= primary_gen[d]; g++)
      if (v == 0x6100 + (uintptr_t)d + 0x1000 * (uintptr_t)g &&
          (primary_reset[d] || g != primary_gen[d]))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED; /* reset, or an older handle */
  *id = v + (c == remade_ctx ? __atomic_load_n(&remade_by, __ATOMIC_SEQ_CST) : 0);
  if (c == remade_ctx && id_stall_us) {
    unsigned us = id_stall_us;
    id_stall_us = 0;
    sem_post(&id_entered);
    usleep(us);
  }
  return CUDA_SUCCESS;
}
static CUresult f_can_access_peer(int *can, CUdevice a, CUdevice b) {
  (void)a, (void)b;
  peer_calls++;
  *can = 1;
  return CUDA_SUCCESS;
}
static CUresult f_enable_peer(CUcontext c, unsigned flags) {
  (void)c, (void)flags;
  peer_calls++;
  peer_enabled = 1; /* GPU 1's cuMemAlloc memory is mapped for GPU 0 from now on */
  return CUDA_SUCCESS;
}
static CUresult f_capture_mode(CUstreamCaptureMode *mode) {
  CUstreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)dst, (void)src, (void)n, (void)s;
  copies++;
  return CUDA_SUCCESS;
}

static struct gshm_cudadrv fake_drv;

/* The table, filled once (as the real loader's: threads load it at once). */
static void fake_drv_fill(void) {
  fake_drv.cuPointerGetAttribute = f_pointer_attr;
  fake_drv.cuStreamWriteValue64 = f_write_value;
  fake_drv.cuStreamWaitValue64 = f_wait_value;
  fake_drv.cuCtxGetCurrent = f_get_current;
  fake_drv.cuCtxPushCurrent = f_push;
  fake_drv.cuCtxPopCurrent = f_pop;
  fake_drv.cuCtxGetDevice = f_get_device;
  fake_drv.cuDeviceGetAttribute = f_attr;
  fake_drv.cuModuleLoadData = f_module_load;
  fake_drv.cuModuleUnload = f_module_unload;
  fake_drv.cuModuleGetFunction = f_get_function;
  fake_drv.cuMemAlloc = f_mem_alloc;
  fake_drv.cuLaunchKernelEx = f_launch_ex;
  fake_drv.cuLaunchKernel = f_launch;
  fake_drv.cuMemcpyAsync = f_memcpy_async;
  fake_drv.cuThreadExchangeStreamCaptureMode = f_capture_mode;
  fake_drv.cuDeviceGet = f_device_get;
  fake_drv.cuDevicePrimaryCtxRetain = f_primary_retain;
  fake_drv.cuDevicePrimaryCtxRelease = f_primary_release;
  fake_drv.cuDevicePrimaryCtxGetState = f_primary_state;
  fake_drv.cuCtxGetId = f_ctx_id;
  fake_drv.cuDeviceCanAccessPeer = f_can_access_peer;
  fake_drv.cuCtxEnablePeerAccess = f_enable_peer;
  fake_drv.cuMemRetainAllocationHandle = f_retain_handle;
  fake_drv.cuMemRelease = f_mem_release;
}

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  (void)prio;
  pthread_once(&once, fake_drv_fill);
  *drv_out = &fake_drv;
  return 0;
}

static void reset_counts(void) { launches = stream_writes = stream_waits = copies = 0; }

/* A context's first SM copy loads libgshm's module: cuModuleLoadData, and
 * cuModuleGetFunction for each kernel, which is where a driver that loads
 * lazily (CUDA_MODULE_LOADING=LAZY, Linux's default from CUDA 12.2) loads
 * the kernels.  The first copy may come inside a stream capture: every
 * one of those calls is made with the thread's capture mode relaxed, and
 * the mode is given back after.  Before: the lookups ran in the caller's
 * mode (only cuModuleLoadData was relaxed). */
static void test_first_copy_loads_the_module_relaxed(void **state) {
  CUcontext saved = ctx0;
  (void)state;

  ctx0 = (CUcontext)0x6077; /* a context no copy has used: its module is loaded now */
  reset_counts();
  module_calls_unrelaxed = 0;
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(launches, 1);
  assert_int_equal(module_calls_unrelaxed, 0);
  assert_int_equal(thread_mode, CU_STREAM_CAPTURE_MODE_GLOBAL); /* given back */
  ctx0 = saved;
}

/* A kernel the module lacks (cuModuleGetFunction fails): the module is
 * unloaded again, and that unload, as unsafe inside a capture as the
 * load, is made with the capture mode still relaxed.  It used to be made
 * after the mode was given back. */
static void test_failed_lookup_unloads_the_module_relaxed(void **state) {
  CUcontext saved = ctx0;
  (void)state;

  ctx0 = (CUcontext)0x6078; /* a context no copy has used */
  reset_counts();
  module_calls_unrelaxed = module_unloads = 0;
  fail_get_function = 1;
  assert_int_not_equal(gshm_copy(&device_mem[8], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(launches, 0);
  assert_int_equal(module_unloads, 1);
  assert_int_equal(module_calls_unrelaxed, 0);
  assert_int_equal(thread_mode, CU_STREAM_CAPTURE_MODE_GLOBAL); /* given back */
  ctx0 = saved;
}

/* ---- tests ---- */

/* Flags the GPU can reach are signalled with cuStreamWriteValue64 and
 * waited on with cuStreamWaitValue64: no kernel. */
static void test_reachable_flags(void **state) {
  (void)state;
  reset_counts();
  assert_int_equal(gshm_signal(&device_mem[0], 7, NULL), 0);
  assert_int_equal(device_mem[0], 7);
  assert_int_equal(gshm_signal(&pinned_mem[0], 9, NULL), 0);
  assert_int_equal(pinned_mem[0], 9);
  assert_int_equal(gshm_wait(&device_mem[0], 7, NULL), 0);
  assert_int_equal(stream_writes, 2);
  assert_int_equal(stream_waits, 1);
  assert_int_equal(launches, 0);
}

/* gshm_copy_signal of 0 bytes is the signal alone (gshm.h), and a caller
 * that only signals has no buffers to name: NULL dst or src are taken
 * then (they were -EINVAL), and only then. */
static void test_signal_alone_takes_no_buffers(void **state) {
  (void)state;
  reset_counts();
  assert_int_equal(gshm_copy_signal(NULL, NULL, 0, GSHM_COPY_SM, &device_mem[0], 11, NULL), 0);
  assert_int_equal(device_mem[0], 11);
  assert_int_equal(gshm_copy_signal(NULL, &device_mem[100], 0, GSHM_COPY_AUTO, &pinned_mem[0], 12,
                                    NULL),
                   0);
  assert_int_equal(pinned_mem[0], 12);
  assert_int_equal(stream_writes, 2);
  assert_int_equal(copies, 0);
  assert_int_equal(launches, 0);
  /* Still refused: bytes to copy from or to nothing, an unknown method,
   * no flag, a flag in pageable memory. */
  assert_int_equal(gshm_copy_signal(NULL, &device_mem[100], 8, GSHM_COPY_AUTO, &device_mem[0], 13,
                                    NULL),
                   -EINVAL);
  assert_int_equal(gshm_copy_signal(NULL, NULL, 0, (gshm_copy_method_t)99, &device_mem[0], 13, NULL),
                   -EINVAL);
  assert_int_equal(gshm_copy_signal(NULL, NULL, 0, GSHM_COPY_AUTO, NULL, 13, NULL), -EINVAL);
  assert_int_equal(gshm_copy_signal(NULL, NULL, 0, GSHM_COPY_AUTO, &pageable_mem[0], 13, NULL),
                   -EINVAL);
  assert_int_equal(device_mem[0], 11);
  assert_int_equal(stream_writes, 2);
}

/* A flag in pageable memory is -EINVAL, and nothing reaches the GPU: no
 * kernel stores to it, no copy is queued before the refusal. */
static void test_pageable_flag_never_reaches_the_gpu(void **state) {
  (void)state;
  reset_counts();
  assert_int_equal(gshm_signal(&pageable_mem[0], 1, NULL), -EINVAL);
  assert_int_equal(launches, 0);
  assert_int_equal(gshm_copy_signal(&device_mem[8], &device_mem[100], 4096, GSHM_COPY_SM,
                                    &pageable_mem[0], 1, NULL),
                   -EINVAL);
  assert_int_equal(launches, 0);
  assert_int_equal(gshm_copy_signal(&device_mem[8], &device_mem[100], 4096, GSHM_COPY_ENGINE,
                                    &pageable_mem[0], 1, NULL),
                   -EINVAL);
  assert_int_equal(copies, 0);
  assert_int_equal(launches, 0);
  assert_int_equal(gshm_wait(&pageable_mem[0], 1, NULL), -EINVAL);
  assert_int_equal(stream_writes + stream_waits, 0);
  assert_int_equal(pageable_mem[0], 0);
}

/* A cuMem mapping the running GPU has no access to (gshm_map's devices
 * left it out; peer access does not cover such mappings) is refused
 * before anything is queued: a kernel or copy engine touching it faults
 * on the GPU.  A read-only mapping may be read, not written.  Both used to
 * be queued. */
static void test_cumem_mapping_without_access_is_refused(void **state) {
  (void)state;
  reset_counts();
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[300], 64, GSHM_COPY_SM, NULL), -EXDEV);
  assert_int_equal(gshm_copy(&device_mem[300], &device_mem[8], 64, GSHM_COPY_ENGINE, NULL),
                   -EXDEV);
  assert_int_equal(gshm_copy(&device_mem[400], &device_mem[8], 64, GSHM_COPY_AUTO, NULL),
                   -EACCES);
  assert_int_equal(gshm_signal(&device_mem[300], 1, NULL), -EXDEV);
  assert_int_equal(gshm_signal(&device_mem[400], 1, NULL), -EACCES);
  assert_int_equal(gshm_wait(&device_mem[300], 1, NULL), -EXDEV);
  assert_int_equal(launches + copies + stream_writes + stream_waits, 0);
  /* what the mapping allows goes */
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[400], 64, GSHM_COPY_ENGINE, NULL), 0);
  assert_int_equal(gshm_wait(&device_mem[400], 0, NULL), 0);
  assert_int_equal(copies, 1);
  assert_int_equal(stream_waits, 1);
}

/* A segment of GPU 1 that gshm_map mapped for GPU 0: GPU 0's copies and
 * flags on it need no peer access (the mapping's own access covers them),
 * so none is enabled and GPU 1's primary context is neither retained nor
 * made (it was, before each SM copy, copy-engine copy and signal). */
static void test_mapping_with_access_enables_no_peer(void **state) {
  (void)state;
  reset_counts();
  peer_calls = 0;
  assert_int_equal(gshm_copy(&device_mem[448], &device_mem[8], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[456], 64, GSHM_COPY_ENGINE, NULL), 0);
  assert_int_equal(gshm_copy(&device_mem[460], &device_mem[8], 64, GSHM_COPY_AUTO, NULL), 0);
  assert_int_equal(gshm_signal(&device_mem[470], 5, NULL), 0);
  assert_int_equal(gshm_copy_signal(&device_mem[8], &device_mem[472], 64, GSHM_COPY_SM,
                                    &device_mem[480], 6, NULL),
                   0);
  assert_int_equal(peer_calls, 0);
  assert_int_equal(launches + copies + stream_writes, 5);
  /* a range that starts in that mapping and runs past its end: -ERANGE,
   * nothing queued (it used to say "no access", -EXDEV) */
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[490], 64, GSHM_COPY_SM, NULL), -ERANGE);
  assert_int_equal(launches + copies + stream_writes, 5);
}

/* The stderr lines f() logs (GSHM_LOG_ERR and up), into buf. */
static void logged_by(int (*f)(void), int *ret, char *buf, size_t len) {
  FILE *tmp = tmpfile();
  int saved = dup(STDERR_FILENO);
  size_t n;

  assert_non_null(tmp);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
  gshm__log_setup("t", GSHM_LOG_ERR, 0);
  *ret = f();
  gshm__log_setup("t", -1, 0);
  assert_true(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  rewind(tmp);
  n = fread(buf, 1, len - 1, tmp);
  buf[n] = '\0';
  fclose(tmp);
}
static int copy_into_mapping_from_below(void) {
  /* [440..455]: 8 words before the mapping at [448], 8 in it */
  return gshm_copy(&device_mem[8], &device_mem[440], 128, GSHM_COPY_SM, NULL);
}

/* A range that starts before a gshm mapping and runs into it is -ERANGE,
 * as one that runs past its end, nothing queued; what is logged says
 * either (it said "runs past the end of the segment" for both). */
static void test_range_into_a_mapping_from_below(void **state) {
  char log[1024];
  int ret;
  (void)state;

  reset_counts();
  logged_by(copy_into_mapping_from_below, &ret, log, sizeof(log));
  assert_int_equal(ret, -ERANGE);
  assert_int_equal(launches + copies, 0);
  assert_non_null(strstr(log, "starts before the segment"));
}

/* cuMem memory gshm_map did not map (a cuMemMap range, a memory pool's)
 * that the running GPU has no access to, or may only read, is refused as
 * gshm's own mappings are (-EXDEV, -EACCES to write a read-only one),
 * before anything is queued: the driver's access flags say so.  Such
 * copies used to be queued, and faulted on the GPU (an illegal address
 * that ends the context).  cuMemAlloc memory of another GPU, which reads
 * "no access" until peer access is enabled, still goes (peer access is
 * enabled and the flags read again).  The cost: one access-flags query per
 * device operand gshm_map did not map where the flags allow the use, none
 * for gshm's mappings. */
static void test_foreign_cumem_without_access_is_refused(void **state) {
  (void)state;
  reset_counts();
  access_queries = class_queries = handle_retains = handle_releases = 0;
  /* on GPU 0 itself */
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[200], 64, GSHM_COPY_SM, NULL), -EXDEV);
  assert_int_equal(gshm_copy(&device_mem[200], &device_mem[8], 64, GSHM_COPY_ENGINE, NULL),
                   -EXDEV);
  assert_int_equal(gshm_copy(&device_mem[230], &device_mem[8], 64, GSHM_COPY_ENGINE, NULL),
                   -EACCES);
  assert_int_equal(gshm_copy(&device_mem[230], &device_mem[8], 64, GSHM_COPY_SM, NULL), -EACCES);
  assert_int_equal(gshm_signal(&device_mem[232], 1, NULL), -EACCES);
  assert_int_equal(gshm_signal(&device_mem[200], 1, NULL), -EXDEV);
  assert_int_equal(gshm_wait(&device_mem[200], 1, NULL), -EXDEV);
  /* on GPU 1: still no access with peer access enabled, and a cuMem range */
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[130], 64, GSHM_COPY_AUTO, NULL), -EXDEV);
  assert_int_equal(gshm_copy(&device_mem[210], &device_mem[8], 64, GSHM_COPY_ENGINE, NULL),
                   -EXDEV);
  assert_int_equal(launches + copies + stream_writes + stream_waits, 0);
  assert_true(handle_retains > 0);
  assert_int_equal(handle_retains, handle_releases); /* each handle looked at is given back */
  /* what the access allows goes: a read-only range read, a flag in it waited on */
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[230], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(gshm_wait(&device_mem[232], 0, NULL), 0);
  assert_int_equal(launches + stream_waits, 2);
  /* GPU 0's cuMemAlloc memory of another context: "no access", yet not a
   * cuMem range: the driver's rules (its copy engine copies it) */
  reset_counts();
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[150], 64, GSHM_COPY_ENGINE, NULL), 0);
  assert_int_equal(copies, 1);
  /* the cost on the common path: GPU 0's cuMemAlloc memory both sides is
   * one query per side; a gshm mapping (with access) none */
  access_queries = class_queries = 0;
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[16], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(access_queries, 2);
  assert_int_equal(gshm_copy(&device_mem[448], &device_mem[456], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(access_queries, 2);
  assert_int_equal(class_queries, 0);
}

/* cuMemAlloc memory of another GPU reads "no access" until peer access is
 * enabled (as legacy IPC imports opened with LAZY_ENABLE_PEER_ACCESS):
 * not refused; peer access is enabled and the flags read again, with no
 * classification.  (Must run before another test enables peer access.) */
static void test_peer_memory_without_peer_access_yet_goes(void **state) {
  (void)state;
  reset_counts();
  access_queries = class_queries = 0;
  assert_int_equal(peer_enabled, 0);
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[170], 64, GSHM_COPY_ENGINE, NULL), 0);
  assert_int_equal(peer_enabled, 1);
  assert_int_equal(access_queries, 3); /* src: no, then (peer access enabled) yes; dst: yes */
  assert_int_equal(class_queries, 0);
  assert_int_equal(gshm_copy(&device_mem[170], &device_mem[8], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(gshm_copy_signal(&device_mem[8], &device_mem[16], 64, GSHM_COPY_SM,
                                    &device_mem[180], 3, NULL),
                   0);
  assert_int_equal(copies + launches, 3);
  assert_int_equal(class_queries, 0);
}

/* A NULL stream without a current context runs in the primary context
 * of the memory's GPU, retained on first use, which makes that context;
 * the first use may come inside a stream capture (another thread's, in
 * global mode, forbids this thread such calls, and is ended by them): the
 * retain, and the release and retain after a reset, are made with the
 * capture mode relaxed, and the mode is given back.  They were made in
 * the caller's mode. */
static void test_primary_retained_relaxed(void **state) {
  const struct gshm_cudadrv *drv;
  CUcontext c = NULL, saved = ctx0;
  int pushed = 0;
  (void)state;

  assert_int_equal(gshm__cudadrv_load(0, &drv), 0);
  primary_calls_unrelaxed = 0;
  ctx0 = NULL; /* no current context */
  assert_int_equal(gshm__copy_enter_ctx(drv, NULL, 7, &pushed), 0);
  assert_int_equal(pushed, 1);
  gshm__copy_leave_ctx(drv, pushed);
  assert_int_equal(primary_count[7], 1);
  primary_reset[7] = 1; /* reset: released and retained again */
  assert_int_equal(gshm__copy_primary_ctx(drv, 7, &c), 0);
  assert_int_equal(primary_count[7], 1);
  assert_int_equal(primary_calls_unrelaxed, 0);
  assert_int_equal(thread_mode, CU_STREAM_CAPTURE_MODE_GLOBAL); /* given back */
  ctx0 = saved;
}

/* A primary context reset (cudaDeviceReset) and found inactive is
 * retained again, holding one count in all: the reset keeps libgshm's
 * count, which is given back first.  Each reset used to keep one more
 * (four resets: five counts), so the context could never go. */
static void test_primary_retained_once_across_resets(void **state) {
  const struct gshm_cudadrv *drv;
  CUcontext c = NULL;
  (void)state;

  assert_int_equal(gshm__cudadrv_load(0, &drv), 0);
  assert_int_equal(gshm__copy_primary_ctx(drv, 5, &c), 0);
  assert_ptr_equal(c, (CUcontext)0x6105);
  assert_int_equal(primary_count[5], 1);
  assert_int_equal(gshm__copy_primary_ctx(drv, 5, &c), 0); /* live: nothing more */
  assert_int_equal(primary_count[5], 1);
  for (int i = 0; i < 4; i++) {
    primary_reset[5] = 1;
    c = NULL;
    assert_int_equal(gshm__copy_primary_ctx(drv, 5, &c), 0);
    assert_ptr_equal(c, (CUcontext)0x6105);
    assert_int_equal(primary_reset[5], 0); /* retained again: live */
    assert_int_equal(primary_count[5], 1);
  }
  /* a driver whose reset dropped the count: the release is refused, the
   * retain still made, one count */
  primary_reset[5] = 1;
  primary_count[5] = 0;
  assert_int_equal(gshm__copy_primary_ctx(drv, 5, &c), 0);
  assert_int_equal(primary_count[5], 1);
}

/* A primary context reset and made again by someone else's retain
 * (cudart, torch) before libgshm's next use: active, a new handle, the
 * one libgshm holds dead.  libgshm takes the live handle and keeps one
 * count of its own (theirs stays theirs).  Before: "active" was taken
 * for "live", and every copy on the dead handle failed. */
static void test_primary_made_again_by_another_retain(void **state) {
  const struct gshm_cudadrv *drv;
  CUcontext c = NULL, theirs;
  (void)state;

  assert_int_equal(gshm__cudadrv_load(0, &drv), 0);
  new_handles = 1;
  assert_int_equal(gshm__copy_primary_ctx(drv, 6, &c), 0);
  assert_int_equal(primary_count[6], 1);
  primary_reset[6] = 1;
  assert_int_equal(f_primary_retain(&theirs, 6), CUDA_SUCCESS); /* the other user's */
  assert_ptr_not_equal(theirs, c);
  assert_int_equal(gshm__copy_primary_ctx(drv, 6, &c), 0);
  assert_ptr_equal(c, theirs);
  assert_int_equal(primary_count[6], 2); /* ours and theirs */
  assert_int_equal(gshm__copy_primary_ctx(drv, 6, &c), 0); /* live now: nothing more */
  assert_ptr_equal(c, theirs);
  assert_int_equal(primary_count[6], 2);
  new_handles = 0;
}

/* A context whose entry could not be made (its device unknown) leaves no
 * slot taken: many such failures, then the calls work again.  Each used
 * to keep one of the 64 slots for good, and after 64 every copy, signal
 * and wait of the process failed with -ENOMEM. */
static void test_failed_context_entries_are_not_kept(void **state) {
  (void)state;
  CUcontext was = ctx0;

  for (int i = 0; i < 100; i++) { /* each a context libgshm has not seen */
    ctx0 = (CUcontext)(uintptr_t)(0x9000 + i);
    fail_get_device = 1;
    assert_int_equal(gshm_signal(&device_mem[0], 1, NULL), -EIO);
  }
  ctx0 = (CUcontext)0x9999;
  assert_int_equal(gshm_signal(&device_mem[0], 2, NULL), 0);
  assert_int_equal(device_mem[0], 2);
  ctx0 = was;
}

static void *sm_copy_in_thread(void *arg) {
  (void)arg;
  return (void *)(intptr_t)gshm_copy(&device_mem[40], &device_mem[32], 64, GSHM_COPY_SM, NULL);
}

/* A context reset while another thread's copy in it has read the
 * context's id but not yet looked at its entry: the entry is remade
 * once, for the new context, and kept.  The id used to be read before the
 * table's lock, so that the late thread took the id it had read for
 * newer than the entry's, and remade the entry (its module, functions,
 * peer access wiped under any other thread's launch: a launch error on a
 * live context) for the old context, and the next copy remade it again:
 * three module loads for one reset, and one more per such race. */
static void test_reset_seen_late_remakes_the_entry_once(void **state) {
  CUcontext saved = ctx0;
  pthread_t t;
  void *ret;
  (void)state;

  ctx0 = remade_ctx = (CUcontext)0x6079; /* a context no copy has used */
  module_loads = 0;
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(module_loads, 1);
  assert_int_equal(sem_init(&id_entered, 0, 0), 0);
  id_stall_us = 300000;
  assert_int_equal(pthread_create(&t, NULL, sm_copy_in_thread, NULL), 0);
  assert_int_equal(sem_wait(&id_entered), 0); /* it has the old context's id */
  __atomic_store_n(&remade_by, 1ull << 32, __ATOMIC_SEQ_CST); /* the context is reset */
  assert_int_equal(gshm_copy(&device_mem[16], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_int_equal((int)(intptr_t)ret, 0);
  assert_int_equal(gshm_copy(&device_mem[24], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  assert_int_equal(module_loads, 2); /* the first, and once for the reset */
  sem_destroy(&id_entered);
  remade_ctx = NULL;
  ctx0 = saved;
}

static int copies_left;
static void *sm_copies_in_thread(void *arg) {
  int bad = 0;
  (void)arg;
  while (__atomic_sub_fetch(&copies_left, 1, __ATOMIC_RELAXED) > 0)
    bad |= gshm_copy(&device_mem[56], &device_mem[48], 64, GSHM_COPY_SM, NULL) != 0;
  return (void *)(intptr_t)bad;
}

/* A context reset again and again while another thread copies in it:
 * the entry is remade under that thread's reads of its device, SM count
 * and kernels, which it makes without the table's lock.  Every call
 * returns (0 here: the fake launches what it is given; on a GPU the
 * launches of a reset context's module fail, the driver's answer), and a
 * build with GSHM_SANITIZE=thread reports no race (the entry was wiped
 * with memset and rebuilt field by field in place, under those reads). */
static void test_remade_under_copies(void **state) {
  CUcontext saved = ctx0;
  pthread_t t;
  void *ret;
  (void)state;

  ctx0 = remade_ctx = (CUcontext)0x607a;
  assert_int_equal(gshm_copy(&device_mem[8], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  copies_left = 4000;
  assert_int_equal(pthread_create(&t, NULL, sm_copies_in_thread, NULL), 0);
  for (int i = 0; i < 300; i++) {
    __atomic_add_fetch(&remade_by, 1ull << 32, __ATOMIC_SEQ_CST); /* a reset */
    assert_int_equal(gshm_copy(&device_mem[8], &device_mem[0], 64, GSHM_COPY_SM, NULL), 0);
  }
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_int_equal((int)(intptr_t)ret, 0);
  remade_ctx = NULL;
  ctx0 = saved;
}

static void *signal_in_thread(void *arg) {
  return (void *)(intptr_t)gshm_signal(arg, 3, NULL);
}

/* fork() while another thread makes the entry of a context copy.c has not
 * seen (its table's lock held): the child's signal must run, not wait for
 * a lock whose holder is not in the child (it did, for good: alarm() ends
 * such a child with SIGALRM).  Must run first: ctx0's entry is made once. */
static void test_fork_while_another_thread_makes_an_entry(void **state) {
  pthread_t t;
  void *ret;
  pid_t pid;
  int status;
  (void)state;

  assert_int_equal(sem_init(&get_device_entered, 0, 0), 0);
  get_device_stall_us = 300000;
  assert_int_equal(pthread_create(&t, NULL, signal_in_thread, &device_mem[1]), 0);
  assert_int_equal(sem_wait(&get_device_entered), 0); /* the thread holds the lock */
  pid = fork();
  if (pid == 0) {
    alarm(5);
    _exit(gshm_signal(&device_mem[2], 4, NULL) == 0 && device_mem[2] == 4 ? 0 : 1);
  }
  assert_true(pid > 0);
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_int_equal((int)(intptr_t)ret, 0);
  assert_int_equal(device_mem[1], 3);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status)); /* not killed by its alarm */
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(device_mem[2], 0); /* the child's store was the child's */
  sem_destroy(&get_device_entered);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_while_another_thread_makes_an_entry), /* first */
      cmocka_unit_test(test_first_copy_loads_the_module_relaxed),
      cmocka_unit_test(test_failed_lookup_unloads_the_module_relaxed),
      cmocka_unit_test(test_reset_seen_late_remakes_the_entry_once),
      cmocka_unit_test(test_remade_under_copies),
      cmocka_unit_test(test_reachable_flags),
      cmocka_unit_test(test_signal_alone_takes_no_buffers),
      cmocka_unit_test(test_failed_context_entries_are_not_kept),
      cmocka_unit_test(test_pageable_flag_never_reaches_the_gpu),
      cmocka_unit_test(test_cumem_mapping_without_access_is_refused),
      cmocka_unit_test(test_mapping_with_access_enables_no_peer),
      cmocka_unit_test(test_range_into_a_mapping_from_below),
      cmocka_unit_test(test_peer_memory_without_peer_access_yet_goes),
      cmocka_unit_test(test_foreign_cumem_without_access_is_refused),
      cmocka_unit_test(test_primary_retained_once_across_resets),
      cmocka_unit_test(test_primary_retained_relaxed),
      cmocka_unit_test(test_primary_made_again_by_another_retain),
  };
  if (getenv("GSHM_TEST_FILTER")) /* (a cmocka test filter, as test_hostile takes) */
    cmocka_set_test_filter(getenv("GSHM_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
