/* SPDX-License-Identifier: Apache-2.0 */
/* A rogue cluster peer for the tests: it holds the cluster key and does
 * the hello as proto/cluster.proto says (libsodium, as gshmd does), on
 * gshmd's own framed stream (daemon/cluster/stream.c), and then sends and
 * answers whatever a test wants, as fast as it likes.  Either side: it
 * connects to a gshmd's cluster port as a puller (rogue_connect), or it
 * is the serving node a gshmd connects to (rogue_accept).  Everything
 * runs on the calling thread: the rogue's libuv loop turns only inside
 * rogue_run and rogue_recv. */
#ifndef GSHM_TEST_CLUSTER_ROGUE_H
#define GSHM_TEST_CLUSTER_ROGUE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "cluster.pb-c.h"
#include "stream.h"

#define ROGUE_QUEUE 4096 /* control messages kept for rogue_recv */

struct rogue {
  uv_loop_t loop;
  uv_timer_t tick;               /* wakes the loop: rogue_run never blocks long */
  struct stream st;
  bool accepted;                 /* the rogue is the serving side */
  int hello;                     /* hello step (rogue.c) */
  char name[64], peer[64];
  uint8_t key[32];
  uint8_t nonce_mine[32], nonce_theirs[32];
  uint32_t caps_theirs;
  char refusal[256];             /* the peer's refusal during the hello */
  bool up, failed, closed;
  /* control messages after the hello: kept for rogue_recv, or given to
   * on_msg when set (then freed by the rogue) */
  void (*on_msg)(struct rogue *r, const Gshm__Cluster__Msg *m);
  void *arg;
  Gshm__Cluster__Msg *q[ROGUE_QUEUE];
  unsigned qhead, qn;
  uint64_t dropped;              /* messages that did not fit the queue */
  /* data frames: landed in sink (overwritten, len bytes at most) */
  uint8_t *sink;
  uint64_t sink_len;
  uint64_t data_frames, data_bytes, data_bad;
};

/* Reads the key file at path as gshmd does (crypto_generichash of its
 * bytes) into key. */
void rogue_key(const char *path, uint8_t key[32]);
/* Connects to 127.0.0.1:port as peer `name` and does the hello against
 * node `peer` with key.  Returns 0 with the link up, or -1 (r->refusal
 * says why when the node refused).  Call rogue_close in either case. */
int rogue_connect(struct rogue *r, int port, const char *name, const char *peer,
                  const uint8_t key[32]);
/* Accepts one connection on the listening socket lfd (within 10 s) and
 * answers its hello as serving node `name` with key.  Returns 0 with the
 * link up, or -1. */
int rogue_accept(struct rogue *r, int lfd, const char *name, const uint8_t key[32]);
/* Sends one control message (after the hello: authenticated). */
void rogue_send(struct rogue *r, const Gshm__Cluster__Msg *m);
/* Sends len bytes as one control frame's payload (a packed Msg that a
 * test may have altered). */
void rogue_send_packed(struct rogue *r, const uint8_t *buf, size_t len);
/* Runs the loop for ms milliseconds, or until the link fails. */
void rogue_run(struct rogue *r, int ms);
/* Runs the loop until until(r) holds or ms pass; returns until(r). */
bool rogue_run_until(struct rogue *r, bool (*until)(struct rogue *r), int ms);
/* The next control message within ms (the caller frees it with
 * gshm__cluster__msg__free_unpacked), or NULL. */
Gshm__Cluster__Msg *rogue_recv(struct rogue *r, int ms);
/* Stops or resumes reading from the peer (its sends then back up). */
void rogue_reading(struct rogue *r, bool on);
/* Bytes the rogue queued and the kernel did not take yet. */
size_t rogue_unsent(struct rogue *r);
/* Closes the connection and frees the rogue's loop. */
void rogue_close(struct rogue *r);

#endif
