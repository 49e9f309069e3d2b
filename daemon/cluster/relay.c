/* SPDX-License-Identifier: Apache-2.0 */
/* Relaying a pull in flight (relay.h): per relayed segment, the bytes
 * landed in each granule (cluster.pull_chunk bytes: chunks land in any
 * order and never twice, so a count per granule says when it is whole)
 * and the reads parked on it; the Lists parked while a set is listing;
 * the in-flight part of a listing. */
#include "relay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"
#include "log.h"
#include "pull.h"
#include "registry.h"
#include "relay_names.h"
#include "util.h"
#include "wire.h"

/* One relayed segment (seg->cluster_relay), from its creation to the end
 * of its set. */
struct relay {
  struct gshm_list node;     /* cl->relays */
  struct relay_name by_name; /* cl->relay_names: seg's name, set's seq */
  const struct pull_set *set; /* the set that will publish seg */
  const struct pull *item;    /* seg's item in it */
  struct gshmd_segment *seg;
  uint64_t size, granule;
  size_t n;                  /* granules */
  uint64_t *landed;          /* bytes landed, per granule */
  /* per granule i (and n, the end): a granule at or past i not whole yet,
   * the first where it is i itself (granule_next: the first one) */
  size_t *next_open;
  struct gshm_list waits;    /* struct relay_wait: reads parked on it */
};

/* A request parked: its copy, served again as it came. */
struct relay_wait {
  struct gshm_list node;     /* relay->waits or cl->relay_lists */
  struct gshm_list by_link;  /* l->parked_waits */
  struct link *l;
  int64_t parked_ns;         /* CLOCK_MONOTONIC: a read's wait is over at half the request
                                timeout (0: its reader does not ask again, CAP_ASK_AGAIN) */
  Gshm__Cluster__Msg m;
  Gshm__Cluster__Read rd;
  Gshm__Cluster__Stage st;
  Gshm__Cluster__ListRequest lr;
};

int gshmd__relay_new(struct gshmd_cluster *cl, const struct pull *p) {
  const struct pull_set *s = p->s;
  struct gshmd_segment *seg = p->seg;
  struct relay *x = calloc(1, sizeof(*x));
  uint64_t g = cl->cfg->cluster_pull_chunk ? cl->cfg->cluster_pull_chunk : 1;

  if (!x)
    return -ENOMEM;
  x->set = s;
  x->item = p;
  x->seg = seg;
  x->size = seg->requested_size;
  x->granule = g;
  x->n = (size_t)((x->size + g - 1) / g);
  x->by_name.name = seg->name;
  x->by_name.order = s->seq;
  if ((x->n && !(x->landed = calloc(x->n, sizeof(*x->landed)))) ||
      !(x->next_open = malloc((x->n + 1) * sizeof(*x->next_open))) ||
      gshmd__relay_names_add(&cl->relay_names, &x->by_name)) {
    free(x->landed);
    free(x->next_open);
    free(x);
    return -ENOMEM;
  }
  for (size_t i = 0; i <= x->n; i++)
    x->next_open[i] = i;
  gshm_list_init(&x->waits);
  gshm_list_add_tail(&cl->relays, &x->node);
  seg->cluster_relay = x;
  return 0;
}

static uint64_t granule_len(const struct relay *x, size_t i) {
  uint64_t start = (uint64_t)i * x->granule;
  return x->size - start < x->granule ? x->size - start : x->granule;
}

/* The first granule at or past i that is not whole yet (x->n: none),
 * the links followed on the way halved.  Granules only fill, so over a
 * pull every link is followed about once: whether a range has landed
 * costs next to nothing, however long it is.  (Each Read, and each
 * landing for each parked read, looked at its range granule by granule:
 * with cluster.pull_chunk at 4 KiB, 16,384 looks for a Read of 64 MiB,
 * which a key holder sent as fast as it liked: docs/SECURITY.md.) */
static size_t granule_next(struct relay *x, size_t i) {
  while (x->next_open[i] != i) {
    x->next_open[i] = x->next_open[x->next_open[i]];
    i = x->next_open[i];
  }
  return i;
}

/* Whether [off, off + len) has landed; a range outside the segment is
 * left to serve.c to refuse. */
static bool landed(struct relay *x, uint64_t off, uint64_t len) {
  if (len == 0 || off >= x->size || len > x->size - off)
    return true;
  return granule_next(x, (size_t)(off / x->granule)) > (off + len - 1) / x->granule;
}

static void wait_range(const struct relay_wait *w, uint64_t *off, uint64_t *len) {
  *off = w->m.body_case == GSHM__CLUSTER__MSG__BODY_READ ? w->rd.offset : w->st.offset;
  *len = w->m.body_case == GSHM__CLUSTER__MSG__BODY_READ ? w->rd.length : w->st.length;
}

/* Takes w off its list and its link's: no longer counted on the link. */
static void wait_unpark(struct relay_wait *w) {
  gshm_list_del(&w->node);
  gshm_list_del(&w->by_link);
  w->l->parked--;
}

/* Takes w off its lists and serves its request again (or drops it when
 * its link is no longer up). */
static void wait_resume(struct gshmd_cluster *cl, struct relay_wait *w) {
  wait_unpark(w);
  if (w->l->state == LINK_UP)
    cl->serve_again(cl, w->l, &w->m);
  free(w);
}

/* The first parked read of x whose range has landed, or NULL. */
static struct relay_wait *ready_wait(struct relay *x) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &x->waits) {
    struct relay_wait *w = gshm_list_entry(pos, struct relay_wait, node);
    uint64_t off, len;
    wait_range(w, &off, &len);
    if (landed(x, off, len))
      return w;
  }
  return NULL;
}

void gshmd__relay_landed(struct gshmd_cluster *cl, struct gshmd_segment *seg, uint64_t off,
                         uint64_t len) {
  struct relay *x = seg ? seg->cluster_relay : NULL;
  struct relay_wait *w;
  uint64_t end;

  if (!x || len == 0 || off >= x->size)
    return;
  end = len > x->size - off ? x->size : off + len;
  while (off < end) {
    size_t i = off / x->granule;
    uint64_t gend = (uint64_t)(i + 1) * x->granule;
    uint64_t n = (gend < end ? gend : end) - off;
    if ((x->landed[i] += n) >= granule_len(x, i))
      x->next_open[i] = i + 1; /* (whole: granule_next goes past it) */
    off += n;
  }
  cl->relay_landed += len;
  /* (served one at a time from the head: a send may end links and so
   * drop other waits) */
  while ((w = ready_wait(x)))
    wait_resume(cl, w);
}

void gshmd__relay_end(struct gshmd_cluster *cl, struct gshmd_segment *seg, int err,
                      const char *why) {
  struct relay *x = seg ? seg->cluster_relay : NULL;

  if (!x)
    return;
  seg->cluster_relay = NULL;
  gshm_list_del(&x->node);
  gshmd__relay_names_remove(&cl->relay_names, &x->by_name);
  while (!gshm_list_empty(&x->waits)) {
    struct relay_wait *w = gshm_list_entry(x->waits.next, struct relay_wait, node);
    if (!err) {
      wait_resume(cl, w); /* (seg is published: served whole) */
      continue;
    }
    wait_unpark(w);
    if (w->l->state == LINK_UP)
      gshmd__link_send_status(w->l, w->m.request_id, err, why);
    free(w);
  }
  free(x->landed);
  free(x->next_open);
  free(x);
}

/* Whether seg, in flight in set s, may stand for its name in peers'
 * listings and grants: no live segment holds the name, or s replaces it
 * and its user may (else its publish fails there; before, another user's
 * set in flight with --replace was listed and granted to peers in place
 * of a segment it could not replace). */
static bool may_stand_for(struct gshmd_cluster *cl, const struct pull_set *s,
                          const struct gshmd_segment *seg) {
  struct gshmd_segment *old = gshmd_registry_find_name(cl->reg, seg->name);
  return !old || (s->replace && gshmd_registry_may_manage(s->holder, old));
}

/* Whether the whole path of p's bytes is known: its source granted it and
 * said the path beyond (or that its bytes were all there). */
static bool path_known(const struct pull *p) {
  return p->granted && p->upstream_known;
}

/* Whether x may be granted to peer asker now: its bytes are all in; or
 * asker is none of its set's sources and either the whole path of x's
 * bytes is known (its source granted it, with the path beyond) and asker
 * is not on it, or the set has one source or x's bytes come from its
 * first (the lister), which granted them.  Two nodes that name each other as sources (B
 * pulls "a,c", C "a,b") would otherwise each be granted the other's
 * empty segment and wait for its bytes, both sets failing at their
 * timeout, and so would any ring of relays (B from C, C from D, D from
 * B: the path shows it).  A relay of several sources with the path
 * known hands on what it takes from any of them (the fan-out of
 * `gshm-bench pull --fanout 3 --sources`: n2 served n3 0.05 copies of
 * the set when only what it took from n0 went on). */
static bool relay_serves(const struct relay *x, const struct peer *asker) {
  const struct pull *p = x->item;

  if (p->finished)
    return true;
  /* (one of the set's own sources: it may be waiting on this node, its
   * grant asked for this segment, or about to be: B pulling from C while
   * C takes the set from "a,b") */
  if (gshmd__pull_set_from(x->set, asker))
    return false;
  if (path_known(p))
    return p->peer != asker &&
           !gshmd__relay_path_has(p->upstream ? p->upstream : "", asker->name);
  /* (a set of several sources: only once its lister granted it, for a
   * segment asked of it and refused busy is asked of another source
   * next, and one handed on before would then wait on that one: a ring
   * E -> C -> B -> D -> C with C from "e,d", B from "c", D from "b") */
  return x->set->npeers <= 1 || (p->granted && p->src == 0);
}

const char *gshmd__relay_upstream(const struct gshmd_segment *seg, char *buf, size_t len) {
  const struct relay *x = seg->cluster_relay;
  const struct pull *p = x ? x->item : NULL;
  const char *up;

  buf[0] = 0;
  if (!p || !seg->hidden) /* (published: not in flight, no path) */
    return buf;
  if (p->finished) {
    /* (its bytes are all here: the node they came from alone, a known
     * path, where an empty one reads as not known to the receiver) */
    snprintf(buf, len, "%s", (p->peer ? p->peer : x->set->peer)->name);
    return buf;
  }
  up = p->upstream ? p->upstream : "";
  if (path_known(p) && gshmd__relay_path_names(up) < RELAY_PATH_MAX)
    snprintf(buf, len, "%s%s%s", p->peer->name, *up ? "," : "", up);
  else if (!p->granted && x->set->npeers <= 1 && p->listed && !p->listed_in_flight)
    /* (not granted yet, but its one source listed it published: the
     * bytes will come from there; a relay of a set that pulls one
     * segment at a time grants most of it before its own grant) */
    snprintf(buf, len, "%s", x->set->peer->name);
  else
    snprintf(buf, len, "%s,?", (p->peer ? p->peer : x->set->peer)->name);
  return buf;
}

/* The relayed segment named name (the first of the pulls in flight that
 * will publish it: relay_names keeps their start order) that may be
 * granted now, or NULL; *later set when one exists that may not yet
 * (relay_serves). */
static struct gshmd_segment *relay_find(struct gshmd_cluster *cl, const char *name,
                                        const struct peer *asker, bool *later) {
  struct relay_name *e;

  for (e = gshmd__relay_names_get(&cl->relay_names, name); e; e = e->same) {
    struct relay *x = gshm_list_entry(e, struct relay, by_name);
    if (x->seg->unlinked || !may_stand_for(cl, x->set, x->seg))
      continue;
    if (relay_serves(x, asker))
      return x->seg;
    *later = true;
  }
  return NULL;
}

struct gshmd_segment *gshmd__relay_grant_find(struct gshmd_cluster *cl, const char *name,
                                              bool in_flight, const struct peer *asker,
                                              bool *later_out) {
  struct gshmd_segment *seg;

  *later_out = false;
  if (in_flight && ((seg = relay_find(cl, name, asker, later_out)) || *later_out))
    return seg; /* (the one in flight, now or later: not the old one) */
  seg = gshmd_registry_find_name(cl->reg, name);
  return seg ? seg : relay_find(cl, name, asker, later_out);
}

/* A wait for request rid of link l (the caller fills its message and
 * puts it on a list), counted on l and on its list.  NULL when out of
 * memory. */
static struct relay_wait *wait_new(struct link *l, uint32_t rid) {
  struct relay_wait *w = calloc(1, sizeof(*w));
  if (!w)
    return NULL;
  w->l = l;
  gshm__cluster__msg__init(&w->m);
  w->m.request_id = rid;
  if (!l->parked) /* (none parked: made here, for a new link has no list yet) */
    gshm_list_init(&l->parked_waits);
  gshm_list_add_tail(&l->parked_waits, &w->by_link);
  l->parked++;
  return w;
}

/* w's wait is over at half the request timeout (expire_waits), for a
 * reader that asks again such a request (its hello's cap); another one's
 * waits until it is served. */
static void park_deadline(struct gshmd_cluster *cl, struct link *l, struct relay_wait *w,
                          uint32_t cap) {
  if (!(l->caps_theirs & cap))
    return;
  w->parked_ns = gshm__now_ns(CLOCK_MONOTONIC);
  if (!cl->relay_expiry_ns)
    cl->relay_expiry_ns = w->parked_ns + cl->ll.request_timeout_ns / 2;
}

int gshmd__relay_gate(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                      uint32_t rid, const Gshm__Cluster__Read *rd,
                      const Gshm__Cluster__Stage *st, const char **why_out) {
  struct relay *x = seg->cluster_relay;
  struct relay_wait *w;

  if (!seg->hidden)
    return 0;
  if (!x || seg->unlinked) {
    *why_out = "this node's own pull of that segment failed";
    return -ECONNRESET;
  }
  if (landed(x, rd ? rd->offset : st->offset, rd ? rd->length : st->length))
    return 0;
  if (l->busy + l->parked >= RELAY_MAX_PARKED) {
    *why_out = "too many reads in flight";
    return -EBUSY;
  }
  if (!(w = wait_new(l, rid))) {
    *why_out = "out of memory";
    return -ENOMEM;
  }
  /* (fields copied: the message's unknown fields go with it) */
  if (rd) {
    gshm__cluster__read__init(&w->rd);
    w->rd.grant_id = rd->grant_id;
    w->rd.offset = rd->offset;
    w->rd.length = rd->length;
    w->m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
    w->m.read = &w->rd;
  } else {
    gshm__cluster__stage__init(&w->st);
    w->st.grant_id = st->grant_id;
    w->st.offset = st->offset;
    w->st.length = st->length;
    w->st.slot = st->slot;
    w->m.body_case = GSHM__CLUSTER__MSG__BODY_STAGE;
    w->m.stage = &w->st;
  }
  park_deadline(cl, l, w, GSHM__CLUSTER__CAP__CAP_ASK_AGAIN);
  gshm_list_add_tail(&x->waits, &w->node);
  cl->relay_waits++;
  return 1;
}

/* Refuses busy the parked reads that waited half the request timeout
 * (their readers ask again while this node's pulls progress: relay.h),
 * and notes when the next one's wait is over. */
/* Moves the waits of list h that waited park ns by now to gone; *next:
 * the earliest end of the others' waits (0: none). */
static void expired(struct gshm_list *h, int64_t now, int64_t park, int64_t *next,
                    struct gshm_list *gone) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, h) {
    struct relay_wait *w = gshm_list_entry(pos, struct relay_wait, node);
    if (!w->parked_ns)
      continue;
    if (now - w->parked_ns < park) {
      if (!*next || w->parked_ns + park < *next)
        *next = w->parked_ns + park;
      continue;
    }
    wait_unpark(w);
    gshm_list_add_tail(gone, &w->node);
  }
}

static void expire_waits(struct gshmd_cluster *cl, int64_t now) {
  int64_t park = cl->ll.request_timeout_ns / 2, next = 0;
  struct gshm_list *pos, gone;

  gshm_list_init(&gone);
  gshm_list_foreach(pos, &cl->relays)
      expired(&gshm_list_entry(pos, struct relay, node)->waits, now, park, &next, &gone);
  expired(&cl->relay_lists, now, park, &next, &gone);
  cl->relay_expiry_ns = next;
  /* (answered once off every list: a send may end links and so drop
   * other waits) */
  while (!gshm_list_empty(&gone)) {
    struct relay_wait *w = gshm_list_entry(gone.next, struct relay_wait, node);
    Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
    a.request_id = w->m.request_id;
    a.status = (uint32_t)gshm__errno_to_status(-EBUSY);
    a.message = w->m.body_case == GSHM__CLUSTER__MSG__BODY_LIST
                    ? (char *)"this node is still listing a set it pulls: ask again"
                    : (char *)"this node is still pulling those bytes: ask again";
    a.progress = cl->relay_landed + cl->list_pages;
    cl->relay_busy++;
    gshm_list_del(&w->node);
    if (w->l->state == LINK_UP)
      gshmd__link_send(w->l, &a);
    free(w);
  }
}

int gshmd__relay_ask_again(struct link *l, struct peer_req *req, struct relay_ask *ra,
                           const char **why_out) {
  /* (a relay's progress only grows; what it says early, it cannot have
   * waited for: relay.h RELAY_PARK_MIN_NS) */
  bool grew = req->progress > ra->progress &&
              gshm__now_ns(CLOCK_MONOTONIC) - req->sent_ns >= RELAY_PARK_MIN_NS;

  ra->stale = ra->busy && !grew ? ra->stale + 1 : 0;
  if (grew)
    ra->progress = req->progress;
  ra->busy++;
  if (ra->stale >= RELAY_STALE_MAX) {
    *why_out = "it kept a read (or a listing) waiting for what it is still pulling, and its "
               "pulls made no progress meanwhile";
    return -ETIMEDOUT;
  }
  if (!l || l->state != LINK_UP) {
    *why_out = "lost";
    req->answered = false; /* (the link's end, not the busy answer: gshmd__peer_error) */
    return -ECONNRESET;
  }
  gshmd__link_req_send(l, req);
  return 0;
}

/* Whether a set of this node other than one pulling from `from` is still
 * listing its peer (its segments are not all created yet). */
static bool listing_under_way(struct gshmd_cluster *cl, const struct peer *from) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    if (s->prefix && (s->listing || s->to_create) && !s->err && !gshmd__pull_set_from(s, from))
      return true;
  }
  return false;
}

bool gshmd__relay_list_wait(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                            const Gshm__Cluster__ListRequest *req) {
  struct relay_wait *w;

  if (!req->with_in_flight || l->busy + l->parked >= RELAY_MAX_PARKED ||
      !listing_under_way(cl, l->peer) || !(w = wait_new(l, rid)))
    return false;
  gshm__cluster__list_request__init(&w->lr);
  w->lr.after = req->after;
  w->lr.with_in_flight = true;
  w->m.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  w->m.list = &w->lr;
  park_deadline(cl, l, w, GSHM__CLUSTER__CAP__CAP_ASK_AGAIN_LIST);
  gshm_list_add_tail(&cl->relay_lists, &w->node);
  return true;
}

void gshmd__relay_poll(struct gshmd_cluster *cl) {
  int64_t now;

  while (!gshm_list_empty(&cl->relay_lists)) {
    struct relay_wait *w = gshm_list_entry(cl->relay_lists.next, struct relay_wait, node);
    if (listing_under_way(cl, w->l->peer))
      break; /* (they all wait for the same) */
    wait_resume(cl, w);
  }
  if (cl->relay_expiry_ns && (now = gshm__now_ns(CLOCK_MONOTONIC)) >= cl->relay_expiry_ns)
    expire_waits(cl, now);
}

void gshmd__relay_link_gone(struct gshmd_cluster *cl, struct link *l) {
  (void)cl;
  /* (l's own waits: before, every relayed segment's were walked for each
   * link that went with a request parked) */
  while (l->parked) {
    struct relay_wait *w = gshm_list_entry(l->parked_waits.next, struct relay_wait, by_link);
    wait_unpark(w);
    free(w);
  }
}

/* A set's item's listing key: sets in the order they started (their
 * seq), items in order; below RELAY_KEY_END. */
static uint64_t item_key(const struct pull_set *s, size_t i) {
  return 1 + (s->seq << 13) + i; /* (PULL_SET_MAX < 8192) */
}

uint64_t gshmd__relay_foreach(struct gshmd_cluster *cl, uint64_t after, unsigned visits,
                              bool (*fn)(void *arg, struct gshmd_segment *seg, uint64_t key),
                              void *arg) {
  struct gshm_list *pos;
  uint64_t looked = 0;

  gshm_list_foreach(pos, &cl->pulls) {
    struct pull_set *s = gshm_list_entry(pos, struct pull_set, node);
    uint64_t first = item_key(s, 0);
    if (s->err || !s->n || after >= first + s->n - 1)
      continue; /* (every key of s was listed: a page costs its own items) */
    for (size_t i = after >= first ? (size_t)(after - first + 1) : 0; i < s->n; i++) {
      struct gshmd_segment *seg = s->items[i]->seg;
      uint64_t key = item_key(s, i);
      if (key <= after)
        continue;
      if (!visits--)
        return looked;
      /* (a name held here is listed in flight only by a set that
       * replaces it and may: another set's publish would fail on it) */
      if (seg && seg->cluster_relay && may_stand_for(cl, s, seg) && !fn(arg, seg, key))
        return 0;
      looked = key;
    }
  }
  return 0;
}
