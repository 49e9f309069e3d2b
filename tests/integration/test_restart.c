/* SPDX-License-Identifier: Apache-2.0 */
/* Restart without losing a byte (issue 4): the harness plays systemd's
 * part (NOTIFY_SOCKET with FDSTORE, LISTEN_FDS on the next start). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"
#include "raw.h"

static const uint64_t sizes[] = {4096, (1u << 20) + 3, 8u << 20};
#define NSEG (sizeof(sizes) / sizeof(sizes[0]))

static void check_bytes(gshm_segment_t *s, uint64_t size, unsigned long long seed) {
  unsigned char *got = malloc(size), *want = malloc(size);
  harness_random(want, size, seed);
  assert_int_equal(gshm_read(s, 0, got, size), 0);
  assert_memory_equal(got, want, size);
  free(got);
  free(want);
}

/* Creates name (mode 0640) filled with size random bytes of seed, the
 * counterpart of check_bytes. */
static gshm_segment_t *create_filled(gshm_client_t *c, const char *name, uint64_t size,
                                     unsigned long long seed) {
  unsigned char *buf = malloc(size);
  gshm_segment_t *s;
  assert_non_null(buf);
  assert_int_equal(gshm_create(c, name, size, NULL, 0640, 0, &s), 0);
  harness_random(buf, size, seed);
  assert_int_equal(gshm_write(s, 0, buf, size), 0);
  free(buf);
  return s;
}

static bool stored(struct harness *h, const char *name) {
  bool found = false;
  pthread_mutex_lock(&h->sp.lock);
  for (int i = 0; i < h->sp.nfds; i++)
    found |= !strcmp(h->sp.names[i], name);
  pthread_mutex_unlock(&h->sp.lock);
  return found;
}

/* Whether the last STATUS= contains text (read under the notify thread's
 * lock: it rewrites the string). */
static bool status_has(struct harness *h, const char *text) {
  bool has;
  pthread_mutex_lock(&h->sp.lock);
  has = strstr(h->sp.status, text) != NULL;
  pthread_mutex_unlock(&h->sp.lock);
  return has;
}

static void kill_and_restart(bool activated) {
  struct harness h;
  gshm_client_t *c, *fresh;
  gshm_segment_t *segs[NSEG], *gone, *s, *extra;
  gshm_segment_info_t before[NSEG], *list;
  unsigned long long seed = (unsigned long long)time(NULL);
  uint8_t *mapped;
  size_t n;
  char name[32];

  assert_int_equal(activated ? harness_start_activated(&h, NULL) : harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "survivor", &c), 0);
  for (size_t i = 0; i < NSEG; i++) {
    snprintf(name, sizeof(name), "keep/%zu", i);
    segs[i] = create_filled(c, name, sizes[i], seed + i);
    before[i] = *gshm_segment_info(segs[i]);
  }
  /* Freed before the crash: must not come back. */
  assert_int_equal(gshm_create(c, "gone", 4096, NULL, 0600, 0, &gone), 0);
  assert_int_equal(gshm_close(gone), 0);
  assert_int_equal(gshm_unlink(c, "gone"), 0);
  /* A mapping held across the restart. */
  assert_int_equal(gshm_map(segs[0], NULL, 0, (void **)&mapped), 0);

  /* Nothing kept in the store for the freed segment any more. */
  gshm__spawn_poll(&h.sp, 0);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), NSEG);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  /* READY came after the restore: the status sent with it counts them. */
  assert_true(status_has(&h, "3 segments"));

  assert_int_equal(gshm_connect(h.socket_path, "fresh", &fresh), 0);
  assert_int_equal(gshm_list(fresh, &list, &n), 0);
  assert_int_equal(n, NSEG);
  for (size_t i = 0; i < NSEG; i++) {
    assert_string_equal(list[i].name, before[i].name);
    assert_int_equal(list[i].id, before[i].id);
    assert_int_equal(list[i].generation, before[i].generation);
    assert_int_equal(list[i].size, before[i].size);
    assert_int_equal(list[i].requested_size, before[i].requested_size);
    assert_int_equal(list[i].mode, 0640);
    assert_int_equal(gshm_open(fresh, before[i].name, GSHM_ACCESS_READ, &s), 0);
    check_bytes(s, sizes[i], seed + i);
    gshm_close(s);
  }
  gshm_free(list);

  /* The old client: its mapping still works, in both directions... */
  mapped[0] ^= 0xff;
  {
    unsigned char b;
    assert_int_equal(gshm_open(fresh, "keep/0", GSHM_ACCESS_READ, &s), 0);
    assert_int_equal(gshm_read(s, 0, &b, 1), 0);
    assert_int_equal(b, mapped[0]);
    gshm_close(s);
  }
  /* ...and it reconnects on its next request, re-takes its leases and
   * can open and create. */
  assert_int_equal(gshm_create(c, "after", 4096, NULL, 0600, 0, &extra), 0);
  {
    gshm_lease_info_t *leases;
    size_t nl, mine = 0;
    assert_int_equal(gshm_list_leases(fresh, &leases, &nl), 0);
    for (size_t i = 0; i < nl; i++)
      mine += !strcmp(leases[i].client_name, "survivor");
    assert_int_equal(mine, NSEG + 1); /* re-taken + the new one */
    gshm_free(leases);
  }
  /* New ids continue after the restored ones. */
  assert_true(gshm_segment_info(extra)->id > before[NSEG - 1].id + 1);
  gshm_close(extra);
  for (size_t i = 0; i < NSEG; i++)
    gshm_close(segs[i]);
  gshm_disconnect(c);
  gshm_disconnect(fresh);
  assert_int_equal(harness_stop(&h), 0);
}

static void test_sigkill_restart(void **state) {
  (void)state;
  kill_and_restart(false);
}

static void test_sigkill_restart_socket_activated(void **state) {
  (void)state;
  kill_and_restart(true);
}

/* The store holds one bucket (two fds) for a few segments, one ids record,
 * the journal and the lease tokens' key, whatever happened before; a change rewrites the
 * bucket's datagram, a free takes the memory out of it: no new name. */
static void test_freed_entries_leave_the_store(void **state) {
  struct harness h;
  gshm_client_t *c;
  gshm_segment_t *s, *t;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "store", &c), 0);
  assert_int_equal(gshm_create(c, "tmp", 4096, NULL, 0600, 0, &s), 0);
  assert_int_equal(gshm_create(c, "tmp2", 4096, NULL, 0600, 0, &t), 0);
  gshm__spawn_poll(&h.sp, 200);
  assert_true(stored(&h, "b0a") && stored(&h, "b0b"));
  assert_int_equal(harness_store_count(&h, "b"), 2);
  assert_int_equal(harness_store_count(&h, "ids-"), 1);
  assert_true(stored(&h, "journal2"));
  assert_true(stored(&h, "leasekey"));
  assert_int_equal(h.sp.nfds, 5);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 2);
  pthread_mutex_lock(&h.sp.lock);
  for (int i = 0; i < h.sp.nfds; i++) /* systemd must not drop an end on POLLHUP */
    assert_true(h.sp.nopoll[i] == (!strncmp(h.sp.names[i], "b", 1) ||
                                    !strcmp(h.sp.names[i], "leasekey")));
  pthread_mutex_unlock(&h.sp.lock);
  assert_int_equal(gshm_chmod(c, "tmp", 0640), 0);
  gshm__spawn_poll(&h.sp, 200);
  assert_int_equal(h.sp.nfds, 5);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 2);
  gshm_close(s);
  assert_int_equal(gshm_unlink(c, "tmp"), 0);
  gshm__spawn_poll(&h.sp, 200);
  assert_int_equal(h.sp.nfds, 5);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 1);
  gshm_close(t);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* The inode of the socket stored as name (0: none stored). */
static ino_t stored_inode(struct harness *h, const char *name) {
  struct stat st;
  ino_t ino = 0;

  pthread_mutex_lock(&h->sp.lock);
  for (int i = 0; i < h->sp.nfds; i++)
    if (!strcmp(h->sp.names[i], name) && fstat(h->sp.fds[i], &st) == 0)
      ino = st.st_ino;
  pthread_mutex_unlock(&h->sp.lock);
  return ino;
}

/* Polls the store until it holds no bucket; false after 5 s. */
static bool no_bucket_within_5s(struct harness *h) {
  for (int i = 0; i < 100 && harness_store_count(h, "b"); i++)
    gshm__spawn_poll(&h->sp, 50);
  return !harness_store_count(h, "b");
}

/* The last bucket, emptied by a free, stays stored while segments come
 * and go (a weight update that unlinks its copy and pulls the next; a
 * bench that pulls and unlinks one at a time): the next create is placed
 * in the same bucket (the same socket), with no FDSTOREREMOVE and no new
 * socketpair and FDSTORE=1 (62 + 48 us of the loop a pull on the 2-core
 * VM).  Once empty for a second it leaves the store (a gshmd with no
 * segments holds no bucket), and a restart that finds it empty adopts
 * it and lets it go the same way.  Before, the free removed it and the
 * next create made a new one (another socket under the same name). */
static void test_emptied_bucket_stays_a_while(void **state) {
  struct harness h;
  gshm_client_t *c;
  gshm_segment_t *s;
  ino_t ino;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "churn", &c), 0);
  assert_int_equal(gshm_create(c, "w", 4096, NULL, 0600, 0, &s), 0);
  gshm__spawn_poll(&h.sp, 200);
  assert_true((ino = stored_inode(&h, "b0a")) != 0);
  for (int i = 0; i < 3; i++) { /* (freed, then made again at once) */
    gshm_close(s);
    assert_int_equal(gshm_unlink(c, "w"), 0);
    assert_int_equal(gshm_create(c, "w", 4096, NULL, 0600, 0, &s), 0);
  }
  gshm__spawn_poll(&h.sp, 200);
  assert_true(stored_inode(&h, "b0a") == ino);
  assert_int_equal(harness_store_count(&h, "b"), 2);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 1);
  gshm_close(s);
  assert_int_equal(gshm_unlink(c, "w"), 0);
  gshm__spawn_poll(&h.sp, 50);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 0);
  assert_true(no_bucket_within_5s(&h));
  /* emptied again, and gshmd killed before it left: adopted empty */
  assert_int_equal(gshm_create(c, "w", 4096, NULL, 0600, 0, &s), 0);
  gshm_close(s);
  assert_int_equal(gshm_unlink(c, "w"), 0);
  gshm__spawn_poll(&h.sp, 50);
  assert_int_equal(harness_store_count(&h, "b"), 2);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_true(status_has(&h, "0 segments"));
  assert_true(no_bucket_within_5s(&h));
  assert_int_equal(gshm_create(c, "after", 4096, NULL, 0600, 0, &s), 0); /* (reconnects) */
  gshm__spawn_poll(&h.sp, 200);
  assert_int_equal(harness_store_count(&h, "b"), 2);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 1);
  gshm_close(s);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* gshmd's fds_held metric: the memory fds queued in its buckets; past
 * 1,024 (the usual soft RLIMIT_NOFILE) one notice says what they cost
 * its uid (fds in flight: ETOOMANYREFS for that uid's capless processes
 * below that limit, docs/SECURITY.md).  Back to 0 once they are freed. */
static unsigned long long fds_held_within_3s(gshm_client_t *c, unsigned long long want) {
  unsigned long long v = ~0ull;

  for (int i = 0; i < 300 && v != want; i++) {
    char *text = NULL, *at;
    if (i)
      nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    assert_int_equal(gshm_metrics(c, &text), 0);
    assert_non_null(at = strstr(text, "\ngshm_fdstore_fds_held "));
    v = strtoull(at + strlen("\ngshm_fdstore_fds_held "), NULL, 10);
    gshm_free(text);
  }
  return v;
}

static void test_fds_held_counted_and_said(void **state) {
  char path[] = "/tmp/gshm-test-held-XXXXXX", line[1024], name[32];
  enum { N = 1100 };
  gshm_segment_t *seg;
  unsigned said = 0;
  struct harness h;
  gshm_client_t *c;
  FILE *f;

  (void)state;
  assert_int_equal(harness_start_logged(&h, NULL, path), 0); /* (its log into the file) */
  assert_int_equal(gshm_connect(h.socket_path, "held", &c), 0);
  for (int i = 0; i < 1000; i++) { /* (closed: this process has 1,024 fds) */
    snprintf(name, sizeof(name), "held/%d", i);
    assert_int_equal(gshm_create(c, name, 4096, NULL, 0600, 0, &seg), 0);
    gshm_close(seg);
  }
  assert_int_equal(fds_held_within_3s(c, 1000), 1000);
  for (int i = 1000; i < N; i++) { /* (closed: this process has 1,024 fds) */
    snprintf(name, sizeof(name), "held/%d", i);
    assert_int_equal(gshm_create(c, name, 4096, NULL, 0600, 0, &seg), 0);
    gshm_close(seg);
  }
  assert_int_equal(fds_held_within_3s(c, N), N);
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof(name), "held/%d", i);
    assert_int_equal(gshm_unlink(c, name), 0);
  }
  assert_int_equal(fds_held_within_3s(c, 0), 0);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
  assert_non_null(f = fopen(path, "re"));
  while (fgets(line, sizeof(line), f)) {
    const char *at = strstr(line, " segment fds are queued in its buckets, counted by the "
                                  "kernel as fds in flight of uid");
    if (!at)
      continue;
    while (at > line && at[-1] >= '0' && at[-1] <= '9') /* (the count, as the tick found it) */
      at--;
    assert_in_range(strtoul(at, NULL, 10), 1025, N);
    said++;
  }
  fclose(f);
  unlink(path);
  assert_int_equal(said, 1);
}

/* An unlinked segment still leased when gshmd dies (sig SIGKILL) or is
 * restarted gracefully (SIGTERM: systemctl restart; the connections end at
 * stop, which frees the segment in the registry, but its memory and record
 * stay parked) comes back unlinked; its holder re-takes the lease and
 * keeps it; ids stay unique. */
static void unlinked_but_leased_survives(int sig) {
  struct harness h;
  gshm_client_t *c, *other;
  gshm_segment_t *s, *fresh;
  gshm_segment_info_t info;
  unsigned char b = 0;
  uint64_t old_id;

  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "holder", &c), 0);
  assert_int_equal(gshm_create(c, "held", 4096, NULL, 0600, 0, &s), 0);
  assert_int_equal(gshm_write(s, 0, "\x5a", 1), 0);
  old_id = gshm_segment_info(s)->id;
  assert_int_equal(gshm_unlink(c, "held"), 0);
  assert_int_equal(harness_restart(&h, sig, NULL), 0);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 1);
  assert_int_equal(gshm_stat(s, &info), 0); /* reconnects, re-takes */
  assert_true(info.unlinked);
  assert_int_equal(gshm_read(s, 0, &b, 1), 0);
  assert_int_equal(b, 0x5a);
  assert_int_equal(gshm_connect(h.socket_path, "other", &other), 0);
  assert_int_equal(gshm_create(other, "held", 4096, NULL, 0600, 0, &fresh), 0);
  assert_true(gshm_segment_info(fresh)->id > old_id);
  gshm_close(fresh);
  gshm_close(s);
  gshm_disconnect(other);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

static void test_unlinked_but_leased_survives(void **state) {
  (void)state;
  unlinked_but_leased_survives(SIGKILL);
}

static void test_unlinked_but_leased_survives_sigterm(void **state) {
  (void)state;
  unlinked_but_leased_survives(SIGTERM);
}

/* Two restarts in a row within the grace period: an unlinked segment
 * whose only holder has not reconnected after the first (restored, kept
 * unleased by the grace period) is still there after the second, and
 * again after a third that follows the holder's re-take; the holder reads
 * its byte each time; ids stay unique. */
static void test_unlinked_leased_two_restarts_in_grace(void **state) {
  struct harness h;
  gshm_client_t *owner, *reader, *other;
  gshm_segment_t *s, *r, *fresh;
  gshm_segment_info_t info;
  unsigned char b = 0;
  uint64_t id;
  (void)state;

  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "owner", &owner), 0);
  assert_int_equal(gshm_connect(h.socket_path, "reader", &reader), 0);
  assert_int_equal(gshm_create(owner, "held2", 4096, NULL, 0644, 0, &s), 0);
  assert_int_equal(gshm_write(s, 0, "\x5a", 1), 0);
  id = gshm_segment_info(s)->id;
  assert_int_equal(gshm_open(reader, "held2", GSHM_ACCESS_READ, &r), 0);
  assert_int_equal(gshm_close(s), 0);
  assert_int_equal(gshm_unlink(owner, "held2"), 0);
  gshm_disconnect(owner);
  /* the reader does nothing between these two */
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 1);
  assert_int_equal(gshm_stat(r, &info), 0); /* reconnects, re-takes */
  assert_true(info.unlinked && info.id == id && info.leases == 1);
  assert_int_equal(gshm_read(r, 0, &b, 1), 0);
  assert_int_equal(b, 0x5a);
  /* and once more, after the re-take */
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  b = 0;
  assert_int_equal(gshm_read(r, 0, &b, 1), 0);
  assert_int_equal(b, 0x5a);
  assert_int_equal(gshm_stat(r, &info), 0);
  assert_true(info.unlinked && info.id == id && info.leases == 1);
  assert_int_equal(gshm_connect(h.socket_path, "other", &other), 0);
  assert_int_equal(gshm_create(other, "held2", 4096, NULL, 0600, 0, &fresh), 0);
  assert_true(gshm_segment_info(fresh)->id > id);
  assert_int_equal(gshm_stat_name(other, "held2", &info), 0);
  assert_true(info.id == gshm_segment_info(fresh)->id && !info.unlinked);
  gshm_close(fresh);
  gshm_close(r);
  gshm_disconnect(other);
  gshm_disconnect(reader);
  assert_int_equal(harness_stop(&h), 0);
}

/* The largest lease id among this client's view of the leases. */
static uint64_t max_lease_id(gshm_client_t *c) {
  gshm_lease_info_t *leases;
  size_t n;
  uint64_t max = 0;

  assert_int_equal(gshm_list_leases(c, &leases, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (leases[i].lease_id > max)
      max = leases[i].lease_id;
  gshm_free(leases);
  return max;
}

/* Lease ids handed out after a restart are above every one handed out
 * before it, also when far more leases than segments were taken (the ids
 * record is renewed as lease ids advance, not only on segment creation:
 * 16 x 4096 = 65536 lease ids are reserved per record). */
static void test_lease_ids_unique_across_restart(void **state) {
  struct harness h;
  gshm_client_t *c, *fresh;
  gshm_segment_t *s, *again;
  uint64_t before;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "churn", &c), 0);
  assert_int_equal(gshm_create(c, "churned", 4096, NULL, 0644, 0, &s), 0);
  for (int i = 0; i < 16 * 4096 + 64; i++) {
    assert_int_equal(gshm_open(c, "churned", GSHM_ACCESS_READ, &again), 0);
    assert_int_equal(gshm_close(again), 0);
  }
  assert_int_equal(gshm_open(c, "churned", GSHM_ACCESS_READ, &again), 0);
  before = max_lease_id(c);
  assert_true(before > 16 * 4096);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &fresh), 0);
  gshm_close(again); /* c reconnects: its lease on s is re-taken first */
  {
    gshm_segment_t *mine;
    uint64_t after;
    assert_int_equal(gshm_open(fresh, "churned", GSHM_ACCESS_READ, &mine), 0);
    after = max_lease_id(fresh);
    assert_true(after > before);
    gshm_close(mine);
  }
  gshm_close(s);
  gshm_disconnect(fresh);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* A client that held a segment across a restart, during which another
 * client unlinked and re-created the name, gets the new segment from its
 * next open: the lease cache is not consulted before the connection is
 * found dead and the leases re-taken (the old one is gone: not served). */
static void test_open_after_restart_sees_new_generation(void **state) {
  struct harness h;
  gshm_client_t *a, *b;
  gshm_segment_t *old, *fresh, *got;
  gshm_segment_info_t before;
  unsigned char v = 0;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "a", &a), 0);
  assert_int_equal(gshm_create(a, "x", 4096, NULL, 0666, 0, &old), 0);
  assert_int_equal(gshm_write(old, 0, "\x11", 1), 0);
  before = *gshm_segment_info(old);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "b", &b), 0);
  assert_int_equal(gshm_unlink(b, "x"), 0);
  assert_int_equal(gshm_create(b, "x", 4096, NULL, 0666, 0, &fresh), 0);
  assert_int_equal(gshm_write(fresh, 0, "\x22", 1), 0);
  /* a's first request since the restart */
  assert_int_equal(gshm_open(a, "x", GSHM_ACCESS_READ_WRITE, &got), 0);
  assert_int_equal(gshm_segment_info(got)->id, gshm_segment_info(fresh)->id);
  assert_true(gshm_segment_info(got)->generation > before.generation);
  assert_int_equal(gshm_read(got, 0, &v, 1), 0);
  assert_int_equal(v, 0x22);
  gshm_close(got);
  gshm_close(old);
  gshm_close(fresh);
  gshm_disconnect(a);
  gshm_disconnect(b);
  assert_int_equal(harness_stop(&h), 0);
}

/* gshm_close as the first request after a restart ends the lease: the
 * reconnect inside it must not re-take the lease being closed. */
static void test_close_after_restart_ends_the_lease(void **state) {
  struct harness h;
  gshm_client_t *a, *viewer;
  gshm_segment_t *y;
  gshm_lease_info_t *leases;
  size_t n;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "closer", &a), 0);
  assert_int_equal(gshm_create(a, "y", 4096, NULL, 0600, 0, &y), 0);
  assert_int_equal(gshm_unlink(a, "y"), 0);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_close(y), 0);
  assert_int_equal(gshm_connect(h.socket_path, "viewer", &viewer), 0);
  assert_int_equal(gshm_list_leases(viewer, &leases, &n), 0);
  for (size_t i = 0; i < n; i++)
    assert_string_not_equal(leases[i].client_name, "closer");
  gshm_free(leases);
  /* (the restored segment, unlinked and now unleased, is freed by the
   * daemon's reap 30 s after the restart: not waited for here) */
  gshm_disconnect(viewer);
  gshm_disconnect(a);
  assert_int_equal(harness_stop(&h), 0);
}

/* WATCHDOG=1 comes from the loop at half the WatchdogSec period, and the
 * STATUS= line follows what the daemon holds. */
static void test_watchdog_and_status(void **state) {
  struct harness h;
  gshm_client_t *c;
  gshm_segment_t *s;
  unsigned pings;

  (void)state;
  setenv("WATCHDOG_USEC", "100000", 1); /* 100 ms: a ping every 50 ms */
  assert_int_equal(harness_start(&h, NULL), 0);
  unsetenv("WATCHDOG_USEC");
  usleep(600 * 1000);
  pthread_mutex_lock(&h.sp.lock);
  pings = h.sp.watchdog_pings;
  pthread_mutex_unlock(&h.sp.lock);
  assert_true(pings >= 5);
  assert_int_equal(gshm_connect(h.socket_path, "status", &c), 0);
  assert_int_equal(gshm_create(c, "st", 4096, NULL, 0600, 0, &s), 0);
  for (int i = 0; i < 30; i++) { /* STATUS= is refreshed once a second */
    bool seen;
    usleep(100 * 1000);
    seen = status_has(&h, "1 client, 1 segment, 4 KiB, 1 lease"); /* not "1 clients" */
    if (seen)
      break;
    assert_true(i < 29);
  }
  gshm_close(s);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* Issue 15 item 7: segments whose names no longer fit in one reply under
 * the limits of the next start (4000-byte names, then limits.max_packet
 * 4096) are still listed, each alone on its page: a listing never ends
 * before its last item. */
static void test_listing_never_ends_early(void **state) {
  static char names[3][4001];
  gshm_segment_info_t *infos = NULL;
  struct harness h;
  gshm_client_t *c;
  size_t n = 0;

  (void)state;
  assert_int_equal(harness_start(&h, (const char *const[]){"--set", "limits.max_name=4095", NULL}),
                   0);
  /* libgshm refuses names over 255 bytes: the raw protocol makes them */
  {
    int fd = raw_connect(h.socket_path);

    for (int i = 0; i < 3; i++) {
      Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
      Gshm__Reply *r;

      memset(names[i], 'a' + i, 4000);
      names[i][4000] = '\0';
      cr.name = names[i];
      cr.size = 4096;
      cr.location = "host";
      cr.mode = 0644;
      assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_CREATE, 2 + (uint32_t)i, &cr.base, -1), 0);
      r = raw_reply(fd);
      assert_int_equal(r->status, GSHM__STATUS__STATUS_OK);
      gshm__reply__free_unpacked(r, NULL);
    }
    close(fd);
  }
  assert_int_equal(harness_restart(&h, SIGKILL, (const char *const[]){"--set",
                                                                      "limits.max_packet=4096",
                                                                      NULL}),
                   0);
  assert_int_equal(gshm_connect(h.socket_path, "lister", &c), 0);
  assert_int_equal(gshm_list(c, &infos, &n), 0);
  print_message("    listed %zu of 3 segments with 4000-byte names at max_packet 4096\n", n);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < n; i++) /* gshm_segment_info_t keeps 255 bytes of a name */
    assert_int_equal(strncmp(infos[i].name, names[i], strlen(infos[i].name)), 0);
  gshm_free(infos);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* Issue 15 item 2: store sends that fail (gshmd at its fd limit: sd_notify
 * cannot open its socket, the record memfd cannot be made) are resent once
 * fds are free again (retry timer, then the next store event), so a
 * SIGKILL restart gives exactly the state before the kill: the segment
 * unlinked meanwhile stays gone, the chmod holds, the new segment is back,
 * bytes intact.  Before the fix the unlinked segment came back and the
 * chmod was undone. */
static void test_failed_store_sends_are_resent(void **state) {
  static const char *const names[] = {"a/unlinked", "a/chmodded", "a/kept", "a/new"};
  struct harness h;
  gshm_client_t *c, *fresh;
  gshm_segment_t *s[4];
  gshm_segment_info_t *list;
  struct rlimit orig, tight;
  unsigned long long seed = (unsigned long long)time(NULL);
  size_t n;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "store", &c), 0);
  for (int i = 0; i < 3; i++)
    s[i] = create_filled(c, names[i], 8192, seed + (unsigned)i);
  assert_int_equal(gshm_close(s[0]), 0);
  gshm__spawn_poll(&h.sp, 200);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 3);

  /* No fd left to gshmd: every store notification fails. */
  assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, NULL, &orig), 0);
  tight.rlim_cur = (rlim_t)harness_lowest_free_fd(h.sp.pid, 0);
  tight.rlim_max = orig.rlim_max;
  assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, &tight, NULL), 0);
  assert_int_equal(gshm_chmod(c, names[1], 0604), 0);
  /* (Freeing it frees fds: the retry may succeed from here on.) */
  assert_int_equal(gshm_unlink(c, names[0]), 0);
  assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, &orig, NULL), 0);

  /* The retry timer (1 s) resends without any further request. */
  for (int i = 0; i < 50 && gshm__spawn_store_memory_fds(&h.sp) != 2; i++)
    gshm__spawn_poll(&h.sp, 100);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 2);
  assert_int_equal(gshm_create(c, names[3], 4096, NULL, 0600, 0, &s[3]), 0);
  assert_int_equal(gshm_write(s[3], 0, "new", 3), 0);
  gshm__spawn_poll(&h.sp, 200);
  assert_false(status_has(&h, "fd store behind"));

  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &fresh), 0);
  assert_int_equal(gshm_list(fresh, &list, &n), 0);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(list[i].name, names[i + 1]);
    assert_int_equal(list[i].mode, i == 0 ? 0604 : i == 1 ? 0640 : 0600);
  }
  gshm_free(list);
  for (int i = 1; i < 3; i++) {
    gshm_segment_t *o;
    assert_int_equal(gshm_open(fresh, names[i], GSHM_ACCESS_READ, &o), 0);
    check_bytes(o, 8192, seed + (unsigned)i);
    gshm_close(o);
  }
  {
    gshm_segment_t *o;
    char got[3];
    assert_int_equal(gshm_open(fresh, names[3], GSHM_ACCESS_READ, &o), 0);
    assert_int_equal(gshm_read(o, 0, got, 3), 0);
    assert_memory_equal(got, "new", 3);
    gshm_close(o);
  }
  for (int i = 1; i < 4; i++)
    gshm_close(s[i]);
  gshm_disconnect(fresh);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* Issue 15 item 2, the part a retry cannot cover: gshmd is SIGKILLed while
 * the store is still behind (its fd limit so low that no notification can
 * be sent: no socket, no record memfd).  The journal, a memfd stored at
 * start and rewritten in place, carries what the store missed, so the
 * restart gives exactly the state before the kill: the segment unlinked
 * while the store failed stays gone, the chmod and chown hold, the other segment
 * and every byte are back, and no id is handed out twice.  Before the
 * journal (74cede6) the unlinked segment came back under its name and the
 * chmod was undone. */
static void test_sigkill_while_the_store_is_behind(void **state) {
  static const char *const names[] = {"b/unlinked", "b/chmodded", "b/kept"};
  struct harness h;
  gshm_client_t *c, *fresh;
  gshm_segment_t *s[3], *held;
  gshm_segment_info_t *list;
  struct rlimit orig, none;
  unsigned long long seed = (unsigned long long)time(NULL) ^ 0x5eedULL;
  uint64_t last_id, last_gen;
  size_t n;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  assert_true(stored(&h, "journal2"));
  assert_int_equal(gshm_connect(h.socket_path, "store", &c), 0);
  for (int i = 0; i < 3; i++)
    s[i] = create_filled(c, names[i], 8192, seed + (unsigned)i);
  last_id = gshm_segment_info(s[2])->id;
  last_gen = gshm_segment_info(s[2])->generation;
  assert_int_equal(gshm_close(s[0]), 0);
  gshm__spawn_poll(&h.sp, 200);

  /* No new fd at all from here to the kill: every send fails. */
  assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, NULL, &orig), 0);
  none.rlim_cur = 0;
  none.rlim_max = orig.rlim_max;
  assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, &none, NULL), 0);
  assert_int_equal(gshm_unlink(c, names[0]), 0);
  assert_int_equal(gshm_chmod(c, names[1], 0604), 0);
  assert_int_equal(gshm_chown(c, names[1], HARNESS_NOBODY, HARNESS_NOBODY), 0);
  /* An unlinked segment still leased: restored as unlinked, never by name. */
  assert_int_equal(gshm_unlink(c, names[2]), 0);
  held = s[2];
  /* A create cannot even make its memory: refused, nothing half-made. */
  assert_int_not_equal(gshm_create(c, "b/new", 4096, NULL, 0600, 0, &s[0]), 0);
  gshm__spawn_poll(&h.sp, 1500); /* a retry tick, which fails too (and so
                                  * does STATUS=: sd_notify needs an fd) */
  /* the store is behind: the bucket still holds the unlinked segment */
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 3);

  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &fresh), 0);
  assert_int_equal(gshm_list(fresh, &list, &n), 0);
  assert_int_equal(n, 2); /* (a listing shows unlinked segments too) */
  assert_string_equal(list[0].name, names[1]);
  assert_int_equal(list[0].mode, 0604);
  assert_true(list[0].uid == HARNESS_NOBODY && list[0].gid == HARNESS_NOBODY); /* (the chown) */
  assert_false(list[0].unlinked);
  assert_string_equal(list[1].name, names[2]);
  assert_true(list[1].unlinked);
  gshm_free(list);
  {
    gshm_segment_info_t info;
    assert_int_equal(gshm_stat(held, &info), 0); /* reconnects, re-takes */
    assert_true(info.unlinked);
    check_bytes(held, 8192, seed + 2);
  }
  assert_int_equal(gshm_open(fresh, names[0], GSHM_ACCESS_READ, &s[0]), -ENOENT);
  assert_int_equal(gshm_open(fresh, names[2], GSHM_ACCESS_READ, &s[0]), -ENOENT);
  {
    gshm_segment_t *o;
    assert_int_equal(gshm_open(fresh, names[1], GSHM_ACCESS_READ, &o), 0);
    check_bytes(o, 8192, seed + 1);
    gshm_close(o);
  }
  /* New ids and generations are above every one handed out before. */
  {
    gshm_segment_t *o;
    assert_int_equal(gshm_create(fresh, "b/after", 4096, NULL, 0600, 0, &o), 0);
    assert_true(gshm_segment_info(o)->id > last_id);
    assert_true(gshm_segment_info(o)->generation > last_gen);
    gshm_close(o);
  }
  /* Caught up: the stale entries left the store. */
  for (int i = 0; i < 30 && status_has(&h, "fd store behind"); i++)
    gshm__spawn_poll(&h.sp, 100);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 3); /* chmodded, held, after */
  assert_false(status_has(&h, "fd store behind"));
  gshm_close(held);
  gshm_close(s[1]);
  gshm_disconnect(fresh);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

/* The create's reply on raw: true when gshmd made the segment and sent
 * its fd; false when the kernel refused that fd (ETOOMANYREFS: without
 * capabilities, while gshmd's uid has more fds in flight than gshmd's
 * tiny limit, which other tests' daemons may cause) and gshmd took the
 * create back (-EMFILE). */
static bool create_reply_ok(int raw) {
  Gshm__Reply *r = raw_reply(raw);
  bool ok = r->status == GSHM__STATUS__STATUS_OK;

  if (!ok)
    assert_int_equal(r->status, GSHM__STATUS__STATUS_LIMIT);
  gshm__reply__free_unpacked(r, NULL);
  return ok;
}

/* A segment created while no bucket can be made (gshmd one fd below what
 * a socketpair needs: the memfd is made, the bucket's sockets are not) is
 * owed and placed by the retry timer once fds are free: a SIGKILL after
 * that brings it back with its bytes.  (The create goes out on a raw
 * connection: where the kernel refuses its reply's fd, gshmd takes the
 * create back and says -EMFILE, and the test tries again, up to 5
 * times.) */
static void test_segment_without_a_bucket_is_placed_later(void **state) {
  struct harness h;
  gshm_client_t *c;
  gshm_segment_t *s;
  struct rlimit orig, tight;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  unsigned long long seed = (unsigned long long)time(NULL) ^ 0xb0c4e7ULL;
  unsigned char *buf = malloc(8192);
  int raw = -1, tries = 0;
  bool made = false;

  (void)state;
  assert_non_null(buf);
  assert_int_equal(harness_start(&h, NULL), 0);
  cr.name = "late/x";
  cr.size = 8192;
  cr.location = "host";
  cr.mode = 0640;
  while (!made && tries++ < 5) {
    if (raw >= 0)
      close(raw);
    raw = raw_connect(h.socket_path);
    assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, NULL, &orig), 0);
    tight.rlim_cur = (rlim_t)harness_lowest_free_fd(h.sp.pid, 1); /* the memfd only */
    tight.rlim_max = orig.rlim_max;
    assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, &tight, NULL), 0);
    assert_int_equal(gshm__wire_send(raw, GSHM_WIRE_CREATE, 2, &cr.base, -1), 0);
    made = create_reply_ok(raw);
    if (!made) {
      assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, &orig, NULL), 0);
      print_message("    the kernel refused the create's fd (fds in flight elsewhere): again\n");
    }
  }
  if (!made) {
    close(raw);
    assert_int_equal(harness_stop(&h), 0);
    free(buf);
    skip(); /* (5 times: this uid's fds in flight elsewhere stayed above gshmd's limit) */
  }
  for (int i = 0; i < 100; i++) { /* until gshmd holds it */
    gshm__spawn_poll(&h.sp, 20);
    if (harness_lowest_free_fd(h.sp.pid, 0) >= (long)tight.rlim_cur)
      break;
  }
  gshm__spawn_poll(&h.sp, 100);
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 0); /* no bucket yet */
  assert_int_equal(prlimit(h.sp.pid, RLIMIT_NOFILE, &orig, NULL), 0);
  close(raw);
  assert_int_equal(gshm_connect(h.socket_path, "late", &c), 0);
  assert_int_equal(gshm_open(c, "late/x", GSHM_ACCESS_READ_WRITE, &s), 0);
  harness_random(buf, 8192, seed);
  assert_int_equal(gshm_write(s, 0, buf, 8192), 0);
  gshm_close(s);
  for (int i = 0; i < 50 && gshm__spawn_store_memory_fds(&h.sp) != 1; i++)
    gshm__spawn_poll(&h.sp, 100); /* the retry timer (1 s) */
  assert_int_equal(gshm__spawn_store_memory_fds(&h.sp), 1);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  gshm_disconnect(c);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &c), 0);
  assert_int_equal(gshm_open(c, "late/x", GSHM_ACCESS_READ, &s), 0);
  check_bytes(s, 8192, seed);
  gshm_close(s);
  gshm_disconnect(c);
  free(buf);
  assert_int_equal(harness_stop(&h), 0);
}

/* systemd keeps at most FileDescriptorStoreMax= fds for gshmd, says how
 * many in $FDSTORE, and closes any fd past that while sd_notify succeeds
 * (the harness's store_max does the same).  A store too small for
 * limits.max_segments lost, at the next restart, every segment of a bucket
 * whose end was closed, and nothing said so: gshmd must refuse to start.
 * At the default limits.max_name a bucket holds 226 segments: 600 need 3
 * buckets, 6 ends + 4 other entries; 226 need one, 2 + 4 = 6. */
static void test_fdstore_max_too_small_is_refused(void **state) {
  struct harness h;
  gshm_client_t *c;
  gshm_segment_info_t *list;
  size_t n;
  char name[32];
  int rc;

  (void)state;
  setenv("FDSTORE", "8", 1);
  rc = harness_start(&h, (const char *const[]){"--set", "limits.max_segments=600", NULL});
  if (rc == 0) /* (started: stopped, so that no gshmd outlives the failure) */
    harness_stop(&h);
  assert_int_equal(rc, -ECHILD);
  /* exactly enough: every segment comes back, nothing was closed */
  setenv("FDSTORE", "6", 1);
  assert_int_equal(harness_start(&h, (const char *const[]){"--set", "limits.max_segments=226",
                                                           NULL}),
                   0);
  unsetenv("FDSTORE");
  pthread_mutex_lock(&h.sp.lock);
  h.sp.store_max = 6;
  pthread_mutex_unlock(&h.sp.lock);
  assert_int_equal(gshm_connect(h.socket_path, "filler", &c), 0);
  for (int i = 0; i < 226; i++) {
    gshm_segment_t *s;
    snprintf(name, sizeof(name), "fill/%03d", i);
    assert_int_equal(gshm_create(c, name, 4096, NULL, 0600, 0, &s), 0);
    assert_int_equal(gshm_close(s), 0);
  }
  gshm_disconnect(c);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &c), 0);
  assert_int_equal(gshm_list(c, &list, &n), 0);
  assert_int_equal(n, 226);
  gshm_free(list);
  gshm_disconnect(c);
  pthread_mutex_lock(&h.sp.lock);
  assert_int_equal(h.sp.store_refused, 0);
  pthread_mutex_unlock(&h.sp.lock);
  assert_int_equal(harness_stop(&h), 0);
}

static double since_s(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* A start that fails while the fd store holds segments (a typo in the
 * configuration before `systemctl restart`, a store too small for it) no
 * longer exits at once: Restart=on-failure then ran into StartLimitBurst=
 * (5 in 30 s) within a second, and a failed unit's store is dropped, every
 * segment with it.  Such a start waits 10 s (GSHMD_STICKY_START_DELAY_S)
 * and says why in STATUS=; the start after the mend adopts the segment
 * with its bytes.  With nothing stored a failing start still exits at once. */
static void test_failed_start_keeps_the_store(void **state) {
  const char *const typo[] = {"--set", "limits.max_segmnets=100", NULL};
  static struct harness h, fresh;
  gshm_client_t *c;
  gshm_segment_t *s;
  struct timespec t0;
  (void)state;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(harness_start(&fresh, typo), -ECHILD); /* nothing stored: at once */
  assert_true(since_s(&t0) < 5);
  gshm__spawn_cleanup(&fresh.sp);

  assert_int_equal(harness_start(&h, NULL), 0);
  harness_set_leftover(&h);
  assert_int_equal(gshm_connect(h.socket_path, "maker", &c), 0);
  s = create_filled(c, "kept/a", (1u << 20) + 3, 77);
  assert_int_equal(gshm_close(s), 0);
  gshm_disconnect(c);

  /* a configuration gshmd refuses (exit 2) */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(harness_restart(&h, SIGKILL, typo), -ECHILD);
  assert_true(since_s(&t0) >= 9);
  assert_true(WIFEXITED(h.sp.exit_status));
  assert_int_equal(WEXITSTATUS(h.sp.exit_status), 2);
  assert_non_null(strstr(h.sp.status, "could not start"));
  /* a setup step that fails (the store too small for limits.max_segments, exit 1) */
  setenv("FDSTORE", "4", 1);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(harness_restart(&h, SIGKILL, NULL), -ECHILD);
  unsetenv("FDSTORE");
  assert_true(since_s(&t0) >= 9);
  assert_true(WIFEXITED(h.sp.exit_status));
  assert_int_equal(WEXITSTATUS(h.sp.exit_status), 1);

  assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
  assert_int_equal(gshm_connect(h.socket_path, "fresh", &c), 0);
  assert_int_equal(gshm_open(c, "kept/a", GSHM_ACCESS_READ, &s), 0);
  check_bytes(s, (1u << 20) + 3, 77);
  assert_int_equal(gshm_close(s), 0);
  gshm_disconnect(c);
  harness_set_leftover(NULL);
  assert_int_equal(harness_stop(&h), 0);
}

/* The lease key's entries in h's store ("leasekey", "leasekey-<v>"):
 * how many, and whether each holds key (32 bytes). */
static int key_entries(struct harness *h, const uint8_t *key, bool *all_key) {
  int n = 0;

  *all_key = true;
  pthread_mutex_lock(&h->sp.lock);
  for (int i = 0; i < h->sp.nfds; i++) {
    uint8_t b[33];
    if (strncmp(h->sp.names[i], "leasekey", 8))
      continue;
    n++;
    *all_key &= pread(h->sp.fds[i], b, sizeof(b), 0) == 32 && !memcmp(b, key, 32);
  }
  pthread_mutex_unlock(&h->sp.lock);
  return n;
}

/* h's store with the lease key's entries replaced by "leasekey" holding
 * key and another "leasekey" that is not a key (3 bytes). */
static void key_store_reset(struct harness *h, const uint8_t *key) {
  char name[64];
  int fd;

  for (;;) {
    name[0] = '\0';
    pthread_mutex_lock(&h->sp.lock);
    for (int i = 0; i < h->sp.nfds && !name[0]; i++)
      if (!strncmp(h->sp.names[i], "leasekey", 8))
        snprintf(name, sizeof(name), "%s", h->sp.names[i]);
    pthread_mutex_unlock(&h->sp.lock);
    if (!name[0])
      break;
    assert_true(gshm__spawn_store_drop(&h->sp, name) > 0);
  }
  assert_true((fd = memfd_create("key", MFD_CLOEXEC)) >= 0);
  assert_int_equal(write(fd, key, 32), 32);
  assert_int_equal(gshm__spawn_store_add(&h->sp, "leasekey", fd, true), 0);
  assert_true((fd = memfd_create("junk", MFD_CLOEXEC)) >= 0);
  assert_int_equal(write(fd, "bad", 3), 3);
  assert_int_equal(gshm__spawn_store_add(&h->sp, "leasekey", fd, true), 0);
}

/* The lease key's store rewrite, SIGKILLed after each of its sends (the
 * harness's kill point: gshmd killed right after that datagram, what it
 * sent later dropped).  A store holding the key and an unreadable entry
 * of the same name makes gshmd store the key again and remove the old
 * name; it removed "leasekey" first and stored the key after, so a kill
 * in between lost the key (the next start made a new one: every lease
 * granted before was re-checked against the modes).  Now the copy is
 * stored under "leasekey-<v>" first: after each kill, the next start
 * finds the same key, and leaves one entry holding it. */
static void test_lease_key_rewrite_killed_keeps_the_key(void **state) {
  static struct harness h; /* (outlives a failed check: harness_set_leftover) */
  uint8_t key[32];
  bool all_key;
  int kills = 0, e;

  (void)state;
  assert_int_equal(harness_start(&h, NULL), 0);
  harness_set_leftover(&h); /* (killed when a check fails) */
  gshm__spawn_stop(&h.sp, SIGKILL);
  pthread_mutex_lock(&h.sp.lock);
  for (int i = 0; i < h.sp.nfds; i++)
    if (!strcmp(h.sp.names[i], "leasekey"))
      assert_int_equal(pread(h.sp.fds[i], key, 32, 0), 32);
  pthread_mutex_unlock(&h.sp.lock);
  assert_int_equal(key_entries(&h, key, &all_key), 1);
  assert_true(all_key);
  for (int k = 1; k < 10; k++) {
    key_store_reset(&h, key);
    pthread_mutex_lock(&h.sp.lock);
    h.sp.kill_after = "FDNAME=leasekey";
    h.sp.kill_count = k;
    pthread_mutex_unlock(&h.sp.lock);
    e = harness_restart(&h, SIGKILL, NULL);
    pthread_mutex_lock(&h.sp.lock);
    h.sp.kill_after = NULL;
    pthread_mutex_unlock(&h.sp.lock);
    if (e == 0) /* (no k-th send: the rewrite is over) */
      break;
    assert_int_equal(e, -ECHILD);
    kills++;
    assert_true(key_entries(&h, key, &all_key) >= 1);
    assert_int_equal(harness_restart(&h, SIGKILL, NULL), 0);
    gshm__spawn_poll(&h.sp, 100);
    assert_int_equal(key_entries(&h, key, &all_key), 1);
    assert_true(all_key);
  }
  assert_true(kills >= 2); /* (the copy's send, the old name's removal) */
  gshm__spawn_poll(&h.sp, 100);
  assert_int_equal(key_entries(&h, key, &all_key), 1);
  assert_true(all_key);
  harness_set_leftover(NULL);
  assert_int_equal(harness_stop(&h), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_watchdog_and_status),
      cmocka_unit_test(test_sigkill_restart),
      cmocka_unit_test(test_sigkill_restart_socket_activated),
      cmocka_unit_test(test_freed_entries_leave_the_store),
      cmocka_unit_test(test_lease_key_rewrite_killed_keeps_the_key),
      cmocka_unit_test(test_emptied_bucket_stays_a_while),
      cmocka_unit_test(test_fds_held_counted_and_said),
      cmocka_unit_test(test_unlinked_but_leased_survives),
      cmocka_unit_test(test_lease_ids_unique_across_restart),
      cmocka_unit_test(test_unlinked_but_leased_survives_sigterm),
      cmocka_unit_test(test_unlinked_leased_two_restarts_in_grace),
      cmocka_unit_test(test_open_after_restart_sees_new_generation),
      cmocka_unit_test(test_close_after_restart_ends_the_lease),
      cmocka_unit_test(test_listing_never_ends_early),
      cmocka_unit_test(test_failed_store_sends_are_resent),
      cmocka_unit_test(test_sigkill_while_the_store_is_behind),
      cmocka_unit_test(test_segment_without_a_bucket_is_placed_later),
      cmocka_unit_test(test_fdstore_max_too_small_is_refused),
      cmocka_unit_test(test_failed_start_keeps_the_store),
  };
  /* The common default soft limit: restarts hand fds back at any limit
   * (the harness once moved them through fd 10000). */
  {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 1024) {
      rl.rlim_cur = 1024;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  atexit(harness_kill_leftover); /* (a gshmd a failed check left: harness_set_leftover) */
  if (getenv("GSHM_TEST_FILTER")) /* (a cmocka test filter, as test_hostile takes) */
    cmocka_set_test_filter(getenv("GSHM_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
