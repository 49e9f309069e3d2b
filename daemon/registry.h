/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's registry: segments, leases and clients (docs/ARCHITECTURE.md
 * "Objects").
 *
 * Single-threaded (the libuv loop).  Lookups by name and id use glibc's
 * tsearch trees (O(log n)); ordered lists keep listing and pagination by
 * id cheap, since ids only grow. */
#ifndef GSHMD_REGISTRY_H
#define GSHMD_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "backend.h"
#include "list.h"
#include "seg_index.h"
#include "wire.h"

struct gshmd_config;
struct gshmd_fdstore;

struct gshmd_segment {
  uint64_t id;
  uint64_t generation;
  char *name;
  uint64_t requested_size;
  struct gshmd_alloc *mem;
  uid_t uid;
  gid_t gid;
  uint32_t mode;
  uint32_t flags;
  bool unlinked;
  /* Adopted from the fd store at this start: leases granted before the
   * restart may still be held by clients that have not re-taken them yet,
   * which gshmd cannot count (docs/ARCHITECTURE.md "The fd store"). */
  bool restored;
  int64_t created_ns;
  uint32_t nleases;
  struct gshm_list leases;   /* gshmd_lease.seg_node */
  struct gshm_list node;     /* registry.segments, id order */
  uint32_t fs_bucket;        /* fd store: its bucket's number + 1; 0: none */
  uint32_t fs_slot;          /* fd store: its place in that bucket */
  /* fd store: the publish that named it (its largest id; 0: none) and
   * that publish's stored members, kept in its records until the store
   * has recorded the publish complete (StateRecord.publish). */
  uint64_t fs_publish;
  uint32_t fs_publish_n;
  /* fd store: the publish that took its name (--replace), until the store
   * has recorded that publish complete: its record says so
   * (StateRecord.replaced_by), and it is not freed before (a crash may
   * yet undo the publish and give the name back).  Or its own publish,
   * for a member unlinked and let go before then (GSHMD_SEGMENT_RELEASE:
   * freed, its set would look cut short).  0: none. */
  uint64_t fs_replaced;
  /* fd store: revoked while it was held for its publish (GSHMD_SEGMENT_
   * REVOKED): out of the registry, its pages discarded, its record and
   * allocation the fd store's until it frees them
   * (gshmd_registry_revoked_dispose). */
  bool fs_revoked;
  void *fs_record;           /* fd store: its record packed (fdstore_record.c); freed with it */
  char *source;              /* pulled from a peer: "PEER:NAME#ID.GEN" (heap); else NULL */
  /* CreateRequest.create_token of the create that made it (has_token):
   * a resend of that create after a restart is answered with it */
  uint8_t create_token[GSHM_CREATE_TOKEN_BYTES];
  bool has_token;
  void *cluster_export;      /* daemon/cluster/serve.c: its UCX registration, if served */
  /* Hidden (gshmd_registry_create_hidden) until published.  unlinked on
   * a hidden segment: discarded while leased, freed with its last lease. */
  bool hidden;
  /* Hidden by a client's own create (SEGMENT_FLAG_HIDDEN), not by a
   * pull: its creator's lease is all that keeps it, until that client
   * publishes it (gshmd_registry_publish_lease). */
  bool local;
  void *cluster_relay;       /* daemon/cluster/relay.c: its landed chunks, while pulled */
};

/* Credentials of a connection, from SO_PEERCRED and SO_PEERGROUPS. */
struct gshmd_cred {
  pid_t pid;
  uid_t uid;
  gid_t gid;
  gid_t *groups;             /* ngroups supplementary groups (all of them:
                                SO_PEERGROUPS); heap, owned by the holder
                                of this cred (connection or client) */
  int ngroups;
  bool admin;                /* root or a member of the admin group */
};

struct gshmd_client {
  uint64_t session_id;
  struct gshmd_cred cred;
  char name[64];
  int64_t since_ns;
  uint32_t nleases;
  struct gshm_list leases;   /* gshmd_lease.client_node */
  struct gshm_list node;     /* registry.clients, id order */
  void *conn;                /* the server's connection */
};

/* Bytes of a lease token (daemon/leasekey.c: crypto_auth's MAC). */
#define GSHMD_LEASE_TOKEN_BYTES 32

struct gshmd_lease {
  uint64_t id;
  struct gshmd_segment *seg;
  struct gshmd_client *client;
  int access;                /* GSHM__ACCESS__* */
  int64_t since_ns;
  bool mapped;
  char *mapped_devices;      /* comma-separated UUIDs; NULL: none reported */
  uint32_t mapped_count;     /* UUIDs in mapped_devices */
  bool has_token;            /* token is set (the registry has a token_make) */
  uint8_t token[GSHMD_LEASE_TOKEN_BYTES]; /* proof of this grant (LeaseGrant.lease_token) */
  struct gshm_list seg_node;
  struct gshm_list client_node;
  struct gshm_list node;     /* registry.leases, id order */
};

enum gshmd_segment_event {
  GSHMD_SEGMENT_CREATED = 1,
  GSHMD_SEGMENT_UNLINKED = 2,
  GSHMD_SEGMENT_FREED = 3,
  GSHMD_SEGMENT_CHANGED = 4, /* owner or mode */
  GSHMD_IDS_USED = 5,        /* a session or lease id was handed out; seg is NULL */
  /* Around the CREATED events of one publish of many segments (a pulled
   * set), seg NULL: the fd store writes each bucket they touch once, at
   * the END, instead of once a segment. */
  GSHMD_PUBLISH_BEGIN = 6,
  GSHMD_PUBLISH_END = 7,
  /* Between those: seg, live, loses its name to the publish (--replace)
   * and is unlinked after the END.  The fd store may hold it (sets
   * seg->fs_replaced at the END): its unlink is then already written, and
   * it is not freed until gshmd_registry_release_replaced. */
  GSHMD_SEGMENT_REPLACED = 8,
  /* seg, unlinked and unleased, of a publish (seg->fs_publish), is about
   * to be freed: the fd store may hold it (sets seg->fs_replaced to its
   * own publish) until it has recorded that publish complete, and frees
   * nothing during this event.  Freed before, a crash found its set short
   * of a member and dropped the others, which the puller had been told
   * of.  It is then freed by gshmd_registry_release_replaced. */
  GSHMD_SEGMENT_RELEASE = 9,
  /* seg, of a publish (seg->fs_publish), revoked, its leases ended, is
   * about to be freed: the fd store may keep it (sets seg->fs_revoked)
   * until it has recorded that publish complete.  The free then takes it
   * out of every tree, list and count and discards its pages, but leaves
   * its record and allocation to the store (no GSHMD_SEGMENT_FREED
   * effect there), which frees them with gshmd_registry_revoked_dispose.
   * Freed before, a crash found its set short of a member and dropped
   * the others, which the puller had been told of. */
  GSHMD_SEGMENT_REVOKED = 10,
};

struct gshmd_registry {
  const struct gshmd_config *cfg;
  struct gshmd_backend *host;  /* never NULL once set up */
  struct gshmd_backend *cuda;  /* NULL when unavailable */
  void *by_name;               /* tsearch root: live (not unlinked) segments */
  void *by_id;                 /* tsearch root: every segment */
  void *lease_by_id;           /* tsearch root: every lease */
  struct gshm_list segments, clients, leases;
  struct gshmd_seg_index seg_index; /* segments by id, with a lower bound */
  struct gshmd_seg_index lease_index; /* leases by id, likewise */
  uint64_t next_segment_id, next_generation, next_lease_id, next_session_id;
  uint32_t nsegments, nclients, nleases;
  uint64_t bytes;              /* allocated by all segments */
  /* Counts every change of what peers may see of the segments (one made,
   * published, freed, unlinked or unnamed; a mode or owner changed): the
   * cluster recounts its exported segments only after one. */
  uint64_t changes;
  /* Events, for the fd store (daemon/fdstore.c): called after a create,
   * an unlink, an owner or mode change, just before the memory is freed,
   * and after a session or lease id is taken (GSHMD_IDS_USED, seg NULL). */
  void (*on_event)(struct gshmd_registry *r, struct gshmd_segment *seg, int event);
  void *on_event_data;         /* on_event's context (the fd store) */
  /* The fd store, for its resend memo (requests_revoke.c, cluster
   * pulls: gshmd_fdstore_memo_put); NULL without one.  Set by
   * gshmd_fdstore_setup. */
  struct gshmd_fdstore *fdstore;
  /* Kept by the fd store for metrics: segments it is behind by, failed
   * notifications. */
  uint32_t fdstore_pending;
  uint64_t fdstore_failed_sends;
  uint64_t fdstore_fds_held;   /* memory fds queued in the buckets (in flight) */
  void *usage_root;            /* tsearch root: per-uid usage (quotas) */
  /* Shutting down: segments freed from now on (connections ending) keep
   * their pages, parked in the fd store for the next start and still
   * mapped by their clients (a client's hidden segment, in no fd store,
   * only in its creator's mapping or fd); otherwise a freed host
   * segment's pages are punched out (backend discard). */
  bool stopping;
  /* The message of the last refused request (fmt_msg); valid until the
   * next registry call. */
  char msgbuf[512];
  /* The cluster (daemon/cluster/serve.c): called just before a segment's memory
   * is freed, to drop its UCX registration (seg->cluster_export). */
  void (*on_free)(struct gshmd_registry *r, struct gshmd_segment *seg);
  void *on_free_arg;
  /* The server (server.c): called by gshmd_registry_publish for each
   * leased segment a publish replaces, before it is unlinked, to tell its
   * lease holders (as an unlink's requester does).  It must not end
   * leases or free segments. */
  void (*on_replaced)(void *arg, struct gshmd_segment *seg);
  void *on_replaced_arg;
  /* Lease tokens (daemon/leasekey.c; both NULL: none issued, re-takes are
   * checked against the mode).  token_make writes the token of a grant of
   * access on seg to a client of uid; token_check says whether token (len
   * bytes, from the client) is exactly that, in constant time. */
  void (*token_make)(void *arg, const struct gshmd_segment *seg, uid_t uid, int access,
                     uint8_t out[GSHMD_LEASE_TOKEN_BYTES]);
  bool (*token_check)(void *arg, const struct gshmd_segment *seg, uid_t uid, int access,
                      const uint8_t *token, size_t len);
  void *token_arg;
  /* The lease key came back from the fd store (leasekey.c): the tokens
   * of before the restart still check, so its grace period lets nobody
   * open an unlinked segment without one (gshmd_registry_open). */
  bool tokens_restored;
  /* False while a restart's grace period for re-takes may be on: from
   * init until gshmd_registry_grace_begin finds nothing restored or
   * gshmd_registry_reap_unlinked ends the period.  Until then an unlinked
   * restored segment nobody has re-taken is kept. */
  bool restore_grace_over;
  /* Hidden segments (gshmd_registry_create_hidden): allocated and charged
   * to their owner, in no tree and no listing, never told to the fd store
   * (a restart cannot bring one back); gshmd_segment.node links them. */
  struct gshm_list hidden;
  uint32_t nhidden;
  /* A sticky CUDA error at start left the GPUs unusable to this gshmd
   * (daemon/gpu_fault.c): what it was ("<PCI bus id>: <CUDA error
   * name>"), "" while none; or the CUDA driver did not start while the
   * fd store held device segments (gpu_no_driver; gpu_fault.h
   * GSHMD_NO_DRIVER_PREFIX and why).  Device segments are parked and
   * device creates refused (-ENODEV) while it is set; it is never cleared
   * (the process cannot use CUDA again, or does not try). */
  char gpu_fault[GSHMD_FAULT_MAX];
  bool gpu_no_driver;
  uint64_t gpu_probes;         /* GPU probes run since (gpu_fault.c) */
};

void gshmd_registry_init(struct gshmd_registry *r, const struct gshmd_config *cfg);
/* Frees everything (clients, leases, segments and their memory). */
void gshmd_registry_destroy(struct gshmd_registry *r);

/* Registers a connection that said hello; the client gets its own copy of
 * cred, groups included.  (quota.connections is the server's, counted at
 * accept over every connection of the uid: server.c over_uid_quota.)
 * Errors: -ENOMEM. */
int gshmd_registry_client_add(struct gshmd_registry *r, const struct gshmd_cred *cred,
                              struct gshmd_client **c_out);
/* Ends every lease of the client and frees it. */
void gshmd_registry_client_remove(struct gshmd_registry *r, struct gshmd_client *c);

/* Creates a segment and a read-write lease on it for c; with
 * SEGMENT_FLAG_HIDDEN in req->flags a hidden one (as
 * gshmd_registry_create_hidden, the name not checked until published;
 * seg->local), which ends with that lease.  A create resent
 * after a restart (req->create_token: GSHM_CREATE_TOKEN_BYTES bytes, the
 * same as that of the segment of that name, made by c's uid with the
 * same size, location and flags) gets a read-write lease of that segment
 * instead, as the first would have (*resent_out true, else false;
 * resent_out may be NULL).  Errors as gshm_create() documents (-EINVAL
 * also for a token of another length); *msg_out may point at a static or
 * registry buffer explaining the failure. */
int gshmd_registry_create(struct gshmd_registry *r, struct gshmd_client *c,
                          const Gshm__CreateRequest *req, struct gshmd_lease **lease_out,
                          bool *resent_out, const char **msg_out);

/* A hidden segment: what gshmd_registry_create checks and allocates (the
 * same errors, except that the name may be taken: it is checked when the
 * segment is published), owned by c's uid and charged to its quota, but
 * with no id, no lease and no name anyone can see: not listed, not
 * opened, not stat'ed, not exported, and not in the fd store, so a
 * restart frees it with the process.  *seg_out is the registry's: give it
 * to gshmd_registry_publish or gshmd_registry_discard_hidden. */
int gshmd_registry_create_hidden(struct gshmd_registry *r, struct gshmd_client *c,
                                 const Gshm__CreateRequest *req, struct gshmd_segment **seg_out,
                                 const char **msg_out);
/* Frees a hidden segment (pages discarded) and its quota charge; the
 * leases it has (peers' grants: gshmd_registry_lease_hidden) end first,
 * as a revoke ends them. */
void gshmd_registry_discard_hidden(struct gshmd_registry *r, struct gshmd_segment *seg);
/* A lease of c on hidden segment seg (a peer relaying a pull in flight:
 * daemon/cluster/relay.c), without a permission check: the caller made
 * it.  It keeps seg's memory while held, until a discard ends it; the
 * lease stays valid when seg is published.  Errors: -ESTALE seg was discarded,
 * -EDQUOT quota.leases, -ENOMEM. */
int gshmd_registry_lease_hidden(struct gshmd_registry *r, struct gshmd_client *c,
                                struct gshmd_segment *seg, int access,
                                struct gshmd_lease **lease_out, const char **msg_out);
/* Makes the n hidden segments segs live under their
 * names, all in one step of the loop: no client sees some and not the
 * others.  A name a live segment holds is refused (-EEXIST) unless
 * replace, which needs c to own that segment or be an admin (-EACCES) and
 * unlinks it in the same step (its lease holders keep it until they let
 * go, and are told through on_replaced).  The fd store is told of the
 * new segments (CREATED) and the replaced ones (REPLACED) as one publish;
 * a replaced one it holds (seg->fs_replaced) is kept, even unleased,
 * until gshmd_registry_release_replaced.  On error nothing changed and
 * the segments stay hidden.  Errors: -EEXIST, -EACCES, -EINVAL two of
 * segs share a name, -ENOMEM. */
int gshmd_registry_publish(struct gshmd_registry *r, struct gshmd_client *c,
                           struct gshmd_segment *const *segs, size_t n, bool replace,
                           const char **msg_out);

/* PUBLISH: makes the hidden segment of c's lease lease_id (one c made
 * with SEGMENT_FLAG_HIDDEN) live under its name, as gshmd_registry_publish
 * does for one segment (replace: the rules of an unlink), and gives the
 * lease a token for the segment's new id and generation.  *lease_out: that
 * lease.  Errors: -ESTALE c holds no such lease (a restart ended it, or c
 * closed it); -EINVAL the lease's segment is not a hidden one of c's
 * create (published already, or another's); -EEXIST, -EACCES, -ENOMEM as
 * gshmd_registry_publish.  *msg_out says why. */
int gshmd_registry_publish_lease(struct gshmd_registry *r, struct gshmd_client *c,
                                 uint64_t lease_id, bool replace, struct gshmd_lease **lease_out,
                                 const char **msg_out);

/* A PUBLISH sent again after a restart lost its reply, whose first one
 * published segment id (the fd store's resend memo): a new read-write
 * lease of c on that segment, as the first one's lease re-taken would be
 * (unlinked or replaced since, it is still the one).  *lease_out: the
 * lease.  Errors: -ESTALE no segment has that id (the restart came before
 * the publish reached the store: the hidden segment is lost; or it was
 * freed since, as the first lease would have been), or it is no longer
 * c's uid's (an admin gave it to another user: the same answer); -EDQUOT,
 * -ENOMEM as a lease's.  *msg_out says why. */
int gshmd_registry_publish_resent(struct gshmd_registry *r, struct gshmd_client *c, uint64_t id,
                                  struct gshmd_lease **lease_out, const char **msg_out);

/* The fd store has recorded complete the publish that replaced seg and
 * cleared seg->fs_replaced: seg, when unlinked and unleased, is freed now
 * (a restored one at the end of the grace period, as an unlink's). */
void gshmd_registry_release_replaced(struct gshmd_registry *r, struct gshmd_segment *seg);

/* Restore: seg, adopted from a record that says revoked and marked
 * seg->fs_revoked by the fd store, leaves the registry as a revoke's
 * does (its pages discarded); the fd store keeps the rest. */
void gshmd_registry_drop_revoked(struct gshmd_registry *r, struct gshmd_segment *seg);

/* Frees a revoked segment the fd store kept (seg->fs_revoked, out of the
 * registry; the store has let go of its record): its allocation and
 * itself.  Its pages went at the revoke. */
void gshmd_registry_revoked_dispose(struct gshmd_segment *seg);

/* Opens by name, or re-takes a lease by id and generation, and adds a
 * lease.  A re-take whose lease_token token_check accepts gets the access
 * it was granted with, whatever the segment's mode, owner or name are now;
 * any other open is checked against the mode, and one by id of an
 * unlinked segment is only for its owner and admins (and, during a
 * restart's grace period, for anyone its mode allows).  Errors: -EINVAL
 * bad access or name, -ENAMETOOLONG, -ENOENT no such name, -ESTALE the id
 * is gone, has another generation, is one c may not see (GSHMD_ID_GONE)
 * and its mode refuses, or is unlinked and c may not open it anew,
 * -EACCES, -ENOTSUP legacy IPC not allowed, -EDQUOT quota.leases,
 * -ENOMEM. */
int gshmd_registry_open(struct gshmd_registry *r, struct gshmd_client *c,
                        const Gshm__OpenRequest *req, struct gshmd_lease **lease_out,
                        const char **msg_out);

/* Ends a lease of c; -ENOENT when c holds no such lease. */
int gshmd_registry_close(struct gshmd_registry *r, struct gshmd_client *c, uint64_t lease_id);

int gshmd_registry_unlink(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                          const char **msg_out);

/* Changes mode bits: owner or admin.  Errors: -ENOENT, -EACCES, -EINVAL. */
int gshmd_registry_chmod(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                         uint32_t mode, const char **msg_out);

/* Changes owner (admin only) and/or group (owner: a group it is in;
 * admin: any).  uid/gid < 0: unchanged.  Quota usage moves with the owner.
 * Errors: -ENOENT, -EACCES, -EPERM (owner change by a non-admin), -EINVAL. */
int gshmd_registry_chown(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                         int64_t uid, int64_t gid, const char **msg_out);

/* Admin only: ends every lease of the segment named name, or of id
 * segment_id when that is not 0 (any segment but a hidden one, an
 * unlinked one too: its holders keep it alive as long as they like),
 * unlinks and frees it (a host segment's pages are punched out: its
 * holders' mappings read zeros, and their re-takes after a restart find
 * the id gone).  The caller tells the lease holders first.  Errors:
 * -ENOENT (-ESTALE for an id), -EPERM. */
int gshmd_registry_revoke(struct gshmd_registry *r, struct gshmd_client *c, const char *name,
                          uint64_t segment_id, const char **msg_out);

/* Records what c reported of its lease lease_id's mapping: mapped or not
 * (unmapped), on the devices uuids[0..n) (at most GSHM_WIRE_MAP_DEVICES_MAX,
 * as many as libgshm maps on, each 1 to 47 bytes of printable ASCII
 * (0x21..0x7e) without a ','; kept as one string of at most 3 KiB per
 * lease), shown by the lease
 * listing (its first 8: server.h GSHMD_LEASE_DEVICES, with their count
 * in all).  Errors: -ENOENT c holds no
 * such lease, -EINVAL, -ENOMEM. */
int gshmd_registry_map_report(struct gshmd_registry *r, struct gshmd_client *c, uint64_t lease_id,
                              const char *const *uuids, size_t n, bool unmapped,
                              const char **msg_out);

/* Takes back the grant of c's lease lease_id, whose fd never reached c:
 * the lease ends and, when created (the grant answered c's create), the
 * segment loses its name, unless the name now holds another segment or c
 * may no longer manage it.  The caller tells the segment's other holders
 * first, if any may have come since (gshmd_notify_lease_holders).
 * Returns 0; -ENOENT c holds no such lease (a revoke ended it); -ENOMEM
 * (the lease still ends; the name stays). */
int gshmd_registry_grant_undo(struct gshmd_registry *r, struct gshmd_client *c, uint64_t lease_id,
                              bool created);

/* The error for a request that names a segment (open, stat, unlink,
 * chmod, chown, revoke) when no segment holds name: -EINVAL for a name no
 * segment could have (empty; an empty, "." or ".." component; a control
 * byte), -ENAMETOOLONG past limits.max_name, as a create of it says;
 * else -ENOENT.  Sets *msg_out (valid until the next registry message). */
int gshmd_registry_no_segment(struct gshmd_registry *r, const char *name, const char **msg_out);

/* A segment by name (live) or id (any state); NULL when missing. */
struct gshmd_segment *gshmd_registry_find_name(struct gshmd_registry *r, const char *name);
struct gshmd_segment *gshmd_registry_find_id(struct gshmd_registry *r, uint64_t id);
struct gshmd_lease *gshmd_registry_find_lease(struct gshmd_registry *r, uint64_t lease_id);
/* The lease with the smallest id above `after`, or NULL: where a listing
 * of leases resumes, also after its cursor's lease ended.  O(log n)
 * amortized. */
struct gshmd_lease *gshmd_registry_find_lease_after(struct gshmd_registry *r, uint64_t after);
/* The segment with the smallest id above `after` (any state), or NULL:
 * where a listing resumes, also after its cursor's segment was freed.
 * O(log n) amortized. */
struct gshmd_segment *gshmd_registry_find_after(struct gshmd_registry *r, uint64_t after);

/* Permission: may c open seg with access (GSHM__ACCESS__*)? */
bool gshmd_registry_may_access(const struct gshmd_client *c, const struct gshmd_segment *seg,
                               int access);
/* May c see seg in listings (read permission, or admin)? */
bool gshmd_registry_may_see(const struct gshmd_client *c, const struct gshmd_segment *seg);
/* Whether c may unlink, chmod, chown or replace seg: its owner or an admin. */
bool gshmd_registry_may_manage(const struct gshmd_client *c, const struct gshmd_segment *seg);
/* Whether c holds a lease on seg (a walk of the shorter of their lease
 * lists). */
bool gshmd_registry_holds(const struct gshmd_client *c, const struct gshmd_segment *seg);

/* The segment of id as c may know it: NULL where none has that id, and
 * where c may not see it and holds no lease on it (a holder whose
 * segment was chmod'ed since still finds it: gshm.h gshm_stat's
 * -EACCES).  The stat by id's lookup. */
struct gshmd_segment *gshmd_registry_find_id_for(struct gshmd_registry *r,
                                                 const struct gshmd_client *c, uint64_t id);

/* What a request by segment id is answered (-ESTALE) for an id that names
 * no segment, or one the requester may not see (gshmd_registry_may_see)
 * and holds no lease on: the two are told apart by nobody. */
#define GSHMD_ID_GONE "segment is gone (revoked, or freed while the daemon restarted)"

/* At restore: seg (adopted, linked) loses its name to a newer segment that
 * holds the same one, which can only have been created after seg was
 * unlinked; seg stays, unlinked (reaped with the others once no lease
 * returns).  No event is raised (the caller owes seg's record). */
void gshmd_registry_unname(struct gshmd_registry *r, struct gshmd_segment *seg);

/* Moves every segment whose memory b holds (the CUDA backend, after a
 * sticky error in the restore) to the parked backend (backend.h
 * gshmd_backend_parked), with a copy of the fd b keeps for the fd store
 * (->park_fd; no driver call), and frees b's allocation.  For gshmd's
 * start, before any client: no segment may be leased.  Returns how many
 * moved; a segment whose fd cannot be copied (-EMFILE, -ENOMEM) stays on
 * b (logged). */
unsigned gshmd_registry_park_all(struct gshmd_registry *r, struct gshmd_backend *b);

/* Re-creates a segment saved before a restart around adopted memory (no
 * lease).  Takes ownership of mem on success.  Errors: -EEXIST id or live
 * name already present, -ENOMEM. */
int gshmd_registry_adopt(struct gshmd_registry *r, const Gshm__StateRecord *rec,
                         struct gshmd_alloc *mem);

/* How long a restart's grace period lasts, in milliseconds: segments come
 * back from the fd store with no lease, and their clients re-take the
 * leases when they reconnect (on their next call, each with the token that
 * proves its grant).  Until the period ends an unlinked restored segment
 * that nobody has re-taken yet is kept for them. */
#define GSHMD_RESTART_GRACE_MS 30000

/* Starts a restart's grace period, once the fd store's segments are
 * adopted: returns its length (GSHMD_RESTART_GRACE_MS), after which the
 * caller calls gshmd_registry_reap_unlinked, or 0 when no segment was
 * restored (no period: restored segments' rules are off from now on). */
uint64_t gshmd_registry_grace_begin(struct gshmd_registry *r);

/* Ends a restart's grace period: frees the unlinked segments that nobody
 * re-leased, without punching their pages (a client that has not
 * reconnected yet may still map them: the kernel frees them with its last
 * mapping), and from now on frees restored segments as soon as they are
 * unlinked and unleased.  Returns how many were freed. */
unsigned gshmd_registry_reap_unlinked(struct gshmd_registry *r);

/* Fills a SegmentInfo (strings point into seg: valid while seg lives). */
void gshmd_segment_to_info(const struct gshmd_segment *seg, Gshm__SegmentInfo *info);

#endif
