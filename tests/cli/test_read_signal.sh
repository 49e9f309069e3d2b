#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# gshmctl read -o FILE ended by SIGINT (Ctrl-C), SIGTERM or SIGHUP midway:
# its temporary file beside FILE is removed (it was left, .FILE.gshmctl-
# XXXXXX, at every Ctrl-C), FILE is as it was (or still absent), and
# gshmctl ends as the signal ends a process (exit 128 + the signal).  The
# read is slowed by the fault shim (each gshm_read sleeps first), so that
# the signal comes while the temporary file is written.
#   test_read_signal.sh GSHMD GSHMCTL SHIM  (SHIM empty, in a sanitizer
#   build: skipped, exit 77)
set -u
gshmd=$1 ctl=$2 shim=$3
[ -n "$shim" ] || { echo "SKIP: no fault shim (sanitizer build)"; exit 77; }
. "$(dirname "$0")/lib.sh"
set -m # (background jobs of a script otherwise ignore SIGINT)

run 0 create big 64M
# interrupted SIG FILE: a read of big into FILE, slowed to 0.2 s per 4 MiB
# chunk, sent SIG once its temporary file is there; checks its exit and
# that no temporary file is left
interrupted() {
  local sig=$1 file=$2 want=$3 p rc
  SLOW_READ_MS=200 LD_PRELOAD=$shim "$ctl" read big -o "$file" 2>"$dir/err" &
  p=$!
  for _ in $(seq 200); do compgen -G "$dir/.${file##*/}.gshmctl-*" >/dev/null && break; sleep 0.05; done
  compgen -G "$dir/.${file##*/}.gshmctl-*" >/dev/null || fail "$sig: no temporary file appeared"
  kill -"$sig" $p
  wait $p
  rc=$?
  [ "$rc" = "$want" ] || fail "read -o ended by SIG$sig: exit $rc, want $want ($(cat "$dir/err"))"
  left=$(compgen -G "$dir/.${file##*/}.gshmctl-*")
  [ -z "$left" ] || fail "read -o ended by SIG$sig left its temporary file: $left"
}
echo old >"$dir/kept.bin"
interrupted INT "$dir/kept.bin" 130
[ "$(cat "$dir/kept.bin")" = old ] || fail "SIGINT: FILE changed: $(head -c 20 "$dir/kept.bin" | od -c)"
interrupted TERM "$dir/new.bin" 143
[ -e "$dir/new.bin" ] && fail "SIGTERM: FILE made"
interrupted HUP "$dir/kept.bin" 129
[ "$(cat "$dir/kept.bin")" = old ] || fail "SIGHUP: FILE changed"
# and one not interrupted still renames its file into place, whole
SLOW_READ_MS=0 LD_PRELOAD=$shim "$ctl" read big -o "$dir/whole.bin" >/dev/null 2>"$dir/err" \
  || fail "read -o: $(cat "$dir/err")"
[ "$(stat -c %s "$dir/whole.bin")" = $((64 << 20)) ] || fail "read -o wrote $(stat -c %s "$dir/whole.bin") bytes"

[ "$failures" = 0 ] || exit 1
echo "ok"
