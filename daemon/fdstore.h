/* SPDX-License-Identifier: Apache-2.0 */
/* Restart without losing a byte: gshmd keeps every segment's memory fd
 * and its record in systemd's fd store, a few hundred fds whatever the
 * number of segments.  Segments are grouped in buckets of up to 253
 * (SCM_MAX_FD): a bucket is an AF_UNIX datagram socketpair whose two ends
 * are stored once (FDNAME=b<n>a, b<n>b, FDPOLL=0) and whose one queued
 * datagram carries the members' memory fds (SCM_RIGHTS) and their
 * StateRecords (a StateBucket); a change rewrites that one bucket in place
 * (the new datagram is sent before the old one is dropped) with no store
 * notification.  One record reserves ids ahead (ids-<v>), and the journal
 * (FDNAME=journal2, a memfd written in place) keeps each bucket whose
 * datagram could not be sent.  Why one datagram per bucket and not one fd
 * per segment: systemd passes every stored fd's name in one environment
 * string, LISTEN_FDNAMES, which execve refuses past 131072 bytes
 * (docs/ARCHITECTURE.md, "The fd store").  On start, what
 * sd_listen_fds_with_names() returns is adopted back before READY=1, also
 * from the one-fd-per-segment format of earlier releases (converted).
 * A set published in one step (a pull's) spans buckets, but is all or
 * nothing across a crash: its records are tagged with the publish, and
 * the journal records which publishes are complete (fdstore_publish.c).
 * Without $NOTIFY_SOCKET (no service manager) all of this is skipped. */
#ifndef GSHMD_FDSTORE_H
#define GSHMD_FDSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gshmd_registry;
struct gshmd_segment;
struct fdstore_bucket;

struct gshmd_fdstore {
  struct gshmd_registry *reg;
  bool enabled;   /* $NOTIFY_SOCKET is set and the manager listens */
  uint64_t store_max;  /* $FDSTORE (FileDescriptorStoreMax=); 0: not said */
  /* Set by the caller between gshmd_fdstore_setup and _restore: a sticky
   * CUDA error in the restore stops it for a restart (daemon.sticky_start
   * = restart).  Unset, the device segments from there on are kept
   * parked (backend.h gshmd_backend_parked) and the restore goes on. */
  bool sticky_restart;
  unsigned restored, dropped;
  unsigned from_journal;   /* buckets restored from the journal */
  unsigned converted;      /* segments restored from the legacy format */
  /* Ids below these limits are covered by the stored ids-<v> record. */
  uint64_t id_limit, gen_limit, lease_limit, session_limit;
  uint64_t ids_version;
  /* Buckets by number (NULL: none of that number), those with room for
   * another member (a stack) and those the store lacks the current state
   * of (resent by gshmd_fdstore_retry; each knows its position here). */
  struct fdstore_bucket **buckets;
  uint32_t nbuckets, buckets_cap;
  uint32_t capacity;       /* members per bucket (from limits.max_name) */
  uint32_t *open, nopen, open_cap;
  uint32_t *dirty, ndirty, dirty_cap;
  /* Segments no bucket could take yet (no socket for a new one: EMFILE,
   * ENOMEM); each knows its place here (fs_slot - 1).  Placed by the
   * resend. */
  struct gshmd_segment **unplaced;
  uint32_t nunplaced, unplaced_cap;
  /* FDSTOREREMOVE names owed after a failed send; and names of an
   * earlier format (or a bucket that lost one end) removed once every
   * bucket is stored. */
  char **removes;
  size_t nremoves, removes_cap;
  char **retire;
  size_t nretire, retire_cap;
  /* Buckets that came back with one end, while that end stays stored
   * (until the retire above is sent): each with the segments adopted from
   * its records, whose state goes to its number's journal copy at each
   * change (fdstore_bucket.c: a bucket that came back with one end). */
  struct fdstore_bucket **one_ended;
  uint32_t n_one_ended, one_ended_cap;
  uint64_t failed_sends;   /* notifications and datagrams that failed */
  /* gshmd__bucket_drop_idle: the last bucket (number, seq of its state)
   * found empty and stored at the previous retry, while idle_armed */
  bool idle_armed;
  uint32_t idle_index;
  uint64_t idle_seq;
  bool held_said;          /* gshmd__bucket_count_held's notice went out */
  /* Between GSHMD_PUBLISH_BEGIN and _END: placements mark their buckets
   * (rewrite) instead of writing them, and END writes each once. */
  bool publishing;
  /* fdstore_publish.c: the publish under way's members (between BEGIN
   * and END; pub_untagged: its records carry no publish, for want of a
   * journal or memory), the largest publish whose buckets were written,
   * and the one the journal records every publish complete up to. */
  struct gshmd_segment **pub;
  uint32_t npub, pub_cap;
  bool pub_untagged;
  /* Segments a publish replaced (GSHMD_SEGMENT_REPLACED), held until the
   * mark passes the publish (seg->fs_replaced): their records say
   * unlinked-by-that-publish and they are not freed before; from
   * held_pub on, the publish under way's (fs_replaced set at its END). */
  struct gshmd_segment **held;
  uint32_t nheld, held_cap, held_pub;
  bool releasing;          /* gshmd__publish_release is at work */
  bool publish_failed;     /* the mark's last write failed (logged once) */
  uint64_t publish_last, publish_done;
  unsigned cut;            /* restore: segments of publishes cut short */
  /* The journal (fdstore_journal.c); -1 without a service manager. */
  int journal_fd;
  bool journal_stored;     /* its FDSTORE=1 went through */
  bool journal_failed;     /* its last write failed (logged once) */
  bool journal_ids;        /* its header holds ids past the stored record */
  uint32_t journal_nslots; /* buckets its size covers */
  uint64_t memo_seq;       /* the resend memo's newest entry (gshmd_fdstore_memo_put) */
  /* The newest bucket state written or restored (or found in a frozen
   * bucket, never restored in this run), of every bucket: each
   * write takes the next, so of two records of one segment id in two
   * buckets (one that lost an end, whose members moved, and the one they
   * moved to) restore keeps the one written last. */
  uint64_t write_seq;
  /* Restore: frozen buckets (their fds did not fit under RLIMIT_NOFILE;
   * never read, never rewritten in this run), one-ended ones too, and the
   * fds their queued datagrams hold (at most 253 a datagram): in flight of
   * the user that sent them, whatever gshmd's user
   * (gshmd_fdstore_resend_all) */
  uint32_t nfrozen;
  uint32_t frozen_ends;    /* of them, ends of those that came back with one
                              (not in buckets[], still stored) */
  uint64_t frozen_fds;
  bool frozen_fds_most;    /* frozen_fds counts 253 for a datagram it could not read */
  uint32_t frozen_senders; /* their datagrams (with fds) seen, and of them: */
  uint32_t frozen_by;      /* 1 + the uid that sent them all (StateBucket.sender_uid_plus_one);
                              0 where they did not all say, or said several */
  /* gshmd_fdstore_memo_on_publish: the key and uid that the next
   * publish's first member is noted under (while memo_armed) */
  uint8_t memo_key[16];    /* GSHMD_MEMO_TOKEN_BYTES */
  uint32_t memo_uid;
  uint32_t memo_kind;      /* enum gshmd_memo_kind */
  bool memo_armed;
};

/* Whether a restart now would bring back every segment: a service
 * manager holds the store (fs->enabled) and it has caught up (no bucket,
 * unplaced segment, removal or journal owed).  gshmd stops for a restart
 * after a sticky CUDA error only then (main.c). */
bool gshmd_fdstore_keeps_all(const struct gshmd_fdstore *fs);

/* Hooks the registry (segment created/changed/freed, ids taken).  Returns
 * 0; or, under a service manager (gshmd then refuses to start, logged),
 * -E2BIG when limits.max_segments is more than the store can hand back
 * after a restart (gshmd_fdstore_max_restorable), -ENOSPC when $FDSTORE
 * (FileDescriptorStoreMax=) is below gshmd_fdstore_max_entries. */
int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg);

/* Adopts what fds[0..n) (names from sd_listen_fds_with_names) hold of
 * ours: buckets ("b<n>a", "b<n>b"), "ids-<v>", "journal2", and the
 * legacy format's "seg-<id>", "meta-<id>-<v>" and "journal"; adopted
 * entries are set to -1 in fds[].  Each bucket's newest copy (its queued
 * datagrams and the journal's, by seq) gives its segments; segments are
 * adopted in id order; a segment whose memory is missing or does not
 * match is dropped (logged).  Legacy segments are placed in buckets and
 * their names removed once those are stored.  fds with other names are
 * left alone (never closed or removed).  Then, under a service manager,
 * this run's journal is made and stored (or the adopted one kept) and ids
 * are reserved; a $NOTIFY_SOCKET nobody reads turns the store off
 * (logged).  Call once, after gshmd_fdstore_setup and before READY=1
 * (also with n == 0).  An adopt that meets a sticky CUDA error (the
 * CUDA backend's needs_restart, logged) parks that device segment and
 * every later one (the caller moves those adopted before it:
 * gshmd_registry_park_all), unless fs->sticky_restart.  Returns 0;
 * -ENOMEM; with fs->sticky_restart, -EIO after a sticky CUDA error: the
 * restore stops there, with nothing of the store rewritten or removed,
 * so that a restart finds every segment again; -ENOSPC (logged, the same
 * way: nothing stored) when $FDSTORE is below
 * gshmd_fdstore_entries_needed. */
int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n);

/* Whether the service manager handed this process fd store entries that
 * hold segments (a bucket end, or the legacy format's "seg-<id>"), read
 * from $LISTEN_FDNAMES (and $LISTEN_PID, which must be this process's,
 * in decimal digits alone as systemd writes it)
 * without taking any fd.  For a start that fails before the restore: a
 * unit that fails its start limit drops its store (main.c
 * start_failed_wait).  No errors: false when the variables are absent or
 * not this process's. */
bool gshmd_fdstore_passed_segments(void);

/* Resends what the store lacks: owed removals, unstored bucket ends and
 * journal, each dirty bucket.  Returns how many things the store is still
 * behind by (dirty buckets plus owed removals), 0 when up to date or
 * disabled. */
unsigned gshmd_fdstore_retry(struct gshmd_fdstore *fs);

/* Sends every bucket holding segments again (each datagram replaced as a
 * change would, crash-safe the same way): after gshmd became daemon.user,
 * so that the kernel counts the queued fds against that user instead of
 * the one that sent them before (user_switch.h).  Not sent: a bucket that
 * came back with one end (its peer is gone; its members moved to other
 * buckets, sent here, and its end, with the earlier user's fds, leaves
 * the store at the gshmd_fdstore_retry that finds every bucket stored:
 * main.c's before READY=1 when these sends go through); and a frozen one,
 * whose fds stay counted against the user that sent them, said here with
 * their number (fs->frozen_fds: a datagram cannot be sent on without
 * receiving its fds, and they do not fit under RLIMIT_NOFILE, which the
 * switch leaves as it is).  The journal, the ids record and the lease
 * key are never in flight: the service manager received them.  O(stored
 * segments): a bucket write each 253 of them.  A send that fails leaves
 * its bucket to gshmd_fdstore_retry, as any. */
void gshmd_fdstore_resend_all(struct gshmd_fdstore *fs);

/* The most buckets max_segments segments with names of max_name bytes can
 * need (each bucket is filled before a new one is made), and so the most
 * fds the store holds: 2 per bucket + 3 (ids record and its replacement,
 * journal).  For the unit's FileDescriptorStoreMax and the check at
 * start. */
uint64_t gshmd_fdstore_max_buckets(uint64_t max_segments, uint64_t max_name);

/* Entries of the fd store that are not buckets' ends: the ids record and
 * its replacement in flight, the journal, the lease key (leasekey.c). */
#define FDSTORE_OTHER_ENTRIES 4u

/* The most fds gshmd keeps in systemd's fd store with limits.max_segments
 * max_segments and limits.max_name max_name: 2 per bucket that many
 * segments can need, plus FDSTORE_OTHER_ENTRIES.  At start gshmd refuses
 * a FileDescriptorStoreMax= ($FDSTORE) below it. */
uint64_t gshmd_fdstore_max_entries(uint64_t max_segments, uint64_t max_name);

/* The most fds the store may hold for gshmd in this run, given what the
 * restore found: 2 per bucket that is not frozen, as many as
 * limits.max_segments can need (gshmd_fdstore_max_buckets) or as came
 * back when more did; the stored ends of frozen buckets (their segments
 * are not in the registry, so as many again may be made: both ends, or
 * the one left of a bucket that lost the other); the names to be removed
 * once the store caught up (the end of a bucket that came back with one,
 * whose members move to new buckets; the legacy format's entries) and
 * owed removals, counted whole (a failed send delays them while segments
 * are made); and FDSTORE_OTHER_ENTRIES.  At start, after the restore,
 * gshmd refuses a $FDSTORE below it (logged; the store is kept as it is).
 * Pure: fs after gshmd_fdstore_restore (before it: the limit's count). */
uint64_t gshmd_fdstore_entries_needed(const struct gshmd_fdstore *fs);

/* Bytes of LISTEN_FDNAMES the store's names take at most with nbuckets
 * buckets (names joined by ':'), besides other names. */
uint64_t gshmd_fdstore_names_bytes(uint64_t nbuckets);

/* What LISTEN_FDNAMES may take of the fd store's names: MAX_ARG_STRLEN
 * (131072, the most execve takes of one environment string) less
 * "LISTEN_FDNAMES=", its NUL and 4096 bytes for names not ours (the
 * listening socket's, other stored fds'). */
#define FDSTORE_FDNAMES_MAX (131072u - 16u - 4096u)

/* gshmd_fdstore_names_bytes at the most buckets max_segments can need. */
uint64_t gshmd_fdstore_max_fdnames(uint64_t max_segments, uint64_t max_name);

/* The largest limits.max_segments whose store can be handed back
 * (gshmd_fdstore_max_fdnames within FDSTORE_FDNAMES_MAX). */
uint64_t gshmd_fdstore_max_restorable(uint64_t max_name);

/* The resend memo: what a request did that a client sends again, with
 * the same random token, when a gshmd restart lost its reply
 * (docs/ARCHITECTURE.md "The fd store": requests sent again).  GSHMD_MEMO_ENTRIES
 * entries in the journal's first page, shared by the users: a user that
 * holds GSHMD_MEMO_PER_UID overwrites its own oldest, one that holds fewer
 * the oldest of whoever holds the most (a free slot first): written in
 * place before the request's change reaches the store, so a restart that
 * kept the change keeps its entry. */
#define GSHMD_MEMO_ENTRIES 64u
#define GSHMD_MEMO_PER_UID (GSHMD_MEMO_ENTRIES / 4)
#define GSHMD_MEMO_TOKEN_BYTES 16u
enum gshmd_memo_kind {
  GSHMD_MEMO_REVOKE = 1,
  GSHMD_MEMO_PULL = 2,
  GSHMD_MEMO_UNLINK = 3,
  GSHMD_MEMO_PUBLISH = 4 /* a local client's PUBLISH of its hidden create */
};

/* Notes that uid's request of kind with token (GSHMD_MEMO_TOKEN_BYTES)
 * acts on segment id.  Returns 0; -EBADF no journal (fs NULL, no service
 * manager, or it could not be made); -EIO or another write error. */
int gshmd_fdstore_memo_put(struct gshmd_fdstore *fs, const uint8_t *token, uint32_t uid,
                           enum gshmd_memo_kind kind, uint64_t id);

/* Whether the memo holds uid's request of kind with token; *id_out the
 * segment id of its newest entry when it does.  fs may be NULL (false). */
bool gshmd_fdstore_memo_find(const struct gshmd_fdstore *fs, const uint8_t *token, uint32_t uid,
                             enum gshmd_memo_kind kind, uint64_t *id_out);

/* The next publish's first member (gshmd_registry_publish: its new id) is
 * noted as uid's request of kind (GSHMD_MEMO_PULL, GSHMD_MEMO_PUBLISH)
 * under key (GSHMD_MEMO_TOKEN_BYTES) before the store learns of the
 * publish; key NULL disarms.  A pull and a PUBLISH arm it right before
 * their publish and disarm it right after (a publish that failed early
 * noted nothing).  fs may be NULL (nothing). */
void gshmd_fdstore_memo_on_publish(struct gshmd_fdstore *fs, const uint8_t *key, uint32_t uid,
                                   enum gshmd_memo_kind kind);

/* Unhooks the registry; says so in the log when the store is behind (those
 * changes are lost or undone at the next start).  Closes the buckets'
 * ends (systemd keeps its own copies). */
void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs);

#endif
