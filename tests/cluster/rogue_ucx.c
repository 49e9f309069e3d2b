/* SPDX-License-Identifier: Apache-2.0 */
/* A rogue serving peer's bytes over UCX, in a child process (rogue_ucx.h). */
#include "rogue_ucx.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/capability.h>
#include <ucp/api/ucp.h>

#include "gshm.h"
#include "harness.h"

#define DATA_AM_ID 0x68 /* gshm's one UCX message id (daemon/cluster/data.c) */

/* The header of a UCX data message (daemon/cluster/data.c). */
struct ucx_data_hdr {
  uint64_t token;
  uint32_t request_id;
  uint32_t reserved;
  uint64_t offset;
};

/* What the child is told to send: the Read's request id, offset, length,
 * and the seed of its bytes. */
struct ask {
  uint32_t rid;
  uint64_t offset, len;
  unsigned long long seed;
};

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *pull_thread(void *arg) {
  struct rogue_ucx_pull *pl = arg;
  gshm_pull_opts_t po = {.location = pl->location};
  gshm_pull_result_t r;
  gshm_client_t *c;

  pl->err = gshm_connect(pl->sock, "rogue-ucx-pull", &c);
  if (!pl->err) {
    pl->err = gshm_pull(c, pl->peer, pl->name, &po, &r);
    snprintf(pl->msg, sizeof(pl->msg), "%s", gshm_last_error(c));
    gshm_disconnect(c);
  }
  pl->done_ms = mono_ms();
  pl->done = true;
  return NULL;
}

int rogue_ucx_pull_start(struct rogue_ucx_pull *pl) {
  return pthread_create(&pl->t, NULL, pull_thread, pl);
}

static void progress_until(ucp_worker_h w, ucs_status_ptr_t sp) {
  if (!UCS_PTR_IS_PTR(sp))
    return;
  while (ucp_request_check_status(sp) == UCS_INPROGRESS)
    ucp_worker_progress(w);
  ucp_request_free(sp);
}

/* The child's worker, progressed until asked on rfd (which it reads). */
static void progress_until_asked(ucp_worker_h w, int rfd) {
  for (;;) {
    struct pollfd pfd = {.fd = rfd, .events = POLLIN};
    ucp_worker_progress(w);
    if (poll(&pfd, 1, 1) == 1)
      return;
  }
}

/* Told to go on (rfd): the rendezvous sp is progressed until it ends or
 * ms pass, its status told (wfd); then the worker is progressed for
 * good (its endpoint's last messages), until killed. */
static void child_resume(ucp_worker_h w, ucs_status_ptr_t sp, int rfd, int wfd) {
  int32_t st = 1;
  int ms;

  if (read(rfd, &ms, sizeof(ms)) != sizeof(ms))
    _exit(5);
  if (!UCS_PTR_IS_PTR(sp))
    st = (int32_t)UCS_PTR_STATUS(sp);
  for (int64_t t0 = mono_ms(); st == 1 && mono_ms() - t0 < ms;) {
    ucp_worker_progress(w);
    if (ucp_request_check_status(sp) != UCS_INPROGRESS)
      st = (int32_t)ucp_request_check_status(sp);
  }
  if (write(wfd, &st, sizeof(st)) != sizeof(st))
    _exit(6);
  for (;;) {
    ucp_worker_progress(w);
    usleep(1000);
  }
}

/* The child's capabilities, dropped as gshmd's are (the unit's empty
 * CapabilityBoundingSet=, the harness's spawn): gshmd keeps UCX to its
 * posix and cma shared memory (no sysv), whose peers open each other's
 * segment through /proc/PID/fd and read with process_vm_readv, which the
 * kernel allows only into a process whose every capability the opener
 * has: gshmd, with none, could not reach a root child that kept all. */
static void child_drop_capabilities(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];

  memset(d, 0, sizeof(d));
  syscall(SYS_capset, &h, d);
}

/* The child: an endpoint to the node's worker (addr) over shared memory
 * only (its puts then land by cross-memory attach, whatever the node
 * has: no RDMA connection that the node's failed endpoint takes down),
 * wired up (told on wfd); then, asked (rfd), the bytes as one active
 * message by rendezvous with no key for the node to read them with
 * (RNDV_SCHEME=put_zcopy: the node must wait for our puts), told (wfd),
 * and nothing more until told to go on (child_resume): meanwhile it is
 * stopped by the parent. */
static void child_run(const uint8_t *addr, uint64_t token, int rfd, int wfd) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                        .address = (const ucp_address_t *)addr};
  ucp_request_param_t fp = {0};
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                            .flags = UCP_AM_SEND_FLAG_RNDV};
  struct ucx_data_hdr hdr = {.token = token};
  ucp_config_t *cfg;
  ucp_context_h ctx;
  ucp_worker_h w;
  ucp_ep_h e;
  struct ask a;
  uint8_t *buf;
  ucs_status_ptr_t sp;

  child_drop_capabilities();
  if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK ||
      ucp_config_modify(cfg, "TLS", "sm") != UCS_OK ||
      ucp_config_modify(cfg, "RNDV_SCHEME", "put_zcopy") != UCS_OK ||
      ucp_init(&p, cfg, &ctx) != UCS_OK || ucp_worker_create(ctx, &wp, &w) != UCS_OK ||
      ucp_ep_create(w, &ep, &e) != UCS_OK)
    _exit(2);
  progress_until(w, ucp_ep_flush_nbx(e, &fp));
  /* the node's wireup answer (its endpoint's id, which a rendezvous
   * names: the RTS waits for it) comes when its loop next progresses its
   * worker, which its sweep does every second even where nothing wakes it */
  for (int64_t t0 = mono_ms(); mono_ms() - t0 < 1500;)
    ucp_worker_progress(w);
  if (write(wfd, "w", 1) != 1)
    _exit(3);
  progress_until_asked(w, rfd);
  if (read(rfd, &a, sizeof(a)) != sizeof(a) || !(buf = malloc(a.len)))
    _exit(3);
  harness_random(buf, a.len, a.seed);
  hdr.request_id = a.rid;
  hdr.offset = a.offset;
  /* The RTS: sent, and the worker progressed until its first event (the
   * node's answer to it), then not until told: the node's receive waits
   * for the bytes.  (Stopped without that progress, the RTS stayed
   * queued here: 3 runs of 3; so stopped, the receive was always left
   * waiting, 4 of 4.) */
  sp = ucp_am_send_nbx(e, DATA_AM_ID, &hdr, sizeof(hdr), buf, a.len, &rp);
  while (!ucp_worker_progress(w))
    ;
  if (write(wfd, "s", 1) != 1)
    _exit(4);
  child_resume(w, sp, rfd, wfd);
}

int rogue_ucx_child_start(struct rogue_ucx_child *ch, const uint8_t *addr, uint64_t token) {
  int to[2], from[2];
  char c = 0;

  *ch = (struct rogue_ucx_child){.ask = -1, .said = -1};
  if (pipe(to))
    return -1;
  if (pipe(from)) {
    close(to[0]);
    close(to[1]);
    return -1;
  }
  ch->pid = fork();
  if (ch->pid == 0) {
    close(to[1]);
    close(from[0]);
    child_run(addr, token, to[0], from[1]);
  }
  close(to[0]);
  close(from[1]);
  ch->ask = to[1];
  ch->said = from[0];
  if (ch->pid < 0 || read(ch->said, &c, 1) != 1 || c != 'w') {
    rogue_ucx_child_kill(ch);
    return -1;
  }
  return 0;
}

int rogue_ucx_child_send(struct rogue_ucx_child *ch, uint32_t rid, uint64_t offset, uint64_t len,
                         unsigned long long seed) {
  struct ask a = {.rid = rid, .offset = offset, .len = len, .seed = seed};
  char c = 0;

  if (write(ch->ask, &a, sizeof(a)) != (ssize_t)sizeof(a) || read(ch->said, &c, 1) != 1 ||
      c != 's')
    return -1;
  kill(ch->pid, SIGSTOP); /* (its worker is not progressed meanwhile anyway) */
  return 0;
}

int rogue_ucx_child_resume(struct rogue_ucx_child *ch, int ms) {
  int32_t st;

  kill(ch->pid, SIGCONT);
  if (write(ch->ask, &ms, sizeof(ms)) != sizeof(ms) ||
      read(ch->said, &st, sizeof(st)) != sizeof(st))
    return -1;
  return st;
}

void rogue_ucx_child_kill(struct rogue_ucx_child *ch) {
  if (ch->pid > 0) {
    kill(ch->pid, SIGKILL);
    waitpid(ch->pid, NULL, 0);
  }
  if (ch->ask >= 0)
    close(ch->ask);
  if (ch->said >= 0)
    close(ch->said);
  *ch = (struct rogue_ucx_child){.ask = -1, .said = -1};
}

size_t rogue_ucx_take_link(struct rogue *r, int lfd, const char *name, const uint8_t key[32],
                           uint8_t *addr, size_t cap, uint64_t *token_out) {
  Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxAnswer ans = GSHM__CLUSTER__UCX_ANSWER__INIT;
  size_t len;
  int e = -1;

  for (int i = 0; i < 5 && e; i++) {
    rogue_close(r);
    memset(r, 0, sizeof(*r));
    r->caps = GSHM__CLUSTER__CAP__CAP_UCX;
    e = rogue_accept(r, lfd, name, key);
  }
  if (e || (len = rogue_ucx_offer(r, addr, cap, token_out, 10000)) <= 2)
    return 0;
  ans.ok = true;
  ans.why = "";
  a.body_case = GSHM__CLUSTER__MSG__BODY_UCX_ANSWER;
  a.ucx_answer = &ans;
  rogue_send(r, &a);
  return len;
}

int rogue_ucx_stuck_read(struct rogue *r, struct rogue_ucx_child *ch, uint64_t id,
                         const char *name, uint64_t size, unsigned long long seed,
                         const atomic_bool *done, uint64_t *read_len_out, int64_t *sent_ms_out) {
  bool read = false;
  int e = -1;

  while (!*done && !read && !r->failed) {
    Gshm__Cluster__Msg *m = rogue_recv(r, 20);
    if (!m || rogue_answer_count(r, m)) {
      ;
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT_REQUEST) {
      rogue_send_grant(r, m->request_id, id, name, size);
    } else if (m->body_case == GSHM__CLUSTER__MSG__BODY_READ) {
      read = true;
      *read_len_out = m->read->length;
      e = rogue_ucx_child_send(ch, m->request_id, m->read->offset, m->read->length, seed);
      *sent_ms_out = mono_ms();
    }
    if (m)
      gshm__cluster__msg__free_unpacked(m, NULL);
  }
  return e;
}
