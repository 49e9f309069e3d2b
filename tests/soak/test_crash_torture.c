/* SPDX-License-Identifier: Apache-2.0 */
/* Crash torture: gshmd SIGKILLed at random moments while clients of four
 * uids run create / write / open / map / chmod / unlink / close without a
 * pause, and restarted from the fd store (some kills land while a restart
 * restores, before READY=1).  After each restart the clients finish what
 * they were doing (libgshm reconnects and resends), stop, check what they
 * hold and write a new version of the bytes of the segments they created;
 * then the parent checks, as root:
 *   - every create that returned 0 is listed, linked, with its id,
 *     generation, size and its last acknowledged mode, and reads back the
 *     bytes its creator last wrote through its mapping;
 *   - nothing whose unlink returned 0 is listed linked; an id listed is
 *     one a create returned, once; ids and generations are never given
 *     twice;
 *   - every lease a client holds is listed for that client (re-taken), and
 *     its mapping kept its bytes; gshm_stat on it never says -ESTALE;
 *   - gshmctl --json segments lists the same ids as gshm_list.
 * Creates must not fail (-EEXIST would be a resent create not recognised),
 * unlinks and chmods of a committed name must not meet -ENOENT.  One kill
 * in five is a SIGTERM (a graceful restart keeps what a SIGKILL keeps).
 * --behind: in one round in four gshmd's fd limit is cut below its fds in
 * flight for the end of the round, so that every fd-passing send fails
 * (the bucket datagrams go to the journal; creates and opens are refused,
 * and a refused create must leave nothing under its name), then killed.
 * --own N: live segments per client (6 clients x 50 span two buckets).
 *
 *   test_crash_torture [--rounds N] [--clients N] [--seed N] [--max-ms N]
 *                      [--own N] [--behind] */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gshm.h"
#include "harness.h"

#define MAX_CLIENTS 8
#define MAX_ENTRIES 65536
#define MAX_HELD 8
#define MAX_SIZE (128u << 10)
#define NUIDS 4

/* E_REFUSED: the create failed as gshmd may refuse one while it cannot
 * pass fds (-EMFILE, -ENOMEM): nothing may be left under its name. */
enum { E_FREE, E_CREATING, E_COMMITTED, E_UNLINKING, E_UNLINKED, E_UNKNOWN, E_REFUSED };

struct entry {
  _Atomic uint32_t state;
  char name[48];
  uint64_t id, generation;
  uint32_t size, uid, mode, version;
  int slot;
};

struct shared {
  _Atomic uint32_t nentries;
  _Atomic int round;     /* > a client's acked round: stop and check */
  _Atomic int go;        /* >= the round: go on */
  _Atomic bool stop;
  _Atomic int connected;
  _Atomic int acked[MAX_CLIENTS];
  /* what each client held at its last check: entry indexes */
  int held[MAX_CLIENTS][MAX_HELD];
  int nheld[MAX_CLIENTS];
  _Atomic bool behind;   /* gshmd's fd limit is cut: fd passing fails */
  _Atomic uint64_t ops, failures, refused;
  struct entry e[MAX_ENTRIES];
};

static struct shared *sh;
static int max_own = 8; /* live segments per client (--own) */
static const uid_t uids[NUIDS] = {60121, 60122, 60123, 60124};

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A failed check, in any process: counted, and said at once on stderr
 * (one write a line: the processes' lines do not mix). */
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  char line[320] = "torture: FAIL: ";
  size_t head = strlen(line);
  va_list ap;
  int n;

  atomic_fetch_add(&sh->failures, 1);
  va_start(ap, fmt);
  n = vsnprintf(line + head, sizeof(line) - head - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  n = n < (int)(sizeof(line) - head - 2) ? n : (int)(sizeof(line) - head - 2);
  line[head + (size_t)n] = '\n';
  if (write(2, line, head + (size_t)n + 1) < 0)
    return;
}

static unsigned long long seed_of(const struct entry *e, uint32_t version) {
  return (e->id * 0x9e3779b97f4a7c15ull) ^ (e->generation << 20) ^ version;
}

static bool pattern_ok(const uint8_t *p, const struct entry *e, uint32_t version) {
  static uint8_t want[MAX_SIZE];
  harness_random(want, e->size, seed_of(e, version));
  return !memcmp(p, want, e->size);
}

/* ---- a client ---- */

struct held {
  gshm_segment_t *seg;
  uint8_t *addr;
  int idx;
  bool own; /* the create's read-write lease */
};

struct client {
  int slot;
  uid_t uid;
  uint64_t rng;
  gshm_client_t *c;
  struct held held[MAX_HELD];
  int nheld, created;
};

static void drop_held(struct client *cl, int i) {
  gshm_close(cl->held[i].seg);
  cl->held[i] = cl->held[--cl->nheld];
}

static void hold(struct client *cl, gshm_segment_t *s, int idx, bool own) {
  void *p;
  int err = gshm_map(s, NULL, 0, &p);

  if (err) {
    fail("slot %d: map '%s': %s", cl->slot, sh->e[idx].name, gshm_strerror(err));
    gshm_close(s);
    return;
  }
  if (cl->nheld == MAX_HELD)
    drop_held(cl, (int)(rnd(&cl->rng) % MAX_HELD));
  cl->held[cl->nheld++] = (struct held){s, p, idx, own};
}

static uint32_t nentries(void) {
  uint32_t n = atomic_load(&sh->nentries);
  return n < MAX_ENTRIES ? n : MAX_ENTRIES;
}

static int own_live(struct client *cl, int *pick) {
  uint32_t n = nentries();
  int k = 0;
  *pick = -1;
  for (uint32_t i = 0; i < n; i++) {
    struct entry *e = &sh->e[i];
    if (e->slot != cl->slot || atomic_load(&e->state) != E_COMMITTED)
      continue;
    k++;
    if (*pick < 0 || rnd(&cl->rng) % 3 == 0)
      *pick = (int)i;
  }
  return k;
}

static void op_unlink(struct client *cl, int idx) {
  struct entry *e = &sh->e[idx];
  int err;

  atomic_store(&e->state, E_UNLINKING);
  err = gshm_unlink(cl->c, e->name);
  if (err) {
    fail("slot %d: unlink of committed '%s' id %" PRIu64 ": %s (%s)", cl->slot, e->name, e->id,
         gshm_strerror(err), gshm_last_error(cl->c));
    atomic_store(&e->state, E_UNKNOWN);
    return;
  }
  atomic_store(&e->state, E_UNLINKED);
}

static void op_create(struct client *cl) {
  static uint8_t buf[MAX_SIZE];
  static const uint32_t modes[] = {0644, 0664, 0666, 0640};
  gshm_segment_t *s;
  struct entry *e;
  uint32_t idx;
  int pick, err;

  if (own_live(cl, &pick) >= max_own) {
    op_unlink(cl, pick);
    return;
  }
  if ((idx = atomic_fetch_add(&sh->nentries, 1)) >= MAX_ENTRIES)
    return;
  e = &sh->e[idx];
  e->slot = cl->slot;
  e->uid = cl->uid;
  snprintf(e->name, sizeof(e->name), "t/%d/%d", cl->slot, cl->created++);
  e->size = (uint32_t)(4096u << (rnd(&cl->rng) % 6)) - (uint32_t)(rnd(&cl->rng) % 100);
  e->mode = modes[rnd(&cl->rng) % 4];
  atomic_store(&e->state, E_CREATING);
  if ((err = gshm_create(cl->c, e->name, e->size, NULL, e->mode, 0, &s))) {
    if ((err == -EMFILE || err == -ENOMEM) && atomic_load(&sh->behind)) {
      atomic_store(&e->state, E_REFUSED);
      atomic_fetch_add(&sh->refused, 1);
      return;
    }
    fail("slot %d: create '%s': %s (%s)", cl->slot, e->name, gshm_strerror(err),
         gshm_last_error(cl->c));
    atomic_store(&e->state, E_UNKNOWN);
    return;
  }
  e->id = gshm_segment_info(s)->id;
  e->generation = gshm_segment_info(s)->generation;
  e->version = 0;
  harness_random(buf, e->size, seed_of(e, 0));
  if ((err = gshm_write(s, 0, buf, e->size))) {
    fail("slot %d: write '%s': %s", cl->slot, e->name, gshm_strerror(err));
    atomic_store(&e->state, E_UNKNOWN);
    gshm_close(s);
    return;
  }
  atomic_store(&e->state, E_COMMITTED);
  hold(cl, s, (int)idx, true);
}

static void op_open(struct client *cl) {
  uint32_t n = nentries();
  gshm_segment_t *s;
  struct entry *e;
  int idx = -1, err;

  for (int t = 0; n && t < 16 && idx < 0; t++) {
    uint32_t i = (uint32_t)(rnd(&cl->rng) % n);
    if (atomic_load(&sh->e[i].state) == E_COMMITTED)
      idx = (int)i;
  }
  if (idx < 0)
    return;
  e = &sh->e[idx];
  err = gshm_open(cl->c, e->name, GSHM_ACCESS_READ, &s);
  if (err == -ENOENT && atomic_load(&e->state) != E_COMMITTED)
    return; /* its owner unlinked it meanwhile */
  if ((err == -EMFILE || err == -ENOMEM) && atomic_load(&sh->behind))
    return;
  if (err) {
    fail("slot %d: open '%s' id %" PRIu64 " (state %u): %s (%s)", cl->slot, e->name, e->id,
         atomic_load(&e->state), gshm_strerror(err), gshm_last_error(cl->c));
    return;
  }
  if (gshm_segment_info(s)->id != e->id) {
    if (atomic_load(&e->state) == E_COMMITTED)
      fail("slot %d: '%s' opened as id %" PRIu64 ", created as %" PRIu64, cl->slot, e->name,
           gshm_segment_info(s)->id, e->id);
    gshm_close(s);
    return;
  }
  hold(cl, s, idx, false);
}

static void op_chmod(struct client *cl) {
  static const uint32_t modes[] = {0644, 0664, 0666, 0640, 0660};
  uint32_t mode = modes[rnd(&cl->rng) % 5];
  struct entry *e;
  int pick, err;

  if (!own_live(cl, &pick))
    return;
  e = &sh->e[pick];
  if ((err = gshm_chmod(cl->c, e->name, mode))) {
    fail("slot %d: chmod '%s' id %" PRIu64 ": %s (%s)", cl->slot, e->name, e->id,
         gshm_strerror(err), gshm_last_error(cl->c));
    atomic_store(&e->state, E_UNKNOWN);
    return;
  }
  e->mode = mode;
}

/* Stopped: every lease held is re-taken and keeps its bytes. */
static void client_check(struct client *cl) {
  for (int i = 0; i < cl->nheld; i++) {
    struct held *h = &cl->held[i];
    struct entry *e = &sh->e[h->idx];
    gshm_segment_info_t info;
    int err = gshm_stat(h->seg, &info);

    if (err)
      fail("slot %d: stat of held '%s' id %" PRIu64 ": %s (%s)", cl->slot, e->name, e->id,
           gshm_strerror(err), gshm_last_error(cl->c));
    else if (info.id != e->id || info.leases < 1)
      fail("slot %d: held '%s': id %" PRIu64 " leases %u", cl->slot, e->name, info.id,
           info.leases);
    if (!pattern_ok(h->addr, e, e->version))
      fail("slot %d: the mapping of '%s' id %" PRIu64 " lost its bytes (version %u)", cl->slot,
           e->name, e->id, e->version);
  }
  sh->nheld[cl->slot] = cl->nheld;
  for (int i = 0; i < cl->nheld; i++)
    sh->held[cl->slot][i] = cl->held[i].idx;
}

/* Going on after the checks (nobody reads patterns now): the segments
 * this client made get a new version of their bytes, through its
 * mapping alone; the next checks read it back through gshmd. */
static void client_bump(struct client *cl) {
  static uint8_t buf[MAX_SIZE];

  for (int i = 0; i < cl->nheld; i++) {
    struct held *h = &cl->held[i];
    struct entry *e = &sh->e[h->idx];
    if (!h->own || atomic_load(&e->state) != E_COMMITTED)
      continue;
    harness_random(buf, e->size, seed_of(e, e->version + 1));
    memcpy(h->addr, buf, e->size);
    e->version++;
  }
}

static void client_run(int slot, uint64_t seed) {
  struct client cl = {.slot = slot, .uid = uids[slot % NUIDS], .rng = seed | 1};
  gid_t g = 60130;
  char name[32];
  int err, acked = 0;

  if (setgroups(1, &g) || setresgid(g, g, g) || setresuid(cl.uid, cl.uid, cl.uid))
    _exit(120);
  snprintf(name, sizeof(name), "torture-%d", slot);
  if ((err = gshm_connect(NULL, name, &cl.c))) {
    fail("slot %d: connect: %s", slot, gshm_strerror(err));
    _exit(1);
  }
  atomic_fetch_add(&sh->connected, 1);
  while (!atomic_load(&sh->stop)) {
    unsigned r = (unsigned)(rnd(&cl.rng) % 100);
    int round = atomic_load(&sh->round);

    if (round > acked) {
      client_check(&cl);
      acked = round;
      atomic_store(&sh->acked[slot], round);
      while (atomic_load(&sh->go) < round && !atomic_load(&sh->stop))
        usleep(1000);
      client_bump(&cl);
      continue;
    }
    atomic_fetch_add(&sh->ops, 1);
    if (r < 30)
      op_create(&cl);
    else if (r < 55)
      op_open(&cl);
    else if (r < 65)
      op_chmod(&cl);
    else if (r < 80) {
      int pick;
      if (own_live(&cl, &pick))
        op_unlink(&cl, pick);
    } else if (cl.nheld)
      drop_held(&cl, (int)(rnd(&cl.rng) % (unsigned)cl.nheld));
  }
  _exit(0);
}

/* ---- the parent ---- */

/* Kills gshmd (the pid the harness is starting) a random moment after it
 * appears: during its restore, or just after READY=1. */
struct killer {
  struct harness *h;
  pid_t old;
  unsigned delay_us;
  bool sent;
};

static void *killer_main(void *arg) {
  struct killer *k = arg;
  for (int i = 0; i < 20000; i++) {
    pid_t p = __atomic_load_n(&k->h->sp.pid, __ATOMIC_SEQ_CST);
    if (p > 0 && p != k->old) {
      usleep(k->delay_us);
      k->sent = kill(p, SIGKILL) == 0;
      return NULL;
    }
    usleep(100);
  }
  return NULL;
}

/* gshmd logs notices and worse ($TORTURE_LOG_LEVEL: another level) */
static const char *gshmd_args[] = {"--set", "daemon.socket_mode=0666", "--log-level", "5",
                                           NULL};

/* SIGKILL and a restart from the store; mid_restore: the new gshmd is
 * killed too, maybe before READY=1, then started once more. */
static int kill_and_restart(struct harness *h, int sig, bool mid_restore, unsigned delay_us) {
  if (mid_restore) {
    struct killer k = {h, h->sp.pid, delay_us, false};
    pthread_t t;
    int e;
    pthread_create(&t, NULL, killer_main, &k);
    e = harness_restart(h, sig, gshmd_args);
    pthread_join(t, NULL);
    if (e && e != -ECHILD)
      return e;
    if (!e && k.sent) { /* it was killed after READY=1 */
      while (waitpid(h->sp.pid, NULL, 0) < 0 && errno == EINTR)
        ;
      h->sp.pid = 0;
      gshm__spawn_poll(&h->sp, 0);
    }
  }
  return harness_restart(h, mid_restore ? SIGKILL : sig, gshmd_args);
}

static struct entry *by_id(uint64_t id) {
  uint32_t n = nentries();
  for (uint32_t i = 0; i < n; i++)
    if (sh->e[i].id == id && atomic_load(&sh->e[i].state) != E_CREATING &&
        atomic_load(&sh->e[i].state) != E_REFUSED)
      return &sh->e[i];
  return NULL;
}

static void check_listing(gshm_client_t *c, gshm_segment_info_t *v, size_t n) {
  uint32_t ne = nentries();

  for (size_t i = 0; i < n; i++) {
    struct entry *e = by_id(v[i].id);
    for (size_t j = i + 1; j < n; j++)
      if (v[j].id == v[i].id || (!v[i].unlinked && !v[j].unlinked && !strcmp(v[i].name, v[j].name)))
        fail("listed twice: id %" PRIu64 " '%s' and id %" PRIu64 " '%s'", v[i].id, v[i].name,
             v[j].id, v[j].name);
    if (!e) {
      fail("listed id %" PRIu64 " '%s' (unlinked %d) was never created", v[i].id, v[i].name,
           v[i].unlinked);
      continue;
    }
    if (!v[i].unlinked && atomic_load(&e->state) == E_UNLINKED)
      fail("'%s' id %" PRIu64 " came back after its unlink", e->name, e->id);
  }
  for (uint32_t k = 0; k < ne; k++) {
    if (atomic_load(&sh->e[k].state) != E_REFUSED)
      continue;
    for (size_t i = 0; i < n; i++)
      if (!v[i].unlinked && !strcmp(v[i].name, sh->e[k].name))
        fail("'%s': its create was refused, yet id %" PRIu64 " is listed under its name",
             sh->e[k].name, v[i].id);
  }
  for (uint32_t k = 0; k < ne; k++) {
    struct entry *e = &sh->e[k];
    const gshm_segment_info_t *f = NULL;
    if (atomic_load(&e->state) != E_COMMITTED)
      continue;
    for (size_t i = 0; i < n && !f; i++)
      if (v[i].id == e->id)
        f = &v[i];
    if (!f) {
      fail("committed '%s' id %" PRIu64 " is gone", e->name, e->id);
      continue;
    }
    if (f->unlinked || strcmp(f->name, e->name) || f->generation != e->generation ||
        f->requested_size != e->size || f->mode != e->mode || f->uid != e->uid)
      fail("committed '%s' id %" PRIu64 ".%" PRIu64 " size %u mode %04o listed as '%s' %" PRIu64
           " size %" PRIu64 " mode %04o unlinked %d",
           e->name, e->id, e->generation, e->size, e->mode, f->name, f->generation,
           f->requested_size, f->mode, f->unlinked);
    {
      static uint8_t buf[MAX_SIZE];
      gshm_segment_t *s;
      int err = gshm_open(c, e->name, GSHM_ACCESS_READ, &s);
      if (err) {
        fail("root: open of committed '%s': %s", e->name, gshm_strerror(err));
        continue;
      }
      if ((err = gshm_read(s, 0, buf, e->size)) || !pattern_ok(buf, e, e->version))
        fail("committed '%s' id %" PRIu64 " does not read back version %u (%s)", e->name, e->id,
             e->version, err ? gshm_strerror(err) : "other bytes");
      gshm_close(s);
    }
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* No id and no generation was given to two creates. */
static void check_ids(void) {
  static uint64_t ids[MAX_ENTRIES], gens[MAX_ENTRIES];
  uint32_t n = nentries(), k = 0;

  for (uint32_t i = 0; i < n; i++) {
    uint32_t st = atomic_load(&sh->e[i].state);
    if (st != E_COMMITTED && st != E_UNLINKING && st != E_UNLINKED)
      continue;
    ids[k] = sh->e[i].id;
    gens[k++] = sh->e[i].generation;
  }
  qsort(ids, k, sizeof(ids[0]), cmp_u64);
  qsort(gens, k, sizeof(gens[0]), cmp_u64);
  for (uint32_t i = 1; i < k; i++) {
    if (ids[i] == ids[i - 1])
      fail("id %" PRIu64 " was given to two creates", ids[i]);
    if (gens[i] == gens[i - 1])
      fail("generation %" PRIu64 " was given to two creates", gens[i]);
  }
}

static void check_leases(gshm_client_t *c, int nclients) {
  gshm_lease_info_t *l;
  size_t n;
  int err = gshm_list_leases(c, &l, &n);

  if (err) {
    fail("root: list leases: %s", gshm_strerror(err));
    return;
  }
  for (int s = 0; s < nclients; s++) {
    char name[32];
    snprintf(name, sizeof(name), "torture-%d", s);
    for (int i = 0; i < sh->nheld[s]; i++) {
      struct entry *e = &sh->e[sh->held[s][i]];
      bool found = false;
      for (size_t k = 0; k < n && !found; k++)
        found = l[k].segment_id == e->id && !strcmp(l[k].client_name, name);
      if (!found)
        fail("%s holds '%s' id %" PRIu64 " but no lease of it is listed", name, e->name, e->id);
    }
    for (size_t k = 0; k < n; k++) {
      bool held = false;
      if (strcmp(l[k].client_name, name))
        continue;
      for (int i = 0; i < sh->nheld[s] && !held; i++)
        held = sh->e[sh->held[s][i]].id == l[k].segment_id;
      if (!held)
        fail("%s has a lease of id %" PRIu64 " '%s' it does not hold", name, l[k].segment_id,
             l[k].segment_name);
    }
  }
  gshm_free(l);
}

/* gshmctl --json segments names the same ids as gshm_list. */
static void check_gshmctl(struct harness *h, gshm_segment_info_t *v, size_t n) {
  char *out = NULL, key[48];
  int rc = harness_gshmctl(h, &out, (const char *const[]){"--json", "segments", NULL});
  size_t ids = 0;

  if (rc || !out) {
    fail("gshmctl --json segments: exit %d", rc);
    free(out);
    return;
  }
  for (const char *p = out; (p = strstr(p, "\"id\":")); p += 5)
    ids++;
  if (ids != n)
    fail("gshmctl lists %zu segments, gshm_list %zu", ids, n);
  for (size_t i = 0; i < n; i++) {
    snprintf(key, sizeof(key), "\"id\": %" PRIu64 ",", v[i].id);
    if (!strstr(out, key)) {
      snprintf(key, sizeof(key), "\"id\":%" PRIu64 ",", v[i].id);
      if (!strstr(out, key))
        fail("gshmctl does not list id %" PRIu64 " '%s'", v[i].id, v[i].name);
    }
  }
  free(out);
}

static bool wait_acked(int round, int nclients, int timeout_ms) {
  for (int t = 0; t < timeout_ms; t++) {
    bool all = true;
    for (int s = 0; s < nclients && all; s++)
      all = atomic_load(&sh->acked[s]) >= round;
    if (all)
      return true;
    usleep(1000);
  }
  return false;
}

/* The run's settings (main's options) and counts. */
struct run {
  int rounds, nclients, max_ms;
  bool behind_rounds;
  uint64_t seed;
  int kills, restore_kills, behind;
};

/* Waits a random part of the round (with the store cut behind for its
 * second half, at times), kills gshmd and restarts it. */
static int round_kill(struct harness *h, struct run *run, uint64_t *x) {
  bool mid = rnd(x) % 3 == 0;
  int sig = rnd(x) % 5 == 0 ? SIGTERM : SIGKILL;
  unsigned us = (unsigned)(rnd(x) % ((uint64_t)run->max_ms * 1000));

  if (run->behind_rounds && rnd(x) % 4 == 0) {
    /* the store falls behind: every fd-passing send fails (ETOOMANYREFS:
     * the user's fds in flight pass the limit), the buckets go to the
     * journal, creates and opens are refused */
    struct rlimit lim = {.rlim_cur = 0, .rlim_max = 0};
    usleep(us / 2);
    prlimit(h->sp.pid, RLIMIT_NOFILE, NULL, &lim);
    lim.rlim_cur = (rlim_t)harness_fd_count(h->sp.pid) / 2;
    atomic_store(&sh->behind, true);
    prlimit(h->sp.pid, RLIMIT_NOFILE, &lim, NULL);
    usleep(us / 2);
    run->behind++;
  } else
    usleep(us);
  run->kills += 1 + mid;
  run->restore_kills += mid;
  return kill_and_restart(h, sig, mid, (unsigned)(rnd(x) % 30000));
}

/* One round: a kill, the clients' checks, the parent's.  Returns false
 * when the run must stop. */
static bool one_round(struct harness *h, struct run *run, int r) {
  uint64_t x = run->seed + (uint64_t)r * 0x9e3779b97f4a7c15ull;
  gshm_segment_info_t *v = NULL;
  gshm_client_t *c;
  size_t n = 0;

  if (round_kill(h, run, &x)) {
    fail("round %d: gshmd did not come back", r);
    return false;
  }
  atomic_store(&sh->round, r);
  if (!wait_acked(r, run->nclients, 30000)) {
    fail("round %d: the clients did not stop within 30 s", r);
    return false;
  }
  atomic_store(&sh->behind, false); /* (once no refusal can be on its way) */
  if (gshm_connect(h->socket_path, "root", &c)) {
    fail("round %d: root connect", r);
    return false;
  }
  if (gshm_list(c, &v, &n))
    fail("round %d: list", r);
  else {
    check_listing(c, v, n);
    check_ids();
    check_leases(c, run->nclients);
    check_gshmctl(h, v, n);
  }
  gshm_free(v);
  gshm_disconnect(c);
  atomic_store(&sh->go, r);
  if (atomic_load(&sh->failures))
    fprintf(stderr, "torture: failures after round %d\n", r);
  return !atomic_load(&sh->failures);
}

static bool parse_args(int argc, char **argv, struct run *run) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
      run->rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
      run->nclients = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      run->seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--max-ms") && i + 1 < argc)
      run->max_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--own") && i + 1 < argc)
      max_own = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--behind"))
      run->behind_rounds = true;
    else
      return false;
  }
  return run->nclients >= 1 && run->nclients <= MAX_CLIENTS && run->rounds >= 1 &&
         run->max_ms >= 1 && max_own >= 1;
}

int main(int argc, char **argv) {
  struct run run = {.rounds = 10, .nclients = 4, .max_ms = 300, .seed = (uint64_t)time(NULL)};
  pid_t pids[MAX_CLIENTS];
  struct harness h;
  struct timespec t0, t1;

  if (!parse_args(argc, argv, &run)) {
    fprintf(stderr, "usage: %s [--rounds N] [--clients 1..%d] [--seed N] [--max-ms N] "
            "[--own N] [--behind]\n", argv[0], MAX_CLIENTS);
    return 2;
  }
  if (geteuid() != 0) {
    printf("torture: needs root (clients of several uids); skipped\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return 1;
  printf("torture: %d rounds, %d clients, kills within %d ms, seed %" PRIu64 "\n", run.rounds,
         run.nclients, run.max_ms, run.seed);
  if (getenv("TORTURE_LOG_LEVEL"))
    gshmd_args[3] = getenv("TORTURE_LOG_LEVEL");
  if (harness_start(&h, gshmd_args))
    return 1;
  harness_set_leftover(&h);
  atexit(harness_kill_leftover);
  for (int s = 0; s < run.nclients; s++)
    if ((pids[s] = fork()) == 0)
      client_run(s, run.seed * 7919 + (uint64_t)s * 104729);
  for (int t = 0; t < 10000 && atomic_load(&sh->connected) < run.nclients; t++)
    usleep(1000);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int r = 1; r <= run.rounds && one_round(&h, &run, r); r++)
    ;
  atomic_store(&sh->stop, true);
  for (int s = 0; s < run.nclients; s++)
    waitpid(pids[s], NULL, 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("torture: %" PRIu64 " ops, %d gshmd kills (%d during a restart, %d with the store "
         "behind: %" PRIu64 " creates refused), %u entries, %.1f s\n",
         atomic_load(&sh->ops), run.kills, run.restore_kills, run.behind,
         atomic_load(&sh->refused), atomic_load(&sh->nentries),
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
  /* every check above holds for a run in which nothing was done */
  if (!atomic_load(&sh->ops) || !atomic_load(&sh->nentries) || !run.kills) {
    fprintf(stderr, "torture: checked nothing: %" PRIu64 " ops, %u entries, %d gshmd kills\n",
            atomic_load(&sh->ops), atomic_load(&sh->nentries), run.kills);
    atomic_fetch_add(&sh->failures, 1);
  }
  if (atomic_load(&sh->failures)) {
    fprintf(stderr, "torture: %" PRIu64 " failures (seed %" PRIu64 ", above)\n",
            atomic_load(&sh->failures), run.seed);
    harness_stop(&h);
    return 1;
  }
  harness_set_leftover(NULL);
  return harness_stop(&h) == 0 ? 0 : 1;
}
