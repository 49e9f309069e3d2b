/* SPDX-License-Identifier: Apache-2.0 */
/* A data lane's blocking I/O on its own thread (lane.c): whole writes
 * and reads, and a frame tagged or checked piece by piece as it goes
 * through the socket (AES-GMAC with ghash.h's GHASH: the piece is hashed
 * while it sits in the core's cache, beside the copy); and, for the
 * loop's sweep, whether a frame being read has stopped midway. */
#ifndef GSHMD_CLUSTER_LANE_IO_H
#define GSHMD_CLUSTER_LANE_IO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "stream.h"

/* A frame's payload goes through the socket and its tag in pieces of
 * this many bytes (a multiple of 16, GHASH's block) where the lane's
 * thread tags or checks it: each piece is hashed while it sits in the
 * core's L2 (2 MiB on the lent machines' Xeons) beside the copy. */
#define LANE_PIECE ((size_t)256 << 10)

/* Writes all of iov (n entries; changed as it goes) to the blocking
 * socket fd.  Returns 0 or a negative errno from sendmsg. */
int gshmd__lane_write_all(int fd, struct iovec *iov, int n);

/* Reads exactly len bytes into buf.  Returns 0, -ECONNRESET at the end
 * of the connection, or a negative errno from recv. */
int gshmd__lane_read_all(int fd, void *buf, size_t len);

/* Waits (without limit) for the first bytes of the next frame, stores
 * when they came (CLOCK_MONOTONIC ns, a relaxed store) in *began_ns, and
 * reads the rest of its len bytes into buf: from then on the loop's
 * sweep sees a frame in progress (lane.c).  Returns as
 * gshmd__lane_read_all. */
int gshmd__lane_read_begin(int fd, void *buf, size_t len, atomic_int_fast64_t *began_ns);

/* The loop's side (its sweep): why the frame a lane's thread is reading
 * from fd, begun at *began_ns (0: none; an idle lane waits without
 * limit), has stopped midway, or NULL: it began over limit_ns
 * (cluster.request_timeout_ms) before now (CLOCK_MONOTONIC ns) and fd
 * received nothing for as long.  The text is a static buffer (loop
 * only), valid until the next call.
 * The thread blocks in one MSG_WAITALL recv of a whole piece or frame
 * meanwhile, so only the kernel knows whether bytes still come
 * (TCP_INFO's last_data_recv); where it cannot say, the frame's age
 * alone decides. */
const char *gshmd__lane_rx_overdue(int fd, const atomic_int_fast64_t *began_ns, int64_t now,
                                   int64_t limit_ns);

/* Writes frame n (hdr, its hdr->len > 0 payload bytes at src, the tag)
 * to fd, tagging each LANE_PIECE of the payload with key (STREAM_KEY
 * bytes) just after it went (from the caches its copy into the socket
 * left it in); tag receives the tag.  The bytes at src must not change
 * meanwhile, or the tag fails at the peer.  Only where
 * gshmd__frame_mac_inline(the link's mode).  Returns 0, -ENOMEM
 * (libcrypto) or a negative errno from the socket. */
int gshmd__lane_write_tagged(int fd, const uint8_t *key, uint64_t n, const struct frame_hdr *hdr,
                             const uint8_t *src, uint8_t tag[STREAM_TAG]);

/* Reads frame n's payload (h->len bytes, its header already read) into
 * dst, then its tag, checking each piece with key as it lands.  Returns
 * 0, -EBADMSG (the tag does not match: nothing of the frame may be
 * used), -ENOMEM (libcrypto) or a negative errno from the socket. */
int gshmd__lane_read_checked(int fd, const uint8_t *key, uint64_t n, const struct frame_hdr *h,
                             uint8_t *dst);

/* Whether a lane's thread protects frames of mode itself, piece by
 * piece as they go through the socket (gshmd__lane_write_inline,
 * gshmd__lane_read_inline): AES-GMAC with ghash.h's GHASH, or an
 * encrypting mode through libcrypto; else the loop has them sealed and
 * checked whole on libuv's pool.  Measured in docs/PERFORMANCE.md
 * "Encrypted frames sealed by the lanes". */
bool gshmd__lane_inline(enum stream_mode mode);

/* Writes frame n as gshmd__lane_write_tagged does, for any mode where
 * gshmd__lane_inline(mode): an encrypting mode's pieces are encrypted
 * into a buffer of LANE_PIECE bytes (malloc'ed for the frame, in the
 * core's cache while it is written) and sent from there; src is never
 * written.  tag receives the tag.  Returns 0, -ENOMEM (malloc or
 * libcrypto) or a negative errno from the socket. */
int gshmd__lane_write_inline(int fd, enum stream_mode mode, const uint8_t *key, uint64_t n,
                             const struct frame_hdr *hdr, const uint8_t *src,
                             uint8_t tag[STREAM_TAG]);

/* Reads frame n's payload into dst and its tag, as
 * gshmd__lane_read_checked does, for any mode where
 * gshmd__lane_inline(mode): an encrypting mode's pieces are decrypted in
 * place as each lands (dst holds plaintext of an unchecked frame until
 * the tag is read: only a landing nobody reads before the frame is done).
 * Returns 0, -EBADMSG (the tag does not match: nothing of the frame may
 * be used), -ENOMEM (libcrypto) or a negative errno from the socket. */
int gshmd__lane_read_inline(int fd, enum stream_mode mode, const uint8_t *key, uint64_t n,
                            const struct frame_hdr *h, uint8_t *dst);

#endif
