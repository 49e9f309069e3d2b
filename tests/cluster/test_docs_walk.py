# SPDX-License-Identifier: Apache-2.0
"""The docs' walks, run as a new user would type them: README.md's "By
hand" block (a private gshmd: create, list, python -m gshm, stop) and
docs/CLUSTER.md's "Two nodes on one host" (its config, the key, two gshmd,
peers, create, a pull, a pull of all a peer exports, stop), each block's
lines taken from the doc itself and run in one bash, so that a doc whose
commands stop working fails here.  What is changed: /tmp/ becomes a
temporary directory, the cluster ports free ones, `cmake` lines are
skipped (the build is this one), the build tree and `python3` come first
on PATH (the doc's "From a build tree" note), and after a line that
starts a gshmd in the background the walk waits for its socket (a person
types slower than bash).

usage: test_docs_walk.py GSHMD GSHMCTL SRCDIR  (exit 0 ok, 1 failed)"""

import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile


def section(text, heading):
    """The doc text from heading's line to the next heading."""
    i = text.index(heading)
    m = re.search(r"^#{1,4} ", text[i + len(heading):], re.M)
    return text[i:i + len(heading) + (m.start() if m else len(text))]


def commands(sec):
    """The first 4-space-indented block of sec, less comments."""
    lines, started = [], False
    for line in sec.splitlines():
        if line.startswith("    ") and not line.startswith("     "):
            started = True
            lines.append(re.sub(r"\s+#\s.*$", "", line[4:]).rstrip())
        elif started and line.strip():
            break
    return [l for l in lines if l]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def socket_of(line):
    """The socket a gshmd command line listens on: its --socket, else its
    config file's `socket =` (read when the line has run)."""
    words = shlex.split(line.rstrip("& "))
    if "--socket" in words:
        return shlex.quote(words[words.index("--socket") + 1])
    conf = words[words.index("--config") + 1]
    return '"$(sed -n "s/^socket *= *//p" %s)"' % shlex.quote(conf)


def script(lines, tmp, after_mkdir=""):
    """A bash script of lines with a wait for each background gshmd's socket."""
    out = ["set -e", "trap 'j=$(jobs -p); [ -z \"$j\" ] || kill $j 2>/dev/null; true' EXIT",
           "started() { for _ in $(seq 400); do [ -S \"$1\" ] && return 0; sleep 0.05; done; "
           "echo \"no socket $1\" >&2; exit 1; }"]
    for line in lines:
        if line.startswith("cmake "):
            continue
        line = line.replace("/tmp/", tmp + "/")
        out.append("echo '$ '%s" % shlex.quote(line))
        out.append(line)
        if line.endswith("&") and "gshmd" in line:
            out.append("started %s" % socket_of(line.replace("$(id -u)", str(os.getuid()))))
        if line.startswith("mkdir") and after_mkdir:
            out.append(after_mkdir)
        if line.startswith("kill %"):
            # each gshmd stopped: its exit is waited for, and must be 0 (a
            # bare `wait` returns 0 whatever its jobs' statuses were)
            out.append("for p in $(jobs -p); do wait \"$p\" || "
                       "{ echo \"gshmd $p: exit $? at its SIGTERM\" >&2; exit 1; }; done")
    return "\n".join(out) + "\n"


def run(name, text, root, env):
    p = subprocess.run(["bash", "-c", text], cwd=root, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode("utf-8", "replace")
    print("---- %s (exit %d)\n%s" % (name, p.returncode, out))
    return p.returncode, out


def main():
    gshmd, ctl, src = sys.argv[1:4]
    failures = []

    def want(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="gshm-docs-") as tmp:
        # a root like the source tree's: build -> this build, python -> the package
        root = os.path.join(tmp, "root")
        os.makedirs(os.path.join(tmp, "bin"))
        os.makedirs(root)
        os.symlink(os.path.dirname(os.path.dirname(os.path.abspath(gshmd))),
                   os.path.join(root, "build"))
        os.symlink(os.path.join(src, "python"), os.path.join(root, "python"))
        os.symlink(sys.executable, os.path.join(tmp, "bin", "python3"))
        env = dict(os.environ)
        for k in ("GSHM_SOCKET", "GSHM_LIBRARY", "NOTIFY_SOCKET", "PYTHONPATH"):
            env.pop(k, None)
        env["PATH"] = os.pathsep.join([os.path.join(tmp, "bin"),
                                       os.path.dirname(os.path.abspath(gshmd)),
                                       os.path.dirname(os.path.abspath(ctl)), env["PATH"]])

        # README.md: a private gshmd by hand
        readme = open(os.path.join(src, "README.md")).read()
        lines = commands(section(readme, "### By hand"))
        want(any(l.startswith("cmake ") for l in lines), "README: no build line")
        rc, out = run("README.md, By hand", script(lines, tmp), root, env)
        want(rc == 0, "README's walk exited %d" % rc)
        want("created 'demo/x': 1 MiB at host" in out, "README: no 'created' line")
        want(len(re.findall(r"^\d+ +demo/x +1 MiB host .* 0644 live", out, re.M)) == 2,
             "README: gshmctl's and python -m gshm's tables do not both list demo/x")

        # docs/CLUSTER.md: two nodes on one host
        doc = open(os.path.join(src, "docs", "CLUSTER.md")).read()
        sec = section(doc, "### Two nodes on one host")
        ini = re.search(r"```ini\n(.*?)```", sec, re.S).group(1)
        confs = re.findall(r"`(/tmp/\S+\.conf)`", sec)[:2]  # node5's, then node7's
        want(len(confs) == 2, "CLUSTER.md: the two config files are not named")
        # "7 for 5 in socket, listen and node_name"
        ini7 = "\n".join(re.sub(r"5", "7", l) if re.match(r"(socket|listen|node_name)\s*=", l)
                         else l for l in ini.splitlines()) + "\n"
        ports = {"7475": str(free_port()), "7477": str(free_port())}
        write = []
        for path, text in zip(confs, (ini, ini7)):
            for k, v in ports.items():
                text = text.replace(k, v)
            text = text.replace("/tmp/", tmp + "/")
            write.append("cat > %s <<'CONF'\n%sCONF" % (path.replace("/tmp/", tmp + "/"), text))
        lines = commands(sec[sec.index("```ini"):].split("```", 2)[2])
        text = script(lines, tmp, after_mkdir="\n".join(write))
        for k, v in ports.items():
            text = text.replace(k, v)
        rc, out = run("docs/CLUSTER.md, Two nodes on one host", text, root, env)
        want(rc == 0, "CLUSTER.md's walk exited %d" % rc)
        want("configuration ok" in out, "CLUSTER.md: no 'configuration ok'")
        want("pulled node7:llama/x into 'llama/x'" in out, "CLUSTER.md: the pull's line")
        want("pulled 1 segment from node7 (all it exports) as 'n7/'" in out,
             "CLUSTER.md: the pull of all node7 exports")
        want(re.search(r"^\d+ +n7/llama/x .* from node7:llama/x#\d+\.\d+$", out, re.M),
             "CLUSTER.md: segments does not list n7/llama/x from node7")
        # the gshmd's log on the terminal names that pull "every segment", not "under ''"
        want("asks to pull every segment from peer 'node7' as 'n7/'" in out
             and "pulled every segment from peer 'node7' into 'n7/'" in out and "''" not in out,
             "CLUSTER.md: node5's log of the pull of all node7 exports")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
