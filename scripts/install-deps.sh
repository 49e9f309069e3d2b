#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages gshm builds, tests and runs with.
# Idempotent: does nothing when everything is already there.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libinih-dev
  libjansson-dev libcmocka-dev libmicrohttpd-dev
  libucx-dev ucx-utils libsodium-dev libssl-dev
  clang libclang-rt-14-dev valgrind
  python3 python3-pytest python3-numpy mypy
  systemd
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
