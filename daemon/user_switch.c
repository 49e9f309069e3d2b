/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's own user: see user_switch.h. */
#include "user_switch.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"

/* spec as a uid when it is all digits; false otherwise. */
static bool parse_uid(const char *spec, uid_t *out) {
  char *end;
  unsigned long long v;

  if (spec[0] < '0' || spec[0] > '9')
    return false;
  errno = 0;
  v = strtoull(spec, &end, 10);
  if (*end || errno || v >= (uid_t)-1) /* ((uid_t)-1: "no change" to the kernel) */
    return false;
  *out = (uid_t)v;
  return true;
}

/* This thread's capability sets (d[0]: capabilities 0-31, d[1]: 32-63),
 * or -1 (d zeroed). */
static int caps_read(struct __user_cap_data_struct d[2]) {
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};

  d[0] = d[1] = (struct __user_cap_data_struct){0};
  return (int)syscall(SYS_capget, &h, d);
}

/* Whether capability cap is in this thread's effective set. */
static bool cap_effective(int cap) {
  struct __user_cap_data_struct d[2];

  return caps_read(d) == 0 && (d[cap / 32].effective & (1u << (cap % 32)));
}

static int trial_switch(const struct gshmd_user *u);

int gshmd_user_resolve(const char *spec, struct gshmd_user *u, bool quiet) {
  struct passwd pw, *found = NULL;
  int e;
  char buf[4096];
  bool numeric = spec && *spec >= '0' && *spec <= '9';

  memset(u, 0, sizeof(*u));
  u->uid = geteuid();
  u->gid = getegid();
  if (!spec || !*spec)
    return 0;
  if (numeric) {
    uid_t uid;
    if (!parse_uid(spec, &uid)) {
      if (!quiet)
        gshm_log_err("daemon.user '%s': not a uid (0 to 4294967294); gshmd stays uid %u, with no "
                     "capability", spec, (unsigned)geteuid());
      return -ENOENT;
    }
    getpwuid_r(uid, &pw, buf, sizeof(buf), &found);
    u->uid = uid;
    u->gid = found ? found->pw_gid : (gid_t)uid;
  } else {
    getpwnam_r(spec, &pw, buf, sizeof(buf), &found);
    if (!found) {
      if (!quiet)
        gshm_log_err("daemon.user '%s': no such user; gshmd stays uid %u, with no capability, and "
                     "keeps every segment (create it: systemd-sysusers installs gshm.conf's)",
                     spec, (unsigned)geteuid());
      u->uid = geteuid();
      return -ENOENT;
    }
    u->uid = found->pw_uid;
    u->gid = found->pw_gid;
  }
  if (found && strlen(found->pw_name) < sizeof(u->name))
    snprintf(u->name, sizeof(u->name), "%s", found->pw_name);
  if (u->uid == geteuid()) /* (already so: nothing to do) */
    return 0;
  /* gshmd is made dumpable after the switch: every process of its user
   * may trace it, and so read and write every segment */
  if (!quiet && (u->uid == 65534 || !strcmp(u->name, "nobody")))
    gshm_log_warn("daemon.user '%s' (uid %u): other processes run as this user (NFS, "
                  "containers) and could trace gshmd and reach every segment; give gshmd a user "
                  "of its own (gshmd.service's: gshmd)", spec, (unsigned)u->uid);
  /* (asked now, before the restore gives the user its memory: a switch
   * refused afterwards would leave gshmd unable to reopen it) */
  if (geteuid() != 0 || !cap_effective(CAP_SETUID) || !cap_effective(CAP_SETGID)) {
    if (!quiet)
      gshm_log_err("daemon.user '%s' (uid %u): gshmd (uid %u) %s and cannot become another "
                   "user; it stays uid %u, with no capability, and keeps every segment",
                   spec, (unsigned)u->uid, (unsigned)geteuid(),
                   geteuid() ? "was not started as root"
                             : "lacks CAP_SETUID or CAP_SETGID (gshmd.service keeps both in "
                               "CapabilityBoundingSet=)",
                   (unsigned)geteuid());
    u->uid = geteuid();
    u->gid = getegid();
    return -EPERM;
  }
  if (!quiet && (e = trial_switch(u))) {
    gshm_log_err("daemon.user '%s' (uid %u): the switch, tried in a child process, failed (%s: "
                 "in a user namespace the uid must be mapped and setgroups allowed); gshmd stays "
                 "uid %u, with no capability, and keeps every segment",
                 spec, (unsigned)u->uid, e == -EIO ? "an id or a capability was left" : strerror(-e),
                 (unsigned)geteuid());
    u->uid = geteuid();
    u->gid = getegid();
    return -EPERM;
  }
  u->on = true;
  return 0;
}

/* Whether any capability is left in the permitted, effective or
 * inheritable sets, or the ambient set. */
static bool caps_left(void) {
  struct __user_cap_data_struct d[2];

  if (caps_read(d) < 0)
    return true;
  for (int i = 0; i < 2; i++)
    if (d[i].permitted || d[i].effective || d[i].inheritable)
      return true;
  for (int c = 0; c <= 63; c++) {
    int r = prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0);
    if (r < 0)
      break; /* (past the kernel's last capability) */
    if (r > 0)
      return true;
  }
  return false;
}

void gshmd_user_keep_no_capability(void) {
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2] = {{0}};

  /* (lowering the sets needs no capability; this thread's only, so
   * called before gshmd starts any other: they inherit it) */
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  if (syscall(SYS_capset, &h, d) < 0 || caps_left())
    gshm_log_err("daemon.user: cannot drop the capabilities kept for the switch (%m)");
}

/* The switch's calls: supplementary groups, then gids, then uids.
 * Returns 0 or -errno (what was done before the failing call stays). */
static int become(const struct gshmd_user *u) {
  if ((u->name[0] ? initgroups(u->name, u->gid) : setgroups(0, NULL)) < 0 ||
      setresgid(u->gid, u->gid, u->gid) < 0 || setresuid(u->uid, u->uid, u->uid) < 0)
    return -errno;
  return 0;
}

/* Whether this thread is u now, every id, with no capability; the ids
 * read back in ids[6] (uids, then gids). */
static bool became(const struct gshmd_user *u, unsigned ids[6]) {
  uid_t r = (uid_t)-1, e = (uid_t)-1, s = (uid_t)-1;
  gid_t gr = (gid_t)-1, ge = (gid_t)-1, gs = (gid_t)-1;
  bool ok = getresuid(&r, &e, &s) == 0 && getresgid(&gr, &ge, &gs) == 0 && r == u->uid &&
            e == u->uid && s == u->uid && gr == u->gid && ge == u->gid && gs == u->gid;

  ids[0] = r, ids[1] = e, ids[2] = s, ids[3] = gr, ids[4] = ge, ids[5] = gs;
  return ok && !caps_left();
}

/* The switch tried in a child process first, before the restore gives
 * u its memory: a switch the capabilities allow can still fail (a user
 * namespace where u's uid is not mapped or setgroups is denied, a
 * SecureBits drop-in that keeps capabilities), and found failing only
 * then, it would leave gshmd as root with the memory given away.
 * Returns 0, or the child's -errno (-EIO: an id or capability left). */
static int trial_switch(const struct gshmd_user *u) {
  unsigned ids[6];
  int status;
  pid_t pid = fork();

  if (pid < 0)
    return -errno;
  if (pid == 0) {
    int e = become(u);
    _exit(e ? (-e < 256 ? -e : 255) : became(u, ids) ? 0 : EIO);
  }
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return -errno;
  if (WIFEXITED(status))
    return -WEXITSTATUS(status);
  return -ECHILD;
}

int gshmd_user_switch(const struct gshmd_user *u) {
  unsigned ids[6];
  int err;

  if (!u->on)
    return 0;
  if ((err = become(u))) {
    gshm_log_err("daemon.user: cannot become uid %u gid %u (%s); gshmd stays uid %u (it needs "
                 "CAP_SETUID and CAP_SETGID to switch: gshmd.service keeps them in "
                 "CapabilityBoundingSet=)",
                 (unsigned)u->uid, (unsigned)u->gid, strerror(-err), (unsigned)geteuid());
    return err;
  }
  if (!became(u, ids)) {
    gshm_log_err("daemon.user: after the switch to uid %u an id or a capability is left "
                 "(uids %u/%u/%u, gids %u/%u/%u)",
                 (unsigned)u->uid, ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
    return -EIO;
  }
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  gshm_log_info("running as uid %u gid %u%s%s%s, no capabilities", (unsigned)u->uid,
                (unsigned)u->gid, u->name[0] ? " (" : "", u->name, u->name[0] ? ")" : "");
  return 0;
}
