#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A published model moves to another node in one pull and attaches there
(ctest: python_pull_model_gpu, label gpu).

    python3 python/tests/test_pull_model_gpu.py [-v]

gshmd A and gshmd B (cuda backend, cluster over UCX tcp on 127.0.0.1):
test_torch_pool_gpu.py's role A builds a transformers Llama in a
persistent gshm.torch MemPool under A, publishes it and is SIGKILLed; B
pulls the prefix (manifest and every segment) in one client.pull(...,
prefix=True) onto the second GPU where there is one, else the same GPU;
role B attaches it on B with gshm.torch.attach and its logits equal A's
exactly.  Another client listing B all along never sees part of the set.
Then a pool of B's is released while its client pulls, the pull's progress
callback asking the pool for its segments (pool_release_during_pull), and
one grows the same way (pool_grows_during_pull).

Exits 77 where test_torch_pool_gpu.py does (no torch with a CUDA GPU,
transformers, safetensors)."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gshm_testutil  # noqa: E402
import test_torch_pool_gpu as tp  # noqa: E402  (the model, its roles, the probe)

SKIP = 77


def publish_on_a(py, sock, out_dir):
    """Runs test_torch_pool_gpu's role A on gshmd A until it published; then
    SIGKILLs it (the pool is persistent: the segments stay)."""
    err = open(os.path.join(out_dir, "a.stderr"), "w+b")
    env = dict(gshm_testutil.child_env(), GSHM_TEST_POOL_MODE="644")  # exported: readable
    a = subprocess.Popen([py, tp.__file__, "--role", "a", sock, out_dir],
                         env=env, stdout=subprocess.PIPE, stderr=err)
    try:
        tp.wait_published(a, err)
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
        a.stdout.close()
        err.close()


# argv: socket of gshmd B.  A real MemPool (libgshm's C pool, GPU 0) on the
# client that pulls: its release() (the manifest's unlink, then
# gshm_pool_release's closes and unlinks) waits for that client's lock,
# held by the pull, while the pull's progress callback asks the pool for
# its segments.  The pool's Python lock was held across those requests,
# and the callback waited for it: both hung for ever.
_POOL_RELEASE_DURING_PULL = r"""
import sys, threading, torch, gshm, gshm.torch as gt
cb = gshm.Client(sys.argv[1], name="pool-during-pull")
pool = gt.MemPool(cb, "torchtest/poolpull", device=0)
with gt.use_pool(pool):
    x = torch.ones(1 << 20, device="cuda:0")
pool.publish({"x": x})
del x
in_cb, go, waiting, listed = threading.Event(), threading.Event(), threading.Event(), []

def progress(done, total, ns):
    if not in_cb.is_set():
        in_cb.set()
        go.wait(60)
        listed.append(pool.segments())

unlink = cb.unlink
def unlink_waits(name):  # release's first request on cb: it waits for the pull
    waiting.set()
    return unlink(name)
cb.unlink = unlink_waits
t = threading.Thread(target=lambda: cb.pull("a", "torchtest/pullsrc",
                                            local_name="torchtest/pullsrc-copy",
                                            progress=progress), daemon=True)
t.start()
assert in_cb.wait(60), "no progress report"
r = threading.Thread(target=pool.release, daemon=True)
r.start()
assert waiting.wait(60)
go.set()
t.join(60)
r.join(60)
assert not t.is_alive() and not r.is_alive(), "hung: the pool's release and the pull"
assert listed == [[]], listed  # (being released: [] at once)
assert pool.released
cb.unlink = unlink
cb.unlink("torchtest/pullsrc-copy")
print("ok")
"""


# argv: socket of gshmd B.  A real MemPool (libgshm's C pool, GPU 0, 2 MiB
# granule) on the client that pulls: a tensor allocated on another thread
# makes it grow (PyTorch asks for a 20 MiB segment: none fits), and the
# growth's gshm_create waits for that client's lock, held by the pull,
# while the pull's progress callback asks the pool for its segments.
# libgshm held its pool's lock across the growth's requests, and
# gshm_pool_segments waited for it: both hung for ever.
_POOL_GROWS_DURING_PULL = r"""
import sys, threading, time, torch, gshm, gshm.torch as gt
cb = gshm.Client(sys.argv[1], name="pool-grows-during-pull")
pool = gt.MemPool(cb, "torchtest/poolgrow", device=0, persistent=False, granule=2 << 20)
with gt.use_pool(pool):
    x = torch.ones(1 << 10, device="cuda:0")  # the first segment
torch.cuda.synchronize()
in_cb, go, listed, grown = threading.Event(), threading.Event(), [], []

def progress(done, total, ns):
    if not in_cb.is_set():
        in_cb.set()
        go.wait(60)
        time.sleep(1)  # the growth is then in its create, waiting for this pull
        listed.append(pool.segments())

def grow():
    with gt.use_pool(pool):
        grown.append(torch.zeros(8 << 20, dtype=torch.uint8, device="cuda:0"))
    torch.cuda.synchronize()

t = threading.Thread(target=lambda: cb.pull("a", "torchtest/pullsrc",
                                            local_name="torchtest/pullsrc-grow",
                                            progress=progress), daemon=True)
t.start()
assert in_cb.wait(60), "no progress report"
g = threading.Thread(target=grow, daemon=True)
g.start()
go.set()
t.join(120)
g.join(120)
assert not t.is_alive() and not g.is_alive(), "hung: the pool's growth and the pull"
assert len(listed) == 1 and len(listed[0]) >= 1, listed
assert len(grown) == 1 and int(grown[0].sum()) == 0
assert len(pool.segments()) > len(listed[0]) or len(listed[0]) > 1, (pool.segments(), listed)
del x
grown.clear()
pool.release()
assert pool.released
cb.unlink("torchtest/pullsrc-grow")
print("ok")
"""


def pool_grows_during_pull(py, a, b):
    """_POOL_GROWS_DURING_PULL in a child (killed after 240 s: a hang) over
    a 64 MiB host segment of A that B's client pulls."""
    import gshm
    with gshm.Client(a.socket) as ca:
        ca.create("torchtest/pullsrc", 64 << 20, location="host", mode=0o644).close()
        try:
            p = subprocess.run([py, "-c", _POOL_GROWS_DURING_PULL, b.socket],
                               env=gshm_testutil.child_env(), timeout=240,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
        except subprocess.TimeoutExpired:
            raise AssertionError("hung: a pool grown while its client pulled, the pull's "
                                 "progress callback calling pool.segments()")
        finally:
            ca.unlink("torchtest/pullsrc")
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout
    print("pool_grows_during_pull PASSED", flush=True)


def pool_release_during_pull(py, a, b):
    """_POOL_RELEASE_DURING_PULL in a child (killed after 240 s: a hang)
    over a 64 MiB host segment of A that B's client pulls."""
    import gshm
    with gshm.Client(a.socket) as ca:
        ca.create("torchtest/pullsrc", 64 << 20, location="host", mode=0o644).close()
        try:
            p = subprocess.run([py, "-c", _POOL_RELEASE_DURING_PULL, b.socket],
                               env=gshm_testutil.child_env(), timeout=240,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
        except subprocess.TimeoutExpired:
            raise AssertionError("hung: a pool released while its client pulled, the pull's "
                                 "progress callback calling pool.segments()")
        finally:
            ca.unlink("torchtest/pullsrc")
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout
    print("pool_release_during_pull PASSED", flush=True)


def main(argv):
    verbose = "-v" in argv
    py = sys.executable if os.environ.get("GSHM_TORCH_TEST_PROBED") else None
    for cand in ([] if py else [os.environ.get("GSHM_GPU_PYTHON"), sys.executable,
                                "/usr/bin/python3"]):
        if cand and os.path.exists(cand) and (tp.probe(cand) or 0) >= 1:
            py = cand
            break
    if py is None:
        print("test_pull_model_gpu: skipped: no python with torch + a CUDA GPU, transformers "
              "and safetensors (set $GSHM_GPU_PYTHON)")
        return SKIP
    if py != sys.executable:
        os.environ["GSHM_TORCH_TEST_PROBED"] = "1"
        os.execv(py, [py, os.path.abspath(__file__)] + argv)
    import torch
    import gshm

    gpus = torch.cuda.device_count()
    prefix = tp.PREFIX  # "torchtest/llama", role A's and role B's
    with tempfile.TemporaryDirectory(prefix="gshm-pullmodel-") as tmp:
        a, b = gshm_testutil.cluster_pair(tmp, "torchtest/*", backend="cuda")
        try:
            publish_on_a(py, a.socket, tmp)
            with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb, \
                    gshm.Client(b.socket) as watcher:
                exported = [s.name for s in cb.remote_segments("a")
                            if s.name.startswith(prefix + "/")]
                assert exported, "A exports nothing under %s/" % prefix
                seen_partial = []
                stop = threading.Event()

                def watch():
                    while not stop.is_set():
                        k = sum(1 for s in watcher.segments() if s.name.startswith(prefix + "/"))
                        if k and k != len(exported):  # (all of them: published, reply on its way)
                            seen_partial.append(k)
                        time.sleep(0.005)
                t = threading.Thread(target=watch)
                t.start()
                loc = "cuda:1" if gpus > 1 else "cuda:0"
                t0 = time.monotonic()
                try:
                    rs = cb.pull("a", prefix + "/", prefix=True, location=loc)
                finally:
                    stop.set()
                    t.join()
                secs = time.monotonic() - t0
                total = sum(r.bytes for r in rs)
                if verbose:
                    print("  pulled %d segments, %d bytes in %.2f s (%.2f GB/s) to %s, paths %s"
                          % (len(rs), total, secs, total / secs / 1e9, loc,
                             sorted({r.path for r in rs})), flush=True)
                assert sorted(r.segment.name for r in rs) == sorted(exported)
                assert not seen_partial, seen_partial  # never a part of the set
                man = [r for r in rs if r.segment.name == prefix + "/manifest"]
                assert man and man[0].segment.location == "host", rs
                if gpus > 1:
                    want = gshm.location_of_device(1)
                    assert all(r.segment.location == want for r in rs
                               if r.segment.name != prefix + "/manifest"), rs
            r = tp.child(py, "b", b.socket, tmp)  # attach on B, load, forward
            if verbose:
                print("  B: %s" % r, flush=True)
            la = torch.load(os.path.join(tmp, "logits-a.pt"))
            lb = torch.load(os.path.join(tmp, "logits-b.pt"))
            assert torch.equal(la, lb), (la - lb).abs().max()
            print("pull_model PASSED")
            if hasattr(torch.cuda, "MemPool"):
                pool_release_during_pull(py, a, b)
                pool_grows_during_pull(py, a, b)
            with gshm.Client(a.socket) as ca, gshm.Client(b.socket) as cb:
                from gshm import _manifest
                _manifest.unlink_prefix(ca, prefix)
                _manifest.unlink_prefix(cb, prefix)
            return 0
        except Exception:
            import traceback
            traceback.print_exc()
            sys.stderr.write(a.log()[-3000:])
            sys.stderr.write(b.log()[-3000:])
            print("pull_model FAILED")
            return 1
        finally:
            b.stop()
            a.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
