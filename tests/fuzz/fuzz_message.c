/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for one protobuf-c message decoder, chosen at build time
 * (tests/fuzz/CMakeLists.txt compiles this file once per message):
 *   -DFUZZ_TYPE=Gshm__Hello -DFUZZ_LOWER=hello
 *
 * The bytes are decoded as the message; when they decode, the message must
 * pass protobuf_c_message_check(), every string must be NUL-terminated
 * inside what was allocated (the daemon calls strlen/strcmp on them), and
 * pack -> unpack -> pack must give the same bytes (re-encoding is stable,
 * so nothing decoded is half-initialised). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gshm.pb-c.h"
#ifdef FUZZ_CLUSTER
#include "cluster.pb-c.h"
#endif

#ifndef FUZZ_TYPE
#error "define FUZZ_TYPE (e.g. Gshm__Hello) and FUZZ_LOWER (e.g. hello)"
#endif

#define CAT3(a, b, c) a##b##c
#define FN(lower, suffix) CAT3(gshm__, lower, suffix)
#define UNPACK FN(FUZZ_LOWER, __unpack)
#define PACK FN(FUZZ_LOWER, __pack)
#define SIZE FN(FUZZ_LOWER, __get_packed_size)
#define FREE FN(FUZZ_LOWER, __free_unpacked)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touches every string of m and of its sub-messages, so that ASan sees a
 * missing terminator or a dangling pointer.  Returns whether m or any
 * sub-message kept unknown fields. */
static bool walk(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  bool unknown = m->n_unknown_fields != 0;

  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m + f->offset;
    size_t n = 1;
    const void *elems = base;

    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t qcase;
      memcpy(&qcase, (const char *)m + f->quantifier_offset, sizeof(qcase));
      if (qcase != f->id)
        continue;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      memcpy(&n, (const char *)m + f->quantifier_offset, sizeof(n));
      memcpy(&elems, base, sizeof(elems));
      if (n && !elems)
        abort();
    }
    for (size_t k = 0; k < n; k++) {
      if (f->type == PROTOBUF_C_TYPE_STRING) {
        const char *s;
        memcpy(&s, (const char *)elems + k * sizeof(char *), sizeof(s));
        if (s)
          (void)strlen(s);
        else if (f->label == PROTOBUF_C_LABEL_REPEATED)
          abort();
      } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        const ProtobufCMessage *sub;
        memcpy(&sub, (const char *)elems + k * sizeof(void *), sizeof(sub));
        if (sub)
          unknown |= walk(sub);
        else if (f->label == PROTOBUF_C_LABEL_REPEATED)
          abort();
      } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
        ProtobufCBinaryData b;
        memcpy(&b, (const char *)elems + k * sizeof(b), sizeof(b));
        if (b.len) {
          volatile uint8_t x = b.data[0];
          x = b.data[b.len - 1];
          (void)x;
        }
      }
    }
  }
  return unknown;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FUZZ_TYPE *m, *m2;
  uint8_t *a, *b;
  size_t na, nb;
  bool unknown;

  if (size > 65536) /* what one packet can carry */
    return 0;
  m = UNPACK(NULL, size, data);
  if (!m)
    return 0;
  if (!protobuf_c_message_check(&m->base))
    abort();
  unknown = walk(&m->base);
  na = SIZE(m);
  if (!(a = malloc(na ? na : 1)) || PACK(m, a) != na)
    abort();
  m2 = UNPACK(NULL, na, a);
  if (!m2) {
    /* What we encoded must decode, except for one libprotobuf-c 1.4
     * quirk: an unknown field whose tag is an over-long varint of field
     * number 0 ("80 00") is kept on decode but re-encoded as "00", which
     * the decoder then refuses. */
    if (!unknown)
      abort();
    free(a);
    FREE(m, NULL);
    return 0;
  }
  nb = SIZE(m2);
  if (nb != na || !(b = malloc(nb ? nb : 1)) || PACK(m2, b) != nb || memcmp(a, b, na) != 0)
    abort();
  free(b);
  free(a);
  FREE(m2, NULL);
  FREE(m, NULL);
  return 0;
}
