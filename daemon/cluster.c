/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd to gshmd over UCX: the UCP context and worker on the libuv loop,
 * peers and their endpoints, the authenticated hello, and serving
 * exported segments to peers (list, read grants, staging).  The reading
 * side of a pull is pull.c.  docs/CLUSTER.md states the protocol and the
 * trust model. */
#include "cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <grp.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "cluster_internal.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "server.h"
#include "stage.h"
#include "util.h"

/* A served segment's registration: made at its first grant, kept until
 * the segment is freed (registry on_free), so that each segment is
 * registered with UCX once however often it is read. */
struct export_reg {
  void *addr;       /* mmap of the host segment (read-only); device: the backend's mapping */
  bool device;
  size_t len;
  ucp_mem_h memh;
  void *rkey;       /* ucp_rkey_pack() */
  size_t rkey_len;
};

static void link_fail(struct link *l, int err, const char *why);
static int setup_listener(struct gshmd_cluster *cl);
static void link_handle(struct link *l, Gshm__Cluster__Msg *m);
static void peer_connect(struct gshmd_cluster *cl, struct peer *p);

/* ---- configuration ---------------------------------------------------- */

/* "HOST:PORT" or "[V6]:PORT" to a socket address. */
static int parse_address(const char *s, struct sockaddr_storage *sa, socklen_t *len) {
  char host[128], port[16];
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *res = NULL;
  const char *colon;
  size_t hl;

  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (!end || end[1] != ':')
      return -EINVAL;
    hl = (size_t)(end - s - 1);
    s++;
    colon = end + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return -EINVAL;
    hl = (size_t)(colon - s);
  }
  if (hl == 0 || hl >= sizeof(host) || strlen(colon + 1) == 0 || strlen(colon + 1) >= sizeof(port))
    return -EINVAL;
  memcpy(host, s, hl);
  host[hl] = '\0';
  strcpy(port, colon + 1);
  if (strspn(port, "0123456789") != strlen(port) || atoi(port) <= 0 || atoi(port) > 65535)
    return -EINVAL;
  if (getaddrinfo(host, port, &hints, &res) || !res)
    return -EINVAL;
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

static int parse_peers(struct gshmd_cluster *cl, const char *spec) {
  char *copy = strdup(spec ? spec : ""), *save = NULL, *tok;
  unsigned cap = 0;

  if (!copy)
    return -ENOMEM;
  for (tok = strtok_r(copy, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
    char *eq = strchr(tok, '=');
    struct peer *p;
    if (!eq || eq == tok || (size_t)(eq - tok) >= sizeof(p->name) ||
        strlen(eq + 1) >= sizeof(p->address)) {
      gshm_log_err("cluster.peers: '%s' is not NAME=ADDRESS:PORT", tok);
      free(copy);
      return -EINVAL;
    }
    if (cl->npeers == cap) {
      struct peer *n = realloc(cl->peers, sizeof(*n) * (cap = cap ? 2 * cap : 8));
      if (!n) {
        free(copy);
        return -ENOMEM;
      }
      cl->peers = n;
    }
    p = &cl->peers[cl->npeers];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%.*s", (int)(eq - tok), tok);
    snprintf(p->address, sizeof(p->address), "%s", eq + 1);
    if (parse_address(p->address, &p->sa, &p->salen)) {
      gshm_log_err("cluster.peers: peer '%s': cannot resolve '%s' (want ADDRESS:PORT)", p->name,
                   p->address);
      free(copy);
      return -EINVAL;
    }
    for (unsigned i = 0; i < cl->npeers; i++)
      if (!strcmp(cl->peers[i].name, p->name)) {
        gshm_log_err("cluster.peers: peer '%s' named twice", p->name);
        free(copy);
        return -EINVAL;
      }
    cl->npeers++;
  }
  free(copy);
  for (unsigned i = 0; i < cl->npeers; i++)
    gshm_list_init(&cl->peers[i].waiting); /* after the last realloc */
  return 0;
}

static int parse_exports(struct gshmd_cluster *cl, const char *spec) {
  char *copy = strdup(spec ? spec : ""), *save = NULL, *tok;

  if (!copy)
    return -ENOMEM;
  for (tok = strtok_r(copy, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
    char **n = realloc(cl->export_patterns, sizeof(*n) * (cl->nexport + 1));
    if (!n || !(n[cl->nexport] = strdup(tok))) {
      if (n)
        cl->export_patterns = n;
      free(copy);
      return -ENOMEM;
    }
    cl->export_patterns = n;
    cl->nexport++;
  }
  free(copy);
  return 0;
}

/* The shared key: a file only gshmd's user may read; its bytes (blanks
 * around them dropped) hashed to crypto_auth's key size. */
static int read_secret(struct gshmd_cluster *cl, const char *path) {
  uint8_t buf[4096];
  struct stat st;
  ssize_t n;
  size_t b = 0, e;
  int fd;

  if (!path || !*path) {
    gshm_log_err("cluster.secret_file is required when the cluster is on");
    return -EINVAL;
  }
  if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0) {
    gshm_log_err("cluster.secret_file %s: %m", path);
    return -EINVAL;
  }
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077)) {
    gshm_log_err("cluster.secret_file %s: must be a regular file owned by uid %u with no group "
                 "or other permissions (chmod 0600)",
                 path, (unsigned)geteuid());
    close(fd);
    return -EINVAL;
  }
  n = read(fd, buf, sizeof(buf));
  close(fd);
  if (n < 0) {
    gshm_log_err("cluster.secret_file %s: %m", path);
    return -EINVAL;
  }
  e = (size_t)n;
  while (b < e && (buf[b] == ' ' || buf[b] == '\n' || buf[b] == '\t' || buf[b] == '\r'))
    b++;
  while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\n' || buf[e - 1] == '\t' ||
                   buf[e - 1] == '\r'))
    e--;
  if (e - b < 16) {
    gshm_log_err("cluster.secret_file %s: the key must be at least 16 bytes", path);
    sodium_memzero(buf, sizeof(buf));
    return -EINVAL;
  }
  crypto_generichash(cl->key, sizeof(cl->key), buf + b, e - b, NULL, 0);
  sodium_memzero(buf, sizeof(buf));
  return 0;
}

struct peer *gshmd__cluster_peer(struct gshmd_cluster *cl, const char *name) {
  for (unsigned i = 0; cl && i < cl->npeers; i++)
    if (!strcmp(cl->peers[i].name, name))
      return &cl->peers[i];
  return NULL;
}

static bool exported(const struct gshmd_cluster *cl, const struct gshmd_segment *seg) {
  if (seg->unlinked)
    return false;
  for (unsigned i = 0; i < cl->nexport; i++)
    if (fnmatch(cl->export_patterns[i], seg->name, 0) == 0)
      return true;
  return false;
}

int gshmd__cluster_status_errno(uint32_t status) { return gshm__status_to_errno((int)status); }

/* ---- driving the worker from the loop --------------------------------- */

static void drive(struct gshmd_cluster *cl);

static void on_idle(uv_idle_t *h) { drive(h->data); }

static void on_efd(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drive(h->data);
}

void gshmd__cluster_kick(struct gshmd_cluster *cl) {
  if (cl->handles_on && !cl->idle_on) {
    uv_idle_start(&cl->idle, on_idle);
    cl->idle_on = true;
  }
}

/* Progresses the worker a bounded number of times (the loop's local
 * clients are served between two batches), does the work UCX callbacks
 * left for outside them, then arms the event fd; when there is more to
 * do, the idle handle keeps the loop from blocking. */
static void drive(struct gshmd_cluster *cl) {
  struct gshm_list *pos, *tmp;
  bool busy = false;

  for (int round = 0; round < 4 && !busy; round++) {
    unsigned n = 0;
    while (ucp_worker_progress(cl->worker))
      if (++n >= 256) {
        busy = true;
        break;
      }
    /* Links that failed inside a callback are closed here. */
    gshm_list_foreach_safe(pos, tmp, &cl->links) {
      struct link *l = gshm_list_entry(pos, struct link, node);
      if (l->state == LINK_CLOSED && l->ep && l->busy == 0) {
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t sp = ucp_ep_close_nbx(l->ep, &rp);
        l->ep = NULL;
        gshm_list_del(&l->node);
        if (UCS_PTR_IS_PTR(sp)) {
          l->close_req = sp; /* finished by a later progress */
          gshm_list_add_tail(&cl->closing, &l->node);
        } else {
          free(l);
        }
      }
    }
    gshm_list_foreach_safe(pos, tmp, &cl->closing) {
      struct link *l = gshm_list_entry(pos, struct link, node);
      if (ucp_request_check_status(l->close_req) != UCS_INPROGRESS) {
        ucp_request_free(l->close_req);
        gshm_list_del(&l->node);
        free(l);
      } else {
        busy = true;
      }
    }
    gshmd__pull_reap(cl);
    if (busy)
      break;
    if (ucp_worker_arm(cl->worker) == UCS_OK) {
      if (cl->idle_on) {
        uv_idle_stop(&cl->idle);
        cl->idle_on = false;
      }
      return;
    }
  }
  gshmd__cluster_kick(cl);
}

/* ---- sending ---------------------------------------------------------- */

static void on_am_sent(void *request, ucs_status_t status, void *user_data) {
  (void)status;
  free(user_data);
  ucp_request_free(request);
}

int gshmd__cluster_send(struct link *l, const Gshm__Cluster__Msg *m) {
  size_t len = gshm__cluster__msg__get_packed_size(m);
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA,
                            .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                            .cb.send = on_am_sent};
  ucs_status_ptr_t sp;
  uint8_t *buf;

  if (!l->ep || l->state == LINK_CLOSED)
    return -ENOTCONN;
  if (len > GSHMD_CLUSTER_MAX_MSG)
    return -EMSGSIZE;
  if (!(buf = malloc(len ? len : 1)))
    return -ENOMEM;
  gshm__cluster__msg__pack(m, buf);
  rp.user_data = buf;
  sp = ucp_am_send_nbx(l->ep, GSHMD_CLUSTER_AM_ID, NULL, 0, buf, len, &rp);
  gshmd__cluster_kick(l->cl);
  if (UCS_PTR_IS_PTR(sp))
    return 0; /* buf is freed by on_am_sent */
  free(buf);
  return UCS_PTR_STATUS(sp) == UCS_OK ? 0 : -EIO;
}

/* An answer or refusal with status (gshm.Status) and message. */
static void send_status(struct link *l, uint32_t request_id, int err, const char *message) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;

  m.request_id = request_id;
  m.status = (uint32_t)gshm__errno_to_status(err);
  m.message = (char *)(message ? message : "");
  gshmd__cluster_send(l, &m);
}

/* Logs a refusal the first time its cause is seen and then at every
 * power of two, with the count: random bytes must not flood the log. */
static void refused(struct gshmd_cluster *cl, enum refusal why, const char *who,
                    const char *what) {
  uint64_t n = ++cl->refusals[why];
  if ((n & (n - 1)) == 0)
    gshm_log_warn("cluster: refused %s: %s (%" PRIu64 " refusal%s of this kind so far)", who,
                  what, n, n == 1 ? "" : "s");
}

/* Refuses a peer: tells it why, and closes the link soon after. */
static void link_refuse(struct link *l, enum refusal why, int err, const char *message) {
  refused(l->cl, why, l->remote[0] ? l->remote : "a peer", message);
  if (l->state != LINK_CLOSED && l->state != LINK_REFUSED) {
    send_status(l, 0, err, message);
    if (!l->inbound)
      link_fail(l, err, message);
    else
      l->state = LINK_REFUSED; /* the sweep closes it; the peer usually first */
  }
}

/* ---- ops: our requests to peers ---------------------------------------- */

void gshmd__cluster_op_send(struct link *l, struct op *op) {
  op->request_id = ++l->next_request ? l->next_request : ++l->next_request;
  op->msg->request_id = op->request_id;
  gshm_list_add_tail(&l->ops, &op->node);
  op->queued = true;
  op->sent = true;
  if (gshmd__cluster_send(l, op->msg)) {
    gshm_list_del(&op->node);
    op->queued = false;
    op->done(op, -EIO, "cannot send to the peer", NULL);
  }
}

int gshmd__cluster_op_submit(struct gshmd_cluster *cl, struct peer *p, struct op *op) {
  op->peer = p;
  if (p->state == PEER_UP && p->out) {
    gshmd__cluster_op_send(p->out, op);
    return 0;
  }
  gshm_list_add_tail(&p->waiting, &op->node);
  op->queued = true;
  if (p->state == PEER_DOWN)
    peer_connect(cl, p);
  return 0;
}

bool gshmd__cluster_op_cancel(struct op *op) {
  if (op->queued && !op->sent) {
    gshm_list_del(&op->node);
    op->queued = false;
  }
  return !op->queued;
}

static void ops_fail(struct gshm_list *list, int err, const char *why) {
  while (!gshm_list_empty(list)) {
    struct op *op = gshm_list_entry(list->next, struct op, node);
    gshm_list_del(&op->node);
    op->queued = false;
    op->done(op, err, why, NULL);
  }
}

/* ---- links ------------------------------------------------------------ */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  struct link *l = arg;
  char why[96];

  (void)ep;
  snprintf(why, sizeof(why), "connection lost (%s)", ucs_status_string(status));
  link_fail(l, -ECONNRESET, why);
}

static struct link *link_new(struct gshmd_cluster *cl, bool inbound) {
  struct link *l = calloc(1, sizeof(*l));
  if (!l)
    return NULL;
  l->cl = cl;
  l->inbound = inbound;
  l->state = LINK_HELLO;
  l->since_ns = gshm__now_ns(CLOCK_MONOTONIC);
  gshm_list_init(&l->ops);
  gshm_list_init(&l->pulls);
  gshm_list_init(&l->staged);
  gshm_list_add_tail(&cl->links, &l->node);
  randombytes_buf(l->nonce_mine, sizeof(l->nonce_mine));
  if (inbound)
    cl->ninbound_pending++;
  return l;
}

/* Ends a link: its ops and pulls fail, its serving leases end, the peer
 * goes down; the endpoint is closed from drive() (not inside a UCX
 * callback). */
static void link_fail(struct link *l, int err, const char *why) {
  struct gshmd_cluster *cl = l->cl;
  enum link_state was = l->state;

  if (was == LINK_CLOSED)
    return;
  l->state = LINK_CLOSED;
  if (l->inbound && was != LINK_UP)
    cl->ninbound_pending--;
  if (l->peer && l->peer->out == l) {
    struct peer *p = l->peer;
    p->out = NULL;
    p->state = PEER_DOWN;
    p->retry_ns = gshm__now_ns(CLOCK_MONOTONIC) + 2000000000LL;
    /* logged on each change, not on every retry of an absent peer */
    if (was == LINK_UP)
      gshm_log_warn("cluster: peer '%s' (%s) down: %s", p->name, p->address, why);
    else if (strcmp(p->why, why))
      gshm_log_info("cluster: cannot reach peer '%s' (%s): %s", p->name, p->address, why);
    snprintf(p->why, sizeof(p->why), "%s", why);
    ops_fail(&p->waiting, err, why);
  } else if (l->inbound && was == LINK_UP && l->peer) {
    gshm_log_info("cluster: peer '%s' (%s) disconnected: %s", l->peer->name, l->remote, why);
  }
  ops_fail(&l->ops, err, why);
  gshmd__pull_link_lost(cl, l);
  /* Staging copies still running read the granted segments and write
   * the slots: the grants end with the last of them. */
  if (l->busy == 0)
    gshmd__cluster_link_idle(cl, l);
  gshmd__cluster_kick(cl);
}

void gshmd__cluster_link_idle(struct gshmd_cluster *cl, struct link *l) {
  gshmd_stage_link_end(cl, l);
  if (l->serve_client) {
    gshmd_registry_client_remove(cl->reg, l->serve_client); /* ends its grants */
    l->serve_client = NULL;
  }
  gshmd__cluster_kick(cl);
}

static struct link *link_by_ep(struct gshmd_cluster *cl, ucp_ep_h ep) {
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->ep == ep)
      return l;
  }
  return NULL;
}

static void sockaddr_text(const struct sockaddr *sa, char *buf, size_t size) {
  char host[64] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, sizeof(host));
    port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof(host));
    port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
  }
  snprintf(buf, size, "%s:%d", host, port);
}

static void peer_connect(struct gshmd_cluster *cl, struct peer *p) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Hello h = GSHM__CLUSTER__HELLO__INIT;
  ucp_ep_params_t ep = {0};
  struct link *l;
  ucs_status_t st;

  if (cl->stopping || p->out)
    return;
  if (!(l = link_new(cl, false)))
    return;
  l->peer = p;
  snprintf(l->remote, sizeof(l->remote), "%.63s", p->address);
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = (const struct sockaddr *)&p->sa;
  ep.sockaddr.addrlen = p->salen;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = l;
  p->out = l;
  p->state = PEER_CONNECTING;
  if ((st = ucp_ep_create(cl->worker, &ep, &l->ep)) != UCS_OK) {
    l->ep = NULL;
    link_fail(l, -EIO, ucs_status_string(st));
    return;
  }
  h.major = GSHMD_CLUSTER_MAJOR;
  h.minor = GSHMD_CLUSTER_MINOR;
  h.node_name = cl->node_name;
  h.nonce.data = l->nonce_mine;
  h.nonce.len = sizeof(l->nonce_mine);
  m.body_case = GSHM__CLUSTER__MSG__BODY_HELLO;
  m.hello = &h;
  if (gshmd__cluster_send(l, &m))
    link_fail(l, -EIO, "cannot send hello");
}

static void on_conn_request(ucp_conn_request_h req, void *arg) {
  struct gshmd_cluster *cl = arg;
  ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
  ucp_ep_params_t ep = {0};
  struct link *l;
  char remote[64] = "?";

  if (ucp_conn_request_query(req, &attr) == UCS_OK)
    sockaddr_text((const struct sockaddr *)&attr.client_address, remote, sizeof(remote));
  if (cl->stopping || cl->ninbound_pending >= 64 || !(l = link_new(cl, true))) {
    refused(cl, REFUSE_LIMIT, remote, "too many connections in their hello");
    ucp_listener_reject(cl->listener, req);
    return;
  }
  snprintf(l->remote, sizeof(l->remote), "%s", remote);
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = l;
  if (ucp_ep_create(cl->worker, &ep, &l->ep) != UCS_OK) {
    l->ep = NULL;
    link_fail(l, -EIO, "cannot create the endpoint");
  }
}

/* ---- the authenticated hello ------------------------------------------ */

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

static bool name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 63)
    return false;
  for (const char *p = s; *p; p++)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f)
      return false;
  return true;
}

static unsigned count_exported(struct gshmd_cluster *cl) {
  unsigned n = 0;
  struct gshm_list *pos;
  gshm_list_foreach(pos, &cl->reg->segments) {
    n += exported(cl, gshm_list_entry(pos, struct gshmd_segment, node));
  }
  return n;
}

/* Inbound: Hello -> Challenge. */
static void on_hello(struct link *l, const Gshm__Cluster__Hello *h) {
  struct gshmd_cluster *cl = l->cl;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Challenge c = GSHM__CLUSTER__CHALLENGE__INIT;
  uint8_t mac[crypto_auth_BYTES];
  char msg[200];

  if (h->major != GSHMD_CLUSTER_MAJOR) {
    snprintf(msg, sizeof(msg), "cluster protocol %u.%u is not spoken here (%u.%u)", h->major,
             h->minor, GSHMD_CLUSTER_MAJOR, GSHMD_CLUSTER_MINOR);
    link_refuse(l, REFUSE_VERSION, -EPROTONOSUPPORT, msg);
    return;
  }
  if (h->nonce.len != GSHMD_CLUSTER_NONCE || !name_ok(h->node_name)) {
    link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "malformed hello");
    return;
  }
  if (!(l->peer = gshmd__cluster_peer(cl, h->node_name))) {
    snprintf(msg, sizeof(msg), "node '%.63s' is not in cluster.peers of '%s'", h->node_name,
             cl->node_name);
    link_refuse(l, REFUSE_UNKNOWN_PEER, -EPERM, msg);
    return;
  }
  memcpy(l->nonce_theirs, h->nonce.data, GSHMD_CLUSTER_NONCE);
  hello_mac(cl, 'S', l->nonce_theirs, l->nonce_mine, l->peer->name, cl->node_name, mac);
  c.major = GSHMD_CLUSTER_MAJOR;
  c.minor = GSHMD_CLUSTER_MINOR;
  c.node_name = cl->node_name;
  c.nonce.data = l->nonce_mine;
  c.nonce.len = GSHMD_CLUSTER_NONCE;
  c.mac.data = mac;
  c.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_CHALLENGE;
  m.challenge = &c;
  l->state = LINK_AUTH;
  gshmd__cluster_send(l, &m);
}

/* Outbound: Challenge -> Auth (the peer proved the key). */
static void on_challenge(struct link *l, const Gshm__Cluster__Challenge *c) {
  struct gshmd_cluster *cl = l->cl;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Auth a = GSHM__CLUSTER__AUTH__INIT;
  uint8_t mac[crypto_auth_BYTES];
  char msg[400];

  if (c->major != GSHMD_CLUSTER_MAJOR) {
    snprintf(msg, sizeof(msg), "peer speaks cluster protocol %u.%u, this gshmd %u.%u", c->major,
             c->minor, GSHMD_CLUSTER_MAJOR, GSHMD_CLUSTER_MINOR);
    link_refuse(l, REFUSE_VERSION, -EPROTONOSUPPORT, msg);
    return;
  }
  if (c->nonce.len != GSHMD_CLUSTER_NONCE || c->mac.len != crypto_auth_BYTES) {
    link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "malformed challenge");
    return;
  }
  if (strcmp(c->node_name, l->peer->name)) {
    snprintf(msg, sizeof(msg), "the node at %s calls itself '%.63s', not '%s'", l->peer->address,
             c->node_name, l->peer->name);
    link_refuse(l, REFUSE_UNKNOWN_PEER, -EPERM, msg);
    return;
  }
  memcpy(l->nonce_theirs, c->nonce.data, GSHMD_CLUSTER_NONCE);
  hello_mac(cl, 'S', l->nonce_mine, l->nonce_theirs, cl->node_name, l->peer->name, mac);
  if (sodium_memcmp(mac, c->mac.data, sizeof(mac)) != 0) {
    snprintf(msg, sizeof(msg), "peer '%s' did not prove the shared key (cluster.secret_file differs)",
             l->peer->name);
    link_refuse(l, REFUSE_BAD_KEY, -EACCES, msg);
    return;
  }
  hello_mac(cl, 'C', l->nonce_mine, l->nonce_theirs, cl->node_name, l->peer->name, mac);
  a.mac.data = mac;
  a.mac.len = sizeof(mac);
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH;
  m.auth = &a;
  l->state = LINK_AUTH;
  gshmd__cluster_send(l, &m);
}

/* Inbound: Auth -> AuthOk; the link serves from now on. */
static void on_auth(struct link *l, const Gshm__Cluster__Auth *a) {
  struct gshmd_cluster *cl = l->cl;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__AuthOk ok = GSHM__CLUSTER__AUTH_OK__INIT;
  uint8_t mac[crypto_auth_BYTES];
  struct gshmd_cred cred = {.pid = getpid(), .uid = geteuid(), .gid = getegid(), .admin = true};
  char msg[200];

  hello_mac(cl, 'C', l->nonce_theirs, l->nonce_mine, l->peer->name, cl->node_name, mac);
  if (a->mac.len != sizeof(mac) || sodium_memcmp(mac, a->mac.data, sizeof(mac)) != 0) {
    snprintf(msg, sizeof(msg), "node '%s' did not prove the shared key", l->peer->name);
    link_refuse(l, REFUSE_BAD_KEY, -EACCES, msg);
    return;
  }
  /* The serving leases of this link belong to an internal client that
   * gshmctl clients and mappings show as "peer:NAME". */
  if (gshmd_registry_client_add(cl->reg, &cred, &l->serve_client)) {
    link_fail(l, -ENOMEM, "out of memory");
    return;
  }
  snprintf(l->serve_client->name, sizeof(l->serve_client->name), "peer:%.58s", l->peer->name);
  l->state = LINK_UP;
  cl->ninbound_pending--;
  gshm_log_info("cluster: peer '%s' connected from %s", l->peer->name, l->remote);
  ok.exported = count_exported(cl);
  m.body_case = GSHM__CLUSTER__MSG__BODY_AUTH_OK;
  m.auth_ok = &ok;
  gshmd__cluster_send(l, &m);
}

/* Outbound: AuthOk, the peer is up: send what waited for it. */
static void on_auth_ok(struct link *l, const Gshm__Cluster__AuthOk *ok) {
  struct peer *p = l->peer;

  l->state = LINK_UP;
  p->state = PEER_UP;
  p->exported = ok->exported;
  p->why[0] = '\0';
  gshm_log_info("cluster: peer '%s' (%s) up, %u exported segment(s)", p->name, p->address,
                ok->exported);
  while (!gshm_list_empty(&p->waiting) && l->state == LINK_UP) {
    struct op *op = gshm_list_entry(p->waiting.next, struct op, node);
    gshm_list_del(&op->node);
    op->queued = false;
    gshmd__cluster_op_send(l, op);
  }
}

/* ---- serving ---------------------------------------------------------- */

static void segment_to_wire(const struct gshmd_segment *seg, Gshm__Cluster__Segment *s) {
  gshm__cluster__segment__init(s);
  s->id = seg->id;
  s->generation = seg->generation;
  s->name = seg->name;
  s->size = seg->requested_size;
  s->allocated = seg->mem->size;
  s->location = (char *)seg->mem->location;
  s->created_ns = seg->created_ns;
}

static void serve_list(struct link *l, uint32_t rid, const Gshm__Cluster__ListRequest *req) {
  struct gshmd_cluster *cl = l->cl;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;
  Gshm__Cluster__Segment *segs;
  Gshm__Cluster__Segment **ptrs;
  struct gshm_list *pos;
  size_t used = 0, n = 0, cap = 256;

  segs = calloc(cap, sizeof(*segs));
  ptrs = calloc(cap, sizeof(*ptrs));
  if (!segs || !ptrs) {
    free(segs);
    free(ptrs);
    send_status(l, rid, -ENOMEM, "out of memory");
    return;
  }
  gshm_list_foreach(pos, &cl->reg->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    size_t sz;
    if (seg->id <= req->after || !exported(cl, seg))
      continue;
    segment_to_wire(seg, &segs[n]);
    sz = gshm__cluster__segment__get_packed_size(&segs[n]) + 8;
    if (n == cap || used + sz > 32768) {
      r.next = n ? segs[n - 1].id : 0;
      break;
    }
    used += sz;
    ptrs[n] = &segs[n];
    n++;
  }
  r.n_segments = n;
  r.segments = ptrs;
  m.request_id = rid;
  m.status = GSHM__STATUS__STATUS_OK;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  m.list_reply = &r;
  gshmd__cluster_send(l, &m);
  free(segs);
  free(ptrs);
}

static void export_reg_free(struct gshmd_cluster *cl, struct export_reg *x) {
  if (!x)
    return;
  if (x->rkey)
    ucp_rkey_buffer_release(x->rkey);
  if (x->memh)
    ucp_mem_unmap(cl->ctx, x->memh);
  if (x->addr && !x->device)
    munmap(x->addr, x->len);
  free(x);
}

static void on_segment_free(struct gshmd_registry *r, struct gshmd_segment *seg) {
  struct gshmd_cluster *cl = r->on_free_arg;
  if (seg->cluster_export) {
    gshm_log_debug("cluster: segment '%s' id %" PRIu64 " unregistered", seg->name, seg->id);
    export_reg_free(cl, seg->cluster_export);
    seg->cluster_export = NULL;
    cl->registered--;
  }
}

/* Maps and registers a host segment for peers' gets, once per segment. */
static int export_reg_get(struct gshmd_cluster *cl, struct gshmd_segment *seg,
                          struct export_reg **out) {
  struct gshmd_alloc *mem = seg->mem;
  ucp_mem_map_params_t mp = {0};
  struct export_reg *x;
  int fd, e;

  if (seg->cluster_export) {
    *out = seg->cluster_export;
    return 0;
  }
  if (!(x = calloc(1, sizeof(*x))))
    return -ENOMEM;
  x->len = mem->size;
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  if (mem->device_index >= 0) {
    /* the direct path: UCX registers device memory (GPUDirect RDMA) */
    x->device = true;
    if (!mem->backend->ops->local_ptr) {
      e = -ENOTSUP;
      goto fail;
    }
    if ((e = mem->backend->ops->local_ptr(mem->backend, mem, &x->addr)))
      goto fail;
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
  } else {
    if ((e = mem->backend->ops->export_fd(mem->backend, mem, false, &fd)))
      goto fail;
    x->addr = mmap(NULL, x->len, PROT_READ, MAP_SHARED, fd, 0);
    if (x->addr == MAP_FAILED) {
      e = -errno;
      x->addr = NULL;
      gshm_log_err("cluster: mmap of segment '%s': %m", seg->name);
      goto fail;
    }
  }
  mp.address = x->addr;
  mp.length = x->len;
  if (ucp_mem_map(cl->ctx, &mp, &x->memh) != UCS_OK ||
      ucp_rkey_pack(cl->ctx, x->memh, &x->rkey, &x->rkey_len) != UCS_OK) {
    gshm_log_err("cluster: cannot register segment '%s' with UCX", seg->name);
    e = -EIO;
    goto fail;
  }
  gshm_log_debug("cluster: segment '%s' id %" PRIu64 " registered (%zu bytes, rkey %zu bytes)",
                 seg->name, seg->id, x->len, x->rkey_len);
  seg->cluster_export = x;
  cl->registrations++;
  cl->registered++;
  *out = x;
  return 0;
fail:
  export_reg_free(cl, x);
  return e;
}

int gshmd__cluster_host_map(struct gshmd_cluster *cl, struct gshmd_segment *seg,
                            uint8_t **map_out) {
  struct export_reg *x;
  int e = export_reg_get(cl, seg, &x);
  if (!e)
    *map_out = x->addr;
  return e;
}

void gshmd__cluster_grant_close(struct gshmd_cluster *cl, struct link *l, uint64_t grant_id) {
  if (l->serve_client)
    gshmd_registry_close(cl->reg, l->serve_client, grant_id);
}

static void serve_grant(struct link *l, uint32_t rid, const Gshm__Cluster__GrantRequest *req) {
  struct gshmd_cluster *cl = l->cl;
  struct gshmd_segment *seg = gshmd_registry_find_name(cl->reg, req->name);
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
  Gshm__Cluster__Segment s;
  Gshm__OpenRequest open = GSHM__OPEN_REQUEST__INIT;
  struct gshmd_lease *lease;
  struct export_reg *x = NULL;
  const char *msg = NULL;
  char buf[400];
  int e;

  /* A segment that is not exported does not exist for peers. */
  if (!seg || !exported(cl, seg)) {
    snprintf(buf, sizeof(buf), "node '%s' exports no segment named '%.255s'", cl->node_name,
             req->name);
    gshm_log_notice("cluster: peer '%s' asked for '%.255s': not exported", l->peer->name,
                    req->name);
    send_status(l, rid, -ENOENT, buf);
    return;
  }
  open.segment_id = seg->id;
  open.generation = seg->generation;
  open.access = GSHM__ACCESS__ACCESS_READ;
  if ((e = gshmd_registry_open(cl->reg, l->serve_client, &open, &lease, &msg))) {
    send_status(l, rid, e, msg);
    return;
  }
  segment_to_wire(seg, &s);
  g.segment = &s;
  g.grant_id = lease->id;
  /* The path: registered and read directly (host segments; device
   * segments where UCX registers CUDA memory), or staged. */
  if (!strcmp(cl->cfg->cluster_staging, "always") ||
      (seg->mem->device_index >= 0 && !cl->cuda_memory)) {
    struct stage_grant *sg;
    if ((e = gshmd_stage_grant_new(cl, l, lease->id, true, &sg))) {
      gshmd_registry_close(cl->reg, l->serve_client, lease->id);
      send_status(l, rid, e,
                  e == -EBUSY ? "too many staged pulls from this node at once; try again"
                              : "cannot set up the staging buffer");
      return;
    }
    g.path = GSHM__CLUSTER__PATH__PATH_STAGED;
    g.address = (uint64_t)(uintptr_t)sg->sb->addr;
    g.length = sg->sb->len;
    g.rkey.data = sg->sb->rkey;
    g.rkey.len = sg->sb->rkey_len;
    g.slots = sg->sb->slots;
    g.slot_size = sg->sb->slot_size;
  } else {
    struct stage_grant *hg;
    if ((e = export_reg_get(cl, seg, &x)) || (e = gshmd_stage_grant_new(cl, l, lease->id, false, &hg))) {
      gshmd_registry_close(cl->reg, l->serve_client, lease->id);
      send_status(l, rid, e, "cannot register the segment with UCX");
      return;
    }
    g.path = x->device ? GSHM__CLUSTER__PATH__PATH_DIRECT : GSHM__CLUSTER__PATH__PATH_HOST;
    g.address = (uint64_t)(uintptr_t)x->addr;
    g.length = seg->requested_size < x->len ? seg->requested_size : x->len;
    g.rkey.data = x->rkey;
    g.rkey.len = x->rkey_len;
  }
  cl->served_grants++;
  gshm_log_info("cluster: peer '%s' granted read of '%s' id %" PRIu64 " (%s, grant %" PRIu64 ")",
                l->peer->name, seg->name, seg->id,
                g.path == GSHM__CLUSTER__PATH__PATH_HOST     ? "host"
                : g.path == GSHM__CLUSTER__PATH__PATH_DIRECT ? "direct"
                                                             : "staged",
                lease->id);
  m.request_id = rid;
  m.status = GSHM__STATUS__STATUS_OK;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
  m.grant = &g;
  gshmd__cluster_send(l, &m);
}

/* The serving lease of a grant this link holds; NULL when it has none. */
static struct gshmd_lease *link_grant(struct link *l, uint64_t grant_id) {
  struct gshmd_lease *lease = gshmd_registry_find_lease(l->cl->reg, grant_id);
  return lease && lease->client == l->serve_client ? lease : NULL;
}

static void serve_release(struct link *l, const Gshm__Cluster__Release *r) {
  struct gshmd_lease *lease = link_grant(l, r->grant_id);
  if (!lease)
    return;
  /* with bytes of the grant still being sent, the lease (which keeps
   * their memory) ends with the last send */
  gshm_log_debug("cluster: peer '%s' released grant %" PRIu64, l->peer->name, r->grant_id);
  if (gshmd_stage_grant_release(l->cl, l, r->grant_id))
    gshmd_registry_close(l->cl->reg, l->serve_client, lease->id);
}

void gshmd__cluster_link_unbusy(struct gshmd_cluster *cl, struct link *l) {
  if (l->busy)
    return;
  if (l->state != LINK_UP)
    gshmd__cluster_link_idle(cl, l); /* the cleanup link_fail left for us */
}

/* One data message being sent. */
struct data_send {
  struct data_hdr hdr;
  struct link *l;
  void (*done)(void *arg, ucs_status_t st);
  void *arg;
};

static void on_data_sent(void *request, ucs_status_t status, void *user_data) {
  struct data_send *ds = user_data;
  struct link *l = ds->l;

  if (request)
    ucp_request_free(request);
  l->busy--;
  if (ds->done)
    ds->done(ds->arg, status);
  free(ds);
  gshmd__cluster_link_unbusy(l->cl, l);
}

int gshmd__cluster_send_data(struct link *l, uint32_t rid, uint64_t offset, const void *src,
                             uint64_t len, ucp_mem_h memh, void (*done)(void *arg, ucs_status_t st),
                             void *arg) {
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA,
                            .flags = UCP_AM_SEND_FLAG_REPLY,
                            .cb.send = on_data_sent};
  struct data_send *ds;
  ucs_status_ptr_t sp;

  if (!l->ep || l->state != LINK_UP)
    return -ENOTCONN;
  if (!(ds = calloc(1, sizeof(*ds))))
    return -ENOMEM;
  ds->hdr.request_id = rid;
  ds->hdr.offset = offset;
  ds->l = l;
  ds->done = done;
  ds->arg = arg;
  rp.user_data = ds;
  if (memh) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = memh;
  }
  l->busy++;
  sp = ucp_am_send_nbx(l->ep, GSHMD_CLUSTER_DATA_AM_ID, &ds->hdr, sizeof(ds->hdr), src, len, &rp);
  gshmd__cluster_kick(l->cl);
  if (!UCS_PTR_IS_PTR(sp))
    on_data_sent(NULL, UCS_PTR_STATUS(sp), ds);
  return 0;
}

/* A Read's bytes went (or failed): the grant is one send less busy. */
struct read_send {
  struct gshmd_cluster *cl;
  struct link *l;
  uint64_t grant_id;
};

static void on_read_sent(void *arg, ucs_status_t st) {
  struct read_send *rs = arg;
  (void)st;
  gshmd_stage_grant_unbusy(rs->cl, rs->l, rs->grant_id);
  free(rs);
}

/* Read: the bytes of a host (or directly registered device) grant. */
static void serve_read(struct link *l, uint32_t rid, const Gshm__Cluster__Read *r) {
  struct gshmd_lease *lease = link_grant(l, r->grant_id);
  struct stage_grant *g = gshmd_stage_grant_find(l, r->grant_id);
  struct read_send *rs;
  struct export_reg *x;
  struct gshmd_segment *seg;
  int e;

  if (!lease || !g || g->sb || !(seg = lease->seg) || !(x = seg->cluster_export)) {
    send_status(l, rid, -ESTALE, "no such grant (or a staged one: use Stage)");
    return;
  }
  if (r->length == 0 || r->offset > seg->requested_size ||
      r->length > seg->requested_size - r->offset || r->offset + r->length > x->len) {
    send_status(l, rid, -EINVAL, "read outside the segment");
    return;
  }
  if (!(rs = malloc(sizeof(*rs)))) {
    send_status(l, rid, -ENOMEM, "out of memory");
    return;
  }
  rs->cl = l->cl;
  rs->l = l;
  rs->grant_id = r->grant_id;
  g->busy++;
  if ((e = gshmd__cluster_send_data(l, rid, r->offset, (uint8_t *)x->addr + r->offset, r->length,
                                    x->memh, on_read_sent, rs))) {
    g->busy--;
    free(rs);
    send_status(l, rid, e, "cannot send");
  }
}

static void serve_stage(struct link *l, uint32_t rid, const Gshm__Cluster__Stage *s) {
  struct gshmd_lease *lease = link_grant(l, s->grant_id);
  int e;

  if (!lease) {
    send_status(l, rid, -ESTALE, "no such grant");
    return;
  }
  if ((e = gshmd_stage_serve(l->cl, l, rid, lease->seg, s)))
    send_status(l, rid, e, "cannot stage that chunk");
}

/* ---- messages --------------------------------------------------------- */

static void on_answer(struct link *l, Gshm__Cluster__Msg *m) {
  struct gshm_list *pos;

  gshm_list_foreach(pos, &l->ops) {
    struct op *op = gshm_list_entry(pos, struct op, node);
    if (op->request_id == m->request_id) {
      int err = m->status == GSHM__STATUS__STATUS_OK ? 0 : gshmd__cluster_status_errno(m->status);
      gshm_list_del(&op->node);
      op->queued = false;
      op->done(op, err, err ? (m->message[0] ? m->message : "refused by the peer") : NULL,
               err ? NULL : m);
      return;
    }
  }
  link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "answer to no request");
}

static void link_handle(struct link *l, Gshm__Cluster__Msg *m) {
  bool up = l->state == LINK_UP;

  /* A refusal before the link is up ends it (the peer says why). */
  if (m->request_id == 0 && m->status && m->status != GSHM__STATUS__STATUS_OK &&
      m->body_case == GSHM__CLUSTER__MSG__BODY__NOT_SET) {
    char why[224];
    snprintf(why, sizeof(why), "refused by the peer: %.200s", m->message);
    link_fail(l, gshmd__cluster_status_errno(m->status), why);
    return;
  }
  switch (m->body_case) {
  case GSHM__CLUSTER__MSG__BODY_HELLO:
    if (l->inbound && l->state == LINK_HELLO)
      return on_hello(l, m->hello);
    break;
  case GSHM__CLUSTER__MSG__BODY_CHALLENGE:
    if (!l->inbound && l->state == LINK_HELLO)
      return on_challenge(l, m->challenge);
    break;
  case GSHM__CLUSTER__MSG__BODY_AUTH:
    if (l->inbound && l->state == LINK_AUTH)
      return on_auth(l, m->auth);
    break;
  case GSHM__CLUSTER__MSG__BODY_AUTH_OK:
    if (!l->inbound && l->state == LINK_AUTH)
      return on_auth_ok(l, m->auth_ok);
    break;
  case GSHM__CLUSTER__MSG__BODY_LIST:
    if (l->inbound && up)
      return serve_list(l, m->request_id, m->list);
    break;
  case GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST:
    if (l->inbound && up)
      return serve_grant(l, m->request_id, m->grant_request);
    break;
  case GSHM__CLUSTER__MSG__BODY_STAGE:
    if (l->inbound && up)
      return serve_stage(l, m->request_id, m->stage);
    break;
  case GSHM__CLUSTER__MSG__BODY_RELEASE:
    if (l->inbound && up)
      return serve_release(l, m->release);
    break;
  case GSHM__CLUSTER__MSG__BODY_READ:
    if (l->inbound && up)
      return serve_read(l, m->request_id, m->read);
    break;
  case GSHM__CLUSTER__MSG__BODY_LIST_REPLY:
  case GSHM__CLUSTER__MSG__BODY_GRANT:
  case GSHM__CLUSTER__MSG__BODY_STAGED:
  case GSHM__CLUSTER__MSG__BODY__NOT_SET:
    if (!l->inbound && up)
      return on_answer(l, m);
    break;
  default:
    break;
  }
  link_refuse(l, REFUSE_PROTOCOL, -EPROTO, up ? "unexpected message" : "message before the hello");
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param) {
  struct gshmd_cluster *cl = arg;
  struct link *l = param->reply_ep ? link_by_ep(cl, param->reply_ep) : NULL;
  Gshm__Cluster__Msg *m;

  (void)header;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ucp_am_data_release(cl->worker, data); /* we only ever send eager */
    if (l)
      link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "rendezvous control message");
    return UCS_OK;
  }
  if (!l) {
    refused(cl, REFUSE_PROTOCOL, "a message from an unknown endpoint", "no reply endpoint");
    return UCS_OK;
  }
  if (l->state == LINK_CLOSED || l->state == LINK_REFUSED)
    return UCS_OK;
  if (header_length || length > GSHMD_CLUSTER_MAX_MSG ||
      !(m = gshm__cluster__msg__unpack(NULL, length, data))) {
    link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "message does not decode");
    return UCS_OK;
  }
  link_handle(l, m);
  gshm__cluster__msg__free_unpacked(m, NULL);
  return UCS_OK;
}

/* The bytes answering one of our Reads or Stages. */
static ucs_status_t on_data_am(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param) {
  struct gshmd_cluster *cl = arg;
  struct link *l = param->reply_ep ? link_by_ep(cl, param->reply_ep) : NULL;
  struct data_hdr hdr;
  struct gshm_list *pos;

  if (!l || l->inbound || l->state != LINK_UP || header_length != sizeof(hdr)) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
      ucp_am_data_release(cl->worker, data);
    if (l && l->state == LINK_UP)
      link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "unexpected data message");
    else if (!l)
      refused(cl, REFUSE_PROTOCOL, "a data message from an unknown endpoint", "dropped");
    return UCS_OK;
  }
  memcpy(&hdr, header, sizeof(hdr));
  gshm_list_foreach(pos, &l->ops) {
    struct op *op = gshm_list_entry(pos, struct op, node);
    if (op->request_id == hdr.request_id && op->on_data) {
      gshm_list_del(&op->node);
      op->queued = false;
      op->on_data(op, data, length, param);
      return UCS_OK;
    }
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
    ucp_am_data_release(cl->worker, data);
  link_refuse(l, REFUSE_PROTOCOL, -EPROTO, "data for no request");
  return UCS_OK;
}

/* ---- the sweep: handshake timeouts, reconnects ------------------------ */

static void on_sweep(uv_timer_t *t) {
  struct gshmd_cluster *cl = t->data;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  int64_t limit = (int64_t)(cl->cfg->partial_timeout_ms ? cl->cfg->partial_timeout_ms : 5000) *
                  1000000;
  struct gshm_list *pos, *tmp;

  if (cl->listen_pending)
    setup_listener(cl);
  gshm_list_foreach_safe(pos, tmp, &cl->links) {
    struct link *l = gshm_list_entry(pos, struct link, node);
    if (l->state == LINK_REFUSED && now - l->since_ns > 1000000000LL)
      link_fail(l, -EACCES, "refused");
    else if ((l->state == LINK_HELLO || l->state == LINK_AUTH) && now - l->since_ns > limit) {
      if (l->inbound)
        refused(cl, REFUSE_TIMEOUT, l->remote, "no hello in time");
      link_fail(l, -ETIMEDOUT, "no answer to the hello in time");
    }
  }
  for (unsigned i = 0; i < cl->npeers; i++) {
    struct peer *p = &cl->peers[i];
    if (p->state == PEER_DOWN && now >= p->retry_ns) {
      p->retry_ns = now + 5000000000LL;
      peer_connect(cl, p);
    }
  }
  gshmd__cluster_kick(cl);
}

/* ---- local requests ---------------------------------------------------- */

int gshmd_cluster_handle_peers(struct gshmd_cluster *cl, Gshm__Reply *reply) {
  static Gshm__ClusterPeerList empty;

  if (!cl) {
    gshm__cluster_peer_list__init(&empty);
    reply->body_case = GSHM__REPLY__BODY_CLUSTER_PEERS;
    reply->cluster_peers = &empty;
    return 0;
  }
  gshm__cluster_peer_list__init(&cl->peer_list);
  cl->peer_list.node_name = cl->node_name;
  cl->peer_list.listen = cl->cfg->cluster_listen ? cl->cfg->cluster_listen : "";
  cl->peer_list.cuda_memory = cl->cuda_memory;
  for (unsigned i = 0; i < cl->npeers; i++) {
    struct peer *p = &cl->peers[i];
    Gshm__ClusterPeer *ci = &cl->peer_infos[i];
    gshm__cluster_peer__init(ci);
    ci->name = p->name;
    ci->address = p->address;
    ci->state = p->state == PEER_UP ? "up" : p->state == PEER_CONNECTING ? "connecting" : "down";
    ci->exported = p->exported;
    ci->message = p->why;
    cl->peer_ptrs[i] = ci;
  }
  cl->peer_list.n_peers = cl->npeers;
  cl->peer_list.peers = cl->peer_ptrs;
  reply->body_case = GSHM__REPLY__BODY_CLUSTER_PEERS;
  reply->cluster_peers = &cl->peer_list;
  return 0;
}

/* One REMOTE_LIST in flight: the local client's request and our op. */
struct remote_list {
  struct op op;
  Gshm__Cluster__Msg msg;
  Gshm__Cluster__ListRequest req;
  struct gshmd_cluster *cl;
  struct gshmd_client *client;
  uint32_t request_id;
  struct gshm_list node;  /* cl->lists */
};

static void remote_list_done(struct op *op, int err, const char *why,
                             const Gshm__Cluster__Msg *m) {
  struct remote_list *rl = op->arg;
  struct gshmd_cluster *cl = rl->cl;
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__SegmentList list = GSHM__SEGMENT_LIST__INIT;
  Gshm__SegmentInfo *infos = NULL, **ptrs = NULL;
  size_t n = 0;

  gshm_list_del(&rl->node);
  if (!err && m->body_case != GSHM__CLUSTER__MSG__BODY_LIST_REPLY) {
    err = -EPROTO;
    why = "the peer answered a list with something else";
  }
  if (!err) {
    const Gshm__Cluster__ListReply *r = m->list_reply;
    n = r->n_segments;
    infos = calloc(n ? n : 1, sizeof(*infos));
    ptrs = calloc(n ? n : 1, sizeof(*ptrs));
    if (!infos || !ptrs) {
      err = -ENOMEM;
      why = "out of memory";
      n = 0;
    }
    for (size_t i = 0; i < n; i++) {
      const Gshm__Cluster__Segment *s = r->segments[i];
      gshm__segment_info__init(&infos[i]);
      infos[i].id = s->id;
      infos[i].generation = s->generation;
      infos[i].name = s->name;
      infos[i].size = s->allocated;
      infos[i].requested_size = s->size;
      infos[i].location = s->location;
      infos[i].created_ns = s->created_ns;
      infos[i].state = GSHM__SEGMENT_STATE__SEGMENT_STATE_LIVE;
      infos[i].device_index = strcmp(s->location, "host") ? 0 : -1;
      ptrs[i] = &infos[i];
    }
    list.n_segments = n;
    list.segments = ptrs;
    list.next = r->next;
    if (!err && r->next == 0 && rl->req.after == 0)
      op->peer->exported = (uint32_t)n;
    reply.body_case = GSHM__REPLY__BODY_SEGMENTS;
    reply.segments = &list;
  }
  if (err) {
    reply.status = gshm__errno_to_status(err);
    reply.message = (char *)why;
  } else {
    reply.status = GSHM__STATUS__STATUS_OK;
  }
  if (rl->client)
    gshmd_server_reply(cl->srv, rl->client, GSHM_WIRE_REMOTE_LIST, rl->request_id, &reply);
  free(infos);
  free(ptrs);
  free(rl);
}

int gshmd_cluster_handle_remote_list(struct gshmd_cluster *cl, struct gshmd_client *c,
                                     uint32_t request_id, const Gshm__RemoteListRequest *m,
                                     const char **msg_out) {
  struct remote_list *rl;
  struct peer *p;

  if (!cl) {
    *msg_out = "the cluster is off on this node (cluster.listen and cluster.peers are empty)";
    return -ENOTSUP;
  }
  if (!(p = gshmd__cluster_peer(cl, m->peer))) {
    *msg_out = "no such peer in cluster.peers";
    return -ENOENT;
  }
  if (!(rl = calloc(1, sizeof(*rl))))
    return -ENOMEM;
  rl->cl = cl;
  rl->client = c;
  rl->request_id = request_id;
  gshm__cluster__msg__init(&rl->msg);
  gshm__cluster__list_request__init(&rl->req);
  rl->req.after = m->after;
  rl->msg.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  rl->msg.list = &rl->req;
  rl->op.msg = &rl->msg;
  rl->op.done = remote_list_done;
  rl->op.arg = rl;
  gshm_list_add_tail(&cl->lists, &rl->node);
  gshmd__cluster_op_submit(cl, p, &rl->op);
  return 0;
}

int gshmd_cluster_handle_pull(struct gshmd_cluster *cl, struct gshmd_client *c,
                              uint32_t request_id, const Gshm__PullRequest *m,
                              const char **msg_out) {
  if (!cl) {
    *msg_out = "the cluster is off on this node (cluster.listen and cluster.peers are empty)";
    return -ENOTSUP;
  }
  if (!c->cred.admin) {
    bool member = cl->have_pull_gid && c->cred.gid == cl->pull_gid;
    for (int i = 0; cl->have_pull_gid && i < c->cred.ngroups && !member; i++)
      member = c->cred.groups[i] == cl->pull_gid;
    if (!member) {
      *msg_out = cl->have_pull_gid ? "pulling from peers needs membership in cluster.pull_group"
                                   : "pulling from peers is for admins (cluster.pull_group is "
                                     "empty)";
      return -EACCES;
    }
  }
  return gshmd__pull_start(cl, c, request_id, m, msg_out);
}

void gshmd_cluster_client_gone(struct gshmd_cluster *cl, struct gshmd_client *c) {
  struct gshm_list *pos, *tmp;

  if (!cl)
    return;
  gshm_list_foreach_safe(pos, tmp, &cl->lists) {
    struct remote_list *rl = gshm_list_entry(pos, struct remote_list, node);
    if (rl->client == c) {
      rl->client = NULL; /* an answer on its way is dropped */
      if (gshmd__cluster_op_cancel(&rl->op)) {
        gshm_list_del(&rl->node);
        free(rl);
      }
    }
  }
  gshmd__pull_client_gone(cl, c);
}

/* ---- metrics ---------------------------------------------------------- */

void gshmd_cluster_metrics(struct gshmd_cluster *cl, FILE *f) {
  static const char *const causes[REFUSE_N] = {"protocol", "version", "unknown_peer",
                                               "bad_key", "timeout", "limit"};
  if (!cl)
    return;
  fprintf(f, "# HELP gshm_cluster_peer_up 1 when the endpoint to the peer is authenticated.\n"
             "# TYPE gshm_cluster_peer_up gauge\n");
  for (unsigned i = 0; i < cl->npeers; i++)
    fprintf(f, "gshm_cluster_peer_up{peer=\"%s\"} %d\n", cl->peers[i].name,
            cl->peers[i].state == PEER_UP);
  fprintf(f, "# HELP gshm_cluster_pulls_total Pulls from each peer, by result.\n"
             "# TYPE gshm_cluster_pulls_total counter\n");
  for (unsigned i = 0; i < cl->npeers; i++)
    fprintf(f,
            "gshm_cluster_pulls_total{peer=\"%s\",result=\"ok\"} %" PRIu64 "\n"
            "gshm_cluster_pulls_total{peer=\"%s\",result=\"error\"} %" PRIu64 "\n",
            cl->peers[i].name, cl->peers[i].pulls_ok, cl->peers[i].name,
            cl->peers[i].pulls_failed);
  fprintf(f, "# HELP gshm_cluster_pulled_bytes_total Bytes pulled from each peer, by path.\n"
             "# TYPE gshm_cluster_pulled_bytes_total counter\n");
  for (unsigned i = 0; i < cl->npeers; i++)
    fprintf(f,
            "gshm_cluster_pulled_bytes_total{peer=\"%s\",path=\"host\"} %" PRIu64 "\n"
            "gshm_cluster_pulled_bytes_total{peer=\"%s\",path=\"staged\"} %" PRIu64 "\n"
            "gshm_cluster_pulled_bytes_total{peer=\"%s\",path=\"direct\"} %" PRIu64 "\n",
            cl->peers[i].name, cl->peers[i].bytes_host, cl->peers[i].name,
            cl->peers[i].bytes_staged, cl->peers[i].name, cl->peers[i].bytes_direct);
  fprintf(f, "# HELP gshm_cluster_refusals_total Peers and packets refused on the cluster "
             "endpoint, by cause.\n"
             "# TYPE gshm_cluster_refusals_total counter\n");
  for (int i = 0; i < REFUSE_N; i++)
    fprintf(f, "gshm_cluster_refusals_total{cause=\"%s\"} %" PRIu64 "\n", causes[i],
            cl->refusals[i]);
  fprintf(f, "# HELP gshm_cluster_pull_errors_total Failed pulls, by cause.\n"
             "# TYPE gshm_cluster_pull_errors_total counter\n");
  for (unsigned i = 0; i < 8; i++) {
    static const int any_errno[8] = {ECONNRESET, ENOENT, EACCES, EEXIST,
                                     ECANCELED, ENOMEM, EPROTO, EIO};
    fprintf(f, "gshm_cluster_pull_errors_total{cause=\"%s\"} %" PRIu64 "\n",
            gshmd__pull_error_cause(-any_errno[i], NULL), cl->pull_errors[i]);
  }
  fprintf(f, "# HELP gshm_cluster_registrations_total Segments registered with UCX (once each).\n"
             "# TYPE gshm_cluster_registrations_total counter\n"
             "gshm_cluster_registrations_total %" PRIu64 "\n"
             "# HELP gshm_cluster_registered_segments Segments registered with UCX now.\n"
             "# TYPE gshm_cluster_registered_segments gauge\n"
             "gshm_cluster_registered_segments %u\n",
          cl->registrations, cl->registered);
  fprintf(f, "# HELP gshm_cluster_grants_total Read grants given to peers.\n"
             "# TYPE gshm_cluster_grants_total counter\n"
             "gshm_cluster_grants_total %" PRIu64 "\n",
          cl->served_grants);
}

/* ---- start and stop --------------------------------------------------- */

static int setup_ucp(struct gshmd_cluster *cl) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                    /* No UCP_FEATURE_RMA: with it UCX 1.13 answers software
                     * GET requests (transports without RMA, such as tcp) from
                     * any endpoint at any address, before gshm's hello, and
                     * aborts gshmd when the reader died meanwhile
                     * (ucp_get_req_handler: "unexpected error: Endpoint
                     * timeout").  The bytes go as active messages, by
                     * rendezvous when large. */
                    .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                    .mt_workers_shared = 0};
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB |
                                             UCP_AM_HANDLER_PARAM_FIELD_ARG,
                               .id = GSHMD_CLUSTER_AM_ID, .cb = on_am, .arg = cl};
  ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  ucp_config_t *config;
  ucs_status_t st;

  if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK)
    goto fail;
  st = ucp_init(&p, config, &cl->ctx);
  ucp_config_release(config);
  if (st != UCS_OK)
    goto fail;
  if (ucp_context_query(cl->ctx, &attr) == UCS_OK)
    cl->cuda_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  if ((st = ucp_worker_create(cl->ctx, &wp, &cl->worker)) != UCS_OK)
    goto fail;
  if ((st = ucp_worker_get_efd(cl->worker, &cl->efd)) != UCS_OK)
    goto fail;
  if ((st = ucp_worker_set_am_recv_handler(cl->worker, &ap)) != UCS_OK)
    goto fail;
  ap.id = GSHMD_CLUSTER_DATA_AM_ID;
  ap.cb = on_data_am;
  if ((st = ucp_worker_set_am_recv_handler(cl->worker, &ap)) != UCS_OK)
    goto fail;
  gshm_log_info("cluster: UCX %s; device memory %s", ucp_get_version_string(),
                cl->cuda_memory ? "registered directly (UCX has CUDA support)"
                                : "staged through pinned host buffers (this UCX has no CUDA "
                                  "memory support)");
  return 0;
fail:
  gshm_log_err("cluster: UCX setup failed: %s", ucs_status_string(st));
  return -EIO;
}

static int setup_listener(struct gshmd_cluster *cl) {
  struct sockaddr_storage sa;
  socklen_t len;
  ucp_listener_params_t lp = {0};
  ucs_status_t st;

  if (!cl->cfg->cluster_listen || !*cl->cfg->cluster_listen)
    return 0;
  if (parse_address(cl->cfg->cluster_listen, &sa, &len)) {
    gshm_log_err("cluster.listen '%s': want ADDRESS:PORT", cl->cfg->cluster_listen);
    return -EINVAL;
  }
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = (const struct sockaddr *)&sa;
  lp.sockaddr.addrlen = len;
  lp.conn_handler.cb = on_conn_request;
  lp.conn_handler.arg = cl;
  if ((st = ucp_listener_create(cl->worker, &lp, &cl->listener)) != UCS_OK) {
    /* Usually the port of a gshmd that just died, still in TIME_WAIT:
     * local clients must not wait for it, so the sweep tries again. */
    if (!cl->listen_pending)
      gshm_log_warn("cluster: cannot listen on %s yet (%s); trying again every second",
                    cl->cfg->cluster_listen, ucs_status_string(st));
    cl->listener = NULL;
    cl->listen_pending = true;
    return 0;
  }
  if (cl->listen_pending)
    gshm_log_notice("cluster: listening on %s now", cl->cfg->cluster_listen);
  cl->listen_pending = false;
  gshm_log_info("cluster: node '%s' listening on %s, %u peer(s), %u export pattern(s)",
                cl->node_name, cl->cfg->cluster_listen, cl->npeers, cl->nexport);
  return 0;
}

int gshmd_cluster_start(uv_loop_t *loop, const struct gshmd_config *cfg,
                        struct gshmd_registry *reg, struct gshmd_server *srv,
                        struct gshmd_cluster **cl_out) {
  struct gshmd_cluster *cl;
  int e;

  *cl_out = NULL;
  if ((!cfg->cluster_listen || !*cfg->cluster_listen) &&
      (!cfg->cluster_peers || !*cfg->cluster_peers))
    return 0;
  if (sodium_init() < 0) {
    gshm_log_err("cluster: libsodium does not initialise");
    return -EIO;
  }
  if (!(cl = calloc(1, sizeof(*cl))))
    return -ENOMEM;
  cl->loop = loop;
  cl->cfg = cfg;
  cl->reg = reg;
  cl->srv = srv;
  cl->efd = -1;
  gshm_list_init(&cl->links);
  gshm_list_init(&cl->pulls);
  gshm_list_init(&cl->lists);
  gshm_list_init(&cl->closing);
  if (cfg->cluster_node_name && *cfg->cluster_node_name)
    snprintf(cl->node_name, sizeof(cl->node_name), "%s", cfg->cluster_node_name);
  else if (gethostname(cl->node_name, sizeof(cl->node_name) - 1) < 0)
    strcpy(cl->node_name, "localhost");
  if (!name_ok(cl->node_name)) {
    gshm_log_err("cluster.node_name '%s': 1 to 63 bytes, no blanks", cl->node_name);
    e = -EINVAL;
    goto fail;
  }
  if ((e = parse_peers(cl, cfg->cluster_peers)) || (e = parse_exports(cl, cfg->cluster_export)) ||
      (e = read_secret(cl, cfg->cluster_secret_file)))
    goto fail;
  if (cfg->cluster_pull_group && *cfg->cluster_pull_group) {
    struct group *g = getgrnam(cfg->cluster_pull_group);
    if (!g) {
      gshm_log_err("cluster.pull_group '%s' does not exist", cfg->cluster_pull_group);
      e = -EINVAL;
      goto fail;
    }
    cl->have_pull_gid = true;
    cl->pull_gid = g->gr_gid;
  }
  cl->peer_infos = calloc(cl->npeers + 1, sizeof(*cl->peer_infos));
  cl->peer_ptrs = calloc(cl->npeers + 1, sizeof(*cl->peer_ptrs));
  if (!cl->peer_infos || !cl->peer_ptrs) {
    e = -ENOMEM;
    goto fail;
  }
  if ((e = setup_ucp(cl)) || (e = setup_listener(cl)))
    goto fail;
  uv_poll_init(loop, &cl->poll, cl->efd);
  cl->poll.data = cl;
  uv_poll_start(&cl->poll, UV_READABLE, on_efd);
  uv_idle_init(loop, &cl->idle);
  cl->idle.data = cl;
  uv_timer_init(loop, &cl->sweep);
  cl->sweep.data = cl;
  uv_timer_start(&cl->sweep, on_sweep, 0, 1000);
  uv_unref((uv_handle_t *)&cl->sweep);
  cl->handles_on = true;
  reg->on_free = on_segment_free;
  reg->on_free_arg = cl;
  *cl_out = cl;
  gshmd__cluster_kick(cl);
  return 0;
fail:
  gshmd_cluster_destroy(cl);
  return e;
}

void gshmd_cluster_stop(struct gshmd_cluster *cl) {
  struct gshm_list *pos, *tmp;
  struct gshm_list *spos;

  if (!cl || cl->stopping)
    return;
  cl->stopping = true;
  gshmd__pull_stop_all(cl);
  /* Failing the links completes every op, sent or waiting. */
  gshm_list_foreach_safe(pos, tmp, &cl->links)
      link_fail(gshm_list_entry(pos, struct link, node), -ESHUTDOWN, "gshmd is stopping");
  for (unsigned i = 0; i < cl->npeers; i++)
    ops_fail(&cl->peers[i].waiting, -ESHUTDOWN, "gshmd is stopping");
  /* Close the endpoints and let the closes finish (bounded). */
  for (int i = 0; i < 2000 && (!gshm_list_empty(&cl->links) || !gshm_list_empty(&cl->closing));
       i++) {
    drive(cl);
    if (i > 100)
      usleep(1000);
  }
  gshmd__pull_reap(cl);
  gshmd_stage_pool_drain(cl);
  gshm_list_foreach(spos, &cl->reg->segments) {
    struct gshmd_segment *seg = gshm_list_entry(spos, struct gshmd_segment, node);
    export_reg_free(cl, seg->cluster_export);
    seg->cluster_export = NULL;
  }
  if (cl->reg->on_free == on_segment_free) {
    cl->reg->on_free = NULL;
    cl->reg->on_free_arg = NULL;
  }
  if (cl->listener) {
    ucp_listener_destroy(cl->listener);
    cl->listener = NULL;
  }
  if (cl->handles_on) {
    cl->handles_on = false;
    uv_close((uv_handle_t *)&cl->poll, NULL);
    uv_close((uv_handle_t *)&cl->idle, NULL);
    uv_close((uv_handle_t *)&cl->sweep, NULL);
  }
}

void gshmd_cluster_destroy(struct gshmd_cluster *cl) {
  if (!cl)
    return;
  if (cl->listener)
    ucp_listener_destroy(cl->listener);
  gshmd_stage_pool_drain(cl);
  if (cl->worker)
    ucp_worker_destroy(cl->worker);
  if (cl->ctx)
    ucp_cleanup(cl->ctx);
  for (unsigned i = 0; i < cl->nexport; i++)
    free(cl->export_patterns[i]);
  free(cl->export_patterns);
  free(cl->peers);
  free(cl->peer_infos);
  free(cl->peer_ptrs);
  sodium_memzero(cl->key, sizeof(cl->key));
  free(cl);
}
