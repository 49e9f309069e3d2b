# SPDX-License-Identifier: Apache-2.0
"""Client.pull, Client.peers and Client.remote_segments against two real
gshmd talking UCX over tcp on 127.0.0.1 (docs/CLUSTER.md)."""
import grp
import os
import socket
import tempfile

import pytest

import gshm
import gshm_testutil


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pair():
    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    keydir = tempfile.mkdtemp(prefix="gshm-pykey-")
    key = os.path.join(keydir, "key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"python-cluster-test-key-0123456789\n")
    os.close(fd)
    pa, pb = _free_port(), _free_port()
    group = grp.getgrgid(os.getegid()).gr_name

    def args(name, port, peers, export):
        return ["--set=cluster.listen=127.0.0.1:%d" % port, "--set=cluster.node_name=" + name,
                "--set=cluster.peers=" + peers, "--set=cluster.secret_file=" + key,
                "--set=cluster.export=" + export, "--set=cluster.pull_group=" + group]

    a = gshm_testutil.Daemon(args=args("a", pa, "b=127.0.0.1:%d" % pb, "pub/*")).start()
    b = gshm_testutil.Daemon(args=args("b", pb, "a=127.0.0.1:%d" % pa, "")).start()
    yield a, b
    b.stop()
    a.stop()
    os.unlink(key)
    os.rmdir(keydir)


def test_pull(pair):
    a, b = pair
    data = os.urandom(3 * 1024 * 1024 + 7)
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        with ca.create("pub/py", len(data), location="host") as seg:
            memoryview(seg)[:len(data)] = data
        src = ca.stat("pub/py")
        assert [s.name for s in cb.remote_segments("a")] == ["pub/py"]
        seen = []
        r = cb.pull("a", "pub/py", local_name="py/copy",
                    progress=lambda done, total, ns: seen.append((done, total)))
        assert r.bytes == len(data) and r.path == "host" and r.peer == "a"
        assert (r.remote_id, r.remote_generation) == (src.id, src.generation)
        assert r.segment.source == "a:pub/py#%d.%d" % (src.id, src.generation)
        assert all(done <= total for done, total in seen)
        with cb.open("py/copy", access="r") as seg:
            assert bytes(memoryview(seg)[:len(data)]) == data
        assert cb.stat("py/copy").source.startswith("a:pub/py#")
        peers = cb.peers()
        assert [(p.name, p.state) for p in peers] == [("a", "up")]
        with pytest.raises(gshm.NotFound):
            cb.pull("a", "not/exported")
        with pytest.raises(gshm.Exists):
            cb.pull("a", "pub/py", local_name="py/copy")
        cb.unlink("py/copy")
        ca.unlink("pub/py")
