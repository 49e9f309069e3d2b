/* SPDX-License-Identifier: Apache-2.0 */
/* A pull's sources (pull.h): the peers a set may take its segments
 * from ("a,b,c"), which one each grant asks (the fewest of the set's
 * bytes open), what a source that cannot serve a segment does to it
 * (asked of another), and whether what a source granted is a copy of
 * what the lister listed (the same source text: where the bytes came
 * from first). */
#include "pull.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "link.h"
#include "log.h"
#include "registry.h"
#include "relay_path.h"
#include "util.h"

#define SOURCE_MAX 384 /* a source as clients take it (gshm.h GSHM_SOURCE_MAX) */

/* The peers of pull m ("a" or, for a set, "a,b,c": at most
 * PULL_MAX_SOURCES, each once) into out[*n_out].  Returns 0, or -EINVAL
 * (a list for a single pull, too many, an empty or repeated name) or
 * -ENOENT (one is not in cluster.peers) with *msg_out set. */
int gshmd__pull_sources_parse(struct gshmd_cluster *cl, const Gshm__PullRequest *m,
                              struct peer **out, unsigned *n_out, const char **msg_out) {
  const char *at = m->peer ? m->peer : "";
  unsigned n = 1;

  for (const char *q = at; (q = strchr(q, ',')); q++)
    n++;
  if (n > 1 && !m->prefix) {
    *msg_out = "several peers: only a set pull (a prefix) takes its segments from several";
    return -EINVAL;
  }
  if (n > PULL_MAX_SOURCES) {
    *msg_out = "too many peers: a set pull takes its segments from at most 8";
    return -EINVAL;
  }
  for (unsigned k = 0; k < n; k++) {
    const char *comma = strchr(at, ',');
    size_t len = comma ? (size_t)(comma - at) : strlen(at);
    char name[64];

    if (!len && n > 1) {
      *msg_out = "an empty name in a list of peers";
      return -EINVAL;
    }
    snprintf(name, sizeof(name), "%.*s", (int)(len < sizeof(name) ? len : sizeof(name) - 1), at);
    if (len >= sizeof(name) || !(out[k] = gshmd__link_peer_find(&cl->ll, name))) {
      /* (one peer: the requester named it; gshmctl adds the known ones) */
      snprintf(cl->reply_msg, sizeof(cl->reply_msg), "no such peer '%s%s' in cluster.peers",
               name, len < sizeof(name) ? "" : "...");
      *msg_out = n == 1 ? "no such peer in cluster.peers" : cl->reply_msg;
      return -ENOENT;
    }
    for (unsigned j = 0; j < k; j++)
      if (out[j] == out[k]) {
        snprintf(cl->reply_msg, sizeof(cl->reply_msg), "peer '%s' named twice", name);
        *msg_out = cl->reply_msg;
        return -EINVAL;
      }
    at = comma ? comma + 1 : at + len;
  }
  *n_out = n;
  return 0;
}

/* The source of s whose grants of this node are under LINK_MAX_GRANTS
 * with the fewest of s's bytes open (the first of equals: the lister),
 * that p has not tried, or -1.  Fewest bytes open, not an even split: a source that serves
 * faster closes its segments sooner and is given more, and one that
 * relays a segment it is still pulling holds it open meanwhile. */
int gshmd__pull_source_pick(const struct pull_set *s, const struct pull *p) {
  int best = -1;

  for (unsigned k = 0; k < s->npeers; k++)
    if (!((p->tried | s->down) & (1u << k)) && s->peers[k]->grants_out < LINK_MAX_GRANTS &&
        (best < 0 || s->open_bytes[k] < s->open_bytes[best]))
      best = (int)k;
  return best;
}

void gshmd__pull_grant_elsewhere(struct pull *p, bool answered, const char *why) {
  struct pull_set *s = p->s;
  uint8_t bit = (uint8_t)(1u << p->src);

  gshm_log_info("cluster: the pull of '%s' asks another source for '%s'%s: %s", s->name,
                p->remote_name, answered ? "" : " (and that peer for nothing more)", why);
  p->peer->passed_over++;
  p->tried |= bit;
  if (!answered) /* (no answer: lost, unreachable, its hello refused) */
    s->down |= bit;
  gshmd__pull_requeue(p);
}

/* Where a copy of the peer segment s comes from (its source), into src
 * (len bytes): where the peer got it, when the peer pulled it too, else
 * the peer's own. */
void gshmd__pull_source_text(const struct pull *p, const Gshm__Cluster__Segment *s, char *src,
                             size_t len) {
  if (s->source && *s->source && strlen(s->source) < SOURCE_MAX && strchr(s->source, ':') &&
      strchr(s->source, '#')) {
    snprintf(src, len, "%s", s->source);
    gshm__text_clean(src);
  } else {
    snprintf(src, len, "%s:%s#%" PRIu64 ".%" PRIu64, (p->peer ? p->peer : p->s->peer)->name,
             s->name, s->id,
             s->generation);
  }
}

/* Whether the segment the peer granted is the one it listed: the same
 * id and generation when it was listed published; the same source (p's
 * hidden copy, made from the listing, has it) in any case, as a segment
 * relayed in flight there and published since has; on a GPU there only
 * where it was listed on one (a copy made at its grant takes the grant's
 * word).  One that took the name meanwhile (made again, or the old one
 * of a --replace whose pull failed there) would mix generations in the
 * set. */
bool gshmd__pull_grant_is_listed(const struct pull *p, const Gshm__Cluster__Segment *s) {
  const char *listed = p->create_listed ? p->listed_source : p->seg ? p->seg->source : NULL;
  char src[400];

  if (!listed)
    return true; /* (not listed: a single pull) */
  if (gshmd__pull_location_device(s->location) != p->listed_device)
    return false;
  /* (ids are the lister's own; another source's copy has its own ids
   * and the same source text: where the bytes came from first) */
  if (p->src == 0 && p->listed_id && (s->id != p->listed_id || s->generation != p->listed_gen))
    return false;
  gshmd__pull_source_text(p, s, src, sizeof(src));
  return strcmp(src, listed) == 0;
}

bool gshmd__pull_upstream_take(struct pull *p, const Gshm__Cluster__Grant *g) {
  const char *up = g->upstream ? g->upstream : "", *bad = NULL;
  bool known;
  int err = -EPROTO;

  free(p->upstream);
  p->upstream = NULL;
  p->upstream_known = !g->segment->in_flight;
  if (!g->segment->in_flight && *up)
    bad = "a path of its bytes on a segment that is not in flight";
  else if (!g->segment->in_flight || !*up) /* (in flight, none said: not known) */
    return true;
  else if (!gshmd__relay_path_ok(up, &known))
    bad = "a malformed path of its bytes (Grant.upstream)";
  else if (!(p->upstream = strdup(up)))
    bad = "no memory for the path of its bytes", err = -ENOMEM;
  if (bad) {
    pull_fail(p, err, "peer '%s' granted '%s' with %s", p->peer->name, p->remote_name, bad);
    return false;
  }
  p->upstream_known = known;
  return true;
}

/* p's grant goes back at once, before anything was read (grants.c
 * gshmd__pull_grant_elsewhere asks another source). */
void gshmd__pull_grant_return(struct pull *p) {
  gshmd__pull_release_send(p);
  gshm_list_del(&p->link_node);
  p->on_link = false;
  p->link = NULL;
  p->granted = p->relayed = p->upstream_known = false;
  free(p->upstream);
  p->upstream = NULL;
  p->grant_id = p->remote_id = p->remote_gen = 0;
}

void gshmd__pull_grant_not_listed(struct pull *p) {
  char msg[GSHMD_PEER_ERROR_LEN];

  if (p->src == 0) {
    pull_fail(p, -ESTALE, "segment '%s' of peer '%s' is not the one it listed (the name was "
              "taken by another segment meanwhile)", p->remote_name, p->peer->name);
    return;
  }
  snprintf(msg, sizeof(msg), "peer '%s' holds another segment of that name, not a copy of "
           "peer '%s''s (or a copy on another kind of memory)", p->peer->name, p->s->peer->name);
  gshmd__pull_grant_return(p);
  gshmd__pull_grant_elsewhere(p, true, msg);
}

void gshmd__pull_set_sources(struct pull_set *s, struct peer *const *peers, unsigned n) {
  size_t o = 0;

  s->peer = peers[0];
  memcpy(s->peers, peers, n * sizeof(peers[0]));
  s->npeers = n;
  for (unsigned k = 0; k < n; k++) /* (fits: PULL_MAX_SOURCES names of at most 63 bytes) */
    o += (size_t)snprintf(s->peers_text + o, sizeof(s->peers_text) - o, "%s%s", k ? "," : "",
                          peers[k]->name);
}
