# SPDX-License-Identifier: Apache-2.0
"""Hidden segments and their publish (Client.create(hidden=True),
Segment.publish), and the manifest write built on them: a reader polling
the manifest's name while it is written again and again never gets
NotFound nor a partial manifest.  Real gshmd (the session's), real reader
process."""

import json
import struct
import subprocess
import sys

import pytest

import gshm
import gshm_testutil
from gshm import _manifest

# The reader: polls NAME until its stdin closes, then prints what it met.
_READER = r"""
import json, select, struct, sys
import gshm
name = sys.argv[2]
reads = missing = partial = 0
seen = set()
with gshm.Client(sys.argv[1], name="reader") as c:
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:
        reads += 1
        try:
            with c.open(name, "r") as seg:
                data = seg.read()
        except gshm.NotFound:
            missing += 1
            continue
        n = struct.unpack("<Q", data[:8])[0]
        try:
            doc = json.loads(data[8:8 + n].decode())
            if doc["pad"] != "x" * doc["n"]:
                raise ValueError(doc["n"])
            seen.add(doc["n"])
        except ValueError:
            partial += 1
print(json.dumps({"reads": reads, "missing": missing, "partial": partial,
                  "versions": len(seen)}), flush=True)
"""


def _manifest_bytes(i):
    js = json.dumps({"n": i, "pad": "x" * i}).encode()
    return struct.pack("<Q", len(js)) + js


def test_manifest_write_is_atomic(daemon, client, segname):
    """200 manifest writes under a polling reader: never NotFound, never a
    partial manifest (with unlink-then-create the reader met NotFound)."""
    name = _manifest.manifest_name(segname)
    _manifest.write(client, segname, _manifest_bytes(1))
    reader = subprocess.Popen([sys.executable, "-c", _READER, daemon.socket, name],
                              env=gshm_testutil.child_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert reader.stdout.readline().strip() == b"ready"
        for i in range(200):
            _manifest.write(client, segname, _manifest_bytes(37 * i % 4000 + 2))
        out, _ = reader.communicate(b"", timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    got = json.loads(out.decode().strip().splitlines()[-1])
    assert got["missing"] == 0 and got["partial"] == 0, got
    assert got["versions"] >= 2, got  # it read while the manifest changed
    assert [s.name for s in client.segments() if s.name == name] == [name]
    client.unlink(name)


def test_manifest_write_old_daemon(client, segname, monkeypatch):
    """A gshmd too old for hidden creates: the old unlink-then-create."""
    create = client.create

    def old_create(*args, hidden=False, **kw):
        if hidden:
            raise gshm.NotSupported(95, "gshm_create: too old", args[0])
        return create(*args, **kw)

    monkeypatch.setattr(client, "create", old_create)
    _manifest.write(client, segname, _manifest_bytes(3))
    _manifest.write(client, segname, _manifest_bytes(5))
    with client.open(_manifest.manifest_name(segname), "r") as seg:
        assert seg.read() == _manifest_bytes(5) + bytes(seg.size - len(_manifest_bytes(5)))
    client.unlink(_manifest.manifest_name(segname))


def test_manifest_write_through_restarts(segname, monkeypatch):
    """gshmd restarted between the write's hidden create and its publish
    (twice): the write is made again and the manifest is there, whole.
    Before, the first restart's Revoked ('revoked by an administrator')
    failed the write, where the named create it replaced had come
    through.  Three restarts in a row: Revoked, nothing left."""
    monkeypatch.setenv("GSHM_RECONNECT_MS", "10000")
    d = gshm_testutil.Daemon().start()
    try:
        with gshm.Client(d.socket, name="writer") as c:
            publish = gshm.Segment.publish
            restarts = []

            def publish_after_restart(seg, *args, **kw):
                if len(restarts) < want[0]:
                    d.restart()
                    restarts.append(1)
                return publish(seg, *args, **kw)

            monkeypatch.setattr(gshm.Segment, "publish", publish_after_restart)
            want = [2]
            _manifest.write(c, segname, _manifest_bytes(7))
            assert len(restarts) == 2
            with c.open(_manifest.manifest_name(segname), "r") as seg:
                assert seg.read(0, len(_manifest_bytes(7))) == _manifest_bytes(7)
            restarts.clear()
            want[0] = 3
            with pytest.raises(gshm.Revoked):
                _manifest.write(c, segname + "x", _manifest_bytes(9))
            assert len(restarts) == 3
            with pytest.raises(gshm.NotFound):
                c.stat(_manifest.manifest_name(segname + "x"))
    finally:
        d.stop()


def test_hidden_segment_publish(daemon, client, segname):
    with gshm.Client(daemon.socket, name="other") as other:
        seg = client.create(segname, 4096, hidden=True)
        try:
            assert seg.info.id == 0
            seg.write(b"new", 0)
            with pytest.raises(gshm.NotFound):
                other.open(segname, "r")
            with pytest.raises(gshm.NotFound):
                other.stat(segname)
            assert segname not in [s.name for s in other.segments()]
            with other.create(segname, 4096) as old:
                old.write(b"old", 0)
            with pytest.raises(gshm.Exists):
                seg.publish()
            seg.publish(replace=True)
            assert seg.info.id != 0 and seg.info.name == segname
            with pytest.raises(gshm.InvalidArgument):
                seg.publish(replace=True)
            with other.open(segname, "r") as got:
                assert got.read(0, 3) == b"new"
                assert got.info.id == seg.info.id
        finally:
            seg.close()
        client.unlink(segname)


def test_hidden_segment_goes_with_close(client, segname):
    before = client.status().bytes
    seg = client.create(segname, 1 << 20, hidden=True)
    assert client.status().bytes >= before + (1 << 20)  # counted
    seg.close()
    assert client.status().bytes == before
    with pytest.raises(gshm.NotFound):
        client.stat(segname)
