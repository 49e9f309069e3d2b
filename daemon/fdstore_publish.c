/* SPDX-License-Identifier: Apache-2.0 */
/* A set published in one step (gshmd_registry_publish: a pull's set) is
 * all or nothing across a crash, although its records span several
 * buckets, each one datagram sent on its own (a bucket holds at most 253
 * segments; a 398-tensor model takes two).  Two-phase, as a commit
 * record does it:
 *   - each record the publish writes carries the publish's id (its
 *     largest segment id: monotonic, never reused across restarts, since
 *     the ids record or the journal reserves ids before a bucket carrying
 *     them is written) and its member count
 *     (StateRecord.publish, publish_members);
 *   - once every bucket holds its current state (nothing dirty, nothing
 *     unplaced: each member's memory fd is in a sent datagram), the
 *     journal's first page records "every publish up to P is complete",
 *     one pwrite within one page, which a SIGKILL cannot tear; each
 *     bucket written from then on carries that mark too
 *     (StateBucket.publish_done), and restore takes the highest mark it
 *     finds, so a journal lost alone does not make every publish with a
 *     member freed since look cut short.
 * Restore keeps a record of a publish above that mark only when every
 * member of its publish came back with its memory; otherwise none of
 * them is adopted (fds closed, buckets rewritten without them).  Records
 * at or below the mark are adopted as any other, so a member unlinked
 * after the publish never takes the rest with it; one unlinked and let
 * go before the mark is held, record and memory, until the mark passes,
 * and so is the record (and punched memory) of one revoked, out of the
 * registry (gshmd__publish_hold).  A journal's copy of a bucket does not
 * count: it carries no fds.
 *
 * A --replace's unlink of the old segments is part of the publish: their
 * records, written with the new ones, say unlinked by it
 * (StateRecord.replaced_by), and restore adopts them linked, under their
 * names, when that publish was cut short; and they are not freed (their
 * records and memory must stay in the store) until the mark passes it.
 * Writing the unlinks only after the mark instead would leave the old
 * segments' records at the mercy of their buckets' other writes (every
 * write stores the bucket's members as they are now), and a
 * whole-but-unmarked publish could not then tell a name the new set
 * unlinked since from one it never took.
 *
 * Why a mark after the writes rather than an intent before them: any
 * number of publishes may wait while the store is behind (a failed
 * send), and one number covers them all; an intent would need a list of
 * id ranges of unbounded length in a page that must be written whole. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

/* GSHMD_PUBLISH_BEGIN.  Without a stored journal there is nowhere to
 * record a publish complete: its records stay untagged (as before sets
 * were atomic), never dropped later for a member unlinked. */
void gshmd__publish_begin(struct gshmd_fdstore *fs) {
  fs->publishing = true;
  fs->npub = 0;
  fs->pub_untagged = fs->journal_fd < 0 || !fs->journal_stored;
}

/* A GSHMD_SEGMENT_CREATED of the publish under way, after its placement:
 * seg counts when it is in a bucket or owed a place (one whose memory
 * cannot be stored at all never comes back, and is not waited for). */
void gshmd__publish_member(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  if (fs->memo_armed) { /* (its buckets are written at the publish's end) */
    fs->memo_armed = false;
    gshmd_fdstore_memo_put(fs, fs->memo_key, fs->memo_uid, fs->memo_kind, seg->id);
  }
  if (fs->pub_untagged || (!seg->fs_bucket && !seg->fs_slot))
    return;
  if (fs->npub == fs->pub_cap) {
    uint32_t cap = fs->pub_cap ? 2 * fs->pub_cap : 256;
    struct gshmd_segment **n = realloc(fs->pub, cap * sizeof(*n));
    if (!n) {
      gshm_log_err("fd store: out of memory; a crash during this publish may bring back "
                   "part of its set");
      fs->pub_untagged = true;
      return;
    }
    fs->pub = n;
    fs->pub_cap = cap;
  }
  fs->pub[fs->npub++] = seg;
}

/* GSHMD_PUBLISH_END, before its buckets are written: its members' records
 * are tagged. */
void gshmd__publish_tag(struct gshmd_fdstore *fs) {
  uint64_t p = 0;

  for (uint32_t i = 0; !fs->pub_untagged && i < fs->npub; i++)
    if (fs->pub[i]->id > p)
      p = fs->pub[i]->id;
  for (uint32_t i = 0; p && i < fs->npub; i++) {
    fs->pub[i]->fs_publish = p;
    fs->pub[i]->fs_publish_n = fs->npub;
  }
  if (p > fs->publish_last)
    fs->publish_last = p;
  fs->npub = 0;
  if (!p) /* (nothing tagged: its replaced ones go as unlinks do) */
    fs->nheld = fs->held_pub;
  for (uint32_t i = fs->held_pub; i < fs->nheld; i++)
    fs->held[i]->fs_replaced = p;
  fs->held_pub = fs->nheld;
}

/* Appends seg to fs->held.  Returns false when out of memory. */
static bool held_push(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  if (fs->nheld == fs->held_cap) {
    uint32_t cap = fs->held_cap ? 2 * fs->held_cap : 256;
    struct gshmd_segment **n = realloc(fs->held, cap * sizeof(*n));
    if (!n)
      return false;
    fs->held = n;
    fs->held_cap = cap;
  }
  fs->held[fs->nheld++] = seg;
  return true;
}

/* GSHMD_SEGMENT_REPLACED, between the publish's BEGIN and END: a stored
 * seg is held for the publish (tagged at the END) and its bucket is
 * written with the rest.  Not when the publish is untagged: the old
 * segment is then unlinked after the END, as before sets were atomic. */
void gshmd__publish_replaced(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  if (!fs->publishing || fs->pub_untagged || seg->fs_replaced ||
      (!seg->fs_bucket && !seg->fs_slot))
    return;
  if (!held_push(fs, seg)) {
    gshm_log_err("fd store: out of memory; a crash before this publish is stored may lose "
                 "segment '%s' id %" PRIu64 " it replaces",
                 seg->name, seg->id);
    return;
  }
  if (seg->fs_bucket)
    fs->buckets[seg->fs_bucket - 1]->rewrite = true;
}

/* GSHMD_SEGMENT_RELEASE: seg, unlinked and unleased, is about to be
 * freed.  A stored member of a publish above the mark is held instead,
 * as a replaced one is (fs_replaced: its own publish), so that its record
 * and memory stay in the store until the mark passes it: freed, its
 * bucket rewritten without it, a crash before the mark (the store behind
 * for another bucket) found its set short of a member and dropped every
 * other member, live ones the puller had been told of.  Restore adopts a
 * held member unlinked and holds it again (gshmd__publish_adopted).
 * Frees nothing (the registry still holds seg): a held seg's bucket is
 * written (its record's replaced_by), nothing else. */
static void hold_released(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  gshmd__publish_commit(fs); /* (the mark as it may be now) */
  if (fs->publishing || seg->fs_replaced || seg->fs_publish <= fs->publish_done ||
      !seg->fs_bucket)
    return;
  if (!held_push(fs, seg)) {
    gshm_log_err("fd store: out of memory; a crash before the store records its set complete "
                 "may drop the set of segment '%s' id %" PRIu64,
                 seg->name, seg->id);
    return;
  }
  seg->fs_replaced = seg->fs_publish;
  fs->held_pub = fs->nheld;
  fs->buckets[seg->fs_bucket - 1]->rewrite = true;
  gshmd__fdstore_settle(fs); /* (writes the marked bucket) */
}

/* GSHMD_SEGMENT_REVOKED: seg, a member of a publish above the mark, is
 * kept (held until the mark passes its publish, fs_revoked: the registry
 * lets it go but for its record and allocation), its bucket written with
 * its record marked revoked.  Revoked, it is gone for everyone at once
 * (leases ended, pages discarded, no name, no id), but its record must
 * stay: freed, its bucket rewritten without it, a crash before the mark
 * found its set short of a member and dropped the other members, live
 * ones the puller had been told of.  Restore counts the record towards
 * its set and never adopts it as a segment (gshmd__publish_adopted).  A
 * seg already held (a replace's, an unlink's) is kept until both its
 * holds pass.  Frees nothing. */
static void hold_revoked(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  gshmd__publish_commit(fs); /* (the mark as it may be now) */
  if (fs->publishing || seg->fs_publish <= fs->publish_done || !seg->fs_bucket)
    return;
  if (!seg->fs_replaced && !held_push(fs, seg)) {
    gshm_log_err("fd store: out of memory; a crash before the store records its set complete "
                 "may drop the set of revoked segment '%s' id %" PRIu64,
                 seg->name, seg->id);
    return;
  }
  if (seg->fs_replaced < seg->fs_publish)
    seg->fs_replaced = seg->fs_publish;
  fs->held_pub = fs->nheld;
  seg->fs_revoked = true;
  fs->buckets[seg->fs_bucket - 1]->rewrite = true;
  gshmd__fdstore_settle(fs); /* (writes the marked bucket) */
}

/* The events the hold of a publish's member takes alone (the caller still
 * holds seg; nothing else is to be done for them): GSHMD_SEGMENT_RELEASE,
 * GSHMD_SEGMENT_REVOKED, and the GSHMD_SEGMENT_FREED of a revoked one
 * kept (it stays in its bucket).  Returns whether event was one. */
bool gshmd__publish_hold(struct gshmd_fdstore *fs, struct gshmd_segment *seg, int event) {
  if (event == GSHMD_SEGMENT_RELEASE)
    hold_released(fs, seg);
  else if (event == GSHMD_SEGMENT_REVOKED)
    hold_revoked(fs, seg);
  else
    return event == GSHMD_SEGMENT_FREED && seg->fs_revoked;
  return true;
}

/* Restore, once every member is in its bucket: the revoked ones
 * (gshmd__publish_adopted) leave the registry, as at their revoke.  One
 * not held (out of memory) stays in its bucket, a record no segment
 * stands for, until gshmd stops; the next restart takes it as this one. */
void gshmd__publish_revoked_restored(struct gshmd_fdstore *fs) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &fs->reg->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    if (!seg->fs_revoked)
      continue;
    gshmd_registry_drop_revoked(fs->reg, seg);
    fs->restored--; /* (a record kept, not a segment restored) */
    if (!seg->fs_replaced)
      gshm_log_err("fd store: out of memory; the record of revoked segment id %" PRIu64
                   " stays in the store until gshmd stops",
                   seg->id);
  }
}

/* seg, freed while held (a revoke), or no longer to be held: out of the
 * list.  Linear: rare. */
void gshmd__publish_unhold(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  if (!seg->fs_replaced)
    return;
  seg->fs_replaced = 0;
  for (uint32_t i = 0; i < fs->nheld; i++)
    if (fs->held[i] == seg) {
      fs->held[i] = fs->held[--fs->nheld];
      fs->held_pub = fs->nheld;
      return;
    }
}

/* The held segments whose publish the mark has passed are let go: the
 * registry frees those unlinked and unleased (each a GSHMD_SEGMENT_FREED,
 * which comes back through on_event: not again from there). */
void gshmd__publish_release(struct gshmd_fdstore *fs) {
  if (fs->releasing || fs->publishing)
    return;
  fs->releasing = true;
  for (uint32_t i = 0; i < fs->nheld;) {
    struct gshmd_segment *seg = fs->held[i];
    if (seg->fs_replaced > fs->publish_done) {
      i++;
      continue;
    }
    fs->held[i] = fs->held[--fs->nheld];
    fs->held_pub = fs->nheld;
    seg->fs_replaced = 0;
    if (!seg->fs_revoked) {
      gshmd_registry_release_replaced(fs->reg, seg);
      continue;
    }
    seg->fs_revoked = false; /* (out of the registry: its record leaves the store, then it goes) */
    fs->reg->on_event(fs->reg, seg, GSHMD_SEGMENT_FREED);
    gshmd_registry_revoked_dispose(seg);
  }
  fs->releasing = false;
}

/* Records every publish up to publish_last complete, once the store holds
 * all of them (called after each event and resend: O(1) when nothing is
 * to record). */
void gshmd__publish_commit(struct gshmd_fdstore *fs) {
  int e;

  if (fs->publish_last <= fs->publish_done || fs->ndirty || fs->nunplaced ||
      fs->journal_fd < 0 || fs->publishing)
    return;
  if ((e = gshmd__journal_put_publish(fs, fs->publish_last))) {
    if (!fs->publish_failed)
      gshm_log_err("fd store: cannot record a publish complete in the journal (%s); a crash "
                   "now drops its set if a member was freed since",
                   strerror(-e));
    fs->publish_failed = true;
    return;
  }
  fs->publish_failed = false;
  fs->publish_done = fs->publish_last;
}

static int cmp_publish(const void *a, const void *b) {
  const Gshm__StateRecord *x = ((const struct fdstore_member *)a)->rec;
  const Gshm__StateRecord *y = ((const struct fdstore_member *)b)->rec;
  if (x->publish != y->publish)
    return x->publish < y->publish ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Whether m[0..n) (one publish's records, by id) are all its members,
 * each with its memory.  An id in two buckets (one came back with one
 * end) counts once, with memory when either copy has it: restore adopts
 * the record that wins with the memory of the other (member_fd), and
 * which copy comes first here is qsort's choice. */
static bool whole(const struct fdstore_member *m, size_t n) {
  uint32_t want = m[0].rec->publish_members;
  uint64_t counted = 0; /* the id last counted (ids are never 0) */
  size_t have = 0;

  for (size_t i = 0; i < n; i++) {
    if (m[i].rec->publish_members != want || m[i].rec->id > m[i].rec->publish)
      return false;
    if (m[i].fd && *m[i].fd >= 0 && m[i].rec->id != counted) {
      have++;
      counted = m[i].rec->id;
    }
  }
  return want && have == want;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Restore: the kept m[0..n) replaced by a publish above the mark that is
 * not in kept_ids[0..nkept) (those whole, sorted; NULL when out of
 * memory: none) lost
 * their names to a set that did not come back: they are adopted linked
 * (their buckets rewritten so).  The mark is due to pass every such
 * publish. */
static void relink(struct gshmd_fdstore *fs, struct fdstore_member *m, size_t n,
                   const uint64_t *kept_ids, size_t nkept) {
  unsigned back = 0;

  for (size_t i = 0; i < n; i++) {
    uint64_t p = m[i].rec->replaced_by;
    if (p <= fs->publish_done)
      continue;
    if (p > fs->publish_last)
      fs->publish_last = p;
    if (m[i].rec->revoked) /* (never adopted linked: gshmd__publish_adopted) */
      continue;
    if (kept_ids && bsearch(&p, kept_ids, nkept, sizeof(*kept_ids), cmp_u64))
      continue;
    m[i].relink = true;
    if (m[i].b)
      m[i].b->rewrite = true;
    back++;
  }
  if (back)
    gshm_log_notice("fd store: %u segment(s) replaced by a set whose publish a stop cut short "
                    "keep their names",
                    back);
}

/* Restore: of m[0..n), the records of a revoke are taken out (their
 * buckets marked for a rewrite without them) but those of a publish above
 * the mark publish_done, whose set they keep whole.  Returns how many
 * remain, first in m, in order. */
static size_t drop_revoked(struct fdstore_member *m, size_t n, uint64_t publish_done) {
  size_t kept = 0;

  for (size_t i = 0; i < n; i++) {
    if (m[i].rec->revoked && m[i].rec->publish <= publish_done) {
      if (m[i].b)
        m[i].b->rewrite = true;
      continue;
    }
    m[kept++] = m[i];
  }
  return kept;
}

/* Restore, before any adoption: the records of m[0..n) whose publish is
 * above the journal's mark and did not come back whole are taken out (their
 * buckets marked for a rewrite without them; their fds are closed with
 * the datagrams'), logged, counted in fs->cut; the mark is then due to
 * pass every publish seen, once the store holds the rewrites.  Those a
 * cut publish replaced are marked to adopt linked (relink).  m is
 * reordered.  Returns how many remain, first in m. */
size_t gshmd__publish_filter(struct gshmd_fdstore *fs, struct fdstore_member *m, size_t n) {
  uint64_t *whole_ids = malloc((n ? n : 1) * sizeof(*whole_ids));
  size_t kept = 0, nwhole = 0;

  qsort(m, n, sizeof(*m), cmp_publish);
  for (size_t i = 0, j; i < n; i = j) {
    uint64_t p = m[i].rec->publish;
    for (j = i + 1; j < n && m[j].rec->publish == p; j++)
      ;
    if (p > fs->publish_last)
      fs->publish_last = p;
    if (p <= fs->publish_done || whole(m + i, j - i)) {
      if (p > fs->publish_done && whole_ids)
        whole_ids[nwhole++] = p;
      memmove(m + kept, m + i, (j - i) * sizeof(*m));
      kept += j - i;
      continue;
    }
    gshm_log_warn("fd store: a set of %" PRIu32 " segment(s) (ids up to %" PRIu64
                  ") was cut short by a stop during its publish: %zu came back; none is "
                  "restored",
                  m[i].rec->publish_members, p, j - i);
    for (size_t k = i; k < j; k++)
      if (m[k].b)
        m[k].b->rewrite = true;
    fs->cut += (unsigned)(j - i);
  }
  relink(fs, m, kept, whole_ids, nwhole); /* (whole_ids: in order, as m was) */
  free(whole_ids);
  return drop_revoked(m, kept, fs->publish_done);
}

/* Restore: seg was adopted from rec; it keeps its publish's tag while the
 * journal's mark is below it (a rewrite of its bucket must not make it
 * look complete). */
void gshmd__publish_adopted(struct gshmd_fdstore *fs, const Gshm__StateRecord *rec,
                            struct gshmd_segment *seg) {
  if (rec->publish > fs->publish_done) {
    seg->fs_publish = rec->publish;
    seg->fs_publish_n = rec->publish_members;
  }
  /* revoked (a set above the mark: gshmd__publish_filter drops the
   * others): held until the mark, out of the registry once placed
   * (gshmd__publish_revoked_restored) */
  if (rec->revoked) {
    seg->fs_revoked = true;
    if (held_push(fs, seg)) {
      seg->fs_replaced = rec->publish;
      fs->held_pub = fs->nheld;
    }
    return;
  }
  /* unlinked by a publish that came back whole but is not marked yet:
   * held until the mark, as before the stop */
  if (rec->replaced_by > fs->publish_done && held_push(fs, seg)) {
    seg->fs_replaced = rec->replaced_by;
    fs->held_pub = fs->nheld;
  }
}
