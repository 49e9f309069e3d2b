/* SPDX-License-Identifier: Apache-2.0 */
/* Packet framing, fd passing and the status table. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "errors.h"
#include "wire.h"

static void test_pack_parse_roundtrip(void **state) {
  Gshm__Hello m = GSHM__HELLO__INIT;
  uint8_t buf[256];
  struct gshm_wire_header h;
  size_t len;
  Gshm__Hello *back;

  (void)state;
  m.major = 1;
  m.minor = 7;
  m.client_name = "unit";
  assert_int_equal(gshm__wire_pack(GSHM_WIRE_HELLO, 42, &m.base, buf, sizeof(buf), &len), 0);
  assert_int_equal(gshm__wire_parse_header(buf, len, &h), 0);
  assert_int_equal(h.magic, GSHM_WIRE_MAGIC);
  assert_int_equal(h.type, GSHM_WIRE_HELLO);
  assert_int_equal(h.request_id, 42);
  assert_int_equal(h.length, len - GSHM_WIRE_HEADER_SIZE);
  back = gshm__hello__unpack(NULL, h.length, buf + GSHM_WIRE_HEADER_SIZE);
  assert_non_null(back);
  assert_int_equal(back->minor, 7);
  assert_string_equal(back->client_name, "unit");
  gshm__hello__free_unpacked(back, NULL);
}

static void test_parse_rejects(void **state) {
  uint8_t buf[64] = {0};
  struct gshm_wire_header h = {.magic = GSHM_WIRE_MAGIC, .major = 1, .type = 1, .length = 8};

  (void)state;
  assert_int_equal(gshm__wire_parse_header(buf, 10, &h), -EPROTO); /* short */
  memcpy(buf, &h, sizeof(h));
  assert_int_equal(gshm__wire_parse_header(buf, 16 + 8, &h), 0);
  assert_int_equal(gshm__wire_parse_header(buf, 16 + 7, &h), -EBADMSG); /* length lies */
  h.magic = 0xdeadbeef;
  memcpy(buf, &h, sizeof(h));
  assert_int_equal(gshm__wire_parse_header(buf, 16 + 8, &h), -EBADMSG);
}

static void test_pack_too_big(void **state) {
  static char name[70000];
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1024];
  Gshm__Hello m = GSHM__HELLO__INIT;
  size_t len;

  (void)state;
  memset(name, 'x', sizeof(name) - 1);
  m.client_name = name;
  assert_int_equal(gshm__wire_pack(1, 1, &m.base, buf, sizeof(buf), &len), -EMSGSIZE);
}

static void test_fd_passing_and_extra_fds_closed(void **state) {
  int sv[2], fds[4], nfds = 0, devnull = open("/dev/null", O_RDONLY);
  uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  ssize_t n;

  (void)state;
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  assert_int_equal(gshm__wire_send(sv[0], GSHM_WIRE_STATUS, 1, NULL, devnull), 0);
  n = gshm__wire_recv(sv[1], buf, sizeof(buf), fds, 4, &nfds, 0);
  assert_int_equal(n, GSHM_WIRE_HEADER_SIZE);
  assert_int_equal(nfds, 1);
  assert_true(fcntl(fds[0], F_GETFD) & FD_CLOEXEC); /* MSG_CMSG_CLOEXEC */
  close(fds[0]);

  /* More fds than the caller takes: the rest are closed, not leaked. */
  {
    int many[8];
    char ctl[CMSG_SPACE(sizeof(many))];
    struct iovec iov = {.iov_base = buf, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                        .msg_controllen = sizeof(ctl)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    for (int i = 0; i < 8; i++)
      many[i] = devnull;
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(many));
    memcpy(CMSG_DATA(c), many, sizeof(many));
    assert_int_equal(sendmsg(sv[0], &mh, 0), 1);
    n = gshm__wire_recv(sv[1], buf, sizeof(buf), fds, 2, &nfds, 0);
    assert_int_equal(n, 1);
    assert_int_equal(nfds, 2);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    /* The 6 others were closed inside: the next fd number is low again. */
    {
      int probe = dup(devnull);
      assert_true(probe < devnull + 4);
      close(probe);
    }
  }
  /* An oversize packet is reported as such. */
  {
    static uint8_t big[GSHM_WIRE_MAX_PACKET + 100];
    assert_int_equal(send(sv[0], big, sizeof(big), 0), (ssize_t)sizeof(big));
    n = gshm__wire_recv(sv[1], buf, GSHM_WIRE_MAX_PACKET + 1, fds, 4, &nfds, 0);
    assert_int_equal(n, -EMSGSIZE);
  }
  close(sv[0]);
  close(sv[1]);
  close(devnull);
}

static void test_status_table(void **state) {
  (void)state;
  assert_int_equal(gshm__status_to_errno(GSHM__STATUS__STATUS_OK), 0);
  assert_int_equal(gshm__status_to_errno(GSHM__STATUS__STATUS_NOT_FOUND), -ENOENT);
  assert_int_equal(gshm__status_to_errno(GSHM__STATUS__STATUS_QUOTA_EXCEEDED), -EDQUOT);
  assert_int_equal(gshm__status_to_errno(GSHM__STATUS__STATUS_UNSPECIFIED), -EPROTO);
  assert_int_equal(gshm__status_to_errno(999), -EPROTO);
  /* Every errno in the status table round-trips. */
  {
    static const int errs[] = {EINVAL, ENOENT, EEXIST, EACCES, ENOMEM, EDQUOT, ENOTSUP,
                               EPROTO, EPROTONOSUPPORT, ENAMETOOLONG, EFBIG, EMFILE, EIO,
                               ENODEV, ESTALE, EPERM, EBUSY, EREMOTEIO};
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
      assert_int_equal(gshm__status_to_errno(gshm__errno_to_status(-errs[i])), -errs[i]);
  }
  /* errnos without a status of their own */
  assert_int_equal(gshm__errno_to_status(-EXDEV), GSHM__STATUS__STATUS_NOT_SUPPORTED);
  assert_int_equal(gshm__errno_to_status(-EAGAIN), GSHM__STATUS__STATUS_LIMIT);
  assert_int_equal(gshm__errno_to_status(-ERANGE), GSHM__STATUS__STATUS_INTERNAL);
  /* a daemon's internal error is no protocol error */
  assert_int_equal(gshm__status_to_errno(GSHM__STATUS__STATUS_INTERNAL), -EREMOTEIO);
  assert_int_equal(gshm__status_to_errno(gshm__errno_to_status(-EHOSTUNREACH)), -EREMOTEIO);
  assert_string_equal(gshm__errname(-EDQUOT), "EDQUOT");
  assert_string_equal(gshm__strerror(-EACCES), "permission denied");
  /* Every row of the table has its own name and message (a value listed
   * twice would not compile: the switch would repeat a case). */
#define CHECK_ROW(e, msg)                               \
  assert_string_equal(gshm__errname(-(e)), #e);         \
  assert_string_equal(gshm__errname(e), #e);            \
  assert_string_equal(gshm__strerror(-(e)), msg);
  GSHM_ERRNO_MAP(CHECK_ROW)
#undef CHECK_ROW
  assert_string_equal(gshm__errname(-EOPNOTSUPP), "ENOTSUP"); /* one value on Linux */
  assert_string_equal(gshm__errname(-EXDEV), "EXDEV");       /* no peer path */
  assert_string_equal(gshm__errname(-12345), "E?");
  assert_string_equal(gshm__strerror(-12345), "unknown error");
}

/* gshm__wire_fields_over: every tag counted, up to max + 1 of them; a
 * body malformed before that is not over (its decoder refuses it). */
static void test_fields_over(void **state) {
  uint8_t b[600];
  size_t n = 0;

  (void)state;
  for (int i = 0; i < 64; i++) { /* 64 fields of each wire type in turn */
    switch (i % 4) {
    case 0: b[n++] = 0x08; b[n++] = 0x96; b[n++] = 0x01; break;          /* 1: varint 150 */
    case 1: b[n++] = 0x12; b[n++] = 2; b[n++] = 'a'; b[n++] = 'b'; break; /* 2: bytes */
    case 2: b[n++] = 0x19; memset(b + n, 0, 8); n += 8; break;              /* 3: 64-bit */
    case 3: b[n++] = 0x25; memset(b + n, 0, 4); n += 4; break;              /* 4: 32-bit */
    }
  }
  assert_false(gshm__wire_fields_over(b, n, 64));
  assert_true(gshm__wire_fields_over(b, n, 63));
  assert_false(gshm__wire_fields_over(b, 0, 0));
  b[n++] = 0x08; /* a 65th, cut short: over all the same */
  assert_true(gshm__wire_fields_over(b, n, 64));
  /* malformed within the count: a length past the end, a group */
  assert_false(gshm__wire_fields_over((const uint8_t[]){0x12, 5, 'a'}, 3, 64));
  assert_false(gshm__wire_fields_over((const uint8_t[]){0x0b, 0x0c}, 2, 64));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack_parse_roundtrip),
      cmocka_unit_test(test_parse_rejects),
      cmocka_unit_test(test_pack_too_big),
      cmocka_unit_test(test_fd_passing_and_extra_fds_closed),
      cmocka_unit_test(test_status_table),
      cmocka_unit_test(test_fields_over),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
