/* SPDX-License-Identifier: Apache-2.0 */
/* A serving peer that holds the cluster key and lies (rogue.h): the lists
 * and grants it answers carry names with "..", a leading "/", control
 * bytes, over 255 bytes or a NUL inside, names twice, sizes of 0 or
 * beyond any limit, malformed locations, more entries than a page, a
 * grant for another segment (or for another one than it listed under
 * that name: -ESTALE).  The pulling gshmd refuses each with an
 * error that names the peer, leaves nothing behind (no segment, hidden or
 * not, no bytes counted) and stays up; for set pulls (gshm_pull_prefix)
 * and single ones (gshm_pull).
 *
 * A second rogue, "rl", takes data lanes (CAP_LANES) and lies on them: it
 * sends part of a data frame on a lane and nothing more while it keeps
 * the link's control connection busy (the pull fails once the link's
 * request timeout passes without a byte), or answers with an error a
 * request whose frame a lane has claimed (refused as a protocol error). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "gshm.pb-c.h"
#include "harness.h"
#include "link.h"
#include "nodes.h"
#include "rogue.h"
#include "util.h"
#include "wire.h"

static struct cluster_keys keys;
static struct node P; /* pulls from the rogues, nodes "rs" and "rl" */
static struct rogue rs;
static int lfd;
static char long_name[300];
/* the rogue that takes data lanes (P opens cluster.streams = 2 to it) */
#define RL_LANES 2
#define RL_FRAME (64 * MiB) /* P's Reads of its segment (cluster.pull_chunk) */
#define RL_SEGMENT (4 * RL_FRAME) /* (a segment pulled alone goes in two chunks a lane at most) */
static struct rogue rl;
static struct rogue_lane rl_lanes[RL_LANES];
static int lfd_rl;
static uint8_t rkey[32];
/* P's cluster.request_timeout_ms, in seconds: how long a lane's frame
 * stopped midway waits */
#define STALL_S 5
#define STR_(x) #x
#define STR(x) STR_(x)

/* One lie: the entries of the list's pages, or what a grant says. */
struct entry {
  uint64_t id;
  const char *name;  /* "\x01" in a name is sent as a NUL inside it */
  uint64_t size;
  const char *location;
};

struct lie {
  const char *what;
  bool prefix;              /* gshm_pull_prefix("pub/"), else gshm_pull("pub/one") */
  struct entry page1[4];    /* a set's first page (ids 0: end) */
  struct entry page2[2];    /* its second page */
  unsigned many;            /* page 1 holds this many good entries instead */
  struct entry grant;       /* a single pull's grant (a set's grants are honest) */
};

static struct lie lies[] = {
    {"dot-dot", true, {{1, "pub/../etc/passwd", 4096, "host"}}, {{0}}, 0, {0}},
    {"leading slash", true, {{1, "/pub/a", 4096, "host"}}, {{0}}, 0, {0}},
    {"control bytes", true, {{1, "pub/\x1b[31mred", 4096, "host"}}, {{0}}, 0, {0}},
    {"over 255 bytes", true, {{1, long_name, 4096, "host"}}, {{0}}, 0, {0}},
    {"twice", true, {{1, "pub/a", 4096, "host"}, {2, "pub/a", 4096, "host"}}, {{0}}, 0, {0}},
    {"NUL inside", true, {{1, "pub/a", 4096, "host"}, {2, "pub/a\x01x", 4096, "host"}}, {{0}}, 0,
     {0}},
    {"size 0", true, {{1, "pub/a", 0, "host"}}, {{0}}, 0, {0}},
    {"size beyond limits", true, {{1, "pub/a", 1ull << 60, "host"}}, {{0}}, 0, {0}},
    {"bad location", true, {{1, "pub/a", 4096, "cuda:\x1b"}}, {{0}}, 0, {0}},
    {"segment id 0", true, {{0, "pub/a", 4096, "host"}}, {{0}}, 0, {0}},
    {"more than a page", true, {{0}}, {{0}}, 300, {0}},
    /* page 1 is fine: page 2 lies */
    {"second page", true, {{1, "pub/ok", 4096, "host"}}, {{2, "pub/../x", 4096, "host"}}, 0, {0}},
    {"grant of another name", false, {{0}}, {{0}}, 0, {1, "pub/other", 4096, "host"}},
    {"grant named with control bytes", false, {{0}}, {{0}}, 0, {1, "pub/\x07", 4096, "host"}},
    {"grant of size 0", false, {{0}}, {{0}}, 0, {1, "pub/one", 0, "host"}},
    {"grant beyond limits", false, {{0}}, {{0}}, 0, {1, "pub/one", 1ull << 60, "host"}},
    {"grant with a bad location", false, {{0}}, {{0}}, 0, {1, "pub/one", 4096, "gpu:7"}},
};

static void segment_of(const struct entry *e, Gshm__Cluster__Segment *s) {
  gshm__cluster__segment__init(s);
  s->id = e->id;
  s->generation = 1;
  s->name = (char *)e->name;
  s->size = e->size;
  s->allocated = e->size;
  s->location = (char *)e->location;
}

/* Packs m and sends it with every 0x01 byte of names made a NUL. */
static void send_with_nuls(const Gshm__Cluster__Msg *m) {
  size_t len = gshm__cluster__msg__get_packed_size(m);
  uint8_t *buf = malloc(len);
  assert_non_null(buf);
  gshm__cluster__msg__pack(m, buf);
  for (size_t i = 0; i < len; i++)
    if (buf[i] == 0x01 && i > 0 && buf[i - 1] == 'a') /* "pub/a\x01x" */
      buf[i] = 0;
  rogue_send_packed(&rs, buf, len);
  free(buf);
}

/* The list page answering request rid: entries (or `many` good ones),
 * next: the cursor of a page to follow (0: none). */
static void send_page(uint32_t rid, const struct entry *es, size_t max, unsigned many,
                      uint64_t next) {
  static Gshm__Cluster__Segment segs[300];
  static Gshm__Cluster__Segment *ptrs[300];
  static char names[300][16];
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;
  size_t n = 0;

  for (; many && n < many; n++) {
    struct entry e = {n + 1, names[n], 4096, "host"};
    snprintf(names[n], sizeof(names[n]), "pub/m%zu", n);
    segment_of(&e, &segs[n]);
    ptrs[n] = &segs[n];
  }
  for (; !many && n < max && es[n].name; n++) {
    segment_of(&es[n], &segs[n]);
    ptrs[n] = &segs[n];
  }
  r.segments = ptrs;
  r.n_segments = n;
  r.next = next;
  r.total = (uint32_t)n;
  m.request_id = rid;
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  m.list_reply = &r;
  send_with_nuls(&m);
}

/* What the next grants say of the path of their bytes (Grant.upstream,
 * NULL: nothing) and whether they are in flight: test_path_lies. */
static const char *grant_upstream;
static bool grant_in_flight;

static void send_grant_to(struct rogue *r, uint32_t rid, const struct entry *e) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
  Gshm__Cluster__Segment s;

  segment_of(e, &s);
  s.in_flight = grant_in_flight;
  g.segment = &s;
  if (grant_upstream)
    g.upstream = (char *)grant_upstream;
  g.grant_id = 1000 + e->id;
  g.path = GSHM__CLUSTER__PATH__PATH_HOST;
  g.length = e->size;
  m.request_id = rid;
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
  m.grant = &g;
  rogue_send(r, &m);
}

static void send_grant(uint32_t rid, const struct entry *e) { send_grant_to(&rs, rid, e); }

static void send_error(uint32_t rid) {
  rogue_send_status(&rs, rid, 2, "the rogue does not send bytes"); /* INVALID_ARGUMENT */
}

/* The pull in the background: its result and the puller's message. */
struct bg {
  pthread_t t;
  const struct lie *lie;
  int err;
  char msg[512];
  atomic_bool done;
};

static void *bg_thread(void *arg) {
  struct bg *bg = arg;
  gshm_pull_result_t r, *v = NULL;
  size_t n = 0;
  gshm_client_t *c;

  bg->err = gshm_connect(P.h.socket_path, "bg", &c);
  if (!bg->err) {
    bg->err = bg->lie->prefix ? gshm_pull_prefix(c, "rs", "pub/", NULL, &v, &n)
                              : gshm_pull(c, "rs", "pub/one", NULL, &r);
    snprintf(bg->msg, sizeof(bg->msg), "%s", gshm_last_error(c));
    gshm_free(v);
    gshm_disconnect(c);
  }
  bg->done = true;
  return NULL;
}

/* Answers the puller's requests with lie l until its pull ends; returns
 * how many reads it was sent (the segment was being made). */
static unsigned serve_lie(struct bg *bg, const struct lie *l) {
  uint32_t held_reads[64];
  unsigned nheld = 0, reads = 0;

  while (!bg->done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && m->list->after == 0)
      send_page(m->request_id, l->page1, 4, l->many, l->page2[0].id ? l->page1[0].id : 0);
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) /* a set is listed whole before */
      send_page(m->request_id, l->page2, 2, 0, 0);         /* any grant: the lie comes first */
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      send_grant(m->request_id, l->prefix ? &l->page1[0] : &l->grant);
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ && nheld < 64 && ++reads)
      held_reads[nheld++] = m->request_id;
    gshm__cluster__msg__free_unpacked(m, NULL);
    while (nheld) /* (no lie lets a pull read: each read fails) */
      send_error(held_reads[--nheld]);
  }
  return reads;
}

static int group_setup(void **state) {
  char peers[96];
  int port, port_rl;
  (void)state;

  memset(long_name, 'x', sizeof(long_name) - 1);
  memcpy(long_name, "pub/", 4);
  keys_make(&keys, "gshm-rogue-server");
  rogue_key(keys.key, rkey);
  assert_true((lfd = rogue_listener(&port)) >= 0);
  assert_true((lfd_rl = rogue_listener(&port_rl)) >= 0);
  snprintf(peers, sizeof(peers), "rs=127.0.0.1:%d,rl=127.0.0.1:%d", port, port_rl);
  /* rl's lane tests pull one segment of RL_FRAME bytes in one Read */
  node_start(&P, "p", peers, keys.key, "", "cluster.streams=2", "cluster.pull_chunk=64M",
             "cluster.request_timeout_ms=" STR(STALL_S) "000", NULL);
  harness_set_leftover(&P.h);
  assert_int_equal(rogue_accept(&rs, lfd, "rs", rkey), 0);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rogue_close(&rs);
  close(lfd);
  close(lfd_rl);
  assert_int_equal(harness_stop(&P.h), 0);
  harness_set_leftover(NULL);
  keys_remove(&keys);
  return 0;
}

/* Each lie in turn: refused with -EPROTO by a message that names the
 * peer, nothing left on the puller, which goes on serving. */
static void test_lies_refused(void **state) {
  gshm_client_t *p = connect_to(&P);
  (void)state;

  for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++) {
    struct bg bg = {.lie = &lies[i]};
    gshm_segment_info_t info;

    unsigned reads;

    assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
    reads = serve_lie(&bg, &lies[i]);
    pthread_join(bg.t, NULL);
    /* a set pull lists the whole set before it asks for a grant, and a
     * single pull checks its grant first: no lie gets a byte read */
    assert_int_equal(reads, 0);
    printf("%-32s %d: %s\n", lies[i].what, bg.err, bg.msg);
    assert_int_equal(bg.err, -EPROTO);
    assert_non_null(strstr(bg.msg, "peer 'rs'"));
    /* nothing made, hidden or not, and P answers */
    assert_nothing_left(p, "pub/a");
    assert_int_equal(gshm_stat_name(p, "pub/ok", &info), -ENOENT);
    assert_int_equal(gshm_stat_name(p, "pub/one", &info), -ENOENT);
    assert_false(rs.failed);
  }
  gshm_disconnect(p);
}

/* A grant whose path of relayed bytes (Grant.upstream) is malformed, or
 * given for a segment not in flight: refused with -EPROTO as the lies
 * above, before a byte is read (a relay checks a peer against the path
 * before it grants in flight: relay.c relay_serves). */
static void test_path_lies(void **state) {
  static const struct {
    const char *up;
    bool in_flight;
  } paths[] = {{"a", false},     {"?,a", true}, {"a,b,c,d,e,f,g,h,i", true}, {"a,\x1b", true},
               {"a,", true},     {"a,,b", true}, {",a", true}, {"a?", false}};
  struct lie l = {"path", false, {{0}}, {{0}}, 0, {1, "pub/one", 4096, "host"}};
  gshm_client_t *p = connect_to(&P);
  (void)state;

  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
    struct bg bg = {.lie = &l};
    grant_upstream = paths[i].up;
    grant_in_flight = paths[i].in_flight;
    assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
    assert_int_equal(serve_lie(&bg, &l), 0);
    pthread_join(bg.t, NULL);
    printf("path '%s'%s: %d: %s\n", paths[i].up, paths[i].in_flight ? " in flight" : "", bg.err,
           bg.msg);
    assert_int_equal(bg.err, -EPROTO);
    assert_non_null(strstr(bg.msg, "peer 'rs'"));
    assert_non_null(strstr(bg.msg, "path of its bytes"));
    assert_nothing_left(p, "pub/one");
  }
  grant_upstream = NULL;
  grant_in_flight = false;
  gshm_disconnect(p);
}

/* The next message the rogue gets while bg's pull runs, or NULL once it
 * ended. */
static Gshm__Cluster__Msg *recv_during(const struct bg *bg) {
  Gshm__Cluster__Msg *m = NULL;
  while (!bg->done && !(m = rogue_recv(&rs, 20)))
    assert_false(rs.failed);
  return m;
}

/* The set pull of l (its first page, listed honestly otherwise): the
 * listing fails it with want, saying says; nothing is left, no pull
 * still owes host memory, and the rogue is asked no grant it could not
 * refuse.  Returns the grants it was asked for. */
static unsigned set_refused_after_listing(const struct lie *l, int want, const char *says) {
  gshm_client_t *p = connect_to(&P);
  struct bg bg = {.lie = l};
  unsigned grants = 0;
  long owed = -1;
  Gshm__Cluster__Msg *m;

  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  while ((m = recv_during(&bg))) {
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST)
      send_page(m->request_id, l->page1, 4, 0, 0);
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST && ++grants)
      send_error(m->request_id);
    /* (anything else, such as the previous test's late Release with
     * request id 0, gets no answer: a status at id 0 is a refusal that
     * ends the link) */
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("%s: %d: %s\n", l->what, bg.err, bg.msg);
  assert_int_equal(bg.err, want);
  assert_non_null(strstr(bg.msg, says));
  assert_nothing_left(p, NULL);
  for (int i = 0; i < 40 && owed; i++, usleep(100000)) /* (metrics: up to 1 s old) */
    owed = metric(p, "gshm_cluster_pull_host_owed_bytes");
  assert_int_equal(owed, 0);
  gshm_disconnect(p);
  return grants;
}

/* A peer that refuses every grant of a set as busy (the answer a serving
 * gshmd gives past its grants per link, or staged ones): the set asks
 * again (the busy state of an honest peer passes) for P's request
 * timeout (STALL_S), then fails with -EBUSY naming the peer, nothing
 * left, within the test's 30 s.
 * Before, the set failed at its last refusal and then closed the
 * segments waiting to be asked again, each one counted off its open
 * ones a second time: the count wrapped below zero and the pull never
 * ended. */
static void test_set_grants_busy(void **state) {
  static const struct lie busy = {"grants refused busy", true,
                                  {{1, "pub/a", 4096, "host"}, {2, "pub/b", 4096, "host"},
                                   {3, "pub/c", 4096, "host"}, {4, "pub/d", 4096, "host"}},
                                  {{0}}, 0, {0}};
  gshm_client_t *p = connect_to(&P);
  struct bg bg = {.lie = &busy};
  unsigned grants = 0;
  (void)state;

  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  for (int k = 0; k < 1500 && !bg.done; k++) { /* (20 ms a receive) */
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    assert_false(rs.failed);
    if (!m)
      continue;
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST)
      send_page(m->request_id, busy.page1, 4, 0, 0);
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST && ++grants)
      rogue_send_status(&rs, m->request_id, GSHM__STATUS__STATUS_BUSY,
                        "too many pulls from this node at once; try again");
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  if (!bg.done)
    fail_msg("the set pull did not end in 30 s after %u busy refusals", grants);
  pthread_join(bg.t, NULL);
  printf("%s: %d: %s (%u grants asked)\n", busy.what, bg.err, bg.msg, grants);
  assert_int_equal(bg.err, -EBUSY);
  assert_non_null(strstr(bg.msg, "rs"));
  assert_true(grants >= 4);
  assert_nothing_left(p, NULL);
  gshm_disconnect(p);
}

/* A set of device segments pulled by a gshmd without a GPU: their hidden
 * segments are made after the listing (a few a loop turn), and the first
 * one that cannot be made fails the set with the registry's reason;
 * nothing is left and P goes on.  The rogue refuses the grants P asks for
 * meanwhile (the set has failed by then: the making runs in the loop turn
 * after the listing, before any answer is read). */
static void test_device_set_without_gpu(void **state) {
  static const struct lie dev = {"device set without a GPU", true,
                                 {{1, "pub/a", 4096, "cuda:0"}, {2, "pub/b", 8192, "cuda:0"}},
                                 {{0}}, 0, {0}};
  (void)state;
  set_refused_after_listing(&dev, -ENOTSUP, "device segments are unavailable");
}

/* A set of host segments more than this machine's memory (MemAvailable +
 * SwapFree) can hold: each one alone fits (0.6 of it), the two do not.
 * Every byte of a pull is written, so the second one's making fails the
 * set with -ENOMEM before any grant is asked; before, both were made
 * (sparse memfds) and their bytes would have run the node out of memory
 * as they came (a hostile peer's 4096 listed segments of up to 2^48
 * bytes: no bound at all). */
static void test_host_set_beyond_memory(void **state) {
  static struct lie big = {"host set beyond memory", true, {{0}}, {{0}}, 0, {0}};
  unsigned long long kb, avail = 0;
  char line[160];
  FILE *f = fopen("/proc/meminfo", "re");
  (void)state;

  assert_non_null(f);
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 ||
        sscanf(line, "SwapFree: %llu kB", &kb) == 1)
      avail += kb << 10;
  fclose(f);
  big.page1[0] = (struct entry){1, "pub/a", (avail / 10 * 6) & ~4095ull, "host"};
  big.page1[1] = (struct entry){2, "pub/b", (avail / 10 * 6) & ~4095ull, "host"};
  assert_int_equal(set_refused_after_listing(&big, -ENOMEM, "of host memory"), 0);
}

/* Writes text into cgroup file dir/file; false when it cannot. */
static bool cgroup_write(const char *dir, const char *file, const char *text) {
  char path[PATH_MAX + 32];
  FILE *f;
  bool ok;

  snprintf(path, sizeof(path), "%s/%s", dir, file);
  if (!(f = fopen(path, "we")))
    return false;
  ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

/* A memory cgroup of gshmd's (P's) own, child of this process's, with a
 * limit of limit bytes (cgroup v1 memory.limit_in_bytes, or v2 memory.max
 * where the unified hierarchy is mounted at /sys/fs/cgroup); gshmd moves
 * into it.  Its folder in cg, the one gshmd goes back to in home.  false
 * where none can be made here (not root, no memory hierarchy, v2 without
 * the memory controller for children). */
static bool cgroup_confine(pid_t pid, uint64_t limit, char *cg, char *home, size_t cap) {
  char line[512], num[32];
  const char *root = NULL, *fmax = NULL;
  bool v2 = !access("/sys/fs/cgroup/cgroup.controllers", F_OK);
  FILE *f = fopen("/proc/self/cgroup", "re");

  while (f && !root && fgets(line, sizeof(line), f)) {
    char *p = strchr(line, ':'), *q = p ? strchr(p + 1, ':') : NULL;
    if (!q)
      continue;
    q[strcspn(q, "\n")] = '\0';
    if (v2 && !strncmp(line, "0::", 3))
      root = "/sys/fs/cgroup", fmax = "memory.max";
    else if (!v2 && (!strncmp(p, ":memory:", 8) || strstr(p, ",memory:") ||
                     !strncmp(p, ":memory,", 8)))
      root = "/sys/fs/cgroup/memory", fmax = "memory.limit_in_bytes";
    if (root)
      snprintf(home, cap, "%s%s", root, q + 1);
  }
  if (f)
    fclose(f);
  if (!root)
    return false;
  if (access(home, F_OK)) /* (a cgroup namespace: the mount's root is ours) */
    snprintf(home, cap, "%s", root);
  if (snprintf(cg, cap, "%.*s/gshm-test-%d", (int)(cap - 32), home, (int)getpid()) >= (int)cap ||
      (mkdir(cg, 0755) && errno != EEXIST))
    return false;
  snprintf(num, sizeof(num), "%" PRIu64 "\n", limit);
  if (!cgroup_write(cg, fmax, num))
    goto remove;
  snprintf(num, sizeof(num), "%d\n", (int)pid);
  if (!cgroup_write(cg, "cgroup.procs", num))
    goto remove;
  return true;
remove:
  rmdir(cg);
  return false;
}

/* test_host_set_beyond_cgroup's cgroup (cgroup_confine), released in
 * its teardown, whether the test passed or not. */
static struct {
  bool on;
  char cg[PATH_MAX], home[PATH_MAX];
} confined;

/* Moves P's gshmd back to its cgroup and removes the test's. */
static int cgroup_release(void **state) {
  char num[32];
  (void)state;

  if (!confined.on)
    return 0;
  confined.on = false;
  snprintf(num, sizeof(num), "%d\n", (int)P.h.sp.pid);
  assert_true(cgroup_write(confined.home, "cgroup.procs", num));
  assert_int_equal(rmdir(confined.cg), 0);
  return 0;
}

/* The same bound where gshmd's memory cgroup is what is short: gshmd in
 * a cgroup of its own limited to 192 MiB, a set of two 128 MiB host
 * segments (each one fits the cgroup, the two do not) fails with -ENOMEM
 * at the second before any grant, whichever cgroup version.  Before, the
 * pull's check read cgroup v2 only: under a v1 memory cgroup both were
 * made and granted (seen failing: the rogue's refusal, -EINVAL). */
static void test_host_set_beyond_cgroup(void **state) {
  static struct lie big = {"host set beyond gshmd's cgroup", true,
                           {{1, "pub/a", 128 * MiB, "host"}, {2, "pub/b", 128 * MiB, "host"}},
                           {{0}}, 0, {0}};
  (void)state;

  if (!(confined.on = cgroup_confine(P.h.sp.pid, 192 * MiB, confined.cg, confined.home,
                                     sizeof(confined.cg)))) {
    printf("no memory cgroup of gshmd's own can be made here: skipped\n");
    skip();
  }
  /* (gshmd reads its memory figures at most every 100 ms) */
  usleep(200000);
  assert_int_equal(set_refused_after_listing(&big, -ENOMEM, "of host memory"), 0);
}

/* The set pull of bg->what, against a peer that lists `listed` and then
 * grants `granted` under the same name: a segment other than the one it
 * listed (made again there, or the old one of a --replace whose pull
 * failed there) must not join the set.  Returns the reads it was sent. */
struct not_listed {
  const char *what;
  Gshm__Cluster__Segment listed, granted;
};

static unsigned serve_not_listed(struct bg *bg, struct not_listed *nl) {
  unsigned reads = 0;

  while (!bg->done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20), a = GSHM__CLUSTER__MSG__INIT;
    Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;
    Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
    Gshm__Cluster__Segment *one = &nl->listed;
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    a.request_id = m->request_id;
    a.status = 1;
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      r.segments = &one;
      r.n_segments = 1;
      r.total = 1;
      a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
      a.list_reply = &r;
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      g.segment = &nl->granted;
      g.grant_id = 77;
      g.path = GSHM__CLUSTER__PATH__PATH_HOST;
      g.length = nl->granted.size;
      a.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
      a.grant = &g;
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ) {
      reads++;
      a.status = 2;
      a.message = "the rogue does not send bytes";
    } else {
      gshm__cluster__msg__free_unpacked(m, NULL);
      continue;
    }
    rogue_send(&rs, &a);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  return reads;
}

/* A grant of another segment than the one listed under its name (another
 * id; or, listed in flight, another source) fails the set with -ESTALE
 * before a byte is read, leaving nothing. */
static void test_grant_not_listed(void **state) {
  static const struct lie set = {"not listed", true, {{0}}, {{0}}, 0, {0}};
  static struct not_listed cases[2] = {{.what = "another id"}, {.what = "another source"}};
  gshm_client_t *p = connect_to(&P);
  (void)state;

  for (int i = 0; i < 2; i++) {
    struct entry e = {1, "pub/a", 4096, "host"};
    segment_of(&e, &cases[i].listed);
    segment_of(&e, &cases[i].granted);
  }
  cases[0].granted.id = 2; /* made again under the name since its listing */
  cases[1].listed.id = 0;  /* listed in flight (no id yet), where it came from first */
  cases[1].listed.generation = 0;
  cases[1].listed.in_flight = true;
  cases[1].listed.source = "x:pub/a#5.5";
  cases[1].granted.source = "x:pub/a#4.4"; /* the old one it was to replace */
  for (int i = 0; i < 2; i++) {
    struct bg bg = {.lie = &set};
    unsigned reads;

    assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
    reads = serve_not_listed(&bg, &cases[i]);
    pthread_join(bg.t, NULL);
    printf("grant of %-24s %d: %s\n", cases[i].what, bg.err, bg.msg);
    assert_int_equal(reads, 0);
    assert_int_equal(bg.err, -ESTALE);
    assert_non_null(strstr(bg.msg, "peer 'rs'"));
    assert_non_null(strstr(bg.msg, "not the one it listed"));
    assert_nothing_left(p, NULL);
    assert_false(rs.failed);
  }
  gshm_disconnect(p);
}

/* ---- rl: a rogue that takes data lanes --------------------------------- */

static bool rl_lanes_up(void *arg) {
  return metric(arg, "gshm_cluster_lanes{peer=\"rl\"}") == RL_LANES;
}

/* Takes P's link to rl and its RL_LANES lanes (P connects again within a
 * few seconds of its last link's end).  Returns once P counts the lanes
 * up. */
static void rl_up(gshm_client_t *p) {
  assert_int_equal(rogue_accept_lanes(&rl, lfd_rl, "rl", rkey, rl_lanes, RL_LANES, rl_lanes_up, p),
                   0);
}

static void rl_down(void) {
  for (int i = 0; i < RL_LANES; i++)
    rogue_lane_close(&rl_lanes[i]);
  rogue_close(&rl);
}

/* rl's pull in the background (gshm_pull of "pub/one"), and a monitor
 * that asks P for its peers every 200 ms meanwhile (P asks each peer
 * for its count: the control connection to rl never idles). */
struct rl_pull {
  pthread_t t;
  struct peers_monitor mon;
  int err;
  char msg[512];
  atomic_bool done;
};

static void *rl_pull_thread(void *arg) {
  struct rl_pull *bg = arg;
  gshm_pull_result_t r;
  gshm_client_t *c;

  bg->err = gshm_connect(P.h.socket_path, "bg", &c);
  if (!bg->err) {
    bg->err = gshm_pull(c, "rl", "pub/one", NULL, &r);
    snprintf(bg->msg, sizeof(bg->msg), "%s", gshm_last_error(c));
    gshm_disconnect(c);
  }
  bg->done = true;
  return NULL;
}

/* How many payload bytes of a frame the rogue must have written before
 * P's lane thread has certainly read its header and claimed its request:
 * more than the kernel can hold for it (P's receive buffer can grow to
 * tcp_rmem's largest, the rogue's send buffer to tcp_wmem's). */
static uint64_t claimed_after(void) {
  uint64_t most = 0;
  const char *files[] = {"/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"};

  for (int i = 0; i < 2; i++) {
    unsigned long long lo, def, hi;
    FILE *f = fopen(files[i], "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%llu %llu %llu", &lo, &def, &hi), 3);
    fclose(f);
    most += hi;
  }
  return most + 4 * MiB;
}

/* Serves rl's side of a pull of "pub/one" (RL_SEGMENT bytes, Reads of
 * RL_FRAME): the grant, then the first Read's frame on lane 0, its
 * header and the first `part` bytes of its payload only (blocking until
 * P took them), and then after(rid) once; the other Reads' frames whole
 * on lane 1 (others) or none; P's count requests (of rl and rs), until
 * the pull ends or ms pass.  Returns when the frame stopped (now_ms), 0
 * if never; *counts_out: count requests answered after it. */
static int64_t serve_partial(struct rl_pull *bg, uint64_t part, void (*after)(uint32_t rid),
                             bool others, int64_t ms, unsigned *counts_out) {
  static uint8_t *src;
  int64_t end = now_ms() + ms, stalled = 0;

  if (!src)
    assert_non_null(src = calloc(1, RL_FRAME));
  *counts_out = 0;
  while (!bg->done && now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(&rl, 20), *o;
    while ((o = rogue_recv(&rs, 1))) { /* (P asks rs too) */
      rogue_answer_count(&rs, o);
      gshm__cluster__msg__free_unpacked(o, NULL);
    }
    if (!m) {
      if (rl.failed) /* P ended the link: the pull ends soon */
        usleep(20000);
      continue;
    }
    if (rogue_answer_count(&rl, m)) {
      *counts_out += stalled != 0;
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      struct entry e = {1, "pub/one", RL_SEGMENT, "host"};
      send_grant_to(&rl, m->request_id, &e);
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ) {
      assert_int_equal(m->read->length, RL_FRAME);
      if (!stalled) {
        assert_int_equal(rogue_lane_send(&rl_lanes[0], m->request_id, m->read->offset, src,
                                         RL_FRAME, part),
                         0);
        stalled = now_ms();
        if (after)
          after(m->request_id);
      } else if (others) {
        assert_int_equal(rogue_lane_send(&rl_lanes[1], m->request_id, m->read->offset, src,
                                         RL_FRAME, RL_FRAME),
                         0);
      }
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  return stalled;
}

/* rl's message in P's peers (gshmctl peers): why its link ended. */
static void rl_message(gshm_client_t *p, char *buf, size_t len) {
  gshm_cluster_peer_t *v = NULL;
  size_t n = 0;

  buf[0] = '\0';
  assert_int_equal(gshm_cluster_peers(p, NULL, &v, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(v[i].name, "rl"))
      snprintf(buf, len, "%s", v[i].message);
  gshm_free(v);
}

/* A key holder sends the header and part of the payload of a Read's data
 * frame on a lane, then nothing on it, while it sends the other Reads'
 * frames whole on the other lane and answers every count request on the
 * link's control connection (a monitor runs gshmctl peers five times a
 * second): the link's own activity never lapses, and the claimed request
 * used to wait forever, and the pull, its hidden segment and its memory
 * with it.  Now the lane's frame, without a byte for the request timeout
 * (cluster.request_timeout_ms: STALL_S here), fails the link
 * (-ETIMEDOUT, counted as a timeout refusal) and the pull, with the
 * reason in its error and in gshmctl peers, and nothing is left. */
static void test_lane_frame_stalled(void **state) {
  static struct rl_pull bg; /* (static: a failed check leaves its threads) */
  gshm_client_t *p = connect_to(&P);
  long timeouts = metric(p, "gshm_cluster_refusals_total{cause=\"timeout\"}");
  long failed = metric(p, "gshm_cluster_pulls_total{peer=\"rl\",result=\"error\"}");
  uint64_t part = claimed_after();
  unsigned counts;
  int64_t stalled, took;
  char why[160];
  (void)state;

  if (part >= RL_FRAME)
    skip(); /* (this host's TCP buffers could hold the whole frame) */
  rl_up(p);
  memset(&bg, 0, sizeof(bg));
  assert_int_equal(pthread_create(&bg.t, NULL, rl_pull_thread, &bg), 0);
  peers_monitor_start(&bg.mon, &P, &bg.done);
  stalled = serve_partial(&bg, part, NULL, true, (STALL_S + 40) * 1000, &counts);
  took = now_ms() - stalled;
  printf("frame stalled after %" PRIu64 " of %" PRIu64 " bytes; %u count requests answered "
         "meanwhile; the pull ended after %.1f s: %d %s\n",
         part, (uint64_t)RL_FRAME, counts, (double)took / 1000, bg.err, bg.msg);
  assert_true(stalled != 0);
  assert_true(bg.done); /* (the old code: still waiting) */
  pthread_join(bg.t, NULL);
  peers_monitor_join(&bg.mon);
  /* the control connection was busy throughout */
  assert_true(counts >= STALL_S * 2);
  /* not before the request timeout, and soon after it (the sweep runs
   * every second) */
  assert_true(took >= (STALL_S - 1) * 1000);
  assert_true(took <= (STALL_S + 20) * 1000);
  /* (only the stalled request was left: the link's loss fails the pull) */
  assert_int_equal(bg.err, -ETIMEDOUT);
  assert_non_null(strstr(bg.msg, "peer 'rl' lost mid-pull"));
  assert_non_null(strstr(bg.msg, "stopped sending a data frame midway"));
  rl_message(p, why, sizeof(why));
  assert_non_null(strstr(why, "stopped sending a data frame midway"));
  assert_int_equal(metric(p, "gshm_cluster_refusals_total{cause=\"timeout\"}"), timeouts + 1);
  assert_int_equal(metric(p, "gshm_cluster_pulls_total{peer=\"rl\",result=\"error\"}"),
                   failed + 1);
  assert_nothing_left(p, "pub/one");
  rl_down();
  gshm_disconnect(p);
}

static void send_status_rl(uint32_t rid) {
  rogue_send_status(&rl, rid, 2, "the rogue answers a read whose bytes it is sending");
}

/* A key holder sends part of a Read's frame on a lane (P's lane thread
 * has claimed the request: its bytes go straight into place) and then
 * answers the same request with an error on the control connection: an
 * answer to a request whose bytes are coming is a lie, refused as a
 * protocol error (the link goes, the pull fails with -EPROTO, nothing is
 * left), never a second end of the claimed request. */
static void test_status_answer_to_claimed(void **state) {
  static struct rl_pull bg;
  gshm_client_t *p = connect_to(&P);
  long protocol = metric(p, "gshm_cluster_refusals_total{cause=\"protocol\"}");
  uint64_t part = claimed_after();
  unsigned counts;
  char why[160];
  (void)state;

  if (part >= RL_FRAME)
    skip();
  rl_up(p);
  memset(&bg, 0, sizeof(bg));
  assert_int_equal(pthread_create(&bg.t, NULL, rl_pull_thread, &bg), 0);
  peers_monitor_start(&bg.mon, &P, &bg.done);
  assert_true(serve_partial(&bg, part, send_status_rl, false, 20000, &counts) != 0);
  printf("status answer to a claimed read: %d %s\n", bg.err, bg.msg);
  assert_true(bg.done);
  pthread_join(bg.t, NULL);
  peers_monitor_join(&bg.mon);
  assert_int_equal(bg.err, -EPROTO);
  assert_non_null(strstr(bg.msg, "answered a request whose bytes it is sending"));
  rl_message(p, why, sizeof(why));
  assert_non_null(strstr(why, "answered a request whose bytes it is sending"));
  assert_int_equal(metric(p, "gshm_cluster_refusals_total{cause=\"protocol\"}"), protocol + 1);
  assert_nothing_left(p, "pub/one");
  rl_down();
  gshm_disconnect(p);
}

/* A key holder that moves bytes on the link's own connection (no data
 * lanes: rs) answers the one Read of a single pull with the header and
 * 4 KiB of its data frame there, then nothing: the Read is off the
 * link's requests (its bytes are coming), no other request waits, so the
 * oldest-request deadline never ran, and the pull, its hidden segment
 * and its memory waited forever.  Now a data frame without a byte for
 * the request timeout (STALL_S) fails the link as on a lane
 * (-ETIMEDOUT), and nothing is left.  (Last: rs is not taken again.) */
static void test_stream_frame_stalled(void **state) {
  static const struct lie one = {"stalled", false, {{0}}, {{0}}, 0, {0}};
  static struct bg bg;
  static uint8_t head[sizeof(struct frame_hdr) + 4096];
  gshm_client_t *p = connect_to(&P);
  long timeouts = metric(p, "gshm_cluster_refusals_total{cause=\"timeout\"}");
  struct entry e = {1, "pub/one", 1 * MiB, "host"};
  int64_t stalled = 0, end;
  (void)state;

  memset(&bg, 0, sizeof(bg));
  bg.lie = &one;
  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  for (end = now_ms() + (STALL_S + 20) * 1000; !bg.done && now_ms() < end;) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m)
      continue;
    if (rogue_answer_count(&rs, m)) { /* (asked by the tests before: answered first) */
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      send_grant(m->request_id, &e);
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ && !stalled) {
      struct frame_hdr h = {.len = (uint32_t)m->read->length, .kind = FRAME_DATA,
                            .request_id = m->request_id, .offset = m->read->offset};
      uv_buf_t b = uv_buf_init((char *)head, sizeof(head));
      memcpy(head, &h, sizeof(h));
      assert_int_equal(uv_try_write((uv_stream_t *)&rs.st.tcp, &b, 1), (int)sizeof(head));
      stalled = now_ms();
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  printf("frame stalled on the link's connection; the pull ended after %.1f s: %d %s\n",
         (double)(now_ms() - stalled) / 1000, bg.err, bg.msg);
  assert_true(stalled != 0);
  assert_true(bg.done); /* (the old code: still waiting) */
  pthread_join(bg.t, NULL);
  assert_int_equal(bg.err, -ETIMEDOUT);
  assert_non_null(strstr(bg.msg, "stopped sending a data frame midway"));
  assert_int_equal(metric(p, "gshm_cluster_refusals_total{cause=\"timeout\"}"), timeouts + 1);
  assert_nothing_left(p, "pub/one");
  gshm_disconnect(p);
}

/* A List answer of ptrs[0, n) with cursor next, to request rid. */
static void send_segments(uint32_t rid, Gshm__Cluster__Segment **ptrs, size_t n, uint64_t next,
                          uint64_t total) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;

  r.segments = ptrs;
  r.n_segments = n;
  r.next = next;
  r.total = total;
  m.request_id = rid;
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  m.list_reply = &r;
  rogue_send(&rs, &m);
}

/* The page of a listing of `total` segments "pub/xNNNNN" that starts at
 * entry first (its 256 entries at most; cursor: the last id), answering
 * request rid. */
static void send_long_page(uint32_t rid, unsigned first, unsigned total) {
  static Gshm__Cluster__Segment segs[256];
  static Gshm__Cluster__Segment *ptrs[256];
  static char names[256][16];
  size_t n = 0;

  for (unsigned i = first; i < total && n < 256; i++) {
    struct entry e = {i + 1, names[n], 4096, "host"};
    snprintf(names[n], sizeof(names[n]), "pub/x%05u", i);
    segment_of(&e, &segs[n]);
    ptrs[n] = &segs[n];
    n++;
  }
  send_segments(rid, ptrs, n, first + n < total ? first + n : 0, total);
}

/* A set of more than PULL_SET_MAX (4096) segments, listed honestly page
 * by page (17 pages of 256): the set fails with -E2BIG at the 4097th,
 * before any grant, and leaves none of the 4096 hidden segments it made;
 * and a grant request answered with something else than a grant (a
 * list page) fails the pull with -EPROTO, leaving nothing.  (Checks that
 * were there; without the body check gshmd would read a NULL grant,
 * without the cap the set would list all 4,352.) */
static void test_set_too_large_and_wrong_answer(void **state) {
  static const struct lie set = {"4,352 segments", true, {{0}}, {{0}}, 0, {0}};
  static const struct lie one = {"a list for a grant", false, {{0}}, {{0}}, 0, {0}};
  gshm_client_t *p = connect_to(&P);
  struct bg bg = {.lie = &set};
  uint32_t held[64];
  unsigned grants = 0, nheld = 0;
  bool listed = false;
  Gshm__Cluster__Msg *m;
  (void)state;

  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  while ((m = recv_during(&bg))) {
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && m->list->after != UINT64_MAX) {
      send_long_page(m->request_id, (unsigned)m->list->after, 4352);
      listed = m->list->after + 256 >= 4352;
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST && ++grants &&
               nheld < 64) {
      held[nheld++] = m->request_id; /* (the first pages' grants go while it lists) */
    }
    while (listed && nheld) /* (after the last page: the set has failed by then) */
      send_error(held[--nheld]);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("%s: %d: %s (%u grants asked)\n", set.what, bg.err, bg.msg, grants);
  /* (as gshm.h says: the wire's STATUS_TOO_MANY; it read -EFBIG before) */
  assert_int_equal(bg.err, -E2BIG);
  assert_non_null(strstr(bg.msg, "more than 4096 segments"));
  assert_nothing_left(p, NULL);

  memset(&bg, 0, sizeof(bg));
  bg.lie = &one;
  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  while ((m = recv_during(&bg))) {
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      send_long_page(m->request_id, 0, 1);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("%s: %d: %s\n", one.what, bg.err, bg.msg);
  assert_int_equal(bg.err, -EPROTO);
  assert_non_null(strstr(bg.msg, "answered a grant request with something else"));
  assert_nothing_left(p, "pub/one");
  gshm_disconnect(p);
}

/* A single pull of rs's "pub/one" as local "mine/one", in the background. */
static void *as_thread(void *arg) {
  struct bg *bg = arg;
  gshm_pull_opts_t po = {.local_name = "mine/one"};
  gshm_pull_result_t r;
  gshm_client_t *c;

  bg->err = gshm_connect(P.h.socket_path, "bg", &c);
  if (!bg->err) {
    bg->err = gshm_pull(c, "rs", "pub/one", &po, &r);
    gshm_disconnect(c);
  }
  bg->done = true;
  return NULL;
}

/* gshmctl ARGS on P in the background (its output in out). */
struct ctl_bg {
  pthread_t t;
  const char *const *args;
  char *out;
  int rc;
  atomic_bool done;
};

static void *ctl_thread(void *arg) {
  struct ctl_bg *g = arg;
  g->rc = harness_gshmctl(&P.h, &g->out, g->args);
  g->done = true;
  return NULL;
}

/* gshmctl args on P while rs answers the count request that P sends it
 * for `peers` (unanswered, it would fail rs's link for the next test);
 * returns its stdout (the caller frees it). */
static char *ctl_answering(const char *const *args) {
  struct ctl_bg g = {.args = args};

  assert_int_equal(pthread_create(&g.t, NULL, ctl_thread, &g), 0);
  while (!g.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    assert_false(rs.failed);
    if (m) {
      assert_true(rogue_answer_count(&rs, m));
      gshm__cluster__msg__free_unpacked(m, NULL);
    }
  }
  pthread_join(g.t, NULL);
  assert_int_equal(g.rc, 0);
  return g.out;
}

/* Root's pull of rs's "pub/one" as "mine/one" (as_thread) started in bg,
 * held: its grant request unanswered.  Returns that request's id. */
static uint32_t held_pull_start(struct bg *bg) {
  Gshm__Cluster__Msg *m;
  uint32_t rid = 0;

  assert_int_equal(pthread_create(&bg->t, NULL, as_thread, bg), 0);
  while (!rid && (m = recv_during(bg))) {
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      rid = m->request_id;
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  assert_true(rid != 0);
  return rid;
}

/* The held pull refused at its grant (rid): it fails, leaving nothing. */
static void held_pull_end(struct bg *bg, uint32_t rid, gshm_client_t *p) {
  Gshm__Cluster__Msg *m;

  send_error(rid);
  while ((m = recv_during(bg)))
    gshm__cluster__msg__free_unpacked(m, NULL);
  pthread_join(bg->t, NULL);
  assert_int_equal(bg->err, -EINVAL);
  assert_nothing_left(p, "mine/one");
}

/* gshmctl peers lists a pull in flight with the peer's name (NAME) and
 * where it lands here (LOCAL, --as); before, only the peer's name was
 * shown, and a pull --as another name could not be told apart. */
static void test_in_flight_local_name(void **state) {
  gshm_client_t *p = connect_to(&P);
  struct bg bg = {0};
  uint32_t rid = held_pull_start(&bg);
  char *out;
  (void)state;

  out = ctl_answering((const char *const[]){"peers", NULL});
  if (!strstr(out, " LOCAL ") || !strstr(out, " pub/one ") || !strstr(out, " mine/one "))
    fail_msg("peers: the pull in flight lacks NAME pub/one, LOCAL mine/one: %s", out);
  printf("%s", out);
  free(out);
  out = ctl_answering((const char *const[]){"--json", "peers", NULL});
  if (!strstr(out, "\"name\": \"pub/one\"") || !strstr(out, "\"local_name\": \"mine/one\""))
    fail_msg("--json peers: the pull in flight lacks name, local_name: %s", out);
  free(out);
  held_pull_end(&bg, rid, p);
  assert_false(rs.failed);
  gshm_disconnect(p);
}

/* nobody's view of the pulls in flight (PEERS needs no right): how many
 * it is shown, as its exit status (50 + N: an error). */
static int nobody_sees_pulls(const char *socket_path) {
  gshm_cluster_pull_t *v = NULL;
  size_t n = 0;
  gshm_client_t *c;
  int e;

  if ((e = gshm_connect(socket_path, "nobody", &c)))
    return 50;
  e = gshm_cluster_pulls(c, &v, &n);
  gshm_free(v);
  gshm_disconnect(c);
  return e ? 51 : (int)(n < 40 ? n : 40);
}

/* What nobody, then root, are shown of the pulls in flight (each PEERS
 * asks rs for its count: the test's thread answers meanwhile). */
struct pulls_view {
  pthread_t t;
  int nobody;                  /* nobody_sees_pulls' status */
  int root_err;
  size_t root_n;
  char root_local[256];        /* the first row's local name */
  atomic_bool done;
};

static void *pulls_view_thread(void *arg) {
  struct pulls_view *pv = arg;
  gshm_cluster_pull_t *v = NULL;
  gshm_client_t *c;

  pv->nobody = harness_as_nobody(nobody_sees_pulls, P.h.socket_path);
  if (!(pv->root_err = gshm_connect(P.h.socket_path, "root", &c))) {
    if (!(pv->root_err = gshm_cluster_pulls(c, &v, &pv->root_n)) && pv->root_n)
      snprintf(pv->root_local, sizeof(pv->root_local), "%s", v[0].local_name);
    gshm_free(v);
    gshm_disconnect(c);
  }
  pv->done = true;
  return NULL;
}

/* Another user's pulls in flight, seen by a local user without any right
 * (nobody: not in cluster.pull_group, may list no peer's segments) through
 * PEERS (`gshmctl peers`): each row gave root's peer, the segment it pulls,
 * where it lands here (--as) and its uid, as gshmctl segments shows no
 * segment that user may not read.  Now a user sees its own pulls, an
 * admin every one. */
static void test_pulls_shown_to_their_user(void **state) {
  gshm_client_t *p = connect_to(&P);
  struct pulls_view pv = {0};
  struct bg bg = {0};
  uint32_t rid = held_pull_start(&bg);
  Gshm__Cluster__Msg *m;
  (void)state;

  assert_int_equal(pthread_create(&pv.t, NULL, pulls_view_thread, &pv), 0);
  while (!pv.done) { /* (each PEERS asks rs for its count) */
    if ((m = rogue_recv(&rs, 20))) {
      rogue_answer_count(&rs, m);
      gshm__cluster__msg__free_unpacked(m, NULL);
    }
  }
  pthread_join(pv.t, NULL);
  print_message("    nobody is shown %d of root's 1 pull in flight, root %zu\n", pv.nobody,
                pv.root_n);
  assert_int_equal(pv.root_err, 0); /* (root: an admin) */
  assert_int_equal(pv.root_n, 1);
  assert_string_equal(pv.root_local, "mine/one");
  assert_int_equal(pv.nobody, 0);
  held_pull_end(&bg, rid, p);
  assert_false(rs.failed);
  gshm_disconnect(p);
}

/* A serving peer that lists its segments in flight (a relay) lists one
 * again once it is published there, so the puller skips a name its set
 * already has: that was a walk of the whole set, a strcmp of each name,
 * for each entry of each page.  A key holder listed 4,000 names of 250
 * bytes in flight, then the last 200 again and again under a cursor that
 * advances: each such page cost the puller's event loop about 9 ms of
 * CPU (every local client waited on it), for as long as the key holder
 * liked.  Now a name is looked up in an index of the set's names.  The
 * cost is measured against pages as long of names outside the prefix
 * (decoded, checked, skipped): 0.3 ms a page either way here, 4 ms
 * under ASan. */
#define REP_N 4000
#define REP_PAGE 200
#define REP_AGAIN 100
#define REP_LISTED (REP_N / REP_PAGE)
static char rep_names[REP_N][256], rep_other[REP_PAGE][256];

/* A page of REP_PAGE names (names[first...]), all in flight. */
static void send_rep_page(uint32_t rid, char (*names)[256], uint64_t next) {
  static Gshm__Cluster__Segment segs[REP_PAGE];
  static Gshm__Cluster__Segment *ptrs[REP_PAGE];

  for (size_t i = 0; i < REP_PAGE; i++) {
    struct entry e = {0, names[i], 4096, "host"};
    segment_of(&e, &segs[i]);
    segs[i].in_flight = true;
    ptrs[i] = &segs[i];
  }
  send_segments(rid, ptrs, REP_PAGE, next, REP_N);
}

/* The rogue's answer to P's List with cursor k (pages of new names, then
 * of names outside the prefix, then of names the set has, then an
 * error), the puller's CPU ticks read at each change into ticks[0..2]. */
static void rep_list(uint32_t rid, uint64_t k, uint64_t ticks[3]) {
  if (k == REP_LISTED) /* (the set's segments are made meanwhile) */
    for (int i = 0; i < 25; i++) {
      Gshm__Cluster__Msg *g = rogue_recv(&rs, 20);
      if (g && g->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
        rogue_send_status(&rs, g->request_id, 18, "busy");
      if (g)
        gshm__cluster__msg__free_unpacked(g, NULL);
    }
  if (k == REP_LISTED || k == REP_LISTED + REP_AGAIN || k == REP_LISTED + 2 * REP_AGAIN)
    assert_int_equal(gshm__proc_cpu_ticks(P.h.sp.pid, &ticks[(k - REP_LISTED) / REP_AGAIN]), 0);
  if (k < REP_LISTED)
    send_rep_page(rid, &rep_names[k * REP_PAGE], k + 1);
  else if (k < REP_LISTED + REP_AGAIN)
    send_rep_page(rid, rep_other, k + 1);
  else if (k < REP_LISTED + 2 * REP_AGAIN)
    send_rep_page(rid, &rep_names[REP_N - REP_PAGE], k + 1);
  else
    send_error(rid);
}

static void test_relay_listing_repeats(void **state) {
  static const struct lie rep = {"repeats", true, {{0}}, {{0}}, 0, {0}};
  gshm_client_t *p = connect_to(&P);
  struct bg bg = {.lie = &rep};
  uint64_t ticks[3] = {0};
  double other, known;
  (void)state;

  for (size_t i = 0; i < REP_N; i++)
    snprintf(rep_names[i], sizeof(rep_names[i]), "pub/%0240zu", i);
  for (size_t i = 0; i < REP_PAGE; i++)
    snprintf(rep_other[i], sizeof(rep_other[i]), "pux/%0240zu", i);
  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  while (!bg.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      rogue_send_status(&rs, m->request_id, 18, "busy"); /* BUSY: asked again later */
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST)
      rep_list(m->request_id, m->list->after, ticks);
    else
      rogue_answer_count(&rs, m);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  assert_int_equal(bg.err, -EINVAL); /* (the rogue's last answer) */
  assert_true(ticks[0] && ticks[1] && ticks[2]);
  other = (double)(ticks[1] - ticks[0]) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
  known = (double)(ticks[2] - ticks[1]) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
  print_message("    %d pages each: names outside the prefix %.0f ms, names the set has %.0f ms "
                "of the puller's CPU\n", REP_AGAIN, other, known);
  assert_true(known <= 2 * other + 20);
  assert_nothing_left(p, NULL); /* (the set's: none left) */
  assert_false(rs.failed);
  gshm_disconnect(p);
}

/* gshm_list_remote toward rs in the background (GSHM_LIST_MAX: list_max,
 * NULL: unset): its result, how many it got, its message. */
struct bg_list {
  pthread_t t;
  const char *list_max;
  int err;
  size_t n;
  char msg[512];
  atomic_bool done;
};

static void *bg_list_thread(void *arg) {
  struct bg_list *bg = arg;
  gshm_segment_info_t *v = NULL;
  gshm_client_t *c;

  bg->err = gshm_connect(P.h.socket_path, "lister", &c);
  if (!bg->err) {
    bg->err = gshm_list_remote(c, "rs", &v, &bg->n);
    snprintf(bg->msg, sizeof(bg->msg), "%s", gshm_last_error(c));
    gshm_free(v);
    gshm_disconnect(c);
  }
  bg->done = true;
  return NULL;
}

/* Lists rs with GSHM_LIST_MAX list_max (NULL: unset) while rs answers its
 * Lists: `pages` pages (the last one's cursor 0) of `per` segments each
 * (0: none), cursors advancing; returns how many pages it sent. */
static unsigned list_rogue(struct bg_list *bg, const char *list_max, unsigned pages,
                           unsigned per) {
  unsigned sent = 0;

  bg->list_max = list_max;
  if (list_max)
    setenv("GSHM_LIST_MAX", list_max, 1); /* (read at connect) */
  assert_int_equal(pthread_create(&bg->t, NULL, bg_list_thread, bg), 0);
  while (!bg->done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && m->list->after != UINT64_MAX) {
      uint64_t k = m->list->after; /* (the cursor: pages sent, times per) */
      if (per)
        send_long_page(m->request_id, (unsigned)k, pages * per);
      else
        send_segments(m->request_id, NULL, 0, k + 1 < pages ? k + 1 : 0, 0);
      sent++;
    } else {
      rogue_answer_count(&rs, m);
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg->t, NULL);
  unsetenv("GSHM_LIST_MAX");
  return sent;
}

/* A key holder answers REMOTE_LIST (gshm_list_remote, gshmctl ls rs:/)
 * page after page with advancing cursors: libgshm kept every page, its
 * memory grew for as long as the peer liked (and with empty pages the
 * listing went on for ever).  Now a listing holds at most what a gshmd
 * can (GSHM_WIRE_SEGMENTS_MAX, lowered here by GSHM_LIST_MAX=1000: -E2BIG
 * at the 4th page of 256) and at most 8192 pages with no segment (-EPROTO
 * at the 8193rd).  Without the caps both listings ended with the rogue's
 * last page and said 0 (10,240 segments, then none). */
static void test_remote_list_capped(void **state) {
  struct bg_list big = {0}, empty = {0};
  unsigned pages;
  (void)state;

  pages = list_rogue(&big, "1000", 40, 256);
  assert_int_equal(big.err, -E2BIG);
  assert_int_equal(pages, 4);
  assert_non_null(strstr(big.msg, "more than 1000 segments"));
  pages = list_rogue(&empty, NULL, 9000, 0);
  print_message("    %u empty pages listed\n", pages);
  assert_int_equal(empty.err, -EPROTO);
  assert_int_equal(pages, GSHM_WIRE_SEGMENTS_MAX / GSHM_WIRE_LIST_VISITS + 1);
  assert_non_null(strstr(empty.msg, "pages with no segment"));
  assert_false(rs.failed);
}

/* A key holder keeps a set's listing (gshm_pull_prefix) going with pages
 * that add nothing to it, under cursors that advance: none, or one name
 * outside the prefix, each answered at once.  It went on for as long as
 * the rogue liked (here 15 s, then an error: -EINVAL), holding the pull,
 * its registry client and one of its user's pulls in flight.  Now the set
 * fails -ETIMEDOUT once its pages took P's cluster.request_timeout_ms
 * (STALL_S) without adding a segment, leaving nothing behind. */
static void test_set_listing_without_progress(void **state) {
  static const struct lie idle = {"idle pages", true, {{0}}, {{0}}, 0, {0}};
  static const struct entry other = {1, "pux/other", 4096, "host"};
  gshm_client_t *p = connect_to(&P);
  struct bg bg = {.lie = &idle};
  Gshm__Cluster__Segment seg, *ptrs[1] = {&seg};
  int64_t t0 = gshm__now_ns(CLOCK_MONOTONIC), ms;
  unsigned pages = 0;
  (void)state;

  segment_of(&other, &seg);
  assert_int_equal(pthread_create(&bg.t, NULL, bg_thread, &bg), 0);
  while (!bg.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    bool late = gshm__now_ns(CLOCK_MONOTONIC) - t0 > 15 * 1000000000ll;
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && m->list->after != UINT64_MAX) {
      if (late)
        send_error(m->request_id);
      else /* (every other page one name outside the prefix) */
        send_segments(m->request_id, ptrs, pages % 2, m->list->after + 1, 1);
      pages++;
    } else {
      rogue_answer_count(&rs, m);
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  ms = (gshm__now_ns(CLOCK_MONOTONIC) - t0) / 1000000;
  print_message("    %u pages in %lld ms: %s\n", pages, (long long)ms, bg.msg);
  assert_int_equal(bg.err, -ETIMEDOUT);
  assert_non_null(strstr(bg.msg, "listed no segment under 'pub/'"));
  assert_true(ms >= STALL_S * 1000 && ms < 2 * STALL_S * 1000);
  assert_nothing_left(p, NULL); /* (the set's: none left) */
  assert_false(rs.failed);
  gshm_disconnect(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lies_refused),
      cmocka_unit_test(test_path_lies),
      cmocka_unit_test(test_set_too_large_and_wrong_answer),
      cmocka_unit_test(test_grant_not_listed),
      cmocka_unit_test(test_in_flight_local_name),
      cmocka_unit_test(test_pulls_shown_to_their_user),
      cmocka_unit_test(test_relay_listing_repeats),
      cmocka_unit_test(test_remote_list_capped),
      cmocka_unit_test(test_set_listing_without_progress),
      cmocka_unit_test(test_set_grants_busy),
      cmocka_unit_test(test_device_set_without_gpu),
      cmocka_unit_test(test_host_set_beyond_memory),
      cmocka_unit_test_teardown(test_host_set_beyond_cgroup, cgroup_release),
      cmocka_unit_test(test_status_answer_to_claimed),
      cmocka_unit_test(test_lane_frame_stalled),
      cmocka_unit_test(test_stream_frame_stalled),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
