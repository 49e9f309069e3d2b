/* SPDX-License-Identifier: Apache-2.0 */
/* The gshmd option table: one row per configuration key.  It drives the INI
 * handler, value validation, --help, --print-config (conf/gshmd.conf) and
 * --dump-config, so a key added here appears everywhere at once.
 *
 * X(section, key, type, field, default, min, max, choices, help)
 *
 *   section  INI section, without brackets
 *   key      key inside the section
 *   type     STR, PATH, ENUM, BOOL, U32, SIZE32, SIZE, MODE, LOGLEVEL
 *            (see enum option_type in config_internal.h; the field's C type is
 *            checked at compile time)
 *   field    member of struct gshmd_config
 *   default  the built-in default, written as it would be in the file; it
 *            goes through the same parser as a file value
 *   min,max  numeric range (U32, SIZE32, SIZE, MODE, LOGLEVEL) or byte
 *            length (STR, PATH; min 1 forbids the empty string)
 *   choices  ENUM only: the accepted words separated by '|'
 *   help     one paragraph, wrapped when printed
 *
 * Rows of one section must stay together: --print-config writes a section
 * header whenever the section changes. */
#ifndef GSHMD_OPTION_TABLE_H
#define GSHMD_OPTION_TABLE_H

#include "config.h"

/* Bytes of cluster.peers and of cluster.export, continued lines joined:
 * about 550 peers of "nodeNNN=10.0.NNN.NNN:7470" (4095 held about 140).
 * (`gshmctl peers` comes in pages of one reply each, daemon/cluster/
 * peers.c: short entries make ~1400 peers, with messages of up to 159
 * bytes ~200 KiB of rows; they once had to fit one reply of 64 KiB.) */
#define GSHMD_CONFIG_LIST_MAX 16383

#define GSHMD_OPTION_TABLE(X)                                                   \
  X(daemon, socket, PATH, socket_path, GSHMD_DEFAULT_SOCKET, 1, 107, NULL,      \
    "Path of the listening Unix socket (SOCK_SEQPACKET). Ignored when systemd " \
    "passes the socket in (socket activation, gshmd.socket). $GSHM_SOCKET "     \
    "overrides this key and --socket overrides both.")                          \
  X(daemon, socket_mode, MODE, socket_mode, "0660", 0, 0777, NULL,              \
    "Permission bits (octal) of the socket when gshmd creates it itself; "      \
    "with socket activation SocketMode= of gshmd.socket applies. With "         \
    "socket_group this decides who may connect.")                               \
  X(daemon, socket_group, STR, socket_group, "", 0, 255, NULL,                  \
    "Group that owns the socket when gshmd creates it itself; empty keeps the " \
    "daemon's group. A group that does not exist, or one gshmd may not give "  \
    "(that needs CAP_CHOWN, which gshmd.service does not grant, or membership)," \
    " stops gshmd from starting.")                                              \
  X(daemon, admin_group, STR, admin_group, "", 0, 255, NULL,                    \
    "Members of this group may use the admin verbs (revoke, unlink of other "   \
    "users' segments); empty means root only.")                                 \
  X(daemon, user, STR, user, "", 0, 255, NULL,                                  \
    "User (a name or a number) gshmd becomes once it is set up, started as "   \
    "root: it reads its configuration, the cluster key and the fd store, "     \
    "gives the stored segments' memory to this user, binds its sockets, then " \
    "takes this user's ids and groups and keeps no capability. gshmd.service " \
    "sets gshmd (its sysusers.d snippet makes the user). Why a user of its "   \
    "own: the fds the fd store keeps queued are counted by the kernel against " \
    "the user that queued them, and past a process's RLIMIT_NOFILE that "      \
    "user's processes may not pass fds (ETOOMANYREFS; docs/SECURITY.md). "     \
    "It must be a user no other process runs as (never nobody): every "        \
    "process of that user may trace gshmd and so reach every segment. "        \
    "Empty: gshmd stays the user it was started as. A user that does not "     \
    "exist, or a switch refused (no CAP_SETUID), is logged and gshmd stays "   \
    "as started, keeping every segment, but with no capability.")               \
  X(daemon, backend, ENUM, backend, "auto", 0, 0, "auto|host|cuda",             \
    "Memory backend: auto (cuda when libcuda.so.1 loads and a device is "       \
    "present, else host), host (sealed memfd segments only) or cuda.")          \
  X(daemon, sticky_start, ENUM, sticky_start, "serve", 0, 0, "serve|restart",  \
    "What gshmd does when the CUDA driver reports a sticky error while it "    \
    "starts (a GPU that stays broken: an uncorrectable ECC error awaiting a "   \
    "GPU reset, a GPU fallen off the bus). serve: it serves host segments, "   \
    "keeps every device segment parked in the fd store (listed, not opened), " \
    "refuses device creates (ENODEV), says why in STATUS=, gshmctl status and " \
    "the metrics, and probes the GPUs every gpu_probe_ms in a child process; " \
    "once they work, it exits with status 75 for systemd to restart it "       \
    "(Restart=on-failure), and the new gshmd adopts the device segments. "     \
    "restart: it serves nothing, waits 10 s and exits 75, again at each "      \
    "start until the GPU works (gshmd's way before this option: for a setup "   \
    "that would rather serve nothing than half). Without a service manager "    \
    "(no fd store) gshmd always serves.")                                       \
  X(daemon, gpu_probe_ms, U32, gpu_probe_ms, "10000", 100, 3600000, NULL,       \
    "Milliseconds between GPU probes while a sticky CUDA error at start keeps " \
    "the GPUs unusable (sticky_start = serve), or while a CUDA driver that "   \
    "did not start (cuInit failing, libcuda.so.1 missing; backend = auto) "    \
    "keeps device segments of the fd store parked. Each probe is a short-lived " \
    "child process that sets up every GPU as gshmd's start does; gshmd itself " \
    "makes no CUDA call after the error. Each success is a restart, none "     \
    "sooner than 10 s after gshmd's start: at most 3 in gshmd.service's "       \
    "StartLimitIntervalSec=30s, whatever the interval.")                        \
  X(daemon, log_level, LOGLEVEL, log_level, "6", 0, 7, NULL,                    \
    "Most verbose syslog priority that is logged, 0 (emerg) to 7 (debug); the " \
    "names emerg, alert, crit, err, warning, notice, info and debug are "       \
    "accepted too.")                                                            \
  X(daemon, legacy_ipc, BOOL, legacy_ipc, "false", 0, 0, NULL,                  \
    "Allow legacy cudaIpcMemHandle export of segments. Off by default: a "      \
    "legacy handle is a 64-byte bearer token that any process on the node "     \
    "could open, bypassing the permission checks.")                             \
  X(daemon, host_populate, BOOL, host_populate, "false", 0, 0, NULL,            \
    "Allocate every page of a host segment when it is created (fallocate), "   \
    "so that a create fails at once when memory is short. Off: host segments " \
    "are backed lazily, a page when it is first written, and a write into a "  \
    "segment the memory cannot hold takes SIGBUS. Either way a host segment "   \
    "larger than the machine's RAM + swap, or than gshmd's cgroup may use, "   \
    "is refused.")                                                              \
  X(daemon, host_recycle, SIZE, host_recycle, "0", 0, UINT64_MAX, NULL,        \
    "Bytes of freed host segment memory that gshmd keeps, mapped, for later "  \
    "pulls of exactly the same size as allocated (rounded to the page, or to " \
    "2 MiB as host_huge_pages says); 0 turns it off. Worth it "                \
    "for weight updates (RL, checkpoint engines): a node pulls the same "      \
    "model again and again with --replace, and a pull into memory gshmd "     \
    "already has mapped lands several times faster than into new memory "      \
    "(docs/CLUSTER.md). The cost: up to this many bytes stay gshmd's "         \
    "(counted in its cgroup, in no user's quota) after their segments are "    \
    "freed. Only memory of a pull of this gshmd that no other process can "    \
    "reach any more is kept (docs/SECURITY.md), and it goes back only to a "   \
    "pull by the one user that held it; a create never gets it.")              \
  X(daemon, host_huge_pages, BOOL, host_huge_pages, "true", 0, 0, NULL,        \
    "Ask for 2 MiB pages (MADV_HUGEPAGE) on gshmd's own mappings of host "    \
    "segments: where a pull's bytes land and what serves them. Where the "     \
    "kernel allows huge pages for shared memory (/sys/kernel/mm/"              \
    "transparent_hugepage/shmem_enabled is advise, within_size or always) a "  \
    "pull into a new host segment makes its pages several times faster "      \
    "(docs/CLUSTER.md); where it is never, most distributions' default, "     \
    "gshmd builds a pull's 2 MiB pages itself (MADV_COLLAPSE, Linux 6.5) "    \
    "before its bytes land (gshmd says which at start). Either way a pull of " \
    "2 MiB or more is made in whole 2 MiB pages (its size rounded up as a "    \
    "device segment's is to the granularity; the requested size stays). The " \
    "kernel may compact memory to find 2 MiB pages (for its own, as its "      \
    "transparent_hugepage/defrag says; for a collapse, whatever it says: one " \
    "that finds none stops the building for a second). "                     \
    "libgshm asks the same for clients' own mappings of host segments of 2 "   \
    "MiB and up, and maps them 2 MiB aligned.")                                 \
  X(daemon, poll_us, U32, poll_us, "30", 0, 1000, NULL,                        \
    "After answering a request, keep polling that connection for its next "    \
    "one for this many microseconds before sleeping: a client's open, map "    \
    "report and close come back to back, and each wake-up from sleep adds "    \
    "to their latency (docs/PERFORMANCE.md, Attach). It stops as soon as "     \
    "another connection or event waits. The default holds only where gshmd "   \
    "may run on at least 4 CPUs (else 0); a value set here applies on any "    \
    "machine. 0 turns it off.")                                                 \
                                                                                \
  X(limits, max_connections, U32, max_connections, "4096", 1, 1048576, NULL,    \
    "Most client connections at once (all users). The last "                    \
    "admin_connections of them are kept for root and the admin group.")        \
  X(limits, admin_connections, U32, admin_connections, "64", 0, 1048575, NULL,  \
    "Connections of max_connections that only root and members of "             \
    "daemon.admin_group may use, so that an admin can always connect (to look " \
    "or to revoke) when other users hold all the rest; at most a quarter of "  \
    "max_connections is kept.")                                                 \
  /* (its max is GSHM_WIRE_SEGMENTS_MAX, proto/wire.h: libgshm refuses a     \
   * peer's listing of more segments than a gshmd can hold) */                 \
  X(limits, max_segments, U32, max_segments, "65536", 1, 16777216, NULL,        \
    "Most segments at once (all users). Every segment survives a restart in "  \
    "systemd's fd store, in buckets of up to 253 (2 fds each); at most "        \
    "2084172 at max_name 255, beyond which LISTEN_FDNAMES could not be handed " \
    "back and gshmd refuses to start. RLIMIT_NOFILE must exceed it: the "       \
    "buckets' fds count as in flight.")                                         \
  X(limits, admin_segments, U32, admin_segments, "64", 0, 16777215, NULL,      \
    "Segments of max_segments that only root and members of "                   \
    "daemon.admin_group may create (or pull), so that an admin can still make " \
    "segments (a recovery's, a pull's) when other users hold all the rest; at " \
    "most a quarter of max_segments is kept.")                                  \
  X(limits, max_fds_per_connection, U32, max_fds_per_connection, "0", 0, 253,   \
    NULL,                                                                       \
    "File descriptors a client may send in one packet; a client that sends "   \
    "more is dropped and every fd it sent is closed.")                          \
  X(limits, max_packet, SIZE32, max_packet, "65536", 4096, 65536, NULL,         \
    "Largest request packet in bytes, at most 64K (the wire format's "        \
    "limit); larger packets are refused.")                                      \
  X(limits, max_name, U32, max_name, "255", 1, 4095, NULL,                      \
    "Longest segment name in bytes.")                                           \
  X(limits, max_inflight, U32, max_inflight, "16", 1, 65536, NULL,              \
    "Replies queued for a client that does not read them (gshmd reads "        \
    "nothing more from it meanwhile); past this it is dropped.  Events "       \
    "(unlinked, revoked) do not count: at most one per segment it holds.")    \
  X(limits, max_segment_size, SIZE, max_segment_size, "0", 0, UINT64_MAX, NULL, \
    "Largest segment a client may create, in bytes; 0 means no limit beyond "  \
    "the quotas and free memory.")         \
  X(limits, idle_timeout_ms, U32, idle_timeout_ms, "0", 0, UINT32_MAX, NULL,    \
    "Drop a connection that sends nothing for this many milliseconds; 0 "       \
    "never. Leases end with the connection.")                                   \
  X(limits, partial_timeout_ms, U32, partial_timeout_ms, "5000", 0, UINT32_MAX, \
    NULL,                                                                       \
    "Drop a client that has not finished the hello exchange, or a request in "  \
    "progress, within this many milliseconds; 0 never.")                        \
                                                                                \
  X(quota, host_bytes, SIZE, quota_host_bytes, "0", 0, UINT64_MAX, NULL,        \
    "Per-uid limit on the bytes of host (memfd) segments (root is exempt); 0 " \
    "means unlimited.")                                                         \
  X(quota, cuda_bytes, SIZE, quota_cuda_bytes, "0", 0, UINT64_MAX, NULL,        \
    "Per-uid limit on the bytes of device segments, all GPUs together (root "  \
    "is exempt); 0 means unlimited.  It counts segments until gshmd frees them: memory a "  \
    "client keeps alive after that through its own copy of a segment's fd "   \
    "(the driver cannot take it back) is not counted.")                        \
  X(quota, segments, U32, quota_segments, "0", 0, UINT32_MAX, NULL,             \
    "Per-uid limit on segments owned (root is exempt); 0 means unlimited.")     \
  X(quota, leases, U32, quota_leases, "65536", 0, UINT32_MAX, NULL,             \
    "Per-uid limit on open leases (root is exempt); 0 means unlimited. The "   \
    "default is far above what a workload holds and keeps one user from "     \
    "growing gshmd's memory without bound (about 150 bytes a lease, up to 1 " \
    "KiB with a mapping report naming 16 GPUs).")                              \
  X(quota, connections, U32, quota_connections, "1024", 0, UINT32_MAX, NULL,    \
    "Per-uid limit on client connections, counted from accept, before hello "   \
    "(root is exempt); 0 means unlimited. Checked before "                      \
    "limits.max_connections, so that one user cannot take every connection. "  \
    "Each fd a client sent that gshmd has not closed yet counts as one "       \
    "connection here and in limits.max_connections.")                          \
                                                                                \
  X(metrics, textfile, PATH, metrics_textfile, "", 0, 4095, NULL,               \
    "Write Prometheus text metrics to this file every interval_sec, replacing " \
    "it atomically (for node_exporter's textfile collector); empty turns it "   \
    "off. The unit's ProtectSystem=strict needs a ReadWritePaths= drop-in "     \
    "for the file's directory.")                                                \
  X(metrics, interval_sec, U32, metrics_interval_sec, "15", 1, 86400, NULL,     \
    "Seconds between two writes of the metrics textfile.")                     \
  X(metrics, http_listen, STR, metrics_http_listen, "", 0, 64, NULL,            \
    "Serve the metrics at http://ADDRESS:PORT/metrics (libmicrohttpd), e.g. "   \
    "127.0.0.1:9477; loopback addresses only; empty turns it off. Scrapes see " \
    "a snapshot at most one second old; each answer closes its connection. 64 " \
    "connections in all, 4 of one user (the owner of the client's socket, "     \
    "from the kernel's sock_diag), the last 8 kept for root and "               \
    "daemon.admin_group (a member by the user database: its primary group or "  \
    "getgrouplist); a user's further connections are closed at once "           \
    "(docs/SECURITY.md). The unit allows only AF_UNIX and a private network: "  \
    "a drop-in with RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 "          \
    "AF_NETLINK (without AF_NETLINK all clients share 4 connections), "         \
    "PrivateNetwork=no and IPAddressAllow=localhost is needed. It starts "     \
    "after gshmd becomes daemon.user, so a port below 1024 needs "              \
    "CAP_NET_BIND_SERVICE for that user; use a higher one.")                    \
                                                                                \
  X(cluster, listen, STR, cluster_listen, "", 0, 128, NULL,                     \
    "Serve peer nodes on ADDRESS:PORT (e.g. 10.0.0.5:7470), the cluster's "     \
    "one TCP port (its data lanes connect there too; metrics.http_listen, "    \
    "when set, is another, on loopback); empty turns the cluster off. Peers "  \
    "prove the cluster key there before anything else. See docs/CLUSTER.md.")  \
  X(cluster, node_name, STR, cluster_node_name, "", 0, 63, NULL,                \
    "This node's name as its peers know it (their cluster.peers); empty: the "  \
    "host name.")                                                               \
  X(cluster, peers, STR, cluster_peers, "", 0, GSHMD_CONFIG_LIST_MAX, NULL,     \
    "The peer nodes, NAME=ADDRESS:PORT separated by blanks or commas. Only "    \
    "these may connect, and only these can be pulled from. At most 16383 "      \
    "bytes, continued lines joined (about 550 peers).")                        \
  X(cluster, export, STR, cluster_export, "", 0, GSHMD_CONFIG_LIST_MAX, NULL,   \
    "What peers may list and read, rules separated by blanks: PATTERN "        \
    "(fnmatch; '*' also matches '/') exports matching segments of root and "    \
    "of the user that started gshmd that others may read (mode o+r); "         \
    "PATTERN:USER those of USER that others may read; PATTERN:@GROUP those "    \
    "of group GROUP that the "                                                  \
    "group may read (g+r). Empty exports nothing. At most 16383 bytes, "        \
    "continued lines joined.")                                                  \
  X(cluster, secret_file, PATH, cluster_secret_file, "", 0, 4095, NULL,         \
    "File with the key every node of the cluster shares (at least 16 bytes, "   \
    "at most 4096; e.g. head -c 32 /dev/urandom | base64). It must be owned "   \
    "by gshmd's user and readable by nobody else. Required when listen is "     \
    "set.")                                                                     \
  X(cluster, pull_group, STR, cluster_pull_group, "", 0, 255, NULL,             \
    "Members of this group (and admins) may list and pull peers' segments; "  \
    "empty means admins only.")                                                 \
  X(cluster, encrypt, BOOL, cluster_encrypt, "false", 0, 0, NULL,              \
    "Encrypt the bytes between nodes (AES-256-GCM, or ChaCha20-Poly1305 where " \
    "a CPU lacks AES-NI); every frame is authenticated either way. Either "     \
    "side asking for it is enough.")                                          \
  X(cluster, mac, ENUM, cluster_mac, "auto", 0, 0, "auto|poly1305",            \
    "How the bytes between nodes are authenticated when they are not "         \
    "encrypted: auto with AES-GMAC where both nodes' CPUs have AES-NI and "    \
    "PCLMULQDQ, else Poly1305; poly1305 always. One core tags 4 MiB frames "   \
    "with AES-GMAC at 3.2-3.4x the rate of Poly1305 on the lent 16-core H200 " \
    "machine with gshm's GHASH, 1.9-2.1x with OpenSSL 3.0's, which CPUs "      \
    "without AVX-512 and VPCLMULQDQ use (docs/PERFORMANCE.md, Lane threads "   \
    "tag as they copy).")                                                       \
  X(cluster, transport, ENUM, cluster_transport, "auto", 0, 0, "auto|tcp|ucx",   \
    "How the bytes move between two nodes (the hello decides, on the "         \
    "cluster port): auto over UCX where an endpoint with peer failure "         \
    "detection reaches the other node (RDMA) and encryption is off, else over " \
    "gshm's TCP stream; tcp always over the stream; ucx also over UCX "         \
    "transports that cannot detect a dead peer (shared memory in UCX 1.13), "   \
    "eagerly (for tests and trials).")                                        \
  X(cluster, min_protocol, ENUM, cluster_min_protocol, "2.0", 0, 0, "2.0|2.6",  \
    "The oldest cluster protocol a peer may speak, both when it connects and " \
    "when this node connects to it. 2.0: any (nodes of older gshmd link as "   \
    "before). 2.6: a peer must offer the cluster key's subkeys (CAP_SUBKEYS), " \
    "so that the key itself keys no MAC and no link; an older peer is "         \
    "refused before any MAC is sent or checked (refusals cause version, "      \
    "logged with its name). Set it on every node once every node runs a "     \
    "gshmd of protocol 2.6 (docs/CLUSTER.md).")                               \
  X(cluster, pull_chunk, SIZE, cluster_pull_chunk, "4M", 4096, 67108864,        \
    NULL, "Bytes per read request (and per staging slot) of a pull.")         \
  X(cluster, pull_depth, U32, cluster_pull_depth, "32", 1, 256, NULL,           \
    "Read requests (or staged chunks) in flight per pull (and at most 48 to "  \
    "one peer over all pulls).")                                               \
  X(cluster, streams, U32, cluster_streams, "8", 1, 16, NULL,                   \
    "TCP connections that carry the bytes this node pulls from one peer, each " \
    "moved by a thread of its own on both nodes (1: the link's own "           \
    "connection, on gshmd's event loop). Not used where the bytes go over UCX.") \
  X(cluster, prefault, ENUM, cluster_prefault, "auto", 0, 0, "auto|always|off", \
    "Fault a pull's new host memory in on gshmd's thread pool ahead of the "   \
    "chunks that will land in it, so that the threads receiving them do not "  \
    "wait for the kernel to allocate and zero its pages: uses otherwise idle " \
    "CPUs (a 1 GiB pull 13-17% faster on a 16-core machine). auto where "      \
    "pulls get 2 MiB pages (with 4 KiB pages the kernel's page cache, one "    \
    "lock per segment, bounds both alike and it only costs CPU); always "      \
    "also with 4 KiB pages; off: never. Either way only on CPUs the data "     \
    "lanes at work leave free (gshmd's CPU affinity less those lanes).")      \
  X(cluster, memory_check, BOOL, cluster_memory_check, "true", 0, 0, NULL,     \
    "Refuse a pull whose new host segments do not fit in the machine's "      \
    "memory (MemAvailable + SwapFree, or what gshmd's cgroup leaves) with "   \
    "what the pulls in flight still owe: -ENOMEM before a byte moves, "       \
    "instead of an OOM kill midway. false: no check (where MemAvailable "     \
    "misses memory the kernel would free, such as a ZFS ARC).")              \
  X(cluster, staging_bytes, SIZE, cluster_staging_bytes, "128M", 1048576,        \
    68719476736, NULL,                                                          \
    "The most pinned host memory that one staged device segment's pull holds " \
    "on each side (served and pulled), in pull_chunk slots: a smaller segment " \
    "holds the slots it takes, rounded up to a power of two. A serving node's " \
    "staged grants hold at most four times this per link.")                   \
  X(cluster, staging_arena, SIZE, cluster_staging_arena, "1G", 0, 68719476736,   \
    NULL,                                                                       \
    "Pinned host memory made once, in the background, when the cluster "       \
    "starts on a node with GPUs (or with staging = always: plain memory), "    \
    "from which the staging slots of pulls into and out of GPUs are carved: "  \
    "a node's first pull of a model into a GPU then pins nothing (pinning "    \
    "costs 0.12-0.33 ms per MiB). Slots past it are made as they are needed. " \
    "Held until gshmd stops; 0: none.")                                       \
  X(cluster, staging, ENUM, cluster_staging, "auto", 0, 0, "auto|always",       \
    "How this node serves segments to peers: auto registers host segments "     \
    "(and device segments where UCX supports CUDA memory) and stages device "   \
    "segments otherwise; always copies every segment through pinned host "     \
    "slots (for NICs that cannot reach the memory, and for tests).")            \
  X(cluster, request_timeout_ms, U32, cluster_request_timeout_ms, "60000", 1000, \
    3600000, NULL,                                                              \
    "A request to a peer whose answer has not begun this many milliseconds "   \
    "after every older one's did fails its pull (-ETIMEDOUT), however busy "   \
    "the link is otherwise; so does a data lane stopped this long midway "     \
    "through a frame, or not read, and a receive over UCX begun and not "     \
    "ended (the memory it writes stays until UCX ends it). A read of a "      \
    "segment this node is still pulling waits here at most half of it, then " \
    "is answered busy and asked "                                             \
    "again: give every node the same value.")

#endif
