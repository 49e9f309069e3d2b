/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-bench's supervisor: the process that was started stays a small
 * single-threaded parent, the benchmark runs in its child, and whatever the
 * benchmark started (its gshmd, client processes, ucx_perftest) is stopped
 * before gshm-bench exits, also when SIGTERM, SIGINT or SIGHUP stops it
 * mid-run.
 *
 * Why not PR_SET_PDEATHSIG in common/spawn.c: it fires when the THREAD that
 * forked ends, and the tests (and bench fanout) start gshmd from threads.
 * Why not a process group of its own: the benchmark would leave the
 * terminal's foreground group (Ctrl-Z, Ctrl-C).  Instead the supervisor is
 * a child subreaper (PR_SET_CHILD_SUBREAPER): when the benchmark dies, its
 * children become the supervisor's, which sends them SIGTERM, SIGKILL past
 * STOP_GRACE_MS, and reaps them.
 *
 * A supervisor that is SIGKILLed can do none of that: the benchmark's death
 * signal (PR_SET_PDEATHSIG, SIGTERM) runs its handler, which sends SIGTERM
 * to the benchmark's own children before it dies, so its gshmd do not
 * outlive it under init.  And whatever temporary directories the benchmark
 * and its gshmd make (gshm__spawn_init's, pull's key) lie under one the
 * supervisor made (TMPDIR in the benchmark's environment), which the
 * supervisor removes once every child is reaped, after a signal too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define STOP_GRACE_MS 10000 /* SIGTERM to SIGKILL, as systemd's TimeoutStopSec= would */

struct supervisor {
  pid_t bench;      /* the benchmark; 0 once reaped */
  int bench_status; /* its wait status */
  int got;          /* the stop signal received; 0: none */
  bool force;       /* SIGKILL now: the grace ran out, or a second signal came */
  pid_t *sent;      /* children sent SIGTERM, not reaped yet */
  size_t nsent, cap;
  char tmp[PATH_MAX]; /* the benchmark's TMPDIR, removed at the end; "": none */
};

static bool sent_has(const struct supervisor *sv, pid_t pid) {
  for (size_t i = 0; i < sv->nsent; i++)
    if (sv->sent[i] == pid)
      return true;
  return false;
}

static void sent_drop(struct supervisor *sv, pid_t pid) {
  for (size_t i = 0; i < sv->nsent; i++)
    if (sv->sent[i] == pid) {
      sv->sent[i] = sv->sent[--sv->nsent];
      return;
    }
}

/* The parent pid of process pid (/proc/PID/stat, field 4, counted from
 * the last ')'); -1 when it cannot be read. */
static pid_t parent_of(pid_t pid) {
  char path[64], buf[512], *p = NULL;
  int ppid;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  if (!(f = fopen(path, "re")))
    return -1;
  if (fgets(buf, sizeof(buf), f))
    p = strrchr(buf, ')');
  fclose(f);
  return p && sscanf(p + 1, " %*c %d", &ppid) == 1 ? (pid_t)ppid : -1;
}

/* Sends SIGTERM (SIGKILL when forced) to each child of this process that
 * has not had it yet: the benchmark, and the processes it left, which the
 * kernel hands to this subreaper as their parents die. */
static void stop_children(struct supervisor *sv) {
  pid_t self = getpid();
  struct dirent *e;
  DIR *d = opendir("/proc");

  if (!d)
    return;
  while ((e = readdir(d))) {
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid <= 0 || parent_of(pid) != self)
      continue;
    if (sv->force) {
      kill(pid, SIGKILL);
      continue;
    }
    if (sent_has(sv, pid))
      continue;
    if (sv->nsent == sv->cap) {
      size_t cap = sv->cap ? 2 * sv->cap : 64;
      pid_t *p = realloc(sv->sent, cap * sizeof(*p));
      if (!p) { /* cannot remember it: the grace's SIGKILL still comes */
        kill(pid, SIGTERM);
        continue;
      }
      sv->sent = p;
      sv->cap = cap;
    }
    sv->sent[sv->nsent++] = pid;
    kill(pid, SIGTERM);
  }
  closedir(d);
}

/* Reaps what has ended.  Returns true when no child is left. */
static bool reap(struct supervisor *sv) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD && sv->bench) {
      /* gone without a status (reaped by the kernel: SIGCHLD ignored
       * after all): it ended, how is unknown */
      sv->bench = 0;
      sv->bench_status = 1 << 8;
    }
    if (pid <= 0)
      return pid < 0 && errno == ECHILD;
    if (pid == sv->bench) {
      sv->bench = 0;
      sv->bench_status = status;
    }
    sent_drop(sv, pid);
  }
}

/* Ends this process by sig, as the benchmark ended (or would have): a
 * shell sees a death by a signal, not an exit (bash stops a loop at a
 * ^C only then); $? still reads 128 + sig.  No core of the supervisor
 * (the benchmark's own, if any, was written).  exit(128 + sig) where
 * the signal does not kill. */
static void die_by(int sig) {
  struct rlimit none = {0, 0};
  sigset_t one;

  setrlimit(RLIMIT_CORE, &none);
  signal(sig, SIG_DFL);
  sigemptyset(&one);
  sigaddset(&one, sig);
  sigprocmask(SIG_UNBLOCK, &one, NULL);
  raise(sig);
  exit(128 + sig);
}

/* ---- the benchmark's side: its children die with it ---- */

/* The decimal number s, or -1 where s is no number. */
static long digits(const char *s) {
  long v = 0;

  if (!*s)
    return -1;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > 1L << 40)
      return -1;
    v = v * 10 + (*s - '0');
  }
  return v;
}

/* parent_of() with only async-signal-safe calls (open, read: no stdio);
 * -1 when it cannot be read. */
static pid_t parent_of_raw(long pid) {
  char path[32] = "/proc/", num[24], buf[512], *p, *q;
  int n = 0, fd, len = 6;
  ssize_t got;

  do
    num[n++] = (char)('0' + pid % 10);
  while ((pid /= 10) && n < 23);
  while (n)
    path[len++] = num[--n];
  memcpy(path + len, "/stat", 6);
  if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
    return -1;
  got = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (got <= 0)
    return -1;
  buf[got] = '\0';
  for (p = NULL, q = buf; (q = strchr(q, ')')); q++)
    p = q;
  if (!p || strlen(p) < 5) /* ") S 123" */
    return -1;
  for (q = p + 4; *q && *q != ' '; q++)
    ;
  *q = '\0';
  return (pid_t)digits(p + 4);
}

/* The benchmark's SIGTERM: the supervisor's stop, or its death signal when
 * the supervisor is gone (SIGKILLed: nothing would stop the benchmark's
 * gshmd then).  Sends SIGTERM to each child of this process (its gshmd,
 * client processes, ucx_perftest), then dies by the signal (SA_RESETHAND:
 * raised again once the handler returns).  Async-signal-safe. */
static void bench_on_term(int sig) {
  struct dent64 {
    unsigned long long ino;
    long long off;
    unsigned short reclen;
    unsigned char type;
    char name[];
  } *d;
  char buf[4096] __attribute__((aligned(8)));
  pid_t self = getpid();
  int fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  long n, pid;

  while (fd >= 0 && (n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0)
    for (long off = 0; off < n; off += d->reclen) {
      d = (struct dent64 *)(void *)(buf + off);
      if ((pid = digits(d->name)) > 0 && parent_of_raw(pid) == self)
        kill((pid_t)pid, SIGTERM);
    }
  if (fd >= 0)
    close(fd);
  raise(sig);
}

/* ---- the supervisor's side ---- */

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  (type == FTW_DP ? rmdir : unlink)(path);
  return 0;
}

/* Makes the directory the benchmark gets as TMPDIR (sv->tmp; left "" when
 * it cannot be made: the benchmark then uses the caller's TMPDIR). */
static void tmp_make(struct supervisor *sv) {
  const char *t = getenv("TMPDIR");

  snprintf(sv->tmp, sizeof(sv->tmp), "%s/gshm-bench.XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(sv->tmp))
    sv->tmp[0] = '\0';
  else
    chmod(sv->tmp, 0755); /* as gshm__spawn_init's: other users reach the sockets */
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The supervisor's life: waits for the benchmark or a stop signal, then
 * stops and reaps every child; exits with the benchmark's status, or 128 +
 * the signal. */
static void supervise(struct supervisor *sv, const sigset_t *waited) {
  long long deadline = 0;

  for (;;) {
    /* SIGCHLD wakes it; the tick only times the grace (idle while measuring) */
    struct timespec tick = {deadline ? 0 : 1, deadline ? 50 * 1000000 : 0};
    int sig = sigtimedwait(waited, NULL, &tick);
    bool none_left;

    if (sig > 0 && sig != SIGCHLD) {
      sv->force = sv->got != 0; /* a second signal: no more grace */
      sv->got = sv->got ? sv->got : sig;
    }
    none_left = reap(sv);
    if (sv->bench && !sv->got)
      continue;
    if (none_left)
      break;
    if (!deadline)
      deadline = now_ms() + STOP_GRACE_MS;
    else if (now_ms() > deadline)
      sv->force = true;
    stop_children(sv);
  }
  free(sv->sent);
  if (sv->tmp[0]) /* every child reaped: nothing uses it now */
    nftw(sv->tmp, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  if (sv->got)
    die_by(sv->got);
  if (WIFSIGNALED(sv->bench_status))
    die_by(WTERMSIG(sv->bench_status));
  exit(WIFEXITED(sv->bench_status) ? WEXITSTATUS(sv->bench_status) : 1);
}

int bench_supervise(void) {
  static const int stops[] = {SIGTERM, SIGINT, SIGHUP};
  struct supervisor sv = {0};
  struct sigaction chld;
  sigset_t waited, old;
  pid_t parent = getpid();
  const char *on = getenv("GSHM_BENCH_SUPERVISE");

  /* (off for a profiler or debugger that follows only the process it
   * started: nsys, gdb) */
  if (on && !strcmp(on, "0"))
    return 0;
  /* SIGCHLD ignored (inherited) would have the kernel reap the benchmark
   * unseen; the benchmark gets the disposition it was started with */
  sigaction(SIGCHLD, NULL, &chld);
  signal(SIGCHLD, SIG_DFL);

  sigemptyset(&waited);
  sigaddset(&waited, SIGCHLD);
  for (size_t i = 0; i < sizeof(stops) / sizeof(stops[0]); i++) {
    struct sigaction sa;
    /* one ignored when we started (nohup's SIGHUP) stays ignored */
    if (sigaction(stops[i], NULL, &sa) == 0 && sa.sa_handler != SIG_IGN)
      sigaddset(&waited, stops[i]);
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
    return -errno;
  tmp_make(&sv);
  sigprocmask(SIG_BLOCK, &waited, &old);
  sv.bench = fork();
  if (sv.bench < 0) {
    int e = -errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
    if (sv.tmp[0])
      rmdir(sv.tmp);
    return e;
  }
  if (sv.bench == 0) {
    struct sigaction term = {.sa_handler = bench_on_term, .sa_flags = SA_RESETHAND};
    if (sv.tmp[0])
      setenv("TMPDIR", sv.tmp, 1);
    sigaction(SIGCHLD, &chld, NULL);
    sigaction(SIGTERM, &term, NULL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    /* the supervisor has one thread (the one that forked), so its death
     * signal is its exit: SIGKILLed, the benchmark stops too, and its
     * children with it (bench_on_term) */
    prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
    if (getppid() != parent)
      _exit(128 + SIGTERM);
    return 0;
  }
  supervise(&sv, &waited);
  return 0; /* (not reached) */
}
