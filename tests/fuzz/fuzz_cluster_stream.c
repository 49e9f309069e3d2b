/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for what gshmd reads on its cluster port, before and
 * after the hello: gshm's framed stream (daemon/cluster/stream.c) on a
 * socketpair, each control frame decoded as a cluster Msg as the link
 * layer does.
 *
 * Input: byte 0 picks the phase.  Even: before the hello: the rest is
 * written raw to the receiving stream, as any host on the network could.
 * Odd: after the hello: both ends are keyed alike (mode from byte 0) and
 * the rest is a list of records [u8 what][u16 len][len bytes] that the
 * sending end turns into authentic frames (what & 3: 0 control, 1 data
 * frame, 2 raw bytes on the wire, as a man in the middle could, 3 a key
 * change on the receiver), so that the checks past the tags are reached. */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster.pb-c.h"
#include "stream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct end {
  struct stream st;
  bool closed;
  uint8_t dst[1 << 16]; /* where data frames land */
  unsigned pending;     /* data frames handed out, not yet done */
};

static void on_ctrl(struct stream *s, const uint8_t *payload, size_t len) {
  Gshm__Cluster__Msg *m = gshm__cluster__msg__unpack(NULL, len, payload);
  (void)s;
  if (m) {
    if (m->message)
      (void)strlen(m->message);
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
}

static void *data_dest(struct stream *s, uint32_t rid, uint64_t offset, uint64_t len,
                       void **tok_out) {
  struct end *e = s->owner;
  (void)rid;
  if (offset > sizeof(e->dst) || len > sizeof(e->dst) - offset)
    return NULL;
  e->pending++;
  *tok_out = e;
  return e->dst + offset;
}

static void data_done(struct stream *s, void *tok, int err) {
  struct end *e = tok;
  (void)s, (void)err;
  e->pending--;
}

static void on_error(struct stream *s, int err, const char *why) { (void)s, (void)err, (void)why; }

static void on_closed(struct stream *s) { ((struct end *)s->owner)->closed = true; }

static const struct stream_ops ops = {on_ctrl, data_dest, data_done, on_error, on_closed};

static void send_records(struct end *tx, int raw_fd, const uint8_t *p, size_t n) {
  uint32_t rid = 0;
  while (n >= 3 && !tx->st.closing) {
    uint8_t what = p[0];
    size_t len = (size_t)p[1] | (size_t)p[2] << 8;
    p += 3;
    n -= 3;
    if (len > n)
      len = n;
    switch (what & 3) {
    case 0:
      gshmd__stream_send_ctrl(&tx->st, p, len);
      break;
    case 1:
      if (len)
        gshmd__stream_send_data(&tx->st, ++rid, (uint64_t)what << 8, p, len, NULL, NULL);
      break;
    case 2:
      if (write(raw_fd, p, len) < 0)
        return;
      break;
    default:
      break;
    }
    p += len;
    n -= len;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const uint8_t k1[STREAM_KEY] = {1}, k2[STREAM_KEY] = {2};
  static struct end rx, tx;
  uv_loop_t loop;
  int sv[2];

  signal(SIGPIPE, SIG_IGN); /* as gshmd: a closed peer is an error, not a signal */
  if (size < 1 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return 0;
  uv_loop_init(&loop);
  memset(&rx.closed, 0, sizeof(rx) - offsetof(struct end, closed));
  memset(&tx.closed, 0, sizeof(tx) - offsetof(struct end, closed));
  gshmd__stream_init(&rx.st, &loop, &ops, &rx);
  gshmd__stream_init(&tx.st, &loop, &ops, &tx);
  uv_tcp_open(&rx.st.tcp, sv[0]);
  uv_tcp_open(&tx.st.tcp, sv[1]);
  gshmd__stream_start(&rx.st);
  if (data[0] % 2 == 0) {
    if (write(sv[1], data + 1, size - 1) < 0)
      goto out;
  } else {
    enum stream_mode mode = (enum stream_mode)(1 + (data[0] >> 1) % 4);
    if ((mode == STREAM_AES256GCM || mode == STREAM_GMAC) && !crypto_aead_aes256gcm_is_available())
      mode = STREAM_CHACHA20;
    gshmd__stream_key_tx(&tx.st, mode, k1);
    gshmd__stream_key_rx(&rx.st, mode, (data[0] & 0x80) ? k2 : k1);
    send_records(&tx, sv[1], data + 1, size - 1);
  }
  for (int i = 0; i < 64 && uv_run(&loop, UV_RUN_NOWAIT); i++)
    ;
out:
  gshmd__stream_close(&rx.st);
  gshmd__stream_close(&tx.st);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return 0;
}
