/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input gets a clear error and nothing is lost: each case speaks raw
 * packets to a real gshmd, checks the reply and that the connection is
 * dropped, and then that a client connected before the attack is still
 * served, a segment created before still holds its bytes, and gshmd's fd
 * count is back to its baseline. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"

struct fx {
  struct harness h;
  gshm_client_t *bystander;
  gshm_segment_t *kept;
  unsigned char want[8192];
  int baseline_fds;
};

static int setup(void **state) {
  struct fx *f = harness_cmocka_start(state, sizeof(*f), NULL);

  if (!f || gshm_connect(f->h.socket_path, "bystander", &f->bystander) ||
      gshm_create(f->bystander, "kept", sizeof(f->want), NULL, 0600, 0, &f->kept))
    return -1;
  harness_random(f->want, sizeof(f->want), 99);
  if (gshm_write(f->kept, 0, f->want, sizeof(f->want)))
    return -1;
  /* A round trip first: gshmd closes its copy of an exported fd just
   * after the reply that carried it, and mapping reports get no reply. */
  {
    gshm_status_info_t st;
    if (gshm_status(f->bystander, &st))
      return -1;
  }
  f->baseline_fds = harness_stable_fd_count(f->h.sp.pid);
  return 0;
}

/* After every attack: still serving, nothing lost, nothing leaked. */
static void check_unharmed(struct fx *f) {
  gshm_status_info_t st;
  unsigned char buf[sizeof(f->want)];
  int fds = -1;

  assert_int_equal(gshm_status(f->bystander, &st), 0);
  assert_int_equal(gshm_read(f->kept, 0, buf, sizeof(buf)), 0);
  assert_memory_equal(buf, f->want, sizeof(buf));
  /* The daemon closes a dropped connection's socket on its next loop turn. */
  for (int i = 0; i < 100; i++) {
    fds = harness_stable_fd_count(f->h.sp.pid);
    if (fds == f->baseline_fds)
      break;
    usleep(10000);
  }
  assert_int_equal(fds, f->baseline_fds);
}

static int teardown(void **state) {
  struct fx *f = *state;

  check_unharmed(f);
  gshm_close(f->kept);
  gshm_disconnect(f->bystander);
  return harness_cmocka_teardown(state);
}

static int raw_connect(struct fx *f) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct timeval tv = {.tv_sec = 5};
  strcpy(sa.sun_path, f->h.socket_path);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

static void send_hello(int fd, uint32_t major) {
  Gshm__Hello m = GSHM__HELLO__INIT;
  m.major = major;
  m.client_name = "raw";
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &m.base, -1), 0);
}

/* Reads one reply; returns its status and copies its message. */
static int read_status(int fd, char *msg, size_t cap) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  struct gshm_wire_header h;
  int fds[8], nfds = 0, st;
  ssize_t n = gshm__wire_recv(fd, buf, sizeof(buf), fds, 8, &nfds, 0);
  Gshm__Reply *r;

  assert_true(n > 0);
  assert_int_equal(nfds, 0);
  assert_int_equal(gshm__wire_parse_header(buf, (size_t)n, &h), 0);
  assert_true(h.type & GSHM_WIRE_REPLY);
  r = gshm__reply__unpack(NULL, h.length, buf + GSHM_WIRE_HEADER_SIZE);
  assert_non_null(r);
  st = r->status;
  if (msg)
    snprintf(msg, cap, "%s", r->message);
  gshm__reply__free_unpacked(r, NULL);
  return st;
}

/* The daemon closes the connection after a protocol error. */
static void assert_dropped(int fd) {
  char b[16];
  assert_int_equal(recv(fd, b, sizeof(b), 0), 0);
  close(fd);
}

static void test_wrong_major_in_hello(void **state) {
  struct fx *f = *state;
  char msg[256];
  int fd = raw_connect(f);

  send_hello(fd, 2);
  assert_int_equal(read_status(fd, msg, sizeof(msg)), GSHM__STATUS__STATUS_VERSION_MISMATCH);
  assert_non_null(strstr(msg, "2.0")); /* names the client's version */
  assert_non_null(strstr(msg, "1.0")); /* and gshmd's */
  assert_dropped(fd);
}

static void test_wrong_major_in_header(void **state) {
  struct fx *f = *state;
  uint8_t pkt[GSHM_WIRE_HEADER_SIZE];
  struct gshm_wire_header h = {.magic = GSHM_WIRE_MAGIC, .major = 9, .minor = 3,
                               .type = GSHM_WIRE_HELLO, .request_id = 1, .length = 0};
  char msg[256];
  int fd = raw_connect(f);

  memcpy(pkt, &h, sizeof(h));
  assert_int_equal(send(fd, pkt, sizeof(pkt), 0), (ssize_t)sizeof(pkt));
  assert_int_equal(read_status(fd, msg, sizeof(msg)), GSHM__STATUS__STATUS_VERSION_MISMATCH);
  assert_non_null(strstr(msg, "9.3"));
  assert_dropped(fd);
}

static void test_packet_over_64k(void **state) {
  struct fx *f = *state;
  static uint8_t big[GSHM_WIRE_MAX_PACKET + 1];
  int fd = raw_connect(f);
  struct gshm_wire_header h = {.magic = GSHM_WIRE_MAGIC, .major = 1, .type = GSHM_WIRE_HELLO,
                               .length = sizeof(big) - GSHM_WIRE_HEADER_SIZE};

  memcpy(big, &h, sizeof(h));
  assert_int_equal(send(fd, big, sizeof(big), 0), (ssize_t)sizeof(big));
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_TOO_BIG);
  assert_dropped(fd);
}

static void test_truncated_and_lying_packets(void **state) {
  struct fx *f = *state;
  uint8_t pkt[64] = {0};
  struct gshm_wire_header h = {.magic = GSHM_WIRE_MAGIC, .major = 1, .type = GSHM_WIRE_HELLO,
                               .length = 40};
  int fd = raw_connect(f);

  /* Shorter than a header. */
  assert_int_equal(send(fd, "GSHM1", 5, 0), 5);
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
  assert_dropped(fd);
  /* A length field that does not match the packet. */
  fd = raw_connect(f);
  memcpy(pkt, &h, sizeof(h));
  assert_int_equal(send(fd, pkt, GSHM_WIRE_HEADER_SIZE + 4, 0), GSHM_WIRE_HEADER_SIZE + 4);
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
  assert_dropped(fd);
  /* A body that is not a Hello (truncated protobuf). */
  fd = raw_connect(f);
  h.length = 3;
  memcpy(pkt, &h, sizeof(h));
  memcpy(pkt + GSHM_WIRE_HEADER_SIZE, "\x1a\x7f\x41", 3); /* string field claiming 127 bytes */
  assert_int_equal(send(fd, pkt, GSHM_WIRE_HEADER_SIZE + 3, 0), GSHM_WIRE_HEADER_SIZE + 3);
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
  assert_dropped(fd);
}

static void test_unknown_type_and_order(void **state) {
  struct fx *f = *state;
  Gshm__OpenRequest o = GSHM__OPEN_REQUEST__INIT;
  char msg[256];
  int fd = raw_connect(f);

  /* Open before hello. */
  o.name = "kept";
  o.access = GSHM__ACCESS__ACCESS_READ;
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_OPEN, 5, &o.base, -1), 0);
  assert_int_equal(read_status(fd, msg, sizeof(msg)), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
  assert_non_null(strstr(msg, "hello"));
  assert_dropped(fd);
  /* An unknown message type after a good hello. */
  fd = raw_connect(f);
  send_hello(fd, GSHM_PROTO_MAJOR);
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_OK);
  assert_int_equal(gshm__wire_send(fd, 77, 2, NULL, -1), 0);
  assert_int_equal(read_status(fd, msg, sizeof(msg)), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
  assert_non_null(strstr(msg, "unknown"));
  assert_dropped(fd);
}

static void test_unexpected_fds_are_closed(void **state) {
  struct fx *f = *state;
  Gshm__Hello m = GSHM__HELLO__INIT;
  uint8_t pkt[256];
  size_t len;
  int fds[200], fd = raw_connect(f), devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  char ctl[CMSG_SPACE(sizeof(fds))];
  struct iovec iov;
  struct msghdr mh = {0};
  struct cmsghdr *c;

  m.major = GSHM_PROTO_MAJOR;
  m.client_name = "fds";
  assert_int_equal(gshm__wire_pack(GSHM_WIRE_HELLO, 1, &m.base, pkt, sizeof(pkt), &len), 0);
  for (int i = 0; i < 200; i++)
    fds[i] = devnull;
  iov.iov_base = pkt;
  iov.iov_len = len;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof(ctl);
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(fds));
  memcpy(CMSG_DATA(c), fds, sizeof(fds));
  if (sendmsg(fd, &mh, 0) < 0) {
    /* refused by the kernel: gshmd turns SO_PASSRIGHTS off (Linux 6.16+) */
    assert_int_equal(errno, EPERM);
    close(fd);
  } else {
    assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
    assert_dropped(fd);
  }
  close(devnull);
  /* teardown checks the daemon's fd count is back to baseline */
}

static void test_bad_requests_through_the_api(void **state) {
  struct fx *f = *state;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  gshm_segment_t *s;
  char name[300], msg[256];
  int fd;

  memset(name, 'n', 256);
  name[256] = '\0';
  assert_int_equal(gshm_create(f->bystander, "zero", 0, NULL, 0600, 0, &s), -EINVAL);
  assert_true(strlen(gshm_last_error(f->bystander)) > 0);
  assert_int_equal(gshm_create(f->bystander, name, 1, NULL, 0600, 0, &s), -ENAMETOOLONG);
  assert_int_equal(gshm_open(f->bystander, "missing", GSHM_ACCESS_READ, &s), -ENOENT);
  assert_int_equal(gshm_create(f->bystander, "gpu", 1, "cuda:0", 0600, 0, &s), -ENOTSUP);
  assert_int_equal(gshm_create(f->bystander, "loc", 1, "mars", 0600, 0, &s), -EINVAL);
  /* The daemon checks the name length itself, not only the library. */
  fd = raw_connect(f);
  send_hello(fd, GSHM_PROTO_MAJOR);
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_OK);
  cr.name = name;
  cr.size = 1;
  cr.location = "host";
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_CREATE, 2, &cr.base, -1), 0);
  assert_int_equal(read_status(fd, msg, sizeof(msg)), GSHM__STATUS__STATUS_NAME_TOO_LONG);
  assert_non_null(strstr(msg, "255"));
  close(fd);
}

/* A name over GSHM_NAME_MAX is -ENAMETOOLONG from every call that takes
 * one, as from gshm_open and gshm_unlink: gshmd looks the name up before
 * it checks it, so stat, chmod, chown and revoke said -ENOENT, and one
 * longer than a packet -EMSGSIZE (an errno gshm.h never listed); and
 * gshm_last_error() says why (gshm_open_legacy_ipc left an older
 * request's explanation there). */
static void test_long_names_everywhere(void **state) {
  struct fx *f = *state;
  gshm_segment_info_t info;
  gshm_segment_t *s;
  size_t lens[] = {GSHM_NAME_MAX + 1, GSHM_WIRE_MAX_PACKET + 1};
  uint8_t handle[GSHM_LEGACY_IPC_HANDLE_SIZE];
  char *name = malloc(GSHM_WIRE_MAX_PACKET + 2);

  assert_non_null(name);
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    memset(name, 'n', lens[i]);
    name[lens[i]] = '\0';
    assert_int_equal(gshm_open(f->bystander, name, GSHM_ACCESS_READ, &s), -ENAMETOOLONG);
    assert_int_equal(gshm_unlink(f->bystander, name), -ENAMETOOLONG);
    assert_int_equal(gshm_stat_name(f->bystander, name, &info), -ENAMETOOLONG);
    assert_non_null(strstr(gshm_last_error(f->bystander), "longer than 255"));
    assert_int_equal(gshm_chmod(f->bystander, name, 0644), -ENAMETOOLONG);
    assert_int_equal(gshm_chown(f->bystander, name, (uint32_t)-1, (uint32_t)-1), -ENAMETOOLONG);
    assert_int_equal(gshm_revoke(f->bystander, name), -ENAMETOOLONG);
    /* and says so, not an older request's explanation */
    assert_int_equal(gshm_open(f->bystander, "missing", GSHM_ACCESS_READ, &s), -ENOENT);
    assert_int_equal(gshm_open_legacy_ipc(f->bystander, name, handle, &s), -ENAMETOOLONG);
    assert_non_null(strstr(gshm_last_error(f->bystander), "longer than 255"));
  }
  /* the longest name is still a name: not found, as before */
  memset(name, 'n', GSHM_NAME_MAX);
  name[GSHM_NAME_MAX] = '\0';
  assert_int_equal(gshm_stat_name(f->bystander, name, &info), -ENOENT);
  assert_int_equal(gshm_chmod(f->bystander, name, 0644), -ENOENT);
  free(name);
}

/* A name no segment can have is -EINVAL, "bad name", from every call that
 * takes one, as from gshm_create and gshm_open: gshmd looked it up first,
 * and stat, unlink, chmod, chown and revoke answered -ENOENT, as for a
 * good name not there (which they still do). */
static void test_bad_names_everywhere(void **state) {
  static const char *const bad[] = {"", "a//b", "a/", "/abs", "../x", "x/./y", "ctl\001char"};
  struct fx *f = *state;
  gshm_segment_info_t info;
  gshm_segment_t *s;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const char *name = bad[i];
    assert_int_equal(gshm_open(f->bystander, name, GSHM_ACCESS_READ, &s), -EINVAL);
    assert_int_equal(gshm_stat_name(f->bystander, name, &info), -EINVAL);
    assert_non_null(strstr(gshm_last_error(f->bystander), "bad name"));
    assert_int_equal(gshm_unlink(f->bystander, name), -EINVAL);
    assert_int_equal(gshm_chmod(f->bystander, name, 0644), -EINVAL);
    assert_int_equal(gshm_chown(f->bystander, name, (uint32_t)-1, (uint32_t)-1), -EINVAL);
    assert_int_equal(gshm_revoke(f->bystander, name), -EINVAL);
    assert_non_null(strstr(gshm_last_error(f->bystander), "bad name"));
  }
  assert_int_equal(gshm_stat_name(f->bystander, "a/b", &info), -ENOENT);
  assert_non_null(strstr(gshm_last_error(f->bystander), "no segment named 'a/b'"));
  assert_int_equal(gshm_unlink(f->bystander, "a/b"), -ENOENT);
  assert_int_equal(gshm_chmod(f->bystander, "a/b", 0644), -ENOENT);
  assert_int_equal(gshm_chown(f->bystander, "a/b", (uint32_t)-1, (uint32_t)-1), -ENOENT);
  assert_int_equal(gshm_revoke(f->bystander, "a/b"), -ENOENT);
}

/* A fake gshmd on a socket of its own, for the library's side of bad
 * input: it answers the hello, then each PEERS request with an empty page
 * of node name "fake-node" whose cursor goes 2, then back to 1. */
struct fake_gshmd {
  char dir[64], path[108];
  int lfd;
  pthread_t t;
};

static void *fake_peers_paging_back(void *arg) {
  struct fake_gshmd *g = arg;
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  int fd = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC);

  for (int n = 0; fd >= 0; n++) {
    Gshm__Reply r = GSHM__REPLY__INIT;
    Gshm__Welcome w = GSHM__WELCOME__INIT;
    Gshm__ClusterPeerList page = GSHM__CLUSTER_PEER_LIST__INIT;
    struct gshm_wire_header h;
    int fds[4], nfds = 0;
    ssize_t len = gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0);

    if (len <= 0 || gshm__wire_parse_header(buf, (size_t)len, &h))
      break;
    r.status = GSHM__STATUS__STATUS_OK;
    if (h.type == GSHM_WIRE_HELLO) {
      w.major = GSHM_PROTO_MAJOR;
      w.minor = GSHM_PROTO_MINOR;
      w.session_id = 1;
      r.body_case = GSHM__REPLY__BODY_WELCOME;
      r.welcome = &w;
    } else {
      page.node_name = "fake-node";
      page.next = n == 1 ? 2 : 1;
      r.body_case = GSHM__REPLY__BODY_CLUSTER_PEERS;
      r.cluster_peers = &page;
    }
    if (gshm__wire_send(fd, h.type | GSHM_WIRE_REPLY, h.request_id, &r.base, -1))
      break;
  }
  if (fd >= 0)
    close(fd);
  return NULL;
}

/* gshm_cluster_peers of a daemon whose page cursor goes back: -EPROTO,
 * and nothing written out ("Output arguments are written only on
 * success"): node_name_out got the first page's node name before the
 * second page failed. */
static void test_peers_out_untouched_on_failure(void **state) {
  struct fake_gshmd g;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  gshm_cluster_peer_t *peers = (gshm_cluster_peer_t *)&g;
  gshm_client_t *c;
  char node[64];
  size_t n = 7;
  (void)state;

  snprintf(g.dir, sizeof(g.dir), "/tmp/gshm-fake-XXXXXX");
  assert_non_null(mkdtemp(g.dir));
  snprintf(g.path, sizeof(g.path), "%s/s", g.dir);
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g.path);
  assert_true((g.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) >= 0);
  assert_int_equal(bind(g.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_int_equal(listen(g.lfd, 4), 0);
  assert_int_equal(pthread_create(&g.t, NULL, fake_peers_paging_back, &g), 0);
  memset(node, 'X', sizeof(node) - 1);
  node[sizeof(node) - 1] = '\0';
  assert_int_equal(gshm_connect(g.path, "paging", &c), 0);
  assert_int_equal(gshm_cluster_peers(c, node, &peers, &n), -EPROTO);
  assert_int_equal(strspn(node, "X"), sizeof(node) - 1);
  assert_ptr_equal(peers, (gshm_cluster_peer_t *)&g);
  assert_int_equal(n, 7);
  gshm_disconnect(c);
  assert_int_equal(pthread_join(g.t, NULL), 0);
  close(g.lfd);
  unlink(g.path);
  rmdir(g.dir);
}

/* A client that holds a lease, asks for an unlink and is gone before the
 * reply: gshmd used to notify the requester's own connection too, the send
 * failed, the connection closed under the request and the registry got a
 * NULL client (SIGSEGV, found by tests/killpoint under load). */
static void test_unlink_then_vanish(void **state) {
  struct fx *f = *state;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  Gshm__UnlinkRequest ur = GSHM__UNLINK_REQUEST__INIT;
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  int fds[4], nfds = 0;

  for (int round = 0; round < 20; round++) {
    int fd = raw_connect(f);
    send_hello(fd, GSHM_PROTO_MAJOR);
    assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_OK);
    cr.name = "vanish";
    cr.size = 4096;
    cr.location = "host";
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_CREATE, 2, &cr.base, -1), 0);
    assert_true(gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0) > 0);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    ur.name = "vanish";
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_UNLINK, 3, &ur.base, -1), 0);
    close(fd); /* gone before the reply */
  }
  /* teardown: gshmd still serves the bystander, fds back to baseline */
}

/* One LIST_* request on a raw connection; returns the reply (free it). */
static Gshm__Reply *list_raw(int fd, uint16_t type, uint64_t after, uint32_t limit) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  static uint32_t id = 100;
  Gshm__ListRequest m = GSHM__LIST_REQUEST__INIT;
  struct gshm_wire_header h;
  Gshm__Reply *r;
  int fds[4], nfds = 0;
  ssize_t n;

  m.after = after;
  m.limit = limit;
  assert_int_equal(gshm__wire_send(fd, type, ++id, &m.base, -1), 0);
  n = gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0);
  assert_true(n > 0);
  assert_int_equal(nfds, 0);
  assert_int_equal(gshm__wire_parse_header(buf, (size_t)n, &h), 0);
  assert_int_equal(h.type, type | GSHM_WIRE_REPLY);
  assert_int_equal(h.request_id, id);
  assert_non_null(r = gshm__reply__unpack(NULL, h.length, buf + GSHM_WIRE_HEADER_SIZE));
  assert_int_equal(r->status, GSHM__STATUS__STATUS_OK);
  return r;
}

/* The one list pager (requests.c list_page) at its edges, for each kind:
 * a page filled exactly by the limit ends the list (next 0), a shorter
 * limit gives as its cursor the next item's id less one (not the last
 * item looked at: that may be another user's, SECURITY.md; here the
 * same where ids are consecutive), a cursor past the end gives an
 * empty page, and a cursor naming a segment that is gone starts after it. */
static void test_list_pages(void **state) {
  struct fx *f = *state;
  gshm_segment_t *p1, *p2;
  uint64_t ids[3];
  Gshm__Reply *r;
  int fd = raw_connect(f);

  send_hello(fd, GSHM_PROTO_MAJOR);
  assert_int_equal(read_status(fd, NULL, 0), GSHM__STATUS__STATUS_OK);
  assert_int_equal(gshm_create(f->bystander, "p1", 1, NULL, 0600, 0, &p1), 0);
  assert_int_equal(gshm_create(f->bystander, "p2", 1, NULL, 0600, 0, &p2), 0);

  /* segments: kept, p1, p2 */
  r = list_raw(fd, GSHM_WIRE_LIST_SEGMENTS, 0, 3);
  assert_int_equal(r->segments->n_segments, 3);
  assert_int_equal(r->segments->next, 0); /* exactly full: no empty page after */
  for (int i = 0; i < 3; i++)
    ids[i] = r->segments->segments[i]->id;
  assert_true(ids[0] < ids[1] && ids[1] < ids[2]);
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_SEGMENTS, 0, 2);
  assert_int_equal(r->segments->n_segments, 2);
  assert_int_equal(r->segments->next, ids[2] - 1);
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_SEGMENTS, ids[1], 2);
  assert_int_equal(r->segments->n_segments, 1);
  assert_int_equal(r->segments->segments[0]->id, ids[2]);
  assert_int_equal(r->segments->next, 0);
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_SEGMENTS, ids[2], 0);
  assert_int_equal(r->segments->n_segments, 0); /* empty page */
  assert_int_equal(r->segments->next, 0);
  gshm__reply__free_unpacked(r, NULL);
  assert_int_equal(gshm_unlink(f->bystander, "p1"), 0);
  gshm_close(p1); /* p1 is gone: its id is no longer in the registry */
  r = list_raw(fd, GSHM_WIRE_LIST_SEGMENTS, ids[1], 0);
  assert_int_equal(r->segments->n_segments, 1);
  assert_int_equal(r->segments->segments[0]->id, ids[2]);
  gshm__reply__free_unpacked(r, NULL);

  /* leases: the bystander's on kept and p2 */
  r = list_raw(fd, GSHM_WIRE_LIST_LEASES, 0, 2);
  assert_int_equal(r->leases->n_leases, 2);
  assert_int_equal(r->leases->next, 0);
  ids[1] = r->leases->leases[1]->lease_id;
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_LEASES, 0, 1);
  assert_int_equal(r->leases->n_leases, 1);
  assert_int_equal(r->leases->next, ids[1] - 1);
  ids[0] = r->leases->next;
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_LEASES, ids[0], 1);
  assert_int_equal(r->leases->n_leases, 1);
  assert_true(r->leases->leases[0]->lease_id > ids[0]);
  assert_int_equal(r->leases->next, 0);
  gshm__reply__free_unpacked(r, NULL);

  /* clients: the bystander and this raw connection */
  r = list_raw(fd, GSHM_WIRE_LIST_CLIENTS, 0, 2);
  assert_int_equal(r->clients->n_clients, 2);
  assert_int_equal(r->clients->next, 0);
  ids[0] = r->clients->clients[1]->session_id;
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_CLIENTS, 0, 1);
  assert_int_equal(r->clients->n_clients, 1);
  assert_int_equal(r->clients->next, ids[0] - 1);
  gshm__reply__free_unpacked(r, NULL);
  r = list_raw(fd, GSHM_WIRE_LIST_CLIENTS, ids[0], 0);
  assert_int_equal(r->clients->n_clients, 0);
  assert_int_equal(r->clients->next, 0);
  gshm__reply__free_unpacked(r, NULL);

  assert_int_equal(gshm_unlink(f->bystander, "p2"), 0);
  gshm_close(p2);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_list_pages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_then_vanish, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_major_in_hello, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_major_in_header, setup, teardown),
      cmocka_unit_test_setup_teardown(test_packet_over_64k, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_and_lying_packets, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_type_and_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unexpected_fds_are_closed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_requests_through_the_api, setup, teardown),
      cmocka_unit_test_setup_teardown(test_long_names_everywhere, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_names_everywhere, setup, teardown),
      cmocka_unit_test(test_peers_out_untouched_on_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
