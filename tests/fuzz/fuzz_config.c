/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the INI configuration parser (daemon/config.c, inih),
 * through its public entry point gshmd_config_setup() with
 * --config /proc/self/fd/N, N a memfd holding the input.  That path's
 * directory has no conf.d, so only the input is read.  Errors go to
 * stderr: run with -close_fd_mask=2 (run.sh does) to keep it quiet; ASan
 * reports still reach libFuzzer's own copy of stderr.
 *
 * The bytes up to the first NUL are the file; after it, NUL-separated,
 * up to 8 command-line values given as --set VALUE (SECTION.KEY=VALUE).
 * A configuration that is accepted and turns the cluster on then goes
 * through the [cluster] keys' own parser (daemon/cluster/conf.c:
 * cluster.peers, cluster.export, cluster.listen, cluster.node_name,
 * cluster.pull_group), with a key file of the harness's as
 * cluster.secret_file; host names resolve numerically only (the
 * getaddrinfo below): a fuzzer sends no DNS queries.
 *
 * Checked: no crash or leak on any input; a file that is accepted leaves
 * every numeric key in its documented range, and parsing the same bytes
 * twice gives the same answer; cluster keys that are accepted name valid
 * peers (name rule, no duplicates, not this node). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int memfd = -1;
static char secret[64];

/* Host names in cluster keys resolve as numbers only: the libc resolver
 * behind this would send what the fuzzer made up to DNS. */
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
  static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
  struct addrinfo h = hints ? *hints : (struct addrinfo){0};

  if (!real && !(real = (int (*)(const char *, const char *, const struct addrinfo *,
                                 struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo")))
    abort();
  h.ai_flags |= AI_NUMERICHOST;
  return real(node, service, &h, res);
}

static void remove_secret(void) { unlink(secret); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  unsetenv("GSHM_SOCKET");
  unsetenv("JOURNAL_STREAM");
  memfd = memfd_create("fuzz-config", MFD_CLOEXEC);
  if (memfd < 0)
    abort();
  {
    int fd;
    snprintf(secret, sizeof(secret), "%s/gshm-fuzz-config-key.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if ((fd = mkstemp(secret)) < 0 || write(fd, "0123456789abcdef0123", 20) != 20)
      abort();
    close(fd);
    atexit(remove_secret);
  }
  return 0;
}

static int parse(const uint8_t *data, size_t size, struct gshmd_config *cfg) {
  char path[64], *argv[4 + 2 * 8], *sets = NULL;
  const uint8_t *nul = memchr(data, 0, size);
  size_t file = nul ? (size_t)(nul - data) : size;
  enum gshmd_config_action action = GSHMD_CONFIG_RUN;
  int argc = 3, r;

  if (ftruncate(memfd, 0) < 0 || pwrite(memfd, data, file, 0) != (ssize_t)file)
    abort();
  snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
  argv[0] = "gshmd";
  argv[1] = "--config";
  argv[2] = path;
  if (nul) { /* the --set values: a NUL-terminated copy of the rest */
    size_t n = size - file - 1;
    if (!(sets = malloc(n + 1)))
      abort();
    memcpy(sets, nul + 1, n);
    sets[n] = 0;
    for (char *v = sets; v < sets + n + 1 && argc < 3 + 2 * 8; v += strlen(v) + 1) {
      argv[argc++] = "--set";
      argv[argc++] = v;
    }
  }
  argv[argc] = NULL;
  if (gshmd_config_init(cfg))
    abort();
  r = gshmd_config_setup(cfg, argc, argv, &action);
  free(sets);
  if (r == 0 && action != GSHMD_CONFIG_RUN)
    abort();
  return r;
}

/* The [cluster] keys of accepted configuration a, as gshmd reads them
 * at start (gshmd_cluster_check_config, without the rest of the
 * cluster); checks what it accepted. */
static void cluster_keys(struct gshmd_config *a) {
  struct gshmd_cluster *cl;
  char *keyfile = a->cluster_secret_file;
  int e;

  if (!(a->cluster_listen && *a->cluster_listen) && !(a->cluster_peers && *a->cluster_peers))
    return;
  if (!(cl = calloc(1, sizeof(*cl))))
    abort();
  a->cluster_secret_file = secret;
  cl->cfg = a;
  e = gshmd__cluster_conf(cl);
  a->cluster_secret_file = keyfile;
  if (e && e != -EINVAL && e != -ENOMEM)
    abort();
  if (!e) {
    if (!gshmd__cluster_name_ok(cl->ll.node_name))
      abort();
    for (unsigned i = 0; i < cl->ll.npeers; i++) {
      if (!gshmd__cluster_name_ok(cl->ll.peers[i].name) ||
          !strcmp(cl->ll.peers[i].name, cl->ll.node_name))
        abort();
      for (unsigned j = 0; j < i; j++)
        if (!strcmp(cl->ll.peers[i].name, cl->ll.peers[j].name))
          abort();
    }
  }
  for (unsigned i = 0; i < cl->nexport; i++)
    free(cl->exports[i].pattern);
  free(cl->exports);
  free(cl->ll.peers);
  free(cl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct gshmd_config a, b;
  int ra, rb;

  if (size > 1 << 16)
    return 0;
  ra = parse(data, size, &a);
  if (ra == 0) {
    /* Ranges from option_table.h: an accepted file never escapes them. */
    if (a.max_connections < 1 || a.max_connections > 1048576 || a.max_fds_per_connection > 253 ||
        a.max_packet < 4096 || a.max_packet > 65536 || a.max_name < 1 || a.max_name > 4095 ||
        a.max_inflight < 1 || a.socket_mode > 0777 || a.log_level < 0 || a.log_level > 7 ||
        !a.socket_path || a.socket_path[0] != '/' || strlen(a.socket_path) > 107 || !a.backend ||
        (strcmp(a.backend, "auto") && strcmp(a.backend, "host") && strcmp(a.backend, "cuda")))
      abort();
    cluster_keys(&a);
  } else if (ra != -EINVAL && ra != -ENOMEM) {
    abort();
  }
  rb = parse(data, size, &b);
  if (ra != rb)
    abort();
  gshmd_config_free(&a);
  gshmd_config_free(&b);
  return 0;
}
