/* SPDX-License-Identifier: Apache-2.0 */
/* The log lines a local user's clients make gshmd write, held to a rate
 * per uid: a token bucket a uid; and those a cluster peer's messages
 * make, a bucket a peer name (loglimit.h). */
#include "loglimit.h"

#include <inttypes.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "util.h"

#define NS_PER_LINE (1000000000LL / GSHMD_LOGLIMIT_RATE)

struct loglimit_uid {
  char peer[64];    /* a cluster peer's name, or "": a uid's */
  uid_t uid;
  uint32_t tokens;  /* lines it may have written now */
  int64_t at_ns;    /* CLOCK_MONOTONIC: tokens counted up to here */
  uint64_t dropped; /* lines not written since its last one */
};

static int cmp_uid(const void *a, const void *b) {
  const struct loglimit_uid *p = a, *q = b;
  int c = strcmp(p->peer, q->peer);
  return c ? c : p->uid < q->uid ? -1 : p->uid > q->uid;
}

/* u's tokens, refilled for the time since they were last counted. */
static void refill(struct loglimit_uid *u, int64_t now) {
  int64_t add = (now - u->at_ns) / NS_PER_LINE;

  if (add <= 0)
    return;
  if (add >= GSHMD_LOGLIMIT_BURST - u->tokens) {
    u->tokens = GSHMD_LOGLIMIT_BURST;
    u->at_ns = now;
  } else {
    u->tokens += (uint32_t)add;
    u->at_ns += add * NS_PER_LINE;
  }
}

/* The logger's gate (gshm_log_gate_fn): the loop's lines charged to a
 * uid, errors excepted, go while its bucket has a token. */
static bool gate(void *arg, int prio) {
  struct gshmd_loglimit *l = arg;
  struct loglimit_uid *u;
  uint64_t n;

  if (prio < GSHM_LOG_WARNING || !pthread_equal(pthread_self(), l->loop) || !(u = l->charged))
    return true;
  refill(u, gshm__now_ns(CLOCK_MONOTONIC));
  /* After drops the count goes first, and costs a token too: a uid that
   * keeps on gets RATE lines a second, counts included. */
  if (u->tokens < 1u + (u->dropped > 0)) {
    u->dropped++;
    l->dropped++;
    return false;
  }
  u->tokens--;
  if ((n = u->dropped)) { /* (paid for above, ahead of the line) */
    u->tokens--;
    u->dropped = 0;
    if (u->peer[0])
      gshm__log(GSHM_LOG_NOTICE | GSHM_LOG_UNGATED,
                "cluster: peer '%s': %" PRIu64 " log line%s about its requests not written (more "
                "than %u a second; gshm_log_lines_dropped_total)",
                u->peer, n, gshm__plural(n), GSHMD_LOGLIMIT_RATE);
    else
      gshm__log(GSHM_LOG_NOTICE | GSHM_LOG_UNGATED,
                "uid %u: %" PRIu64 " log line%s about its clients not written (more than %u a "
                "second; gshm_log_lines_dropped_total)",
                (unsigned)u->uid, n, gshm__plural(n), GSHMD_LOGLIMIT_RATE);
  }
  return true;
}

void gshmd_loglimit_start(struct gshmd_loglimit *l) {
  l->loop = pthread_self();
  gshm__log_set_gate(gate, l);
}

/* The loop's lines from now on are the bucket's of uid, or of peer where
 * not NULL (its record made at its first charge). */
static void charge_key(struct gshmd_loglimit *l, uid_t uid, const char *peer) {
  struct loglimit_uid key = {.uid = uid}, *u, **slot;

  snprintf(key.peer, sizeof(key.peer), "%s", peer ? peer : "");
  if ((slot = tfind(&key, &l->root, cmp_uid))) {
    l->charged = *slot;
    return;
  }
  if (!(u = calloc(1, sizeof(*u))))
    return;
  *u = key;
  u->tokens = GSHMD_LOGLIMIT_BURST;
  u->at_ns = gshm__now_ns(CLOCK_MONOTONIC);
  if (!(slot = tsearch(u, &l->root, cmp_uid))) {
    free(u);
    return;
  }
  l->charged = u;
}

void gshmd_loglimit_charge(struct gshmd_loglimit *l, const struct gshmd_cred *cred) {
  l->charged = NULL;
  if (cred && !cred->admin)
    charge_key(l, cred->uid, NULL);
}

void gshmd_loglimit_charge_peer(struct gshmd_loglimit *l, const char *peer) {
  l->charged = NULL;
  if (peer && *peer)
    charge_key(l, 0, peer);
}

void gshmd_loglimit_stop(struct gshmd_loglimit *l) {
  gshm__log_set_gate(NULL, NULL);
  l->charged = NULL;
  tdestroy(l->root, free);
  l->root = NULL;
}
