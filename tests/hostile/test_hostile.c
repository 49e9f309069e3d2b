/* SPDX-License-Identifier: Apache-2.0 */
/* Hostile clients (issue 5, "Done when" 2).  Each case attacks a real
 * gshmd on a temporary socket, then checks that it is unharmed:
 *
 *   - a fresh client connects, says hello and gets a status reply within
 *     100 ms (what `gshmctl status` does);
 *   - a segment another client created before the attack still holds its
 *     random bytes;
 *   - gshmd's fd count is back to its baseline and its RSS within 2 MiB of
 *     it, once the attack's connections are closed and whatever segments
 *     the attack managed to create are unlinked.
 *
 * A note on "partial packets": the socket is SOCK_SEQPACKET, so every
 * send() is one record that arrives whole or not at all.  There is no
 * partial packet to wait for: a client that sends a header one byte at a
 * time sends 1-byte packets, each a complete (too short) packet that is a
 * protocol error.  What remains of slowloris is a client that connects and
 * sends nothing (limits.partial_timeout_ms drops it before hello) or one
 * that never reads its replies (gshmd stops reading it; others are
 * served). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/sockios.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"

#define KEPT_BYTES 65536
#define RSS_SLACK_KIB 2048

/* Under AddressSanitizer freed memory sits in a quarantine (up to 256 MiB)
 * before it is reused, so gshmd's RSS says nothing about leaks there (ASan's
 * leak checker does that job at exit); RSS is then reported, not checked. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_CHECKED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_CHECKED 0
#endif
#endif
#ifndef RSS_CHECKED
#define RSS_CHECKED 1
#endif
#define STATUS_DEADLINE_MS 100.0
#define PARTIAL_TIMEOUT_MS 1000

struct fx {
  struct harness h;
  gshm_client_t *bystander;
  gshm_segment_t *kept;
  unsigned char want[KEPT_BYTES];
  int baseline_fds;
  long baseline_rss;
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 1,000 idle connections need more than the usual 1,024 fds, in this
 * process and in gshmd, which the harness forks from it. */
static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
    rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static int setup(void **state) {
  static const char *const args[] = {"--set", "limits.max_connections=2000", "--set",
                                     "limits.partial_timeout_ms=1000", NULL};
  struct fx *f;

  signal(SIGPIPE, SIG_IGN);
  raise_nofile();
  if (!(f = harness_cmocka_start(state, sizeof(*f), args)) ||
      gshm_connect(f->h.socket_path, "bystander", &f->bystander) ||
      gshm_create(f->bystander, "kept", sizeof(f->want), NULL, 0600, 0, &f->kept))
    return -1;
  harness_random(f->want, sizeof(f->want), 0x5eed);
  if (gshm_write(f->kept, 0, f->want, sizeof(f->want)))
    return -1;
  /* The host backend keeps one read-only reopen of a segment's memfd,
   * made on its first read-only open and kept until the segment is freed
   * (bounded: one per segment).  Make it now, so that attacks that open
   * "kept" read-only do not move the baseline. */
  {
    gshm_segment_t *ro;
    if (gshm_open(f->bystander, "kept", GSHM_ACCESS_READ, &ro) || gshm_close(ro))
      return -1;
  }
  f->baseline_fds = harness_stable_fd_count(f->h.sp.pid);
  f->baseline_rss = harness_rss_kib(f->h.sp.pid);
  return 0;
}

/* Connect + hello + status from a fresh client, as `gshmctl status`. */
static double status_latency_ms(struct fx *f) {
  gshm_client_t *c = NULL;
  gshm_status_info_t st;
  double t0 = now_ms(), t;

  assert_int_equal(gshm_connect(f->h.socket_path, "prober", &c), 0);
  assert_int_equal(gshm_status(c, &st), 0);
  t = now_ms() - t0;
  assert_int_equal(st.pid, f->h.sp.pid);
  gshm_disconnect(c);
  return t;
}

/* On a loaded CI machine one probe can lose the CPU for tens of
 * milliseconds to other jobs; a late answer counts only when three probes
 * in a row are late. */
static double status_within_deadline(struct fx *f) {
  double ms = 0;
  for (int i = 0; i < 3; i++)
    if ((ms = status_latency_ms(f)) < STATUS_DEADLINE_MS)
      break;
  return ms;
}

static void assert_status_fast(struct fx *f, const char *when) {
  double ms = status_within_deadline(f);
  print_message("    status %s: %.2f ms\n", when, ms);
  assert_true(ms < STATUS_DEADLINE_MS);
}

/* Unlinks every segment but "kept" (what random requests created). */
static void unlink_strays(struct fx *f) {
  gshm_segment_info_t *infos = NULL;
  size_t n = 0;

  assert_int_equal(gshm_list(f->bystander, &infos, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (strcmp(infos[i].name, "kept") && !infos[i].unlinked)
      gshm_unlink(f->bystander, infos[i].name);
  gshm_free(infos);
}

/* Lists a process's fds, to say what leaked. */
static void dump_fds(pid_t pid) {
  char path[64], link[320], target[256];
  DIR *d;
  struct dirent *e;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  if (!(d = opendir(path)))
    return;
  while ((e = readdir(d))) {
    ssize_t n;
    if (e->d_name[0] == '.')
      continue;
    snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
    if ((n = readlink(link, target, sizeof(target) - 1)) > 0) {
      target[n] = '\0';
      print_message("    gshmd fd %s -> %s\n", e->d_name, target);
    }
  }
  closedir(d);
}

/* After every attack: still serving, nothing lost, nothing leaked. */
static void check_unharmed(struct fx *f) {
  static unsigned char buf[KEPT_BYTES];
  gshm_status_info_t st;
  int fds = -1;
  long rss;

  assert_status_fast(f, "after the attack");
  unlink_strays(f);
  assert_int_equal(gshm_read(f->kept, 0, buf, sizeof(buf)), 0);
  assert_memory_equal(buf, f->want, sizeof(buf));
  /* Dropped connections are closed on gshmd's next loop turn. */
  for (int i = 0; i < 200; i++) {
    fds = harness_fd_count(f->h.sp.pid);
    assert_int_equal(gshm_status(f->bystander, &st), 0);
    if (fds == f->baseline_fds && st.clients == 1)
      break;
    usleep(10000);
  }
  if (fds != f->baseline_fds)
    dump_fds(f->h.sp.pid);
  assert_int_equal(fds, f->baseline_fds);
  assert_int_equal(st.segments, 1);
  assert_int_equal(st.leases, 1);
  assert_int_equal(st.clients, 1);
  rss = harness_rss_kib(f->h.sp.pid);
  print_message("    gshmd fds %d (baseline %d), rss %ld KiB (baseline %ld)\n", fds,
                f->baseline_fds, rss, f->baseline_rss);
  assert_true(rss > 0);
  if (RSS_CHECKED)
    assert_true(rss <= f->baseline_rss + RSS_SLACK_KIB);
}

static int teardown(void **state) {
  struct fx *f = *state;

  check_unharmed(f);
  gshm_close(f->kept);
  gshm_disconnect(f->bystander);
  return harness_cmocka_teardown(state);
}

static int raw_connect_flags(struct fx *f, int flags) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | flags, 0);
  struct timeval tv = {.tv_sec = 5};

  assert_true(fd >= 0);
  strcpy(sa.sun_path, f->h.socket_path);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

static int raw_connect(struct fx *f) { return raw_connect_flags(f, 0); }

/* Reads one packet; returns the reply's status, or -1 when the connection
 * was closed, or -2 on a timeout.  Closes any fd that came with it. */
static int read_reply(int fd, uint32_t *request_id_out, char *msg, size_t cap) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  struct gshm_wire_header h;
  int fds[GSHM_WIRE_MAX_FDS], nfds = 0, st;
  ssize_t n;
  Gshm__Reply *r;

  do {
    n = gshm__wire_recv(fd, buf, sizeof(buf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    if (n == -EAGAIN || n == -EWOULDBLOCK)
      return -2;
    if (n <= 0)
      return -1;
    assert_int_equal(gshm__wire_parse_header(buf, (size_t)n, &h), 0);
  } while (h.type == GSHM_WIRE_EVENT);
  assert_true(h.type & GSHM_WIRE_REPLY);
  r = gshm__reply__unpack(NULL, h.length, buf + GSHM_WIRE_HEADER_SIZE);
  assert_non_null(r);
  st = r->status;
  assert_int_not_equal(st, GSHM__STATUS__STATUS_UNSPECIFIED);
  if (msg)
    snprintf(msg, cap, "%s", r->message);
  if (request_id_out)
    *request_id_out = h.request_id;
  gshm__reply__free_unpacked(r, NULL);
  return st;
}

/* gshmd closes the connection after a protocol error: EOF follows. */
static void assert_dropped(int fd) {
  char b[16];
  struct pollfd p = {.fd = fd, .events = POLLIN};
  assert_int_equal(poll(&p, 1, 5000), 1);
  assert_int_equal(recv(fd, b, sizeof(b), MSG_DONTWAIT), 0);
  close(fd);
}

static void hello(int fd) {
  Gshm__Hello m = GSHM__HELLO__INIT;
  m.major = GSHM_PROTO_MAJOR;
  m.client_name = "hostile";
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &m.base, -1), 0);
  assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_OK);
}

static void put_header(uint8_t *p, uint8_t major, uint16_t type, uint32_t id, uint32_t length) {
  struct gshm_wire_header h = {.magic = GSHM_WIRE_MAGIC, .major = major, .minor = 0,
                               .type = type, .request_id = id, .length = length};
  memcpy(p, &h, sizeof(h));
}

/* ---- the attacks ---- */

static void test_garbage_bytes(void **state) {
  struct fx *f = *state;
  static uint8_t junk[70000];
  static const size_t sizes[] = {1, 2, 15, 16, 17, 100, 4096, 65535, 65536, 65537, 69999};

  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    for (int hello_first = 0; hello_first < 2; hello_first++) {
      int fd = raw_connect(f), st;
      if (hello_first)
        hello(fd);
      harness_random(junk, sizes[i], 1000 + i);
      assert_int_equal(send(fd, junk, sizes[i], 0), (ssize_t)sizes[i]);
      st = read_reply(fd, NULL, NULL, 0);
      assert_true(st == GSHM__STATUS__STATUS_PROTOCOL_ERROR || st == GSHM__STATUS__STATUS_TOO_BIG);
      assert_dropped(fd);
    }
  }
  /* Bytes that are not even a packet of this protocol: a stream of
   * zero-filled and 0xff-filled records, back to back, unread. */
  {
    int fd = raw_connect(f);
    memset(junk, 0xff, 64);
    for (int i = 0; i < 50; i++)
      if (send(fd, junk, 64, MSG_NOSIGNAL) < 0)
        break;
    close(fd);
  }
  assert_status_fast(f, "after garbage");
}

/* 10,000 random packets: random header fields (magic and length right
 * most of the time, so that bodies reach the decoders), random bodies, on
 * connections that said hello or not; a new connection whenever gshmd
 * drops one.  Replies are read as they come. */
static void test_random_packets(void **state) {
  struct fx *f = *state;
  static uint8_t pkt[4096];
  unsigned long long rng = 0x9e3779b97f4a7c15ull;
  int fd = -1, drops = 0, replies = 0;
  double worst = 0;

  for (int i = 0; i < 10000; i++) {
    uint32_t r[4];
    size_t body, len;
    uint16_t type;

    harness_random(r, sizeof(r), rng += 0x9e3779b97f4a7c15ull);
    if (fd < 0) {
      fd = raw_connect_flags(f, SOCK_NONBLOCK);
      if (r[0] & 1) { /* half of them say hello first */
        Gshm__Hello m = GSHM__HELLO__INIT;
        m.major = GSHM_PROTO_MAJOR;
        m.client_name = "random";
        assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &m.base, -1), 0);
        {
          struct pollfd p = {.fd = fd, .events = POLLIN};
          assert_int_equal(poll(&p, 1, 5000), 1);
          assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_OK);
        }
      }
    }
    /* Mostly small bodies (the requests are small), now and then up to 4 KiB. */
    body = r[1] % 64 == 0 ? r[2] % (sizeof(pkt) - GSHM_WIRE_HEADER_SIZE) : r[2] % 48;
    type = (r[3] & 0xff) < 230 ? (uint16_t)(1 + (r[3] >> 8) % 13) : (uint16_t)(r[3] >> 16);
    put_header(pkt, (r[0] >> 1) % 32 ? GSHM_PROTO_MAJOR : (uint8_t)(r[0] >> 8), type, r[0],
               (r[1] >> 8) % 32 ? (uint32_t)body : r[3]);
    if ((r[1] >> 16) % 64 == 0)
      pkt[r[2] % 4] ^= (uint8_t)(1u << (r[3] % 8)); /* break the magic */
    harness_random(pkt + GSHM_WIRE_HEADER_SIZE, body, rng ^ (unsigned long long)i << 20);
    len = GSHM_WIRE_HEADER_SIZE + body;
    if ((r[1] >> 24) % 50 == 0)
      len = r[2] % len; /* truncated: shorter than its length field says */
    if (send(fd, pkt, len, MSG_NOSIGNAL) < 0) {
      close(fd); /* dropped after an earlier packet */
      fd = -1;
      drops++;
      continue;
    }
    /* One reply or a drop per packet (a mapping report with request id 0
     * may get neither): wait for it, so that every packet reaches gshmd's
     * decoder instead of dying in the queue of a dropped connection. */
    {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      int st;
      if (poll(&p, 1, type == GSHM_WIRE_MAP_REPORT && r[0] == 0 ? 50 : 5000) == 0) {
        assert_true(type == GSHM_WIRE_MAP_REPORT && r[0] == 0);
        continue;
      }
      while ((st = read_reply(fd, NULL, NULL, 0)) >= 0)
        replies++;
      if (st == -1) {
        close(fd);
        fd = -1;
        drops++;
      }
    }
    if (i % 1000 == 999) {
      double ms = status_within_deadline(f);
      if (ms > worst)
        worst = ms;
    }
  }
  if (fd >= 0)
    close(fd);
  print_message("    10000 random packets: %d replies, %d dropped connections, worst status "
                "%.2f ms\n",
                replies, drops, worst);
  assert_true(drops > 1000); /* most random packets break the protocol */
  assert_true(replies >= drops);
  assert_true(worst < STATUS_DEADLINE_MS);
}

/* Length fields that lie, and packets larger than the limit. */
static void test_oversized_lengths(void **state) {
  struct fx *f = *state;
  static uint8_t pkt[200 * 1024];
  static const uint32_t lies[] = {0xffffffffu, 0x80000000u, 0x7fffffffu, 65536, 65520, 65521,
                                  17, 1};
  char msg[256];
  int fd, sndbuf = sizeof(pkt) * 2;

  for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++) {
    for (int hello_first = 0; hello_first < 2; hello_first++) {
      fd = raw_connect(f);
      if (hello_first)
        hello(fd);
      put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_CREATE, 2, lies[i]);
      memset(pkt + GSHM_WIRE_HEADER_SIZE, 0x0a, 32);
      assert_int_equal(send(fd, pkt, GSHM_WIRE_HEADER_SIZE + 32, 0), GSHM_WIRE_HEADER_SIZE + 32);
      assert_int_equal(read_reply(fd, NULL, msg, sizeof(msg)), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
      assert_non_null(strstr(msg, "header"));
      assert_dropped(fd);
    }
  }
  /* Packets over 64 KiB, up to 200 KiB, with a length field that matches:
   * the kernel truncates what gshmd reads (MSG_TRUNC) and it answers
   * TOO_BIG. */
  for (size_t size = 65537; size <= sizeof(pkt); size += 70000) {
    fd = raw_connect(f);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    hello(fd);
    put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_STAT, 3, (uint32_t)(size - GSHM_WIRE_HEADER_SIZE));
    assert_int_equal(send(fd, pkt, size, 0), (ssize_t)size);
    assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_TOO_BIG);
    assert_dropped(fd);
  }
  /* Protobuf length prefixes that claim more than the body holds:
   * a CreateRequest name of "2^63" bytes. */
  fd = raw_connect(f);
  hello(fd);
  {
    static const uint8_t body[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 'x'};
    put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_CREATE, 4, sizeof(body));
    memcpy(pkt + GSHM_WIRE_HEADER_SIZE, body, sizeof(body));
    assert_int_equal(send(fd, pkt, GSHM_WIRE_HEADER_SIZE + sizeof(body), 0),
                     (ssize_t)(GSHM_WIRE_HEADER_SIZE + sizeof(body)));
    assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
    assert_dropped(fd);
  }
}

/* Every request message cut short at every byte.  A cut on a field
 * boundary is a valid, shorter message (answered, connection kept); any
 * other cut must be a protocol error that drops the connection. */
static void test_truncated_protobuf(void **state) {
  struct fx *f = *state;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  Gshm__OpenRequest op = GSHM__OPEN_REQUEST__INIT;
  Gshm__MapReport mr = GSHM__MAP_REPORT__INIT;
  Gshm__StatRequest sr = GSHM__STAT_REQUEST__INIT;
  Gshm__ListRequest lr = GSHM__LIST_REQUEST__INIT;
  char *uuids[] = {"GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaa"};
  struct {
    uint16_t type;
    const ProtobufCMessage *m;
  } msgs[] = {{GSHM_WIRE_CREATE, &cr.base}, {GSHM_WIRE_OPEN, &op.base},
              {GSHM_WIRE_MAP_REPORT, &mr.base}, {GSHM_WIRE_STAT, &sr.base},
              {GSHM_WIRE_LIST_SEGMENTS, &lr.base}};
  uint8_t body[512], pkt[600];
  int errors = 0, answered = 0;

  cr.name = "truncated/segment/name";
  cr.size = 123456789;
  cr.location = "host";
  cr.mode = 0640;
  op.name = "kept";
  op.access = GSHM__ACCESS__ACCESS_READ;
  op.segment_id = 0x123456789ull;
  op.generation = 77;
  mr.lease_id = 0xfffffffffull;
  mr.n_device_uuids = 2;
  mr.device_uuids = uuids;
  mr.unmapped = 1;
  sr.name = "kept";
  sr.segment_id = 1ull << 40;
  lr.after = 1ull << 50;
  lr.limit = 1000;
  for (size_t k = 0; k < sizeof(msgs) / sizeof(msgs[0]); k++) {
    size_t full = protobuf_c_message_pack(msgs[k].m, body);
    for (size_t cut = 1; cut < full; cut++) {
      int fd = raw_connect(f), st;
      hello(fd);
      put_header(pkt, GSHM_PROTO_MAJOR, msgs[k].type, 7, (uint32_t)cut);
      memcpy(pkt + GSHM_WIRE_HEADER_SIZE, body, cut);
      assert_int_equal(send(fd, pkt, GSHM_WIRE_HEADER_SIZE + cut, 0),
                       (ssize_t)(GSHM_WIRE_HEADER_SIZE + cut));
      st = read_reply(fd, NULL, NULL, 0);
      if (st == GSHM__STATUS__STATUS_PROTOCOL_ERROR) {
        errors++;
        assert_dropped(fd);
        continue;
      }
      answered++;
      assert_true(st > 0);
      /* Still usable: a status request works on the same connection. */
      assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_STATUS, 8, NULL, -1), 0);
      assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_OK);
      close(fd);
    }
  }
  print_message("    truncations: %d protocol errors, %d valid shorter messages\n", errors,
                answered);
  assert_true(errors > 0);
}

/* Every request before hello, replies and events from the client, a
 * second hello. */
/* gshmd's CPU time so far (utime + stime), in clock ticks. */
static long cpu_ticks(pid_t pid) {
  char path[64], buf[1024], *p;
  unsigned long ut = 0, st = 0;
  ssize_t n;
  int fd;

  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  assert_true((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
  n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  assert_true(n > 0);
  buf[n] = '\0';
  assert_non_null(p = strrchr(buf, ')')); /* (the name may hold blanks) */
  assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                   2);
  return (long)(ut + st);
}

/* gshmd's CPU ticks for 2,000 STATs of "kept" whose 64 KiB bodies hold,
 * after the name, `fields` unknown fields (1: one long one); *status_out:
 * the status of every reply (-1: they differ). */
static long stat_padded(struct fx *f, int fields, int *status_out) {
  static uint8_t pkt[GSHM_WIRE_MAX_PACKET];
  uint8_t *b = pkt + GSHM_WIRE_HEADER_SIZE;
  size_t len = 0, room = GSHM_WIRE_MAX_PACKET - GSHM_WIRE_HEADER_SIZE;
  int fd = raw_connect(f);
  long t0;

  hello(fd);
  b[len++] = 0x0a; /* name = "kept" */
  b[len++] = 4;
  memcpy(b + len, "kept", 4);
  len += 4;
  if (fields == 1) { /* field 1000, length-delimited, the rest of the packet */
    size_t n = room - len - 5;
    b[len++] = 0xc2;
    b[len++] = 0x3e;
    b[len++] = (uint8_t)(0x80 | (n & 0x7f)); /* (a 3-byte varint: n < 2^21) */
    b[len++] = (uint8_t)(0x80 | ((n >> 7) & 0x7f));
    b[len++] = (uint8_t)(n >> 14);
    memset(b + len, 0, n);
    len += n;
  } else {
    for (int i = 0; i < fields && len + 3 <= room; i++) { /* field 1000, varint 0 */
      b[len++] = 0xc0;
      b[len++] = 0x3e;
      b[len++] = 0;
    }
  }
  put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_STAT, 9, (uint32_t)len);
  t0 = cpu_ticks(f->h.sp.pid);
  for (int i = 0; i < 2000; i++) {
    int st;
    assert_int_equal(send(fd, pkt, GSHM_WIRE_HEADER_SIZE + len, 0),
                     (ssize_t)(GSHM_WIRE_HEADER_SIZE + len));
    st = read_reply(fd, NULL, NULL, 0);
    *status_out = i == 0 || st == *status_out ? st : -1;
  }
  t0 = cpu_ticks(f->h.sp.pid) - t0;
  close(fd);
  return t0;
}

/* A request of a few fields padded to 64 KiB with 3-byte unknown fields
 * (21,800 of them) cost gshmd 0.67 ms to unpack (protobuf-c keeps each
 * one), 60 times a request's whole cost and 130 times its bytes' (one long
 * unknown field): one user pipelining them from many connections held
 * everyone's requests.  A body of more than GSHM_WIRE_REQUEST_FIELDS_MAX
 * fields is refused before it is unpacked; one of as many bytes in a few
 * fields is still served.  Failed before: STATUS_OK, 268 ticks (2.7 s of
 * CPU) against 3 for the long field; 6 against 2 now. */
static void test_many_fields(void **state) {
  struct fx *f = *state;
  int one_st, many_st, edge_st;
  long one, many, edge;

  one = stat_padded(f, 1, &one_st);
  edge = stat_padded(f, GSHM_WIRE_REQUEST_FIELDS_MAX - 1, &edge_st); /* (with the name: 64) */
  many = stat_padded(f, 30000, &many_st);
  print_message("    gshmd CPU for 2,000 STATs of 64 KiB: %ld ticks in 2 fields, %ld in about "
                "21,800 (refused); %ld for 2,000 of %u fields\n",
                one, many, edge, GSHM_WIRE_REQUEST_FIELDS_MAX);
  assert_true(many <= 3 * one + 25);
  assert_int_equal(one_st, GSHM__STATUS__STATUS_OK);
  assert_int_equal(edge_st, GSHM__STATUS__STATUS_OK);
  assert_int_equal(many_st, GSHM__STATUS__STATUS_INVALID_ARGUMENT);
  assert_status_fast(f, "after 2,000 padded requests");
}

static void test_out_of_order(void **state) {
  struct fx *f = *state;
  char msg[256];
  int fd;

  for (uint16_t t = GSHM_WIRE_CREATE; t <= GSHM_WIRE_TYPE_MAX; t++) {
    fd = raw_connect(f);
    assert_int_equal(gshm__wire_send(fd, t, t, NULL, -1), 0);
    assert_int_equal(read_reply(fd, NULL, msg, sizeof(msg)), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
    assert_non_null(strstr(msg, "hello"));
    assert_dropped(fd);
  }
  {
    static const uint16_t bogus[] = {GSHM_WIRE_REPLY | GSHM_WIRE_HELLO, GSHM_WIRE_EVENT,
                                     GSHM_WIRE_REPLY, 0, GSHM_WIRE_TYPE_MAX + 1, 0xffff};
    for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
      for (int hello_first = 0; hello_first < 2; hello_first++) {
        fd = raw_connect(f);
        if (hello_first)
          hello(fd);
        assert_int_equal(gshm__wire_send(fd, bogus[i], 9, NULL, -1), 0);
        assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
        assert_dropped(fd);
      }
    }
  }
  fd = raw_connect(f);
  hello(fd);
  {
    Gshm__Hello m = GSHM__HELLO__INIT;
    m.major = GSHM_PROTO_MAJOR;
    m.client_name = "again";
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 2, &m.base, -1), 0);
    assert_int_equal(read_reply(fd, NULL, msg, sizeof(msg)), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
    assert_non_null(strstr(msg, "hello"));
    assert_dropped(fd);
  }
  /* A close of a lease this connection never had, an open by a made-up
   * id and generation, and a mapping report for someone else's lease:
   * answered, nothing given away. */
  fd = raw_connect(f);
  hello(fd);
  {
    Gshm__CloseRequest c = GSHM__CLOSE_REQUEST__INIT;
    Gshm__OpenRequest o = GSHM__OPEN_REQUEST__INIT;
    Gshm__MapReport mr = GSHM__MAP_REPORT__INIT;
    c.lease_id = 1; /* the bystander's lease on "kept" */
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_CLOSE, 3, &c.base, -1), 0);
    assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_NOT_FOUND);
    mr.lease_id = 1;
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_MAP_REPORT, 4, &mr.base, -1), 0);
    assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_NOT_FOUND);
    o.segment_id = 999999;
    o.generation = 1;
    o.access = GSHM__ACCESS__ACCESS_READ_WRITE;
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_OPEN, 5, &o.base, -1), 0);
    {
      int st = read_reply(fd, NULL, NULL, 0);
      assert_true(st == GSHM__STATUS__STATUS_NOT_FOUND || st == GSHM__STATUS__STATUS_STALE);
    }
    close(fd);
  }
}

/* Sends n copies of each fd in one sendmsg, split over ncmsg cmsgs. */
static ssize_t send_with_fds(int sock, const void *pkt, size_t len, const int *fds, int n, int ncmsg) {
  static union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * 256) * 4];
  } ctl;
  struct iovec iov = {.iov_base = (void *)pkt, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf};
  struct cmsghdr *c;
  int per = n / ncmsg, last = n - per * (ncmsg - 1), done = 0;

  memset(&ctl, 0, sizeof(ctl));
  mh.msg_controllen = 0;
  for (int k = 0; k < ncmsg; k++)
    mh.msg_controllen += CMSG_SPACE(sizeof(int) * (size_t)(k == ncmsg - 1 ? last : per));
  c = CMSG_FIRSTHDR(&mh);
  for (int k = 0; k < ncmsg; k++) {
    int cnt = k == ncmsg - 1 ? last : per;
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)cnt);
    memcpy(CMSG_DATA(c), fds + done, sizeof(int) * (size_t)cnt);
    done += cnt;
    c = CMSG_NXTHDR(&mh, c);
  }
  return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

/* 200 fds in one packet (and 253, the most one message carries, and fds
 * split over several cmsgs), on a valid request after hello: refused,
 * dropped, and every fd closed by gshmd.  The fds are pipe write ends:
 * the read end sees EOF only once gshmd closed every copy it got. */
static void test_many_fds(void **state) {
  struct fx *f = *state;
  static const struct {
    int n, ncmsg;
    bool hello_first;
  } cases[] = {{200, 1, true}, {200, 1, false}, {253, 1, true}, {200, 4, true}, {1, 1, true}};
  uint8_t pkt[64];
  int p[2];

  put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_STATUS, 2, 0);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int fds[256], fd = raw_connect(f), st;
    char b;
    struct pollfd pfd;

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    for (int k = 0; k < cases[i].n; k++)
      fds[k] = p[1];
    if (cases[i].hello_first)
      hello(fd);
    if (send_with_fds(fd, pkt, GSHM_WIRE_HEADER_SIZE, fds, cases[i].n, cases[i].ncmsg) < 0) {
      /* refused by the kernel (SO_PASSRIGHTS off, Linux 6.16+): never ours */
      assert_int_equal(errno, EPERM);
      close(fd);
      close(p[0]);
      close(p[1]);
      continue;
    }
    close(p[1]);
    st = read_reply(fd, NULL, NULL, 0);
    assert_true(st == GSHM__STATUS__STATUS_PROTOCOL_ERROR || st == GSHM__STATUS__STATUS_TOO_BIG);
    assert_dropped(fd);
    pfd.fd = p[0];
    pfd.events = POLLIN;
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    assert_int_equal(read(p[0], &b, 1), 0); /* EOF: gshmd kept no copy */
    close(p[0]);
  }
  /* An fd that is itself a socket carrying fds (the kernel's in-flight
   * garbage collection case): still closed. */
  {
    int sp[2], inner[2], fd = raw_connect(f);
    char b;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
    assert_int_equal(pipe2(inner, O_CLOEXEC), 0);
    assert_int_equal(send_with_fds(sp[0], "x", 1, &inner[1], 1, 1), 1);
    close(inner[1]);
    hello(fd);
    if (send_with_fds(fd, pkt, GSHM_WIRE_HEADER_SIZE, &sp[1], 1, 1) < 0) {
      assert_int_equal(errno, EPERM); /* refused by the kernel */
      close(fd);
    } else {
      close(sp[1]);
      close(sp[0]);
      sp[0] = sp[1] = -1;
      assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
      assert_dropped(fd);
    }
    if (sp[0] >= 0) {
      close(sp[1]);
      close(sp[0]);
    }
    {
      struct pollfd pfd = {.fd = inner[0], .events = POLLIN};
      assert_int_equal(poll(&pfd, 1, 5000), 1);
      assert_int_equal(read(inner[0], &b, 1), 0);
    }
    close(inner[0]);
  }
}

/* 1,000 connections held idle (half said hello) while others are served. */
static void test_thousand_idle_connections(void **state) {
  struct fx *f = *state;
  enum { N = 1000 };
  static int fds[N];
  gshm_status_info_t st;
  int during_fds;

  for (int i = 0; i < N; i++) {
    fds[i] = raw_connect(f);
    if (i % 2)
      hello(fds[i]);
  }
  assert_status_fast(f, "with 1000 idle connections");
  during_fds = harness_fd_count(f->h.sp.pid);
  print_message("    gshmd fds with 1000 connections: %d\n", during_fds);
  assert_true(during_fds >= f->baseline_fds + N / 2);
  assert_int_equal(gshm_status(f->bystander, &st), 0);
  assert_true(st.clients >= N / 2 + 1);
  /* Existing clients keep working: read the kept segment through a new
   * lease while they are all there. */
  {
    gshm_segment_t *s;
    static unsigned char buf[KEPT_BYTES];
    assert_int_equal(gshm_open(f->bystander, "kept", GSHM_ACCESS_READ, &s), 0);
    assert_int_equal(gshm_read(s, 0, buf, sizeof(buf)), 0);
    assert_memory_equal(buf, f->want, sizeof(buf));
    gshm_close(s);
  }
  for (int i = 0; i < N; i++)
    close(fds[i]);
}

/* Slowloris on SEQPACKET: one byte every 100 ms for 3 s, each its own
 * packet and so each a protocol error (a fresh connection for each, and
 * one connection that keeps sending after its first byte was refused),
 * and a client that connects and sends nothing, which gshmd must drop
 * after limits.partial_timeout_ms while serving everyone else. */
static void test_slowloris(void **state) {
  struct fx *f = *state;
  static const char header[] = "GSHM\x01\x00\x01\x00";
  int silent = raw_connect(f), stubborn = raw_connect(f), stubborn_sent = 0;
  double t0 = now_ms(), dropped_at = -1, worst = 0;
  char b;

  for (int i = 0; i < 30; i++) {
    int fd = raw_connect(f);
    assert_int_equal(send(fd, header + i % 8, 1, 0), 1);
    assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
    assert_dropped(fd);
    if (send(stubborn, header + i % 8, 1, MSG_NOSIGNAL) == 1)
      stubborn_sent++;
    if (dropped_at < 0 && recv(silent, &b, 1, MSG_DONTWAIT) == 0)
      dropped_at = now_ms() - t0;
    if (i % 5 == 0) {
      double ms = status_within_deadline(f);
      if (ms > worst)
        worst = ms;
    }
    usleep(100000);
  }
  print_message("    slowloris: 30 one-byte packets refused; the stubborn connection got %d "
                "byte(s) in before it was closed; worst status %.2f ms\n",
                stubborn_sent, worst);
  assert_true(worst < STATUS_DEADLINE_MS);
  assert_true(stubborn_sent >= 1 && stubborn_sent < 30);
  assert_int_equal(read_reply(stubborn, NULL, NULL, 0), GSHM__STATUS__STATUS_PROTOCOL_ERROR);
  assert_true(recv(stubborn, &b, 1, MSG_DONTWAIT) <= 0);
  close(stubborn);

  /* The silent client: gshmd drops it once limits.partial_timeout_ms
   * passes without a hello (checked above every 100 ms; wait here in case
   * the loop above was quicker). */
  while (dropped_at < 0 && now_ms() - t0 < 3 * PARTIAL_TIMEOUT_MS + 3000) {
    struct pollfd p = {.fd = silent, .events = POLLIN};
    if (poll(&p, 1, 100) == 1 && recv(silent, &b, 1, MSG_DONTWAIT) <= 0) {
      dropped_at = now_ms() - t0;
      break;
    }
  }
  print_message("    silent client dropped after %.0f ms (partial_timeout_ms=%d)\n", dropped_at,
                PARTIAL_TIMEOUT_MS);
  assert_true(dropped_at >= PARTIAL_TIMEOUT_MS - 50);
  assert_true(dropped_at < 3 * PARTIAL_TIMEOUT_MS);
  close(silent);
}

/* A client that sends stat requests and never reads the replies: gshmd
 * stops reading it once its replies back up (the socket buffers fill and
 * the client's sends block), does not grow without bound, and serves
 * everyone else.  When the client finally reads, every request it got in
 * is answered, in order. */
static void test_never_reads_replies(void **state) {
  struct fx *f = *state;
  Gshm__StatRequest m = GSHM__STAT_REQUEST__INIT;
  int fd = raw_connect_flags(f, SOCK_NONBLOCK);
  uint32_t sent = 0, got = 0;
  long rss_peak = 0;
  double worst = 0;

  m.name = "kept";
  {
    Gshm__Hello h = GSHM__HELLO__INIT;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    h.major = GSHM_PROTO_MAJOR;
    h.client_name = "deaf";
    assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &h.base, -1), 0);
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(read_reply(fd, NULL, NULL, 0), GSHM__STATUS__STATUS_OK);
  }
  /* Send until the socket refuses more (gshmd stopped reading). */
  for (int stalls = 0; stalls < 20 && sent < 1000000;) {
    int r = gshm__wire_send(fd, GSHM_WIRE_STAT, sent + 2, &m.base, -1);
    if (r == -EAGAIN) {
      stalls++;
      usleep(20000); /* give gshmd a chance to read more, if it would */
      continue;
    }
    assert_int_equal(r, 0);
    sent++;
    if (sent % 2000 == 0) {
      long rss = harness_rss_kib(f->h.sp.pid);
      if (rss > rss_peak)
        rss_peak = rss;
    }
  }
  assert_true(sent < 1000000); /* it did stop reading */
  for (int i = 0; i < 5; i++) {
    double ms = status_within_deadline(f);
    if (ms > worst)
      worst = ms;
  }
  {
    long rss = harness_rss_kib(f->h.sp.pid);
    if (rss > rss_peak)
      rss_peak = rss;
  }
  print_message("    deaf client: %u requests accepted before gshmd stopped reading; gshmd rss "
                "peak %ld KiB (baseline %ld); worst status %.2f ms\n",
                sent, rss_peak, f->baseline_rss, worst);
  assert_true(worst < STATUS_DEADLINE_MS);
  if (RSS_CHECKED)
    assert_true(rss_peak <= f->baseline_rss + RSS_SLACK_KIB);
  /* Now read: every accepted request is answered once, in order. */
  {
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  while (got < sent) {
    uint32_t id = 0;
    int st = read_reply(fd, &id, NULL, 0);
    if (st < 0)
      break;
    assert_int_equal(st, GSHM__STATUS__STATUS_OK);
    assert_int_equal(id, got + 2);
    got++;
  }
  print_message("    deaf client then read %u of %u replies\n", got, sent);
  assert_int_equal(got, sent);
  close(fd);
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The file whose presence holds gshmd's reaper thread before each punch
 * step (daemon/host_reap.h GSHMD_TEST_REAP_HOLD). */
static char reap_hold[64];

/* setup, with gshmd's reaper held while reap_hold exists. */
static int setup_reap_hold(void **state) {
  int r;

  snprintf(reap_hold, sizeof(reap_hold), "/tmp/gshm-reap-hold.%d", (int)getpid());
  setenv("GSHMD_TEST_REAP_HOLD", reap_hold, 1);
  r = setup(state);
  unsetenv("GSHMD_TEST_REAP_HOLD");
  return r;
}

static int teardown_reap_hold(void **state) {
  unlink(reap_hold); /* (let go, where the test failed holding it) */
  return teardown(state);
}

/* A client frees a filled 1 GiB host segment (unlink, no lease left)
 * while keeping a copy of its fd, gshmd's reaper thread held: gshmd
 * answers the unlink without punching the pages out on its loop
 * (daemon/host_reap.c): the kept fd holds every page at the reply; let
 * go, the reaper empties it within 10 s.  Before, the punch (about 46 ms
 * a GB) ran on the loop: the unlink of a segment of hundreds of GB held
 * every client's requests past systemd's watchdog (the session 26
 * attacker's review measured 4 GiB: 0.18 s); and this test hoped the
 * reaper had not finished its 46 ms before it looked. */
static void test_big_free_off_the_loop(void **state) {
  struct fx *f = *state;
  const uint64_t size = 1ull << 30;
  gshm_segment_t *s;
  struct stat sb;
  int64_t t0, punch_ns, unlink_ns;
  long long filled, at_reply;
  int fd, kept;

  fd = memfd_create("anchor", MFD_CLOEXEC);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  assert_int_equal(fallocate(fd, 0, 0, (off_t)size), 0);
  t0 = mono_ns();
  assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)size), 0);
  punch_ns = mono_ns() - t0;
  close(fd);

  assert_int_equal(gshm_create(f->bystander, "big", size, NULL, 0600, 0, &s), 0);
  kept = fcntl(gshm_segment_fd(s), F_DUPFD_CLOEXEC, 3);
  assert_true(kept >= 0);
  assert_int_equal(fallocate(kept, 0, 0, (off_t)size), 0); /* every page made */
  assert_int_equal(fstat(kept, &sb), 0);
  filled = (long long)sb.st_blocks * 512;
  assert_true((uint64_t)filled >= size);
  assert_int_equal(gshm_close(s), 0);
  fd = open(reap_hold, O_WRONLY | O_CREAT | O_CLOEXEC, 0600); /* the reaper held */
  assert_true(fd >= 0);
  close(fd);
  t0 = mono_ns();
  assert_int_equal(gshm_unlink(f->bystander, "big"), 0); /* the free */
  unlink_ns = mono_ns() - t0;
  assert_int_equal(fstat(kept, &sb), 0);
  at_reply = (long long)sb.st_blocks * 512;
  assert_int_equal(unlink(reap_hold), 0); /* let go */
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(fstat(kept, &sb), 0);
    if (!sb.st_blocks)
      break;
    usleep(10000);
  }
  print_message("    1 GiB: this process's own punch %.1f ms; gshmd's unlink (the free) %.1f ms; "
                "the kept fd holds %lld bytes at its reply (reaper held), %lld after\n",
                (double)punch_ns / 1e6, (double)unlink_ns / 1e6, at_reply,
                (long long)sb.st_blocks * 512);
  close(kept);
  assert_int_equal(sb.st_blocks, 0);
  /* Nothing punched on the loop: a punch there ends before the reply.
   * Not a comparison of times, which a loaded 2-core machine can upset;
   * the times are printed. */
  assert_int_equal(at_reply, filled);
}

/* Issue 15 item 5: a client creates a host segment, fills it, keeps its
 * own copy of the memfd, closes its lease and unlinks the segment, 50
 * times over.  gshmd freed every segment (its quota counts 0 bytes), so
 * the kept fds must hold no memory: gshmd punched their pages out. */
static void test_kept_memfd_after_free(void **state) {
  struct fx *f = *state;
  enum { ROUNDS = 50, SIZE = 64 * 1024 };
  static unsigned char fill[SIZE];
  int kept[ROUNDS];
  long blocks = 0;
  gshm_status_info_t st;

  memset(fill, 0xa5, sizeof(fill));
  for (int i = 0; i < ROUNDS; i++) {
    gshm_segment_t *s;
    struct stat sb;
    assert_int_equal(gshm_create(f->bystander, "stray", SIZE, NULL, 0600, 0, &s), 0);
    assert_int_equal(gshm_write(s, 0, fill, sizeof(fill)), 0);
    kept[i] = fcntl(gshm_segment_fd(s), F_DUPFD_CLOEXEC, 3);
    assert_true(kept[i] >= 0);
    assert_int_equal(fstat(kept[i], &sb), 0);
    assert_true(sb.st_blocks * 512 >= SIZE); /* filled: the pages exist */
    assert_int_equal(gshm_close(s), 0);
    assert_int_equal(gshm_unlink(f->bystander, "stray"), 0);
  }
  assert_int_equal(gshm_status(f->bystander, &st), 0);
  for (int i = 0; i < ROUNDS; i++) {
    struct stat sb;
    unsigned char b = 1;
    assert_int_equal(fstat(kept[i], &sb), 0);
    blocks += sb.st_blocks;
    assert_int_equal(pread(kept[i], &b, 1, SIZE / 2), 1);
    assert_int_equal(b, 0); /* reads as a hole */
    close(kept[i]);
  }
  print_message("    %d kept memfds of freed segments hold %ld bytes (gshmd counts %" PRIu64
                " bytes in %u segments)\n",
                ROUNDS, blocks * 512, st.bytes, st.segments);
  assert_int_equal(blocks, 0);
  assert_int_equal(st.segments, 1); /* only "kept" */
}

/* Issue 15 item 4, at start: gshmd raises its soft fd limit to the hard
 * one, and says (STATUS=) when even that is below what its configured
 * maximums may need. */
static void test_fd_limit_at_start(void **state) {
  struct fx *f = *state;
  struct rlimit mine, got;
  struct harness g;

  (void)f;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max <= 256)
    skip();
  {
    struct rlimit low = {256, mine.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0); /* gshmd inherits 256 */
  }
  /* (16777216 segments are refused at start: their fd store could not be
   * handed back, LISTEN_FDNAMES past execve's limit; 2000000 can) */
  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "limits.max_segments=16777216",
                                                           NULL}),
                   -ECHILD);
  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "limits.max_segments=2000000",
                                                           NULL}),
                   0);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &mine), 0);
  assert_int_equal(prlimit(g.sp.pid, RLIMIT_NOFILE, NULL, &got), 0);
  gshm__spawn_poll(&g.sp, 100);
  print_message("    gshmd started at 256 fds: now %llu (hard %llu); STATUS=%s\n",
                (unsigned long long)got.rlim_cur, (unsigned long long)got.rlim_max, g.sp.status);
  assert_int_equal(got.rlim_cur, got.rlim_max);
  if (got.rlim_max != RLIM_INFINITY && got.rlim_max < 2 * 2000000 + 4096 + 64)
    assert_non_null(strstr(g.sp.status, "fd limit"));
  assert_int_equal(harness_stop(&g), 0);
  /* limits that fit: no warning */
  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "limits.max_segments=16",
                                                           "--set", "limits.max_connections=16",
                                                           NULL}),
                   0);
  gshm__spawn_poll(&g.sp, 100);
  assert_null(strstr(g.sp.status, "fd limit"));
  assert_int_equal(harness_stop(&g), 0);
  setenv("GSHM_SOCKET", f->h.socket_path, 1);
}

/* Issue 15 item 4, at run time: gshmd at its fd limit with a connection
 * waiting in the listen backlog.  It must not spin on the listener (it
 * did: 100% CPU and a log line per turn); once an fd is free it accepts
 * the waiting client and answers its hello. */
static void test_accept_at_fd_limit(void **state) {
  struct fx *f = *state;
  pid_t pid = f->h.sp.pid;
  struct rlimit orig, tight;
  int held[2], held_ok[2], waiting, e0, e1;
  uint64_t t0 = 0, t1 = 0;

  int served_early;

  assert_int_equal(prlimit(pid, RLIMIT_NOFILE, NULL, &orig), 0);
  /* The limit bounds fd numbers: room for exactly two more, whatever
   * holes gshmd's fd table has. */
  tight.rlim_cur = (rlim_t)harness_lowest_free_fd(pid, 2);
  tight.rlim_max = orig.rlim_max;
  assert_int_equal(prlimit(pid, RLIMIT_NOFILE, &tight, NULL), 0);
  /* From here until the limit is back, a failed check would leave gshmd
   * unable to accept the teardown's probe: measure first, check after. */
  for (int i = 0; i < 2; i++) {
    Gshm__Hello m = GSHM__HELLO__INIT;
    m.major = GSHM_PROTO_MAJOR;
    m.client_name = "held";
    held[i] = raw_connect(f);
    gshm__wire_send(held[i], GSHM_WIRE_HELLO, 1, &m.base, -1);
    held_ok[i] = read_reply(held[i], NULL, NULL, 0);
  }
  waiting = raw_connect(f); /* in the backlog: gshmd has no fd for it */
  {
    Gshm__Hello m = GSHM__HELLO__INIT;
    m.major = GSHM_PROTO_MAJOR;
    m.client_name = "waiting";
    gshm__wire_send(waiting, GSHM_WIRE_HELLO, 1, &m.base, -1);
  }
  usleep(200 * 1000);
  e0 = gshm__proc_cpu_ticks(pid, &t0);
  usleep(1000 * 1000);
  e1 = gshm__proc_cpu_ticks(pid, &t1);
  {
    struct pollfd p = {.fd = waiting, .events = POLLIN};
    served_early = poll(&p, 1, 0);
  }
  assert_int_equal(prlimit(pid, RLIMIT_NOFILE, &orig, NULL), 0);
  print_message("    at the fd limit with a client waiting: gshmd used %" PRIu64
                " of %ld ticks in 1 s\n",
                t1 - t0, sysconf(_SC_CLK_TCK));
  assert_int_equal(held_ok[0], GSHM__STATUS__STATUS_OK);
  assert_int_equal(held_ok[1], GSHM__STATUS__STATUS_OK);
  assert_int_equal(e0, 0);
  assert_int_equal(e1, 0);
  assert_true(t1 - t0 < (uint64_t)sysconf(_SC_CLK_TCK) / 5); /* under 20% of a CPU */
  assert_int_equal(served_early, 0); /* it had no fd for the waiting client */
  close(held[0]); /* frees an fd in gshmd */
  {
    double t = now_ms();
    assert_int_equal(read_reply(waiting, NULL, NULL, 0), GSHM__STATUS__STATUS_OK);
    print_message("    the waiting client was answered %.0f ms after an fd was freed\n",
                  now_ms() - t);
  }
  close(held[1]);
  close(waiting);
}

/* A TCP socket whose close() blocks: SO_LINGER on, linger_s seconds,
 * and a send buffer full of data its peer (*peer_out, kept open) never
 * reads.  -1 on failure (no cmocka assert: forked attackers use it). */
static int lingering_socket_try(int linger_s, int *peer_out) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sa);
  struct linger lg = {.l_onoff = 1, .l_linger = linger_s};
  static char junk[65536];
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), a = -1, small = 4096;

  *peer_out = -1;
  if (l < 0)
    return -1;
  setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)); /* the peer inherits it */
  if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) || getsockname(l, (struct sockaddr *)&sa, &len) ||
      listen(l, 1) || (a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
      connect(a, (struct sockaddr *)&sa, sizeof(sa)) ||
      (*peer_out = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0 ||
      setsockopt(a, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg))) {
    if (a >= 0)
      close(a);
    close(l);
    return -1;
  }
  close(l);
  while (send(a, junk, sizeof(junk), MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
    ;
  return a;
}

static int lingering_socket(int *peer_out) {
  int a = lingering_socket_try(5, peer_out);
  assert_true(a >= 0);
  return a;
}

/* Makes gshmd stop reading connection c (hello said, non-blocking): stat
 * requests whose replies c never reads, until one stays unread by gshmd
 * (SIOCOUTQ: bytes gshmd has not taken yet).  Returns how many replies c
 * owes itself. */
static uint32_t stall(int c) {
  Gshm__StatRequest m = GSHM__STAT_REQUEST__INIT;
  uint32_t sent = 0;
  int outq = 0;

  m.name = "kept";
  while (sent < 100000) {
    if (gshm__wire_send(c, GSHM_WIRE_STAT, sent + 2, &m.base, -1) == 0)
      sent++;
    usleep(2000);
    if (ioctl(c, SIOCOUTQ, &outq) == 0 && outq > 0) {
      usleep(20000);
      if (ioctl(c, SIOCOUTQ, &outq) == 0 && outq > 0)
        break; /* still unread after 20 ms: gshmd stopped reading c */
    }
  }
  return sent;
}

/* Sends gshmd (at socket_path) 10 lingering sockets while a bystander's
 * status requests are timed; returns the worst latency.  Each lingering
 * socket travels inside a socket pair's queue, on a connection that gshmd
 * has stopped reading (stall), so that this process has dropped every
 * reference before gshmd gets the packet: gshmd's close is the last one,
 * the one that lingers.  Even attacks leave the packet unread and close
 * the connection (gshmd closes a socket whose queue holds the fd); odd
 * ones read the replies, so that gshmd receives the fd and closes it.
 * *refused_out counts sends the kernel refused (SO_PASSRIGHTS), *late_out
 * the probes (30) answered in 100 ms or more. */
static double lingering_attack(const char *socket_path, int *refused_out, int *late_out) {
  uint8_t pkt[GSHM_WIRE_HEADER_SIZE];
  int peers[10], npeers = 0;
  double worst = 0;
  gshm_client_t *probe;

  *refused_out = *late_out = 0;
  put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_STATUS, 1, 0);
  assert_int_equal(gshm_connect(socket_path, "probe", &probe), 0);
  while (npeers < 10) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), sp[2];
    int a = lingering_socket(&peers[npeers]);
    uint32_t owed;

    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
    assert_int_equal(send_with_fds(sp[0], "x", 1, &a, 1, 1), 1);
    close(a);
    close(sp[0]);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    hello(c);
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
    owed = stall(c);
    if (send_with_fds(c, pkt, sizeof(pkt), &sp[1], 1, 1) < 0) {
      assert_int_equal(errno, EPERM);
      (*refused_out)++;
      close(peers[npeers]); /* ours to close: a reset, so no lingering */
      peers[npeers] = -1;
    }
    close(sp[1]); /* gshmd holds the last reference now, if it got it */
    if (npeers % 2) {
      struct pollfd p = {.fd = c, .events = POLLIN};
      for (uint32_t got = 0; got < owed + 1 && poll(&p, 1, 2000) == 1;)
        got += read_reply(c, NULL, NULL, 0) >= 0;
    }
    close(c);
    npeers++;
    /* Three probes 100 ms apart, each timed once (a retry would hide a
     * stalled loop behind its second, quick answer). */
    for (int k = 0; k < 3; k++) {
      gshm_status_info_t st;
      double t = now_ms(), ms;
      assert_int_equal(gshm_status(probe, &st), 0);
      ms = now_ms() - t;
      if (ms > worst)
        worst = ms;
      *late_out += ms >= STATUS_DEADLINE_MS;
      usleep(100 * 1000);
    }
  }
  gshm_disconnect(probe);
  for (int i = 0; i < npeers; i++)
    if (peers[i] >= 0)
      close(peers[i]); /* lets the lingering closes finish */
  return worst;
}

/* Issue 15 item 1: gshmd never blocks on a client's fd.  Against the
 * fixture (no fds expected: the kernel refuses them where it can) and
 * against a gshmd that accepts one fd per packet (the fd reaches gshmd
 * and is closed off the loop), another client's requests are answered
 * within 100 ms throughout the attack. */
static void test_lingering_socket_fd(void **state) {
  struct fx *f = *state;
  struct harness g;
  double worst;
  int refused, late;

  /* On a loaded CI machine one probe in 30 may lose the CPU for tens of
   * milliseconds; a stalled loop makes probes wait for the linger time
   * (5 s) instead. */
  worst = lingering_attack(f->h.socket_path, &refused, &late);
  print_message("    lingering sockets, no fds expected: worst status %.2f ms (%d of 30 late), %d "
                "refused by the kernel\n",
                worst, late, refused);
  assert_true(late <= 1 && worst < 10 * STATUS_DEADLINE_MS);
  assert_int_equal(harness_start(&g, (const char *const[]){"--set",
                                                           "limits.max_fds_per_connection=1",
                                                           NULL}),
                   0);
  worst = lingering_attack(g.socket_path, &refused, &late);
  print_message("    lingering sockets, one fd allowed: worst status %.2f ms (%d of 30 late), %d "
                "refused\n",
                worst, late, refused);
  assert_int_equal(refused, 0);
  assert_true(late <= 1 && worst < 10 * STATUS_DEADLINE_MS);
  assert_status_fast(f, "after the attack");
  assert_int_equal(harness_stop(&g), 0);
  setenv("GSHM_SOCKET", f->h.socket_path, 1);
}

#define LINGERERS 20 /* more than libuv's pool has threads (16) */
#define MAX_SENT (10 * LINGERERS)

static void on_alarm(int sig) { (void)sig; /* (only interrupts a lingering close) */ }

/* Closes fd; true when that took under 10 ms, i.e. it was not the last
 * reference of a socket whose close lingers: such a close is cut short
 * by SIGALRM after 20 ms (a linger wait is interruptible; the fd is
 * released all the same, the socket orphaned in the kernel).  The timer
 * repeats every 20 ms until close returns: a one-shot alarm that fired
 * before close began to wait (this process descheduled for 20 ms between
 * setitimer and close, as under ASan on 2 busy cores) left the close to
 * linger 100,000 s, and test_refused_connection_fds's attacker hung. */
static bool closed_at_once(int fd) {
  struct itimerval it = {.it_interval = {0, 20 * 1000}, .it_value = {0, 20 * 1000}};
  struct itimerval off = {{0, 0}, {0, 0}};
  struct timespec t0, t1;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  setitimer(ITIMER_REAL, &it, NULL);
  close(fd);
  setitimer(ITIMER_REAL, &off, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (t1.tv_sec - t0.tv_sec) * 1000000000ll + (t1.tv_nsec - t0.tv_nsec) < 10 * 1000000ll;
}

/* gshmd's threads named comm (/proc/PID/task/N/comm), or -1. */
static int threads_named(pid_t pid, const char *comm) {
  char path[320], name[32];
  struct dirent *e;
  DIR *d;
  int n = 0;

  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  if (!(d = opendir(path)))
    return -1;
  while ((e = readdir(d))) {
    FILE *f;
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
    if ((f = fopen(path, "r"))) {
      n += fgets(name, sizeof(name), f) && !strncmp(name, comm, strlen(comm));
      fclose(f);
    }
  }
  closedir(d);
  return n;
}

/* Lingering closes take no shared thread (the attack2 review's): a client
 * sends LINGERERS TCP sockets that linger 100,000 s in close() (each
 * inside a socketpair's queue, so that gshmd's close drops the last
 * reference), keeping their peers open; then 50 connections open and
 * close, and give gshmd's fds back at once.  When these closes ran on
 * libuv's 16 threads, the lingerers held them all and every later
 * connection's fd leaked (until accept stopped for everyone).
 *
 * Whose close of the socketpair's end is the last is a race: gshmd may
 * receive and close its copy before the test closes its own, and then the
 * test's close lingers instead (in CI it hung there, for 100,000 s; under
 * ASan gshmd won the race 53 times in 60).  So the test's close is cut
 * short by a timer (closed_at_once), a lingerer counts as gshmd's only
 * when that close returned at once, and the test sends more until gshmd
 * holds LINGERERS of them. */
static void test_lingering_closes_spare_the_pool(void **state) {
  struct harness g;
  static const uint8_t junk[16]; /* (no header: gshmd drops the connection, closing the fd) */
  struct linger lg = {.l_onoff = 1, .l_linger = 100000};
  struct sigaction alarm_sa = {.sa_handler = on_alarm}, old; /* (no SA_RESTART) */
  int peers[MAX_SENT], npeers = 0, held = 0, base, fds = -1, nthreads;
  (void)state;

  assert_int_equal(sigaction(SIGALRM, &alarm_sa, &old), 0);
  assert_int_equal(harness_start(&g, (const char *const[]){"--set",
                                                           "limits.max_fds_per_connection=1",
                                                           NULL}), 0);
  base = harness_stable_fd_count(g.sp.pid);
  while (held < LINGERERS && npeers < MAX_SENT) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), sp[2];
    int a = lingering_socket(&peers[npeers++]);
    assert_int_equal(setsockopt(a, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
    assert_int_equal(send_with_fds(sp[0], "x", 1, &a, 1, 1), 1);
    close(a);
    close(sp[0]);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g.socket_path);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_true(send_with_fds(c, junk, sizeof(junk), &sp[1], 1, 1) > 0);
    held += closed_at_once(sp[1]); /* else the test's close was the last, not gshmd's */
    usleep(20 * 1000);
    close(c);
  }
  print_message("    %d sockets sent, gshmd's close the last for %d\n", npeers, held);
  assert_int_equal(held, LINGERERS);
  usleep(500 * 1000); /* (the closes have begun to linger) */
  for (int i = 0; i < 50; i++) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g.socket_path);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(c);
  }
  for (int i = 0; i < 40; i++) { /* 2 s */
    usleep(50 * 1000);
    fds = harness_fd_count(g.sp.pid);
    if (fds <= base + 2)
      break;
  }
  nthreads = threads_named(g.sp.pid, "gshmd-close");
  print_message("    %d lingering closes, then 50 connections: gshmd's fds %d (%d before), "
                "%d closer threads\n", LINGERERS, fds, base, nthreads);
  for (int i = 0; i < npeers; i++)
    close(peers[i]); /* (a reset: gshmd's lingering closes end) */
  sigaction(SIGALRM, &old, NULL);
  assert_true(fds <= base + 2);
  /* A thread per lingering close (a close cut short here may have been
   * gshmd's too, when this one only took long), and one or a few for the
   * short ones */
  assert_true(nthreads >= LINGERERS && nthreads <= npeers + 4);
  assert_int_equal(harness_stop(&g), 0);
}

#define FD_QUOTA 8     /* quota.connections of the attacker's uid */
#define FD_ROUNDS 6    /* part 1: connections that each bring 253 fds */
#define FD_PACKETS 30  /* part 2: packets of one connection, one fd each */

struct fd_flood {
  const char *socket_path;
  int peers[FD_ROUNDS + FD_PACKETS]; /* the lingering sockets' peers, kept open */
  int npeers;
};

/* The attacker's connection, hello said; -1 when gshmd refused it (closed
 * at accept: the hello's reply is EOF).  No cmocka assert in the kid. */
static int kid_connect(const char *socket_path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct timeval tv = {.tv_sec = 5};
  Gshm__Hello m = GSHM__HELLO__INIT;
  static uint8_t buf[GSHM_WIRE_MAX_PACKET];
  int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), fds[GSHM_WIRE_MAX_FDS], nfds = 0;

  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
  if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof(sa)))
    _exit(2);
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  m.major = GSHM_PROTO_MAJOR;
  m.client_name = "flood";
  if (gshm__wire_send(c, GSHM_WIRE_HELLO, 1, &m.base, -1) ||
      gshm__wire_recv(c, buf, sizeof(buf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0) <= 0) {
    close(c);
    return -1;
  }
  fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
  return c;
}

/* Reads c's packets until gshmd closes it or none came for idle_ms. */
static void kid_drain(int c, int idle_ms) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET];
  struct pollfd p = {.fd = c, .events = POLLIN};
  int fds[GSHM_WIRE_MAX_FDS], nfds;

  while (poll(&p, 1, idle_ms) == 1) {
    ssize_t n = gshm__wire_recv(c, buf, sizeof(buf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    if (n == 0 || (n < 0 && n != -EAGAIN))
      return;
  }
}

/* The attacker, as another uid.  Part 1: connections that each send 253
 * fds in one packet, the first a lingering TCP socket whose last reference
 * is gshmd's (sent while gshmd does not read the connection: stall), the
 * rest copies of /dev/null that wait behind it in gshmd's fd table.
 * Part 2: one connection that sends FD_PACKETS requests, each with one
 * lingering socket. */
static void fd_flood(struct harness_kid *k, void *arg) {
  struct fd_flood *fl = arg;
  uint8_t pkt[GSHM_WIRE_HEADER_SIZE];
  int null = open("/dev/null", O_RDONLY | O_CLOEXEC), fds[GSHM_WIRE_MAX_FDS], c, accepted = 0;

  put_header(pkt, GSHM_PROTO_MAJOR, GSHM_WIRE_STATUS, 1, 0);
  for (int r = 0; r < FD_ROUNDS; r++) {
    if ((c = kid_connect(fl->socket_path)) < 0)
      continue;
    accepted++;
    stall(c);
    if ((fds[0] = lingering_socket_try(100000, &fl->peers[fl->npeers++])) < 0)
      _exit(3);
    for (int i = 1; i < GSHM_WIRE_MAX_FDS; i++)
      fds[i] = dup(null);
    if (send_with_fds(c, pkt, sizeof(pkt), fds, GSHM_WIRE_MAX_FDS, 1) < 0)
      _exit(4);
    for (int i = 0; i < GSHM_WIRE_MAX_FDS; i++)
      close(fds[i]);
    kid_drain(c, 5000); /* gshmd reads on, takes the fds and drops c */
    close(c);
  }
  fprintf(stderr, "    part 1: gshmd took %d of %d connections\n", accepted, FD_ROUNDS);
  harness_kid_step(k->out);
  harness_kid_await(k->in, 60000); /* measured: end the lingering closes */
  for (int i = 0; i < fl->npeers; i++)
    close(fl->peers[i]);
  fl->npeers = 0;
  harness_kid_await(k->in, 60000); /* gshmd's closes ended */
  if ((c = kid_connect(fl->socket_path)) < 0)
    _exit(5);
  stall(c);
  for (int i = 0; i < FD_PACKETS; i++) {
    int a = lingering_socket_try(100000, &fl->peers[fl->npeers++]);
    if (a < 0 || send_with_fds(c, pkt, sizeof(pkt), &a, 1, 1) < 0)
      break; /* (gshmd dropped c: fine) */
    close(a);
  }
  kid_drain(c, 1000);
  close(c);
  harness_kid_step(k->out);
  harness_kid_await(k->in, 60000);
  for (int i = 0; i < fl->npeers; i++)
    close(fl->peers[i]);
}

/* gshmd's fd count once it stayed the same for 200 ms (5 s at most). */
static int settled_fd_count(pid_t pid) {
  int last = -1, now, same = 0;

  for (int i = 0; i < 100 && same < 4; i++) {
    usleep(50 * 1000);
    now = harness_fd_count(pid);
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

/* A blocked close holds its whole batch's fds: the attack4 review's.  A
 * batch counted as one connection of its uid whether it carried 1 fd or
 * 253, so a user of quota.connections Q made gshmd hold Q x 253 fds (and a
 * thread per batch) for as long as its lingering sockets linger; and a
 * connection allowed fds (limits.max_fds_per_connection) was never
 * counted again after accept: one connection started a blocked close, and
 * a thread, per packet, without bound.  Now every fd still waiting to be
 * closed counts as a connection of its uid, and a connection whose fds
 * take its uid past quota.connections is dropped. */
static void test_pending_closes_count_fds(void **state) {
  static struct fd_flood fl;
  char quota[64];
  struct harness g;
  struct harness_kid k;
  int base, held, threads = 0, kid, stopped;
  (void)state;

  snprintf(quota, sizeof(quota), "quota.connections=%d", FD_QUOTA);
  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "daemon.socket_mode=0666",
                                                           "--set", "limits.max_fds_per_connection=1",
                                                           "--set", quota, NULL}), 0);
  base = harness_stable_fd_count(g.sp.pid);
  fl.socket_path = g.socket_path;
  assert_int_equal(harness_kid_start(&k, HARNESS_NOBODY, HARNESS_NOBODY, fd_flood, &fl), 0);
  assert_true(harness_kid_await(k.from_kid, 120000));
  held = settled_fd_count(g.sp.pid) - base;
  print_message("    part 1: gshmd holds %d more fds (%d connections of %d fds each tried, "
                "quota %d)\n", held, FD_ROUNDS, GSHM_WIRE_MAX_FDS, FD_QUOTA);
  harness_kid_step(k.to_kid);
  for (int i = 0; i < 100 && harness_fd_count(g.sp.pid) > base; i++)
    usleep(50 * 1000);
  harness_kid_step(k.to_kid);
  assert_true(harness_kid_await(k.from_kid, 120000));
  for (int i = 0, n; i < 20; i++) { /* (a closer thread per 10 ms a batch waited) */
    usleep(50 * 1000);
    if ((n = threads_named(g.sp.pid, "gshmd-close")) > threads)
      threads = n;
  }
  print_message("    part 2: at most %d closer threads after %d packets of one connection\n", threads,
                FD_PACKETS);
  harness_kid_step(k.to_kid);
  kid = harness_kid_wait(&k);
  stopped = harness_stop(&g); /* (before any assert: a failed one leaves no gshmd) */
  assert_int_equal(kid, 0);
  assert_int_equal(stopped, 0);
  /* one packet's fds and the quota's worth besides */
  assert_true(held > 0 && held < GSHM_WIRE_MAX_FDS + FD_QUOTA + 4);
  /* a thread for each blocked close the quota allows (the dropped
   * connection counts 1; the fds queued behind the first of a burst got
   * none, and waited: 1 thread of 9 in most runs), one for the dropped
   * socket (its queue's fds linger too) and maybe one more */
  assert_true(threads >= FD_QUOTA - 1 && threads <= FD_QUOTA + 3);
}

#define UNREAD_QUOTA 2  /* quota.connections of the attacker's uid */
#define UNREAD_ROUNDS 6 /* connections it tries */
#define UNREAD_OPENS 48 /* replies with an fd it leaves unread on each */

/* Waits up to 5 s for gshmd to read everything sent on c (SIOCOUTQ: our
 * packets' bytes not read yet). */
static bool kid_sent_read(int c) {
  for (int i = 0; i < 50000; i++) {
    int q = -1;
    if (ioctl(c, SIOCOUTQ, &q) || q == 0)
      return q == 0;
    usleep(100);
  }
  return false;
}

/* The attacker of test_dropped_connection_unread_fds, as another uid:
 * connects UNREAD_ROUNDS times; on each connection gshmd took, opens
 * "fl/seg" UNREAD_OPENS times without reading a reply (each carries the
 * segment's fd), then sends a packet too short to parse, which makes
 * gshmd drop the connection, and keeps its end open: the replies, fds and
 * all, stay in its receive queue.  Tells the parent how many connections
 * gshmd took (one byte), then, stepped, closes the first and tells whether
 * a connection is taken again within 5 s (one byte). */
static void unread_flood(struct harness_kid *k, void *arg) {
  Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
  const char *path = arg;
  int kept[UNREAD_ROUNDS], nkept = 0, c;
  uint8_t junk = 0, again = 0;

  m.name = "fl/seg";
  m.access = GSHM__ACCESS__ACCESS_READ;
  for (int r = 0; r < UNREAD_ROUNDS; r++) {
    if ((c = kid_connect(path)) < 0)
      continue;
    for (uint32_t i = 0; i < UNREAD_OPENS; i++)
      if (gshm__wire_send(c, GSHM_WIRE_OPEN, i + 2, &m.base, -1))
        _exit(2);
    if (!kid_sent_read(c) || send(c, &junk, 1, 0) != 1 || !kid_sent_read(c))
      _exit(3);
    kept[nkept++] = c;
  }
  usleep(100 * 1000); /* (gshmd's drops, after it read the short packets) */
  if (write(k->out, &(uint8_t){(uint8_t)nkept}, 1) != 1 || !harness_kid_await(k->in, 60000))
    _exit(4);
  close(kept[0]); /* its unread replies, and their fds, go */
  for (int i = 0; i < 50 && !again; i++) {
    if ((c = kid_connect(path)) >= 0) {
      again = 1;
      close(c);
    } else {
      usleep(100 * 1000);
    }
  }
  if (write(k->out, &again, 1) != 1)
    _exit(5);
  harness_kid_await(k->in, 60000);
  for (int i = 1; i < nkept; i++)
    close(kept[i]);
}

/* The kid's next byte (a count, not a step), within 60 s. */
static bool kid_byte(int fd, uint8_t *b) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 60000) == 1 && read(fd, b, 1) == 1;
}

/* Replies gshmd sent with an fd stay in flight, counted against gshmd's
 * user (ETOOMANYREFS past its RLIMIT_NOFILE: every user's opens fail),
 * for as long as the client keeps its end of the socket, also after
 * gshmd dropped the connection; quota.connections bounded only the
 * connections gshmd kept, so a user held as many such fds as it liked:
 * connect, leave replies unread, have gshmd drop the connection, again.
 * A dropped connection whose packets (one with an fd at least) are not
 * all read now counts as a connection of its user until they are (or the
 * client closes its end), so its quota bounds those fds too. */
static void test_dropped_connection_unread_fds(void **state) {
  struct harness g;
  struct harness_kid k;
  gshm_client_t *root;
  gshm_segment_t *seg;
  uint8_t took = 0, again = 0;
  int kid, stopped;
  char quota[64];
  (void)state;

  snprintf(quota, sizeof(quota), "quota.connections=%d", UNREAD_QUOTA);
  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "daemon.socket_mode=0666",
                                                           "--set", quota, NULL}), 0);
  assert_int_equal(gshm_connect(g.socket_path, "root", &root), 0);
  assert_int_equal(gshm_create(root, "fl/seg", 4096, NULL, 0644, 0, &seg), 0);
  assert_int_equal(harness_kid_start(&k, HARNESS_NOBODY, HARNESS_NOBODY, unread_flood,
                                     (void *)g.socket_path), 0);
  if (kid_byte(k.from_kid, &took)) {
    harness_kid_step(k.to_kid);
    if (kid_byte(k.from_kid, &again))
      harness_kid_step(k.to_kid);
  }
  print_message("    gshmd took %u of %d connections (quota %d), %d fds left unread on each; "
                "one taken again after one was closed: %u\n", took, UNREAD_ROUNDS,
                UNREAD_QUOTA, UNREAD_OPENS, again);
  kid = harness_kid_wait(&k);
  assert_int_equal(gshm_close(seg), 0);
  gshm_disconnect(root);
  stopped = harness_stop(&g);
  assert_int_equal(kid, 0);
  assert_int_equal(stopped, 0);
  assert_int_equal(took, UNREAD_QUOTA);
  assert_int_equal(again, 1);
}

#define OWN_END_QUOTA 2 /* quota.connections of the attacker's uid */
#define OWN_END_OPENS 4 /* replies with an fd it leaves unread on each */

/* The attacker of test_dropped_connection_own_end, as another uid: on
 * OWN_END_QUOTA connections, opens "fl/seg" without reading the replies
 * (each carries the segment's fd), sends a packet too short to parse
 * (gshmd drops the connection on it) and, right behind it, one of no
 * bytes (it reads like the end of a socket shut down) and one that
 * carries this end of the socket, which gshmd never reads; then closes
 * its fd.  The end lives on in gshmd's receive queue, so the replies are
 * never read.  Exits with the number of connections left so (a send that came
 * after gshmd shut its end failed: that connection is simply closed, and
 * its slot freed once gshmd sees it, so it is tried again). */
static int own_end_attack(const char *path) {
  Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
  uint8_t junk = 0;
  int left = 0;

  m.name = "fl/seg";
  m.access = GSHM__ACCESS__ACCESS_READ;
  for (int t = 0; t < 40 && left < OWN_END_QUOTA; t++) {
    int c = kid_connect(path);
    if (c < 0) { /* (a slot not freed yet) */
      usleep(100 * 1000);
      continue;
    }
    for (uint32_t i = 0; i < OWN_END_OPENS; i++)
      if (gshm__wire_send(c, GSHM_WIRE_OPEN, i + 2, &m.base, -1))
        return 50;
    if (!kid_sent_read(c) || send(c, &junk, 1, MSG_NOSIGNAL) != 1)
      return 51;
    send(c, &junk, 0, MSG_NOSIGNAL); /* (one of no bytes first: no end to the emptying) */
    left += send_with_fds(c, "x", 1, &c, 1, 1) == 1;
    close(c);
  }
  return left;
}

/* As another uid: 0 when gshmd takes a connection within 5 s, else 1. */
static int own_end_probe(const char *path) {
  for (int i = 0; i < 50; i++) {
    int c = kid_connect(path);
    if (c >= 0) {
      close(c);
      return 0;
    }
    usleep(100 * 1000);
  }
  return 1;
}

/* gshmd with quota.connections OWN_END_QUOTA and fds let in; attack runs
 * as another uid (it returns the connections it left pinned), then
 * whether that uid gets a connection again within 5 s. */
static void own_end_case(int (*attack)(const char *path), const char *what) {
  struct harness g;
  gshm_client_t *root;
  gshm_segment_t *seg;
  int left, probe, stopped;
  char quota[64];

  snprintf(quota, sizeof(quota), "quota.connections=%d", OWN_END_QUOTA);
  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "daemon.socket_mode=0666",
                                                           "--set", "limits.max_fds_per_connection=1",
                                                           "--set", quota, NULL}), 0);
  assert_int_equal(gshm_connect(g.socket_path, "root", &root), 0);
  assert_int_equal(gshm_create(root, "fl/seg", 4096, NULL, 0644, 0, &seg), 0);
  left = harness_as_nobody(attack, g.socket_path);
  probe = harness_as_nobody(own_end_probe, g.socket_path);
  print_message("    %d of %d %s connections left with their own end unread in gshmd's queue; "
                "a connection of that uid taken again within 5 s: %s\n", left, OWN_END_QUOTA,
                what, probe ? "no" : "yes");
  assert_int_equal(gshm_close(seg), 0);
  gshm_disconnect(root);
  stopped = harness_stop(&g);
  assert_int_equal(stopped, 0);
  assert_int_equal(left, OWN_END_QUOTA);
  assert_int_equal(probe, 0);
}

/* A dropped connection with replies (fds) unread is kept, counted as a
 * connection of its uid, until the client reads them or closes its end.
 * Where fds reach gshmd, a client sent its own end in a packet gshmd
 * never read (behind the one that got it dropped) and exited: the end
 * lived on in gshmd's own receive queue, the replies were never read, and
 * the slot was held until gshmd restarted; quota.connections such
 * connections locked the uid out (the session 27 review).  gshmd empties
 * its receive queue on a socket it keeps now, so nothing in it pins the
 * client's end. */
static void test_dropped_connection_own_end(void **state) {
  (void)state;
  own_end_case(own_end_attack, "dropped");
}

/* The attacker of test_stalled_connection_own_end, as another uid: on
 * OWN_END_QUOTA connections, opens "fl/seg" one request at a time without
 * reading the replies (each carries the segment's fd) until one does not
 * come within 200 ms: gshmd's send buffer to it is full, the reply waits
 * in gshmd's queue, and gshmd reads no request of the connection until
 * it is sent (under limits.max_inflight, so the connection is not
 * dropped).  Then sends a packet that carries this end of the socket,
 * which gshmd so never reads, and closes its fd.  Exits with the number
 * of connections left so. */
static int stalled_attack(const char *path) {
  Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
  int left = 0;

  m.name = "fl/seg";
  m.access = GSHM__ACCESS__ACCESS_READ;
  for (int t = 0; t < 10 && left < OWN_END_QUOTA; t++) {
    int c = kid_connect(path), inq = 0, was = 0;
    bool stalled = false;
    if (c < 0) {
      usleep(100 * 1000);
      continue;
    }
    for (uint32_t i = 0; i < 5000 && !stalled; i++) {
      if (gshm__wire_send(c, GSHM_WIRE_OPEN, i + 2, &m.base, -1))
        return 50;
      stalled = true;
      for (int w = 0; w < 200 && stalled; w++) { /* (its reply, within 200 ms) */
        if (!ioctl(c, SIOCINQ, &inq) && inq != was)
          stalled = false;
        else
          usleep(1000);
      }
      was = inq;
    }
    if (stalled) { /* (none in 500 ms more either: not a slow reply) */
      usleep(500 * 1000);
      stalled = !ioctl(c, SIOCINQ, &inq) && inq == was;
    }
    if (stalled && send_with_fds(c, "x", 1, &c, 1, 1) == 1)
      left++;
    close(c);
  }
  return left;
}

/* A connection whose replies (fds) the client leaves unread until gshmd
 * stops reading its requests (the send buffer full, a reply queued) is
 * not dropped: it counts as a connection of its uid while the client
 * lives.  Where fds reach gshmd (limits.max_fds_per_connection > 0, or a
 * kernel before 6.16 without SO_PASSRIGHTS), the client sent its own end
 * in a packet gshmd never reads and exited: the end lives on in gshmd's
 * receive queue, so gshmd sees no hangup, the replies are never read and
 * the connection, counted against quota.connections, stays until gshmd
 * restarts (limits.idle_timeout_ms is 0 by default); quota.connections
 * such connections lock the uid out.  The session 27 fix empties the
 * receive queue of a dropped connection's socket only. */
static void test_stalled_connection_own_end(void **state) {
  (void)state;
  own_end_case(stalled_attack, "stalled");
}

/* The attacker of test_refused_connection_fds, as another uid: holds its
 * one connection (quota.connections = 1), then connects again and, before
 * gshmd accepts (and refuses) that connection, sends on it a lingering
 * TCP socket whose last reference is then in the refused socket's queue:
 * until gshmd's close, which is the last one when this process's close
 * returned at once (else it was gshmd's that came first: again). */
static void refused_sender(struct harness_kid *k, void *arg) {
  const char *path = arg;
  struct sigaction alarm_sa = {.sa_handler = on_alarm}; /* (no SA_RESTART) */
  int held = kid_connect(path), peers[20], npeers = 0, early = 0;
  bool last = false;

  if (held < 0 || sigaction(SIGALRM, &alarm_sa, NULL))
    _exit(2);
  while (!last && npeers < 20) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    int a = lingering_socket_try(100000, &peers[npeers++]);

    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (a < 0 || c < 0 || connect(c, (struct sockaddr *)&sa, sizeof(sa)))
      _exit(3);
    if (send_with_fds(c, "x", 1, &a, 1, 1) != 1) {
      /* gshmd accepted and refused it first (this process descheduled
       * between connect and send, on busy cores): EPIPE, nothing sent;
       * again (this close is the last one: cut short) */
      closed_at_once(a);
      close(c);
      early++;
      continue;
    }
    last = closed_at_once(a);
    close(c);
  }
  fprintf(stderr,
          "    %d lingering sockets sent (%d refused before the send), gshmd's close the last: "
          "%s\n",
          npeers, early, last ? "yes" : "no");
  harness_kid_step(k->out);
  harness_kid_await(k->in, 60000);
  for (int i = 0; i < npeers; i++)
    close(peers[i]);
  close(held);
  if (!last)
    _exit(4); /* (the attack never reached gshmd: the test would prove nothing) */
}

/* ms until a hello on a new connection to path is answered; -1: not in
 * 2 s. */
static double hello_ms(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Gshm__Hello m = GSHM__HELLO__INIT;
  int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct pollfd p = {.fd = c, .events = POLLIN};
  double t0 = now_ms(), ms = -1;

  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  m.major = GSHM_PROTO_MAJOR;
  m.client_name = "prober";
  if (c >= 0 && !connect(c, (struct sockaddr *)&sa, sizeof(sa)) &&
      !gshm__wire_send(c, GSHM_WIRE_HELLO, 1, &m.base, -1) && poll(&p, 1, 2000) == 1)
    ms = now_ms() - t0;
  if (c >= 0)
    close(c);
  return ms;
}

/* A connection refused at accept (its uid over quota.connections, or
 * limits.max_connections) was closed on the event loop: where fds reach
 * gshmd (a kernel before 6.16, or limits.max_fds_per_connection > 0), a
 * client that sent a lingering socket on it before the accept stalled
 * the loop for the linger time (the attack4 review): every client,
 * root's too, went unanswered.  Refused connections are closed on the
 * closer threads now. */
static void test_refused_connection_fds(void **state) {
  struct harness g;
  struct harness_kid k;
  double ms;
  int kid, stopped;
  (void)state;

  assert_int_equal(harness_start(&g, (const char *const[]){"--set", "daemon.socket_mode=0666",
                                                           "--set", "limits.max_fds_per_connection=1",
                                                           "--set", "quota.connections=1", NULL}),
                   0);
  assert_int_equal(harness_kid_start(&k, HARNESS_NOBODY, HARNESS_NOBODY, refused_sender,
                                     (void *)g.socket_path), 0);
  if (!harness_kid_await(k.from_kid, 60000)) {
    kill(k.pid, SIGKILL); /* (a kid that exited early is reaped as it is) */
    kid = harness_kid_wait(&k);
    harness_stop(&g); /* (else it holds ctest's output pipe: a 300 s timeout, not a failure) */
    fail_msg("the attacker did not get its sockets sent: exit %d", kid);
  }
  usleep(200 * 1000);
  ms = hello_ms(g.socket_path);
  print_message("    root's hello after the refused connection: %s%.2f ms\n",
                ms < 0 ? "no answer in 2000 ms; " : "", ms < 0 ? 0 : ms);
  harness_kid_step(k.to_kid);
  kid = harness_kid_wait(&k);
  stopped = harness_stop(&g);
  assert_int_equal(kid, 0);
  assert_int_equal(stopped, 0);
  assert_true(ms >= 0 && ms < 10 * STATUS_DEADLINE_MS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_garbage_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_random_packets, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversized_lengths, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_protobuf, setup, teardown),
      cmocka_unit_test_setup_teardown(test_many_fields, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_of_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_many_fds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_thousand_idle_connections, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slowloris, setup, teardown),
      cmocka_unit_test_setup_teardown(test_never_reads_replies, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kept_memfd_after_free, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fd_limit_at_start, setup, teardown),
      cmocka_unit_test_setup_teardown(test_accept_at_fd_limit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lingering_socket_fd, setup, teardown),
      cmocka_unit_test(test_lingering_closes_spare_the_pool),
      cmocka_unit_test(test_pending_closes_count_fds),
      cmocka_unit_test(test_refused_connection_fds),
      cmocka_unit_test(test_dropped_connection_unread_fds),
      cmocka_unit_test(test_dropped_connection_own_end),
      cmocka_unit_test(test_stalled_connection_own_end),
      cmocka_unit_test_setup_teardown(test_big_free_off_the_loop, setup_reap_hold,
                                      teardown_reap_hold),
  };
  if (getenv("GSHM_TEST_FILTER")) /* (a cmocka test filter, as the cluster suites take) */
    cmocka_set_test_filter(getenv("GSHM_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
