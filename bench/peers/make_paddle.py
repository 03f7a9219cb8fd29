"""A real PaddlePaddle 3.3.1 distributed checkpoint saved by 2 ranks, for bench/peers.sh.

usage: ~/.cache/fc-interop/paddle/bin/python bench/peers/make_paddle.py OUT SIZE_GB
       ~/.cache/fc-interop/paddle/bin/python bench/peers/make_paddle.py --merge SRC OUT

`python -m paddle.distributed.launch --nproc_per_node 2` (CPU, gloo), then
`paddle.distributed.save_state_dict` of fp32 [H, H] tensors (H = 2048) as
`Shard(0)` dist tensors on a 2-rank mesh (each rank's rows made by that rank:
`dtensor_from_local`), named as a Paddle Linear stack with
AdamW moments: `linear_I.w_0`, `linear_I.w_0.moment1_0`, `linear_I.w_0.moment2_0`, enough
layers for SIZE_GB (12 bytes per weight element; random values, no training: the merge
reads bytes, not meaning). Files: `0.metadata`, `0_0.distcp`, `1_0.distcp` (paddle.save
pickles).

--merge is the peer: Paddle's own merge tool,
paddle.distributed.flex_checkpoint.dcp.load_state_dict.merge_sharded_state_dict(SRC, OUT)
in one process (world size 1): every tensor loaded full, written as
OUT/model-00001-of-00001.safetensors + model.safetensors.index.json.
"""
import os
import subprocess
import sys

H = 2048


def worker(out, size_gb):
    import numpy as np
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.api import dtensor_from_local
    dist.init_parallel_env()
    mesh = dist.ProcessMesh([0, 1], dim_names=["x"])
    layers = max(1, round(size_gb * 1e9 / 12 / (H * H)))
    # Each rank makes only its own rows (dtensor_from_local): a whole tensor on each rank
    # first, sharded after, ran this 23 GB VM out of memory at 10 GB.
    rank = dist.get_rank()
    rng = np.random.default_rng(7 + rank)
    state = {}
    for i in range(layers):
        for suffix, scale in (("", 0.02), (".moment1_0", 1e-3), (".moment2_0", 1e-6)):
            a = (rng.standard_normal((H // 2, H), dtype=np.float32) * scale).astype(np.float32)
            state[f"linear_{i}.w_0{suffix}"] = dtensor_from_local(paddle.to_tensor(a), mesh,
                                                                  [dist.Shard(0)])
    dist.save_state_dict(state, out)
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"{out}: Paddle save_state_dict, 2 ranks, {layers} x 3 fp32 [{H}, {H}] Shard(0)",
              flush=True)


def merge(src, out):
    from paddle.distributed.flex_checkpoint.dcp.load_state_dict import merge_sharded_state_dict
    merge_sharded_state_dict(src, out)


def main():
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], float(sys.argv[3]))
        return
    if sys.argv[1] == "--merge":
        merge(sys.argv[2], sys.argv[3])
        return
    out, size_gb = os.path.abspath(sys.argv[1]), sys.argv[2]
    log = out + ".launch-log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                        "2", "--log_dir", log, os.path.abspath(__file__), "--worker", out,
                        size_gb], env=env, capture_output=True, text=True)
    logs = ""
    for f in sorted(os.listdir(log)) if os.path.isdir(log) else []:
        logs += f"--- {f}\n" + open(os.path.join(log, f), errors="replace").read()[-3000:]
    if p.returncode != 0:
        sys.exit(f"paddle.distributed.launch failed: exit {p.returncode}\n{p.stdout[-2000:]}\n"
                 f"{p.stderr[-2000:]}\n{logs}")
    print([l for l in logs.splitlines() if "Paddle save_state_dict" in l][-1:] or "saved")
    subprocess.run(["rm", "-rf", log])


if __name__ == "__main__":
    main()
