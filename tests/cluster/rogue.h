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
#define ROGUE_LANE_TOKEN 16 /* bytes of a link's lane token (daemon/cluster/link.h) */

struct rogue {
  uv_loop_t loop;
  uv_timer_t tick;               /* wakes the loop: rogue_run never blocks long */
  struct stream st;
  bool accepted;                 /* the rogue is the serving side */
  int hello;                     /* hello step (rogue.c) */
  char name[64], peer[64];
  uint8_t key[32];
  uint8_t nonce_mine[32], nonce_theirs[32];
  uint32_t caps;                 /* the capabilities it claims (set before the hello; 0:
                                    none; CAP_LANES: the node opens data lanes to it;
                                    CAP_SUBKEYS: the subkeys of protocol 2.6, below) */
  uint32_t minor;                /* the protocol's minor its hello or challenge announces
                                    (2.minor; 0 unless set) */
  uint32_t caps_theirs;
  /* Under CAP_SUBKEYS (both sides': then the hello's MACs are keyed with
   * the cluster key's hello subkey and the link's keys come from its
   * session subkey, daemon/cluster/subkeys.h) a rogue that keys the one
   * or the other with the cluster key itself, as before 2.6: a node must
   * refuse it.  With raw_hello the rogue does not stop at the node's
   * Challenge when its MAC differs from the rogue's (challenge_bad), and
   * sends its Auth anyway. */
  bool raw_hello, raw_session;
  bool challenge_bad;
  bool is_lane;                  /* a data lane in its hello (rogue_accept_lane) */
  uint8_t lane_token[ROGUE_LANE_TOKEN]; /* a link: what its lanes name it by (from the
                                           session key); a lane: its link's */
  char refusal[256];             /* the peer's refusal during the hello */
  bool up, failed, closed;
  /* control messages after the hello: kept for rogue_recv, or given to
   * on_msg when set (then freed by the rogue) */
  void (*on_msg)(struct rogue *r, const Gshm__Cluster__Msg *m);
  void *arg;
  Gshm__Cluster__Msg *q[ROGUE_QUEUE];
  unsigned qhead, qn;
  uint64_t dropped;              /* messages that did not fit the queue */
  /* data frames: landed in sink at their offset, where they fit (else at
   * its start; overwritten), len bytes at most */
  uint8_t *sink;
  uint64_t sink_len;
  uint64_t data_frames, data_bytes, data_bad;
  uint64_t data_zero;            /* good frames holding a 4 KiB page of zeros */
};

/* Reads the key file at path as gshmd does (crypto_generichash of its
 * bytes) into key. */
void rogue_key(const char *path, uint8_t key[32]);
/* Connects to 127.0.0.1:port as peer `name` and does the hello against
 * node `peer` with key.  Returns 0 with the link up, or -1 (r->refusal
 * says why when the node refused).  Call rogue_close in either case. */
int rogue_connect(struct rogue *r, int port, const char *name, const char *peer,
                  const uint8_t key[32]);
/* Connects lane (zeroed here) to 127.0.0.1:port as a data lane of the
 * pulling rogue link (up, rogue_connect): its own hello, naming link's
 * lane token.  Returns 0 with the lane up (the node's AuthOk came), or
 * -1.  Call rogue_close on lane in either case. */
int rogue_connect_lane(struct rogue *link, int port, struct rogue *lane);
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

/* A listening TCP socket on 127.0.0.1 (a rogue serving node's port, for
 * rogue_accept); *port_out its port.  Returns the fd, or -1. */
int rogue_listener(int *port_out);
/* Answers request rid with a grant of segment `name` (id, size bytes,
 * host memory, PATH_HOST: read with Reads), grant id 1000 + id. */
void rogue_send_grant(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                      uint64_t size);
/* The same grant of a segment in flight (Segment.in_flight: a relay's,
 * whose reads it may answer busy with its progress). */
void rogue_send_grant_in_flight(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                                uint64_t size);
/* The same grant saying the segment is at `location` ("host", "cuda:0",
 * ...), whatever the listing said. */
void rogue_send_grant_at(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                         uint64_t size, const char *location);
/* An error answer to request rid: status (a gshm.Status) and message. */
void rogue_send_status(struct rogue *r, uint32_t rid, uint32_t status, const char *message);
/* Waits up to ms for the UcxOffer of a node's link to serving rogue r
 * (r->caps had CAP_UCX) and copies its worker address into addr (cap
 * bytes; a longer one is not taken) and, token_out not NULL, its token;
 * the messages before it are dropped.  Returns the address's length, or
 * 0: none came. */
size_t rogue_ucx_offer(struct rogue *r, uint8_t *addr, size_t cap, uint64_t *token_out, int ms);
/* When m is a node's count request (a List after UINT64_MAX: what
 * gshmctl peers asks each peer), answers it (one segment) and returns
 * true; else false. */
bool rogue_answer_count(struct rogue *r, const Gshm__Cluster__Msg *m);

/* A data lane of a rogue serving link, after its hello: the connection
 * taken off libuv (gshmd__stream_detach) with its keys and frame
 * numbers, written to with blocking writes. */
struct rogue_lane {
  struct stream_state st;
  bool up;
};
/* Accepts one connection on lfd (within 10 s) and answers its hello as
 * a data lane of serving link r (r->caps has CAP_LANES; its Hello must
 * name r's lane token, as gshmd checks).  Returns 0 with ln up, or -1
 * (a connection that is not such a lane: closed). */
int rogue_accept_lane(struct rogue *r, int lfd, struct rogue_lane *ln);
/* Writes on ln the data frame of the len bytes at src answering request
 * rid at offset, tagged with the lane's key and next frame number as
 * gshmd does (gshmd__stream_seal), but only its header and the first
 * part bytes of its payload, and its tag when part == len.  Blocks until
 * the kernel took them all.  Returns 0 or a negative errno. */
int rogue_lane_send(struct rogue_lane *ln, uint32_t rid, uint64_t offset, const void *src,
                    uint64_t len, uint64_t part);
/* Takes a node's link to serving rogue r as `name` (CAP_LANES) and its n
 * lanes: accepts on lfd until a connection passes the hello (a node's
 * earlier tries that nobody took in time are in the backlog first: each
 * fails its hello), then n lanes, then runs r's loop until up(arg) holds
 * (the node counts its lanes up), within 40 s.  Returns 0, or -1 (r is
 * then closed). */
int rogue_accept_lanes(struct rogue *r, int lfd, const char *name, const uint8_t key[32],
                       struct rogue_lane *lanes, int n, bool (*up)(void *arg), void *arg);
/* Closes ln's connection (NULL or not up: nothing). */
void rogue_lane_close(struct rogue_lane *ln);

#endif
