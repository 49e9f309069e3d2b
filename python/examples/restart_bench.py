#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Engine restart, measured: attach from gshm against reloading the weights.

    python3 python/examples/restart_bench.py --gshmd build/daemon/gshmd \\
        --sizes 2,16 --out restart.md

For each size (GiB of bf16 Llama weights, random), one builder process
builds the model on GPU 0 twice, with PyTorch's default allocator and
inside a persistent gshm.torch.MemPool (the build-cost ratio; at the first
size also with one segment per allocation instead of arenas), publishes the
pool and writes the weights to a safetensors file (which leaves the file in
the page cache).  Then engine restarts, each to "first forward pass done",
three ways:

  attach            gshm.torch.attach + load_module (assign=True)
  load_file         safetensors.torch.load_file(path, device="cuda:0"), warm page cache
  load_safetensors  gshm.torch.load_safetensors into a new segment + load_state_dict

and from two starts (--start, default both):

  cold  a new Python process per restart; the clock starts in the parent
        just before it spawns the child, so the child's imports count.
  warm  a child forked, per restart, by a fork server that the parent
        started once per size: it has imported torch, gshm, gshm.torch,
        transformers' LlamaForCausalLM and safetensors.torch, and never
        initializes CUDA (a CUDA context does not survive fork; it runs with
        PYTORCH_NVML_BASED_CUDA_CHECK=1 so that torch.cuda.is_available()
        would not either).  The clock starts when the parent writes the
        request to the fork server.

Both starts run the same restart code (restart()), which reports its
phases: import (about 0 when warm), CUDA context, meta model build, the
load call, load_state_dict/load_module, real buffers, first forward; spawn
is the time from the clock's start to the restart code's first line.
Each (size, way, start) runs --repeat times (warm; default 3) or
--cold-repeat times (cold; default 1: every cold start pays the imports);
the tables give medians and ranges.  Runs go repeat by repeat, in each the
three ways warm and then cold, so that a run cut short by --budget still
has every way at least once.

The tables (markdown) go to --out and stdout; every run's numbers to --out +
".json", rewritten after every step, so a run cut short keeps what it
measured.  The safetensors file of each size goes to the first of --dir,
$TMPDIR, /tmp, /var/tmp, the current directory and /dev/shm with room for
it (a size with room nowhere is reported, not fatal), and is removed after
its size.  --budget bounds the whole run (seconds, default 480): each
child gets what is left (at most --timeout), and runs that no longer fit
are skipped and reported as such.
Each restart builds the model on the meta device and puts the weights in
with load_state_dict(assign=True); rotary buffers that a file does not
carry are rebuilt on the GPU.  A daemon (--gshmd) is started on a
temporary socket unless --socket names a running one.
"""

import argparse
import copy
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, os.path.join(PYTHON_DIR, "tests"))

GiB = 1 << 30
TOKENS = [1, 15043, 29892, 590, 1024, 338, 263, 1243, 310, 278, 6590, 1788, 29889, 13, 450, 2]
HOWS = ("attach", "load_file", "load_safetensors")
STARTS = ("cold", "warm")
# restart()'s phases, in order; each child's result has <phase>_s
PHASES = ("import", "cuda", "meta", "load", "assign", "buffers", "forward")
# seconds of --budget a child must have left to be started
NEED_COLD, NEED_WARM = 20, 8

def config_for(gib):
    """A Llama shape of about `gib` GiB in bf16 (at least that much)."""
    from transformers import LlamaConfig
    if gib <= 4:
        h, inter, heads, kv = 2048, 5632, 16, 16
    else:
        h, inter, heads, kv = 4096, 11008, 32, 32
    vocab = 32000
    per_layer = 2 * (2 * h * h + 2 * h * h * kv // heads + 3 * h * inter + 2 * h)
    fixed = 2 * (2 * vocab * h + h)
    layers = max(1, -(-(int(gib * GiB) - fixed) // per_layer))
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, max_position_embeddings=512,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return cfg


def real_buffers(model, device):
    """Rebuilds, on `device`, submodules whose buffers are still on meta
    (rotary embeddings: non-persistent, so not in a state dict)."""
    import torch
    for name, mod in list(model.named_modules()):
        if any(b is not None and b.device.type == "meta" for b in mod._buffers.values()):
            config = getattr(mod, "config", None) or model.config
            try:
                fresh = type(mod)(config=config, device=device)
            except TypeError:  # transformers versions differ in the signature
                fresh = type(mod)(config).to(device)
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, fresh)
    for n, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p.device.type == "meta":
            raise RuntimeError("%s is still on meta" % n)
    return torch


def forward(model):
    import torch
    ids = torch.tensor([TOKENS], device="cuda:0")
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False).logits
    torch.cuda.synchronize()
    return out


# ------------------------------------------------------------ children

def child_build(a):
    import torch
    from safetensors.torch import save_file
    import gshm
    import gshm.torch as gt
    from transformers import LlamaForCausalLM
    cfg = config_for(a.gib)
    torch.set_default_dtype(torch.bfloat16)
    res = {}

    def build(config=cfg):
        torch.manual_seed(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.device("cuda:0"):
            m = LlamaForCausalLM(config)
        torch.cuda.synchronize()
        return m, time.perf_counter() - t0

    c = gshm.Client(a.socket, name="bench-build")
    # warm-up (kernels, transformers' lazy imports) on one layer of the same shape
    small = copy.deepcopy(cfg)
    small.num_hidden_layers = 1
    m, _ = build(small)
    del m
    torch.cuda.empty_cache()
    m, res["build_default_s"] = build()
    del m
    torch.cuda.empty_cache()
    if a.per_alloc:
        pool = gt.MemPool(c, a.prefix + "-per-alloc", device=0, segment_per_alloc=True)
        with gt.use_pool(pool):
            m, res["build_per_alloc_s"] = build()
        res["per_alloc_segments"] = len(pool.segments())
        del m
        pool.release()
    pool = gt.MemPool(c, a.prefix, device=0)
    with gt.use_pool(pool):
        m, res["build_pool_s"] = build()
    res["pool_segments"] = len(pool.segments())
    res["pool_bytes"] = sum(s.size for s in pool.segments())
    sd = m.state_dict()
    res["weights_bytes"] = sum(t.numel() * t.element_size() for t in sd.values())
    res["layers"] = cfg.num_hidden_layers
    pool.publish(m)
    t0 = time.perf_counter()
    save_file({k: v.contiguous() for k, v in sd.items()}, a.path)
    res["save_s"] = time.perf_counter() - t0
    with open(a.path, "rb") as f:  # make sure the whole file is in the page cache
        while f.read(64 << 20):
            pass
    print(json.dumps(res), flush=True)
    os._exit(0)  # the pool stays with gshmd (persistent)


def restart(a):
    """One engine restart in this process, from the restart code's first line
    to the first forward pass done: the same code for a cold start (a new
    interpreter) and a warm one (a child of the fork server, where the
    imports are done already).  a.how picks the way, a.socket/prefix/path/
    gib what it loads.  Returns the result: <phase>_s for PHASES (seconds),
    begin and done (time.time()), pid, max_allocated (bytes)."""
    res = {"begin": time.time(), "pid": os.getpid()}
    t = [time.perf_counter()]

    def phase(name):
        now = time.perf_counter()
        res[name + "_s"] = now - t[0]
        t[0] = now

    import torch
    import gshm
    import gshm.torch as gt
    from transformers import LlamaForCausalLM
    from safetensors.torch import load_file
    phase("import")
    torch.cuda.init()
    torch.empty(1, device="cuda:0")  # the context, as any engine makes first
    phase("cuda")
    cfg = config_for(a.gib)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    phase("meta")
    if a.how == "attach":
        c = gshm.Client(a.socket, name="bench-attach")
        sd = gt.attach(c, a.prefix, device=0)
        phase("load")
        gt.load_module(model, sd)
    elif a.how == "load_file":
        sd = load_file(a.path, device="cuda:0")
        torch.cuda.synchronize()
        phase("load")
        model.load_state_dict(sd, assign=True)
    elif a.how == "load_safetensors":
        c = gshm.Client(a.socket, name="bench-load")
        seg = gt.load_safetensors(c, a.prefix + "-file", a.path,
                                  location=gshm.location_of_device(0), progress=False)
        seg.close()
        sd = gt.load_state_dict(c, a.prefix + "-file", device="cuda:0")
        phase("load")
        model.load_state_dict(sd, assign=True)
    else:
        raise ValueError("unknown --how %r" % a.how)
    phase("assign")
    real_buffers(model, "cuda:0")
    phase("buffers")
    model.eval()
    forward(model)
    phase("forward")
    res["done"] = time.time()
    res["max_allocated"] = torch.cuda.max_memory_allocated(0)
    return res


def child_restart(a):
    """--role restart: one cold start, its result as one JSON line."""
    print(json.dumps(restart(a)), flush=True)
    os._exit(0)


# ------------------------------------------------------------ fork server
#
# Protocol, one JSON object per line.  The fork server writes {"ready": true,
# "pid", "import_s", "threads", "cuda_driver_initialized"} once its imports
# are done; then, per request {"id", "how", "timeout"} on its stdin, it forks
# a child that runs the restart, waits for it (killing it after `timeout`
# seconds), and answers {"id", "pid" (the child's), "exit", and "result" (the
# child's result) or "error"}.  It exits when its stdin closes.  The child
# sends its result through a pipe of its own and leaves with os._exit: it
# never returns into the server's loop.

def send_line(fd, obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


class LineReader:
    """Lines from a pipe, with a deadline (select, so never a blocked read)."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""

    def line(self, deadline):
        """The next line (bytes, without its newline), or None when
        `deadline` (time.monotonic()) passes first; EOFError when the
        writers are gone first."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not select.select([self.fd], [], [], left)[0]:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError(self.buf.decode(errors="replace"))
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line


def describe_status(status):
    code = os.waitstatus_to_exitcode(status)
    return "signal %d" % -code if code < 0 else "exit %d" % code


def reap(pid, deadline):
    """Waits for child `pid` until `deadline` (time.monotonic()), then kills
    it; returns its wait status."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.01)


def die_with_parent(parent):
    """Linux: SIGKILL for this process when its parent (pid `parent`) goes, so
    that a bench killed by `timeout` leaves no fork server or child behind."""
    import ctypes
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # gone already, before the prctl
        os._exit(1)


def forked_child(a, req, restart_fn, w, server):
    """The child's side of one request, right after fork: never returns."""
    code = 1
    try:
        try:
            die_with_parent(server)
            os.dup2(2, 1)  # the server's stdout carries the protocol: stray prints go to stderr
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            ca = copy.copy(a)
            ca.how = req["how"]
            out, ok = restart_fn(ca), True
        except BaseException:  # SystemExit and KeyboardInterrupt too: never back into the loop
            out, ok = {"pid": os.getpid(), "error": traceback.format_exc()[-3000:]}, False
        send_line(w, out)
        code = 0 if ok else 1
    finally:
        os._exit(code)


def serve_one(a, req, restart_fn):
    """Forks a child for one request, waits for it; returns the answer."""
    rid, timeout = req.get("id"), float(req.get("timeout", 300))
    r, w = os.pipe()
    server = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        forked_child(a, req, restart_fn, w, server)
    os.close(w)
    deadline = time.monotonic() + timeout
    try:
        line = LineReader(r).line(deadline)
    except EOFError:
        line = b""
    finally:
        os.close(r)
    if line is None:
        os.kill(pid, signal.SIGKILL)
    # a result sent, the child may still be tearing its context down
    status = reap(pid, max(deadline, time.monotonic() + 30))
    ans = {"id": rid, "pid": pid, "exit": describe_status(status)}
    if line is None:
        ans["error"] = "child killed after %.0f s (--timeout)" % timeout
    elif not line:
        ans["error"] = "child ended (%s) without a result" % ans["exit"]
    else:
        out = json.loads(line)
        if "error" in out:
            ans["error"] = out["error"]
        else:
            ans["result"] = out
    return ans


def cuda_driver_initialized():
    """Whether this process's CUDA driver has been initialized (cuInit), which
    torch.cuda.is_initialized() does not tell: cuDeviceGetCount fails with
    CUDA_ERROR_NOT_INITIALIZED (3) before cuInit.  None when libcuda is not
    loaded (so not initialized either)."""
    with open("/proc/self/maps") as f:
        if "libcuda.so" not in f.read():
            return None
    import ctypes
    n = ctypes.c_int(0)
    return ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(n)) != 3


def dummy_restart(a):
    """--selftest-forkserver's stand-in for restart(): no torch, a.how says
    how to misbehave.  Appends its pid to $GSHM_SELFTEST_PIDS."""
    with open(os.environ["GSHM_SELFTEST_PIDS"], "a") as f:
        f.write("%d\n" % os.getpid())
    res = {"begin": time.time(), "pid": os.getpid(), "ppid": os.getppid()}
    if a.how == "raise":
        raise RuntimeError("dummy failure")
    if a.how == "sysexit":
        sys.exit(0)
    if a.how == "exit":
        os._exit(3)
    if a.how == "print":
        print("junk on stdout", flush=True)
        os.write(1, b"more junk\n")
    if a.how == "hang":
        time.sleep(3600)
    if a.how == "kill-server":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(3600)
    res["done"] = time.time()
    return res


def fork_server(a):
    """--role forkserver: imports what an engine needs (not CUDA), then serves
    restart requests from stdin until it closes."""
    die_with_parent(a.parent)
    t0 = time.perf_counter()
    if a.dummy:
        restart_fn, cuda_initialized = dummy_restart, (lambda: False)
    else:
        import importlib
        import torch
        for mod in ("gshm", "gshm.torch", "safetensors.torch"):
            importlib.import_module(mod)
        importlib.import_module("transformers").LlamaForCausalLM  # a lazy attribute: loads it
        restart_fn, cuda_initialized = restart, torch.cuda.is_initialized
    send_line(1, {"ready": True, "pid": os.getpid(), "import_s": time.perf_counter() - t0,
                  "threads": len(os.listdir("/proc/self/task")),
                  "cuda_driver_initialized": cuda_driver_initialized()})
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return 0  # stdin closed: the parent is done, or gone
        req = json.loads(line)
        if cuda_initialized():
            send_line(1, {"id": req.get("id"), "error": "CUDA is initialized in the fork "
                          "server: a forked child could not use it; the server stops"})
            return 1
        send_line(1, serve_one(a, req, restart_fn))


# ------------------------------------------------------------ parent

class OutOfTime(Exception):
    pass


def child_cmd(args, role, extra):
    return [sys.executable, os.path.abspath(__file__), "--role", role, "--socket", args.socket,
            "--prefix", args.prefix, "--path", args.path, "--gib", str(args.gib)] + extra


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                      else "")
    return env


def time_left(args, what, need):
    """Seconds of --budget left; OutOfTime when fewer than `need`."""
    left = args.deadline - time.monotonic()
    if left < need:
        raise OutOfTime("%s skipped: %.0f s of --budget left" % (what, max(left, 0)))
    return left


def spawn(args, role, extra, timeout):
    left = time_left(args, role, NEED_COLD)
    t0 = time.time()
    try:
        p = subprocess.run(child_cmd(args, role, extra), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=child_env(), timeout=min(timeout, left))
    except subprocess.TimeoutExpired:
        raise OutOfTime("%s %s: killed after %.0f s" % (role, " ".join(extra), min(timeout, left)))
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (role, p.returncode, p.stderr.decode()[-3000:]))
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    r["started"] = t0
    return r


class ForkServerDied(RuntimeError):
    pass


class ForkServer:
    """The warm start's supervisor as the parent sees it: a --role forkserver
    process in a process group of its own (so that killing it takes a hung
    child along), talked to over its stdin and stdout; its stderr goes to a
    temporary file, whose end is quoted when it dies."""

    def __init__(self, cmd, env):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, env=env, start_new_session=True)
        self.lines = LineReader(self.proc.stdout.fileno())
        self.ready = None
        self.last_id = 0

    def wait_ready(self, wait):
        """Waits up to `wait` seconds for the imports; returns the ready line."""
        self.ready = self._answer(wait, "its start")
        return self.ready

    def request(self, how, timeout, wait=None):
        """One restart in a forked child (killed by the server after `timeout`
        seconds); waits up to `wait` seconds (default timeout + 30) for the
        answer.  Returns the child's result with `started`, the parent's
        time.time() just before it wrote the request.  RuntimeError when the
        child failed, ForkServerDied, OutOfTime when the server did not answer
        (then it is killed)."""
        self.last_id += 1
        msg = (json.dumps({"id": self.last_id, "how": how, "timeout": timeout}) + "\n").encode()
        started = time.time()
        try:
            os.write(self.proc.stdin.fileno(), msg)
        except BrokenPipeError:
            raise ForkServerDied(self._death())
        ans = self._answer(timeout + 30 if wait is None else wait, "warm " + how)
        if ans.get("id") != self.last_id:
            raise RuntimeError("fork server answered request %s, not %d: %s"
                               % (ans.get("id"), self.last_id, ans))
        if "error" in ans:
            raise RuntimeError("child %s (%s): %s"
                               % (ans.get("pid"), ans.get("exit"), ans["error"]))
        res = ans["result"]
        res["started"] = started
        return res

    def _answer(self, wait, what):
        try:
            line = self.lines.line(time.monotonic() + wait)
        except EOFError:
            raise ForkServerDied(self._death())
        if line is None:
            self.kill()
            raise OutOfTime("fork server gave no answer to %s in %.0f s: killed" % (what, wait))
        try:
            return json.loads(line)
        except ValueError:
            raise RuntimeError("fork server said %r, not JSON" % line[:200])

    def stderr_text(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """Kills the server and whatever child it has (its process group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # before the wait: the pid is still ours
        except ProcessLookupError:
            pass
        self.proc.wait()

    def _death(self):
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        code = self.proc.returncode
        self.kill()  # an orphaned child of it too
        tail = self.stderr_text().strip()[-1500:]
        return "fork server (pid %d) died (%s)%s" % (
            self.proc.pid, "still running: killed" if code is None else
            "signal %d" % -code if code < 0 else "exit %d" % code,
            "; its stderr ends:\n" + tail if tail else "")

    def close(self, wait=60):
        """Closes its stdin, which ends it; kills it after `wait` seconds.
        Returns its exit code (negative: signal)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc.stdout.close()
        self.err.close()
        return self.proc.returncode


# Where a safetensors file of the benchmark may go, in order of preference.
def file_dirs(chosen):
    out = [chosen] if chosen else []
    out += [os.environ.get("TMPDIR"), "/tmp", "/var/tmp", os.getcwd(), "/dev/shm"]
    return [d for i, d in enumerate(out) if d and d not in out[:i]]


def dir_with_room(dirs, need):
    """The first directory of dirs that exists (or can be made), is writable
    and has `need` bytes free; None."""
    for d in dirs:
        try:
            os.makedirs(d, exist_ok=True)
            st = os.statvfs(d)
            if os.access(d, os.W_OK) and st.f_bavail * st.f_frsize >= need:
                return d
        except OSError:
            continue
    return None


def run_plan(args):
    """(rep, start, how) in the order they run at each size: repeat by
    repeat, in each the three ways warm and then cold."""
    count = {"warm": args.repeat, "cold": args.cold_repeat}
    return [(rep, start, how) for rep in range(max(count[s] for s in args.starts))
            for start in ("warm", "cold") if start in args.starts and rep < count[start]
            for how in HOWS]


class WarmStart:
    """The fork server of one size, (re)started when needed: at most
    `starts` times, so that a server that keeps dying costs little."""

    def __init__(self, args, starts=2):
        self.args, self.left, self.server, self.info = args, starts, None, []

    def begin(self):
        """Starts a server without waiting for its imports (they overlap the build)."""
        if self.left <= 0:
            raise RuntimeError("fork server not started again: it died %d times"
                               % len(self.info))
        self.left -= 1
        # torch.cuda.is_available() from NVML, not cuInit, should an import ask
        env = dict(child_env(), PYTORCH_NVML_BASED_CUDA_CHECK="1")
        self.server = ForkServer(child_cmd(self.args, "forkserver", ["--parent", str(os.getpid())]),
                                 env)
        self.info.append({"pid": self.server.proc.pid})

    def run(self, how):
        args = self.args
        if self.server is None or not self.server.alive():
            if self.server is not None:
                self.server.close(0)
            self.begin()
        if self.server.ready is None:
            wait = min(args.timeout, time_left(args, "fork server start", NEED_WARM))
            try:
                self.info[-1].update(self.server.wait_ready(wait))
            except Exception:
                self.server.close(0)
                raise
            if self.info[-1].get("cuda_driver_initialized"):
                print("warning: the fork server's imports initialized the CUDA driver (cuInit); "
                      "its children may not be able to use CUDA", file=sys.stderr)
        left = time_left(args, "warm " + how, NEED_WARM)
        return self.server.request(how, min(args.timeout, left))

    def close(self):
        if self.server is not None:
            self.server.close()


def bench_size(args, gib, first, results, write):
    import gshm
    import gshm.torch as gt
    args.gib = gib
    args.prefix = "bench/restart-%g" % gib
    row = {"gib": gib, "runs": []}
    results.append(row)
    # the file, plus 5% for transformers' rounding of the shape and 512 MiB to spare
    need = int(gib * GiB * 1.05) + (512 << 20)
    d = dir_with_room(file_dirs(args.dir), need)
    if d is None:
        raise RuntimeError("no directory of %s has %.1f GiB free for the safetensors file"
                           % (file_dirs(args.dir), need / GiB))
    fd, args.path = tempfile.mkstemp(prefix="gshm-restart-%g-" % gib, suffix=".safetensors",
                                     dir=d)
    os.close(fd)
    row["file"] = args.path
    warm = WarmStart(args) if "warm" in args.starts else None
    with gshm.Client(args.socket, name="bench") as c:
        for p in (args.prefix, args.prefix + "-per-alloc"):
            gt.unlink_prefix(c, p)
        if c.exists(args.prefix + "-file"):
            c.unlink(args.prefix + "-file")
        try:
            if warm:
                warm.begin()  # its imports overlap the build
                row["forkserver"] = warm.info
            row["build"] = spawn(args, "build", ["--per-alloc"] if first else [], args.timeout)
            write()
            for rep, start, how in run_plan(args):
                label = "%s %s #%d" % (start, how, rep + 1)
                try:
                    if start == "warm":
                        r = warm.run(how)
                    else:
                        r = spawn(args, "restart", ["--how", how], args.timeout)
                    r.update(how=how, start=start, rep=rep + 1, restart_s=r["done"] - r["started"],
                             spawn_s=r["begin"] - r["started"])
                    row["runs"].append(r)
                except OutOfTime as e:
                    if "--budget" in str(e):
                        row.setdefault("skipped", []).append(label)
                    else:
                        row.setdefault("errors", []).append("%s: %s" % (label, str(e)[-1500:]))
                    print("size %g %s: %s" % (gib, label, e), file=sys.stderr)
                except RuntimeError as e:
                    row.setdefault("errors", []).append("%s: %s" % (label, str(e)[-1500:]))
                    print("size %g %s: %s" % (gib, label, e), file=sys.stderr)
                finally:
                    if c.exists(args.prefix + "-file"):
                        c.unlink(args.prefix + "-file")
                write()
        finally:
            if warm:
                warm.close()
            gt.unlink_prefix(c, args.prefix)
            gt.unlink_prefix(c, args.prefix + "-per-alloc")
            if os.path.exists(args.path):
                os.unlink(args.path)


# ------------------------------------------------------------ tables

def summary(row, how, start):
    """Medians (and min, max) over the runs of one (size, how, start) that
    finished; None when none did.  other_s: restart_s less spawn and phases."""
    runs = [r for r in row.get("runs", []) if r["how"] == how and r["start"] == start]
    if not runs:
        return None
    runs = [dict(r, other_s=r["restart_s"] - sum(r.get(p + "_s", 0) for p in ("spawn",) + PHASES))
            for r in runs]
    s = {"n": len(runs)}
    for k in ("restart_s", "load_s", "spawn_s", "other_s") + tuple(p + "_s" for p in PHASES):
        xs = [r[k] for r in runs if k in r]
        if xs:
            s[k] = statistics.median(xs)
            s[k + "_range"] = (min(xs), max(xs))
    return s


def weights(row):
    return row.get("build", {}).get("weights_bytes", row["gib"] * GiB) / GiB


def table(results, device):
    out = ["Engine restart on %s: to first forward pass done (Llama, bf16, random weights; "
           "%s).  cold: a new process, from its spawn; warm: a child of a fork server that "
           "has done the imports, from the request.  Medians over `runs`; min-max."
           % (device, time.strftime("%Y-%m-%d", time.gmtime())), "",
           "| weights | how | start | runs | load call | min-max | restart to first forward "
           "| min-max |", "|---|---|---|---|---|---|---|---|"]
    for row in results:
        for start in STARTS:
            for how in HOWS:
                s = summary(row, how, start)
                if s:
                    out.append("| %.2f GiB | %s | %s | %d | %.3f s | %.3f-%.3f | %.2f s | "
                               "%.2f-%.2f |" % ((weights(row), how, start, s["n"], s["load_s"])
                                                + s["load_s_range"] + (s["restart_s"],)
                                                + s["restart_s_range"]))
    out += ["", "Targets (issue 14): the attach call at most 1/20 of load_file's load, and "
            "restart to first forward with attach at most half of load_file's (medians).", "",
            "| weights | start | attach / load_file (load call) | met |"
            " restart attach / load_file | met |", "|---|---|---|---|---|---|"]
    for row in results:
        for start in STARTS:
            a, b = summary(row, "attach", start), summary(row, "load_file", start)
            if a and b:
                lr = a["load_s"] / b["load_s"] if b["load_s"] > 0 else float("inf")
                rr = a["restart_s"] / b["restart_s"] if b["restart_s"] > 0 else float("inf")
                out.append("| %.2f GiB | %s | 1/%.0f | %s | %.2f | %s |"
                           % (weights(row), start, 1 / lr if lr > 0 else float("inf"),
                              "yes" if lr <= 1 / 20 else "NO", rr, "yes" if rr <= 0.5 else "NO"))
    out += ["", "Where a restart's time goes (medians, seconds): spawn = from the clock's start "
            "to the restart code's first line (cold: a new interpreter; warm: the request and "
            "the fork), import = torch, gshm, transformers, safetensors, cuda = the CUDA "
            "context, meta = the model on the meta device, load = the load call, assign = "
            "load_state_dict/load_module, buffers = the rotary buffers, forward = the first "
            "forward pass, other = restart less all of these.", "",
            "| weights | how | start | spawn | import | cuda | meta | load | assign | buffers "
            "| forward | other | restart |", "|---" * 13 + "|"]
    for row in results:
        for start in STARTS:
            for how in HOWS:
                s = summary(row, how, start)
                if s:
                    cells = ["%.3f" % s[k] if k in s else "-" for k in
                             ("spawn_s",) + tuple(p + "_s" for p in PHASES) + ("other_s",
                                                                                "restart_s")]
                    out.append("| %.2f GiB | %s | %s | %s |"
                               % (weights(row), how, start, " | ".join(cells)))
    out += ["", "Building the model on the GPU (transformers' own init, timed after a one-layer "
            "warm-up build):", "",
            "| weights | default allocator | gshm pool (arenas) | ratio | segments |"
            " one segment per allocation | ratio | segments |", "|---|---|---|---|---|---|---|---|"]
    for row in results:
        b = row.get("build")
        if not b:
            continue
        per = ("%.2f s | %.2f | %d" % (b["build_per_alloc_s"],
                                       b["build_per_alloc_s"] / b["build_default_s"],
                                       b["per_alloc_segments"])
               if "build_per_alloc_s" in b else "- | - | -")
        out.append("| %.2f GiB | %.2f s | %.2f s | %.2f | %d | %s |"
                   % (b["weights_bytes"] / GiB, b["build_default_s"], b["build_pool_s"],
                      b["build_pool_s"] / b["build_default_s"], b["pool_segments"], per))
    errs = []
    for row in results:
        errs += [(row["gib"], e) for e in ([row["error"]] if row.get("error") else [])
                 + row.get("errors", [])]
        if row.get("skipped"):
            errs.append((row["gib"], "skipped for --budget: " + ", ".join(row["skipped"])))
    if errs:
        out += ["", "Not measured:", ""]
        out += ["- %g GiB: %s" % (g, first_line_and_last(e)) for g, e in errs]
    return "\n".join(out) + "\n"


def first_line_and_last(e):
    """An error in one line: its first line, and its last where they differ
    (a label and the exception at the end of a traceback)."""
    lines = [l.strip() for l in e.strip().splitlines() if l.strip()] or ["?"]
    return lines[0] if len(lines) == 1 else "%s ... %s" % (lines[0], lines[-1])


# ------------------------------------------------------------ self-test

def selftest_forkserver():
    """--selftest-forkserver: the fork server's protocol with dummy_restart,
    no torch and no GPU needed.  Returns 0 when every check passed."""
    args = argparse.Namespace(socket="-", prefix="-", path="-", gib=0)
    pids = tempfile.NamedTemporaryFile(prefix="gshm-selftest-pids-")
    env = dict(child_env(), GSHM_SELFTEST_PIDS=pids.name)
    cmd = child_cmd(args, "forkserver", ["--dummy", "--parent", str(os.getpid())])
    checks = []

    def check(what, cond, detail=""):
        checks.append(what)
        if not cond:
            raise AssertionError("%s: %s" % (what, detail))

    def fails(server, how, match, timeout=10, wait=None, exc=RuntimeError):
        t0 = time.monotonic()
        try:
            server.request(how, timeout, wait)
        except exc as e:
            check(how + " reported", match in str(e), str(e))
            return time.monotonic() - t0
        raise AssertionError("%s: no error" % how)

    def gone(pid):
        for _ in range(500):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return True
            except FileNotFoundError:
                return True
            time.sleep(0.01)
        return False

    s = ForkServer(cmd, env)
    try:
        ready = s.wait_ready(30)
        check("ready", ready.get("ready") and ready["pid"] == s.proc.pid, ready)
        for how in ("ok", "print", "raise", "sysexit", "exit", "hang", "ok"):
            if how in ("ok", "print"):
                r = s.request(how, 10)
                check(how + " answered by a child of the server",
                      r["ppid"] == s.proc.pid and r["pid"] != s.proc.pid
                      and r["started"] <= r["begin"] <= r["done"], r)
            elif how == "hang":
                took = fails(s, how, "killed after 1 s", timeout=1)
                check("hang bounded by its timeout", took < 5, took)
            else:
                fails(s, how, {"raise": "dummy failure", "sysexit": "SystemExit",
                               "exit": "exit 3) without a result"}[how])
            check("server alive after " + how, s.alive())
        err = s.stderr_text()
        check("no child ran server code (no traceback on its stderr)",
              "Traceback" not in err and "junk on stdout" in err, err)
        t0 = time.monotonic()
        rc = s.close(10)
        check("server exits when its stdin closes", rc == 0 and time.monotonic() - t0 < 5,
              (rc, time.monotonic() - t0))

        s = ForkServer(cmd, env)
        s.wait_ready(30)
        took = fails(s, "kill-server", "died (signal 9)", exc=ForkServerDied)
        check("a dead server is reported, not waited for", took < 15, took)
        s.close(0)

        s = ForkServer(cmd, env)
        s.wait_ready(30)
        took = fails(s, "hang", "gave no answer", timeout=60, wait=1, exc=OutOfTime)
        check("a server that does not answer is killed", not s.alive() and took < 5, took)
        s.close(0)
        with open(pids.name) as f:
            children = [int(l) for l in f if l.strip()]
        check("every child ran", len(children) == 9, children)
        for pid in children:
            check("child %d gone" % pid, gone(pid))
    except Exception as e:
        print("selftest-forkserver: FAILED after %d checks: %s: %s"
              % (len(checks), type(e).__name__, e), file=sys.stderr)
        return 1
    finally:
        if s.alive():
            s.kill()
        pids.close()
    print("selftest-forkserver: ok (%d checks)" % len(checks))
    return 0


# ------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--how", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--gib", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--per-alloc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dummy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--selftest-forkserver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help="a running gshmd's socket (default: start --gshmd)")
    ap.add_argument("--gshmd", help="gshmd to start on a temporary socket")
    ap.add_argument("--sizes", default="2,16", help="GiB of weights, comma-separated")
    ap.add_argument("--start", default="cold,warm",
                    help="cold (a new process per restart), warm (a child of a fork server), "
                    "or both, comma-separated (default both)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="restarts per size, way and warm start (default 3)")
    ap.add_argument("--cold-repeat", type=int, default=1,
                    help="restarts per size and way, cold (default 1)")
    ap.add_argument("--dir", default=None, help="where the safetensors files go (default: "
                    "the first of $TMPDIR, /tmp, /var/tmp, . and /dev/shm with room)")
    ap.add_argument("--out", default="restart-bench.md")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per child")
    ap.add_argument("--budget", type=float, default=480, help="seconds for the whole run")
    args = ap.parse_args()
    if args.role == "build":
        return child_build(args)
    if args.role == "restart":
        return child_restart(args)
    if args.role == "forkserver":
        return fork_server(args)
    if args.selftest_forkserver:
        return selftest_forkserver()
    args.starts = [s for s in args.start.split(",") if s]
    if not args.starts or set(args.starts) - set(STARTS) or args.repeat < 1 \
            or args.cold_repeat < 1:
        ap.error("--start takes cold, warm or both; --repeat and --cold-repeat at least 1")
    args.deadline = time.monotonic() + args.budget
    results = []
    device = "?"
    daemon = None

    def write():
        text = table(results, device)
        try:
            d = os.path.dirname(os.path.abspath(args.out))
            os.makedirs(d, exist_ok=True)
            with open(args.out + ".json", "w") as f:
                json.dump({"device": device, "starts": args.starts, "repeat": args.repeat,
                           "cold_repeat": args.cold_repeat, "results": results}, f, indent=1)
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as e:
            print("cannot write %s: %s" % (args.out, e), file=sys.stderr)
        return text

    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU for torch here")
        device = torch.cuda.get_device_name(0)
        if not args.socket:
            import gshm_testutil
            if args.gshmd:
                os.environ["GSHMD"] = os.path.abspath(args.gshmd)
            daemon = gshm_testutil.Daemon(backend="cuda").start()
            args.socket = daemon.socket
        for i, gib in enumerate(float(s) for s in args.sizes.split(",")):
            try:
                bench_size(args, gib, i == 0, results, write)
            except Exception as e:
                if not results or results[-1]["gib"] != gib:
                    results.append({"gib": gib})
                results[-1]["error"] = str(e)[-2000:]
                print("size %g: %s" % (gib, e), file=sys.stderr)
            write()
    except Exception as e:
        results.append({"gib": 0, "error": "run stopped: %s" % e})
        print("restart_bench: %s" % e, file=sys.stderr)
    finally:
        if daemon is not None:
            daemon.stop()
        sys.stdout.write(write())
        sys.stdout.flush()
    return 0 if results and all("error" not in r and not r.get("errors") and not r.get("skipped")
                                for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
