"""Independent readers for the CLI tests: safetensors via json + numpy (no fc code), .npy via
numpy, and helpers to run the fc tools."""
import json
import os
import struct
import subprocess

import numpy as np

ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
             "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
             "BOOL": np.bool_, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


def read_safetensors(path):
    """{name: (dtype string, numpy array)}; bf16/f8 come back as raw bit patterns."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    buf = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(buf[b:e], dtype=ST_DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
    return out


def read_hf_dir(path):
    """Reads model.safetensors or the sharded layout; checks the index's consistency."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(path, "model.safetensors")), None
    index = json.load(open(index_path))
    tensors = {}
    total = 0
    for f in sorted(set(index["weight_map"].values())):
        for name, (dt, arr) in read_safetensors(os.path.join(path, f)).items():
            assert index["weight_map"][name] == f, (name, f)
            tensors[name] = (dt, arr)
            total += arr.nbytes
    assert set(tensors) == set(index["weight_map"]), "index and files disagree"
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    return tensors, index


def expected_values(fixture):
    exp = os.path.join(fixture, "expected")
    return {f[:-4]: np.load(os.path.join(exp, f)) for f in sorted(os.listdir(exp))
            if f.endswith(".npy")}


def bits(a):
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8) if a.ndim else a.reshape(1).view(np.uint8)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).reshape(-1).astype(np.uint32) << 16).view(np.float32)


def same_tensors(got, want, label, subset=False):
    """Asserts that got and want ({name: (safetensors dtype, array)}, as read_safetensors
    gives them) hold the same names (subset: every name of want is in got), dtypes, shapes
    and bytes; the message lists every tensor that differs."""
    missing = sorted(set(want) - set(got))
    extra = [] if subset else sorted(set(got) - set(want))
    assert not missing and not extra, f"{label}: missing {missing}, unexpected {extra}"
    bad = []
    for name, (dt, arr) in want.items():
        gdt, garr = got[name]
        if gdt != dt or garr.shape != arr.shape:
            bad.append(f"{name}: fc {gdt}{list(garr.shape)} vs {dt}{list(arr.shape)}")
        elif bits(garr).tobytes() != bits(arr).tobytes():
            bad.append(f"{name}: values differ (max |d| "
                       f"{np.max(np.abs(garr.astype(np.float64) - arr.astype(np.float64)))})")
    assert not bad, f"{label}:\n  " + "\n  ".join(bad)


def same_tree(a, b, label):
    """Asserts that directories a and b hold the same file names with the same bytes."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert fa == fb, (label, fa, fb)
    for f in fa:
        with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
            assert x.read() == y.read(), (label, f)


def run(args, expect=0, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{' '.join(map(str, args))}: exit {p.returncode}, expected {expect}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p
