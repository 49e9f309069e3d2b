#include "fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "gshm.pb-c.h"
#include "log.h"
#include "registry.h"

#define STATE_MAX (64u << 20) /* a saved table larger than this is refused */

static struct gshmd_fdstore *the_store; /* the registry callback's context */
static uint64_t state_seq;

static int notify_fd(const char *msg, int fd) {
  int r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
  if (r <= 0) {
    r = r < 0 ? r : -ENOTCONN;
    /* Nobody listens any more (the service manager went away, or a test
     * harness stopped): say so once, and stop trying for every segment. */
    gshm_log_warn("fd store: cannot send to the service manager (%s); segments created from "
                  "now on will not survive a gshmd restart",
                  strerror(-r));
    if (the_store)
      the_store->enabled = false;
    return r;
  }
  return 0;
}

static int park_segment(struct gshmd_segment *seg) {
  struct gshmd_backend *b = seg->mem->backend;
  char msg[64];
  int fd, e;

  if (!b->ops->park_fd)
    return -ENOTSUP;
  if ((e = b->ops->park_fd(b, seg->mem, &fd))) {
    gshm_log_warn("fd store: cannot park segment %" PRIu64 ": %s", seg->id, strerror(-e));
    return e;
  }
  snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=seg-%" PRIu64, seg->id);
  e = notify_fd(msg, fd);
  close(fd);
  return e;
}

/* Serialises the registry into a new sealed memfd, stores it as
 * state-<seq+1>, then removes state-<seq>: a crash in between leaves two
 * tables and restore takes the newer, never none. */
int gshmd_fdstore_sync(struct gshmd_fdstore *fs) {
  struct gshmd_registry *r = fs->reg;
  Gshm__StateTable t = GSHM__STATE_TABLE__INIT;
  Gshm__StateRecord *recs = NULL, **ptrs = NULL;
  struct gshm_list *pos;
  uint8_t *buf = NULL;
  size_t n = 0, len;
  char msg[64];
  int fd = -1, e = 0;

  if (!fs->enabled)
    return 0;
  if (r->nsegments && (!(recs = calloc(r->nsegments, sizeof(*recs))) ||
                       !(ptrs = calloc(r->nsegments, sizeof(*ptrs))))) {
    e = -ENOMEM;
    goto out;
  }
  gshm_list_foreach(pos, &r->segments) {
    struct gshmd_segment *seg = gshm_list_entry(pos, struct gshmd_segment, node);
    Gshm__StateRecord *x = &recs[n];
    gshm__state_record__init(x);
    x->id = seg->id;
    x->generation = seg->generation;
    x->name = seg->name;
    x->requested_size = seg->requested_size;
    x->size = seg->mem->size;
    x->location = seg->mem->location;
    x->uid = seg->uid;
    x->gid = seg->gid;
    x->mode = seg->mode;
    x->flags = seg->flags;
    x->created_ns = seg->created_ns;
    x->unlinked = seg->unlinked;
    ptrs[n++] = x;
  }
  t.version = 1;
  t.seq = state_seq + 1;
  t.next_segment_id = r->next_segment_id;
  t.next_generation = r->next_generation;
  t.next_lease_id = r->next_lease_id;
  t.next_session_id = r->next_session_id;
  t.n_segments = n;
  t.segments = ptrs;
  len = gshm__state_table__get_packed_size(&t);
  if (!(buf = malloc(len ? len : 1))) {
    e = -ENOMEM;
    goto out;
  }
  gshm__state_table__pack(&t, buf);
  fd = memfd_create("gshmd-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || (len && write(fd, buf, len) != (ssize_t)len) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
    e = -errno;
    gshm_log_err("fd store: writing the state table: %m");
    goto out;
  }
  snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=state-%" PRIu64, t.seq);
  if ((e = notify_fd(msg, fd)))
    goto out;
  if (state_seq) {
    snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=state-%" PRIu64, state_seq);
    sd_notify(0, msg);
  }
  state_seq = t.seq;
out:
  if (fd >= 0)
    close(fd);
  free(buf);
  free(ptrs);
  free(recs);
  return e;
}

int gshmd_fdstore_segment_added(struct gshmd_fdstore *fs, struct gshmd_segment *seg) {
  int e;
  if (!fs->enabled)
    return 0;
  /* Segment first, then the table that names it. */
  if ((e = park_segment(seg)))
    return e;
  return gshmd_fdstore_sync(fs);
}

static void on_event(struct gshmd_registry *r, struct gshmd_segment *seg, int event) {
  struct gshmd_fdstore *fs = the_store;
  char msg[64];

  (void)r;
  if (!fs || !fs->enabled)
    return;
  switch (event) {
  case GSHMD_SEGMENT_CREATED:
    gshmd_fdstore_segment_added(fs, seg);
    break;
  case GSHMD_SEGMENT_FREED:
    /* The segment has left the registry: first a table that no longer
     * names it, then its fd out of the store (the memory goes only once
     * systemd drops its copy too).  A crash in between leaves an fd that
     * no table names, which the next start drops. */
    gshmd_fdstore_sync(fs);
    snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=seg-%" PRIu64, seg->id);
    sd_notify(0, msg);
    break;
  default:
    gshmd_fdstore_sync(fs);
    break;
  }
}

int gshmd_fdstore_setup(struct gshmd_fdstore *fs, struct gshmd_registry *reg) {
  const char *ns = getenv("NOTIFY_SOCKET");

  memset(fs, 0, sizeof(*fs));
  fs->reg = reg;
  fs->enabled = ns && *ns;
  the_store = fs;
  reg->on_event = on_event;
  return 0;
}

static int read_state(int fd, Gshm__StateTable **out) {
  struct stat st;
  uint8_t *buf;
  ssize_t got = 0;

  if (fstat(fd, &st) < 0 || st.st_size < 0 || (uint64_t)st.st_size > STATE_MAX)
    return -EINVAL;
  if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
    return -ENOMEM;
  while (got < st.st_size) {
    ssize_t k = pread(fd, buf + got, (size_t)(st.st_size - got), got);
    if (k <= 0) {
      free(buf);
      return -EIO;
    }
    got += k;
  }
  *out = gshm__state_table__unpack(NULL, (size_t)st.st_size, buf);
  free(buf);
  return *out ? 0 : -EBADMSG;
}

int gshmd_fdstore_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  struct gshmd_registry *r = fs->reg;
  Gshm__StateTable *t = NULL;
  int state_idx = -1;
  uint64_t best = 0;
  char msg[64];

  /* The newest table wins; older ones are leftovers of a crash mid-sync. */
  for (int i = 0; i < n; i++) {
    uint64_t seq;
    if (fds[i] < 0 || !names || sscanf(names[i], "state-%" SCNu64, &seq) != 1)
      continue;
    if (state_idx < 0 || seq > best) {
      best = seq;
      state_idx = i;
    }
  }
  if (state_idx >= 0) {
    int e = read_state(fds[state_idx], &t);
    if (e)
      gshm_log_err("fd store: state table unreadable (%s); segments cannot be restored",
                   strerror(-e));
    else if (t->version != 1) {
      gshm_log_err("fd store: state table version %u unknown", t->version);
      gshm__state_table__free_unpacked(t, NULL);
      t = NULL;
    }
    state_seq = best;
  }

  for (size_t k = 0; t && k < t->n_segments; k++) {
    const Gshm__StateRecord *rec = t->segments[k];
    struct gshmd_backend *b = !strcmp(rec->location, "host") ? r->host : r->cuda;
    struct gshmd_alloc *mem = NULL;
    char want[32];
    int idx = -1, e;

    snprintf(want, sizeof(want), "seg-%" PRIu64, rec->id);
    for (int i = 0; i < n; i++)
      if (fds[i] >= 0 && names && !strcmp(names[i], want))
        idx = i;
    if (idx < 0 || !b || !b->ops->adopt_fd) {
      gshm_log_err("fd store: segment '%s' id %" PRIu64 " lost: %s", rec->name, rec->id,
                   idx < 0 ? "its fd was not handed back" : "its backend is unavailable");
      fs->dropped++;
      continue;
    }
    if ((e = b->ops->adopt_fd(b, fds[idx], rec->location, rec->size, &mem)) ||
        (e = gshmd_registry_adopt(r, rec, mem))) {
      gshm_log_err("fd store: segment '%s' id %" PRIu64 " not restored: %s", rec->name, rec->id,
                   strerror(-e));
      if (mem) {
        mem->backend->ops->free(mem->backend, mem); /* closes the adopted fd */
        fds[idx] = -1;
      }
      fs->dropped++;
      continue;
    }
    fds[idx] = -1; /* the backend owns it now */
    fs->restored++;
  }
  if (t) {
    if (t->next_segment_id > r->next_segment_id)
      r->next_segment_id = t->next_segment_id;
    if (t->next_generation > r->next_generation)
      r->next_generation = t->next_generation;
    if (t->next_lease_id > r->next_lease_id)
      r->next_lease_id = t->next_lease_id;
    if (t->next_session_id > r->next_session_id)
      r->next_session_id = t->next_session_id;
    gshm__state_table__free_unpacked(t, NULL);
  }

  /* Whatever else the store gave us that is ours (stale tables, segments
   * the table does not name) is removed from the store and closed. */
  for (int i = 0; i < n; i++) {
    if (fds[i] < 0 || !names || (strncmp(names[i], "seg-", 4) && strncmp(names[i], "state-", 6)))
      continue;
    if (i != state_idx && !strncmp(names[i], "seg-", 4))
      gshm_log_warn("fd store: dropping %s, which the state table does not name", names[i]);
    if (i != state_idx) {
      snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%.40s", names[i]);
      sd_notify(0, msg);
    }
    close(fds[i]);
    fds[i] = -1;
  }
  if (fs->restored || fs->dropped)
    gshm_log_notice("fd store: %u segment(s) restored, %u lost", fs->restored, fs->dropped);
  return 0;
}

void gshmd_fdstore_shutdown(struct gshmd_fdstore *fs) {
  if (fs->reg && fs->reg->on_event == on_event)
    fs->reg->on_event = NULL;
  the_store = NULL;
}
