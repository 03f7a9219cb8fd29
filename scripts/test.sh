#!/usr/bin/env bash
# Installs what is missing (including PyTorch for the interop tests), builds fc with its
# tests, and runs every suite. Extra arguments go to `meson test`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --with-torch
[[ -d build-test ]] || meson setup build-test -Dtests=enabled >/dev/null
ninja -C build-test
meson test -C build-test --print-errorlogs --num-processes "$(nproc)" "$@"
