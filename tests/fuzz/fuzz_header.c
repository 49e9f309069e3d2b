/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the packet header (gshm__wire_parse_header) and the
 * decisions gshmd and libgshm take on it before decoding a body: the major
 * version, the type range, reply/event bits, and the status <-> errno map
 * applied to whatever a peer could put there. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct gshm_wire_header h;
  int r;

  memset(&h, 0xa5, sizeof(h));
  r = gshm__wire_parse_header(data, size, &h);
  if (size < GSHM_WIRE_HEADER_SIZE) {
    if (r != -EPROTO)
      abort();
    return 0;
  }
  if (r == -EBADMSG)
    return 0;
  if (r != 0)
    abort();
  /* Accepted: the length field must cover exactly the rest of the packet,
   * so a body decoder can never read past it. */
  if (h.magic != GSHM_WIRE_MAGIC || (size_t)h.length + GSHM_WIRE_HEADER_SIZE != size)
    abort();
  if (h.major != GSHM_PROTO_MAJOR)
    return 0; /* refused with both versions named */
  if (h.type & GSHM_WIRE_REPLY) {
    /* What libgshm does with a reply: decode, map the status. */
    Gshm__Reply *rep = gshm__reply__unpack(NULL, h.length, data + GSHM_WIRE_HEADER_SIZE);
    if (rep) {
      int e = gshm__status_to_errno(rep->status);
      if (e > 0 || (e == 0 && rep->status != GSHM__STATUS__STATUS_OK))
        abort();
      /* Every errno maps back to a status that maps to an errno. */
      if (e && gshm__status_to_errno(gshm__errno_to_status(e)) != e)
        abort();
      gshm__reply__free_unpacked(rep, NULL);
    }
  } else if (h.type == GSHM_WIRE_EVENT) {
    Gshm__Event *ev = gshm__event__unpack(NULL, h.length, data + GSHM_WIRE_HEADER_SIZE);
    if (ev)
      gshm__event__free_unpacked(ev, NULL);
  } else if (h.type == 0 || h.type > GSHM_WIRE_TYPE_MAX) {
    return 0; /* unknown type: protocol error */
  }
  /* errno_to_status never yields UNSPECIFIED for an errno (either sign). */
  {
    int32_t e;
    memcpy(&e, data + 8, sizeof(e));
    e %= 4096;
    if (gshm__errno_to_status(e) == GSHM__STATUS__STATUS_UNSPECIFIED && e != 0)
      abort();
  }
  return 0;
}
