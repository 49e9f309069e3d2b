/* SPDX-License-Identifier: Apache-2.0 */
/* A rogue serving peer's bytes over UCX (rogue.h for its link): a UCX
 * worker of its own, in a child process, that answers a node's Read with
 * an active message whose data goes by rendezvous and then stops before
 * the node's receive ends; resumed on request, it completes that
 * rendezvous late (UCX then writes its bytes into whatever the node's
 * receive named).  Plain C: the host test (cmocka) and the GPU variant
 * (no cmocka on the GPU machines) share it. */
#ifndef GSHM_TEST_CLUSTER_ROGUE_UCX_H
#define GSHM_TEST_CLUSTER_ROGUE_UCX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "rogue.h"

/* A pull of `name` from peer (gshm_pull, into location: NULL for the
 * daemon's choice) by the gshmd of socket sock, in a thread: its error,
 * gshm_last_error's message, when it ended (CLOCK_MONOTONIC ms) and done
 * once it did. */
struct rogue_ucx_pull {
  pthread_t t;
  const char *sock, *peer, *name, *location;
  int err;
  char msg[512];
  int64_t done_ms;
  atomic_bool done;
};
/* Starts pl's thread (pl's inputs set, the rest zero).  Returns 0 or
 * pthread_create's error; the caller joins pl->t. */
int rogue_ucx_pull_start(struct rogue_ucx_pull *pl);

/* A child with its worker: pid, and the pipes to ask it and hear it. */
struct rogue_ucx_child {
  pid_t pid;
  int ask, said;
};

/* Takes a node's link to serving rogue r as `name` (CAP_UCX) from lfd
 * (the node's tries that nobody took in time come first: each fails its
 * hello), copies the worker address of its UcxOffer into addr (cap
 * bytes) and its token into *token_out, and answers it.  Returns the
 * address's length, or 0. */
size_t rogue_ucx_take_link(struct rogue *r, int lfd, const char *name, const uint8_t key[32],
                           uint8_t *addr, size_t cap, uint64_t *token_out);
/* Forks ch's child: a UCX worker (UCX's shared-memory transports only,
 * "sm": its puts land by cross-memory attach, whatever else the node
 * has; rendezvous by put_zcopy: the node waits for its puts) with an
 * endpoint to the node's worker at addr, wired up.  Returns 0 once it is, or -1 (ch->pid 0). */
int rogue_ucx_child_start(struct rogue_ucx_child *ch, const uint8_t *addr, uint64_t token);
/* Has ch's child answer Read rid (len bytes at offset) with the rendezvous
 * of len bytes from seed (harness_random), and stop (SIGSTOP) once the
 * node answered its RTS.  Returns 0, or -1. */
int rogue_ucx_child_send(struct rogue_ucx_child *ch, uint32_t rid, uint64_t offset, uint64_t len,
                         unsigned long long seed);
/* Wakes ch's stopped child (SIGCONT) and has it complete its rendezvous:
 * its puts into the node's memory, then its end.  Returns UCX's status
 * of the send (0: UCS_OK, every byte written), or 1: not ended within
 * ms, or -1: the child did not answer. */
int rogue_ucx_child_resume(struct rogue_ucx_child *ch, int ms);
/* SIGKILLs and reaps ch's child and closes its pipes (none: nothing). */
void rogue_ucx_child_kill(struct rogue_ucx_child *ch);
/* Serves a pull of `name` (size bytes of host memory, grant id 1000 +
 * id) on r until *done: its grant, then its first Read answered by ch's
 * rendezvous of bytes from seed (rogue_ucx_child_send), which stops;
 * other messages are dropped, a count request answered.  *read_len_out:
 * that Read's length; *sent_ms_out: when the child stopped (now_ms's
 * clock).  Returns 0, or -1: *done came first, or the child failed. */
int rogue_ucx_stuck_read(struct rogue *r, struct rogue_ucx_child *ch, uint64_t id,
                         const char *name, uint64_t size, unsigned long long seed,
                         const atomic_bool *done, uint64_t *read_len_out, int64_t *sent_ms_out);

#endif
