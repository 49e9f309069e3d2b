/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: a cluster peer's messages, through gshmd's real
 * cluster code (daemon/cluster: link, hello, serve, serve_list, relay,
 * stage, lanes), as any host that reaches the cluster port (before the
 * hello) or a peer that holds the key (after it) sends them.  The node
 * "n" runs in this process on its own libuv loop and thread, listening
 * on 127.0.0.1 with cluster.transport = tcp, exporting two host
 * segments (pub/a, 4 KiB; pub/b, 64 KiB, mode 0644); its one peer "r"
 * is the rogue of tests/cluster/rogue.c, on this thread, either side of
 * a link.
 *
 * Input: byte 0 flags; flags & 3 the mode, (flags >> 2) the rogue's
 * capabilities (cluster.proto Cap: CAP_ENCRYPT 1, CAP_AES 2, CAP_LANES 8,
 * CAP_GMAC 16, CAP_ASK_AGAIN 32).  Its bit 4 (CAP_UCX, which the rogue
 * never says: no UCX) says that byte 1 is a second flags byte, and the
 * rest (below) starts after it: bit 0 the rogue says CAP_SUBKEYS (the
 * subkeys of protocol 2.6), bit 1 the node has cluster.min_protocol = 2.6
 * for this input (else 2.0).  A rogue without CAP_SUBKEYS must then be
 * refused before any MAC: checked (mode 1: no Challenge came; 2 and 3:
 * the node's link to it never came up).
 *   0: before the hello: the rest is written to a plain TCP connection to
 *      the port, as is.
 *   1: the rogue connects as peer "r" (a puller) with the key and does
 *      the hello (and, with CAP_LANES, opens a data lane of its link,
 *      on which the node then sends what it serves), then sends each record [u16 LE len][len bytes] as one control
 * frame's payload (a Msg: List, GrantRequest, Read, Stage, Release, or
 * anything), reading what the node answers for a few ms after each.  A
 * record that decodes as a Read, Stage or Release of grant 0 names the
 * last grant the node gave instead (grant ids are the node's lease ids,
 * which grow from input to input: no input could name one otherwise).
 *   2, 3: the node pulls from the rogue (the serving side): a local
 *      client's PULL of "pub/a" into "got/a" (mode 2), or (mode 3) the
 *      local request of the first record [u8 kind][u16 LE len][body]:
 *      kind % 3 = 0 a PullRequest (a set's is listed first), 1 a
 *      RemoteListRequest, 2 a PeersRequest, as a local client may send
 *      them (gshmd_cluster_handle_*), made on the node's thread; the
 *      rogue accepts the node's link (if the request asks for one) and
 *      answers each
 *      request the node sends (List, GrantRequest, Read, Stage, Release)
 *      with the next record [u8 how][u16 LE len][len bytes]: how & 3 = 0
 *      a Msg (given the request's id unless how & 4), 1 a data frame of
 *      the bytes at the Read's offset (plus len when how & 4) for the
 *      request, 2 the bytes raw on the wire, 3 no answer.  Records left
 *      after 5 ms with no request go out for the last one (a Read's
 *      several frames).  Then the rogue closes the link and the pull must
 *      end (answered) within 5 s.
 *
 * Checked: no crash, leak or undefined behaviour in the node, the node
 * still completes a hello after every input (its loop did not stop or
 * wedge), every pull ends, and under cluster.min_protocol = 2.6 no peer
 * without CAP_SUBKEYS gets a Challenge or a link. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "cluster.h"
#include "config.h"
#include "internal.h"
#include "leasekey.h"
#include "log.h"
#include "registry.h"
#include "rogue.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct gshmd_config cfg;
static uv_loop_t loop;
static struct gshmd_registry reg;
static struct gshmd_leasekey leasekey;
static struct gshmd_cluster *cl;
static uint8_t key[32];
static int port;
static struct rogue rogue; /* (large: its queue) */
static struct rogue_lane lanes[2]; /* the node's data lanes to the serving rogue */
static struct rogue plane;         /* the pulling rogue's data lane (mode 1) */
static int rlfd, rport;    /* where the rogue serves */
static struct gshmd_client *puller;
static uv_async_t kick;    /* a pull to start on the node's thread */
static atomic_int pull_mode; /* 0 none; 2 "pub/a"; 3 the request in req */
static uint8_t req[GSHM_WIRE_MAX_PACKET]; /* mode 3: the local request's body */
static size_t req_len;
static uint8_t req_kind;
static atomic_bool pull_done;
static uint32_t pull_rid;
/* cluster.min_protocol for the input: the caps the node requires
 * (ll.caps_required), set on the node's thread by on_kick */
static atomic_uint floor_want, floor_have;

/* What an input's flags say (see the top). */
struct input_flags {
  uint8_t mode;
  uint32_t caps;     /* the rogue's */
  uint32_t required; /* the node's cluster.min_protocol, as caps */
};

/* The node's answers to the local client's PULL: the last one (anything
 * but progress) ends it. */
static int to_client(void *arg, struct gshmd_client *c, uint16_t type, uint32_t request_id,
                     const Gshm__Reply *reply) {
  (void)arg, (void)c, (void)type, (void)request_id;
  if (reply->body_case != GSHM__REPLY__BODY_PULL_PROGRESS)
    atomic_store(&pull_done, true);
  return 0;
}

/* Mode 3's local request (req, req_kind) as gshmd's requests.c would
 * hand it to the cluster; false when it was answered at once. */
static bool local_request(void) {
  const char *msg = NULL;
  bool deferred = false;
  int e = -EINVAL;

  switch (req_kind % 3) {
  case 0: {
    Gshm__PullRequest *m = gshm__pull_request__unpack(NULL, req_len, req);
    if (m)
      e = gshmd_cluster_handle_pull(cl, puller, ++pull_rid, m, &msg);
    gshm__pull_request__free_unpacked(m, NULL);
    return e == 0;
  }
  case 1: {
    Gshm__RemoteListRequest *m = gshm__remote_list_request__unpack(NULL, req_len, req);
    if (m)
      e = gshmd_cluster_handle_remote_list(cl, puller, ++pull_rid, m, &msg);
    gshm__remote_list_request__free_unpacked(m, NULL);
    return e == 0;
  }
  default: {
    Gshm__PeersRequest *m = gshm__peers_request__unpack(NULL, req_len, req);
    Gshm__Reply reply = GSHM__REPLY__INIT;
    if (m)
      e = gshmd_cluster_handle_peers(cl, puller, ++pull_rid, m->after, &reply, &deferred);
    gshm__peers_request__free_unpacked(m, NULL);
    return e == 0 && deferred;
  }
  }
}

/* On the node's thread: starts the pull (or mode 3's request) asked for. */
static void on_kick(uv_async_t *a) {
  Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
  int mode = atomic_exchange(&pull_mode, 0);
  const char *msg = NULL;

  (void)a;
  cl->ll.caps_required = atomic_load(&floor_want);
  atomic_store(&floor_have, cl->ll.caps_required);
  if (mode == 3) {
    if (!local_request())
      atomic_store(&pull_done, true);
    return;
  }
  if (!mode)
    return;
  m.peer = "r";
  m.name = "pub/a";
  m.local_name = "got/a";
  m.replace = true;
  if (gshmd_cluster_handle_pull(cl, puller, ++pull_rid, &m, &msg))
    atomic_store(&pull_done, true);
}

/* gshmd's loop, on its own thread for the whole run. */
static void *node_thread(void *arg) {
  (void)arg;
  for (;;)
    if (!uv_run(&loop, UV_RUN_DEFAULT))
      usleep(1000);
  return NULL;
}

static int free_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), p;

  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
    abort();
  p = ntohs(sa.sin_port);
  close(fd);
  return p;
}

static void segment(struct gshmd_client *c, const char *name, uint64_t size) {
  Gshm__CreateRequest m = GSHM__CREATE_REQUEST__INIT;
  struct gshmd_lease *lease;
  const char *msg = NULL;

  m.name = (char *)name;
  m.size = size;
  m.location = "host";
  m.mode = 0644;
  if (gshmd_registry_create(&reg, c, &m, &lease, NULL, &msg))
    abort();
}

static char keyfile[128];

static void remove_keyfile(void) { unlink(keyfile); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  static char sets[9][256];
  char *args[2 * 9 + 1];
  enum gshmd_config_action action = GSHMD_CONFIG_RUN;
  struct gshmd_cred cred = {0};
  struct gshmd_client *owner;
  pthread_t t;
  int fd, n = 0;

  (void)argc;
  (void)argv;
  signal(SIGPIPE, SIG_IGN); /* as gshmd */
  unsetenv("NOTIFY_SOCKET");
  gshm__log_setup("fuzz", getenv("GSHM_FUZZ_LOG") ? 7 : 0, 0); /* GSHM_FUZZ_LOG=1: the node's log */
  snprintf(keyfile, sizeof(keyfile), "%s/gshm-fuzz-cluster-key.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if ((fd = mkstemp(keyfile)) < 0 || write(fd, "fuzz-cluster-key-0123456789", 27) != 27)
    abort();
  close(fd);
  atexit(remove_keyfile);
  rogue_key(keyfile, key);
  port = free_port();
  snprintf(sets[0], sizeof(sets[0]), "cluster.listen=127.0.0.1:%d", port);
  snprintf(sets[1], sizeof(sets[1]), "cluster.node_name=n");
  if ((rlfd = rogue_listener(&rport)) < 0)
    abort();
  snprintf(sets[2], sizeof(sets[2]), "cluster.peers=r=127.0.0.1:%d", rport);
  snprintf(sets[3], sizeof(sets[3]), "cluster.secret_file=%s", keyfile);
  snprintf(sets[4], sizeof(sets[4]), "cluster.export=pub/*");
  snprintf(sets[5], sizeof(sets[5]), "cluster.transport=tcp");
  snprintf(sets[6], sizeof(sets[6]), "daemon.backend=host");
  snprintf(sets[7], sizeof(sets[7]), "cluster.request_timeout_ms=1000");
  snprintf(sets[8], sizeof(sets[8]), "cluster.streams=2");
  args[n++] = "gshmd";
  for (int i = 0; i < 9; i++) {
    args[n++] = "--set";
    args[n++] = sets[i];
  }
  if (gshmd_config_init(&cfg) || gshmd_config_setup(&cfg, n, args, &action) ||
      uv_loop_init(&loop))
    abort();
  gshmd_registry_init(&reg, &cfg);
  if (gshmd_backend_host_create(&cfg, &reg.host) || gshmd_leasekey_setup(&leasekey, NULL, NULL, 0))
    abort();
  gshmd_leasekey_attach(&leasekey, &reg);
  cred.pid = getpid();
  cred.uid = geteuid();
  cred.gid = getegid();
  cred.admin = true;
  if (gshmd_registry_client_add(&reg, &cred, &owner))
    abort();
  segment(owner, "pub/a", 4096);
  segment(owner, "pub/b", 65536);
  if (gshmd_registry_client_add(&reg, &cred, &puller))
    abort();
  if (gshmd_cluster_start(&loop, &cfg, &reg, to_client, NULL, &cl) || !cl ||
      uv_async_init(&loop, &kick, on_kick))
    abort();
  if (pthread_create(&t, NULL, node_thread, NULL))
    abort();
  return 0;
}

/* Before the hello: bytes as is; waits (at most 20 ms) for the node to
 * close the connection or say something. */
static void raw(const uint8_t *p, size_t n) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct pollfd pf = {.fd = fd, .events = POLLIN};

  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    abort();
  if (n && write(fd, p, n) < 0) {
    close(fd);
    return;
  }
  (void)poll(&pf, 1, 20);
  close(fd);
}

/* UCX's own allocations at exit are not the node's. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libucs.so\nleak:libucp.so\n"; }

static uint64_t last_grant;

/* Reads what the node answers until it is quiet for ms (and what it
 * sent on the pulling rogue's lane, when it has one). */
static void drain(struct rogue *r, int ms) {
  Gshm__Cluster__Msg *m;
  if (plane.up)
    rogue_run(&plane, 1);
  while (!r->failed && !r->closed && (m = rogue_recv(r, ms))) {
    if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT && m->grant)
      last_grant = m->grant->grant_id;
    gshm__cluster__msg__free_unpacked(m, NULL);
  }
}

/* Sends record p (len bytes), with grant 0 of a Read, Stage or Release
 * made the last grant's. */
static void send_record(struct rogue *r, const uint8_t *p, size_t len) {
  Gshm__Cluster__Msg *m = gshm__cluster__msg__unpack(NULL, len, p);
  uint64_t *grant = NULL;

  if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_READ && m->read)
    grant = &m->read->grant_id;
  else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_STAGE && m->stage)
    grant = &m->stage->grant_id;
  else if (m && m->body_case == GSHM__CLUSTER__MSG__BODY_RELEASE && m->release)
    grant = &m->release->grant_id;
  if (grant && *grant == 0) {
    *grant = last_grant;
    rogue_send(r, m);
  } else {
    rogue_send_packed(r, p, len);
  }
  gshm__cluster__msg__free_unpacked(m, NULL);
}

/* The next record of a serving input answers request rid (the last the
 * node sent; a Read's or Stage's at read_off): see the top.  Returns
 * false when no record is left. */
static bool serve_record(struct rogue *r, const uint8_t **p, size_t *n, uint32_t rid,
                         uint64_t read_off) {
  Gshm__Cluster__Msg *a;
  uint8_t how;
  size_t len;

  if (*n < 3)
    return false;
  how = (*p)[0];
  len = (size_t)(*p)[1] | (size_t)(*p)[2] << 8;
  *p += 3;
  *n -= 3;
  if (len > *n)
    len = *n;
  switch (how & 3) {
  case 0:
    if ((a = gshm__cluster__msg__unpack(NULL, len, *p))) {
      if (!(how & 4))
        a->request_id = rid;
      rogue_send(r, a);
      gshm__cluster__msg__free_unpacked(a, NULL);
    } else {
      rogue_send_packed(r, *p, len);
    }
    break;
  case 1: {
    uint64_t off = read_off + ((how & 4) ? len : 0);
    struct rogue_lane *ln = &lanes[(how >> 3) & 1];
    if (len && ln->up)
      (void)rogue_lane_send(ln, rid, off, *p, len, (how & 32) ? len / 2 : len);
    else if (len)
      gshmd__stream_send_data(&r->st, rid, off, *p, len, NULL, NULL);
    break;
  }
  case 2: {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&r->st.tcp, &fd) == 0 && write(fd, *p, len) < 0)
      break;
    break;
  }
  default:
    break;
  }
  *p += len;
  *n -= len;
  return true;
}

/* Waits until the node connects to the rogue (true), or its pull ended
 * first, or 5 s passed (false). */
static bool wait_connection(void) {
  for (int i = 0; i < 5000 && !atomic_load(&pull_done); i++) {
    struct pollfd pf = {.fd = rlfd, .events = POLLIN};
    if (poll(&pf, 1, 1) > 0)
      return true;
  }
  return false;
}

/* Modes 2 and 3: the node pulls from the rogue (see the top). */
static void serve(const struct input_flags *f, const uint8_t *p, size_t n) {
  struct rogue *r = &rogue;
  uint32_t rid = 0;
  uint64_t read_off = 0;
  int tries = 0;

  if (f->mode == 3) { /* the local request: the first record */
    if (n < 3)
      return;
    req_kind = p[0];
    req_len = (size_t)p[1] | (size_t)p[2] << 8;
    if (req_len > n - 3)
      req_len = n - 3;
    memcpy(req, p + 3, req_len);
    p += 3 + req_len;
    n -= 3 + req_len;
  }
  atomic_store(&pull_done, false);
  atomic_store(&pull_mode, f->mode);
  uv_async_send(&kick);
  /* the node's connection (a stale one of an earlier input may come
   * first), unless the pull ended before it asked anything */
  memset(r, 0, sizeof(*r));
  r->caps = f->caps;
  while (wait_connection() && rogue_accept(r, rlfd, "r", key)) {
    rogue_close(r);
    memset(r, 0, sizeof(*r));
    r->caps = f->caps;
    if (++tries == 4)
      break;
  }
  if (r->up && (f->required & ~f->caps)) {
    fprintf(stderr, "fuzz_cluster: the node linked to a peer without CAP_SUBKEYS under "
                    "cluster.min_protocol = 2.6\n");
    abort();
  }
  /* its lanes, which it opens once the link is up */
  for (int i = 0; i < 2 && r->up && (r->caps & 8); i++)
    if (wait_connection())
      (void)rogue_accept_lane(r, rlfd, &lanes[i]);
  while (r->up && !r->failed && !r->closed && !atomic_load(&pull_done)) {
    Gshm__Cluster__Msg *m = rogue_recv(r, 5);
    if (m) {
      rid = m->request_id;
      if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ && m->read)
        read_off = m->read->offset;
      else if (m->body_case == GSHM__CLUSTER__MSG__BODY_STAGE && m->stage)
        read_off = m->stage->offset;
      gshm__cluster__msg__free_unpacked(m, NULL);
      if (!rid)
        continue; /* a Release: no answer due */
    } else if (!rid) {
      continue;
    }
    if (!serve_record(r, &p, &n, rid, read_off))
      break;
  }
  /* what was sent last may still be on its way (a lane's frame) */
  for (int i = 0; i < 4 && r->up && !r->failed && !atomic_load(&pull_done); i++) {
    Gshm__Cluster__Msg *m = rogue_recv(r, 5);
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  for (int i = 0; i < 2; i++) {
    rogue_lane_close(&lanes[i]);
    memset(&lanes[i], 0, sizeof(lanes[i]));
  }
  rogue_close(r);
  for (int i = 0; i < 5000 && !atomic_load(&pull_done); i++)
    usleep(1000);
  if (!atomic_load(&pull_done)) {
    fprintf(stderr, "fuzz_cluster: the request did not end within 5 s of its link's end\n");
    abort();
  }
}

/* Reads the input's flags (one byte, or two: see the top) into f;
 * returns the bytes they took, or 0 when the input is too short. */
static size_t input_flags(const uint8_t *data, size_t size, struct input_flags *f) {
  uint8_t more;

  if (size < 1 || ((data[0] & 16) && size < 2))
    return 0;
  more = (data[0] & 16) ? data[1] : 0;
  f->mode = data[0] & 3;
  f->caps = ((uint32_t)(data[0] >> 2) & ~4u) | (more & 1 ? GSHM__CLUSTER__CAP__CAP_SUBKEYS : 0);
  f->required = more & 2 ? GSHM__CLUSTER__CAP__CAP_SUBKEYS : 0;
  return (data[0] & 16) ? 2 : 1;
}

/* Gives the node cluster.min_protocol f->required for this input, on its
 * thread (within 5 s, else the loop is wedged: abort). */
static void node_floor(const struct input_flags *f) {
  if (atomic_load(&floor_have) == f->required)
    return;
  atomic_store(&floor_want, f->required);
  uv_async_send(&kick);
  for (int i = 0; i < 5000 && atomic_load(&floor_have) != f->required; i++)
    usleep(1000);
  if (atomic_load(&floor_have) != f->required) {
    fprintf(stderr, "fuzz_cluster: the node's loop did not take cluster.min_protocol\n");
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct rogue *r = &rogue;
  struct input_flags f;
  size_t off;

  if (size > 1 << 18 || !(off = input_flags(data, size, &f)))
    return 0;
  node_floor(&f);
  if (f.mode == 0) {
    raw(data + off, size - off);
    return 0;
  }
  if (f.mode >= 2) {
    serve(&f, data + off, size - off);
    return 0;
  }
  memset(r, 0, sizeof(*r));
  r->caps = f.caps;
  if (rogue_connect(r, port, "r", "n", key)) {
    /* Refused for want of CAP_SUBKEYS: before the node sent its
     * Challenge, the first MAC (under the cluster key itself here). */
    if ((f.required & ~f.caps) && !sodium_is_zero(r->nonce_theirs, sizeof(r->nonce_theirs))) {
      fprintf(stderr, "fuzz_cluster: the node sent a Challenge to a peer without CAP_SUBKEYS "
                      "under cluster.min_protocol = 2.6\n");
      abort();
    }
    /* The node must still take an honest hello (a refusal of these caps
     * aside: try with only those it requires). */
    rogue_close(r);
    memset(r, 0, sizeof(*r));
    r->caps = f.required;
    if (rogue_connect(r, port, "r", "n", key)) {
      fprintf(stderr, "fuzz_cluster: the node takes no hello: %s\n", r->refusal);
      abort();
    }
    rogue_close(r);
    return 0;
  }
  if (f.required & ~f.caps) {
    fprintf(stderr, "fuzz_cluster: a peer without CAP_SUBKEYS linked under "
                    "cluster.min_protocol = 2.6\n");
    abort();
  }
  memset(&plane, 0, sizeof(plane));
  if (r->caps & 8)
    if (rogue_connect_lane(r, port, &plane) && getenv("GSHM_FUZZ_LOG"))
      fprintf(stderr, "fuzz_cluster: no lane: %s\n", plane.refusal);
  while (off + 2 <= size && !r->failed && !r->closed) {
    size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
    off += 2;
    if (len > size - off)
      len = size - off;
    send_record(r, data + off, len);
    off += len;
    drain(r, 2);
  }
  rogue_close(&plane);
  rogue_close(r);
  return 0;
}
