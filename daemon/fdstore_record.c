/* SPDX-License-Identifier: Apache-2.0 */
/* What a bucket's datagram says: its members' StateRecords in a
 * StateBucket.  Each member's record is filled from its segment, packed
 * once and kept (seg->fs_record) while what it says stays the same: every
 * create, unlink and free rewrites its bucket, up to 226 records, and
 * packing each again took about 40% of gshmd's time in a create+unlink
 * (docs/PERFORMANCE.md "Control plane"). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fdstore_internal.h"
#include "registry.h"

/* seg's current state as a StateRecord (strings borrowed from seg); its
 * publish only while above publish_done, the journal's mark (a record
 * without one is complete whatever mark a later journal has). */
void gshmd__fdstore_fill_record(const struct gshmd_segment *seg, uint64_t publish_done,
                                Gshm__StateRecord *x) {
  gshm__state_record__init(x);
  x->id = seg->id;
  x->generation = seg->generation;
  x->name = seg->name;
  x->requested_size = seg->requested_size;
  x->size = seg->mem->size;
  x->location = seg->mem->location;
  x->uid = seg->uid;
  x->gid = seg->gid;
  x->mode = seg->mode;
  x->flags = seg->flags;
  x->created_ns = seg->created_ns;
  x->unlinked = seg->unlinked || seg->fs_replaced; /* (a replace's: before unlink_replaced) */
  x->revoked = seg->fs_revoked;
  if (seg->source)
    x->source = seg->source;
  else if (seg->has_token) { /* (a pulled segment has none: fdstore_size.c RECORD_FIXED_MAX) */
    x->create_token.data = (uint8_t *)seg->create_token;
    x->create_token.len = GSHM_CREATE_TOKEN_BYTES;
  }
  if (seg->fs_publish > publish_done) {
    x->publish = seg->fs_publish;
    x->publish_members = seg->fs_publish_n;
  }
  if (seg->fs_replaced > publish_done)
    x->replaced_by = seg->fs_replaced;
}

/* seg's record packed, with what it was packed from: x with its
 * pointers cleared (compared bytewise), and copies of what they pointed
 * to (a pull replaces seg->source, a park seg->mem and its location:
 * compared by value, whatever address the new ones got). */
struct fdstore_record {
  Gshm__StateRecord x;
  char *name, *loc, *source; /* NUL-terminated copies in bytes[] past len; NULL: none */
  uint8_t token[GSHM_CREATE_TOKEN_BYTES];
  size_t len;
  uint8_t bytes[];
};

static bool same_str(const char *copy, const char *now) {
  return copy && now ? !strcmp(copy, now) : copy == now;
}

/* x's pointers cleared, what they pointed to in *str (name, location,
 * source) and *token. */
static void detach(Gshm__StateRecord *x, const char *str[3], const uint8_t **token) {
  str[0] = x->name;
  str[1] = x->location;
  str[2] = x->source;
  *token = x->create_token.data;
  x->name = x->location = x->source = NULL;
  x->create_token.data = NULL;
}

static bool record_same(const struct fdstore_record *c, const Gshm__StateRecord *x,
                        const char *const str[3], const uint8_t *token) {
  return !memcmp(&c->x, x, sizeof(*x)) && same_str(c->name, str[0]) &&
         same_str(c->loc, str[1]) && same_str(c->source, str[2]) &&
         (!x->create_token.len || !memcmp(c->token, token, x->create_token.len));
}

/* Packs x (its pointers str, token) into a new record.  NULL: no memory. */
static struct fdstore_record *record_new(Gshm__StateRecord *x, const char *const str[3],
                                         const uint8_t *token) {
  size_t len, extra = 0, at;
  struct fdstore_record *c;
  char **copy[3];

  if (x->create_token.len > GSHM_CREATE_TOKEN_BYTES)
    return NULL;
  for (int i = 0; i < 3; i++)
    extra += str[i] ? strlen(str[i]) + 1 : 0;
  x->name = (char *)str[0];
  x->location = (char *)str[1];
  x->source = (char *)str[2];
  x->create_token.data = (uint8_t *)token;
  len = protobuf_c_message_get_packed_size(&x->base);
  if (!(c = malloc(sizeof(*c) + len + extra)))
    return NULL;
  protobuf_c_message_pack(&x->base, c->bytes);
  c->len = len;
  copy[0] = &c->name;
  copy[1] = &c->loc;
  copy[2] = &c->source;
  at = len;
  for (int i = 0; i < 3; i++) {
    *copy[i] = str[i] ? memcpy(c->bytes + at, str[i], strlen(str[i]) + 1) : NULL;
    at += str[i] ? strlen(str[i]) + 1 : 0;
  }
  if (x->create_token.len)
    memcpy(c->token, token, x->create_token.len);
  x->name = x->location = x->source = NULL;
  x->create_token.data = NULL;
  memcpy(&c->x, x, sizeof(*x));
  return c;
}

const uint8_t *gshmd__fdstore_record(struct gshmd_segment *seg, uint64_t publish_done,
                                     size_t *len_out) {
  struct fdstore_record *c = seg->fs_record;
  Gshm__StateRecord x;
  const char *str[3];
  const uint8_t *token;

  memset(&x, 0, sizeof(x)); /* (padding: the comparison is bytewise) */
  gshmd__fdstore_fill_record(seg, publish_done, &x);
  detach(&x, str, &token);
  if (!c || !record_same(c, &x, str, token)) {
    free(seg->fs_record);
    if (!(seg->fs_record = c = record_new(&x, str, token)))
      return NULL;
  }
  *len_out = c->len;
  return c->bytes;
}

/* The varint of a length-delimited field's length (protobuf's encoding
 * guide).  Written here because protobuf-c has no public call that
 * appends a field from bytes packed before: protobuf_c_message_pack would
 * pack every member's StateRecord again, the cost the kept records save;
 * the unit tests unpack what this writes with protobuf-c's own reader
 * (test_bucket_payload_follows_changes). */
static size_t varint_bytes(size_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7)
    n++;
  return n;
}

static size_t varint_put(uint8_t *p, size_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7)
    p[n++] = (uint8_t)(v | 0x80);
  p[n++] = (uint8_t)v;
  return n;
}

/* b's members as a StateBucket, each record packed again. */
static size_t pack_whole(const struct fdstore_bucket *b, Gshm__StateBucket *t,
                         uint64_t publish_done, uint8_t **buf_out) {
  Gshm__StateRecord recs[FDSTORE_BUCKET_FDS], *precs[FDSTORE_BUCKET_FDS];
  size_t len;

  for (uint32_t i = 0; i < b->n; i++) {
    gshmd__fdstore_fill_record(b->seg[i], publish_done, &recs[i]);
    precs[i] = &recs[i];
  }
  t->n_segments = b->n;
  t->segments = precs;
  len = protobuf_c_message_get_packed_size(&t->base);
  if ((*buf_out = malloc(len ? len : 1)))
    protobuf_c_message_pack(&t->base, *buf_out);
  t->n_segments = 0;
  t->segments = NULL;
  return len;
}

/* b's members as a StateBucket of sequence seq (their publish tags only
 * above publish_done, the journal's mark, which it carries too: a restart
 * that lost the journal alone takes it from there), in *buf_out
 * (malloc'ed; NULL when out of memory).  Returns its length.  The other
 * fields first, then each member's record as its segment keeps it packed
 * (gshmd__fdstore_record: field 4, length-delimited; a reader takes the
 * fields in any order). */
size_t gshmd__bucket_pack(const struct fdstore_bucket *b, uint64_t seq, uint64_t publish_done,
                          uint8_t **buf_out) {
  Gshm__StateBucket t = GSHM__STATE_BUCKET__INIT;
  const uint8_t *rec[FDSTORE_BUCKET_FDS];
  size_t rlen[FDSTORE_BUCKET_FDS], len, at;

  t.version = 1;
  t.seq = seq;
  t.bucket = b->index;
  t.publish_done = publish_done;
  t.sender_uid_plus_one = (uint32_t)getuid() + 1u; /* (packed to be sent: by this process) */
  len = protobuf_c_message_get_packed_size(&t.base);
  for (uint32_t i = 0; i < b->n; i++) {
    if (!(rec[i] = gshmd__fdstore_record(b->seg[i], publish_done, &rlen[i])))
      return pack_whole(b, &t, publish_done, buf_out); /* (out of memory) */
    len += 1 + varint_bytes(rlen[i]) + rlen[i];
  }
  if (!(*buf_out = malloc(len ? len : 1)))
    return len;
  at = protobuf_c_message_pack(&t.base, *buf_out);
  for (uint32_t i = 0; i < b->n; i++) {
    (*buf_out)[at++] = (4 << 3) | 2; /* StateBucket.segments, length-delimited */
    at += varint_put(*buf_out + at, rlen[i]);
    memcpy(*buf_out + at, rec[i], rlen[i]);
    at += rlen[i];
  }
  return len;
}
