#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "errors.h"
#include "util.h"

#ifndef GSHM_VERSION
#define GSHM_VERSION "0.0.0"
#endif

const double gshmd_duration_bounds[GSHMD_NBUCKETS] = {
    5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 25e-3, 100e-3, 1.0};

static void observe_duration(struct gshmd_server *s, int64_t ns) {
  double sec = (double)ns / 1e9;
  unsigned i = 0;
  while (i < GSHMD_NBUCKETS && sec > gshmd_duration_bounds[i])
    i++;
  s->duration_buckets[i]++;
  s->duration_count++;
  s->duration_sum += sec;
}

struct conn {
  struct gshmd_server *srv;
  uv_poll_t poll;
  int fd;
  struct gshmd_cred cred;
  struct gshmd_client *client; /* set by hello */
  bool closing;
  struct gshm_list node;
  /* Packets that did not fit in the socket buffer.  While any wait we
   * read nothing more from this client (backpressure): the queue holds at
   * most one reply plus the events sent meanwhile, capped at the config's
   * limits.max_inflight (then the client is dropped). */
  struct gshm_list outq;
  unsigned noutq;
  int64_t accepted_ns, last_ns; /* CLOCK_MONOTONIC: timeouts */
  uint64_t notify_mark;         /* notify_lease_holders: already a target */
};

struct out_pkt {
  struct gshm_list node;
  size_t len;
  int fd;
  uint8_t data[];
};

static void conn_on_io(uv_poll_t *h, int status, int events);

static void conn_on_closed(uv_handle_t *h) {
  struct conn *c = h->data;
  struct gshm_list *pos, *tmp;

  close(c->fd);
  gshm_list_foreach_safe(pos, tmp, &c->outq) {
    struct out_pkt *p = gshm_list_entry(pos, struct out_pkt, node);
    if (p->fd >= 0)
      close(p->fd);
    free(p);
  }
  free(c->cred.groups);
  free(c);
}

static void conn_close(struct conn *c, const char *why) {
  if (c->closing)
    return;
  c->closing = true;
  if (c->client) {
    gshm_log_info("client %" PRIu64 " '%s' pid %d uid %u disconnected%s%s", c->client->session_id,
                  c->client->name, (int)c->cred.pid, (unsigned)c->cred.uid, why ? ": " : "",
                  why ? why : "");
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

/* Sends a packet already in s->txbuf, or queues it behind earlier ones
 * when the client's socket buffer is full.  fd (>= 0) stays the caller's.
 * Returns 0, or -1 when the connection was closed. */
static int conn_send_packet(struct conn *c, size_t len, int fd) {
  struct gshmd_server *s = c->srv;
  struct out_pkt *p;
  int r = -EAGAIN;

  if (c->noutq == 0)
    r = gshm__wire_sendmsg(c->fd, s->txbuf, len, fd);
  if (r == -EAGAIN) {
    if (c->noutq >= s->cfg->max_inflight) {
      conn_close(c, "client does not read its replies");
      return -1;
    }
    if (!(p = malloc(sizeof(*p) + len))) {
      conn_close(c, "out of memory");
      return -1;
    }
    memcpy(p->data, s->txbuf, len);
    p->len = len;
    p->fd = -1;
    if (fd >= 0 && (p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
      free(p);
      conn_close(c, "cannot keep fd for a queued reply");
      return -1;
    }
    gshm_list_add_tail(&c->outq, &p->node);
    if (c->noutq++ == 0)
      uv_poll_start(&c->poll, UV_WRITABLE | UV_DISCONNECT, conn_on_io);
    return 0;
  }
  if (r) {
    conn_close(c, r == -EPIPE || r == -ECONNRESET ? NULL : "send failed");
    return -1;
  }
  if (fd >= 0)
    s->fds_sent++;
  return 0;
}

static int conn_send(struct conn *c, uint16_t type, uint32_t request_id, const Gshm__Reply *reply,
                     int fd) {
  size_t len;

  if (gshm__wire_pack(type | GSHM_WIRE_REPLY, request_id, &reply->base, c->srv->txbuf,
                      sizeof(c->srv->txbuf), &len)) {
    /* Cannot happen for bounded replies: lists are paginated to fit. */
    gshm_log_err("reply to type %u does not fit in one packet", type);
    conn_close(c, "reply too large");
    return -1;
  }
  return conn_send_packet(c, len, fd);
}

/* Tells every connection with a lease on seg, but `except` (the requester,
 * which learns it from its reply), that the segment's name went away.  A
 * send that fails closes that connection, so the requester must not be
 * among them: its client would be gone under the request. */
static void notify_lease_holders(struct gshmd_server *s, struct gshmd_segment *seg,
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
  /* Collect first: a send that fails closes its connection, which ends
   * that client's leases and so edits the list being walked. */
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
    conn_send_packet(targets[i], len, -1);
  }
  free(targets);
}

/* Answers a request that breaks the protocol, then drops the client. */
static void conn_fail(struct conn *c, uint16_t type, uint32_t request_id, Gshm__Status status,
                      const char *message) {
  Gshm__Reply reply = GSHM__REPLY__INIT;

  c->srv->protocol_errors++;
  reply.status = status;
  reply.message = (char *)message;
  if (conn_send(c, type, request_id, &reply, -1) == 0)
    conn_close(c, message);
}

static bool client_name_ok(const char *name) {
  for (const char *p = name; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return false;
  return true;
}

/* ---- request handlers: each fills *reply (and *fd_out) ---- */

struct req {
  struct conn *c;
  const struct gshm_wire_header *hdr;
  const uint8_t *body;
  size_t len;
  Gshm__Reply *reply;
  int fd_out;
  char msg[256];
  /* Storage that must outlive the handler until the reply is sent. */
  Gshm__LeaseGrant grant;
  Gshm__SegmentInfo info;
  Gshm__Welcome welcome;
  Gshm__StatusInfo status;
  void *free_after[4];
};

static int set_error(struct req *q, int err, const char *msg) {
  q->reply->status = gshm__errno_to_status(err);
  if (msg && *msg)
    q->reply->message = (char *)msg;
  else
    q->reply->message = (char *)gshm__strerror(err);
  if (err == -EDQUOT)
    q->c->srv->quota_denials++;
  else if (err == -EACCES || err == -EPERM)
    q->c->srv->access_denials++;
  return err;
}

static int handle_hello(struct req *q, Gshm__Hello *m) {
  struct conn *c = q->c;
  struct gshmd_server *s = c->srv;
  int e;

  if (m->major != GSHM_PROTO_MAJOR) {
    snprintf(q->msg, sizeof(q->msg),
             "protocol version mismatch: client speaks %u.%u, gshmd " GSHM_VERSION
             " speaks %u.%u",
             m->major, m->minor, GSHM_PROTO_MAJOR, GSHM_PROTO_MINOR);
    return set_error(q, -EPROTONOSUPPORT, q->msg);
  }
  if (strlen(m->client_name) > 63 || !client_name_ok(m->client_name))
    return set_error(q, -EINVAL, "client name: at most 63 printable bytes");
  if ((e = gshmd_registry_client_add(s->reg, &c->cred, &c->client)))
    return set_error(q, e, "out of memory");
  snprintf(c->client->name, sizeof(c->client->name), "%s", m->client_name);
  c->client->conn = c;
  gshm_log_info("client %" PRIu64 " '%s' connected: pid %d uid %u gid %u%s", c->client->session_id,
                c->client->name, (int)c->cred.pid, (unsigned)c->cred.uid, (unsigned)c->cred.gid,
                c->cred.admin ? " (admin)" : "");
  q->welcome.server_version = GSHM_VERSION;
  q->welcome.session_id = c->client->session_id;
  q->welcome.capabilities = 1u | (s->reg->cuda ? 2u : 0u);
  q->welcome.major = GSHM_PROTO_MAJOR;
  q->welcome.minor = GSHM_PROTO_MINOR;
  q->welcome.max_packet = s->cfg->max_packet;
  q->reply->body_case = GSHM__REPLY__BODY_WELCOME;
  q->reply->welcome = &q->welcome;
  return 0;
}

static int grant_lease(struct req *q, struct gshmd_lease *l, bool legacy) {
  struct gshmd_alloc *mem = l->seg->mem;
  static uint8_t handle[64];
  int e;

  if (legacy) {
    if (!mem->backend->ops->export_legacy_ipc)
      return set_error(q, -ENOTSUP, "this backend has no legacy IPC export");
    if ((e = mem->backend->ops->export_legacy_ipc(mem->backend, mem, handle)))
      return set_error(q, e, "legacy IPC export failed");
    q->grant.legacy_ipc_handle.data = handle;
    q->grant.legacy_ipc_handle.len = sizeof(handle);
  } else {
    e = mem->backend->ops->export_fd(mem->backend, mem,
                                     l->access == GSHM__ACCESS__ACCESS_READ_WRITE, &q->fd_out);
    if (e)
      return set_error(q, e, "cannot export the segment's fd");
  }
  gshmd_segment_to_info(l->seg, &q->info);
  q->grant.segment = &q->info;
  q->grant.lease_id = l->id;
  q->grant.access = l->access;
  q->reply->body_case = GSHM__REPLY__BODY_GRANT;
  q->reply->grant = &q->grant;
  return 0;
}

static int handle_create(struct req *q, Gshm__CreateRequest *m) {
  struct gshmd_lease *l;
  const char *msg = NULL;
  int e = gshmd_registry_create(q->c->srv->reg, q->c->client, m, &l, &msg);

  if (e)
    return set_error(q, e, msg);
  /* A legacy-IPC segment has no fd (cuMemAlloc memory): its creator gets
   * the handle instead. */
  if ((e = grant_lease(q, l, (m->flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC) != 0))) {
    /* Undo: the creator could not get its fd, so nothing was created. */
    char *name = strdup(l->seg->name);
    gshmd_registry_close(q->c->srv->reg, q->c->client, l->id);
    if (name)
      gshmd_registry_unlink(q->c->srv->reg, q->c->client, name, &msg);
    free(name);
  }
  return e;
}

static int handle_open(struct req *q, Gshm__OpenRequest *m) {
  struct gshmd_lease *l;
  const char *msg = NULL;
  int e = gshmd_registry_open(q->c->srv->reg, q->c->client, m, &l, &msg);

  if (e)
    return set_error(q, e, msg);
  if ((e = grant_lease(q, l, m->legacy_ipc)))
    gshmd_registry_close(q->c->srv->reg, q->c->client, l->id);
  return e;
}

static int handle_close(struct req *q, Gshm__CloseRequest *m) {
  int e = gshmd_registry_close(q->c->srv->reg, q->c->client, m->lease_id);
  return e ? set_error(q, e, "no such lease on this connection") : 0;
}

static int handle_unlink(struct req *q, Gshm__UnlinkRequest *m) {
  struct gshmd_registry *r = q->c->srv->reg;
  struct gshmd_segment *seg = gshmd_registry_find_name(r, m->name);
  const char *msg = NULL;
  int e;

  /* Tell the holders first, while the segment surely still exists; the
   * events go out before this reply, so whoever learns of the unlink from
   * the unlinker finds the event already in its socket. */
  if (seg && (q->c->client->cred.admin || q->c->client->cred.uid == seg->uid))
    notify_lease_holders(q->c->srv, seg, GSHM__EVENT_KIND__EVENT_KIND_UNLINKED, q->c);
  e = gshmd_registry_unlink(r, q->c->client, m->name, &msg);
  return e ? set_error(q, e, msg) : 0;
}

static int reply_segment(struct req *q, const char *name) {
  struct gshmd_segment *seg = gshmd_registry_find_name(q->c->srv->reg, name);
  if (seg) {
    gshmd_segment_to_info(seg, &q->info);
    q->reply->body_case = GSHM__REPLY__BODY_SEGMENT;
    q->reply->segment = &q->info;
  }
  return 0;
}

static int handle_chmod(struct req *q, Gshm__ChmodRequest *m) {
  const char *msg = NULL;
  int e = gshmd_registry_chmod(q->c->srv->reg, q->c->client, m->name, m->mode, &msg);
  return e ? set_error(q, e, msg) : reply_segment(q, m->name);
}

static int handle_chown(struct req *q, Gshm__ChownRequest *m) {
  const char *msg = NULL;
  int e = gshmd_registry_chown(q->c->srv->reg, q->c->client, m->name, m->uid, m->gid, &msg);
  return e ? set_error(q, e, msg) : reply_segment(q, m->name);
}

static int handle_revoke(struct req *q, Gshm__RevokeRequest *m) {
  struct gshmd_registry *r = q->c->srv->reg;
  struct gshmd_segment *seg = gshmd_registry_find_name(r, m->name);
  const char *msg = NULL;
  int e;

  if (seg && q->c->client->cred.admin)
    notify_lease_holders(q->c->srv, seg, GSHM__EVENT_KIND__EVENT_KIND_REVOKED, q->c);
  e = gshmd_registry_revoke(r, q->c->client, m->name, &msg);
  return e ? set_error(q, e, msg) : 0;
}

static int handle_stat(struct req *q, Gshm__StatRequest *m) {
  struct gshmd_registry *r = q->c->srv->reg;
  struct gshmd_segment *seg;

  seg = m->segment_id ? gshmd_registry_find_id(r, m->segment_id)
                      : gshmd_registry_find_name(r, m->name);
  if (!seg) {
    if (m->segment_id)
      return set_error(q, -ESTALE, "segment is gone");
    snprintf(q->msg, sizeof(q->msg), "no segment named '%.200s'", m->name);
    return set_error(q, -ENOENT, q->msg);
  }
  if (!gshmd_registry_may_see(q->c->client, seg))
    return set_error(q, -EACCES, "permission denied");
  gshmd_segment_to_info(seg, &q->info);
  q->reply->body_case = GSHM__REPLY__BODY_SEGMENT;
  q->reply->segment = &q->info;
  return 0;
}

/* Room left in one reply packet for list items: the header, the Reply's
 * own fields and the cursor take well under 64 bytes. */
static size_t list_budget(const struct gshmd_server *s) {
  size_t max = s->cfg->max_packet ? s->cfg->max_packet : GSHM_WIRE_MAX_PACKET;
  if (max > GSHM_WIRE_MAX_PACKET)
    max = GSHM_WIRE_MAX_PACKET;
  return max - GSHM_WIRE_HEADER_SIZE - 64;
}

/* Bytes that one embedded message of packed size n adds: tag, length, body. */
static size_t embedded_size(size_t n) {
  size_t v = 1;
  for (size_t k = n; k >= 128; k >>= 7)
    v++;
  return 1 + v + n;
}

/* First list node with id > after, walking from the id tree when possible. */
static struct gshm_list *segments_after(struct gshmd_registry *r, uint64_t after) {
  struct gshm_list *pos;
  struct gshmd_segment *seg;

  if (after == 0)
    return r->segments.next;
  if ((seg = gshmd_registry_find_id(r, after)))
    return seg->node.next;
  gshm_list_foreach(pos, &r->segments) {
    if (gshm_list_entry(pos, struct gshmd_segment, node)->id > after)
      return pos;
  }
  return &r->segments;
}

static unsigned list_limit(const Gshm__ListRequest *m) {
  return m->limit == 0 || m->limit > 4096 ? 4096 : m->limit;
}

static int handle_list_segments(struct req *q, Gshm__ListRequest *m) {
  static Gshm__SegmentList list;
  static Gshm__SegmentInfo infos[4096];
  static Gshm__SegmentInfo *ptrs[4096];
  struct gshmd_registry *r = q->c->srv->reg;
  size_t budget = list_budget(q->c->srv), used = 0;
  unsigned limit = list_limit(m), n = 0;
  struct gshm_list *pos;

  gshm__segment_list__init(&list);
  for (pos = segments_after(r, m->after); pos != &r->segments; pos = pos->next) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    size_t sz;
    if (!gshmd_registry_may_see(q->c->client, seg))
      continue;
    if (n == limit) {
      list.next = infos[n - 1].id;
      break;
    }
    gshmd_segment_to_info(seg, &infos[n]);
    sz = embedded_size(gshm__segment_info__get_packed_size(&infos[n]));
    if (used + sz > budget) {
      list.next = n ? infos[n - 1].id : 0;
      break;
    }
    used += sz;
    ptrs[n] = &infos[n];
    n++;
  }
  list.n_segments = n;
  list.segments = ptrs;
  q->reply->body_case = GSHM__REPLY__BODY_SEGMENTS;
  q->reply->segments = &list;
  return 0;
}

static bool may_see_client(const struct gshmd_client *viewer, const struct gshmd_client *c) {
  return viewer->cred.admin || viewer->cred.uid == c->cred.uid;
}

static int handle_list_leases(struct req *q, Gshm__ListRequest *m) {
  static Gshm__LeaseList list;
  static Gshm__LeaseInfo infos[4096];
  static Gshm__LeaseInfo *ptrs[4096];
  static char *devs[4096][8];
  static char devbuf[4096][8][48];
  struct gshmd_registry *r = q->c->srv->reg;
  size_t budget = list_budget(q->c->srv), used = 0;
  unsigned limit = list_limit(m), n = 0;
  struct gshm_list *pos;

  gshm__lease_list__init(&list);
  gshm_list_foreach(pos, &r->leases) {
    struct gshmd_lease *l = gshm_list_entry(pos, struct gshmd_lease, node);
    Gshm__LeaseInfo *li = &infos[n];
    size_t sz;
    if (l->id <= m->after || !may_see_client(q->c->client, l->client))
      continue;
    if (n == limit) {
      list.next = infos[n - 1].lease_id;
      break;
    }
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
    li->mapped_devices = devs[n];
    if (l->mapped_devices) {
      const char *p = l->mapped_devices;
      while (*p && li->n_mapped_devices < 8) {
        size_t k = strcspn(p, ",");
        snprintf(devbuf[n][li->n_mapped_devices], 48, "%.*s", (int)k, p);
        devs[n][li->n_mapped_devices] = devbuf[n][li->n_mapped_devices];
        li->n_mapped_devices++;
        p += k + (p[k] == ',');
      }
    }
    sz = embedded_size(gshm__lease_info__get_packed_size(li));
    if (used + sz > budget) {
      list.next = n ? infos[n - 1].lease_id : 0;
      break;
    }
    used += sz;
    ptrs[n++] = li;
  }
  list.n_leases = n;
  list.leases = ptrs;
  q->reply->body_case = GSHM__REPLY__BODY_LEASES;
  q->reply->leases = &list;
  return 0;
}

static int handle_list_clients(struct req *q, Gshm__ListRequest *m) {
  static Gshm__ClientList list;
  static Gshm__ClientInfo infos[4096];
  static Gshm__ClientInfo *ptrs[4096];
  struct gshmd_registry *r = q->c->srv->reg;
  size_t budget = list_budget(q->c->srv), used = 0;
  unsigned limit = list_limit(m), n = 0;
  struct gshm_list *pos;

  gshm__client_list__init(&list);
  gshm_list_foreach(pos, &r->clients) {
    struct gshmd_client *cl = gshm_list_entry(pos, struct gshmd_client, node);
    Gshm__ClientInfo *ci = &infos[n];
    size_t sz;
    if (cl->session_id <= m->after || !may_see_client(q->c->client, cl))
      continue;
    if (n == limit) {
      list.next = infos[n - 1].session_id;
      break;
    }
    gshm__client_info__init(ci);
    ci->session_id = cl->session_id;
    ci->pid = cl->cred.pid;
    ci->uid = cl->cred.uid;
    ci->gid = cl->cred.gid;
    ci->name = cl->name;
    ci->since_ns = cl->since_ns;
    ci->leases = cl->nleases;
    sz = embedded_size(gshm__client_info__get_packed_size(ci));
    if (used + sz > budget) {
      list.next = n ? infos[n - 1].session_id : 0;
      break;
    }
    used += sz;
    ptrs[n++] = ci;
  }
  list.n_clients = n;
  list.clients = ptrs;
  q->reply->body_case = GSHM__REPLY__BODY_CLIENTS;
  q->reply->clients = &list;
  return 0;
}

static int handle_status(struct req *q) {
  struct gshmd_server *s = q->c->srv;
  struct gshmd_registry *r = s->reg;
  static char *backends[2];

  q->status.version = GSHM_VERSION;
  q->status.started_ns = s->started_ns;
  q->status.clients = r->nclients;
  q->status.segments = r->nsegments;
  q->status.bytes = r->bytes;
  q->status.leases = r->nleases;
  q->status.pid = getpid();
  q->status.n_backends = 0;
  q->status.backends = backends;
  backends[q->status.n_backends++] = "host";
  if (r->cuda) {
    backends[q->status.n_backends++] = "cuda";
    q->status.devices = r->cuda->ndevices;
  }
  q->reply->body_case = GSHM__REPLY__BODY_STATUS_INFO;
  q->reply->status_info = &q->status;
  return 0;
}

static int handle_devices(struct req *q) {
  static Gshm__DeviceList list;
  struct gshmd_registry *r = q->c->srv->reg;

  gshm__device_list__init(&list);
  if (r->cuda && r->cuda->ops->devices) {
    int e = r->cuda->ops->devices(r->cuda, &list);
    if (e)
      return set_error(q, e, "cannot read device information");
  }
  q->reply->body_case = GSHM__REPLY__BODY_DEVICES;
  q->reply->devices = &list;
  return 0;
}

static int handle_map_report(struct req *q, Gshm__MapReport *m) {
  struct gshmd_lease *l = gshmd_registry_find_lease(q->c->srv->reg, m->lease_id);
  size_t total = 1;
  char *devs;

  if (!l || l->client != q->c->client)
    return set_error(q, -ENOENT, "no such lease on this connection");
  if (m->n_device_uuids > 16)
    return set_error(q, -EINVAL, "at most 16 devices per mapping report");
  for (size_t i = 0; i < m->n_device_uuids; i++) {
    if (strlen(m->device_uuids[i]) > 47 || !client_name_ok(m->device_uuids[i]) ||
        strchr(m->device_uuids[i], ','))
      return set_error(q, -EINVAL, "bad device uuid");
    total += strlen(m->device_uuids[i]) + 1;
  }
  if (!(devs = malloc(total)))
    return -ENOMEM;
  devs[0] = '\0';
  for (size_t i = 0; i < m->n_device_uuids; i++) {
    if (i)
      strcat(devs, ",");
    strcat(devs, m->device_uuids[i]);
  }
  free(l->mapped_devices);
  l->mapped_devices = devs;
  l->mapped = !m->unmapped;
  return 0;
}


static int handle_metrics(struct req *q) {
  char *text = NULL;
  int e = gshmd_metrics_render(q->c->srv, &text);

  if (e)
    return set_error(q, e, "cannot render metrics");
  q->free_after[0] = text;
  q->reply->body_case = GSHM__REPLY__BODY_TEXT;
  q->reply->text = text;
  return 0;
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

/* Unpacks the body as message type T and calls handler H; a body that does
 * not decode is a protocol error. */
#define DISPATCH(T, lower, H)                                                         \
  do {                                                                                \
    T *msg_ = gshm__##lower##__unpack(&s->arena_allocator, q.len, q.body);            \
    if (!msg_) {                                                                      \
      conn_fail(c, hdr.type, hdr.request_id, GSHM__STATUS__STATUS_PROTOCOL_ERROR,     \
                "message does not decode as " #T);                                    \
      return;                                                                         \
    }                                                                                 \
    err = H(&q, msg_);                                                                \
    gshm__##lower##__free_unpacked(msg_, &s->arena_allocator);                        \
  } while (0)

static void conn_handle_packet(struct conn *c, const uint8_t *pkt, size_t len) {
  struct gshmd_server *s = c->srv;
  Gshm__Reply reply = GSHM__REPLY__INIT;
  struct gshm_wire_header hdr;
  struct req q;
  int err = 0;

  if (gshm__wire_parse_header(pkt, len, &hdr)) {
    conn_fail(c, 0, 0, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
              len < GSHM_WIRE_HEADER_SIZE ? "packet shorter than the 16-byte header"
                                          : "bad packet header (magic or length)");
    return;
  }
  if (hdr.major != GSHM_PROTO_MAJOR) {
    char m[160];
    snprintf(m, sizeof(m),
             "protocol version mismatch: client speaks %u.%u, gshmd " GSHM_VERSION " speaks %u.%u",
             hdr.major, hdr.minor, GSHM_PROTO_MAJOR, GSHM_PROTO_MINOR);
    conn_fail(c, hdr.type, hdr.request_id, GSHM__STATUS__STATUS_VERSION_MISMATCH, m);
    return;
  }
  if (hdr.type == 0 || hdr.type > GSHM_WIRE_TYPE_MAX) {
    conn_fail(c, hdr.type, hdr.request_id, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
              "unknown message type");
    return;
  }
  if (!c->client && hdr.type != GSHM_WIRE_HELLO) {
    conn_fail(c, hdr.type, hdr.request_id, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
              "hello must come first");
    return;
  }
  if (c->client && hdr.type == GSHM_WIRE_HELLO) {
    conn_fail(c, hdr.type, hdr.request_id, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
              "hello was already said");
    return;
  }

  s->arena_used = 0;
  memset(&q, 0, sizeof(q));
  q.c = c;
  q.hdr = &hdr;
  q.body = pkt + GSHM_WIRE_HEADER_SIZE;
  q.len = hdr.length;
  q.reply = &reply;
  q.fd_out = -1;
  gshm__lease_grant__init(&q.grant);
  gshm__welcome__init(&q.welcome);
  gshm__status_info__init(&q.status);

  switch (hdr.type) {
  case GSHM_WIRE_HELLO:
    DISPATCH(Gshm__Hello, hello, handle_hello);
    break;
  case GSHM_WIRE_CREATE:
    DISPATCH(Gshm__CreateRequest, create_request, handle_create);
    break;
  case GSHM_WIRE_OPEN:
    DISPATCH(Gshm__OpenRequest, open_request, handle_open);
    break;
  case GSHM_WIRE_CLOSE:
    DISPATCH(Gshm__CloseRequest, close_request, handle_close);
    break;
  case GSHM_WIRE_UNLINK:
    DISPATCH(Gshm__UnlinkRequest, unlink_request, handle_unlink);
    break;
  case GSHM_WIRE_STAT:
    DISPATCH(Gshm__StatRequest, stat_request, handle_stat);
    break;
  case GSHM_WIRE_LIST_SEGMENTS:
    DISPATCH(Gshm__ListRequest, list_request, handle_list_segments);
    break;
  case GSHM_WIRE_LIST_LEASES:
    DISPATCH(Gshm__ListRequest, list_request, handle_list_leases);
    break;
  case GSHM_WIRE_LIST_CLIENTS:
    DISPATCH(Gshm__ListRequest, list_request, handle_list_clients);
    break;
  case GSHM_WIRE_MAP_REPORT:
    DISPATCH(Gshm__MapReport, map_report, handle_map_report);
    break;
  case GSHM_WIRE_CHMOD:
    DISPATCH(Gshm__ChmodRequest, chmod_request, handle_chmod);
    break;
  case GSHM_WIRE_CHOWN:
    DISPATCH(Gshm__ChownRequest, chown_request, handle_chown);
    break;
  case GSHM_WIRE_REVOKE:
    DISPATCH(Gshm__RevokeRequest, revoke_request, handle_revoke);
    break;
  case GSHM_WIRE_STATUS:
    err = handle_status(&q);
    break;
  case GSHM_WIRE_DEVICES:
    err = handle_devices(&q);
    break;
  case GSHM_WIRE_METRICS:
    err = handle_metrics(&q);
    break;
  }
  if (c->closing) /* DISPATCH failed */
    return;
  if (!err)
    reply.status = GSHM__STATUS__STATUS_OK;
  else if (reply.status == GSHM__STATUS__STATUS_UNSPECIFIED)
    set_error(&q, err, NULL);
  if ((unsigned)reply.status < GSHMD_NSTATUS)
    s->requests[hdr.type][reply.status]++;

  /* A mapping report with request id 0 wants no reply (libgshm sends it
   * without waiting, to keep a round trip off every first map). */
  if (!(hdr.type == GSHM_WIRE_MAP_REPORT && hdr.request_id == 0))
    conn_send(c, hdr.type, hdr.request_id, &reply, q.fd_out);
  /* q.fd_out is lent by the backend: not ours to close. */
  for (size_t i = 0; i < sizeof(q.free_after) / sizeof(q.free_after[0]); i++)
    free(q.free_after[i]);
  if (hdr.type == GSHM_WIRE_HELLO && err && !c->closing)
    conn_close(c, reply.message); /* a refused hello ends the connection */
}

static void conn_read(struct conn *c) {
  struct gshmd_server *s = c->srv;
  int fds[GSHM_WIRE_MAX_FDS];
  /* Bounded per wake-up so that one busy client cannot starve others. */
  for (int i = 0; i < 32 && !c->closing && !c->noutq; i++) {
    int nfds = 0;
    ssize_t n = gshm__wire_recv(c->fd, s->rxbuf, sizeof(s->rxbuf), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);
    for (int k = 0; k < nfds; k++)
      close(fds[k]); /* clients never send fds to gshmd */
    if (n == -EAGAIN)
      return;
    if (n == 0) {
      conn_close(c, NULL);
      return;
    }
    if (n == -EMSGSIZE) {
      conn_fail(c, 0, 0, GSHM__STATUS__STATUS_TOO_BIG,
                nfds ? "too many file descriptors in one packet"
                     : "packet larger than the 64 KiB limit");
      return;
    }
    if (n < 0) {
      conn_close(c, "receive failed");
      return;
    }
    if (nfds > (int)s->cfg->max_fds_per_connection) {
      conn_fail(c, 0, 0, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
                "unexpected file descriptors (closed)");
      return;
    }
    if ((size_t)n > (s->cfg->max_packet ? s->cfg->max_packet : GSHM_WIRE_MAX_PACKET)) {
      conn_fail(c, 0, 0, GSHM__STATUS__STATUS_TOO_BIG, "packet larger than the limit");
      return;
    }
    c->last_ns = gshm__now_ns(CLOCK_MONOTONIC);
    conn_handle_packet(c, s->rxbuf, (size_t)n);
    observe_duration(s, gshm__now_ns(CLOCK_MONOTONIC) - c->last_ns);
  }
}

static void conn_flush(struct conn *c) {
  while (c->noutq) {
    struct out_pkt *p = gshm_list_entry(c->outq.next, struct out_pkt, node);
    int r = gshm__wire_sendmsg(c->fd, p->data, p->len, p->fd);
    if (r == -EAGAIN)
      return;
    if (r) {
      conn_close(c, NULL);
      return;
    }
    if (p->fd >= 0) {
      c->srv->fds_sent++;
      close(p->fd);
    }
    gshm_list_del(&p->node);
    free(p);
    c->noutq--;
  }
  uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_on_io);
  conn_read(c); /* requests may be waiting behind the stalled replies */
}

static void conn_on_io(uv_poll_t *h, int status, int events) {
  struct conn *c = h->data;

  if (status < 0) {
    /* libuv reports POLLERR on a peer that died with unread replies as
     * UV_EBADF: it is a reset connection. */
    conn_close(c, status == UV_EBADF ? "connection reset" : uv_strerror(status));
    return;
  }
  if ((events & UV_WRITABLE) && c->noutq)
    conn_flush(c);
  if (!c->closing && !c->noutq && (events & UV_READABLE))
    conn_read(c);
  else if (!c->closing && (events & UV_DISCONNECT) && !(events & UV_READABLE))
    conn_close(c, NULL);
}

/* The peer's credentials and every supplementary group (SO_PEERGROUPS
 * says how many when they do not fit: up to NGROUPS_MAX, 65536).  On
 * failure to read the groups, the peer has none: it can lose access
 * through group bits, never gain any.  Returns -ENOMEM or 0. */
static int peer_credentials(struct gshmd_server *s, int fd, struct gshmd_cred *cred) {
  struct ucred uc;
  socklen_t len = sizeof(uc);
  gid_t small[64], *heap = NULL;
  const gid_t *got = NULL;

  memset(cred, 0, sizeof(*cred));
  cred->uid = (uid_t)-1;
  cred->gid = (gid_t)-1;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) == 0) {
    cred->pid = uc.pid;
    cred->uid = uc.uid;
    cred->gid = uc.gid;
  }
  len = sizeof(small);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, small, &len) == 0) {
    got = small;
  } else if (errno == ERANGE && len > sizeof(small)) { /* len: the size needed */
    if (!(heap = malloc(len)))
      return -ENOMEM;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, heap, &len) == 0)
      got = heap;
  }
  if (got && len >= sizeof(gid_t)) {
    if (!heap) {
      if (!(heap = malloc(len)))
        return -ENOMEM;
      memcpy(heap, small, len);
    }
    cred->groups = heap;
    cred->ngroups = (int)(len / sizeof(gid_t));
  } else {
    free(heap);
  }
  cred->admin = cred->uid == 0;
  if (!cred->admin && s->have_admin_gid) {
    cred->admin = cred->gid == s->admin_gid;
    for (int i = 0; i < cred->ngroups && !cred->admin; i++)
      cred->admin = cred->groups[i] == s->admin_gid;
  }
  return 0;
}

/* quota.connections counted at accept, before hello, over every
 * connection of the uid: checked only at hello, a user could hold all of
 * limits.max_connections with connections that never say hello (each
 * dropped after limits.partial_timeout_ms, and opened again) and lock
 * every other user out.  One pass over the connections per accept. */
static bool over_uid_quota(struct gshmd_server *s, const struct gshmd_cred *cred) {
  uint32_t n = 0;
  struct gshm_list *pos;

  if (!s->cfg->quota_connections || cred->uid == 0)
    return false;
  gshm_list_foreach(pos, &s->conns) {
    const struct conn *c = gshm_list_entry(pos, struct conn, node);
    n += !c->closing && c->cred.uid == cred->uid;
  }
  if (n < s->cfg->quota_connections)
    return false;
  gshm_log_warn("connection refused: uid %u has %u connections, limit %u", (unsigned)cred->uid,
                n, s->cfg->quota_connections);
  return true;
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
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        gshm_log_warn("accept: %m");
      return;
    }
    if (s->cfg->max_connections && s->nconns >= s->cfg->max_connections) {
      gshm_log_warn("connection refused: %u connections, the limit", s->nconns);
      close(fd);
      continue;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
      close(fd);
      continue;
    }
    c->srv = s;
    c->fd = fd;
    gshm_list_init(&c->outq);
    c->accepted_ns = c->last_ns = gshm__now_ns(CLOCK_MONOTONIC);
    if (peer_credentials(s, fd, &c->cred) || over_uid_quota(s, &c->cred) ||
        uv_poll_init(s->loop, &c->poll, fd)) {
      close(fd);
      free(c->cred.groups);
      free(c);
      continue;
    }
    c->poll.data = c;
    gshm_list_add_tail(&s->conns, &c->node);
    s->nconns++;
    s->connections_total++;
    uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_on_io);
  }
}

/* Drops connections that never said hello (SEQPACKET has no partial
 * packets: a slow client is one that connects and says nothing) and, when
 * configured, connections idle for too long.  One sweep a second over the
 * connection list instead of a timer per connection: 10,000 idle
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
    if (!c->client && hello_ns && now - c->accepted_ns > hello_ns) {
      s->timeouts++;
      conn_close(c, "no hello in time");
    } else if (c->client && idle_ns && now - c->last_ns > idle_ns) {
      s->timeouts++;
      conn_close(c, "idle timeout");
    }
  }
}

int gshmd_server_start(struct gshmd_server *s, uv_loop_t *loop, const struct gshmd_config *cfg,
                       struct gshmd_registry *reg, int listen_fd) {
  int r, fl;

  s->loop = loop;
  s->cfg = cfg;
  s->reg = reg;
  s->listen_fd = listen_fd;
  s->started_ns = gshm__now_ns(CLOCK_REALTIME);
  s->arena_allocator.alloc = arena_alloc;
  s->arena_allocator.free = arena_free;
  s->arena_allocator.allocator_data = s;
  gshm_list_init(&s->conns);
  if (cfg->admin_group && *cfg->admin_group) {
    struct group *g = getgrnam(cfg->admin_group);
    if (!g) {
      gshm_log_err("admin group '%s' does not exist", cfg->admin_group);
      return -ENOENT;
    }
    s->have_admin_gid = true;
    s->admin_gid = g->gr_gid;
  }
  fl = fcntl(listen_fd, F_GETFL);
  if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -errno;
  if (cfg->partial_timeout_ms || cfg->idle_timeout_ms) {
    uint64_t period = 1000;
    uint32_t shortest = cfg->partial_timeout_ms && (!cfg->idle_timeout_ms ||
                                                     cfg->partial_timeout_ms < cfg->idle_timeout_ms)
                            ? cfg->partial_timeout_ms
                            : cfg->idle_timeout_ms;
    if (shortest / 4 < period)
      period = shortest / 4 ? shortest / 4 : 1;
    uv_timer_init(loop, &s->sweep_timer);
    s->sweep_timer.data = s;
    uv_timer_start(&s->sweep_timer, on_sweep, period, period);
    uv_unref((uv_handle_t *)&s->sweep_timer);
    s->sweeping = true;
  }
  if ((r = uv_poll_init(loop, &s->listen_poll, listen_fd)))
    return r;
  s->listen_poll.data = s;
  s->listening = true;
  return uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
}

void gshmd_server_stop(struct gshmd_server *s) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &s->conns)
      conn_close(gshm_list_entry(pos, struct conn, node), NULL);
  if (s->listening) {
    s->listening = false;
    uv_close((uv_handle_t *)&s->listen_poll, NULL);
  }
  if (s->sweeping) {
    s->sweeping = false;
    uv_close((uv_handle_t *)&s->sweep_timer, NULL);
  }
}
