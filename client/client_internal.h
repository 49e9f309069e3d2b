/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm internals shared by client.c, map.c and map_cuda.c. */
#ifndef GSHM_CLIENT_INTERNAL_H
#define GSHM_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gshm.h"
#include "gshm.pb-c.h"
#include "util.h"
#include "wire.h"

struct gshm__lease;
struct device_map; /* map_cuda.c's */

/* A pull waiting for its replies (cluster.c's pull_request sets
 * gshm_client.pull_wait under the client's lock for the pull's whole
 * wait): read_reply then waits in steps of GSHM_PULL_WAKE_MS, and at each
 * step, and at once when a signal interrupts the wait, sends the
 * PULL_CANCEL that gshm_pull_cancel asked for; a signal also calls
 * on_signal (the pull's progress callback, with the last report's
 * figures again), so that a runtime whose signal handlers run only in its
 * own code (Python's KeyboardInterrupt) gets to run them. */
struct gshm__pull_wait {
  void (*on_signal)(void *arg); /* NULL: none */
  void *arg;
};

/* How often a waiting pull looks at its cancel flag, in milliseconds:
 * short enough for a person's Ctrl-C, one poll(2) a step. */
#define GSHM_PULL_WAKE_MS 100

/* One daemon lease held by this client connection.  gshm_open() of a name
 * this client already holds (same id and generation, enough access, name
 * not unlinked since) shares it: a cached re-open costs no round trip and
 * no driver import (docs/ARCHITECTURE.md "The client's lease cache"). */
struct gshm__lease {
  struct gshm_client *client;
  uint64_t lease_id;       /* 0 when it could not be re-taken after a restart */
  gshm_segment_info_t info;
  gshm_access_t access;
  int fd;                  /* memfd or cuMem POSIX fd; owned */
  int refs;                /* gshm_segment_t objects using this lease */
  bool unlinked;           /* name gone: never served to new opens */
  bool hidden;             /* a GSHM_CREATE_HIDDEN segment not yet published: never served
                              to opens, lost (revoked) with a gshmd restart */
  bool revoked;            /* the daemon ended the lease, or it could not be re-taken after
                              a restart: calls on its segments fail with -ESTALE */
  /* The daemon's proof of this grant (LeaseGrant.lease_token), sent back
   * to re-take the lease after a restart; token_len 0: none given. */
  uint8_t token[32];
  size_t token_len;
  /* The mapping, shared by every segment object of this lease. */
  void *addr;
  uint64_t map_size;
  int map_refs;
  void *device_map;        /* map_cuda.c's state; NULL for host mappings */
  bool ro_listed;          /* a read-only host mapping, in map.c's list (gshm__host_read_only) */
  struct gshm__lease *ro_next; /* ... its next, under GSHM__LOCK_GPUS */
  struct gshm_segment *segs; /* the segment objects on this lease */
  struct gshm__lease *next;
};

struct gshm_segment {
  struct gshm__lease *lease;
  bool mapped;             /* this object holds one of lease->map_refs */
  struct gshm_segment *next; /* in lease->segs */
};

struct gshm_client {
  pthread_mutex_t lock;
  int fd;                  /* -1 while disconnected */
  char *path;
  char name[64];
  uint64_t session_id;
  uint32_t next_request;
  uint64_t capabilities;
  struct gshm__lease *leases;
  char last_error[256];
  uint64_t serial;         /* this process's count of connects at ours: tells a client
                              from a freed one at the same address (gshm_last_error) */
  int reconnect_ms;        /* how long to wait for a restarted daemon */
  int hello_timeout_ms;    /* how long the hello may wait for gshmd's answer; 0: for ever */
  int poll_ns;             /* how long to poll for a reply before sleeping */
  size_t remote_list_max;  /* segments one peer's listing may hold ($GSHM_LIST_MAX lowers
                              GSHM_WIRE_SEGMENTS_MAX) */
  unsigned fork_gen;       /* gshm__fork_gen when connected: see gshm__forked */
  /* gshm__request's last request went out whole, its reply was lost with
   * the connection, and it was sent again: the first may have been done */
  bool resent_after_loss;
  /* gshm_pull_cancel asked (any thread, no lock): the pull in flight sends
   * PULL_CANCEL within GSHM_PULL_WAKE_MS (struct gshm__pull_wait) */
  atomic_bool pull_cancel;
  struct gshm__pull_wait *pull_wait; /* the pull in flight's (NULL: none); under lock */
  struct device_map *retired; /* device mappings to unmap once the lock is let go; under lock */
  uint8_t rx[GSHM_WIRE_MAX_PACKET + 1];
};

/* Whether c was connected by a process this one was forked from: the
 * socket and the lease cache are the parent's, and a request, an event
 * read or a map report sent here would take the parent's replies or end
 * its leases.  Such a child's requests are refused -ECHILD; closing its
 * segments and the client only frees its own copies (nothing, where the
 * lock was copied held: gshm__client_lock). */
bool gshm__forked(struct gshm_client *c);

/* For a call that may fail without a request (gshm_map, gshm_unmap,
 * gshm_read, gshm_write), first: the calling thread's gshm_last_error()
 * says "" for its failure, not an older request's explanation (a request
 * the call makes, a reconnect's hello, writes its own).  No lock: only the
 * thread's own copy changes. */
void gshm__last_error_local(struct gshm_client *c);

/* A name past GSHM_NAME_MAX, refused before any request, with
 * gshm_last_error() saying so as gshmd would: -ENAMETOOLONG (-ECHILD in a
 * forked child), or 0 for a name that fits.  Every call that takes a
 * segment name asks it first (client.c). */
int gshm__name_check_len(struct gshm_client *c, const char *name);

/* Takes c->lock: 0.  In a process forked from the one that connected c,
 * the lock may have been copied held, by a thread this process does not
 * have, and would be waited for for good: there it is only tried, and
 * -ECHILD (not taken) when it is held.  Every user of a client takes its
 * lock through this. */
int gshm__client_lock(struct gshm_client *c);

/* Sends msg as a request of type and waits for its reply, applying any
 * event that arrives first; if the daemon went away, reconnects, re-takes
 * the leases and sends it again, as often as the daemon goes away again
 * within reconnect_ms of the first loss (a gshmd killed as it came back:
 * the requests that may be done twice carry a token gshmd answers a
 * resend from).  Caller holds c->lock.  On success *reply_out is the
 * decoded reply (free with gshm__reply__free_unpacked) and, when fd_out is
 * not NULL, *fd_out the fd that came with it (or -1).  A non-OK status is
 * returned as its negative errno after copying the message to
 * c->last_error; *reply_out is then not set.  c->resent_after_loss says
 * whether the answer is that of a resend (see there). */
int gshm__request(struct gshm_client *c, uint16_t type, const ProtobufCMessage *msg,
                  Gshm__Reply **reply_out, int *fd_out);

/* gshm__request under c->lock, for a request answered once with no fd:
 * the reply must have body want (GSHM__REPLY__BODY__NOT_SET: any), else
 * -EPROTO.  On success *reply_out as gshm__request's; errors as its. */
int gshm__request_body(struct gshm_client *c, uint16_t type, const ProtobufCMessage *msg,
                       Gshm__Reply__BodyCase want, Gshm__Reply **reply_out);

/* Fills token with len random bytes that name one create, revoke or pull
 * (sent again, token and all, after a gshmd restart lost the reply).
 * false while the kernel's random pool is not ready (early at boot:
 * GRND_NONBLOCK, never a wait): the request then goes without one. */
bool gshm__draw_token(uint8_t *token, size_t len);

/* Reads the next reply to the request gshm__request just sent (requests
 * answered more than once: PULL's progress replies), as gshm__request.
 * Caller holds c->lock.  No reconnect: a lost connection is -ECONNRESET. */
int gshm__request_more(struct gshm_client *c, uint16_t type, Gshm__Reply **reply_out);

/* Applies the events already waiting on the socket (no blocking); a
 * connection found dead is reconnected (waiting up to $GSHM_RECONNECT_MS
 * when `wait`, else one attempt), which re-takes every lease.  Returns 0
 * when connected; else -ENOTCONN (no reconnect tried: $GSHM_RECONNECT_MS
 * 0), -ECHILD (a forked child's client), or the failed reconnect's error.
 * Caller holds c->lock. */
int gshm__drain_events(struct gshm_client *c, bool wait);

/* A SegmentInfo from the wire in the public struct. */
void gshm__info_from_wire(gshm_segment_info_t *o, const Gshm__SegmentInfo *i);

/* One page of a list reply: appends its items to the growing array *arr
 * (*n items, room for *cap; grown with realloc) and writes the page's
 * cursor to *next (0: the last page).  0 or -ENOMEM. */
typedef int (*gshm__page_fn)(const Gshm__Reply *reply, void **arr, size_t *n, size_t *cap,
                             uint64_t *next);

/* Pages through list request type (a ListRequest, or a RemoteListRequest
 * naming peer when peer is not NULL) under c's lock: every page's reply
 * must have body want, add() appends its items.  On success *arr_out (the
 * caller frees it) holds *n_out items.  -EINVAL a NULL argument, -EPROTO a
 * reply of another body or a cursor that does not advance, -ENOMEM, or
 * gshm__request's error. */
int gshm__list_all(gshm_client_t *c, uint16_t type, const char *peer, Gshm__Reply__BodyCase want,
                   gshm__page_fn add, void **arr_out, size_t *n_out);
/* The gshm__page_fn of segment lists (SegmentList into gshm_segment_info_t). */
int gshm__list_add_segments(const Gshm__Reply *r, void **arr, size_t *n, size_t *cap,
                            uint64_t *next);

/* Builds a lease of c, and a segment object on it in *seg_out, from a
 * LeaseGrant reply (which the caller still frees) and the fd that came with
 * it (owned: kept in the lease, or closed on error).  A grant carries an
 * fd, or, for a legacy-IPC open, no fd and the 64-byte handle; such a lease
 * has fd -1 and is never served by the lease cache.  Caller holds c->lock.
 * Errors: -EPROTO not a grant, or fd and handle not as above; -ENOMEM. */
int gshm__lease_from_grant(struct gshm_client *c, Gshm__Reply *reply, int fd,
                           gshm_segment_t **seg_out);

/* Removes l's mapping (host munmap or device unmap), whoever holds it, and
 * tells the daemon when `report`.  Returns 0 or the unmap's error.  Caller
 * holds the lock. */
int gshm__lease_unmap(struct gshm__lease *l, bool report);

/* Tells the daemon which devices a lease is mapped on (for gshmctl
 * mappings).  Best effort: errors are ignored.  Caller holds c->lock. */
void gshm__report_mapping(struct gshm_client *c, struct gshm__lease *l, char **uuids, size_t n,
                          bool unmapped);

/* Device segments (map_cuda.c).  Import l->fd, reserve, map and set access
 * on the devices; fills l->addr, l->map_size, l->device_map and, for the
 * mapping report, uuids_out[0..*n_out) (static storage in l->device_map).
 * Errors: as gshm_map() documents. */
int gshm__map_device(struct gshm__lease *l, const int *devices, size_t ndevices,
                     char ***uuids_out, size_t *n_out);
/* A mapped device lease: gives access to devices (as gshm_map() reads the
 * list; NULL: every visible device that reaches the segment's GPU) that
 * lack it, for every holder of the mapping; never removes access.  On
 * success *n_out is 0 when nothing changed, else the mapping's device
 * count with their UUIDs in *uuids_out (as gshm__map_device).  Errors: as
 * gshm_map() documents; -ECHILD a mapping made by a process this one was
 * forked from (CUDA does not survive fork: common/fork.h). */
int gshm__map_device_add(struct gshm__lease *l, const int *devices, size_t ndevices,
                         char ***uuids_out, size_t *n_out);
/* The UUIDs of the devices a mapped device lease is accessible from, in
 * *uuids_out (storage of the mapping); returns their count, 0 for a lease
 * without a device mapping. */
size_t gshm__map_device_uuids(const struct gshm__lease *l, char ***uuids_out);

/* Whether [addr, addr + bytes) lies in a device segment this process
 * mapped with gshm_map, and if so the access GPU `dev` (a CUdevice) has to
 * it: *flags_out CU_MEM_ACCESS_FLAGS_PROT_NONE, _READ or _READWRITE (as
 * cuMemSetAccess was given).  For kernels/copy.c, which refuses a copy,
 * signal or wait its GPU would fault on.  Returns 1 (a gshm mapping), 2
 * (the range is partly in one: it starts in one and runs past its end,
 * or starts before one and runs into it; *flags_out
 * CU_MEM_ACCESS_FLAGS_PROT_NONE), 0 (not one: the driver's own rules
 * apply).  Takes GSHM__LOCK_GPUS. */
int gshm__map_access(uintptr_t addr, size_t bytes, int dev, unsigned long long *flags_out);
/* Whether [addr, addr + bytes) overlaps a host segment this process
 * mapped read-only with gshm_map (a read-only lease: PROT_READ), for
 * kernels/copy.c, which refuses to hand the driver a destination it would
 * write there.  Returns 1 or 0.  Takes GSHM__LOCK_GPUS. */
int gshm__host_read_only(uintptr_t addr, size_t bytes);
/* Ends l's device mapping (accepts an unmapped lease): the lease forgets
 * it and it goes on its client's retired list, which gshm__client_unlock
 * unmaps once the client's lock is let go (gshm__retire_device_maps).  A
 * mapping made by a process this one was forked from is only forgotten
 * (no driver call: it is that process's CUDA state).  Caller holds the
 * client's lock; returns 0. */
int gshm__unmap_device(struct gshm__lease *l);
/* Unmaps the retired device mappings of `list` (taken off c->retired),
 * each after waiting for the work queued in every context that may use
 * it (cuCtxSynchronize: cudaFree's semantics; NVIDIA does not say that
 * cuMemUnmap waits, and PyTorch's expandable segments synchronize before
 * unmapping for that reason, CUDACachingAllocator.cpp unmapHandles).
 * Called without c's lock, which a wait there could deadlock (a
 * gshm_wait queued in a context that another thread's call on c would
 * satisfy).  A mapping whose wait failed but not for good (a stream
 * capture under way refuses it) goes back on c->retired for the next
 * flush, or, with `last` (the client is going), is left mapped and
 * logged.  Returns 0, or -EIO (a driver call failed; logged). */
int gshm__retire_device_maps(struct gshm_client *c, struct device_map *list, bool last);
/* Lets go of c's lock, then unmaps what calls under it retired
 * (gshm__retire_device_maps).  Returns 0 or that -EIO. */
int gshm__client_unlock(struct gshm_client *c);

/* Copies the bytes of a mapped device segment to or from host memory
 * through a staging copy (for gshmctl read/write).  offset and bytes in
 * bytes, within the segment.  -ECHILD for a mapping made by a process
 * this one was forked from (as gshm__map_device_add). */
int gshm__device_rw(struct gshm__lease *l, uint64_t offset, void *host, size_t bytes, bool write);

#endif
