/* SPDX-License-Identifier: Apache-2.0 */
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

int gshm__wire_pack(uint16_t type, uint32_t request_id, const ProtobufCMessage *msg, void *buf,
                    size_t cap, size_t *len_out) {
  struct gshm_wire_header h;
  size_t body = msg ? protobuf_c_message_get_packed_size(msg) : 0;
  size_t total = GSHM_WIRE_HEADER_SIZE + body;

  if (total > cap || total > GSHM_WIRE_MAX_PACKET)
    return -EMSGSIZE;
  h.magic = GSHM_WIRE_MAGIC;
  h.major = GSHM_PROTO_MAJOR;
  h.minor = GSHM_PROTO_MINOR;
  h.type = type;
  h.request_id = request_id;
  h.length = (uint32_t)body;
  memcpy(buf, &h, sizeof(h));
  if (msg)
    protobuf_c_message_pack(msg, (uint8_t *)buf + GSHM_WIRE_HEADER_SIZE);
  *len_out = total;
  return 0;
}

int gshm__wire_sendmsg(int sock, const void *pkt, size_t len, int fd) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct iovec iov = {.iov_base = (void *)pkt, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  ssize_t n;

  if (fd >= 0) {
    struct cmsghdr *c;
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  do
    n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  return (size_t)n == len ? 0 : -EIO;
}

int gshm__wire_send(int sock, uint16_t type, uint32_t request_id, const ProtobufCMessage *msg,
                    int fd) {
  uint8_t small[4096];
  uint8_t *buf = small;
  size_t need = GSHM_WIRE_HEADER_SIZE + (msg ? protobuf_c_message_get_packed_size(msg) : 0);
  size_t len;
  int r;

  if (need > GSHM_WIRE_MAX_PACKET)
    return -EMSGSIZE;
  if (need > sizeof(small) && !(buf = malloc(need)))
    return -ENOMEM;
  r = gshm__wire_pack(type, request_id, msg, buf, need, &len);
  if (r == 0)
    r = gshm__wire_sendmsg(sock, buf, len, fd);
  if (buf != small)
    free(buf);
  return r;
}

ssize_t gshm__wire_recv(int sock, void *buf, size_t cap, int *fds, int max_fds, int *nfds_out,
                        int flags) {
  /* Room for the most fds the kernel will put in one message, so that
   * every fd a client sends arrives here and gets closed, rather than
   * depending on what MSG_CTRUNC left behind. */
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * GSHM_WIRE_MAX_FDS)];
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                      .msg_controllen = sizeof(ctl.buf)};
  ssize_t n;
  int nfds = 0;

  do
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;

  gshm__cmsg_take_fds(&mh, fds, max_fds, &nfds);
  *nfds_out = nfds;
  if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
    return -EMSGSIZE;
  return n;
}

int gshm__wire_parse_header(const void *pkt, size_t len, struct gshm_wire_header *hdr_out) {
  struct gshm_wire_header h;

  if (len < GSHM_WIRE_HEADER_SIZE)
    return -EPROTO;
  memcpy(&h, pkt, sizeof(h));
  if (h.magic != GSHM_WIRE_MAGIC || (size_t)h.length != len - GSHM_WIRE_HEADER_SIZE)
    return -EBADMSG;
  *hdr_out = h;
  return 0;
}

/* One table for both directions; the first row for an errno wins when
 * mapping errno -> status. */
#define GSHM_STATUS_MAP(X)                           \
  X(GSHM__STATUS__STATUS_OK, 0)                      \
  X(GSHM__STATUS__STATUS_INVALID_ARGUMENT, EINVAL)   \
  X(GSHM__STATUS__STATUS_NOT_FOUND, ENOENT)          \
  X(GSHM__STATUS__STATUS_EXISTS, EEXIST)             \
  X(GSHM__STATUS__STATUS_PERMISSION_DENIED, EACCES)  \
  X(GSHM__STATUS__STATUS_NO_MEMORY, ENOMEM)          \
  X(GSHM__STATUS__STATUS_QUOTA_EXCEEDED, EDQUOT)     \
  X(GSHM__STATUS__STATUS_NOT_SUPPORTED, ENOTSUP)     \
  X(GSHM__STATUS__STATUS_PROTOCOL_ERROR, EPROTO)     \
  X(GSHM__STATUS__STATUS_VERSION_MISMATCH, EPROTONOSUPPORT) \
  X(GSHM__STATUS__STATUS_NAME_TOO_LONG, ENAMETOOLONG) \
  X(GSHM__STATUS__STATUS_TOO_BIG, EFBIG)             \
  X(GSHM__STATUS__STATUS_LIMIT, EMFILE)              \
  X(GSHM__STATUS__STATUS_IO_ERROR, EIO)              \
  X(GSHM__STATUS__STATUS_NO_DEVICE, ENODEV)          \
  X(GSHM__STATUS__STATUS_STALE, ESTALE)              \
  X(GSHM__STATUS__STATUS_NOT_PERMITTED, EPERM)       \
  X(GSHM__STATUS__STATUS_BUSY, EBUSY)                \
  X(GSHM__STATUS__STATUS_PEER_LOST, ECONNRESET)      \
  X(GSHM__STATUS__STATUS_TIMED_OUT, ETIMEDOUT)      \
  X(GSHM__STATUS__STATUS_TOO_MANY, E2BIG)            \
  X(GSHM__STATUS__STATUS_CANCELED, ECANCELED)        \
  X(GSHM__STATUS__STATUS_INTERNAL, EREMOTEIO)

int gshm__status_to_errno(int status) {
  switch (status) {
#define GSHM_S2E(s, e) \
  case s:              \
    return -(e);
    GSHM_STATUS_MAP(GSHM_S2E)
#undef GSHM_S2E
  default:
    return -EPROTO; /* unspecified or unknown: the peer broke the protocol */
    /* (STATUS_INTERNAL, any errno without a status of its own, comes back
     * as -EREMOTEIO: it was -EPROTO, "protocol error", for a daemon that
     * spoke the protocol well and failed, e.g. -EHOSTUNREACH in a pull) */
  }
}

int gshm__errno_to_status(int err) {
  if (err < 0)
    err = -err;
  switch (err) {
#define GSHM_E2S(s, e) \
  case e:              \
    return s;
    GSHM_STATUS_MAP(GSHM_E2S)
#undef GSHM_E2S
  case EAGAIN:
  case ENFILE:
    return GSHM__STATUS__STATUS_LIMIT;
  case EMSGSIZE:
    return GSHM__STATUS__STATUS_TOO_BIG;
  case EBADMSG:
    return GSHM__STATUS__STATUS_PROTOCOL_ERROR;
  case EXDEV: /* no peer path (a CUDA result, gshm__cuda_errno): was
               * EOPNOTSUPP until it got its own errno; the wire keeps
               * saying "not supported" rather than "internal" */
    return GSHM__STATUS__STATUS_NOT_SUPPORTED;
  default:
    return GSHM__STATUS__STATUS_INTERNAL;
  }
}

size_t gshm__wire_list_budget(uint32_t max_packet) {
  size_t max = max_packet && max_packet < GSHM_WIRE_MAX_PACKET ? max_packet : GSHM_WIRE_MAX_PACKET;
  return max - GSHM_WIRE_HEADER_SIZE - 64;
}

size_t gshm__wire_embedded_size(size_t n) {
  size_t v = 1;
  for (size_t k = n; k >= 128; k >>= 7)
    v++;
  return 1 + v + n;
}

/* Reads one varint at *p (not past end), moving *p past it.  false when
 * it runs past end or past 10 bytes. */
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t x = 0;

  for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    x |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 63);
    if (!(b & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false;
}

bool gshm__wire_fields_over(const void *body, size_t len, unsigned max) {
  const uint8_t *p = body, *end = p + len;
  uint64_t tag, v;

  for (unsigned n = 0; p < end; n++) {
    if (n == max)
      return true;
    if (!wire_varint(&p, end, &tag))
      return false;
    switch (tag & 7) {
    case 0: /* varint */
      if (!wire_varint(&p, end, &v))
        return false;
      break;
    case 1: /* 64-bit */
    case 5: /* 32-bit */
      if ((size_t)(end - p) < ((tag & 7) == 1 ? 8u : 4u))
        return false;
      p += (tag & 7) == 1 ? 8 : 4;
      break;
    case 2: /* length-delimited */
      if (!wire_varint(&p, end, &v) || v > (uint64_t)(end - p))
        return false;
      p += v;
      break;
    default: /* groups: protobuf-c refuses them */
      return false;
    }
  }
  return false;
}
