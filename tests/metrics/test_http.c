/* SPDX-License-Identifier: Apache-2.0 */
/* metrics.http_listen: a real gshmd serves GET /metrics on loopback, with
 * values that follow what clients did (within the 1 s snapshot), 404
 * elsewhere, and refuses a non-loopback address at start. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"

/* A port that was free a moment ago. */
static int free_port(void) {
  int port = harness_free_port();
  assert_true(port > 0);
  return port;
}

/* GET path; returns the status code and the body in *body. */
static int http_get(int port, const char *path, char **body) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  char req[256], *buf = malloc(1 << 20), *p;
  size_t len = 0;
  ssize_t n;
  int fd = socket(AF_INET, SOCK_STREAM, 0), code = -1;

  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
  assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
  while ((n = read(fd, buf + len, (1 << 20) - 1 - len)) > 0)
    len += (size_t)n;
  buf[len] = '\0';
  close(fd);
  sscanf(buf, "HTTP/1.%*d %d", &code);
  p = strstr(buf, "\r\n\r\n");
  *body = strdup(p ? p + 4 : "");
  free(buf);
  return code;
}

static void test_serves_metrics(void **state) {
  struct harness h;
  char listen[64], port_arg[128], *body = NULL;
  int port = free_port();
  gshm_client_t *c;
  gshm_segment_t *s;

  (void)state;
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
  snprintf(port_arg, sizeof(port_arg), "metrics.http_listen=%s", listen);
  assert_int_equal(harness_start(&h, (const char *const[]){"--set", port_arg, NULL}), 0);
  assert_int_equal(http_get(port, "/metrics", &body), 200);
  assert_non_null(strstr(body, "gshm_up 1\n"));
  assert_non_null(strstr(body, "gshm_segments 0\n"));
  free(body);

  assert_int_equal(gshm_connect(h.socket_path, "http", &c), 0);
  assert_int_equal(gshm_create(c, "h/one", 4096, NULL, 0600, 0, &s), 0);
  /* The snapshot is refreshed every second. */
  for (int i = 0; i < 40; i++) {
    assert_int_equal(http_get(port, "/metrics", &body), 200);
    if (strstr(body, "gshm_segments 1\n"))
      break;
    free(body);
    body = NULL;
    usleep(100 * 1000);
  }
  assert_non_null(body);
  assert_non_null(strstr(body, "gshm_segment_bytes{location=\"host\"} 4096\n"));
  free(body);
  assert_int_equal(http_get(port, "/other", &body), 404);
  free(body);
  gshm_close(s);
  gshm_disconnect(c);
  assert_int_equal(harness_stop(&h), 0);
}

static void test_refuses_non_loopback(void **state) {
  struct harness h;
  (void)state;
  /* gshmd exits with an error before READY: the harness reports -ECHILD. */
  assert_int_equal(harness_start(&h, (const char *const[]){"--set",
                                                            "metrics.http_listen=0.0.0.0:9477",
                                                            NULL}),
                   -ECHILD);
  gshm__spawn_cleanup(&h.sp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serves_metrics),
      cmocka_unit_test(test_refuses_non_loopback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
