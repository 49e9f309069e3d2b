/* SPDX-License-Identifier: Apache-2.0 */
/* The registry on its own: permissions, leases, unlink semantics, quotas
 * (host backend, no sockets). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "log.h"
#include "registry.h"

struct fixture {
  struct gshmd_config cfg;
  struct gshmd_registry reg;
  struct gshmd_client *alice, *bob, *root;
};

static struct gshmd_client *add_client(struct gshmd_registry *r, uid_t uid, gid_t gid) {
  struct gshmd_cred cred = {.pid = 1000 + (pid_t)uid, .uid = uid, .gid = gid, .admin = uid == 0};
  struct gshmd_client *c = NULL;
  assert_int_equal(gshmd_registry_client_add(r, &cred, &c), 0);
  return c;
}

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));

  if (!f)
    return -1;
  f->cfg.max_name = 255;
  f->cfg.max_segments = 100;
  gshmd_registry_init(&f->reg, &f->cfg);
  assert_int_equal(gshmd_backend_host_create(&f->cfg, &f->reg.host), 0);
  f->alice = add_client(&f->reg, 1001, 100);
  f->bob = add_client(&f->reg, 1002, 100);
  f->root = add_client(&f->reg, 0, 0);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  gshmd_registry_destroy(&f->reg);
  f->reg.host->ops->destroy(f->reg.host);
  free(f);
  return 0;
}

static int create(struct fixture *f, struct gshmd_client *c, const char *name, uint64_t size,
                  uint32_t mode, struct gshmd_lease **l) {
  Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
  const char *msg = NULL;
  req.name = (char *)name;
  req.size = size;
  req.location = "host";
  req.mode = mode;
  return gshmd_registry_create(&f->reg, c, &req, l, NULL, &msg);
}

/* A create of name (size bytes, host) by c carrying token (len bytes;
 * NULL: none); *resent says how it was answered. */
static int create_token(struct fixture *f, struct gshmd_client *c, const char *name,
                        uint64_t size, const uint8_t *token, size_t len,
                        struct gshmd_lease **l, bool *resent) {
  Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
  const char *msg = NULL;
  req.name = (char *)name;
  req.size = size;
  req.location = "host";
  req.create_token.data = (uint8_t *)token;
  req.create_token.len = token ? len : 0;
  return gshmd_registry_create(&f->reg, c, &req, l, resent, &msg);
}

/* A create sent again with its token (a reply lost to a restart) gets a
 * read-write lease of the segment the first one made; any other create
 * of that name is refused as before: another token, none, another user
 * with the token, another size; a token of the wrong length is refused. */
static void test_create_resent(void **state) {
  struct fixture *f = *state;
  const uint8_t t[16] = "0123456789abcdef", u[16] = "0123456789abcdeF";
  struct gshmd_lease *l1, *l2, *l;
  bool resent = true;

  assert_int_equal(create_token(f, f->alice, "r", 100, t, 16, &l1, &resent), 0);
  assert_false(resent);
  assert_int_equal(create_token(f, f->alice, "r", 100, t, 16, &l2, &resent), 0);
  assert_true(resent);
  assert_ptr_equal(l2->seg, l1->seg);
  assert_true(l2->id != l1->id);
  assert_int_equal(l2->access, GSHM__ACCESS__ACCESS_READ_WRITE);
  assert_int_equal(l1->seg->nleases, 2);
  assert_int_equal(f->reg.nsegments, 1);
  assert_int_equal(create_token(f, f->alice, "r", 100, u, 16, &l, &resent), -EEXIST);
  assert_int_equal(create_token(f, f->alice, "r", 100, NULL, 0, &l, &resent), -EEXIST);
  assert_int_equal(create_token(f, f->bob, "r", 100, t, 16, &l, &resent), -EEXIST);
  assert_int_equal(create_token(f, f->alice, "r", 200, t, 16, &l, &resent), -EEXIST);
  /* another create's flags or kind of location, with the token: not a resend */
  {
    Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
    const char *msg = NULL;
    req.name = "r";
    req.size = 100;
    req.location = "host";
    req.create_token = (ProtobufCBinaryData){16, (uint8_t *)t};
    req.flags = GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC;
    assert_int_equal(gshmd_registry_create(&f->reg, f->alice, &req, &l, &resent, &msg), -EEXIST);
    req.flags = 0;
    req.location = "cuda:0";
    assert_int_equal(gshmd_registry_create(&f->reg, f->alice, &req, &l, &resent, &msg), -EEXIST);
  }
  assert_int_equal(create_token(f, f->alice, "s", 100, t, 5, &l, &resent), -EINVAL);
  /* unlinked: the name is free, the token names nothing */
  {
    const char *msg;
    assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "r", &msg), 0);
  }
  assert_int_equal(create_token(f, f->alice, "r", 100, t, 16, &l, &resent), 0);
  assert_false(resent);
  assert_ptr_not_equal(l->seg, l1->seg);
}

/* The token is honoured only for the segment's owner now: after an admin
 * gives the segment to bob, alice's resend is refused, root's too (an
 * admin is not the owner); after a revoke the name is free and the
 * resend is a new create.  (A resend after the owner's own chmod 0400
 * gets read-write, as the first create did: the owner may chmod back.) */
static void test_create_resent_owner_only(void **state) {
  struct fixture *f = *state;
  const uint8_t t[16] = "0123456789abcdef";
  struct gshmd_lease *l1, *l;
  const char *msg;
  bool resent;

  assert_int_equal(create_token(f, f->alice, "o", 100, t, 16, &l1, &resent), 0);
  assert_int_equal(gshmd_registry_chmod(&f->reg, f->alice, "o", 0400, &msg), 0);
  assert_int_equal(create_token(f, f->alice, "o", 100, t, 16, &l, &resent), 0);
  assert_true(resent);
  assert_int_equal(l->access, GSHM__ACCESS__ACCESS_READ_WRITE);
  assert_int_equal(gshmd_registry_chown(&f->reg, f->root, "o", 1002, -1, &msg), 0);
  assert_int_equal(create_token(f, f->alice, "o", 100, t, 16, &l, &resent), -EEXIST);
  assert_int_equal(create_token(f, f->root, "o", 100, t, 16, &l, &resent), -EEXIST);
  assert_int_equal(gshmd_registry_revoke(&f->reg, f->root, "o", 0, &msg), 0);
  assert_int_equal(create_token(f, f->alice, "o", 100, t, 16, &l, &resent), 0);
  assert_false(resent);
  assert_int_equal(l->seg->uid, 1001);
}

static int open_(struct fixture *f, struct gshmd_client *c, const char *name, int access,
                 struct gshmd_lease **l) {
  Gshm__OpenRequest req = GSHM__OPEN_REQUEST__INIT;
  const char *msg = NULL;
  req.name = (char *)name;
  req.access = access;
  return gshmd_registry_open(&f->reg, c, &req, l, &msg);
}

static void test_permissions(void **state) {
  struct fixture *f = *state;
  struct gshmd_lease *l, *lb;

  assert_int_equal(create(f, f->alice, "a/private", 100, 0600, &l), 0);
  assert_int_equal(l->seg->mem->size, 4096); /* page granularity */
  assert_int_equal(l->seg->requested_size, 100);
  assert_int_equal(open_(f, f->bob, "a/private", GSHM__ACCESS__ACCESS_READ, &lb), -EACCES);
  assert_false(gshmd_registry_may_see(f->bob, l->seg));
  assert_int_equal(open_(f, f->root, "a/private", GSHM__ACCESS__ACCESS_READ_WRITE, &lb), 0);

  assert_int_equal(create(f, f->alice, "a/group", 100, 0640, &l), 0);
  assert_int_equal(open_(f, f->bob, "a/group", GSHM__ACCESS__ACCESS_READ, &lb), 0);
  assert_int_equal(open_(f, f->bob, "a/group", GSHM__ACCESS__ACCESS_READ_WRITE, &lb), -EACCES);
  /* A legacy IPC handle opens read-write whatever the request asks: a
   * reader must not get one (the flag set by hand: no CUDA here). */
  {
    Gshm__OpenRequest req = GSHM__OPEN_REQUEST__INIT;
    const char *msg = NULL;
    l->seg->flags |= GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC;
    req.name = "a/group";
    req.access = GSHM__ACCESS__ACCESS_READ;
    req.legacy_ipc = 1;
    assert_int_equal(gshmd_registry_open(&f->reg, f->bob, &req, &lb, &msg), -EACCES);
    assert_int_equal(gshmd_registry_open(&f->reg, f->alice, &req, &lb, &msg), 0);
    assert_int_equal(lb->access, GSHM__ACCESS__ACCESS_READ_WRITE);
    l->seg->flags &= ~(uint32_t)GSHM__SEGMENT_FLAG__SEGMENT_FLAG_LEGACY_IPC;
  }
  /* Only the owner or an admin unlinks. */
  {
    const char *msg;
    assert_int_equal(gshmd_registry_unlink(&f->reg, f->bob, "a/group", &msg), -EACCES);
    assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "a/group", &msg), 0);
  }
}

static void test_bad_requests(void **state) {
  struct fixture *f = *state;
  struct gshmd_lease *l;
  char name[300];

  assert_int_equal(create(f, f->alice, "zero", 0, 0600, &l), -EINVAL);
  assert_int_equal(create(f, f->alice, "bad//name", 1, 0600, &l), -EINVAL);
  assert_int_equal(create(f, f->alice, "mode", 1, 01777, &l), -EINVAL);
  memset(name, 'x', 256);
  name[256] = '\0';
  assert_int_equal(create(f, f->alice, name, 1, 0600, &l), -ENAMETOOLONG);
  assert_int_equal(create(f, f->alice, "dup", 1, 0600, &l), 0);
  assert_int_equal(create(f, f->bob, "dup", 1, 0600, &l), -EEXIST);
  assert_int_equal(open_(f, f->alice, "missing", GSHM__ACCESS__ACCESS_READ, &l), -ENOENT);
  {
    Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
    const char *msg = NULL;
    req.name = "gpu";
    req.size = 1;
    req.location = "cuda:0";
    /* No CUDA backend in this registry. */
    assert_int_equal(gshmd_registry_create(&f->reg, f->alice, &req, &l, NULL, &msg), -ENOTSUP);
    assert_non_null(msg);
  }
}

static void test_unlink_keeps_memory_for_leases(void **state) {
  struct fixture *f = *state;
  struct gshmd_lease *la, *lb;
  const char *msg;
  uint64_t id, gen;

  assert_int_equal(create(f, f->alice, "shared", 8192, 0644, &la), 0);
  id = la->seg->id;
  gen = la->seg->generation;
  assert_int_equal(open_(f, f->bob, "shared", GSHM__ACCESS__ACCESS_READ, &lb), 0);
  assert_int_equal(f->reg.nsegments, 1);
  assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "shared", &msg), 0);
  /* Name gone at once, memory kept. */
  assert_null(gshmd_registry_find_name(&f->reg, "shared"));
  assert_non_null(gshmd_registry_find_id(&f->reg, id));
  assert_int_equal(f->reg.bytes, 8192);
  /* The name can be created again: new id, higher generation. */
  {
    struct gshmd_lease *l2;
    assert_int_equal(create(f, f->alice, "shared", 4096, 0644, &l2), 0);
    assert_true(l2->seg->id > id);
    assert_true(l2->seg->generation > gen);
  }
  assert_int_equal(gshmd_registry_close(&f->reg, f->alice, la->id), 0);
  assert_non_null(gshmd_registry_find_id(&f->reg, id)); /* bob still holds it */
  gshmd_registry_client_remove(&f->reg, f->bob);        /* a connection ends */
  f->bob = NULL;
  assert_null(gshmd_registry_find_id(&f->reg, id));
  assert_int_equal(f->reg.bytes, 4096);
}

static void test_quota(void **state) {
  struct fixture *f = *state;
  struct gshmd_lease *l1, *l2;
  const char *msg;

  f->cfg.quota_host_bytes = 3 * 4096;
  assert_int_equal(create(f, f->alice, "q1", 2 * 4096, 0600, &l1), 0);
  assert_int_equal(create(f, f->alice, "q2", 2 * 4096, 0600, &l2), -EDQUOT);
  assert_int_equal(create(f, f->root, "q-root", 8 * 4096, 0600, &l2), 0); /* root is exempt */
  assert_int_equal(gshmd_registry_close(&f->reg, f->alice, l1->id), 0);
  assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "q1", &msg), 0);
  assert_int_equal(create(f, f->alice, "q2", 2 * 4096, 0600, &l2), 0); /* after a free */
}

static struct gshmd_segment *hidden(struct fixture *f, struct gshmd_client *c,
                                    const char *name, uint64_t size) {
  Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
  struct gshmd_segment *seg = NULL;
  const char *msg = NULL;
  req.name = (char *)name;
  req.size = size;
  req.location = "host";
  assert_int_equal(gshmd_registry_create_hidden(&f->reg, c, &req, &seg, &msg), 0);
  return seg;
}

/* Hidden segments: charged, but not found by name or id, not counted as
 * segments; published together; the name may be taken meanwhile. */
static void test_hidden_publish(void **state) {
  struct fixture *f = *state;
  struct gshmd_segment *segs[3];
  struct gshmd_lease *l;
  const char *msg = NULL;

  segs[0] = hidden(f, f->alice, "m/a", 100);
  segs[1] = hidden(f, f->alice, "m/b", 5000);
  assert_null(gshmd_registry_find_name(&f->reg, "m/a"));
  assert_int_equal(f->reg.nsegments, 0);
  assert_int_equal(f->reg.nhidden, 2);
  assert_true(f->reg.bytes == 4096 + 8192);
  assert_int_equal(open_(f, f->bob, "m/a", GSHM__ACCESS__ACCESS_READ, &l), -ENOENT);
  /* a name created meanwhile is not held by the hidden one */
  assert_int_equal(create(f, f->bob, "m/b", 10, 0644, &l), 0);
  assert_int_equal(gshmd_registry_publish(&f->reg, f->alice, segs, 2, false, &msg), -EEXIST);
  assert_null(gshmd_registry_find_name(&f->reg, "m/a")); /* nothing of the set */
  assert_int_equal(f->reg.nhidden, 2);
  /* replacing bob's segment needs bob or an admin */
  assert_int_equal(gshmd_registry_publish(&f->reg, f->alice, segs, 2, true, &msg), -EACCES);
  assert_null(gshmd_registry_find_name(&f->reg, "m/a"));
  assert_true(gshmd_registry_find_name(&f->reg, "m/b") == l->seg);
  assert_int_equal(gshmd_registry_publish(&f->reg, f->root, segs, 2, true, &msg), 0);
  assert_true(gshmd_registry_find_name(&f->reg, "m/a") == segs[0]);
  assert_true(gshmd_registry_find_name(&f->reg, "m/b") == segs[1]);
  assert_true(gshmd_registry_find_id(&f->reg, segs[1]->id) == segs[1]);
  assert_true(segs[0]->id < segs[1]->id);
  assert_int_equal(f->reg.nhidden, 0);
  /* bob's old m/b: unlinked, still held by its lease, gone with it */
  assert_true(l->seg->unlinked);
  assert_int_equal(f->reg.nsegments, 3);
  assert_int_equal(gshmd_registry_close(&f->reg, f->bob, l->id), 0);
  assert_int_equal(f->reg.nsegments, 2);
  assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "m/b", &msg), 0);
  assert_null(gshmd_registry_find_name(&f->reg, "m/b"));
  assert_true(gshmd_registry_find_name(&f->reg, "m/a") == segs[0]);
}

/* A client's own hidden segment (SEGMENT_FLAG_HIDDEN): only its
 * creator's lease publishes it, once; a pull's hidden segment is not
 * published through a relay's lease of it; closing the creator's lease
 * before the publish frees it. */
static void test_publish_lease(void **state) {
  struct fixture *f = *state;
  Gshm__CreateRequest req = GSHM__CREATE_REQUEST__INIT;
  struct gshmd_lease *l, *relay, *out;
  struct gshmd_segment *pulled;
  const char *msg = NULL;

  req.name = "p/x";
  req.size = 100;
  req.location = "host";
  req.flags = GSHM__SEGMENT_FLAG__SEGMENT_FLAG_HIDDEN;
  assert_int_equal(gshmd_registry_create(&f->reg, f->alice, &req, &l, NULL, &msg), 0);
  assert_true(l->seg->hidden && l->seg->local && l->seg->id == 0 && l->seg->flags == 0);
  assert_null(gshmd_registry_find_name(&f->reg, "p/x"));
  assert_int_equal(f->reg.nhidden, 1);
  /* another client's (an admin's too) PUBLISH of the lease */
  assert_int_equal(gshmd_registry_publish_lease(&f->reg, f->bob, l->id, true, &out, &msg),
                   -ESTALE);
  assert_int_equal(gshmd_registry_publish_lease(&f->reg, f->root, l->id, true, &out, &msg),
                   -ESTALE);
  assert_int_equal(gshmd_registry_publish_lease(&f->reg, f->alice, l->id, false, &out, &msg), 0);
  assert_true(out == l && gshmd_registry_find_name(&f->reg, "p/x") == l->seg);
  assert_true(l->seg->id != 0 && !l->seg->hidden && !l->seg->local);
  assert_int_equal(gshmd_registry_publish_lease(&f->reg, f->alice, l->id, true, &out, &msg),
                   -EINVAL);
  /* a pull's hidden segment, leased by a relaying peer's client */
  pulled = hidden(f, f->alice, "p/y", 100);
  assert_int_equal(gshmd_registry_lease_hidden(&f->reg, f->alice, pulled,
                                               GSHM__ACCESS__ACCESS_READ_WRITE, &relay, &msg), 0);
  assert_int_equal(gshmd_registry_publish_lease(&f->reg, f->alice, relay->id, false, &out, &msg),
                   -EINVAL);
  assert_true(pulled->hidden);
  gshmd_registry_discard_hidden(&f->reg, pulled);
  /* closed before its publish: gone, uncharged */
  req.name = "p/z";
  assert_int_equal(gshmd_registry_create(&f->reg, f->alice, &req, &l, NULL, &msg), 0);
  assert_int_equal(f->reg.nhidden, 1);
  assert_int_equal(gshmd_registry_close(&f->reg, f->alice, l->id), 0);
  assert_int_equal(f->reg.nhidden, 0);
  assert_true(f->reg.bytes == 4096); /* p/x's page only */
}

/* Published segments are in the id index as created ones are: a listing
 * page resumes after its cursor through the index (the cursor's segment
 * may have been freed), and it skipped every published segment (a pull's)
 * there, going on at the next created one. */
static void test_published_are_indexed(void **state) {
  struct fixture *f = *state;
  struct gshmd_segment *segs[2];
  struct gshmd_lease *la, *lb;
  const char *msg = NULL;
  uint64_t a_id;

  assert_int_equal(create(f, f->alice, "i/a", 10, 0644, &la), 0);
  a_id = la->seg->id;
  segs[0] = hidden(f, f->alice, "i/p", 10);
  segs[1] = hidden(f, f->alice, "i/q", 10);
  assert_int_equal(gshmd_registry_publish(&f->reg, f->alice, segs, 2, false, &msg), 0);
  assert_int_equal(create(f, f->alice, "i/b", 10, 0644, &lb), 0);
  assert_ptr_equal(gshmd_registry_find_after(&f->reg, a_id), segs[0]);
  assert_ptr_equal(gshmd_registry_find_after(&f->reg, segs[0]->id), segs[1]);
  assert_ptr_equal(gshmd_registry_find_after(&f->reg, segs[1]->id), lb->seg);
  /* the cursor's segment freed: the next one is still the published one */
  assert_int_equal(gshmd_registry_close(&f->reg, f->alice, la->id), 0);
  assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "i/a", &msg), 0);
  assert_ptr_equal(gshmd_registry_find_after(&f->reg, a_id), segs[0]);
  /* and a freed published one leaves the index */
  assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "i/p", &msg), 0);
  assert_ptr_equal(gshmd_registry_find_after(&f->reg, a_id), segs[1]);
}

/* A set with a name twice is refused whole; discarding gives the memory
 * back. */
static void test_hidden_duplicate_discard(void **state) {
  struct fixture *f = *state;
  struct gshmd_segment *segs[3];
  const char *msg = NULL;

  segs[0] = hidden(f, f->alice, "d/x", 10);
  segs[1] = hidden(f, f->alice, "d/y", 10);
  segs[2] = hidden(f, f->alice, "d/x", 10);
  assert_int_equal(gshmd_registry_publish(&f->reg, f->alice, segs, 3, false, &msg), -EINVAL);
  assert_int_equal(gshmd_registry_publish(&f->reg, f->alice, segs, 3, true, &msg), -EINVAL);
  assert_null(gshmd_registry_find_name(&f->reg, "d/x"));
  assert_null(gshmd_registry_find_name(&f->reg, "d/y"));
  for (int i = 0; i < 3; i++)
    gshmd_registry_discard_hidden(&f->reg, segs[i]);
  assert_int_equal(f->reg.nhidden, 0);
  assert_true(f->reg.bytes == 0);
  /* and one left hidden is freed with the registry (teardown, ASan) */
  hidden(f, f->bob, "d/left", 10);
}

/* Adopts a restored host segment of 4 KiB, id and name, as the fd store
 * does at a start. */
static void adopt(struct fixture *f, uint64_t id, const char *name, bool unlinked) {
  Gshm__StateRecord rec = GSHM__STATE_RECORD__INIT;
  struct gshm_location loc = {.kind = GSHM_LOCATION_HOST};
  struct gshmd_alloc *mem;

  assert_int_equal(f->reg.host->ops->alloc(f->reg.host, &loc, 4096, 0, name, &mem), 0);
  rec.id = id;
  rec.generation = 1;
  rec.name = (char *)name;
  rec.size = rec.requested_size = 4096;
  rec.location = "host";
  rec.uid = 1001;
  rec.gid = 100;
  rec.mode = 0600;
  rec.unlinked = unlinked;
  assert_int_equal(gshmd_registry_adopt(&f->reg, &rec, mem), 0);
}

/* The registry owns a restart's grace period: none without restored
 * segments; with one, an unlinked restored segment nobody re-took is kept
 * until the period ends (gshmd_registry_reap_unlinked), and from then on
 * freed as soon as it is unlinked and unleased. */
static void test_restart_grace(void **state) {
  struct fixture *f = *state;
  const char *msg = NULL;

  assert_int_equal(gshmd_registry_grace_begin(&f->reg), 0);
  assert_true(f->reg.restore_grace_over);
  f->reg.restore_grace_over = false; /* a fresh registry, as at a start */
  adopt(f, 7, "kept", true);
  adopt(f, 8, "named", false);
  assert_int_equal(gshmd_registry_grace_begin(&f->reg), GSHMD_RESTART_GRACE_MS);
  assert_false(f->reg.restore_grace_over);
  assert_int_equal(gshmd_registry_unlink(&f->reg, f->alice, "named", &msg), 0);
  assert_non_null(gshmd_registry_find_id(&f->reg, 7)); /* kept for re-takes */
  assert_non_null(gshmd_registry_find_id(&f->reg, 8));
  assert_int_equal(gshmd_registry_reap_unlinked(&f->reg), 2);
  assert_true(f->reg.restore_grace_over);
  assert_null(gshmd_registry_find_id(&f->reg, 7));
  assert_null(gshmd_registry_find_id(&f->reg, 8));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_permissions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_requests, setup, teardown),
      cmocka_unit_test_setup_teardown(test_create_resent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_create_resent_owner_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_keeps_memory_for_leases, setup, teardown),
      cmocka_unit_test_setup_teardown(test_quota, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hidden_publish, setup, teardown),
      cmocka_unit_test_setup_teardown(test_publish_lease, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hidden_duplicate_discard, setup, teardown),
      cmocka_unit_test_setup_teardown(test_published_are_indexed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_grace, setup, teardown),
  };
  gshm__log_setup("test", -1, 0);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
