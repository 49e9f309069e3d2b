/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: what a cluster peer that holds the key sends over
 * UCX, and the staged (slot) path, through gshmd's real cluster code:
 * data.c on_data_am (the data message's header: token, request id,
 * offset; its length; eager or rendezvous) and its receive into the
 * request's memory (gshmd__link_data_dest, recv_ucx, on_ucx_received),
 * worker.c on_am_refused (every other message id), hello.c on_ucx_offer
 * and worker_address_copy (a UcxOffer's worker address and token) and
 * on_ucx_answer, serve.c's Stage (stage_chunk: slot, offset, length of
 * a staged grant, the copy into the slot, its send over UCX) and the
 * puller's staged grant (pull_slots.c: slots, slot_size, length).
 *
 * Nothing is stubbed: the node "n" runs in this process on its own
 * libuv loop and thread with cluster.transport = ucx (its real UCP
 * worker, UCX's shared-memory transports: posix and cma), exporting two
 * host segments (pub/a, 4 KiB; pub/b, 64 KiB), as fuzz_cluster's node;
 * its one peer "r" is tests/cluster/rogue.c on this thread for the
 * control stream, with a UCP worker of its own in this process (TLS
 * posix,cma) that sends and receives the active messages for real:
 * whatever a peer can put in a UCX message reaches the node through
 * UCX's own receive path, as from another host.
 *
 * Input: byte 0 flags; flags & 1 the mode; flags & 2 (mode 1): the
 * node serves with cluster.staging = always (every grant staged: Stage,
 * not Read), for this input.  Its bit 4 says that byte 1 is a second
 * flags byte, as fuzz_cluster's (fuzz_node_flags), and the rest starts
 * after it: bit 0 the rogue says CAP_SUBKEYS (protocol 2.6), bit 1 the
 * node has cluster.min_protocol = 2.6 for this input (else 2.0).
 *   0: the node pulls "pub/a" from the rogue (into "got/a"): the rogue
 *      takes the node's link (CAP_UCX), its UcxOffer (the node's worker
 *      address and the link's token) and answers it ok, then answers
 *      each request the node sends (GrantRequest, Read, Stage) with the
 *      next record [u8 how][u16 LE len][len bytes]: how & 3 = 0 a Msg
 *      on the stream (given the request's id unless how & 4; a Grant of
 *      PATH_STAGED makes the node ask Stages), 1 a UCX active message
 *      from the rogue's worker: the first min(len, 24 + (how >> 6)*8)
 *      bytes its header (the 24 of data.c's struct ucx_data_hdr; a token
 *      of 0 made the link's, a request id of 0 the request's, and with
 *      how & 8 the Read's offset added to the offset), the rest its
 *      data; how & 16 sent by rendezvous (UCP_AM_SEND_FLAG_RNDV), how &
 *      32 eagerly, else as UCX likes; with how & 4 under message id
 *      (first data byte) instead of gshm's 0x68 (the refusing handler),
 *      2 the bytes raw on the stream, 3 no answer.  Then the rogue
 *      closes the link and the pull must end within 5 s.
 *   1: the rogue connects as peer "r" (a puller, CAP_UCX) and sends a
 *      UcxOffer: the first record [u8 how][u16 LE len][len bytes]: with
 *      how & 1 those bytes are the worker address, as is (the first 8
 *      bytes, when there are 8, its token); else the rogue worker's real
 *      address and the bytes' first 8 the token.  Then each next record
 *      [u16 LE len][len bytes] is one control frame's payload (a Msg:
 *      GrantRequest, Read, Stage, Release; grant 0 in a Read, Stage or
 *      Release names the last grant the node gave; after a GrantRequest
 *      the rogue waits up to 300 ms for its answer, which a staged
 *      grant's slots delay), and whatever the node sends over UCX the
 *      rogue's worker takes (a rendezvous received in full).
 *
 * Checked: no crash, leak or undefined behaviour in the node (nor an
 * abort of the rogue's own UCX, which an honest gshmd's would share),
 * every pull ends within 5 s of its link's end, where the node refused
 * the rogue's hello it still completes an honest one, and under
 * cluster.min_protocol = 2.6 no peer without CAP_SUBKEYS gets a
 * Challenge or a link.
 *
 * Not reached here: a pull into a GPU (pull_slots.c's local slots and
 * the copy from them: the node has no CUDA backend; run
 * tests/gpu/test_cluster_gpu_rogue_ucx on a GPU machine for the
 * rendezvous into them); the serving side's sends by rendezvous from a
 * registered segment or slot (shared memory cannot detect a dead peer,
 * so the node's endpoint to the rogue is an eager one, as between two
 * gshmd on one host: its sends go packed, send_pack; rendezvous sends
 * need RDMA, or tcp, which gshmd never gives UCX); UCX's transports
 * other than shared memory; and UCX's own wire (the rogue speaks honest
 * UCX: a peer with a modified UCX reaches UCX's parsers, which trust
 * their peers). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "cluster.h"
#include "fuzz_node.h"
#include "rogue.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define DATA_AM_ID 0x68  /* data.c's */
#define HDR_LEN 24       /* data.c's struct ucx_data_hdr */
#define MAX_DATA (1u << 17) /* data bytes of one message at most */
#define SENDS 64         /* the rogue's sends UCX has not ended, at most */

static struct fuzz_node fz; /* the node */
static struct rogue rogue; /* (large: its queue) */
static atomic_int pull_mode;    /* 1: start the pull of pub/a */
static atomic_int staging_want; /* 1 always, 2 auto: set on the node's thread */
static atomic_bool staging_set;
static uint32_t pull_rid;
static char *staging_conf;      /* cluster.staging as configured */

/* The rogue's UCP worker, its endpoint to the node's worker, and its
 * sends not yet ended (their buffers live until then). */
static ucp_context_h rctx;
static ucp_worker_h rw;
static ucp_ep_h rep;
static uint8_t node_addr[4096];
static size_t node_addr_len;
static struct {
  ucs_status_ptr_t sp;
  void *buf;
} sends[SENDS];
static uint8_t sink[1 << 20];   /* where the node's rendezvous sends land */
static uint64_t sink_msgs;      /* the node's data messages the rogue's worker took */

/* On the node's thread: cluster.staging as asked, then the pull. */
static void on_kick(uv_async_t *a) {
  int want = atomic_exchange(&staging_want, 0);

  (void)a;
  if (want) {
    fz.cfg.cluster_staging = want == 1 ? (char *)"always" : staging_conf;
    atomic_store(&staging_set, true);
  }
  if (!atomic_exchange(&pull_mode, 0))
    return;
  if (fuzz_node_pull_a(&fz, ++pull_rid))
    atomic_store(&fz.pull_done, true);
}

/* ---- the rogue's worker ------------------------------------------------ */

static void on_sink_received(void *request, ucs_status_t status, size_t length, void *user_data) {
  (void)status, (void)length, (void)user_data;
  ucp_request_free(request);
}

/* What the node sends over UCX (its data messages to a pulling rogue). */
static ucs_status_t on_rogue_am(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param) {
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
                            .cb.recv_am = on_sink_received};
  ucs_status_ptr_t sp;

  (void)arg, (void)header, (void)header_length;
  sink_msgs++;
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
    return UCS_OK;
  if (length > sizeof(sink)) {
    ucp_am_data_release(rw, data);
    return UCS_OK;
  }
  sp = ucp_am_recv_data_nbx(rw, data, sink, length, &rp);
  (void)sp; /* (a pointer: freed by on_sink_received) */
  return UCS_OK;
}

static void rogue_worker_start(void) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB,
                               .id = DATA_AM_ID, .cb = on_rogue_am};
  ucp_config_t *c;

  if (ucp_config_read(NULL, NULL, &c) != UCS_OK || ucp_config_modify(c, "TLS", "posix,cma") ||
      ucp_init(&p, c, &rctx) != UCS_OK || ucp_worker_create(rctx, &wp, &rw) != UCS_OK ||
      ucp_worker_set_am_recv_handler(rw, &ap) != UCS_OK)
    abort();
  ucp_config_release(c);
}

/* Progresses the rogue's worker; frees the sends UCX ended.  Returns
 * how many still run. */
static unsigned rogue_progress(void) {
  unsigned n = 0;

  while (ucp_worker_progress(rw))
    ;
  for (int i = 0; i < SENDS; i++) {
    if (!sends[i].buf)
      continue;
    if (sends[i].sp && ucp_request_check_status(sends[i].sp) == UCS_INPROGRESS) {
      n++;
      continue;
    }
    if (sends[i].sp)
      ucp_request_free(sends[i].sp);
    free(sends[i].buf);
    sends[i].buf = NULL;
    sends[i].sp = NULL;
  }
  return n;
}

static void rogue_idle(void) { (void)rogue_progress(); }

/* Until the rogue's sends ended, at most ms. */
static void rogue_flush(int ms) {
  for (int i = 0; i < ms && rogue_progress(); i++)
    usleep(1000);
}

/* The rogue's endpoint to the node's worker at addr (len bytes): made
 * once (the node's worker is the same for every input). */
static bool rogue_ep(const uint8_t *addr, size_t len) {
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS};

  if (rep)
    return len == node_addr_len && !memcmp(addr, node_addr, len);
  if (len > sizeof(node_addr))
    return false;
  memcpy(node_addr, addr, len);
  node_addr_len = len;
  ep.address = (const ucp_address_t *)node_addr;
  if (ucp_ep_create(rw, &ep, &rep) != UCS_OK) {
    rep = NULL;
    return false;
  }
  return true;
}

/* One active message to the node: header hdr (hlen bytes), data (dlen
 * bytes), under id, with flags.  Both are copied: UCX reads them until
 * the send ends. */
static void rogue_am(unsigned id, const void *hdr, size_t hlen, const void *data, size_t dlen,
                     uint32_t flags) {
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
  uint8_t *buf = malloc(hlen + dlen + 1);
  ucs_status_ptr_t sp;
  int slot = -1;

  for (int i = 0; i < SENDS && slot < 0; i++)
    if (!sends[i].buf)
      slot = i;
  if (!buf || slot < 0) {
    free(buf);
    return;
  }
  memcpy(buf, hdr, hlen);
  memcpy(buf + hlen, data, dlen);
  sp = ucp_am_send_nbx(rep, id, buf, hlen, buf + hlen, dlen, &rp);
  if (UCS_PTR_IS_PTR(sp)) {
    sends[slot].sp = sp;
    sends[slot].buf = buf;
  } else {
    free(buf);
  }
  rogue_progress();
}

/* ---- setup -------------------------------------------------------------- */

const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\n"; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  static const char *const sets[] = {"cluster.transport=ucx"};

  (void)argc;
  (void)argv;
  fuzz_node_start(&fz, sets, 1, on_kick);
  staging_conf = fz.cfg.cluster_staging;
  rogue_worker_start();
  return 0;
}

/* cluster.staging for this input (always, or as configured), set on the
 * node's thread before anything else happens. */
static void staging(bool always) {
  atomic_store(&staging_set, false);
  atomic_store(&staging_want, always ? 1 : 2);
  uv_async_send(&fz.kick);
  for (int i = 0; i < 5000 && !atomic_load(&staging_set); i++)
    usleep(200);
}

/* The next control message within ms, the rogue's worker progressed
 * meanwhile. */
static Gshm__Cluster__Msg *recv_msg(struct rogue *r, int ms) {
  Gshm__Cluster__Msg *m = NULL;

  for (int i = 0; i < ms && !m && !r->failed && !r->closed; i++) {
    rogue_progress();
    m = rogue_recv(r, 1);
  }
  return m;
}

/* ---- mode 0: the node pulls, the rogue's bytes come over UCX ------------ */

/* A record of mode 0 as a UCX message answering a->rid (a Read's or
 * Stage's at a->read_off), with the link's token (see the top). */
static void answer_ucx(const struct fuzz_answer *a, uint8_t how, const uint8_t *p, size_t len) {
  uint8_t hdr[HDR_LEN + 24];
  size_t hlen = HDR_LEN + (size_t)(how >> 6) * 8;
  unsigned id = DATA_AM_ID;
  uint32_t flags = (how & 16)   ? UCP_AM_SEND_FLAG_RNDV
                   : (how & 32) ? UCP_AM_SEND_FLAG_EAGER
                                : 0;

  if (hlen > len)
    hlen = len;
  memcpy(hdr, p, hlen);
  if (hlen >= HDR_LEN) {
    uint64_t t, off;
    uint32_t r;
    memcpy(&t, hdr, 8);
    memcpy(&r, hdr + 8, 4);
    memcpy(&off, hdr + 16, 8);
    if (!t)
      t = a->token;
    if (!r)
      r = a->rid;
    if (how & 8)
      off += a->read_off;
    memcpy(hdr, &t, 8);
    memcpy(hdr + 8, &r, 4);
    memcpy(hdr + 16, &off, 8);
  }
  p += hlen;
  len -= hlen;
  if ((how & 4) && len) {
    id = p[0];
    p++;
    len--;
  }
  if (len > MAX_DATA)
    len = MAX_DATA;
  rogue_am(id, hdr, hlen, p, len, flags);
}

/* Takes the node's link (CAP_UCX and f's caps) and answers its
 * UcxOffer; returns whether the link is up with UCX (*token_out its
 * token). */
static bool take_link(const struct fuzz_flags *f, struct rogue *r, uint64_t *token_out) {
  Gshm__Cluster__Msg a = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxAnswer ans = GSHM__CLUSTER__UCX_ANSWER__INIT;
  uint8_t addr[4096];
  size_t len = 0;

  if (!fuzz_node_accept(&fz, r, f->caps, f->required, rogue_idle) ||
      !(len = rogue_ucx_offer(r, addr, sizeof(addr), token_out, 2000)))
    return false;
  ans.ok = rogue_ep(addr, len);
  ans.why = "";
  a.body_case = GSHM__CLUSTER__MSG__BODY_UCX_ANSWER;
  a.ucx_answer = &ans;
  rogue_send(r, &a);
  return ans.ok;
}

static void serve(const struct fuzz_flags *f, const uint8_t *p, size_t n) {
  struct rogue *r = &rogue;
  uint32_t rid = 0;
  uint64_t read_off = 0, token = 0;

  atomic_store(&fz.pull_done, false);
  atomic_store(&pull_mode, 1);
  uv_async_send(&fz.kick);
  memset(r, 0, sizeof(*r));
  if (take_link(f, r, &token)) {
    while (r->up && !r->failed && !r->closed && !atomic_load(&fz.pull_done)) {
      struct fuzz_answer a = {.r = r, .token = token, .data = answer_ucx};
      if (!fuzz_node_next_request(r, recv_msg, &rid, &read_off))
        continue;
      a.rid = rid;
      a.read_off = read_off;
      if (!fuzz_node_serve_record(&a, &p, &n))
        break;
    }
    /* what went last over UCX lands (or is refused) before the link ends */
    rogue_flush(200);
    for (int i = 0; i < 4 && r->up && !r->failed && !atomic_load(&fz.pull_done); i++) {
      Gshm__Cluster__Msg *m = recv_msg(r, 5);
      if (m)
        gshm__cluster__msg__free_unpacked(m, NULL);
    }
  }
  rogue_close(r);
  for (int i = 0; i < 5000 && !atomic_load(&fz.pull_done); i++) {
    rogue_progress();
    usleep(1000);
  }
  if (!atomic_load(&fz.pull_done)) {
    fprintf(stderr, "fuzz_ucx_data: the pull did not end within 5 s of its link's end\n");
    abort();
  }
  rogue_flush(1000); /* (the node's receives end with the rogue's sends) */
}

/* ---- mode 1: the rogue pulls, the node's bytes go over UCX -------------- */

static uint64_t last_grant;

/* Reads what the node answers until it is quiet for ms, and until the
 * answer to request rid came (0: none due; at most 300 ms: a staged
 * grant's answer waits for its slots). */
static void drain(struct rogue *r, int ms, uint32_t rid) {
  Gshm__Cluster__Msg *m;
  for (int i = 0; i < 100; i++) {
    while ((m = recv_msg(r, ms))) {
      if (m->body_case == GSHM__CLUSTER__MSG__BODY_GRANT && m->grant)
        last_grant = m->grant->grant_id;
      if (m->request_id == rid)
        rid = 0;
      gshm__cluster__msg__free_unpacked(m, NULL);
    }
    if (!rid || r->failed || r->closed)
      return;
  }
}

/* The UcxOffer of the first record (see the top). */
static void offer(struct rogue *r, const uint8_t *p, size_t len, uint8_t how) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__UcxOffer o = GSHM__CLUSTER__UCX_OFFER__INIT;
  ucp_address_t *addr = NULL;
  size_t alen = 0;

  if (len >= 8)
    memcpy(&o.token, p, 8);
  if (how & 1) {
    o.worker_address.data = (uint8_t *)p;
    o.worker_address.len = len;
  } else if (ucp_worker_get_address(rw, &addr, &alen) == UCS_OK) {
    o.worker_address.data = (uint8_t *)addr;
    o.worker_address.len = alen;
  }
  m.body_case = GSHM__CLUSTER__MSG__BODY_UCX_OFFER;
  m.ucx_offer = &o;
  rogue_send(r, &m);
  if (addr)
    ucp_worker_release_address(rw, addr);
}

static void pull(const struct fuzz_flags *f, const uint8_t *data, size_t size) {
  struct rogue *r = &rogue;
  size_t off = 0;

  if (!fuzz_node_connect(&fz, r, f->caps, f->required))
    return;
  if (size >= 3) {
    size_t len = (size_t)data[1] | (size_t)data[2] << 8;
    if (len > size - 3)
      len = size - 3;
    offer(r, data + 3, len, data[0]);
    off = 3 + len;
    drain(r, 5, 0);
  }
  while (off + 2 <= size && !r->failed && !r->closed) {
    size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
    off += 2;
    if (len > size - off)
      len = size - off;
    uint32_t rid = fuzz_node_send_record(r, data + off, len, last_grant);
    off += len;
    drain(r, 3, rid);
  }
  rogue_flush(200);
  rogue_close(r);
  rogue_flush(200);
  if (getenv("GSHM_FUZZ_LOG"))
    fprintf(stderr, "fuzz_ucx_data: %llu data messages over UCX so far\n",
            (unsigned long long)sink_msgs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fuzz_flags f = {.caps = GSHM__CLUSTER__CAP__CAP_UCX};
  size_t off;

  if (size > 1 << 18 || !(off = fuzz_node_flags(data, size, &f)))
    return 0;
  f.mode = data[0] & 1;
  fuzz_node_min_protocol(&fz, f.required);
  staging(data[0] & 2);
  if (f.mode)
    pull(&f, data + off, size - off);
  else
    serve(&f, data + off, size - off);
  return 0;
}
