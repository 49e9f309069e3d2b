# SPDX-License-Identifier: Apache-2.0
"""The PyTorch pool's parts that need no GPU and no torch: the manifest
format and its checks against real (host) segments, the owner pinning of
attach and of load_arrays (load_state_dict's half without torch), the C
pool's refusals of bad configuration, the safetensors copy plan and the
allocator-settings check.  The GPU half is tests/test_torch_pool_gpu.py
(and load_state_dict's owner tests, tests/test_gpu.py)."""

import ctypes
import errno
import json
import os
import pwd
import random
import struct
import subprocess
import types

import pytest

import gshm
import gshm_testutil
from gshm import _cuda, _manifest, _safetensors, _torch_conf
from gshm import _lib as L

MiB = 1 << 20


def _seginfo(seg):
    return {"id": seg.info.id, "generation": seg.info.generation, "size": seg.info.size}


def _entry(seg, offset=0, dtype="float32", shape=(4,), strides=(1,)):
    return {"segment": seg, "offset": offset, "dtype": dtype, "shape": list(shape),
            "strides": list(strides)}


# ---------------------------------------------------------------- manifest

def test_manifest_round_trip():
    segs = {"p/seg-000000": {"id": 3, "generation": 1, "size": 4096},
            "p/seg-000001": {"id": 4, "generation": 2, "size": 8192}}
    tensors = {"w": _entry("p/seg-000000", 256, "bfloat16", (8, 16), (16, 1)),
               "t": _entry("p/seg-000001", 0, "float32", (16, 8), (1, 16)),  # transposed
               "empty": _entry("p/seg-000001", 8192, "float32", (0, 3), (3, 1))}
    data = _manifest.encode("cuda:GPU-x", segs, tensors, {"rope": _entry("p/seg-000000")},
                            {"model": "llama"})
    (n,) = struct.unpack("<Q", data[:8])
    assert n == len(data) - 8
    doc = json.loads(data[8:])
    assert doc["format"] == "gshm.torch.pool" and doc["version"] == 1
    m = _manifest.decode(data)
    assert m["segments"] == segs
    assert m["tensors"] == tensors
    assert m["buffers"]["rope"]["offset"] == 0
    assert m["metadata"] == {"model": "llama"}
    assert m["location"] == "cuda:GPU-x"
    # the extent of a strided tensor: last element + 1
    assert _manifest.tensor_extent(256, 2, [8, 16], [16, 1]) == 256 + 128 * 2
    assert _manifest.tensor_extent(0, 4, [16, 8], [1, 16]) == (15 + 7 * 16 + 1) * 4
    assert _manifest.tensor_extent(64, 4, [0, 3], [3, 1]) == 64


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d[:5], "too short"),
    (lambda d: struct.pack("<Q", 1 << 40) + d[8:], "does not fit"),
    (lambda d: d[:8] + b"\xff" + d[9:], "not JSON"),
    (lambda d: _redo(d, format="safetensors"), "not a gshm pool manifest"),
    (lambda d: _redo(d, version=2), "version 2"),
    (lambda d: _redo(d, segments=None), "bad manifest"),
    (lambda d: _redo_tensor(d, offset=4088), "reaches byte"),
    (lambda d: _redo_tensor(d, offset=2), "not aligned"),
    (lambda d: _redo_tensor(d, segment="p/seg-000009"), "not in its list"),
    (lambda d: _redo_tensor(d, strides=[-1]), "bad shape"),
    (lambda d: _redo_tensor(d, dtype="float99"), "entry 'w'"),
    (lambda d: _redo_tensor(d, shape=None), "entry 'w'"),
    # A manifest another user wrote: values of the wrong JSON type raised
    # TypeError (an unhashable segment), OverflowError (Infinity) or
    # RecursionError (deep nesting), or were taken by int() ("8", 8.5, "12"
    # as a shape of (1, 2)), instead of ManifestError.
    (lambda d: _redo_tensor(d, segment=["p/seg-000000"]), "entry 'w'"),
    (lambda d: _redo_tensor(d, offset="8"), "entry 'w'"),
    (lambda d: _redo_tensor(d, offset=8.5), "entry 'w'"),
    (lambda d: _redo_tensor(d, offset=True), "entry 'w'"),
    (lambda d: _redo_tensor(d, shape="12", strides=[1, 1]), "entry 'w'"),
    (lambda d: _redo_tensor(d, shape=[float("inf")]), "entry 'w'"),
    (lambda d: _redo(d, segments={"p/seg-000000": {"id": 1, "generation": 1,
                                                   "size": float("inf")}}), "bad manifest"),
    (lambda d: struct.pack("<Q", 100000) + b"[" * 100000, "not JSON"),
])
def test_manifest_refuses_bad_input(mutate, message):
    good = _manifest.encode("cuda:GPU-x", {"p/seg-000000": {"id": 1, "generation": 1,
                                                            "size": 4096}},
                            {"w": _entry("p/seg-000000", 0, "float32", (4,), (1,))})
    with pytest.raises(_manifest.ManifestError, match=message):
        _manifest.decode(mutate(good))


def _redo(data, **kw):
    doc = json.loads(data[8:])
    doc.update(kw)
    js = json.dumps(doc).encode()
    return struct.pack("<Q", len(js)) + js


def _redo_tensor(data, **kw):
    doc = json.loads(data[8:])
    doc["tensors"]["w"].update(kw)
    js = json.dumps(doc).encode()
    return struct.pack("<Q", len(js)) + js


def test_manifest_encode_checks():
    segs = {"p/seg-000000": {"id": 1, "generation": 1, "size": 64}}
    with pytest.raises(_manifest.ManifestError, match="reaches byte"):
        _manifest.encode("x", segs, {"w": _entry("p/seg-000000", 0, "float32", (17,), (1,))})
    with pytest.raises(TypeError):
        _manifest.encode("x", segs, {}, metadata={"k": 1})


def test_manifest_dtype_this_torch_lacks():
    """A manifest naming a dtype gshm knows that the installed torch lacks
    (float8_e4m3fn before torch 2.1): attach() raised a bare AttributeError
    from getattr(torch, name) after mapping; now ManifestError naming the
    entry and the dtype, before anything is opened.  A stand-in module
    plays that older torch here (no torch needed); role_limits in
    test_torch_pool_gpu.py deletes the attribute from the real one."""
    class dtype(object):
        pass
    older = types.ModuleType("torch")
    older.__version__ = "2.0.1"
    older.dtype = dtype
    older.float32 = dtype()
    older.float8_e4m3fn = len  # an attribute of that name, but no dtype
    segs = {"p/seg-000000": {"id": 3, "generation": 1, "size": 4096}}
    m = _manifest.decode(_manifest.encode("cuda:GPU-x", segs, {
        "w": _entry("p/seg-000000"),
        "w_scale": _entry("p/seg-000000", 64, "float8_e4m3fn", (8,), (1,))}))
    with pytest.raises(_manifest.ManifestError,
                       match=r"tensor entry 'w_scale' has dtype float8_e4m3fn, which this "
                             r"torch \(2.0.1\) lacks"):
        _manifest.torch_dtypes(m, older)
    older.float8_e4m3fn = dtype()
    got = _manifest.torch_dtypes(m, older)
    assert got == {"float32": older.float32, "float8_e4m3fn": older.float8_e4m3fn}


# ---------------------------------------- manifests against real segments

def _fake_pool(client, prefix, n=2):
    segs = [client.create("%s/seg-%06d" % (prefix, i), 4096, location="host")
            for i in range(n)]
    info = {s.name: _seginfo(s) for s in segs}
    tensors = {"w%d" % i: _entry(s.name, 0, "float32", (8,), (1,)) for i, s in enumerate(segs)}
    _manifest.write(client, prefix, _manifest.encode("host", info, tensors))
    for s in segs:
        s.close()
    return [s.name for s in segs]


def _my_leases(client):
    pid = os.getpid()
    return [l for l in client.leases() if l.pid == pid]


def test_manifest_write_read_open_and_unlink_prefix(client, segname):
    names = _fake_pool(client, segname)
    m = _manifest.read(client, segname)
    assert sorted(m["segments"]) == names
    segs = _manifest.open_segments(client, m)
    assert sorted(segs) == names
    for s in segs.values():
        s.close()
    # publishing again replaces the manifest
    _manifest.write(client, segname, _manifest.encode("host", {}, {}))
    assert _manifest.read(client, segname)["tensors"] == {}
    client.create(segname + "-other/seg-000000", 4096, location="host").close()
    done = _manifest.unlink_prefix(client, segname)
    assert sorted(done) == sorted(names + [segname + "/manifest"])
    assert client.exists(segname + "-other/seg-000000")  # another prefix is left alone
    client.unlink(segname + "-other/seg-000000")
    with pytest.raises(gshm.NotFound):
        _manifest.read(client, segname)
    assert _manifest.unlink_prefix(client, segname) == []


# The owner's cleanup, as a user that is no admin: {"done", "left"}.
_OWNER = r"""
import json, sys
import gshm
from gshm import _manifest
with gshm.Client(sys.argv[1], name="owner") as c:
    mine = [sys.argv[2] + "/seg-%06d" % i for i in (1, 2)]
    for n in mine:
        c.create(n, 4096, location="host").close()
    try:
        done = _manifest.unlink_prefix(c, sys.argv[2])
    except gshm.Error as e:
        done = repr(e)
    print(json.dumps({"done": done, "left": [n for n in mine if c.exists(n)]}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")
def test_unlink_prefix_passes_over_another_users_names():
    """Names are first come, first served: another user may create
    "<prefix>/manifest" or "<prefix>/seg-..." under a prefix it does not
    own (mode 0644, so that the owner lists them).  unlink_prefix (the
    cleanup after a pool's process died) stopped at the first it could not
    unlink (PermissionDenied), so the owner's own segments after it stayed,
    their memory charged to the owner.  Now it passes over names it may
    not unlink and unlinks all of the caller's."""
    d = gshm_testutil.Daemon(args=["--set", "daemon.socket_mode=0666"]).start()
    try:
        os.chmod(d.tmpdir, 0o755)
        prefix = "victim/pool"
        for n in ("/manifest", "/seg-000000"):  # listed before the owner's own (lower ids)
            p = subprocess.run([gshm_testutil.gshmctl_path(), "--socket", d.socket, "create",
                                prefix + n, "4096", "--mode", "0644"],
                               preexec_fn=gshm_testutil.as_uid(65534), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=30)
            assert p.returncode == 0, p.stderr.decode()
        p = gshm_testutil.run_as(d, 65533, _OWNER, prefix)
        assert p.returncode == 0, p.stderr.decode()
        r = json.loads(p.stdout)
        assert r == {"done": [prefix + "/seg-000001", prefix + "/seg-000002"], "left": []}, r
        assert d.gshmctl("--json", "segments").stdout.count(b"victim/pool/") == 2  # nobody's
    finally:
        d.stop()


# A user publishing its own prefix (host segments stand for the pool's),
# or planting names under one it does not own: argv socket, prefix, what
# ("pool": a manifest and its segment; "segment": the segment alone), mode.
# Prints the segment list the manifest would record.
_PUBLISH = r"""
import json, sys
import gshm
from gshm import _manifest
sock, prefix, what, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4], 8)
with gshm.Client(sock, name="publisher") as c:
    with c.create(prefix + "/seg-000000", 4096, location="host", mode=mode) as seg:
        seg.write(b"\x7f" * 32, 0)  # its weights
        info = {seg.name: {"id": seg.info.id, "generation": seg.info.generation,
                           "size": seg.info.size}}
    if what == "pool":
        _manifest.write(c, prefix, _manifest.encode("host", info, {"w": {
            "segment": prefix + "/seg-000000", "offset": 0, "dtype": "float32", "shape": [8],
            "strides": [1]}}), mode=mode)
print(json.dumps(info))
"""

# A reader (attach's manifest half) as a user that is no admin: argv
# socket, then prefixes; prints {prefix: "ok" or the error}.
_READ = r"""
import json, sys
import gshm
from gshm import _manifest
out = {}
with gshm.Client(sys.argv[1], name="reader") as c:
    for prefix in sys.argv[2:]:
        try:
            for s in _manifest.open_segments(c, _manifest.read(c, prefix)).values():
                s.close()
            out[prefix] = "ok"
        except (ValueError, gshm.Error) as e:
            out[prefix] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def _as(d, uid, script, *args):
    p = gshm_testutil.run_as(d, uid, script, *args)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def _refuses_bad_owners(load):
    """load(owner) refuses an owner that is no uid (a bool, a float, one
    outside [0, 2**32 - 2]) or no user's name."""
    with pytest.raises(ValueError, match="no user named"):
        load("no-such-user-gshm")
    for bad in (True, -1, 1 << 32, 1.0):
        with pytest.raises((TypeError, ValueError)):
            load(bad)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")
def test_attach_refuses_a_prefix_another_user_planted():
    """Names are first come, first served: another user (nobody) may create
    "<prefix>/manifest" before the publisher does (or after a release, or
    in the gap of a republish's unlink and create), naming segments of its
    own under "<prefix>/seg-", with its own ids.  read() and
    open_segments() took it, and attach() handed nobody's bytes out as the
    reader's weights.  Now they expect the prefix to be the reader's own
    uid's (as gshmd knows it) unless told another owner, and refuse any
    segment of the prefix that someone else owns, naming both."""
    d = gshm_testutil.Daemon(args=["--set", "daemon.socket_mode=0666"]).start()
    try:
        os.chmod(d.tmpdir, 0o755)
        _as(d, 65533, _PUBLISH, "mine/llama", "pool", "0600")        # the reader's own
        planted = _as(d, 65534, _PUBLISH, "mine/poisoned", "pool", "0644")
        got = _as(d, 65533, _READ, "mine/llama", "mine/poisoned")
        assert got["mine/llama"] == "ok", got
        assert got["mine/poisoned"].startswith("UntrustedSegment: "), got
        assert "'mine/poisoned/manifest' is owned by uid 65534" in got["mine/poisoned"], got
        assert "expects uid 65533" in got["mine/poisoned"], got
        assert list(planted) == ["mine/poisoned/seg-000000"]
        # root's manifest, naming a segment nobody holds under its prefix
        # (its recorded id and generation, so not stale): refused by name
        seg = _as(d, 65534, _PUBLISH, "mine/poisoned-seg", "segment", "0644")
        with gshm.Client(d.socket) as c:
            _manifest.write(c, "mine/poisoned-seg", _manifest.encode(
                "host", seg, {"w": _entry("mine/poisoned-seg/seg-000000", 0, "float32", (8,),
                                          (1,))}), mode=0o644)
            m = _manifest.read(c, "mine/poisoned-seg")  # root's own manifest
            with pytest.raises(_manifest.UntrustedSegment,
                               match=r"'mine/poisoned-seg/seg-000000' is owned by uid 65534.*"
                                     r"expects uid 0"):
                _manifest.open_segments(c, m)
            assert [l for l in c.leases() if l.pid == os.getpid()] == []
            # another user's model, attached on purpose: by uid or by name
            for owner in (65534, pwd.getpwuid(65534).pw_name):
                m = _manifest.read(c, "mine/poisoned", owner=owner)
                for s in _manifest.open_segments(c, m).values():
                    assert s.info.uid == 65534
                    s.close()
                with pytest.raises(_manifest.UntrustedSegment,
                                   match="'mine/poisoned-seg/manifest' is owned by uid 0"):
                    _manifest.read(c, "mine/poisoned-seg", owner=owner)
            _refuses_bad_owners(lambda owner: _manifest.read(c, "mine/poisoned", owner=owner))
    finally:
        d.stop()


def test_manifest_refuses_segments_others_may_write(daemon, client, segname):
    """A segment of the prefix that its group or others may write (mode
    0o620, 0o602) lets them change the weights under the reader; the owner
    pinning means nothing then.  read() refuses such a manifest,
    open_segments() such a segment."""
    names = _fake_pool(client, segname)
    for mode in (0o620, 0o602, 0o666):
        daemon.gshmctl("chmod", segname + "/manifest", "%04o" % mode)
        with pytest.raises(_manifest.UntrustedSegment, match="%04o" % mode):
            _manifest.read(client, segname)
    daemon.gshmctl("chmod", segname + "/manifest", "%04o" % 0o644)
    m = _manifest.read(client, segname)
    daemon.gshmctl("chmod", names[1], "%04o" % 0o660)
    with pytest.raises(_manifest.UntrustedSegment,
                       match=r"'%s' .*mode 0660: others than its owner may write it" % names[1]):
        _manifest.open_segments(client, m)
    assert _my_leases(client) == []
    daemon.gshmctl("chmod", names[1], "%04o" % 0o640)
    for s in _manifest.open_segments(client, m).values():
        s.close()
    _manifest.unlink_prefix(client, segname)


# A user sharing NumPy arrays under a name, its own or one it plants for
# another user to load: argv socket, name, mode (octal).
_SHARE = r"""
import sys
import numpy
import gshm
from gshm import _safetensors
with gshm.Client(sys.argv[1], name="sharer") as c:
    _safetensors.share_arrays(c, sys.argv[2], {"w": numpy.full(8, 7, numpy.float32)},
                              mode=int(sys.argv[3], 8)).close()
print("{}")
"""

# A loader (load_arrays) as a user that is no admin: argv socket, owner
# ("-": none passed, the default), then names; prints {name: "ok SUM" or
# the error}, and the leases this process still holds after them.
_LOAD = r"""
import json, os, sys
import gshm
from gshm import _safetensors
kw = {} if sys.argv[2] == "-" else {"owner": int(sys.argv[2]) if sys.argv[2].isdigit()
                                    else sys.argv[2]}
out = {}
with gshm.Client(sys.argv[1], name="loader") as c:
    for name in sys.argv[3:]:
        try:
            out[name] = "ok %s" % float(_safetensors.load_arrays(c, name, **kw)["w"].sum())
        except (ValueError, gshm.Error) as e:
            out[name] = "%s: %s" % (type(e).__name__, e)
    out["leases"] = len([l for l in c.leases() if l.pid == os.getpid()])
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")
def test_load_arrays_refuses_a_name_another_user_planted():
    """Names are first come, first served: another user (nobody) may create
    the name a state dict is shared under before its owner does (or after
    an unlink), with bytes of its own.  load_arrays (the NumPy half of
    gshm.torch.load_state_dict, which shares its check) took any segment
    by that name and handed nobody's bytes out as the reader's data.  Now
    it expects the segment to be the reader's own uid's unless told
    another owner, as attach() does, and refuses it naming both."""
    d = gshm_testutil.Daemon(args=["--set", "daemon.socket_mode=0666"]).start()
    try:
        os.chmod(d.tmpdir, 0o755)
        _as(d, 65533, _SHARE, "mine/arrays", "0600")      # the reader's own
        _as(d, 65534, _SHARE, "mine/planted", "0644")     # nobody's, under the reader's name
        got = _as(d, 65533, _LOAD, "-", "mine/arrays", "mine/planted")
        assert got["mine/arrays"] == "ok 56.0", got
        assert got["mine/planted"].startswith("UntrustedSegment: "), got
        assert "'mine/planted' is owned by uid 65534" in got["mine/planted"], got
        assert "expects uid 65533" in got["mine/planted"], got
        assert got["leases"] == 0, got  # the refused lease is given back at once
        # the reader's own uid named explicitly: the same refusal
        got = _as(d, 65533, _LOAD, 65533, "mine/planted")
        assert got["mine/planted"].startswith("UntrustedSegment: "), got
        # another user's arrays, loaded on purpose: by uid or by name
        for owner in (65534, pwd.getpwuid(65534).pw_name):
            got = _as(d, 65533, _LOAD, owner, "mine/planted", "mine/arrays")
            assert got["mine/planted"] == "ok 56.0", got
            assert "'mine/arrays' is owned by uid 65533" in got["mine/arrays"], got
        # root (an admin: it may open any name) is pinned all the same
        with gshm.Client(d.socket) as c:
            with pytest.raises(_manifest.UntrustedSegment,
                               match="'mine/planted' is owned by uid 65534.*expects uid 0"):
                _safetensors.load_arrays(c, "mine/planted")
            assert [l for l in c.leases() if l.pid == os.getpid()] == []
            _refuses_bad_owners(lambda owner: _safetensors.load_arrays(c, "mine/planted",
                                                                        owner=owner))
    finally:
        d.stop()


def test_load_arrays_refuses_a_segment_others_may_write(daemon, client, segname):
    """A state dict segment that its group or others may write lets them
    change the data under the reader: load_arrays took it.  Now it refuses
    it (check_owner, as attach() does), whoever the owner."""
    import numpy
    _safetensors.share_arrays(client, segname, {"w": numpy.arange(8, dtype=numpy.int32)}).close()
    for mode in (0o620, 0o602, 0o666):
        daemon.gshmctl("chmod", segname, "%04o" % mode)
        with pytest.raises(_manifest.UntrustedSegment,
                           match=r"'%s' .*mode %04o: others than its owner may write it"
                                 % (segname, mode)):
            _safetensors.load_arrays(client, segname)
        assert _my_leases(client) == []
    daemon.gshmctl("chmod", segname, "%04o" % 0o640)
    assert _safetensors.load_arrays(client, segname)["w"].tolist() == list(range(8))
    client.unlink(segname)


def _mapped(name):
    """This process's mappings of host segment `name` (its memfd, whose
    name gshmd cuts to 63 bytes)."""
    key = "/memfd:" + ("gshm:" + name)[:63]
    with open("/proc/self/maps") as f:
        return [line for line in f if key in line]


def test_share_arrays_failure_unmaps_while_the_exception_lives(client, segname, monkeypatch):
    """share_arrays interrupted midway (Ctrl-C during the copy) unlinked the
    segment, but its memoryview stayed in the frame that the exception's
    traceback keeps: close() could not unmap, and the segment's memory
    stayed until the caller dropped the exception (a retry in the handler
    held two copies)."""
    import numpy
    real = memoryview

    class Interrupted(object):  # a memoryview whose second store is interrupted
        def __init__(self, obj):
            self.mv, self.stores = real(obj), 0

        def __setitem__(self, key, value):
            self.stores += 1
            if self.stores == 2:
                raise KeyboardInterrupt
            self.mv[key] = value

        def release(self):
            self.mv.release()

    monkeypatch.setattr(_safetensors, "memoryview", Interrupted, raising=False)
    kept = None
    try:
        _safetensors.share_arrays(client, segname, {"a": numpy.arange(1 << 16),
                                                    "b": numpy.arange(1 << 16)})
    except KeyboardInterrupt as e:
        kept = e  # with its traceback, as a handler that retries holds it
    assert kept is not None and not client.exists(segname)
    assert _my_leases(client) == []
    assert _mapped(segname) == []
    del kept


def test_owner_check_sees_a_chmod_since_a_cached_lease(daemon, client, segname):
    """A second load of a name this client still holds is served from the
    held lease (libgshm's cache), whose record (seg.info) predates a chmod
    since: the check on it took a segment that others may now write.  Now
    the check reads the daemon's record of the segment (check_segment).
    The arrays already loaded stay (checked once, at open: gshm._owner)."""
    import numpy
    _safetensors.share_arrays(client, segname, {"w": numpy.arange(8, dtype=numpy.int32)}).close()
    daemon.gshmctl("chmod", segname, "0640")
    arrays = _safetensors.load_arrays(client, segname)
    daemon.gshmctl("chmod", segname, "0666")
    assert arrays["w"].tolist() == list(range(8))
    with pytest.raises(_manifest.UntrustedSegment, match="mode 0666"):
        _safetensors.load_arrays(client, segname)
    assert len(_my_leases(client)) == 1  # the first load's, kept
    del arrays
    assert _my_leases(client) == []
    client.unlink(segname)


def test_attach_sees_a_chmod_since_a_cached_lease(daemon, client, segname):
    """open_segments (attach) while this client holds the pool's segments:
    a segment chmod'ed 0666 since was taken on the held lease's record."""
    names = _fake_pool(client, segname)
    m = _manifest.read(client, segname)
    held = _manifest.open_segments(client, m)
    daemon.gshmctl("chmod", names[1], "0666")
    with pytest.raises(_manifest.UntrustedSegment, match="mode 0666"):
        _manifest.open_segments(client, m)
    for seg in held.values():
        seg.close()
    assert _my_leases(client) == []
    _manifest.unlink_prefix(client, segname)


def test_manifest_naming_a_gone_segment_is_stale(client, segname):
    names = _fake_pool(client, segname)
    m = _manifest.read(client, segname)
    client.unlink(names[1])
    with pytest.raises(_manifest.StaleManifest, match="no longer exists"):
        _manifest.open_segments(client, m)
    assert _my_leases(client) == []  # the first segment's open was undone
    _manifest.unlink_prefix(client, segname)


def test_manifest_naming_a_recreated_segment_is_stale(client, segname):
    names = _fake_pool(client, segname)
    m = _manifest.read(client, segname)
    client.unlink(names[0])
    client.create(names[0], 4096, location="host").close()  # same name, new generation
    with pytest.raises(_manifest.StaleManifest, match="created again"):
        _manifest.open_segments(client, m)
    assert _my_leases(client) == []
    _manifest.unlink_prefix(client, segname)


def test_manifest_naming_a_segment_outside_its_prefix(client, segname):
    """Whoever can write "<prefix>/manifest" (a name is first come, first
    served) chose which segments the reader opened: one outside the pool's
    "<prefix>/seg-" (the reader's own, or any it may open) was opened with
    the reader's rights and handed out as weights."""
    other = client.create(segname + "-kv/cache", 4096, location="host")  # not the pool's
    for name in (other.name, segname + "/other"):
        seg = other if name == other.name else client.create(name, 4096, location="host")
        info = {name: _seginfo(seg)}
        _manifest.write(client, segname, _manifest.encode(
            "host", info, {"w": _entry(name, 0, "float32", (8,), (1,))}))
        with pytest.raises(_manifest.ManifestError, match="not one of the pool's"):
            _manifest.read(client, segname)
        if seg is not other:
            seg.close()
            client.unlink(name)
    other.close()
    client.unlink(other.name)
    assert _my_leases(client) == []
    _manifest.unlink_prefix(client, segname)


def test_manifest_read_reads_only_what_its_length_says(monkeypatch, client, segname):
    """read() took the whole "<prefix>/manifest" segment into memory (twice:
    a ctypes buffer and its bytes) before decode() compared the length with
    MAX_BYTES: whoever created that name chose how much every reader
    allocated.  Now it reads the 8-byte length, then that many bytes, and
    nothing more when the length does not fit."""
    from gshm import _segment
    reads = []
    real = _segment.Segment.read

    def recording(seg, offset=0, nbytes=None):
        reads.append(nbytes)
        return real(seg, offset, nbytes)
    monkeypatch.setattr(_segment.Segment, "read", recording)
    big = 64 * MiB
    good = _manifest.encode("host", {}, {})
    for data, ok in ((good, True), (struct.pack("<Q", 1 << 40) + good[8:], False),
                     (struct.pack("<Q", _manifest.MAX_BYTES + 1) + good[8:], False)):
        with client.create(segname + "/manifest", big, location="host") as seg:
            seg.write(data, 0)
        reads.clear()
        if ok:
            assert _manifest.read(client, segname)["tensors"] == {}
        else:
            with pytest.raises(_manifest.ManifestError, match="does not fit"):
                _manifest.read(client, segname)
        assert sum(reads) <= len(good), reads
        client.unlink(segname + "/manifest")


def test_manifest_that_is_not_one(client, segname):
    with client.create(segname + "/manifest", 64, location="host") as seg:
        js = b'{"format": "x"}'
        seg.write(struct.pack("<Q", len(js)) + js, 0)
    with pytest.raises(_manifest.ManifestError, match="not a gshm pool manifest"):
        _manifest.read(client, segname)
    client.unlink(segname + "/manifest")


def _old_manifest_write(client, monkeypatch):
    """write() as with a gshmd too old for hidden segments (NotSupported):
    its unlink-then-create fallback."""
    create = client.create

    def no_hidden(*args, hidden=False, **kw):
        if hidden:
            raise gshm.NotSupported(errno.ENOTSUP, "gshm_create: no hidden segments", args[0])
        return create(*args, **kw)
    monkeypatch.setattr(client, "create", no_hidden)


def test_manifest_write_failure_keeps_the_old_one(client, segname, monkeypatch):
    """A write whose copy fails raises the copy's error and leaves the
    manifest that was there, whole (the new one was hidden: its close
    freed it)."""
    _manifest.write(client, segname, _manifest.encode("host", {}, {}, metadata={"a": "1"}))
    before = client.status()
    failure = OSError(errno.EIO, "the copy failed")

    def write(seg, data, offset=0):
        raise failure
    monkeypatch.setattr(gshm.HostSegment, "write", write)
    with pytest.raises(OSError) as e:
        _manifest.write(client, segname, _manifest.encode("host", {}, {}, metadata={"b": "2"}))
    assert e.value is failure
    monkeypatch.undo()
    assert _manifest.read(client, segname)["metadata"] == {"a": "1"}
    after = client.status()
    assert (after.segments, after.bytes) == (before.segments, before.bytes)
    client.unlink(_manifest.manifest_name(segname))


def test_manifest_write_keeps_its_own_error(client, segname, daemon, monkeypatch):
    """A write that failed unlinked the new manifest to leave none, and a
    failure of that unlink (another process had unlinked the name) was
    raised in place of the write's own error.  Now the write's error is
    raised, and a name another process holds by then is left alone.  (The
    fallback for an older gshmd: the hidden path unlinks nothing.)"""
    _old_manifest_write(client, monkeypatch)
    name = _manifest.manifest_name(segname)
    failure = OSError(errno.EIO, "the copy failed")
    with gshm.Client(daemon.socket, name="other") as other:
        def write(seg, data, offset=0):
            other.unlink(name)  # as unlink_prefix or `gshmctl unlink` elsewhere
            raise failure
        monkeypatch.setattr(gshm.HostSegment, "write", write)
        with pytest.raises(OSError) as e:
            _manifest.write(client, segname, _manifest.encode("host", {}, {}))
        assert e.value is failure
        # another writer's manifest, made under the name meanwhile, stays
        def write_other(seg, data, offset=0):
            other.unlink(name)
            other.create(name, 64, location="host").close()
            raise failure
        monkeypatch.setattr(gshm.HostSegment, "write", write_other)
        with pytest.raises(OSError) as e:
            _manifest.write(client, segname, _manifest.encode("host", {}, {}))
        assert e.value is failure
        assert client.exists(name)
        client.unlink(name)


def test_manifest_write_when_the_old_one_goes_first(client, segname, daemon, monkeypatch):
    """write() asked whether a manifest existed, then unlinked it: one that
    another process unlinked in between failed the write with NotFound.
    Now it unlinks whatever is there, and none is no error.  (The fallback
    for an older gshmd, as above.)"""
    _old_manifest_write(client, monkeypatch)
    name = _manifest.manifest_name(segname)
    _manifest.write(client, segname, _manifest.encode("host", {}, {}, metadata={"a": "1"}))
    real = client.unlink
    with gshm.Client(daemon.socket, name="other") as other:
        def unlink(n):
            if n == name and other.exists(name):
                other.unlink(name)  # just before ours
            return real(n)
        monkeypatch.setattr(client, "unlink", unlink)
        _manifest.write(client, segname, _manifest.encode("host", {}, {}, metadata={"b": "2"}))
    monkeypatch.undo()
    assert _manifest.read(client, segname)["metadata"] == {"b": "2"}
    client.unlink(name)


# ------------------------------------------------------ the C pool's refusals

def _pool_create(client, prefix, device=0, mode=0, flags=0, granule=0, cfg=True):
    fn = L.optional_symbol("gshm_pool_create")
    assert fn is not None, "libgshm lacks gshm_pool_create"
    c = L.PoolConfigC()
    c.prefix = prefix.encode() if prefix is not None else None
    c.device, c.mode, c.flags, c.granule = device, mode, flags, granule
    out = ctypes.c_void_p()
    rc = fn(client._ptr(), ctypes.byref(c) if cfg else None, ctypes.byref(out))
    if rc == 0:
        assert L.optional_symbol("gshm_pool_release")(out.value, 1) == 0
    return rc


def test_pool_config_errors(client):
    assert _pool_create(client, "p", cfg=False) == -errno.EINVAL
    assert _pool_create(client, None) == -errno.EINVAL
    assert _pool_create(client, "p", flags=0x80) == -errno.EINVAL
    assert _pool_create(client, "p", granule=3 * MiB) == -errno.EINVAL
    assert _pool_create(client, "p", mode=0o1777) == -errno.EINVAL
    assert _pool_create(client, "p", device=-1) == -errno.EINVAL
    assert _pool_create(client, "a//b") == -errno.EINVAL
    assert _pool_create(client, "../x") == -errno.EINVAL
    assert _pool_create(client, "") == -errno.EINVAL
    assert _pool_create(client, "x" * (gshm.NAME_MAX - 10)) == -errno.ENAMETOOLONG
    rc = _pool_create(client, "p", granule=64 * MiB)
    if not _cuda.available():
        assert rc == -errno.ENOTSUP  # a host-only node: no driver to allocate with
    rc = _pool_create(client, "p", device=4096)
    assert rc == (-errno.ENODEV if _cuda.available() else -errno.ENOTSUP)


def test_allocator_without_a_pool_refuses_and_ignores():
    lib = L.lib()
    malloc, free = lib.gshm_torch_malloc, lib.gshm_torch_free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int,
                                                        ctypes.c_void_p]
    free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                         ctypes.c_void_p]
    last = L.optional_symbol("gshm_torch_last_error")
    assert L.optional_symbol("gshm_pool_activate")(None) is None
    assert malloc(2 * MiB, 0, None) is None
    assert last() == -errno.EINVAL
    buf = ctypes.create_string_buffer(64)
    free(ctypes.addressof(buf), 64, 0, None)  # not pool memory: left alone
    assert last() == -errno.EINVAL
    free(None, 0, 0, None)
    assert L.optional_symbol("gshm_pool_release")(None, 1) == -errno.EINVAL


# ------------------------------------------------- load_safetensors' plan

def test_copy_plan_moves_every_byte_once():
    rnd = random.Random(7)
    for chunk in (1, 7, 64, 1000, 1 << 20):
        # a packed file data region, tensors in a shuffled destination order
        sizes = [rnd.choice([0, 1, 3, 64, 200, 999]) for _ in range(30)]
        start, jobs, pos = 100, [], 100
        dests = list(range(len(sizes)))
        rnd.shuffle(dests)
        dst_off = {}
        acc = 5000
        for d in dests:
            dst_off[d] = acc
            acc += sizes[d]
        for i, n in enumerate(sizes):
            jobs.append((pos, pos + n, dst_off[i]))
            pos += n
        src = bytes(rnd.getrandbits(8) for _ in range(pos))
        out = bytearray(acc)
        seen = 0
        for fpos, n, pieces in _safetensors.copy_plan(jobs, start, pos, chunk):
            assert n <= chunk and fpos == start + seen
            seen += n
            for off, d, length in pieces:
                assert 0 <= off and off + length <= n
                out[d:d + length] = src[fpos + off:fpos + off + length]
        assert seen == pos - start
        want = bytearray(acc)
        for b, e, d in jobs:
            want[d:d + e - b] = src[b:e]
        assert out == want


def _st_file(entries, data_len, header_len=None):
    """A safetensors file's bytes: {name: (dtype, shape, begin, end)}."""
    doc = {k: {"dtype": dt, "shape": list(sh), "data_offsets": [b, e]}
           for k, (dt, sh, b, e) in entries.items()}
    js = json.dumps(doc).encode()
    js += b" " * (-len(js) % 8)  # data 8-aligned, as safetensors writes it
    n = len(js) if header_len is None else header_len
    return struct.pack("<Q", n) + js + bytes(data_len)


def _st_parse(data):
    return _safetensors.parse(lambda off, n: data[off:off + n], len(data))


def test_safetensors_parse_refuses_hostile_headers():
    ok = _st_file({"a": ("F32", (2, 2), 0, 16), "b": ("BF16", (3,), 16, 22)}, 22)
    meta, entries = _st_parse(ok)
    assert [(k, b, e) for k, dt, sh, b, e in entries] == [("a", len(ok) - 22, len(ok) - 6),
                                                           ("b", len(ok) - 6, len(ok))]
    bad = [
        (_st_file({"a": ("F32", (4,), 0, 16), "b": ("F32", (2,), 8, 16)}, 16), "overlap"),
        (_st_file({"a": ("F32", (4,), 0, 16)}, 8), "do not match"),           # past the end
        (_st_file({"a": ("F32", (4,), 0, 12)}, 16), "do not match"),          # shape vs bytes
        (_st_file({"a": ("F32", (4,), 16, 0)}, 16), "do not match"),          # end < begin
        (_st_file({"a": ("F32", (-4,), 0, 0)}, 16), "bad safetensors entry"),
        (_st_file({"a": ("Q7", (4,), 0, 16)}, 16), "bad safetensors entry"),
        (_st_file({"a": ("F32", (4,), 0, 16)}, 16, header_len=1 << 40), "does not fit"),
        (_st_file({"a": ("F32", (4,), 0, 16)}, 16, header_len=(100 << 20) + 1), "does not fit"),
        (b"\x05\x00", "too small"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match=message):
            _st_parse(data)
    # Fields safetensors reads as u64 are JSON integers >= 0 and arrays, nothing
    # int() would take: a negative begin put a tensor on the header's bytes
    # (and load_safetensors' copy plan, which starts at the data, left it
    # unwritten), "8" or 2.5 were taken as 8 and 2, a string shape "12" as
    # (1, 2), Infinity raised OverflowError, deep nesting RecursionError.
    def raw(js, data_len=16):
        js += b" " * (-len(js) % 8)
        return struct.pack("<Q", len(js)) + js + bytes(data_len)

    def one(**kw):
        t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        t.update(kw)
        return raw(json.dumps({"a": t}).encode())

    (_, _, shape, b, e), = _st_parse(one())[1]
    assert (shape, b, e) == ((2,), len(one()) - 16, len(one()) - 8)
    hostile = [
        one(data_offsets=[-8, 0]),                        # on the header's last 8 bytes
        one(data_offsets=["0", "8"]),
        one(data_offsets=[0.0, 8.0]),
        one(data_offsets=[False, 8]),
        one(shape=[2.5], data_offsets=[0, 8]),
        one(shape="12", data_offsets=[0, 8]),
        one(shape=[True, 2]),
        raw(b'{"a": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 8]}}'),
        raw(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8e0]}}'),
    ]
    for data in hostile:
        with pytest.raises(ValueError, match="bad safetensors entry"):
            _st_parse(data)
    with pytest.raises(ValueError, match="bad safetensors header"):
        _st_parse(raw(b"[" * 100000))
    # __metadata__ is str -> str (load_safetensors hands it to plan(), which
    # raised TypeError or AttributeError, not the ValueError it documents)
    for meta in ([1, 2], {"k": 1}, "text"):
        doc = {"__metadata__": meta, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
        with pytest.raises(ValueError, match="__metadata__"):
            _st_parse(raw(json.dumps(doc).encode()))
    # Views need each tensor at a multiple of its item size (plan() puts it
    # there; load_state_dict gave a misaligned float32 view on the GPU, which
    # faults in every kernel); load_safetensors copies, so it reads any file.
    js = json.dumps({"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                     "a": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}).encode()
    odd = raw(js)  # data at a multiple of 8: "a" at 8k + 1
    start = len(odd) - 16
    with pytest.raises(ValueError, match="not aligned"):
        _st_parse(odd)
    _, entries = _safetensors.parse(lambda off, n: odd[off:off + n], len(odd), aligned=False)
    assert [(k, b) for k, _, _, b, _ in entries] == [("b", start), ("a", start + 1)]
    # a header too long for the format's own limit is refused before it is read
    huge = struct.pack("<Q", (100 << 20) + 1)
    with pytest.raises(ValueError, match="does not fit"):
        _safetensors.parse(lambda off, n: huge[off:off + n] if off == 0 else
                           pytest.fail("read the header"), 200 << 20)


# --------------------------------------------------- PyTorch's own limits

def test_expandable_segments_refused():
    ok = ["", "max_split_size_mb:128", "expandable_segments:False",
          "garbage_collection_threshold:0.6"]
    for v in ok:
        _torch_conf.check_alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": v})
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for v in ("expandable_segments:True", "max_split_size_mb:64,expandable_segments:true"):
            with pytest.raises(RuntimeError, match="expandable_segments.*#147851"):
                _torch_conf.check_alloc_conf({var: v})


# ------------------------------------------ the restart benchmark's frame

def _restart_bench():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "restart_bench.py")
    spec = importlib.util.spec_from_file_location("restart_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # no torch at import
    return mod, path


def _restart_run(how, start, rep, load_s, restart_s, import_s=0.0):
    return {"how": how, "start": start, "rep": rep, "load_s": load_s, "restart_s": restart_s,
            "spawn_s": 0.1, "import_s": import_s, "cuda_s": 0.3, "meta_s": 0.1,
            "assign_s": 0.01, "buffers_s": 0.01, "forward_s": 0.5}


def test_restart_bench_table():
    rb, _ = _restart_bench()
    GiB = rb.GiB
    build = {"weights_bytes": 2 * GiB, "build_default_s": 1.0, "build_pool_s": 1.1,
             "pool_segments": 8, "build_per_alloc_s": 1.5, "per_alloc_segments": 200}
    r = _restart_run
    res = [{"gib": 2, "build": build, "runs": [
               r("attach", "cold", 1, 0.1, 14.0, 12.0), r("load_file", "cold", 1, 1.0, 15.0, 12.0),
               r("load_safetensors", "cold", 1, 0.9, 14.9, 12.0),
               r("attach", "warm", 1, 0.1, 1.0), r("attach", "warm", 2, 0.1, 3.0),
               r("attach", "warm", 3, 0.1, 1.2),
               r("load_file", "warm", 1, 1.0, 2.0), r("load_file", "warm", 2, 1.0, 2.4)],
            "errors": ["warm load_file #3: child 5 (exit 1): Traceback (most recent call last):"
                       "\n  File x\nRuntimeError: boom"]},
           {"gib": 16, "build": dict(build, weights_bytes=16 * GiB), "runs": [
               r("attach", "warm", 1, 0.1, 1.0), r("load_file", "warm", 1, 8.0, 12.0)],
            "skipped": ["cold attach #1", "cold load_file #1"]},
           {"gib": 0, "error": "run stopped: no GPU"}]
    text = rb.table(res, "H100")
    lines = text.splitlines()
    rows = [l for l in lines if l.startswith("| 2.00 GiB |") or l.startswith("| 16.00 GiB |")]
    # restart rows 5 + 2, target rows 2 + 1, phase rows 5 + 2, build rows 2
    assert len(rows) == 19, text
    # medians and ranges: warm attach ran 3 times (1.0, 3.0, 1.2)
    assert "| 2.00 GiB | attach | warm | 3 | 0.100 s | 0.100-0.100 | 1.20 s | 1.00-3.00 |" \
        in lines, text
    assert "| 2.00 GiB | cold | 1/10 | NO | 0.93 | NO |" in lines, text
    assert "| 2.00 GiB | warm | 1/10 | NO | 0.55 | NO |" in lines, text
    assert "| 16.00 GiB | warm | 1/80 | yes | 0.08 | yes |" in lines, text
    assert not any(l.startswith("| 16.00 GiB | cold |") for l in lines), text
    # phases: other = restart - spawn - the phases (14.0 - 0.1 - 13.03)
    assert "| 2.00 GiB | attach | cold | 0.100 | 12.000 | 0.300 | 0.100 | 0.100 | 0.010 | " \
        "0.010 | 0.500 | 0.880 | 14.000 |" in lines, text
    assert "| 2.00 GiB | 1.00 s | 1.10 s | 1.10 | 8 | 1.50 s | 1.50 | 200 |" in lines, text
    assert "- 2 GiB: warm load_file #3: child 5 (exit 1): Traceback (most recent call last): " \
        "... RuntimeError: boom" in lines, text
    assert "- 16 GiB: skipped for --budget: cold attach #1, cold load_file #1" in lines, text
    assert "- 0 GiB: run stopped: no GPU" in lines, text
    header = None
    for l in lines:  # every table row has its header's column count
        if l.startswith("| weights"):
            header = l.count("|")
        elif l.startswith("|"):
            assert l.count("|") == header, l
    assert "other_s" not in res[0]["runs"][0]  # the table leaves the raw runs as they were


def test_restart_bench_run_plan():
    import argparse
    rb, _ = _restart_bench()
    plan = rb.run_plan(argparse.Namespace(starts=["cold", "warm"], repeat=3, cold_repeat=1))
    assert len(plan) == 12
    # every way warm first, then cold, then the other warm repeats
    assert [(s, h) for _, s, h in plan[:6]] == [("warm", h) for h in rb.HOWS] + \
        [("cold", h) for h in rb.HOWS]
    assert {(r, s) for r, s, _ in plan[6:]} == {(1, "warm"), (2, "warm")}
    assert len(rb.run_plan(argparse.Namespace(starts=["cold"], repeat=3, cold_repeat=2))) == 6


def test_restart_bench_fork_server():
    """The warm start's fork server with a stand-in restart (no torch): a
    normal child, one that raises, exits, prints, hangs past its timeout, a
    server that dies, one that does not answer, one whose stdin closes."""
    import subprocess
    import sys
    _, path = _restart_bench()
    p = subprocess.run([sys.executable, path, "--selftest-forkserver"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert b"selftest-forkserver: ok" in p.stdout


def test_restart_bench_file_dir(tmp_path):
    rb, _ = _restart_bench()
    missing = tmp_path / "a" / "b"
    assert rb.dir_with_room([str(missing)], 1) == str(missing)  # made
    assert rb.dir_with_room([str(tmp_path / "x"), "/proc/nonexistent/y"], 1 << 60) is None
    assert rb.dir_with_room(["/proc/nonexistent/y", str(tmp_path)], 1) == str(tmp_path)
    assert rb.file_dirs(None)[0] in (os.environ.get("TMPDIR") or "/tmp",)


def test_restart_bench_without_a_gpu_still_writes_its_table(tmp_path):
    import subprocess
    import sys
    _, path = _restart_bench()
    out = tmp_path / "no" / "such" / "dir" / "restart.md"
    code = ("import sys; sys.modules['torch'] = None\n"  # as on CI: no torch
            "sys.argv = [%r, '--sizes', '0.01', '--out', %r, '--budget', '30']\n"
            "import runpy; runpy.run_path(%r, run_name='__main__')\n" % (path, str(out), path))
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 1, p.stderr.decode()
    assert b"| weights | how |" in p.stdout and b"run stopped" in p.stdout, p.stdout
    assert out.read_text() == p.stdout.decode()
    assert json.loads((tmp_path / "no/such/dir/restart.md.json").read_text())["results"]
