# SPDX-License-Identifier: Apache-2.0
"""Just enough of the CUDA driver API, loaded with ctypes on first use, to
translate between this process's device ordinals and GPU UUIDs (gshm
locations name GPUs by UUID: "cuda:GPU-<uuid>")."""

import ctypes
import os
import sys
import threading
import time

__all__ = ["available", "device_count", "device_uuid", "ordinal_of_uuid", "current_device"]

# What is cached is only what worked: a process that asked before the
# driver was ready (cuInit failed: driver not loaded yet, no device yet) or
# while a device's UUID could not be read asks again, at most once per
# _RETRY_S for cuInit (as libgshm's own loader, common/cudadrv.c), at once
# for the UUIDs.  A failure cached for good left such a process without
# GPUs (or with one that had no UUID) for its life.
_RETRY_S = 1.0
_lock = threading.Lock()  # held across cuInit: see _after_fork
_lib = None       # libcuda.so.1's handle, once dlopen'ed
_cuda = None      # _lib, once cuInit(0) has succeeded (for good)
_last_try = None  # time.monotonic() of the last failed try
_uuids = None     # every device's "GPU-<uuid>", once all were read


def _after_fork() -> None:
    """In a forked child: a lock of its own.  A fork while another thread
    held _lock (in cuInit, which takes seconds on a large node) left it
    held for ever in the child, where that thread does not exist.  Not
    _lib.fork_safe: the fork would wait for the cuInit."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


def _load():
    """The driver with cuInit done, or None (not installed, or cuInit
    failed: tried again on a call _RETRY_S or more after the last try)."""
    global _lib, _cuda, _last_try
    if _cuda is not None:
        return _cuda
    with _lock:
        if _cuda is None and (_last_try is None or time.monotonic() - _last_try >= _RETRY_S):
            try:
                if _lib is None:
                    _lib = ctypes.CDLL("libcuda.so.1")
                if _lib.cuInit(0) == 0:
                    _cuda = _lib
            except (OSError, AttributeError):
                pass
            if _cuda is None:
                _last_try = time.monotonic()
    return _cuda


def available():
    """True when a CUDA driver with at least one device is usable here."""
    return device_count() > 0


def device_count():
    c = _load()
    if c is None:
        return 0
    n = ctypes.c_int(0)
    if c.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


def _format_uuid(b):
    h = bytes(b).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def _all_uuids():
    """Every device's "GPU-<uuid>" by ordinal (None where it could not be
    read); kept once the driver answered for every device."""
    global _uuids
    if _uuids is not None:
        return _uuids
    c = _load()
    if c is None:
        return []
    n = ctypes.c_int(0)
    if c.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return []
    out = []
    get_uuid = getattr(c, "cuDeviceGetUuid_v2", None) or getattr(c, "cuDeviceGetUuid", None)
    for i in range(n.value):
        dev = ctypes.c_int(0)
        u = _CUuuid()
        if c.cuDeviceGet(ctypes.byref(dev), i) != 0 or get_uuid is None \
                or get_uuid(ctypes.byref(u), dev) != 0:
            out.append(None)
        else:
            out.append(_format_uuid(u.bytes))
    if None not in out:
        _uuids = out
    return out


def device_uuid(ordinal):
    """"GPU-<uuid>" of this process's device `ordinal` (as CUDA_VISIBLE_DEVICES
    numbers them); ValueError if there is no such device."""
    uuids = _all_uuids()
    if not 0 <= ordinal < len(uuids) or uuids[ordinal] is None:
        raise ValueError("gshm: no CUDA device %d in this process (%d visible)"
                         % (ordinal, len(uuids)))
    return uuids[ordinal]


def ordinal_of_uuid(uuid):
    """This process's ordinal for "GPU-<uuid>" (with or without the "GPU-"
    prefix, any case), or None when that GPU is not visible here."""
    want = uuid.lower()
    if not want.startswith("gpu-"):
        want = "gpu-" + want
    for i, u in enumerate(_all_uuids()):
        if u is not None and u.lower() == want:
            return i
    return None


def current_device():
    """The calling thread's current CUDA device: torch's
    (torch.cuda.current_device()) once torch has initialized CUDA in this
    process (its set_device may leave making the context current for
    later, with a CUDA runtime before 12), else the device of the thread's
    current context per the driver (0 if none)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # (a stand-in torch, or one without CUDA)
        pass
    c = _load()
    if c is None:
        return 0
    ctx = ctypes.c_void_p()
    if c.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return 0
    dev = ctypes.c_int(0)
    if c.cuCtxGetDevice(ctypes.byref(dev)) != 0:
        return 0
    return dev.value
