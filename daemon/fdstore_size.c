/* SPDX-License-Identifier: Apache-2.0 */
/* How much of systemd's fd store gshmd may take: members per bucket,
 * buckets and stored fds at limits.max_segments, the bytes of their names
 * in LISTEN_FDNAMES, and the checks that refuse a start whose store could
 * not hand every segment back (fdstore.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"

/* A StateRecord's largest encoding besides its name: 12 varint fields of
 * up to 10 bytes with their tags (which bound all 14: mode, unlinked,
 * revoked, flags, uid, gid and publish_members take 6 bytes at most, 110
 * in all with replaced_by's and revoked's 2-byte tags), the location
 * (63 bytes) and a pulled segment's source (GSHM_SOURCE_MAX, 384) or a
 * client's create token (19 bytes with its tag and length: never both,
 * gshmd__fdstore_fill_record), with tags and lengths, and the
 * StateBucket's around it. */
#define RECORD_FIXED_MAX (12u * 11 + 2 + 66 + 387 + 8)

uint32_t gshmd__fdstore_capacity(uint64_t max_name) {
  uint64_t rec = RECORD_FIXED_MAX + 3 + max_name + FDSTORE_RECORD_SLACK;
  uint64_t cap = (FDSTORE_BUCKET_BYTES - 64) / rec;
  return cap > FDSTORE_BUCKET_FDS ? FDSTORE_BUCKET_FDS : (uint32_t)cap;
}

uint64_t gshmd_fdstore_max_buckets(uint64_t max_segments, uint64_t max_name) {
  uint64_t cap = gshmd__fdstore_capacity(max_name);
  return (max_segments + cap - 1) / cap;
}

uint64_t gshmd_fdstore_names_bytes(uint64_t nbuckets) {
  uint64_t digits = 1, bytes = 0;
  /* b<n>a and b<n>b with ':' after each; then ids-<v> twice (a
   * replacement in flight) and journal2, at most 24 bytes each */
  for (uint64_t lo = 0, hi = 10; lo < nbuckets; lo = hi, hi *= 10, digits++)
    bytes += 2 * ((hi < nbuckets ? hi : nbuckets) - lo) * (digits + 3);
  return bytes + 3 * 24;
}

uint64_t gshmd_fdstore_max_fdnames(uint64_t max_segments, uint64_t max_name) {
  return gshmd_fdstore_names_bytes(gshmd_fdstore_max_buckets(max_segments, max_name));
}

uint64_t gshmd_fdstore_max_restorable(uint64_t max_name) {
  uint64_t lo = 0, hi = 1ull << 40; /* largest n with names within the limit */
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo + 1) / 2;
    if (gshmd_fdstore_max_fdnames(mid, max_name) <= FDSTORE_FDNAMES_MAX)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

uint64_t gshmd_fdstore_max_entries(uint64_t max_segments, uint64_t max_name) {
  return 2 * gshmd_fdstore_max_buckets(max_segments, max_name) + FDSTORE_OTHER_ENTRIES;
}

uint64_t gshmd_fdstore_entries_needed(const struct gshmd_fdstore *fs) {
  uint64_t live = 0, frozen = 0, bound;

  for (uint32_t i = 0; i < fs->nbuckets; i++) {
    const struct fdstore_bucket *b = fs->buckets[i];
    if (b && b->frozen)
      frozen += (uint64_t)b->stored[0] + b->stored[1];
    else if (b)
      live++;
  }
  /* (a new bucket is made only when every one not frozen is full: more
   * than the limit's count come back only from a larger limit before) */
  bound = gshmd_fdstore_max_buckets(fs->reg->cfg->max_segments, fs->reg->cfg->max_name);
  if (live > bound)
    bound = live;
  return 2 * bound + frozen + fs->frozen_ends + fs->nretire + fs->nremoves +
         FDSTORE_OTHER_ENTRIES;
}

/* $FDSTORE, systemd's copy of FileDescriptorStoreMax= (set only when that
 * is not 0): a decimal number, or 0 when absent or not one. */
static uint64_t store_max(void) {
  const char *env = getenv("FDSTORE");
  uint64_t n = 0;

  if (!env || !*env)
    return 0;
  for (const char *p = env; *p; p++) {
    if (*p < '0' || *p > '9' || n > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
      return 0;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  return n;
}

/* systemd keeps at most FileDescriptorStoreMax= fds for gshmd (it says how
 * many in $FDSTORE) and closes any fd past that while sd_notify succeeds:
 * a bucket whose end it dropped would come back without its datagram,
 * losing its segments at the next start, and nothing would have said so.
 * So a store too small for limits.max_segments stops gshmd here, as a
 * LISTEN_FDNAMES too long does; what came back is counted after the
 * restore (gshmd__fdstore_check_room). */
int gshmd__fdstore_check_limits(struct gshmd_fdstore *fs) {
  const struct gshmd_config *cfg = fs->reg->cfg;
  uint64_t need = gshmd_fdstore_max_entries(cfg->max_segments, cfg->max_name);

  if (gshmd_fdstore_max_fdnames(cfg->max_segments, cfg->max_name) > FDSTORE_FDNAMES_MAX) {
    gshm_log_err("limits.max_segments %u cannot be restored after a restart: its fd store "
                 "names would pass the %u bytes of LISTEN_FDNAMES that execve allows "
                 "(MAX_ARG_STRLEN); at most %" PRIu64 " at limits.max_name %u",
                 cfg->max_segments, FDSTORE_FDNAMES_MAX,
                 gshmd_fdstore_max_restorable(cfg->max_name), cfg->max_name);
    return -E2BIG;
  }
  fs->store_max = store_max();
  if (!fs->store_max || fs->store_max >= need)
    return 0; /* (not said: an older systemd, or none) */
  gshm_log_err("the fd store is too small for limits.max_segments %u: systemd keeps %" PRIu64
               " fds for gshmd (FileDescriptorStoreMax=) and silently closes the rest, but up "
               "to %" PRIu64 " may be needed; segments would be lost at a restart (raise "
               "FileDescriptorStoreMax= or lower limits.max_segments)",
               cfg->max_segments, fs->store_max, need);
  return -ENOSPC;
}

int gshmd__fdstore_check_room(const struct gshmd_fdstore *fs) {
  uint64_t need = gshmd_fdstore_entries_needed(fs);

  if (!fs->enabled || !fs->store_max || fs->store_max >= need)
    return 0;
  gshm_log_err("the fd store is too small for what it handed back: systemd keeps %" PRIu64
               " fds for gshmd (FileDescriptorStoreMax=), but up to %" PRIu64 " may be needed "
               "at limits.max_segments %u with %" PRIu32 " frozen bucket(s) (their fds did not "
               "fit under RLIMIT_NOFILE), %" PRIu32 " end(s) of frozen buckets that lost the "
               "other and %zu entr%s to be removed once the store caught up; segments would "
               "be lost (raise FileDescriptorStoreMax= or LimitNOFILE=); the store is kept as "
               "it is",
               fs->store_max, need, fs->reg->cfg->max_segments, fs->nfrozen - fs->frozen_ends,
               fs->frozen_ends, fs->nretire + fs->nremoves,
               fs->nretire + fs->nremoves == 1 ? "y" : "ies");
  return -ENOSPC;
}
