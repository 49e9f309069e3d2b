#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# gshmd under valgrind memcheck, for the integration tests (issue 5).
#
# As gshmd:   GSHM_VALGRIND_GSHMD=REAL_GSHMD GSHM_VALGRIND_LOGDIR=DIR valgrind-gshmd.sh ARGS...
#   execs valgrind on the real gshmd with ARGS, one log per process in
#   DIR/gshmd.<pid>.log; exit status 99 when memcheck found errors (definite
#   or indirect leaks count as errors).
#
# As a test:  valgrind-gshmd.sh --test LOGDIR TEST [ARGS...]
#   runs TEST with $GSHMD pointing at this script (the harness starts
#   whatever $GSHMD names; the real gshmd is the $GSHMD of the
#   environment), then checks every log: "ERROR SUMMARY: 0 errors" and
#   nothing definitely lost.  Fails if TEST fails, if no gshmd ran, or if a
#   log is unfinished (a gshmd killed with SIGKILL leaves one: do not run
#   tests that do that here).
set -u
if [ "${1:-}" = "--test" ]; then
  logdir=${2:?--test LOGDIR TEST [ARGS...]}
  shift 2
  : "${GSHMD:?GSHMD must name the real gshmd}"
  rm -rf "$logdir"
  mkdir -p "$logdir" || exit 1
  self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  GSHM_VALGRIND_GSHMD=$GSHMD GSHM_VALGRIND_LOGDIR=$logdir GSHMD=$self "$@"
  rc=$?
  n=0
  bad=0
  # A gshmd the test left running (e.g. a setup that timed out waiting for
  # READY under a slow valgrind start) would keep ctest waiting on its
  # output: stop it, and fail.
  for pid in $(cat "$logdir/pids" 2>/dev/null); do
    if kill -0 "$pid" 2>/dev/null; then
      echo "valgrind: gshmd $pid still running after the test; killed" >&2
      kill -KILL "$pid" 2>/dev/null
      bad=1
    fi
  done
  for log in "$logdir"/gshmd.*.log; do
    [ -e "$log" ] || continue
    n=$((n + 1))
    if ! grep -q "ERROR SUMMARY: 0 errors" "$log"; then
      echo "valgrind: $log: errors (or an unfinished log):" >&2
      bad=1
    elif grep -q "definitely lost: [1-9]" "$log" || grep -q "indirectly lost: [1-9]" "$log"; then
      echo "valgrind: $log: leaks:" >&2
      bad=1
    else
      continue
    fi
    grep -v "^==[0-9]*== *$" "$log" | tail -60 >&2
  done
  echo "valgrind: $n gshmd run(s) checked in $logdir, test exit status $rc"
  if [ "$n" -eq 0 ]; then
    echo "valgrind: no gshmd ran under valgrind" >&2
    exit 1
  fi
  [ "$rc" -eq 0 ] && [ "$bad" -eq 0 ]
  exit $?
fi

: "${GSHM_VALGRIND_GSHMD:?set by valgrind-gshmd.sh --test}"
echo $$ >>"${GSHM_VALGRIND_LOGDIR:-/tmp}/pids"
exec "${VALGRIND:-valgrind}" --tool=memcheck --leak-check=full \
  --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect \
  --error-exitcode=99 --num-callers=30 \
  --log-file="${GSHM_VALGRIND_LOGDIR:-/tmp}/gshmd.%p.log" "$GSHM_VALGRIND_GSHMD" "$@"
