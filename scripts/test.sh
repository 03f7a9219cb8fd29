#!/usr/bin/env bash
# Installs what is missing (including Debian's PyTorch 1.13 for interop tests), builds fc with
# its tests, and runs every suite but `real` (the real frameworks: scripts/interop.sh).
# Extra arguments go to `meson test` (and replace the default `--no-suite real`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --with-torch
[[ -d build-test ]] || meson setup build-test -Dtests=enabled >/dev/null
ninja -C build-test
(($#)) || set -- --no-suite real
meson test -C build-test --print-errorlogs --num-processes "$(nproc)" "$@"
