/* SPDX-License-Identifier: Apache-2.0 */
/* A serving peer that holds the cluster key answers every request of a
 * pull but one, while a monitor keeps the link busy with requests it
 * answers too (gshmctl peers five times a second): the grant of the
 * segment (a single pull), or one Read of its four (on data lanes, the
 * other three sent whole).  The link's activity never lapses, so the old
 * code waited forever on the held request, and the user's gshmctl pull
 * with it.  Now the held request fails the pull within
 * cluster.request_timeout_ms (3 s here) and the sweep's second:
 * -ETIMEDOUT, a message that names the peer and what it left unanswered,
 * nothing left behind, and the next pull from that peer works.
 *
 * And the long waits that are legitimate still work: P pulls a set from
 * the rogue, which sends one chunk every half second (6 s in all), while
 * node C pulls the same set from P in flight (relayed: docs/CLUSTER.md
 * "Moving a model to several nodes") in one Read, which waits on P for
 * chunks that have not landed there longer than the request timeout; P answers
 * it busy after half of it with its progress, C asks again, and C ends
 * with every byte (without the busy answers C's request timeout would
 * fail it).  And a listing of C that waits on P for P's own set to
 * list the rogue, slowly, is answered busy and asked again too.  And P's
 * grants of a set in flight say where its bytes come from, also for a
 * segment whose bytes are all in.  And a rogue that answers busy at once,
 * with a rising progress, is not asked again for ever.  And a puller that
 * goes with reads parked on P leaves another's parked reads served. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"
#include "rogue.h"
#include "tcp_segs.h"

#define TIMEOUT_MS 3000 /* cluster.request_timeout_ms of P and C */
#define STR_(x) #x
#define STR(x) STR_(x)
#define LANES 2         /* P's cluster.streams */
#define SEG (4 * MiB)   /* pulled alone over two lanes: four Reads of 1 MiB */
#define SLOW_SEG (12 * MiB) /* P reads it in twelve chunks of 1 MiB, C in one Read */
#define SLOW_GAP_MS 500 /* the slow rogue's time between chunks */

static struct cluster_keys keys;
static struct node P, C;
static struct rogue rh;
static struct rogue_lane lanes[LANES];
static int lfd;
static uint8_t rkey[32];

/* How the rogue serves one pull: the segment it lists and grants (id 1),
 * the request it leaves unanswered, the pace of its chunks. */
struct plan {
  const char *name;
  uint64_t size;
  unsigned long long seed;
  bool hold_grant;
  int64_t hold_offset;     /* the Read of this offset is never answered (-1: none) */
  int gap_ms;              /* between chunks (0: at once) */
  void (*on_grant)(void);  /* after the grant is sent */
  bool cancel_at_hold;     /* the job's client cancels its pull once a request is held */
  void (*on_read)(unsigned n); /* after the n-th Read came (1, 2, ...); 0: the grant request */
};

/* A pull on a node in the background, and a monitor that asks P for its
 * peers every 200 ms meanwhile (P asks each peer for its count). */
struct job {
  pthread_t t;
  struct peers_monitor mon;
  struct node *n;
  const char *peer, *name;
  bool prefix, monitor;
  int err;
  char msg[512];
  int64_t start, end, cancel_ms;
  gshm_client_t *_Atomic c; /* the pull's connection, once made */
  atomic_bool done;
};

static void *job_thread(void *arg) {
  struct job *j = arg;
  gshm_pull_opts_t po = {.mode = 0644};
  gshm_pull_result_t r, *v = NULL;
  size_t n = 0;
  gshm_client_t *c;

  j->start = now_ms();
  j->err = gshm_connect(j->n->h.socket_path, "job", &c);
  if (!j->err) {
    j->c = c;
    j->err = j->prefix ? gshm_pull_prefix(c, j->peer, j->name, &po, &v, &n)
                       : gshm_pull(c, j->peer, j->name, &po, &r);
    snprintf(j->msg, sizeof(j->msg), "%s", gshm_last_error(c));
    gshm_free(v);
    j->c = NULL;
    gshm_disconnect(c);
  }
  j->end = now_ms();
  j->done = true;
  return NULL;
}

static void job_start(struct job *j, struct node *n, const char *peer, const char *name,
                      bool prefix, bool monitor) {
  memset(j, 0, sizeof(*j));
  j->n = n;
  j->peer = peer;
  j->name = name;
  j->prefix = prefix;
  j->monitor = monitor;
  assert_int_equal(pthread_create(&j->t, NULL, job_thread, j), 0);
  if (monitor)
    peers_monitor_start(&j->mon, &P, &j->done);
}

static void job_join(struct job *j) {
  pthread_join(j->t, NULL);
  if (j->monitor)
    peers_monitor_join(&j->mon);
}

static bool rh_lanes_up(void *arg) {
  return metric(arg, "gshm_cluster_lanes{peer=\"rh\"}") == LANES;
}

/* Takes P's link to rh and its lanes (P connects again within a few
 * seconds of its last link's end).  Returns once P counts the lanes up. */
static void rh_up(gshm_client_t *p) {
  assert_int_equal(rogue_accept_lanes(&rh, lfd, "rh", rkey, lanes, LANES, rh_lanes_up, p), 0);
}

static void rh_down(void) {
  for (int i = 0; i < LANES; i++)
    rogue_lane_close(&lanes[i]);
  rogue_close(&rh);
}

/* One page listing the plan's segment. */
static void send_listing(uint32_t rid, const struct plan *pl) {
  Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListReply lr = GSHM__CLUSTER__LIST_REPLY__INIT;
  Gshm__Cluster__Segment s = GSHM__CLUSTER__SEGMENT__INIT, *one = &s;

  s.id = 1;
  s.generation = 1;
  s.name = (char *)pl->name;
  s.size = pl->size;
  s.allocated = pl->size;
  s.location = "host";
  lr.segments = &one;
  lr.n_segments = 1;
  lr.total = 1;
  a.request_id = rid;
  a.status = 1;
  a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
  a.list_reply = &lr;
  rogue_send(&rh, &a);
}

/* Reads held back to be answered one per gap (serve, and
 * test_relay_finished_path's big segment): their frames whole, on the
 * lanes in turn. */
struct held_reads {
  uint32_t rids[64];
  uint64_t offs[64], lens[64];
  unsigned n, next, sent;
  int64_t last;
};

static void held_push(struct held_reads *h, const Gshm__Cluster__Msg *m) {
  h->rids[h->n] = m->request_id;
  h->lens[h->n] = m->read->length;
  h->offs[h->n++] = m->read->offset;
}

/* Sends the next held Read's bytes (from src, the segment's) once gap_ms
 * passed since the last. */
static void held_send_next(struct held_reads *h, const uint8_t *src, int64_t gap_ms) {
  if (h->next < h->n && now_ms() - h->last >= gap_ms) {
    assert_int_equal(rogue_lane_send(&lanes[h->sent++ % LANES], h->rids[h->next],
                                     h->offs[h->next], src + h->offs[h->next], h->lens[h->next],
                                     h->lens[h->next]),
                     0);
    h->next++;
    h->last = now_ms();
  }
}

/* Serves P's requests by plan pl until job j ends or ms pass; the Reads'
 * frames whole, on the lanes in turn.  Returns the count requests
 * answered while a request was held. */
static unsigned serve(struct job *j, const struct plan *pl, int64_t ms) {
  static struct held_reads h;
  uint8_t *src = malloc(pl->size);
  unsigned counts = 0;
  int64_t end = now_ms() + ms;
  unsigned reads = 0;
  bool holding = false;

  assert_non_null(src);
  memset(&h, 0, sizeof(h));
  harness_random(src, pl->size, pl->seed);
  while (!j->done && now_ms() < end) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m && rogue_answer_count(&rh, m)) {
      counts += holding;
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      send_listing(m->request_id, pl);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      holding |= pl->hold_grant;
      if (pl->hold_grant && pl->cancel_at_hold && !j->cancel_ms) {
        j->cancel_ms = now_ms();
        assert_int_equal(gshm_pull_cancel(j->c), 0);
      }
      if (!pl->hold_grant) {
        assert_string_equal(m->grant_request->name, pl->name);
        if (pl->on_read) /* (before the grant: its Reads may come at once) */
          pl->on_read(0);
        rogue_send_grant(&rh, m->request_id, 1, pl->name, pl->size);
        if (pl->on_grant)
          pl->on_grant();
      }
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ && h.n < 64) {
      assert_true(m->read->offset < pl->size && m->read->length <= pl->size - m->read->offset);
      if ((int64_t)m->read->offset == pl->hold_offset)
        holding = true;
      else
        held_push(&h, m);
      if (pl->on_read)
        pl->on_read(++reads);
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    held_send_next(&h, src, pl->gap_ms); /* the queued Reads, one per gap */
  }
  free(src);
  return counts;
}

static int group_setup(void **state) {
  char peers_p[96], peers_c[64];
  int port;
  (void)state;

  keys_make(&keys, "gshm-rogue-held");
  rogue_key(keys.key, rkey);
  assert_true((lfd = rogue_listener(&port)) >= 0);
  P.port = free_port();
  C.port = free_port();
  snprintf(peers_p, sizeof(peers_p), "rh=127.0.0.1:%d,c=127.0.0.1:%d", port, C.port);
  snprintf(peers_c, sizeof(peers_c), "p=127.0.0.1:%d", P.port);
  node_start(&P, "p", peers_p, keys.key, "slow/*", "cluster.streams=2", "cluster.pull_chunk=1M",
             "cluster.request_timeout_ms=" STR(TIMEOUT_MS), NULL);
  /* C reads a segment in one Read (no lanes to split it over): a Read of
   * P's whole slow set waits on P longer than the request timeout */
  node_start(&C, "c", peers_c, keys.key, "", "cluster.request_timeout_ms=" STR(TIMEOUT_MS),
             "cluster.streams=1", "cluster.pull_chunk=16M", NULL);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  close(lfd);
  assert_int_equal(harness_stop(&C.h), 0);
  assert_int_equal(harness_stop(&P.h), 0);
  keys_remove(&keys);
  return 0;
}

/* The rogue holds pl's request; the pull must fail in bounded time with
 * -ETIMEDOUT and a message that names rh and `what`, leave nothing, and
 * the next pull (answered whole) must work. */
static void held(const struct plan *pl, const char *what) {
  static struct job j; /* (static: a failed check leaves its threads) */
  struct plan honest = {pl->name, pl->size, pl->seed + 1, false, -1, 0, NULL, false, NULL};
  gshm_client_t *p = connect_to(&P);
  long timeouts = metric(p, "gshm_cluster_refusals_total{cause=\"timeout\"}");
  unsigned counts;
  int64_t took;

  rh_up(p);
  job_start(&j, &P, "rh", pl->name, false, true);
  counts = serve(&j, pl, 30000);
  took = j.end - j.start;
  printf("%s held: %u count requests answered meanwhile; the pull ended after %.1f s: %d %s\n",
         what, counts, (double)took / 1000, j.err, j.msg);
  assert_true(j.done); /* (the old code: still waiting) */
  job_join(&j);
  assert_true(counts >= 5); /* the link was busy meanwhile */
  assert_int_equal(j.err, -ETIMEDOUT);
  assert_non_null(strstr(j.msg, "peer 'rh'"));
  assert_non_null(strstr(j.msg, what));
  assert_non_null(strstr(j.msg, "unanswered"));
  /* not before the timeout; soon after (the sweep runs every second) */
  assert_true(took >= TIMEOUT_MS - 100);
  assert_true(took <= TIMEOUT_MS + 8000);
  assert_int_equal(metric(p, "gshm_cluster_refusals_total{cause=\"timeout\"}"), timeouts + 1);
  assert_nothing_left(p, pl->name);
  rh_down();
  /* P reconnects, and pulls from the same peer again */
  rh_up(p);
  job_start(&j, &P, "rh", pl->name, false, false);
  serve(&j, &honest, 30000);
  job_join(&j);
  assert_int_equal(j.err, 0);
  check_segment(p, pl->name, pl->size, honest.seed);
  assert_int_equal(gshm_unlink(p, pl->name), 0);
  rh_down();
  gshm_disconnect(p);
}

static void test_grant_held(void **state) {
  static const struct plan pl = {"pub/one", SEG, 10, true, -1, 0, NULL, false, NULL};
  (void)state;
  held(&pl, "the grant of 'pub/one'");
}

static void test_read_held(void **state) {
  static const struct plan pl = {"pub/one", SEG, 20, false, MiB, 0, NULL, false, NULL};
  (void)state;
  held(&pl, "a read of bytes 1048576+1048576 of grant 1001");
}

/* The one pull in flight on P (NULL: none) and its `ending`. */
static bool pull_ending(gshm_client_t *p, char *ending, size_t len) {
  gshm_cluster_pull_t *v = NULL;
  size_t n = 0;

  assert_int_equal(gshm_cluster_pulls(p, &v, &n), 0);
  assert_true(n <= 1);
  if (n)
    snprintf(ending, len, "%s", v[0].ending);
  gshm_free(v);
  return n == 1;
}

/* The rogue holds the grant of P's pull; the puller cancels it.  Its
 * gshm_pull ends -ECANCELED at once, not when the grant's request times
 * out (TIMEOUT_MS); P shows the pull ending ("cancelled by its
 * requester") until the held request times out, then nothing is left,
 * and the next pull from that peer works.  Before: the cancel's answer
 * waited for the held grant, TIMEOUT_MS and the sweep's second (60 s
 * with the default cluster.request_timeout_ms). */
static void test_cancel_held(void **state) {
  static const struct plan pl = {"pub/one", SEG, 40, true, -1, 0, NULL, true, NULL};
  struct plan honest = {pl.name, pl.size, pl.seed + 1, false, -1, 0, NULL, false, NULL};
  static struct job j;
  gshm_client_t *p = connect_to(&P);
  char ending[256] = "";
  int64_t gone = 0;
  (void)state;

  rh_up(p);
  job_start(&j, &P, "rh", pl.name, false, false);
  serve(&j, &pl, 30000);
  assert_true(j.done);
  job_join(&j);
  printf("cancelled with its grant held: %d (%s) %.1f ms after the cancel\n", j.err, j.msg,
         (double)(j.end - j.cancel_ms));
  assert_true(j.cancel_ms > 0);
  assert_int_equal(j.err, -ECANCELED);
  assert_true(j.end - j.cancel_ms < TIMEOUT_MS / 3);
  assert_int_equal(gshm_stat_name(p, pl.name, &(gshm_segment_info_t){0}), -ENOENT);
  /* still asked of rh: shown ending, until the request times out */
  assert_true(pull_ending(p, ending, sizeof(ending)));
  assert_non_null(strstr(ending, "cancelled"));
  for (int64_t end = now_ms() + TIMEOUT_MS + 8000; !gone && now_ms() < end;) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m) {
      (void)rogue_answer_count(&rh, m); /* (the grant stays held) */
      gshm__cluster__msg__free_unpacked(m, NULL);
    }
    if (!pull_ending(p, ending, sizeof(ending)))
      gone = now_ms();
  }
  printf("the set went %.1f s after the cancel\n", (double)(gone - j.cancel_ms) / 1000);
  assert_true(gone > 0);
  assert_true(gone - j.cancel_ms >= TIMEOUT_MS / 2);
  assert_nothing_left(p, pl.name);
  rh_down();
  rh_up(p);
  job_start(&j, &P, "rh", pl.name, false, false);
  serve(&j, &honest, 30000);
  job_join(&j);
  assert_int_equal(j.err, 0);
  check_segment(p, pl.name, pl.size, honest.seed);
  assert_int_equal(gshm_unlink(p, pl.name), 0);
  rh_down();
  gshm_disconnect(p);
}

/* The rogue fails one Read of P's pull (an error answer) and holds
 * another: the set has failed, and waits for the held Read's answer (or
 * its timeout) before it ends.  The puller cancels meanwhile: its
 * gshm_pull ends at once with the set's own error (a pull that ended
 * meanwhile keeps its result: gshm.h gshm_pull_cancel), not when the
 * held Read times out.  Before: a cancel of a set that had failed was
 * ignored (gshmd__pull_cancel skipped sets with an error), and the
 * puller waited TIMEOUT_MS and the sweep's second (60 s with the default
 * cluster.request_timeout_ms) although gshm.h says the pull fails at once
 * even where a peer has not answered. */
static void test_cancel_failed_held(void **state) {
  static const struct plan honest = {"pub/one", SEG, 61, false, -1, 0, NULL, false, NULL};
  static struct job j;
  gshm_client_t *p = connect_to(&P);
  int64_t failed = 0, end;
  (void)state;

  rh_up(p);
  job_start(&j, &P, "rh", honest.name, false, false);
  for (end = now_ms() + 30000; !j.done && now_ms() < end;) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m && rogue_answer_count(&rh, m)) {
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      send_listing(m->request_id, &honest);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      rogue_send_grant(&rh, m->request_id, 1, honest.name, honest.size);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ && !failed &&
               m->read->offset != MiB) { /* (the Read of MiB stays held, as the others) */
      rogue_send_status(&rh, m->request_id, 2 /* STATUS_INVALID_ARGUMENT */, "no bytes here");
      failed = now_ms();
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    if (failed && !j.cancel_ms && now_ms() - failed >= 300) {
      j.cancel_ms = now_ms();
      assert_int_equal(gshm_pull_cancel(j.c), 0);
    }
  }
  assert_true(j.done);
  job_join(&j);
  printf("a failed pull with a Read held, cancelled: %d (%s) %.1f ms after the cancel\n", j.err,
         j.msg, (double)(j.end - j.cancel_ms));
  assert_true(failed > 0);
  assert_true(j.cancel_ms > 0);
  assert_int_equal(j.err, -EINVAL); /* the set's own error */
  assert_non_null(strstr(j.msg, "no bytes here"));
  assert_true(j.end - j.cancel_ms < TIMEOUT_MS / 3);
  /* the set goes once the held Reads time out: nothing left */
  for (end = now_ms() + TIMEOUT_MS + 8000; now_ms() < end;) {
    char ending[256];
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m) {
      (void)rogue_answer_count(&rh, m);
      gshm__cluster__msg__free_unpacked(m, NULL);
    }
    if (!pull_ending(p, ending, sizeof(ending)))
      break;
  }
  assert_nothing_left(p, honest.name);
  rh_down();
  gshm_disconnect(p);
}

/* C's pull of the set from P, started once P has its grant (the set is
 * listed on P: C lists it in flight and reads it relayed). */
static struct job relay_job;
static void start_c(void) { job_start(&relay_job, &C, "p", "slow/", true, false); }

static void test_relay_slow(void **state) {
  static const struct plan pl = {"slow/a", SLOW_SEG, 30, false, -1,
                                 SLOW_GAP_MS, start_c, false, NULL};
  static struct job j;
  gshm_client_t *p = connect_to(&P), *c = connect_to(&C);
  long busy = metric(p, "gshm_cluster_relay_busy_total");
  long waits = metric(p, "gshm_cluster_relay_waits_total");
  (void)state;

  rh_up(p);
  job_start(&j, &P, "rh", "slow/", true, false);
  serve(&j, &pl, 60000);
  job_join(&j);
  assert_true(relay_job.n == &C); /* (started at the grant) */
  job_join(&relay_job);
  printf("P %d in %.1f s; C %d in %.1f s (%s); on P %ld reads waited, %ld answered busy\n",
         j.err, (double)(j.end - j.start) / 1000, relay_job.err,
         (double)(relay_job.end - relay_job.start) / 1000, relay_job.msg,
         metric(p, "gshm_cluster_relay_waits_total") - waits,
         metric(p, "gshm_cluster_relay_busy_total") - busy);
  assert_int_equal(j.err, 0);
  assert_int_equal(relay_job.err, 0);
  /* C's reads waited on P longer than the request timeout in all */
  assert_true(relay_job.end - relay_job.start > TIMEOUT_MS);
  assert_true(metric(p, "gshm_cluster_relay_busy_total") > busy);
  check_segment(p, "slow/a", SLOW_SEG, pl.seed);
  check_segment(c, "slow/a", SLOW_SEG, pl.seed);
  assert_int_equal(gshm_unlink(p, "slow/a"), 0);
  assert_int_equal(gshm_unlink(c, "slow/a"), 0);
  rh_down();
  gshm_disconnect(c);
  gshm_disconnect(p);
}

/* P lists a set from the rogue, which sends a page every second (each
 * with one segment outside the prefix, its cursor advancing by one) for
 * LIST_PAGES pages, then the last; P waits for the next page each time
 * well within its request timeout.  at_first runs at P's first List. */
#define LIST_PAGES 8
static unsigned list_slowly(struct job *j, void (*at_first)(void)) {
  unsigned pages = 0;
  int64_t next = 0;
  uint32_t rid = 0;

  while (!j->done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m && !rogue_answer_count(&rh, m) && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      rid = m->request_id;
      next = now_ms() + 1000;
      if (!pages && at_first)
        at_first();
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    if (rid && now_ms() >= next) {
      Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
      Gshm__Cluster__ListReply lr = GSHM__CLUSTER__LIST_REPLY__INIT;
      Gshm__Cluster__Segment s = GSHM__CLUSTER__SEGMENT__INIT, *one = &s;
      char name[32];
      snprintf(name, sizeof(name), "elsewhere/%u", pages);
      s.id = pages + 1;
      s.generation = 1;
      s.name = name;
      s.size = 4096;
      s.allocated = 4096;
      s.location = "host";
      lr.segments = &one;
      lr.n_segments = 1;
      lr.next = ++pages < LIST_PAGES ? pages + 1 : 0;
      a.request_id = rid;
      a.status = 1;
      a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
      a.list_reply = &lr;
      rogue_send(&rh, &a);
      rid = 0;
    }
  }
  return pages;
}

/* While P's own set pull lists the rogue slowly (LIST_PAGES s in all, a
 * page a second: never a request timeout of P's), C pulls another set of
 * P's, published there: its List waits on P for the listing in flight to
 * end (so that C would list the segments it brings), longer than the
 * request timeout.  P answers it busy after half of it with its progress
 * (the pages its sets were sent), C asks again, and its pull completes
 * (the old code: C's List waited unanswered until C's request timeout
 * failed C's link, -ETIMEDOUT, whatever the set). */
static struct job list_job;
static void start_c_list(void) { job_start(&list_job, &C, "p", "slow/", true, false); }

static void test_relay_list_slow(void **state) {
  static struct job j;
  struct job *cj = &list_job;
  gshm_client_t *p = connect_to(&P), *c = connect_to(&C);
  unsigned pages;
  (void)state;

  make_segment(p, "slow/pub", 4096, 40);
  rh_up(p);
  job_start(&j, &P, "rh", "x/", true, false);
  pages = list_slowly(&j, start_c_list);
  job_join(&j);
  assert_true(cj->n == &C); /* (started at P's first List) */
  job_join(cj);
  printf("P's listing: %u pages in %.1f s (%d %s); C's set: %d in %.1f s (%s)\n", pages,
         (double)(j.end - j.start) / 1000, j.err, j.msg, cj->err,
         (double)(cj->end - cj->start) / 1000, cj->msg);
  assert_int_equal(pages, LIST_PAGES);
  assert_int_equal(j.err, -ENOENT); /* (nothing under x/) */
  assert_int_equal(cj->err, 0);
  assert_true(cj->end - cj->start > TIMEOUT_MS); /* (it waited for P's listing) */
  check_segment(c, "slow/pub", 4096, 40);
  assert_int_equal(gshm_unlink(c, "slow/pub"), 0);
  assert_int_equal(gshm_unlink(p, "slow/pub"), 0);
  rh_down();
  gshm_disconnect(c);
  gshm_disconnect(p);
}

/* What P's grants of a set it is still pulling say (Grant.upstream),
 * asked by a rogue puller "c": both segments in flight from "rh", the
 * slow one and the small one whose bytes are all in.  Before, the small
 * one was granted with an empty path, which its receiver reads as a path
 * not known (a relay of several sources then hands it on to nobody until
 * its own copy is whole). */
#define SMALL_SEG (64 * 1024)
static void test_relay_finished_path(void **state) {
  static struct job j;
  static struct rogue q;
  static struct held_reads h;
  const char *names[2] = {"slow/big", "slow/small"};
  const uint64_t sizes[2] = {SLOW_SEG, SMALL_SEG};
  uint8_t *src[2] = {malloc(SLOW_SEG), malloc(SMALL_SEG)};
  gshm_client_t *p = connect_to(&P);
  Gshm__Cluster__GrantRequest gq = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Release rel = GSHM__CLUSTER__RELEASE__INIT;
  Gshm__Cluster__Msg out = GSHM__CLUSTER__MSG__INIT;
  unsigned small_left = 2, asked = 0, answered = 0;
  int64_t small_done = 0;
  bool in_flight[2] = {true, true};
  char path[2][64] = {"", ""};
  (void)state;

  assert_non_null(src[0]);
  assert_non_null(src[1]);
  harness_random(src[0], SLOW_SEG, 50);
  harness_random(src[1], SMALL_SEG, 51);
  rh_up(p);
  job_start(&j, &P, "rh", "slow/", true, false);
  while (!j.done) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m && rogue_answer_count(&rh, m)) {
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
      Gshm__Cluster__ListReply lr = GSHM__CLUSTER__LIST_REPLY__INIT;
      Gshm__Cluster__Segment sg[2], *ptrs[2] = {&sg[0], &sg[1]};
      for (int i = 0; i < 2; i++) {
        gshm__cluster__segment__init(&sg[i]);
        sg[i].id = (uint64_t)i + 1;
        sg[i].generation = 1;
        sg[i].name = (char *)names[i];
        sg[i].size = sg[i].allocated = sizes[i];
        sg[i].location = "host";
      }
      lr.segments = ptrs;
      lr.n_segments = lr.total = 2;
      a.request_id = m->request_id;
      a.status = 1;
      a.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
      a.list_reply = &lr;
      rogue_send(&rh, &a);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      int i = strcmp(m->grant_request->name, names[0]) != 0;
      rogue_send_grant(&rh, m->request_id, (uint64_t)i + 1, names[i], sizes[i]);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ && h.n < 64) {
      int i = m->read->grant_id == 1002;
      assert_true(m->read->offset < sizes[i] && m->read->length <= sizes[i] - m->read->offset);
      if (i) { /* (the small segment's bytes at once) */
        assert_int_equal(rogue_lane_send(&lanes[h.sent++ % LANES], m->request_id, m->read->offset,
                                         src[1] + m->read->offset, m->read->length,
                                         m->read->length),
                         0);
        if (m->read->offset + m->read->length == SMALL_SEG)
          small_left = 1, small_done = now_ms();
      } else {
        held_push(&h, m);
      }
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    /* the big segment's Reads, one per gap, the first once "c" has its answers */
    if (answered == 2)
      held_send_next(&h, src[0], SLOW_GAP_MS);
    /* 300 ms after the small one's bytes went: "c" asks for both */
    if (small_left == 1 && !asked && now_ms() - small_done > 300) {
      assert_int_equal(rogue_connect(&q, P.port, "c", "p", rkey), 0);
      gq.in_flight = true;
      out.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
      out.grant_request = &gq;
      for (int i = 0; i < 2; i++) {
        gq.name = (char *)names[i];
        out.request_id = (uint32_t)i + 1;
        rogue_send(&q, &out);
      }
      asked = 1;
    }
    if (asked && answered < 2) {
      Gshm__Cluster__Msg *g = rogue_recv(&q, 10);
      if (g && g->request_id >= 1 && g->request_id <= 2) {
        int i = (int)g->request_id - 1;
        if (g->body_case != GSHM__CLUSTER__MSG__BODY_GRANT)
          fail_msg("P refused 'c' %s: %d %s", names[i], g->status,
                   g->message ? g->message : "");
        in_flight[i] = g->grant->segment->in_flight;
        snprintf(path[i], sizeof(path[i]), "%s", g->grant->upstream ? g->grant->upstream : "");
        rel.grant_id = g->grant->grant_id; /* (released at once: nothing is read) */
        out.request_id = 10 + (uint32_t)i;
        out.body_case = GSHM__CLUSTER__MSG__BODY_RELEASE;
        out.release = &rel;
        rogue_send(&q, &out);
        answered++;
      }
      if (g)
        gshm__cluster__msg__free_unpacked(g, NULL);
    }
  }
  job_join(&j);
  printf("P's set %d in %.1f s (%s); granted to 'c': %s in flight %d from '%s', %s in flight "
         "%d from '%s'\n",
         j.err, (double)(j.end - j.start) / 1000, j.msg, names[0], in_flight[0], path[0],
         names[1], in_flight[1], path[1]);
  assert_int_equal(j.err, 0);
  assert_int_equal(answered, 2);
  assert_true(in_flight[0]);
  assert_string_equal(path[0], "rh");
  assert_true(in_flight[1]);
  assert_string_equal(path[1], "rh");
  check_segment(p, names[0], SLOW_SEG, 50);
  check_segment(p, names[1], SMALL_SEG, 51);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(gshm_unlink(p, names[i]), 0);
    free(src[i]);
  }
  rogue_close(&q);
  rh_down();
  gshm_disconnect(p);
}

/* Two rogue pullers "c" read P's set in flight (relayed): each asks the
 * grant of slow/g and then the whole segment in Reads of 1 MiB, which
 * park on P: the rogue sends none of P's chunks until both have.  The
 * first puller goes (its connection closed) with its reads parked: P
 * drops them (gshmd__relay_link_gone: the link's own waits, where it
 * walked every relayed segment's), and the other's parked reads of the
 * same segment are still served as the chunks land, every byte once.
 * (A link_gone that dropped nothing fails it under ASan: P's waits kept
 * the gone link, read after it was freed; one that dropped the other's
 * waits too left its reads unanswered.) */
#define GONE_READS (SLOW_SEG / MiB) /* Reads of 1 MiB a puller sends */

/* Asks the grant of name (in flight) of q as request 1; its grant id. */
static uint64_t grant_of(struct rogue *q, const char *name) {
  Gshm__Cluster__GrantRequest gq = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Msg out = GSHM__CLUSTER__MSG__INIT, *g;
  uint64_t id;

  gq.in_flight = true;
  gq.name = (char *)name;
  out.body_case = GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST;
  out.grant_request = &gq;
  out.request_id = 1;
  rogue_send(q, &out);
  assert_non_null(g = rogue_recv(q, 10000));
  if (g->body_case != GSHM__CLUSTER__MSG__BODY_GRANT)
    fail_msg("P refused 'c' %s: %d %s", name, g->status, g->message ? g->message : "");
  id = g->grant->grant_id;
  gshm__cluster__msg__free_unpacked(g, NULL);
  return id;
}

/* q's Reads of the whole of grant gid (SLOW_SEG bytes, 1 MiB each). */
static void read_all(struct rogue *q, uint64_t gid) {
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  Gshm__Cluster__Msg out = GSHM__CLUSTER__MSG__INIT;

  rd.grant_id = gid;
  rd.length = MiB;
  out.body_case = GSHM__CLUSTER__MSG__BODY_READ;
  out.read = &rd;
  for (unsigned i = 0; i < GONE_READS; i++) {
    rd.offset = i * MiB;
    out.request_id = 100 + i;
    rogue_send(q, &out);
  }
}

static void test_relay_link_gone(void **state) {
  static const struct plan pl = {"slow/g", SLOW_SEG, 70, false, -1, 0, NULL, false, NULL};
  static struct job j;
  static struct rogue q[2];
  static struct held_reads h;
  uint8_t *want = malloc(SLOW_SEG);
  gshm_client_t *p = connect_to(&P);
  long waits0 = metric(p, "gshm_cluster_relay_waits_total"), conns = 0;
  bool granted = false, parked = false, dropped = false;
  (void)state;

  assert_non_null(want);
  harness_random(want, SLOW_SEG, pl.seed);
  memset(&h, 0, sizeof(h));
  rh_up(p);
  job_start(&j, &P, "rh", "slow/", true, false);
  for (int64_t end = now_ms() + 60000; !j.done && now_ms() < end;) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (m && rogue_answer_count(&rh, m)) {
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      send_listing(m->request_id, &pl);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      rogue_send_grant(&rh, m->request_id, 1, pl.name, pl.size);
      granted = true;
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ && h.n < 64) {
      held_push(&h, m);
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
    if (granted && !q[0].up) { /* both pullers' reads, all parked: no chunk landed */
      for (int i = 0; i < 2; i++) {
        assert_int_equal(rogue_connect(&q[i], P.port, "c", "p", rkey), 0);
        read_all(&q[i], grant_of(&q[i], pl.name));
      }
    }
    if (q[0].up && !parked &&
        metric(p, "gshm_cluster_relay_waits_total") >= waits0 + 2 * (long)GONE_READS) {
      conns = metric(p, "gshm_cluster_connections{kind=\"open\"}");
      rogue_close(&q[0]); /* (gone with its reads parked) */
      /* (P has dropped its link, and its waits, before a chunk lands) */
      for (int64_t t = now_ms() + 10000; !dropped && now_ms() < t;) {
        rogue_run(&q[1], 10);
        dropped = metric(p, "gshm_cluster_connections{kind=\"open\"}") < conns;
      }
      parked = true;
    }
    if (q[1].up)
      rogue_run(&q[1], 1);
    if (parked)
      held_send_next(&h, want, SLOW_GAP_MS / 5);
  }
  for (int64_t end = now_ms() + 10000; q[1].data_frames < GONE_READS && now_ms() < end;)
    rogue_run(&q[1], 10);
  job_join(&j);
  printf("P's set %d (%s); the puller left: %" PRIu64 " frames, %" PRIu64 " bad; P dropped "
         "the other's link %s; %ld reads waited\n",
         j.err, j.msg, q[1].data_frames, q[1].data_bad, dropped ? "before a chunk landed" : "late",
         metric(p, "gshm_cluster_relay_waits_total") - waits0);
  assert_true(parked);
  assert_true(dropped);
  assert_int_equal(j.err, 0);
  assert_int_equal(q[1].data_bad, 0);
  assert_int_equal(q[1].data_frames, GONE_READS);
  assert_memory_equal(q[1].sink, want, SLOW_SEG);
  check_segment(p, pl.name, SLOW_SEG, pl.seed);
  rogue_close(&q[1]);
  assert_int_equal(gshm_unlink(p, pl.name), 0);
  rh_down();
  gshm_disconnect(p);
  free(want);
}

/* A key holder that answers P's List (of a set) and then P's Read (of a
 * segment it grants in flight: relayed) busy at once, each time with its
 * progress one higher (Msg.progress).  P took that progress at its word
 * and asked again at once, for ever: a tight loop of P's event loop (on
 * which every local client waits) and of the link, thousands of asks a
 * second, the pull never ending.  Now a busy answer that comes sooner
 * than a relay parks a request (relay.h RELAY_PARK_MIN_NS) shows no
 * progress: P asks RELAY_STALE_MAX + 1 times at most, then the pull fails
 * -ETIMEDOUT (and test_relay_slow, test_relay_list_slow: an honest
 * relay's busy answers still count). */
#define EARLY_ASKS_MAX 4 /* of one request: the first and RELAY_STALE_MAX again */
#define EARLY_WATCH_MS 3000

static void send_busy(uint32_t rid, uint64_t progress) {
  Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
  a.request_id = rid;
  a.status = 18; /* STATUS_BUSY (proto/gshm.proto) */
  a.message = "still pulling those bytes: ask again";
  a.progress = progress;
  rogue_send(&rh, &a);
}

/* Serves P's pull (job j) of pl: each request of kind `busy` (a List or
 * a Read) answered busy at once with progress one higher; the others as
 * serve does (the grant in flight).  Cancels the pull if it still runs
 * after EARLY_WATCH_MS.  Returns the asks of kind busy in that time, and
 * in *most the most of them for one request (a List's cursor, a Read's
 * offset: each busy one is asked again). */
static unsigned busy_early(struct job *j, const struct plan *pl, int busy, bool *cancelled,
                           unsigned *most) {
  uint64_t seen[64];
  unsigned asks = 0, per[64], nkeys = 0;
  uint64_t progress = 1000;
  int64_t end = now_ms() + EARLY_WATCH_MS, stop = end + 30000;

  *cancelled = false;
  while (!j->done && now_ms() < stop) {
    Gshm__Cluster__Msg *m = rogue_recv(&rh, 10);
    if (!*cancelled && now_ms() >= end && j->c) {
      assert_int_equal(gshm_pull_cancel(j->c), 0);
      *cancelled = true;
    }
    if (m && rogue_answer_count(&rh, m)) {
    } else if (m && (int)m->body_case == busy) {
      uint64_t key = busy == GSHM__CLUSTER__MSG__BODY_READ ? m->read->offset : m->list->after;
      unsigned i = 0;
      while (i < nkeys && seen[i] != key)
        i++;
      if (i == nkeys && nkeys < 64)
        seen[nkeys] = key, per[nkeys++] = 0;
      if (!*cancelled && i < nkeys)
        asks++, per[i]++;
      send_busy(m->request_id, ++progress);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_LIST) {
      send_listing(m->request_id, pl);
    } else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      rogue_send_grant_in_flight(&rh, m->request_id, 1, pl->name, pl->size);
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  *most = 0;
  for (unsigned i = 0; i < nkeys; i++)
    *most = per[i] > *most ? per[i] : *most;
  return asks;
}

static void test_relay_busy_early(void **state) {
  static const struct plan pl = {"early/a", 1 * MiB, 60, false, -1, 0, NULL, false, NULL};
  static const int kinds[2] = {GSHM__CLUSTER__MSG__BODY_LIST, GSHM__CLUSTER__MSG__BODY_READ};
  static const char *what[2] = {"List", "Read"};
  static struct job j[2];
  gshm_client_t *p = connect_to(&P);
  bool cancelled[2];
  unsigned asks[2], most[2];
  (void)state;

  /* (both run before the checks: the old code's counts for each) */
  for (int k = 0; k < 2; k++) {
    rh_up(p);
    job_start(&j[k], &P, "rh", "early/", true, false);
    asks[k] = busy_early(&j[k], &pl, kinds[k], &cancelled[k], &most[k]);
    job_join(&j[k]);
    printf("%s answered busy at once: %u asks (%u of one) in %.1f s%s; the pull %d (%s)\n",
           what[k], asks[k], most[k], (double)(j[k].end - j[k].start) / 1000,
           cancelled[k] ? " (cancelled: still asking)" : "", j[k].err, j[k].msg);
    rh_down();
  }
  for (int k = 0; k < 2; k++) {
    assert_false(cancelled[k]); /* (the old code: still asking) */
    assert_true(most[k] >= 1 && most[k] <= EARLY_ASKS_MAX);
    assert_true(asks[k] <= 64 * EARLY_ASKS_MAX);
    assert_int_equal(j[k].err, -ETIMEDOUT);
    assert_non_null(strstr(j[k].msg, "no progress"));
  }
  assert_nothing_left(p, pl.name);
  gshm_disconnect(p);
}

/* TCP segments the rogue's link (rh's control connection) has received. */
static unsigned segs_in(void) {
  uv_os_fd_t fd;
  long n;

  assert_int_equal(uv_fileno((uv_handle_t *)&rh.st.tcp, &fd), 0);
  assert_true((n = tcp_segs_in(fd)) >= 0);
  return (unsigned)n;
}

#define BURST 16 /* Reads of a segment of BURST MiB: all asked for at its grant */
static unsigned burst_segs0, burst_segs;

static void burst_read(unsigned n) {
  if (n == 0)
    burst_segs0 = segs_in();
  else if (n == BURST)
    burst_segs = segs_in() - burst_segs0;
}

/* The Reads a pull asks for at once leave its link together: a segment
 * of 16 chunks (cluster.pull_chunk 1M) is asked for in 16 Reads at its
 * grant, which came to the peer in as many TCP segments, each a write of
 * P's loop and a wake-up of the peer's (docs/PERFORMANCE.md "Session
 * 35").  Now they are written corked (gshmd__stream_cork) and come in
 * one or two.  The pull ends whole. */
static void test_reads_together(void **state) {
  static struct job j;
  static const struct plan pl = {"pub/burst", BURST * MiB, 30, false, -1, 0, NULL, false,
                                 burst_read};
  gshm_client_t *p = connect_to(&P);
  (void)state;

  burst_segs = UINT_MAX;
  rh_up(p);
  job_start(&j, &P, "rh", pl.name, false, false);
  serve(&j, &pl, 30000);
  job_join(&j);
  printf("%u Reads came in %u TCP segments (acknowledgements included)\n", BURST, burst_segs);
  assert_int_equal(j.err, 0);
  check_segment(p, pl.name, pl.size, pl.seed);
  assert_int_equal(gshm_unlink(p, pl.name), 0);
  assert_true(burst_segs <= BURST / 4); /* (uncorked: about BURST) */
  rh_down();
  gshm_disconnect(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grant_held),
      cmocka_unit_test(test_read_held),
      cmocka_unit_test(test_cancel_held),
      cmocka_unit_test(test_cancel_failed_held),
      cmocka_unit_test(test_relay_slow),
      cmocka_unit_test(test_relay_list_slow),
      cmocka_unit_test(test_relay_finished_path),
      cmocka_unit_test(test_relay_link_gone),
      cmocka_unit_test(test_relay_busy_early),
      cmocka_unit_test(test_reads_together),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
