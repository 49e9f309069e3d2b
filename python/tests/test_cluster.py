# SPDX-License-Identifier: Apache-2.0
"""Client.pull, Client.peers and Client.remote_segments against two real
gshmd talking UCX over tcp on 127.0.0.1 (docs/CLUSTER.md)."""
import errno
import json
import os
import tempfile
import time

import pytest

import gshm
import gshm_testutil


@pytest.fixture(scope="module")
def pair():
    keydir = tempfile.mkdtemp(prefix="gshm-pykey-")
    a, b = gshm_testutil.cluster_pair(keydir, "pub/*")
    yield a, b
    b.stop()
    a.stop()
    os.unlink(os.path.join(keydir, "key"))
    os.rmdir(keydir)


def test_pull(pair):
    a, b = pair
    data = os.urandom(3 * 1024 * 1024 + 7)
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        with ca.create("pub/py", len(data), location="host", mode=0o644) as seg:
            memoryview(seg)[:len(data)] = data
        src = ca.stat("pub/py")
        assert [s.name for s in cb.remote_segments("a")] == ["pub/py"]
        seen = []
        r = cb.pull("a", "pub/py", local_name="py/copy",
                    progress=lambda done, total, ns: seen.append((done, total)))
        assert r.bytes == len(data) and r.path == "host" and r.peer == "a"
        assert (r.remote_id, r.remote_generation) == (src.id, src.generation)
        assert r.remote_name == "pub/py" and not r.relayed
        assert r.segment.source == "a:pub/py#%d.%d" % (src.id, src.generation)
        assert all(done <= total for done, total in seen)
        with cb.open("py/copy", access="r") as seg:
            assert bytes(memoryview(seg)[:len(data)]) == data
        assert cb.stat("py/copy").source.startswith("a:pub/py#")
        peers = cb.peers()
        assert [(p.name, p.state) for p in peers] == [("a", "up")]
        # what to check before cluster.min_protocol = 2.6: both say 2.6
        assert (peers[0].protocol, peers[0].subkeys) == ("2.6", True)
        with pytest.raises(gshm.NotFound):
            cb.pull("a", "not/exported")
        # the way out, in this API's words: replace=True, not gshmctl's flag
        with pytest.raises(gshm.Exists) as exists:
            cb.pull("a", "pub/py", local_name="py/copy")
        assert "replace=True" in str(exists.value), str(exists.value)
        assert "--replace" not in str(exists.value), str(exists.value)
        cb.unlink("py/copy")
        ca.unlink("pub/py")


def test_pull_result_granularity_and_created(pair):
    """A pull's result describes the new segment as stat does: its
    granularity and creation time.  A set pull's (prefix=True) had
    granularity 0 and created_ns 0 (created read 1970): gshmd's pull_items
    entries did not carry them; gshmctl pull --json showed neither."""
    a, b = pair
    now = time.time()

    def check(seg, st):
        assert seg.granularity > 0 and seg.granularity == st.granularity, (seg, st)
        assert seg.created_ns == st.created_ns, (seg, st)
        assert abs(seg.created.timestamp() - now) < 60, seg.created

    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        for n in ("pub/when/x", "pub/when/y"):
            ca.create(n, 5000, location="host", mode=0o644).close()
        r = cb.pull("a", "pub/when/x", local_name="when1")
        check(r.segment, cb.stat("when1"))
        rs = cb.pull("a", "pub/when/", local_name="when2/", prefix=True)
        assert len(rs) == 2
        for r in rs:
            check(r.segment, cb.stat(r.segment.name))
        # gshmctl pull --json: both, one segment and a set
        one = json.loads(b.gshmctl("--json", "pull", "a:pub/when/x", "--as", "when3").stdout)
        st = cb.stat("when3")
        assert one["granularity"] == st.granularity
        assert one["created"] == time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                               time.gmtime(st.created_ns // 10**9)), one
        doc = json.loads(b.gshmctl("--json", "pull", "a:pub/when/", "--prefix",
                                   "--as", "when4/").stdout)
        for e in doc["segments"]:
            st = cb.stat(e["name"])
            assert e["granularity"] == st.granularity, e
            assert e["created"] == time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                 time.gmtime(st.created_ns // 10**9)), e
        for n in ("when1", "when2/x", "when2/y", "when3", "when4/x", "when4/y"):
            cb.unlink(n)
        for n in ("pub/when/x", "pub/when/y"):
            ca.unlink(n)


def test_pull_interrupted_in_progress(pair):
    """Ctrl-C while a pull ran raised KeyboardInterrupt inside the progress
    callback, where ctypes printed "Exception ignored" and dropped it: the
    pull returned as if nothing happened.  Now the interrupt cancels the
    pull and is raised again; another exception is a warning."""
    import signal
    a, b = pair
    data = os.urandom(64 * 1024 * 1024)
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        with ca.create("pub/intr", len(data), location="host", mode=0o644) as seg:
            memoryview(seg)[:len(data)] = data
        calls = []

        def interrupt(done, total, ns):
            calls.append(done)
            os.kill(os.getpid(), signal.SIGINT)

        with pytest.raises(KeyboardInterrupt):
            cb.pull("a", "pub/intr", local_name="py/intr", progress=interrupt)
        assert len(calls) == 1  # (not called again)
        # cancelled (gshm_pull_cancel): nothing left, unless the pull ended
        # before the cancel came (then it is whole)
        if cb.exists("py/intr"):
            with cb.open("py/intr", access="r") as seg:
                assert bytes(memoryview(seg)[:len(data)]) == data
            cb.unlink("py/intr")
        assert not any(s.name.startswith("py/intr") for s in cb.segments())
        # the client goes on: its connection was not closed to cancel
        assert [p.name for p in cb.peers()] == ["a"]

        def broken(done, total, ns):
            raise ValueError("bad callback")

        with pytest.warns(RuntimeWarning, match="bad callback"):
            r = cb.pull("a", "pub/intr", local_name="py/intr", progress=broken)
        assert r.bytes == len(data)
        cb.unlink("py/intr")
        ca.unlink("pub/intr")


_DROP_IN_PROGRESS = r"""
import os, sys
import gshm
with gshm.Client(sys.argv[1]) as cb:
    held = [cb.open(sys.argv[2], "r")]
    calls = []

    def progress(done, total, ns):
        calls.append(done)
        held.clear()  # the segment's last reference: closed on the pulling thread

    r = cb.pull("a", "pub/dropped", local_name="py/dropped", progress=progress)
    assert calls and not held and r.bytes == int(sys.argv[3]), (calls, held, r.bytes)
    # its close, put off to the pull's end, was made then
    mine = [l for l in cb.leases() if l.segment == sys.argv[2] and l.pid == os.getpid()]
    assert not mine, mine
    cb.unlink("py/dropped")
print("ok")
"""


def test_segment_dropped_in_pull_progress_is_closed_after_it(pair):
    """A segment of the pulling client whose last reference went inside
    the pull's progress callback (the callback dropped it; or the garbage
    collector, which runs at any allocation, or a DLPack deleter) was
    closed there: gshm_close waited for the client's lock, which the pull
    on that same thread held, and the process hung for ever.  Now such a
    close is put off to the pull's end, and made then.  Run in a child
    process, killed after 60 s (a hang fails the test, not the suite)."""
    a, b = pair
    size = 64 * 1024 * 1024
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        ca.create("pub/dropped", size, location="host", mode=0o644).close()
        cb.create("py/held", 4096, location="host").close()
        _child_ok_within_60s(_DROP_IN_PROGRESS, [b.socket, "py/held", str(size)],
                             "the pull hung: the segment dropped in its progress callback was "
                             "closed on the pulling thread")
        cb.unlink("py/held")
        ca.unlink("pub/dropped")


def _child_ok_within_60s(script, args, hung):
    """Runs script in a child Python with args; fails the test with `hung`
    when it has not ended in 60 s (it is killed), or unless it printed
    "ok" last and exited 0."""
    import subprocess
    import sys
    try:
        p = subprocess.run([sys.executable, "-c", script] + args, env=gshm_testutil.child_env(),
                           timeout=60, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
    except subprocess.TimeoutExpired:
        pytest.fail(hung)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout


# argv: socket, segment, lock ("state": _core._state_lock, the segment
# dropped under it; "export": _dlpack._LIVE_LOCK, the segment held by an
# unconsumed DLPack capsule in a cycle, collected under it; "live":
# _dlpack._LIVE_LOCK, the segment dropped under it).
_CLOSE_UNDER_LOCK = r"""
import gc, os, sys, threading
import gshm
from gshm import _core, _dlpack
lock = {"state": _core._state_lock, "export": _dlpack._LIVE_LOCK,
        "live": _dlpack._LIVE_LOCK}[sys.argv[3]]
with gshm.Client(sys.argv[1]) as cb:
    seg = cb.open(sys.argv[2], "r")
    if sys.argv[3] == "export":
        cap = _dlpack.make_capsule(seg, 0x1000, _dlpack.kDLCPU, 0, 1, 8, (4,))
        cycle = [cap]
        cycle.append(cycle)  # garbage only the cyclic collector frees
        del seg, cap, cycle  # the capsule's export holds the last reference
    in_cb, go = threading.Event(), threading.Event()

    def progress(done, total, ns):
        if not in_cb.is_set():
            in_cb.set()
            go.wait(30)
            with lock:  # (as a segment dropped, or a DLPack tensor let go of, here would take it)
                pass

    def pull():
        cb.pull("a", "pub/locked", local_name="py/locked", progress=progress)

    t = threading.Thread(target=pull)
    t.start()
    assert in_cb.wait(30)
    # A finalizer that the garbage collector runs at an allocation (or, in
    # Python 3.12, a bytecode boundary) under the lock: the segment's last
    # reference goes there, while the pull on t holds the client's lock.
    with lock:
        if sys.argv[3] == "export":
            gc.collect()
        else:
            del seg
    go.set()
    t.join(60)
    assert not t.is_alive()
    cb.status()  # a call's end makes what was put off
    assert _dlpack.live_exports() == 0  # (drops the exports put off)
    mine = [l for l in cb.leases() if l.segment == sys.argv[2] and l.pid == os.getpid()]
    assert not mine, mine
    cb.unlink("py/locked")
print("ok")
"""


def test_segment_closed_under_the_state_lock_waits_for_no_request(pair):
    """A segment whose last reference went while its thread held
    gshm._core._state_lock (a finalizer run by the garbage collector at an
    allocation under it) was closed right there: gshm_close waited for
    the client's lock, held by another thread's pull, with _state_lock
    held, so every thread's gshm call stalled behind the pull, and a
    progress callback that took _state_lock (a segment dropped there) hung
    both for ever.  Now such a close is put off and made at the end of the
    next call.  Run in a child process, killed after 60 s."""
    _close_under_lock_while_pulling(pair, "state", "hung: a close under _state_lock waited "
                                    "for another thread's pull")


def test_segment_closed_under_the_export_lock_waits_for_no_request(pair):
    """A segment whose last reference went while its thread held
    gshm._dlpack._LIVE_LOCK (any finalizer the garbage collector ran at a
    bytecode boundary under it: a Segment in a cycle) was closed right
    there: unlike under _core._state_lock or a pool's lock, a close
    under it was not put off (only a DLPack export's own drop was), and
    gshm_close waited for the client's lock, held by another thread's
    pull, whose progress callback letting go of a DLPack tensor (which
    takes _LIVE_LOCK) hung both for ever.  Now it is put off as under
    _state_lock.  Run in a child process, killed after 60 s."""
    _close_under_lock_while_pulling(pair, "live", "hung: a close under _LIVE_LOCK waited for "
                                    "another thread's pull")


def _close_under_lock_while_pulling(pair, lock, hung, script=_CLOSE_UNDER_LOCK, extra=()):
    """Runs script (_CLOSE_UNDER_LOCK for `lock`) in a child
    (_child_ok_within_60s) over a 64 MiB segment of node a and a segment
    of node b to drop; extra: more arguments."""
    a, b = pair
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        ca.create("pub/locked", 64 * 1024 * 1024, location="host", mode=0o644).close()
        cb.create("py/held2", 4096, location="host").close()
        try:
            _child_ok_within_60s(script, [b.socket, "py/held2", lock] + list(extra), hung)
        finally:  # (a child killed hung leaves them: the next test makes them again)
            cb.unlink("py/held2")
            ca.unlink("pub/locked")


def test_close_put_off_by_a_pull_does_not_hold_other_calls(pair):
    """A segment dropped in a pull's progress callback has its close put
    off to the pull's end; but every other call's end (the next one on
    any thread, any client) made it, and so waited there for the pull
    holding that client's lock: a status() of another client stalled for
    as long as the pull ran.  Now what a pull put off is made only by
    that pull's end."""
    import threading
    import time
    a, b = pair
    size = 64 * 1024 * 1024
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb, \
            gshm.Client(b.socket) as other:
        ca.create("pub/longpull", size, location="host", mode=0o644).close()
        other.create("py/held3", 4096, location="host").close()
        held = [cb.open("py/held3", "r")]
        in_cb, go = threading.Event(), threading.Event()

        def progress(done, total, ns):
            if held:
                held.clear()  # put off: this thread is in cb's pull
                in_cb.set()
                go.wait(30)

        t = threading.Thread(target=lambda: cb.pull("a", "pub/longpull", local_name="py/longpull",
                                                    progress=progress))
        t.start()
        try:
            assert in_cb.wait(30)
            t0 = time.monotonic()
            other.status()  # another client's call: its end must not wait for cb's pull
            waited = time.monotonic() - t0
        finally:
            go.set()
            t.join(60)
        assert waited < 10, waited
        # (the pull's end made the close)
        assert not [l for l in other.leases() if l.segment == "py/held3" and l.pid == os.getpid()]
        cb.unlink("py/longpull")
        other.unlink("py/held3")
        ca.unlink("pub/longpull")


def test_export_dropped_under_the_export_lock_waits_for_no_request(pair):
    """A DLPack export whose capsule the garbage collector destroyed while
    its thread held gshm._dlpack._LIVE_LOCK (Python 3.12 collects at any
    bytecode boundary) was dropped right there: its segment's close waited
    for the client's lock, held by another thread's pull, with _LIVE_LOCK
    held, and the pull's progress callback letting go of a DLPack tensor
    (which takes _LIVE_LOCK) hung both for ever.  Now such an export is
    dropped once the lock's outermost holder has let it go.  Run in a
    child process, killed after 60 s."""
    _close_under_lock_while_pulling(pair, "export", "hung: an export dropped under _LIVE_LOCK "
                                    "waited for another thread's pull")


# argv: socket, segment, the tests' folder.  gshm._torch_pool (as tp) over
# test_torch_pool_threads's stand-in torch and model of the C pool (no GPU).
_STANDIN_POOL = r"""
import gc, importlib.util, os, sys, threading
sys.path.insert(0, sys.argv[3])
import test_torch_pool_threads as standin
import gshm
sys.modules["torch"] = standin._standin_torch()
spec = importlib.util.spec_from_file_location(
    "gshm._torch_pool_standin", os.path.join(os.path.dirname(gshm.__file__), "_torch_pool.py"))
tp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tp)
tp._fn = standin.CPool().fn
"""

_RELEASE_POOL_WHILE_PULLING = _STANDIN_POOL + r"""
gc.disable()  # (a collection before release's would wait for the pull, not under the lock)
with gshm.Client(sys.argv[1]) as cb:
    pool = tp.MemPool(cb, "py/standin", device=0, persistent=False)
    seg = cb.open(sys.argv[2], "r")
    cycle = [seg]
    cycle.append(cycle)  # garbage only the cyclic collector frees: release's
    del seg, cycle
    in_cb, go = threading.Event(), threading.Event()

    def progress(done, total, ns):
        if not in_cb.is_set():
            in_cb.set()
            go.wait(30)
            pool.segments()  # takes the pool's lock

    def pull():
        cb.pull("a", "pub/locked", local_name="py/locked", progress=progress)

    t = threading.Thread(target=pull)
    t.start()
    assert in_cb.wait(30)
    pool.release()  # its gc.collect() under the pool's lock drops the segment
    go.set()
    t.join(60)
    assert not t.is_alive()
    mine = [l for l in cb.leases() if l.segment == sys.argv[2] and l.pid == os.getpid()]
    assert not mine, mine  # (closed at the pull's end)
    cb.unlink("py/locked")
print("ok")
"""


def test_segment_collected_by_a_pool_release_waits_for_no_request(pair):
    """gshm.torch.MemPool.release() runs gc.collect() with the pool's lock
    held: a segment in a collected cycle was closed right there, and its
    gshm_close waited for the client's lock, held by another thread's pull,
    whose progress callback that asked the pool for its segments (or
    entered use_pool, or published) waited for the pool's lock: both hung
    for ever.  Now a close that a finalizer makes under a pool's lock is
    put off (gshm._core._PutOffLock) and made once the lock is let go or,
    for the pulling client's, at the pull's end.  Over a stand-in torch
    (no GPU); run in a child process, killed after 60 s."""
    _close_under_lock_while_pulling(
        pair, os.path.join(gshm_testutil.PYTHON_DIR, "tests"),
        "hung: a segment that a pool's release collected waited for another thread's pull",
        script=_RELEASE_POOL_WHILE_PULLING)


# argv: socket, segment (unused), the tests' folder, "release" or "publish".
# As _RELEASE_POOL_WHILE_PULLING; the main thread's release() (its unlink of
# the manifest) or publish() (its write of the manifest) waits for the
# client's lock, which the pull holds, while the pull's progress callback
# asks the pool for its segments.
_POOL_CALL_WHILE_PULLING = _STANDIN_POOL + r"""
tp._cuda.device_uuid = lambda device: "GPU-standin"
with gshm.Client(sys.argv[1]) as cb:
    pool = tp.MemPool(cb, "py/standin2", device=0)
    in_cb, go, waiting = threading.Event(), threading.Event(), threading.Event()
    listed = []

    def progress(done, total, ns):
        if not in_cb.is_set():
            in_cb.set()
            go.wait(30)
            listed.append(pool.segments())

    def pull():
        cb.pull("a", "pub/locked", local_name="py/locked", progress=progress)

    def on_client(call):  # the pool's own request on cb: it waits for the pull
        def waits(*args):
            waiting.set()
            return call(*args)
        return waits

    if sys.argv[4] == "release":
        cb.unlink = on_client(cb.unlink)  # release's unlink of the manifest
        call = pool.release
    else:
        tp._manifest.write = on_client(tp._manifest.write)
        call = lambda: pool.publish({})
    t = threading.Thread(target=pull, daemon=True)
    t.start()
    assert in_cb.wait(30)
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert waiting.wait(30)
    go.set()
    t.join(20)
    caller.join(20)
    assert not t.is_alive() and not caller.is_alive(), "hung"
    assert listed == [[]], listed
    if sys.argv[4] == "publish":
        pool.release()
    cb.unlink("py/locked")
print("ok")
"""


@pytest.mark.parametrize("call", ["release", "publish"])
def test_pool_calls_hold_no_lock_while_a_pull_runs(pair, call):
    """MemPool.release() and publish() held the pool's lock across their
    requests on the pool's client (release: the manifest's unlink and
    gshm_pool_release's closes and unlinks; publish: the manifest's
    create, write and publish), which wait for the client's lock: where
    another thread's pull held it, the pull's progress callback that asked
    the pool for its segments (or entered use_pool) waited for the pool's
    lock, and both hung for ever.  Now the pool's lock is held only to
    read and change its state; the calls are made outside it (a release
    waits for the calls in flight on the C pool, and a segments() during
    a release answers [] at once).  Over a stand-in torch and C pool (no
    GPU); run in a child process, killed after 60 s."""
    _close_under_lock_while_pulling(
        pair, os.path.join(gshm_testutil.PYTHON_DIR, "tests"),
        "hung: the pool's %s held its lock while waiting for the pull's client" % call,
        script=_POOL_CALL_WHILE_PULLING, extra=[call])


@pytest.fixture
def silent_node(tmp_path):
    """A gshmd "c" whose one peer "s" is a listener of 127.0.0.1 that never
    answers: a pull from s waits in the hello (5 s) with no progress."""
    import grp
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    key = tmp_path / "key"
    key.write_bytes(b"python-cluster-test-key-0123456789\n")
    key.chmod(0o600)
    c = gshm_testutil.Daemon(args=[
        "--set=cluster.node_name=c",
        "--set=cluster.peers=s=127.0.0.1:%d" % silent.getsockname()[1],
        "--set=cluster.secret_file=%s" % key,
        "--set=cluster.pull_group=" + grp.getgrgid(os.getegid()).gr_name]).start()
    try:
        yield c
    finally:
        c.stop()
        silent.close()


def _pulls_in_flight(node):
    return json.loads(node.gshmctl("peers", "--json").stdout)["pulls_in_flight"]


def test_pull_interrupted_while_reaching(silent_node):
    """Ctrl-C during a pull without a progress callback, while its peer is
    still being reached (no progress report comes): KeyboardInterrupt
    within a fraction of a second, the pull cancelled.  Before: Python's
    handler could run only once the pull had returned, after the hello's
    5 s timeout, and the pull's own TimedOut was raised instead."""
    import signal
    import threading
    import time
    main = threading.main_thread().ident
    with gshm.Client(silent_node.socket) as cc:
        for progress in (None, lambda done, total, ns: None):
            timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                cc.pull("s", "pub/x/", prefix=True, progress=progress)
            elapsed = time.monotonic() - t0
            timer.join()
            assert 0.5 <= elapsed < 2.0, elapsed
            assert _pulls_in_flight(silent_node) == 0
        assert not list(cc.segments())


def test_gshmctl_pull_interrupted(silent_node):
    """gshmctl pull and Ctrl-C (SIGINT), or SIGTERM: the pull is cancelled
    (nothing kept), gshmctl says so and exits 130 (143).  Before: the
    signal killed gshmctl mid-line (its progress bar unended).  The set is
    named as the summary names it: "under s:pub/x/", or for the empty
    prefix "from s (all it exports)" (it said "under s:")."""
    import signal
    import subprocess
    import time
    for sig, code, what, said in ((signal.SIGINT, 130, "s:pub/x/", b"the set under s:pub/x/ "),
                                  (signal.SIGTERM, 143, "s:pub/x/", b"the set under s:pub/x/ "),
                                  (signal.SIGINT, 130, "s:", b"the set from s (all it exports) ")):
        proc = subprocess.Popen([gshm_testutil.gshmctl_path(), "--socket", silent_node.socket,
                                 "pull", what, "--prefix"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 2.0
        assert proc.returncode == code, (proc.returncode, err)
        assert b"cancelled" in err and b"nothing was kept" in err, err
        assert b"pull of " + said + b"cancelled" in err, err
        assert _pulls_in_flight(silent_node) == 0


def test_peer_down_is_the_peers_failure(tmp_path):
    """A pull from (or a listing of) a peer that nothing answers is
    Unreachable, and says that the peer was lost, as gshmctl does.  Before:
    "gshm_pull: connection to gshmd reset: peer 'd' ... unreachable", the
    words of this process's own gshmd connection, which was fine."""
    import grp
    key = tmp_path / "key"
    key.write_bytes(b"python-cluster-test-key-0123456789\n")
    key.chmod(0o600)
    c = gshm_testutil.Daemon(args=[
        "--set=cluster.node_name=c", "--set=cluster.peers=d=127.0.0.1:1",
        "--set=cluster.secret_file=%s" % key,
        "--set=cluster.pull_group=" + grp.getgrgid(os.getegid()).gr_name]).start()
    try:
        with gshm.Client(c.socket) as cc:
            for call in (lambda: cc.pull("d", "pub/x"),
                         lambda: cc.pull("d", "pub/", prefix=True),
                         lambda: cc.remote_segments("d")):
                with pytest.raises(gshm.Unreachable) as e:
                    call()
                assert "peer lost or unreachable: peer 'd'" in str(e.value), str(e.value)
                assert "connection to gshmd" not in str(e.value), str(e.value)
            assert cc.status().version  # its own gshmd still answers
    finally:
        c.stop()


def test_pull_of_too_many_segments_is_limit_exceeded(pair):
    """A set pull of more than 4096 segments fails with E2BIG (gshmd's
    STATUS_TOO_MANY): gshm.LimitExceeded, as when the wire read it as
    EFBIG; since STATUS_TOO_MANY it came as a bare gshm.Error."""
    a, b = pair
    names = ["pub/many/%05d" % i for i in range(4097)]
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        try:
            for n in names:
                ca.create(n, 1, location="host", mode=0o644).close()
            with pytest.raises(gshm.LimitExceeded) as ei:
                cb.pull("a", "pub/many/", prefix=True)
            assert ei.value.errno == errno.E2BIG, ei.value
            assert not any(s.name.startswith("pub/many/") for s in cb.segments())
        finally:
            for n in names:
                if ca.exists(n):
                    ca.unlink(n)


def _ctrl_c_later(started, delay):
    """A thread that sends this process SIGINT `delay` s after the event
    `started` is set: a Ctrl-C that comes while the main thread is inside
    libgshm's pull (as a person's does), not inside the progress callback."""
    import signal
    import threading

    def run():
        if started.wait(30):
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("with_callback,prefix", [(True, False), (False, False), (False, True)],
                         ids=["callback", "no_callback", "set"])
def test_pull_cancelled_by_ctrl_c_in_libgshm(pair, with_callback, prefix):
    """A real Ctrl-C comes while the pull runs in C, and Python raises it at
    the entry of the next Python frame: the ctypes progress callback's,
    outside its try, where ctypes printed "Exception ignored on calling
    ctypes callback function" and dropped it (test_pull_interrupted_in_progress
    sent its SIGINT from inside the callback, where the try catches it).
    The pull then ran to its end and returned as if nothing happened, and
    without a callback Ctrl-C waited for the pull's end.  Now SIGINT on the
    main thread cancels the pull within 0.1 s, callback or not, and
    KeyboardInterrupt is raised once it has stopped; nothing is left."""
    import threading
    a, b = pair
    size = 512 << 20
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        with ca.create("pub/ctrlc", size, location="host", mode=0o644) as seg:
            memoryview(seg)[size - 1:size] = b"x"
        started = threading.Event()
        calls = []

        def progress(done, total, ns):
            calls.append(done)
            started.set()

        t0 = time.monotonic()
        if not with_callback:
            started.set()
        killer = _ctrl_c_later(started, 0.05 if with_callback else 0.3)
        try:
            with pytest.raises(KeyboardInterrupt):
                cb.pull("a", "pub/ctrlc", local_name="py/ctrlc", prefix=prefix,
                        progress=progress if with_callback else None)
            took = time.monotonic() - t0
            # cancelled, not whole: a pull of 512 MiB over loopback TCP is
            # not over that soon
            left = [s.name for s in cb.segments() if s.name.startswith("py/ctrlc")]
            assert not left, (left, took)
            assert [p.name for p in cb.peers()] == ["a"]  # the client goes on
        finally:
            killer.join(30)
            ca.unlink("pub/ctrlc")
            if cb.exists("py/ctrlc"):
                cb.unlink("py/ctrlc")


def _pty_stderr(cmd):
    """Runs cmd with its stderr on a pseudo-terminal (stdout a pipe), as
    gshmctl draws its progress bar only on a terminal.  Returns (exit
    status, stdout, what the terminal received)."""
    import pty
    import subprocess
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        slave = -1
        tty = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last holder of the terminal closed it
                break
            if not chunk:
                break
            tty += chunk
        out = proc.stdout.read()
        return proc.wait(timeout=60), out, tty.decode("utf-8", "replace")
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


def test_pull_progress_bar_units(pair):
    """gshmctl pull's bar writes its two byte figures the same way: one
    unit and one precision ("4 MiB / 64.0 MiB" mixed them: the chunks done
    are whole MiB, the segment is not; "7 B / 64.0 MiB" too).  64 MiB + 7
    bytes go in 4 MiB chunks (cluster.pull_chunk; a segment this large is
    not split finer for the lanes) and a 7-byte one: gshmd reports progress
    at the first chunk done, so a line before the end is drawn too."""
    import re
    a, b = pair
    size = (64 << 20) + 7
    with gshm.Client(a.socket) as ca:
        ca.create("pub/bar", size, location="host", mode=0o644).close()
    try:
        rc, _, tty = _pty_stderr([gshm_testutil.gshmctl_path(), "--socket", b.socket, "pull",
                                  "a:pub/bar", "--as", "bar/copy"])
        assert rc == 0, tty
        figure = re.compile(r"\] +\d+% (\d+(?:\.\d+)?) (\S+) / (\d+(?:\.\d+)?) (\S+) ")
        lines = [m.groups() for m in map(figure.search, re.split(r"[\r\n]", tty)) if m]
        assert len(lines) >= 2, tty  # one before the end, and the end
        for done, done_unit, total, total_unit in lines:
            assert done_unit == total_unit == "MiB", (tty, done, done_unit, total, total_unit)
            assert len(done.partition(".")[2]) == len(total.partition(".")[2]), (tty, done, total)
        assert lines[-1][0] == lines[-1][2] == "64.0", (tty, lines[-1])
        assert float(lines[0][0]) < float(lines[0][2]), (tty, lines[0])
    finally:
        with gshm.Client(b.socket) as cb:
            cb.unlink("bar/copy")
        with gshm.Client(a.socket) as ca:
            ca.unlink("pub/bar")


def _publish_host_model(client, prefix, seed):
    """A pool's layout on host segments: three segments and a manifest
    whose tensors lie in them (what gshm.torch publishes, without torch)."""
    from gshm import _manifest
    rnd = __import__("random").Random(seed)
    segs, tensors, data = {}, {}, {}
    for i, size in enumerate((4096, 65536 + 12, 3 * 4096)):
        name = "%s/seg-%06d" % (prefix, i)
        blob = bytes(rnd.getrandbits(8) for _ in range(size))
        # readable by others: what a plain export pattern lets a peer read
        with client.create(name, size, location="host", mode=0o644) as seg:
            memoryview(seg)[:size] = blob
            segs[name] = {"id": seg.info.id, "generation": seg.info.generation, "size": size}
        data[name] = blob
        tensors["layer%d.weight" % i] = {"segment": name, "offset": 8, "dtype": "float32",
                                         "shape": [16, 4], "strides": [4, 1]}
    _manifest.write(client, prefix, _manifest.encode("host", segs, tensors), mode=0o644)
    return data


def test_pull_prefix_resolves_manifest(pair):
    """One set pull of a published model's prefix, under another local
    prefix: the manifest resolves to the local copies by their source,
    every tensor's bytes are the peer's; a copy replaced by hand is stale;
    replace=True swaps the whole set."""
    from gshm import _manifest
    a, b = pair
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        data = _publish_host_model(ca, "pub/llama", 1)
        seen = []
        rs = cb.pull("a", "pub/llama/", local_name="llama/", prefix=True,
                     progress=lambda done, total, ns: seen.append((done, total)))
        assert sorted(r.segment.name for r in rs) == ["llama/manifest", "llama/seg-000000",
                                                      "llama/seg-000001", "llama/seg-000002"]
        assert all(r.path == "host" for r in rs)
        man = _manifest.read(cb, "llama")
        assert man["pulled_from"] == {"peer": "a", "prefix": "pub/llama"}
        assert sorted(man["segments"]) == ["llama/seg-000000", "llama/seg-000001",
                                           "llama/seg-000002"]
        segs = _manifest.open_segments(cb, man)
        try:
            for name, e in man["tensors"].items():
                seg = segs[e["segment"]]
                src = data["pub/llama" + e["segment"][len("llama"):]]
                got = bytes(memoryview(seg)[e["offset"]:e["offset"] + 256])
                assert got == src[e["offset"]:e["offset"] + 256], name
        finally:
            for s in segs.values():
                s.close()
        # a local prefix without the peer's '/': refused, as gshmctl's --as
        # (it made "v2seg-000000", silently), and nothing pulled
        with pytest.raises(gshm.InvalidArgument) as bad:
            cb.pull("a", "pub/llama/", local_name="v2", prefix=True)
        assert "write local_name='v2/'" in str(bad.value), str(bad.value)
        assert not [s for s in cb.segments() if s.name.startswith("v2")]
        # a prefix without prefix=True: the way out (it said "the peer's
        # name 'pub/llama/' is not a name")
        with pytest.raises(gshm.InvalidArgument) as bad:
            cb.pull("a", "pub/llama/")
        assert "to pull every segment under it, pass prefix=True" in str(bad.value), bad.value
        # the same names again: refused, unless replace
        with pytest.raises(gshm.Exists) as exists:
            cb.pull("a", "pub/llama/", local_name="llama/", prefix=True)
        assert "replace=True" in exists.value.gshm_message, str(exists.value)
        assert "--replace" not in str(exists.value), str(exists.value)
        # a segment that is not the pulled copy is refused as stale
        cb.unlink("llama/seg-000001")
        cb.create("llama/seg-000001", 65536 + 12, location="host").close()
        with pytest.raises(_manifest.StaleManifest):
            _manifest.open_segments(cb, _manifest.read(cb, "llama"))
        rs = cb.pull("a", "pub/llama/", local_name="llama/", prefix=True, replace=True,
                     mode=0o640)
        assert len(rs) == 4
        # each result's owner and mode are the new segment's (they were
        # left 0: uid 0, mode 0, as if root had made it unreadable)
        for r in rs:
            st = cb.stat(r.segment.name)
            assert (r.segment.uid, r.segment.gid, r.segment.mode) == (st.uid, st.gid, 0o640), r
        for s in _manifest.open_segments(cb, _manifest.read(cb, "llama")).values():
            s.close()
        for r in rs:
            cb.unlink(r.segment.name)
        for n in list(data) + ["pub/llama/manifest"]:
            ca.unlink(n)


def test_pull_peer_list(pair):
    """prefix=True takes a list of peers (joined for gshm_pull_prefix):
    one peer as a list pulls as the string does; a peer named twice, or a
    list for a single segment, is refused before anything moves.  (Two
    sources at once: tests/cluster/test_fanout.c test_sources.)"""
    a, b = pair
    data = os.urandom(70000)
    with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
        with ca.create("pub/list/x", len(data), location="host", mode=0o644) as seg:
            memoryview(seg)[:len(data)] = data
        rs = cb.pull(["a"], "pub/list/", local_name="list/", prefix=True)
        assert [(r.segment.name, r.peer) for r in rs] == [("list/x", "a")]
        with cb.open("list/x", access="r") as seg:
            assert bytes(memoryview(seg)[:len(data)]) == data
        with pytest.raises(gshm.InvalidArgument) as twice:
            cb.pull(("a", "a"), "pub/list/", local_name="list2/", prefix=True)
        assert "named twice" in str(twice.value), str(twice.value)
        with pytest.raises(gshm.InvalidArgument) as single:
            cb.pull(["a", "a"], "pub/list/x", local_name="list3")
        assert "only a set pull" in str(single.value), str(single.value)
        assert [s.name for s in cb.segments() if s.name.startswith("list")] == ["list/x"]
        cb.unlink("list/x")
        ca.unlink("pub/list/x")
