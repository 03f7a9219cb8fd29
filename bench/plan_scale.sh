#!/usr/bin/env bash
# Planning scale on huge torch DCP metadata: seconds and peak RSS of fc-inspect and of
# fc-convert --dry-run --target-like (the source as its own target) at 100k and 1M chunks.
#
# usage: bench/plan_scale.sh [BUILD=build] [RANKS...=410 4096]
# The checkpoints (82 row-split parameters + 2 ZeRO-flattened Adam states each, one file
# per rank: chunks = 82 * 3 * RANKS; 410 -> 100,860, 4096 -> 1,007,616) are written by
# bench/make_dcp_metadata_scale under $BENCH_DIR (default /tmp/fc-plan-scale; ~1 GB for 1M
# chunks) and reused. Targets: < 5 s and < 2 GB at 1M chunks on one core (taskset -c 0).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
ranks=("$@")
[[ ${#ranks[@]} -gt 0 ]] || ranks=(410 4096)
dir=${BENCH_DIR:-/tmp/fc-plan-scale}
ninja -C "$build" tools/fc-inspect tools/fc-convert bench/make_dcp_metadata_scale >/dev/null
mkdir -p "$dir"
one_core=()
command -v taskset >/dev/null && one_core=(taskset -c 0)

measure() {  # label, command...: prints "label  seconds  peak RSS"
  local label=$1; shift
  local log; log=$(mktemp)
  local rc=0
  /usr/bin/time -v "${one_core[@]}" "$@" >/dev/null 2>"$log" || rc=$?
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f MiB", $2 / 1024}' "$log")
  printf '%-34s %10s %12s  exit %d\n' "$label" "$wall" "$rss" "$rc"
  [[ $rc -eq 0 ]] || tail -3 "$log" | sed 's/^/    /'
  rm -f "$log"
}

printf '%-34s %10s %12s\n' "run" "wall" "peak RSS"
for r in "${ranks[@]}"; do
  ckpt="$dir/r$r"
  if [[ ! -f "$ckpt/.metadata" ]]; then
    rm -rf "$ckpt"
    "$build/bench/make_dcp_metadata_scale" "$ckpt" "$r" >/dev/null
  fi
  chunks=$((82 * 3 * r))
  md=$(stat -c %s "$ckpt/.metadata")
  echo "# $chunks chunks, .metadata $((md / 1048576)) MiB"
  measure "fc-inspect ($chunks chunks)" "$build/tools/fc-inspect" "$ckpt"
  rm -rf "$dir/out"
  measure "fc-convert --dry-run ($chunks)" "$build/tools/fc-convert" --dry-run -q \
    --target-like "$ckpt" "$ckpt" "$dir/out"
done
