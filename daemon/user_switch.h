/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's own user (daemon.user): started as root (gshmd.service), gshmd
 * sets itself up -- configuration, cluster key, the fd store taken back,
 * its memory files given to that user, sockets -- and then becomes that
 * user and its group, keeping no capability, before it serves anything.
 *
 * Why: the kernel counts every fd queued in a unix socket ("in flight")
 * against the user that sent it, and refuses a sendmsg with fds
 * (ETOOMANYREFS) to any process of that user without CAP_SYS_RESOURCE
 * whose RLIMIT_NOFILE is below the count (net/unix/af_unix.c
 * too_many_unix_fds).  The fd store's buckets keep one queued fd per
 * stored segment: counted against root, a few thousand segments broke fd
 * passing (NCCL's cuMem handles, PyTorch's file_descriptor sharing) for
 * every capless root process with the usual limit of 1,024 -- a rootful
 * container, say (docs/SECURITY.md).  Counted against a user of gshmd's
 * own, they touch no one else; and gshmd no longer runs as root at all. */
#ifndef GSHMD_USER_SWITCH_H
#define GSHMD_USER_SWITCH_H

#include <stdbool.h>
#include <sys/types.h>

struct gshmd_user {
  bool on;        /* switch at gshmd_user_switch */
  uid_t uid;      /* the user's; when !on, gshmd's effective uid */
  gid_t gid;      /* its primary group (a bare number: the same number) */
  char name[256]; /* its passwd name, "" for a number without one (LOGIN_NAME_MAX) */
};

/* Reads daemon.user.
 *   spec  "" (stay as started), a user name, or a number (a uid, passwd
 *         entry or not; without one its group is the same number and it
 *         has no supplementary groups)
 *   u     out: what gshmd_user_switch will do; always written (on false
 *         with uid = geteuid() when nothing is to be done)
 *   quiet true: say nothing (--check-config says it itself)
 * Nothing to do, and 0, when spec is empty or names gshmd's own uid.
 * Returns 0; -ENOENT no such user name, or a number out of range;
 * -EPERM spec names another user and gshmd cannot switch to it: not root,
 * or without CAP_SETUID and CAP_SETGID, or the switch tried in a forked
 * child failed (a user namespace where the uid is not mapped or setgroups
 * is denied; a SecureBits setting that keeps capabilities: an id or a
 * capability left) -- then on is false.  The trial (not when quiet) forks
 * once, before gshmd has threads; the child exits at once.
 * Each error is logged (unless quiet) saying gshmd stays as started. */
int gshmd_user_resolve(const char *spec, struct gshmd_user *u, bool quiet);

/* For a daemon.user that is set but will not be had (no such user, or
 * no CAP_SETUID/CAP_SETGID: gshmd_user_resolve's errors): gshmd stays as
 * started, but with no capability, so that the ones gshmd.service keeps
 * for the switch (CAP_CHOWN, CAP_SETUID, CAP_SETGID: as root, a way to
 * any user's files and processes) are not held while it serves.  Empties
 * the calling thread's permitted, effective, inheritable and ambient
 * sets: call it before any other thread starts (they inherit them).  A
 * failure (none expected: lowering needs no capability) is logged. */
void gshmd_user_keep_no_capability(void);

/* Becomes u (when u->on): supplementary groups (initgroups for a named
 * user, none for a bare number), then setresgid and setresuid to u's ids
 * on every thread (glibc's set*id reach all of them).  Going from root to
 * a non-zero uid clears the permitted, effective and ambient capability
 * sets (capabilities(7)); the result is checked, and the process is made
 * dumpable again (a credential change clears it: core dumps, and UCX's
 * cma between two gshmd of the same user, need it).
 * Returns 0 (done, or nothing to do); -EPERM (no CAP_SETUID/CAP_SETGID:
 * nothing or only the groups changed, gshmd stays uid 0) or another
 * -errno of the calls, logged; -EIO when a capability or id is left
 * afterwards (logged: a kernel or libc that did not do it). */
int gshmd_user_switch(const struct gshmd_user *u);

#endif
