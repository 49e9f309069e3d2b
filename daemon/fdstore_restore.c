/* SPDX-License-Identifier: Apache-2.0 */
/* The fd store at start: what systemd handed back is adopted (buckets,
 * ids, journal, and the legacy one-fd-per-segment format), then this
 * run's journal is made; and at stop (fdstore.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "backend.h"
#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

#define RECORD_MAX (1u << 20) /* a stored record larger than this is refused */

/* Reads a sealed record memfd into buf (malloc'ed).  Returns its length or
 * a negative errno. */
ssize_t gshmd__fdstore_read_record(int fd, uint8_t **buf_out) {
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
void gshmd__fdstore_raise_ids(struct gshmd_registry *r, const Gshm__StateTable *t) {
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
  ssize_t len = gshmd__fdstore_read_record(fd, &buf);
  bool ok;

  if (len < 0 || !(t = gshm__state_table__unpack(NULL, (size_t)len, buf))) {
    gshm_log_err("fd store: ids-%" PRIu64 " unreadable; an older ids record is used", v);
    free(buf);
    return false;
  }
  free(buf);
  if ((ok = t->version == 2))
    gshmd__fdstore_raise_ids(fs->reg, t);
  gshm__state_table__free_unpacked(t, NULL);
  return ok;
}

/* Adopts the newest readable ids record of names[0..n) and sets
 * fs->ids_version above every one seen, so the next record replaces them
 * all (an unreadable newest one must not hide the later ones); the others
 * are closed and removed.  Linear in n plus the unreadable ones. */
static void restore_ids(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  int best = -1;
  uint64_t best_v = 0, top = 0;

  for (;;) {
    int pick = -1;
    uint64_t pick_v = 0;
    for (int i = 0; i < n; i++) {
      uint64_t id, v;
      if (fds[i] >= 0 && gshmd__fdstore_parse_name(names[i], &id, &v) == K_IDS &&
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
  for (int i = 0; i < n; i++) {
    uint64_t id, v;
    if (fds[i] < 0 || gshmd__fdstore_parse_name(names[i], &id, &v) != K_IDS)
      continue;
    if (i != best)
      gshmd__fdstore_remove(fs, names[i]);
    close(fds[i]);
    fds[i] = -1;
  }
}

/* A device segment no GPU here takes (no CUDA backend, -ENODEV from it,
 * or a sticky error in it unless fs->sticky_restart): kept parked
 * (backend.h gshmd_backend_parked), with its fd, for a later gshmd.
 * *b_out, *mem_out: the parked backend and allocation.
 * Returns 0, -ENODEV (not a device segment) or -ENOMEM. */
static int adopt_parked(const Gshm__StateRecord *rec, int fd, struct gshmd_backend **b_out,
                        struct gshmd_alloc **mem_out) {
  struct gshmd_backend *p = gshmd_backend_parked();
  int e;

  if (strncmp(rec->location, "cuda:", 5))
    return -ENODEV;
  if ((e = p->ops->adopt_fd(p, fd, rec->location, rec->size, mem_out)))
    return e;
  gshm_log_warn("fd store: device segment '%s' id %" PRIu64 " (%s) kept parked: no GPU of this "
                "gshmd takes it; it cannot be opened until gshmd restarts with its GPU's driver",
                rec->name, rec->id, rec->location);
  *b_out = p;
  return 0;
}

/* Adopts one segment from rec and its memory fd (*fd; NULL or -1 when not
 * handed back; set to -1 once adopted).  A name held by another linked
 * segment goes to the newer one (the older must have been unlinked first,
 * in a change the store missed); the older is restored unlinked.  Returns
 * 0 or a negative errno (logged, counted as dropped). */
int gshmd__fdstore_adopt(struct gshmd_fdstore *fs, const Gshm__StateRecord *rec, int *fd) {
  struct gshmd_registry *r = fs->reg;
  struct gshmd_alloc *mem = NULL;
  struct gshmd_backend *b = !strcmp(rec->location, "host") ? r->host : r->cuda;
  struct gshmd_segment *holder;
  Gshm__StateRecord copy = *rec;
  int e;

  if (!rec->unlinked && rec->name && (holder = gshmd_registry_find_name(r, rec->name))) {
    gshm_log_warn("fd store: two segments named '%s' (ids %" PRIu64 " and %" PRIu64
                  "): the older is restored unlinked",
                  rec->name, holder->id, rec->id);
    if (holder->id < rec->id) {
      gshmd_registry_unname(r, holder);
      if (holder->fs_bucket)
        fs->buckets[holder->fs_bucket - 1]->rewrite = true;
    } else {
      copy.unlinked = true;
    }
  }
  if (!rec->name)
    e = -EBADMSG;
  else if (!fd || *fd < 0)
    e = -ENOENT;
  else if (!b || !b->ops->adopt_fd || (b == r->cuda && !fs->sticky_restart &&
                                        gshmd_backend_needs_restart(b)))
    e = adopt_parked(rec, *fd, &b, &mem); /* (after a sticky error: no driver call) */
  else if ((e = b->ops->adopt_fd(b, *fd, rec->location, rec->size, &mem)) == -ENODEV ||
           (e && !fs->sticky_restart && gshmd_backend_needs_restart(b)))
    e = adopt_parked(rec, *fd, &b, &mem);
  if (!e) {
    *fd = -1; /* the backend owns it now */
    if ((e = gshmd_registry_adopt(r, &copy, mem)))
      b->ops->free(b, mem);
  }
  if (e) {
    gshm_log_err("fd store: segment '%s' id %" PRIu64 " not restored: %s",
                 rec->name ? rec->name : "?", rec->id,
                 e == -ENOENT ? "its memory was not handed back" : strerror(-e));
    fs->dropped++;
    return e;
  }
  fs->restored++;
  return 0;
}

/* Makes and stores this run's journal.  Returns false when no service
 * manager reads $NOTIFY_SOCKET (the store is then off). */
static bool start_journal(struct gshmd_fdstore *fs) {
  int je = gshmd__journal_create(fs);

  if (je) {
    gshm_log_err("fd store: cannot make the journal (%s); a failed send may bring back an "
                 "unlinked segment after a crash",
                 strerror(-je));
    return true;
  }
  je = sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=" FDSTORE_JOURNAL_NAME, &fs->journal_fd,
                              1);
  if (je == -ECONNREFUSED || je == -ENOENT) {
    /* $NOTIFY_SOCKET names a socket nobody reads (a stale variable, a
     * test that stopped listening): every send would fail for ever. */
    gshm_log_warn("fd store off: no service manager listens on $NOTIFY_SOCKET (%s); "
                  "segments will not survive a restart",
                  strerror(-je));
    close(fs->journal_fd);
    fs->journal_fd = -1;
    fs->enabled = false;
    return false;
  }
  if (je <= 0)
    gshmd__fdstore_count_failure(fs, FDSTORE_JOURNAL_NAME, je < 0 ? je : -ENOTCONN);
  else
    fs->journal_stored = true;
  return true;
}

/* Takes this run's journal from the names handed back (the first usable
 * "journal2"; others are closed and removed). */
static void find_journal(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  bool unusable = false;

  for (int i = 0; i < n; i++) {
    uint64_t id, v;
    if (fds[i] < 0 || gshmd__fdstore_parse_name(names[i], &id, &v) != K_JOURNAL2)
      continue;
    if (fs->journal_fd < 0 && gshmd__journal_adopt(fs, fds[i])) {
      fds[i] = -1;
      continue;
    }
    unusable = true;
    close(fds[i]);
    fds[i] = -1;
  }
  /* (by name: only when none was kept, else ours would go too; and never
   * owed: a late removal would take the new one stored after this) */
  if (unusable && fs->journal_fd < 0 && fs->enabled)
    sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=" FDSTORE_JOURNAL_NAME);
}

/* Whether an adopt met a sticky CUDA error (backend.h needs_restart)
 * where fs->sticky_restart asks for a restart:
 * every device adopt after it failed the same way, and the rewrites and
 * removals that follow a restore would drop those segments from the store
 * for good.  None is made: the store stays as systemd holds it, and gshmd
 * exits for a restart that adopts them again (main.c).  Logged. */
static bool restore_cut_for_restart(struct gshmd_fdstore *fs) {
  if (!fs->sticky_restart || !gshmd_backend_needs_restart(fs->reg->cuda))
    return false;
  gshm_log_err("fd store: restore stopped after the CUDA error above; the store is kept as it "
               "is for the next start");
  return true;
}

int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  int e = 0;

  if (names && n > 0) {
    find_journal(fs, fds, names, n);
    restore_ids(fs, fds, names, n);
    e = gshmd__buckets_restore(fs, fds, names, n);
    gshmd__publish_revoked_restored(fs);
    if (restore_cut_for_restart(fs))
      return -EIO;
    if (!e)
      e = gshmd__legacy_restore(fs, fds, names, n);
    if (restore_cut_for_restart(fs))
      return -EIO;
    if (fs->restored || fs->dropped)
      gshm_log_notice("fd store: %u segment(s) restored (%u from the one-fd-per-segment "
                      "format), %u lost",
                      fs->restored, fs->converted, fs->dropped);
    if (fs->cut)
      gshm_log_notice("fd store: %u segment(s) of sets whose publish a stop cut short "
                      "dropped",
                      fs->cut);
    if (fs->from_journal)
      gshm_log_notice("fd store: the store was behind at the stop; %u bucket(s) taken from "
                      "the journal",
                      fs->from_journal);
  }
  if (!fs->enabled)
    return e;
  if (!e && (e = gshmd__fdstore_check_room(fs)))
    return e; /* (before anything is stored: a frozen bucket's, a one-ended one's end stay) */
  if (fs->journal_fd < 0 && !start_journal(fs))
    return e;
  gshmd__fdstore_settle(fs);
  gshmd__one_ended_write(fs);
  gshmd_fdstore_retry(fs); /* ids reserved, retired names removed */
  return e;
}

void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs) {
  if (fs->ndirty || fs->nremoves || fs->nunplaced)
    gshm_log_warn("fd store behind at the stop: %" PRIu32 " bucket(s), %" PRIu32
                  " segment(s) never stored and %zu removal(s) not sent; the journal "
                  "carries the buckets%s",
                  fs->ndirty, fs->nunplaced, fs->nremoves,
                  fs->journal_fd >= 0 && fs->journal_stored && !fs->journal_failed
                      ? ""
                      : " (NOT: it could not be stored or written; they are lost)");
  for (size_t i = 0; i < fs->nremoves; i++)
    free(fs->removes[i]);
  for (size_t i = 0; i < fs->nretire; i++)
    free(fs->retire[i]);
  gshmd__one_ended_forget(fs, true);
  for (uint32_t i = 0; i < fs->nbuckets; i++)
    if (fs->buckets[i]) { /* (systemd keeps its own copies) */
      close(fs->buckets[i]->end[0]);
      close(fs->buckets[i]->end[1]);
      free(fs->buckets[i]);
    }
  for (uint32_t i = 0; i < fs->nunplaced; i++)
    fs->unplaced[i]->fs_slot = 0;
  free(fs->unplaced);
  fs->unplaced = NULL;
  fs->nunplaced = fs->unplaced_cap = 0;
  free(fs->buckets);
  free(fs->open);
  free(fs->dirty);
  free(fs->removes);
  free(fs->retire);
  for (uint32_t i = 0; i < fs->nheld; i++) { /* (freed as any from now on; the store keeps
                                                * their records, to restore by their rules) */
    fs->held[i]->fs_replaced = 0;
    if (fs->held[i]->fs_revoked) /* (the store's alone: out of the registry) */
      gshmd_registry_revoked_dispose(fs->held[i]);
  }
  free(fs->held);
  fs->held = NULL;
  fs->nheld = fs->held_cap = fs->held_pub = 0;
  free(fs->pub);
  fs->pub = NULL;
  fs->npub = fs->pub_cap = 0;
  fs->buckets = NULL;
  fs->open = fs->dirty = NULL;
  fs->removes = fs->retire = NULL;
  fs->nbuckets = fs->nopen = fs->ndirty = 0;
  fs->nremoves = fs->nretire = 0;
  if (fs->journal_fd >= 0)
    close(fs->journal_fd);
  fs->journal_fd = -1;
  if (fs->reg && fs->reg->on_event_data == fs) {
    fs->reg->on_event = NULL;
    fs->reg->on_event_data = NULL;
    fs->reg->fdstore = NULL;
  }
}

bool gshmd_fdstore_passed_segments(void) {
  const char *pid = getenv("LISTEN_PID"), *names = getenv("LISTEN_FDNAMES");
  char name[64], mine[24];
  uint64_t id, v;

  /* (whole, as systemd writes it: strtoll took "PIDx" for PID, a store
   * sd_listen_fds refuses to hand over) */
  snprintf(mine, sizeof(mine), "%d", (int)getpid());
  if (!pid || !names || strcmp(pid, mine))
    return false;
  for (const char *p = names; *p;) {
    size_t k = strcspn(p, ":");
    if (k < sizeof(name)) {
      memcpy(name, p, k);
      name[k] = '\0';
      enum fdstore_kind kind = gshmd__fdstore_parse_name(name, &id, &v);
      if (kind == K_BUCKET || kind == K_SEG)
        return true;
    }
    p += k + (p[k] == ':');
  }
  return false;
}
