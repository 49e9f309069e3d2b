# SPDX-License-Identifier: Apache-2.0
"""gshm Python package over host segments, against a real gshmd (no GPU).

Run: GSHM_LIBRARY=... GSHMD=... GSHMCTL=... python3 -m pytest -q python/tests/test_host.py
(ctest runs it as python_host with those set to the build's targets)."""

import contextlib
import ctypes
import errno
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy
import pytest

import gshm_testutil
import gshm
from gshm import _dlpack, _lib, _safetensors


# ------------------------------------------------------------ ABI checks

# What each errno of common/errors.h (libgshm's one error table) raises in
# Python: a subclass where a caller would catch it by meaning, gshm.Error
# itself for the rest.  A status added to the table fails this test until it
# is placed here (E2BIG, STATUS_TOO_MANY, and ECANCELED, STATUS_CANCELED,
# came as plain gshm.Error: a set pull of too many segments had been
# LimitExceeded while the wire read it as EFBIG).
_ERRNO_CLASSES = {
    "EPERM": gshm.PermissionDenied, "EACCES": gshm.PermissionDenied,
    "ENOENT": gshm.NotFound, "EEXIST": gshm.Exists,
    "EINVAL": gshm.InvalidArgument, "ENAMETOOLONG": gshm.InvalidArgument,
    "ERANGE": gshm.InvalidArgument,
    "ENOMEM": gshm.OutOfMemory, "ENODEV": gshm.NoDevice,
    "ENOTSUP": gshm.NotSupported, "EXDEV": gshm.NotSupported, "ENOSYS": gshm.NotSupported,
    "EMFILE": gshm.LimitExceeded, "EFBIG": gshm.LimitExceeded, "EDQUOT": gshm.LimitExceeded,
    "E2BIG": gshm.LimitExceeded,
    "EPIPE": gshm.Unreachable, "ECONNRESET": gshm.Unreachable,
    "ECONNREFUSED": gshm.Unreachable, "EPROTOTYPE": gshm.Unreachable,
    "ETIMEDOUT": gshm.TimedOut, "ESTALE": gshm.Revoked, "ECHILD": gshm.ForkedChild,
    "EPROTO": gshm.ProtocolError, "EPROTONOSUPPORT": gshm.ProtocolError,
    "EBADMSG": gshm.ProtocolError, "ECANCELED": gshm.Canceled,
    # no meaning a caller catches apart: gshm.Error
    "EINTR": gshm.Error, "EIO": gshm.Error, "EBADF": gshm.Error, "EAGAIN": gshm.Error,
    "EBUSY": gshm.Error, "ENOSPC": gshm.Error, "EMSGSIZE": gshm.Error,
    "EREMOTEIO": gshm.Error, "ENOBUFS": gshm.Error,
}


def test_every_errno_of_the_error_table_has_its_exception():
    """Every errno in common/errors.h's GSHM_ERRNO_MAP raises the exception
    chosen for it above (none new and unplaced), with that errno."""
    import re
    from gshm._errors import error_for
    with open(os.path.join(gshm_testutil.REPO, "common", "errors.h")) as f:
        table = f.read().split("#define GSHM_ERRNO_MAP(X)", 1)[1].split("\n\n", 1)[0]
    names = re.findall(r"^\s*X\((E[A-Z0-9]+),", table, re.M)
    assert "ECANCELED" in names and len(names) > 30, names
    unplaced = [n for n in names if n not in _ERRNO_CLASSES]
    assert not unplaced, "errnos of common/errors.h with no Python class chosen: %s" % unplaced
    for n in names:
        code = getattr(errno, n)
        e = error_for(-code, function="gshm_x", filename="seg")
        assert type(e) is _ERRNO_CLASSES[n], (n, type(e))
        assert e.errno == code and e.filename == "seg", (n, e)


def test_struct_layout_matches_header(tmp_path):
    """Every ctypes mirror has the C struct's size and every field its offset."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    include = os.environ.get("GSHM_INCLUDE") or os.path.join(gshm_testutil.REPO, "client", "include")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <gshm.h>",
             "int main(void) {"]
    expect = {}
    for cname, st in _lib.STRUCTS.items():
        lines.append('  printf("%%s %%zu\\n", "%s", sizeof(%s));' % (cname, cname))
        lines.append('  printf("%%s %%zu\\n", "%s.__align__", _Alignof(%s));' % (cname, cname))
        expect[cname] = ctypes.sizeof(st)
        expect[cname + ".__align__"] = ctypes.alignment(st)
        for f in st._fields_:
            fname = f[0]
            lines.append('  printf("%%s %%zu\\n", "%s.%s", offsetof(%s, %s));'
                         % (cname, fname, cname, fname))
            lines.append('  printf("%%s %%zu\\n", "%s.%s.size", sizeof(((%s *)0)->%s));'
                         % (cname, fname, cname, fname))
            expect["%s.%s" % (cname, fname)] = getattr(st, fname).offset
            expect["%s.%s.size" % (cname, fname)] = getattr(st, fname).size
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    p = subprocess.run([cc, "-std=gnu11", "-I", include, str(src), "-o", str(exe)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.returncode == 0, p.stdout.decode()
    got = {}
    for line in subprocess.check_output([str(exe)]).decode().splitlines():
        k, v = line.rsplit(" ", 1)
        got[k] = int(v)
    assert got == expect


def _ctypes_kind(t):
    """(kind, size) of a ctypes type as a C++ check sees it: kind "void",
    "ptr" (any pointer, callback or string) or "int" with its signedness
    ("signed" / "unsigned")."""
    if t is None:
        return "void", 0
    if (t in (ctypes.c_char_p, ctypes.c_void_p, ctypes.c_wchar_p)
            or issubclass(t, (ctypes._Pointer, ctypes._CFuncPtr))):
        return "ptr", ctypes.sizeof(ctypes.c_void_p)
    return ("signed" if t(-1).value < 0 else "unsigned"), ctypes.sizeof(t)


def test_prototypes_match_header(tmp_path):
    """Every function _lib declares has gshm.h's arity, and each argument
    and result its kind (pointer or integer), size and signedness: ctypes
    trusts the declaration, and a size_t declared c_int, or an argument
    too few, is a silent truncation or a read of garbage, not an error.
    Checked at compile time by C++ template deduction on gshm.h itself
    (an enum: any signedness, as C leaves it to the compiler)."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("no C++ compiler")
    include = os.environ.get("GSHM_INCLUDE") or os.path.join(gshm_testutil.REPO, "client", "include")
    lines = ["#include <cstddef>", "#include <tuple>", "#include <type_traits>",
             "#include <gshm.h>",
             "template <class F> struct sig;",
             "template <class R, class... A> struct sig<R (*)(A...)> {",
             "  using ret = R; using args = std::tuple<A...>;",
             "  static constexpr std::size_t n = sizeof...(A); };",
             "template <class T> constexpr const char *kind() {",
             "  if constexpr (std::is_void_v<T>) return \"void\";",
             "  else if constexpr (std::is_pointer_v<T>) return \"ptr\";",
             "  else if constexpr (std::is_enum_v<T>) return \"enum\";",
             "  else return std::is_signed_v<T> ? \"signed\" : \"unsigned\"; }",
             "template <class T> constexpr std::size_t size() {",
             "  if constexpr (std::is_void_v<T>) return 0; else return sizeof(T); }",
             "constexpr bool same(const char *a, const char *b) {",
             "  return *a == *b && (!*a || same(a + 1, b + 1)); }",
             "constexpr bool fits(const char *c, const char *py) {",
             "  return same(c, py) || (same(c, \"enum\") && !same(py, \"ptr\") && !same(py, \"void\")); }",
             "#define ARG(f, i) std::tuple_element_t<i, sig<decltype(&f)>::args>",
             "#define RET(f) sig<decltype(&f)>::ret"]
    protos = dict(_lib._PROTOTYPES)
    protos.update(_lib._OPTIONAL_PROTOTYPES)
    for name, (res, args) in sorted(protos.items()):
        lines.append('static_assert(sig<decltype(&%s)>::n == %d, "%s: %d arguments in _lib");'
                     % (name, len(args), name, len(args)))
        for what, t, i in [("result", res, None)] + [("argument %d" % i, a, i)
                                                      for i, a in enumerate(args)]:
            k, n = _ctypes_kind(t)
            ct = "RET(%s)" % name if i is None else "ARG(%s, %d)" % (name, i)
            lines.append('static_assert(fits(kind<%s>(), "%s") && size<%s>() == %d, '
                         '"%s: %s is %s of %d bytes in _lib");' % (ct, k, ct, n, name, what, k, n))
    src = tmp_path / "protos.cc"
    src.write_text("\n".join(lines) + "\n")
    p = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-I", include, str(src)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    errors = [l for l in p.stdout.decode().splitlines() if "static assertion failed" in l
              or "error" in l]
    assert p.returncode == 0, "\n".join(errors[:20]) or p.stdout.decode()[-3000:]


def test_dlpack_capsule_keeps_owner_until_consumer_lets_go():
    """The DLPack machinery on CPU memory, consumed by NumPy."""
    buf = (ctypes.c_float * 12)(*range(12))
    released = []

    class Owner(object):
        pass

    class View(object):
        def __init__(self):
            self.owner = Owner()

        def __dlpack__(self, stream=None, **kw):
            return _dlpack.make_capsule(self.owner, ctypes.addressof(buf), _dlpack.kDLCPU, 0,
                                        gshm.dtype("float32").dl_code, 32, (3, 4))

        def __dlpack_device__(self):
            return (_dlpack.kDLCPU, 0)

    import weakref
    before = _dlpack.live_exports()
    v = View()
    wr = weakref.ref(v.owner)
    weakref.finalize(v.owner, released.append, True)
    a = numpy.from_dlpack(v)
    del v
    gc.collect()
    assert a.shape == (3, 4) and a[2, 3] == 11.0
    assert wr() is not None and _dlpack.live_exports() == before + 1
    del a
    gc.collect()
    assert released == [True] and _dlpack.live_exports() == before
    # A capsule that nobody consumes releases its owner when it dies.
    v = View()
    weakref.finalize(v.owner, released.append, "unconsumed")
    cap = v.__dlpack__()
    del v
    assert _dlpack.live_exports() == before + 1
    del cap
    gc.collect()
    assert released[-1] == "unconsumed" and _dlpack.live_exports() == before


def test_dtypes():
    assert gshm.dtype("float32") is gshm.dtype(numpy.float32) is gshm.dtype("<f4")
    assert gshm.dtype("I8").name == "int8" and gshm.dtype("i8").name == "int64"
    assert gshm.dtype("BF16").itemsize == 2
    for bad in ("float33", ">f4", object, 3):
        with pytest.raises(ValueError):
            gshm.dtype(bad)


def test_library_loads():
    assert os.path.exists(gshm.library_path()) or "libgshm" in gshm.library_path()


def test_safetensors_layout_roundtrip():
    arrays = {"b": numpy.arange(3, dtype=numpy.int8), "a": numpy.ones((2, 3), numpy.float64),
              "c": numpy.zeros((0, 4), numpy.float32), "d": numpy.arange(5, dtype=numpy.float16)}
    lay = _safetensors.plan((k, v.dtype, v.shape) for k, v in arrays.items())
    assert lay.data_start % _safetensors.ALIGN == 0
    buf = bytearray(lay.size)
    buf[:lay.data_start] = lay.header
    for k, dt, shape, b, e in lay.entries:
        assert b % dt.itemsize == 0
        buf[b:e] = arrays[k].tobytes()
    # contiguous, no holes, as safetensors requires
    spans = sorted((b, e) for _, _, _, b, e in lay.entries)
    assert spans[0][0] == lay.data_start and spans[-1][1] == lay.size
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    meta, entries = _safetensors.parse(lambda off, n: buf[off:off + n], len(buf))
    assert meta["format"] == "pt"
    assert [e[0] for e in entries] == list(arrays)
    try:
        import safetensors.numpy as stnp
    except ImportError:
        return
    loaded = stnp.load(bytes(buf))
    for k, v in arrays.items():
        numpy.testing.assert_array_equal(loaded[k], v)


# ------------------------------------------- _cuda: the driver, faked

class _FakeLibcuda:
    """libcuda.so.1 as gshm._cuda calls it through ctypes: cuInit fails
    until `ready` (a driver not loaded yet), and device i's UUID cannot be
    read while i is in `no_uuid`."""

    def __init__(self, ndev):
        self.ready = False
        self.no_uuid = set()
        self.inits = 0
        self.ndev = ndev

    def cuInit(self, flags):
        self.inits += 1
        return 0 if self.ready else 100  # CUDA_ERROR_NO_DEVICE

    def cuDeviceGetCount(self, n):
        n._obj.value = self.ndev
        return 0

    def cuDeviceGet(self, dev, i):
        dev._obj.value = i
        return 0

    def cuDeviceGetUuid_v2(self, u, dev):
        if dev.value in self.no_uuid:
            return 1  # CUDA_ERROR_INVALID_VALUE
        u._obj.bytes[:] = [dev.value + 1] * 16
        return 0


def test_cuda_lookups_retry_until_the_driver_answers(monkeypatch):
    """gshm._cuda caches what worked, never a failure: a process that asked
    before libcuda.so.1 was there, or before cuInit could succeed, or while
    a device's UUID could not be read, gets the answers once they can be
    had (cuInit at most once per _RETRY_S).  It used to keep the failed
    cuInit (no GPUs) and the UUID list with None for the process's life."""
    from gshm import _cuda
    fake = _FakeLibcuda(2)
    loads = []

    def cdll(name):
        loads.append(name)
        if len(loads) == 1:
            raise OSError("libcuda.so.1: cannot open shared object file")
        return fake

    monkeypatch.setattr(_cuda.ctypes, "CDLL", cdll)
    for name in ("_lib", "_cuda", "_uuids", "_last_try"):
        monkeypatch.setattr(_cuda, name, None, raising=False)
    monkeypatch.setattr(_cuda, "_RETRY_S", 3600.0, raising=False)
    assert not _cuda.available()  # not installed
    assert not _cuda.available()  # asked again within _RETRY_S: no new try
    assert loads == ["libcuda.so.1"]
    monkeypatch.setattr(_cuda, "_RETRY_S", 0.0, raising=False)
    assert not _cuda.available()  # installed now, cuInit fails
    assert len(loads) == 2 and fake.inits == 1
    with pytest.raises(ValueError):
        _cuda.device_uuid(0)
    uuid = ["GPU-%s-%s-%s-%s-%s" % (h * 4, h * 2, h * 2, h * 2, h * 6) for h in ("01", "02")]
    assert _cuda.ordinal_of_uuid(uuid[0]) is None

    fake.ready = True
    fake.no_uuid = {1}
    assert _cuda.available() and _cuda.device_count() == 2
    assert len(loads) == 2  # the handle was kept, cuInit tried again
    assert _cuda.device_uuid(0) == uuid[0]
    with pytest.raises(ValueError):
        _cuda.device_uuid(1)  # not readable (yet)
    fake.no_uuid = set()
    assert _cuda.device_uuid(1) == uuid[1]
    assert _cuda.ordinal_of_uuid(uuid[1].lower()) == 1

    # what worked is kept: no cuInit again, the UUIDs not read again
    inits = fake.inits
    fake.ready = False
    fake.no_uuid = {0, 1}
    assert _cuda.available() and fake.inits == inits
    assert _cuda.device_uuid(0) == uuid[0] and _cuda.ordinal_of_uuid(uuid[1]) == 1


# ------------------------------------- _copy: stream order, torch faked

def test_copy_between_gpus_orders_both_current_streams_host(monkeypatch):
    """gshm.copy(dst, src) of torch tensors on two GPUs with no stream: as
    torch's own copy between GPUs, the source GPU's current stream (which
    runs the copy) waits for the destination GPU's current stream before
    it, and that stream waits for the copy after it; nothing more where
    both are on one GPU or a stream is given.  (torch faked: the order of
    the calls is what is checked; tests/test_gpu.py checks the bytes on
    two GPUs.)  Before, the destination GPU's stream was not ordered with
    the copy at all."""
    import types
    from gshm import _copy
    calls = []

    class Stream:
        def __init__(self, dev):
            self.dev = dev
            self.cuda_stream = 0x1000 + dev

        def wait_stream(self, other):
            calls.append(("wait", self.dev, other.dev))

    class Device:
        def __init__(self, index):
            self.type, self.index = "cuda", index

    Tensor = type("Tensor", (), {"__module__": "torch"})

    def tensor(dev):
        t = Tensor()
        t.device = Device(dev)
        return t

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(current_stream=Stream)
    monkeypatch.setitem(sys.modules, "torch", fake)

    def fn(*args):
        calls.append(("copy", args[-1]))
        return 0

    src, dst = tensor(0), tensor(1)
    assert _copy._on_stream(fn, (1, 2), None, src, dst) == 0
    assert calls == [("wait", 0, 1), ("copy", 0x1000), ("wait", 1, 0)], calls
    del calls[:]
    _copy._on_stream(fn, (1, 2), None, src, tensor(0))  # one GPU: torch orders it
    assert calls == [("copy", 0x1000)], calls
    del calls[:]
    _copy._on_stream(fn, (1, 2), 0x2000, src, dst)  # a stream given: the caller's order
    assert calls == [("copy", 0x2000)], calls


# --------------------------------------------------------- with a daemon

def run_child(daemon, code, *args, check=True):
    src = "import sys, numpy, gshm\nsock = sys.argv[1]\n" + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", src, daemon.socket] + [str(a) for a in args],
                       env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError("child failed (%d):\n%s" % (p.returncode, p.stderr.decode()))
    return p


def leases_of(daemon, name, pid=None):
    rows = [m for m in daemon.mappings() if m["segment"] == name]
    if pid is not None:
        rows = [m for m in rows if m["pid"] == pid]
    return rows


def test_create_here_open_and_view_in_another_process(daemon, client, segname):
    rng = numpy.random.default_rng(1234)
    n = 3 * 1024 * 1024 + 17  # not a page multiple: the segment is rounded up
    data = rng.integers(0, 256, n, dtype=numpy.uint8)
    with client.create(segname, n, location="host", mode=0o644) as seg:
        assert isinstance(seg, gshm.HostSegment)
        assert seg.requested_size == n and seg.size >= n and seg.location == "host"
        seg.view("uint8", (n,))[:] = data
        p = run_child(daemon, """
            name, n = sys.argv[2], int(sys.argv[3])
            with gshm.Client(sock, name="child") as c, c.open(name, "r") as seg:
                a = numpy.frombuffer(seg, numpy.uint8, count=n)
                f = seg.view("float32", (n // 4,))
                assert f.nbytes == n // 4 * 4 and not f.flags.writeable
                sys.stdout.buffer.write(a.tobytes())
            """, segname, n)
        got = numpy.frombuffer(p.stdout, numpy.uint8)
        assert got.size == n and numpy.array_equal(got, data)

        # and the other way: the child writes, we see it
        run_child(daemon, """
            name, n = sys.argv[2], int(sys.argv[3])
            with gshm.Client(sock) as c, c.open(name, "rw") as seg:
                v = seg.view("uint8", (n,))
                v[:] = numpy.random.default_rng(99).integers(0, 256, n, dtype=numpy.uint8)
            """, segname, n)
        want = numpy.random.default_rng(99).integers(0, 256, n, dtype=numpy.uint8)
        assert numpy.array_equal(seg.view("uint8", (n,)), want)
    client.unlink(segname)


def test_create_defaults_to_host(client, segname):
    """Client.create without a location makes a host segment, as gshm_create
    (NULL) and gshmctl create do: the same call works on a node without a GPU."""
    with client.create(segname, 4096) as seg:
        assert isinstance(seg, gshm.HostSegment) and seg.location == "host"
        assert client.stat(segname).location == "host"
    client.unlink(segname)


def test_host_mappings_are_reported(daemon, client, segname):
    """A host segment's memory is mapped as soon as it is open (numpy.frombuffer,
    seg.view() need no map()): gshmctl mappings says so, for the creator and
    for another process that only takes views (issue 16 item 4)."""
    pid = os.getpid()
    with client.create(segname, 8192, location="host") as seg:
        mine = leases_of(daemon, segname, pid)
        assert len(mine) == 1 and mine[0]["mapped"] and mine[0]["devices"] == [], mine
        assert seg.mapped and seg.address
        numpy.frombuffer(seg, numpy.uint8)[:4] = [1, 2, 3, 4]
        run_child(daemon, """
            import os
            name = sys.argv[2]
            with gshm.Client(sock) as c, c.open(name, "r") as seg:
                v = seg.view("uint8", (4,))
                assert list(v) == [1, 2, 3, 4], list(v)
                mine = [l for l in c.leases() if l.segment == name and l.pid == os.getpid()]
                assert len(mine) == 1 and mine[0].mapped and mine[0].devices == (), mine
            """, segname)
    client.unlink(segname)


def test_typed_views_and_buffer_protocol(client, segname):
    with client.create(segname, 4096, location="host") as seg:
        assert len(seg) == seg.size == 4096
        f = seg.view("float64", (8, 4), offset=256)
        f[:] = numpy.arange(32, dtype=numpy.float64).reshape(8, 4)
        g = numpy.frombuffer(seg, numpy.float64, count=32, offset=256).reshape(8, 4)
        assert numpy.array_equal(f, g) and f.ctypes.data == g.ctypes.data
        assert seg.view(numpy.int32).shape == (1024,)           # default: all that fits
        assert seg.view("uint8", shape=16, offset=4080).shape == (16,)  # exactly to the end
        assert seg.view("float32", (0,), offset=4096).size == 0
        m = memoryview(seg)
        assert m.nbytes == 4096 and not m.readonly
        m[0:4] = b"gshm"
        assert bytes(seg[0:4]) == b"gshm"
        del m, f, g
        client.unlink(segname)


@pytest.mark.parametrize("dtype,shape,offset", [
    ("float32", (1025,), 0),          # one item too many
    ("uint8", (16,), 4081),           # one byte past the end
    ("float64", (2, 2), 4096),        # offset at the end, data past it
    ("uint8", (1,), 4097),            # offset past the end
    ("uint8", (1,), -1),              # negative offset
    ("float32", (4,), 2),             # misaligned for the item size
    ("uint8", (-1, 4), 0),            # negative dimension
    ("float33", (1,), 0),             # no such dtype
    (">f4", (1,), 0),                 # big-endian
    ("bfloat16", (4,), 0),            # NumPy has no bfloat16
])
def test_view_errors(client, segname, dtype, shape, offset):
    with client.create(segname, 4096, location="host") as seg:
        try:
            with pytest.raises(ValueError):
                seg.view(dtype, shape, offset)
        finally:
            client.unlink(segname)


def test_numpy_frombuffer_bounds(client, segname):
    with client.create(segname, 4096, location="host") as seg:
        with pytest.raises(ValueError):
            numpy.frombuffer(seg, numpy.float32, count=1025)
        with pytest.raises(ValueError):
            numpy.frombuffer(seg, numpy.float32, count=1, offset=4096)
        client.unlink(segname)


def test_errno_missing_name(client):
    with pytest.raises(gshm.NotFound) as ei:
        client.open("pytest/no/such/segment")
    e = ei.value
    assert isinstance(e, FileNotFoundError) and isinstance(e, gshm.Error)
    assert e.errno == errno.ENOENT
    assert e.filename == "pytest/no/such/segment"
    assert "gshm_open" in str(e)
    with pytest.raises(FileNotFoundError) as ei:
        client.unlink("pytest/no/such/segment")
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        client.stat("pytest/no/such/segment")
    assert not client.exists("pytest/no/such/segment")
    # a name no segment can have: as open, create and unlink say (stat
    # said ENOENT, gshmd's lookup), and exists() stays False
    for long_name in ("n" * (gshm.NAME_MAX + 1), "n" * 70000):
        for call in (client.stat, client.unlink, client.open):
            with pytest.raises(gshm.InvalidArgument) as ei:
                call(long_name)
            assert ei.value.errno == errno.ENAMETOOLONG
        assert not client.exists(long_name)


def test_errno_duplicate_create(client, segname):
    with client.create(segname, 4096, location="host"):
        with pytest.raises(FileExistsError) as ei:
            client.create(segname, 4096, location="host")
        assert isinstance(ei.value, gshm.Exists) and ei.value.errno == errno.EEXIST
    client.unlink(segname)


@pytest.mark.parametrize("name", ["", "a//b", "../x", "/abs", "x/./y", "ctl\x01char"])
def test_errno_bad_name(client, name):
    with pytest.raises(gshm.Error) as ei:
        client.create(name, 4096, location="host")
    assert ei.value.errno in (errno.EINVAL, errno.ENAMETOOLONG)
    assert isinstance(ei.value, ValueError)
    # the same for every call that takes a name: stat and unlink said
    # NotFound (gshmd looked the name up before checking it), open EINVAL
    for call in (lambda: client.open(name), lambda: client.stat(name),
                 lambda: client.unlink(name)):
        with pytest.raises(gshm.InvalidArgument) as ei:
            call()
        assert ei.value.errno == errno.EINVAL and not isinstance(ei.value, FileNotFoundError)
    assert client.exists(name) is False  # no segment can have it


def test_errno_missing_good_name(client, segname):
    for call in (lambda: client.open(segname), lambda: client.stat(segname),
                 lambda: client.unlink(segname)):
        with pytest.raises(gshm.NotFound) as ei:
            call()
        assert ei.value.errno == errno.ENOENT
    assert client.exists(segname) is False


def test_errno_bad_arguments(client, segname):
    with pytest.raises(ValueError):
        client.create(segname, 0, location="host")
    with pytest.raises(gshm.Error) as ei:
        client.create(segname, 4096, location="nowhere:7")
    assert ei.value.errno in (errno.EINVAL, errno.ENODEV, errno.ENOTSUP)
    with pytest.raises(gshm.InvalidArgument):
        client.create("n" * 300, 4096, location="host")
    with pytest.raises(ValueError):
        client.open(segname, access="x")


def test_errno_no_peer_path_is_not_supported():
    # "no peer path" has its own errno (EXDEV) and stays a NotSupported
    from gshm._errors import error_for
    e = error_for(-errno.EXDEV, function="gshm_copy")
    assert isinstance(e, gshm.NotSupported) and e.errno == errno.EXDEV
    assert isinstance(error_for(-errno.ENOTSUP), gshm.NotSupported)


def test_errno_every_one_the_library_returns_has_its_builtin():
    """Each class derives from the built-in OSError subclass that Python
    itself gives the errno, so `except TimeoutError` / `except
    ConnectionError` work.  ETIMEDOUT (gshmd's STATUS_TIMED_OUT: a cluster
    peer that does not answer a pull) and ENOTCONN (libgshm: no
    connection to the daemon) fell to the bare gshm.Error."""
    from gshm._errors import error_for
    want = {errno.ENOENT: FileNotFoundError, errno.EEXIST: FileExistsError,
            errno.EACCES: PermissionError, errno.EPERM: PermissionError,
            errno.ECONNREFUSED: ConnectionError, errno.ECONNRESET: ConnectionError,
            errno.EPIPE: ConnectionError, errno.ENOTCONN: ConnectionError,
            errno.ETIMEDOUT: TimeoutError}
    for code, builtin in want.items():
        e = error_for(-code, function="gshm_pull")
        assert isinstance(e, gshm.Error) and e.errno == code, code
        assert isinstance(e, builtin), (errno.errorcode[code], type(e).__mro__)
    assert isinstance(error_for(-errno.ETIMEDOUT), gshm.TimedOut)
    assert isinstance(error_for(-errno.ETIMEDOUT), TimeoutError)
    assert isinstance(error_for(-errno.ENOTCONN), gshm.Unreachable)


def test_nul_bytes_and_huge_sizes_raise(client, segname):
    """Issue 15 item 8: ctypes cuts a name at its first NUL byte and wraps
    integers modulo 2**64; neither may reach the C library."""
    victim = segname + "/x"
    with client.create(victim, 4096, location="host"):
        pass
    for call in (lambda: client.unlink(victim + "\0.tmp"),
                 lambda: client.unlink((victim + "\0.tmp").encode()),
                 lambda: client.open(victim + "\0", "r"),
                 lambda: client.stat(victim + "\0junk"),
                 lambda: client.create(victim + "\0new", 4096, location="host"),
                 lambda: client.create(segname + "/y", 4096, location="host\0cuda:0")):
        with pytest.raises(ValueError):
            call()
    assert client.exists(victim)  # the cut name was never sent
    for size in (2**64, 2**64 + 4096, 2**65):
        with pytest.raises(ValueError):
            client.create(segname + "/big", size, location="host")
        assert not client.exists(segname + "/big")  # 2**64 + 4096 would wrap to 4096
    with pytest.raises(ValueError):
        gshm.Client(client.socket + "\0other")
    with pytest.raises(ValueError):
        gshm.copy(4096, 8192, nbytes=2**64)
    client.unlink(victim)


def test_connect_failure_carries_errno(tmp_path):
    with pytest.raises(ConnectionError) as ei:
        gshm.Client(str(tmp_path / "nobody-here.sock"))
    assert isinstance(ei.value, gshm.Error)
    assert ei.value.errno in (errno.ENOENT, errno.ECONNREFUSED)


def test_read_holds_one_copy(client, segname):
    """Segment.read fills the bytes object it returns: at no time does it
    hold a second copy of the data (a scratch buffer and then its copy)."""
    import tracemalloc
    n = 32 << 20
    with client.create(segname, n, location="host") as seg:
        pattern = bytes(range(256)) * 4096
        for off in range(0, n, len(pattern)):
            seg.write(pattern, off)
        tracemalloc.start()
        try:
            data = seg.read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert type(data) is bytes and len(data) == n and data[:len(pattern)] == pattern
        assert data[n - 256:] == bytes(range(256)) and data.count(b"\xff") == n // 256
        assert n <= peak < n + n // 4, (peak, n)   # one copy, not two
        assert seg.read(n - 1, 1) == b"\xff" and seg.read(5, 0) == b""
    client.unlink(segname)


def test_readonly_lease(client, segname):
    with client.create(segname, 8192, location="host") as seg:
        seg.view("uint32")[:] = 7
    with client.open(segname, "r") as ro:
        assert ro.readonly and ro.access == "r"
        v = ro.view("uint32")
        assert not v.flags.writeable and int(v.sum()) == 7 * 2048
        with pytest.raises(ValueError):
            v[0] = 1
        assert memoryview(ro).readonly
        del v
    client.unlink(segname)


def test_local_failures_carry_no_older_message(client, segname):
    """A call that fails in libgshm without a request (write on a read-only
    lease, a range outside the segment) raised with the daemon's text of
    an older failed request of the thread ("no segment named ...") as its
    gshm_message and in its text."""
    client.create(segname, 4096, location="host").close()
    with pytest.raises(gshm.NotFound):
        client.open(segname + "/missing", "r")
    with client.open(segname, "r") as ro:
        with pytest.raises(gshm.PermissionDenied) as ei:
            gshm.Segment.write(ro, b"x", 0)  # (not mmap's write: libgshm's)
        assert ei.value.gshm_message == "" and "no segment" not in str(ei.value), ei.value
        with pytest.raises(gshm.NotFound):
            client.open(segname + "/missing", "r")
        ro.map()
        with pytest.raises(gshm.NotFound):
            client.open(segname + "/missing", "r")
        ro.unmap()  # nothing fails here: the text is the last request's no more
        assert client.last_error == ""
    client.unlink(segname)


def test_private_view_of_a_read_only_lease(client, segname):
    """The copy-on-write view that gshm.torch gives torch for a read-only
    host lease: it reads the shared memory (a later write by the segment's
    writer too, on pages it did not write), and its own writes stay in it."""
    with client.create(segname, 3 * 4096, location="host") as rw:
        rw.view("uint8")[:] = 1
        with client.open(segname, "r") as ro:
            a = ro._private_bytes(4096 + 10, 4096)   # over two pages, not aligned
            assert a.flags.writeable and a.size == 4096 and int(a.sum()) == 4096
            a[:100] = 7                               # the first page, copied
            assert rw.read(4096 + 10, 100) == b"\x01" * 100
            rw.write(b"\x03" * 4096, 2 * 4096)      # the page a never wrote
            assert int(a[-1]) == 3 and int(a[0]) == 7
            del a
    client.unlink(segname)


def test_private_bytes_hold_the_lease(daemon, client, segname):
    """A private copy-on-write array (what torch tensors of a read-only host
    lease sit on) held no reference to its segment: once the Segment object
    was collected its lease ended under the array."""
    import gc
    client.create(segname, 2 * 4096, location="host").close()
    pid = os.getpid()
    ro = client.open(segname, "r")
    a = ro._private_bytes(4096, 4096)
    del ro
    gc.collect()
    assert len(leases_of(daemon, segname, pid)) == 1
    a[:] = 5                                       # still this process's copy
    assert int(a.sum()) == 5 * 4096
    del a
    gc.collect()
    assert leases_of(daemon, segname, pid) == []
    client.unlink(segname)


def test_segment_context_manager_releases_lease(daemon, client, segname):
    client.create(segname, 4096, location="host").close()
    pid = os.getpid()
    assert leases_of(daemon, segname, pid) == []
    with client.open(segname, "rw") as seg:
        seg.map()
        rows = leases_of(daemon, segname, pid)
        assert len(rows) == 1
        row = rows[0]
        for key in ("segment", "pid", "uid", "client", "access", "since", "devices"):
            assert key in row, row
        assert row["client"] == "pytest"
    assert seg.closed
    assert leases_of(daemon, segname, pid) == []
    with pytest.raises(ValueError):
        seg.view("uint8")
    client.unlink(segname)


def test_client_context_manager_releases_leases(daemon, segname):
    pid = os.getpid()
    with gshm.Client(daemon.socket, name="pytest-cm") as c:
        seg1 = c.create(segname, 4096, location="host")  # never closed explicitly
        seg2 = c.open(segname, "r")
        assert len(leases_of(daemon, segname, pid)) == 2
    assert c.closed and seg1.closed and seg2.closed
    assert leases_of(daemon, segname, pid) == []
    with pytest.raises(ValueError):
        c.open(segname)
    with gshm.Client(daemon.socket) as c:
        c.unlink(segname)


def test_garbage_collected_segment_releases_lease(daemon, client, segname):
    pid = os.getpid()
    seg = client.create(segname, 4096, location="host")
    assert len(leases_of(daemon, segname, pid)) == 1
    del seg
    gc.collect()
    assert leases_of(daemon, segname, pid) == []
    client.unlink(segname)


def test_views_outlive_close_safely(daemon, client, segname):
    pid = os.getpid()
    seg = client.create(segname, 4096, location="host")
    v = seg.view("int64")
    v[:] = numpy.arange(512)
    seg.close()
    assert leases_of(daemon, segname, pid) == []   # the lease ended at close()
    assert int(v.sum()) == 511 * 512 // 2            # the memory is still mapped here
    v[0] = 5
    client.unlink(segname)


def test_unlinked_segment_keeps_memory_for_its_leases(client, segname):
    a = client.create(segname, 4096, location="host")
    a.view("uint8")[:4] = [1, 2, 3, 4]
    gen = a.info.generation
    client.unlink(segname)
    assert a.stat().unlinked
    with pytest.raises(FileNotFoundError):
        client.open(segname)
    b = client.create(segname, 4096, location="host")
    assert b.info.id != a.info.id and b.info.generation != gen
    assert list(a.view("uint8")[:4]) == [1, 2, 3, 4]
    assert list(b.view("uint8")[:4]) == [0, 0, 0, 0]
    a.close()
    b.close()
    client.unlink(segname)


def test_create_mode_0_refused(daemon, client, segname):
    """mode=0 is refused, not silently made 0600 (gshm_create and gshmd
    take 0 for the default): a segment its creator meant nobody to open
    was open to its owner; nothing is created."""
    import gshm
    for call in (lambda: client.create(segname, 4096, location="host", mode=0),
                 lambda: client.pull("nopeer", segname, mode=0)):
        with pytest.raises(gshm.InvalidArgument) as e:
            call()
        assert "mode 0" in str(e.value) and "chmod" in str(e.value), e.value
    assert segname not in [s.name for s in client.segments()]


def test_create_mode_as_a_string_refused(daemon, client, segname):
    """A mode written as gshmctl takes it, a string, is a TypeError (as
    os.chmod's), not int(): mode="444" made a segment of mode 0o674
    (decimal 444: group-writable, others may read), "0644" a refusal
    naming mode 1204; nothing is created."""
    for mode in ("444", "0644", b"600", 420.0):
        for call in (lambda: client.create(segname, 4096, location="host", mode=mode),
                     lambda: client.pull("nopeer", segname, mode=mode)):
            with pytest.raises(TypeError) as e:
                call()
            assert "mode is permission bits as an int, such as 0o640" in str(e.value), e.value
    assert segname not in [s.name for s in client.segments()]


def test_create_size_as_a_string_refused(daemon, client, segname):
    """A size written as gshmctl takes it ("1G") is a TypeError that says
    what is taken (an int of bytes), as a mode string is, and so is one
    of digits: before, "1G" failed inside int() ("invalid literal for
    int() with base 10"), a ValueError naming neither size nor the way
    out, and "4096" was read.  Nothing is created."""
    for size in ("1G", "64M", "4096", b"4096", bytearray(b"1K")):
        with pytest.raises(TypeError) as e:
            client.create(segname, size, location="host")
        assert "size is bytes as an int, such as 1 << 30" in str(e.value), e.value
    assert segname not in [s.name for s in client.segments()]


def test_create_size_float_only_when_integral(daemon, client, segname):
    """A float size is taken only when it is a whole number of bytes (1e9
    is): 1.5 made a 1-byte segment silently (int() rounded it down), and
    4096.5 a 4096-byte one.  Now a ValueError names the rule, and nothing
    is created; an integral float still creates its size."""
    for size in (1.5, 4096.5, float("nan"), float("inf")):
        with pytest.raises(ValueError) as e:
            client.create(segname, size, location="host")
        assert "size (bytes) is a whole number" in str(e.value), e.value
        assert "never rounded" in str(e.value), e.value
    assert segname not in [s.name for s in client.segments()]
    with client.create(segname, 8192.0, location="host") as seg:
        assert seg.info.requested_size == 8192
    client.unlink(segname)


def test_pull_takes_names_as_bytes(daemon, client, segname):
    """A name may be str, bytes or path-like (as for create and open), in a
    pull too: its check of a trailing '/' called str.endswith on it, a
    TypeError for bytes ("endswith first arg must be bytes") before gshmd
    was asked.  This gshmd has no cluster: the pull fails there, and the
    check still refuses a prefix given without prefix=True."""
    for call in (lambda: client.pull("nopeer", segname.encode()),
                 lambda: client.pull("nopeer", segname, local_name=segname.encode()),
                 lambda: client.pull("nopeer", b"pub/", local_name=b"v2/", prefix=True)):
        with pytest.raises(gshm.Error) as e:
            call()
        assert not isinstance(e.value, gshm.InvalidArgument), e.value
    with pytest.raises(gshm.InvalidArgument) as bad:
        client.pull("nopeer", b"pub/")
    assert "to pull every segment under it, pass prefix=True" in str(bad.value), bad.value
    with pytest.raises(gshm.InvalidArgument) as bad:
        client.pull("nopeer", b"pub/", local_name=b"v2", prefix=True)
    assert "does not end in '/'" in str(bad.value), bad.value


def test_info_and_lists(daemon, client, segname):
    with client.create(segname, 5000, location="host", mode=0o640) as seg:
        info = seg.info
        assert info.name == segname and info.requested_size == 5000
        assert info.size >= 5000 and info.size % info.granularity == 0
        assert info.location == "host" and info.device_index == -1
        assert info.mode & 0o777 == 0o640 and info.uid == os.getuid()
        assert isinstance(info.asdict(), dict)
        st = seg.stat()
        assert st.id == info.id and st.leases == 1 and not st.unlinked
        assert client.stat(segname).id == info.id
        assert segname in [s.name for s in client.segments()]
        mine = [l for l in client.leases() if l.segment == segname]
        assert len(mine) == 1 and mine[0].pid == os.getpid() and mine[0].access == "rw"
        assert mine[0].client == "pytest"
        clients = client.clients()
        assert any(c.pid == os.getpid() and c.name == "pytest" for c in clients)
        assert client.uid() == info.uid  # (the owner of what it creates)
        status = client.status()
        assert status.segments >= 1 and status.leases >= 1 and "host" in status.backends
    client.unlink(segname)


def test_share_and_load_arrays_across_processes(daemon, client, segname):
    arrays = {"w": numpy.random.default_rng(5).standard_normal((64, 32)).astype(numpy.float32),
              "b": numpy.arange(7, dtype=numpy.int8), "s": numpy.array(3.5)}
    seg = _safetensors.share_arrays(client, segname, arrays)
    seg.close()
    p = run_child(daemon, """
        from gshm import _safetensors
        with gshm.Client(sock) as c:
            arrs = _safetensors.load_arrays(c, sys.argv[2])
            print(repr({k: (v.dtype.str, v.shape, float(v.astype("float64").sum()))
                        for k, v in sorted(arrs.items())}))
        """, segname)
    got = eval(p.stdout.decode())
    for k, v in arrays.items():
        assert got[k][0] == v.dtype.str and got[k][1] == v.shape
        assert got[k][2] == pytest.approx(float(v.astype("float64").sum()), rel=1e-6)
    client.unlink(segname)


@pytest.mark.parametrize("unlink_fails", [False, True])
@pytest.mark.parametrize("exc", [ValueError("fill failed"), KeyboardInterrupt()])
def test_share_arrays_leaves_nothing_on_error(monkeypatch, client, segname, exc, unlink_fails):
    """A failure while a new segment is filled closes it and unlinks its
    name, and the caller gets that very exception, even when the unlink
    fails too (gshm._client._unlink_on_error)."""
    def fill(seg):
        raise exc
    monkeypatch.setattr(_safetensors, "memoryview", fill, raising=False)
    if unlink_fails:
        real_unlink = client.unlink

        def unlink(name):
            real_unlink(name)
            raise gshm.NotFound(errno.ENOENT, "gshm_unlink: injected", name)
        monkeypatch.setattr(client, "unlink", unlink)
    with pytest.raises(type(exc)) as got:
        _safetensors.share_arrays(client, segname, {"x": numpy.arange(4)})
    assert got.value is exc
    assert not client.exists(segname)
    assert [l for l in client.leases() if l.segment == segname] == []


def test_copy_needs_gshm_copy():
    if _lib.optional_symbol("gshm_copy") is not None:
        pytest.skip("this libgshm has gshm_copy (tested by test_gpu.py)")
    with pytest.raises(NotImplementedError):
        gshm.copy(0, 0, 1)


def test_copy_refuses_strided_and_read_only_arrays(monkeypatch):
    """gshm.copy took an array's data pointer and shape and ignored its
    strides and read-only flag: from a reversed view (its pointer at the
    last element) it copied bytes past the array, into a transposed one in
    memory order, and into np.frombuffer(bytes) it wrote what Python holds
    immutable.  Now each is a ValueError before any copy is queued; a
    C-contiguous array still goes through."""
    from gshm import _copy
    calls = []
    monkeypatch.setattr(_copy, "_optional", lambda name: lambda *a: calls.append((name, a)) or 0)
    a = numpy.arange(16, dtype=numpy.uint8)
    ro = numpy.frombuffer(bytes(16), dtype=numpy.uint8)
    with pytest.raises(ValueError, match="C-contiguous"):
        gshm.copy(a, a[::-1].copy()[::-1])
    with pytest.raises(ValueError, match="C-contiguous"):
        gshm.copy(numpy.zeros((4, 4), numpy.uint8).T, a)
    with pytest.raises(ValueError, match="read-only"):
        gshm.copy(ro, a)
    with pytest.raises(ValueError, match="read-only"):
        gshm.signal(numpy.frombuffer(bytes(8), dtype=numpy.uint64), 1)
    assert calls == []
    gshm.copy(a, ro)  # a read-only source is fine, and a flag only waited for
    assert calls and calls[0][1][2] == 16
    gshm.wait(numpy.frombuffer(bytes(8), dtype=numpy.uint64), 1)
    assert len(calls) == 2


def test_copy_refuses_read_only_host_segments(monkeypatch, client, segname):
    """gshm.copy, copy_signal and signal refused a read-only array as what
    they write, but took a host segment opened with access "r": libgshm
    checks the access of device memory only (-EACCES), and the driver's
    copy into the read-only (PROT_READ) pages crashed the process.  Now
    each is gshm.PermissionDenied, as libgshm's for a device segment,
    before anything is queued; reading from one is still fine."""
    from gshm import _copy
    calls = []
    monkeypatch.setattr(_copy, "_optional", lambda name: lambda *a: calls.append((name, a)) or 0)
    client.create(segname, 4096, location="host").close()
    try:
        with client.open(segname, "r") as ro, client.open(segname, "rw") as rw:
            for call in (lambda: gshm.copy(ro, rw, 16), lambda: gshm.copy_signal(ro, rw, 8, rw, 1),
                         lambda: gshm.copy_signal(rw, rw, 8, ro, 1), lambda: gshm.signal(ro, 1)):
                with pytest.raises(gshm.PermissionDenied, match="read-only.*'r'"):
                    call()
            assert calls == []
            gshm.copy(rw, ro, 16)  # from it: fine
            gshm.wait(ro, 1)
            assert [n for n, _ in calls] == ["gshm_copy", "gshm_wait"]
    finally:
        client.unlink(segname)


def test_copy_signal_of_nothing_takes_none_buffers(monkeypatch):
    """copy_signal of 0 bytes is the signal alone (gshm.h): dst and src
    may then be None, passed as NULL, which libgshm took as -EINVAL (and
    the bindings refused None before asking it); with bytes to copy they
    are still refused.  Against the real library the call is then
    signal(flag, value): the same outcome, whatever the machine's GPUs."""
    from gshm import _copy
    buf = ctypes.create_string_buffer(64)
    flag = (ctypes.addressof(buf) + 7) & ~7

    def outcome(call):
        try:
            call()
            return None
        except Exception as e:  # noqa: BLE001 (compared, not swallowed)
            return type(e), getattr(e, "errno", None)
    assert outcome(lambda: gshm.copy_signal(None, None, 0, flag, 1)) == \
        outcome(lambda: gshm.signal(flag, 1))
    assert outcome(lambda: gshm.copy_signal(None, flag + 16, 0, flag, 1, method="sm")) == \
        outcome(lambda: gshm.signal(flag, 1))
    calls = []
    monkeypatch.setattr(_copy, "_optional", lambda name: lambda *a: calls.append((name, a)) or 0)
    gshm.copy_signal(None, None, 0, flag, 3)
    assert calls == [("gshm_copy_signal", (0, 0, 0, 0, flag, 3, None))]
    with pytest.raises(TypeError, match="dst"):
        gshm.copy_signal(None, flag + 16, 8, flag, 1)
    with pytest.raises(TypeError, match="src"):
        gshm.copy_signal(flag + 8, None, 8, flag, 1)
    assert len(calls) == 1


def test_copy_signal_and_flags_refuse_counts_ctypes_would_wrap(monkeypatch):
    """copy_signal passed nbytes, and signal/wait/copy_signal the flag value,
    through int() to size_t / uint64_t arguments, which ctypes wraps
    silently: nbytes=-1 became a copy of 2**64 - 1 bytes (past every
    buffer, and the "fits dst" check let -1 through), wait(flag, -1) a wait
    for 2**64 - 1 that never ends.  copy() already refused them."""
    from gshm import _copy
    calls = []
    monkeypatch.setattr(_copy, "_optional", lambda name: lambda *a: calls.append((name, a)) or 0)
    buf = ctypes.create_string_buffer(64)
    flag = (ctypes.addressof(buf) + 7) & ~7
    with pytest.raises(ValueError, match="negative"):
        gshm.copy_signal(flag + 8, flag + 16, -1, flag, 1)
    with pytest.raises(ValueError, match="bits"):
        gshm.copy_signal(flag + 8, flag + 16, 1 << 64, flag, 1)
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError):
            gshm.copy_signal(flag + 8, flag + 16, 8, flag, bad)
        with pytest.raises(ValueError):
            gshm.signal(flag, bad)
        with pytest.raises(ValueError):
            gshm.wait(flag, bad)
    # a non-integral float was rounded down by int() (1.5 bytes: a copy of 1)
    for call in (lambda: gshm.copy_signal(flag + 8, flag + 16, 1.5, flag, 1),
                 lambda: gshm.copy_signal(flag + 8, flag + 16, 8, flag, 2.5),
                 lambda: gshm.copy(flag + 8, flag + 16, nbytes=1.5),
                 lambda: gshm.signal(flag, 0.5), lambda: gshm.wait(flag, 1.5)):
        with pytest.raises(ValueError, match="whole number"):
            call()
    assert calls == []
    # good values still go through, unchanged (an integral float too)
    gshm.copy_signal(flag + 8, flag + 16, 8.0, flag, (1 << 64) - 1)
    gshm.signal(flag, 0)
    gshm.wait(flag, 5)
    assert [(n, a[2] if n == "gshm_copy_signal" else a[1]) for n, a in calls] == [
        ("gshm_copy_signal", 8), ("gshm_signal", 0), ("gshm_wait", 5)]
    assert calls[0][1][5] == (1 << 64) - 1


def test_close_from_another_thread_during_a_call(daemon, client, segname):
    """ctypes lets go of the GIL in every call, so another thread's close()
    can run between a method's check that the object is open and the C
    function's use of it.  Each race is made certain by running that close()
    exactly there: Client.close() after gshm_create returned (it freed the
    new segment with the client, and _wrap then read its info from freed
    memory: a segment of size 0 and a garbage id), Segment.close() as
    gshm_read starts (gshm_close freed the segment under the read).  Each
    call now holds the C object until it returns: the read gets the bytes,
    the create is refused (ValueError) and its lease ended, and nothing is
    left open.  In a child process: the old code crashes or reads garbage."""
    with client.create(segname, 4096) as seg:
        seg.write(b"gshm" * 1024, 0)
    p = run_child(daemon, """
        import gshm._client as C, gshm._segment as S
        name = sys.argv[2]
        c = gshm.Client(sock)
        real_handle = C._SegHandle

        def closing_handle(ptr, ch):
            c.close()                       # another thread's Client.close()
            return real_handle(ptr, ch)
        C._SegHandle = closing_handle
        try:
            s = c.create(name + "-new", 4096)
            print("create: opened", s.info.size, s.info.id)
        except ValueError as e:
            print("create: refused:", e)
        C._SegHandle = real_handle
        print("client closed:", c.closed)

        c = gshm.Client(sock)
        seg = c.open(name, "r")
        real_optional = S._optional

        def closing_optional(fn_name):
            fn = real_optional(fn_name)
            def call(*a):
                seg.close()                 # another thread's Segment.close()
                return fn(*a)
            return call
        S._optional = closing_optional
        data = seg.read(0, 4096)
        S._optional = real_optional
        print("read:", data == b"gshm" * 1024, seg.closed)
        c.close()
        """, segname)
    out = p.stdout.decode()
    assert "create: refused: gshm: client is closed" in out, out
    assert "client closed: True" in out, out
    assert "read: True True" in out, out
    assert leases_of(daemon, segname) == [] and leases_of(daemon, segname + "-new") == []
    # gshmd made the segment, but the create failed: its name is unlinked
    # (test_create_interrupted_as_it_returns_leaves_nothing)
    assert not client.exists(segname + "-new")
    client.unlink(segname)


def test_a_close_waiting_in_libgshm_does_not_stall_other_clients(monkeypatch, daemon, client,
                                                                  segname):
    """gshm_close (and gshm_disconnect) wait for the client's lock, which
    another thread's request holds for as long as it runs (a pull: minutes).
    They were called with the package's state lock held, so meanwhile every
    call on any other client waited too, and a finalizer that the garbage
    collector ran inside that request's progress callback waited for ever.
    Here gshm_close waits on an event, as it would on that lock."""
    import threading
    from gshm import _lib
    lib = _lib.lib()
    entered, release = threading.Event(), threading.Event()

    class WaitingClose(object):
        def __getattr__(self, name):
            return getattr(lib, name)

        def gshm_close(self, ptr):
            entered.set()
            release.wait(30)
            return lib.gshm_close(ptr)
    other = gshm.Client(daemon.socket, name="other")
    seg = client.create(segname, 4096)
    monkeypatch.setattr(_lib, "lib", WaitingClose)
    closer = threading.Thread(target=seg.close)
    closer.start()
    try:
        assert entered.wait(10)
        got = []
        user = threading.Thread(target=lambda: got.append(other.stat(segname).name))
        user.start()
        user.join(3)
        stalled = user.is_alive()
    finally:
        release.set()
        closer.join(10)
    user.join(10)
    monkeypatch.undo()
    assert not stalled, "another client's stat() waited for this client's close"
    assert got == [segname] and seg.closed
    other.close()
    client.unlink(segname)


def test_last_disconnect_under_a_lock_is_put_off(monkeypatch, daemon, client):
    """A Client whose last reference went while its thread held
    gshm._core._state_lock, gshm._dlpack._LIVE_LOCK or a pool's lock (a
    _PutOffLock; a release's collection, _putting_off), or captured a CUDA
    graph (a finalizer that the garbage collector ran at an allocation
    there), was disconnected right there, where a segment's close is put
    off: gshm_disconnect waits for the client's lock and, for the mappings
    whose unmap it finishes, for the GPU's queued work (a synchronize,
    which invalidates a capture), stalling every thread that wants the
    lock.  Now it is put off as the closes are, and made once the lock is
    let go (at the next call's end for _state_lock and _LIVE_LOCK, after
    the capture).  gshm_disconnect is wrapped here to record where it was
    called."""
    from gshm import _core
    lib = _lib.lib()
    calls = []

    class Recording(object):
        def __getattr__(self, name):
            return getattr(lib, name)

        def gshm_disconnect(self, ptr):  # where: (_state_lock, _LIVE_LOCK, put-off scopes, capture)
            calls.append((_core._state_lock._is_owned(), _dlpack._LIVE_LOCK._is_owned(),
                          getattr(_core._tls, "putting_off", 0), capturing[0]))
            return lib.gshm_disconnect(ptr)

    capturing = [False]
    monkeypatch.setattr(_core, "_capturing", lambda: capturing[0])
    monkeypatch.setattr(_lib, "lib", Recording)

    @contextlib.contextmanager
    def capture():
        capturing[0] = True
        try:
            yield
        finally:
            capturing[0] = False

    scopes = {"state_lock": lambda: _core._state_lock, "pool_lock": _core._PutOffLock,
              "putting_off": _core._putting_off, "capture": capture,
              "export_lock": lambda: _dlpack._LIVE_LOCK}
    for scope, enter in scopes.items():
        name = "put-off-" + scope
        c = gshm.Client(daemon.socket, name=name)
        cycle = [c]
        cycle.append(cycle)  # garbage only the cyclic collector frees
        del c, cycle
        with enter():
            gc.collect()  # the Client's finalizer: its last reference
            assert calls == [], (scope, calls)
            assert name in [ci.name for ci in client.clients()], scope  # still connected
        client.status()  # a call's end (after _state_lock, the capture) makes it
        assert calls == [(False, False, 0, False)], (scope, calls)
        assert _core._deferred == []
        del calls[:]
        deadline = time.monotonic() + 10
        while name in [ci.name for ci in client.clients()] and time.monotonic() < deadline:
            time.sleep(0.05)  # (gshmd drops the connection on its own loop)
        assert name not in [ci.name for ci in client.clients()], scope


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*:DeprecationWarning")
def test_child_after_fork_does_not_touch_parent_connection(daemon, client, segname):
    seg = client.create(segname, 4096, location="host")
    pid = os.fork()
    if pid == 0:  # the child drops its copies of the objects and exits
        try:
            del seg
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert len(leases_of(daemon, segname, os.getpid())) == 1
    assert seg.stat().leases == 1    # our connection still works
    seg.close()
    client.unlink(segname)


_WRITER = r"""
import sys
import gshm

def hwm_kib():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])

size = int(sys.argv[3])
with gshm.Client(sys.argv[1]) as c, c.open(sys.argv[2], "rw") as seg:
    seg.write(b"\0", size - 1)  # the shared pages, touched before the measure
    seg.write(bytearray(size), 0)
    data = (bytearray if sys.argv[4] == "bytearray" else bytes)(b"\x5a" * size)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS from now on (making data had its own)
    before = hwm_kib()
    seg.write(data, 0)
    grew = hwm_kib() - before
    assert seg.read(size - 1, 1) == b"\x5a"
print(grew)
"""


@pytest.mark.parametrize("kind", ["bytes", "bytearray"])
def test_write_makes_no_copy_of_the_data(daemon, client, segname, kind):
    """Segment.write handed gshm_write a ctypes copy of the whole buffer
    (from_buffer_copy): writing 256 MiB of weights took 256 MiB more of
    memory for the length of the call.  Now bytes and writable buffers are
    read in place (a process of its own: its peak RSS grows by less than
    a quarter of the data)."""
    size = 256 << 20
    with client.create(segname, size, location="host", mode=0o600):
        p = subprocess.run([sys.executable, "-c", _WRITER, daemon.socket, segname, str(size),
                            kind], env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
    client.unlink(segname)
    assert p.returncode == 0, p.stderr.decode()
    grew_kib = int(p.stdout)
    assert grew_kib < (size >> 10) // 4, (kind, grew_kib)


def test_read_write_and_daemon_views(daemon, client, segname):
    with client.create(segname, 10000, location="host") as seg:
        seg.write(b"hello", 4090)
        assert seg.read(4090, 5) == b"hello" and bytes(seg[4090:4095]) == b"hello"
        assert len(seg.read()) == seg.size
        with pytest.raises(ValueError):
            seg.read(seg.size - 2, 3)
        with pytest.raises(ValueError):
            seg.write(b"xx", seg.size - 1)
        addr = seg.map()
        assert addr and seg.mapped and seg.map() == addr
        mine = [l for l in client.leases() if l.segment == segname]
        assert mine[0].mapped and mine[0].devices == ()
        # the library's own mapping and ours see the same bytes
        assert ctypes.string_at(addr + 4090, 5) == b"hello"
    assert client.devices() == []            # host backend: no GPUs
    assert "gshm_segments" in client.metrics()
    client.unlink(segname)


def test_gshmctl_read_gives_the_safetensors_bytes(daemon, client, segname):
    arrays = {"x": numpy.arange(10, dtype=numpy.float32)}
    seg = _safetensors.share_arrays(client, segname, arrays)
    want = bytes(seg[:seg.requested_size])
    seg.close()
    out = daemon.gshmctl("read", segname).stdout
    client.unlink(segname)
    # safetensors needs the file to end where the data ends (requested_size)
    assert out == want


def test_torch_state_dict_on_a_host_segment(daemon, client, segname):
    torch = pytest.importorskip("torch")
    import gshm.torch as gt
    g = torch.Generator().manual_seed(7)
    sd = {"w": torch.randn(33, 17, generator=g), "h": torch.randn(9, generator=g).half(),
          "bf": torch.randn(5, 3, generator=g).bfloat16(), "i": torch.arange(11),
          "m": torch.rand(13, generator=g) > 0.5, "s": torch.tensor(2.5),
          "e": torch.empty(0, 4), "nc": torch.randn(4, 6, generator=g).t()}
    seg = gt.share_state_dict(client, segname, sd, location="host")
    raw = bytes(seg[:seg.requested_size])
    seg.close()
    loaded = gt.load_state_dict(client, segname)
    assert list(loaded) == list(sd)
    lo, hi = loaded.address, loaded.address + loaded.info.size
    for k, t in sd.items():
        u = loaded[k]
        assert u.dtype == t.dtype and u.shape == t.shape and torch.equal(u, t), k
        if u.numel():
            assert lo <= u.data_ptr() < hi, k
    p = run_child(daemon, """
        import torch, gshm.torch as gt
        with gshm.Client(sock) as c:
            sd = gt.load_state_dict(c, sys.argv[2])
            print(repr({k: float(v.double().sum()) for k, v in sd.items()}))
        """, segname)
    sums = eval(p.stdout.decode())
    for k, t in sd.items():
        assert sums[k] == pytest.approx(float(t.double().sum()), rel=1e-6)
    try:
        import safetensors.torch as stt
    except ImportError:
        pass
    else:
        for k, t in stt.load(raw).items():
            assert torch.equal(t, sd[k]), k
    del loaded, u
    client.unlink(segname)


def test_package_imports_have_no_cycle():
    """The modules of gshm import one another without a cycle, lazy imports
    inside functions included: each layer only uses the ones below it.
    Imports under `if TYPE_CHECKING:` are for annotations only (never run)."""
    import ast
    pkg = os.path.dirname(gshm.__file__)
    mods = {f[:-3] for f in os.listdir(pkg) if f.endswith(".py")}
    graph = {}
    for m in mods:
        with open(os.path.join(pkg, m + ".py")) as f:
            tree = ast.parse(f.read())
        typing_only = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                typing_only.update(id(n) for b in node.body for n in ast.walk(b))
        deps = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names if a.name in mods)
        graph[m] = deps & mods - {m, "__init__"}
    assert graph["_torch_pool"] and graph["torch"], graph  # the walk found imports

    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            assert state.get(d) != "open", "import cycle: " + " -> ".join(path + [m, d])
            if d not in state:
                visit(d, path + [m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def _python_m_gshm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gshm"] + list(args),
                          env=env or gshm_testutil.child_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60)


def test_python_m_gshm_is_gshmctl_status(daemon, client, segname):
    """python -m gshm says what gshmctl status says (the same numbers, from
    $GSHM_SOCKET as a container would), segments lists what exists, and an
    unreachable daemon exits 3 as gshmctl does."""
    with client.create(segname, 3 << 20, location="host", mode=0o640):
        env = gshm_testutil.child_env(GSHM_SOCKET=daemon.socket)
        p = _python_m_gshm(env=env)
        assert p.returncode == 0, p.stderr.decode()
        ctl = daemon.gshmctl("status").stdout.decode().splitlines()
        mine = p.stdout.decode().splitlines()
        # the first two lines are the same; the third counts this client as well
        assert mine[:2] == ctl[:2], (mine, ctl)
        # one of a thing is one ("1 segments" before), as gshmctl says it
        assert mine[2].endswith(" clients, 1 segment (3 MiB), 1 lease"), mine
        want = json.loads(daemon.gshmctl("--json", "status").stdout)
        got = json.loads(_python_m_gshm("--json", "--socket", daemon.socket).stdout)
        for k in ("version", "pid", "started", "backends", "devices", "segments", "bytes"):
            assert got[k] == want[k], (k, got, want)

        p = _python_m_gshm("segments", "--socket", daemon.socket)
        assert p.returncode == 0, p.stderr.decode()
        row = [l for l in p.stdout.decode().splitlines() if segname in l]
        assert len(row) == 1 and "3 MiB" in row[0] and "0640" in row[0] and "host" in row[0], row
        doc = json.loads(_python_m_gshm("--json", "clients", "--socket", daemon.socket).stdout)
        assert any(c["name"] == "pytest" and c["pid"] == os.getpid() for c in doc["clients"]), doc
    client.unlink(segname)

    p = _python_m_gshm("--socket", daemon.socket + ".absent")
    assert p.returncode == 3 and b"cannot reach gshmd" in p.stderr, (p.returncode, p.stderr)
    # what to do, as gshmctl says it: nothing there, or a file that is no socket
    assert b"is gshmd running?" in p.stderr and b"GSHM_SOCKET" in p.stderr, p.stderr
    with tempfile.NamedTemporaryFile() as f:
        p = _python_m_gshm("--socket", f.name)
        assert p.returncode == 3 and b"is not a socket" in p.stderr, (p.returncode, p.stderr)
    with pytest.raises(gshm.Unreachable) as ei:
        gshm.Client(daemon.socket + ".absent")
    assert "is gshmd running?" in str(ei.value) and ei.value.errno == errno.ENOENT, ei.value
    # another program's socket (a stream one): not gshmd's, exit 3 as
    # gshmctl; it was "unknown error" and exit 1
    with tempfile.TemporaryDirectory() as d, socket.socket(socket.AF_UNIX) as other:
        other.bind(os.path.join(d, "other"))
        other.listen()
        p = _python_m_gshm("--socket", os.path.join(d, "other"))
        assert p.returncode == 3 and b"not gshmd's" in p.stderr, (p.returncode, p.stderr)
        assert b"unknown error" not in p.stderr, p.stderr


def test_python_m_gshm_empty_daemon_is_gshmctl_status():
    """On a gshmd that holds nothing (a fresh node: the README's first
    check), python -m gshm's status is gshmctl's, line for line; it said
    "0 segments (0 bytes)" where gshmctl says "(0 B)"."""
    d = gshm_testutil.Daemon().start()
    try:
        p = _python_m_gshm("--socket", d.socket)
        assert p.returncode == 0, p.stderr.decode()
        ctl = d.gshmctl("status").stdout.decode().splitlines()
        assert p.stdout.decode().splitlines() == ctl, (p.stdout.decode(), ctl)
        assert ctl[2] == "1 client, 0 segments (0 B), 0 leases", ctl
    finally:
        d.stop()


def test_python_m_gshm_without_libgshm(tmp_path):
    """python -m gshm where libgshm cannot be loaded (a container without
    it: the check the README offers) says so in one line and exits 1; it
    died with a traceback."""
    env = gshm_testutil.child_env(GSHM_LIBRARY=str(tmp_path / "libgshm.so"))
    p = _python_m_gshm("--socket", str(tmp_path / "s"), env=env)
    err = p.stderr.decode()
    assert p.returncode == 1 and "Traceback" not in err, (p.returncode, err)
    assert err.startswith("gshm: cannot load libgshm") and "GSHM_LIBRARY" in err, err


def test_python_m_gshm_output_that_cannot_be_written(daemon, client):
    """python -m gshm whose stdout is a pipe its reader closed (`| head`)
    or a full disk: a BrokenPipeError or OSError traceback (and another
    from the interpreter's flush at exit).  Now, as gshmctl: exit 1, the
    full disk said in one line, the closed pipe quietly."""
    names = ["pyout/%04d" % i for i in range(2000)]  # more than a pipe holds
    try:
        for n in names:
            client.create(n, 1, location="host").close()
        p = subprocess.Popen([sys.executable, "-m", "gshm", "segments", "--socket",
                              daemon.socket], env=gshm_testutil.child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.read(10)
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(60) == 1 and err == "", (p.returncode, err)
        if os.path.exists("/dev/full"):
            with open("/dev/full", "w") as full:
                q = subprocess.run([sys.executable, "-m", "gshm", "--socket", daemon.socket],
                                   env=gshm_testutil.child_env(), stdout=full,
                                   stderr=subprocess.PIPE, timeout=60)
            err = q.stderr.decode()
            assert q.returncode == 1 and "Traceback" not in err, (q.returncode, err)
            assert err.startswith("gshm: writing output: No space left"), err
    finally:
        for n in names:
            if client.exists(n):
                client.unlink(n)


def test_python_m_gshm_lists_each_library_tried_once(tmp_path):
    """python -m gshm where no libgshm loads lists each candidate once: the
    dynamic linker's name (find_library's answer where ldconfig knows a
    libgshm.so.0 that does not load, then the fallback of the same name)
    was tried and listed twice, and a build's libgshm.so and libgshm.so.0,
    links to one file, twice as well."""
    build = tmp_path / "build" / "client"
    build.mkdir(parents=True)
    (build / "libgshm.so.0.1.0").write_bytes(b"not an ELF file")
    os.symlink("libgshm.so.0.1.0", str(build / "libgshm.so.0"))
    os.symlink("libgshm.so.0", str(build / "libgshm.so"))
    script = textwrap.dedent("""
        import ctypes, ctypes.util, sys
        try:
            ctypes.CDLL("libgshm.so.0")
            sys.exit(77)  # one is installed: nothing here would fail to load
        except OSError:
            pass
        ctypes.util.find_library = lambda name: "libgshm.so.0"  # ldconfig's stale entry
        import gshm._lib as L
        L._package_dir = lambda: %r
        from gshm.__main__ import main
        sys.exit(main(["--socket", %r]))
        """ % (str(tmp_path / "pkg" / "gshm"), str(tmp_path / "s")))
    env = gshm_testutil.child_env()
    env.pop("GSHM_LIBRARY", None)
    env.pop("LD_LIBRARY_PATH", None)
    p = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    if p.returncode == 77:
        pytest.skip("a libgshm.so.0 is installed")
    err = p.stderr.decode()
    assert p.returncode == 1 and err.startswith("gshm: cannot load libgshm"), (p.returncode, err)
    tried = [t.split(": ", 1)[0] for t in err.split("tried: ", 1)[1].strip().split("; ")]
    assert len(tried) == len(set(tried)), tried
    assert tried.count("libgshm.so.0") == 1, tried
    assert len([t for t in tried if t.startswith(str(build))]) == 1, tried


def test_python_m_gshm_escapes_names(daemon, client):
    """Names other users chose reach python -m gshm's tables escaped as
    gshmctl's (the attack4 review): a C1 CSI (U+009B) and a bidi override
    went to the terminal raw, and a client name that is not UTF-8 went as
    its raw 0x9B byte (a C1 CSI to an 8-bit terminal; under a UTF-8 locale
    `clients` died with UnicodeEncodeError instead)."""
    import gshm
    name = "esc/\u009b2J\u202egpj.exe"
    with gshm.Client(daemon.socket, name="evil\udc9b31m") as evil, \
            evil.create(name, 4096, location="host", mode=0o644):
        for verb, want in (("segments", "esc/\\xC2\\x9B2J\\xE2\\x80\\xAEgpj.exe"),
                           ("clients", "evil\\x9B31m")):
            p = _python_m_gshm(verb, "--socket", daemon.socket)
            assert p.returncode == 0, p.stderr.decode()
            out = p.stdout
            assert b"\xc2\x9b" not in out and b"\xe2\x80\xae" not in out, out
            assert all(b == 0x0a or (0x20 <= b != 0x7f and b != 0x9b) for b in out), out
            assert want.encode() in out, (verb, out)
        evil.unlink(name)


def test_python_m_gshm_escapes_its_errors(tmp_path):
    """python -m gshm's error line escapes the socket path it echoes (the
    user's own argument) as gshmctl's errors do: an ESC or a bidi
    override in it went to the terminal raw."""
    sock = str(tmp_path / "\x1b[2J\u202e")
    p = _python_m_gshm("--socket", sock)
    err = p.stderr
    assert p.returncode == 3, (p.returncode, err)
    assert b"\x1b" not in err and b"\xe2\x80\xae" not in err, err
    assert b"\\x1B[2J\\xE2\\x80\\xAE" in err, err


def test_shown_escapes_arabic_letter_mark():
    """U+061C (ARABIC LETTER MARK) is a bidi control as U+200F is: shown()
    escapes it as gshmctl's tables do (it went raw); Arabic letters stay."""
    from gshm.__main__ import shown
    assert shown("a\u061cb") == "a\\xD8\\x9Cb"
    assert shown("\u061b\u0627") == "\u061b\u0627"


def test_python_m_gshm_json_is_unicode(daemon, client):
    """A segment or client name that is not UTF-8 (names are bytes) comes
    out of python -m gshm --json as gshmctl --json gives it: each bad byte
    as U+FFFD.  Before, its surrogate escape went out as a lone surrogate
    ("\\udc9b"), JSON that strict parsers (Rust's serde_json, Go's
    decoder rewrites it) refuse or alter: any user could break an admin's
    script that parses the listing, as one document for everyone."""
    import gshm
    name = "bad\udc9bname"
    with gshm.Client(daemon.socket, name="evil\udc9b31m") as evil, \
            evil.create(name, 4096, location="host", mode=0o644):
        for verb, key, want in (("segments", "name", "bad\ufffdname"),
                                ("clients", "name", "evil\ufffd31m")):
            p = _python_m_gshm("--json", verb, "--socket", daemon.socket)
            assert p.returncode == 0, p.stderr.decode()
            doc = json.loads(p.stdout)
            names = [e[key] for e in doc[verb]]
            for n in names:
                n.encode("utf-8")  # no lone surrogate
            assert want in names, names
        evil.unlink(name)


def test_python_m_gshm_json_is_gshmctls(daemon, client, segname):
    """python -m gshm --json gives gshmctl --json's documents for status,
    segments and clients: its schema_version, its keys in its order, its
    value forms (mode "0640", state, created and since as RFC 3339 text,
    device and source null).  Before, the Python CLI dumped its records:
    no schema_version, mode 416, started_ns, unlinked, device_index, ...,
    so a script written against one broke on the other."""
    with client.create(segname + "/a", 3 << 20, location="host", mode=0o640), \
            client.create(segname + "/b", 4096, location="host", mode=0o604):
        client.unlink(segname + "/b")  # still held: listed as "unlinked"
        for verb in ("status", "segments", "clients"):
            want = json.loads(daemon.gshmctl("--json", verb).stdout)
            p = _python_m_gshm("--json", verb, "--socket", daemon.socket)
            assert p.returncode == 0, p.stderr.decode()
            got = json.loads(p.stdout)
            assert list(got) == list(want), (verb, got, want)
            if verb == "status":
                assert got == want, (got, want)
            elif verb == "segments":
                assert got == want, (got, want)
                mine = [s for s in got["segments"] if s["name"].startswith(segname)]
                assert [(s["mode"], s["state"]) for s in mine] == [("0640", "live"),
                                                                   ("0604", "unlinked")], mine
            else:
                # each lists itself as well ("gshmctl", "python -m gshm"): the same
                # keys in every entry, and the same entries for the others
                assert all(list(e) == list(want["clients"][0])
                           for e in got["clients"] + want["clients"]), (got, want)
                others = lambda d: [e for e in d["clients"]
                                    if e["name"] not in ("gshmctl", "python -m gshm")]
                assert others(got) == others(want) and others(got), (got, want)
    client.unlink(segname + "/a")


def test_python_m_gshm_json_errors_are_gshmctls(tmp_path):
    """With --json an error of python -m gshm is gshmctl's JSON error, one
    line on stderr with stdout empty: a daemon not reached (the same
    document, message included) and a usage error (exit 2, EINVAL).
    Before, both were text ("gshm: cannot reach gshmd at ...: gshm_connect:
    ...", argparse's usage), which a script that parses stderr as gshmctl's
    README says could not read."""
    sock = str(tmp_path / "absent")
    unreached = None
    for verb, code in (("status", 3), ("bogus", 2)):
        want = subprocess.run([gshm_testutil.gshmctl_path(), "--socket", sock, "--json", verb],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        p = _python_m_gshm("--socket", sock, "--json", verb)
        assert (p.returncode, want.returncode) == (code, code), (p, want)
        assert p.stdout == b"" and len(p.stderr.splitlines()) == 1, p
        got, ref = json.loads(p.stderr), json.loads(want.stderr)
        assert list(got) == list(ref) and list(got["error"]) == list(ref["error"]), (got, ref)
        assert got["error"]["errno"] == ref["error"]["errno"], (got, ref)
        if code == 3:
            assert got == ref, (got, ref)
            unreached = ref["error"]["message"]
    # an abbreviated --json, which argparse (as gshmctl's getopt_long) takes:
    # the same JSON error (it was argparse's text)
    p = _python_m_gshm("--socket", sock, "--js", "bogus")
    assert p.returncode == 2 and json.loads(p.stderr)["error"]["errno"] == "EINVAL", p
    # without --json, the same words as text
    p = _python_m_gshm("--socket", sock)
    assert p.returncode == 3 and p.stderr.decode() == "gshm: %s\n" % unreached, p.stderr


def test_python_m_gshm_status_says_gpus_unusable():
    """While gshmd's GPUs are unusable (StatusInfo.gpu_fault), python -m
    gshm status says so in gshmctl status's words, between the backends
    and the totals (tests/integration/test_sticky_restart.c checks
    gshmctl's on a fake driver).  Before, it printed the three lines of a
    healthy gshmd: a container's check saw nothing wrong."""
    from gshm import StatusInfo
    from gshm.__main__ import status_lines
    base = dict(version="0.1.0", pid=7, started_ns=0, clients=1, segments=2, leases=0,
                devices=0, bytes=8192, backends=("host", "cuda"))
    for fault, said in (("", None),
                        ("0000:18:00.0: CUDA_ERROR_ECC_UNCORRECTABLE",
                         "GPUs unusable: a sticky CUDA error at gshmd's start (0000:18:00.0: "
                         "CUDA_ERROR_ECC_UNCORRECTABLE); device segments are parked (listed, "
                         "not opened) and device creates refused until the GPUs work again and "
                         "gshmd restarts"),
                        ("no driver: cuInit failed: no NVIDIA GPU",
                         "GPUs unusable: the CUDA driver did not start with gshmd (cuInit "
                         "failed: no NVIDIA GPU); device segments are parked")):
        lines = status_lines(StatusInfo(gpu_fault=fault, **base))
        assert lines[1] == "backends: host,cuda (0 GPUs)", lines
        assert lines[-1] == "1 client, 2 segments (8 KiB), 0 leases", lines
        if said is None:
            assert len(lines) == 3, lines
        else:
            assert len(lines) == 4 and lines[2].startswith(said), lines


def test_python_m_gshm_tables_are_gshmctls(daemon, client, segname):
    """python -m gshm segments and clients print gshmctl's tables: its
    headings, widths and columns (AGE, SINCE and a pulled segment's
    source, which the Python tables lacked; SIZE and LOCATION were wider,
    NAME 30 wide), every row the same but the CLI's own client's and the
    ages (taken a moment apart)."""
    import re
    age = lambda line: re.sub(r"(?<= )\d+[smhd](?= |$)", "T", line)
    others = lambda lines: [age(l) for l in lines[1:]
                            if not re.search(r" (gshmctl|python -m gshm) ", l)]
    with client.create(segname + "/a", 3 << 20, location="host", mode=0o640), \
            client.create(segname + "/b", 4096, location="host", mode=0o604):
        client.unlink(segname + "/b")
        for verb in ("segments", "clients"):
            want = daemon.gshmctl(verb).stdout.decode().splitlines()
            p = _python_m_gshm(verb, "--socket", daemon.socket)
            assert p.returncode == 0, p.stderr.decode()
            got = p.stdout.decode().splitlines()
            assert got[0] == want[0], (got, want)
            assert others(got) == others(want) and others(got), (got, want)
    client.unlink(segname + "/a")


def test_python_m_gshm_long_names_keep_columns(daemon, client):
    """A segment or client name longer than its column widens the column
    for every row, as in gshmctl: before, it pushed the later columns of
    its own row out of line.  Each table's rows, less their last column
    (AGE; LEASES), end with a right-aligned column (LEASES; SINCE, padded),
    so aligned rows are of one length without it."""
    import gshm
    from gshm.__main__ import client_lines, segment_lines
    name = "w" * 50 + "/\u00e9"
    with gshm.Client(daemon.socket, name="c" * 30 + "\u00e9") as c2, \
            c2.create(name, 4096, location="host"), c2.create("short", 4096, location="host"):
        for lines in (segment_lines(client.segments()), client_lines(client.clients())):
            assert len(lines) >= 3 and len({len(l.rsplit(" ", 1)[0]) for l in lines}) == 1, lines
        c2.unlink(name)
        c2.unlink("short")


def test_unreachable_says_what_gshmctl_says(tmp_path):
    """gshm.Client and gshmctl explain a daemon they cannot reach with one
    text (libgshm's gshm_connect_explain): nothing there, a file that is no
    socket, a socket nothing listens on."""
    import socket as socket_
    notsock = tmp_path / "plain"
    notsock.write_bytes(b"")
    stale = tmp_path / "stale"
    s = socket_.socket(socket_.AF_UNIX, socket_.SOCK_SEQPACKET)
    s.bind(str(stale))
    s.close()
    for path, code in ((tmp_path / "absent", errno.ENOENT), (notsock, errno.ECONNREFUSED),
                       (stale, errno.ECONNREFUSED)):
        p = subprocess.run([gshm_testutil.gshmctl_path(), "--socket", str(path), "status"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lead = "cannot reach gshmd at %s: " % path
        err = p.stderr.decode()
        assert p.returncode == 3 and lead in err, (p.returncode, err)
        said = err[err.index(lead) + len(lead):].strip()
        with pytest.raises(gshm.Unreachable) as ei:
            gshm.Client(str(path))
        assert ei.value.errno == code and ei.value.gshm_message == said, (ei.value, said)
        assert ("start gshmd" in said) != (path == notsock), said


def test_public_api_is_annotated():
    """Every public function and method (dunders included) of gshm and
    gshm.torch has type hints on each parameter and its return: py.typed
    promises them to mypy.  Read from the sources: gshm.torch needs torch
    to import."""
    import ast
    pkg = os.path.dirname(gshm.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))

    def public(f):
        return not f.name.startswith("_") or (f.name.startswith("__") and f.name.endswith("__"))

    missing, checked = [], 0
    for mod in ("__init__", "__main__", "_client", "_segment", "_copy", "_info", "_dtypes",
                "_errors", "torch", "_torch_pool", "_torch_load", "_torch_state"):
        with open(os.path.join(pkg, mod + ".py")) as f:
            tree = ast.parse(f.read())
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and public(n)]
        for c in tree.body:
            if isinstance(c, ast.ClassDef) and not c.name.startswith("_"):
                funcs += [n for n in c.body if isinstance(n, ast.FunctionDef) and public(n)]
        for node in funcs:
            a = node.args
            params = [p for p in a.posonlyargs + a.args + a.kwonlyargs
                      if p.arg not in ("self", "cls")]
            params += [p for p in (a.vararg, a.kwarg) if p is not None]
            bad = [p.arg for p in params if p.annotation is None]
            if node.returns is None:
                bad.append("return")
            if bad:
                missing.append("%s.py:%d %s: %s" % (mod, node.lineno, node.name, ", ".join(bad)))
            checked += 1
    assert checked > 80 and not missing, "\n".join(missing)


def test_typed_example_runs(daemon):
    """examples/typed_host.py (what python_mypy checks) works as written."""
    path = os.path.join(gshm_testutil.PYTHON_DIR, "examples", "typed_host.py")
    p = subprocess.run([sys.executable, path, daemon.socket], env=gshm_testutil.child_env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode().splitlines()
    assert out[-1] == str(float(512 * 512)), out
    names = [s["name"] for s in json.loads(daemon.gshmctl("--json", "segments").stdout)["segments"]]
    assert "examples/typed_host" not in names, names  # the example unlinks what it made


_CAPSULE_UNDER_LOCK = r"""
import gc, sys
from gshm import _dlpack

class Owner(object):
    pass

cap = _dlpack.make_capsule(Owner(), 0x1000, _dlpack.kDLCUDA, 0, 2, 32, (4,))
cycle = [cap]
cycle.append(cycle)  # garbage only the cyclic collector frees
del cap, cycle
with _dlpack._LIVE_LOCK:  # a collection that comes while the lock is held
    gc.collect()
print(_dlpack.live_exports())
"""


def test_dlpack_capsule_collected_while_the_export_lock_is_held():
    """An unconsumed DLPack capsule in a reference cycle, collected while
    this thread holds _dlpack._LIVE_LOCK (Python 3.12 collects at any
    bytecode boundary, the lines under that lock included): its destructor
    runs the deleter, which takes the same lock, a plain Lock, and the
    process hung for ever.  The lock is reentrant now; the export is gone."""
    try:
        p = subprocess.run([sys.executable, "-c", _CAPSULE_UNDER_LOCK],
                           env=gshm_testutil.child_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the collection of a capsule under _LIVE_LOCK hung")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.split() == [b"0"], p.stdout


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*:DeprecationWarning")
@pytest.mark.parametrize("which", ["_core._state_lock", "_dlpack._LIVE_LOCK", "_lib._lock"])
def test_fork_while_another_thread_holds_a_package_lock(daemon, client, segname, which):
    """A fork while another thread held one of the package's locks (a
    decref, a DLPack deleter, the library's loading) left it held for ever
    in the child: the child's first segment it dropped (its finalizer's
    decref) or DLPack deleter hung.  Now the fork waits for the lock
    (os.register_at_fork), and the child's copy is free."""
    import threading
    from gshm import _core
    mod, name = which.split(".")
    lock = getattr({"_core": _core, "_dlpack": _dlpack, "_lib": _lib}[mod], name)
    seg = client.create(segname, 4096, location="host")
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if lock.acquire(timeout=5):
                lock.release()
                seg.close()  # (the decref that hung)
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    t.join(10)
    timer.join(10)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert seg.stat().leases == 1  # the child's close was its own copy's
    seg.close()
    client.unlink(segname)


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*:DeprecationWarning")
def test_fork_while_another_thread_loads_the_cuda_driver():
    """gshm._cuda holds its lock across cuInit (seconds, on a large node):
    a fork meanwhile left it held for ever in the child, whose first
    device lookup (a device segment's .device, gshm.device_location)
    hung.  Now the child starts with the lock free; the fork does not
    wait for the cuInit either."""
    import signal
    import threading
    from gshm import _cuda
    held, release = threading.Event(), threading.Event()

    def holder():  # as _load does around cuInit
        with _cuda._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(5)  # a hang ends the child
                code = 0 if isinstance(_cuda.device_count(), int) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join(10)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_client_used_in_a_forked_child_is_forked_child(client):
    """A client connected before a fork belongs to the parent: the child's
    calls fail with ECHILD, gshm.ForkedChild (a ChildProcessError), whose
    text says what to do; it fell to the bare gshm.Error, and its text was
    "unknown error", before ECHILD had its class and its row."""
    client.status()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            client.status()
        except gshm.ForkedChild as e:
            code = 0 if (e.errno == errno.ECHILD and isinstance(e, ChildProcessError)
                         and "connect again" in str(e)) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    client.status()  # the parent's client goes on


def _spawned_child(c):  # (never runs: its argument cannot be pickled)
    c.status()


def test_client_segment_and_view_refuse_pickle_and_copy(client, segname):
    """A Client pickled as any object: its raw libgshm pointer went into
    the pickle, so a multiprocessing "spawn" (or torch.multiprocessing)
    child given one called gshm_status on an address of its parent's, and
    copy.deepcopy(client) made a second handle of the one C client, whose
    close freed it under the first.  Now pickling or copying a Client, a
    Segment or a DeviceArray is a TypeError that says to pass names; a
    spawn refuses it in the parent, before any child starts."""
    import copy
    import multiprocessing
    import pickle
    seg = client.create(segname, 4096, location="host")
    try:
        for obj in (client, seg, object.__new__(gshm.DeviceSegment),
                    object.__new__(gshm.DeviceArray)):
            for how in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match="gshm: cannot pickle or copy.*pass names"):
                    how(obj)
        p = multiprocessing.get_context("spawn").Process(target=_spawned_child, args=(client,))
        with pytest.raises(TypeError, match="gshm: cannot pickle"):
            p.start()
        assert client.status().pid > 0 and seg.stat().leases == 1  # both still work
    finally:
        seg.close()
        client.unlink(segname)


def test_copy_refuses_closed_segments(monkeypatch, client, segname):
    """gshm.copy, copy_signal, signal and wait took a closed segment's
    address as it was before the close: the memory there was unmapped
    (a device segment's VA range freed, libgshm's host mapping gone), and
    the driver's copy into it faulted or wrote whatever had been mapped
    there since.  Now a closed segment is ValueError before anything is
    queued, and an open one's lease is held for the length of the call."""
    from gshm import _copy
    calls = []
    seen = []
    open_seg = []

    def fake(name):
        def call(*a):
            calls.append(name)
            seen.append(open_seg[0]._h.refs if open_seg else None)  # the call's own reference
            return 0
        return call
    monkeypatch.setattr(_copy, "_optional", fake)
    a = numpy.zeros(16, numpy.uint8)
    client.create(segname, 4096, location="host").close()
    try:
        closed = client.open(segname, "rw")
        closed.close()
        for call in (lambda: gshm.copy(closed, a), lambda: gshm.copy(a, closed),
                     lambda: gshm.copy_signal(a, a, 8, closed, 1),
                     lambda: gshm.signal(closed, 1), lambda: gshm.wait(closed, 1)):
            with pytest.raises(ValueError, match="closed"):
                call()
        assert calls == []
        with client.open(segname, "rw") as rw:
            open_seg.append(rw)
            refs = rw._h.refs
            gshm.copy(rw, a)
            gshm.signal(rw, 1)
            assert calls == ["gshm_copy", "gshm_signal"] and seen == [refs + 1, refs + 1]
            assert rw._h.refs == refs
    finally:
        client.unlink(segname)


def test_closed_segment_has_no_address(client, segname):
    """Segment.address ("None while not mapped") and .mapped kept the
    mapping's address after close(), when libgshm had unmapped it: code
    that checked seg.mapped before handing seg.address to a copy or a
    kernel used memory that was gone.  Now both say unmapped once closed."""
    seg = client.create(segname, 4096, location="host")
    try:
        assert seg.mapped and seg.address
        seg.close()
        assert seg.closed and not seg.mapped and seg.address is None
    finally:
        client.unlink(segname)


def test_location_of_device_takes_devices_as_views_do(monkeypatch):
    """gshm.location_of_device(torch.device("cuda")) (index None) gave GPU
    0's location whatever device was current: every rank of a program that
    set its own device (torch.cuda.set_device(local_rank)) named GPU 0,
    and "cuda:1" was a bare int() error.  Now a device without an index is
    the current one, and the forms Segment.view takes are taken."""
    import types
    from gshm import _cuda
    monkeypatch.setattr(_cuda, "current_device", lambda: 3)
    monkeypatch.setattr(_cuda, "device_uuid", lambda k: "GPU-%d" % k)
    cases = [(None, 3), ("cuda", 3), (types.SimpleNamespace(type="cuda", index=None), 3),
             (types.SimpleNamespace(type="cuda", index=1), 1), ("cuda:2", 2), (0, 0), (5, 5)]
    for arg, want in cases:
        assert gshm.location_of_device(arg) == "cuda:GPU-%d" % want, arg
    for bad in ("cpu", True, "cuda:x"):
        with pytest.raises(ValueError):
            gshm.location_of_device(bad)


def _standin_device_segment(monkeypatch, peer_path=True):
    """A DeviceSegment on "GPU-own" (ordinal 0 of 2 here; the current device
    is 1) over a stand-in handle, whose map() records the devices asked
    for (no GPU: gshm_map is what a GPU test runs, test_gpu.py
    test_cuda_means_the_current_device).  peer_path False: mapping for
    cuda:1 fails as gshm_map's -EXDEV does."""
    import types
    from gshm import _cuda, _segment
    monkeypatch.setattr(_cuda, "current_device", lambda: 1)
    monkeypatch.setattr(_cuda, "device_count", lambda: 2)
    monkeypatch.setattr(_cuda, "ordinal_of_uuid", lambda u: 0 if u == "GPU-own" else None)
    handle = types.SimpleNamespace(ptr=0x10, owner_released=False, refs=1, unmapping=False,
                                   release_owner=lambda: None)
    handle.incref = lambda: None
    handle.decref = lambda: None
    info = types.SimpleNamespace(name="standin/dev", size=1 << 20, gpu_uuid="GPU-own",
                                 location="cuda:GPU-own", is_host=False)
    seg = _segment.DeviceSegment(None, handle, info, "rw")
    asked = []

    def map(devices=None):
        asked.append(devices)
        if devices == [1] and not peer_path:
            raise gshm.NotSupported(errno.EXDEV, "gshm_map: Invalid cross-device link")
        seg._address = 0x7000000
        if seg._mapped_devices is None and devices is not None:
            seg._mapped_devices = list(devices)
        return seg._address

    seg.map = map
    return seg, asked


def test_device_view_cuda_means_the_current_device(monkeypatch):
    """DeviceSegment.view(device="cuda") (or torch.device("cuda"), no
    index) gave a view on the segment's own GPU, where torch (and
    gshm.torch's load_state_dict and attach) mean the current device:
    gshm.torch.tensor_view(seg, ..., device="cuda") followed view.  Now
    both are the calling thread's current device, which gets access to the
    mapping first; device=None stays the segment's own GPU.  An ordinal
    this process lacks is NoDevice, a GPU without a peer path NotSupported
    (EXDEV) saying which GPUs and what to do instead."""
    import types
    seg, asked = _standin_device_segment(monkeypatch)
    assert seg.view("uint8", 16).device == 0 and asked == [None]
    for dev in ("cuda", types.SimpleNamespace(type="cuda", index=None)):
        del asked[:]
        v = seg.view("uint8", 16, device=dev)
        assert v.device == 1 and asked == [[1]], (dev, v.device, asked)
        assert v.__dlpack_device__() == (_dlpack.kDLCUDA, 1)
    assert seg.view("uint8", 16, device="cuda:0").device == 0
    with pytest.raises(gshm.NoDevice, match="no CUDA device 2 in this process"):
        seg.view("uint8", 16, device=2)
    with pytest.raises(ValueError, match="no CUDA device"):
        seg.view("uint8", 16, device="cpu")
    seg, asked = _standin_device_segment(monkeypatch, peer_path=False)
    with pytest.raises(gshm.NotSupported) as e:
        seg.view("uint8", 16, device="cuda")
    assert e.value.errno == errno.EXDEV and e.value.filename == "standin/dev"
    assert "cuda:1 has no peer path to the segment's GPU (cuda:0 here)" in str(e.value), e.value
    assert seg.view("uint8", 16).device == 0  # its own GPU still works


def test_dlpack_release_keeps_a_pending_exception():
    """A DLPack capsule destroyed while an exception was being raised (a
    consumer refusing it: numpy.from_dlpack of a GPU view, "Unsupported
    device"; or any temporary dropped on an error path) ran its ctypes
    destructor with that exception pending: the interpreter turned the
    callback's result into a SystemError, ctypes dropped it, and the
    caller got "SystemError: ... returned NULL without setting an
    exception" instead of the consumer's error, while the export (and
    with it a device view's lease and mapping) was never released.  Now
    C gets libgshm's gshm_py_capsule_destructor and gshm_py_dlpack_deleter,
    which set the exception aside around the callbacks."""
    buf = (ctypes.c_uint8 * 16)()
    released = []

    class View(object):
        def __init__(self, device_type):
            self.device_type = device_type

        def __dlpack__(self, stream=None, **kw):
            return _dlpack.make_capsule(self, ctypes.addressof(buf), self.device_type, 0,
                                        gshm.dtype("uint8").dl_code, 8, (16,))

        def __dlpack_device__(self):
            return (self.device_type, 0)

    import weakref
    before = _dlpack.live_exports()
    v = View(_dlpack.kDLCUDA)
    weakref.finalize(v, released.append, "refused")
    with pytest.raises(Exception) as refused:
        numpy.from_dlpack(v)
    assert not isinstance(refused.value, SystemError), refused.value
    assert "device" in str(refused.value).lower(), refused.value
    del v, refused
    gc.collect()
    assert released == ["refused"] and _dlpack.live_exports() == before
    # an unconsumed capsule freed on an error path of the interpreter itself
    v = View(_dlpack.kDLCPU)
    weakref.finalize(v, released.append, "dropped")
    with pytest.raises(IndexError):
        [v.__dlpack__()][5]
    del v
    gc.collect()
    assert released[-1] == "dropped" and _dlpack.live_exports() == before


def test_exists_is_false_for_names_c_cannot_be_given(client):
    """Client.exists() is False for a name no segment can have, control
    characters included, but a NUL byte (a control character too) or a
    lone surrogate raised the ValueError of the name's encoding instead.
    Now both are False; a closed client and a name of the wrong type
    still raise."""
    for name in ("a\0b", "\ud800", "a\x01b"):
        assert client.exists(name) is False, repr(name)
    with pytest.raises(TypeError):
        client.exists(42)
    c = gshm.Client(client.socket)
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.exists("x")


def test_read_write_take_offsets_as_create_takes_sizes(client, segname):
    """Segment.read(0.5, 1) or write(data, 1.5) handed the float to ctypes,
    whose ctypes.ArgumentError is neither a ValueError nor a TypeError (an
    `except ValueError` let it through).  Now offsets and counts are
    taken as create takes a size: an integral float as its int, anything
    else a ValueError (TypeError for no number)."""
    with client.create(segname, 4096, location="host") as seg:
        try:
            seg.write(b"ab", 4.0)
            assert seg.read(4.0, 2.0) == b"ab" and seg.read(numpy.int64(5), 1) == b"b"
            for call in (lambda: seg.read(0.5, 1), lambda: seg.read(0, 1.5),
                         lambda: seg.write(b"x", 1.5), lambda: seg.read(float("nan"), 1)):
                with pytest.raises(ValueError, match="whole number"):
                    call()
            with pytest.raises(TypeError):
                seg.read(None, 1)
        finally:
            client.unlink(segname)


def test_relative_gshm_library_is_named_absolutely():
    """A relative $GSHM_LIBRARY was kept as given in library_path(), which
    gshm.torch's CUDAPluggableAllocator dlopens again when the first
    MemPool is made: after a chdir that loaded nothing, or a second copy
    of libgshm whose pool registry is empty (every allocation fails).
    Now library_path() is the absolute path of what was loaded."""
    lib = os.path.realpath(gshm.library_path())
    if not os.path.exists(lib):
        pytest.skip("libgshm was found by name (%s), not by path" % gshm.library_path())
    here = os.path.dirname(lib)
    code = ("import os, gshm\np = gshm.library_path()\nos.chdir('/')\n"
            "print(os.path.isabs(p), os.path.samefile(p, %r))" % lib)
    env = gshm_testutil.child_env(GSHM_LIBRARY=os.path.join(".", os.path.basename(lib)))
    out = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, universal_newlines=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert out.stdout.split() == ["True", "True"], out.stdout


class _InterruptedAfter(object):
    """libgshm, but `name` raises KeyboardInterrupt once the real call has
    returned: what Python does with a Ctrl-C that came during the call
    (its handler runs as the call ends, before the result is stored)."""

    def __init__(self, lib, name):
        self._lib, self._name = lib, name

    def __getattr__(self, attr):
        fn = getattr(self._lib, attr)
        if attr != self._name:
            return fn

        def interrupted(*args):
            fn(*args)
            raise KeyboardInterrupt
        return interrupted


def test_create_interrupted_as_it_returns_leaves_nothing(monkeypatch, client, segname):
    """A Ctrl-C during gshm_create (a device segment of GiBs takes long
    enough) raised KeyboardInterrupt as the call returned, before its
    result was wrapped: the C segment kept its lease until the client
    closed, and the new name kept its memory in gshmd after the process
    was gone, until someone unlinked it.  A failed mmap of the new host
    segment left the name the same way.  Now the segment is closed and
    the name unlinked; an open so interrupted is closed."""
    from gshm import _client
    pid = os.getpid()

    def mine(name):
        return [l for l in client.leases() if l.segment == name and l.pid == pid]

    real, handle = _client.L.lib, _client.L.lib()
    monkeypatch.setattr(_client.L, "lib", lambda: _InterruptedAfter(handle, "gshm_create"))
    with pytest.raises(KeyboardInterrupt):
        client.create(segname, 4096, location="host")
    monkeypatch.setattr(_client.L, "lib", real)
    assert not client.exists(segname) and not mine(segname)

    client.create(segname, 4096, location="host").close()
    try:
        monkeypatch.setattr(_client.L, "lib", lambda: _InterruptedAfter(handle, "gshm_open"))
        with pytest.raises(KeyboardInterrupt):
            client.open(segname, "r")
        monkeypatch.setattr(_client.L, "lib", real)
        assert client.exists(segname) and not mine(segname)  # an open unlinks nothing
    finally:
        monkeypatch.setattr(_client.L, "lib", real)
        client.unlink(segname)

    def no_mapping(*a, **kw):
        raise OSError(errno.ENOMEM, "mmap failed")
    monkeypatch.setattr(gshm.HostSegment, "__new__", no_mapping)
    with pytest.raises(OSError, match="mmap failed"):
        client.create(segname, 4096, location="host")
    monkeypatch.undo()
    assert not client.exists(segname) and not mine(segname)
