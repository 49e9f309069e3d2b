/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: gshmd's real request path.  The daemon's server,
 * registry, host backend, metrics and fd store code run in this process
 * on a libuv loop, listening on an abstract Unix socket; each input is
 * one client connection that sends a sequence of packets.
 *
 * Input: byte 0 flags (bit 0: send a valid Hello first, so that most
 * inputs reach the request handlers; bit 1: attach an fd to the first
 * packet), then packets, each a 16-bit little-endian length and that many
 * bytes (a header of wire.h and a body, or anything).  After each packet
 * the loop runs until gshmd answers or drops the connection.
 *
 * Checked: no crash, leak or undefined behaviour; every request gets one
 * reply or the connection is closed; replies parse; and after the client
 * goes, gshmd holds no connection, client or lease and no fd more than
 * before. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "fdstore.h"
#include "leasekey.h"
#include "log.h"
#include "registry.h"
#include "requests.h"
#include "server.h"
#include "fuzz_fds.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct gshmd_config cfg;
static uv_loop_t loop;
static struct gshmd_registry reg;
static struct gshmd_fdstore fs;
static struct gshmd_server srv;
static struct sockaddr_un addr;
static socklen_t addrlen;
static uint8_t rx[GSHM_WIRE_MAX_PACKET + 1];

/* Lease tokens are issued and checked, so that re-takes with hostile
 * tokens reach crypto_auth_verify. */
static struct gshmd_leasekey leasekey;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  int lfd;

  (void)argc;
  (void)argv;
  unsetenv("NOTIFY_SOCKET");
  gshm__log_setup("fuzz", getenv("FUZZ_SERVER_DEBUG") ? 7 : 0, 0);
  if (gshmd_config_init(&cfg) || uv_loop_init(&loop))
    abort();
  gshmd_registry_init(&reg, &cfg);
  if (gshmd_backend_host_create(&cfg, &reg.host))
    abort();
  gshmd_fdstore_setup(&fs, &reg);
  if (gshmd_leasekey_setup(&leasekey, NULL, NULL, 0))
    abort();
  gshmd_leasekey_attach(&leasekey, &reg);
  addr.sun_family = AF_UNIX;
  addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                        (size_t)snprintf(addr.sun_path + 1, sizeof(addr.sun_path) - 1,
                                         "gshm-fuzz-server-%d", (int)getpid()));
  lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, addrlen) < 0 || listen(lfd, 16) < 0)
    abort();
  if (gshmd_server_start(&srv, &loop, &cfg, &reg, lfd))
    abort();
  return 0;
}

/* Runs the loop until fd has something to read or is hung up, at most a
 * bounded number of turns (a reply is produced in the same turn that reads
 * the request, so a few turns always suffice). */
static bool pump_until_readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};

  for (int i = 0; i < 64; i++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    if (poll(&p, 1, 0) > 0)
      return true;
    /* a dropped client's socket closes on a closer thread: wait for it */
    if (gshmd__closes_pending(&srv, (uid_t)-1) && poll(&p, 1, 1) > 0)
      return true;
  }
  /* gshmd closes a dropped connection's socket on a closer thread
   * (server_close.c), so the hang-up that answers a bad packet may still
   * be on its way there. */
  while (gshmd__closes_pending(&srv, (uid_t)-1)) {
    uv_run(&loop, UV_RUN_NOWAIT);
    if (poll(&p, 1, 1) > 0)
      return true;
  }
  return poll(&p, 1, 0) > 0;
}

/* Reads every packet waiting on fd; returns false once the peer closed. */
static bool drain(int fd) {
  for (;;) {
    int fds[GSHM_WIRE_MAX_FDS], nfds = 0;
    struct gshm_wire_header h;
    ssize_t n = gshm__wire_recv(fd, rx, sizeof(rx), fds, GSHM_WIRE_MAX_FDS, &nfds, 0);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    if (n == -EAGAIN)
      return true;
    if (n <= 0)
      return false;
    /* gshmd's own packets always parse. */
    if (gshm__wire_parse_header(rx, (size_t)n, &h) || !(h.type & (GSHM_WIRE_REPLY | GSHM_WIRE_EVENT)))
      abort();
    if (h.type & GSHM_WIRE_REPLY) {
      Gshm__Reply *r = gshm__reply__unpack(NULL, h.length, rx + GSHM_WIRE_HEADER_SIZE);
      if (!r || r->status == GSHM__STATUS__STATUS_UNSPECIFIED)
        abort();
      gshm__reply__free_unpacked(r, NULL);
    }
  }
}

static bool no_reply_wanted(const uint8_t *p, size_t len) {
  struct gshm_wire_header h;
  return gshm__wire_parse_header(p, len, &h) == 0 && h.major == GSHM_PROTO_MAJOR &&
         (h.type == GSHM_WIRE_MAP_REPORT || h.type == GSHM_WIRE_PULL_CANCEL) &&
         h.request_id == 0;
}

static void dump_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  char path[300], target[300];
  while (d && (e = readdir(d))) {
    ssize_t n;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    if ((n = readlink(path, target, sizeof(target) - 1)) > 0) {
      target[n] = 0;
      fprintf(stderr, "  fd %s -> %s\n", e->d_name, target);
    }
  }
  if (d)
    closedir(d);
}

/* Sends one packet, with a spare fd (which gshmd must close) when with_fd;
 * the socket is non-blocking, so a full one just drops the packet. */
static void send_packet(int fd, const uint8_t *p, size_t len, bool with_fd) {
  int extra = with_fd ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;

  /* Where the kernel refuses the fd (SO_PASSRIGHTS off, Linux 6.16+),
   * the packet goes without it: a reply is still due. */
  if (gshm__wire_sendmsg(fd, p, len, extra) == -EPERM && extra >= 0)
    (void)gshm__wire_sendmsg(fd, p, len, -1);
  if (extra >= 0)
    close(extra);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int baseline;
  uint8_t flags, hello[256];
  size_t off = 1, hlen;
  bool open_conn = true, first = true;
  int fd;

  if (size < 1 || size > 1 << 18)
    return 0;
  baseline = fuzz_fd_count(); /* per input: libFuzzer opens files between inputs */
  flags = data[0];
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, addrlen) < 0)
    abort();
  uv_run(&loop, UV_RUN_NOWAIT); /* accept */
  if (flags & 1) {
    Gshm__Hello m = GSHM__HELLO__INIT;
    m.major = GSHM_PROTO_MAJOR;
    m.client_name = "fuzz";
    if (gshm__wire_pack(GSHM_WIRE_HELLO, 1, &m.base, hello, sizeof(hello), &hlen))
      abort();
    send_packet(fd, hello, hlen, false);
    if (!pump_until_readable(fd))
      abort();
    open_conn = drain(fd);
  }
  while (open_conn && off + 2 <= size) {
    size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
    off += 2;
    if (len > size - off)
      len = size - off;
    send_packet(fd, data + off, len, first && (flags & 2));
    first = false;
    off += len;
    /* One reply per request, or the connection goes.  A mapping report
     * or a pull's cancel with request id 0 is the exception: libgshm
     * sends it without waiting, and gshmd answers it only when it breaks
     * the protocol (wire.h). */
    if (!pump_until_readable(fd) && !no_reply_wanted(data + off - len, len)) {
      fprintf(stderr, "fuzz_server: no reply to packet at offset %zu (%zu bytes)\n", off - len, len);
      abort();
    }
    open_conn = drain(fd);
    if (getenv("FUZZ_SERVER_DEBUG"))
      fprintf(stderr, "packet at %zu (%zu bytes): connection %s\n", off - len, len,
              open_conn ? "open" : "closed");
  }
  close(fd);
  for (int i = 0; i < 64 && (srv.nconns || reg.nclients); i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  uv_run(&loop, UV_RUN_NOWAIT); /* close callbacks */
  /* client fds close on gshmd's closer threads (server_close.c): wait
   * until every batch ended (the count reaps; its wake-up is unref'd, so
   * uv_run would not wait for it) */
  while (gshmd__closes_pending(&srv, (uid_t)-1)) {
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(50);
  }
  if (srv.nconns || reg.nclients || reg.nleases)
    abort();
  /* Segments the input created stay (as they would in gshmd); free them
   * so that inputs do not depend on each other. */
  {
    struct gshmd_backend *host = reg.host;
    gshmd_registry_destroy(&reg);
    gshmd_registry_init(&reg, &cfg);
    reg.host = host;
    gshmd_fdstore_setup(&fs, &reg);
    gshmd_leasekey_attach(&leasekey, &reg);
  }
  if (fuzz_fd_count() != baseline) {
    fprintf(stderr, "fuzz_server: %d fds open, %d before\n", fuzz_fd_count(), baseline);
    dump_fds();
    abort();
  }
  return 0;
}
