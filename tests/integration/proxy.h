/* SPDX-License-Identifier: Apache-2.0 */
/* A proxy between libgshm and a real gshmd that loses one reply to a
 * restart, as a SIGKILL between gshmd's work and its reply would: it
 * passes every packet (and its fd) through, except the reply to the
 * first request of one type, which it keeps; then it SIGKILLs gshmd, has
 * the harness restart it from the fd store (as systemd would) and drops
 * both connections, so that libgshm reconnects and sends the request
 * again.  cmocka asserts inside (include after <cmocka.h>'s
 * prerequisites). */
#ifndef GSHM_TESTS_PROXY_H
#define GSHM_TESTS_PROXY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "harness.h"

struct proxy {
  struct harness *h;
  uint16_t type;        /* the request type whose first reply is kept */
  const char *const *restart_args; /* harness_restart's extra_args (a node's argv); may be NULL */
  /* called on the proxy's thread after the restart, before the client
   * sees its connection end (so before its resend); may be NULL */
  void (*after_restart)(struct proxy *p);
  void *arg;            /* after_restart's */
  char path[108];       /* the proxy's socket: connect libgshm here */
  int lfd;
  pthread_t t;
  int losses;           /* how many replies of that request (its resends') to keep, a
                           restart each; 0: one */
  bool lose_request;    /* keep the request itself instead (gshmd never gets it): a
                           restart before gshmd did the work */
  int lost;             /* how many were kept */
  bool kept;            /* that reply was kept (the thread's until joined) */
  int kept_fd;          /* its fd, or -1 */
  int restarted;        /* harness_restart's result once it ran; 1: not yet */
};

/* Starts p's thread on a socket next to h's ("<socket>.proxy") for the
 * first reply to a request of type (and to its resends, p->losses);
 * p->restart_args, after_restart, arg, losses and lose_request are set by
 * the caller first (or zero). */
void proxy_start(struct proxy *p, struct harness *h, uint16_t type);
/* Ends p's thread (after h's gshmd stopped or the client left). */
void proxy_stop(struct proxy *p);

#endif
