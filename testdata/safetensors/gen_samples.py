#!/usr/bin/python3
"""Regenerates testdata/safetensors/ deterministically, independently of fc.

It follows the reference writer's rules (shared/reference/formats.md section 6), written
from scratch with json + numpy so the files are an independent check on fc's reader and on
fc's writer (tests/format/safetensors compares fc's output for the same tensors byte for
byte):
  - header: compact JSON, "__metadata__" first, tensors sorted by descending dtype
    alignment (upstream Dtype enum order) then name, data in that order;
  - header padded with spaces so N % 8 == 0;
  - shards: huggingface_hub greedy split (no tensor here exceeds the limit), 1-based
    5-digit names, model.safetensors.index.json via json.dumps(indent=2, sort_keys=True).

Usage: /usr/bin/python3 testdata/safetensors/gen_samples.py   (from anywhere)
Writes:
  upstream_attn0.safetensors         the 64-byte header test vector (F32 [1,2,3])
  worked_bf16_bool.safetensors       formats.md 6.1 worked example
  hf_sharded/model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
"""
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# Upstream safetensors Dtype enum order (tensor.rs); the writer sorts by it, descending.
RANK = {"BOOL": 0, "U8": 1, "I8": 2, "F8_E5M2": 3, "F8_E4M3": 4, "I16": 5, "U16": 6,
        "F16": 7, "BF16": 8, "I32": 9, "U32": 10, "F32": 11, "F64": 12, "I64": 13, "U64": 14}


def bf16_bits(values):
    """float32 values that are exact in bfloat16 -> their bf16 bit patterns (uint16)."""
    f = np.asarray(values, dtype="<f4")
    return (f.view("<u4") >> 16).astype("<u2")


def save_file(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, raw little-endian bytes)."""
    ordered = sorted(tensors, key=lambda t: (-RANK[t[1]], t[0]))
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in ordered:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in ordered:
            f.write(data)


def main():
    attn = np.arange(6, dtype="<f4").reshape(1, 2, 3)
    save_file(os.path.join(HERE, "upstream_attn0.safetensors"),
              [("attn.0", "F32", (1, 2, 3), attn.tobytes())])

    save_file(os.path.join(HERE, "worked_bf16_bool.safetensors"),
              [("b", "BOOL", (3,), bytes([1, 0, 1])),
               ("a", "BF16", (2,), bf16_bits([1.0, 2.0]).tobytes())],
              metadata={"format": "pt"})

    # A small "model", in state-dict order, split at 160 bytes of tensor data.
    state = [
        ("embed.weight", "F32", (8, 4), (np.arange(32, dtype="<f4") * 0.5 - 4).tobytes()),
        ("layers.0.attn.q.weight", "BF16", (4, 4),
         bf16_bits((np.arange(16) - 8) * 0.25).tobytes()),
        ("layers.0.norm.weight", "F16", (4,), np.full(4, 1.5, dtype="<f2").tobytes()),
        ("layers.0.mask", "BOOL", (5,), bytes([1, 0, 1, 1, 0])),
        ("layers.0.step", "I64", (), np.array(1234, dtype="<i8").tobytes()),
        ("head.bias", "F32", (0,), b""),
    ]
    max_shard = 160
    shards, current, size = [], [], 0
    for t in state:
        n = len(t[3])
        if current and size + n > max_shard:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += n
    shards.append(current)
    out = os.path.join(HERE, "hf_sharded")
    os.makedirs(out, exist_ok=True)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        save_file(os.path.join(out, name), shard, metadata={"format": "pt"})
        for t in shard:
            weight_map[t[0]] = name
    index = {"metadata": {"total_size": sum(len(t[3]) for t in state)},
             "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
