#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs every fuzz target of a build for SECONDS each on a copy of its seed
# corpus (tests/fuzz/corpus/<target>); fails on the first finding.
#   tests/fuzz/run.sh SECONDS BUILD_DIR [TARGET...]
# Findings (crash-*, leak-*, timeout-*, oom-*) are copied to
# $GSHM_FUZZ_ARTIFACTS (default BUILD_DIR/fuzz-artifacts).  Exits 0 when
# all ran clean, 1 on a finding, 77 when the build has no fuzz targets
# (not built with clang).
set -u
secs=${1:?usage: run.sh SECONDS BUILD_DIR [TARGET...]}
build=${2:?usage: run.sh SECONDS BUILD_DIR [TARGET...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/tests/fuzz
artifacts=${GSHM_FUZZ_ARTIFACTS:-$build/fuzz-artifacts}

if [ $# -eq 0 ]; then
  set -- $(cd "$here/corpus" && ls)
fi
if [ ! -x "$bin/$1" ]; then
  echo "run.sh: no fuzz targets in $bin (configure with CC=clang)" >&2
  exit 77
fi
mkdir -p "$artifacts"
work=$(mktemp -d "${TMPDIR:-/tmp}/gshm-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT INT TERM

fail=0
for t in "$@"; do
  if [ ! -x "$bin/$t" ]; then
    # (in the "fuzz T: FAILED" form that scripts/test.sh counts: a line
    # of its own was counted nowhere, and a target that was not built
    # went unnoticed in CI's total)
    echo "fuzz $t: FAILED ($bin/$t missing: not built)" >&2
    fail=1
    continue
  fi
  mkdir -p "$work/$t"
  cp "$here/corpus/$t"/* "$work/$t/" 2>/dev/null
  # -close_fd_mask=2: the config parser reports errors on stderr by design;
  # libFuzzer and the sanitizers keep their own copy of stderr.
  if "$bin/$t" -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
       -close_fd_mask=2 -artifact_prefix="$artifacts/$t-" "$work/$t" >"$work/$t.log" 2>&1; then
    echo "fuzz $t: ok, $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" |
      grep -o '[0-9]*$') runs, $(grep -o 'cov: [0-9]*' "$work/$t.log" | tail -1)"
  else
    echo "fuzz $t: FAILED (finding in $artifacts)" >&2
    grep -v '^#' "$work/$t.log" | tail -60 >&2
    fail=1
  fi
done
exit $fail
