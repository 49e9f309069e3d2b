/* SPDX-License-Identifier: Apache-2.0 */
/* The UCP worker of the link layer, driven from the libuv loop through
 * its event fd (ucp_worker_get_efd + ucp_worker_arm: nothing
 * busy-polls), and the idle turn that runs link_hooks.after_progress.
 * UCX never gets its tcp or sysv transport, and no UCX message reaches
 * gshm. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ucs/config/global_opts.h>

#include "link.h"
#include "log.h"

/* The worker loop: at most PROGRESS_ROUNDS batches of at most
 * PROGRESS_BATCH ucp_worker_progress calls per loop turn, so that local
 * clients are served between two batches during a pull. */
#define PROGRESS_ROUNDS 4
#define PROGRESS_BATCH 256

/* ---- driving the worker from the loop --------------------------------- */

static void drive(struct links *ll);

static void on_idle(uv_idle_t *h) { drive(h->data); }

static void on_efd(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drive(h->data);
}

void gshmd__link_kick(struct links *ll) {
  if (ll->worker_handles && !ll->idle_on) {
    uv_idle_start(&ll->idle, on_idle);
    ll->idle_on = true;
  }
}

/* Progresses the worker a bounded number of times, does the work that
 * callbacks left for outside them, then arms the event fd; when there is
 * more to do, the idle handle keeps the loop from blocking. */
/* Closes the endpoints queued by gshmd__link_worker_ep_close and frees
 * the close requests that finished; true while some still run. */
static bool close_eps(struct links *ll) {
  unsigned k = 0;

  while (ll->nep_closing) {
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ll->ep_closing[--ll->nep_closing], &rp);
    void **n;
    if (!UCS_PTR_IS_PTR(sp)) {
      if (UCS_PTR_STATUS(sp) != UCS_OK) /* (the endpoint stays open) */
        gshm_log_warn("cluster: closing a UCX endpoint failed: %s",
                      ucs_status_string(UCS_PTR_STATUS(sp)));
      continue;
    }
    if (!(n = realloc(ll->ep_close_reqs, sizeof(*n) * (ll->nep_close_reqs + 1)))) {
      ucp_request_free(sp); /* the close goes on; its request is not waited for */
      continue;
    }
    ll->ep_close_reqs = n;
    ll->ep_close_reqs[ll->nep_close_reqs++] = sp;
  }
  for (unsigned i = 0; i < ll->nep_close_reqs; i++) {
    if (ucp_request_check_status(ll->ep_close_reqs[i]) != UCS_INPROGRESS)
      ucp_request_free(ll->ep_close_reqs[i]);
    else
      ll->ep_close_reqs[k++] = ll->ep_close_reqs[i];
  }
  ll->nep_close_reqs = k;
  return k != 0;
}

static void drive(struct links *ll) {
  bool busy = false;

  for (int round = 0; round < PROGRESS_ROUNDS && !busy; round++) {
    unsigned n = 0;
    while (ll->worker && ucp_worker_progress(ll->worker))
      if (++n >= PROGRESS_BATCH) {
        busy = true;
        break;
      }
    if (ll->worker)
      busy |= close_eps(ll);
    if (ll->hooks.after_progress)
      ll->hooks.after_progress(ll->hooks.arg);
    if (busy)
      break;
    if (!ll->worker || ucp_worker_arm(ll->worker) == UCS_OK) {
      if (ll->idle_on) {
        uv_idle_stop(&ll->idle);
        ll->idle_on = false;
      }
      return;
    }
  }
  gshmd__link_kick(ll);
}

/* Any active message: nothing here is reachable through UCX before the
 * hello, and no message id is gshm's: each one is dropped and counted.
 * Registered for every id UCX's 16-bit header can carry, so that UCX
 * 1.13, which reads its handler table before checking the id, always
 * finds an entry (an unregistered id crashed it).  A rendezvous is
 * dropped by UCX itself on UCS_OK (ucp_def.h); released here as well,
 * it was dropped twice and its sender's UCX aborted on the second
 * acknowledgement. */
static ucs_status_t on_am_refused(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param) {
  struct links *ll = arg;
  (void)header, (void)header_length, (void)data, (void)length, (void)param;
  uint64_t n;
  n = ++ll->refusals[REFUSE_PROTOCOL];
  if ((n & (n - 1)) == 0) /* the first, then at powers of two */
    gshm_log_warn("cluster: dropped a UCX active message (gshm takes none)");
  return UCS_OK;
}

/* The transports gshmd never lets UCX use (FORBIDDEN_TLS as UCX_TLS
 * names them): tcp listens on every interface and writes wherever a
 * sender says (docs/CLUSTER.md); sysv puts the worker's receive FIFO in
 * SysV shared memory of mode 0660 in the host's IPC namespace, which any
 * process of gshmd's group attached read and write (random bytes there
 * aborted gshmd in ucp_worker_progress).  posix and cma, which need
 * gshmd's uid, serve shared memory instead. */
#define FORBIDDEN_TLS "tcp,sysv"
static const char *const forbidden_tls[] = {"tcp", "sysv"};

/* Whether tok, a name of a UCX_TLS list, is a forbidden transport (also
 * as "NAME:aux": UCX opens a transport named so for its wireup, and
 * tcp's listener with it). */
static bool tls_forbidden(const char *tok) {
  for (size_t i = 0; i < sizeof(forbidden_tls) / sizeof(forbidden_tls[0]); i++) {
    size_t n = strlen(forbidden_tls[i]);
    if (!strncmp(tok, forbidden_tls[i], n) && (tok[n] == '\0' || tok[n] == ':'))
      return true;
  }
  return false;
}

/* What UCX 1.13 reads the shared memory aliases of UCX_TLS as, less
 * sysv (src/ucp/core/ucp_context.c ucp_tl_aliases: sm and shm are mm, cma
 * and knem; mm is posix, sysv and xpmem): a user's "shared memory only"
 * stays that (widened to "^tcp,sysv" by init_ctx, it took RDMA too). */
static const char *tls_alias(const char *tok) {
  if (!strcmp(tok, "sm") || !strcmp(tok, "shm"))
    return "posix,xpmem,cma,knem";
  return !strcmp(tok, "mm") ? "posix,xpmem" : tok;
}

/* UCX_TLS without the forbidden transports, whatever the environment
 * says. */
static void transports_allowed(char *out, size_t size) {
  const char *env = getenv("UCX_TLS");
  char copy[256], *save = NULL, *tok;
  size_t n = 0;

  if (!env || !*env || !strcmp(env, "all")) {
    snprintf(out, size, "^" FORBIDDEN_TLS); /* everything else */
    return;
  }
  if (env[0] == '^') {
    snprintf(out, size, "%s," FORBIDDEN_TLS, env); /* what the user left out, and those */
    return;
  }
  snprintf(copy, sizeof(copy), "%s", env); /* the user's list without them */
  out[0] = '\0';
  for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    if (!tls_forbidden(tok) && n < size)
      n += (size_t)snprintf(out + n, size - n, "%s%s", n ? "," : "", tls_alias(tok));
  if (!out[0])
    snprintf(out, size, "^" FORBIDDEN_TLS);
}

/* Whether ctx has a resource of a forbidden transport
 * (ucp_context_print_info lists each as "... flags -- tcp/DEVICE";
 * unknown: true).  The filter above goes by spelling, and UCX reads more
 * than one ("\\tcp" is tcp; "sm", "shm" and "mm" take sysv); this goes by
 * what UCX made. */
static bool has_forbidden_resource(ucp_context_h ctx) {
  char *buf = NULL, what[32];
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  bool found = true;

  if (f) {
    ucp_context_print_info(ctx, f);
    if (fclose(f) == 0 && buf) {
      found = false;
      for (size_t i = 0; i < sizeof(forbidden_tls) / sizeof(forbidden_tls[0]); i++) {
        snprintf(what, sizeof(what), "-- %s/", forbidden_tls[i]);
        found |= strstr(buf, what) != NULL;
      }
    }
  }
  free(buf);
  return found;
}

/* ll->ctx made with UCX_TLS=tls, or the status.  None with a forbidden
 * resource (has_forbidden_resource): one whose tls UCX read as tcp or
 * sysv anyway is made again with "^tcp,sysv" (tls says so then), never
 * kept. */
static ucs_status_t init_ctx(struct links *ll, const ucp_params_t *p, char *tls, size_t size) {
  ucp_config_t *config;
  ucs_status_t st;

  if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK)
    return st;
  if ((st = ucp_config_modify(config, "TLS", tls)) == UCS_OK)
    st = ucp_init(p, config, &ll->ctx);
  ucp_config_release(config);
  if (st != UCS_OK || !has_forbidden_resource(ll->ctx))
    return st;
  ucp_cleanup(ll->ctx);
  ll->ctx = NULL;
  if (!strcmp(tls, "^" FORBIDDEN_TLS))
    return UCS_ERR_UNSUPPORTED; /* (cannot happen: UCX's own negation) */
  gshm_log_warn("cluster: UCX read transports %s as its tcp or sysv transport, which any host "
                "or any process of gshmd's group reaches with no authentication: using "
                "^" FORBIDDEN_TLS " instead",
                tls);
  snprintf(tls, size, "^" FORBIDDEN_TLS);
  return init_ctx(ll, p, tls, size);
}

static int setup_ucp(struct links *ll) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                    /* No UCP_FEATURE_RMA: with it UCX 1.13 answers software
                     * GET requests from any endpoint at any address. */
                    .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                    .mt_workers_shared = 0};
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB |
                                             UCP_AM_HANDLER_PARAM_FIELD_ARG,
                               .cb = on_am_refused, .arg = ll};
  ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  ucs_status_t st;
  char *tls = ll->ucx_tls;

  transports_allowed(tls, sizeof(ll->ucx_tls));
  if (getenv("UCX_TLS") && strcmp(getenv("UCX_TLS"), tls))
    gshm_log_notice("cluster: UCX_TLS=%s overridden to %s: UCX's tcp and sysv transports are "
                    "never used (bytes over TCP go on gshm's authenticated streams)",
                    getenv("UCX_TLS"), tls);
  if ((st = init_ctx(ll, &p, tls, sizeof(ll->ucx_tls))) != UCS_OK)
    goto fail;
  if (ucp_context_query(ll->ctx, &attr) == UCS_OK)
    ll->cuda_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  if ((st = ucp_worker_create(ll->ctx, &wp, &ll->worker)) != UCS_OK)
    goto fail;
  if ((st = ucp_worker_get_efd(ll->worker, &ll->efd)) != UCS_OK)
    goto fail;
  for (int id = UINT16_MAX; id >= 0; id--) {
    ap.id = (unsigned)id;
    if ((st = ucp_worker_set_am_recv_handler(ll->worker, &ap)) != UCS_OK)
      goto fail;
  }
  gshm_log_info("cluster: UCX %s (transports %s); device memory %s", ucp_get_version_string(),
                tls,
                ll->cuda_memory ? "registered directly (UCX has CUDA support)"
                                : "staged through pinned host buffers (this UCX has no CUDA "
                                  "memory support)");
  return 0;
fail:
  gshm_log_err("cluster: UCX setup failed: %s", ucs_status_string(st));
  return -EIO;
}

int gshmd__link_worker_start(struct links *ll) {
  int e;

  ll->efd = -1;
  if (!ll->ucx_allowed) {
    /* No link could use UCX: no context and no worker, so that none of
     * UCX's parsing or resources (its shared-memory FIFO, RDMA devices)
     * is reachable for nothing.  The idle turn still runs after_progress. */
    gshm_log_info("cluster: UCX not started (cluster.transport = tcp or cluster.encrypt on): "
                  "every byte goes on gshm's authenticated streams");
  } else if ((e = setup_ucp(ll))) {
    return e;
  } else {
    uv_poll_init(ll->loop, &ll->poll, ll->efd);
    ll->poll.data = ll;
    uv_poll_start(&ll->poll, UV_READABLE, on_efd);
  }
  uv_idle_init(ll->loop, &ll->idle);
  ll->idle.data = ll;
  ll->worker_handles = true;
  return 0;
}

void gshmd__link_worker_stop(struct links *ll) {
  /* the endpoints' closes finish before the worker goes (bounded) */
  for (int i = 0; ll->worker && i < 2000 && (close_eps(ll) || ll->nep_closing); i++) {
    ucp_worker_progress(ll->worker);
    if (i > 100)
      usleep(1000);
  }
  if (!ll->worker_handles)
    return;
  ll->worker_handles = false;
  if (ll->worker) /* (its poll handle: none without one) */
    uv_close((uv_handle_t *)&ll->poll, NULL);
  uv_close((uv_handle_t *)&ll->idle, NULL);
}

int gshmd__link_worker_address(struct links *ll, ucp_address_t **addr_out, size_t *len_out) {
  if (!ll->worker)
    return -EIO;
  return ucp_worker_get_address(ll->worker, addr_out, len_out) == UCS_OK ? 0 : -EIO;
}

/* A peer's worker address as UCX reads it: UCX takes no length and
 * trusts every byte.  UCX 1.13 aborts gshmd (ucs_assertv_always) on an
 * address whose first byte names a format other than its two, and reads
 * as far as the lengths inside it say: a peer that holds the cluster key
 * crashed a node with a one-byte UcxOffer.  So the format byte is checked
 * here, and the address is copied before WORKER_ADDRESS_PAD zero bytes:
 * the most one address's lengths (bytes) make UCX 1.13 read, 128
 * entries of at most 6 endpoint addresses of at most 255 bytes each,
 * stays inside them (a zero byte ends no list, but each entry consumes
 * some, and UCX stops at 128).  Returns the copy (free it), or NULL with
 * *why_out. */
#define WORKER_ADDRESS_PAD (1u << 20)
#define WORKER_ADDRESS_VERSIONS 2        /* UCP_OBJECT_VERSION_V1, _V2: 0 and 1 */
static void *worker_address_copy(const void *addr, size_t len, const char **why_out) {
  uint8_t *copy;

  if (len < 2) { /* (at most a control frame: 64 KiB) */
    *why_out = "a worker address of a length no UCX makes";
    return NULL;
  }
  if ((*(const uint8_t *)addr & 0x0f) >= WORKER_ADDRESS_VERSIONS) {
    *why_out = "a worker address of a format UCX 1.13 does not read";
    return NULL;
  }
  if (!(copy = calloc(1, len + WORKER_ADDRESS_PAD))) {
    *why_out = "out of memory";
    return NULL;
  }
  memcpy(copy, addr, len);
  return copy;
}

/* ucp_ep_create with peer failure detection, UCX's own log held to its
 * fatal errors for the call: where no transport to the peer detects a
 * dead peer (two gshmd on one host: shared memory only) UCX logs "no
 * active messages transport ... no peer failure handler" as an ERROR,
 * while gshm expects that answer and goes on (an eager endpoint, or its
 * TCP stream), and says so itself.  The level set before is put back. */
static ucs_status_t ep_create_quiet(struct links *ll, const ucp_ep_params_t *ep, ucp_ep_h *out) {
  char level[32];
  bool quiet = ucs_global_opts_get_value("LOG_LEVEL", level, sizeof(level)) == UCS_OK &&
               ucs_global_opts_set_value("LOG_LEVEL", "fatal") == UCS_OK;
  ucs_status_t st = ucp_ep_create(ll->worker, ep, out);

  if (quiet)
    (void)ucs_global_opts_set_value("LOG_LEVEL", level);
  return st;
}

int gshmd__link_worker_ep(struct links *ll, const void *addr, size_t len,
                          ucp_err_handler_cb_t err_cb, void *arg, ucp_ep_h *ep_out,
                          bool *eager_out) {
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLER |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                        .err_handler = {.cb = err_cb, .arg = arg}};
  const char *why = NULL;
  void *copy = worker_address_copy(addr, len, &why);
  ucs_status_t st;

  *eager_out = false;
  if (!ll->worker) { /* (no UCX on this node: never offered) */
    free(copy);
    return -EHOSTUNREACH;
  }
  if (!copy) {
    gshm_log_notice("cluster: a peer offered %s (%zu bytes): not used", why, len);
    return -EPROTO;
  }
  ep.address = copy;
  st = ep_create_quiet(ll, &ep, ep_out);
  if (st == UCS_ERR_UNREACHABLE && ll->ucx_without_peer_errors) {
    /* UCX 1.13's shared-memory transports cannot tell a dead peer: the
     * link's TCP stream does, and the endpoint is closed with it.  Such
     * an endpoint sends eagerly only: a rendezvous would have the reader
     * copy from the sender's memory (cma), which UCX treats as fatal
     * when the sender died meanwhile. */
    ep.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(ll->worker, &ep, ep_out);
    *eager_out = true;
  }
  free(copy); /* (UCX keeps nothing of it) */
  if (st != UCS_OK) {
    gshm_log_info("cluster: no UCX endpoint to a peer's worker: %s", ucs_status_string(st));
    return -EHOSTUNREACH;
  }
  gshmd__link_kick(ll);
  return 0;
}

void gshmd__link_worker_ep_close(struct links *ll, ucp_ep_h ep) {
  ucp_ep_h *n = realloc(ll->ep_closing, sizeof(*n) * (ll->nep_closing + 1));
  if (!n) { /* closed here then, inside whatever callback this is */
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(sp))
      ucp_request_free(sp);
    return;
  }
  ll->ep_closing = n;
  ll->ep_closing[ll->nep_closing++] = ep;
  gshmd__link_kick(ll);
}

int gshmd__link_worker_am(struct links *ll, unsigned id, ucp_am_recv_callback_t cb, void *arg) {
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB |
                                             UCP_AM_HANDLER_PARAM_FIELD_ARG,
                               .id = id, .cb = cb, .arg = arg};
  if (!ll->worker)
    return -EIO;
  return ucp_worker_set_am_recv_handler(ll->worker, &ap) == UCS_OK ? 0 : -EIO;
}

void gshmd__link_worker_destroy(struct links *ll) {
  if (ll->worker)
    ucp_worker_destroy(ll->worker);
  ll->worker = NULL;
  gshmd__link_data_abandoned_free(ll); /* (no callback comes now) */
  free(ll->ep_closing);
  free(ll->ep_close_reqs);
  ll->ep_closing = NULL;
  ll->ep_close_reqs = NULL;
  if (ll->ctx)
    ucp_cleanup(ll->ctx);
  ll->ctx = NULL;
}
