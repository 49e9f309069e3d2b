/* SPDX-License-Identifier: Apache-2.0 */
/* The reply-losing proxy of the resend tests (proxy.h). */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "proxy.h"
#include "raw.h"
#include "wire.h"

/* Moves one packet from `from` to `to` (its fd too).  *req_id: set to the
 * id of a request of p->type on its way to gshmd (while 0, and fewer than
 * p->losses kept); the reply with that id coming back is kept instead
 * (returns 2), or with p->lose_request that request itself (gshmd never
 * sees it).  Returns 0 moved,
 * 1 one side ended, 2 the reply kept (p->kept, p->kept_fd). */
static int pass_one(struct proxy *p, int from, int to, uint32_t *req_id) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  struct gshm_wire_header hdr;
  int fds[GSHM_WIRE_MAX_FDS], nfds = 0, e = 0, losses = p->losses > 0 ? p->losses : 1;
  ssize_t len = gshm__wire_recv(from, buf, sizeof(buf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);

  if (len <= 0 || gshm__wire_parse_header(buf, (size_t)len, &hdr)) {
    e = 1;
  } else if (*req_id && p->lost < losses && hdr.request_id == *req_id) {
    if (nfds && !p->kept)
      p->kept_fd = fds[0]; /* the first reply's: the others' are closed */
    for (int i = p->kept ? 0 : 1; i < nfds; i++)
      close(fds[i]);
    p->kept = true;
    p->lost++;
    return 2;
  } else if (p->lose_request && p->lost < losses && hdr.type == p->type) {
    p->kept = true; /* (its fds, none for the types tested, are closed below) */
    p->lost++;
    e = 2;
  } else {
    if (!*req_id && p->lost < losses && hdr.type == p->type)
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
    if (r == 2) { /* gshmd dies with the reply unread, and comes back */
      p->restarted = harness_restart(p->h, SIGKILL, p->restart_args);
      if (!p->restarted && p->after_restart)
        p->after_restart(p);
    }
    close(cfd);
  }
  return NULL;
}

void proxy_start(struct proxy *p, struct harness *h, uint16_t type) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};

  p->h = h;
  p->type = type;
  p->kept = false;
  p->lost = 0;
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

void proxy_stop(struct proxy *p) {
  shutdown(p->lfd, SHUT_RDWR); /* accept4 fails: the thread ends */
  pthread_join(p->t, NULL);
  close(p->lfd);
}

