#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# README's test command: install dependencies, then build and run the whole
# suite twice: a normal build, and an ASan/UBSan build of everything.
# GPU tests (label gpu) report "skipped" where the GPUs are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc)

echo "== build and test (RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== build and test (ASan + UBSan)"
# The CUDA kernels are the same fatbin either way; the sanitizers are for
# the C code, so this build skips nvcc.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGSHM_SANITIZE=address,undefined \
      -DGSHM_WITH_CUDA=OFF
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j"$jobs" -LE valgrind)

echo "== fuzz targets (clang + libFuzzer, 20 s each, on the seed corpus)"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGSHM_WITH_CUDA=OFF
cmake --build build-fuzz -j"$jobs" --target fuzz
tests/fuzz/run.sh 20 build-fuzz
