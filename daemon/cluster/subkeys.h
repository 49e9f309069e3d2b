/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster key and the subkeys made from it, one per purpose (key
 * separation): the hello's MACs and the per-connection keys of a link
 * never use the same key, and neither uses the key itself once both
 * sides of a link said CAP_SUBKEYS (cluster protocol 2.6).  A peer before
 * 2.6 is still spoken to with the key itself, as before (hello.c;
 * docs/SECURITY.md "The cluster"). */
#ifndef GSHMD_CLUSTER_SUBKEYS_H
#define GSHMD_CLUSTER_SUBKEYS_H

#include <stdint.h>

#define SUBKEY_BYTES 32 /* each key: crypto_auth's and crypto_kdf's key size */

/* libsodium's crypto_kdf_derive_from_key (keyed BLAKE2b-256, the id as
 * its salt, the context as its personalisation) of the key, one id and
 * one 8-byte context per purpose; never renumbered (peers derive the
 * same). */
#define SUBKEY_HELLO_ID 1
#define SUBKEY_HELLO_CTX "gshmhelo"   /* crypto_auth key of the hello's MACs */
#define SUBKEY_SESSION_ID 2
#define SUBKEY_SESSION_CTX "gshmsess" /* crypto_generichash key of a link's master key */

struct subkeys {
  uint8_t raw[SUBKEY_BYTES];     /* the cluster key (hash of cluster.secret_file): with
                                    peers before 2.6 only, for both purposes */
  uint8_t hello[SUBKEY_BYTES];   /* the hello's MACs (CAP_SUBKEYS both sides) */
  uint8_t session[SUBKEY_BYTES]; /* input of the per-connection keys (the same) */
};

/* Sets k->hello and k->session from k->raw (set by the caller).  Cannot
 * fail. */
void gshmd__subkeys_derive(struct subkeys *k);

/* Wipes every key of k (sodium_memzero); k NULL: nothing. */
void gshmd__subkeys_wipe(struct subkeys *k);

#endif
