/* SPDX-License-Identifier: Apache-2.0 */
/* The fd store's fds in flight: what the buckets' queued datagrams cost
 * the user the kernel counts them against (gshm_fdstore_fds_held, and
 * what is said of them, once). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

/* The usual soft RLIMIT_NOFILE: systemd's default for services, and
 * containerd 2's for containers. */
#define GSHMD_FDSTORE_HELD_NOTICE 1024u

/* The kernel counts the fds queued in a unix socket (SCM_RIGHTS, "in
 * flight") against the user that sent them, until they are received, and
 * refuses a sendmsg with fds (ETOOMANYREFS) by any process of that user
 * whose RLIMIT_NOFILE is below the user's count, unless it has
 * CAP_SYS_RESOURCE or CAP_SYS_ADMIN (net/unix/scm.c too_many_unix_fds).
 * The buckets' datagrams stay queued: each stored segment's memory fd
 * counts for gshmd's uid for as long as the segment is stored: daemon.user
 * under the shipped unit, root before it (docs/SECURITY.md).  Counted from the members (a
 * bucket whose datagram is behind holds its previous members'). */
void gshmd__bucket_count_held(struct gshmd_fdstore *fs) {
  uint64_t n = 0;

  for (uint32_t i = 0; i < fs->nbuckets; i++)
    if (fs->buckets[i])
      n += fs->buckets[i]->n;
  fs->reg->fdstore_fds_held = n;
  if (n <= GSHMD_FDSTORE_HELD_NOTICE || fs->held_said)
    return;
  fs->held_said = true;
  gshm_log_notice("fd store: %" PRIu64 " segment fds are queued in its buckets, counted by the "
                  "kernel as fds in flight of uid %u: a process of uid %u without "
                  "CAP_SYS_RESOURCE whose RLIMIT_NOFILE is below that count cannot pass fds over "
                  "a unix socket (sendmsg fails ETOOMANYREFS: NCCL's and PyTorch's fd passing "
                  "in a rootful container, say); give gshmd a user of its own (daemon.user, as "
                  "gshmd.service does) or raise that process's limit (docs/SECURITY.md)",
                  n, (unsigned)getuid(), (unsigned)getuid());
}

void gshmd__bucket_frozen_sender(struct gshmd_fdstore *fs, uint32_t by) {
  if (!fs->frozen_senders++)
    fs->frozen_by = by;
  else if (fs->frozen_by != by)
    fs->frozen_by = 0;
}

/* A frozen bucket is not sent again after the switch to daemon.user: its
 * datagram could be sent on only once received, with its fds installed,
 * which RLIMIT_NOFILE (the same after the switch) does not allow, and
 * dropping it would lose its segments.  So its fds stay counted against
 * the user that sent them (root, for a store of a gshmd from before
 * daemon.user) until a start with room for them takes the bucket back and
 * writes it: said once, with their number and that user (each datagram
 * says its sender: the kernel's count is not gshmd's uid's, which the
 * message named alone before). */
void gshmd__bucket_say_frozen(const struct gshmd_fdstore *fs) {
  char whose[192];

  if (!fs->nfrozen)
    return;
  if (fs->frozen_by)
    snprintf(whose, sizeof(whose),
             "uid %u (a process of uid %u without CAP_SYS_RESOURCE whose RLIMIT_NOFILE is "
             "below that count cannot pass fds: ETOOMANYREFS)",
             (unsigned)(fs->frozen_by - 1), (unsigned)(fs->frozen_by - 1));
  else
    snprintf(whose, sizeof(whose), "the user(s) that sent them (their datagrams do not all say "
                                   "one uid: some are a gshmd's from before 2026-11-29)");
  gshm_log_warn("fd store: %" PRIu32 " bucket(s) not restored (their fds do not fit under "
                "RLIMIT_NOFILE) are not sent again as uid %u: their %s%" PRIu64 " segment fds "
                "stay queued as the gshmd that wrote them sent them, counted by the kernel as "
                "fds in flight of %s, until a start with a higher LimitNOFILE= takes them",
                fs->nfrozen, (unsigned)getuid(), fs->frozen_fds_most ? "at most " : "",
                fs->frozen_fds, whose);
}
