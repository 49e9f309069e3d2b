#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# old_gshmd.sh SRC COMMIT DIR CC: builds gshmd as of COMMIT of the git
# repository SRC into DIR/build/daemon/gshmd (the source from git archive
# in DIR/src; gshmd only, no tests, no CUDA kernels), for
# test_restart_scale's upgrade_from_running_old (GSHMD_OLD).  Kept: a
# second run with DIR/commit naming COMMIT builds nothing.  Exits 77
# (skipped) when SRC is no git repository or lacks COMMIT (a shallow
# clone, a release tarball): those cases then skip, saying so.
src=$1
commit=$2
dir=$3
cc=$4
if [ -x "$dir/build/daemon/gshmd" ] && [ "$(cat "$dir/commit" 2>/dev/null)" = "$commit" ]; then
  echo "old gshmd ($commit) already built: $dir/build/daemon/gshmd"
  exit 0
fi
if ! command -v git >/dev/null 2>&1 ||
   ! git -C "$src" rev-parse -q --verify "$commit^{commit}" >/dev/null 2>&1; then
  echo "SKIPPED: commit $commit is not in $src (no git, a shallow clone or a tarball):"
  echo "test_restart_scale's test_upgrade_from_running_old_* cases skip"
  exit 77
fi
rm -rf "$dir" && mkdir -p "$dir/src" || exit 1
git -C "$src" archive "$commit" | tar -x -C "$dir/src" || exit 1
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" \
      -DGSHM_BUILD_TESTS=OFF -DGSHM_WITH_CUDA=OFF >"$dir/configure.log" 2>&1 ||
  { cat "$dir/configure.log"; echo "FAIL: configuring $commit"; exit 1; }
cmake --build "$dir/build" -j 2 --target gshmd >"$dir/build.log" 2>&1 ||
  { cat "$dir/build.log"; echo "FAIL: building gshmd of $commit"; exit 1; }
echo "$commit" >"$dir/commit"
echo "old gshmd ($commit) built: $dir/build/daemon/gshmd"
