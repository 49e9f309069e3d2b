/* SPDX-License-Identifier: Apache-2.0 */
/* gshm's own framed TCP connection between two gshmd, on the cluster
 * port: the hello runs on it, then every frame is authenticated with
 * keys derived from the hello (libsodium), and encrypted when the
 * cluster asks for it.  Control frames carry one cluster Msg; data frames
 * carry the bytes answering a Read or a Stage, received straight into the
 * request's destination and verified (and decrypted) there on libuv's
 * thread pool, several frames at once, so that one core does not bound a
 * pull.
 *
 * Frame: struct frame_hdr (24 bytes, little-endian, authenticated as
 * associated data), len payload bytes, then STREAM_TAG bytes of tag once
 * keyed.  Nonce: the frame's number in its direction (64 bits), so that
 * frames cannot be replayed, reordered or moved between directions. */
#ifndef GSHMD_CLUSTER_STREAM_H
#define GSHMD_CLUSTER_STREAM_H

#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <openssl/types.h>
#include <uv.h>

#include "ghash.h"
#include "list.h"

#define STREAM_TAG 16
#define STREAM_KEY 32
#define STREAM_PREHELLO_MAX 1024 /* largest frame before the keys: the hello's */
#define STREAM_CTRL_MAX 65536    /* largest control frame after the hello */
#define STREAM_CTRL_COST 512     /* what a queued control frame costs beyond its payload */
#define STREAM_DRAIN_MAX 65536   /* what a refused connection may send on (gshmd__stream_drain) */

enum frame_kind { FRAME_CTRL = 1, FRAME_DATA = 2 };

struct frame_hdr {
  uint32_t len;          /* payload bytes */
  uint8_t kind;          /* enum frame_kind */
  uint8_t reserved[3];
  uint32_t request_id;   /* DATA: the request it answers */
  uint32_t reserved2;
  uint64_t offset;       /* DATA: in the segment */
};

/* The header of the data frame of len bytes (<= UINT32_MAX) at offset
 * answering request_id. */
static inline struct frame_hdr gshmd__frame_data(uint32_t request_id, uint64_t offset,
                                                 uint64_t len) {
  return (struct frame_hdr){.len = (uint32_t)len, .kind = FRAME_DATA,
                            .request_id = request_id, .offset = offset};
}

/* How frames are protected once keyed. */
enum stream_mode {
  STREAM_PLAIN,          /* before the hello's end: nothing */
  STREAM_AUTH,           /* Poly1305 tag over header and payload, one-time key from ChaCha20 */
  STREAM_AES256GCM,      /* encrypted: AES-256-GCM (both CPUs have AES-NI) */
  STREAM_CHACHA20,       /* encrypted: ChaCha20-Poly1305-IETF */
  STREAM_GMAC,           /* AES-GMAC tag over header and payload (both CPUs have AES-NI) */
};

struct stream;

/* What the stream calls (its owner, the link). */
struct stream_ops {
  /* A control frame's payload (verified, decrypted). */
  void (*on_ctrl)(struct stream *s, const uint8_t *payload, size_t len);
  /* A data frame's header: where its len bytes go.  NULL refuses it (the
   * stream fails).  *tok_out is handed back to data_done. */
  void *(*data_dest)(struct stream *s, uint32_t request_id, uint64_t offset, uint64_t len,
                     void **tok_out);
  /* A data frame's bytes are in place and verified (err 0), or not
   * (-EBADMSG wrong tag, -ECONNRESET the stream ended first). */
  void (*data_done)(struct stream *s, void *tok, int err);
  /* The stream failed or the peer closed it (once; err < 0). */
  void (*on_error)(struct stream *s, int err, const char *why);
  /* The TCP handle is closed and no job runs: the owner may free s. */
  void (*on_closed)(struct stream *s);
};

struct stream_tx;

struct stream {
  uv_tcp_t tcp;
  uv_loop_t *loop;
  const struct stream_ops *ops;
  void *owner;
  enum stream_mode mode_tx, mode_rx;
  uint8_t key_tx[STREAM_KEY], key_rx[STREAM_KEY];
  uint64_t n_tx, n_rx;          /* frames so far, each direction (the nonces) */
  /* receiving */
  int rx_step;                  /* header, payload, tag */
  struct frame_hdr hdr;
  size_t got;
  uint8_t *ctrl;                /* control payload (pre-hello: ctrl_small) */
  uint8_t ctrl_small[STREAM_PREHELLO_MAX];
  uint8_t *data_dst;
  void *data_tok;
  uint8_t tag[STREAM_TAG];
  int64_t rx_ns;                /* CLOCK_MONOTONIC: when bytes last came (0: never) */
  /* sending: frames in nonce order; each goes when its crypto is done */
  struct gshm_list txq;
  unsigned jobs;                /* crypto jobs on the thread pool */
  size_t tx_bytes;              /* queued, not yet written */
  /* Control frames queued and not yet written (with STREAM_CTRL_COST
   * each for its record), and the bound past which the stream stops
   * reading until they are written (0: none; the serving side of a link
   * sets it, so that a peer that sends requests and never reads their
   * answers cannot queue them without bound). */
  size_t ctrl_queued, ctrl_queued_max;
  bool paused, failed, closing, closed;
  bool draining;                /* gshmd__stream_drain: what comes is dropped */
  size_t drained;               /* ... so many bytes so far */
  unsigned corked;              /* gshmd__stream_cork depth */
};

/* Sets up s on loop (uv_tcp_init); the caller connects or accepts on
 * s->tcp and then calls gshmd__stream_start.  Returns 0 or a negative
 * errno from libuv. */
int gshmd__stream_init(struct stream *s, uv_loop_t *loop, const struct stream_ops *ops,
                       void *owner);
/* Starts reading.  Returns 0 or a negative errno. */
int gshmd__stream_start(struct stream *s);
/* From the next frame we send (tx) or receive (rx) on, frames in that
 * direction are protected with key and mode. */
void gshmd__stream_key_tx(struct stream *s, enum stream_mode mode, const uint8_t *key);
void gshmd__stream_key_rx(struct stream *s, enum stream_mode mode, const uint8_t *key);
/* Queues one control frame (len <= STREAM_CTRL_MAX, <= STREAM_PREHELLO_MAX
 * before the keys).  Returns 0, -ENOTCONN, -EMSGSIZE or -ENOMEM. */
int gshmd__stream_send_ctrl(struct stream *s, const uint8_t *payload, size_t len);
/* Queues one data frame of [src, src + len) answering request_id (keyed
 * streams only).  src must stay valid and unchanged until done(arg, err)
 * runs (once: after the write, or when the stream fails).  Returns 0 or
 * a negative errno (done not called). */
int gshmd__stream_send_data(struct stream *s, uint32_t request_id, uint64_t offset,
                            const void *src, uint64_t len, void (*done)(void *arg, int err),
                            void *arg);
/* Parses nothing more that comes on s (the frames it queued still go),
 * so that its peer may read a refusal before the stream closes: what the
 * peer sends meanwhile is read in large pieces and dropped, and past
 * STREAM_DRAIN_MAX bytes the stream fails at once (on_error, -ECONNRESET),
 * as at its EOF.  Idempotent. */
void gshmd__stream_drain(struct stream *s);
/* on: the frames queued from now on wait in the kernel (TCP_CORK) until
 * the matching call with !on (calls nest), which sends them in as few
 * TCP segments as they fit: for a burst of small control frames (a
 * pull's Reads), each of which, written alone, was a segment and a
 * wake-up of the peer's loop (docs/PERFORMANCE.md "Session 35").  Only a
 * hint: where the socket refuses it, each frame goes as before. */
void gshmd__stream_cork(struct stream *s, bool on);
/* Ends the stream: reading stops, queued frames are dropped (their done
 * runs with -ECONNRESET), the handle closes; on_closed runs once every
 * job has finished too.  Idempotent. */
void gshmd__stream_close(struct stream *s);
/* Whether s is amid a data frame (its request, off the link's requests,
 * waits only for these bytes) and has received nothing for longer than
 * limit_ns at now (CLOCK_MONOTONIC ns): the peer stopped sending it
 * midway. */
bool gshmd__stream_rx_stalled(const struct stream *s, int64_t now, int64_t limit_ns);
/* Protects one frame with mode and key (STREAM_KEY bytes) as frame
 * number n of its direction: tag over hdr and the len bytes of in; out
 * (len bytes, may be in; unused unless the mode encrypts) gets the
 * ciphertext when the mode encrypts.  seal.c: libcrypto computes it,
 * libsodium where libcrypto lacks the algorithm, the same bytes either
 * way.  Returns 0 or -ENOMEM (libcrypto could not; nothing to send). */
int gshmd__stream_seal(enum stream_mode mode, const uint8_t *key, uint64_t n,
                       const struct frame_hdr *hdr, const uint8_t *in, uint8_t *out, size_t len,
                       uint8_t tag[STREAM_TAG]);
/* Checks frame n's tag over hdr and the len bytes of buf, decrypting buf
 * in place when the mode encrypts.  Returns 0, -EBADMSG (the frame is
 * not what the peer sealed: tampered, replayed or of another key) or
 * -ENOMEM (libcrypto could not check it). */
int gshmd__stream_unseal(enum stream_mode mode, const uint8_t *key, uint64_t n,
                         const struct frame_hdr *hdr, uint8_t *buf, size_t len,
                         const uint8_t tag[STREAM_TAG]);
/* A frame's AES-GMAC computed as its bytes go by (a lane's thread tags
 * and checks each piece while it is in cache): begin, update with the
 * payload in order (every piece but the last a multiple of 16 bytes),
 * end.  The same tag as gshmd__stream_seal's.  Only where
 * gshmd__frame_mac_inline(mode). */
struct frame_mac {
  struct ghash_key key;       /* secret; end or abort wipes the whole struct */
  uint8_t y[16], ekj0[16], hdr_ct[sizeof(struct frame_hdr)];
  uint64_t len;
  bool broken;                /* a piece not a multiple of 16 came before another */
};
/* Whether frames of mode are tagged this way here: AES-GMAC with
 * ghash.h's GHASH (its CPU check, libcrypto's AES). */
bool gshmd__frame_mac_inline(enum stream_mode mode);
/* Starts frame n's tag over hdr with key (STREAM_KEY bytes).  Returns 0
 * or -ENOMEM (libcrypto could not; m holds nothing to wipe). */
int gshmd__frame_mac_begin(struct frame_mac *m, const uint8_t *key, uint64_t n,
                           const struct frame_hdr *hdr);
/* Adds the next len bytes of the payload.  Every piece but the last must
 * be a multiple of 16 bytes: otherwise end gives a random tag (the frame
 * fails its check; never a tag of other bytes). */
void gshmd__frame_mac_update(struct frame_mac *m, const uint8_t *p, size_t len);
/* Writes the tag, then wipes m and the calling thread's stack below it
 * (sodium_stackzero: the hash key's powers spilled there). */
void gshmd__frame_mac_end(struct frame_mac *m, uint8_t tag[STREAM_TAG]);
/* Wipes m and the stack, without a tag (a frame given up midway). */
void gshmd__frame_mac_abort(struct frame_mac *m);

/* A frame of an encrypting mode (AES-256-GCM, ChaCha20-Poly1305) sealed
 * or opened as its bytes go by, through libcrypto (a lane's thread
 * encrypts each piece into a buffer in its cache and writes it from
 * there, or decrypts each piece where it landed while it is in cache):
 * begin, update with the payload in order, end.  The same bytes and tag
 * as gshmd__stream_seal's, so either side may seal or open a frame whole
 * or in pieces.  Opening writes the plaintext before the tag is known:
 * only into memory nobody reads until end says 0. */
struct frame_aead {
  EVP_CIPHER_CTX *c;          /* libcrypto's; end or abort frees (and wipes) it */
  bool enc;
};
/* Whether frames of mode are sealed and opened this way here: an
 * encrypting mode, with libcrypto in use and holding its algorithms. */
bool gshmd__frame_aead_inline(enum stream_mode mode);
/* Starts sealing (enc) or opening frame n, hdr its associated data, with
 * key (STREAM_KEY bytes).  Returns 0 or -ENOMEM (libcrypto could not; a
 * holds nothing). */
int gshmd__frame_aead_begin(struct frame_aead *a, enum stream_mode mode, bool enc,
                            const uint8_t *key, uint64_t n, const struct frame_hdr *hdr);
/* The next len bytes of the payload, from in into out (out may be in).
 * Returns 0 or -ENOMEM (a still needs end or abort). */
int gshmd__frame_aead_update(struct frame_aead *a, const uint8_t *in, uint8_t *out, size_t len);
/* Sealing: writes the tag; opening: checks it.  Frees a's context.
 * Returns 0, -EBADMSG (opening: the frame is not what the peer sealed;
 * nothing of it may be used) or -ENOMEM. */
int gshmd__frame_aead_end(struct frame_aead *a, uint8_t tag[STREAM_TAG]);
/* Frees a's context, without a tag (a frame given up midway). */
void gshmd__frame_aead_abort(struct frame_aead *a);

/* Tests only: false has libsodium compute every mode (seal.c). */
extern bool gshmd__seal_openssl;
/* Tests only: false has libcrypto compute AES-GMAC whole, not with
 * ghash.h's GHASH (seal.c). */
extern bool gshmd__seal_wide_ghash;
/* Whether libcrypto has every algorithm the modes use (fetched once,
 * thread-safe). */
bool gshmd__seal_openssl_ready(void);

/* A keyed connection taken over from libuv (gshmd__stream_detach). */
struct stream_state {
  int fd;                       /* blocking, close-on-exec; the taker closes it */
  enum stream_mode mode_tx, mode_rx;
  uint8_t key_tx[STREAM_KEY], key_rx[STREAM_KEY];
  uint64_t n_tx, n_rx;          /* the next frame numbers */
};
/* Hands s's connection to a thread of its own (lane.c): a duplicate of
 * its fd, made blocking, with the keys and frame numbers of both
 * directions go to *out (the caller owns out->fd and wipes the keys);
 * then s closes as gshmd__stream_close does (on_closed follows).  Only
 * between frames: -EBUSY while bytes we queued are not all in the kernel,
 * a frame is half read, or a crypto job runs; -ENOTCONN on a failed or
 * closing stream; -EBADF or an fcntl errno (s stays open). */
int gshmd__stream_detach(struct stream *s, struct stream_state *out);

/* The protection of a stream both sides can use: encrypt asks for
 * encryption; aes_both: both sides' CPUs do AES-256-GCM in hardware;
 * gmac_both: both hellos said CAP_GMAC (AES-NI and cluster.mac = auto),
 * so an unencrypted stream is authenticated with AES-GMAC, else with
 * Poly1305.  Returns the mode; never STREAM_PLAIN. */
enum stream_mode gshmd__stream_mode(bool encrypt, bool aes_both, bool gmac_both);
/* Whether frames of mode m carry ciphertext (a sender needs a buffer of
 * the payload's length for it). */
static inline bool gshmd__stream_encrypts(enum stream_mode m) {
  return m == STREAM_AES256GCM || m == STREAM_CHACHA20;
}
/* The name of a mode, for logs and results. */
const char *gshmd__stream_mode_name(enum stream_mode m);

#endif
