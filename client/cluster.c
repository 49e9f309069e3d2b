/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm's cluster calls: peers, a peer's segments, pulls
 * (docs/CLUSTER.md).  The daemons move the bytes; these only ask. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

int gshm_cluster_peers(gshm_client_t *c, char *node_name_out, gshm_cluster_peer_t **peers_out,
                       size_t *count_out) {
  Gshm__Empty m = GSHM__EMPTY__INIT;
  Gshm__Reply *reply = NULL;
  gshm_cluster_peer_t *a = NULL;
  size_t n = 0;
  int e;

  if (!c || !peers_out || !count_out)
    return -EINVAL;
  pthread_mutex_lock(&c->lock);
  e = gshm__request(c, GSHM_WIRE_PEERS, &m.base, &reply, NULL);
  pthread_mutex_unlock(&c->lock);
  if (e)
    return e;
  if (reply->body_case != GSHM__REPLY__BODY_CLUSTER_PEERS) {
    gshm__reply__free_unpacked(reply, NULL);
    return -EPROTO;
  }
  n = reply->cluster_peers->n_peers;
  if (n && !(a = calloc(n, sizeof(*a)))) {
    gshm__reply__free_unpacked(reply, NULL);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const Gshm__ClusterPeer *p = reply->cluster_peers->peers[i];
    snprintf(a[i].name, sizeof(a[i].name), "%s", p->name);
    snprintf(a[i].address, sizeof(a[i].address), "%s", p->address);
    snprintf(a[i].state, sizeof(a[i].state), "%s", p->state);
    a[i].exported = p->exported;
    snprintf(a[i].message, sizeof(a[i].message), "%s", p->message);
  }
  if (node_name_out)
    snprintf(node_name_out, 64, "%s", reply->cluster_peers->node_name);
  gshm__reply__free_unpacked(reply, NULL);
  *peers_out = a;
  *count_out = n;
  return 0;
}

int gshm_list_remote(gshm_client_t *c, const char *peer, gshm_segment_info_t **infos_out,
                     size_t *count_out) {
  gshm_segment_info_t *arr = NULL;
  size_t n = 0, cap = 0;
  uint64_t after = 0;
  int e = 0;

  if (!c || !peer || !infos_out || !count_out)
    return -EINVAL;
  pthread_mutex_lock(&c->lock);
  do {
    Gshm__RemoteListRequest m = GSHM__REMOTE_LIST_REQUEST__INIT;
    Gshm__Reply *reply = NULL;
    const Gshm__SegmentList *l;
    m.peer = (char *)peer;
    m.after = after;
    if ((e = gshm__request(c, GSHM_WIRE_REMOTE_LIST, &m.base, &reply, NULL)))
      break;
    if (reply->body_case != GSHM__REPLY__BODY_SEGMENTS) {
      gshm__reply__free_unpacked(reply, NULL);
      e = -EPROTO;
      break;
    }
    l = reply->segments;
    if (n + l->n_segments > cap) {
      size_t ncap = cap ? cap : 16;
      gshm_segment_info_t *p;
      while (ncap < n + l->n_segments)
        ncap *= 2;
      if (!(p = realloc(arr, ncap * sizeof(*p)))) {
        gshm__reply__free_unpacked(reply, NULL);
        e = -ENOMEM;
        break;
      }
      arr = p;
      cap = ncap;
    }
    for (size_t i = 0; i < l->n_segments; i++)
      gshm__info_from_wire(&arr[n++], l->segments[i]);
    e = l->next && l->next <= after ? -EPROTO : 0; /* a cursor must advance */
    after = l->next;
    gshm__reply__free_unpacked(reply, NULL);
  } while (!e && after);
  pthread_mutex_unlock(&c->lock);
  if (e) {
    free(arr);
    return e;
  }
  *infos_out = arr;
  *count_out = n;
  return 0;
}

int gshm_pull(gshm_client_t *c, const char *peer, const char *name, const gshm_pull_opts_t *opts,
              gshm_pull_result_t *result_out) {
  Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  int e;

  if (!c || !peer || !name)
    return -EINVAL;
  m.peer = (char *)peer;
  m.name = (char *)name;
  if (opts) {
    m.local_name = (char *)(opts->local_name ? opts->local_name : "");
    m.location = (char *)(opts->location ? opts->location : "");
    m.mode = opts->mode;
  }
  pthread_mutex_lock(&c->lock);
  e = gshm__request(c, GSHM_WIRE_PULL, &m.base, &reply, NULL);
  /* Progress replies until the result (or an error status). */
  while (!e && reply->body_case == GSHM__REPLY__BODY_PULL_PROGRESS) {
    gshm_pull_progress_t pr = {.bytes_done = reply->pull_progress->bytes_done,
                               .bytes_total = reply->pull_progress->bytes_total,
                               .elapsed_ns = reply->pull_progress->elapsed_ns};
    gshm__reply__free_unpacked(reply, NULL);
    reply = NULL;
    if (opts && opts->progress)
      opts->progress(&pr, opts->progress_arg);
    e = gshm__request_more(c, GSHM_WIRE_PULL, &reply);
  }
  pthread_mutex_unlock(&c->lock);
  if (e)
    return e;
  if (reply->body_case != GSHM__REPLY__BODY_PULL_RESULT || !reply->pull_result->segment) {
    gshm__reply__free_unpacked(reply, NULL);
    return -EPROTO;
  }
  if (result_out) {
    const Gshm__PullResult *r = reply->pull_result;
    memset(result_out, 0, sizeof(*result_out));
    gshm__info_from_wire(&result_out->segment, r->segment);
    result_out->bytes = r->bytes;
    result_out->elapsed_ns = r->elapsed_ns;
    snprintf(result_out->path, sizeof(result_out->path), "%s", r->path);
    snprintf(result_out->path_reason, sizeof(result_out->path_reason), "%s", r->path_reason);
    snprintf(result_out->peer, sizeof(result_out->peer), "%s", r->peer);
    result_out->remote_id = r->remote_id;
    result_out->remote_generation = r->remote_generation;
  }
  gshm__reply__free_unpacked(reply, NULL);
  return 0;
}
