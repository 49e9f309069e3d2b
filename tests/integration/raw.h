/* SPDX-License-Identifier: Apache-2.0 */
/* Integration tests' raw protocol connection to gshmd (cmocka asserts),
 * for what libgshm would not send or would read for them. */
#ifndef GSHM_TESTS_RAW_H
#define GSHM_TESTS_RAW_H

#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

/* The next reply on a raw connection, unpacked (free it with
 * gshm__reply__free_unpacked); the fds it carried are closed. */
static inline Gshm__Reply *raw_reply(int fd) {
  static uint8_t buf[GSHM_WIRE_MAX_PACKET + 1];
  int fds[4], nfds = 0;
  ssize_t len = gshm__wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds, 0);
  struct gshm_wire_header hdr;
  Gshm__Reply *r;

  assert_true(len > 0);
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  assert_int_equal(gshm__wire_parse_header(buf, (size_t)len, &hdr), 0);
  assert_non_null(r = gshm__reply__unpack(NULL, hdr.length, buf + GSHM_WIRE_HEADER_SIZE));
  return r;
}

/* A connection to the socket at path, nothing sent: its fd, or -1 (no
 * assert: usable from a test's own threads). */
static inline int raw_socket(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
    return fd;
  if (fd >= 0)
    close(fd);
  return -1;
}

/* A raw connection that said hello (its Welcome read). */
static inline int raw_connect(const char *path) {
  Gshm__Hello hm = GSHM__HELLO__INIT;
  int fd = raw_socket(path);
  Gshm__Reply *welcome;

  assert_true(fd >= 0);
  hm.major = GSHM_PROTO_MAJOR;
  hm.client_name = "raw";
  assert_int_equal(gshm__wire_send(fd, GSHM_WIRE_HELLO, 1, &hm.base, -1), 0);
  welcome = raw_reply(fd);
  assert_int_equal(welcome->status, GSHM__STATUS__STATUS_OK);
  gshm__reply__free_unpacked(welcome, NULL);
  return fd;
}

#endif
