/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster key's subkeys (subkeys.h).  crypto_kdf_derive_from_key
 * because hello.c already derives a link's keys with it (libsodium, no
 * second library for one KDF), and because its definition is one keyed
 * BLAKE2b call that anyone can check (tests/unit/test_subkeys.c does,
 * against Python's hashlib). */
#include <sodium.h>

#include "subkeys.h"

_Static_assert(SUBKEY_BYTES == crypto_auth_KEYBYTES, "the hello's key is a crypto_auth key");
_Static_assert(SUBKEY_BYTES == crypto_kdf_KEYBYTES, "the cluster key is a crypto_kdf key");
_Static_assert(sizeof(SUBKEY_HELLO_CTX) - 1 == crypto_kdf_CONTEXTBYTES &&
                   sizeof(SUBKEY_SESSION_CTX) - 1 == crypto_kdf_CONTEXTBYTES,
               "a context is 8 bytes");

void gshmd__subkeys_derive(struct subkeys *k) {
  /* (only fails for a length out of crypto_kdf's range: 32 is within) */
  crypto_kdf_derive_from_key(k->hello, sizeof(k->hello), SUBKEY_HELLO_ID, SUBKEY_HELLO_CTX,
                             k->raw);
  crypto_kdf_derive_from_key(k->session, sizeof(k->session), SUBKEY_SESSION_ID,
                             SUBKEY_SESSION_CTX, k->raw);
}

void gshmd__subkeys_wipe(struct subkeys *k) {
  if (k)
    sodium_memzero(k, sizeof(*k));
}
