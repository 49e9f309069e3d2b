/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: a cluster peer's messages, through gshmd's real
 * cluster code (daemon/cluster: link, hello, serve, serve_list, relay,
 * stage, lanes), as any host that reaches the cluster port (before the
 * hello) or a peer that holds the key (after it) sends them.  The node
 * "n" runs in this process on its own libuv loop and thread, listening
 * on 127.0.0.1 with cluster.transport = tcp, exporting two host
 * segments (pub/a, 4 KiB; pub/b, 64 KiB, mode 0644); its one peer "r"
 * is the rogue of tests/cluster/rogue.c, on this thread, either side of
 * a link.
 *
 * Input: byte 0 flags; flags & 3 the mode, (flags >> 2) the rogue's
 * capabilities (cluster.proto Cap: CAP_ENCRYPT 1, CAP_AES 2, CAP_LANES 8,
 * CAP_GMAC 16, CAP_ASK_AGAIN 32).  Its bit 4 (CAP_UCX, which the rogue
 * never says: no UCX) says that byte 1 is a second flags byte, and the
 * rest (below) starts after it: bit 0 the rogue says CAP_SUBKEYS (the
 * subkeys of protocol 2.6), bit 1 the node has cluster.min_protocol = 2.6
 * for this input (else 2.0).  A rogue without CAP_SUBKEYS must then be
 * refused before any MAC: checked (mode 1: no Challenge came; 2 and 3:
 * the node's link to it never came up).
 *   0: before the hello: the rest is written to a plain TCP connection to
 *      the port, as is.
 *   1: the rogue connects as peer "r" (a puller) with the key and does
 *      the hello (and, with CAP_LANES, opens a data lane of its link,
 *      on which the node then sends what it serves), then sends each record [u16 LE len][len bytes] as one control
 * frame's payload (a Msg: List, GrantRequest, Read, Stage, Release, or
 * anything), reading what the node answers for a few ms after each.  A
 * record that decodes as a Read, Stage or Release of grant 0 names the
 * last grant the node gave instead (grant ids are the node's lease ids,
 * which grow from input to input: no input could name one otherwise).
 *   2, 3: the node pulls from the rogue (the serving side): a local
 *      client's PULL of "pub/a" into "got/a" (mode 2), or (mode 3) the
 *      local request of the first record [u8 kind][u16 LE len][body]:
 *      kind % 3 = 0 a PullRequest (a set's is listed first), 1 a
 *      RemoteListRequest, 2 a PeersRequest, as a local client may send
 *      them (gshmd_cluster_handle_*), made on the node's thread; the
 *      rogue accepts the node's link (if the request asks for one) and
 *      answers each
 *      request the node sends (List, GrantRequest, Read, Stage, Release)
 *      with the next record [u8 how][u16 LE len][len bytes]: how & 3 = 0
 *      a Msg (given the request's id unless how & 4), 1 a data frame of
 *      the bytes at the Read's offset (plus len when how & 4) for the
 *      request, 2 the bytes raw on the wire, 3 no answer.  Records left
 *      after 5 ms with no request go out for the last one (a Read's
 *      several frames).  Then the rogue closes the link and the pull must
 *      end (answered) within 5 s.
 *
 * Checked: no crash, leak or undefined behaviour in the node, the node
 * still completes a hello after every input (its loop did not stop or
 * wedge), every pull ends, and under cluster.min_protocol = 2.6 no peer
 * without CAP_SUBKEYS gets a Challenge or a link. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "cluster.h"
#include "fuzz_node.h"
#include "rogue.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct fuzz_node fz; /* the node */
static struct rogue rogue; /* (large: its queue) */
static struct rogue_lane lanes[2]; /* the node's data lanes to the serving rogue */
static struct rogue plane;         /* the pulling rogue's data lane (mode 1) */
static atomic_int pull_mode; /* 0 none; 2 "pub/a"; 3 the request in req */
static uint8_t req[GSHM_WIRE_MAX_PACKET]; /* mode 3: the local request's body */
static size_t req_len;
static uint8_t req_kind;
static uint32_t pull_rid;

/* Mode 3's local request (req, req_kind) as gshmd's requests.c would
 * hand it to the cluster; false when it was answered at once. */
static bool local_request(void) {
  const char *msg = NULL;
  bool deferred = false;
  int e = -EINVAL;

  switch (req_kind % 3) {
  case 0: {
    Gshm__PullRequest *m = gshm__pull_request__unpack(NULL, req_len, req);
    if (m)
      e = gshmd_cluster_handle_pull(fz.cl, fz.puller, ++pull_rid, m, &msg);
    gshm__pull_request__free_unpacked(m, NULL);
    return e == 0;
  }
  case 1: {
    Gshm__RemoteListRequest *m = gshm__remote_list_request__unpack(NULL, req_len, req);
    if (m)
      e = gshmd_cluster_handle_remote_list(fz.cl, fz.puller, ++pull_rid, m, &msg);
    gshm__remote_list_request__free_unpacked(m, NULL);
    return e == 0;
  }
  default: {
    Gshm__PeersRequest *m = gshm__peers_request__unpack(NULL, req_len, req);
    Gshm__Reply reply = GSHM__REPLY__INIT;
    if (m)
      e = gshmd_cluster_handle_peers(fz.cl, fz.puller, ++pull_rid, m->after, &reply, &deferred);
    gshm__peers_request__free_unpacked(m, NULL);
    return e == 0 && deferred;
  }
  }
}

/* On the node's thread: starts the pull (or mode 3's request) asked for. */
static void on_kick(uv_async_t *a) {
  int mode = atomic_exchange(&pull_mode, 0);

  (void)a;
  if (mode == 3) {
    if (!local_request())
      atomic_store(&fz.pull_done, true);
    return;
  }
  if (!mode)
    return;
  if (fuzz_node_pull_a(&fz, ++pull_rid))
    atomic_store(&fz.pull_done, true);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  static const char *const sets[] = {"cluster.transport=tcp", "cluster.streams=2"};

  (void)argc;
  (void)argv;
  fuzz_node_start(&fz, sets, 2, on_kick);
  return 0;
}

/* Before the hello: bytes as is; waits (at most 20 ms) for the node to
 * close the connection or say something. */
static void raw(const uint8_t *p, size_t n) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fz.port)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct pollfd pf = {.fd = fd, .events = POLLIN};

  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    abort();
  if (n && write(fd, p, n) < 0) {
    close(fd);
    return;
  }
  (void)poll(&pf, 1, 20);
  close(fd);
}

/* UCX's own allocations at exit are not the node's. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libucs.so\nleak:libucp.so\n"; }

static uint64_t last_grant;

/* Reads what the node answers until it is quiet for ms (and what it
 * sent on the pulling rogue's lane, when it has one). */
static void drain(struct rogue *r, int ms) {
  Gshm__Cluster__Msg *m;
  if (plane.up)
    rogue_run(&plane, 1);
  while (!r->failed && !r->closed && (m = rogue_recv(r, ms))) {
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT && m->grant)
      last_grant = m->grant->grant_id;
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
}

/* A data frame of a serving record (fuzz_node_serve_record, see the
 * top): on a lane of the node's, else on the link's own stream. */
static void answer_data(const struct fuzz_answer *a, uint8_t how, const uint8_t *p, size_t len) {
  uint64_t off = a->read_off + ((how & 4) ? len : 0);
  struct rogue_lane *ln = &lanes[(how >> 3) & 1];

  if (len && ln->up)
    (void)rogue_lane_send(ln, a->rid, off, p, len, (how & 32) ? len / 2 : len);
  else if (len)
    gshmd__stream_send_data(&a->r->st, a->rid, off, p, len, NULL, NULL);
}

/* Modes 2 and 3: the node pulls from the rogue (see the top). */
static void serve(const struct fuzz_flags *f, const uint8_t *p, size_t n) {
  struct rogue *r = &rogue;
  uint32_t rid = 0;
  uint64_t read_off = 0;

  if (f->mode == 3) { /* the local request: the first record */
    if (n < 3)
      return;
    req_kind = p[0];
    req_len = (size_t)p[1] | (size_t)p[2] << 8;
    if (req_len > n - 3)
      req_len = n - 3;
    memcpy(req, p + 3, req_len);
    p += 3 + req_len;
    n -= 3 + req_len;
  }
  atomic_store(&fz.pull_done, false);
  atomic_store(&pull_mode, f->mode);
  uv_async_send(&fz.kick);
  /* the node's connection, unless the pull ended before it asked
   * anything */
  memset(r, 0, sizeof(*r));
  (void)fuzz_node_accept(&fz, r, f->caps, f->required, NULL);
  /* its lanes, which it opens once the link is up */
  for (int i = 0; i < 2 && r->up && (r->caps & 8); i++)
    if (fuzz_node_wait_connection(&fz, NULL))
      (void)rogue_accept_lane(r, fz.rlfd, &lanes[i]);
  while (r->up && !r->failed && !r->closed && !atomic_load(&fz.pull_done)) {
    struct fuzz_answer a = {.r = r, .data = answer_data};
    if (!fuzz_node_next_request(r, rogue_recv, &rid, &read_off))
      continue;
    a.rid = rid;
    a.read_off = read_off;
    if (!fuzz_node_serve_record(&a, &p, &n))
      break;
  }
  /* what was sent last may still be on its way (a lane's frame) */
  for (int i = 0; i < 4 && r->up && !r->failed && !atomic_load(&fz.pull_done); i++) {
    Gshm__Cluster__Msg *m = rogue_recv(r, 5);
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  for (int i = 0; i < 2; i++) {
    rogue_lane_close(&lanes[i]);
    memset(&lanes[i], 0, sizeof(lanes[i]));
  }
  rogue_close(r);
  for (int i = 0; i < 5000 && !atomic_load(&fz.pull_done); i++)
    usleep(1000);
  if (!atomic_load(&fz.pull_done)) {
    fprintf(stderr, "fuzz_cluster: the request did not end within 5 s of its link's end\n");
    abort();
  }
}

/* Reads the input's flags (one byte, or two: see the top) into f;
 * returns the bytes they took, or 0 when the input is too short. */
static size_t input_flags(const uint8_t *data, size_t size, struct fuzz_flags *f) {
  if (size < 1)
    return 0;
  f->mode = data[0] & 3;
  f->caps = (uint32_t)(data[0] >> 2) & ~4u;
  return fuzz_node_flags(data, size, f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct rogue *r = &rogue;
  struct fuzz_flags f;
  size_t off;

  if (size > 1 << 18 || !(off = input_flags(data, size, &f)))
    return 0;
  fuzz_node_min_protocol(&fz, f.required);
  if (f.mode == 0) {
    raw(data + off, size - off);
    return 0;
  }
  if (f.mode >= 2) {
    serve(&f, data + off, size - off);
    return 0;
  }
  /* (the node must still take an honest hello, and under 2.6 refuse a
   * rogue without CAP_SUBKEYS before any MAC: fuzz_node_connect) */
  if (!fuzz_node_connect(&fz, r, f.caps, f.required))
    return 0;
  memset(&plane, 0, sizeof(plane));
  if (r->caps & 8)
    if (rogue_connect_lane(r, fz.port, &plane) && getenv("GSHM_FUZZ_LOG"))
      fprintf(stderr, "fuzz_cluster: no lane: %s\n", plane.refusal);
  while (off + 2 <= size && !r->failed && !r->closed) {
    size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
    off += 2;
    if (len > size - off)
      len = size - off;
    (void)fuzz_node_send_record(r, data + off, len, last_grant);
    off += len;
    drain(r, 2);
  }
  rogue_close(&plane);
  rogue_close(r);
  return 0;
}
