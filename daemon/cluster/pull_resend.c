/* SPDX-License-Identifier: Apache-2.0 */
/* A single pull sent again after a gshmd restart lost its reply
 * (libgshm's one resend: the same PullRequest, token and all).  The
 * publish of the first one noted its segment in the fd store's resend
 * memo under a hash of the token and the request's fields; the resend is
 * answered with that segment, as the first would have been, instead of
 * meeting it (-EEXIST).  A set (prefix) is not: its members and their
 * per-segment results are not kept (docs/ARCHITECTURE.md "The fd store":
 * requests sent again). */
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "fdstore.h"
#include "log.h"
#include "pull.h"
#include "registry.h"
#include "wire.h"

_Static_assert(GSHMD_MEMO_TOKEN_BYTES >= crypto_generichash_BYTES_MIN, "a memo key is a hash");

bool gshmd__pull_memo_key(const Gshm__PullRequest *m, uint8_t *key) {
  const char *text[] = {m->peer, m->name, m->local_name, m->location};
  uint8_t fixed[6] = {(uint8_t)m->mode,         (uint8_t)(m->mode >> 8),
                      (uint8_t)(m->mode >> 16), (uint8_t)(m->mode >> 24),
                      m->prefix,                m->replace};
  crypto_generichash_state st;

  if (m->prefix || m->token.len != GSHM_PULL_TOKEN_BYTES)
    return false;
  crypto_generichash_init(&st, NULL, 0, GSHMD_MEMO_TOKEN_BYTES);
  crypto_generichash_update(&st, m->token.data, m->token.len);
  for (size_t i = 0; i < sizeof(text) / sizeof(text[0]); i++) {
    const char *t = text[i] ? text[i] : ""; /* (with its NUL: fields stay apart) */
    crypto_generichash_update(&st, (const uint8_t *)t, strlen(t) + 1);
  }
  crypto_generichash_update(&st, fixed, sizeof(fixed));
  crypto_generichash_final(&st, key, GSHMD_MEMO_TOKEN_BYTES);
  return true;
}

/* The remote id and generation in seg's source when it is the one this
 * pull of peer's `name` made ("PEER:NAME#ID.GEN"); else (the peer had it
 * from another node) 0, as a relayed pull's. */
static void remote_ids(const struct gshmd_segment *seg, const char *peer, const char *name,
                       Gshm__PullResult *res) {
  size_t pl = strlen(peer), nl = strlen(name);
  const char *s = seg->source;

  if (s && !strncmp(s, peer, pl) && s[pl] == ':' && !strncmp(s + pl + 1, name, nl) &&
      s[pl + 1 + nl] == '#' &&
      sscanf(s + pl + nl + 2, "%" SCNu64 ".%" SCNu64, &res->remote_id,
             &res->remote_generation) != 2)
    res->remote_id = res->remote_generation = 0;
}

int gshmd__pull_resent(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                       const Gshm__PullRequest *m, const char *local, const char **msg_out) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullResult res = GSHM__PULL_RESULT__INIT;
  Gshm__SegmentInfo info;
  uint8_t key[GSHMD_MEMO_TOKEN_BYTES];
  struct gshmd_segment *seg;
  uint64_t id;

  if (m->token.len && m->token.len != GSHM_PULL_TOKEN_BYTES) {
    *msg_out = "a pull token is 16 bytes";
    return -EINVAL;
  }
  if (!gshmd__pull_memo_key(m, key) ||
      !gshmd_fdstore_memo_find(cl->reg->fdstore, key, c->cred.uid, GSHMD_MEMO_PULL, &id))
    return 0;
  seg = gshmd_registry_find_id(cl->reg, id);
  /* still the first one's: published, named as asked, the caller's uid's
   * (unlinked since, or its name given to another: pulled again) */
  if (!seg || seg->hidden || seg->unlinked || seg->uid != c->cred.uid || strcmp(seg->name, local)) {
    gshm_log_info("cluster: pull of '%s' sent again by pid %d (its token is an earlier pull's): "
                  "that one's segment id %" PRIu64 " is gone; pulled again",
                  m->name, (int)c->cred.pid, id);
    return 0;
  }
  gshmd_segment_to_info(seg, &info);
  res.segment = &info;
  res.bytes = seg->requested_size;
  res.path = "";
  res.path_reason = "the first pull's segment: its reply was lost to a gshmd restart, and its "
                    "path and time were not kept";
  res.peer = m->peer;
  remote_ids(seg, m->peer, m->name, &res);
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_RESULT;
  reply.pull_result = &res;
  gshm_log_notice("cluster: pull of '%s' from peer '%s' sent again by pid %d (its token is an "
                  "earlier pull's: a reply lost to a restart): answered with the segment that "
                  "one published, '%s' id %" PRIu64,
                  m->name, m->peer, (int)c->cred.pid, seg->name, seg->id);
  cl->reply(cl->reply_arg, c, GSHM_WIRE_PULL, request_id, &reply);
  return 1;
}

void gshmd__pull_memo_arm(struct pull_set *s, bool arm) {
  gshmd_fdstore_memo_on_publish(s->cl->reg->fdstore, arm && s->memo ? s->memo_key : NULL,
                                s->holder->cred.uid);
}
