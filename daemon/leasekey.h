/* SPDX-License-Identifier: Apache-2.0 */
/* Lease tokens: the key that makes them, kept across restarts in the fd
 * store (docs/ARCHITECTURE.md "The fd store"), and the registry's
 * token_make / token_check hooks.
 *
 * A token is crypto_auth (HMAC-SHA-512-256) under a 32-byte key made at
 * gshmd's first start, over a lease's segment id and generation, access
 * and holder uid.  After a restart the holder sends it back with its
 * re-take; gshmd verifies it and grants the same access, whatever the
 * segment's mode is now. */
#ifndef GSHMD_LEASEKEY_H
#define GSHMD_LEASEKEY_H

#include <stdbool.h>
#include <stdint.h>

#include <sodium.h>

struct gshmd_registry;

struct gshmd_leasekey {
  uint8_t key[crypto_auth_KEYBYTES];
  bool ready;     /* key is set */
  bool restored;  /* key came back from the fd store */
  bool owed;      /* under a service manager, its FDSTORE=1 has not gone through */
  uint64_t version;  /* of its entry's name: "leasekey" 0, "leasekey-<v>" v */
  /* Names of older key entries, removed once the key is stored (owed
   * while their FDSTOREREMOVE=1 cannot be sent) */
  char **stale;
  size_t nstale;
};

/* Takes the key back from the fd store: of the entries named "leasekey"
 * or "leasekey-<v>" in fds[0..n) (names from sd_listen_fds_with_names),
 * the readable one of the highest version; every one's fd is closed and
 * set to -1 in fds[].  The others leave the store by name; when one
 * shares the kept entry's name (which a removal would take with it), or
 * none is readable, the key is stored again, under "leasekey-<v>" above
 * every version seen, before any old entry is removed: a SIGKILL at any
 * point leaves a readable copy for the next start (before, the old name
 * was removed first, and a kill before the new copy's send lost the key:
 * re-takes after a restart fell back to the modes).  Without any entry,
 * makes a new key and, under a service manager ($NOTIFY_SOCKET), stores
 * it in its own sealed memfd (FDNAME=leasekey).  A send that fails is
 * owed (the old entries' removals wait for it) and retried by
 * gshmd_leasekey_retry.  Call before gshmd_fdstore_restore, which must
 * not see the entries.  Returns 0, or -EIO when libsodium cannot start
 * (no key: the registry then issues no tokens). */
int gshmd_leasekey_setup(struct gshmd_leasekey *k, int *fds, char **names, int n);

/* Resends the key to the fd store when its last send failed, then the
 * old entries' removals.  Returns whether either is still owed. */
bool gshmd_leasekey_retry(struct gshmd_leasekey *k);

/* Makes r issue and check tokens with k (k must outlive r's use of it). */
void gshmd_leasekey_attach(struct gshmd_leasekey *k, struct gshmd_registry *r);

/* Wipes the key, frees the names noted. */
void gshmd_leasekey_destroy(struct gshmd_leasekey *k);

#endif
