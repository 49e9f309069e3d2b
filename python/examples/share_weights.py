#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Share model weights once, map them in many worker processes on other GPUs.

One loader process puts a state dict into one gshm segment on GPU 0
(gshm.torch.share_state_dict); worker processes, one per other GPU, open it
with gshm.torch.load_state_dict and get tensors that ARE the shared memory
(mapped over NVLink/PCIe, no copy).  While the workers hold the weights the
loader prints what `gshmctl mappings` shows; then each worker's time to
weights available is printed: from the moment the loader starts the worker
process (interpreter start, imports and CUDA init included) to the moment
its tensors are usable, and the load_state_dict call alone.

    python3 python/examples/share_weights.py --workers 3 --size-mib 4096
    python3 python/examples/share_weights.py --gshmd build/daemon/gshmd --compare

--gshmd starts a private gshmd (cuda backend) on a temporary socket;
otherwise the daemon at --socket / $GSHM_SOCKET / /run/gshm/gshmd.sock is
used.  --compare measures, in the same run and the same way, a worker that
reads the same weights from a safetensors file on local disk (page cache
warm: the loader just wrote it) and one that receives them through
torch.multiprocessing CUDA IPC (tensors stay on the loader's GPU).
"""

import argparse
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the gshm package of this source tree

try:  # --help works without torch; main() says what is missing
    import torch
    import torch.multiprocessing as mp
except ImportError as e:
    torch = mp = None
    _TORCH_ERROR = e

import gshm

try:
    import gshm.torch as gt
except ImportError:
    gt = None

REPO = os.path.dirname(os.path.dirname(HERE))


def gshmctl_path():
    return (os.environ.get("GSHMCTL") or shutil.which("gshmctl")
            or os.path.join(REPO, "build", "client", "gshmctl"))


def make_state_dict(total_mib, device):
    """A transformer-ish state dict of about total_mib MiB in bfloat16."""
    g = torch.Generator(device=device).manual_seed(0)
    hidden = 4096
    per_layer = 4 * hidden * hidden * 2 + 2 * hidden * 2
    layers = max(1, (total_mib << 20) // per_layer)
    sd = {}
    for i in range(layers):
        for w in ("q", "k", "v", "o"):
            sd["layers.%d.attn.%s.weight" % (i, w)] = torch.randn(
                hidden, hidden, generator=g, device=device, dtype=torch.bfloat16)
        sd["layers.%d.norm.weight" % i] = torch.ones(hidden, device=device, dtype=torch.bfloat16)
        sd["layers.%d.norm.bias" % i] = torch.zeros(hidden, device=device, dtype=torch.bfloat16)
    return sd


def checksum(sd):
    return float(sum(t.float().sum().item() for t in sd.values()))


# ---------------------------------------------------------------- workers

def gshm_worker(rank, gpu, socket_path, name, t_spawn, results, release):
    t_start = time.time()
    torch.cuda.set_device(gpu)
    with gshm.Client(socket_path, name="worker-%d" % rank) as c:
        t0 = time.perf_counter()
        sd = gt.load_state_dict(c, name, device="cuda:%d" % gpu)
        torch.cuda.synchronize(gpu)
        t_load = time.perf_counter() - t0
        t_ready = time.time()
        s = checksum(sd)  # touches every byte over the link, outside the timing
        results.put(dict(kind="gshm", rank=rank, gpu=gpu, tensors=len(sd),
                         bytes=sum(t.numel() * t.element_size() for t in sd.values()),
                         startup=t_start - t_spawn, ttwa=t_ready - t_spawn, call=t_load,
                         checksum=s, pid=os.getpid()))
        release.wait()
        del sd


def file_worker(gpu, path, t_spawn, results):
    from safetensors.torch import load_file
    torch.cuda.set_device(gpu)
    t0 = time.perf_counter()
    sd = load_file(path, device="cuda:%d" % gpu)
    torch.cuda.synchronize(gpu)
    t_load = time.perf_counter() - t0
    results.put(dict(kind="safetensors file", gpu=gpu, ttwa=time.time() - t_spawn, call=t_load,
                     checksum=checksum(sd)))


def ipc_worker(gpu, queue, t_spawn, results, done):
    torch.cuda.set_device(gpu)
    t0 = time.perf_counter()
    sd = queue.get()  # CUDA IPC handles, opened in this process
    torch.cuda.synchronize()
    t_load = time.perf_counter() - t0
    results.put(dict(kind="torch.multiprocessing", gpu=next(iter(sd.values())).device.index,
                     ttwa=time.time() - t_spawn, call=t_load, checksum=checksum(sd)))
    del sd
    done.wait()


# ---------------------------------------------------------------- daemon

def start_gshmd(exe):
    tmp = tempfile.mkdtemp(prefix="gshm-example-")
    sock = os.path.join(tmp, "gshmd.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(tmp, "notify"))
    env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify"))
    proc = subprocess.Popen([exe, "--socket", sock, "--backend", "cuda"], env=env)
    deadline = time.monotonic() + 10
    while True:
        left = deadline - time.monotonic()
        r, _, _ = select.select([notify], [], [], max(left, 0))
        if not r:
            proc.kill()
            sys.exit("gshmd did not become ready")
        if b"READY=1" in notify.recv(65536).split(b"\n"):
            break

    # keep draining the notify socket so gshmd never blocks on it
    import threading

    def drain():
        while True:
            try:
                notify.recv(65536)
            except OSError:
                return
    threading.Thread(target=drain, daemon=True).start()
    return proc, sock, tmp


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=None,
                    help="gshmd's socket (default $GSHM_SOCKET, else /run/gshm/gshmd.sock)")
    ap.add_argument("--gshmd", default=None, help="start this gshmd on a private socket")
    ap.add_argument("--workers", type=int, default=None, help="default: one per other GPU")
    ap.add_argument("--size-mib", type=int, default=2048,
                    help="MiB of weights to share (default %(default)s)")
    ap.add_argument("--name", default="example/weights",
                    help="the segment's name (default %(default)s)")
    ap.add_argument("--compare", action="store_true",
                    help="also time a safetensors file and torch.multiprocessing CUDA IPC")
    args = ap.parse_args()
    if torch is None:
        sys.exit("share_weights.py needs PyTorch with CUDA (%s); run it with an interpreter "
                 "that has torch, e.g. /opt/torch/.venv/bin/python3" % _TORCH_ERROR)

    ngpus = torch.cuda.device_count()
    if ngpus < 1:
        sys.exit("share_weights: no CUDA GPU")
    nworkers = args.workers if args.workers is not None else max(1, ngpus - 1)
    worker_gpus = [(1 + i) % ngpus if ngpus > 1 else 0 for i in range(nworkers)]
    if ngpus > 1:
        worker_gpus = [g if g != 0 else 1 for g in worker_gpus]

    daemon = None
    socket_path = args.socket
    if args.gshmd:
        daemon, socket_path, tmp = start_gshmd(args.gshmd)
    ctx = mp.get_context("spawn")
    try:
        client = gshm.Client(socket_path, name="loader")
        sd = make_state_dict(args.size_mib, "cuda:0")
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        want = checksum(sd)
        if client.exists(args.name):
            client.unlink(args.name)
        t0 = time.perf_counter()
        seg = gt.share_state_dict(client, args.name, sd, location=gshm.location_of_device(0))
        t_share = time.perf_counter() - t0
        print("loader: shared %d tensors, %.1f MiB, as %r on %s in %.3f s"
              % (len(sd), nbytes / 2**20, args.name, seg.location, t_share))
        seg.close()  # the weights stay with gshmd until unlinked

        results, release = ctx.Queue(), ctx.Event()
        procs = []
        for rank, gpu in enumerate(worker_gpus):
            p = ctx.Process(target=gshm_worker, args=(rank, gpu, client.socket, args.name,
                                                       time.time(), results, release))
            p.start()
            procs.append(p)
        rows = [results.get(timeout=600) for _ in procs]

        print("\n$ gshmctl mappings   (while %d workers hold the weights)" % len(procs))
        sys.stdout.flush()
        subprocess.call([gshmctl_path(), "--socket", client.socket, "mappings"])
        release.set()
        for p in procs:
            p.join()

        print("\ntime to weights available, per worker (from process start request):")
        print("  %-6s %-4s %-8s %-12s %-12s %-12s %s" % ("worker", "gpu", "tensors", "startup s",
                                                         "load call s", "available s", "ok"))
        for r in sorted(rows, key=lambda r: r["rank"]):
            ok = abs(r["checksum"] - want) <= 1e-6 * max(1.0, abs(want))
            print("  %-6d %-4d %-8d %-12.3f %-12.4f %-12.3f %s" % (
                r["rank"], r["gpu"], r["tensors"], r["startup"], r["call"], r["ttwa"],
                "yes" if ok else "CHECKSUM MISMATCH"))

        if args.compare:
            gpu = worker_gpus[0]
            print("\nsame weights, same measurement, other ways (worker on GPU %d):" % gpu)
            cmp_rows = []
            try:
                from safetensors.torch import save_file
                d = tempfile.mkdtemp(prefix="gshm-example-st-", dir=os.environ.get("TMPDIR"))
                path = os.path.join(d, "weights.safetensors")
                save_file({k: v.contiguous() for k, v in sd.items()}, path)
                p = ctx.Process(target=file_worker, args=(gpu, path, time.time(), results))
                p.start()
                cmp_rows.append(results.get(timeout=600))
                p.join()
                shutil.rmtree(d, ignore_errors=True)
            except ImportError:
                print("  (safetensors not installed: file comparison skipped)")
            q, done = ctx.Queue(), ctx.Event()
            p = ctx.Process(target=ipc_worker, args=(gpu, q, time.time(), results, done))
            p.start()
            q.put(sd)
            cmp_rows.append(results.get(timeout=600))
            done.set()
            p.join()
            g = [r for r in rows if r["gpu"] == gpu][0]
            cmp_rows.insert(0, dict(kind="gshm", gpu=gpu, ttwa=g["ttwa"], call=g["call"],
                                    checksum=g["checksum"]))
            print("  %-24s %-10s %-12s %-12s %s" % ("method", "tensors on", "load call s",
                                                     "available s", "ok"))
            for r in cmp_rows:
                ok = abs(r["checksum"] - want) <= 1e-6 * max(1.0, abs(want))
                print("  %-24s cuda:%-5d %-12.4f %-12.3f %s" % (r["kind"], r["gpu"], r["call"],
                                                               r["ttwa"], "yes" if ok else "NO"))
        client.unlink(args.name)
        client.close()
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
