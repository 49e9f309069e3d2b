/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's page-locked host memory (->host_alloc, ->host_free):
 * the cluster's staging buffers. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "backend_cuda_internal.h"

/* Page-locked host memory.  Where anonymous memory gets transparent huge
 * pages on request (transparent_hugepage/enabled is madvise or always),
 * 2 MiB pages mapped here, made and then registered with the driver
 * (cuMemHostRegister): pinning costs per page, and on the lent H200
 * machine this took 0.12-0.17 ms per MiB against cuMemAllocHost's
 * 0.24-0.33 (4 KiB pages registered: 0.50-0.57), for the staging
 * buffers a first staged pull makes.  Registered as portable: the copies
 * of every GPU's context use them, as cuMemAllocHost's memory is under
 * unified addressing.  Else cuMemAllocHost. */
int gshmd__cuda_host_alloc(struct gshmd_backend *b, uint64_t size, void **ptr_out) {
  struct cuda_backend *cb = (struct cuda_backend *)b;
  uint64_t len = (size + GSHMD_HUGE_PAGE - 1) & ~(GSHMD_HUGE_PAGE - 1);
  uint8_t *m, *p;
  int e;

  if (!cb->n)
    return -ENODEV;
  if ((e = set_ctx(cb, &cb->devs[0])))
    return e;
  if (!cb->host_thp)
    return CU_ERR(cb, cuMemAllocHost, ptr_out, size) ? -ENOMEM : 0;
  /* GSHMD_HUGE_PAGE-aligned: map a page more, cut the ends off */
  if (size > UINT64_MAX / 2 ||
      (m = mmap(NULL, len + GSHMD_HUGE_PAGE, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
    return -ENOMEM;
  p = (uint8_t *)(((uintptr_t)m + GSHMD_HUGE_PAGE - 1) & ~(uintptr_t)(GSHMD_HUGE_PAGE - 1));
  if (p > m)
    munmap(m, (size_t)(p - m));
  munmap(p + len, (size_t)(m + GSHMD_HUGE_PAGE - p));
  (void)madvise(p, len, MADV_HUGEPAGE);
  (void)madvise(p, len, MADV_DONTFORK); /* (no child of gshmd shares pinned pages) */
  memset(p, 0, len); /* the pages, made here in 2 MiB */
  if ((e = CU_ERR(cb, cuMemHostRegister, p, len, CU_MEMHOSTREGISTER_PORTABLE))) {
    munmap(p, len);
    return -ENOMEM;
  }
  *ptr_out = p;
  return 0;
}

void gshmd__cuda_host_free(struct gshmd_backend *b, void *ptr, uint64_t size) {
  struct cuda_backend *cb = (struct cuda_backend *)b;

  if (!ptr || !cb->n || set_ctx(cb, &cb->devs[0]))
    return;
  if (!cb->host_thp) {
    CU_UNDO(cb, cuMemFreeHost, ptr);
    return;
  }
  CU_UNDO(cb, cuMemHostUnregister, ptr);
  munmap(ptr, (size + GSHMD_HUGE_PAGE - 1) & ~(GSHMD_HUGE_PAGE - 1));
}
