/* SPDX-License-Identifier: Apache-2.0 */
/* A rogue cluster peer that holds the key (rogue.h).  The hello follows
 * proto/cluster.proto: crypto_auth over "gshm-cluster-2 " || direction ||
 * both nonces || both names (NUL-terminated) || both sides' capabilities,
 * connecting side first; then one key per direction from the cluster key
 * and both nonces (crypto_generichash, crypto_kdf).  Under CAP_SUBKEYS
 * (protocol 2.6, both sides) the MACs are keyed with the cluster key's
 * hello subkey and the link's keys come from its session subkey
 * (crypto_kdf_derive_from_key, ids and contexts of
 * daemon/cluster/subkeys.h, written here again); else the key itself. */
#include "rogue.h"
#include "lane_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { H_CLIENT_CHALLENGE, H_CLIENT_AUTH_OK, H_SERVER_HELLO, H_SERVER_AUTH, H_UP };

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void rogue_key(const char *path, uint8_t key[32]) {
  uint8_t buf[4096];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;

  if (fd >= 0)
    close(fd);
  crypto_generichash(key, 32, buf, n > 0 ? (size_t)n : 0, NULL, 0);
}

/* The key of the hello's MACs (session: of the link's master key) that
 * r uses: a subkey when both sides said CAP_SUBKEYS and r is not told to
 * use the cluster key itself; into out. */
static void rogue_subkey(const struct rogue *r, bool session, uint8_t out[32]) {
  bool raw = session ? r->raw_session : r->raw_hello;

  if (!(r->caps & r->caps_theirs & GSHM__CLUSTER__CAP__CAP_SUBKEYS) || raw)
    memcpy(out, r->key, 32);
  else if (session)
    crypto_kdf_derive_from_key(out, 32, 2, "gshmsess", r->key);
  else
    crypto_kdf_derive_from_key(out, 32, 1, "gshmhelo", r->key);
}

/* The hello's MAC in direction dir ('S' from the listening side, 'C'
 * from the connecting one); a lane's covers its link's token too. */
static void hello_mac(const struct rogue *r, char dir, uint8_t mac[crypto_auth_BYTES]) {
  const uint8_t *nc = r->accepted ? r->nonce_theirs : r->nonce_mine;
  const uint8_t *ns = r->accepted ? r->nonce_mine : r->nonce_theirs;
  const char *name_c = r->accepted ? r->peer : r->name, *name_s = r->accepted ? r->name : r->peer;
  uint32_t caps_c = r->accepted ? r->caps_theirs : r->caps;
  uint32_t caps_s = r->accepted ? r->caps : r->caps_theirs;
  uint8_t buf[16 + 64 + 2 * 64 + 8 + ROGUE_LANE_TOKEN], key[32];
  size_t n = 0;

  memcpy(buf, "gshm-cluster-2 ", 15);
  n = 15;
  buf[n++] = (uint8_t)dir;
  memcpy(buf + n, nc, 32);
  memcpy(buf + n + 32, ns, 32);
  n += 64;
  memcpy(buf + n, name_c, strlen(name_c) + 1);
  n += strlen(name_c) + 1;
  memcpy(buf + n, name_s, strlen(name_s) + 1);
  n += strlen(name_s) + 1;
  memcpy(buf + n, &caps_c, 4);
  memcpy(buf + n + 4, &caps_s, 4);
  n += 8;
  if (r->is_lane) {
    memcpy(buf + n, r->lane_token, ROGUE_LANE_TOKEN);
    n += ROGUE_LANE_TOKEN;
  }
  rogue_subkey(r, false, key);
  crypto_auth(mac, buf, n, key);
}

/* The stream's keys after the hello (tx, rx: which directions now). */
static void hello_keys(struct rogue *r, bool tx, bool rx) {
  const uint8_t *nc = r->accepted ? r->nonce_theirs : r->nonce_mine;
  const uint8_t *ns = r->accepted ? r->nonce_mine : r->nonce_theirs;
  uint8_t in[16 + 64], master[crypto_kdf_KEYBYTES], c2s[STREAM_KEY], s2c[STREAM_KEY], key[32];
  /* (the rogue claims neither AES nor GMAC: Poly1305, or ChaCha20 when
   * either side encrypts) */
  enum stream_mode mode =
      gshmd__stream_mode((r->caps | r->caps_theirs) & GSHM__CLUSTER__CAP__CAP_ENCRYPT, false, false);

  memcpy(in, "gshm-session-2\0\0", 16);
  memcpy(in + 16, nc, 32);
  memcpy(in + 48, ns, 32);
  rogue_subkey(r, true, key);
  crypto_generichash(master, sizeof(master), in, sizeof(in), key, 32);
  crypto_kdf_derive_from_key(c2s, sizeof(c2s), 1, "gshm-c2s", master);
  crypto_kdf_derive_from_key(s2c, sizeof(s2c), 2, "gshm-s2c", master);
  if (!r->is_lane) /* what the link's lanes name it by, as hello.c derives it */
    crypto_kdf_derive_from_key(r->lane_token, ROGUE_LANE_TOKEN, 3, "gshm-lan", master);
  if (tx)
    gshmd__stream_key_tx(&r->st, mode, r->accepted ? s2c : c2s);
  if (rx)
    gshmd__stream_key_rx(&r->st, mode, r->accepted ? c2s : s2c);
}

void rogue_send(struct rogue *r, const Gshm__Cluster__Msg *m) {
  size_t len = gshm__cluster__msg__get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);

  if (!buf) {
    r->failed = true;
    return;
  }
  gshm__cluster__msg__pack(m, buf);
  rogue_send_packed(r, buf, len);
  free(buf);
}

void rogue_send_packed(struct rogue *r, const uint8_t *buf, size_t len) {
  if (gshmd__stream_send_ctrl(&r->st, buf, len))
    r->failed = true;
}

/* Connecting side: the node's Challenge -> our Auth. */
static void on_challenge(struct rogue *r, const Gshm__Cluster__Challenge *c) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Auth a = GSHM__CLUSTER__AUTH__INIT;
  uint8_t mac[crypto_auth_BYTES];

  if (c->nonce.len != 32 || c->mac.len != sizeof(mac)) {
    r->failed = true;
    return;
  }
  memcpy(r->nonce_theirs, c->nonce.data, 32);
  r->caps_theirs = c->caps;
  hello_mac(r, 'S', mac);
  if (sodium_memcmp(mac, c->mac.data, sizeof(mac))) {
    snprintf(r->refusal, sizeof(r->refusal), "the node's challenge has a wrong MAC");
    r->challenge_bad = true;
    if (!r->raw_hello) {
      r->failed = true;
      return;
    }
  }
  hello_mac(r, 'C', mac);
  a.mac.data = mac;
  a.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH;
  m.auth = &a;
  rogue_send(r, &m);
  hello_keys(r, true, false);
  r->hello = H_CLIENT_AUTH_OK;
}

/* Listening side: the node's Hello -> our Challenge. */
static void on_hello(struct rogue *r, const Gshm__Cluster__Hello *h) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Challenge c = GSHM__CLUSTER__CHALLENGE__INIT;
  uint8_t mac[crypto_auth_BYTES];

  if (h->nonce.len != 32) {
    r->failed = true;
    return;
  }
  /* a lane names its link (and only a lane's hello may) */
  if (r->is_lane != (h->lane_of.len != 0) ||
      (r->is_lane && (h->lane_of.len != ROGUE_LANE_TOKEN ||
                      sodium_memcmp(h->lane_of.data, r->lane_token, ROGUE_LANE_TOKEN)))) {
    snprintf(r->refusal, sizeof(r->refusal), "%s", r->is_lane ? "not a lane of the link" : "a lane");
    r->failed = true;
    return;
  }
  memcpy(r->nonce_theirs, h->nonce.data, 32);
  r->caps_theirs = h->caps;
  snprintf(r->peer, sizeof(r->peer), "%s", h->node_name);
  hello_mac(r, 'S', mac);
  c.major = 2;
  c.minor = r->minor;
  c.caps = r->caps;
  c.node_name = r->name;
  c.nonce.data = r->nonce_mine;
  c.nonce.len = 32;
  c.mac.data = mac;
  c.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_CHALLENGE;
  m.challenge = &c;
  rogue_send(r, &m);
  r->hello = H_SERVER_AUTH;
}

/* Listening side: the node's Auth -> AuthOk, and the keys. */
static void on_auth(struct rogue *r, const Gshm__Cluster__Auth *a) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__AuthOk ok = GSHM__CLUSTER__AUTH_OK__INIT;
  uint8_t mac[crypto_auth_BYTES];

  hello_mac(r, 'C', mac);
  if (a->mac.len != sizeof(mac) || sodium_memcmp(mac, a->mac.data, sizeof(mac))) {
    r->failed = true;
    return;
  }
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH_OK;
  m.auth_ok = &ok;
  rogue_send(r, &m);
  hello_keys(r, true, true);
  r->hello = H_UP;
  r->up = true;
}

/* A hello step (false: not the one awaited). */
static bool hello_step(struct rogue *r, const Gshm__Cluster__Msg *m) {
  if (r->hello == H_CLIENT_CHALLENGE && m->body_case == GSHM__CLUSTER__MSG__BODY_CHALLENGE)
    on_challenge(r, m->challenge);
  else if (r->hello == H_CLIENT_AUTH_OK && m->body_case == GSHM__CLUSTER__MSG__BODY_AUTH_OK) {
    hello_keys(r, false, true);
    r->hello = H_UP;
    r->up = true;
  } else if (r->hello == H_SERVER_HELLO && m->body_case == GSHM__CLUSTER__MSG__BODY_HELLO)
    on_hello(r, m->hello);
  else if (r->hello == H_SERVER_AUTH && m->body_case == GSHM__CLUSTER__MSG__BODY_AUTH)
    on_auth(r, m->auth);
  else
    return false;
  return true;
}

static void on_ctrl(struct stream *s, const uint8_t *payload, size_t len) {
  struct rogue *r = s->owner;
  Gshm__Cluster__Msg *m = gshm__cluster__msg__unpack(NULL, len, payload);

  if (!m) {
    r->failed = true;
    return;
  }
  if (r->hello != H_UP) {
    if (!hello_step(r, m)) {
      snprintf(r->refusal, sizeof(r->refusal), "%s", m->message ? m->message : "?");
      r->failed = true;
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
    return;
  }
  if (r->on_msg) {
    r->on_msg(r, m);
    gshm__cluster__msg__free_unpacked(m, NULL);
  } else if (r->qn < ROGUE_QUEUE) {
    r->q[(r->qhead + r->qn++) % ROGUE_QUEUE] = m;
  } else {
    r->dropped++;
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
}

/* A frame landing in the sink: at its offset where it fits there (the
 * frames of one segment's reads do not overlap while the stream checks
 * one on the pool and takes the next), else at its start. */
struct landing {
  uint8_t *dst;
  uint64_t len;
};

static void *data_dest(struct stream *s, uint32_t rid, uint64_t offset, uint64_t len,
                       void **tok_out) {
  struct rogue *r = s->owner;
  struct landing *d;
  (void)rid;
  if (len > r->sink_len || !(d = malloc(sizeof(*d))))
    return NULL;
  d->dst = r->sink + (offset <= r->sink_len - len ? offset : 0);
  d->len = len;
  *tok_out = d;
  return d->dst;
}

static void data_done(struct stream *s, void *tok, int err) {
  static const uint8_t zeros[4096];
  struct rogue *r = s->owner;
  struct landing *d = tok;

  r->data_frames++;
  if (err)
    r->data_bad++;
  /* a whole 4 KiB page of zeros: not a random segment's bytes */
  for (uint64_t o = 0; d && !err && o + sizeof(zeros) <= d->len; o += sizeof(zeros)) {
    if (!memcmp(d->dst + o, zeros, sizeof(zeros))) {
      r->data_zero++;
      break;
    }
  }
  free(d);
}

static void on_error(struct stream *s, int err, const char *why) {
  (void)err, (void)why;
  ((struct rogue *)s->owner)->failed = true;
}

static void on_closed(struct stream *s) { ((struct rogue *)s->owner)->closed = true; }

static const struct stream_ops rogue_ops = {on_ctrl, data_dest, data_done, on_error, on_closed};

static void on_tick(uv_timer_t *t) { (void)t; }

/* The rogue around a connected socket fd. */
static int rogue_open(struct rogue *r, int fd, const char *name, const uint8_t key[32]) {
  uv_loop_init(&r->loop);
  uv_timer_init(&r->loop, &r->tick);
  uv_timer_start(&r->tick, on_tick, 5, 5);
  snprintf(r->name, sizeof(r->name), "%s", name);
  memcpy(r->key, key, 32);
  randombytes_buf(r->nonce_mine, sizeof(r->nonce_mine));
  if (!r->sink_len)
    r->sink_len = 64u << 20;
  if (!r->sink && !(r->sink = malloc(r->sink_len)))
    return -1;
  if (gshmd__stream_init(&r->st, &r->loop, &rogue_ops, r) || uv_tcp_open(&r->st.tcp, fd) ||
      gshmd__stream_start(&r->st))
    return -1;
  return 0;
}

static bool is_up(struct rogue *r) { return r->up; }

int rogue_connect(struct rogue *r, int port, const char *name, const char *peer,
                  const uint8_t key[32]) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Hello h = GSHM__CLUSTER__HELLO__INIT;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  /* a small receive buffer: when the rogue stops reading, the node's
   * sends back up at once */
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &(int){65536}, sizeof(int));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  snprintf(r->peer, sizeof(r->peer), "%s", peer);
  r->hello = H_CLIENT_CHALLENGE;
  if (rogue_open(r, fd, name, key))
    return -1;
  h.major = 2;
  h.minor = r->minor;
  h.caps = r->caps;
  h.node_name = r->name;
  h.nonce.data = r->nonce_mine;
  h.nonce.len = 32;
  if (r->is_lane) { /* a data lane of the link whose token it names */
    h.lane_of.data = r->lane_token;
    h.lane_of.len = ROGUE_LANE_TOKEN;
  }
  m.body_case = GSHM__CLUSTER__MSG__BODY_HELLO;
  m.hello = &h;
  rogue_send(r, &m);
  return rogue_run_until(r, is_up, 5000) ? 0 : -1;
}

int rogue_connect_lane(struct rogue *link, int port, struct rogue *lane) {
  memset(lane, 0, sizeof(*lane));
  lane->is_lane = true;
  lane->caps = link->caps;
  lane->sink_len = 1; /* (a lane of a pulling rogue: the node sends on it, nothing read here) */
  memcpy(lane->lane_token, link->lane_token, ROGUE_LANE_TOKEN);
  return rogue_connect(lane, port, link->name, link->peer, link->key);
}

int rogue_accept(struct rogue *r, int lfd, const char *name, const uint8_t key[32]) {
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  int fd;

  if (poll(&p, 1, 10000) != 1 || (fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0)
    return -1;
  r->accepted = true;
  r->hello = H_SERVER_HELLO;
  if (rogue_open(r, fd, name, key))
    return -1;
  return rogue_run_until(r, is_up, 5000) ? 0 : -1;
}

static bool never(struct rogue *r) {
  (void)r;
  return false;
}

void rogue_run(struct rogue *r, int ms) { rogue_run_until(r, never, ms); }

bool rogue_run_until(struct rogue *r, bool (*until)(struct rogue *r), int ms) {
  int64_t end = ms_now() + ms;
  while (!until(r) && !r->failed && ms_now() < end)
    uv_run(&r->loop, UV_RUN_ONCE);
  return until(r);
}

static bool have_msg(struct rogue *r) { return r->qn > 0; }

Gshm__Cluster__Msg *rogue_recv(struct rogue *r, int ms) {
  Gshm__Cluster__Msg *m;
  if (!rogue_run_until(r, have_msg, ms))
    return NULL;
  m = r->q[r->qhead];
  r->qhead = (r->qhead + 1) % ROGUE_QUEUE;
  r->qn--;
  return m;
}

void rogue_reading(struct rogue *r, bool on) {
  if (on)
    gshmd__stream_start(&r->st);
  else
    uv_read_stop((uv_stream_t *)&r->st.tcp);
}

size_t rogue_unsent(struct rogue *r) { return r->st.tx_bytes; }

static bool is_closed(struct rogue *r) { return r->closed; }

void rogue_close(struct rogue *r) {
  if (r->st.loop) {
    gshmd__stream_close(&r->st);
    uv_close((uv_handle_t *)&r->tick, NULL);
    r->failed = false;
    rogue_run_until(r, is_closed, 5000);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    uv_loop_close(&r->loop);
  }
  while (r->qn) {
    gshm__cluster__msg__free_unpacked(r->q[r->qhead], NULL);
    r->qhead = (r->qhead + 1) % ROGUE_QUEUE;
    r->qn--;
  }
  free(r->sink);
  r->sink = NULL;
}

int rogue_accept_lane(struct rogue *r, int lfd, struct rogue_lane *ln) {
  struct rogue *t = calloc(1, sizeof(*t));
  int e = -1;

  if (!t)
    return -1;
  /* the lane's own hello, as the link's serving node */
  t->is_lane = true;
  t->caps = r->caps;
  memcpy(t->lane_token, r->lane_token, ROGUE_LANE_TOKEN);
  t->sink_len = 1; /* (a lane of a serving rogue receives no bytes) */
  if (rogue_accept(t, lfd, r->name, r->key) == 0) {
    /* AuthOk in the kernel, then the connection leaves libuv */
    int64_t end = ms_now() + 5000;
    while (t->st.tcp.write_queue_size && !t->failed && ms_now() < end)
      uv_run(&t->loop, UV_RUN_ONCE);
    e = gshmd__stream_detach(&t->st, &ln->st) ? -1 : 0;
  }
  rogue_close(t);
  free(t);
  ln->up = e == 0;
  return e;
}

int rogue_lane_send(struct rogue_lane *ln, uint32_t rid, uint64_t offset, const void *src,
                    uint64_t len, uint64_t part) {
  struct frame_hdr h = gshmd__frame_data(rid, offset, len);
  uint8_t tag[STREAM_TAG], *ct = NULL;
  int e;

  if (!ln->up || len == 0 || len > UINT32_MAX || part > len)
    return -EINVAL;
  if (gshmd__stream_encrypts(ln->st.mode_tx) && !(ct = malloc(len)))
    return -ENOMEM;
  if (!(e = gshmd__stream_seal(ln->st.mode_tx, ln->st.key_tx, ln->st.n_tx++, &h, src, ct, len,
                               tag))) {
    struct iovec iov[3] = {{&h, sizeof(h)}, {ct ? ct : (void *)src, part}, {tag, sizeof(tag)}};
    e = gshmd__lane_write_all(ln->st.fd, iov, part == len ? 3 : 2);
  }
  free(ct);
  return e;
}

void rogue_lane_close(struct rogue_lane *ln) {
  if (!ln || !ln->up)
    return;
  close(ln->st.fd);
  sodium_memzero(&ln->st, sizeof(ln->st));
  ln->up = false;
}

int rogue_listener(int *port_out) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
      getsockname(fd, (struct sockaddr *)&sa, &len) || listen(fd, 16)) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  *port_out = ntohs(sa.sin_port);
  return fd;
}

static void send_grant(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                       uint64_t size, const char *location, bool in_flight) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
  Gshm__Cluster__Segment s = GSHM__CLUSTER__SEGMENT__INIT;

  s.id = id;
  s.generation = 1;
  s.name = (char *)name;
  s.size = size;
  s.allocated = size;
  s.location = (char *)location;
  s.in_flight = in_flight;
  g.segment = &s;
  g.grant_id = 1000 + id;
  g.path = GSHM__CLUSTER__PATH__PATH_HOST;
  g.length = size;
  m.request_id = rid;
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
  m.grant = &g;
  rogue_send(r, &m);
}

void rogue_send_grant_at(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                         uint64_t size, const char *location) {
  send_grant(r, rid, id, name, size, location, false);
}

void rogue_send_grant(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                      uint64_t size) {
  send_grant(r, rid, id, name, size, "host", false);
}

void rogue_send_grant_in_flight(struct rogue *r, uint32_t rid, uint64_t id, const char *name,
                                uint64_t size) {
  send_grant(r, rid, id, name, size, "host", true);
}

void rogue_send_status(struct rogue *r, uint32_t rid, uint32_t status, const char *message) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  m.request_id = rid;
  m.status = status;
  m.message = (char *)message;
  rogue_send(r, &m);
}

size_t rogue_ucx_offer(struct rogue *r, uint8_t *addr, size_t cap, uint64_t *token_out, int ms) {
  size_t len = 0;

  for (int i = 0; i < ms / 50 && !len; i++) {
    Gshm__Cluster__Msg *m = rogue_recv(r, 50);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_UCX_OFFER &&
        m->ucx_offer->worker_address.len <= cap) {
      len = m->ucx_offer->worker_address.len;
      memcpy(addr, m->ucx_offer->worker_address.data, len);
      if (token_out)
        *token_out = m->ucx_offer->token;
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  return len;
}

bool rogue_answer_count(struct rogue *r, const Gshm__Cluster__Msg *m) {
  Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply lr = GSHM__CLUSTER__LIST_REPLY__INIT;

  if (m->body_case != GSHM__CLUSTER__MSG__BODY_LIST || m->list->after != UINT64_MAX)
    return false;
  lr.total = 1;
  a.request_id = m->request_id;
  a.status = 1;
  a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  a.list_reply = &lr;
  rogue_send(r, &a);
  return true;
}

int rogue_accept_lanes(struct rogue *r, int lfd, const char *name, const uint8_t key[32],
                       struct rogue_lane *lanes, int n, bool (*up)(void *arg), void *arg) {
  int64_t end = ms_now() + 40000;

  for (;;) {
    memset(r, 0, sizeof(*r));
    r->caps = GSHM__CLUSTER__CAP__CAP_LANES;
    if (rogue_accept(r, lfd, name, key) == 0)
      break;
    rogue_close(r);
    if (ms_now() >= end)
      return -1;
  }
  for (int i = 0; i < n; i++)
    while (rogue_accept_lane(r, lfd, &lanes[i]) != 0)
      if (ms_now() >= end)
        goto fail;
  while (!up(arg)) {
    rogue_run(r, 20);
    if (r->failed || ms_now() >= end)
      goto fail;
  }
  return 0;
fail:
  for (int i = 0; i < n; i++)
    rogue_lane_close(&lanes[i]);
  rogue_close(r);
  return -1;
}
