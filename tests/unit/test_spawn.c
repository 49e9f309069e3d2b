/* SPDX-License-Identifier: Apache-2.0 */
/* common/spawn.c's fd store, as the service manager's part: datagrams are
 * handled in the order gshmd sent them, whoever drains the notify socket
 * (its thread, or gshm__spawn_poll / gshm__spawn_stop in the caller's). */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "spawn.h"
#include "wire.h"

#define PAIRS 20000

struct sender {
  const char *path;
  int null_fd;
  int sent; /* pairs sent (the sender's until done) */
  _Atomic bool done;
};

/* Stores "x<i>" and removes it at once, PAIRS times: every entry sent is
 * removed by the datagram after it. */
static void *send_pairs(void *arg) {
  struct sender *sd = arg;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  char msg[64];

  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sd->path);
  if (sock >= 0 && connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(sock);
    sock = -1;
  }
  /* (blocking sends: a full queue waits for the drainers, as sd_notify) */
  for (int i = 0; sock >= 0 && i < PAIRS; i++) {
    int n = snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=x%d", i);
    if (gshm__wire_sendmsg(sock, msg, (size_t)n, sd->null_fd))
      break;
    n = snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=x%d", i);
    if (gshm__wire_sendmsg(sock, msg, (size_t)n, -1))
      break;
    sd->sent = i + 1;
  }
  if (sock >= 0)
    close(sock);
  sd->done = true;
  return NULL;
}

/* The caller drains too while the thread does (gshm__spawn_stop does,
 * after a kill): an entry removed right after it was stored must not stay
 * (its removal handled before it). */
static void test_concurrent_drains_keep_order(void **state) {
  struct gshm_spawn s;
  struct sender sd = {.done = false};
  pthread_t t;
  int left = 0;
  (void)state;

  assert_int_equal(gshm__spawn_init(&s), 0);
  sd.path = s.notify_path;
  assert_true((sd.null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
  assert_int_equal(pthread_create(&t, NULL, send_pairs, &sd), 0);
  while (!sd.done)
    gshm__spawn_poll(&s, 0);
  pthread_join(t, NULL);
  gshm__spawn_poll(&s, 50);
  pthread_mutex_lock(&s.lock);
  for (int i = 0; i < s.nfds; i++)
    left += s.names[i][0] == 'x';
  pthread_mutex_unlock(&s.lock);
  close(sd.null_fd);
  gshm__spawn_cleanup(&s);
  assert_int_equal(sd.sent, PAIRS);
  assert_int_equal(left, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_drains_keep_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
