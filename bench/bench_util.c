/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by gshm-bench's subcommands (bench.h). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "spawn.h"

int bench_int_arg(const char *cmd, const char *opt, const char *s, int min) {
  char *end;
  long v;

  errno = 0;
  v = strtol(s, &end, 10);
  if (end == s || *end || errno || v < min || v > INT_MAX) {
    fprintf(stderr, "gshm-bench %s: %s takes an integer of at least %d, not '%s'\n", cmd, opt, min,
            s);
    exit(2);
  }
  return (int)v;
}

void bench_opt_once(const char *cmd, const struct option *lo, int c, unsigned char seen[256]) {
  if (c < 0 || c > 255 || !seen[c]++)
    return;
  while (lo->name && lo->val != c)
    lo++;
  fprintf(stderr, "gshm-bench %s: --%s given twice: the second value would replace the first\n",
          cmd, lo->name ? lo->name : "?");
  exit(2);
}

void bench_opt_once_arg(const char *cmd, const struct option *lo, const char *arg,
                        unsigned char seen[256]) {
  if (strncmp(arg, "--", 2))
    return;
  for (; lo->name; lo++)
    if (!strcmp(arg + 2, lo->name)) {
      bench_opt_once(cmd, lo, lo->val, seen);
      return;
    }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_fill_random(void *p, size_t n) {
  uint64_t x = 0x9e3779b97f4a7c15ull, z;
  uint8_t *b = p;
  size_t i = 0;

  for (; i + 8 <= n; i += 8) {
    z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    memcpy(b + i, &z, 8);
  }
  for (; i < n; i++)
    b[i] = (uint8_t)(i * 131 + 7);
}

double bench_cpu_s(int pid) {
  struct rusage ru;
  struct timespec ts;
  clockid_t clk;
  uint64_t ticks;

  /* the process's CPU clock counts nanoseconds; /proc's utime + stime
   * count clock ticks (10 ms), more than a small pull's whole cost */
  if (pid > 0 && !clock_getcpuclockid(pid, &clk) && !clock_gettime(clk, &ts))
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
  if (pid > 0)
    return gshm__proc_cpu_ticks(pid, &ticks) ? -1 : (double)ticks / (double)sysconf(_SC_CLK_TCK);
  if (getrusage(RUSAGE_SELF, &ru))
    return -1;
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

const char *const bench_thr_name[BENCH_THR_N] = {"loop", "lane-rx", "lane-tx", "pool"};

void bench_thread_cpu(int pid, double v[BENCH_THR_N][2]) {
  char path[64];
  DIR *d;
  struct dirent *e;
  double hz = (double)sysconf(_SC_CLK_TCK);

  snprintf(path, sizeof(path), "/proc/%d/task", pid);
  if (!(d = opendir(path)))
    return;
  while ((e = readdir(d))) {
    char p2[96], buf[1024], *c;
    unsigned long long ut, st;
    int tid = atoi(e->d_name), k;
    FILE *fp;
    if (tid <= 0)
      continue;
    snprintf(p2, sizeof(p2), "/proc/%d/task/%d/stat", pid, tid);
    if (!(fp = fopen(p2, "r")))
      continue;
    buf[0] = '\0';
    if (!fgets(buf, sizeof(buf), fp))
      buf[0] = '\0';
    fclose(fp);
    if (!(c = strrchr(buf, ')')) ||
        sscanf(c + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
      continue;
    k = tid == pid ? BENCH_THR_LOOP : strstr(buf, "lane-rx") ? BENCH_THR_RX : strstr(buf, "lane-tx") ? BENCH_THR_TX
                                                                                          : BENCH_THR_POOL;
    v[k][0] += (double)ut / hz;
    v[k][1] += (double)st / hz;
  }
  closedir(d);
}
