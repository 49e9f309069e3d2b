/* SPDX-License-Identifier: Apache-2.0 */
/* A data lane's blocking I/O, on its thread, and whether a frame being
 * read has stopped midway (lane_io.h). */
#include "lane_io.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "link.h"
#include "util.h"

/* gshmd__lane_write_all with more sendmsg flags (MSG_MORE). */
static int write_iov(int fd, struct iovec *iov, int n, int flags) {
  while (n > 0) {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | flags);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

int gshmd__lane_write_all(int fd, struct iovec *iov, int n) { return write_iov(fd, iov, n, 0); }

/* The k bytes at p, the frame's payload from offset off (the header
 * first when off is 0), with MSG_MORE where they end the payload (its
 * tag follows at once). */
static int write_piece(int fd, const struct frame_hdr *hdr, size_t off, const uint8_t *p,
                       size_t k) {
  struct iovec iov[2];
  int c = 0;

  if (off == 0)
    iov[c++] = (struct iovec){(void *)hdr, sizeof(*hdr)};
  iov[c++] = (struct iovec){(void *)p, k};
  return write_iov(fd, iov, c, off + k == hdr->len ? MSG_MORE : 0);
}

static int write_tag(int fd, uint8_t tag[STREAM_TAG]) {
  struct iovec iov = {tag, STREAM_TAG};
  return write_iov(fd, &iov, 1, 0);
}

int gshmd__lane_read_all(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len) {
    ssize_t r = recv(fd, p, len, MSG_WAITALL);
    if (r == 0)
      return -ECONNRESET;
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

int gshmd__lane_read_begin(int fd, void *buf, size_t len, atomic_int_fast64_t *began_ns) {
  ssize_t r;

  /* not MSG_WAITALL: a peer that sends part of a header and stops must
   * show a frame in progress too (the whole header nearly always comes
   * in this one call) */
  while ((r = recv(fd, buf, len, 0)) < 0 && errno == EINTR)
    ;
  if (r <= 0)
    return r == 0 ? -ECONNRESET : -errno;
  atomic_store_explicit(began_ns, gshm__now_ns(CLOCK_MONOTONIC), memory_order_relaxed);
  return gshmd__lane_read_all(fd, (uint8_t *)buf + r, len - (size_t)r);
}

const char *gshmd__lane_rx_overdue(int fd, const atomic_int_fast64_t *began_ns, int64_t now,
                                   int64_t limit_ns) {
  static char why[128]; /* (the loop's only) */
  int64_t began = atomic_load_explicit(began_ns, memory_order_relaxed);
  struct tcp_info ti;
  socklen_t len = sizeof(ti);

  if (!began || now - began <= limit_ns)
    return NULL;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
      len >= offsetof(struct tcp_info, tcpi_last_data_recv) + sizeof(ti.tcpi_last_data_recv) &&
      (int64_t)ti.tcpi_last_data_recv * 1000000 <= limit_ns)
    return NULL; /* bytes still come */
  snprintf(why, sizeof(why),
           "the peer stopped sending a data frame midway on a data lane (nothing for %" PRId64
           " ms)",
           limit_ns / 1000000);
  return why;
}

int gshmd__lane_write_tagged(int fd, const uint8_t *key, uint64_t n, const struct frame_hdr *hdr,
                             const uint8_t *src, uint8_t tag[STREAM_TAG]) {
  struct frame_mac m;
  size_t len = hdr->len, off = 0;
  int e;

  if ((e = gshmd__frame_mac_begin(&m, key, n, hdr)))
    return e;
  for (;;) {
    size_t k = len - off < LANE_PIECE ? len - off : LANE_PIECE;
    /* the piece goes first, then is hashed: the copy into the socket
     * reads it from memory and leaves it in the core's caches, where
     * hashing it costs a third of hashing it cold (perf on the lent
     * H200 machine: the serving lanes' GHASH 8.9% of all CPU, the
     * pulling lanes', on bytes just received, 3.2%) */
    if ((e = write_piece(fd, hdr, off, src + off, k))) {
      gshmd__frame_mac_abort(&m);
      return e;
    }
    gshmd__frame_mac_update(&m, src + off, k);
    if ((off += k) == len) {
      gshmd__frame_mac_end(&m, tag);
      return write_tag(fd, tag);
    }
  }
}

int gshmd__lane_read_checked(int fd, const uint8_t *key, uint64_t n, const struct frame_hdr *h,
                             uint8_t *dst) {
  uint8_t tag[STREAM_TAG], want[STREAM_TAG];
  struct frame_mac m;
  int e;

  if ((e = gshmd__frame_mac_begin(&m, key, n, h)))
    return e;
  for (size_t off = 0, k; off < h->len; off += k) {
    k = h->len - off < LANE_PIECE ? h->len - off : LANE_PIECE;
    if ((e = gshmd__lane_read_all(fd, dst + off, k))) {
      gshmd__frame_mac_abort(&m);
      return e;
    }
    gshmd__frame_mac_update(&m, dst + off, k);
  }
  gshmd__frame_mac_end(&m, want);
  if ((e = gshmd__lane_read_all(fd, tag, sizeof(tag))))
    return e;
  return crypto_verify_16(want, tag) == 0 ? 0 : -EBADMSG;
}

/* gshmd__lane_write_inline for an encrypting mode: each piece encrypted
 * into buf (LANE_PIECE bytes, in the core's cache) and written from it. */
static int write_sealed(int fd, enum stream_mode mode, const uint8_t *key, uint64_t n,
                        const struct frame_hdr *hdr, const uint8_t *src, uint8_t *buf,
                        uint8_t tag[STREAM_TAG]) {
  struct frame_aead a;
  size_t len = hdr->len, off = 0;
  int e;

  if ((e = gshmd__frame_aead_begin(&a, mode, true, key, n, hdr)))
    return e;
  for (size_t k; off < len; off += k) {
    k = len - off < LANE_PIECE ? len - off : LANE_PIECE;
    if ((e = gshmd__frame_aead_update(&a, src + off, buf, k)) ||
        (e = write_piece(fd, hdr, off, buf, k))) {
      gshmd__frame_aead_abort(&a);
      return e;
    }
  }
  if ((e = gshmd__frame_aead_end(&a, tag)))
    return e;
  return write_tag(fd, tag);
}

bool gshmd__lane_inline(enum stream_mode mode) {
  return gshmd__frame_mac_inline(mode) || gshmd__frame_aead_inline(mode);
}

int gshmd__lane_write_inline(int fd, enum stream_mode mode, const uint8_t *key, uint64_t n,
                             const struct frame_hdr *hdr, const uint8_t *src,
                             uint8_t tag[STREAM_TAG]) {
  uint8_t *buf;
  int e;

  if (!gshmd__stream_encrypts(mode))
    return gshmd__lane_write_tagged(fd, key, n, hdr, src, tag);
  if (!(buf = malloc(LANE_PIECE)))
    return -ENOMEM;
  e = write_sealed(fd, mode, key, n, hdr, src, buf, tag);
  free(buf);
  return e;
}

int gshmd__lane_read_inline(int fd, enum stream_mode mode, const uint8_t *key, uint64_t n,
                            const struct frame_hdr *h, uint8_t *dst) {
  uint8_t tag[STREAM_TAG];
  struct frame_aead a;
  int e;

  if (!gshmd__stream_encrypts(mode))
    return gshmd__lane_read_checked(fd, key, n, h, dst);
  if ((e = gshmd__frame_aead_begin(&a, mode, false, key, n, h)))
    return e;
  for (size_t off = 0, k; off < h->len; off += k) {
    k = h->len - off < LANE_PIECE ? h->len - off : LANE_PIECE;
    if ((e = gshmd__lane_read_all(fd, dst + off, k)) ||
        (e = gshmd__frame_aead_update(&a, dst + off, dst + off, k))) {
      gshmd__frame_aead_abort(&a);
      return e;
    }
  }
  if ((e = gshmd__lane_read_all(fd, tag, sizeof(tag)))) {
    gshmd__frame_aead_abort(&a);
    return e;
  }
  return gshmd__frame_aead_end(&a, tag);
}
