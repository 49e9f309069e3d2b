/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the names of the fd store's entries as systemd hands
 * them back at a restart ($LISTEN_FDNAMES), through
 * gshmd__fdstore_parse_name (daemon/fdstore.c), which every restore step
 * asks what an entry is: b<N>a / b<N>b (a bucket's ends), seg-<ID>,
 * meta-<ID>-<V>, ids-<V>, journal, journal2, or someone else's.
 * (fuzz_fdstore feeds the entries' contents under fixed names.)
 *
 * Input: the name's bytes (up to the first NUL; systemd allows 255).
 * Checked: a name taken as one of gshmd's is exactly what gshmd writes
 * for its numbers (no sign, no leading zero, no overflow, nothing after),
 * with a bucket index under FDSTORE_BUCKET_INDEX_MAX. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdstore_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char name[256], again[300];
  uint64_t id = 0, v = 0;
  enum fdstore_kind k;

  if (size >= sizeof(name))
    return 0;
  memcpy(name, data, size);
  name[size] = 0;
  k = gshmd__fdstore_parse_name(name, &id, &v);
  switch (k) {
  case K_BUCKET:
    if (id >= FDSTORE_BUCKET_INDEX_MAX || v > 1)
      abort();
    snprintf(again, sizeof(again), "b%" PRIu64 "%c", id, v ? 'b' : 'a');
    break;
  case K_SEG:
    snprintf(again, sizeof(again), "seg-%" PRIu64, id);
    break;
  case K_META:
    snprintf(again, sizeof(again), "meta-%" PRIu64 "-%" PRIu64, id, v);
    break;
  case K_IDS:
    snprintf(again, sizeof(again), "ids-%" PRIu64, v);
    break;
  case K_JOURNAL:
    snprintf(again, sizeof(again), "%s", FDSTORE_LEGACY_JOURNAL_NAME);
    break;
  case K_JOURNAL2:
    snprintf(again, sizeof(again), "%s", FDSTORE_JOURNAL_NAME);
    break;
  default:
    return 0;
  }
  if (strcmp(again, name))
    abort();
  return 0;
}
