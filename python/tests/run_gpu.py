#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs the gshm Python GPU tests (tests/test_gpu.py).

    python3 python/tests/run_gpu.py [-q] [pytest args...]

Exits 77 (ctest: skipped) when no Python here has torch with a CUDA GPU.
With one GPU every test runs on GPU 0 (the second process shares the
segment on the same GPU); only reads over a peer link go untested.
It needs nothing else set up: the interpreter is this one if it has torch,
else $GSHM_GPU_PYTHON, else the first python3 on PATH (or /usr/bin/python3,
/usr/local/bin/python3) that imports torch; pytest is used when that
interpreter has it, else a small built-in runner runs the same tests.
Paths, as for test_host.py: $GSHMD (default <repo>/build/daemon/gshmd),
$GSHMCTL (default <repo>/build/client/gshmctl), $GSHM_LIBRARY (default: the
package's lookup, which finds <repo>/build/client/libgshm.so*).  The daemon
is started by the tests (cuda backend, temporary socket)."""

import inspect
import os
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
SKIP = 77


def probe(python):
    """(gpu count, has pytest) for an interpreter, or None without torch."""
    code = ("import torch\n"
            "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
            "try:\n import pytest; p = 1\nexcept ImportError:\n p = 0\n"
            "print(n, p)\n")
    try:
        out = subprocess.run([python, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=120).stdout.split()
        return int(out[0]), bool(int(out[1]))
    except Exception:
        return None


def choose_python():
    cands = [sys.executable, os.environ.get("GSHM_GPU_PYTHON"), shutil.which("python3"),
             shutil.which("python"), "/usr/bin/python3", "/usr/local/bin/python3"]
    if os.environ.get("GSHM_GPU_PYTHON"):
        cands = [os.environ["GSHM_GPU_PYTHON"]]
    seen = set()
    best = None
    for py in cands:
        if not py or not os.path.exists(py):
            continue
        real = os.path.realpath(py)
        if real in seen:
            continue
        seen.add(real)
        r = probe(py)
        if r is None:
            continue
        if best is None or r[0] > best[1][0]:
            best = (py, r)
    return best or (None, None)


def builtin_runner(argv):
    """Runs every test_* function of test_gpu.py, with the fixtures it names."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, PYTHON_DIR)
    import gshm_testutil
    gshm_testutil.BUILTIN_RUNNER = True
    import test_gpu
    import gshm
    quiet = "-q" in argv
    tests = sorted(((name, fn) for name, fn in vars(test_gpu).items()
                    if name.startswith("test_") and callable(fn)),
                   key=lambda nf: nf[1].__code__.co_firstlineno)
    passed = failed = skipped = 0
    with gshm_testutil.Daemon(backend="cuda") as daemon:
        for name, fn in tests:
            t0 = time.monotonic()
            client = None
            try:
                kwargs = {}
                params = inspect.signature(fn).parameters
                if "gpu_daemon" in params:
                    kwargs["gpu_daemon"] = daemon
                if "gpu_client" in params:
                    client = gshm.Client(daemon.socket, name="gpu-runner")
                    kwargs["gpu_client"] = client
                if "segname" in params:
                    kwargs["segname"] = "gpu-runner/%d/%s" % (os.getpid(), name)
                fn(**kwargs)
                passed += 1
                status = "PASSED"
            except gshm_testutil.Skipped as e:
                skipped += 1
                status = "SKIPPED (%s)" % e
            except Exception:
                failed += 1
                status = "FAILED"
                traceback.print_exc()
            finally:
                if client is not None:
                    client.close()
            if not quiet or status == "FAILED":
                print("%s %s (%.1f s)" % (name, status, time.monotonic() - t0), flush=True)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


def main(argv):
    if argv[:1] == ["--builtin"]:
        return builtin_runner(argv[1:])
    py, r = choose_python()
    if py is None:
        print("run_gpu: skipped: no python3 with torch found (set $GSHM_GPU_PYTHON)")
        return SKIP
    gpus, has_pytest = r
    if gpus < 1:
        print("run_gpu: skipped: %s sees no CUDA GPU" % py)
        return SKIP
    if gpus < 2:
        print("run_gpu: one GPU: the second process and the 'other GPU' views use GPU 0; "
              "SKIPPED (needs two GPUs): reads and copies over a peer link", flush=True)
    env = dict(os.environ)
    pp = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, HERE] + ([pp] if pp else []))
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    if has_pytest:
        cmd = [py, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
               os.path.join(HERE, "test_gpu.py")] + argv
    else:
        cmd = [py, os.path.abspath(__file__), "--builtin"] + argv
    print("run_gpu: %s" % " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
