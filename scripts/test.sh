#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# README's test command: install dependencies, then build and run the whole
# suite in three stages:
#   1. a normal build (RelWithDebInfo): unit, integration (a real gshmd and
#      real client processes), hostile-client, restart and kill-point,
#      config, CLI, install, systemd-unit, metrics, cluster (two gshmd over
#      UCX), Python and valgrind tests; GPU tests (label gpu) report
#      "skipped" where the GPUs are missing;
#   2. an ASan/UBSan build of everything, the same tests but valgrind's;
#   3. the libFuzzer targets (clang), 20 s each on their seed corpus.
# A stage that fails does not stop the next.  The last line is the total,
# `N passed, N failed`: every ctest test that ran (skips excluded, listed
# per stage above it) and every fuzz target; a build that fails counts as
# one failure.  Exits 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh || exit 1
jobs=$(nproc)
passed=0 failed=0
log=$(mktemp "${TMPDIR:-/tmp}/gshm-test.XXXXXX") || exit 1
tails=$(mktemp "${TMPDIR:-/tmp}/gshm-tails.XXXXXX") || exit 1
trap 'rm -f "$log" "$tails"' EXIT

# build_stage NAME BUILD_DIR CMAKE_ARGS...: configures and builds (the
# targets in $targets, default all); a failure counts as one failed test.
build_stage() {
  local name=$1 dir=$2
  shift 2
  # shellcheck disable=SC2086
  if cmake -S . -B "$dir" "$@" && cmake --build "$dir" -j"$jobs" ${targets:+--target $targets}; then
    return 0
  fi
  echo "== $name: build FAILED"
  failed=$((failed + 1))
  return 1
}

# ctest_stage NAME BUILD_DIR [CTEST_ARGS...]: runs ctest and adds its
# counts (ctest's "X tests failed out of Y", less the skipped).
ctest_stage() {
  local name=$1 dir=$2 total fails skipped
  shift 2
  (cd "$dir" && ctest --output-on-failure -j"$jobs" "$@") 2>&1 | tee "$log"
  total=$(sed -n 's/.* tests failed out of \([0-9]*\)$/\1/p' "$log" | tail -1)
  fails=$(sed -n 's/.*, \([0-9]*\) tests failed out of .*/\1/p' "$log" | tail -1)
  skipped=$(grep -c '\*\*\*Skipped' "$log")
  if [ -z "$total" ]; then # ctest itself failed: no summary
    echo "== $name: ctest gave no summary"
    failed=$((failed + 1))
    return
  fi
  echo "== $name: $((total - fails - skipped)) passed, $fails failed, $skipped skipped"
  [ "$fails" -gt 0 ] && failed_tails "$name" "$dir"
  passed=$((passed + total - fails - skipped))
  failed=$((failed + fails))
}

# failed_tails NAME BUILD_DIR: the last 60 lines of each failed test's
# output (ctest's Testing/Temporary/LastTest.log), kept for the end of
# the log: a CI page that shows a long log's head and tail then still
# shows where a test that timed out was stuck.
failed_tails() {
  local name=$1 dir=$2 t
  for t in $(cut -d: -f2 "$dir/Testing/Temporary/LastTestsFailed.log"); do
    echo "== $name: the end of $t's output"
    awk -v t="$t" '$0 ~ "Test: " t "$" {on = 1; n = 0; next}
      on && /^<end of output>$/ {exit}
      on && out {line[n++ % 60] = $0}
      on && /^-+$/ && !out {out = 1}
      END {for (i = (n > 60 ? n - 60 : 0); i < n; i++) print line[i % 60]}' \
      "$dir/Testing/Temporary/LastTest.log"
  done >>"$tails"
}

echo "== build and test (RelWithDebInfo)"
build_stage "RelWithDebInfo" build -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  ctest_stage "RelWithDebInfo" build

echo "== build and test (ASan + UBSan)"
# The CUDA kernels are the same fatbin either way; the sanitizers are for
# the C code, so this build skips nvcc.
build_stage "ASan + UBSan" build-asan -DCMAKE_BUILD_TYPE=Debug \
  -DGSHM_SANITIZE=address,undefined -DGSHM_WITH_CUDA=OFF &&
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest_stage "ASan + UBSan" build-asan -LE valgrind

echo "== fuzz targets (clang + libFuzzer, 20 s each, on the seed corpus)"
if CC=clang targets=fuzz build_stage "fuzz" build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     -DGSHM_WITH_CUDA=OFF; then
  # run.sh prints "fuzz T: ok ..." or "fuzz T: FAILED ..." for each target
  tests/fuzz/run.sh 20 build-fuzz 2>&1 | tee "$log"
  ok=$(grep -c '^fuzz .*: ok' "$log")
  bad=$(grep -c '^fuzz .*: FAILED' "$log")
  [ "$ok" -gt 0 ] || bad=$((bad + 1)) # no target ran: clang missing or broken
  echo "== fuzz: $ok passed, $bad failed"
  passed=$((passed + ok))
  failed=$((failed + bad))
fi

cat "$tails"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
