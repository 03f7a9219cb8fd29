#!/usr/bin/env python3
"""A synthetic DeepSpeed ZeRO-2 checkpoint for bench/run.sh export-deepspeed, written with
Debian's torch 1.13 (/usr/bin/python3) as DeepSpeedEngine.save_checkpoint lays it out
(shared/reference/deepspeed.md sections 1-3), sized SIZE_GB in all:

  OUT/latest -> global_step1
  OUT/global_step1/mp_rank_00_model_states.pt      fp16 module (views of one flat buffer),
                                                   param_shapes, buffer_names, ...
  OUT/global_step1/zero_pp_rank_R_mp_rank_00_optim_states.pt   R < DP: the rank's fp32
                                                   partition (padding stripped), exp_avg,
                                                   exp_avg_sq (padded), param_slice_mappings

One param group; the flat buffer is padded to a multiple of 2 * DP and cut in DP equal
partitions, so partitions start and end inside params (the params have 1000 columns).
Per param element the files hold 14 bytes (2 fp16 + 3 x 4 fp32). Values are uniform noise
written partition by partition (no full-model tensor in memory): a few seconds per GB.

usage: /usr/bin/python3 bench/make_deepspeed_ckpt.py OUT SIZE_GB [DP=8]
"""
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata",
                                "gen", "deepspeed"))
import gen  # noqa: E402  (registers the DeepSpeed stand-in classes the pickles name)

TAG = "global_step1"


def main():
    out, size_gb = sys.argv[1], float(sys.argv[2])
    dp = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    total = int(size_gb * 1e9 / 14)
    cols = 1000
    rows = 4096
    shapes = collections.OrderedDict()
    left, i = total, 0
    while left > 0:
        r = max(1, min(rows, left // cols))
        shapes["layers.%d.weight" % i] = (r, cols) if left >= cols else (left,)
        left -= r * cols if left >= cols else left
        i += 1
    numel = sum(gen.numel(s) for s in shapes.values())
    align = 2 * dp
    padded = (numel + align - 1) // align * align
    ps = padded // dp
    tagdir = os.path.join(out, TAG)
    os.makedirs(tagdir, exist_ok=True)
    with open(os.path.join(out, "latest"), "w") as f:
        f.write(TAG)
    torch.manual_seed(0)
    flat16 = torch.empty(numel, dtype=torch.float16).uniform_(-1, 1)
    module = collections.OrderedDict()
    off = 0
    for name, shape in shapes.items():
        n = gen.numel(shape)
        module[name] = flat16[off:off + n].view(shape)
        off += n
    sd = gen.common_state(module, [collections.OrderedDict(
        (k, torch.Size(v)) for k, v in shapes.items())], [], dp, 1, 2, False)
    sd["checkpoint_parallel_dimensions"] = {"pp_degree": 1, "tp_degree": 1}
    torch.save(sd, os.path.join(tagdir, "mp_rank_00_model_states.pt"))
    del module, sd, flat16
    for r in range(dp):
        left = r * ps
        pad = ps if numel <= left else (left + ps - numel if numel < left + ps else 0)
        lean = ps - pad
        part = torch.empty(ps).uniform_(-1, 1)
        part[lean:] = 0
        exp_avg = torch.empty(ps).uniform_(-1e-3, 1e-3)
        exp_avg_sq = torch.empty(ps).uniform_(0, 1e-6)
        exp_avg[lean:] = 0
        exp_avg_sq[lean:] = 0
        mapping = collections.OrderedDict()
        off = 0
        for name, shape in shapes.items():
            n = gen.numel(shape)
            lo, hi = max(off, left), min(off + n, left + ps)
            if lo < hi:
                mapping[name] = gen.fragment_address(numel=hi - lo, start=lo - left)
            off += n
        osd = {"loss_scaler": gen.DynamicLossScaler(), "dynamic_loss_scale": True,
               "overflow": False, "clip_grad": 1.0,
               "base_optimizer_state": {
                   "state": {0: {"step": torch.tensor(1.0), "exp_avg": exp_avg,
                                 "exp_avg_sq": exp_avg_sq}},
                   "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08,
                                     "weight_decay": 0.0, "amsgrad": False, "params": [0]}]},
               "single_partition_of_fp32_groups": [part[:lean]],
               "zero_stage": gen.ZeroStageEnum(2), "group_paddings": [pad],
               "partition_count": dp, "ds_version": gen.DS_VERSION,
               "param_slice_mappings": [mapping]}
        torch.save({"optimizer_state_dict": osd, "ds_config": gen.ds_config(2, False),
                    "ds_version": gen.DS_VERSION},
                   os.path.join(tagdir, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
    print("%s: %d params, %d elements, dp %d" % (out, len(shapes), numel, dp))


if __name__ == "__main__":
    main()
