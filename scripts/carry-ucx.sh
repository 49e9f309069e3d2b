#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Copies Debian's UCX shared objects, their module directory and
# ucx_perftest into DIR, for a -DGSHM_STATIC_DEPS=ON build that must run
# on a machine without the Debian packages (the GPU machines): gshmd
# finds them through its rpath ($ORIGIN/../ucx-lib), UCX finds its
# transport modules in DIR/ucx next to libucs, and gshm-bench runs
# DIR/ucx_perftest with LD_LIBRARY_PATH=DIR.
set -eu
dir=$1
lib=$(pkg-config --variable=libdir ucx 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)
mkdir -p "$dir/ucx"
for l in ucp uct ucs ucm; do
  real=$(readlink -f "$lib/lib$l.so.0")
  cp -f "$real" "$dir/lib$l.so.0"
  ln -sf "lib$l.so.0" "$dir/lib$l.so"
done
# what they link besides libc (missing on minimal images)
for l in libnuma.so.1 libgomp.so.1; do
  p=$(ldconfig -p | awk -v l="$l" '$1 == l && /x86-64/ { print $NF; exit }')
  [ -n "$p" ] && cp -f "$(readlink -f "$p")" "$dir/$l"
done
# transport modules: cma (cross-memory attach); the verbs and rdmacm
# modules need rdma-core, which a GPU cluster brings with its own UCX
if [ -e "$lib/ucx/libuct_cma.so.0" ]; then
  cp -f "$(readlink -f "$lib/ucx/libuct_cma.so.0")" "$dir/ucx/libuct_cma.so.0"
fi
if command -v ucx_perftest >/dev/null; then
  cp -f "$(command -v ucx_perftest)" "$dir/ucx_perftest"
fi
