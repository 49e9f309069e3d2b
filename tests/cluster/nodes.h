/* SPDX-License-Identifier: Apache-2.0 */
/* What the cluster tests share: real gshmd nodes of a cluster on
 * 127.0.0.1, each with its own Unix socket and cluster port, their keys,
 * and host segments of seeded bytes.  cmocka asserts inside (include
 * after <cmocka.h>'s prerequisites). */
#ifndef GSHM_TEST_CLUSTER_NODES_H
#define GSHM_TEST_CLUSTER_NODES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "gshm.h"
#include "harness.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

struct node {
  struct harness h;
  char name[16];
  int port;
  char argv_store[16][512];
  const char *argv[17];
};

/* The frame header of the cluster port (daemon/cluster/stream.h's
 * struct frame_hdr), for tests that write frames without gshmd's stream
 * code: kind 1 a control frame (before the hello: plain). */
struct port_frame {
  uint32_t len;
  uint8_t kind;
  uint8_t reserved[3];
  uint32_t request_id;
  uint32_t reserved2;
  uint64_t offset;
};

/* cluster.pull_group of every node started (the test's own group: set it,
 * or call keys_make, before the first node_start). */
extern char node_group[64];

/* Starts n as cluster node `name` listening on n->port (a free one when
 * 0) with peers, the key file and the export patterns; extra "--set"
 * values follow, NULL-terminated.  GSHM_TEST_CLUSTER_TRANSPORT in the
 * environment sets every node's cluster.transport.  n->argv keeps the
 * arguments (for harness_restart). */
void node_start(struct node *n, const char *name, const char *peers, const char *key,
                const char *exports, ...);
/* SIGKILLs every node started (atexit: a failed check leaves none behind). */
void nodes_kill(void);
/* The cluster suites' main: UCX_TLS=tcp and UCX's unused-variable
 * warnings off unless the environment sets them, every node and harness
 * leftover SIGKILLed at exit, GSHM_TEST_FILTER (a cmocka test filter)
 * honoured; then tests[0..n) run as group name between setup and
 * teardown.  Returns cmocka's result (the failed tests' count). */
struct CMUnitTest;
int nodes_run_group(const char *name, const struct CMUnitTest *tests, size_t n,
                    int (*setup)(void **), int (*teardown)(void **));
#define NODES_RUN(tests, setup, teardown)                                                       \
  nodes_run_group(#tests, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)
/* A TCP port of 127.0.0.1 free right now (bound once, then closed). */
int free_port(void);
/* A socket listening on 127.0.0.1 with backlog, at a port of the
 * kernel's choice (*port_out); the caller closes it. */
int listen_local(int backlog, int *port_out);
/* Writes a 44-byte key from seed to path (0600). */
void write_key(const char *path, unsigned long long seed);
gshm_client_t *connect_to(struct node *n);
/* A host segment of size bytes filled from seed, created through c, mode
 * 0644 (readable by others: what a plain export rule lets peers read). */
void make_segment(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed);
/* Asserts that segment name on c holds exactly the bytes of seed. */
void check_segment(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed);
/* Segments of c's daemon whose names start with prefix. */
unsigned count_named(gshm_client_t *c, const char *prefix);
/* A set of n host segments PREFIX00, PREFIX01, ...: segment i holds
 * size(i) bytes of seed base + i (set_make creates, set_check asserts
 * every byte, set_unlink unlinks them). */
void set_make(gshm_client_t *c, const char *prefix, int n, uint64_t (*size)(int),
              unsigned long long base);
void set_check(gshm_client_t *c, const char *prefix, int n, uint64_t (*size)(int),
               unsigned long long base);
void set_unlink(gshm_client_t *c, const char *prefix, int n);
/* A temporary folder with two key files (seeds 1 and 2); node_group set
 * to this process's group. */
struct cluster_keys {
  char dir[64];
  char key[300], other_key[300];
};
void keys_make(struct cluster_keys *k, const char *prefix);
void keys_remove(struct cluster_keys *k);
/* Stops the nodes of a test group, puller first (their exit status
 * must be 0). */
void nodes_stop(struct node *serving, struct node *puller);
/* A counter or gauge (no labels) from c's daemon's metrics. */
long metric(gshm_client_t *c, const char *name);
/* c's daemon's metric name once it passes floor (metrics are a snapshot
 * up to a second old), or its value after 3 s. */
long metric_past(gshm_client_t *c, const char *name, long floor);
/* What a failed pull must leave on c's daemon: no segment, hidden or
 * not, no bytes, and no segment `name` (unless NULL); and it answers. */
void assert_nothing_left(gshm_client_t *c, const char *name);
/* A thread that asks node n for its cluster peers every 200 ms until
 * *stop (what gshmctl peers does: n asks each peer for its count, which
 * keeps n's links to them busy). */
struct peers_monitor {
  pthread_t t;
  struct node *n;
  const atomic_bool *stop;
};
void peers_monitor_start(struct peers_monitor *m, struct node *n, const atomic_bool *stop);
void peers_monitor_join(struct peers_monitor *m);
/* Bytes of memory allocated to the memfds that process pid holds whose
 * link in /proc/PID/fd contains label ("memfd:gshm:pull": pulls' fresh or
 * recycled ones; "memfd:gshm:": every segment's): their blocks, whoever
 * maps them. */
uint64_t node_memfd_bytes(pid_t pid, const char *label);
/* CLOCK_MONOTONIC in milliseconds. */
int64_t now_ms(void);
/* The slowest of n stats of segment `name` by a local client, in
 * milliseconds (>= 0), each less the time this thread and gshmd's loop
 * thread (pid gshmd) waited for a CPU meanwhile (schedstat's run_delay):
 * what is left is gshmd's own doing, not the machine's other load.
 * *raw_out (may be NULL): the slowest without that correction, written
 * only on success.  Returns gshm_stat_name's negative error at the first
 * stat that fails, and asserts nothing itself, so that a thread other
 * than cmocka's may call it: the caller checks for < 0. */
int64_t slowest_stat_busy(gshm_client_t *c, const char *name, int n, pid_t gshmd,
                          int64_t *raw_out);

#endif
