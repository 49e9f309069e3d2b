/* SPDX-License-Identifier: Apache-2.0 */
/* What requests.c's handlers and the files that take some of them
 * (requests_list.c: the list pager) share.  Internal to gshmd. */
#ifndef GSHMD_REQUESTS_INTERNAL_H
#define GSHMD_REQUESTS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gshm.pb-c.h"
#include "requests.h"

/* One request being answered: the packet, the reply and what must outlive
 * the handler until the reply is sent. */
struct req {
  struct conn *c;
  uint16_t type; /* GSHM_WIRE_* */
  const uint8_t *body;
  size_t len;
  Gshm__Reply *reply;
  int fd_out;
  bool fd_ours;     /* fd_out is the handler's, closed once sent (else lent by the backend) */
  char msg[256];
  /* Storage that must outlive the handler until the reply is sent. */
  Gshm__LeaseGrant grant;
  Gshm__SegmentInfo info;
  Gshm__Welcome welcome;
  Gshm__StatusInfo status;
  Gshm__DeviceList devices;
  Gshm__SegmentList segments;
  Gshm__LeaseList leases;
  Gshm__ClientList clients;
  char *backends[2];
  uint8_t legacy_handle[64];
  void *free_after; /* malloc'ed, freed after the reply is sent */
  struct gshmd_lease *granted; /* a create's or open's lease; created: a create's */
  bool created;
  uint32_t request_id;
  bool deferred;    /* the handler answers later (cluster requests) */
};

/* LIST_SEGMENTS, LIST_LEASES and LIST_CLIENTS (q->type): one page of the
 * list after m->after, at most m->limit items (0: GSHMD_LIST_MAX) and one
 * reply packet, in q's reply.  Returns 0 (an empty page is a reply too). */
int gshmd__request_list(struct req *q, Gshm__ListRequest *m);

#endif
