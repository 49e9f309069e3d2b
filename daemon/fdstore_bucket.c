/* SPDX-License-Identifier: Apache-2.0 */
/* The fd store's buckets: an AF_UNIX SOCK_DGRAM socketpair whose two ends
 * systemd holds, with one datagram queued that carries up to 253 memory
 * fds (SCM_RIGHTS) and a StateBucket with their records.
 *
 * A rewrite sends the new datagram from the end whose receive queue holds
 * the old one (so it lands in the other end's queue), then receives the
 * old one without a control buffer (the kernel closes its fds, none is
 * installed).  A SIGKILL anywhere leaves at least one complete datagram;
 * each queue never holds more than one.  A socketpair's queue has no
 * length limit (net.unix.max_dgram_qlen does not apply to a connected
 * pair); the bounds are the sender's send buffer (sk_sndbuf, a datagram
 * past sk_sndbuf - 32 fails with EMSGSIZE) and the sending user's fds in
 * flight (more than RLIMIT_NOFILE: ETOOMANYREFS, unless CAP_SYS_RESOURCE).
 * Restore peeks (MSG_PEEK installs copies of the fds and leaves the
 * datagram queued), so a restart that dies half-way loses nothing. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "fdstore_internal.h"
#include "log.h"
#include "registry.h"
#include "util.h"

struct fdstore_bucket *gshmd__bucket_new(uint32_t index) {
  struct fdstore_bucket *b = calloc(1, sizeof(*b));
  int sv[2], buf = FDSTORE_BUCKET_BYTES + (16 << 10);

  if (!b)
    return NULL;
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) < 0) {
    free(b);
    return NULL;
  }
  /* (capped at net.core.wmem_max; the default buffer holds a bucket too) */
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  b->index = index;
  b->end[0] = sv[0];
  b->end[1] = sv[1];
  b->queued = -1;
  return b;
}

/* Sends payload with every member's memory fd (lent by the backend) into
 * the queue not holding the current datagram, then drops that one.
 * Returns 0 or a negative errno (nothing changed: the old datagram stays). */
int gshmd__bucket_send(struct fdstore_bucket *b, const uint8_t *payload, size_t len) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * FDSTORE_BUCKET_FDS)];
  } ctl;
  struct iovec iov = {.iov_base = (void *)payload, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  int from = b->queued < 0 ? 0 : b->queued, *fds = (int *)CMSG_DATA(&ctl.align);

  if (b->n) {
    struct cmsghdr *c;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * b->n);
    memset(ctl.buf, 0, mh.msg_controllen); /* (the padding too) */
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * b->n);
    fds = (int *)CMSG_DATA(c);
    for (uint32_t i = 0; i < b->n; i++) {
      struct gshmd_alloc *m = b->seg[i]->mem;
      int e = m->backend->ops->park_fd ? m->backend->ops->park_fd(m->backend, m, &fds[i])
                                       : -ENOTSUP;
      if (e)
        return e;
    }
  }
  if (sendmsg(b->end[from], &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
    return -errno;
  if (b->queued >= 0) /* (no control buffer: its fds are closed, not installed) */
    while (recv(b->end[b->queued], NULL, 0, MSG_DONTWAIT | MSG_TRUNC) < 0 && errno == EINTR)
      ;
  b->queued = 1 - from;
  return 0;
}

/* ---- The last bucket leaving the store ----
 * A gshmd with no segments holds no bucket: the last bucket, once empty,
 * leaves the store.  Not at once: a weight update that unlinks its old
 * copy and pulls the next, or a bench that pulls and unlinks one segment
 * at a time, made it again at each pull (a socketpair and two FDSTORE=1
 * in the pull's publish, and two FDSTOREREMOVE=1 at the unlink: 62 and
 * 48 us of the loop on the 2-core VM, docs/PERFORMANCE.md "Session 36: a
 * pull's fixed costs").  It leaves once it stayed empty and unwritten
 * from one gshmd_fdstore_retry (once a second) to the next: 1-2 s after
 * its last member's free.  A restart in between finds it empty (adopted,
 * then left the same way). */

/* b (empty, stored, its datagram sent) leaves the store; its number is
 * reused only when both removals went through (an owed one would remove
 * the next bucket of that name).  Kept when the first cannot be sent. */
static void bucket_drop(struct gshmd_fdstore *fs, struct fdstore_bucket *b) {
  char msg[64];
  int gone = 0;

  for (int k = 0; k < 2; k++) {
    snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=b%" PRIu32 "%c", b->index, "ab"[k]);
    if (sd_notify(0, msg) > 0)
      gone++;
    else if (k == 0)
      return; /* nothing changed: kept */
    else
      gshmd__fdstore_remove(fs, msg + strlen("FDSTOREREMOVE=1\nFDNAME=")); /* owed */
  }
  fs->buckets[b->index] = NULL;
  if (gone == 2 && b->index + 1 == fs->nbuckets)
    fs->nbuckets--;
  close(b->end[0]);
  close(b->end[1]);
  free(b);
}

void gshmd__bucket_drop_idle(struct gshmd_fdstore *fs) {
  struct fdstore_bucket *b = fs->nbuckets ? fs->buckets[fs->nbuckets - 1] : NULL;
  bool idle = b && !b->n && !b->dirty && !b->frozen && b->stored[0] && b->stored[1];

  if (idle && fs->idle_armed && fs->idle_index == b->index && fs->idle_seq == b->seq) {
    fs->idle_armed = false;
    bucket_drop(fs, b);
    return;
  }
  fs->idle_armed = idle; /* (seen empty now: it leaves at the next call if still so) */
  fs->idle_index = idle ? b->index : 0;
  fs->idle_seq = idle ? b->seq : 0;
}

/* ---- Restore ---- */

/* One queued datagram, peeked: its StateBucket and the fds it carried. */
struct peeked {
  Gshm__StateBucket *t;
  int fds[FDSTORE_BUCKET_FDS];
  int nfds;
  uint64_t frozen_seq; /* -EMFILE: the seq of the datagram left queued (0: unreadable) */
  uint32_t frozen_fds; /* -EMFILE: the fds it holds (its records; unreadable: at most 253) */
  uint32_t frozen_by;  /* -EMFILE: its StateBucket.sender_uid_plus_one (unreadable: 0) */
  bool frozen_read;    /* -EMFILE: its StateBucket was read (frozen_fds is its count) */
};

static void peeked_free(struct peeked *p) {
  for (int i = 0; i < p->nfds; i++)
    if (p->fds[i] >= 0)
      close(p->fds[i]);
  p->nfds = 0;
  if (p->t)
    gshm__state_bucket__free_unpacked(p->t, NULL);
  p->t = NULL;
}

/* Peeks the head of fd's receive queue into p.  Returns 1 (a valid one
 * for bucket index), 0 (queue empty), -EBADMSG (not one of ours: the
 * caller drops it), -EMFILE (its fds could not all be installed: the
 * datagram stays queued, untouched; p->frozen_seq its seq) or another
 * negative errno. */
static int peek_one(int fd, uint32_t index, uint8_t *buf, size_t cap, struct peeked *p) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * FDSTORE_BUCKET_FDS)];
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                      .msg_controllen = sizeof(ctl.buf)};
  ssize_t n = recvmsg(fd, &mh, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

  memset(p, 0, sizeof(*p));
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
  gshm__cmsg_take_fds(&mh, p->fds, FDSTORE_BUCKET_FDS, &p->nfds);
  if (mh.msg_flags & MSG_CTRUNC) {
    peeked_free(p);
    if (!(mh.msg_flags & MSG_TRUNC) && (p->t = gshm__state_bucket__unpack(NULL, (size_t)n, buf)))
      p->frozen_seq = p->t->bucket == index ? p->t->seq : 0;
    p->frozen_fds = p->t && p->t->n_segments < FDSTORE_BUCKET_FDS ? (uint32_t)p->t->n_segments
                                                                   : FDSTORE_BUCKET_FDS;
    p->frozen_by = p->t ? p->t->sender_uid_plus_one : 0;
    p->frozen_read = p->t != NULL;
    peeked_free(p);
    return -EMFILE;
  }
  if ((mh.msg_flags & MSG_TRUNC) || !(p->t = gshm__state_bucket__unpack(NULL, (size_t)n, buf)) ||
      p->t->version != 1 || p->t->bucket != index || p->t->n_segments != (size_t)p->nfds) {
    peeked_free(p);
    return -EBADMSG;
  }
  for (size_t i = 0; i < p->t->n_segments; i++)
    if (!p->t->segments[i] || !p->t->segments[i]->id || !p->t->segments[i]->location) {
      peeked_free(p);
      return -EBADMSG;
    }
  return 1;
}

/* The first valid datagram of end's queue (garbage before it dropped).
 * Returns as peek_one. */
static int peek_valid(int end, uint32_t index, uint8_t *buf, size_t cap, struct peeked *p) {
  for (int tries = 0; tries < 64; tries++) {
    int e = peek_one(end, index, buf, cap, p);
    if (e != -EBADMSG)
      return e;
    gshm_log_warn("fd store: dropping a datagram of bucket %" PRIu32 " that is not ours",
                  index);
    recv(end, NULL, 0, MSG_DONTWAIT | MSG_TRUNC);
  }
  return -EBADMSG;
}

/* One bucket's ends handed back, and what was read from them. */
struct found {
  uint32_t index;
  int idx[2]; /* into fds[] and names[]; -1 when not handed back */
  struct peeked dg[2];
  Gshm__StateBucket *journal; /* its journal copy when newer */
  const Gshm__StateBucket *use;
  int use_dg; /* the datagram whose fds serve (0, 1), -1 none */
};

static int cmp_found(const void *a, const void *b) {
  const struct found *x = a, *y = b;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* By id, then the newest bucket state first (restore keeps the first of
 * an id: qsort is not stable, so the order of equal ids must be total). */
static int cmp_member(const void *a, const void *b) {
  const struct fdstore_member *x = a, *y = b;
  if (x->rec->id != y->rec->id)
    return x->rec->id < y->rec->id ? -1 : 1;
  /* a bucket kept whole before one that came back with one end: a
   * member is only ever moved out of the latter, so the other copy is the
   * moved one (what a store from before write_seq, whose seqs count per
   * bucket, cannot tell) */
  if (!x->b != !y->b)
    return x->b ? -1 : 1;
  return x->seq > y->seq ? -1 : x->seq < y->seq;
}

/* Groups the b<n>a / b<n>b names of fds[0..n) by n (sorted).  Returns how
 * many buckets, or -ENOMEM. */
static int collect(int *fds, char **names, int n, struct found **out) {
  struct found *f = calloc((size_t)n + 1, sizeof(*f));
  int nf = 0;

  if (!f)
    return -ENOMEM;
  for (int i = 0; i < n; i++) {
    uint64_t k, v;
    if (fds[i] >= 0 && gshmd__fdstore_parse_name(names[i], &k, &v) == K_BUCKET)
      f[nf++] = (struct found){.index = (uint32_t)k, .idx = {v ? -1 : i, v ? i : -1}};
  }
  qsort(f, (size_t)nf, sizeof(*f), cmp_found);
  {
    int m = 0;
    for (int i = 0; i < nf; i++) {
      if (m && f[m - 1].index == f[i].index) { /* the other end; a duplicate name is dropped */
        for (int k = 0; k < 2; k++)
          if (f[i].idx[k] >= 0 && f[m - 1].idx[k] < 0)
            f[m - 1].idx[k] = f[i].idx[k];
        continue;
      }
      f[m++] = f[i];
    }
    nf = m;
  }
  *out = f;
  return nf;
}


/* The highest seq of frozen f's datagrams' (seq[0..1]) and journal copy:
 * a later start reads them, so this run's writes must be numbered above.
 * Its fds peeked are closed; f->use stays NULL (nothing adopted); the
 * fds its datagrams keep in flight (both may be queued: a rewrite killed
 * before it dropped the older) are counted in fs->frozen_fds. */
static uint64_t frozen_seq(struct gshmd_fdstore *fs, struct found *f, const uint64_t *seq) {
  uint64_t top = seq[0] > seq[1] ? seq[0] : seq[1];
  Gshm__StateBucket *j = gshmd__journal_get(fs, f->index);

  gshm_log_err("fd store: bucket %" PRIu32 " not restored: its fds do not fit under "
               "RLIMIT_NOFILE (raise LimitNOFILE=); it stays stored, untouched",
               f->index);
  fs->nfrozen++;
  for (int k = 0; k < 2; k++) {
    const struct peeked *d = &f->dg[k];
    uint64_t n = d->t ? (uint64_t)d->nfds : d->frozen_fds;
    fs->frozen_fds += n;
    fs->frozen_fds_most |= !d->t && n && !d->frozen_read;
    if (n) /* (whose they are: said at the switch, gshmd__bucket_say_frozen) */
      gshmd__bucket_frozen_sender(fs, d->t ? d->t->sender_uid_plus_one : d->frozen_by);
  }
  peeked_free(&f->dg[0]);
  peeked_free(&f->dg[1]);
  if (j && j->seq > top)
    top = j->seq;
  if (j)
    gshm__state_bucket__free_unpacked(j, NULL);
  return top;
}

/* Reads what f's ends (fds[f->idx[k]]) hold: the newest valid datagram
 * (the older one is dropped from its queue) and the journal's copy when
 * newer.  Returns the highest seq seen; with *frozen set when a
 * datagram's fds could not be installed (left queued, untouched; the
 * seq is that of its newest state, of which nothing is adopted). */
static uint64_t read_found(struct gshmd_fdstore *fs, const int *fds, struct found *f, uint8_t *buf,
                           size_t cap, bool *frozen) {
  uint64_t seq[2] = {0, 0}, top;

  f->use_dg = -1;
  for (int k = 0; k < 2; k++) {
    int e = f->idx[k] < 0 ? 0 : peek_valid(fds[f->idx[k]], f->index, buf, cap, &f->dg[k]);
    if (e == -EMFILE) {
      *frozen = true;
      seq[k] = f->dg[k].frozen_seq;
    }
    if (e == 1)
      seq[k] = f->dg[k].t->seq;
  }
  if (*frozen)
    return frozen_seq(fs, f, seq);
  if (seq[0] || seq[1]) {
    int old = seq[0] > seq[1] ? 1 : 0;
    f->use_dg = 1 - old;
    if (seq[old]) { /* a rewrite killed before it dropped the old one */
      recv(fds[f->idx[old]], NULL, 0, MSG_DONTWAIT | MSG_TRUNC);
    }
    peeked_free(&f->dg[old]);
    f->use = f->dg[f->use_dg].t;
  }
  top = f->use ? f->use->seq : 0;
  if ((f->journal = gshmd__journal_get(fs, f->index)) && f->journal->seq > top) {
    f->use = f->journal;
    top = f->journal->seq;
    fs->from_journal++;
  }
  return top;
}

/* The fd of record id in f's datagram (NULL: its memory never reached the
 * store).  Linear: only when the journal's copy is newer. */
static int *fd_of(struct found *f, size_t i) {
  struct peeked *p = f->use_dg >= 0 ? &f->dg[f->use_dg] : NULL;
  uint64_t id = f->use->segments[i]->id;

  if (!p)
    return NULL;
  if (f->use == p->t)
    return &p->fds[i];
  for (int k = 0; k < p->nfds; k++)
    if (p->t->segments[k]->id == id)
      return &p->fds[k];
  return NULL;
}

/* Registers f as bucket f->index with its ends (taken from fds[]).  A
 * bucket of which only one end came back is not kept: NULL (its
 * members go to other buckets, its name is retired; not when frozen:
 * nothing of it was read, and its end stays stored for a start that can
 * take its fds); its number is not
 * used again in this run (fs->nbuckets counts it): FDSTOREREMOVE removes
 * every fd of a name, so the retire would take a new bucket's end stored
 * under the same name with it. */
static struct fdstore_bucket *keep_bucket(struct gshmd_fdstore *fs, int *fds, char **names,
                                          struct found *f, uint64_t seq, bool frozen) {
  bool one_end = f->idx[0] < 0 || f->idx[1] < 0;
  struct fdstore_bucket *b;

  if (one_end && frozen)
    fs->frozen_ends++; /* (its end stays stored: gshmd_fdstore_entries_needed) */
  if (one_end && !frozen) {
    int i = f->idx[0] >= 0 ? f->idx[0] : f->idx[1];
    gshm_log_warn("fd store: bucket %" PRIu32 " came back with one end; its segments move",
                  f->index);
    gshmd__fdstore_retire(fs, names[i]);
  }
  if (f->index >= fs->buckets_cap) {
    uint32_t cap = fs->buckets_cap ? fs->buckets_cap : 16;
    struct fdstore_bucket **n;
    while (cap <= f->index)
      cap *= 2;
    if (!(n = realloc(fs->buckets, cap * sizeof(*n))))
      return NULL;
    memset(n + fs->buckets_cap, 0, (cap - fs->buckets_cap) * sizeof(*n));
    fs->buckets = n;
    fs->buckets_cap = cap;
  }
  if (f->index >= fs->nbuckets)
    fs->nbuckets = f->index + 1;
  if (one_end || !(b = calloc(1, sizeof(*b))))
    return NULL;
  b->index = f->index;
  for (int k = 0; k < 2; k++) {
    b->end[k] = fds[f->idx[k]];
    b->stored[k] = true;
    fds[f->idx[k]] = -1;
  }
  b->queued = f->use_dg;
  b->seq = seq;
  b->frozen = frozen;
  fs->buckets[f->index] = b;
  return b;
}

/* ---- A bucket that came back with one end ----
 * Its members move to other buckets, and its one end stays stored until
 * the store has caught up (the retire of its name, keep_bucket): its
 * datagram carries the memory of members whose new bucket's state is only
 * in the journal (which has no fds), or nowhere (no bucket could be
 * made).  A restart before that reads the datagram again, with its
 * records as they were when the bucket lost its end: a member freed since
 * came back from it, named, with its memory as the free left it (zeroed
 * by a revoke's punch), and a chmod or an unlink made since was undone
 * where its new bucket did not come back whole.  No datagram can be sent
 * to an end whose peer is gone, so the bucket's state, the segments
 * adopted from its records as they are now, goes to its number's journal
 * copy instead (its number is out of use in this run: keep_bucket), at
 * the restore and at each unlink, chmod, chown or free of one of them; a
 * restart takes that copy (newer: write_seq) with the memory fds of the
 * datagram (fd_of).  The list is dropped once the name is retired. */

/* A one-ended bucket of number index, empty, in fs->one_ended.  NULL
 * when out of memory or without a service manager (nothing is written). */
static struct fdstore_bucket *one_ended_add(struct gshmd_fdstore *fs, uint32_t index) {
  struct fdstore_bucket *b;

  if (!fs->enabled)
    return NULL;
  if (fs->n_one_ended == fs->one_ended_cap) {
    uint32_t c = fs->one_ended_cap ? 2 * fs->one_ended_cap : 4;
    struct fdstore_bucket **l = realloc(fs->one_ended, c * sizeof(*l));
    if (!l)
      return NULL;
    fs->one_ended = l;
    fs->one_ended_cap = c;
  }
  if (!(b = calloc(1, sizeof(*b))))
    return NULL;
  b->index = index;
  b->end[0] = b->end[1] = -1;
  b->queued = -1;
  fs->one_ended[fs->n_one_ended++] = b;
  return b;
}

/* Writes one-ended b's members' current records to its journal copy. */
static void one_ended_put(struct gshmd_fdstore *fs, struct fdstore_bucket *b) {
  uint8_t *buf = NULL;
  size_t len;
  int e;

  b->seq = ++fs->write_seq;
  len = gshmd__bucket_pack(b, b->seq, fs->publish_done, &buf);
  e = buf ? gshmd__journal_put(fs, b, buf, len) : -ENOMEM;
  free(buf);
  if (e && e != -EBADF) /* (no journal: said at the start) */
    gshm_log_err("fd store: cannot write the journal's copy of bucket %" PRIu32 ", which came "
                 "back with one end (%s); a crash now may bring back its segments as they "
                 "were, also those freed since",
                 b->index, strerror(-e));
}

/* After the restore: each one-ended bucket's state, without the members
 * that were not adopted (a cut publish's, those without memory). */
void gshmd__one_ended_write(struct gshmd_fdstore *fs) {
  for (uint32_t k = 0; k < fs->n_one_ended; k++)
    one_ended_put(fs, fs->one_ended[k]);
}

/* A registry event: when seg (NULL: none) was unlinked, changed (owner,
 * mode) or freed, the state of each one-ended bucket it came from is
 * written again (without it, freed).  O(members of those buckets), only
 * while one is stored. */
void gshmd__one_ended_changed(struct gshmd_fdstore *fs, struct gshmd_segment *seg, int event) {
  if (!seg || (event != GSHMD_SEGMENT_UNLINKED && event != GSHMD_SEGMENT_CHANGED &&
               event != GSHMD_SEGMENT_FREED))
    return;
  for (uint32_t k = 0; k < fs->n_one_ended; k++) {
    struct fdstore_bucket *b = fs->one_ended[k];
    for (uint32_t i = 0; i < b->n; i++)
      if (b->seg[i] == seg) {
        if (event == GSHMD_SEGMENT_FREED)
          b->seg[i] = b->seg[--b->n];
        one_ended_put(fs, b);
        break;
      }
  }
}

/* The one-ended buckets are forgotten once their names are retired and
 * no removal is owed (the resend), or at a stop. */
void gshmd__one_ended_forget(struct gshmd_fdstore *fs, bool stop) {
  if (!stop && (fs->nretire || fs->nremoves || !fs->n_one_ended))
    return;
  for (uint32_t k = 0; k < fs->n_one_ended; k++)
    free(fs->one_ended[k]);
  free(fs->one_ended);
  fs->one_ended = NULL;
  fs->n_one_ended = fs->one_ended_cap = 0;
}

/* The memory fd for m[i], the first (newest) record of its id in m[0..nm)
 * (sorted by cmp_member): its own, else that of an older record of the
 * id which has one.  The newest may have none (its bucket's state came
 * from the journal, which carries no fds, after the member moved there
 * from a bucket that lost an end): one id's memory is one memfd,
 * whichever bucket's datagram carried it. */
static int *member_fd(const struct fdstore_member *m, size_t nm, size_t i) {
  int *fd = m[i].fd;
  for (size_t j = i + 1; (!fd || *fd < 0) && j < nm && m[j].rec->id == m[i].rec->id; j++)
    fd = m[j].fd;
  return fd;
}

/* Adopts every member of the buckets found, in id order (the registry's
 * list is kept in id order: O(1) per segment that way), into the buckets
 * they came from (or, for a bucket that lost an end, into new ones, and
 * each into the list of its one_ended[] bucket, where it has one);
 * but none of a set whose publish a stop cut short (fdstore_publish.c). */
static int adopt_members(struct gshmd_fdstore *fs, struct found *f, int nf,
                         struct fdstore_bucket **kept, struct fdstore_bucket **one_ended) {
  struct fdstore_member *m;
  size_t nm = 0, total = 0;

  for (int i = 0; i < nf; i++)
    total += f[i].use ? f[i].use->n_segments : 0;
  if (!(m = malloc((total ? total : 1) * sizeof(*m))))
    return -ENOMEM;
  for (int i = 0; i < nf; i++)
    for (size_t k = 0; f[i].use && k < f[i].use->n_segments; k++)
      m[nm++] = (struct fdstore_member){.rec = f[i].use->segments[k], .seq = f[i].use->seq,
                                        .fd = fd_of(&f[i], k), .b = kept[i],
                                        .one_ended = one_ended[i]};
  nm = gshmd__publish_filter(fs, m, nm);
  qsort(m, nm, sizeof(*m), cmp_member);
  for (size_t i = 0; i < nm; i++) {
    struct gshmd_segment *seg;
    struct fdstore_bucket *b = m[i].b;
    Gshm__StateRecord linked, *rec = &linked;
    linked = *m[i].rec;
    if (m[i].relink) { /* (its replace was cut short: the name is its own) */
      linked.unlinked = false;
      linked.replaced_by = 0;
    }
    if (i && m[i].rec->id == m[i - 1].rec->id) {
      gshm_log_err("fd store: segment id %" PRIu64 " is in two buckets; the copy in a bucket "
                   "kept whole is kept, else the one written last; the other is dropped",
                   m[i].rec->id);
      fs->dropped++;
    } else if (gshmd__fdstore_adopt(fs, rec, member_fd(m, nm, i)) == 0) {
      seg = gshmd_registry_find_id(fs->reg, m[i].rec->id);
      gshmd__publish_adopted(fs, rec, seg);
      if (b && b->n < FDSTORE_BUCKET_FDS) {
        seg->fs_bucket = b->index + 1;
        seg->fs_slot = b->n;
        b->seg[b->n++] = seg;
        continue;
      }
      if (fs->enabled)
        gshmd__fdstore_place(fs, seg, false);
      continue;
    }
    if (b) /* its bucket must be rewritten without it */
      b->rewrite = true;
  }
  for (size_t i = 0; i < nm; i++) { /* (also an id adopted from another bucket's copy) */
    struct fdstore_bucket *o = m[i].one_ended;
    struct gshmd_segment *seg;
    if (o && o->n < FDSTORE_BUCKET_FDS && (seg = gshmd_registry_find_id(fs->reg, m[i].rec->id)))
      o->seg[o->n++] = seg;
  }
  free(m);
  return 0;
}

int gshmd__buckets_restore(struct gshmd_fdstore *fs, int *fds, char **names, int n) {
  struct found *f = NULL;
  struct fdstore_bucket **kept = NULL;
  size_t cap = FDSTORE_BUCKET_BYTES + (64 << 10);
  uint8_t *buf = malloc(cap);
  int nf = buf ? collect(fds, names, n, &f) : -ENOMEM, e = 0;

  /* (kept[0..nf) the buckets kept, kept[nf..2 nf) those with one end) */
  if (nf < 0 || !(kept = calloc(2 * (size_t)nf + 1, sizeof(*kept)))) {
    free(buf);
    free(f);
    return -ENOMEM;
  }
  for (int i = 0; i < nf; i++) {
    bool frozen = false;
    uint64_t seq = read_found(fs, fds, &f[i], buf, cap, &frozen);
    if (seq > fs->write_seq)
      fs->write_seq = seq;
    if (f[i].use && f[i].use->publish_done > fs->publish_done)
      fs->publish_done = f[i].use->publish_done; /* (the journal's mark, when it is lost) */
    kept[i] = keep_bucket(fs, fds, names, &f[i], seq, frozen);
    if (kept[i] && f[i].journal && f[i].use == f[i].journal)
      kept[i]->rewrite = true; /* the journal's copy is newer: resent */
    if (!kept[i] && f[i].use && (f[i].idx[0] < 0 || f[i].idx[1] < 0))
      kept[nf + i] = one_ended_add(fs, f[i].index);
    if (!kept[i])
      for (int k = 0; k < 2; k++)
        if (f[i].idx[k] >= 0 && fds[f[i].idx[k]] >= 0) {
          close(fds[f[i].idx[k]]);
          fds[f[i].idx[k]] = -1;
        }
  }
  e = adopt_members(fs, f, nf, kept, kept + nf);
  for (int i = 0; i < nf; i++) {
    if (f[i].use && f[i].use_dg < 0 && f[i].use->n_segments)
      gshm_log_err("fd store: bucket %" PRIu32 ": %zu segment(s) whose memory never reached "
                   "the store are lost",
                   f[i].index, f[i].use->n_segments);
    peeked_free(&f[i].dg[0]);
    peeked_free(&f[i].dg[1]);
    if (f[i].journal)
      gshm__state_bucket__free_unpacked(f[i].journal, NULL);
  }
  free(kept);
  free(f);
  free(buf);
  return e;
}
