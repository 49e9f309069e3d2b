/* SPDX-License-Identifier: Apache-2.0 */
/* gshm__cuda_log for the unit tests that fake the driver table
 * (test_map_cuda, test_pool, test_broadcast_plan, test_copy_flags).
 *
 * Each such test defines gshm__cudadrv_load to hand out its fake table, so
 * common/cudadrv.c, which defines the loader too, cannot be linked beside
 * it; gshm__cuda_log lives there and is stood in for here.  The errno
 * mapping is not: gshm__cuda_errno is the product's (common/cuda_errors.c,
 * in gshm_common), so the tests see the errors a caller would. */
#include "cudadrv.h"

/* As the product logs, but by number: the fakes have no cuGetErrorName. */
void gshm__cuda_log(int prio, CUresult r, const char *call_text, const char *file, int line) {
  gshm__log(prio, "%s failed: CUresult %d at %s:%d", call_text, (int)r, file, line);
}
