/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd: the gshm daemon.  main() is a chain of setup steps with one
 * shutdown path that copes with any of them half done
 * (nvidia-persistenced's shape). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "cluster.h"
#include "config.h"
#include "fd_limit.h"
#include "fdstore.h"
#include "gpu_fault.h"
#include "leasekey.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "registry.h"
#include "server.h"
#include "user_switch.h"
#include "util.h"

struct daemon {
  struct gshmd_config cfg;
  uv_loop_t loop;
  bool loop_ready;
  struct gshmd_registry reg;
  bool reg_ready;
  struct gshmd_server srv;
  bool srv_ready;
  int listen_fd;
  bool socket_activated;
  bool socket_created; /* we bound the path: unlink it at exit */
  uv_signal_t sigterm, sigint;
  uv_timer_t status_timer, watchdog_timer, metrics_timer, reap_timer;
  bool metrics_timer_on, reap_timer_on;
  uv_work_t metrics_work;  /* the textfile's write, on the thread pool */
  char *metrics_text;      /* what it writes; non-NULL while queued */
  uint64_t watchdog_usec;
  char last_status[512];
  char fd_warning[160];    /* setup_fd_limit's finding, repeated in STATUS= */
  struct gshmd_fdstore fdstore;
  struct gshmd_leasekey leasekey; /* lease tokens' key, kept in the fd store */
  struct gshmd_metrics_http *http;
  struct gshmd_cluster *cluster;
  bool signals_on, timers_on;
  bool stopping;
  bool sticky_at_start; /* a sticky CUDA error at start, to exit for (sticky_start = restart) */
  struct gshmd_gpu_fault gpu; /* probes after one met at start (sticky_start = serve) */
  struct gshmd_user user;     /* daemon.user: who gshmd becomes before READY=1 */
};

static void setup_logging(struct daemon *d) {
  /* Priority prefixes only where journald reads us; plain text on a tty. */
  gshm__log_setup("gshmd", d->cfg.log_level, !isatty(STDERR_FILENO));
}

/* What is missing when the CUDA backend cannot start (gshm__cudadrv_load's
 * and the backend's errors), said so that a user knows what to install. */
static const char *cuda_missing(int e) {
  switch (-e) {
  case ENOENT:
    return "libcuda.so.1 not found: no NVIDIA driver installed";
  case ENOSYS:
    return "the NVIDIA driver is older than the CUDA version gshm was built for";
  case ENODEV:
    return "cuInit failed: no NVIDIA GPU, or its driver is not loaded";
  default:
    return strerror(-e);
  }
}

/* Whether a sticky CUDA error at start exits for a restart
 * (daemon.sticky_start = restart, under a service manager) rather than
 * serving without the GPUs (gpu_fault.h). */
static bool sticky_restarts(const struct daemon *d) {
  return getenv("NOTIFY_SOCKET") && d->cfg.sticky_start && !strcmp(d->cfg.sticky_start, "restart");
}

static int setup_backends(struct daemon *d) {
  const char *want = d->cfg.backend ? d->cfg.backend : "auto";
  char fault[GSHMD_FAULT_MAX];
  int e;

  if ((e = gshmd_backend_host_create(&d->cfg, &d->reg.host))) {
    gshm_log_err("host backend: %s", strerror(-e));
    return e;
  }
  if (!strcmp(want, "host"))
    return 0;
  e = gshmd_backend_cuda_create(&d->cfg, &d->reg.cuda, fault);
  if ((d->sticky_at_start = e == -ENOTRECOVERABLE && sticky_restarts(d)))
    return e;
  if (e == -ENOTRECOVERABLE) { /* host served, device segments parked, GPUs probed */
    gshmd_gpu_fault_set(&d->reg, fault, d->cfg.gpu_probe_ms);
    return 0;
  }
  if (e && !strcmp(want, "cuda")) {
    gshm_log_err("backend = cuda, but the CUDA backend is unavailable: %s (daemon.backend = "
                 "auto or host serves host segments without it)", cuda_missing(e));
    return e;
  }
  if (e) /* (probed if the restore parks device segments: gpu_fault.c) */
    gshm_log_notice("device segments unavailable (%s); serving host segments only",
                    d->gpu.no_driver = cuda_missing(e));
  else
    gshm_log_info("cuda backend: %u device(s)", d->reg.cuda->ndevices);
  return 0;
}

/* Makes the socket's directory (e.g. /run/gshm) if missing, not its parents. */
static int socket_dir_make(const char *path) {
  char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
  char *slash;
  int e;

  snprintf(dir, sizeof(dir), "%s", path);
  slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
      e = -errno;
      gshm_log_err("mkdir %s: %m%s", dir, GSHMD_SOCKET_ACCESS_HINT(-e));
      return e;
    }
  }
  return 0;
}

/* A socket already at path: a live daemon answers connect() (refuse to
 * start); a stale one from a crash does not (replaced later); never
 * another kind of file, nor another program's live socket.  Returns 0 or a negative errno (logged). */
static int socket_check_existing(const struct sockaddr_un *sa, const char *path) {
  struct stat st;
  int probe;
  bool live, other;

  if (lstat(path, &st) < 0)
    return 0;
  if (!S_ISSOCK(st.st_mode)) {
    gshm_log_err("%s exists and is not a socket; not removing it", path);
    return -EEXIST;
  }
  probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  live = probe >= 0 && connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) == 0;
  /* EPROTOTYPE: a stream or datagram socket that a live process holds
   * (a stale one refuses, ECONNREFUSED): another program's, which gshmd
   * replaced, and unlinked at its exit */
  other = probe >= 0 && !live && errno == EPROTOTYPE;
  if (probe >= 0)
    close(probe);
  if (other)
    gshm_log_err("%s is another program's socket (a stream or datagram one, open); not "
                 "removing it", path);
  else if (live)
    gshm_log_err("another gshmd is already listening on %s", path);
  return live || other ? -EADDRINUSE : 0;
}

/* Gives the bound socket at name the configured mode and group.  Returns 0, -ENOENT
 * (daemon.socket_group names no group) or chown's error, logged: a socket of gshmd's
 * own group would refuse everyone the admin meant to let in, so gshmd does not start. */
static int socket_set_owner(struct daemon *d, const char *name) {
  if (chmod(name, d->cfg.socket_mode) < 0)
    gshm_log_warn("chmod %s %o: %m", name, d->cfg.socket_mode);
  if (d->cfg.socket_group && *d->cfg.socket_group) {
    struct group *g = getgrnam(d->cfg.socket_group);
    if (!g) {
      gshm_log_err("daemon.socket_group '%s': no such group (create it, or set the group that "
                   "may connect)", d->cfg.socket_group);
      return -ENOENT;
    }
    if (chown(name, (uid_t)-1, g->gr_gid) < 0) {
      gshm_log_err("daemon.socket_group '%s': chown %s: %m%s", d->cfg.socket_group, name,
                   GSHMD_SOCKET_GROUP_HINT(errno));
      return -errno; /* (the log keeps errno) */
    }
  }
  return 0;
}

/* The socket appears at its path with its mode and group in one step:
 * bound (under a umask giving that mode) and set up under a temporary
 * name next to it, then renamed over a stale one.  Clients reconnecting
 * during a restart never find the path missing or refusing them (a
 * non-root client got EACCES between bind and chmod, and took it for a
 * real refusal).  A path too long for the temporary name is bound in
 * place.  Returns the listening fd or a negative errno (logged). */
static int socket_bind_listen(struct daemon *d, const char *path) {
  char tmp[sizeof(((struct sockaddr_un *)0)->sun_path)];
  int n = snprintf(tmp, sizeof(tmp), "%s.%d~", path, (int)getpid());
  bool staged = n > 0 && (size_t)n < sizeof(tmp);
  const char *bound = staged ? tmp : path;
  struct sockaddr_un ta = {.sun_family = AF_UNIX};
  mode_t old;
  int fd, r, e;

  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    e = -errno;
    gshm_log_err("socket: %m");
    return e;
  }
  strcpy(ta.sun_path, bound);
  unlink(bound); /* a leftover temporary name, or the stale socket */
  old = umask(0777 & ~d->cfg.socket_mode);
  r = bind(fd, (struct sockaddr *)&ta, sizeof(ta));
  umask(old);
  if (r < 0) {
    e = -errno;
    gshm_log_err("bind %s: %m%s", path, GSHMD_SOCKET_ACCESS_HINT(-e));
    close(fd);
    return e;
  }
  if ((e = socket_set_owner(d, bound))) {
    unlink(bound);
    close(fd);
    return e;
  }
  if (listen(fd, SOMAXCONN) < 0 || (staged && rename(tmp, path) < 0)) {
    e = -errno;
    gshm_log_err("%s %s: %m", staged ? "listen or rename" : "listen", bound);
    unlink(bound);
    close(fd);
    return e;
  }
  return fd;
}

/* Binds the socket path unless systemd handed us a listening socket. */
static int setup_socket(struct daemon *d, int *listen_fds, char **names, int nfds) {
  const char *path = d->cfg.socket_path;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd, e;

  for (int i = 0; i < nfds; i++) {
    if (sd_is_socket_unix(listen_fds[i], SOCK_SEQPACKET, 1, NULL, 0) > 0) {
      d->listen_fd = listen_fds[i];
      listen_fds[i] = -1;
      d->socket_activated = true;
      gshm_log_info("listening on the socket systemd passed ('%s')", names ? names[i] : "?");
      return 0;
    }
  }
  if (strlen(path) >= sizeof(sa.sun_path)) {
    gshm_log_err("socket path '%s' is longer than %zu bytes", path, sizeof(sa.sun_path) - 1);
    return -ENAMETOOLONG;
  }
  strcpy(sa.sun_path, path);
  if ((e = socket_dir_make(path)) || (e = socket_check_existing(&sa, path)))
    return e;
  if ((fd = socket_bind_listen(d, path)) < 0)
    return fd;
  d->socket_created = true;
  d->listen_fd = fd;
  gshm_log_info("listening on %s", path);
  return 0;
}

/* Closes every handle of ours on the loop, once, so that uv_run returns:
 * from a signal, or from the shutdown path after a failed setup step. */
static void close_handles(struct daemon *d) {
  if (d->stopping)
    return;
  d->stopping = true;
  /* Detach the fd store first: ending the connections ends their leases,
   * which frees unlinked segments, and those must stay parked for the
   * next start to hand back to their holders (a graceful restart keeps
   * what a SIGKILL keeps). */
  gshmd_fdstore_shutdown(&d->fdstore);
  gshmd_gpu_fault_probe_stop(&d->gpu);
  /* The cluster first: its pulls fail and tell their requesters, whose
   * connections are still open. */
  gshmd_cluster_stop(d->cluster);
  d->reg.stopping = true;
  if (d->srv_ready)
    gshmd_server_stop(&d->srv);
  if (d->signals_on) {
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
  }
  if (d->timers_on) {
    uv_close((uv_handle_t *)&d->status_timer, NULL);
    if (d->watchdog_usec)
      uv_close((uv_handle_t *)&d->watchdog_timer, NULL);
    if (d->metrics_timer_on)
      uv_close((uv_handle_t *)&d->metrics_timer, NULL);
    if (d->reap_timer_on)
      uv_close((uv_handle_t *)&d->reap_timer, NULL);
  }
  gshmd_metrics_http_stop(d->http);
  d->http = NULL;
}

static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;

  if (d->stopping)
    return;
  gshm_log_info("%s: shutting down", strsignal(signum));
  sd_notify(0, "STOPPING=1");
  close_handles(d);
}

/* STATUS= for systemctl status, sent only when it changes. */
static void update_status(struct daemon *d) {
  char line[512], sz[32], behind[64] = "", gpus[192] = "";
  unsigned owed = gshmd_fdstore_retry(&d->fdstore); /* the store's retry, once a second */

  gshmd_leasekey_retry(&d->leasekey);

  if (owed)
    snprintf(behind, sizeof(behind), "; fd store behind: %u segment%s", owed, gshm__plural(owed));
  if (*d->reg.gpu_fault)
    snprintf(gpus, sizeof(gpus), "; GPUs unusable: %s at start (%s), device segments parked",
             d->reg.gpu_no_driver ? "no CUDA driver" : "sticky CUDA error", d->reg.gpu_fault);
  snprintf(line, sizeof(line), "STATUS=%u client%s, %u segment%s, %s, %u lease%s%s%s%s%s",
           d->reg.nclients, gshm__plural(d->reg.nclients), d->reg.nsegments,
           gshm__plural(d->reg.nsegments), gshm__format_size(d->reg.bytes, sz, sizeof(sz)),
           d->reg.nleases, gshm__plural(d->reg.nleases), *d->fd_warning ? "; " : "", d->fd_warning,
           behind, gpus);
  if (strcmp(line, d->last_status)) {
    strcpy(d->last_status, line);
    sd_notify(0, line);
  }
}

/* A sticky CUDA error at run time, or the GPUs working again after one
 * at start, stops gshmd as SIGTERM does, so that every segment stays in
 * the fd store (close_handles), but without STOPPING=1: main exits
 * GSHMD_EXIT_RESTART, a failure to systemd, and the unit's
 * Restart=on-failure starts a gshmd that adopts them again (gpu_fault.h).
 * Checked once a second, on the loop. */
static void check_restart(struct daemon *d) {
  if (!d->stopping && gshmd_gpu_fault_restart_due(&d->gpu, &d->reg, &d->fdstore))
    close_handles(d);
}

static void on_status_timer(uv_timer_t *t) {
  update_status(t->data);
  check_restart(t->data);
}

/* The textfile: rendered on the loop (it reads the registry), written on
 * libuv's thread pool (write, fsync and rename must not stall clients
 * behind a slow disk).  A write still running when the timer fires again
 * skips that tick. */
static void metrics_work(uv_work_t *w) {
  struct daemon *d = w->data;
  gshmd_metrics_store_textfile(d->cfg.metrics_textfile, d->metrics_text);
}

static void metrics_work_done(uv_work_t *w, int status) {
  struct daemon *d = w->data;
  (void)status;
  free(d->metrics_text);
  d->metrics_text = NULL;
}

static void on_metrics_timer(uv_timer_t *t) {
  struct daemon *d = t->data;

  if (d->metrics_text || gshmd_metrics_render(&d->srv, &d->metrics_text))
    return;
  d->metrics_work.data = d;
  if (uv_queue_work(&d->loop, &d->metrics_work, metrics_work, metrics_work_done)) {
    free(d->metrics_text);
    d->metrics_text = NULL;
  }
}

/* A restart's grace period is over (its length and what it keeps: the
 * registry's, gshmd_registry_grace_begin). */
static void on_reap_timer(uv_timer_t *t) {
  struct daemon *d = t->data;
  unsigned n = gshmd_registry_reap_unlinked(&d->reg);
  if (n)
    gshm_log_info("freed %u unlinked segment(s) nobody re-took after the restart", n);
}

static void on_watchdog_timer(uv_timer_t *t) {
  (void)t;
  sd_notify(0, "WATCHDOG=1");
}

static int setup_timers(struct daemon *d) {
  uint64_t grace_ms;

  d->timers_on = true;
  uv_timer_init(&d->loop, &d->status_timer);
  d->status_timer.data = d;
  uv_timer_start(&d->status_timer, on_status_timer, 1000, 1000);
  uv_unref((uv_handle_t *)&d->status_timer);
  if ((grace_ms = gshmd_registry_grace_begin(&d->reg))) {
    uv_timer_init(&d->loop, &d->reap_timer);
    d->reap_timer.data = d;
    uv_timer_start(&d->reap_timer, on_reap_timer, grace_ms, 0);
    uv_unref((uv_handle_t *)&d->reap_timer);
    d->reap_timer_on = true;
  }
  if (d->cfg.metrics_textfile && *d->cfg.metrics_textfile) {
    uint64_t ms = (uint64_t)d->cfg.metrics_interval_sec * 1000;
    uv_timer_init(&d->loop, &d->metrics_timer);
    d->metrics_timer.data = d;
    uv_timer_start(&d->metrics_timer, on_metrics_timer, 0, ms); /* interval_sec >= 1 */
    uv_unref((uv_handle_t *)&d->metrics_timer);
    d->metrics_timer_on = true;
  }
  if (gshmd_gpu_fault_probe_start(&d->gpu, &d->loop, &d->reg, d->cfg.gpu_probe_ms,
                                  d->cfg.log_level))
    gshm_log_warn("gpu probes cannot start: restart gshmd once the GPUs work");
  /* Pet the watchdog at half its period, from the loop itself: a stuck
   * loop stops the pats, which is the point. */
  if (sd_watchdog_enabled(0, &d->watchdog_usec) > 0 && d->watchdog_usec) {
    uint64_t ms = d->watchdog_usec / 2000;
    uv_timer_init(&d->loop, &d->watchdog_timer);
    d->watchdog_timer.data = d;
    uv_timer_start(&d->watchdog_timer, on_watchdog_timer, 0, ms ? ms : 1);
    uv_unref((uv_handle_t *)&d->watchdog_timer);
  } else {
    d->watchdog_usec = 0;
  }
  return 0;
}

/* The cluster's answers to deferred requests go out through the server. */
static int cluster_reply(void *arg, struct gshmd_client *c, uint16_t type, uint32_t request_id,
                         const Gshm__Reply *reply) {
  return gshmd_server_reply(arg, c, type, request_id, reply);
}

static int setup_signals(struct daemon *d) {
  signal(SIGPIPE, SIG_IGN);
  /* The host backend's recycling takes a write lease on a memfd for an
   * instant (backend_host.c others_hold): were the memfd opened then (root
   * or gshmd's user through /proc), the kernel would signal SIGIO, whose
   * default ends the process. */
  signal(SIGIO, SIG_IGN);
  uv_signal_init(&d->loop, &d->sigterm);
  uv_signal_init(&d->loop, &d->sigint);
  d->sigterm.data = d->sigint.data = d;
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  d->signals_on = true;
  return 0;
}

/* The fds systemd passed us (the listening socket and the fd store's),
 * each set to -1 once a setup step has claimed it. */
struct passed_fds {
  int *fds;
  char **names; /* NULL when systemd gave none */
  int n;
};

static void passed_fds_get(struct passed_fds *p) {
  p->n = sd_listen_fds_with_names(1, &p->names);
  if (p->n < 0) {
    gshm_log_warn("sd_listen_fds: %s", strerror(-p->n));
    p->n = 0;
  }
  if (p->n > 0 && (p->fds = malloc(sizeof(int) * (size_t)p->n)))
    for (int i = 0; i < p->n; i++)
      p->fds[i] = SD_LISTEN_FDS_START + i;
}

/* Closes what no setup step claimed (warning, when warn: systemd passed
 * something gshmd does not know) and frees the table. */
static void passed_fds_close(struct passed_fds *p, bool warn) {
  for (int i = 0; p->fds && i < p->n; i++)
    if (p->fds[i] >= 0) {
      if (warn)
        gshm_log_warn("closing unclaimed fd '%s' from systemd", p->names ? p->names[i] : "?");
      close(p->fds[i]);
      p->fds[i] = -1;
    }
}

static void passed_fds_free(struct passed_fds *p) {
  passed_fds_close(p, false);
  free(p->fds);
  if (p->names)
    for (int i = 0; i < p->n; i++)
      free(p->names[i]);
  free(p->names);
}

/* The setup chain, from the loop to READY=1: 0, or -1 when a step failed
 * (it logged why); shutdown_all copes with wherever it stopped. */
/* libuv's thread pool (4 threads unless UV_THREADPOOL_SIZE says) checks
 * and seals the frames of every data lane and runs the staging copies:
 * 16 threads, so that a pull's 8 lanes on each side, and the copies of a
 * staged one, do not queue behind 4.  Set before the pool's first use. */
#define GSHMD_THREADPOOL_SIZE "16"

static int setup_all(struct daemon *d, struct passed_fds *p) {
  setenv("UV_THREADPOOL_SIZE", GSHMD_THREADPOOL_SIZE, 0); /* (the environment's wins) */
  if (uv_loop_init(&d->loop))
    return -1;
  d->loop_ready = true;
  gshmd_registry_init(&d->reg, &d->cfg);
  d->reg_ready = true;
  gshmd_fd_limit_setup(&d->cfg, d->fd_warning, sizeof(d->fd_warning));
  if (gshmd_user_resolve(d->cfg.user, &d->user, false) == 0 && d->user.on)
    d->cfg.memory_uid = d->user.uid; /* (the restore gives it the stored memory) */
  else if (!d->user.on && d->cfg.user && *d->cfg.user) /* (no thread started yet) */
    gshmd_user_keep_no_capability();
  if (setup_backends(d))
    return -1;
  /* The lease key first: its entry is not the fd store's to adopt. */
  if (!gshmd_leasekey_setup(&d->leasekey, p->fds, p->names, p->n))
    gshmd_leasekey_attach(&d->leasekey, &d->reg);
  if (gshmd_fdstore_setup(&d->fdstore, &d->reg))
    return -1;
  d->fdstore.sticky_restart = sticky_restarts(d);
  if (gshmd_fdstore_restore(&d->fdstore, p->fds, p->names, p->n))
    return -1;
  gshmd_gpu_fault_take_backend(&d->gpu, &d->reg, d->cfg.gpu_probe_ms); /* (a sticky error) */
  if (setup_socket(d, p->fds, p->names, p->n))
    return -1;
  /* Whatever systemd passed that nobody claimed is closed, not leaked. */
  passed_fds_close(p, true);
  if (gshmd_server_start(&d->srv, &d->loop, &d->cfg, &d->reg, d->listen_fd))
    return -1;
  d->srv_ready = true;
  d->listen_fd = -1; /* the server owns it now */
  if (gshmd_cluster_start(&d->loop, &d->cfg, &d->reg, cluster_reply, &d->srv, &d->cluster))
    return -1;
  d->srv.cluster = d->cluster;
  gshmd_cluster_loglimit(d->cluster, &d->srv.loglimit); /* (peers' lines: their rate) */
  setup_signals(d);
  setup_timers(d);
  /* Before anything is served: the store's queued fds then count against
   * the new user once its buckets are sent again (user_switch.h).  Before
   * the metrics endpoint, whose thread answers TCP connections from its
   * start, not from the loop's: it never runs as root (nor with the
   * capabilities gshmd.service keeps for the switch). */
  if (d->user.on && gshmd_user_switch(&d->user) == 0)
    gshmd_fdstore_resend_all(&d->fdstore);
  if (d->cfg.metrics_http_listen && *d->cfg.metrics_http_listen &&
      gshmd_metrics_http_start(&d->loop, &d->srv, d->cfg.metrics_http_listen, &d->http))
    return -1;
  update_status(d);
  sd_notify(0, "READY=1");
  gshm_log_info("ready: %u segment%s restored", d->reg.nsegments, gshm__plural(d->reg.nsegments));
  return 0;
}

/* The one shutdown path, after a clean stop or a failed setup step. */
static void shutdown_all(struct daemon *d) {
  if (d->loop_ready) {
    close_handles(d);
    uv_run(&d->loop, UV_RUN_DEFAULT); /* let closing handles finish */
  }
  gshmd_cluster_destroy(d->cluster);
  d->srv.cluster = NULL;
  if (d->srv_ready)
    close(d->srv.listen_fd);
  gshmd_server_free(&d->srv);
  if (d->listen_fd >= 0)
    close(d->listen_fd);
  if (d->socket_created && !d->socket_activated)
    unlink(d->cfg.socket_path);
  /* a stopped gshmd must not go on reporting gshm_up 1 to the node exporter */
  if (d->metrics_timer_on)
    unlink(d->cfg.metrics_textfile);
  gshmd_fdstore_shutdown(&d->fdstore);
  if (d->reg_ready)
    gshmd_registry_destroy(&d->reg);
  gshmd_leasekey_destroy(&d->leasekey);
  if (d->reg.cuda)
    d->reg.cuda->ops->destroy(d->reg.cuda);
  if (d->reg.host)
    d->reg.host->ops->destroy(d->reg.host);
  if (d->loop_ready)
    uv_loop_close(&d->loop);
}

/* --check-config, once the options are valid: what gshmd_cluster_start
 * would refuse is refused the same way.  Returns main's exit status. */
static int check_config(struct daemon *d) {
  const char *unused = gshmd_cluster_unused_key(&d->cfg);
  int e;

  gshm__log_setup("gshmd", GSHM_LOG_ERR, 0);
  e = gshmd_cluster_check_config(&d->cfg);
  if (!e && unused)
    fprintf(stderr, "gshmd: warning: " GSHMD_CLUSTER_UNUSED_KEY_FMT "\n", unused);
  if (!e)
    printf("gshmd: configuration ok (%s)\n", d->cfg.sources);
  if (!e && (e = gshm__stdout_flush())) { /* (a full disk: not "ok" with nothing said) */
    fprintf(stderr, "gshmd: writing to stdout: %s\n", strerror(-e));
    e = -EIO; /* exit 1, whatever the write's errno */
  }
  gshmd_config_free(&d->cfg);
  return e == -EINVAL ? 2 : e ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* A start that failed (a configuration gshmd refuses, a cluster key it may
 * not read, its port taken) while the service manager's fd store holds
 * segments.  Exiting at once, Restart=on-failure would start gshmd again
 * until StartLimitBurst= (5 in StartLimitIntervalSec=30s) failed the unit,
 * and a failed unit's store is dropped: every segment freed over a typo in
 * gshmd.conf.  So such a start waits GSHMD_STICKY_START_DELAY_S (10 s: at
 * most 3 starts in any 30 s, as a sticky CUDA error's start), saying why
 * in the log and STATUS=, and then exits as it would have; the first start
 * after the cause is mended adopts every segment.  Without a service
 * manager, or with no segment stored (stored: gshmd_fdstore_passed_segments
 * before sd_listen_fds took the variables), it exits at once. */
static void start_failed_wait(bool stored) {
  if (!getenv("NOTIFY_SOCKET") || !stored)
    return;
  if (gshm__log_level() < GSHM_LOG_ERR) /* (a configuration error: before setup_logging) */
    gshm__log_setup("gshmd", GSHM_LOG_ERR, !isatty(STDERR_FILENO));
  gshm_log_err("could not start (above); the fd store holds segments: exiting in %d s, so that "
               "systemd's restarts stay within the unit's start limit and keep every segment "
               "until a start succeeds (check the configuration: gshmd --check-config)",
               GSHMD_STICKY_START_DELAY_S);
  sd_notify(0, "STATUS=could not start (see the log): retrying, every segment kept in the fd "
               "store, until a start succeeds");
  gshmd_start_delay();
}

int main(int argc, char **argv) {
  static struct daemon d;
  struct passed_fds passed = {0};
  enum gshmd_config_action action;
  int e, status = EXIT_FAILURE;
  bool stored;

  d.listen_fd = -1;
  if (argc > 1 && !strcmp(argv[1], GSHMD_PROBE_FLAG))
    gshmd_gpu_fault_probe_main(argc, argv);
  if (gshmd_config_init(&d.cfg))
    return EXIT_FAILURE;
  e = gshmd_config_setup(&d.cfg, argc, argv, &action);
  if (e < 0) {
    gshmd_config_free(&d.cfg);
    start_failed_wait(gshmd_fdstore_passed_segments());
    return e == -EINVAL ? 2 : EXIT_FAILURE;
  }
  if (action == GSHMD_CONFIG_EXIT_OK) {
    gshmd_config_free(&d.cfg);
    return EXIT_SUCCESS;
  }
  if (action == GSHMD_CONFIG_CHECK)
    return check_config(&d);
  setup_logging(&d);
  stored = gshmd_fdstore_passed_segments();
  passed_fds_get(&passed);
  if (setup_all(&d, &passed) == 0) {
    uv_run(&d.loop, UV_RUN_DEFAULT);
    status = EXIT_SUCCESS;
  } else if (gshmd_backend_needs_restart(d.reg.cuda))
    d.sticky_at_start = true; /* (met in the restore) */
  if (d.sticky_at_start || gshmd_backend_needs_restart(d.reg.cuda) /* (or at run time) */ ||
      d.gpu.restarting)
    status = GSHMD_EXIT_RESTART;
  shutdown_all(&d);
  if (d.sticky_at_start)
    gshmd_gpu_fault_start_wait();
  else if (status == EXIT_FAILURE)
    start_failed_wait(stored);
  passed_fds_free(&passed);
  gshmd_config_free(&d.cfg);
  return status;
}
