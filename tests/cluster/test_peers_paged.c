/* SPDX-License-Identifier: Apache-2.0 */
/* PEERS of a node with hundreds of peers whose messages are long: more
 * than one reply packet (64 KiB) holds.  Every peer of cluster.peers
 * points at the test's refuser, which answers each connection with a
 * refusal of 200 bytes, so each peer shows "down" and a message of 159
 * bytes: 500 of them make about 100 KiB.  gshmd answers in pages
 * (ClusterPeerList.next), libgshm and `gshmctl peers --json` return all
 * of them, once each, in cluster.peers' order; a cursor from the wire
 * that points anywhere reads nothing out of range. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.pb-c.h"
#include "gshm.h"
#include "gshm.pb-c.h"
#include "harness.h"
#include "nodes.h"
#include "wire.h"

#define NPEERS 500
#define REFUSERS 1024 /* connections the refuser holds at once */

static struct cluster_keys keys;
static struct node A;
static int refuser_fd = -1;
static pthread_t refuser;
static atomic_bool refuser_stop;
static atomic_uint refused; /* connections answered with the refusal */

/* Sends the refusal frame on fd (before the hello: a plain frame). */
static void refuse(int fd) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  struct port_frame h = {.kind = 1};
  char why[201];
  uint8_t buf[512];

  memset(why, 'x', sizeof(why) - 1);
  why[sizeof(why) - 1] = '\0';
  memcpy(why, "too many peers ", 15);
  m.status = GSHM__STATUS__STATUS_PERMISSION_DENIED;
  m.message = why;
  h.len = (uint32_t)gshm__cluster__msg__pack(&m, buf);
  if (write(fd, &h, sizeof(h)) == (ssize_t)sizeof(h) && write(fd, buf, h.len) == (ssize_t)h.len)
    atomic_fetch_add(&refused, 1);
}

/* Accepts every connection, refuses it, and closes it when the node did
 * (its hello is read and dropped: closed unread, the refusal could be
 * lost to a reset). */
static void *refuser_main(void *arg) {
  static struct pollfd p[REFUSERS + 1];
  unsigned n = 1;

  (void)arg;
  p[0] = (struct pollfd){.fd = refuser_fd, .events = POLLIN};
  while (!atomic_load(&refuser_stop)) {
    if (poll(p, n, 100) <= 0)
      continue;
    for (unsigned i = n; i-- > 1;) {
      char junk[4096];
      if (p[i].revents && read(p[i].fd, junk, sizeof(junk)) <= 0) {
        close(p[i].fd);
        p[i] = p[--n];
      }
    }
    if ((p[0].revents & POLLIN) && n <= REFUSERS) {
      int fd = accept4(refuser_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) {
        refuse(fd);
        p[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
      }
    }
  }
  for (unsigned i = 1; i < n; i++)
    close(p[i].fd);
  return NULL;
}

static int refuser_start(void) {
  int port;

  refuser_fd = listen_local(1024, &port);
  assert_int_equal(pthread_create(&refuser, NULL, refuser_main, NULL), 0);
  return port;
}

/* Node a, its cluster.peers NPEERS names at the refuser's port (its
 * value is longer than node_start's arguments hold). */
static int group_setup(void **state) {
  static char peers[NPEERS * 32], args[8][512];
  const char *argv[9];
  size_t off = 0;
  int port;

  (void)state;
  keys_make(&keys, "gshm-peers");
  port = refuser_start();
  for (int i = 0; i < NPEERS; i++)
    off += (size_t)snprintf(peers + off, sizeof(peers) - off, "%speer%03d=127.0.0.1:%d",
                            i ? "," : "", i, port);
  A.port = free_port();
  snprintf(args[0], sizeof(args[0]), "--set=cluster.listen=127.0.0.1:%d", A.port);
  snprintf(args[1], sizeof(args[1]), "--set=cluster.node_name=a");
  snprintf(args[2], sizeof(args[2]), "--set=cluster.secret_file=%s", keys.key);
  snprintf(args[3], sizeof(args[3]), "--set=cluster.pull_group=%s", node_group);
  snprintf(args[4], sizeof(args[4]), "--set=daemon.socket_mode=0666");
  for (int i = 0; i < 5; i++)
    argv[i] = args[i];
  {
    static char peers_arg[sizeof(peers) + 32];
    snprintf(peers_arg, sizeof(peers_arg), "--set=cluster.peers=%s", peers);
    argv[5] = peers_arg;
  }
  argv[6] = NULL;
  assert_int_equal(harness_start(&A.h, argv), 0);
  harness_set_leftover(&A.h);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  assert_int_equal(harness_stop(&A.h), 0);
  harness_set_leftover(NULL);
  atomic_store(&refuser_stop, true);
  pthread_join(refuser, NULL);
  close(refuser_fd);
  keys_remove(&keys);
  return 0;
}

/* Whether every peer was refused once at least and shows why. */
static bool all_refused(const gshm_cluster_peer_t *v, size_t n) {
  if (n != NPEERS)
    return false;
  for (size_t i = 0; i < n; i++)
    if (strncmp(v[i].message, "refused by the peer: too many peers", 35))
      return false;
  return true;
}

/* The library's list: every peer once, in cluster.peers' order, each
 * with its long message (more than one packet holds). */
static void test_peers_all_listed(void **state) {
  gshm_client_t *c = connect_to(&A);
  gshm_cluster_peer_t *v = NULL;
  char node[64];
  size_t n = 0, bytes = 0;
  int64_t end = now_ms() + 60000;

  (void)state;
  while (atomic_load(&refused) < NPEERS && now_ms() < end)
    usleep(50000);
  assert_true(atomic_load(&refused) >= NPEERS);
  for (;;) {
    int e = gshm_cluster_peers(c, node, &v, &n);
    if (e)
      fail_msg("gshm_cluster_peers: %s", strerror(-e));
    if (all_refused(v, n) || now_ms() > end)
      break;
    gshm_free(v);
    v = NULL;
    usleep(200000);
  }
  assert_string_equal(node, "a");
  assert_int_equal(n, NPEERS);
  for (size_t i = 0; i < n; i++) {
    char want[32];
    snprintf(want, sizeof(want), "peer%03zu", i);
    assert_string_equal(v[i].name, want);
    assert_string_equal(v[i].state, "down");
    bytes += strlen(v[i].name) + strlen(v[i].address) + strlen(v[i].message) + 4;
  }
  assert_true(all_refused(v, n));
  assert_true(bytes > GSHM_WIRE_MAX_PACKET); /* (else this test shows nothing) */
  gshm_free(v);
  gshm_disconnect(c);
}

/* Asserts that out names every peer once, in order (each between quote
 * and end). */
static void all_once_in_order(const char *out, const char *quote, const char *end) {
  const char *at = out;

  for (int i = 0; i < NPEERS; i++) {
    char want[32];
    const char *hit;
    snprintf(want, sizeof(want), "%speer%03d%s", quote, i, end);
    if (!(hit = strstr(at, want)))
      fail_msg("%s missing, or out of order", want);
    assert_null(strstr(hit + 1, want)); /* once */
    at = hit + 1;
  }
}

/* gshmctl peers, and --json: every peer once, in order. */
static void test_gshmctl_peers_json(void **state) {
  char *out = NULL;

  (void)state;
  assert_int_equal(harness_gshmctl(&A.h, &out, (const char *[]){"peers", "--json", NULL}), 0);
  all_once_in_order(out, "\"", "\"");
  free(out);
  assert_int_equal(harness_gshmctl(&A.h, &out, (const char *[]){"peers", NULL}), 0);
  all_once_in_order(out, "", " ");
  assert_non_null(strstr(out, "500 peers"));
  free(out);
}

/* A raw connection to A's socket, past its hello. */
static int raw_connect(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Gshm__Hello h = GSHM__HELLO__INIT;
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  int fds[4], nfds = 0, fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", A.h.socket_path);
  h.major = GSHM_PROTO_MAJOR;
  h.client_name = "cursor";
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &h.base, -1), 0);
  assert_true(gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0) > 0);
  return fd;
}

/* One PEERS page after `after` on fd, sent as msg (NULL: a PeersRequest
 * with after); the reply (free with gshm__reply__free_unpacked). */
static Gshm__Reply *raw_peers(int fd, uint64_t after, const ProtobufCMessage *msg) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  static uint32_t rid = 2;
  Gshm__PeersRequest m = GSHM__PEERS_REQUEST__INIT;
  struct gshm_wire_header hdr;
  int fds[4], nfds = 0;
  ssize_t len;
  Gshm__Reply *r;

  m.after = after;
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_PEERS, rid++, msg ? msg : &m.base, -1), 0);
  len = gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0);
  assert_true(len > 0); /* (the connection stays) */
  assert_int_equal(gshm__wire_parse_header(buf, (size_t)len, &hdr), 0);
  r = gshm__reply__unpack(NULL, hdr.length, buf + GSHM_WIRE_HEADER_SIZE);
  assert_non_null(r);
  assert_int_equal(r->status, GSHM__STATUS__STATUS_OK);
  assert_int_equal(r->body_case, GSHM__REPLY__BODY_CLUSTER_PEERS);
  return r;
}

/* Cursors a hostile local client may send: past the end, at the end, the
 * largest; each an empty (or one-peer) last page, no pulls; and an old
 * client's Empty is the first page, with a cursor it may ignore. */
static void test_peers_hostile_cursor(void **state) {
  const uint64_t empty[] = {NPEERS, NPEERS + 1, 1ull << 32, UINT64_MAX / 2, UINT64_MAX - 1,
                            UINT64_MAX};
  Gshm__Empty old = GSHM__EMPTY__INIT;
  int fd = raw_connect();
  Gshm__Reply *r;

  (void)state;
  for (size_t i = 0; i < sizeof(empty) / sizeof(empty[0]); i++) {
    r = raw_peers(fd, empty[i], NULL);
    assert_int_equal(r->cluster_peers->n_peers, 0);
    assert_int_equal(r->cluster_peers->n_pulls, 0);
    assert_int_equal(r->cluster_peers->next, 0);
    assert_string_equal(r->cluster_peers->node_name, "a");
    gshm__reply__free_unpacked(r, NULL);
  }
  r = raw_peers(fd, NPEERS - 1, NULL); /* the last peer alone */
  assert_int_equal(r->cluster_peers->n_peers, 1);
  assert_string_equal(r->cluster_peers->peers[0]->name, "peer499");
  assert_int_equal(r->cluster_peers->next, 0);
  gshm__reply__free_unpacked(r, NULL);
  r = raw_peers(fd, 1, NULL); /* from the second: a full page, then more */
  assert_true(r->cluster_peers->n_peers > 1);
  assert_string_equal(r->cluster_peers->peers[0]->name, "peer001");
  assert_int_equal(r->cluster_peers->next, 1 + r->cluster_peers->n_peers);
  gshm__reply__free_unpacked(r, NULL);
  r = raw_peers(fd, 0, &old.base); /* an old client: the first page */
  assert_true(r->cluster_peers->n_peers > 1 && r->cluster_peers->n_peers < NPEERS);
  assert_string_equal(r->cluster_peers->peers[0]->name, "peer000");
  assert_int_equal(r->cluster_peers->next, r->cluster_peers->n_peers);
  gshm__reply__free_unpacked(r, NULL);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_peers_all_listed),
      cmocka_unit_test(test_gshmctl_peers_json),
      cmocka_unit_test(test_peers_hostile_cursor),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
