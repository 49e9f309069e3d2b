/* SPDX-License-Identifier: Apache-2.0 */
/* A pull's answer to its requester: a published set's (its pull_items
 * pages, then its result), and the one a resend gets.
 *
 * A pull sent again after a gshmd restart lost its reply (libgshm's one
 * resend: the same PullRequest, token and all).  The publish of the
 * first one noted its segment in the fd store's resend memo under a hash
 * of the token and the request's fields; the resend is answered with
 * that segment, as the first would have been, instead of meeting it
 * (-EEXIST).  A set (prefix) only when it is one segment: one memo entry
 * holds one id, and only a set of one chunk (one segment) answers with
 * its result first (docs/ARCHITECTURE.md "The fd store": requests sent
 * again). */
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
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

  if (m->token.len != GSHM_PULL_TOKEN_BYTES)
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

/* A set's resent answer: its one segment, seg, as the first one's
 * pull_items page listed it (path "": not kept; its source as it is). */
static void reply_set_item(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                           const struct gshmd_segment *seg, const Gshm__PullResult *res) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullItems pi = GSHM__PULL_ITEMS__INIT;
  Gshm__PulledSegment o = GSHM__PULLED_SEGMENT__INIT, *op = &o;

  o.name = seg->name;
  o.id = seg->id;
  o.generation = seg->generation;
  o.size = seg->mem->size;
  o.bytes = seg->requested_size;
  o.location = (char *)seg->mem->location;
  o.path = "";
  o.remote_id = res->remote_id;
  o.remote_generation = res->remote_generation;
  o.device_index = seg->mem->device_index;
  o.source = seg->source ? seg->source : "";
  o.granularity = seg->mem->granularity;
  o.created_ns = seg->created_ns;
  pi.items = &op;
  pi.n_items = 1;
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_ITEMS;
  reply.pull_items = &pi;
  cl->reply(cl->reply_arg, c, GSHM_WIRE_PULL, request_id, &reply);
}

/* Whether seg is still what the first pull (m, as `local`) published
 * for c: published, the caller's uid's, named as asked (a set's member:
 * under the local prefix, as the peer's name under the request's). */
static bool still_published(const struct gshmd_segment *seg, const struct gshmd_client *c,
                            const Gshm__PullRequest *m, const char *local, char *remote,
                            size_t cap) {
  size_t ll = strlen(local);

  if (!seg || seg->hidden || seg->unlinked || seg->uid != c->cred.uid)
    return false;
  if (!m->prefix) {
    snprintf(remote, cap, "%s", m->name);
    return !strcmp(seg->name, local);
  }
  if (strncmp(seg->name, local, ll) || !seg->name[ll])
    return false;
  return snprintf(remote, cap, "%s%s", m->name, seg->name + ll) < (int)cap;
}

int gshmd__pull_resent(struct gshmd_cluster *cl, struct gshmd_client *c, uint32_t request_id,
                       const Gshm__PullRequest *m, const char *local, const char **msg_out) {
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullResult res = GSHM__PULL_RESULT__INIT;
  Gshm__SegmentInfo info;
  uint8_t key[GSHMD_MEMO_TOKEN_BYTES];
  struct gshmd_segment *seg;
  char remote[sizeof(((struct pull *)0)->remote_name)];
  char what[GSHM__PULL_WHAT_CAP];
  uint64_t id;

  if (m->token.len && m->token.len != GSHM_PULL_TOKEN_BYTES) {
    *msg_out = "a pull token is 16 bytes";
    return -EINVAL;
  }
  if (!gshmd__pull_memo_key(m, key) ||
      !gshmd_fdstore_memo_find(cl->reg->fdstore, key, c->cred.uid, GSHMD_MEMO_PULL, &id))
    return 0;
  seg = gshmd_registry_find_id(cl->reg, id);
  /* (unlinked since, or its name given to another: pulled again) */
  if (!still_published(seg, c, m, local, remote, sizeof(remote))) {
    gshm_log_info("cluster: pull of %s sent again by pid %d (its token is an earlier "
                  "pull's): that one's segment id %" PRIu64 " is gone; pulled again",
                  gshm__pull_what(what, sizeof(what), m->prefix, m->name), (int)c->cred.pid, id);
    return 0;
  }
  gshmd_segment_to_info(seg, &info);
  res.segment = &info;
  res.bytes = seg->requested_size;
  res.path = "";
  res.path_reason = "the first pull's segment: its reply was lost to a gshmd restart, and its "
                    "path and time were not kept";
  res.peer = m->peer;
  remote_ids(seg, m->peer, remote, &res);
  if (m->prefix) {
    res.count = 1;
    res.set_bytes = seg->requested_size;
    reply_set_item(cl, c, request_id, seg, &res);
  }
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_RESULT;
  reply.pull_result = &res;
  gshm_log_notice("cluster: pull of %s from peer '%s' sent again by pid %d (its token is an "
                  "earlier pull's: a reply lost to a restart): answered with the segment that "
                  "one published, '%s' id %" PRIu64,
                  gshm__pull_what(what, sizeof(what), m->prefix, m->name), m->peer,
                  (int)c->cred.pid, seg->name, seg->id);
  cl->reply(cl->reply_arg, c, GSHM_WIRE_PULL, request_id, &reply);
  return 1;
}

void gshmd__pull_memo_arm(struct pull_set *s, bool arm) {
  /* a set of more than one segment: one entry would name only its first,
   * and its first reply is a progress reply, sent before the publish */
  bool one = !s->prefix || s->n == 1;

  gshmd_fdstore_memo_on_publish(s->cl->reg->fdstore, arm && one && s->memo ? s->memo_key : NULL,
                                s->holder->cred.uid, GSHMD_MEMO_PULL);
}

/* ---- a published set's answer ---- */

#define ITEMS_PAGE 49152 /* bytes of PulledSegment per pull_items reply (packets: 64 KiB) */
#define GSHMD_SOURCE_TEXT 400 /* a source made here: peer name, segment name, two ids */

/* p's source as a pull_items entry carries it: "" where the requester
 * makes it from the entry (the peer's own segment: "PEER:REMOTE_NAME#ID.
 * GEN"), else the segment's (the peer pulled or relayed it: where it came
 * from first).  own: scratch of len bytes. */
static char *item_source(const struct pull_set *s, const struct pull *p, char *own, size_t len) {
  snprintf(own, len, "%s:%s#%" PRIu64 ".%" PRIu64, (p->peer ? p->peer : s->peer)->name,
           p->remote_name, p->remote_id,
           p->remote_gen);
  return !p->seg->source || !strcmp(own, p->seg->source) ? (char *)"" : p->seg->source;
}

/* Sends `items` pages of the set's segments items[first..n): as many as
 * fit one reply each. */
static void reply_items(struct pull_set *s) {
  Gshm__PulledSegment *items = calloc(s->n, sizeof(*items));
  Gshm__PulledSegment **ptrs = calloc(s->n, sizeof(*ptrs));
  size_t first = 0, used = 0;
  char own[GSHMD_SOURCE_TEXT];

  if (!items || !ptrs) {
    free(items);
    free(ptrs);
    return; /* the final result still comes (count says what is missing) */
  }
  for (size_t i = 0; i <= s->n; i++) {
    if (i < s->n) {
      struct pull *p = s->items[i];
      Gshm__PulledSegment *o = &items[i];
      gshm__pulled_segment__init(o);
      o->name = p->seg->name;
      o->id = p->seg->id;
      o->generation = p->seg->generation;
      o->size = p->seg->mem->size;
      o->bytes = p->total;
      o->location = (char *)p->seg->mem->location;
      o->path = (char *)gshmd__pull_path_name(p->path);
      o->path_reason = p->path_reason;
      o->remote_id = p->remote_id;
      o->remote_generation = p->remote_gen;
      o->device_index = p->seg->mem->device_index;
      o->granularity = p->seg->mem->granularity;
      o->created_ns = p->seg->created_ns;
      o->relayed = p->relayed;
      o->source = item_source(s, p, own, sizeof(own));
      o->peer = s->npeers > 1 && p->peer ? p->peer->name : (char *)"";
      ptrs[i] = o;
      used += gshm__pulled_segment__get_packed_size(o) + 4;
    }
    if ((i == s->n && i > first) || used > ITEMS_PAGE) {
      Gshm__Reply reply = GSHM__REPLY__INIT;
      Gshm__PullItems pi = GSHM__PULL_ITEMS__INIT;
      size_t end = i == s->n ? i : i + 1;
      pi.items = &ptrs[first];
      pi.n_items = end - first;
      pi.first = (uint32_t)first;
      reply.status = GSHM__STATUS__STATUS_OK;
      reply.body_case = GSHM__REPLY__BODY_PULL_ITEMS;
      reply.pull_items = &pi;
      s->cl->reply(s->cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
      first = end;
      used = 0;
    }
  }
  free(items);
  free(ptrs);
}

/* The result that ends the request: the (first) segment's, and for a set
 * the whole set's count, bytes and time. */
void gshmd__pull_reply_result(struct pull_set *s, int64_t ns) {
  struct pull *p = s->items[0];
  Gshm__Reply reply = GSHM__REPLY__INIT;
  Gshm__PullResult res = GSHM__PULL_RESULT__INIT;
  Gshm__SegmentInfo info;

  if (s->prefix)
    reply_items(s);
  gshmd_segment_to_info(p->seg, &info);
  res.segment = &info;
  res.bytes = p->total;
  res.elapsed_ns = ns;
  res.path = (char *)gshmd__pull_path_name(p->path);
  res.path_reason = p->path_reason;
  res.peer = (p->peer ? p->peer : s->peer)->name;
  res.remote_id = p->remote_id;
  res.remote_generation = p->remote_gen;
  res.relayed = p->relayed;
  if (s->prefix) {
    res.count = (uint32_t)s->n;
    res.set_bytes = s->done;
  }
  reply.status = GSHM__STATUS__STATUS_OK;
  reply.body_case = GSHM__REPLY__BODY_PULL_RESULT;
  reply.pull_result = &res;
  s->cl->reply(s->cl->reply_arg, s->requester, GSHM_WIRE_PULL, s->request_id, &reply);
}
