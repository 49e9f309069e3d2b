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

[ "$failures" = 0 ] && echo "all checks passed"
exit $((failures > 0))
