/* SPDX-License-Identifier: Apache-2.0 */
/* gshm's framed, authenticated TCP connection between two gshmd
 * (stream.h). */
#include "stream.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "struct frame_hdr is sent as it lies in memory: little-endian hosts only"
#endif
_Static_assert(sizeof(struct frame_hdr) == 24, "frame header size");

enum { RX_HDR, RX_PAYLOAD, RX_TAG };

/* One frame to send: header, payload (the caller's or ours), tag. */
struct stream_tx {
  struct gshm_list node;        /* s->txq until written */
  struct stream *s;
  struct frame_hdr hdr;
  const uint8_t *payload;
  uint8_t *owned;               /* ciphertext or a control payload: freed with tx */
  uint64_t n;                   /* nonce */
  uint8_t tag[STREAM_TAG];
  bool ready, dropped;
  int err;
  void (*done)(void *arg, int err);
  void *arg;
  uv_work_t work;
  uv_write_t wr;
};

/* One data frame received: verified (and decrypted) on the pool. */
struct stream_rx {
  struct stream *s;
  struct frame_hdr hdr;
  uint8_t *dst;
  void *tok;
  uint64_t n;
  uint8_t tag[STREAM_TAG];
  int err;
  uv_work_t work;
};

/* ---- sending ----------------------------------------------------------- */

static void tx_free(struct stream_tx *tx) {
  free(tx->owned);
  free(tx);
}

static void tx_end(struct stream_tx *tx, int err) {
  if (tx->done)
    tx->done(tx->arg, err);
  tx_free(tx);
}

static void maybe_closed(struct stream *s) {
  if (s->closed && s->jobs == 0 && s->ops->on_closed) {
    const struct stream_ops *ops = s->ops;
    s->ops = NULL; /* once */
    ops->on_closed(s);
  }
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

/* A frame left the queue (written or dropped). */
static void tx_unqueue(struct stream *s, const struct stream_tx *tx) {
  s->tx_bytes -= tx->hdr.len;
  if (tx->hdr.kind == FRAME_CTRL)
    s->ctrl_queued -= tx->hdr.len + STREAM_CTRL_COST;
  /* answers are going out again: read the peer's requests again */
  if (s->paused && s->ctrl_queued <= s->ctrl_queued_max / 2 && !s->closing && !s->failed) {
    s->paused = false;
    uv_read_start((uv_stream_t *)&s->tcp, on_alloc, on_read);
  }
}

static void on_written(uv_write_t *wr, int status) {
  struct stream_tx *tx = wr->data;

  tx_unqueue(tx->s, tx);
  tx_end(tx, status ? -ECONNRESET : 0);
}

/* Writes the frames at the head of the queue whose crypto is done, in
 * nonce order. */
static void flush(struct stream *s) {
  while (!s->closing && !gshm_list_empty(&s->txq)) {
    struct stream_tx *tx = gshm_list_entry(s->txq.next, struct stream_tx, node);
    uv_buf_t b[3];
    unsigned nb = 0;
    if (!tx->ready)
      return;
    gshm_list_del(&tx->node);
    b[nb++] = uv_buf_init((char *)&tx->hdr, sizeof(tx->hdr));
    if (tx->hdr.len)
      b[nb++] = uv_buf_init((char *)(tx->owned ? tx->owned : tx->payload), tx->hdr.len);
    if (s->mode_tx != STREAM_PLAIN && tx->n != UINT64_MAX)
      b[nb++] = uv_buf_init((char *)tx->tag, STREAM_TAG);
    tx->wr.data = tx;
    if (uv_write(&tx->wr, (uv_stream_t *)&s->tcp, b, nb, on_written)) {
      tx_unqueue(s, tx);
      tx_end(tx, -ECONNRESET);
    }
  }
}

int gshmd__stream_send_ctrl(struct stream *s, const uint8_t *payload, size_t len) {
  struct stream_tx *tx;

  if (s->closing || s->failed)
    return -ENOTCONN;
  if (len > (s->mode_tx == STREAM_PLAIN ? STREAM_PREHELLO_MAX : STREAM_CTRL_MAX))
    return -EMSGSIZE;
  if (!(tx = calloc(1, sizeof(*tx))) || !(tx->owned = malloc(len ? len : 1))) {
    free(tx);
    return -ENOMEM;
  }
  tx->s = s;
  tx->hdr.kind = FRAME_CTRL;
  tx->hdr.len = (uint32_t)len;
  tx->n = UINT64_MAX; /* no tag before the keys */
  if (s->mode_tx != STREAM_PLAIN) {
    int e = gshmd__stream_seal(s->mode_tx, s->key_tx, s->n_tx, &tx->hdr, payload, tx->owned, len,
                               tx->tag);
    if (e) { /* (its frame number stays for the next frame) */
      tx_free(tx);
      return e;
    }
    tx->n = s->n_tx++;
    if (!gshmd__stream_encrypts(s->mode_tx))
      memcpy(tx->owned, payload, len);
  } else {
    memcpy(tx->owned, payload, len);
  }
  tx->ready = true;
  s->tx_bytes += len;
  s->ctrl_queued += len + STREAM_CTRL_COST;
  gshm_list_add_tail(&s->txq, &tx->node);
  flush(s);
  return 0;
}

void gshmd__stream_cork(struct stream *s, bool on) {
  uv_os_fd_t fd;
  int v = on;

  if (on)
    s->corked++;
  else if (s->corked)
    s->corked--;
  else
    return; /* (unbalanced: a caller's bug) */
  /* (the outermost call only; a closing handle has no fd to set) */
  if (s->corked != (on ? 1u : 0u) || s->closing || uv_fileno((uv_handle_t *)&s->tcp, &fd))
    return;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_CORK, &v, sizeof(v));
}

static void seal_work(uv_work_t *w) {
  struct stream_tx *tx = w->data;
  struct stream *s = tx->s;

  gshm__name_thread_once("gshmd-pool");
  tx->err = gshmd__stream_seal(s->mode_tx, s->key_tx, tx->n, &tx->hdr, tx->payload, tx->owned,
                               tx->hdr.len, tx->tag);
}

static void stream_fail(struct stream *s, int err, const char *why);

static void seal_done(uv_work_t *w, int status) {
  struct stream_tx *tx = w->data;
  struct stream *s = tx->s;

  s->jobs--;
  tx->ready = true;
  if (tx->dropped || status) {
    tx_end(tx, -ECONNRESET);
    maybe_closed(s);
    return;
  }
  if (tx->err) { /* its frame number is spent: the stream cannot go on (closing drops tx) */
    stream_fail(s, tx->err, "out of memory sealing a data frame");
    return;
  }
  flush(s);
}

int gshmd__stream_send_data(struct stream *s, uint32_t request_id, uint64_t offset,
                            const void *src, uint64_t len, void (*done)(void *arg, int err),
                            void *arg) {
  struct stream_tx *tx;

  if (s->closing || s->failed || s->mode_tx == STREAM_PLAIN)
    return -ENOTCONN;
  if (len == 0 || len > UINT32_MAX)
    return -EINVAL;
  if (!(tx = calloc(1, sizeof(*tx))))
    return -ENOMEM;
  if (gshmd__stream_encrypts(s->mode_tx) && !(tx->owned = malloc(len))) {
    free(tx);
    return -ENOMEM;
  }
  tx->s = s;
  tx->hdr = gshmd__frame_data(request_id, offset, len);
  tx->payload = src;
  tx->done = done;
  tx->arg = arg;
  tx->work.data = tx;
  tx->n = s->n_tx; /* before the job can read it */
  if (uv_queue_work(s->loop, &tx->work, seal_work, seal_done)) {
    tx_free(tx);
    return -ENOMEM;
  }
  s->n_tx++;
  s->jobs++;
  s->tx_bytes += len;
  gshm_list_add_tail(&s->txq, &tx->node);
  return 0;
}

/* ---- receiving --------------------------------------------------------- */

static void stream_fail(struct stream *s, int err, const char *why) {
  if (s->failed)
    return;
  s->failed = true;
  if (s->data_dst) { /* a data frame half read */
    s->data_dst = NULL;
    s->ops->data_done(s, s->data_tok, -ECONNRESET);
  }
  if (s->ops && s->ops->on_error)
    s->ops->on_error(s, err, why);
  gshmd__stream_close(s);
}

static void open_work(uv_work_t *w) {
  struct stream_rx *rx = w->data;
  struct stream *s = rx->s;

  gshm__name_thread_once("gshmd-pool");
  rx->err =
      gshmd__stream_unseal(s->mode_rx, s->key_rx, rx->n, &rx->hdr, rx->dst, rx->hdr.len, rx->tag);
}

static void open_done(uv_work_t *w, int status) {
  struct stream_rx *rx = w->data;
  struct stream *s = rx->s;

  s->jobs--;
  if (s->ops)
    s->ops->data_done(s, rx->tok, status ? -ECANCELED : rx->err);
  if (!status && rx->err && !s->failed)
    stream_fail(s, rx->err, rx->err == -EBADMSG ? "a data frame failed its authentication"
                                                : "out of memory checking a data frame");
  free(rx);
  maybe_closed(s);
}

/* A whole data frame is in: verify it on the pool. */
static void data_frame_in(struct stream *s) {
  struct stream_rx *rx = calloc(1, sizeof(*rx));
  void *tok = s->data_tok;
  uint8_t *dst = s->data_dst;

  s->data_dst = NULL;
  if (!rx) {
    s->ops->data_done(s, tok, -ENOMEM);
    stream_fail(s, -ENOMEM, "out of memory");
    return;
  }
  rx->s = s;
  rx->hdr = s->hdr;
  rx->dst = dst;
  rx->tok = tok;
  rx->n = s->n_rx - 1;
  memcpy(rx->tag, s->tag, STREAM_TAG);
  rx->work.data = rx;
  if (uv_queue_work(s->loop, &rx->work, open_work, open_done)) {
    free(rx);
    s->ops->data_done(s, tok, -ENOMEM);
    stream_fail(s, -ENOMEM, "out of memory");
    return;
  }
  s->jobs++;
}

/* A whole control frame is in: check it and hand it over. */
static void ctrl_frame_in(struct stream *s) {
  uint8_t *p = s->ctrl;
  size_t len = s->hdr.len;

  int e = s->mode_rx == STREAM_PLAIN
              ? 0
              : gshmd__stream_unseal(s->mode_rx, s->key_rx, s->n_rx - 1, &s->hdr, p, len, s->tag);

  if (e) {
    stream_fail(s, e, e == -EBADMSG ? "a control frame failed its authentication"
                                    : "out of memory checking a control frame");
    return;
  }
  s->ctrl = NULL; /* ours now: on_ctrl may close the stream, which frees s->ctrl */
  s->ops->on_ctrl(s, p, len);
  if (p != s->ctrl_small)
    free(p);
}

/* The header is in: where the payload goes. */
static int header_in(struct stream *s) {
  struct frame_hdr *h = &s->hdr;

  if (s->mode_rx != STREAM_PLAIN)
    s->n_rx++;
  if (h->kind == FRAME_CTRL) {
    size_t max = s->mode_rx == STREAM_PLAIN ? STREAM_PREHELLO_MAX : STREAM_CTRL_MAX;
    if (h->len > max || h->request_id || h->offset) {
      stream_fail(s, -EPROTO, s->mode_rx == STREAM_PLAIN ? "oversized or malformed frame before "
                                                        "the hello"
                                                      : "oversized control frame");
      return -EPROTO;
    }
    s->ctrl = h->len <= sizeof(s->ctrl_small) ? s->ctrl_small : malloc(h->len);
    if (!s->ctrl) {
      stream_fail(s, -ENOMEM, "out of memory");
      return -ENOMEM;
    }
    return 0;
  }
  if (h->kind != FRAME_DATA || s->mode_rx == STREAM_PLAIN || h->len == 0) {
    stream_fail(s, -EPROTO, "unexpected frame");
    return -EPROTO;
  }
  s->data_dst = s->ops->data_dest(s, h->request_id, h->offset, h->len, &s->data_tok);
  if (!s->data_dst) {
    stream_fail(s, -EPROTO, "data for no request");
    return -EPROTO;
  }
  return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  static uint8_t dropped[STREAM_DRAIN_MAX]; /* (the loop's thread only) */
  struct stream *s = h->data;
  (void)suggested;
  if (s->draining) {
    *buf = uv_buf_init((char *)dropped, sizeof(dropped));
    return;
  }
  switch (s->rx_step) {
  case RX_HDR:
    *buf = uv_buf_init((char *)&s->hdr + s->got, (unsigned)(sizeof(s->hdr) - s->got));
    break;
  case RX_PAYLOAD:
    *buf = uv_buf_init((char *)(s->hdr.kind == FRAME_DATA ? s->data_dst : s->ctrl) + s->got,
                       (unsigned)(s->hdr.len - s->got > (1u << 30) ? (1u << 30)
                                                                   : s->hdr.len - s->got));
    break;
  default:
    *buf = uv_buf_init((char *)s->tag + s->got, (unsigned)(STREAM_TAG - s->got));
    break;
  }
}

/* One step of the frame is complete: the next. */
static void step_done(struct stream *s) {
  s->got = 0;
  if (s->rx_step == RX_HDR) {
    if (header_in(s))
      return;
    s->rx_step = s->hdr.len ? RX_PAYLOAD : s->mode_rx != STREAM_PLAIN ? RX_TAG : RX_HDR;
    if (s->rx_step != RX_HDR)
      return;
  } else if (s->rx_step == RX_PAYLOAD && s->mode_rx != STREAM_PLAIN) {
    s->rx_step = RX_TAG;
    return;
  }
  s->rx_step = RX_HDR;
  if (s->hdr.kind == FRAME_DATA)
    data_frame_in(s);
  else
    ctrl_frame_in(s);
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf) {
  struct stream *s = h->data;
  size_t want;

  (void)buf;
  if (nread == UV_EOF) {
    stream_fail(s, -ECONNRESET, "closed by the peer");
    return;
  }
  if (nread < 0) {
    stream_fail(s, (int)nread, uv_strerror((int)nread));
    return;
  }
  if (s->failed || s->closing)
    return;
  if (s->draining) {
    if ((s->drained += (size_t)nread) > STREAM_DRAIN_MAX)
      stream_fail(s, -ECONNRESET, "it sent on after it was refused");
    return;
  }
  s->rx_ns = gshm__now_ns(CLOCK_MONOTONIC);
  s->got += (size_t)nread;
  want = s->rx_step == RX_HDR ? sizeof(s->hdr) : s->rx_step == RX_TAG ? STREAM_TAG : s->hdr.len;
  if (s->got == want)
    step_done(s);
  /* too many answers unsent: no more requests until they go out */
  if (s->ctrl_queued_max && s->ctrl_queued > s->ctrl_queued_max && !s->paused && !s->closing &&
      !s->failed) {
    s->paused = true;
    uv_read_stop(h);
  }
}

bool gshmd__stream_rx_stalled(const struct stream *s, int64_t now, int64_t limit_ns) {
  return s->data_dst && !s->failed && !s->closing && now - s->rx_ns > limit_ns;
}

/* ---- life -------------------------------------------------------------- */

int gshmd__stream_init(struct stream *s, uv_loop_t *loop, const struct stream_ops *ops,
                       void *owner) {
  int e;
  memset(s, 0, sizeof(*s));
  s->loop = loop;
  s->ops = ops;
  s->owner = owner;
  gshm_list_init(&s->txq);
  if ((e = uv_tcp_init(loop, &s->tcp)))
    return e;
  s->tcp.data = s;
  return 0;
}

int gshmd__stream_start(struct stream *s) {
  uv_tcp_nodelay(&s->tcp, 1);
  return uv_read_start((uv_stream_t *)&s->tcp, on_alloc, on_read);
}

void gshmd__stream_key_tx(struct stream *s, enum stream_mode mode, const uint8_t *key) {
  s->mode_tx = mode;
  memcpy(s->key_tx, key, STREAM_KEY);
}

void gshmd__stream_key_rx(struct stream *s, enum stream_mode mode, const uint8_t *key) {
  s->mode_rx = mode;
  memcpy(s->key_rx, key, STREAM_KEY);
}

static void on_tcp_closed(uv_handle_t *h) {
  struct stream *s = h->data;
  s->closed = true;
  sodium_memzero(s->key_tx, sizeof(s->key_tx));
  sodium_memzero(s->key_rx, sizeof(s->key_rx));
  maybe_closed(s);
}

void gshmd__stream_drain(struct stream *s) { s->draining = true; }

void gshmd__stream_close(struct stream *s) {
  if (s->closing)
    return;
  s->closing = true;
  if (s->data_dst) {
    s->data_dst = NULL;
    s->ops->data_done(s, s->data_tok, -ECONNRESET);
  }
  if (s->ctrl && s->ctrl != s->ctrl_small)
    free(s->ctrl);
  s->ctrl = NULL;
  while (!gshm_list_empty(&s->txq)) {
    struct stream_tx *tx = gshm_list_entry(s->txq.next, struct stream_tx, node);
    gshm_list_del(&tx->node);
    gshm_list_init(&tx->node);
    if (tx->ready)
      tx_end(tx, -ECONNRESET);
    else
      tx->dropped = true; /* its job ends it */
  }
  uv_read_stop((uv_stream_t *)&s->tcp);
  uv_close((uv_handle_t *)&s->tcp, on_tcp_closed);
}

int gshmd__stream_detach(struct stream *s, struct stream_state *out) {
  uv_os_fd_t fd;
  int dup_fd, flags;

  if (s->closing || s->failed)
    return -ENOTCONN;
  /* Every byte we queued is in the kernel, nothing of a frame is half
   * read (the stream reads exactly one frame step at a time), and no
   * crypto job runs: the connection's state is whole. */
  if (s->tcp.write_queue_size || s->jobs || s->rx_step != RX_HDR || s->got)
    return -EBUSY;
  if (uv_fileno((uv_handle_t *)&s->tcp, &fd))
    return -EBADF;
  if ((dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0)
    return -errno;
  /* libuv made the open file nonblocking; the new owner blocks */
  if ((flags = fcntl(dup_fd, F_GETFL)) < 0 || fcntl(dup_fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    int e = -errno;
    close(dup_fd);
    return e;
  }
  out->fd = dup_fd;
  out->mode_tx = s->mode_tx;
  out->mode_rx = s->mode_rx;
  memcpy(out->key_tx, s->key_tx, STREAM_KEY);
  memcpy(out->key_rx, s->key_rx, STREAM_KEY);
  out->n_tx = s->n_tx;
  out->n_rx = s->n_rx;
  gshmd__stream_close(s);
  return 0;
}
