/* SPDX-License-Identifier: Apache-2.0 */
/* What serve.c (grants, Read, Stage) and serve_reg.c (served segments'
 * mappings and UCX registrations) share. */
#ifndef GSHMD_CLUSTER_SERVE_H
#define GSHMD_CLUSTER_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

#include "internal.h"

/* A served segment's mapping, made at its first grant, and its UCX
 * registration, made at its first grant whose bytes go over UCX (a
 * grant whose bytes go on gshm's TCP stream registers nothing); shared
 * by the grants that overlap.  The registration goes with the last of
 * them: UCX never holds a segment that no grant covers.  A host
 * segment's mapping that UCX never registered stays (cl->serve_idle, up
 * to SERVE_IDLE_MAX bytes and SERVE_IDLE_MAX_COUNT mappings, oldest
 * dropped first) until the segment is freed, so that the next
 * grant of a segment served again and again (every node of a fleet
 * pulling one model) finds its pages mapped: on the lent machines a
 * fresh mapping's read faults cost the source about 0.1 CPU s per GB. */
struct export_reg {
  void *addr;       /* mmap of the host segment (read-only); device: the backend's mapping */
  bool device;
  size_t len;
  ucp_mem_h memh;   /* NULL: not registered with UCX */
  unsigned grants;  /* live grants of the segment: the registration ends with the last */
  struct gshmd_segment *seg; /* NULL once freed under live grants (a revoke, or the failed
                                pull of a segment relayed in flight): then x is theirs */
  bool pull_failed;  /* ... freed as the failed pull's (relay.h), not revoked */
  /* the freed segment's memory, taken from it then (discarded): their
   * sends and copies in flight still read it; freed with the last grant */
  struct gshmd_alloc *mem;
  unsigned busy;    /* its grants' sends, copies and slot makings running */
  bool wipe;        /* revoked while busy: mem is discarded when the last of them ends */
  struct gshm_list idle_node; /* on cl->serve_idle while grants == 0 */
  bool idle;
};

/* Idle serving mappings kept: their page tables (2 MiB per GiB served)
 * are what they cost in bytes, and each is a VMA of gshmd's
 * vm.max_map_count (65530 by default), which a peer pulling many small
 * segments once each would otherwise use up. */
#define SERVE_IDLE_MAX (64ull << 30)
#define SERVE_IDLE_MAX_COUNT 4096

/* seg's last grant ended (or its first failed): the UCX registration
 * goes; a host segment's mapping is kept on cl->serve_idle, the oldest
 * idle ones dropped beyond SERVE_IDLE_MAX. */
void gshmd__export_reg_idle(struct gshmd_cluster *cl, struct gshmd_segment *seg);
/* A grant of x ended: x loses it; with the last, x idles (its segment's:
 * gshmd__export_reg_idle) or, when its segment was freed meanwhile,
 * goes with the memory it took (gshmd__serve_segment_free). */
void gshmd__export_reg_unref(struct gshmd_cluster *cl, struct export_reg *x);
/* n of x's sends, copies or slot makings ended (x->busy counts them); the
 * last one after a revoke discards the memory the revoke left to x. */
void gshmd__export_reg_unbusy(struct gshmd_cluster *cl, struct export_reg *x, unsigned n);
/* seg's mapping for peers' reads, made once per segment; registered with
 * UCX too when ucx (the grant's bytes go over UCX).  Errors: -ENOMEM,
 * -ENOTSUP, -EIO, the backend's. */
int gshmd__export_reg_get(struct gshmd_cluster *cl, struct gshmd_segment *seg, bool ucx,
                          struct export_reg **out);

#endif
