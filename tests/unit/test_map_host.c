/* SPDX-License-Identifier: Apache-2.0 */
/* client/map.c against a daemon reply that lies about a host segment:
 * the lease is built here as gshm__lease_from_grant builds it from a
 * grant (its info from the reply, the fd that came with it), and map.c
 * is linked alone, with the client's other parts stubbed (no daemon, no
 * driver).  A size past the memfd's end used to be mapped as it was and
 * the first gshm_read of the tail took SIGBUS; an unsealed fd could be
 * shrunk under the mapping by any holder of a writable fd. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* ---- the rest of libgshm, stubbed ---- */

int gshm__client_lock(struct gshm_client *c) {
  pthread_mutex_lock(&c->lock);
  return 0;
}
int gshm__client_unlock(struct gshm_client *c) {
  pthread_mutex_unlock(&c->lock);
  return 0;
}
void gshm__last_error_local(struct gshm_client *c) { (void)c; }
int gshm__drain_events(struct gshm_client *c, bool wait) {
  (void)c, (void)wait;
  return 0;
}
void gshm__report_mapping(struct gshm_client *c, struct gshm__lease *l, char **uuids, size_t n,
                          bool unmapped) {
  (void)c, (void)l, (void)uuids, (void)n, (void)unmapped;
}
int gshm__map_device(struct gshm__lease *l, const int *devices, size_t ndevices,
                     char ***uuids_out, size_t *n_out) {
  (void)l, (void)devices, (void)ndevices, (void)uuids_out, (void)n_out;
  return -ENOTSUP;
}
int gshm__map_device_add(struct gshm__lease *l, const int *devices, size_t ndevices,
                         char ***uuids_out, size_t *n_out) {
  (void)l, (void)devices, (void)ndevices, (void)uuids_out, (void)n_out;
  return -ENOTSUP;
}
int gshm__unmap_device(struct gshm__lease *l) {
  (void)l;
  return 0;
}
int gshm__device_rw(struct gshm__lease *l, uint64_t offset, void *host, size_t bytes, bool write) {
  (void)l, (void)offset, (void)host, (void)bytes, (void)write;
  return -ENOTSUP;
}

/* ---- a lease as a grant makes it ---- */

struct fixture {
  struct gshm_client client;
  struct gshm__lease lease;
  struct gshm_segment seg;
};

/* A host segment's lease whose reply said `claimed` bytes, on a memfd of
 * `real` bytes with `seals`, filled with a byte pattern. */
static struct fixture *fixture_new(uint64_t claimed, uint64_t real, int seals) {
  struct fixture *f = calloc(1, sizeof(*f));
  int fd = memfd_create("test-map-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);

  assert_non_null(f);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)real), 0);
  for (uint64_t off = 0; off < real; off += 4096) {
    unsigned char b = (unsigned char)(off / 4096 + 1);
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
  }
  if (seals)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
  pthread_mutex_init(&f->client.lock, NULL);
  f->client.fd = -1;
  f->lease.client = &f->client;
  f->lease.lease_id = 7;
  f->lease.access = GSHM_ACCESS_READ_WRITE;
  f->lease.fd = fd;
  f->lease.refs = 1;
  f->lease.info.size = claimed;
  f->lease.info.requested_size = claimed;
  f->lease.info.granularity = 4096;
  f->lease.info.device_index = -1;
  snprintf(f->lease.info.name, sizeof(f->lease.info.name), "lying/host");
  snprintf(f->lease.info.location, sizeof(f->lease.info.location), "host");
  f->seg.lease = &f->lease;
  f->lease.segs = &f->seg;
  return f;
}

static void fixture_free(struct fixture *f) {
  assert_int_equal(gshm_unmap(&f->seg), 0);
  if (f->lease.addr) /* a gshm_read's own mapping is never left behind */
    fail_msg("a mapping outlived its last user");
  close(f->lease.fd);
  pthread_mutex_destroy(&f->client.lock);
  free(f);
}

/* ---- tests ---- */

/* What gshmd sends (a sealed memfd of the reply's size) maps and reads. */
static void test_honest_reply_maps(void **state) {
  struct fixture *f = fixture_new(64 * KiB, 64 * KiB, SEALS);
  unsigned char b = 0;
  void *addr = NULL;
  (void)state;

  assert_int_equal(gshm_read(&f->seg, 12 * KiB, &b, 1), 0);
  assert_int_equal(b, 4); /* page 3 */
  assert_int_equal(gshm_map(&f->seg, NULL, 0, &addr), 0);
  assert_int_equal(((unsigned char *)addr)[60 * KiB], 16);
  fixture_free(f);
}

/* A reply that claims more bytes than the fd holds: -EPROTO from gshm_map
 * and gshm_read, never a mapping past the file's end (the read of its
 * tail used to die of SIGBUS). */
static void test_size_past_the_fd_is_refused(void **state) {
  struct fixture *f = fixture_new(1024 * MiB, 64 * KiB, SEALS);
  unsigned char b = 0;
  void *addr = NULL;
  (void)state;

  assert_int_equal(gshm_read(&f->seg, 512 * MiB, &b, 1), -EPROTO);
  assert_int_equal(gshm_read(&f->seg, 0, &b, 1), -EPROTO);
  assert_int_equal(gshm_map(&f->seg, NULL, 0, &addr), -EPROTO);
  assert_null(addr);
  assert_null(f->lease.addr);
  fixture_free(f);
}

/* An fd that can shrink (no F_SEAL_SHRINK) is refused: any holder of a
 * writable fd could truncate it under every mapping. */
static void test_unsealed_fd_is_refused(void **state) {
  struct fixture *f = fixture_new(64 * KiB, 64 * KiB, 0);
  unsigned char b = 0;
  void *addr = NULL;
  (void)state;

  assert_int_equal(gshm_map(&f->seg, NULL, 0, &addr), -EPROTO);
  assert_int_equal(gshm_read(&f->seg, 0, &b, 1), -EPROTO);
  fixture_free(f);
  /* sealed against growth only: still refused */
  f = fixture_new(64 * KiB, 64 * KiB, F_SEAL_GROW);
  assert_int_equal(gshm_map(&f->seg, NULL, 0, &addr), -EPROTO);
  fixture_free(f);
}

/* A reply of size 0 for a host segment is the daemon's error too. */
static void test_size_zero_is_refused(void **state) {
  struct fixture *f = fixture_new(0, 64 * KiB, SEALS);
  void *addr = NULL;
  (void)state;

  assert_int_equal(gshm_map(&f->seg, NULL, 0, &addr), -EPROTO);
  fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_honest_reply_maps),
      cmocka_unit_test(test_size_past_the_fd_is_refused),
      cmocka_unit_test(test_unsealed_fd_is_refused),
      cmocka_unit_test(test_size_zero_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
