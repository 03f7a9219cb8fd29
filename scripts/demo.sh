#!/usr/bin/env bash
# Installs what is missing, builds fc, and runs it on a bundled sample checkpoint written by
# real PyTorch (4 ranks, TP-split, uneven and 0-d tensors, non-tensor objects): inspect,
# verify, and export to HuggingFace safetensors. Says what it does at each step: a first
# build takes many minutes on 2 cores, and ninja's progress ([done/total]) is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }
step "1/4 Debian packages (scripts/install-deps.sh installs only what is missing)"
scripts/install-deps.sh
if [[ ! -d build ]]; then
  step "2/4 configuring the build in build/ (meson setup build -Dtests=disabled)"
  meson setup build -Dtests=disabled >/dev/null
else
  step "2/4 build/ is configured already"
fi
step "3/4 building the tools (ninja -C build; a first build takes minutes on 2 cores)"
if [[ -t 1 ]]; then
  ninja -C build  # ninja keeps its [done/total] progress on one line on a terminal
else
  # Not a terminal: one progress line every 10 compiled objects, and the last one.
  ninja -C build | awk '/^\[[0-9]+\/[0-9]+\]/ { n++; if (n % 10 == 0) print; last = $0 }
                        !/^\[[0-9]+\/[0-9]+\]/ { print } END { if (last != "") print last }'
fi
sample=testdata/torch_dcp/mixed/ckpt
out=$(mktemp -d /tmp/fc-demo.XXXXXX)
step "4/4 inspecting, verifying and exporting the sample $sample"
set -x
build/tools/fc-inspect "$sample" --verify
build/tools/fc-export "$sample" "$out/hf" --dtype float32
build/tools/fc-inspect "$out/hf"
{ set +x; } 2>/dev/null
step "done"
echo "tools:    build/tools/fc-inspect, fc-export, fc-convert, fc-diff (man pages in man/)"
echo "produced: $out/hf ($(ls "$out/hf" | tr '\n' ' '))"
echo "next, compare the export with its source, tensor by tensor (as values: it was cast to float32):"
echo "  build/tools/fc-diff $sample $out/hf --rtol 0"
echo "or plan a reshard without writing anything:"
echo "  build/tools/fc-convert $sample $out/tp1 --target-like $sample --dry-run"
echo "install (tools into PREFIX/bin, man pages into PREFIX/share/man):"
echo "  meson configure build --prefix=\$HOME/.local && meson install -C build"
