"""Ground-truth checks for the torch DCP generators (issue 34 item 3): a generator's expected
values must equal the tensors it built its files from, bit for bit, however it derived them
(fragments put back, views made contiguous, files emulated or re-laid out).

Written apart from the generators' derivations: expected/*.npy are read back here with numpy,
the seeded draws of the shared fixture writer are redrawn here (not through its full_value,
which the generators replace), and 2.x-layout checkpoints are reassembled by a reader of their
own (its own unpickler, zstd CLI, safetensors header parse, byte swap), not by the code that
laid them out.

Needs Debian's torch 1.13 (/usr/bin/python3); imported by the generators in this directory and
in ../torch2.
"""
import io
import json
import os
import pickle
import struct
import subprocess
import zipfile

import numpy as np
import torch


def random_value(t, seed):
    """The shared fixture writer's value for spec tensor t (torch_dcp_fixture.full_value, the
    rule redrawn here: a generator may have replaced that function)."""
    g = torch.Generator().manual_seed(seed + sum(map(ord, t["name"])))
    dt = getattr(torch, t["dtype"])
    if dt.is_floating_point:
        return torch.randn(t["shape"], generator=g).to(dt)
    return torch.randint(-1000, 1000, t["shape"], generator=g).to(dt)


def spec_truth(spec):
    """{name: tensor} of a fixture spec (a dict or the path of its .json)."""
    if isinstance(spec, str):
        with open(spec) as f:
            spec = json.load(f)
    return {t["name"]: random_value(t, spec.get("seed", 0)) for t in spec["tensors"]}


def _bits(t):
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8)


def same_bits(a, b):
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and torch.equal(_bits(a), _bits(b)))


def load_npy(path, dtype):
    """An expected .npy as a tensor of dtype (bfloat16 is stored as its uint16 bits)."""
    a = np.load(path)
    if dtype == torch.bfloat16:
        assert a.dtype == np.uint16, (path, a.dtype)
        return torch.from_numpy(a.astype(np.int32)).to(torch.int16).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, order="C"))  # (ascontiguousarray makes 0-d 1-d)


def assert_expected(d, truth, what="expected"):
    """Directory d holds exactly one <name>.npy per truth entry, each equal to it bit for bit
    (dtype and shape included)."""
    have = sorted(n for n in os.listdir(d) if n.endswith(".npy"))
    want = sorted(n + ".npy" for n in truth)
    assert have == want and len(os.listdir(d)) == len(have), (
        f"{d}: {what} names != ground truth", sorted(set(have) ^ set(want)))
    for name, v in truth.items():
        got = load_npy(os.path.join(d, name + ".npy"), v.dtype)
        assert same_bits(got, v), (
            f"{what} != ground truth: {os.path.join(d, name + '.npy')}",
            got.dtype, v.dtype, tuple(got.shape), tuple(v.shape))


# --- a reader of 2.x-layout checkpoints, apart from emulate_torch2.py / make_torch2.py -------
class _Rec:
    """Any torch.distributed.checkpoint class: keeps its constructor args and state."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("torch.distributed.checkpoint."):
            return type(name, (_Rec,), {})
        if module in ("pathlib", "pathlib._local") and name.endswith("Path"):
            return lambda *parts: "/".join(parts)
        return super().find_class(module, name)


def _dtype(props):
    if hasattr(props, "state") and isinstance(props.state, tuple):  # 2.x (dtype, layout, ...)
        return props.state[0]
    return props.dtype  # a dict state, or torch 1.13's own class (legacy module path)


def _safetensors_chunk(blob, fqn, offsets):
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    saved = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])[fqn]["saved_offsets"]
    assert list(saved) == list(offsets), (fqn, saved, offsets)
    e = header[fqn]
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "F64": torch.float64, "I32": torch.int32}[e["dtype"]]
    lo, hi = e["data_offsets"]
    raw = bytearray(blob[8 + n + lo:8 + n + hi])
    return torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(e["shape"])


def _torch_item(data):
    z = zipfile.ZipFile(io.BytesIO(data))
    order = [z.read(i) for i in z.infolist() if i.filename.split("/", 1)[1] == "byteorder"]
    v = torch.load(io.BytesIO(data))
    if order and order[0] == b"big" and isinstance(v, torch.Tensor):
        a = v.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                 8: torch.int64}[v.element_size()]).numpy().byteswap()
        v = torch.from_numpy(a.copy()).view(v.dtype)
    return v


def reassemble(ckpt):
    """{fqn: tensor or object} of a checkpoint in a 2.x layout (one .metadata or per-rank
    __R.metadata; zstd items; safetensors blobs; big-endian items), every chunk read through
    its _StorageInfo. Replicas (the same chunk or object in several files) must agree."""
    mds = sorted(n for n in os.listdir(ckpt) if n.endswith(".metadata"))
    assert mds, ckpt
    full, seen, objects = {}, {}, {}
    for mname in mds:
        with open(os.path.join(ckpt, mname), "rb") as f:
            md = _Unpickler(f).load()
        sdm = md.state_dict_metadata
        for idx, info in md.storage_data.items():
            with open(os.path.join(ckpt, info.relative_path), "rb") as f:
                f.seek(info.offset)
                data = f.read(info.length)
            assert len(data) == info.length, (mname, idx.fqn)
            td = getattr(info, "transform_descriptors", None)
            if td:
                assert td == ["stream.zstd/1"], td
                data = subprocess.run(["zstd", "-d", "-q", "-c"], input=data,
                                      stdout=subprocess.PIPE, check=True).stdout
            if idx.offset is None:
                v = _torch_item(data)
                assert objects.setdefault(idx.fqn, v) == v, (mname, idx.fqn)
                continue
            m = sdm[idx.fqn]
            chunk = [c for c in m.chunks if list(c.offsets) == list(idx.offset)]
            assert len(chunk) == 1, (mname, idx.fqn, idx.offset)
            sizes = list(chunk[0].sizes)
            dt = _dtype(m.properties)
            if data[:2] == b"PK":
                v = _torch_item(data)
            else:  # a safetensors blob; length = numel x element size
                v = _safetensors_chunk(_blob_at(ckpt, info), idx.fqn, idx.offset)
                assert info.length == v.numel() * v.element_size(), (idx.fqn, info.length)
            assert isinstance(v, torch.Tensor), (f"{mname}: {idx.fqn} {list(idx.offset)}: "
                                                 f"item is not a tensor", type(v))
            assert v.dtype == dt and list(v.shape) == sizes, (idx.fqn, v.dtype, dt, v.shape)
            if idx.fqn not in full:
                full[idx.fqn] = torch.zeros(list(m.size), dtype=dt)
                seen[idx.fqn] = torch.zeros(list(m.size), dtype=torch.int32)
            box = tuple(slice(o, o + s) for o, s in zip(idx.offset, sizes))
            if bool((seen[idx.fqn][box] > 0).any()):
                assert same_bits(full[idx.fqn][box].contiguous(), v.contiguous()), \
                    ("replicas differ", mname, idx.fqn)
            full[idx.fqn][box] = v
            seen[idx.fqn][box] += 1
    for fqn, s in seen.items():
        assert bool((s > 0).all()), ("chunks do not cover", ckpt, fqn)
    return full, objects


def _blob_at(ckpt, info):
    with open(os.path.join(ckpt, info.relative_path), "rb") as f:
        f.seek(info.offset)
        return f.read()


def assert_checkpoint(ckpt, truth, objects):
    """The checkpoint's tensors, reassembled by reassemble(), are truth bit for bit, and its
    objects are the spec's."""
    full, objs = reassemble(ckpt)
    assert sorted(full) == sorted(truth), (ckpt, sorted(set(full) ^ set(truth)))
    for k, v in truth.items():
        assert same_bits(full[k], v), f"{ckpt}: {k} reassembled != ground truth"
    assert objs == objects, (ckpt, objs, objects)
