/* SPDX-License-Identifier: Apache-2.0 */
/* gshm.h: the libgshm client API (v1).
 *
 * gshm shares GPU and host memory between the processes of one node by
 * name, with owners and permissions, through file descriptors: a daemon
 * (gshmd) owns each segment; a client opens it by name and gets a lease and
 * a file descriptor that it maps.
 *
 * Conventions, for every function below:
 *  - Returns 0 (or a non-negative count) on success, a negative errno on
 *    failure; gshm_strerror() names it.  Output arguments (`*_out`) are
 *    written only on success.
 *  - Every call that talks to the daemon may also return -ECONNRESET or
 *    -EPIPE (the daemon went away and could not be reached again within
 *    $GSHM_RECONNECT_MS, default 10000 ms: gshm_last_error() says
 *    "connection to gshmd lost"; also when what came back at its socket
 *    did not answer the hello in time or refused this uid, logged at
 *    GSHM_LOG_LEVEL>=4), -EPROTONOSUPPORT (a gshmd of another major
 *    version came back), -EPROTO (the daemon broke the protocol),
 *    -EREMOTEIO (the daemon failed in a way that has no errno of the API:
 *    gshm_last_error() says how), -ENOMEM, and -ECHILD in a process forked
 *    from the one that connected (gshm_connect, "Fork").  The daemon's own
 *    explanation of the last failure is in gshm_last_error().
 *  - A gshm_client_t may be used from several threads: requests are
 *    serialised by a mutex inside it, for their whole time: a gshm_pull or
 *    gshm_pull_prefix (seconds to minutes) holds every other request of
 *    its client, a PyTorch pool's growth too (gshm_torch_malloc): pull on a
 *    client of its own.  A gshm_segment_t belongs to one
 *    client and must not be used after gshm_close() or
 *    gshm_disconnect().
 *  - The library prints nothing unless $GSHM_LOG_LEVEL is set (0..7,
 *    syslog priorities; messages go to stderr; another value logs nothing
 *    but one line that says so).  In a setuid or setgid
 *    program (AT_SECURE) the library ignores $GSHM_SOCKET,
 *    $GSHM_LOG_LEVEL, $GSHM_RECONNECT_MS, $GSHM_HELLO_TIMEOUT_MS,
 *    $GSHM_POLL_US and $GSHM_LIST_MAX (secure_getenv(3)).
 *  - $GSHM_RECONNECT_MS (0: no reconnect) and $GSHM_HELLO_TIMEOUT_MS (0:
 *    the hello waits for ever), read at connect, take decimal digits
 *    alone, 0..86400000 (a day); any other value (a sign, junk, more) is
 *    ignored for the default, said once at GSHM_LOG_LEVEL>=4.
 *  - $GSHM_LIST_MAX (1..16777216, read at connect) lowers the most
 *    segments gshm_list_remote takes from one peer (16777216: the most a
 *    gshmd can hold, its limits.max_segments at most).
 *  - A request polls its socket for the reply for up to $GSHM_POLL_US
 *    microseconds (0..1000; default 30 where the process may run on 4 or
 *    more CPUs (its affinity mask), else 0) before it sleeps: shorter
 *    round trips for a little CPU.  gshmd's own side is daemon.poll_us.
 *  - $GSHM_LIST_MAX and $GSHM_POLL_US, like $GSHM_RECONNECT_MS, take
 *    decimal digits alone within their range; another value is the
 *    default, said once at GSHM_LOG_LEVEL>=4.
 *  - CUDA is loaded with dlopen only when a device segment is mapped or a
 *    copy is asked for: host-only programs need no CUDA installation.
 */
#ifndef GSHM_H
#define GSHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GSHM_BUILDING_LIBRARY)
#define GSHM_EXTERN __attribute__((visibility("default")))
#else
#define GSHM_EXTERN
#endif

#define GSHM_VERSION_MAJOR 0
#define GSHM_VERSION_MINOR 1

#define GSHM_NAME_MAX 255         /* bytes in a segment name, excluding NUL */
#define GSHM_LOCATION_MAX 64      /* bytes in a location string, including NUL */
#define GSHM_DEFAULT_SOCKET "/run/gshm/gshmd.sock"
#define GSHM_LEGACY_IPC_HANDLE_SIZE 64
#define GSHM_SOURCE_MAX 384       /* bytes in gshm_segment_info_t.source, including NUL */

typedef struct gshm_client gshm_client_t;
typedef struct gshm_segment gshm_segment_t;

typedef enum gshm_access {
  GSHM_ACCESS_READ = 1,       /* map read-only */
  GSHM_ACCESS_READ_WRITE = 2, /* map read-write */
} gshm_access_t;

/* Flags for gshm_create(). */
#define GSHM_CREATE_LEGACY_IPC 0x1u /* also exportable as a cudaIpcMemHandle (see gshm_open_legacy_ipc) */
/* Hidden until gshm_publish(): the segment is allocated, charged to the
 * caller's quotas and opened read-write by it, but has no name anyone
 * sees (others cannot open, stat or list it; the name may be taken by
 * another segment meanwhile).  It ends, freed, when its creator closes it
 * or disconnects or gshmd restarts (stopped or killed) before the publish;
 * a restart leaves the creator's mapping and the bytes written there (the
 * publish then fails -ESTALE: copy them into a new hidden segment to
 * publish them).  For replacing a
 * segment in place: fill the hidden one, then publish it with
 * GSHM_PUBLISH_REPLACE, and readers find the old or the new one, never
 * none. */
#define GSHM_CREATE_HIDDEN 0x2u

/* What the daemon knows of a segment. */
typedef struct gshm_segment_info {
  uint64_t id;                     /* unique per daemon, never reused */
  uint64_t generation;             /* bumps each time a name is created again */
  char name[GSHM_NAME_MAX + 1];
  uint64_t size;                   /* bytes allocated: requested rounded up to granularity */
  uint64_t requested_size;         /* bytes asked for at create */
  uint64_t granularity;            /* allocation granularity, bytes */
  char location[GSHM_LOCATION_MAX]; /* "host" or "cuda:GPU-<uuid>" */
  int device_index;                /* the daemon's GPU index; -1 for host */
  uint32_t uid, gid;               /* owner */
  uint32_t mode;                   /* permission bits, e.g. 0640 */
  uint32_t flags;                  /* GSHM_CREATE_* (never GSHM_CREATE_HIDDEN) */
  int unlinked;                    /* 1: name removed, memory kept until the last lease ends */
  uint32_t leases;                 /* leases held now, all clients */
  int64_t created_ns;              /* CLOCK_REALTIME, nanoseconds */
  char source[GSHM_SOURCE_MAX];    /* pulled from a peer node: "NODE:NAME#ID.GENERATION"
                                      of the node it came from first (a copy of a copy
                                      keeps the first node's); else "" */
} gshm_segment_info_t;

/* One lease: one client connection's open of one segment. */
typedef struct gshm_lease_info {
  uint64_t lease_id;
  uint64_t segment_id;
  char segment_name[GSHM_NAME_MAX + 1];
  char location[GSHM_LOCATION_MAX];
  uint64_t session_id;             /* the client connection's id */
  int32_t pid;
  uint32_t uid;
  char client_name[64];
  gshm_access_t access;
  int64_t since_ns;                /* CLOCK_REALTIME */
  int mapped;                      /* the client reported a mapping */
  char mapped_devices[248];        /* NUL-terminated, comma-separated GPU UUIDs the
                                      client reported it mapped on (its last
                                      report, of up to 64), the first ones that
                                      fit whole, of those gshmd lists (8 a lease,
                                      GSHMD_LEASE_DEVICES in daemon/server.h):
                                      6 of libgshm's 40-byte "GPU-<uuid>"s;
                                      "" for CPU or before a report */
  /* (these two took the last 8 bytes of mapped_devices, once 256: the
   * struct's size and its other fields' offsets are as they were) */
  uint32_t mapped_devices_listed;  /* UUIDs in mapped_devices, 0..8 */
  uint32_t mapped_devices_total;   /* GPUs of the client's report, in all (0..64,
                                      GSHM_WIRE_MAP_DEVICES_MAX): more than listed
                                      when the report named more than 8 or some
                                      did not fit (an 8-GPU node's 8); from a
                                      gshmd that predates it, the UUIDs it listed */
} gshm_lease_info_t;

/* One client connection. */
typedef struct gshm_client_info {
  uint64_t session_id;
  int32_t pid;
  uint32_t uid, gid;
  char name[64];
  int64_t since_ns;                /* CLOCK_REALTIME */
  uint32_t leases;
} gshm_client_info_t;

/* The daemon as a whole. */
typedef struct gshm_status_info {
  char version[32];
  int32_t pid;
  int64_t started_ns;              /* CLOCK_REALTIME */
  uint32_t clients, segments, leases, devices;
  uint64_t bytes;                  /* allocated by all live and unlinked segments and
                                      by hidden ones: pulls in progress and
                                      GSHM_CREATE_HIDDEN creates not yet published */
  char backends[64];               /* comma-separated: "host", "host,cuda" */
  /* "" normally.  Set while the GPUs are unusable to gshmd (a sticky CUDA
   * error at its start, e.g. "0000:18:00.0: CUDA_ERROR_ECC_UNCORRECTABLE";
   * or a CUDA driver that did not start with it while it held device
   * segments, "no driver: " and why, e.g. "no driver: cuInit failed: no
   * NVIDIA GPU, or its driver is not loaded"): it serves host segments,
   * device segments are listed but not opened and device creates fail
   * -ENODEV until it restarts (by itself, once the GPUs work). */
  char gpu_fault[96];
} gshm_status_info_t;

#define GSHM_MAX_PEERS 16

/* Peer-to-peer reachability from one GPU to another (daemon's indexes). */
typedef struct gshm_peer_info {
  int index;                       /* the peer GPU */
  int access;                      /* 1: peer access supported (CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED;
                                      gshmd tries to enable it, logging a failure) */
  int native_atomics;              /* 1: native atomics over the link */
  int performance_rank;            /* driver's relative rank, lower is better */
  int nvlinks;                     /* NVLink links between the two; -1 unknown (no NVML) */
} gshm_peer_info_t;

/* One GPU as gshmd enumerated it. */
typedef struct gshm_device_info {
  int index;                       /* the daemon's index: location "cuda:N" */
  char uuid[48];                   /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
  char pci_bus_id[32];
  char name[96];
  uint64_t total_memory, free_memory; /* bytes */
  uint64_t granularity;            /* minimum allocation granularity, bytes */
  int cc_major, cc_minor;          /* compute capability */
  int npeers;                      /* entries in peers[] */
  gshm_peer_info_t peers[GSHM_MAX_PEERS];
} gshm_device_info_t;

/* Connects to gshmd and says hello.
 *  path         socket path; NULL means $GSHM_SOCKET (not in a setuid or
 *               setgid program), else GSHM_DEFAULT_SOCKET.
 *  client_name  shown by `gshmctl clients` (truncated to 63 bytes); NULL: the
 *               program's name.
 *  client_out   receives the client; free it with gshm_disconnect().
 * Errors: -EINVAL client_out NULL; -ENOMEM; -ENOENT / -ECONNREFUSED no
 * daemon at path (gshmctl exit 3); another errno of socket(2) or
 * connect(2) (-EMFILE; a path through a file that is no directory, ...);
 * -EPIPE / -ECONNRESET gshmd closed the connection before its hello
 * reply: it was at limits.max_connections (less
 * limits.admin_connections for a user who is not an admin) or this
 * uid at quota.connections (gshmd logs "connection refused"); -EPROTO an
 * answer that is not a gshm hello reply;
 * -EACCES the socket's mode refuses us; -EPROTOTYPE path is a stream or
 * datagram socket (another program's, not gshmd's); -EPROTONOSUPPORT the daemon speaks
 * another major protocol version (gshm_last_error() cannot help here: the
 * message is logged at GSHM_LOG_LEVEL>=3); -ENAMETOOLONG path too long;
 * -ETIMEDOUT nothing answered the hello within $GSHM_HELLO_TIMEOUT_MS
 * milliseconds (default 30000; 0 waits for ever): a gshmd stopped
 * (SIGSTOP, a debugger) or stuck, or another program's socket that
 * accepts and never answers.  (A hello to systemd's socket while gshmd
 * starts waits for its start, the CUDA driver's initialisation of every
 * GPU included: the default leaves it room.)  The same bound holds for the hello of each
 * reconnect (within $GSHM_RECONNECT_MS); no other request is bounded.
 * Fork: a client belongs to the process that connected it.  In a child
 * made by fork() every call of this client that would talk to gshmd
 * (every request, gshm_open, gshm_stat_name, ...) returns -ECHILD
 * (gshm_last_error says so), since the socket and the leases are the
 * parent's; gshm_close() and gshm_disconnect() there free only the
 * child's copies and never end the parent's leases.  When another thread
 * of the parent was inside a call of this client at the fork, the child
 * never waits for it: every call returns -ECHILD at once (gshm_unmap
 * too), and gshm_close() and gshm_disconnect() leave the child's copies
 * as they are (what that call was changing may be half-changed there).
 * A child connects a client of its own. */
GSHM_EXTERN int gshm_connect(const char *path, const char *client_name,
                             gshm_client_t **client_out);

/* Why gshm_connect() failed and what the user can do about it, as one line
 * of text for a person (gshmctl and the Python package print it after
 * "cannot reach gshmd at PATH: "): no socket there or nothing listening on
 * it (start gshmd, or give its socket's path), a file that is not a socket
 * or a socket of another type (-EPROTOTYPE: not gshmd's),
 * a directory above the socket that refuses this uid, the socket's owner,
 * group and mode where they refuse this uid (and how an admin widens them),
 * a path too long for a Unix socket's address (-ENAMETOOLONG),
 * nothing answering the hello in time (-ETIMEDOUT), or gshmd closing
 * the connection before its answer (-EPIPE, -ECONNRESET: at its
 * connection limits, which the text names, or stopped meanwhile).
 * Any other error: gshm_strerror(err).  Looks at the socket with stat(2);
 * sends nothing to gshmd.
 *  socket_path  the path given to gshm_connect(); NULL or "" resolves as
 *               there ($GSHM_SOCKET, else GSHM_DEFAULT_SOCKET).
 *  err          what gshm_connect() returned (a negative errno).
 *  buf, cap     caller's buffer of cap bytes (512 holds every text but one
 *               that quotes a long socket_path); always NUL-terminated,
 *               "" on -EINVAL.
 * Returns 0; -EINVAL buf is NULL, cap is 0 or err >= 0; -ENOBUFS the text
 * did not fit (buf holds its first cap - 1 bytes). */
GSHM_EXTERN int gshm_connect_explain(const char *socket_path, int err, char *buf, size_t cap);

/* Closes every segment still open on this client (unmapping it), ends the
 * connection (the daemon ends its leases) and frees the client.
 * Accepts NULL. */
GSHM_EXTERN void gshm_disconnect(gshm_client_t *client);

/* Creates a named segment and opens it read-write.
 *  name      1..GSHM_NAME_MAX bytes; '/'-separated components, none empty,
 *            "." or "..", no control characters.  A name that breaks these
 *            rules (a "bad name") is -EINVAL for every call that takes a
 *            name (gshm_open, gshm_stat_name, gshm_unlink, gshm_chmod,
 *            gshm_chown, gshm_revoke), as no segment can hold it; -ENOENT
 *            is a good name that no segment holds.
 *  size      bytes, > 0; rounded up to the location's granularity (page size
 *            for host, the driver's minimum granularity for a GPU).
 *  location  "host", "cuda:N" (daemon's device index) or "cuda:GPU-<uuid>";
 *            NULL means "host".
 *  mode      permission bits (0600, 0640, ...); 0 means 0600.
 *  flags     GSHM_CREATE_* bits.  GSHM_CREATE_HIDDEN: a hidden segment,
 *            named only by gshm_publish() (the name's -EEXIST comes then);
 *            its gshm_segment_info() has id and generation 0 until then.
 *  seg_out   receives the open segment (a lease); release with gshm_close().
 * Errors: -EEXIST name in use; -EINVAL a NULL client, name or seg_out,
 * bad name, size 0, bad location, mode outside 0777 or unknown flags;
 * -ENAMETOOLONG name over GSHM_NAME_MAX; -ENODEV no such GPU, or (a
 * device location) the
 * daemon's GPUs are unusable until it restarts: a sticky CUDA error at its
 * start, or no CUDA driver at its start while it held device segments
 * (gshm_status_info_t.gpu_fault), or this create, sent again after a
 * daemon restart lost its reply, made a device segment the daemon now
 * keeps parked (gshm_open reaches it once its GPU serves again);
 * -ENOTSUP backend not available
 * on this daemon (e.g. no GPU driver) or legacy IPC disabled, or
 * GSHM_CREATE_HIDDEN asked of a gshmd too old for it; -ENOMEM the
 * backend could not allocate; -EDQUOT a per-user quota would be crossed;
 * -EFBIG over the daemon's segment size limit (limits.max_segment_size), or
 * a host segment larger than the machine's memory (RAM + swap) or than
 * gshmd's cgroup may use; -EMFILE a limit on segments
 * or leases, or the daemon cannot pass an fd now (its fds in flight are
 * at its RLIMIT_NOFILE; nothing was created: try again); -EIO the
 * backend (the GPU driver) failed otherwise (gshm_last_error() says so);
 * and the errors every call to the daemon may give.
 * A create whose reply a gshmd restart lost is sent again once libgshm
 * has reconnected, with the same random token: gshmd answers it with the
 * segment the first one made (not -EEXIST; docs/ARCHITECTURE.md). */
GSHM_EXTERN int gshm_create(gshm_client_t *client, const char *name, uint64_t size,
                            const char *location, uint32_t mode, uint32_t flags,
                            gshm_segment_t **seg_out);

/* Opens an existing segment by name: the daemon checks permission against
 * our uid/gid (SO_PEERCRED) and records a lease for this connection.  A
 * name this client already holds (same access, not unlinked or revoked
 * since) shares that lease without asking the daemon (the lease cache,
 * docs/ARCHITECTURE.md): no permission check then (the lease is kept as
 * granted), and gshm_segment_info() gives that lease's record, from before
 * any chmod or chown since; gshm_stat() asks the daemon.
 *  access    GSHM_ACCESS_READ or GSHM_ACCESS_READ_WRITE.
 *  seg_out   receives the open segment; release with gshm_close().
 * Errors: -ENOENT no such name; -EACCES mode bits refuse this access;
 * -EINVAL a NULL argument, bad access or bad name (gshm_create);
 * -ENAMETOOLONG name over
 * GSHM_NAME_MAX; -ENOTSUP a legacy-IPC-only segment (use
 * gshm_open_legacy_ipc); -ENODEV a device segment the daemon keeps parked
 * while its GPUs are unusable to it (gshm_status_info_t.gpu_fault; listed,
 * not opened, until it restarts); -EDQUOT / -EMFILE lease limits; -EMFILE
 * also when the daemon cannot pass an fd now (as gshm_create); -EIO the
 * daemon could not export the segment's fd (its driver failed:
 * gshm_last_error() says so); and the errors every call to the daemon
 * may give. */
GSHM_EXTERN int gshm_open(gshm_client_t *client, const char *name, gshm_access_t access,
                          gshm_segment_t **seg_out);

/* Unmaps the segment if mapped, ends the lease and frees *seg.  The memory
 * stays with the daemon until the segment is unlinked and its last lease
 * ends.  Accepts NULL (returns 0).  Returns 0 even when the daemon is gone
 * (the lease ended with the connection); -EBUSY never. */
GSHM_EXTERN int gshm_close(gshm_segment_t *seg);

/* Flags for gshm_publish(). */
#define GSHM_PUBLISH_REPLACE 0x1u /* take the name from the segment that holds it */

/* Gives a hidden segment (gshm_create with GSHM_CREATE_HIDDEN) its name,
 * in one step of gshmd: from then on gshm_open() of the name finds it, and
 * no open, stat or listing ever sees the name missing between the old
 * segment and this one.  With GSHM_PUBLISH_REPLACE the segment that held
 * the name is unlinked in the same step (as by gshm_unlink: its holders
 * keep their mappings and are told); gshmd's fd store records both
 * changes as one, so after a crash the name holds the old segment or the
 * new one, never neither.  seg stays open, read-write, now on the live
 * segment: gshm_segment_info() gives its id and generation.
 *  seg    a segment of gshm_create(..., GSHM_CREATE_HIDDEN, ...), not yet
 *         published.
 *  flags  0 or GSHM_PUBLISH_REPLACE.
 * Errors: -EEXIST a segment holds the name and flags lacks
 * GSHM_PUBLISH_REPLACE; -EACCES that segment is not the caller's to
 * unlink (not its owner nor an admin: gshm_unlink's rule), and it stays;
 * on either seg stays hidden and may be published again; -EINVAL NULL
 * seg, unknown flags, or seg not hidden (published already, or not made
 * hidden); -ESTALE the hidden segment is gone: gshmd restarted since the
 * create and before the publish was stored (hidden segments do not
 * survive a restart; nothing was published); -ENOMEM; and the errors
 * every call to the daemon may give.  A publish whose reply a gshmd
 * restart lost is sent again with the same random token: when the first
 * one was stored, gshmd answers with the segment it published (0, seg on
 * that segment with a new lease, as above) and publishes nothing again;
 * when it was not, -ESTALE.  Without gshmd's fd store (no service
 * manager) there is no record of the first one: -ESTALE either way, and
 * gshm_stat_name() tells whether it took effect. */
GSHM_EXTERN int gshm_publish(gshm_segment_t *seg, uint32_t flags);

/* Removes a segment's name.  Existing leases keep the memory until they
 * end; the name can be created again at once (new id and generation).
 * Errors: -ENOENT; -EACCES not the owner (nor an admin); -EINVAL NULL
 * argument or bad name (gshm_create); -ENAMETOOLONG name over
 * GSHM_NAME_MAX.  An unlink whose reply
 * a gshmd restart lost is sent again once libgshm has reconnected, with
 * the same random token, which gshmd noted with the segment it unlinked:
 * the resend then returns 0 and never unlinks a segment that took the
 * name since.  Without that note (no service manager's fd store, or a
 * name that was not there) its -ENOENT then gives 0: the name is gone,
 * but this call may not be what removed it (the first attempt may have
 * met -ENOENT too, or never been read by the gshmd that died). */
GSHM_EXTERN int gshm_unlink(gshm_client_t *client, const char *name);

/* Changes a segment's permission bits (like chmod(2)); leases already
 * granted keep their access.  Owner or admin only.
 * Errors: -ENOENT; -EACCES not the owner nor an admin; -EINVAL a NULL
 * argument, a bad name (gshm_create), or bits outside 0777; -ENAMETOOLONG
 * name over GSHM_NAME_MAX; and the errors every call to the daemon may
 * give. */
GSHM_EXTERN int gshm_chmod(gshm_client_t *client, const char *name, uint32_t mode);

/* Changes a segment's owner and/or group (like chown(2)); pass
 * (uint32_t)-1 to keep one.  Only an admin (root or gshmd's admin group)
 * gives a segment to another user, and per-user quotas move with it; the
 * owner may set a group it belongs to.
 * Errors: -ENOENT; -EACCES not the owner nor an admin; -EPERM the change
 * needs an admin (another owner), or gid is a group the caller is not in;
 * -EINVAL a NULL argument or bad name (gshm_create); -ENAMETOOLONG name
 * over GSHM_NAME_MAX;
 * -ENOMEM; and the errors every call to the daemon may give. */
GSHM_EXTERN int gshm_chown(gshm_client_t *client, const char *name, uint32_t uid, uint32_t gid);

/* Admin only: ends every lease of the segment and unlinks it.  A host
 * segment's pages are punched out at once (its holders' mappings read
 * zeros); a device segment's memory is freed once the holders' own fds and
 * mappings go (the driver cannot take back what a process has mapped),
 * except a legacy-IPC one's (GSHM_CREATE_LEGACY_IPC: cuMemAlloc'ed, no fd
 * keeps it), freed at the revoke: its importers must have closed it
 * first (cuIpcCloseMemHandle; CUDA leaves a free before that undefined).
 * Holders get -ESTALE from their next call on that segment (gshm_stat,
 * gshm_map, gshm_read, gshm_write), also when the revoke happened while
 * the daemon restarted.
 * A revoke whose reply a gshmd restart lost is sent again once libgshm
 * has reconnected, with the same random token, which gshmd noted with
 * the segment it revoked (in the fd store's journal, before the revoke):
 * the resend then returns 0, as the first would have, and acts on that
 * segment only, never on one that took the name meanwhile.  Without that
 * note (gshmd runs without a service manager's fd store, or 64 later
 * revokes and pulls came before the resend) the resend says what it
 * meets: -ENOENT for a segment the first one revoked.
 * Errors: -ENOENT (also to a non-admin, for a name no segment holds);
 * -EPERM not an admin; -EINVAL a NULL argument or bad name (gshm_create;
 * also to a non-admin); -ENAMETOOLONG name over GSHM_NAME_MAX; and the errors every call to the daemon may give. */
GSHM_EXTERN int gshm_revoke(gshm_client_t *client, const char *name);

/* gshm_revoke of the segment of id segment_id (gshm_segment_info_t.id, as
 * gshm_list shows it), in any state: an unlinked segment has no name, and
 * its holders keep its memory for as long as they hold their leases;
 * this is how an admin takes it back.  A resend after a gshmd restart
 * is answered as gshm_revoke's (0 for the segment the first one revoked;
 * without gshmd's note, -ESTALE).
 * Errors: -ESTALE no segment has that id (also 0); -EPERM not an admin
 * (asked before the id is looked up); -EINVAL a NULL client; and the
 * errors every call to the daemon may give. */
GSHM_EXTERN int gshm_revoke_id(gshm_client_t *client, uint64_t segment_id);

/* Fresh information about an open segment (lease count, unlinked state)
 * from the daemon.  After a daemon restart libgshm re-takes this
 * process's leases on its next call, each with the access it was granted
 * (a lease is kept whatever chmod, chown or unlink happened meanwhile).
 * Errors: -ESTALE the segment was revoked (also while the daemon was
 * down), or it was unlinked and this process did not call gshmd for 30 s
 * after a restart, so the lease was not re-taken (the mapping keeps its
 * bytes); -EACCES its owner changed the mode since we opened it and we may
 * no longer see it; -EINVAL seg or info_out NULL; -EPROTO a reply of
 * another kind; and the errors every call to the daemon may give.  A
 * hidden segment (GSHM_CREATE_HIDDEN, not yet published) is not asked
 * about: its create's record. */
GSHM_EXTERN int gshm_stat(gshm_segment_t *seg, gshm_segment_info_t *info_out);

/* Information about a segment by name, without opening it.
 * Errors: -ENOENT; -EACCES (no read permission); -EINVAL a NULL argument
 * or bad name (gshm_create); -ENAMETOOLONG name over GSHM_NAME_MAX; -EPROTO a reply of another kind;
 * and the errors every call to the daemon may give. */
GSHM_EXTERN int gshm_stat_name(gshm_client_t *client, const char *name,
                               gshm_segment_info_t *info_out);

/* The information this process got when it opened seg (no daemon round
 * trip): name, id, generation, size, location; for a seg on a cached lease
 * (gshm_open), the record of the open that took the lease, whose mode, uid
 * and gid may be older than a chmod or chown (gshm_stat() asks the daemon).
 * Never fails for a valid seg. */
GSHM_EXTERN const gshm_segment_info_t *gshm_segment_info(const gshm_segment_t *seg);

/* The segment's file descriptor (a sealed memfd for host segments, a cuMem
 * POSIX fd for device segments).  Borrowed: it stays the library's and is
 * closed by gshm_close(); dup() it to keep it.  -EBADF if none.  A host
 * segment's fd shares its open file description (and so its file offset)
 * with other holders', other users' too: map it, or use pread/pwrite,
 * never read/write/lseek. */
GSHM_EXTERN int gshm_segment_fd(const gshm_segment_t *seg);

/* The access this segment was opened with. */
GSHM_EXTERN gshm_access_t gshm_segment_access(const gshm_segment_t *seg);

/* Lists every segment this client may see, in id order, paging through the
 * daemon as needed.  *infos_out is one malloc'ed array of *count_out
 * entries (NULL when 0); free it with gshm_free().
 * Errors (this one and the gshm_list_* below): -EINVAL a NULL argument;
 * -ENOMEM; -EPROTO a reply of another kind, or a page cursor that does not
 * advance; and the errors every call to the daemon may give (above). */
GSHM_EXTERN int gshm_list(gshm_client_t *client, gshm_segment_info_t **infos_out,
                          size_t *count_out);

/* Lists every lease (one row per client per open segment), as gshm_list. */
GSHM_EXTERN int gshm_list_leases(gshm_client_t *client, gshm_lease_info_t **leases_out,
                                 size_t *count_out);

/* Lists every client connection, as gshm_list. */
GSHM_EXTERN int gshm_list_clients(gshm_client_t *client, gshm_client_info_t **clients_out,
                                  size_t *count_out);

/* The uid gshmd knows this connection by: the owner of the segments it
 * creates (SO_PEERCRED at connect: in a user namespace the outer uid, not
 * what getuid() says inside; docs/CONTAINERS.md).  What a reader compares a
 * segment's owner with before it trusts what this user itself published
 * (gshm.torch.attach's default owner).
 *  client   the connection (not taken over).
 *  uid_out  receives the uid.
 * A reconnect on another thread between the list and the session read
 * (gshmd restarted) gives the connection a session the list does not show:
 * the list is read again, up to 8 times.
 * Errors: -EINVAL a NULL argument; -ENOENT the daemon did not list this
 * connection in 8 lists running (gshmd restarted between each list and
 * its check); -ENOMEM; the errors of gshm_list_clients. */
GSHM_EXTERN int gshm_client_uid(gshm_client_t *client, uint32_t *uid_out);

/* The daemon's totals and version.  Errors: -EINVAL a NULL argument;
 * -EPROTO a reply of another kind; -ENOMEM; the errors every call to the
 * daemon may give (above). */
GSHM_EXTERN int gshm_status(gshm_client_t *client, gshm_status_info_t *status_out);

/* Lists the daemon's GPUs with their P2P matrix, as gshm_list.  An empty
 * list (count 0) when the daemon has no CUDA backend. */
GSHM_EXTERN int gshm_list_devices(gshm_client_t *client, gshm_device_info_t **devices_out,
                                  size_t *count_out);

/* The daemon's metrics in Prometheus text format (version 0.0.4).
 * *text_out is malloc'ed and NUL-terminated; free it with gshm_free().
 * A text larger than one reply (64 KiB: a cluster of about 115 peers or
 * more) comes in a sealed memfd beside the reply, read here and closed.
 * Errors as gshm_status; -EMFILE gshmd could not send that memfd now (its
 * fds in flight); -EFBIG that memfd is over 64 MiB; a read's errno. */
GSHM_EXTERN int gshm_metrics(gshm_client_t *client, char **text_out);

/* ---- Cluster: segments of peer nodes (docs/CLUSTER.md) ---- */

/* One peer node of the daemon's cluster.peers. */
typedef struct gshm_cluster_peer {
  char name[64];
  char address[136];               /* "ADDRESS:PORT" */
  char state[12];                  /* "up", "connecting" or "down" (16 bytes before
                                      protocol_major: the 4 after the longest's NUL) */
  /* An up peer: the cluster protocol its hello announced (protocol_major
   * 0: unknown, the peer is not up or the daemon or libgshm is older than
   * these fields), and subkeys 1 where the link's hello MACs and keys come from
   * the cluster key's subkeys (both nodes said CAP_SUBKEYS, protocol 2.6:
   * cluster.min_protocol = 2.6 refuses a peer that does not), else 0.  A
   * number past 255 reads 255.  The minor is not authenticated; subkeys
   * is (the hello's MACs cover the capabilities). */
  uint8_t protocol_major, protocol_minor, subkeys, reserved_;
  uint32_t exported;               /* segments it exports: now for an up peer (the daemon
                                      asks each, waiting 1 s at most), else as last seen */
  char message[160];               /* why it is down, if known */
} gshm_cluster_peer_t;

/* Lists every peer of the daemon's cluster.peers, in that order (an
 * empty list when its cluster is off).  The daemon answers in pages of
 * one reply packet each (hundreds of peers with long messages do not fit
 * one); this asks page after page and returns them all at once, so a
 * peer list that changes meanwhile (the daemon restarted) may show a
 * peer twice or not at all.
 *  client         the connection.
 *  node_name_out  may be NULL; else 64 bytes that get the daemon's own
 *                 cluster node name ("" when the cluster is off).
 *  peers_out      receives an array of *count_out entries (NULL when
 *                 none), the caller's to free with gshm_free().
 *  count_out      receives the number of peers.
 * Errors (nothing is returned then): -EINVAL a NULL client, peers_out or
 * count_out; -ENOMEM; -EPROTO a reply without the peer list, or a
 * daemon whose cursor does not move forward or whose pages add up to
 * more than 16384 peers; and the errors every call to the daemon may
 * give (-ECONNRESET the daemon went away, ...). */
GSHM_EXTERN int gshm_cluster_peers(gshm_client_t *client, char *node_name_out,
                                   gshm_cluster_peer_t **peers_out, size_t *count_out);

/* A pull in flight on the daemon (gshm_cluster_pulls). */
typedef struct gshm_cluster_pull {
  char peer[64];                   /* a set from several: "a,b,..." (cut at 63 bytes) */
  char name[256];                  /* the segment, or the set's prefix (the peer's) */
  int prefix;                      /* 1: a set (every segment under name) */
  uint32_t uid;                    /* who asked */
  uint64_t bytes_done, bytes_total;
  uint32_t segments_done;
  uint32_t segments_total;         /* 0 while a set is still being listed */
  int64_t elapsed_ns;
  char local_name[256];            /* where it lands on this node: the local segment, or the
                                      local prefix (--as); name where an older daemon does
                                      not say */
  char ending[256];                /* "" while it runs; else why it failed or was cancelled
                                      (the requester has its answer): the row goes once what
                                      it asked its peers is answered or timed out
                                      (cluster.request_timeout_ms at most), and the set's
                                      hidden segments with it */
} gshm_cluster_pull_t;

/* Lists the pulls in flight on the daemon (oldest first; an empty list
 * when its cluster is off) that the caller may see: its own uid's, every
 * one for an admin (another user's pull names its segments and where they
 * land): the first 64 at most, as many as fit half of
 * one reply packet (the first page of PEERS), as gshm_list: *pulls_out is an
 * array of *count_out entries (NULL when none) for gshm_free.  Errors:
 * -EINVAL a NULL argument, -ENOMEM, -EPROTO, and those of every request
 * (-ECONNRESET the daemon went away). */
GSHM_EXTERN int gshm_cluster_pulls(gshm_client_t *client, gshm_cluster_pull_t **pulls_out,
                                   size_t *count_out);

/* As gshm_cluster_pulls, and *total_out (not NULL) gets how many pulls
 * the caller may see are in flight in all, of which *count_out are
 * listed: more than the 64 listed at most (or than fit half a packet) are
 * counted, not listed.
 * A daemon older than this count gives *count_out as the total.  Errors
 * as gshm_cluster_pulls (-EINVAL also for a NULL total_out). */
GSHM_EXTERN int gshm_cluster_pulls_counted(gshm_client_t *client, gshm_cluster_pull_t **pulls_out,
                                           size_t *count_out, uint64_t *total_out);

/* Asks the daemon to stop client's pull in flight (gshm_pull or
 * gshm_pull_prefix on any thread): callable from its progress callback,
 * from another thread, or from a signal handler (it only sets a flag,
 * lock-free).  The waiting pull sends the request within 100 ms
 * (GSHM_PULL_WAKE_MS; at once from a handler of a signal that reached its
 * thread), also while the peer is still being reached or a set listed,
 * and then fails with -ECANCELED, leaving nothing behind, as when the
 * requester goes away; a pull that ended meanwhile keeps its result.
 * The pull fails at once even where a peer has not answered what gshmd
 * asked it (a grant, a listing page, a read): gshmd keeps the set,
 * invisible but for gshm_cluster_pulls' `ending`, until those answers
 * come or time out (cluster.request_timeout_ms), and its memory with
 * it (it counts in the uid's pulls in flight).  The flag is cleared when a pull starts: a
 * cancel with no pull in flight is for none.  Returns 0, or -EINVAL
 * for a NULL client. */
GSHM_EXTERN int gshm_pull_cancel(gshm_client_t *client);

/* Lists the segments that peer exports, as gshm_list (id, generation,
 * name, sizes, location and created_ns are the peer's; uid, gid and mode
 * are 0): the segments the peer's cluster.export rules let peers read.
 * Errors: -ENOENT no such peer, -ENOTSUP the daemon's cluster is off,
 * -EACCES the caller is neither an admin nor in cluster.pull_group, or the
 * peer refused this node's key, -EPERM the peer refused this node (not in
 * its peers), -ECONNRESET/-ECONNREFUSED/-ETIMEDOUT the peer cannot be
 * reached, -EPROTO the peer listed a malformed name or location, or sent
 * more than 8192 pages with no segment (a gshmd's page with none looked at
 * 2048 segments: 16777216 of them in 8192 pages), -E2BIG the peer listed
 * more than 16777216 segments (more than a gshmd holds: limits.max_segments
 * at most; fewer with $GSHM_LIST_MAX), which take 12 GiB of *infos_out;
 * -EINVAL a NULL argument; -ENOMEM; and the errors every call to the
 * daemon may give. */
GSHM_EXTERN int gshm_list_remote(gshm_client_t *client, const char *peer,
                                 gshm_segment_info_t **infos_out, size_t *count_out);

/* Progress of a pull: reported once the first bytes are in, then about
 * five times a second until the last ones are. */
typedef struct gshm_pull_progress {
  uint64_t bytes_done;
  uint64_t bytes_total;            /* a set: grows while its listing comes in */
  int64_t elapsed_ns;
  uint32_t segments_done;          /* segments whose every byte is in */
  uint32_t segments_total;         /* 0 while a set is still being listed; 1 for one */
} gshm_pull_progress_t;

typedef void (*gshm_pull_progress_fn)(const gshm_pull_progress_t *progress, void *arg);

/* Options of gshm_pull() and gshm_pull_prefix(); a NULL pointer means
 * all defaults. */
typedef struct gshm_pull_opts {
  const char *local_name;          /* NULL or "": the peer's name; gshm_pull_prefix: the
                                      local prefix that takes the place of the peer's */
  const char *location;            /* NULL or "": "host" for a host segment, "cuda:0"
                                      for a device one */
  uint32_t mode;                   /* permission bits of the new segment; 0: 0600 */
  gshm_pull_progress_fn progress;  /* NULL: none; called on the calling thread while the
                                      client is busy: it must not use the client.  Also
                                      called when a signal handler ran on that thread
                                      while the pull waited, with the last report's
                                      figures again (all 0 before the first): where a
                                      runtime runs its signal handlers (Python) */
  void *progress_arg;
  int replace;                     /* 1: a local segment that holds a new name is unlinked
                                      in the step that publishes the new one (its holders
                                      keep it); 0: such a name fails the pull, -EEXIST */
} gshm_pull_opts_t;

/* What a pull did. */
typedef struct gshm_pull_result {
  gshm_segment_info_t segment;     /* the new local segment; its source says where it came
                                      from first: "NODE:NAME#ID.GENERATION" of the node that
                                      made it, whichever node this one read it from */
  uint64_t bytes;                  /* bytes copied */
  int64_t elapsed_ns;              /* from the daemon's acceptance to the last byte */
  char path[16];                   /* "host", "direct" or "staged" */
  char path_reason[160];           /* why that path */
  char peer[64];                   /* the node this one read it from */
  uint64_t remote_id, remote_generation; /* the segment's id and generation on peer; 0 when
                                      relayed (it had none there yet) */
  char remote_name[GSHM_NAME_MAX + 1]; /* the segment's name on peer */
  int relayed;                     /* 1: peer was still pulling it when this node read it
                                      (fan-out: peer relayed it as its chunks landed) */
} gshm_pull_result_t;

/* Copies segment `name` that peer node `peer` exports into a new local
 * segment owned by the caller, through the daemons (their cluster port;
 * no bytes pass through this process).  Blocks until the copy is done;
 * calls opts->progress meanwhile.  The new segment has no name anyone can
 * see (list, stat, open) until its last byte is in; on failure, or when
 * the daemon dies first, it never appears.  The caller must be an admin
 * or in the daemon's cluster.pull_group.
 * peer: one peer's name (a list is for gshm_pull_prefix: -EINVAL here).
 * Errors: -ENOENT no such peer or segment (a segment the peer does not
 * export is not found), -EEXIST the local name is taken (and not
 * opts->replace), -EACCES not allowed to pull (or the peer refused this
 * node, or opts->replace of a segment the caller does not own),
 * -ENOTSUP cluster off or a path this build lacks, -ECONNRESET the peer
 * went away mid-pull, or the connection to the daemon was lost after a
 * progress reply (not sent again: the segment may exist if the daemon
 * published it before it died; gshm_stat_name tells), -ETIMEDOUT the
 * peer did not answer, or its bytes did not come, within the daemon's
 * cluster.request_timeout_ms, -ECANCELED gshm_pull_cancel stopped it,
 * -EPROTO the peer broke the protocol (a chunk that failed its
 * authentication included), -EDQUOT / -EFBIG / -EMFILE / -ENODEV /
 * -ENOMEM the new local segment, as for gshm_create, -EINVAL a NULL
 * client, peer or name, or a bad name, location or mode, -ENAMETOOLONG a
 * local name over GSHM_NAME_MAX; and the errors every call to the
 * daemon may give.
 * A pull whose first reply a gshmd restart lost is sent again once
 * libgshm has reconnected, with the same random token: when the first
 * one had published its segment (gshmd notes it under the token and the
 * request's peer, names, location, mode and replace, before the publish
 * is stored), the resend is answered with that segment, not -EEXIST;
 * that result's path is "", elapsed_ns 0 and relayed 0 (not kept), and
 * its remote ids are 0 when the segment's source names another node.  If
 * that segment was unlinked or renamed meanwhile, the resend pulls
 * again.  Without gshmd's note (no service manager's fd store, or 64
 * later revokes and pulls came first) the resend meets -EEXIST. */
GSHM_EXTERN int gshm_pull(gshm_client_t *client, const char *peer, const char *name,
                          const gshm_pull_opts_t *opts, gshm_pull_result_t *result_out);

/* Pulls every segment that peer node `peer` exports whose name starts
 * with `prefix` ("" pulls all it exports), in one request: the peer's
 * listing, the grants and the reads are pipelined across the segments.
 * All or nothing: no new name is visible to anyone until every byte of
 * every segment is in; then all appear in one step.  On failure (peer
 * lost, caller gone, quota, the daemon killed) none appears, then or
 * after a restart.  Local names are opts->local_name (default: prefix)
 * followed by the rest of each peer name; opts->location applies to the
 * device segments (host ones, such as a model's manifest, stay host).  A local name that exists
 * fails the pull with -EEXIST unless opts->replace, which unlinks the old
 * segments in the same step (their holders keep them).  Blocks; calls
 * opts->progress meanwhile (segment counts included).  *results_out gets
 * one gshm_pull_result_t per segment, in the peer's id order (for
 * gshm_free), and *count_out their number: each with its segment's name,
 * id, generation, sizes, granularity, created_ns (0 from a gshmd that
 * does not send them), location, device_index and source, uid and gid
 * (this process's effective ones, which gshmd gives a pulled segment)
 * and mode (opts->mode, 0600 for 0), its bytes, path,
 * peer, remote_name, remote ids and relayed; elapsed_ns is the whole
 * set's, path_reason set on the first.  A segment the peer relayed (it
 * was still pulling it: fan-out) has relayed 1 and remote ids 0; its
 * source names where it came from first, as on the peer.
 * Several sources: peer may name up to 8 peers that hold the set,
 * separated by commas ("n0,n1,n2"); the first lists it, and each
 * segment's grant goes to the one with the fewest of the set's bytes
 * open (a faster source serves more; one still pulling the set relays
 * it, as a single source does).  Each copy must have the listed
 * segment's source (where its bytes came from first: gshm_segment_info_t
 * source), and a source that does not grant a segment (busy, not there,
 * not a copy of the listed one, unreachable: then asked for nothing more) is
 * passed over for the others (the first never is: its refusal fails the
 * set; a relay grants what it takes from its own first source, or has
 * whole, and asks the rest to wait); a source lost after
 * its grant fails the set, as a single source.  Each result's peer says
 * where its bytes came from.  Fan-out: node k of a fleet pulling a model
 * from "n0,...,n(k-1)" costs n0 about 1 + 1/2 + ... + 1/k copies
 * (docs/CLUSTER.md).
 * Errors: as gshm_pull; -ENOENT also when the peer exports nothing under
 * the prefix (or a listed peer is not in the daemon's cluster.peers),
 * -E2BIG more than 4096 segments, -EINVAL a NULL argument, a prefix or
 * local prefix that makes a name invalid here, or a list of peers with
 * an empty or repeated name or more than 8, -ETIMEDOUT also when the
 * peer's listing pages took both the daemon's cluster.request_timeout_ms
 * and 8192 pages with none adding a segment under the prefix (a relay's
 * busy answers aside).
 * A set's resend after a gshmd restart lost its first reply is answered
 * as gshm_pull's: that reply is a progress reply (sent before the
 * publish, so the resend pulls anew) unless the set is one segment whose
 * bytes came in one chunk, and such a set's segment is noted, as a single
 * pull's, and is the resend's answer (path "" and elapsed_ns 0: not
 * kept); a connection lost after a reply gives -ECONNRESET, as
 * gshm_pull. */
GSHM_EXTERN int gshm_pull_prefix(gshm_client_t *client, const char *peer, const char *prefix,
                                 const gshm_pull_opts_t *opts, gshm_pull_result_t **results_out,
                                 size_t *count_out);

/* Frees an array returned by a gshm_list* function.  Accepts NULL. */
GSHM_EXTERN void gshm_free(void *p);

/* Maps an open segment into this process.
 *  devices, ndevices  host segments: must be NULL/0 (a CPU mapping).
 *                     Device segments: client-local CUDA ordinals (as
 *                     CUDA_VISIBLE_DEVICES numbers them) that get access;
 *                     NULL means every visible device that can reach the
 *                     segment's GPU.
 *  addr_out           receives a CPU pointer (host) or a device address
 *                     (device segments), valid until gshm_unmap/gshm_close.
 * Mapping an already mapped segment (or another object of the same lease,
 * from a cached gshm_open) returns the same address; devices listed then
 * that lack access get it, for every holder of the mapping in this process
 * (access is added, never taken away, until the last unmap).  Read-only
 * leases map PROT_READ (host: enforced by the kernel through a read-only
 * fd; device: cuMemSetAccess READ, enforced by the driver for mappings made
 * by libgshm).
 * Errors: -EINVAL seg or addr_out NULL, devices NULL with ndevices > 0,
 * devices given for a host segment, ndevices 0 or over 64 with devices,
 * or an unknown ordinal; -ENODEV the segment's GPU is not visible to this
 * process; -EXDEV a listed device has no peer access to it (as gshm_copy;
 * devices NULL leaves such a device out); -ENOTSUP no CUDA
 * driver here for a device segment; -ECHILD a device segment in a process
 * forked from one that had initialized CUDA (as gshm_copy); -EBADF a
 * legacy-IPC lease
 * (gshm_open_legacy_ipc: it has no fd to map); -EACCES / -ENOMEM / -EIO
 * from mmap or the driver; -ESTALE the lease
 * ended (revoked, or it could not be re-taken after a daemon restart: see
 * gshm_stat); -EPROTO the daemon's reply cannot be mapped as it says (a
 * host segment's fd shorter than its size or not sealed against
 * shrinking; a device segment's size no multiple of its granularity, or
 * a location that names no GPU by UUID). */
GSHM_EXTERN int gshm_map(gshm_segment_t *seg, const int *devices, size_t ndevices,
                         void **addr_out);

/* Undoes gshm_map.  The last unmap of a lease's device mapping (here or
 * in gshm_close) first waits for the work queued in every context that
 * may use the range (cuCtxSynchronize of the calling thread's context and
 * of the primary context of each device the mapping gave access to, once
 * the client's lock is let go), then removes it (cuMemUnmap, cuMemRelease):
 * cudaFree's semantics.  NVIDIA does not say that cuMemUnmap waits, and a
 * DLPack consumer (torch) drops a tensor with work on it still queued;
 * PyTorch's own cuMem unmaps synchronize the same way
 * (CUDACachingAllocator.cpp, unmapHandles).  So, as with cudaFree, an
 * unmap with a gshm_wait queued that only a later call of this thread
 * would satisfy waits for ever.  While any thread captures a stream in a
 * context the wait would synchronize, cuCtxSynchronize fails and
 * invalidates that capture (every capture mode, also relaxed: probed on
 * an H200, driver 580).  A capture on a blocking stream (cuStreamCreate
 * without CU_STREAM_NON_BLOCKING: CuPy's default) is seen first through
 * the legacy stream, harmlessly: the wait is not made, the capture goes
 * on, and the range stays mapped until a later call of the client lets go
 * of its lock after the capture (at gshm_disconnect during one: left
 * mapped for good, logged).  A capture on a non-blocking stream (PyTorch's
 * side streams, torch.cuda.graph) shows nowhere outside its stream and is
 * invalidated: unmap (and close) device segments outside a capture, as
 * PyTorch frees (the Python package puts a close during the calling
 * thread's own torch capture off until after it).
 * Called on a handle that gshm_map did not map, it ends the mapping
 * gshm_read / gshm_write keep (when no gshm_map of the segment holds it).
 * Returns 0 (also when not mapped), -EINVAL for a NULL seg, or -EIO when
 * the driver refused to unmap (the mapping is then leaked, and logged).
 * In a process forked from the one that mapped a device segment, the
 * mapping is that process's CUDA state: the unmap forgets this process's
 * record of it without a driver call, and returns 0; -ECHILD there when
 * the client was inside a call at the fork (gshm_connect). */
GSHM_EXTERN int gshm_unmap(gshm_segment_t *seg);

/* Copies bytes between a segment and host memory, for host and device
 * segments alike (device segments through the driver, a staging copy on
 * a GPU the mapping gives access to: the segment's own where it is
 * visible here, else one with a peer path to it).  A segment not mapped yet is mapped by the first
 * such call (as gshm_map with devices NULL) and the mapping kept for later
 * calls until the segment's last handle is closed, a gshm_unmap (of any
 * handle of the segment, when no gshm_map holds the mapping), or a
 * gshm_read, gshm_write or gshm_map that finds the lease revoked
 * (-ESTALE): a device mapping holds a retain of a primary context
 * (created where none was active: hundreds of MiB of the GPU's memory,
 * and the GPU itself in EXCLUSIVE_PROCESS compute mode) for that long,
 * instead of creating and destroying one for every call (133 ms each on
 * an H200).  A reset of that primary context (cudaDeviceReset) since is
 * survived: the next call makes it again.
 *  offset, bytes  byte range within the segment.
 *  buf            host memory of at least `bytes` bytes.
 * Errors: -EINVAL seg NULL, or buf NULL with bytes > 0; -ERANGE range
 * outside the segment; -EACCES gshm_write on a read-only lease; -ENOTSUP
 * device segment without a CUDA driver here;
 * -ECHILD a device segment in a process forked from one that had
 * initialized CUDA, mapped or not (as gshm_map); the errors of
 * gshm_map(). */
GSHM_EXTERN int gshm_read(gshm_segment_t *seg, uint64_t offset, void *buf, size_t bytes);
GSHM_EXTERN int gshm_write(gshm_segment_t *seg, uint64_t offset, const void *buf, size_t bytes);

/* Daemon's explanation of this client's last failed request ("uid 1000 uses
 * 3 GiB of 4 GiB on cuda, 2 GiB more asked (quota.cuda_bytes)"), or "" when
 * there is none.  Each request starts with none; gshm_map, gshm_unmap,
 * gshm_read and gshm_write too, for the calling thread (their failures in
 * libgshm itself have no explanation: not an older request's).
 * Returns a copy in storage of the calling thread, valid until that
 * thread's next gshm_last_error().  With several threads on one client,
 * "last" is the calling thread's last request on this client (another
 * thread's request since does not rewrite it); for a thread that made
 * none on it since its last request on another client, the last of any
 * thread's. */
GSHM_EXTERN const char *gshm_last_error(gshm_client_t *client);

/* A static description of a negative errno returned by this library. */
GSHM_EXTERN const char *gshm_strerror(int err);

/* The symbolic name of a negative (or positive) errno returned by this
 * library, e.g. "EACCES" for -EACCES (static storage); "E?" for a value
 * that gshm never returns.  ENOTSUP and EOPNOTSUPP are one value on Linux:
 * gshm returns it only as -ENOTSUP ("ENOTSUP"). */
GSHM_EXTERN const char *gshm_err_name(int err);

/* ---- device segments: legacy IPC (client/map_cuda.c) ---- */

/* Opens a segment created with GSHM_CREATE_LEGACY_IPC and returns its
 * legacy CUDA IPC handle (the 64 bytes of a cudaIpcMemHandle_t /
 * CUipcMemHandle), for stacks that only speak legacy IPC: pass the bytes
 * to cudaIpcOpenMemHandle / cuIpcOpenMemHandle in this or another process.
 *
 * The handle is a bearer token: any process on the node that learns the
 * bytes can open the memory read-write, whatever the segment's mode bits
 * say.  That is why gshmd refuses this unless its config enables it
 * (daemon.legacy_ipc = true, or gshmd --legacy-ipc) and the segment was
 * created with GSHM_CREATE_LEGACY_IPC; such segments are cuMemAlloc'ed
 * (legacy IPC cannot export cuMem VMM allocations), have no fd, cannot be
 * mapped with gshm_map() (-EBADF) and do not survive a gshmd restart.
 *
 *  name        the segment; the open needs read-write permission.
 *  handle_out  receives GSHM_LEGACY_IPC_HANDLE_SIZE (64) bytes.
 *  seg_out     receives a segment object holding the lease: the daemon
 *              keeps the memory at least until gshm_close(seg_out) (and
 *              until the name is unlinked).  Close importers' mappings
 *              (cuIpcCloseMemHandle) before that.  It is never shared with
 *              gshm_open() by the lease cache.
 * Errors: -ENOENT no such name; -EACCES the mode bits refuse read-write;
 * -ENOTSUP legacy export disabled on this daemon, or the segment was not
 * created with GSHM_CREATE_LEGACY_IPC; -EINVAL NULL argument;
 * -ENAMETOOLONG name over GSHM_NAME_MAX; -EDQUOT / -EMFILE lease limits
 * (as gshm_open); -EIO the daemon's export of the handle failed;
 * -EPROTO a grant without the 64-byte handle; and the errors every call
 * to the daemon may give. */
GSHM_EXTERN int gshm_open_legacy_ipc(gshm_client_t *client, const char *name,
                                     uint8_t handle_out[GSHM_LEGACY_IPC_HANDLE_SIZE],
                                     gshm_segment_t **seg_out);
/* ---- end device segments ---- */

/* ---- PyTorch's allocator: pools of device segments (client/torch_alloc.c) ---- */

/* A pool hands out device memory that gshmd owns: segments named
 * "<prefix>/seg-NNNNNN" (NNNNNN from 000000 in order; past a name another
 * user holds, as names are first come, first served, one drawn at random
 * from the million that no one holds), created on one GPU, mapped
 * once in this process and carved up by libgshm (best fit).  Each segment
 * is `granule` bytes, or, for an allocation larger than that, the
 * allocation rounded up to 2 MiB; no allocation crosses a segment boundary,
 * so every byte handed out is (segment name, offset).  They show in
 * `gshmctl segments` with this process's user as owner.  Plug it into
 * PyTorch with torch.cuda.memory.CUDAPluggableAllocator(<libgshm.so>,
 * "gshm_torch_malloc", "gshm_torch_free") and a torch.cuda.MemPool (the
 * Python package's gshm.torch.MemPool does all of this).
 * Threads: the pool's own lock (and its process's list of pools) is never
 * held across a request on the pool's client (a growth's create and map,
 * the close of a segment a free emptied, a release's closes and unlinks),
 * which waits for that client's lock, held by a gshm_pull for minutes: a
 * pull's progress callback on the pool's client may call
 * gshm_pool_segments and gshm_pool_activate while other threads grow, free
 * or release the pool.  It must not make the pool grow, close a segment or
 * release it (each a request on its own client: it would wait for itself). */
typedef struct gshm_pool gshm_pool_t;

#define GSHM_POOL_PERSISTENT 0x1u        /* segments keep their names (and memory) after
                                            this process ends, until unlinked */
#define GSHM_POOL_SEGMENT_PER_ALLOC 0x2u /* one segment per allocation, no arena (for
                                            measurements: slower; see docs/PERFORMANCE.md) */
#define GSHM_POOL_DEFAULT_GRANULE (256ull << 20) /* bytes per arena segment */

typedef struct gshm_pool_config {
  const char *prefix; /* segment names are "<prefix>/seg-NNNNNN": a valid name prefix */
  int device;         /* this process's CUDA ordinal (CUDA_VISIBLE_DEVICES numbering) */
  uint32_t mode;      /* permission bits of the segments; 0 means 0600 */
  uint32_t flags;     /* GSHM_POOL_* */
  uint64_t granule;   /* bytes per arena segment, a multiple of 2 MiB; 0: the default */
} gshm_pool_config_t;

/* One segment of a pool, as gshm_pool_segments() lists them. */
typedef struct gshm_pool_segment {
  char name[GSHM_NAME_MAX + 1];
  uint64_t id, generation;         /* as gshm_segment_info_t: what a manifest records */
  uint64_t size;                   /* bytes */
  uint64_t address;                /* device address of byte 0 in this process */
  uint64_t live_bytes;             /* handed out and not freed */
  uint64_t live_blocks;
} gshm_pool_segment_t;

/* Makes a pool.  It creates no segment yet: the first gshm_torch_malloc
 * does.  The client must outlive the pool (gshm_pool_release first).
 *  client    the connection that creates the segments; its uid owns them.
 *  cfg       copied; cfg->prefix is copied too.
 *  pool_out  receives the pool; end it with gshm_pool_release().
 * Errors: -EINVAL NULL argument, unknown flags, granule not a multiple of
 * 2 MiB, mode over 0777, negative device, or a prefix that is not a valid
 * segment name; -ENAMETOOLONG prefix too long for "<prefix>/seg-NNNNNN";
 * -ENOTSUP no CUDA driver here; -ECHILD this process was forked from one
 * that had initialized CUDA (as gshm_copy); -ENODEV no such CUDA device
 * in this process; -EEXIST (persistent pools) "<prefix>/seg-000000" exists
 * and is the client's own uid's (gshm_client_uid), i.e. the prefix holds a
 * pool of this user that was not released (unlink its segments first;
 * another user's is passed over); -EIO (or -ENOMEM) a driver call failed
 * (logged); the errors of gshm_stat_name() and gshm_client_uid(). */
GSHM_EXTERN int gshm_pool_create(gshm_client_t *client, const gshm_pool_config_t *cfg,
                                 gshm_pool_t **pool_out);

/* Makes `pool` the one gshm_torch_malloc allocates from on the calling
 * thread (NULL: none); returns the previous one, for restoring.  A thread
 * with no active pool allocates from the process's only unreleased pool,
 * and fails when there are several or none.  A pool that was freed
 * (gshm_pool_release returned 0) activates none, so restoring a stale
 * previous pool is safe.  Any thread may release a pool that is active on
 * another: that thread's next gshm_torch_malloc fails with -EBADF. */
GSHM_EXTERN gshm_pool_t *gshm_pool_activate(gshm_pool_t *pool);

/* PyTorch's pluggable-allocator malloc: `size` bytes (rounded up to 512)
 * from the calling thread's pool (gshm_pool_activate), growing it by a
 * segment when no free range fits.  `stream` is not needed: freed ranges
 * are reused only after the device finished the work queued before their
 * free.  A growth makes its driver calls (import, map, access) with the
 * calling thread's stream capture mode relaxed, as PyTorch's own
 * allocator does: inside a capture (a PyTorch that calls the allocator
 * outside its own relaxed guard) they are not refused for a global-mode
 * capture.  Thread-safe: a growth's requests are made without the pool's
 * lock (other threads' allocations that fit go on meanwhile; one that
 * needs a growth waits for the one under way, then looks again).  Returns
 * the device address; NULL for size 0 (with
 * gshm_torch_last_error() 0); otherwise NULL (PyTorch then raises its
 * out-of-memory error) with the reason in gshm_torch_last_error():
 * -EINVAL size < 0, or no active pool and not exactly one unreleased pool
 * in the process; -EBADF the thread's pool was released; -ECHILD the pool
 * was made by a process this one was forked from (its segments, mappings
 * and context are that process's, and CUDA does not survive fork: see
 * gshm_copy); -ENODEV `device`
 * is not the pool's; -EMFILE the pool has a million segments; -EPROTO
 * gshmd made a segment smaller than asked; -EEXIST the name a growth
 * wanted is the client's own uid's (a pool of this prefix not released),
 * or 32 names in a row were other users' (logged: use a prefix of your
 * own); the other errors of gshm_create()
 * (the daemon's explanation in gshm_last_error() of the pool's client)
 * and gshm_map().  A failed growth leaves no segment, name or mapping
 * behind. */
GSHM_EXTERN void *gshm_torch_malloc(ssize_t size, int device, void *stream);

/* PyTorch's pluggable-allocator free, from any thread.  Waits for all work
 * queued on the pool's device (cuCtxSynchronize on the pool's context,
 * pushed whatever context is current; as cudaFree does; PyTorch frees pool
 * blocks when it empties its cache, which its out-of-memory retry does
 * inside an allocation too),
 * then returns the block to its pool.  A segment left empty is unmapped and
 * closed at once in a non-persistent pool, and in a released one; a
 * persistent pool keeps it for reuse.  `size`, `device` and `stream` are
 * not needed (the pool knows them; `stream` may be destroyed by now).  A
 * pointer that no pool handed out, or one freed twice, is ignored (never
 * passed to cudaFree) and sets gshm_torch_last_error() to -EINVAL; in a
 * process forked from one that made pools, a pointer that none of this
 * process's pools handed out is ignored with -ECHILD (the parent's pools
 * are not looked at there: see gshm_torch_malloc).  A wait that fails but
 * not for good (a stream capture under way refuses it), or that is not
 * made (a capture on a blocking stream of the pool's context, which the
 * wait would invalidate: as for gshm_unmap), keeps the block live,
 * leaked, rather than reused or unmapped under work that may still use
 * it: gshm_torch_last_error() gives the wait's errno then (logged);
 * after a sticky error (the context runs nothing more) the block is
 * returned as usual. */
GSHM_EXTERN void gshm_torch_free(void *ptr, ssize_t size, int device, void *stream);

/* The result of the calling thread's last gshm_torch_malloc or
 * gshm_torch_free: 0 or a negative errno. */
GSHM_EXTERN int gshm_torch_last_error(void);

/* Lists the pool's segments in creation order.  *segs_out is one malloc'ed
 * array of *count_out entries (NULL when 0); free it with gshm_free().
 * Segments being closed (a free emptied them, or a release) are not
 * listed.  Makes no request: see gshm_pool_t's "Threads".
 * Errors: -EINVAL NULL argument; -ENOMEM; -ECHILD the pool was made by a
 * process this one was forked from (gshm_torch_malloc). */
GSHM_EXTERN int gshm_pool_segments(gshm_pool_t *pool, gshm_pool_segment_t **segs_out,
                                   size_t *count_out);

/* Ends a pool: it allocates no more; every segment with no live block is
 * unmapped and closed, and with `unlink` non-zero the names of all its
 * segments are removed (persistent pools; a non-persistent pool's have none),
 * so their memory goes with the last lease.  unlink 0 leaves a persistent
 * pool's segments to gshmd for another process to attach.  Segments that
 * still hold live blocks (tensors not yet freed) stay mapped: they are
 * closed when their last block is freed, and this returns -EBUSY with the
 * pool still valid (call again later to free it).  Returns 0 when the pool
 * was freed (do not use it again; its few hundred bytes stay allocated, so
 * that no later pool gets its address and a stale handle names none);
 * -EINVAL pool NULL; -EBUSY as above; -ECHILD the pool was made by a
 * process this one was forked from (gshm_torch_malloc): nothing is done
 * (its segments, names and context are that process's to end).  Before
 * returning 0 it waits for what other threads still do on the pool
 * without its lock (a growth, which then drops its new segment and fails
 * -EBADF; the close of a segment a free emptied): not from a progress
 * callback of the pool's client (see gshm_pool_t's "Threads"). */
GSHM_EXTERN int gshm_pool_release(gshm_pool_t *pool, int unlink);
/* ---- end PyTorch's allocator ---- */

/* ---- DLPack for bindings without compiled code (client/pyglue.c) ---- */

/* A DLPack producer written with ctypes (the Python package) can give C
 * only Python functions (ctypes callbacks) as a DLManagedTensor's deleter
 * and a capsule's destructor, and a ctypes callback entered while a
 * Python exception is pending loses it (the interpreter turns the
 * callback's result into a SystemError, which ctypes reports as
 * unraisable and clears): a consumer that dropped the capsule while
 * raising (numpy.from_dlpack of a GPU view) returned NULL with no
 * exception, and the release never ran.  gshm_py_dlpack_deleter and
 * gshm_py_capsule_destructor are C functions to give instead: each takes
 * the GIL, sets the pending exception aside, calls the binding's callback
 * and puts the exception back.  libgshm does not link Python: the binding
 * hands in the interpreter's own functions. */
typedef struct gshm_py_glue {
  int (*gil_ensure)(void);                               /* PyGILState_Ensure */
  void (*gil_release)(int state);                        /* PyGILState_Release */
  void (*err_fetch)(void **type, void **value, void **traceback); /* PyErr_Fetch */
  void (*err_restore)(void *type, void *value, void *traceback);  /* PyErr_Restore */
  void (*deleter)(void *managed);            /* what gshm_py_dlpack_deleter calls */
  void (*capsule_destructor)(void *capsule); /* what gshm_py_capsule_destructor calls */
} gshm_py_glue_t;

/* Sets, for the whole process, the functions the two below call; call it
 * before giving either of them to a consumer.  Callable from any thread,
 * GIL or not, and again: the glue is swapped in whole (an atomic store),
 * and a deleter that runs meanwhile uses the old glue or the new one.
 *  glue  in; not copied: it and every function it names must stay valid
 *        until the process ends (the Python package keeps them for ever).
 * Returns 0; -EINVAL glue or one of its six functions NULL (the glue set
 * before, if any, stays). */
GSHM_EXTERN int gshm_py_glue_set(const gshm_py_glue_t *glue);

/* A DLManagedTensor deleter (declared void * here: gshm.h does not
 * include dlpack.h), callable from any thread, with or without the GIL
 * (PyGILState_Ensure nests), but not once the interpreter is finalizing
 * (PyGILState_Ensure's own rule).  It takes the GIL, moves Python's
 * pending exception aside (err_fetch), calls glue->deleter(managed),
 * puts the exception back (err_restore: its three references, new ones
 * from err_fetch, go back unchanged, so none leaks) and releases the GIL,
 * as CPython sets an exception aside around a weakref's callback.  An
 * exception the callback leaves set is dropped (PyErr_Restore clears it);
 * a ctypes callback's own is reported as unraisable by ctypes.
 *  managed  the DLManagedTensor * (in): handed to glue->deleter, which
 *           owns and frees it; libgshm neither reads nor frees it.
 * Returns nothing and cannot fail.  Before gshm_py_glue_set it does
 * nothing at all: the tensor, and what its deleter would release, leak. */
GSHM_EXTERN void gshm_py_dlpack_deleter(void *managed);

/* A PyCapsule destructor (PyCapsule_New's third argument), which Python
 * calls with the GIL held as it frees the capsule; it takes the GIL
 * anyway, as gshm_py_dlpack_deleter does, and keeps Python's pending
 * exception the same way around glue->capsule_destructor(capsule).
 *  capsule  the PyObject * being freed (in, borrowed for the call, its
 *           reference count already 0): the callback may read it
 *           (PyCapsule_IsValid, PyCapsule_GetPointer) but not keep it.
 * Returns nothing and cannot fail.  Before gshm_py_glue_set it does
 * nothing at all: what the callback would release (an unconsumed
 * tensor) leaks. */
GSHM_EXTERN void gshm_py_capsule_destructor(void *capsule);
/* ---- end DLPack for bindings ---- */

/* ---- copy, broadcast, signal (kernels/) ---- */

/* How gshm_copy moves bytes. */
typedef enum {
  GSHM_COPY_AUTO = 0,   /* per size and topology, from measurements (below) */
  GSHM_COPY_ENGINE = 1, /* the GPU's copy engine: cuMemcpyAsync */
  GSHM_COPY_SM = 2,     /* libgshm's copy kernels on the GPU's SMs */
} gshm_copy_method_t;

/* Copies `bytes` bytes from src to dst, asynchronously on `stream`.
 *  dst, src  any addresses this process can reach under CUDA's unified
 *            addressing: device addresses from gshm_map, cuMemAlloc /
 *            cudaMalloc memory of any visible GPU (peer memory included),
 *            page-locked host memory, and, for GSHM_COPY_ENGINE only,
 *            ordinary (pageable) host memory.  Any alignment; the ranges
 *            must not overlap.
 *  bytes     bytes to copy; 0 returns 0 at once.
 *  method    GSHM_COPY_ENGINE: cuMemcpyAsync, the driver's copy engine.
 *            GSHM_COPY_SM: a kernel of 16-byte vector loads and stores
 *            (kernels/copy.cu) on the GPU of the stream's context: a push
 *            when that is the source's GPU, a pull when it is the
 *            destination's.
 *            GSHM_COPY_AUTO: host memory on either side goes to the copy
 *            engine; otherwise SM kernels where a copy is small enough that
 *            fixed costs dominate, the copy engine above, by size
 *            thresholds per kind of copy (within one GPU, a push, a pull)
 *            measured with `gshm-bench copy`: docs/PERFORMANCE.md "AUTO
 *            thresholds" has the table.
 *  stream    a CUstream / cudaStream_t; NULL is the legacy default stream
 *            of the current context.  The work runs in the stream's context
 *            (cuStreamGetCtx).  With stream NULL and no current context,
 *            the primary context of the source's GPU is used (a push), or
 *            of the destination's when the source is host memory.
 * Returns when the copy is queued, not done: order on `stream` or
 * synchronize it before reading dst.  When src and dst are on different
 * GPUs, peer access is enabled (cuCtxEnablePeerAccess, once, and left
 * enabled) from the launching context to the other GPU's primary context,
 * which is retained for the life of the process; not for a buffer that
 * is a gshm_map mapping giving the launching GPU access, which needs none
 * (no context is made on its GPU for it).  Peer access does not
 * cover cuMem mappings (gshm_map's, PyTorch's expandable segments): the
 * GPU that runs the copy (the stream's) must be among the devices the
 * mapping gives access to (gshm_map's devices; NULL gives every device
 * that can reach the segment's GPU).  libgshm checks that first and
 * returns -EXDEV where the GPU would fault (an illegal address that ends
 * the context): for a mapping of gshm_map's (in this process) from its own
 * record, for other cuMem memory (cuMemMap ranges, memory pools) from the
 * access flags the driver reports (one driver query per device address
 * gshm_map did not map, each call).
 * Errors: -EINVAL dst or src NULL, an unknown method, or GSHM_COPY_SM on
 * pageable host memory; -EIO a stream whose context cannot be made
 * current (destroyed); -ENOTSUP
 * GSHM_COPY_SM in a libgshm built without nvcc, or a GPU architecture the
 * embedded kernels (sm_90 SASS + PTX) cannot run on; -EXDEV
 * GSHM_COPY_SM between GPUs without peer access, or src or dst a cuMem
 * mapping the stream's GPU has no access to; -EACCES dst a cuMem mapping
 * the stream's GPU may only read (a read-only lease's), or in a host
 * segment gshm_map mapped read-only; -ERANGE src or dst partly in a
 * mapping of gshm_map's (starts in one and runs past its end, or starts
 * before one and runs into it); -ENOENT / -ENODEV no CUDA
 * driver or no GPU; -ENOSYS a driver older than CUDA 12.0, or one that
 * lacks an entry point libgshm needs; -ECHILD this process was forked
 * from one that had initialized CUDA, which a forked child cannot use
 * (CUDA does not survive fork: fork and exec, or spawn, a process that
 * uses it; nothing of the parent's libgshm CUDA state is touched);
 * -ENOMEM, -EIO from the driver (logged at
 * GSHM_LOG_LEVEL>=3); -ENOMEM also when the process has used more than
 * 64 CUDA contexts. */
GSHM_EXTERN int gshm_copy(void *dst, const void *src, size_t bytes, gshm_copy_method_t method,
                          void *stream);

/* How gshm_broadcast moves one buffer to several.  CHAIN and SPLIT cut the
 * buffer into chunks copied by the copy engines (cuMemcpyAsync) on streams
 * that libgshm keeps per caller stream and ordered pair of GPUs (created on
 * first use; see gshm_broadcast's "Ordering"), ordered by events; STAR
 * copies as gshm_copy AUTO does. */
typedef enum {
  GSHM_BCAST_AUTO = 0,  /* by size and layout, from measurements (below) */
  GSHM_BCAST_STAR = 1,  /* one direct copy from the source to each destination,
                           all queued at once; the source's links are shared */
  GSHM_BCAST_CHAIN = 2, /* a pipeline src -> d0 -> d1 -> ... in chunks: each
                           GPU receives from one GPU and sends to one */
  GSHM_BCAST_SPLIT = 3, /* the buffer cut into n parts; part i goes src -> d_i,
                           and d_i forwards it to every other destination,
                           chunk by chunk (a pipelined scatter + all-gather).
                           Moves the least data per link, yet measured slower
                           than CHAIN on four H200s behind NVSwitch, where a GPU
                           written by several GPUs at once receives less than
                           from one (docs/PERFORMANCE.md "Broadcast") */
} gshm_broadcast_algo_t;

#define GSHM_BCAST_MAX_LANES 4

/* Tuning for gshm_broadcast_ex; all-zero means gshm_broadcast's defaults. */
typedef struct {
  gshm_broadcast_algo_t algo;
  size_t chunk_bytes; /* pipeline chunk for CHAIN / SPLIT; 0: AUTO's choice
                         (below); rounded up to 64 KiB */
  int pull;           /* 0 (default): each copy is issued on the sending GPU's
                         stream (a push); 1: on the receiving GPU's.  Pushes
                         measured faster at every size */
  int lanes;          /* streams per GPU pair taking chunks in turn, so that
                         one chunk's copy can start before the previous one
                         ends; 0: 1; at most GSHM_BCAST_MAX_LANES */
} gshm_broadcast_opts_t;

/* Copies `bytes` bytes from src to each of dsts[0..n-1], asynchronously,
 * ordered after the work already queued on `stream` and before the work
 * queued on it afterwards.
 *  src      device memory of one GPU (from gshm_map or cuMemAlloc), any
 *           alignment.
 *  dsts     n destinations of `bytes` bytes each, on any GPUs (several may
 *           share a GPU, the source's included); none may overlap src or
 *           another.  Page-locked or pageable host memory is allowed and
 *           makes AUTO copy to each destination in turn (gshm_copy AUTO).
 *  n        1..64.
 *  bytes    bytes per destination; 0 returns 0 at once.
 *  stream   a CUstream / cudaStream_t (NULL: the legacy default stream of
 *           the current context; with no current context, the source GPU's
 *           primary context is used).
 * AUTO: STAR (pushes, gshm_copy AUTO each) for one destination or while
 * n * bytes is small; above, CHAIN of pushes in chunks of
 * sqrt(bytes * T0 / (n - 1)), the chunk that minimises the pipeline's fill
 * plus a fixed cost per copy.  The threshold, T0, the chunk's bounds and
 * the gshm-bench broadcast runs behind them: docs/PERFORMANCE.md "AUTO
 * thresholds".
 * Host cost: about three driver calls per destination and chunk (copy,
 * event record, event wait), plus a cuStreamCreate per GPU pair and lane
 * used on a caller stream's first broadcast; libgshm holds one lock while
 * it queues, so broadcasts from several threads of a process are queued
 * one at a time (and then run side by side on the GPUs).
 * Ordering: a broadcast is ordered by its caller's stream alone.  Its
 * copies run on streams libgshm keeps per caller stream (with its
 * context), GPU pair and lane: broadcasts queued on one caller stream
 * share them (they are ordered by that stream anyway), broadcasts queued
 * on different callers' streams (other threads, other streams) share none
 * and are not ordered against each other: two that write the same
 * destination are ordered by their callers, e.g. the second's stream
 * waits for the first's.  The streams of the 32 caller streams used most
 * recently are kept; a 33rd caller stream's first broadcast destroys
 * those of the one used least recently (work queued on them still runs)
 * and makes its own.
 * On a stream being captured into a CUDA graph, the broadcast is one
 * gshm_copy per destination on that stream (any algorithm; pull and lanes
 * are not used): the shared streams would join the capture until it ends,
 * and other broadcasts queued on them meanwhile with it.
 * Errors: -EINVAL a NULL pointer, n outside 1..64, src not device memory,
 * an unknown algorithm, lanes outside 0..GSHM_BCAST_MAX_LANES, CHAIN /
 * SPLIT with host memory, bytes of 2^58 or more (more than any memory);
 * -EXDEV a buffer in cuMem memory (gshm_map's or other) that a GPU
 * issuing one of its copies (the sender, or with pull the receiver) has
 * no access to (two GPUs without a peer path are no error: peer access is
 * enabled where it can be, and the copy engine copies between the others
 * through the host, slower);
 * -EACCES such a destination that GPU may only read; -ERANGE a buffer
 * partly in a gshm_map mapping: it starts in one and runs past its end,
 * or starts before one and runs into it (all before anything is queued);
 * -ENOENT / -ENODEV no CUDA driver or GPU; -ENOSYS a driver too old, or
 * -ECHILD a forked child (both as gshm_copy); -ENOMEM, -EIO from the
 * driver. */
GSHM_EXTERN int gshm_broadcast(const void *src, void *const dsts[], int n, size_t bytes,
                               void *stream);

/* gshm_broadcast with an explicit algorithm, chunk, issuing side and lanes
 * (for tuning and gshm-bench); opts NULL is gshm_broadcast.  Errors as
 * there. */
GSHM_EXTERN int gshm_broadcast_ex(const void *src, void *const dsts[], int n, size_t bytes,
                                  void *stream, const gshm_broadcast_opts_t *opts);

/* Writes `value` to the 64-bit word at `flag` on `stream`, after all work
 * queued on the stream before it, with a system-wide memory fence first
 * (cuStreamWriteValue64 with CU_STREAM_WRITE_VALUE_DEFAULT; where the
 * driver refuses that address, a one-thread kernel doing a system-scope
 * fence and release store).  Pair it with gshm_wait() in another process
 * that maps the same segment: its stream then sees every byte this stream
 * wrote before the signal.
 *  flag    8-byte-aligned device address (typically in a small segment
 *          shared with the consumer; on either GPU) or page-locked host
 *          memory.
 *  value   a sequence number; consumers wait for >= value, so make it grow.
 *  stream  as for gshm_copy.
 * Errors: -EINVAL flag NULL, not 8-byte aligned, or in pageable host
 * memory (never handed to the GPU); -EXDEV the flag is
 * on a GPU the stream's GPU has no peer path to (libgshm enables peer
 * access where there is one), or in a cuMem mapping the stream's GPU has
 * no access to; -EACCES a read-only cuMem mapping, or a host segment
 * mapped read-only (both as gshm_copy);
 * -ENOENT / -ENODEV no CUDA driver or GPU;
 * -ENOSYS a driver too old, or -ECHILD a forked child (both as
 * gshm_copy); -ENOTSUP the driver refuses
 * stream memory operations on this address and libgshm was built without
 * nvcc; -ENOMEM, -EIO the driver (-ENOMEM also as gshm_copy). */
GSHM_EXTERN int gshm_signal(uint64_t *flag, uint64_t value, void *stream);

/* gshm_copy followed by gshm_signal(flag, value), fused into one kernel
 * when the SM method is chosen and the copy is small (the size is in
 * docs/PERFORMANCE.md "AUTO thresholds"): one block copies, fences
 * system-wide and then stores the flag, one launch instead of two.
 * bytes 0: the signal alone; dst and src may then be NULL, and with
 * either NULL the call is gshm_signal(flag, value, stream) (with stream
 * NULL and no current context: the flag's GPU's primary context, where
 * with both given it is the one the copy would take).  Parameters and
 * errors as for gshm_copy and gshm_signal (flag NULL: -EINVAL; dst or src
 * NULL with bytes > 0: -EINVAL); the flag is checked before the copy is
 * queued, so an error queues nothing. */
GSHM_EXTERN int gshm_copy_signal(void *dst, const void *src, size_t bytes,
                                 gshm_copy_method_t method, uint64_t *flag, uint64_t value,
                                 void *stream);

/* Makes `stream` wait, without the host, until the 64-bit word at `flag`
 * is >= value (cuStreamWaitValue64 with CU_STREAM_WAIT_VALUE_GEQ, i.e.
 * (int64_t)(*flag - value) >= 0; plus CU_STREAM_WAIT_VALUE_FLUSH where the
 * stream's GPU supports flushing remote writes).  Work queued on the stream
 * after this call sees everything the signalling stream wrote before its
 * gshm_signal(flag, v >= value): the signal fences system-wide before its
 * store (cuStreamWriteValue64's default; the kernels' fence.sc.sys then
 * st.release.sys).  Where the waiting GPU cannot flush remote writes
 * (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES 0: no FLUSH), the driver
 * documents nothing past that fence for writes that came over a peer link;
 * tests/gpu/test_signal.c has checked it over NVLink (H100, H200) only.
 * A wait on the legacy default stream (NULL) or a blocking stream holds
 * every blocking stream of its context: a gshm_signal of the same flag
 * queued later in the same process on such a stream never runs (the CUDA
 * stream memory operations' documented deadlock); wait on a non-blocking
 * stream (streams made with torch.cuda.Stream() or cupy.cuda.Stream(
 * non_blocking=True) are; torch's default stream, which the Python
 * bindings use when no stream is given, is the legacy one).
 *  flag    8-byte-aligned device address or page-locked host memory that
 *          this process maps; best on the waiting stream's own GPU (the
 *          wait polls it).
 * Errors: -EINVAL flag NULL, misaligned or in pageable host memory;
 * -EXDEV the flag is on a GPU
 * the stream's GPU has no peer path to, or in a cuMem mapping the stream's
 * GPU has no access to (as gshm_copy); -ENOENT / -ENODEV no driver or
 * GPU; -ENOSYS a driver too old, or -ECHILD a forked child (both as
 * gshm_copy); -ENOTSUP the GPU does not
 * support 64-bit stream memory operations; -ENOMEM, -EIO the driver
 * (-ENOMEM also as gshm_copy). */
GSHM_EXTERN int gshm_wait(const uint64_t *flag, uint64_t value, void *stream);

/* ---- end copy ---- */

#ifdef __cplusplus
}
#endif

#endif
