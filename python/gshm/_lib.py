# SPDX-License-Identifier: Apache-2.0
"""Loading libgshm.so with ctypes, and ctypes mirrors of the structs of gshm.h.

The structures below must match client/include/gshm.h field for field; the
test suite compiles a small C program against the header and compares every
size and offset (tests/test_host.py::test_struct_layout_matches_header).
"""

import ctypes
import ctypes.util
import glob
import os
import threading

__all__ = [
    "GSHM_NAME_MAX",
    "GSHM_LOCATION_MAX",
    "GSHM_ACCESS_READ",
    "GSHM_ACCESS_READ_WRITE",
    "GSHM_CREATE_LEGACY_IPC",
    "GSHM_CREATE_HIDDEN",
    "GSHM_PUBLISH_REPLACE",
    "SegmentInfoC",
    "LeaseInfoC",
    "ClientInfoC",
    "StatusInfoC",
    "PeerInfoC",
    "DeviceInfoC",
    "PoolConfigC",
    "PoolSegmentC",
    "PyGlueC",
    "GSHM_POOL_PERSISTENT",
    "GSHM_POOL_SEGMENT_PER_ALLOC",
    "GSHM_POOL_DEFAULT_GRANULE",
    "STRUCTS",
    "lib",
    "library_path",
    "optional_symbol",
    "fork_safe",
]

GSHM_NAME_MAX = 255
GSHM_LOCATION_MAX = 64
GSHM_ACCESS_READ = 1
GSHM_ACCESS_READ_WRITE = 2
GSHM_CREATE_LEGACY_IPC = 0x1
GSHM_CREATE_HIDDEN = 0x2
GSHM_PUBLISH_REPLACE = 0x1

_c_access = ctypes.c_int  # gshm_access_t: a C enum, int-sized


class SegmentInfoC(ctypes.Structure):
    """gshm_segment_info_t"""

    _fields_ = [
        ("id", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("name", ctypes.c_char * (GSHM_NAME_MAX + 1)),
        ("size", ctypes.c_uint64),
        ("requested_size", ctypes.c_uint64),
        ("granularity", ctypes.c_uint64),
        ("location", ctypes.c_char * GSHM_LOCATION_MAX),
        ("device_index", ctypes.c_int),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("mode", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("unlinked", ctypes.c_int),
        ("leases", ctypes.c_uint32),
        ("created_ns", ctypes.c_int64),
        ("source", ctypes.c_char * 384),
    ]


class ClusterPeerC(ctypes.Structure):
    """gshm_cluster_peer_t"""

    _fields_ = [
        ("name", ctypes.c_char * 64),
        ("address", ctypes.c_char * 136),
        ("state", ctypes.c_char * 12),
        ("protocol_major", ctypes.c_uint8),
        ("protocol_minor", ctypes.c_uint8),
        ("subkeys", ctypes.c_uint8),
        ("reserved_", ctypes.c_uint8),
        ("exported", ctypes.c_uint32),
        ("message", ctypes.c_char * 160),
    ]


class PullProgressC(ctypes.Structure):
    """gshm_pull_progress_t"""

    _fields_ = [
        ("bytes_done", ctypes.c_uint64),
        ("bytes_total", ctypes.c_uint64),
        ("elapsed_ns", ctypes.c_int64),
        ("segments_done", ctypes.c_uint32),
        ("segments_total", ctypes.c_uint32),
    ]


PULL_PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(PullProgressC), ctypes.c_void_p)


class PullOptsC(ctypes.Structure):
    """gshm_pull_opts_t"""

    _fields_ = [
        ("local_name", ctypes.c_char_p),
        ("location", ctypes.c_char_p),
        ("mode", ctypes.c_uint32),
        ("progress", PULL_PROGRESS_FN),
        ("progress_arg", ctypes.c_void_p),
        ("replace", ctypes.c_int),
    ]


class PullResultC(ctypes.Structure):
    """gshm_pull_result_t"""

    _fields_ = [
        ("segment", SegmentInfoC),
        ("bytes", ctypes.c_uint64),
        ("elapsed_ns", ctypes.c_int64),
        ("path", ctypes.c_char * 16),
        ("path_reason", ctypes.c_char * 160),
        ("peer", ctypes.c_char * 64),
        ("remote_id", ctypes.c_uint64),
        ("remote_generation", ctypes.c_uint64),
        ("remote_name", ctypes.c_char * (GSHM_NAME_MAX + 1)),
        ("relayed", ctypes.c_int),
    ]


class LeaseInfoC(ctypes.Structure):
    """gshm_lease_info_t"""

    _fields_ = [
        ("lease_id", ctypes.c_uint64),
        ("segment_id", ctypes.c_uint64),
        ("segment_name", ctypes.c_char * (GSHM_NAME_MAX + 1)),
        ("location", ctypes.c_char * GSHM_LOCATION_MAX),
        ("session_id", ctypes.c_uint64),
        ("pid", ctypes.c_int32),
        ("uid", ctypes.c_uint32),
        ("client_name", ctypes.c_char * 64),
        ("access", _c_access),
        ("since_ns", ctypes.c_int64),
        ("mapped", ctypes.c_int),
        ("mapped_devices", ctypes.c_char * 248),
        ("mapped_devices_listed", ctypes.c_uint32),
        ("mapped_devices_total", ctypes.c_uint32),
    ]


class ClientInfoC(ctypes.Structure):
    """gshm_client_info_t"""

    _fields_ = [
        ("session_id", ctypes.c_uint64),
        ("pid", ctypes.c_int32),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("name", ctypes.c_char * 64),
        ("since_ns", ctypes.c_int64),
        ("leases", ctypes.c_uint32),
    ]


class StatusInfoC(ctypes.Structure):
    """gshm_status_info_t"""

    _fields_ = [
        ("version", ctypes.c_char * 32),
        ("pid", ctypes.c_int32),
        ("started_ns", ctypes.c_int64),
        ("clients", ctypes.c_uint32),
        ("segments", ctypes.c_uint32),
        ("leases", ctypes.c_uint32),
        ("devices", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
        ("backends", ctypes.c_char * 64),
        ("gpu_fault", ctypes.c_char * 96),
    ]


GSHM_MAX_PEERS = 16


class PeerInfoC(ctypes.Structure):
    """gshm_peer_info_t"""

    _fields_ = [
        ("index", ctypes.c_int),
        ("access", ctypes.c_int),
        ("native_atomics", ctypes.c_int),
        ("performance_rank", ctypes.c_int),
        ("nvlinks", ctypes.c_int),
    ]


class DeviceInfoC(ctypes.Structure):
    """gshm_device_info_t"""

    _fields_ = [
        ("index", ctypes.c_int),
        ("uuid", ctypes.c_char * 48),
        ("pci_bus_id", ctypes.c_char * 32),
        ("name", ctypes.c_char * 96),
        ("total_memory", ctypes.c_uint64),
        ("free_memory", ctypes.c_uint64),
        ("granularity", ctypes.c_uint64),
        ("cc_major", ctypes.c_int),
        ("cc_minor", ctypes.c_int),
        ("npeers", ctypes.c_int),
        ("peers", PeerInfoC * GSHM_MAX_PEERS),
    ]


class PoolConfigC(ctypes.Structure):
    """gshm_pool_config_t"""

    _fields_ = [
        ("prefix", ctypes.c_char_p),
        ("device", ctypes.c_int),
        ("mode", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("granule", ctypes.c_uint64),
    ]


class PoolSegmentC(ctypes.Structure):
    """gshm_pool_segment_t"""

    _fields_ = [
        ("name", ctypes.c_char * (GSHM_NAME_MAX + 1)),
        ("id", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("address", ctypes.c_uint64),
        ("live_bytes", ctypes.c_uint64),
        ("live_blocks", ctypes.c_uint64),
    ]


class PyGlueC(ctypes.Structure):
    """gshm_py_glue_t (every member a C function's address)"""

    _fields_ = [
        ("gil_ensure", ctypes.c_void_p),
        ("gil_release", ctypes.c_void_p),
        ("err_fetch", ctypes.c_void_p),
        ("err_restore", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("capsule_destructor", ctypes.c_void_p),
    ]


GSHM_POOL_PERSISTENT = 0x1
GSHM_POOL_SEGMENT_PER_ALLOC = 0x2
GSHM_POOL_DEFAULT_GRANULE = 256 << 20

# C type name -> ctypes mirror (used by the layout test).
STRUCTS = {
    "gshm_segment_info_t": SegmentInfoC,
    "gshm_lease_info_t": LeaseInfoC,
    "gshm_client_info_t": ClientInfoC,
    "gshm_status_info_t": StatusInfoC,
    "gshm_peer_info_t": PeerInfoC,
    "gshm_device_info_t": DeviceInfoC,
    "gshm_pool_config_t": PoolConfigC,
    "gshm_pool_segment_t": PoolSegmentC,
    "gshm_py_glue_t": PyGlueC,
}

_vp = ctypes.c_void_p
_int = ctypes.c_int
_size_p = ctypes.POINTER(ctypes.c_size_t)

# name: (restype, argtypes): the functions of gshm.h the package calls
# (not gshm_chmod, gshm_chown, gshm_revoke: admin verbs, gshmctl's).
_PROTOTYPES = {
    "gshm_connect": (_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_vp)]),
    "gshm_disconnect": (None, [_vp]),
    "gshm_create": (_int, [_vp, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
                           ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(_vp)]),
    "gshm_open": (_int, [_vp, ctypes.c_char_p, _c_access, ctypes.POINTER(_vp)]),
    "gshm_close": (_int, [_vp]),
    "gshm_unlink": (_int, [_vp, ctypes.c_char_p]),
    "gshm_stat": (_int, [_vp, ctypes.POINTER(SegmentInfoC)]),
    "gshm_stat_name": (_int, [_vp, ctypes.c_char_p, ctypes.POINTER(SegmentInfoC)]),
    "gshm_segment_info": (ctypes.POINTER(SegmentInfoC), [_vp]),
    "gshm_segment_fd": (_int, [_vp]),
    "gshm_segment_access": (_c_access, [_vp]),
    "gshm_list": (_int, [_vp, ctypes.POINTER(ctypes.POINTER(SegmentInfoC)), _size_p]),
    "gshm_list_leases": (_int, [_vp, ctypes.POINTER(ctypes.POINTER(LeaseInfoC)), _size_p]),
    "gshm_list_clients": (_int, [_vp, ctypes.POINTER(ctypes.POINTER(ClientInfoC)), _size_p]),
    "gshm_status": (_int, [_vp, ctypes.POINTER(StatusInfoC)]),
    "gshm_free": (None, [_vp]),
    "gshm_map": (_int, [_vp, ctypes.POINTER(ctypes.c_int), ctypes.c_size_t, ctypes.POINTER(_vp)]),
    "gshm_unmap": (_int, [_vp]),
    "gshm_last_error": (ctypes.c_char_p, [_vp]),
    "gshm_strerror": (ctypes.c_char_p, [_int]),
}

# Symbols added after v1's first cut (devices, metrics, read/write, legacy
# IPC, copy kernels of issue 8): looked up lazily, so that an older
# libgshm still loads and only the missing feature raises NotImplementedError.
_u64 = ctypes.c_uint64
_OPTIONAL_PROTOTYPES = {
    "gshm_list_devices": (_int, [_vp, ctypes.POINTER(ctypes.POINTER(DeviceInfoC)), _size_p]),
    "gshm_metrics": (_int, [_vp, ctypes.POINTER(_vp)]),
    "gshm_read": (_int, [_vp, _u64, _vp, ctypes.c_size_t]),
    "gshm_write": (_int, [_vp, _u64, _vp, ctypes.c_size_t]),
    "gshm_connect_explain": (_int, [ctypes.c_char_p, _int, ctypes.c_char_p, ctypes.c_size_t]),
    "gshm_err_name": (ctypes.c_char_p, [_int]),
    "gshm_open_legacy_ipc": (_int, [_vp, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint8 * 64),
                                    ctypes.POINTER(_vp)]),
    "gshm_copy": (_int, [_vp, _vp, ctypes.c_size_t, _int, _vp]),
    "gshm_signal": (_int, [_vp, _u64, _vp]),
    "gshm_copy_signal": (_int, [_vp, _vp, ctypes.c_size_t, _int, _vp, _u64, _vp]),
    "gshm_wait": (_int, [_vp, _u64, _vp]),
    # the cluster of issue 13 (client/cluster.c)
    "gshm_cluster_peers": (_int, [_vp, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ClusterPeerC)),
                                  _size_p]),
    "gshm_list_remote": (_int, [_vp, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(SegmentInfoC)),
                                _size_p]),
    "gshm_pull": (_int, [_vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(PullOptsC),
                         ctypes.POINTER(PullResultC)]),
    "gshm_pull_prefix": (_int, [_vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(PullOptsC),
                                ctypes.POINTER(ctypes.POINTER(PullResultC)), _size_p]),
    "gshm_pull_cancel": (_int, [_vp]),
    # the PyTorch pool of issue 14 (client/torch_alloc.c)
    "gshm_pool_create": (_int, [_vp, ctypes.POINTER(PoolConfigC), ctypes.POINTER(_vp)]),
    "gshm_pool_activate": (_vp, [_vp]),
    "gshm_pool_segments": (_int, [_vp, ctypes.POINTER(ctypes.POINTER(PoolSegmentC)), _size_p]),
    "gshm_pool_release": (_int, [_vp, _int]),
    "gshm_torch_last_error": (_int, []),
    # owner pinning of gshm.torch.attach
    "gshm_client_uid": (_int, [_vp, ctypes.POINTER(ctypes.c_uint32)]),
    # hidden creates and their publish (replacing a segment in place)
    "gshm_publish": (_int, [_vp, ctypes.c_uint32]),
    # DLPack's deleter and capsule destructor in C (gshm._dlpack)
    "gshm_py_glue_set": (_int, [ctypes.POINTER(PyGlueC)]),
    "gshm_py_dlpack_deleter": (None, [_vp]),
    "gshm_py_capsule_destructor": (None, [_vp]),
}

def fork_safe(lock):
    """lock, held across os.fork() by the forking thread (taken before the
    fork, released after it in parent and child) and returned.  A fork
    while another thread held one of the package's locks left it held for
    ever in the child, where that thread does not exist: the child's next
    use of it (a finalizer's decref as the child drops a segment it
    inherited, a DLPack deleter) hung.  No lock so guarded may be held by a
    thread that forks, nor across a blocking call."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=lock.acquire, after_in_parent=lock.release,
                            after_in_child=lock.release)
    return lock


_lock = fork_safe(threading.Lock())
_lib = None
_lib_path = None


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("GSHM_LIBRARY")
    if env:
        # An explicit choice: use it or fail, never fall back silently.
        # A relative path is made absolute now: library_path() is dlopen'ed
        # again later (gshm.torch's CUDAPluggableAllocator), by when the
        # working directory may have changed (then nothing, or another
        # copy of libgshm, with a pool registry of its own, was loaded).
        return [os.path.abspath(env) if os.sep in env else env], True
    here = _package_dir()
    out = []
    for d in (here, os.path.join(here, os.pardir, os.pardir, "build", "client")):
        d = os.path.normpath(d)
        for pattern in ("libgshm.so", "libgshm.so.*"):
            out.extend(sorted(glob.glob(os.path.join(d, pattern))))
    found = ctypes.util.find_library("gshm")
    if found:
        out.append(found)
    out.append("libgshm.so.0")
    out.append("libgshm.so")
    return _unique(out), False


def _unique(paths):
    """paths without repeats, in order: find_library's answer is the
    soname ("libgshm.so.0") that follows it, and the build's libgshm.so
    and libgshm.so.0 are links to one file, so a library that fails to
    load was tried, and listed in the error, two or three times.  A path
    with a "/" is one file (by realpath); a bare name is what dlopen looks
    up (by the name)."""
    seen = set()
    out = []
    for p in paths:
        key = os.path.realpath(p) if os.sep in p else p
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def lib():
    """The loaded libgshm (a ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, explicit = _candidates()
        errors = []
        for p in paths:
            try:
                handle = ctypes.CDLL(p, use_errno=True)
            except OSError as e:
                errors.append("%s: %s" % (p, e))
                continue
            try:
                for name, (restype, argtypes) in _PROTOTYPES.items():
                    fn = getattr(handle, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
            except AttributeError as e:
                errors.append("%s: not libgshm v1 (%s)" % (p, e))
                continue
            _lib, _lib_path = handle, p
            return _lib
        hint = ("$GSHM_LIBRARY=%s" % paths[0]) if explicit else (
            "set $GSHM_LIBRARY to the full path of libgshm.so")
        raise ImportError("gshm: cannot load libgshm (%s); tried: %s"
                          % (hint, "; ".join(errors)))


def library_path():
    """Path (as given to dlopen) of the loaded libgshm."""
    lib()
    return _lib_path


def optional_symbol(name):
    """A function of libgshm that may be missing from this build; None if absent."""
    handle = lib()
    if name in _PROTOTYPES:
        return getattr(handle, name)
    try:
        fn = getattr(handle, name)
    except AttributeError:
        return None
    proto = _OPTIONAL_PROTOTYPES.get(name)
    if proto is not None:
        fn.restype, fn.argtypes = proto[0], proto[1]
    return fn
