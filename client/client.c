/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm: connection, requests, leases and the lease cache. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "errors.h"
#include "fork.h"
#include "log.h"
#include "util.h"

#define DEFAULT_RECONNECT_MS 10000
/* How long a hello waits for gshmd ($GSHM_HELLO_TIMEOUT_MS): a gshmd that
 * is stopped (SIGSTOP, a debugger) or a socket that accepts and never
 * answers would hold gshm_connect, and every gshmctl verb, for ever.  A
 * hello sent to systemd's socket (gshmd.socket) while gshmd starts or
 * restarts waits for its whole start: the CUDA driver's initialisation of
 * every GPU (seconds per GPU where no persistence daemon holds them) and
 * the restore (16,000 segments in 67 ms: docs/PERFORMANCE.md "Restart at
 * scale").  30 s leaves a slow start room; before this bound such a hello
 * waited for ever, and a stopped gshmd held its caller as long. */
#define DEFAULT_HELLO_TIMEOUT_MS 30000

/* The most milliseconds $GSHM_RECONNECT_MS and $GSHM_HELLO_TIMEOUT_MS
 * take (a day; gshm.h): within an int, and within a timeval. */
#define ENV_MS_MAX 86400000

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static const char forked_error[] =
    "this client was connected before a fork: a forked process connects its own";

/* The explanation of this thread's last request, and the client (address
 * and serial) it was made on: what gshm_last_error gives the thread that
 * made the request, whatever other threads' requests on the same client
 * wrote into client->last_error since. */
static __thread struct {
  const struct gshm_client *client;
  uint64_t serial;
  char text[sizeof(((struct gshm_client *)0)->last_error)];
} thread_error;

static atomic_uint_fast64_t connects;
/* a bad $GSHM_RECONNECT_MS, $GSHM_HELLO_TIMEOUT_MS, $GSHM_POLL_US,
 * $GSHM_LIST_MAX was logged (env_count) */
static atomic_bool reconnect_told, hello_told, poll_told, list_max_told;

void gshm__last_error_local(struct gshm_client *c) {
  thread_error.client = c;
  thread_error.serial = c->serial;
  thread_error.text[0] = '\0';
}

/* Writes c's explanation of the calling thread's request (NULL: none). */
static void set_last_error(struct gshm_client *c, const char *msg) {
  snprintf(c->last_error, sizeof(c->last_error), "%s", msg ? msg : "");
  thread_error.client = c;
  thread_error.serial = c->serial;
  memcpy(thread_error.text, c->last_error, sizeof(thread_error.text));
}

/* A client remembers the count of forks (common/fork.h) it was connected
 * under. */
bool gshm__forked(struct gshm_client *c) {
  if (c->fork_gen == gshm__fork_gen())
    return false;
  set_last_error(c, forked_error);
  return true;
}

int gshm__client_lock(struct gshm_client *c) {
  if (c->fork_gen == gshm__fork_gen()) {
    pthread_mutex_lock(&c->lock);
    return 0;
  }
  return pthread_mutex_trylock(&c->lock) ? -ECHILD : 0;
}

int gshm__client_unlock(struct gshm_client *c) {
  struct device_map *retired = c->retired;

  c->retired = NULL;
  pthread_mutex_unlock(&c->lock);
  return retired ? gshm__retire_device_maps(c, retired, false) : 0;
}

/* v as a count: decimal digits alone, min to max, into *out.  False for
 * anything else (a sign, a space, junk after the digits, a number past
 * max): atoi and strtol took "10s" as 10, junk as 0, and strtoul "-1" as
 * ULONG_MAX. */
static bool env_digits(const char *v, unsigned long long min, unsigned long long max,
                       unsigned long long *out) {
  unsigned long long n;
  char *end = NULL;

  if (*v < '0' || *v > '9')
    return false;
  errno = 0;
  n = strtoull(v, &end, 10);
  if (*end || errno || n < min || n > max)
    return false;
  *out = n;
  return true;
}

/* The library is silent unless $GSHM_LOG_LEVEL asks (docs/ARCHITECTURE.md
 * "Errors and logging").  Every variable the library reads goes through
 * secure_getenv: in a setuid or setgid program (AT_SECURE) the caller's
 * environment must not choose the socket, the reconnect policy or what is
 * written to stderr. */
static void log_init(void) {
  const char *v = secure_getenv("GSHM_LOG_LEVEL");
  unsigned long long level;

  if (!v || !*v) {
    gshm__log_setup("libgshm", -1, 0);
    return;
  }
  if (env_digits(v, 0, GSHM_LOG_DEBUG, &level)) {
    gshm__log_setup("libgshm", (int)level, 0);
    return;
  }
  /* atoi took "4x" as 4 and junk as 0 (emergencies only): a set but bad
   * value says so once, here, where the caller asked for a log, and the
   * library is silent after it (gshm.h) */
  gshm__log_setup("libgshm", GSHM_LOG_WARNING, 0);
  gshm_log_warn("$GSHM_LOG_LEVEL=\"%.40s\" is not a syslog priority from 0 to %d: libgshm "
                "logs nothing",
                v, GSHM_LOG_DEBUG);
  gshm__log_setup("libgshm", -1, 0);
}

const char *gshm_strerror(int err) { return gshm__strerror(err); }

const char *gshm_err_name(int err) { return gshm__errname(err); }

const char *gshm_last_error(gshm_client_t *client) {
  /* A copy per thread, taken under the lock: another thread's request
   * rewrites client->last_error meanwhile. */
  static __thread char copy[sizeof(client->last_error)];

  if (!client)
    return "";
  if (client->fork_gen != gshm__fork_gen()) /* every call of it here said -ECHILD */
    return forked_error;
  if (thread_error.client == client && thread_error.serial == client->serial) {
    memcpy(copy, thread_error.text, sizeof(copy)); /* this thread's own request's */
    return copy;
  }
  if (gshm__client_lock(client))
    return forked_error; /* the lock went with a thread of the parent */
  memcpy(copy, client->last_error, sizeof(copy));
  pthread_mutex_unlock(&client->lock);
  return copy;
}

void gshm_free(void *p) { free(p); }

/* A name past GSHM_NAME_MAX, refused before any request: says so in
 * gshm_last_error() as gshmd would (else it kept an older call's text).
 * Every call that takes a segment name asks it first, so that one
 * condition gives one errno: gshmd looks a name up before it checks it
 * (a long name was -ENOENT to stat, chmod, chown and revoke, and one
 * over a packet -EMSGSIZE, while open, create and unlink said
 * -ENAMETOOLONG).  Returns -ENAMETOOLONG, or 0 for a name that fits. */
int gshm__name_check_len(struct gshm_client *c, const char *name) {
  int e;

  if (strlen(name) <= GSHM_NAME_MAX)
    return 0;
  if ((e = gshm__client_lock(c))) /* (a forked child's: -ECHILD) */
    return e;
  {
    char text[64];
    snprintf(text, sizeof(text), "name is longer than %d bytes", GSHM_NAME_MAX);
    set_last_error(c, text);
  }
  pthread_mutex_unlock(&c->lock);
  return -ENAMETOOLONG;
}

static int socket_connect(const char *path, int *fd_out) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd, e;

  if (strlen(path) >= sizeof(sa.sun_path))
    return -ENAMETOOLONG;
  strcpy(sa.sun_path, path);
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    e = -errno;
    close(fd);
    return e;
  }
  *fd_out = fd;
  return 0;
}

/* Applies an unasked event from the daemon to the lease cache. */
static void apply_event(struct gshm_client *c, const uint8_t *body, size_t len) {
  Gshm__Event *ev = gshm__event__unpack(NULL, len, body);

  if (!ev)
    return;
  for (struct gshm__lease *l = c->leases; l; l = l->next) {
    if (l->info.id != ev->segment_id)
      continue;
    l->unlinked = true;
    l->info.unlinked = 1;
    if (ev->kind == GSHM__EVENT_KIND__EVENT_KIND_REVOKED)
      l->revoked = true;
  }
  gshm_log_debug("event %d for segment %" PRIu64, ev->kind, ev->segment_id);
  gshm__event__free_unpacked(ev, NULL);
}

/* Sends PULL_CANCEL for the PULL of request pull_id with request id 0:
 * no reply of its own; the PULL's own answer says how it ended.  A failed
 * send is the connection's end, which the wait sees next. */
static void send_pull_cancel(struct gshm_client *c, uint32_t pull_id) {
  Gshm__PullCancel m = GSHM__PULL_CANCEL__INIT;

  m.request_id = pull_id;
  (void)gshm__wire_send(c->fd, GSHM_WIRE_PULL_CANCEL, 0, &m.base, -1);
}

/* The wait of PULL pull_id for its next packet (struct gshm__pull_wait): poll(2)
 * in steps of GSHM_PULL_WAKE_MS, sending the cancel gshm_pull_cancel asked
 * for before each step, and calling on_signal when a signal cut one short
 * (poll is never restarted after a handler: signal(7)).  Returns 0 once
 * c->fd is readable (or hung up: the read then says so), or -errno of a
 * failed poll. */
static int pull_wait_readable(struct gshm_client *c, uint32_t pull_id) {
  for (;;) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int r;

    if (atomic_exchange(&c->pull_cancel, false))
      send_pull_cancel(c, pull_id);
    r = poll(&p, 1, GSHM_PULL_WAKE_MS);
    if (r > 0)
      return 0;
    if (r < 0 && errno != EINTR)
      return -errno;
    if (r < 0 && c->pull_wait->on_signal)
      c->pull_wait->on_signal(c->pull_wait->arg);
  }
}

/* Receives one packet: a blocking recvmsg, after polling for up to
 * c->poll_ns.  gshmd answers most requests in a few microseconds; a thread
 * that sleeps in recvmsg pays the scheduler's wake-up on top, a large part
 * of an open (docs/PERFORMANCE.md, Attach).  pull_id, not 0: the PULL
 * whose replies this waits for, which waits through pull_wait_readable.
 * Returns what gshm__wire_recv does, or a failed poll's -errno. */
static ssize_t recv_polling(struct gshm_client *c, int *fds, int *nfds, uint32_t pull_id) {
  int e;

  if (c->poll_ns > 0) {
    int64_t deadline = gshm__now_ns(CLOCK_MONOTONIC) + c->poll_ns;
    do {
      ssize_t n = gshm__wire_recv(c->fd, c->rx, sizeof(c->rx), fds, 4, nfds, MSG_DONTWAIT);
      if (n != -EAGAIN && n != -EWOULDBLOCK)
        return n;
    } while (gshm__now_ns(CLOCK_MONOTONIC) < deadline);
  }
  if (pull_id && (e = pull_wait_readable(c, pull_id)))
    return e;
  return gshm__wire_recv(c->fd, c->rx, sizeof(c->rx), fds, 4, nfds, 0);
}

/* Reads packets until the reply to request_id; events on the way are
 * applied.  Returns 0 with *reply_out, or a negative errno (-ECONNRESET
 * when the daemon closed the connection). */
static int read_reply(struct gshm_client *c, uint32_t request_id, uint16_t type,
                      Gshm__Reply **reply_out, int *fd_out, int flags_dontwait) {
  for (;;) {
    struct gshm_wire_header h;
    int fds[4], nfds = 0, kept = 0, e = 0;
    bool event = false;
    ssize_t n;

    /* dontwait: only what is already queued (events), one syscall. */
    n = flags_dontwait ? gshm__wire_recv(c->fd, c->rx, sizeof(c->rx), fds, 4, &nfds, MSG_DONTWAIT)
                       : recv_polling(c, fds, &nfds,
                                      c->pull_wait && type == GSHM_WIRE_PULL ? request_id : 0);
    if (n <= 0)
      e = n == 0 ? -ECONNRESET : (int)n;
    else if (gshm__wire_parse_header(c->rx, (size_t)n, &h) || h.major != GSHM_PROTO_MAJOR)
      e = -EPROTO;
    else if ((event = h.type == GSHM_WIRE_EVENT))
      apply_event(c, c->rx + GSHM_WIRE_HEADER_SIZE, h.length);
    else if (flags_dontwait || h.type != (type | GSHM_WIRE_REPLY) || h.request_id != request_id)
      e = -EPROTO;
    else if (!(*reply_out = gshm__reply__unpack(NULL, h.length, c->rx + GSHM_WIRE_HEADER_SIZE)))
      e = -EPROTO;
    else if (nfds && fd_out)
      *fd_out = fds[kept++]; /* exactly the fd we expect is kept */
    for (int i = kept; i < nfds; i++) /* every other one is closed */
      close(fds[i]);
    if (!event)
      return e;
  }
}

static int reconnect(struct gshm_client *c, int wait_ms);
static bool connection_lost(int e);

/* Drains events already waiting on the socket (no blocking).  A daemon
 * that went away may have sent events we never got (its restart lost
 * them): then reconnect (waiting up to reconnect_ms when `wait`, else one
 * attempt), which re-takes every lease by id and generation and marks
 * those that are gone.  Returns as client_internal.h says. */
int gshm__drain_events(struct gshm_client *c, bool wait) {
  Gshm__Reply *unused;
  int e;

  if (gshm__forked(c))
    return -ECHILD;
  e = c->fd >= 0 ? read_reply(c, 0, 0, &unused, NULL, 1) : -ENOTCONN;

  if (e && connection_lost(e)) {
    if (c->fd >= 0)
      close(c->fd);
    c->fd = -1;
    if (c->reconnect_ms <= 0)
      return -ENOTCONN;
    return reconnect(c, wait ? c->reconnect_ms : 0);
  }
  return 0;
}

/* Bounds the hello's send and receive to ms milliseconds (0: none, the
 * blocking socket's own way, which every later request keeps). */
static void hello_timeout(struct gshm_client *c, int ms) {
  struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

  (void)setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int hello(struct gshm_client *c) {
  Gshm__Hello m = GSHM__HELLO__INIT;
  Gshm__Reply *reply = NULL;
  uint32_t id = ++c->next_request;
  int e;

  m.major = GSHM_PROTO_MAJOR;
  m.minor = GSHM_PROTO_MINOR;
  m.client_name = c->name;
  m.resume_session_id = c->session_id;
  hello_timeout(c, c->hello_timeout_ms);
  if (!(e = gshm__wire_send(c->fd, GSHM_WIRE_HELLO, id, &m.base, -1)))
    e = read_reply(c, id, GSHM_WIRE_HELLO, &reply, NULL, 0);
  hello_timeout(c, 0);
  if (e == -EAGAIN || e == -EWOULDBLOCK)
    return -ETIMEDOUT; /* (gshm_connect_explain says what to look at) */
  if (e)
    return e;
  if (reply->status != GSHM__STATUS__STATUS_OK) {
    e = gshm__status_to_errno(reply->status);
    set_last_error(c, reply->message);
    gshm_log_err("gshmd refused hello: %s", reply->message);
  } else if (reply->body_case != GSHM__REPLY__BODY_WELCOME) {
    e = -EPROTO;
  } else {
    c->session_id = reply->welcome->session_id;
    c->capabilities = reply->welcome->capabilities;
  }
  gshm__reply__free_unpacked(reply, NULL);
  return e;
}

/* Keeps the grant's token (none, or one too long to be ours: none). */
static void lease_set_token(struct gshm__lease *l, const Gshm__LeaseGrant *g) {
  l->token_len = g->lease_token.len <= sizeof(l->token) ? g->lease_token.len : 0;
  if (l->token_len)
    memcpy(l->token, g->lease_token.data, l->token_len);
}

/* After the daemon came back: re-take every lease by segment id and
 * generation, with the token of its grant, so that it comes back with the
 * access it was granted whatever chmod, chown or unlink happened.  The fds
 * and mappings we hold stay valid throughout (they keep the memory alive
 * on their own); the daemon's new fd is dropped.  A lease that cannot come
 * back (revoked: its segment is gone) is marked, and calls on it fail with
 * -ESTALE from now on.  Returns 0, or the error of a connection lost
 * midway (gshmd killed again during the re-takes): the caller reconnects
 * and re-takes them all in the next gshmd; another error is left for the
 * next request to meet. */
static int retake_leases(struct gshm_client *c) {
  for (struct gshm__lease *l = c->leases; l; l = l->next) {
    Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
    Gshm__Reply *reply = NULL;
    uint32_t id = ++c->next_request;
    int fd = -1;

    if (l->hidden) { /* (gshmd keeps no hidden segment through a restart) */
      l->lease_id = 0;
      l->revoked = true;
      gshm_log_warn("hidden segment '%s' lost: gshmd restarted before its publish (unless a "
                    "publish of it under way was stored: its resend says)",
                    l->info.name);
      continue;
    }
    m.segment_id = l->info.id;
    m.generation = l->info.generation;
    m.access = l->access == GSHM_ACCESS_READ ? GSHM__ACCESS__ACCESS_READ
                                             : GSHM__ACCESS__ACCESS_READ_WRITE;
    m.name = "";
    m.lease_token.data = l->token;
    m.lease_token.len = l->token_len;
    int e;

    l->lease_id = 0;
    if ((e = gshm__wire_send(c->fd, GSHM_WIRE_OPEN, id, &m.base, -1)) ||
        (e = read_reply(c, id, GSHM_WIRE_OPEN, &reply, &fd, 0)))
      return connection_lost(e) ? e : 0;
    if (fd >= 0)
      close(fd);
    if (reply->status == GSHM__STATUS__STATUS_OK && reply->body_case == GSHM__REPLY__BODY_GRANT &&
        reply->grant) { /* (a oneof: another body in its place is no grant) */
      l->lease_id = reply->grant->lease_id;
      lease_set_token(l, reply->grant);
      l->unlinked = reply->grant->segment &&
                    reply->grant->segment->state == GSHM__SEGMENT_STATE__SEGMENT_STATE_UNLINKED;
    } else {
      l->revoked = true; /* lost across the restart */
      gshm_log_warn("lease on '%s' not re-taken: %s", l->info.name, reply->message);
    }
    gshm__reply__free_unpacked(reply, NULL);
    if (l->lease_id && l->addr) {
      char **uuids = NULL;
      size_t n = gshm__map_device_uuids(l, &uuids);
      gshm__report_mapping(c, l, uuids, n, false);
    }
  }
  return 0;
}

/* Reconnects to a daemon that went away, waiting up to wait_ms for it to
 * come back (systemd restarts it); 0: one attempt.  Connected means every
 * lease re-taken: a gshmd that dies during the re-takes is waited for
 * again, as one that died before. */
static int reconnect(struct gshm_client *c, int wait_ms) {
  struct timespec delay = {0, 10 * 1000 * 1000};
  int64_t deadline = gshm__now_ns(CLOCK_MONOTONIC) + (int64_t)wait_ms * 1000000;
  int e;

  if (c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
  }
  for (;;) {
    e = socket_connect(c->path, &c->fd);
    if (e == 0 && (e = hello(c)) == 0 && (e = retake_leases(c)) == 0)
      break;
    if (c->fd >= 0) {
      close(c->fd);
      c->fd = -1;
    }
    if (e == -EPROTONOSUPPORT || e == -EACCES || gshm__now_ns(CLOCK_MONOTONIC) > deadline)
      return e;
    nanosleep(&delay, NULL);
    if (delay.tv_nsec < 200 * 1000 * 1000)
      delay.tv_nsec *= 2;
  }
  gshm_log_info("reconnected to gshmd, session %" PRIu64, c->session_id);
  return 0;
}

static bool connection_lost(int e) {
  return e == -EPIPE || e == -ECONNRESET || e == -ENOTCONN || e == -ECONNREFUSED ||
         e == -ENOENT;
}

/* The error of a request that lost gshmd (the connection, or with
 * `unreached` the reconnect after it): -ECONNRESET or -EPIPE, as gshm.h
 * promises, with GSHM_LOST_GSHMD_TEXT, by which gshmctl and the Python
 * package tell it from a cluster peer's failure.  A reconnect's own errno
 * meant something else to the caller: -ETIMEDOUT (a restarted gshmd that
 * did not answer the hello) read as a peer's timeout in a pull, -EACCES
 * (its socket's new mode) as a segment's mode bits, -ENOTCONN had no name.
 * Kept: -EPROTO, -EPROTONOSUPPORT (a gshmd of another major version
 * came back; the hello's refusal is the last error) and -ECHILD (a
 * forked child's client).  Other errors pass. */
static int lost_gshmd(struct gshm_client *c, int e, bool unreached) {
  if (!e || !(unreached || connection_lost(e)) || e == -EPROTONOSUPPORT || e == -ECHILD)
    return e;
  if (!connection_lost(e))
    gshm_log_warn("gshmd at %s went away and reconnecting failed: %s", c->path,
                  gshm_strerror(e));
  set_last_error(c, GSHM_LOST_GSHMD_TEXT);
  return e == -EPIPE || e == -EPROTO ? e : -ECONNRESET;
}

int gshm__request(struct gshm_client *c, uint16_t type, const ProtobufCMessage *msg,
                  Gshm__Reply **reply_out, int *fd_out) {
  Gshm__Reply *reply = NULL;
  int64_t deadline = 0; /* reconnect_ms after the first loss: every resend is before it */
  bool unreached = false; /* gshmd went away and the reconnect failed */
  int e = 0;

  set_last_error(c, NULL);
  c->resent_after_loss = false;
  if (gshm__forked(c))
    return -ECHILD;
  for (;;) {
    uint32_t id;
    int fd = -1, wait_ms = c->reconnect_ms;
    bool sent;
    if (deadline) /* a gshmd killed again as it came back (a crash loop) */
      wait_ms = (int)((deadline - gshm__now_ns(CLOCK_MONOTONIC)) / 1000000);
    if (c->fd < 0 && (e = wait_ms < 0 ? -ECONNRESET : reconnect(c, wait_ms))) {
      unreached = true;
      break;
    }
    id = ++c->next_request;
    e = gshm__wire_send(c->fd, type, id, msg, -1);
    if ((sent = !e))
      e = read_reply(c, id, type, &reply, fd_out ? &fd : NULL, 0);
    if (e && connection_lost(e) && c->reconnect_ms > 0) {
      c->resent_after_loss |= sent; /* (gshmd may have done it) */
      if (!deadline)
        deadline = gshm__now_ns(CLOCK_MONOTONIC) + (int64_t)c->reconnect_ms * 1000000;
      close(c->fd);
      c->fd = -1;
      continue;
    }
    if (e)
      break;
    if (reply->status != GSHM__STATUS__STATUS_OK) {
      e = gshm__status_to_errno(reply->status);
      set_last_error(c, reply->message);
      if (fd >= 0)
        close(fd);
      gshm__reply__free_unpacked(reply, NULL);
      return e;
    }
    if (fd_out)
      *fd_out = fd;
    *reply_out = reply;
    return 0;
  }
  return lost_gshmd(c, e, unreached);
}

int gshm__request_body(struct gshm_client *c, uint16_t type, const ProtobufCMessage *msg,
                       Gshm__Reply__BodyCase want, Gshm__Reply **reply_out) {
  Gshm__Reply *reply = NULL;
  int e;

  if ((e = gshm__client_lock(c)))
    return e;
  e = gshm__request(c, type, msg, &reply, NULL);
  pthread_mutex_unlock(&c->lock);
  if (e)
    return e;
  if (want != GSHM__REPLY__BODY__NOT_SET && reply->body_case != want) {
    gshm__reply__free_unpacked(reply, NULL);
    return -EPROTO;
  }
  *reply_out = reply;
  return 0;
}

/* A number that libgshm reads from its environment (gshm.h). */
struct env_count {
  const char *name;         /* the variable */
  unsigned long long min;   /* its range */
  unsigned long long max;
  const char *unit;         /* what it counts, "milliseconds" */
  const char *abbrev;       /* the unit after the default, "ms" */
  atomic_bool *told;        /* a bad value of it was logged */
};

/* $k->name read strictly (env_digits); unset or empty, dflt.  Any other
 * value is dflt too, said once per process and variable at
 * GSHM_LOG_LEVEL >= 4 (k->told marks it). */
static long long env_count(const struct env_count *k, long long dflt) {
  const char *v = secure_getenv(k->name);
  unsigned long long n;

  if (!v || !*v)
    return dflt;
  if (env_digits(v, k->min, k->max, &n))
    return (long long)n;
  if (!atomic_exchange(k->told, true))
    gshm_log_warn("$%s=\"%.40s\" is not a count of %s from %llu to %llu: the default, %lld "
                  "%s, is used",
                  k->name, v, k->unit, k->min, k->max, dflt, k->abbrev);
  return dflt;
}

/* $GSHM_RECONNECT_MS, $GSHM_HELLO_TIMEOUT_MS: atoi made junk 0 (no
 * reconnect, a hello that waits for ever), a negative hello timeout none,
 * a value past INT_MAX anything. */
static int env_ms(const char *name, int dflt, atomic_bool *told) {
  const struct env_count k = {name, 0, ENV_MS_MAX, "milliseconds", "ms", told};

  return (int)env_count(&k, dflt);
}

/* How long a request polls for its reply before sleeping: $GSHM_POLL_US
 * microseconds (0 to 1000), else 30 us where this process may run on at
 * least 4 CPUs (gshmd then has one of its own) and 0 on smaller machines
 * or cpusets, where a polling client would take the CPU gshmd needs to
 * answer.  (strtol without an end check took junk as 0: no polling.) */
static int default_poll_ns(void) {
  static const struct env_count k = {"GSHM_POLL_US", 0, 1000, "microseconds", "us", &poll_told};
  int dflt = gshm__usable_cpus() >= GSHM_POLL_MIN_CPUS ? 30 : 0;

  return (int)env_count(&k, dflt) * 1000;
}

/* The most segments gshm_list_remote takes from one peer: $GSHM_LIST_MAX
 * (1 to GSHM_WIRE_SEGMENTS_MAX, which is also the default).  strtoul took
 * junk or 0 as no lowering, "-1" as ULONG_MAX (the cap) and "1000x" as
 * 1000, all silently. */
static uint32_t list_max(void) {
  static const struct env_count k = {"GSHM_LIST_MAX", 1, GSHM_WIRE_SEGMENTS_MAX, "segments",
                                     "segments", &list_max_told};

  return (uint32_t)env_count(&k, GSHM_WIRE_SEGMENTS_MAX);
}

int gshm__request_more(struct gshm_client *c, uint16_t type, Gshm__Reply **reply_out) {
  Gshm__Reply *reply = NULL;
  int e;

  if (gshm__forked(c))
    return -ECHILD;
  if (c->fd < 0)
    return -ECONNRESET;
  if ((e = read_reply(c, c->next_request, type, &reply, NULL, 0))) {
    if (connection_lost(e)) {
      set_last_error(c, GSHM_LOST_GSHMD_TEXT);
      close(c->fd);
      c->fd = -1;
      e = -ECONNRESET;
    }
    return e;
  }
  if (reply->status != GSHM__STATUS__STATUS_OK) {
    e = gshm__status_to_errno(reply->status);
    set_last_error(c, reply->message);
    gshm__reply__free_unpacked(reply, NULL);
    return e;
  }
  *reply_out = reply;
  return 0;
}

int gshm_connect(const char *path, const char *client_name, gshm_client_t **client_out) {
  struct gshm_client *c;
  const char *env;
  int e;

  pthread_once(&log_once, log_init);
  if (!client_out)
    return -EINVAL;
  if (!path || !*path)
    path = (env = secure_getenv("GSHM_SOCKET")) && *env ? env : GSHM_DEFAULT_SOCKET;
  if (!(c = calloc(1, sizeof(*c))))
    return -ENOMEM;
  c->fd = -1;
  pthread_mutex_init(&c->lock, NULL);
  if (!(c->path = strdup(path))) {
    free(c);
    return -ENOMEM;
  }
  if (!client_name) {
    extern char *program_invocation_short_name;
    client_name = program_invocation_short_name;
  }
  snprintf(c->name, sizeof(c->name), "%s", client_name);
  for (char *p = c->name; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
  c->reconnect_ms = env_ms("GSHM_RECONNECT_MS", DEFAULT_RECONNECT_MS, &reconnect_told);
  c->hello_timeout_ms = env_ms("GSHM_HELLO_TIMEOUT_MS", DEFAULT_HELLO_TIMEOUT_MS, &hello_told);
  c->poll_ns = default_poll_ns();
  c->remote_list_max = list_max(); /* (lowers the cap only) */
  c->fork_gen = gshm__fork_gen();
  c->serial = atomic_fetch_add(&connects, 1) + 1;
  if ((e = socket_connect(c->path, &c->fd)) || (e = hello(c))) {
    if (e != -EPROTONOSUPPORT)
      gshm_log_info("cannot connect to gshmd at %s: %s", c->path, gshm_strerror(e));
    if (c->fd >= 0)
      close(c->fd);
    pthread_mutex_destroy(&c->lock);
    free(c->path);
    free(c);
    return e;
  }
  *client_out = c;
  return 0;
}

static void lease_release(struct gshm_client *c, struct gshm__lease *l);

void gshm_disconnect(gshm_client_t *c) {
  if (!c)
    return;
  /* A forked child whose copy of the lock was held at the fork (by a
   * thread it does not have) leaves its copies as they are: what the lock
   * guards may be half-changed, and the socket number may be stale. */
  if (gshm__client_lock(c))
    return;
  while (c->leases) {
    struct gshm__lease *l = c->leases;
    /* Segment objects still open are freed with the client: drop all
     * references at once.  The connection's end ends the daemon leases. */
    while (l->segs) {
      struct gshm_segment *s = l->segs;
      l->segs = s->next;
      free(s);
    }
    l->refs = 1;
    l->map_refs = l->addr ? 1 : 0;
    l->lease_id = 0; /* no close request: the connection is going */
    lease_release(c, l);
  }
  if (c->fd >= 0)
    close(c->fd);
  pthread_mutex_unlock(&c->lock);
  if (c->retired) /* (no other thread may use c now) */
    gshm__retire_device_maps(c, c->retired, true);
  pthread_mutex_destroy(&c->lock);
  free(c->path);
  free(c);
}

void gshm__info_from_wire(gshm_segment_info_t *o, const Gshm__SegmentInfo *i) {
  memset(o, 0, sizeof(*o));
  o->id = i->id;
  o->generation = i->generation;
  snprintf(o->name, sizeof(o->name), "%s", i->name);
  o->size = i->size;
  o->requested_size = i->requested_size;
  o->granularity = i->granularity;
  snprintf(o->location, sizeof(o->location), "%s", i->location);
  o->device_index = i->device_index;
  o->uid = i->uid;
  o->gid = i->gid;
  o->mode = i->mode;
  o->flags = i->flags;
  o->unlinked = i->state == GSHM__SEGMENT_STATE__SEGMENT_STATE_UNLINKED;
  o->leases = i->leases;
  o->created_ns = i->created_ns;
  snprintf(o->source, sizeof(o->source), "%s", i->source ? i->source : "");
}

static int segment_new(struct gshm__lease *l, gshm_segment_t **seg_out) {
  struct gshm_segment *s = calloc(1, sizeof(*s));
  if (!s)
    return -ENOMEM;
  s->lease = l;
  s->next = l->segs;
  l->segs = s;
  l->refs++;
  *seg_out = s;
  return 0;
}

int gshm__lease_from_grant(struct gshm_client *c, Gshm__Reply *reply, int fd,
                           gshm_segment_t **seg_out) {
  struct gshm__lease *l;
  bool legacy;
  int e;

  if (reply->body_case != GSHM__REPLY__BODY_GRANT || !reply->grant->segment) {
    if (fd >= 0)
      close(fd);
    return -EPROTO;
  }
  /* Every grant carries an fd, but a legacy-IPC one, which carries the
   * 64-byte handle instead. */
  legacy = reply->grant->legacy_ipc_handle.len == GSHM_LEGACY_IPC_HANDLE_SIZE;
  if ((fd < 0) != legacy) {
    if (fd >= 0)
      close(fd);
    return -EPROTO;
  }
  if (!(l = calloc(1, sizeof(*l)))) {
    if (fd >= 0)
      close(fd);
    return -ENOMEM;
  }
  l->client = c;
  l->lease_id = reply->grant->lease_id;
  l->access = reply->grant->access == GSHM__ACCESS__ACCESS_READ ? GSHM_ACCESS_READ
                                                                 : GSHM_ACCESS_READ_WRITE;
  l->fd = fd;
  lease_set_token(l, reply->grant);
  gshm__info_from_wire(&l->info, reply->grant->segment);
  if ((e = segment_new(l, seg_out))) {
    if (fd >= 0)
      close(fd);
    free(l);
    return e;
  }
  l->next = c->leases;
  c->leases = l;
  return 0;
}

bool gshm__draw_token(uint8_t *token, size_t len) {
  return getrandom(token, len, GRND_NONBLOCK) == (ssize_t)len;
}

int gshm_create(gshm_client_t *c, const char *name, uint64_t size, const char *location,
                uint32_t mode, uint32_t flags, gshm_segment_t **seg_out) {
  Gshm__CreateRequest m = GSHM__CREATE_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  uint8_t token[GSHM_CREATE_TOKEN_BYTES];
  int fd = -1, e;

  if (!c || !name || !seg_out)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  /* names this create: gshm__request sends it again, token and all, when
   * a gshmd restart lost the reply, and gshmd answers the resend with the
   * segment the first one made (not EEXIST) */
  if (gshm__draw_token(token, sizeof(token))) {
    m.create_token.data = token;
    m.create_token.len = sizeof(token);
  }
  m.name = (char *)name;
  m.size = size;
  m.location = (char *)(location ? location : "host");
  m.mode = mode;
  m.flags = flags;
  if ((e = gshm__client_lock(c)))
    return e;
  if ((flags & GSHM_CREATE_HIDDEN) && !(c->capabilities & GSHM_WIRE_CAP_PUBLISH)) {
    set_last_error(c, "this gshmd is too old for hidden segments (no PUBLISH)");
    pthread_mutex_unlock(&c->lock);
    return -ENOTSUP;
  }
  e = gshm__request(c, GSHM_WIRE_CREATE, &m.base, &reply, &fd);
  if (!e) {
    e = gshm__lease_from_grant(c, reply, fd, seg_out);
    gshm__reply__free_unpacked(reply, NULL);
    if (!e && (flags & GSHM_CREATE_HIDDEN))
      (*seg_out)->lease->hidden = true;
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

/* A lease of this client that can serve an open of name with access
 * into *l_out (NULL: none, ask gshmd).  Returns 0, or the error of a
 * reconnect that already waited $GSHM_RECONNECT_MS for a gshmd that went
 * away (the open's request must not wait as long again: gshm_open took
 * twice the time of every other call), -ECHILD in a forked child. */
static int cached_lease(struct gshm_client *c, const char *name, gshm_access_t access,
                        struct gshm__lease **l_out) {
  int e = gshm__drain_events(c, true);

  *l_out = NULL;
  if (e == -ENOTCONN)
    return 0; /* no reconnect tried ($GSHM_RECONNECT_MS 0): the request's one attempt says */
  if (e)
    return e;
  for (struct gshm__lease *l = c->leases; l; l = l->next)
    /* Same access only: a read-only open must not get a writable mapping;
     * never a legacy-IPC lease (it has no fd to map). */
    if (!l->unlinked && !l->revoked && !l->hidden && l->fd >= 0 && l->lease_id &&
        l->access == access &&
        !strcmp(l->info.name, name)) {
      *l_out = l;
      break;
    }
  return 0;
}

int gshm_open(gshm_client_t *c, const char *name, gshm_access_t access, gshm_segment_t **seg_out) {
  Gshm__OpenRequest m = GSHM__OPEN_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  struct gshm__lease *l;
  int fd = -1, e;

  if (!c || !name || !seg_out || (access != GSHM_ACCESS_READ && access != GSHM_ACCESS_READ_WRITE))
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  if ((e = gshm__client_lock(c)))
    return e;
  if ((e = cached_lease(c, name, access, &l)) || l) {
    e = e ? lost_gshmd(c, e, true) : segment_new(l, seg_out);
    pthread_mutex_unlock(&c->lock);
    return e;
  }
  m.name = (char *)name;
  m.access = access == GSHM_ACCESS_READ ? GSHM__ACCESS__ACCESS_READ
                                        : GSHM__ACCESS__ACCESS_READ_WRITE;
  e = gshm__request(c, GSHM_WIRE_OPEN, &m.base, &reply, &fd);
  if (!e) {
    e = gshm__lease_from_grant(c, reply, fd, seg_out);
    gshm__reply__free_unpacked(reply, NULL);
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

/* Drops one reference; the last ends the lease (close request, unmap,
 * close fd, free).  Caller holds c->lock. */
static void lease_release(struct gshm_client *c, struct gshm__lease *l) {
  if (--l->refs > 0)
    return;
  gshm__lease_unmap(l, false); /* the close below tells the daemon */
  /* Out of the list first: a reconnect inside the close request must not
   * re-take the lease being closed (it would outlive this close). */
  for (struct gshm__lease **pp = &c->leases; *pp; pp = &(*pp)->next)
    if (*pp == l) {
      *pp = l->next;
      break;
    }
  if (l->lease_id && c->fd >= 0) {
    Gshm__CloseRequest m = GSHM__CLOSE_REQUEST__INIT;
    Gshm__Reply *reply = NULL;
    m.lease_id = l->lease_id;
    /* A close that fails because the daemon is gone is still a close:
     * the lease ended with the connection. */
    if (gshm__request(c, GSHM_WIRE_CLOSE, &m.base, &reply, NULL) == 0)
      gshm__reply__free_unpacked(reply, NULL);
  }
  if (l->fd >= 0)
    close(l->fd);
  free(l);
}

int gshm_close(gshm_segment_t *seg) {
  struct gshm_client *c;

  if (!seg)
    return 0;
  c = seg->lease->client;
  if (gshm__client_lock(c))
    return 0; /* a forked child's copies, left as they are: as gshm_disconnect */
  for (struct gshm_segment **pp = &seg->lease->segs; *pp; pp = &(*pp)->next)
    if (*pp == seg) {
      *pp = seg->next;
      break;
    }
  if (seg->mapped && --seg->lease->map_refs == 0)
    gshm__lease_unmap(seg->lease, seg->lease->refs > 1); /* else the close tells */
  lease_release(c, seg->lease);
  gshm__client_unlock(c);
  free(seg);
  return 0;
}

/* c's leases on the segment that held `name` (all but `keep`) serve no
 * new opens of it any more: it lost the name (an unlink, or a publish
 * over it; the daemon's event may also be on its way).  Under c->lock. */
static void leases_unnamed(struct gshm_client *c, const char *name,
                           const struct gshm__lease *keep) {
  for (struct gshm__lease *l = c->leases; l; l = l->next)
    if (l != keep && !strcmp(l->info.name, name))
      l->unlinked = true;
}

int gshm_publish(gshm_segment_t *seg, uint32_t flags) {
  Gshm__PublishRequest m = GSHM__PUBLISH_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  uint8_t token[GSHM_PUBLISH_TOKEN_BYTES];
  struct gshm__lease *l;
  struct gshm_client *c;
  bool resent;
  int e;

  if (!seg || (flags & ~GSHM_PUBLISH_REPLACE))
    return -EINVAL;
  l = seg->lease;
  c = l->client;
  if ((e = gshm__client_lock(c)))
    return e;
  if (l->revoked || !l->lease_id)
    e = -ESTALE;
  else if (!l->hidden)
    e = -EINVAL;
  if (e) {
    set_last_error(c, e == -ESTALE ? "the hidden segment is gone (gshmd restarted)"
                                   : "not a hidden segment (published already?)");
    pthread_mutex_unlock(&c->lock);
    return e;
  }
  m.lease_id = l->lease_id;
  m.replace = (flags & GSHM_PUBLISH_REPLACE) != 0;
  /* gshmd notes the segment it publishes under it: a resend after a
   * restart that lost the reply gets that segment and a new lease on it
   * (the first lease ended with that gshmd), and publishes nothing */
  if (gshm__draw_token(token, sizeof(token))) {
    m.token.data = token;
    m.token.len = sizeof(token);
  }
  e = gshm__request(c, GSHM_WIRE_PUBLISH, &m.base, &reply, NULL);
  resent = c->resent_after_loss; /* (the reconnect marked l revoked: the reply's lease is new) */
  if (!e && (reply->body_case != GSHM__REPLY__BODY_GRANT || !reply->grant->segment ||
             (!resent && reply->grant->lease_id != l->lease_id)))
    e = -EPROTO;
  if (!e) {
    leases_unnamed(c, l->info.name, l); /* (the segment it replaced) */
    gshm__info_from_wire(&l->info, reply->grant->segment);
    lease_set_token(l, reply->grant);
    l->hidden = false;
    if (resent) {
      l->lease_id = reply->grant->lease_id;
      l->revoked = false;
      l->unlinked = reply->grant->segment->state == GSHM__SEGMENT_STATE__SEGMENT_STATE_UNLINKED;
      if (l->addr) { /* (as a re-take reports it) */
        char **uuids = NULL;
        size_t n = gshm__map_device_uuids(l, &uuids);
        gshm__report_mapping(c, l, uuids, n, false);
      }
    }
  }
  if (reply)
    gshm__reply__free_unpacked(reply, NULL);
  pthread_mutex_unlock(&c->lock);
  return e;
}

int gshm_unlink(gshm_client_t *c, const char *name) {
  Gshm__UnlinkRequest m = GSHM__UNLINK_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  uint8_t token[GSHM_UNLINK_TOKEN_BYTES];
  int e;

  if (!c || !name)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  m.name = (char *)name;
  /* gshmd notes it with the segment it unlinks: a resend after a restart
   * is answered 0 and never unlinks a segment that took the name since */
  if (gshm__draw_token(token, sizeof(token))) {
    m.token.data = token;
    m.token.len = sizeof(token);
  }
  if ((e = gshm__client_lock(c)))
    return e;
  e = gshm__request(c, GSHM_WIRE_UNLINK, &m.base, &reply, NULL);
  if (!e)
    gshm__reply__free_unpacked(reply, NULL);
  /* sent again after its reply was lost to a gshmd restart: -ENOENT is
   * the first one's work (stored before the restart), not a missing
   * name; the name is gone either way */
  if (e == -ENOENT && c->resent_after_loss) {
    gshm_log_info("unlink of '%s' sent again after gshmd restarted: the name is already gone",
                  name);
    set_last_error(c, NULL);
    e = 0;
  }
  if (!e)
    leases_unnamed(c, name, NULL);
  pthread_mutex_unlock(&c->lock);
  return e;
}

static int stat_request(struct gshm_client *c, const char *name, uint64_t id,
                        gshm_segment_info_t *info_out) {
  Gshm__StatRequest m = GSHM__STAT_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  int e;

  m.name = (char *)(name ? name : "");
  m.segment_id = id;
  e = gshm__request(c, GSHM_WIRE_STAT, &m.base, &reply, NULL);
  if (e)
    return e;
  if (reply->body_case != GSHM__REPLY__BODY_SEGMENT)
    e = -EPROTO;
  else
    gshm__info_from_wire(info_out, reply->segment);
  gshm__reply__free_unpacked(reply, NULL);
  return e;
}

int gshm_stat(gshm_segment_t *seg, gshm_segment_info_t *info_out) {
  struct gshm_client *c;
  gshm_segment_info_t info;
  int e;

  if (!seg || !info_out)
    return -EINVAL;
  c = seg->lease->client;
  if ((e = gshm__client_lock(c)))
    return e;
  if (seg->lease->revoked) {
    pthread_mutex_unlock(&c->lock);
    return -ESTALE;
  }
  if (seg->lease->hidden) { /* (nobody may stat it: the create's record) */
    *info_out = seg->lease->info;
    pthread_mutex_unlock(&c->lock);
    return 0;
  }
  e = stat_request(c, NULL, seg->lease->info.id, &info);
  if (!e && info.generation != seg->lease->info.generation)
    e = -ESTALE;
  if (!e) {
    seg->lease->info.leases = info.leases;
    seg->lease->info.unlinked = info.unlinked;
    *info_out = info;
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

int gshm_stat_name(gshm_client_t *c, const char *name, gshm_segment_info_t *info_out) {
  gshm_segment_info_t info;
  int e;

  if (!c || !name || !info_out)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  if ((e = gshm__client_lock(c)))
    return e;
  e = stat_request(c, name, 0, &info);
  pthread_mutex_unlock(&c->lock);
  if (!e)
    *info_out = info;
  return e;
}

const gshm_segment_info_t *gshm_segment_info(const gshm_segment_t *seg) {
  return seg ? &seg->lease->info : NULL;
}

int gshm_segment_fd(const gshm_segment_t *seg) {
  return seg && seg->lease->fd >= 0 ? seg->lease->fd : -EBADF;
}

gshm_access_t gshm_segment_access(const gshm_segment_t *seg) {
  return seg ? seg->lease->access : GSHM_ACCESS_READ;
}

/* A peer's listing (peer not NULL: REMOTE_LIST, a page a request, relayed
 * by gshmd) is a key holder's to make, page after page with advancing
 * cursors: it ends within what a gshmd can list, c->remote_list_max
 * segments (-E2BIG past them) and GSHM_WIRE_SEGMENTS_MAX /
 * GSHM_WIRE_LIST_VISITS pages with no segment (-EPROTO past them: each
 * such page of a gshmd's looked at GSHM_WIRE_LIST_VISITS segments).
 * Returns 0 or that error (gshm_last_error says which). */
static int remote_page_check(struct gshm_client *c, size_t n, size_t before, size_t *empty) {
  char msg[160];

  if (n > c->remote_list_max) {
    snprintf(msg, sizeof(msg), "the peer listed more than %zu segments (more than a gshmd holds)",
             c->remote_list_max);
    set_last_error(c, msg);
    return -E2BIG;
  }
  if (n == before && ++*empty > GSHM_WIRE_SEGMENTS_MAX / GSHM_WIRE_LIST_VISITS) {
    snprintf(msg, sizeof(msg), "the peer sent more than %u pages with no segment (more than a "
             "gshmd's listing has)", GSHM_WIRE_SEGMENTS_MAX / GSHM_WIRE_LIST_VISITS);
    set_last_error(c, msg);
    return -EPROTO;
  }
  return 0;
}

int gshm__list_all(gshm_client_t *c, uint16_t type, const char *peer, Gshm__Reply__BodyCase want,
                   gshm__page_fn add, void **arr_out, size_t *n_out) {
  void *arr = NULL;
  size_t n = 0, cap = 0, empty = 0;
  uint64_t after = 0;
  int e = 0;

  if (!c || !arr_out || !n_out)
    return -EINVAL;
  if ((e = gshm__client_lock(c)))
    return e;
  do {
    Gshm__ListRequest m = GSHM__LIST_REQUEST__INIT;
    Gshm__RemoteListRequest rm = GSHM__REMOTE_LIST_REQUEST__INIT;
    Gshm__Reply *reply = NULL;
    uint64_t next = 0;
    size_t before = n;
    m.after = rm.after = after;
    rm.peer = (char *)peer;
    if ((e = gshm__request(c, type, peer ? &rm.base : &m.base, &reply, NULL)))
      break;
    e = reply->body_case == want ? add(reply, &arr, &n, &cap, &next) : -EPROTO;
    gshm__reply__free_unpacked(reply, NULL);
    if (!e && peer)
      e = remote_page_check(c, n, before, &empty);
    if (e)
      break;
    if (next && next <= after) {
      e = -EPROTO; /* a cursor that does not advance would loop forever */
      break;
    }
    after = next;
  } while (after);
  pthread_mutex_unlock(&c->lock);
  if (e) {
    free(arr);
    return e;
  }
  *arr_out = arr;
  *n_out = n;
  return 0;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  void *p;
  size_t ncap = *cap ? *cap : 16;
  if (need <= *cap)
    return 0;
  while (ncap < need)
    ncap *= 2;
  if (!(p = realloc(*arr, ncap * elem)))
    return -ENOMEM;
  *arr = p;
  *cap = ncap;
  return 0;
}

int gshm__list_add_segments(const Gshm__Reply *r, void **arr, size_t *n, size_t *cap,
                            uint64_t *next) {
  gshm_segment_info_t *a;
  if (grow(arr, cap, *n + r->segments->n_segments, sizeof(*a)))
    return -ENOMEM;
  a = *arr;
  for (size_t i = 0; i < r->segments->n_segments; i++)
    gshm__info_from_wire(&a[(*n)++], r->segments->segments[i]);
  *next = r->segments->next;
  return 0;
}

static int add_leases(const Gshm__Reply *r, void **arr, size_t *n, size_t *cap, uint64_t *next) {
  gshm_lease_info_t *a;
  if (grow(arr, cap, *n + r->leases->n_leases, sizeof(*a)))
    return -ENOMEM;
  a = *arr;
  for (size_t i = 0; i < r->leases->n_leases; i++) {
    const Gshm__LeaseInfo *w = r->leases->leases[i];
    gshm_lease_info_t *o = &a[(*n)++];
    size_t used = 0;
    memset(o, 0, sizeof(*o));
    o->lease_id = w->lease_id;
    o->segment_id = w->segment_id;
    snprintf(o->segment_name, sizeof(o->segment_name), "%s", w->segment_name);
    snprintf(o->location, sizeof(o->location), "%s", w->location);
    o->session_id = w->session_id;
    o->pid = w->pid;
    o->uid = w->uid;
    snprintf(o->client_name, sizeof(o->client_name), "%s", w->client_name);
    o->access = w->access == GSHM__ACCESS__ACCESS_READ ? GSHM_ACCESS_READ : GSHM_ACCESS_READ_WRITE;
    o->since_ns = w->since_ns;
    o->mapped = w->mapped;
    for (size_t k = 0; k < w->n_mapped_devices; k++) {
      int wrote = snprintf(o->mapped_devices + used, sizeof(o->mapped_devices) - used, "%s%s",
                           k ? "," : "", w->mapped_devices[k]);
      if (wrote < 0 || (size_t)wrote >= sizeof(o->mapped_devices) - used) {
        o->mapped_devices[used] = '\0'; /* (snprintf left part of the one that did not fit) */
        break;
      }
      used += (size_t)wrote;
      o->mapped_devices_listed++;
    }
    /* (a gshmd before mapped_devices_total says 0: what it listed, then) */
    o->mapped_devices_total = w->mapped_devices_total > w->n_mapped_devices
                                  ? w->mapped_devices_total
                                  : (uint32_t)w->n_mapped_devices;
  }
  *next = r->leases->next;
  return 0;
}

static int add_clients(const Gshm__Reply *r, void **arr, size_t *n, size_t *cap, uint64_t *next) {
  gshm_client_info_t *a;
  if (grow(arr, cap, *n + r->clients->n_clients, sizeof(*a)))
    return -ENOMEM;
  a = *arr;
  for (size_t i = 0; i < r->clients->n_clients; i++) {
    const Gshm__ClientInfo *w = r->clients->clients[i];
    gshm_client_info_t *o = &a[(*n)++];
    memset(o, 0, sizeof(*o));
    o->session_id = w->session_id;
    o->pid = w->pid;
    o->uid = w->uid;
    o->gid = w->gid;
    snprintf(o->name, sizeof(o->name), "%s", w->name);
    o->since_ns = w->since_ns;
    o->leases = w->leases;
  }
  *next = r->clients->next;
  return 0;
}

int gshm_list(gshm_client_t *c, gshm_segment_info_t **infos_out, size_t *count_out) {
  return gshm__list_all(c, GSHM_WIRE_LIST_SEGMENTS, NULL, GSHM__REPLY__BODY_SEGMENTS,
                        gshm__list_add_segments, (void **)infos_out, count_out);
}

int gshm_list_leases(gshm_client_t *c, gshm_lease_info_t **leases_out, size_t *count_out) {
  return gshm__list_all(c, GSHM_WIRE_LIST_LEASES, NULL, GSHM__REPLY__BODY_LEASES, add_leases,
                        (void **)leases_out, count_out);
}

int gshm_list_clients(gshm_client_t *c, gshm_client_info_t **clients_out, size_t *count_out) {
  return gshm__list_all(c, GSHM_WIRE_LIST_CLIENTS, NULL, GSHM__REPLY__BODY_CLIENTS, add_clients,
                        (void **)clients_out, count_out);
}

/* How many lists gshm_client_uid reads before it gives up: a reconnect
 * between a list and the session read (another thread's request met a
 * restarted gshmd) gives the connection a session that the list did not
 * show; only a gshmd restarted that often in a row leaves it -ENOENT. */
#define UID_TRIES 8

int gshm_client_uid(gshm_client_t *c, uint32_t *uid_out) {
  int e = -ENOENT;

  if (!c || !uid_out)
    return -EINVAL;
  for (int tries = 0; e == -ENOENT && tries < UID_TRIES; tries++) {
    gshm_client_info_t *v = NULL;
    uint64_t session;
    size_t n = 0;

    if ((e = gshm_list_clients(c, &v, &n)))
      return e;
    /* Read after the list: a reconnect during it gave the session it shows. */
    if ((e = gshm__client_lock(c))) {
      gshm_free(v);
      return e;
    }
    session = c->session_id;
    pthread_mutex_unlock(&c->lock);
    e = -ENOENT;
    for (size_t i = 0; i < n; i++)
      if (v[i].session_id == session) {
        *uid_out = v[i].uid;
        e = 0;
        break;
      }
    gshm_free(v);
  }
  return e;
}

int gshm_status(gshm_client_t *c, gshm_status_info_t *status_out) {
  Gshm__Empty m = GSHM__EMPTY__INIT;
  Gshm__Reply *reply = NULL;
  gshm_status_info_t st;
  int e;

  if (!c || !status_out)
    return -EINVAL;
  if ((e = gshm__request_body(c, GSHM_WIRE_STATUS, &m.base, GSHM__REPLY__BODY_STATUS_INFO,
                              &reply)))
    return e;
  memset(&st, 0, sizeof(st));
  snprintf(st.version, sizeof(st.version), "%s", reply->status_info->version);
  st.pid = reply->status_info->pid;
  st.started_ns = reply->status_info->started_ns;
  st.clients = reply->status_info->clients;
  st.segments = reply->status_info->segments;
  st.leases = reply->status_info->leases;
  st.devices = reply->status_info->devices;
  st.bytes = reply->status_info->bytes;
  if (reply->status_info->gpu_fault)
    snprintf(st.gpu_fault, sizeof(st.gpu_fault), "%s", reply->status_info->gpu_fault);
  for (size_t i = 0, used = 0; i < reply->status_info->n_backends; i++) {
    int w = snprintf(st.backends + used, sizeof(st.backends) - used, "%s%s", i ? "," : "",
                     reply->status_info->backends[i]);
    if (w < 0 || (size_t)w >= sizeof(st.backends) - used)
      break;
    used += (size_t)w;
  }
  gshm__reply__free_unpacked(reply, NULL);
  *status_out = st;
  return 0;
}

void gshm__report_mapping(struct gshm_client *c, struct gshm__lease *l, char **uuids, size_t n,
                          bool unmapped) {
  Gshm__MapReport m = GSHM__MAP_REPORT__INIT;

  if (!l->lease_id)
    return;
  m.lease_id = l->lease_id;
  m.device_uuids = uuids;
  m.n_device_uuids = n;
  m.unmapped = unmapped;
  /* Request id 0: gshmd sends no reply, so this costs no round trip.  A
   * lost connection is noticed by the next request. */
  if (c->fd >= 0 && !gshm__forked(c))
    gshm__wire_send(c->fd, GSHM_WIRE_MAP_REPORT, 0, &m.base, -1);
}

static int add_devices(const Gshm__Reply *r, void **arr, size_t *n, size_t *cap, uint64_t *next) {
  gshm_device_info_t *a;
  if (grow(arr, cap, *n + r->devices->n_devices, sizeof(*a)))
    return -ENOMEM;
  a = *arr;
  for (size_t i = 0; i < r->devices->n_devices; i++) {
    const Gshm__DeviceInfo *w = r->devices->devices[i];
    gshm_device_info_t *o = &a[(*n)++];
    memset(o, 0, sizeof(*o));
    o->index = w->index;
    snprintf(o->uuid, sizeof(o->uuid), "%s", w->uuid);
    snprintf(o->pci_bus_id, sizeof(o->pci_bus_id), "%s", w->pci_bus_id);
    snprintf(o->name, sizeof(o->name), "%s", w->name);
    o->total_memory = w->total_memory;
    o->free_memory = w->free_memory;
    o->granularity = w->granularity;
    o->cc_major = w->cc_major;
    o->cc_minor = w->cc_minor;
    for (size_t k = 0; k < w->n_peers && k < GSHM_MAX_PEERS; k++) {
      o->peers[k].index = w->peers[k]->index;
      o->peers[k].access = w->peers[k]->access;
      o->peers[k].native_atomics = w->peers[k]->native_atomics;
      o->peers[k].performance_rank = w->peers[k]->performance_rank;
      o->peers[k].nvlinks = w->peers[k]->nvlinks;
      o->npeers++;
    }
  }
  *next = 0; /* one page: a node has few GPUs */
  return 0;
}

int gshm_list_devices(gshm_client_t *c, gshm_device_info_t **devices_out, size_t *count_out) {
  return gshm__list_all(c, GSHM_WIRE_DEVICES, NULL, GSHM__REPLY__BODY_DEVICES, add_devices,
                        (void **)devices_out, count_out);
}

/* The text of the metrics' memfd fd (gshmd's, sealed), malloc'ed into
 * *text_out.  Returns 0, -EFBIG over 64 MiB, -ENOMEM, or a read's errno. */
static int read_text_fd(int fd, char **text_out) {
  struct stat st;
  size_t done = 0;
  char *text;

  if (fstat(fd, &st) < 0)
    return -errno;
  if (st.st_size < 0 || st.st_size > (64 << 20))
    return -EFBIG;
  if (!(text = malloc((size_t)st.st_size + 1)))
    return -ENOMEM;
  while (done < (size_t)st.st_size) {
    ssize_t n = pread(fd, text + done, (size_t)st.st_size - done, (off_t)done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int e = n < 0 ? -errno : -EIO;
      free(text);
      return e;
    }
    done += (size_t)n;
  }
  text[done] = '\0';
  *text_out = text;
  return 0;
}

int gshm_metrics(gshm_client_t *c, char **text_out) {
  Gshm__Empty m = GSHM__EMPTY__INIT;
  Gshm__Reply *reply = NULL;
  char *text = NULL;
  int e, fd = -1;

  if (!c || !text_out)
    return -EINVAL;
  if ((e = gshm__client_lock(c)))
    return e;
  e = gshm__request(c, GSHM_WIRE_METRICS, &m.base, &reply, &fd);
  pthread_mutex_unlock(&c->lock);
  if (e)
    return e;
  if (reply->body_case != GSHM__REPLY__BODY_TEXT)
    e = -EPROTO;
  else if (fd >= 0) /* (a text larger than one reply) */
    e = read_text_fd(fd, &text);
  else
    e = (text = strdup(reply->text)) ? 0 : -ENOMEM;
  if (fd >= 0)
    close(fd);
  gshm__reply__free_unpacked(reply, NULL);
  if (!e)
    *text_out = text;
  return e;
}

/* Sends a request that names a segment and returns nothing of interest. */
static int simple_request(gshm_client_t *c, uint16_t type, const ProtobufCMessage *m) {
  Gshm__Reply *reply = NULL;
  int e = gshm__request_body(c, type, m, GSHM__REPLY__BODY__NOT_SET, &reply);

  if (!e)
    gshm__reply__free_unpacked(reply, NULL);
  return e;
}

int gshm_chmod(gshm_client_t *c, const char *name, uint32_t mode) {
  Gshm__ChmodRequest m = GSHM__CHMOD_REQUEST__INIT;
  int e;

  if (!c || !name)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  m.name = (char *)name;
  m.mode = mode;
  return simple_request(c, GSHM_WIRE_CHMOD, &m.base);
}

int gshm_chown(gshm_client_t *c, const char *name, uint32_t uid, uint32_t gid) {
  Gshm__ChownRequest m = GSHM__CHOWN_REQUEST__INIT;
  int e;

  if (!c || !name)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  m.name = (char *)name;
  m.uid = uid == (uint32_t)-1 ? -1 : (int64_t)uid;
  m.gid = gid == (uint32_t)-1 ? -1 : (int64_t)gid;
  return simple_request(c, GSHM_WIRE_CHOWN, &m.base);
}

/* gshm_revoke (name) and gshm_revoke_id (id, name NULL). */
static int revoke_request(gshm_client_t *c, const char *name, uint64_t id) {
  Gshm__RevokeRequest m = GSHM__REVOKE_REQUEST__INIT;
  Gshm__Reply *reply = NULL;
  uint8_t token[GSHM_REVOKE_TOKEN_BYTES];
  int e;

  m.name = (char *)(name ? name : "");
  m.segment_id = id;
  /* gshmd notes it with the segment it revokes: a resend after a restart
   * is answered as the first was, and never revokes another segment */
  if (gshm__draw_token(token, sizeof(token))) {
    m.token.data = token;
    m.token.len = sizeof(token);
  }
  /* As gshm_unlink: request and marking under one lock, so that no other
   * thread's open is served a revoked lease from the cache in between.
   * gshmd tells every other holder; our own leases on it learn it here. */
  if ((e = gshm__client_lock(c)))
    return e;
  e = gshm__request(c, GSHM_WIRE_REVOKE, &m.base, &reply, NULL);
  if (!e) {
    gshm__reply__free_unpacked(reply, NULL);
    for (struct gshm__lease *l = c->leases; l; l = l->next)
      if (name ? !l->unlinked && !strcmp(l->info.name, name) : l->info.id == id)
        l->unlinked = l->revoked = true;
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

int gshm_revoke(gshm_client_t *c, const char *name) {
  int e;

  if (!c || !name)
    return -EINVAL;
  if ((e = gshm__name_check_len(c, name)))
    return e;
  return revoke_request(c, name, 0);
}

int gshm_revoke_id(gshm_client_t *c, uint64_t segment_id) {
  if (!c)
    return -EINVAL;
  if (!segment_id)
    return -ESTALE;
  return revoke_request(c, NULL, segment_id);
}
