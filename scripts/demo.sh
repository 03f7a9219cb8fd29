#!/usr/bin/env bash
# Installs what is missing, builds fc, and runs it on the bundled sample checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[[ -d build ]] || meson setup build -Dtests=disabled >/dev/null
ninja -C build
set -x
build/tools/fc-inspect testdata/torch_dcp/sample/ckpt --verify
