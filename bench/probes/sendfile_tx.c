/* SPDX-License-Identifier: Apache-2.0 */
/* sendfile_tx: what a serving lane's copy into the socket costs, and what
 * sendfile() from the segment's memfd (the socket takes references to its
 * page cache pages instead of a copy) saves, over TCP on 127.0.0.1.
 * An experiment, kept so that its numbers can be reproduced; not built
 * with the project:
 *
 *   gcc -O2 -pthread -o sendfile_tx bench/probes/sendfile_tx.c
 *   ./sendfile_tx [MIB] [CONNECTIONS]
 *
 * One memfd of MIB MiB (default 1024), written before (random bytes),
 * sent whole over C connections (default 2), each a sender and a receiver
 * thread, 256 KiB a call, the receivers into a 4 MiB buffer of their own
 * (written before: what the sender pays is the point).  Each mode: the
 * median of 5 rounds, GB/s, and CPU seconds per GB of the sending and of
 * the receiving threads (on loopback the receiver's TCP work runs partly
 * on the sender's CPU, in its softirq). Modes: send() from the mapping;
 * the same plus a pass reading each piece (a stand-in for the tag's
 * GHASH); sendfile() from the memfd; sendfile plus the reading pass. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PIECE (256u << 10)
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
enum { M_SEND, M_SEND_READ, M_SENDFILE, M_SENDFILE_READ, M_N };
static const char *names[] = {"send from the mapping", "send + read pass", "sendfile", "sendfile + read pass"};
struct conn { int s, r, fd, mode; uint8_t *map; size_t off, len; double cpu; volatile uint64_t sink; };
static void *tx(void *a) {
  struct conn *c = a; double c0 = now(CLOCK_THREAD_CPUTIME_ID); uint64_t acc = 0;
  for (size_t o = c->off; o < c->off + c->len; o += PIECE) {
    size_t k = c->off + c->len - o < PIECE ? c->off + c->len - o : PIECE;
    if (c->mode == M_SEND_READ || c->mode == M_SENDFILE_READ)
      for (size_t i = 0; i < k; i += 64) acc += *(volatile uint64_t *)(c->map + o + i);
    if (c->mode <= M_SEND_READ) {
      for (size_t d = 0; d < k;) { ssize_t w = send(c->s, c->map + o + d, k - d, MSG_NOSIGNAL); if (w <= 0) { perror("send"); exit(1); } d += w; }
    } else {
      off_t fo = (off_t)o;
      for (size_t d = 0; d < k;) { ssize_t w = sendfile(c->s, c->fd, &fo, k - d); if (w <= 0) { perror("sendfile"); exit(1); } d += w; }
    }
  }
  c->sink = acc; c->cpu = now(CLOCK_THREAD_CPUTIME_ID) - c0; return 0;
}
struct rxa { int r; size_t len; double cpu; };
static void *rx(void *a) {
  struct rxa *x = a; double c0 = now(CLOCK_THREAD_CPUTIME_ID); uint8_t *buf = malloc(4u << 20); memset(buf, 1, 4u << 20);
  for (size_t got = 0; got < x->len;) { ssize_t r = recv(x->r, buf + (got % (4u << 20)) / PIECE * PIECE, PIECE, 0); if (r <= 0) { perror("recv"); exit(1); } got += r; }
  free(buf); x->cpu = now(CLOCK_THREAD_CPUTIME_ID) - c0; return 0;
}
static void pair(int *s, int *r) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1; struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}; socklen_t al = sizeof a;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 1) || getsockname(l, (void *)&a, &al)) { perror("listen"); exit(1); }
  *s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(*s, (void *)&a, sizeof a)) { perror("connect"); exit(1); }
  *r = accept(l, 0, 0); close(l);
  setsockopt(*s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], 0, 0) : 1024, total = mib << 20; int nc = argc > 2 ? atoi(argv[2]) : 2;
  int fd = memfd_create("sendfile-tx", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, total)) { perror("memfd"); return 1; }
  uint8_t *map = mmap(0, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) { perror("mmap"); return 1; }
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < total; i += 8) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; memcpy(map + i, &x, 8); }
  struct conn cs[64]; struct rxa rs[64]; pthread_t ts[64], tr[64];
  for (int i = 0; i < nc; i++) pair(&cs[i].s, &rs[i].r);
  printf("%zu MiB, %d connections, %u KiB a call\n", mib, nc, PIECE >> 10);
  for (int rep = 0; rep < 2; rep++)
    for (int m = 0; m < M_N; m++) {
      double gbs[5], txc[5], rxc[5];
      for (int it = 0; it < 5; it++) {
        double t0 = now(CLOCK_MONOTONIC), stx = 0, srx = 0;
        for (int i = 0; i < nc; i++) {
          cs[i] = (struct conn){cs[i].s, 0, fd, m, map, total / nc * i, total / nc};
          rs[i].len = total / nc;
          pthread_create(&tr[i], 0, rx, &rs[i]); pthread_create(&ts[i], 0, tx, &cs[i]);
        }
        for (int i = 0; i < nc; i++) { pthread_join(ts[i], 0); pthread_join(tr[i], 0); stx += cs[i].cpu; srx += rs[i].cpu; }
        double t = now(CLOCK_MONOTONIC) - t0;
        gbs[it] = total / t / 1e9; txc[it] = stx / (total / 1e9); rxc[it] = srx / (total / 1e9);
      }
      qsort(gbs, 5, sizeof(double), cmp); qsort(txc, 5, sizeof(double), cmp); qsort(rxc, 5, sizeof(double), cmp);
      if (rep) printf("%-24s %6.2f GB/s  sender CPU %.3f s/GB  receiver CPU %.3f s/GB\n", names[m], gbs[2], txc[2], rxc[2]);
    }
  return 0;
}
