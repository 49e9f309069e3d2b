/* SPDX-License-Identifier: Apache-2.0 */
/* Requests whose reply a gshmd restart lost.  A create: gshmd made the segment
 * (and stored it in the fd store) and was killed before the client read
 * its reply: libgshm, reconnecting, sends the create again.  Before
 * create tokens that resend met the segment the first one made and
 * failed -EEXIST, so the creator had no lease of its own segment.  Now
 * the resend carries the first one's token and gets a read-write lease
 * of that segment.
 *
 * An unlink: the first one removed the name, the resend met -ENOENT for a
 * name that its caller had just seen; libgshm now returns 0 for it.
 *
 * Real gshmd and real libgshm; between them a proxy thread that passes
 * every packet (and its fd) through, except the reply to the first
 * request of one type (create, unlink): that one it keeps, SIGKILLs
 * gshmd, has the harness restart it from the fd store (as systemd would),
 * and drops both connections.  Through a kept create reply's fd the test
 * then writes bytes that the client's lease must show: the same memory. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "wire.h"
#include "raw.h"

#define SIZE ((1u << 20) + 5)

struct proxy {
  struct harness *h;
  uint16_t type;        /* the request type whose first reply is kept */
  char path[108];
  int lfd;
  pthread_t t;
  bool kept;            /* that reply was kept (the thread's until joined) */
  int kept_fd;          /* its fd, or -1 */
  int restarted;        /* harness_restart's result once it ran; 1: not yet */
};

/* Moves one packet from `from` to `to` (its fd too).  *req_id: set to the
 * id of a request of p->type on its way to gshmd (while 0); the reply
 * with that id coming back is kept instead (returns 2).  Returns 0 moved,
 * 1 one side ended, 2 the reply kept (p->kept, p->kept_fd). */
static int pass_one(struct proxy *p, int from, int to, uint32_t *req_id) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  struct gshm_wire_header hdr;
  int fds[GSHM_WIRE_MAX_FDS], nfds = 0, e = 0;
  ssize_t len = gshm__wire_recv(from, buf, sizeof(buf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);

  if (len <= 0 || gshm__wire_parse_header(buf, (size_t)len, &hdr)) {
    e = 1;
  } else if (*req_id && !p->kept && hdr.request_id == *req_id) {
    p->kept = true;
    if (nfds)
      p->kept_fd = fds[0];
    for (int i = 1; i < nfds; i++)
      close(fds[i]);
    return 2;
  } else {
    if (!*req_id && !p->kept && hdr.type == p->type)
      *req_id = hdr.request_id;
    e = gshm__wire_sendmsg(to, buf, (size_t)len, nfds ? fds[0] : -1) ? 1 : 0;
  }
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  return e;
}

static void *proxy_main(void *arg) {
  struct proxy *p = arg;
  int cfd;

  while ((cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
    struct pollfd pf[2] = {{.fd = cfd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
    uint32_t req_id = 0;
    int r = 0;

    pf[1].fd = raw_socket(p->h->socket_path);
    while (pf[1].fd >= 0 && r == 0 && poll(pf, 2, -1) > 0) {
      if (pf[0].revents)
        r = pass_one(p, cfd, pf[1].fd, &req_id);
      else if (pf[1].revents)
        r = pass_one(p, pf[1].fd, cfd, &req_id);
    }
    if (pf[1].fd >= 0)
      close(pf[1].fd);
    if (r == 2) /* gshmd dies with the reply unread, and comes back */
      p->restarted = harness_restart(p->h, SIGKILL, NULL);
    close(cfd);
  }
  return NULL;
}

static void proxy_start(struct proxy *p, struct harness *h, uint16_t type) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};

  p->h = h;
  p->type = type;
  p->kept = false;
  p->kept_fd = -1;
  p->restarted = 1;
  snprintf(p->path, sizeof(p->path), "%s.proxy", h->socket_path);
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", p->path);
  unlink(p->path);
  assert_true((p->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) >= 0);
  assert_int_equal(bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_int_equal(listen(p->lfd, 8), 0);
  assert_int_equal(pthread_create(&p->t, NULL, proxy_main, p), 0);
}

static void proxy_stop(struct proxy *p) {
  shutdown(p->lfd, SHUT_RDWR); /* accept4 fails: the thread ends */
  pthread_join(p->t, NULL);
  close(p->lfd);
}

/* Each test's gshmd and proxy, set up and taken down by cmocka: a failed
 * check skips the rest of the test, and a gshmd left running would hold
 * ctest's output pipe until its timeout (harness_set_leftover). */
struct fx {
  struct harness h; /* (first: harness_cmocka_start) */
  struct proxy p;
  bool proxied;
};

static int setup(void **state) {
  return harness_cmocka_start(state, sizeof(struct fx), NULL) ? 0 : -1;
}

/* gshmd stops first (its end ends the proxy's connection to it, which a
 * failed test's client may still hold), then the proxy.  -1 when gshmd
 * did not exit cleanly. */
static int teardown(void **state) {
  struct fx *f = *state;
  int status;

  if (!f)
    return 0;
  if (f->proxied)
    unlink(f->p.path); /* (before harness_stop removes its directory) */
  status = harness_stop(&f->h);
  if (f->proxied)
    proxy_stop(&f->p);
  harness_set_leftover(NULL);
  free(f);
  *state = NULL;
  return status == 0 ? 0 : -1;
}

static void test_create_reply_lost_to_a_restart(void **state) {
  struct fx *f = *state;
  struct harness *h = &f->h;
  struct proxy *p = &f->p;
  gshm_client_t *c, *other;
  gshm_segment_t *s, *s2;
  gshm_status_info_t st;
  unsigned char *want = malloc(SIZE), *got = malloc(SIZE), *m;

  assert_non_null(want);
  assert_non_null(got);
  proxy_start(p, h, GSHM_WIRE_CREATE);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "resender", &c), 0);
  /* the first create is made, its reply kept by the proxy, gshmd killed
   * and restarted; libgshm reconnects and sends the create again */
  assert_int_equal(gshm_create(c, "lost/reply", SIZE, NULL, 0640, 0, &s), 0);
  assert_int_equal(p->restarted, 0);
  assert_true(p->kept_fd >= 0);
  /* the lease is of the first create's memory: what its fd writes shows */
  m = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, p->kept_fd, 0);
  assert_true(m != MAP_FAILED);
  harness_random(want, SIZE, 0x5e5e);
  memcpy(m, want, SIZE);
  munmap(m, SIZE);
  assert_int_equal(gshm_read(s, 0, got, SIZE), 0);
  assert_memory_equal(got, want, SIZE);
  /* one segment, and the name is still taken for any other create */
  assert_int_equal(gshm_connect(h->socket_path, "other", &other), 0);
  assert_int_equal(gshm_status(other, &st), 0);
  assert_int_equal(st.segments, 1);
  assert_int_equal(gshm_create(other, "lost/reply", SIZE, NULL, 0640, 0, &s2), -EEXIST);
  assert_int_equal(gshm_create(c, "lost/reply", SIZE, NULL, 0640, 0, &s2), -EEXIST);
  assert_int_equal(gshm_unlink(other, "lost/reply"), 0);
  gshm_close(s);
  gshm_disconnect(other);
  gshm_disconnect(c);
  close(p->kept_fd);
  free(want);
  free(got);
}

/* The first unlink of a segment is done and stored, its reply lost:
 * libgshm's resend meets -ENOENT and says 0; the name is gone (and an
 * unlink of a name that never was still says -ENOENT). */
static void test_unlink_reply_lost_to_a_restart(void **state) {
  struct fx *f = *state;
  struct proxy *p = &f->p;
  gshm_client_t *c;
  gshm_segment_t *s;
  gshm_segment_info_t info;

  proxy_start(p, &f->h, GSHM_WIRE_UNLINK);
  f->proxied = true;
  assert_int_equal(gshm_connect(p->path, "unlinker", &c), 0);
  assert_int_equal(gshm_create(c, "gone/soon", 4096, NULL, 0600, 0, &s), 0);
  assert_int_equal(gshm_close(s), 0);
  assert_int_equal(gshm_unlink(c, "gone/soon"), 0);
  assert_true(p->kept);
  assert_int_equal(p->restarted, 0);
  assert_int_equal(gshm_stat_name(c, "gone/soon", &info), -ENOENT);
  assert_int_equal(gshm_unlink(c, "never/was"), -ENOENT);
  gshm_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_create_reply_lost_to_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_reply_lost_to_a_restart, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
