#!/usr/bin/env python3
"""Engine restart, measured: attach from gshm against reloading the weights.

    python3 python/examples/restart_bench.py --gshmd build/daemon/gshmd \\
        --sizes 2,16 --out restart.md

For each size (GiB of bf16 Llama weights, random), one builder process
builds the model on GPU 0 twice, with PyTorch's default allocator and
inside a persistent gshm.torch.MemPool (the build-cost ratio; at the first
size also with one segment per allocation instead of arenas), publishes the
pool and writes the weights to a safetensors file (which leaves the file in
the page cache).  Then, each in a new process, an engine restart from
"process started" (the parent's clock just before it spawns the child) to
"first forward pass done":

  attach            gshm.torch.attach + load_module (assign=True)
  load_file         safetensors.torch.load_file(path, device="cuda:0"), warm page cache
  load_safetensors  gshm.torch.load_safetensors into a new segment + load_state_dict

The tables (markdown) go to --out and stdout; the raw numbers to --out +
".json", rewritten after every step, so a run cut short keeps what it
measured.  The safetensors file of each size goes to the first of --dir,
$TMPDIR, /tmp, /var/tmp, the current directory and /dev/shm with room for
it (a size with room nowhere is reported, not fatal), and is removed after
its size.  --budget bounds the whole run (seconds, default 480): each
child gets what is left, and steps that no longer fit are skipped and
reported as such.
Each restart builds the model on the meta device and puts the weights in
with load_state_dict(assign=True); rotary buffers that a file does not
carry are rebuilt on the GPU.  A daemon (--gshmd) is started on a
temporary socket unless --socket names a running one.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, os.path.join(PYTHON_DIR, "tests"))

GiB = 1 << 30
TOKENS = [1, 15043, 29892, 590, 1024, 338, 263, 1243, 310, 278, 6590, 1788, 29889, 13, 450, 2]


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


def child_restart(a):
    t_imp = time.time()
    import torch
    import gshm
    import gshm.torch as gt
    from transformers import LlamaForCausalLM
    res = {"import_s": time.time() - t_imp}
    cfg = config_for(a.gib)
    torch.cuda.init()
    torch.empty(1, device="cuda:0")  # the context, as any engine makes first
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    t0 = time.time()
    if a.how == "attach":
        c = gshm.Client(a.socket, name="bench-attach")
        sd = gt.attach(c, a.prefix, device=0)
        res["load_s"] = time.time() - t0
        gt.load_module(model, sd)
    elif a.how == "load_file":
        from safetensors.torch import load_file
        sd = load_file(a.path, device="cuda:0")
        torch.cuda.synchronize()
        res["load_s"] = time.time() - t0
        model.load_state_dict(sd, assign=True)
    else:
        c = gshm.Client(a.socket, name="bench-load")
        seg = gt.load_safetensors(c, a.prefix + "-file", a.path,
                                  location=gshm.location_of_device(0), progress=False)
        seg.close()
        sd = gt.load_state_dict(c, a.prefix + "-file", device="cuda:0")
        res["load_s"] = time.time() - t0
        model.load_state_dict(sd, assign=True)
    real_buffers(model, "cuda:0")
    model.eval()
    forward(model)
    res["done"] = time.time()
    res["max_allocated"] = torch.cuda.max_memory_allocated(0)
    print(json.dumps(res), flush=True)
    os._exit(0)


# ------------------------------------------------------------ parent

class OutOfTime(Exception):
    pass


def spawn(args, role, extra, timeout):
    left = args.deadline - time.monotonic()
    if left < 20:
        raise OutOfTime("%s skipped: %.0f s of --budget left" % (role, max(left, 0)))
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--socket", args.socket,
           "--prefix", args.prefix, "--path", args.path, "--gib", str(args.gib)] + extra
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                      else "")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                           timeout=min(timeout, left))
    except subprocess.TimeoutExpired:
        raise OutOfTime("%s %s: killed after %.0f s" % (role, " ".join(extra), min(timeout, left)))
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (role, p.returncode, p.stderr.decode()[-3000:]))
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    r["started"] = t0
    return r


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


def bench_size(args, gib, first, results, write):
    import gshm
    import gshm.torch as gt
    args.gib = gib
    args.prefix = "bench/restart-%g" % gib
    row = {"gib": gib}
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
    with gshm.Client(args.socket, name="bench") as c:
        for p in (args.prefix, args.prefix + "-per-alloc"):
            gt.unlink_prefix(c, p)
        if c.exists(args.prefix + "-file"):
            c.unlink(args.prefix + "-file")
        try:
            row["build"] = spawn(args, "build", ["--per-alloc"] if first else [], args.timeout)
            write()
            for how in ("attach", "load_file", "load_safetensors"):
                try:
                    r = spawn(args, "restart", ["--how", how], args.timeout)
                    r["restart_s"] = r["done"] - r["started"]
                    row[how] = r
                except (OutOfTime, RuntimeError) as e:
                    row.setdefault("errors", []).append("%s: %s" % (how, str(e)[-1500:]))
                    print("size %g %s: %s" % (gib, how, e), file=sys.stderr)
                finally:
                    if c.exists(args.prefix + "-file"):
                        c.unlink(args.prefix + "-file")
                write()
        finally:
            gt.unlink_prefix(c, args.prefix)
            gt.unlink_prefix(c, args.prefix + "-per-alloc")
            if os.path.exists(args.path):
                os.unlink(args.path)


def table(results, device):
    out = ["Engine restart on %s: new process to first forward pass done (Llama, bf16, "
           "random weights; %s)." % (device, time.strftime("%Y-%m-%d", time.gmtime())), "",
           "| weights | how | load call | restart to first forward | import torch+transformers |",
           "|---|---|---|---|---|"]
    for row in results:
        w = row.get("build", {}).get("weights_bytes", row["gib"] * GiB) / GiB
        for how in ("attach", "load_file", "load_safetensors"):
            r = row.get(how)
            if r:
                out.append("| %.2f GiB | %s | %.3f s | %.2f s | %.2f s |"
                           % (w, how, r["load_s"], r["restart_s"], r["import_s"]))
    out += ["", "Targets (issue 14): the attach call at most 1/20 of load_file's load, and "
            "restart to first forward with attach at most half of load_file's.", "",
            "| weights | attach / load_file (load call) | met | restart attach / load_file | met |",
            "|---|---|---|---|---|"]
    for row in results:
        a, b = row.get("attach"), row.get("load_file")
        if a and b:
            w = row.get("build", {}).get("weights_bytes", row["gib"] * GiB) / GiB
            lr = a["load_s"] / b["load_s"] if b["load_s"] > 0 else float("inf")
            rr = a["restart_s"] / b["restart_s"] if b["restart_s"] > 0 else float("inf")
            out.append("| %.2f GiB | 1/%.0f | %s | %.2f | %s |"
                       % (w, 1 / lr if lr > 0 else float("inf"), "yes" if lr <= 1 / 20 else "NO",
                          rr, "yes" if rr <= 0.5 else "NO"))
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
    errs = [(row["gib"], e) for row in results
            for e in ([row["error"]] if row.get("error") else []) + row.get("errors", [])]
    if errs:
        out += ["", "Not measured:", ""]
        out += ["- %g GiB: %s" % (g, e.strip().splitlines()[-1] if e.strip() else "?")
                for g, e in errs]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--how", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--gib", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--per-alloc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help="a running gshmd's socket (default: start --gshmd)")
    ap.add_argument("--gshmd", help="gshmd to start on a temporary socket")
    ap.add_argument("--sizes", default="2,16", help="GiB of weights, comma-separated")
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
                json.dump({"device": device, "results": results}, f, indent=1)
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
    return 0 if results and all("error" not in r and not r.get("errors") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
