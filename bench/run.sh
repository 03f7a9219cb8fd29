#!/usr/bin/env bash
# fc-export / fc-convert throughput and memory against `cp -r` of the same source, in the
# same run.
#
# usage: bench/run.sh export|export-torch|export-deepspeed|convert|convert-np2 [SIZE_GB=1] [RUNS=3] [BUDGET=512MiB] [BUILD=build]
# Writes a synthetic TP-8 bfloat16 fc distcp checkpoint of SIZE_GB under $BENCH_DIR
# (default /tmp/fc-bench), warms the page cache, then times RUNS copies with cp -r and RUNS
# runs of the tool (median of each; the two take turns going first), and reports:
#   ratio = median cp seconds / median tool seconds   (targets: export >= 1.2, convert >= 1.0)
#   peak RSS of the tool against --memory-budget      (target <= budget + 64 MB)
# export: to HF safetensors (5GB shards). export-torch: the same, from the same tensors as a
# PyTorch DCP checkpoint (torch.save items inside .distcp files, written by fc-convert
# --output-format torch-dcp), the input most users have. convert: TP 8 -> TP 2 x sharding 2, where
# every tensor's TP-2 block is flattened and cut in two ZeRO-1 style ranges (rows cut mid-way).
# convert-np2: the same convert under `mpirun -np 2`, against `mpirun -np 1` as the baseline
# instead of cp (ratio = np 1 time / np 2 time; target >= 1/1.1), same output bytes; np 1 runs
# with --bind-to none, so that it has every core as np 2 has (Open MPI binds a lone process to
# one core, which takes its second worker thread's core away). The
# one-process convert without mpirun is timed too and its ratio printed: it does not pay
# Open MPI's launch and finalize (about 0.1 s here, a fifth of a 1 GB run).
# export-deepspeed: a DeepSpeed ZeRO-2 dp 8 checkpoint of SIZE_GB (fp16 module + 8 optimizer
# files, written by bench/make_deepspeed_ckpt.py with Debian's torch, a few seconds per GB)
# exported with `fc-export --include-optimizer` (fp32 master weights, exp_avg, exp_avg_sq,
# step: everything the optimizer files hold) against cp of those optimizer files (the bytes
# the export reads) + sync (target ratio >= 0.8).
# On one machine mpirun gets the shared-memory transport (FC_BENCH_MPI_ARGS, default
# "--mca pml ob1 --mca btl self,vader": Open MPI's default probes network transports first,
# which adds about 0.25 s to MPI_Init here).
# The last run also writes --stats: bytes read / bytes needed is printed with the times.
# FC_BENCH_FLAGS: extra flags for the timed tool runs, e.g. "--no-verify-checksums" to
# measure what checksum verification costs (run both, compare the medians).
# The disk's limit, measured in the same run: `dd if=/dev/zero bs=4M conv=fsync` of the
# tool's output byte count (the durable write limit) is timed in every round, and the same
# with oflag=direct (on this kind of VM a buffered write flushed by one final fsync can be
# slower than the direct one when other writers load the host), and
#   write-limit fraction = median of the faster dd / median tool seconds   (target >= 0.95).
# COLD=1: the page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches; needs root)
# before every timed run, the cold sequential read of the input (cat of every input file) is
# timed too, and the fraction is taken against the slower of that read and the dd write
# (target >= 0.9). Without root COLD=1 stops with a message instead of timing a warm cache.
# COLD=1 also times that read and the oflag=direct write running at once (cat & dd): what the
# disk allows a job that does both; on a disk whose reads and writes share one channel that
# takes about their sum, and the fraction against it is printed too.
# Rounds rotate the order (tool, dd, baseline / dd, baseline, tool) so that no side always
# runs right after another's write-back.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?export or convert}; size_gb=${2:-1}; runs=${3:-3}; budget=${4:-512MiB}; build=${5:-build}
dir=${BENCH_DIR:-/tmp/fc-bench}
ninja -C "$build" tools/fc-export tools/fc-convert tools/fc-inspect bench/make_synthetic_ckpt >/dev/null
src="$dir/src-${size_gb}g"
if [[ $mode == export-deepspeed ]]; then
  src="$dir/ds-zero2-dp8-${size_gb}g"
  if [[ ! -f "$src/latest" ]]; then
    rm -rf "$src"; mkdir -p "$dir"
    /usr/bin/python3 bench/make_deepspeed_ckpt.py "$src" "$size_gb" 8
  fi
elif [[ ! -f "$src/fc.metadata.json" ]]; then
  rm -rf "$src"; mkdir -p "$dir"
  "$build/bench/make_synthetic_ckpt" "$src" "$(python3 -c "print(int($size_gb * 1e9))")" 8
fi
if [[ $mode == export-torch ]]; then
  tsrc="$dir/src-${size_gb}g-torch"
  if [[ ! -f "$tsrc/.metadata" ]]; then
    rm -rf "$tsrc"
    "$build/tools/fc-convert" "$src" "$tsrc" --target-like "$src" --output-format torch-dcp \
        --torch-version 1.13 --quiet
  fi
  src=$tsrc
fi
cold=${COLD:-0}
drop_cache() {
  [[ $cold == 1 ]] || return 0
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || {
    echo "COLD=1: cannot drop the page cache here (needs root and a writable" \
         "/proc/sys/vm/drop_caches); run warm (COLD=0) or as root" >&2
    exit 1
  }
}
# The files the tool reads (export-deepspeed: the optimizer files).
input_files() {
  if [[ $mode == export-deepspeed ]]; then
    printf '%s\0' "$src"/global_step1/*_optim_states.pt
  else
    find "$src" -type f -print0
  fi
}
[[ $cold == 1 ]] || input_files | xargs -0 cat > /dev/null   # warm cache
if [[ $mode == convert || $mode == convert-np2 ]]; then
  "$build/tools/fc-inspect" "$src" --json > "$dir/src.json"
  python3 - "$dir/src.json" "$dir/tp2-zero2.json" <<'PY'
import json, sys
src = json.load(open(sys.argv[1])); tp, sharding = 2, 2
ranks = [{"rank": r, "chunks": []} for r in range(tp * sharding)]
for t in src["tensors"]:
    shape = t["global_shape"]
    axis = 0 if t["chunks"][0]["local_shape"][0] != shape[0] else 1
    for r in range(tp):
        off, loc = [0, 0], list(shape)
        off[axis] = r * shape[axis] // tp; loc[axis] = shape[axis] // tp
        n = loc[0] * loc[1]; cut = n // 2 + loc[1] // 2   # cuts a row
        for s, rng in enumerate(([0, cut], [cut, n])):
            ranks[r * sharding + s]["chunks"].append({"key": t["key"], "global_offset": off,
                "local_shape": loc, "flattened_range": rng, "replica_id": 0})
json.dump({"format": "fc-layout-manifest", "version": 1,
           "tensors": [{"key": t["key"], "dtype": t["dtype"], "global_shape": t["global_shape"]} for t in src["tensors"]],
           "ranks": ranks}, open(sys.argv[2], "w"))
PY
fi
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
cp_times=(); fc_times=(); rss=(); plain_times=(); dd_times=(); direct_times=(); read_times=(); both_times=()
out_bytes=0
# The baseline and the tool take turns going first: on this kind of VM the second of two
# back-to-back writes of gigabytes waits for the first's write-back, which would otherwise
# always count against the same side.
run_baseline() {
  local t0 t1
  drop_cache
  t0=$(date +%s.%N)
  if [[ $mode == convert-np2 ]]; then
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe ${FC_BENCH_MPI_ARGS---mca pml ob1 --mca btl self,vader} \
        --bind-to none -np 1 "$build/tools/fc-convert" "$src" "$dir/cp-out" \
        --target-manifest "$dir/tp2-zero2.json" --memory-budget "$budget" --quiet
    sync; t1=$(date +%s.%N)
    cp_times+=("$(echo "$t1 - $t0" | bc)")
    rm -rf "$dir/plain-out"; sync; drop_cache; t0=$(date +%s.%N)
    "$build/tools/fc-convert" "$src" "$dir/plain-out" --target-manifest "$dir/tp2-zero2.json" \
        --memory-budget "$budget" --quiet
    sync; t1=$(date +%s.%N)
    plain_times+=("$(echo "$t1 - $t0" | bc)")
    rm -rf "$dir/plain-out"
    return
  elif [[ $mode == export-deepspeed ]]; then   # the files the export reads
    mkdir -p "$dir/cp-out"; cp "$src"/global_step1/*_optim_states.pt "$dir/cp-out/"
  else
    cp -r "$src" "$dir/cp-out"
  fi
  sync; t1=$(date +%s.%N)
  cp_times+=("$(echo "$t1 - $t0" | bc)")
}
run_tool() {
  local t0 t1 stats=()
  drop_cache
  t0=$(date +%s.%N)
  [[ $i == "$runs" ]] && stats=(--stats "$dir/stats.json")
  if [[ $mode == export || $mode == export-torch ]]; then
    /usr/bin/time -f "%M" -o "$dir/rss.txt" "$build/tools/fc-export" "$src" "$dir/fc-out" \
        --memory-budget "$budget" --quiet "${stats[@]}" ${FC_BENCH_FLAGS:-}
  elif [[ $mode == export-deepspeed ]]; then
    # shellcheck disable=SC2086
    /usr/bin/time -f "%M" -o "$dir/rss.txt" "$build/tools/fc-export" "$src" "$dir/fc-out" \
        --include-optimizer --memory-budget "$budget" --quiet "${stats[@]}" ${FC_BENCH_FLAGS:-}
  elif [[ $mode == convert-np2 ]]; then
    # shellcheck disable=SC2086
    /usr/bin/time -f "%M" -o "$dir/rss.txt" mpirun --allow-run-as-root --oversubscribe \
        ${FC_BENCH_MPI_ARGS---mca pml ob1 --mca btl self,vader} -np 2 \
        "$build/tools/fc-convert" "$src" "$dir/fc-out" --target-manifest "$dir/tp2-zero2.json" \
        --memory-budget "$budget" --quiet "${stats[@]}" ${FC_BENCH_FLAGS:-}
  else
    /usr/bin/time -f "%M" -o "$dir/rss.txt" "$build/tools/fc-convert" "$src" "$dir/fc-out" \
        --target-manifest "$dir/tp2-zero2.json" --memory-budget "$budget" --quiet "${stats[@]}" \
        ${FC_BENCH_FLAGS:-}
  fi
  sync; t1=$(date +%s.%N)
  fc_times+=("$(echo "$t1 - $t0" | bc)")
  rss+=("$(cat "$dir/rss.txt")")
  out_bytes=$(du -sb "$dir/fc-out" | cut -f1)
}
# The durable write limit for the tool's output bytes (4 MiB blocks, rounded up), and on a
# cold cache the sequential read of the input.
run_limit() {
  local t0 t1
  rm -f "$dir/dd-out"; sync
  t0=$(date +%s.%N)
  dd if=/dev/zero of="$dir/dd-out" bs=4M count=$(( (out_bytes + (4 << 20) - 1) >> 22 )) \
      conv=fsync status=none
  t1=$(date +%s.%N)
  dd_times+=("$(echo "$t1 - $t0" | bc)")
  rm -f "$dir/dd-out"; sync
  t0=$(date +%s.%N)
  dd if=/dev/zero of="$dir/dd-out" bs=4M count=$(( (out_bytes + (4 << 20) - 1) >> 22 )) \
      oflag=direct conv=fsync status=none
  t1=$(date +%s.%N)
  direct_times+=("$(echo "$t1 - $t0" | bc)")
  rm -f "$dir/dd-out"; sync
  if [[ $cold == 1 ]]; then
    drop_cache
    t0=$(date +%s.%N)
    input_files | xargs -0 cat > /dev/null
    t1=$(date +%s.%N)
    read_times+=("$(echo "$t1 - $t0" | bc)")
    # Both at once: what the disk gives a job that reads and writes together (on a virtual
    # disk the two may share one channel, so that this takes about their sum).
    rm -f "$dir/dd-out"; sync; drop_cache
    t0=$(date +%s.%N)
    input_files | xargs -0 cat > /dev/null &
    dd if=/dev/zero of="$dir/dd-out" bs=4M count=$(( (out_bytes + (4 << 20) - 1) >> 22 )) \
        oflag=direct conv=fsync status=none
    wait
    t1=$(date +%s.%N)
    both_times+=("$(echo "$t1 - $t0" | bc)")
    rm -f "$dir/dd-out"; sync
  fi
}
for i in $(seq "$runs"); do
  rm -rf "$dir/cp-out" "$dir/fc-out"; sync
  if (( i % 2 == 1 )); then   # the first round starts with the tool: dd needs its byte count
    run_tool
    if [[ $mode == convert-np2 ]]; then run_limit; else rm -rf "$dir/fc-out"; sync; run_limit; fi
    run_baseline
  else
    run_limit
    run_baseline
    [[ $mode == convert-np2 ]] || { rm -rf "$dir/cp-out"; sync; }
    run_tool
  fi
  if [[ $mode == convert-np2 ]]; then  # not timed: the same bytes as np 1
    diff -r "$dir/cp-out" "$dir/fc-out" >/dev/null || { echo "np 2 output differs from np 1"; exit 1; }
  fi
  rm -rf "$dir/cp-out" "$dir/fc-out"
done
cp_med=$(printf '%s\n' "${cp_times[@]}" | median)
fc_med=$(printf '%s\n' "${fc_times[@]}" | median)
plain_med=0
if [[ $mode == convert-np2 ]]; then plain_med=$(printf '%s\n' "${plain_times[@]}" | median); fi
rss_med=$(printf '%s\n' "${rss[@]}" | median)
dd_med=$(printf '%s\n' "${dd_times[@]}" | median)
direct_med=$(printf '%s\n' "${direct_times[@]}" | median)
read_med=0 both_med=0
if [[ $cold == 1 ]]; then
  read_med=$(printf '%s\n' "${read_times[@]}" | median)
  both_med=$(printf '%s\n' "${both_times[@]}" | median)
fi
bytes=$(du -sb "$src" | cut -f1)
if [[ $mode == export-deepspeed ]]; then
  bytes=$(du -cb "$src"/global_step1/*_optim_states.pt | tail -1 | cut -f1)
fi
budget_bytes=$(python3 - "$budget" <<'PY'
import re, sys
m = re.fullmatch(r"([\d.]+)\s*([a-zA-Z]*)", sys.argv[1]); v = float(m.group(1)); u = m.group(2).lower()
mult = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
        "kib": 2**10, "mib": 2**20, "gib": 2**30}[u]
print(int(v * mult))
PY
)
python3 - "$bytes" "$cp_med" "$fc_med" "$rss_med" "$budget_bytes" "${cp_times[*]}" "${fc_times[*]}" "$dir/stats.json" "$plain_med" "${plain_times[*]}" "$dd_med" "$out_bytes" "$read_med" "$cold" "$direct_med" "$both_med" <<'PY'
import json, sys
s = json.load(open(sys.argv[8]))
read = sum(p["bytes_read"] for p in s["processes"])
print(f"bytes read / bytes needed: {read} / {s['bytes_needed']} = {read / max(1, s['bytes_needed']):.3f}")
b, cp, fc, rss_kb, budget = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(f"source: {b/1e9:.2f} GB; runs baseline: {sys.argv[6]} s; fc: {sys.argv[7]} s")
print(f"cp median {cp:.2f} s ({b/cp/1e9:.2f} GB/s); tool median {fc:.2f} s ({b/fc/1e9:.2f} GB/s)")
print(f"ratio (baseline time / tool time): {cp/fc:.2f}   (baseline: cp + sync, or mpirun -np 1 for convert-np2)")
if float(sys.argv[9]) > 0:
    plain = float(sys.argv[9])
    print(f"one process without mpirun: {sys.argv[10]} s, median {plain:.2f} s; its time / np 2 time: {plain/fc:.2f}")
dd, out_b, rd, cold = float(sys.argv[11]), int(sys.argv[12]), float(sys.argv[13]), sys.argv[14] == "1"
direct, both = float(sys.argv[15]), float(sys.argv[16])
print(f"cache: {'cold (dropped before every timed run)' if cold else 'warm'}")
print(f"durable write limit: dd conv=fsync of {out_b/1e9:.2f} GB: median {dd:.2f} s ({out_b/dd/1e9:.2f} GB/s); "
      f"with oflag=direct: median {direct:.2f} s ({out_b/direct/1e9:.2f} GB/s)")
best = min(dd, direct)
print(f"write-limit fraction (faster dd time / tool time): {best/fc:.3f}   target >= 0.95   "
      f"(conv=fsync alone: {dd/fc:.3f})")
if cold:
    limit = max(best, rd)
    print(f"cold sequential read of the input: median {rd:.2f} s ({b/rd/1e9:.2f} GB/s); "
          f"fraction of the slower of read and write ({limit:.2f} s): {limit/fc:.3f}   target >= 0.9")
    print(f"cold read of the input and dd oflag=direct of the output at once: median {both:.2f} s "
          f"(their sum {rd + direct:.2f} s); fraction of that: {both/fc:.3f}")
print(f"peak RSS {rss_kb/1024:.0f} MiB; budget {budget/2**20:.0f} MiB; "
      f"over budget by {(rss_kb*1024-budget)/2**20:.0f} MiB   target <= 64 MiB")
PY
