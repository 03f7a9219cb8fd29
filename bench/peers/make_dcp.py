"""A real torch 2.15 DCP checkpoint saved by 2 ranks, for bench/peers.sh.

usage: ~/.cache/fc-interop/torch/bin/python bench/peers/make_dcp.py OUT SIZE_GB

`python -m torch.distributed.run --nproc-per-node 2` (gloo, CPU device mesh), a stack of
Linear(H, H) layers (H = 2048, fp32), FSDP2 `fully_shard` on each layer and the root
(DTensor Shard(0): each rank holds half the rows), one AdamW step, then
`dcp.save({"model": msd, "optim": osd})` of `get_state_dict(model, optim)` (the default
FileSystemWriter: one `__R_0.distcp` per rank + `.metadata`), as testdata/real/torch's
fsdp2_plain case. 12 bytes per parameter (weight, exp_avg, exp_avg_sq), sized to SIZE_GB.
"""
import os
import re
import subprocess
import sys

H = 2048


def worker(out, size_gb):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    layers = max(1, round(size_gb * 1e9 / 12 / (H * H + H)))
    torch.manual_seed(1234)
    model = nn.Sequential(*[nn.Linear(H, H) for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    model(torch.randn(2, H, generator=g)).square().mean().backward()
    optim.step()
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=out)
    dist.barrier()
    if dist.get_rank() == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"{out}: torch DCP, FSDP2 2 ranks, {layers} x Linear({H}, {H}) fp32 + AdamW, "
              f"{n} params", flush=True)
    dist.destroy_process_group()


def main():
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], float(sys.argv[3]))
        return
    out, size_gb = os.path.abspath(sys.argv[1]), sys.argv[2]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = os.environ.get("FC_TORCHRUN_PORT", "29632")
    for attempt in range(3):  # a worker killed by a signal is retried (make_fixtures.py)
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            "2", "--master-port", port, os.path.abspath(__file__), "--worker",
                            out, size_gb], env=env, capture_output=True, text=True)
        if p.returncode == 0:
            print(p.stdout.strip().splitlines()[-1])
            return
        if not re.search(r"exitcode: -\d+", p.stderr) or attempt == 2:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
            sys.exit(1)
        sys.stderr.write("a worker died by a signal; running it again\n")


if __name__ == "__main__":
    main()
