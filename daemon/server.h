/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's socket server: one libuv loop, uv_poll_t watchers on
 * SOCK_SEQPACKET sockets, sendmsg/recvmsg for fd passing (libuv's streams
 * cannot carry arbitrary fds on SEQPACKET). */
#ifndef GSHMD_SERVER_H
#define GSHMD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "list.h"
#include "histogram.h"
#include "loglimit.h"
#include "wire.h"

struct gshmd_config;
struct gshmd_registry;
struct gshmd_client;
struct gshmd_cluster;

#define GSHMD_LIST_MAX 4096 /* items in one list reply, at most */
/* Items one list request looks at, at most (requests.c list_page): 2048
 * take about 10 us; a page with fewer items than the request's limit and a
 * cursor is not the list's end.  A peer's List too (libgshm bounds a
 * peer's listing's empty pages with it). */
#define GSHMD_LIST_VISITS GSHM_WIRE_LIST_VISITS
#define GSHMD_LEASE_DEVICES 8 /* mapped devices listed per lease */

struct gshmd_server {
  uv_loop_t *loop;
  const struct gshmd_config *cfg;
  struct gshmd_registry *reg;
  struct gshmd_cluster *cluster; /* NULL: cluster off (daemon/cluster/) */
  int listen_fd;
  uv_poll_t listen_poll;
  bool listening;
  uv_timer_t sweep_timer;   /* hello and idle timeouts */
  bool sweeping;
  /* accept at the fd limit (EMFILE, ENFILE): the listener is not polled
   * until a connection closes or accept_timer fires, so that a pending
   * connection cannot spin the loop; logged once per episode. */
  uv_timer_t accept_timer;
  bool accept_timer_on, accept_paused, accept_logged;
  uint64_t accept_pauses;   /* episodes, for metrics */
  bool fds_refused;         /* SO_PASSRIGHTS is off on the listener */
  struct gshmd_closer *closer; /* clients' fds closed off the loop (server_close.c) */
  struct gshmd_loglimit loglimit; /* log lines charged to the uid served (loglimit.c) */
  struct gshm_list conns;
  uint32_t nconns;
  bool have_admin_gid;
  gid_t admin_gid;
  int64_t started_ns;
  int64_t poll_ns;          /* cfg poll_us where >= 4 CPUs, else 0 (conn_read) */
  /* Counters for metrics: requests by type and status, a
   * (GSHM_WIRE_TYPE_MAX + 1) x nstatus table (gshmd_server_requests);
   * nstatus comes from the protocol's Status enum (its highest value + 1). */
  uint64_t *requests;
  unsigned nstatus;
  struct gshmd_histogram duration; /* request service time */
  uint64_t protocol_errors, connections_total, fds_sent, quota_denials, access_denials;
  uint64_t timeouts;
  uint64_t notify_seq;      /* marks connections already told of an event */
  /* Bump arena for unpacking one request (reset per packet): protobuf-c's
   * per-field mallocs were ~1,000 instructions a request (callgrind). */
  ProtobufCAllocator arena_allocator;
  size_t arena_used;
  uint8_t arena[4 * GSHM_WIRE_MAX_PACKET] __attribute__((aligned(16)));
  uint8_t rxbuf[GSHM_WIRE_MAX_PACKET + 1];
  uint8_t txbuf[GSHM_WIRE_MAX_PACKET];
  /* One list reply's items (requests.c's pager), valid until it is sent:
   * one kind of list at a time. */
  union {
    Gshm__SegmentInfo segments[GSHMD_LIST_MAX];
    Gshm__ClientInfo clients[GSHMD_LIST_MAX];
    struct {
      Gshm__LeaseInfo info[GSHMD_LIST_MAX];
      char *devs[GSHMD_LIST_MAX][GSHMD_LEASE_DEVICES];
      char devbuf[GSHMD_LIST_MAX][GSHMD_LEASE_DEVICES][48];
    } leases;
  } list_items;
  union {
    Gshm__SegmentInfo *segments[GSHMD_LIST_MAX];
    Gshm__LeaseInfo *leases[GSHMD_LIST_MAX];
    Gshm__ClientInfo *clients[GSHMD_LIST_MAX];
  } list_ptrs;
};

/* Starts serving on listen_fd (bound, listening, non-blocking or not; the
 * server takes ownership).  Returns 0; -ENOENT when daemon.admin_group
 * names no group; -ENOMEM; or a negative errno from fcntl or libuv.
 * gshmd_server_free frees what it allocated, whatever it returned. */
int gshmd_server_start(struct gshmd_server *s, uv_loop_t *loop, const struct gshmd_config *cfg,
                       struct gshmd_registry *reg, int listen_fd);

/* Sends a reply that a request handler deferred (cluster requests answer
 * later) to the connection of client c.  Returns 0, or -ENOTCONN when c
 * has no connection (internal clients) or it is closing, or -EMSGSIZE when
 * the reply does not fit one packet (what a peer said: a listing's page;
 * c is answered -EPROTO instead).  A PULL's progress report is dropped
 * (0) while c has replies unread; its pull_items pages are not counted
 * against limits.max_inflight (one answer's parts). */
int gshmd_server_reply(struct gshmd_server *s, struct gshmd_client *c, uint16_t type,
                       uint32_t request_id, const Gshm__Reply *reply);

/* Closes every connection (their leases end) and the listening watcher.
 * The handles finish closing on the next loop iteration. */
void gshmd_server_stop(struct gshmd_server *s);

/* Frees what gshmd_server_start allocated, once the loop has finished
 * closing the server's handles (after gshmd_server_stop and uv_run).
 * Accepts a server that never started. */
void gshmd_server_free(struct gshmd_server *s);

/* The counter of requests of wire type `type` answered with `status`, or
 * NULL when either is out of range. */
static inline uint64_t *gshmd_server_requests(struct gshmd_server *s, unsigned type,
                                              unsigned status) {
  if (!s->requests || type > GSHM_WIRE_TYPE_MAX || status >= s->nstatus)
    return NULL;
  return &s->requests[(size_t)type * s->nstatus + status];
}

#endif
