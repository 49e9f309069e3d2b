#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# gshmctl pull and the signals it cancels on, between two real gshmd on
# 127.0.0.1 (host segments): SIGINT or SIGTERM mid-pull cancels it (exit
# 130, 143, nothing kept), but a signal that was ignored when gshmctl
# started (nohup, `cmd &` in a script, which ignores SIGINT) stays
# ignored: the pull goes on and completes.  Before, gshmctl's handler
# replaced the ignored SIGINT, and such a background pull was cancelled.
# The pull is held mid-way by stopping the peer (SIGSTOP) until the signal
# has come.
#   test_pull_signal.sh GSHMD GSHMCTL PYTHON
set -u
gshmd=$1 ctl=$2 py=$3
. "$(dirname "$0")/lib.sh"
set -m # (background jobs of a script otherwise ignore SIGINT)

exports="w*"
. "$(dirname "$0")/lib_nodes.sh"
GSHM_SOCKET=$dir/n7 run 0 create w 1M --mode 0644
export GSHM_SOCKET=$dir/n5
run 0 pull node7:w --as w0 # (the link up: the pulls below wait only on node7)

# held SIG IGNORED AS WANT: a pull of node7:w as AS, with SIG ignored at
# start (IGNORED=1) or not, node7 stopped until SIG has been sent and
# gshmctl has had 2 s to end (a cancel ends a pull within 0.1 s); checks
# the exit status is WANT
held() {
  local sig=$1 ignored=$2 as=$3 want=$4 p rc
  kill -STOP "$pid7"
  if [ "$ignored" = 1 ]; then
    (trap '' "$sig"; exec "$ctl" pull node7:w --as "$as" >"$dir/out" 2>"$dir/err") &
  else
    "$ctl" pull node7:w --as "$as" >"$dir/out" 2>"$dir/err" &
  fi
  p=$!
  # in flight on node5 (its holder, "pull:node7", among the clients):
  # gshmctl is inside gshm_pull, its handlers set
  for _ in $(seq 200); do
    "$ctl" clients 2>/dev/null | grep -q "pull:node7" && break
    sleep 0.05
  done
  "$ctl" clients 2>/dev/null | grep -q "pull:node7" || fail "SIG$sig: the pull never showed in flight"
  kill -"$sig" $p
  for _ in $(seq 40); do kill -0 $p 2>/dev/null || break; sleep 0.05; done
  kill -CONT "$pid7"
  wait $p
  rc=$?
  [ "$rc" = "$want" ] || fail "pull, SIG$sig (ignored: $ignored): exit $rc, want $want ($(cat "$dir/err"))"
}
# ignored at start: the pull completes, its segment is there
held INT 1 w1 0
has out "pulled node7:w into 'w1'"
held TERM 1 w2 0
has out "pulled node7:w into 'w2'"
# not ignored: the pull is cancelled, nothing kept
held INT 0 w3 130
has err "cancelled (SIGINT): nothing was kept"
held TERM 0 w4 143
has err "cancelled (SIGTERM): nothing was kept"
run 0 segments
has out "w1"
has out "w2"
grep -q "w3\|w4" "$dir/out" && fail "a cancelled pull kept its segment: $(cat "$dir/out")"

[ "$failures" = 0 ] || exit 1
echo "ok"
