/* SPDX-License-Identifier: Apache-2.0 */
/* The revoke, unlink and publish requests, and their resends after a
 * gshmd restart: the fd store's resend memo says which segment the first
 * one revoked, unlinked or published (requests.h). */
#include <errno.h>
#include <inttypes.h>

#include "fdstore.h"
#include "log.h"
#include "registry.h"
#include "requests.h"
#include "server.h"
#include "wire.h"

_Static_assert(GSHM_REVOKE_TOKEN_BYTES == GSHMD_MEMO_TOKEN_BYTES, "a revoke token is a memo key");
_Static_assert(GSHM_UNLINK_TOKEN_BYTES == GSHMD_MEMO_TOKEN_BYTES, "an unlink token is a memo key");
_Static_assert(GSHM_PUBLISH_TOKEN_BYTES == GSHMD_MEMO_TOKEN_BYTES, "a publish token is a memo key");

int gshmd_request_revoke(struct conn *cn, const Gshm__RevokeRequest *m, const char **msg_out) {
  struct gshmd_server *srv = cn->srv;
  struct gshmd_client *c = cn->client;
  const uint8_t *token = m->token.len == GSHM_REVOKE_TOKEN_BYTES ? m->token.data : NULL;
  uint64_t id = m->segment_id, first;
  struct gshmd_segment *seg;
  bool memo = false;

  if (m->token.len && !token) {
    *msg_out = "a revoke token is 16 bytes";
    return -EINVAL;
  }
  /* Sent again after a restart: the first one's segment, whatever holds
   * the name now; gone, it was revoked by the first (ids never recur). */
  if (token && c->cred.admin &&
      (memo = gshmd_fdstore_memo_find(srv->reg->fdstore, token, c->cred.uid, GSHMD_MEMO_REVOKE,
                                      &first))) {
    if (!gshmd_registry_find_id(srv->reg, first)) {
      gshm_log_notice("revoke of segment id %" PRIu64 " sent again by pid %d (its token is an "
                      "earlier revoke's: a reply lost to a restart): that one revoked it",
                      first, (int)c->cred.pid);
      return 0;
    }
    id = first;
  }
  seg = id ? gshmd_registry_find_id(srv->reg, id) : gshmd_registry_find_name(srv->reg, m->name);
  if (seg && c->cred.admin) {
    /* noted before the revoke reaches the store (no journal: the resend
     * says what it meets, -ENOENT or -ESTALE) */
    if (token && !memo)
      gshmd_fdstore_memo_put(srv->reg->fdstore, token, c->cred.uid, GSHMD_MEMO_REVOKE, seg->id);
    gshmd_notify_lease_holders(srv, seg, GSHM__EVENT_KIND__EVENT_KIND_REVOKED, cn);
  }
  return gshmd_registry_revoke(srv->reg, c, id ? NULL : m->name, id, msg_out);
}

int gshmd_request_unlink(struct conn *cn, const Gshm__UnlinkRequest *m, const char **msg_out) {
  struct gshmd_registry *r = cn->srv->reg;
  struct gshmd_client *c = cn->client;
  const uint8_t *token = m->token.len == GSHM_UNLINK_TOKEN_BYTES ? m->token.data : NULL;
  struct gshmd_segment *seg = gshmd_registry_find_name(r, m->name);
  uint64_t first;
  bool memo = false;

  if (m->token.len && !token) {
    *msg_out = "an unlink token is 16 bytes";
    return -EINVAL;
  }
  /* Sent again after a restart: the first one's segment, whatever holds
   * the name now (a create acknowledged since must keep it); gone or
   * unlinked, the first one unlinked it (ids never recur). */
  if (token && (memo = gshmd_fdstore_memo_find(r->fdstore, token, c->cred.uid,
                                               GSHMD_MEMO_UNLINK, &first))) {
    struct gshmd_segment *was = gshmd_registry_find_id(r, first);
    if (!was || was->unlinked || was != seg) {
      gshm_log_notice("unlink of '%s' (segment id %" PRIu64 ") sent again by pid %d (its "
                      "token is an earlier unlink's: a reply lost to a restart): that one "
                      "unlinked it",
                      m->name, first, (int)c->cred.pid);
      return 0;
    }
  }
  /* Tell the holders first, while the segment surely still exists; the
   * events go out before this reply, so whoever learns of the unlink from
   * the unlinker finds the event already in its socket. */
  if (seg && gshmd_registry_may_manage(c, seg)) {
    /* noted before the unlink reaches the store (no journal: the resend
     * says what it meets, and libgshm takes its -ENOENT for 0) */
    if (token && !memo)
      gshmd_fdstore_memo_put(r->fdstore, token, c->cred.uid, GSHMD_MEMO_UNLINK, seg->id);
    gshmd_notify_lease_holders(cn->srv, seg, GSHM__EVENT_KIND__EVENT_KIND_UNLINKED, cn);
  }
  return gshmd_registry_unlink(r, c, m->name, msg_out);
}

int gshmd_request_publish(struct conn *cn, const Gshm__PublishRequest *m,
                          struct gshmd_lease **lease_out, const char **msg_out) {
  struct gshmd_registry *r = cn->srv->reg;
  struct gshmd_client *c = cn->client;
  const uint8_t *token = m->token.len == GSHM_PUBLISH_TOKEN_BYTES ? m->token.data : NULL;
  uint64_t first;
  int e;

  if (m->token.len && !token) {
    *msg_out = "a publish token is 16 bytes";
    return -EINVAL;
  }
  /* Sent again after a restart: the first one's segment, before the lease
   * id is looked at (the first one's lease ended with its gshmd, and this
   * gshmd may have given its id to another lease of c's). */
  if (token && gshmd_fdstore_memo_find(r->fdstore, token, c->cred.uid, GSHMD_MEMO_PUBLISH, &first))
    return gshmd_registry_publish_resent(r, c, first, lease_out, msg_out);
  /* the new id is noted before the publish reaches the store: a restart
   * that kept the publish keeps the note (fdstore_publish.c) */
  if (token)
    gshmd_fdstore_memo_on_publish(r->fdstore, token, c->cred.uid, GSHMD_MEMO_PUBLISH);
  e = gshmd_registry_publish_lease(r, c, m->lease_id, m->replace, lease_out, msg_out);
  gshmd_fdstore_memo_on_publish(r->fdstore, NULL, 0, GSHMD_MEMO_PUBLISH);
  return e;
}
