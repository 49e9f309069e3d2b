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
has out "mapped 12 B, verified 1 words: all equal"
has out "demo ok"

[ "$failures" = 0 ] && echo "all checks passed"
exit $((failures > 0))
