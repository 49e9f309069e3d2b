# SPDX-License-Identifier: Apache-2.0
"""gshm.copy, signal, wait and copy_signal: stream-ordered copies and flags
between segments, arrays and raw device addresses."""

from typing import Any, Optional

from ._core import _count, _optional, _raise
from ._segment import DeviceArray, Segment

__all__ = ["copy", "copy_signal", "signal", "wait"]


_COPY_METHODS = {"auto": 0, "copy_engine": 1, "ce": 1, "sm": 2}


def _addr_and_size(obj, what):
    if isinstance(obj, bool):
        raise TypeError("gshm.copy: %s must be an address, a segment or an array" % what)
    if isinstance(obj, int):
        return obj, None
    if isinstance(obj, Segment):
        if obj.address is None:
            obj.map()
        return obj.address, obj.size
    if isinstance(obj, DeviceArray):
        return obj.ptr, obj.nbytes
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("gshm.copy: %s tensor is not contiguous" % what)
        return obj.data_ptr(), obj.numel() * obj.element_size()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") is not None:
            raise ValueError("gshm.copy: %s array is not C-contiguous" % what)
        n = 1
        for d in cai["shape"]:
            n *= d
        return cai["data"][0], n * int(cai["typestr"][2:])
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        n = 1
        for d in ai["shape"]:
            n *= d
        return ai["data"][0], n * int(ai["typestr"][2:])
    raise TypeError("gshm.copy: cannot take the address of %s (%s)" % (what, type(obj).__name__))


def _torch_current_stream(objs):
    """torch's current stream on the GPU of the first CUDA tensor in objs
    (the source first, as torch runs a copy between GPUs), or None."""
    for o in objs:
        dev = getattr(o, "device", None)
        if type(o).__module__.startswith("torch") and getattr(dev, "type", None) == "cuda":
            import torch
            return torch.cuda.current_stream(dev).cuda_stream or None
    return None


def _stream_handle(stream, *objs):
    """The CUstream for `stream`; None: torch's current stream where one
    of objs is a CUDA tensor (torch's own streams are non-blocking: the
    legacy default stream would not be ordered after their work), else
    the legacy default stream (NULL)."""
    if stream is None:
        return _torch_current_stream(objs)
    if isinstance(stream, int):
        return stream or None
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, cupy, cuda-python
        v = getattr(stream, attr, None)
        if v is not None:
            return int(v) or None
    raise TypeError("gshm.copy: stream must be an int, a torch or cupy stream, not %s"
                    % type(stream).__name__)


def copy(dst: Any, src: Any, nbytes: Optional[int] = None, stream: Any = None,
         method: str = "auto") -> None:
    """Copies `nbytes` bytes from `src` to `dst` on a CUDA stream with
    gshm_copy (enqueued: synchronise the stream before reading dst).

    dst, src   addresses (int), segments (mapped on first use), DeviceArray
               views, torch tensors or objects with __cuda_array_interface__.
    nbytes     default: the smaller of the two sizes, where known.
    stream     None: torch's current stream on the source's GPU (the
               destination's) where either is a CUDA tensor, else the
               legacy default stream; an int CUstream, a
               torch.cuda.Stream or a cupy stream.
    method     "auto", "copy_engine" or "sm".
    Raises NotImplementedError when this libgshm has no gshm_copy."""
    fn = _optional("gshm_copy")
    try:
        m = _COPY_METHODS[str(method).lower()]
    except KeyError:
        raise ValueError("gshm.copy: method must be one of auto, copy_engine, sm") from None
    d, dsize = _addr_and_size(dst, "dst")
    s, ssize = _addr_and_size(src, "src")
    if nbytes is None:
        known = [x for x in (dsize, ssize) if x is not None]
        if not known:
            raise ValueError("gshm.copy: nbytes is needed for raw addresses")
        nbytes = min(known)
    n: int = _count(int(nbytes), "gshm.copy: nbytes", "size_t")
    for size, what in ((dsize, "dst"), (ssize, "src")):
        if size is not None and n > size:
            raise ValueError("gshm.copy: %d bytes do not fit %s (%d bytes)" % (n, what, size))
    rc = fn(d, s, n, m, _stream_handle(stream, src, dst))
    if rc < 0:
        _raise(rc, "gshm_copy")


def _flag_address(flag):
    addr, size = _addr_and_size(flag, "flag")
    if size is not None and size < 8:
        raise ValueError("gshm: a flag needs 8 bytes")
    if addr % 8:
        raise ValueError("gshm: flag address 0x%x is not 8-byte aligned" % addr)
    return addr


def _flag_value(value):
    """value as the uint64_t the flag holds; ValueError where ctypes would
    wrap it (a negative one, 2**64 and up)."""
    return _count(int(value), "gshm: flag value")


def signal(flag: Any, value: int, stream: Any = None) -> None:
    """Writes the 64-bit `value` to `flag` on `stream` after the work queued
    before it (gshm_signal).  flag: an address, a DeviceArray (its first 8
    bytes), a segment or a tensor."""
    rc = _optional("gshm_signal")(_flag_address(flag), _flag_value(value),
                                  _stream_handle(stream, flag))
    if rc < 0:
        _raise(rc, "gshm_signal")


def wait(flag: Any, value: int, stream: Any = None) -> None:
    """Makes `stream` wait, without the host, until the 64-bit word at
    `flag` is >= value (gshm_wait)."""
    rc = _optional("gshm_wait")(_flag_address(flag), _flag_value(value),
                                        _stream_handle(stream, flag))
    if rc < 0:
        _raise(rc, "gshm_wait")


def copy_signal(dst: Any, src: Any, nbytes: int, flag: Any, value: int,
                stream: Any = None, method: str = "auto") -> None:
    """copy() then signal(flag, value), fused into one kernel where possible."""
    fn = _optional("gshm_copy_signal")
    try:
        m = _COPY_METHODS[str(method).lower()]
    except KeyError:
        raise ValueError("gshm.copy: method must be one of auto, copy_engine, sm") from None
    d, dsize = _addr_and_size(dst, "dst")
    s, ssize = _addr_and_size(src, "src")
    n: int = _count(int(nbytes), "gshm.copy_signal: nbytes", "size_t")
    for size, what in ((dsize, "dst"), (ssize, "src")):
        if size is not None and n > size:
            raise ValueError("gshm.copy: %d bytes do not fit %s (%d bytes)" % (n, what, size))
    rc = fn(d, s, n, m, _flag_address(flag), _flag_value(value),
            _stream_handle(stream, src, dst, flag))
    if rc < 0:
        _raise(rc, "gshm_copy_signal")
