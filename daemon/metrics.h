/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition of gshmd's state (metrics.c), used by the
 * METRICS request (requests.c), the textfile timer (main.c) and the HTTP
 * endpoint's snapshot (metrics_http.c).  Loop thread only, but for
 * gshmd_metrics_store_textfile. */
#ifndef GSHMD_METRICS_H
#define GSHMD_METRICS_H


struct gshmd_server;

/* Renders the exposition (format 0.0.4) of s into *text_out, a
 * NUL-terminated malloc'ed string the caller frees.  Errors: -ENOMEM. */
int gshmd_metrics_render(struct gshmd_server *s, char **text_out);

/* A sealed memfd (F_SEAL_WRITE, _SHRINK, _GROW, _SEAL) holding the len
 * bytes of text: the METRICS answer when the exposition does not fit one
 * reply (64 KiB: about 115 peers of short names), sent as the reply's fd.
 * Returns the fd (the caller's, to close once sent) or a negative errno
 * (-EMFILE, -ENOMEM, a write's). */
int gshmd_metrics_memfd(const char *text, size_t len);

/* Writes `text` (an exposition from gshmd_metrics_render) to `path`
 * atomically: a new temporary file in the same directory (mkostemp; named
 * so that node_exporter's *.prom glob never reads it half-written), fsync,
 * mode 0644, rename over the target.  Touches no daemon state, so it may
 * run off the loop (main.c runs it on libuv's thread pool: the fsync must
 * not stall the clients), one call at a time.  Returns 0 or a negative
 * errno (logged once per distinct error). */
int gshmd_metrics_store_textfile(const char *path, const char *text);

#endif
