/* SPDX-License-Identifier: Apache-2.0 */
/* libgshm's process-wide locks, and what fork() does to the state they
 * guard.
 *
 * fork() copies into the child a lock that another thread of the parent
 * holds, held, and no thread of the child will ever release it: the
 * child's first use would wait for good.  Python's multiprocessing and
 * PyTorch's DataLoader fork processes that use libgshm while other threads
 * of the parent may be in it.  So every lock that guards process-wide
 * state is one of the locks below, taken only through gshm__fork_lock:
 * one pthread_atfork handler, registered at the first use of any, takes
 * them all before a fork (waiting for their holders to finish, so that no
 * state is copied half-changed) and releases them in both processes after
 * it.  A fork by a thread that holds one of them itself (the CUDA driver
 * may fork a helper, which execs, inside a call made under one) takes
 * none: taking that one again would wait for good, and waiting for an
 * outer one could wait for a thread that waits for the forking one.  The
 * child's one thread is the forking thread's copy, and releases what it
 * holds as the parent does.
 *
 * One handler and one order for all of them, rather than a handler per
 * lock: prepare handlers run in the reverse order of their registration,
 * which for handlers registered at first use is the order in which the
 * process happened to use the locks first; a broadcast before any copy
 * would have had a fork take the copy table's lock first and then wait for
 * a broadcast that waits for it.
 *
 * A fork is also counted: gshm__fork_gen() tells state made before a fork
 * (a client's socket and leases, anything of CUDA's) from the child's
 * own.  CUDA does not survive fork(): the child of a process that
 * initialized the driver cannot use it (NVIDIA: CUDA duplicates none of
 * its state or threads into the child; any use before exec is undefined),
 * so libgshm's CUDA paths return -ECHILD there (cudadrv.h). */
#ifndef GSHM_COMMON_FORK_H
#define GSHM_COMMON_FORK_H

/* The locks, in the one order in which they may nest (outer first): a
 * thread that holds one takes only later ones, also through locks of its
 * own (a pool's) and their holders. */
enum gshm__fork_lock_id {
  GSHM__LOCK_POOLS = 0, /* client/torch_alloc.c: the pool registry (waits for a pool's lock) */
  GSHM__LOCK_BROADCAST, /* kernels/broadcast.c: streams and events (takes the copy table) */
  GSHM__LOCK_COPY,      /* kernels/copy.c: contexts' modules, events, primary contexts */
  GSHM__LOCK_GPUS,      /* client/map_cuda.c: this process's GPUs by UUID */
  GSHM__LOCK_CUDADRV,   /* common/cudadrv.c: the driver's load */
  GSHM__LOCK_COUNT
};

/* Takes lock `id`, registering the fork handlers at the first call of the
 * process.  Never taken twice by one thread. */
void gshm__fork_lock(enum gshm__fork_lock_id id);

/* Releases lock `id`, taken by this thread. */
void gshm__fork_unlock(enum gshm__fork_lock_id id);

/* How many forks made this process from the one that first called a
 * function of this file: 0 there, 1 in its child, 2 in a grandchild.
 * State that remembers the count it was made under belongs to an
 * ancestor when the count differs.  Registers the fork handlers. */
unsigned gshm__fork_gen(void);

#endif
