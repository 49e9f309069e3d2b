# SPDX-License-Identifier: Apache-2.0
"""gshm's Python package on GPUs: torch, cupy, DLPack, state dicts.

Needs torch with a CUDA GPU (cupy for the cupy parts) and a gshmd with the
cuda backend, which the gpu_daemon fixture starts.  The "other" GPU (OTHER)
is GPU 1 when there are two; with one GPU it is GPU 0, and the second
process then shares the segment on the same GPU: only the reads over a peer
link go untested.  Run it through run_gpu.py (exits 77 without a GPU), or
with pytest directly."""

import gc
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import gshm_testutil
from gshm_testutil import skip

try:
    import pytest
except ImportError:  # run_gpu.py runs these tests without pytest too
    pytest = None

try:
    import torch
    _GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
except ImportError:
    torch = None
    _GPUS = 0

try:
    import cupy
except Exception:
    cupy = None

if pytest is not None and _GPUS < 1:
    pytest.skip("needs torch with a CUDA GPU (%s)" % ("no torch" if torch is None else
                                                       "none visible"),
                allow_module_level=True)

# The GPU a second process (or a second view) uses: 1 with two GPUs, else 0.
OTHER = 1 if _GPUS >= 2 else 0

import gshm
import gshm.torch as gt
from gshm import _safetensors

MiB = 1 << 20

# ------------------------------------------------------------- fixtures

if pytest is not None:
    @pytest.fixture(scope="module")
    def gpu_daemon():
        d = gshm_testutil.Daemon(backend="cuda")
        d.start()
        yield d
        d.stop()

    @pytest.fixture
    def gpu_client(gpu_daemon):
        with gshm.Client(gpu_daemon.socket, name="pytest-gpu") as c:
            yield c


def run_child(daemon, code, *args, timeout=300):
    src = ("import sys, json, torch, gshm, gshm.torch as gt\nsock = sys.argv[1]\n"
           + textwrap.dedent(code))
    p = subprocess.run([sys.executable, "-c", src, daemon.socket] + [str(a) for a in args],
                       env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("child failed (%d):\n%s" % (p.returncode, p.stderr.decode()))
    return p.stdout.decode()


def random_state_dict(total_bytes, device):
    """A varied state dict of about total_bytes on device."""
    g = torch.Generator(device=device).manual_seed(1234)
    sd = {}
    specs = [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)]
    per = total_bytes // 24
    for i in range(24):
        dt, size = specs[i % len(specs)]
        cols = 1024
        rows = max(1, per // (size * cols))
        sd["layers.%d.weight" % i] = torch.randn(rows, cols, generator=g, device=device).to(dt)
        sd["layers.%d.bias" % i] = torch.randn(cols + i, generator=g, device=device).to(dt)
    sd["embed.idx"] = torch.randint(0, 1 << 40, (1000,), generator=g, device=device)
    sd["mask"] = torch.rand(333, generator=g, device=device) > 0.5
    sd["q.int8"] = torch.randint(-128, 127, (4097,), generator=g, device=device,
                                 dtype=torch.int8)
    sd["scalar"] = torch.tensor(3.25, device=device)
    sd["empty"] = torch.empty(0, 16, device=device)
    return sd


def digest(t):
    t = t.detach().contiguous().cpu()
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.sha256(bytes(raw.numpy().tobytes())).hexdigest()


# ---------------------------------------------------------------- tests

def test_state_dict_gpu0_to_gpu1_in_another_process(gpu_daemon, gpu_client, segname):
    sd = random_state_dict(300 * MiB, "cuda:0")
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    assert nbytes >= 290 * MiB
    seg = gt.share_state_dict(gpu_client, segname, sd, location=gshm.location_of_device(0))
    assert not seg.is_host and seg.requested_size >= nbytes
    assert seg.info.gpu_uuid == gshm.location_of_device(0)[5:]
    seg.close()
    want = {k: [str(t.dtype), list(t.shape), digest(t)] for k, t in sd.items()}
    out = run_child(gpu_daemon, """
        name, dev = sys.argv[2], "cuda:%s" % sys.argv[3]
        with gshm.Client(sock, name="gpu1-loader") as c:
            sd = gt.load_state_dict(c, name, device=dev)
            lo, hi = sd.address, sd.address + sd.info.size
            res = {}
            for k, t in sd.items():
                assert t.device == torch.device(dev), (k, t.device)
                if t.numel():
                    assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi, k
                raw = t.contiguous().cpu().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
                import hashlib
                res[k] = [str(t.dtype), list(t.shape), hashlib.sha256(raw.numpy().tobytes()).hexdigest()]
            # the lease is held while the tensors live, by this process
            mine = [l for l in c.leases() if l.segment == name and l.pid == __import__("os").getpid()]
            assert len(mine) == 1 and mine[0].access == "r", mine
            print(json.dumps(res))
        """, segname, OTHER)
    got = json.loads(out.strip().splitlines()[-1])
    assert got == want
    gpu_client.unlink(segname)


def test_view_while_another_thread_unmaps_is_refused(gpu_client, segname):
    # DeviceSegment.unmap checks for live views under the package's lock,
    # then unmaps outside it (gshm_unmap waits for the client's lock); a
    # view() on another thread in between got the old address and a
    # DeviceArray over memory about to be unmapped (a GPU fault at its
    # first use).  Now a view meanwhile is a BufferError, and after the
    # unmap a view maps again.
    import threading
    from gshm import _segment
    seg = gpu_client.create(segname, 2 << 20, location="cuda:0")
    gpu_client.unlink(segname)
    seg.map()
    entered, go = threading.Event(), threading.Event()
    orig = _segment.Segment.unmap

    def slow_unmap(self):
        entered.set()
        go.wait(10)
        orig(self)

    _segment.Segment.unmap = slow_unmap
    t = threading.Thread(target=seg.unmap)
    t.start()
    try:
        assert entered.wait(10)
        try:
            seg.view("uint8")
            raise AssertionError("a view while another thread unmaps was made")
        except BufferError:
            pass
    finally:
        go.set()
        t.join(10)
        _segment.Segment.unmap = orig
    assert not seg.mapped
    v = seg.view("uint8", (16,))
    assert seg.mapped and v.ptr == seg.address
    del v
    seg.close()


def test_loaded_tensors_are_views_on_the_segment(gpu_daemon, gpu_client, segname):
    sd = {"a": torch.arange(1 << 20, dtype=torch.float32, device="cuda:0"),
          "b": torch.ones(3, 5, dtype=torch.bfloat16, device="cuda:0")}
    gt.share_state_dict(gpu_client, segname, sd).close()
    loaded = gt.load_state_dict(gpu_client, segname, device="cuda:%d" % OTHER, access="rw")
    lo, hi = loaded.address, loaded.address + loaded.info.size
    for k, t in loaded.items():
        assert lo <= t.data_ptr() < hi and t.device.index == OTHER
        assert torch.equal(t.cpu(), sd[k].cpu())
    # write through the loaded view on GPU 1, see it in a fresh load on GPU 0
    loaded["a"][:10] = -1
    torch.cuda.synchronize(OTHER)
    again = gt.load_state_dict(gpu_client, segname, device="cuda:0")
    assert again["a"][:10].eq(-1).all().item() and again["a"][10].item() == 10
    pid = os.getpid()
    assert any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    del loaded, again, t
    gc.collect()
    torch.cuda.synchronize()
    assert not any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    gpu_client.unlink(segname)


def test_read_only_host_state_dict_holds_its_lease(gpu_daemon, gpu_client, segname):
    """load_state_dict with access "r" on a host segment gives tensors on a
    private copy-on-write mapping, which held no reference to the segment:
    the lease ended when load_state_dict returned, while the docstring
    says the tensors hold it.  Now the mapping holds the segment."""
    gt.share_state_dict(gpu_client, segname, {"w": torch.arange(64.0)}, location="host").close()
    pid = os.getpid()
    loaded = gt.load_state_dict(gpu_client, segname)
    w = loaded["w"]
    del loaded
    gc.collect()
    assert any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    assert float(w.sum()) == 2016.0
    del w
    gc.collect()
    assert not any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    gpu_client.unlink(segname)


def _plant_state_dict_as(daemon, uid, names):
    """State dicts {"w": 8 x 7.0 float32} in host segments `names` (mode
    0644), created by uid: a child process that drops to uid once gshm is
    loaded, before it connects (gshmd knows a connection by its peer's
    uid), so nothing needs to be readable or executable by that user.  A
    new process, not a fork of this one, which has torch's and CUDA's
    threads: a forked copy may deadlock on a lock one of them held."""
    layout = _safetensors.plan([("w", "float32", (8,))])
    script = textwrap.dedent("""
        import os, sys, gshm
        uid = int(sys.argv[2])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        header, size, begin = bytes.fromhex(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        with gshm.Client(sys.argv[1], name="planter") as c:
            for name in sys.argv[6:]:
                with c.create(name, size, location="host", mode=0o644) as seg:
                    seg.write(header, 0)
                    seg.write(b"\\x00\\x00\\xe0\\x40" * 8, begin)  # 7.0f, little-endian
        """)
    args = [daemon.socket, uid, layout.header.hex(), layout.size, layout.entries[0][3]] + names
    p = subprocess.run([sys.executable, "-c", script] + [str(a) for a in args],
                       env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, "planting as uid %d failed: %s" % (uid, p.stderr.decode())


def _refused(fn, *args, **kwargs):
    """The UntrustedSegment's message when fn(*args, **kwargs) raises it;
    AssertionError when it returns."""
    try:
        fn(*args, **kwargs)
    except gt.UntrustedSegment as e:
        return str(e)
    raise AssertionError("%s%r was taken" % (fn.__name__, args))


def test_load_state_dict_refuses_a_name_another_user_planted():
    """Names are first come, first served: another user (nobody) may create
    the name a state dict is shared under before its sharer does (or after
    an unlink).  load_state_dict took any segment by that name and handed
    nobody's bytes out as the reader's weights.  Now it expects the
    segment to be the reader's own uid's (as gshmd knows it) unless told
    another owner, as attach() does, and refuses it naming both, before a
    byte of it is read; the lease is given back at once."""
    if os.geteuid() != 0:
        skip("needs root to act as another user")
    d = gshm_testutil.Daemon(backend="cuda", args=["--set", "daemon.socket_mode=0666"]).start()
    try:
        os.chmod(d.tmpdir, 0o755)
        name = "mine/weights"
        _plant_state_dict_as(d, 65534, [name])
        with gshm.Client(d.socket, name="victim") as c:  # root: uid 0, an admin
            for device in (None, "cuda:0"):
                msg = _refused(gt.load_state_dict, c, name, device=device)
                assert "'%s' is owned by uid 65534" % name in msg, msg
                assert "expects uid 0" in msg, msg
                msg = _refused(gt.load_state_dict, c, name, device=device, owner=0)
                assert "is owned by uid 65534" in msg, msg
            assert [l for l in c.leases() if l.pid == os.getpid()] == []
            # another user's state dict, loaded on purpose: by uid or by name
            import pwd
            for owner in (65534, pwd.getpwuid(65534).pw_name):
                for device in (None, "cuda:0"):
                    sd = gt.load_state_dict(c, name, device=device, owner=owner)
                    assert sd.info.uid == 65534
                    assert sd["w"].tolist() == [7.0] * 8, sd["w"]
                    del sd
    finally:
        d.stop()


def test_load_state_dict_refuses_a_segment_others_may_write(gpu_daemon, gpu_client, segname):
    """A state dict segment that its group or others may write lets them
    change the weights under the reader (the owner pinning means nothing
    then): load_state_dict took it, host or device.  Now it refuses it,
    whoever the owner, as attach() refuses such a pool segment."""
    sd = {"w": torch.arange(8, dtype=torch.float32, device="cuda:0")}
    for location in ("host", gshm.location_of_device(0)):
        gt.share_state_dict(gpu_client, segname, sd, location=location).close()
        for mode in ("0620", "0602", "0666"):
            gpu_daemon.gshmctl("chmod", segname, mode)
            msg = _refused(gt.load_state_dict, gpu_client, segname, device="cuda:0")
            assert "mode %s: others than its owner may write it" % mode in msg, msg
        gpu_daemon.gshmctl("chmod", segname, "0640")
        back = gt.load_state_dict(gpu_client, segname, device="cuda:0")
        assert torch.equal(back["w"], sd["w"])
        del back
        gpu_client.unlink(segname)


def test_torch_and_cupy_views_alias_across_processes(gpu_daemon, gpu_client, segname):
    n = 16 * MiB // 4
    seg = gpu_client.create(segname, n * 4, location=gshm.location_of_device(0))
    base = seg.map(devices=[0])
    v = seg.view("float32", (n,))
    t = torch.from_dlpack(v)
    assert t.device == torch.device("cuda:0") and t.data_ptr() == base
    t2 = torch.as_tensor(v, device="cuda:0")  # through __cuda_array_interface__
    assert t2.data_ptr() == base
    t.fill_(1.0)
    torch.cuda.synchronize(0)
    if cupy is not None:
        with cupy.cuda.Device(0):
            c = cupy.asarray(seg.view("float32", (n,)))
            assert c.data.ptr == base
            assert float(c.sum()) == n
            c[:] = 2.0
            cupy.cuda.runtime.deviceSynchronize()
        assert float(t.sum().item()) == 2.0 * n
    else:
        t.fill_(2.0)
        torch.cuda.synchronize(0)
    # another process, on GPU 1 (GPU 0 with one GPU), sees 2.0 and writes 3.0
    # into the first half
    out = run_child(gpu_daemon, """
        name, n, dev = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        with gshm.Client(sock) as c, c.open(name, "rw") as seg:
            seg.map(devices=[dev])
            x = torch.from_dlpack(seg.view("float32", (n,), device=dev))
            assert x.device == torch.device("cuda", dev)
            print(float(x.sum().item()))
            x[: n // 2] = 3.0
            torch.cuda.synchronize(dev)
            del x
        """, segname, n, OTHER)
    assert float(out.split()[-1]) == 2.0 * n
    assert t[: n // 2].eq(3.0).all().item() and t[n // 2:].eq(2.0).all().item()
    if cupy is not None:
        with cupy.cuda.Device(0):
            assert float(c[: n // 2].sum()) == 3.0 * (n // 2)
        del c
    del t, t2, v
    seg.close()
    gpu_client.unlink(segname)


def test_tensor_keeps_lease_after_close(gpu_daemon, gpu_client, segname):
    seg = gpu_client.create(segname, 4 * MiB, location=gshm.location_of_device(0))
    t = torch.from_dlpack(seg.view("int32", (1024,)))
    t.fill_(7)
    seg.close()
    pid = os.getpid()
    assert any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    assert t.sum().item() == 7 * 1024  # still mapped
    del t
    gc.collect()
    torch.cuda.synchronize()
    assert not any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    gpu_client.unlink(segname)


def test_tensor_freed_while_raising_keeps_the_error_and_ends_the_lease(gpu_daemon, gpu_client,
                                                                        segname):
    # A tensor from a DLPack view whose last reference goes on an error
    # path of the interpreter (a temporary dropped after IndexError was
    # set) ran gshm's deleter with that exception pending: a ctypes
    # callback then loses it (SystemError), and the export, its mapping and
    # the lease stayed for the process's life.  libgshm's
    # gshm_py_dlpack_deleter sets the exception aside around the callback.
    seg = gpu_client.create(segname, 4 * MiB, location=gshm.location_of_device(0))
    pid = os.getpid()
    try:
        [torch.from_dlpack(seg.view("int32", (1024,)))][5]
    except IndexError:
        pass  # (a SystemError is the bug)
    seg.close()
    gc.collect()
    torch.cuda.synchronize()
    assert not any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    gpu_client.unlink(segname)


def test_failed_share_state_dict_holds_no_lease(gpu_daemon, gpu_client, segname):
    """share_state_dict interrupted midway (Ctrl-C during the copies, here
    at the second tensor): its device view stayed in the frame that the
    exception's traceback keeps, and with it the mapping and the lease of
    the unlinked segment (its GPU memory) until the caller dropped the
    exception.  Now nothing of the segment is left while it is held."""
    real, calls, kept = gt._as_bytes, [0], None

    def interrupted(t):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(t)

    sd = {"a": torch.ones(1 << 20, device="cuda:0"), "b": torch.ones(1 << 20, device="cuda:0")}
    gt._as_bytes = interrupted
    try:
        gt.share_state_dict(gpu_client, segname, sd)
    except KeyboardInterrupt as e:
        kept = e  # with its traceback, as a handler that retries holds it
    finally:
        gt._as_bytes = real
    pid = os.getpid()
    assert kept is not None and calls[0] == 2
    assert not any(m["segment"] == segname and m["pid"] == pid for m in gpu_daemon.mappings())
    assert not [l for l in gpu_client.leases() if l.pid == pid and l.segment == segname]
    assert not gpu_client.exists(segname)
    del kept


def test_host_tensor_view_survives_close(gpu_daemon, gpu_client, segname):
    """A torch view of a host segment keeps the memory mapped after close()
    (it once pointed at unmapped memory: torch.frombuffer keeps no export)."""
    seg = gpu_client.create(segname, 1 * MiB, location="host")
    t = gt.tensor_view(seg, "int32", (1024,))
    t.fill_(11)
    seg.close()
    gc.collect()
    assert t.sum().item() == 11 * 1024
    t.add_(1)
    assert int(t[1023]) == 12
    del t
    gc.collect()
    gpu_client.unlink(segname)


def test_read_only_host_tensor_takes_writes_privately(gpu_daemon, gpu_client, segname):
    """A CPU tensor on a host segment opened read-only: torch has no
    read-only tensors, and a write to one on the read-only mapping was a
    SIGSEGV (the child died).  It is a copy-on-write view now: the write
    changes the writer's tensor, never the segment."""
    with gpu_client.create(segname, 1 * MiB, location="host") as seg:
        seg.view("int32")[:] = 5
        out = run_child(gpu_daemon, """
            c = gshm.Client(sock)
            ro = c.open(sys.argv[2], "r")
            t = gt.tensor_view(ro, "int32", (1024,), 4100)
            assert int(t.sum()) == 5 * 1024
            t.fill_(9)
            print(int(t.sum()), ro.read(4100, 4) == (5).to_bytes(4, "little"))
        """, segname)
        assert out.split() == [str(9 * 1024), "True"], out
        assert int(seg.view("int32").sum()) == 5 * (seg.size // 4)
    gpu_client.unlink(segname)
    # load_state_dict (access "r" by default): one copy-on-write mapping for
    # all the tensors, whose data_ptr()s lie in [sd.address, + size)
    gt.share_state_dict(gpu_client, segname, {"w": torch.zeros(64), "b": torch.ones(8)},
                        location="host").close()
    out = run_child(gpu_daemon, """
        c = gshm.Client(sock)
        sd = gt.load_state_dict(c, sys.argv[2])
        for t in sd.values():
            assert sd.address <= t.data_ptr() < sd.address + sd.info.size
        sd["w"].add_(2)
        again = gt.load_state_dict(c, sys.argv[2])
        print(float(sd["w"].sum()), float(again["w"].sum()), float(again["b"].sum()))
    """, segname)
    assert out.split() == ["128.0", "0.0", "8.0"], out
    gpu_client.unlink(segname)


def test_tensor_view_checks_like_view(gpu_client, segname):
    """gshm.torch.tensor_view checked only the bounds of a uint8 view of
    the bytes: a float32 tensor at byte 2 went through, misaligned (every
    GPU kernel reading it faults with 'misaligned address')."""
    for loc in ("host", gshm.location_of_device(0)):
        with gpu_client.create(segname, 2 * MiB, location=loc) as seg:
            for dtype, shape, offset in [("float32", (1,), 2), ("float64", (2,), 4),
                                         ("float32", (-1,), 0), ("uint8", (1,), -1),
                                         ("float32", (seg.size // 4 + 1,), 0)]:
                try:
                    gt.tensor_view(seg, dtype, shape, offset)
                except ValueError:
                    pass
                else:
                    raise AssertionError("no ValueError for %r on %s" % ((dtype, shape, offset),
                                                                         loc))
            t = gt.tensor_view(seg, "float32", (2, 3), 8)
            assert t.shape == (2, 3) and t.dtype == torch.float32
            del t
        gpu_client.unlink(segname)


def test_device_view_bounds_and_dtypes(gpu_client, segname):
    with gpu_client.create(segname, 2 * MiB, location=gshm.location_of_device(0)) as seg:
        size = seg.size
        for dtype, shape, offset in [("float32", (size // 4 + 1,), 0), ("uint8", (1,), size),
                                     ("float64", (1,), 4), ("uint8", (2,), -1)]:
            try:
                seg.view(dtype, shape, offset)
            except ValueError:
                pass
            else:
                raise AssertionError("no ValueError for %r" % ((dtype, shape, offset),))
        b = torch.from_dlpack(seg.view("bfloat16", (4, 4)))
        assert b.dtype == torch.bfloat16 and b.shape == (4, 4)
        with_cai = seg.view("float16", (8,))
        assert with_cai.__cuda_array_interface__["typestr"] == "<f2"
        assert with_cai.__cuda_array_interface__["version"] == 3
        assert seg.view("uint8").__dlpack_device__() == (2, 0)
        del b, with_cai
    gpu_client.unlink(segname)


def test_copy_between_gpus(gpu_client, segname):
    if gshm._lib.optional_symbol("gshm_copy") is None:
        skip("libgshm has no gshm_copy yet")
    n = 8 * MiB
    with gpu_client.create(segname, n, location=gshm.location_of_device(0)) as seg:
        seg.map(devices=sorted({0, OTHER}))
        src = torch.from_dlpack(seg.view("uint8", (n,), device=0))
        src.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0"))
        torch.cuda.synchronize(0)
        dst = torch.empty(n, dtype=torch.uint8, device="cuda:%d" % OTHER)
        with torch.cuda.device(OTHER):
            s = torch.cuda.current_stream(OTHER)
            gshm.copy(dst, seg, n, stream=s)
            s.synchronize()
        assert torch.equal(dst.cpu(), src.cpu())
        del src
    gpu_client.unlink(segname)


# ---------------------------------------- GPU work around views and copies
#
# Each in a child process: on a library that gets them wrong, the GPU
# faults (an illegal address ends the process's CUDA context for good).

def test_dropped_view_waits_for_queued_readers(gpu_daemon, segname):
    # A tensor over a segment dropped while GPU work that reads it is still
    # queued (a kernel on torch's current stream or on a stream of its own,
    # or a copy-engine copy out of it): the work must neither fault nor
    # read the next segment mapped at the same address.  libgshm waits for
    # the contexts that may use a range before its last unmap (after the
    # client's lock: gshm__retire_device_maps); NVIDIA does not say that
    # cuMemUnmap waits (before, this held on driver 580 through the
    # driver's own wait, the current-stream case only tested).
    # (one child each; a loop, not parametrize: run_gpu.py's own runner has none)
    for reader in ("current_stream", "side_stream", "copy_engine"):
        _dropped_view_child(gpu_daemon, segname, reader)


def _dropped_view_child(gpu_daemon, segname, reader):
    out = run_child(gpu_daemon, """
        import gc
        name, reader = sys.argv[2], sys.argv[3]
        n = 64 << 20
        c = gshm.Client(sock)
        a = c.create(name + "/a", n, location="cuda:0")
        c.unlink(name + "/a")
        ta = torch.from_dlpack(a.view("uint8", (n,), device=0))
        ta.fill_(1)
        torch.cuda.synchronize()
        side = torch.cuda.Stream() if reader != "current_stream" else torch.cuda.current_stream()
        out = torch.zeros(n, dtype=torch.uint8, device=0)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(1 << 30)      # about half a second of spinning
            if reader == "copy_engine":
                out.copy_(ta, non_blocking=True)   # cudaMemcpyAsync, queued behind it
                total = None
            else:
                total = ta.to(torch.int32).sum()   # a kernel queued behind it
        old = ta.data_ptr()
        del ta
        a.close()
        gc.collect()                        # the last reference: the unmap
        b = c.create(name + "/b", n, location="cuda:0")
        c.unlink(name + "/b")
        tb = torch.from_dlpack(b.view("uint8", (n,), device=0))
        tb.fill_(2)
        torch.cuda.synchronize()
        got = int(total.item()) if total is not None else int(out.to(torch.int64).sum().item())
        print(json.dumps({"sum": got, "n": n, "same_address": tb.data_ptr() == old}))
        """, segname, reader)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["sum"] == r["n"], (reader, r)


def test_view_dropped_during_graph_capture(gpu_daemon, segname):
    # A tensor over a device segment whose last reference goes while torch
    # captures a CUDA graph on this thread (the garbage collector runs at
    # any allocation): libgshm's last unmap waits for the GPU
    # (cuCtxSynchronize), which CUDA refuses during a capture and which may
    # invalidate it.  The package puts the close off until the next close
    # outside a capture: the capture completes and replays, and the lease
    # ends then.
    out = run_child(gpu_daemon, """
        import gc, os
        name = sys.argv[2]
        n = 1 << 20
        c = gshm.Client(sock)
        mine = lambda: [l for l in c.leases() if l.pid == os.getpid()]
        a = c.create(name, n, location="cuda:0")
        c.unlink(name)
        t = torch.from_dlpack(a.view("uint8", (n,), device=0))
        t.fill_(3)
        a.close()
        before = len(mine())
        x = torch.ones(1024, device="cuda:0")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x * 2              # (warm-up before the capture)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            del t                  # the view's last reference, inside the capture
            gc.collect()
        during = len(mine())
        x.fill_(5)
        g.replay()
        torch.cuda.synchronize()
        replayed = bool((y == 10).all())
        b = c.create(name + "/b", 4096, location="host")
        c.unlink(name + "/b")
        b.close()                  # a close outside the capture: the put-off one too
        print(json.dumps({"before": before, "during": during, "after": len(mine()),
                          "replayed": replayed}))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    assert r == {"before": 1, "during": 1, "after": 0, "replayed": True}, r


def test_view_dropped_during_another_threads_capture(gpu_daemon, segname):
    # A view's last reference goes on one thread while another captures a
    # CUDA graph with CuPy on a blocking stream (CuPy's default kind).  The
    # package's deferral sees only this thread's torch capture; libgshm's
    # unmap wait (cuCtxSynchronize) would invalidate any thread's capture
    # in the context (probed on an H200: every capture mode, the caller's
    # mode relaxed too).  libgshm asks the legacy stream first, which shows
    # a blocking stream's capture harmlessly, and keeps the mapping for a
    # later flush: the capture completes and replays, and the lease ends
    # at the next request after it.  (A non-blocking stream's capture shows
    # nowhere and is still invalidated: gshm.h says unmap outside captures.)
    if cupy is None:
        skip("needs cupy")
    out = run_child(gpu_daemon, """
        import os, threading
        import cupy
        name = sys.argv[2]
        n = 1 << 20
        c = gshm.Client(sock)
        mine = lambda: [l for l in c.leases() if l.pid == os.getpid()]
        a = c.create(name, n, location="cuda:0")
        c.unlink(name)
        v = a.view("uint8", (n,), device=0)
        a.close()
        with cupy.cuda.Device(0):
            x = cupy.ones(1024, dtype=cupy.float32)
            y = cupy.empty_like(x)
            s = cupy.cuda.Stream(non_blocking=False)
            with s:
                cupy.multiply(x, 2, out=y)     # (warm-up: the kernel loaded before the capture)
            s.synchronize()
            started, dropped = threading.Event(), threading.Event()
            res = {}
            def capture():
                with cupy.cuda.Device(0):
                    try:
                        s.begin_capture()
                        with s:
                            cupy.multiply(x, 2, out=y)
                        started.set()
                        dropped.wait(30)
                        g = s.end_capture()
                        x.fill(5)
                        g.launch(s)
                        s.synchronize()
                        res["replayed"] = bool((y == 10).all())
                    except Exception as e:
                        res["error"] = repr(e)
                        started.set()
            t = threading.Thread(target=capture)
            t.start()
            started.wait(30)
            del v                      # the last reference: libgshm's unmap
            during = len(mine())
            dropped.set()
            t.join(60)
        b = c.create(name + "/b", 4096, location="host")   # a request: the flush
        c.unlink(name + "/b")
        b.close()
        res.update(during=during, after=len(mine()))
        print(json.dumps(res))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    assert r == {"replayed": True, "during": 0, "after": 0}, r


def test_copy_into_read_only_mapping_refused(gpu_daemon, segname):
    # An SM copy into a read-only device mapping: -EACCES, not a store that
    # faults on the GPU.  Into a host segment leased read-only (PROT_READ
    # pages; libgshm checks a device destination's access only): refused
    # in Python, gshm.PermissionDenied as well, not a driver copy there.
    for location in ("cuda:0", "host"):
        _copy_into_read_only(gpu_daemon, segname, location)


def _copy_into_read_only(gpu_daemon, segname, location):
    out = run_child(gpu_daemon, """
        name, location = sys.argv[2], sys.argv[3]
        n = 1 << 20
        c = gshm.Client(sock)
        w = c.create(name, n, location=location, mode=0o644)
        w.close()
        ro = c.open(name, "r")
        if location != "host":
            ro.map(devices=[0])
        src = torch.full((n,), 5, dtype=torch.uint8, device="cuda:0")
        try:
            gshm.copy(ro, src, n, method="sm" if location != "host" else "auto")
            torch.cuda.synchronize()
            print("copied")
        except gshm.PermissionDenied as e:
            torch.cuda.synchronize()
            print("refused", e.errno)
        c.unlink(name)
        """, segname, location)
    assert out.strip().splitlines()[-1] == "refused 13", (location, out)


def test_tensors_on_two_gpus_share_one_segment(gpu_daemon, segname):
    # torch copies between GPUs on the source GPU: a segment on GPU 0 that
    # a tensor on GPU 1 is copied into must be mapped for GPU 1 too.  With
    # one GPU the GPU 0 steps still run (share and load a state dict, copy
    # into a tensor of a pool on GPU 0); those of GPU 1 say SKIPPED.
    out = run_child(gpu_daemon, """
        name = sys.argv[2]
        gpus = torch.cuda.device_count()
        c = gshm.Client(sock)
        sd = {"a": torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")}
        if gpus >= 2:
            sd["b"] = torch.arange(1 << 20, dtype=torch.float32, device="cuda:1") * 2
        seg = gt.share_state_dict(c, name, sd)
        back = gt.load_state_dict(c, name)
        r = {"gpus": gpus, "device": seg.device,
             "load": {k: torch.equal(back[k].cpu(), sd[k].cpu()) for k in sd}, "pool": {}}
        pool = gt.MemPool(c, name + "-pool", device=0, persistent=False)
        dsts = []
        for k in sd:
            with gt.use_pool(pool):
                dst = torch.empty(1 << 20, dtype=torch.float32, device="cuda:0")
            dst.copy_(sd[k])
            torch.cuda.synchronize()
            r["pool"][k] = torch.equal(dst.cpu(), sd[k].cpu())
            dsts.append(dst)
        if gpus >= 2:
            # gshm.copy on GPU 1's stream from a mapping GPU 1 has no access to
            only0 = c.create(name + "-only0", 1 << 20, location="cuda:0")
            c.unlink(name + "-only0")
            only0.map(devices=[0])
            dst1 = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:1")
            try:
                with torch.cuda.device(1):
                    gshm.copy(dst1, only0, 1 << 20, stream=torch.cuda.current_stream(1))
                torch.cuda.synchronize(1)
                r["refused"] = 0
            except gshm.NotSupported as e:
                r["refused"] = e.errno
        c.unlink(name)
        print(json.dumps(r))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    print("two GPUs, one segment:", r)
    keys = ["a", "b"] if r["gpus"] >= 2 else ["a"]
    assert r["device"] == 0, r
    assert r["load"] == {k: True for k in keys} and r["pool"] == {k: True for k in keys}, r
    if r["gpus"] < 2:
        print("SKIPPED steps on GPU 1 (needs two GPUs): a GPU 1 tensor in GPU 0's segment, "
              "copied into GPU 0's pool; gshm.copy on GPU 1 from a mapping for GPU 0 only")
        return
    assert r["refused"] == 18, r


def test_first_copy_inside_a_graph_capture(gpu_daemon):
    # The first SM copy of a process comes inside torch.cuda.graph: the
    # module load it triggers must not end the capture.
    out = run_child(gpu_daemon, """
        a = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, device="cuda:0")
        b = torch.zeros_like(a)
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            gshm.copy(b, a, stream=s, method="sm")
        torch.cuda.synchronize()
        before = int(b.sum().item())
        g.replay()
        torch.cuda.synchronize()
        print(json.dumps({"before": before, "equal": bool(torch.equal(a, b))}))
        """)
    r = json.loads(out.strip().splitlines()[-1])
    assert r == {"before": 0, "equal": True}, r


def test_copy_follows_torch_current_stream(gpu_daemon, segname):
    # gshm.copy without a stream, of torch tensors, runs on torch's current
    # stream: after the fill queued there, not beside it.
    out = run_child(gpu_daemon, """
        name = sys.argv[2]
        n = 64 << 20
        c = gshm.Client(sock)
        seg = c.create(name, n, location="cuda:0")
        c.unlink(name)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
            torch.cuda._sleep(1 << 29)
            x.fill_(7)
            gshm.copy(seg, x)
        torch.cuda.synchronize()
        got = torch.from_dlpack(seg.view("uint8", (n,), device=0))
        print(json.dumps({"sevens": int((got == 7).sum().item()), "n": n}))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["sevens"] == r["n"], r


def test_copy_on_another_gpus_default_stream(gpu_daemon, segname):
    # gshm.copy of a tensor on GPU 1 while GPU 0 is current, no stream
    # given: torch's current stream on GPU 1 is its legacy default stream
    # (handle 0), which libgshm takes as the current context's; the copy
    # must run on GPU 1's, after the fill queued there.  Before, it ran on
    # GPU 0's, unordered with GPU 1's work, and copied zeros.  And the same
    # with that stream given, and for gshm.signal of a flag on GPU 1.
    if _GPUS < 2:
        skip("needs two GPUs (the current GPU other than the tensor's)")
    out = run_child(gpu_daemon, """
        name = sys.argv[2]
        n = 64 << 20
        c = gshm.Client(sock)
        seg = c.create(name, n, location="cuda:1")
        c.unlink(name)
        seg.map()
        got = []
        for given in (False, True):
            torch.cuda.set_device(0)
            with torch.cuda.device(1):
                x = torch.zeros(n, dtype=torch.uint8, device="cuda:1")
                torch.cuda.synchronize(1)
                torch.cuda._sleep(1 << 29)
                x.fill_(7 + given)
            gshm.copy(seg, x, stream=torch.cuda.default_stream(1) if given else None)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            t = torch.from_dlpack(seg.view("uint8", (n,), device=1))
            got.append(int((t == 7 + given).sum().item()))
            del t
        print(json.dumps({"got": got, "n": n}))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["got"] == [r["n"], r["n"]], r


def test_copy_between_gpus_orders_both_current_streams(gpu_daemon):
    # gshm.copy(dst on GPU 1, src on GPU 0) with no stream runs on GPU 0's
    # current stream; as torch's own dst.copy_(src), it must come after
    # the work queued before on GPU 1's current stream (a fill of dst
    # behind a long kernel: the copy must not be overwritten by it), and
    # the work queued after on GPU 1's current stream must wait for it (a
    # clone of dst while GPU 0's stream is held up by a long kernel before
    # the copy: the clone must see the copied bytes).  Before, neither
    # GPU 1 stream was ordered with the copy.
    if _GPUS < 2:
        skip("needs two GPUs (a copy between GPU 0 and GPU 1)")
    out = run_child(gpu_daemon, """
        n = 64 << 20
        x = torch.full((n,), 7, dtype=torch.uint8, device="cuda:0")
        y = torch.zeros(n, dtype=torch.uint8, device="cuda:1")
        gshm.copy(y, x)  # (warms libgshm up: its module, peer access)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        y.zero_()
        torch.cuda.synchronize(1)
        # the destination's earlier work comes first
        with torch.cuda.device(1):
            torch.cuda._sleep(1 << 30)
            y.fill_(5)
        torch.cuda.set_device(0)
        gshm.copy(y, x)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        before = int((y == 7).sum().item())
        # the destination's later work comes after
        y.zero_()
        torch.cuda.synchronize(1)
        torch.cuda._sleep(1 << 30)  # on GPU 0's current stream, before the copy
        x.fill_(9)
        gshm.copy(y, x)
        with torch.cuda.device(1):
            z = y.clone()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        after = int((z == 9).sum().item())
        print(json.dumps({"before": before, "after": after, "n": n}))
        """)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["before"] == r["n"], "the copy ran before GPU 1's earlier fill of dst: %s" % r
    assert r["after"] == r["n"], "GPU 1's later read of dst ran before the copy: %s" % r


def test_copy_of_a_cupy_array_on_another_gpu(gpu_daemon, segname):
    # gshm.copy of a CuPy array on GPU 1 while GPU 0 is current, no
    # stream given: CuPy ran the array's work on GPU 1's legacy default
    # stream (its __cuda_array_interface__ names stream 1), and libgshm
    # issues the copy on the legacy stream of the current context (GPU
    # 0's); the copy must still come after the fill queued on GPU 1 behind
    # a one-second kernel.  It does on 2x H200 (session 27) with or
    # without making GPU 1 current for the call first (both tried: this
    # test passed either way), so gshm.copy switches no GPU for CuPy
    # arrays; this test keeps it so.
    if _GPUS < 2 or cupy is None:
        skip("needs two GPUs (the current GPU other than the array's) and CuPy")
    out = run_child(gpu_daemon, """
        import cupy
        name = sys.argv[2]
        n = 64 << 20
        c = gshm.Client(sock)
        seg = c.create(name, n, location="cuda:1")
        c.unlink(name)
        seg.map()
        spin = cupy.RawKernel(r'extern "C" __global__ void spin(long long n)'
                              r'{ long long s = clock64(); while (clock64() - s < n) {} }', "spin")
        got = []
        for i in range(3):  # (the first also warms libgshm up: its module, peer access)
            with cupy.cuda.Device(1):
                x = cupy.zeros(n, dtype=cupy.uint8)
                cupy.cuda.Device(1).synchronize()
                spin((1,), (1,), (cupy.int64(1 << 31),))
                x.fill(9 + i)
            with cupy.cuda.Device(0):
                gshm.copy(seg, x)
            cupy.cuda.Device(0).synchronize()
            cupy.cuda.Device(1).synchronize()
            t = torch.from_dlpack(seg.view("uint8", (n,), device=1))
            got.append(int((t == 9 + i).sum().item()))
            del t
        print(json.dumps({"got": got, "n": n, "stream": x.__cuda_array_interface__.get("stream")}))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    print("cupy copies:", r)
    assert r["got"] == [r["n"]] * 3, r


def test_view_on_a_gpu_without_access_maps_it(gpu_daemon, segname):
    # A view reported on GPU 1 of a segment mapped for GPU 0 only: GPU 1
    # gets access first.  Before, its first kernel faulted (an illegal
    # address: the end of the process's CUDA).
    if _GPUS < 2:
        skip("needs two GPUs (a view on a GPU the mapping left out)")
    out = run_child(gpu_daemon, """
        name = sys.argv[2]
        n = 1 << 20
        c = gshm.Client(sock)
        seg = c.create(name, n, location="cuda:0")
        c.unlink(name)
        seg.map(devices=[0])
        torch.from_dlpack(seg.view("uint8", (n,), device=0)).fill_(3)
        torch.cuda.synchronize(0)
        t = gt.tensor_view(seg, "uint8", (n,), device="cuda:1")
        total = int(t.to(torch.int64).sum().item())
        print(json.dumps({"sum": total, "want": 3 * n, "device": str(t.device)}))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    assert r == {"sum": r["want"], "want": r["want"], "device": "cuda:1"}, r


def test_cuda_means_the_current_device(gpu_daemon, segname):
    # device="cuda" (or torch.device("cuda"), no index) is the current
    # device, as torch means it, for DeviceSegment.view, gt.tensor_view,
    # load_state_dict and attach alike.  view (and tensor_view, through it)
    # took it as the segment's own GPU, while load_state_dict and attach
    # took the current device.  Step 1 (one GPU): current device 0, and the
    # errors where a view cannot be made; step 2 (two GPUs, else left out):
    # current device 1 over a segment on GPU 0, which gets peer access.
    out = run_child(gpu_daemon, """
        name = sys.argv[2]
        n = 1 << 20
        c = gshm.Client(sock)
        seg = c.create(name, n, location=gshm.location_of_device(0))
        c.unlink(name)
        torch.from_dlpack(seg.view("uint8", (n,), device=0)).fill_(5)
        torch.cuda.synchronize(0)
        w = torch.arange(256, dtype=torch.float32, device="cuda:0")
        gt.share_state_dict(c, name + "/sd", {"w": w}).close()
        pooled = hasattr(torch.cuda, "MemPool")  # (attach: PyTorch >= 2.6)
        if pooled:
            pool = gt.MemPool(c, name + "/pool", device=0)
            with gt.use_pool(pool):
                pw = torch.full((1024,), 7.0, device="cuda:0")
            pool.publish({"w": pw})

        def where():
            got = {"current": torch.cuda.current_device(),
                   "none": seg.view("uint8", (n,)).device,
                   "view": seg.view("uint8", (n,), device="cuda").device,
                   "view_torch_device": seg.view("uint8", (n,), device=torch.device("cuda")).device}
            t = gt.tensor_view(seg, "uint8", (n,), device="cuda")
            got["tensor_view"] = t.device.index
            got["tensor_view_reads"] = int(t.to(torch.int64).sum().item()) == 5 * n
            sd = gt.load_state_dict(c, name + "/sd", device="cuda")
            got["load_state_dict"] = sd["w"].device.index
            got["load_state_dict_reads"] = bool((sd["w"].cpu() == w.cpu()).all())
            if pooled:
                a = gt.attach(c, name + "/pool", device="cuda")
                got["attach"] = a["w"].device.index
                got["attach_reads"] = float(a["w"].sum().item()) == 7.0 * 1024
            return got

        r = {"gpus": torch.cuda.device_count(), "step1": where(), "errors": {}}
        hseg = c.create(name + "/host", 4096, location="host")
        c.unlink(name + "/host")
        for what, call, exc in [
                ("host_on_gpu", lambda: gt.tensor_view(hseg, "uint8", (16,), device="cuda"),
                 ValueError),
                ("device_on_cpu", lambda: gt.tensor_view(seg, "uint8", (16,), device="cpu"),
                 ValueError),
                ("no_such_gpu", lambda: seg.view("uint8", (16,), device=torch.cuda.device_count()),
                 gshm.NoDevice)]:
            try:
                call()
                r["errors"][what] = "no error"
            except exc as e:
                r["errors"][what] = ("no view on" in str(e) or "no CUDA device" in str(e))
        if r["gpus"] >= 2:
            torch.cuda.set_device(1)
            r["step2"] = where()
        if pooled:
            del pw
            pool.release()
        c.unlink(name + "/sd")
        print(json.dumps(r))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    print("device='cuda':", r)
    keys = ["view", "view_torch_device", "tensor_view", "load_state_dict", "attach"]
    for step, current in (("step1", 0), ("step2", 1)):
        if step not in r:
            print("SKIPPED step 2 (needs two GPUs): current device 1 over GPU 0's segment")
            continue
        got = r[step]
        assert got["current"] == current and got["none"] == 0, r
        assert {k: got[k] for k in keys if k in got} == {k: current for k in keys if k in got}, r
        assert got["tensor_view_reads"] and got["load_state_dict_reads"], r
        assert got.get("attach_reads", True), r
    assert r["errors"] == {"host_on_gpu": True, "device_on_cpu": True, "no_such_gpu": True}, r


def test_reads_without_a_context_keep_one_mapping(gpu_daemon, segname):
    # seg.read / seg.write of a device segment that is not mapped, in a
    # process with no CUDA context (a CPU tool): the first call maps it and
    # the mapping (with the primary context it retains) stays until the
    # segment is closed.  Mapped and unmapped for each call, every call
    # created and destroyed a primary context (133 ms each on an H200).
    out = run_child(gpu_daemon, """
        import ctypes, time
        name = sys.argv[2]
        cu = ctypes.CDLL("libcuda.so.1")
        assert cu.cuInit(0) == 0
        def active():
            f, a = ctypes.c_uint(), ctypes.c_int()
            assert cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(f), ctypes.byref(a)) == 0
            return a.value
        c = gshm.Client(sock)
        s = c.create(name, 1 << 20, location="cuda:0")
        s.close()
        s = c.open(name, "rw")
        before = active()
        t = time.perf_counter()
        for i in range(20):
            s.write(bytes([i + 1]) * 4096, offset=i * 4096)
        during = active()
        ok = all(s.read(i * 4096, 4096) == bytes([i + 1]) * 4096 for i in range(20))
        ms = (time.perf_counter() - t) * 1e3
        # a reset of that primary context (what cudaDeviceReset does) between
        # two reads: the next read makes it again and still reads the bytes
        assert cu.cuDevicePrimaryCtxReset(0) == 0
        reset = active()
        again = s.read(5 * 4096, 4096) == bytes([6]) * 4096
        revived = active()
        s.close()
        after = active()
        c.unlink(name)
        print(json.dumps(dict(before=before, during=during, after=after, ok=ok, ms=ms,
                              reset=reset, again=again, revived=revived)))
        """, segname)
    r = json.loads(out.strip().splitlines()[-1])
    print("40 reads and writes of 4 KiB, no context before: %.1f ms" % r["ms"])
    assert r["ok"], r
    assert (r["before"], r["during"], r["after"]) == (0, 1, 0), r
    assert (r["reset"], r["again"], r["revived"]) == (0, True, 1), r
