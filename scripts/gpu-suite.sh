#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The GPU suite and benchmarks in one go, for a lent GPU machine that has
# the CUDA driver but none of the Debian libraries (see README):
#   here:   cmake -S . -B build-gpu -DGSHM_STATIC_DEPS=ON && cmake --build build-gpu -j
#   there:  scripts/gpu-suite.sh OUTDIR      (with build-gpu carried along)
# ctest files hold absolute paths, so the tree is linked where it was built.
set -uo pipefail
out=${1:-${OUT:-/tmp/gshm-gpu}}
src=$(cd "$(dirname "$0")/.." && pwd)
built=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$src/build-gpu/CMakeCache.txt")
mkdir -p "$out" "$(dirname "$built")"
[ "$built" = "$src" ] || ln -sfn "$src" "$built"
cd "$built/build-gpu" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x /opt/torch/.venv/bin/python3 ] && export GSHM_GPU_PYTHON=/opt/torch/.venv/bin/python3
export GSHMD=$PWD/daemon/gshmd GSHMCTL=$PWD/client/gshmctl GSHM_LIBRARY=$PWD/client/libgshm.so

# The commit: $src/COMMIT where the tree was exported without .git (write it
# beside `git archive HEAD | tar -x -C DIR`: git rev-parse --short HEAD >
# DIR/COMMIT); else the tree's own .git (never a repository further up).
commit() { cat "$src/COMMIT" 2>/dev/null ||
  { [ -e "$src/.git" ] && git -C "$src" rev-parse --short HEAD; } || echo "commit unknown"; }
{ nvidia-smi -L; nvidia-smi topo -m; echo "commit $(commit)"; date -u; } > "$out/machine.txt" 2>&1
# GSHM_STEPS picks what runs (comma list; default all, in this order).
steps=",${GSHM_STEPS:-ctest,demo,attach,copy,broadcast,python,pull,control},"
[ -n "${GSHM_ONLY_CTEST:-}" ] && steps=",ctest,"
step() { case "$steps" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if step ctest; then
  ctest -L gpu --output-on-failure --timeout ${GSHM_TEST_TIMEOUT:-600} ${GSHM_CTEST_ARGS:-} \
    > "$out/ctest-gpu.log" 2>&1
  echo "ctest rc=$?" >> "$out/ctest-gpu.log"
  # every test's own output, passed ones too (which steps a test skipped)
  cp Testing/Temporary/LastTest.log "$out/ctest-gpu-full.log" 2>/dev/null
fi
step demo && { timeout 120 ./client/gshm-demo --gpu > "$out/demo.log" 2>&1; echo "demo rc=$?" >> "$out/demo.log"; }
# rc FILE: appends the last command's exit status to $out/FILE (the benches exit 1
# on a failure they report: a FAIL compare, a failed pull or anchor; 124: timeout)
rc() { echo "rc=$?" >> "$out/$1"; }
step attach && { timeout 200 ./bench/gshm-bench attach > "$out/bench-attach.txt" 2>&1; rc bench-attach.txt; }
step copy && { timeout 240 ./bench/gshm-bench copy ${GSHM_COPY_ARGS:---only uni,bidi,latency --reps 7} \
  > "$out/bench-copy.txt" 2>&1; rc bench-copy.txt; }
step broadcast && { timeout 300 ./bench/gshm-bench broadcast ${GSHM_BCAST_ARGS:-} \
  > "$out/bench-broadcast.txt" 2>&1; echo "broadcast rc=$?" >> "$out/bench-broadcast.txt"; }
py=$(command -v /opt/torch/.venv/bin/python3 || command -v python3)
step python && timeout 180 "$py" "$src/python/examples/share_weights.py" --gshmd "$GSHMD" --size-mib 2048 \
  --compare > "$out/python-example.txt" 2>&1
# pulls from a peer gshmd over gshm's TCP stream and its data lanes on 127.0.0.1, against
# K plain TCP connections and ucx_perftest tag_bw / ucp_am_bw (the bench runs the anchors)
if step pull; then
  pa=${GSHM_PULL_ARGS:---sizes 64M,1G --iters 5}
  # (tag_bw and ucp_am_bw run --iters times each a size: medians)
  timeout 300 ./bench/gshm-bench pull $pa > "$out/bench-pull-host.txt" 2>&1; rc bench-pull-host.txt
  timeout 150 ./bench/gshm-bench pull $pa --encrypt --no-perftest \
    > "$out/bench-pull-host-encrypt.txt" 2>&1; rc bench-pull-host-encrypt.txt
  timeout 150 ./bench/gshm-bench pull $pa --streams 1 --no-perftest \
    > "$out/bench-pull-host-1stream.txt" 2>&1; rc bench-pull-host-1stream.txt
  timeout 150 ./bench/gshm-bench pull --location cuda:0 $pa --no-perftest \
    > "$out/bench-pull-cuda.txt" 2>&1; rc bench-pull-cuda.txt
  # two GPUs: a segment of GPU 0 on one gshmd pulled onto GPU 1 by the other
  [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] &&
    { timeout 150 ./bench/gshm-bench pull --location cuda:0 --to cuda:1 $pa --no-perftest \
      > "$out/bench-pull-cuda01.txt" 2>&1; rc bench-pull-cuda01.txt; }
  # fan-out: four gshmd on this host in a chain, beside the same chain over plain TCP;
  # unpinned, and each node on 4 CPUs of its own (as separate machines) with 2 lanes;
  # pinned, n3 taking half the set from each of n1 and n2 (--split)
  fa=${GSHM_FANOUT_ARGS:---set 64x16M --iters 5}
  { timeout 200 ./bench/gshm-bench pull --fanout 3 $fa; echo "rc=$?"
    timeout 200 ./bench/gshm-bench pull --fanout 3 $fa --cpus-per-node 4 --streams 2; echo "rc=$?"
    timeout 200 ./bench/gshm-bench pull --fanout 3 $fa --cpus-per-node 4 --split --no-plain; echo "rc=$?"
    timeout 200 ./bench/gshm-bench pull --fanout 3 --model 44x1024 --iters 3; echo "rc=$?"; } \
    > "$out/bench-fanout.txt" 2>&1
  # the model as one set of device segments on GPU 0 pulled into the last GPU (staged)
  to=cuda:$(( $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') > 1 ? 1 : 0 ))
  timeout 200 ./bench/gshm-bench pull --fanout 1 --model 44x1024 --iters 3 --location cuda:0 \
    --to $to > "$out/bench-pull-model-cuda.txt" 2>&1; rc bench-pull-model-cuda.txt
fi
# the control plane on this machine's cores (the CI VM has 2): stat, open+close,
# create+unlink from 1..256 clients against the raw SOCK_SEQPACKET ping-pong floor
step control && { timeout 240 ./bench/gshm-bench control ${GSHM_CONTROL_ARGS:---clients 1,16,64,256 --repeat 3} \
  > "$out/bench-control.txt" 2>&1; rc bench-control.txt; }
# Not in the default steps (minutes, 18 GiB of disk or /dev/shm): GSHM_STEPS=restart.
# GSHM_RESTART_ARGS: more options, e.g. "--start warm --repeat 5 --cold-repeat 2".
rb=${GSHM_RESTART_BUDGET:-540}
step restart && { timeout $((rb + 30)) "$py" "$src/python/examples/restart_bench.py" --gshmd "$GSHMD" \
  --sizes ${GSHM_RESTART_SIZES:-2,16} --budget "$rb" ${GSHM_RESTART_ARGS:-} \
  --out "$out/restart.md" > "$out/restart.log" 2>&1;
  echo "restart rc=$?" >> "$out/restart.log"; cat "$out/restart.md" 2>/dev/null; }
[ -f "$out/ctest-gpu.log" ] && tail -3 "$out/ctest-gpu.log"
exit 0
