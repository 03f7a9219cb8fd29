#!/usr/bin/env python3
"""Builds the seed corpora of the fuzz harnesses from testdata/ (nothing large is committed).

Usage: fuzz/make_corpus.py OUT_DIR    (writes OUT_DIR/<harness>/<seed>; existing files kept,
so a corpus grown by earlier runs survives)

Seeds: the small files of each format in testdata/ (at most 64 KiB each), torch.save
archives' data.pkl for the pickle VM, and, for the harnesses that read a directory (Paddle,
fc distcp), the metadata and data files joined with the marker of fuzz/fuzz_util.h.
"""
import hashlib
import pathlib
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "testdata"
MARKER = b"\n--fc-fuzz-part--\n"  # fuzz_util.h kPartMarker
MAX_SEED = 64 << 10

LAYOUT_SEEDS = [
    b'{"degrees": {"tp": 2, "sharding": 2},\n "tensor_parallel": [{"regex": "^w$", "axis": 0}],\n'
    b' "zero": {"states": ["^(.+)\\\\.exp_avg$"]}}',
    b'{"preset": "hf-llama", "degrees": {"tp": 4, "pp": 2}, "uneven": "chunk"}',
    b'{"preset": "megatron-gpt", "degrees": {"tp": 2, "pp": 2, "dp": 2, "sharding": 2, "ep": 2}}',
    b'{"degrees": {"tp": 2, "pp": 2, "dp": 1, "sharding": 4, "ep": 1},\n'
    b' "tensor_parallel": [\n'
    b'  {"regex": "(?:^|\\\\.)embed_tokens\\\\.weight", "axis": 0, "uneven": "chunk"},\n'
    b'  {"regex": "\\\\.q_proj\\\\.weight", "axis": 0},\n'
    b'  {"regex": "\\\\.o_proj\\\\.weight", "axis": 1}],\n'
    b' "uneven": "error",\n'
    b' "pipeline": {"layer_regex": "(?:^|\\\\.)layers\\\\.(\\\\d+)\\\\.", "num_layers": 4,\n'
    b'  "layers_per_stage": [1, 3], "first_stage": ["embed_tokens"],\n'
    b'  "last_stage": ["(?:^|\\\\.)norm\\\\.", "lm_head"], "other": "error"},\n'
    b' "experts": {"regex": "\\\\.experts\\\\.(\\\\d+)\\\\.", "num_experts": 2},\n'
    b' "zero": {"states": ["^(.+)\\\\.exp_avg$"], "order": "tensors", "align": 64,\n'
    b'  "partition_align": 128},\n'
    b' "per_rank_replicas": ["layernorm\\\\.weight$"]}',
]

AOA_SEEDS = [
    b"a -> b\nb -> c, d, axis=0\n",
    b'{"statements": ["embedding.word_embeddings.weight -> x", "x -> _"]}',
    b"decoder.layers.$LAYER_ID.mlp.linear_fc2.weight -> t.$LAYER_ID, dtype='float32'\n"
    b"t.$LAYER_ID -> u.$LAYER_ID, permute='[1,0]'\n",
]


def put(out, harness, data, hint=""):
    if not data or len(data) > MAX_SEED:
        return
    d = out / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / (hashlib.sha1(data).hexdigest()[:16] + hint)).write_bytes(data)


def small(pattern):
    return sorted(p for p in TESTDATA.glob(pattern) if p.is_file() and p.stat().st_size <= MAX_SEED)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    metadata = [p for p in small("**/*.metadata")]
    for p in metadata:
        put(out, "pickle_fuzzer", p.read_bytes())
    for p in small("torch_dcp*/**/*.metadata") + small("hf_dcp/**/*.metadata"):
        put(out, "torch_dcp_metadata_fuzzer", p.read_bytes())
    archives = small("deepspeed/**/*.pt")[:40]
    for p in archives:
        if not zipfile.is_zipfile(p):  # legacy torch.save: pickles back to back
            put(out, "pickle_fuzzer", p.read_bytes())
            continue
        put(out, "zip_fuzzer", p.read_bytes())
        with zipfile.ZipFile(p) as z:
            for name in z.namelist():
                if name.endswith("data.pkl"):
                    put(out, "pickle_fuzzer", z.read(name))
    for p in small("torch_dcp/**/*.distcp")[:10]:
        put(out, "zip_fuzzer", p.read_bytes())
    for ckpt in sorted(TESTDATA.glob("paddle_flex/*/ckpt")):
        parts = [ckpt / "0.metadata", ckpt / "0_0.distcp", ckpt / "1_0.distcp"]
        blob = MARKER.join(p.read_bytes() for p in parts if p.exists())
        put(out, "paddle_metadata_fuzzer", blob)
        put(out, "pickle_fuzzer", (ckpt / "0_0.distcp").read_bytes())
    # Megatron legacy: the TP 1 / TP 2 iteration dirs without pipeline stages, as the
    # harness lays them out (model_optim_rng.pt, distrib_optim.pt per rank; "" for none).
    for it in sorted(TESTDATA.glob("megatron_legacy/*/ckpt/*/mp_rank_00/..")):
        ranks = sorted(d for d in it.resolve().iterdir() if d.name in ("mp_rank_00", "mp_rank_01"))
        files = []
        for r in ranks:
            for name in ("model_optim_rng.pt", "distrib_optim.pt"):
                files.append((r / name).read_bytes() if (r / name).exists() else b"")
        blob = MARKER.join(files)
        if len(blob) <= 4 * MAX_SEED:
            d = out / "megatron_fuzzer"
            d.mkdir(parents=True, exist_ok=True)
            (d / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)
    # DeepSpeed tag dirs of at most 8 files (no subdirectories): "name\n" + bytes per part.
    for tag in sorted(p.parent for p in TESTDATA.glob("deepspeed/*/ckpt/*/*model_states.pt")):
        files = sorted(f for f in tag.iterdir() if f.is_file())
        if len(files) > 8 or any(f.is_dir() for f in tag.iterdir()):
            continue
        blob = MARKER.join(f.name.encode() + b"\n" + f.read_bytes() for f in files)
        if len(blob) <= 4 * MAX_SEED:
            d = out / "deepspeed_fuzzer"
            d.mkdir(parents=True, exist_ok=True)
            (d / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)
    for p in small("**/*.safetensors"):
        put(out, "safetensors_header_fuzzer", p.read_bytes())
    for meta in sorted(TESTDATA.glob("fc_distcp/*/fc.metadata.json")):
        parts = [meta, meta.parent / "0_0.distcp", meta.parent / "1_0.distcp"]
        put(out, "fc_distcp_metadata_fuzzer", MARKER.join(p.read_bytes() for p in parts if p.exists()))
        put(out, "fc_distcp_metadata_fuzzer", meta.read_bytes())
    for p in small("aoa/*.aoa"):
        put(out, "aoa_fuzzer", p.read_bytes())
    for s in AOA_SEEDS:
        put(out, "aoa_fuzzer", s)
    for s in LAYOUT_SEEDS:
        put(out, "layout_rules_fuzzer", s)
    for d in sorted(out.iterdir()):
        print(f"{d.name}: {sum(1 for _ in d.iterdir())} seeds")


if __name__ == "__main__":
    main()
