/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster node of fuzz_cluster and fuzz_ucx_data (fuzz_node.h). */
#include "fuzz_node.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "backend.h"
#include "internal.h"
#include "log.h"

static char keyfile[128];

static void remove_keyfile(void) { unlink(keyfile); }

/* gshmd's loop, on its own thread for the whole run. */
static void *node_thread(void *arg) {
  struct fuzz_node *n = arg;
  for (;;)
    if (!uv_run(&n->loop, UV_RUN_DEFAULT))
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

static void segment(struct fuzz_node *n, struct gshmd_client *c, const char *name,
                    uint64_t size) {
  Gshm__CreateRequest m = GSHM__CREATE_REQUEST__INIT;
  struct gshmd_lease *lease;
  const char *msg = NULL;

  m.name = (char *)name;
  m.size = size;
  m.location = "host";
  m.mode = 0644;
  if (gshmd_registry_create(&n->reg, c, &m, &lease, NULL, &msg))
    abort();
}

/* The node's --set values: its own, then sets[0..nsets), in args. */
#define OWN_SETS 7
static int node_args(struct fuzz_node *n, const char *const *sets, int nsets, char **args) {
  static char own[OWN_SETS][256];
  int k = 0;

  snprintf(own[0], sizeof(own[0]), "cluster.listen=127.0.0.1:%d", n->port);
  snprintf(own[1], sizeof(own[1]), "cluster.node_name=n");
  snprintf(own[2], sizeof(own[2]), "cluster.peers=r=127.0.0.1:%d", n->rport);
  snprintf(own[3], sizeof(own[3]), "cluster.secret_file=%s", keyfile);
  snprintf(own[4], sizeof(own[4]), "cluster.export=pub/*");
  snprintf(own[5], sizeof(own[5]), "daemon.backend=host");
  snprintf(own[6], sizeof(own[6]), "cluster.request_timeout_ms=1000");
  args[k++] = "gshmd";
  for (int i = 0; i < OWN_SETS + nsets; i++) {
    args[k++] = "--set";
    args[k++] = i < OWN_SETS ? own[i] : (char *)sets[i - OWN_SETS];
  }
  return k;
}

/* The node's answers to the local client's requests: the last (anything
 * but a pull's progress) ends one. */
static int to_client(void *arg, struct gshmd_client *c, uint16_t type, uint32_t request_id,
                     const Gshm__Reply *reply) {
  struct fuzz_node *n = arg;

  (void)c, (void)type, (void)request_id;
  if (reply->body_case != GSHM__REPLY__BODY_PULL_PROGRESS)
    atomic_store(&n->pull_done, true);
  return 0;
}

/* On the node's thread: cluster.min_protocol as asked
 * (fuzz_node_min_protocol), then the target's own kick. */
static void kicked(uv_async_t *a) {
  struct fuzz_node *n = a->data;

  n->cl->ll.caps_required = atomic_load(&n->floor_want);
  atomic_store(&n->floor_have, n->cl->ll.caps_required);
  n->on_kick(a);
}

void fuzz_node_start(struct fuzz_node *n, const char *const *sets, int nsets, uv_async_cb on_kick) {
  enum gshmd_config_action action = GSHMD_CONFIG_RUN;
  struct gshmd_cred cred = {0};
  struct gshmd_client *owner;
  char **args = calloc(2 * (OWN_SETS + (size_t)nsets) + 1, sizeof(*args));
  pthread_t t;
  int fd, nargs;

  signal(SIGPIPE, SIG_IGN); /* as gshmd */
  unsetenv("NOTIFY_SOCKET");
  gshm__log_setup("fuzz", getenv("GSHM_FUZZ_LOG") ? 7 : 0, 0); /* GSHM_FUZZ_LOG=1: the node's log */
  snprintf(keyfile, sizeof(keyfile), "%s/gshm-fuzz-cluster-key.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!args || (fd = mkstemp(keyfile)) < 0 || write(fd, "fuzz-cluster-key-0123456789", 27) != 27)
    abort();
  close(fd);
  atexit(remove_keyfile);
  rogue_key(keyfile, n->key);
  n->port = free_port();
  if ((n->rlfd = rogue_listener(&n->rport)) < 0)
    abort();
  nargs = node_args(n, sets, nsets, args);
  if (gshmd_config_init(&n->cfg) || gshmd_config_setup(&n->cfg, nargs, args, &action) ||
      uv_loop_init(&n->loop))
    abort();
  free(args); /* (the config copied what it keeps) */
  gshmd_registry_init(&n->reg, &n->cfg);
  if (gshmd_backend_host_create(&n->cfg, &n->reg.host) ||
      gshmd_leasekey_setup(&n->leasekey, NULL, NULL, 0))
    abort();
  gshmd_leasekey_attach(&n->leasekey, &n->reg);
  cred.pid = getpid();
  cred.uid = geteuid();
  cred.gid = getegid();
  cred.admin = true;
  if (gshmd_registry_client_add(&n->reg, &cred, &owner))
    abort();
  segment(n, owner, "pub/a", 4096);
  segment(n, owner, "pub/b", 65536);
  if (gshmd_registry_client_add(&n->reg, &cred, &n->puller))
    abort();
  if (gshmd_cluster_start(&n->loop, &n->cfg, &n->reg, to_client, n, &n->cl) || !n->cl ||
      uv_async_init(&n->loop, &n->kick, kicked))
    abort();
  n->kick.data = n;
  n->on_kick = on_kick;
  if (pthread_create(&t, NULL, node_thread, n))
    abort();
}

int fuzz_node_pull_a(struct fuzz_node *n, uint32_t request_id) {
  Gshm__PullRequest m = GSHM__PULL_REQUEST__INIT;
  const char *msg = NULL;

  m.peer = "r";
  m.name = "pub/a";
  m.local_name = "got/a";
  m.replace = true;
  return gshmd_cluster_handle_pull(n->cl, n->puller, request_id, &m, &msg);
}

size_t fuzz_node_flags(const uint8_t *data, size_t size, struct fuzz_flags *f) {
  uint8_t more;

  if (size < 1 || ((data[0] & 16) && size < 2))
    return 0;
  more = (data[0] & 16) ? data[1] : 0;
  f->caps |= more & 1 ? GSHM__CLUSTER__CAP__CAP_SUBKEYS : 0;
  f->required = more & 2 ? GSHM__CLUSTER__CAP__CAP_SUBKEYS : 0;
  return (data[0] & 16) ? 2 : 1;
}

void fuzz_node_min_protocol(struct fuzz_node *n, uint32_t required) {
  if (atomic_load(&n->floor_have) == required)
    return;
  atomic_store(&n->floor_want, required);
  uv_async_send(&n->kick);
  for (int i = 0; i < 5000 && atomic_load(&n->floor_have) != required; i++)
    usleep(1000);
  if (atomic_load(&n->floor_have) != required) {
    fprintf(stderr, "fuzz: the node's loop did not take cluster.min_protocol\n");
    abort();
  }
}

bool fuzz_node_connect(const struct fuzz_node *n, struct rogue *r, uint32_t caps,
                       uint32_t required) {
  memset(r, 0, sizeof(*r));
  r->caps = caps;
  if (!rogue_connect(r, n->port, "r", "n", n->key)) {
    if (required & ~caps) {
      fprintf(stderr, "fuzz: a peer without CAP_SUBKEYS linked under cluster.min_protocol = 2.6\n");
      abort();
    }
    return true;
  }
  /* Refused for want of CAP_SUBKEYS: before the node sent its
   * Challenge, the first MAC (under the cluster key itself here). */
  if ((required & ~caps) && !sodium_is_zero(r->nonce_theirs, sizeof(r->nonce_theirs))) {
    fprintf(stderr, "fuzz: the node sent a Challenge to a peer without CAP_SUBKEYS under "
                    "cluster.min_protocol = 2.6\n");
    abort();
  }
  rogue_close(r);
  memset(r, 0, sizeof(*r));
  r->caps = required;
  if (rogue_connect(r, n->port, "r", "n", n->key)) {
    fprintf(stderr, "fuzz: the node takes no hello: %s\n", r->refusal);
    abort();
  }
  rogue_close(r);
  return false;
}

bool fuzz_node_wait_connection(struct fuzz_node *n, void (*idle)(void)) {
  for (int i = 0; i < 5000 && !atomic_load(&n->pull_done); i++) {
    struct pollfd pf = {.fd = n->rlfd, .events = POLLIN};
    if (poll(&pf, 1, 1) > 0)
      return true;
    if (idle)
      idle();
  }
  return false;
}

bool fuzz_node_accept(struct fuzz_node *n, struct rogue *r, uint32_t caps, uint32_t required,
                      void (*idle)(void)) {
  for (int tries = 0; tries < 4 && fuzz_node_wait_connection(n, idle); tries++) {
    rogue_close(r);
    memset(r, 0, sizeof(*r));
    r->caps = caps;
    if (!rogue_accept(r, n->rlfd, "r", n->key))
      break;
  }
  if (r->up && (required & ~caps)) {
    fprintf(stderr, "fuzz: the node linked to a peer without CAP_SUBKEYS under "
                    "cluster.min_protocol = 2.6\n");
    abort();
  }
  return r->up;
}

uint32_t fuzz_node_send_record(struct rogue *r, const uint8_t *p, size_t len,
                               uint64_t last_grant) {
  Gshm__Cluster__Msg *m = gshm__cluster__msg__unpack(NULL, len, p);
  uint32_t rid = m && m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST ? m->request_id : 0;
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
  return rid;
}

bool fuzz_node_serve_record(const struct fuzz_answer *a, const uint8_t **p, size_t *n) {
  Gshm__Cluster__Msg *m;
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
    if ((m = gshm__cluster__msg__unpack(NULL, len, *p))) {
      if (!(how & 4))
        m->request_id = a->rid;
      rogue_send(a->r, m);
      gshm__cluster__msg__free_unpacked(m, NULL);
    } else {
      rogue_send_packed(a->r, *p, len);
    }
    break;
  case 1:
    a->data(a, how, *p, len);
    break;
  case 2: {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&a->r->st.tcp, &fd) == 0 && write(fd, *p, len) < 0)
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

bool fuzz_node_next_request(struct rogue *r, Gshm__Cluster__Msg *(*recv)(struct rogue *r, int ms),
                            uint32_t *rid, uint64_t *read_off) {
  Gshm__Cluster__Msg *m = recv(r, 5);

  if (!m)
    return *rid != 0;
  *rid = m->request_id;
  if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ && m->read)
    *read_off = m->read->offset;
  else if (m->body_case == GSHM__CLUSTER__MSG__BODY_STAGE && m->stage)
    *read_off = m->stage->offset;
  gshm__cluster__msg__free_unpacked(m, NULL);
  return *rid != 0; /* (0: a Release, no answer due) */
}
