/* SPDX-License-Identifier: Apache-2.0 */
/* The fd store's journal: one unsealed memfd stored once (FDNAME=
 * journal2) and then written in place.  systemd holds the same file, so
 * what is written there reaches the next gshmd with no notification and
 * no new fd (which is what fails at EMFILE).  It keeps what the store
 * could not be sent:
 *   - for each bucket whose datagram could not be sent, its state (the
 *     same StateBucket, without fds), in one of the bucket's two copies:
 *     the one with the lower seq is rewritten (its contents, then its
 *     16-byte header), so the other, newer one stays whole whatever a
 *     SIGKILL tears; restore takes the newest of the datagrams and copies;
 *   - in its first page, the ids handed out past the stored ids record,
 *     and the publish every one up to which is complete (fdstore_publish.c;
 *     0 in a journal of a gshmd before sets were atomic: none is);
 *   - from byte MEMO_OFF of that page, the resend memo (fdstore.h): one
 *     40-byte entry per write, never torn; a gshmd before it left those
 *     bytes zero (no entry) and ignores them.
 * One bucket per request: O(1) whatever the number of segments or how far
 * behind the store is.  A header write within one page of a tmpfs file is
 * copied whole (a SIGKILL cannot tear it); longer writes can be torn,
 * hence the two copies. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

#define HEAD 4096u
#define SLOT (FDSTORE_BUCKET_BYTES + 4096u) /* one copy of one bucket */
#define SLOT_HEAD 16u
#define JOURNAL_VERSION 2
/* Buckets a journal may cover (its size is checked against this). */
#define MAX_SLOTS (FDSTORE_BUCKET_INDEX_MAX)

struct journal_head {
  char magic[8];
  uint32_t version;
  uint32_t slot;   /* bytes per copy */
  uint64_t ids_valid; /* 1: the ids below count */
  uint64_t next_segment_id, next_generation, next_lease_id, next_session_id;
  uint64_t publish_done; /* every publish up to this one is complete */
};
static const char journal_magic[8] = {'G', 'S', 'H', 'M', 'J', 'R', 'N', '2'};

struct slot_head {
  uint64_t seq;
  uint32_t len;
  uint32_t pad;
};

#define MEMO_OFF 1024u

/* One entry of the resend memo (seq 0: none). */
struct memo_entry {
  uint64_t seq, id;
  uint8_t token[GSHMD_MEMO_TOKEN_BYTES];
  uint32_t uid, kind;
};
_Static_assert(MEMO_OFF + GSHMD_MEMO_ENTRIES * sizeof(struct memo_entry) <= HEAD,
               "the resend memo stays in the journal's first page");

static off_t slot_off(uint32_t index, int copy) {
  return (off_t)HEAD + ((off_t)index * 2 + copy) * (off_t)SLOT;
}

static int pwrite_all(int fd, const void *buf, size_t len, off_t off) {
  ssize_t k = pwrite(fd, buf, len, off);
  if (k < 0)
    return -errno;
  return (size_t)k == len ? 0 : -EIO;
}

/* The header (64 bytes at offset 0: within one page, never torn), with the
 * ids handed out when fs->journal_ids and the publish mark publish_done. */
static int write_head(struct gshmd_fdstore *fs, uint64_t publish_done) {
  bool ids = fs->journal_ids;
  struct journal_head h = {.version = JOURNAL_VERSION, .slot = SLOT, .ids_valid = ids,
                           .publish_done = publish_done};
  memcpy(h.magic, journal_magic, sizeof(h.magic));
  if (ids) {
    h.next_segment_id = fs->reg->next_segment_id;
    h.next_generation = fs->reg->next_generation;
    h.next_lease_id = fs->reg->next_lease_id;
    h.next_session_id = fs->reg->next_session_id;
  }
  return pwrite_all(fs->journal_fd, &h, sizeof(h), 0);
}

/* Makes a new, empty journal (not yet stored).  Returns 0 or a negative
 * errno. */
int gshmd__journal_create(struct gshmd_fdstore *fs) {
  int fd = memfd_create("gshmd-journal", MFD_CLOEXEC), e;

  if (fd < 0)
    return -errno;
  fs->journal_fd = fd;
  if (ftruncate(fd, HEAD) < 0 || fallocate(fd, 0, 0, HEAD) < 0)
    e = -errno;
  else
    e = write_head(fs, fs->publish_done);
  if (e) {
    close(fd);
    fs->journal_fd = -1;
    return e;
  }
  fs->journal_nslots = 0;
  return 0;
}

/* Takes fd as this run's journal when it is one (a writable regular file
 * with our header); raises the registry's next ids to those it holds.
 * Returns false when it is not (fd untouched: the caller closes it). */
bool gshmd__journal_adopt(struct gshmd_fdstore *fs, int fd) {
  struct journal_head h;
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);

  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (seals > 0 && (seals & F_SEAL_WRITE)) ||
      st.st_size < (off_t)HEAD || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
      memcmp(h.magic, journal_magic, sizeof(h.magic)) || h.version != JOURNAL_VERSION ||
      h.slot != SLOT) {
    gshm_log_err("fd store: the stored journal is not one this gshmd writes; a new one is made");
    return false;
  }
  fs->journal_fd = fd;
  fs->journal_stored = true;
  fs->journal_nslots = (uint32_t)(((uint64_t)st.st_size - HEAD) / (2 * SLOT));
  if (fs->journal_nslots > MAX_SLOTS)
    fs->journal_nslots = MAX_SLOTS;
  fs->publish_done = h.publish_done;
  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES; i++) { /* (the next entry goes after the newest) */
    struct memo_entry m;
    if (pread(fd, &m, sizeof(m), MEMO_OFF + i * sizeof(m)) == (ssize_t)sizeof(m) &&
        m.seq > fs->memo_seq)
      fs->memo_seq = m.seq;
  }
  if (h.ids_valid) {
    Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
    t.next_segment_id = h.next_segment_id;
    t.next_generation = h.next_generation;
    t.next_lease_id = h.next_lease_id;
    t.next_session_id = h.next_session_id;
    gshmd__fdstore_raise_ids(fs->reg, &t);
  }
  return true;
}

/* Makes the file cover bucket index (both copies allocated, so a later
 * write does not fail for memory). */
static int cover(struct gshmd_fdstore *fs, uint32_t index) {
  off_t end = slot_off(index, 2);
  if (index < fs->journal_nslots)
    return 0;
  if (ftruncate(fs->journal_fd, end) < 0 ||
      fallocate(fs->journal_fd, 0, slot_off(index, 0), 2 * (off_t)SLOT) < 0)
    return -errno;
  fs->journal_nslots = index + 1;
  return 0;
}

static void read_slot_heads(int fd, uint32_t index, struct slot_head sh[2]) {
  for (int c = 0; c < 2; c++)
    if (pread(fd, &sh[c], sizeof(sh[c]), slot_off(index, c)) != (ssize_t)sizeof(sh[c]) ||
        sh[c].len > SLOT - SLOT_HEAD)
      memset(&sh[c], 0, sizeof(sh[c]));
}

/* Writes b's state (payload of len bytes, b->seq) into its older copy.
 * Returns 0 or a negative errno. */
int gshmd__journal_put(struct gshmd_fdstore *fs, struct fdstore_bucket *b, const uint8_t *payload,
                       size_t len) {
  struct slot_head sh[2], h = {.seq = b->seq, .len = (uint32_t)len};
  int c, e;

  if (fs->journal_fd < 0)
    return -EBADF;
  if (len > SLOT - SLOT_HEAD)
    return -E2BIG;
  if ((e = cover(fs, b->index)))
    return e;
  read_slot_heads(fs->journal_fd, b->index, sh);
  c = sh[0].seq <= sh[1].seq ? 0 : 1;
  if ((e = pwrite_all(fs->journal_fd, payload, len, slot_off(b->index, c) + SLOT_HEAD)))
    return e;
  return pwrite_all(fs->journal_fd, &h, sizeof(h), slot_off(b->index, c));
}

/* Forgets both copies of b (a new bucket of a number used before). */
int gshmd__journal_clear(struct gshmd_fdstore *fs, struct fdstore_bucket *b) {
  struct slot_head zero = {0};
  int e = 0;
  if (fs->journal_fd < 0 || b->index >= fs->journal_nslots)
    return 0;
  for (int c = 0; c < 2 && !e; c++)
    e = pwrite_all(fs->journal_fd, &zero, sizeof(zero), slot_off(b->index, c));
  return e;
}

/* The journal's newest readable copy of bucket index, or NULL. */
Gshm__StateBucket *gshmd__journal_get(struct gshmd_fdstore *fs, uint32_t index) {
  struct slot_head sh[2];
  Gshm__StateBucket *t = NULL;
  uint8_t *buf;
  int c;

  if (fs->journal_fd < 0 || index >= fs->journal_nslots)
    return NULL;
  read_slot_heads(fs->journal_fd, index, sh);
  c = sh[0].seq >= sh[1].seq ? 0 : 1;
  if (!sh[c].seq || !(buf = malloc(sh[c].len ? sh[c].len : 1)))
    return NULL;
  if (pread(fs->journal_fd, buf, sh[c].len, slot_off(index, c) + SLOT_HEAD) ==
          (ssize_t)sh[c].len &&
      (t = gshm__state_bucket__unpack(NULL, sh[c].len, buf)) &&
      (t->version != 1 || t->bucket != index || t->seq != sh[c].seq)) {
    gshm__state_bucket__free_unpacked(t, NULL);
    t = NULL;
  }
  for (size_t i = 0; t && i < t->n_segments; i++)
    if (!t->segments[i] || !t->segments[i]->id || !t->segments[i]->location) {
      gshm__state_bucket__free_unpacked(t, NULL);
      t = NULL;
    }
  if (!t)
    gshm_log_err("fd store: the journal's copy of bucket %u is unreadable; ignored", index);
  free(buf);
  return t;
}

/* Writes the ids handed out into the header (while the ids record cannot
 * be stored).  Returns 0 or a negative errno. */
int gshmd__journal_put_ids(struct gshmd_fdstore *fs) {
  if (fs->journal_fd < 0)
    return -EBADF;
  fs->journal_ids = true;
  return write_head(fs, fs->publish_done);
}

/* Records every publish up to publish complete (the header's mark).
 * Returns 0 or a negative errno (-EBADF: no journal). */
int gshmd__journal_put_publish(struct gshmd_fdstore *fs, uint64_t publish) {
  if (fs->journal_fd < 0)
    return -EBADF;
  return write_head(fs, publish);
}

/* The entries of m (all GSHMD_MEMO_ENTRIES) that uid holds. */
static unsigned memo_count(const struct memo_entry *m, uint32_t uid) {
  unsigned n = 0;
  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES; i++)
    n += m[i].seq && m[i].uid == uid;
  return n;
}

/* Where uid's next entry goes in the memo m: a free slot; else, once uid
 * holds GSHMD_MEMO_PER_UID entries, its own oldest; else the oldest of
 * the user holding the most.  A user whose requests come fast (a loop of
 * create and unlink) evicted every other user's entries, oldest first,
 * so that their resends after a restart found none (an unlink's then took
 * a segment made since under the name); now one user takes no other
 * user below its newest GSHMD_MEMO_PER_UID while four or fewer write. */
static uint32_t memo_slot(const struct memo_entry *m, uint32_t uid) {
  uint32_t best = 0;
  unsigned best_n = 0, mine = memo_count(m, uid);

  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES; i++) {
    unsigned n;
    if (!m[i].seq)
      return i;
    if (mine >= GSHMD_MEMO_PER_UID && m[i].uid != uid)
      continue;
    n = mine >= GSHMD_MEMO_PER_UID ? mine : memo_count(m, m[i].uid);
    if (n > best_n || (n == best_n && m[i].seq < m[best].seq)) {
      best = i;
      best_n = n;
    }
  }
  return best;
}

int gshmd_fdstore_memo_put(struct gshmd_fdstore *fs, const uint8_t *token, uint32_t uid,
                           enum gshmd_memo_kind kind, uint64_t id) {
  struct memo_entry m = {.id = id, .uid = uid, .kind = kind}, all[GSHMD_MEMO_ENTRIES];
  uint32_t slot;
  int e;

  if (!fs || fs->journal_fd < 0)
    return -EBADF;
  m.seq = fs->memo_seq + 1;
  memcpy(m.token, token, sizeof(m.token));
  slot = pread(fs->journal_fd, all, sizeof(all), MEMO_OFF) == (ssize_t)sizeof(all)
             ? memo_slot(all, uid)
             : (uint32_t)(m.seq % GSHMD_MEMO_ENTRIES);
  e = pwrite_all(fs->journal_fd, &m, sizeof(m), MEMO_OFF + (off_t)slot * (off_t)sizeof(m));
  if (!e)
    fs->memo_seq = m.seq;
  return e;
}

bool gshmd_fdstore_memo_find(const struct gshmd_fdstore *fs, const uint8_t *token, uint32_t uid,
                             enum gshmd_memo_kind kind, uint64_t *id_out) {
  struct memo_entry m[GSHMD_MEMO_ENTRIES];
  uint64_t newest = 0;

  if (!fs || fs->journal_fd < 0 ||
      pread(fs->journal_fd, m, sizeof(m), MEMO_OFF) != (ssize_t)sizeof(m))
    return false;
  for (uint32_t i = 0; i < GSHMD_MEMO_ENTRIES; i++) {
    /* (sodium_memcmp: the time says nothing of a token) */
    if (m[i].seq > newest && !sodium_memcmp(m[i].token, token, sizeof(m[i].token)) &&
        m[i].uid == uid && m[i].kind == (uint32_t)kind) {
      newest = m[i].seq;
      *id_out = m[i].id;
    }
  }
  return newest != 0;
}

void gshmd_fdstore_memo_on_publish(struct gshmd_fdstore *fs, const uint8_t *key, uint32_t uid,
                                   enum gshmd_memo_kind kind) {
  if (!fs)
    return;
  fs->memo_armed = key != NULL;
  if (key)
    memcpy(fs->memo_key, key, sizeof(fs->memo_key));
  fs->memo_uid = uid;
  fs->memo_kind = kind;
}
