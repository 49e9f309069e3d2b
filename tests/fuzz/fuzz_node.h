/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster node that fuzz_cluster and fuzz_ucx_data drive: gshmd's
 * registry and cluster code in the fuzzing process, on their own libuv
 * loop and thread, as node "n" listening on 127.0.0.1, exporting two
 * host segments (pub/a, 4 KiB; pub/b, 64 KiB; mode 0644), its one peer
 * "r" a rogue (tests/cluster/rogue.c) on the fuzzing thread, either side
 * of a link. */
#ifndef GSHM_FUZZ_NODE_H
#define GSHM_FUZZ_NODE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "cluster.h"
#include "config.h"
#include "leasekey.h"
#include "registry.h"
#include "rogue.h"

struct fuzz_node {
  struct gshmd_config cfg;
  uv_loop_t loop;
  struct gshmd_registry reg;
  struct gshmd_leasekey leasekey;
  struct gshmd_cluster *cl;
  struct gshmd_client *puller; /* a local client (admin) whose requests the target makes */
  uv_async_t kick;             /* runs the target's on_kick on the node's thread */
  uint8_t key[32];             /* the cluster key, as the rogue reads it */
  int port;                    /* the node's cluster port */
  int rlfd, rport;             /* where the rogue serves (peer r): its listener and port */
  atomic_bool pull_done;       /* the node's last answer to n->puller's request came (anything
                                  but a pull's progress) */
  uv_async_cb on_kick;         /* the target's, after the node took its floor */
  atomic_uint floor_want;      /* cluster.min_protocol asked for (as the caps it requires) */
  atomic_uint floor_have;      /* and the one the node's thread set (fuzz_node_min_protocol) */
};

/* What an input's flags say (fuzz_node_flags and the target). */
struct fuzz_flags {
  uint8_t mode;      /* the target's */
  uint32_t caps;     /* the rogue's (cluster.proto Cap) */
  uint32_t required; /* the node's cluster.min_protocol, as the caps it requires
                        (CAP_SUBKEYS: 2.6; 0: 2.0) */
};

/* Starts node n (zeroed) with the --set values sets[0..nsets) (static:
 * kept) after its own (cluster.listen, node_name, peers, secret_file,
 * export, daemon.backend=host, cluster.request_timeout_ms=1000): the
 * node's answers to the local client n->puller set n->pull_done (all but
 * a pull's progress); on_kick runs on the node's thread after each
 * uv_async_send(&n->kick).  The key file goes at exit.  Aborts on any
 * failure (a fuzz target's setup). */
void fuzz_node_start(struct fuzz_node *n, const char *const *sets, int nsets, uv_async_cb on_kick);
/* Reads an input's second flags byte, there when byte 0's bit 4 is set
 * (each target keeps that bit for it): its bit 0 the rogue says
 * CAP_SUBKEYS (protocol 2.6), added to f->caps; bit 1 the node has
 * cluster.min_protocol = 2.6 for this input (f->required = CAP_SUBKEYS,
 * else 0).  f->mode and the rest of f->caps are the target's to set.
 * Returns the flags' bytes (1 or 2), 0 when size is too short for them. */
size_t fuzz_node_flags(const uint8_t *data, size_t size, struct fuzz_flags *f);
/* Gives node n cluster.min_protocol for the next input: required, the
 * caps it requires (ll.caps_required), set on the node's thread through
 * n->kick before this returns.  Aborts when the loop did not take it
 * within 5 s (stopped or wedged). */
void fuzz_node_min_protocol(struct fuzz_node *n, uint32_t required);
/* On the node's thread: the local client n->puller's PULL of peer r's
 * "pub/a" into "got/a" (replacing), request_id, as requests.c hands it
 * to the cluster.  Returns gshmd_cluster_handle_pull's result (0: the
 * pull runs, and n->pull_done says when it ended). */
int fuzz_node_pull_a(struct fuzz_node *n, uint32_t request_id);
/* Connects rogue r (zeroed here) to node n as peer "r", a puller
 * claiming caps, and does the hello; required is the node's
 * cluster.min_protocol (fuzz_node_min_protocol).  Returns true with the
 * link up; false, the rogue closed, when the node refused (these caps,
 * say), once the node took an honest hello with only the caps it
 * requires (else aborts: the node's loop stopped or wedged).  Aborts too
 * where caps lack some of required and the node linked, or sent its
 * Challenge (the first MAC) before refusing. */
bool fuzz_node_connect(const struct fuzz_node *n, struct rogue *r, uint32_t caps,
                       uint32_t required);
/* Waits up to 5 s for a connection on the rogue's listener (true),
 * until n->pull_done (false), running idle (NULL: none) every ms
 * meanwhile. */
bool fuzz_node_wait_connection(struct fuzz_node *n, void (*idle)(void));
/* The serving rogue r (zeroed or closed) takes node n's link (up to 4
 * connections: a stale one of an earlier input may come first),
 * claiming caps; idle as for
 * fuzz_node_wait_connection.  Returns whether the link is up; r is to be
 * closed by the caller either way.  Aborts where caps lack some of
 * required (the node's cluster.min_protocol) and the link came up. */
bool fuzz_node_accept(struct fuzz_node *n, struct rogue *r, uint32_t caps, uint32_t required,
                      void (*idle)(void));
/* Sends len bytes at p as one control frame of rogue r; a Read, Stage or
 * Release of grant 0 names *last_grant instead.  Returns the request id
 * of a GrantRequest (its answer is due), else 0. */
uint32_t fuzz_node_send_record(struct rogue *r, const uint8_t *p, size_t len,
                               uint64_t last_grant);
/* A serving rogue's wait for the node's next request on r, 5 ms at most
 * (recv: rogue_recv, or the target's own that does more meanwhile):
 * its id goes to *rid, and a Read's or Stage's offset to *read_off.
 * Returns whether the next record is due now: a request came, or none
 * did while *rid is one (the next record answers it further: a Read's
 * further frames); false for a Release (no answer) or nothing asked. */
bool fuzz_node_next_request(struct rogue *r, Gshm__Cluster__Msg *(*recv)(struct rogue *r, int ms),
                            uint32_t *rid, uint64_t *read_off);
/* What a serving rogue's record [u8 how][u16 LE len][len bytes] of
 * kind how & 3 = 1 sends: the target's data (how, the len bytes at p,
 * answering request rid). */
struct fuzz_answer {
  struct rogue *r;
  uint32_t rid;           /* the request answered */
  uint64_t read_off;      /* a Read's or Stage's offset */
  uint64_t token;         /* the link's UCX token (fuzz_ucx_data) */
  void (*data)(const struct fuzz_answer *a, uint8_t how, const uint8_t *p, size_t len);
};
/* Sends the record at *p (*n bytes left) that answers a->rid, and steps
 * past it: how & 3 = 0 a Msg of its bytes on a->r's stream (given the
 * request's id unless how & 4; the bytes as they are where they do not
 * decode), 1 a->data, 2 the bytes raw on the connection, 3 nothing.
 * Returns false when no record is left. */
bool fuzz_node_serve_record(const struct fuzz_answer *a, const uint8_t **p, size_t *n);

#endif
