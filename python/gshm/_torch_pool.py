# SPDX-License-Identifier: Apache-2.0
"""gshm as PyTorch's allocator: MemPool, use_pool, publish, attach.

    pool = gshm.torch.MemPool(client, "llama", device=0)        # persistent
    with gshm.torch.use_pool(pool):
        model = build_model().cuda()          # every parameter lives in gshmd's segments
    pool.publish(model)                       # "llama/manifest"

    # a later process (the engine restarted, or crashed: SIGKILL included)
    sd = gshm.torch.attach(client, "llama", device=0)
    model.load_state_dict(sd, assign=True)    # zero copy

The C allocator is libgshm's gshm_torch_malloc / gshm_torch_free behind
torch.cuda.memory.CUDAPluggableAllocator and a torch.cuda.MemPool: no
Python on the allocation path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import os
import sys
import threading
import warnings
from typing import Any, List, Mapping, Optional, Union

import torch as _torch

from . import _cuda, _manifest
from ._segment import map_for_writers
from . import _lib as L
from ._core import _PutOffLock, _capturing, _enc, _putting_off, _raise, _strerror
from ._dtypes import dtype as _to_dtype
from ._errors import error_for
from ._torch_conf import check_alloc_conf as _check_alloc_conf
from ._torch_state import StateDict
from ._client import Client, _check_new_mode

__all__ = ["MemPool", "use_pool", "attach", "load_module", "unlink_prefix"]

_lock = threading.Lock()
_allocator = None
# Pools garbage collected while tensors of theirs were alive, after a
# release() that found them so (EBUSY): kept here and released again by
# every later MemPool() and release() outside a CUDA graph capture
# (_retry_busy), so that their memory goes back once the tensors have
# gone.  No lock: a pool's finalizer
# (MemPool.__del__, which appends) runs at any allocation, on a thread
# that may hold one of the package's fork-guarded locks, and a fork takes
# a lock guarded so after it (the fork waited for the finalizer, which
# waited for the fork's lock: a deadlock); its append, copy (list()) and
# remove are each one step under the GIL (MemPool has no __eq__).
_busy: List["MemPool"] = []


def _retry_busy() -> None:
    """Releases again each pool of _busy (under its own lock, with the
    unlink its release asked for); drops those that are freed now.  Its
    errors are the busy pools' (a sticky CUDA error in their synchronize),
    not the caller's: they are left for the next retry.  Not while this
    thread captures a CUDA graph (their synchronize would break it): the
    next call after the capture does it."""
    if _capturing():
        return
    pools = list(_busy)
    for p in pools:
        if p._pid != os.getpid():
            continue  # a forked child's copy: the parent's to release (its lock may be held)
        try:
            # (wait=False: a retry under way on another thread is left to
            # it, which may be waiting for a request whose callback is here)
            p._release(p._unlinks, warn=False, wait=False)
        except Exception:
            pass
        if p._ptr is None:  # freed
            with contextlib.suppress(ValueError):  # (another thread's retry took it)
                _busy.remove(p)


# A torch.cuda.MemPool over gshm is never destroyed while a tensor from it
# may be alive: PyTorch frees a tensor that outlives its MemPool with
# cudaFree (pytorch #146431), which our memory must never see.  So each one
# gets an extra reference that only MemPool.release() drops, once PyTorch's
# own snapshot says no block of the pool is in use; otherwise the pool lives
# until the process ends (and its memory with the process's leases).
def _immortal(obj):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _mortal(obj):
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(obj))


def _pluggable():
    """The one CUDAPluggableAllocator over libgshm, kept for the process's
    life (PyTorch holds only a raw pointer to it in its pools)."""
    global _allocator
    with _lock:
        if _allocator is None:
            _allocator = _torch.cuda.memory.CUDAPluggableAllocator(
                L.library_path(), "gshm_torch_malloc", "gshm_torch_free")
        return _allocator


def _fn(name):
    fn = L.optional_symbol(name)
    if fn is None:
        raise NotImplementedError("gshm: %s does not export %s (libgshm older than the "
                                  "PyTorch pool)" % (L.library_path(), name))
    return fn


def _ordinal(device):
    if isinstance(device, bool):
        raise TypeError("gshm: device must be an int, 'cuda:N' or a torch.device")
    if isinstance(device, int):
        return device
    d = _torch.device(device)
    if d.type != "cuda":
        raise ValueError("gshm: a pool lives on a CUDA device, not %s" % d)
    return d.index if d.index is not None else _torch.cuda.current_device()


class PoolSegment(object):
    """One segment of a pool: name, id, generation, size, address, live_bytes,
    live_blocks (gshm_pool_segment_t)."""

    __slots__ = ("name", "id", "generation", "size", "address", "live_bytes", "live_blocks")

    def __init__(self, c: Any) -> None:
        self.name = c.name.decode("utf-8", "surrogateescape")
        self.id, self.generation, self.size = c.id, c.generation, c.size
        self.address, self.live_bytes, self.live_blocks = c.address, c.live_bytes, c.live_blocks

    def __repr__(self) -> str:
        return "<PoolSegment %s %d bytes at 0x%x, %d live>" % (self.name, self.size,
                                                               self.address, self.live_bytes)


class MemPool(object):
    """A pool of gshm device segments that PyTorch allocates from.

    client      the gshm.Client whose user owns the segments; it must stay
                open while the pool is used (a closed client is refused).
    prefix      segment names are "<prefix>/seg-NNNNNN" (in order; a name
                another user took first is passed over for one drawn at
                random: gshm.Exists after 32 in a row); publish() writes
                "<prefix>/manifest".
    device      this process's CUDA ordinal (int, "cuda:N", torch.device).
    persistent  True: the segments keep their names and memory after this
                process ends (SIGKILL included) until release() or
                unlink_prefix / `gshmctl unlink`; False: they have no names
                and go with the process.
    mode        permission bits of the segments and the manifest.
    granule     bytes per arena segment (multiple of 2 MiB; None or 0: 256 MiB;
                ValueError when negative).
    segment_per_alloc  one segment per PyTorch block instead of arenas (for
                measuring; slower).

    Raises RuntimeError when expandable_segments is asked for, gshm.NoDevice
    for an unknown device, gshm.Exists when a persistent prefix still holds
    a pool of this user that was not released, gshm.NotSupported without a CUDA driver,
    ValueError for a bad prefix or granule, or a closed client."""

    def __init__(self, client: Client, prefix: str, device: Any = 0, persistent: bool = True,
                 mode: int = 0o600, granule: Optional[int] = None,
                 segment_per_alloc: bool = False) -> None:
        # gshm_pool_release frees the pool (its lock destroyed, its
        # segments closed), so a call on it that another thread's release
        # overtook, or a second release, was a use after free: a release
        # waits for the calls on the C pool in flight (_users: segments(),
        # publish(), use_pool's activation) and a call waits for no
        # release (segments() answers [] during one, publish and use_pool
        # refuse a released pool).  _lock guards that state and is held
        # only to read and change it, never across a libgshm call: those
        # wait for the client's lock (release's closes and unlinks,
        # publish's manifest; segments and activation wait only briefly
        # for the C pool's lock, which libgshm holds across no request),
        # which another thread's
        # request holds (a pull: minutes), and that request's progress
        # callback asking the pool for its segments waited for _lock: both
        # hung for ever.  A _PutOffLock: a segment that a finalizer run
        # under it drops is closed once it is let go, not under it.
        self._lock = _PutOffLock()
        self._users = 0  # calls on the C pool in flight (segments, publish, activation)
        self._releasing = False  # a release() (or retry) is making its calls
        self._pid = os.getpid()
        _check_alloc_conf(os.environ)
        if granule is not None and not 0 <= int(granule) < 1 << 64:
            # ctypes would wrap it into a uint64_t: -2 MiB as 2^64 - 2 MiB
            raise ValueError("gshm: granule must be a byte count from 0 (the default) to 2^64 - 1, "
                             "a multiple of 2 MiB; not %r" % (granule,))
        if not hasattr(_torch.cuda, "MemPool") or not hasattr(_torch.cuda, "use_mem_pool"):
            raise NotImplementedError("gshm: MemPool needs torch.cuda.MemPool and use_mem_pool "
                                      "(PyTorch 2.6 or later); this is torch %s"
                                      % _torch.__version__)
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("gshm: prefix must be a non-empty str")
        _check_new_mode(mode, "gshm_pool_create", prefix)  # (0 gave 0600, as create's did)
        _retry_busy()  # (memory a dropped pool kept may be needed now)
        self.client = client
        self.prefix = prefix
        self.device = _ordinal(device)
        self.persistent = bool(persistent)
        self.mode = mode
        cfg = L.PoolConfigC()
        cfg.prefix = _enc(prefix)
        cfg.device = self.device
        cfg.mode = int(mode)
        cfg.flags = (L.GSHM_POOL_PERSISTENT if persistent else 0) | (
            L.GSHM_POOL_SEGMENT_PER_ALLOC if segment_per_alloc else 0)
        cfg.granule = int(granule or 0)
        out = ctypes.c_void_p()
        # client._use() raises for a closed client, and keeps the C client
        # alive against a close() on another thread until the pool holds it.
        with client._use() as cp:
            rc = _fn("gshm_pool_create")(cp, ctypes.byref(cfg), ctypes.byref(out))
            if rc < 0:
                _raise(rc, "gshm_pool_create", cp, prefix)
            self._ptr = out.value
            # The pool's segments are opened through the client: hold its C
            # connection for as long as the pool can be asked for memory.
            self._client_handle = client._h
            self._client_handle.incref()
        try:
            # A torch.cuda.MemPool belongs to the device current when it is
            # built (PyTorch >= 2.8 keeps current_device() in the pool); built
            # on another device, use_mem_pool(device=self.device) would never
            # route this device's allocations to gshm.
            with _torch.cuda.device(self.device):
                self._torch_pool = _torch.cuda.MemPool(_pluggable().allocator())
            _immortal(self._torch_pool)
        except BaseException:
            _fn("gshm_pool_release")(self._ptr, 1)
            self._client_handle.decref()
            raise
        self._unlinks = False  # a release asked to unlink (kept for its retries)
        self.released = False

    def __repr__(self) -> str:
        return "<gshm.torch.MemPool %r cuda:%d%s%s>" % (
            self.prefix, self.device, " persistent" if self.persistent else "",
            " released" if self.released else "")

    def _check_not_forked(self, function):
        # Before self._lock: a fork while another thread held it (a release
        # or a publish under way) left it held for ever in the child.
        if self._pid != os.getpid():
            raise error_for(-errno.ECHILD, function=function, filename=self.prefix,
                            description=_strerror(-errno.ECHILD),
                            message="the pool is process %d's, which this one was forked "
                            "from: that process uses and releases it" % self._pid)

    def _check_usable(self):
        if self.released:
            raise ValueError("gshm: pool %r was released" % self.prefix)
        if self.client.closed:
            raise ValueError("gshm: pool %r: its client is closed" % self.prefix)

    @property
    def torch_pool(self) -> Any:
        """The torch.cuda.MemPool under this pool."""
        return self._torch_pool

    def segments(self) -> List[PoolSegment]:
        """[PoolSegment] in creation order; [] once the pool was freed, and
        while a release() runs (its calls may wait for this thread's
        request: a pull whose progress callback this is)."""
        self._check_not_forked("gshm_pool_segments")
        with self._lock:
            if self._ptr is None or self._releasing:
                return []
            self._users += 1  # a release() on another thread waits for the call
            ptr = self._ptr
        try:
            return self._list(ptr)
        finally:
            self._let_go()

    def _let_go(self):
        """Ends one of _users' calls; a release waiting for the last goes on."""
        with self._lock:
            self._users -= 1
            if not self._users:
                self._lock.notify_all()

    def _list(self, ptr):
        """segments() of C pool ptr, which the caller keeps from being freed
        (one of _users)."""
        arr = ctypes.POINTER(L.PoolSegmentC)()
        n = ctypes.c_size_t(0)
        rc = _fn("gshm_pool_segments")(ptr, ctypes.byref(arr), ctypes.byref(n))
        if rc < 0:
            _raise(rc, "gshm_pool_segments", None, self.prefix)
        try:
            return [PoolSegment(arr[i]) for i in range(n.value)]
        finally:
            L.lib().gshm_free(arr)

    def _locate(self, segs, t, what):
        if not isinstance(t, _torch.Tensor):
            raise TypeError("gshm: %s is a %s, not a tensor" % (what, type(t).__name__))
        if t.device.type != "cuda" or t.device.index != self.device:
            raise ValueError("gshm: %s is on %s, not in pool %r (cuda:%d): build it inside "
                             "gshm.torch.use_pool(pool)" % (what, t.device, self.prefix,
                                                            self.device))
        dt = _to_dtype(str(t.dtype).replace("torch.", ""))
        addr = t.data_ptr()
        for s in segs:
            if s.address <= addr < s.address + s.size:
                return {"segment": s.name, "offset": addr - s.address, "dtype": dt.name,
                        "shape": list(t.shape), "strides": list(t.stride())}
        raise ValueError("gshm: %s (at 0x%x) was not allocated in pool %r: build it inside "
                         "gshm.torch.use_pool(pool)" % (what, addr, self.prefix))

    def publish(self, module_or_state_dict: Union[_torch.nn.Module, Mapping[str, _torch.Tensor]],
                metadata: Optional[Mapping[str, Any]] = None) -> str:
        """Writes "<prefix>/manifest": for every tensor of the state dict (of
        a torch.nn.Module: its state_dict(), plus its non-persistent buffers)
        the segment, byte offset, dtype, shape and strides.  metadata: str ->
        str, returned by attach() as .metadata.  The device is synchronised
        first, so the bytes are in place.  Returns the manifest's name.
        An earlier manifest is replaced atomically: an attach() meanwhile
        reads the old one or the new one (gshm._manifest.write; not so
        with a gshmd or libgshm older than hidden segments).
        Raises ValueError for a tensor that is not in this pool, for a
        non-persistent pool (its segments have no names to attach by), or
        for a released pool (or one whose client is closed).

        A release() on another thread waits for the publish to finish (and
        then removes the manifest it wrote); the pool's lock is not held
        meanwhile (the manifest's requests may wait for another thread's
        request on the client, whose progress callback may call the pool).
        Raises gshm.ForkedChild in a process forked from the pool's."""
        self._check_not_forked("MemPool.publish")
        with self._lock:
            self._check_usable()
            if not self.persistent:
                raise ValueError("gshm: pool %r is not persistent: its segments have no names "
                                 "another process could attach" % self.prefix)
            # One of _users until the manifest is written: a release() between
            # the check and the listing left no segments (every tensor "not
            # allocated in pool"), and one between the listing and the write
            # left a manifest of unlinked segments behind.
            self._users += 1
            ptr = self._ptr
        try:
            return self._publish(ptr, module_or_state_dict, metadata)
        finally:
            self._let_go()

    def _publish(self, ptr, module_or_state_dict, metadata):
        buffers = {}
        if isinstance(module_or_state_dict, _torch.nn.Module):
            m = module_or_state_dict
            sd = m.state_dict(keep_vars=False)
            for mod_name, mod in m.named_modules():
                for b in getattr(mod, "_non_persistent_buffers_set", ()):
                    t = mod._buffers.get(b)
                    if t is not None:
                        buffers[(mod_name + "." if mod_name else "") + b] = t
        else:
            sd = module_or_state_dict
        _torch.cuda.synchronize(self.device)
        segs = self._list(ptr)
        tensors = {k: self._locate(segs, v, "state_dict[%r]" % k) for k, v in sd.items()}
        bufs = {k: self._locate(segs, v, "buffer %r" % k) for k, v in buffers.items()}
        used = {e["segment"] for e in list(tensors.values()) + list(bufs.values())}
        seginfo = {s.name: {"id": s.id, "generation": s.generation, "size": s.size}
                   for s in segs if s.name in used}
        data = _manifest.encode("cuda:" + _cuda.device_uuid(self.device), seginfo, tensors,
                                bufs, metadata)
        _manifest.write(self.client, self.prefix, data, self.mode)
        return _manifest.manifest_name(self.prefix)

    def release(self, unlink: bool = True) -> None:
        """Ends the pool.  unlink=True removes the manifest and the names of
        all its segments; memory no tensor uses returns to the GPU now.
        unlink=False lets go in this process only (a persistent pool's
        segments stay for attach()).

        Tensors allocated from the pool that are still alive keep their
        memory: their segments stay mapped (never unmapped under a tensor),
        with a warning saying so.  What they hold goes back once they are
        gone and the pool is released again: by another release() (which
        may then unlink what an earlier unlink=False kept), or, once the
        pool is garbage collected, by the next MemPool() or release() of
        any pool (never by its finalizer: __del__); else at process exit.

        Safe from any thread: a release() called while another thread's
        runs returns once that one has finished; it waits for a publish()
        or segments() in flight, and a segments() meanwhile answers [].
        Raises gshm.ForkedChild in a process forked from the pool's (which
        leaves it alone)."""
        self._check_not_forked("gshm_pool_release")
        self._release(unlink)
        _retry_busy()

    def _release(self, unlink, warn=True, wait=True):
        """release() of this pool alone.  wait=False: returns at once when
        another thread's release of it is under way."""
        with self._lock:
            while self._releasing:
                if not wait:
                    return
                self._lock.wait()
            if self._ptr is None:
                return  # freed
            self.released = True  # no new publish or activation from here on
            self._releasing = True  # nor a segments() call
        try:
            with self._lock:
                while self._users:
                    self._lock.wait()
            self._release_calls(unlink, warn)
        finally:
            with self._lock:
                self._releasing = False
                self._lock.notify_all()

    def _release_calls(self, unlink, warn):
        # Without self._lock (see __init__), the only thread in the C pool
        # (_releasing, no _users).  Again after an EBUSY: the C pool was
        # not freed (it keeps the client and its primary context), and the
        # torch pool may cache the blocks of tensors that are gone since.
        unlink = bool(unlink or self._unlinks)
        if unlink and not self._unlinks and self.persistent and not self.client.closed:
            try:
                self.client.unlink(_manifest.manifest_name(self.prefix))
            except (FileNotFoundError, PermissionError):
                pass  # none, or another user's (names are first come, first served)
        self._unlinks = unlink
        release = _fn("gshm_pool_release")
        _torch.cuda.synchronize(self.device)
        # (a close that a finalizer makes here is put off: one on a client
        # whose lock a pull holds would wait here for the pull's end)
        with _putting_off():
            gc.collect()
        if release(self._ptr, 1 if unlink else 0) == 0:
            self._finish()
            return
        # Blocks PyTorch caches in the pool: let it give them back, which it
        # does by destroying its MemPool (its empty_cache ignores private
        # pools, pytorch #145168), but only when no tensor uses them.
        if self._torch_pool is not None and self._pool_idle():
            tp, self._torch_pool = self._torch_pool, None
            _mortal(tp)
            del tp
            with _putting_off():
                gc.collect()
            if release(self._ptr, 1 if unlink else 0) == 0:
                self._finish()
                return
        if warn:
            warnings.warn("gshm: pool %r released while tensors from it are alive: their "
                          "memory returns once they are gone and the pool is released again "
                          "(release(), or once the pool is collected the next MemPool() or "
                          "release())" % self.prefix,
                          RuntimeWarning, stacklevel=3)

    def __del__(self) -> None:
        # A release that found tensors alive (EBUSY) is not finished here
        # but kept in _busy for the next MemPool() or release() of any pool
        # (_retry_busy): finishing it synchronizes the device, and a
        # finalizer runs at any allocation on any thread, which may be in
        # the middle of another thread's CUDA graph capture (a synchronize
        # then invalidates that capture: every capture mode, probed on an
        # H200; no query sees another thread's capture on a non-blocking
        # stream).  A pool never released keeps its segments, as
        # documented (persistent ones are meant to outlive it).
        if not getattr(self, "released", False) or getattr(self, "_ptr", None) is None:
            return
        if sys.is_finalizing() or self._pid != os.getpid():
            return  # the process ends (so do its leases), or a forked child's copy
        _busy.append(self)

    def _pool_idle(self):
        snap = getattr(self._torch_pool, "snapshot", None)
        if snap is None:
            return False
        try:
            for seg in snap():
                for b in seg.get("blocks", ()):
                    if b.get("state") != "inactive":
                        return False
        except Exception:
            return False
        return True

    def _finish(self):
        self._ptr = None  # freed by gshm_pool_release
        self._client_handle.decref()


class use_pool(object):
    """with gshm.torch.use_pool(pool): every CUDA allocation PyTorch makes on
    this thread (on the pool's device) comes from the pool.  Raises
    ValueError for a released pool or one whose client is closed,
    gshm.ForkedChild in a process forked from the pool's; an
    allocation the pool cannot make raises gshm's error (the daemon's
    reason) instead of PyTorch's bare out-of-memory."""

    def __init__(self, pool: MemPool) -> None:
        if not isinstance(pool, MemPool):
            raise TypeError("gshm: use_pool takes a gshm.torch.MemPool, not %s"
                            % type(pool).__name__)
        self.pool = pool
        self._prev: Any = None
        self._ctx: Any = None

    def __enter__(self) -> MemPool:
        pool = self.pool
        pool._check_not_forked("gshm_pool_activate")
        with pool._lock:
            pool._check_usable()
            pool._users += 1  # not released between the check and the activation
            ptr, torch_pool = pool._ptr, pool._torch_pool
        try:
            self._ctx = _torch.cuda.use_mem_pool(torch_pool, device=pool.device)
            # (outside the lock: the registry's lock it takes may wait,
            # briefly, for a pool's; libgshm holds neither across a request)
            self._prev = _fn("gshm_pool_activate")(ptr)
        finally:
            pool._let_go()
        try:
            self._ctx.__enter__()
        except BaseException:
            _fn("gshm_pool_activate")(self._prev)
            raise
        return self.pool

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._ctx.__exit__(exc_type, exc, tb)
        finally:
            _fn("gshm_pool_activate")(self._prev)
            self._ctx = None  # it refers to the torch pool
        oom = getattr(_torch, "OutOfMemoryError", None) or _torch.cuda.OutOfMemoryError
        if exc_type is not None and issubclass(exc_type, oom):
            rc = _fn("gshm_torch_last_error")()
            if rc < 0:
                # The daemon's explanation comes from the C client, which
                # _use() keeps alive against a close() on another thread
                # (with the pool released there too, nothing else holds it).
                with contextlib.ExitStack() as stack:
                    try:
                        cp = stack.enter_context(self.pool.client._use())
                    except ValueError:
                        return  # the client is closed: PyTorch's error stands
                    _raise(rc, "gshm_torch_malloc", cp, self.pool.prefix)


def _device_for(manifest, device, segs):
    if device is not None:
        return _ordinal(device)
    loc = manifest["location"]
    if "pulled_from" in manifest and segs:  # the copies' GPU here, not the peer's
        loc = next(iter(segs.values())).info.location
    if loc.startswith("cuda:"):
        k = _cuda.ordinal_of_uuid(loc[5:])
        if k is not None:
            return k
    return _torch.cuda.current_device()


def attach(client: Client, prefix: str, device: Any = None, access: str = "r",
           owner: Union[int, str, None] = None) -> StateDict:
    """The tensors published under `prefix` as zero-copy views: a
    gshm.torch.StateDict ready for model.load_state_dict(sd, assign=True)
    (see load_module for non-persistent buffers, in sd.buffers).

    device  this process's CUDA ordinal to map on (None: the pool's GPU when
            visible here, else the current device; "cuda" or
            torch.device("cuda") without an index: torch's current device,
            as tensor_view and DeviceSegment.view read it; another GPU maps
            over peer access: gshm.NotSupported, errno EXDEV, where it has
            no peer path).
    access  "r" (default: writes through the tensors fault) or "rw".
    owner   whose the prefix must be: a uid as gshmd knows it (`gshmctl
            segments` shows it) or a user name; None (default): the uid
            gshmd knows client by (client.uid()), this user's own.  The
            manifest and every segment it names must be owner's and not
            writable by its group or others (names are first come, first
            served: another user may have created "<prefix>/manifest" or a
            segment name first); else UntrustedSegment, before anything is
            mapped.  Pass the publisher's uid to attach another user's model
            (read-only: access="rw" as another user needs a mode this
            refuses).

    Every tensor keeps its segment mapped (and leased) while it lives.  A
    prefix pulled from a peer node in one set pull (manifest and segments,
    `client.pull(peer, "llama/", prefix=True)`) attaches the same way: the
    manifest is resolved to the local copies (gshm._manifest).
    Raises gshm.NotFound when nothing is published under prefix,
    ManifestError for a manifest that is not gshm's or names a dtype this
    torch lacks (before anything is mapped), StaleManifest when a segment
    is gone or was created again since publish, UntrustedSegment (a
    ManifestError) for another owner's segment or one others may write,
    TypeError / ValueError for an owner that is no uid or user."""
    man = _manifest.read(client, prefix, owner)
    tdts = _manifest.torch_dtypes(man, _torch)
    segs = _manifest.open_segments(client, man, access)
    bases: dict = {}
    made: dict = {}
    try:
        dev = _device_for(man, device, segs)
        for name, seg in segs.items():
            map_for_writers(seg, dev, () if access == "r" else None)
            bases[name] = _torch.from_dlpack(seg.view("uint8", (seg.size,), 0, device=dev))

        def view(e):
            # Entries for the same bytes give the same tensor (tied weights,
            # e.g. embed_tokens and lm_head): after load_state_dict the tied
            # parameters share one memory, as in the published module.
            key = (e["segment"], e["offset"], e["dtype"], tuple(e["shape"]), tuple(e["strides"]))
            if key not in made:
                made[key] = _view(e)
            return made[key]

        def _view(e):
            tdt = tdts[e["dtype"]]
            itemsize = _to_dtype(e["dtype"]).itemsize
            end = _manifest.tensor_extent(e["offset"], itemsize, e["shape"], e["strides"])
            span = max(end - e["offset"], 0)
            span += (-span) % itemsize
            raw = bases[e["segment"]][e["offset"]:e["offset"] + span]
            return raw.view(tdt).as_strided(e["shape"], e["strides"])

        out = StateDict((k, view(e)) for k, e in man["tensors"].items())
        out.buffers = {k: view(e) for k, e in man["buffers"].items()}
        out.metadata = man["metadata"]
        out.segments = {n: s.info for n, s in segs.items()}
    except BaseException:
        # The views made so far: the exception's traceback keeps this
        # frame, and they would keep the mappings and the leases (the
        # segments' memory) for as long as the caller holds it.
        bases.clear()
        made.clear()
        out = StateDict()
        raise
    finally:
        for seg in segs.values():
            seg.close()  # the DLPack exports hold the mappings now
    return out


def load_module(module: _torch.nn.Module, sd: Mapping[str, _torch.Tensor],
                strict: bool = True) -> Any:
    """module.load_state_dict(sd, assign=True, strict=strict), then the
    non-persistent buffers attach() found (sd.buffers) put in place, so a
    module built on the meta device is complete.  Returns load_state_dict's
    result."""
    r = module.load_state_dict(sd, assign=True, strict=strict)
    for name, t in (getattr(sd, "buffers", None) or {}).items():
        mod_name, _, b = name.rpartition(".")
        mod = module.get_submodule(mod_name) if mod_name else module
        if b in mod._buffers:
            mod._buffers[b] = t
    return r


def unlink_prefix(client: Client, prefix: str) -> List[str]:
    """Unlinks everything a pool left under prefix (its manifest and its
    segments), for example after its process died; returns the names."""
    return _manifest.unlink_prefix(client, prefix)
