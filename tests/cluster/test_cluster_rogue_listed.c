/* SPDX-License-Identifier: Apache-2.0 */
/* A serving peer that holds the cluster key (rogue.h) and lists a set
 * whose grants it then withholds, or grants as something else than it
 * listed:
 * - the pulling gshmd (cluster.prefault = always) faults in no more than
 *   PREFAULT_AHEAD (512 MiB) of the listed host segments ahead of the
 *   chunks it asked for: it once allocated every listed page before any
 *   grant came, up to the requester's quota or all memory;
 * - a grant of a segment on the host where the listing said a GPU, or on
 *   a GPU where it said the host, fails the set with -ESTALE before a
 *   byte is read (a listed GPU segment is made a few a loop turn after its
 *   listing, or at its grant, from the grant's word: the listing's must
 *   be checked before);
 * - with daemon.host_populate = true, the listed host segments' pages are
 *   not allocated at their listing either (the old code fallocate'd every
 *   listed byte before any grant, whatever prefault's cap);
 * - the text of its refusals reaches the requester without control bytes;
 * - a local user without any right (nobody) who pipelines PEERS requests
 *   while this peer answers none of the counts they ask of it makes the
 *   node send it at most GSHMD_PEERS_QUERIES of them (the old code: one a
 *   PEERS, each query, timer and request kept until the link failed);
 * - a node stopped (SIGTERM) just after such a listing, its pieces on
 *   the thread pool, tells the requester "gshmd is stopping" and exits
 *   clean;
 * - a peer's List with segments in flight looks at no more than 2048 of
 *   a set's 4096 segments that no rule exports (it walked them all).
 * Each failed set leaves nothing (no segment, hidden or not, no bytes). */
#include <errno.h>
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
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"
#include "rogue.h"
#include "wire.h"

#define CAP (512 * MiB)         /* prefault.c PREFAULT_AHEAD */
#define LISTED 4                /* host segments listed ... */
#define LISTED_SIZE (256 * MiB) /* ... of this size: twice the cap */

static struct cluster_keys keys;
static struct node P; /* pulls from the rogue "rs" */
static struct rogue rs;
static int lfd;

/* The set pull of "pub/" in the background through gshmd's socket
 * (location: opts->location). */
struct bg {
  pthread_t t;
  const char *socket, *location;
  int err;
  char msg[512];
  atomic_bool done;
};

static void *bg_thread(void *arg) {
  struct bg *bg = arg;
  gshm_pull_opts_t o = {.location = bg->location};
  gshm_pull_result_t *v = NULL;
  size_t n = 0;
  gshm_client_t *c;

  bg->err = gshm_connect(bg->socket, "bg", &c);
  if (!bg->err) {
    bg->err = gshm_pull_prefix(c, "rs", "pub/", &o, &v, &n);
    snprintf(bg->msg, sizeof(bg->msg), "%s", gshm_last_error(c));
    gshm_free(v);
    gshm_disconnect(c);
  }
  bg->done = true;
  return NULL;
}

static void bg_start(struct bg *bg, const char *socket, const char *location) {
  memset(bg, 0, sizeof(*bg));
  bg->socket = socket;
  bg->location = location;
  assert_int_equal(pthread_create(&bg->t, NULL, bg_thread, bg), 0);
}

/* Segment i of the listing: "pub/sI", size bytes at location. */
static void segment_at(Gshm__Cluster__Segment *s, char *name, size_t len, unsigned i, uint64_t size,
                       const char *location) {
  gshm__cluster__segment__init(s);
  snprintf(name, len, "pub/s%u", i);
  s->id = i + 1;
  s->generation = 1;
  s->name = name;
  s->size = size;
  s->allocated = size;
  s->location = (char *)location;
}

/* The one page answering List rid: n segments of size at location. */
static void send_listing(struct rogue *ro, uint32_t rid, unsigned n, uint64_t size,
                         const char *location) {
  static Gshm__Cluster__Segment segs[LISTED];
  static Gshm__Cluster__Segment *ptrs[LISTED];
  static char names[LISTED][16];
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;

  for (unsigned i = 0; i < n; i++) {
    segment_at(&segs[i], names[i], sizeof(names[i]), i, size, location);
    ptrs[i] = &segs[i];
  }
  r.segments = ptrs;
  r.n_segments = n;
  r.total = n;
  m.request_id = rid;
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  m.list_reply = &r;
  rogue_send(ro, &m);
}

static void send_error(uint32_t rid) {
  rogue_send_status(&rs, rid, 2 /* STATUS_INVALID_ARGUMENT */, "the rogue sends no bytes");
}

static int group_setup(void **state) {
  char peers[64];
  uint8_t rkey[32];
  int port;
  (void)state;

  keys_make(&keys, "gshm-rogue-listed");
  rogue_key(keys.key, rkey);
  assert_true((lfd = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "rs=127.0.0.1:%d", port);
  node_start(&P, "p", peers, keys.key, "", "cluster.prefault=always", NULL);
  harness_set_leftover(&P.h);
  assert_int_equal(rogue_accept(&rs, lfd, "rs", rkey), 0);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rogue_close(&rs);
  close(lfd);
  assert_int_equal(harness_stop(&P.h), 0);
  harness_set_leftover(NULL);
  keys_remove(&keys);
  return 0;
}

/* Starts node q (its "--set" values set1 and set2, either NULL) whose one
 * peer "rs" is the rogue ro, and takes its link.  Returns the rogue's
 * listening socket (for rogue_close's caller to close). */
static int node_with_rogue(struct node *q, struct rogue *ro, const char *set1, const char *set2) {
  char peers[64];
  uint8_t rkey[32];
  int port, qlfd;

  rogue_key(keys.key, rkey);
  assert_true((qlfd = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "rs=127.0.0.1:%d", port);
  node_start(q, "q", peers, keys.key, "", set1, set2, NULL);
  memset(ro, 0, sizeof(*ro));
  assert_int_equal(rogue_accept(ro, qlfd, "rs", rkey), 0);
  return qlfd;
}

/* P's gshm_cluster_prefault_bytes_total once two readings 1.2 s apart
 * agree (its metrics are a snapshot up to a second old), within 15 s,
 * while the rogue holds the set's grant requests (their ids into held). */
static long prefault_settled(gshm_client_t *p, long before, uint32_t *held, unsigned *nheld) {
  long last = -1, now = before;
  int64_t end = now_ms() + 15000, next = now_ms() + 1200;

  while (now_ms() < end && (now != last || now == before)) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST)
      send_listing(&rs, m->request_id, LISTED, LISTED_SIZE, "host");
    else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST && *nheld < LISTED)
      held[(*nheld)++] = m->request_id;
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    assert_false(rs.failed);
    if (now_ms() >= next) {
      last = now;
      now = metric(p, "gshm_cluster_prefault_bytes_total");
      next = now_ms() + 1200;
    }
  }
  return now;
}

/* A peer lists LISTED host segments (twice PREFAULT_AHEAD in all) and
 * answers none of their grant requests: P faults in at most
 * PREFAULT_AHEAD of them (the old code: all of them, before any grant),
 * and the set fails clean once the grants are refused. */
static void test_prefault_capped(void **state) {
  static struct bg bg; /* (static: a failed check leaves its thread) */
  gshm_client_t *p = connect_to(&P);
  long before = metric(p, "gshm_cluster_prefault_bytes_total"), got;
  uint32_t held[LISTED];
  unsigned nheld = 0;
  (void)state;

  bg_start(&bg, P.h.socket_path, NULL);
  got = prefault_settled(p, before, held, &nheld) - before;
  printf("listed %llu MiB of host segments, no grant: %ld MiB faulted in\n",
         (unsigned long long)(LISTED * LISTED_SIZE >> 20), got >> 20);
  assert_true(got > 0); /* (prefaulting is on: always) */
  assert_true((uint64_t)got <= CAP);
  while (!bg.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      send_error(m->request_id);
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    while (nheld)
      send_error(held[--nheld]);
  }
  pthread_join(bg.t, NULL);
  printf("the set: %d %s\n", bg.err, bg.msg);
  assert_int_equal(bg.err, -EINVAL);
  assert_non_null(strstr(bg.msg, "peer 'rs'"));
  assert_nothing_left(p, "pub/s0");
  gshm_disconnect(p);
}

/* With daemon.host_populate = true, a peer lists LISTED host segments (1
 * GiB) and answers none of their grant requests: their memory is not
 * allocated before the bytes come (prefault off: none of it; the old
 * code fallocate'd all of it at the listing), and the set fails clean. */
static void test_populate_listed(void **state) {
  static struct bg bg;
  static struct node Q;
  struct rogue rq;
  uint32_t held[LISTED];
  unsigned nheld = 0;
  uint64_t most = 0;
  int qlfd;
  int64_t end;
  gshm_client_t *q;
  (void)state;

  qlfd = node_with_rogue(&Q, &rq, "daemon.host_populate=true", "cluster.prefault=off");
  bg_start(&bg, Q.h.socket_path, NULL);
  /* listed at once; its grants held for 3 s (a set's host segments are
   * made at its listing) */
  end = now_ms() + 3000;
  while (now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(&rq, 20);
    uint64_t b;
    assert_false(rq.failed);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST)
      send_listing(&rq, m->request_id, LISTED, LISTED_SIZE, "host");
    else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST && nheld < LISTED)
      held[nheld++] = m->request_id;
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    if ((b = node_memfd_bytes(Q.h.sp.pid, "memfd:gshm:pull")) > most)
      most = b;
  }
  printf("populate on, listed %llu MiB of host segments, no grant: %llu MiB allocated\n",
         (unsigned long long)(LISTED * LISTED_SIZE >> 20), (unsigned long long)(most >> 20));
  assert_int_equal(nheld, LISTED); /* (the set was listed) */
  assert_true(most < 4 * MiB);
  while (nheld)
    rogue_send_status(&rq, held[--nheld], 2, "the rogue sends no bytes");
  while (!bg.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rq, 20);
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("the set: %d %s\n", bg.err, bg.msg);
  assert_int_equal(bg.err, -EINVAL);
  q = connect_to(&Q);
  assert_nothing_left(q, "pub/s0");
  gshm_disconnect(q);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
}

#define FLOOD 2000         /* requests a local client pipelines */
#define PEERS_QUERIES 16   /* cluster.h GSHMD_PEERS_QUERIES */
#define PULLS_PER_USER 64  /* cluster.h GSHMD_PULLS_PER_USER */

/* What a local client pipelines (flood_kid). */
struct flood {
  const char *socket;
  uint16_t type;                /* GSHM_WIRE_* */
  const ProtobufCMessage *msg;  /* NULL: Empty */
  unsigned n;
};

/* As nobody (harness_kid_start): connects to gshmd's socket, says hello,
 * pipelines the flood's n requests (reading the replies that come
 * meanwhile, never waiting for one), steps, and waits for the parent's
 * step before it goes. */
static void flood_kid(struct harness_kid *k, void *arg) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  const struct flood *f = arg;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Gshm__Hello h = GSHM__HELLO__INIT;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), nfds = 0, fds[4];

  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->socket);
  h.major = GSHM_PROTO_MAJOR;
  h.client_name = "flood";
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
      gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &h.base, -1) ||
      gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0) <= 0)
    _exit(3);
  for (uint32_t i = 0; i < f->n; i++) {
    if (gshm__wire_send(fd, f->type, 2 + i, f->msg, -1))
      _exit(4);
    while (gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, MSG_DONTWAIT) > 0)
      ; /* (the replies that came: a client that reads none is dropped) */
  }
  harness_kid_step(k->out);
  harness_kid_await(k->in, 30000);
  close(fd);
}

/* Runs f as nobody; returns once its requests are all sent, with the
 * kid waiting for its step (flood_end). */
static void flood_start(struct harness_kid *k, struct flood *f) {
  assert_int_equal(harness_kid_start(k, HARNESS_NOBODY, HARNESS_NOBODY, flood_kid, f), 0);
  assert_true(harness_kid_await(k->from_kid, 30000)); /* (all sent) */
}

static void flood_end(struct harness_kid *k) {
  harness_kid_step(k->to_kid);
  assert_int_equal(harness_kid_wait(k), 0);
}

/* The Lists after `after` that reach ro within ms, answered after that
 * (counts: rogue_answer_count; others refused); other requests refused. */
static unsigned lists_asked(struct rogue *ro, uint64_t after, int ms) {
  static Gshm__Cluster__Msg *held[FLOOD];
  int64_t end = now_ms() + ms;
  unsigned n = 0;

  while (now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(ro, 20);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && m->list->after == after &&
        n < FLOOD) {
      held[n++] = m;
      continue;
    }
    if (m) {
      rogue_send_status(ro, m->request_id, 2, "the rogue sends no bytes");
      gshm__cluster__msg__free_unpacked(m, NULL);
    }
  }
  for (unsigned i = 0; i < n; i++) {
    if (!rogue_answer_count(ro, held[i]))
      rogue_send_status(ro, held[i]->request_id, 2, "the rogue lists nothing");
    gshm__cluster__msg__free_unpacked(held[i], NULL);
  }
  return n;
}

/* PEERS needs no right; each one asks every peer that is up for its
 * count, and the one here answers none for 1.5 s: nobody's FLOOD
 * requests send it at most PEERS_QUERIES (the rest are answered at once
 * with the counts known; the old code sent every one, and kept each
 * query, timer and request until its count came or the link failed). */
static void test_peers_flood(void **state) {
  struct flood f = {.socket = P.h.socket_path, .type = GSHM_WIRE_PEERS, .n = FLOOD};
  struct harness_kid k;
  gshm_cluster_pull_t *pv = NULL;
  size_t npv = 0;
  gshm_client_t *p;
  unsigned asked;
  (void)state;

  flood_start(&k, &f);
  asked = lists_asked(&rs, UINT64_MAX, 1500);
  flood_end(&k);
  printf("%d PEERS from nobody, their counts unanswered: %u count requests to the peer\n",
         FLOOD, asked);
  assert_true(asked >= 1);
  assert_true(asked <= PEERS_QUERIES);
  p = connect_to(&P); /* (gshmd is alive and answers) */
  assert_int_equal(gshm_cluster_pulls(p, &pv, &npv), 0);
  gshm_free(pv);
  gshm_disconnect(p);
}

/* nobody, a member of cluster.pull_group, pipelines FLOOD set pulls and
 * as many remote listings of a peer that answers none of its Lists for
 * 1.5 s: each reaches the peer as a List, at most PULLS_PER_USER of each
 * (the rest refused busy at once; the old code made a set (or a
 * listing), its registry client and a request of every one, kept until
 * the peer answered or the link failed); once the Lists are refused, no
 * pull is left. */
static void test_pull_flood(void **state) {
  static struct node Q;
  Gshm__PullRequest pr = GSHM__PULL_REQUEST__INIT;
  Gshm__RemoteListRequest rl = GSHM__REMOTE_LIST_REQUEST__INIT;
  struct flood f = {.type = GSHM_WIRE_PULL, .msg = &pr.base, .n = FLOOD};
  gshm_cluster_pull_t *pv = NULL;
  size_t npv = 1;
  struct harness_kid k;
  struct rogue rq;
  unsigned sets, lists;
  int qlfd;
  gshm_client_t *q;
  (void)state;

  qlfd = node_with_rogue(&Q, &rq, "cluster.pull_group=nogroup", NULL);
  f.socket = Q.h.socket_path;
  pr.peer = "rs";
  pr.name = "pub/";
  pr.prefix = true;
  flood_start(&k, &f);
  sets = lists_asked(&rq, 0, 1500);
  flood_end(&k);
  rl.peer = "rs";
  rl.after = 7;
  f.type = GSHM_WIRE_REMOTE_LIST;
  f.msg = &rl.base;
  flood_start(&k, &f);
  lists = lists_asked(&rq, 7, 1500);
  flood_end(&k);
  printf("%d set pulls and %d listings from nobody, no List answered: %u and %u Lists to the "
         "peer\n",
         FLOOD, FLOOD, sets, lists);
  assert_true(sets >= 1 && sets <= PULLS_PER_USER);
  assert_true(lists >= 1 && lists <= PULLS_PER_USER);
  q = connect_to(&Q);
  for (int i = 0; i < 100 && npv; i++) {
    gshm_free(pv);
    pv = NULL;
    assert_int_equal(gshm_cluster_pulls(q, &pv, &npv), 0);
    rogue_run(&rq, 50);
  }
  gshm_free(pv);
  assert_int_equal(npv, 0);
  assert_nothing_left(q, NULL);
  gshm_disconnect(q);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
}

/* What a peer says in a refusal reaches the requester's error (and so
 * a terminal): a set refused at its listing, or at a Read, with escape
 * sequences and newlines in the message gets them as '?' (the old code
 * passed a Read's or a listing's refusal on byte for byte). */
#define EVIL "no\x1b]0;owned\x07 such\n<0>forged line\r"
static void refused_with(bool at_read) {
  static struct bg bg;

  bg_start(&bg, P.h.socket_path, NULL);
  while (!bg.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && at_read)
      send_listing(&rs, m->request_id, 1, 4096, "host");
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      rogue_send_grant_at(&rs, m->request_id, 1, m->grant_request->name, 4096, "host");
    else if (m->request_id && !rogue_answer_count(&rs, m)) /* (a Release expects none) */
      rogue_send_status(&rs, m->request_id, 2, EVIL);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("refused at its %s: %d '%s'\n", at_read ? "read" : "listing", bg.err, bg.msg);
  assert_int_equal(bg.err, -EINVAL);
  assert_non_null(strstr(bg.msg, "owned"));
  for (const char *c = bg.msg; *c; c++)
    assert_true((unsigned char)*c >= 0x20 && *c != 0x7f);
}

/* A remote listing (gshm_list_remote, gshmctl segments --peer) of c in
 * the background. */
struct bg_list {
  pthread_t t;
  gshm_client_t *c;
  int err;
  size_t n;
  atomic_bool done;
};

static void *bg_list_thread(void *arg) {
  struct bg_list *bl = arg;
  gshm_segment_info_t *v = NULL;

  bl->err = gshm_list_remote(bl->c, "rs", &v, &bl->n);
  gshm_free(v);
  bl->done = true;
  return NULL;
}

/* The one page answering List rid: as many segments of one byte with
 * short names as one control frame takes (about 2,500; a page of
 * gshmd's holds at most 256). */
static void send_crowded_page(struct rogue *ro, uint32_t rid) {
  enum { MAX = 4096 };
  static Gshm__Cluster__Segment segs[MAX];
  static Gshm__Cluster__Segment *ptrs[MAX];
  static char names[MAX][16];
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;

  m.request_id = rid;
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  m.list_reply = &r;
  r.segments = ptrs;
  while (r.n_segments < MAX && gshm__cluster__msg__get_packed_size(&m) < 65536 - 200) {
    size_t i = r.n_segments++;
    segment_at(&segs[i], names[i], sizeof(names[i]), (unsigned)i, 1, "host");
    ptrs[i] = &segs[i];
  }
  r.n_segments--; /* (the last one passed the frame's size) */
  r.total = (uint32_t)r.n_segments;
  rogue_send(ro, &m);
}

/* A peer answers a local client's remote listing with one page of
 * thousands of tiny segments (within its 64 KiB frame): the reply that
 * gshmd made of it for the client (each entry some 15 bytes larger
 * locally) did not fit one packet, and gshmd closed the client's
 * connection ("reply too large"): its leases all ended, and an unlinked
 * segment it still mapped was freed and read zeros.  Now such a page is
 * refused (-EPROTO) and the client keeps its connection and leases. */
static void test_remote_list_crowded(void **state) {
  static struct bg_list bl;
  unsigned char want[4096], got[4096];
  gshm_segment_t *held;
  void *addr;
  gshm_client_t *c = connect_to(&P);
  (void)state;

  for (size_t i = 0; i < sizeof(want); i++)
    want[i] = (unsigned char)(i * 7 + 1);
  assert_int_equal(gshm_create(c, "held/x", sizeof(want), NULL, 0600, 0, &held), 0);
  assert_int_equal(gshm_write(held, 0, want, sizeof(want)), 0);
  assert_int_equal(gshm_map(held, NULL, 0, &addr), 0);
  assert_int_equal(gshm_unlink(c, "held/x"), 0); /* (the lease alone keeps it) */
  memset(&bl, 0, sizeof(bl));
  bl.c = c;
  assert_int_equal(pthread_create(&bl.t, NULL, bg_list_thread, &bl), 0);
  while (!bl.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && !rogue_answer_count(&rs, m))
      send_crowded_page(&rs, m->request_id);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bl.t, NULL);
  printf("a crowded page: %d (%zu segments); the mapping reads %s\n", bl.err, bl.n,
         memcmp(addr, want, sizeof(want)) ? "other bytes" : "its bytes");
  assert_memory_equal(addr, want, sizeof(want));
  assert_int_equal(bl.err, -EPROTO);
  assert_int_equal(gshm_read(held, 0, got, sizeof(got)), 0); /* the lease is still good */
  assert_memory_equal(got, want, sizeof(got));
  assert_int_equal(gshm_unmap(held), 0);
  assert_int_equal(gshm_close(held), 0);
  gshm_disconnect(c);
}

static void test_peer_text_cleaned(void **state) {
  gshm_client_t *p = connect_to(&P);
  (void)state;

  refused_with(false);
  refused_with(true);
  assert_nothing_left(p, "pub/s0");
  gshm_disconnect(p);
}

/* ---- a local user's set in flight, relayed under another user's name ---- */

/* nobody's set pull (in a child of that uid) of the rogue's "m/" as
 * local "g/" with --replace, group-readable. */
static int nobody_pulls_over(const char *socket_path) {
  gshm_pull_opts_t o = {.local_name = "g/", .mode = 0640, .replace = 1};
  gshm_pull_result_t *v = NULL;
  size_t n = 0;
  gshm_client_t *c;
  int e;

  if (gshm_connect(socket_path, "nobody", &c))
    return 1;
  e = gshm_pull_prefix(c, "rs", "m/", &o, &v, &n);
  gshm_free(v);
  gshm_disconnect(c);
  return e == 0 ? 0 : 2; /* (its publish must fail: g/shared is root's) */
}

static void *nobody_thread(void *arg) {
  struct node *q = arg;
  return (void *)(intptr_t)harness_as_nobody(nobody_pulls_over, q->h.socket_path);
}

/* Sends m (request rid, body body) from rb; its answer, which must be of
 * body `want` (the caller frees it). */
static Gshm__Cluster__Msg *ask(struct rogue *rb, Gshm__Cluster__Msg *m, uint32_t rid, int want) {
  Gshm__Cluster__Msg *a;
  m->request_id = rid;
  rogue_send(rb, m);
  assert_non_null(a = rogue_recv(rb, 10000));
  assert_int_equal(a->body_case, want);
  return a;
}

/* Rogue rb's List (with segments in flight) of q's "g/shared", and its
 * grant request of it as listed in flight: whether each saw one in flight. */
static void relayed_view(struct rogue *rb, bool *listed_in_flight, bool *granted_in_flight) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT, *a;
  Gshm__Cluster__ListRequest lr = GSHM__CLUSTER__LIST_REQUEST__INIT;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  unsigned named = 0;

  lr.with_in_flight = true;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  m.list = &lr;
  a = ask(rb, &m, 1, GSHM__CLUSTER__MSG__BODY_LIST_REPLY);
  for (size_t i = 0; i < a->list_reply->n_segments; i++)
    if (!strcmp(a->list_reply->segments[i]->name, "g/shared")) {
      named++;
      *listed_in_flight = a->list_reply->segments[i]->in_flight;
    }
  assert_int_equal(named, 1);
  gshm__cluster__msg__free_unpacked(a, NULL);
  gr.name = "g/shared";
  gr.in_flight = true;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  a = ask(rb, &m, 2, GSHM__CLUSTER__MSG__BODY_GRANT);
  *granted_in_flight = a->grant->segment->in_flight;
  gshm__cluster__msg__free_unpacked(a, NULL);
}

/* The rogue "rs" lists nobody's set (one host segment "m/shared") and
 * holds its grant request: nobody's hidden copy, to be published as
 * "g/shared", exists then.  Returns the grant request's id.  (size: the
 * segment's bytes: hold_set_of; hold_set's is a page.) */
static uint32_t hold_set_of(struct rogue *rq, uint64_t size) {
  int64_t end = now_ms() + 20000;

  while (now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(rq, 20);
    uint32_t rid;
    if (!m) {
      assert_false(rq->failed);
      continue;
    }
    rid = m->request_id;
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && !rogue_answer_count(rq, m)) {
      static Gshm__Cluster__Segment seg, *ptrs[1] = {&seg};
      Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
      Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;
      segment_at(&seg, (char[16]){0}, 16, 0, size, "host");
      seg.name = "m/shared";
      r.segments = ptrs;
      r.n_segments = r.total = 1;
      a.request_id = rid;
      a.status = 1;
      a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
      a.list_reply = &r;
      rogue_send(rq, &a);
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      gshm__cluster__msg__free_unpacked(m, NULL);
      return rid;
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  fail_msg("no grant request from the set");
  return 0;
}

static uint32_t hold_set(struct rogue *rq) { return hold_set_of(rq, 4096); }

/* Starts relaying node q (exports, "--set" value set1 or NULL) whose
 * peers are the rogue ro, serving as "rs", and "b" (a rogue puller may
 * connect as b), and takes q's link to ro; the cluster key into rkey.
 * Returns ro's listening socket (for the caller to close). */
static int relay_with_rogue(struct node *q, struct rogue *ro, const char *exports,
                            const char *set1, uint8_t rkey[32]) {
  char peers[96];
  int port, qlfd;

  rogue_key(keys.key, rkey);
  assert_true((qlfd = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "rs=127.0.0.1:%d b=127.0.0.1:1", port);
  node_start(q, "q", peers, keys.key, exports, set1, NULL);
  memset(ro, 0, sizeof(*ro));
  assert_int_equal(rogue_accept(ro, qlfd, "rs", rkey), 0);
  return qlfd;
}

/* A local user of a relaying node (nobody, in cluster.pull_group and in
 * the group of an export rule "g/ * :@nogroup") pulls a set with
 * --replace into a name that another member's exported segment then
 * takes (root's "g/shared", group nogroup, 0640, made while the set is in
 * flight), which it may not replace: its publish would fail.  Yet while it was in flight the node listed
 * its copy to peers in place of root's (the page dropped the published
 * one) and granted it to a grant request of the name in flight: a peer's
 * set pull of "g/" took nobody's bytes as "g/shared".  Now a set in
 * flight stands for a live name only where its user may replace it. */
static void test_relay_name_not_replaceable(void **state) {
  static struct node Q;
  static struct rogue rq, rb;
  uint8_t rkey[32];
  uint32_t held;
  bool listed_in_flight = true, granted_in_flight = true;
  pthread_t t;
  void *ret;
  gshm_client_t *c;
  int qlfd = relay_with_rogue(&Q, &rq, "g/*:@nogroup", "cluster.pull_group=nogroup", rkey);
  (void)state;

  c = connect_to(&Q);
  assert_int_equal(pthread_create(&t, NULL, nobody_thread, &Q), 0);
  held = hold_set(&rq);
  /* root's segment under the name once nobody's set is in flight: made
   * before, the pull is refused at its listing (not nobody's to replace,
   * b54bc5f) and no set is ever in flight over it */
  make_segment(c, "g/shared", 4096, 62);
  assert_int_equal(gshm_chmod(c, "g/shared", 0640), 0);
  assert_int_equal(gshm_chown(c, "g/shared", (uint32_t)-1, HARNESS_NOBODY), 0);
  assert_int_equal(rogue_connect(&rb, Q.port, "b", "q", rkey), 0);
  relayed_view(&rb, &listed_in_flight, &granted_in_flight);
  printf("root's g/shared with nobody's set in flight over it: listed %s, granted %s\n",
         listed_in_flight ? "nobody's copy" : "root's", granted_in_flight ? "nobody's copy" : "root's");
  rogue_close(&rb);
  rogue_send_status(&rq, held, 2, "the rogue grants nothing");
  pthread_join(t, &ret);
  assert_int_equal((intptr_t)ret, 2);
  assert_false(listed_in_flight);
  assert_false(granted_in_flight);
  check_segment(c, "g/shared", 4096, 62);
  assert_int_equal(gshm_unlink(c, "g/shared"), 0);
  assert_nothing_left(c, NULL); /* (nobody's copy went with its set) */
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
}

/* root's set pull of the rogue's "m/" as local "g/" of mode `mode` on
 * q: its result (1: no connection). */
static int root_pull(struct node *q, unsigned mode) {
  gshm_pull_result_t *v = NULL;
  size_t n = 0;
  gshm_client_t *c;
  int e;

  if (gshm_connect(q->h.socket_path, "root", &c))
    return 1;
  e = gshm_pull_prefix(c, "rs", "m/", &(gshm_pull_opts_t){.local_name = "g/", .mode = mode},
                       &v, &n);
  gshm_free(v);
  gshm_disconnect(c);
  return e;
}

static void *root_pull_thread(void *arg) { return (void *)(intptr_t)root_pull(arg, 0644); }

/* rb, a new link of peer "b" to relaying node q, takes a grant of q's
 * "g/shared" in flight: its grant id. */
static uint64_t grant_in_flight(struct rogue *rb, struct node *q, const uint8_t rkey[32]) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT, *a;
  Gshm__Cluster__GrantRequest gr = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  uint64_t gid;

  memset(rb, 0, sizeof(*rb));
  assert_int_equal(rogue_connect(rb, q->port, "b", "q", rkey), 0);
  gr.name = "g/shared";
  gr.in_flight = true;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  m.grant_request = &gr;
  a = ask(rb, &m, 1, GSHM__CLUSTER__MSG__BODY_GRANT);
  assert_true(a->grant->segment->in_flight);
  gid = a->grant->grant_id;
  gshm__cluster__msg__free_unpacked(a, NULL);
  return gid;
}

/* A relaying node's set fails (its peer refuses a grant) while another
 * peer holds a grant of one of its segments in flight: the segment was
 * kept, hidden and nameless, for as long as that peer kept its grant
 * (its link up): its memory charged to the user who pulled, which no
 * revoke could reach (it has no id) and which the user could not free.
 * Now the peers' grants of a failed pull's segments end with it, as a
 * revoke's do (the next Read is refused as before: the relay's own pull
 * failed). */
static void test_relay_failed_grant_ends(void **state) {
  static struct node Q;
  static struct rogue rq, rb;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT, *a;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  gshm_status_info_t st = {0};
  uint8_t rkey[32];
  uint32_t held;
  pthread_t t;
  void *ret;
  gshm_client_t *c;
  int qlfd = relay_with_rogue(&Q, &rq, "g/*", NULL, rkey);
  (void)state;

  c = connect_to(&Q);
  assert_int_equal(pthread_create(&t, NULL, root_pull_thread, &Q), 0);
  held = hold_set(&rq);
  rd.grant_id = grant_in_flight(&rb, &Q, rkey);
  rogue_send_status(&rq, held, 2, "the rogue grants nothing");
  pthread_join(t, &ret);
  assert_int_equal((intptr_t)ret, -EINVAL);
  for (int i = 0; i < 50; i++, usleep(20000)) {
    assert_int_equal(gshm_status(c, &st), 0);
    if (!st.bytes)
      break;
  }
  printf("a failed set's segment granted to a peer: %" PRIu64 " bytes kept\n", st.bytes);
  rd.length = 4096;
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  a = ask(&rb, &m, 2, GSHM__CLUSTER__MSG__BODY__NOT_SET);
  printf("the peer's Read then: status %u '%s'\n", a->status, a->message);
  assert_int_equal(a->status, 20); /* (STATUS_PEER_LOST: as a lost source, relay.h) */
  assert_non_null(strstr(a->message, "own pull of that segment failed"));
  gshm__cluster__msg__free_unpacked(a, NULL);
  assert_int_equal(st.bytes, 0);
  rogue_close(&rb);
  assert_nothing_left(c, NULL);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
}


/* ---- a relay's parked reads, looked at as its bytes land ---- */

#define SCAN_SIZE (32 * MiB)  /* 8,192 granules of cluster.pull_chunk = 4 KiB */
#define SCAN_LINKS 4          /* the links of one peer */
#define SCAN_READS 64         /* reads parked a link (relay.h RELAY_MAX_PARKED) */

/* pid's CPU time so far (user and system), in ms. */
static long cpu_ms(pid_t pid) {
  char path[64], buf[1024], *p;
  unsigned long ut, st;
  size_t n;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  assert_non_null(f = fopen(path, "re"));
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  assert_non_null(p = strrchr(buf, ')')); /* (fields 14 and 15: utime, stime) */
  assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                   2);
  return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

struct scan_pull {
  struct node *q;
  atomic_bool done;
  int err;
};

static void *scan_pull_thread(void *arg) {
  struct scan_pull *sp = arg;
  sp->err = root_pull(sp->q, 0644);
  sp->done = true;
  return NULL;
}

static void scan_sent(void *arg, int err) { (void)arg, (void)err; }

/* rb (a link of peer "b" to q) takes a grant of q's "g/shared" in flight
 * and asks SCAN_READS reads of all of it, which q parks. */
static void park_reads(struct rogue *rb, struct node *q, const uint8_t rkey[32]) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;

  rd.grant_id = grant_in_flight(rb, q, rkey);
  rd.length = SCAN_SIZE;
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  for (uint32_t i = 0; i < SCAN_READS; i++) {
    m.request_id = 2 + i;
    rogue_send(rb, &m);
  }
  rogue_run(rb, 50);
}

/* root's set pull of rq's "m/" (one segment of SCAN_SIZE) on relaying
 * node q, with nlinks links of peer "b" (rb) each parking SCAN_READS
 * reads of all of it first: q's CPU time in ms from the grant to the
 * pull's end (every Read rq answered at once with its bytes). */
static long relay_pull(struct node *q, struct rogue *rq, struct rogue *rb, int nlinks,
                       const uint8_t rkey[32]) {
  static uint8_t bytes[SCAN_SIZE];
  struct scan_pull sp = {.q = q};
  gshm_client_t *c = connect_to(q);
  long waits = metric(c, "gshm_cluster_relay_waits_total"), cpu;
  int64_t end = now_ms() + 120000;
  uint32_t rid;
  pthread_t t;

  assert_int_equal(pthread_create(&t, NULL, scan_pull_thread, &sp), 0);
  rid = hold_set_of(rq, SCAN_SIZE);
  for (int k = 0; k < nlinks; k++)
    park_reads(&rb[k], q, rkey);
  for (int i = 0; i < 100 && metric(c, "gshm_cluster_relay_waits_total") <
                                 waits + (long)nlinks * SCAN_READS; i++)
    usleep(20000);
  assert_int_equal(metric(c, "gshm_cluster_relay_waits_total"), waits + (long)nlinks * SCAN_READS);
  cpu = cpu_ms(q->h.sp.pid);
  rogue_send_grant(rq, rid, 1, "m/shared", SCAN_SIZE);
  while (!sp.done && now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(rq, 20);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ)
      assert_int_equal(gshmd__stream_send_data(&rq->st, m->request_id, m->read->offset,
                                               bytes + m->read->offset, m->read->length,
                                               scan_sent, NULL),
                       0);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  cpu = cpu_ms(q->h.sp.pid) - cpu;
  pthread_join(t, NULL);
  for (int k = 0; k < nlinks; k++)
    rogue_close(&rb[k]);
  assert_int_equal(sp.err, 0);
  assert_int_equal(gshm_unlink(c, "g/shared"), 0);
  gshm_disconnect(c);
  return cpu;
}

/* A key holder parks its reads on a relay: 64 reads of the whole of a
 * 32 MiB segment the relay is still pulling, on each of its 4 links.
 * With cluster.pull_chunk at 4 KiB (its least) each landing of the
 * relay's own pull looked at every granule of every parked read from the
 * read's start up to the first that had not landed: 256 x 8,192^2 / 2,
 * some 8 billion looks over the pull's 8,192 chunks, on the loop every
 * local client waits on.  Now each parked read remembers how far its
 * range has landed.  The relay's CPU time for the pull is compared with
 * the same pull's with nothing parked. */
static void test_relay_parked_reads_scanned_once(void **state) {
  static struct node Q;
  static struct rogue rq, rb[SCAN_LINKS];
  uint8_t rkey[32];
  long alone, parked;
  int qlfd = relay_with_rogue(&Q, &rq, "g/*", "cluster.pull_chunk=4096", rkey);
  (void)state;

  alone = relay_pull(&Q, &rq, rb, 0, rkey);
  parked = relay_pull(&Q, &rq, rb, SCAN_LINKS, rkey);
  printf("relay's CPU for a 32 MiB pull in 4 KiB chunks: %ld ms alone, %ld ms with %d reads of "
         "it parked\n",
         alone, parked, SCAN_LINKS * SCAN_READS);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
  assert_true(parked < 3 * alone + 300);
}


/* ---- a relay's look at a Read's range ---- */

#define GATE_SIZE (64 * MiB)  /* the longest Read: 16,384 granules of 4 KiB */
#define GATE_READS 100000

/* rq grants root's pull of "m/shared" (GATE_SIZE, grant request rid) on
 * a relay and answers every Read of it but the last chunk's, which it
 * holds; returns once all the others are answered. */
static void serve_but_last(struct rogue *rq, uint32_t rid) {
  static uint8_t bytes[GATE_SIZE];
  uint64_t answered = 0, want = GATE_SIZE / 4096 - 1;
  int64_t end = now_ms() + 60000;

  rogue_send_grant(rq, rid, 1, "m/shared", GATE_SIZE);
  while (answered < want && now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(rq, 20);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ &&
        m->read->offset + m->read->length < GATE_SIZE) {
      assert_int_equal(gshmd__stream_send_data(&rq->st, m->request_id, m->read->offset,
                                               bytes + m->read->offset, m->read->length,
                                               scan_sent, NULL),
                       0);
      answered++;
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  assert_int_equal(answered, want);
  rogue_run(rq, 200); /* (the last frames out) */
}

static void count_any(struct rogue *r, const Gshm__Cluster__Msg *m) {
  (void)m;
  (*(uint64_t *)r->arg)++;
}

static uint64_t gate_answers;
static bool gate_answered(struct rogue *r) { return *(uint64_t *)r->arg >= gate_answers; }

/* rb's GATE_READS Reads of [off, off + len) of grant gid on q, a
 * thousand at a time, each answered (busy: q parks none past the 64 it
 * holds) but for `parked` of them: q's CPU time for them, in ms. */
static long gate_reads(struct rogue *rb, struct node *q, uint64_t gid, uint64_t off, uint64_t len,
                       unsigned parked) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  static uint64_t answers;
  long cpu = cpu_ms(q->h.sp.pid);

  answers = 0;
  rb->on_msg = count_any;
  rb->arg = &answers;
  rd.grant_id = gid;
  rd.offset = off;
  rd.length = len;
  m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  m.read = &rd;
  for (uint32_t i = 0; i < GATE_READS; i++) {
    m.request_id = 100 + i + (off ? 0 : GATE_READS);
    rogue_send(rb, &m);
    if (i % 1000 == 999) {
      gate_answers = i + 1 - parked;
      assert_true(rogue_run_until(rb, gate_answered, 30000));
    }
  }
  return cpu_ms(q->h.sp.pid) - cpu;
}

/* A relay looked at a Read of a segment it is still pulling granule by
 * granule, from the range's start to the first not landed, before it
 * served, parked or refused it: a key holder's Reads of the whole of a
 * 64 MiB segment whose last chunk had not landed (its source holding
 * it), each refused busy (the relay parks 64), cost 16,383 looks each
 * with cluster.pull_chunk at 4 KiB.  The relay's CPU for 100,000 such
 * Reads is compared with that for as many Reads of the last chunk alone. */
static void test_relay_read_range_looked_at_once(void **state) {
  static struct node Q;
  static struct rogue rq, rb;
  struct scan_pull sp = {0};
  uint8_t rkey[32];
  long last_only, whole;
  pthread_t t;
  uint64_t gid;
  int qlfd = relay_with_rogue(&Q, &rq, "g/*", "cluster.pull_chunk=4096", rkey);
  (void)state;

  sp.q = &Q;
  assert_int_equal(pthread_create(&t, NULL, scan_pull_thread, &sp), 0);
  serve_but_last(&rq, hold_set_of(&rq, GATE_SIZE));
  gid = grant_in_flight(&rb, &Q, rkey);
  last_only = gate_reads(&rb, &Q, gid, GATE_SIZE - 4096, 4096, SCAN_READS);
  whole = gate_reads(&rb, &Q, gid, 0, GATE_SIZE, 0);
  printf("relay's CPU for %d Reads refused busy: %ld ms of the missing last chunk alone, "
         "%ld ms of all 64 MiB\n",
         GATE_READS, last_only, whole);
  rogue_close(&rb);
  rogue_close(&rq); /* (root's pull fails: its source lost) */
  pthread_join(t, NULL);
  assert_int_equal(harness_stop(&Q.h), 0);
  close(qlfd);
  assert_true(whole < 3 * last_only / 2 + 200);
}

/* root_pull of mode 0600: its segments are in flight here, and no
 * export rule exports them. */
static atomic_bool private_done;
static void *private_pull_thread(void *arg) {
  int e = root_pull(arg, 0600);
  private_done = true;
  return (void *)(intptr_t)e;
}

#define BIG_SET 4096 /* pull.h PULL_SET_MAX */
static uint64_t big_last_size = 4096; /* the last segment's bytes */

/* Answers List rid (cursor after) of rq with the next page of 256 of
 * BIG_SET one-page host segments "m/sN". */
static void send_big_page(struct rogue *rq, uint32_t rid, uint64_t after) {
  static Gshm__Cluster__Segment segs[256], *ptrs[256];
  static char names[256][16];
  Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply r = GSHM__CLUSTER__LIST_REPLY__INIT;

  for (unsigned i = 0; i < 256 && after + i < BIG_SET; i++) {
    segment_at(&segs[i], names[i], sizeof(names[i]), (unsigned)after + i,
               after + i == BIG_SET - 1 ? big_last_size : 4096, "host");
    snprintf(names[i], sizeof(names[i]), "m/s%u", (unsigned)after + i);
    ptrs[r.n_segments++] = &segs[i];
  }
  r.segments = ptrs;
  r.total = BIG_SET;
  r.next = after + 256 < BIG_SET ? after + 256 : 0;
  a.request_id = rid;
  a.status = 1;
  a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  a.list_reply = &r;
  rogue_send(rq, &a);
}

/* rq lists the whole big set and holds its grant requests (their ids
 * into held, *nheld of them, at most 64). */
static void hold_big_set(struct rogue *rq, uint32_t *held, unsigned *nheld) {
  int64_t end = now_ms() + 30000;
  bool granting = false, listed = false;

  while (!(granting && listed) && now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(rq, 20);
    if (!m) {
      assert_false(rq->failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && !rogue_answer_count(rq, m)) {
      send_big_page(rq, m->request_id, m->list->after);
      listed |= m->list->after + 256 >= BIG_SET;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST && *nheld < 64) {
      held[(*nheld)++] = m->request_id;
      granting = true;
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  assert_true(granting && listed);
}

/* A relaying node pulls a set of 4096 segments that it exports to no peer
 * (mode 0600).  A peer's List with segments in flight walked every
 * segment in flight of every set past its cursor, exported or not, and
 * answered only at the end: each List of a few bytes cost the loop
 * O(segments in flight), 4096 per set here, 64 sets a user, and a peer
 * pipelines thousands of Lists in one read.  Now a page looks at no more
 * than GSHMD_LIST_VISITS (2048) of them and returns its cursor, as the
 * published segments' walk does. */
static void test_relay_list_visits_capped(void **state) {
  static struct node Q;
  static struct rogue rq, rb;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT, *a;
  Gshm__Cluster__ListRequest lr = GSHM__CLUSTER__LIST_REQUEST__INIT;
  uint8_t rkey[32];
  uint64_t next;
  uint32_t held[64];
  unsigned pages = 0, nheld = 0;
  int64_t t0;
  pthread_t t;
  void *ret;
  gshm_client_t *c;
  int qlfd = relay_with_rogue(&Q, &rq, "g/*", NULL, rkey);
  (void)state;

  c = connect_to(&Q);
  private_done = false;
  assert_int_equal(pthread_create(&t, NULL, private_pull_thread, &Q), 0);
  hold_big_set(&rq, held, &nheld);
  assert_int_equal(rogue_connect(&rb, Q.port, "b", "q", rkey), 0);
  lr.with_in_flight = true;
  m.body_case = GSHM__CLUSTER__MSG__BODY_LIST;
  m.list = &lr;
  a = ask(&rb, &m, 1, GSHM__CLUSTER__MSG__BODY_LIST_REPLY);
  next = a->list_reply->next;
  assert_int_equal(a->list_reply->n_segments, 0); /* (none exported) */
  gshm__cluster__msg__free_unpacked(a, NULL);
  for (lr.after = next; lr.after && pages < 64; pages++) { /* (the rest, by its cursor) */
    a = ask(&rb, &m, 2 + pages, GSHM__CLUSTER__MSG__BODY_LIST_REPLY);
    assert_int_equal(a->list_reply->n_segments, 0);
    assert_true(!a->list_reply->next || a->list_reply->next > lr.after);
    lr.after = a->list_reply->next;
    gshm__cluster__msg__free_unpacked(a, NULL);
  }
  lr.after = 0;
  t0 = now_ms();
  for (uint32_t i = 0; i < 1000; i++) {
    m.request_id = 100 + i;
    rogue_send(&rb, &m);
  }
  for (unsigned i = 0; i < 1000; i++) {
    assert_non_null(a = rogue_recv(&rb, 30000));
    gshm__cluster__msg__free_unpacked(a, NULL);
  }
  printf("List with 4096 unexported segments in flight: first page's cursor %" PRIu64
         ", %u more pages; 1000 pipelined Lists answered in %" PRId64 " ms\n",
         next, pages, now_ms() - t0);
  rogue_close(&rb);
  for (unsigned i = 0; i < nheld; i++)
    rogue_send_status(&rq, held[i], 2, "the rogue grants nothing");
  for (int64_t end = now_ms() + 20000; !private_done && now_ms() < end;) {
    Gshm__Cluster__Msg *g = rogue_recv(&rq, 20);
    if (g && g->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
      rogue_send_status(&rq, g->request_id, 2, "the rogue grants nothing");
    if (g)
      gshm__cluster__msg__free_unpacked(g, NULL);
  }
  pthread_join(t, &ret);
  assert_int_equal((intptr_t)ret, -EINVAL);
  assert_true(next != 0); /* (walked every segment in flight before: 0, the end) */
  assert_nothing_left(c, NULL);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
}

/* ---- a set whose first segment stays open ---- */

#define BIG_LAST (16 * MiB) /* the set's last segment: 4,096 chunks of 4 KiB */

/* root's pull of the BIG_SET set "m/" on q, served by rq: rq lists it,
 * grants and answers every segment but "m/s<held>", whose grant request
 * it holds (a source that never finishes that one), until the others'
 * bytes are all sent and landed; the last segment's (BIG_LAST bytes) a
 * chunk a millisecond, as a source that sends no faster would (a turn
 * of q's loop each).  Then it refuses the held one and waits for the
 * pull's end.  Returns q's CPU time in ms from the last segment's first
 * chunk to its bytes landed. */
static long big_set_held_at(struct rogue *rq, struct node *q, unsigned held) {
  static uint8_t bytes[4096];
  uint32_t held_rid = 0;
  unsigned answered = 0, k;
  uint64_t last_sent = 0;
  int64_t end = now_ms() + 120000;
  long cpu = -1;
  pthread_t t;
  void *ret;

  private_done = false;
  assert_int_equal(pthread_create(&t, NULL, private_pull_thread, q), 0);
  big_last_size = BIG_LAST;
  while ((answered < BIG_SET - 2 || last_sent < BIG_LAST || !held_rid) && now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(rq, 20);
    if (!m) {
      assert_false(rq->failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST && !rogue_answer_count(rq, m))
      send_big_page(rq, m->request_id, m->list->after);
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST &&
        sscanf(m->grant_request->name, "m/s%u", &k) == 1) {
      if (k == held)
        held_rid = m->request_id;
      else
        rogue_send_grant(rq, m->request_id, k + 1, m->grant_request->name,
                         k == BIG_SET - 1 ? BIG_LAST : 4096);
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ) {
      bool last = m->read->grant_id == 1000 + BIG_SET;
      assert_true(m->read->length <= sizeof(bytes));
      assert_int_equal(gshmd__stream_send_data(&rq->st, m->request_id, m->read->offset,
                                               bytes, m->read->length, scan_sent, NULL),
                       0);
      if (last && cpu < 0)
        cpu = cpu_ms(q->h.sp.pid);
      if (last)
        rogue_run(rq, 1);
      last_sent += last ? m->read->length : 0;
      answered += !last;
    }
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  assert_int_equal(answered, BIG_SET - 2);
  assert_int_equal(last_sent, BIG_LAST);
  rogue_run(rq, 300); /* (the last bytes out, and landed) */
  cpu = cpu_ms(q->h.sp.pid) - cpu;
  rogue_send_status(rq, held_rid, 2, "the rogue never finishes this one");
  for (end = now_ms() + 30000; !private_done && now_ms() < end;) {
    Gshm__Cluster__Msg *g = rogue_recv(rq, 20);
    if (g)
      gshm__cluster__msg__free_unpacked(g, NULL);
  }
  pthread_join(t, &ret);
  assert_int_equal((intptr_t)ret, -EINVAL);
  big_last_size = 4096;
  return cpu;
}

/* A set's pass over its segments (each turn of the cluster loop: closing
 * the finished ones, asking for chunks, sending the Releases owed)
 * walked every segment from its first still open to the last started: a
 * set of 4096 whose first segment its source never finishes walked the
 * thousands done since on every turn, some 12,000 looks (70 us here) a
 * turn, which nearly doubled the relay's CPU time for the rest of the
 * set.  Now the walks jump over the closed segments.  The relay's CPU
 * time for the set's last segment, 16 MiB in 4 KiB chunks arriving a
 * millisecond apart, is compared with the same set's whose held segment
 * is the one before it (all the others closed: nothing to walk). */
static void test_set_first_held_walk(void **state) {
  static struct node Q;
  static struct rogue rq;
  long last, first;
  int qlfd = node_with_rogue(&Q, &rq, "cluster.pull_chunk=4096", NULL);
  (void)state;

  last = big_set_held_at(&rq, &Q, BIG_SET - 2);
  first = big_set_held_at(&rq, &Q, 0);
  printf("CPU for a 4096-segment set's last 16 MiB in 4 KiB chunks: %ld ms with the segment "
         "before it held open, %ld ms with the first\n",
         last, first);
  assert_int_equal(harness_stop(&Q.h), 0);
  rogue_close(&rq);
  close(qlfd);
  /* (without the skip: 740-810 ms against 380-420, ASan 1,300 against
   * 630; with it within 10% either way: a bound with room for CI's
   * loaded cores that the walk still fails) */
  assert_true(first < 3 * last / 2 + 60);
}

/* A peer lists one 4 KiB segment at `listed` and grants it at `granted`
 * (the set asks for location `location`): -ESTALE before a byte is read. */
static void grant_elsewhere(gshm_client_t *p, const char *listed, const char *granted,
                            const char *location) {
  static struct bg bg;
  unsigned reads = 0;

  bg_start(&bg, P.h.socket_path, location);
  while (!bg.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rs, 20);
    if (!m) {
      assert_false(rs.failed);
      continue;
    }
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_LIST)
      send_listing(&rs, m->request_id, 1, 4096, listed);
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) /* (pub/s0, id 1) */
      rogue_send_grant_at(&rs, m->request_id, 1, m->grant_request->name, 4096, granted);
    else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ && ++reads)
      send_error(m->request_id);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("listed at %s, granted at %s: %d %s\n", listed, granted, bg.err, bg.msg);
  assert_int_equal(reads, 0);
  assert_int_equal(bg.err, -ESTALE);
  assert_non_null(strstr(bg.msg, "peer 'rs'"));
  assert_non_null(strstr(bg.msg, "not the one it listed"));
  assert_nothing_left(p, "pub/s0");
}

/* The listing's word on where the segment is holds at its grant (a set
 * pulled into the host: no GPU needed here). */
static void test_grant_elsewhere(void **state) {
  gshm_client_t *p = connect_to(&P);
  (void)state;

  grant_elsewhere(p, "host", "cuda:0", NULL);
  grant_elsewhere(p, "cuda:0", "host", "host");
  gshm_disconnect(p);
}

/* gshmd stops (SIGTERM) just after a set's listing, with its host
 * segments' pieces on the thread pool: the requester is told why at
 * once, gshmd waits for the pieces, ends the set and exits clean (under
 * ASan: nothing touched after it was freed). */
static void test_stop_mid_prefault(void **state) {
  static struct bg bg;
  static struct node Q;
  struct rogue rq;
  int qlfd, status = -1;
  (void)state;

  qlfd = node_with_rogue(&Q, &rq, "cluster.prefault=always", NULL);
  bg_start(&bg, Q.h.socket_path, NULL);
  while (status < 0) {
    Gshm__Cluster__Msg *m = rogue_recv(&rq, 20);
    assert_false(rq.failed);
    if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      send_listing(&rq, m->request_id, LISTED, LISTED_SIZE, "host");
      rogue_run(&rq, 2); /* (sent) */
      usleep(5000);      /* its first pieces are on the pool (here: every run) */
      status = harness_stop(&Q.h);
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  pthread_join(bg.t, NULL);
  printf("stopped mid-prefault: status %d; the set: %d %s\n", status, bg.err, bg.msg);
  assert_int_equal(status, 0);
  /* (the old code: "connection to gshmd lost", its set answered after
   * the server had closed the requester's connection) */
  assert_non_null(strstr(bg.msg, "gshmd is stopping"));
  rogue_close(&rq);
  close(qlfd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefault_capped),
      cmocka_unit_test(test_grant_elsewhere),
      cmocka_unit_test(test_peer_text_cleaned),
      cmocka_unit_test(test_remote_list_crowded),
      cmocka_unit_test(test_relay_name_not_replaceable),
      cmocka_unit_test(test_relay_failed_grant_ends),
      cmocka_unit_test(test_relay_parked_reads_scanned_once),
      cmocka_unit_test(test_relay_read_range_looked_at_once),
      cmocka_unit_test(test_relay_list_visits_capped),
      cmocka_unit_test(test_set_first_held_walk),
      cmocka_unit_test(test_populate_listed),
      cmocka_unit_test(test_peers_flood),
      cmocka_unit_test(test_pull_flood),
      cmocka_unit_test(test_stop_mid_prefault),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
