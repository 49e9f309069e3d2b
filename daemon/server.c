/* SPDX-License-Identifier: Apache-2.0 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cluster.h"
#include "config.h"
#include "log.h"
#include "histogram.h"
#include "registry.h"
#include "requests.h"
#include "errors.h"
#include "util.h"

struct out_pkt {
  struct gshm_list node;
  size_t len;
  int fd;
  bool event; /* counted in conn.nevents, not against limits.max_inflight */
  bool created;      /* lease_id's grant answered a create */
  uint64_t lease_id; /* a reply granting this lease with fd; 0: none */
  uint8_t data[];
};

static void conn_on_io(uv_poll_t *h, int status, int events);
static void on_accept(uv_poll_t *h, int status, int events);

#define ACCEPT_RETRY_MS 1000 /* paused at the fd limit: try again after this */

void gshmd__accept_resume(struct gshmd_server *s) {
  if (!s->accept_paused || !s->listening)
    return;
  s->accept_paused = false;
  uv_timer_stop(&s->accept_timer);
  uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
}

static void on_accept_timer(uv_timer_t *t) { gshmd__accept_resume(t->data); }

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83 /* Linux 6.16 */
#endif
/* Refuses fds at the sender (sendmsg fails with EPERM) where the kernel
 * can (SO_PASSRIGHTS, Linux 6.16+; accepted sockets inherit it from the
 * listener, so nothing slips in before accept).  Returns true if set. */
static bool refuse_fds(int fd) {
  int off = 0;
  return setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, &off, sizeof(off)) == 0;
}

/* accept failed for want of fds: stop polling the listener (a pending
 * connection would make it readable on every loop turn, 100% CPU) until
 * a connection closes or ACCEPT_RETRY_MS pass. */
static void accept_pause(struct gshmd_server *s, int err) {
  if (!s->accept_logged) {
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    gshm_log_warn("accept: %s with %u connections (fd limit %llu); not accepting until an fd is "
                  "freed",
                  strerror(err), s->nconns, (unsigned long long)rl.rlim_cur);
    s->accept_logged = true;
    s->accept_pauses++;
  }
  s->accept_paused = true;
  uv_poll_stop(&s->listen_poll);
  uv_timer_start(&s->accept_timer, on_accept_timer, ACCEPT_RETRY_MS, 0);
}

static void conn_on_closed(uv_handle_t *h) {
  struct conn *c = h->data;
  struct gshm_list *pos, *tmp;

  /* (its unread packets may carry fds both ways) */
  gshmd_closer_close_client(c->srv, c->fd, c->cred.uid, c->sent_fd);
  gshm_list_foreach_safe(pos, tmp, &c->outq) {
    struct out_pkt *p = gshm_list_entry(pos, struct out_pkt, node);
    if (p->fd >= 0)
      close(p->fd);
    free(p);
  }
  if (c->pidfd >= 0)
    close(c->pidfd);
  free(c->cred.groups);
  free(c);
}

void gshmd_conn_close(struct conn *c, const char *why) {
  if (c->closing)
    return;
  c->closing = true;
  if (c->client) {
    gshm_log_info("client %" PRIu64 " '%s' pid %d uid %u disconnected%s%s", c->client->session_id,
                  c->client->name, (int)c->cred.pid, (unsigned)c->cred.uid, why ? ": " : "",
                  why ? why : "");
    gshmd_cluster_client_gone(c->srv->cluster, c->client);
    gshmd_registry_client_remove(c->srv->reg, c->client);
    c->client = NULL;
  } else if (why) {
    gshm_log_info("connection from pid %d uid %u dropped: %s", (int)c->cred.pid,
                  (unsigned)c->cred.uid, why);
  }
  gshm_list_del(&c->node);
  c->srv->nconns--;
  uv_poll_stop(&c->poll);
  uv_close((uv_handle_t *)&c->poll, conn_on_closed);
}

/* gshmd_conn_send_packet, for a reply (event false) or an event.  Only
 * replies count against limits.max_inflight: a client owes gshmd a read
 * of each reply before its next request is read, but events come
 * unasked, at most one per segment the connection holds a lease on
 * (unlink and revoke each happen once, to a linked segment), and the
 * connection's leases cannot change while its queue holds anything (its
 * requests are not read); so queued events are bounded by the leases of
 * its user (quota.leases).  Counted against the cap, a holder busy for a
 * moment while a model of hundreds of segments was replaced was dropped
 * ("does not read its replies"), its leases ended and the unlinked
 * segments it still mapped were freed and punched. */
static int conn_send(struct conn *c, size_t len, int fd, bool event) {
  struct gshmd_server *s = c->srv;
  struct out_pkt *p;
  int r = -EAGAIN;

  if (c->noutq == 0)
    r = gshm__wire_sendmsg(c->fd, s->txbuf, len, fd);
  /* An event never closes its connection here: it is sent from inside
   * other work (an unlink, a revoke, a pull's publish), whose state a
   * close would change under it (the client's leases end; a requester's
   * pulls are cancelled).  A peer that is gone is closed by its poll
   * (hangup); any other failure queues the event, and its flush from the
   * loop closes the connection if the send fails again. */
  if (event && (r == -EPIPE || r == -ECONNRESET))
    return r;
  if (event && r && r != -EAGAIN)
    r = -EAGAIN;
  /* The fd could not go (gshmd's user has more fds in flight than its
   * RLIMIT_NOFILE): nothing was sent and the connection stays; the caller
   * answers without it (requests.c undoes the grant). */
  if (fd >= 0 && r == -ETOOMANYREFS)
    return r;
  if (r == -EAGAIN) {
    if (!event && c->noutq - c->nevents >= s->cfg->max_inflight) {
      gshmd_conn_close(c, "client does not read its replies");
      return -ENOBUFS;
    }
    if (!(p = malloc(sizeof(*p) + len))) {
      if (event) {
        gshm_log_warn("out of memory: an event to client %" PRIu64 " is lost",
                      c->client ? c->client->session_id : 0);
        return -ENOMEM;
      }
      gshmd_conn_close(c, "out of memory");
      return -ENOMEM;
    }
    memcpy(p->data, s->txbuf, len);
    p->len = len;
    p->fd = -1;
    p->event = event;
    p->created = false;
    p->lease_id = 0;
    if (fd >= 0 && (p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
      free(p);
      return -EMFILE; /* (as for -ETOOMANYREFS above) */
    }
    gshm_list_add_tail(&c->outq, &p->node);
    c->nevents += event;
    if (c->noutq++ == 0) {
      c->stalled_ns = gshm__now_ns(CLOCK_MONOTONIC);
      uv_poll_start(&c->poll, UV_WRITABLE | UV_DISCONNECT, conn_on_io);
    }
    return 0;
  }
  if (r) {
    gshmd_conn_close(c, r == -EPIPE || r == -ECONNRESET ? NULL : "send failed");
    return r;
  }
  if (fd >= 0) {
    s->fds_sent++;
    c->sent_fd = true;
  }
  return 0;
}

int gshmd_conn_send_packet(struct conn *c, size_t len, int fd) {
  return conn_send(c, len, fd, false);
}

int gshmd_conn_send(struct conn *c, uint16_t type, uint32_t request_id, const Gshm__Reply *reply,
                    int fd) {
  size_t len;

  if (gshm__wire_pack(type | GSHM_WIRE_REPLY, request_id, &reply->base, c->srv->txbuf,
                      sizeof(c->srv->txbuf), &len)) {
    /* Cannot happen for bounded replies: lists are paginated to fit. */
    gshm_log_err("reply to type %u does not fit in one packet", type);
    gshmd_conn_close(c, "reply too large");
    return -EMSGSIZE;
  }
  return gshmd_conn_send_packet(c, len, fd);
}

int gshmd_server_reply(struct gshmd_server *s, struct gshmd_client *client, uint16_t type,
                       uint32_t request_id, const Gshm__Reply *reply) {
  struct conn *c = client ? client->conn : NULL;

  (void)s;
  if (!c || c->closing)
    return -ENOTCONN;
  /* A deferred answer carries what a peer said: one that does not fit a
   * packet is answered as an error, never by closing c (its leases). */
  if (gshm__reply__get_packed_size(reply) > GSHM_WIRE_MAX_PACKET - GSHM_WIRE_HEADER_SIZE) {
    Gshm__Reply refusal = GSHM__REPLY__INIT;
    gshm_log_warn("reply to type %u does not fit in one packet: answered with an error", type);
    refusal.status = gshm__errno_to_status(-EPROTO);
    refusal.message = "the answer from the peer does not fit one reply";
    return gshmd_conn_send(c, type, request_id, &refusal, -1) ? -ENOTCONN : -EMSGSIZE;
  }
  /* The parts of one PULL's answer (docs/SECURITY.md): a progress report
   * is dropped while the client has replies unread (the next one says
   * more), and the result's pull_items pages go as events do, outside
   * limits.max_inflight: counted one a packet, a set of 4,000 long names
   * (about 25 pages) closed a client that read them only at the end. */
  if (reply->body_case == GSHM__REPLY__BODY_PULL_PROGRESS && c->noutq)
    return 0;
  if (reply->body_case == GSHM__REPLY__BODY_PULL_ITEMS) {
    size_t len;
    if (gshm__wire_pack(type | GSHM_WIRE_REPLY, request_id, &reply->base, c->srv->txbuf,
                        sizeof(c->srv->txbuf), &len))
      return -EMSGSIZE; /* (cannot happen: checked above) */
    return conn_send(c, len, -1, true) ? -ENOTCONN : 0;
  }
  return gshmd_conn_send(c, type, request_id, reply, -1) ? -ENOTCONN : 0;
}

void gshmd_notify_lease_holders(struct gshmd_server *s, struct gshmd_segment *seg,
                                Gshm__EventKind kind, const struct conn *except) {
  Gshm__Event ev = GSHM__EVENT__INIT;
  struct gshm_list *pos;
  struct conn **targets;
  unsigned n = 0;
  size_t len;

  ev.kind = kind;
  ev.segment_id = seg->id;
  ev.generation = seg->generation;
  if (!seg->nleases || !(targets = malloc(sizeof(*targets) * seg->nleases)))
    return;
  /* Collect first, then send: one event per connection, however many of
   * its leases the segment has (an event's send closes nothing). */
  s->notify_seq++;
  gshm_list_foreach(pos, &seg->leases) {
    struct gshmd_lease *l = gshm_list_entry(pos, struct gshmd_lease, seg_node);
    struct conn *c = l->client->conn;
    if (c && c != except && c->notify_mark != s->notify_seq) {
      c->notify_mark = s->notify_seq; /* one event per connection */
      targets[n++] = c;
    }
  }
  for (unsigned i = 0; i < n; i++) {
    if (targets[i]->closing ||
        gshm__wire_pack(GSHM_WIRE_EVENT, 0, &ev.base, s->txbuf, sizeof(s->txbuf), &len))
      continue;
    conn_send(targets[i], len, -1, true);
  }
  free(targets);
}

/* The registry's on_replaced: a publish (a pull's --replace) unlinks
 * seg; its holders learn it as of an unlink, so that their lease caches
 * stop serving the old segment under the name. */
static void notify_replaced(void *arg, struct gshmd_segment *seg) {
  gshmd_notify_lease_holders(arg, seg, GSHM__EVENT_KIND__EVENT_KIND_UNLINKED, NULL);
}

void gshmd_conn_fail(struct conn *c, uint16_t type, uint32_t request_id, Gshm__Status status,
                     const char *message) {
  Gshm__Reply reply = GSHM__REPLY__INIT;

  c->srv->protocol_errors++;
  reply.status = status;
  reply.message = (char *)message;
  if (gshmd_conn_send(c, type, request_id, &reply, -1) == 0)
    gshmd_conn_close(c, message);
}

/* The arena's allocator: memory comes from srv->arena until it is full
 * (a 64 KiB packet unpacks into well under 4x its size), then malloc. */
static void *arena_alloc(void *data, size_t size) {
  struct gshmd_server *s = data;
  size_t need = (size + 15) & ~(size_t)15;

  if (need >= size && need <= sizeof(s->arena) - s->arena_used) {
    void *p = s->arena + s->arena_used;
    s->arena_used += need;
    return p;
  }
  return malloc(size);
}

static void arena_free(void *data, void *p) {
  struct gshmd_server *s = data;
  if ((uint8_t *)p < s->arena || (uint8_t *)p >= s->arena + sizeof(s->arena))
    free(p);
}


/* Whether any handle of the loop has an event ready (another client, the
 * listener, metrics, the cluster, a signal): libuv's epoll set is
 * level-triggered, so its fd is readable exactly then.  The connection
 * being read is not among them when this is asked (its last read said
 * EAGAIN).  One poll(2) that does not wait. */
static bool loop_has_work(const struct gshmd_server *s) {
  struct pollfd p = {.fd = uv_backend_fd(s->loop), .events = POLLIN};
  return p.fd < 0 || poll(&p, 1, 0) != 0;
}

static void conn_read(struct conn *c) {
  struct gshmd_server *s = c->srv;
  int fds[GSHM_WIRE_MAX_FDS];
  int64_t poll_until = 0;
  /* Bounded per wake-up so that one busy client cannot starve others. */
  for (int i = 0; i < 32 && !c->closing && !c->noutq;) {
    int nfds = 0;
    ssize_t n = gshm__wire_recv(c->fd, s->rxbuf, sizeof(s->rxbuf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);
    gshmd_closer_close(s, fds, nfds, c->cred.uid); /* no request takes an fd */
    if (n == -EAGAIN) {
      /* After a request, the same client's next one often follows at
       * once (open, map report, close): poll for it a little rather than
       * pay a wake-up from epoll (cfg poll_us).  Never while anything
       * else waits on the loop: other clients come first. */
      if (!i || !s->poll_ns || loop_has_work(s))
        return;
      if (!poll_until)
        poll_until = gshm__now_ns(CLOCK_MONOTONIC) + s->poll_ns;
      else if (gshm__now_ns(CLOCK_MONOTONIC) >= poll_until)
        return;
      continue;
    }
    i++;
    poll_until = 0;
    if (n == 0) {
      gshmd_conn_close(c, NULL);
      return;
    }
    if (n == -EMSGSIZE) {
      gshmd_conn_fail(c, 0, 0, GSHM__STATUS__STATUS_TOO_BIG,
                      nfds ? "too many file descriptors in one packet"
                      : "packet larger than the 64 KiB limit");
      return;
    }
    if (n < 0) {
      gshmd_conn_close(c, "receive failed");
      return;
    }
    if (nfds > (int)s->cfg->max_fds_per_connection) {
      gshmd_conn_fail(c, 0, 0, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
                      "unexpected file descriptors (closed)");
      return;
    }
    if (nfds && gshmd__fds_over_limits(s, &c->cred)) {
      gshmd_conn_fail(c, 0, 0, GSHM__STATUS__STATUS_LIMIT,
                      "too many of this user's file descriptors wait to be closed");
      return;
    }
    if ((size_t)n > (s->cfg->max_packet ? s->cfg->max_packet : GSHM_WIRE_MAX_PACKET)) {
      gshmd_conn_fail(c, 0, 0, GSHM__STATUS__STATUS_TOO_BIG, "packet larger than the limit");
      return;
    }
    c->last_ns = gshm__now_ns(CLOCK_MONOTONIC);
    gshmd_request_handle(c, s->rxbuf, (size_t)n);
    gshmd_histogram_observe(&s->duration, gshm__now_ns(CLOCK_MONOTONIC) - c->last_ns);
  }
}

void gshmd_conn_queued_grant(struct conn *c, uint64_t lease_id, bool created) {
  struct out_pkt *p;

  if (!c->noutq) /* sent at once */
    return;
  p = gshm_list_entry(c->outq.prev, struct out_pkt, node);
  if (p->fd >= 0 && !p->event) {
    p->lease_id = lease_id;
    p->created = created;
  }
}

/* Queued reply p carries an fd that cannot go now (a lease's grant, or
 * the metrics' memfd): a grant is taken back, and an -EMFILE refusal to
 * the same request takes p's place (gshmd_conn_queued_grant).  Returns 0, or -ENOMEM (the caller closes
 * the connection, which ends the lease anyway). */
static int conn_refuse_queued(struct conn *c, struct out_pkt *p) {
  struct gshmd_server *s = c->srv;
  Gshm__Reply refused = GSHM__REPLY__INIT;
  struct gshmd_lease *l = gshmd_registry_find_lease(s->reg, p->lease_id);
  struct gshm_wire_header hdr;
  struct out_pkt *n;
  size_t len;

  refused.status = gshm__errno_to_status(-EMFILE);
  refused.message = GSHMD_FD_REFUSED;
  if (gshm__wire_parse_header(p->data, p->len, &hdr) ||
      gshm__wire_pack(hdr.type, hdr.request_id, &refused.base, s->txbuf, sizeof(s->txbuf), &len) ||
      !(n = malloc(sizeof(*n) + len)))
    return -ENOMEM;
  gshm_log_warn("an fd could not be sent to client %" PRIu64 " (%s): refused; raise "
                "LimitNOFILE= (fds in flight count)", c->client->session_id, strerror(ETOOMANYREFS));
  /* Others may have opened a created segment since: they hear of its unlink. */
  if (p->created && l && l->client == c->client && !l->seg->unlinked && l->seg->nleases > 1)
    gshmd_notify_lease_holders(s, l->seg, GSHM__EVENT_KIND__EVENT_KIND_UNLINKED, c);
  if (p->lease_id)
    gshmd_registry_grant_undo(s->reg, c->client, p->lease_id, p->created);
  memcpy(n->data, s->txbuf, len);
  n->len = len;
  n->fd = -1;
  n->event = n->created = false;
  n->lease_id = 0;
  gshm_list_add_tail(&p->node, &n->node); /* (before p) */
  gshm_list_del(&p->node);
  close(p->fd);
  free(p);
  return 0;
}

static void conn_flush(struct conn *c) {
  while (c->noutq) {
    struct out_pkt *p = gshm_list_entry(c->outq.next, struct out_pkt, node);
    int r = gshm__wire_sendmsg(c->fd, p->data, p->len, p->fd);
    if (r == -EAGAIN)
      return;
    if (r == -ETOOMANYREFS && p->fd >= 0 && c->client && !conn_refuse_queued(c, p))
      continue; /* the refusal goes next */
    if (r) {
      gshmd_conn_close(c, NULL);
      return;
    }
    if (p->fd >= 0) {
      c->srv->fds_sent++;
      c->sent_fd = true;
      close(p->fd);
    }
    gshm_list_del(&p->node);
    c->nevents -= p->event;
    free(p);
    c->noutq--;
  }
  if (c->pidfd >= 0) { /* (its client reads again) */
    close(c->pidfd);
    c->pidfd = -1;
  }
  uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_on_io);
  conn_read(c); /* requests may be waiting behind the stalled replies */
}

static void conn_io(struct conn *c, int status, int events) {
  if (status < 0) {
    /* libuv reports POLLERR on a peer that died with unread replies as
     * UV_EBADF: it is a reset connection. */
    gshmd_conn_close(c, status == UV_EBADF ? "connection reset" : uv_strerror(status));
    return;
  }
  if ((events & UV_WRITABLE) && c->noutq)
    conn_flush(c);
  if (!c->closing && !c->noutq && (events & UV_READABLE))
    conn_read(c);
  else if (!c->closing && (events & UV_DISCONNECT) && !(events & UV_READABLE))
    gshmd_conn_close(c, NULL);
}

/* What a connection makes gshmd log is charged to its uid (loglimit.h). */
static void conn_on_io(uv_poll_t *h, int status, int events) {
  struct conn *c = h->data;
  struct gshmd_loglimit *ll = &c->srv->loglimit; /* (c may be closed on return) */

  gshmd_loglimit_charge(ll, &c->cred);
  conn_io(c, status, events);
  gshmd_loglimit_charge(ll, NULL);
}

static void on_accept(uv_poll_t *h, int status, int events) {
  struct gshmd_server *s = h->data;

  (void)events;
  if (status < 0) {
    gshm_log_err("listening socket: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < 64; i++) {
    struct conn *c;
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_pause(s, errno);
      else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        gshm_log_warn("accept: %m");
      return;
    }
    if (s->accept_logged) {
      gshm_log_notice("accepting connections again (%u open)", s->nconns);
      s->accept_logged = false;
    }
    /* (a refused socket is closed off the loop too: its queue may hold
     * fds sent before this accept, whose last close can linger) */
    if (!(c = calloc(1, sizeof(*c)))) {
      gshmd_closer_close(s, &fd, 1, (uid_t)-1);
      continue;
    }
    c->srv = s;
    c->fd = fd;
    c->pidfd = -1;
    gshm_list_init(&c->outq);
    c->accepted_ns = c->last_ns = gshm__now_ns(CLOCK_MONOTONIC);
    /* The uid's quota first, then the global limit less the admins'
     * reserve: one user can fill neither.  (A refusal's line is the uid's.) */
    if (gshmd__peer_credentials(s, fd, &c->cred) ||
        (gshmd_loglimit_charge(&s->loglimit, &c->cred), gshmd__over_uid_quota(s, &c->cred)) ||
        gshmd__over_global_limit(s, &c->cred) || uv_poll_init(s->loop, &c->poll, fd)) {
      gshmd_loglimit_charge(&s->loglimit, NULL);
      gshmd_closer_close(s, &fd, 1, c->cred.uid);
      free(c->cred.groups);
      free(c);
      continue;
    }
    gshmd_loglimit_charge(&s->loglimit, NULL);
    c->poll.data = c;
    gshm_list_add_tail(&s->conns, &c->node);
    s->nconns++;
    s->connections_total++;
    uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_on_io);
  }
}

/* Whether c's replies have waited over a second for a process that has
 * exited (the one that connected, SO_PEERCRED).  Its end can outlive it
 * where fds reach gshmd: sent in a packet gshmd does not read while the
 * replies wait, it lives in gshmd's own receive queue, and no hangup ever
 * comes (a connection of its uid held till gshmd restarts; the session 28
 * review).  A pidfd (readable once the process exits, zombie or not) is
 * kept while the replies wait; a pid gshmd cannot see (0: another pid
 * namespace) is never judged. */
static bool stalled_gone(struct conn *c, int64_t now) {
  struct pollfd pfd;

  if (!c->noutq || c->srv->fds_refused || c->cred.pid <= 0 ||
      now - c->stalled_ns < 1000000000LL)
    return false;
  if (c->pidfd < 0 && (c->pidfd = (int)syscall(SYS_pidfd_open, c->cred.pid, 0)) < 0)
    return errno == ESRCH; /* (gone already; else, no fd now: asked again next sweep) */
  pfd = (struct pollfd){.fd = c->pidfd, .events = POLLIN};
  return poll(&pfd, 1, 0) == 1;
}

/* Drops connections that never said hello (SEQPACKET has no partial
 * packets: a slow client is one that connects and says nothing), when
 * configured connections idle for too long, and those whose replies wait
 * for a client that has exited (stalled_gone).  One sweep a second over
 * the connection list instead of a timer per connection: 10,000 idle
 * connections cost no timers. */
static void on_sweep(uv_timer_t *t) {
  struct gshmd_server *s = t->data;
  int64_t now = gshm__now_ns(CLOCK_MONOTONIC);
  int64_t hello_ns = (int64_t)s->cfg->partial_timeout_ms * 1000000;
  int64_t idle_ns = (int64_t)s->cfg->idle_timeout_ms * 1000000;
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &s->conns) {
    struct conn *c = gshm_list_entry(pos, struct conn, node);
    if (c->closing)
      continue;
    gshmd_loglimit_charge(&s->loglimit, &c->cred);
    if (!c->client && hello_ns && now - c->accepted_ns > hello_ns) {
      s->timeouts++;
      gshmd_conn_close(c, "no hello in time");
    } else if (c->client && idle_ns && now - c->last_ns > idle_ns) {
      s->timeouts++;
      gshmd_conn_close(c, "idle timeout");
    } else if (stalled_gone(c, now)) {
      gshmd_conn_close(c, "its process exited with replies unread");
    }
  }
  gshmd_loglimit_charge(&s->loglimit, NULL);
}

int gshmd_server_start(struct gshmd_server *s, uv_loop_t *loop, const struct gshmd_config *cfg,
                       struct gshmd_registry *reg, int listen_fd) {
  int r, fl;

  s->loop = loop;
  s->cfg = cfg;
  s->reg = reg;
  s->listen_fd = listen_fd;
  s->started_ns = gshm__now_ns(CLOCK_REALTIME);
  s->poll_ns = (int64_t)cfg->poll_us * 1000; /* by default 0 on < 4 CPUs (config.c) */
  s->arena_allocator.alloc = arena_alloc;
  s->arena_allocator.free = arena_free;
  s->arena_allocator.allocator_data = s;
  reg->on_replaced = notify_replaced;
  reg->on_replaced_arg = s;
  gshm_list_init(&s->conns);
  gshmd_loglimit_start(&s->loglimit); /* (before any thread that logs) */
  if ((r = gshmd_closer_start(s, loop)))
    return r;
  /* One counter per status the protocol defines: the enum's values are
   * explicitly numbered and never renumbered, so the highest bounds them. */
  for (unsigned i = 0; i < gshm__status__descriptor.n_values; i++)
    if (gshm__status__descriptor.values[i].value >= (int)s->nstatus)
      s->nstatus = (unsigned)gshm__status__descriptor.values[i].value + 1;
  s->requests = calloc((size_t)(GSHM_WIRE_TYPE_MAX + 1) * s->nstatus, sizeof(*s->requests));
  if (!s->requests)
    return -ENOMEM;
  if (cfg->admin_group && *cfg->admin_group) {
    struct group *g = getgrnam(cfg->admin_group);
    if (!g) {
      gshm_log_err("admin group '%s' does not exist", cfg->admin_group);
      return -ENOENT;
    }
    s->have_admin_gid = true;
    s->admin_gid = g->gr_gid;
  }
  /* Where none is expected, the kernel refuses fds before they reach us. */
  if (!cfg->max_fds_per_connection)
    s->fds_refused = refuse_fds(listen_fd);
  gshm_log_debug("client fds: %s", s->fds_refused ? "refused by the kernel (SO_PASSRIGHTS)"
                                                  : "received, closed off the loop");
  fl = fcntl(listen_fd, F_GETFL);
  if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -errno;
  if (cfg->partial_timeout_ms || cfg->idle_timeout_ms || !s->fds_refused) {
    uint64_t period = 1000;
    uint32_t shortest = cfg->partial_timeout_ms && (!cfg->idle_timeout_ms ||
                                                     cfg->partial_timeout_ms < cfg->idle_timeout_ms)
                            ? cfg->partial_timeout_ms
                            : cfg->idle_timeout_ms;
    if (shortest && shortest / 4 < period) /* (0: only stalled_gone's, a second) */
      period = shortest / 4 ? shortest / 4 : 1;
    uv_timer_init(loop, &s->sweep_timer);
    s->sweep_timer.data = s;
    uv_timer_start(&s->sweep_timer, on_sweep, period, period);
    uv_unref((uv_handle_t *)&s->sweep_timer);
    s->sweeping = true;
  }
  uv_timer_init(loop, &s->accept_timer);
  s->accept_timer.data = s;
  uv_unref((uv_handle_t *)&s->accept_timer);
  s->accept_timer_on = true;
  if ((r = uv_poll_init(loop, &s->listen_poll, listen_fd)))
    return r;
  s->listen_poll.data = s;
  s->listening = true;
  return uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
}

void gshmd_server_stop(struct gshmd_server *s) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &s->conns)
      gshmd_conn_close(gshm_list_entry(pos, struct conn, node), NULL);
  if (s->listening) {
    s->listening = false;
    uv_close((uv_handle_t *)&s->listen_poll, NULL);
  }
  if (s->sweeping) {
    s->sweeping = false;
    uv_close((uv_handle_t *)&s->sweep_timer, NULL);
  }
  if (s->accept_timer_on) {
    s->accept_timer_on = false;
    uv_close((uv_handle_t *)&s->accept_timer, NULL);
  }
  gshmd_closer_stop(s); /* (closes still come: the connections' handles close) */
}

void gshmd_server_free(struct gshmd_server *s) {
  gshmd_closer_free(s);
  gshmd_loglimit_stop(&s->loglimit);
  free(s->requests);
  s->requests = NULL;
}
