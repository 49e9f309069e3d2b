/* SPDX-License-Identifier: Apache-2.0 */
#include "leasekey.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "log.h"
#include "registry.h"

#define LEASEKEY_NAME "leasekey"

_Static_assert(crypto_auth_BYTES == GSHMD_LEASE_TOKEN_BYTES, "a token is one crypto_auth MAC");

/* What a token authenticates: a domain string, then the segment id and
 * generation, the access and the holder's uid, little-endian. */
#define TOKEN_DOMAIN "gshm lease v1"
struct token_msg {
  uint8_t b[sizeof(TOKEN_DOMAIN) + 8 + 8 + 4 + 4];
};

static void put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void token_msg(struct token_msg *m, const struct gshmd_segment *seg, uid_t uid,
                      int access) {
  uint8_t *p = m->b;

  memcpy(p, TOKEN_DOMAIN, sizeof(TOKEN_DOMAIN));
  p += sizeof(TOKEN_DOMAIN);
  put_le(p, seg->id, 8);
  put_le(p + 8, seg->generation, 8);
  put_le(p + 16, (uint32_t)access, 4);
  put_le(p + 20, (uint32_t)uid, 4);
}

static void token_make(void *arg, const struct gshmd_segment *seg, uid_t uid, int access,
                       uint8_t out[GSHMD_LEASE_TOKEN_BYTES]) {
  const struct gshmd_leasekey *k = arg;
  struct token_msg m;

  token_msg(&m, seg, uid, access);
  crypto_auth(out, m.b, sizeof(m.b), k->key);
}

static bool token_check(void *arg, const struct gshmd_segment *seg, uid_t uid, int access,
                        const uint8_t *token, size_t len) {
  const struct gshmd_leasekey *k = arg;
  struct token_msg m;

  if (!token || len != crypto_auth_BYTES)
    return false;
  token_msg(&m, seg, uid, access);
  return crypto_auth_verify(token, m.b, sizeof(m.b), k->key) == 0;
}

/* The key from a stored memfd: exactly crypto_auth_KEYBYTES bytes. */
static bool key_read(uint8_t key[crypto_auth_KEYBYTES], int fd) {
  struct stat st;

  return fstat(fd, &st) == 0 && st.st_size == (off_t)crypto_auth_KEYBYTES &&
         pread(fd, key, crypto_auth_KEYBYTES, 0) == (ssize_t)crypto_auth_KEYBYTES;
}

/* Whether name is a key entry's: "leasekey" (version 0) or "leasekey-<v>"
 * (v from 1, no leading 0); *v_out its version. */
static bool key_name(const char *name, uint64_t *v_out) {
  const char *p;
  uint64_t v = 0;

  if (!name || strncmp(name, LEASEKEY_NAME, strlen(LEASEKEY_NAME)))
    return false;
  p = name + strlen(LEASEKEY_NAME);
  if (*p && (*p++ != '-' || *p < '1' || *p > '9'))
    return false;
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
      return false;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  *v_out = v;
  return true;
}

/* Stores the key in a sealed memfd of its own, under k->version's name.
 * 0 or a negative errno. */
static int key_store(struct gshmd_leasekey *k) {
  char msg[96];
  int fd, e;

  fd = memfd_create("gshmd-leasekey", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return -errno;
  if (write(fd, k->key, sizeof(k->key)) != (ssize_t)sizeof(k->key) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
    e = errno ? -errno : -EIO;
    close(fd);
    return e;
  }
  /* FDPOLL=0: a memfd never hangs up; systemd need not watch it. */
  if (k->version)
    snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=" LEASEKEY_NAME "-%" PRIu64 "\nFDPOLL=0",
             k->version);
  else
    snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=" LEASEKEY_NAME "\nFDPOLL=0");
  e = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
  close(fd);
  return e > 0 ? 0 : e < 0 ? e : -ENOTCONN;
}

/* Notes name among the entries to remove once the key is stored (once
 * each).  Out of memory: not noted (the entry stays; the next start
 * removes it). */
static void stale_add(struct gshmd_leasekey *k, const char *name) {
  char **l;

  for (size_t i = 0; i < k->nstale; i++)
    if (!strcmp(k->stale[i], name))
      return;
  if (!(l = realloc(k->stale, (k->nstale + 1) * sizeof(*l))))
    return;
  k->stale = l;
  if ((l[k->nstale] = strdup(name)))
    k->nstale++;
}

/* Removes the stale entries (by name: FDSTOREREMOVE takes every fd of
 * one); those whose removal cannot be sent stay noted. */
static void stale_send(struct gshmd_leasekey *k) {
  size_t kept = 0;

  for (size_t i = 0; i < k->nstale; i++) {
    char msg[96];
    snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", k->stale[i]);
    if (sd_notify(0, msg) > 0)
      free(k->stale[i]);
    else
      k->stale[kept++] = k->stale[i];
  }
  k->nstale = kept;
}

static void stale_free(struct gshmd_leasekey *k) {
  for (size_t i = 0; i < k->nstale; i++)
    free(k->stale[i]);
  free(k->stale);
  k->stale = NULL;
  k->nstale = 0;
}

/* Takes the key from the readable entry of the highest version among
 * fds[0..n) (each key entry's fd closed and set to -1) and notes the
 * others to remove; the kept one's name too where another entry has it
 * (it cannot stay: a removal takes every fd of a name): *moved then.
 * *top the highest version seen, *any whether there was a key entry. */
static void key_take(struct gshmd_leasekey *k, int *fds, char **names, int n, uint64_t *top,
                     bool *any, bool *moved) {
  uint8_t key[crypto_auth_KEYBYTES];
  int best = -1, unreadable = 0;
  uint64_t v;

  for (int i = 0; fds && names && i < n; i++) {
    if (fds[i] < 0 || !names[i] || !key_name(names[i], &v))
      continue;
    *any = true;
    *top = v > *top ? v : *top;
    if (!key_read(key, fds[i]))
      unreadable++;
    else if (best < 0 || v > k->version) {
      memcpy(k->key, key, sizeof(key));
      k->version = v;
      best = i;
    }
  }
  sodium_memzero(key, sizeof(key));
  for (int i = 0; fds && names && i < n; i++) {
    if (fds[i] < 0 || !names[i] || !key_name(names[i], &v))
      continue;
    if (i != best && best >= 0 && !strcmp(names[i], names[best]))
      *moved = true;
    if (i != best)
      stale_add(k, names[i]);
  }
  for (int i = 0; fds && names && i < n; i++)
    if (fds[i] >= 0 && names[i] && key_name(names[i], &v)) {
      close(fds[i]);
      fds[i] = -1;
    }
  k->restored = best >= 0;
  if (unreadable)
    gshm_log_warn("fd store: %d unreadable lease key entr%s dropped", unreadable,
                  unreadable == 1 ? "y" : "ies");
}

int gshmd_leasekey_setup(struct gshmd_leasekey *k, int *fds, char **names, int n) {
  const char *ns = getenv("NOTIFY_SOCKET");
  uint64_t top = 0;
  bool any = false, moved = false;
  int e;

  memset(k, 0, sizeof(*k));
  if (sodium_init() < 0) {
    gshm_log_err("libsodium did not start: no lease tokens, re-takes after a restart are "
                 "checked against the segments' modes");
    return -EIO;
  }
  key_take(k, fds, names, n, &top, &any, &moved);
  if (!k->restored) /* first start, or a store that lost the key: the leases granted
                     * before are then re-checked against the modes */
    randombytes_buf(k->key, sizeof(k->key));
  k->ready = true;
  if (!ns || !*ns) {
    stale_free(k);
    return 0;
  }
  /* A copy to make: stored under a version above every one seen before
   * the old entries are removed, so that a SIGKILL in between leaves a
   * readable one (the next start keeps the highest and removes the rest). */
  if (moved || !k->restored) {
    k->version = any ? top + 1 : 0;
    k->owed = true;
    e = key_store(k);
    if (e == -ECONNREFUSED || e == -ENOENT) {
      stale_free(k); /* nobody reads $NOTIFY_SOCKET: the fd store says so, and is off */
      k->owed = false;
      return 0;
    }
    if (e) {
      gshm_log_warn("fd store: cannot store the lease key (%s); will retry", strerror(-e));
      return 0;
    }
    k->owed = false;
  }
  stale_send(k);
  return 0;
}

bool gshmd_leasekey_retry(struct gshmd_leasekey *k) {
  if (k->owed && key_store(k) == 0) {
    k->owed = false;
    gshm_log_info("fd store: lease key stored");
  }
  if (!k->owed && k->nstale)
    stale_send(k);
  return k->owed || k->nstale;
}

void gshmd_leasekey_attach(struct gshmd_leasekey *k, struct gshmd_registry *r) {
  if (!k->ready)
    return;
  r->token_make = token_make;
  r->token_check = token_check;
  r->token_arg = k;
  r->tokens_restored = k->restored;
}

void gshmd_leasekey_destroy(struct gshmd_leasekey *k) {
  sodium_memzero(k->key, sizeof(k->key));
  stale_free(k);
}
