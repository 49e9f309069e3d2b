/* SPDX-License-Identifier: Apache-2.0 */
/* A serving peer that holds the cluster key (rogue.h) and lies in the
 * headers of the data frames it sends on the lanes of P's link to it.
 * Where gshmd builds a pull's 2 MiB pages itself (shmem_enabled never,
 * Linux 6.5+: gshm_host_pull_huge_pages 2), a lane thread builds the
 * pages of the chunk a frame answers as soon as its header came, before
 * any of its bytes (daemon/cluster/data.c gshmd__landing_claim); so a
 * header alone makes P allocate memory.  docs/SECURITY.md says that this
 * is bounded by the chunks asked for, as the bytes are: at most each
 * chunk asked for plus one 2 MiB page on either side.  Played here
 * against an honest P (host memfd backend, TCP on 127.0.0.1, two lanes,
 * 3 MiB chunks so that every chunk shares a 2 MiB page with the next,
 * cluster.prefault = off so that no thread but the lanes builds):
 * - headers that answer no Read as asked: a request id never asked, the
 *   next id (not asked yet), an offset a page further or past the
 *   segment, a length a page longer, the longest, shorter, 0, a frame
 *   that is not data, and another pull's request id with the range of a
 *   chunk of this one: each fails the pull with -EPROTO, a protocol
 *   refusal that names the data lane, and builds nothing at all;
 * - the exact headers of two chunks asked for and then no byte: P builds
 *   at most those chunks' pages (and allocates no more) until the lane's
 *   stall timeout fails the pull (-ETIMEDOUT);
 * - a chunk's header sent again, on the other lane, while its first frame
 *   is halfway or after it landed: -EPROTO, nothing but that chunk's
 *   pages built;
 * - every chunk whole, in reverse order across both lanes: every byte
 *   right, at most each chunk's pages built.
 * After each: no segment nor byte of the pull left, the user's other
 * segments (one made, one pulled) byte for byte as they were, and the
 * node pulls honestly from the same peer afterwards and stops cleanly.
 * Where gshmd builds no page here, the checks of bytes allocated, errors
 * and other segments still run, and each test says what it skipped. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "lane_io.h"
#include "nodes.h"
#include "rogue.h"
#include "stream.h"

#define LANES 2                   /* P's cluster.streams */
#define CHUNK (3 * MiB)           /* P's cluster.pull_chunk: chunks straddle 2 MiB pages */
#define HUGE (2 * MiB)
#define SEG_X (21 * MiB + 12288)  /* "pub/x": 8 chunks, the last 12 KiB */
#define SEG_Y (9 * MiB + 4096)    /* "pub/y": 4 chunks, the last 4 KiB */
#define SEED_X 2301
#define SEED_Y 2302
#define TIMEOUT_MS 4000           /* P's cluster.request_timeout_ms: a lane's stall */
#define STR_(x) #x
#define STR(x) STR_(x)
#define MAX_READS 64

static struct cluster_keys keys;
static struct node P, Q;          /* Q: stopped mid-frame */
static struct node *target = &P;  /* the node under attack */
static struct rogue rb;
static struct rogue_lane lanes[LANES];
static int lfd;
static uint8_t rkey[32];
static uint8_t *src_x, *src_y;
static bool building;             /* P builds pulls' 2 MiB pages (metrics say 2) */
static gshm_status_info_t base;   /* P with the user's own segments only */

/* ---- the rogue's side ---------------------------------------------------- */

struct asked {
  uint32_t rid;
  uint64_t grant, off, len;
};

/* One pull through the socket of the node under attack, in the background. */
struct pull_bg {
  pthread_t t;
  const char *name, *local;
  int err;
  char msg[512];
  atomic_bool done;
};

/* What the rogue saw and did during one play. */
struct play {
  struct asked r[MAX_READS];
  unsigned n;                     /* Reads recorded, in the order they came */
  unsigned want;                  /* act once this many came */
  void (*act)(struct play *pl);
  uint64_t pages;                 /* bytes of 2 MiB pages of chunks whose exact header went */
  int64_t acted_ms;               /* 0: not yet */
  long built0;                    /* gshm_host_huge_built_bytes_total before */
  uint64_t alloc0;                /* gshmd's memfds' bytes before */
  bool sampled;                   /* mid-attack figures taken (1 s after the act) */
  long mid_built;
  uint64_t mid_alloc;
};

static void *pull_thread(void *arg) {
  struct pull_bg *bg = arg;
  gshm_pull_opts_t o = {.local_name = bg->local};
  gshm_client_t *c;

  bg->err = gshm_connect(target->h.socket_path, "bg", &c);
  if (!bg->err) {
    bg->err = gshm_pull(c, "rb", bg->name, &o, NULL);
    snprintf(bg->msg, sizeof(bg->msg), "%s", gshm_last_error(c));
    gshm_disconnect(c);
  }
  bg->done = true;
  return NULL;
}

static void pull_start(struct pull_bg *bg, const char *name, const char *local) {
  memset(bg, 0, sizeof(*bg));
  bg->name = name;
  bg->local = local;
  assert_int_equal(pthread_create(&bg->t, NULL, pull_thread, bg), 0);
}

/* Bytes of the 2 MiB pages that [off, off + len) of a pulled segment of
 * size bytes falls in (its memory is whole 2 MiB pages): what a lane
 * builds for a chunk (pull.c chunk_build). */
static uint64_t pages_of(uint64_t off, uint64_t len, uint64_t size) {
  uint64_t whole = (size + HUGE - 1) / HUGE * HUGE;
  uint64_t first = off / HUGE * HUGE, end = (off + len + HUGE - 1) / HUGE * HUGE;

  return (end < whole ? end : whole) - first;
}

static uint64_t size_of(const struct asked *a) { return a->grant == 1001 ? SEG_X : SEG_Y; }
static const uint8_t *src_of(const struct asked *a) { return a->grant == 1001 ? src_x : src_y; }

/* Writes on lane i a frame header only, as a rogue may: any request id,
 * offset, length and kind (no byte, no tag follows). */
static void send_header(int i, uint32_t rid, uint64_t off, uint64_t len, uint8_t kind) {
  struct frame_hdr h = gshmd__frame_data(rid, off, len);
  struct iovec iov = {&h, sizeof(h)};

  h.kind = kind;
  assert_int_equal(gshmd__lane_write_all(lanes[i].st.fd, &iov, 1), 0);
}

/* Writes on lane i the exact answer to Read a: its header and the first
 * part bytes (all: the tag too); counts its pages as claimed. */
static void send_chunk(struct play *pl, int i, const struct asked *a, uint64_t part) {
  assert_int_equal(rogue_lane_send(&lanes[i], a->rid, a->off, src_of(a) + a->off, a->len, part),
                   0);
  pl->pages += pages_of(a->off, a->len, size_of(a));
}

static bool all_done(struct pull_bg *bgs, int n) {
  for (int i = 0; i < n; i++)
    if (!bgs[i].done)
      return false;
  return true;
}

static void grant(const Gshm__Cluster__Msg *m) {
  const char *name = m->grant_request->name;

  if (!strcmp(name, "pub/x"))
    rogue_send_grant(&rb, m->request_id, 1, "pub/x", SEG_X);
  else if (!strcmp(name, "pub/y"))
    rogue_send_grant(&rb, m->request_id, 2, "pub/y", SEG_Y);
  else
    rogue_send_status(&rb, m->request_id, 5 /* NOT_FOUND */, "no such segment");
}

/* The rogue's side until the pulls end or ms pass: grants, P's count
 * requests, Reads recorded; pl->act once pl->want Reads came (P asks for
 * every chunk at once: the budgets hold them all); P's figures 1 s
 * after it, while a stalled pull still waits (p: a client of the node;
 * NULL: none taken). */
static void serve(struct play *pl, struct pull_bg *bgs, int nbg, gshm_client_t *p, int64_t ms) {
  int64_t end = now_ms() + ms;

  while (now_ms() < end && !all_done(bgs, nbg)) {
    Gshm__Cluster__Msg *m = rogue_recv(&rb, 20);
    if (m && !rogue_answer_count(&rb, m)) {
      if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST)
        grant(m);
      else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ && pl->n < MAX_READS)
        pl->r[pl->n++] = (struct asked){m->request_id, m->read->grant_id, m->read->offset,
                                        m->read->length};
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    if (!pl->acted_ms && pl->n >= pl->want) {
      pl->act(pl);
      pl->acted_ms = now_ms();
    }
    if (p && pl->acted_ms && !pl->sampled && now_ms() - pl->acted_ms >= 1000) {
      pl->mid_built = metric(p, "gshm_host_huge_built_bytes_total");
      pl->mid_alloc = node_memfd_bytes(target->h.sp.pid, "memfd:gshm:");
      pl->sampled = true;
    }
  }
  assert_true(all_done(bgs, nbg));
  for (int i = 0; i < nbg; i++)
    pthread_join(bgs[i].t, NULL);
}

static bool lanes_up(void *arg) { return metric(arg, "gshm_cluster_lanes{peer=\"rb\"}") == LANES; }

/* Takes P's link to rb and its lanes (P links again within a few seconds
 * of its last link's end). */
static void rb_up(gshm_client_t *p) {
  assert_int_equal(rogue_accept_lanes(&rb, lfd, "rb", rkey, lanes, LANES, lanes_up, p), 0);
}

static void rb_down(void) {
  for (int i = 0; i < LANES; i++)
    rogue_lane_close(&lanes[i]);
  rogue_close(&rb);
}

/* Starts a play: the figures before. */
static void play_begin(struct play *pl, gshm_client_t *p, unsigned want,
                       void (*act)(struct play *pl)) {
  memset(pl, 0, sizeof(*pl));
  pl->want = want;
  pl->act = act;
  pl->built0 = metric(p, "gshm_host_huge_built_bytes_total");
  pl->alloc0 = node_memfd_bytes(target->h.sp.pid, "memfd:gshm:");
}

/* What every play leaves: nothing of a failed pull (no segment, hidden or
 * not, no byte: P holds the user's own segments only, and their memfds'
 * bytes no more than before), the user's segments as they were. */
static void assert_others_intact(gshm_client_t *p, const struct play *pl) {
  gshm_status_info_t st;

  assert_int_equal(gshm_status(p, &st), 0);
  assert_int_equal(st.segments, base.segments);
  assert_int_equal(st.bytes, base.bytes);
  assert_true(node_memfd_bytes(target->h.sp.pid, "memfd:gshm:") <= pl->alloc0);
  check_segment(p, "own/made", 8 * MiB, 2303);
  check_segment(p, "own/pulled", SEG_X, SEED_X);
}

/* 2 MiB pages built since pl began. */
static long built_since(gshm_client_t *p, const struct play *pl) {
  return metric(p, "gshm_host_huge_built_bytes_total") - pl->built0;
}

/* ---- plays --------------------------------------------------------------- */

static void act_in_order(struct play *pl) {
  for (unsigned i = 0; i < pl->n; i++)
    send_chunk(pl, (int)(i % LANES), &pl->r[i], pl->r[i].len);
}

static void act_reversed(struct play *pl) {
  for (unsigned i = pl->n; i-- > 0;)
    send_chunk(pl, (int)(i % LANES), &pl->r[i], pl->r[i].len);
}

/* An honest pull of pub/x into local (every chunk whole, on both lanes,
 * in order, or reversed): every byte right, at most its chunks' pages
 * built.  Returns the bytes built. */
static long pull_honest(gshm_client_t *p, const char *local, bool reversed) {
  static struct pull_bg bg; /* (static: a failed check leaves its thread) */
  struct play pl;
  long built;

  play_begin(&pl, p, 8, reversed ? act_reversed : act_in_order);
  pull_start(&bg, "pub/x", local);
  serve(&pl, &bg, 1, p, 30000);
  printf("%s pull: %d %s\n", reversed ? "reversed" : "honest", bg.err, bg.msg);
  assert_int_equal(bg.err, 0);
  assert_int_equal(pl.n, 8);
  for (unsigned i = 0; i < pl.n; i++) /* (each chunk once, at most CHUNK) */
    assert_true(pl.r[i].len == CHUNK || pl.r[i].off + pl.r[i].len == SEG_X);
  check_segment(p, local, SEG_X, SEED_X);
  built = built_since(p, &pl);
  printf("  built %ld MiB of 2 MiB pages; its chunks' pages: %" PRIu64 " MiB\n", built >> 20,
         pl.pages >> 20);
  assert_true((uint64_t)built <= pl.pages);
  /* each page counted once, however many lanes built it at once (a
   * page two chunks share counted twice: 24-26 MiB of pub/x's 22) */
  assert_true((uint64_t)built <= pages_of(0, SEG_X, SEG_X));
  return built;
}

/* P's link to rb, taken again after a play ended it. */
static bool linked;

static void link_down(void) {
  if (linked)
    rb_down();
  linked = false;
}

/* (also after a failed check left the link in any state) */
static void link_up(gshm_client_t *p) {
  if (linked) {
    rogue_run(&rb, 50);
    if (!rb.failed && lanes_up(p))
      return;
    link_down();
  }
  rb_up(p);
  linked = true;
}

/* One lie: the header sent on lane 0 once every chunk was asked for. */
enum lie_kind {
  LIE_RID_NEVER,     /* a request id never asked */
  LIE_RID_NEXT,      /* the next request id, not asked yet */
  LIE_OFF_PAGE,      /* a chunk's id, its offset a 2 MiB page further */
  LIE_OFF_PAST,      /* a chunk's id, an offset past the segment */
  LIE_OFF_FAR,       /* a chunk's id, an offset near 2^64 */
  LIE_LEN_PAGE,      /* a chunk's id and offset, a length a page longer */
  LIE_LEN_MAX,       /* ... the longest length a header holds */
  LIE_LEN_SHORT,     /* ... 4 KiB */
  LIE_LEN_ZERO,      /* ... 0 */
  LIE_NOT_DATA,      /* a chunk's exact header, of a control frame */
  LIE_OTHER_PULL,    /* pub/y's first chunk's id, the range of pub/x's first */
};

static const struct {
  enum lie_kind kind;
  const char *what;
} lies[] = {
    {LIE_RID_NEVER, "a request id never asked"},
    {LIE_RID_NEXT, "the next request id"},
    {LIE_OFF_PAGE, "an offset a page further"},
    {LIE_OFF_PAST, "an offset past the segment"},
    {LIE_OFF_FAR, "an offset near 2^64"},
    {LIE_LEN_PAGE, "a length a page longer"},
    {LIE_LEN_MAX, "the longest length"},
    {LIE_LEN_SHORT, "a shorter length"},
    {LIE_LEN_ZERO, "a length of 0"},
    {LIE_NOT_DATA, "a control frame's header"},
    {LIE_OTHER_PULL, "another pull's request id with this pull's range"},
};

static enum lie_kind lie_now;

/* The first Read of pub/x (or of pub/y: y) in pl, and the highest id. */
static const struct asked *read_of(const struct play *pl, bool y, uint32_t *max_rid) {
  const struct asked *a = NULL;

  *max_rid = 0;
  for (unsigned i = 0; i < pl->n; i++) {
    if (!a && (pl->r[i].grant == 1002) == y)
      a = &pl->r[i];
    if (pl->r[i].rid > *max_rid)
      *max_rid = pl->r[i].rid;
  }
  assert_non_null(a);
  return a;
}

static void act_lie(struct play *pl) {
  uint32_t max;
  const struct asked *a = read_of(pl, false, &max);
  uint64_t off = a->off, len = a->len;
  uint32_t rid = a->rid;
  uint8_t kind = FRAME_DATA;

  switch (lie_now) {
  case LIE_RID_NEVER: rid = max + 1000; break;
  case LIE_RID_NEXT: rid = max + 1; break;
  case LIE_OFF_PAGE: off += HUGE; break;
  case LIE_OFF_PAST: off = SEG_X + HUGE; break;
  case LIE_OFF_FAR: off = UINT64_MAX - HUGE; break;
  case LIE_LEN_PAGE: len += HUGE; break;
  case LIE_LEN_MAX: len = UINT32_MAX; break;
  case LIE_LEN_SHORT: len = 4096; break;
  case LIE_LEN_ZERO: len = 0; break;
  case LIE_NOT_DATA: kind = FRAME_CTRL; break;
  case LIE_OTHER_PULL: /* pub/y's first Read (another length) */
    rid = read_of(pl, true, &max)->rid;
    assert_int_not_equal(read_of(pl, true, &max)->len, len);
    break;
  }
  send_header(0, rid, off, len, kind);
}

/* Each lie in turn, against a pull of pub/x (and one of pub/y beside it
 * for the last): the pull fails with -EPROTO, a refusal counted as a
 * protocol error with a message that names the peer and the lane; no
 * 2 MiB page built (no thread but the lanes builds here, and no chunk
 * was claimed), no byte left, the user's segments intact. */
static void test_lying_headers(void **state) {
  static struct pull_bg bg[2];
  gshm_client_t *p = connect_to(&P);
  (void)state;

  for (size_t k = 0; k < sizeof(lies) / sizeof(lies[0]); k++) {
    bool two = lies[k].kind == LIE_OTHER_PULL;
    long protocol = metric(p, "gshm_cluster_refusals_total{cause=\"protocol\"}");
    long built;
    struct play pl;

    link_up(p);
    lie_now = lies[k].kind;
    play_begin(&pl, p, two ? 12 : 8, act_lie);
    pull_start(&bg[0], "pub/x", "got/x");
    if (two)
      pull_start(&bg[1], "pub/y", "got/y");
    serve(&pl, bg, two ? 2 : 1, p, 20000);
    built = built_since(p, &pl);
    printf("%s: %d %s; built %ld\n", lies[k].what, bg[0].err, bg[0].msg, built);
    for (int i = 0; i < (two ? 2 : 1); i++) {
      assert_int_equal(bg[i].err, -EPROTO);
      assert_non_null(strstr(bg[i].msg, "peer 'rb'"));
      assert_non_null(strstr(bg[i].msg, "data lane"));
    }
    assert_non_null(strstr(bg[0].msg, "no request"));
    assert_int_equal(metric(p, "gshm_cluster_refusals_total{cause=\"protocol\"}"),
                     protocol + 1);
    assert_int_equal(built, 0);
    assert_others_intact(p, &pl);
    link_down();
  }
  gshm_disconnect(p);
}

/* The exact headers of two chunks asked for (the first, on lane 0, and
 * the sixth, on lane 1), then no byte. */
static void act_headers_only(struct play *pl) {
  send_chunk(pl, 0, &pl->r[0], 0);
  send_chunk(pl, 1, &pl->r[5], 0);
}

/* A key holder sends the exact headers of two chunks asked for, one on
 * each lane, and then nothing: each lane builds its chunk's pages before
 * the bytes that never come (each of these two 3 MiB chunks falls in two
 * 2 MiB pages: 8 MiB in all), and P allocates no more than those pages
 * meanwhile, however large the segment; the pull then times out
 * (-ETIMEDOUT) and its memory goes. */
static void test_headers_then_nothing(void **state) {
  static struct pull_bg bg;
  gshm_client_t *p = connect_to(&P);
  struct play pl;
  (void)state;

  link_up(p);
  play_begin(&pl, p, 8, act_headers_only);
  pull_start(&bg, "pub/x", "got/x");
  serve(&pl, &bg, 1, p, 30000);
  printf("headers only: %d %s\n", bg.err, bg.msg);
  printf("  1 s after: built %ld MiB, memfds +%" PRIu64 " KiB; the chunks' pages %" PRIu64
         " MiB\n", (pl.mid_built - pl.built0) >> 20, (pl.mid_alloc - pl.alloc0) >> 10,
         pl.pages >> 20);
  assert_true(pl.sampled); /* (the pull still waited 1 s after the headers) */
  assert_int_equal(pl.pages, 8 * MiB);
  assert_true((uint64_t)(pl.mid_built - pl.built0) <= pl.pages);
  assert_true(pl.mid_alloc <= pl.alloc0 + pl.pages);
  if (building)
    assert_true(pl.mid_built - pl.built0 >= (long)HUGE); /* (the lanes do build) */
  else
    print_message("no 2 MiB page built here: that the lanes build was not checked\n");
  assert_true((uint64_t)built_since(p, &pl) <= pl.pages);
  /* (the stalled frames, or the Reads left unanswered meanwhile: both
   * time out after cluster.request_timeout_ms) */
  assert_int_equal(bg.err, -ETIMEDOUT);
  assert_non_null(strstr(bg.msg, "peer 'rb'"));
  assert_true(strstr(bg.msg, "stopped sending a data frame midway") ||
              strstr(bg.msg, "unanswered for"));
  assert_others_intact(p, &pl);
  link_down();
  gshm_disconnect(p);
}

static bool repeat_landed; /* act_repeat: the first frame whole, else halfway */

/* The third chunk's frame on lane 0 (whole, or its header and 1 MiB),
 * and a moment later its header again on lane 1. */
static void act_repeat(struct play *pl) {
  const struct asked *a = &pl->r[2];

  send_chunk(pl, 0, a, repeat_landed ? a->len : MiB);
  usleep(300000); /* (lane 0 claimed it; whole, it landed) */
  send_header(1, a->rid, a->off, a->len, FRAME_DATA);
}

/* A key holder sends a chunk's frame twice, on both lanes: the second
 * header while the first frame is halfway (its request claimed), or after
 * it landed: -EPROTO, and nothing built but that one chunk's pages. */
static void test_repeated_chunk(void **state) {
  static struct pull_bg bg;
  gshm_client_t *p = connect_to(&P);
  (void)state;

  for (int landed = 0; landed < 2; landed++) {
    long protocol = metric(p, "gshm_cluster_refusals_total{cause=\"protocol\"}");
    struct play pl;
    long built;

    link_up(p);
    repeat_landed = landed;
    play_begin(&pl, p, 8, act_repeat);
    pull_start(&bg, "pub/x", "got/x");
    serve(&pl, &bg, 1, p, 20000);
    built = built_since(p, &pl);
    printf("a chunk again (%s): %d %s; built %ld MiB\n", landed ? "landed" : "halfway", bg.err,
           bg.msg, built >> 20);
    assert_int_equal(bg.err, -EPROTO);
    assert_non_null(strstr(bg.msg, "peer 'rb'"));
    assert_non_null(strstr(bg.msg, "no request"));
    assert_int_equal(metric(p, "gshm_cluster_refusals_total{cause=\"protocol\"}"),
                     protocol + 1);
    assert_int_equal(pl.pages, 4 * MiB);
    assert_true((uint64_t)built <= pl.pages);
    if (building)
      assert_true(built >= (long)HUGE);
    assert_others_intact(p, &pl);
    link_down();
  }
  if (!building)
    print_message("no 2 MiB page built here: that the lane builds was not checked\n");
  gshm_disconnect(p);
}

/* An honest pull of pub/x (pull_honest) as a test: every byte, and pages
 * built where they are here. */
static void honest_test(const char *local, bool reversed) {
  gshm_client_t *p = connect_to(&P);
  long built;

  link_up(p);
  built = pull_honest(p, local, reversed);
  if (building)
    assert_true(built >= (long)(8 * MiB));
  else
    print_message("no 2 MiB page built here: that the lanes build was not checked\n");
  assert_int_equal(gshm_unlink(p, local), 0);
  gshm_disconnect(p);
}

/* Every chunk whole, in reverse order, alternating lanes (neighbours
 * share a 2 MiB page and land on both lanes at once): every byte right,
 * at most each chunk's pages built. */
static void test_reversed_chunks(void **state) {
  (void)state;
  honest_test("got/x", true);
}

/* After every lie, the same peer's honest pull (and the group's teardown
 * then stops P: exit status 0). */
static void test_honest_after(void **state) {
  (void)state;
  honest_test("got/after", false);
}

static int stop_status = -1;

/* Half of the first chunk's frame on lane 0, the sixth's header on lane
 * 1, then the node stops (SIGTERM) while both lanes wait for bytes. */
static void act_stop(struct play *pl) {
  send_chunk(pl, 0, &pl->r[0], MiB);
  send_chunk(pl, 1, &pl->r[5], 0);
  usleep(300000); /* (both claimed, their pages built) */
  stop_status = harness_stop(&target->h);
}

/* A node stopped while its lanes hold claimed frames whose pages they
 * built (one with part of its bytes in): the requester is told that
 * gshmd stops, and it exits clean (status 0; under ASan: nothing touched
 * after it was freed, no fd of a freed segment built through). */
static void test_stop_mid_frame(void **state) {
  static struct pull_bg bg;
  char peers[64], opt_streams[32];
  gshm_client_t *q;
  struct play pl;
  int port, qlfd;
  (void)state;

  link_down(); /* (P links again to lfd meanwhile: nobody answers) */
  assert_true((qlfd = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "rb=127.0.0.1:%d", port);
  snprintf(opt_streams, sizeof(opt_streams), "cluster.streams=%d", LANES);
  node_start(&Q, "q", peers, keys.key, "", opt_streams, "cluster.pull_chunk=3M",
             "cluster.prefault=off", "cluster.request_timeout_ms=" STR(TIMEOUT_MS), NULL);
  target = &Q;
  q = connect_to(&Q);
  assert_int_equal(rogue_accept_lanes(&rb, qlfd, "rb", rkey, lanes, LANES, lanes_up, q), 0);
  linked = true;
  play_begin(&pl, q, 8, act_stop);
  gshm_disconnect(q);
  pull_start(&bg, "pub/x", "got/x");
  serve(&pl, &bg, 1, NULL, 20000);
  printf("stopped mid-frame: status %d; the pull: %d %s\n", stop_status, bg.err, bg.msg);
  assert_int_equal(stop_status, 0);
  assert_int_not_equal(bg.err, 0);
  assert_non_null(strstr(bg.msg, "gshmd is stopping"));
  link_down();
  close(qlfd);
  target = &P;
}

static int group_setup(void **state) {
  char peers[64];
  gshm_client_t *p;
  int port;
  (void)state;

  assert_non_null(src_x = malloc(SEG_X));
  assert_non_null(src_y = malloc(SEG_Y));
  harness_random(src_x, SEG_X, SEED_X);
  harness_random(src_y, SEG_Y, SEED_Y);
  keys_make(&keys, "gshm-rogue-build");
  rogue_key(keys.key, rkey);
  assert_true((lfd = rogue_listener(&port)) >= 0);
  snprintf(peers, sizeof(peers), "rb=127.0.0.1:%d", port);
  node_start(&P, "p", peers, keys.key, "", "cluster.streams=" STR(LANES), "cluster.pull_chunk=3M",
             "cluster.prefault=off", "cluster.request_timeout_ms=" STR(TIMEOUT_MS), NULL);
  harness_set_leftover(&P.h);
  p = connect_to(&P);
  building = metric(p, "gshm_host_pull_huge_pages") == 2;
  if (!building)
    print_message("gshmd builds no 2 MiB page here (gshm_host_pull_huge_pages %ld, not 2: "
                  "shmem_enabled not never, Linux before 6.5 or no MADV_COLLAPSE): the checks "
                  "that pages were built are skipped; the bounds, errors and bytes still run\n",
                  metric(p, "gshm_host_pull_huge_pages"));
  /* the user's own segments, which no lie may touch */
  make_segment(p, "own/made", 8 * MiB, 2303);
  link_up(p);
  pull_honest(p, "own/pulled", false);
  assert_int_equal(gshm_status(p, &base), 0);
  gshm_disconnect(p);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  link_down();
  close(lfd);
  /* (stops cleanly: exit status 0, after every lie) */
  assert_int_equal(harness_stop(&P.h), 0);
  harness_set_leftover(NULL);
  keys_remove(&keys);
  free(src_x);
  free(src_y);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lying_headers),
      cmocka_unit_test(test_headers_then_nothing),
      cmocka_unit_test(test_repeated_chunk),
      cmocka_unit_test(test_reversed_chunks),
      cmocka_unit_test(test_honest_after),
      cmocka_unit_test(test_stop_mid_frame),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
