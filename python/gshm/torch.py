# SPDX-License-Identifier: Apache-2.0
"""Sharing PyTorch state dicts through one gshm segment, zero copy.

    # loader
    with gshm.Client() as c:
        seg = gshm.torch.share_state_dict(c, "llama/weights", model.state_dict())
        seg.close()            # the weights stay with gshmd until unlinked

    # any number of workers, on any GPU of the node
    c = gshm.Client()
    sd = gshm.torch.load_state_dict(c, "llama/weights", device="cuda:1")
    model.load_state_dict(sd, assign=True)   # parameters ARE the shared memory

load_state_dict and attach take only this user's segments unless told
another owner (owner="modelsvc"): names are first come, first served.

The segment is a safetensors file from byte 0 (see gshm._safetensors), so
`gshmctl read llama/weights -o w.safetensors` gives a loadable file.

gshm as PyTorch's allocator, for engines that restart without reloading
(gshm._torch_pool):

    pool = gshm.torch.MemPool(client, "llama", device=0)   # persistent
    with gshm.torch.use_pool(pool):
        model = build_model().cuda()
    pool.publish(model)
    # any later process, after a crash too
    sd = gshm.torch.attach(client, "llama", device=0)
    model.load_state_dict(sd, assign=True)

and load_safetensors(client, name, path) loads a file into a segment
through pinned staging buffers, without PyTorch's device allocator.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import torch as _torch

from . import _cuda
from ._client import AnySegment, Client, Location, _unlink_on_error
from ._segment import DeviceSegment, HostSegment, Segment  # noqa: F401  (Segment: documentation)
from ._segment import _check_view, map_for_writers
from ._dtypes import DTypeLike, dtype as _to_dtype
from ._safetensors import plan as _plan, parse as _parse
from ._torch_state import StateDict
from ._manifest import ManifestError, StaleManifest, UntrustedSegment
from ._owner import open_owned as _open_owned
from ._torch_pool import MemPool, use_pool, attach, load_module, unlink_prefix
from ._torch_load import load_safetensors

__all__ = ["share_state_dict", "load_state_dict", "tensor_view", "StateDict",
           "MemPool", "use_pool", "attach", "load_module", "unlink_prefix",
           "load_safetensors", "ManifestError", "StaleManifest", "UntrustedSegment"]


def _torch_dtype(dt):
    t = getattr(_torch, dt.name, None)
    if not isinstance(t, _torch.dtype):
        raise TypeError("gshm: this torch has no %s" % dt.name)
    return t


def _as_bytes(t):
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(_torch.uint8)


def _default_location(tensors):
    for t in tensors:
        if t.device.type == "cuda":
            idx = t.device.index if t.device.index is not None else _torch.cuda.current_device()
            return "cuda:" + _cuda.device_uuid(idx)
        return "host"
    return "host"


def _cuda_ordinal(device):
    if device is None:
        return None
    device = _torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else _torch.cuda.current_device()


def _view_device(seg, device):
    """The CUDA ordinal a zero-copy view of seg goes on, by the rule
    load_state_dict and attach follow: None for seg's own (host
    segments: the CPU); an index as given; "cuda" or torch.device("cuda")
    without one: torch's current device.  ValueError where no view can be
    there: a host segment on a GPU, a device segment on the CPU."""
    if device is None:
        return None
    d = device if isinstance(device, int) else _torch.device(device)
    if seg.is_host:
        if isinstance(d, int) or d.type != "cpu":
            raise ValueError("gshm: host segment %r has no view on %s (no copy); use device=None "
                             "and .to(device), or load_state_dict(device=...), which copies"
                             % (seg.name, "cuda:%d" % d if isinstance(d, int) else d))
        return None
    if isinstance(d, int):
        return d
    if d.type != "cuda":
        raise ValueError("gshm: device segment %r has no view on %s (no copy); use device=None "
                         "and .to(device)" % (seg.name, d))
    return _cuda_ordinal(d)


def tensor_view(seg: AnySegment, dtype: DTypeLike, shape: Sequence[int], offset: int = 0,
                device: Any = None) -> _torch.Tensor:
    """A torch tensor of dtype and shape on segment seg's memory from byte
    offset, no copy.  Device segments go through DLPack (the tensor keeps the
    segment mapped); host segments through the buffer protocol (on a
    read-only lease, a private copy-on-write mapping: torch has no read-only
    tensors, and writing one changes this process's copy of the page, never
    the segment).

    device  as load_state_dict's and attach's: None (default) the
            segment's own GPU (a host segment: the CPU); "cuda:N", N or
            torch.device("cuda", N) that device, which gets access to the
            mapping first (peer access); "cuda" or torch.device("cuda")
            without an index torch's current device
            (torch.cuda.current_device()), not the segment's GPU.

    Checked as Segment.view() checks: ValueError past the end, for a
    negative dimension or offset, or an offset that is not a multiple of
    the item size (the byte view below would not see that: a misaligned
    tensor faults in GPU kernels).  ValueError for a view that would need
    a copy (a host segment on a GPU, a device segment on the CPU);
    gshm.NoDevice for a GPU this process lacks, gshm.NotSupported (errno
    EXDEV) for one with no peer path to the segment's
    (DeviceSegment.view)."""
    return _tensor_view(seg, dtype, shape, offset, _view_device(seg, device))


def _tensor_view(seg, dtype, shape, offset, device, private=None):
    """tensor_view, with device None or an ordinal (_view_device); private:
    a uint8 tensor on a copy-on-write mapping of all of the read-only host
    segment seg, which the view slices (one mapping for all of
    load_state_dict's tensors)."""
    dt = _to_dtype(dtype)
    tdt = _torch_dtype(dt)
    shape, nbytes, offset = _check_view(seg.size, dt, shape, offset)
    if private is not None:
        if nbytes == 0:
            return _torch.empty(shape, dtype=tdt)
        return private[offset:offset + nbytes].view(tdt).reshape(shape)
    if seg.is_host:
        if nbytes == 0:
            return _torch.empty(shape, dtype=tdt)
        # Through NumPy, not torch.frombuffer: frombuffer releases its buffer
        # export at once and keeps only the object, so seg.close() would
        # unmap the memory under the tensor.  The array holds an export
        # (mmap.close then leaves the mapping to the last view) and the
        # tensor holds the array.  Torch has no read-only tensors: on a
        # read-only lease the tensor is a private copy-on-write mapping,
        # whose writes stay in this process, where a read-only mapping
        # would make them a SIGSEGV.
        if isinstance(seg, HostSegment) and seg.readonly:
            raw = _torch.from_numpy(seg._private_bytes(offset, nbytes))
        else:
            raw = _torch.from_numpy(seg.view("uint8", (nbytes,), offset))
    else:
        raw = _torch.from_dlpack(seg.view("uint8", (nbytes,), offset, device=device))
    return raw.view(tdt).reshape(shape)


def share_state_dict(client: Client, name: str, state_dict: Mapping[str, _torch.Tensor],
                     location: Optional[Location] = None, mode: int = 0o600,
                     metadata: Optional[Mapping[str, str]] = None) -> AnySegment:
    """Creates segment `name` holding every tensor of state_dict, laid out as a
    safetensors file, and returns the open Segment (close it when done; the
    weights stay with gshmd until `client.unlink(name)`).

    location  "host", "cuda:N" (the daemon's index) or "cuda:GPU-<uuid>";
              None: the GPU of the first tensor (by UUID), or "host" when it
              is on the CPU.
    metadata  extra safetensors __metadata__ (str -> str).
    The copies are finished (the device synchronised) before this returns.
    Tied tensors (two keys, one storage) are written once per key, as in any
    safetensors file, and load_state_dict gives them back as separate
    tensors: tie them again after loading (model.tie_weights()), or share
    through MemPool + publish, whose attach() keeps ties."""
    items = []
    for k, t in state_dict.items():
        if not isinstance(t, _torch.Tensor):
            raise TypeError("gshm: state_dict[%r] is a %s, not a tensor" % (k, type(t).__name__))
        items.append((k, t))
    if location is None:
        location = _default_location(t for _, t in items)
    layout = _plan(((k, t.dtype, tuple(t.shape)) for k, t in items), metadata)
    seg = client.create(name, layout.size, location=location, mode=mode)
    with _unlink_on_error(client, name, seg):
        src = dict(items)
        header = _torch.frombuffer(bytearray(layout.header), dtype=_torch.uint8)
        if isinstance(seg, HostSegment):
            dst = _torch.frombuffer(seg, dtype=_torch.uint8, count=layout.size)
            sync = None
        else:
            dev = seg.device
            writers = {t.device.index for _, t in items if t.is_cuda}
            map_for_writers(seg, dev if _segment_gpu_visible(seg) else None, writers)
            dst = _torch.from_dlpack(seg.view("uint8", (layout.size,), 0, device=dev))
            sync = dst.device
        try:
            dst[:layout.data_start].copy_(header)
            for k, dt, shape, b, e in layout.entries:
                if e > b:
                    dst[b:e].copy_(_as_bytes(src[k]))
            if sync is not None:
                _torch.cuda.synchronize(sync)
        finally:
            # On error too, before _unlink_on_error closes seg: the
            # exception's traceback keeps this frame, and a device view
            # keeps the mapping and the lease (the segment's memory) until
            # the caller drops the exception.
            del dst
    return seg


def _host_base(seg):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return _torch.frombuffer(seg, dtype=_torch.uint8, count=1).data_ptr()


def _segment_gpu_visible(seg):
    uuid = seg.info.gpu_uuid
    return uuid is not None and _cuda.ordinal_of_uuid(uuid) is not None


def _read_header_bytes(seg, dev):
    def read(off, n):
        if n == 0:
            return b""
        t = _torch.from_dlpack(seg.view("uint8", (n,), off, device=dev)).cpu()
        try:
            return t.numpy().tobytes()
        except RuntimeError:  # torch built without NumPy
            return bytes(t.tolist())
    return read


def load_state_dict(client: Client, name: str, device: Any = None,
                    access: str = "r", owner: Union[int, str, None] = None) -> StateDict:
    """Opens segment `name` (written by share_state_dict, or any safetensors
    layout) and returns {name: tensor}, every tensor a view on the mapped
    segment: no copy.

    device  None: a device segment's own GPU when visible here (else the
            current device); a host segment gives CPU tensors.  "cuda:K":
            map the segment on device K (peer access over NVLink/PCIe when
            the memory lives on another GPU) and put the tensors there;
            "cuda" or torch.device("cuda") without an index: torch's
            current device (as tensor_view, attach and
            DeviceSegment.view read it).  Asking a host segment for CUDA
            tensors, or a device segment for CPU tensors, copies.
    access  "r" (default): a read-only lease.  On a GPU, writing through
            the tensors is then a CUDA fault; CPU tensors of a host segment
            are copy-on-write views (a write changes this process's copy of
            the page, never the segment).  "rw" for tensors that write the
            segment.
    owner   whose the segment must be: a uid as gshmd knows it (`gshmctl
            segments` shows it) or a user name; None (default): the uid
            gshmd knows client by (client.uid()), this user's own.  Names
            are first come, first served: another user may have created
            `name` first.  The segment must be owner's and not writable by
            its group or others, checked as attach() checks a prefix, on
            the daemon's record of the leased segment (gshm._owner), before
            a byte is read.  Pass
            the sharer's uid or name to load another user's state dict.

    The lease lasts for as long as any of the returned tensors does.
    Raises TypeError / ValueError for an owner that is no uid or user,
    the errors of Client.open (gshm.NotFound, gshm.PermissionDenied, ...),
    UntrustedSegment (a ManifestError, so a ValueError) for another
    owner's segment or one others may write, ValueError for a header that
    is not safetensors or puts a tensor outside the segment or misaligned;
    nothing stays open on error."""
    seg = _open_owned(client, name, access, owner, "state dict")
    try:
        if isinstance(seg, HostSegment):
            meta, entries = _parse(lambda off, n: seg[off:off + n], seg.size)
            # torch has no read-only tensors: see tensor_view
            private = _torch.from_numpy(seg._private_bytes(0, seg.size)) if seg.readonly else None
            out = StateDict((k, _tensor_view(seg, dt, shape, b, None, private))
                            for k, dt, shape, b, e in entries)
            out.info, out.metadata = seg.info, meta
            out.address = private.data_ptr() if private is not None else _host_base(seg)
            if device is not None and _torch.device(device).type != "cpu":
                out = StateDict((k, v.to(device)) for k, v in out.items())
                out.info, out.metadata = seg.info, meta
                seg.close()
            return out
        want_cpu = device is not None and _torch.device(device).type == "cpu"
        dev = _cuda_ordinal(device) if not want_cpu else None
        if dev is None:
            dev = seg.device
        map_for_writers(seg, dev, () if access == "r" else None)
        meta, entries = _parse(_read_header_bytes(seg, dev), seg.size)
        out = StateDict((k, tensor_view(seg, dt, shape, b, device=dev))
                        for k, dt, shape, b, e in entries)
        out.address = seg.address
        if want_cpu:
            out = StateDict((k, v.cpu()) for k, v in out.items())
        out.info, out.metadata = seg.info, meta
        # The tensors' DLPack exports hold the mapping and the lease now.
        seg.close()
        return out
    except BaseException:
        # (views made so far: the traceback keeps this frame, and they
        # would keep the mapping and the lease as long as it)
        out, private = StateDict(), None
        seg.close()
        raise
