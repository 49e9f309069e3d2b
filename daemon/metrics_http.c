/* SPDX-License-Identifier: Apache-2.0 */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

#ifdef GSHM_HAVE_MHD
#include <microhttpd.h>

struct gshmd_metrics_http {
  struct MHD_Daemon *mhd;
  uv_timer_t timer;
  struct gshmd_server *srv;
  pthread_mutex_t lock;
  char *snapshot; /* under lock */
};

static void refresh(struct gshmd_metrics_http *h) {
  char *text = NULL, *old;
  if (gshmd_metrics_render(h->srv, &text))
    return;
  pthread_mutex_lock(&h->lock);
  old = h->snapshot;
  h->snapshot = text;
  pthread_mutex_unlock(&h->lock);
  free(old);
}

static void on_timer(uv_timer_t *t) { refresh(t->data); }

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  struct gshmd_metrics_http *h = cls;
  struct MHD_Response *resp;
  enum MHD_Result ret;
  unsigned status = MHD_HTTP_OK;
  char *body;

  (void)version, (void)upload, (void)upload_size, (void)con_cls;
  if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
    body = strdup("only GET\n");
  } else if (strcmp(url, "/metrics")) {
    status = MHD_HTTP_NOT_FOUND;
    body = strdup("gshmd serves /metrics\n");
  } else {
    pthread_mutex_lock(&h->lock);
    body = strdup(h->snapshot ? h->snapshot : "");
    pthread_mutex_unlock(&h->lock);
  }
  if (!body)
    return MHD_NO;
  resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  ret = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

int gshmd_metrics_http_start(uv_loop_t *loop, struct gshmd_server *srv, const char *listen,
                             struct gshmd_metrics_http **out) {
  struct gshmd_metrics_http *h;
  struct sockaddr_storage sa;
  socklen_t salen;

  if (gshm__parse_loopback(listen, &sa, &salen)) {
    gshm_log_err("metrics.http_listen '%s': want a loopback ADDRESS:PORT such as 127.0.0.1:9477",
                 listen);
    return -EINVAL;
  }
  if (!(h = calloc(1, sizeof(*h))))
    return -ENOMEM;
  pthread_mutex_init(&h->lock, NULL);
  h->srv = srv;
  refresh(h);
  /* MHD_USE_AUTO: poll or epoll, not select(), which refuses descriptors
   * numbered 1024 and above, and gshmd holds one per segment. */
  h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                                (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
                            0, NULL, NULL, answer, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, 16U, MHD_OPTION_CONNECTION_TIMEOUT, 10U,
                            MHD_OPTION_END);
  if (!h->mhd) {
    gshm_log_err("metrics: cannot listen on %s", listen);
    pthread_mutex_destroy(&h->lock);
    free(h->snapshot);
    free(h);
    return -EADDRINUSE;
  }
  uv_timer_init(loop, &h->timer);
  h->timer.data = h;
  uv_timer_start(&h->timer, on_timer, 1000, 1000);
  uv_unref((uv_handle_t *)&h->timer);
  gshm_log_info("metrics at http://%s/metrics", listen);
  *out = h;
  return 0;
}

static void on_timer_closed(uv_handle_t *t) {
  struct gshmd_metrics_http *h = t->data;
  pthread_mutex_destroy(&h->lock);
  free(h->snapshot);
  free(h);
}

void gshmd_metrics_http_stop(struct gshmd_metrics_http *h) {
  if (!h)
    return;
  MHD_stop_daemon(h->mhd); /* joins the HTTP thread: no scrape runs after this */
  uv_close((uv_handle_t *)&h->timer, on_timer_closed);
}

#else /* !GSHM_HAVE_MHD */

struct gshmd_metrics_http {
  int unused;
};

int gshmd_metrics_http_start(uv_loop_t *loop, struct gshmd_server *srv, const char *listen,
                             struct gshmd_metrics_http **out) {
  struct sockaddr_storage sa;
  socklen_t salen;

  (void)loop, (void)srv, (void)out;
  if (gshm__parse_loopback(listen, &sa, &salen))
    return -EINVAL;
  gshm_log_err("metrics.http_listen is set, but this gshmd was built without libmicrohttpd");
  return -ENOTSUP;
}

void gshmd_metrics_http_stop(struct gshmd_metrics_http *h) { (void)h; }

#endif
