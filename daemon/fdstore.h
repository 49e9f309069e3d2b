/* SPDX-License-Identifier: Apache-2.0 */
/* Restart without losing a byte: gshmd parks in systemd's fd store, for
 * every segment, its memory fd (FDSTORE=1, FDNAME=seg-<id>) and a small
 * sealed memfd with its metadata (meta-<id>-<v>: a StateRecord), plus one
 * record that reserves ids ahead (ids-<v>) and the journal (FDNAME=
 * journal), a memfd rewritten in place with whatever a failed send left
 * the store behind by, so that no failure brings back an unlinked segment.  Each operation costs O(1)
 * notifications whatever the number of segments (a whole-table rewrite per
 * create was 67% of create+unlink, gshm-bench control).  On start, what
 * sd_listen_fds_with_names() returns is adopted back before READY=1.
 * Without $NOTIFY_SOCKET (no service manager) all of this is skipped. */
#ifndef GSHMD_FDSTORE_H
#define GSHMD_FDSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gshmd_registry;
struct gshmd_segment;

struct gshmd_fdstore {
  struct gshmd_registry *reg;
  bool enabled;   /* $NOTIFY_SOCKET is set and the manager listens */
  unsigned restored, dropped;
  /* Ids below these limits are covered by the stored ids-<v> record. */
  uint64_t id_limit, gen_limit, lease_limit, session_limit;
  uint64_t ids_version;
  /* Owed to the store after a failed send (EMFILE, ENOMEM, ETOOMANYREFS):
   * segments whose memory (need_seg) and/or newest record must be sent,
   * and names whose FDSTOREREMOVE must be sent.  Resent, removals first,
   * before every store event and by gshmd_fdstore_retry. */
  struct fdstore_owed { uint64_t id; bool need_seg; } *owed;
  size_t nowed, owed_cap;
  char **removes;
  size_t nremoves, removes_cap;
  uint64_t failed_sends; /* notifications that failed, for metrics */
  size_t owed_freed;     /* freed segments with removals owed (journal_sync) */
  /* The journal (fdstore.c): a memfd stored once and rewritten in place
   * with what is owed; -1 without a service manager. */
  int journal_fd;
  bool journal_stored;   /* its FDSTORE=1 went through */
  bool journal_failed;   /* its last rewrite failed (logged once) */
  uint64_t journal_area; /* bytes per area */
  uint64_t journal_off, journal_len; /* the current contents */
  uint64_t journal_seq;
  uint64_t journal_max;  /* largest contents written (from the limits) */
  unsigned journal_records, journal_freed; /* applied at restore */
};

/* Hooks the registry (segment created/changed/freed, ids taken).  Returns 0. */
int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg);

/* Adopts "seg-*", "meta-*-*", "ids-*" and "journal" fds from fds[0..n)
 * (names from sd_listen_fds_with_names); adopted entries are set to -1 in
 * fds[].  The journal is read first: its freed segments are dropped, its
 * records replace older stored ones (and are owed to the store again), its
 * ids raise the next ones.  A segment whose memory or metadata is missing
 * or does not match is dropped (logged); our leftovers are closed and
 * removed from the store; fds with other names are left alone.  Then,
 * under a service manager, this run's journal is made and stored (or the
 * adopted one kept) and ids are reserved; a $NOTIFY_SOCKET nobody reads
 * turns the store off (logged).  Call once, after gshmd_fdstore_setup and
 * before READY=1 (also with n == 0).  Returns 0, or a negative errno only
 * for out-of-memory. */
int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n);

/* Resends everything owed (see struct gshmd_fdstore).  Returns how many
 * segments the store is still behind by (owed records plus owed
 * removals), 0 when it is up to date or disabled. */
unsigned gshmd_fdstore_retry(struct gshmd_fdstore *fs);

/* Unhooks the registry; says so in the log when the store is behind (those
 * changes are lost or undone at the next start).  Frees what is owed. */
void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs);

#endif
