/* SPDX-License-Identifier: Apache-2.0 */
/* The plain TCP anchors (bench_tcp.c) that gshm-bench pull (bench_pull.c)
 * and its --fanout run (bench_fanout.c) time the pulls against: the same
 * bytes over the same number of connections, send -> recv, with no gshm
 * in the way. */
#ifndef GSHM_BENCH_TCP_H
#define GSHM_BENCH_TCP_H

#include <sched.h> /* cpu_set_t (_GNU_SOURCE: gshm_warnings) */
#include <stdbool.h>
#include <stdint.h>

/* New memory as a pull lands in: a memfd of size bytes, mapped shared and
 * read-write, its pages made as they are first written, 2 MiB ones where
 * the kernel gives shared memory huge pages on request (MADV_HUGEPAGE, as
 * gshmd's daemon.host_huge_pages asks).  Returns the
 * mapping (the caller munmaps size bytes; no fd stays open) or NULL. */
uint8_t *bench_fresh_memfd(uint64_t size);

/* Seconds k (1..16) plain TCP connections on 127.0.0.1 (a sender and a
 * receiver thread each, connections made beforehand) take to move size
 * bytes from src into dst, each a contiguous 1/k of them, or into a new
 * memfd's memory (bench_fresh_memfd) when dst is NULL; -1 on failure. */
double bench_tcp_once(const uint8_t *src, uint8_t *dst, uint64_t size, unsigned k);

/* Node k's CPUs when each node has n of its own: [k*n, (k+1)*n) modulo
 * the machine's, as if each node were a machine.  Fills *set_out and
 * returns the first CPU. */
unsigned bench_node_cpus(unsigned k, unsigned n, cpu_set_t *set_out);

/* A set moved along nodes 0 .. hops over plain TCP (bench_tcp_chain). */
struct bench_chain_params {
  void *const *src;          /* node 0's segments (mapped, readable in forked children) */
  const uint64_t *sizes;     /* their sizes, bytes */
  unsigned count;            /* segments, >= 1 */
  unsigned hops;             /* 1 .. 16: hop i moves the set from node i-1 to node i */
  unsigned lanes;            /* connections per hop, 1 .. 16 */
  uint64_t chunk;            /* bytes per chunk, >= 1 */
  unsigned cpus_per_node;    /* 0: unpinned; else node k on bench_node_cpus(k, N) */
  bool relay; /* true: node i sends on what it received (a chain); false: every
               * hop's sender sends node 0's bytes (independent transfers) */
  bool written; /* receivers' memfds written through before the start (the
                 * memory state of pulls into recycled memory); false: new */
};

/* One process per node (forked; node k pinned as cpus_per_node says) and
 * lanes connections per hop: connection j of every hop carries chunks j,
 * j + lanes, ... of the set (in set order, each segment cut into chunks
 * of p->chunk bytes).  Hop i's receiver (node i) writes into new memfds
 * of the set's sizes (with p->written, written through before the start); with relay, node i's sender for hop i + 1 sends
 * each chunk from that memory as soon as its receiver landed it.  All
 * start at once; after the last byte every copy is compared with node
 * 0's.  Returns the seconds from the start to the last receiver's last
 * byte, or -1 on failure (printed on stderr). */
double bench_tcp_chain(const struct bench_chain_params *p);

#endif
