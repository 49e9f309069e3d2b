#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gshm-bench pull's table against anchors it is given: a stand-in for
# ucx_perftest (--perftest) that prints the bandwidth each test is told
# to, so that what the bench makes of them can be checked (vsBEST over the
# best anchor, medians of repeated runs, failed runs reported and exit 1).
# Host segments, two gshmd on 127.0.0.1, 1 MiB, a few iterations.  Also:
# the helps' words, the gshmd CPU figures above 0, --fanout 1 --recycle's
# anchors in written memory and CPU medians; with the fault shim
# (bench_faults.c) a failing TCP anchor and a copy read back wrong must
# fail the run.  bash only.
#
# usage: test_bench_pull.sh GSHM_BENCH GSHMD [FAULT_SHIM (tests/cli/bench_faults.c)]
set -u
bench=$1
gshmd=$2
shim=${3:-}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n

# The stand-in: a server (no host argument) waits to be stopped; a client
# prints ucx_perftest's CSV (-f -v) with overall bandwidth $PT_<TEST> MB/s
# (a comma list: one value a run, in turn, counted in $dir/runs.<TEST>), or
# fails without output where the value is "fail".
cat >"$dir/perftest" <<'PT'
#!/usr/bin/env bash
case $1 in -*) exec sleep 60 ;; esac
t=$3
var=PT_$t
IFS=, read -r -a v <<<"${!var:-1000}"
k=$(cat "$PTDIR/runs.$t" 2>/dev/null || echo 0)
echo $((k + 1)) >"$PTDIR/runs.$t"
bw=${v[k % ${#v[@]}]}
[ "$bw" = fail ] && exit 1
echo "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr"
echo "20,10.0,11.0,11.0,$bw,$bw,100,100"
PT
chmod +x "$dir/perftest"
export PTDIR=$dir

# pull ARGS...: the bench with the stand-in, 1 MiB; output in $dir/out,
# $dir/err, its exit status in $rc
pull() {
  rm -f "$dir"/runs.*
  "$bench" pull --sizes 1M --perftest "$dir/perftest" --gshmd "$gshmd" "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
}
# the 1 MiB row's fields: PULL GB/s, TCPxK new, TCPxK warm, tag_bw, am_bw, vsBEST
row() { awk '$1 == "1" && $2 == "MiB" { print $3, $5, $7, $9, $10, $11 }' "$dir/out"; }

# the help says what pull is measured against and what its columns are,
# in which units (it named ucp_get, not run for the table, and no columns)
"$bench" --help | grep -q "^  pull .*TCP streams, ucx_perftest" ||
  fail "gshm-bench --help's pull line: $("$bench" --help | grep '^  pull')"
for w in "PULL GB/s (1e9 bytes/s" "TCPxK new" "TCPxK warm" "vsBEST" "CPU s/GB (CPU seconds per 1e9"; do
  "$bench" pull --help | tr -s ' \n' ' ' | grep -qF "$w" || fail "pull --help does not explain '$w'"
done

# vsBEST is the pull's rate over the best of all four anchors: am_bw above
# tag_bw above the TCP ones must be the one it is judged by
PT_tag_bw=20000 PT_ucp_am_bw=2000000 pull --iters 3
[ $rc = 0 ] || fail "pull: exit $rc ($(tail -3 "$dir/err"))"
read -r gbs tnew twarm tag am best <<<"$(row)"
[ -n "${best:-}" ] || fail "no 1 MiB row: $(cat "$dir/out")"
awk -v g="$gbs" -v a="$tnew" -v b="$twarm" -v c="$tag" -v d="$am" -v r="${best:-0}" 'BEGIN {
  m = a; if (b > m) m = b; if (c > m) m = c; if (d > m) m = d
  x = g / m - r; if (x < 0) x = -x
  exit !(x < 0.006) }' ||
  fail "vsBEST $best is not PULL $gbs over the best anchor of $tnew $twarm $tag $am"

# the gshmd's CPU s/GB come from their CPU clocks (ns): 3 MiB of pulls
# cost each side a few ms, under /proc's 10 ms tick, which printed 0.00
read -r src pul <<<"$(sed -n 's/.*CPU s\/GB: pull [0-9.]* (source \([0-9.]*\), puller \([0-9.]*\)).*/\1 \2/p' "$dir/out")"
awk -v a="${src:-0}" -v b="${pul:-0}" 'BEGIN { exit !(a > 0 && b > 0 && a < 100 && b < 100) }' ||
  fail "CPU s/GB of source '${src:-}' and puller '${pul:-}' at 1 MiB: want both above 0"

# an anchor that fails is a failure: its column says fail, stderr says
# which, the run exits 1 (a -1.00 in the table, exit 0, before)
PT_ucp_am_bw=fail pull --iters 1
[ $rc = 1 ] || fail "pull with ucp_am_bw failing: exit $rc, want 1"
read -r gbs tnew twarm tag am best <<<"$(row)"
[ "${am:-}" = fail ] || fail "ucp_am_bw failed, its column says '${am:-}': $(cat "$dir/out")"
[ "${tag:-}" = 1.05 ] || fail "tag_bw 1000 MB/s (2^20 B) is 1.05 GB/s, not '${tag:-}'"
grep -q "ucp_am_bw at 1 MiB failed" "$dir/err" || fail "no word of ucp_am_bw's failure: $(cat "$dir/err")"
grep -q "perftest -t ucp_am_bw -s 1048576: no result line, client exit 1" "$dir/err" ||
  fail "no word of why ucp_am_bw failed: $(cat "$dir/err")"
PT_ucp_get=fail pull --iters 1
[ $rc = 1 ] || fail "pull with ucp_get failing: exit $rc, want 1"
grep -q "ucp_get: fail" "$dir/out" || fail "ucp_get failed, the 4 KiB line says: $(grep 4 "$dir/out")"
pull --iters 1 --no-perftest
[ $rc = 0 ] || fail "pull --no-perftest: exit $rc ($(tail -3 "$dir/err"))"
read -r gbs tnew twarm tag am best <<<"$(row)"
[ "${tag:-}/${am:-}" = -/- ] || fail "--no-perftest: tag_bw / am_bw say '${tag:-}/${am:-}', want -/-"

# tag_bw and am_bw are the medians of as many ucx_perftest runs as the
# pull's timed iterations (one run before: its figure, whichever it was)
PT_tag_bw=1000,9000,5000 PT_ucp_am_bw=3000,2000,7000 pull --iters 3
[ $rc = 0 ] || fail "pull: exit $rc ($(tail -3 "$dir/err"))"
read -r gbs tnew twarm tag am best <<<"$(row)"
[ "${tag:-}/${am:-}" = 5.24/3.15 ] ||
  fail "tag_bw / am_bw of runs 1000,9000,5000 / 3000,2000,7000 MB/s: '${tag:-}/${am:-}', want the medians 5.24/3.15"
[ "$(cat "$dir/runs.tag_bw" 2>/dev/null)" = 3 ] || fail "tag_bw ran $(cat "$dir/runs.tag_bw" 2>/dev/null) times, want 3"
# a run that fails among them fails the anchor (not a median of the rest)
PT_tag_bw=1000,fail,5000 pull --iters 3
[ $rc = 1 ] || fail "pull with tag_bw's second run failing: exit $rc, want 1"

# --fanout --recycle: the pulls land in memory made before, and so must
# the plain TCP anchors (they wrote new memfds: half the speed here)
"$bench" pull --gshmd "$gshmd" --fanout 1 --set 4x1M --iters 1 --recycle 64M >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || fail "pull --fanout 1 --recycle: exit $rc ($(tail -3 "$dir/err"))"
grep -q "^plain TCP: .* into memfds written before" "$dir/out" ||
  fail "--fanout --recycle's plain TCP anchors do not land in written memory: $(grep '^plain TCP:' "$dir/out")"
# its gshmd CPU figures are medians over the iterations, as its times are
grep -q "^gshmd CPU s per iteration (median), one pull / fan-out:  n0 [0-9.]* / [0-9.]*  n1" "$dir/out" ||
  fail "--fanout's gshmd CPU line: $(grep '^gshmd CPU' "$dir/out")"

# a plain TCP anchor that fails (its memfd refused: the shim) fails the
# run, with a word; its -1 s were taken into the median before
if [ -n "$shim" ]; then
  LD_PRELOAD=$shim FAIL_MEMFD_NAME=gshm-bench-tcp pull --iters 2 --no-perftest
  [ $rc = 1 ] || fail "pull with the TCP anchor failing: exit $rc, want 1 ($(row))"
  grep -q "plain TCP anchor into new memory failed" "$dir/err" ||
    fail "no word of the TCP anchor's failure: $(cat "$dir/err")"
  # every pulled copy is read back and compared: one read back wrong is
  # a FAIL and exit 1 (nothing was compared before: exit 0)
  LD_PRELOAD=$shim FLIP_READ=1 pull --iters 1 --no-perftest
  [ $rc = 1 ] || fail "pull with its copy read back wrong: exit $rc, want 1"
  grep -q "FAIL: the pulled copy: its bytes differ" "$dir/err" ||
    fail "no word of the wrong copy: $(cat "$dir/err")"
else
  echo "(no fault shim: a failing TCP anchor and a wrong copy are not checked)"
fi

[ $failures = 0 ] && echo "ok: gshm-bench pull against given anchors"
exit $((failures > 0))
