/* SPDX-License-Identifier: Apache-2.0 */
/* The memory backends behind gshmd's segments.
 *
 * A backend allocates memory for one location kind, hands out a file
 * descriptor for each open, and frees.  The registry owns the only
 * reference to each allocation (struct gshmd_alloc); fds handed to clients
 * keep the memory alive on their own (memfd, cuMem POSIX fd), which is
 * what lets gshmd park them in systemd's fd store across restarts. */
#ifndef GSHMD_BACKEND_H
#define GSHMD_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "gshm.pb-c.h"
#include "util.h"

struct gshmd_config;
struct gshmd_backend;

/* Bytes of a sticky CUDA error's description (gshmd_backend.fault),
 * NUL included. */
#define GSHMD_FAULT_MAX 96

/* Which users a client fd of an allocation ever went to (the host
 * backend's recycling hands memory back only to that one user: page
 * references that a mapping let a process take, such as a pipe's after
 * vmsplice, outlive the mapping and every fd; docs/SECURITY.md). */
/* The most host allocations daemon.host_recycle keeps mapped, in its pool
 * and again among live pulled segments (backend_host.c): each is an fd
 * and a mapping (a VMA of vm.max_map_count, 65530 by default). */
#define GSHMD_HOST_RECYCLE_MAX 4096

enum gshmd_reach { GSHMD_REACH_NONE = 0, GSHMD_REACH_ONE, GSHMD_REACH_MANY };

/* One allocation. */
struct gshmd_alloc {
  struct gshmd_backend *backend;
  uint64_t size;                     /* bytes allocated (rounded up) */
  uint64_t granularity;              /* bytes */
  int device_index;                  /* daemon's GPU index; -1 host */
  char location[GSHM_LOCATION_MAX];  /* canonical: "host", "cuda:GPU-<uuid>" */
  void *priv;                        /* backend-specific */
  enum gshmd_reach reach;            /* the users its client fds went to */
  uint32_t reach_uid;                /* the one, when reach is GSHMD_REACH_ONE */
  /* set before ->local_done: the mapping was handed to UCX (a pull over
   * UCX), whose registration cache may keep it registered, and a peer's
   * rkey valid, for as long as it stays mapped: it goes, never recycled */
  bool no_recycle;
};

/* Records that a client of uid is handed a's fd (every path that sends
 * one calls it). */
static inline void gshmd_alloc_note_reach(struct gshmd_alloc *a, uint32_t uid) {
  if (a->reach == GSHMD_REACH_NONE) {
    a->reach = GSHMD_REACH_ONE;
    a->reach_uid = uid;
  } else if (a->reach == GSHMD_REACH_ONE && a->reach_uid != uid) {
    a->reach = GSHMD_REACH_MANY;
  }
}

struct gshmd_backend_ops {
  /* Optional: refuses, before anything is allocated, a size that loc can
   * never hold (host: more than the machine's or gshmd's cgroup's
   * memory), writing why, with the figures, into msg (cap bytes).
   * Returns 0 or -EFBIG. */
  int (*check_size)(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
                    char *msg, size_t cap);
  /* Allocates size bytes (> 0) at loc.  debug_name labels the memory
   * (memfd name).  flags: GSHM__SEGMENT_FLAG__* bits.  *out is owned by
   * the caller until ->free.  Errors: -ENOMEM, -ENODEV, -EINVAL, -ENOTSUP,
   * -EIO. */
  int (*alloc)(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
               uint32_t flags, const char *debug_name, struct gshmd_alloc **out);
  /* Optional: size bytes (> 0) for a pull's new segment, owned by uid,
   * whose bytes [0, size) may hold anything: the caller writes every one
   * before anyone but gshmd can read it; the tail past size reads zeros.
   * Host: labelled neutrally (no segment name: the memory may serve
   * several segments), from the recycling pool (daemon.host_recycle)
   * when it holds memory of the same allocated size that no client of
   * another user ever reached, else new as ->alloc; such an allocation
   * may enter the pool at ->discard; never populated
   * (daemon.host_populate): its pages come as the pull writes them.
   * Cuda: not zeroed below size, and
   * mapped in gshmd at once (->local_ptr).  Errors as ->alloc. */
  int (*alloc_pull)(struct gshmd_backend *b, const struct gshm_location *loc, uint64_t size,
                    uint32_t uid, struct gshmd_alloc **out);
  /* The fd to send to one client: read-write, or read-only when !writable
   * (where the backend can enforce it).  It is lent, not given: it stays
   * the allocation's and is valid until ->free; the caller sends it
   * (SCM_RIGHTS makes the client's own copy) and does not close it.
   * Saves a dup and a close per open (callgrind, gshm-bench control).
   * Host: an open file description of its own, never the one gshmd
   * allocated with (which only gshmd and the fd store hold: see
   * ->discard). */
  int (*export_fd)(struct gshmd_backend *b, struct gshmd_alloc *a, bool writable, int *fd_out);
  /* Optional: a 64-byte cudaIpcMemHandle for a LEGACY_IPC allocation. */
  int (*export_legacy_ipc)(struct gshmd_backend *b, struct gshmd_alloc *a,
                           uint8_t handle_out[64]);
  /* Optional: the fd that keeps the memory alive in systemd's fd store
   * (lent as export_fd's: valid until ->free, not closed by the caller;
   * host: gshmd's own open file description, never sent to a client),
   * and the inverse: adopt such an fd after a restart (takes ownership of
   * fd on success).  park_fd returns -ENOTSUP for an allocation that can
   * never be parked (legacy IPC: not retried); other errors are retried. */
  int (*park_fd)(struct gshmd_backend *b, struct gshmd_alloc *a, int *fd_out);
  int (*adopt_fd)(struct gshmd_backend *b, int fd, const char *location, uint64_t size,
                  struct gshmd_alloc **out);
  /* Optional: gives the allocation's pages back now, when gshmd frees a
   * segment for good (not at shutdown, where parked fds keep it for the
   * next start).  Clients may still hold copies of its fd: without this
   * they would keep the memory alive outside every quota (host: the
   * memfd's pages are punched out, so a stray fd reads zeros and holds
   * nothing until it writes again).  The device backend has none: the
   * driver offers no revoke (docs/SECURITY.md).  Host, with
   * daemon.host_recycle: memory of ->alloc_pull that no other process
   * can reach any more keeps its pages and gshmd's mapping in the
   * recycling pool instead. */
  void (*discard)(struct gshmd_backend *b, struct gshmd_alloc *a);
  /* Optional: the allocation's address in gshmd itself (mapped on first
   * use, unmapped by ->free or ->local_done), read-write: cuda for the
   * cluster's device paths (UCX registration, copies), host for a pull's
   * chunks to land in.  Errors: -EIO (cuda), -ENOMEM (host). */
  int (*local_ptr)(struct gshmd_backend *b, struct gshmd_alloc *a, void **ptr_out);
  /* Optional (host): the caller of local_ptr is done with the address;
   * the mapping goes, unless the allocation may be recycled (its page
   * tables are what recycling saves). */
  void (*local_done)(struct gshmd_backend *b, struct gshmd_alloc *a);
  /* Optional (host): hands local_ptr's mapping (a->size bytes) to the
   * caller, who munmaps it: ->free no longer does, and the memory is
   * never recycled (a UCX receive may still write there after the
   * segment is freed: daemon/cluster/pull.c).  Returns the address, or
   * NULL when a has no mapping. */
  void *(*local_take)(struct gshmd_backend *b, struct gshmd_alloc *a);
  /* Optional (cuda): copies len bytes between the allocation at offset
   * and host memory (pinned for speed), synchronously; to_device: host
   * to allocation.  May run on any thread (libuv's pool).  Errors:
   * -EINVAL range, -EIO. */
  int (*copy_host)(struct gshmd_backend *b, struct gshmd_alloc *a, uint64_t offset, void *host,
                   uint64_t len, bool to_device);
  /* Optional (cuda): size bytes of page-locked host memory, and its
   * release (the same size); called on libuv's pool threads (the
   * cluster's staging buffers, two at a time), never on the loop.
   * Errors: -ENOMEM, -EIO. */
  int (*host_alloc)(struct gshmd_backend *b, uint64_t size, void **ptr_out);
  void (*host_free)(struct gshmd_backend *b, void *ptr, uint64_t size);
  /* Releases the allocation; accepts NULL. */
  void (*free)(struct gshmd_backend *b, struct gshmd_alloc *a);
  /* Optional: fills the device list (cuda). */
  int (*devices)(struct gshmd_backend *b, Gshm__DeviceList *list_out);
  void (*destroy)(struct gshmd_backend *b);
};

struct gshmd_backend {
  const char *name; /* "host", "cuda" */
  const struct gshmd_backend_ops *ops;
  unsigned ndevices;
  void *priv;
  /* Set once (atomically, from whichever thread's call found it: the
   * loop's, or libuv's pool's in a copy) by a backend that can serve
   * nothing more until gshmd restarts (cuda: a sticky context error,
   * gshm__cuda_sticky), after it logged why; never cleared.  gshmd's loop
   * reads it once a second and stops for a restart (daemon/main.c).
   * From then on ->free and ->destroy make no driver calls: the memory
   * stays where the fd store keeps it, as after a SIGKILL. */
  bool needs_restart;
  /* What the first such error was, for STATUS=, `gshmctl status` and the
   * metrics: "<PCI bus id>: <CUDA error name>" ("cuda: ..." where no GPU
   * is named).  Written once, by the thread that set needs_restart, just
   * after it: read it only where that thread's writes are seen (gshmd's
   * start, single-threaded). */
  char fault[GSHMD_FAULT_MAX];
};

/* Whether b (NULL: no) asked for a restart (needs_restart). */
static inline bool gshmd_backend_needs_restart(const struct gshmd_backend *b) {
  return b && __atomic_load_n(&b->needs_restart, __ATOMIC_ACQUIRE);
}

/* The backend of device segments that the fd store handed back but no
 * GPU of this gshmd can take (no CUDA backend: its driver missing or
 * failing to start; or the GPU of their location gone): each keeps its
 * fd (adopt_fd takes a "cuda:..." location), so the store keeps it and a
 * later gshmd whose driver works adopts it with its bytes, where
 * dropping it lost them for good.  Meanwhile its name stays taken, it
 * is listed, counts against quotas, can be unlinked (its fd closed) and
 * cannot be opened or served: export_fd returns -ENODEV.  It has no alloc
 * (never chosen for a create) and no destroy: one static instance. */
struct gshmd_backend *gshmd_backend_parked(void);

/* Why a parked segment cannot be opened, for the client: gpu_fault, the
 * GPUs are unusable (a sticky CUDA error at start: registry.gpu_fault,
 * not gpu_no_driver), else no GPU of this gshmd takes it (no driver
 * among the reasons).  A static string. */
const char *gshmd_backend_parked_why(bool gpu_fault);

/* Host memory: sealed memfds.  Never fails but for -ENOMEM. */
int gshmd_backend_host_create(const struct gshmd_config *cfg, struct gshmd_backend **out);

/* What gshmd asks of its own mapping of a host segment (len bytes at
 * addr; a pull's landing mapping, a serving one): never in a core dump
 * (other users' bytes), and where huge (daemon.host_huge_pages) 2 MiB
 * pages where the kernel gives shared memory huge pages on request: a
 * pull's bytes land in such a mapping, and making 4 KiB pages bounds a
 * pull into a new segment (docs/PERFORMANCE.md "Huge pages for new host
 * segments").  Advice only: nothing to fail. */
void gshmd_host_map_advise(void *addr, uint64_t len, bool huge);

/* What gshmd rounds its host memory to where it asks for huge pages
 * (pulled host segments, pinned staging memory): util.h's. */
#define GSHMD_HUGE_PAGE GSHM__HUGE_PAGE

/* The kernel's transparent huge page policy in file (a file of
 * /sys/kernel/mm/transparent_hugepage/: "enabled" for anonymous memory,
 * "shmem_enabled" for shared memory): its bracketed word ("never",
 * "madvise", "advise", ...) into out (cap bytes).  false (out "") where
 * the file is missing or says no word. */
bool gshmd_thp_policy(const char *file, char *out, size_t cap);

/* The host backend's recycling (daemon.host_recycle), for the metrics. */
struct gshmd_host_recycle_stats {
  uint64_t pulls;        /* pulled segments that landed in recycled memory */
  uint64_t bytes_held;   /* bytes in the pool now */
  uint64_t entries;      /* allocations in the pool now */
  uint64_t refused_held; /* frees not kept: another open file description or mapping */
};
/* Fills *out from host backend b (zeros when b is NULL). */
void gshmd_backend_host_recycle_stats(const struct gshmd_backend *b,
                                      struct gshmd_host_recycle_stats *out);

/* Bytes of memory a new host allocation of gshmd can still take: the
 * machine's MemAvailable + SwapFree (/proc/meminfo; a memfd's pages can
 * swap), or the least that gshmd's memory cgroup or any ancestor with a
 * memory limit leaves where less (limit less usage: cgroup v2 memory.max
 * and memory.current, v1 memory.limit_in_bytes and memory.usage_in_bytes;
 * a systemd MemoryMax=, a container's limit; the cgroup's swap is not
 * counted).  The machine's figure has the bytes that punches queued on
 * the reaper thread will give back added (host_reap.h
 * gshmd_host_reap_pending: the figures do not show them free yet); the
 * cgroup's has not (a client's pages are charged to its own cgroup).
 * Memory daemon.host_recycle keeps is not counted either: only
 * a pull can land in it (gshmd_backend_host_recycle_stats).  The figures
 * are read at most every 100 ms and shared with the create size check
 * (host_memory.h), so the answer may be up to that old; again at once
 * after a punch step ended.  b: the host
 * backend, not taken.  Returns UINT64_MAX where no figure could be read
 * (no bound known) or b is NULL or another backend; never fails. */
uint64_t gshmd_backend_host_room(struct gshmd_backend *b);

/* Whether host backend b makes pulls of 2 MiB or more in 2 MiB pages
 * (daemon.host_huge_pages on, and shmem_enabled lets it).  false when b
 * is NULL. */
bool gshmd_backend_host_huge_pulls(const struct gshmd_backend *b);

/* Whether host backend b's pulls build their 2 MiB pages themselves
 * (gshmd_host_collapse, host_memory.h: shmem_enabled is never and
 * MADV_COLLAPSE works here, daemon.host_huge_pages on), each 2 MiB page
 * as its first chunk's bytes come.  false when b is NULL or another
 * backend. */
bool gshmd_backend_host_collapse(const struct gshmd_backend *b);

/* Host allocation a's memfd (gshmd's own: never sent, valid while a
 * lives; not taken), or -1 where a is NULL or another backend's. */
int gshmd_backend_host_memfd(const struct gshmd_alloc *a);

/* GPU memory through the CUDA driver's VMM API.  cfg: unused (may be
 * NULL).  fault_out (NULL: not wanted; GSHMD_FAULT_MAX bytes): written
 * only with -ENOTRECOVERABLE, with what the error was (as
 * gshmd_backend.fault).  Errors: -ENOENT/-ENOSYS/-ENODEV no usable driver
 * or device (logged once); -ENOTRECOVERABLE a sticky CUDA error
 * (gshm__cuda_sticky, logged) while setting up a GPU: this process's CUDA
 * state is unusable for good (needs_restart); -ENOMEM. */
int gshmd_backend_cuda_create(const struct gshmd_config *cfg, struct gshmd_backend **out,
                              char *fault_out);

#endif
