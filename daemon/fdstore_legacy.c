/* SPDX-License-Identifier: Apache-2.0 */
/* Restoring the fd store format of earlier releases (up to b856fd5): per
 * segment its memory (seg-<id>) and a sealed memfd with its StateRecord
 * (meta-<id>-<v>), and a journal (FDNAME=journal: a 4096-byte header
 * naming the area that holds a StateTable of version 3).  Its segments
 * are restored by that format's rules, placed in buckets, and its names
 * removed once every bucket is stored (until then a SIGKILL finds both
 * formats: the buckets' segments win and the rest is restored again from
 * the old names).  Segments the buckets already hold are skipped. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

#define JOURNAL_HEAD 4096u
#define JOURNAL_VERSION 1
#define JOURNAL_READ_MAX (1ull << 30)

/* The old journal's first bytes: off and len name the current StateTable. */
struct journal_head {
  char magic[8];
  uint32_t version;
  uint32_t pad;
  uint64_t off, len;
};
static const char journal_magic[8] = {'G', 'S', 'H', 'M', 'J', 'R', 'N', 'L'};

/* What the old journal fd holds (NULL when empty or unreadable; said). */
static Gshm__StateTable *journal_read(int fd) {
  struct journal_head h;
  struct stat st;
  Gshm__StateTable *t = NULL;
  uint8_t *buf;

  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
      pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
      memcmp(h.magic, journal_magic, sizeof(h.magic)) || h.version != JOURNAL_VERSION ||
      h.off < JOURNAL_HEAD || h.len > JOURNAL_READ_MAX || h.off > (uint64_t)st.st_size ||
      h.len > (uint64_t)st.st_size - h.off) {
    gshm_log_err("fd store: the old journal's header is not one gshmd wrote; ignored");
    return NULL;
  }
  if (!h.len || !(buf = malloc(h.len)))
    return NULL;
  if (pread(fd, buf, h.len, (off_t)h.off) != (ssize_t)h.len ||
      !(t = gshm__state_table__unpack(NULL, h.len, buf)) || t->version != 3) {
    gshm_log_err("fd store: the old journal is unreadable; restoring from its records alone");
    if (t)
      gshm__state_table__free_unpacked(t, NULL);
    t = NULL;
  }
  free(buf);
  return t;
}

/* The old journal's contents, sorted for lookups by id. */
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

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

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
    if (jt->segments[i] && jt->segments[i]->id && jt->segments[i]->location)
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
  enum fdstore_kind kind;
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

static Gshm__StateRecord *read_state_record(int fd) {
  uint8_t *buf = NULL;
  ssize_t len = gshmd__fdstore_read_record(fd, &buf);
  Gshm__StateRecord *rec = len < 0 ? NULL : gshm__state_record__unpack(NULL, (size_t)len, buf);
  free(buf);
  if (rec && (!rec->name || !rec->location)) {
    gshm__state_record__free_unpacked(rec, NULL);
    rec = NULL;
  }
  return rec;
}

/* Restores one id from its sorted entries e[0..ne) (its memory, then its
 * records oldest first) and the journal view: the journal's record wins
 * when it stands for a newer version than the newest stored one. */
static void restore_id(struct gshmd_fdstore *fs, int *fds, char **names,
                       struct journal_view *jv, const struct entry *e, int ne) {
  int seg = -1, meta = -1;
  uint64_t id = e[0].id, stored_v;
  struct jrec *jr = journal_record(jv, id);
  Gshm__StateRecord *rec = NULL;
  struct gshmd_segment *s;

  for (int j = 0; j < ne; j++) {
    if (e[j].kind == K_SEG)
      seg = e[j].idx;
    else
      meta = j; /* the last is the newest */
  }
  stored_v = meta >= 0 ? e[meta].v : 0;
  if (jr)
    jr->used = true;
  if (jr && jr->version <= stored_v)
    jr = NULL; /* the store has it, or newer */
  if (freed_id(jv, id) || (meta < 0 && !jr) || gshmd_registry_find_id(fs->reg, id))
    return; /* (freed, nothing to restore, or a bucket holds it already) */
  if (!jr && !(rec = read_state_record(fds[e[meta].idx]))) {
    gshm_log_err("fd store: segment id %" PRIu64 " not restored: its record is unreadable", id);
    fs->dropped++;
    return;
  }
  if (gshmd__fdstore_adopt(fs, jr ? jr->rec : rec, seg >= 0 ? &fds[seg] : NULL) == 0) {
    fs->converted++;
    gshmd__fdstore_retire(fs, names[seg]); /* (its fd is the backend's now) */
    if ((s = gshmd_registry_find_id(fs->reg, id)) && fs->enabled)
      gshmd__fdstore_place(fs, s, false);
  }
  if (rec)
    gshm__state_record__free_unpacked(rec, NULL);
}

/* The old journal's records for segments the store has nothing of: their
 * memory never reached it. */
static void say_unused(struct gshmd_fdstore *fs, const struct journal_view *jv) {
  for (size_t i = 0; i < jv->nrecs; i++)
    if (!jv->recs[i].used && !freed_id(jv, jv->recs[i].rec->id) &&
        (i + 1 == jv->nrecs || jv->recs[i + 1].rec->id != jv->recs[i].rec->id)) {
      gshm_log_err("fd store: segment '%s' id %" PRIu64 " not restored: its memory was "
                   "never stored",
                   jv->recs[i].rec->name, jv->recs[i].rec->id);
      fs->dropped++;
    }
}

/* The old entries (and the old journal) are closed; every one is removed
 * from the store: now, when nothing needs it, else once the buckets that
 * took its segments are stored. */
static void leftovers(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t id, v;
    enum fdstore_kind k;
    if (fds[i] < 0)
      continue;
    k = gshmd__fdstore_parse_name(names[i], &id, &v);
    if (k != K_SEG && k != K_META && k != K_JOURNAL)
      continue;
    if (k == K_JOURNAL || gshmd_registry_find_id(fs->reg, id))
      gshmd__fdstore_retire(fs, names[i]);
    else
      gshmd__fdstore_remove(fs, names[i]);
    close(fds[i]);
    fds[i] = -1;
  }
}

int gshmd__legacy_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  Gshm__StateTable *jt = NULL;
  struct journal_view jv;
  struct entry *e;
  int ne = 0;

  for (int i = 0; i < n; i++)
    if (fds[i] >= 0 && !jt && !strcmp(names[i], FDSTORE_LEGACY_JOURNAL_NAME))
      jt = journal_read(fds[i]);
  if (journal_view(jt, &jv) || !(e = malloc(sizeof(*e) * (n > 0 ? (size_t)n : 1)))) {
    if (jt)
      gshm__state_table__free_unpacked(jt, NULL);
    free(jv.recs);
    free(jv.freed);
    return -ENOMEM;
  }
  if (jt) /* ids handed out after the stored reservation */
    gshmd__fdstore_raise_ids(fs->reg, jt);
  for (int i = 0; i < n; i++) {
    uint64_t id = 0, v = 0;
    enum fdstore_kind k = fds[i] < 0 ? K_OTHER : gshmd__fdstore_parse_name(names[i], &id, &v);
    if (k == K_SEG || k == K_META)
      e[ne++] = (struct entry){k, id, v, i};
  }
  /* Sorted, each id's entries are adjacent: O(n log n) before READY. */
  qsort(e, (size_t)ne, sizeof(*e), cmp_entry);
  for (int i = 0, j; i < ne; i = j) {
    for (j = i; j < ne && e[j].id == e[i].id; j++)
      ;
    restore_id(fs, fds, names, &jv, e + i, j - i);
  }
  say_unused(fs, &jv);
  /* (after a sticky CUDA error the old entries stay: fdstore_restore.c) */
  if (!gshmd_backend_needs_restart(fs->reg->cuda))
    leftovers(fs, fds, names, n);
  free(e);
  free(jv.recs);
  free(jv.freed);
  if (jt)
    gshm__state_table__free_unpacked(jt, NULL);
  return 0;
}
