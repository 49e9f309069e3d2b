/* SPDX-License-Identifier: Apache-2.0 */
/* gshm-demo: README's main job.
 *
 * Starts a private gshmd (its own socket in a fresh directory, built-in
 * defaults), then: a producer process creates a segment and fills it with
 * pseudo-random bytes; a consumer process opens it read-only, maps it and
 * verifies every byte; while both hold it, `gshmctl mappings` shows them;
 * then everything stops cleanly.  Then (unless --no-gpu) gshm-demo-gpu does
 * the same with a device segment: across two GPUs, or between two processes
 * on GPU 0 when there is one.  Without a GPU that part says so and is
 * skipped, and the demo passes when the host part did. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"
#include "log.h"
#include "gshm.h"
#include "spawn.h"
#include "util.h"

#define SEGMENT "demo/weights"
#define DEMO_MIN_SIZE 8 /* bytes: one word of the pattern */

/* xorshift64*: the same stream in both processes, no shared state. */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static char self_dir[PATH_MAX];

static void find_self_dir(void) {
  ssize_t n = readlink("/proc/self/exe", self_dir, sizeof(self_dir) - 1);
  char *slash;
  self_dir[n > 0 ? n : 0] = '\0';
  if ((slash = strrchr(self_dir, '/')))
    *slash = '\0';
}

/* Producer: create, map, fill; then hold until the parent says go. */
static int producer(const char *sock, uint64_t size, uint64_t seed, int ready_fd, int go_fd) {
  gshm_client_t *c;
  gshm_segment_t *seg;
  uint64_t *p, s = seed;
  void *addr;
  char ok = 1, go, shown[32];
  int e;

  if ((e = gshm_connect(sock, "demo-producer", &c)) ||
      (e = gshm_create(c, SEGMENT, size, "host", 0600, 0, &seg)) ||
      (e = gshm_map(seg, NULL, 0, &addr))) {
    fprintf(stderr, "producer: %s\n", gshm_strerror(e));
    return 1;
  }
  p = addr;
  for (uint64_t i = 0; i < size / 8; i++)
    p[i] = rng_next(&s);
  printf("producer (pid %d): created '%s', %s at %s, filled with random data\n", (int)getpid(),
         SEGMENT, gshm__format_size(size, shown, sizeof(shown)), gshm_segment_info(seg)->location);
  fflush(stdout);
  if (write(ready_fd, &ok, 1) != 1 || read(go_fd, &go, 1) != 1)
    return 1;
  gshm_close(seg);
  gshm_disconnect(c);
  return 0;
}

/* Consumer: open read-only, map, verify every byte; then hold. */
static int consumer(const char *sock, uint64_t seed, int ready_fd, int go_fd) {
  gshm_client_t *c;
  gshm_segment_t *seg;
  const uint64_t *p;
  uint64_t s = seed, size, bad = 0;
  void *addr;
  char ok, go, shown[32];
  int e;

  if ((e = gshm_connect(sock, "demo-consumer", &c)) ||
      (e = gshm_open(c, SEGMENT, GSHM_ACCESS_READ, &seg)) ||
      (e = gshm_map(seg, NULL, 0, &addr))) {
    fprintf(stderr, "consumer: %s\n", gshm_strerror(e));
    return 1;
  }
  size = gshm_segment_info(seg)->requested_size; /* (size: rounded up to a page) */
  p = addr;
  for (uint64_t i = 0; i < size / 8; i++)
    bad += p[i] != rng_next(&s);
  printf("consumer (pid %d): opened '%s' read-only, mapped %s, verified %" PRIu64 " word%s: %s\n",
         (int)getpid(), SEGMENT, gshm__format_size(size, shown, sizeof(shown)), size / 8,
         gshm__plural(size / 8), bad ? "MISMATCH" : "all equal");
  fflush(stdout);
  ok = bad == 0;
  if (write(ready_fd, &ok, 1) != 1 || read(go_fd, &go, 1) != 1)
    return 1;
  gshm_close(seg);
  gshm_disconnect(c);
  return bad ? 1 : 0;
}

static int run_tool(const char *tool, const char *const *args) {
  char path[PATH_MAX + 32];
  const char *argv[16];
  int argc = 0, status;
  pid_t pid;

  snprintf(path, sizeof(path), "%s/%s", self_dir, tool);
  argv[argc++] = path;
  for (int i = 0; args[i] && argc < 15; i++)
    argv[argc++] = args[i];
  argv[argc] = NULL;
  fflush(stdout);
  if ((pid = fork()) == 0) {
    execv(path, (char *const *)argv);
    execvp(tool, (char *const *)argv); /* installed: on PATH */
    _exit(127);
  }
  if (pid < 0 || waitpid(pid, &status, 0) < 0)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* Whether the CUDA driver loads and sees at least one GPU. */
static bool gpu_here(void) {
  const struct gshm_cudadrv *drv;
  int n = 0;
  return !gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) && drv->cuDeviceGetCount(&n) == CUDA_SUCCESS &&
         n > 0;
}

static pid_t start_child(int (*fn)(void *), void *arg) {
  pid_t pid = fork();
  if (pid == 0) {
    fflush(stdout);
    _exit(fn(arg));
  }
  return pid;
}

struct role {
  const char *sock;
  uint64_t size, seed;
  int ready[2], go[2];
  int is_producer;
};

static int role_main(void *p) {
  struct role *r = p;
  close(r->ready[0]);
  close(r->go[1]);
  return r->is_producer ? producer(r->sock, r->size, r->seed, r->ready[1], r->go[0])
                        : consumer(r->sock, r->seed, r->ready[1], r->go[0]);
}

/* gshmd's STATUS= less its fd-limit part ("; fd limit N is below ..."):
 * a note for a service's LimitNOFILE=, which a demo's own gshmd under a
 * shell's limit has nothing to do with (its log says nothing of it
 * either).  Edits status in place. */
static const char *without_fd_limit(char *status) {
  char *p = strstr(status, "; fd limit "), *next;

  if (p) {
    next = strstr(p + 2, "; ");
    memmove(p, next ? next : "", strlen(next ? next : "") + 1);
  }
  return status;
}

/* Parses --size's value s into *size (bytes).  Returns 0, or -1 where it
 * is none gshm-demo takes, said on stderr with the sizes it takes: "bad
 * size" alone left the user to guess the least, the most and the units. */
static int bad_size(const char *s, uint64_t *size) {
  int e = gshm__parse_size(s, size);

  if (!e && *size >= DEMO_MIN_SIZE)
    return 0;
  fprintf(stderr,
          "gshm-demo: --size '%s': %s: give at least %d bytes, at most what this host's memory "
          "holds (default 64M; " GSHM_SIZE_SYNTAX ")\n",
          s, e ? gshm__size_refusal(s, e) : "too small", DEMO_MIN_SIZE);
  return -1;
}

/* gshm-demo's options: *size (bytes), *gpu (-1 auto, 0 --no-gpu, 1
 * --gpu).  Returns -1 to go on, else the exit status (--help: 0, printed
 * once every option parsed; a usage error, said as gshmctl says its: 2). */
static int demo_options(int argc, char **argv, uint64_t *size, int *gpu) {
  static const struct option opts[] = {{"size", required_argument, NULL, 's'},
                                       {"gpu", no_argument, NULL, 'g'},
                                       {"no-gpu", no_argument, NULL, 'n'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int o;
  bool help = false;

  opterr = 0; /* our own messages, "gshm-demo: ...", not argv[0]'s */
  while ((o = getopt_long(argc, argv, ":s:h", opts, NULL)) != -1) {
    switch (o) {
    case 's':
      if (bad_size(optarg, size))
        return 2;
      break;
    case 'g':
      *gpu = 1;
      break;
    case 'n':
      *gpu = 0;
      break;
    case 'h':
      help = true;
      break;
    case ':':
      fprintf(stderr, "gshm-demo: option '%s' needs a value\n", argv[optind - 1]);
      return 2;
    default:
      fprintf(stderr, "gshm-demo: unknown option '%s' (gshm-demo --help lists them)\n",
              argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gshm-demo: unexpected argument '%s' (it takes options only)\n", argv[optind]);
    return 2;
  }
  if (help)
    printf("usage: gshm-demo [--size BYTES] [--gpu|--no-gpu]\n"
           "Starts a private gshmd, shares a segment between two processes, verifies it,\n"
           "shows `gshmctl mappings`, and stops.  gshmd is found through $GSHMD, next to\n"
           "this program, or on PATH.\n");
  return help ? 0 : -1;
}

/* Returns rc, the demo's exit status, or 1 (said on stderr) where rc is 0
 * and what it printed on stdout could not be written (a full disk under
 * "gshm-demo --help > FILE"): not 0 over a cut or empty file. */
static int demo_output_written(int rc) {
  int e = gshm__stdout_flush();

  if (e)
    fprintf(stderr, "gshm-demo: writing to stdout: %s\n", strerror(-e));
  return e && rc == 0 ? 1 : rc;
}

/* Starts the demo's own gshmd in sp.  Returns 0, or 1 (said why; sp
 * cleaned up). */
static int demo_gshmd_start(struct gshm_spawn *sp) {
  int e;

  if ((e = gshm__spawn_init(sp))) {
    fprintf(stderr, "gshm-demo: %s\n", strerror(-e));
    return 1;
  }
  printf("== starting gshmd on %s\n", sp->socket_path);
  if ((e = gshm__spawn_start(sp, gshm__find_gshmd(), (const char *const[]){"--log-level", "5", NULL},
                             false, 10000))) {
    fprintf(stderr, "gshm-demo: gshmd did not become ready: %s\n", strerror(-e));
    gshm__spawn_cleanup(sp);
    return 1;
  }
  printf("gshmd ready (pid %d): %s\n", (int)sp->pid, without_fd_limit(sp->status));
  return 0;
}

/* The host part on gshmd's socket sock: a producer and a consumer of a
 * segment of size bytes, gshmctl's view while both hold it, both reaped.
 * Returns 0 (shared and verified), 1 (failed), or -1 (no pipe: nothing
 * started). */
static int demo_host(const char *sock, uint64_t size) {
  struct role prod, cons;
  uint64_t seed = (uint64_t)gshm__now_ns(CLOCK_REALTIME) | 1;
  pid_t pp, pc;
  int rc = 0, status;
  char okp = 0, okc = 0;

  prod = (struct role){.sock = sock, .size = size, .seed = seed, .is_producer = 1};
  cons = (struct role){.sock = sock, .size = size, .seed = seed, .is_producer = 0};
  if (pipe(prod.ready) || pipe(prod.go) || pipe(cons.ready) || pipe(cons.go))
    return -1;

  printf("\n== process A creates and fills, process B opens, maps and verifies\n");
  pp = start_child(role_main, &prod);
  close(prod.ready[1]);
  close(prod.go[0]);
  if (read(prod.ready[0], &okp, 1) != 1 || !okp) {
    fprintf(stderr, "gshm-demo: producer failed\n");
    rc = 1;
  }
  pc = rc ? -1 : start_child(role_main, &cons);
  if (pc > 0) {
    close(cons.ready[1]);
    close(cons.go[0]);
    if (read(cons.ready[0], &okc, 1) != 1 || !okc)
      rc = 1;
  }

  printf("\n== gshmctl mappings (both processes hold the segment)\n");
  if (run_tool("gshmctl", (const char *const[]){"--socket", sock, "mappings", NULL}))
    rc = 1;
  printf("\n== gshmctl segments\n");
  if (run_tool("gshmctl", (const char *const[]){"--socket", sock, "segments", NULL}))
    rc = 1;

  /* Let both go, reap them. */
  if (write(prod.go[1], "x", 1) != 1)
    rc = 1;
  if (pc > 0 && write(cons.go[1], "x", 1) != 1)
    rc = 1;
  if (waitpid(pp, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
    rc = 1;
  if (pc > 0 && (waitpid(pc, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)))
    rc = 1;
  return rc;
}

/* The device part (gshm-demo-gpu on socket sock); gpu 1: asked for with
 * --gpu.  Returns 0 (passed or skipped) or 1. */
static int demo_gpu(const char *sock, int gpu) {
  int g;

  printf("\n== a device segment shared by two processes (gshm-demo-gpu)\n");
  g = run_tool("gshm-demo-gpu", (const char *const[]){"--socket", sock, NULL});
  if (g == 127 && !gpu_here())
    g = 77; /* not built, and nothing it could have run on */
  if (g == 77) {
    printf("skipped: no GPU found (no CUDA driver, or no device visible)\n");
  } else if (g == 127) {
    printf("skipped: gshm-demo-gpu is not built (it needs nvcc at build time)\n");
    if (gpu == 1)
      return 1; /* asked for, and a GPU is here */
  } else if (g != 0) {
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  struct gshm_spawn sp;
  uint64_t size = 64u << 20;
  int gpu = -1, rc, status;

  if ((rc = demo_options(argc, argv, &size, &gpu)) >= 0)
    return demo_output_written(rc);
  find_self_dir();
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (demo_gshmd_start(&sp))
    return 1;
  /* a child that failed has closed its end of the go pipe: the write to
   * it must fail (and be reported), not kill the demo before it stops its
   * gshmd */
  signal(SIGPIPE, SIG_IGN);
  if ((rc = demo_host(sp.socket_path, size)) < 0)
    return 1;
  if (gpu != 0 && demo_gpu(sp.socket_path, gpu))
    rc = 1;

  printf("\n== stopping gshmd\n");
  status = gshm__spawn_stop(&sp, SIGTERM);
  gshm__spawn_cleanup(&sp);
  if (status != 0) {
    fprintf(stderr, "gshm-demo: gshmd exited with status %d\n", status);
    rc = 1;
  }
  printf("%s\n", rc ? "demo FAILED" : "demo ok: the segment was shared, verified and released");
  return demo_output_written(rc);
}
