/* SPDX-License-Identifier: Apache-2.0 */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "server.h"
#include "util.h"

#ifdef GSHM_HAVE_MHD
#include <microhttpd.h>

/* Connections in all, and of one uid.  Loopback TCP carries no
 * credentials, so the uid comes from the kernel's socket table (sock_diag)
 * as each connection is accepted; one user's slow sockets (slowloris) hold
 * at most HTTP_PER_UID slots and everyone else is served
 * (docs/SECURITY.md).  Peers whose uid cannot be found share HTTP_PER_UID
 * slots as one class of their own, UID_UNKNOWN.  The last HTTP_ADMIN_SLOTS
 * are kept for root and daemon.admin_group: 16 uids (a subordinate uid
 * range) held all 64 otherwise. */
#define HTTP_CONNECTIONS 64
#define HTTP_PER_UID 4
#define HTTP_ADMIN_SLOTS 8
#define UID_UNKNOWN ((uid_t)-1)

/* One accepted connection: its peer address and uid.  `started`: MHD
 * reported the connection (NOTIFY_STARTED); an entry still without it at
 * the next accept was dropped by MHD after the accept policy said yes.
 * `reserved`: it took one of the HTTP_ADMIN_SLOTS. */
struct http_conn {
  bool used, started, reserved;
  uid_t uid;
  socklen_t peer_len;
  struct sockaddr_storage peer;
};

struct gshmd_metrics_http {
  struct MHD_Daemon *mhd;
  uv_timer_t timer;
  struct gshmd_server *srv;
  pthread_mutex_t lock;
  char *snapshot; /* under lock */
  /* The HTTP thread's alone (the accept policy and connection notices run
   * there): */
  int diag_fd; /* NETLINK_SOCK_DIAG, or -1 */
  unsigned diag_seq;
  struct sockaddr_storage local; /* the listener's address */
  bool have_admin_gid;           /* daemon.admin_group, as the server resolved it */
  gid_t admin_gid;
  struct http_conn conns[HTTP_CONNECTIONS];
  /* uid_is_admin's answers, kept ADMIN_CACHE_NS: a user database that
   * answers slowly (LDAP, sssd) is asked once a uid a minute, not once a
   * connection while the ordinary slots are full */
  struct admin_answer {
    int64_t at_ns; /* CLOCK_MONOTONIC; 0: empty */
    uid_t uid;
    bool admin;
  } admin_cache[HTTP_CONNECTIONS];
  unsigned admin_next; /* the entry replaced next */
};

#define ADMIN_CACHE_NS (60 * 1000000000LL)

static void refresh(struct gshmd_metrics_http *h) {
  char *text = NULL, *old;
  if (gshmd_metrics_render(h->srv, &text))
    return;
  pthread_mutex_lock(&h->lock);
  old = h->snapshot;
  h->snapshot = text;
  pthread_mutex_unlock(&h->lock);
  free(old);
}

static void on_timer(uv_timer_t *t) { refresh(t->data); }

/* The sock_diag request for the client end of the connection from peer to
 * the listener: local and remote swapped, looked up exactly (no dump). */
static void diag_request(const struct gshmd_metrics_http *h, const struct sockaddr *peer,
                         struct inet_diag_req_v2 *r) {
  memset(r, 0, sizeof(*r));
  r->sdiag_family = (unsigned char)peer->sa_family;
  r->sdiag_protocol = IPPROTO_TCP;
  r->idiag_states = ~0U;
  r->id.idiag_cookie[0] = r->id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (peer->sa_family == AF_INET) {
    const struct sockaddr_in *p = (const void *)peer, *l = (const void *)&h->local;
    r->id.idiag_sport = p->sin_port;
    r->id.idiag_dport = l->sin_port;
    memcpy(r->id.idiag_src, &p->sin_addr, sizeof(p->sin_addr));
    memcpy(r->id.idiag_dst, &l->sin_addr, sizeof(l->sin_addr));
  } else {
    const struct sockaddr_in6 *p = (const void *)peer, *l = (const void *)&h->local;
    r->id.idiag_sport = p->sin6_port;
    r->id.idiag_dport = l->sin6_port;
    memcpy(r->id.idiag_src, &p->sin6_addr, sizeof(p->sin6_addr));
    memcpy(r->id.idiag_dst, &l->sin6_addr, sizeof(l->sin6_addr));
  }
}

/* The uid that owns the client's socket of a loopback connection, or
 * UID_UNKNOWN (no sock_diag socket, the client already gone, any error).
 * Never waits: the kernel answers a sock_diag request inside sendmsg, so
 * the reply is queued when send returns, and the socket is non-blocking. */
static uid_t peer_uid(struct gshmd_metrics_http *h, const struct sockaddr *peer) {
  struct {
    struct nlmsghdr nh;
    struct inet_diag_req_v2 r;
  } req = {.nh = {.nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                  .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = ++h->diag_seq}};
  long buf[512]; /* aligned for nlmsghdr */
  struct nlmsghdr *nh;
  ssize_t n;
  unsigned len;

  if (h->diag_fd < 0 || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6))
    return UID_UNKNOWN;
  diag_request(h, peer, &req.r);
  if (send(h->diag_fd, &req, sizeof(req), 0) != (ssize_t)sizeof(req))
    return UID_UNKNOWN;
  /* Replies to earlier requests (should one have come late) are skipped. */
  for (int tries = 0; tries < 8; tries++) {
    if ((n = recv(h->diag_fd, buf, sizeof(buf), MSG_DONTWAIT)) <= 0)
      return UID_UNKNOWN;
    len = (unsigned)n;
    for (nh = (struct nlmsghdr *)buf; NLMSG_OK(nh, len); nh = NLMSG_NEXT(nh, len)) {
      if (nh->nlmsg_seq != h->diag_seq)
        continue;
      if (nh->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
          nh->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
        return UID_UNKNOWN; /* NLMSG_ERROR: ENOENT when the client is gone */
      return ((const struct inet_diag_msg *)NLMSG_DATA(nh))->idiag_uid;
    }
  }
  return UID_UNKNOWN;
}

/* Whether uid is root or a member of daemon.admin_group (its primary
 * group or one of its groups in the user database).  Asks the user
 * database (NSS), which may wait: only for a connection that wants one of
 * the admins' slots, i.e. while the others are all taken, and once a uid
 * a minute (uid_is_admin). */
static bool uid_is_admin_asked(const struct gshmd_metrics_http *h, uid_t uid) {
  struct passwd pwd, *pw = NULL;
  gid_t small[64], *groups = small;
  int n = (int)(sizeof(small) / sizeof(small[0]));
  char buf[4096];
  bool admin = false;

  if (uid == 0)
    return true;
  if (uid == UID_UNKNOWN || !h->have_admin_gid || getpwuid_r(uid, &pwd, buf, sizeof(buf), &pw) ||
      !pw)
    return false;
  if (pw->pw_gid == h->admin_gid)
    return true;
  if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &n) < 0) {
    /* n: how many it has; a second try with room for them all */
    if (n <= 0 || !(groups = calloc((size_t)n, sizeof(*groups))) ||
        getgrouplist(pw->pw_name, pw->pw_gid, groups, &n) < 0)
      n = 0;
  }
  for (int i = 0; i < n && !admin; i++)
    admin = groups[i] == h->admin_gid;
  if (groups != small)
    free(groups);
  return admin;
}

/* uid_is_admin_asked, its answer kept a minute (h->admin_cache). */
static bool uid_is_admin(struct gshmd_metrics_http *h, uid_t uid) {
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  struct admin_answer *a;

  if (uid == 0 || uid == UID_UNKNOWN)
    return uid == 0;
  for (size_t i = 0; i < HTTP_CONNECTIONS; i++) {
    a = &h->admin_cache[i];
    if (a->at_ns && a->uid == uid && now - a->at_ns < ADMIN_CACHE_NS)
      return a->admin;
  }
  a = &h->admin_cache[h->admin_next++ % HTTP_CONNECTIONS];
  *a = (struct admin_answer){.at_ns = now, .uid = uid, .admin = uid_is_admin_asked(h, uid)};
  return a->admin;
}

/* MHD's accept policy: refuses a connection whose uid already holds
 * HTTP_PER_UID, or that is not an admin's while only the admins' slots are
 * left (MHD closes it at once), else records it. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
  struct gshmd_metrics_http *h = cls;
  struct http_conn *slot = NULL;
  uid_t uid = peer_uid(h, addr);
  unsigned held = 0, ordinary = 0;
  bool reserved;

  if (addrlen > sizeof(slot->peer))
    return MHD_NO;
  for (size_t i = 0; i < HTTP_CONNECTIONS; i++) {
    struct http_conn *c = &h->conns[i];
    if (c->used && !c->started)
      c->used = false; /* MHD dropped it before NOTIFY_STARTED */
    if (!c->used) {
      slot = slot ? slot : c;
      continue;
    }
    held += c->uid == uid;
    ordinary += !c->reserved;
  }
  /* MHD asks only below HTTP_CONNECTIONS, so a slot is free. */
  reserved = ordinary >= HTTP_CONNECTIONS - HTTP_ADMIN_SLOTS;
  if (held >= HTTP_PER_UID || !slot || (reserved && !uid_is_admin(h, uid))) {
    gshm_log_debug("metrics: refused an HTTP connection of uid %d: it holds %u, all hold %u "
                   "of the %d slots of non-admins",
                   (int)uid, held, ordinary, HTTP_CONNECTIONS - HTTP_ADMIN_SLOTS);
    return MHD_NO;
  }
  *slot = (struct http_conn){.used = true, .reserved = reserved, .uid = uid, .peer_len = addrlen};
  memcpy(&slot->peer, addr, addrlen);
  return MHD_YES;
}

/* MHD's connection notices: ties the entry accept_policy made to the
 * connection, and frees it when the connection closes. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **ctx,
                          enum MHD_ConnectionNotificationCode code) {
  struct gshmd_metrics_http *h = cls;
  const union MHD_ConnectionInfo *info;

  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    if (*ctx)
      ((struct http_conn *)*ctx)->used = false;
    *ctx = NULL;
    return;
  }
  info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  for (size_t i = 0; info && i < HTTP_CONNECTIONS; i++) {
    struct http_conn *c = &h->conns[i];
    if (c->used && !c->started && !memcmp(&c->peer, info->client_addr, c->peer_len)) {
      c->started = true;
      *ctx = c;
      return;
    }
  }
}

/* The sock_diag socket, or -1: then every client is UID_UNKNOWN and all
 * share HTTP_PER_UID connections (logged). */
static int diag_open(void) {
  int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_SOCK_DIAG);
  if (fd < 0)
    gshm_log_warn("metrics: no sock_diag socket (%m): HTTP clients cannot be told apart by "
                  "user and share %d connections; allow AF_NETLINK (RestrictAddressFamilies=)",
                  HTTP_PER_UID);
  return fd;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  struct gshmd_metrics_http *h = cls;
  struct MHD_Response *resp;
  enum MHD_Result ret;
  unsigned status = MHD_HTTP_OK;
  char *body;

  (void)version, (void)upload, (void)upload_size, (void)con_cls;
  if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
    body = strdup("only GET\n");
  } else if (strcmp(url, "/metrics")) {
    status = MHD_HTTP_NOT_FOUND;
    body = strdup("gshmd serves /metrics\n");
  } else {
    pthread_mutex_lock(&h->lock);
    body = strdup(h->snapshot ? h->snapshot : "");
    pthread_mutex_unlock(&h->lock);
  }
  if (!body)
    return MHD_NO;
  resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  /* each answer ends its connection (no idle keep-alive connection holds
   * one of its uid's slots): said here, not left to libmicrohttpd's
   * handling of a response queued in the first call (0.9.75 closes then) */
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  ret = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

int gshmd_metrics_http_start(uv_loop_t *loop, struct gshmd_server *srv, const char *listen,
                             struct gshmd_metrics_http **out) {
  struct gshmd_metrics_http *h;
  struct sockaddr_storage sa;
  socklen_t salen;

  if (gshm__parse_loopback(listen, &sa, &salen)) {
    gshm_log_err("metrics.http_listen '%s': want a loopback ADDRESS:PORT such as 127.0.0.1:9477",
                 listen);
    return -EINVAL;
  }
  if (!(h = calloc(1, sizeof(*h))))
    return -ENOMEM;
  pthread_mutex_init(&h->lock, NULL);
  h->srv = srv;
  h->local = sa;
  h->have_admin_gid = srv->have_admin_gid;
  h->admin_gid = srv->admin_gid;
  h->diag_fd = diag_open();
  refresh(h);
  /* MHD_USE_AUTO: poll or epoll, not select(), which refuses descriptors
   * numbered 1024 and above, and gshmd holds one per segment. */
  h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                                (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
                            0, accept_policy, h, answer, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)HTTP_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, 10U,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
  if (!h->mhd) {
    gshm_log_err("metrics: cannot listen on %s", listen);
    if (h->diag_fd >= 0)
      close(h->diag_fd);
    pthread_mutex_destroy(&h->lock);
    free(h->snapshot);
    free(h);
    return -EADDRINUSE;
  }
  uv_timer_init(loop, &h->timer);
  h->timer.data = h;
  uv_timer_start(&h->timer, on_timer, 1000, 1000);
  uv_unref((uv_handle_t *)&h->timer);
  gshm_log_info("metrics at http://%s/metrics", listen);
  *out = h;
  return 0;
}

static void on_timer_closed(uv_handle_t *t) {
  struct gshmd_metrics_http *h = t->data;
  if (h->diag_fd >= 0)
    close(h->diag_fd);
  pthread_mutex_destroy(&h->lock);
  free(h->snapshot);
  free(h);
}

void gshmd_metrics_http_stop(struct gshmd_metrics_http *h) {
  if (!h)
    return;
  MHD_stop_daemon(h->mhd); /* joins the HTTP thread: no scrape runs after this */
  uv_close((uv_handle_t *)&h->timer, on_timer_closed);
}

#else /* !GSHM_HAVE_MHD */

struct gshmd_metrics_http {
  int unused;
};

int gshmd_metrics_http_start(uv_loop_t *loop, struct gshmd_server *srv, const char *listen,
                             struct gshmd_metrics_http **out) {
  struct sockaddr_storage sa;
  socklen_t salen;

  (void)loop, (void)srv, (void)out;
  if (gshm__parse_loopback(listen, &sa, &salen))
    return -EINVAL;
  gshm_log_err("metrics.http_listen is set, but this gshmd was built without libmicrohttpd");
  return -ENOTSUP;
}

void gshmd_metrics_http_stop(struct gshmd_metrics_http *h) { (void)h; }

#endif
