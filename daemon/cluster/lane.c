/* SPDX-License-Identifier: Apache-2.0 */
/* Data lanes (lane.h): a thread per extra TCP connection of a link, and
 * the loop's side of their events. */
#include "lane.h"
#include "lane_io.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

enum lane_ev_kind { EV_SENT, EV_RECEIVED, EV_EXIT };

struct lane;

/* What a thread tells the loop; embedded where it comes from (no
 * allocation on a thread). */
struct lane_ev {
  struct lane_ev *next;
  enum lane_ev_kind kind;
  int err;
  struct lane *ln;
};

/* One data frame to send (serving side): sealed on libuv's pool, then
 * written by the lane's thread, in the order of its frame numbers. */
struct lane_job {
  struct lane_job *next;      /* ln->pending (loop), then ln->jobs (thread) */
  struct lane_ev ev;          /* EV_SENT */
  struct lane *ln;
  struct frame_hdr hdr;
  const uint8_t *src;
  uint64_t n;                 /* its frame number */
  uint8_t tag[STREAM_TAG];
  uint8_t *ct;                /* encrypting: the ciphertext, freed once written */
  int err;                    /* sealing failed (-ENOMEM): the lane ends */
  bool ready;                 /* sealed */
  uv_work_t work;
  void (*done)(void *arg, int err);
  void *arg;
};

/* A received frame for the loop (EV_RECEIVED): a lane's thread goes on
 * to the next frame before the loop has handled it, so each has its own,
 * LANE_RX_SLOTS of them a lane, taken in turn (the thread waits while
 * all are with the loop). */
#define LANE_RX_SLOTS 8
struct lane_rx {
  struct lane_ev ev;
  void *tok;                  /* its request (gshmd__landing_claim) */
  uint8_t *dst;
  struct frame_hdr hdr;       /* pool check (not inline_rx): header, tag, number */
  uint8_t tag[STREAM_TAG];
  uint64_t n;
};

struct lane {
  struct links *ll;
  struct link *l;             /* the lane's own link (loop side) */
  struct stream_state st;     /* fd, keys, frame numbers */
  bool sender;
  /* gshmd__lane_inline: the thread seals (inline_tx) or opens (inline_rx)
   * each frame piece by piece as it goes, in its cache; else the pool */
  bool inline_tx, inline_rx;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;                  /* under mu: the loop wants the thread gone */
  struct lane_job *jobs, **jobs_tail; /* under mu: sender's queue */
  /* sender, loop side: frames being sealed, in frame-number order */
  struct lane_job *pending, **pending_tail;
  uint64_t n_next;            /* the next frame's number */
  uint64_t assigned;          /* bytes of all frames given to it (gshmd__lane_send) */
  unsigned sealing;           /* seal jobs on the pool: ln is freed after the last */
  bool exited;                /* the thread is gone (EV_EXIT handled) */
  /* receiver: where frames go (claimed in the link's landings, which
   * the lane holds a reference of), and the frames with the loop */
  struct landings *landings;
  bool stray;                 /* it ended on a frame nobody asked for */
  struct lane_rx rx[LANE_RX_SLOTS];
  unsigned rx_next;           /* thread: the next slot */
  unsigned rx_busy;           /* under mu: slots with the loop */
  struct lane_ev ev_exit;
  atomic_uint_fast64_t queued;  /* bytes queued, not yet written */
  atomic_int_fast64_t progress_ns; /* sender: CLOCK_MONOTONIC, the last frame written */
  atomic_int_fast64_t frame_ns;  /* receiver: the frame it reads began (lane_io.h); 0: none */
};

struct lane_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* signalled with each event (gshmd__lanes_stop waits) */
  uv_async_t async;
  struct lane_ev *head, **tail;
  unsigned live;              /* threads started, EV_EXIT not yet handled */
};

/* ---- threads ----------------------------------------------------------- */

static void post(struct lane_queue *q, struct lane_ev *ev) {
  pthread_mutex_lock(&q->mu);
  ev->next = NULL;
  *q->tail = ev;
  q->tail = &ev->next;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  uv_async_send(&q->async);
}

static void post_ev(struct lane *ln, struct lane_ev *ev, enum lane_ev_kind kind, int err) {
  ev->kind = kind;
  ev->err = err;
  ev->ln = ln;
  post(ln->ll->lanes_q, ev);
}

static int send_one(struct lane *ln, struct lane_job *j) {
  struct iovec iov[3];
  int e;

  if (j->err)
    return j->err;
  if (ln->inline_tx) /* sealed as it goes */
    return gshmd__lane_write_inline(ln->st.fd, ln->st.mode_tx, ln->st.key_tx, j->n, &j->hdr,
                                    j->src, j->tag);
  iov[0] = (struct iovec){&j->hdr, sizeof(j->hdr)};
  iov[1] = (struct iovec){(void *)(j->ct ? j->ct : j->src), j->hdr.len};
  iov[2] = (struct iovec){j->tag, sizeof(j->tag)};
  e = gshmd__lane_write_all(ln->st.fd, iov, 3);
  free(j->ct);
  j->ct = NULL;
  return e;
}

static void *sender_main(void *arg) {
  struct lane *ln = arg;
  int err = 0;

  for (;;) {
    struct lane_job *j;
    pthread_mutex_lock(&ln->mu);
    while (!ln->stop && !ln->jobs)
      pthread_cond_wait(&ln->cv, &ln->mu);
    if (ln->stop || err) {
      pthread_mutex_unlock(&ln->mu);
      break;
    }
    j = ln->jobs;
    if (!(ln->jobs = j->next))
      ln->jobs_tail = &ln->jobs;
    pthread_mutex_unlock(&ln->mu);
    err = send_one(ln, j);
    atomic_fetch_sub(&ln->queued, j->hdr.len);
    atomic_store(&ln->progress_ns, gshm__now_ns(CLOCK_MONOTONIC));
    post_ev(ln, &j->ev, EV_SENT, err);
    if (err)
      break;
  }
  post_ev(ln, &ln->ev_exit, EV_EXIT, err);
  return NULL;
}

/* Receives one data frame: header, where it goes (its request claimed
 * in the link's landings: link.h), the bytes, the tag (checked here
 * where ln->inline_rx, else handed to the loop with the frame).  Returns
 * 0 or a negative errno (the lane ends). */
static int receive_one(struct lane *ln) {
  struct lane_rx *rx = &ln->rx[ln->rx_next];
  struct frame_hdr *h = &rx->hdr;
  int e;

  /* the slot, once the loop is done with its last frame */
  pthread_mutex_lock(&ln->mu);
  while (ln->rx_busy == LANE_RX_SLOTS)
    pthread_cond_wait(&ln->cv, &ln->mu);
  pthread_mutex_unlock(&ln->mu);
  if ((e = gshmd__lane_read_begin(ln->st.fd, h, sizeof(*h), &ln->frame_ns)))
    return e;
  /* (a frame of no byte, or not data, answers no request either) */
  if (h->kind != FRAME_DATA || h->len == 0 ||
      gshmd__landing_claim(ln->landings, h->request_id, h->offset, h->len, (void **)&rx->dst,
                           &rx->tok)) {
    ln->stray = true;
    return -EPROTO; /* nothing was claimed */
  }
  /* checked here, or on libuv's pool while this thread reads the next
   * frame (rx keeps what that needs) */
  if (ln->inline_rx)
    e = gshmd__lane_read_inline(ln->st.fd, ln->st.mode_rx, ln->st.key_rx, ln->st.n_rx++, h,
                                rx->dst);
  else if (!(e = gshmd__lane_read_all(ln->st.fd, rx->dst, h->len)) &&
           !(e = gshmd__lane_read_all(ln->st.fd, rx->tag, sizeof(rx->tag))))
    rx->n = ln->st.n_rx++;
  atomic_store_explicit(&ln->frame_ns, 0, memory_order_relaxed);
  pthread_mutex_lock(&ln->mu);
  ln->rx_busy++;
  pthread_mutex_unlock(&ln->mu);
  ln->rx_next = (ln->rx_next + 1) % LANE_RX_SLOTS;
  post_ev(ln, &rx->ev, EV_RECEIVED, e); /* (a claimed frame always ends with the loop) */
  return e;
}

static void *receiver_main(void *arg) {
  struct lane *ln = arg;
  int err;

  while (!(err = receive_one(ln)))
    ;
  /* EV_RECEIVED must be handled before the frame's buffers are reused:
   * the exit comes after it in the queue */
  post_ev(ln, &ln->ev_exit, EV_EXIT, err);
  return NULL;
}

/* ---- the loop's side --------------------------------------------------- */

static void lane_detach_from(struct link *parent, struct link *lane) {
  for (unsigned i = 0; i < parent->nlanes; i++)
    if (parent->lanes[i] == lane) {
      parent->lanes[i] = parent->lanes[--parent->nlanes];
      break;
    }
  lane->lane_of = NULL;
}

/* A received frame's tag checked (and its bytes decrypted) on the pool. */
struct lane_check {
  uv_work_t w;
  struct link *l;             /* the lane's link: held (busy) until done */
  struct landings *landings;  /* held until done: data_done takes tok out of them, and
                                 the lane (EV_EXIT) and its link may both go first */
  void *tok;
  uint8_t *dst;
  struct frame_hdr hdr;
  uint8_t tag[STREAM_TAG];
  uint64_t n;
  enum stream_mode mode;
  uint8_t key[STREAM_KEY];
  int err;
};

static void check_work(uv_work_t *w) {
  struct lane_check *c = w->data;

  gshm__name_thread_once("gshmd-pool");
  c->err = gshmd__stream_unseal(c->mode, c->key, c->n, &c->hdr, c->dst, c->hdr.len, c->tag);
}

static void frame_done(struct links *ll, struct link *l, void *tok, int err) {
  struct link *parent = l->lane_of;

  ll->hooks.data_done(l, tok, err);
  if (err == -EBADMSG) {
    gshmd__link_refused(ll, REFUSE_TAMPERED, l->remote,
                        "a data frame failed its authentication on a lane");
    if (parent)
      gshmd__link_fail(parent, -EPROTO, "a data frame failed its authentication");
  }
}

static void check_done(uv_work_t *w, int status) {
  struct lane_check *c = w->data;
  struct link *l = c->l;

  frame_done(l->ll, l, c->tok, status ? -ECANCELED : c->err);
  gshmd__landings_unref(c->landings);
  sodium_memzero(c->key, sizeof(c->key));
  free(c);
  l->busy--;
  gshmd__link_unbusy(l);
}

/* A frame's bytes are in place (err 0: its tag checked where
 * ln->inline_rx, else still to check) or its reading failed. */
static void on_received(struct lane *ln, const struct lane_rx *rx, int err) {
  struct lane_check *c;

  if (err || ln->inline_rx) {
    frame_done(ln->ll, ln->l, rx->tok, err);
    return;
  }
  if (!(c = calloc(1, sizeof(*c)))) {
    frame_done(ln->ll, ln->l, rx->tok, -ENOMEM);
    return;
  }
  c->w.data = c;
  c->l = ln->l;
  c->tok = rx->tok;
  c->dst = rx->dst;
  c->hdr = rx->hdr;
  memcpy(c->tag, rx->tag, sizeof(c->tag));
  c->n = rx->n;
  c->mode = ln->st.mode_rx;
  memcpy(c->key, ln->st.key_rx, sizeof(c->key));
  if (uv_queue_work(ln->ll->loop, &c->w, check_work, check_done)) {
    sodium_memzero(c->key, sizeof(c->key));
    free(c);
    frame_done(ln->ll, ln->l, rx->tok, -ENOMEM);
    return;
  }
  ln->l->busy++;
  c->landings = ln->landings;
  gshmd__landings_ref(c->landings);
}

/* Frees ln once its thread is gone and no seal job holds it. */
static void lane_free(struct lane *ln) {
  if (!ln->exited || ln->sealing)
    return;
  sodium_memzero(&ln->st, sizeof(ln->st));
  gshmd__landings_unref(ln->landings);
  pthread_mutex_destroy(&ln->mu);
  pthread_cond_destroy(&ln->cv);
  free(ln);
}

static void on_lane_exit(struct lane *ln, int err) {
  struct links *ll = ln->ll;
  struct link *l = ln->l, *parent = l->lane_of;

  pthread_join(ln->thread, NULL);
  close(ln->st.fd);
  ll->nconns--;
  ll->lanes_q->live--;
  while (ln->jobs) { /* never written */
    struct lane_job *j = ln->jobs;
    ln->jobs = j->next;
    j->done(j->arg, -ECONNRESET);
    free(j->ct);
    free(j);
  }
  if (parent) { /* the lane ended first: the link's bytes on it are lost */
    char why[160];
    if (ln->stray) {
      gshmd__link_refused(ll, REFUSE_PROTOCOL, l->remote, "data for no request on a lane");
      snprintf(why, sizeof(why), "the peer sent data for no request (or not the bytes asked "
                                 "for) on a data lane");
    } else {
      snprintf(why, sizeof(why), "connection lost (a data lane: %s)",
               err == -ECONNRESET ? "closed by the peer" : strerror(-err));
    }
    lane_detach_from(parent, l);
    gshmd__link_fail(parent, err == -EPROTO ? -EPROTO : -ECONNRESET, why);
  }
  l->lane = NULL;
  ln->exited = true;
  lane_free(ln); /* (after its seal jobs, if some still run) */
  gshmd__link_fail(l, -ECONNRESET, "data lane ended");
  l->busy--;
  gshmd__link_unbusy(l);
}

static void handle(struct lane_ev *ev) {
  struct lane *ln = ev->ln;

  switch (ev->kind) {
  case EV_SENT: {
    struct lane_job *j = (struct lane_job *)((char *)ev - offsetof(struct lane_job, ev));
    j->done(j->arg, ev->err);
    free(j);
    break;
  }
  case EV_RECEIVED: {
    struct lane_rx *rx = (struct lane_rx *)((char *)ev - offsetof(struct lane_rx, ev));
    on_received(ln, rx, ev->err);
    pthread_mutex_lock(&ln->mu); /* its slot is free again */
    ln->rx_busy--;
    pthread_cond_signal(&ln->cv);
    pthread_mutex_unlock(&ln->mu);
    break;
  }
  case EV_EXIT:
    on_lane_exit(ln, ev->err);
    break;
  }
}

static void drain(struct lane_queue *q) {
  for (;;) {
    struct lane_ev *ev;
    pthread_mutex_lock(&q->mu);
    if ((ev = q->head) && !(q->head = ev->next))
      q->tail = &q->head;
    pthread_mutex_unlock(&q->mu);
    if (!ev)
      return;
    handle(ev);
  }
}

static void on_async(uv_async_t *a) {
  struct links *ll = a->data;
  drain(ll->lanes_q);
  gshmd__link_kick(ll);
}

int gshmd__lanes_init(struct links *ll) {
  struct lane_queue *q = calloc(1, sizeof(*q));
  int e;

  if (!q)
    return -ENOMEM;
  q->tail = &q->head;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  if ((e = uv_async_init(ll->loop, &q->async, on_async))) {
    free(q);
    return e;
  }
  q->async.data = ll;
  uv_unref((uv_handle_t *)&q->async);
  ll->lanes_q = q;
  return 0;
}

void gshmd__lanes_stop(struct links *ll) {
  struct lane_queue *q = ll->lanes_q;

  if (!q)
    return;
  /* every link failed: each lane's connection is shut down, so each
   * thread ends soon; wait for their last events */
  for (;;) {
    drain(q);
    pthread_mutex_lock(&q->mu);
    if (!q->live) {
      pthread_mutex_unlock(&q->mu);
      break;
    }
    while (!q->head)
      pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
  }
  uv_close((uv_handle_t *)&q->async, NULL);
}

void gshmd__lanes_destroy(struct links *ll) {
  struct lane_queue *q = ll->lanes_q;
  if (!q)
    return;
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  free(q);
  ll->lanes_q = NULL;
}

int gshmd__lane_attach(struct link *lane, struct link *parent) {
  struct links *ll = lane->ll;
  struct lane *ln;
  int e;

  if (parent->nlanes >= LINK_MAX_LANES)
    return -EMLINK;
  if (!ll->lanes_q || !(ln = calloc(1, sizeof(*ln))))
    return -ENOMEM;
  ln->ll = ll;
  ln->l = lane;
  ln->sender = lane->inbound;
  ln->jobs_tail = &ln->jobs;
  ln->pending_tail = &ln->pending;
  atomic_init(&ln->queued, 0);
  atomic_init(&ln->progress_ns, gshm__now_ns(CLOCK_MONOTONIC));
  atomic_init(&ln->frame_ns, 0);
  pthread_mutex_init(&ln->mu, NULL);
  pthread_cond_init(&ln->cv, NULL);
  /* a receiver claims its frames' requests in parent's landings */
  if (!ln->sender && !(ln->landings = gshmd__link_landings(parent)))
    e = -ENOMEM;
  else
    e = gshmd__stream_detach(&lane->st, &ln->st);
  if (e) {
    pthread_mutex_destroy(&ln->mu);
    pthread_cond_destroy(&ln->cv);
    free(ln);
    return e;
  }
  ln->n_next = ln->st.n_tx; /* frame numbers from here on: the loop's (seal_work) */

  ln->inline_tx = ln->sender && gshmd__lane_inline(ln->st.mode_tx);
  ln->inline_rx = !ln->sender && gshmd__lane_inline(ln->st.mode_rx);
  /* the stream's close gives its connection back to the budget; the
   * thread's fd takes it again until EV_EXIT */
  ll->nconns++;
  if (pthread_create(&ln->thread, NULL, ln->sender ? sender_main : receiver_main, ln)) {
    close(ln->st.fd);
    ll->nconns--;
    sodium_memzero(&ln->st, sizeof(ln->st));
    pthread_mutex_destroy(&ln->mu);
    pthread_cond_destroy(&ln->cv);
    free(ln);
    return -EAGAIN;
  }
  /* named for top -H, perf and /proc (at most 15 characters) */
  pthread_setname_np(ln->thread, ln->sender ? "gshmd-lane-tx" : "gshmd-lane-rx");
  ll->lanes_q->live++;
  if (ln->landings) /* (parent's until lane_free) */
    gshmd__landings_ref(ln->landings);
  lane->lane = ln;
  lane->lane_of = parent;
  lane->busy++; /* until EV_EXIT */
  lane->state = LINK_UP;
  parent->lanes[parent->nlanes++] = lane;
  if (!lane->inbound && parent->nlanes == ll->streams)
    gshm_log_info("cluster: peer '%s': %u data lanes up", parent->peer->name, parent->nlanes);
  return 0;
}

void gshmd__lane_stop(struct link *lane) {
  struct lane *ln = lane->lane;

  if (lane->lane_of)
    lane_detach_from(lane->lane_of, lane);
  if (!ln)
    return;
  pthread_mutex_lock(&ln->mu);
  ln->stop = true;
  pthread_cond_signal(&ln->cv);
  pthread_mutex_unlock(&ln->mu);
  shutdown(ln->st.fd, SHUT_RDWR);
}

void gshmd__lanes_fail(struct link *parent) {
  while (parent->nlanes) {
    struct link *lane = parent->lanes[parent->nlanes - 1];
    lane_detach_from(parent, lane);
    gshmd__link_fail(lane, -ECONNRESET, "its link failed");
  }
  /* lanes still in their hello name parent only by token: theirs fails
   * at attach (no such link) */
}

/* On the pool: the frame's tag (and ciphertext, into a buffer of its
 * own: the serving side's bytes in flight per link bound them all). */
static void seal_work(uv_work_t *w) {
  struct lane_job *j = w->data;
  struct lane *ln = j->ln;

  gshm__name_thread_once("gshmd-pool");
  if (gshmd__stream_encrypts(ln->st.mode_tx) && !(j->ct = malloc(j->hdr.len))) {
    j->err = -ENOMEM;
    return;
  }
  j->err = gshmd__stream_seal(ln->st.mode_tx, ln->st.key_tx, j->n, &j->hdr, j->src, j->ct,
                              j->hdr.len, j->tag);
}

/* A frame is sealed: the sealed ones at the head of the order go to the
 * thread (or end, when it is gone). */
static void flush_ready(struct lane *ln);

static void seal_done(uv_work_t *w, int status) {
  struct lane_job *j = w->data;
  struct lane *ln = j->ln;

  j->ready = true;
  if (status && !j->err)
    j->err = -ECANCELED;
  ln->sealing--;
  flush_ready(ln);
  lane_free(ln);
}

/* The sealed frames at the head of ln's order go to the thread (or end,
 * when it is gone). */
static void flush_ready(struct lane *ln) {
  while (ln->pending && ln->pending->ready) {
    struct lane_job *h = ln->pending;
    if (!(ln->pending = h->next))
      ln->pending_tail = &ln->pending;
    h->next = NULL;
    if (ln->exited) {
      atomic_fetch_sub(&ln->queued, h->hdr.len);
      h->done(h->arg, -ECONNRESET);
      free(h->ct);
      free(h);
      continue;
    }
    pthread_mutex_lock(&ln->mu);
    *ln->jobs_tail = h;
    ln->jobs_tail = &h->next;
    pthread_cond_signal(&ln->cv);
    pthread_mutex_unlock(&ln->mu);
  }
}

int gshmd__lane_send(struct link *parent, uint32_t rid, uint64_t offset, const void *src,
                     uint64_t len, void (*done)(void *arg, int err), void *arg) {
  struct lane *best = NULL;
  uint64_t best_q = 0;
  struct lane_job *j;

  /* the lane with the fewest bytes still to write; among those with as
   * few (all of them, when the socket buffers take frames as they come),
   * the one given the fewest bytes so far: the first one alone took
   * 151 of a model's 545 frames and the last 10, which left the pulling
   * side's threads of the busy lanes the bottleneck (docs/PERFORMANCE.md
   * "What a set of small segments waits on") */
  for (unsigned i = 0; i < parent->nlanes; i++) {
    struct lane *ln = parent->lanes[i]->lane;
    uint64_t q;
    if (!ln || !ln->sender)
      continue;
    q = atomic_load(&ln->queued);
    if (!best || q < best_q || (q == best_q && ln->assigned < best->assigned)) {
      best = ln;
      best_q = q;
    }
  }
  if (!best)
    return -ENOTCONN;
  if (len == 0 || len > UINT32_MAX)
    return -EINVAL;
  if (!(j = calloc(1, sizeof(*j))))
    return -ENOMEM;
  j->hdr = gshmd__frame_data(rid, offset, len);
  j->src = src;
  j->done = done;
  j->arg = arg;
  j->ln = best;
  j->n = best->n_next;
  j->work.data = j;
  if (best->inline_tx) { /* tagged by the thread as it writes (send_tagged) */
    j->ready = true;
  } else if (uv_queue_work(best->ll->loop, &j->work, seal_work, seal_done)) {
    free(j);
    return -ENOMEM;
  } else {
    best->sealing++;
  }
  best->n_next++;
  best->assigned += len;
  *best->pending_tail = j;
  best->pending_tail = &j->next;

  if (atomic_fetch_add(&best->queued, len) == 0)
    atomic_store(&best->progress_ns, gshm__now_ns(CLOCK_MONOTONIC));
  if (j->ready) /* (never an exited lane's: that is off parent's lanes) */
    flush_ready(best);
  return 0;
}

const char *gshmd__lane_overdue(const struct link *lane, int64_t now) {
  struct lane *ln = lane->lane;

  if (ln && !ln->sender) /* a frame stopped midway (lane_io.h) */
    return gshmd__lane_rx_overdue(ln->st.fd, &ln->frame_ns, now, lane->ll->request_timeout_ns);
  return ln && atomic_load(&ln->queued) &&
                 now - atomic_load(&ln->progress_ns) > lane->ll->request_timeout_ns
             ? "the peer did not read a data lane in time"
             : NULL;
}

/* A lane fails: its thread stops, and its link fails unless that is why;
 * an outbound lane that never came up makes room for the next (or, after
 * two such, for none). */
static void lane_down(struct link *l, enum link_state was) {
  struct peer *p = l->peer;
  struct link *parent = l->lane_of;

  gshmd__lane_stop(l); /* off its link's lanes */
  if (parent) /* a lane failed on its own (a timeout): its link's bytes on it are lost */
    gshmd__link_fail(parent, -ECONNRESET, "connection lost (a data lane failed)");
  if (l->inbound || was == LINK_UP || !p)
    return;
  p->lanes_connecting--;
  if (p->out && p->out->state == LINK_UP &&
      sodium_memcmp(p->out->lane_token, l->lane_token, LINK_LANE_TOKEN) == 0) {
    p->out->lane_failures++;
    gshmd__lanes_open(p->out);
  }
}

void gshmd__lanes_link_failed(struct link *l, enum link_state was) {
  if (l->is_lane)
    lane_down(l, was);
  else
    gshmd__lanes_fail(l);
}

void gshmd__lanes_open(struct link *l) {
  struct links *ll = l->ll;
  struct peer *p = l->peer;

  if (l->inbound || l->is_lane || l->state != LINK_UP || l->ucx || ll->streams < 2 ||
      ll->stopping || !(l->caps_theirs & GSHM__CLUSTER__CAP__CAP_LANES) || !p || p->out != l)
    return;
  while (l->lane_failures < 2 && p->lanes_connecting < 2 &&
         l->nlanes + p->lanes_connecting < ll->streams &&
         l->nlanes + p->lanes_connecting < LINK_MAX_LANES)
    if (!gshmd__link_connect_lane(l))
      break;
}
