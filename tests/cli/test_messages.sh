#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# What a new user reads: one version everywhere, gshmctl's messages and
# exit codes (what to do when gshmd cannot be reached), --json errors as
# a JSON object on stderr, one line (or one JSON document) on every verb's
# success, share_weights.py --help without torch, and gshmd's fd-limit
# message only where it means something.
#   test_messages.sh GSHMD GSHMCTL VERSION PYTHON SOURCE_DIR BENCH
set -u
gshmd=$1 ctl=$2 version=$3 py=$4 src=$5 bench=$6
. "$(dirname "$0")/lib.sh"
json() { "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$dir/$1" \
           || fail "$1 is not JSON with $2: $(cat "$dir/$1")"; }

# documented VERB FILE MODE: the keys README's --json table gives VERB (its
# row's backquoted words outside parentheses) against the keys of the JSON
# document in $dir/FILE at any depth, schema_version aside: MODE eq, the
# same; sub, each of the document's documented (a verb whose lists were
# empty here)
documented() {
  "$py" - "$src/README.md" "$1" "$dir/$2" "$3" <<'PY' || fail "README's --json keys of '$1' vs $(cat "$dir/$2")"
import json, re, sys
readme, verb, path, mode = sys.argv[1:]
text = open(readme, encoding="utf-8").read()
table = text[text.index("<!-- json-keys"):].split("\n\n")[0]
row = next(l for l in table.splitlines()
           if l.startswith("| ") and re.match(r"`%s`($|,)" % re.escape(verb), l.split("|")[1].strip()))
doc = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^()]*\)", "", row.split("|")[2])))
got = set()
def walk(v):
    if isinstance(v, dict):
        got.update(k for k in v if k != "schema_version")
        for x in v.values(): walk(x)
    elif isinstance(v, list):
        for x in v: walk(x)
walk(json.load(open(path)))
ok = got == doc if mode == "eq" else got <= doc
if not ok:
    print("documented, not in the output:", sorted(doc - got), "in the output, not documented:",
          sorted(got - doc))
sys.exit(0 if ok else 1)
PY
}
# columns VERB: the columns README's CLI table gives VERB (its row's list
# after "every ...:", up to a ';') against the headings of the table
# `gshmctl VERB` prints, in order
columns() {
  "$ctl" "$1" >"$dir/cols" 2>&1 || fail "gshmctl $1: $(cat "$dir/cols")"
  "$py" - "$src/README.md" "$1" "$dir/cols" <<'PY' || fail "README's columns of '$1' vs $(head -1 "$dir/cols")"
import sys
readme, verb, path = sys.argv[1:]
text = open(readme, encoding="utf-8").read()
table = text[text.index("\n| verb | what |"):].split("\n\n")[0]
row = next(l for l in table.splitlines() if l.startswith("| `%s` |" % verb))
doc = row.split("|")[2].split(":", 1)[1].split(";")[0].strip().split(", ")
got = [w.lower() for w in open(path, encoding="utf-8").readline().split()]
if doc != got:
    print("README:", doc, "gshmctl:", got)
sys.exit(0 if doc == got else 1)
PY
}
# aligned FILE COLUMN: in the table of $dir/FILE (from the line whose
# words include COLUMN to the next empty line), every row's field of the
# left-aligned COLUMN starts where its heading does, in characters
aligned() {
  "$py" - "$dir/$1" "$2" <<'PY' || fail "column $2 of $1 is not aligned: $(cat "$dir/$1")"
import sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
at = next(i for i, l in enumerate(lines) if sys.argv[2] in l.split())
off = lines[at].index(sys.argv[2])
rows = [l for l in lines[at + 1:] if l]
rows = rows[:next((i for i, l in enumerate(lines[at + 1:]) if not l), len(rows))]
assert rows and all(r[off - 1] == " " and r[off] != " " for r in rows), rows
PY
}

# item 5: one version
[ "$("$ctl" -V)" = "gshmctl $version" ] || fail "gshmctl -V: $("$ctl" -V)"
[ "$("$gshmd" -V)" = "gshmd $version" ] || fail "gshmd -V: $("$gshmd" -V)"
[ "$("$bench" --version)" = "gshm-bench $version" ] || fail "gshm-bench --version: $("$bench" --version 2>&1)"
pyv=$(PYTHONPATH=$src/python "$py" -c 'import gshm; print(gshm.__version__)')
[ "$pyv" = "$version" ] || fail "python gshm.__version__ $pyv, want $version"

# item 6: messages, exit codes, sizes
run 2 create x -5
has err "gshmctl: create:"
has err "'-5'"
run 2 create x 0
has err "at least 1 byte"
# the usage line names every option --help does
run 2 create x
has err "usage: create NAME SIZE [--location LOC] [--mode MODE] [--legacy-ipc]"
# a negative size after the name blames the size, not the name
run 2 create s/f -4K
has err "'-4K'"
grep -qF "'s/f'" "$dir/err" && fail "create s/f -4K blames the name: $(cat "$dir/err")"
run 2 create x 4K -q
has err "create: unknown option '-q'"
# a location that is none: a usage error (exit 2) before gshmd is asked,
# naming the value and what is accepted (pull exited 1 with gshmd's
# answer, whatever it was)
for verb in "create x 4K" "pull p:x" "pull p:x/ --prefix"; do
  run 2 $verb --location gpu0
  has err "${verb%% *}: --location 'gpu0' is not a location: write host, cuda:N"
  has err "cuda:GPU-<uuid>"
done
# a name past GSHM_NAME_MAX: the limit, as gshmd says it for its own
long=$(printf 'n%.0s' $(seq 300))
run 1 create "$long" 4K
has err "create: name too long: name is longer than 255 bytes"
run 1 unlink "$long"
has err "longer than 255 bytes"
# "--" ends the options: a segment named like one can be made and
# handled (before, "--help" gave unlink's usage and "--id" revoke's)
for n in --help --id -j; do
  run 0 create -- "$n" 4K
  run 0 chmod -- "$n" 0600
  run 0 chown -- "$n" 0
  [ "$n" = --id ] && run 0 revoke -- "$n" || run 0 unlink -- "$n"
  has out "'$n'"
done
run 0 create -- -x 4K
run 0 --json unlink -- -x
json out "d['name'] == '-x'"
# a name of multibyte UTF-8 characters fills its column as an ASCII one
# of as many characters does: the SIZE column starts at one place (it
# started 3 bytes early for 'café/ü/é')
run 0 create "caf$(printf '\xc3\xa9')/$(printf '\xc3\xbc')/$(printf '\xc3\xa9')" 4K
run 0 create "cafe/u/e" 4K
run 0 segments
a=$(grep -F "cafe/u/e" "$dir/out" | sed 's/4.0 KiB.*//' | LC_ALL=C.UTF-8 wc -m)
u=$(grep -F "caf$(printf '\xc3\xa9')/" "$dir/out" | sed 's/4.0 KiB.*//' | LC_ALL=C.UTF-8 wc -m)
[ -n "$a" ] && [ "$a" = "$u" ] || fail "segments: the SIZE column after a UTF-8 name at $u characters, after ASCII at $a: $(cat "$dir/out")"
# a name longer than the NAME column widens it for every row: the
# columns after it stay in line (a 60-byte name pushed its row's over)
run 0 create "$(printf 'w%.0s' $(seq 60))/$(printf '\xc3\xa9')" 4K
run 0 segments
aligned out LOCATION
aligned out STATE
run 0 unlink "$(printf 'w%.0s' $(seq 60))/$(printf '\xc3\xa9')"
run 0 unlink "caf$(printf '\xc3\xa9')/$(printf '\xc3\xbc')/$(printf '\xc3\xa9')"
run 0 unlink "cafe/u/e"
# read's and write's sizes name the verb, and a negative one as such
run 2 read x --offset -1
has err "gshmctl: read: offset '-1': cannot be negative"
run 2 write x --offset=-4K
has err "gshmctl: write: offset '-4K': cannot be negative"
run 2 read x --length 1Q
has err "gshmctl: read: length '1Q': not a size"
run 0 create k4 4KB
has out "4 KiB"
# a name that exists: what to do, not only that it does
run 1 create k4 4K
has err "create: segment exists: segment 'k4' exists (choose another name, or gshmctl unlink it first"
run 0 create k4i 4KiB
has out "4 KiB"
run 0 create k4k 4k
head -c 100 /dev/zero >"$dir/in100"
run 1 write k4 --offset 4090 -i "$dir/in100"
has err "100 bytes"
has err "4096 bytes, 6 of them from offset 4090"
run 2 --frobnicate status
has err "gshmctl: unknown option '--frobnicate'"

# item 6: no "<6>" syslog prefix when stderr is a terminal (script gives one)
if command -v script >/dev/null; then
  # (killed once it answers, not after a fixed 0.5 s: under ASan on a
  # busy 2-CPU CI machine gshmd had not logged "listening" by then)
  script -qec "'$gshmd' --socket '$dir/t' --log-level 6 & p=\$!
    for i in \$(seq 200); do '$ctl' --socket '$dir/t' status >/dev/null 2>&1 && break; sleep 0.05; done
    kill \$p; wait \$p" /dev/null >"$dir/tty" 2>&1
  grep -q "gshmd: listening" "$dir/tty" || fail "no log line on the terminal: $(cat "$dir/tty")"
  grep -q "<6>" "$dir/tty" && fail "the <6> prefix reached a terminal: $(cat "$dir/tty")"
  # and without a GPU (backend auto), gshmd says what is missing, not an errno
  grep -q "device segments unavailable (No such file" "$dir/tty" && fail "$(cat "$dir/tty")"
fi

# read to a terminal: a segment's raw bytes (another user's, perhaps)
# could rewrite what the terminal shows, as a raw name could: refused
# without -o; "-o -" writes them there anyway
if command -v script >/dev/null; then
  run 0 create tty/seg 4K
  printf 'ab\033[2Jcd' >"$dir/esc.bin"
  run 0 write tty/seg -i "$dir/esc.bin"
  script -qec "'$ctl' read tty/seg --length 8; echo rc=\$?" /dev/null >"$dir/tty" 2>&1
  grep -q "rc=2" "$dir/tty" || fail "read to a terminal: not exit 2: $(od -c "$dir/tty" | head -5)"
  grep -qF "give -o FILE" "$dir/tty" || fail "read to a terminal: no hint: $(od -c "$dir/tty" | head -5)"
  grep -qF "$(printf '\033[2J')" "$dir/tty" && fail "read wrote an escape sequence to a terminal"
  script -qec "'$ctl' read tty/seg --length 8 -o -" /dev/null >"$dir/tty" 2>&1
  grep -qF "$(printf 'ab\033[2Jcd')" "$dir/tty" || fail "read -o - to a terminal: $(od -c "$dir/tty" | head -5)"
  (cd "$dir" && "$ctl" read tty/seg --length 8 -o - >"$dir/out") || fail "read -o - to a file: failed"
  cmp -s "$dir/out" "$dir/esc.bin" || fail "read -o - to a file: $(od -c "$dir/out" | head -3)"
  [ -e "$dir/-" ] && fail "read -o - made a file named '-'"
  usage_json_early() { run 2 --json "$@"; json err "d['error']['exit_code'] == 2"; }
  usage_json_early read tty/seg -o -
  run 0 unlink tty/seg
fi

# item 7: the same success shape for every verb, JSON errors
run 0 write k4 -i "$dir/in100"
has out "wrote 100 bytes to 'k4' at offset 0"
# read to a file says so too (to stdout its bytes are all it prints)
run 0 read k4 --offset 4 --length 10 -o "$dir/k4.out"
has out "read 10 bytes of 'k4' at offset 4 to $dir/k4.out"
[ "$(stat -c %s "$dir/k4.out")" = 10 ] || fail "read -o wrote $(stat -c %s "$dir/k4.out") bytes"
run 0 chmod k4 0640
has out "changed the mode of 'k4' to 0640"
run 0 unlink k4i
has out "unlinked 'k4i'"
# chown says what it changed; ':' changes nothing and is refused, not 'ok'
run 2 chown k4 :
has err "chown: ':' names no user and no group"
run 0 chown k4 ":$(id -gn)"
has out "changed the group of 'k4' to $(id -gn)"
run 0 chown k4 "$(id -un):"
has out "changed the owner of 'k4' to $(id -un)"
run 0 --json chmod k4 0600
json out "d['schema_version'] == 1 and d['name'] == 'k4' and d['mode'] == '0600'"
run 0 --json write k4 -i "$dir/in100"
json out "d['name'] == 'k4' and d['bytes'] == 100"
run 0 --json unlink k4k
json out "d['name'] == 'k4k'"
run 5 --json unlink no-such
json err "d['schema_version'] == 1 and d['error']['exit_code'] == 5 and d['error']['errno'] == 'ENOENT' and 'unlink' in d['error']['message']"
# a name no segment can have is a bad argument (exit 1, EINVAL), for every
# verb as for create; unlink, chmod, chown and revoke said "not found"
run 1 --json unlink a//b
json err "d['error']['exit_code'] == 1 and d['error']['errno'] == 'EINVAL' and 'bad name' in d['error']['message']"
for v in "chmod|../x|0600" "chown|x/./y|0" "revoke|/abs" "read|a/"; do
  IFS='|' read -r -a a <<<"$v"
  run 1 "${a[@]}"
  has err "bad name"
done
[ -s "$dir/out" ] && fail "a --json error wrote to stdout: $(cat "$dir/out")"
run 2 --json create x 12Q
json err "d['error']['exit_code'] == 2 and d['error']['errno'] == 'EINVAL' and 'not a size' in d['error']['message']"
GSHM_SOCKET=$dir/nothing-here run 3 --json status
json err "d['error']['exit_code'] == 3 and d['error']['errno'] is not None"
# gshmd unreachable: what happened and what to do, for each way it fails
GSHM_SOCKET=$dir/nothing-here run 3 status
has err "cannot reach gshmd at $dir/nothing-here: no socket there"
has err "is gshmd running?"
has err "gshmctl --socket PATH"
has err "or \$GSHM_SOCKET"
"$py" -c 'import socket,sys; socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).bind(sys.argv[1])' "$dir/stale"
GSHM_SOCKET=$dir/stale run 3 status
has err "nothing listens on that socket"
has err "start gshmd"
GSHM_SOCKET=$dir/in100 run 3 status
has err "$dir/in100 is not a socket"
# another program's socket, a stream or a datagram one: not gshmd's, said
# so (it was "unknown error")
# hold_socket TYPE PATH: another program's socket of TYPE (SOCK_STREAM,
# listening, or SOCK_DGRAM) bound at PATH, held open by process $held
hold_socket() {
  rm -f "$2" "$2.out"
  "$py" -c "import socket,sys,time; s=socket.socket(socket.AF_UNIX, socket.$1); s.bind(sys.argv[1])
if s.type == socket.SOCK_STREAM: s.listen()
print(flush=True); time.sleep(30)" "$2" >"$2.out" &
  held=$!
  for _ in $(seq 200); do [ -s "$2.out" ] && break; sleep 0.05; done
}
for type in SOCK_STREAM SOCK_DGRAM; do
  hold_socket $type "$dir/other"
  GSHM_SOCKET=$dir/other run 3 status
  has err "$dir/other is a stream or datagram socket, not gshmd's"
  grep -qF "unknown error" "$dir/err" && fail "a $type socket: $(cat "$dir/err")"
  kill $held; wait $held 2>/dev/null
done
# a stopped gshmd (SIGSTOP, a debugger) does not hold gshmctl for ever: the
# hello gives up after $GSHM_HELLO_TIMEOUT_MS and says what to look at
kill -STOP $pid
start=$(date +%s%N)
GSHM_HELLO_TIMEOUT_MS=300 timeout 20 "$ctl" status >"$dir/out" 2>"$dir/err"
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
kill -CONT $pid
[ $rc = 3 ] || fail "status to a stopped gshmd: exit $rc, want 3 ($(cat "$dir/err"))"
has err "gshmd did not answer within \$GSHM_HELLO_TIMEOUT_MS"
[ $ms -lt 10000 ] || fail "status to a stopped gshmd took $ms ms with a 300 ms hello timeout"
run 0 status
# a path longer than sun_path: not a bare "name too long" (a segment's?)
GSHM_SOCKET=$dir/$(printf 'z%.0s' $(seq 120))/s run 3 status
has err "longer than a Unix socket's address takes (107)"
# a user the socket does not let in: the socket's owner, group and mode,
# and who can change that
if [ "$(id -u)" = 0 ]; then
  as_other() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
  chmod 0700 "$dir"
  as_other "$ctl" -s "$dir/s" status >"$dir/out" 2>"$dir/err"
  [ $? = 4 ] || fail "status as uid 65534 through a 0700 directory: not exit 4"
  has err "a directory above it does not let uid 65534 through"
  chmod 0711 "$dir"
  as_other "$ctl" -s "$dir/s" status >"$dir/out" 2>"$dir/err"
  [ $? = 4 ] || fail "status as uid 65534: not exit 4"
  has err "permission denied: the socket (owner $(id -un), group $(id -gn), mode 0660) does not let uid 65534 connect"
  has err "daemon.socket_group"
  # let uid 65534 in: a segment it may not see is refused with what that
  # means and who can change it
  chmod 0666 "$dir/s"
  run 0 create hidden 4K
  as_other "$ctl" -s "$dir/s" read hidden -o /dev/null >"$dir/out" 2>"$dir/err"
  [ $? = 4 ] || fail "read of a 0600 segment as uid 65534: not exit 4"
  has err "read: permission denied: uid 65534 may not see a segment of that name"
  has err "its owner or an admin can open it to this user (gshmctl chmod, chown)"
  as_other "$ctl" -s "$dir/s" unlink hidden >"$dir/out" 2>"$dir/err"
  [ $? = 4 ] || fail "unlink of a 0600 segment as uid 65534: not exit 4"
  has err "only its owner or an admin may change it"
  # admin-only verbs say which setting makes an admin
  as_other "$ctl" -s "$dir/s" revoke hidden >"$dir/out" 2>"$dir/err"
  [ $? = 4 ] || fail "revoke as uid 65534: not exit 4"
  has err "root or a member of daemon.admin_group"
  run 0 unlink hidden
  # one it may see (0644) but not write nor change: who can, as for one it
  # may not see (gshmd's words alone: "refuses read-write access to uid
  # 65534", "belongs to uid 0")
  run 0 create seen 4K --mode 0644
  for verb in "write seen" "unlink seen" "chmod seen 0666"; do
    as_other "$ctl" -s "$dir/s" $verb </dev/null >"$dir/out" 2>"$dir/err"
    [ $? = 4 ] || fail "$verb of a 0644 segment as uid 65534: not exit 4"
  done
  as_other "$ctl" -s "$dir/s" write seen </dev/null >"$dir/out" 2>"$dir/err"
  has err "refuses read-write access to uid 65534 (its owner or an admin can open it to this user: gshmctl chmod, chown)"
  for verb in "unlink seen" "chmod seen 0666"; do
    as_other "$ctl" -s "$dir/s" $verb >"$dir/out" 2>"$dir/err"
    has err "belongs to uid 0 (only its owner or an admin may)"
  done
  run 0 unlink seen
  chmod 0660 "$dir/s"
  chmod 0700 "$dir"
else
  chmod 0000 "$dir/s"
  run 4 status
  has err "mode 0000) does not let uid $(id -u) connect"
  chmod 0660 "$dir/s"
fi
# gshmd as a user who may not make its socket (the default /run/gshm, as a
# non-root user): what to do, not just "Permission denied"
mkdir "$dir/ro"
chmod 0555 "$dir/ro"
as_daemon=()
if [ "$(id -u)" = 0 ]; then
  as_daemon=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  chmod 0711 "$dir"
fi
for sock in "$dir/ro/sub/s" "$dir/ro/s"; do
  timeout 10 "${as_daemon[@]}" "$gshmd" --backend host --socket "$sock" --log-level 3 2>"$dir/perm.log"
  [ $? = 1 ] || fail "gshmd on $sock it may not make: not exit 1 ($(cat "$dir/perm.log"))"
  grep -qF "give it a socket path this user may create: --socket PATH" "$dir/perm.log" \
    || fail "gshmd on $sock: no hint: $(cat "$dir/perm.log")"
done
grep -qF "bind $dir/ro/s:" "$dir/perm.log" || fail "bind names a temporary path: $(cat "$dir/perm.log")"
# ... or cannot, its directory's parent missing: that it makes one
# directory, not its parents (it said "No such file or directory" alone)
timeout 10 "$gshmd" --backend host --socket "$dir/none/sub/s" --log-level 3 2>"$dir/perm.log"
[ $? = 1 ] || fail "gshmd under a missing directory: not exit 1 ($(cat "$dir/perm.log"))"
grep -qF "mkdir $dir/none/sub: No such file or directory (gshmd makes the socket's directory, not its parents: make them first" \
  "$dir/perm.log" || fail "gshmd under a missing directory: no hint: $(cat "$dir/perm.log")"
# gshmd given the path of another program's open socket (a stream or
# datagram one: a typo for docker.sock, say) leaves it alone and exits 1;
# it took it for a stale gshmd socket, replaced it and unlinked it at exit.
# Once that program is gone, the socket is stale and gshmd takes the path.
for type in SOCK_STREAM SOCK_DGRAM; do
  hold_socket $type "$dir/theirs"
  ino=$(stat -c %i "$dir/theirs")
  timeout 10 "$gshmd" --backend host --socket "$dir/theirs" --log-level 3 2>"$dir/theirs.log"
  rc=$?
  [ $rc = 1 ] || fail "gshmd on another program's $type socket: exit $rc, want 1"
  grep -qF "$dir/theirs is another program's socket" "$dir/theirs.log" \
    || fail "gshmd on a $type socket: $(cat "$dir/theirs.log")"
  [ "$(stat -c %i "$dir/theirs" 2>/dev/null)" = "$ino" ] || fail "gshmd replaced another program's $type socket"
  kill $held; wait $held 2>/dev/null
done
"$gshmd" --backend host --socket "$dir/theirs" --log-level 3 2>"$dir/theirs.log" &
theirs=$!
for _ in $(seq 200); do [ "$(stat -c %i "$dir/theirs" 2>/dev/null)" != "$ino" ] && break; sleep 0.05; done
GSHM_SOCKET=$dir/theirs run 0 status
kill $theirs; wait $theirs 2>/dev/null
[ "$(id -u)" = 0 ] && chmod 0700 "$dir"
# every usage error is the same JSON object with --json (stdout empty)
usage_json() {
  run 2 --json "$@"
  json err "d['schema_version'] == 1 and d['error']['exit_code'] == 2 and d['error']['errno'] == 'EINVAL'"
  [ -s "$dir/out" ] && fail "gshmctl --json $*: usage text on stdout: $(cat "$dir/out")"
}
usage_json
has err "no verb"
usage_json -s
has err "option '-s' needs a value"
usage_json create x 4K --location
has err "create: option '--location' needs a value"
usage_json read k4 -o
has err "read: option '-o' needs a value"
usage_json create x 4K --frob
has err "create: unknown option '--frob'"
usage_json segments extra
# an empty peer is a usage error, not a request to gshmd
usage_json segments --peer=
usage_json segments --peer ""
usage_json pull no-colon
usage_json pull a:b --frob
# a name ending in '/' is a set: without --prefix, say so (before connecting)
run 2 pull node7:llama/
has err "pull: 'llama/' ends in '/': to pull every segment under it, add --prefix"
# and its local prefix needs the '/' too ("v2" + "seg-1" is "v2seg-1")
usage_json pull node7:llama/ --prefix --as v2
has err "write --as 'v2/'"
# segments --peer takes one peer: a list is a usage error (it was "no
# such peer in cluster.peers", exit 5, every peer of it known)
usage_json segments --peer node7,node8
has err "segments --peer 'node7,node8': one peer at a time (a list PEER1,PEER2 is for pull --prefix)"
# and one segment's --as is a name, which cannot end in '/' (gshmd refused
# it after connecting: "the local name 'v2/' is not a name")
usage_json pull node7:llama/x --as v2/
has err "--as 'v2/' ends in '/', and a name cannot: for one segment --as is its local name (write --as 'v2/x')"
usage_json frobnicate
usage_json status --socket
has err "option '--socket' needs a value"
# an empty --socket (an unset variable in a script) is not the default
# socket, whose gshmd the script did not mean to change; an empty --as
# is not the peer's own name (with --replace: the local segment of it)
for args in "-s '' status" "--socket= status" "status -s ''" "status --socket="; do
  eval "usage_json $args"
  has err "option '--socket' needs a path, not ''"
done
usage_json pull node7:x --as "" --replace
has err "pull: --as needs a local name, not ''"
# the listing verbs take no arguments: a typo is not silently ignored
usage_json status x
has err "status: unexpected argument 'x'"
run 2 mappings --frob
has err "gshmctl: mappings: unknown option '--frob'"
usage_json clients --frob
# revoke's every usage error names both forms; an id no segment has is
# "not found" (exit 5), as a name no segment has is
usage_json revoke
has err "usage: revoke NAME | revoke --id ID"
usage_json revoke k4 --id 1
has err "usage: revoke NAME | revoke --id ID"
run 5 revoke --id 999999
has err "no segment has id 999999"
# --id=ID as getopt's verbs take --opt=VALUE (it was a revoke of a segment
# named '--id=ID', "not found" for an id that has one), and a word that
# starts with '-' in NAME's place is an option these verbs do not take,
# not a name (unlink --bogus said "no segment named '--bogus'")
run 0 create byid 4K
id=$("$ctl" --json segments | "$py" -c 'import json,sys
print(next(s["id"] for s in json.load(sys.stdin)["segments"] if s["name"] == "byid"))')
run 0 revoke --id="$id"
has out "revoked segment id $id"
for verb in "unlink --bogus" "chmod -x 0600" "chown --frob 0" "revoke --bogus"; do
  run 2 $verb
  has err "${verb%% *}: unknown option '$(echo "$verb" | cut -d' ' -f2)'"
  has err "goes after '--'"
done
# --json: each verb's document has the keys README's table gives it
run 0 --json create jk 4K
documented create out eq
head -c 10 /dev/zero >"$dir/in10"
run 0 --json write jk -i "$dir/in10"
documented write out eq
run 0 --json read jk -o "$dir/jk.out"
documented read out eq
run 0 --json chmod jk 0640
documented chmod out eq
run 0 --json chown jk 0:0
documented chown out eq
for verb in status segments clients metrics; do
  run 0 --json $verb
  documented $verb out eq
done
# and the table's columns, those README's CLI table lists
columns segments
columns clients
columns mappings
run 0 --json devices
documented devices out sub
sleep 3 | "$ctl" write jk >/dev/null 2>&1 & # (a lease, mapped, while it reads its input)
holder=$!
for _ in $(seq 60); do
  run 0 --json mappings
  grep -qF '"segment": "jk"' "$dir/out" && break
  sleep 0.05
done
documented mappings out eq
wait $holder
run 0 --json unlink jk
documented unlink out eq
run 5 --json revoke --id 999999
json err "d['error']['exit_code'] == 5"
# VERB --help (and help VERB): that verb's usage on stdout, exit 0, no
# gshmd needed; not "unknown option '--help'"
GSHM_SOCKET=$dir/nothing-here run 0 create --help
has out "create NAME SIZE [--location LOC] [--mode MODE]"
grep -qF "unlink NAME" "$dir/out" && fail "create --help shows other verbs: $(cat "$dir/out")"
GSHM_SOCKET=$dir/nothing-here run 0 segments -h
has out "segments --peer PEER"
GSHM_SOCKET=$dir/nothing-here run 0 help pull
has out "pull PEER:NAME [--as LOCAL] [--prefix]"
# each option's default and meaning, as create's has them
has out "LOC default: host for a host segment,"
has out "cuda:0 for a device one"
has out "MODE octal,"
# an empty NAME with --prefix pulls all the peer exports: said (it was not)
has out "(PEER: --prefix, an empty NAME: all it exports)"
GSHM_SOCKET=$dir/nothing-here run 0 create --help
has out "--legacy-ipc: also export"
run 2 help nope
has err "unknown verb 'nope'"
# a pull without its peer says what is missing (it printed the usage alone)
run 2 pull llama/ --prefix
has err "'llama/' names no peer: write PEER:NAME"
# and one without its name, what to write (it printed the usage alone)
run 2 pull node7:
has err "pull: 'node7:' names no segment: write PEER:NAME (gshmctl segments --peer node7"
has err "or add --prefix to pull every segment it exports"
# --json read has no form for raw bytes: refused without -o, a summary with
run 0 create jr 4K
usage_json read jr
has err "-o FILE"
run 0 --json read jr -o "$dir/jr.bin"
json out "d['schema_version'] == 1 and d['name'] == 'jr' and d['bytes'] == 4096 and d['file'].endswith('jr.bin')"
[ "$(stat -c %s "$dir/jr.bin")" = 4096 ] || fail "--json read -o wrote $(stat -c %s "$dir/jr.bin") bytes"
# the errno's name is libgshm's: ENOTSUP (the same value as EOPNOTSUPP)
run 1 --json create g 4K --location cuda:0
json err "d['error']['errno'] == 'ENOTSUP'"

# a peer that is down: 'segments --peer' blames the peer, not the local
# gshmd (the errno's own text, "connection to gshmd reset", did)
head -c 32 /dev/urandom | base64 >"$dir/key"
chmod 0600 "$dir/key"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
oport=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# a peer with another key ("other")
head -c 32 /dev/urandom | base64 >"$dir/okey"
chmod 0600 "$dir/okey"
"$gshmd" --backend host --socket "$dir/o" --log-level 3 --set "cluster.listen=127.0.0.1:$oport" \
  --set "cluster.secret_file=$dir/okey" --set cluster.node_name=other \
  --set "cluster.peers=c=127.0.0.1:$port" 2>"$dir/gshmd-o.log" &
opid=$!
"$gshmd" --backend host --socket "$dir/c" --log-level 3 --set "cluster.listen=127.0.0.1:$port" \
  --set "cluster.secret_file=$dir/key" --set cluster.node_name=c --set cluster.peers=gone=127.0.0.1:1,a-peer-named-past-its-column=[0000:0000:0000:0000:0000:ffff:127.0.0.1]:1,other=127.0.0.1:$oport 2>"$dir/gshmd-c.log" &
cpid=$!
for _ in $(seq 200); do [ -S "$dir/c" ] && [ -S "$dir/o" ] && break; sleep 0.05; done
GSHM_SOCKET=$dir/c run 1 segments --peer gone
has err "segments --peer gone: peer lost or unreachable: peer 'gone'"
# and what to look at where nothing listens at its address
has err "(127.0.0.1:1) unreachable: connection refused (nothing listens there: is the peer's daemon running, with this address as its cluster.listen?)"
grep -qF "connection to gshmd" "$dir/err" && fail "a peer down blamed on gshmd: $(cat "$dir/err")"
# a peer of another key: named once, with its address ("peer 'other'
# (ADDR): peer 'other' did not prove ..." before; a set: "peer 'other':
# peer 'other' ...")
GSHM_SOCKET=$dir/c run 4 segments --peer other
has err "peer 'other' (127.0.0.1:$oport) did not prove the shared key"
GSHM_SOCKET=$dir/c run 4 pull other:llama/ --prefix
has err "peer 'other' (127.0.0.1:$oport) did not prove the shared key"
kill $opid; wait $opid 2>/dev/null
# --json peers says whether the cluster is on, as the text does
GSHM_SOCKET=$dir/c run 0 --json peers
json out "d['cluster'] is True and d['peers'][0]['name'] == 'gone'"
documented peers out sub
# a peer name longer than the PEER column, an address longer than
# ADDRESS: the columns after them stay in line
GSHM_SOCKET=$dir/c run 0 peers
aligned out STATE
kill $cpid; wait $cpid 2>/dev/null
run 0 --json peers
json out "d['cluster'] is False and d['peers'] == []"
run 0 peers
has out "cluster off"

# a quota or limit that refuses a create names its key, so that the user
# knows what an admin would raise (it said "limit 1" and nothing more)
"$gshmd" --backend host --socket "$dir/q" --log-level 3 --set daemon.socket_mode=0666 \
  --set limits.max_segments=2 --set limits.max_segment_size=1M --set quota.segments=1 \
  --set quota.host_bytes=8K 2>"$dir/gshmd-q.log" &
qpid=$!
for _ in $(seq 200); do [ -S "$dir/q" ] && break; sleep 0.05; done
as_user=()
if [ "$(id -u)" = 0 ]; then
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  chmod 0711 "$dir"
fi
quser() { # quser RC ARGS...: gshmctl on $dir/q as a user that quotas apply to
  local want=$1 rc
  shift
  "${as_user[@]}" "$ctl" -s "$dir/q" "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ "$rc" = "$want" ] || fail "gshmctl $* (quota): exit $rc, want $want ($(cat "$dir/err"))"
}
quser 0 create q1 4K
quser 1 create q2 4K
has err "limit 1 (quota.segments)"
quser 1 create q2 2M
has err "over the daemon's limit of 1 MiB (limits.max_segment_size)"
quser 0 unlink q1
quser 1 create q3 12K
has err "12 KiB more asked (quota.host_bytes)"
if [ "$(id -u)" = 0 ]; then
  quser 0 create q4 4K
  GSHM_SOCKET=$dir/q run 0 create r1 4K
  GSHM_SOCKET=$dir/q run 1 create r2 4K
  has err "the daemon holds 2 segments, its limit (limits.max_segments)"
  chmod 0700 "$dir"
fi
kill $qpid; wait $qpid 2>/dev/null

# --mode 0 for a new segment is refused (gshmd takes 0 for its default,
# 0600: "create --mode 0" gave 0600, silently); chmod sets 0 itself
for verb in "create m0 4K" "pull p:m0"; do
  run 2 $verb --mode 0
  has err "${verb%% *}: --mode 0 cannot be given to a new segment"
  has err "gshmctl chmod NAME 0"
done
run 5 unlink m0
run 0 create m0 4K --mode 0644
run 0 chmod m0 0
run 0 --json segments
json out "[s['mode'] for s in d['segments'] if s['name'] == 'm0'] == ['0000']"
run 0 unlink m0

# a name or argument gshmctl echoes in its one-line answers and errors is
# escaped as its tables escape names: an ESC, a CR, a C1 CSI or a bidi
# override in it reached the terminal raw ("created '<name>'", "unknown
# verb '<arg>'"), and could rewrite what the admin running a script sees
# raw_free: neither out nor err of the last command holds one raw
raw_free() {
  local f
  for f in out err; do
    "$py" -c 'import sys; b = open(sys.argv[1], "rb").read()
sys.exit(any(c in b for c in (b"\x1b", b"\r", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae")))' "$dir/$f" \
      || fail "$f of the last command holds a raw control: $(od -c "$dir/$f" | head -5)"
  done
}
evil="evil/$(printf '\xe2\x80\xae\xc2\x9b2Jz')"  # a valid name: a bidi override and a C1 CSI
for args in "create|$evil|4K" "chmod|$evil|0640" "chown|$evil|0" "revoke|$evil" \
            "create|$evil|4K" "unlink|$evil"; do
  IFS='|' read -r -a a <<<"$args"
  run 0 "${a[@]}"
  raw_free
  has out '\xE2\x80\xAE\xC2\x9B2Jz'
done
printf 'abc' | "$ctl" create "$evil" 4K >/dev/null
printf 'abc' | run 0 write "$evil"
raw_free
has out '\xE2\x80\xAE'
run 0 unlink "$evil"
run 5 unlink "$evil"  # no such segment: gshmd's answer names it
raw_free
run 2 "$(printf '\e[2J\rverb')"
raw_free
has err "unknown verb '\x1B[2J\x0Dverb'"
run 5 chown x "$(printf '\e]0;title\a')"
raw_free
has err "no such user '\x1B]0;title\x07'"
run 1 create "$(printf 'a\e[31m')" 4K
raw_free
run 2 create x 4K --mode "$(printf '\e[2J')"
raw_free
run 2 create x "$(printf '4K\r')"
raw_free
GSHM_SOCKET="$dir/$(printf '\e[2J')" run 3 status
raw_free

# usage_error WANT ARGS...: gshm-bench ARGS exits 2 (a usage error), WANT
# in its stderr
usage_error() {
  local want=$1 rc
  shift
  timeout 20 "$bench" "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc = 2 ] || fail "gshm-bench $*: exit $rc, want 2 ($(tail -2 "$dir/err"))"
  has err "$want"
}
# gshm-bench's numeric options: a value that is no integer, or below
# the option's least, is a usage error naming the option ("--iters abc"
# ran once, "--runs x" measured nothing)
for args in "pull --iters abc" "pull --fanout 2x" "attach --runs x" "attach --device -1" \
            "control --repeat 0" "seal --reps z" "copy --reps -3" "broadcast --gpus two"; do
  set -- $args
  usage_error "gshm-bench $1: $2 takes an integer" "$@"
done
# an option given twice is a usage error naming it: the second value
# silently replaced the first ("--set 4x1M --set 8x1M" ran 8x1M); those
# that repeat (--gshmd-set, --size) still do
for args in "pull --set 4x1M --set 8x1M" "pull --iters=2 --iters 3" "attach --runs 2 --runs 3" \
            "control --duration 1 --duration 2" "seal --reps 3 --reps 4" \
            "copy --max 1M --max 2M" "broadcast --methods a --methods b"; do
  set -- $args
  usage_error "gshm-bench $1: ${2%%=*} given twice" "$@"
done
usage_error "gshm-bench pull: --model and --set both given" pull --model 2x64 --set 4x1M
# more repeats than the medians' arrays hold is a usage error: pull
# --iters 70 ran 63 and copy --reps 100 ran 64, under headers saying 70 / 100
usage_error "gshm-bench pull: --iters takes 1 to 63" pull --iters 64
usage_error "gshm-bench copy: --reps takes 1 to 64" copy --reps 65
for args in "pull --gshmd-set a=1 --gshmd-set b=2 --help" "attach --size 2M --size 4M --help"; do
  timeout 20 "$bench" $args >"$dir/out" 2>"$dir/err" \
    || fail "gshm-bench $args: exit $?, want 0 ($(tail -2 "$dir/err"))"
done

# --split is a shape of three copies: with another --fanout a usage error
timeout 20 "$bench" pull --fanout 2 --split >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 2 ] || fail "gshm-bench pull --fanout 2 --split: exit $rc, want 2"
has err "gshm-bench pull: --split takes --fanout 3"

"$py" "$src/python/examples/share_weights.py" --help >"$dir/out" 2>"$dir/err" \
  || fail "share_weights.py --help: $(cat "$dir/err")"
has out "usage: share_weights.py"
# every option says what it is and its default (--socket, --size-mib and
# --name said nothing), whatever the lines' wrapping
tr -s ' \n' '  ' <"$dir/out" >"$dir/out1" && mv "$dir/out1" "$dir/out"
has out "gshmd's socket (default \$GSHM_SOCKET, else /run/gshm/gshmd.sock)"
has out "MiB of weights to share (default 2048)"
has out "the segment's name (default example/weights)"

# the fd limit: a hand-started gshmd under a shell's limit (below the
# unit's LimitNOFILE=) says nothing at notice level, once at debug level;
# under systemd (INVOCATION_ID) the same shortfall is a warning
fdlimit() { # fdlimit LOGLEVEL [ENV...]: gshmd's stderr in $dir/fd.log
  rm -f "$dir/fd.s"
  (ulimit -n 1024 && exec env -u NOTIFY_SOCKET -u INVOCATION_ID "${@:2}" "$gshmd" --backend host --socket "$dir/fd.s" \
     --log-level "$1") 2>"$dir/fd.log" &
  local p=$!
  for _ in $(seq 200); do [ -S "$dir/fd.s" ] && break; sleep 0.05; done
  # (a gshmd that never started says nothing of the limit either: the
  # checks of its silence below would pass)
  [ -S "$dir/fd.s" ] || fail "gshmd under ulimit -n 1024 (${*:2}) did not start: $(cat "$dir/fd.log")"
  kill $p; wait $p 2>/dev/null
}
fdlimit 6
grep -q "fd limit" "$dir/fd.log" && fail "hand start warns about the fd limit: $(cat "$dir/fd.log")"
fdlimit 7
[ "$(grep -c "fd limit 1024 is below" "$dir/fd.log")" = 1 ] \
  || fail "debug log lacks one fd-limit line: $(cat "$dir/fd.log")"
grep "fd limit 1024 is below" "$dir/fd.log" | grep -q "^<7>" || fail "not at debug: $(cat "$dir/fd.log")"
fdlimit 6 INVOCATION_ID=0123456789abcdef
grep "fd limit 1024 is below" "$dir/fd.log" | grep -q "^<4>" \
  || fail "under systemd the fd limit is not a warning: $(cat "$dir/fd.log")"
# NOTIFY_SOCKET without INVOCATION_ID: gshm-demo's and gshm-bench's own
# gshmd, where no gshmd.service has a LimitNOFILE= to raise
fdlimit 6 NOTIFY_SOCKET="$dir/no-notify.sock"
grep -q "fd limit" "$dir/fd.log" && fail "a spawned gshmd warns about the fd limit: $(cat "$dir/fd.log")"

[ "$failures" = 0 ] && echo "all checks passed"
exit $((failures > 0))
