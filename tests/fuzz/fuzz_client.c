/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: libgshm against a hostile (or just malformed) gshmd.
 * A thread of this process plays gshmd on a Unix socket in a temporary
 * directory; libgshm's public calls, made on the main thread, read its
 * packets: the Welcome, the replies and their fds, unasked events.
 *
 * Input: byte 0 flags (bit 0: the Welcome is a valid one, so that most
 * inputs reach the calls; bit 1: the Welcome has every capability), byte
 * 1 the number of calls (at most 24), that many call bytes (the call is
 * byte % NCALLS), then the replies, each [u8 how][u16 LE len][len bytes
 * of a Reply body].  The fake gshmd answers each request it reads with
 * the next reply, under a header of the request's type and id, unless
 * `how` says otherwise (bit 0: an fd too, a memfd of (how >> 5) pages,
 * sealed against shrinking and growing when bit 4 is set, as gshmd's
 * are; bit 1: the wrong request id; bit 2: an Event of the same bytes
 * first; bit 3: sent as is, header included).  A request that waits for more
 * than one reply (a pull's progress) gets the next one after 1 ms of
 * silence; no reply left: the connection closes.  A reconnect (libgshm
 * makes one after a lost connection, and re-takes its leases) is served
 * from the replies left, as a restarted gshmd.
 *
 * Checked: no crash, leak or undefined behaviour in libgshm, no call
 * hangs, and after gshm_disconnect this process holds no fd more than
 * before. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gshm.h"
#include "gshm.pb-c.h"
#include "fuzz_fds.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char dir[64], path[96];
static int lfd = -1;

struct fake {
  const uint8_t *p; /* the replies not sent yet */
  size_t n;
  uint8_t flags;
  int fd;         /* the client's connection now, or -1 */
  bool first;     /* no request read on fd yet */
  uint16_t type;  /* the last request on fd (id 0: none yet) */
  uint32_t id;
  atomic_bool done; /* the client disconnected: the thread ends */
};

static void remove_dir(void) {
  unlink(path);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};

  (void)argc;
  (void)argv;
  /* no reconnects, no polling: a lost connection is the call's error */
  setenv("GSHM_RECONNECT_MS", "0", 1);
  setenv("GSHM_POLL_US", "0", 1);
  setenv("GSHM_HELLO_TIMEOUT_MS", "2000", 1);
  snprintf(dir, sizeof(dir), "%s/gshm-fuzz-client.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir))
    abort();
  snprintf(path, sizeof(path), "%s/s", dir);
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0)
    abort();
  atexit(remove_dir);
  return 0;
}

static void send_raw(int fd, const void *p, size_t len, int pass) {
  if (gshm__wire_sendmsg(fd, p, len, pass) == -EPERM && pass >= 0)
    (void)gshm__wire_sendmsg(fd, p, len, -1);
}

/* Sends the next reply for request (type, id); false when none is left. */
static bool answer(struct fake *f, uint16_t type, uint32_t id) {
  static uint8_t pkt[GSHM_WIRE_MAX_PACKET];
  struct gshm_wire_header h = {0};
  uint8_t how;
  size_t len;
  int mem = -1;

  if (f->n < 3)
    return false;
  how = f->p[0];
  len = (size_t)f->p[1] | (size_t)f->p[2] << 8;
  f->p += 3;
  f->n -= 3;
  if (len > f->n)
    len = f->n;
  if (len > sizeof(pkt) - GSHM_WIRE_HEADER_SIZE)
    len = sizeof(pkt) - GSHM_WIRE_HEADER_SIZE;
  if (how & 1) {
    mem = memfd_create("fuzz-seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mem < 0 || ftruncate(mem, (off_t)(how >> 5) * 4096) < 0 ||
        ((how & 16) && fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0))
      abort();
  }
  if (how & 8) {
    send_raw(f->fd, f->p, len, mem);
  } else {
    h.magic = GSHM_WIRE_MAGIC;
    h.major = GSHM_PROTO_MAJOR;
    h.minor = GSHM_PROTO_MINOR;
    h.length = (uint32_t)len;
    if (how & 4) {
      h.type = GSHM_WIRE_EVENT;
      h.request_id = 0;
      memcpy(pkt, &h, sizeof(h));
      memcpy(pkt + GSHM_WIRE_HEADER_SIZE, f->p, len);
      send_raw(f->fd, pkt, GSHM_WIRE_HEADER_SIZE + len, -1);
    }
    h.type = (uint16_t)(type | GSHM_WIRE_REPLY);
    h.request_id = id + ((how & 2) ? 1 : 0);
    memcpy(pkt, &h, sizeof(h));
    memcpy(pkt + GSHM_WIRE_HEADER_SIZE, f->p, len);
    send_raw(f->fd, pkt, GSHM_WIRE_HEADER_SIZE + len, mem);
  }
  if (mem >= 0)
    close(mem);
  f->p += len;
  f->n -= len;
  return true;
}

static void welcome(struct fake *f, uint32_t id) {
  Gshm__Reply r = GSHM__REPLY__INIT;
  Gshm__Welcome w = GSHM__WELCOME__INIT;
  uint8_t pkt[256];
  size_t len;

  r.status = GSHM__STATUS__STATUS_OK;
  r.body_case = GSHM__REPLY__BODY_WELCOME;
  r.welcome = &w;
  w.major = GSHM_PROTO_MAJOR;
  w.minor = GSHM_PROTO_MINOR;
  w.session_id = 7;
  w.capabilities = (f->flags & 2) ? UINT32_MAX : 0;
  if (gshm__wire_pack(GSHM_WIRE_HELLO | GSHM_WIRE_REPLY, id, &r.base, pkt, sizeof(pkt), &len))
    abort();
  send_raw(f->fd, pkt, len, -1);
}

/* A new connection (the client's first, or its reconnect after the
 * last one closed): the one before it goes, as if gshmd restarted. */
static void fake_accept(struct fake *f) {
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return;
  if (f->fd >= 0)
    close(f->fd);
  f->fd = fd;
  f->id = 0;
  f->first = true;
}

/* Reads one request on f->fd and answers it; false once the connection
 * should close. */
static bool fake_request(struct fake *f) {
  static uint8_t rx[GSHM_WIRE_MAX_PACKET + 1];
  int fds[GSHM_WIRE_MAX_FDS], nfds = 0;
  struct gshm_wire_header h;
  ssize_t n = gshm__wire_recv(f->fd, rx, sizeof(rx), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);
  bool hello;

  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  if (n <= 0)
    return false;
  if (gshm__wire_parse_header(rx, (size_t)n, &h)) /* libgshm sends only good packets */
    abort();
  if (h.request_id == 0)
    return true; /* a mapping report or a pull's cancel: no answer */
  f->type = h.type;
  f->id = h.request_id;
  hello = f->first && h.type == GSHM_WIRE_HELLO;
  f->first = false;
  if (hello && (f->flags & 1)) {
    welcome(f, h.request_id);
    return true;
  }
  return answer(f, f->type, f->id);
}

/* The fake gshmd: serves each connection the client makes until the
 * client is done; a request with no reply left, or silence with none
 * left, closes the connection (the client sees gshmd go). */
static void *fake_gshmd(void *arg) {
  struct fake *f = arg;

  f->fd = -1;
  while (!atomic_load(&f->done)) {
    struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}, {.fd = f->fd, .events = POLLIN}};
    int r = poll(p, f->fd >= 0 ? 2 : 1, 1);

    if (r > 0 && (p[0].revents & POLLIN))
      fake_accept(f);
    else if (r > 0 && f->fd >= 0 && p[1].revents && !fake_request(f)) {
      close(f->fd);
      f->fd = -1;
    } else if (r == 0 && f->fd >= 0 && f->id && !answer(f, f->type, f->id)) {
      /* silence: the next reply for the last request (a pull's), or the end */
      close(f->fd);
      f->fd = -1;
    }
  }
  if (f->fd >= 0)
    close(f->fd);
  while ((f->fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0) /* connects not served */
    close(f->fd);
  return NULL;
}

enum { NCALLS = 22 };

static void progress(const gshm_pull_progress_t *p, void *arg) { (void)arg, (void)p; }

/* Call k of the input (its errors are all fine: the point is how libgshm
 * reads what it was told). */
static void call(gshm_client_t *c, unsigned k, gshm_segment_t **segs, unsigned *nsegs) {
  gshm_segment_t *s = *nsegs ? segs[*nsegs - 1] : NULL;
  gshm_segment_info_t *infos = NULL, info;
  size_t count = 0;

  switch (k % NCALLS) {
  case 0:
  case 1:
    if (*nsegs < 8 && gshm_open(c, "a", k % 2 ? GSHM_ACCESS_READ : GSHM_ACCESS_READ_WRITE,
                                &segs[*nsegs]) == 0)
      ++*nsegs;
    break;
  case 2:
    if (*nsegs < 8 && gshm_create(c, "a", 4096, "host", 0600, 0, &segs[*nsegs]) == 0)
      ++*nsegs;
    break;
  case 3:
    (void)gshm_stat_name(c, "a", &info);
    break;
  case 4:
    if (gshm_list(c, &infos, &count) == 0)
      gshm_free(infos);
    break;
  case 5: {
    gshm_lease_info_t *l;
    if (gshm_list_leases(c, &l, &count) == 0)
      gshm_free(l);
    break;
  }
  case 6: {
    gshm_client_info_t *ci;
    if (gshm_list_clients(c, &ci, &count) == 0)
      gshm_free(ci);
    break;
  }
  case 7: {
    gshm_status_info_t st;
    (void)gshm_status(c, &st);
    break;
  }
  case 8: {
    gshm_device_info_t *d;
    if (gshm_list_devices(c, &d, &count) == 0)
      gshm_free(d);
    break;
  }
  case 9: {
    char *text;
    if (gshm_metrics(c, &text) == 0)
      gshm_free(text);
    break;
  }
  case 10: {
    char node[64];
    gshm_cluster_peer_t *p;
    if (gshm_cluster_peers(c, node, &p, &count) == 0)
      gshm_free(p);
    break;
  }
  case 11: {
    gshm_cluster_pull_t *p;
    uint64_t total;
    if (gshm_cluster_pulls_counted(c, &p, &count, &total) == 0)
      gshm_free(p);
    break;
  }
  case 12:
    if (gshm_list_remote(c, "p", &infos, &count) == 0)
      gshm_free(infos);
    break;
  case 13: {
    gshm_pull_result_t r;
    gshm_pull_opts_t o = {0};
    o.progress = progress;
    (void)gshm_pull(c, "p", "a", &o, &r);
    break;
  }
  case 14: {
    gshm_pull_result_t *r;
    if (gshm_pull_prefix(c, "p", "a", NULL, &r, &count) == 0)
      gshm_free(r);
    break;
  }
  case 15:
    (void)gshm_unlink(c, "a");
    break;
  case 16:
    (void)gshm_chmod(c, "a", 0644);
    break;
  case 17:
    (void)gshm_revoke(c, "a");
    break;
  case 18:
    if (s)
      (void)gshm_stat(s, &info);
    break;
  case 19:
    if (s) {
      (void)gshm_close(s);
      --*nsegs;
    }
    break;
  case 20:
    if (s)
      (void)gshm_publish(s, 0);
    break;
  case 21: {
    void *addr;
    char buf[64];
    /* a host mapping: libgshm must not trust the size it was told over
     * the fd's own */
    if (s && gshm_map(s, NULL, 0, &addr) == 0) {
      (void)gshm_read(s, 0, buf, sizeof(buf));
      (void)gshm_unmap(s);
    }
    break;
  }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fake f = {0};
  gshm_client_t *c = NULL;
  gshm_segment_t *segs[8];
  unsigned nsegs = 0, ncalls;
  pthread_t t;
  int baseline;

  if (size < 2 || size > 1 << 18)
    return 0;
  baseline = fuzz_fd_count();
  f.flags = data[0];
  ncalls = data[1] % 25;
  if (ncalls > size - 2)
    ncalls = (unsigned)(size - 2);
  f.p = data + 2 + ncalls;
  f.n = size - 2 - ncalls;
  if (pthread_create(&t, NULL, fake_gshmd, &f))
    abort();
  if (gshm_connect(path, "fuzz", &c) == 0) {
    for (unsigned i = 0; i < ncalls; i++)
      call(c, data[2 + i], segs, &nsegs);
    gshm_disconnect(c);
  }
  atomic_store(&f.done, true);
  pthread_join(t, NULL);
  if (fuzz_fd_count() != baseline) {
    fprintf(stderr, "fuzz_client: %d fds open, %d before\n", fuzz_fd_count(), baseline);
    abort();
  }
  return 0;
}
