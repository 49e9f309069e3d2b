/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: restoring saved state after a restart
 * (gshmd_fdstore_restore: the StateRecord and StateTable decoders, the
 * journal's header and contents, then adoption of each segment's memory fd
 * into a fresh registry).
 *
 * Input: three 16-bit little-endian lengths, then the bytes of meta-1-2,
 * meta-2-1 and ids-3, then the journal: its first 32 bytes are its header
 * (struct journal_head) and the rest its first area (at JOURNAL_HEAD,
 * 4096).  Beside them the "fd store" holds sealed host memfds seg-1
 * (4 KiB) and seg-2 (8 KiB), an older meta-1-1, memory no record names
 * (seg-9, unsealed: must be refused) and an unrelated fd; and bucket 0
 * (b0a, b0b: a socketpair) with the journal's bytes also queued as its
 * datagram's payload, carrying one sealed 4 KiB memfd.  Checked: no
 * crash or leak, every fd handed in is either adopted (set to -1) or
 * closed, the registry's counters agree with its lists, and no segment
 * comes back without memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
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
  gshm__log_setup("fuzz", getenv("GSHM_FUZZ_LOG") ? 7 : 0, 0); /* GSHM_FUZZ_LOG=1: say what restore did */
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

/* A record memfd holding data[0..len). */
static int record(const uint8_t *data, size_t len) {
  int fd = memfd_create("record", MFD_CLOEXEC);
  if (fd < 0 || (len && write(fd, data, len) != (ssize_t)len))
    abort();
  return fd;
}

/* A journal memfd: head (up to 32 bytes) at 0, area at 4096, sized as
 * gshmd sizes a new one (the header page and two 64 KiB areas). */
static int journal(const uint8_t *data, size_t len) {
  int fd = memfd_create("journal", MFD_CLOEXEC);
  size_t head = len < 32 ? len : 32;
  if (fd < 0 || ftruncate(fd, 4096 + 2 * 65536) < 0 ||
      (head && pwrite(fd, data, head, 0) != (ssize_t)head) ||
      (len > head && pwrite(fd, data + head, len - head > 65536 ? 65536 : len - head, 4096) < 0))
    abort();
  return fd;
}

/* A socketpair with payload queued in end 1's queue (sent from end 0)
 * with one sealed memfd: bucket 0's ends in fds[0..1]. */
static void bucket(const uint8_t *payload, size_t len, int *fds) {
  union {
    struct cmsghdr align;
    char b[CMSG_SPACE(sizeof(int))];
  } ctl;
  int mem = sealed_memfd(4096, true);
  struct iovec iov = {.iov_base = (void *)payload, .iov_len = len > 65536 ? 65536 : len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                      .msg_controllen = sizeof(ctl.b)};
  struct cmsghdr *c;

  memset(ctl.b, 0, sizeof(ctl.b));
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &mem, sizeof(int));
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fds) < 0 || sendmsg(fds[0], &mh, 0) < 0)
    abort();
  close(mem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct gshmd_registry reg;
  struct gshmd_fdstore fs;
  char *names[] = {"seg-1", "meta-1-2", "seg-2", "meta-2-1", "ids-3", "other", "meta-1-1",
                   "seg-9", "journal", "b0a", "b0b"};
  int fds[11], n = 11;
  struct gshm_list *pos;
  uint32_t nseg = 0;
  uint64_t bytes = 0;
  size_t a, b, c;

  if (size < 6 || size > 1 << 20)
    return 0;
  a = (size_t)data[0] | (size_t)data[1] << 8;
  b = (size_t)data[2] | (size_t)data[3] << 8;
  c = (size_t)data[4] | (size_t)data[5] << 8;
  data += 6;
  size -= 6;
  if (a > size)
    a = size;
  if (b > size - a)
    b = size - a;
  if (c > size - a - b)
    c = size - a - b;
  gshmd_registry_init(&reg, &cfg);
  if (gshmd_backend_host_create(&cfg, &reg.host))
    abort();
  fds[0] = sealed_memfd(4096, true);
  fds[1] = record(data, a);
  fds[2] = sealed_memfd(8192, true);
  fds[3] = record(data + a, b);
  fds[4] = record(data + a + b, c);
  fds[5] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  fds[6] = record(NULL, 0);
  fds[7] = sealed_memfd(4096, false);
  fds[8] = journal(data + a + b + c, size - a - b - c);
  bucket(data + a + b + c, size - a - b - c, &fds[9]);
  gshmd_fdstore_setup(&fs, &reg);
  if (gshmd_fdstore_restore(&fs, fds, names, n))
    abort();
  /* Ours are adopted or closed; "other" is not ours and stays. */
  for (int i = 0; i < n; i++)
    if (i != 5 && fds[i] >= 0)
      abort();
  if (fds[5] < 0)
    abort();
  close(fds[5]);
  gshm_list_foreach(pos, &reg.segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    nseg++;
    bytes += seg->mem->size;
    if (gshmd_registry_find_id(&reg, seg->id) != seg)
      abort();
    if (!seg->unlinked && gshmd_registry_find_name(&reg, seg->name) != seg)
      abort();
  }
  if (nseg != reg.nsegments || bytes != reg.bytes || nseg > 3)
    abort();
  gshmd_fdstore_shutdown(&fs);
  gshmd_registry_destroy(&reg);
  reg.host->ops->destroy(reg.host);
  return 0;
}
