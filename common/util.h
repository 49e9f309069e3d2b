/* SPDX-License-Identifier: Apache-2.0 */
/* Small parsers and helpers shared by gshmd, libgshm and gshmctl. */
#ifndef GSHM_COMMON_UTIL_H
#define GSHM_COMMON_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define GSHM_LOCATION_MAX 64

/* The start of StatusInfo.gpu_fault (gshm.h) where gshmd's CUDA driver did
 * not start at all, followed by why; a sticky error's is "<PCI bus id>:
 * <CUDA error name>".  gshmd writes it, gshmctl reads it. */
#define GSHM_GPU_FAULT_NO_DRIVER "no driver: "

enum gshm_location_kind {
  GSHM_LOCATION_HOST = 0,
  GSHM_LOCATION_CUDA_INDEX = 1, /* "cuda:N": the daemon's enumeration */
  GSHM_LOCATION_CUDA_UUID = 2,  /* "cuda:GPU-<uuid>" */
};

struct gshm_location {
  enum gshm_location_kind kind;
  int index;       /* CUDA_INDEX */
  char uuid[48];   /* CUDA_UUID: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
};

/* Parses "host", "cuda:N" or "cuda:GPU-<uuid>" (also "" -> host).
 * Returns 0 or -EINVAL. */
int gshm__location_parse(const char *s, struct gshm_location *out);

/* Parses a byte count: digits with an optional binary suffix K, M, G, T,
 * also written KB/MB/GB/TB or KiB/MiB/GiB/TiB (case-insensitive, no
 * spaces): every form means powers of 1024 (4K = 4KB = 4KiB = 4096).
 * Returns 0, -EINVAL (not a number, unknown suffix) or -ERANGE (over
 * 2^64-1). */
int gshm__parse_size(const char *s, uint64_t *out);
/* Why gshm__parse_size refused s with error e (-EINVAL, -ERANGE), in
 * words for a message: "cannot be negative", "too large", "not a size". */
static inline const char *gshm__size_refusal(const char *s, int e) {
  return *s == '-' ? "cannot be negative" : e == -ERANGE ? "too large" : "not a size";
}
/* What gshm__parse_size takes, for the tools' messages about a size. */
#define GSHM_SIZE_SYNTAX "bytes, or K/M/G/T: K, KB and KiB all mean 1024"

/* Parses a loopback "ADDR:PORT" (127.0.0.0/8, [::1], or localhost; port
 * 1..65535) into *sa and *len.  Returns 0 or -EINVAL (not that form, or
 * not a loopback address: gshm's metrics name users' segments). */
int gshm__parse_loopback(const char *listen, struct sockaddr_storage *sa, socklen_t *len);

/* "s" where n things are more (or fewer) than one, else "": "%u client%s",
 * n, gshm__plural(n) says "1 client", "0 clients", "2 clients". */
static inline const char *gshm__plural(uint64_t n) { return n == 1 ? "" : "s"; }

/* Formats bytes as "64 MiB" style into buf; returns buf. */
const char *gshm__format_size(uint64_t bytes, char *buf, size_t cap);

/* Formats bytes in the unit gshm__format_size would write scale in, with
 * one decimal above B ("4.0 MiB" for 4 MiB of a 64.0 MiB scale, "0.0 MiB"
 * for 7 bytes of it; "7 B" of a scale under 1 KiB): figures formatted
 * against one scale (a total and its parts) read alike, in one unit and
 * one precision.  Writes at most cap bytes into buf; returns buf. */
const char *gshm__format_size_as(uint64_t bytes, uint64_t scale, char *buf, size_t cap);

/* Copies text into buf (cap bytes, cap >= 1; always NUL-terminated) for a
 * terminal: '\\' becomes "\\\\", and every byte of a C0 or C1 control
 * (U+0000..U+001F, U+007F..U+009F), of an invisible or bidi format
 * character (U+061C, U+200B..U+200F, U+2028..U+202E, U+2060..U+206F,
 * U+FEFF) and
 * of a byte sequence that is not valid UTF-8 becomes "\xHH".  Output that
 * does not fit is cut at a character boundary.  Returns buf.  4 * strlen +
 * 1 bytes always suffice. */
const char *gshm__escape_text(const char *text, char *buf, size_t cap);

/* JSON text json (valid UTF-8, as jansson writes it) for a terminal:
 * every non-ASCII code point gshm__escape_text would escape (a C1
 * control, an invisible or bidi format character; all in the BMP, and
 * only ever inside JSON strings) becomes its "\uXXXX" escape, the same
 * JSON value; ASCII (jansson's C0 escapes, the layout's newlines) and
 * bytes of no valid UTF-8 sequence are copied as they are.  Returns a
 * malloc'ed string (the caller frees it), or NULL when out of memory. */
char *gshm__json_escape_unprintable(const char *json);

/* Replaces, in place, every byte that gshm__escape_text would escape
 * (controls, invisible and bidi format characters, bytes of no valid
 * UTF-8 sequence) with '?', so that text from a party gshm does not trust
 * (a cluster peer's name or message) reaches clients and terminals
 * without them; the length stays. */
void gshm__text_clean(char *text);

/* Whether s holds no control character (< 0x20, 0x7f): a client's name
 * as gshmd takes it (the hello). */
bool gshm__printable(const char *s);

/* Checks a segment name: 1..max bytes, printable ASCII/UTF-8 bytes >= 0x20
 * except DEL, '/'-separated components that are non-empty and not "." or
 * "..".  Returns 0, -EINVAL or -ENAMETOOLONG. */
int gshm__name_check(const char *name, size_t max);

/* Pushes out what stdio holds for stdout and checks that everything
 * printed there was written: "gshmd --dump-config > FILE" or "gshmctl
 * --help > FILE" on a full disk must fail, not exit 0 over a cut or empty
 * file.  Call it right after the printing: where an earlier printf's
 * write failed (output longer than stdio's buffer) and nothing was left to
 * flush, the errno still at hand, if a write's (ENOSPC, EDQUOT, EFBIG,
 * EPIPE, EBADF), is taken for its.  Returns 0, or the negative errno of the
 * failed write (-EIO where there is none); says nothing (the caller says
 * it, in its own form). */
int gshm__stdout_flush(void);

/* clock_gettime in nanoseconds. */
int64_t gshm__now_ns(clockid_t clock);

/* Names the calling thread `name` (at most 15 bytes, what top -H, perf
 * and /proc/PID/task/TID/comm show) the first time that thread calls
 * it; later calls cost one thread-local read.  For threads gshm does not
 * create (libuv's pool: a work callback calls it).  Errors are ignored
 * (a name is only for people). */
void gshm__name_thread_once(const char *name);

/* CPUs this process may run on: its affinity mask (what a cpuset or
 * taskset leaves it), else the online count; at least 1.  gshmd and
 * libgshm poll briefly instead of sleeping only where there are at least
 * GSHM_POLL_MIN_CPUS of them (a poller would take the CPU its peer needs
 * on a smaller machine). */
int gshm__usable_cpus(void);
#define GSHM_POLL_MIN_CPUS 4

/* Takes every SCM_RIGHTS fd of mh's control messages, after a recvmsg
 * (with or without MSG_PEEK): fds[*nfds..max) receive them in order (the
 * caller owns those; *nfds advances), every one past max is closed here,
 * so none leaks whatever the sender packed.  fds may be NULL when max is
 * 0.  Returns how many fds the message carried. */
int gshm__cmsg_take_fds(struct msghdr *mh, int *fds, int max, int *nfds);

/* Formats 16 raw UUID bytes as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
 * (nvidia-smi's form); buf needs 41 bytes. */
void gshm__format_gpu_uuid(const unsigned char bytes[16], char buf[48]);

/* A transparent huge page on x86-64 and arm64 with 4 KiB base pages (the
 * PMD size), in bytes: what gshmd rounds pulled host memory to, what
 * libgshm and gshmd align host mappings to (gshm__map_shared_aligned). */
#define GSHM__HUGE_PAGE (2ull << 20)

/* Maps len bytes of fd from offset 0, shared, with protection prot
 * (PROT_READ, | PROT_WRITE), at an address 2 MiB aligned where len is at
 * least 2 MiB, else wherever mmap puts it.  A 2 MiB page of a memfd's
 * page cache maps whole (one fault, one TLB entry) only at such an
 * address, and the kernel aligns a memfd's mappings itself only where
 * transparent_hugepage/shmem_enabled is not never (mm/shmem.c
 * shmem_get_unmapped_area); gshmd builds 2 MiB pages of pulled segments
 * there too (daemon/host_memory.h).  Returns the address (munmap(addr,
 * len) unmaps it) or MAP_FAILED with errno set (mmap's errors). */
void *gshm__map_shared_aligned(int fd, uint64_t len, int prot);

#endif
