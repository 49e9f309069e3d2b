# SPDX-License-Identifier: Apache-2.0
"""gshm.torch.MemPool and use_pool from several threads, without a GPU or
torch: gshm._torch_pool is loaded against a stand-in torch module, with a
real gshmd and a real Client, and libgshm's pool calls replaced by a model
of the C pool that records any call on a pool gshm_pool_release has freed
(in C: a destroyed mutex locked, closed segments read, the primary
context released twice).  Each race is made certain by holding one
thread inside a C call until the other has had its chance to overtake.
The real pool on a GPU: tests/test_torch_pool_gpu.py."""

import contextlib
import errno
import gc
import importlib.util
import os
import signal
import sys
import threading
import types
import warnings
import weakref

import pytest

import gshm

WAIT = 1.0  # seconds a thread is given to overtake another (it must not)
PREV = 0x7e57  # the pool gshm_pool_activate says was active before


def _standin_torch():
    torch = types.ModuleType("torch")
    torch.__version__ = "0+standin"

    class OutOfMemoryError(RuntimeError):
        pass

    class MemPool(object):
        def __init__(self, allocator):
            self.allocator = allocator

        def snapshot(self):
            return []

    class CUDAPluggableAllocator(object):
        def __init__(self, path, malloc, free):
            pass

        def allocator(self):
            return object()

    @contextlib.contextmanager
    def nothing(*args, **kw):
        yield

    torch.OutOfMemoryError = OutOfMemoryError
    torch.Tensor = type("Tensor", (), {})
    torch.nn = types.SimpleNamespace(Module=type("Module", (), {}))
    torch.cuda = types.SimpleNamespace(
        MemPool=MemPool, use_mem_pool=nothing, device=nothing, OutOfMemoryError=OutOfMemoryError,
        synchronize=lambda device=None: None, current_device=lambda: 0,
        is_initialized=lambda: False,
        memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator))
    return torch


class CPool(object):
    """libgshm's pool calls as the Python side sees them.  hold[name], when
    set, runs inside that call (one thread waits there)."""

    def __init__(self):
        self.freed = set()
        self.calls = []
        self.misuse = []
        self.hold = {}
        self.next = 0x10000
        self.unlinks = []
        self.pid = os.getpid()
        self.live_blocks = {}  # pool -> whether blocks of it are live (EBUSY)

    def fn(self, name):
        return getattr(self, name[len("gshm_"):])

    def _enter(self, name, ptr):
        self.calls.append((name, ptr))
        if ptr in self.freed:
            self.misuse.append("%s on a pool gshm_pool_release freed" % name)
        hook = self.hold.pop(name, None)
        if hook is not None:
            hook()
        if ptr in self.freed and name != "gshm_pool_release":
            self.misuse.append("%s: the pool was freed during the call" % name)

    def pool_create(self, client, cfg, out):
        self.next += 0x1000
        out._obj.value = self.next
        return 0

    def pool_release(self, ptr, unlink):
        if os.getpid() != self.pid:
            return -errno.ECHILD  # the pool is the parent's (the C pool checks first)
        self._enter("gshm_pool_release", ptr)
        self.unlinks.append(unlink)
        if ptr in self.live_blocks and self.live_blocks[ptr]():
            return -errno.EBUSY  # nothing freed: the pool stays, released
        self.freed.add(ptr)
        return 0

    def pool_segments(self, ptr, arr, n):
        if os.getpid() != self.pid:
            return -errno.ECHILD
        self._enter("gshm_pool_segments", ptr)
        n._obj.value = 0
        return 0

    def pool_activate(self, ptr):
        if ptr == PREV:
            return None  # use_pool's exit restoring the thread's earlier pool
        if ptr is None:
            self.misuse.append("gshm_pool_activate(NULL) for a pool: none is active, and "
                               "gshm_torch_malloc takes the process's only other pool")
        else:
            self._enter("gshm_pool_activate", ptr)
        return PREV

    def torch_last_error(self):
        return -errno.ENOMEM


@pytest.fixture
def tp(monkeypatch):
    """(gshm._torch_pool over the stand-in torch, its CPool)."""
    monkeypatch.setitem(sys.modules, "torch", _standin_torch())
    path = os.path.join(os.path.dirname(gshm.__file__), "_torch_pool.py")
    spec = importlib.util.spec_from_file_location("gshm._torch_pool_standin", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not in sys.modules: the real one stays as it was
    c = CPool()
    monkeypatch.setattr(mod, "_fn", c.fn)
    return mod, c


def _thread(target, *args):
    box = {}

    def run():
        try:
            box["result"] = target(*args)
        except BaseException as e:  # noqa: B902  (reported by the test)
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_release_waits_for_segments(tp, client, segname):
    """segments() checked that the pool was not freed, then called
    gshm_pool_segments without a lock: a release() on another thread in
    between freed the pool under the call.  Now release() waits for it."""
    mod, c = tp
    pool = mod.MemPool(client, segname)
    overtaken = threading.Event()
    box = {}

    def inside_segments():
        box["t"], box["box"] = _thread(pool.release)
        overtaken.wait(WAIT)  # set if the release reached C meanwhile

    c.hold["gshm_pool_release"] = overtaken.set
    c.hold["gshm_pool_segments"] = inside_segments
    assert pool.segments() == []
    box["t"].join(10)
    assert not box["t"].is_alive() and "error" not in box["box"], box
    assert c.misuse == []
    assert [n for n, _ in c.calls] == ["gshm_pool_segments", "gshm_pool_release"]
    assert pool.released and pool.segments() == []
    assert pool._client_handle.refs == 1  # the client's own: the pool's went once


def test_two_releases_free_once(tp, client, segname):
    """Two threads calling release() at once both found released False and
    both called gshm_pool_release (the second on a freed pool) and dropped
    the pool's reference on the client twice (disconnecting it under the
    client's other users).  The check and the set are two bytecodes apart:
    `released` is made a property here that keeps each of the first two
    readers until the other has read too (a second at most)."""
    mod, c = tp
    both_read = threading.Barrier(2, timeout=WAIT)

    class Racy(mod.MemPool):
        @property
        def released(self):
            v = self.__dict__.get("released", False)
            if self.__dict__.get("racing"):
                with contextlib.suppress(threading.BrokenBarrierError):
                    both_read.wait()
            return v

        @released.setter
        def released(self, v):
            self.__dict__["released"] = v

    pool = Racy(client, segname)
    pool.__dict__["racing"] = True
    threads = [_thread(pool.release) for _ in range(2)]
    for t, box in threads:
        t.join(10)
        assert not t.is_alive() and "error" not in box, box
    pool.__dict__["racing"] = False
    assert c.misuse == []
    assert [n for n, _ in c.calls] == ["gshm_pool_release"]
    assert client._h.refs == 1 and not client.closed
    assert client.exists(segname + "/x") is False  # the connection still works


def test_use_pool_activates_no_freed_pool(tp, client, segname):
    """use_pool's __enter__ checked that the pool was usable, then activated
    pool._ptr: a release() on another thread in between made that NULL
    (the thread then allocated from whichever other pool the process had)
    or a freed pool.  Now the release waits for the activation; the
    allocations after it fail with EBADF, as gshm_pool_activate says."""
    mod, c = tp
    pool = mod.MemPool(client, segname)
    overtaken = threading.Event()
    c.hold["gshm_pool_release"] = overtaken.set
    box = {}

    @contextlib.contextmanager
    def use_mem_pool(torch_pool, device=None):
        yield

    def between(torch_pool, device=None):  # what __enter__ does between check and activation
        box["t"], box["box"] = _thread(pool.release)
        overtaken.wait(WAIT)
        return use_mem_pool(torch_pool, device)

    mod._torch.cuda.use_mem_pool = between
    with mod.use_pool(pool):
        pass
    box["t"].join(10)
    assert not box["t"].is_alive() and "error" not in box["box"], box
    assert c.misuse == []
    assert [n for n, _ in c.calls] == ["gshm_pool_activate", "gshm_pool_release"]


def test_use_pool_exit_keeps_the_client_for_its_error(tp, client, segname, monkeypatch):
    """use_pool's __exit__, turning PyTorch's out-of-memory error into
    gshm's with the daemon's explanation, passed client._ptr() to
    gshm_last_error outside client._use(): a release() of the pool and a
    close() of the client on another thread meanwhile disconnected the C
    client under the call.  Now the call holds the client (its error is
    still the gshm error, with the explanation)."""
    mod, c = tp
    from gshm import _lib as L
    pool = mod.MemPool(client, segname)
    real = L.lib().gshm_last_error
    racing = threading.Event()
    seen = []

    def last_error(ptr):
        if racing.is_set():  # the release's own (its unlink of the manifest: NotFound)
            return real(ptr)
        racing.set()
        t, box = _thread(lambda: (pool.release(), client.close()))
        t.join(10)
        assert not t.is_alive() and "error" not in box, box
        if client._h.ptr is None:  # gshm_disconnect ran: do not touch ptr
            seen.append("gshm_last_error on a disconnected client")
            return None
        seen.append("alive")
        return real(ptr)

    monkeypatch.setattr(L.lib(), "gshm_last_error", last_error)
    with pytest.raises(gshm.Error) as e:
        with mod.use_pool(pool):
            raise mod._torch.OutOfMemoryError("stand-in")
    assert e.value.errno == errno.ENOMEM and "gshm_torch_malloc" in str(e.value)
    assert seen == ["alive"]
    assert client.closed and client._h.ptr is None  # disconnected once the error was made
    assert c.misuse == []


class _Tensor(object):
    """A stand-in tensor at `address` on cuda:0 (what _locate reads)."""

    def __init__(self, address):
        self.address = address
        self.device = types.SimpleNamespace(type="cuda", index=0)
        self.dtype = "torch.float32"
        self.shape = (4,)

    def data_ptr(self):
        return self.address

    def stride(self):
        return (1,)


@pytest.fixture
def one_segment(tp, monkeypatch):
    """gshm_pool_segments lists one segment at 0x100000 (1 MiB); stand-in
    tensors for publish(); the GPU's UUID made up."""
    mod, c = tp
    from gshm import _lib as L
    seg = L.PoolSegmentC()
    seg.size, seg.address, seg.id, seg.generation = 1 << 20, 0x100000, 1, 1

    def pool_segments(ptr, arr, n):
        c._enter("gshm_pool_segments", ptr)
        seg.name = mod._enc(c.prefix + "/seg-000000")
        arr._obj.contents = seg
        n._obj.value = 1
        return 0

    c.pool_segments = pool_segments
    monkeypatch.setattr(L.lib(), "gshm_free", lambda p: None)  # seg is Python's
    monkeypatch.setattr(mod._cuda, "device_uuid", lambda device: "GPU-standin")
    mod._torch.Tensor = _Tensor
    return mod, c


def test_publish_and_release_are_serialized(one_segment, client, segname):
    """publish() checked that the pool was not released, then ran without
    the pool's lock: a release() on another thread in between left it
    without segments, and it raised ValueError "was not allocated in pool
    ...: build it inside use_pool" for a tensor that was (or, overtaken
    after listing them, wrote a manifest of unlinked segments after the
    release had removed the old one).  Now the release waits for the
    publish, and then removes its manifest."""
    mod, c = one_segment
    c.prefix = segname
    pool = mod.MemPool(client, segname)
    overtaken = threading.Event()
    c.hold["gshm_pool_release"] = overtaken.set
    box = {}

    def synchronize(device=None):  # publish's first step after its check
        box["t"], box["box"] = _thread(pool.release)
        overtaken.wait(WAIT)

    mod._torch.cuda.synchronize = synchronize
    name = pool.publish({"w": _Tensor(0x100000 + 4096)})
    assert name == segname + "/manifest"
    mod._torch.cuda.synchronize = lambda device=None: None
    box["t"].join(10)
    assert not box["t"].is_alive() and "error" not in box["box"], box
    assert c.misuse == []
    assert [n for n, _ in c.calls] == ["gshm_pool_segments", "gshm_pool_release"]
    assert not client.exists(name)  # the release came after, and removed it
    with pytest.raises(ValueError, match="was released"):
        pool.publish({"w": _Tensor(0x100000)})


def _busy_pool(mod, c, client, name, unlink=True):
    """A pool released while a tensor of it is alive (c.live[0]): its
    release warned, gshm_pool_release said EBUSY.  Returns (pool, a weak
    reference to its torch pool).  Blocks are live in C while a tensor is
    alive, and while the torch pool caches them (until it is destroyed)."""
    pool = mod.MemPool(client, name)
    tpool = weakref.ref(pool._torch_pool)
    live = c.live = [True]
    c.live_blocks[pool._ptr] = lambda: live[0] or tpool() is not None
    pool._torch_pool.snapshot = lambda: [{"blocks": [{"state": "active_allocated"}]}
                                         if live[0] else {"blocks": [{"state": "inactive"}]}]
    with pytest.warns(RuntimeWarning, match="alive"):
        pool.release(unlink)
    assert pool.released and tpool() is not None
    return pool, tpool


def test_release_again_after_busy(tp, client, segname):
    """A release() while tensors of the pool were alive (EBUSY) set
    released, and a later release(), once they were gone, returned at once:
    the torch pool kept their blocks cached (their segments mapped, the GPU
    memory held) and the C pool and its reference on the client stayed
    until the process ended.  Now a later release() does what the first
    could not: the cached blocks go back, the pool is freed, once."""
    mod, c = tp
    pool, tpool = _busy_pool(mod, c, client, segname, unlink=False)
    assert pool._client_handle.refs == 2 and c.freed == set()
    c.live[0] = False  # the tensors went; their blocks stay in the torch pool's cache
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.release()  # unlink=True now: the names go too
    assert tpool() is None
    assert c.freed == {pool_ptr for _, pool_ptr in c.calls}
    assert pool._ptr is None and client._h.refs == 1
    assert c.unlinks == [0, 1, 1]  # busy; busy (the cache); freed
    n = len(c.calls)
    pool.release()
    assert len(c.calls) == n and c.misuse == []


def test_busy_pool_released_when_collected(tp, client, segname):
    """A pool released while its tensors were alive, then dropped once they
    were gone: its finalizer makes no device call (it may run in the middle
    of another thread's graph capture, which a synchronize breaks) and
    leaves it to the next MemPool(), which frees what the release could
    not."""
    mod, c = tp
    pool, tpool = _busy_pool(mod, c, client, segname)
    c.live[0] = False
    n, synced = len(c.calls), []
    mod._torch.cuda.synchronize = lambda device=None: synced.append(device)
    try:
        del pool
        gc.collect()
        assert c.calls[n:] == [] and synced == [] and c.freed == set()
        assert tpool() is not None
        mod.MemPool(client, segname + "/2")
    finally:
        mod._torch.cuda.synchronize = lambda device=None: None
    assert tpool() is None and len(c.freed) == 1 and synced
    assert c.misuse == []


def test_busy_pool_dropped_while_busy_is_retried(tp, client, segname):
    """A pool released and dropped while its tensors were alive is kept and
    freed by a later release() of another pool once they are gone; it is
    not retried after that."""
    mod, c = tp
    pool, tpool = _busy_pool(mod, c, client, segname)
    ptr = pool._ptr
    del pool
    gc.collect()
    assert tpool() is not None and c.freed == set() and client._h.refs == 2
    c.live[0] = False
    other = mod.MemPool(client, segname + "/2")
    other_ptr = other._ptr
    other.release()
    assert tpool() is None and c.freed == {ptr, other_ptr}
    assert client._h.refs == 1
    n = len(c.calls)
    mod.MemPool(client, segname + "/3").release()
    assert [p for _, p in c.calls[n:]].count(ptr) == 0 and c.misuse == []


def _in_child(fn):
    """Runs fn() in a forked child (killed after 5 s: a hang); returns its
    exit status (fn's int, 99 for an exception it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            signal.alarm(5)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*:DeprecationWarning")
def test_release_in_forked_child_is_forked_child(tp, client, segname):
    """A forked child's release() of its parent's pool ran the whole
    release on the parent's objects and, gshm_pool_release refusing it
    (ECHILD), warned that tensors of the pool were alive; a child forked
    while another thread held the pool's lock (a release or a publish
    under way) hung in it for ever.  Now release(), publish(), segments()
    and use_pool raise gshm.ForkedChild at once in the child, which leaves
    the pool (and its lock) alone; the parent's pool goes on."""
    mod, c = tp
    pool = mod.MemPool(client, segname)

    def child():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for call in (lambda: pool.release(unlink=False), pool.segments,
                         lambda: pool.publish({}), lambda: mod.use_pool(pool).__enter__()):
                try:
                    call()
                    return 2
                except gshm.ForkedChild as e:
                    if "forked" not in str(e) or e.errno != errno.ECHILD:
                        return 3
        return 0

    assert _in_child(child) == 0
    held, done = threading.Event(), threading.Event()

    def holder():
        with pool._lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    try:
        status = _in_child(child)
    finally:
        done.set()
        t.join(10)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert not pool.released
    pool.release()
    assert [n for n, _ in c.calls] == ["gshm_pool_release"] and c.misuse == []
    assert pool._ptr is None and client._h.refs == 1


def _dropped_busy_pool(mod, c, client, name):
    """A busy pool (_busy_pool) dropped and collected, kept in _busy; then
    its tensors go.  Returns (its C pointer, a weak reference to its torch
    pool)."""
    pool, tpool = _busy_pool(mod, c, client, name)
    ptr = pool._ptr
    del pool
    gc.collect()
    assert len(mod._busy) == 1
    c.live[0] = False
    return ptr, tpool


def test_busy_pool_retry_error_stays_its_own(tp, client, segname):
    """The retry of a pool dropped while busy runs inside other pools'
    MemPool() and release(): an error of its (a sticky CUDA error in its
    synchronize) must not fail them, as if theirs; it is tried again
    later."""
    mod, c = tp
    ptr, tpool = _dropped_busy_pool(mod, c, client, segname)

    def broken(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    mod._torch.cuda.synchronize = broken
    other = mod.MemPool(client, segname + "/2")
    mod._torch.cuda.synchronize = lambda device=None: None
    assert c.freed == set() and len(mod._busy) == 1
    other.release()
    assert tpool() is None and ptr in c.freed and mod._busy == []
    assert client._h.refs == 1 and c.misuse == []


def test_busy_pool_not_retried_during_a_capture(tp, client, segname):
    """A pool dropped while busy is not retried inside a MemPool() made
    while this thread captures a CUDA graph: the retry's synchronize
    breaks the capture (its finalizer already waits so; the retry ran
    it).  It is retried by the first call after the capture."""
    mod, c = tp
    ptr, tpool = _dropped_busy_pool(mod, c, client, segname)
    capturing, synced = [True], []
    mod._torch.cuda.is_initialized = lambda: True
    mod._torch.cuda.is_current_stream_capturing = lambda: capturing[0]
    mod._torch.cuda.synchronize = lambda device=None: synced.append(capturing[0])
    other = mod.MemPool(client, segname + "/2")
    assert synced == [] and c.freed == set() and len(mod._busy) == 1
    capturing[0] = False
    other.release()
    assert True not in synced and tpool() is None and ptr in c.freed and mod._busy == []
    assert client._h.refs == 1 and c.misuse == []


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*:DeprecationWarning")
def test_busy_pool_finalized_while_another_thread_forks(tp, daemon, segname):
    """A busy pool's finalizer runs at any allocation, on a thread that may
    hold one of the package's fork-guarded locks (gshm._core's, here).  It
    took _busy_lock, also fork-guarded and taken by a fork before the
    others: a fork on another thread then held _busy_lock and waited for
    the finalizer's thread's lock, which waited for _busy_lock, for ever.
    Now the finalizer keeps the pool without a lock and the fork goes on.
    (In a child of the test, killed after 5 s: a hang.)"""
    mod, c = tp
    from gshm import _core

    def child():
        c.pid = os.getpid()  # (the C pool stand-in answers this process)
        cl = gshm.Client(daemon.socket, name="fork-finalizer")
        box = {"pool": _busy_pool(mod, c, cl, segname)[0]}
        forking = threading.Event()
        os.register_at_fork(before=forking.set)  # (runs first: registered last)

        def finalizing_thread():
            with _core._state_lock:
                forking.wait(5)
                threading.Event().wait(0.2)  # (the fork gets to _core._state_lock meanwhile)
                del box["pool"]  # the finalizer: released, busy, so kept in _busy
        t = threading.Thread(target=finalizing_thread)
        t.start()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        t.join(5)
        return 0 if status == 0 and not t.is_alive() and len(mod._busy) == 1 else 2

    status = _in_child(child)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
