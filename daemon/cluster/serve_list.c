/* SPDX-License-Identifier: Apache-2.0 */
/* What peers see of this node: which segments the export rules let them
 * read (gshmd__serve_exported), and the answer to a List, a page at a time.
 * Keys (the cursor): segment ids; with ListRequest.with_in_flight, the
 * segments of this node's pulls in flight first (relay.c, keys below
 * RELAY_KEY_END), then the published ones (RELAY_KEY_END + id), so that a
 * set published between two pages is listed again rather than missed. */
#include <errno.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "registry.h"
#include "relay.h"
#include "server.h" /* GSHMD_LIST_VISITS */

/* Whether rule x of cl lets peers read seg.  A peer reads as "others" of
 * this node, or as a member of the group the rule names: the rule says
 * whose segments may leave the node (a user cannot export a segment by
 * naming it under a pattern), the mode says that the owner lets them.  A
 * PATTERN rule's owners are root and the user that started gshmd (an
 * unprivileged gshmd's own), not daemon.user: processes that share that
 * user (nobody, say) are no admins. */
static bool rule_allows(const struct gshmd_cluster *cl, const struct export_rule *x,
                        const struct gshmd_segment *seg) {
  if (fnmatch(x->pattern, seg->name, 0) != 0)
    return false;
  switch (x->owner) {
  case EXPORT_ADMINS:
    return (seg->uid == 0 || seg->uid == cl->started_uid) && (seg->mode & S_IROTH);
  case EXPORT_USER:
    return seg->uid == x->id && (seg->mode & S_IROTH);
  case EXPORT_GROUP:
    return seg->gid == x->id && (seg->mode & S_IRGRP);
  }
  return false;
}

bool gshmd__serve_exported(const struct gshmd_cluster *cl, const struct gshmd_segment *seg) {
  if (seg->unlinked)
    return false;
  for (unsigned i = 0; i < cl->nexport; i++)
    if (rule_allows(cl, &cl->exports[i], seg))
      return true;
  return false;
}

/* (every List answer says it: counted over every segment with each,
 * a peer's pipelined Lists cost the loop that walk each) */
unsigned gshmd__serve_count(struct gshmd_cluster *cl) {
  struct gshm_list *pos;
  unsigned n = 0;

  if (cl->exported_at == cl->reg->changes + 1)
    return cl->exported;
  gshm_list_foreach(pos, &cl->reg->segments) {
    n += gshmd__serve_exported(cl, gshm_list_entry(pos, struct gshmd_segment, node));
  }
  cl->exported = n;
  cl->exported_at = cl->reg->changes + 1;
  return n;
}

#define LIST_PAGE_BYTES 32768  /* and their encoding (GSHMD_CLUSTER_MAX_MSG bounds a message) */

/* A List answer being filled: at most GSHMD_LIST_PAGE_SEGMENTS segments and
 * LIST_PAGE_BYTES of them; next is the key of the last one when full. */
struct list_page {
  struct gshmd_cluster *cl;
  Gshm__Cluster__Segment *segs;
  Gshm__Cluster__Segment **ptrs;
  size_t n, used;
  size_t nflight;           /* entries of segments in flight (the first ones) */
  uint64_t last, next;
};

/* Adds seg (listing key `key`) to the page; false when it is full. */
static bool page_add(void *arg, struct gshmd_segment *seg, uint64_t key) {
  struct list_page *pg = arg;
  size_t sz;

  if (pg->n == GSHMD_LIST_PAGE_SEGMENTS) {
    pg->next = pg->last;
    return false;
  }
  gshmd__serve_segment_to_wire(seg, &pg->segs[pg->n]);
  pg->segs[pg->n].in_flight = seg->hidden;
  sz = gshm__cluster__segment__get_packed_size(&pg->segs[pg->n]) + 8;
  if (pg->used + sz > LIST_PAGE_BYTES) {
    pg->next = pg->n ? pg->last : 0;
    return false;
  }
  pg->used += sz;
  pg->ptrs[pg->n] = &pg->segs[pg->n];
  pg->n++;
  pg->last = key;
  return true;
}

/* page_add for a segment still being pulled here: only one this node
 * would export once published. */
static bool relayed_add(void *arg, struct gshmd_segment *seg, uint64_t key) {
  struct list_page *pg = arg;
  size_t n = pg->n;
  bool more = !gshmd__serve_exported(pg->cl, seg) || page_add(arg, seg, key);
  pg->nflight += pg->n - n;
  return more;
}

/* Whether the page lists a segment in flight of seg's name: one that a
 * set pulled with --replace publishes over seg (a page names each name
 * once; the puller keeps the first). */
static bool replaced_in_page(const struct list_page *pg, const struct gshmd_segment *seg) {
  for (size_t i = 0; i < pg->nflight; i++)
    if (!strcmp(pg->segs[i].name, seg->name))
      return true;
  return false;
}

/* Fills pg with the published segments after key `after` (keys: base +
 * id), from the first one past it (through the registry's id index),
 * looking at no more than GSHMD_LIST_VISITS of them: a page whose walk
 * ends there has its cursor and maybe no segment.  That cursor is the
 * key of the segment the walk stopped at less one where the peer may
 * read that segment (the next page lists it: the cursor tells nothing),
 * else the last key looked at, an unexported segment's id (SECURITY.md).
 * (Before, each page walked from the first segment, exported or not, to
 * its end or a full page: a List of a few bytes cost the loop
 * O(segments).) */
static void published_page(struct gshmd_cluster *cl, struct list_page *pg, uint64_t base,
                           uint64_t after) {
  struct gshm_list *head = &cl->reg->segments, *pos = head->next;
  struct gshmd_segment *first;
  uint64_t looked = 0;
  unsigned visits = 0;

  if (after >= base) /* (else every published key is past the cursor) */
    pos = (first = gshmd_registry_find_after(cl->reg, after - base)) ? &first->node : head;
  for (; pos != head; pos = pos->next) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    if (base + seg->id <= after)
      continue;
    if (visits++ == GSHMD_LIST_VISITS) {
      pg->next = gshmd__serve_exported(cl, seg) ? base + seg->id - 1 : looked;
      return;
    }
    if (gshmd__serve_exported(cl, seg) && !replaced_in_page(pg, seg) &&
        !page_add(pg, seg, base + seg->id))
      return;
    looked = base + seg->id;
  }
}

void gshmd__serve_list(struct link *l, uint32_t rid, const Gshm__Cluster__ListRequest *req) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;
  struct list_page pg = {.cl = cl};
  uint64_t base = req->with_in_flight ? RELAY_KEY_END : 0;

  if (gshmd__relay_list_wait(cl, l, rid, req))
    return;
  pg.segs = calloc(GSHMD_LIST_PAGE_SEGMENTS, sizeof(*pg.segs));
  pg.ptrs = calloc(GSHMD_LIST_PAGE_SEGMENTS, sizeof(*pg.ptrs));
  if (!pg.segs || !pg.ptrs) {
    free(pg.segs);
    free(pg.ptrs);
    gshmd__link_send_status(l, rid, -ENOMEM, "out of memory");
    return;
  }
  if (base && req->after < base) {
    uint64_t cut = gshmd__relay_foreach(cl, req->after, GSHMD_LIST_VISITS, relayed_add, &pg);
    if (cut && !pg.next)
      pg.next = cut; /* (a page whose walk ended at its visits: its cursor, maybe no segment) */
  }
  if (!pg.next)
    published_page(cl, &pg, base, req->after);
  r.n_segments = pg.n;
  r.segments = pg.ptrs;
  r.next = pg.next;
  r.total = gshmd__serve_count(cl);
  m.request_id = rid;
  m.status = GSHM__STATUS__STATUS_OK;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  m.list_reply = &r;
  gshmd__link_send(l, &m);
  free(pg.segs);
  free(pg.ptrs);
}
