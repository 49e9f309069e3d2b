# SPDX-License-Identifier: Apache-2.0
"""ctest python_mypy: mypy on the gshm package and examples/typed_host.py
(must be clean, with pyproject.toml's [tool.mypy]), then on calls that
misuse the API (each must be reported on its line: the hints are real,
not Any).  Exits 77 when this interpreter has no mypy (Debian: apt-get
install mypy)."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)

MISUSE = '''\
import gshm
import gshm.torch
c = gshm.Client()
c.create("x", "1M")                          # line 4: size is an int
s = c.open("x", 2)                           # line 5: access is "r" or "rw"
pid: str = c.status().pid                    # line 6: an int
n: int = c.segments()[0].name                # line 7: a str
gshm.torch.attach(c, 42)                     # line 8: the prefix is a str
c.unlink()                                   # line 9: needs a name
one: int = c.pull("n", "x").bytes            # (fine: one PullResult)
many: int = c.pull("n", "x/", prefix=True)[0].bytes  # (fine: a list of them)
c.pull("n", "x/", prefix=True).bytes         # line 12: a list has no bytes
'''
MISUSE_LINES = {4, 5, 6, 7, 8, 9, 12}


def run_mypy(cache, *args):
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", cache, "--config-file",
           os.path.join(PYTHON_DIR, "pyproject.toml")] + list(args)
    p = subprocess.run(cmd, cwd=PYTHON_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=600)
    return p.returncode, p.stdout


def main():
    try:
        import mypy  # noqa: F401
    except ImportError:
        print("SKIP: %s has no mypy (Debian: apt-get install mypy)" % sys.executable)
        return 77
    failures = 0
    with tempfile.TemporaryDirectory(prefix="gshm-mypy.") as tmp:
        rc, out = run_mypy(os.path.join(tmp, "cache"), "gshm", "examples/typed_host.py")
        print(out, end="")
        if rc != 0:
            print("FAIL: mypy finds errors in the package or the example")
            failures += 1
        bad = os.path.join(tmp, "misuse.py")
        with open(bad, "w") as f:
            f.write(MISUSE)
        rc, out = run_mypy(os.path.join(tmp, "cache"), bad)
        lines = {int(l.split(":")[1]) for l in out.splitlines()
                 if l.startswith(bad + ":") and ": error:" in l}
        if rc == 0 or lines != MISUSE_LINES:
            print(out, end="")
            print("FAIL: mypy reported misuse on lines %s, not %s"
                  % (sorted(lines), sorted(MISUSE_LINES)))
            failures += 1
    print("python_mypy: %d failure(s)" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
