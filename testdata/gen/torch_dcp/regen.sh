#!/bin/sh
# Regenerates testdata/torch_dcp/<name>/{ckpt,expected} with Debian's torch 1.13
# (apt-get install python3-torch python3-numpy). Deterministic: same specs, same bytes.
#
#   <name>.json        -> tests/support/torch_dcp_fixture.py (real multi-rank DCP saves)
#   ../torch_dcp_adam/{fsdp_adam,fsdp_adam_steps,megatron_dist,megatron_reshardable,megatron_dp_reshardable} -> make_fsdp_adam.py (steps made whole numbers)
#   ../torch_dcp_adam/megatron_flattened -> make_megatron_flattened.py (pre-0.14 N-D reformulated optimizer states + mcore_data)
#   strided            -> make_strided.py (views: transposed, storage_offset, stride 0, 0-d)
#   torch2_emulated    -> emulate_torch2.py applied to `mixed` (2.x module paths, enum by
#                         value, PosixPath of CPython 3.13, one file per rank, mcore_data)
#
# Every generator but the shared writer's plain .json runs ends by asserting, with
# dcp_truth.py, that the expected/ it wrote (and, except for the dp_buckets family, the
# checkpoint read back by dcp_truth's own reader) equal the values it built the files from,
# bit for bit (issue 34 item 3); a failed assertion stops this script.
#
# usage: testdata/gen/torch_dcp/regen.sh   (from anywhere)
#   FC_TESTDATA_OUT=DIR: write DIR/torch_dcp and DIR/torch_dcp_adam instead of testdata/
#   (tests/format/torch/torch_dcp_generators.sh regenerates there and compares with the
#   committed bytes); FC_TOOLS=DIR: the fixture writer and torch 1.13 shim (default
#   tests/support, the repository's copies of the team's shared/tools)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
tools=$(cd "${FC_TOOLS:-$repo/tests/support}" && pwd)
root=${FC_TESTDATA_OUT:-$repo/testdata}
out=$root/torch_dcp
mkdir -p "$root/torch_dcp_adam"
py=/usr/bin/python3

mkdir -p "$out"
for spec in "$here"/*.json; do
  name=$(basename "$spec" .json)
  rm -rf "$out/$name"
  "$py" "$tools/torch_dcp_fixture.py" "$spec" "$out/$name"
done
rm -rf "$out/../torch_dcp_adam/fsdp_adam" "$out/../torch_dcp_adam/fsdp_adam_steps" \
  "$out/../torch_dcp_adam/megatron_dist" "$out/../torch_dcp_adam/megatron_reshardable" \
  "$out/../torch_dcp_adam/megatron_dp_reshardable" "$out/../torch_dcp_adam/megatron_flattened" \
  "$out/../torch_dcp_adam/megatron_dp_buckets" "$out/../torch_dcp_adam/megatron_dp_buckets_aligned" \
  "$out/../torch_dcp_adam/megatron_dp_zero"
"$py" "$here/make_fsdp_adam.py" "$tools" "$out/../torch_dcp_adam"
"$py" "$here/make_megatron_flattened.py" "$tools" "$out/../torch_dcp_adam"
"$py" "$here/make_megatron_dp_buckets.py" "$tools" "$out/../torch_dcp_adam"
rm -rf "$out/strided"
"$py" "$here/make_strided.py" "$tools" "$out/strided"
"$py" "$here/emulate_torch2.py" "$tools" "$out/mixed" "$out/torch2_emulated"
# torch 2.4-2.9 variants of `mixed` (needs the zstd CLI: apt-get install zstd)
"$py" "$here/../torch2/make_torch2.py" "$tools" "$out"
find "$here/../torch2" -name __pycache__ -prune -exec rm -rf {} +
find "$out" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$out"
