# SPDX-License-Identifier: Apache-2.0
"""The safetensors layout of a shared state dict, and its NumPy flavour.

A segment holding a state dict is, from byte 0, a safetensors file:

    8 bytes      N, little-endian u64
    N bytes      JSON header: {"__metadata__": {...}, name: {"dtype": "F32",
                 "shape": [...], "data_offsets": [begin, end]}, ...}, padded
                 with spaces so that the data starts at a multiple of ALIGN
    data         every tensor, contiguous and packed (safetensors forbids
                 holes), ordered by decreasing item size so that each starts
                 at a multiple of its own item size

so `gshmctl read NAME -o model.safetensors` (which writes the segment's
requested size) gives a file that safetensors loads.  Offsets in the header
are relative to the start of the data, as the format says.
"""

import json
import reprlib
import struct

from ._client import _unlink_on_error
from ._dtypes import DTYPES, dtype as _to_dtype
from ._owner import open_owned

__all__ = ["ALIGN", "Layout", "plan", "parse", "copy_plan", "share_arrays", "load_arrays"]

ALIGN = 256  # where the data starts; a GPU-friendly multiple of 8
MAX_DIMS = 64  # dimensions of one tensor, as in a manifest (gshm._manifest)
_I64 = (1 << 63) - 1  # torch's sizes are int64
FORMAT_VERSION = "1"

_BY_ST = {d.safetensors: d for d in DTYPES.values() if d.safetensors}


class Layout(object):
    """Where everything goes.  header: the bytes of the 8-byte length and the
    padded JSON; data_start: len(header); entries: [(name, DType, shape,
    begin, end)] with absolute offsets in the segment; size: total bytes."""

    def __init__(self, header, entries, size):
        self.header = header
        self.data_start = len(header)
        self.entries = entries
        self.size = size


def plan(tensors, metadata=None, align=ALIGN):
    """Layout for tensors: an iterable of (name, dtype spec, shape)."""
    items = []
    for i, (name, spec, shape) in enumerate(tensors):
        if not isinstance(name, str):
            raise TypeError("gshm: tensor names must be str, not %r" % (name,))
        if name == "__metadata__":
            raise ValueError("gshm: '__metadata__' is not a valid tensor name")
        dt = _to_dtype(spec)
        if dt.safetensors is None:
            raise TypeError("gshm: safetensors has no %s (tensor %r)" % (dt.name, name))
        shape = [int(d) for d in shape]
        n = 1
        for d in shape:
            n *= d
        items.append((i, name, dt, shape, n * dt.itemsize))
    if len({it[1] for it in items}) != len(items):
        raise ValueError("gshm: duplicate tensor names")
    # Largest items first, each group in the caller's order: every tensor then
    # begins at a multiple of its item size, with no gaps between tensors.
    placed = {}
    off = 0
    for i, name, dt, shape, nbytes in sorted(items, key=lambda it: (-it[2].itemsize, it[0])):
        placed[name] = (off, off + nbytes)
        off += nbytes
    meta = {"format": "pt", "gshm.layout": FORMAT_VERSION}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("gshm: safetensors metadata must map str to str")
            meta[k] = v
    doc = {"__metadata__": meta}
    for i, name, dt, shape, nbytes in items:
        doc[name] = {"dtype": dt.safetensors, "shape": shape, "data_offsets": list(placed[name])}
    js = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    total = 8 + len(js)
    pad = (-total) % align
    js += b" " * pad
    header = struct.pack("<Q", len(js)) + js
    start = len(header)
    entries = [(name, dt, tuple(shape), start + placed[name][0], start + placed[name][1])
               for i, name, dt, shape, nbytes in items]
    return Layout(header, entries, start + off)


def _json_list(v):
    """v, a JSON array; TypeError for anything else (a string would iterate
    as its characters)."""
    if not isinstance(v, list):
        raise TypeError("not a JSON array")
    return v


def _json_count(v):
    """v, a JSON integer >= 0, as the format's u64 fields are; ValueError
    for a negative one, TypeError for a float, bool or string (int() would
    truncate 2.5, take "8", or overflow on Infinity)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("not a JSON integer")
    if v < 0:
        raise ValueError("negative")
    return v


# Digits of one integer literal in a header (and a manifest: _manifest):
# 20 hold any u64.  int() of a literal is quadratic in its length, and
# Python before 3.11 has no sys.set_int_max_str_digits limit: one 64 MiB
# literal would take hours there.
MAX_INT_DIGITS = 20
# Limits on a header, checked before json.loads builds anything from it
# (whoever created the segment wrote it): the bytes and brackets of
# gshm._manifest (2**18 entries: 256 bytes and 3 containers each, and
# 65,536 to spare).  A 100 MiB header was taken before, and JSON made 2.4
# GiB of 35M empty arrays in 43 s.  safetensors itself refuses headers
# past 100 MB; gshm's own (share_state_dict) take about 170 bytes a tensor.
MAX_HEADER_BYTES = 64 << 20
MAX_CONTAINERS = 4 * (1 << 18) + (1 << 16)
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 120


def _json_int(text):
    """json.loads' parse_int: the literal as an int, unless it has more
    digits than MAX_INT_DIGITS (ValueError before int() is asked: int() of
    a long literal is quadratic, unbounded before Python 3.11)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError("an integer of %d digits, more than %d" % (digits, MAX_INT_DIGITS))
    return int(text)


def _shown(v):
    """A short repr of v (reprlib: a few items of each container, the
    start of long strings), for an error about a header someone else
    wrote: the whole value of a hostile entry (2M arrays) made the message
    itself megabytes long."""
    return _REPR.repr(v)


def parse(read, size, aligned=True):
    """Reads a layout back.  read(offset, n) returns n bytes of the segment;
    size is the segment's size.  Returns (metadata, entries) like plan's.
    aligned: every non-empty tensor must start at a multiple of its item
    size, as plan() places them (for views on the bytes: a misaligned
    float32 view is a CUDA fault in every kernel that reads it); False for
    a file that is only copied from (load_safetensors lays it out anew).
    Raises ValueError when the bytes are not a safetensors layout that fits."""
    if size < 8:
        raise ValueError("gshm: segment too small for a safetensors header")
    (n,) = struct.unpack("<Q", bytes(read(0, 8)))
    if n > size - 8:
        raise ValueError("gshm: safetensors header length %d does not fit the segment" % n)
    if n > MAX_HEADER_BYTES:
        raise ValueError("gshm: safetensors header length %d does not fit gshm's limit of %d bytes"
                         % (n, MAX_HEADER_BYTES))
    raw = bytes(read(8, n))
    if raw.count(b"{") + raw.count(b"[") > MAX_CONTAINERS:
        raise ValueError("gshm: safetensors header has more objects and arrays than %d"
                         % MAX_CONTAINERS)
    try:
        doc = json.loads(raw.decode("utf-8"), parse_int=_json_int)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # nesting too deep
        raise ValueError("gshm: bad safetensors header: %s" % err) from None
    del raw
    if not isinstance(doc, dict):
        raise ValueError("gshm: bad safetensors header: not a JSON object")
    start = 8 + n
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("gshm: safetensors __metadata__ must map str to str, not %s"
                         % _shown(meta))
    entries = []
    for name, t in doc.items():
        try:
            dt = _BY_ST[t["dtype"]]
            shape = tuple(_json_count(d) for d in _json_list(t["shape"]))
            b, e = (_json_count(x) for x in _json_list(t["data_offsets"]))
            # what torch takes: a shape with a 0 holds no bytes whatever its
            # other dimensions, so the byte checks below never see them.
            # Their product must fit int64 as well: torch multiplies the
            # sizes in order, and [2**62, 2**62, 0] overflowed into its own
            # RuntimeError (each dimension alone was within int64).
            nonzero = 1
            for d in shape:
                nonzero *= d or 1
            if len(shape) > MAX_DIMS or nonzero > _I64:
                raise ValueError("shape")
        except (KeyError, TypeError, ValueError):
            raise ValueError("gshm: bad safetensors entry %s: %s" % (_shown(name), _shown(t))) \
                from None
        count = 1
        for d in shape:
            count *= d
        if e < b or e - b != count * dt.itemsize or start + e > size:
            raise ValueError("gshm: tensor %s: offsets %r do not match its shape or the segment"
                             % (_shown(name), (b, e)))
        if aligned and e > b and (start + b) % dt.itemsize:
            raise ValueError("gshm: tensor %s at byte %d is not aligned to its %s item size (%d)"
                             % (_shown(name), start + b, dt.name, dt.itemsize))
        entries.append((name, dt, shape, start + b, start + e))
    # Tensors may not share bytes (safetensors forbids it, and a copy plan
    # that reads each file byte once would leave one of them unwritten).
    spans = sorted((b, e, name) for name, _, _, b, e in entries if e > b)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError("gshm: tensors %s and %s overlap in the file"
                             % (_shown(n0), _shown(n1)))
    return meta, entries


def copy_plan(jobs, data_start, data_end, chunk):
    """Cuts a file's data region [data_start, data_end) into chunks of
    `chunk` bytes and says, per chunk, which bytes go where.  jobs: (begin,
    end, destination) with absolute file offsets.  Yields (file offset,
    length, [(offset in the chunk, destination offset, length)]): every byte
    of every job exactly once, in file order."""
    jobs = sorted((b, e, dst) for b, e, dst in jobs if e > b)
    j = 0
    pos = data_start
    while pos < data_end:
        n = min(chunk, data_end - pos)
        out = []
        while j < len(jobs) and jobs[j][0] < pos + n:
            b, e, dst = jobs[j]
            lo, hi = max(b, pos), min(e, pos + n)
            if hi > lo:
                out.append((lo - pos, dst + (lo - b), hi - lo))
            if e <= pos + n:
                j += 1
            else:
                break
        yield pos, n, out
        pos += n


def share_arrays(client, name, arrays, location="host", mode=0o600, metadata=None):
    """Creates segment `name` holding NumPy arrays (a dict) in the safetensors
    layout; returns the open Segment (close it when done: the arrays stay
    until the name is unlinked).  Host segments only."""
    import numpy
    # (numpy.ascontiguousarray would turn 0-d arrays into 1-d ones)
    arrays = {k: numpy.asarray(v) for k, v in arrays.items()}
    arrays = {k: v if v.flags.c_contiguous else v.copy(order="C") for k, v in arrays.items()}
    layout = plan(((k, v.dtype, v.shape) for k, v in arrays.items()), metadata)
    seg = client.create(name, layout.size, location=location, mode=mode)
    with _unlink_on_error(client, name, seg):
        if not seg.is_host:
            raise ValueError("gshm: share_arrays needs a host segment (use gshm.torch for GPUs)")
        buf = memoryview(seg)
        try:
            buf[:layout.data_start] = layout.header
            for k, dt, shape, b, e in layout.entries:
                buf[b:e] = arrays[k].reshape(-1).view(numpy.uint8).data if e > b else b""
        finally:
            # On error too, before _unlink_on_error closes seg: the
            # exception's traceback keeps this frame, and a live export
            # keeps the segment's memory mapped (close() cannot unmap it)
            # until the caller drops the exception.
            buf.release()
    return seg


def load_arrays(client, name, access="r", owner=None):
    """Opens host segment `name` (written by share_arrays or gshm.torch) and
    returns {name: numpy array} views on it, no copy.  The lease lasts as
    long as the arrays do.

    access  "r" (default: read-only views) or "rw".
    owner   whose the segment must be: a uid as gshmd knows it or a user
            name; None (default): the uid gshmd knows client by
            (client.uid()), the reader's own.  Names are first come, first
            served: another user may have created `name` first.  The
            segment must be owner's and not writable by its group or
            others, as gshm.torch.attach checks a prefix (gshm._owner);
            pass the sharer's uid or name to load another user's arrays.

    Raises TypeError / ValueError for an owner that is no uid or user, the
    errors of Client.open (gshm.NotFound, gshm.PermissionDenied, ...),
    UntrustedSegment (gshm._owner, also gshm.torch's; a ValueError) for
    another owner's segment or one others may write, ValueError for a
    device segment or a header that is not safetensors or does not fit
    the segment; nothing stays open on error."""
    import numpy
    seg = open_owned(client, name, access, owner, "state dict")
    try:
        if not seg.is_host:
            raise ValueError("gshm: load_arrays needs a host segment (use gshm.torch for GPUs)")
        meta, entries = parse(lambda off, n: seg[off:off + n], seg.size)
        out = {}
        for k, dt, shape, b, e in entries:
            if dt.typestr is None:
                out[k] = seg.view("uint8", (e - b,), b)  # NumPy lacks this type: raw bytes
            else:
                out[k] = seg.view(dt, shape, b)
        return out
    except BaseException:
        out = {}  # (their exports would keep the mapping as long as the traceback)
        seg.close()
        raise
