/* SPDX-License-Identifier: Apache-2.0 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "util.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

int gshm__location_parse(const char *s, struct gshm_location *out) {
  struct gshm_location loc;

  memset(&loc, 0, sizeof(loc));
  if (!s || !*s || !strcmp(s, "host")) {
    loc.kind = GSHM_LOCATION_HOST;
  } else if (!strncmp(s, "cuda:", 5)) {
    const char *rest = s + 5;
    if (!strncmp(rest, "GPU-", 4)) {
      size_t n = strlen(rest);
      if (n < 8 || n >= sizeof(loc.uuid))
        return -EINVAL;
      for (size_t i = 4; i < n; i++)
        if (!isxdigit((unsigned char)rest[i]) && rest[i] != '-')
          return -EINVAL;
      loc.kind = GSHM_LOCATION_CUDA_UUID;
      memcpy(loc.uuid, rest, n + 1);
    } else {
      char *end;
      long v;
      if (!isdigit((unsigned char)*rest))
        return -EINVAL;
      errno = 0;
      v = strtol(rest, &end, 10);
      if (errno || *end || v < 0 || v > 4096)
        return -EINVAL;
      loc.kind = GSHM_LOCATION_CUDA_INDEX;
      loc.index = (int)v;
    }
  } else {
    return -EINVAL;
  }
  *out = loc;
  return 0;
}

int gshm__parse_size(const char *s, uint64_t *out) {
  static const struct {
    const char *suffix;
    unsigned shift;
  } units[] = {{"", 0},    {"b", 0},    {"k", 10},   {"kb", 10},  {"kib", 10},
               {"m", 20},   {"mb", 20},  {"mib", 20}, {"g", 30},   {"gb", 30},
               {"gib", 30}, {"t", 40},   {"tb", 40},  {"tib", 40}};
  unsigned long long v;
  char *end;

  if (!s || !isdigit((unsigned char)*s))
    return -EINVAL;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno == ERANGE)
    return -ERANGE;
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
    if (strcasecmp(end, units[i].suffix))
      continue;
    if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
      return -ERANGE;
    *out = (uint64_t)v << units[i].shift;
    return 0;
  }
  return -EINVAL;
}

static const char *const size_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};

/* The unit gshm__format_size writes bytes in: an index of size_units. */
static unsigned size_unit(uint64_t bytes) {
  unsigned u = 0;
  double v = (double)bytes;

  while (v >= 1024 && u + 1 < sizeof(size_units) / sizeof(size_units[0])) {
    v /= 1024;
    u++;
  }
  return u;
}

const char *gshm__format_size(uint64_t bytes, char *buf, size_t cap) {
  unsigned u = size_unit(bytes);
  double v = (double)bytes / (double)(1ull << (10 * u));

  if (u == 0)
    snprintf(buf, cap, "%" PRIu64 " B", bytes);
  else if (v == (double)(uint64_t)v)
    snprintf(buf, cap, "%.0f %s", v, size_units[u]);
  else
    snprintf(buf, cap, "%.1f %s", v, size_units[u]);
  return buf;
}

const char *gshm__format_size_as(uint64_t bytes, uint64_t scale, char *buf, size_t cap) {
  unsigned u = size_unit(scale);

  if (u == 0)
    snprintf(buf, cap, "%" PRIu64 " B", bytes);
  else
    snprintf(buf, cap, "%.1f %s", (double)bytes / (double)(1ull << (10 * u)), size_units[u]);
  return buf;
}

/* Length of the valid UTF-8 sequence at p (1..4), with its code point in
 * *cp; 0 when p does not start one (overlong forms, surrogates and code
 * points past U+10FFFF included). */
static size_t utf8_seq(const unsigned char *p, uint32_t *cp) {
  size_t len = p[0] < 0x80 ? 1 : (p[0] & 0xE0) == 0xC0 ? 2 : (p[0] & 0xF0) == 0xE0 ? 3
               : (p[0] & 0xF8) == 0xF0 ? 4 : 0;
  static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
  uint32_t v;

  if (!len)
    return 0;
  v = len == 1 ? p[0] : p[0] & (0x7F >> len);
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xC0) != 0x80)
      return 0;
    v = v << 6 | (p[i] & 0x3F);
  }
  if (v < least[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
    return 0;
  *cp = v;
  return len;
}

/* U+061C, ARABIC LETTER MARK, is a bidi control as U+200E/U+200F are
 * (Unicode's Bidi_Control list): it reorders what follows as they do. */
static bool unprintable(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x061C ||
         (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF;
}

const char *gshm__escape_text(const char *text, char *buf, size_t cap) {
  const unsigned char *p = (const unsigned char *)text;
  size_t o = 0;

  while (*p) {
    char piece[16];
    uint32_t cp = 0;
    size_t len = utf8_seq(p, &cp), k = 0;
    if (!len) { /* a stray byte */
      k = (size_t)snprintf(piece, sizeof(piece), "\\x%02X", p[0]);
      len = 1;
    } else if (cp == '\\') {
      k = (size_t)snprintf(piece, sizeof(piece), "\\\\");
    } else if (unprintable(cp)) {
      for (size_t i = 0; i < len; i++)
        k += (size_t)snprintf(piece + k, sizeof(piece) - k, "\\x%02X", p[i]);
    } else {
      memcpy(piece, p, len);
      k = len;
    }
    if (o + k >= cap)
      break;
    memcpy(buf + o, piece, k);
    o += k;
    p += len;
  }
  buf[o] = '\0';
  return buf;
}

char *gshm__json_escape_unprintable(const char *json) {
  const unsigned char *p = (const unsigned char *)json;
  char *out = malloc(3 * strlen(json) + 1), *o = out; /* (2 bytes -> 6 at most) */

  if (!out)
    return NULL;
  while (*p) {
    uint32_t cp = 0;
    size_t len = *p < 0x80 ? 0 : utf8_seq(p, &cp);
    if (len && unprintable(cp)) {
      o += sprintf(o, "\\u%04X", (unsigned)cp);
      p += len;
    } else {
      *o++ = (char)*p++;
    }
  }
  *o = '\0';
  return out;
}

void gshm__text_clean(char *text) {
  unsigned char *p = (unsigned char *)text;

  while (*p) {
    uint32_t cp = 0;
    size_t len = utf8_seq(p, &cp);
    if (!len) {
      *p++ = '?';
      continue;
    }
    if (unprintable(cp))
      memset(p, '?', len);
    p += len;
  }
}

int gshm__name_check(const char *name, size_t max) {
  size_t n, comp = 0;
  const char *start;

  if (!name)
    return -EINVAL;
  n = strnlen(name, max + 1);
  if (n == 0)
    return -EINVAL;
  if (n > max)
    return -ENAMETOOLONG;
  start = name;
  for (size_t i = 0; i <= n; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c == '/' || c == '\0') {
      if (comp == 0 || (comp == 1 && start[0] == '.') ||
          (comp == 2 && start[0] == '.' && start[1] == '.'))
        return -EINVAL;
      comp = 0;
      start = name + i + 1;
      continue;
    }
    if (c < 0x20 || c == 0x7f)
      return -EINVAL;
    comp++;
  }
  return 0;
}

int gshm__stdout_flush(void) {
  int before = ferror(stdout) ? errno : 0;

  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout))
    return 0;
  if (errno)
    return -errno;
  /* a printf failed already (more than stdio's buffer, on a full disk)
   * and stdio dropped what it held: that write's errno is the one at
   * hand when nothing since set another, and only one a write gives */
  switch (before) {
  case ENOSPC:
  case EDQUOT:
  case EFBIG:
  case EPIPE:
  case EBADF:
    return -before;
  default:
    return -EIO;
  }
}

int64_t gshm__now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void gshm__name_thread_once(const char *name) {
  static __thread bool named;

  if (!named) {
    named = true;
    pthread_setname_np(pthread_self(), name);
  }
}

int gshm__usable_cpus(void) {
  cpu_set_t set;
  long n;

  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void gshm__format_gpu_uuid(const unsigned char b[16], char buf[48]) {
  snprintf(buf, 48,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
}

int gshm__parse_loopback(const char *listen, struct sockaddr_storage *sa, socklen_t *len) {
  char host[64];
  const char *colon = strrchr(listen, ':');
  char *end;
  long port;

  if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof(host))
    return -EINVAL;
  port = strtol(colon + 1, &end, 10);
  if (*end || !colon[1] || port < 1 || port > 65535)
    return -EINVAL;
  memcpy(host, listen, (size_t)(colon - listen));
  host[colon - listen] = '\0';
  memset(sa, 0, sizeof(*sa));
  if (!strcmp(host, "localhost"))
    strcpy(host, "127.0.0.1");
  if (host[0] == '[') {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)sa;
    size_t n = strlen(host);
    if (n < 3 || host[n - 1] != ']')
      return -EINVAL;
    host[n - 1] = '\0';
    if (inet_pton(AF_INET6, host + 1, &s6->sin6_addr) != 1 || !IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr))
      return -EINVAL;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)port);
    *len = sizeof(*s6);
    return 0;
  } else {
    struct sockaddr_in *s4 = (struct sockaddr_in *)sa;
    /* 127.0.0.0/8 only: gshm's metrics name users' segments. */
    if (inet_pton(AF_INET, host, &s4->sin_addr) != 1 ||
        (ntohl(s4->sin_addr.s_addr) >> 24) != 127)
      return -EINVAL;
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t)port);
    *len = sizeof(*s4);
    return 0;
  }
}

int gshm__cmsg_take_fds(struct msghdr *mh, int *fds, int max, int *nfds) {
  int total = 0;

  for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
    size_t count;
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue; /* SCM_CREDENTIALS etc. carry no fds */
    count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*nfds < max)
        fds[(*nfds)++] = fd;
      else
        close(fd);
    }
    total += (int)count;
  }
  return total;
}

void *gshm__map_shared_aligned(int fd, uint64_t len, int prot) {
  const uint64_t huge = GSHM__HUGE_PAGE, page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t mapped = (len + page - 1) / page * page; /* what mmap maps of len */
  uint8_t *r, *p;

  if (len < huge)
    return mmap(NULL, len, prot, MAP_SHARED, fd, 0);
  /* a reservation 2 MiB longer, the file mapped over its aligned part,
   * the rest given back (from the page past len: munmap wants a page) */
  r = mmap(NULL, mapped + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    return MAP_FAILED;
  p = (uint8_t *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
  if (mmap(p, len, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    int e = errno;
    munmap(r, mapped + huge);
    errno = e;
    return MAP_FAILED;
  }
  if (p > r)
    munmap(r, (size_t)(p - r));
  if (r + mapped + huge > p + mapped)
    munmap(p + mapped, (size_t)(r + huge - p));
  return p;
}

bool gshm__printable(const char *s) {
  for (const char *p = s; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return false;
  return true;
}
