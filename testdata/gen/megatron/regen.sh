#!/usr/bin/env bash
# Regenerates testdata/torch_dcp/megatron_tiny_tp2_pp2 with real PyTorch (Debian torch 1.13):
# a tiny Llama in Megatron-Core naming at TP 2 x PP 2 (query-group fused QKV, per-rank fused
# gate/up, vocabulary 10 padded to 12).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out="${FC_TESTDATA_OUT:-$here/../..}/torch_dcp/megatron_tiny_tp2_pp2"  # FC_TESTDATA_OUT: see ../torch_dcp/regen.sh
rm -rf "$out"
/usr/bin/python3 "$here/../../../tests/support/torch_dcp_fixture.py" "$here/tiny_llama_tp2_pp2.json" "$out"
