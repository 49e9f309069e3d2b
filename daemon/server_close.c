/* SPDX-License-Identifier: Apache-2.0 */
/* Clients' fds closed off the loop thread (see server.h, gshmd_closer_*).
 *
 * Closing an fd a client gave us can block: a TCP socket with SO_LINGER
 * and unacknowledged data waits up to its linger time in close(), and so
 * do FUSE or NFS files; the last reference to a client's socket can hold
 * such fds in its unread queue.  Those closes never run on the loop (one
 * hostile client would stall every other), nor on libuv's thread pool: 16
 * threads shared with metrics and the cluster's seals and copies, which 16
 * lingering sockets held for their linger time (100,000 s), leaking every
 * later connection's fd meanwhile (the attack2 review, 2026-11-27).
 *
 * Closer threads of gshmd's own take batches from one queue.  One thread
 * serves the usual closes (microseconds each; a burst of 1,000 closing
 * connections is one thread's work, not 1,000 threads').  A batch that
 * waited CLOSER_WAIT_MS in the queue while every thread was busy means a
 * close blocks: one more thread is started then, at most one per
 * CLOSER_WAIT_MS, so a blocked close holds its thread and nothing else.
 * Threads beyond the first end after CLOSER_IDLE_MS without work.  Each fd
 * of a batch counts as a connection of its client's uid until it is
 * closed (gshmd__closes_pending): a blocked close holds the fds queued
 * behind it in gshmd's fd table, up to 252 of one packet, and counted per
 * batch a user of quota.connections Q held Q x 253 of them (the attack4
 * review).  So quota.connections and limits.max_connections bound the
 * fds waiting to be closed, hence the batches and the threads, one user
 * and all can hold; a connection whose fds take its uid past them is
 * dropped (server.c, gshmd__fds_over_limits).
 *
 * The other way: packets gshmd sent with an fd stay in flight, counted
 * by the kernel against gshmd's user (ETOOMANYREFS past its
 * RLIMIT_NOFILE: every client's opens fail), as long as the client keeps
 * its end unread, also after gshmd ended the connection.  Such a socket
 * is kept, shut down, while the client has not read them
 * (gshmd_closer_close_client, BATCH_DRAINING) and counts meanwhile as a
 * connection of its uid: before, a user connected, left replies unread,
 * had gshmd drop it, and again, past quota.connections (session 27).
 * Where fds reach gshmd, the client's end could be kept alive by gshmd
 * itself: sent in a packet gshmd never read (behind the one that got it
 * dropped), it lived on in the kept socket's receive queue after the
 * client exited, and the socket never drained (the session 27 review).
 * So a closer thread first takes every packet off that queue, their fds
 * closed by the kernel there (drain_empty); shut down, the socket gets no
 * more.  Then only a live process can keep the client's end, and
 * quota.connections counts it as ever: no deadline is needed, and one
 * would let a live client leave fds in flight past its quota again, one
 * deadline at a time. */
#include "server.h"

#include <errno.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "requests.h"
#include "util.h"

#define CLOSER_WAIT_MS 10      /* a batch waited this long: one more thread */
#define CLOSER_IDLE_MS 2000    /* a thread beyond the first ends idle this long */
#define CLOSER_STACK (256 * 1024) /* (close() needs little; sanitizers more) */
#define DRAIN_CHECK_MS 500     /* how often a draining socket's queue is looked at */
#define DRAIN_EMPTY_MAX 4096   /* packets one pass takes off a kept socket (drain_empty) */

/* BATCH_DRAINING: a dropped client's socket kept (shut down) while the
 * client has not read all gshmd sent on it (gshmd_closer_close_client);
 * queued with empty set, a thread empties its receive queue and it is
 * BATCH_DRAINING again. */
enum batch_state { BATCH_DRAINING, BATCH_QUEUED, BATCH_CLOSING, BATCH_DONE };

struct close_batch {
  struct gshm_list node;  /* closer.all until reaped */
  struct gshm_list qnode; /* closer.queue while queued */
  uid_t uid;
  enum batch_state state;
  bool empty;   /* queued to have fds[0]'s receive queue emptied, not closed */
  bool emptied; /* a pass of drain_empty found that queue empty */
  bool creds;   /* SO_PASSCRED is on fds[0] (drain_empty) */
  int n;
  int left; /* fds not closed yet (written by its thread: atomic) */
  int fds[];
};

struct gshmd_closer {
  pthread_mutex_t mu;          /* everything below but the handles */
  pthread_cond_t cv;           /* a batch was queued, or stopping */
  struct gshm_list queue;      /* batches no thread took yet, oldest first */
  struct gshm_list all;        /* every batch not reaped: queued, closing, done */
  unsigned threads, idle;      /* threads running / waiting for a batch */
  bool stopping;               /* handles closed: no uv call from threads */
  bool freed;                  /* gshmd_closer_free ran: the last thread frees */
  uv_async_t done_async;       /* a batch ended: reap, accept again */
  uv_timer_t spawn_timer;      /* the queue waited: one more thread */
  bool timer_on;
  bool spawn_failed;           /* the last try to start a thread failed (logged) */
  uv_timer_t drain_timer;      /* draining sockets looked at (loop thread only) */
  bool drain_on;
  unsigned draining;           /* batches BATCH_DRAINING, or queued to be emptied */
  struct gshmd_server *srv;
};

static bool batch_queue(struct gshmd_closer *k, struct close_batch *b, bool in_all);

static void closer_destroy(struct gshmd_closer *k) {
  struct gshm_list *pos, *tmp;

  gshm_list_foreach_safe(pos, tmp, &k->all) /* (any left were never begun) */
      free(gshm_list_entry(pos, struct close_batch, node));
  pthread_cond_destroy(&k->cv);
  pthread_mutex_destroy(&k->mu);
  free(k);
}

/* Waits for a batch under k->mu; NULL: this thread should end. */
static struct close_batch *closer_take(struct gshmd_closer *k) {
  while (gshm_list_empty(&k->queue)) {
    struct timespec ts;
    if (k->stopping && k->freed)
      return NULL;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += CLOSER_IDLE_MS / 1000;
    if (pthread_cond_timedwait(&k->cv, &k->mu, &ts) == ETIMEDOUT &&
        gshm_list_empty(&k->queue) && k->threads > 1)
      return NULL;
  }
  struct close_batch *b = gshm_list_entry(k->queue.next, struct close_batch, qnode);
  gshm_list_del(&b->qnode);
  b->state = BATCH_CLOSING;
  k->idle--;
  return b;
}

/* Takes up to DRAIN_EMPTY_MAX packets off the receive queue of fd, a
 * client's socket gshmd shut down, given no room for their fds: the
 * kernel closes those on this thread as it returns (MSG_CTRUNC), where a
 * close that lingers holds this thread only, and none enters gshmd's fd
 * table.  Among them may be the client's own end, which nothing else
 * keeps after it exited.  Shut down, an empty queue reads as a packet of
 * no bytes; with creds (SO_PASSCRED) every packet has a cmsg, so one of
 * no bytes shows MSG_CTRUNC and the end does not.  true: the queue is
 * empty; false: maybe not (the bound, or a packet of no bytes without
 * creds), so the next drain tick empties it again. */
static bool drain_empty(int fd, bool creds) {
  for (int i = 0; i < DRAIN_EMPTY_MAX; i++) {
    uint8_t byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);
    if (n < 0 && errno != EINTR)
      return true; /* (EAGAIN: not shut down after all; else nothing to take) */
    if (!n && !(mh.msg_flags & MSG_CTRUNC))
      return creds;
  }
  return false;
}

/* b's work on a closer thread, k->mu not held: its fds closed, or with
 * b->empty, its socket's receive queue emptied. */
static void batch_work(struct close_batch *b) {
  if (b->empty) {
    b->emptied = drain_empty(b->fds[0], b->creds);
    return;
  }
  for (int i = 0; i < b->n; i++) {
    close(b->fds[i]);
    __atomic_store_n(&b->left, b->n - i - 1, __ATOMIC_RELAXED);
  }
}

static void *closer_main(void *arg) {
  struct gshmd_closer *k = arg;
  struct close_batch *b;
  bool last;

  gshm__name_thread_once("gshmd-close");
  pthread_mutex_lock(&k->mu);
  while ((b = closer_take(k))) {
    pthread_mutex_unlock(&k->mu);
    batch_work(b);
    pthread_mutex_lock(&k->mu);
    k->idle++;
    if (b->empty) { /* kept again (stopping: no drain tick comes, closed now) */
      b->empty = false;
      b->state = BATCH_DRAINING;
      if (k->stopping) {
        k->draining--;
        batch_queue(k, b, true); /* (this thread exists: it cannot fail) */
      }
      continue;
    }
    b->state = BATCH_DONE;
    if (!k->stopping)
      uv_async_send(&k->done_async);
  }
  k->threads--;
  k->idle--;
  last = k->freed && !k->threads;
  pthread_mutex_unlock(&k->mu);
  if (last)
    closer_destroy(k);
  return NULL;
}

/* One more thread, counted idle until it takes a batch; under k->mu.
 * 0 or the positive pthread error. */
static int closer_spawn(struct gshmd_closer *k) {
  pthread_attr_t attr;
  pthread_t t;
  int e;

  if ((e = pthread_attr_init(&attr)))
    return e;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, CLOSER_STACK);
  if (!(e = pthread_create(&t, &attr, closer_main, k))) {
    k->threads++;
    k->idle++;
  }
  pthread_attr_destroy(&attr);
  return e;
}

static void on_spawn_timer(uv_timer_t *t) {
  struct gshmd_closer *k = t->data;
  bool again = false;

  pthread_mutex_lock(&k->mu);
  if (!gshm_list_empty(&k->queue) && !k->idle) {
    int e = closer_spawn(k);
    if (e && !k->spawn_failed) /* (once until a thread is made again: retried each tick) */
      gshm_log_warn("a thread to close clients' fds: %s; they wait for a busy one", strerror(e));
    k->spawn_failed = e != 0;
  }
  /* (the new thread may block too, or none was made; an idle thread takes
   * one batch of those queued before it woke, and may block on it) */
  again = !gshm_list_empty(&k->queue);
  pthread_mutex_unlock(&k->mu);
  if (!again)
    k->timer_on = false;
  else
    uv_timer_start(&k->spawn_timer, on_spawn_timer, CLOSER_WAIT_MS, 0);
}

static void on_done(uv_async_t *a) {
  struct gshmd_closer *k = a->data;

  gshmd__closes_pending(k->srv, (uid_t)-1); /* (reaps) */
  gshmd__accept_resume(k->srv);             /* fds were freed */
}

int gshmd_closer_start(struct gshmd_server *s, uv_loop_t *loop) {
  struct gshmd_closer *k = calloc(1, sizeof(*k));
  int r;

  if (!k)
    return -ENOMEM;
  pthread_mutex_init(&k->mu, NULL);
  pthread_cond_init(&k->cv, NULL);
  gshm_list_init(&k->queue);
  gshm_list_init(&k->all);
  k->srv = s;
  if ((r = uv_async_init(loop, &k->done_async, on_done))) {
    closer_destroy(k);
    return r;
  }
  k->done_async.data = k;
  uv_unref((uv_handle_t *)&k->done_async);
  uv_timer_init(loop, &k->spawn_timer);
  k->spawn_timer.data = k;
  uv_unref((uv_handle_t *)&k->spawn_timer);
  uv_timer_init(loop, &k->drain_timer);
  k->drain_timer.data = k;
  uv_unref((uv_handle_t *)&k->drain_timer);
  s->closer = k;
  return 0;
}

/* Queues b for a closer thread (under k->mu), making one where none
 * exists; b joins k->all unless it is there already (a draining one).
 * false: no thread exists and none could be made (b untouched). */
static bool batch_queue(struct gshmd_closer *k, struct close_batch *b, bool in_all) {
  if (!k->idle && !k->threads && closer_spawn(k))
    return false;
  if (!in_all)
    gshm_list_add_tail(&k->all, &b->node);
  b->state = BATCH_QUEUED;
  gshm_list_add_tail(&k->queue, &b->qnode);
  pthread_cond_signal(&k->cv);
  /* (also with a thread idle: a burst queued before it woke is not all
   * its own, and it may block on the first; the tick checks) */
  if (!k->stopping && !k->timer_on) {
    k->timer_on = true;
    uv_timer_start(&k->spawn_timer, on_spawn_timer, CLOSER_WAIT_MS, 0);
  }
  return true;
}

void gshmd_closer_close(struct gshmd_server *s, const int *fds, int n, uid_t uid) {
  struct gshmd_closer *k = s->closer;
  struct close_batch *b = NULL;
  bool queued = false;

  if (n <= 0)
    return;
  if (k && (b = calloc(1, sizeof(*b) + sizeof(int) * (size_t)n))) {
    b->uid = uid;
    b->n = b->left = n;
    memcpy(b->fds, fds, sizeof(int) * (size_t)n);
    pthread_mutex_lock(&k->mu);
    queued = batch_queue(k, b, false);
    pthread_mutex_unlock(&k->mu);
  }
  if (queued)
    return;
  free(b); /* no thread and none could be made (out of memory): here */
  for (int i = 0; i < n; i++)
    close(fds[i]);
}

/* Each draining socket whose packets are all read now (or every one, when
 * stopping) goes to the closer threads to be closed; one whose receive
 * queue was not found empty yet, to be emptied again. */
static void on_drain_timer(uv_timer_t *t) {
  struct gshmd_closer *k = t->data;
  struct gshm_list *pos;

  pthread_mutex_lock(&k->mu);
  gshm_list_foreach(pos, &k->all) {
    struct close_batch *b = gshm_list_entry(pos, struct close_batch, node);
    int queued = 0;
    if (b->state != BATCH_DRAINING)
      continue;
    if (!k->stopping && !ioctl(b->fds[0], SIOCOUTQ, &queued) && queued > 0) {
      if (!b->emptied) { /* (no thread: the next tick tries again) */
        b->empty = true;
        if (!batch_queue(k, b, true))
          b->empty = false;
      }
      continue;
    }
    k->draining--;
    if (!batch_queue(k, b, true)) { /* (no thread: here, as gshmd_closer_close) */
      close(b->fds[0]);
      b->left = 0;
      b->state = BATCH_DONE;
    }
  }
  if (!k->draining) {
    uv_timer_stop(t);
    k->drain_on = false;
  }
  pthread_mutex_unlock(&k->mu);
}

void gshmd_closer_close_client(struct gshmd_server *s, int fd, uid_t uid, bool sent_fds) {
  struct gshmd_closer *k = s->closer;
  struct close_batch *b;
  int queued = 0;

  if (!sent_fds || !k || k->stopping || ioctl(fd, SIOCOUTQ, &queued) || queued <= 0 ||
      !(b = calloc(1, sizeof(*b) + sizeof(int)))) {
    gshmd_closer_close(s, &fd, 1, uid);
    return;
  }
  shutdown(fd, SHUT_RDWR); /* (the client reads what is queued, then the end; sends no more) */
  /* (every queued packet then reads with a cmsg: drain_empty tells them
   * from the end; set after the shutdown, so no send of the client's
   * autobinds its socket for it) */
  b->creds = !setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &(int){1}, sizeof(int));
  b->uid = uid;
  b->n = b->left = 1;
  b->fds[0] = fd;
  b->empty = true; /* (now: what pins its end goes before the first tick) */
  pthread_mutex_lock(&k->mu);
  if (!batch_queue(k, b, false)) { /* (no thread: the tick tries again) */
    b->empty = false;
    b->state = BATCH_DRAINING;
    gshm_list_add_tail(&k->all, &b->node);
  }
  k->draining++;
  pthread_mutex_unlock(&k->mu);
  if (!k->drain_on) {
    k->drain_on = true;
    uv_timer_start(&k->drain_timer, on_drain_timer, DRAIN_CHECK_MS, DRAIN_CHECK_MS);
  }
}

uint32_t gshmd__closes_pending(struct gshmd_server *s, uid_t uid) {
  struct gshmd_closer *k = s->closer;
  struct gshm_list *pos, *tmp;
  uint32_t all = 0, of_uid = 0, left;

  if (!k)
    return 0;
  pthread_mutex_lock(&k->mu);
  gshm_list_foreach_safe(pos, tmp, &k->all) {
    struct close_batch *b = gshm_list_entry(pos, struct close_batch, node);
    if (b->state == BATCH_DONE) {
      gshm_list_del(&b->node);
      free(b);
      continue;
    }
    left = (uint32_t)__atomic_load_n(&b->left, __ATOMIC_RELAXED);
    all += left;
    of_uid += b->uid == uid ? left : 0;
  }
  pthread_mutex_unlock(&k->mu);
  return uid == (uid_t)-1 ? all : of_uid;
}

void gshmd_closer_stop(struct gshmd_server *s) {
  struct gshmd_closer *k = s->closer;

  if (!k || k->stopping)
    return;
  pthread_mutex_lock(&k->mu);
  k->stopping = true; /* (threads send no more wake-ups) */
  pthread_mutex_unlock(&k->mu);
  if (k->drain_on)
    on_drain_timer(&k->drain_timer); /* (stopping: every draining socket is closed) */
  uv_close((uv_handle_t *)&k->done_async, NULL);
  uv_close((uv_handle_t *)&k->spawn_timer, NULL);
  uv_close((uv_handle_t *)&k->drain_timer, NULL);
}

void gshmd_closer_free(struct gshmd_server *s) {
  struct gshmd_closer *k = s->closer;
  bool now;

  if (!k)
    return;
  s->closer = NULL;
  pthread_mutex_lock(&k->mu);
  k->stopping = k->freed = true;
  now = !k->threads;
  pthread_cond_broadcast(&k->cv); /* (idle threads end; busy ones after their close) */
  pthread_mutex_unlock(&k->mu);
  if (now)
    closer_destroy(k);
}
