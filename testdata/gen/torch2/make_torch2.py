#!/usr/bin/env python3
"""Torch DCP fixtures laid out as torch 2.4 - 2.9 writes them, made from the real torch 1.13
fixtures (testdata/torch_dcp/mixed, uneven_1d_bf16) with stand-in classes
(torch2_classes.py). Each follows shared/reference/formats-recent.md and formats.md 2-3:

  rank_local   saves without rank coordination (filesystem.py at main, use_collectives=False):
               no .metadata; __R.metadata holds only rank R's items (global sizes, its own
               save_id, index hints numbered within the rank), data in __R_0.distcp. Every
               rank saves the non-tensor values and rank 0 also the plain tensor `b` (no
               coordinator deduplicates them), so these are replicas across files.
  zstd         _StorageInfo.transform_descriptors = ["stream.zstd/1"] (_extension.py
               ZStandard): every item, byte items too, compressed as one zstd frame without
               content size or checksum; length = compressed length. Frames made by the zstd
               CLI (apt-get install zstd).
  details      a 2.4+ .metadata with TensorProperties from the 1.13 module path
               (torch.distributed._shard.sharded_tensor.metadata, enum by name), storage_meta
               whose checkpoint_id is a pathlib.PosixPath as CPython 3.11 pickles it (parts),
               version "1.0.0", no mcore_data; items re-archived in the recent torch.save
               record order (data.pkl, .format_version, .storage_alignment, byteorder
               "little", data/N, version).
  big_endian   uneven_1d_bf16 with byteorder "big" records and byte-swapped payloads, as a
               big-endian machine writes them (fc refuses these clearly).
  safetensors  SerializationFormat.SAFETENSORS (filesystem.py, ~2.8+): per rank file
               __R_0.distcp = byte items (torch.save archives) first, then one safetensors
               blob keyed by fqn with __metadata__ {DCP_SHARDING_INFO, DCP_VERSION "1.0",
               format "pt"}; tensor _StorageInfo offset = blob start, length = numel x
               element size (not a byte range).

usage: /usr/bin/python3 make_torch2.py SHARED_TOOLS_DIR TESTDATA_TORCH_DCP_DIR
  (writes TESTDATA/torch_dcp/{rank_local,zstd,details,safetensors} and
   TESTDATA/torch_dcp_refused/big_endian)
"""
import io
import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import zipfile

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch113_shim  # noqa: F401
import torch
import torch.distributed._shard.checkpoint  # noqa: F401  (1.13 classes for pickle.load)
import torch2_classes as T

root = sys.argv[2]
refused = os.path.join(os.path.dirname(os.path.abspath(root)), "torch_dcp_refused")


def load_old(name):
    ckpt = os.path.join(root, name, "ckpt")
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = pickle.load(f)
    items = []  # (rank, fqn, MetadataIndex, bytes)
    for idx, info in md.storage_data.items():
        rank = int(re.match(r"__(\d+)_\d+\.distcp", info.relative_path).group(1))
        with open(os.path.join(ckpt, info.relative_path), "rb") as g:
            g.seek(info.offset)
            data = g.read(info.length)
        items.append((rank, idx.fqn, idx, data))
    return md, items


def fresh(name, src, where=None):
    out = os.path.join(where or root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "ckpt"))
    shutil.copytree(os.path.join(root, src, "expected"), os.path.join(out, "expected"))
    return os.path.join(out, "ckpt")


def chunk_of(m, offsets):
    for c in m.chunks:
        if list(c.offsets) == list(offsets):
            return c
    raise KeyError(offsets)


def write_rank_files(ckpt, items, encode=lambda data: data, name="__{}_0.distcp"):
    """Concatenates each rank's items, byte items first; returns {(rank, fqn, offsets): info}."""
    by_rank = {}
    for rank, fqn, idx, data in items:
        by_rank.setdefault(rank, []).append((idx.offset is not None, fqn, idx, data))
    infos = {}
    for rank, its in sorted(by_rank.items()):
        fname = name.format(rank)
        with open(os.path.join(ckpt, fname), "wb") as f:
            for _, fqn, idx, data in sorted(its, key=lambda x: (x[0], x[1])):
                blob = encode(data)
                infos[(rank, fqn, None if idx.offset is None else tuple(idx.offset))] = \
                    (fname, f.tell(), len(blob))
                f.write(blob)
    return infos


def dump(path, md):
    with open(path, "wb") as f:
        pickle.dump(md, f, protocol=4)


def save_id(n):
    return f"5f1e1ab0-0000-4000-8000-{n:012d}"


# --- rank_local ------------------------------------------------------------------------------
old, items = load_old("mixed")
ckpt = fresh("rank_local", "mixed")
rank_of = {}
for rank, fqn, idx, data in items:
    rank_of.setdefault(fqn, set()).add(rank)
extra = []
for rank, fqn, idx, data in items:
    if idx.offset is None:  # every rank saves the non-tensor values
        extra += [(r, fqn, idx, data) for r in (1, 2, 3) if r != rank]
    if fqn == "b":  # rank 0 also saves the plain tensor b
        extra.append((0, fqn, idx, data))
items_rl = items + extra
infos = write_rank_files(ckpt, items_rl)
for r in range(4):
    mine = [(fqn, idx) for rank, fqn, idx, _ in items_rl if rank == r]
    sdm, sd, hints = {}, {}, {}
    for fqn, m in old.state_dict_metadata.items():
        offs = [idx.offset for f, idx in mine if f == fqn]
        if not offs:
            continue
        if hasattr(m, "chunks"):
            chunks = [c for c in m.chunks if any(list(c.offsets) == list(o) for o in offs)]
            sdm[fqn] = T.tensor_meta(m, chunks)
            for i, c in enumerate(chunks):
                fname, off, length = infos[(r, fqn, tuple(c.offsets))]
                sd[T.MetadataIndex(fqn, c.offsets, i)] = T._StorageInfo(fname, off, length)
        else:
            sdm[fqn] = T.BytesStorageMetadata()
            fname, off, length = infos[(r, fqn, None)]
            sd[T.MetadataIndex(fqn)] = T._StorageInfo(fname, off, length)
    dump(os.path.join(ckpt, f"__{r}.metadata"),
         T.Metadata(sdm, {fqn: (fqn,) for fqn in sdm}, sd,
                    T.StorageMeta(pathlib.PosixPath("/ckpt/step_100"), save_id(r), None, []),
                    "1.0.0"))


# --- zstd ------------------------------------------------------------------------------------
def zstd(data):
    return subprocess.run(["zstd", "-q", "-c", "-3", "--no-check", "--no-content-size"],
                          input=data, stdout=subprocess.PIPE, check=True).stdout


def global_metadata(ckpt, items, infos, legacy=False, transforms=None, mcore=False,
                    checkpoint_id=None, tensor_info=None):
    sdm, sd = {}, {}
    for fqn, m in old_md.state_dict_metadata.items():
        sdm[fqn] = (T.tensor_meta(m, legacy=legacy) if hasattr(m, "chunks")
                    else T.BytesStorageMetadata())
    for rank, fqn, idx, data in items:
        key = None if idx.offset is None else tuple(idx.offset)
        fname, off, length = infos[(rank, fqn, key)]
        if tensor_info and key is not None:
            off, length = tensor_info(rank, fqn, key)
        sd[T.MetadataIndex(fqn, idx.offset, idx.index)] = T._StorageInfo(
            fname, off, length, transforms)
    md = T.Metadata(sdm, {fqn: (fqn,) for fqn in sdm}, sd,
                    T.StorageMeta(checkpoint_id or pathlib.PosixPath("/ckpt/step_100"),
                                  save_id(100), None, []),
                    "1.0.0")
    dump(os.path.join(ckpt, ".metadata"), md)


old_md = old
ckpt = fresh("zstd", "mixed")
infos = write_rank_files(ckpt, items, encode=zstd)
global_metadata(ckpt, items, infos, transforms=["stream.zstd/1"])


# --- details ---------------------------------------------------------------------------------
def rearchive(data, byteorder="little", swap=0):
    """A torch.save item with the records recent torch writes, in its order."""
    z = zipfile.ZipFile(io.BytesIO(data))
    recs = {i.filename.split("/", 1)[1]: z.read(i) for i in z.infolist()}
    buf = io.BytesIO()
    w = torch._C.PyTorchFileWriter(buf)
    for name, payload in [("data.pkl", recs["data.pkl"]), (".format_version", b"1"),
                          (".storage_alignment", b"64"), ("byteorder", byteorder.encode())] + \
            sorted((k, v) for k, v in recs.items() if k.startswith("data/")):
        if swap and name.startswith("data/"):
            payload = b"".join(payload[i:i + swap][::-1] for i in range(0, len(payload), swap))
        w.write_record(name, payload, len(payload))
    w.write_end_of_file()  # adds "version"
    return buf.getvalue()


ckpt = fresh("details", "mixed")
infos = write_rank_files(ckpt, items, encode=rearchive)
global_metadata(ckpt, items, infos, legacy=True)

old, bitems = load_old("uneven_1d_bf16")
old_md = old
# Outside torch_dcp/ (whose fixtures every export/convert test reads): fc refuses it.
ckpt = fresh("big_endian", "uneven_1d_bf16", refused)
infos = write_rank_files(ckpt, bitems, encode=lambda d: rearchive(d, "big", swap=2))
global_metadata(ckpt, bitems, infos)

# --- safetensors -----------------------------------------------------------------------------
old, items = load_old("mixed")
old_md = old
ST = {torch.float32: ("F32", 4), torch.float16: ("F16", 2), torch.bfloat16: ("BF16", 2),
      torch.int64: ("I64", 8), torch.float64: ("F64", 8), torch.int32: ("I32", 4)}


def tensor_bytes(item):
    t = torch.load(io.BytesIO(item)).contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def safetensors_blob(tensors):
    """tensors: [(fqn, dtype, shape, offsets, bytes)] -> safetensors bytes as
    safetensors.torch.save writes them (descending alignment, then name; header padded with
    spaces to a multiple of 8)."""
    order = sorted(tensors, key=lambda t: (-ST[t[1]][1], t[0]))
    sharding = {fqn: {"saved_offsets": list(offs)} for fqn, _, _, offs, _ in tensors}
    header = {"__metadata__": {"DCP_SHARDING_INFO": json.dumps(sharding),
                               "DCP_VERSION": "1.0", "format": "pt"}}
    pos = 0
    for fqn, dt, shape, _, data in order:
        header[fqn] = {"dtype": ST[dt][0], "shape": list(shape),
                       "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(t[4] for t in order)


ckpt = fresh("safetensors", "mixed")
by_rank = {}
for rank, fqn, idx, data in items:
    by_rank.setdefault(rank, []).append((rank, fqn, idx, data))
infos, tinfo = {}, {}
for rank, its in sorted(by_rank.items()):
    fname = f"__{rank}_0.distcp"
    with open(os.path.join(ckpt, fname), "wb") as f:
        tensors = []
        for _, fqn, idx, data in sorted(its, key=lambda x: x[1]):
            if idx.offset is None:
                infos[(rank, fqn, None)] = (fname, f.tell(), len(data))
                f.write(data)
            else:
                m = old.state_dict_metadata[fqn]
                c = chunk_of(m, idx.offset)
                tensors.append((fqn, m.properties.dtype, list(c.sizes), list(c.offsets),
                                tensor_bytes(data)))
        start = f.tell()
        for fqn, dt, shape, offs, data in tensors:
            infos[(rank, fqn, tuple(offs))] = (fname, start, len(data))
        f.write(safetensors_blob(tensors))
global_metadata(ckpt, items, infos)

# Ground truth (issue 34 item 3): each output's expected/ and its checkpoint, read back by
# dcp_truth's own reader (own unpickler, zstd -d, safetensors header, byte swap), hold the
# values of its source's spec (../torch_dcp/<source>.json) redrawn, bit for bit.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_dcp"))
import dcp_truth  # noqa: E402

for out, src in ((os.path.join(root, "rank_local"), "mixed"), (os.path.join(root, "zstd"), "mixed"),
                 (os.path.join(root, "details"), "mixed"),
                 (os.path.join(root, "safetensors"), "mixed"),
                 (os.path.join(refused, "big_endian"), "uneven_1d_bf16")):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_dcp",
                           src + ".json")) as f:
        spec = json.load(f)
    truth = dcp_truth.spec_truth(spec)
    dcp_truth.assert_expected(os.path.join(out, "expected"), truth)
    dcp_truth.assert_checkpoint(os.path.join(out, "ckpt"), truth, spec.get("objects", {}))
    print("wrote", out, "(expected/ and ckpt/ equal to the spec's values)")
