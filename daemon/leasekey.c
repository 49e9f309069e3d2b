/* SPDX-License-Identifier: Apache-2.0 */
#include "leasekey.h"

#include <errno.h>
#include <fcntl.h>
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
static bool key_read(struct gshmd_leasekey *k, int fd) {
  struct stat st;

  return fstat(fd, &st) == 0 && st.st_size == (off_t)sizeof(k->key) &&
         pread(fd, k->key, sizeof(k->key), 0) == (ssize_t)sizeof(k->key);
}

/* Stores the key in a sealed memfd of its own.  0 or a negative errno. */
static int key_store(struct gshmd_leasekey *k) {
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
  e = sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=" LEASEKEY_NAME "\nFDPOLL=0", &fd, 1);
  close(fd);
  return e > 0 ? 0 : e < 0 ? e : -ENOTCONN;
}

int gshmd_leasekey_setup(struct gshmd_leasekey *k, int *fds, char **names, int n) {
  const char *ns = getenv("NOTIFY_SOCKET");
  int e;

  memset(k, 0, sizeof(*k));
  if (sodium_init() < 0) {
    gshm_log_err("libsodium did not start: no lease tokens, re-takes after a restart are "
                 "checked against the segments' modes");
    return -EIO;
  }
  bool dropped = false;

  for (int i = 0; fds && names && i < n; i++) {
    if (fds[i] < 0 || !names[i] || strcmp(names[i], LEASEKEY_NAME))
      continue;
    if (!k->restored && key_read(k, fds[i]))
      k->restored = true;
    else
      dropped = true;
    close(fds[i]);
    fds[i] = -1;
  }
  /* An unreadable (or second) entry leaves the store, by name, before a
   * new key is stored under that name: stale keys must not pile up there.
   * A readable one is then stored again below. */
  if (dropped) {
    gshm_log_warn("fd store: unreadable lease key dropped");
    sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=" LEASEKEY_NAME);
    if (k->restored) {
      e = key_store(k);
      if (e && e != -ECONNREFUSED && e != -ENOENT)
        k->owed = true;
    }
  }
  if (k->restored) {
    k->ready = true;
    return 0;
  }
  /* First start (or a store that lost the key: the leases granted before
   * are then re-checked against the modes). */
  randombytes_buf(k->key, sizeof(k->key));
  k->ready = true;
  if (!ns || !*ns)
    return 0;
  e = key_store(k);
  if (e == -ECONNREFUSED || e == -ENOENT)
    return 0; /* nobody reads $NOTIFY_SOCKET: the fd store says so, and is off */
  if (e) {
    gshm_log_warn("fd store: cannot store the lease key (%s); will retry", strerror(-e));
    k->owed = true;
  }
  return 0;
}

bool gshmd_leasekey_retry(struct gshmd_leasekey *k) {
  if (k->owed && key_store(k) == 0) {
    k->owed = false;
    gshm_log_info("fd store: lease key stored");
  }
  return k->owed;
}

void gshmd_leasekey_attach(struct gshmd_leasekey *k, struct gshmd_registry *r) {
  if (!k->ready)
    return;
  r->token_make = token_make;
  r->token_check = token_check;
  r->token_arg = k;
  r->tokens_restored = k->restored;
}

void gshmd_leasekey_destroy(struct gshmd_leasekey *k) { sodium_memzero(k->key, sizeof(k->key)); }
