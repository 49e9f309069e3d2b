/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd configuration: one option table drives the INI parser (inih), the
 * command-line flags, --help and the commented conf/gshmd.conf.
 *
 * Precedence, lowest first: built-in defaults, /etc/gshm/gshmd.conf (or
 * --config FILE), FILE's directory conf.d/ *.conf in lexical order, then
 * command-line flags.  Unknown keys and malformed values are errors that name
 * the file, line and key. */
#ifndef GSHMD_CONFIG_H
#define GSHMD_CONFIG_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

/* The build may point these elsewhere (-DGSHMD_DEFAULT_CONFIG=...), e.g. to
 * match CMAKE_INSTALL_FULL_SYSCONFDIR. */
#ifndef GSHMD_DEFAULT_CONFIG
#define GSHMD_DEFAULT_CONFIG "/etc/gshm/gshmd.conf"
#endif
#ifndef GSHMD_DEFAULT_SOCKET
#define GSHMD_DEFAULT_SOCKET "/run/gshm/gshmd.sock"
#endif

/* What to do when gshmd may not (or cannot: its parents are missing) make
 * its socket or the socket's directory (err: the positive errno of mkdir
 * or bind), as a suffix of that log line; "" for other errors. */
#define GSHMD_SOCKET_ACCESS_HINT(err)                                                          \
  ((err) == EROFS                                                                              \
       ? " (a read-only file system, as /run is under gshmd.service's ProtectSystem=strict: "  \
         "there gshmd.socket makes the socket; elsewhere give it a writable path: --socket "   \
         "PATH, $GSHM_SOCKET or daemon.socket)"                                                \
   : (err) == EACCES || (err) == EPERM                                                         \
       ? " (run gshmd as root or through gshmd.socket, or give it a socket path this user may " \
         "create: --socket PATH, $GSHM_SOCKET or daemon.socket)"                                \
   : (err) == ENOENT || (err) == ENOTDIR                                                       \
       ? " (gshmd makes the socket's directory, not its parents: make them first, or give "    \
         "it another path: --socket PATH, $GSHM_SOCKET or daemon.socket)"                      \
       : "")
/* Why gshmd may not give its socket daemon.socket_group (chown's errno err):
 * gshmd.service takes both ways (the capability and the system call). */
#define GSHMD_SOCKET_GROUP_HINT(err)                                                           \
  ((err) == EPERM                                                                          \
       ? " (a socket's group is changed with CAP_CHOWN, or by a member of that group; "     \
         "gshmd.service refuses the chown system call (SystemCallFilter=~@privileged; it "   \
         "keeps CAP_CHOWN for fchown only, until its switch to daemon.user): "                \
         "there let gshmd.socket make the socket (SocketGroup=), or empty daemon.socket_group)" \
       : "")

/* Of a limit of max (limits.max_connections, limits.max_segments), the
 * part kept for root and daemon.admin_group: reserve
 * (limits.admin_connections, limits.admin_segments), at most a quarter of
 * max, so that the rest stays for everyone. */
static inline uint32_t gshmd_config_admin_reserve(uint32_t max, uint32_t reserve) {
  return reserve < max / 4 ? reserve : max / 4;
}

struct gshmd_config {
  /* [daemon] */
  char *socket_path;        /* socket = ; $GSHM_SOCKET, then --socket override */
  uint32_t socket_mode;     /* socket_mode = 0660 (octal) */
  char *socket_group;       /* socket_group = ; "" keeps the daemon's group */
  char *admin_group;        /* admin_group = ; "" means root only */
  char *user;               /* user = ; "" stays as started (user_switch.h) */
  char *backend;            /* backend = auto|host|cuda */
  char *sticky_start;       /* sticky_start = serve|restart: a sticky CUDA error at start */
  uint32_t gpu_probe_ms;    /* gpu_probe_ms = 10000: GPU probes while one keeps them unusable */
  int log_level;            /* log_level = 0..7 (syslog priorities), default 6 (info) */
  bool legacy_ipc;          /* legacy_ipc = false: allow cudaIpcMemHandle export */
  bool host_populate;       /* host_populate = false: allocate host pages at create */
  uint64_t host_recycle;    /* host_recycle = 0 (off): bytes of freed pulled memory kept */
  bool host_huge_pages;     /* host_huge_pages = true: MADV_HUGEPAGE on gshmd's host mappings */
  uint32_t poll_us;         /* poll a connection this long after a request (default 0 on < 4 CPUs) */
  /* Not a key: the uid that the host segments' memory files belong to
   * (daemon.user's, else gshmd's own), set by main.c before the backends
   * start: a restored memfd of another uid is given to it (backend_host.c
   * host_adopt_fd). */
  uint32_t memory_uid;

  /* [limits] */
  uint32_t max_connections;        /* default 4096 */
  uint32_t admin_connections;      /* of those, kept for root and admins: default 64 */
  uint32_t max_segments;           /* default 65536; also sizes FileDescriptorStoreMax */
  uint32_t admin_segments;         /* of those, kept for root and admins: default 64 */
  uint32_t max_fds_per_connection; /* fds a client may send in one packet: 0 */
  uint32_t max_packet;             /* bytes, default 65536 */
  uint32_t max_name;               /* bytes, default 255 */
  uint32_t max_inflight;           /* replies/events queued for a slow reader, default 16 */
  uint64_t max_segment_size;       /* bytes, default 0 = no limit */
  uint32_t idle_timeout_ms;        /* default 0 = never */
  uint32_t partial_timeout_ms;     /* default 5000 */

  /* [quota] per uid; 0 = unlimited; root exempt */
  uint64_t quota_host_bytes;
  uint64_t quota_cuda_bytes;
  uint32_t quota_segments;
  uint32_t quota_leases;
  uint32_t quota_connections;

  /* [metrics] */
  char *metrics_textfile;          /* "" = off */
  uint32_t metrics_interval_sec;   /* default 15 */
  char *metrics_http_listen;       /* "" = off; loopback "ADDR:PORT" */

  /* [cluster] (daemon/cluster/, docs/CLUSTER.md) */
  char *cluster_listen;            /* "" = off; "ADDRESS:PORT" */
  char *cluster_node_name;         /* "" = the host name */
  char *cluster_peers;             /* "NAME=ADDRESS:PORT ..." */
  char *cluster_export;            /* fnmatch patterns, blank-separated */
  char *cluster_secret_file;       /* root-only file with the shared key */
  char *cluster_pull_group;        /* "" = admins only */
  bool cluster_encrypt;            /* encrypt the streams between nodes */
  char *cluster_mac;               /* auto|poly1305: how frames are authenticated without encryption */
  char *cluster_transport;         /* auto|tcp: UCX where it reaches, or the stream only */
  char *cluster_min_protocol;      /* 2.0|2.6: the oldest cluster protocol a peer may speak */
  uint64_t cluster_pull_chunk;     /* bytes per ucp_get_nbx */
  uint32_t cluster_pull_depth;     /* gets in flight per pull */
  uint32_t cluster_streams;        /* TCP data lanes a puller opens per peer */
  bool cluster_memory_check;       /* pulls into host memory must fit (grants.c) */
  char *cluster_prefault;          /* auto|always|off: fault pulled host memory in ahead of its lanes */
  uint64_t cluster_staging_bytes;  /* pinned host bytes per staged pull */
  uint64_t cluster_staging_arena;  /* pinned host bytes made at the start for staging */
  char *cluster_staging;           /* auto|always: how device (and host) segments are served */
  uint32_t cluster_request_timeout_ms; /* an unanswered request to a peer fails after this */

  /* the files read, for --check-config: "read FILE and N drop-ins from its
   * conf.d", or "FILE is missing: the built-in defaults" */
  char sources[4200];
};

/* Bytes a list item (lease, the largest) takes besides its segment name,
 * at most: the bound gshmd_config_setup checks limits.max_name against. */
#define GSHMD_LIST_ITEM_OVERHEAD 1024

/* What gshmd_config_setup() tells main to do next. */
enum gshmd_config_action {
  GSHMD_CONFIG_RUN = 0,      /* start the daemon */
  GSHMD_CONFIG_EXIT_OK,      /* --help, --version, --print-config, --dump-config */
  GSHMD_CONFIG_CHECK,        /* --check-config: the options are valid; the caller checks
                                the rest (gshmd_cluster_check_config), then exits */
};

/* Fills *cfg with the built-in defaults.  Returns 0 or -ENOMEM. */
int gshmd_config_init(struct gshmd_config *cfg);

/* Parses argv (getopt_long), loads the config file and its conf.d drop-ins,
 * then re-applies the flags so they win.  Handles --help, --version,
 * --print-config (writes the commented config file generated from the
 * option table to stdout) and --check-config (validates, prints "ok" and
 * returns EXIT_OK) itself.  Errors are printed to stderr as
 * "gshmd: FILE:LINE: key 'KEY': WHAT" and returned as -EINVAL (bad value,
 * unknown key, usage) or -ENOENT (explicit --config FILE missing; the
 * default file may be missing), or -EIO what it printed could not be
 * written (stdout on a full disk; said on stderr).  *action_out is written
 * only on success. */
int gshmd_config_setup(struct gshmd_config *cfg, int argc, char **argv,
                       enum gshmd_config_action *action_out);

/* Frees the strings owned by *cfg; accepts a zeroed or half-filled cfg. */
void gshmd_config_free(struct gshmd_config *cfg);

#endif
