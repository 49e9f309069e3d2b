/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster soak's shared parts (test_soak_cluster.c runs it,
 * soak_cluster_check.c checks what the nodes hold): the versions A
 * publishes, the pulls attempted, and the checks of the invariants. */
#ifndef GSHM_TEST_SOAK_CLUSTER_H
#define GSHM_TEST_SOAK_CLUSTER_H

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"

#define MAX_SEGS 300
#define MAX_VERSIONS 400
#define MAX_ATTEMPTS 2000
#define MAX_RUNNING 3
#define TIMEOUT_MS 3000
#define HANG_MS 20000 /* no progress for this long: a hang (the load of CI included) */
/* A node SIGSTOPped stays so this long: a pull reading it must have failed
 * by then (TIMEOUT_MS, the 1 s sweep, a hello's own timeout; CI's load). */
#define FREEZE_MS 12000

enum { NA, NB, NC };
enum { K_FRESH, K_CUR, K_RELAY, K_RCUR };
enum { V_NONE, V_PUBLISHED, V_RETIRED };

struct version {
  int n, state, damaged; /* damaged: the index unlinked on A mid-pull, or -1 */
  uint64_t id[MAX_SEGS], gen[MAX_SEGS];
};

struct attempt {
  int node, peer, kind, version, from; /* from: the B attempt a relay reads */
  char prefix[32], local[32];
  pid_t pid;
  int running, killed, unknown, cleaned, err, bad;
  unsigned restarts0;          /* the pulling node's restarts at start */
  uint32_t count, relayed;
  uint64_t bytes;
  int64_t start_ms, end_ms;
  _Atomic int64_t progress_ms; /* last time bytes_done grew */
  _Atomic uint64_t progress_bytes, progress_total;
  int relay_wanted;            /* a B pull: C is to read it through B while it runs */
  int frozen_peer;             /* its peer was SIGSTOPped while it ran */
  char msg[700];
};

struct shared {
  struct version v[MAX_VERSIONS];
  struct attempt at[MAX_ATTEMPTS];
};


#define EXPECT(cond, ...)                                                                         \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      failures++;                                                                                 \
      fprintf(stderr, "FAIL (seed %" PRIu64 "): ", seed);                                         \
      fprintf(stderr, __VA_ARGS__);                                                               \
      fputc('\n', stderr);                                                                        \
    }                                                                                             \
  } while (0)

static inline uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* What the parent and the pulling clients share (MAP_SHARED). */
extern struct shared *sh;
extern uint64_t seed, prng;
extern struct node nodes[3];
extern const char *const node_names[];
extern int nversions, nattempts, failures;
extern int64_t last_restart_ms[3];
extern unsigned checks, bytes_checked_segs;
extern int fds_base[3];

static inline int64_t ms(void) { return now_ms(); }
/* A number below n from the parent's seeded choices. */
unsigned pick(unsigned n);

/* Version v's shape from the seed: its segment count, segment i's size
 * (log-uniform, 1 byte .. 4 MiB) and the seed of its bytes. */
int version_count(int v);
uint64_t seg_size(int v, int i);
unsigned long long seg_seed(int v, int i);
/* Whether open segment s holds version v's segment i, every byte. */
bool bytes_ok(gshm_segment_t *s, int v, int i);
/* Whether s's source is segment i of version v as A made it (id,
 * generation, size). */
bool source_ok(const gshm_segment_info_t *s, int *v, int *i);
/* A client of node (NULL, counted as a failure, when it cannot connect). */
gshm_client_t *conn(int node);

/* One name of a prefix on a node: the version it holds, -1 none. */
struct seen {
  int v;           /* version, -1: none */
  uint64_t id;
};

/* Checks every pulled segment of node: names, sources, all-or-nothing
 * sets, replaced prefixes; the bytes of all (all) or of about four. */
void check_node(int node, bool all);
/* Unlinks node's names under prefix; returns how many. */
int unlink_prefix(int node, const char *prefix);
/* Node's "name#id.generation" lines of every live segment (malloc'ed). */
char *snapshot(int node);
/* Node's fds less the fd store's bucket sockets (settled). */
int own_fds(int node);
/* Every node without segment or byte, and (fds_too) its fds at their level
 * after warm-up, waiting out a restart's grace period. */
void check_quiet(const char *when, bool fds_too);
/* Whether node's daemon has a pull of (peer, remote prefix) in flight;
 * *listed (may be NULL) set when its listing is done. */
bool in_flight(int node, int peer, const char *prefix, bool *listed);
/* Waits for the links of all three nodes to be up (the warm fd level). */
void wait_mesh(void);

#endif
