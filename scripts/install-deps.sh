#!/usr/bin/env bash
# Installs the Debian packages fc needs to build and test, skipping those already present.
# Usage: scripts/install-deps.sh [--with-torch]   (--with-torch: PyTorch for interop tests)
set -euo pipefail
pkgs=(g++ meson ninja-build pkg-config libcli11-dev libspdlog-dev libsimdjson-dev catch2
      libxxhash-dev libre2-dev libzstd-dev libjemalloc-dev libopenmpi-dev openmpi-bin python3 python3-numpy
      clang libclang-rt-14-dev)  # clang + libFuzzer runtime: scripts/fuzz.sh
if [[ "${1:-}" == "--with-torch" ]]; then
  pkgs+=(python3-torch zstd)  # zstd: the CLI that testdata/gen/torch2 compresses items with
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
