/* SPDX-License-Identifier: Apache-2.0 */
#include "cudadrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>

typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult *);

static struct gshm_cudadrv drv_table;
static int drv_status = 1; /* 1: not tried */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
/* The log level of the load's messages: any caller's (each passes its
 * own, and one of them runs load_once).  Written by every call, from any
 * thread, and read inside the once: an atomic, so that doing so is no
 * data race (tests/unit/test_cudadrv_threads.c). */
static int drv_prio;

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

static void load_once(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  get_proc_address_fn gpa;
  CUresult r;
  int e = 0;

  if (!lib) {
    gshm__log(load_prio(), "cuda: cannot load libcuda.so.1: %s", dlerror());
    drv_status = -ENOENT;
    return;
  }
  /* Only cuGetProcAddress_v2 (CUDA 12.0 drivers on) gives each entry point
   * at a version.  dlsym of a name gives its first variant (cuMemAlloc is
   * CUDA 3.1's, with 32-bit pointers and sizes), not the one whose
   * prototype the table has (cuMemAlloc_v2): an older driver is refused. */
  gpa = (get_proc_address_fn)dlsym(lib, "cuGetProcAddress_v2");
  if (!gpa) {
    gshm__log(load_prio(), "cuda: driver older than CUDA %d.%d (no cuGetProcAddress_v2)",
              GSHM_CUDADRV_ABI / 1000, GSHM_CUDADRV_ABI % 1000 / 10);
    drv_status = -ENOSYS;
    return; /* keep lib loaded, as below */
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
  if (e) {
    drv_status = e;
    return; /* keep lib loaded: harmless, and dlclose of libcuda is unsafe */
  }
  r = drv_table.cuInit(0);
  if (r != CUDA_SUCCESS) {
    gshm__cuda_log(load_prio(), r, "cuInit(0)", __FILE__, __LINE__);
    drv_status = -ENODEV;
    return;
  }
  drv_table.cuDriverGetVersion(&drv_table.driver_version);
  drv_status = 0;
}

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  __atomic_store_n(&drv_prio, prio, __ATOMIC_RELAXED);
  pthread_once(&drv_once, load_once);
  if (drv_status)
    return drv_status;
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
