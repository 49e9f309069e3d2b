/* SPDX-License-Identifier: Apache-2.0 */
/* Restore from systemd's fd store (daemon/fdstore*.c) on its own: what the
 * names and fds handed back after a restart become: the one-fd-per-segment
 * format's rules with its journal, the buckets' (newest datagram wins, an
 * unreadable one is left queued), and the names' size at max_segments
 * (tests/integration/test_restart*.c run the whole daemon), and a sticky
 * CUDA error in it (the CUDA backend on fake_cuda_gpus.c's driver).
 * No service manager here ($NOTIFY_SOCKET unset): restore only reads;
 * but for the sticky error's test, whose store is on. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "config.h"
#include "fake_cuda_gpus.h"
#include "fdstore.h"
#include "fdstore_internal.h"
#include "gshm.pb-c.h"
#include "log.h"
#include "registry.h"
#include "registry_internal.h"

struct store {
  int fds[16];
  char *names[16];
  int n;
};

struct fixture {
  struct gshmd_config cfg;
  struct gshmd_registry reg;
  struct gshmd_fdstore fs;
  struct store st;
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  unsetenv("NOTIFY_SOCKET");
  gshm__log_setup("test", 3, 0);
  if (gshmd_config_init(&f->cfg))
    return -1;
  gshmd_registry_init(&f->reg, &f->cfg);
  if (gshmd_backend_host_create(&f->cfg, &f->reg.host))
    return -1;
  gshmd_fdstore_setup(&f->fs, &f->reg);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  for (int i = 0; i < f->st.n; i++) {
    if (f->st.fds[i] >= 0)
      close(f->st.fds[i]);
    free(f->st.names[i]);
  }
  gshmd_fdstore_shutdown(&f->fs);
  gshmd_registry_destroy(&f->reg);
  f->reg.host->ops->destroy(f->reg.host);
  gshmd_config_free(&f->cfg);
  free(f);
  return 0;
}

static void put(struct store *st, const char *name, int fd) {
  assert_true(fd >= 0 && st->n < 16);
  st->fds[st->n] = fd;
  st->names[st->n] = strdup(name);
  st->n++;
}

/* A segment's memory as gshmd parks it: a sealed host memfd. */
static int memory(size_t size) {
  int fd = memfd_create("seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(fd >= 0 && ftruncate(fd, (off_t)size) == 0 &&
              fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
  return fd;
}

static int bytes_fd(const uint8_t *buf, size_t len) {
  int fd = memfd_create("record", MFD_CLOEXEC);
  assert_true(fd >= 0 && write(fd, buf, len) == (ssize_t)len);
  return fd;
}

static int message_fd(const ProtobufCMessage *m) {
  uint8_t buf[4096];
  size_t len = protobuf_c_message_get_packed_size(m);
  assert_true(len <= sizeof(buf));
  protobuf_c_message_pack(m, buf);
  return bytes_fd(buf, len);
}

static Gshm__StateRecord record(uint64_t id, const char *name, uint32_t mode, bool unlinked) {
  Gshm__StateRecord r = GSHM__STATE_RECORD__INIT;
  r.id = id;
  r.generation = id;
  r.name = (char *)name;
  r.requested_size = 4096;
  r.size = 4096;
  r.location = "host";
  r.uid = 1000;
  r.mode = mode;
  r.unlinked = unlinked;
  return r;
}

/* A journal as gshmd writes one: header, then t at 4096 (the first area). */
static int journal(const Gshm__StateTable *t) {
  struct {
    char magic[8];
    uint32_t version, pad;
    uint64_t off, len;
  } h = {{'G', 'S', 'H', 'M', 'J', 'R', 'N', 'L'}, 1, 0, 4096, 0};
  uint8_t buf[8192];
  int fd = memfd_create("journal", MFD_CLOEXEC);

  h.len = protobuf_c_message_get_packed_size(&t->base);
  assert_true(h.len <= sizeof(buf));
  protobuf_c_message_pack(&t->base, buf);
  assert_true(fd >= 0 && ftruncate(fd, 4096 + 2 * 65536) == 0 &&
              pwrite(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
              pwrite(fd, buf, h.len, 4096) == (ssize_t)h.len);
  return fd;
}

static void restore(struct fixture *f) {
  assert_int_equal(gshmd_fdstore_restore(&f->fs, f->st.fds, f->st.names, f->st.n), 0);
  for (int i = 0; i < f->st.n; i++)
    assert_int_equal(f->st.fds[i], -1); /* every one ours: adopted or closed */
}

/* A journal record counts only when it stands for a newer version than the
 * newest stored record: a journal whose later rewrite failed must not undo
 * what the store got afterwards. */
static void stale_and_newer_journal_records(void **state, uint64_t jversion, uint32_t want) {
  struct fixture *f = *state;
  Gshm__StateRecord stored = record(1, "x", 0600, false), newer = record(1, "x", 0604, false);
  Gshm__StateRecord *recs[] = {&newer};
  uint64_t versions[] = {jversion};
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
  struct gshmd_segment *seg;

  t.version = 3;
  t.seq = 1;
  t.n_segments = 1;
  t.segments = recs;
  t.n_record_versions = 1;
  t.record_versions = versions;
  put(&f->st, "seg-1", memory(4096));
  put(&f->st, "meta-1-3", message_fd(&stored.base));
  put(&f->st, "journal", journal(&t));
  restore(f);
  assert_non_null(seg = gshmd_registry_find_name(&f->reg, "x"));
  assert_int_equal(seg->mode, want);
  assert_int_equal(f->fs.converted, 1);
  assert_int_equal(f->fs.restored, 1);
}

static void test_stale_journal_record_loses(void **state) {
  stale_and_newer_journal_records(state, 3, 0600); /* the store has version 3 already */
}

static void test_newer_journal_record_wins(void **state) {
  stale_and_newer_journal_records(state, 4, 0604);
}

/* Freed in the journal: not restored, whatever the store still holds; a
 * record the journal has for a segment whose memory never reached the
 * store: lost, counted. */
static void test_freed_and_memoryless(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord a = record(1, "a", 0600, false), b = record(2, "b", 0600, false);
  Gshm__StateRecord c = record(3, "c", 0600, false), *recs[] = {&c};
  uint64_t freed[] = {1}, versions[] = {1};
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;

  t.version = 3;
  t.n_freed = 1;
  t.freed = freed;
  t.n_segments = 1;
  t.segments = recs;
  t.n_record_versions = 1;
  t.record_versions = versions;
  put(&f->st, "seg-1", memory(4096));
  put(&f->st, "meta-1-1", message_fd(&a.base));
  put(&f->st, "seg-2", memory(4096));
  put(&f->st, "meta-2-1", message_fd(&b.base));
  put(&f->st, "journal", journal(&t));
  restore(f);
  assert_null(gshmd_registry_find_id(&f->reg, 1));
  assert_non_null(gshmd_registry_find_name(&f->reg, "b"));
  assert_null(gshmd_registry_find_id(&f->reg, 3));
  assert_int_equal(f->fs.restored, 1);
  assert_int_equal(f->fs.dropped, 1); /* c */
}

/* Two linked records with one name (the older one's unlink never reached
 * the store): the newer segment keeps the name, the older comes back
 * unlinked, and both keep their memory. */
static void test_newest_holder_keeps_the_name(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord a = record(1, "x", 0600, false), b = record(2, "x", 0640, false);
  struct gshmd_segment *s1, *s2;

  put(&f->st, "seg-1", memory(4096));
  put(&f->st, "meta-1-1", message_fd(&a.base));
  put(&f->st, "seg-2", memory(4096));
  put(&f->st, "meta-2-1", message_fd(&b.base));
  restore(f);
  assert_non_null(s1 = gshmd_registry_find_id(&f->reg, 1));
  assert_non_null(s2 = gshmd_registry_find_id(&f->reg, 2));
  assert_ptr_equal(gshmd_registry_find_name(&f->reg, "x"), s2);
  assert_true(s1->unlinked);
  assert_false(s2->unlinked);
  assert_int_equal(f->fs.restored, 2);
  assert_int_equal(f->fs.converted, 2);
}

/* An unreadable newest ids record must not hide an older readable one, and
 * the next one is numbered above both. */
static void test_unreadable_ids_record(void **state) {
  struct fixture *f = *state;
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
  static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};

  t.version = 2;
  t.seq = 5;
  t.next_segment_id = 4100;
  t.next_generation = 5000;
  t.next_lease_id = 70000;
  t.next_session_id = 66000;
  put(&f->st, "ids-5", message_fd(&t.base));
  put(&f->st, "ids-9", bytes_fd(garbage, sizeof(garbage)));
  restore(f);
  assert_true(f->reg.next_segment_id >= 4100);
  assert_true(f->reg.next_generation >= 5000);
  assert_true(f->reg.next_lease_id >= 70000);
  assert_true(f->reg.next_session_id >= 66000);
  assert_int_equal(f->fs.ids_version, 9);
}

/* Names that only look like ours are not ours (strict parsing). */
static void test_names_parsed_strictly(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord a = record(1, "a", 0600, false);
  int other;

  put(&f->st, "seg-1", memory(4096));
  put(&f->st, "meta-1-1", message_fd(&a.base));
  put(&f->st, "meta-1-0", message_fd(&a.base));  /* version 0: not ours */
  put(&f->st, "meta--1-2", message_fd(&a.base)); /* a sign */
  other = f->st.n - 1;
  assert_int_equal(gshmd_fdstore_restore(&f->fs, f->st.fds, f->st.names, f->st.n), 0);
  assert_int_equal(f->fs.restored, 1);
  assert_int_equal(f->fs.converted, 1);
  assert_true(f->st.fds[other - 1] >= 0 && f->st.fds[other] >= 0); /* left alone */
}

/* ---- Buckets ---- */

/* Queues on end `from` of a socketpair (so in the other end's queue) a
 * datagram of bucket `bucket` with seq, the publish mark `done` and the
 * records recs[0..n), each with a 4 KiB memfd. */
static void queue_bucket_marked(int from, uint32_t bucket, uint64_t seq, uint64_t done,
                                Gshm__StateRecord *recs, size_t n) {
  Gshm__StateBucket t = GSHM__STATE_BUCKET__INIT;
  Gshm__StateRecord *p[8];
  uint8_t buf[8192];
  union {
    struct cmsghdr align;
    char b[CMSG_SPACE(sizeof(int) * 8)];
  } ctl;
  int fds[8];
  struct iovec iov = {.iov_base = buf};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                      .msg_controllen = CMSG_SPACE(sizeof(int) * n)};
  struct cmsghdr *c;

  t.version = 1;
  t.seq = seq;
  t.bucket = bucket;
  t.publish_done = done;
  for (size_t i = 0; i < n; i++) {
    p[i] = &recs[i];
    fds[i] = memory(4096);
  }
  t.segments = p;
  t.n_segments = n;
  iov.iov_len = protobuf_c_message_pack(&t.base, buf);
  memset(ctl.b, 0, sizeof(ctl.b));
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  assert_true(sendmsg(from, &mh, 0) > 0);
  for (size_t i = 0; i < n; i++)
    close(fds[i]);
}

/* Without a mark (as an older gshmd wrote them). */
static void queue_bucket_n(int from, uint32_t bucket, uint64_t seq, Gshm__StateRecord *recs,
                           size_t n) {
  queue_bucket_marked(from, bucket, seq, 0, recs, n);
}

/* Bucket 0's. */
static void queue_bucket(int from, uint64_t seq, Gshm__StateRecord *recs, size_t n) {
  queue_bucket_n(from, 0, seq, recs, n);
}

static int queued(int fd) {
  char b;
  return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
}

/* A rewrite SIGKILLed between its send and the drop leaves a datagram in
 * both queues: the higher seq wins, the other is dropped. */
static void test_bucket_newest_datagram_wins(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord old = record(7, "x", 0600, false), now = record(7, "x", 0640, false);
  int sv[2];

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 4, &old, 1); /* into a's queue */
  queue_bucket(sv[0], 5, &now, 1); /* into b's queue */
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  assert_int_equal(gshmd_fdstore_restore(&f->fs, f->st.fds, f->st.names, f->st.n), 0);
  assert_int_equal(f->fs.restored, 1);
  assert_int_equal(gshmd_registry_find_id(&f->reg, 7)->mode, 0640);
  assert_int_equal(f->st.fds[0], -1); /* both ends kept by the store */
  assert_false(queued(sv[0]));        /* the older one dropped */
  assert_true(queued(sv[1]));
}

/* Swapped: the older datagram is the one in b's queue. */
static void test_bucket_newest_datagram_wins_either_queue(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord old = record(7, "x", 0600, false), now = record(7, "x", 0640, false);
  int sv[2];

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 9, &now, 1);
  queue_bucket(sv[0], 8, &old, 1);
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  assert_int_equal(gshmd_fdstore_restore(&f->fs, f->st.fds, f->st.names, f->st.n), 0);
  assert_int_equal(gshmd_registry_find_id(&f->reg, 7)->mode, 0640);
  assert_true(queued(sv[0]));
  assert_false(queued(sv[1]));
}

/* Bucket `index` handed back, its datagram of seq holding recs[0..n) in
 * a's queue; with its b end lost when one_end. */
static void bucket_handed_back(struct fixture *f, uint32_t index, bool one_end, uint64_t seq,
                               Gshm__StateRecord *recs, size_t n) {
  char name[16];
  int sv[2];

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket_n(sv[1], index, seq, recs, n);
  snprintf(name, sizeof(name), "b%ua", index);
  put(&f->st, name, sv[0]);
  snprintf(name, sizeof(name), "b%ub", index);
  if (one_end)
    close(sv[1]);
  else
    put(&f->st, name, sv[1]);
}

/* Two buckets handed back: b<stale> (0 or 1) with one end, a, whose
 * datagram of seq stale_seq holds segment 7 "x" as it was (mode 0644),
 * and the other, kept whole, whose datagram of seq holds recs[0..n). */
static void one_ended_and_whole(struct fixture *f, uint32_t stale, uint64_t stale_seq,
                                uint64_t seq, Gshm__StateRecord *recs, size_t n) {
  Gshm__StateRecord old = record(7, "x", 0644, false);

  bucket_handed_back(f, stale, true, stale_seq, &old, 1);
  bucket_handed_back(f, 1 - stale, false, seq, recs, n);
}

/* One segment id in two buckets: a bucket came back with one end (its
 * members moved to another bucket, written then) and a crash came before
 * its last end left the store.  The record written last wins, whichever
 * bucket number holds it: before, the member that qsort (not stable) put
 * first did, and a chmod (or an unlink) made since the move could be
 * undone.  stale_first: the one-ended bucket is b0. */
static void id_in_two_buckets_at(void **state, bool stale_first, uint64_t stale_seq,
                                 uint64_t seq) {
  struct fixture *f = *state;
  Gshm__StateRecord both[2] = {record(7, "x", 0600, false), record(8, "y", 0600, false)};

  one_ended_and_whole(f, stale_first ? 0 : 1, stale_seq, seq, both, 2);
  restore(f);
  assert_int_equal(f->fs.restored, 2);
  assert_int_equal(f->fs.dropped, 1);
  assert_int_equal(gshmd_registry_find_id(&f->reg, 7)->mode, 0600);
  assert_true(f->fs.write_seq == (stale_seq > seq ? stale_seq : seq)); /* the next write: +1 */
}

static void test_id_in_two_buckets_newest_wins(void **state) {
  id_in_two_buckets_at(state, true, 30, 41);
}

static void test_id_in_two_buckets_newest_wins_either_number(void **state) {
  id_in_two_buckets_at(state, false, 30, 41);
}

/* A store written before write_seq counts seqs per bucket: the one-ended
 * bucket, rewritten many times, has the higher one.  The copy in the
 * bucket kept whole is still the one its member was moved to: it wins. */
static void test_id_in_two_buckets_kept_whole_wins(void **state) {
  id_in_two_buckets_at(state, true, 90, 3);
}

static int journal2(uint64_t done);

/* A journal2 with no publish mark whose copy 0 of bucket `bucket` holds a
 * StateBucket of seq and recs[0..n) (no fds: a datagram that could not be
 * sent), laid out as fdstore_journal.c writes it. */
static int journal2_copy(uint32_t bucket, uint64_t seq, Gshm__StateRecord *recs, size_t n) {
  const off_t slot = (192 << 10) + 4096, off = 4096 + (off_t)bucket * 2 * slot;
  Gshm__StateBucket t = GSHM__STATE_BUCKET__INIT;
  Gshm__StateRecord *p[8];
  struct {
    uint64_t seq;
    uint32_t len, pad;
  } sh = {seq, 0, 0};
  uint8_t buf[8192];
  int fd = journal2(0);

  t.version = 1;
  t.seq = seq;
  t.bucket = bucket;
  for (size_t i = 0; i < n; i++)
    p[i] = &recs[i];
  t.segments = p;
  t.n_segments = n;
  sh.len = (uint32_t)protobuf_c_message_pack(&t.base, buf);
  assert_true(ftruncate(fd, 4096 + (off_t)(bucket + 1) * 2 * slot) == 0 &&
              pwrite(fd, buf, sh.len, off + 16) == (ssize_t)sh.len &&
              pwrite(fd, &sh, sizeof(sh), off) == (ssize_t)sizeof(sh));
  return fd;
}

/* The newest record of an id has no memory fd, an older one has: a
 * bucket came back with one end, its member moved to bucket 1 whose
 * datagram could not be sent then (its state went to the journal, which
 * has no fds), and gshmd restarted before the store caught up (the one-
 * ended bucket's name is retired only then).  The segment is restored
 * with the newest record and the memory of the older copy: the memory of
 * one segment id is one memfd.  Before, the newest won, was not restored
 * (its memory "not handed back") and the older, which had it, was dropped
 * as the duplicate: the segment was lost. */
static void test_id_in_two_buckets_newest_without_memory(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord both[2] = {record(7, "x", 0600, false), record(8, "y", 0600, false)};

  one_ended_and_whole(f, 0, 30, 35, both + 1, 1);          /* b1's datagram: y only */
  put(&f->st, "journal2", journal2_copy(1, 41, both, 2)); /* b1 since: x and y */
  restore(f);
  assert_non_null(gshmd_registry_find_id(&f->reg, 8));
  assert_non_null(gshmd_registry_find_id(&f->reg, 7));
  assert_int_equal(gshmd_registry_find_id(&f->reg, 7)->mode, 0600);
  assert_int_equal(f->fs.restored, 2);
}

/* Restores f's store under an RLIMIT_NOFILE that leaves no room for one
 * more fd (none of a datagram's can be installed: MSG_CTRUNC). */
static void restore_without_fds(struct fixture *f) {
  struct rlimit was, tight;
  int low = dup(0); /* the lowest free fd: a limit at it leaves no room */

  close(low);
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
  tight = was;
  tight.rlim_cur = (rlim_t)low;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &tight), 0);
  assert_int_equal(gshmd_fdstore_restore(&f->fs, f->st.fds, f->st.names, f->st.n), 0);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
}

/* A datagram whose fds do not fit under RLIMIT_NOFILE (MSG_CTRUNC) is not
 * restored and stays queued, untouched, for a start with a higher limit. */
static void test_bucket_unreadable_is_left_queued(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "a", 0600, false), record(2, "b", 0600, false)};
  int sv[2];

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[0], 1, r, 2);
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  restore_without_fds(f);
  assert_int_equal(f->fs.restored, 0);
  assert_true(queued(sv[1]));
  assert_int_equal(f->st.fds[0], -1); /* held (frozen), never rewritten */
}

/* A bucket that came back with one end, whose datagram's fds do not fit
 * under RLIMIT_NOFILE: nothing of it is adopted, and its end stays in the
 * store, its name not retired, for a start with a higher limit (which
 * moves its members).  Before, its name was retired like that of any
 * one-ended bucket, whose members had moved: once the store caught up,
 * every segment in it was gone. */
static void test_frozen_one_ended_bucket_not_retired(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "a", 0600, false), record(2, "b", 0600, false)};

  bucket_handed_back(f, 0, true, 5, r, 2);
  restore_without_fds(f);
  assert_int_equal(f->fs.restored, 0);
  assert_int_equal(f->fs.nretire, 0);
  assert_true(f->fs.nbuckets >= 1); /* (its number out of use all the same) */
}

/* A frozen bucket (its datagram's fds do not fit under RLIMIT_NOFILE)
 * holds a state of seq dg_seq, and the journal one of journal_seq: the
 * writes of this run take seqs above both (write_seq), since a later
 * start reads that bucket again, and of an id in it and in a bucket this
 * run rewrites (one that came back with one end: its members move) the
 * copy written last must win.  Before, a frozen bucket's seq counted as
 * 0: write_seq started below it. */
static void frozen_bucket_raises_write_seq(void **state, uint64_t dg_seq, uint64_t journal_seq) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "a", 0600, false), record(2, "b", 0600, false)};
  int sv[2];

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[0], dg_seq, r, 2);
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  put(&f->st, "journal2", journal2_copy(0, journal_seq, r, 2));
  restore_without_fds(f);
  assert_int_equal(f->fs.restored, 0); /* (frozen) */
  assert_true(queued(sv[1]));
  assert_true(f->fs.write_seq >= (dg_seq > journal_seq ? dg_seq : journal_seq));
}

static void test_frozen_bucket_datagram_raises_write_seq(void **state) {
  frozen_bucket_raises_write_seq(state, 50, 45);
}

static void test_frozen_bucket_journal_copy_raises_write_seq(void **state) {
  frozen_bucket_raises_write_seq(state, 50, 60);
}

/* What the store may hold in this run (gshmd_fdstore_entries_needed,
 * checked against FileDescriptorStoreMax= at start) counts what came
 * back besides the buckets limits.max_segments can need: a frozen
 * bucket's two ends (its segments are not in the registry: as many
 * again may be made), the one end left of a frozen bucket that lost the
 * other, and the end of a one-ended bucket whose members move (stored
 * until the store caught up; a failed send delays that while segments
 * are made).  Before, the check at start counted limits.max_segments'
 * buckets alone: a store with a frozen bucket passed it and overflowed
 * near the limit (systemd closes an fd past FileDescriptorStoreMax=:
 * a bucket's end, its segments lost at the next start). */
static void test_entries_needed_counts_what_came_back(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "a", 0600, false), record(2, "b", 0600, false)};
  Gshm__StateRecord q[1] = {record(3, "c", 0600, false)};
  uint64_t base = gshmd_fdstore_max_entries(f->cfg.max_segments, f->cfg.max_name);
  int sv[2];

  assert_int_equal(gshmd_fdstore_entries_needed(&f->fs), base);
  bucket_handed_back(f, 0, false, 5, r, 2); /* frozen, both ends: +2 */
  bucket_handed_back(f, 1, true, 6, q, 1);  /* frozen, one end: +1 */
  /* one end, nothing queued (read: not frozen): retired once the store
   * caught up, counted until then: +1 */
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  put(&f->st, "b2b", sv[1]);
  close(sv[0]);
  restore_without_fds(f);
  assert_int_equal(f->fs.nfrozen, 2);
  assert_int_equal(f->fs.nretire, 1);
  assert_int_equal(gshmd_fdstore_entries_needed(&f->fs), base + 4);
}

/* Buckets that came back whole are within limits.max_segments' count
 * (each bucket is filled before a new one is made), unless more came
 * back than that count (a larger limit before): then those, 2 fds each. */
static void test_entries_needed_counts_buckets_kept(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[1] = {record(1, "a", 0600, false)}, q[1] = {record(2, "b", 0600, false)};

  bucket_handed_back(f, 0, false, 5, r, 1);
  bucket_handed_back(f, 1, false, 6, q, 1);
  restore(f);
  assert_int_equal(f->fs.restored, 2);
  assert_int_equal(gshmd_fdstore_entries_needed(&f->fs),
                   gshmd_fdstore_max_entries(f->cfg.max_segments, f->cfg.max_name));
  f->cfg.max_segments = 1; /* (its count: one bucket) */
  assert_int_equal(gshmd_fdstore_entries_needed(&f->fs), 2 * 2 + FDSTORE_OTHER_ENTRIES);
}

/* The names the store hands back at limits.max_segments (every bucket
 * full but the last, as placement fills them: gshmd_fdstore_max_buckets),
 * joined as systemd joins them in LISTEN_FDNAMES with the socket's name
 * and another helper's, fit execve's MAX_ARG_STRLEN, and the whole
 * environment ARG_MAX; at the largest max_segments gshmd accepts too. */
static size_t fdnames(uint64_t nbuckets, char **out) {
  size_t cap = nbuckets * 24 + 256, used = 0;
  char *s = malloc(cap);
  assert_non_null(s);
  used += (size_t)sprintf(s, "gshmd.socket:leasekey");
  for (uint64_t i = 0; i < nbuckets; i++)
    used += (size_t)sprintf(s + used, ":b%llua:b%llub", (unsigned long long)i,
                            (unsigned long long)i);
  used += (size_t)sprintf(s + used, ":ids-18446744073709551615:ids-1:journal2");
  *out = s;
  return used;
}

static void test_fdnames_fit_at_max_segments(void **state) {
  struct fixture *f = *state;
  extern char **environ;
  size_t env = 0;
  uint64_t limits[] = {f->cfg.max_segments, gshmd_fdstore_max_restorable(f->cfg.max_name)};
  uint64_t nb;
  char *names;
  size_t len;

  for (char **e = environ; *e; e++)
    env += strlen(*e) + 1 + sizeof(char *);
  /* placement fills buckets of fs.capacity: the bound is that count */
  nb = gshmd_fdstore_max_buckets(f->cfg.max_segments, f->cfg.max_name);
  assert_int_equal(nb, (f->cfg.max_segments + f->fs.capacity - 1) / f->fs.capacity);
  for (int k = 0; k < 2; k++) {
    nb = gshmd_fdstore_max_buckets(limits[k], f->cfg.max_name);
    len = fdnames(nb, &names);
    print_message("    max_segments %llu: %llu buckets, LISTEN_FDNAMES %zu bytes\n",
                  (unsigned long long)limits[k], (unsigned long long)nb, len);
    assert_true(strlen("LISTEN_FDNAMES=") + len + 1 <= 131072);
    assert_true(gshmd_fdstore_names_bytes(nb) + strlen("gshmd.socket:leasekey:") >= len - 40);
    assert_true(env + len + 64 + 2 * sizeof(char *) < (size_t)sysconf(_SC_ARG_MAX));
    free(names);
  }
  /* one past the largest accepted would not fit */
  assert_true(gshmd_fdstore_max_fdnames(limits[1] + f->fs.capacity, f->cfg.max_name) >
              FDSTORE_FDNAMES_MAX);
  /* the default restores */
  assert_true(f->cfg.max_segments <= limits[1]);
}

/* A journal2 as gshmd writes one, empty but for its header's publish
 * mark: every publish up to `done` complete. */
static int journal2(uint64_t done) {
  struct {
    char magic[8];
    uint32_t version, slot;
    uint64_t ids_valid, ids[4], publish_done;
  } h = {{'G', 'S', 'H', 'M', 'J', 'R', 'N', '2'}, 2, (192u << 10) + 4096u, 0, {0}, done};
  int fd = memfd_create("journal2", MFD_CLOEXEC);
  assert_true(fd >= 0 && ftruncate(fd, 4096) == 0 &&
              pwrite(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h));
  return fd;
}

/* Bucket 0 holding recs[0..n) (with a journal2 of mark `done` unless 0),
 * restored. */
static void restore_bucket(struct fixture *f, Gshm__StateRecord *recs, size_t n, uint64_t done) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 1, recs, n);
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  if (done)
    put(&f->st, "journal2", journal2(done));
  restore(f);
}

static Gshm__StateRecord member(uint64_t id, const char *name, uint64_t publish, uint32_t n) {
  Gshm__StateRecord r = record(id, name, 0600, false);
  r.publish = publish;
  r.publish_members = n;
  return r;
}

/* A publish of 3 of which 2 came back (the third was in a bucket whose
 * write a crash prevented): none is restored; a segment of no publish
 * is. */
static void test_publish_cut_short_is_dropped(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[3] = {member(5, "s/a", 7, 3), record(2, "x", 0600, false),
                            member(6, "s/b", 7, 3)};

  restore_bucket(f, r, 3, 0);
  assert_int_equal(f->fs.restored, 1);
  assert_int_equal(f->fs.cut, 2);
  assert_non_null(gshmd_registry_find_name(&f->reg, "x"));
  assert_null(gshmd_registry_find_name(&f->reg, "s/a"));
  assert_null(gshmd_registry_find_id(&f->reg, 6));
  assert_true(f->fs.publish_last == 7); /* the mark passes it once the store has the rest */
}

/* A publish of 2 (ids 6, 7: publish 7) across b0 and b1, complete: the
 * journal's mark passed it; then 6 was freed, and b0 rewritten without it
 * (its datagram carries the mark, 7), while b1 still holds 7's record
 * tagged.  The journal alone is lost (not handed back, or of a format
 * this gshmd does not take): 7 is restored, its publish being at or below
 * the mark that b0's datagram says.  Before, the mark was the journal's
 * alone, 0 without one: the publish looked cut short (1 of 2 came back)
 * and 7 was dropped, a live segment lost. */
static void test_publish_mark_from_a_bucket_without_the_journal(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord other = record(2, "x", 0600, false), kept = member(7, "s/b", 7, 2);
  int b0[2], b1[2];

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, b0), 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, b1), 0);
  queue_bucket_marked(b0[1], 0, 12, 7, &other, 1); /* after 6's free */
  queue_bucket_marked(b1[1], 1, 10, 0, &kept, 1);  /* the publish's write */
  put(&f->st, "b0a", b0[0]);
  put(&f->st, "b0b", b0[1]);
  put(&f->st, "b1a", b1[0]);
  put(&f->st, "b1b", b1[1]);
  restore(f);
  assert_int_equal(f->fs.cut, 0);
  assert_non_null(gshmd_registry_find_name(&f->reg, "s/b"));
  assert_non_null(gshmd_registry_find_name(&f->reg, "x"));
  assert_true(f->fs.publish_done == 7);
  { /* and every bucket gshmd writes carries the mark */
    struct fdstore_bucket empty = {.index = 3};
    uint8_t *buf = NULL;
    size_t len = gshmd__bucket_pack(&empty, 20, 7, &buf);
    Gshm__StateBucket *t = gshm__state_bucket__unpack(NULL, len, buf);
    assert_non_null(t);
    assert_true(t->publish_done == 7 && t->seq == 20);
    gshm__state_bucket__free_unpacked(t, NULL);
    free(buf);
  }
}

/* A publish of 2 (ids 6, 7: publish 7, above the journal's mark): 6 was
 * in a bucket that came back with one end, b<stale>, and moved to the
 * other bucket, whose datagram (7 only) could not be sent since: its
 * journal copy holds 6 and 7, 6 without memory there.  The set is whole
 * (6's memory is in the one-ended bucket's datagram) and comes back.
 * Before, of 6's two records the publish check counted the one qsort put
 * first, and when that was the journal's (no fd) the whole set was cut:
 * with the one-ended bucket numbered 1. */
static void publish_whole_across_one_ended(void **state, uint32_t stale) {
  struct fixture *f = *state;
  Gshm__StateRecord both[2] = {member(6, "s/a", 7, 2), member(7, "s/b", 7, 2)};

  bucket_handed_back(f, stale, true, 30, both, 1);          /* 6, with its memory */
  bucket_handed_back(f, 1 - stale, false, 35, both + 1, 1); /* 7 */
  put(&f->st, "journal2", journal2_copy(1 - stale, 41, both, 2));
  restore(f);
  assert_int_equal(f->fs.cut, 0);
  assert_non_null(gshmd_registry_find_name(&f->reg, "s/a"));
  assert_non_null(gshmd_registry_find_name(&f->reg, "s/b"));
}

static void test_publish_whole_across_one_ended_b0(void **state) {
  publish_whole_across_one_ended(state, 0);
}

static void test_publish_whole_across_one_ended_b1(void **state) {
  publish_whole_across_one_ended(state, 1);
}

/* Every member back: restored, and each keeps its publish's tag until the
 * journal's mark passes it. */
static void test_publish_whole_is_kept(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {member(6, "s/a", 7, 2), member(7, "s/b", 7, 2)};

  restore_bucket(f, r, 2, 0);
  assert_int_equal(f->fs.restored, 2);
  assert_int_equal(f->fs.cut, 0);
  assert_true(gshmd_registry_find_name(&f->reg, "s/b")->fs_publish == 7);
}

/* At or below the journal's mark a publish is complete: a member freed
 * since (2 of 3 here) takes nothing with it, and the tags go. */
static void test_publish_below_the_mark_is_kept(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {member(5, "s/a", 7, 3), member(7, "s/c", 7, 3)};

  restore_bucket(f, r, 2, 7);
  assert_true(f->fs.publish_done == 7);
  assert_int_equal(f->fs.restored, 2);
  assert_true(gshmd_registry_find_name(&f->reg, "s/a")->fs_publish == 0);
}

/* A --replace cut short: the new segment of the name (id 9, of a publish
 * of 2 whose other record never reached the store) is dropped, and the
 * old one (id 1) keeps the name, linked. */
static void test_publish_replace_cut_short_keeps_the_old(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "s/a", 0600, false), member(9, "s/a", 10, 2)};
  struct gshmd_segment *seg;

  restore_bucket(f, r, 2, 0);
  assert_int_equal(f->fs.restored, 1);
  assert_non_null(seg = gshmd_registry_find_name(&f->reg, "s/a"));
  assert_true(seg->id == 1 && !seg->unlinked);
  assert_null(gshmd_registry_find_id(&f->reg, 9));
}

static Gshm__StateRecord replaced(uint64_t id, const char *name, uint64_t by) {
  Gshm__StateRecord r = record(id, name, 0600, true);
  r.replaced_by = by;
  return r;
}

/* A --replace whose publish was cut short after the old segment's unlink
 * was written (its record: unlinked by publish 10): the old one gets its
 * name back, linked, untagged; the new one is dropped.  Before a
 * replace's unlink was part of its publish, the old one came back
 * unlinked (or, freed, not at all). */
static void test_replace_cut_short_relinks_the_old(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {replaced(1, "s/a", 10), member(9, "s/a", 10, 2)};
  struct gshmd_segment *seg;

  restore_bucket(f, r, 2, 0);
  assert_int_equal(f->fs.restored, 1);
  assert_non_null(seg = gshmd_registry_find_name(&f->reg, "s/a"));
  assert_true(seg->id == 1 && !seg->unlinked && seg->fs_replaced == 0);
  assert_null(gshmd_registry_find_id(&f->reg, 9));
  assert_true(f->fs.publish_last == 10); /* the mark passes it once rewritten */
}

/* The replacing publish came back whole but unmarked: the new one has the
 * name; the old one stays unlinked and held until the mark passes (not
 * freed before: the store may yet need it). */
static void test_replace_whole_keeps_the_old_held(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[3] = {replaced(1, "s/a", 10), member(9, "s/a", 10, 2),
                            member(10, "s/b", 10, 2)};
  struct gshmd_segment *old;

  restore_bucket(f, r, 3, 0);
  assert_int_equal(f->fs.restored, 3);
  assert_true(gshmd_registry_find_name(&f->reg, "s/a")->id == 9);
  assert_non_null(old = gshmd_registry_find_id(&f->reg, 1));
  assert_true(old->unlinked && old->fs_replaced == 10);
}

/* At or below the mark a replace's unlink counts as any unlink. */
static void test_replace_below_the_mark_is_an_unlink(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[1] = {replaced(1, "s/a", 10)};
  struct gshmd_segment *old;

  restore_bucket(f, r, 1, 10);
  assert_null(gshmd_registry_find_name(&f->reg, "s/a"));
  assert_non_null(old = gshmd_registry_find_id(&f->reg, 1));
  assert_true(old->unlinked && old->fs_replaced == 0);
}

/* The store on: a service manager at $NOTIFY_SOCKET, a datagram socket
 * in dir (a mkdtemp template) whose fd it returns, to read (or not) what
 * gshmd sends. */
static int store_on(struct fixture *f, char *dir, struct sockaddr_un *sa) {
  int ns;

  assert_non_null(mkdtemp(dir));
  snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/notify", dir);
  ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_int_equal(bind(ns, (struct sockaddr *)sa, sizeof(*sa)), 0);
  setenv("NOTIFY_SOCKET", sa->sun_path, 1);
  gshmd_fdstore_shutdown(&f->fs);
  assert_int_equal(gshmd_fdstore_setup(&f->fs, &f->reg), 0); /* on, now */
  return ns;
}

static void store_off(int ns, char *dir, const struct sockaddr_un *sa) {
  unsetenv("NOTIFY_SOCKET");
  close(ns);
  unlink(sa->sun_path);
  rmdir(dir);
}

/* ---- names as systemd's store keeps them ---- */

/* One fd systemd's store holds (the test's model): its name, and whether
 * this run's gshmd stored it. */
struct held {
  char name[32];
  bool ours;
};

/* Applies what gshmd sent to $NOTIFY_SOCKET (ns) to the model h[0..*n) as
 * systemd does: FDSTORE=1 adds an fd under its name (another fd of a name
 * held is kept too), FDSTOREREMOVE=1 removes every fd of the name. */
static void systemd_apply(int ns, struct held *h, int *n) {
  char buf[512];
  union {
    struct cmsghdr align;
    char b[CMSG_SPACE(sizeof(int) * 8)];
  } ctl;

  for (;;) {
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                        .msg_controllen = sizeof(ctl.b)};
    ssize_t len = recvmsg(ns, &mh, MSG_DONTWAIT);
    char name[32] = "";
    const char *p;
    if (len < 0)
      return;
    buf[len] = '\0';
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
        for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++)
          close(((int *)CMSG_DATA(c))[k]);
    if ((p = strstr(buf, "FDNAME=")))
      sscanf(p + 7, "%31[^\n]", name);
    if (!strncmp(buf, "FDSTORE=1", 9) && *name) {
      assert_true(*n < 64);
      snprintf(h[*n].name, sizeof(h[*n].name), "%s", name);
      h[(*n)++].ours = true;
    } else if (!strncmp(buf, "FDSTOREREMOVE=1", 15) && *name) {
      int m = 0;
      for (int i = 0; i < *n; i++)
        if (strcmp(h[i].name, name))
          h[m++] = h[i];
      *n = m;
    }
  }
}

static bool holds_ours(const struct held *h, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (h[i].ours && !strcmp(h[i].name, name))
      return true;
  return false;
}

/* The only bucket, b0, comes back with one end (its datagram in that
 * end's queue): its member moves to a new bucket and b0's name is retired
 * (FDSTOREREMOVE, which removes every fd of the name) once the new one is
 * stored.  The new bucket must not be numbered 0: its end stored as b0a
 * went with the retired one, the next rewrite put the datagram in the
 * queue of that end, which the store no longer held, and the next restart
 * lost every member.  Before, bucket_add numbered it 0 (fs->nbuckets did
 * not count a bucket that was not kept). */
static void test_one_ended_bucket_number_not_reused(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r = record(7, "x", 0600, false);
  char dir[] = "/tmp/gshm-fdstore-XXXXXX", a[32], b[32];
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct held h[64] = {{"b0a", false}};
  struct gshmd_segment *seg;
  int sv[2], ns, n = 1;

  ns = store_on(f, dir, &sa);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 1, &r, 1); /* into a's queue */
  close(sv[1]);                  /* b0b lost */
  put(&f->st, "b0a", sv[0]);
  restore(f);
  systemd_apply(ns, h, &n);
  assert_non_null(seg = gshmd_registry_find_id(&f->reg, 7));
  assert_true(seg->fs_bucket > 0);
  snprintf(a, sizeof(a), "b%ua", seg->fs_bucket - 1);
  snprintf(b, sizeof(b), "b%ub", seg->fs_bucket - 1);
  print_message("    segment 7 moved to bucket %u; the store holds %s: %s, %s: %s\n",
                seg->fs_bucket - 1, a, holds_ours(h, n, a) ? "yes" : "no", b,
                holds_ours(h, n, b) ? "yes" : "no");
  assert_true(holds_ours(h, n, a));
  assert_true(holds_ours(h, n, b));
  store_off(ns, dir, &sa);
}

/* A SIGKILL inside a journal write (fdstore_journal.c: the older copy's
 * contents, then its 16-byte header) leaves that copy's old header over
 * torn contents, the other copy whole: bucket 0's datagram (seq 10, x
 * 0600), its journal copy 0 (seq 12, x 0640, whole) and copy 1 (header
 * seq 11, contents half overwritten).  Restore takes copy 0: x is 0640.
 * Held before this test (a regression test of the restart audit). */
static void test_torn_journal_copy_is_the_older(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord old = record(7, "x", 0600, false), now = record(7, "x", 0640, false);
  const off_t slot = (192 << 10) + 4096, copy1 = 4096 + slot;
  struct {
    uint64_t seq;
    uint32_t len, pad;
  } sh;
  uint8_t junk[256];
  int sv[2], j;

  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 10, &old, 1);
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  j = journal2_copy(0, 12, &now, 1);
  /* copy 1: what copy 0's record was at seq 11, then torn by the next write */
  assert_int_equal(pread(j, &sh, sizeof(sh), 4096), (ssize_t)sizeof(sh));
  sh.seq = 11;
  memset(junk, 0xa5, sizeof(junk));
  assert_true(pwrite(j, &sh, sizeof(sh), copy1) == (ssize_t)sizeof(sh) &&
              pwrite(j, junk, sizeof(junk), copy1 + 16) == (ssize_t)sizeof(junk));
  put(&f->st, "journal2", j);
  restore(f);
  assert_int_equal(f->fs.restored, 1);
  assert_int_equal(f->fs.from_journal, 1);
  assert_int_equal(gshmd_registry_find_id(&f->reg, 7)->mode, 0640);
}

/* A bucket, b0, came back with one end while the store could take
 * nothing (its $NOTIFY_SOCKET gone, the journal handed back): its members
 * moved to a new bucket whose ends and datagram never reached the store
 * (its state in the journal only), so b0's name is still owed its retire
 * and b0a keeps its datagram.  Then member x is revoked (freed, its pages
 * punched) and y is chmod'ed, and gshmd restarts before the store caught
 * up: x must not come back, y must, with its new mode.  Before, both came
 * back from b0a's stale datagram: x named, its memory zeroed, and y's
 * chmod undone. */
static void test_freed_member_of_one_ended_bucket_stays_gone(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(7, "x", 0600, false), record(8, "y", 0600, false)};
  char dir[] = "/tmp/gshm-fdstore-XXXXXX";
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct gshmd_cred root = {.pid = 2000, .uid = 0, .gid = 0, .admin = true};
  struct gshmd_client *c = NULL;
  const char *msg = NULL;
  int sv[2], ns, kept_end, kept_journal;

  ns = store_on(f, dir, &sa);
  close(ns); /* nobody listens any more: every FDSTORE=1 fails */
  unlink(sa.sun_path);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 30, r, 2); /* into a's queue */
  close(sv[1]);                  /* b0b lost */
  kept_end = dup(sv[0]);         /* systemd's own copies */
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "journal2", journal2(0));
  kept_journal = dup(f->st.fds[1]);
  restore(f);
  assert_true(f->fs.nretire > 0); /* b0a owed its retire: the store is behind */
  assert_int_equal(gshmd_registry_client_add(&f->reg, &root, &c), 0);
  assert_int_equal(gshmd_registry_revoke(&f->reg, c, "x", 0, &msg), 0);
  assert_null(gshmd_registry_find_id(&f->reg, 7));
  assert_int_equal(gshmd_registry_chmod(&f->reg, c, "y", 0640, &msg), 0);
  unsetenv("NOTIFY_SOCKET");
  rmdir(dir);
  /* the restart: what systemd holds */
  assert_int_equal(teardown(state), 0);
  assert_int_equal(setup(state), 0);
  f = *state;
  put(&f->st, "b0a", kept_end);
  put(&f->st, "journal2", kept_journal);
  restore(f);
  assert_null(gshmd_registry_find_name(&f->reg, "x"));
  assert_null(gshmd_registry_find_id(&f->reg, 7));
  assert_non_null(gshmd_registry_find_name(&f->reg, "y"));
  assert_int_equal(gshmd_registry_find_name(&f->reg, "y")->mode, 0640);
}

/* A pulled set of 2 (ids 6, 7: publish 7) came back whole in b0 (both
 * ends) but unmarked, while the store stays behind for another bucket:
 * b1 came back with one end, and its member 3 moves to a new bucket whose
 * ends never reach the store (nobody reads $NOTIFY_SOCKET), so the
 * journal's mark cannot pass 7.  Then 6 is unlinked, unleased: freed; and
 * gshmd restarts.  7, live all along, must come back.  Before, 6 was
 * freed and b0 rewritten without it: the set came back 1 of 2, was taken
 * for one cut short by a crash, and 7 was dropped.  Now 6 is held,
 * unlinked, until the mark passes its publish, and comes back so. */
static void test_member_freed_before_the_mark_keeps_its_set(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord set[2] = {member(6, "s/a", 7, 2), member(7, "s/b", 7, 2)};
  Gshm__StateRecord other = record(3, "z", 0600, false);
  char dir[] = "/tmp/gshm-fdstore-XXXXXX";
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct gshmd_cred root = {.pid = 2000, .uid = 0, .gid = 0, .admin = true};
  struct gshmd_client *c = NULL;
  struct gshmd_segment *seg;
  const char *msg = NULL;
  int b0[2], b1[2], kept[4], ns;

  ns = store_on(f, dir, &sa);
  close(ns); /* nobody listens any more: every FDSTORE=1 fails */
  unlink(sa.sun_path);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, b0), 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, b1), 0);
  queue_bucket_n(b0[1], 0, 10, set, 2);
  queue_bucket_n(b1[1], 1, 11, &other, 1);
  close(b1[1]); /* b1b lost */
  put(&f->st, "b0a", b0[0]);
  put(&f->st, "b0b", b0[1]);
  put(&f->st, "b1a", b1[0]);
  put(&f->st, "journal2", journal2(0));
  for (int i = 0; i < 4; i++) /* systemd's own copies */
    kept[i] = dup(f->st.fds[i]);
  restore(f);
  assert_int_equal(f->fs.cut, 0);
  assert_true(f->fs.ndirty + f->fs.nunplaced > 0); /* behind */
  assert_true(f->fs.publish_done < 7);
  gshmd_registry_reap_unlinked(&f->reg); /* (the grace period over) */
  assert_int_equal(gshmd_registry_client_add(&f->reg, &root, &c), 0);
  assert_int_equal(gshmd_registry_unlink(&f->reg, c, "s/a", &msg), 0);
  assert_non_null(seg = gshmd_registry_find_id(&f->reg, 6)); /* held, not freed */
  assert_true(seg->unlinked && seg->fs_replaced == 7);
  unsetenv("NOTIFY_SOCKET");
  rmdir(dir);
  /* the restart: what systemd holds */
  assert_int_equal(teardown(state), 0);
  assert_int_equal(setup(state), 0);
  f = *state;
  put(&f->st, "b0a", kept[0]);
  put(&f->st, "b0b", kept[1]);
  put(&f->st, "b1a", kept[2]);
  put(&f->st, "journal2", kept[3]);
  restore(f);
  assert_int_equal(f->fs.cut, 0);
  assert_non_null(gshmd_registry_find_name(&f->reg, "s/b"));
  assert_non_null(gshmd_registry_find_name(&f->reg, "z"));
  assert_null(gshmd_registry_find_name(&f->reg, "s/a"));
  assert_non_null(seg = gshmd_registry_find_id(&f->reg, 6)); /* unlinked, held again */
  assert_true(seg->unlinked && seg->fs_replaced == 7);
}

/* A set of 2 (ids 6, 7: publish 7) above the journal's mark, 6 revoked
 * before the mark (its record kept, marked revoked): the set counts as
 * whole, 7 comes back, and 6 is not a segment again (no id, no name: a
 * revoke is never undone) but stays held, out of the registry, until the
 * mark passes.  Once the mark passed 7, a revoked record left behind (a
 * crash before the rewrite without it) is dropped.  And a revoked old
 * segment of a --replace cut short is not given its name back.  Before
 * (records without the flag: the daemon changes of the commit reverted,
 * checked), 6 came back as an unlinked segment a re-take could reach,
 * and the replaced one came back named. */
static void test_revoked_record_restore(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {member(6, "s/a", 7, 2), member(7, "s/b", 7, 2)};
  Gshm__StateRecord old = record(4, "m", 0600, true), cut = member(8, "m", 9, 2);

  r[0].unlinked = r[0].revoked = true;
  restore_bucket(f, r, 2, 0);
  assert_int_equal(f->fs.cut, 0);
  assert_int_equal(f->fs.restored, 1);
  assert_non_null(gshmd_registry_find_name(&f->reg, "s/b"));
  assert_null(gshmd_registry_find_id(&f->reg, 6));
  assert_int_equal(f->fs.nheld, 1);
  assert_true(f->fs.held[0]->id == 6 && f->fs.held[0]->fs_revoked);
  assert_int_equal(f->reg.nsegments, 1);

  assert_int_equal(teardown(state), 0); /* the mark passed 7 */
  assert_int_equal(setup(state), 0);
  f = *state;
  restore_bucket(f, r, 2, 7);
  assert_int_equal(f->fs.restored, 1);
  assert_null(gshmd_registry_find_id(&f->reg, 6));
  assert_int_equal(f->fs.nheld, 0);

  assert_int_equal(teardown(state), 0); /* 4 replaced by 9, cut short */
  assert_int_equal(setup(state), 0);
  f = *state;
  old.revoked = true;
  old.replaced_by = 9;
  old.publish = 5; /* (its own set, above the mark and whole: kept) */
  old.publish_members = 1;
  old.id = 5;
  {
    Gshm__StateRecord b[2] = {old, cut};
    restore_bucket(f, b, 2, 0);
  }
  assert_int_equal(f->fs.cut, 1);
  assert_null(gshmd_registry_find_name(&f->reg, "m"));
  assert_null(gshmd_registry_find_id(&f->reg, 5));
  assert_int_equal(f->fs.nheld, 1);
}

/* ---- a sticky CUDA error in the restore ---- */

/* A bucket of a host segment and a device segment whose adopt hits a
 * sticky CUDA error (fake_cuda_gpus.c), the store on (a service manager
 * that reads nothing at $NOTIFY_SOCKET), daemon.sticky_start = restart
 * (fs.sticky_restart): the restore fails, the backend
 * asks for a restart, and the bucket is left as systemd holds it, with
 * both segments, for the next start.  (The device segment was dropped
 * from the store: its bucket was rewritten without it, and so was every
 * device segment after it, all failing the same way.) */
static void test_sticky_cuda_error_leaves_the_store_alone(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "h", 0600, false), record(2, "d", 0600, false)};
  char dir[] = "/tmp/gshm-fdstore-XXXXXX";
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int sv[2], ns;

  r[1].location = FAKE_GPU0_LOCATION;
  r[1].size = r[1].requested_size = FAKE_GRAN;
  assert_int_equal(gshmd_backend_cuda_create(&f->cfg, &f->reg.cuda, NULL), 0);
  ns = store_on(f, dir, &sa);
  f->fs.sticky_restart = true;
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 1, r, 2); /* into a's queue */
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  fake_fail_call = "cuMemImportFromShareableHandle";
  fake_fail_with = CUDA_ERROR_ILLEGAL_ADDRESS;
  assert_int_not_equal(gshmd_fdstore_restore(&f->fs, f->st.fds, f->st.names, f->st.n), 0);
  assert_null(fake_fail_call);
  assert_true(gshmd_backend_needs_restart(f->reg.cuda));
  assert_true(queued(sv[0])); /* the datagram with both, where it was */
  assert_false(queued(sv[1]));
  store_off(ns, dir, &sa);
  f->reg.cuda->ops->destroy(f->reg.cuda); /* (it holds no segment of the registry's) */
  f->reg.cuda = NULL;
}

/* The same with daemon.sticky_start = serve (the default): the device
 * segment whose adopt met the error, and every later one (no driver call
 * after it), are kept parked with their fds, the restore goes on, and the
 * host segment is served; the backend still asks for a restart (main.c
 * then parks what it adopted before: gshmd_registry_park_all).  Before:
 * the restore failed, and gshmd exited without serving anything. */
static void test_sticky_cuda_error_parks_device_segments(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[3] = {record(1, "h", 0600, false), record(2, "d", 0600, false),
                            record(3, "e", 0600, false)};
  struct gshmd_segment *d, *e;
  unsigned calls;

  r[1].location = r[2].location = FAKE_GPU0_LOCATION;
  r[1].size = r[1].requested_size = r[2].size = r[2].requested_size = FAKE_GRAN;
  assert_int_equal(gshmd_backend_cuda_create(&f->cfg, &f->reg.cuda, NULL), 0);
  assert_false(f->fs.sticky_restart); /* (the default) */
  fake_fail_call = "cuMemImportFromShareableHandle";
  fake_fail_with = CUDA_ERROR_ILLEGAL_ADDRESS;
  calls = fake_calls;
  restore_bucket(f, r, 3, 0);
  assert_int_equal(fake_calls, calls + 1); /* the failed import, none for "e" */
  assert_true(gshmd_backend_needs_restart(f->reg.cuda));
  assert_int_equal(f->fs.restored, 3);
  assert_int_equal(f->fs.dropped, 0);
  assert_ptr_equal(gshmd_registry_find_name(&f->reg, "h")->mem->backend, f->reg.host);
  assert_non_null(d = gshmd_registry_find_name(&f->reg, "d"));
  assert_non_null(e = gshmd_registry_find_name(&f->reg, "e"));
  assert_ptr_equal(d->mem->backend, gshmd_backend_parked());
  assert_ptr_equal(e->mem->backend, gshmd_backend_parked());
  assert_string_equal(e->mem->location, FAKE_GPU0_LOCATION);
  f->reg.cuda->ops->destroy(f->reg.cuda); /* (it holds no segment of the registry's) */
  f->reg.cuda = NULL;
}

/* After a sticky error, segments the CUDA backend adopted before it are
 * moved to the parked backend with a copy of their fd, no driver call,
 * and charged as before (a GPU's bytes, not the host's). */
static void test_park_all_moves_cuda_segments(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[2] = {record(1, "d", 0600, false), record(2, "h", 0600, false)};
  struct gshmd_segment *d;
  struct gshmd_alloc *was;
  unsigned calls;
  int fd = -1;

  r[0].location = FAKE_GPU0_LOCATION;
  r[0].size = r[0].requested_size = FAKE_GRAN;
  assert_int_equal(gshmd_backend_cuda_create(&f->cfg, &f->reg.cuda, NULL), 0);
  restore_bucket(f, r, 2, 0);
  assert_non_null(d = gshmd_registry_find_name(&f->reg, "d"));
  was = d->mem;
  assert_ptr_equal(was->backend, f->reg.cuda);
  f->reg.cuda->needs_restart = true; /* (as gshmd__cuda_failed sets it) */
  calls = fake_calls;
  assert_int_equal(gshmd_registry_park_all(&f->reg, f->reg.cuda), 1);
  assert_int_equal(fake_calls, calls);
  assert_ptr_equal(d->mem->backend, gshmd_backend_parked());
  assert_int_equal(d->mem->size, FAKE_GRAN);
  assert_string_equal(d->mem->location, FAKE_GPU0_LOCATION);
  assert_int_equal(d->mem->backend->ops->park_fd(d->mem->backend, d->mem, &fd), 0);
  assert_true(fcntl(fd, F_GETFD) >= 0);
  assert_ptr_equal(gshmd_registry_find_name(&f->reg, "h")->mem->backend, f->reg.host);
  assert_int_equal(gshmd__reg_usage_get(&f->reg, 1000)->cuda_bytes, FAKE_GRAN);
  assert_int_equal(gshmd_registry_park_all(&f->reg, f->reg.cuda), 0);
  f->reg.cuda->ops->destroy(f->reg.cuda);
  f->reg.cuda = NULL;
}

/* Device segments that no GPU of this gshmd takes: without a CUDA
 * backend (its driver missing or failing to start), and with one whose
 * GPUs do not include the segment's: each is kept parked with its fd
 * (the store keeps it for a later gshmd) under its name, listed, not
 * opened (-ENODEV).  Before: dropped from the store for good. */
static void parked_restore(struct fixture *f, const char *location) {
  Gshm__StateRecord r[2] = {record(1, "h", 0600, false), record(2, "d", 0600, false)};
  struct gshmd_segment *seg;
  int sv[2], fd = -1;

  r[1].location = (char *)location;
  r[1].size = r[1].requested_size = FAKE_GRAN;
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  queue_bucket(sv[1], 1, r, 2);
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  restore(f);
  assert_int_equal(f->fs.restored, 2);
  assert_int_equal(f->fs.dropped, 0);
  assert_non_null(gshmd_registry_find_name(&f->reg, "h"));
  assert_non_null(seg = gshmd_registry_find_name(&f->reg, "d"));
  assert_ptr_equal(seg->mem->backend, gshmd_backend_parked());
  assert_string_equal(seg->mem->location, location);
  assert_int_equal(seg->mem->backend->ops->export_fd(seg->mem->backend, seg->mem, true, &fd),
                   -ENODEV);
  assert_int_equal(seg->mem->backend->ops->park_fd(seg->mem->backend, seg->mem, &fd), 0);
  assert_true(fcntl(fd, F_GETFD) >= 0); /* the fd the store handed back, kept */
  /* a GPU's bytes for uid 1000's quotas, not the host's (were the host's) */
  assert_int_equal(gshmd__reg_usage_get(&f->reg, 1000)->cuda_bytes, FAKE_GRAN);
  assert_int_equal(gshmd__reg_usage_get(&f->reg, 1000)->host_bytes, 4096);
  /* (the registry's destroy frees it: its fd closed, under ASan no leak) */
}

static void test_device_segment_parked_without_cuda(void **state) {
  parked_restore(*state, FAKE_GPU0_LOCATION);
}

static void test_device_segment_parked_gpu_gone(void **state) {
  struct fixture *f = *state;

  assert_int_equal(gshmd_backend_cuda_create(&f->cfg, &f->reg.cuda, NULL), 0);
  parked_restore(f, "cuda:GPU-99999999-9999-9999-9999-999999999999");
  f->reg.cuda->ops->destroy(f->reg.cuda); /* (it holds no segment of the registry's) */
  f->reg.cuda = NULL;
}

/* A create sent again after a restart (its token, uid, size and flags;
 * libgshm resends one whose reply the restart lost) for a device segment
 * that the restore parked: -ENODEV saying that its create made the
 * segment, that it is parked and why, and no lease; it answered -EEXIST
 * "exists" before, as to anybody else's create, and the creator could not
 * tell its own segment from another's.  Another token still meets
 * -EEXIST. */
static void test_resent_create_of_parked_segment(void **state) {
  struct fixture *f = *state;
  uint8_t t[16] = "0123456789abcdef", other[16] = "fedcba9876543210";
  Gshm__StateRecord rec = record(1, "d", 0600, false);
  Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
  struct gshmd_cred cred = {.pid = 2000, .uid = 1000, .gid = 1000};
  struct gshmd_client *c = NULL;
  struct gshmd_lease *l = NULL;
  const char *msg = NULL;
  bool resent = true;

  rec.location = FAKE_GPU0_LOCATION;
  rec.size = rec.requested_size = FAKE_GRAN;
  rec.create_token = (ProtobufCBinaryData){16, t};
  restore_bucket(f, &rec, 1, 0);
  assert_ptr_equal(gshmd_registry_find_name(&f->reg, "d")->mem->backend, gshmd_backend_parked());
  assert_int_equal(gshmd_registry_client_add(&f->reg, &cred, &c), 0);
  req.name = "d";
  req.size = FAKE_GRAN;
  req.location = "cuda:0";
  req.create_token = (ProtobufCBinaryData){16, t};
  assert_int_equal(gshmd_registry_create(&f->reg, c, &req, &l, &resent, &msg), -ENODEV);
  assert_null(l);
  assert_false(resent);
  assert_non_null(strstr(msg, "is parked"));
  assert_non_null(strstr(msg, gshmd_backend_parked_why(false)));
  assert_int_equal(f->reg.nleases, 0);
  req.create_token.data = other;
  assert_int_equal(gshmd_registry_create(&f->reg, c, &req, &l, &resent, &msg), -EEXIST);
}

/* Create tokens through the store: a record's 16-byte token comes back
 * with its segment; one of another length is none.  A record carrying a
 * pulled segment's source and a token as well (no gshmd writes one: a
 * corrupt store) is restored, and written back with the source alone,
 * so that a record stays within the bucket's bound (RECORD_FIXED_MAX
 * counts one of the two). */
static void test_create_token_restored(void **state) {
  struct fixture *f = *state;
  uint8_t t[16] = "0123456789abcdef";
  Gshm__StateRecord recs[3] = {record(1, "tok", 0600, false), record(2, "short", 0600, false),
                               record(3, "both", 0600, false)};
  struct gshmd_segment *s1, *s2, *s3;
  Gshm__StateRecord x;

  recs[0].create_token = (ProtobufCBinaryData){16, t};
  recs[1].create_token = (ProtobufCBinaryData){5, t};
  recs[2].create_token = (ProtobufCBinaryData){16, t};
  recs[2].source = "peer:x#1.1";
  restore_bucket(f, recs, 3, 0);
  assert_non_null(s1 = gshmd_registry_find_name(&f->reg, "tok"));
  assert_non_null(s2 = gshmd_registry_find_name(&f->reg, "short"));
  assert_non_null(s3 = gshmd_registry_find_name(&f->reg, "both"));
  assert_true(s1->has_token);
  assert_memory_equal(s1->create_token, t, 16);
  assert_false(s2->has_token);
  gshmd__fdstore_fill_record(s1, 0, &x);
  assert_int_equal(x.create_token.len, 16);
  assert_memory_equal(x.create_token.data, t, 16);
  gshmd__fdstore_fill_record(s2, 0, &x);
  assert_int_equal(x.create_token.len, 0);
  gshmd__fdstore_fill_record(s3, 0, &x);
  assert_string_equal(x.source, "peer:x#1.1");
  assert_int_equal(x.create_token.len, 0);
}

/* Bucket 0's payload (gshmd__bucket_pack), unpacked: its record of id. */
static Gshm__StateBucket *payload(struct fixture *f, uint64_t done) {
  uint8_t *buf = NULL;
  size_t len = gshmd__bucket_pack(f->fs.buckets[0], 9, done, &buf);
  Gshm__StateBucket *t;

  assert_non_null(buf);
  assert_non_null(t = gshm__state_bucket__unpack(NULL, len, buf));
  free(buf);
  assert_int_equal(t->seq, 9);
  assert_int_equal(t->bucket, 0);
  assert_int_equal(t->publish_done, done);
  return t;
}

static const Gshm__StateRecord *record_of(const Gshm__StateBucket *t, uint64_t id) {
  for (size_t i = 0; i < t->n_segments; i++)
    if (t->segments[i]->id == id)
      return t->segments[i];
  fail_msg("id %llu not in the bucket", (unsigned long long)id);
  return NULL;
}

/* Each member's packed record is kept (a bucket rewrite packed every one
 * again: about 40% of a create+unlink) and packed again when what it says
 * changes, whatever changed it: the payload says each member as it is
 * now.  Checked: with the kept record used whatever changed, the chmod
 * below is not in the payload.  The second source below gets the first
 * one's address from glibc (checked): a record compared by pointer would
 * keep the old one. */
static void test_bucket_payload_follows_changes(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord recs[2] = {record(1, "a", 0600, false), record(2, "b", 0644, false)};
  struct gshmd_segment *a;
  const uint8_t *p1, *p2;
  Gshm__StateBucket *t;
  size_t n1, n2;

  restore_bucket(f, recs, 2, 0);
  assert_non_null(a = gshmd_registry_find_name(&f->reg, "a"));
  assert_non_null(p1 = gshmd__fdstore_record(a, 0, &n1));
  assert_non_null(p2 = gshmd__fdstore_record(a, 0, &n2));
  assert_ptr_equal(p1, p2); /* kept */
  assert_int_equal(n1, n2);
  t = payload(f, 0);
  assert_int_equal(t->n_segments, 2);
  assert_int_equal(record_of(t, 1)->mode, 0600);
  assert_string_equal(record_of(t, 1)->name, "a");
  assert_string_equal(record_of(t, 1)->location, "host");
  assert_int_equal(record_of(t, 2)->mode, 0644);
  gshm__state_bucket__free_unpacked(t, NULL);

  a->mode = 0640; /* (as a chmod, a chown, an unlink leave it) */
  a->uid = 4242;
  a->unlinked = true;
  t = payload(f, 0);
  assert_int_equal(record_of(t, 1)->mode, 0640);
  assert_int_equal(record_of(t, 1)->uid, 4242);
  assert_true(record_of(t, 1)->unlinked);
  assert_int_equal(record_of(t, 2)->mode, 0644);
  gshm__state_bucket__free_unpacked(t, NULL);
  /* (only the flag was set: the name is still in the registry's tree, which
   * a real unlink leaves; set, the teardown's free skipped the tree's node
   * and the next free's walk read the freed segment: ASan) */
  a->unlinked = false;

  a->fs_publish = 5; /* a publish's tag, then the mark past it */
  a->fs_publish_n = 2;
  t = payload(f, 4);
  assert_int_equal(record_of(t, 1)->publish, 5);
  assert_int_equal(record_of(t, 1)->publish_members, 2);
  gshm__state_bucket__free_unpacked(t, NULL);
  t = payload(f, 5);
  assert_int_equal(record_of(t, 1)->publish, 0);
  gshm__state_bucket__free_unpacked(t, NULL);

  /* a pull replaces the source string: malloc may give the new one the
   * old one's address (compared by value, not by pointer) */
  assert_non_null(a->source = strdup("peer:x#1.1"));
  t = payload(f, 5);
  assert_string_equal(record_of(t, 1)->source, "peer:x#1.1");
  gshm__state_bucket__free_unpacked(t, NULL);
  free(a->source);
  assert_non_null(a->source = strdup("peer:y#2.2"));
  t = payload(f, 5);
  assert_string_equal(record_of(t, 1)->source, "peer:y#2.2");
  gshm__state_bucket__free_unpacked(t, NULL);
}

/* A restart after a sticky CUDA error keeps every segment only with a
 * store that a service manager holds and that owes it nothing. */
static void test_keeps_all_only_when_on_and_caught_up(void **state) {
  struct fixture *f = *state;

  assert_false(f->fs.enabled); /* (no $NOTIFY_SOCKET: off) */
  assert_false(gshmd_fdstore_keeps_all(&f->fs));
  f->fs.enabled = true;
  assert_true(gshmd_fdstore_keeps_all(&f->fs));
  f->fs.ndirty = 1; /* a bucket owed */
  assert_false(gshmd_fdstore_keeps_all(&f->fs));
  f->fs.ndirty = 0;
  f->fs.nunplaced = 1; /* a segment no bucket took */
  assert_false(gshmd_fdstore_keeps_all(&f->fs));
  f->fs.nunplaced = 0;
  f->fs.enabled = false;
}

/* The resend memo: found by its token, uid and kind only; kept in the
 * journal that the next gshmd adopts, where it goes only after
 * GSHMD_MEMO_ENTRIES newer entries; nothing without a journal. */
static void test_resend_memo(void **state) {
  struct gshmd_fdstore fs = {.journal_fd = -1}, next = {.journal_fd = -1};
  uint8_t tok[GSHMD_MEMO_TOKEN_BYTES], other[GSHMD_MEMO_TOKEN_BYTES];
  uint64_t id = 0;

  (void)state;
  memset(tok, 0xa5, sizeof(tok));
  memcpy(other, tok, sizeof(other));
  other[15] ^= 1;
  assert_int_equal(gshmd_fdstore_memo_put(&fs, tok, 1000, GSHMD_MEMO_REVOKE, 7), -EBADF);
  assert_false(gshmd_fdstore_memo_find(&fs, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_false(gshmd_fdstore_memo_find(NULL, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_int_equal(gshmd__journal_create(&fs), 0);
  assert_false(gshmd_fdstore_memo_find(&fs, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_int_equal(gshmd_fdstore_memo_put(&fs, tok, 1000, GSHMD_MEMO_REVOKE, 7), 0);
  assert_false(gshmd_fdstore_memo_find(&fs, other, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_false(gshmd_fdstore_memo_find(&fs, tok, 1001, GSHMD_MEMO_REVOKE, &id));
  assert_false(gshmd_fdstore_memo_find(&fs, tok, 1000, (enum gshmd_memo_kind)2, &id));
  assert_int_equal(id, 0);
  assert_true(gshmd_fdstore_memo_find(&fs, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_int_equal(id, 7);
  /* the next gshmd: the entry is there, and new ones go after it */
  assert_true(gshmd__journal_adopt(&next, dup(fs.journal_fd)));
  assert_int_equal(next.memo_seq, 1);
  id = 0;
  assert_true(gshmd_fdstore_memo_find(&next, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_int_equal(id, 7);
  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES - 1; i++)
    assert_int_equal(gshmd_fdstore_memo_put(&next, other, 1000, GSHMD_MEMO_REVOKE, 100 + i), 0);
  assert_true(gshmd_fdstore_memo_find(&next, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  assert_int_equal(gshmd_fdstore_memo_put(&next, other, 1000, GSHMD_MEMO_REVOKE, 200), 0);
  assert_false(gshmd_fdstore_memo_find(&next, tok, 1000, GSHMD_MEMO_REVOKE, &id));
  close(next.journal_fd);
  close(fs.journal_fd);
}

/* The memo is shared by the users: one user's requests, however many,
 * keep another's newest GSHMD_MEMO_PER_UID entries.  Before, 64 puts of
 * uid 1001 (a loop of create and unlink) evicted uid 1000's entry, and
 * its resend after a restart found nothing. */
static void test_resend_memo_shared(void **state) {
  struct gshmd_fdstore fs = {.journal_fd = -1};
  uint8_t tok[GSHMD_MEMO_TOKEN_BYTES], churn[GSHMD_MEMO_TOKEN_BYTES];
  uint64_t id = 0;

  (void)state;
  memset(tok, 0x5a, sizeof(tok));
  memset(churn, 0x33, sizeof(churn));
  assert_int_equal(gshmd__journal_create(&fs), 0);
  /* one entry of uid 1000, then 1,000 of uid 1001: 1000's stays */
  assert_int_equal(gshmd_fdstore_memo_put(&fs, tok, 1000, GSHMD_MEMO_UNLINK, 7), 0);
  for (uint32_t i = 0; i < 1000; i++) {
    churn[0] = (uint8_t)i;
    churn[1] = (uint8_t)(i >> 8);
    assert_int_equal(gshmd_fdstore_memo_put(&fs, churn, 1001, GSHMD_MEMO_UNLINK, 100 + i), 0);
  }
  assert_true(gshmd_fdstore_memo_find(&fs, tok, 1000, GSHMD_MEMO_UNLINK, &id));
  assert_int_equal(id, 7);
  /* 1001's newest are there, its oldest went (its own share) */
  assert_true(gshmd_fdstore_memo_find(&fs, churn, 1001, GSHMD_MEMO_UNLINK, &id));
  assert_int_equal(id, 100 + 999);
  churn[0] = churn[1] = 0;
  assert_false(gshmd_fdstore_memo_find(&fs, churn, 1001, GSHMD_MEMO_UNLINK, &id));
  /* a new memo: uid 1000 alone fills it (its 64 newest), then 1001 takes
   * GSHMD_MEMO_PER_UID of them, 1000's oldest: its newest 48 stay */
  close(fs.journal_fd);
  fs = (struct gshmd_fdstore){.journal_fd = -1};
  assert_int_equal(gshmd__journal_create(&fs), 0);
  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES; i++) {
    tok[0] = (uint8_t)i;
    assert_int_equal(gshmd_fdstore_memo_put(&fs, tok, 1000, GSHMD_MEMO_REVOKE, 200 + i), 0);
  }
  for (uint32_t i = 0; i < 1000; i++) {
    churn[0] = (uint8_t)i;
    churn[1] = (uint8_t)(i >> 8);
    assert_int_equal(gshmd_fdstore_memo_put(&fs, churn, 1001, GSHMD_MEMO_REVOKE, 100 + i), 0);
  }
  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES; i++) {
    tok[0] = (uint8_t)i;
    assert_int_equal(gshmd_fdstore_memo_find(&fs, tok, 1000, GSHMD_MEMO_REVOKE, &id),
                     i >= GSHMD_MEMO_PER_UID);
  }
  close(fs.journal_fd);
}

/* The grace period's end frees each restored segment left unlinked and
 * unleased (gshmd_registry_reap_unlinked).  With the store behind until
 * then, the first such free's event lets the store catch up, record the
 * publish mark and let go of the members it held: the reap must not then
 * step onto one of those, freed under it. */
static void test_reap_while_the_store_catches_up(void **state) {
  struct fixture *f = *state;
  Gshm__StateRecord r[3] = {record(3, "z", 0600, true), member(6, "s/a", 7, 2),
                            member(7, "s/b", 7, 2)};
  Gshm__StateRecord other = record(9, "o", 0600, false);
  char dir[] = "/tmp/gshm-fdstore-XXXXXX";
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct gshm_list *pos;
  int ns, sv[2], b1[2];

  r[1].unlinked = true; /* unlinked before the mark: held for its set */
  r[1].replaced_by = 7;
  ns = store_on(f, dir, &sa);
  close(ns); /* nobody listens: every FDSTORE=1 fails, the store stays behind */
  unlink(sa.sun_path);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, b1), 0);
  queue_bucket(sv[1], 1, r, 3);
  queue_bucket_n(b1[1], 1, 11, &other, 1);
  close(b1[1]); /* b1b lost: bucket 1 is to be written again (the store behind) */
  put(&f->st, "b0a", sv[0]);
  put(&f->st, "b0b", sv[1]);
  put(&f->st, "b1a", b1[0]);
  put(&f->st, "journal2", journal2(0));
  restore(f);
  assert_true(f->fs.ndirty + f->fs.nunplaced > 0); /* behind */
  gshm_list_foreach(pos, &f->reg.segments)
      print_message("    restored id %" PRIu64 "\n",
                    gshm_list_entry(pos, struct gshmd_segment, node)->id);
  assert_non_null(gshmd_registry_find_id(&f->reg, 6));
  assert_int_equal(gshmd_registry_find_id(&f->reg, 6)->fs_replaced, 7);
  assert_true(f->fs.publish_done < 7);
  /* the service manager listens again */
  ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_int_equal(bind(ns, (struct sockaddr *)&sa, sizeof(sa)), 0);
  gshmd_registry_reap_unlinked(&f->reg);
  assert_int_equal(f->fs.publish_done, 7);
  assert_null(gshmd_registry_find_id(&f->reg, 3));
  assert_null(gshmd_registry_find_id(&f->reg, 6));
  assert_non_null(gshmd_registry_find_name(&f->reg, "s/b"));
  store_off(ns, dir, &sa);
}

/* gshmd_fdstore_passed_segments takes $LISTEN_PID whole, as
 * sd_listen_fds does: "PIDx" (strtoll without an end check read it as
 * PID) is no one's, and a failed start then does not wait 10 s for a
 * store that sd_listen_fds would not hand over. */
static void test_passed_segments_pid_strict(void **state) {
  char pid[32];
  (void)state;

  setenv("LISTEN_FDNAMES", "gshmd.sock:b0a", 1);
  snprintf(pid, sizeof(pid), "%d", (int)getpid());
  setenv("LISTEN_PID", pid, 1);
  assert_true(gshmd_fdstore_passed_segments());
  snprintf(pid, sizeof(pid), "%dx", (int)getpid());
  setenv("LISTEN_PID", pid, 1);
  assert_false(gshmd_fdstore_passed_segments());
  snprintf(pid, sizeof(pid), "%d 1", (int)getpid());
  setenv("LISTEN_PID", pid, 1);
  assert_false(gshmd_fdstore_passed_segments());
  snprintf(pid, sizeof(pid), "0%d", (int)getpid());
  setenv("LISTEN_PID", pid, 1);
  assert_false(gshmd_fdstore_passed_segments());
  setenv("LISTEN_FDNAMES", "gshmd.sock", 1);
  snprintf(pid, sizeof(pid), "%d", (int)getpid());
  setenv("LISTEN_PID", pid, 1);
  assert_false(gshmd_fdstore_passed_segments()); /* (nothing stored) */
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDNAMES");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stale_journal_record_loses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replace_cut_short_relinks_the_old, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replace_whole_keeps_the_old_held, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replace_below_the_mark_is_an_unlink, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newer_journal_record_wins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_freed_and_memoryless, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newest_holder_keeps_the_name, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unreadable_ids_record, setup, teardown),
      cmocka_unit_test_setup_teardown(test_names_parsed_strictly, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bucket_newest_datagram_wins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bucket_newest_datagram_wins_either_queue, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_id_in_two_buckets_newest_wins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_id_in_two_buckets_kept_whole_wins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_id_in_two_buckets_newest_wins_either_number, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_id_in_two_buckets_newest_without_memory, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_bucket_unreadable_is_left_queued, setup, teardown),
      cmocka_unit_test_setup_teardown(test_torn_journal_copy_is_the_older, setup, teardown),
      cmocka_unit_test_setup_teardown(test_frozen_one_ended_bucket_not_retired, setup, teardown),
      cmocka_unit_test_setup_teardown(test_entries_needed_counts_what_came_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_entries_needed_counts_buckets_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bucket_payload_follows_changes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_frozen_bucket_datagram_raises_write_seq, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_frozen_bucket_journal_copy_raises_write_seq, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fdnames_fit_at_max_segments, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_cut_short_is_dropped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_whole_is_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_whole_across_one_ended_b0, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_whole_across_one_ended_b1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_mark_from_a_bucket_without_the_journal, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_create_token_restored, setup, teardown),
      cmocka_unit_test(test_resend_memo),
      cmocka_unit_test(test_resend_memo_shared),
      cmocka_unit_test_setup_teardown(test_keeps_all_only_when_on_and_caught_up, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_below_the_mark_is_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_replace_cut_short_keeps_the_old, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_device_segment_parked_without_cuda, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_segment_parked_gpu_gone, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resent_create_of_parked_segment, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sticky_cuda_error_parks_device_segments, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_park_all_moves_cuda_segments, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_ended_bucket_number_not_reused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_freed_member_of_one_ended_bucket_stays_gone, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_member_freed_before_the_mark_keeps_its_set, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_revoked_record_restore, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sticky_cuda_error_leaves_the_store_alone, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_reap_while_the_store_catches_up, setup, teardown),
      cmocka_unit_test(test_passed_segments_pid_strict),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
