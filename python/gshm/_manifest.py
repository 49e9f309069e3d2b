# SPDX-License-Identifier: Apache-2.0
"""The manifest of a published pool: which tensor lies where.

A pool (gshm.torch.MemPool) allocates from device segments
"<prefix>/seg-NNNNNN"; publishing writes host segment "<prefix>/manifest":

    8 bytes      N, little-endian u64
    N bytes      UTF-8 JSON:
    {"format": "gshm.torch.pool", "version": 1,
     "location": "cuda:GPU-<uuid>",
     "segments": {"<prefix>/seg-000000": {"id": 7, "generation": 1, "size": 268435456}, ...},
     "tensors": {"model.embed_tokens.weight": {"segment": "<prefix>/seg-000000",
                 "offset": 0, "dtype": "bfloat16", "shape": [32000, 1024],
                 "strides": [1024, 1]}, ...},
     "buffers": {...},       # a module's non-persistent buffers, same form
     "metadata": {"str": "str"}}

offset is in bytes from the segment's start to the tensor's first element,
strides in elements.  id and generation are what the daemon said when the
pool created the segment: a segment unlinked and created again under the
same name has another id, and attach() refuses it as stale.

A manifest pulled from a peer node with its segments (one set pull of the
prefix, `gshmctl pull node:llama/ --prefix`) still names the peer's ids;
read() resolves it: the manifest segment's source ("PEER:NAME#ID.GEN")
gives the peer and the prefix there, every segment name is moved from
that prefix to the local one, and open_segments() accepts a local segment
whose own source is exactly the recorded one (same peer, name, id and
generation): the bytes are those the manifest describes, and a segment
that was created again on the peer before the pull is still refused.

Who published it: names are first come, first served, so any user may
create "<prefix>/manifest" or "<prefix>/seg-..." before the publisher does
(or after a release).  read() and open_segments() take only segments of
one owner, the reader's own uid unless told another (attach's owner=), that
neither its group nor others may write (check_owner, gshm._owner): the
owner's word is what a reader trusts, as of a file it would load its
weights from.  gshm.torch.load_state_dict and _safetensors.load_arrays
check their one name the same way (open_owned).

Nothing here needs torch or a GPU."""

import json
import struct

from ._core import _enc
from ._dtypes import dtype as _to_dtype
from ._errors import NotSupported, Revoked
from ._lib import GSHM_NAME_MAX
# (defined in _owner, below this module and _safetensors, which both use them)
from ._owner import (ManifestError, UntrustedSegment, owner_uid, check_owner, check_segment,
                     open_owned)
from ._safetensors import _json_list, _shown
from ._safetensors import _json_int as _int_literal

__all__ = ["FORMAT", "VERSION", "ManifestError", "StaleManifest", "UntrustedSegment",
           "owner_uid", "check_owner", "check_segment", "open_owned", "manifest_name",
           "segment_prefix", "encode", "decode", "tensor_extent", "torch_dtypes", "write",
           "read", "open_segments", "unlink_prefix", "parse_source"]

FORMAT = "gshm.torch.pool"
VERSION = 1
# Limits on a manifest, checked before anything is built from it (whoever
# published the prefix, or a cluster key holder whose set pull brought it,
# wrote it).  Entries (tensors + buffers; segments likewise, publish lists
# only the segments its entries use): 2**18, about twice the tensors of the
# largest checkpoints with one tensor per expert matrix (a 1T-parameter MoE
# of 60 MoE layers x 384 experts x 3 matrices, each with an FP8 scale
# tensor: 138,240).  Bytes: 256 per entry (an entry with a 60-character
# name and a 2-d shape takes 173), 64 MiB.  A manifest that size makes
# json.loads hold up to about 13x its bytes (0.85 GB of short strings,
# measured; a legitimate one of 2**18 entries: 0.25 GB); empty arrays and
# objects cost 22x, so their number is capped too, counted over the bytes
# before parsing: 3 per entry (the entry, its shape, its strides), 1 per
# segment, and 65,536 to spare for brackets inside names and metadata.
MAX_ENTRIES = 1 << 18
MAX_BYTES = 256 * MAX_ENTRIES
MAX_CONTAINERS = 4 * MAX_ENTRIES + (1 << 16)
MAX_DIMS = 64  # dimensions of one tensor (weights have a few)
# Digits of one integer literal: MAX_INT_DIGITS, _safetensors' (20 hold any
# u64, the largest value a manifest holds).
_I64 = (1 << 63) - 1  # what torch takes as a size, stride or offset
_U64 = (1 << 64) - 1  # the daemon's ids and generations


class StaleManifest(ManifestError):
    """A segment the manifest names is gone, or was created again since."""


def manifest_name(prefix):
    return prefix + "/manifest"


def segment_prefix(prefix):
    return prefix + "/seg-"


def _json_int(v):
    """v, a JSON integer: TypeError for a float, bool or string, which int()
    would truncate, take, or overflow on (Infinity)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s is not an integer" % _shown(v))
    return v


def tensor_extent(offset, itemsize, shape, strides):
    """One past the last byte a tensor reaches (offset when it is empty)."""
    if any(d == 0 for d in shape):
        return offset
    last = sum((d - 1) * s for d, s in zip(shape, strides))
    return offset + (last + 1) * itemsize


def torch_dtypes(doc, torch):
    """{dtype name: torch.dtype} for every entry of a checked manifest, taken
    from the torch module given (gshm.torch passes the installed one).
    Raises ManifestError naming the first entry whose dtype gshm knows but
    this torch lacks (float8_e4m3fn before torch 2.1), so that attach()
    refuses it before mapping anything."""
    out = {}
    for where in ("tensors", "buffers"):
        for k, e in doc[where].items():
            name = e["dtype"]
            if name in out:
                continue
            t = getattr(torch, name, None)
            if not isinstance(t, torch.dtype):
                raise ManifestError("gshm: manifest %s entry %s has dtype %s, which this torch "
                                    "(%s) lacks" % (where[:-1], _shown(k), name,
                                                    getattr(torch, "__version__", "?")))
            out[name] = t
    return out


def _json_in(v, hi):
    """_json_int(v) within [0, hi]; ValueError outside."""
    v = _json_int(v)
    if not 0 <= v <= hi:
        raise ValueError("%d is outside [0, %d]" % (v, hi))
    return v


def _entry_fields(t):
    """(segment, offset, DType, shape, strides) of an entry, each of its
    JSON type and within int64; TypeError / ValueError / KeyError else."""
    seg = t["segment"]
    if not isinstance(seg, str):
        raise TypeError("segment %s is not a string" % _shown(seg))
    name = t["dtype"]
    if not isinstance(name, str):  # dtype() would ask NumPy about a list or an object
        raise TypeError("dtype %s is not a name" % _shown(name))
    try:
        if len(name) > 64:  # (no dtype's name is: dtype() would quote it whole)
            raise ValueError(name)
        dt = _to_dtype(name)
    except ValueError:
        raise ValueError("unknown dtype %s" % _shown(name)) from None
    try:
        offset = _json_in(t["offset"], _I64)
    except ValueError as e:
        raise ValueError("offset %s" % e) from None
    shape, strides = _json_list(t["shape"]), _json_list(t["strides"])
    if len(shape) > MAX_DIMS or len(strides) > MAX_DIMS:
        raise ValueError("%d dimensions, more than %d" % (max(len(shape), len(strides)),
                                                          MAX_DIMS))
    try:
        return seg, offset, dt, [_json_in(d, _I64) for d in shape], \
            [_json_in(d, _I64) for d in strides]
    except ValueError as e:  # (a TypeError says which value it was)
        raise ValueError("bad shape %s / strides %s: %s" % (_shown(shape), _shown(strides), e)) \
            from None


def _check_entry(where, name, t, segments):
    """The entry t, checked against the segments it may name; raises
    ManifestError naming it."""
    what = "gshm: manifest %s entry %s" % (where, _shown(name))
    try:
        seg, offset, dt, shape, strides = _entry_fields(t)
    except (KeyError, TypeError, ValueError) as e:
        raise ManifestError("%s: %s" % (what, e)) from None
    if seg not in segments:
        raise ManifestError("%s names segment %s, not in its list" % (what, _shown(seg)))
    size = segments[seg]["size"]
    seg_shown = _shown(seg)  # (a name from the manifest, quoted short)
    if len(shape) != len(strides):
        raise ManifestError("%s: bad shape %r / strides %r" % (what, shape, strides))
    if offset % dt.itemsize:
        raise ManifestError("%s: offset %d not aligned to %s" % (what, offset, dt.name))
    end = tensor_extent(offset, dt.itemsize, shape, strides)  # (< 2**134: 64 dims < 2**63)
    if end > size:
        raise ManifestError("%s reaches byte %d of %s (%d bytes)" % (what, end, seg_shown, size))
    # Its elements, counted up to what its segment could hold as distinct
    # ones: a view never claims more (stride 0 would let 2**62 elements sit
    # on one, and every op on it walk them).
    # An empty one too: no dimension longer than its segment could hold
    # (torch sums (size - 1) x stride over them, and [2**62, 2**62, 0]
    # overflowed it into its own error).
    cap = max(1, size // dt.itemsize)
    for d in shape:
        if d > cap:
            raise ManifestError("%s: shape %r has a dimension longer than its segment %s "
                                "holds elements (%d bytes)" % (what, shape, seg_shown, size))
    count = 0 if 0 in shape else 1
    for d in shape if count else ():
        count *= d
        if count * dt.itemsize > size:
            raise ManifestError("%s: shape %r has more elements than its segment %s holds "
                                "(%d bytes)" % (what, shape, seg_shown, size))
    return {"segment": seg, "offset": offset, "dtype": dt.name, "shape": shape,
            "strides": strides}


def encode(location, segments, tensors, buffers=None, metadata=None):
    """The manifest's bytes.  segments: {name: {"id", "generation", "size"}};
    tensors and buffers: {name: {"segment", "offset", "dtype", "shape",
    "strides"}}; metadata: str -> str.  Raises ManifestError where an entry
    does not fit its segment, TypeError for metadata that is not str -> str."""
    segs = {}
    for n, s in segments.items():
        segs[str(n)] = {"id": int(s["id"]), "generation": int(s["generation"]),
                        "size": int(s["size"])}
    meta = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("gshm: manifest metadata must map str to str")
        meta[k] = v
    doc = {"format": FORMAT, "version": VERSION, "location": str(location), "segments": segs,
           "tensors": {k: _check_entry("tensor", k, t, segs) for k, t in tensors.items()},
           "buffers": {k: _check_entry("buffer", k, t, segs) for k, t in (buffers or {}).items()},
           "metadata": meta}
    js = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return struct.pack("<Q", len(js)) + js


def _check_length(n, have):
    """n, a manifest's length field, against the `have` bytes after it and
    MAX_BYTES; raises ManifestError."""
    if n > MAX_BYTES:
        raise ManifestError("gshm: manifest length %d does not fit gshm's limit of %d bytes "
                            "(gshm._manifest.MAX_BYTES)" % (n, MAX_BYTES))
    if n > have:
        raise ManifestError("gshm: manifest length %d does not fit its %d bytes" % (n, have))


def _segments(v):
    """The segment list of a manifest: {name: {"id", "generation", "size"}}."""
    if len(v) > MAX_ENTRIES:
        raise ValueError("%d segments, more than %d" % (len(v), MAX_ENTRIES))
    out = {}
    for k, s in v.items():
        try:
            out[str(k)] = {"id": _json_in(s["id"], _U64),
                           "generation": _json_in(s["generation"], _U64),
                           "size": _json_in(s["size"], _I64)}
        except ValueError as e:  # (a TypeError or KeyError says which field)
            raise ValueError("segment %s: id, generation or size %s" % (_shown(k), e)) from None
    return out


def _json_int_literal(text):
    """json.loads' parse_int: the literal as an int, unless it has more
    digits than _safetensors.MAX_INT_DIGITS (ManifestError, before int() is asked:
    _safetensors._json_int, whose cap this is)."""
    try:
        return _int_literal(text)
    except ValueError as e:
        raise ManifestError("gshm: manifest has %s" % e) from None


def _parse(js):
    """The manifest's JSON (bytes-like, the length field checked), parsed
    and checked.  Raises ManifestError."""
    # Counted before json.loads builds them: empty arrays and objects are
    # the dearest objects per byte it makes (MAX_CONTAINERS above).
    raw = js if isinstance(js, bytes) else bytes(js)
    if raw.count(b"{") + raw.count(b"[") > MAX_CONTAINERS:
        raise ManifestError("gshm: manifest has more objects and arrays than %d entries "
                            "need (%d containers at most)" % (MAX_ENTRIES, MAX_CONTAINERS))
    try:
        doc = json.loads(raw.decode("utf-8"), parse_int=_json_int_literal)
    except ManifestError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # nesting too deep
        raise ManifestError("gshm: manifest is not JSON: %s" % e) from None
    del raw
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError("gshm: not a gshm pool manifest (format %s)"
                            % _shown(doc.get("format") if isinstance(doc, dict) else None))
    if doc.get("version") != VERSION:
        raise ManifestError("gshm: manifest version %s; this gshm reads %d"
                            % (_shown(doc.get("version")), VERSION))
    try:
        segs = _segments(doc["segments"])
        tensors, buffers = doc["tensors"], doc.get("buffers") or {}
        meta = doc.get("metadata") or {}
        location = doc["location"]
        if not isinstance(tensors, dict) or not isinstance(buffers, dict) \
                or not isinstance(meta, dict):
            raise TypeError("tensors, buffers and metadata must be objects")
        if not isinstance(location, str):
            raise TypeError("location %s is not a string" % _shown(location))
        if not all(isinstance(v, str) for v in meta.values()):
            raise TypeError("metadata must map str to str")
        if len(tensors) + len(buffers) > MAX_ENTRIES:
            raise ValueError("%d tensor and buffer entries, more than %d"
                             % (len(tensors) + len(buffers), MAX_ENTRIES))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ManifestError("gshm: bad manifest: %s" % e) from None
    return {"format": FORMAT, "version": VERSION, "location": location, "segments": segs,
            "tensors": {k: _check_entry("tensor", k, t, segs) for k, t in tensors.items()},
            "buffers": {k: _check_entry("buffer", k, t, segs) for k, t in buffers.items()},
            "metadata": dict(meta)}


def decode(data):
    """Parses and checks manifest bytes; returns the dict of encode's form.
    Every entry is checked before it is returned: its dtype known, its
    shape, strides and offset within int64, no more elements than its
    segment could hold, its bytes inside the segment it names.  Raises
    ManifestError (naming the entry), also for a manifest past MAX_BYTES,
    MAX_ENTRIES or MAX_CONTAINERS, refused before it is parsed, or with an
    integer literal of more than _safetensors.MAX_INT_DIGITS digits."""
    data = memoryview(data).cast("B")
    if len(data) < 8:
        raise ManifestError("gshm: manifest too short (%d bytes)" % len(data))
    n = int.from_bytes(data[:8], "little")
    _check_length(n, len(data) - 8)
    return _parse(data[8:8 + n])


def write(client, prefix, data, mode=0o600):
    """Writes manifest bytes to host segment "<prefix>/manifest", replacing
    an earlier one atomically: the bytes go into a hidden segment, which is
    then published over the old one in one step of gshmd, so a reader
    (attach) finds the old manifest or the whole new one, never NotFound
    and never a partial one.  Raises the create's, the write's or the
    publish's error (PermissionDenied: the name is held by a manifest this
    user may not unlink, which stays); a failed write leaves nothing of its
    own (the hidden segment goes with its close).

    A gshmd restart between the create and the publish loses the hidden
    segment (Revoked from the publish): the write is made again, up to
    _RESTART_TRIES times in all, as the named create it replaces would
    have come through the restart.

    Where libgshm or gshmd predates hidden segments (NotImplementedError,
    NotSupported), the old way: unlink, create, copy, with its window in
    which a reader gets NotFound, then ManifestError."""
    name = manifest_name(prefix)
    for attempt in range(_RESTART_TRIES):
        try:
            seg = client.create(name, len(data), location="host", mode=mode, hidden=True)
        except (NotImplementedError, NotSupported):
            return _write_replacing(client, name, data, mode)
        try:
            seg.write(data, 0)
            seg.publish(replace=True)
            return
        except Revoked:
            if attempt + 1 == _RESTART_TRIES:
                raise
        finally:
            seg.close()


# Manifest writes in all when gshmd restarts between a write's hidden
# create and its publish (each restart loses the hidden segment).
_RESTART_TRIES = 3


def _write_replacing(client, name, data, mode):
    """write() for a libgshm or gshmd without hidden segments: not atomic
    (no rename and no replacing create there), so from the old manifest's
    unlink until the new one's create a reader gets NotFound, and until
    the bytes are copied in, ManifestError.  Raises the unlink's error
    (not NotFound: none is fine), the create's, or the write's; a failed
    write leaves no manifest of its own, and its error is the one raised,
    whatever the cleanup meets."""
    try:
        # No exists() first: a manifest another process unlinked between
        # the two failed the write with NotFound.
        client.unlink(name)
    except FileNotFoundError:
        pass
    seg = client.create(name, len(data), location="host", mode=mode)
    try:
        seg.write(data, 0)
    except BaseException:
        mine = seg.info.id
        seg.close()
        try:
            if client.stat(name).id == mine:  # not another writer's, made meanwhile
                client.unlink(name)
        except Exception:
            pass  # (it went meanwhile, or the client did): the write's error is the news
        raise
    seg.close()


def parse_source(source):
    """(peer, name, id, generation) of a pulled segment's source
    "PEER:NAME#ID.GEN", or None when it was not pulled (or says nothing
    parseable)."""
    peer, colon, rest = (source or "").partition(":")
    name, hash_, ids = rest.rpartition("#")
    sid, dot, gen = ids.partition(".")
    if not colon or not hash_ or not dot or not peer or not name:
        return None
    try:
        return peer, name, int(sid), int(gen)
    except ValueError:
        return None


def _resolve_pulled(doc, prefix, source):
    """A manifest pulled from a peer: its segments under the local prefix,
    each remembering the peer's name and ids (open_segments checks them)."""
    src = parse_source(source)
    if src is None or not src[1].endswith("/manifest"):
        return doc
    peer, name = src[0], src[1][:-len("/manifest")]

    def local(n):
        if not n.startswith(name + "/"):
            raise ManifestError("gshm: pulled manifest names segment %s, not under its own "
                                "prefix %r on peer %r" % (_shown(n), name, peer))
        return prefix + n[len(name):]

    for k in ("tensors", "buffers"):
        for e in doc[k].values():
            e["segment"] = local(e["segment"])
    doc["segments"] = {local(n): dict(v, source="%s:%s#%d.%d" % (peer, n, v["id"],
                                                              v["generation"]))
                       for n, v in doc["segments"].items()}
    doc["pulled_from"] = {"peer": peer, "prefix": name}
    return doc


def _check_name(name):
    """A segment name from a manifest, as open_segments() will send it:
    ManifestError for one that no gshm name can be, which Client.open
    refused with a plain ValueError (a NUL byte), a UnicodeEncodeError (a
    lone surrogate) or gshm.InvalidArgument (gshmd's rules, those of
    common/util.c gshm__name_check: 1..GSHM_NAME_MAX bytes, no control
    byte, '/'-separated components, none empty, "." or "..") after the
    segments before it were opened."""
    try:
        b = _enc(name)
    except ValueError:  # (UnicodeEncodeError is one)
        b = None
    if b is None or not 0 < len(b) <= GSHM_NAME_MAX \
            or any(c < 0x20 or c == 0x7F for c in b) \
            or any(comp in (b"", b".", b"..") for comp in b.split(b"/")):
        raise ManifestError("gshm: manifest names segment %s, which is no segment name"
                            % _shown(name))


def read(client, prefix, owner=None):
    """Reads and checks "<prefix>/manifest" (resolved to the local names when
    it was pulled from a peer).  owner: whose the manifest must be
    (owner_uid(); None: the reader's own uid), recorded in the result as
    "owner" for open_segments().  Raises gshm.NotFound when the prefix has
    none (nothing published, or released), UntrustedSegment for a manifest
    of another owner or that others may write (check_owner(), before a
    byte of it is read), ManifestError, also for a manifest naming a
    segment outside "<prefix>/seg-": whoever wrote the manifest must not
    choose which of the reader's other segments open_segments() opens
    (with the reader's rights, "rw" included) and attach() hands out as
    weights."""
    uid = owner_uid(client, owner)
    # Checked on the lease's own record: the segment these bytes are read from.
    with open_owned(client, manifest_name(prefix), "r", uid, "manifest") as seg:
        # The length first, checked against the segment and MAX_BYTES before
        # anything more is read: whoever created "<prefix>/manifest" must
        # not choose how much every reader allocates (the whole segment was
        # once read, twice over: a 16 GiB segment took 32 GiB here).
        size = seg.info.requested_size
        head = seg.read(0, min(8, size))
        if len(head) < 8:
            raise ManifestError("gshm: manifest too short (%d bytes)" % len(head))
        n = int.from_bytes(head, "little")
        _check_length(n, size - 8)
        doc = _parse(seg.read(8, n))
        doc = _resolve_pulled(doc, prefix, seg.info.source)
    for n in doc["segments"]:
        if not n.startswith(segment_prefix(prefix)):
            raise ManifestError("gshm: manifest of %r names segment %s, not one of the pool's "
                                "(%s*)" % (prefix, _shown(n), segment_prefix(prefix)))
        _check_name(n)
    doc["owner"] = uid
    return doc


def open_segments(client, manifest, access="r", owner=None):
    """Opens every segment a manifest names and checks that each is the one
    it recorded and owner's: {name: Segment}.  owner: as owner_uid(); None:
    the manifest's, as read() recorded it (else the reader's own uid).
    Raises StaleManifest (a segment is gone, or was created again: another
    id or generation), UntrustedSegment (check_segment(): another owner's,
    or one that others may write, on the daemon's record of now), the
    errors of Segment.stat(); nothing stays open on error."""
    from ._errors import NotFound
    if owner is None and "owner" in manifest:
        uid = manifest["owner"]
    else:
        uid = owner_uid(client, owner)
    out = {}
    try:
        for name, want in manifest["segments"].items():
            try:
                seg = client.open(name, access)
            except NotFound:
                raise StaleManifest("gshm: manifest names segment %r, which no longer exists "
                                    "(unlinked or released)" % name) from None
            out[name] = seg
            info = seg.info
            if "source" in want:  # pulled with the manifest: the copy of that very segment
                if info.source != want["source"]:
                    raise StaleManifest(
                        "gshm: segment %r is not the copy the pulled manifest describes "
                        "(it came from %r, the manifest says %r)"
                        % (name, info.source or "this node", want["source"]))
            elif info.id != want["id"] or info.generation != want["generation"]:
                raise StaleManifest(
                    "gshm: segment %r was created again since the manifest was written "
                    "(id %d generation %d, manifest says id %d generation %d)"
                    % (name, info.id, info.generation, want["id"], want["generation"]))
            if info.size < want["size"]:
                raise StaleManifest("gshm: segment %r is %d bytes, the manifest says %d"
                                    % (name, info.size, want["size"]))
            check_segment(seg, uid)  # (its record now: seg.info may be a cached lease's)
        return out
    except BaseException:
        for seg in out.values():
            seg.close()
        raise


def unlink_prefix(client, prefix):
    """Unlinks "<prefix>/manifest" and every "<prefix>/seg-*" this client may
    see and unlink; returns the names unlinked.  Memory goes with the last
    lease.  Names another user holds under the prefix (names are first come,
    first served) are passed over: the first of them stopped the cleanup,
    and the caller's own segments listed after it stayed."""
    names = [s.name for s in client.segments()
             if not s.unlinked and (s.name == manifest_name(prefix)
                                    or s.name.startswith(segment_prefix(prefix)))]
    done = []
    from ._errors import NotFound, PermissionDenied
    for n in names:
        try:
            client.unlink(n)
            done.append(n)
        except (NotFound, PermissionDenied):
            pass  # gone meanwhile, or another user's: its owner's or an admin's to unlink
    return done
