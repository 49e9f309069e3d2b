/* SPDX-License-Identifier: Apache-2.0 */
/* The PyTorch pool (client/torch_alloc.c) of a client that pulls, with
 * real gshmd on 127.0.0.1: A serves pub/big, B pulls it for a client
 * whose pool grows, frees or is released on another thread meanwhile.
 * B runs the cuda backend on the fake driver (fake_libcuda.c, through
 * LD_LIBRARY_PATH, as test_pool_names), and so does the pool in this
 * process.
 *
 * A pull holds its client's lock until its last byte and calls its
 * progress callback under it.  The pool held its own lock across its
 * requests on that client (a growth's create, a free's close of the
 * segment it emptied, a release's closes and unlinks), so a callback that
 * listed the pool's segments or activated the pool while another thread
 * grew, freed or released it waited for that thread, which waited for the
 * pull: both, for good.  Each case runs in a child of its own (the pool's
 * CUDA is the child's) that alarm() ends if it hangs. */
#include <errno.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gshm.h"
#include "harness.h"
#include "nodes.h"

#define BIG (64 * MiB) /* many chunks: the first progress report comes early */
#define HANG_S 30      /* a child still at work then hung */

static struct cluster_keys keys;
static struct node A, B; /* A serves pub/ *; B pulls, with the (fake) cuda backend */

static int group_setup(void **state) {
  char pa[64], pb[64];
  gshm_client_t *a;
  (void)state;

  keys_make(&keys, "gshm-pool-pull");
  A.port = free_port();
  B.port = free_port();
  snprintf(pa, sizeof(pa), "b=127.0.0.1:%d", B.port);
  snprintf(pb, sizeof(pb), "a=127.0.0.1:%d", A.port);
  node_start(&A, "a", pa, keys.key, "pub/*", NULL);
  node_start(&B, "b", pb, keys.key, "", "daemon.backend=cuda", NULL);
  a = connect_to(&A);
  make_segment(a, "pub/big", BIG, 7);
  gshm_disconnect(a);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  nodes_stop(&A, &B);
  keys_remove(&keys);
  return 0;
}

enum op { OP_GROW, OP_FREE, OP_RELEASE };

/* One case, in the child: the pool, the other thread's work, and what the
 * pull's callback saw. */
struct pool_case {
  enum op op;
  gshm_pool_t *pool;
  void *block;
  sem_t in_pull, started;
  bool called;
  int rc_segs;
  size_t nsegs;
  bool activated;
  void *grown; /* OP_GROW: the other thread's block */
  int rc_release;
};

/* The first report: the pull holds the client's lock.  Lets the other
 * thread start, gives it time to reach that lock (holding the pool's,
 * before), then lists and activates the pool. */
static void on_progress(const gshm_pull_progress_t *pr, void *arg) {
  struct pool_case *pc = arg;
  gshm_pool_segment_t *segs = NULL;

  (void)pr;
  if (pc->called)
    return;
  pc->called = true;
  sem_post(&pc->in_pull);
  sem_wait(&pc->started);
  usleep(300000); /* (the other thread is then in its request; later: passes on the old code) */
  pc->rc_segs = gshm_pool_segments(pc->pool, &segs, &pc->nsegs);
  gshm_free(segs);
  gshm_pool_activate(pc->pool);
  pc->activated = gshm_pool_activate(NULL) == pc->pool;
}

struct pull_arg {
  gshm_client_t *c;
  struct pool_case *pc;
  int rc;
};

static void *pull_thread(void *arg) {
  struct pull_arg *pa = arg;
  gshm_pull_opts_t po = {.local_name = "got/big", .location = "host", .mode = 0600,
                         .progress = on_progress, .progress_arg = pa->pc};
  gshm_pull_result_t r;

  pa->rc = gshm_pull(pa->c, "a", "pub/big", &po, &r);
  return NULL;
}

static void *other_thread(void *arg) {
  struct pool_case *pc = arg;

  switch (pc->op) {
  case OP_GROW:
    gshm_pool_activate(pc->pool);
    pc->grown = gshm_torch_malloc(2 * MiB, 0, NULL); /* fits no segment: a growth */
    gshm_pool_activate(NULL);
    break;
  case OP_FREE:
    gshm_torch_free(pc->block, MiB, 0, NULL); /* empties its segment: a close */
    break;
  case OP_RELEASE:
    pc->rc_release = gshm_pool_release(pc->pool, 1); /* closes and unlinks */
    break;
  }
  return NULL;
}

/* The child: what failed, as its exit status (0: all well). */
static int run_case(enum op op) {
  gshm_pool_config_t cfg = {.prefix = "pp", .device = 0, .granule = 2 * MiB,
                            .flags = op == OP_RELEASE ? GSHM_POOL_PERSISTENT : 0};
  struct pool_case pc = {.op = op, .rc_segs = -1};
  struct pull_arg pa = {.pc = &pc};
  pthread_t pull, other;
  int e;

  alarm(HANG_S);
  if (gshm_connect(B.h.socket_path, "pool", &pa.c))
    return 2;
  if ((e = gshm_pool_create(pa.c, &cfg, &pc.pool))) {
    fprintf(stderr, "gshm_pool_create: %s\n", gshm_strerror(e));
    return 3;
  }
  gshm_pool_activate(pc.pool);
  if (!(pc.block = gshm_torch_malloc(MiB, 0, NULL)))
    return 4;
  gshm_pool_activate(NULL);
  if (op == OP_RELEASE)
    gshm_torch_free(pc.block, MiB, 0, NULL); /* (persistent: its segment stays, empty) */
  sem_init(&pc.in_pull, 0, 0);
  sem_init(&pc.started, 0, 0);
  pthread_create(&pull, NULL, pull_thread, &pa);
  sem_wait(&pc.in_pull);
  pthread_create(&other, NULL, other_thread, &pc);
  sem_post(&pc.started);
  pthread_join(pull, NULL);
  pthread_join(other, NULL);
  fprintf(stderr, "case %d: pull %d, segments %d (%zu), activated %d\n", op, pa.rc, pc.rc_segs,
          pc.nsegs, pc.activated);
  if (pa.rc || !pc.called || pc.rc_segs || !pc.activated)
    return 5;
  /* (a segment being closed is not listed: 0 once the other thread is in
   * its close, as test_pool checks) */
  if (pc.nsegs != 1 && (op == OP_GROW || pc.nsegs != 0))
    return 6;
  if (op == OP_GROW && !pc.grown)
    return 7;
  if (op == OP_RELEASE && pc.rc_release)
    return 8;
  /* (a growth's pool is left to the process's end: the fake driver maps
   * every segment at one address, which then names no one segment) */
  if (op == OP_FREE && gshm_pool_release(pc.pool, 1))
    return 9;
  if (gshm_unlink(pa.c, "got/big") || (op != OP_GROW && count_named(pa.c, "pp/")))
    return 10; /* (a pool released leaves no segment) */
  gshm_disconnect(pa.c);
  return 0;
}

static void check_case(enum op op) {
  int status;
  pid_t pid = fork();

  assert_true(pid >= 0);
  if (pid == 0)
    _exit(run_case(op));
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status))
    fprintf(stderr, "case %d: killed by signal %d (SIGALRM: hung)\n", op, WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* Another thread grows the pool (its create waits for the pull). */
static void test_callback_lists_a_growing_pool(void **state) {
  (void)state;
  check_case(OP_GROW);
}

/* Another thread's free empties a segment (its close waits for the pull). */
static void test_callback_lists_a_freeing_pool(void **state) {
  (void)state;
  check_case(OP_FREE);
}

/* Another thread releases the pool (its close and unlink wait for the pull). */
static void test_callback_lists_a_releasing_pool(void **state) {
  (void)state;
  check_case(OP_RELEASE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_callback_lists_a_growing_pool),
      cmocka_unit_test(test_callback_lists_a_freeing_pool),
      cmocka_unit_test(test_callback_lists_a_releasing_pool),
  };
  return NODES_RUN(tests, group_setup, group_teardown);
}
