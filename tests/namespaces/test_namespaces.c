/* SPDX-License-Identifier: Apache-2.0 */
/* Clients in containers against one gshmd on the host: what a Docker,
 * Podman or Kubernetes deployment does (docs/CONTAINERS.md), with the
 * kernel's namespaces and no container runtime.
 *
 * Each "box" is a process in its own user, pid, ipc, mount and network
 * namespaces.  Its mount namespace has a private /run holding only
 * /run/gshm/gshmd.sock, a read-only bind mount of the host's gshmd socket
 * (the volume a container gets), and the host's socket directory is covered by
 * an empty tmpfs; the box connects to the default socket path
 * (GSHM_SOCKET unset).  Two kinds:
 *
 *   root-mapped  root in the box is root outside (rootful Docker/Podman:
 *                uid_map "0 0 1").
 *   rootless     an unprivileged outer user (OUTER_UID, with supplementary
 *                group SHARE_GID) makes its own user namespace and maps
 *                itself to root in it, as rootless Podman does.  Root in
 *                the box is still OUTER_UID to gshmd: SO_PEERCRED and
 *                SO_PEERGROUPS give credentials as the receiver's
 *                namespaces see them.  The socket is gshmd's 0660 with
 *                group SHARE_GID (what socket_group does), so a rootless
 *                box whose outer user lacks that group cannot connect.
 *
 * What must hold, for both kinds:
 *   - host segments are shared both ways: the box reads a segment the
 *     host wrote, byte for byte, and writes one the host reads back;
 *   - permissions are decided by the OUTER uid and groups: the rootless
 *     box, root inside, cannot open root's 0600 segment nor write a 0644
 *     one, and can read a 0640 one of group SHARE_GID; what it creates is
 *     OUTER_UID's, which a host process of OUTER_UID may manage and
 *     another uid may not open;
 *   - gshmctl clients and mappings show the box's processes with the pids
 *     and uids of gshmd's namespaces (never pid 1 or uid 0 of the box);
 *   - a box whose whole pid namespace is killed (SIGKILL to its init, the
 *     kernel kills the rest) leaves no lease behind;
 *   - gshm needs no pidfd: pidfd_open of the host test process fails in
 *     the box (ESRCH), as it does for PyTorch's and UCX's IPC of cuMem
 *     memory across containers.
 *
 * --gpu: the same with device segments on the daemon's GPU 0 (gshmd with
 * the cuda backend; ctest gpu.namespaces, label gpu); exit 77 without a
 * CUDA driver and a GPU.  The test process itself never initialises CUDA
 * (its children do), since the boxes it forks could not use it then.  Without --gpu: host segments (ctest
 * namespaces).  Needs root (to be a second, unprivileged user) and a
 * kernel that allows root user namespaces; exits 77 saying why otherwise.
 * A kernel that refuses them to unprivileged users only (Debian's
 * unprivileged_userns_clone, AppArmor) skips the rootless boxes, says so,
 * and runs the root-mapped one. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gpu_check.h"
#include "gshm.h"
#include "harness.h"

#define OUTER_UID 61000 /* the rootless box's user outside (not 65534: that is also the overflow uid) */
#define OUTER_GID 61000
#define SHARE_GID 61100 /* a supplementary group OUTER_UID keeps in its box */
#define OTHER_UID 61001 /* a host user with no rights on the box's segments */
#define BOX_SOCKET GSHM_DEFAULT_SOCKET
#define LINE_TIMEOUT_MS 60000

struct box {
  const char *kind;
  bool rootless;
  bool socket_group; /* rootless: the outer user is in the socket's group SHARE_GID */
};

static const struct box boxes[] = {{"root-mapped", false, false}, {"rootless", true, true}};
static const struct box outsider = {"rootless-outside-socket-group", true, false};

static struct harness h;
static bool gpu;
static const char *location = "host";
static size_t seg_size = (1u << 20) + 123;
static pid_t test_pid;

/* ---- the box ---- */

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  ssize_t n, len = (ssize_t)strlen(text);
  if (fd < 0)
    return -errno;
  n = write(fd, text, (size_t)len);
  close(fd);
  return n == len ? 0 : -EIO;
}

/* Turns the calling process into a box's outer process: rootless ones
 * first become OUTER_UID (groups OUTER_GID, SHARE_GID); then new user,
 * mount, pid, ipc and network namespaces with root mapped to the outer
 * user, and the mounts described at the top.  Its next child is pid 1 of
 * the box.  Returns 0 or a negative errno, with the step on stderr. */
static int enter_box(const struct box *b, const char *host_socket) {
  char map[64], dir[PATH_MAX];
  const gid_t groups[] = {OUTER_GID, SHARE_GID};
  size_t ngroups = b->socket_group ? 2 : 1;
  uid_t uid = b->rootless ? OUTER_UID : 0;
  gid_t gid = b->rootless ? OUTER_GID : 0;
  int fd;

#define STEP(call)                                                                   \
  do {                                                                               \
    if ((call) < 0) {                                                                \
      int e_ = errno;                                                                \
      fprintf(stderr, "%s box: %s: %s\n", b->kind, #call, strerror(e_));             \
      return -e_;                                                                    \
    }                                                                                \
  } while (0)

  if (b->rootless) {
    STEP(setgroups(ngroups, groups));
    STEP(setresgid(OUTER_GID, OUTER_GID, OUTER_GID));
    STEP(setresuid(OUTER_UID, OUTER_UID, OUTER_UID));
    /* a changed uid makes the process non-dumpable, and /proc/self/uid_map
     * then belongs to root: the user must own it to write it */
    STEP(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0));
  }
  STEP(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET));
  snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)uid);
  STEP(write_file("/proc/self/setgroups", "deny"));
  STEP(write_file("/proc/self/uid_map", map));
  snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)gid);
  STEP(write_file("/proc/self/gid_map", map));

  /* nothing mounted here reaches the host */
  STEP(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
  STEP(mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"));
  STEP(mkdir("/run/gshm", 0755));
  STEP(fd = open(BOX_SOCKET, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  close(fd);
  STEP(mount(host_socket, BOX_SOCKET, NULL, MS_BIND, NULL));
  /* read-only, as docs/CONTAINERS.md's ":ro": connecting still works */
  STEP(mount(NULL, BOX_SOCKET, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL));
  /* the host's socket directory: an empty tmpfs over it in the box */
  snprintf(dir, sizeof(dir), "%s", host_socket);
  *strrchr(dir, '/') = '\0';
  STEP(mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"));
#undef STEP
  return 0;
}

/* A running box: its outer process, its init's pid as the host sees it,
 * and the pipes to and from what runs inside. */
struct boxed {
  pid_t outer, init;
  int from, to;
};

typedef int (*box_fn)(const struct box *b, int out, int in);

static bool read_line(int fd, char *buf, size_t cap);
static int box_wait(struct boxed *bx);

/* Starts fn in box b as its pid 1, with out (lines to the test) and in
 * (lines from it); the box's init pid as the host sees it is in bx->init
 * when this returns.  The outer process exits with fn's exit code (128 +
 * signal when killed). */
static void box_start(const struct box *b, box_fn fn, struct boxed *bx) {
  int up[2], down[2], sync[2], status;
  pid_t init;
  char line[64];

  REQUIRE(pipe2(up, O_CLOEXEC) == 0 && pipe2(down, O_CLOEXEC) == 0, "pipe");
  bx->outer = fork();
  REQUIRE(bx->outer >= 0, "fork");
  if (bx->outer == 0) {
    signal(SIGPIPE, SIG_IGN); /* the test may stop reading before we are done */
    close(up[0]);
    close(down[1]);
    if (enter_box(b, h.socket_path) || pipe2(sync, O_CLOEXEC))
      _exit(3);
    init = fork();
    if (init == 0) {
      char c;
      close(sync[1]);
      /* "init N" goes first: wait until it is written */
      if (read(sync[0], &c, 1) != 1)
        _exit(5);
      /* The box's own /proc, as container runtimes mount it: in a new pid
       * namespace that still sees the host's /proc, /proc/<getpid()> is
       * another process, and cuInit fails with CUDA_ERROR_OPERATING_SYSTEM
       * (304; seen on the lent H200s, where `unshare -U -r -m -p -f` alone
       * gave 304 and `-U -r -m` gave 0). */
      if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        fprintf(stderr, "%s box: mount /proc: %s (device segments need it)\n", b->kind,
                strerror(errno));
      failures = 0; /* the box's own, not the test's so far */
      unsetenv("GSHM_SOCKET"); /* the default path, as in a container */
      _exit(fn(b, up[1], down[0]));
    }
    if (init < 0)
      _exit(4);
    dprintf(up[1], "init %d\n", (int)init);
    if (write(sync[1], "", 1) != 1)
      _exit(6);
    close(sync[0]);
    close(sync[1]);
    close(up[1]);
    close(down[0]);
    while (waitpid(init, &status, 0) < 0 && errno == EINTR)
      ;
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  close(up[1]);
  close(down[0]);
  bx->from = up[0];
  bx->to = down[1];
  REQUIRE(read_line(bx->from, line, sizeof(line)) && !strncmp(line, "init ", 5),
          "%s box did not start (exit %d)", b->kind, box_wait(bx));
  bx->init = (pid_t)atoi(line + 5);
}

/* One line from fd (without its newline) within LINE_TIMEOUT_MS; false on
 * end of file, error or timeout. */
static bool read_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  while (n + 1 < cap) {
    char c;
    if (poll(&p, 1, LINE_TIMEOUT_MS) <= 0 || read(fd, &c, 1) != 1)
      return false;
    if (c == '\n')
      break;
    buf[n++] = c;
  }
  buf[n] = '\0';
  return true;
}

/* Reads the box's next line; true when it starts with `want`. */
static bool box_expect(struct boxed *bx, const char *want, char *line, size_t cap) {
  if (!read_line(bx->from, line, cap)) {
    fprintf(stderr, "box: no '%s' line\n", want);
    return false;
  }
  if (strncmp(line, want, strlen(want))) {
    fprintf(stderr, "box said '%s' while '%s' was expected\n", line, want);
    return false;
  }
  return true;
}

/* Waits for the box's outer process; returns its exit code (-1 on error). */
static int box_wait(struct boxed *bx) {
  int status;
  close(bx->from);
  close(bx->to);
  while (waitpid(bx->outer, &status, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- helpers on both sides ---- */

static unsigned char *pattern(unsigned long long seed) {
  unsigned char *p = malloc(seg_size);
  REQUIRE(p, "malloc");
  harness_random(p, seg_size, seed);
  return p;
}

/* Creates segment name (mode) on `location` filled with pattern(seed).
 * Returns 0 or the negative errno of the step that failed. */
static int create_filled(gshm_client_t *c, const char *name, uint32_t mode,
                         unsigned long long seed) {
  gshm_segment_t *s;
  unsigned char *p = pattern(seed);
  int e = gshm_create(c, name, seg_size, location, mode, 0, &s);
  if (!e) {
    e = gshm_write(s, 0, p, seg_size);
    gshm_close(s);
  }
  free(p);
  return e;
}

/* 0 when segment name holds pattern(seed) byte for byte; else a negative
 * errno, or 1 for different bytes. */
static int check_filled(gshm_client_t *c, const char *name, unsigned long long seed) {
  gshm_segment_t *s;
  unsigned char *want = pattern(seed), *got = malloc(seg_size);
  int e = gshm_open(c, name, GSHM_ACCESS_READ, &s);
  REQUIRE(got, "malloc");
  if (!e) {
    e = gshm_read(s, 0, got, seg_size);
    if (!e && memcmp(got, want, seg_size))
      e = 1;
    gshm_close(s);
  }
  free(want);
  free(got);
  return e;
}

static int open_rc(gshm_client_t *c, const char *name, gshm_access_t access) {
  gshm_segment_t *s;
  int e = gshm_open(c, name, access, &s);
  if (!e)
    gshm_close(s);
  return e;
}

/* The host's side of the bytes runs in a child with its own connection:
 * the test process never initialises CUDA, which a forked box could then
 * not use (CUDA does not survive fork).  Returns create_filled's or
 * check_filled's result (0; 1: other bytes; else a negative errno). */
static int host_bytes(bool create, const char *name, uint32_t mode, unsigned long long seed) {
  int status;
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    gshm_client_t *c;
    int e = gshm_connect(h.socket_path, "host-bytes", &c);
    if (!e)
      e = create ? create_filled(c, name, mode, seed) : check_filled(c, name, seed);
    _exit(e < 0 ? 100 - e : e); /* 0, 1, or 100 + errno */
  }
  REQUIRE(waitpid(pid, &status, 0) == pid && WIFEXITED(status), "host-bytes child");
  status = WEXITSTATUS(status);
  return status >= 100 ? -(status - 100) : status;
}

/* ---- what runs in the boxes ---- */

/* The sharing step: reads the host's segment, checks what the outer uid may
 * do, writes "box/<kind>" for the host.  Exit code: failures. */
static int box_share(const struct box *b, int out, int in) {
  char name[64];
  gshm_client_t *c;
  int e;

  (void)in;
  CHECK(getpid() == 1, "pid %d in the box, not 1", (int)getpid());
  CHECK(getuid() == 0 && geteuid() == 0, "uid %u in the box, not 0", (unsigned)getuid());
  CHECK(access(h.socket_path, F_OK) < 0 && errno == ENOENT,
            "the host's socket path is visible in the box");
  e = (int)syscall(SYS_pidfd_open, test_pid, 0);
  CHECK(e < 0 && (errno == ESRCH || errno == ENOSYS),
            "pidfd_open of the host's pid %d from the box: %d (%s)", (int)test_pid, e,
            strerror(errno));
  e = gshm_connect(NULL, b->rootless ? "box-rootless" : "box-root", &c);
  if (e) {
    fprintf(stderr, "%s box: connect %s: %s\n", b->kind, BOX_SOCKET, gshm_strerror(e));
    return 100;
  }
  CHECK(check_filled(c, "host/shared", 11) == 0, "%s box: host/shared not read back",
            b->kind);
  if (b->rootless) {
    /* root in the box, OUTER_UID to gshmd: "other" on root's segments */
    e = open_rc(c, "host/private", GSHM_ACCESS_READ);
    CHECK(e == -EACCES, "rootless box opened root's 0600 segment: %s", gshm_strerror(e));
    e = open_rc(c, "host/shared", GSHM_ACCESS_READ_WRITE);
    CHECK(e == -EACCES, "rootless box opened root's 0644 segment rw: %s", gshm_strerror(e));
    e = open_rc(c, "host/group", GSHM_ACCESS_READ);
    CHECK(e == 0, "rootless box could not read the 0640 segment of its outer group: %s",
              gshm_strerror(e));
    e = gshm_unlink(c, "host/shared");
    CHECK(e == -EACCES || e == -EPERM, "rootless box unlinked root's segment: %s",
              gshm_strerror(e));
  } else {
    e = open_rc(c, "host/private", GSHM_ACCESS_READ_WRITE);
    CHECK(e == 0, "root-mapped box could not open root's 0600 segment: %s",
              gshm_strerror(e));
  }
  snprintf(name, sizeof(name), "box/%s", b->kind);
  e = create_filled(c, name, 0600, b->rootless ? 22 : 21);
  CHECK(e == 0, "%s box: create %s: %s", b->kind, name, gshm_strerror(e));
  gshm_disconnect(c);
  dprintf(out, "done\n");
  return failures;
}

/* A rootless box whose outer user is not in the socket's group: the
 * socket's mode refuses it, whatever it is in the box. */
static int box_refused(const struct box *b, int out, int in) {
  gshm_client_t *c;
  int e = gshm_connect(NULL, b->kind, &c);
  (void)in;
  CHECK(e == -EACCES, "%s box: connect gave %s, not EACCES", b->kind, gshm_strerror(e));
  if (!e)
    gshm_disconnect(c);
  dprintf(out, "done\n");
  return failures;
}

/* Holds the child's lease until killed: connect, open host/shared, map it. */
static void hold(const char *client_name, int out, const char *say) {
  gshm_client_t *c;
  gshm_segment_t *s;
  void *addr;
  int e = gshm_connect(NULL, client_name, &c);
  if (!e)
    e = gshm_open(c, "host/shared", GSHM_ACCESS_READ, &s);
  if (!e)
    e = gshm_map(s, NULL, 0, &addr);
  if (e) {
    dprintf(out, "error %s: %s\n", client_name, gshm_strerror(e));
    _exit(1);
  }
  dprintf(out, "%s\n", say);
}

/* The kill step: init (pid 1) and its child (pid 2) each hold a mapped lease
 * on host/shared; the test looks at them from outside and kills the box. */
static int box_hold(const struct box *b, int out, int in) {
  char line[16];
  pid_t child;
  (void)b;
  child = fork();
  if (child == 0) {
    hold("box-child", out, "child ready");
    for (;;)
      pause();
  }
  if (child != 2 || !read_line(in, line, sizeof(line))) {
    dprintf(out, "error child pid %d in the box, not 2\n", (int)child);
    return 1;
  }
  hold("box-init", out, "ready");
  for (;;)
    pause();
}

/* ---- what the test sees from the host ---- */

/* gshmctl --json VERB's array KEY; NULL (with the reason on stderr) when
 * gshmctl failed. */
static json_t *ctl_array(const char *verb, const char *key) {
  const char *args[] = {"--json", verb, NULL};
  char *out = NULL;
  json_error_t err;
  json_t *doc, *arr;
  int rc = harness_gshmctl(&h, &out, args);
  if (rc != 0 || !out) {
    fprintf(stderr, "gshmctl %s: exit %d\n", verb, rc);
    free(out);
    return NULL;
  }
  doc = json_loads(out, 0, &err);
  free(out);
  arr = doc ? json_incref(json_object_get(doc, key)) : NULL;
  json_decref(doc);
  if (!json_is_array(arr)) {
    fprintf(stderr, "gshmctl --json %s: no '%s' array\n", verb, key);
    json_decref(arr);
    return NULL;
  }
  return arr;
}

static json_int_t jint(json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

static const char *jstr(json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

/* The entry of array arr whose field key is value, or NULL. */
static json_t *find(json_t *arr, const char *key, const char *value) {
  size_t i;
  json_t *o;
  json_array_foreach(arr, i, o) if (!strcmp(jstr(o, key), value)) return o;
  return NULL;
}

/* The last number on line `key` ("PPid:", "NSpid:") of /proc/PID/status,
 * -1 when unreadable.  NSpid's last is the pid in the innermost namespace. */
static long status_last(pid_t pid, const char *key) {
  char path[64], line[256];
  long last = -1;
  FILE *f;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  if (!(f = fopen(path, "r")))
    return -1;
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, key, strlen(key))) {
      char *p = line + strlen(key), *end;
      for (long v; (v = strtol(p, &end, 10)), end != p; p = end)
        last = v;
    }
  fclose(f);
  return last;
}

/* Leases on segment name held by pid; -1 when gshmctl failed. */
static int leases_of(const char *name, pid_t pid) {
  json_t *maps = ctl_array("mappings", "mappings"), *o;
  size_t i;
  int n = 0;
  if (!maps)
    return -1;
  json_array_foreach(maps, i, o) if (!strcmp(jstr(o, "segment"), name) &&
                                     (pid == 0 || jint(o, "pid") == pid)) n++;
  json_decref(maps);
  return n;
}

/* Runs fn as uid (group uid, supplementary SHARE_GID: it may connect) in a
 * host process, without namespaces: its exit code. */
static int as_host_user(uid_t uid, int (*fn)(gshm_client_t *c)) {
  const gid_t share = SHARE_GID;
  int status;
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    gshm_client_t *c;
    if (setgroups(1, &share) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
      _exit(120);
    if (gshm_connect(h.socket_path, "host-user", &c))
      _exit(121);
    _exit(fn(c));
  }
  REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* OUTER_UID on the host owns what its rootless box made: reads it, chmods it. */
static int outer_owner_manages(gshm_client_t *c) {
  int e = open_rc(c, "box/rootless", GSHM_ACCESS_READ_WRITE);
  if (e)
    return 10;
  return gshm_chmod(c, "box/rootless", 0640) ? 11 : 0;
}

/* Another host uid may not open it. */
static int other_is_refused(gshm_client_t *c) {
  return open_rc(c, "box/rootless", GSHM_ACCESS_READ) == -EACCES ? 0 : 12;
}

/* Runs fn in box b to its end: it says "done" and exits 0. */
static void box_run(const struct box *b, box_fn fn) {
  struct boxed bx;
  char line[256];
  int rc;
  box_start(b, fn, &bx);
  CHECK(box_expect(&bx, "done", line, sizeof(line)), "%s box did not finish", b->kind);
  rc = box_wait(&bx);
  CHECK(rc == 0, "%s box: exit %d (its failures are above)", b->kind, rc);
}

static void step_share(gshm_client_t *host, const struct box *b) {
  char name[64];
  gshm_segment_info_t info = {0};
  json_t *segs, *o;

  fprintf(stderr, "-- %s box: share both ways, permissions by the outer uid\n", b->kind);
  box_run(b, box_share);
  snprintf(name, sizeof(name), "box/%s", b->kind);
  /* and back: the host reads what the box wrote; owner as gshmd saw it */
  CHECK(host_bytes(false, name, 0, b->rootless ? 22 : 21) == 0, "%s not read back on the host",
        name);
  CHECK(gshm_stat_name(host, name, &info) == 0 &&
            info.uid == (b->rootless ? OUTER_UID : 0u) &&
            info.gid == (b->rootless ? OUTER_GID : 0u),
        "%s: owner %u:%u, not the outer user", name, info.uid, info.gid);
  if ((segs = ctl_array("segments", "segments"))) {
    o = find(segs, "name", name);
    CHECK(o && jint(o, "uid") == (b->rootless ? OUTER_UID : 0), "gshmctl segments: %s uid %d",
          name, o ? (int)jint(o, "uid") : -1);
    json_decref(segs);
  }
  if (b->rootless) {
    CHECK(as_host_user(OUTER_UID, outer_owner_manages) == 0,
          "OUTER_UID on the host cannot manage what its box created");
    CHECK(as_host_user(OTHER_UID, other_is_refused) == 0,
          "another host user opened the rootless box's 0600 segment");
  }
  CHECK(gshm_unlink(host, name) == 0, "unlink %s", name);
}

static void step_kill(const struct box *b) {
  struct boxed bx;
  char line[256];
  json_t *clients, *maps, *ci, *cc;
  pid_t child = -1;
  json_int_t uid = b->rootless ? OUTER_UID : 0;
  int rc, left = -1;
  size_t i;
  json_t *o;

  fprintf(stderr, "-- %s box: pids and uids as gshmd sees them; kill the pid namespace\n",
          b->kind);
  box_start(b, box_hold, &bx);
  REQUIRE(box_expect(&bx, "child ready", line, sizeof(line)), "%s box: no child", b->kind);
  dprintf(bx.to, "go\n");
  REQUIRE(box_expect(&bx, "ready", line, sizeof(line)), "%s box: init did not open", b->kind);

  clients = ctl_array("clients", "clients");
  maps = ctl_array("mappings", "mappings");
  REQUIRE(clients && maps, "gshmctl clients / mappings");
  ci = find(clients, "name", "box-init");
  cc = find(clients, "name", "box-child");
  CHECK(ci && jint(ci, "pid") == bx.init && jint(ci, "uid") == uid,
        "gshmctl clients: box-init pid %d uid %d, want the host's pid %d and uid %d",
        ci ? (int)jint(ci, "pid") : -1, ci ? (int)jint(ci, "uid") : -1, (int)bx.init, (int)uid);
  if (cc) {
    child = (pid_t)jint(cc, "pid");
    CHECK(jint(cc, "uid") == uid, "box-child uid %d", (int)jint(cc, "uid"));
    /* gshmd's pid for the child is the host's: pid 2 in its own namespace,
     * a child of the box's init */
    CHECK(status_last(child, "NSpid:") == 2 && status_last(child, "PPid:") == bx.init,
          "box-child: gshmd says pid %d, whose innermost pid is %ld and parent %ld", (int)child,
          status_last(child, "NSpid:"), status_last(child, "PPid:"));
  } else {
    CHECK(0, "gshmctl clients shows no box-child");
  }
  CHECK(status_last(bx.init, "NSpid:") == 1, "the box's init is pid %ld in its namespace",
        status_last(bx.init, "NSpid:"));
  json_array_foreach(maps, i, o) {
    if (strcmp(jstr(o, "segment"), "host/shared") || strncmp(jstr(o, "client"), "box-", 4))
      continue;
    CHECK((jint(o, "pid") == bx.init || jint(o, "pid") == child) && jint(o, "uid") == uid &&
              json_is_true(json_object_get(o, "mapped")),
          "gshmctl mappings: %s pid %d uid %d mapped %d", jstr(o, "client"), (int)jint(o, "pid"),
          (int)jint(o, "uid"), json_is_true(json_object_get(o, "mapped")));
    if (gpu) /* mapped on every GPU that reaches GPU 0: one at least */
      CHECK(json_array_size(json_object_get(o, "devices")) >= 1,
            "the box's device mapping names no GPU");
  }
  CHECK(leases_of("host/shared", bx.init) == 1 && child > 0 &&
            leases_of("host/shared", child) == 1,
        "the box's two leases are not both listed");
  json_decref(clients);
  json_decref(maps);

  /* the whole pid namespace: its init's death kills the child too */
  REQUIRE(kill(bx.init, SIGKILL) == 0, "kill the box's init");
  rc = box_wait(&bx);
  CHECK(rc == 128 + SIGKILL, "%s box's init ended with %d, not SIGKILL", b->kind, rc);
  for (int t = 0; t < 500; t++) { /* gshmd sees the hangups at once; 5 s at most */
    left = leases_of("host/shared", 0);
    if (left == 0) /* the host holds none: each step closes what it opens */
      break;
    usleep(10000);
  }
  CHECK(left == 0, "%d lease(s) on host/shared left after the box died", left);
  CHECK(child > 0 && kill(child, 0) < 0 && errno == ESRCH, "the box's child %d outlived it",
        (int)child);
}

static void step_refused(const struct box *b) {
  fprintf(stderr, "-- %s box: the socket's group decides who connects\n", b->kind);
  box_run(b, box_refused);
}

static void make_host_segments(gshm_client_t *host) {
  REQUIRE(host_bytes(true, "host/shared", 0644, 11) == 0, "create host/shared");
  REQUIRE(host_bytes(true, "host/private", 0600, 12) == 0, "create host/private");
  REQUIRE(host_bytes(true, "host/group", 0640, 13) == 0, "create host/group");
  REQUIRE(gshm_chown(host, "host/group", (uint32_t)-1, SHARE_GID) == 0, "chown host/group");
}

/* Whether this kernel lets a box of the kind be made: its user (root, or
 * OUTER_UID for a rootless one) unshares the namespaces, in a child. */
static bool kind_allowed(bool rootless) {
  int status;
  pid_t pid = fork();

  if (pid == 0) {
    if (rootless && (setgroups(0, NULL) || setresgid(OUTER_GID, OUTER_GID, OUTER_GID) ||
                     setresuid(OUTER_UID, OUTER_UID, OUTER_UID)))
      _exit(2);
    _exit(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET) ? 1
                                                                                           : 0);
  }
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

/* 0 when every kind of box can be made here; else says which cannot and
 * why, and returns 77 when none can (root-mapped boxes need only root's
 * CLONE_NEWUSER, which kernels that refuse unprivileged users still
 * allow: then the rootless steps alone are skipped, *rootless_out false). */
static int probe(bool *rootless_out) {
  char text[256] = "";
  bool root_ok;
  FILE *f;

  *rootless_out = false;
  if (geteuid() != 0) {
    fprintf(stderr, "SKIP: needs root (to act as an unprivileged second user and as root)\n");
    return SKIP;
  }
  root_ok = kind_allowed(false);
  if ((*rootless_out = kind_allowed(true)) && root_ok)
    return 0;
  for (int i = 0; i < 2; i++) {
    const char *path =
        i ? "/proc/sys/user/max_user_namespaces" : "/proc/sys/kernel/unprivileged_userns_clone";
    char v[32] = "(absent)";
    if ((f = fopen(path, "r"))) {
      if (!fgets(v, sizeof(v), f))
        snprintf(v, sizeof(v), "(unreadable)");
      v[strcspn(v, "\n")] = '\0';
      fclose(f);
    }
    snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s%s = %s", i ? ", " : "", path,
             v);
  }
  if (root_ok) {
    fprintf(stderr,
            "the kernel refuses an unprivileged user (uid %d) new user, mount, pid, ipc and "
            "network namespaces (%s; AppArmor's kernel.apparmor_restrict_unprivileged_userns "
            "may refuse them too): the rootless boxes SKIPPED, the root-mapped one runs\n",
            OUTER_UID, text);
    return 0;
  }
  fprintf(stderr,
          "SKIP: the kernel refuses %s new user, mount, pid, ipc and network namespaces (%s; "
          "a container's seccomp profile refuses them to root too)\n",
          *rootless_out ? "root" : "root and an unprivileged user", text);
  return SKIP;
}

/* GPUs the driver sees, counted in a child: CUDA initialised here would not
 * work in the boxes forked later.  0 without a driver. */
static int gpu_count(void) {
  int status;
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    const struct gshm_cudadrv *drv;
    int count = 0;
    if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) || drv->cuDeviceGetCount(&count) != CUDA_SUCCESS)
      count = 0;
    _exit(count > 100 ? 100 : count);
  }
  REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

int main(int argc, char **argv) {
  const char *const host_args[] = {"--backend", "host", NULL};
  const char *const gpu_args[] = {"--backend", "cuda", NULL};
  gshm_client_t *host;
  bool rootless_ok;
  int e, st;

  gpu = argc > 1 && !strcmp(argv[1], "--gpu");
  test_pid = getpid();
  if ((e = probe(&rootless_ok)))
    return e;
  if (gpu) {
    int count = gpu_count();
    if (count < 1) {
      fprintf(stderr, "SKIP: needs a CUDA driver and a GPU (have %d)\n", count);
      return SKIP;
    }
    location = "cuda:0";
    seg_size = (64u << 20) + 4097;
  }
  REQUIRE(harness_start(&h, gpu ? gpu_args : host_args) == 0, "gshmd did not start");
  harness_set_leftover(&h);
  atexit(harness_kill_leftover);
  /* socket_group as gshmd applies it (socket_mode 0660 and the socket's
   * group): SHARE_GID has no name in /etc/group to put in the config */
  REQUIRE(chown(h.socket_path, (uid_t)-1, SHARE_GID) == 0, "chown the socket");
  REQUIRE(gshm_connect(h.socket_path, "host", &host) == 0, "connect");
  make_host_segments(host);
  if (rootless_ok)
    step_refused(&outsider);
  for (size_t i = 0; i < sizeof(boxes) / sizeof(boxes[0]); i++) {
    if (boxes[i].rootless && !rootless_ok)
      continue; /* (said by probe) */
    step_share(host, &boxes[i]);
    step_kill(&boxes[i]);
  }
  CHECK(host_bytes(false, "host/shared", 0, 11) == 0, "host/shared changed under the boxes");
  gshm_disconnect(host);
  harness_set_leftover(NULL);
  st = harness_stop(&h);
  CHECK(st == 0, "gshmd exit status %d", st);
  fprintf(stderr, "%s: %d failure(s)\n", gpu ? "gpu.namespaces" : "namespaces", failures);
  return failures ? 1 : 0;
}
