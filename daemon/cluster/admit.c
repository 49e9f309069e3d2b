/* SPDX-License-Identifier: Apache-2.0 */
/* Which connections the cluster port takes into their hello (link.h
 * LINK_MAX_PENDING, LINK_MAX_PENDING_ADDR): a host that holds no key may
 * connect, so what it holds before the hello is bounded, in all and per
 * source address.  The bound in all spares the addresses of cluster.peers:
 * hosts that are not peers filled every slot from 16 addresses (4 each;
 * an IPv6 host has 2^64) and renewed them every 3 s, and no peer's link
 * or data lane passed its hello meanwhile.  A peer's address keeps its 4:
 * an address is not spoofed on a TCP connection, short of being on the
 * path, and whoever shares a peer's address (another user of that host)
 * can take only those 4 (docs/SECURITY.md).  Nor do the strangers'
 * slots come out of the cluster's fd budget (gshmd__link_strangers). */
#include <netinet/in.h>
#include <string.h>

#include "link.h"

/* The IPv4 address of sa, also one mapped into IPv6 (a listener on
 * "[::]" sees IPv4 peers so); false when it has none. */
static bool ipv4_of(const struct sockaddr_storage *sa, struct in_addr *out) {
  const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

  if (sa->ss_family == AF_INET) {
    *out = ((const struct sockaddr_in *)sa)->sin_addr;
    return true;
  }
  if (sa->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
    return false;
  memcpy(out, &s6->sin6_addr.s6_addr[12], sizeof(*out));
  return true;
}

/* Whether a and b are the same host address (ports aside). */
static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  struct in_addr x, y;
  bool a4 = ipv4_of(a, &x), b4 = ipv4_of(b, &y);

  if (a4 || b4)
    return a4 && b4 && x.s_addr == y.s_addr;
  return a->ss_family == AF_INET6 && b->ss_family == AF_INET6 &&
         !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                 &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
}

/* Whether sa is the address of a peer of cluster.peers. */
static bool peer_address(const struct links *ll, const struct sockaddr_storage *sa) {
  for (unsigned i = 0; i < ll->npeers; i++)
    if (same_host(&ll->peers[i].sa, sa))
      return true;
  return false;
}

/* The most connections in their hello from addresses that are not
 * peers': LINK_MAX_PENDING, and at most a quarter of the budget.  They
 * are held beside the budget, never out of it: peers' links and data
 * lanes use most of it in a large cluster (a link and cluster.streams
 * lanes each way: 18 connections a peer at 8 streams), and strangers'
 * slots taken out of it closed a peer's new link at accept ("no cluster
 * connection left") from 12 nodes on. */
static unsigned strangers_max(const struct links *ll) {
  unsigned quarter = ll->max_conns / 4 ? ll->max_conns / 4 : 1;
  return quarter < LINK_MAX_PENDING ? quarter : LINK_MAX_PENDING;
}

/* Whether o's connection is a stranger's still counted in ll->nconns
 * (one refused or timed out is until its close completes). */
static bool stranger_fd(const struct link *o) { return o->stranger && !o->stream_closed; }

unsigned gshmd__link_strangers(const struct links *ll) {
  struct gshm_list *pos;
  unsigned n = 0;
  gshm_list_foreach(pos, &ll->links) {
    n += stranger_fd(gshm_list_entry(pos, struct link, node));
  }
  return n;
}

unsigned gshmd__link_peer_conns(const struct links *ll) {
  return ll->nconns - gshmd__link_strangers(ll);
}

const char *gshmd__link_admit(struct links *ll, struct link *l) {
  struct gshm_list *pos;
  unsigned all = 0, same = 0, fds = 0;

  l->from_peer = peer_address(ll, &l->remote_sa);
  l->stranger = !l->from_peer;
  if (ll->stopping)
    return "gshmd is stopping";
  gshm_list_foreach(pos, &ll->links) {
    const struct link *o = gshm_list_entry(pos, struct link, node);
    fds += stranger_fd(o);
    if (!o->pending)
      continue;
    same += same_host(&o->remote_sa, &l->remote_sa);
    all += !o->from_peer;
  }
  /* (l is among them; the peers' own use is nconns less the strangers') */
  if (l->from_peer && ll->nconns - fds > ll->max_conns)
    return "no cluster connection left in gshmd's budget";
  if (!l->from_peer && all > strangers_max(ll))
    return "too many connections in their hello";
  if (same > LINK_MAX_PENDING_ADDR)
    return "too many connections in their hello from this address";
  return NULL;
}
