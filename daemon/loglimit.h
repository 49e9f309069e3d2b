/* SPDX-License-Identifier: Apache-2.0 */
/* The log lines a local user's clients make gshmd write, held to a rate
 * per uid, and those a cluster peer's messages make, per peer.  gshmd
 * logs a line for each connection, create, unlink and refused open or
 * connection; journald keeps at most RateLimitBurst
 * (10,000) lines of a service per 30 s and drops the rest, whoever they
 * are about.  Without a bound of its own, one user's client looping on a
 * refused open (17,000 lines a second) or on connect and close (25,000)
 * took the whole budget: every other user's lines, an admin's revoke and
 * gshmd's own warnings went unwritten (docs/SECURITY.md). */
#ifndef GSHMD_LOGLIMIT_H
#define GSHMD_LOGLIMIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "registry.h"

/* Lines a uid may have written at once, and then a second; past them its
 * lines are counted, and the count is written with its next line. */
#define GSHMD_LOGLIMIT_BURST 1000u
#define GSHMD_LOGLIMIT_RATE 20u

struct gshmd_loglimit {
  pthread_t loop;      /* the thread whose lines are charged (the loop's) */
  void *root;          /* tsearch tree of struct loglimit_uid, one a uid or a peer */
  struct loglimit_uid *charged; /* whose lines the loop writes now; NULL: nobody's */
  uint64_t dropped;    /* lines not written, all uids (metrics) */
};

/* Starts charging: the calling thread is the loop, and the process's
 * logger consults l (gshm__log_set_gate) until gshmd_loglimit_stop. */
void gshmd_loglimit_start(struct gshmd_loglimit *l);

/* The loop's lines from now on are cred's (the connection it serves):
 * warnings, notices, info and debug lines beyond its uid's rate are
 * dropped; errors always go, and so do lines about gshmd's own state
 * (GSHM_LOG_UNGATED, log.h: the fd store falling behind) and those of
 * gshmd's own work that a request's event ran (gshm__log_ungated_begin:
 * the fd store catching up, fdstore.c on_event).  NULL, root
 * or a member of daemon.admin_group: nobody's, never dropped.  Out of
 * memory for the uid's record: not charged. */
void gshmd_loglimit_charge(struct gshmd_loglimit *l, const struct gshmd_cred *cred);

/* The loop's lines from now on are those cluster peer `peer` (its name in
 * cluster.peers, which a key holder may claim) makes gshmd write with its
 * messages: held as a uid's are, in a bucket of the peer's own (the
 * count of those dropped is written as "cluster: peer 'NAME': N log
 * lines about its requests not written").  A key holder that asked for a
 * grant and released it, over and over, made a line each ("granted read
 * of"), 12,000 a second, and so took journald's whole budget of gshmd's
 * lines (docs/SECURITY.md).  NULL or "": nobody's.  Out of memory for
 * the peer's record: not charged. */
void gshmd_loglimit_charge_peer(struct gshmd_loglimit *l, const char *peer);

/* Stops charging (the logger no longer consults l) and frees l's
 * records.  Call it once no other thread logs. */
void gshmd_loglimit_stop(struct gshmd_loglimit *l);

#endif
