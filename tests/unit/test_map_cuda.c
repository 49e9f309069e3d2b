/* SPDX-License-Identifier: Apache-2.0 */
/* client/map_cuda.c without a GPU: the import, reserve, map and access
 * steps against a fake driver that counts what is held (imported handles,
 * address reservations, mappings, retained primary contexts, pushed
 * contexts) and refuses what the real one refuses (a reservation that is
 * no multiple of the granularity, a mapping past the allocation's end).
 * The lease is built as gshm__lease_from_grant builds it from a daemon's
 * reply.  Checked here: a reply that cannot describe a cuMem allocation
 * is the daemon's error (-EPROTO), never a driver call; every failing
 * driver call unwinds everything before it; read-only leases map read-only
 * on every device, later ones included; gshm_write's copy is on the GPU
 * when it returns; a failed read of the process's GPUs is not kept; a fork
 * while another thread reads them leaves the child a map path that works,
 * and a fork by the thread that reads them returns; a child makes no
 * driver call on a mapping its parent made.  tests/gpu/test_segments.c runs the same code on GPUs. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "cudadrv.h"
#include "util.h"

#define MiB (1024ull * 1024)
#define GRAN (2 * MiB) /* the fake GPUs' allocation granularity */
#define NDEV 2

/* ---- the rest of libgshm, stubbed (the legacy-IPC open is not tested here) ---- */

int gshm__request(struct gshm_client *c, uint16_t type, const ProtobufCMessage *msg,
                  Gshm__Reply **reply_out, int *fd_out) {
  (void)c, (void)type, (void)msg, (void)reply_out, (void)fd_out;
  return -ENOSYS;
}
int gshm__lease_from_grant(struct gshm_client *c, Gshm__Reply *reply, int fd,
                           gshm_segment_t **seg_out) {
  (void)c, (void)reply, (void)fd, (void)seg_out;
  return -ENOSYS;
}
int gshm__client_lock(struct gshm_client *c) {
  (void)c;
  return -ENOSYS;
}
int gshm__name_check_len(struct gshm_client *c, const char *name) {
  (void)c, (void)name;
  return -ENOSYS;
}

/* ---- the fake driver ---- */

static const char *fail_at; /* the driver entry point that fails next, once */
static int handles, reservations, mappings, retained[NDEV], depth, imports;
static uint64_t alloc_size = 8 * MiB; /* the allocation behind every fd */
static int alloc_owner = 1;
static unsigned long long access_flags[NDEV]; /* last flags set per device; 0: none */
static int access_calls;
static bool htod_in_flight;
/* The next cuDeviceGetCount posts count_entered, stalls this long, and
 * fails: another thread holds map_cuda.c's GPU list lock meanwhile. */
static unsigned count_stall_us;
static sem_t count_entered;
/* The next cuDeviceGetCount forks (as a driver may, to run a helper), and
 * fails: the thread that forks holds map_cuda.c's GPU list lock. */
static bool count_forks;
static pid_t count_forked;

static bool failing(const char *fn) {
  if (fail_at && !strcmp(fail_at, fn)) {
    fail_at = NULL;
    return true;
  }
  return false;
}
#define FAIL_IF(fn)                   \
  do {                                \
    if (failing(fn))                  \
      return CUDA_ERROR_OUT_OF_MEMORY; \
  } while (0)

static CUresult f_count(int *n) {
  if (count_forks) {
    count_forks = false;
    if ((count_forked = fork()) == 0)
      _exit(0);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (count_stall_us) {
    unsigned us = count_stall_us;
    count_stall_us = 0;
    sem_post(&count_entered);
    usleep(us);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  FAIL_IF("cuDeviceGetCount");
  *n = NDEV;
  return CUDA_SUCCESS;
}
static CUresult f_get(CUdevice *d, int ordinal) {
  FAIL_IF("cuDeviceGet");
  *d = ordinal;
  return CUDA_SUCCESS;
}
static CUresult f_uuid(CUuuid *u, CUdevice d) {
  FAIL_IF("cuDeviceGetUuid");
  memset(u->bytes, 0x10 + d, sizeof(u->bytes));
  return CUDA_SUCCESS;
}
static bool no_peer; /* the fake GPUs have no peer path between them */
static CUresult f_can_peer(int *can, CUdevice d, CUdevice peer) {
  (void)d, (void)peer;
  *can = !no_peer;
  return CUDA_SUCCESS;
}
/* GPU d's primary context reset (cudaDeviceReset) since its last retain:
 * destroyed, its handle dead, until a retain makes it again. */
static bool was_reset[NDEV];
static CUresult f_retain(CUcontext *c, CUdevice d) {
  FAIL_IF("cuDevicePrimaryCtxRetain");
  retained[d]++;
  was_reset[d] = false;
  *c = (CUcontext)(uintptr_t)(0x100 + d);
  return CUDA_SUCCESS;
}
static CUresult f_release(CUdevice d) {
  retained[d]--;
  return CUDA_SUCCESS;
}
static CUresult f_push(CUcontext c) {
  uintptr_t d = (uintptr_t)c - 0x100;
  FAIL_IF("cuCtxPushCurrent");
  if (d < NDEV && was_reset[d])
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  depth++;
  return CUDA_SUCCESS;
}
static CUresult f_pop(CUcontext *c) {
  *c = NULL;
  depth--;
  return CUDA_SUCCESS;
}
static CUresult f_import(CUmemGenericAllocationHandle *h, void *fd, CUmemAllocationHandleType t) {
  (void)fd;
  imports++;
  FAIL_IF("cuMemImportFromShareableHandle");
  assert_int_equal(t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  handles++;
  *h = 0x4242;
  return CUDA_SUCCESS;
}
static CUresult f_props(CUmemAllocationProp *p, CUmemGenericAllocationHandle h) {
  (void)h;
  FAIL_IF("cuMemGetAllocationPropertiesFromHandle");
  p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->location.id = alloc_owner;
  return CUDA_SUCCESS;
}
static CUresult f_reserve(CUdeviceptr *va, size_t size, size_t align, CUdeviceptr addr,
                          unsigned long long flags) {
  (void)addr, (void)flags;
  FAIL_IF("cuMemAddressReserve");
  if (!size || size % GRAN || (align & (align - 1)))
    return CUDA_ERROR_INVALID_VALUE;
  reservations++;
  *va = 0x7f0000000000ull;
  return CUDA_SUCCESS;
}
static CUresult f_free(CUdeviceptr va, size_t size) {
  (void)va, (void)size;
  reservations--;
  return CUDA_SUCCESS;
}
static CUresult f_map(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
  (void)va, (void)h, (void)flags;
  FAIL_IF("cuMemMap");
  if (off + size > alloc_size)
    return CUDA_ERROR_INVALID_VALUE;
  mappings++;
  return CUDA_SUCCESS;
}
/* Primary contexts made by someone (torch, the CUDA runtime): active[d]. */
static int active[NDEV];
static CUresult f_ctx_state(CUdevice d, unsigned *flags, int *act) {
  *flags = 0;
  *act = active[d] || (retained[d] > 0 && !was_reset[d]);
  return CUDA_SUCCESS;
}
/* The mapping thread's current context (NULL: none) and its device. */
static CUcontext current;
static CUdevice current_dev;
static CUresult f_get_current(CUcontext *c) {
  *c = current;
  return CUDA_SUCCESS;
}
static CUresult f_ctx_device(CUdevice *d) {
  *d = current_dev;
  return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
/* Work queued on a mapping (a kernel that reads it): a context's
 * cuCtxSynchronize finishes it, unless sync_fails says what every one
 * returns: a capture under way keeps it queued, a sticky error drops it
 * (the context runs nothing more). */
static bool queued;
static int ctx_syncs;
static CUresult sync_fails;
static CUresult f_ctx_sync(void) {
  ctx_syncs++;
  if (sync_fails == CUDA_SUCCESS || gshm__cuda_sticky(sync_fails))
    queued = false;
  return sync_fails;
}
/* A capture on a blocking stream, which the legacy stream's query
 * shows (a cuCtxSynchronize then would invalidate it). */
static bool legacy_capture;
static CUresult f_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
  assert_true(s == CU_STREAM_LEGACY);
  *st = CU_STREAM_CAPTURE_STATUS_NONE;
  return legacy_capture ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}
static CUresult f_unmap(CUdeviceptr va, size_t size) {
  (void)va, (void)size;
  assert_false(queued); /* never under work still queued on it */
  mappings--;
  return CUDA_SUCCESS;
}
static CUresult f_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *d, size_t n) {
  (void)va, (void)size;
  FAIL_IF("cuMemSetAccess");
  access_calls++;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(d[i].location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    access_flags[d[i].location.id] = d[i].flags;
  }
  return CUDA_SUCCESS;
}
static CUresult f_mem_release(CUmemGenericAllocationHandle h) {
  (void)h;
  handles--;
  return CUDA_SUCCESS;
}
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) {
  (void)dst, (void)src, (void)n;
  htod_in_flight = true; /* pageable source: staged, maybe not on the GPU yet */
  return CUDA_SUCCESS;
}
static CUresult f_dtoh(void *dst, CUdeviceptr src, size_t n) {
  (void)src;
  memset(dst, 0x5a, n);
  return CUDA_SUCCESS;
}
static CUresult f_sync(CUstream s) {
  (void)s;
  htod_in_flight = false;
  return CUDA_SUCCESS;
}

static struct gshm_cudadrv fake_drv;

int gshm__cudadrv_load(int prio, const struct gshm_cudadrv **drv_out) {
  (void)prio;
  fake_drv.cuDeviceGetCount = f_count;
  fake_drv.cuDeviceGet = f_get;
  fake_drv.cuDeviceGetUuid = f_uuid;
  fake_drv.cuDeviceCanAccessPeer = f_can_peer;
  fake_drv.cuDevicePrimaryCtxRetain = f_retain;
  fake_drv.cuDevicePrimaryCtxRelease = f_release;
  fake_drv.cuCtxPushCurrent = f_push;
  fake_drv.cuCtxPopCurrent = f_pop;
  fake_drv.cuMemImportFromShareableHandle = f_import;
  fake_drv.cuMemGetAllocationPropertiesFromHandle = f_props;
  fake_drv.cuMemAddressReserve = f_reserve;
  fake_drv.cuMemAddressFree = f_free;
  fake_drv.cuMemMap = f_map;
  fake_drv.cuMemUnmap = f_unmap;
  fake_drv.cuMemSetAccess = f_set_access;
  fake_drv.cuMemRelease = f_mem_release;
  fake_drv.cuMemcpyHtoD = f_htod;
  fake_drv.cuMemcpyDtoH = f_dtoh;
  fake_drv.cuStreamSynchronize = f_sync;
  fake_drv.cuDevicePrimaryCtxGetState = f_ctx_state;
  fake_drv.cuCtxGetCurrent = f_get_current;
  fake_drv.cuCtxGetDevice = f_ctx_device;
  fake_drv.cuCtxSynchronize = f_ctx_sync;
  fake_drv.cuStreamIsCapturing = f_is_capturing;
  *drv_out = &fake_drv;
  return 0;
}

/* ---- helpers ---- */

/* The client every lease here is on (its retired list). */
static struct gshm_client client = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A device segment's lease as a grant makes it: owned by GPU `owner`. */
static struct gshm__lease lease_of(uint64_t size, uint64_t gran, int owner, gshm_access_t access) {
  struct gshm__lease l;
  unsigned char u[16];
  char uuid[48];

  memset(&l, 0, sizeof(l));
  l.client = &client;
  memset(u, 0x10 + owner, sizeof(u));
  gshm__format_gpu_uuid(u, uuid);
  l.fd = 99; /* the fake driver never reads it */
  l.access = access;
  l.info.size = size;
  l.info.requested_size = size;
  l.info.granularity = gran;
  l.info.device_index = owner;
  snprintf(l.info.name, sizeof(l.info.name), "dev/seg");
  snprintf(l.info.location, sizeof(l.info.location), "cuda:%s", uuid);
  return l;
}

/* gshm__unmap_device, then what gshm__client_unlock does after it: the
 * retired mapping's wait and unmap.  0, or the first error. */
static int unmap_device(struct gshm__lease *l) {
  struct device_map *r;
  int e = gshm__unmap_device(l), e2;

  r = client.retired;
  client.retired = NULL;
  e2 = r ? gshm__retire_device_maps(&client, r, false) : 0;
  return e ? e : e2;
}

static void assert_nothing_held(void) {
  assert_int_equal(handles, 0);
  assert_int_equal(reservations, 0);
  assert_int_equal(mappings, 0);
  assert_int_equal(depth, 0);
  for (int d = 0; d < NDEV; d++)
    assert_int_equal(retained[d], 0);
}

/* ---- tests ---- */

/* A reply whose size or granularity no cuMem allocation has, or whose
 * location names no GPU: -EPROTO before any driver call on the fd (it used
 * to reach cuMemAddressReserve, whose refusal came back as -EINVAL, the
 * caller's error). */
static void test_hostile_replies_are_eproto(void **state) {
  struct {
    uint64_t size, gran;
    const char *location;
  } bad[] = {
      {0, GRAN, NULL},            /* empty */
      {3 * MiB, GRAN, NULL},      /* not a multiple of its granularity */
      {6 * MiB, 3 * MiB, NULL},   /* a granularity that is no power of two */
      {4 * MiB, GRAN, "host"},    /* a device segment that names no GPU */
      {4 * MiB, GRAN, "cuda:1"},  /* an index, not the UUID */
  };
  char **uuids;
  size_t n;
  (void)state;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    struct gshm__lease l = lease_of(bad[i].size, bad[i].gran, 1, GSHM_ACCESS_READ_WRITE);
    if (bad[i].location)
      snprintf(l.info.location, sizeof(l.info.location), "%s", bad[i].location);
    imports = 0;
    assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), -EPROTO);
    assert_int_equal(imports, 0);
    assert_null(l.device_map);
    assert_null(l.addr);
    assert_nothing_held();
  }
}

static void *map_in_thread(void *arg) {
  char **uuids;
  size_t n;
  return (void *)(intptr_t)gshm__map_device(arg, NULL, 0, &uuids, &n);
}

/* fork() while another thread reads the process's GPUs (map_cuda.c's list
 * lock held): the child's first map must work, not wait for a lock whose
 * holder is not in the child (it hung for good; alarm() ends such a child
 * with SIGALRM).  Must run first: the list is read only while not kept
 * (the thread's read fails, so the list is still not kept after). */
static void test_fork_while_another_thread_reads_gpus(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE), mine = l;
  pthread_t t;
  void *ret;
  pid_t pid;
  int status;
  (void)state;

  assert_int_equal(sem_init(&count_entered, 0, 0), 0);
  count_stall_us = 300000;
  assert_int_equal(pthread_create(&t, NULL, map_in_thread, &l), 0);
  assert_int_equal(sem_wait(&count_entered), 0); /* the thread holds the lock */
  pid = fork();
  if (pid == 0) {
    char **uuids;
    size_t n;
    alarm(5);
    _exit(gshm__map_device(&mine, NULL, 0, &uuids, &n) == 0 && n == NDEV ? 0 : 1);
  }
  assert_true(pid > 0);
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_int_equal((int)(intptr_t)ret, -ENOMEM); /* the stalled read's failure */
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status)); /* not killed by its alarm */
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_nothing_held();
  sem_destroy(&count_entered);
}

/* A fork() by the thread that holds the GPU list lock (the driver may fork
 * a helper inside a call made under it) returns: fork's handler waited
 * for that lock, held by the forking thread itself, for good (the whole
 * test died of its alarm).  Must run before any map that succeeds. */
static void test_fork_under_the_lock(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  char **uuids;
  size_t n;
  int status;
  (void)state;

  count_forks = true;
  alarm(5);
  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), -ENOMEM);
  alarm(0);
  assert_true(count_forked > 0);
  assert_int_equal(waitpid(count_forked, &status, 0), count_forked);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_nothing_held();
}

/* The first map of the process reads its GPUs (cuDeviceGetCount, then
 * each one's UUID): a failure there is that map's error, and the next map
 * reads them again (the list was kept for the life of the process, failed
 * or not, and every later map of a GPU left out was -ENODEV).  Must run
 * before any map that succeeds: a list once read in full is kept. */
static void test_failed_device_list_is_retried(void **state) {
  struct gshm__lease on0 = lease_of(4 * MiB, GRAN, 0, GSHM_ACCESS_READ_WRITE);
  struct gshm__lease on1 = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  char **uuids;
  size_t n;
  (void)state;

  fail_at = "cuDeviceGetCount";
  assert_int_equal(gshm__map_device(&on1, NULL, 0, &uuids, &n), -ENOMEM);
  assert_null(fail_at);
  assert_nothing_held();
  /* GPU 0's UUID (read first) fails: GPU 0 is unknown to this map only */
  fail_at = "cuDeviceGetUuid";
  assert_int_equal(gshm__map_device(&on0, NULL, 0, &uuids, &n), -ENODEV);
  assert_null(fail_at);
  assert_nothing_held();
  alloc_owner = 0;
  assert_int_equal(gshm__map_device(&on0, NULL, 0, &uuids, &n), 0);
  assert_int_equal(n, NDEV);
  assert_int_equal(unmap_device(&on0), 0);
  alloc_owner = 1;
  assert_int_equal(gshm__map_device(&on1, NULL, 0, &uuids, &n), 0);
  assert_int_equal(unmap_device(&on1), 0);
  assert_nothing_held();
}

/* A size past the allocation's end is the driver's to refuse (cuMemMap):
 * refused, and nothing is left held. */
static void test_size_past_the_allocation(void **state) {
  struct gshm__lease l = lease_of(alloc_size + GRAN, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  char **uuids;
  size_t n;
  (void)state;

  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), -EINVAL);
  assert_null(l.device_map);
  assert_nothing_held();
}

/* Each driver call of a map failing in turn: the driver's error comes
 * back as gshm__cuda_errno maps it, and every handle, reservation,
 * mapping, retained and pushed context before it is undone. */
static void test_every_failure_unwinds(void **state) {
  static const char *const calls[] = {
      "cuDeviceGetCount", /* (a cuDeviceGet that fails leaves that peer out: no error) */
      "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent",
      "cuMemImportFromShareableHandle", "cuMemGetAllocationPropertiesFromHandle",
      "cuMemAddressReserve", "cuMemMap",
      "cuMemSetAccess",
  };
  char **uuids;
  size_t n;
  (void)state;

  for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
    struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
    fail_at = calls[i];
    /* the driver's CUDA_ERROR_OUT_OF_MEMORY, mapped as the product maps it */
    assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), -ENOMEM);
    assert_null(fail_at); /* the failure was reached */
    assert_null(l.device_map);
    assert_nothing_held();
  }
  /* the allocation on another GPU than the reply says: refused, undone */
  {
    struct gshm__lease l = lease_of(4 * MiB, GRAN, 0, GSHM_ACCESS_READ_WRITE);
    assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), -ENODEV);
    assert_nothing_held();
  }
}

/* A read-only lease maps read-only on each device, and on a device added
 * later; a full map and unmap hold nothing after. */
static void test_read_only_everywhere(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ);
  const int owner_only[] = {1}, both[] = {0, 1};
  char **uuids;
  size_t n;
  (void)state;

  memset(access_flags, 0, sizeof(access_flags));
  assert_int_equal(gshm__map_device(&l, owner_only, 1, &uuids, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(access_flags[1], CU_MEM_ACCESS_FLAGS_PROT_READ);
  assert_int_equal(access_flags[0], 0);
  assert_int_equal(retained[1], 1);
  assert_int_equal(depth, 0);
  access_calls = 0;
  assert_int_equal(gshm__map_device_add(&l, both, 2, &uuids, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(access_calls, 1);
  assert_int_equal(access_flags[0], CU_MEM_ACCESS_FLAGS_PROT_READ);
  /* nothing new to add: no driver call */
  assert_int_equal(gshm__map_device_add(&l, both, 2, &uuids, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(access_calls, 1);
  assert_int_equal(unmap_device(&l), 0);
  assert_nothing_held();
}

/* gshm_write's staging copy is on the GPU when the call returns (from
 * pageable memory cuMemcpyHtoD may return before); the range is checked
 * against the mapping. */
static void test_write_is_done_when_it_returns(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  unsigned char buf[64] = {1};
  char **uuids;
  size_t n;
  (void)state;

  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  assert_int_equal(gshm__device_rw(&l, 4096, buf, sizeof(buf), true), 0);
  assert_false(htod_in_flight);
  assert_int_equal(depth, 0);
  assert_int_equal(gshm__device_rw(&l, 4 * MiB - 8, buf, 16, false), -ERANGE);
  assert_int_equal(gshm__device_rw(&l, 0, buf, sizeof(buf), false), 0);
  assert_int_equal(buf[0], 0x5a);
  assert_int_equal(unmap_device(&l), 0);
  assert_nothing_held();
}

/* Maps l for every device (devices NULL). */
static void map_for_every_device(struct gshm__lease *l) {
  char **uuids;
  size_t n;

  assert_int_equal(gshm__map_device(l, NULL, 0, &uuids, &n), 0);
}

/* Maps l for every device and checks that the one primary context
 * retained for its staging copies is GPU dev's; unmaps. */
static void assert_mapping_keeps(struct gshm__lease *l, int dev) {
  map_for_every_device(l);
  for (int d = 0; d < NDEV; d++)
    assert_int_equal(retained[d], d == dev);
  assert_int_equal(unmap_device(l), 0);
  assert_nothing_held();
}

/* A mapping for every device of a segment on GPU 1, in a process whose
 * only context is GPU 0's (a worker of GPU 0): the context it keeps for
 * its staging copies is GPU 0's, which exists, not a new one on GPU 1
 * (hundreds of MiB there for as long as the mapping). */
static void test_mapping_makes_no_context(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  (void)state;

  active[0] = 1;
  assert_mapping_keeps(&l, 0);
  /* no context anywhere: the owner's, as before */
  active[0] = 0;
  assert_mapping_keeps(&l, 1);
  /* the thread's current context is one of its own (cuCtxCreate) on GPU
   * 0, whose primary context is not active; GPU 1's is: GPU 1's is kept,
   * none is made on GPU 0 (a retain of GPU 0's made one) */
  current = (CUcontext)0x900;
  current_dev = 0;
  active[1] = 1;
  assert_mapping_keeps(&l, 1);
  /* and where no primary context is active anywhere: the current one's
   * GPU, where the caller works */
  active[1] = 0;
  assert_mapping_keeps(&l, 0);
  current = NULL;
}

/* A reset of the primary context the mapping keeps (cudaDeviceReset in
 * the process) between two gshm_read / gshm_write: the next copy makes
 * it again (a retain) and works, and unmap releases both retains.  The
 * copy used to fail (CUDA_ERROR_CONTEXT_IS_DESTROYED) for as long as the
 * mapping lived, which gshm_read's kept mapping made the segment's life. */
static void test_copy_after_a_context_reset(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  unsigned char buf[64] = {1};
  (void)state;

  map_for_every_device(&l);
  assert_int_equal(gshm__device_rw(&l, 0, buf, sizeof(buf), true), 0);
  assert_int_equal(retained[1], 1);
  was_reset[1] = true;
  assert_int_equal(gshm__device_rw(&l, 0, buf, sizeof(buf), false), 0);
  assert_int_equal(gshm__device_rw(&l, 0, buf, sizeof(buf), true), 0);
  assert_int_equal(retained[1], 2); /* one more, once */
  assert_int_equal(depth, 0);
  assert_int_equal(unmap_device(&l), 0);
  assert_nothing_held();
}

/* gshm__map_access, which gshm_copy asks before a GPU touches a mapping:
 * the access each device was given, none past the mapping's end, and
 * nothing once unmapped. */
static void test_map_access_per_device(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  struct gshm__lease r = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ);
  unsigned long long f = 99;
  uintptr_t va;
  char **uuids;
  size_t n;
  int one = 1;
  (void)state;

  assert_int_equal(gshm__map_device(&l, &one, 1, &uuids, &n), 0);
  va = (uintptr_t)l.addr;
  assert_int_equal(gshm__map_access(va + 4096, 64, 1, &f), 1);
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  assert_int_equal(gshm__map_access(va + 4096, 64, 0, &f), 1);
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  assert_int_equal(gshm__map_access(va, 4 * MiB + 1, 1, &f), 2); /* runs past its end */
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  assert_int_equal(gshm__map_access(va + 4 * MiB, 8, 1, &f), 0);
  assert_int_equal(gshm__map_access(va - 8, 16, 1, &f), 2); /* runs into it from below */
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  assert_int_equal(gshm__map_access(va - 8, 8, 1, &f), 0);
  assert_int_equal(gshm__map_device_add(&l, NULL, 0, &uuids, &n), 0); /* every device */
  assert_int_equal(gshm__map_access(va, 8, 0, &f), 1);
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  assert_int_equal(unmap_device(&l), 0);
  assert_int_equal(gshm__map_access(va, 8, 1, &f), 0);
  assert_int_equal(gshm__map_device(&r, NULL, 0, &uuids, &n), 0);
  assert_int_equal(gshm__map_access((uintptr_t)r.addr, 8, 0, &f), 1);
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_READ);
  assert_int_equal(unmap_device(&r), 0);
  assert_nothing_held();
}

/* A listed device with no peer path to the segment's GPU is -EXDEV, the
 * errno gshm_copy, gshm_signal and gshm_wait give for it (common/errors.h:
 * one errno per meaning); it was -ENODEV, which is the segment's GPU
 * missing here.  At the first map and when access is added; nothing is
 * held after either, and the mapping keeps its devices.  Devices NULL
 * leaves such a GPU out, no error. */
static void test_no_peer_path_is_exdev(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  unsigned long long f = 99;
  char **uuids;
  size_t n;
  int zero = 0, one = 1;
  (void)state;

  no_peer = true;
  assert_int_equal(gshm__map_device(&l, &zero, 1, &uuids, &n), -EXDEV);
  assert_null(l.device_map);
  assert_nothing_held();
  assert_int_equal(gshm__map_device(&l, &one, 1, &uuids, &n), 0);
  assert_int_equal(gshm__map_device_add(&l, &zero, 1, &uuids, &n), -EXDEV);
  assert_int_equal(gshm__map_access((uintptr_t)l.addr, 8, 0, &f), 1);
  assert_int_equal(f, CU_MEM_ACCESS_FLAGS_PROT_NONE); /* not given */
  assert_int_equal(unmap_device(&l), 0);
  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  assert_int_equal(n, 1); /* the segment's own GPU alone */
  assert_int_equal(unmap_device(&l), 0);
  no_peer = false;
  assert_nothing_held();
}

/* A mapping made before a fork is the parent's CUDA state, which a forked
 * child cannot use: there a read or write, or access for more devices, is
 * -ECHILD, and an unmap forgets the child's record of it without a driver
 * call (each went to the driver: undefined in a real child). */
static void test_parent_mapping_in_a_child(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  unsigned char buf[16] = {0};
  char **uuids;
  size_t n;
  pid_t pid;
  int status;
  (void)state;

  access_calls = 0;
  assert_int_equal(gshm__map_device(&l, (const int[]){1}, 1, &uuids, &n), 0);
  pid = fork();
  if (pid == 0) {
    int bad = 0;
    alarm(5);
    bad |= gshm__device_rw(&l, 0, buf, sizeof(buf), false) != -ECHILD;
    bad |= (gshm__device_rw(&l, 0, buf, sizeof(buf), true) != -ECHILD) << 1;
    bad |= (gshm__map_device_add(&l, NULL, 0, &uuids, &n) != -ECHILD) << 2;
    bad |= (unmap_device(&l) != 0 || l.device_map || l.addr) << 3;
    /* this process's copy of the fake driver's books: nothing undone */
    bad |= (mappings != 1 || reservations != 1 || handles != 1 || retained[1] != 1 ||
            access_calls != 1) << 4;
    _exit(bad);
  }
  assert_true(pid > 0);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(unmap_device(&l), 0); /* the parent's is whole */
  assert_nothing_held();
}

/* The last unmap of a device mapping waits for the work queued on it
 * first (cuCtxSynchronize of the contexts that may use it: NVIDIA does
 * not say that cuMemUnmap waits; PyTorch synchronizes before its own
 * unmaps), after the client's lock is let go; a wait a stream capture
 * refuses keeps the mapping for the next flush (as one a capture on a
 * blocking stream would refuse, asked first: the wait would invalidate
 * it), a context dead for good
 * (sticky error) lets it go; a client that goes with a wait still
 * refused leaves it mapped (-EIO, logged).  Before: cuMemUnmap at once,
 * under the lock, whatever was queued (f_unmap's assert). */
static void test_unmap_waits_for_queued_work(void **state) {
  struct gshm__lease l = lease_of(4 * MiB, GRAN, 1, GSHM_ACCESS_READ_WRITE);
  char **uuids;
  size_t n;
  (void)state;

  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  queued = true;
  ctx_syncs = 0;
  assert_int_equal(unmap_device(&l), 0);
  assert_true(ctx_syncs >= 1);
  assert_false(queued);
  assert_nothing_held();

  /* refused while a capture runs: kept, unmapped at the next flush */
  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  queued = true;
  sync_fails = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  assert_int_equal(unmap_device(&l), 0);
  assert_int_equal(mappings, 1);
  assert_non_null(client.retired);
  assert_null(l.device_map); /* the lease forgot it at once */
  sync_fails = CUDA_SUCCESS;
  assert_int_equal(unmap_device(&l), 0); /* (an unmapped lease: the flush only) */
  assert_null(client.retired);
  assert_nothing_held();

  /* a capture the legacy stream shows: no cuCtxSynchronize (it would
   * invalidate the capture), kept, unmapped at the next flush after it */
  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  queued = true;
  legacy_capture = true;
  ctx_syncs = 0;
  assert_int_equal(unmap_device(&l), 0);
  assert_int_equal(ctx_syncs, 0);
  assert_int_equal(mappings, 1);
  assert_non_null(client.retired);
  legacy_capture = false;
  assert_int_equal(unmap_device(&l), 0);
  assert_true(ctx_syncs >= 1);
  assert_null(client.retired);
  assert_nothing_held();

  /* a sticky error: the context runs nothing more, the range goes */
  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  queued = true;
  sync_fails = CUDA_ERROR_ILLEGAL_ADDRESS;
  assert_int_equal(unmap_device(&l), 0);
  sync_fails = CUDA_SUCCESS;
  assert_nothing_held();

  /* the client going, a wait still refused: left mapped, -EIO */
  assert_int_equal(gshm__map_device(&l, NULL, 0, &uuids, &n), 0);
  queued = true;
  sync_fails = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  assert_int_equal(gshm__unmap_device(&l), 0);
  assert_int_equal(gshm__retire_device_maps(&client, client.retired, true), -EIO);
  client.retired = NULL;
  assert_int_equal(mappings, 1);
  sync_fails = CUDA_SUCCESS;
  queued = false;
  /* (the fake driver's books, as if the process ended) */
  mappings = reservations = handles = 0;
  for (int d = 0; d < NDEV; d++)
    retained[d] = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_under_the_lock),                   /* first */
      cmocka_unit_test(test_fork_while_another_thread_reads_gpus), /* second */
      cmocka_unit_test(test_failed_device_list_is_retried),         /* third */
      cmocka_unit_test(test_hostile_replies_are_eproto),
      cmocka_unit_test(test_size_past_the_allocation),
      cmocka_unit_test(test_every_failure_unwinds),
      cmocka_unit_test(test_read_only_everywhere),
      cmocka_unit_test(test_write_is_done_when_it_returns),
      cmocka_unit_test(test_parent_mapping_in_a_child),
      cmocka_unit_test(test_mapping_makes_no_context),
      cmocka_unit_test(test_map_access_per_device),
      cmocka_unit_test(test_copy_after_a_context_reset),
      cmocka_unit_test(test_unmap_waits_for_queued_work),
      cmocka_unit_test(test_no_peer_path_is_exdev), /* last: no_peer stays set if it fails */
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
