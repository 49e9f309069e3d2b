/* SPDX-License-Identifier: Apache-2.0 */
/* The revoke request, and its resend after a gshmd restart: the fd
 * store's resend memo says which segment the first one revoked
 * (requests.h). */
#include <errno.h>
#include <inttypes.h>

#include "fdstore.h"
#include "log.h"
#include "registry.h"
#include "requests.h"
#include "server.h"
#include "wire.h"

_Static_assert(GSHM_REVOKE_TOKEN_BYTES == GSHMD_MEMO_TOKEN_BYTES, "a revoke token is a memo key");

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
