/* SPDX-License-Identifier: Apache-2.0 */
/* Why a client could not reach gshmd, and what its user can do about it:
 * one text that gshmctl, the Python package and any other client print. */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gshm.h"

#define START_HINT                                                                                \
  "start gshmd (systemctl start gshmd.socket, or gshmd --socket PATH) or give its socket's path " \
  "(gshmctl --socket PATH, gshm.Client(socket=PATH), or $GSHM_SOCKET)"

/* Appends to buf like snprintf; -ENOBUFS where the text did not fit. */
static int put(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  return n < 0 ? -EINVAL : (size_t)n >= cap ? -ENOBUFS : 0;
}

/* The socket's owner, group and mode, and how an admin lets this uid in. */
static int explain_refused(const struct stat *st, char *buf, size_t cap) {
  struct passwd *pw = getpwuid(st->st_uid);
  struct group *gr = getgrgid(st->st_gid);
  char owner[64], group[64], join[128] = "";

  if (pw)
    snprintf(owner, sizeof(owner), "%s", pw->pw_name);
  else
    snprintf(owner, sizeof(owner), "uid %u", (unsigned)st->st_uid);
  if (gr)
    snprintf(group, sizeof(group), "%s", gr->gr_name);
  else
    snprintf(group, sizeof(group), "gid %u", (unsigned)st->st_gid);
  /* the group lets its members in: joining it is the usual way */
  if ((st->st_mode & 0060) == 0060)
    snprintf(join, sizeof(join), "add this user to group '%s' (from its next login) or ", group);
  return put(buf, cap, "%s: the socket (owner %s, group %s, mode %04o) does not let uid %u "
             "connect: an admin can %swiden the socket (daemon.socket_group and "
             "daemon.socket_mode, or SocketGroup= and SocketMode= of gshmd.socket)",
             gshm_strerror(-EACCES), owner, group, (unsigned)(st->st_mode & 07777),
             (unsigned)geteuid(), join);
}

int gshm_connect_explain(const char *socket_path, int err, char *buf, size_t cap) {
  const char *env;
  struct stat st;
  int se;

  if (!buf || !cap)
    return -EINVAL;
  buf[0] = '\0';
  if (err >= 0)
    return -EINVAL;
  if (!socket_path || !*socket_path)
    socket_path = (env = secure_getenv("GSHM_SOCKET")) && *env ? env : GSHM_DEFAULT_SOCKET;
  se = stat(socket_path, &st) < 0 ? errno : 0;

  if (err == -ENAMETOOLONG)
    return put(buf, cap, "the path is %zu bytes, longer than a Unix socket's address takes (%zu): "
               "give a shorter path to it (a symlink to its directory)", strlen(socket_path),
               sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
  if (err == -ENOENT)
    return put(buf, cap, "no socket there (is gshmd running?): %s", START_HINT);
  if (err == -ECONNREFUSED && !se && !S_ISSOCK(st.st_mode))
    return put(buf, cap, "%s is not a socket: give gshmd's socket's path (gshmctl --socket "
               "PATH, gshm.Client(socket=PATH), or $GSHM_SOCKET)", socket_path);
  if (err == -EPROTOTYPE) /* connect(2) of a SOCK_SEQPACKET to a stream or datagram socket */
    return put(buf, cap, "%s is a stream or datagram socket, not gshmd's (a SOCK_SEQPACKET one): "
               "another program's? give gshmd's socket's path (gshmctl --socket PATH, "
               "gshm.Client(socket=PATH), or $GSHM_SOCKET)", socket_path);
  if (err == -ETIMEDOUT)
    return put(buf, cap, "gshmd did not answer within $GSHM_HELLO_TIMEOUT_MS (default 30000 ms): "
               "is it stopped (SIGSTOP, a debugger), stuck, or still starting (the GPUs' initialisation)? "
               "or is %s another program's "
               "socket that accepts and never answers?", socket_path);
  if (err == -ECONNREFUSED)
    return put(buf, cap, "%s: nothing listens on that socket (left by a gshmd that stopped?): %s",
               gshm_strerror(err), START_HINT);
  /* gshmd accepts a connection over its limits and closes it at once
   * (server.c): the hello's send or read meets the end */
  if (err == -EPIPE || err == -ECONNRESET)
    return put(buf, cap, "gshmd closed the connection before it answered: it holds as many "
               "connections as its limits.max_connections (less limits.admin_connections "
               "for users who are not admins) or quota.connections for uid %u allow (its log "
               "says \"connection refused\"; close some clients, or an admin raises them), or "
               "it stopped meanwhile", (unsigned)geteuid());
  if (err == -EACCES && se)
    return put(buf, cap, "%s: a directory above it does not let uid %u through",
               gshm_strerror(err), (unsigned)geteuid());
  if (err == -EACCES)
    return explain_refused(&st, buf, cap);
  return put(buf, cap, "%s", gshm_strerror(err));
}
