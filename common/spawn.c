/* SPDX-License-Identifier: Apache-2.0 */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

static void *notify_thread(void *arg);

int gshm__spawn_init(struct gshm_spawn *s) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  const char *tmp = getenv("TMPDIR");
  int one = 1;

  memset(s, 0, sizeof(*s));
  s->notify_fd = -1;
  s->listen_fd = -1;
  snprintf(s->dir, sizeof(s->dir), "%s/gshm.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(s->dir))
    return -errno;
  chmod(s->dir, 0755); /* other users' test clients must reach the socket */
  snprintf(s->socket_path, sizeof(s->socket_path), "%s/gshmd.sock", s->dir);
  snprintf(s->notify_path, sizeof(s->notify_path), "%s/notify.sock", s->dir);
  if (strlen(s->notify_path) >= sizeof(sa.sun_path))
    return -ENAMETOOLONG;
  strcpy(sa.sun_path, s->notify_path);
  s->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->notify_fd < 0 || bind(s->notify_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    return -errno;
  setsockopt(s->notify_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  if (pthread_create(&s->thread, NULL, notify_thread, s))
    return -EAGAIN;
  s->thread_running = true;
  return 0;
}

static void store_remove(struct gshm_spawn *s, const char *name) {
  for (int i = 0; i < s->nfds;) {
    if (!strcmp(s->names[i], name)) {
      close(s->fds[i]);
      free(s->names[i]);
      s->fds[i] = s->fds[s->nfds - 1];
      s->names[i] = s->names[s->nfds - 1];
      s->nopoll[i] = s->nopoll[s->nfds - 1];
      s->nfds--;
    } else {
      i++;
    }
  }
}

/* Stores fd under name (called with the lock held, or before any thread
 * reads the store). */
static int store_put(struct gshm_spawn *s, const char *name, int fd, bool nopoll) {
  if (s->store_max && s->nfds >= s->store_max) {
    close(fd);
    s->store_refused++;
    return -ENOSPC;
  }
  if (s->nfds == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    int *fds = realloc(s->fds, sizeof(*fds) * (size_t)cap);
    char **names = fds ? realloc(s->names, sizeof(*names) * (size_t)cap) : NULL;
    bool *nopolls = names ? realloc(s->nopoll, sizeof(*nopolls) * (size_t)cap) : NULL;
    if (fds)
      s->fds = fds;
    if (names)
      s->names = names;
    if (!nopolls) {
      close(fd);
      return -ENOMEM;
    }
    s->nopoll = nopolls;
    s->cap = cap;
  }
  if (!(s->names[s->nfds] = strdup(name))) {
    close(fd);
    return -ENOMEM;
  }
  s->fds[s->nfds] = fd;
  s->nopoll[s->nfds] = nopoll;
  s->nfds++;
  return 0;
}

int gshm__spawn_unit_caps(struct gshm_spawn *s) {
  /* (as systemd's /run/systemd/notify: anyone may send, root without
   * CAP_DAC_OVERRIDE before the switch and daemon.user after it) */
  if (chmod(s->notify_path, 0777) < 0)
    return -errno;
  s->unit_caps = true;
  return 0;
}

int gshm__spawn_store_add(struct gshm_spawn *s, const char *name, int fd, bool nopoll) {
  int e;
  pthread_mutex_lock(&s->lock);
  e = store_put(s, name, fd, nopoll);
  pthread_mutex_unlock(&s->lock);
  return e;
}

/* The fds queued at the head of a socket's receive queue (peeked, the
 * copies closed); 0 when empty or not a socket. */
static int peek_fd_count(int fd) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * 253)];
  } ctl;
  char b;
  struct iovec iov = {.iov_base = &b, .iov_len = 1};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                      .msg_controllen = sizeof(ctl.buf)};
  int n = 0;

  if (recvmsg(fd, &mh, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC) < 0)
    return 0;
  return gshm__cmsg_take_fds(&mh, NULL, 0, &n);
}

int gshm__spawn_store_memory_fds(struct gshm_spawn *s) {
  int n = 0;
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < s->nfds; i++) {
    const char *m = s->names[i];
    size_t len = strlen(m);
    if (!strncmp(m, "seg-", 4))
      n++;
    else if (m[0] == 'b' && len >= 3 && (m[len - 1] == 'a' || m[len - 1] == 'b') &&
             strspn(m + 1, "0123456789") == len - 2)
      n += peek_fd_count(s->fds[i]);
  }
  pthread_mutex_unlock(&s->lock);
  return n;
}

int gshm__spawn_store_queued_fds(struct gshm_spawn *s, const char *name) {
  int n = 0;

  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < s->nfds; i++)
    if (!strcmp(s->names[i], name))
      n += peek_fd_count(s->fds[i]);
  pthread_mutex_unlock(&s->lock);
  return n;
}

int gshm__spawn_store_drop(struct gshm_spawn *s, const char *name) {
  int had;

  pthread_mutex_lock(&s->lock);
  had = s->nfds;
  store_remove(s, name);
  had -= s->nfds;
  pthread_mutex_unlock(&s->lock);
  return had;
}

static size_t gshm__spawn_fdnames_len_locked(struct gshm_spawn *s, bool socket_activation);

size_t gshm__spawn_fdnames_len(struct gshm_spawn *s, bool socket_activation) {
  size_t len;
  pthread_mutex_lock(&s->lock);
  len = gshm__spawn_fdnames_len_locked(s, socket_activation);
  pthread_mutex_unlock(&s->lock);
  return len;
}

/* One datagram: newline-separated assignments, maybe with fds. */
static void handle_datagram(struct gshm_spawn *s, char *msg, int *fds, int nfds) {
  char *name = NULL, *save = NULL, *line;
  bool store = false, remove = false, nopoll = false;

  for (line = strtok_r(msg, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (!strcmp(line, "READY=1"))
      s->ready = true;
    else if (!strcmp(line, "STOPPING=1"))
      s->stopping = true;
    else if (!strcmp(line, "WATCHDOG=1"))
      s->watchdog_pings++;
    else if (!strncmp(line, "STATUS=", 7))
      snprintf(s->status, sizeof(s->status), "%s", line + 7);
    else if (!strcmp(line, "FDSTORE=1"))
      store = true;
    else if (!strcmp(line, "FDSTOREREMOVE=1"))
      remove = true;
    else if (!strncmp(line, "FDNAME=", 7))
      name = line + 7;
    else if (!strcmp(line, "FDPOLL=0"))
      nopoll = true;
  }
  if (remove && name)
    store_remove(s, name);
  for (int i = 0; i < nfds; i++) {
    if (store)
      store_put(s, name ? name : "stored", fds[i], nopoll);
    else
      close(fds[i]); /* systemd too drops fds that come without FDSTORE=1 */
  }
}

/* Reads every queued datagram; returns how many.  Each one is received
 * and handled under the lock: the thread and a caller (gshm__spawn_stop)
 * may drain at once, and an FDSTOREREMOVE handled before the FDSTORE sent
 * ahead of it would leave a removed entry stored (test_spawn). */
static int drain(struct gshm_spawn *s) {
  int count = 0;

  for (;;) {
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int) * 253) + CMSG_SPACE(sizeof(struct ucred))];
    } ctl;
    char msg[4096];
    struct iovec iov = {.iov_base = msg, .iov_len = sizeof(msg) - 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                        .msg_controllen = sizeof(ctl.buf)};
    int fds[253], nfds = 0;
    ssize_t n;

    pthread_mutex_lock(&s->lock);
    if ((n = recvmsg(s->notify_fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0) {
      pthread_mutex_unlock(&s->lock);
      return count;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        memcpy(fds + nfds, CMSG_DATA(c), sizeof(int) * (size_t)k);
        nfds += k;
      }
    msg[n] = '\0';
    if (s->killed) /* (sent after the kill point: never reached the manager) */
      for (int i = 0; i < nfds; i++)
        close(fds[i]);
    else if (s->kill_after && strstr(msg, s->kill_after) && --s->kill_count <= 0) {
      handle_datagram(s, msg, fds, nfds);
      s->killed = true;
      if (s->pid > 0)
        kill(s->pid, SIGKILL);
    } else
      handle_datagram(s, msg, fds, nfds);
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    count++;
  }
}

static void *notify_thread(void *arg) {
  struct gshm_spawn *s = arg;

  for (;;) {
    struct pollfd p = {.fd = s->notify_fd, .events = POLLIN};
    bool stop;
    pthread_mutex_lock(&s->lock);
    stop = s->thread_stop;
    pthread_mutex_unlock(&s->lock);
    if (stop)
      break;
    poll(&p, 1, 20);
    drain(s);
  }
  return NULL;
}

void gshm__spawn_poll(struct gshm_spawn *s, int timeout_ms) {
  /* The thread does the work; here we only give it time, and make sure
   * whatever is queued right now has been handled. */
  if (timeout_ms > 0) {
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
  }
  drain(s);
}

static int make_listener(struct gshm_spawn *s) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd;

  if (s->listen_fd >= 0)
    return 0;
  strcpy(sa.sun_path, s->socket_path);
  unlink(s->socket_path);
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0) {
    int e = -errno;
    if (fd >= 0)
      close(fd);
    return e;
  }
  chmod(s->socket_path, 0666);
  s->listen_fd = fd;
  return 0;
}

static size_t gshm__spawn_fdnames_len_locked(struct gshm_spawn *s, bool socket_activation) {
  size_t len = socket_activation ? strlen("gshmd") : 0;
  for (int i = 0; i < s->nfds; i++)
    len += strlen(s->names[i]) + (len || i ? 1 : 0);
  return len;
}

/* LISTEN_FDNAMES into names (room: gshm__spawn_fdnames_len_locked + 1). */
static void fdnames_join(struct gshm_spawn *s, bool socket_activation, char *names) {
  size_t used = 0;
  names[0] = '\0';
  if (socket_activation)
    used += (size_t)sprintf(names, "gshmd");
  for (int i = 0; i < s->nfds; i++)
    used += (size_t)sprintf(names + used, "%s%s", used || i ? ":" : "", s->names[i]);
}

/* No capability survives the exec, also for root (the bounding set and
 * the inheritable set are emptied; without CAP_SETPCAP, as a normal user,
 * there is nothing to drop): gshmd as it runs under gshmd.service once it
 * has become daemon.user.  Without CAP_SYS_RESOURCE the kernel counts the
 * fds gshmd keeps in flight in its buckets against RLIMIT_NOFILE, as in
 * production.  With s->unit_caps, gshmd.service's CapabilityBoundingSet=
 * (CAP_CHOWN CAP_SETGID CAP_SETUID) stays, for a start with daemon.user. */
static void drop_capabilities(const struct gshm_spawn *s) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];

  for (int c = 0; c < 64; c++)
    if (!s->unit_caps || (c != CAP_CHOWN && c != CAP_SETGID && c != CAP_SETUID))
      prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
  if (syscall(SYS_capget, &h, d) == 0) {
    d[0].inheritable = d[1].inheritable = 0;
    syscall(SYS_capset, &h, d);
  }
}

/* The forked child: the store's fds to 3.. in order, via copies numbered
 * above every target (3 + nfds and up, not a fixed high number that
 * RLIMIT_NOFILE, often 1024, may not allow) so that dup2 never clobbers
 * one not yet moved; the environment of sd_listen_fds(3); then gshmd.  An
 * exec failure's errno goes to err_fd. */
static void child_exec(struct gshm_spawn *s, const char *const *argv, int nfds,
                       bool socket_activation, int *tmp, const char *names, int err_fd) {
  int k = 0, base = 3 + nfds, e;
  char env_fds[32], env_pid[32];

  if (socket_activation)
    tmp[k++] = fcntl(s->listen_fd, F_DUPFD_CLOEXEC, base);
  for (int i = 0; i < s->nfds; i++)
    tmp[k++] = fcntl(s->fds[i], F_DUPFD_CLOEXEC, base);
  if (err_fd < base) { /* (keep it clear of the targets) */
    int moved = fcntl(err_fd, F_DUPFD_CLOEXEC, base);
    err_fd = moved >= 0 ? moved : err_fd;
  }
  for (int i = 0; i < k; i++)
    if (tmp[i] < 0 || dup2(tmp[i], 3 + i) < 0)
      _exit(126);
  snprintf(env_fds, sizeof(env_fds), "%d", nfds);
  snprintf(env_pid, sizeof(env_pid), "%d", (int)getpid());
  setenv("NOTIFY_SOCKET", s->notify_path, 1);
  if (nfds) {
    setenv("LISTEN_FDS", env_fds, 1);
    setenv("LISTEN_PID", env_pid, 1);
    setenv("LISTEN_FDNAMES", names, 1);
  } else {
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDNAMES");
  }
  if (s->nofile) {
    struct rlimit rl = {s->nofile, s->nofile};
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
      _exit(126);
  }
  drop_capabilities(s);
  execvp(argv[0], (char *const *)argv);
  e = errno;
  if (write(err_fd, &e, sizeof(e)) < 0)
    _exit(127);
  _exit(127);
}

/* Waits up to timeout_ms for READY=1 from the child started last.
 * Returns 0, -ECHILD (it exited first) or -ETIMEDOUT (it was killed). */
static int wait_ready(struct gshm_spawn *s, int timeout_ms) {
  int status;
  int64_t deadline;

  deadline = gshm__now_ns(CLOCK_MONOTONIC) + (int64_t)timeout_ms * 1000000;
  for (;;) {
    struct timespec ts;
    bool ready;
    pthread_mutex_lock(&s->lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    if (!s->ready)
      pthread_cond_timedwait(&s->changed, &s->lock, &ts);
    ready = s->ready;
    pthread_mutex_unlock(&s->lock);
    if (ready)
      return 0;
    if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
      s->pid = 0;
      s->exit_status = status;
      return -ECHILD;
    }
    if (gshm__now_ns(CLOCK_MONOTONIC) > deadline) {
      /* Never leave a daemon behind that nobody will stop (it would keep
       * a test runner's output pipe open until its timeout). */
      gshm__spawn_stop(s, SIGKILL);
      return -ETIMEDOUT;
    }
  }
}

int gshm__spawn_start(struct gshm_spawn *s, const char *gshmd_path, const char *const *extra_args,
                      bool socket_activation, int timeout_ms) {
  const char *argv[64];
  int argc = 0, e, nfds, status, *tmp = NULL, err_pipe[2];
  char *names = NULL;

  if (socket_activation && (e = make_listener(s)))
    return e;
  argv[argc++] = gshmd_path;
  if (!socket_activation) {
    argv[argc++] = "--socket";
    argv[argc++] = s->socket_path;
  }
  for (int i = 0; extra_args && extra_args[i] && argc < 62; i++)
    argv[argc++] = extra_args[i];
  argv[argc] = NULL;
  drain(s); /* (what the last gshmd sent: dropped after a kill point) */
  pthread_mutex_lock(&s->lock);
  s->ready = s->stopping = s->killed = false;
  nfds = s->nfds + (socket_activation ? 1 : 0);
  /* Made before fork: LISTEN_FDNAMES (unbounded: execve, not this code,
   * refuses one too long, as under systemd) and the child's fd table. */
  if (!(names = malloc(gshm__spawn_fdnames_len_locked(s, socket_activation) + 1)) ||
      !(tmp = malloc(sizeof(int) * ((size_t)nfds + 1))) || pipe2(err_pipe, O_CLOEXEC) < 0) {
    pthread_mutex_unlock(&s->lock);
    free(names);
    free(tmp);
    return -ENOMEM;
  }
  fdnames_join(s, socket_activation, names);
  s->pid = fork();
  if (s->pid != 0) {
    pthread_mutex_unlock(&s->lock); /* the child reads the store unlocked: it is a copy */
    free(names);
    free(tmp);
    close(err_pipe[1]);
  }
  if (s->pid < 0) {
    close(err_pipe[0]);
    return -errno;
  }
  if (s->pid == 0)
    child_exec(s, argv, nfds, socket_activation, tmp, names, err_pipe[1]);
  {
    /* An exec failure comes back as its errno; EOF: gshmd is running. */
    int child_errno = 0;
    ssize_t got;
    while ((got = read(err_pipe[0], &child_errno, sizeof(child_errno))) < 0 && errno == EINTR)
      ;
    close(err_pipe[0]);
    if (got == (ssize_t)sizeof(child_errno)) {
      while (waitpid(s->pid, &status, 0) < 0 && errno == EINTR)
        ;
      s->pid = 0;
      return -child_errno;
    }
  }

  return wait_ready(s, timeout_ms);
}

int gshm__spawn_stop(struct gshm_spawn *s, int sig) {
  int status = -1;

  if (s->pid <= 0)
    return -1;
  kill(s->pid, sig);
  while (waitpid(s->pid, &status, 0) < 0 && errno == EINTR)
    ;
  s->pid = 0;
  gshm__spawn_poll(s, 0); /* last datagrams (fd store updates) */
  return status;
}

void gshm__spawn_cleanup(struct gshm_spawn *s) {
  if (s->pid > 0)
    gshm__spawn_stop(s, SIGTERM);
  if (s->thread_running) {
    pthread_mutex_lock(&s->lock);
    s->thread_stop = true;
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    s->thread_running = false;
  }
  for (int i = 0; i < s->nfds; i++) {
    close(s->fds[i]);
    free(s->names[i]);
  }
  free(s->fds);
  free(s->names);
  free(s->nopoll);
  s->fds = NULL;
  s->names = NULL;
  s->nopoll = NULL;
  s->nfds = s->cap = 0;
  if (s->notify_fd >= 0)
    close(s->notify_fd);
  if (s->listen_fd >= 0)
    close(s->listen_fd);
  s->notify_fd = s->listen_fd = -1;
  if (*s->dir) {
    unlink(s->socket_path);
    unlink(s->notify_path);
    rmdir(s->dir);
  }
}

const char *gshm__find_gshmd(void) {
  static char path[PATH_MAX + 32];
  static const char *const rel[] = {"/../daemon/gshmd", "/../sbin/gshmd", "/gshmd"};
  const char *env = getenv("GSHMD");
  char exe[PATH_MAX];
  ssize_t n;

  if (env && *env)
    return env;
  n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    char *slash;
    exe[n] = '\0';
    if ((slash = strrchr(exe, '/')))
      *slash = '\0';
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
      snprintf(path, sizeof(path), "%s%s", exe, rel[i]);
      if (access(path, X_OK) == 0)
        return path;
    }
  }
  return "gshmd";
}

long gshm__proc_rss_kib(pid_t pid) {
  char path[64], line[256];
  long kib = -1;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  if (!(f = fopen(path, "r")))
    return -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

int gshm__proc_cpu_ticks(pid_t pid, uint64_t *ticks_out) {
  char path[64], buf[1024], *p;
  unsigned long long ut, st;
  ssize_t n;
  int fd, e;

  if (pid <= 0)
    return -EINVAL;
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
    return -errno;
  n = read(fd, buf, sizeof(buf) - 1);
  e = errno;
  close(fd);
  if (n < 0)
    return -e;
  if (n == 0)
    return -EBADMSG;
  buf[n] = '\0';
  /* after "(comm)": state is field 3, utime 14, stime 15 */
  if (!(p = strrchr(buf, ')')) ||
      sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -EBADMSG;
  *ticks_out = (uint64_t)ut + (uint64_t)st;
  return 0;
}

/* ---- a TCP port for a test node or a bench node (spawn.h) ---- */

static int bind_any_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), e = 0;

  if (fd < 0)
    return -errno;
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || getsockname(fd, (struct sockaddr *)&sa, &len))
    e = -errno;
  close(fd);
  return e ? e : ntohs(sa.sin_port);
}

/* Whether TCP port `port` of 127.0.0.1 can be bound now (nothing
 * listens on it or holds it). */
static bool port_free(int port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                           .sin_port = htons((uint16_t)port)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;

  if (fd >= 0)
    close(fd);
  return ok;
}

/* The first port of the kernel's ephemeral range (ip_local_port_range),
 * 32768 where it cannot be read. */
static int ephemeral_low(void) {
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  int lo = 32768;

  if (f) {
    if (fscanf(f, "%d", &lo) != 1)
      lo = 32768;
    fclose(f);
  }
  return lo;
}

int gshm__spawn_free_port(void) {
  static int step; /* ports handed out by this process */
  const int lo = 10000, hi = ephemeral_low();
  int span = hi - lo, start;

  if (span < 1000) /* (a range that starts low: let the kernel choose) */
    return bind_any_port();
  start = (int)(((unsigned)getpid() * 7919u) % (unsigned)span);
  for (int tries = 0; tries < span; tries++) {
    int port = lo + (start + step++) % span;
    if (port_free(port))
      return port;
  }
  return -EADDRINUSE;
}
