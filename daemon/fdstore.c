/* SPDX-License-Identifier: Apache-2.0 */
/* The fd store: registry events, placing segments in buckets, the names
 * stored with systemd, the ids record, and restore's order (fdstore.h). */
#include "fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "config.h"
#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

#define RECORD_MAX (1u << 20) /* a stored record larger than this is refused */
#define ID_BLOCK 4096         /* ids reserved per ids-<v> record */

static void on_event(struct gshmd_registry *r, struct gshmd_segment *seg, int event);

/* How many buckets (and segments no bucket took) the store is behind by,
 * for STATUS= and the metrics. */
static uint32_t pending(const struct gshmd_fdstore *fs) {
  return fs->ndirty + fs->nunplaced + (uint32_t)fs->nremoves +
         (fs->journal_fd >= 0 && (!fs->journal_stored || fs->journal_failed));
}

bool gshmd_fdstore_keeps_all(const struct gshmd_fdstore *fs) {
  return fs->enabled && !pending(fs);
}

void gshmd__fdstore_count_failure(struct gshmd_fdstore *fs, const char *what, int r) {
  fs->failed_sends++;
  fs->reg->fdstore_failed_sends = fs->failed_sends;
  if (fs->reg->fdstore_pending) /* said once while behind */
    return;
  fs->reg->fdstore_pending = 1;
  /* (ungated: said once, whichever uid's request met the failure) */
  gshm__log(GSHM_LOG_WARNING | GSHM_LOG_UNGATED, "fd store: cannot send %s (%s); will resend",
            what, strerror(-r));
}

/* Sends one fd to the store under name (nopoll: FDPOLL=0, systemd does not
 * drop it on POLLHUP).  Returns 0 or a negative errno (counted, logged). */
int gshmd__fdstore_store_fd(struct gshmd_fdstore *fs, const char *name, int fd, bool nopoll) {
  char msg[96];
  int r;

  snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s%s", name, nopoll ? "\nFDPOLL=0" : "");
  r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
  if (r <= 0) {
    r = r < 0 ? r : -ENOTCONN;
    gshmd__fdstore_count_failure(fs, name, r);
    return r;
  }
  return 0;
}

/* Appends name (heap; taken, or freed when out of memory) to a list. */
static int push_name(char ***list, size_t *n, size_t *cap, char *name) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 16;
    char **l = realloc(*list, c * sizeof(*l));
    if (!l) {
      free(name);
      return -ENOMEM;
    }
    *list = l;
    *cap = c;
  }
  (*list)[(*n)++] = name;
  return 0;
}

/* Removes name from the store; when that cannot be sent, owes it. */
void gshmd__fdstore_remove(struct gshmd_fdstore *fs, const char *name) {
  char msg[96], *copy;
  int r;

  if (!fs->enabled) /* (no service manager: nothing to remove, nothing owed) */
    return;
  snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
  r = sd_notify(0, msg);
  if (r > 0)
    return;
  gshmd__fdstore_count_failure(fs, msg, r < 0 ? r : -ENOTCONN);
  if ((copy = strdup(name)))
    push_name(&fs->removes, &fs->nremoves, &fs->removes_cap, copy);
}

/* Owes name's removal until every bucket is stored (an earlier format's
 * entry whose segment now lives in a bucket).  Returns 0 or -ENOMEM. */
int gshmd__fdstore_retire(struct gshmd_fdstore *fs, const char *name) {
  char *copy = strdup(name);
  return copy ? push_name(&fs->retire, &fs->nretire, &fs->retire_cap, copy) : -ENOMEM;
}

/* Sends the owed removals (an unlinked segment's old entries must never
 * come back), stopping at the first failure. */
static void resend_removes(struct gshmd_fdstore *fs) {
  size_t n = fs->nremoves;
  char **names = fs->removes;

  if (!n)
    return;
  fs->removes = NULL;
  fs->nremoves = fs->removes_cap = 0;
  for (size_t i = 0; i < n; i++) {
    if (fs->nremoves) /* one failed: the rest stay owed, untried */
      push_name(&fs->removes, &fs->nremoves, &fs->removes_cap, names[i]);
    else {
      gshmd__fdstore_remove(fs, names[i]); /* owes it again on failure */
      free(names[i]);
    }
  }
  free(names);
}

/* A decimal number without sign or leading 0 (0 alone allowed when zero);
 * *end past it.  Returns false otherwise. */
static bool number(const char *p, bool zero, uint64_t *out, const char **end) {
  uint64_t n = 0;
  const char *q = p;
  if (zero && *q == '0') {
    *out = 0;
    *end = q + 1;
    return true;
  }
  if (*q < '1' || *q > '9')
    return false;
  for (; *q >= '0' && *q <= '9'; q++) {
    if (n > (UINT64_MAX - (uint64_t)(*q - '0')) / 10)
      return false;
    n = n * 10 + (uint64_t)(*q - '0');
  }
  *out = n;
  *end = q;
  return true;
}

enum fdstore_kind gshmd__fdstore_parse_name(const char *name, uint64_t *id, uint64_t *v) {
  const char *p;
  if (name[0] == 'b' && number(name + 1, true, id, &p) && (*p == 'a' || *p == 'b') && !p[1] &&
      *id < FDSTORE_BUCKET_INDEX_MAX) {
    *v = *p == 'b';
    return K_BUCKET;
  }
  if (!strncmp(name, "seg-", 4) && number(name + 4, false, id, &p) && !*p)
    return K_SEG;
  if (!strncmp(name, "meta-", 5) && number(name + 5, false, id, &p) && *p == '-' &&
      number(p + 1, false, v, &p) && !*p)
    return K_META;
  if (!strncmp(name, "ids-", 4) && number(name + 4, false, v, &p) && !*p)
    return K_IDS;
  if (!strcmp(name, FDSTORE_LEGACY_JOURNAL_NAME))
    return K_JOURNAL;
  if (!strcmp(name, FDSTORE_JOURNAL_NAME))
    return K_JOURNAL2;
  return K_OTHER;
}

/* A sealed memfd holding msg's encoding. */
static int sealed_record(const ProtobufCMessage *msg, int *fd_out) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t small[1024], *buf = len <= sizeof(small) ? small : malloc(len);
  int fd, e = 0;

  if (!buf)
    return -ENOMEM;
  protobuf_c_message_pack(msg, buf);
  fd = memfd_create("gshmd-record", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  errno = EIO; /* (a short write sets none) */
  if (fd < 0 || (len && write(fd, buf, len) != (ssize_t)len) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
    e = -errno;
    gshm_log_err("fd store: writing a record: %m");
    if (fd >= 0)
      close(fd);
  } else {
    *fd_out = fd;
  }
  if (buf != small)
    free(buf);
  return e;
}

static bool ids_behind(const struct gshmd_fdstore *fs) {
  const struct gshmd_registry *r = fs->reg;
  return r->next_segment_id >= fs->id_limit || r->next_generation >= fs->gen_limit ||
         r->next_lease_id >= fs->lease_limit || r->next_session_id >= fs->session_limit;
}

/* Makes sure every id the registry may hand out next is below a stored
 * limit, so that ids and generations are never reused after a restart:
 * a record once per ID_BLOCK segment ids or generations and once per 16 x
 * ID_BLOCK session or lease ids.  While it cannot be stored, the
 * journal's header carries the ids handed out. */
static int reserve_ids(struct gshmd_fdstore *fs) {
  struct gshmd_registry *r = fs->reg;
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
  char name[64];
  int fd = -1, e;

  if (!ids_behind(fs))
    return 0;
  t.version = 2;
  t.seq = fs->ids_version + 1;
  t.next_segment_id = r->next_segment_id + ID_BLOCK;
  t.next_generation = r->next_generation + ID_BLOCK;
  t.next_lease_id = r->next_lease_id + 16 * ID_BLOCK;
  t.next_session_id = r->next_session_id + 16 * ID_BLOCK;
  if (!(e = sealed_record(&t.base, &fd))) {
    snprintf(name, sizeof(name), "ids-%" PRIu64, t.seq);
    e = gshmd__fdstore_store_fd(fs, name, fd, false);
    close(fd);
  }
  if (e) {
    gshmd__journal_put_ids(fs);
    return e;
  }
  if (fs->ids_version) {
    snprintf(name, sizeof(name), "ids-%" PRIu64, fs->ids_version);
    gshmd__fdstore_remove(fs, name);
  }
  fs->ids_version = t.seq;
  fs->id_limit = t.next_segment_id;
  fs->gen_limit = t.next_generation;
  fs->lease_limit = t.next_lease_id;
  fs->session_limit = t.next_session_id;
  return 0;
}

/* ---- Buckets: which one a segment goes to, and keeping them stored ---- */

static int grow_u32(uint32_t **a, uint32_t *cap, uint32_t need) {
  uint32_t c = *cap ? *cap : 16;
  uint32_t *n;
  while (c < need)
    c *= 2;
  if (c == *cap)
    return 0;
  if (!(n = realloc(*a, c * sizeof(*n))))
    return -ENOMEM;
  *a = n;
  *cap = c;
  return 0;
}

static void open_push(struct gshmd_fdstore *fs, struct fdstore_bucket *b) {
  if (b->on_open || b->frozen || grow_u32(&fs->open, &fs->open_cap, fs->nopen + 1))
    return;
  fs->open[fs->nopen++] = b->index;
  b->on_open = true;
}

static void set_dirty(struct gshmd_fdstore *fs, struct fdstore_bucket *b, bool dirty) {
  if (dirty == b->dirty)
    return;
  if (dirty) {
    if (grow_u32(&fs->dirty, &fs->dirty_cap, fs->ndirty + 1))
      return; /* (out of memory: not retried, the journal has it) */
    b->dirty_pos = fs->ndirty;
    fs->dirty[fs->ndirty++] = b->index;
  } else {
    uint32_t last = fs->dirty[--fs->ndirty];
    fs->dirty[b->dirty_pos] = last;
    fs->buckets[last]->dirty_pos = b->dirty_pos;
  }
  b->dirty = dirty;
}

/* Stores whichever of b's ends the store does not have yet. */
static bool store_ends(struct gshmd_fdstore *fs, struct fdstore_bucket *b) {
  for (int k = 0; k < 2; k++)
    if (!b->stored[k]) {
      char name[32];
      snprintf(name, sizeof(name), "b%" PRIu32 "%c", b->index, "ab"[k]);
      b->stored[k] = !gshmd__fdstore_store_fd(fs, name, b->end[k], true);
    }
  return b->stored[0] && b->stored[1];
}

/* Writes b's current state: its datagram when both ends are stored, else
 * (or when that send fails) the journal's copy; b is dirty until a
 * datagram goes through.  O(members): one bucket, whatever the number of
 * segments.  Returns 0 when the datagram was sent. */
static int bucket_write(struct gshmd_fdstore *fs, struct fdstore_bucket *b) {
  uint8_t *buf = NULL;
  size_t len;
  int e;

  if (b->frozen)
    return -EBUSY;
  if (fs->write_seq < b->seq) /* (a store written before write_seq) */
    fs->write_seq = b->seq;
  b->seq = ++fs->write_seq;
  len = gshmd__bucket_pack(b, b->seq, fs->publish_done, &buf);
  if (!buf)
    e = -ENOMEM;
  else if (!store_ends(fs, b))
    e = -EAGAIN;
  else if ((e = gshmd__bucket_send(b, buf, len)))
    gshmd__fdstore_count_failure(fs, "a bucket's datagram", e);
  b->bytes = len;
  if (e && buf && gshmd__journal_put(fs, b, buf, len) == 0)
    fs->journal_failed = false;
  else if (e && !fs->journal_failed) {
    fs->journal_failed = true;
    gshm_log_err("fd store: cannot write the journal either; a crash now may bring back "
                 "unlinked segments or undo changes");
  }
  set_dirty(fs, b, e != 0);
  free(buf);
  return e;
}

/* A new bucket (numbered after every one there is), its journal copies
 * cleared and its ends stored.  NULL when no socket can be made. */
static struct fdstore_bucket *bucket_add(struct gshmd_fdstore *fs) {
  struct fdstore_bucket *b;
  uint32_t index = fs->nbuckets;

  if (index >= FDSTORE_BUCKET_INDEX_MAX)
    return NULL;
  if (index >= fs->buckets_cap) {
    uint32_t cap = fs->buckets_cap ? 2 * fs->buckets_cap : 16;
    struct fdstore_bucket **n = realloc(fs->buckets, cap * sizeof(*n));
    if (!n)
      return NULL;
    memset(n + fs->buckets_cap, 0, (cap - fs->buckets_cap) * sizeof(*n));
    fs->buckets = n;
    fs->buckets_cap = cap;
  }
  if (!(b = gshmd__bucket_new(index)))
    return NULL;
  fs->buckets[index] = b;
  fs->nbuckets = index + 1;
  gshmd__journal_clear(fs, b); /* (a stale copy of an earlier bucket index) */
  store_ends(fs, b);
  open_push(fs, b);
  return b;
}

/* Owes seg's placement (no bucket could take it). */
static void owe_place(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  if (seg->fs_slot) /* (owed already) */
    return;
  if (fs->nunplaced == fs->unplaced_cap) {
    uint32_t cap = fs->unplaced_cap ? 2 * fs->unplaced_cap : 16;
    struct gshmd_segment **n = realloc(fs->unplaced, cap * sizeof(*n));
    if (!n)
      return;
    fs->unplaced = n;
    fs->unplaced_cap = cap;
  }
  fs->unplaced[fs->nunplaced++] = seg;
  seg->fs_slot = fs->nunplaced;
}

/* seg is no longer owed a placement (placed, or freed). */
static void forget_place(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  struct gshmd_segment *last = fs->unplaced[--fs->nunplaced];
  fs->unplaced[seg->fs_slot - 1] = last;
  last->fs_slot = seg->fs_slot;
  seg->fs_slot = 0;
}

/* Puts seg in a bucket with room (a new one when none has) and writes
 * that bucket (or, !write, marks it for write_marked: a restore, or a
 * publish, places many).  Returns 0 or a negative errno: -ENOTSUP seg's memory has
 * no fd to store (legacy IPC: never retried), -ENOMEM/-EMFILE no bucket
 * (seg is owed: fs->unplaced). */
int gshmd__fdstore_place(struct gshmd_fdstore *fs, struct gshmd_segment *seg, bool write) {
  struct gshmd_backend *bk = seg->mem->backend;
  struct fdstore_bucket *b = NULL;
  int fd, e;

  if ((e = bk->ops->park_fd ? bk->ops->park_fd(bk, seg->mem, &fd) : -ENOTSUP)) {
    gshm_log_notice("fd store: segment '%s' id %" PRIu64 " cannot be stored (%s): it will "
                    "not survive a restart of gshmd",
                    seg->name, seg->id, seg->mem->location);
    return e;
  }
  while (fs->nopen && !b) {
    uint32_t i = fs->open[fs->nopen - 1];
    b = i < fs->nbuckets ? fs->buckets[i] : NULL; /* (NULL: dropped) */
    if (!b || b->n >= fs->capacity || b->frozen) {
      if (b)
        b->on_open = false;
      fs->nopen--;
      b = NULL;
    }
  }
  if (!b && !(b = bucket_add(fs))) {
    e = errno ? -errno : -ENOMEM;
    gshmd__fdstore_count_failure(fs, "a new bucket", e);
    owe_place(fs, seg); /* (placed by the resend) */
    return e;
  }
  seg->fs_bucket = b->index + 1;
  seg->fs_slot = b->n;
  b->seg[b->n++] = seg;
  if (b->n >= fs->capacity) {
    b->on_open = false;
    fs->nopen--;
  }
  if (!write) {
    b->rewrite = true;
    return 0;
  }
  return bucket_write(fs, b);
}

/* The buckets that placements marked (gshmd__fdstore_place without
 * write: a restore's, or a publish's between GSHMD_PUBLISH_BEGIN and
 * _END) are written, once each: a pulled set of 398 segments placed and
 * written one by one rewrote its bucket (up to 253 fds and records) each
 * time, 10-18 ms of the loop after the set's last byte on the lent
 * 16-core machine. */
static void write_marked(struct gshmd_fdstore *fs) {
  for (uint32_t i = 0; i < fs->nbuckets; i++) {
    struct fdstore_bucket *b = fs->buckets[i];
    if (b && b->rewrite) {
      b->rewrite = false;
      if (fs->enabled)
        bucket_write(fs, b);
    }
  }
}

/* After restore (or a hold, gshmd__publish_hold): every marked
 * bucket is written once (write_marked), those with room are offered. */
void gshmd__fdstore_settle(struct gshmd_fdstore *fs) {
  write_marked(fs);
  for (uint32_t i = fs->nbuckets; i-- > 0;)
    if (fs->buckets[i] && fs->buckets[i]->n < fs->capacity)
      open_push(fs, fs->buckets[i]);
}

/* Takes seg out of its bucket (freed) and writes the bucket. */
static void unplace(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  struct fdstore_bucket *b = fs->buckets[seg->fs_bucket - 1];
  struct gshmd_segment *last = b->seg[--b->n];

  b->seg[seg->fs_slot] = last;
  last->fs_slot = seg->fs_slot;
  seg->fs_bucket = 0;
  open_push(fs, b);
  bucket_write(fs, b); /* (emptied, the last leaves later: gshmd__bucket_drop_idle) */
}

/* After a failure: the owed removals, then each dirty bucket (every one,
 * while the sends go through), then the names of an earlier format once
 * nothing is dirty. */
static void resend(struct gshmd_fdstore *fs) {
  resend_removes(fs);
  while (fs->nunplaced) {
    struct gshmd_segment *seg = fs->unplaced[fs->nunplaced - 1];
    forget_place(fs, seg);
    if (gshmd__fdstore_place(fs, seg, true) && seg->fs_slot)
      break; /* owed again */
  }
  while (fs->ndirty && !fs->nremoves) {
    struct fdstore_bucket *b = fs->buckets[fs->dirty[fs->ndirty - 1]];
    if (bucket_write(fs, b))
      break;
  }
  if (!fs->ndirty && !fs->nunplaced && fs->nretire && !fs->nremoves) {
    for (size_t i = 0; i < fs->nretire; i++) {
      gshmd__fdstore_remove(fs, fs->retire[i]);
      free(fs->retire[i]);
    }
    fs->nretire = 0;
  }
  gshmd__one_ended_forget(fs, false);
}

void gshmd_fdstore_resend_all(struct gshmd_fdstore *fs) {
  for (uint32_t i = 0; fs->enabled && i < fs->nbuckets; i++)
    if (fs->buckets[i] && fs->buckets[i]->n && !fs->buckets[i]->frozen)
      bucket_write(fs, fs->buckets[i]);
  gshmd__bucket_say_frozen(fs);
}

static void on_event(struct gshmd_registry *r, struct gshmd_segment *seg, int event) {
  struct gshmd_fdstore *fs = r->on_event_data;
  bool behind;

  /* (a hold, or a revoked member kept: alone, the caller still holds seg) */
  if (!fs || !fs->enabled || gshmd__publish_hold(fs, seg, event))
    return;
  /* (not during a publish: a dirty bucket rewritten now would store its
   * new members before their publish's tag, as if complete) */
  behind = !fs->publishing && (fs->nremoves || fs->ndirty || fs->nunplaced);
  /* Catching up is gshmd's own work, as at the once-a-second retry: its
   * lines (the segments of earlier publishes it lets go, freed) are not
   * those of the client whose request raised this event, and its uid's
   * log rate (loglimit.h) must not hold them back. */
  if (behind) {
    gshm__log_ungated_begin();
    resend(fs);
    gshm__log_ungated_end();
  }
  switch (event) {
  case GSHMD_IDS_USED:
    reserve_ids(fs);
    break;
  case GSHMD_PUBLISH_BEGIN:
    gshmd__publish_begin(fs);
    break;
  case GSHMD_PUBLISH_END:
    fs->publishing = false;
    gshmd__publish_tag(fs);
    write_marked(fs);
    break;
  case GSHMD_SEGMENT_CREATED:
    reserve_ids(fs);
    gshmd__fdstore_place(fs, seg, !fs->publishing);
    if (fs->publishing)
      gshmd__publish_member(fs, seg);
    break;
  case GSHMD_SEGMENT_REPLACED:
    gshmd__publish_replaced(fs, seg);
    break;
  case GSHMD_SEGMENT_FREED:
    gshmd__publish_unhold(fs, seg); /* (a revoke, a shutdown: not held any more) */
    if (seg->fs_bucket)
      unplace(fs, seg);
    else if (seg->fs_slot)
      forget_place(fs, seg);
    break;
  default: /* unlinked, chmod, chown */
    if (seg->fs_bucket)
      bucket_write(fs, fs->buckets[seg->fs_bucket - 1]);
    break;
  }
  gshmd__one_ended_changed(fs, seg, event);
  gshmd__publish_commit(fs); /* (a publish's end, or the store caught up) */
  r->fdstore_pending = pending(fs);
  if (behind)
    gshm__log_ungated_begin();
  gshmd__publish_release(fs); /* (last: it frees segments, each an event) */
  if (behind)
    gshm__log_ungated_end();
}

unsigned gshmd_fdstore_retry(struct gshmd_fdstore *fs) {
  if (!fs->enabled)
    return 0;
  if (fs->journal_fd >= 0 && !fs->journal_stored)
    fs->journal_stored =
        !gshmd__fdstore_store_fd(fs, FDSTORE_JOURNAL_NAME, fs->journal_fd, false);
  resend(fs);
  gshmd__bucket_drop_idle(fs);
  gshmd__bucket_count_held(fs);
  reserve_ids(fs); /* an ids record owed: its limits were not raised */
  gshmd__publish_commit(fs);
  gshmd__publish_release(fs);
  if (fs->reg->fdstore_pending && !pending(fs))
    gshm_log_notice("fd store: caught up after %" PRIu64 " failed send(s)", fs->failed_sends);
  fs->reg->fdstore_pending = pending(fs);
  return fs->reg->fdstore_pending;
}

int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg) {
  const char *ns = getenv("NOTIFY_SOCKET");
  int e;

  memset(fs, 0, sizeof(*fs));
  fs->reg = reg;
  fs->enabled = ns && *ns;
  fs->journal_fd = -1;
  fs->capacity = gshmd__fdstore_capacity(reg->cfg->max_name);
  if (fs->enabled && (e = gshmd__fdstore_check_limits(fs)))
    return e;
  reg->on_event_data = fs;
  reg->fdstore = fs;
  reg->on_event = on_event;
  return 0;
}
