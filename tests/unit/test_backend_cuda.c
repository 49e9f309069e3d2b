/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's CUDA backend (daemon/backend_cuda*.c, all of it) against a fake
 * driver of two GPUs: a sticky context error (gshm__cuda_sticky) from any
 * driver call makes the backend log one error that names the GPU, the
 * call and the error, and set needs_restart, once; other errors do not;
 * after it, freeing a segment or the backend makes no driver call (the
 * memory stays where the fd store keeps it, as after a SIGKILL).  What
 * gshmd does with needs_restart (stop, exit for a restart) is main.c's. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "cudadrv.h"
#include "log.h"

#define NDEV 2
#define GRAN (2u << 20)

static const char *fail_call; /* the next call of this name fails ... */
static CUresult fail_with;    /* ... with this */
static unsigned calls;        /* driver calls made */
static int current = -1;      /* the device whose primary context is current */
static int contexts[NDEV];    /* what the primary contexts point at */

/* Every fake call starts here: counted, and failed when asked. */
#define CALL(name)                                 \
  do {                                             \
    calls++;                                       \
    if (fail_call && !strcmp(fail_call, name)) {   \
      fail_call = NULL;                            \
      return fail_with;                            \
    }                                              \
  } while (0)

static CUresult f_count(int *n) {
  CALL("cuDeviceGetCount");
  *n = NDEV;
  return CUDA_SUCCESS;
}
static CUresult f_get(CUdevice *d, int ordinal) {
  *d = ordinal;
  return CUDA_SUCCESS;
}
static CUresult f_uuid(CUuuid *u, CUdevice d) {
  memset(u->bytes, 0x10 + d, sizeof(u->bytes));
  return CUDA_SUCCESS;
}
static CUresult f_pci(char *buf, int len, CUdevice d) {
  snprintf(buf, (size_t)len, "0000:%02x:00.0", 0x18 + d);
  return CUDA_SUCCESS;
}
static CUresult f_name(char *buf, int len, CUdevice d) {
  snprintf(buf, (size_t)len, "Fake GPU %d", d);
  return CUDA_SUCCESS;
}
static CUresult f_total(size_t *b, CUdevice d) {
  (void)d;
  *b = (size_t)1 << 30;
  return CUDA_SUCCESS;
}
static CUresult f_attr(int *v, CUdevice_attribute a, CUdevice d) {
  (void)a, (void)d;
  *v = 1; /* VMM and POSIX fds supported; 1 for the rest is harmless */
  return CUDA_SUCCESS;
}
static CUresult f_gran(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f) {
  (void)p, (void)f;
  *g = GRAN;
  return CUDA_SUCCESS;
}
static CUresult f_retain(CUcontext *c, CUdevice d) {
  *c = (CUcontext)&contexts[d];
  return CUDA_SUCCESS;
}
static CUresult f_release(CUdevice d) {
  (void)d;
  CALL("cuDevicePrimaryCtxRelease");
  return CUDA_SUCCESS;
}
static CUresult f_can_peer(int *can, CUdevice d, CUdevice p) {
  (void)d, (void)p;
  *can = 0; /* no peer setup to fake */
  return CUDA_SUCCESS;
}
static CUresult f_p2p(int *v, CUdevice_P2PAttribute a, CUdevice s, CUdevice d) {
  (void)a, (void)s, (void)d;
  *v = 0;
  return CUDA_SUCCESS;
}
static CUresult f_set_current(CUcontext c) {
  CALL("cuCtxSetCurrent");
  current = (int)((int *)c - contexts);
  return CUDA_SUCCESS;
}
static CUresult f_get_current(CUcontext *c) {
  *c = current < 0 ? NULL : (CUcontext)&contexts[current];
  return CUDA_SUCCESS;
}
static CUresult f_create(CUmemGenericAllocationHandle *h, size_t size,
                         const CUmemAllocationProp *p, unsigned long long flags) {
  (void)size, (void)p, (void)flags;
  CALL("cuMemCreate");
  *h = 1;
  return CUDA_SUCCESS;
}
static CUresult f_reserve(CUdeviceptr *va, size_t size, size_t align, CUdeviceptr addr,
                          unsigned long long flags) {
  (void)size, (void)align, (void)addr, (void)flags;
  CALL("cuMemAddressReserve");
  *va = 0x7f0000000000ull;
  return CUDA_SUCCESS;
}
static CUresult f_addr_free(CUdeviceptr va, size_t size) {
  (void)va, (void)size;
  CALL("cuMemAddressFree");
  return CUDA_SUCCESS;
}
static CUresult f_map(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
  (void)va, (void)size, (void)off, (void)h, (void)flags;
  CALL("cuMemMap");
  return CUDA_SUCCESS;
}
static CUresult f_unmap(CUdeviceptr va, size_t size) {
  (void)va, (void)size;
  CALL("cuMemUnmap");
  return CUDA_SUCCESS;
}
static CUresult f_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *d, size_t n) {
  (void)va, (void)size, (void)d, (void)n;
  CALL("cuMemSetAccess");
  return CUDA_SUCCESS;
}
static CUresult f_memset(CUdeviceptr va, unsigned char v, size_t n) {
  (void)va, (void)v, (void)n;
  CALL("cuMemsetD8");
  return CUDA_SUCCESS;
}
static CUresult f_sync(CUstream s) {
  (void)s;
  CALL("cuStreamSynchronize");
  return CUDA_SUCCESS;
}
static CUresult f_mem_release(CUmemGenericAllocationHandle h) {
  (void)h;
  CALL("cuMemRelease");
  return CUDA_SUCCESS;
}
static CUresult f_export(void *fd, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
                         unsigned long long flags) {
  (void)h, (void)t, (void)flags;
  CALL("cuMemExportToShareableHandle");
  *(int *)fd = open("/dev/null", O_RDONLY); /* an fd the backend sets FD_CLOEXEC on */
  return CUDA_SUCCESS;
}
static CUresult f_error_name(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_ILLEGAL_ADDRESS  ? "CUDA_ERROR_ILLEGAL_ADDRESS"
       : r == CUDA_ERROR_LAUNCH_FAILED  ? "CUDA_ERROR_LAUNCH_FAILED"
       : r == CUDA_ERROR_OUT_OF_MEMORY  ? "CUDA_ERROR_OUT_OF_MEMORY"
                                        : "CUDA_ERROR_?";
  return CUDA_SUCCESS;
}

static const struct gshm_cudadrv fake_drv = {
    .cuDeviceGetCount = f_count,
    .cuDeviceGet = f_get,
    .cuDeviceGetUuid = f_uuid,
    .cuDeviceGetPCIBusId = f_pci,
    .cuDeviceGetName = f_name,
    .cuDeviceTotalMem = f_total,
    .cuDeviceGetAttribute = f_attr,
    .cuMemGetAllocationGranularity = f_gran,
    .cuDevicePrimaryCtxRetain = f_retain,
    .cuDevicePrimaryCtxRelease = f_release,
    .cuDeviceCanAccessPeer = f_can_peer,
    .cuDeviceGetP2PAttribute = f_p2p,
    .cuCtxSetCurrent = f_set_current,
    .cuCtxGetCurrent = f_get_current,
    .cuMemCreate = f_create,
    .cuMemAddressReserve = f_reserve,
    .cuMemAddressFree = f_addr_free,
    .cuMemMap = f_map,
    .cuMemUnmap = f_unmap,
    .cuMemSetAccess = f_set_access,
    .cuMemsetD8 = f_memset,
    .cuStreamSynchronize = f_sync,
    .cuMemRelease = f_mem_release,
    .cuMemExportToShareableHandle = f_export,
    .cuGetErrorName = f_error_name,
};

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  (void)prio;
  *drv_out = &fake_drv;
  return 0;
}

/* ---- the log, read back: stderr goes to a file for each test ---- */

static FILE *log_file;
static int saved_stderr = -1;

static void log_capture(void) {
  fflush(stderr);
  log_file = tmpfile();
  assert_non_null(log_file);
  saved_stderr = dup(STDERR_FILENO);
  dup2(fileno(log_file), STDERR_FILENO);
}

/* Stops capturing and shows what was captured; returns how many lines
 * contain every word of the NULL-terminated list (none: -1). */
static int log_lines_with(const char *const *words) {
  char line[1024];
  int n = 0;

  if (saved_stderr < 0)
    return -1;
  fflush(stderr);
  dup2(saved_stderr, STDERR_FILENO);
  close(saved_stderr);
  saved_stderr = -1;
  rewind(log_file);
  while (fgets(line, sizeof(line), log_file)) {
    bool all = words != NULL;
    for (const char *const *w = words; w && *w; w++)
      all &= strstr(line, *w) != NULL;
    n += all;
    fputs(line, stderr); /* (for the test's own output) */
  }
  fclose(log_file);
  return n;
}

/* A failed test's captured lines (its failure among them) are shown. */
static int log_release(void **state) {
  (void)state;
  log_lines_with(NULL);
  gshm__log_setup("test", -1, 0);
  return 0;
}

static struct gshmd_backend *backend_new(void) {
  struct gshmd_backend *b = NULL;
  assert_int_equal(gshmd_backend_cuda_create(NULL, &b), 0);
  assert_int_equal(b->ndevices, NDEV);
  assert_false(b->needs_restart);
  return b;
}

static int alloc_on(struct gshmd_backend *b, const char *where, struct gshmd_alloc **out) {
  struct gshm_location loc;
  assert_int_equal(gshm__location_parse(where, &loc), 0);
  return b->ops->alloc(b, &loc, GRAN, 0, "seg", out);
}

/* ---- tests ---- */

/* A sticky error in a segment's zeroing on GPU 1: -EIO, one error line
 * naming GPU 1's bus id, the call and the error, needs_restart set; a
 * second sticky error (another call, the other GPU) logs no second error
 * line. */
static void test_sticky_error_asks_for_restart_once(void **state) {
  static const char *const first[] = {"0000:19:00.0", "cuMemsetD8", "CUDA_ERROR_ILLEGAL_ADDRESS",
                                      "restart", NULL};
  static const char *const any_restart[] = {"restart", NULL};
  struct gshmd_backend *b;
  struct gshmd_alloc *a = NULL;
  (void)state;

  gshm__log_setup("test", GSHM_LOG_INFO, 0);
  b = backend_new();
  log_capture();
  fail_call = "cuMemsetD8";
  fail_with = CUDA_ERROR_ILLEGAL_ADDRESS;
  assert_int_equal(alloc_on(b, "cuda:1", &a), -EIO);
  assert_null(fail_call);
  assert_true(b->needs_restart);
  assert_int_equal(log_lines_with(first), 1);

  log_capture();
  fail_call = "cuMemAddressReserve";
  fail_with = CUDA_ERROR_LAUNCH_FAILED;
  assert_int_equal(alloc_on(b, "cuda:0", &a), -EIO);
  assert_true(b->needs_restart);
  assert_int_equal(log_lines_with(any_restart), 0);
  b->ops->destroy(b);
}

/* Errors of one call (out of memory, a bad value) are the request's: no
 * restart, and the next allocation works. */
static void test_other_errors_do_not(void **state) {
  struct gshmd_backend *b = backend_new();
  struct gshmd_alloc *a = NULL;
  (void)state;

  fail_call = "cuMemCreate";
  fail_with = CUDA_ERROR_OUT_OF_MEMORY;
  assert_int_equal(alloc_on(b, "cuda:0", &a), -ENOMEM);
  fail_call = "cuMemMap";
  fail_with = CUDA_ERROR_INVALID_VALUE;
  assert_int_equal(alloc_on(b, "cuda:0", &a), -EINVAL);
  assert_false(b->needs_restart);
  assert_int_equal(alloc_on(b, "cuda:0", &a), 0);
  b->ops->free(b, a);
  b->ops->destroy(b);
}

/* Once a sticky error is seen, a segment freed on the way out (gshmd's
 * shutdown frees every segment's record) and the backend itself make no
 * driver call: no cuMemRelease of memory that the fd store keeps, as
 * after a SIGKILL. */
static void test_after_sticky_error_free_makes_no_driver_call(void **state) {
  struct gshmd_backend *b = backend_new();
  struct gshmd_alloc *a = NULL, *other = NULL;
  (void)state;

  assert_int_equal(alloc_on(b, "cuda:0", &a), 0);
  fail_call = "cuMemCreate"; /* (the one call whose GPU the backend names itself) */
  fail_with = CUDA_ERROR_ECC_UNCORRECTABLE;
  assert_int_equal(alloc_on(b, "cuda:1", &other), -EIO);
  assert_true(b->needs_restart);
  calls = 0;
  b->ops->free(b, a);
  b->ops->destroy(b);
  assert_int_equal(calls, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_sticky_error_asks_for_restart_once, log_release),
      cmocka_unit_test(test_other_errors_do_not),
      cmocka_unit_test(test_after_sticky_error_free_makes_no_driver_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
