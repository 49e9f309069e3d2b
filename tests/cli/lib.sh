# SPDX-License-Identifier: Apache-2.0
# What the gshmctl message tests share (sourced, with $gshmd and $ctl set):
# a private gshmd on $dir/s ($GSHM_SOCKET; its log $dir/gshmd.log, pid
# $pid, stopped and $dir removed at exit), fail, run and has.
dir=$(mktemp -d)
"$gshmd" --backend host --socket "$dir/s" --log-level 3 2>"$dir/gshmd.log" &
pid=$!
# gshmd_stop: SIGTERM to the gshmd, which must exit 0 (its status was
# not looked at: a gshmd failing on its way out passed every test)
gshmd_stop() {
  local rc=0
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null || rc=$?
  [ "$rc" = 0 ] || { echo "FAIL: gshmd exited $rc at its SIGTERM: $(tail -3 "$dir/gshmd.log")"; return 1; }
}
trap 'rc=$?; gshmd_stop || rc=1; rm -rf "$dir"; exit $rc' EXIT
for _ in $(seq 200); do [ -S "$dir/s" ] && break; sleep 0.05; done
export GSHM_SOCKET=$dir/s
failures=0
# The last command of a pipeline runs in this shell (no job control in a
# script): `printf x | run 0 write SEG` counts its failure; in a subshell
# the count was lost and the test passed with FAIL printed.
shopt -s lastpipe
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# run RC ARGS...: runs gshmctl, checks the exit code; output in $dir/out, $dir/err
run() {
  local want=$1 rc
  shift
  "$ctl" "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ "$rc" = "$want" ] || fail "gshmctl $*: exit $rc, want $want ($(cat "$dir/err"))"
}
has() { grep -qF -- "$2" "$dir/$1" || fail "$1 of the last command lacks '$2': $(cat "$dir/$1")"; }
