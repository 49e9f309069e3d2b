/* SPDX-License-Identifier: Apache-2.0 */
/* Test harness: a real gshmd on a mkdtemp socket, readiness from its
 * READY=1 notification (never a sleep), and the service manager's part
 * (fd store, LISTEN_FDS) for restart tests.  No test framework inside, so
 * the GPU tests (whose machine lacks cmocka) use it too. */
#ifndef GSHM_TESTS_HARNESS_H
#define GSHM_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "spawn.h"

struct harness {
  struct gshm_spawn sp;
  const char *gshmd;        /* $GSHMD or the build tree's */
  const char *socket_path;  /* sp.socket_path */
};

/* Starts gshmd with "--backend host" unless extra_args names a backend
 * (extra_args NULL-terminated, may be NULL).  Returns 0 or a negative
 * errno (the reason is printed). */
int harness_start(struct harness *h, const char *const *extra_args);

/* This process's stderr onto fd (a file the test reads afterwards) until
 * harness_stderr_back: a gshmd started meanwhile writes its log there.
 * Returns the saved stderr (give it to harness_stderr_back), or -1 with
 * errno (nothing changed). */
int harness_stderr_onto(int fd);
/* Puts back the stderr harness_stderr_onto saved, and closes saved. */
void harness_stderr_back(int saved);

/* harness_start with gshmd's log in a file: path is a mkstemp template
 * ("/tmp/...-XXXXXX", rewritten to the file's name; the caller unlinks
 * it).  Returns harness_start's result, or a negative errno when the file
 * or the redirection could not be made. */
int harness_start_logged(struct harness *h, const char *const *extra_args, char *path);

/* Same, socket-activated: the harness binds the socket and passes it. */
int harness_start_activated(struct harness *h, const char *const *extra_args);

/* Kills gshmd with sig and starts it again with everything it parked in
 * the fd store (and the listening socket when socket-activated). */
int harness_restart(struct harness *h, int sig, const char *const *extra_args);

/* Stops gshmd (SIGTERM), removes the directory.  Returns gshmd's wait
 * status (0: clean exit). */
int harness_stop(struct harness *h);

/* Open fds of a process (/proc/PID/fd), -1 on error. */
int harness_fd_count(pid_t pid);

/* The fd limit (RLIMIT_NOFILE soft value) that leaves pid room for exactly
 * `room` more fds, whatever holes its fd table has (the limit bounds fd
 * numbers).  Fds numbered 65536 and above are not counted.  -1 on error. */
long harness_lowest_free_fd(pid_t pid, int room);

/* The process's fd count once settled: the least of a few samples 5 ms
 * apart (gshmd holds short-lived fds: sd_notify's socket, the state memfd
 * while it is rewritten). */
int harness_stable_fd_count(pid_t pid);

/* A failed check in a test's teardown skips harness_stop; so that gshmd is
 * never left behind (ctest would wait for it, holding the output pipe),
 * harness_set_leftover remembers h (NULL: forgets it) and
 * harness_kill_leftover, registered with atexit, SIGKILLs its gshmd (the
 * pid is read at kill time, so a harness_restart is followed). */
void harness_set_leftover(struct harness *h);
void harness_kill_leftover(void);

/* cmocka fixtures (as libuv's test/task.h serves its tests; plain C, no
 * cmocka header needed).  harness_cmocka_start allocates size zeroed
 * bytes (a fixture whose first member is a struct harness; size >=
 * sizeof(struct harness)), kills the gshmd an earlier failed test left
 * behind, starts gshmd with extra_args (as harness_start), remembers it
 * for harness_kill_leftover (registered with atexit on the first call)
 * and stores the fixture in *state.  Returns the fixture, or NULL with
 * nothing allocated (the reason is printed).  harness_cmocka_setup is a
 * cmocka setup function (0 or -1) that does it with sizeof(struct
 * harness) and no arguments. */
void *harness_cmocka_start(void **state, size_t size, const char *const *extra_args);
int harness_cmocka_setup(void **state);

/* Stops the fixture's gshmd (harness_stop) and frees *state (a fixture from
 * harness_cmocka_start; the caller released its own members first).
 * Returns 0, or -1 when gshmd did not exit cleanly: a test fails when the
 * daemon it used could not shut down. */
int harness_cmocka_teardown(void **state);

/* Resident set of a process in KiB (/proc/PID/status VmRSS), -1 on error. */
long harness_rss_kib(pid_t pid);

/* uid and gid of the unprivileged user tests run clients as (nobody). */
#define HARNESS_NOBODY 65534

/* In a forked child that becomes uid and gid HARNESS_NOBODY with no
 * supplementary groups (the caller is root), runs fn(arg) and exits with
 * its result.  Returns that exit status, 90 when the child could not
 * change its ids, 100 + N when signal N killed it, -1 when fork or
 * waitpid failed. */
int harness_as_nobody(int (*fn)(const char *arg), const char *arg);

/* How many fds gshmd has parked in the harness's fd store (the service
 * manager's part, sp) under a name that starts with prefix ("": all of
 * them), read under the store's lock (the notify thread changes it). */
int harness_store_count(struct harness *h, const char *prefix);

/* How many of the fd store's entries are bucket ends (`b<n>a`, `b<n>b`):
 * gshmd holds each stored bucket's two sockets (docs/ARCHITECTURE.md, the
 * fd store), which are neither a segment's memfd nor leaked. */
int harness_store_bucket_fds(struct harness *h);

/* Fills buf with bytes from a seeded xorshift stream (never all zero);
 * each seed its own stream. */
void harness_random(void *buf, size_t n, unsigned long long seed);

/* A TCP port of 127.0.0.1 that was free a moment ago (bound and
 * closed), or a negative errno.  Below the kernel's ephemeral range
 * (ip_local_port_range): a port the kernel picked there, bound and closed,
 * was picked again by the next call of the same test (two nodes on one
 * port) and may be taken by any outbound connection, such as another
 * gshmd's link to its peer.  Each process walks 10000 up to that range
 * from a start of its own (by pid), never handing out a port twice. */
int harness_free_port(void);

/* The value of field ("Uid:", "CapEff:") in /proc/WHO/status (WHO a pid,
 * or PID/task/TID for one thread) in out (n bytes; "" when the field is
 * missing).  False when WHO is gone. */
bool harness_proc_status(const char *who, const char *field, char *out, size_t n);

/* How many threads of pid do not run as uid and gid (all four ids of
 * each) with empty effective, permitted and ambient capability sets,
 * each one said on stderr; -1 when /proc/PID/task cannot be read.  A
 * thread that ends meanwhile is skipped.  *checked (may be NULL): how
 * many threads were looked at.  (/proc/PID/status is the main thread's
 * alone: a switch of ids by raw syscalls changes the calling thread only.) */
int harness_threads_not_as(pid_t pid, uid_t uid, gid_t gid, int *checked);

/* A child process, as another user, stepped by its parent: one byte per
 * step through two pipes (the parent's ends to_kid/from_kid, the child's
 * in/out). */
struct harness_kid {
  pid_t pid;
  int to_kid, from_kid;
  int in, out;
};

/* Forks; the child switches to uid (primary group gid, no other groups;
 * uid (uid_t)-1: stays who it is), runs body(k, arg) and exits 0 (body
 * exits non-zero itself on a failed check; 120 when the switch failed).
 * Returns 0 or a negative errno. */
int harness_kid_start(struct harness_kid *k, uid_t uid, gid_t gid,
                      void (*body)(struct harness_kid *k, void *arg), void *arg);
/* One step to the other side (fd: to_kid from the parent, out from the
 * child).  Returns 0 or a negative errno. */
int harness_kid_step(int fd);
/* Waits up to timeout_ms for the other side's step (from_kid / in);
 * false when it died or the time passed. */
bool harness_kid_await(int fd, int timeout_ms);
/* Closes the parent's ends and reaps the child: its exit code, 128 + the
 * signal that killed it, or -1. */
int harness_kid_wait(struct harness_kid *k);

/* Runs gshmctl (next to gshmd in the build tree: $GSHMCTL or
 * ../client/gshmctl) with --socket and args; returns its exit code, and
 * its stdout (malloc'ed, NUL-terminated) in *out when out is not NULL. */
int harness_gshmctl(struct harness *h, char **out, const char *const *args);
/* Same, with its stderr in *out too when with_stderr (its messages). */
int harness_gshmctl_stderr(struct harness *h, char **out, const char *const *args,
                           bool with_stderr);

#endif
