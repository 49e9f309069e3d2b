/* SPDX-License-Identifier: Apache-2.0 */
/* Device segments whose GPU this gshmd cannot reach (backend.h
 * gshmd_backend_parked): kept as the fd the fd store handed back.  No
 * alloc and no destroy: a create picks its backend by location (host or
 * cuda), never this one, and the one instance is static. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"

/* No client gets the fd: without the driver gshmd cannot check it, nor
 * make the read-only fd a read-only lease needs. */
static int parked_export_fd(struct gshmd_backend *b, struct gshmd_alloc *a, bool writable,
                            int *fd_out) {
  (void)b, (void)a, (void)writable, (void)fd_out;
  return -ENODEV;
}

static int parked_park_fd(struct gshmd_backend *b, struct gshmd_alloc *a, int *fd_out) {
  (void)b;
  *fd_out = (int)(intptr_t)a->priv;
  return 0;
}

static int parked_adopt_fd(struct gshmd_backend *b, int fd, const char *location, uint64_t size,
                           struct gshmd_alloc **out) {
  struct gshmd_alloc *a;

  if (strncmp(location, "cuda:", 5) || strlen(location) >= sizeof(a->location))
    return -EINVAL;
  if (!(a = calloc(1, sizeof(*a))))
    return -ENOMEM;
  a->backend = b;
  a->size = size;
  a->granularity = 1;
  a->device_index = -1;
  snprintf(a->location, sizeof(a->location), "%s", location);
  a->priv = (void *)(intptr_t)fd;
  *out = a;
  return 0;
}

static void parked_free(struct gshmd_backend *b, struct gshmd_alloc *a) {
  (void)b;
  if (!a)
    return;
  close((int)(intptr_t)a->priv);
  free(a);
}

static const struct gshmd_backend_ops parked_ops = {
    .export_fd = parked_export_fd,
    .park_fd = parked_park_fd,
    .adopt_fd = parked_adopt_fd,
    .free = parked_free,
};

static struct gshmd_backend parked = {.name = "parked", .ops = &parked_ops};

struct gshmd_backend *gshmd_backend_parked(void) { return &parked; }

const char *gshmd_backend_parked_why(bool gpu_fault) {
  return gpu_fault ? "the segment's GPU is unusable: a sticky CUDA error at gshmd's start; the "
                     "segment is kept until gshmd restarts with the GPU working"
                   : "no GPU of this gshmd takes the segment: it is kept until gshmd restarts "
                     "with its GPU";
}
