/* SPDX-License-Identifier: Apache-2.0 */
/* Relaying a pull in flight (fan-out): what this node serves of the
 * segments it is still pulling.  A pulled segment is hidden until its set
 * is published; meanwhile a peer may list it (ListRequest.with_in_flight),
 * take a grant on it and read the ranges whose chunks have landed here.
 * A read of a range that has not landed yet waits here (parked) and is
 * served the moment the covering chunks land, or refused when this
 * node's own pull of it fails.  pull.c tells this file that a chunk
 * landed (gshmd__relay_landed); serve.c asks it before it sends a read's
 * bytes (gshmd__relay_gate).  docs/CLUSTER.md "Moving a model to several
 * nodes". */
#ifndef GSHMD_CLUSTER_RELAY_H
#define GSHMD_CLUSTER_RELAY_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster.pb-c.h"
#include "link.h"
#include "relay_path.h"

struct pull;

struct gshmd_cluster;
struct gshmd_segment;
struct link;
struct pull_set;

/* Reads (and lists) of one link parked at once, with its reads in flight:
 * what serve.c allows a link in flight. */
#define RELAY_MAX_PARKED LINK_MAX_READS

/* A parked read waits at most half of cluster.request_timeout_ms: then it
 * is refused busy (-EBUSY) with this node's progress (Msg.progress:
 * relay_landed, the bytes its pulls in flight have landed, ever, plus
 * list_pages, the pages of peers' lists its sets took, ever), and the
 * reader asks again while that grows, within the reader's own request
 * timeout.  A reader gives up (-ETIMEDOUT) after RELAY_STALE_MAX busy
 * answers to one read in a row that show no progress.  Only a reader
 * whose hello said CAP_ASK_AGAIN is answered so; another one's reads wait
 * until the bytes land. */
#define RELAY_STALE_MAX 3

/* The least time a relay parks a read (or a List) before it answers it
 * busy with its progress: half of the least cluster.request_timeout_ms
 * that gshmd takes (1000 ms, daemon/option_table.h).  A busy answer that
 * comes sooner after its ask was not parked (an honest node's are its
 * link caps' refusals, serve.c over_caps, which say no progress): its
 * Msg.progress is not taken as progress (a key holder answering busy at
 * once with its progress one higher each time kept a read or a listing
 * asking again for ever, in a tight loop of the puller's event loop). */
#define RELAY_PARK_MIN_NS 500000000LL

/* The reader's record of one read's busy answers (in struct chunk,
 * zeroed with it). */
struct relay_ask {
  uint64_t progress;         /* the highest Msg.progress of its parked busy answers */
  unsigned busy;             /* busy answers so far */
  unsigned stale;            /* ... in a row without progress */
};

/* The reader's side: read req (a Read or Stage of a segment granted in
 * flight, relayed) was refused busy with progress (req->progress) on
 * link l: asks it again on l (its done runs again later).  A busy answer
 * shows progress only when it came RELAY_PARK_MIN_NS or more after its
 * ask (req->sent_ns) with a progress above every such answer's before
 * (one that goes back, or comes early, shows none).  Returns 0, or
 * -ETIMEDOUT with *why_out when the peer showed no progress for
 * RELAY_STALE_MAX busy answers in a row, or -ECONNRESET when l is not up
 * (req is not sent again: its caller fails it). */
int gshmd__relay_ask_again(struct link *l, struct peer_req *req, struct relay_ask *ra,
                           const char **why_out);

/* p->seg (hidden, just created for item p of set p->s, which publishes
 * it) starts with nothing landed; a grant request by its name finds it
 * (relay_names.h).  Errors: -ENOMEM (it is then not relayed). */
int gshmd__relay_new(struct gshmd_cluster *cl, const struct pull *p);
/* Bytes [off, off + len) of seg landed (verified, in its memory): the
 * parked reads they complete are served now.  No-op for a segment that
 * is not relayed. */
void gshmd__relay_landed(struct gshmd_cluster *cl, struct gshmd_segment *seg, uint64_t off,
                         uint64_t len);
/* seg's pull ended: err 0, it is published (parked reads are served);
 * else every parked read is refused with err and why, and later reads of
 * seg fail.  No-op for a segment that is not relayed. */
void gshmd__relay_end(struct gshmd_cluster *cl, struct gshmd_segment *seg, int err,
                      const char *why);
/* The segment a peer's grant request for name gets: with in_flight (the
 * peer listed it in flight: GrantRequest.in_flight), the relayed one (the
 * first of the pulls in flight that will publish it; with --replace the
 * name's published segment is the old one), else the published one;
 * without, the published one, else a relayed one.  A relayed one is
 * granted to asker (the peer asking) only where its bytes are all in,
 * or asker is none of its set's sources and: not on the path its bytes
 * come along, where that path is known (its source granted it and said
 * all of the path beyond: Grant.upstream); else where the set has one
 * source or took it from its first, which granted it (relay.c
 * relay_serves: no two nodes wait on each other's bytes); NULL when none, with *later_out true when
 * one exists that may be granted later. */
struct gshmd_segment *gshmd__relay_grant_find(struct gshmd_cluster *cl, const char *name,
                                              bool in_flight, const struct peer *asker,
                                              bool *later_out);
/* The path of seg's bytes for a Grant of it (Grant.upstream, relay_path.h)
 * into buf (len bytes, at least RELAY_PATH_LEN): "" where seg is not
 * relayed; its source alone where its bytes are all here (a known path:
 * no cycle can go through a segment that waits on nothing); else its source, then the path
 * beyond that its own grant said ("n1,n0"), with a last "?" where that
 * is not known (not said, longer than RELAY_PATH_MAX, or not granted
 * yet: but a set of one source whose lister listed the segment
 * published has that source alone).  Returns buf. */
const char *gshmd__relay_upstream(const struct gshmd_segment *seg, char *buf, size_t len);
/* Before a Read (rd) or Stage (st) of seg by link l, request rid, sends
 * bytes: 0 go on (not relayed, or the range has landed); 1 parked (the
 * request is served again through gshmd__serve_handle when it has
 * landed); or a negative errno with *why_out: -ECONNRESET this node's
 * pull of seg failed, -EBUSY too many parked on l, -ENOMEM. */
int gshmd__relay_gate(struct gshmd_cluster *cl, struct link *l, struct gshmd_segment *seg,
                      uint32_t rid, const Gshm__Cluster__Read *rd,
                      const Gshm__Cluster__Stage *st, const char **why_out);
/* A List asking for segments in flight waits while a set of this node is
 * still listing its own peer (other than l's): true when it was parked
 * (answered through gshmd__serve_handle later; for a reader whose hello
 * has CAP_ASK_AGAIN_LIST, refused busy with this node's progress after
 * half the request timeout, as a parked read is: a peer that lists
 * slowly, page by page within the timeout, kept it waiting longer than
 * the reader's request timeout, which failed the reader's link). */
bool gshmd__relay_list_wait(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                            const Gshm__Cluster__ListRequest *req);
/* Calls fn for each relayed segment that peers may list (its name not
 * held by a live segment, unless its set replaces that one: the
 * published segment that follows in the listing is the old one, which
 * the puller skips; fn checks the export rules; two sets in flight
 * here may list one name twice: the puller keeps the first), with a listing key
 * above after, in key order, while fn returns true, looking at no more
 * than visits segments in flight past after (those fn skips, not
 * exported, included).  Returns 0, or the key of the last one looked at
 * when visits ran out first: the cursor of a page that is not the
 * listing's end (each List cost the loop every segment in flight
 * before, 4096 a set).  Keys are below RELAY_KEY_END. */
#define RELAY_KEY_END (1ull << 62)
uint64_t gshmd__relay_foreach(struct gshmd_cluster *cl, uint64_t after, unsigned visits,
                              bool (*fn)(void *arg, struct gshmd_segment *seg, uint64_t key),
                              void *arg);
/* Answers the parked Lists whose wait is over, and refuses busy the
 * parked reads that waited half of cluster.request_timeout_ms (after
 * each loop batch). */
void gshmd__relay_poll(struct gshmd_cluster *cl);
/* Link l is gone: what it parked is dropped unanswered (its own waits,
 * l->parked_waits: whatever else is relayed or parked is not looked at). */
void gshmd__relay_link_gone(struct gshmd_cluster *cl, struct link *l);

#endif
