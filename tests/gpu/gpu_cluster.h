/* SPDX-License-Identifier: Apache-2.0 */
/* What the GPU tests that start gshmd cluster nodes on 127.0.0.1 share
 * (test_cluster_gpu.c, test_pull_edges.c): a free port, the shared key
 * file, and a node's --set arguments.  Each stops the process (REQUIRE)
 * where it cannot do its part.  Include after gpu_check.h. */
#ifndef GSHM_TESTS_GPU_CLUSTER_H
#define GSHM_TESTS_GPU_CLUSTER_H

#include <fcntl.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cudadrv.h"
#include "harness.h"

/* --set arguments a node gets at most (argv: one more, for NULL). */
#define GPU_NODE_ARGS 10

/* A TCP port of 127.0.0.1 free now (harness_free_port). */
static inline int gpu_free_port(void) {
  int port = harness_free_port();

  REQUIRE(port > 0, "a free port: %s", strerror(-port));
  return port;
}

/* Makes the temporary directory dir (a mkdtemp template, changed in
 * place) and the nodes' shared key file in it (0600, the 32 bytes of
 * key32); its path into key (cap bytes).  The caller removes both. */
static inline void gpu_key_file(char *dir, char *key, size_t cap, const char key32[33]) {
  int fd;

  REQUIRE(mkdtemp(dir), "mkdtemp");
  snprintf(key, cap, "%s/key", dir);
  fd = open(key, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0 && write(fd, key32, 32) == 32, "key file");
  close(fd);
}

/* A node's "--set" arguments (strings in store, argv NULL-terminated):
 * daemon.backend, its cluster settings (listen port, name, peers "NAME=
 * HOST:PORT,...", the key file, export rules, this process's group as
 * pull_group), and up to GPU_NODE_ARGS - 7 more KEY=VALUE settings, the
 * list ended by NULL. */
static inline void gpu_node_args(char store[GPU_NODE_ARGS][512],
                                 const char *argv[GPU_NODE_ARGS + 1], const char *backend,
                                 const char *name, int port, const char *peers, const char *key,
                                 const char *exports, ...) {
  struct group *g = getgrgid(getegid());
  const char *extra;
  va_list ap;
  int n = 0;

  snprintf(store[n++], 512, "--set=daemon.backend=%s", backend);
  snprintf(store[n++], 512, "--set=cluster.listen=127.0.0.1:%d", port);
  snprintf(store[n++], 512, "--set=cluster.node_name=%s", name);
  snprintf(store[n++], 512, "--set=cluster.peers=%s", peers);
  snprintf(store[n++], 512, "--set=cluster.secret_file=%s", key);
  snprintf(store[n++], 512, "--set=cluster.export=%s", exports);
  snprintf(store[n++], 512, "--set=cluster.pull_group=%s", g ? g->gr_name : "root");
  va_start(ap, exports);
  while ((extra = va_arg(ap, const char *))) {
    REQUIRE(n < GPU_NODE_ARGS, "more than %d settings for node %s", GPU_NODE_ARGS, name);
    snprintf(store[n++], 512, "--set=%s", extra);
  }
  va_end(ap);
  for (int i = 0; i < n; i++)
    argv[i] = store[i];
  argv[n] = NULL;
}

/* Removes the key file and its folder (gpu_key_file) and prints how the
 * test went ("ok" or "FAIL").  Returns its exit status (gpu_check.h's
 * failures: 1, else 0). */
static inline int gpu_cluster_end(const char *dir, const char *key) {
  unlink(key);
  rmdir(dir);
  printf("%s\n", failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}

/* The CUDA driver (*drv_out) with GPU 0's primary context current on
 * this thread.  Returns the count of GPUs; exits SKIP (77) without a
 * driver or a GPU, 1 where a driver call fails. */
static inline int gpu_cluster_gpu0(const struct gshm_cudadrv **drv_out) {
  const struct gshm_cudadrv *drv;
  int count = 0;
  CUcontext ctx;
  CUdevice dev;

  if (gshm__cudadrv_load(GSHM_LOG_DEBUG, &drv) || drv->cuDeviceGetCount(&count) != CUDA_SUCCESS ||
      count < 1) {
    fprintf(stderr, "SKIP: needs a CUDA driver and a GPU (have %d)\n", count);
    exit(SKIP);
  }
  CU(drv->cuDeviceGet(&dev, 0));
  CU(drv->cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(drv->cuCtxSetCurrent(ctx));
  *drv_out = drv;
  return count;
}

#endif
