"""A real DeepSpeed checkpoint for bench/peers.sh, written on CPU by DeepSpeed itself.

usage: ~/.cache/fc-interop/torch/bin/python bench/peers/make_ds.py OUT STAGE SIZE_GB

Runs `python -m torch.distributed.run --nproc-per-node 2` (gloo, DS_ACCELERATOR=cpu, as
testdata/real/deepspeed/make_fixtures.py does), deepspeed.initialize with ZeRO stage STAGE
(2 or 3), bf16, "torch_adam": true AdamW, one training step of a stack of Linear(H, H)
layers (H = 2048, bias on), then engine.save_checkpoint(OUT, tag="global_step1").

Sized so that model + optimizer state on disk is about SIZE_GB: per parameter ZeRO-2 saves
2 bytes (bf16 module in mp_rank_00_model_states.pt) + 12 (fp32 master, exp_avg,
exp_avg_sq in the optimizer files), ZeRO-3 12 (its model states hold placeholders).
The layer count is odd-sized against the two ranks' flat partitions only by chance; with
H * H + H elements per layer and two ranks the partition boundary falls inside a layer.
"""
import os
import re
import subprocess
import sys

H = 2048


def worker(out, stage, size_gb):
    import deepspeed
    import torch
    import torch.distributed as dist
    from torch import nn
    deepspeed.init_distributed(dist_backend="gloo")
    per_param = 14 if stage == 2 else 12
    layers = max(1, round(size_gb * 1e9 / per_param / (H * H + H)))
    torch.manual_seed(1234)
    model = nn.Sequential(*[nn.Linear(H, H) for _ in range(layers)])
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "train_batch_size": dist.get_world_size(),
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "bf16": {"enabled": True},
           "steps_per_print": 1000, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(1, H, generator=g).to(torch.bfloat16)
    loss = engine(x).float().square().mean()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out, tag="global_step1")
    dist.barrier()
    if dist.get_rank() == 0:
        n = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
        print(f"{out}: ZeRO-{stage} bf16, {layers} x Linear({H}, {H}), {n} params, dp 2",
              flush=True)


def main():
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return
    out, stage, size_gb = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache",
                                                        "fc-interop", "torch_extensions"))
    port = os.environ.get("FC_TORCHRUN_PORT", "29631")
    # A worker killed by a signal (gloo start-up on 2 cores, seen in CI) is retried twice,
    # as make_fixtures.py does; an ordinary error is final.
    for attempt in range(3):
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            "2", "--master-port", port, os.path.abspath(__file__), "--worker",
                            out, stage, size_gb], env=env, capture_output=True, text=True)
        if p.returncode == 0:
            print(p.stdout.strip().splitlines()[-1])
            for f in os.listdir(out):  # the zero_to_fp32.py copy DeepSpeed drops in
                if f.endswith(".py"):
                    os.remove(os.path.join(out, f))
            return
        if not re.search(r"exitcode: -\d+", p.stderr) or attempt == 2:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
            sys.exit(1)
        sys.stderr.write("a worker died by a signal; running it again\n")


if __name__ == "__main__":
    main()
