# SPDX-License-Identifier: Apache-2.0
"""python -m gshm: is gshmd reachable from here, and what does it hold?

The equivalent of `gshmctl status` (and `segments`, `clients`) with only
Python and libgshm, for a quick check inside a container:

    python3 -m gshm                    # status: version, backends, totals
    python3 -m gshm segments           # the segments this user may read
    python3 -m gshm clients            # every client (host pids and uids)
    python3 -m gshm --json status      # gshmctl --json status's document
    python3 -m gshm --socket /run/gshm/gshmd.sock

Exit status as gshmctl's: 0 ok, 1 error, 2 usage, 3 daemon unreachable,
4 permission denied (the socket's mode or group refuses this user).  With
--json an error is gshmctl's one-line JSON error on stderr (README, "The
CLI"): {"schema_version": 1, "error": {"exit_code", "errno", "message"}}."""

from __future__ import annotations

import argparse
import datetime
import errno
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

from ._client import Client
from ._errors import Error, PermissionDenied, Unreachable
from ._info import ClientInfo, SegmentInfo, StatusInfo
from ._lib import GSHM_CREATE_LEGACY_IPC, optional_symbol

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DENIED = 0, 1, 2, 3, 4


def _size(n: int) -> str:
    """1536 -> "1.5 KiB", as gshmctl writes sizes."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, i = float(n), 0
    while v >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    if i == 0:
        return "%d B" % n  # (gshm__format_size; "0 bytes" was what an empty gshmd showed)
    return ("%d %s" if v == int(v) else "%.1f %s") % (v, units[i])


def _when(ns: int) -> str:
    t = datetime.datetime.fromtimestamp(ns // 1_000_000_000, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _s(n: int) -> str:
    """"s" where n things are more (or fewer) than one: "1 client",
    "2 clients", as gshmctl says them (gshm__plural)."""
    return "" if n == 1 else "s"


#: StatusInfo.gpu_fault's start where gshmd's CUDA driver did not start
#: (GSHM_GPU_FAULT_NO_DRIVER, common/util.h)
_NO_DRIVER = "no driver: "


def status_lines(st: StatusInfo) -> List[str]:
    """gshmctl status's lines for st: three, and while the GPUs are
    unusable (st.gpu_fault) the fourth that says so, third."""
    gpus = "GPU" if st.devices == 1 else "GPUs"
    out = ["gshmd %s, pid %d, up since %s" % (st.version, st.pid, _when(st.started_ns)),
           "backends: %s (%d %s)" % (",".join(st.backends), st.devices, gpus)]
    if st.gpu_fault:  # (gshmctl's gpu_fault_what and gpu_fault_why)
        if st.gpu_fault.startswith(_NO_DRIVER):
            what, why = "the CUDA driver did not start with gshmd", st.gpu_fault[len(_NO_DRIVER):]
        else:
            what, why = "a sticky CUDA error at gshmd's start", st.gpu_fault
        out.append("GPUs unusable: %s (%s); device segments are parked (listed, not opened) and "
                   "device creates refused until the GPUs work again and gshmd restarts"
                   % (what, why))
    out.append("%d client%s, %d segment%s (%s), %d lease%s"
               % (st.clients, _s(st.clients), st.segments, _s(st.segments), _size(st.bytes),
                  st.leases, _s(st.leases)))
    return out


def _unprintable(cp: int) -> bool:
    """A C0 or C1 control, or an invisible or bidi format character: the
    code points gshmctl's tables escape (gshm__escape_text)."""
    return (cp < 0x20 or 0x7F <= cp <= 0x9F or cp == 0x061C or 0x200B <= cp <= 0x200F
            or 0x2028 <= cp <= 0x202E or 0x2060 <= cp <= 0x206F or cp == 0xFEFF)


def shown(text: str) -> str:
    """text (a name another user chose: _dec's surrogateescape str) as
    gshmctl's tables show it: '\\' doubled, each byte of an unprintable
    character or of no valid UTF-8 (a lone surrogate here) as "\\xHH", so
    that nothing reaches the terminal raw, and print() never meets a
    surrogate (UnicodeEncodeError)."""
    out = []
    for ch in text:
        cp = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= cp <= 0xDCFF:  # a byte of no valid UTF-8
            out.append("\\x%02X" % (cp - 0xDC00))
        elif 0xD800 <= cp <= 0xDFFF or _unprintable(cp):
            out.extend("\\x%02X" % b for b in ch.encode("utf-8", "surrogatepass"))
        else:
            out.append(ch)
    return "".join(out)


def _json_text(v: Any) -> Any:
    """v with every str in it as gshmctl --json gives a name that is not
    UTF-8: each byte of no valid UTF-8 (_dec's surrogate escape) as U+FFFD.
    json.dumps wrote the escape as a lone surrogate ("\\udc9b"), which
    strict parsers refuse: one user's name broke the whole document."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(v, dict):
        return {_json_text(k): _json_text(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_text(x) for x in v]
    return v


def _age(ns: int) -> str:
    """How long ago ns (ns since the epoch) was, as gshmctl's AGE and SINCE
    columns say it: "42s" under two minutes, "17m" under two hours, "5h"
    under two days, else "3d"."""
    s = max(0, (time.time_ns() - ns) // 1_000_000_000)
    if s < 120:
        return "%ds" % s
    if s < 7200:
        return "%dm" % (s // 60)
    if s < 172800:
        return "%dh" % (s // 3600)
    return "%dd" % (s // 86400)


def segment_lines(segs: Sequence[SegmentInfo]) -> List[str]:
    """gshmctl segments's table (cmd_segments): its columns and widths, AGE
    last and "  from SOURCE" after it for a pulled segment; a name longer
    than its column widens it."""
    w = max([28] + [len(shown(s.name)) for s in segs])
    out = ["%-6s %-*s %10s %-10s %6s %6s %4s %-8s %6s %s"
           % ("ID", w, "NAME", "SIZE", "LOCATION", "UID", "GID", "MODE", "STATE", "LEASES", "AGE")]
    for s in segs:
        loc = "cuda:%d" % s.device_index if s.device_index >= 0 else "host"
        out.append("%-6d %-*s %10s %-10s %6d %6d %04o %-8s %6d %s%s"
                   % (s.id, w, shown(s.name), _size(s.size), loc, s.uid, s.gid, s.mode,
                      "unlinked" if s.unlinked else "live", s.leases, _age(s.created_ns),
                      "  from " + shown(s.source) if s.source else ""))
    return out


def client_lines(clients: Sequence[ClientInfo]) -> List[str]:
    """gshmctl clients's table (cmd_clients): its columns, SINCE included;
    a name longer than its column widens it."""
    w = max([20] + [len(shown(c.name)) for c in clients])
    out = ["%-8s %8s %6s %6s %-*s %-6s %s"
           % ("SESSION", "PID", "UID", "GID", w, "NAME", "SINCE", "LEASES")]
    for c in clients:
        out.append("%-8d %8d %6d %6d %-*s %-6s %d"
                   % (c.session_id, c.pid, c.uid, c.gid, w, shown(c.name), _age(c.since_ns),
                      c.leases))
    return out


#: gshmctl --json's schema_version (client/gshmctl.c SCHEMA_VERSION): the
#: documents below have its keys, in its order, with its value forms
SCHEMA_VERSION = 1


def status_json(st: StatusInfo) -> Dict[str, Any]:
    """gshmctl --json status's document for st."""
    return {"schema_version": SCHEMA_VERSION, "version": st.version, "pid": st.pid,
            "started": _when(st.started_ns), "clients": st.clients, "segments": st.segments,
            "leases": st.leases, "bytes": st.bytes, "devices": st.devices,
            "backends": ",".join(st.backends), "gpu_fault": st.gpu_fault or None}


def segment_json(s: SegmentInfo) -> Dict[str, Any]:
    """One segment of gshmctl --json segments: mode as octal text ("0640"),
    state "live" or "unlinked", device null for a host segment."""
    return {"name": s.name, "id": s.id, "generation": s.generation, "size": s.size,
            "requested_size": s.requested_size, "location": s.location,
            "device": None if s.device_index < 0 else s.device_index, "uid": s.uid,
            "gid": s.gid, "mode": "%04o" % s.mode, "state": "unlinked" if s.unlinked else "live",
            "leases": s.leases, "legacy_ipc": bool(s.flags & GSHM_CREATE_LEGACY_IPC),
            "created": _when(s.created_ns), "source": s.source or None}


def client_json(c: ClientInfo) -> Dict[str, Any]:
    """One client of gshmctl --json clients."""
    return {"session_id": c.session_id, "pid": c.pid, "uid": c.uid, "gid": c.gid,
            "name": c.name, "since": _when(c.since_ns), "leases": c.leases}


VERBS: Dict[str, Callable[[Client, bool], Any]] = {
    "status": lambda c, js: status_json(c.status()) if js else status_lines(c.status()),
    "segments": lambda c, js: ({"schema_version": SCHEMA_VERSION,
                                "segments": [segment_json(s) for s in c.segments()]} if js
                               else segment_lines(c.segments())),
    "clients": lambda c, js: ({"schema_version": SCHEMA_VERSION,
                               "clients": [client_json(s) for s in c.clients()]} if js
                              else client_lines(c.clients())),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors, with --json, are gshmctl's
    JSON error (exit 2, "EINVAL") rather than its text."""
    json_errors = False

    def error(self, message: str) -> NoReturn:
        if not self.json_errors:
            super().error(message)
        sys.exit(_report(True, EXIT_USAGE, errno.EINVAL, message))


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = _Parser(prog="python -m gshm", description="gshmd's state from Python (as gshmctl).")
    p.add_argument("verb", nargs="?", default="status", choices=sorted(VERBS))
    p.add_argument("-s", "--socket", default=None,
                   help="gshmd's socket (default $GSHM_SOCKET, else /run/gshm/gshmd.sock)")
    p.add_argument("-j", "--json", action="store_true",
                   help="gshmctl --json's document; an error as its JSON error on stderr")
    words = list(sys.argv[1:] if argv is None else argv)
    opts = words[:words.index("--")] if "--" in words else words
    # (argparse, as gshmctl's getopt_long, takes "--js" for --json)
    p.json_errors = any(w == "-j" or (len(w) > 2 and "--json".startswith(w)) for w in opts)
    args = p.parse_args(words)
    try:
        with Client(args.socket, name="python -m gshm") as c:
            result = VERBS[args.verb](c, args.json)
    # (the socket path is the user's own argument, a message may quote a
    # name: escaped as gshmctl's errors are, so that an ESC or a bidi
    # control in them does not reach the terminal raw)
    except Unreachable as e:
        return _report(args.json, EXIT_UNREACHABLE, e.errno, _unreached(e))
    except PermissionDenied as e:
        if e.function == "gshm_connect":
            return _report(args.json, EXIT_DENIED, e.errno, _unreached(e))
        return _report(args.json, EXIT_DENIED, e.errno, "%s (%s)" % (e.strerror, e.filename))
    except Error as e:
        return _report(args.json, EXIT_ERROR, e.errno, str(e))
    except ImportError as e:  # libgshm not found: what to do, not a traceback
        return _report(args.json, EXIT_ERROR, 0, str(e), prefix="")
    if args.json:
        text = json.dumps(_json_text(result), indent=2)
    else:
        text = "\n".join(result)
    return _write_output(text, args.json)


def _unreached(e: Error) -> str:
    """gshmctl's words for a daemon not reached at e.filename: "cannot
    reach gshmd at PATH: " and libgshm's explanation (gshm_connect's,
    without its function name), or e's description for a daemon lost
    after the connect."""
    why = e.gshm_message if e.function == "gshm_connect" and e.gshm_message else e.strerror
    return "cannot reach gshmd at %s: %s" % (e.filename, why)


def errno_name(err: int) -> Optional[str]:
    """The "errno" of gshmctl's JSON error for err (a positive errno):
    libgshm's name for it ("ENOTSUP", never "EOPNOTSUPP"), Python's for
    one that libgshm does not return itself, None for 0 or an unknown
    one, or where libgshm cannot be loaded and Python knows none."""
    if not err:
        return None
    try:
        fn = optional_symbol("gshm_err_name")
        name = fn(-err).decode() if fn is not None else "E?"
    except (ImportError, OSError):
        name = "E?"
    return name if name != "E?" else errno.errorcode.get(err)


def _report(js: bool, code: int, err: Optional[int], message: str, prefix: str = "gshm: ") -> int:
    """Says an error on stderr and returns code (the exit status): with js,
    gshmctl --json's one-line JSON error, {"schema_version": 1, "error":
    {"exit_code", "errno" (errno_name(err)), "message"}} (README, "The
    CLI"); else prefix and message, escaped as gshmctl's errors are."""
    if js:
        doc = {"schema_version": SCHEMA_VERSION,
               "error": {"exit_code": code, "errno": errno_name(err or 0), "message": message}}
        print(json.dumps(_json_text(doc), separators=(",", ":")), file=sys.stderr)
    else:
        print(shown(prefix + message), file=sys.stderr)
    return code


def _write_output(text: str, js: bool) -> int:
    """Prints text on stdout; EXIT_OK, or EXIT_ERROR where it could not be
    written, as gshmctl: a full disk said once on stderr (with js, as a
    JSON error), a reader that
    went away (`| head`) quietly.  Either was a traceback, and another
    one from the interpreter's own flush at exit."""
    try:
        print(text)
        sys.stdout.flush()
        return EXIT_OK
    except OSError as e:
        # (the interpreter flushes stdout again at exit: give it nowhere
        # to fail, dup'ed over the fd, as Python's documentation advises)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        if not isinstance(e, BrokenPipeError):
            return _report(js, EXIT_ERROR, e.errno, "writing output: %s" % (e.strerror or e))
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
