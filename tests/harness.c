/* SPDX-License-Identifier: Apache-2.0 */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <grp.h>
#include <poll.h>
#include <stdbool.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static bool names_backend(const char *const *args) {
  for (int i = 0; args && args[i]; i++)
    if (!strcmp(args[i], "--backend") || !strncmp(args[i], "--set=daemon.backend", 20))
      return true;
  return false;
}

static int start(struct harness *h, const char *const *extra, bool activated) {
  const char *args[48];
  int n = 0, e;

  if (!names_backend(extra)) {
    args[n++] = "--backend";
    args[n++] = "host";
  }
  for (int i = 0; extra && extra[i] && n < 46; i++)
    args[n++] = extra[i];
  args[n] = NULL;
  e = gshm__spawn_start(&h->sp, h->gshmd, args, activated, 20000);
  if (e)
    fprintf(stderr, "harness: gshmd (%s) did not become ready: %s\n", h->gshmd, strerror(-e));
  return e;
}

static int init(struct harness *h) {
  int e;
  memset(h, 0, sizeof(*h));
  if ((e = gshm__spawn_init(&h->sp))) {
    fprintf(stderr, "harness: %s\n", strerror(-e));
    return e;
  }
  h->gshmd = gshm__find_gshmd();
  h->socket_path = h->sp.socket_path;
  setenv("GSHM_SOCKET", h->socket_path, 1);
  return 0;
}

/* A first start that fails leaves nothing behind: the notify thread, the
 * fds the refused gshmd stored (its lease key) and the store's tables go
 * with it (LeakSanitizer found them when a test expected the refusal). */
static int first_start(struct harness *h, const char *const *extra_args, bool activated) {
  int e = init(h);
  if (!e && (e = start(h, extra_args, activated)))
    gshm__spawn_cleanup(&h->sp);
  return e;
}

int harness_start(struct harness *h, const char *const *extra_args) {
  return first_start(h, extra_args, false);
}

int harness_start_activated(struct harness *h, const char *const *extra_args) {
  return first_start(h, extra_args, true);
}

int harness_stderr_onto(int fd) {
  int saved = dup(2);

  if (saved < 0)
    return -1;
  if (dup2(fd, 2) < 0) {
    close(saved);
    return -1;
  }
  return saved;
}

void harness_stderr_back(int saved) {
  if (saved < 0)
    return;
  dup2(saved, 2);
  close(saved);
}

int harness_start_logged(struct harness *h, const char *const *extra_args, char *path) {
  int fd = mkstemp(path), saved, e;

  if (fd < 0)
    return -errno;
  if ((saved = harness_stderr_onto(fd)) < 0) {
    e = -errno;
    close(fd);
    return e;
  }
  close(fd);
  e = harness_start(h, extra_args);
  harness_stderr_back(saved);
  return e;
}

int harness_restart(struct harness *h, int sig, const char *const *extra_args) {
  gshm__spawn_stop(&h->sp, sig);
  return start(h, extra_args, h->sp.listen_fd >= 0);
}

int harness_stop(struct harness *h) {
  int status = gshm__spawn_stop(&h->sp, SIGTERM);
  gshm__spawn_cleanup(&h->sp);
  return status;
}

int harness_fd_count(pid_t pid) {
  char path[64];
  struct dirent *d;
  DIR *dir;
  int n = 0;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  if (!(dir = opendir(path)))
    return -1;
  while ((d = readdir(dir)))
    n += d->d_name[0] != '.';
  closedir(dir);
  return n;
}

long harness_lowest_free_fd(pid_t pid, int room) {
  static bool used[65536];
  char path[64];
  struct dirent *e;
  DIR *d;
  long lim = 0;

  memset(used, 0, sizeof(used));
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  if (!(d = opendir(path)))
    return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' && atoi(e->d_name) < 65536)
      used[atoi(e->d_name)] = true;
  closedir(d);
  for (; room > 0 || (lim < 65536 && used[lim]); lim++)
    if (!used[lim])
      room--;
  return lim;
}

int harness_stable_fd_count(pid_t pid) {
  int least = -1;
  for (int i = 0; i < 5; i++) {
    int n = harness_fd_count(pid);
    if (n >= 0 && (least < 0 || n < least))
      least = n;
    usleep(5000);
  }
  return least;
}

long harness_rss_kib(pid_t pid) { return gshm__proc_rss_kib(pid); }

int harness_store_count(struct harness *h, const char *prefix) {
  int n = 0;

  pthread_mutex_lock(&h->sp.lock);
  for (int i = 0; i < h->sp.nfds; i++)
    n += !strncmp(h->sp.names[i], prefix, strlen(prefix));
  pthread_mutex_unlock(&h->sp.lock);
  return n;
}

int harness_store_bucket_fds(struct harness *h) {
  int n = 0;

  pthread_mutex_lock(&h->sp.lock);
  for (int i = 0; i < h->sp.nfds; i++) {
    const char *m = h->sp.names[i];
    size_t len = strlen(m);
    n += m[0] == 'b' && len >= 3 && (m[len - 1] == 'a' || m[len - 1] == 'b') &&
         strspn(m + 1, "0123456789") == len - 2;
  }
  pthread_mutex_unlock(&h->sp.lock);
  return n;
}

/* A port the kernel picks (bound to port 0, then closed). */
int harness_free_port(void) { return gshm__spawn_free_port(); }

void harness_random(void *buf, size_t n, unsigned long long seed) {
  /* (odd, so never 0; one stream a seed: seed | 1 gave 2k and 2k + 1 the
   * same bytes, and a mix-up of such neighbours passed every check) */
  unsigned long long s = seed * 2 + 1;
  unsigned char *p = buf;
  for (size_t i = 0; i < n; i += 8) {
    unsigned long long v;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    v = s * 2685821657736338717ull;
    memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}

int harness_gshmctl_stderr(struct harness *h, char **out, const char *const *args,
                           bool with_stderr) {
  char path[PATH_MAX];
  const char *env = getenv("GSHMCTL"), *argv[32];
  int argc = 0, pipefd[2], status;
  size_t len = 0, cap = 4096;
  char *buf = NULL;
  pid_t pid;

  if (env && *env) {
    snprintf(path, sizeof(path), "%s", env);
  } else {
    snprintf(path, sizeof(path), "%s", h->gshmd);
    char *slash = strrchr(path, '/');
    if (slash)
      snprintf(slash, sizeof(path) - (size_t)(slash - path), "/../client/gshmctl");
  }
  argv[argc++] = path;
  argv[argc++] = "--socket";
  argv[argc++] = h->socket_path;
  for (int i = 0; args && args[i] && argc < 31; i++)
    argv[argc++] = args[i];
  argv[argc] = NULL;
  if (pipe(pipefd) < 0)
    return -1;
  pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    if (with_stderr)
      dup2(pipefd[1], STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    execv(path, (char *const *)argv);
    _exit(127);
  }
  close(pipefd[1]);
  buf = malloc(cap);
  for (;;) {
    ssize_t n;
    if (len + 1 >= cap)
      buf = realloc(buf, cap *= 2);
    n = read(pipefd[0], buf + len, cap - len - 1);
    if (n <= 0)
      break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  close(pipefd[0]);
  waitpid(pid, &status, 0);
  if (out)
    *out = buf;
  else
    free(buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static struct harness *leftover;
static pid_t leftover_owner; /* the test process, not a forked child */

void harness_set_leftover(struct harness *h) {
  leftover = h;
  leftover_owner = getpid();
}

void harness_kill_leftover(void) {
  if (leftover && leftover->sp.pid > 0 && leftover_owner == getpid())
    kill(leftover->sp.pid, SIGKILL);
  leftover = NULL;
}

void *harness_cmocka_start(void **state, size_t size, const char *const *extra_args) {
  static bool at_exit;
  struct harness *h;

  if (!at_exit)
    at_exit = atexit(harness_kill_leftover) == 0;
  harness_kill_leftover(); /* the gshmd of a test whose teardown did not run */
  if (size < sizeof(*h) || !(h = calloc(1, size)))
    return NULL;
  if (harness_start(h, extra_args)) {
    free(h);
    return NULL;
  }
  harness_set_leftover(h);
  *state = h;
  return h;
}

int harness_cmocka_setup(void **state) {
  return harness_cmocka_start(state, sizeof(struct harness), NULL) ? 0 : -1;
}

int harness_cmocka_teardown(void **state) {
  struct harness *h = *state;
  int status;

  if (!h)
    return 0;
  status = harness_stop(h);
  harness_set_leftover(NULL);
  free(h);
  *state = NULL;
  return status == 0 ? 0 : -1;
}

int harness_kid_start(struct harness_kid *k, uid_t uid, gid_t gid,
                      void (*body)(struct harness_kid *k, void *arg), void *arg) {
  int a[2], b[2], e;

  if (pipe(a))
    return -errno;
  if (pipe(b)) {
    e = -errno;
    close(a[0]);
    close(a[1]);
    return e;
  }
  if ((k->pid = fork()) < 0) {
    e = -errno;
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);
    return e;
  }
  if (k->pid == 0) {
    close(a[1]);
    close(b[0]);
    k->in = a[0];
    k->out = b[1];
    if (uid != (uid_t)-1 &&
        (setgroups(1, &gid) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid)))
      _exit(120);
    body(k, arg);
    _exit(0);
  }
  close(a[0]);
  close(b[1]);
  k->to_kid = a[1];
  k->from_kid = b[0];
  k->in = k->out = -1;
  return 0;
}

int harness_kid_step(int fd) {
  char b = 1;
  return write(fd, &b, 1) == 1 ? 0 : -EPIPE;
}

bool harness_kid_await(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char b;
  return poll(&p, 1, timeout_ms) == 1 && read(fd, &b, 1) == 1;
}

int harness_kid_wait(struct harness_kid *k) {
  int status;

  close(k->to_kid);
  close(k->from_kid);
  if (waitpid(k->pid, &status, 0) != k->pid)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool harness_proc_status(const char *who, const char *field, char *out, size_t n) {
  char path[352], line[256];
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%s/status", who);
  out[0] = '\0';
  if (!(f = fopen(path, "re")))
    return false;
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, field, strlen(field))) {
      const char *v = line + strlen(field) + strspn(line + strlen(field), " \t");
      snprintf(out, n, "%.*s", (int)strcspn(v, "\n"), v);
    }
  fclose(f);
  return true;
}

int harness_threads_not_as(pid_t pid, uid_t uid, gid_t gid, int *checked) {
  static const char *const zero[] = {"CapEff:", "CapPrm:", "CapAmb:"};
  char dir[64], who[320], name[64], got[128], want_uid[64], want_gid[64];
  struct dirent *e;
  int bad = 0, n = 0;
  DIR *d;

  snprintf(want_uid, sizeof(want_uid), "%u\t%u\t%u\t%u", (unsigned)uid, (unsigned)uid,
           (unsigned)uid, (unsigned)uid);
  snprintf(want_gid, sizeof(want_gid), "%u\t%u\t%u\t%u", (unsigned)gid, (unsigned)gid,
           (unsigned)gid, (unsigned)gid);
  snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
  if (!(d = opendir(dir)))
    return -1;
  while ((e = readdir(d))) {
    bool ok;
    if (e->d_name[0] < '0' || e->d_name[0] > '9')
      continue;
    snprintf(who, sizeof(who), "%d/task/%s", (int)pid, e->d_name);
    if (!harness_proc_status(who, "Name:", name, sizeof(name)))
      continue; /* (ended meanwhile) */
    harness_proc_status(who, "Uid:", got, sizeof(got));
    ok = !strcmp(got, want_uid);
    harness_proc_status(who, "Gid:", got, sizeof(got));
    ok = ok && !strcmp(got, want_gid);
    for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++) {
      harness_proc_status(who, zero[i], got, sizeof(got));
      ok = ok && !strcmp(got, "0000000000000000");
    }
    if (!ok) {
      char u[64], g[64], c[32];
      harness_proc_status(who, "Uid:", u, sizeof(u));
      harness_proc_status(who, "Gid:", g, sizeof(g));
      harness_proc_status(who, "CapPrm:", c, sizeof(c));
      fprintf(stderr,
              "harness: gshmd thread %s (%s): Uid %s, Gid %s, CapPrm %s; want uid %u gid %u, no "
              "capability\n",
              e->d_name, name, u, g, c, (unsigned)uid, (unsigned)gid);
      bad++;
    }
    n++;
  }
  closedir(d);
  if (checked)
    *checked = n;
  return bad;
}

int harness_as_nobody(int (*fn)(const char *arg), const char *arg) {
  int status;
  pid_t pid = fork();

  if (pid < 0)
    return -1;
  if (pid == 0) {
    if (setgroups(0, NULL) < 0 || setresgid(HARNESS_NOBODY, HARNESS_NOBODY, HARNESS_NOBODY) < 0 ||
        setresuid(HARNESS_NOBODY, HARNESS_NOBODY, HARNESS_NOBODY) < 0)
      _exit(90);
    _exit(fn(arg));
  }
  if (waitpid(pid, &status, 0) != pid)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

int harness_gshmctl(struct harness *h, char **out, const char *const *args) {
  return harness_gshmctl_stderr(h, out, args, false);
}
