#!/usr/bin/env bash
# Installs what is missing, builds fc, and runs it on a bundled sample checkpoint written by
# real PyTorch (4 ranks, TP-split, uneven and 0-d tensors, non-tensor objects): inspect,
# verify, and export to HuggingFace safetensors.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[[ -d build ]] || meson setup build -Dtests=disabled >/dev/null
ninja -C build >/dev/null
sample=testdata/torch_dcp/mixed/ckpt
out=$(mktemp -d /tmp/fc-demo.XXXXXX)
set -x
build/tools/fc-inspect "$sample" --verify
build/tools/fc-export "$sample" "$out/hf" --dtype float32
build/tools/fc-inspect "$out/hf"
