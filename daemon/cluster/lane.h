/* SPDX-License-Identifier: Apache-2.0 */
/* Data lanes: the extra TCP connections of a link that carry the bytes
 * of its Reads and Stages, each moved by a thread of its own.
 *
 * One connection and the libuv loop's one thread bound a pull to what
 * one core copies out of the kernel (and authenticates): 1.2-1.4 GB/s on
 * the lent 16-core machine where eight plain TCP streams move 13-22 GB/s
 * (docs/PERFORMANCE.md, "Pulls from a peer gshmd").  So a puller whose
 * peer takes lanes (CAP_LANES in its hello) opens cluster.streams more
 * connections to it once the link is up; each runs the whole hello of
 * its own (its own nonces, keys, bounds and timeouts, nothing trusted
 * that the link's first connection did not also have to prove) and names
 * the link it belongs to by a token both sides derived from that link's
 * session key (Hello.lane_of, under both MACs).  After its hello a lane
 * leaves libuv (gshmd__stream_detach) for a thread that blocks on it.
 * On the pulling side the thread reads a frame's header, claims its
 * request in the link's landings (link.h: the Reads and Stages the loop
 * listed as it sent them, each with where its bytes go), reads them
 * straight there and tells the loop; it asked the loop for each frame
 * before and waited for its answer.  Under AES-GMAC with ghash.h's GHASH (gshmd__frame_mac_inline)
 * the threads tag and check each frame themselves, 256 KiB at a time
 * beside the copy, while the piece is in the core's cache (the serving
 * thread just after a piece went into the socket: a piece changed in
 * between is tagged as changed and the receiver refuses the frame; the
 * pulling one just after it lands; a frame whose tag does not match ends
 * the lane with -EBADMSG): measured, that took a recycled 1 GiB pull on the lent
 * 16-core machine from 13.7 to 23.3 GB/s and gshmd's CPU from 0.97 to
 * 0.57 s/GB (docs/PERFORMANCE.md, "Lane threads tag as they copy").
 * Under the other modes the loop has each frame sealed on libuv's pool
 * before the serving thread writes them in the order of their numbers,
 * and each received frame's tag checked (its bytes decrypted) there
 * while the pulling thread reads the next frame.  Frames, keys
 * and nonces are those of stream.h, per lane and direction; control
 * messages stay on the link's first connection.
 *
 * lane.c sits above link.c: the link layer reaches it only through
 * link_hooks (on_up, on_fail, lane_overdue), which cluster.c fills, and
 * cluster.c sets up and stops the lanes' queue around the links.
 *
 * Threads never touch the link layer but its landings (under their
 * mutex): they talk to the loop through one queue of events per struct
 * links (a mutex and a uv_async_t), and the loop handles each event
 * (a frame sent, a frame received, an exit) in lane.c.  A lane
 * that fails takes its link down (its bytes are lost); a link that fails
 * stops its lanes (shutdown(2) wakes their threads). */
#ifndef GSHMD_CLUSTER_LANE_H
#define GSHMD_CLUSTER_LANE_H

#include <stdbool.h>
#include <stdint.h>

#include "link.h"

/* Sets up the event queue of ll (before any lane).  Returns 0 or a
 * negative errno from libuv. */
int gshmd__lanes_init(struct links *ll);
/* Stops every lane of ll and waits for their threads (after the links
 * failed, when gshmd stops), handles their last events, closes the queue.
 * Safe when gshmd__lanes_init did not run. */
void gshmd__lanes_stop(struct links *ll);

/* Frees the queue, after the loop closed its handle (gshmd__link_destroy). */
void gshmd__lanes_destroy(struct links *ll);

/* The puller's side: opens ll->streams lanes to l's peer (l: an
 * outbound link that just came up, without UCX, whose peer takes lanes).
 * Two are in their hello at a time (the serving side takes at most
 * LINK_MAX_PENDING_ADDR connections in their hello from one address);
 * each lane that attaches or fails opens the next.  After two lanes of
 * l failed in their hello no more are tried.  The link carries the bytes
 * on its own stream meanwhile. */
void gshmd__lanes_open(struct link *l);
/* After lane's hello (hello.c): attaches lane to parent (the link its
 * Hello.lane_of named) and hands its connection to a thread: a sender
 * on the serving (inbound) side, a receiver on the pulling side.
 * Returns 0, -EMLINK when parent has LINK_MAX_LANES lanes, -ENOMEM, -EAGAIN
 * (no thread), or gshmd__stream_detach's errors; on error lane is
 * untouched (the caller fails it). */
int gshmd__lane_attach(struct link *lane, struct link *parent);
/* Stops lane's thread (if it runs): its connection is shut down; queued
 * sends end with -ECONNRESET; the lane link is freed after the thread
 * has gone.  Called by gshmd__link_fail. */
void gshmd__lane_stop(struct link *lane);
/* Detaches every lane of parent, which fails: each is failed too. */
void gshmd__lanes_fail(struct link *parent);
/* link_hooks.on_fail: l fails (was: its state before): a lane stops (and
 * its link fails with it, unless that is why; an outbound one that never
 * came up makes room for the next), a link's lanes fail. */
void gshmd__lanes_link_failed(struct link *l, enum link_state was);

/* Queues one data frame of [src, src + len) answering request rid at
 * offset on the lane of parent with the fewest bytes queued (of those,
 * the one given the fewest bytes since it came up); src must
 * stay valid until done(arg, err) runs (on the loop, once).  Returns 0,
 * -ENOTCONN when parent has no lane up (use its stream), -EINVAL for a
 * len of 0 or over 4 GiB - 1, -ENOMEM. */
int gshmd__lane_send(struct link *parent, uint32_t rid, uint64_t offset, const void *src,
                     uint64_t len, void (*done)(void *arg, int err), void *arg);
/* Why lane is overdue at now (CLOCK_MONOTONIC ns), or NULL: a serving
 * lane that has had bytes queued without progress for longer than
 * cluster.request_timeout_ms (the peer stopped reading), or a pulling lane amid a
 * frame whose connection received nothing for that long (the peer
 * stopped sending midway: its request, claimed by the lane, would wait
 * forever while the peer keeps the link's control connection busy).
 * The link_hooks lane_overdue; the sweep fails the lane's link. */
const char *gshmd__lane_overdue(const struct link *lane, int64_t now);

#endif
