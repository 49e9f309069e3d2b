#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gshm-bench control against a gshmd whose iterations fail: the run must
# fail (exit 1, a word on stderr), not print a table and exit 0.  A gshmd
# of limits.max_segments=2 holds the bench's two segments and refuses
# every create+unlink.  Also: points are medians of 3 runs by default.
# bash only.
#
# usage: test_bench_control.sh GSHM_BENCH GSHMD
set -u
bench=$1
gshmd=$2

dir=$(mktemp -d)
"$gshmd" --backend host --socket "$dir/s" --log-level 3 --set=limits.max_segments=2 \
  2>"$dir/gshmd.log" &
pid=$!
# (gshmd must exit 0 at its SIGTERM: its status was not looked at)
trap 'rc=$?; kill $pid 2>/dev/null; wait $pid || { echo "FAIL: gshmd exited $? at its SIGTERM" >&2; rc=1; }
      rm -rf "$dir"; exit $rc' EXIT
for _ in $(seq 200); do [ -S "$dir/s" ] && break; sleep 0.05; done
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

timeout 60 "$bench" control --socket "$dir/s" --clients 1 --ops create --duration 0.3 \
  --warmup 0.1 --no-floor >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] || fail "control with every create refused: exit $rc, want 1"
grep -q "gshm-bench control: create+unlink N=1: [0-9]* failed iterations" "$dir/err" ||
  fail "no word of the failed iterations on stderr: $(cat "$dir/err")"

# each point is the median of repeated runs by default (--repeat 3; it
# was 1: one run, no median), and --repeat past what it holds is refused
timeout 60 "$bench" control --socket "$dir/s" --clients 1 --ops stat --duration 0.1 \
  --warmup 0.05 --no-floor --json >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || fail "control --ops stat: exit $rc ($(cat "$dir/err"))"
grep -q '"repeat":3,' "$dir/out" || fail "control's default repeat is not 3: $(head -c 300 "$dir/out")"
# CPU shares come from the processes' CPU clocks (ns): from /proc's 10 ms
# ticks over a 0.2 s point every one was a multiple of 0.05
timeout 60 "$bench" control --socket "$dir/s" --clients 1,4 --ops stat --duration 0.2 \
  --warmup 0.05 --no-floor --repeat 1 --json >"$dir/out" 2>"$dir/err"
grep -o '"\(gshmd\|clients\)_cpu":[0-9.]*' "$dir/out" | cut -d: -f2 |
  awk '{ n++; if (int($1 * 1000 + 0.5) % 50) fine++ } END { exit !(n == 4 && fine > 0) }' ||
  fail "control's CPU shares are all in 10 ms steps (or missing): $(grep -o '"[a-z]*_cpu":[0-9.]*' "$dir/out" | tr '\n' ' ')"
timeout 20 "$bench" control --repeat 17 >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 2 ] || fail "control --repeat 17: exit $rc, want 2 (it ran 16)"
grep -q "gshm-bench control: --repeat takes 1 to 16" "$dir/err" || fail "control --repeat 17 says: $(cat "$dir/err")"

[ $failures = 0 ] && echo "ok: gshm-bench control fails with its iterations"
exit $((failures > 0))
