"""Writes torch DCP checkpoints with the real torch (2.15, the interop environment), each with
the full tensors torch itself gives back as the expected values.

usage: python make_fixtures.py OUT_DIR
  (run with the interop environment's python: scripts/interop.sh --python torch)

OUT_DIR/<case>/ckpt                    the checkpoint as torch wrote it
OUT_DIR/<case>/expected.safetensors    every tensor of the checkpoint, full, under the
                                       name torch's DCP gives it (the flattened state dict
                                       key), written by the safetensors library
OUT_DIR/versions.json                  torch, safetensors, Python versions

Cases (a small model + AdamW after one step, through torch.distributed.checkpoint.state_dict):
  single_plain      one process, no process group: plain tensors, dcp.save(no_dist=True)
  fsdp2_plain       torchrun 2 ranks, gloo, FSDP2 fully_shard on a CPU mesh (DTensor Shard(0),
                    uneven: 25 rows as 13 + 12), default FileSystemWriter
  fsdp2_zstd        the same through FileSystemWriter(_extensions=[ZStandard()])
  fsdp2_safetensors the same with serialization_format=SerializationFormat.SAFETENSORS
  fsdp2_rank_local  dcp.save(use_collectives=False): per-rank __R.metadata, no .metadata
  hf_consolidated   the model's weights through HuggingFaceStorageWriter(save_distributed=True,
                    enable_consolidation=True): per-rank shards in sharded/ and the
                    consolidated model-0000K-of-0000N.safetensors with its index

The expected values are torch's own: dcp_to_torch_save of the checkpoint (the HF case:
dcp.load through HuggingFaceStorageReader), checked equal to the live model's full state dict
(get_state_dict with full_state_dict=True) before they are written. Two cases torch 2.15
cannot read back itself, so their expected values are that live full state dict:
fsdp2_rank_local (no global .metadata) and fsdp2_safetensors (FileSystemReader torch.loads
every tensor item, and fails on its own SAFETENSORS files: "Unsupported operand 192").
"""
import json
import os
import platform
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     get_model_state_dict)

FSDP2_CASES = ["fsdp2_plain", "fsdp2_zstd", "fsdp2_safetensors", "fsdp2_rank_local",
               "hf_consolidated"]


class Gate(nn.Module):
    """A bfloat16 parameter in its own FSDP2 group (a group holds one dtype)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(7, 3).to(torch.bfloat16))

    def forward(self, x):
        return x + self.weight.float().sum()


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(25, 8)
        self.proj = nn.Linear(8, 12)
        self.norm = nn.LayerNorm(12)
        self.head = nn.Linear(12, 5, bias=False)
        self.gate = Gate()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 5))

    def forward(self, ids):
        h = self.norm(torch.relu(self.proj(self.embed(ids))))
        return self.gate(self.head(h) * self.scale)


def build():
    torch.manual_seed(1234)
    model = Tiny()
    return model


def train_one_step(model):
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.arange(0, 24).reshape(4, 6) % 25
    loss = model(ids).square().mean()
    loss.backward()
    optim.step()
    return optim


def tensors_of(state):
    """{flattened DCP key: tensor} of a (nested) state dict; non-tensors left out."""
    flat, _ = flatten_state_dict(state)
    out = {}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            if hasattr(v, "full_tensor"):
                v = v.full_tensor()
            out[k] = v.detach().cpu().contiguous()
    return out


def assert_same(a, b, label):
    assert sorted(a) == sorted(b), f"{label}: names differ: {sorted(set(a) ^ set(b))}"
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (label, k)
        assert torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k].reshape(1).view(torch.uint8),
                           b[k].view(torch.uint8) if b[k].dim() else b[k].reshape(1).view(torch.uint8)), (label, k)


def write_expected(tensors, path):
    from safetensors.torch import save_file
    save_file({k: v.clone() for k, v in tensors.items()}, path)


def loaded_by_torch(ckpt):
    """The checkpoint's tensors as torch's own dcp_to_torch_save gives them."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as tmp:
        pt = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(ckpt, pt)
        return tensors_of(torch.load(pt, weights_only=False))


def single(out):
    model = build()
    optim = train_one_step(model)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    ckpt = os.path.join(out, "single_plain", "ckpt")
    dcp.save(state, checkpoint_id=ckpt, no_dist=True)
    got = loaded_by_torch(ckpt)
    assert_same(got, tensors_of(state), "single_plain")
    write_expected(got, os.path.join(out, "single_plain", "expected.safetensors"))


def worker(out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    from torch.distributed.checkpoint import HuggingFaceStorageWriter, HuggingFaceStorageReader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build()
    fully_shard(model.gate, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = train_one_step(model)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    full_msd, full_osd = get_state_dict(model, optim,
                                        options=StateDictOptions(full_state_dict=True))
    truth = tensors_of({"model": full_msd, "optim": full_osd})

    writers = {
        "fsdp2_plain": lambda p: FileSystemWriter(p),
        "fsdp2_zstd": lambda p: FileSystemWriter(p, _extensions=[ZStandard()]),
        "fsdp2_safetensors": lambda p: FileSystemWriter(
            p, serialization_format=SerializationFormat.SAFETENSORS),
        "fsdp2_rank_local": lambda p: FileSystemWriter(p),
    }
    for case, make in writers.items():
        ckpt = os.path.join(out, case, "ckpt")
        dcp.save(state, storage_writer=make(ckpt), use_collectives=case != "fsdp2_rank_local")
        dist.barrier()
        if rank == 0 and case in ("fsdp2_plain", "fsdp2_zstd"):
            got = loaded_by_torch(ckpt)
            assert_same(got, truth, case)
            write_expected(got, os.path.join(out, case, "expected.safetensors"))
        elif rank == 0:
            # torch cannot read these back itself: rank_local has no .metadata (its loaders
            # need the global one), and FileSystemReader.read_data torch.loads every tensor
            # item, so it fails on its own SAFETENSORS serialization ("Unsupported operand
            # 192"). The expected values are the live model's full state dict, which
            # fsdp2_plain's read back equals.
            write_expected(truth, os.path.join(out, case, "expected.safetensors"))
        dist.barrier()

    case = "hf_consolidated"
    ckpt = os.path.join(out, case, "ckpt")
    names = sorted(k for k, v in msd.items() if isinstance(v, torch.Tensor))
    mapping = {k: 1 + (i % 2) for i, k in enumerate(names)}  # two consolidated files
    dcp.save(msd, storage_writer=HuggingFaceStorageWriter(
        ckpt, fqn_to_index_mapping=mapping, save_distributed=True, enable_consolidation=True))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    dist.barrier()
    if rank == 0:
        target = {k: torch.zeros_like(v) for k, v in tensors_of(full).items()}
        dcp.load(target, storage_reader=HuggingFaceStorageReader(ckpt), no_dist=True)
        want = {f"model.{k}": v for k, v in target.items()}
        assert_same(want, {k: v for k, v in truth.items() if k.startswith("model.")}, case)
        write_expected(target, os.path.join(out, case, "expected.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    out = os.path.abspath(sys.argv[1])
    for case in ["single_plain"] + FSDP2_CASES:
        shutil.rmtree(os.path.join(out, case), ignore_errors=True)
        os.makedirs(os.path.join(out, case))
    single(out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torchrun  # testdata/real/torchrun.py: repeats a run whose worker died by a signal
    torchrun.check_run(2, os.environ.get("FC_TORCHRUN_PORT", "29531"),
                       [os.path.abspath(__file__), "--worker", out], env,
                       [os.path.join(out, case) for case in FSDP2_CASES])
    import safetensors
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({"torch": torch.__version__, "safetensors": safetensors.__version__,
                   "python": platform.python_version()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
