/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the INI configuration parser (daemon/config.c, inih),
 * through its public entry point gshmd_config_setup() with
 * --config /proc/self/fd/N, N a memfd holding the input.  That path's
 * directory has no conf.d, so only the input is read.  Errors go to
 * stderr: run with -close_fd_mask=2 (run.sh does) to keep it quiet; ASan
 * reports still reach libFuzzer's own copy of stderr.
 *
 * Checked: no crash or leak on any input; a file that is accepted leaves
 * every numeric key in its documented range, and parsing the same bytes
 * twice gives the same answer. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int memfd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  unsetenv("GSHM_SOCKET");
  unsetenv("JOURNAL_STREAM");
  memfd = memfd_create("fuzz-config", MFD_CLOEXEC);
  if (memfd < 0)
    abort();
  return 0;
}

static int parse(const uint8_t *data, size_t size, struct gshmd_config *cfg) {
  char path[64], *argv[4];
  enum gshmd_config_action action = GSHMD_CONFIG_RUN;
  int r;

  if (ftruncate(memfd, 0) < 0 || pwrite(memfd, data, size, 0) != (ssize_t)size)
    abort();
  snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
  argv[0] = "gshmd";
  argv[1] = "--config";
  argv[2] = path;
  argv[3] = NULL;
  if (gshmd_config_init(cfg))
    abort();
  r = gshmd_config_setup(cfg, 3, argv, &action);
  if (r == 0 && action != GSHMD_CONFIG_RUN)
    abort();
  return r;
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
