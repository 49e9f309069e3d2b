/* SPDX-License-Identifier: Apache-2.0 */
/* Who may connect: a peer's credentials (uid, groups, admin) and the
 * connection limits checked at accept (quota.connections per uid,
 * limits.max_connections with the admins' reserve). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "config.h"
#include "log.h"
#include "requests.h"
#include "server.h"

/* The peer's credentials and every supplementary group (SO_PEERGROUPS
 * says how many when they do not fit: up to NGROUPS_MAX, 65536).  On
 * failure to read the groups, the peer has none: it can lose access
 * through group bits, never gain any.  Returns -ENOMEM or 0. */
int gshmd__peer_credentials(struct gshmd_server *s, int fd, struct gshmd_cred *cred) {
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

/* What uid holds against quota.connections: its connections (a closing
 * one's socket counts among the fds once its close is queued) and its
 * fds still to be closed.  One pass over the connections. */
static uint32_t uid_holds(struct gshmd_server *s, uid_t uid) {
  uint32_t n = 0;
  struct gshm_list *pos;

  gshm_list_foreach(pos, &s->conns) {
    const struct conn *c = gshm_list_entry(pos, struct conn, node);
    n += !c->closing && c->cred.uid == uid;
  }
  return n + gshmd__closes_pending(s, uid); /* (a lingering close holds a thread) */
}

/* limits.max_connections, of which the last limits.admin_connections (at
 * most a quarter) only root and the admin group may take. */
static uint32_t global_limit(const struct gshmd_server *s, const struct gshmd_cred *cred) {
  uint32_t max = s->cfg->max_connections;
  return cred->admin ? max : max - gshmd_config_admin_reserve(max, s->cfg->admin_connections);
}

/* Whether cred's uid, holding `adding` more connections than it does
 * (1: one being accepted; 0: one that just sent fds), passes
 * quota.connections; logs as `what` ("connection refused", "dropped"). */
static bool uid_over(struct gshmd_server *s, const struct gshmd_cred *cred, uint32_t adding,
                     const char *what) {
  uint32_t q = s->cfg->quota_connections, n;

  if (!q || cred->uid == 0 || (n = uid_holds(s, cred->uid)) + adding <= q)
    return false;
  gshm_log_warn("%s: uid %u has %u connections and fds still being closed, limit %u", what,
                (unsigned)cred->uid, n, q);
  return true;
}

/* The same for limits.max_connections over every uid. */
static bool all_over(struct gshmd_server *s, const struct gshmd_cred *cred, uint32_t adding,
                     const char *what) {
  uint32_t n = s->nconns + gshmd__closes_pending(s, (uid_t)-1);

  if (!s->cfg->max_connections || n + adding <= global_limit(s, cred))
    return false;
  gshm_log_warn("%s: uid %u: %u connections (fds still being closed included), the limit%s", what,
                (unsigned)cred->uid, n, cred->admin ? "" : " for users who are not admins");
  return true;
}

/* quota.connections counted at accept, before hello, over every
 * connection of the uid: checked only at hello, a user could hold all of
 * limits.max_connections with connections that never say hello (each
 * dropped after limits.partial_timeout_ms, and opened again) and lock
 * every other user out. */
bool gshmd__over_uid_quota(struct gshmd_server *s, const struct gshmd_cred *cred) {
  return uid_over(s, cred, 1, "connection refused");
}

bool gshmd__over_global_limit(struct gshmd_server *s, const struct gshmd_cred *cred) {
  return all_over(s, cred, 1, "connection refused");
}

bool gshmd__fds_over_limits(struct gshmd_server *s, const struct gshmd_cred *cred) {
  return uid_over(s, cred, 0, "dropped") || all_over(s, cred, 0, "dropped");
}
