#!/usr/bin/env python3
"""Fixtures for the newer safetensors dtypes and torch DCP's HuggingFace storage layouts.
Pure python3 + numpy; files written by stfile.py (an independent writer, reference order).

testdata/st_dtypes/
  all_dtypes.safetensors   one tensor per dtype, the new ones with chosen bit patterns:
                           u16, u32, u64 (2^64-1 and 2^63+1 included), c64 (complex64),
                           f8_e4m3fnuz / f8_e5m2fnuz / f8_e8m0 (all 256 patterns each), and
                           f32, bf16, i8, bool beside them
  fnuz_only.safetensors    one F8_E4M3FNUZ tensor (0x80 = NaN and 0x00 in it)
  f4.safetensors           F4 [2, 4] (4 bytes) beside an F32 tensor: valid, sub-byte
  f6.safetensors           F6_E2M3 [4] (3 bytes): valid, sub-byte
  subbyte.safetensors      F4 [4, 8] (16 bytes), F6_E2M3 [2, 8] (12 bytes), F6_E3M2 [3, 4]
                           (9 bytes), each byte distinct, beside an F32 [2]: rows of whole
                           bytes, so fc reads them (as 2 or 4 values per element)
  f4_odd_rows.safetensors  F4 [2, 3] (3 bytes): valid for the reference (24 bits), but its
                           rows are 12 bits, not whole bytes: fc refuses it (exit 6)
  f4_misaligned.safetensors F4 [3] in 2 bytes: 12 bits is not whole bytes, so invalid
Packing (the reference's rule, huggingface/safetensors safetensors/src/tensor.rs
Metadata::validate): a tensor's byte size is values x bits / 8, which must be whole.
testdata/hf_dcp/           torch HuggingFaceStorageWriter layouts (formats-recent.md) of
                           the same four tensors, two ranks, fqn_to_index_mapping putting
                           w and b in model 1 and e and q in model 2:
  distributed/shard-0000S-model-0000K-of-00002.safetensors   S = rank + 1; __metadata__
                           {"DCP_SHARDING_INFO": json {fqn: {"saved_offsets": [...]}},
                            "DCP_VERSION": "1.0", "format": "pt"}; w split on dim 0, e on
                           dim 1, b and q saved by rank 0 only (DCP de-duplicates)
  consolidated/            model-0000K-of-00002.safetensors + model.safetensors.index.json
                           (whole tensors) and sharded/ holding the shard files
  sharded_only/sharded/    the shard files alone (a save_distributed + consolidation run
                           whose consolidation has not happened)
  plain/model.safetensors  the whole tensors in one file: what an export must equal

usage: /usr/bin/python3 testdata/gen/safetensors/gen.py [--check] [TESTDATA_ROOT]
--check validates every file with stfile.read, reassembles the shards from their
DCP_SHARDING_INFO and compares them with plain/, and regenerates into a temporary folder to
confirm the files are byte-identical.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402

FOLDERS = ("st_dtypes", "hf_dcp")


def bf16_bits(values):
    b = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def t(name, dtype, arr, shape=None):
    arr = np.ascontiguousarray(arr)
    return (name, dtype, tuple(arr.shape if shape is None else shape), arr.tobytes())


def gen_st_dtypes(out):
    os.makedirs(out, exist_ok=True)
    pats = np.arange(256, dtype=np.uint8)
    stfile.write(os.path.join(out, "all_dtypes.safetensors"), [
        t("u16", "U16", np.array([[0, 1, 65535], [256, 4660, 7]], dtype="<u2")),
        t("u32", "U32", np.array([0, 4294967295, 65536], dtype="<u4")),
        t("u64", "U64", np.array([0, 2 ** 64 - 1, 2 ** 63 + 1], dtype="<u8")),
        t("c64", "C64", np.array([1 - 2j, 3.5 + 0.25j], dtype="<c8")),
        t("f8_e4m3fnuz", "F8_E4M3FNUZ", pats.reshape(16, 16)),
        t("f8_e5m2fnuz", "F8_E5M2FNUZ", pats),
        t("f8_e8m0", "F8_E8M0", pats.reshape(2, 128)),
        t("f32", "F32", np.array([1.0, -2.5, 3e38], dtype="<f4")),
        t("bf16", "BF16", bf16_bits([1.0, -0.5])),
        t("i8", "I8", np.array([-128, 0, 127], dtype="i1")),
        t("bool", "BOOL", np.array([1, 0, 1], dtype="u1")),
    ], {"format": "pt"})
    stfile.write(os.path.join(out, "fnuz_only.safetensors"),
                 [t("scale", "F8_E4M3FNUZ", np.array([0x40, 0x80, 0x00, 0x7F, 0xFF], dtype="u1"))])
    stfile.write(os.path.join(out, "f4.safetensors"),
                 [("w4", "F4", (2, 4), bytes([0x21, 0x43, 0x65, 0x87])),
                  t("x", "F32", np.array([1.0, 2.0], dtype="<f4"))])
    stfile.write(os.path.join(out, "f6.safetensors"), [("w6", "F6_E2M3", (4,), bytes([1, 2, 3]))])
    stfile.write(os.path.join(out, "subbyte.safetensors"), [
        ("f4", "F4", (4, 8), bytes(range(0x10, 0x20))),
        ("f6a", "F6_E2M3", (2, 8), bytes(range(0x40, 0x4C))),
        ("f6b", "F6_E3M2", (3, 4), bytes(range(0xA0, 0xA9))),
        t("x", "F32", np.array([1.0, -2.0], dtype="<f4")),
    ], {"format": "pt"})
    stfile.write(os.path.join(out, "f4_odd_rows.safetensors"),
                 [("w", "F4", (2, 3), bytes([0x12, 0x34, 0x56]))])
    # Not writable through stfile (it refuses a partial byte): the header by hand.
    hdr = b'{"w4":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}'
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    with open(os.path.join(out, "f4_misaligned.safetensors"), "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + b"\x12\x34")


# ---- torch DCP HuggingFace storage

def dcp_tensors():
    w = np.arange(24, dtype="<f4").reshape(4, 6) * 0.5 - 3.0
    e = bf16_bits((np.arange(12, dtype=np.float32) - 5.0).reshape(3, 4) * 0.25)
    b = np.array([7, -1, 2 ** 40 + 3, 0, -(2 ** 62)], dtype="<i8")
    q = np.array([[0x40, 0x80], [0x01, 0x7F]], dtype="u1")  # float8_e4m3fnuz bits
    return {"w": ("F32", w), "e": ("BF16", e), "b": ("I64", b), "q": ("F8_E4M3FNUZ", q)}


FQN_TO_INDEX = {"w": 1, "b": 1, "e": 2, "q": 2}
N_FILES = 2


def rank_pieces(rank):
    """fqn -> (offsets, array) saved by `rank` (DCP: replicated tensors saved once)."""
    full = dcp_tensors()
    out = {}
    w = full["w"][1]
    out["w"] = ((2 * rank, 0), w[2 * rank:2 * rank + 2])
    e = full["e"][1]
    out["e"] = ((0, 2 * rank), e[:, 2 * rank:2 * rank + 2])
    if rank == 0:
        out["b"] = ((0,), full["b"][1])
        out["q"] = ((0, 0), full["q"][1])
    return out


def write_shards(out):
    os.makedirs(out, exist_ok=True)
    full = dcp_tensors()
    for rank in range(2):
        pieces = rank_pieces(rank)
        for k in range(1, N_FILES + 1):
            names = sorted(n for n in pieces if FQN_TO_INDEX[n] == k)
            if not names:
                continue
            info = {n: {"saved_offsets": list(pieces[n][0])} for n in names}
            md = {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"}
            stfile.write(os.path.join(
                out, f"shard-{rank + 1:05d}-model-{k:05d}-of-{N_FILES:05d}.safetensors"),
                [t(n, full[n][0], pieces[n][1]) for n in names], md)


def write_consolidated(out):
    os.makedirs(out, exist_ok=True)
    full = dcp_tensors()
    weight_map, total = {}, 0
    for k in range(1, N_FILES + 1):
        fname = f"model-{k:05d}-of-{N_FILES:05d}.safetensors"
        names = sorted(n for n in full if FQN_TO_INDEX[n] == k)
        stfile.write(os.path.join(out, fname), [t(n, *full[n]) for n in names], {"format": "pt"})
        for n in names:
            weight_map[n] = fname
            total += full[n][1].nbytes
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def gen_hf_dcp(out):
    full = dcp_tensors()
    write_shards(os.path.join(out, "distributed"))
    write_consolidated(os.path.join(out, "consolidated"))
    write_shards(os.path.join(out, "consolidated", "sharded"))
    write_shards(os.path.join(out, "sharded_only", "sharded"))
    os.makedirs(os.path.join(out, "plain"), exist_ok=True)
    stfile.write(os.path.join(out, "plain", "model.safetensors"),
                 [t(n, *full[n]) for n in sorted(full)], {"format": "pt"})


def generate(root):
    for name, fn in (("st_dtypes", gen_st_dtypes), ("hf_dcp", gen_hf_dcp)):
        d = os.path.join(root, name)
        if os.path.isdir(d):  # everything but the hand-written README.md
            for entry in os.listdir(d):
                p = os.path.join(d, entry)
                if entry != "README.md":
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        fn(d)


# ---- --check

NP = {"F32": "<f4", "BF16": "<u2", "I64": "<i8", "F8_E4M3FNUZ": "u1"}


def reassemble(shard_dir):
    pieces = {}
    for fname in sorted(os.listdir(shard_dir)):
        assert fname.startswith("shard-") and fname.endswith(".safetensors"), fname
        md, tensors = stfile.read(os.path.join(shard_dir, fname))
        info = json.loads(md["DCP_SHARDING_INFO"])
        assert set(info) == set(tensors), fname
        for n, (dt, shape, raw) in tensors.items():
            arr = np.frombuffer(raw, dtype=NP[dt]).reshape(shape)
            pieces.setdefault(n, []).append((dt, tuple(info[n]["saved_offsets"]), arr))
    out = {}
    for n, ps in pieces.items():
        gshape = tuple(max(o[d] + a.shape[d] for _, o, a in ps) for d in range(ps[0][2].ndim))
        full = np.zeros(gshape, dtype=ps[0][2].dtype)
        cover = np.zeros(gshape, dtype=int)
        for _, o, a in ps:
            sl = tuple(slice(x, x + s) for x, s in zip(o, a.shape))
            full[sl] = a
            cover[sl] += 1
        assert (cover == 1).all(), n
        out[n] = (ps[0][0], full)
    return out


def check_truth(root):
    """The expected values (hf_dcp/plain, what the shards must reassemble to) are the
    generator's source tensors, bit for bit."""
    _, plain = stfile.read(os.path.join(root, "hf_dcp", "plain", "model.safetensors"))
    truth = dcp_tensors()
    assert set(plain) == set(truth), sorted(set(plain) ^ set(truth))
    for n, (dt, arr) in truth.items():
        assert (plain[n][0] == dt and tuple(plain[n][1]) == arr.shape and
                plain[n][2] == np.ascontiguousarray(arr).tobytes()), "plain != ground truth: " + n


def check(root):
    check_truth(root)
    st = os.path.join(root, "st_dtypes")
    for f in ("all_dtypes", "fnuz_only", "f4", "f6"):
        stfile.read(os.path.join(st, f + ".safetensors"))
    try:
        stfile.read(os.path.join(st, "f4_misaligned.safetensors"))
        raise SystemExit("f4_misaligned.safetensors should be invalid")
    except AssertionError:
        pass
    # reference order: every tensor starts at a multiple of its element size
    offs = stfile.data_offsets(os.path.join(st, "all_dtypes.safetensors"))
    _, tensors = stfile.read(os.path.join(st, "all_dtypes.safetensors"))
    for n, (dt, _, _) in tensors.items():
        assert offs[n] % max(1, stfile.BITS[dt] // 8) == 0, n
    hf = os.path.join(root, "hf_dcp")
    _, plain = stfile.read(os.path.join(hf, "plain", "model.safetensors"))
    for shard_dir in ("distributed", "consolidated/sharded", "sharded_only/sharded"):
        got = reassemble(os.path.join(hf, shard_dir))
        assert set(got) == set(plain), shard_dir
        for n, (dt, arr) in got.items():
            assert plain[n][0] == dt and plain[n][1] == arr.shape and plain[n][2] == arr.tobytes(), n
    with open(os.path.join(hf, "consolidated", "model.safetensors.index.json")) as f:
        index = json.load(f)
    seen = {}
    for fname in sorted(set(index["weight_map"].values())):
        _, ts = stfile.read(os.path.join(hf, "consolidated", fname))
        for n, v in ts.items():
            assert index["weight_map"][n] == fname
            seen[n] = v
    assert seen == plain
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        check_truth(tmp)
        n_new = 0
        for name in FOLDERS:
            for dirpath, _, files in os.walk(os.path.join(tmp, name)):
                for f in files:
                    a = os.path.join(dirpath, f)
                    b = os.path.join(root, os.path.relpath(a, tmp))
                    with open(a, "rb") as fa, open(b, "rb") as fb:
                        assert fa.read() == fb.read(), f"stale or nondeterministic: {b}"
                    n_new += 1
        n_old = sum(len([f for f in fs if f != "README.md"])
                    for n in FOLDERS for _, _, fs in os.walk(os.path.join(root, n)))
        assert n_new == n_old, (n_new, n_old)
    print(f"st_dtypes and hf_dcp: valid, shards reassemble to plain/, regenerated output is "
          f"byte-identical ({n_new} files)")


def main(argv):
    args = argv[1:]
    do_check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) > 1:
        sys.exit(__doc__)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    root = args[0] if args else os.path.join(repo, "testdata")
    if do_check:
        check(root)
    else:
        generate(root)


if __name__ == "__main__":
    main(sys.argv)
