#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gshm as PyTorch's allocator on one GPU (ctest: python_torch_gpu, label gpu).

    python3 python/tests/test_torch_pool_gpu.py [-v]

1. Engine restart: process A builds a transformers Llama (random weights
   from a fixed seed, >= 300 MB of bf16) inside a persistent gshm pool,
   publishes it and is SIGKILLed; process B attaches, loads with
   assign=True, and its logits for fixed tokens equal A's exactly, with
   torch.cuda.max_memory_allocated() under 1% of the weights; unlinking the
   prefix gives the GPU's free memory (gshmd's cuMemGetInfo) back to within
   1 MiB of where it was before A started.
2. load_safetensors of a >= 1 GiB file gives the bytes share_state_dict
   gives of the same tensors, with torch.cuda.max_memory_allocated() 0;
   one that fails midway leaves no lease while its exception is held.
3. PyTorch's limits and bad input: expandable_segments refused,
   empty_cache keeps the pool's memory, a pool released under live
   tensors keeps them valid, unknown device, closed client, stale
   manifest, a pool for a GPU other than the current one (two GPUs),
   a non-persistent pool goes with its process, a pool free during a
   capture on a blocking stream leaves the capture valid.
4. Squatted names (as root): nobody's "torchtest/sq/seg-000000" and the
   next 39 names; a pool of that prefix is made, grows past them,
   publishes and attaches, and nobody's names stay its own.

Exits 77 when no interpreter here has torch with a CUDA GPU, transformers
and safetensors ($GSHM_GPU_PYTHON picks one).  Paths as run_gpu.py."""

import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gshm_testutil  # noqa: E402  (puts the package on sys.path)

SKIP = 77
MiB = 1 << 20
PREFIX = "torchtest/llama"
LLAMA = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=10,
             num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256,
             tie_word_embeddings=False, attn_implementation="eager")
TOKENS = [1, 15043, 29892, 590, 1024, 338, 263, 1243, 310, 278, 6590, 1788, 29889, 13, 450, 2]


def llama(meta=False):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = dict(LLAMA)
    attn = cfg.pop("attn_implementation")
    config = LlamaConfig(**cfg)
    config._attn_implementation = attn
    if meta:
        with torch.device("meta"):
            return LlamaForCausalLM(config)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def logits_of(model):
    import torch
    ids = torch.tensor([TOKENS], device="cuda:0")
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.cpu().float()


# ------------------------------------------------------------ child roles

def role_a(sock, out_dir):
    """Builds the model in a persistent pool, publishes, then waits to die."""
    import torch
    import gshm
    import gshm.torch as gt
    c = gshm.Client(sock, name="engine-a")
    # a pull test (test_pull_model_gpu) needs the model readable by others:
    # what a plain cluster.export pattern lets a peer read
    mode = int(os.environ.get("GSHM_TEST_POOL_MODE", "600"), 8)
    pool = gt.MemPool(c, PREFIX, device=0, persistent=True, mode=mode)
    model = llama()
    with gt.use_pool(pool):
        model = model.to(device="cuda:0", dtype=torch.bfloat16)
    model.eval()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    torch.save(logits_of(model), os.path.join(out_dir, "logits-a.pt"))
    pool.publish(model, metadata={"model": "llama-test"})
    segs = pool.segments()
    # every parameter is in a pool segment (publish checked it too)
    print("PUBLISHED " + json.dumps({
        "weights": weights, "segments": len(segs), "pool_bytes": sum(s.size for s in segs),
        "allocated_default": torch.cuda.memory_allocated(0)}), flush=True)
    time.sleep(3600)


def role_b(sock, out_dir):
    """A restarted engine: attach, load with assign=True, forward."""
    import torch
    import gshm
    import gshm.torch as gt
    c = gshm.Client(sock, name="engine-b")
    # Any process's first matmuls make cuBLAS take its workspace (32 MiB on
    # an H100) from PyTorch's allocator: a fixed cost of using the GPU, not
    # of loading weights, so it is taken before the measurement starts.
    x = torch.ones(1, len(TOKENS), 64, dtype=torch.bfloat16, device="cuda:0")
    torch.nn.functional.linear(x, torch.ones(64, 64, dtype=torch.bfloat16, device="cuda:0"))
    torch.matmul(x.view(1, 1, len(TOKENS), 64), x.view(1, 1, 64, len(TOKENS)))
    torch.cuda.synchronize()
    del x
    baseline = torch.cuda.memory_allocated(0)
    torch.cuda.reset_peak_memory_stats(0)
    t0 = time.monotonic()
    sd = gt.attach(c, PREFIX, device=0)
    t_attach = time.monotonic() - t0
    sd_allocated = torch.cuda.memory_allocated(0) - baseline
    model = llama(meta=True)
    gt.load_module(model, sd)
    model.eval()
    for n, p in list(model.named_parameters()) + list(model.named_buffers()):
        assert p.device.type == "cuda", (n, p.device)
    loaded = torch.cuda.memory_allocated(0) - baseline
    weights = sum(t.numel() * t.element_size() for t in sd.values())
    torch.save(logits_of(model), os.path.join(out_dir, "logits-b.pt"))
    torch.cuda.synchronize()
    print(json.dumps({"weights": weights, "workspace": baseline, "after_load": loaded,
                      "sd_allocated": sd_allocated,
                      "max_allocated": torch.cuda.max_memory_allocated(0) - baseline,
                      "attach_s": t_attach, "metadata": sd.metadata}), flush=True)


def role_load(sock, out_dir):
    """load_safetensors of a >= 1 GiB file against share_state_dict."""
    import torch
    from safetensors.torch import save_file
    import gshm
    import gshm.torch as gt
    c = gshm.Client(sock, name="loader")
    g = torch.Generator().manual_seed(5)
    sd = {}
    specs = [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2), (torch.int8, 1)]
    total = 0
    i = 0
    while total < (1 << 30) + 3 * MiB:
        dt, size = specs[i % len(specs)]
        rows = 1 + (i * 7919) % 3000
        t = torch.randn(rows, 4096, generator=g).to(dt) if dt != torch.int8 else \
            torch.randint(-128, 127, (rows, 4096), generator=g, dtype=torch.int8)
        sd["layer.%03d.w" % i] = t
        total += t.numel() * size
        i += 1
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.empty(0, 5)
    sd = dict(sorted(sd.items()))
    path = os.path.join(out_dir, "w.safetensors")
    save_file(sd, path)
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats(0)
    loc = gshm.location_of_device(0)
    t0 = time.monotonic()
    a = gt.load_safetensors(c, "torchtest/loaded", path, location=loc, progress=False)
    t_load = time.monotonic() - t0
    assert torch.cuda.memory_allocated(0) == 0
    b = gt.share_state_dict(c, "torchtest/shared", sd, location=loc)
    assert a.size == b.size, (a.size, b.size)
    n = a.info.requested_size
    assert n == b.info.requested_size
    va = torch.from_dlpack(a.view("uint8", (n,), 0, device=0)).cpu()
    vb = torch.from_dlpack(b.view("uint8", (n,), 0, device=0)).cpu()
    same = torch.equal(va, vb)
    # and the tensors read back through load_state_dict are the file's
    back = gt.load_state_dict(c, "torchtest/loaded", device="cuda:0")
    values = all(torch.equal(back[k].cpu(), v) for k, v in sd.items())
    del back
    peak = torch.cuda.max_memory_allocated(0)
    a.close()
    b.close()
    c.unlink("torchtest/loaded")
    c.unlink("torchtest/shared")
    os.unlink(path)
    # A float32 tensor at an odd byte: load_safetensors lays the file out
    # anew (values intact); the same bytes in a segment read in place by
    # load_state_dict are refused (a misaligned GPU view faults in kernels).
    js = json.dumps({"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                     "a": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}).encode()
    js += b" " * (-len(js) % 8)
    odd = struct.pack("<Q", len(js)) + js + b"\x07" + struct.pack("<2f", 1.5, -2.0)
    with open(path, "wb") as f:
        f.write(odd)
    with gt.load_safetensors(c, "torchtest/odd", path, location=loc, progress=False):
        back = gt.load_state_dict(c, "torchtest/odd", device="cuda:0")
        odd_values = back["a"].tolist() == [1.5, -2.0] and back["b"].tolist() == [7]
        del back
    c.unlink("torchtest/odd")
    os.unlink(path)
    with c.create("torchtest/odd-raw", len(odd), location=loc) as seg:
        seg.write(odd, 0)
        try:
            gt.load_state_dict(c, "torchtest/odd-raw", device="cuda:0")
            odd_refused = False
        except ValueError as e:
            odd_refused = "not aligned" in str(e)
    c.unlink("torchtest/odd-raw")
    failed_released = failed_load_releases(c, gt, path, loc)
    print(json.dumps({"bytes": n, "file_bytes": total, "same": same, "values": values,
                      "max_allocated": peak, "load_s": t_load, "odd_values": odd_values,
                      "odd_refused": odd_refused, "failed_released": failed_released}),
          flush=True)


def failed_load_releases(c, gt, path, loc):
    """A load_safetensors that fails midway (a read error injected on the
    second chunk) holds no lease once it raised, while its caller still
    holds the exception (as a retry loop does): the traceback's frames kept
    the device view, and with it the segment's memory, before.  True when
    nothing of the segment is left."""
    import errno
    import torch
    from safetensors.torch import save_file
    import gshm._torch_load as tl
    save_file({"w": torch.zeros(4 * MiB, dtype=torch.uint8)}, path)
    real, calls, kept = tl._readinto_exact, [0], None

    def failing(f, mv):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.EIO, "injected read error")
        return real(f, mv)

    tl._readinto_exact = failing
    try:
        gt.load_safetensors(c, "torchtest/failed", path, location=loc, chunk_bytes=MiB,
                            progress=False)
    except OSError as e:
        kept = e  # and its __traceback__, with every frame
    finally:
        tl._readinto_exact = real
    os.unlink(path)
    left = [l.segment for l in c.leases()
            if l.pid == os.getpid() and l.segment == "torchtest/failed"]
    listed = [s.name for s in c.segments() if s.name == "torchtest/failed"]
    released = kept is not None and calls[0] == 2 and not left and not listed
    del kept
    return released


def free_during_capture(c, gt):
    """gshm_torch_free while a capture runs on a blocking stream of the
    pool's context (PyTorch's out-of-memory retry frees pool blocks inside
    an allocation): the capture must survive (no cuCtxSynchronize, which
    invalidates a capture in every mode: libgshm asks the legacy stream
    first), the block is kept (gshm_torch_last_error < 0), and a free
    after the capture gives it back.  Relaxed mode: the wait alone is what
    could break it.  Before the fix: the capture ended invalidated."""
    import ctypes
    import torch
    from gshm import _lib as L
    vp = ctypes.c_void_p
    lib, cuda = L.lib(), ctypes.CDLL("libcuda.so.1")
    activate = L.optional_symbol("gshm_pool_activate")  # (its prototype: pointers)
    last_error = L.optional_symbol("gshm_torch_last_error")
    malloc, free = lib.gshm_torch_malloc, lib.gshm_torch_free
    malloc.restype, malloc.argtypes = vp, [ctypes.c_ssize_t, ctypes.c_int, vp]
    free.restype, free.argtypes = None, [vp, ctypes.c_ssize_t, ctypes.c_int, vp]
    res = {}
    torch.zeros(1, device="cuda:0")  # device 0's primary context current here
    pool = gt.MemPool(c, "torchtest/capture", device=0, persistent=False)
    prev = activate(pool._ptr)
    p = malloc(MiB, 0, None)
    activate(prev)
    res["capture_block"] = bool(p)
    s, graph, st = vp(), vp(), ctypes.c_int(-1)
    res["capture_stream"] = cuda.cuStreamCreate(ctypes.byref(s), 0) == 0  # blocking
    res["capture_begins"] = cuda.cuStreamBeginCapture_v2(s, 2) == 0  # relaxed
    free(p, MiB, 0, None)
    err = last_error()
    cuda.cuStreamIsCapturing(s, ctypes.byref(st))
    res["free_during_capture_keeps_capture"] = st.value == 1  # ACTIVE
    res["free_during_capture_capture_ends"] = cuda.cuStreamEndCapture(s, ctypes.byref(graph)) == 0
    res["free_during_capture_keeps_block"] = err < 0
    if graph.value:
        cuda.cuGraphDestroy(graph)
    cuda.cuStreamDestroy_v2(s)
    free(p, MiB, 0, None)  # after the capture: waits, gives it back
    res["free_after_capture_gives_back"] = last_error() == 0 and not pool.segments()
    pool.release()
    return res


def role_limits(sock, out_dir):
    """PyTorch's known limits and the bad-input cases, one line each."""
    import torch
    import gshm
    import gshm.torch as gt
    res = {}
    c = gshm.Client(sock, name="limits")

    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        gt.MemPool(c, "torchtest/exp", device=0)
        res["expandable_refused"] = False
    except RuntimeError as e:
        res["expandable_refused"] = "expandable_segments" in str(e)
    del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    res["expandable_nothing_left"] = not c.exists("torchtest/exp/seg-000000")

    try:
        gt.MemPool(c, "torchtest/dev", device=torch.cuda.device_count() + 3)
        res["unknown_device"] = False
    except gshm.NoDevice:
        res["unknown_device"] = True

    # a granule that is no byte count: ctypes made -2 MiB 2^64 - 2 MiB (a
    # multiple of 2 MiB, which libgshm took)
    for name, bad in (("negative", -2 * MiB), ("over_64_bits", 1 << 64)):
        try:
            gt.MemPool(c, "torchtest/granule", device=0, granule=bad)
            res["granule_%s_refused" % name] = False
        except ValueError as e:
            res["granule_%s_refused" % name] = "granule" in str(e)

    # mode 0: gshmd takes 0 for its default (0600), so it was 0600 silently
    # (create and pull refuse it: InvalidArgument)
    try:
        gt.MemPool(c, "torchtest/mode0", device=0, mode=0)
        res["mode_zero_refused"] = False
    except gshm.InvalidArgument:
        res["mode_zero_refused"] = not c.exists("torchtest/mode0/seg-000000")

    # empty_cache cannot take the pool's memory, nor corrupt live tensors
    pool = gt.MemPool(c, "torchtest/ec", device=0)
    with gt.use_pool(pool):
        x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
        y = torch.ones(3 << 20, dtype=torch.float32, device="cuda:0")
    del y
    before = [(s.name, s.size) for s in pool.segments()]
    torch.cuda.empty_cache()
    res["empty_cache_keeps_segments"] = [(s.name, s.size) for s in pool.segments()] == before
    res["empty_cache_keeps_data"] = bool((x.cpu() == torch.arange(1 << 20,
                                                                  dtype=torch.float32)).all())
    # a prefix in use is refused up front
    try:
        gt.MemPool(c, "torchtest/ec", device=0)
        res["prefix_in_use"] = False
    except gshm.Exists:
        res["prefix_in_use"] = True
    # released while x lives: the names go, x stays valid, nothing unmapped
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pool.release()
    res["release_warns_live"] = any("alive" in str(m.message) for m in w)
    res["release_unlinks"] = not any(s.name.startswith("torchtest/ec/") and not s.unlinked
                                     for s in c.segments())
    x.add_(1)
    torch.cuda.synchronize()
    res["live_tensor_valid"] = bool((x.cpu() == torch.arange(1 << 20, dtype=torch.float32) + 1)
                                    .all())
    del x
    try:
        with gt.use_pool(pool):
            pass
        res["released_refused"] = False
    except ValueError:
        res["released_refused"] = True
    # released again now that x is gone: PyTorch's cached block of it and
    # the pool go (a second release returned at once and kept them)
    ec_free = torch.cuda.mem_get_info(0)[0]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pool.release()
    res["release_again_quiet"] = not [m for m in w if "alive" in str(m.message)]
    res["release_again_frees"] = pool.segments() == [] and pool.torch_pool is None
    deadline = time.monotonic() + 5  # (gshmd frees the segment once its lease is gone)
    while torch.cuda.mem_get_info(0)[0] < ec_free + 200 * MiB and time.monotonic() < deadline:
        time.sleep(0.05)
    res["release_again_returns"] = torch.cuda.mem_get_info(0)[0] >= ec_free + 200 * MiB

    # a pool whose client is closed
    c2 = gshm.Client(sock, name="limits-2")
    pool2 = gt.MemPool(c2, "torchtest/closed", device=0)
    c2.close()
    try:
        with gt.use_pool(pool2):
            torch.empty(1 << 20, device="cuda:0")
        res["closed_client_refused"] = False
    except ValueError as e:
        res["closed_client_refused"] = "client is closed" in str(e)

    # released with nothing alive: everything returns at once
    pool3 = gt.MemPool(c, "torchtest/idle", device=0, granule=64 * MiB)
    with gt.use_pool(pool3):
        z = torch.zeros(5 << 20, device="cuda:0")
    del z
    free_before = torch.cuda.mem_get_info(0)[0]
    pool3.release()
    res["idle_release_leaves_no_names"] = not any(s.name.startswith("torchtest/idle/")
                                                  for s in c.segments())
    res["idle_release_returns_mib"] = (torch.cuda.mem_get_info(0)[0] - free_before) // MiB

    # a stale manifest: a segment created again under its name
    pool4 = gt.MemPool(c, "torchtest/stale", device=0, granule=32 * MiB)
    with gt.use_pool(pool4):
        w4 = torch.ones(1 << 20, device="cuda:0")
    pool4.publish({"w": w4, "w_tied": w4, "w_t": w4.view(1024, 1024).t()})
    seg0 = pool4.segments()[0].name
    sd = gt.attach(c, "torchtest/stale", device=0)
    res["attach_small_ok"] = bool((sd["w"].cpu() == 1).all())
    res["attach_tied_is_one_tensor"] = sd["w_tied"] is sd["w"]
    res["attach_strided_view"] = (tuple(sd["w_t"].stride()) == (1, 1024)
                                  and sd["w_t"].data_ptr() == sd["w"].data_ptr())
    # owner pinning (test_pool_host has the other users): the prefix is
    # this user's, so an attach that expects another owner is refused,
    # naming the manifest, before anything is mapped
    try:
        gt.attach(c, "torchtest/stale", device=0, owner=c.uid() + 1)
        res["other_owner_refused"] = False
    except gt.UntrustedSegment as e:
        res["other_owner_refused"] = "'torchtest/stale/manifest' is owned by" in str(e)
    res["own_owner_ok"] = bool((gt.attach(c, "torchtest/stale", device=0, owner=c.uid())["w"]
                                .cpu() == 1).all())
    # a dtype gshm knows that this torch lacks (float8 before torch 2.1):
    # gshm's ManifestError naming the entry, not a bare AttributeError
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is not None:
        pool4.publish({"w8": w4.view(f8)}, {"of": "w8"})
        del torch.float8_e4m3fn
        try:
            gt.attach(c, "torchtest/stale", device=0)
            res["missing_dtype_refused"] = False
        except gt.ManifestError as e:
            res["missing_dtype_refused"] = "'w8'" in str(e) and "float8_e4m3fn" in str(e)
        finally:
            torch.float8_e4m3fn = f8
        pool4.publish({"w": w4, "w_tied": w4, "w_t": w4.view(1024, 1024).t()})
    del sd
    # an attach that fails midway (here at its first view: Ctrl-C) holds
    # no view of the prefix's segments while its exception is kept: the
    # whole-segment tensors stayed in the frame that the traceback keeps
    # (a retry in the handler mapped everything twice)
    from gshm import _dlpack, _manifest as gm
    real_extent, kept, exports = gm.tensor_extent, None, _dlpack.live_exports()

    def interrupted(*args):
        raise KeyboardInterrupt

    gm.tensor_extent = interrupted
    try:
        gt.attach(c, "torchtest/stale", device=0)
    except KeyboardInterrupt as e:
        kept = e
    finally:
        gm.tensor_extent = real_extent
    res["failed_attach_keeps_no_view"] = kept is not None and _dlpack.live_exports() == exports
    del kept
    c.unlink(seg0)
    c.create(seg0, 2 * MiB, location=gshm.location_of_device(0)).close()
    try:
        gt.attach(c, "torchtest/stale", device=0)
        res["stale_refused"] = False
    except gt.StaleManifest:
        res["stale_refused"] = True
    c.unlink(seg0)
    try:
        gt.attach(c, "torchtest/stale", device=0)
        res["gone_refused"] = False
    except gt.StaleManifest:
        res["gone_refused"] = True
    try:
        gt.attach(c, "torchtest/never", device=0)
        res["unpublished_refused"] = False
    except gshm.NotFound:
        res["unpublished_refused"] = True
    # a tensor from outside the pool cannot be published
    try:
        pool4.publish({"w": torch.ones(4, device="cuda:0")})
        res["foreign_tensor_refused"] = False
    except ValueError:
        res["foreign_tensor_refused"] = True
    del w4
    pool4.release()
    gt.unlink_prefix(c, "torchtest/stale")

    # a pool for another GPU than the current one: torch binds a MemPool to
    # the device current when it is built, so it was bound to GPU 0 and
    # GPU 1's tensors bypassed gshm (publish then refused them)
    if torch.cuda.device_count() >= 2:
        with torch.cuda.device(0):
            pool6 = gt.MemPool(c, "torchtest/other", device=1)
            with gt.use_pool(pool6):
                o = torch.full((1 << 20,), 3.0, device="cuda:1")
            segs = pool6.segments()
            res["other_device_in_gshm"] = bool(segs) and all(s.name.startswith("torchtest/other/")
                                                             for s in segs)
            pool6.publish({"o": o})
            res["other_device_attach"] = bool((gt.attach(c, "torchtest/other", device=1)["o"]
                                               .cpu() == 3).all())
        del o
        pool6.release()
        gt.unlink_prefix(c, "torchtest/other")
    else:
        res["other_device"] = "skipped: one GPU"

    # a non-persistent pool: no names, and publish refuses
    pool5 = gt.MemPool(c, "torchtest/np", device=0, persistent=False)
    with gt.use_pool(pool5):
        v = torch.ones(1 << 20, device="cuda:0")
    res["nonpersistent_unnamed"] = not c.exists("torchtest/np/seg-000000")
    try:
        pool5.publish({"v": v})
        res["nonpersistent_publish_refused"] = False
    except ValueError:
        res["nonpersistent_publish_refused"] = True
    res.update(free_during_capture(c, gt))
    print(json.dumps(res), flush=True)
    # exits with v alive: the pool's memory goes with the process


SQUATTED = 40  # "torchtest/sq/seg-000000" .. "-000039", nobody's: past 32 names in a row


def role_squatted(sock, out_dir):
    """A persistent pool under a prefix whose first SQUATTED segment names
    another user (nobody) took first: made, grown past them, published and
    attached, every segment this user's and none of them a squatted name."""
    import torch
    import gshm
    import gshm.torch as gt
    res = {}
    c = gshm.Client(sock, name="squatted")
    pool = gt.MemPool(c, "torchtest/sq", device=0, granule=2 * MiB)  # gshm.Exists before
    with gt.use_pool(pool):
        # 12 MiB each: a block of its own in PyTorch (from 10 MiB), so a
        # segment of its own here (past the 2 MiB granule): three growths
        ts = {"t%d" % i: torch.full((3 << 20,), float(i), device="cuda:0") for i in range(3)}
    segs = pool.segments()
    me = c.uid()
    res["grown_past"] = len(segs) >= 3 and all(
        s.name.startswith("torchtest/sq/seg-") and int(s.name.rsplit("-", 1)[1]) >= SQUATTED
        and c.stat(s.name).uid == me for s in segs)
    pool.publish(ts)
    sd = gt.attach(c, "torchtest/sq", device=0)
    res["attached"] = sorted(sd) == sorted(ts) and all(
        bool((sd[k].cpu() == ts[k].cpu()).all()) for k in ts)
    del sd, ts
    pool.release()
    res["released"] = not any(s.name.startswith("torchtest/sq/") and s.uid == me
                              and not s.unlinked for s in c.segments())
    print(json.dumps(res), flush=True)


ROLES = {"a": role_a, "b": role_b, "load": role_load, "limits": role_limits,
         "squatted": role_squatted}


# ------------------------------------------------------------ orchestration

def child(py, role, sock, out_dir, timeout=300):
    p = subprocess.run([py, os.path.abspath(__file__), "--role", role, sock, out_dir],
                       env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("role %s failed (%d):\n%s" % (role, p.returncode,
                                                           p.stderr.decode()[-4000:]))
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def free_memory(c):
    return c.devices()[0].free_memory


def wait_free(c, want, slack, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        f = free_memory(c)
        if abs(f - want) <= slack or time.monotonic() > deadline:
            return f
        time.sleep(0.2)


def wait_published(a, a_err):
    """Role A's PUBLISHED line, parsed (A is the Popen, its stderr in the
    file a_err); AssertionError with A's stderr when it does not come."""
    line = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = a.stdout.readline()
        if not line or line.startswith(b"PUBLISHED "):
            break
    if not line.startswith(b"PUBLISHED "):
        a.kill()
        a.wait()
        a_err.seek(0)
        raise AssertionError("A did not publish:\n%s" % a_err.read().decode()[-4000:])
    return json.loads(line[len(b"PUBLISHED "):])


def check_restart(py, daemon, c, out_dir, log):
    # gshmd's first device segment sets up state it keeps: not ours to count
    c.create("torchtest/warm-up", 2 * MiB, location="cuda:0").close()
    c.unlink("torchtest/warm-up")
    free0 = free_memory(c)
    # A's stderr to a file: a pipe nobody reads while A runs could fill and stop it
    a_err = open(os.path.join(out_dir, "a.stderr"), "w+b")
    a = subprocess.Popen([py, os.path.abspath(__file__), "--role", "a", daemon.socket, out_dir],
                         env=gshm_testutil.child_env(), stdout=subprocess.PIPE, stderr=a_err)
    try:
        info = wait_published(a, a_err)
        log("A: %s" % info)
        assert info["weights"] >= 300e6, info
        # gshmctl segments: the pool's segments, owned by us, held by A
        segs = json.loads(daemon.gshmctl("--json", "segments").stdout)["segments"]
        mine = [s for s in segs if s["name"].startswith(PREFIX + "/seg-")]
        assert len(mine) == info["segments"] and mine, segs
        assert all(s.get("uid", os.getuid()) == os.getuid() for s in mine), mine
        maps = [m for m in daemon.mappings() if m.get("segment", m.get("segment_name", ""))
                .startswith(PREFIX + "/") and m.get("pid") == a.pid]
        assert maps, daemon.mappings()
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
        a.stdout.close()
        a_err.close()
    # persistent: the names and memory outlive A's SIGKILL
    failures = []
    try:
        check_b(py, daemon, c, out_dir, log)
    except Exception:
        failures.append(traceback.format_exc())
    # Whatever B found, the prefix is unlinked and the free memory checked:
    # the pool's memory must all come back.
    import gshm.torch as gt
    gone = gt.unlink_prefix(c, PREFIX)
    free1 = wait_free(c, free0, MiB)
    log("free before A %d MiB, after unlink %d MiB (diff %d KiB)"
        % (free0 // MiB, free1 // MiB, (free1 - free0) // 1024))
    if not (PREFIX + "/manifest" in gone and len(gone) == info["segments"] + 1):
        failures.append("unlink_prefix removed %r, not the manifest and %d segments"
                        % (gone, info["segments"]))
    if abs(free1 - free0) > MiB:
        failures.append("free device memory %d bytes before A, %d after unlinking (%+d KiB)"
                        % (free0, free1, (free1 - free0) // 1024))
    if failures:
        raise AssertionError("\n".join(failures))


def check_b(py, daemon, c, out_dir, log):
    assert c.exists(PREFIX + "/manifest") and c.exists(PREFIX + "/seg-000000")
    b = child(py, "b", daemon.socket, out_dir)
    log("B: %s" % b)
    import torch
    la = torch.load(os.path.join(out_dir, "logits-a.pt"))
    lb = torch.load(os.path.join(out_dir, "logits-b.pt"))
    assert la.shape == lb.shape and torch.equal(la, lb), "logits differ: max |a-b| = %g" % (
        (la - lb).abs().max().item())
    assert b["metadata"].get("model") == "llama-test", b
    # Allocated through PyTorch by B.  Issue 14 asks for under 1% of the
    # weights; B's first matmul makes cuBLAS take its workspace (32 MiB on
    # an H100, 9% of this 357 MB model) from PyTorch's allocator, a fixed
    # per-process cost that loading the weights any other way pays too, so
    # role_b takes it before measuring and it is checked here to be no more
    # than a workspace.  Beyond it: exactly 0 bytes for the weights
    # (attach + load_module), and under 1% of them through the first
    # forward (activations of 16 tokens).
    assert b["workspace"] <= 64 * MiB, b
    assert b["after_load"] == 0, b
    assert b["max_allocated"] < 0.01 * b["weights"], b
    assert b["sd_allocated"] == 0, b


def check_load(py, daemon, c, out_dir, log):
    r = child(py, "load", daemon.socket, out_dir)
    log("load_safetensors: %s" % r)
    assert r["file_bytes"] >= 1 << 30, r
    assert r["same"] and r["values"], r
    assert r["max_allocated"] == 0, r
    assert r["odd_values"] and r["odd_refused"], r
    assert r["failed_released"], r


def check_limits(py, daemon, c, out_dir, log):
    free0 = free_memory(c)
    r = child(py, "limits", daemon.socket, out_dir)
    log("limits: %s" % r)
    bad = [k for k, v in r.items() if v is False]
    assert not bad, bad
    assert r["idle_release_returns_mib"] >= 60, r  # the 64 MiB segment came back
    # the non-persistent pool went with its process; nothing else is left
    left = [s.name for s in c.segments() if s.name.startswith("torchtest/")]
    assert not left, left
    free1 = wait_free(c, free0, MiB)
    assert abs(free1 - free0) <= MiB, (free0, free1)


def check_squatted(py, daemon, c, out_dir, log):
    """Names are first come, first served: nobody created the first names
    a pool of this user would take; the pool passes over them (libgshm's
    pool_name_create; before, MemPool() raised gshm.Exists).  Needs root
    (to run as nobody)."""
    if os.geteuid() != 0:
        log("squatted: skipped (not root)")
        return
    os.chmod(daemon.tmpdir, 0o755)  # (nobody connects: the socket opened to it)
    os.chmod(daemon.socket, 0o666)
    made = gshm_testutil.run_as(daemon, 65534, (
        "import sys, gshm\n"
        "c = gshm.Client(sys.argv[1], name='squatter')\n"
        "for i in range(%d):\n"
        "    c.create('torchtest/sq/seg-%%06d' %% i, 1, mode=0o600).close()\n" % SQUATTED))
    assert made.returncode == 0, made.stderr.decode()[-2000:]
    try:
        r = child(py, "squatted", daemon.socket, out_dir)
        log("squatted: %s" % r)
        bad = [k for k, v in r.items() if v is False]
        assert not bad, bad
        for i in range(SQUATTED):  # nobody's, untouched
            assert c.stat("torchtest/sq/seg-%06d" % i).uid == 65534
    finally:
        for i in range(SQUATTED):
            c.unlink("torchtest/sq/seg-%06d" % i)  # (root: an admin)
        os.chmod(daemon.socket, 0o600)


def probe(py):
    code = ("import torch, transformers, safetensors\n"
            "print(torch.cuda.device_count() if torch.cuda.is_available() else 0)\n")
    try:
        p = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           timeout=180)
        return int(p.stdout.split()[-1]) if p.returncode == 0 else None
    except Exception:
        return None


def main(argv):
    if argv[:1] == ["--role"]:
        ROLES[argv[1]](argv[2], argv[3])
        return 0
    verbose = "-v" in argv
    py = sys.executable if os.environ.get("GSHM_TORCH_TEST_PROBED") else None
    for cand in ([] if py else [os.environ.get("GSHM_GPU_PYTHON"), sys.executable,
                                "/usr/bin/python3"]):
        if cand and os.path.exists(cand) and (probe(cand) or 0) >= 1:
            py = cand
            break
    if py is None:
        print("test_torch_pool_gpu: skipped: no python with torch + a CUDA GPU, transformers "
              "and safetensors (set $GSHM_GPU_PYTHON)")
        return SKIP
    if py != sys.executable:
        os.environ["GSHM_TORCH_TEST_PROBED"] = "1"  # probed once is enough
        os.execv(py, [py, os.path.abspath(__file__)] + argv)
    import gshm

    def log(msg):
        if verbose:
            print("  " + msg, flush=True)

    passed = failed = 0
    with gshm_testutil.Daemon(backend="cuda") as daemon, \
            tempfile.TemporaryDirectory(prefix="gshm-torch-") as out_dir, \
            gshm.Client(daemon.socket, name="orchestrator") as c:
        for name, fn in (("restart_after_sigkill", check_restart),
                         ("load_safetensors", check_load), ("limits", check_limits),
                         ("squatted_names", check_squatted)):
            t0 = time.monotonic()
            try:
                fn(py, daemon, c, out_dir, log)
                passed += 1
                status = "PASSED"
            except Exception:
                failed += 1
                status = "FAILED"
                traceback.print_exc()
                sys.stderr.write(daemon.log()[-3000:])
                from gshm import _manifest
                for prefix in {s.name.rsplit("/", 1)[0] for s in c.segments()
                               if s.name.startswith("torchtest/")}:
                    _manifest.unlink_prefix(c, prefix)  # the next check starts clean
            print("%s %s (%.1f s)" % (name, status, time.monotonic() - t0), flush=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
