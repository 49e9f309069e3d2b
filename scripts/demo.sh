#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# README's main job: install dependencies, build, run gshm-demo (a private
# gshmd, two processes sharing a segment, gshmctl mappings, clean stop).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
exec ./build/client/gshm-demo "$@"
