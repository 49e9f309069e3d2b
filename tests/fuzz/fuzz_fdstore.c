/* libFuzzer target: restoring saved state after a restart
 * (gshmd_fdstore_restore: read_state's StateTable decoder, then adoption of
 * each record's segment fd into a fresh registry).
 *
 * The input is the state memfd's contents (FDNAME=state-7); beside it the
 * "fd store" holds sealed host memfds seg-1 (4 KiB), seg-2 (8 KiB) and
 * seg-3 (4 KiB, unsealed: must be refused) and an unrelated fd.  Checked:
 * no crash or leak, every fd handed in is either adopted (set to -1) or
 * closed, and the registry's counters agree with its lists. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "fdstore.h"
#include "log.h"
#include "registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct gshmd_config cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  unsetenv("NOTIFY_SOCKET"); /* sd_notify: no service manager */
  unsetenv("LISTEN_FDS");
  gshm__log_setup("fuzz", 0, 0);
  if (gshmd_config_init(&cfg))
    abort();
  return 0;
}

static int sealed_memfd(size_t size, bool seal) {
  int fd = memfd_create("seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
      (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0))
    abort();
  return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct gshmd_registry reg;
  struct gshmd_fdstore fs;
  char *names[] = {"seg-1", "state-7", "seg-2", "seg-3", "other", "state-3"};
  int fds[6], n = 6;
  struct gshm_list *pos;
  uint32_t nseg = 0;
  uint64_t bytes = 0;

  if (size > 1 << 20)
    return 0;
  gshmd_registry_init(&reg, &cfg);
  if (gshmd_backend_host_create(&cfg, &reg.host))
    abort();
  fds[0] = sealed_memfd(4096, true);
  fds[1] = memfd_create("state", MFD_CLOEXEC);
  if (fds[1] < 0 || (size && write(fds[1], data, size) != (ssize_t)size))
    abort();
  fds[2] = sealed_memfd(8192, true);
  fds[3] = sealed_memfd(4096, false);
  fds[4] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  fds[5] = memfd_create("old-state", MFD_CLOEXEC); /* an older, empty table */
  gshmd_fdstore_setup(&fs, &reg);
  if (gshmd_fdstore_restore(&fs, fds, names, n))
    abort();
  /* Ours are adopted or closed; "other" is not ours and stays. */
  for (int i = 0; i < n; i++)
    if (i != 4 && fds[i] >= 0)
      abort();
  if (fds[4] < 0)
    abort();
  close(fds[4]);
  gshm_list_foreach(pos, &reg.segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    nseg++;
    bytes += seg->mem->size;
    if (gshmd_registry_find_id(&reg, seg->id) != seg)
      abort();
    if (!seg->unlinked && gshmd_registry_find_name(&reg, seg->name) != seg)
      abort();
  }
  if (nseg != reg.nsegments || bytes != reg.bytes || nseg > 2)
    abort();
  gshmd_fdstore_shutdown(&fs);
  gshmd_registry_destroy(&reg);
  reg.host->ops->destroy(reg.host);
  return 0;
}
