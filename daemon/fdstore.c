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

#include "gshm.pb-c.h"
#include "log.h"
#include "registry.h"

#define RECORD_MAX (1u << 20) /* a stored record larger than this is refused */
#define ID_BLOCK 4096         /* ids reserved per ids-<v> record */


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
 * (counted and logged; the caller records what is owed). */
static int store_fd(struct gshmd_fdstore *fs, const char *name, int fd) {
  char msg[96];
  int r;

  snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
  r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
  if (r <= 0) {
    r = r < 0 ? r : -ENOTCONN;
    count_failure(fs, name, r);
    return r;
  }
  return 0;
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
  if (fs->nremoves == fs->removes_cap) {
    size_t cap = fs->removes_cap ? 2 * fs->removes_cap : 16;
    char **n = realloc(fs->removes, cap * sizeof(*n));
    if (!n)
      return; /* logged above */
    fs->removes = n;
    fs->removes_cap = cap;
  }
  if ((copy = strdup(name)))
    fs->removes[fs->nremoves++] = copy;
}

/* Owes seg's record (and its memory when need_seg). */
static void owe(struct gshmd_fdstore *fs, uint64_t id, bool need_seg) {
  for (size_t i = 0; i < fs->nowed; i++)
    if (fs->owed[i].id == id) {
      fs->owed[i].need_seg |= need_seg;
      return;
    }
  if (fs->nowed == fs->owed_cap) {
    size_t cap = fs->owed_cap ? 2 * fs->owed_cap : 16;
    struct fdstore_owed *n = realloc(fs->owed, cap * sizeof(*n));
    if (!n)
      return;
    fs->owed = n;
    fs->owed_cap = cap;
  }
  fs->owed[fs->nowed++] = (struct fdstore_owed){id, need_seg};
}

static void forget_owed(struct gshmd_fdstore *fs, uint64_t id) {
  for (size_t i = 0; i < fs->nowed; i++)
    if (fs->owed[i].id == id) {
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

/* Stores meta-<id>-<v+1> for seg, then removes meta-<id>-<v>: a crash in
 * between leaves two versions and restore takes the newer, never none. */
static int store_meta(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  Gshm__StateRecord x = GSHM__STATE_RECORD__INIT;
  char name[64];
  int fd, e;

  x.id = seg->id;
  x.generation = seg->generation;
  x.name = seg->name;
  x.requested_size = seg->requested_size;
  x.size = seg->mem->size;
  x.location = seg->mem->location;
  x.uid = seg->uid;
  x.gid = seg->gid;
  x.mode = seg->mode;
  x.flags = seg->flags;
  x.created_ns = seg->created_ns;
  x.unlinked = seg->unlinked;
  if (seg->source)
    x.source = seg->source;
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
    if (!b->ops->park_fd) {
      gshm_log_warn("fd store: segment %" PRIu64 " cannot be parked (backend)", seg->id);
      return 0;
    }
    if ((e = b->ops->park_fd(b, seg->mem, &fd))) {
      gshm_log_warn("fd store: cannot park segment %" PRIu64 ": %s", seg->id, strerror(-e));
      goto owed;
    }
    snprintf(name, sizeof(name), "seg-%" PRIu64, seg->id);
    e = store_fd(fs, name, fd);
    close(fd);
    if (e)
      goto owed;
    need_seg = false;
  }
  if (!(e = store_meta(fs, seg)))
    return 0;
owed:
  owe(fs, seg->id, need_seg);
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
    store_remove(fs, names[i]); /* owes it again on failure */
    free(names[i]);
  }
  free(names);
  while (fs->nowed) {
    struct fdstore_owed o = fs->owed[fs->nowed - 1];
    struct gshmd_segment *seg = gshmd_registry_find_id(fs->reg, o.id);
    fs->nowed--;
    if (seg && seg->mem && segment_added(fs, seg, o.need_seg))
      break; /* owed again */
  }
}

unsigned gshmd_fdstore_retry(struct gshmd_fdstore *fs) {
  if (!fs->enabled)
    return 0;
  resend(fs);
  reserve_ids(fs); /* an ids record owed: its limits were not raised */
  if (fs->reg->fdstore_pending && !fs->nowed && !fs->nremoves)
    gshm_log_notice("fd store: caught up after %" PRIu64 " failed send(s)", fs->failed_sends);
  fs->reg->fdstore_pending = (uint32_t)(fs->nowed + fs->nremoves);
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
    forget_owed(fs, seg->id);
    if (seg->meta_version) {
      snprintf(name, sizeof(name), "meta-%" PRIu64 "-%" PRIu64, seg->id, seg->meta_version);
      store_remove(fs, name);
    }
    snprintf(name, sizeof(name), "seg-%" PRIu64, seg->id);
    store_remove(fs, name);
    break;
  default: /* unlinked, chmod, chown */
    /* (A segment whose first record was never stored is owed already.) */
    if (seg->meta_version && store_meta(fs, seg))
      owe(fs, seg->id, false);
    break;
  }
  r->fdstore_pending = (uint32_t)(fs->nowed + fs->nremoves);
}

int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg) {
  const char *ns = getenv("NOTIFY_SOCKET");

  memset(fs, 0, sizeof(*fs));
  fs->reg = reg;
  fs->enabled = ns && *ns;
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

/* What restore knows of one stored name. */
enum kind { K_OTHER, K_SEG, K_META, K_IDS };

static enum kind parse_name(const char *name, uint64_t *id, uint64_t *v) {
  char tail;
  if (sscanf(name, "seg-%" SCNu64 "%c", id, &tail) == 1)
    return K_SEG;
  if (sscanf(name, "meta-%" SCNu64 "-%" SCNu64 "%c", id, v, &tail) == 2)
    return K_META;
  if (sscanf(name, "ids-%" SCNu64 "%c", v, &tail) == 1)
    return K_IDS;
  return K_OTHER;
}

static void adopt_ids(struct gshmd_fdstore *fs, int fd, uint64_t v) {
  struct gshmd_registry *r = fs->reg;
  Gshm__StateTable *t;
  uint8_t *buf = NULL;
  ssize_t len = read_record(fd, &buf);

  if (len < 0 || !(t = gshm__state_table__unpack(NULL, (size_t)len, buf))) {
    gshm_log_err("fd store: ids-%" PRIu64 " unreadable; ids restart above the restored ones", v);
    free(buf);
    return;
  }
  free(buf);
  if (t->version == 2) {
    if (t->next_segment_id > r->next_segment_id)
      r->next_segment_id = t->next_segment_id;
    if (t->next_generation > r->next_generation)
      r->next_generation = t->next_generation;
    if (t->next_lease_id > r->next_lease_id)
      r->next_lease_id = t->next_lease_id;
    if (t->next_session_id > r->next_session_id)
      r->next_session_id = t->next_session_id;
    fs->ids_version = v;
  }
  gshm__state_table__free_unpacked(t, NULL);
}

/* Restores one segment from its newest record and its memory fd. */
static int adopt_segment(struct gshmd_fdstore *fs, int meta_fd, uint64_t id, uint64_t v,
                         int *seg_fd) {
  struct gshmd_registry *r = fs->reg;
  struct gshmd_alloc *mem = NULL;
  struct gshmd_backend *b;
  Gshm__StateRecord *rec;
  uint8_t *buf = NULL;
  ssize_t len = read_record(meta_fd, &buf);
  int e;

  if (len < 0 || !(rec = gshm__state_record__unpack(NULL, (size_t)len, buf))) {
    free(buf);
    return -EBADMSG;
  }
  free(buf);
  b = !strcmp(rec->location, "host") ? r->host : r->cuda;
  if (rec->id != id)
    e = -EBADMSG;
  else if (*seg_fd < 0)
    e = -ENOENT;
  else if (!b || !b->ops->adopt_fd)
    e = -ENODEV;
  else if (!(e = b->ops->adopt_fd(b, *seg_fd, rec->location, rec->size, &mem))) {
    *seg_fd = -1; /* the backend owns it now */
    if ((e = gshmd_registry_adopt(r, rec, mem)))
      b->ops->free(b, mem);
    else
      gshmd_registry_find_id(r, id)->meta_version = v;
  }
  if (e)
    gshm_log_err("fd store: segment '%s' id %" PRIu64 " not restored: %s", rec->name, id,
                 e == -ENOENT ? "its memory was not handed back" : strerror(-e));
  gshm__state_record__free_unpacked(rec, NULL);
  return e;
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

int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  struct entry *e;
  uint64_t best_ids = 0;
  int ids_idx = -1, ne = 0;

  if (!names || n <= 0)
    return 0;
  if (!(e = malloc(sizeof(*e) * (size_t)n)))
    return -ENOMEM;
  /* Parse every name once; the newest ids record on the way. */
  for (int i = 0; i < n; i++) {
    uint64_t id = 0, v = 0;
    enum kind k = fds[i] < 0 ? K_OTHER : parse_name(names[i], &id, &v);
    if (k == K_IDS && (ids_idx < 0 || v > best_ids)) {
      best_ids = v;
      ids_idx = i;
    } else if (k == K_SEG || k == K_META) {
      e[ne++] = (struct entry){k, id, v, i};
    }
  }
  if (ids_idx >= 0)
    adopt_ids(fs, fds[ids_idx], best_ids);

  /* Sorted, each id's entries are adjacent: its memory, then its records
   * oldest first.  O(n log n) for the up to 2 x max_segments fds handed
   * back, before READY. */
  qsort(e, (size_t)ne, sizeof(*e), cmp_entry);
  for (int i = 0; i < ne;) {
    int j = i, seg = -1, meta = -1;
    for (; j < ne && e[j].id == e[i].id; j++) {
      if (e[j].kind == K_SEG)
        seg = e[j].idx;
      else
        meta = j; /* the last is the newest */
    }
    if (meta >= 0) {
      if (adopt_segment(fs, fds[e[meta].idx], e[meta].id, e[meta].v,
                        seg >= 0 ? &fds[seg] : &(int){-1}))
        fs->dropped++;
      else
        fs->restored++;
    }
    i = j;
  }
  free(e);
  /* (registry_adopt keeps next ids above every restored segment.) */

  /* Our leftovers (older records, memory nobody names, the meta records
   * now in use are kept in the store) are closed; the stale ones are also
   * removed from the store. */
  for (int i = 0; i < n; i++) {
    uint64_t id, v;
    enum kind k;
    struct gshmd_segment *s;
    if (fds[i] < 0 || (k = parse_name(names[i], &id, &v)) == K_OTHER)
      continue;
    s = k == K_META ? gshmd_registry_find_id(fs->reg, id) : NULL;
    if (!(k == K_META && s && s->meta_version == v) && !(k == K_IDS && i == ids_idx)) {
      if (k == K_SEG)
        gshm_log_warn("fd store: dropping %s, which no record names", names[i]);
      store_remove(fs, names[i]);
    }
    close(fds[i]);
    fds[i] = -1;
  }
  if (fs->restored || fs->dropped)
    gshm_log_notice("fd store: %u segment(s) restored, %u lost", fs->restored, fs->dropped);
  return 0;
}

void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs) {
  if (fs->nowed || fs->nremoves)
    gshm_log_err("fd store behind: %zu segment record(s) and %zu removal(s) not stored; those "
                 "changes will be lost or undone at the next start",
                 fs->nowed, fs->nremoves);
  for (size_t i = 0; i < fs->nremoves; i++)
    free(fs->removes[i]);
  free(fs->removes);
  free(fs->owed);
  fs->removes = NULL;
  fs->owed = NULL;
  fs->nremoves = fs->nowed = fs->removes_cap = fs->owed_cap = 0;
  if (fs->reg && fs->reg->on_event == on_event) {
    fs->reg->on_event = NULL;
    fs->reg->on_event_data = NULL;
  }
}
