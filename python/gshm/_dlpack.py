# SPDX-License-Identifier: Apache-2.0
"""DLPack export (legacy, unversioned "dltensor" capsules) with ctypes.

A capsule holds a DLManagedTensor whose memory (and the shape and strides
arrays it points to) lives in a Python object kept in _LIVE until the
tensor's deleter runs; that object also holds a strong reference to the
exporting view, and through it to the segment, so the segment stays mapped
(and its lease held) until the consumer lets go of the memory.

Ownership, per the DLPack spec:
  * the consumer (torch.from_dlpack, cupy.from_dlpack, numpy.from_dlpack)
    renames the capsule "used_dltensor" and calls the deleter when it frees
    the tensor;
  * a capsule that is never consumed is destroyed with its name still
    "dltensor", and its destructor calls the deleter.

The ctypes callbacks and the capsule name are created once and never freed
(a C pointer to each outlives any Python object that could own it), so a
deleter called late, from any thread, finds them.

What C is given as the deleter and the destructor is libgshm's
gshm_py_dlpack_deleter and gshm_py_capsule_destructor, which call those
callbacks with Python's pending exception set aside: a ctypes callback
entered while one is pending loses it (a consumer that drops the capsule
while raising, as numpy.from_dlpack does for a GPU view, then returned
NULL with no exception: a SystemError, and the export was never
released).  The callbacks themselves only where libgshm lacks them.
"""

import ctypes
import threading
from typing import Any, Dict, List

from . import _lib
from ._lib import fork_safe

__all__ = ["DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "make_capsule",
           "kDLCPU", "kDLCUDA", "kDLCUDAHost", "live_exports"]

kDLCPU, kDLCUDA, kDLCUDAHost = 1, 2, 3


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor *)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

# address of a DLManagedTensor -> _Export (everything it points to, and the owner)
_LIVE: Dict[int, Any] = {}
# Reentrant: a capsule destroyed by the garbage collector while this
# thread holds it (Python 3.12 runs a collection at any bytecode boundary,
# the lines under the lock included) runs _deleter_impl, which takes it:
# a plain lock there waited for itself for ever.
_LIVE_LOCK = fork_safe(threading.RLock())


# Exports whose deleter ran while this thread already held _LIVE_LOCK (a
# capsule the garbage collector destroyed at a bytecode boundary under it):
# dropping one there may end its segment's lease, and gshm_close waits for
# the client's lock, which another thread's request (a pull: minutes)
# holds; that request's progress callback letting go of a DLPack tensor
# then waited for _LIVE_LOCK, held by the waiting close: both hung for
# ever.  They are dropped where the outermost holder has let the lock go
# (_drop_put_off).  No lock of its own: append and pop are each one step
# under the GIL.
_put_off: List[Any] = []


def _drop_put_off():
    """Drops the exports _put_off holds (their owners' closes run here);
    nothing while this thread holds _LIVE_LOCK (its outermost holder
    drops them)."""
    if _LIVE_LOCK._is_owned():
        return
    while _put_off:
        try:
            export = _put_off.pop()
        except IndexError:  # (another thread took the last)
            return
        del export


class _Export(object):
    __slots__ = ("managed", "shape", "strides", "owner", "__weakref__")


def _forever(obj):
    """Keeps obj alive until the process ends (its address is handed to C)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


def _deleter_impl(addr):
    try:
        nested = _LIVE_LOCK._is_owned()  # (a finalizer run under it: see _put_off)
        with _LIVE_LOCK:
            export = _LIVE.pop(addr, None)
        if nested:
            if export is not None:
                _put_off.append(export)
            return
        # Dropping `export` here releases the owner (view -> segment), which
        # may end the lease; that runs gshm_close from this thread.
        del export
        _drop_put_off()
    except BaseException:  # never let anything escape into C
        pass


_py_deleter = _forever(_DELETER(_deleter_impl))

_NAME = _forever(ctypes.create_string_buffer(b"dltensor"))

# The capsule API is called through CFUNCTYPE prototypes, not ctypes.pythonapi:
# a capsule may be destroyed while an exception is being raised, and
# pythonapi's error check would then report that unrelated exception.  These
# two functions only read the capsule and never fail for a valid name.
_PyCapsule_IsValid = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_PyCapsule_GetPointer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject *)


def _capsule_destructor_impl(capsule):
    try:
        if _PyCapsule_IsValid(capsule, ctypes.addressof(_NAME)):
            # Never consumed: we still own the DLManagedTensor.
            addr = _PyCapsule_GetPointer(capsule, ctypes.addressof(_NAME))
            if addr:
                _deleter_impl(addr)
    except BaseException:
        pass


_py_capsule_destructor = _forever(_DESTRUCTOR(_capsule_destructor_impl))

# (deleter, capsule destructor address) that make_capsule gives C, chosen
# at its first call (_c_functions).
_given = None


def _c_functions():
    """libgshm's gshm_py_dlpack_deleter (as a _DELETER) and
    gshm_py_capsule_destructor (an address) around the callbacks above,
    once gshm_py_glue_set has them; the callbacks themselves where
    libgshm cannot be loaded or predates them."""
    global _given
    if _given is not None:
        return _given
    given = (_py_deleter, ctypes.cast(_py_capsule_destructor, ctypes.c_void_p).value)
    try:
        setup = _lib.optional_symbol("gshm_py_glue_set")
        deleter = _lib.optional_symbol("gshm_py_dlpack_deleter")
        destructor = _lib.optional_symbol("gshm_py_capsule_destructor")
    except ImportError:
        setup = None
    if setup is not None and deleter is not None and destructor is not None:
        api = ctypes.pythonapi

        def address(fn):
            return ctypes.cast(fn, ctypes.c_void_p).value
        glue = _forever(_lib.PyGlueC(
            address(api.PyGILState_Ensure), address(api.PyGILState_Release),
            address(api.PyErr_Fetch), address(api.PyErr_Restore), address(_py_deleter),
            address(_py_capsule_destructor)))
        if setup(ctypes.byref(glue)) == 0:
            given = (_DELETER(address(deleter)), address(destructor))
    _given = given
    return given

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


def make_capsule(owner, data, device_type, device_id, dl_code, dl_bits, shape):
    """A new "dltensor" capsule for a C-contiguous tensor at address `data`.

    owner is kept alive until the consumer calls the deleter (or the capsule
    is destroyed unconsumed)."""
    ndim = len(shape)
    export = _Export()
    export.shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides = [1] * ndim
    for i in range(ndim - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    export.strides = (ctypes.c_int64 * max(ndim, 1))(*strides)
    export.owner = owner
    m = DLManagedTensor()
    t = m.dl_tensor
    t.data = data
    t.device = DLDevice(device_type, device_id)
    t.ndim = ndim
    t.dtype = DLDataType(dl_code, dl_bits, 1)
    t.shape = ctypes.cast(export.shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(export.strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    deleter, destructor = _c_functions()
    m.manager_ctx = None
    m.deleter = deleter
    export.managed = m
    addr = ctypes.addressof(m)
    with _LIVE_LOCK:
        _LIVE[addr] = export
    _drop_put_off()  # (a collection under the lock: see _put_off)
    try:
        return _PyCapsule_New(addr, ctypes.addressof(_NAME), destructor)
    except BaseException:
        with _LIVE_LOCK:
            _LIVE.pop(addr, None)
        raise


def live_exports():
    """Number of DLPack exports not yet released by their consumers (for tests)."""
    with _LIVE_LOCK:
        n = len(_LIVE)
    _drop_put_off()
    return n
