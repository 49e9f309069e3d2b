/* Prometheus text exposition of gshmd's state (metrics.c), used by the
 * METRICS request (server.c), the textfile timer (main.c) and the HTTP
 * endpoint's snapshot (metrics_http.c).  Loop thread only. */
#ifndef GSHMD_METRICS_H
#define GSHMD_METRICS_H

struct gshmd_server;

/* Renders the exposition (format 0.0.4) of s into *text_out, a
 * NUL-terminated malloc'ed string the caller frees.  Errors: -ENOMEM. */
int gshmd_metrics_render(struct gshmd_server *s, char **text_out);

/* Writes the exposition to `path` atomically: a temporary file in the same
 * directory (named so that node_exporter's *.prom glob never reads it
 * half-written), fsync, mode 0644, rename over the target.  Returns 0 or a
 * negative errno (logged once per distinct error). */
int gshmd_metrics_write_textfile(struct gshmd_server *s, const char *path);

#endif
