/* SPDX-License-Identifier: Apache-2.0 */
#include "cudadrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "fork.h"
#include "util.h"

typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult *);

static struct gshm_cudadrv drv_table;
/* 1: not tried; 0: loaded (for good); a negative errno: the last try's
 * failure.  Written under the load's lock (fork.h GSHM__LOCK_CUDADRV),
 * read without it (acquire: a 0 makes drv_table and drv_gen visible). */
static int drv_status = 1;
/* gshm__fork_gen() of the process whose load succeeded: a process forked
 * from it since cannot use the driver (fork.h). */
static unsigned drv_gen;
static int drv_child_logged;
static void *drv_lib;       /* dlopen'ed: kept even when a later step fails */
static bool drv_resolved;   /* every entry point of the map resolved */
static int64_t drv_last_try; /* CLOCK_MONOTONIC ns of the last try */
/* The log level of the load's messages: any caller's (each passes its
 * own, and one of them runs the try).  Written by every call, from any
 * thread, and read inside the try: an atomic, so that doing so is no
 * data race (tests/unit/test_cudadrv_threads.c). */
static int drv_prio;

/* A failed load is tried again by the first call a second or more after
 * the last try, never more often: callers of the hot paths (a map, a
 * copy) only read drv_status in between. */
#define DRV_RETRY_NS 1000000000ll

static int load_prio(void) { return __atomic_load_n(&drv_prio, __ATOMIC_RELAXED); }

static int resolve(get_proc_address_fn gpa, const char *name, int version, void **out,
                   int optional) {
  CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
  void *p = NULL;

  /* At the version whose ABI matches the member's prototype (cudadrv.h). */
  if (gpa(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS &&
      q == CU_GET_PROC_ADDRESS_SUCCESS && p) {
    *out = p;
    return 0;
  }
  if (optional) {
    *out = NULL;
    return 0;
  }
  gshm__log(load_prio(), "cuda: driver lacks %s at CUDA %d.%d", name, version / 1000,
            version % 1000 / 10);
  return -ENOSYS;
}

/* Resolves every entry point through cuGetProcAddress_v2; the load's lock
 * held.
 * 0, or -ENOSYS for a driver that cannot serve (for good: the library
 * stays loaded, so a later try would find the same one). */
static int load_resolve(void) {
  get_proc_address_fn gpa;
  int e = 0;

  /* Only cuGetProcAddress_v2 (CUDA 12.0 drivers on) gives each entry point
   * at a version.  dlsym of a name gives its first variant (cuMemAlloc is
   * CUDA 3.1's, with 32-bit pointers and sizes), not the one whose
   * prototype the table has (cuMemAlloc_v2): an older driver is refused. */
  gpa = (get_proc_address_fn)dlsym(drv_lib, "cuGetProcAddress_v2");
  if (!gpa) {
    gshm__log(load_prio(), "cuda: driver older than CUDA %d.%d (no cuGetProcAddress_v2)",
              GSHM_CUDADRV_ABI / 1000, GSHM_CUDADRV_ABI % 1000 / 10);
    return -ENOSYS; /* keep lib loaded, as below */
  }
#define GSHM_CUDADRV_REQ(name)                                                     \
  if (!e)                                                                          \
    e = resolve(gpa, #name, GSHM_CUDADRV_ABI, (void **)&drv_table.name, 0);
#define GSHM_CUDADRV_OPT(member, sym, ver)                                         \
  if (!e)                                                                          \
    e = resolve(gpa, sym, ver, (void **)&drv_table.member, 1);
  GSHM_CUDADRV_MAP(GSHM_CUDADRV_REQ, GSHM_CUDADRV_OPT)
#undef GSHM_CUDADRV_REQ
#undef GSHM_CUDADRV_OPT
  drv_resolved = !e;
  return e; /* keep lib loaded: harmless, and dlclose of libcuda is unsafe */
}

/* One try, from where the last one stopped; the load's lock held.  A missing
 * libcuda.so.1 is looked for again (a driver installed, or its
 * container's mounts made, after this process started), and so is a
 * failed cuInit: one that ran before the kernel module was loaded or the
 * device nodes made.  NVIDIA documents no retry of cuInit; where the
 * driver keeps its first failure for the process (reported of some
 * errors, never documented), the retry is one call a second that fails
 * the same way.  A driver that cannot serve (-ENOSYS) is never tried
 * again. */
static int load_try(void) {
  CUresult r;
  int e;

  if (!drv_lib && !(drv_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))) {
    gshm__log(load_prio(), "cuda: cannot load libcuda.so.1: %s", dlerror());
    return -ENOENT;
  }
  if (!drv_resolved && (e = load_resolve()))
    return e;
  r = drv_table.cuInit(0);
  if (r != CUDA_SUCCESS) {
    gshm__cuda_log(load_prio(), r, "cuInit(0)", __FILE__, __LINE__);
    return -ENODEV;
  }
  drv_table.cuDriverGetVersion(&drv_table.driver_version);
  return 0;
}

/* Whether a failed load may be tried again now. */
static bool load_due(int status, int64_t now) {
  return status == 1 ||
         (status != -ENOSYS &&
          now - __atomic_load_n(&drv_last_try, __ATOMIC_RELAXED) >= DRV_RETRY_NS);
}

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  int st = __atomic_load_n(&drv_status, __ATOMIC_ACQUIRE);
  int64_t now;

  __atomic_store_n(&drv_prio, prio, __ATOMIC_RELAXED);
  if (st && load_due(st, now = gshm__now_ns(CLOCK_MONOTONIC))) {
    /* a fork meanwhile waits for the try to end (fork.h) */
    gshm__fork_lock(GSHM__LOCK_CUDADRV);
    st = drv_status; /* another thread may have tried meanwhile */
    if (st && load_due(st, now)) {
      st = load_try();
      drv_gen = gshm__fork_gen();
      __atomic_store_n(&drv_last_try, gshm__now_ns(CLOCK_MONOTONIC), __ATOMIC_RELAXED);
      __atomic_store_n(&drv_status, st, __ATOMIC_RELEASE);
    }
    gshm__fork_unlock(GSHM__LOCK_CUDADRV);
  }
  if (st)
    return st;
  if (drv_gen != gshm__fork_gen()) {
    if (!__atomic_exchange_n(&drv_child_logged, 1, __ATOMIC_RELAXED))
      gshm__log(prio, "cuda: this process was forked from one that had initialized CUDA, "
                      "which a forked child cannot use (fork and exec, or spawn)");
    return -ECHILD;
  }
  *drv_out = &drv_table;
  return 0;
}

void gshm__cuda_log(int prio, CUresult r, const char *call_text, const char *file, int line) {
  const char *name = NULL, *desc = NULL;

  if (prio > gshm__log_level())
    return;
  if (drv_table.cuGetErrorName)
    drv_table.cuGetErrorName(r, &name);
  if (drv_table.cuGetErrorString)
    drv_table.cuGetErrorString(r, &desc);
  gshm__log(prio, "%s failed: %s (%s) at %s:%d", call_text, name ? name : "CUDA_ERROR_?",
            desc ? desc : "unknown", file, line);
}
