"""The real torch (interop environment) as the oracle for fc's torch DCP reading and writing.

usage: torch_oracle_test.py BUILD_ROOT TESTDATA CASE      (run through venv_run.py torch)

CASE
  fixtures  make_fixtures.py writes every case anew with this torch (single process and
            torchrun 2 ranks); fc-inspect --verify and fc-export --include-optimizer equal
            torch's own full tensors (torch_fixtures_check.py), and the fresh values equal
            the committed testdata/real/torch ones
  load      fc's torch DCP output (--torch-version 2) loaded by torch's dcp.load: 2 ranks -> 1
            (plain tensors, no process group) and 1 rank -> 2 (torchrun 2 ranks, into the
            FSDP2 model's DTensor state dict through set_state_dict); every model and AdamW
            tensor equals the source's; --torch-serialization safetensors (which torch 2.15
            cannot load, its own saves neither) read through torch's read_metadata and the
            safetensors library; fc-export's output read by HuggingFaceStorageReader
  others    DeepSpeed and Megatron legacy fixtures converted to torch DCP (--torch-version 2)
            load with dcp.load, values equal fc-export's of the same source
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
import fcio  # noqa: E402
import fresh_vs_committed  # noqa: E402


def make_fixtures_module(testdata):
    """testdata/real/torch/make_fixtures.py, and testdata/real/torchrun.py as `torchrun`."""
    global torchrun
    sys.path.insert(0, os.path.join(testdata, "real", "torch"))
    sys.path.insert(0, os.path.join(testdata, "real"))
    import make_fixtures
    import torchrun
    return make_fixtures


def st_to_torch(path):
    """expected.safetensors as torch tensors (through the safetensors library)."""
    from safetensors.torch import load_file
    return load_file(path)


def assert_tensors_equal(got, want, label):
    assert sorted(got) == sorted(want), f"{label}: names differ: {sorted(set(got) ^ set(want))}"
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), \
            (label, k, g.dtype, tuple(g.shape), w.dtype, tuple(w.shape))
        gb = g.detach().contiguous().reshape(-1).view(torch.uint8)
        wb = w.detach().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(gb, wb), f"{label}: {k} differs"


def case_fixtures(build, testdata, tmp):
    fresh = os.path.join(tmp, "fresh")
    subprocess.run([sys.executable, os.path.join(testdata, "real", "torch", "make_fixtures.py"),
                    fresh], check=True)
    subprocess.run([sys.executable, os.path.join(HERE, "torch_fixtures_check.py"), build, fresh],
                   check=True)
    committed = os.path.join(testdata, "real", "torch")
    for case in sorted(os.listdir(fresh)):
        if os.path.isdir(os.path.join(fresh, case)):
            how = fresh_vs_committed.compare(
                st_to_torch(os.path.join(fresh, case, "expected.safetensors")),
                st_to_torch(os.path.join(committed, case, "expected.safetensors")),
                f"{case}: fresh save vs committed")
            print(f"{case}: fresh save vs committed: {how}")
    print("fixtures: fresh saves read by fc equal torch; equal to the committed ones")


def load_plain(ckpt, expected):
    """dcp.load in one process (no process group) into zeros of the expected shapes."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    mf = sys.modules["make_fixtures"]
    model = mf.build()
    optim = mf.train_one_step(model)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    for t in mf.tensors_of(state).values():
        t.zero_()
    dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    got = mf.tensors_of(state)
    assert_tensors_equal(got, expected, f"dcp.load {ckpt}")


def load_worker(ckpt, expected_path):
    """torchrun rank: the FSDP2 model's sharded state dict loaded from ckpt, then gathered."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    mf = sys.modules["make_fixtures"]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(99)  # other initial values: everything checked must come from ckpt
    model = mf.Tiny()
    fully_shard(model.gate, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = mf.train_one_step(model)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full_m, full_o = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))
    got = mf.tensors_of({"model": full_m, "optim": full_o})
    if dist.get_rank() == 0:
        assert_tensors_equal(got, st_to_torch(expected_path), f"FSDP2 load of {ckpt}")
        print(f"FSDP2 2-rank load of {ckpt}: {len(got)} tensors equal", flush=True)
    dist.destroy_process_group()


def read_safetensors_serialization(ckpt):
    """A SAFETENSORS-serialized DCP checkpoint read the way torch 2.15 writes one, since its
    FileSystemReader cannot load it (read_data torch.loads every tensor item): torch's own
    read_metadata, then per .distcp file the byte items and, after them, one blob that the
    safetensors library loads, each tensor placed at its DCP_SHARDING_INFO saved_offsets.
    Returns ({fqn: full tensor}, [each blob's __metadata__ keys])."""
    import json
    from safetensors.torch import load as st_load
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    md = dcp.FileSystemReader(ckpt).read_metadata()
    blob_start = {}
    for index, info in md.storage_data.items():
        if isinstance(md.state_dict_metadata[index.fqn], BytesStorageMetadata):
            end = info.offset + info.length
            blob_start[info.relative_path] = max(blob_start.get(info.relative_path, 0), end)
    full = {fqn: torch.zeros(m.size, dtype=m.properties.dtype)
            for fqn, m in md.state_dict_metadata.items()
            if not isinstance(m, BytesStorageMetadata)}
    filled = {fqn: 0 for fqn in full}
    meta_keys = []
    for name in sorted(os.listdir(ckpt)):
        if not name.endswith(".distcp"):
            continue
        with open(os.path.join(ckpt, name), "rb") as f:
            blob = f.read()[blob_start.get(name, 0):]
        header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
        meta = header["__metadata__"]
        meta_keys.append(sorted(meta))
        sharding = json.loads(meta["DCP_SHARDING_INFO"])
        for fqn, t in st_load(blob).items():
            offsets = sharding[fqn]["saved_offsets"]
            view = full[fqn][tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))]
            assert view.shape == t.shape, (ckpt, name, fqn, offsets, t.shape)
            view.copy_(t)
            filled[fqn] += t.numel()
    for fqn, n in filled.items():
        assert n == full[fqn].numel(), (ckpt, fqn, n, tuple(full[fqn].shape))
    return full, meta_keys


def case_load(build, testdata, tmp):
    export, convert = fcio.tools(build, "fc-export", "fc-convert")
    real = os.path.join(testdata, "real", "torch")
    two, one = os.path.join(real, "fsdp2_plain"), os.path.join(real, "single_plain")
    expected = st_to_torch(os.path.join(two, "expected.safetensors"))

    # 2 ranks -> 1 (the single-process save's layout), loaded without a process group.
    out21 = os.path.join(tmp, "two_to_one")
    fcio.run([convert, os.path.join(two, "ckpt"), out21, "--output-format", "torch-dcp",
              "--torch-version", "2", "--target-like", os.path.join(one, "ckpt"), "-q"])
    load_plain(out21, expected)
    print("2 ranks -> 1: dcp.load equal")

    # 1 rank -> 2 (the FSDP2 save's layout), loaded by 2 ranks into their DTensor shards.
    out12 = os.path.join(tmp, "one_to_two")
    fcio.run([convert, os.path.join(one, "ckpt"), out12, "--output-format", "torch-dcp",
              "--torch-version", "2", "--target-like", os.path.join(two, "ckpt"), "-q"])
    load_plain(out12, st_to_torch(os.path.join(one, "expected.safetensors")))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun.check_run(2, 29541, [os.path.abspath(__file__), "--load-worker", testdata, out12,
                                  os.path.join(one, "expected.safetensors")], env)
    print("1 rank -> 2: FSDP2 load equal")

    # --torch-serialization safetensors: torch 2.15 cannot load it (its own saves neither),
    # so each blob goes through the safetensors library after torch's read_metadata; the
    # same reader on torch's own save (fsdp2_safetensors) is the control.
    own, own_keys = read_safetensors_serialization(
        os.path.join(real, "fsdp2_safetensors", "ckpt"))
    assert_tensors_equal(own, expected, "torch's own SAFETENSORS save, read by this test")
    for src, like, label in ((two, one, "2 ranks -> 1"), (one, two, "1 rank -> 2")):
        out = os.path.join(tmp, "st_" + label.replace(" ", ""))
        fcio.run([convert, os.path.join(src, "ckpt"), out, "--output-format", "torch-dcp",
                  "--torch-version", "2", "--torch-serialization", "safetensors",
                  "--target-like", os.path.join(like, "ckpt"), "-q"])
        got, keys = read_safetensors_serialization(out)
        assert set(map(tuple, keys)) == set(map(tuple, own_keys)), (keys, own_keys)
        assert_tensors_equal(got, st_to_torch(os.path.join(src, "expected.safetensors")),
                             f"SAFETENSORS serialization {label}")
    print("--torch-serialization safetensors: torch's metadata + the safetensors library equal")

    # fc-export's HF safetensors through torch's HuggingFaceStorageReader.
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    hf = os.path.join(tmp, "hf")
    fcio.run([export, os.path.join(two, "ckpt"), hf, "--max-shard-size", "1KB", "-q"])
    want = {k: v for k, v in expected.items() if k.startswith("model.")}
    state = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(hf), no_dist=True)
    assert_tensors_equal(state, want, "HuggingFaceStorageReader on fc-export's output")
    assert len([f for f in os.listdir(hf) if f.endswith(".safetensors")]) > 1, os.listdir(hf)
    print("fc-export output: HuggingFaceStorageReader equal")


def case_others(build, testdata, tmp):
    """DeepSpeed and Megatron sources converted to torch DCP, loaded by torch."""
    export, convert = fcio.tools(build, "fc-export", "fc-convert")
    layout = os.path.join(tmp, "tp1.json")
    with open(layout, "w") as f:
        f.write('{"degrees": {"tp": 1}}\n')
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    sources = [os.path.join(testdata, "deepspeed", "zero2", "ckpt"),
               os.path.join(testdata, "deepspeed", "bf16", "ckpt"),
               os.path.join(testdata, "megatron_legacy", "gpt_tp2_pp2", "ckpt")]
    for i, src in enumerate(sources):
        name = f"src{i}"
        out = os.path.join(tmp, name + ".dcp")
        fcio.run([convert, src, out, "--output-format", "torch-dcp", "--torch-version", "2",
                  "--target-layout", layout, "-q"])
        ex = os.path.join(tmp, name + ".hf")
        fcio.run([export, src, ex, "--include-optimizer", "-q"])
        exported, _ = fcio.read_hf_dir(ex)
        md = dcp.FileSystemReader(out).read_metadata()
        state = {k: torch.zeros(m.size, dtype=m.properties.dtype)
                 for k, m in md.state_dict_metadata.items()
                 if isinstance(m, TensorStorageMetadata)}
        dcp.load(state, checkpoint_id=out, no_dist=True)
        common = sorted(set(state) & set(exported))
        assert common, (src, sorted(state)[:5], sorted(exported)[:5])
        for k in common:
            dt, arr = exported[k]
            got = state[k].contiguous().reshape(-1).view(torch.uint8).numpy()
            assert got.tobytes() == fcio.bits(arr).tobytes(), (src, k)
        print(f"{src}: {len(state)} tensors loaded by dcp.load, {len(common)} equal fc-export's")


def main():
    if sys.argv[1] == "--load-worker":
        testdata, ckpt, expected = sys.argv[2:5]
        make_fixtures_module(testdata)
        load_worker(ckpt, expected)
        return
    build, testdata, case = sys.argv[1:4]
    make_fixtures_module(testdata)
    with fcio.temp_dir("fc-real-torch-") as tmp:
        {"fixtures": case_fixtures, "load": case_load, "others": case_others}[case](
            build, testdata, tmp)


if __name__ == "__main__":
    main()
