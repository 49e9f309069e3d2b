/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's request handlers: one per message type, each filling the reply
 * (and the fd to send with it) from the registry and the backends, and
 * the dispatcher that decodes a packet and sends the answer.  The socket
 * side (reading, sending, queueing, accept) is server.c's. */
#include "requests.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <unistd.h>

#include "cluster.h"
#include "config.h"
#include "errors.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "requests_internal.h"
#include "server.h"
#include "util.h"

#ifndef GSHM_VERSION
#error "GSHM_VERSION comes from project() in CMakeLists.txt"
#endif

/* ---- request handlers: each fills *reply (and *fd_out) ---- */


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

/* The message for a client whose protocol major (in a Hello or a packet
 * header) is not gshmd's, written into buf; returns buf. */
static const char *version_mismatch(char *buf, size_t size, unsigned major, unsigned minor) {
  snprintf(buf, size,
           "protocol version mismatch: client speaks %u.%u, gshmd " GSHM_VERSION " speaks %u.%u",
           major, minor, GSHM_PROTO_MAJOR, GSHM_PROTO_MINOR);
  return buf;
}

static int handle_hello(struct req *q, Gshm__Hello *m) {
  struct conn *c = q->c;
  struct gshmd_server *s = c->srv;
  int e;

  if (m->major != GSHM_PROTO_MAJOR)
    return set_error(q, -EPROTONOSUPPORT,
                     version_mismatch(q->msg, sizeof(q->msg), m->major, m->minor));
  if (strlen(m->client_name) > 63 || !gshm__printable(m->client_name))
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
  q->welcome.capabilities = 1u | (s->reg->cuda ? 2u : 0u) | GSHM_WIRE_CAP_PUBLISH;
  q->welcome.major = GSHM_PROTO_MAJOR;
  q->welcome.minor = GSHM_PROTO_MINOR;
  q->welcome.max_packet = s->cfg->max_packet;
  q->reply->body_case = GSHM__REPLY__BODY_WELCOME;
  q->reply->welcome = &q->welcome;
  return 0;
}

/* The grant of lease l in q's reply (its fd, if any, set by the caller). */
static int grant_fill(struct req *q, struct gshmd_lease *l) {
  gshmd_segment_to_info(l->seg, &q->info);
  q->grant.segment = &q->info;
  q->grant.lease_id = l->id;
  q->grant.access = l->access;
  if (l->has_token) { /* the lease outlives the reply: l->token stays valid */
    q->grant.lease_token.data = l->token;
    q->grant.lease_token.len = sizeof(l->token);
  }
  q->reply->body_case = GSHM__REPLY__BODY_GRANT;
  q->reply->grant = &q->grant;
  return 0;
}

static int grant_lease(struct req *q, struct gshmd_lease *l, bool legacy) {
  struct gshmd_alloc *mem = l->seg->mem;
  int e;

  if (legacy) {
    if (!mem->backend->ops->export_legacy_ipc)
      return set_error(q, -ENOTSUP, "this backend has no legacy IPC export");
    if ((e = mem->backend->ops->export_legacy_ipc(mem->backend, mem, q->legacy_handle)))
      return set_error(q, e, "legacy IPC export failed");
    q->grant.legacy_ipc_handle.data = q->legacy_handle;
    q->grant.legacy_ipc_handle.len = sizeof(q->legacy_handle);
  } else {
    e = mem->backend->ops->export_fd(mem->backend, mem,
                                     l->access == GSHM__ACCESS__ACCESS_READ_WRITE, &q->fd_out);
    if (e && mem->backend == gshmd_backend_parked()) /* (-ENODEV) */
      return set_error(q, e, gshmd_backend_parked_why(*q->c->srv->reg->gpu_fault &&
                                                      !q->c->srv->reg->gpu_no_driver));
    if (e)
      return set_error(q, e, "cannot export the segment's fd");
  }
  gshmd_alloc_note_reach(mem, (uint32_t)l->client->cred.uid);
  return grant_fill(q, l);
}

/* Takes back q->granted: the lease ends, a create's segment with it. */
static void grant_undo(struct req *q) {
  gshmd_registry_grant_undo(q->c->srv->reg, q->c->client, q->granted->id, q->created);
  q->granted = NULL;
}

static int handle_create(struct req *q, Gshm__CreateRequest *m) {
  const char *msg = NULL;
  bool resent;
  int e = gshmd_registry_create(q->c->srv->reg, q->c->client, m, &q->granted, &resent, &msg);

  if (e)
    return set_error(q, e, msg);
  q->created = !resent; /* (a resent create's segment stays if its lease fails) */
  /* A legacy-IPC segment has no fd (cuMemAlloc memory): its creator gets
   * the handle instead. */
  if ((e = grant_lease(q, q->granted,
                       (m->flags & GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC) != 0)))
    grant_undo(q);
  return e;
}

static int handle_open(struct req *q, Gshm__OpenRequest *m) {
  const char *msg = NULL;
  int e = gshmd_registry_open(q->c->srv->reg, q->c->client, m, &q->granted, &msg);

  if (e)
    return set_error(q, e, msg);
  if ((e = grant_lease(q, q->granted, m->legacy_ipc)))
    grant_undo(q);
  return e;
}

/* Reply: the same lease, of the live segment now (no fd: it has one). */
static int handle_publish(struct req *q, Gshm__PublishRequest *m) {
  struct gshmd_lease *l;
  const char *msg = NULL;
  int e = gshmd_request_publish(q->c, m, &l, &msg);
  return e ? set_error(q, e, msg) : grant_fill(q, l);
}

static int handle_close(struct req *q, Gshm__CloseRequest *m) {
  int e = gshmd_registry_close(q->c->srv->reg, q->c->client, m->lease_id);
  return e ? set_error(q, e, "no such lease on this connection") : 0;
}

static int handle_unlink(struct req *q, Gshm__UnlinkRequest *m) {
  const char *msg = NULL;
  int e = gshmd_request_unlink(q->c, m, &msg);
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

/* By name, or by id (an unlinked segment's, which has no name). */
static int handle_revoke(struct req *q, Gshm__RevokeRequest *m) {
  const char *msg = NULL;
  int e = gshmd_request_revoke(q->c, m, &msg);
  return e ? set_error(q, e, msg) : 0;
}

static int handle_stat(struct req *q, Gshm__StatRequest *m) {
  struct gshmd_registry *r = q->c->srv->reg;
  struct gshmd_segment *seg;
  const char *msg = GSHMD_ID_GONE;
  int e = -ESTALE;

  seg = m->segment_id ? gshmd_registry_find_id_for(r, q->c->client, m->segment_id)
                      : gshmd_registry_find_name(r, m->name);
  if (!seg && !m->segment_id)
    e = gshmd_registry_no_segment(r, m->name, &msg);
  if (!seg)
    return set_error(q, e, msg);
  if (!gshmd_registry_may_see(q->c->client, seg))
    return set_error(q, -EACCES, "permission denied");
  gshmd_segment_to_info(seg, &q->info);
  q->reply->body_case = GSHM__REPLY__BODY_SEGMENT;
  q->reply->segment = &q->info;
  return 0;
}

static int handle_status(struct req *q) {
  struct gshmd_server *s = q->c->srv;
  struct gshmd_registry *r = s->reg;

  q->status.version = GSHM_VERSION;
  q->status.started_ns = s->started_ns;
  q->status.clients = r->nclients;
  q->status.segments = r->nsegments;
  q->status.bytes = r->bytes;
  q->status.leases = r->nleases;
  q->status.pid = getpid();
  q->status.backends = q->backends; /* (n_backends: 0 from gshm__status_info__init) */
  q->backends[q->status.n_backends++] = "host";
  if (r->cuda) {
    q->backends[q->status.n_backends++] = "cuda";
    q->status.devices = r->cuda->ndevices;
  }
  if (*r->gpu_fault)
    q->status.gpu_fault = r->gpu_fault;
  q->reply->body_case = GSHM__REPLY__BODY_STATUS_INFO;
  q->reply->status_info = &q->status;
  return 0;
}

static int handle_devices(struct req *q) {
  struct gshmd_registry *r = q->c->srv->reg;

  gshm__device_list__init(&q->devices);
  if (r->cuda && r->cuda->ops->devices) {
    int e = r->cuda->ops->devices(r->cuda, &q->devices);
    if (e)
      return set_error(q, e, "cannot read device information");
  }
  q->reply->body_case = GSHM__REPLY__BODY_DEVICES;
  q->reply->devices = &q->devices;
  return 0;
}

static int handle_map_report(struct req *q, Gshm__MapReport *m) {
  const char *msg = NULL;
  int e = gshmd_registry_map_report(q->c->srv->reg, q->c->client, m->lease_id,
                                    (const char *const *)m->device_uuids, m->n_device_uuids,
                                    m->unmapped, &msg);
  return e ? set_error(q, e, msg) : 0;
}

/* Cluster requests: daemon/cluster/ answers them (REMOTE_LIST and PULL
 * later, through gshmd_server_reply). */
static int handle_peers(struct req *q, Gshm__PeersRequest *m) {
  bool deferred = false;
  int e = gshmd_cluster_handle_peers(q->c->srv->cluster, q->c->client, q->request_id, m->after,
                                     q->reply, &deferred);
  q->deferred = deferred;
  return e ? set_error(q, e, "out of memory") : 0;
}

static int handle_remote_list(struct req *q, Gshm__RemoteListRequest *m) {
  const char *msg = NULL;
  int e = gshmd_cluster_handle_remote_list(q->c->srv->cluster, q->c->client, q->request_id, m,
                                           &msg);
  q->deferred = e == 0;
  return e ? set_error(q, e, msg) : 0;
}

static int handle_pull(struct req *q, Gshm__PullRequest *m) {
  const char *msg = NULL;
  int e = gshmd_cluster_handle_pull(q->c->srv->cluster, q->c->client, q->request_id, m, &msg);
  q->deferred = e == 0;
  return e ? set_error(q, e, msg) : 0;
}

static int handle_pull_cancel(struct req *q, Gshm__PullCancel *m) {
  return gshmd_cluster_pull_cancel(q->c->srv->cluster, q->c->client, m->request_id);
}

static int handle_metrics(struct req *q) {
  char *text = NULL;
  int e = gshmd_metrics_render(q->c->srv, &text);

  if (e)
    return set_error(q, e, "cannot render metrics");
  q->free_after = text;
  /* More than one reply holds (about 115 peers): the text goes in a memfd,
   * the reply's fd (an unsendable reply closed the connection, and with it
   * the client's leases); a client without fd support reads this line. */
  if (strlen(text) > GSHM_WIRE_MAX_PACKET - GSHM_WIRE_HEADER_SIZE - 64) {
    if ((e = gshmd_metrics_memfd(text, strlen(text))) < 0)
      return set_error(q, e, "cannot make the metrics' memfd");
    q->fd_out = e;
    q->fd_ours = true;
    snprintf(q->msg, sizeof(q->msg), "# gshm: the metrics (%zu bytes) came as this reply's fd\n",
             strlen(text));
    text = q->msg;
  }
  q->reply->body_case = GSHM__REPLY__BODY_TEXT;
  q->reply->text = text;
  return 0;
}

/* Checks the packet header and that hello comes first, once.  On a bad
 * packet fails the connection (with the reason) and returns false. */
static bool request_header_ok(struct conn *c, const uint8_t *pkt, size_t len,
                              struct gshm_wire_header *hdr) {
  const char *why = NULL;
  char m[160];

  if (gshm__wire_parse_header(pkt, len, hdr)) {
    gshmd_conn_fail(c, 0, 0, GSHM__STATUS__STATUS_PROTOCOL_ERROR,
                    len < GSHM_WIRE_HEADER_SIZE ? "packet shorter than the 16-byte header"
                    : "bad packet header (magic or length)");
    return false;
  }
  if (hdr->major != GSHM_PROTO_MAJOR) {
    gshmd_conn_fail(c, hdr->type, hdr->request_id, GSHM__STATUS__STATUS_VERSION_MISMATCH,
                    version_mismatch(m, sizeof(m), hdr->major, hdr->minor));
    return false;
  }
  if (hdr->type == 0 || hdr->type > GSHM_WIRE_TYPE_MAX)
    why = "unknown message type";
  else if (!c->client && hdr->type != GSHM_WIRE_HELLO)
    why = "hello must come first";
  else if (c->client && hdr->type == GSHM_WIRE_HELLO)
    why = "hello was already said";
  if (why) {
    gshmd_conn_fail(c, hdr->type, hdr->request_id, GSHM__STATUS__STATUS_PROTOCOL_ERROR, why);
    return false;
  }
  return true;
}

/* Unpacks the body as message type T, calls handler H and returns its
 * result; a body that does not decode is a protocol error (the connection
 * fails, c->closing says so); one of too many fields is refused unread. */
#define DISPATCH(T, lower, H)                                                         \
  do {                                                                                \
    if (gshm__wire_fields_over(q->body, q->len, GSHM_WIRE_REQUEST_FIELDS_MAX))        \
      return set_error(q, -EINVAL, "more fields than any request holds");             \
    T *msg_ = gshm__##lower##__unpack(&s->arena_allocator, q->len, q->body);          \
    if (!msg_) {                                                                      \
      gshmd_conn_fail(q->c, q->type, q->request_id, GSHM__STATUS__STATUS_PROTOCOL_ERROR,    \
                      "message does not decode as " #T);                                    \
      return 0;                                                                       \
    }                                                                                 \
    err = H(q, msg_);                                                                 \
    gshm__##lower##__free_unpacked(msg_, &s->arena_allocator);                        \
    return err;                                                                       \
  } while (0)

/* Runs the handler of q's message type: 0 or a negative errno. */
static int request_dispatch(struct req *q) {
  struct gshmd_server *s = q->c->srv;
  int err;

  switch (q->type) {
  case GSHM_WIRE_HELLO: DISPATCH(Gshm__Hello, hello, handle_hello);
  case GSHM_WIRE_CREATE: DISPATCH(Gshm__CreateRequest, create_request, handle_create);
  case GSHM_WIRE_OPEN: DISPATCH(Gshm__OpenRequest, open_request, handle_open);
  case GSHM_WIRE_CLOSE: DISPATCH(Gshm__CloseRequest, close_request, handle_close);
  case GSHM_WIRE_UNLINK: DISPATCH(Gshm__UnlinkRequest, unlink_request, handle_unlink);
  case GSHM_WIRE_STAT: DISPATCH(Gshm__StatRequest, stat_request, handle_stat);
  case GSHM_WIRE_LIST_SEGMENTS:
  case GSHM_WIRE_LIST_LEASES:
  case GSHM_WIRE_LIST_CLIENTS: DISPATCH(Gshm__ListRequest, list_request, gshmd__request_list);
  case GSHM_WIRE_MAP_REPORT: DISPATCH(Gshm__MapReport, map_report, handle_map_report);
  case GSHM_WIRE_CHMOD: DISPATCH(Gshm__ChmodRequest, chmod_request, handle_chmod);
  case GSHM_WIRE_CHOWN: DISPATCH(Gshm__ChownRequest, chown_request, handle_chown);
  case GSHM_WIRE_REVOKE: DISPATCH(Gshm__RevokeRequest, revoke_request, handle_revoke);
  case GSHM_WIRE_STATUS: return handle_status(q);
  case GSHM_WIRE_DEVICES: return handle_devices(q);
  case GSHM_WIRE_METRICS: return handle_metrics(q);
  case GSHM_WIRE_PEERS: DISPATCH(Gshm__PeersRequest, peers_request, handle_peers);
  case GSHM_WIRE_REMOTE_LIST:
    DISPATCH(Gshm__RemoteListRequest, remote_list_request, handle_remote_list);
  case GSHM_WIRE_PULL: DISPATCH(Gshm__PullRequest, pull_request, handle_pull);
  case GSHM_WIRE_PULL_CANCEL: DISPATCH(Gshm__PullCancel, pull_cancel, handle_pull_cancel);
  case GSHM_WIRE_PUBLISH: DISPATCH(Gshm__PublishRequest, publish_request, handle_publish);
  }
  return 0;
}
#undef DISPATCH

/* Sends q's reply (with its fd); returns its status.  A reply whose fd
 * cannot go now (gshmd's user has more fds in flight than RLIMIT_NOFILE)
 * is answered -EMFILE, a grant taken back; the connection stays (closed,
 * its client's leases ended, docs/SECURITY.md).  So is a queued one whose
 * send meets that later (server.c conn_flush). */
static Gshm__Status reply_send(struct req *q, const struct gshm_wire_header *hdr) {
  Gshm__Reply refused = GSHM__REPLY__INIT;
  int e = gshmd_conn_send(q->c, hdr->type, hdr->request_id, q->reply, q->fd_out);

  if (!e && q->granted && q->fd_out >= 0) /* queued: its send may meet the same */
    gshmd_conn_queued_grant(q->c, q->granted->id, q->created);
  if ((e != -ETOOMANYREFS && e != -EMFILE) || q->fd_out < 0 || q->c->closing)
    return q->reply->status;
  gshm_log_warn("an fd could not be sent to client %" PRIu64 " (%s): refused; raise "
                "LimitNOFILE= (fds in flight count)", q->c->client->session_id, strerror(-e));
  if (q->granted)
    grant_undo(q);
  q->reply = &refused;
  set_error(q, -EMFILE, GSHMD_FD_REFUSED);
  gshmd_conn_send(q->c, hdr->type, hdr->request_id, &refused, -1);
  return refused.status;
}

void gshmd_request_handle(struct conn *c, const uint8_t *pkt, size_t len) {
  struct gshmd_server *s = c->srv;
  Gshm__Reply reply = GSHM__REPLY__INIT;
  struct gshm_wire_header hdr;
  Gshm__Status status;
  uint64_t *counter;
  struct req q;
  int err;

  if (!request_header_ok(c, pkt, len, &hdr))
    return;
  s->arena_used = 0;
  memset(&q, 0, sizeof(q));
  q.c = c;
  q.type = hdr.type;
  q.request_id = hdr.request_id;
  q.body = pkt + GSHM_WIRE_HEADER_SIZE;
  q.len = hdr.length;
  q.reply = &reply;
  q.fd_out = -1;
  gshm__lease_grant__init(&q.grant);
  gshm__welcome__init(&q.welcome);
  gshm__status_info__init(&q.status);

  err = request_dispatch(&q);
  if (c->closing) /* the body did not decode */
    return;
  if (!err)
    reply.status = GSHM__STATUS__STATUS_OK;
  else if (reply.status == GSHM__STATUS__STATUS_UNSPECIFIED)
    set_error(&q, err, NULL);
  status = reply.status;
  /* A mapping report or a pull's cancel with request id 0 wants no reply
   * (libgshm sends them without waiting: a first map's round trip; a
   * cancel sent while it reads its pull's replies). */
  if (!((hdr.type == GSHM_WIRE_MAP_REPORT || hdr.type == GSHM_WIRE_PULL_CANCEL) &&
        hdr.request_id == 0) &&
      !q.deferred)
    status = reply_send(&q, &hdr);
  if ((counter = gshmd_server_requests(s, hdr.type, (unsigned)status)))
    (*counter)++;
  if (q.fd_ours) /* (else lent by the backend: not ours to close) */
    close(q.fd_out);
  free(q.free_after);
  if (hdr.type == GSHM_WIRE_HELLO && err && !c->closing)
    gshmd_conn_close(c, reply.message); /* a refused hello ends the connection */
}
