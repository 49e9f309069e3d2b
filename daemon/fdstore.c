/* SPDX-License-Identifier: Apache-2.0 */
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
#include "gshm.pb-c.h"
#include "log.h"
#include "registry.h"

#define RECORD_MAX (1u << 20) /* a stored record larger than this is refused */
#define ID_BLOCK 4096         /* ids reserved per ids-<v> record */
#define JOURNAL_NAME "journal"
#define JOURNAL_HEAD 4096u       /* the header's page; contents follow */
#define JOURNAL_AREA (64u << 10) /* each of the two areas, at first */
#define JOURNAL_VERSION 1
#define JOURNAL_READ_MAX (1ull << 30) /* largest contents adopted at restore */

/* The journal's first bytes.  off and len name the area holding the
 * current StateTable (version 3); a rewrite goes to the other area and is
 * made current by one pwrite of this header, which a SIGKILL cannot tear
 * (a write within one page of a tmpfs file is copied whole). */
struct journal_head {
  char magic[8];
  uint32_t version;
  uint32_t pad;
  uint64_t off, len;
};
static const char journal_magic[8] = {'G', 'S', 'H', 'M', 'J', 'R', 'N', 'L'};


static void count_failure(struct gshmd_fdstore *fs, const char *what, int r) {
  fs->failed_sends++;
  fs->reg->fdstore_failed_sends = fs->failed_sends;
  if (fs->reg->fdstore_pending) /* said once while behind */
    return;
  fs->reg->fdstore_pending = 1;
  gshm_log_warn("fd store: cannot send %s to the service manager (%s); will resend", what,
                strerror(-r));
}

/* Sends one fd to the store under name.  Returns 0 or a negative errno
 * (counted and logged; the caller records what is owed).  -ENOSPC: the
 * store may be full.  systemd keeps at most FileDescriptorStoreMax = 2 x
 * max_segments + 4 fds and drops one past that while sd_notify succeeds;
 * that bound holds while what is stored is the live segments' entries, but
 * freed segments whose removals are owed still fill the store, so while
 * live and such segments together pass max_segments a new fd waits (owed,
 * the journal has its record) until the removals go through. */
static int store_fd(struct gshmd_fdstore *fs, const char *name, int fd) {
  char msg[96];
  int r;

  if (fs->owed_freed && (uint64_t)fs->reg->nsegments + fs->owed_freed >
                            (uint64_t)fs->reg->cfg->max_segments) {
    count_failure(fs, name, -ENOSPC);
    return -ENOSPC;
  }
  snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
  r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
  if (r <= 0) {
    r = r < 0 ? r : -ENOTCONN;
    count_failure(fs, name, r);
    return r;
  }
  return 0;
}

/* What a stored name is. */
enum kind { K_OTHER, K_SEG, K_META, K_IDS, K_JOURNAL };

/* A decimal number from 1 up, digits only (no sign, space or leading 0);
 * *end past it.  Returns false otherwise. */
static bool number(const char *p, uint64_t *out, const char **end) {
  uint64_t n = 0;
  const char *q = p;
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

static enum kind parse_name(const char *name, uint64_t *id, uint64_t *v) {
  const char *p;
  if (!strncmp(name, "seg-", 4) && number(name + 4, id, &p) && !*p)
    return K_SEG;
  if (!strncmp(name, "meta-", 5) && number(name + 5, id, &p) && *p == '-' &&
      number(p + 1, v, &p) && !*p)
    return K_META;
  if (!strncmp(name, "ids-", 4) && number(name + 4, v, &p) && !*p)
    return K_IDS;
  if (!strcmp(name, JOURNAL_NAME))
    return K_JOURNAL;
  return K_OTHER;
}

/* Owes the removal of name (heap; taken, or freed when it cannot be
 * recorded: out of memory, logged by the failure before). */
static void owe_remove(struct gshmd_fdstore *fs, char *name) {
  if (fs->nremoves == fs->removes_cap) {
    size_t cap = fs->removes_cap ? 2 * fs->removes_cap : 16;
    char **n = realloc(fs->removes, cap * sizeof(*n));
    if (!n) {
      free(name);
      return;
    }
    fs->removes = n;
    fs->removes_cap = cap;
  }
  fs->removes[fs->nremoves++] = name;
}

/* Removes name from the store; when that cannot be sent, owes it. */
static void store_remove(struct gshmd_fdstore *fs, const char *name) {
  char msg[96], *copy;
  int r;

  snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
  r = sd_notify(0, msg);
  if (r > 0)
    return;
  count_failure(fs, msg, r < 0 ? r : -ENOTCONN);
  if ((copy = strdup(name)))
    owe_remove(fs, copy);
}

/* Owes seg's record (and its memory when need_seg).  seg->owed says
 * whether it is in the list already, so owing a new one is O(1) (restore
 * owes every segment the journal had a newer record for). */
static void owe(struct gshmd_fdstore *fs, struct gshmd_segment *seg, bool need_seg) {
  if (seg->owed) {
    for (size_t i = 0; i < fs->nowed; i++)
      if (fs->owed[i].id == seg->id) {
        fs->owed[i].need_seg |= need_seg;
        return;
      }
  }
  if (fs->nowed == fs->owed_cap) {
    size_t cap = fs->owed_cap ? 2 * fs->owed_cap : 16;
    struct fdstore_owed *n = realloc(fs->owed, cap * sizeof(*n));
    if (!n)
      return;
    fs->owed = n;
    fs->owed_cap = cap;
  }
  fs->owed[fs->nowed++] = (struct fdstore_owed){seg->id, need_seg};
  seg->owed = true;
}

/* seg leaves the owed list (freed); O(1) unless it is in it. */
static void forget_owed(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  if (!seg->owed)
    return;
  seg->owed = false;
  for (size_t i = 0; i < fs->nowed; i++)
    if (fs->owed[i].id == seg->id) {
      fs->owed[i] = fs->owed[--fs->nowed];
      return;
    }
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

/* seg's current state as a StateRecord (strings borrowed from seg). */
static void fill_record(const struct gshmd_segment *seg, Gshm__StateRecord *x) {
  gshm__state_record__init(x);
  x->id = seg->id;
  x->generation = seg->generation;
  x->name = seg->name;
  x->requested_size = seg->requested_size;
  x->size = seg->mem->size;
  x->location = seg->mem->location;
  x->uid = seg->uid;
  x->gid = seg->gid;
  x->mode = seg->mode;
  x->flags = seg->flags;
  x->created_ns = seg->created_ns;
  x->unlinked = seg->unlinked;
  if (seg->source)
    x->source = seg->source;
}

/* Stores meta-<id>-<v+1> for seg, then removes meta-<id>-<v>: a crash in
 * between leaves two versions and restore takes the newer, never none. */
static int store_meta(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  Gshm__StateRecord x;
  char name[64];
  int fd, e;

  fill_record(seg, &x);
  if ((e = sealed_record(&x.base, &fd)))
    return e;
  snprintf(name, sizeof(name), "meta-%" PRIu64 "-%" PRIu64, seg->id, seg->meta_version + 1);
  e = store_fd(fs, name, fd);
  close(fd);
  if (e)
    return e;
  if (seg->meta_version) {
    snprintf(name, sizeof(name), "meta-%" PRIu64 "-%" PRIu64, seg->id, seg->meta_version);
    store_remove(fs, name);
  }
  seg->meta_version++;
  return 0;
}

/* Makes sure every id the registry may hand out next is below a stored
 * limit, so that ids and generations are never reused after a restart.
 * Called after every id is taken (segment, generation, session, lease);
 * writes a record once per ID_BLOCK segment ids or generations and once per
 * 16 x ID_BLOCK session or lease ids. */
static int reserve_ids(struct gshmd_fdstore *fs) {
  struct gshmd_registry *r = fs->reg;
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
  char name[64];
  int fd, e;

  if (r->next_segment_id < fs->id_limit && r->next_generation < fs->gen_limit &&
      r->next_lease_id < fs->lease_limit && r->next_session_id < fs->session_limit)
    return 0;
  t.version = 2;
  t.seq = fs->ids_version + 1;
  t.next_segment_id = r->next_segment_id + ID_BLOCK;
  t.next_generation = r->next_generation + ID_BLOCK;
  t.next_lease_id = r->next_lease_id + 16 * ID_BLOCK;
  t.next_session_id = r->next_session_id + 16 * ID_BLOCK;
  if ((e = sealed_record(&t.base, &fd)))
    return e;
  snprintf(name, sizeof(name), "ids-%" PRIu64, t.seq);
  e = store_fd(fs, name, fd);
  close(fd);
  if (e)
    return e;
  if (fs->ids_version) {
    snprintf(name, sizeof(name), "ids-%" PRIu64, fs->ids_version);
    store_remove(fs, name);
  }
  fs->ids_version = t.seq;
  fs->id_limit = t.next_segment_id;
  fs->gen_limit = t.next_generation;
  fs->lease_limit = t.next_lease_id;
  fs->session_limit = t.next_session_id;
  return 0;
}

/* A new segment (or one owed since a failed send): its ids covered, its
 * memory parked (need_seg), then the record that names it.  Returns 0 or a
 * negative errno; on failure what is missing is owed. */
static int segment_added(struct gshmd_fdstore *fs, struct gshmd_segment *seg, bool need_seg) {
  struct gshmd_backend *b = seg->mem->backend;
  char name[64];
  int fd, e;

  if ((e = reserve_ids(fs)))
    goto owed;
  if (need_seg) {
    e = b->ops->park_fd ? b->ops->park_fd(b, seg->mem, &fd) : -ENOTSUP;
    if (e == -ENOTSUP) {
      /* (legacy IPC allocations, a backend without park_fd: nothing to
       * retry, so nothing owed) */
      gshm_log_notice("fd store: segment '%s' id %" PRIu64 " cannot be parked (%s): it will "
                      "not survive a restart of gshmd",
                      seg->name, seg->id, seg->mem->location);
      return 0;
    }
    if (e) {
      gshm_log_warn("fd store: cannot park segment %" PRIu64 ": %s", seg->id, strerror(-e));
      goto owed;
    }
    snprintf(name, sizeof(name), "seg-%" PRIu64, seg->id);
    e = store_fd(fs, name, fd);
    close(fd);
    if (e)
      goto owed;
    seg->parked = true;
    need_seg = false;
  }
  if (!(e = store_meta(fs, seg)))
    return 0;
owed:
  owe(fs, seg, need_seg);
  return e;
}

/* Sends what is owed, removals first (an unlinked segment must never come
 * back), stopping at the first failure. */
static void resend(struct gshmd_fdstore *fs) {
  size_t n = fs->nremoves;
  char **names = fs->removes;

  if (!n && !fs->nowed)
    return;
  fs->removes = NULL;
  fs->nremoves = fs->removes_cap = 0;
  for (size_t i = 0; i < n; i++) {
    if (fs->nremoves) { /* one failed: the rest stay owed, untried */
      owe_remove(fs, names[i]);
      continue;
    }
    store_remove(fs, names[i]); /* owes it again on failure */
    free(names[i]);
  }
  free(names);
  while (fs->nowed) {
    struct fdstore_owed o = fs->owed[fs->nowed - 1];
    struct gshmd_segment *seg = gshmd_registry_find_id(fs->reg, o.id);
    fs->nowed--;
    if (!seg)
      continue;
    seg->owed = false;
    if (seg->mem && segment_added(fs, seg, o.need_seg))
      break; /* owed again */
  }
}

/* ---- The journal ----
 * One unsealed memfd, stored once as "journal" and then rewritten in
 * place: systemd holds the same file, so what is written there survives a
 * SIGKILL with no further notification, and no write into it needs a new
 * fd (which is what fails at EMFILE).  It holds what the store is behind
 * by: the newest record of each owed segment, the ids of freed segments
 * whose entries could not be removed, and the ids handed out.  Restore
 * reads it first, so a failed send never brings back an unlinked segment,
 * undoes a chmod or reuses an id. */

static bool ids_behind(const struct gshmd_fdstore *fs) {
  const struct gshmd_registry *r = fs->reg;
  return r->next_segment_id >= fs->id_limit || r->next_generation >= fs->gen_limit ||
         r->next_lease_id >= fs->lease_limit || r->next_session_id >= fs->session_limit;
}

/* Sizes fd for two areas of `area` bytes after the header, with every page
 * allocated now so that later writes cannot fail for memory.  Returns 0 or
 * a negative errno. */
static int journal_size(int fd, uint64_t area) {
  off_t size = (off_t)(JOURNAL_HEAD + 2 * area);
  if (ftruncate(fd, size) < 0 || fallocate(fd, 0, 0, size) < 0)
    return -errno;
  return 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off) {
  ssize_t k = pwrite(fd, buf, len, (off_t)off);
  if (k < 0)
    return -errno;
  return (size_t)k == len ? 0 : -EIO;
}

static int journal_write_head(int fd, uint64_t off, uint64_t len) {
  struct journal_head h = {.version = JOURNAL_VERSION, .off = off, .len = len};
  memcpy(h.magic, journal_magic, sizeof(h.magic));
  return pwrite_all(fd, &h, sizeof(h), 0);
}

/* Makes a new, empty journal (not yet stored).  Returns 0 or a negative
 * errno. */
static int journal_create(struct gshmd_fdstore *fs) {
  int fd = memfd_create("gshmd-journal", MFD_CLOEXEC), e;

  if (fd < 0)
    return -errno;
  if ((e = journal_size(fd, JOURNAL_AREA)) || (e = journal_write_head(fd, JOURNAL_HEAD, 0))) {
    close(fd);
    return e;
  }
  fs->journal_fd = fd;
  fs->journal_area = JOURNAL_AREA;
  fs->journal_off = JOURNAL_HEAD;
  fs->journal_len = 0;
  return 0;
}

/* Writes t to the area not in use and makes it current, growing the file
 * (both areas) when t does not fit.  Returns 0 or a negative errno; on
 * failure the current contents are untouched. */
static int journal_put(struct gshmd_fdstore *fs, const Gshm__StateTable *t) {
  size_t len = protobuf_c_message_get_packed_size(&t->base);
  uint64_t area = fs->journal_area, off;
  uint8_t *buf;
  int e;

  if (len > fs->journal_max)
    return -E2BIG;
  if (len > area) {
    /* The new areas start past the old second one's end, so the current
     * contents stay intact until the header moves. */
    while (area < len)
      area *= 2;
    if ((e = journal_size(fs->journal_fd, area)))
      return e;
    off = JOURNAL_HEAD + area;
  } else {
    /* The area the current contents do not start in (after a growth that
     * failed half-way, or in a journal adopted from a larger file, they
     * may start at the old second area, inside the new first one's
     * bounds but ending before the new second one). */
    off = fs->journal_off < JOURNAL_HEAD + area ? JOURNAL_HEAD + area : JOURNAL_HEAD;
  }
  if (!(buf = malloc(len ? len : 1)))
    return -ENOMEM;
  protobuf_c_message_pack(&t->base, buf);
  e = pwrite_all(fs->journal_fd, buf, len, off);
  free(buf);
  if (e || (e = journal_write_head(fs->journal_fd, off, len)))
    return e;
  fs->journal_area = area;
  fs->journal_off = off;
  fs->journal_len = len;
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Rewrites the journal from what is owed now; an empty one once caught up.
 * Called after every change to what is owed, before the request that
 * caused it is answered. */
static void journal_sync(struct gshmd_fdstore *fs) {
  struct gshmd_registry *r = fs->reg;
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
  Gshm__StateRecord *recs = NULL, **precs = NULL;
  uint64_t *freed = NULL, *versions = NULL;
  bool behind = ids_behind(fs);
  int e = -ENOMEM;

  if (!fs->nremoves)
    fs->owed_freed = 0;
  if (fs->journal_fd < 0 || (!fs->nowed && !fs->nremoves && !behind && !fs->journal_len))
    return;
  if (!fs->nowed && !fs->nremoves && !behind) {
    /* Caught up: an empty journal, said by the header alone, once. */
    if ((e = journal_write_head(fs->journal_fd, fs->journal_off, 0)) == 0)
      fs->journal_len = 0;
    goto out;
  }
  t.version = 3;
  t.seq = ++fs->journal_seq;
  if (behind) {
    t.next_segment_id = r->next_segment_id;
    t.next_generation = r->next_generation;
    t.next_lease_id = r->next_lease_id;
    t.next_session_id = r->next_session_id;
  }
  if ((fs->nowed && (!(recs = calloc(fs->nowed, sizeof(*recs))) ||
                     !(precs = calloc(fs->nowed, sizeof(*precs))) ||
                     !(versions = calloc(fs->nowed, sizeof(*versions))))) ||
      (fs->nremoves && !(freed = calloc(fs->nremoves, sizeof(*freed)))))
    goto out;
  /* Each record stands for the version its segment's next stored record
   * will have: at restore it counts only if no stored record is as new
   * (a journal whose rewrite failed later can only be older). */
  for (size_t i = 0; i < fs->nowed; i++) {
    struct gshmd_segment *seg = gshmd_registry_find_id(r, fs->owed[i].id);
    if (seg && seg->mem) {
      fill_record(seg, &recs[t.n_segments]);
      precs[t.n_segments] = &recs[t.n_segments];
      versions[t.n_segments] = seg->meta_version + 1;
      t.n_segments++;
    }
  }
  t.segments = precs;
  t.n_record_versions = t.n_segments;
  t.record_versions = versions;
  /* A removal owed for a segment that no longer exists: it was freed
   * (sorted, each id once: O(n log n) per rewrite). */
  for (size_t i = 0; i < fs->nremoves; i++) {
    uint64_t id, v;
    enum kind k = parse_name(fs->removes[i], &id, &v);
    if ((k == K_SEG || k == K_META) && !gshmd_registry_find_id(r, id))
      freed[t.n_freed++] = id;
  }
  if (t.n_freed) {
    size_t u = 1;
    qsort(freed, t.n_freed, sizeof(*freed), cmp_u64);
    for (size_t i = 1; i < t.n_freed; i++)
      if (freed[i] != freed[u - 1])
        freed[u++] = freed[i];
    t.n_freed = u;
  }
  t.freed = freed;
  fs->owed_freed = t.n_freed;
  e = journal_put(fs, &t);
out:
  if (e && !fs->journal_failed)
    gshm_log_err("fd store: cannot write the journal (%s); a crash now may bring back "
                 "unlinked segments or undo changes",
                 strerror(-e));
  fs->journal_failed = e != 0;
  free(recs);
  free(precs);
  free(versions);
  free(freed);
}

/* How many things the store is behind by (for STATUS= and the metrics). */
static uint32_t pending(const struct gshmd_fdstore *fs) {
  return (uint32_t)(fs->nowed + fs->nremoves) +
         (fs->journal_fd >= 0 && (!fs->journal_stored || fs->journal_failed));
}

unsigned gshmd_fdstore_retry(struct gshmd_fdstore *fs) {
  if (!fs->enabled)
    return 0;
  if (fs->journal_fd >= 0 && !fs->journal_stored)
    fs->journal_stored = !store_fd(fs, JOURNAL_NAME, fs->journal_fd);
  resend(fs);
  reserve_ids(fs); /* an ids record owed: its limits were not raised */
  journal_sync(fs);
  if (fs->reg->fdstore_pending && !pending(fs))
    gshm_log_notice("fd store: caught up after %" PRIu64 " failed send(s)", fs->failed_sends);
  fs->reg->fdstore_pending = pending(fs);
  return fs->reg->fdstore_pending;
}

static void on_event(struct gshmd_registry *r, struct gshmd_segment *seg, int event) {
  struct gshmd_fdstore *fs = r->on_event_data;
  char name[64];

  if (!fs || !fs->enabled)
    return;
  resend(fs);
  switch (event) {
  case GSHMD_IDS_USED:
    reserve_ids(fs);
    break;
  case GSHMD_SEGMENT_CREATED:
    segment_added(fs, seg, true);
    break;
  case GSHMD_SEGMENT_FREED:
    /* The record first, then the memory: a crash in between leaves memory
     * that no record names, which the next start drops. */
    forget_owed(fs, seg);
    if (seg->meta_version) {
      snprintf(name, sizeof(name), "meta-%" PRIu64 "-%" PRIu64, seg->id, seg->meta_version);
      store_remove(fs, name);
    }
    if (seg->parked) { /* (memory never stored is not removed, nor owed) */
      snprintf(name, sizeof(name), "seg-%" PRIu64, seg->id);
      store_remove(fs, name);
    }
    break;
  default: /* unlinked, chmod, chown */
    /* (A segment whose first record was never stored is owed already.) */
    if (seg->meta_version && store_meta(fs, seg))
      owe(fs, seg, false);
    break;
  }
  journal_sync(fs);
  r->fdstore_pending = pending(fs);
}

int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg) {
  const char *ns = getenv("NOTIFY_SOCKET");

  memset(fs, 0, sizeof(*fs));
  fs->reg = reg;
  fs->enabled = ns && *ns;
  fs->journal_fd = -1;
  /* Room for a record of every segment there may be (name, location and
   * the fixed fields in under 160 bytes besides the name) and 16 MiB of
   * freed ids (2 million); at most what restore adopts. */
  fs->journal_max = (uint64_t)reg->cfg->max_segments * (reg->cfg->max_name + 160u) + (16u << 20);
  if (fs->journal_max > JOURNAL_READ_MAX)
    fs->journal_max = JOURNAL_READ_MAX;
  reg->on_event_data = fs;
  reg->on_event = on_event;
  return 0;
}

/* Reads a sealed record memfd into buf (malloc'ed).  Returns its length or
 * a negative errno. */
static ssize_t read_record(int fd, uint8_t **buf_out) {
  struct stat st;
  uint8_t *buf;
  ssize_t got = 0;

  if (fstat(fd, &st) < 0 || st.st_size < 0 || (uint64_t)st.st_size > RECORD_MAX)
    return -EINVAL;
  if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
    return -ENOMEM;
  while (got < st.st_size) {
    ssize_t k = pread(fd, buf + got, (size_t)(st.st_size - got), got);
    if (k <= 0) {
      free(buf);
      return -EIO;
    }
    got += k;
  }
  *buf_out = buf;
  return got;
}

/* The registry's next ids, raised to t's where those are higher. */
static void raise_ids(struct gshmd_registry *r, const Gshm__StateTable *t) {
  if (t->next_segment_id > r->next_segment_id)
    r->next_segment_id = t->next_segment_id;
  if (t->next_generation > r->next_generation)
    r->next_generation = t->next_generation;
  if (t->next_lease_id > r->next_lease_id)
    r->next_lease_id = t->next_lease_id;
  if (t->next_session_id > r->next_session_id)
    r->next_session_id = t->next_session_id;
}

/* Raises the registry's next ids to what the ids record in fd reserved.
 * Returns false when it is unreadable (logged). */
static bool adopt_ids(struct gshmd_fdstore *fs, int fd, uint64_t v) {
  Gshm__StateTable *t;
  uint8_t *buf = NULL;
  ssize_t len = read_record(fd, &buf);
  bool ok;

  if (len < 0 || !(t = gshm__state_table__unpack(NULL, (size_t)len, buf))) {
    gshm_log_err("fd store: ids-%" PRIu64 " unreadable; an older ids record is used", v);
    free(buf);
    return false;
  }
  free(buf);
  if ((ok = t->version == 2))
    raise_ids(fs->reg, t);
  gshm__state_table__free_unpacked(t, NULL);
  return ok;
}

/* Restores one segment from rec (its newest record: a stored meta-<id>-<v>
 * or the journal's) and its memory fd (*seg_fd, -1 when not handed back;
 * set to -1 once adopted).  v is the newest stored record's version (0:
 * none), which the segment's next record replaces. */
static int adopt_segment(struct gshmd_fdstore *fs, const Gshm__StateRecord *rec, uint64_t id,
                         uint64_t v, int *seg_fd) {
  struct gshmd_registry *r = fs->reg;
  struct gshmd_alloc *mem = NULL;
  struct gshmd_backend *b = !strcmp(rec->location, "host") ? r->host : r->cuda;
  int e;

  if (rec->id != id)
    e = -EBADMSG;
  else if (*seg_fd < 0)
    e = -ENOENT;
  else if (!b || !b->ops->adopt_fd)
    e = -ENODEV;
  else if (!(e = b->ops->adopt_fd(b, *seg_fd, rec->location, rec->size, &mem))) {
    *seg_fd = -1; /* the backend owns it now */
    if ((e = gshmd_registry_adopt(r, rec, mem))) {
      b->ops->free(b, mem);
    } else {
      struct gshmd_segment *seg = gshmd_registry_find_id(r, id);
      seg->meta_version = v;
      seg->parked = true;
    }
  }
  if (e)
    gshm_log_err("fd store: segment '%s' id %" PRIu64 " not restored: %s", rec->name, id,
                 e == -ENOENT ? "its memory was not handed back" : strerror(-e));
  return e;
}

static Gshm__StateRecord *read_state_record(int fd) {
  uint8_t *buf = NULL;
  ssize_t len = read_record(fd, &buf);
  Gshm__StateRecord *rec = len < 0 ? NULL : gshm__state_record__unpack(NULL, (size_t)len, buf);
  free(buf);
  return rec;
}

/* Takes fd as this run's journal and returns what it holds (NULL when
 * empty or unreadable; said in the log).  An fd that cannot be one (not a
 * writable regular file) is refused: *fd stays, to be closed and removed
 * with the leftovers, and a new journal is made. */
static Gshm__StateTable *journal_adopt(struct gshmd_fdstore *fs, int *fd) {
  struct journal_head h;
  struct stat st;
  Gshm__StateTable *t = NULL;
  uint8_t *buf;
  uint64_t area;
  int seals = fcntl(*fd, F_GET_SEALS);

  if (fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode) || (seals > 0 && (seals & F_SEAL_WRITE)) ||
      st.st_size < (off_t)(JOURNAL_HEAD + 2 * JOURNAL_AREA) ||
      (uint64_t)st.st_size > JOURNAL_HEAD + 2 * JOURNAL_READ_MAX) {
    gshm_log_err("fd store: the stored journal is not usable; a new one is made");
    return NULL;
  }
  fs->journal_fd = *fd;
  fs->journal_stored = true;
  *fd = -1;
  area = ((uint64_t)st.st_size - JOURNAL_HEAD) / 2;
  fs->journal_area = area;
  fs->journal_off = JOURNAL_HEAD;
  fs->journal_len = 1; /* rewritten (emptied at least) after restore */
  if (pread(fs->journal_fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
      memcmp(h.magic, journal_magic, sizeof(h.magic)) || h.version != JOURNAL_VERSION ||
      h.off < JOURNAL_HEAD || h.len > JOURNAL_READ_MAX || h.off > (uint64_t)st.st_size ||
      h.len > (uint64_t)st.st_size - h.off) {
    gshm_log_err("fd store: the journal's header is not one this gshmd wrote; ignored");
    return NULL;
  }
  fs->journal_off = h.off;
  if (!h.len || !(buf = malloc(h.len)))
    return NULL;
  if (pread(fs->journal_fd, buf, h.len, (off_t)h.off) != (ssize_t)h.len ||
      !(t = gshm__state_table__unpack(NULL, h.len, buf)) || t->version != 3) {
    gshm_log_err("fd store: the journal is unreadable; restoring from the stored records alone");
    if (t)
      gshm__state_table__free_unpacked(t, NULL);
    t = NULL;
  }
  free(buf);
  return t;
}

/* The journal's contents, sorted for lookups by id. */
struct journal_view {
  struct jrec {
    const Gshm__StateRecord *rec;
    uint64_t version; /* the meta-<id>-<v> it stands for */
    bool used;
  } *recs;
  size_t nrecs;
  uint64_t *freed; /* sorted */
  size_t nfreed;
};

static int cmp_jrec(const void *a, const void *b) {
  const struct jrec *x = a, *y = b;
  return x->rec->id < y->rec->id ? -1 : x->rec->id > y->rec->id;
}

static int journal_view(const Gshm__StateTable *jt, struct journal_view *jv) {
  memset(jv, 0, sizeof(*jv));
  if (!jt)
    return 0;
  if ((jt->n_segments && !(jv->recs = calloc(jt->n_segments, sizeof(*jv->recs)))) ||
      (jt->n_freed && !(jv->freed = malloc(jt->n_freed * sizeof(*jv->freed))))) {
    free(jv->recs);
    return -ENOMEM;
  }
  for (size_t i = 0; i < jt->n_segments; i++)
    if (jt->segments[i] && jt->segments[i]->id) /* (a record without its
                                                   version counts as 1) */
      jv->recs[jv->nrecs++] = (struct jrec){
          jt->segments[i], i < jt->n_record_versions ? jt->record_versions[i] : 1, false};
  if (jv->nrecs)
    qsort(jv->recs, jv->nrecs, sizeof(*jv->recs), cmp_jrec);
  if (jt->n_freed) {
    memcpy(jv->freed, jt->freed, jt->n_freed * sizeof(*jv->freed));
    jv->nfreed = jt->n_freed;
    qsort(jv->freed, jv->nfreed, sizeof(*jv->freed), cmp_u64);
  }
  return 0;
}

static bool freed_id(const struct journal_view *jv, uint64_t id) {
  return jv->nfreed && bsearch(&id, jv->freed, jv->nfreed, sizeof(id), cmp_u64);
}

/* The journal's newest record for id (the last of equal ids); NULL. */
static struct jrec *journal_record(struct journal_view *jv, uint64_t id) {
  size_t lo = 0, hi = jv->nrecs;
  while (lo < hi) { /* first index with rec->id > id */
    size_t mid = lo + (hi - lo) / 2;
    if (jv->recs[mid].rec->id <= id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo && jv->recs[lo - 1].rec->id == id ? &jv->recs[lo - 1] : NULL;
}

struct entry {
  enum kind kind;
  uint64_t id, v;
  int idx; /* into fds[] and names[] */
};

/* By id, then segment memory before records, then record version. */
static int cmp_entry(const void *a, const void *b) {
  const struct entry *x = a, *y = b;
  if (x->id != y->id)
    return x->id < y->id ? -1 : 1;
  if (x->kind != y->kind)
    return x->kind < y->kind ? -1 : 1;
  return x->v < y->v ? -1 : x->v > y->v;
}

/* Adopts the newest readable ids record of names[0..n) and sets
 * fs->ids_version above every one seen, so the next record replaces them
 * all (an unreadable newest one must not hide the later ones).  Returns the
 * adopted one's index, -1. */
static int restore_ids(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  int best = -1;
  uint64_t best_v = 0, top = 0;

  for (;;) {
    int pick = -1;
    uint64_t pick_v = 0;
    for (int i = 0; i < n; i++) {
      uint64_t id, v;
      if (fds[i] >= 0 && parse_name(names[i], &id, &v) == K_IDS &&
          (best_v == 0 || v < best_v) && v > pick_v) {
        pick = i;
        pick_v = v;
      }
    }
    if (pick < 0)
      break;
    if (pick_v > top)
      top = pick_v;
    best_v = pick_v;
    if (adopt_ids(fs, fds[pick], pick_v)) {
      best = pick;
      break;
    }
  }
  fs->ids_version = top;
  return best;
}

/* Restores what the names in fds[0..n) and the journal jt hold. */
static int restore(struct gshmd_fdstore *fs, int *fds, char **names, int n,
                   const Gshm__StateTable *jt) {
  struct gshmd_registry *r = fs->reg;
  struct journal_view jv;
  struct entry *e;
  int ids_idx, ne = 0;

  if (journal_view(jt, &jv))
    return -ENOMEM;
  if (!(e = malloc(sizeof(*e) * (size_t)(n ? n : 1)))) {
    free(jv.recs);
    free(jv.freed);
    return -ENOMEM;
  }
  ids_idx = restore_ids(fs, fds, names, n);
  if (jt) /* ids handed out after the stored reservation */
    raise_ids(r, jt);
  for (int i = 0; i < n; i++) {
    uint64_t id = 0, v = 0;
    enum kind k = fds[i] < 0 ? K_OTHER : parse_name(names[i], &id, &v);
    if (k == K_SEG || k == K_META)
      e[ne++] = (struct entry){k, id, v, i};
  }

  /* Sorted, each id's entries are adjacent: its memory, then its records
   * oldest first.  O(n log n) for the up to 2 x max_segments fds handed
   * back, before READY.  A freed id is skipped (its entries go with the
   * leftovers); the journal's record for an id is used when it stands for
   * a newer version than the newest stored one (a journal whose rewrite
   * failed holds older ones), and is then owed to the store. */
  qsort(e, (size_t)ne, sizeof(*e), cmp_entry);
  for (int i = 0; i < ne;) {
    int j = i, seg = -1, meta = -1;
    uint64_t id = e[i].id, stored_v;
    struct jrec *jr = journal_record(&jv, id);
    Gshm__StateRecord *rec = NULL;
    const Gshm__StateRecord *use;
    struct gshmd_segment *holder;
    for (; j < ne && e[j].id == id; j++) {
      if (e[j].kind == K_SEG)
        seg = e[j].idx;
      else
        meta = j; /* the last is the newest */
    }
    i = j;
    stored_v = meta >= 0 ? e[meta].v : 0;
    if (jr)
      jr->used = true;
    if (jr && jr->version <= stored_v)
      jr = NULL; /* the store has it, or newer */
    if (freed_id(&jv, id) || (meta < 0 && !jr))
      continue;
    if (!jr && !(rec = read_state_record(fds[e[meta].idx]))) {
      gshm_log_err("fd store: segment id %" PRIu64 " not restored: its record is unreadable", id);
      fs->dropped++;
      continue;
    }
    use = jr ? jr->rec : rec;
    /* A name held by an older segment: that one was unlinked before this
     * one was made (a record of the unlink that never reached the store). */
    if (!use->unlinked && (holder = gshmd_registry_find_name(r, use->name)) &&
        holder->id < id) {
      gshm_log_warn("fd store: segment '%s' id %" PRIu64 " restored unlinked: id %" PRIu64
                    " holds its name",
                    holder->name, holder->id, id);
      gshmd_registry_unname(r, holder);
      owe(fs, holder, false);
    }
    if (adopt_segment(fs, use, id, stored_v, seg >= 0 ? &fds[seg] : &(int){-1})) {
      fs->dropped++;
    } else {
      fs->restored++;
      if (jr) {
        owe(fs, gshmd_registry_find_id(r, id), false);
        fs->journal_records++;
      }
    }
    if (rec)
      gshm__state_record__free_unpacked(rec, NULL);
  }
  /* The journal's records for segments the store has nothing of: their
   * memory never reached it. */
  for (size_t i = 0; i < jv.nrecs; i++)
    if (!jv.recs[i].used && !freed_id(&jv, jv.recs[i].rec->id) &&
        (i + 1 == jv.nrecs || jv.recs[i + 1].rec->id != jv.recs[i].rec->id)) {
      gshm_log_err("fd store: segment '%s' id %" PRIu64 " not restored: its memory was "
                   "never stored",
                   jv.recs[i].rec->name, jv.recs[i].rec->id);
      fs->dropped++;
    }
  free(e);
  fs->journal_freed = (unsigned)jv.nfreed;
  /* (registry_adopt keeps next ids above every restored segment.) */

  /* Our leftovers (older records, freed segments, memory nobody names,
   * unreadable ids records; the meta records now in use are kept in the
   * store) are closed; the stale ones are also removed from the store.  A
   * journal is never removed by name: the one in use has the same name. */
  for (int i = 0; i < n; i++) {
    uint64_t id, v;
    enum kind k;
    struct gshmd_segment *s;
    if (fds[i] < 0 || (k = parse_name(names[i], &id, &v)) == K_OTHER)
      continue;
    s = k == K_META ? gshmd_registry_find_id(r, id) : NULL;
    if (k != K_JOURNAL && !(k == K_META && s && s->meta_version == v) &&
        !(k == K_IDS && i == ids_idx)) {
      if (k == K_SEG && !freed_id(&jv, id))
        gshm_log_warn("fd store: dropping %s, which no record names", names[i]);
      store_remove(fs, names[i]);
    }
    close(fds[i]);
    fds[i] = -1;
  }
  free(jv.recs);
  free(jv.freed);
  return 0;
}

int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  Gshm__StateTable *jt = NULL;
  int e = 0;

  if (names && n > 0) {
    for (int i = 0; i < n; i++)
      if (fds[i] >= 0 && fs->journal_fd < 0 && !strcmp(names[i], JOURNAL_NAME))
        jt = journal_adopt(fs, &fds[i]);
    e = restore(fs, fds, names, n, jt);
    if (jt)
      gshm__state_table__free_unpacked(jt, NULL);
    if (fs->restored || fs->dropped)
      gshm_log_notice("fd store: %u segment(s) restored, %u lost", fs->restored, fs->dropped);
    if (fs->journal_records || fs->journal_freed)
      gshm_log_notice("fd store: the store was behind at the stop; from the journal: %u "
                      "record(s) newer than the stored ones, %u freed segment(s)",
                      fs->journal_records, fs->journal_freed);
  }
  if (!fs->enabled)
    return e;
  /* This run's journal: the one handed back, else a new one. */
  if (fs->journal_fd < 0) {
    int je = journal_create(fs);
    if (je)
      gshm_log_err("fd store: cannot make the journal (%s); a failed send may bring back an "
                   "unlinked segment after a crash",
                   strerror(-je));
    else if ((je = sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=" JOURNAL_NAME,
                                          &fs->journal_fd, 1)) == -ECONNREFUSED ||
             je == -ENOENT) {
      /* $NOTIFY_SOCKET names a socket nobody reads (a stale variable, a
       * test that stopped listening): every send would fail and be owed
       * for ever. */
      gshm_log_warn("fd store off: no service manager listens on $NOTIFY_SOCKET (%s); "
                    "segments will not survive a restart",
                    strerror(-je));
      close(fs->journal_fd);
      fs->journal_fd = -1;
      fs->enabled = false;
      return e;
    } else if (je <= 0) {
      count_failure(fs, JOURNAL_NAME, je < 0 ? je : -ENOTCONN);
    } else {
      fs->journal_stored = true;
    }
  }
  reserve_ids(fs);
  journal_sync(fs);
  fs->reg->fdstore_pending = pending(fs);
  return e;
}

void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs) {
  if (fs->nowed || fs->nremoves)
    gshm_log_warn("fd store behind at the stop: %zu segment record(s) and %zu removal(s) not "
                  "sent; the journal carries them%s",
                  fs->nowed, fs->nremoves,
                  fs->journal_fd >= 0 && fs->journal_stored && !fs->journal_failed
                      ? ""
                      : " (NOT: it could not be stored or written; they are lost)");
  for (size_t i = 0; i < fs->nremoves; i++)
    free(fs->removes[i]);
  free(fs->removes);
  free(fs->owed);
  fs->removes = NULL;
  fs->owed = NULL;
  fs->nremoves = fs->nowed = fs->removes_cap = fs->owed_cap = 0;
  if (fs->journal_fd >= 0) /* (the store keeps its own copy) */
    close(fs->journal_fd);
  fs->journal_fd = -1;
  if (fs->reg && fs->reg->on_event == on_event) {
    fs->reg->on_event = NULL;
    fs->reg->on_event_data = NULL;
  }
}
