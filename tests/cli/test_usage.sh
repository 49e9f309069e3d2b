#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The tools' info flags, usage errors and exit codes: what gshmctl, gshmd
# and gshm-demo print when asked for help or a version (and when that
# cannot be written), and how they answer arguments they cannot take.
# Kept apart from test_messages.sh, which runs close to its time limit.
# bash only.
#   test_usage.sh GSHMD GSHMCTL DEMO
set -u
gshmd=$1 ctl=$2 demo=$3
. "$(dirname "$0")/lib.sh"
# runs WANT PROGRAM ARGS...: as run, for any program
runs() {
  local want=$1 rc
  shift
  "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ "$rc" = "$want" ] || fail "$*: exit $rc, want $want ($(cat "$dir/err"))"
}

# What an info flag prints that cannot be written (stdout on a full disk)
# is a failure, exit 1 saying so, not exit 0 over a cut or empty file
# (gshmd's were made so in 9b156fd; gshmctl's and gshm-demo's exited 0)
if [ -w /dev/full ]; then
  for args in "--help" "-h" "--version" "-V" "help" "help create" "create --help" \
              "--json --help"; do
    "$ctl" $args >/dev/full 2>"$dir/err"
    rc=$?
    [ $rc = 1 ] || fail "gshmctl $args >/dev/full: exit $rc, want 1"
    has err "writing output: No space left on device"
  done
  "$demo" --help >/dev/full 2>"$dir/err"
  rc=$?
  [ $rc = 1 ] || fail "gshm-demo --help >/dev/full: exit $rc, want 1"
  has err "gshm-demo: writing to stdout: No space left on device"
fi

# An offset past an existing segment's end is an error about that
# segment (exit 1, as a read or write that runs past it), not a usage
# error: the command line is well formed and only gshmd's answer shows it
# (write said 2, read 1)
run 0 create seg 4K
head -c 10 /dev/zero >"$dir/in10"
for verb in "read seg -o $dir/o" "write seg -i $dir/in10"; do
  run 1 $verb --offset 5000
  has err "${verb%% *}: offset 5000 is past the segment's end (4096 bytes)"
  run 1 --json $verb --offset 5000
  has err '"exit_code":1'
done
run 1 read seg --offset 4000 --length 200 -o "$dir/o"
has err "read: --length 200 from offset 4000 runs past the segment's end (4096 bytes)"
run 0 unlink seg

# A write whose input does not fit changes nothing: the segment keeps its
# bytes (the input's first 4 MiB went in, chunk by chunk, before the
# chunk that did not fit failed the command, exit 1, over bytes already
# lost), from a file of more than one 4 MiB chunk and from a pipe, whose
# first 4 KiB come before the rest
run 0 create seg4m 4M
head -c 4M /dev/zero | tr '\0' a >"$dir/a4m"
head -c 5M /dev/zero | tr '\0' b >"$dir/b5m"
run 0 write seg4m -i "$dir/a4m"
run 1 write seg4m -i "$dir/b5m"
has err "write: the input (5242880 bytes) does not fit: the segment has 4194304 bytes"
has err "nothing was written"
run 1 write seg4m --offset 4092 -i "$dir/b5m"
{ head -c 4096 "$dir/b5m"; sleep 0.3; head -c 4M "$dir/b5m"; } | run 1 write seg4m
has err "write: the input (at least "
has err "nothing was written"
"$ctl" read seg4m -o "$dir/o" >/dev/null 2>&1
cmp -s "$dir/o" "$dir/a4m" || fail "a write that did not fit changed the segment: $(od -c "$dir/o" | head -3)"
# what fits still goes in, from a pipe as from a file
head -c 4096 "$dir/b5m" | run 0 write seg4m --offset 8192
has out "wrote 4096 bytes to 'seg4m' at offset 8192"
"$ctl" read seg4m --offset 8190 --length 4 -o "$dir/o" >/dev/null 2>&1
[ "$(cat "$dir/o")" = aabb ] || fail "a pipe's write landed wrong: $(od -c "$dir/o")"
# A read -o FILE that fails midway (here a file size limit, as a full disk
# would) leaves FILE as it was, and no file beside it (FILE was cut, then
# held the first 64 KiB); one that succeeds replaces it, its mode kept
printf 'precious\n' >"$dir/keep"
chmod 0640 "$dir/keep"
(trap '' XFSZ; ulimit -f 64; "$ctl" read seg4m -o "$dir/keep" >"$dir/out" 2>"$dir/err")
[ $? = 1 ] || fail "read -o past the file size limit: not exit 1 ($(cat "$dir/err"))"
has err "read: writing output: File too large"
[ "$(cat "$dir/keep")" = precious ] || fail "a failed read -o cut the file: $(head -c 40 "$dir/keep" | od -c | head -2)"
ls -A "$dir" | grep -q gshmctl- && fail "a failed read -o left a file: $(ls -A "$dir")"
run 0 read seg4m -o "$dir/keep"
"$ctl" read seg4m >"$dir/o" 2>/dev/null
cmp -s "$dir/keep" "$dir/o" || fail "read -o over a file: not the segment's bytes"
[ "$(stat -c %a "$dir/keep")" = 640 ] || fail "read -o over a file: mode $(stat -c %a "$dir/keep")"
# ... but only a file of its own: run by root (or any user) over a file
# another user made in a directory both may write (/tmp), the rename gave
# root a file of that user's mode, set-user-ID bit and all, holding bytes
# the other user may have put in the segment: a root shell.  Such a file
# is written in place, its owner's still.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  shared=$(mktemp -d)
  chmod 1777 "$shared"
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    sh -c 'printf x >"$1" && chmod 06777 "$1"' sh "$shared/trap" || fail "nobody's file"
  run 0 read seg4m -o "$shared/trap"
  cmp -s "$shared/trap" "$dir/o" || fail "read -o over nobody's file: not the segment's bytes"
  [ "$(stat -c %u "$shared/trap")" = 65534 ] ||
    fail "read -o over nobody's file: now $(stat -c '%U %a' "$shared/trap")"
  # a file of its own whose group it is not in keeps no set-group-ID bit
  printf x >"$shared/own"
  chgrp 65534 "$shared/own"
  chmod 02755 "$shared/own"
  run 0 read seg4m -o "$shared/own"
  [ "$(stat -c %a "$shared/own")" = 755 ] ||
    fail "read -o over its own file of another group: mode $(stat -c '%a %G' "$shared/own")"
  rm -rf "$shared"
fi
run 0 unlink seg4m

# help's own help: its usage line, as any verb's (it was "unknown verb
# 'help'", exit 2), on stdout, no gshmd needed
for args in "help help" "help --help" "help -h"; do
  GSHM_SOCKET=$dir/nothing-here run 0 $args
  has out "help [VERB]"
  has out "that verb's usage"
  grep -qF "create NAME" "$dir/out" && fail "gshmctl $args shows other verbs: $(cat "$dir/out")"
done
run 0 help
has out "  help [VERB]"
has out "  create NAME SIZE"

# gshm-demo --size that it does not take: what it takes (the least, the
# most, the units), as gshmctl's sizes say (it said "bad size '1'")
for size in 1 7 abc -8 4Q 99999999999999999999; do
  runs 2 "$demo" --size $size
  has err "gshm-demo: --size '$size': "
  has err "give at least 8 bytes, at most what this host's memory holds"
  has err "K, KB and KiB all mean 1024"
done
has err "too large"
runs 2 "$demo" --size 1
has err "'1': too small"
# and one it takes that is no whole page: shared and verified, said in
# bytes (the consumer checked the page's 4 KiB against the producer's 12
# bytes: MISMATCH; sizes were said in whole MiB: "0 MiB")
runs 0 timeout 50 "$demo" --no-gpu --size 12
has out "created 'demo/weights', 12 B at host"
has out "mapped 12 B, verified 1 word: all equal"
has out "demo ok"

# one of a thing is one, not "1 clients": gshmctl status, gshmd's STATUS=
# (systemctl status), its messages and its log.  A gshmd of one segment
# at most, its STATUS= lines in $dir/n.out; "sleep | gshmctl write"
# holds a client and a lease until sleep ends
python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sys.argv[1]); s.settimeout(20)
while True: print(s.recv(4096).decode(), flush=True)' "$dir/n" >"$dir/n.out" 2>/dev/null &
npid=$!
for _ in $(seq 100); do [ -S "$dir/n" ] && break; sleep 0.05; done
NOTIFY_SOCKET=$dir/n "$gshmd" --backend host --socket "$dir/one" --log-level 6 \
  --set limits.max_segments=1 2>"$dir/one.log" &
onepid=$!
for _ in $(seq 200); do [ -S "$dir/one" ] && break; sleep 0.05; done
GSHM_SOCKET=$dir/one run 0 status
has out "1 client, 0 segments (0 B), 0 leases"
GSHM_SOCKET=$dir/one run 0 create one 4K
GSHM_SOCKET=$dir/one run 1 create two 4K
has err "the daemon holds 1 segment, its limit (limits.max_segments)"
sleep 5 | GSHM_SOCKET=$dir/one "$ctl" write one >/dev/null 2>&1 &
holder=$!
for _ in $(seq 40); do
  GSHM_SOCKET=$dir/one run 0 status
  grep -qF "1 lease" "$dir/out" && break
  sleep 0.05
done
has out "2 clients, 1 segment (4 KiB), 1 lease"
for _ in $(seq 40); do grep -qF "STATUS=1 client, 1 segment, 4 KiB, 1 lease" "$dir/n.out" && break; sleep 0.1; done
grep -qF "STATUS=1 client, 1 segment, 4 KiB, 1 lease" "$dir/n.out" \
  || fail "gshmd's STATUS=: $(grep STATUS "$dir/n.out")"
GSHM_SOCKET=$dir/one run 0 unlink one
grep -qF "(1 lease remains)" "$dir/one.log" || fail "gshmd's unlink log: $(grep unlinked "$dir/one.log")"
wait $holder
kill $onepid $npid; wait $onepid $npid 2>/dev/null

# an unknown option is a usage error whatever comes before it: an info
# flag answered at once and the rest went unread ("gshmd -V --bogus"
# printed the version, exit 0); the first info flag still answers when
# all else is well
for args in "-V --bogus" "--version --bogus" "--help --bogus" "--print-config --bogus" \
            "-V -q" "--bogus -V"; do
  runs 2 "$gshmd" $args
  has err "Try 'gshmd --help' for more information."
  [ -s "$dir/out" ] && fail "gshmd $args printed on stdout: $(head -3 "$dir/out")"
done
runs 2 "$gshmd" -V --bogus
has err "gshmd: unrecognized option '--bogus'"
runs 2 "$gshmd" -V --socket
has err "option '--socket' requires an argument"
runs 2 "$gshmd" --help extra
has err "gshmd: unexpected argument 'extra'"
runs 0 "$gshmd" -V --help
has out "gshmd "
for args in "-V --bogus|--bogus" "--help --frob|--frob" "-h -x|-x" "--bogus -V|--bogus"; do
  run 2 ${args%|*}
  has err "gshmctl: unknown option '${args#*|}'"
  [ -s "$dir/out" ] && fail "gshmctl ${args%|*} printed on stdout: $(head -3 "$dir/out")"
done
run 2 -V --socket
has err "option '--socket' needs a value"
run 0 -V --help
has out "gshmctl "
# gshm-demo's usage errors say so as gshmctl's do (it was getopt's
# "/path/to/gshm-demo: unrecognized option '--bogus'")
for args in "--help --bogus" "--bogus --help" "--size" "--help extra"; do
  runs 2 "$demo" $args
  [ -s "$dir/out" ] && fail "gshm-demo $args printed on stdout: $(head -3 "$dir/out")"
done
runs 2 "$demo" --help --bogus
has err "gshm-demo: unknown option '--bogus' (gshm-demo --help lists them)"
runs 2 "$demo" --size
has err "gshm-demo: option '--size' needs a value"
runs 2 "$demo" --help extra
has err "gshm-demo: unexpected argument 'extra'"
runs 0 "$demo" --no-gpu --help
has out "usage: gshm-demo"

[ "$failures" = 0 ] && echo "all checks passed"
exit $((failures > 0))
