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

Nothing here needs torch or a GPU."""

import json
import struct

from ._dtypes import dtype as _to_dtype
from ._safetensors import _json_list

__all__ = ["FORMAT", "VERSION", "ManifestError", "StaleManifest", "manifest_name",
           "segment_prefix", "encode", "decode", "tensor_extent", "write", "read",
           "open_segments", "unlink_prefix", "parse_source"]

FORMAT = "gshm.torch.pool"
VERSION = 1
MAX_BYTES = 256 << 20  # a manifest larger than this is not one


class ManifestError(ValueError):
    """The manifest is not one gshm wrote, or does not fit its segments."""


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
        raise TypeError("%r is not an integer" % (v,))
    return v


def tensor_extent(offset, itemsize, shape, strides):
    """One past the last byte a tensor reaches (offset when it is empty)."""
    if any(d == 0 for d in shape):
        return offset
    last = sum((d - 1) * s for d, s in zip(shape, strides))
    return offset + (last + 1) * itemsize


def _check_entry(where, name, t, segments):
    try:
        seg = t["segment"]
        if not isinstance(seg, str):
            raise TypeError("segment %r is not a string" % (seg,))
        offset = _json_int(t["offset"])
        dt = _to_dtype(t["dtype"])
        shape = [_json_int(d) for d in _json_list(t["shape"])]
        strides = [_json_int(s) for s in _json_list(t["strides"])]
    except (KeyError, TypeError, ValueError) as e:
        raise ManifestError("gshm: manifest %s entry %r: %s" % (where, name, e)) from None
    if seg not in segments:
        raise ManifestError("gshm: manifest %s entry %r names segment %r, not in its list"
                            % (where, name, seg))
    if len(shape) != len(strides) or any(d < 0 for d in shape) or any(s < 0 for s in strides):
        raise ManifestError("gshm: manifest %s entry %r: bad shape %r / strides %r"
                            % (where, name, shape, strides))
    if offset < 0 or offset % dt.itemsize:
        raise ManifestError("gshm: manifest %s entry %r: offset %d not aligned to %s"
                            % (where, name, offset, dt.name))
    end = tensor_extent(offset, dt.itemsize, shape, strides)
    if end > segments[seg]["size"]:
        raise ManifestError("gshm: manifest %s entry %r reaches byte %d of %r (%d bytes)"
                            % (where, name, end, seg, segments[seg]["size"]))
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


def decode(data):
    """Parses and checks manifest bytes; returns the dict of encode's form.
    Raises ManifestError."""
    data = bytes(data)
    if len(data) < 8:
        raise ManifestError("gshm: manifest too short (%d bytes)" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8 or n > MAX_BYTES:
        raise ManifestError("gshm: manifest length %d does not fit its %d bytes" % (n, len(data)))
    try:
        doc = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # nesting too deep
        raise ManifestError("gshm: manifest is not JSON: %s" % e) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError("gshm: not a gshm pool manifest (format %r)"
                            % (doc.get("format") if isinstance(doc, dict) else None))
    if doc.get("version") != VERSION:
        raise ManifestError("gshm: manifest version %r; this gshm reads %d"
                            % (doc.get("version"), VERSION))
    try:
        segs = {str(k): {"id": _json_int(v["id"]), "generation": _json_int(v["generation"]),
                         "size": _json_int(v["size"])} for k, v in doc["segments"].items()}
        tensors, buffers = doc["tensors"], doc.get("buffers") or {}
        meta = doc.get("metadata") or {}
        location = str(doc["location"])
        if not isinstance(tensors, dict) or not isinstance(buffers, dict) \
                or not isinstance(meta, dict):
            raise TypeError("tensors, buffers and metadata must be objects")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ManifestError("gshm: bad manifest: %s" % e) from None
    return {"format": FORMAT, "version": VERSION, "location": location, "segments": segs,
            "tensors": {k: _check_entry("tensor", k, t, segs) for k, t in tensors.items()},
            "buffers": {k: _check_entry("buffer", k, t, segs) for k, t in buffers.items()},
            "metadata": {str(k): str(v) for k, v in meta.items()}}


def write(client, prefix, data, mode=0o600):
    """Writes manifest bytes to host segment "<prefix>/manifest", replacing
    an earlier one."""
    name = manifest_name(prefix)
    if client.exists(name):
        client.unlink(name)
    seg = client.create(name, len(data), location="host", mode=mode)
    try:
        seg.write(data, 0)
    except BaseException:
        seg.close()
        client.unlink(name)
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
            raise ManifestError("gshm: pulled manifest names segment %r, not under its own "
                                "prefix %r on peer %r" % (n, name, peer))
        return prefix + n[len(name):]

    for k in ("tensors", "buffers"):
        for e in doc[k].values():
            e["segment"] = local(e["segment"])
    doc["segments"] = {local(n): dict(v, source="%s:%s#%d.%d" % (peer, n, v["id"],
                                                              v["generation"]))
                       for n, v in doc["segments"].items()}
    doc["pulled_from"] = {"peer": peer, "prefix": name}
    return doc


def read(client, prefix):
    """Reads and checks "<prefix>/manifest" (resolved to the local names when
    it was pulled from a peer).  Raises gshm.NotFound when the prefix has
    none (nothing published, or released), ManifestError, also for a
    manifest naming a segment outside "<prefix>/seg-": whoever wrote the
    manifest must not choose which of the reader's other segments
    open_segments() opens (with the reader's rights, "rw" included) and
    attach() hands out as weights."""
    with client.open(manifest_name(prefix), "r") as seg:
        # The length first: reading the whole segment before decode() checks
        # it against MAX_BYTES let whoever created "<prefix>/manifest" make
        # the reader allocate twice the segment's size (a 16 GiB segment:
        # 32 GiB in this process).
        size = seg.info.requested_size
        head = seg.read(0, min(8, size))
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        fits = len(head) == 8 and n <= min(size - 8, MAX_BYTES)
        doc = decode(head + (seg.read(8, n) if fits else b""))  # else decode() says why
        doc = _resolve_pulled(doc, prefix, seg.info.source)
    for n in doc["segments"]:
        if not n.startswith(segment_prefix(prefix)):
            raise ManifestError("gshm: manifest of %r names segment %r, not one of the pool's "
                                "(%s*)" % (prefix, n, segment_prefix(prefix)))
    return doc


def open_segments(client, manifest, access="r"):
    """Opens every segment a manifest names and checks that each is the one
    it recorded: {name: Segment}.  Raises StaleManifest (a segment is gone,
    or was created again: another id or generation); nothing stays open on
    error."""
    from ._errors import NotFound
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
        return out
    except BaseException:
        for seg in out.values():
            seg.close()
        raise


def unlink_prefix(client, prefix):
    """Unlinks "<prefix>/manifest" and every "<prefix>/seg-*" this client may
    see; returns the names unlinked.  Memory goes with the last lease."""
    names = [s.name for s in client.segments()
             if not s.unlinked and (s.name == manifest_name(prefix)
                                    or s.name.startswith(segment_prefix(prefix)))]
    done = []
    from ._errors import NotFound
    for n in names:
        try:
            client.unlink(n)
            done.append(n)
        except NotFound:
            pass
    return done
