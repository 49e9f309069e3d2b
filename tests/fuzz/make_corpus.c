/* SPDX-License-Identifier: Apache-2.0 */
/* Writes the fuzz targets' seed corpus: make_corpus OUTDIR creates
 * OUTDIR/<target>/<name> for every target in tests/fuzz/CMakeLists.txt.
 * The output is checked in (tests/fuzz/corpus); rerun after a protocol
 * change.  Small on purpose: libFuzzer grows it.
 *
 * corpus/fuzz_server also holds found-<sha1> files: the inputs of an
 * 11-minute fuzz_server run, minimised with -merge=1, so that the short
 * CI runs start from deep protocol states; corpus/fuzz_client and
 * corpus/fuzz_cluster those of 5-minute runs, corpus/fuzz_ucx_data
 * those of a 4-minute one.  make_corpus leaves them be.  (fuzz_cluster's
 * and fuzz_ucx_data's of a first flags byte with bit 4 set were given a
 * second one, 0, when that bit came to announce it: the same inputs.) */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cluster.pb-c.h"
#include "wire.h"

static const char *outdir;

static void put(const char *target, const char *name, const void *data, size_t len) {
  char path[1024];
  FILE *f;

  snprintf(path, sizeof(path), "%s/%s", outdir, target);
  if (mkdir(path, 0755) < 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
  if (!(f = fopen(path, "wb")) || fwrite(data, 1, len, f) != len || fclose(f)) {
    perror(path);
    exit(1);
  }
}

static void put_msg(const char *target, const char *name, const ProtobufCMessage *m) {
  uint8_t buf[4096];
  size_t n = protobuf_c_message_pack(m, buf);
  put(target, name, buf, n);
}

static size_t packet(uint16_t type, uint32_t id, const ProtobufCMessage *m, uint8_t *out) {
  size_t len;
  if (gshm__wire_pack(type, id, m, out, 4096, &len))
    exit(1);
  return len;
}

/* fuzz_server input: flags, then (u16 length, packet)*. */
struct script {
  uint8_t buf[8192];
  size_t len;
};

static void script_add(struct script *s, uint16_t type, uint32_t id, const ProtobufCMessage *m) {
  uint8_t pkt[4096];
  size_t n = packet(type, id, m, pkt);
  s->buf[s->len++] = (uint8_t)(n & 0xff);
  s->buf[s->len++] = (uint8_t)(n >> 8);
  memcpy(s->buf + s->len, pkt, n);
  s->len += n;
}

/* fuzz_client input: flags, the calls, then [how][u16 len][Reply]* (the
 * fake gshmd's answers, fuzz_client.c). */
struct answers {
  uint8_t buf[8192];
  size_t len;
};

static void answers_start(struct answers *a, const uint8_t *calls, size_t ncalls) {
  a->buf[0] = 1; /* a valid Welcome */
  a->buf[1] = (uint8_t)ncalls;
  memcpy(a->buf + 2, calls, ncalls);
  a->len = 2 + ncalls;
}

static void answers_add(struct answers *a, uint8_t how, const Gshm__Reply *r) {
  size_t n = protobuf_c_message_pack(&r->base, a->buf + a->len + 3);
  a->buf[a->len] = how;
  a->buf[a->len + 1] = (uint8_t)(n & 0xff);
  a->buf[a->len + 2] = (uint8_t)(n >> 8);
  a->len += 3 + n;
}

/* Seeds for fuzz_client: a gshmd's usual answers to libgshm's calls (call
 * numbers: fuzz_client.c's call()). */
static void client_corpus(void) {
  Gshm__Reply ok = GSHM__REPLY__INIT, r = GSHM__REPLY__INIT;
  Gshm__SegmentInfo si = GSHM__SEGMENT_INFO__INIT, *sis[2] = {&si, &si};
  Gshm__LeaseGrant gr = GSHM__LEASE_GRANT__INIT;
  Gshm__SegmentList sl = GSHM__SEGMENT_LIST__INIT;
  Gshm__PullProgress pp = GSHM__PULL_PROGRESS__INIT;
  Gshm__PullResult pr = GSHM__PULL_RESULT__INIT;
  Gshm__ClusterPeer cp = GSHM__CLUSTER_PEER__INIT, *cps[1] = {&cp};
  Gshm__ClusterPeerList cpl = GSHM__CLUSTER_PEER_LIST__INIT;
  Gshm__StatusInfo sti = GSHM__STATUS_INFO__INIT;
  struct answers a;

  ok.status = r.status = GSHM__STATUS__STATUS_OK;
  si.id = 7;
  si.generation = 1;
  si.name = "a";
  si.size = si.requested_size = si.granularity = 4096;
  si.location = "host";
  si.mode = 0600;
  si.state = GSHM__SEGMENT_STATE__SEGMENT_STATE_LIVE;
  si.device_index = -1;
  gr.segment = &si;
  gr.lease_id = 4;
  gr.access = GSHM__ACCESS__ACCESS_READ_WRITE;
  r.body_case = GSHM__REPLY__BODY_GRANT;
  r.grant = &gr;
  /* open (a one-page memfd), map and read, stat, close */
  answers_start(&a, (const uint8_t[]){0, 21, 18, 19}, 4);
  answers_add(&a, 1 | 1 << 4 | 1 << 5, &r); /* sealed, one page */
  r.body_case = GSHM__REPLY__BODY_SEGMENT;
  r.segment = &si;
  answers_add(&a, 0, &r);
  answers_add(&a, 0, &ok);
  answers_add(&a, 0, &ok);
  put("fuzz_client", "open_map_stat_close", a.buf, a.len);
  /* create, with an event about it before the grant */
  answers_start(&a, (const uint8_t[]){2, 20}, 2);
  r.body_case = GSHM__REPLY__BODY_GRANT;
  answers_add(&a, 1 | 4 | 1 << 4 | 1 << 5, &r);
  answers_add(&a, 0, &r);
  put("fuzz_client", "create_publish", a.buf, a.len);
  /* list, status */
  answers_start(&a, (const uint8_t[]){4, 7}, 2);
  sl.n_segments = 2;
  sl.segments = sis;
  r.body_case = GSHM__REPLY__BODY_SEGMENTS;
  r.segments = &sl;
  answers_add(&a, 0, &r);
  sti.version = "0.1";
  sti.pid = 1;
  r.body_case = GSHM__REPLY__BODY_STATUS_INFO;
  r.status_info = &sti;
  answers_add(&a, 0, &r);
  put("fuzz_client", "list_status", a.buf, a.len);
  /* remote list, pull with progress */
  answers_start(&a, (const uint8_t[]){12, 13}, 2);
  r.body_case = GSHM__REPLY__BODY_SEGMENTS;
  r.segments = &sl;
  answers_add(&a, 0, &r);
  pp.bytes_done = 4096;
  pp.bytes_total = 8192;
  r.body_case = GSHM__REPLY__BODY_PULL_PROGRESS;
  r.pull_progress = &pp;
  answers_add(&a, 0, &r);
  pr.segment = &si;
  pr.bytes = 8192;
  pr.path = "host";
  pr.peer = "p";
  r.body_case = GSHM__REPLY__BODY_PULL_RESULT;
  r.pull_result = &pr;
  answers_add(&a, 0, &r);
  put("fuzz_client", "remote_list_pull", a.buf, a.len);
  /* peers */
  answers_start(&a, (const uint8_t[]){10, 11}, 2);
  cp.name = "p";
  cp.address = "10.0.0.2:7070";
  cp.state = "up";
  cpl.node_name = "n";
  cpl.n_peers = 1;
  cpl.peers = cps;
  r.body_case = GSHM__REPLY__BODY_CLUSTER_PEERS;
  r.cluster_peers = &cpl;
  answers_add(&a, 0, &r);
  answers_add(&a, 0, &r);
  put("fuzz_client", "peers", a.buf, a.len);
  /* the other lists, and metrics as a memfd and as text */
  {
    Gshm__LeaseInfo li = GSHM__LEASE_INFO__INIT, *lis[1] = {&li};
    Gshm__LeaseList ll = GSHM__LEASE_LIST__INIT;
    Gshm__ClientInfo ci = GSHM__CLIENT_INFO__INIT, *cis[1] = {&ci};
    Gshm__ClientList cl = GSHM__CLIENT_LIST__INIT;
    Gshm__DeviceInfo di = GSHM__DEVICE_INFO__INIT, *dis[1] = {&di};
    Gshm__DeviceList dl = GSHM__DEVICE_LIST__INIT;

    answers_start(&a, (const uint8_t[]){5, 6, 8, 9, 9}, 5);
    li.lease_id = 4;
    li.segment_id = 7;
    li.segment_name = "a";
    li.client_name = "w";
    li.location = "host";
    ll.n_leases = 1;
    ll.leases = lis;
    r.body_case = GSHM__REPLY__BODY_LEASES;
    r.leases = &ll;
    answers_add(&a, 0, &r);
    ci.session_id = 1;
    ci.pid = 2;
    ci.name = "w";
    cl.n_clients = 1;
    cl.clients = cis;
    r.body_case = GSHM__REPLY__BODY_CLIENTS;
    r.clients = &cl;
    answers_add(&a, 0, &r);
    di.index = 0;
    di.pci_bus_id = "0000:01:00.0";
    di.name = "gpu";
    dl.n_devices = 1;
    dl.devices = dis;
    r.body_case = GSHM__REPLY__BODY_DEVICES;
    r.devices = &dl;
    answers_add(&a, 0, &r);
    r.body_case = GSHM__REPLY__BODY_TEXT;
    r.text = "";
    answers_add(&a, 1 | 1 << 4 | 1 << 5, &r); /* the text in a memfd */
    r.text = "gshm_segments 1\n";
    answers_add(&a, 0, &r);
    put("fuzz_client", "lists_metrics", a.buf, a.len);
  }
  /* an error with a message */
  answers_start(&a, (const uint8_t[]){3}, 1);
  r.status = GSHM__STATUS__STATUS_PERMISSION_DENIED;
  r.message = "permission denied";
  r.body_case = GSHM__REPLY__BODY__NOT_SET;
  answers_add(&a, 0, &r);
  put("fuzz_client", "error", a.buf, a.len);
}

/* Writes the record [how][u16 LE len][m packed] at out + at; returns
 * where the next goes. */
static size_t put_record(uint8_t *out, size_t at, uint8_t how, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_pack(m, out + at + 3);
  out[at] = how;
  out[at + 1] = (uint8_t)(n & 0xff);
  out[at + 2] = (uint8_t)(n >> 8);
  return at + 3 + n;
}

/* Seed `name` of fuzz_cluster or fuzz_ucx_data (target): seed (len
 * bytes, one flags byte) with the second flags byte `more` (fuzz_node.h
 * fuzz_node_flags: bit 0 the rogue says CAP_SUBKEYS, protocol 2.6; bit 1
 * the node has cluster.min_protocol = 2.6). */
static void put_26(const char *target, const char *name, const uint8_t *seed, size_t len,
                   uint8_t more) {
  static uint8_t out[16384 + 1];

  out[0] = seed[0] | 16;
  out[1] = more;
  memcpy(out + 2, seed + 1, len - 1);
  put(target, name, out, len + 1);
}

/* Appends to out at len the record [u16 LE length][Msg] of request rid
 * whose body is `field` (case kase): fuzz_cluster's and fuzz_ucx_data's
 * messages from a pulling rogue. */
#define MSG_ADD(out, len, rid, field, body, kase)                                \
  do {                                                                          \
    Gshm__Cluster__Msg m_ = GSHM__CLUSTER__MSG__INIT;                           \
    size_t n_;                                                                  \
    m_.request_id = rid;                                                        \
    m_.body_case = GSHM__CLUSTER__MSG__BODY_##kase;                             \
    m_.field = body;                                                            \
    n_ = protobuf_c_message_pack(&m_.base, (out) + (len) + 2);                  \
    (out)[len] = (uint8_t)(n_ & 0xff);                                          \
    (out)[(len) + 1] = (uint8_t)(n_ >> 8);                                      \
    (len) += 2 + n_;                                                            \
  } while (0)

/* A rogue's grant g (77) of its host segment seg, "pub/a" of 4 KiB, read
 * with Reads: what fuzz_cluster's and fuzz_ucx_data's nodes pull. */
static void grant_pub_a(Gshm__Cluster__Segment *seg, Gshm__Cluster__Grant *g) {
  seg->id = 1;
  seg->generation = 1;
  seg->name = "pub/a";
  seg->size = seg->allocated = 4096;
  seg->location = "host";
  g->segment = seg;
  g->grant_id = 77;
  g->path = GSHM__CLUSTER__PATH__PATH_HOST;
  g->length = 4096;
}

/* Seeds for fuzz_cluster: [flags][u16 len][Msg]* (fuzz_cluster.c); grant
 * 0 in a Read, Stage or Release is the last grant the node gave. */
static void cluster_corpus(void) {
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  Gshm__Cluster__ListRequest lr = GSHM__CLUSTER__LIST_REQUEST__INIT;
  Gshm__Cluster__GrantRequest gq = GSHM__CLUSTER__GRANT_REQUEST__INIT;
  Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
  Gshm__Cluster__Stage sg = GSHM__CLUSTER__STAGE__INIT;
  Gshm__Cluster__Release rl = GSHM__CLUSTER__RELEASE__INIT;
  uint8_t buf[4096];
  size_t len = 1;

  buf[0] = 1; /* after the hello, no capabilities */
  MSG_ADD(buf, len, 1, list, &lr, LIST);
  lr.after = 1;
  lr.with_in_flight = 1;
  MSG_ADD(buf, len, 2, list, &lr, LIST);
  put("fuzz_cluster", "list", buf, len);
  len = 1;
  gq.name = "pub/b";
  MSG_ADD(buf, len, 3, grant_request, &gq, GRANT_REQUEST);
  rd.offset = 4096;
  rd.length = 8192;
  MSG_ADD(buf, len, 4, read, &rd, READ);
  sg.length = 4096;
  MSG_ADD(buf, len, 5, stage, &sg, STAGE);
  MSG_ADD(buf, len, 0, release, &rl, RELEASE);
  put("fuzz_cluster", "grant_read_release", buf, len);
  put_26("fuzz_cluster", "grant_read_release_subkeys", buf, len, 1);
  put_26("fuzz_cluster", "grant_read_release_subkeys_required", buf, len, 3);
  put_26("fuzz_cluster", "grant_read_release_refused_2_5", buf, len, 2); /* (2.5 under 2.6) */
  buf[0] = 1 | 1 << 2; /* CAP_ENCRYPT */
  put("fuzz_cluster", "grant_read_release_encrypted", buf, len);
  buf[0] = 1 | 8 << 2; /* CAP_LANES: the node sends the Read's bytes on a lane */
  put("fuzz_cluster", "grant_read_release_lane", buf, len);
  put_26("fuzz_cluster", "grant_read_release_lane_subkeys", buf, len, 3);
  buf[0] = 0; /* before the hello: a control frame of 16 bytes of nothing */
  memset(buf + 1, 0, 24 + 16);
  buf[1] = 16;
  buf[5] = 1;
  put("fuzz_cluster", "raw_frame", buf, 1 + 24 + 16);
  /* the node pulls from the rogue: [how][u16 len][answer]* */
  {
    Gshm__Cluster__Segment seg = GSHM__CLUSTER__SEGMENT__INIT, *segs[1] = {&seg};
    Gshm__Cluster__ListReply lrep = GSHM__CLUSTER__LIST_REPLY__INIT;
    Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
    static uint8_t out[16384];
    size_t n, ogrant;

    grant_pub_a(&seg, &g);
    m = (Gshm__Cluster__Msg)GSHM__CLUSTER__MSG__INIT;
    m.status = 1;
    m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
    m.grant = &g;
    out[0] = 2; /* a pull of pub/a */
    n = protobuf_c_message_pack(&m.base, out + 4);
    out[1] = 0; /* a Msg, the request's id */
    out[2] = (uint8_t)n;
    out[3] = (uint8_t)(n >> 8);
    ogrant = 4 + n;
    out[ogrant] = 1; /* a data frame: the 4 KiB */
    out[ogrant + 1] = 0;
    out[ogrant + 2] = 0x10;
    memset(out + ogrant + 3, 0xa5, 4096);
    put("fuzz_cluster", "serve_pull", out, ogrant + 3 + 4096);
    put_26("fuzz_cluster", "serve_pull_subkeys", out, ogrant + 3 + 4096, 3);
    put_26("fuzz_cluster", "serve_pull_refused_2_5", out, ogrant + 3 + 4096, 2);
    out[0] = 2 | 8 << 2; /* CAP_LANES: the 4 KiB on a data lane */
    put("fuzz_cluster", "serve_pull_lanes", out, ogrant + 3 + 4096);
    put_26("fuzz_cluster", "serve_pull_lanes_subkeys", out, ogrant + 3 + 4096, 1);
    out[0] = 2;
    /* mode 3: the local request first: a set's PULL (listed first) */
    {
      Gshm__PullRequest pr = GSHM__PULL_REQUEST__INIT;
      Gshm__RemoteListRequest rlq = GSHM__REMOTE_LIST_REQUEST__INIT;
      Gshm__PeersRequest pe = GSHM__PEERS_REQUEST__INIT;
      size_t at;

      pr.peer = "r";
      pr.name = "pub/";
      pr.local_name = "got/";
      pr.prefix = 1;
      pr.replace = 1;
      out[0] = 3;
      at = put_record(out, 1, 0, &pr.base); /* kind 0: PULL */
      lrep.n_segments = 1;
      lrep.segments = segs;
      lrep.total = 1;
      m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
      m.list_reply = &lrep;
      at = put_record(out, at, 0, &m.base);
      m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
      m.grant = &g; /* (a oneof: list_reply took its place) */
      at = put_record(out, at, 0, &m.base);
      out[at] = 1;
      out[at + 1] = 0;
      out[at + 2] = 0x10;
      memset(out + at + 3, 0x5a, 4096);
      put("fuzz_cluster", "serve_set", out, at + 3 + 4096);
      put_26("fuzz_cluster", "serve_set_subkeys", out, at + 3 + 4096, 3);
      /* REMOTE_LIST of r: its listing */
      rlq.peer = "r";
      at = put_record(out, 1, 1, &rlq.base);
      m.body_case = GSHM__CLUSTER__MSG__BODY_LIST_REPLY;
      m.list_reply = &lrep;
      at = put_record(out, at, 0, &m.base);
      put("fuzz_cluster", "remote_list", out, at);
      /* PEERS, first page */
      at = put_record(out, 1, 2, &pe.base);
      at = put_record(out, at, 0, &m.base);
      put("fuzz_cluster", "peers", out, at);
    }
  }
}

/* The 24-byte header of a UCX data message (daemon/cluster/data.c)
 * with token and request id 0: fuzz_ucx_data makes them the link's and
 * the request's. */
static size_t put_ucx_header(uint8_t *out, uint64_t offset) {
  memset(out, 0, 24);
  memcpy(out + 16, &offset, 8);
  return 24;
}

/* Seeds for fuzz_ucx_data (fuzz_ucx_data.c): the node pulls pub/a over
 * UCX (flags bit 0 clear: [how][u16 len][answer]*), or the rogue pulls
 * from it over UCX (bit 0 set: the UcxOffer, then [u16 len][Msg]*). */
static void ucx_corpus(void) {
  Gshm__Cluster__Segment seg = GSHM__CLUSTER__SEGMENT__INIT;
  Gshm__Cluster__Grant g = GSHM__CLUSTER__GRANT__INIT;
  Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
  static uint8_t out[16384];
  size_t at, n;

  grant_pub_a(&seg, &g);
  m.status = 1;
  m.body_case = GSHM__CLUSTER__MSG__BODY_GRANT;
  m.grant = &g;
  /* a host grant, its Read answered by rendezvous, eagerly, as UCX
   * likes, and by a message of another id */
  static const struct {
    const char *name;
    uint8_t how;
  } answers[] = {{"pull_rndv", 1 | 16}, {"pull_eager", 1 | 32}, {"pull_any", 1},
                 {"pull_other_id", 1 | 4 | 32}};
  for (size_t i = 0; i < sizeof(answers) / sizeof(answers[0]); i++) {
    out[0] = 0;
    at = put_record(out, 1, 0, &m.base);
    n = put_ucx_header(out + at + 3, 0);
    if (answers[i].how & 4)
      out[at + 3 + n++] = 0x69; /* the message id */
    memset(out + at + 3 + n, 0xa5, 4096);
    n += 4096;
    out[at] = answers[i].how;
    out[at + 1] = (uint8_t)(n & 0xff);
    out[at + 2] = (uint8_t)(n >> 8);
    put("fuzz_ucx_data", answers[i].name, out, at + 3 + n);
    if (i > 0)
      continue;
    /* the rendezvous between nodes of 2.6 (the node requiring it), and
     * from a rogue of 2.5 the node under 2.6 never links to */
    put_26("fuzz_ucx_data", "pull_rndv_subkeys", out, at + 3 + n, 3);
    put_26("fuzz_ucx_data", "pull_rndv_refused_2_5", out, at + 3 + n, 2);
  }
  /* a staged grant (2 slots of 4 KiB): its Stage answered by rendezvous */
  g.path = GSHM__CLUSTER__PATH__PATH_STAGED;
  g.slots = 2;
  g.slot_size = 4096;
  g.length = 8192;
  out[0] = 0;
  at = put_record(out, 1, 0, &m.base);
  n = put_ucx_header(out + at + 3, 0);
  memset(out + at + 3 + n, 0x5a, 4096);
  n += 4096;
  out[at] = 1 | 16;
  out[at + 1] = (uint8_t)(n & 0xff);
  out[at + 2] = (uint8_t)(n >> 8);
  put("fuzz_ucx_data", "pull_staged", out, at + 3 + n);

  /* the rogue pulls: the UcxOffer (its worker's address, token 1), a
   * grant of pub/b, a Read of it (or a Stage, the node staging), a
   * Release */
  {
    Gshm__Cluster__GrantRequest gq = GSHM__CLUSTER__GRANT_REQUEST__INIT;
    Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
    Gshm__Cluster__Stage sg = GSHM__CLUSTER__STAGE__INIT;
    Gshm__Cluster__Release rl = GSHM__CLUSTER__RELEASE__INIT;
    static const uint8_t token[8] = {1};
    size_t len;

    out[0] = 1;
    out[1] = 0; /* the rogue worker's own address */
    out[2] = 8;
    out[3] = 0;
    memcpy(out + 4, token, 8);
    len = 12;
    gq.name = "pub/b";
    MSG_ADD(out, len, 1, grant_request, &gq, GRANT_REQUEST);
    rd.offset = 4096;
    rd.length = 16384;
    MSG_ADD(out, len, 2, read, &rd, READ);
    MSG_ADD(out, len, 0, release, &rl, RELEASE);
    put("fuzz_ucx_data", "serve_read", out, len);
    put_26("fuzz_ucx_data", "serve_read_subkeys", out, len, 3);
    put_26("fuzz_ucx_data", "serve_read_refused_2_5", out, len, 2);
    out[0] = 1 | 2; /* the node stages every grant */
    len = 12;
    MSG_ADD(out, len, 1, grant_request, &gq, GRANT_REQUEST);
    sg.offset = 8192;
    sg.length = 4096;
    MSG_ADD(out, len, 2, stage, &sg, STAGE);
    MSG_ADD(out, len, 0, release, &rl, RELEASE);
    put("fuzz_ucx_data", "serve_stage", out, len);
    /* a worker address of the rogue's own making: a format byte and bytes */
    out[0] = 1;
    out[1] = 1;
    out[2] = 16;
    out[3] = 0;
    memcpy(out + 4, token, 8);
    memset(out + 12, 0x11, 8);
    out[12] = 0x01;
    len = 20;
    MSG_ADD(out, len, 1, grant_request, &gq, GRANT_REQUEST);
    put("fuzz_ucx_data", "serve_bad_address", out, len);
  }
}

int main(int argc, char **argv) {
  Gshm__Hello hello = GSHM__HELLO__INIT;
  Gshm__CreateRequest cr = GSHM__CREATE_REQUEST__INIT;
  Gshm__OpenRequest op = GSHM__OPEN_REQUEST__INIT;
  Gshm__CloseRequest cl = GSHM__CLOSE_REQUEST__INIT;
  Gshm__UnlinkRequest ul = GSHM__UNLINK_REQUEST__INIT;
  Gshm__StatRequest st = GSHM__STAT_REQUEST__INIT;
  Gshm__ListRequest li = GSHM__LIST_REQUEST__INIT;
  Gshm__MapReport mr = GSHM__MAP_REPORT__INIT;
  Gshm__Event ev = GSHM__EVENT__INIT;
  Gshm__Reply rep = GSHM__REPLY__INIT;
  Gshm__Welcome wel = GSHM__WELCOME__INIT;
  Gshm__LeaseGrant gr = GSHM__LEASE_GRANT__INIT;
  Gshm__SegmentInfo si = GSHM__SEGMENT_INFO__INIT;
  Gshm__SegmentList sl = GSHM__SEGMENT_LIST__INIT;
  Gshm__LeaseInfo lsi = GSHM__LEASE_INFO__INIT;
  Gshm__LeaseList ll = GSHM__LEASE_LIST__INIT;
  Gshm__StatusInfo sti = GSHM__STATUS_INFO__INIT;
  Gshm__StateRecord r1 = GSHM__STATE_RECORD__INIT, r2 = GSHM__STATE_RECORD__INIT,
                    r3 = GSHM__STATE_RECORD__INIT;
  Gshm__StateRecord *recs[3] = {&r1, &r2, &r3};
  Gshm__StateTable tab = GSHM__STATE_TABLE__INIT;
  Gshm__SegmentInfo *sip[1] = {&si};
  Gshm__LeaseInfo *lip[1] = {&lsi};
  char *uuids[2] = {"GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-ffffffff"};
  char *backends[2] = {"host", "cuda"};
  uint8_t pkt[4096], handle[64];
  struct script sc;
  size_t n;

  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  outdir = argv[1];
  mkdir(outdir, 0755);

  hello.major = 1;
  hello.client_name = "worker-3";
  put_msg("fuzz_msg_hello", "hello", &hello.base);
  hello.resume_session_id = 42;
  put_msg("fuzz_msg_hello", "hello_resume", &hello.base);
  cr.name = "models/llama/weights";
  cr.size = 1 << 20;
  cr.location = "host";
  cr.mode = 0640;
  put_msg("fuzz_msg_create_request", "host", &cr.base);
  cr.location = "cuda:GPU-0a1b2c3d-0000-1111-2222-333344445555";
  cr.flags = 1;
  put_msg("fuzz_msg_create_request", "cuda_legacy", &cr.base);
  op.name = "kv/block/17";
  op.access = GSHM__ACCESS__ACCESS_READ;
  put_msg("fuzz_msg_open_request", "by_name", &op.base);
  op.segment_id = 7;
  op.generation = 3;
  op.legacy_ipc = 1;
  put_msg("fuzz_msg_open_request", "by_id", &op.base);
  cl.lease_id = 12345;
  put_msg("fuzz_msg_close_request", "lease", &cl.base);
  ul.name = "kv/block/17";
  put_msg("fuzz_msg_unlink_request", "name", &ul.base);
  st.name = "a";
  put_msg("fuzz_msg_stat_request", "name", &st.base);
  st.segment_id = 99;
  put_msg("fuzz_msg_stat_request", "id", &st.base);
  li.after = 10;
  li.limit = 100;
  put_msg("fuzz_msg_list_request", "page", &li.base);
  mr.lease_id = 5;
  mr.n_device_uuids = 2;
  mr.device_uuids = uuids;
  put_msg("fuzz_msg_map_report", "two", &mr.base);
  ev.kind = GSHM__EVENT_KIND__EVENT_KIND_UNLINKED;
  ev.segment_id = 7;
  ev.generation = 2;
  put_msg("fuzz_msg_event", "unlinked", &ev.base);

  /* Replies: one of each body kind libgshm reads. */
  rep.status = GSHM__STATUS__STATUS_OK;
  wel.server_version = "0.1.0";
  wel.session_id = 9;
  wel.capabilities = 3;
  wel.major = 1;
  wel.max_packet = 65536;
  rep.body_case = GSHM__REPLY__BODY_WELCOME;
  rep.welcome = &wel;
  put_msg("fuzz_msg_reply", "welcome", &rep.base);
  si.id = 7;
  si.generation = 2;
  si.name = "kv/block/17";
  si.size = 2 << 20;
  si.requested_size = 1000;
  si.location = "host";
  si.uid = 1000;
  si.gid = 1000;
  si.mode = 0600;
  si.state = GSHM__SEGMENT_STATE__SEGMENT_STATE_LIVE;
  si.leases = 2;
  si.device_index = -1;
  si.granularity = 4096;
  gr.segment = &si;
  gr.lease_id = 4;
  gr.access = GSHM__ACCESS__ACCESS_READ_WRITE;
  memset(handle, 0x5a, sizeof(handle));
  gr.legacy_ipc_handle.data = handle;
  gr.legacy_ipc_handle.len = sizeof(handle);
  rep.body_case = GSHM__REPLY__BODY_GRANT;
  rep.grant = &gr;
  put_msg("fuzz_msg_reply", "grant", &rep.base);
  sl.n_segments = 1;
  sl.segments = sip;
  sl.next = 7;
  rep.body_case = GSHM__REPLY__BODY_SEGMENTS;
  rep.segments = &sl;
  put_msg("fuzz_msg_reply", "segments", &rep.base);
  lsi.lease_id = 4;
  lsi.segment_id = 7;
  lsi.segment_name = "kv/block/17";
  lsi.pid = 1234;
  lsi.client_name = "worker";
  lsi.n_mapped_devices = 2;
  lsi.mapped_devices = uuids;
  lsi.mapped = 1;
  lsi.location = "host";
  ll.n_leases = 1;
  ll.leases = lip;
  rep.body_case = GSHM__REPLY__BODY_LEASES;
  rep.leases = &ll;
  put_msg("fuzz_msg_reply", "leases", &rep.base);
  sti.version = "0.1.0";
  sti.clients = 3;
  sti.segments = 4;
  sti.bytes = 1 << 30;
  sti.n_backends = 2;
  sti.backends = backends;
  rep.body_case = GSHM__REPLY__BODY_STATUS_INFO;
  rep.status_info = &sti;
  put_msg("fuzz_msg_reply", "status", &rep.base);
  rep.status = GSHM__STATUS__STATUS_PERMISSION_DENIED;
  rep.message = "permission denied: segment 'x' is 0600, owned by uid 0";
  rep.body_case = GSHM__REPLY__BODY__NOT_SET;
  put_msg("fuzz_msg_reply", "error", &rep.base);

  /* State table: seg-1 (4 KiB host, live), seg-2 (8 KiB, unlinked),
   * seg-3 (unsealed memfd in fuzz_fdstore: refused). */
  r1.id = 1;
  r1.generation = 1;
  r1.name = "a";
  r1.requested_size = 100;
  r1.size = 4096;
  r1.location = "host";
  r1.uid = 1000;
  r1.mode = 0600;
  r2 = r1;
  r2.id = 2;
  r2.name = "b/c";
  r2.size = 8192;
  r2.unlinked = 1;
  r3 = r1;
  r3.id = 3;
  r3.name = "d";
  tab.version = 1;
  tab.seq = 7;
  tab.next_segment_id = 4;
  tab.next_generation = 2;
  tab.next_lease_id = 10;
  tab.next_session_id = 5;
  tab.n_segments = 3;
  tab.segments = recs;
  put_msg("fuzz_msg_state_table", "three", &tab.base);
  /* fuzz_fdstore: lengths of meta-1-2, meta-2-1 and ids-3, the three
   * records, then the journal (its 32-byte header, then its first area:
   * fdstore.c's layout). */
  {
    uint8_t buf[8192];
    size_t a = protobuf_c_message_pack(&r1.base, buf + 6);
    size_t b = protobuf_c_message_pack(&r2.base, buf + 6 + a);
    size_t c, j;
    Gshm__StateRecord *jrecs[1], jr;
    uint64_t freed[1] = {2}, jversions[1] = {3}; /* newer than meta-1-2 */
    struct {
      char magic[8];
      uint32_t version, pad;
      uint64_t off, len;
    } head = {{'G', 'S', 'H', 'M', 'J', 'R', 'N', 'L'}, 1, 0, 4096, 0};
    tab.version = 2;
    tab.n_segments = 0;
    c = protobuf_c_message_pack(&tab.base, buf + 6 + a + b);
    buf[0] = (uint8_t)a;
    buf[1] = (uint8_t)(a >> 8);
    buf[2] = (uint8_t)b;
    buf[3] = (uint8_t)(b >> 8);
    buf[4] = (uint8_t)c;
    buf[5] = (uint8_t)(c >> 8);
    put("fuzz_fdstore", "two_segments", buf, 6 + a + b + c);
    /* the journal: segment 1 chmodded, segment 2 freed, ids handed out */
    jr = r1;
    jr.mode = 0604;
    jrecs[0] = &jr;
    tab.version = 3;
    tab.n_segments = 1;
    tab.segments = jrecs;
    tab.n_freed = 1;
    tab.freed = freed;
    tab.n_record_versions = 1;
    tab.record_versions = jversions;
    j = protobuf_c_message_pack(&tab.base, buf + 6 + a + b + c + sizeof(head));
    head.len = j;
    memcpy(buf + 6 + a + b + c, &head, sizeof(head));
    put("fuzz_fdstore", "journal", buf, 6 + a + b + c + sizeof(head) + j);
    tab.version = 2;
    tab.n_segments = 0;
    tab.n_freed = 0;
    tab.n_record_versions = 0;
    r2.name = "a";
    r2.unlinked = 0; /* two live segments with one name: the second refused */
    b = protobuf_c_message_pack(&r2.base, buf + 6 + a);
    c = protobuf_c_message_pack(&tab.base, buf + 6 + a + b);
    buf[2] = (uint8_t)b;
    buf[3] = (uint8_t)(b >> 8);
    buf[4] = (uint8_t)c;
    buf[5] = (uint8_t)(c >> 8);
    put("fuzz_fdstore", "dup_name", buf, 6 + a + b + c);
    /* bucket 0's datagram (the journal's bytes, queued with one 4 KiB
     * memfd): segment 5 "q" */
    {
      Gshm__StateBucket bk = GSHM__STATE_BUCKET__INIT;
      Gshm__StateRecord q = r1, *qs[1] = {&q};
      q.id = 5;
      q.generation = 5;
      q.name = "q";
      q.size = q.requested_size = 4096;
      q.location = "host";
      bk.version = 1;
      bk.seq = 3;
      bk.n_segments = 1;
      bk.segments = qs;
      memset(buf, 0, 6);
      j = protobuf_c_message_pack(&bk.base, buf + 6);
      put("fuzz_fdstore", "bucket", buf, 6 + j);
    }
  }

  /* Headers. */
  put("fuzz_header", "hello", pkt, packet(GSHM_WIRE_HELLO, 1, &hello.base, pkt));
  put("fuzz_header", "status", pkt, packet(GSHM_WIRE_STATUS, 2, NULL, pkt));
  rep.status = GSHM__STATUS__STATUS_OK;
  rep.body_case = GSHM__REPLY__BODY_GRANT;
  put("fuzz_header", "reply", pkt, packet(GSHM_WIRE_OPEN | GSHM_WIRE_REPLY, 3, &rep.base, pkt));
  put("fuzz_header", "event", pkt, packet(GSHM_WIRE_EVENT, 0, &ev.base, pkt));
  n = packet(GSHM_WIRE_HELLO, 1, &hello.base, pkt);
  pkt[4] = 2; /* major 2 */
  put("fuzz_header", "major2", pkt, n);

  /* Whole conversations for gshmd's request path (flag 1: fuzz_server
   * says hello first). */
  cr.name = "s";
  cr.size = 4096;
  cr.location = "host";
  cr.mode = 0;
  cr.flags = 0;
  op.name = "s";
  op.segment_id = 0;
  op.generation = 0;
  op.legacy_ipc = 0;
  op.access = GSHM__ACCESS__ACCESS_READ_WRITE;
  st.name = "s";
  st.segment_id = 0;
  cl.lease_id = 1;
  ul.name = "s";
  li.after = 0;
  li.limit = 0;
  mr.lease_id = 1;
  sc.len = 0;
  sc.buf[sc.len++] = 1;
  script_add(&sc, GSHM_WIRE_CREATE, 2, &cr.base);
  script_add(&sc, GSHM_WIRE_OPEN, 3, &op.base);
  script_add(&sc, GSHM_WIRE_MAP_REPORT, 4, &mr.base);
  script_add(&sc, GSHM_WIRE_STAT, 5, &st.base);
  script_add(&sc, GSHM_WIRE_LIST_SEGMENTS, 6, &li.base);
  script_add(&sc, GSHM_WIRE_LIST_LEASES, 7, &li.base);
  script_add(&sc, GSHM_WIRE_LIST_CLIENTS, 8, &li.base);
  script_add(&sc, GSHM_WIRE_UNLINK, 9, &ul.base);
  script_add(&sc, GSHM_WIRE_CLOSE, 10, &cl.base);
  script_add(&sc, GSHM_WIRE_STATUS, 11, NULL);
  script_add(&sc, GSHM_WIRE_METRICS, 12, NULL);
  script_add(&sc, GSHM_WIRE_DEVICES, 13, NULL);
  put("fuzz_server", "session", sc.buf, sc.len);
  sc.len = 0;
  sc.buf[sc.len++] = 0;
  script_add(&sc, GSHM_WIRE_HELLO, 1, &hello.base);
  script_add(&sc, GSHM_WIRE_HELLO, 2, &hello.base);
  put("fuzz_server", "hello_twice", sc.buf, sc.len);
  sc.len = 0;
  sc.buf[sc.len++] = 2;
  script_add(&sc, GSHM_WIRE_OPEN, 1, &op.base);
  put("fuzz_server", "open_first_with_fd", sc.buf, sc.len);
  sc.len = 0;
  sc.buf[sc.len++] = 1;
  op.segment_id = 1;
  op.generation = 1;
  script_add(&sc, GSHM_WIRE_CREATE, 2, &cr.base);
  script_add(&sc, GSHM_WIRE_OPEN, 3, &op.base);
  op.legacy_ipc = 1;
  script_add(&sc, GSHM_WIRE_OPEN, 4, &op.base);
  cr.name = "t";
  cr.flags = 1;
  script_add(&sc, GSHM_WIRE_CREATE, 5, &cr.base);
  put("fuzz_server", "reopen_by_id", sc.buf, sc.len);
  /* Revoke of a segment with two leases (found by fuzz_server: a
   * use-after-free in gshmd_registry_revoke once). */
  {
    Gshm__RevokeRequest rv = GSHM__REVOKE_REQUEST__INIT;
    sc.len = 0;
    sc.buf[sc.len++] = 1;
    cr.name = "s";
    cr.flags = 0;
    op.segment_id = 0;
    op.generation = 0;
    op.legacy_ipc = 0;
    script_add(&sc, GSHM_WIRE_CREATE, 2, &cr.base);
    script_add(&sc, GSHM_WIRE_OPEN, 3, &op.base);
    rv.name = "s";
    script_add(&sc, GSHM_WIRE_REVOKE, 4, &rv.base);
    put("fuzz_server", "revoke_two_leases", sc.buf, sc.len);
  }
  /* A hidden create published over a visible segment of its name
   * (SEGMENT_FLAG_HIDDEN, PUBLISH with replace), then published again
   * (refused: its lease's segment is named now) and a lease id that is
   * not the sender's. */
  {
    Gshm__PublishRequest pb = GSHM__PUBLISH_REQUEST__INIT;
    sc.len = 0;
    sc.buf[sc.len++] = 1;
    cr.name = "s";
    cr.flags = 0;
    script_add(&sc, GSHM_WIRE_CREATE, 2, &cr.base);
    cr.flags = GSHM__SEGMENT_FLAG__SEGMENT_FLAG_HIDDEN;
    script_add(&sc, GSHM_WIRE_CREATE, 3, &cr.base);
    pb.lease_id = 2;
    pb.replace = 1;
    script_add(&sc, GSHM_WIRE_PUBLISH, 4, &pb.base);
    script_add(&sc, GSHM_WIRE_PUBLISH, 5, &pb.base);
    pb.lease_id = 99;
    script_add(&sc, GSHM_WIRE_PUBLISH, 6, &pb.base);
    script_add(&sc, GSHM_WIRE_STAT, 7, &st.base);
    put("fuzz_server", "publish_replace", sc.buf, sc.len);
    cr.flags = 0;
  }
  /* chmod and chown, and the cluster's requests on a gshmd whose cluster
   * is off (each answered, a PULL_CANCEL of request id 0 excepted). */
  {
    Gshm__ChmodRequest cm = GSHM__CHMOD_REQUEST__INIT;
    Gshm__ChownRequest co = GSHM__CHOWN_REQUEST__INIT;
    Gshm__PeersRequest pe = GSHM__PEERS_REQUEST__INIT;
    Gshm__RemoteListRequest rl = GSHM__REMOTE_LIST_REQUEST__INIT;
    Gshm__PullRequest pr = GSHM__PULL_REQUEST__INIT;
    Gshm__PullCancel pc = GSHM__PULL_CANCEL__INIT;
    sc.len = 0;
    sc.buf[sc.len++] = 1;
    cr.name = "s";
    script_add(&sc, GSHM_WIRE_CREATE, 2, &cr.base);
    cm.name = "s";
    cm.mode = 0644;
    script_add(&sc, GSHM_WIRE_CHMOD, 3, &cm.base);
    co.name = "s";
    co.uid = 1;
    co.gid = 1;
    script_add(&sc, GSHM_WIRE_CHOWN, 4, &co.base);
    script_add(&sc, GSHM_WIRE_PEERS, 5, &pe.base);
    rl.peer = "p";
    script_add(&sc, GSHM_WIRE_REMOTE_LIST, 6, &rl.base);
    pr.peer = "p";
    pr.name = "s";
    script_add(&sc, GSHM_WIRE_PULL, 7, &pr.base);
    pc.request_id = 7;
    script_add(&sc, GSHM_WIRE_PULL_CANCEL, 8, &pc.base);
    script_add(&sc, GSHM_WIRE_PULL_CANCEL, 0, &pc.base);
    script_add(&sc, GSHM_WIRE_STAT, 9, &st.base);
    put("fuzz_server", "chmod_chown_cluster_off", sc.buf, sc.len);
  }

  /* The cluster port (fuzz_cluster_stream): before the hello, a Hello in
   * one frame (24-byte header, then the Msg); after it, records
   * [what][u16 len][bytes] that the target seals: a control Msg, a data
   * frame, raw bytes. */
  {
    uint8_t nonce[32] = {7}, buf[512];
    Gshm__Cluster__Hello h = GSHM__CLUSTER__HELLO__INIT;
    Gshm__Cluster__Msg m = GSHM__CLUSTER__MSG__INIT;
    Gshm__Cluster__Read rd = GSHM__CLUSTER__READ__INIT;
    size_t len;
    h.major = 2;
    h.node_name = "b";
    h.nonce.data = nonce;
    h.nonce.len = sizeof(nonce);
    m.body_case = GSHM__CLUSTER__MSG__BODY_HELLO;
    m.hello = &h;
    len = gshm__cluster__msg__pack(&m, buf + 25);
    memset(buf, 0, 25);
    buf[0] = 0; /* phase: before the hello */
    buf[1] = (uint8_t)len;
    buf[5] = 1; /* control frame */
    put("fuzz_cluster_stream", "hello", buf, 25 + len);
    /* fuzz_cluster's mode 0 takes the same bytes: the Hello of its known
     * peer "r", to which the node answers with a Challenge */
    h.node_name = "r";
    len = gshm__cluster__msg__pack(&m, buf + 25);
    buf[1] = (uint8_t)len;
    put("fuzz_cluster", "raw_hello", buf, 25 + len);
    /* the same under cluster.min_protocol = 2.6: refused (no CAP_SUBKEYS),
     * and with CAP_SUBKEYS: answered */
    put_26("fuzz_cluster", "raw_hello_refused_2_5", buf, 25 + len, 2);
    h.caps = GSHM__CLUSTER__CAP__CAP_SUBKEYS;
    len = gshm__cluster__msg__pack(&m, buf + 25);
    buf[1] = (uint8_t)len;
    put_26("fuzz_cluster", "raw_hello_subkeys_required", buf, 25 + len, 2);
    h.caps = 0;
    h.node_name = "b";
    rd.grant_id = 2;
    rd.length = 4096;
    gshm__cluster__msg__init(&m);
    m.request_id = 3;
    m.body_case = GSHM__CLUSTER__MSG__BODY_READ;
    m.read = &rd;
    len = gshm__cluster__msg__pack(&m, buf + 4);
    buf[0] = 1; /* after the hello, authenticated */
    buf[1] = 0;
    buf[2] = (uint8_t)len;
    buf[3] = 0;
    buf[4 + len] = 1; /* a data frame of 16 bytes */
    buf[5 + len] = 16;
    buf[6 + len] = 0;
    memset(buf + 7 + len, 0x5a, 16);
    put("fuzz_cluster_stream", "read_and_data", buf, 23 + len);
    buf[0] = 5; /* encrypted */
    put("fuzz_cluster_stream", "read_and_data_encrypted", buf, 23 + len);
  }

  /* Config files. */
  {
    static const char *const confs[][2] = {
        {"limits", "[limits]\nmax_connections = 2000\nmax_packet = 64K\nmax_fds_per_connection = 0\n"
                   "idle_timeout_ms = 0\npartial_timeout_ms = 5000\n"},
        {"daemon", "[daemon]\nsocket = /run/gshm/gshmd.sock\nsocket_mode = 0660\n"
                   "backend = host\nlog_level = debug\nlegacy_ipc = no\nadmin_group = wheel\n"},
        {"quota", "; per uid\n[quota]\nhost_bytes = 1G\ncuda_bytes = 80G\nsegments = 100\n"
                  "leases = 1000\nconnections = 10\n[metrics]\ntextfile = /var/lib/x.prom\n"
                  "interval_sec = 15\n"},
        {"bad", "[limits]\nmax_packet = 1T\nnosuch = 1\n"},
        {"cluster", "[cluster]\nlisten = 127.0.0.1:7070\nnode_name = a\n"
                    "peers = b=10.0.0.2:7070, c=[::1]:7071 a=127.0.0.1:7070\n"
                    "export = pub/* kv/*:0 x/*:@0\n"},
    };
    /* a file, then NUL-separated --set values (fuzz_config.c) */
    static const char sets[] = "[daemon]\nbackend = host\n\0limits.max_packet=32K\0"
                               "cluster.peers=b=127.0.0.1:1\0cluster.node_name=n";
    for (size_t i = 0; i < sizeof(confs) / sizeof(confs[0]); i++)
      put("fuzz_config", confs[i][0], confs[i][1], strlen(confs[i][1]));
    put("fuzz_config", "file_and_set", sets, sizeof(sets) - 1);
  }
  {
    static const char *const names[] = {"b0a", "b17b", "seg-1", "meta-12-3", "ids-7", "journal",
                                        "journal2", "leasekey"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
      put("fuzz_fdstore_names", names[i], names[i], strlen(names[i]));
  }
  client_corpus();
  cluster_corpus();
  ucx_corpus();
  return 0;
}
