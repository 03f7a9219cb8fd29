#!/usr/bin/env bash
# fc beside the frameworks' own converters (issue 31 item 1): same machine, same data, each
# pair's outputs checked equal, medians of RUNS, warm and cold page cache.
#
# usage: bench/peers.sh [SIZE_GB=1] [RUNS=3] [PAIRS=all]
#   env: BENCH_DIR (default /tmp/fc-bench), BUILD (default build-peers: a release build,
#        `meson setup build-peers -Dbuildtype=release`), COLD=auto|yes|no (default auto)
#   PAIRS: comma-separated subset of
#     ds-zero2-fp32  DeepSpeed ZeRO-2 save -> fp32 weights: `python -m
#                    deepspeed.utils.zero_to_fp32 CKPT OUT --safe_serialization` (0.19.8;
#                    convert_zero_checkpoint_to_fp32_state_dict, 5GB shards) vs fc-export
#     ds-zero3-fp32  the same from a ZeRO-3 save
#     ds-zero2-ucp   DeepSpeed tag dir -> Universal Checkpoint: `python -m
#                    deepspeed.checkpoint.ds_to_universal --inject_missing_state` with its
#                    default workers (4 extract, 2 merge) and with 2 + 2, vs
#                    `fc-convert TAG OUT --output-format ucp` (--inject_missing_state: the
#                    saves carry no universal_checkpoint_info; at TP 1 it only supplies that)
#     dcp-export     torch 2.15 DCP (2 ranks, FSDP2) -> one file: dcp_to_torch_save (.pt), and
#                    dcp_to_torch_save + torch.load(mmap) + safetensors save_file of the
#                    flattened tensors (bench/peers/torch_peer.py), vs `fc-export
#                    --include-optimizer` (safetensors; the same tensors under the same names)
#     dcp-reshard    torch DCP 2 ranks -> 1: dcp.load into tensors allocated from .metadata +
#                    dcp.save, one process, vs `fc-convert --target-layout {"degrees": {}}
#                    --output-format torch-dcp --torch-version 2`
#     paddle-merge   Paddle 3.3.1 save_state_dict of 2 ranks -> safetensors: Paddle's
#                    flex_checkpoint merge_sharded_state_dict (one process) vs `fc-export
#                    --include-optimizer`
#   Megatron-Core 0.16.1 ships no checkpoint conversion tool in its wheel (Megatron-LM's
#   tools/checkpoint is not part of it; megatron.core.resharding refits live weights).
#
# Inputs, written once by the frameworks themselves on CPU and kept under $BENCH_DIR
# (bench/peers/make_ds.py, make_dcp.py, make_paddle.py; a few minutes at 1 GB): about SIZE_GB
# of model + optimizer state each (DeepSpeed bf16 + AdamW, 2 ranks, one step; torch FSDP2 fp32
# + AdamW, 2 ranks, one step; Paddle fp32 weights + 2 moments, 2 ranks).
#
# What is measured (bench/peers/measure.py wraps every run; bench/peers/bench.py loops):
#   time      median wall seconds of the command + a sync(2) after it (fc fsyncs its
#             output, the peers leave theirs in the page cache: both are timed to "on disk");
#             the time without the sync is shown in parentheses
#   peak RSS  "1 proc": wait4's ru_maxrss, the largest resident set of any one process of
#             the tree; "tree": the largest sum of VmRSS over the process tree, sampled every
#             20 ms (the workers of ds_to_universal / torchrun run at once). Ratios use tree.
#   rchar     bytes the process tree's read calls returned (/proc/PID/io rchar, the wrapper's
#             own counter after reaping the tree): page-cache hits included, mmap() reads not
#             (safetensors/torch mmap loads do not show here)
#   read_bytes  bytes fetched from the block device for the tree (/proc/PID/io read_bytes):
#             ~0 warm; cold, what really came off the disk, mmap faults included
#   fc --stats  fc's own count of source bytes read (sum over processes of bytes_read)
#   peer/fc   peer median time / fc median time (speed ratio; target >= 5), and peer tree
#             RSS / fc RSS (target >= 10)
#   load      the 1-minute load average before the runs (median): other work on the machine
#   disk rows "disk: dd write (direct)" (dd if=/dev/zero bs=4M oflag=direct conv=fsync of
#             fc's output bytes; "disk: dd write" in tables before 2026-12-07 17:00 UTC, a
#             buffered dd conv=fsync, slower on this VM) and, cold, "disk: cat read" (the input
#             files read once): run in the same rotation as the tools; the slower is the disk floor, printed with fc's fraction of it and
#             peer time / floor, the largest speed ratio this disk lets any converter show
# Warm: the source is read once before each run. Cold: sync; echo 3 > /proc/sys/vm/drop_caches
# before each run, then the tool's code read back in untimed (`fc-export --help`; the peer's
# python importing torch/DeepSpeed/Paddle, ~1.2 GB of libraries): cold is the input off the
# disk, not the tools' start-up. Where drop_caches cannot be written the output says so and
# only warm runs are made.
# In the first warm round every peer's output is compared with fc's, tensor by tensor, bit for
# bit (bench/peers/compare.py); a difference is printed as MISMATCH and the script exits 1.
# Results: a table on stdout and $BENCH_DIR/peers-SIZEg.json (every run's figures;
# peers-SIZEg-PAIR+PAIR.json for a subset of PAIRS).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1}; runs=${2:-3}; pairs=${3:-}
dir=${BENCH_DIR:-/tmp/fc-bench}; build=${BUILD:-build-peers}
tpy=~/.cache/fc-interop/torch/bin/python; ppy=~/.cache/fc-interop/paddle/bin/python
[[ -x $tpy ]] || { echo "no interop env at $tpy (scripts/interop.sh)"; exit 2; }
ninja -C "$build" tools/fc-export tools/fc-convert tools/fc-inspect >/dev/null
build=$(cd "$build" && pwd)
mkdir -p "$dir"
want() { [[ -z $pairs || ,$pairs, == *,$1,* ]]; }
gen() {  # gen DIR CMD...: write DIR once (into DIR.tmp, renamed when complete)
  local d=$1; shift
  [[ -d $d ]] && return 0
  rm -rf "$d.tmp"
  echo "writing $d ..."
  if "$@" "$d.tmp"; then mv "$d.tmp" "$d"; else echo "could not write $d"; rm -rf "$d.tmp"; fi
}
want ds-zero2-fp32 || want ds-zero2-ucp && gen "$dir/peers-ds-zero2-${size}g" \
  bash -c "$tpy bench/peers/make_ds.py \"\$0\" 2 $size"
want ds-zero3-fp32 && gen "$dir/peers-ds-zero3-${size}g" \
  bash -c "$tpy bench/peers/make_ds.py \"\$0\" 3 $size"
want dcp-export || want dcp-reshard && gen "$dir/peers-dcp-${size}g" \
  bash -c "$tpy bench/peers/make_dcp.py \"\$0\" $size"
if want paddle-merge; then
  if [[ -x $ppy ]]; then
    gen "$dir/peers-paddle-${size}g" bash -c "$ppy bench/peers/make_paddle.py \"\$0\" $size"
  else
    echo "paddle-merge: no Paddle interop env at $ppy, skipped"
  fi
fi
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; load $(cut -d' ' -f1-3 /proc/loadavg); build $build"
exec python3 bench/peers/bench.py --dir "$dir" --size "$size" --runs "$runs" --build "$build" \
  --pairs "$pairs" --cold "${COLD:-auto}"
