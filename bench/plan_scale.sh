#!/usr/bin/env bash
# Planning scale on huge torch DCP metadata: seconds and peak RSS of fc-inspect (plain and
# --json, which locates every chunk in its item), fc-export --dry-run --include-optimizer
# and fc-convert --dry-run --target-like (the source as its own target) at 100k, 300k and
# 1M chunks, each run REPEAT times (default 3; the median and the spread are printed, as the
# machine may be shared).
#
# usage: bench/plan_scale.sh [BUILD=build] [RANKS...=410 1230 4096]
# The checkpoints (82 row-split parameters + 2 ZeRO-flattened Adam states each, one file
# per rank: chunks = 82 * 3 * RANKS; 410 -> 100,860, 1230 -> 302,580, 4096 -> 1,007,616)
# are written by bench/make_dcp_metadata_scale under $BENCH_DIR (default /tmp/fc-plan-scale;
# ~1 GB for 1M chunks) and reused. Targets: < 5 s and < 2 GB at 1M chunks on one core
# (taskset -c 0). Build with -Dbuildtype=release.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
ranks=("$@")
[[ ${#ranks[@]} -gt 0 ]] || ranks=(410 1230 4096)
repeat=${REPEAT:-3}
dir=${BENCH_DIR:-/tmp/fc-plan-scale}
# NO_BUILD=1: BUILD is just a folder with tools/ and bench/ binaries (e.g. a copy of an
# older build, for before/after figures).
[[ -n ${NO_BUILD:-} ]] || ninja -C "$build" tools/fc-inspect tools/fc-export tools/fc-convert \
  bench/make_dcp_metadata_scale >/dev/null
mkdir -p "$dir"
one_core=()
command -v taskset >/dev/null && one_core=(taskset -c 0)

measure() {  # label, command...: runs it $repeat times; prints each and the medians
  local label=$1; shift
  local log; log=$(mktemp)
  local walls=() cpus=() rsss=() rc=0
  for ((i = 0; i < repeat; ++i)); do
    rc=0
    /usr/bin/time -v "${one_core[@]}" "$@" >/dev/null 2>"$log" || rc=$?
    if [[ $rc -ne 0 ]]; then
      printf '%-36s exit %d\n' "$label" "$rc"
      tail -3 "$log" | sed 's/^/    /'
      rm -f "$log"
      return
    fi
    walls+=("$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0;
      for (i = 1; i <= n; ++i) s = s * 60 + p[i]; printf "%.2f", s}' "$log")")
    cpus+=("$(awk -F': ' '/User time/ {u = $2} /System time/ {s = $2} END {printf "%.2f", u + s}' "$log")")
    rsss+=("$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$log")")
  done
  rm -f "$log"
  median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
  printf '%-34s %7s s %7s s %6s MiB  (wall: %s; cpu: %s; MiB: %s)\n' "$label" \
    "$(median "${walls[@]}")" "$(median "${cpus[@]}")" "$(median "${rsss[@]}")" \
    "${walls[*]}" "${cpus[*]}" "${rsss[*]}"
}

# wall: elapsed; cpu: user + system seconds (what a loaded machine distorts least); medians.
printf '%-34s %9s %9s %10s\n' "run" "wall" "cpu" "peak RSS"
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
  measure "fc-inspect --json ($chunks)" "$build/tools/fc-inspect" --json "$ckpt"
  rm -rf "$dir/out"
  measure "fc-export --dry-run ($chunks)" "$build/tools/fc-export" --dry-run -q \
    --include-optimizer "$ckpt" "$dir/out"
  rm -rf "$dir/out"
  measure "fc-convert --dry-run ($chunks)" "$build/tools/fc-convert" --dry-run -q \
    --target-like "$ckpt" "$ckpt" "$dir/out"
done
