# SPDX-License-Identifier: Apache-2.0
"""Starting a real gshmd for the tests (also used by run_gpu.py without pytest).

Paths: $GSHMD (default <repo>/build/daemon/gshmd), $GSHMCTL (default
<repo>/build/client/gshmctl), $GSHM_LIBRARY (else the package's own lookup).
"""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

READY_TIMEOUT = 10.0


def gshmd_path():
    return os.environ.get("GSHMD") or os.path.join(REPO, "build", "daemon", "gshmd")


def gshmctl_path():
    return os.environ.get("GSHMCTL") or os.path.join(REPO, "build", "client", "gshmctl")


def child_env(**extra):
    """Environment for child Python processes: this package first on the path."""
    env = dict(os.environ)
    pp = env.get("PYTHONPATH")
    env["PYTHONPATH"] = PYTHON_DIR + (os.pathsep + pp if pp else "")
    env.pop("NOTIFY_SOCKET", None)
    env.update(extra)
    return env


class DaemonError(RuntimeError):
    pass


class Daemon(object):
    """gshmd on a socket in a fresh temporary directory.

    Readiness: NOTIFY_SOCKET names a datagram socket bound here; start()
    returns once a datagram holding READY=1 arrives (or fails after 10 s, or
    as soon as gshmd exits).  The notify socket is drained for the daemon's
    whole life (FDSTORE=1, STATUS=, WATCHDOG=1 keep coming), so gshmd never
    blocks on it; the messages are kept in .messages."""

    def __init__(self, backend="host", args=()):
        self.backend = backend
        self.args = list(args)
        self.tmpdir = tempfile.mkdtemp(prefix="gshm-test-")
        self.socket = os.path.join(self.tmpdir, "gshmd.sock")
        self.log_path = os.path.join(self.tmpdir, "gshmd.log")
        self.config = os.path.join(self.tmpdir, "gshmd.conf")
        self.messages = []
        self.proc = None
        self._notify = None
        self._stop_r = self._stop_w = None
        self._drain = None

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def start(self):
        exe = gshmd_path()
        if not os.access(exe, os.X_OK):
            raise DaemonError("gshmd not found at %s (set $GSHMD)" % exe)
        with open(self.config, "w") as f:
            f.write("# empty: the tests use built-in defaults and flags only\n")
        notify_path = os.path.join(self.tmpdir, "notify")
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._notify.bind(notify_path)
        env = dict(os.environ)
        for k in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC", "WATCHDOG_PID",
                  "GSHM_SOCKET"):
            env.pop(k, None)
        env["NOTIFY_SOCKET"] = notify_path
        cmd = [exe, "--config", self.config, "--socket", self.socket, "--backend", self.backend]
        cmd += self.args
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, close_fds=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._stop_r, self._stop_w = os.pipe()
        self._drain = threading.Thread(target=self._drain_loop, name="gshmd-notify", daemon=True)
        self._drain.start()
        return self

    def _wait_ready(self):
        pidfd = os.pidfd_open(self.proc.pid)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DaemonError("gshmd sent no READY=1 within %.0f s; log:\n%s"
                                      % (READY_TIMEOUT, self.log()))
                r, _, _ = select.select([self._notify, pidfd], [], [], left)
                if self._notify in r:
                    msg = self._notify.recv(65536).decode("utf-8", "replace")
                    self.messages.append(msg)
                    if "READY=1" in msg.split("\n"):
                        return
                elif pidfd in r:
                    rc = self.proc.wait()
                    raise DaemonError("gshmd exited with %s before READY=1; log:\n%s"
                                      % (rc, self.log()))
        finally:
            os.close(pidfd)

    def _drain_loop(self):
        while True:
            r, _, _ = select.select([self._notify, self._stop_r], [], [])
            if self._stop_r in r:
                return
            try:
                msg = self._notify.recv(65536)  # fds sent along (FDSTORE) are discarded
            except OSError:
                return
            self.messages.append(msg.decode("utf-8", "replace"))

    def restart(self):
        """Stops gshmd (SIGTERM) and starts a new one on the same socket and
        files; what it stored in the fd store is not handed back (the
        notify socket discards fds).  Returns self."""
        self.stop(keep_dir=True)
        os.unlink(os.path.join(self.tmpdir, "notify"))
        return self.start()

    def stop(self, keep_dir=False):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._drain is not None:
            os.write(self._stop_w, b"x")
            self._drain.join()
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._drain = None
        if self._notify is not None:
            self._notify.close()
            self._notify = None
        if not keep_dir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def gshmctl(self, *args, check=True):
        """Runs gshmctl --socket S ARGS...; returns the CompletedProcess."""
        cmd = [gshmctl_path(), "--socket", self.socket] + [str(a) for a in args]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        if check and p.returncode != 0:
            raise DaemonError("%s: exit %d\n%s%s" % (" ".join(cmd), p.returncode,
                                                     p.stdout.decode(), p.stderr.decode()))
        return p

    def mappings(self):
        """`gshmctl --socket S --json mappings`, parsed: the list under "mappings"."""
        doc = json.loads(self.gshmctl("--json", "mappings").stdout)
        assert "schema_version" in doc, doc
        return doc["mappings"]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Skipped(Exception):
    """A test skipped itself (when running without pytest)."""


BUILTIN_RUNNER = False  # set by run_gpu.py --builtin


def skip(reason):
    """pytest.skip under pytest; Skipped under run_gpu.py's own runner."""
    if BUILTIN_RUNNER:
        raise Skipped(reason)
    import pytest
    pytest.skip(reason)


def as_uid(uid):
    """A subprocess preexec_fn: the child runs as uid, gid uid, no other
    groups (a user that is no admin of gshmd).  Needs root."""
    def drop():
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return drop


def run_as(daemon, uid, script, *args, timeout=120):
    """Runs Python source `script` as uid (as_uid), argv [daemon's socket]
    + args, this package first on its path; returns the CompletedProcess
    (stdout, stderr as bytes).  The daemon's socket must let uid connect
    (daemon.socket_mode=0666, its directory searchable)."""
    return subprocess.run([sys.executable, "-c", script, daemon.socket] + [str(a) for a in args],
                          env=child_env(), preexec_fn=as_uid(uid), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)


def cluster_pair(keydir, export, backend="host"):
    """Two started gshmd, nodes "a" (exports `export`) and "b", peers of
    each other on free ports of 127.0.0.1, with a key in keydir and this
    process's group as cluster.pull_group.  Returns (a, b); stop both."""
    import grp
    import socket

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    key = os.path.join(keydir, "key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"python-cluster-test-key-0123456789\n")
    os.close(fd)
    pa, pb = free_port(), free_port()
    group = grp.getgrgid(os.getegid()).gr_name

    def args(name, port, peers, exp):
        return ["--set=cluster.listen=127.0.0.1:%d" % port, "--set=cluster.node_name=" + name,
                "--set=cluster.peers=" + peers, "--set=cluster.secret_file=" + key,
                "--set=cluster.export=" + exp, "--set=cluster.pull_group=" + group]

    a = Daemon(backend=backend, args=args("a", pa, "b=127.0.0.1:%d" % pb, export)).start()
    try:
        b = Daemon(backend=backend, args=args("b", pb, "a=127.0.0.1:%d" % pa, "")).start()
    except BaseException:
        a.stop()
        raise
    return a, b
