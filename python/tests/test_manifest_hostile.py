# SPDX-License-Identifier: Apache-2.0
"""Manifests written by someone else: a cluster key holder whose set pull
brought "<prefix>/manifest" here, or a local user allowed to publish a
prefix that another user attaches.  The reader (gshm._manifest.read and
decode, which gshm.torch.attach calls) checks every entry before anything
is built from it, and refuses with ManifestError naming the entry: no
torch error (a shape of 2**64 elements, a stride past int64) and no
memory or time spent on a manifest larger than any model's before it
says no.  Also the safetensors header of a shared state dict
(load_state_dict, load_arrays) for the shapes torch cannot take.  No torch
needed: the checks are all in gshm._manifest and gshm._safetensors."""

import json
import struct
import subprocess
import sys

import pytest

import gshm_testutil
from gshm import _manifest, _safetensors

MiB = 1 << 20
MAX_ENTRIES = getattr(_manifest, "MAX_ENTRIES", 1 << 18)  # (the old reader had no cap)
MAX_BYTES = min(_manifest.MAX_BYTES, 64 * MiB)
SEG = "p/seg-000000"


def _doc(tensors=None, segments=None, **kw):
    doc = {"format": _manifest.FORMAT, "version": _manifest.VERSION, "location": "cuda:GPU-x",
           "segments": segments if segments is not None else
           {SEG: {"id": 1, "generation": 1, "size": 4096}},
           "tensors": tensors if tensors is not None else {}, "buffers": {}, "metadata": {}}
    doc.update(kw)
    return doc


def _bytes(doc):
    js = json.dumps(doc, separators=(",", ":")).encode()
    return struct.pack("<Q", len(js)) + js


def _one(**kw):
    t = {"segment": SEG, "offset": 0, "dtype": "float32", "shape": [4], "strides": [1]}
    t.update(kw)
    return _bytes(_doc({"w": t}))


_HOSTILE = [
    # stride 0 over a huge shape: its bytes fit (one element), its elements
    # (2**62) do not; torch made a view that every op walked element by element
    (_one(shape=[1 << 62], strides=[0]), "'w'.*elements"),
    (_one(shape=[1 << 40, 1 << 40], strides=[0, 0]), "'w'.*elements"),
    # an element count past int64 (torch raised its own overflow error)
    (_one(shape=[1 << 64], strides=[0]), "'w'.*shape"),
    (_one(shape=[0, 1 << 64], strides=[1, 1]), "'w'.*shape"),
    # empty, with dimensions no segment holds (torch's own size arithmetic
    # overflowed: found in review22)
    (_one(shape=[1 << 62, 1 << 62, 0], strides=[0, 0, 1]), "'w'.*dimension longer"),
    (_one(shape=[0, 1025], strides=[1, 1]), "'w'.*dimension longer"),
    # a stride past int64 on a dimension of 1 (no byte reached, torch refused)
    (_one(shape=[1], strides=[1 << 64]), "'w'.*strides"),
    (_one(offset=1 << 64, shape=[0], strides=[1]), "'w'.*offset"),
    # more dimensions than any weight has
    (_one(shape=[1] * 65, strides=[1] * 65), "'w'.*dimensions"),
    # bytes past the segment it names
    (_one(offset=4096, shape=[1], strides=[1]), "'w' reaches byte"),
    (_one(offset=1 << 62, shape=[1], strides=[1]), "'w' reaches byte"),
    (_one(shape=[2, 2], strides=[1 << 40, 1]), "'w' reaches byte"),
    # dtypes: unknown, or not a name (NumPy took a structured dtype's list)
    (_one(dtype="float99"), "'w'.*dtype"),
    (_one(dtype=[["a", "<f4"]]), "'w'.*dtype"),
    (_one(dtype={"names": ["a"], "formats": ["<f4"]}), "'w'.*dtype"),
    # segment sizes and ids a daemon never gives
    (_bytes(_doc(segments={SEG: {"id": 1, "generation": 1, "size": 1 << 64}})), "size"),
    (_bytes(_doc(segments={SEG: {"id": -1, "generation": 1, "size": 4096}})), "id"),
    # metadata is str -> str as encode() writes it (str() of a nested value
    # was taken)
    (_bytes(_doc(metadata={"k": [1, 2]})), "metadata"),
    (_bytes(_doc(location=["x"])), "location"),
]


@pytest.mark.parametrize("data,message", _HOSTILE, ids=[str(i) for i in range(len(_HOSTILE))])
def test_hostile_entry_is_refused(data, message):
    with pytest.raises(_manifest.ManifestError, match=message):
        _manifest.decode(data)


_BIG = "x" * (8 * MiB)


@pytest.mark.parametrize("where", ["name", "dtype", "segment", "segment_key", "offset",
                                   "shape", "format", "location"])
def test_hostile_values_are_quoted_short(where):
    """Each refusal names the entry or value it refuses with a short repr
    (reprlib: the start of a long string, a few items of a list).  Before,
    the whole value went into the message, once or twice over: a dtype of
    60 MiB made an error of 60 MiB (the reader's peak RSS grew 180 MiB, 3.3
    s), printed whole in a traceback or a service's log."""
    t = {"segment": SEG, "offset": 0, "dtype": "float32", "shape": [4], "strides": [1]}
    segs = {SEG: {"id": 1, "generation": 1, "size": 4096}}
    entry, kw = "w", {}
    if where == "name":
        entry, t["dtype"] = _BIG, "float99"
    elif where in ("dtype", "segment", "offset"):
        t[where] = _BIG
    elif where == "segment_key":
        segs = {_BIG: {"id": -1, "generation": 1, "size": 4096}}
    elif where == "shape":
        t["shape"] = [_BIG]
    else:
        kw[where] = _BIG if where == "format" else [7] * (4 << 20)
    with pytest.raises(_manifest.ManifestError) as e:
        _manifest.decode(_bytes(_doc({entry: t}, segments=segs, **kw)))
    assert len(str(e.value)) < 1000, (where, len(str(e.value)))


def test_stride_zero_within_its_segment_is_taken():
    """An expanded buffer (stride 0) of a published module is fine while it
    names no more elements than its segment's bytes could hold."""
    m = _manifest.decode(_one(shape=[4, 256], strides=[0, 1]))
    assert m["tensors"]["w"]["strides"] == [0, 1]
    m = _manifest.decode(_one(shape=[1024], strides=[0]))
    assert m["tensors"]["w"]["shape"] == [1024]
    with pytest.raises(_manifest.ManifestError, match="elements"):
        _manifest.decode(_one(shape=[1025], strides=[0]))
    # encode() applies the same checks: publish cannot write what attach refuses
    with pytest.raises(_manifest.ManifestError, match="elements"):
        _manifest.encode("x", {SEG: {"id": 1, "generation": 1, "size": 4096}},
                         {"w": {"segment": SEG, "offset": 0, "dtype": "float32",
                                "shape": [1025], "strides": [0]}})


def test_too_many_entries_refused():
    """More tensors than MAX_ENTRIES (each a few bytes): refused before any
    entry is checked or handed on (the old reader took them all)."""
    n = MAX_ENTRIES + 1
    entry = '{"segment":"%s","offset":0,"dtype":"uint8","shape":[],"strides":[]}' % SEG
    head = _bytes(_doc(tensors={"x": {}}))[8:]
    js = head.replace(b'"x":{}', ",".join('"t%d":%s' % (i, entry) for i in range(n)).encode())
    assert len(js) < MAX_BYTES
    data = struct.pack("<Q", len(js)) + js
    with pytest.raises(_manifest.ManifestError, match="entries"):
        _manifest.decode(data)


def test_segment_count_capped():
    segs = {"p/seg-%06d" % i: {"id": i, "generation": 1, "size": 0}
            for i in range(MAX_ENTRIES + 1)}
    with pytest.raises(_manifest.ManifestError, match="segments"):
        _manifest.decode(_bytes(_doc(segments=segs)))


def test_integer_literal_length_capped():
    """An integer literal longer than any u64 is refused while parsing,
    wherever it stands (an unknown key too): int() of one is quadratic,
    unbounded before Python 3.11.  The old reader took a 4,000-digit one
    (under 3.11's 4,300-digit limit) and refused a long offset only as out
    of range, after converting it.  A u64 of 20 digits is still taken."""
    longest = str((1 << 64) - 1)
    assert len(longest) == 20
    segs = {SEG: {"id": int(longest), "generation": 1, "size": 4096}}
    assert _manifest.decode(_bytes(_doc(segments=segs)))["segments"][SEG]["id"] == int(longest)
    for js in (_bytes(_doc(extra=0))[8:].replace(b'"extra":0', b'"extra":' + b"7" * 4000),
               _bytes(_doc(extra=0))[8:].replace(b'"extra":0', b'"extra":-' + b"7" * 21),
               _bytes(_doc(segments=segs))[8:].replace(longest.encode(), longest.encode() + b"0")):
        with pytest.raises(_manifest.ManifestError, match=r"integer of \d+ digits, more than 20"):
            _manifest.decode(struct.pack("<Q", len(js)) + js)


# A reader in a process of its own: its peak RSS before and after read()
# (VmHWM, of this process's memory alone: ru_maxrss keeps the peak of the
# pytest process it was forked from across exec); with a third argument
# "safetensors", of load_arrays (the header parser of
# gshm.torch.load_state_dict, without torch).
_READER = r"""
import json, sys, time
import gshm
from gshm import _manifest, _safetensors

def hwm_kib():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])

c = gshm.Client(sys.argv[1], name="hostile-reader")
if sys.argv[3:] == ["safetensors"]:
    import numpy  # (load_arrays imports it: its 20-odd MiB are no header's)
r0 = hwm_kib()
t0 = time.monotonic()
try:
    if sys.argv[3:] == ["safetensors"]:
        _safetensors.load_arrays(c, sys.argv[2])
    else:
        _manifest.read(c, sys.argv[2])
    err = None
except ValueError as e:  # (ManifestError is one)
    err = str(e)
print(json.dumps({"error": err, "s": time.monotonic() - t0,
                  "grew_kib": hwm_kib() - r0}))
"""


def _read_elsewhere(daemon, prefix, *how):
    p = subprocess.run([sys.executable, "-c", _READER, daemon.socket, prefix] + list(how),
                       env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def _put(client, name, data):
    with client.create(name, len(data), location="host") as seg:
        seg[0:len(data)] = data


@pytest.mark.parametrize("what", ["oversized", "containers"])
def test_hostile_manifest_costs_the_reader_nothing(daemon, client, segname, what):
    """Before: a manifest of up to 256 MiB was read whole and parsed (an
    80 MiB one of blanks was taken, the reader's peak RSS grew by hundreds
    of MiB); 2M empty arrays under a key nobody reads made JSON build 2M
    lists.  Now both are refused from their length and a count over the
    bytes, with little memory and at once."""
    if what == "oversized":
        body = _bytes(_doc(segments={}))[8:]
        js = body + b" " * (80 * MiB - len(body))
    else:
        js = _bytes(_doc(segments={}, padding=[[]] * (2 << 20)))[8:]
        assert len(js) < MAX_BYTES
    _put(client, segname + "/manifest", struct.pack("<Q", len(js)) + js)
    try:
        r = _read_elsewhere(daemon, segname)
    finally:
        client.unlink(segname + "/manifest")
    assert r["error"] is not None, r
    assert "manifest" in r["error"], r
    assert r["grew_kib"] < 32 * 1024, r
    assert r["s"] < 2.0, r


# ----------------------------------------------- safetensors headers

def _st(shape, nbytes=0, **kw):
    t = {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}
    t.update(kw)
    js = json.dumps({"a": t}).encode()
    js += b" " * (-len(js) % 8)
    data = struct.pack("<Q", len(js)) + js + bytes(max(nbytes, 16))
    return lambda off, n: data[off:off + n], len(data)


@pytest.mark.parametrize("shape,nbytes", [([0, 1 << 64], 0), ([1 << 63, 0], 0), ([1] * 65, 4),
                                          ([1 << 62, 1 << 62, 0], 0), ([0, 1 << 32, 1 << 31], 0)])
def test_safetensors_shape_torch_cannot_take(shape, nbytes):
    """A shape with a 0 holds no bytes, so its other dimensions were never
    checked: 2**64 passed parse(), and torch raised its own error on the
    view.  Dimensions are int64 and at most 64 of them, and so is the
    product of those that are not 0 ([2**62, 2**62, 0] passed, each
    dimension within int64, and torch's size arithmetic overflowed)."""
    read, size = _st(shape, nbytes)
    with pytest.raises(ValueError, match="'a'"):
        _safetensors.parse(read, size)


def test_safetensors_empty_tensor_with_long_dimensions_is_taken():
    """An empty tensor's other dimensions may be longer than the file
    holds elements (as torch allows): only their product is capped."""
    read, size = _st([0, 1 << 40, 1 << 20], 0)
    meta, entries = _safetensors.parse(read, size)
    assert entries[0][2] == (0, 1 << 40, 1 << 20), entries


def test_safetensors_integer_literal_length_capped():
    """A safetensors header's integer literal longer than any u64 is
    refused while parsing, as a manifest's is (the old parser converted a
    4,000-digit one, quadratic before Python 3.11); 20 digits still parse
    (and are then out of the segment)."""
    read, size = _st([4], 16)
    data = read(0, size)
    js = data[8:8 + struct.unpack("<Q", data[:8])[0]]
    for lit in (b"7" * 4000, b"-" + b"7" * 21):
        bad = js.replace(b'"data_offsets": [0, 16]', b'"data_offsets": [0, 16], "x": ' + lit)
        bad += b" " * (-len(bad) % 8)
        blob = struct.pack("<Q", len(bad)) + bad + bytes(16)
        with pytest.raises(ValueError, match=r"integer of \d+ digits, more than 20"):
            _safetensors.parse(lambda off, n: blob[off:off + n], len(blob))
    ok = js.replace(b"[0, 16]", b"[0, 18446744073709551615]")
    ok += b" " * (-len(ok) % 8)
    blob = struct.pack("<Q", len(ok)) + ok + bytes(16)
    with pytest.raises(ValueError, match="offsets"):
        _safetensors.parse(lambda off, n: blob[off:off + n], len(blob))


@pytest.mark.parametrize("what", ["oversized", "containers"])
def test_hostile_safetensors_header_costs_the_reader_nothing(daemon, client, segname, what):
    """A state dict segment another user wrote (names are first come, first
    served), read with load_arrays or gshm.torch.load_state_dict.  Before:
    its header was parsed whole up to 100 MiB, with no count of its
    containers: 2M empty arrays (6 MiB) made the reader's peak RSS grow
    by 190 MiB, 100 MiB of them by 2.4 GiB (43 s); an 80 MiB header of
    blanks was read, decoded and taken (256 MiB).  Now both are refused
    from their length and a count over the bytes, as a manifest's are."""
    if what == "oversized":
        body = b'{"__metadata__":{}}'
        js = body + b" " * (80 * MiB - len(body))
    else:
        js = json.dumps({"__metadata__": {}, "a": {"dtype": "F32", "shape": [],
                                                   "data_offsets": [0, 4]},
                         "pad": [[]] * (2 << 20)}).encode()
        js += b" " * (-len(js) % 8)
        assert len(js) < 16 * MiB
    _put(client, segname, struct.pack("<Q", len(js)) + js + bytes(8))
    try:
        r = _read_elsewhere(daemon, segname, "safetensors")
    finally:
        client.unlink(segname)
    assert r["error"] is not None, r
    assert "safetensors" in r["error"], r
    assert r["grew_kib"] < 32 * 1024, r
    assert r["s"] < 2.0, r


@pytest.mark.parametrize("tail", ["x\u0000y", "\ud800", "x" * 300, "x\x01", "x\x7f", "x//y",
                                  "x/./y", "x/..", "x/"],
                         ids=["nul", "surrogate", "long", "control", "del", "empty", "dot",
                              "dotdot", "trailing"])
def test_manifest_segment_name_that_is_no_name(daemon, client, segname, tail):
    """A manifest naming a segment that no gshm name can be (a NUL byte, a
    lone surrogate, more than GSHM_NAME_MAX bytes, a control byte, an
    empty, "." or ".." component) under the pool's prefix is refused by
    read() as a ManifestError; open_segments() raised a plain ValueError
    ("contains a NUL byte"), a UnicodeEncodeError or gshm.InvalidArgument
    instead, after opening the segments before it."""
    bad = segname + "/seg-" + tail
    segs = {bad: {"id": 1, "generation": 1, "size": 4096}}
    _put(client, segname + "/manifest", _bytes(_doc(segments=segs)))
    try:
        with pytest.raises(_manifest.ManifestError, match="no segment name"):
            man = _manifest.read(client, segname)
            _manifest.open_segments(client, man)
    finally:
        client.unlink(segname + "/manifest")
