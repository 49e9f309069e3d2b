/* SPDX-License-Identifier: Apache-2.0 */
/* What the cluster tests share: gshmd nodes on 127.0.0.1 with their
 * cluster settings, keys, and host segments of seeded bytes.  cmocka
 * asserts inside (include after <cmocka.h>'s prerequisites). */
#ifndef GSHM_TESTS_CLUSTER_NODES_H
#define GSHM_TESTS_CLUSTER_NODES_H

#include <stdint.h>

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

/* The cluster.pull_group every node gets (the test's own group: set it
 * before the first node_start). */
extern char group[64];

/* SIGKILLs every node started (atexit: a failed check leaves no gshmd). */
void kill_started(void);
/* A free TCP port on 127.0.0.1 (bound once, then closed). */
int free_port(void);
/* Writes a 44-byte key from seed to path (0600). */
void write_key(const char *path, unsigned long long seed);
/* Starts n as cluster node `name` listening on n->port (a free one when
 * 0) with peers, the key file and the export patterns; extra "--set"
 * values follow, NULL-terminated.  n->argv keeps the arguments (for
 * harness_restart). */
void node_start(struct node *n, const char *name, const char *peers, const char *key,
                const char *exports, ...);
gshm_client_t *connect_to(struct node *n);
/* A host segment of size bytes filled from seed, created through c. */
void make_segment(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed);
/* Asserts that segment name on c holds exactly the bytes of seed. */
void check_segment(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed);

#endif
