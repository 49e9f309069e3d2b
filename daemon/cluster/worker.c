/* SPDX-License-Identifier: Apache-2.0 */
/* The UCP worker of the link layer, driven from the libuv loop through
 * its event fd (ucp_worker_get_efd + ucp_worker_arm: nothing
 * busy-polls), and the idle turn that runs link_hooks.after_progress.
 * UCX never gets its tcp transport, and no UCX message reaches gshm. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
static void drive(struct links *ll) {
  bool busy = false;

  for (int round = 0; round < PROGRESS_ROUNDS && !busy; round++) {
    unsigned n = 0;
    while (ll->worker && ucp_worker_progress(ll->worker))
      if (++n >= PROGRESS_BATCH) {
        busy = true;
        break;
      }
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
 * finds an entry (an unregistered id crashed it). */
static ucs_status_t on_am_refused(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param) {
  struct links *ll = arg;
  (void)header, (void)header_length, (void)length;
  uint64_t n;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
    ucp_am_data_release(ll->worker, data);
  n = ++ll->refusals[REFUSE_PROTOCOL];
  if ((n & (n - 1)) == 0) /* the first, then at powers of two */
    gshm_log_warn("cluster: dropped a UCX active message (gshm takes none)");
  return UCS_OK;
}

/* UCX_TLS without tcp, whatever the environment says: UCX's tcp
 * transport listens on every interface and writes wherever a sender says
 * (docs/CLUSTER.md). */
static void transports_without_tcp(char *out, size_t size) {
  const char *env = getenv("UCX_TLS");
  char copy[256], *save = NULL, *tok;
  size_t n = 0;

  if (!env || !*env || !strcmp(env, "all") || env[0] == '^') {
    /* all (but what the user excluded), and never tcp */
    snprintf(out, size, "%s%s", env && env[0] == '^' ? env : "^", 
             env && env[0] == '^' ? ",tcp" : "tcp");
    return;
  }
  snprintf(copy, sizeof(copy), "%s", env);
  out[0] = '\0';
  for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    if (strcmp(tok, "tcp") && strcmp(tok, "all"))
      n += (size_t)snprintf(out + n, n < size ? size - n : 0, "%s%s", n ? "," : "", tok);
  if (!out[0])
    snprintf(out, size, "^tcp");
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
  ucp_config_t *config;
  ucs_status_t st;
  char tls[300];

  if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK)
    goto fail;
  transports_without_tcp(tls, sizeof(tls));
  if (getenv("UCX_TLS") && strcmp(getenv("UCX_TLS"), tls))
    gshm_log_notice("cluster: UCX_TLS=%s overridden to %s: UCX's tcp transport is never used "
                    "(bytes over TCP go on gshm's authenticated streams)",
                    getenv("UCX_TLS"), tls);
  if ((st = ucp_config_modify(config, "TLS", tls)) != UCS_OK) {
    ucp_config_release(config);
    goto fail;
  }
  st = ucp_init(&p, config, &ll->ctx);
  ucp_config_release(config);
  if (st != UCS_OK)
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
  if ((e = setup_ucp(ll)))
    return e;
  uv_poll_init(ll->loop, &ll->poll, ll->efd);
  ll->poll.data = ll;
  uv_poll_start(&ll->poll, UV_READABLE, on_efd);
  uv_idle_init(ll->loop, &ll->idle);
  ll->idle.data = ll;
  ll->worker_handles = true;
  return 0;
}

void gshmd__link_worker_stop(struct links *ll) {
  if (!ll->worker_handles)
    return;
  ll->worker_handles = false;
  uv_close((uv_handle_t *)&ll->poll, NULL);
  uv_close((uv_handle_t *)&ll->idle, NULL);
}

void gshmd__link_worker_destroy(struct links *ll) {
  if (ll->worker)
    ucp_worker_destroy(ll->worker);
  ll->worker = NULL;
  if (ll->ctx)
    ucp_cleanup(ll->ctx);
  ll->ctx = NULL;
}
