#!/usr/bin/env python3
# The repository's copy of the team's shared/tools/torch_dcp_fixture.py (unchanged below this
# line), so that testdata/gen/torch_dcp/regen.sh and its check run from a clone.
"""Write a real PyTorch Distributed Checkpoint (DCP) from a JSON spec, using the
torch 1.13 packaged by Debian (apt-get install python3-torch python3-numpy), so
that readers can be tested against files that torch itself wrote.

usage: /usr/bin/python3 torch_dcp_fixture.py SPEC.json OUT_DIR

SPEC.json:
{
  "world": 4,                      # number of ranks (gloo processes on this machine)
  "seed": 1,
  "tensors": [
    {"name": "w", "shape": [8, 6], "dtype": "float32",     # float32|float16|bfloat16|int64|...
     "split": {"axis": 0, "ranks": [0, 1, 2, 3]}},          # even split over these ranks
    {"name": "v", "shape": [10], "dtype": "bfloat16",
     "split": {"axis": 0, "ranks": [0, 1], "sizes": [7, 3]}},  # uneven split
    {"name": "b", "shape": [6], "dtype": "float32", "on": 2},    # whole tensor held by rank 2
    {"name": "c", "shape": [3, 4], "dtype": "float32",
     "chunks": [[0, [0, 0], [3, 2]], [3, [0, 2], [3, 2]]]}      # explicit [rank, offset, size]
  ],
  "objects": {"iteration": 100}      # non-tensor values, saved by rank 0
}

OUT_DIR/ckpt      the checkpoint (.metadata + __<rank>_<n>.distcp files)
OUT_DIR/expected  one <name>.npy per tensor with its full value (bfloat16 as uint16 bit patterns)
Tensor values are reproducible from the seed. torch 1.13 DCP saves plain tensors from
rank 0 only, so every tensor here is saved as a ShardedTensor.
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch113_shim  # noqa: F401
import numpy as np
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed._shard.sharded_tensor import init_from_local_shards, Shard, ShardMetadata
import torch.distributed._shard.checkpoint as dcp


def full_value(t, seed):
    g = torch.Generator().manual_seed(seed + sum(map(ord, t["name"])))
    dt = getattr(torch, t["dtype"])
    shape = t["shape"]
    if dt.is_floating_point:
        return torch.randn(shape, generator=g).to(dt)
    return torch.randint(-1000, 1000, shape, generator=g).to(dt)


def chunks_of(t):
    if "chunks" in t:
        return [(r, list(o), list(s)) for r, o, s in t["chunks"]]
    if "on" in t:
        return [(t["on"], [0] * len(t["shape"]), list(t["shape"]))]
    sp = t["split"]; ax = sp["axis"]; ranks = sp["ranks"]
    n = t["shape"][ax]
    sizes = sp.get("sizes") or [n // len(ranks)] * len(ranks)
    assert sum(sizes) == n, f"{t['name']}: split sizes {sizes} do not add up to {n}"
    out, off = [], 0
    for r, s in zip(ranks, sizes):
        o = [0] * len(t["shape"]); o[ax] = off
        sz = list(t["shape"]); sz[ax] = s
        out.append((r, o, sz)); off += s
    return out


def run(rank, spec, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=spec["world"])
    sd = {}
    for t in spec["tensors"]:
        full = full_value(t, spec.get("seed", 0))
        shards = []
        for r, o, s in chunks_of(t):
            if r != rank: continue
            local = full[tuple(slice(a, a + b) for a, b in zip(o, s))].clone().contiguous()
            shards.append(Shard(local, ShardMetadata(o, s, f"rank:{rank}/cpu")))
        sd[t["name"]] = init_from_local_shards(shards, t["shape"])
    if rank == 0:
        sd.update(spec.get("objects", {}))
    dcp.save_state_dict(sd, dcp.FileSystemWriter(out))
    dist.barrier()
    dist.destroy_process_group()


def main():
    spec = json.load(open(sys.argv[1])); out = sys.argv[2]
    os.makedirs(os.path.join(out, "expected"), exist_ok=True)
    port = 29000 + os.getpid() % 2000
    mp.spawn(run, args=(spec, os.path.join(out, "ckpt"), port), nprocs=spec["world"])
    for t in spec["tensors"]:
        v = full_value(t, spec.get("seed", 0))
        a = v.view(torch.int16).numpy().view(np.uint16) if v.dtype == torch.bfloat16 else v.numpy()
        np.save(os.path.join(out, "expected", t["name"] + ".npy"), a)
    print("wrote", out)


if __name__ == "__main__":
    main()
