# SPDX-License-Identifier: Apache-2.0
"""Where a gshm.torch.MemPool's memory goes: weights vs PyTorch's blocks vs
gshm's arena segments, for the Llama shapes of restart_bench.py.

    python3 python/examples/pool_overhead.py --gshmd build/daemon/gshmd --sizes 2,16

For each size one child process (one for all sizes) builds the model on GPU 0 inside a persistent pool
(bf16, directly on the device, as restart_bench.py does) and prints one JSON
line: the weights' bytes, PyTorch's view of the pool (memory_snapshot of the
MemPool: segments PyTorch got from gshm, bytes in blocks in use, bytes in
free blocks it keeps cached), and gshm's view (arena segments, their bytes,
bytes handed out to PyTorch).  weights <= torch allocated <= torch reserved
= gshm live <= gshm segments: the step from allocated to reserved is
PyTorch's caching (freed temporaries kept in the pool, 2 MiB rounding), the
step from live to segments is gshm's packing (arena tails)."""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))


def child(a):
    import gshm
    c = gshm.Client(a.socket, name="pool-overhead")
    for gib in a.sizes.split(","):
        one(c, float(gib))
    return 0


def one(c, gib):
    import torch
    import gshm.torch as gt
    from restart_bench import config_for
    from transformers import LlamaForCausalLM
    cfg = config_for(gib)
    torch.set_default_dtype(torch.bfloat16)
    pool = gt.MemPool(c, "overhead-%g" % gib, device=0)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with gt.use_pool(pool):
        with torch.device("cuda:0"):
            m = LlamaForCausalLM(cfg)
    torch.cuda.synchronize()
    res = {"gib": gib, "layers": cfg.num_hidden_layers,
           "build_s": round(time.perf_counter() - t0, 3),
           "weights": sum(t.numel() * t.element_size() for t in m.state_dict().values())}
    snap = []
    try:
        snap = pool.torch_pool.snapshot()
        res["torch_segments"] = len(snap)
        res["torch_reserved"] = sum(s["total_size"] for s in snap)
        res["torch_allocated"] = sum(s["allocated_size"] for s in snap)
        free = [b["size"] for s in snap for b in s["blocks"] if b["state"] == "inactive"]
        res["torch_free_blocks"] = len(free)
        res["torch_free_bytes"] = sum(free)
    except Exception as e:  # the snapshot's format is PyTorch's, not ours
        res["torch_snapshot_error"] = repr(e)
    segs = pool.segments()
    res["gshm_segments"] = len(segs)
    res["gshm_bytes"] = sum(s.size for s in segs)
    res["gshm_live"] = sum(s.live_bytes for s in segs)
    res["over_weights"] = round(res["gshm_bytes"] / res["weights"] - 1, 4)
    print(json.dumps(res), flush=True)
    del m, snap
    pool.release()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="a running gshmd's socket (default: start --gshmd)")
    ap.add_argument("--gshmd", help="gshmd to start on a temporary socket")
    ap.add_argument("--sizes", default="2,16", help="GiB of weights, comma-separated")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    daemon = None
    if not a.socket:
        import gshm_testutil
        if a.gshmd:
            os.environ["GSHMD"] = os.path.abspath(a.gshmd)
        daemon = gshm_testutil.Daemon(backend="cuda").start()
        a.socket = daemon.socket
    try:
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), "--child", "--socket",
                              a.socket, "--sizes", a.sizes], timeout=300)
    finally:
        if daemon is not None:
            daemon.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main())
