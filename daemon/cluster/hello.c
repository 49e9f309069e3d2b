/* SPDX-License-Identifier: Apache-2.0 */
/* The authenticated hello (docs/CLUSTER.md "How a pull goes"): mutual
 * challenge-response with libsodium's crypto_auth over both nonces and
 * both node names. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "log.h"

/* crypto_auth over a direction label, both nonces and both names:
 * connecting side (C) first in every field, so that no proof can be
 * replayed in the other direction or on another exchange. */
static void hello_mac(const struct gshmd_cluster *cl, char dir, const uint8_t *nonce_c,
                      const uint8_t *nonce_s, const char *name_c, const char *name_s,
                      uint8_t mac[crypto_auth_BYTES]) {
  uint8_t buf[16 + 2 * GSHMD_CLUSTER_NONCE + 2 * 64];
  size_t n = 0, a = strlen(name_c), b = strlen(name_s);

  memcpy(buf, "gshm-cluster-1 ", 15);
  n = 15;
  buf[n++] = (uint8_t)dir;
  memcpy(buf + n, nonce_c, GSHMD_CLUSTER_NONCE);
  n += GSHMD_CLUSTER_NONCE;
  memcpy(buf + n, nonce_s, GSHMD_CLUSTER_NONCE);
  n += GSHMD_CLUSTER_NONCE;
  memcpy(buf + n, name_c, a + 1); /* names are < 64 bytes; NULs separate them */
  n += a + 1;
  memcpy(buf + n, name_s, b + 1);
  n += b + 1;
  crypto_auth(mac, buf, n, cl->key);
}

/* Inbound: Hello -> Challenge. */
static void on_hello(struct link *l, const Gshm__Cluster__Hello *h) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Challenge c = GSHM__CLUSTER__CHALLENGE__INIT;
  uint8_t mac[crypto_auth_BYTES];
  char msg[200];

  if (h->major != GSHMD_CLUSTER_MAJOR) {
    snprintf(msg, sizeof(msg), "cluster protocol %u.%u is not spoken here (%u.%u)", h->major,
             h->minor, GSHMD_CLUSTER_MAJOR, GSHMD_CLUSTER_MINOR);
    gshmd__link_refuse(l, REFUSE_VERSION, -EPROTONOSUPPORT, msg);
    return;
  }
  if (h->nonce.len != GSHMD_CLUSTER_NONCE || !gshmd__cluster_name_ok(h->node_name)) {
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "malformed hello");
    return;
  }
  if (!(l->peer = gshmd__link_peer_find(&cl->ll, h->node_name))) {
    snprintf(msg, sizeof(msg), "node '%.63s' is not in cluster.peers of '%s'", h->node_name,
             cl->ll.node_name);
    gshmd__link_refuse(l, REFUSE_UNKNOWN_PEER, -EPERM, msg);
    return;
  }
  memcpy(l->nonce_theirs, h->nonce.data, GSHMD_CLUSTER_NONCE);
  hello_mac(cl, 'S', l->nonce_theirs, l->nonce_mine, l->peer->name, cl->ll.node_name, mac);
  c.major = GSHMD_CLUSTER_MAJOR;
  c.minor = GSHMD_CLUSTER_MINOR;
  c.node_name = cl->ll.node_name;
  c.nonce.data = l->nonce_mine;
  c.nonce.len = GSHMD_CLUSTER_NONCE;
  c.mac.data = mac;
  c.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_CHALLENGE;
  m.challenge = &c;
  l->state = LINK_AUTH;
  gshmd__link_send(l, &m);
}

/* Outbound: Challenge -> Auth (the peer proved the key). */
static void on_challenge(struct link *l, const Gshm__Cluster__Challenge *c) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Auth a = GSHM__CLUSTER__AUTH__INIT;
  uint8_t mac[crypto_auth_BYTES];
  char msg[400];

  if (c->major != GSHMD_CLUSTER_MAJOR) {
    snprintf(msg, sizeof(msg), "peer speaks cluster protocol %u.%u, this gshmd %u.%u", c->major,
             c->minor, GSHMD_CLUSTER_MAJOR, GSHMD_CLUSTER_MINOR);
    gshmd__link_refuse(l, REFUSE_VERSION, -EPROTONOSUPPORT, msg);
    return;
  }
  if (c->nonce.len != GSHMD_CLUSTER_NONCE || c->mac.len != crypto_auth_BYTES) {
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "malformed challenge");
    return;
  }
  if (strcmp(c->node_name, l->peer->name)) {
    snprintf(msg, sizeof(msg), "the node at %s calls itself '%.63s', not '%s'", l->peer->address,
             c->node_name, l->peer->name);
    gshmd__link_refuse(l, REFUSE_UNKNOWN_PEER, -EPERM, msg);
    return;
  }
  memcpy(l->nonce_theirs, c->nonce.data, GSHMD_CLUSTER_NONCE);
  hello_mac(cl, 'S', l->nonce_mine, l->nonce_theirs, cl->ll.node_name, l->peer->name, mac);
  if (sodium_memcmp(mac, c->mac.data, sizeof(mac)) != 0) {
    snprintf(msg, sizeof(msg), "peer '%s' did not prove the shared key (cluster.secret_file differs)",
             l->peer->name);
    gshmd__link_refuse(l, REFUSE_BAD_KEY, -EACCES, msg);
    return;
  }
  hello_mac(cl, 'C', l->nonce_mine, l->nonce_theirs, cl->ll.node_name, l->peer->name, mac);
  a.mac.data = mac;
  a.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH;
  m.auth = &a;
  l->state = LINK_AUTH;
  gshmd__link_send(l, &m);
}

/* Inbound: Auth -> AuthOk; the link serves from now on. */
static void on_auth(struct link *l, const Gshm__Cluster__Auth *a) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__AuthOk ok = GSHM__CLUSTER__AUTH_OK__INIT;
  uint8_t mac[crypto_auth_BYTES];
  char msg[200];

  hello_mac(cl, 'C', l->nonce_theirs, l->nonce_mine, l->peer->name, cl->ll.node_name, mac);
  if (a->mac.len != sizeof(mac) || sodium_memcmp(mac, a->mac.data, sizeof(mac)) != 0) {
    snprintf(msg, sizeof(msg), "node '%s' did not prove the shared key", l->peer->name);
    gshmd__link_refuse(l, REFUSE_BAD_KEY, -EACCES, msg);
    return;
  }
  if (gshmd__serve_link_up(cl, l)) {
    gshmd__link_fail(l, -ENOMEM, "out of memory");
    return;
  }
  l->state = LINK_UP;
  cl->ll.ninbound_pending--;
  gshm_log_info("cluster: peer '%s' connected from %s", l->peer->name, l->remote);
  ok.exported = gshmd__serve_count(cl);
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH_OK;
  m.auth_ok = &ok;
  gshmd__link_send(l, &m);
}

/* Outbound: AuthOk, the peer is up: what waited for it goes. */
static void on_auth_ok(struct link *l, const Gshm__Cluster__AuthOk *ok) {
  gshmd__link_up(l, ok->exported);
}

void gshmd__hello_begin(struct link *l) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Hello h = GSHM__CLUSTER__HELLO__INIT;

  h.major = GSHMD_CLUSTER_MAJOR;
  h.minor = GSHMD_CLUSTER_MINOR;
  h.node_name = cl->ll.node_name;
  h.nonce.data = l->nonce_mine;
  h.nonce.len = sizeof(l->nonce_mine);
  m.body_case = GSHM__CLUSTER__MSG__BODY_HELLO;
  m.hello = &h;
  if (gshmd__link_send(l, &m))
    gshmd__link_fail(l, -EIO, "cannot send hello");
}

bool gshmd__hello_handle(struct gshmd_cluster *cl, struct link *l, const Gshm__Cluster__Msg *m) {
  (void)cl;
  switch (m->body_case) {
  case GSHM__CLUSTER__MSG__BODY_HELLO:
    if (!l->inbound || l->state != LINK_HELLO)
      return false;
    on_hello(l, m->hello);
    return true;
  case GSHM__CLUSTER__MSG__BODY_CHALLENGE:
    if (l->inbound || l->state != LINK_HELLO)
      return false;
    on_challenge(l, m->challenge);
    return true;
  case GSHM__CLUSTER__MSG__BODY_AUTH:
    if (!l->inbound || l->state != LINK_AUTH)
      return false;
    on_auth(l, m->auth);
    return true;
  case GSHM__CLUSTER__MSG__BODY_AUTH_OK:
    if (l->inbound || l->state != LINK_AUTH)
      return false;
    on_auth_ok(l, m->auth_ok);
    return true;
  default:
    return false;
  }
}
