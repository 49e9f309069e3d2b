/* SPDX-License-Identifier: Apache-2.0 */
/* What pull.c (one segment's bytes: grant, paths, chunks) and pullset.c
 * (a request: the set, grants ahead, publish, results; its listing:
 * pull_list.c) share. */
#ifndef GSHMD_CLUSTER_PULL_H
#define GSHMD_CLUSTER_PULL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "internal.h"
#include "relay.h"
#include "util.h"

#define GRANTS_AHEAD 16         /* segments of a set granted (or asked for) at once */
#define PULL_CHUNK_MIN (256u << 10) /* a small segment's chunks over lanes: at least this */
#define PULL_CHUNK_ALIGN (64u << 10) /* and a multiple of this */
/* Landing mappings made at listings (pull.c map_local), all sets
 * together: each is a VMA of gshmd's vm.max_map_count (65530 by
 * default), kept until its set ends.  Beyond, a segment is mapped at its
 * grant and unmapped at its close. */
#define PULL_MAPS_AHEAD 8192
/* Segments in one set: its pull_items replies (about 100 bytes a segment
 * with names of 30 bytes, 140 where each carries the source of a copy of
 * a copy: 12 pages for 4096) must fit what a connection may queue
 * (limits.max_inflight packets of 64 KiB beyond the socket's buffer)
 * while the client reads them. */
#define PULL_SET_MAX 4096
/* Pages a set's listing may take with none adding a segment, beyond
 * cluster.request_timeout_ms (pull_list.c list_stalled): as many as an
 * honest gshmd's listing has with no segment at all. */
#define PULL_LIST_IDLE_PAGES (GSHM_WIRE_SEGMENTS_MAX / GSHM_WIRE_LIST_VISITS)
/* Pinned staging memory the pulls of a node into GPUs hold at once, all
 * sets together, in cluster.staging_bytes: a set asks grants
 * GRANTS_AHEAD segments ahead and each device segment's holds slots
 * from its grant to its close (up to staging_bytes), so 64 sets of a
 * user could pin 64 x 16 x 128 MiB.  A grant that would pass it waits
 * for others to close (one always goes); the serving side's own cap is
 * per link (serve.c STAGED_LINK_FULL). */
#define PULL_PINNED_FULL 8
/* Peers one set pull may take its segments from (cluster.h
 * gshmd_cluster_pull: "a,b,c"): the first lists the set, and each
 * segment's grant goes to the one with the fewest of the set's bytes
 * open (grants.c), so that faster sources serve more. */
#define PULL_MAX_SOURCES 8

struct pull;
struct pull_set;


/* One segment of a set: started (grant asked) -> granted -> every byte
 * in (finished) -> closed (grant released, mapping gone; its hidden
 * segment waits for the set). */
struct pull {
  struct pull_set *s;
  struct peer *peer;          /* its source (s->peers[src]): chosen when its grant is asked */
  unsigned src;
  uint8_t tried;              /* sources (bits: s->peers' indices) that did not grant it */
  struct gshm_list link_node; /* link->pulls, once granted */
  struct link *link;          /* the link the grant came on; NULL when lost */
  struct peer_req req;        /* the grant request */
  bool req_pending;           /* submitted, its done still to come */
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__GrantRequest greq;
  char remote_name[256];
  char local_name[256];
  char location[GSHM_LOCATION_MAX];
  bool listed_in_flight;      /* the lister listed it in flight (GrantRequest.in_flight) */
  bool started, granted, finished, closed, on_link;
  bool release_owed;          /* closed: its Release goes at the end of the reap (pullset.c) */
  struct pull *next_owed;     /* the next in its reap's list of Releases owed (set_reap) */
  size_t index;               /* its place in s->items */
  size_t skip_to;             /* closed: no item of s->items[index + 1, skip_to) is open
                                 (gshmd__pull_set_open) */
  struct pull *next_retry;    /* s->retry: refused for now (busy peer), asked again later */
  uint64_t grant_id, remote_id, remote_gen;
  bool relayed;               /* granted while the peer was still pulling it (no ids there) */
  Gshm__Cluster__Path path;
  char path_reason[160];
  uint64_t listed;               /* its size in the peer's listing (0: not listed) */
  uint64_t pinned;               /* pinned staging bytes counted for it in cl->pull_pinned */
  uint64_t host_owed;            /* bytes of its new host segment not landed yet, counted in
                                    cl->pull_host_owed (grants.c gshmd__pull_host_room) */
  uint64_t listed_id, listed_gen; /* its ids there (0: not listed, or listed in flight) */
  uint64_t total, next_off, done;
  unsigned inflight;             /* chunks in any step */
  bool remote_staged, local_staged;
  uint64_t chunk_size;
  uint32_t nslots, nfree;
  uint32_t *free_slots;
  struct stage_buf *lsb;         /* local slots (local_staged) */
  struct stage_job *lsb_job;     /* ... being made: no chunk goes meanwhile, nor does p close */
  struct gshmd_segment *seg;     /* the new segment, hidden until the set is published */
  struct gshmd_alloc *mem;       /* its memory */
  void *dst;                     /* where gets land without staging */
  bool dst_mapped;               /* dst is the host backend's mapping (local_ptr) */
  bool mapped_ahead;             /* ... made at the listing (cl->pull_maps_ahead counts it) */
  struct pull_hold *hold;        /* its UCX receives' hold on dst or lsb (pull.c), or NULL */
  /* a listed device segment whose hidden segment is still to make
   * (pullset.c makes a few a loop turn ahead of the grants; its grant
   * makes it at once): what the listing said of it (its size is
   * `listed`) */
  bool create_listed, listed_device;
  char *listed_source;
  /* granted in flight (relayed): the nodes its bytes come through beyond
   * its source (Grant.upstream, checked; NULL: none), and whether that is
   * all of them (sources.c gshmd__pull_upstream_take) */
  char *upstream;
  bool upstream_known;
  /* prefault.c: its pages faulted in ahead of the lanes */
  struct gshm_list pf_node;      /* cl->prefaults, while pf_queued */
  bool pf_queued;
  unsigned pf_jobs;              /* pieces (and its pages built again) on libuv's pool: it
                                    is not closed meanwhile */
  uint64_t pf_off;               /* the next piece starts at or past it */
  uint64_t pf_ahead;             /* bytes of it past the chunks asked for (cl->pf_ahead) */
  /* its 2 MiB pages a first build left, in [unbuilt_off, unbuilt_end)
   * (equal: none), built again once its bytes are all in */
  uint64_t unbuilt_off, unbuilt_end;
};

/* One request: a segment, or every segment under a prefix. */
struct pull_set {
  struct gshm_list node;      /* cl->pulls */
  struct gshmd_cluster *cl;
  uint64_t seq;               /* order of start (relay.c's listing keys) */
  struct peer *peer;          /* the peer that lists the set: peers[0] */
  struct peer *failed_by;     /* the source whose segment's failure ended it first (or NULL:
                               * the listing's, charged to peer, or this node's own) */
  bool failed_here;           /* its first failure was this node's own: charged to no peer */
  struct peer *peers[PULL_MAX_SOURCES]; /* where its segments may come from */
  unsigned npeers;
  uint64_t open_bytes[PULL_MAX_SOURCES]; /* bytes of its segments started, not closed, per
                                 source (grants.c: the next grant goes to the fewest) */
  uint8_t down;               /* sources (bits) that could not be reached: none of its
                                 segments go to them */
  char peers_text[PULL_MAX_SOURCES * 64]; /* "a,b": the peers, as asked */
  struct gshmd_client *requester; /* NULL once gone */
  uint32_t request_id;
  struct gshmd_client *holder; /* internal client with the requester's cred */
  char name[256];             /* the segment, or the prefix */
  char local[256];            /* its local name, or the local prefix */
  char location[GSHM_LOCATION_MAX];
  uint32_t mode;
  bool prefix, replace;
  /* a single pull's key in the fd store's resend memo (pull_resend.c) */
  uint8_t memo_key[16];
  bool memo;
  /* the listing of a prefix, page by page */
  struct peer_req lreq;
  Gshm__Cluster__Msg lmsg;
  Gshm__Cluster__ListRequest lr;
  struct relay_ask lask;      /* a relaying peer's busy answers to the page asked for */
  bool listing, lreq_pending;
  int64_t list_asked_ns;      /* when that page was asked for (again, after a busy answer) */
  int64_t list_idle_ns;       /* time the pages took since one added to the set */
  unsigned list_idle_pages;   /* ... and how many */
  bool relayed;               /* the peer listed segments it is still pulling */
  unsigned to_create;         /* listed items whose hidden segments are still to make */
  size_t next_create;         /* the next of them is at or past items[next_create] */
  struct pull **items;
  size_t n, cap;
  void *names;                /* tsearch tree of the items' remote_name (gshmd__pull_set_has) */
  size_t next_start;          /* items[next_start] is the next to ask a grant for */
  size_t first_open;          /* items before it are closed */
  size_t nclosed;
  unsigned active;            /* started, not closed */
  unsigned window;            /* grants held or asked at once: GRANTS_AHEAD, less for a
                                 peer that said it is busy */
  struct pull *retry, **retry_tail; /* segments to ask again, in order */
  int64_t busy_since_ns;      /* refused busy with nothing of the set open, since (0: not) */
  int64_t retry_ns;           /* ... and asks again from then (CLOCK_MONOTONIC) */
  unsigned inflight;          /* chunks in flight, all items */
  unsigned pf_jobs;           /* prefault.c pieces on the pool, all items: it does not end meanwhile */
  uint64_t total, done;       /* bytes */
  int64_t start_ns, last_progress_ns;
  int err;
  char why[256];
};

/* Chunks a set keeps in flight: cluster.pull_depth times its number of
 * sources (those passed over included). */
static inline unsigned gshmd__pull_set_depth(const struct pull_set *s) {
  return s->cl->cfg->cluster_pull_depth * s->npeers;
}

/* Whether peer is one of s's sources. */
static inline bool gshmd__pull_set_from(const struct pull_set *s, const struct peer *peer) {
  for (unsigned k = 0; k < s->npeers; k++)
    if (s->peers[k] == peer)
      return true;
  return false;
}

/* ---- pullset.c ---- */

/* A new item of set s: remote segment `name`, `size` bytes; listed: the
 * peer's listing of it (its hidden segment made now or a few a loop
 * turn from now), else NULL (a single pull: made at its grant).
 * Returns 0 or a negative errno (the set failed: -E2BIG over
 * PULL_SET_MAX, -ENOMEM, -EEXIST a local name taken without replace,
 * -EINVAL/-ENAMETOOLONG a local name that is not one). */
int gshmd__pull_set_add(struct pull_set *s, const char *name, uint64_t size,
                        const Gshm__Cluster__Segment *listed);
/* Whether set s has an item of that peer name already (a peer that
 * lists segments in flight lists one again once it published it). */
bool gshmd__pull_set_has(const struct pull_set *s, const char *name);

/* ---- pull_list.c ---- */

/* Asks set s's lister (s->peer) for its next page of exported segments,
 * after cursor `after` (0: the first); the answer adds those under the
 * prefix to s and asks for the next page, until the last (s->listing
 * false then), or fails s (a page it refuses, a cursor that does not
 * advance, a listing that adds nothing for too long, nothing exported
 * under the prefix: -ENOENT). */
void gshmd__pull_list_next(struct pull_set *s, uint64_t after);

/* ---- pull_resend.c ---- */

/* The resend memo's key (16 bytes into key) of pull m: a hash of its
 * token and every field (prefix included: a set's key is never a single
 * pull's), so that only the same request sent again matches.  false (key
 * untouched): no token of GSHM_PULL_TOKEN_BYTES. */
bool gshmd__pull_memo_key(const Gshm__PullRequest *m, uint8_t *key);
/* Whether m is c's pull sent again after a restart whose first one
 * published its segment (the memo's, still published as `local`, or for
 * a set of one segment under the local prefix `local`, of c's uid): it is
 * then answered with that segment now (a set: its pull_items page of
 * one; then a PullResult whose path is "" and elapsed_ns 0: not kept),
 * nothing is pulled, and 1 is returned.  0: pull as usual (the first did not publish, or its
 * segment is no longer as published).  -EINVAL (*msg_out set): a token
 * of another length than GSHM_PULL_TOKEN_BYTES. */
int gshmd__pull_resent(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                       const Gshm__PullRequest *m, const char *local, const char **msg_out);
/* Arms (arm) the memo for s's publish, under s's key when it has one and
 * s is a single pull or a set of one segment, or disarms it
 * (gshmd_fdstore_memo_on_publish). */
void gshmd__pull_memo_arm(struct pull_set *s, bool arm);

/* ---- pull.c ---- */

/* Busy answers a chunk's read may get from a peer that does not relay it
 * (its link's read cap, serve.c over_caps: it counts a read till its send
 * completes, which it may hear of after the puller's next read, on slow
 * CPUs) before the pull fails: each is asked again at once. */
#define PULL_BUSY_RETRIES 64

/* The set fails (first error wins): what is not sent yet is withdrawn.
 * err: a negative errno for the requester; fmt: why, for it and the log.
 * The metrics charge it to a peer: the failing segment's source
 * (pull_fail), else the lister (s->peer). */
void gshmd__pull_set_fail(struct pull_set *s, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same for a failure of this node's own (its memory, names, quota,
 * backends, the requester gone, gshmd stopping): charged to no peer
 * (s->failed_here), counted by cause only. */
void gshmd__pull_set_fail_here(struct pull_set *s, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failure of one segment fails its set; the metrics charge it to that
 * segment's source (s->failed_by). */
#define pull_fail(pull_, errno_, ...)                                                              \
  do {                                                                                             \
    if (!(pull_)->s->err && !(pull_)->s->failed_by)                                                \
      (pull_)->s->failed_by = (pull_)->peer;                                                       \
    gshmd__pull_set_fail((pull_)->s, errno_, __VA_ARGS__);                                         \
  } while (0)
/* A segment's failure of this node's own (gshmd__pull_set_fail_here). */
#define pull_fail_here(pull_, errno_, ...) gshmd__pull_set_fail_here((pull_)->s, errno_, __VA_ARGS__)
/* Chunks for the open segments, oldest first, while the budget lasts. */
void gshmd__pull_set_issue(struct pull_set *s);
/* A progress reply at most every 200 ms: the first with the first chunk
 * in, none once every byte is in (the answer follows). */
#define PROGRESS_NS 200000000LL
/* A progress reply to the requester (at most every PROGRESS_NS). */
void gshmd__pull_send_progress(struct pull_set *s);
/* The peer's answer to p's grant request (p->req.done). */
void gshmd__pull_grant_done(struct peer_req *req, int err, const char *why,
                            const Gshm__Cluster__Msg *m);
/* A Release of p's grant to its peer, where p holds one and its link is
 * up (the peer forgets a lost link's grants itself). */
void gshmd__pull_release_send(const struct pull *p);
/* p has nothing in flight: its grant is owed back (p->release_owed:
 * gshmd__pull_release_owed sends it), its slots go, and its mapping
 * unless made at the listing (its hidden segment stays with the set). */
void gshmd__pull_item_close(struct pull *p);
/* p's Release, when its close owes one (once). */
void gshmd__pull_release_owed(struct pull *p);
/* The index of s's first item at or past i that is not closed, or
 * s->next_start when every one before it is: a walk over s's open items
 * from i (a set's first item held open leaves up to PULL_SET_MAX - 1
 * closed ones after it, which each pass of the reap walked).  The closed
 * items it passes point past the others (skip_to), so that later calls
 * jump them in one step. */
size_t gshmd__pull_set_open(struct pull_set *s, size_t i);
/* p's own reference to its hold (p->hold) goes, at its set's end: what
 * UCX receives still write into (p's mapping or slots, handed over when
 * p closed) goes with the last of them. */
void gshmd__pull_hold_drop(struct pull *p);
/* The answer of published set s to its requester (pull_resend.c): the
 * pull_items pages of a set (prefix), then the result; ns: the pull's
 * time.  The requester must be set; each segment still s's items'. */
void gshmd__pull_reply_result(struct pull_set *s, int64_t ns);
/* The set's landing mappings go (each segment's backend keeps or
 * unmaps its own: backend.h local_done), before it is published or
 * freed. */
void gshmd__pull_set_unmap(struct pull_set *s);
/* Creates p's hidden local segment of size bytes (on a GPU when the
 * peer's is: remote_device; source: pull.c's source text of the peer
 * segment), and relays it to peers while it fills (relay.h): from its
 * listing (gshmd__pull_item_create_listed), or at its grant.  Returns 0
 * or a negative errno (the set failed). */
int gshmd__pull_item_create(struct pull *p, uint64_t size, bool remote_device, const char *source);
/* The same from what p's listing said (p->create_listed; cleared). */
int gshmd__pull_item_create_listed(struct pull *p);
/* Where a copy of peer segment s comes from, into src (len bytes):
 * "NODE:NAME#ID.GEN" of the node that holds the original. */
void gshmd__pull_source_text(const struct pull *p, const Gshm__Cluster__Segment *s, char *src,
                             size_t len);
/* Whether p's local segment goes to a GPU, for a peer segment on a GPU
 * (remote_device) or not: the location asked for, else the peer's kind
 * (sets p->location, as gshmd__pull_item_create does). */
bool gshmd__pull_lands_on_device(struct pull *p, bool remote_device);
/* Whether segment location text `loc` (a peer's) is a GPU's. */
static inline bool gshmd__pull_location_device(const char *loc) {
  return loc && strcmp(loc, "host") != 0;
}
/* ---- pull_slots.c ---- */

/* Decides where p's bytes go on each side (granted g) and says why
 * (p->path, p->path_reason).  Returns 0 or a negative errno (the pull
 * failed). */
int gshmd__pull_choose_path(struct pull *p, const Gshm__Cluster__Grant *g);
/* p's chunk size and staging slots: the peer's (checked), and into a
 * GPU its own (counted in cl->pull_pinned), taken from the kept ones or
 * made on libuv's pool (p->lsb_job until then: its chunks wait).
 * Returns 0 or a negative errno (the pull failed). */
int gshmd__pull_setup_slots(struct pull *p, const Gshm__Cluster__Grant *g);

/* ---- prefault.c ---- */

/* p's landing mapping (host memory, mapped: p->dst, p->mem) is faulted
 * in on libuv's pool past the chunks asked for so far, after the pulls
 * already queued (prefault.c: a few pieces at once, at most
 * PREFAULT_AHEAD bytes past the chunks asked for, all pulls).  Called
 * again each time p's chunks are asked for (the pieces the cap held back
 * go on).  Nothing more when prefaulting is off (cluster.prefault,
 * cl->pf_on), p is staged or smaller than 2 MiB.  Loop only. */
void gshmd__prefault_add(struct pull *p);
/* Starts queued pulls' next pieces while the pool has room for them. */
void gshmd__prefault_more(struct gshmd_cluster *cl);
/* p leaves the queue (before it is freed; its pieces on the pool are
 * waited for by pf_jobs, not by this). */
void gshmd__prefault_forget(struct pull *p);
/* Every byte of p landed: with daemon.host_populate, the pages of its
 * host segment past them (its allocation's rounding) are allocated now
 * (MADV_POPULATE_WRITE), as a create's are, so that a client's write
 * there cannot take SIGBUS (alloc_pull populates nothing: a set's
 * segments are made at its listing, before the peer sent a byte); and
 * its 2 MiB pages that a first build left (gshmd__prefault_unbuilt) are
 * built on libuv's pool (p->pf_jobs: p is not closed, nor its set
 * published, before).  Returns 0, or -ENOMEM (p's set failed). */
int gshmd__prefault_all_in(struct pull *p);
/* A build of the 2 MiB pages of p that [off, off + len) touches failed
 * (where gshmd builds them: cl->pf_build; a lane's, peer_req.build_left,
 * or a piece's): they are built once p's bytes are all in
 * (gshmd__prefault_all_in).  Loop only. */
void gshmd__prefault_unbuilt(struct pull *p, uint64_t off, uint64_t len);

/* "host", "direct", "staged" or "none". */
const char *gshmd__pull_path_name(Gshm__Cluster__Path path);
/* Largest segment a peer may list or grant when limits.max_segment_size
 * is 0: more than any node holds, and 4096 of them sum without overflow. */
#define PULL_SIZE_MAX (1ull << 48)
/* What is wrong with a segment as a peer describes it (in a list or a
 * grant): a name gshm would refuse (empty, "..", a leading "/", control
 * bytes, over 255 bytes), a size of 0 or beyond this node's limits, a
 * location that is not one; NULL when nothing is. */
const char *gshmd__pull_segment_bad(const struct gshmd_cluster *cl,
                                    const Gshm__Cluster__Segment *seg);

/* ---- grants.c ---- */

/* Asks grants for s's next segments (those a busy peer refused first)
 * while fewer than s->window are open and the node's pulls into GPUs
 * hold less than PULL_PINNED_FULL staging_bytes of pinned slots with
 * the next one's (one always goes; set_reap asks again after each
 * close).  Run outside UCX callbacks.  grants.c. */
void gshmd__pull_set_start_grants(struct pull_set *s);
/* The peer refused p's grant as busy while other segments of the set
 * hold grants: p is asked again later.  False when nothing else is open. */
bool gshmd__pull_grant_later(struct pull *p);
/* p's source, not the set's lister, did not grant it (answered: it
 * refused, busy, not there, or granted what is not a copy of what the
 * lister listed; else no answer came: the link lost, unreachable, its
 * hello refused; why: in words, naming it): p goes back to the set's
 * queue for a source it has not tried (the lister is never passed over:
 * its failure fails the set), and a source that gave no answer is asked
 * for none of the set's segments from then.  Logged; counted in
 * peer->passed_over. */
void gshmd__pull_grant_elsewhere(struct pull *p, bool answered, const char *why);
/* ---- sources.c ---- */

/* The peers of pull m ("a" or, for a set, "a,b,c": at most
 * PULL_MAX_SOURCES, each once) into out[*n_out].  Returns 0, or -EINVAL
 * (a list for a single pull, too many, an empty or repeated name) or
 * -ENOENT (one is not in cluster.peers) with *msg_out set (static, or
 * cl->reply_msg until the reply is sent). */
int gshmd__pull_sources_parse(struct gshmd_cluster *cl, const Gshm__PullRequest *m,
                              struct peer **out, unsigned *n_out, const char **msg_out);
/* The index in s->peers of the source p's grant asks: of those p has not
 * tried, that can be reached and hold fewer than LINK_MAX_GRANTS of this
 * node's grants, the one with the fewest of s's bytes open (the first of
 * equals: the lister); -1 when none may be asked now. */
int gshmd__pull_source_pick(const struct pull_set *s, const struct pull *p);
/* Whether what p's source granted (s) is what p's listing listed (pull.c
 * grant_done; true for a single pull, never listed). */
bool gshmd__pull_grant_is_listed(const struct pull *p, const Gshm__Cluster__Segment *s);
/* The path of the bytes p's source granted (g, a Grant from the wire):
 * with g->segment->in_flight, g->upstream (relay_path.h: "n1,n0",
 * nearest first, a last "?" where the source does not know the rest)
 * into p->upstream (owned by p, NULL when empty) and
 * p->upstream_known; not in flight, none (the bytes are all at the
 * source), known.  An in-flight grant from a peer that sends no path
 * counts as unknown.  Returns true, or false when it failed p's set:
 * -EPROTO (a path gshmd__relay_path_ok refuses; a path on a segment not
 * in flight) or -ENOMEM, with a message that names the peer. */
bool gshmd__pull_upstream_take(struct pull *p, const Gshm__Cluster__Grant *g);
/* p's grant goes back at once, before anything was read, and p is as
 * before its grant (gshmd__pull_grant_elsewhere asks another source). */
void gshmd__pull_grant_return(struct pull *p);
/* What p's source granted is not what the lister listed: the set fails
 * -ESTALE where the lister granted it; another source's grant goes back
 * and p is asked of the others (logged). */
void gshmd__pull_grant_not_listed(struct pull *p);
/* s's sources: peers[0..n) (n >= 1; the first lists the set), and their
 * names as asked ("a,b") in s->peers_text. */
void gshmd__pull_set_sources(struct pull_set *s, struct peer *const *peers, unsigned n);
/* p's grant, asked or held, is over (gshmd__pull_grant_off) and its pins
 * go; p waits unstarted at the end of its set's queue (s->retry), asked
 * again by gshmd__pull_set_start_grants (grant_later, grant_elsewhere). */
void gshmd__pull_requeue(struct pull *p);
/* p's grant, asked or held, is over: off its set's active count, its
 * source's open bytes and that peer's grants_out. */
void gshmd__pull_grant_off(struct pull *p);
/* The pinned staging bytes p's grant will hold here: 0 unless it lands
 * on a GPU (its listing says so, or its location names one); a segment
 * not listed counts cluster.staging_bytes. */
uint64_t gshmd__pull_pin_need(struct pull *p);
/* Room for p's new host segment of size bytes: every byte of it will be
 * written, so the node's memory must take it with what the pulls in
 * flight still owe (cl->pull_host_owed).  The bound is the host
 * backend's room (gshmd_backend_host_room: MemAvailable + SwapFree, or
 * what gshmd's memory cgroup or an ancestor leaves where less, v2 or v1,
 * read at most every 100 ms) plus what daemon.host_recycle keeps (pulls
 * land in it); none where nothing can be read or cluster.memory_check is
 * off.  On room, counts size as owed by p
 * and returns 0; else fails p's set (-ENOMEM, saying how much is
 * missing) and returns -ENOMEM.  A hostile peer's listing of thousands
 * of huge segments fails here before any is made. */
int gshmd__pull_host_room(struct pull *p, uint64_t size);
/* n more bytes of p landed, or (n = UINT64_MAX) p closed: what it owes
 * goes down by as much. */
void gshmd__pull_host_paid(struct pull *p, uint64_t n);
/* Counts bytes more for p in cl->pull_pinned (PULL_PINNED_FULL). */
void gshmd__pull_pin(struct pull *p, uint64_t bytes);
/* p's count in cl->pull_pinned ends (its grant closed, or refused). */
void gshmd__pull_unpin(struct pull *p);

#endif
