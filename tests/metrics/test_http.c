/* SPDX-License-Identifier: Apache-2.0 */
/* metrics.http_listen: a real gshmd serves GET /metrics on loopback, with
 * values that follow what clients did (within the 1 s snapshot), 404
 * elsewhere, and refuses a non-loopback address at start.  One local user
 * holding slow sockets (slowloris: a request line, then a byte a second)
 * gets its own few slots and no more: root's scrapes are answered at once
 * while the attack lives (an HTTP/1.1 one too, its connection closed after
 * the answer); the attacker's own further scrapes are refused at once
 * (docs/SECURITY.md). */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "util.h"

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

/* Every wait on fd bounded by timeout_ms (connect, send, recv). */
static void bound_waits(int fd, int timeout_ms) {
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* A TCP connection to listen ("127.0.0.1:PORT", "[::1]:PORT"), each wait
 * bounded by timeout_ms; the fd or a negative errno.  No cmocka here:
 * children call it too. */
static int http_connect(const char *listen, int timeout_ms) {
  struct sockaddr_storage sa;
  socklen_t salen;
  int fd, e;

  if (gshm__parse_loopback(listen, &sa, &salen))
    return -EINVAL;
  if ((fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
    return -errno;
  bound_waits(fd, timeout_ms);
  if (connect(fd, (struct sockaddr *)&sa, salen)) {
    e = errno == EINPROGRESS || errno == EAGAIN ? -ETIMEDOUT : -errno;
    close(fd);
    return e;
  }
  return fd;
}

/* One HTTP/1.1 GET of path on fd (the connection stays open) and its
 * response, read to the end of its Content-Length.  Returns the status,
 * 0 when the server closed the connection without answering, -ETIMEDOUT
 * when a wait ran past the fd's bound, another negative errno else. */
static int http_request(int fd, const char *path) {
  char req[256], *buf = malloc(1 << 20), *end = NULL, *cl;
  size_t len = 0, want = 0;
  ssize_t n;
  int code = -EPROTO;

  if (!buf)
    return -ENOMEM;
  snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path);
  if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
    code = errno == EPIPE || errno == ECONNRESET ? 0 : -errno;
    goto out;
  }
  while (!end || len < want) {
    n = recv(fd, buf + len, (1 << 20) - 1 - len, 0);
    if (n <= 0) {
      code = n == 0 || errno == ECONNRESET ? 0 : errno == EAGAIN ? -ETIMEDOUT : -errno;
      goto out;
    }
    len += (size_t)n;
    buf[len] = '\0';
    if (!end && (end = strstr(buf, "\r\n\r\n"))) {
      cl = strcasestr(buf, "\r\nContent-Length:");
      want = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 17, NULL, 10) : 0);
    }
  }
  code = -EPROTO;
  sscanf(buf, "HTTP/1.%*d %d", &code);
out:
  free(buf);
  return code;
}

/* A one-shot scrape of /metrics, every wait bounded by timeout_ms: as
 * http_request. */
static int scrape(const char *listen, int timeout_ms) {
  int fd = http_connect(listen, timeout_ms), code;
  if (fd < 0)
    return fd;
  code = http_request(fd, "/metrics");
  close(fd);
  return code;
}

static double ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

#define SLOW_SOCKETS 24 /* more than the 16 slots the endpoint once had in all */
#define SCRAPE_DEADLINE_MS 2000

struct slow {
  char listen[64];
};

/* The attacker (as nobody): SLOW_SOCKETS connections that each send a
 * request line and then one header byte a second, until the parent's
 * step.  Exits with how many of them the server still held then. */
static void slow_sockets(struct harness_kid *k, void *arg) {
  static const char head[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
  const struct slow *sl = arg;
  struct pollfd p = {.fd = k->in, .events = POLLIN};
  int fds[SLOW_SOCKETS], held = 0;
  char c;

  for (int i = 0; i < SLOW_SOCKETS; i++) {
    if ((fds[i] = http_connect(sl->listen, 2000)) < 0)
      _exit(121);
    send(fds[i], head, sizeof(head) - 1, MSG_NOSIGNAL);
  }
  if (harness_kid_step(k->out))
    _exit(122);
  while (poll(&p, 1, 1000) == 0)
    for (int i = 0; i < SLOW_SOCKETS; i++)
      send(fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  for (int i = 0; i < SLOW_SOCKETS; i++)
    if (recv(fds[i], &c, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && errno == EAGAIN)
      held++;
  _exit(held);
}

/* A scrape as nobody (arg: the listen address): 0 answered 200, 1 refused at once
 * (closed without an answer), 2 no answer within SCRAPE_DEADLINE_MS, 3
 * anything else. */
static int nobody_scrapes(const char *arg) {
  struct timespec t0;
  int code;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  code = scrape(arg, SCRAPE_DEADLINE_MS);
  if (code == 200)
    return 0;
  if (code == 0 && ms_since(&t0) < SCRAPE_DEADLINE_MS)
    return 1;
  return code == -ETIMEDOUT ? 2 : 3;
}

/* attack4 (docs/SECURITY.md): one local user's slow sockets once held all
 * 16 connections of the endpoint, and every scrape timed out while they
 * lived.  host: the loopback address to listen on. */
static void slow_sockets_of_one_user(void **state, const char *host) {
  struct harness_kid k;
  struct slow sl;
  struct timespec t0;
  char port_arg[128];
  int fd, code;

  snprintf(sl.listen, sizeof(sl.listen), "%s:%d", host, free_port());
  snprintf(port_arg, sizeof(port_arg), "metrics.http_listen=%s", sl.listen);
  /* The fixture's gshmd is killed at exit should a check fail. */
  assert_non_null(harness_cmocka_start(state, sizeof(struct harness),
                                       (const char *const[]){"--set", port_arg, NULL}));
  assert_int_equal(harness_kid_start(&k, HARNESS_NOBODY, HARNESS_NOBODY, slow_sockets, &sl), 0);
  assert_true(harness_kid_await(k.from_kid, 10000));
  usleep(300 * 1000); /* gshmd takes (or refuses) them all */

  /* root: a one-shot scrape, at once. */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(scrape(sl.listen, SCRAPE_DEADLINE_MS), 200);
  assert_true(ms_since(&t0) < SCRAPE_DEADLINE_MS);
  /* root: an HTTP/1.1 (keep-alive) scrape is answered, and the connection
   * closed after it, so that no idle connection holds a slot. */
  fd = http_connect(sl.listen, SCRAPE_DEADLINE_MS);
  assert_true(fd >= 0);
  assert_int_equal(http_request(fd, "/metrics"), 200);
  assert_int_equal(http_request(fd, "/metrics"), 0);
  close(fd);
  /* nobody, whose slots the attack holds: refused at once. */
  assert_int_equal(harness_as_nobody(nobody_scrapes, sl.listen), 1);

  /* The attack was alive throughout: its first 4 sockets still held. */
  assert_int_equal(harness_kid_step(k.to_kid), 0);
  assert_int_equal(harness_kid_wait(&k), 4);
  /* Its slots come back once gshmd has seen its sockets close. */
  for (int i = 0; i < 50 && (code = harness_as_nobody(nobody_scrapes, sl.listen)) == 1; i++)
    usleep(20 * 1000);
  assert_int_equal(code, 0);
  assert_int_equal(harness_cmocka_teardown(state), 0);
}

static void test_slow_sockets_of_one_user(void **state) {
  slow_sockets_of_one_user(state, "127.0.0.1");
}

/* The same over IPv6 (sock_diag's AF_INET6 lookup). */
static void test_slow_sockets_of_one_user_ipv6(void **state) {
  slow_sockets_of_one_user(state, "[::1]");
}

/* The ordinary slots: the endpoint's 64 less the 8 kept for admins. */
#define ORDINARY_SLOTS 56
#define MANY_UIDS 16 /* a subordinate uid range's worth: 16 x 4 filled all 64 */
#define FIRST_UID 231072

/* A kid's scrape (arg: a struct slow): exits with nobody_scrapes' code. */
static void scrape_kid(struct harness_kid *k, void *arg) {
  (void)k;
  _exit(nobody_scrapes(((struct slow *)arg)->listen));
}

/* nobody_scrapes as uid (primary group gid, no other groups). */
static int scrape_as_uid(struct slow *sl, uid_t uid, gid_t gid) {
  struct harness_kid k;

  assert_int_equal(harness_kid_start(&k, uid, gid, scrape_kid, sl), 0);
  return harness_kid_wait(&k);
}

/* A user of the passwd database (not root, not nobody) whose primary group
 * is neither root's nor nobody's: the admin group's member for the test. */
static const struct passwd *some_user(void) {
  const struct passwd *pw;

  setpwent();
  while ((pw = getpwent()))
    if (pw->pw_uid != 0 && pw->pw_uid != HARNESS_NOBODY && pw->pw_gid != 0 &&
        pw->pw_gid != HARNESS_NOBODY && getgrgid(pw->pw_gid))
      break;
  endpwent();
  return pw;
}

/* attack22: 16 uids (a user's subordinate range) with 4 slow sockets each
 * held all 64 connections, and root's scrape was refused.  Now the last 8
 * are kept for root and daemon.admin_group: the 16 uids get 56 in all,
 * root and a member of the admin group are answered, another user is
 * refused at once. */
static void test_admin_slots_kept_from_many_uids(void **state) {
  struct harness_kid k[MANY_UIDS];
  const struct passwd *pw = some_user();
  struct slow sl;
  char port_arg[128], admin_arg[128];
  uid_t admin_uid;
  gid_t admin_gid;
  int held = 0, code;

  if (!pw)
    skip(); /* no user to make an admin of */
  admin_uid = pw->pw_uid;
  admin_gid = pw->pw_gid;
  snprintf(sl.listen, sizeof(sl.listen), "127.0.0.1:%d", free_port());
  snprintf(port_arg, sizeof(port_arg), "metrics.http_listen=%s", sl.listen);
  snprintf(admin_arg, sizeof(admin_arg), "daemon.admin_group=%s", getgrgid(admin_gid)->gr_name);
  assert_non_null(harness_cmocka_start(state, sizeof(struct harness),
                                       (const char *const[]){"--set", port_arg, "--set",
                                                             admin_arg, NULL}));
  for (int i = 0; i < MANY_UIDS; i++)
    assert_int_equal(harness_kid_start(&k[i], FIRST_UID + i, FIRST_UID + i, slow_sockets, &sl),
                     0);
  for (int i = 0; i < MANY_UIDS; i++)
    assert_true(harness_kid_await(k[i].from_kid, 10000));
  usleep(300 * 1000); /* gshmd takes (or refuses) them all */

  assert_int_equal(scrape(sl.listen, SCRAPE_DEADLINE_MS), 200);   /* root */
  assert_int_equal(scrape_as_uid(&sl, admin_uid, admin_gid), 0); /* the admin group */
  assert_int_equal(harness_as_nobody(nobody_scrapes, sl.listen), 1); /* refused at once */

  for (int i = 0; i < MANY_UIDS; i++) {
    assert_int_equal(harness_kid_step(k[i].to_kid), 0);
    code = harness_kid_wait(&k[i]);
    assert_true(code >= 0 && code <= 4);
    held += code;
  }
  assert_int_equal(held, ORDINARY_SLOTS);
  assert_int_equal(harness_cmocka_teardown(state), 0);
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
      cmocka_unit_test(test_slow_sockets_of_one_user),
      cmocka_unit_test(test_slow_sockets_of_one_user_ipv6),
      cmocka_unit_test(test_admin_slots_kept_from_many_uids),
      cmocka_unit_test(test_refuses_non_loopback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
