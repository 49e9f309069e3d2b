/* SPDX-License-Identifier: Apache-2.0 */
/* What the fd store's files share (fdstore.c: events, placement, stored
 * names; fdstore_bucket.c: the datagrams; fdstore_inflight.c: their fds
 * in flight; fdstore_journal.c: the journal;
 * fdstore_publish.c: a publish all or nothing; fdstore_legacy.c:
 * restoring the one-fd-per-segment format; fdstore_size.c: how much of
 * the store gshmd may take; fdstore_record.c: what a datagram says, each
 * member's record packed once).  Not for
 * the rest of gshmd: fdstore.h is the interface. */
#ifndef GSHMD_FDSTORE_INTERNAL_H
#define GSHMD_FDSTORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fdstore.h"
#include "gshm.pb-c.h"

struct gshmd_segment;

/* A bucket holds at most SCM_MAX_FD (253, include/net/scm.h) memory fds:
 * one sendmsg can carry no more. */
#define FDSTORE_BUCKET_FDS 253
/* Bytes of records a bucket's datagram may carry: well under the socket's
 * default send buffer (net.core.wmem_default, 212992 on Linux; a unix
 * datagram longer than sk_sndbuf - 32 fails with EMSGSIZE), which gshmd
 * can use without CAP_NET_ADMIN. */
#define FDSTORE_BUCKET_BYTES (192u << 10)
/* Room kept per record for a change that makes it longer (chown, unlink:
 * a few varint bytes). */
#define FDSTORE_RECORD_SLACK 16u
/* Bucket numbers above this in a stored name are not ours. */
#define FDSTORE_BUCKET_INDEX_MAX (1u << 20)
#define FDSTORE_JOURNAL_NAME "journal2"
#define FDSTORE_LEGACY_JOURNAL_NAME "journal"

struct fdstore_bucket {
  uint32_t index;          /* n of b<n>a / b<n>b */
  int end[2];              /* the socketpair's ends a and b; -1 */
  bool stored[2];          /* each end's FDSTORE=1 went through */
  int queued;              /* whose receive queue holds the datagram sent
                              last: 0 a, 1 b, -1 none */
  uint64_t seq;            /* of the newest state written (sent or journal): fs->write_seq
                              then */
  bool dirty;              /* the store lacks its current state */
  bool on_open;            /* in fs->open */
  bool frozen;             /* restore could not read it: never rewritten */
  bool rewrite;            /* restore: to be written once it is over */
  uint32_t dirty_pos;      /* index in fs->dirty */
  uint32_t n;              /* members */
  size_t bytes;            /* packed size of the last payload */
  struct gshmd_segment *seg[FDSTORE_BUCKET_FDS];
};

/* What a stored name is. */
enum fdstore_kind {
  K_OTHER,
  K_SEG,          /* legacy: seg-<id> */
  K_META,         /* legacy: meta-<id>-<v> */
  K_IDS,          /* ids-<v> */
  K_JOURNAL,      /* legacy: journal */
  K_JOURNAL2,     /* journal2 */
  K_BUCKET,       /* b<n>a (v 0), b<n>b (v 1) */
};

enum fdstore_kind gshmd__fdstore_parse_name(const char *name, uint64_t *id, uint64_t *v);

/* fdstore.c */
void gshmd__fdstore_count_failure(struct gshmd_fdstore *fs, const char *what, int r);
int gshmd__fdstore_store_fd(struct gshmd_fdstore *fs, const char *name, int fd, bool nopoll);
void gshmd__fdstore_remove(struct gshmd_fdstore *fs, const char *name);
int gshmd__fdstore_retire(struct gshmd_fdstore *fs, const char *name);
int gshmd__fdstore_adopt(struct gshmd_fdstore *fs, const Gshm__StateRecord *rec, int *fd);
int gshmd__fdstore_place(struct gshmd_fdstore *fs, struct gshmd_segment *seg, bool write);
void gshmd__fdstore_settle(struct gshmd_fdstore *fs);
void gshmd__fdstore_raise_ids(struct gshmd_registry *r, const Gshm__StateTable *t);
ssize_t gshmd__fdstore_read_record(int fd, uint8_t **buf_out);

/* fdstore_record.c */
void gshmd__fdstore_fill_record(const struct gshmd_segment *seg, uint64_t publish_done,
                                Gshm__StateRecord *x);
/* seg's record (gshmd__fdstore_fill_record) packed: kept in
 * seg->fs_record and packed again only when what it says changed (any
 * field, compared at each call: no caller need say so).  Returns the
 * bytes (seg's, valid until the next call for seg or its free), *len_out
 * their length; NULL when out of memory. */
const uint8_t *gshmd__fdstore_record(struct gshmd_segment *seg, uint64_t publish_done,
                                     size_t *len_out);
size_t gshmd__bucket_pack(const struct fdstore_bucket *b, uint64_t seq, uint64_t publish_done,
                          uint8_t **buf_out);

/* fdstore_size.c */
/* Members a bucket takes at limits.max_name max_name (its records within
 * FDSTORE_BUCKET_BYTES, at most FDSTORE_BUCKET_FDS). */
uint32_t gshmd__fdstore_capacity(uint64_t max_name);
/* At setup, under a service manager: sets fs->store_max from $FDSTORE.
 * Returns 0; -E2BIG when limits.max_segments is more than the store can
 * hand back (gshmd_fdstore_max_restorable), -ENOSPC when $FDSTORE is
 * below gshmd_fdstore_max_entries (both logged). */
int gshmd__fdstore_check_limits(struct gshmd_fdstore *fs);
/* After the restore, before anything is stored: 0, or -ENOSPC (logged)
 * when $FDSTORE is below gshmd_fdstore_entries_needed (what came back
 * stays stored as it is). */
int gshmd__fdstore_check_room(const struct gshmd_fdstore *fs);

/* fdstore_bucket.c */
struct fdstore_bucket *gshmd__bucket_new(uint32_t index);
int gshmd__bucket_send(struct fdstore_bucket *b, const uint8_t *payload, size_t len);
/* Called once a second (gshmd_fdstore_retry): the last bucket, empty,
 * stored and unwritten since the previous call, leaves the store. */
void gshmd__bucket_drop_idle(struct gshmd_fdstore *fs);
int gshmd__buckets_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n);
/* fdstore_inflight.c */
/* Called once a second too: counts the memory fds in the buckets
 * (reg->fdstore_fds_held, for the metrics), and says once when they pass
 * GSHMD_FDSTORE_HELD_NOTICE what that costs gshmd's uid. */
void gshmd__bucket_count_held(struct gshmd_fdstore *fs);
/* Restore: a frozen bucket's datagram holding fds was sent by the uid
 * by - 1 (its StateBucket.sender_uid_plus_one; 0: not said). */
void gshmd__bucket_frozen_sender(struct gshmd_fdstore *fs, uint32_t by);
/* After gshmd became another user: says what the frozen buckets keep in
 * flight for the one that sent them (fs->frozen_fds; by its uid where
 * their datagrams all said the same), if any. */
void gshmd__bucket_say_frozen(const struct gshmd_fdstore *fs);
void gshmd__one_ended_write(struct gshmd_fdstore *fs);
void gshmd__one_ended_changed(struct gshmd_fdstore *fs, struct gshmd_segment *seg, int event);
void gshmd__one_ended_forget(struct gshmd_fdstore *fs, bool stop);

/* fdstore_journal.c */
int gshmd__journal_create(struct gshmd_fdstore *fs);
bool gshmd__journal_adopt(struct gshmd_fdstore *fs, int fd);
int gshmd__journal_put(struct gshmd_fdstore *fs, struct fdstore_bucket *b, const uint8_t *payload,
                       size_t len);
int gshmd__journal_clear(struct gshmd_fdstore *fs, struct fdstore_bucket *b);
Gshm__StateBucket *gshmd__journal_get(struct gshmd_fdstore *fs, uint32_t index);
int gshmd__journal_put_ids(struct gshmd_fdstore *fs);

int gshmd__journal_put_publish(struct gshmd_fdstore *fs, uint64_t publish);

/* fdstore_publish.c */
/* A record to adopt at restore: its record, its memory fd (NULL or -1:
 * not handed back), and the bucket it came from (NULL: it moves). */
struct fdstore_member {
  const Gshm__StateRecord *rec;
  uint64_t seq;  /* its bucket state's: of one id, the highest wins */
  int *fd;
  struct fdstore_bucket *b;
  bool relink;  /* replaced by a publish that was cut short: adopted linked */
  struct fdstore_bucket *one_ended; /* its bucket came back with one end (b NULL) */
};
void gshmd__publish_begin(struct gshmd_fdstore *fs);
void gshmd__publish_member(struct gshmd_fdstore *fs, struct gshmd_segment *seg);
void gshmd__publish_tag(struct gshmd_fdstore *fs);
void gshmd__publish_commit(struct gshmd_fdstore *fs);
void gshmd__publish_replaced(struct gshmd_fdstore *fs, struct gshmd_segment *seg);
void gshmd__publish_unhold(struct gshmd_fdstore *fs, struct gshmd_segment *seg);
bool gshmd__publish_hold(struct gshmd_fdstore *fs, struct gshmd_segment *seg, int event);
void gshmd__publish_revoked_restored(struct gshmd_fdstore *fs);
void gshmd__publish_release(struct gshmd_fdstore *fs);
size_t gshmd__publish_filter(struct gshmd_fdstore *fs, struct fdstore_member *m, size_t n);
void gshmd__publish_adopted(struct gshmd_fdstore *fs, const Gshm__StateRecord *rec,
                            struct gshmd_segment *seg);

/* fdstore_legacy.c */
int gshmd__legacy_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n);

#endif
