/* SPDX-License-Identifier: Apache-2.0 */
/* Cluster soak: three real gshmd (A, B, C), each the others' peer, 4 KiB
 * pages.  The parent publishes sets of host segments on A (model/vN/sIII:
 * 20-300 segments of 1 byte..4 MiB, bytes recomputable from the seed),
 * and pulling clients (forked processes) run set pulls: B from A, C from
 * A, C from B while B is still pulling the set (a relay) or once it has,
 * B's cur/ replaced (--replace) by newer versions and C's rcur/ replaced
 * from B's cur/.  At random moments the parent SIGKILLs a pulling client,
 * SIGKILLs and restarts a node through the harness's fd store (A, a
 * relaying B, or a puller), unlinks a source segment on A while a pull
 * reads its set, and SIGSTOPs the peer of a pull just started for
 * FREEZE_MS.  Checked throughout and at the end:
 *   - a pulled set is all there or not at all: every name of its version
 *     (less one unlinked on A) or none, also after node restarts; a pull
 *     that failed (its node not restarted meanwhile) left no name; in
 *     cur/ and rcur/ every name of a version present holds it or a newer;
 *   - every byte of every visible pulled segment is its source's (the
 *     pulling client checks what it got; the parent samples, and at the
 *     end reads everything), its source id and generation those of A;
 *   - no pull goes without progress for long (HANG_MS), a pull reading
 *     a SIGSTOPped peer has ended before its SIGCONT (cluster.
 *     request_timeout_ms is TIMEOUT_MS), failures carry an expected errno
 *     and a message, all pulls end once the chaos stops;
 *   - after everything is unlinked each gshmd holds no segment and no
 *     byte, its fds are back to their level after warm-up, no gshmd
 *     crashed (exit status of each kill and of the final SIGTERM).
 * Prints the figures.
 *
 *   test_soak_cluster [--seconds N] [--seed N] */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "soak_cluster.h"

struct shared *sh;
uint64_t seed;
struct node nodes[3];
const char *const node_names[] = {"a", "b", "c"};
int nversions, nattempts, failures;
int64_t last_restart_ms[3] = {-100000, -100000, -100000};
unsigned checks, bytes_checked_segs;
int fds_base[3];
uint64_t prng; /* the parent's choices */
static const char *const kind_name[] = {"fresh", "cur", "relay", "rcur"};
static int seconds = 60;
static struct cluster_keys keys;
static unsigned restarts[3];
static int64_t max_gap_ms, t0_ms;
static unsigned kills, unlinks, hangs, relay_cuts, freezes;
static int frozen = -1; /* the node SIGSTOPped now, until thaw_at */
static int64_t thaw_at;
static void reap(void);

/* SIGCONT the frozen node: every pull that read it since the SIGSTOP has
 * ended by now (failed, as its requests went unanswered for longer than
 * TIMEOUT_MS, or done where its last bytes were in). */
static void thaw(void) {
  reap();
  for (int k = 0; k < nattempts; k++)
    EXPECT(!sh->at[k].running || !sh->at[k].frozen_peer,
           "pull %d (%s <- %s:%s) still runs %d ms after its peer stopped answering "
           "(request_timeout_ms %d)",
           k, node_names[sh->at[k].node], node_names[sh->at[k].peer], sh->at[k].prefix, FREEZE_MS,
           TIMEOUT_MS);
  kill(nodes[frozen].h.sp.pid, SIGCONT);
  frozen = -1;
}

unsigned pick(unsigned n) { return n ? (unsigned)(rnd(&prng) % n) : 0; }

/* ---- a pulling client (a forked process: _exit only, no cmocka) ---- */

static void on_progress(const gshm_pull_progress_t *p, void *arg) {
  struct attempt *at = arg;
  atomic_store(&at->progress_total, p->bytes_total);
  if (p->bytes_done != atomic_load(&at->progress_bytes)) {
    atomic_store(&at->progress_bytes, p->bytes_done);
    atomic_store(&at->progress_ms, ms());
  }
}

static void pull_child(struct attempt *at) {
  gshm_pull_opts_t po = {.local_name = at->local, .mode = 0644, .progress = on_progress,
                         .progress_arg = at, .replace = at->kind == K_CUR || at->kind == K_RCUR};
  gshm_pull_result_t *r = NULL;
  gshm_client_t *c;
  size_t n = 0;
  int e;

  if ((e = gshm_connect(nodes[at->node].h.socket_path, "soak-pull", &c))) {
    at->err = e;
    snprintf(at->msg, sizeof(at->msg), "connect: %s", gshm_strerror(e));
    _exit(0);
  }
  e = gshm_pull_prefix(c, node_names[at->peer], at->prefix, &po, &r, &n);
  at->err = e;
  snprintf(at->msg, sizeof(at->msg), "%s", e ? gshm_last_error(c) : "");
  at->count = (uint32_t)n;
  for (size_t k = 0; k < n; k++) { /* read what the pull gave: every byte */
    gshm_segment_t *s;
    int v, i, oe;
    at->bytes += r[k].bytes;
    at->relayed += r[k].relayed != 0;
    if (!source_ok(&r[k].segment, &v, &i)) {
      at->bad++;
      snprintf(at->msg, sizeof(at->msg), "'%s': source '%s' is none of A's", r[k].segment.name,
               r[k].segment.source);
      continue;
    }
    if ((oe = gshm_open(c, r[k].segment.name, GSHM_ACCESS_READ, &s))) {
      if (oe != -ECONNRESET && oe != -EPIPE && oe != -ENOTCONN) { /* its node restarted: skip */
        at->bad++;
        snprintf(at->msg, sizeof(at->msg), "'%s' pulled, then open: %s", r[k].segment.name,
                 gshm_strerror(oe));
      }
      continue;
    }
    if (gshm_segment_info(s)->id == r[k].segment.id && !bytes_ok(s, v, i)) {
      at->bad++;
      snprintf(at->msg, sizeof(at->msg), "'%s' (v%d s%03d) has wrong bytes", r[k].segment.name,
               v, i);
    }
    gshm_close(s);
  }
  gshm_free(r);
  gshm_disconnect(c);
  _exit(0);
}

/* ---- the parent ---- */

static void publish(void) {
  int v = nversions;
  struct version *ver = &sh->v[v];
  gshm_client_t *c = conn(NA);
  char name[64];

  if (!c || v >= MAX_VERSIONS)
    goto out;
  ver->n = version_count(v);
  ver->damaged = -1;
  for (int i = 0; i < ver->n; i++) {
    uint64_t size = seg_size(v, i);
    uint8_t *buf = malloc(size);
    gshm_segment_t *s;
    int e;
    snprintf(name, sizeof(name), "model/v%d/s%03d", v, i);
    e = gshm_create(c, name, size, "host", 0644, 0, &s);
    EXPECT(e == 0, "create %s on A: %s", name, gshm_strerror(e));
    if (e || !buf) {
      free(buf);
      goto out;
    }
    harness_random(buf, size, seg_seed(v, i));
    EXPECT(gshm_write(s, 0, buf, size) == 0, "write %s", name);
    ver->id[i] = gshm_segment_info(s)->id;
    ver->gen[i] = gshm_segment_info(s)->generation;
    gshm_close(s);
    free(buf);
  }
  ver->state = V_PUBLISHED;
  nversions++;
out:
  if (c)
    gshm_disconnect(c);
}

/* Whether attempt at may still read its peer: running, or killed a moment
 * ago (its daemon ends the pull once it sees the requester gone). */
static bool reading(const struct attempt *at) {
  return at->running || (at->killed && ms() - at->end_ms < 15000);
}

/* Whether an attempt reads A's version v. */
static bool version_busy(int v) {
  for (int k = 0; k < nattempts; k++)
    if (reading(&sh->at[k]) && sh->at[k].peer == NA && sh->at[k].version == v)
      return true;
  return false;
}

static void retire(int v) {
  gshm_client_t *c = conn(NA);
  char name[64];
  if (!c)
    return;
  for (int i = 0; i < sh->v[v].n; i++) {
    snprintf(name, sizeof(name), "model/v%d/s%03d", v, i);
    if (i != sh->v[v].damaged)
      EXPECT(gshm_unlink(c, name) == 0, "unlink %s on A", name);
  }
  sh->v[v].state = V_RETIRED;
  gshm_disconnect(c);
}

static int start_pull(int node, int peer, int kind, int version, int from) {
  struct attempt *at;
  int k = nattempts;
  pid_t pid;

  if (k >= MAX_ATTEMPTS)
    return -1;
  at = &sh->at[k];
  memset(at, 0, sizeof(*at));
  *at = (struct attempt){.node = node, .peer = peer, .kind = kind, .version = version,
                         .from = from, .running = 1, .restarts0 = restarts[node],
                         .start_ms = ms()};
  atomic_store(&at->progress_ms, at->start_ms);
  if (kind == K_RELAY)
    memcpy(at->prefix, sh->at[from].local, sizeof(at->prefix));
  else if (kind == K_RCUR)
    snprintf(at->prefix, sizeof(at->prefix), "cur/");
  else
    snprintf(at->prefix, sizeof(at->prefix), "model/v%d/", version);
  snprintf(at->local, sizeof(at->local), "%s",
           kind == K_CUR ? "cur/" : kind == K_RCUR ? "rcur/" : "");
  if (!at->local[0])
    snprintf(at->local, sizeof(at->local), "x%d/", k);
  nattempts++;
  pid = fork(); /* (not into at->pid in the child: the memory is shared) */
  if (pid == 0)
    pull_child(at);
  at->pid = pid;
  EXPECT(pid > 0, "fork: %s", strerror(errno));
  at->running = pid > 0;
  return k;
}

/* Expected errors of a pull under this chaos. */
static bool expected_error(const struct attempt *at) {
  switch (-at->err) {
  case ECONNRESET: case ETIMEDOUT: case ENOENT: case ESTALE: case ECONNREFUSED: case EPIPE:
  case ENOTCONN:
    return true;
  case EEXIST: /* the request resent to its restarted node, after the first publish */
    return at->unknown;
  default:
    return false;
  }
}

static void finish(struct attempt *at, int status) {
  at->running = 0;
  at->end_ms = ms();
  at->unknown |= at->killed || restarts[at->node] != at->restarts0;
  if (at->killed)
    return;
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pull client %d: status %#x",
         (int)(at - sh->at), status);
  EXPECT(!at->bad, "%s pull %d (%s <- %s:%s): %u bad segments: %s", kind_name[at->kind],
         (int)(at - sh->at), node_names[at->node], node_names[at->peer], at->prefix, at->bad,
         at->msg);
  if (at->err)
    EXPECT(expected_error(at) && at->msg[0], "%s pull %d (%s <- %s:%s): %s (%s)",
           kind_name[at->kind], (int)(at - sh->at), node_names[at->node], node_names[at->peer],
           at->prefix, gshm_strerror(at->err), at->msg);
}

static void reap(void) {
  for (int k = 0; k < nattempts; k++) {
    struct attempt *at = &sh->at[k];
    int status;
    int64_t gap;
    if (!at->running)
      continue;
    if (waitpid(at->pid, &status, WNOHANG) == at->pid) {
      finish(at, status);
      continue;
    }
    gap = ms() - atomic_load(&at->progress_ms);
    if (gap > max_gap_ms)
      max_gap_ms = gap;
    if (gap > HANG_MS) {
      EXPECT(0, "%s pull %d (%s <- %s:%s) made no progress for %" PRId64 " ms", kind_name[at->kind],
             k, node_names[at->node], node_names[at->peer], at->prefix, gap);
      hangs++;
      at->killed = 1;
      kill(at->pid, SIGKILL);
    }
  }
}

/* SIGKILL node and start it again from its fd store; it must have been
 * alive (a crash shows as another status). */
static void restart(int node) {
  int st = gshm__spawn_stop(&nodes[node].h.sp, SIGKILL);
  EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "gshmd %s had died before its kill: %#x",
         node_names[node], st);
  restarts[node]++;
  last_restart_ms[node] = ms();
  EXPECT(harness_restart(&nodes[node].h, SIGKILL, nodes[node].argv) == 0,
         "gshmd %s did not come back", node_names[node]);
}

/* ---- the invariants, on a node's listing ---- */

/* Copies done: at most two per node stay (memory), the oldest go first;
 * one a relay reads stays. */
static void clean_copies(void) {
  for (int node = NB; node <= NC; node++) {
    int live = 0;
    for (int k = nattempts - 1; k >= 0; k--) {
      struct attempt *at = &sh->at[k];
      bool read = false;
      if (at->node != node || at->running || at->unknown || at->err || at->cleaned ||
          at->kind == K_CUR || at->kind == K_RCUR || ++live <= 2)
        continue;
      for (int j = 0; j < nattempts; j++)
        read |= reading(&sh->at[j]) && sh->at[j].kind == K_RELAY && sh->at[j].from == k;
      if (read)
        continue;
      at->cleaned = 1;
      unlink_prefix(node, at->local);
    }
  }
}

/* ---- the run ---- */

static int running(void) {
  int n = 0;
  for (int k = 0; k < nattempts; k++)
    n += sh->at[k].running;
  return n;
}

static int last_cur[3] = {-1, -1, -1}, cur_attempt[3] = {-1, -1, -1};

/* Whether the last pull into node's cur/ (rcur/) is over, in its daemon
 * too (a killed requester's pull ends a moment later). */
static bool cur_free(int node) {
  int k = cur_attempt[node];
  return k < 0 || (!sh->at[k].running && !in_flight(node, sh->at[k].peer, sh->at[k].prefix, NULL));
}

/* C reads a B pull through B while B pulls it, once B lists it. */
static void relay_now(void) {
  for (int k = 0; k < nattempts; k++) {
    struct attempt *at = &sh->at[k];
    bool listed = false;
    if (!at->relay_wanted || !at->running)
      continue;
    if (in_flight(NB, NA, at->prefix, &listed) && listed) {
      at->relay_wanted = 0;
      start_pull(NC, NB, K_RELAY, -1, k);
    }
  }
}

static void maybe_pull(void) {
  int pub[MAX_VERSIONS], np = 0, r = (int)pick(100), v;

  if (running() >= MAX_RUNNING)
    return;
  for (int i = 0; i < nversions; i++)
    if (sh->v[i].state == V_PUBLISHED)
      pub[np++] = i;
  if (!np)
    return;
  v = pub[pick((unsigned)np)];
  if (r < 30) {
    int k = start_pull(NB, NA, K_FRESH, v, -1);
    if (k >= 0)
      sh->at[k].relay_wanted = pick(2);
  } else if (r < 45) {
    start_pull(NC, NA, K_FRESH, v, -1);
  } else if (r < 60 && pub[np - 1] > last_cur[NB] && cur_free(NB)) {
    last_cur[NB] = pub[np - 1];
    cur_attempt[NB] = start_pull(NB, NA, K_CUR, pub[np - 1], -1);
  } else if (r < 70 && last_cur[NB] >= 0 && cur_free(NC)) {
    cur_attempt[NC] = start_pull(NC, NB, K_RCUR, -1, -1);
  } else { /* C from one of B's sets: one B is pulling (a relay) or has */
    for (int k = nattempts - 1; k >= 0; k--) {
      struct attempt *at = &sh->at[k];
      bool listed = false;
      if (at->node != NB || at->kind != K_FRESH || at->cleaned || (!at->running && at->err))
        continue;
      if (at->running && !(in_flight(NB, NA, at->prefix, &listed) && listed))
        continue; /* not listed yet: C would find nothing there */
      start_pull(NC, NB, K_RELAY, -1, k);
      break;
    }
  }
}

enum { T_ANY, T_RELAY, T_FROM_A, T_YOUNG };

/* Whether attempt at suits a chaos event of that aim. */
static bool suits(const struct attempt *at, int aim) {
  if (!at->running || at->killed)
    return false;
  if (aim == T_RELAY)
    return at->kind == K_RELAY;
  if (aim == T_YOUNG) /* its requests to the peer not all sent yet */
    return ms() - at->start_ms < 40;
  if (aim == T_FROM_A)
    return at->peer == NA && sh->v[at->version].damaged < 0 &&
           sh->v[at->version].state == V_PUBLISHED;
  return true;
}

/* A running attempt to aim at: mid-pull (some bytes in, not all) where
 * one is; after `patience` ms of none, any that suits; -1 when none. */
static int target(int aim, bool patient) {
  int mid[MAX_ATTEMPTS], nmid = 0, any = -1;
  for (int k = 0; k < nattempts; k++) {
    struct attempt *at = &sh->at[k];
    uint64_t done = atomic_load(&at->progress_bytes);
    if (!suits(at, aim))
      continue;
    any = k;
    if (done > 0 && done < atomic_load(&at->progress_total))
      mid[nmid++] = k;
  }
  if (aim == T_YOUNG)
    return any;
  return nmid ? mid[pick((unsigned)nmid)] : patient ? -1 : any;
}

/* One chaos event (r: which), aimed at a pull in progress; false while
 * none suits (it waits for one: `patient` for one mid-pull). */
static bool chaos(int r, bool patient) {
  int aim = r < 30 ? T_ANY : r < 45 ? T_FROM_A : r < 60 ? T_RELAY : r < 86 ? T_ANY : T_YOUNG;
  int k = target(aim, patient);
  struct attempt *at;

  if (k < 0 && aim == T_RELAY && !patient) /* no relay now: B while it pulls */
    k = target(T_ANY, false);
  if (k < 0)
    return false;
  at = &sh->at[k];
  printf("soak_cluster: %7.3f s: %s %s pull %d (%s <- %s:%s) at %" PRIu64 " of %" PRIu64
         " bytes\n", (double)(ms() - t0_ms) / 1e3,
         r < 30 ? "SIGKILL the client of" : r < 45 ? "unlink a source segment of"
         : r < 60 ? "restart b under" : r < 72 ? "restart the puller of"
         : r < 86 ? "restart the peer of" : "SIGSTOP the peer of",
         kind_name[at->kind], k, node_names[at->node], node_names[at->peer], at->prefix,
         atomic_load(&at->progress_bytes), atomic_load(&at->progress_total));
  if (r < 30) { /* a pulling client */
    at->killed = 1;
    kill(at->pid, SIGKILL);
    kills++;
  } else if (r < 45) { /* a source segment, while a pull reads its set */
    struct version *ver = &sh->v[at->version];
    gshm_client_t *c = conn(NA);
    char name[64];
    if (!c)
      return true;
    ver->damaged = (int)pick((unsigned)ver->n);
    snprintf(name, sizeof(name), "model/v%d/s%03d", at->version, ver->damaged);
    EXPECT(gshm_unlink(c, name) == 0, "unlink %s on A", name);
    gshm_disconnect(c);
    unlinks++;
  } else if (r < 60) { /* the relaying node (C reads through it, where a relay runs) */
    relay_cuts += at->kind == K_RELAY;
    restart(NB);
  } else if (r < 72) { /* the pulling node, or the one it reads */
    restart(at->node);
  } else if (r < 86) {
    restart(at->peer);
  } else { /* the peer stops answering: pulls reading it must time out */
    frozen = at->peer;
    thaw_at = ms() + FREEZE_MS;
    kill(nodes[frozen].h.sp.pid, SIGSTOP);
    for (int j = 0; j < nattempts; j++)
      sh->at[j].frozen_peer = sh->at[j].running && sh->at[j].peer == frozen;
    freezes++;
  }
  return true;
}

/* Waits for every pull to end (HANG_MS each at most, reap kills hangs). */
static void drain(void) {
  while (running()) {
    reap();
    usleep(20000);
  }
}

static int group_setup(void **state) {
  char peers[3][160];
  (void)state;
  keys_make(&keys, "gshm-soakc");
  for (int i = 0; i < 3; i++)
    nodes[i].port = free_port();
  for (int i = 0; i < 3; i++) {
    int j = (i + 1) % 3, k = (i + 2) % 3;
    snprintf(peers[i], sizeof(peers[i]), "%s=127.0.0.1:%d,%s=127.0.0.1:%d", node_names[j],
             nodes[j].port, node_names[k], nodes[k].port);
  }
  for (int i = 0; i < 3; i++)
    node_start(&nodes[i], node_names[i], peers[i], keys.key, i == NA ? "model/*" : "*",
               "cluster.request_timeout_ms=3000", "cluster.pull_chunk=256K", "cluster.streams=2",
               "daemon.host_huge_pages=false", "daemon.log_level=warning", NULL);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = NC; i >= NA; i--) {
    int st = harness_stop(&nodes[i].h);
    EXPECT(st == 0, "gshmd %s exited with status %#x at its SIGTERM", node_names[i], st);
  }
  keys_remove(&keys);
  return failures ? -1 : 0;
}

static void test_soak_cluster(void **state) {
  int64_t start, end, next_chaos, next_check, next_pull, next_publish, t_end;
  int chaos_r = -1;
  uint64_t bytes = 0;
  unsigned ok = 0, relayed_ok = 0, unknown = 0, by_err[256] = {0}, by_kind[4] = {0};
  static char first_msg[256][160];
  (void)state;

  prng = seed | 1;
  printf("soak_cluster: %d s, seed %" PRIu64 " (--seed %" PRIu64 " replays its choices)\n", seconds,
         seed, seed);
  /* warm-up: every direction once, then the fd levels with nothing held */
  publish();
  start_pull(NB, NA, K_FRESH, 0, -1);
  drain();
  start_pull(NC, NB, K_RELAY, -1, 0);
  start_pull(NC, NA, K_FRESH, 0, -1);
  drain();
  for (int k = 0; k < nattempts; k++) {
    EXPECT(sh->at[k].err == 0, "warm-up pull %d: %s (%s)", k, gshm_strerror(sh->at[k].err),
           sh->at[k].msg);
    check_node(sh->at[k].node, true);
  }
  for (int k = 0; k < nattempts; k++) {
    unlink_prefix(sh->at[k].node, sh->at[k].local);
    sh->at[k].cleaned = 1;
  }
  retire(0);
  check_quiet("after warm-up", false);
  wait_mesh();
  for (int node = NA; node <= NC; node++)
    fds_base[node] = own_fds(node);
  assert_int_equal(failures, 0);

  t0_ms = start = ms();
  end = start + seconds * 1000;
  next_chaos = start + 1000 + pick(2000);
  next_check = start + 2000;
  next_pull = next_publish = start;
  while (ms() < end || frozen >= 0) {
    int live = 0;
    reap();
    if (frozen >= 0) { /* nothing asks the frozen node: the parent would wait too */
      if (ms() >= thaw_at)
        thaw();
      usleep(20000);
      continue;
    }
    for (int i = 0; i < nversions; i++)
      live += sh->v[i].state == V_PUBLISHED;
    if (live < 2 || (live < 4 && ms() >= next_publish)) {
      publish();
      next_publish = ms() + 3000 + pick(5000);
    }
    for (int i = 0; i < nversions && live > 3; i++)
      if (sh->v[i].state == V_PUBLISHED && !version_busy(i) && i < nversions - 2) {
        retire(i);
        live--;
      }
    if (ms() >= next_pull) { /* about one a second: light on a 2-core CI machine */
      maybe_pull();
      next_pull = ms() + 300 + pick(1000);
    }
    if (chaos_r < 0)
      chaos_r = (int)pick(100);
    /* due: waits up to 2 s for a pull mid-way, then takes one that runs */
    if (ms() >= next_chaos && chaos(chaos_r, ms() < next_chaos + 2000)) {
      chaos_r = -1;
      next_chaos = ms() + 1000 + pick(3000);
    }
    if (frozen >= 0) /* a request to it would wait for the SIGCONT that this loop sends */
      continue;
    relay_now();
    if (ms() >= next_check) {
      check_node(NB, false);
      check_node(NC, false);
      clean_copies();
      next_check = ms() + 2000 + pick(2000);
    }
    usleep(20000);
  }
  drain();
  t_end = ms();
  printf("soak_cluster: the last pull ended %.1f s after the chaos\n", (double)(t_end - end) / 1e3);
  /* quiescence: no pull left in any daemon */
  for (int node = NB; node <= NC; node++) {
    gshm_cluster_pull_t *p = NULL;
    size_t n = 1;
    for (int t = 0; t < 500 && n; t++) {
      gshm_client_t *c = conn(node);
      n = 0;
      if (c) {
        gshm_cluster_pulls(c, &p, &n);
        gshm_free(p);
        gshm_disconnect(c);
      }
      if (n)
        usleep(20000);
    }
    EXPECT(n == 0, "%s: %zu pulls still in flight 10 s after their requesters ended",
           node_names[node], n);
  }
  /* every byte; then once more after a SIGKILL and restart of each puller */
  for (int node = NB; node <= NC; node++) {
    char *before, *after;
    check_node(node, true);
    before = snapshot(node);
    restart(node);
    after = snapshot(node);
    EXPECT(!strcmp(before, after), "%s: the segments changed at a restart:\n%s-- after:\n%s",
           node_names[node], before, after);
    check_node(node, true);
    free(before);
    free(after);
  }
  for (int k = 0; k < nattempts; k++) {
    struct attempt *at = &sh->at[k];
    if (at->unknown)
      unknown++;
    else if (!at->err) {
      ok++;
      by_kind[at->kind]++;
      relayed_ok += at->relayed > 0;
      bytes += at->bytes;
    } else if (!by_err[-at->err & 255]++)
      snprintf(first_msg[-at->err & 255], sizeof(first_msg[0]), "%.159s", at->msg);
  }
  printf("soak_cluster: %d pulls: %u ok (fresh %u, cur %u, relay %u, rcur %u; %u read from a "
         "relay still pulling), %u killed or cut by their node's restart\n",
         nattempts, ok, by_kind[K_FRESH], by_kind[K_CUR], by_kind[K_RELAY], by_kind[K_RCUR],
         relayed_ok, unknown);
  for (int e = 1; e < 256; e++)
    if (by_err[e])
      printf("soak_cluster:   failed %u: %s (first: %s)\n", by_err[e], gshm_strerror(-e),
             first_msg[e]);
  printf("soak_cluster: %u client kills, restarts A %u B %u C %u, %u source unlinks mid-pull, "
         "%u restarts of B while C read through it, %u SIGSTOPs, %d versions published, %.1f MB "
         "pulled, %u checks (%u segments read), longest progress gap %" PRId64 " ms, %u hangs\n",
         kills, restarts[NA], restarts[NB], restarts[NC], unlinks, relay_cuts, freezes, nversions,
         (double)bytes / 1e6, checks, bytes_checked_segs, max_gap_ms, hangs);
  /* clean up: everything the soak made, then the nodes' levels */
  for (int node = NA; node <= NC; node++)
    unlink_prefix(node, "");
  check_quiet("at the end", true);
  printf("soak_cluster: final checks took %.1f s\n", (double)(ms() - t_end) / 1e3);
  EXPECT(ok > 0, "no pull succeeded");
  /* (the byte checks hold for a soak that read no segment) */
  EXPECT(checks > 0 && bytes_checked_segs > 0, "%u checks of the nodes, %u segments read: no "
         "byte was checked", checks, bytes_checked_segs);
  assert_int_equal(failures, 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak_cluster)};

  seed = (uint64_t)time(NULL);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: %s [--seconds N] [--seed N]\n", argv[0]);
      return 2;
    }
  }
  if (seconds < 1 || !seed)
    return 2;
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0); /* the events so far, even when ctest's timeout ends it */
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return 1;
  return NODES_RUN(tests, group_setup, group_teardown);
}
