# SPDX-License-Identifier: Apache-2.0
"""Loading a safetensors file from disk straight into a device segment.

The file is read in chunks into two pinned host buffers in turn: while the
GPU copies one buffer's pieces to their places in the segment (an async
copy on a stream of its own), the next chunk is read into the other.  No
tensor is allocated through PyTorch's device allocator.  The segment gets
the layout share_state_dict makes (gshm._safetensors.plan), with the
tensors in name order, so it holds the same bytes as
share_state_dict(client, name, safetensors.torch.load_file(path)).
"""

import ctypes
import mmap
import os
from typing import Optional, Union

import torch as _torch

from ._client import AnySegment, Client, _unlink_on_error
from ._segment import DeviceSegment, map_for_writers
from ._safetensors import plan as _plan, parse as _parse, copy_plan as _pieces

__all__ = ["load_safetensors", "DEFAULT_CHUNK"]

DEFAULT_CHUNK = 64 << 20


def _pread_exact(fd, n, off):
    b = os.pread(fd, n, off)
    if len(b) != n:
        raise ValueError("gshm: file ends at byte %d, %d more expected" % (off + len(b), n))
    return b


def _readinto_exact(f, mv):
    got = 0
    try:
        while got < len(mv):
            n = f.readinto(mv[got:])
            if not n:
                raise ValueError("gshm: safetensors file shorter than its header says")
            got += n
    except BaseException:
        del mv  # the traceback keeps this frame: the staging mapping would stay
        raise


def _progress_bar(total, progress, desc):
    if progress is False or (progress is None and total < (1 << 30)):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=None if progress is None else False)


def load_safetensors(client: Client, name: str, path: Union[str, "os.PathLike[str]"],
                     location: str = "cuda:0", mode: int = 0o600,
                     chunk_bytes: Optional[int] = None,
                     progress: Optional[bool] = None) -> AnySegment:
    """Creates device segment `name` holding the tensors of safetensors file
    `path`, and returns it open (close it when done; the weights stay with
    gshmd until unlinked).  Read them with load_state_dict(client, name).

    location     "cuda:N" (the daemon's index) or "cuda:GPU-<uuid>".
    chunk_bytes  size of each of the two pinned staging buffers (64 MiB).
    progress     None: a tqdm bar on loads of 1 GiB and more when tqdm is
                 installed and stderr is a terminal; True / False: always /
                 never (True still needs tqdm).

    Raises ValueError for a file that is not safetensors (or is cut short),
    the errors of Client.create; nothing is left behind on error."""
    chunk = int(chunk_bytes or DEFAULT_CHUNK)
    if chunk <= 0:
        raise ValueError("gshm: chunk_bytes must be > 0")
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        fsize = os.fstat(fd).st_size
        # any file safetensors reads: its tensors are copied into plan()'s layout
        meta, entries = _parse(lambda off, n: _pread_exact(fd, n, off), fsize, aligned=False)
        header_len = 8 + int.from_bytes(_pread_exact(fd, 8, 0), "little")
        data_end = max([e for _, _, _, _, e in entries] + [header_len])
        named = sorted(entries, key=lambda t: t[0])
        layout = _plan(((k, dt, shape) for k, dt, shape, b, e in named), meta or None)
        seg = client.create(name, layout.size, location=location, mode=mode)
        with _unlink_on_error(client, name, seg):
            if not isinstance(seg, DeviceSegment):
                raise ValueError("gshm: load_safetensors loads into a device segment, not %r"
                                 % location)
            dev = seg.device
            map_for_writers(seg, dev)  # written from the host (on dev)
            dst = _torch.from_dlpack(seg.view("uint8", (layout.size,), 0, device=dev))
            try:
                header = _torch.frombuffer(bytearray(layout.header), dtype=_torch.uint8)
                dst[:layout.data_start].copy_(header)
                where = {k: b for k, _, _, b, _ in layout.entries}
                jobs = [(b, e, where[k]) for k, _, _, b, e in entries]
                _stream_in(f, dst, jobs, header_len, data_end, chunk, dev,
                           _progress_bar(data_end - header_len, progress, name))
            finally:
                # On error too, before _unlink_on_error closes seg: the
                # exception's traceback keeps this frame, and with it the
                # view, its mapping and the lease (the segment's memory, a
                # second copy's worth on a retry) until the caller drops it.
                del dst
    return seg


class _Staging(object):
    """Two page-locked host buffers of `chunk` bytes, owned here: an
    anonymous mapping registered with CUDA (cudaHostRegister), so that
    close() gives the memory back to the system at once, on success and on
    error alike (PyTorch's pin_memory tensors would stay in its host cache
    for the process's life).  Falls back to pin_memory tensors where the
    registration is not available."""

    def __init__(self, chunk):
        self.chunk = chunk
        self._map = self._ptr = None
        self.bufs = self.views = None
        rt = getattr(_torch.cuda, "cudart", None)
        try:
            rt = rt() if rt is not None else None
        except Exception:
            rt = None
        if rt is not None and hasattr(rt, "cudaHostRegister"):
            m = mmap.mmap(-1, 2 * chunk)
            flat = _torch.frombuffer(m, dtype=_torch.uint8)
            # portable: page-locked for every device's context, not only
            # the current one (the copies run on `dev`'s stream)
            try:
                rc = int(rt.cudaHostRegister(flat.data_ptr(), 2 * chunk, 1))
            except Exception:
                rc = -1
            if rc == 0:
                self._rt, self._map, self._ptr = rt, m, flat.data_ptr()
                self.bufs = [flat[:chunk], flat[chunk:]]
                self.views = [memoryview(m)[:chunk], memoryview(m)[chunk:]]
                return
            del flat
            m.close()
        self.bufs = [_torch.empty(chunk, dtype=_torch.uint8, pin_memory=True)
                     for _ in range(2)]
        self.views = [memoryview((ctypes.c_char * chunk).from_address(b.data_ptr())).cast("B")
                      for b in self.bufs]

    def close(self):
        """After every copy out of the buffers has finished."""
        for v in self.views or ():
            v.release()
        self.views = self.bufs = None
        if self._map is not None:
            self._rt.cudaHostUnregister(self._ptr)
            import gc
            gc.collect()  # the tensors' buffer exports, before the unmap
            try:
                self._map.close()
            except BufferError:
                pass  # a tensor view still lives: the mapping goes with it
            self._map = None


def _stream_in(f, dst, jobs, data_start, data_end, chunk, dev, bar):
    chunk = min(chunk, max(data_end - data_start, 1))
    # (before the staging buffers: a failure here leaves none registered)
    stream = _torch.cuda.Stream(device=dev)
    f.seek(data_start)
    stage = _Staging(chunk)
    done = [None, None]
    buf = None
    try:
        for i, (pos, n, pieces) in enumerate(_pieces(jobs, data_start, data_end, chunk)):
            k = i & 1
            if done[k] is not None:
                done[k].synchronize()  # the copies out of this buffer are done
            # read this chunk while the GPU copies the other buffer's
            _readinto_exact(f, stage.views[k][:n])
            buf = stage.bufs[k]
            with _torch.cuda.stream(stream):
                for off, d, length in pieces:
                    dst[d:d + length].copy_(buf[off:off + length], non_blocking=True)
                ev = _torch.cuda.Event()
                ev.record(stream)
            done[k] = ev
            if bar is not None:
                bar.update(n)
    finally:
        # On error too: no copy may still read the staging buffers, or
        # write the segment the caller is about to unmap and unlink.  A
        # wait that raises (a sticky CUDA error: nothing runs any more)
        # still closes them (their registration and mapping).
        try:
            stream.synchronize()
        finally:
            # dst too: the traceback keeps this frame (load_safetensors says why)
            del buf, dst
            stage.close()
            if bar is not None:
                bar.close()
