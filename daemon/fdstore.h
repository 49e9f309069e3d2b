/* Restart without losing a byte: every segment's fd is parked in systemd's
 * fd store (FDSTORE=1, FDNAME=seg-<id>) and a sealed memfd named "state"
 * holds the serialised segment table.  On start, what
 * sd_listen_fds_with_names() returns is adopted back before READY=1.
 * Without $NOTIFY_SOCKET (no service manager) all of this is skipped. */
#ifndef GSHMD_FDSTORE_H
#define GSHMD_FDSTORE_H

#include <stdbool.h>

struct gshmd_registry;
struct gshmd_segment;

struct gshmd_fdstore {
  struct gshmd_registry *reg;
  bool enabled;   /* $NOTIFY_SOCKET is set */
  unsigned restored, dropped;
};

/* Hooks the registry (segment created/freed).  Returns 0. */
int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg);

/* Adopts "state" and "seg-*" fds from fds[0..n) (names from
 * sd_listen_fds_with_names); adopted entries are set to -1 in fds[].
 * Segments whose fd is missing or does not match are dropped (logged);
 * fds with no state entry are closed and removed from the store.
 * Returns 0, or a negative errno only for out-of-memory. */
int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n);

/* Parks a new segment's fd and rewrites the state; called by the
 * registry after a create.  Returns 0 or a negative errno (logged; the
 * segment still works, it just would not survive a crash). */
int gshmd_fdstore_segment_added(struct gshmd_fdstore *fs, struct gshmd_segment *seg);

/* Rewrites the state after a change (unlink, chmod, ...). */
int gshmd_fdstore_sync(struct gshmd_fdstore *fs);

void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs);

#endif
