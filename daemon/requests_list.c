/* SPDX-License-Identifier: Apache-2.0 */
/* The list requests (LIST_SEGMENTS, LIST_LEASES, LIST_CLIENTS): a pager
 * over the registry's id-ordered lists that shows each requester only
 * what it may see (moved from requests.c). */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "registry.h"
#include "requests_internal.h"
#include "server.h"
#include "wire.h"

/* First list node with id > after, walking from the id tree when possible. */
static struct gshm_list *segments_after(struct gshmd_registry *r, uint64_t after) {
  struct gshmd_segment *seg;

  if (after == 0)
    return r->segments.next;
  if ((seg = gshmd_registry_find_id(r, after)))
    return seg->node.next;
  /* the cursor's segment was freed: its successor by id, O(log n) */
  return (seg = gshmd_registry_find_after(r, after)) ? &seg->node : &r->segments;
}

/* First lease with id > after, likewise. */
static struct gshm_list *leases_after(struct gshmd_registry *r, uint64_t after) {
  struct gshmd_lease *l = gshmd_registry_find_lease_after(r, after);
  return l ? &l->node : &r->leases;
}

static unsigned list_limit(const Gshm__ListRequest *m) {
  return m->limit == 0 || m->limit > GSHMD_LIST_MAX ? GSHMD_LIST_MAX : m->limit;
}

static bool may_see_client(const struct gshmd_client *viewer, const struct gshmd_client *c) {
  return viewer->cred.admin || viewer->cred.uid == c->cred.uid;
}

/* One kind of list for the pager: which nodes the requester sees, and
 * how one item of the reply is filled. */
struct list_kind {
  /* The id of the item at node (the cursor's unit). */
  uint64_t (*id)(struct gshm_list *node);
  /* Whether the requester may see the item at node. */
  bool (*visible)(const struct req *q, struct gshm_list *node);
  /* Fills item i of the reply (storage and pointer in the server's
   * list_items / list_ptrs) from node; returns its packed size. */
  size_t (*fill)(struct req *q, struct gshm_list *node, unsigned i);
};

static uint64_t segment_id(struct gshm_list *node) {
  return gshm_list_entry(node, struct gshmd_segment, node)->id;
}

static bool segment_visible(const struct req *q, struct gshm_list *node) {
  return gshmd_registry_may_see(q->c->client, gshm_list_entry(node, struct gshmd_segment, node));
}

static size_t segment_fill(struct req *q, struct gshm_list *node, unsigned i) {
  struct gshmd_server *s = q->c->srv;
  Gshm__SegmentInfo *si = &s->list_items.segments[i];

  gshmd_segment_to_info(gshm_list_entry(node, struct gshmd_segment, node), si);
  s->list_ptrs.segments[i] = si;
  return gshm__segment_info__get_packed_size(si);
}

static uint64_t lease_id(struct gshm_list *node) {
  return gshm_list_entry(node, struct gshmd_lease, node)->id;
}

static bool lease_visible(const struct req *q, struct gshm_list *node) {
  return may_see_client(q->c->client, gshm_list_entry(node, struct gshmd_lease, node)->client);
}

static size_t lease_fill(struct req *q, struct gshm_list *node, unsigned i) {
  struct gshmd_server *s = q->c->srv;
  struct gshmd_lease *l = gshm_list_entry(node, struct gshmd_lease, node);
  Gshm__LeaseInfo *li = &s->list_items.leases.info[i];
  char **devs = s->list_items.leases.devs[i];

  gshm__lease_info__init(li);
  li->lease_id = l->id;
  li->segment_id = l->seg->id;
  li->segment_name = l->seg->name;
  li->session_id = l->client->session_id;
  li->pid = l->client->cred.pid;
  li->uid = l->client->cred.uid;
  li->client_name = l->client->name;
  li->access = l->access;
  li->since_ns = l->since_ns;
  li->mapped = l->mapped;
  li->location = l->seg->mem->location;
  li->n_mapped_devices = 0;
  li->mapped_devices = devs;
  li->mapped_devices_total = l->mapped_devices ? l->mapped_count : 0;
  if (l->mapped_devices) {
    const char *p = l->mapped_devices;
    while (*p && li->n_mapped_devices < GSHMD_LEASE_DEVICES) {
      size_t k = strcspn(p, ",");
      char *buf = s->list_items.leases.devbuf[i][li->n_mapped_devices];
      snprintf(buf, sizeof(s->list_items.leases.devbuf[i][0]), "%.*s", (int)k, p);
      devs[li->n_mapped_devices++] = buf;
      p += k + (p[k] == ',');
    }
  }
  s->list_ptrs.leases[i] = li;
  return gshm__lease_info__get_packed_size(li);
}

static uint64_t client_id(struct gshm_list *node) {
  return gshm_list_entry(node, struct gshmd_client, node)->session_id;
}

static bool client_visible(const struct req *q, struct gshm_list *node) {
  return may_see_client(q->c->client, gshm_list_entry(node, struct gshmd_client, node));
}

static size_t client_fill(struct req *q, struct gshm_list *node, unsigned i) {
  struct gshmd_server *s = q->c->srv;
  struct gshmd_client *cl = gshm_list_entry(node, struct gshmd_client, node);
  Gshm__ClientInfo *ci = &s->list_items.clients[i];

  gshm__client_info__init(ci);
  ci->session_id = cl->session_id;
  ci->pid = cl->cred.pid;
  ci->uid = cl->cred.uid;
  ci->gid = cl->cred.gid;
  ci->name = cl->name;
  ci->since_ns = cl->since_ns;
  ci->leases = cl->nleases;
  s->list_ptrs.clients[i] = ci;
  return gshm__client_info__get_packed_size(ci);
}

/* The pager: fills one page of a list, walking the id-ordered list from
 * `from` to `head`, with at most the request's limit of items and as many
 * as fit in one reply packet, looking at no more than GSHMD_LIST_VISITS
 * items past the cursor (else another user's were all walked for each
 * request).  Returns the number of items (maybe 0); *next_out is the cursor: 0 when the walk
 * ended, else just below the next page's first item, or the last one looked at (SECURITY.md). */
static unsigned list_page(struct req *q, const Gshm__ListRequest *m, struct gshm_list *from,
                          struct gshm_list *head, const struct list_kind *kind,
                          uint64_t *next_out) {
  size_t budget = gshm__wire_list_budget(q->c->srv->cfg->max_packet), used = 0;
  unsigned limit = list_limit(m), n = 0, visits = 0;
  uint64_t done = 0; /* every item up to this id is on the page or not the requester's */

  *next_out = 0;
  for (struct gshm_list *pos = from; pos != head; pos = pos->next) {
    uint64_t id = kind->id(pos);
    size_t sz;
    if (id <= m->after) /* (clients: their walk starts at the head) */
      continue;
    if (visits++ == GSHMD_LIST_VISITS || (n == limit && kind->visible(q, pos))) {
      *next_out = kind->visible(q, pos) ? id - 1 : done; /* (id - 1: no other's id told) */
      break;
    }
    if (!kind->visible(q, pos)) {
      done = id;
      continue;
    }
    sz = gshm__wire_embedded_size(kind->fill(q, pos, n));
    /* An item larger than the configured budget (limits lowered since a
     * long name was made, e.g. across a restart) goes alone on its page,
     * up to the wire's 64 KiB that every client reads: a list never ends
     * before its last item. */
    if (used + sz > (n ? budget : GSHM_WIRE_MAX_PACKET - GSHM_WIRE_HEADER_SIZE - 64)) {
      *next_out = n ? id - 1 : done;
      break;
    }
    used += sz;
    done = id;
    n++;
  }
  return n;
}

/* LIST_SEGMENTS, LIST_LEASES and LIST_CLIENTS (requests_internal.h). */
int gshmd__request_list(struct req *q, Gshm__ListRequest *m) {
  static const struct list_kind segments = {segment_id, segment_visible, segment_fill},
                                leases = {lease_id, lease_visible, lease_fill},
                                clients = {client_id, client_visible, client_fill};
  struct gshmd_server *s = q->c->srv;
  struct gshmd_registry *r = s->reg;

  switch (q->type) {
  case GSHM_WIRE_LIST_SEGMENTS:
    gshm__segment_list__init(&q->segments);
    q->segments.n_segments = list_page(q, m, segments_after(r, m->after), &r->segments,
                                       &segments, &q->segments.next);
    q->segments.segments = s->list_ptrs.segments;
    q->reply->body_case = GSHM__REPLY__BODY_SEGMENTS;
    q->reply->segments = &q->segments;
    break;
  case GSHM_WIRE_LIST_LEASES:
    gshm__lease_list__init(&q->leases);
    q->leases.n_leases =
        list_page(q, m, leases_after(r, m->after), &r->leases, &leases, &q->leases.next);
    q->leases.leases = s->list_ptrs.leases;
    q->reply->body_case = GSHM__REPLY__BODY_LEASES;
    q->reply->leases = &q->leases;
    break;
  default:
    gshm__client_list__init(&q->clients);
    q->clients.n_clients =
        list_page(q, m, r->clients.next, &r->clients, &clients, &q->clients.next);
    q->clients.clients = s->list_ptrs.clients;
    q->reply->body_case = GSHM__REPLY__BODY_CLIENTS;
    q->reply->clients = &q->clients;
    break;
  }
  return 0;
}

