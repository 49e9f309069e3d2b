/* SPDX-License-Identifier: Apache-2.0 */
/* What gshm-bench pull (bench_pull.c) and its --fanout run
 * (bench_fanout.c) share: the options and starting gshmd nodes. */
#ifndef GSHM_BENCH_PULL_H
#define GSHM_BENCH_PULL_H

#include <stdbool.h>
#include <stdint.h>

#include "spawn.h"

struct pull_opts {
  uint64_t sizes[32];
  int nsizes;
  int iters;
  const char *location;
  const char *to; /* the pulled segment's location; NULL: location */
  const char *perftest;
  const char *gshmd;
  bool no_perftest;
  bool encrypt;
  const char *chunk, *depth;
  unsigned streams;  /* cluster.streams on both nodes, and the TCP baseline's connections */
  /* --fanout N: N + 1 nodes in a chain, each pulling the set from the
   * one before; the set: --model LAYERSxHIDDEN or --set COUNTxSIZE */
  int fanout;
  unsigned layers, hidden;  /* model shapes (bf16), when set_count is 0 */
  unsigned set_count;
  uint64_t set_size;
  /* --cpus-per-node N: the k-th gshmd started gets CPUs [k*N, (k+1)*N)
   * (modulo the machine's), as if each node were a machine of its own */
  unsigned cpus_per_node;
  /* --gshmd-set KEY=VALUE (up to 4): passed to every gshmd as --set */
  const char *sets[4];
  unsigned nsets;
  /* --recycle BYTES: daemon.host_recycle on every node started (the
   * pulling one recycles); NULL: off */
  const char *recycle;
  /* --no-plain (--fanout): the plain TCP anchors are not run */
  bool no_plain;
  /* --split (--fanout 3): n1 and n2 pull the set from n0 at once, n3
   * pulls half its segments from n1 and half from n2 (each node a peer
   * of every other): no node both receives and sends a whole copy */
  bool split;
  /* --sources: node i pulls the set from every node before it at once
   * ("n0,...,n{i-1}", each segment from the least busy): n0 serves
   * 1 + 1/2 + ... + 1/N copies */
  bool sources;
};

/* A TCP port of 127.0.0.1 free right now; 0 on failure. */
int bench_free_port(void);
/* CLOCK_MONOTONIC in seconds. */
double bench_now_s(void);
/* Starts gshmd node `name` (cluster port `port` on 127.0.0.1, peers,
 * key file, export rules) with the options' chunk, depth, encryption and
 * backend.  Returns 0 or a negative errno (printed). */
int bench_pull_node_start(struct gshm_spawn *sp, const char *gshmd, const char *name, int port,
                          const char *peers, const char *key, const char *exports,
                          const struct pull_opts *o);
/* --model (model true) or --set: "LxH" or "COUNTxSIZE" (SIZE with K, M,
 * G).  Returns 0 or -1. */
int bench_fanout_set_opt(struct pull_opts *o, bool model, const char *arg);
/* The --fanout run (bench_fanout.c): returns the exit status. */
int bench_fanout_run(const struct pull_opts *o, const char *gshmd, const char *key);

#endif
