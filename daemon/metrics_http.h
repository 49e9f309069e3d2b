/* SPDX-License-Identifier: Apache-2.0 */
/* Optional Prometheus endpoint on a loopback TCP address (libmicrohttpd).
 *
 * libmicrohttpd serves from its own thread; the registry belongs to the
 * libuv loop.  So the loop renders the exposition into a snapshot once a
 * second and the HTTP thread only copies the snapshot under a mutex: a
 * scrape never touches the registry and sees data at most 1 s old.  Each
 * connection counts against the uid that owns the client's socket (the
 * kernel's sock_diag, looked up as it is accepted): 4 a uid, 64 in all, so
 * that one local user's slow sockets cannot take every slot, and the last
 * 8 for root and daemon.admin_group, so that many uids together cannot
 * either. */
#ifndef GSHMD_METRICS_HTTP_H
#define GSHMD_METRICS_HTTP_H

#include <uv.h>

struct gshmd_server;
struct gshmd_metrics_http;

/* Starts serving GET /metrics on `listen` ("127.0.0.1:9477", "[::1]:9477",
 * "localhost:9477"), refreshing from srv every second on loop.  *out
 * receives the handle.  Errors: -EINVAL not a loopback ADDRESS:PORT;
 * -ENOTSUP gshmd was built without libmicrohttpd; -EADDRINUSE / -EIO the
 * listener could not start (logged). */
int gshmd_metrics_http_start(uv_loop_t *loop, struct gshmd_server *srv, const char *listen,
                             struct gshmd_metrics_http **out);

/* Stops the listener and frees; accepts NULL. */
void gshmd_metrics_http_stop(struct gshmd_metrics_http *h);

#endif
