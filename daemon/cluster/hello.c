/* SPDX-License-Identifier: Apache-2.0 */
/* The authenticated hello (docs/CLUSTER.md "How a pull goes"): mutual
 * challenge-response with libsodium's crypto_auth over both nonces, both
 * node names and both sides' capabilities, on the link's stream before
 * its keys; then the keys of the stream.  Between two nodes of protocol
 * 2.6 (CAP_SUBKEYS) each of the two is keyed with its own subkey of the
 * cluster key (subkeys.h), with an older peer with the key itself. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "lane.h"
#include "log.h"
#include "util.h"

/* This node's capabilities in its hello (enum Cap). */
static uint32_t caps_mine(const struct gshmd_cluster *cl) {
  return (cl->ll.encrypt ? GSHM__CLUSTER__CAP__CAP_ENCRYPT : 0) |
         (crypto_aead_aes256gcm_is_available() ? GSHM__CLUSTER__CAP__CAP_AES : 0) |
         (crypto_aead_aes256gcm_is_available() && cl->ll.gmac ? GSHM__CLUSTER__CAP__CAP_GMAC : 0) |
         (cl->ll.ucx_allowed ? GSHM__CLUSTER__CAP__CAP_UCX : 0) |
         GSHM__CLUSTER__CAP__CAP_LANES | GSHM__CLUSTER__CAP__CAP_ASK_AGAIN |
         GSHM__CLUSTER__CAP__CAP_ASK_AGAIN_LIST | GSHM__CLUSTER__CAP__CAP_AUTH_OK_KEYED |
         GSHM__CLUSTER__CAP__CAP_SUBKEYS;
}

/* Whether AuthOk goes keyed (both sides said CAP_AUTH_OK_KEYED; a peer
 * before protocol 2.5 reads it in the clear, and its count then is not
 * authenticated: docs/SECURITY.md).  The hello's MACs cover the caps, so
 * nobody between the two can take it away. */
static bool auth_ok_keyed(const struct gshmd_cluster *cl, const struct link *l) {
  return (caps_mine(cl) & l->caps_theirs & GSHM__CLUSTER__CAP__CAP_AUTH_OK_KEYED) != 0;
}

/* Whether the bytes of this link may go over UCX: both sides said so in
 * their hello, and neither asked for encryption (UCX encrypts nothing). */
static bool ucx_agreed(const struct gshmd_cluster *cl, const struct link *l) {
  uint32_t both = caps_mine(cl) & l->caps_theirs, either = caps_mine(cl) | l->caps_theirs;
  return (both & GSHM__CLUSTER__CAP__CAP_UCX) && !(either & GSHM__CLUSTER__CAP__CAP_ENCRYPT);
}

/* The exchange as both sides see it: connecting side (C) first. */
struct hello_view {
  const uint8_t *nonce_c, *nonce_s;
  const char *name_c, *name_s;
  uint32_t caps_c, caps_s;
};

static struct hello_view view_of(const struct gshmd_cluster *cl, const struct link *l) {
  struct hello_view v;
  if (l->inbound)
    v = (struct hello_view){l->nonce_theirs, l->nonce_mine, l->peer->name, cl->ll.node_name,
                            l->caps_theirs, caps_mine(cl)};
  else
    v = (struct hello_view){l->nonce_mine, l->nonce_theirs, cl->ll.node_name, l->peer->name,
                            caps_mine(cl), l->caps_theirs};
  return v;
}

/* Whether both sides' caps, as this side sees them, say CAP_SUBKEYS:
 * then the hello's MACs and the link's keys come from the cluster key's
 * subkeys, else (a peer before protocol 2.6) from the key itself.  Each
 * side chooses by the caps its MACs cover, so a bit stripped or added on
 * the way has the two sides key their MACs differently (over different
 * caps anyway): the hello fails (bad_key), never falls back. */
static bool subkeys_agreed(const struct hello_view *v) {
  return (v->caps_c & v->caps_s & GSHM__CLUSTER__CAP__CAP_SUBKEYS) != 0;
}

/* crypto_auth over a label, a direction, both nonces, both names and
 * both sides' capabilities, so that no proof can be replayed in the
 * other direction or on another exchange, and nobody between the two
 * can turn encryption off; keyed with the hello subkey (CAP_SUBKEYS). */
static void hello_mac(const struct gshmd_cluster *cl, const struct link *l, char dir,
                      uint8_t mac[crypto_auth_BYTES]) {
  struct hello_view v = view_of(cl, l);
  uint8_t buf[16 + 2 * GSHMD_CLUSTER_NONCE + 2 * 64 + 8 + LINK_LANE_TOKEN];
  size_t n = 0, a = strlen(v.name_c), b = strlen(v.name_s);

  memcpy(buf, "gshm-cluster-2 ", 15);
  n = 15;
  buf[n++] = (uint8_t)dir;
  memcpy(buf + n, v.nonce_c, GSHMD_CLUSTER_NONCE);
  n += GSHMD_CLUSTER_NONCE;
  memcpy(buf + n, v.nonce_s, GSHMD_CLUSTER_NONCE);
  n += GSHMD_CLUSTER_NONCE;
  memcpy(buf + n, v.name_c, a + 1); /* names are < 64 bytes; NULs separate them */
  n += a + 1;
  memcpy(buf + n, v.name_s, b + 1);
  n += b + 1;
  memcpy(buf + n, &v.caps_c, 4);
  memcpy(buf + n + 4, &v.caps_s, 4);
  n += 8;
  if (l->is_lane) { /* the link it joins (absent from exchanges of 2.0) */
    memcpy(buf + n, l->lane_token, LINK_LANE_TOKEN);
    n += LINK_LANE_TOKEN;
  }
  crypto_auth(mac, buf, n, subkeys_agreed(&v) ? cl->keys.hello : cl->keys.raw);
}

/* From the next frame on, the link's stream is protected with keys of
 * this exchange: one per direction, from the shared key and both nonces
 * (crypto_generichash keyed with the session subkey, CAP_SUBKEYS, or
 * with a peer before 2.6 the cluster key; then crypto_kdf). */
static void hello_keys(const struct gshmd_cluster *cl, struct link *l, bool tx, bool rx) {
  struct hello_view v = view_of(cl, l);
  uint8_t in[16 + 2 * GSHMD_CLUSTER_NONCE], master[crypto_kdf_KEYBYTES];
  uint8_t c2s[STREAM_KEY], s2c[STREAM_KEY];
  enum stream_mode mode = gshmd__stream_mode(
      ((v.caps_c | v.caps_s) & GSHM__CLUSTER__CAP__CAP_ENCRYPT) != 0,
      ((v.caps_c & v.caps_s) & GSHM__CLUSTER__CAP__CAP_AES) != 0,
      ((v.caps_c & v.caps_s) & GSHM__CLUSTER__CAP__CAP_GMAC) != 0);

  memcpy(in, "gshm-session-2\0\0", 16);
  memcpy(in + 16, v.nonce_c, GSHMD_CLUSTER_NONCE);
  memcpy(in + 16 + GSHMD_CLUSTER_NONCE, v.nonce_s, GSHMD_CLUSTER_NONCE);
  l->subkeys = subkeys_agreed(&v); /* (gshmctl peers shows it) */
  crypto_generichash(master, sizeof(master), in, sizeof(in),
                     l->subkeys ? cl->keys.session : cl->keys.raw, SUBKEY_BYTES);
  crypto_kdf_derive_from_key(c2s, sizeof(c2s), 1, "gshm-c2s", master);
  crypto_kdf_derive_from_key(s2c, sizeof(s2c), 2, "gshm-s2c", master);
  if (!l->is_lane) /* what this link's lanes name it by (lane.h) */
    crypto_kdf_derive_from_key(l->lane_token, LINK_LANE_TOKEN, 3, "gshm-lan", master);
  if (tx)
    gshmd__stream_key_tx(&l->st, mode, l->inbound ? s2c : c2s);
  if (rx)
    gshmd__stream_key_rx(&l->st, mode, l->inbound ? c2s : s2c);
  sodium_memzero(master, sizeof(master));
  sodium_memzero(c2s, sizeof(c2s));
  sodium_memzero(s2c, sizeof(s2c));
}

/* Whether the peer's hello or challenge speaks our major version of the
 * cluster protocol; refuses the link (REFUSE_VERSION) when it does not,
 * with one wording on either side of the link. */
static bool version_ok(struct link *l, uint32_t major, uint32_t minor) {
  char msg[96];

  if (major == GSHMD_CLUSTER_MAJOR)
    return true;
  snprintf(msg, sizeof(msg), "peer speaks cluster protocol %u.%u, this gshmd %u.%u", major, minor,
           GSHMD_CLUSTER_MAJOR, GSHMD_CLUSTER_MINOR);
  gshmd__link_refuse(l, REFUSE_VERSION, -EPROTONOSUPPORT, msg);
  return false;
}

/* Whether the peer's hello or challenge has the capabilities that
 * cluster.min_protocol requires (ll->caps_required: CAP_SUBKEYS for 2.6);
 * refuses the link (REFUSE_VERSION) when it has not.  Called before
 * hello_mac on either side, so that no MAC under the cluster key itself
 * is sent to such a peer, nor one of its MACs checked. */
static bool min_protocol_ok(struct gshmd_cluster *cl, struct link *l, uint32_t caps,
                            uint32_t major, uint32_t minor) {
  char msg[512];

  if ((caps & cl->ll.caps_required) == cl->ll.caps_required)
    return true;
  snprintf(msg, sizeof(msg),
           "node '%s' speaks cluster protocol %u.%u without the cluster key's subkeys "
           "(CAP_SUBKEYS, 2.6) and cluster.min_protocol of '%s' is 2.6: update gshmd on '%s', "
           "or set cluster.min_protocol = 2.0 on '%s' until every node runs 2.6",
           l->peer->name, major, minor, cl->ll.node_name, l->peer->name, cl->ll.node_name);
  gshmd__link_refuse(l, REFUSE_VERSION, -EPROTONOSUPPORT, msg);
  return false;
}

/* Inbound: Hello -> Challenge. */
static void on_hello(struct link *l, const Gshm__Cluster__Hello *h) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Challenge c = GSHM__CLUSTER__CHALLENGE__INIT;
  uint8_t mac[crypto_auth_BYTES];
  char msg[200];

  if (!version_ok(l, h->major, h->minor))
    return;
  if (h->nonce.len != GSHMD_CLUSTER_NONCE || !gshmd__cluster_name_ok(h->node_name) ||
      (h->lane_of.len && h->lane_of.len != LINK_LANE_TOKEN)) {
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "malformed hello");
    return;
  }
  if (h->lane_of.len) { /* a data lane: which link, proved at Auth */
    l->is_lane = true;
    memcpy(l->lane_token, h->lane_of.data, LINK_LANE_TOKEN);
  }
  if (!(l->peer = gshmd__link_peer_find(&cl->ll, h->node_name))) {
    snprintf(msg, sizeof(msg), "node '%.63s' is not in cluster.peers of '%s'", h->node_name,
             cl->ll.node_name);
    gshmd__link_refuse(l, REFUSE_UNKNOWN_PEER, -EPERM, msg);
    return;
  }
  if (!min_protocol_ok(cl, l, h->caps, h->major, h->minor))
    return;
  memcpy(l->nonce_theirs, h->nonce.data, GSHMD_CLUSTER_NONCE);
  l->caps_theirs = h->caps;
  l->major_theirs = h->major;
  l->minor_theirs = h->minor;
  hello_mac(cl, l, 'S', mac);
  c.caps = caps_mine(cl);
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

  if (!version_ok(l, c->major, c->minor))
    return;
  if (c->nonce.len != GSHMD_CLUSTER_NONCE || c->mac.len != crypto_auth_BYTES) {
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "malformed challenge");
    return;
  }
  if (strcmp(c->node_name, l->peer->name)) {
    snprintf(msg, sizeof(msg), "the node at %s calls itself '%.63s', not '%s'", l->peer->address,
             c->node_name, l->peer->name);
    gshm__text_clean(msg); /* (its name is anyone's: the key is not proven) */
    gshmd__link_refuse(l, REFUSE_UNKNOWN_PEER, -EPERM, msg);
    return;
  }
  if (!min_protocol_ok(cl, l, c->caps, c->major, c->minor))
    return;
  memcpy(l->nonce_theirs, c->nonce.data, GSHMD_CLUSTER_NONCE);
  l->caps_theirs = c->caps;
  l->major_theirs = c->major;
  l->minor_theirs = c->minor;
  hello_mac(cl, l, 'S', mac);
  if (sodium_memcmp(mac, c->mac.data, sizeof(mac)) != 0) {
    snprintf(msg, sizeof(msg), "peer '%s' did not prove the shared key (cluster.secret_file differs)",
             l->peer->name);
    gshmd__link_refuse(l, REFUSE_BAD_KEY, -EACCES, msg);
    return;
  }
  hello_mac(cl, l, 'C', mac);
  a.mac.data = mac;
  a.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH;
  m.auth = &a;
  l->state = LINK_AUTH;
  gshmd__link_send(l, &m);
  /* what we send after Auth is keyed, and so is what comes after it
   * when AuthOk is */
  hello_keys(cl, l, true, auth_ok_keyed(cl, l));
}

/* Inbound, proved: AuthOk (exported: segments exported now); every frame
 * after it, both ways, is keyed.  With a peer before protocol 2.5 it goes
 * before the keys (a refusal would have gone there too); else on_auth
 * keyed the stream already. */
static void auth_ok(struct gshmd_cluster *cl, struct link *l, uint32_t exported) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__AuthOk ok = GSHM__CLUSTER__AUTH_OK__INIT;

  ok.exported = exported;
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH_OK;
  m.auth_ok = &ok;
  gshmd__link_send(l, &m);
  if (!auth_ok_keyed(cl, l))
    hello_keys(cl, l, true, true);
}

/* The link of l's peer that an inbound lane names, up; NULL if none. */
static struct link *lane_parent(struct links *ll, const struct link *lane) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->inbound && !l->is_lane && l->state == LINK_UP && l->peer == lane->peer &&
        sodium_memcmp(l->lane_token, lane->lane_token, LINK_LANE_TOKEN) == 0)
      return l;
  }
  return NULL;
}

/* Inbound lane, proved: AuthOk, the keys, and its thread sends the
 * bytes of its link's Reads from now on (lane.h). */
static void lane_up_inbound(struct gshmd_cluster *cl, struct link *l) {
  struct link *parent = lane_parent(&cl->ll, l);
  char msg[160];
  int e;

  if (!parent) {
    gshmd__link_refuse(l, REFUSE_PROTOCOL, -ENOENT, "a data lane for no link");
    return;
  }
  auth_ok(cl, l, 0);
  gshmd__link_hello_passed(l);
  if ((e = gshmd__lane_attach(l, parent))) {
    l->state = LINK_UP; /* no longer in its hello */
    snprintf(msg, sizeof(msg), "cannot start a data lane of peer '%s': %s", l->peer->name,
             strerror(-e));
    gshmd__link_fail(l, e, msg);
  }
}

/* Inbound: Auth -> AuthOk; the link serves from now on. */
static void on_auth(struct link *l, const Gshm__Cluster__Auth *a) {
  struct gshmd_cluster *cl = cluster_of(l->ll);
  uint8_t mac[crypto_auth_BYTES];
  char msg[200];

  hello_mac(cl, l, 'C', mac);
  if (a->mac.len != sizeof(mac) || sodium_memcmp(mac, a->mac.data, sizeof(mac)) != 0) {
    snprintf(msg, sizeof(msg), "node '%s' did not prove the shared key", l->peer->name);
    gshmd__link_refuse(l, REFUSE_BAD_KEY, -EACCES, msg);
    return;
  }
  if (auth_ok_keyed(cl, l)) /* AuthOk, or a refusal, keyed */
    hello_keys(cl, l, true, true);
  if (l->is_lane) {
    lane_up_inbound(cl, l);
    return;
  }
  if (gshmd__link_count_up(&cl->ll, l->peer) >= LINK_MAX_PER_PEER) {
    snprintf(msg, sizeof(msg),
             "node '%s' has %u connections up already (or refused and not closed yet, or "
             "failed with sends over UCX not ended)",
             l->peer->name, LINK_MAX_PER_PEER);
    gshmd__link_refuse(l, REFUSE_LIMIT, -EBUSY, msg);
    return;
  }
  if (gshmd__serve_link_up(cl, l)) {
    gshmd__link_fail(l, -ENOMEM, "out of memory");
    return;
  }
  l->state = LINK_UP;
  gshmd__link_hello_passed(l);
  auth_ok(cl, l, gshmd__serve_count(cl));
  gshm_log_info("cluster: peer '%s' connected from %s, %s", l->peer->name, l->remote,
                gshmd__stream_mode_name(l->st.mode_tx));
}

/* Outbound: offers this worker's address to the peer, for the bytes of
 * our Reads; false when that cannot be (the stream carries them). */
static bool offer_ucx(struct gshmd_cluster *cl, struct link *l) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxOffer o = GSHM__CLUSTER__UCX_OFFER__INIT;
  ucp_address_t *addr;
  size_t len;
  int e;

  if (!ucx_agreed(cl, l) || gshmd__link_worker_address(&cl->ll, &addr, &len))
    return false;
  randombytes_buf(&l->ucx_token, sizeof(l->ucx_token));
  o.worker_address.data = (uint8_t *)addr;
  o.worker_address.len = len;
  o.token = l->ucx_token;
  m.body_case = GSHM__CLUSTER__MSG__BODY_UCX_OFFER;
  m.ucx_offer = &o;
  e = gshmd__link_send(l, &m);
  ucp_worker_release_address(cl->ll.worker, addr);
  return e == 0 && (l->ucx_offered = true);
}

/* Outbound lane, AuthOk in: its thread receives the bytes of its link's
 * Reads from now on, if that link is still up (lane.h). */
static void lane_up_outbound(struct link *l) {
  struct peer *p = l->peer;
  struct link *parent = p->out;
  char msg[160];
  int e = -ENOENT;

  p->lanes_connecting--;
  if (parent && parent->state == LINK_UP &&
      sodium_memcmp(parent->lane_token, l->lane_token, LINK_LANE_TOKEN) == 0 &&
      !(e = gshmd__lane_attach(l, parent))) {
    gshmd__lanes_open(parent); /* the next one */
    return;
  }
  p->lanes_connecting++; /* gshmd__link_fail counts it off */
  snprintf(msg, sizeof(msg), "cannot start a data lane to peer '%s': %s", p->name,
           strerror(-e));
  gshmd__link_fail(l, e, msg);
}

/* Outbound: AuthOk: the keys, then UCX offered, or the peer is up. */
static void on_auth_ok(struct link *l, const Gshm__Cluster__AuthOk *ok) {
  struct gshmd_cluster *cl = cluster_of(l->ll);

  if (!auth_ok_keyed(cl, l)) /* (else keyed since on_challenge) */
    hello_keys(cl, l, false, true);
  if (l->is_lane) {
    lane_up_outbound(l);
    return;
  }
  l->peer->exported = ok->exported;
  if (!offer_ucx(cl, l))
    gshmd__link_up(l, ok->exported);
}

/* Outbound: the peer's answer to our UcxOffer; the peer is up. */
static void on_ucx_answer(struct link *l, const Gshm__Cluster__UcxAnswer *a) {
  l->ucx_offered = false;
  l->ucx = a->ok;
  if (!a->ok)
    gshm_log_info("cluster: peer '%s' sends over the TCP stream: %.200s", l->peer->name,
                  a->why);
  gshmd__link_up(l, l->peer->exported);
}

/* UCX told us an endpoint to a peer's worker failed: its link fails
 * (found by the endpoint: a link that already went has none). */
static void on_ucx_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  struct links *ll = arg;
  struct gshm_list *pos;
  char why[96];

  gshm_list_foreach(pos, &ll->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->ucx_ep == ep) {
      snprintf(why, sizeof(why), "UCX endpoint failed (%s)", ucs_status_string(status));
      gshmd__link_fail(l, -ECONNRESET, why);
      return;
    }
  }
}

/* Inbound, up: the peer's worker address; the bytes of its Reads go to
 * it over UCX from now on, when an endpoint reaches it. */
static void on_ucx_offer(struct gshmd_cluster *cl, struct link *l,
                         const Gshm__Cluster__UcxOffer *o) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxAnswer a = GSHM__CLUSTER__UCX_ANSWER__INIT;

  if (!ucx_agreed(cl, l) || o->worker_address.len == 0) {
    a.why = "this node does not move bytes over UCX (cluster.transport or encrypt)";
  } else if (gshmd__link_worker_ep(&cl->ll, o->worker_address.data, o->worker_address.len,
                                   on_ucx_ep_error, &cl->ll, &l->ucx_ep, &l->ucx_eager)) {
    a.why = "no UCX transport of this node reaches the peer";
  } else {
    l->ucx_token = o->token;
    a.ok = true;
    a.why = cl->ll.ucx_tls;
  }
  m.body_case = GSHM__CLUSTER__MSG__BODY_UCX_ANSWER;
  m.ucx_answer = &a;
  gshmd__link_send(l, &m);
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
  h.caps = caps_mine(cl);
  if (l->is_lane) {
    h.lane_of.data = l->lane_token;
    h.lane_of.len = LINK_LANE_TOKEN;
  }
  m.body_case = GSHM__CLUSTER__MSG__BODY_HELLO;
  m.hello = &h;
  if (gshmd__link_send(l, &m))
    gshmd__link_fail(l, -EIO, "cannot send hello");
}

bool gshmd__hello_handle(struct gshmd_cluster *cl, struct link *l, const Gshm__Cluster__Msg *m) {
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
  case GSHM__CLUSTER__MSG__BODY_UCX_OFFER:
    if (!l->inbound || l->state != LINK_UP || l->ucx_ep || l->ucx_offer_seen)
      return false; /* (one a link: repeated, each failed one logged a line) */
    l->ucx_offer_seen = true;
    on_ucx_offer(cl, l, m->ucx_offer);
    return true;
  case GSHM__CLUSTER__MSG__BODY_UCX_ANSWER:
    if (l->inbound || l->state != LINK_AUTH || !l->ucx_offered)
      return false;
    on_ucx_answer(l, m->ucx_answer);
    return true;
  default:
    return false;
  }
}
