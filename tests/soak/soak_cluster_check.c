/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster soak's checks (soak_cluster.h): what a node holds against
 * what was published and pulled, and its level once quiet. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "soak_cluster.h"

/* Version v's shape: its segment count, and segment i's size (log-uniform
 * 1 byte .. 4 MiB) and bytes, all from the seed. */
int version_count(int v) {
  uint64_t s = seed * 7919 + (uint64_t)v * 104729 + 1;
  for (int k = 0; k < 3; k++)
    rnd(&s);
  return 20 + (int)(rnd(&s) % (MAX_SEGS - 19));
}

uint64_t seg_size(int v, int i) {
  uint64_t s = seed * 1000003 + (uint64_t)v * 4099 + (uint64_t)i * 131 + 7, e;
  for (int k = 0; k < 3; k++)
    rnd(&s);
  e = rnd(&s) % 23; /* 2^0 .. 2^22 */
  return 1 + rnd(&s) % (1ull << e);
}

unsigned long long seg_seed(int v, int i) {
  return seed * 2654435761ull + (unsigned long long)v * 65537 + (unsigned long long)i;
}

/* Whether the segment s (size bytes) holds version v's segment i bytes. */
bool bytes_ok(gshm_segment_t *s, int v, int i) {
  uint64_t size = seg_size(v, i);
  uint8_t *want = malloc(size);
  void *p;
  bool ok;
  if (!want)
    return false;
  harness_random(want, size, seg_seed(v, i));
  ok = gshm_map(s, NULL, 0, &p) == 0 && memcmp(p, want, size) == 0;
  free(want);
  return ok;
}

/* "a:model/v12/s034#77.1" -> v 12, i 34, id 77, generation 1. */
static bool parse_source(const char *src, int *v, int *i, uint64_t *id, uint64_t *gen) {
  return sscanf(src, "a:model/v%d/s%d#%" SCNu64 ".%" SCNu64, v, i, id, gen) == 4 && *v >= 0 &&
         *v < MAX_VERSIONS && *i >= 0 && *i < MAX_SEGS;
}

/* The source says a segment of a version we published, with A's id. */
bool source_ok(const gshm_segment_info_t *s, int *v, int *i) {
  uint64_t id, gen;
  if (!parse_source(s->source, v, i, &id, &gen))
    return false;
  return *i < sh->v[*v].n && sh->v[*v].id[*i] == id && sh->v[*v].gen[*i] == gen &&
         s->requested_size == seg_size(*v, *i);
}

gshm_client_t *conn(int node) {
  gshm_client_t *c = NULL;
  int e = gshm_connect(nodes[node].h.socket_path, "soak-parent", &c);
  EXPECT(e == 0, "connect to %s: %s", node_names[node], gshm_strerror(e));
  return e ? NULL : c;
}

/* A replaced prefix (cur/, rcur/): every name of a version present holds
 * it or a newer one.  names[i]: the version under PREFIXsIII. */
static void check_replaced(int node, const char *prefix, const struct seen *names) {
  for (int i = 0; i < MAX_SEGS; i++) {
    int v = names[i].v;
    if (v < 0)
      continue;
    for (int j = 0; j < sh->v[v].n; j++)
      EXPECT(j == sh->v[v].damaged || names[j].v >= v,
             "%s %s: s%03d holds v%d, s%03d holds %d (a part of v%d's set)", node_names[node],
             prefix, i, v, j, names[j].v, v);
  }
}

/* A set under x<k>/: version v's names, all (less the one unlinked on A)
 * or none; none where the pull failed. */
static void check_set(int node, int k, const struct seen *names, int count) {
  struct attempt *at = &sh->at[k];
  int v = at->kind == K_RELAY ? sh->at[at->from].version : at->version, missing = 0;

  if (!count)
    return;
  EXPECT(!at->cleaned, "%s: %d names under %s, unlinked by the soak", node_names[node], count,
         at->local);
  EXPECT(at->running || at->unknown || !at->err,
         "%s: %d names under %s, whose pull failed: %s (%s)", node_names[node], count, at->local,
         gshm_strerror(at->err), at->msg);
  for (int j = 0; j < sh->v[v].n; j++)
    missing += names[j].v != v;
  EXPECT(count == sh->v[v].n - missing, "%s: %s holds %d names, %d of them v%d's",
         node_names[node], at->local, count, sh->v[v].n - missing, v);
  EXPECT(missing == 0 || (missing == 1 && sh->v[v].damaged >= 0 && names[sh->v[v].damaged].v < 0),
         "%s: %s holds %d names of v%d's %d (a part of the set)", node_names[node], at->local,
         count, v, sh->v[v].n);
  EXPECT(at->running || at->unknown || at->err || (uint32_t)count == at->count,
         "%s: %s holds %d names, its pull gave %u", node_names[node], at->local, count, at->count);
}

/* Checks every pulled segment of node: names, sources, sets; the bytes of
 * each (all) or of a few. */
void check_node(int node, bool all) {
  static struct seen names[MAX_ATTEMPTS + 2][MAX_SEGS];
  static int counts[MAX_ATTEMPTS + 2];
  gshm_client_t *c = conn(node);
  gshm_segment_info_t *v = NULL;
  size_t n = 0;
  unsigned sampled = 0;

  if (!c)
    return;
  memset(names, 0xff, sizeof(names));
  memset(counts, 0, sizeof(counts));
  EXPECT(gshm_list(c, &v, &n) == 0, "list %s", node_names[node]);
  for (size_t k = 0; k < n; k++) {
    const gshm_segment_info_t *s = &v[k];
    int ver, i, slot, idx, at;
    if (s->unlinked || !strncmp(s->name, "model/", 6))
      continue;
    if (sscanf(s->name, "x%d/s%d", &at, &idx) == 2 && at >= 0 && at < nattempts &&
        sh->at[at].node == node)
      slot = at;
    else if (sscanf(s->name, "cur/s%d", &idx) == 1 && node == NB)
      slot = MAX_ATTEMPTS;
    else if (sscanf(s->name, "rcur/s%d", &idx) == 1 && node == NC)
      slot = MAX_ATTEMPTS + 1;
    else {
      EXPECT(0, "%s: a segment '%s' no pull made", node_names[node], s->name);
      continue;
    }
    if (!source_ok(s, &ver, &i) || i != idx || idx >= MAX_SEGS) {
      EXPECT(0, "%s: '%s' has source '%s' (size %" PRIu64 ")", node_names[node], s->name,
             s->source, s->requested_size);
      continue;
    }
    names[slot][idx] = (struct seen){ver, s->id};
    counts[slot]++;
    if (all || pick(n) < 4) { /* every byte, or about four segments a check */
      gshm_segment_t *seg;
      int e = gshm_open(c, s->name, GSHM_ACCESS_READ, &seg);
      if (e == -ENOENT && slot < MAX_ATTEMPTS && sh->at[slot].running)
        continue;
      EXPECT(e == 0, "%s: open '%s': %s", node_names[node], s->name, gshm_strerror(e));
      if (e)
        continue;
      /* a name replaced between the list and the open is another segment */
      if (gshm_segment_info(seg)->id == s->id)
        EXPECT(bytes_ok(seg, ver, i), "%s: '%s' (v%d s%03d) has wrong bytes", node_names[node],
               s->name, ver, i);
      gshm_close(seg);
      sampled++;
    }
  }
  gshm_free(v);
  gshm_disconnect(c);
  for (int k = 0; k < nattempts; k++)
    if (sh->at[k].node == node)
      check_set(node, k, names[k], counts[k]);
  check_replaced(node, node == NB ? "cur/" : "rcur/", names[node == NB ? MAX_ATTEMPTS
                                                                        : MAX_ATTEMPTS + 1]);
  checks++;
  bytes_checked_segs += sampled;
}

/* Unlinks the names under prefix on node; returns how many. */
int unlink_prefix(int node, const char *prefix) {
  gshm_client_t *c = conn(node);
  gshm_segment_info_t *v = NULL;
  size_t n = 0;
  int k = 0;
  if (!c)
    return 0;
  if (gshm_list(c, &v, &n) == 0)
    for (size_t i = 0; i < n; i++)
      if (!v[i].unlinked && !strncmp(v[i].name, prefix, strlen(prefix)))
        k += gshm_unlink(c, v[i].name) == 0;
  gshm_free(v);
  gshm_disconnect(c);
  return k;
}

/* Node's (name, id) of every live segment, sorted by the listing. */
char *snapshot(int node) {
  gshm_client_t *c = conn(node);
  gshm_segment_info_t *v = NULL;
  size_t n = 0, len = 0;
  char *out = calloc(1, 1);
  if (!c)
    return out;
  if (gshm_list(c, &v, &n) == 0)
    for (size_t i = 0; i < n; i++) {
      char line[400];
      int l;
      if (v[i].unlinked)
        continue;
      l = snprintf(line, sizeof(line), "%s#%" PRIu64 ".%" PRIu64 "\n", v[i].name, v[i].id,
                   v[i].generation);
      out = realloc(out, len + (size_t)l + 1);
      memcpy(out + len, line, (size_t)l + 1);
      len += (size_t)l;
    }
  gshm_free(v);
  gshm_disconnect(c);
  return out;
}

/* Prints node's fds (where they point), for a level that did not come back. */
static void print_fds(int node) {
  char dir[64], path[400], target[256];
  struct dirent *d;
  DIR *dp;
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)nodes[node].h.sp.pid);
  if (!(dp = opendir(dir)))
    return;
  while ((d = readdir(dp))) {
    ssize_t n;
    snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
    n = readlink(path, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = '\0';
    if (d->d_name[0] != '.')
      fprintf(stderr, "  %s fd %s -> %s\n", node_names[node], d->d_name, target);
  }
  closedir(dp);
}

int own_fds(int node) {
  return harness_stable_fd_count(nodes[node].h.sp.pid) - harness_store_bucket_fds(&nodes[node].h);
}

/* Every node empty (no segment, no byte) and its fds at their warm level,
 * within 20 s (leases and links end a moment later), or 10 s past the
 * grace period of its last restart (GSHMD_RESTART_GRACE_MS, 30 s: until it
 * ends gshmd keeps the unlinked segments it adopted for holders that have
 * not reconnected yet). */
void check_quiet(const char *when, bool fds_too) {
  for (int node = NA; node <= NC; node++) {
    gshm_status_info_t st = {0};
    int fds = 0;
    int64_t until = ms() + 20000;
    if (until < last_restart_ms[node] + 40000)
      until = last_restart_ms[node] + 40000;
    while (ms() < until) {
      gshm_client_t *c = conn(node);
      if (c) {
        gshm_status(c, &st);
        gshm_disconnect(c);
      }
      fds = own_fds(node);
      if (st.segments == 0 && st.bytes == 0 && (!fds_too || fds <= fds_base[node]))
        break;
      usleep(100000);
    }
    EXPECT(st.segments == 0 && st.bytes == 0, "%s: %s holds %u segments, %" PRIu64 " bytes", when,
           node_names[node], st.segments, st.bytes);
    if (st.segments || st.bytes) { /* who holds them */
      static const char *const verbs[][2] = {{"segments", NULL}, {"mappings", NULL},
                                             {"clients", NULL}, {"peers", NULL}};
      for (size_t v = 0; v < sizeof(verbs) / sizeof(verbs[0]); v++) {
        char *out = NULL;
        harness_gshmctl(&nodes[node].h, &out, verbs[v]);
        fprintf(stderr, "-- %s gshmctl %s:\n%.6000s\n", node_names[node], verbs[v][0],
                out ? out : "");
        free(out);
      }
    }
    EXPECT(!fds_too || fds <= fds_base[node], "%s: %s holds %d fds, %d after warm-up", when,
           node_names[node], fds, fds_base[node]);
    if (fds_too && fds > fds_base[node])
      print_fds(node);
  }
}

/* Every node's links to both peers up (a node started before its peers
 * links to them at its next retry, 5 s on), and their lanes a moment
 * later: the level of fds the soak's end is compared with. */
void wait_mesh(void) {
  int up = 0;
  for (int64_t until = ms() + 15000; ms() < until && up < 6; usleep(50000)) {
    up = 0;
    for (int node = NA; node <= NC; node++) {
      gshm_client_t *c = conn(node);
      gshm_cluster_peer_t *p = NULL;
      size_t n = 0;
      if (c && gshm_cluster_peers(c, NULL, &p, &n) == 0)
        for (size_t i = 0; i < n; i++)
          up += !strcmp(p[i].state, "up");
      gshm_free(p);
      if (c)
        gshm_disconnect(c);
    }
  }
  EXPECT(up == 6, "%d of the 6 links up after 15 s", up);
  usleep(1000000);
}

/* Whether node's daemon has a pull of (peer, remote prefix) in flight:
 * *listed set when its listing is done. */
bool in_flight(int node, int peer, const char *prefix, bool *listed) {
  gshm_client_t *c = conn(node);
  gshm_cluster_pull_t *p = NULL;
  size_t n = 0;
  bool found = false;
  if (!c)
    return false;
  if (gshm_cluster_pulls(c, &p, &n) == 0)
    for (size_t k = 0; k < n; k++)
      if (!strcmp(p[k].peer, node_names[peer]) && !strcmp(p[k].name, prefix)) {
        found = true;
        if (listed)
          *listed = p[k].segments_total > 0;
      }
  gshm_free(p);
  gshm_disconnect(c);
  return found;
}
