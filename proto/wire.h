/* SPDX-License-Identifier: Apache-2.0 */
/* Packet framing and file-descriptor passing for the gshm protocol.
 *
 * A packet is one SOCK_SEQPACKET message: a 16-byte header followed by a
 * protobuf-c message (gshm.proto).  Both ends run on one host, so header
 * fields are in host byte order.  Written once here, linked by gshmd,
 * libgshm and the tests (docs/ARCHITECTURE.md "Layers": no copies in daemon/ and client/). */
#ifndef GSHM_PROTO_WIRE_H
#define GSHM_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gshm.pb-c.h"

#define GSHM_WIRE_MAGIC 0x4d485347u /* "GSHM" in little-endian memory order */
#define GSHM_PROTO_MAJOR 1
#define GSHM_PROTO_MINOR 0
#define GSHM_WIRE_HEADER_SIZE 16
#define GSHM_WIRE_MAX_PACKET 65536u /* header included; larger packets are refused */
#define GSHM_WIRE_MAX_FDS 253       /* SCM_MAX_FD: the most one recvmsg can carry */
#define GSHM_CREATE_TOKEN_BYTES 16  /* CreateRequest.create_token: random, per create */
#define GSHM_REVOKE_TOKEN_BYTES 16  /* RevokeRequest.token: random, per revoke */
#define GSHM_UNLINK_TOKEN_BYTES 16  /* UnlinkRequest.token: random, per unlink */
#define GSHM_PULL_TOKEN_BYTES 16    /* PullRequest.token: random, per pull */
#define GSHM_PUBLISH_TOKEN_BYTES 16 /* PublishRequest.token: random, per publish */
/* Welcome.capabilities bits (bit 0 host backend, bit 1 cuda backend). */
#define GSHM_WIRE_CAP_PUBLISH 0x4u  /* SEGMENT_FLAG_HIDDEN creates and PUBLISH */
/* The most segments a gshmd holds: limits.max_segments' maximum
 * (daemon/option_table.h), hence the most a peer's listing can hold. */
#define GSHM_WIRE_SEGMENTS_MAX 16777216u
/* The most segments one page of a listing looks at past its cursor
 * (gshmd's and a peer's: cluster.proto ListReply.next); a page with no
 * segment looked at this many, so a listing of GSHM_WIRE_SEGMENTS_MAX has
 * at most GSHM_WIRE_SEGMENTS_MAX / GSHM_WIRE_LIST_VISITS of them. */
#define GSHM_WIRE_LIST_VISITS 2048u
/* The most GPUs one device mapping gives access to (libgshm's
 * map_cuda.c), and so the most UUIDs a MapReport names. */
#define GSHM_WIRE_MAP_DEVICES_MAX 64
/* The most fields a request's body may hold, every tag counted (known or
 * not, each occurrence of a repeated one): the largest request, a
 * MapReport naming GSHM_WIRE_MAP_DEVICES_MAX GPUs, holds 66 (64 was
 * too few for it: helper-111's review).  protobuf-c keeps each unknown
 * field and each occurrence of a known one (an allocation each, about
 * 30 ns), so a 64 KiB body of 3-byte fields took gshmd 0.67 ms to
 * unpack, 60 times a request's whole cost: gshmd counts first
 * (gshm__wire_fields_over). */
#define GSHM_WIRE_REQUEST_FIELDS_MAX 96u
_Static_assert(GSHM_WIRE_REQUEST_FIELDS_MAX >= GSHM_WIRE_MAP_DEVICES_MAX + 2,
               "a MapReport of every device a mapping may name must be served");

/* Header type: a request's operation; replies set GSHM_WIRE_REPLY. */
enum gshm_wire_type {
  GSHM_WIRE_HELLO = 1,         /* Hello -> Reply{welcome} */
  GSHM_WIRE_CREATE = 2,        /* CreateRequest -> Reply{grant} + fd */
  GSHM_WIRE_OPEN = 3,          /* OpenRequest -> Reply{grant} + fd */
  GSHM_WIRE_CLOSE = 4,         /* CloseRequest -> Reply{} */
  GSHM_WIRE_UNLINK = 5,        /* UnlinkRequest -> Reply{} */
  GSHM_WIRE_STAT = 6,          /* StatRequest -> Reply{segment} */
  GSHM_WIRE_LIST_SEGMENTS = 7, /* ListRequest -> Reply{segments} */
  GSHM_WIRE_LIST_LEASES = 8,   /* ListRequest -> Reply{leases} */
  GSHM_WIRE_LIST_CLIENTS = 9,  /* ListRequest -> Reply{clients} */
  GSHM_WIRE_STATUS = 10,       /* Empty -> Reply{status_info} */
  GSHM_WIRE_DEVICES = 11,      /* Empty -> Reply{devices} */
  GSHM_WIRE_MAP_REPORT = 12,   /* MapReport -> Reply{}; none when request_id is 0 */
  GSHM_WIRE_METRICS = 13,      /* Empty -> Reply{text} */
  GSHM_WIRE_CHMOD = 14,        /* ChmodRequest -> Reply{segment} */
  GSHM_WIRE_CHOWN = 15,        /* ChownRequest -> Reply{segment} */
  GSHM_WIRE_REVOKE = 16,       /* RevokeRequest -> Reply{} (admin) */
  GSHM_WIRE_PEERS = 17,        /* PeersRequest -> Reply{cluster_peers}, paged */
  GSHM_WIRE_REMOTE_LIST = 18,  /* RemoteListRequest -> Reply{segments} */
  GSHM_WIRE_PULL = 19,         /* PullRequest -> Reply{pull_progress}*, Reply{pull_result} */
  GSHM_WIRE_PULL_CANCEL = 20,  /* PullCancel -> Reply{}; none when request_id is 0 */
  GSHM_WIRE_PUBLISH = 21,      /* PublishRequest -> Reply{grant}, no fd */
  GSHM_WIRE_TYPE_MAX = 21,
  GSHM_WIRE_EVENT = 0x4000,    /* Event, daemon -> client, unasked */
  GSHM_WIRE_REPLY = 0x8000,
};

struct gshm_wire_header {
  uint32_t magic;
  uint8_t major;
  uint8_t minor;
  uint16_t type;
  uint32_t request_id;
  uint32_t length; /* payload bytes after the header; must match the packet */
};

_Static_assert(sizeof(struct gshm_wire_header) == GSHM_WIRE_HEADER_SIZE, "header size");

/* Serialises header + msg into buf (cap bytes).  *len_out is the packet
 * size.  Returns 0, or -EMSGSIZE when it would exceed cap or
 * GSHM_WIRE_MAX_PACKET. */
int gshm__wire_pack(uint16_t type, uint32_t request_id, const ProtobufCMessage *msg, void *buf,
                    size_t cap, size_t *len_out);

/* Sends one packet with an optional fd (fd < 0: none) as SCM_RIGHTS, with
 * MSG_NOSIGNAL.  The fd stays the caller's.  Returns 0 or a negative errno
 * from sendmsg (-EAGAIN on a full non-blocking socket, -EPIPE, ...). */
int gshm__wire_sendmsg(int sock, const void *pkt, size_t len, int fd);

/* Packs and sends (gshm__wire_pack + gshm__wire_sendmsg). */
int gshm__wire_send(int sock, uint16_t type, uint32_t request_id, const ProtobufCMessage *msg,
                    int fd);

/* Receives one packet into buf (cap should be GSHM_WIRE_MAX_PACKET + 1 so
 * that oversize packets are seen) with MSG_CMSG_CLOEXEC and `flags` (e.g.
 * MSG_DONTWAIT to take only what is already queued).  Every SCM_RIGHTS
 * fd of every cmsg is collected: up to max_fds go to fds[] (caller owns
 * them, *nfds_out says how many); the rest are closed here.
 * Returns the packet length (> 0), 0 on end of stream, or a negative errno:
 * -EMSGSIZE the packet was larger than cap (MSG_TRUNC) or its fds did not
 * fit (MSG_CTRUNC; the kernel dropped those); -EAGAIN nothing to read.
 * On -EMSGSIZE the fds that did arrive are still returned in fds[]. */
ssize_t gshm__wire_recv(int sock, void *buf, size_t cap, int *fds, int max_fds, int *nfds_out,
                        int flags);

/* Validates a received packet's header: length >= header, magic, and
 * length field == len - header.  Major version is checked by the caller
 * (the hello exchange needs to answer a mismatch with both versions).
 * Returns 0, -EBADMSG (bad magic or length) or -EPROTO (too short). */
int gshm__wire_parse_header(const void *pkt, size_t len, struct gshm_wire_header *hdr_out);

/* Bytes that the items of a paged list (LIST_*, PEERS) may take in one
 * reply packet when the daemon's limits.max_packet is max_packet (bytes;
 * 0: GSHM_WIRE_MAX_PACKET, larger values capped there): the packet less
 * its header and 64 bytes for the Reply's own fields, the list's
 * embedding and its cursor. */
size_t gshm__wire_list_budget(uint32_t max_packet);

/* Bytes that one embedded message of packed size n adds to its parent:
 * its tag, its length (a varint) and its body. */
size_t gshm__wire_embedded_size(size_t n);

/* Whether the protobuf body of len bytes holds more than max fields
 * (every tag counted, as GSHM_WIRE_REQUEST_FIELDS_MAX says), looking at no
 * more than max + 1 of them, whatever len.  A body that is malformed
 * before that is not over: its decoder refuses it. */
bool gshm__wire_fields_over(const void *body, size_t len, unsigned max);

/* Wire status <-> negative errno (STATUS_OK <-> 0). */
int gshm__status_to_errno(int status);
int gshm__errno_to_status(int err);

#endif
