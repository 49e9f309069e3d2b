/* SPDX-License-Identifier: Apache-2.0 */
/* Real gshmd nodes of a cluster on 127.0.0.1 for the cluster tests: each
 * with its own Unix socket and cluster port. */
#ifndef GSHM_TEST_CLUSTER_NODES_H
#define GSHM_TEST_CLUSTER_NODES_H

#include <stdint.h>

#include "gshm.h"
#include "harness.h"

struct node {
  struct harness h;
  char name[16];
  int port;
  char argv_store[12][512];
  const char *argv[13];
};

extern char node_group[64]; /* cluster.pull_group of every node started */

/* Starts node n (n->port: its cluster port, chosen when 0) with its
 * cluster settings; extra "--set" values follow, NULL-terminated. */
void node_start(struct node *n, const char *name, const char *peers, const char *key,
                const char *exports, ...);
/* SIGKILLs every node started (atexit: a failed check leaves none behind). */
void nodes_kill(void);
/* A TCP port of 127.0.0.1 free right now. */
int free_port(void);
/* A key file at path (0600) made from seed. */
void write_key(const char *path, unsigned long long seed);
gshm_client_t *connect_to(struct node *n);
/* A host segment of size bytes filled from seed, created on c's node. */
void make_segment(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed);
/* Asserts that segment name on c holds exactly the bytes of seed. */
void check_segment(gshm_client_t *c, const char *name, uint64_t size, unsigned long long seed);
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

#endif
