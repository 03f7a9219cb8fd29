#!/usr/bin/env python3
"""Write tiny DeepSpeed checkpoint directories without DeepSpeed (it is not installed here),
with Debian's torch 1.13 (/usr/bin/python3), exactly as shared/reference/deepspeed.md lays
them out (DeepSpeedEngine._save_checkpoint / _save_zero_checkpoint, stage_1_and_2.state_dict,
bf16_optimizer.state_dict, stage3._rigid_state_dict).

The pickles name the real DeepSpeed classes: tiny stand-ins are registered as fake modules in
sys.modules with the right __module__ / __qualname__, so torch.save writes
  GLOBAL deepspeed.runtime.zero.config.ZeroStageEnum        REDUCE (int,)    (an int Enum)
  GLOBAL deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler  NEWOBJ + BUILD {__dict__}
  GLOBAL deepspeed.utils.tensor_fragment.fragment_address   NEWOBJ + BUILD {numel, start}
  GLOBAL argparse.Namespace (real), numpy.core.multiarray._reconstruct (real RNG state)
  GLOBAL collections.OrderedDict, torch.Size (real)

Fixtures (each OUT_ROOT/<case>/ckpt is a DeepSpeed save dir with `latest` -> global_step3):
  zero1        stage 1, fp16, dp 2, one param group, a buffer, a client-state object of an
               unknown class (megatron.training.state.TrainerState: opaque, reported)
  zero2        stage 2, fp16, dp 3, two param groups (odd sizes: a rank holding only padding)
  bf16         BF16_Optimizer (no zero_stage, padded partitions, bf16_ prefix), dp 2
  tp2          stage 1, fp16, tp 2 x dp 2; Megatron-style client state (argparse.Namespace,
               numpy RNG state)
  frozen_tied  stage 2, fp16, dp 2, a frozen param (frozen_param_shapes/_fragments) and a
               tied weight (shared_params alias -> owner); ZeroStageEnum pickled the
               Python < 3.11 way, REDUCE (value,) (the other cases: getattr(cls, 'name'))
  zero3        stage 3, fp16, dp 2, two sub-groups, ceil-div per-param padding, a frozen param
  pp2          pipeline, pp 2 x dp 2: mp_rank_XX (module None) + layer_LL-model_00 files, a
               tied embedding saved by layers 0 and 4 and trained by both stages
  pp2_tp2      pipeline x TP, pp 2 x tp 2 x dp 2, universal_checkpoint_info
  tp2_ucp      tp 2 x dp 2 with universal_checkpoint_info (vocab, column, row, 2 sub-params,
               replicated); two module weights saved column-major (strided views)
  tp2_avg      tp 2 with a parameter_to_average_patterns param (kept per rank by fc)
  ucp          ds_to_universal.py's output for frozen_tied (latest_universal, zero/<param>/)
  ucp_tp2      ds_to_universal.py's output for tp2_ucp (TP slices merged by its rules)
  ucp_zero3    ds_to_universal.py's stage-3 output for zero3 (raw 1-D tensors, no step.pt)
  moe          MoE: non-expert module weights + layer_0_expert_{0,1} files + expp optimizer
  moe_zero2    MoE with ZeRO-2: dp 4, ep 2, 4 experts; expert groups partitioned over the
               expert-data-parallel group (ranks e, e + 2), local names in the mappings
  moe_zero1_dbe  MoE with ZeRO-1: dp 6, ep 3, 6 experts, use_data_before_expert_parallelism
               (expert-DP groups {0,1}, {2,3}, {4,5})
  moe_bf16     MoE with BF16_Optimizer: dp 4, ep 2, bf16 weights, padded fp32 partitions
  legacy       like frozen_tied, every file in torch.save's legacy (non-zip) format

The 16-bit module weights of stage 0-2 are views of one flat 16-bit buffer (as DeepSpeed's
flattened bit16 groups are), so the pickles carry storage offsets; the fp32 partition of
ZeRO-1/2 is saved as the view part[:lean] (the file holds the padded storage).

Expected values are computed by an independent reconstruction that torch.load()s the written
files and follows zero_to_fp32's algorithm (deepspeed.md 3.3 / 4.2), not the writer's
in-memory values; write_expected then asserts (check_truth, on every run and --check) that
they equal, bit for bit, the ground truth each case was built from (TRUTH: the fp32 masters
and Adam states before partitioning, the module weights as the masters cast to 16 bits,
frozen params, buffers and steps as drawn; TP-merged keys: each TP rank's truth found where
the merge rules put it, by offset arithmetic apart from merge_tp):
  OUT_ROOT/<case>/expected/<key>.npy   full value, C order; float16 as '<f2', bfloat16 as
                                        uint16 bits, 0-d step as a 0-d '<f4'
Keys (fc's names, include/fc/format/deepspeed.h): <param> fp32 master weight (frozen params
and buffers: as stored), module.<param> the module state dict tensor, optimizer.exp_avg.<param>,
optimizer.exp_avg_sq.<param>, optimizer.step.<param>; with tp > 1 every key is prefixed by
mp_rank_XX. unless the checkpoint carries universal_checkpoint_info (then merged with
ds_to_universal's merge_tp_slices rules, see merge_tp).

usage: /usr/bin/python3 testdata/gen/deepspeed/gen.py [OUT_ROOT]
       /usr/bin/python3 testdata/gen/deepspeed/gen.py --check [OUT_ROOT]
--check regenerates into a temporary directory and compares every file byte for byte with
OUT_ROOT (default: testdata/deepspeed next to this script's testdata/gen).
"""
import argparse
import collections
import dataclasses
import enum
import filecmp
import os
import re
import shutil
import sys
import tempfile
import types
import zlib

import numpy as np
import torch


def _fake_module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
    return sys.modules[name]


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


ZeroStageEnum.__module__ = "deepspeed.runtime.zero.config"
_fake_module("deepspeed.runtime.zero.config").ZeroStageEnum = ZeroStageEnum


class DynamicLossScaler:
    def __init__(self):
        self.cur_scale = 65536.0
        self.cur_iter = 3
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = 1000


DynamicLossScaler.__module__ = "deepspeed.runtime.fp16.loss_scaler"
_fake_module("deepspeed.runtime.fp16.loss_scaler").DynamicLossScaler = DynamicLossScaler


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    numel: int
    start: int


fragment_address.__module__ = "deepspeed.utils.tensor_fragment"
_fake_module("deepspeed.utils.tensor_fragment").fragment_address = fragment_address

@dataclasses.dataclass
class SubparamShape:  # deepspeed.checkpoint.universal_checkpoint.SubparamShape
    patterns: list
    shape: tuple
    partition_dim: int


SubparamShape.__module__ = "deepspeed.checkpoint.universal_checkpoint"
_fake_module("deepspeed.checkpoint.universal_checkpoint").SubparamShape = SubparamShape


class TrainerState:
    """A client-state object of a class fc does not know (kept opaque, reported)."""

    def __init__(self):
        self.consumed_samples = 24


TrainerState.__module__ = "megatron.training.state"
_fake_module("megatron.training.state").TrainerState = TrainerState

TAG = "global_step3"
DS_VERSION = "0.16.4"


def values(n, seed, positive=False):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g, dtype=torch.float32)
    return v.abs() + 0.01 if positive else v


def name_seed(name):
    """A seed offset from a param's name alone (not its offset in a group, which may differ
    between TP ranks)."""
    return zlib.crc32(name.encode()) % 100000


def tp_replicated(info, names):
    """The names that universal_checkpoint_info's tp_replicated_parameter_patterns match."""
    pats = (info or {}).get("tp_replicated_parameter_patterns", [])
    return {n for n in names if any(re.match(p, n) for p in pats)}


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def ds_config(stage, bf16):
    return {"train_batch_size": 8, "zero_optimization": {"stage": stage},
            ("bf16" if bf16 else "fp16"): {"enabled": True},
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}


def zero12_rank_states(groups, dp, seed, stage, bf16_optimizer, master, same=(), same_seed=0,
                       moments=None, preset=None, replicated=(), rep_seed=0):
    """groups: list of OrderedDict name->shape. Returns (per-rank OSD list, flat bit16 list).

    master: dict name -> fp32 value (filled here). Params named in `same` take their values
    from same_seed (equal on every TP rank / pipeline stage: replicated or tied params).
    moments: None or {"exp_avg": {}, "exp_avg_sq": {}}, filled with each param's Adam
    states, cut from the group's source values before they are partitioned (ground truth).
    preset: name -> fp32 value to use instead of generating one (a pipeline-tied param's
    value from the first stage holding it).
    replicated: TP-replicated params (tp_replicated_parameter_patterns), whose master (unless
    preset or in `same`) and Adam states are drawn from rep_seed and the name alone, so they
    are equal on every TP rank, as a real run keeps them (ds_to_universal asserts it)."""
    per_rank = [dict(single=[], paddings=[], mappings=[], state={}) for _ in range(dp)]
    flats16 = []
    align = 2 * dp
    for gi, shapes in enumerate(groups):
        orig = sum(numel(s) for s in shapes.values())
        padded = (orig + align - 1) // align * align
        ps = padded // dp
        flat = torch.zeros(padded)
        off = 0
        for name, shape in shapes.items():
            n = numel(shape)
            if preset and name in preset:
                v = preset[name].reshape(-1).clone()
            elif name in replicated and name not in same:
                v = values(n, rep_seed + name_seed(name))
            else:
                v = values(n, (same_seed if name in same else seed) + 17 * gi + off)
            flat[off:off + n] = v
            master[name] = v.reshape(shape)
            off += n
        exp_avg = torch.zeros(padded)
        exp_avg[:orig] = values(orig, seed + 1000 + gi)
        exp_avg_sq = torch.zeros(padded)
        exp_avg_sq[:orig] = values(orig, seed + 2000 + gi, positive=True)
        off = 0
        for name, shape in shapes.items():
            n = numel(shape)
            if name in replicated:
                exp_avg[off:off + n] = values(n, rep_seed + 1000 + name_seed(name))
                exp_avg_sq[off:off + n] = values(n, rep_seed + 2000 + name_seed(name),
                                                 positive=True)
            off += n
        if moments is not None:
            off = 0
            for name, shape in shapes.items():
                n = numel(shape)
                moments["exp_avg"][name] = exp_avg[off:off + n].reshape(shape).clone()
                moments["exp_avg_sq"][name] = exp_avg_sq[off:off + n].reshape(shape).clone()
                off += n
        flats16.append(flat)
        for r in range(dp):
            left = r * ps
            if orig <= left:
                pad = ps
            elif orig < left + ps:
                pad = left + ps - orig
            else:
                pad = 0
            part = flat[left:left + ps].clone()
            lean = ps - pad
            st = per_rank[r]
            st["single"].append(part if bf16_optimizer else part[:lean])
            st["paddings"].append(pad)
            m = collections.OrderedDict()
            off = 0
            for name, shape in shapes.items():
                n = numel(shape)
                lo, hi = max(off, left), min(off + n, left + ps)
                if lo < hi:
                    m[name] = fragment_address(numel=hi - lo, start=lo - left)
                off += n
            st["mappings"].append(m)
            st["state"][gi] = {"step": torch.tensor(3.0),
                               "exp_avg": exp_avg[left:left + ps].clone(),
                               "exp_avg_sq": exp_avg_sq[left:left + ps].clone()}
    out = []
    for r in range(dp):
        st = per_rank[r]
        base = {"state": st["state"],
                "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08,
                                  "weight_decay": 0.0, "amsgrad": False, "params": [gi]}
                                 for gi in range(len(groups))]}
        if bf16_optimizer:
            osd = {"clip_grad": 1.0, "base_optimizer_state": base,
                   "single_partition_of_fp32_groups": st["single"],
                   "group_paddings": st["paddings"], "partition_count": dp,
                   "ds_version": DS_VERSION, "param_slice_mappings": st["mappings"]}
        else:
            osd = {"loss_scaler": DynamicLossScaler(), "dynamic_loss_scale": True,
                   "overflow": False, "clip_grad": 1.0, "base_optimizer_state": base,
                   "single_partition_of_fp32_groups": st["single"],
                   "zero_stage": ZeroStageEnum(stage), "group_paddings": st["paddings"],
                   "partition_count": dp, "ds_version": DS_VERSION,
                   "param_slice_mappings": st["mappings"]}
        out.append(osd)
    return out, flats16


def module_from_flats(groups, flats16, dtype):
    """16-bit module weights as views of the flat bit16 buffers (like DeepSpeed's)."""
    module = collections.OrderedDict()
    for shapes, flat in zip(groups, flats16):
        f16 = flat.to(dtype)
        off = 0
        for name, shape in shapes.items():
            n = numel(shape)
            module[name] = f16[off:off + n].view(shape)
            off += n
    return module


# --- Ground truth ---------------------------------------------------------------------
# The values each case was built from, before any partitioning, flattening, padding or TP
# split: per TP rank (mp rank) {expected key: tensor}. write_expected asserts that the
# expected values (the rebuild of zero_to_fp32 / ds_to_universal, reconstruct()) equal them
# bit for bit, so a bug of the generator or of its rebuild cannot become an expected value.
TRUTH = {}  # abspath(OUT/<case>) -> (per-TP-rank truths, universal_checkpoint_info or None)


def truth_of_params(master, moments, dtype):
    """A rank's trained params: the fp32 master, the module weight (the master cast to the
    16-bit dtype), the Adam states and the step (3)."""
    truth = collections.OrderedDict()
    for name, v in master.items():
        truth[name] = v.clone()
        truth["module." + name] = v.to(dtype)
        for key in ("exp_avg", "exp_avg_sq"):
            truth["optimizer.%s.%s" % (key, name)] = moments[key][name]
        truth["optimizer.step." + name] = torch.tensor(3.0)
    return truth


def record_truth(out, case, ranks, info=None):
    TRUTH[os.path.abspath(os.path.join(out, case))] = (ranks, info)


def same_bits(a, b):
    return (isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and
            to_numpy(a).tobytes() == to_numpy(b).tobytes())


def tp_segments(name, slices, info):
    """Where each TP rank's slice lies in the merged tensor, by offset arithmetic written
    apart from merge_tp: (dim, [per rank [(merged offset, slice offset, length)]])."""
    def match(key):
        return any(re.match(p, name) for p in info.get(key, []))
    tp = len(slices)
    entry, pattern = match_sub_params(info, name)
    if match("parameter_with_2_sub_params_cat_dim_0"):
        h = [s.shape[0] // 2 for s in slices]
        return 0, [[(sum(h[:t]), 0, h[t]), (sum(h) + sum(h[:t]), h[t], h[t])]
                   for t in range(tp)]
    if entry:
        pd = entry["partition_dim"]
        spec = entry["shape"][pd]
        if info["universal_checkpoint_version"] >= 0.4:
            sizes, widths = list(spec), info["sub_param_shard_widths"][pattern]
        else:
            if isinstance(spec, int):
                spec = [sum(s.shape[pd] for s in slices) // spec] * spec
            sizes, widths = list(spec), [[z // tp] * tp for z in spec]
        return pd, [[(sum(sizes[:k]) + sum(widths[k][:t]), sum(w[t] for w in widths[:k]),
                      widths[k][t]) for k in range(len(sizes))] for t in range(tp)]
    d = 1 if match("parameter_with_row_parallelism_patterns") else 0
    return d, [[(sum(s.shape[d] for s in slices[:t]), 0, slices[t].shape[d])]
               for t in range(tp)]


def check_tp_merged(key, name, got, slices, info):
    """got (an expected value) holds every TP rank's truth slice where the merge rules put
    it; a vocabulary param is cut to original_vocab_size."""
    d, segs = tp_segments(name, slices, info)
    vocab = any(re.match(p, name) for p in info.get("vocabulary_parameter_patterns", []))
    full = sum(n for per in segs for _, _, n in per)
    want_len = min(full, info["original_vocab_size"]) if vocab else full
    assert got.dtype == slices[0].dtype and got.shape[d] == want_len and all(
        got.shape[i] == slices[0].shape[i] for i in range(got.dim()) if i != d), (
        key, got.shape, [s.shape for s in slices])
    for t, per in enumerate(segs):
        for mo, so, n in per:
            n = min(n, got.shape[d] - mo)
            if n > 0:
                assert same_bits(got.narrow(d, mo, n), slices[t].narrow(d, so, n)), (key, t)


# TP-replicated keys (tp_replicated_parameter_patterns) are drawn equal on every TP rank, as
# real training keeps them: check_truth asserts it (fc refuses a checkpoint whose replicas
# differ, as ds_to_universal does; deepspeed_refusals_test edits a fixture copy for that).


def check_truth(case_dir, exp):
    """exp (reconstruct() of the files) equals the case's ground truth, every key."""
    ranks, info = TRUTH[os.path.abspath(case_dir)]
    case = os.path.basename(os.path.abspath(case_dir))
    if len(ranks) == 1 or not info:
        want = collections.OrderedDict()
        for m, truth in enumerate(ranks):
            for k, v in truth.items():
                want[("mp_rank_%02d." % m if len(ranks) > 1 else "") + k] = v
        assert set(exp) == set(want), (
            case, sorted(set(exp) ^ set(want)))
        bad = [k for k in want if not same_bits(exp[k], want[k])]
        assert not bad, "%s: expected != ground truth: %s" % (case, bad)
        return
    def match(key, name):
        return any(re.match(p, name) for p in info.get(key, []))
    seen, unequal = set(), []
    for key in ranks[0]:
        name = key
        for pre in ("module.", "optimizer.exp_avg_sq.", "optimizer.exp_avg.", "optimizer.step."):
            if key.startswith(pre):
                name = key[len(pre):]
                break
        slices = [truth[key] for truth in ranks]
        # Kept per TP rank: a param to average, or (fc's rule) an untrained entry (buffer,
        # frozen param) whose TP copies are not merged: mp_rank_XX.<key> or
        # module.mp_rank_XX.<name>.
        per_rank = ["mp_rank_%02d.%s" % (t, key) for t in range(len(ranks))]
        if key.startswith("module.") and per_rank[0] not in exp:
            per_rank = ["module.mp_rank_%02d.%s" % (t, name) for t in range(len(ranks))]
        trained = "optimizer.step." + name in ranks[0]
        if ((match("parameter_to_average_patterns", name) or not trained) and
                key not in exp and all(k in exp for k in per_rank)):
            for k, sl in zip(per_rank, slices):
                assert same_bits(exp[k], sl), (case, k)
                seen.add(k)
            continue
        seen.add(key)
        if key.startswith("optimizer.step.") or match("tp_replicated_parameter_patterns", name):
            assert same_bits(exp[key], slices[0]), (case, key)
            if not all(same_bits(sl, slices[0]) for sl in slices[1:]):
                unequal.append(key)
            continue
        check_tp_merged(case + ": " + key, name, exp[key], slices, info)
    assert set(exp) == seen, (case, sorted(set(exp) ^ seen))
    assert not unequal, ("TP replicas differ", case, sorted(unequal))


def common_state(module, param_shapes, buffer_names, dp, mp, stage, bf16, **extra):
    sd = {"module": module, "buffer_names": buffer_names, "optimizer": None,
          "param_shapes": param_shapes, "frozen_param_shapes": None,
          "frozen_param_fragments": None, "shared_params": {}, "lr_scheduler": None,
          "data_sampler": None, "random_ltd": None, "sparse_tensor_module_names": set(),
          "skipped_steps": 0, "global_steps": 3, "global_samples": 24,
          "dp_world_size": dp, "mp_world_size": mp,
          "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": mp},
          "ds_config": ds_config(stage, bf16), "ds_version": DS_VERSION}
    sd.update(extra)
    return sd


LEGACY = [False]  # True: torch.save's legacy (non-zip) format (checkpoint_serialization false)


def save(obj, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path, _use_new_zipfile_serialization=not LEGACY[0])


def write_save_dir(root):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(TAG)


def gen_zero12(out, case, stage, dp, groups, seed, bf16_optimizer=False, mp=1,
               frozen=None, tied=None, client=None, same=(), strided=(), rank_groups=None):
    """rank_groups: per mp rank its own groups (uneven TP slices), instead of `groups`."""
    root = os.path.join(out, case, "ckpt")
    write_save_dir(root)
    tagdir = os.path.join(root, TAG)
    dtype = torch.bfloat16 if bf16_optimizer else torch.float16
    prefix = "bf16_" if bf16_optimizer else ""
    truth_ranks = []
    # TP-replicated params and buffers (universal_checkpoint_info at tp > 1): equal on every
    # TP rank, as in a real run.
    info = (client or {}).get("universal_checkpoint_info") if mp > 1 else None
    for m in range(mp):
        if rank_groups:
            groups = rank_groups[m]
        master = {}
        moments = {"exp_avg": {}, "exp_avg_sq": {}}
        replicated = tp_replicated(info, [n for g in groups for n in g])
        osds, flats16 = zero12_rank_states(groups, dp, seed + 100 * m, stage, bf16_optimizer,
                                           master, same, seed, moments, replicated=replicated,
                                           rep_seed=seed)
        truth = truth_of_params(master, moments, dtype)
        truth_ranks.append(truth)
        module = module_from_flats(groups, flats16, dtype)
        for name in strided:  # same values, column-major in the file (strides (1, rows))
            module[name] = module[name].t().contiguous().t()
        extra = {}
        if frozen:
            fshapes = collections.OrderedDict()
            frags = collections.OrderedDict()
            for i, (name, shape) in enumerate(frozen.items()):
                t = values(numel(shape), seed + 500 + i).reshape(shape).to(dtype)
                truth[name] = truth["module." + name] = t.clone()
                module[name] = t
                fshapes[name] = torch.Size(shape)
                frags[name] = t.detach().clone()
            extra["frozen_param_shapes"] = fshapes
            extra["frozen_param_fragments"] = frags
        if tied:
            for alias, owner in tied.items():
                module[alias] = module[owner]  # same tensor: one storage in the file
                truth[alias] = master[owner]
                truth["module." + alias] = master[owner].to(dtype)
            extra["shared_params"] = dict(tied)
        equal = same or tp_replicated(info, ["norm.running_mean"])
        module["norm.running_mean"] = values(4, seed + 900 + (0 if equal else m)).to(dtype)
        truth["norm.running_mean"] = module["norm.running_mean"].clone()
        truth["module.norm.running_mean"] = truth["norm.running_mean"]
        if client:
            extra.update(client)
        sd = common_state(module, [collections.OrderedDict(
            (k, torch.Size(v)) for k, v in g.items()) for g in groups],
            ["norm.running_mean"], dp, mp, stage, bf16_optimizer, **extra)
        save(sd, os.path.join(tagdir, "mp_rank_%02d_model_states.pt" % m))
        for r, osd in enumerate(osds):
            save({"optimizer_state_dict": osd, "ds_config": ds_config(stage, bf16_optimizer),
                  "ds_version": DS_VERSION},
                 os.path.join(tagdir, "%szero_pp_rank_%d_mp_rank_%02d_optim_states.pt" %
                              (prefix, r, m)))
    record_truth(out, case, truth_ranks, (client or {}).get("universal_checkpoint_info"))


def gen_zero3(out, case, dp, subgroups, frozen, seed):
    root = os.path.join(out, case, "ckpt")
    write_save_dir(root)
    tagdir = os.path.join(root, TAG)
    fp32 = [[] for _ in range(dp)]
    ea = [[] for _ in range(dp)]
    eas = [[] for _ in range(dp)]
    truth = collections.OrderedDict()
    for k, shapes in enumerate(subgroups):
        per_rank = [[] for _ in range(dp)]
        per_rank_a = [[] for _ in range(dp)]
        per_rank_s = [[] for _ in range(dp)]
        for i, (name, shape) in enumerate(shapes.items()):
            n = numel(shape)
            ps = -(-n // dp)
            w = values(n, seed + 10 * k + i)
            a = values(n, seed + 300 + 10 * k + i)
            sq = values(n, seed + 600 + 10 * k + i, True)
            truth[name] = w.reshape(shape).clone()
            truth["optimizer.exp_avg." + name] = a.reshape(shape).clone()
            truth["optimizer.exp_avg_sq." + name] = sq.reshape(shape).clone()
            truth["optimizer.step." + name] = torch.tensor(3.0)
            for src, dst, pos in ((w, per_rank, False), (a, per_rank_a, False),
                                  (sq, per_rank_s, True)):
                padded = torch.zeros(ps * dp)
                padded[:n] = src
                for r in range(dp):
                    dst[r].append(padded[r * ps:(r + 1) * ps])
        for r in range(dp):
            fp32[r].append(torch.cat(per_rank[r]))
            ea[r].append(torch.cat(per_rank_a[r]))
            eas[r].append(torch.cat(per_rank_s[r]))
    fshapes = collections.OrderedDict((k, torch.Size(v)) for k, v in frozen.items())
    ffull = {name: values(numel(s), seed + 800 + i).to(torch.float16)
             for i, (name, s) in enumerate(frozen.items())}
    for name, s in frozen.items():
        truth[name] = ffull[name].reshape(s).clone()
    truth["norm.running_mean"] = values(4, seed + 950).to(torch.float16)
    truth["module.norm.running_mean"] = truth["norm.running_mean"]
    for r in range(dp):
        module = collections.OrderedDict()
        for shapes in subgroups:
            for name in shapes:
                module[name] = torch.empty(0, dtype=torch.float16)
        frags = collections.OrderedDict()
        for name, s in frozen.items():
            module[name] = torch.empty(0, dtype=torch.float16)
            n = numel(s)
            ps = -(-n // dp)
            padded = torch.zeros(ps * dp, dtype=torch.float16)
            padded[:n] = ffull[name]
            frags[name] = padded[r * ps:(r + 1) * ps].clone()
        module["norm.running_mean"] = values(4, seed + 950).to(torch.float16)
        sd = common_state(module, [collections.OrderedDict(
            (k, torch.Size(v)) for k, v in g.items()) for g in subgroups],
            ["norm.running_mean"], dp, 1, 3, False,
            frozen_param_shapes=fshapes, frozen_param_fragments=frags)
        save(sd, os.path.join(tagdir, "zero_pp_rank_%d_mp_rank_00_model_states.pt" % r))
        osd3 = {"zero_stage": ZeroStageEnum(3), "loss_scaler": DynamicLossScaler(),
                "dynamic_loss_scale": True, "overflow": False, "partition_count": dp,
                "optimizer_state_dict": {
                    "state": {k: {"step": torch.tensor(3.0), "exp_avg": ea[r][k],
                                  "exp_avg_sq": eas[r][k]} for k in range(len(subgroups))},
                    "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08,
                                      "weight_decay": 0.0,
                                      "params": list(range(len(subgroups)))}]},
                "fp32_flat_groups": fp32[r]}
        save({"optimizer_state_dict": osd3, "ds_config": ds_config(3, False),
              "ds_version": DS_VERSION},
             os.path.join(tagdir, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
    record_truth(out, case, [truth])


def gen_pp(out, case, dp, stages, seed, tp=1, info=None):
    """Pipeline (PipelineModule + PipelineEngine), ZeRO-1: per (stage, TP rank) an
    mp_rank_XX_model_states.pt (XX = stage * tp + TP rank, stage-major) with module None and
    its ZeRO files, and per (layer, TP rank) a layer_LL-model_YY-model_states.pt holding that
    layer's state dict (local names).

    stages: list of (param_shapes OrderedDict, [(layer index, {local name: param name})]);
    the shapes are per TP rank."""
    root = os.path.join(out, case, "ckpt")
    write_save_dir(root)
    tagdir = os.path.join(root, TAG)
    tied = set()
    seen = set()
    for shapes, _ in stages:
        for name in shapes:
            (tied if name in seen else seen).add(name)
    truth_ranks = [collections.OrderedDict() for _ in range(tp)]
    for st, (shapes, layers) in enumerate(stages):
        for t in range(tp):
            m = st * tp + t
            master = {}
            moments = {"exp_avg": {}, "exp_avg_sq": {}}
            # A tied param: equal in every stage holding it (per TP rank).
            # (same_seed alone gave the param of each stage its own values: the seed
            # depends on its offset in the stage's group; the later stages take the
            # first's.)
            preset = {k: v for k, v in truth_ranks[t].items() if k in tied}
            # A TP-replicated param: equal on every TP rank (drawn from the stage's seed).
            osds, flats16 = zero12_rank_states([shapes], dp, seed + 100 * m, 1, False, master,
                                               same=tied, same_seed=seed + 7 + 50 * t,
                                               moments=moments, preset=preset,
                                               replicated=tp_replicated(info if tp > 1 else None,
                                                                        shapes),
                                               rep_seed=seed + 300 * st)
            # A tied param's weights: the first stage's (zero_to_fp32 keeps the first);
            # its weights are equal in every stage, its optimizer states are not.
            for k, v in truth_of_params(master, moments, torch.float16).items():
                if k in truth_ranks[t] and not k.startswith("optimizer."):
                    assert torch.equal(truth_ranks[t][k], v), (case, k)
                truth_ranks[t].setdefault(k, v)
            module = module_from_flats([shapes], flats16, torch.float16)
            extra = {"universal_checkpoint_info": info} if info else {}
            sd = common_state(None, [collections.OrderedDict(
                (k, torch.Size(v)) for k, v in shapes.items())], [], dp, tp, 1, False, **extra)
            sd["checkpoint_parallel_dimensions"] = {"pp_degree": len(stages), "tp_degree": tp}
            save(sd, os.path.join(tagdir, "mp_rank_%02d_model_states.pt" % m))
            for r, osd in enumerate(osds):
                save({"optimizer_state_dict": osd, "ds_config": ds_config(1, False),
                      "ds_version": DS_VERSION},
                     os.path.join(tagdir, "zero_pp_rank_%d_mp_rank_%02d_optim_states.pt" % (r, m)))
            for idx, local in layers:
                # clone_tensors_for_torch_save: each tensor its own storage
                state = collections.OrderedDict((k, module[v].clone()) for k, v in local.items())
                save(state, os.path.join(tagdir,
                                         "layer_%02d-model_%02d-model_states.pt" % (idx, t)))
    record_truth(out, case, truth_ranks, info)


def gen_ucp_zero3(out, case, source):
    """ds_to_universal.py for stage 3, tp 1 (deepspeed.md 5.2): per param the raw 1-D tensor
    (no dict, no step.pt), the cat of every rank's real(r) elements, in fp32.pt, exp_avg.pt,
    exp_avg_sq.pt; zero/optimizer_state.pt = rank 0's state + param_groups; the per-rank
    model states copied."""
    src = os.path.join(out, source, "ckpt", TAG)
    root = os.path.join(out, case, "ckpt")
    udir = os.path.join(root, TAG + "_universal")
    os.makedirs(os.path.join(udir, "zero"), exist_ok=True)
    names = sorted(os.listdir(src))
    rank = lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0])  # noqa: E731
    states = [load(os.path.join(src, n))["optimizer_state_dict"]
              for n in sorted((n for n in names if n.endswith("_optim_states.pt")), key=rank)]
    models = sorted((n for n in names if n.endswith("_model_states.pt")), key=rank)
    shapes = load(os.path.join(src, models[0]))["param_shapes"]
    ws = len(states)
    flats = {"fp32": [torch.cat(s["fp32_flat_groups"]) for s in states]}
    for key in ("exp_avg", "exp_avg_sq"):
        flats[key] = [torch.cat([s["optimizer_state_dict"]["state"][k][key]
                                 for k in range(len(s["fp32_flat_groups"]))]) for s in states]
    off = 0
    for group in shapes:
        for name, shape in group.items():
            n = numel(shape)
            ps = -(-n // ws)
            d = os.path.join(udir, "zero", name)
            os.makedirs(d, exist_ok=True)
            for key, per_rank in flats.items():
                parts = [per_rank[r][off:off + max(0, min(ps, n - r * ps))] for r in range(ws)]
                torch.save(torch.cat(parts).clone(), os.path.join(d, key + ".pt"))
            off += ps
    osd = dict(states[0])
    osd["param_groups"] = states[0]["optimizer_state_dict"]["param_groups"]
    torch.save(osd, os.path.join(udir, "zero", "optimizer_state.pt"))
    for n in models:
        shutil.copy(os.path.join(src, n), udir)
    with open(os.path.join(root, "latest_universal"), "w") as f:
        f.write(TAG + "_universal")
    # The same values as the source; ds_to_universal saves no step for stage 3.
    ranks, info = TRUTH[os.path.abspath(os.path.join(out, source))]
    record_truth(out, case, [collections.OrderedDict(
        (k, v) for k, v in ranks[0].items() if not k.startswith("optimizer.step."))], info)


def gen_moe(out, case, seed):
    """MoE (DeepSpeedEngine._save_moe_checkpoint): mp_rank_00_model_states.pt holds the
    non-expert module weights (no param_shapes); per MoE layer L and global expert E,
    layer_L_expert_E_mp_rank_00_model_states.pt holds that expert's state dict under full
    names; expp_rank_0_mp_rank_00_optim_states.pt the (here: ZeRO, so None) optimizer."""
    root = os.path.join(out, case, "ckpt")
    write_save_dir(root)
    tagdir = os.path.join(root, TAG)
    module = od(("embed.weight", values(20, seed).reshape(5, 4).half()),
                ("moe.deepspeed_moe.gate.wg.weight", values(8, seed + 1).reshape(2, 4).half()),
                ("head.weight", values(12, seed + 2).reshape(3, 4).half()))
    sd = {"module": module, "lr_scheduler": None, "data_sampler": None, "random_ltd": None,
          "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": 3,
          "global_samples": 24, "dp_world_size": 2, "mp_world_size": 1, "num_experts": [2],
          "ds_config": ds_config(2, False), "ds_version": DS_VERSION}
    truth = collections.OrderedDict()
    for k, v in module.items():
        truth[k] = truth["module." + k] = v.clone()
    save(sd, os.path.join(tagdir, "mp_rank_00_model_states.pt"))
    prefix = "moe.deepspeed_moe.experts.deepspeed_experts.%d."
    for e in range(2):
        expert = od((prefix % e + "fc.weight", values(16, seed + 10 + e).reshape(4, 4).half()),
                    (prefix % e + "fc.bias", values(4, seed + 20 + e).half()))
        for k, v in expert.items():
            truth[k] = truth["module." + k] = v.clone()
        save(expert, os.path.join(tagdir, "layer_0_expert_%d_mp_rank_00_model_states.pt" % e))
    save({"optimizer": None}, os.path.join(tagdir, "expp_rank_0_mp_rank_00_optim_states.pt"))
    record_truth(out, case, [truth])


EXPERTS = "layers.1.moe.deepspeed_moe.experts.deepspeed_experts."


def gen_moe_zero(out, case, stage, ws, ep, num_experts, seed, data_before_expert=False,
                 bf16_optimizer=False):
    """MoE with ZeRO 1/2 (DeepSpeedEngine._save_moe_checkpoint + _save_zero_checkpoint), tp 1,
    `ws` data-parallel ranks, one MoE layer of `num_experts` experts over `ep` expert-parallel
    ranks (num_local = num_experts / ep, ep_size_<ep> groups partitioned over ws / ep ranks):
      mp_rank_00_model_states.pt   module without expert params, no param_shapes, num_experts
      layer_0_expert_G_mp_rank_00_model_states.pt   global expert G's 16-bit params
      zero_pp_rank_R_mp_rank_00_optim_states.pt     every DP rank R: four groups as
          split_params_into_different_moe_groups_for_optimizer orders them (the two dense
          groups, then per original group its expert params: name ep_size_<ep>, moe True),
          partition_count [ws, ws, ws/ep, ws/ep], param_slice_mappings under the local expert
          names (deepspeed_experts.<k>), expert groups cut over the expert-data-parallel group
      expp_rank_E_mp_rank_00_optim_states.pt        {'optimizer': None} (ZeRO on)
    Rank R's expert-parallel rank: R % ep, its expert-DP rank R // ep (DeepSpeed's default);
    with use_data_before_expert_parallelism in ds_config: R // (ws/ep) and R % (ws/ep).
    bf16_optimizer: BF16_Optimizer (bf16 weights, no zero_stage, padded fp32 partitions,
    bf16_ file prefix), which cuts expert groups the same way (its _configure_moe_settings)."""
    root = os.path.join(out, case, "ckpt")
    write_save_dir(root)
    tagdir = os.path.join(root, TAG)
    cnt = ws // ep
    local = num_experts // ep
    gate = "layers.1.moe.deepspeed_moe.gate.wg.weight"
    dense = [od(("embed.weight", (5, 4)), (gate, (num_experts, 4)), ("head.weight", (3, 4))),
             od(("norm.bias", (4,)), ("head.bias", (3,)))]
    # Per original group, the expert params of each local expert (named_parameters order).
    expert_params = [od(("fc1.weight", (3, 4)), ("fc2.weight", (4, 3))), od(("fc1.bias", (3,)),)]
    expert_groups = [od(*((EXPERTS + "%d.%s" % (k, n), s) for k in range(local)
                          for n, s in g.items())) for g in expert_params]
    dtype = torch.bfloat16 if bf16_optimizer else torch.float16
    master, moments = {}, {"exp_avg": {}, "exp_avg_sq": {}}
    dense_osds, dense_flats = zero12_rank_states(dense, ws, seed, stage, bf16_optimizer, master,
                                                 moments=moments)
    truth = truth_of_params(master, moments, dtype)
    module = module_from_flats(dense, dense_flats, dtype)
    per_ep = []
    for e in range(ep):
        master, moments = {}, {"exp_avg": {}, "exp_avg_sq": {}}
        osds, flats = zero12_rank_states(expert_groups, cnt, seed + 100 * (e + 1), stage,
                                         bf16_optimizer, master, moments=moments)
        # local expert k of expert-parallel rank e is global expert e * local + k
        for k, v in truth_of_params(master, moments, dtype).items():
            pre, rest = k.split(EXPERTS)
            k2, tail = rest.split(".", 1)
            truth[pre + EXPERTS + "%d.%s" % (e * local + int(k2), tail)] = v
        per_ep.append(osds)
        weights = module_from_flats(expert_groups, flats, dtype)
        for k in range(local):
            g = e * local + k
            expert = collections.OrderedDict()
            for n in ("fc1.weight", "fc1.bias", "fc2.weight"):
                expert[EXPERTS + "%d.%s" % (g, n)] = weights[EXPERTS + "%d.%s" % (k, n)].clone()
            save(expert, os.path.join(tagdir, "layer_0_expert_%d_mp_rank_00_model_states.pt" % g))
    config = ds_config(stage, bf16_optimizer)
    if data_before_expert:
        config["use_data_before_expert_parallelism"] = True
    sd = {"module": module, "lr_scheduler": None, "data_sampler": None, "random_ltd": None,
          "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": 3,
          "global_samples": 24, "dp_world_size": ws, "mp_world_size": 1,
          "num_experts": [num_experts], "ds_config": config, "ds_version": DS_VERSION}
    save(sd, os.path.join(tagdir, "mp_rank_00_model_states.pt"))
    for r in range(ws):
        e, j = (r // cnt, r % cnt) if data_before_expert else (r % ep, r // ep)
        d, x = dense_osds[r], per_ep[e][j]
        osd = dict(d)
        base_d, base_x = d["base_optimizer_state"], x["base_optimizer_state"]
        groups = []
        for gi, name in enumerate(["dense-decay", "dense-no-decay"]):
            groups.append(dict(base_d["param_groups"][gi], name=name, params=[gi]))
        for gi in range(2):
            groups.append(dict(base_x["param_groups"][gi], name="ep_size_%d" % ep, moe=True,
                               params=[2 + gi]))
        osd["base_optimizer_state"] = {
            "state": {0: base_d["state"][0], 1: base_d["state"][1],
                      2: base_x["state"][0], 3: base_x["state"][1]},
            "param_groups": groups}
        for key in ("single_partition_of_fp32_groups", "group_paddings", "param_slice_mappings"):
            osd[key] = d[key] + x[key]
        osd["partition_count"] = [ws, ws, cnt, cnt]
        save({"optimizer_state_dict": osd, "ds_config": config, "ds_version": DS_VERSION},
             os.path.join(tagdir, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt" %
                          ("bf16_" if bf16_optimizer else "", r)))
    for e in range(ep):
        save({"optimizer": None},
             os.path.join(tagdir, "expp_rank_%d_mp_rank_00_optim_states.pt" % e))
    record_truth(out, case, [truth])


def with_module_and_states(sd, module, keys):
    """fc's key order: the weights, module.<name>, then optimizer.<state>.<name>."""
    out = collections.OrderedDict(sd)
    for k, v in module.items():
        out["module." + k] = v
    for key in ("exp_avg", "exp_avg_sq", "step"):
        for k, v in keys[key].items():
            out["optimizer.%s.%s" % (key, k)] = v
    return out


def reconstruct_moe_zero(tagdir, names):
    """The helper's recipe, from the loaded files: per group, the partition group of each
    expert-parallel rank (all ranks for a dense group) concatenated in partition order; the
    params in the order param_slice_mappings lists them, shapes from the module and the
    expert files, local expert k of ep rank e renamed to global e * (experts / ep) + k."""
    model = load(os.path.join(tagdir, "mp_rank_00_model_states.pt"))
    num_experts = model["num_experts"][0]
    shapes = {k: v.shape for k, v in model["module"].items()}
    module = collections.OrderedDict(model["module"])
    for n in names:
        if "_expert_" in n:
            module.update(load(os.path.join(tagdir, n)))
    shapes.update({k: v.shape for k, v in module.items()})
    optim = sorted((n for n in names if "zero_pp_rank_" in n),
                   key=lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0]))
    files = [load(os.path.join(tagdir, n)) for n in optim]
    states = [f["optimizer_state_dict"] for f in files]
    dbe = files[0]["ds_config"].get("use_data_before_expert_parallelism", False)
    ws = len(states)
    sd = collections.OrderedDict()
    keys = {"exp_avg": collections.OrderedDict(), "exp_avg_sq": collections.OrderedDict(),
            "step": collections.OrderedDict()}
    for g in range(len(states[0]["partition_count"])):
        cnt = states[0]["partition_count"][g]
        ep = ws // cnt
        for e in range(ep):
            ranks = [e * cnt + j if dbe else e + j * ep for j in range(cnt)]
            # BF16_Optimizer (no zero_stage) saves the padded partition: strip the padding.
            lean = [states[r]["single_partition_of_fp32_groups"][g].numel() -
                    (0 if "zero_stage" in states[r] else states[r]["group_paddings"][g])
                    for r in ranks]
            full = torch.cat([states[r]["single_partition_of_fp32_groups"][g][:n]
                              for r, n in zip(ranks, lean)])
            opt = {}
            for key in ("exp_avg", "exp_avg_sq"):
                opt[key] = torch.cat([states[r]["base_optimizer_state"]["state"][g][key][:n]
                                      for r, n in zip(ranks, lean)])
            order = []
            for r in ranks:
                for name in states[r]["param_slice_mappings"][g]:
                    if name not in order:
                        order.append(name)
            off = 0
            for name in order:
                if EXPERTS in name:
                    k, rest = name[len(EXPERTS):].split(".", 1)
                    name = EXPERTS + "%d.%s" % (e * (num_experts // ep) + int(k), rest)
                shape = shapes[name]
                n = numel(shape)
                sd[name] = full[off:off + n].view(shape)
                for key in ("exp_avg", "exp_avg_sq"):
                    keys[key][name] = opt[key][off:off + n].view(shape)
                keys["step"][name] = states[ranks[0]]["base_optimizer_state"]["state"][g]["step"]
                off += n
    # The 16-bit weights DeepSpeed saves are its fp32 master weights cast: a wrong rank
    # mapping or renaming would break this.
    for k, v in module.items():
        assert torch.equal(sd[k].to(v.dtype), v), k
    return with_module_and_states(sd, module, keys)


def reconstruct_moe(tagdir, names):
    """The module weights: the model states' `module` plus every expert file's state dict."""
    out = collections.OrderedDict()
    module = collections.OrderedDict(
        load(os.path.join(tagdir, "mp_rank_00_model_states.pt"))["module"])
    for n in names:
        if "_expert_" in n:
            module.update(load(os.path.join(tagdir, n)))
    for k, v in module.items():
        out[k] = v
        out["module." + k] = v
    return out


UCP_INFO = {"universal_checkpoint_version": 0.4,
            "vocabulary_parameter_patterns": [r"embed\.weight"],
            "tp_replicated_parameter_patterns": [r"norm\."],
            "parameter_with_row_parallelism_patterns": [r"dense\.weight"],
            "parameter_with_2_sub_params_cat_dim_0": [r"mlp\.h_to_4h\.weight"],
            "original_vocab_size": 7, "padded_vocab_size": 8}


def gen_ucp(out, case, source, tp=1, keys=None):
    """ds_to_universal.py (stage <= 2, deepspeed.md 5.4/5.5) on the `source` case: per TP
    rank and param, the fragments named by param_slice_mappings, concatenated by DP rank and
    reshaped; the TP slices merged by merge_tp_slices (tp > 1); saved as {'param': t,
    'cat_dim': 0} in zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt, step.pt the raw step;
    zero/optimizer_state.pt; the model states copied; latest_universal."""
    src = os.path.join(out, source, "ckpt", TAG)
    root = os.path.join(out, case, "ckpt")
    udir = os.path.join(root, TAG + "_universal")
    os.makedirs(os.path.join(udir, "zero"), exist_ok=True)
    names = sorted(os.listdir(src))
    per_tp = []
    for m in range(tp):
        optim = sorted((n for n in names if n.endswith("_mp_rank_%02d_optim_states.pt" % m)),
                       key=lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0]))
        states = [load(os.path.join(src, n))["optimizer_state_dict"] for n in optim]
        model = load(os.path.join(src, "mp_rank_%02d_model_states.pt" % m))
        frags = collections.defaultdict(lambda: collections.defaultdict(list))
        for s in states:
            base = s["base_optimizer_state"]["state"]
            for g, mapping in enumerate(s["param_slice_mappings"]):
                for name, addr in mapping.items():
                    frags[name]["fp32"].append(
                        s["single_partition_of_fp32_groups"][g].narrow(0, addr.start, addr.numel))
                    for key in ("exp_avg", "exp_avg_sq"):
                        frags[name][key].append(base[g][key].narrow(0, addr.start, addr.numel))
                    frags[name]["step"] = base[g]["step"]
        merged = collections.OrderedDict()
        for g, shapes in enumerate(model["param_shapes"]):
            for name, shape in shapes.items():
                for key in ("fp32", "exp_avg", "exp_avg_sq"):
                    merged["%s/%s" % (name, key)] = torch.cat(frags[name][key]).reshape(shape)
                merged["%s/step" % name] = frags[name]["step"]
        per_tp.append(merged)
        if m == 0:
            osd = {k: v for k, v in states[0].items() if k not in (
                "base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")}
            osd["param_groups"] = states[0]["base_optimizer_state"]["param_groups"]
            info = model.get("universal_checkpoint_info")
        shutil.copy(os.path.join(src, "mp_rank_%02d_model_states.pt" % m), udir)
    for key, value in per_tp[0].items():
        name, state = key.rsplit("/", 1)
        d = os.path.join(udir, "zero", name)
        os.makedirs(d, exist_ok=True)
        if state == "step":
            torch.save(value, os.path.join(d, "step.pt"))
            continue
        slices = [sd[key] for sd in per_tp]
        if tp > 1:
            value = merge_tp([{name: sl} for sl in slices], info)[name]
        if keys:  # ds_to_universal's keys, then 'param'
            saved = dict(keys(name, info, slices), param=value.clone())
        else:
            saved = {"param": value.clone(), "cat_dim": 0}
        torch.save(saved, os.path.join(d, state + ".pt"))
    torch.save(osd, os.path.join(udir, "zero", "optimizer_state.pt"))
    with open(os.path.join(root, "latest_universal"), "w") as f:
        f.write(TAG + "_universal")
    record_truth(out, case, *TRUTH[os.path.abspath(os.path.join(out, source))])


# --- Independent reconstruction (zero_to_fp32's algorithm, on torch.load of the files) -----

def load(path):
    return torch.load(path, map_location="cpu")


def reconstruct(ckpt):
    if os.path.exists(os.path.join(ckpt, "latest_universal")):
        return reconstruct_ucp(ckpt)
    with open(os.path.join(ckpt, "latest")) as f:
        tagdir = os.path.join(ckpt, f.read().strip())
    names = sorted(os.listdir(tagdir))
    mp_files = [n for n in names if n.startswith("mp_rank_") and n.endswith("_model_states.pt")]
    if not mp_files:  # stage 3
        return reconstruct_zero3(tagdir, names)
    if any("_expert_" in n for n in names):
        if any("zero_pp_rank_" in n for n in names):
            return reconstruct_moe_zero(tagdir, names)
        return reconstruct_moe(tagdir, names)
    if any(n.startswith("layer_") for n in names):
        tp = len([n for n in names if n.startswith("layer_01-")])
        info = load(os.path.join(tagdir, mp_files[0])).get("universal_checkpoint_info")
        per_tp = [reconstruct_pipeline(tagdir, names, mp_files, t, tp) for t in range(tp)]
        if tp > 1:
            return merge_tp(per_tp, info)
        return per_tp[0]
    mp = len(mp_files)
    per_rank = [reconstruct_mp(tagdir, names, mf, m) for m, mf in enumerate(mp_files)]
    info = load(os.path.join(tagdir, mp_files[0])).get("universal_checkpoint_info")
    if mp > 1 and info:
        return merge_tp(per_rank, info,
                        set(load(os.path.join(tagdir, mp_files[0]))["buffer_names"]))
    out = collections.OrderedDict()
    for m, sd in enumerate(per_rank):
        pre = "mp_rank_%02d." % m if mp > 1 else ""
        for k, v in sd.items():
            out[pre + k] = v
    return out


def reconstruct_mp(tagdir, names, mf, m):
    """zero_to_fp32 (3.3) for one mp rank: fp32 weights, frozen, buffers, aliases, then
    module.<name> and optimizer.<state>.<name>."""
    model = load(os.path.join(tagdir, mf))
    optim = sorted((n for n in names if n.endswith("_mp_rank_%02d_optim_states.pt" % m)),
                   key=lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0]))
    states = [load(os.path.join(tagdir, n))["optimizer_state_dict"] for n in optim]
    ws = states[0]["partition_count"]
    assert ws == len(states)
    module = model["module"] or {}
    sd = collections.OrderedDict()
    keys = {"exp_avg": collections.OrderedDict(), "exp_avg_sq": collections.OrderedDict(),
            "step": collections.OrderedDict()}
    for g, shapes in enumerate(model["param_shapes"]):
        # fp32: cat unpadded partitions (bf16 optimizer: strip group_paddings ourselves)
        parts = []
        for s in states:
            p = s["single_partition_of_fp32_groups"][g]
            if "zero_stage" not in s:
                p = p[:p.numel() - s["group_paddings"][g]]
            parts.append(p)
        full = torch.cat(parts)
        opt = {}
        for key in ("exp_avg", "exp_avg_sq"):
            opt[key] = torch.cat([
                s["base_optimizer_state"]["state"][g][key][
                    :s["base_optimizer_state"]["state"][g][key].numel() -
                    s["group_paddings"][g]] for s in states])
        off = 0
        for name, shape in shapes.items():
            n = numel(shape)
            sd[name] = full[off:off + n].view(shape)
            for key in ("exp_avg", "exp_avg_sq"):
                keys[key][name] = opt[key][off:off + n].view(shape)
            keys["step"][name] = states[0]["base_optimizer_state"]["state"][g]["step"]
            off += n
        align = 2 * ws
        assert -(-off // align) * align == -(-full.numel() // align) * align
    for name, shape in (model.get("frozen_param_shapes") or {}).items():
        sd[name] = model["frozen_param_fragments"][name]
    for b in model["buffer_names"]:
        sd[b] = module[b]
    for alias, owner in model["shared_params"].items():
        if owner in sd:
            sd[alias] = sd[owner]
    return with_module_and_states(sd, module, keys)


def reconstruct_pipeline(tagdir, names, mp_files, t, tp):
    """TP rank t: the union of the stages (mp_rank = stage * tp + t; a tied param: the first
    stage's copy); module weights from the layer files of TP rank t, named "<layer>.<local>"
    or, for a tied module's layer, "tied_modules.<key>.<local>" (the only param of the
    stages with that ending)."""
    out = collections.OrderedDict()
    for m, mf in enumerate(mp_files):
        if m % tp != t:
            continue
        for k, v in reconstruct_mp(tagdir, names, mf, m).items():
            out.setdefault(k, v)
    params = [k for k in out if not k.startswith(("module.", "optimizer."))]
    for n in names:
        if not n.startswith("layer_") or not n.endswith("-model_%02d-model_states.pt" % t):
            continue
        idx = int(n[len("layer_"):].split("-")[0])
        for local, v in load(os.path.join(tagdir, n)).items():
            name = "%d.%s" % (idx, local)
            if name not in params:
                tied = [p for p in params if p.startswith("tied_modules.") and
                        p.endswith("." + local) and
                        "." not in p[len("tied_modules."):-len(local) - 1]]
                if len(tied) == 1:
                    name = tied[0]
            out.setdefault("module." + name, v)
    return out


def match_sub_params(info, name):
    """The first parameter_with_sub_params entry with a pattern re.match-ing name, and that
    pattern (ds_to_universal's order of search)."""
    for entry in info.get("parameter_with_sub_params", []):
        for p in entry["patterns"]:
            if re.match(p, name):
                return entry, p
    return None, None


def sub_param_layout(info, entry, pattern, slices):
    """(sub-param sizes, widths[sub][rank]) of a fused param (deepspeed.md 5.5 rule 4)."""
    pd, tp = entry["partition_dim"], len(slices)
    spec = entry["shape"][pd]
    if info["universal_checkpoint_version"] >= 0.4:
        return list(spec), info["sub_param_shard_widths"][pattern]
    if isinstance(spec, int):  # before 0.4: a count of equal sub-params
        full = sum(s.shape[pd] for s in slices)
        spec = [full // spec] * spec
    return list(spec), [[z // tp] * tp for z in spec]


def merge_sub_params(slices, info, entry, pattern):
    """Each rank's slice holds, along partition_dim, its piece of every sub-param in order;
    the merged tensor is, per sub-param, the ranks' pieces in rank order."""
    pd = entry["partition_dim"]
    sizes, widths = sub_param_layout(info, entry, pattern, slices)
    pieces, at = [], [0] * len(slices)
    for s in range(len(sizes)):
        for t, sl in enumerate(slices):
            pieces.append(sl.narrow(pd, at[t], widths[s][t]))
            at[t] += widths[s][t]
    assert all(a == sl.shape[pd] for a, sl in zip(at, slices))
    return torch.cat(pieces, dim=pd)


def ucp_keys(name, info, slices):
    """The keys ds_to_universal's merge_tp_slices saves beside 'param' (5.5), sub_param_shape
    as the SubparamShape it saves (a count before 0.4 normalized to the sub-param sizes)."""
    def match(key):
        return any(re.match(p, name) for p in info.get(key, []))
    keys = {}
    entry, pattern = match_sub_params(info, name)
    if match("tp_replicated_parameter_patterns") or match("parameter_to_average_patterns"):
        pass
    elif match("parameter_with_2_sub_params_cat_dim_0"):
        keys.update(cat_dim=0, param_n_sub_params=2)
    elif entry:
        shape = entry["shape"]
        pd = entry["partition_dim"]
        if isinstance(shape[pd], int):
            shape = list(shape)
            shape[pd] = tuple(sub_param_layout(info, entry, pattern, slices)[0])
            shape = tuple(shape)
        keys["sub_param_shape"] = SubparamShape(patterns=entry["patterns"], shape=shape,
                                                partition_dim=pd)
    else:
        keys["cat_dim"] = 1 if match("parameter_with_row_parallelism_patterns") else 0
    if match("vocabulary_parameter_patterns"):
        keys["vocab_tensor"] = True
    return keys


def merge_tp(per_rank, info, buffers=()):
    """ds_to_universal.merge_tp_slices (deepspeed.md 5.5) on every key of the TP ranks, but
    a param to average keeps its TP copies as mp_rank_XX.<key> (fc computes no values)."""
    def match(key, name):
        return any(re.match(p, name) for p in info.get(key, []))
    out = collections.OrderedDict()
    for key in per_rank[0]:
        slices = [sd[key] for sd in per_rank]
        name = key
        for pre in ("module.", "optimizer.exp_avg_sq.", "optimizer.exp_avg.", "optimizer.step."):
            if key.startswith(pre):
                name = key[len(pre):]
                break
        if name in buffers and not match_sub_params(info, name)[0] and not any(match(k, name) for k in (
                "tp_replicated_parameter_patterns", "parameter_to_average_patterns",
                "parameter_with_row_parallelism_patterns", "parameter_with_2_sub_params_cat_dim_0",
                "vocabulary_parameter_patterns")):
            # A module buffer (issue 29 item 5): in no optimizer group, never concatenated;
            # equal TP copies are one tensor, differing ones stay per rank.
            if all(s.dtype == slices[0].dtype and s.shape == slices[0].shape and
                   torch.equal(s, slices[0]) for s in slices):
                out[key] = slices[0]
            else:
                pre = "module." if key.startswith("module.") else ""
                for t, sl in enumerate(slices):
                    out["%smp_rank_%02d.%s" % (pre, t, name)] = sl
            continue
        if key.startswith("optimizer.step.") or match("tp_replicated_parameter_patterns", name):
            out[key] = slices[0]
            continue
        if match("parameter_to_average_patterns", name):
            for t, sl in enumerate(slices):
                out["mp_rank_%02d.%s" % (t, key)] = sl
            continue
        entry, pattern = match_sub_params(info, name)
        if match("parameter_with_2_sub_params_cat_dim_0", name):
            chunks = [torch.chunk(s, 2, dim=0) for s in slices]
            param = torch.cat([torch.cat([c[0] for c in chunks]),
                               torch.cat([c[1] for c in chunks])])
        elif entry:
            param = merge_sub_params(slices, info, entry, pattern)
        else:
            dim = 1 if match("parameter_with_row_parallelism_patterns", name) else 0
            param = torch.cat(slices, dim=dim)
        if match("vocabulary_parameter_patterns", name):
            param = param[:info["original_vocab_size"]]
        out[key] = param
    return out


def reconstruct_ucp_tp(udir, model):
    """TP > 1: zero/<param>/ holds the merged values; the module tensors and buffers of the
    copied per-rank model states merge by the universal_checkpoint_info rules."""
    mps = sorted(n for n in os.listdir(udir) if n.startswith("mp_rank_"))
    per_rank = []
    for n in mps:
        m = load(os.path.join(udir, n))
        sd = collections.OrderedDict((b, m["module"][b]) for b in m["buffer_names"])
        for k, v in m["module"].items():
            sd["module." + k] = v
        per_rank.append(sd)
    merged = merge_tp(per_rank, model["universal_checkpoint_info"],
                      set(load(os.path.join(udir, mps[0]))["buffer_names"]))
    out = collections.OrderedDict()
    opt = {"exp_avg": collections.OrderedDict(), "exp_avg_sq": collections.OrderedDict(),
           "step": collections.OrderedDict()}
    for shapes in model["param_shapes"]:
        for name in shapes:
            d = os.path.join(udir, "zero", name)
            out[name] = load(os.path.join(d, "fp32.pt"))["param"]
            for key in ("exp_avg", "exp_avg_sq"):
                opt[key][name] = load(os.path.join(d, key + ".pt"))["param"]
            opt["step"][name] = load(os.path.join(d, "step.pt"))
    out.update(merged)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        for k, v in opt[key].items():
            out["optimizer.%s.%s" % (key, k)] = v
    return out


def reconstruct_ucp_zero3(udir):
    """Stage 3: zero/<param>/<state>.pt are raw flat tensors (viewed to param_shapes); frozen
    params from the per-rank fragments, buffers from rank 0's module."""
    rank = lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0])  # noqa: E731
    models = [load(os.path.join(udir, n)) for n in sorted(
        (n for n in os.listdir(udir) if n.endswith("_model_states.pt")), key=rank)]
    out = collections.OrderedDict()
    opt = {"exp_avg": collections.OrderedDict(), "exp_avg_sq": collections.OrderedDict()}
    for group in models[0]["param_shapes"]:
        for name, shape in group.items():
            d = os.path.join(udir, "zero", name)
            out[name] = load(os.path.join(d, "fp32.pt")).view(shape)
            for key in opt:
                opt[key][name] = load(os.path.join(d, key + ".pt")).view(shape)
    for name, shape in models[0]["frozen_param_shapes"].items():
        out[name] = torch.cat([m["frozen_param_fragments"][name] for m in models])[
            :numel(shape)].view(shape)
    for b in models[0]["buffer_names"]:
        out[b] = models[0]["module"][b]
        out["module." + b] = models[0]["module"][b]
    for key in opt:
        for k, v in opt[key].items():
            out["optimizer.%s.%s" % (key, k)] = v
    return out


def reconstruct_ucp(ckpt):
    """A UCP as DeepSpeed's loader sees it: zero/<param>/<state>.pt 'param' values; the
    rest (frozen, buffers, aliases, module) from the copied model states."""
    with open(os.path.join(ckpt, "latest_universal")) as f:
        udir = os.path.join(ckpt, f.read().strip())
    if not os.path.exists(os.path.join(udir, "mp_rank_00_model_states.pt")):
        return reconstruct_ucp_zero3(udir)
    model = load(os.path.join(udir, "mp_rank_00_model_states.pt"))
    if os.path.exists(os.path.join(udir, "mp_rank_01_model_states.pt")):
        return reconstruct_ucp_tp(udir, model)
    sd = collections.OrderedDict()
    opt = {"exp_avg": collections.OrderedDict(), "exp_avg_sq": collections.OrderedDict(),
           "step": collections.OrderedDict()}
    for shapes in model["param_shapes"]:
        for name in shapes:
            d = os.path.join(udir, "zero", name)
            sd[name] = load(os.path.join(d, "fp32.pt"))["param"]
            for key in ("exp_avg", "exp_avg_sq"):
                opt[key][name] = load(os.path.join(d, key + ".pt"))["param"]
            opt["step"][name] = load(os.path.join(d, "step.pt"))
    for name in (model.get("frozen_param_shapes") or {}):
        sd[name] = model["frozen_param_fragments"][name]
    for b in model["buffer_names"]:
        sd[b] = model["module"][b]
    for alias, owner in model["shared_params"].items():
        sd[alias] = sd[owner]
    out = collections.OrderedDict(sd)
    for k, v in model["module"].items():
        out["module." + k] = v
    for key in ("exp_avg", "exp_avg_sq", "step"):
        for k, v in opt[key].items():
            out["optimizer.%s.%s" % (key, k)] = v
    return out


def reconstruct_zero3(tagdir, names):
    rank = lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0])  # noqa: E731
    mfiles = sorted((n for n in names if n.endswith("_model_states.pt")), key=rank)
    ofiles = sorted((n for n in names if n.endswith("_optim_states.pt")), key=rank)
    models = [load(os.path.join(tagdir, n)) for n in mfiles]
    states = [load(os.path.join(tagdir, n))["optimizer_state_dict"] for n in ofiles]
    ws = states[0]["partition_count"]
    assert ws == len(states) == len(models)
    sd = collections.OrderedDict()
    opt = {"exp_avg": collections.OrderedDict(), "exp_avg_sq": collections.OrderedDict(),
           "step": collections.OrderedDict()}
    shapes = collections.OrderedDict()
    for d in models[0]["param_shapes"]:
        shapes.update(d)
    flat = [torch.cat(s["fp32_flat_groups"]) for s in states]
    flat_opt = {key: [torch.cat([s["optimizer_state_dict"]["state"][k][key]
                                 for k in range(len(s["fp32_flat_groups"]))]) for s in states]
                for key in ("exp_avg", "exp_avg_sq")}
    sub_of = {}
    for k, d in enumerate(models[0]["param_shapes"]):
        for name in d:
            sub_of[name] = k
    off = 0
    for name, shape in shapes.items():
        n = numel(shape)
        ps = -(-n // ws)
        sd[name] = torch.cat([flat[r][off:off + ps] for r in range(ws)])[:n].view(shape)
        for key in ("exp_avg", "exp_avg_sq"):
            opt[key][name] = torch.cat([flat_opt[key][r][off:off + ps]
                                        for r in range(ws)])[:n].view(shape)
        opt["step"][name] = states[0]["optimizer_state_dict"]["state"][sub_of[name]]["step"]
        off += ps
    assert off * ws == sum(t.numel() for t in states[0]["fp32_flat_groups"]) * ws
    for name, shape in models[0]["frozen_param_shapes"].items():
        n = numel(shape)
        sd[name] = torch.cat([m["frozen_param_fragments"][name] for m in models])[:n].view(shape)
    for b in models[0]["buffer_names"]:
        sd[b] = models[0]["module"][b]
    out = collections.OrderedDict(sd)
    buffers = set(models[0]["buffer_names"])
    for k, v in models[0]["module"].items():
        if k in buffers:
            out["module." + k] = v
    for key in ("exp_avg", "exp_avg_sq", "step"):
        for k, v in opt[key].items():
            out["optimizer.%s.%s" % (key, k)] = v
    return out


def to_numpy(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def write_expected(case_dir):
    exp = reconstruct(os.path.join(case_dir, "ckpt"))
    check_truth(case_dir, exp)
    d = os.path.join(case_dir, "expected")
    os.makedirs(d, exist_ok=True)
    for k, v in exp.items():
        np.save(os.path.join(d, k + ".npy"), to_numpy(v))
    return exp


def od(*items):
    return collections.OrderedDict(items)



# Cases that fc-convert --output-format deepspeed re-partitions: gen_at_dp writes the same
# model (same values, same client state) at another data-parallel size, so a converted
# checkpoint can be compared with what this generator writes for that size. DP_CASES are
# written first by generate(); gen_at_dp also writes pp2, tp2_ucp and zero3.
DP_CASES = ["zero1", "zero2", "bf16", "tp2", "frozen_tied"]


# MoE fixtures: (stage, own DP size, ep, experts, seed, use_data_before_expert_parallelism);
# the values do not depend on the DP size.
MOE_CASES = {"moe_zero2": (2, 4, 2, 4, 15, False), "moe_zero1_dbe": (1, 6, 3, 6, 16, True),
             "moe_bf16": (1, 4, 2, 4, 17, False)}


def gen_at_dp(out, case, dp=None):
    """Writes OUT/<case>/ckpt; dp None: the fixture's own DP size."""
    if case in MOE_CASES:
        stage, ws, ep, experts, seed, dbe = MOE_CASES[case]
        gen_moe_zero(out, case, stage, ws=dp or ws, ep=ep, num_experts=experts, seed=seed,
                     data_before_expert=dbe, bf16_optimizer=case == "moe_bf16")
        return
    g1 = [od(("embed.weight", (6, 4)), ("layer.weight", (4, 4)), ("layer.bias", (4,)),
             ("head.weight", (3, 4)))]
    if case == "zero1":
        gen_zero12(out, "zero1", 1, dp or 2, g1, seed=1,
                   client={"trainer_state": TrainerState()})
    elif case == "zero2":
        g2 = [od(("embed.weight", (5, 3)), ("layer.weight", (3, 3))),
              od(("layer.bias", (3,)), ("head.bias", (1,)))]
        gen_zero12(out, "zero2", 2, dp or 3, g2, seed=2)
    elif case == "bf16":
        gen_zero12(out, "bf16", 1, dp or 2, g1, seed=3, bf16_optimizer=True)
    elif case == "tp2":
        client = {"args": argparse.Namespace(tensor_model_parallel_size=2, num_layers=1,
                                             hidden_size=4),
                  "iteration": 3, "checkpoint_version": 3.0,
                  "rng_state": [{"random_rng_state": None,
                                 "np_rng_state": np.random.RandomState(7).get_state()}]}
        gen_zero12(out, "tp2", 1, dp or 2, [od(("layer.weight", (2, 4)), ("layer.bias", (2,)))],
                   seed=4, mp=2, client=client)
    elif case == "frozen_tied":
        # Python < 3.11 pickles an Enum member as ZeroStageEnum((value,)); 3.11+ (the rest
        # here) as getattr(ZeroStageEnum, 'member'). frozen_tied carries the older form.
        saved = ZeroStageEnum.__reduce_ex__
        ZeroStageEnum.__reduce_ex__ = lambda self, proto: (self.__class__, (self._value_,))
        try:
            gen_zero12(out, "frozen_tied", 2, dp or 2,
                       [od(("embed.weight", (5, 4)), ("layer.weight", (4, 4)))], seed=5,
                       frozen=od(("frozen.weight", (3, 4))),
                       tied={"head.weight": "embed.weight"})
        finally:
            ZeroStageEnum.__reduce_ex__ = saved
    elif case == "pp2":
        # Pipeline: pp 2 x dp 2; layer 0 and layer 4 are the tied embedding (TiedLayerSpec
        # 'embed' without forward_fn, saved under both layer indices), layer 3 has no state.
        gen_pp(out, "pp2", dp or 2, [
            (od(("tied_modules.embed.weight", (6, 4)), ("1.weight", (4, 4)), ("1.bias", (4,))),
             [(0, {"weight": "tied_modules.embed.weight"}),
              (1, {"weight": "1.weight", "bias": "1.bias"})]),
            (od(("2.weight", (4, 4)), ("2.bias", (4,)), ("tied_modules.embed.weight", (6, 4))),
             [(2, {"weight": "2.weight", "bias": "2.bias"}),
              (4, {"weight": "tied_modules.embed.weight"})])], seed=7)
    elif case == "tp2_ucp":
        # TP 2 with universal_checkpoint_info: vocabulary (padded 8 -> 7 rows), column and row
        # parallel, two sub-params (SwiGLU-style), replicated (norm.*, equal on both ranks).
        gen_zero12(out, "tp2_ucp", 1, dp or 2,
                   [od(("embed.weight", (4, 3)), ("layer.weight", (2, 4)), ("layer.bias", (2,)),
                       ("dense.weight", (4, 2)), ("mlp.h_to_4h.weight", (4, 3)),
                       ("norm.weight", (4,)))],
                   seed=8, mp=2, same=("norm.weight",), strided=("embed.weight", "mlp.h_to_4h.weight"),
                   client={"universal_checkpoint_info": UCP_INFO})
    elif case == "zero3":
        gen_zero3(out, "zero3", dp or 2,
                  [od(("embed.weight", (5, 3)), ("layer.bias", (3,))),
                   od(("layer.weight", (3, 3)), ("head.bias", (1,)))],
                  frozen=od(("frozen.weight", (5,))), seed=6)
    else:
        raise ValueError("no DP variant of case " + case)


def generate(out):
    if os.path.isdir(out):
        for c in CASES:
            shutil.rmtree(os.path.join(out, c), ignore_errors=True)
    for c in DP_CASES:
        gen_at_dp(out, c)
    gen_at_dp(out, "zero3")
    gen_at_dp(out, "pp2")
    # Pipeline x TP (Megatron-DeepSpeed GPTModelPipe-like names): pp 2 x tp 2 x dp 2.
    gen_pp(out, "pp2_tp2", 2, [
        (od(("tied_modules.embed.word_embeddings.weight", (4, 3)), ("1.dense.weight", (3, 2)),
            ("1.input_layernorm.weight", (3,))),
         [(0, {"word_embeddings.weight": "tied_modules.embed.word_embeddings.weight"}),
          (1, {"dense.weight": "1.dense.weight",
               "input_layernorm.weight": "1.input_layernorm.weight"})]),
        (od(("2.mlp.weight", (2, 3)), ("tied_modules.embed.word_embeddings.weight", (4, 3))),
         [(2, {"mlp.weight": "2.mlp.weight"}),
          (3, {"word_embeddings.weight": "tied_modules.embed.word_embeddings.weight"})])],
        seed=10, tp=2, info={
            "universal_checkpoint_version": 0.4,
            "vocabulary_parameter_patterns": [r"tied_modules\.embed\.word_embeddings\.weight"],
            "pipeline_replicated_parameter_patterns": [r"tied_modules\.embed"],
            "tp_replicated_parameter_patterns": [r"\d+\.input_layernorm"],
            "parameter_with_row_parallelism_patterns": [r"\d+\.dense\.weight"],
            "original_vocab_size": 6, "padded_vocab_size": 8})
    gen_at_dp(out, "tp2_ucp")
    # An averaged param (parameter_to_average_patterns): fc keeps its TP copies apart.
    gen_zero12(out, "tp2_avg", 1, 2, [od(("layer.weight", (2, 4)), ("layer.bias", (2,)))],
               seed=9, mp=2, client={"universal_checkpoint_info": dict(
                   UCP_INFO, parameter_to_average_patterns=[r"layer\.bias"])})
    # Fused sub-params (parameter_with_sub_params), UCP version 0.4: a GQA-style QKV whose
    # sub-params split unevenly over TP 2 (sub_param_shard_widths: q 6 rows as 4 + 2, k and
    # v 2 rows as 1 + 1; shape ((6, 2, 2), -1)), its bias, and a param fused along dim 1
    # (3, (4, 2)) with widths 3 + 1 and 2 + 0 (TP rank 1 holds none of the second
    # sub-param); module weights column-major (strided) for two of them; dp 2 cuts the flat
    # partitions inside the fused params (mlp.fused.weight of TP rank 0 inside its last row).
    fused_info = {
        "universal_checkpoint_version": 0.4,
        "vocabulary_parameter_patterns": [r"embed\.weight"],
        "tp_replicated_parameter_patterns": [r"norm\."],
        "parameter_with_sub_params": [
            {"patterns": [r"attn\.qkv\.weight"], "shape": ((6, 2, 2), -1), "partition_dim": 0},
            {"patterns": [r"attn\.qkv\.bias"], "shape": ((6, 2, 2),), "partition_dim": 0},
            {"patterns": [r"mlp\.fused\.weight"], "shape": (3, (4, 2)), "partition_dim": 1}],
        "sub_param_shard_widths": {r"attn\.qkv\.weight": [[4, 2], [1, 1], [1, 1]],
                                   r"attn\.qkv\.bias": [[4, 2], [1, 1], [1, 1]],
                                   r"mlp\.fused\.weight": [[3, 1], [2, 0]]},
        "original_vocab_size": 7, "padded_vocab_size": 8}
    fused_shapes = [((6, 3), (6,), (3, 5)), ((4, 3), (4,), (3, 1))]
    gen_zero12(out, "tp2_fused", 1, 2, None, seed=13, mp=2, same=("norm.weight",),
               strided=("attn.qkv.weight", "mlp.fused.weight"),
               client={"universal_checkpoint_info": fused_info},
               rank_groups=[[od(("norm.weight", (3,)), ("embed.weight", (4, 3)),
                                ("mlp.fused.weight", f), ("attn.qkv.weight", q),
                                ("attn.qkv.bias", b))] for q, b, f in fused_shapes])
    # Before version 0.4 (no widths: an even split): a count of 3 equal sub-params at
    # partition_dim 0 (shape (3, -1)), and sub-param sizes (4, 4) along dim 1.
    gen_zero12(out, "tp2_fused_v02", 2, 2,
               [od(("attn.qkv.weight", (6, 3)), ("mlp.fused.weight", (3, 4)),
                   ("layer.bias", (2,)))], seed=14, mp=2, strided=("mlp.fused.weight",),
               client={"universal_checkpoint_info": {
                   "universal_checkpoint_version": 0.2,
                   "parameter_with_sub_params": [
                       {"patterns": [r"attn\.qkv\."], "shape": (3, -1), "partition_dim": 0},
                       {"patterns": [r"mlp\.fused\."], "shape": (3, (4, 4)),
                        "partition_dim": 1}]}})
    gen_ucp(out, "ucp", "frozen_tied")
    gen_ucp(out, "ucp_tp2", "tp2_ucp", tp=2)
    gen_ucp_zero3(out, "ucp_zero3", "zero3")
    gen_ucp(out, "ucp_tp2_fused", "tp2_fused", tp=2, keys=ucp_keys)
    gen_moe(out, "moe", seed=12)
    gen_at_dp(out, "moe_zero2")
    gen_at_dp(out, "moe_zero1_dbe")
    gen_at_dp(out, "moe_bf16")
    # checkpoint_serialization: false -> every file in torch.save's legacy format.
    LEGACY[0] = True
    try:
        gen_zero12(out, "legacy", 2, 2,
                   [od(("embed.weight", (5, 4)), ("layer.weight", (4, 4)))], seed=11,
                   frozen=od(("frozen.weight", (3, 4))), tied={"head.weight": "embed.weight"})
    finally:
        LEGACY[0] = False
    for c in CASES:
        write_expected(os.path.join(out, c))


CASES = ["zero1", "zero2", "bf16", "tp2", "frozen_tied", "zero3", "pp2", "pp2_tp2", "tp2_ucp",
         "tp2_avg", "ucp", "ucp_tp2", "ucp_zero3", "moe", "legacy", "tp2_fused", "tp2_fused_v02",
         "ucp_tp2_fused", "moe_zero2", "moe_zero1_dbe", "moe_bf16"]


def same_value(x, y):
    """Structural equality of two torch.load results (tensors: dtype, shape, bits)."""
    if isinstance(x, torch.Tensor):
        return (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and
                torch.equal(x, y) and x.stride() == y.stride() and
                x.storage_offset() == y.storage_offset())
    if isinstance(x, dict):
        return (type(x) is type(y) and list(x) == list(y) and
                all(same_value(x[k], y[k]) for k in x))
    if isinstance(x, (list, tuple)):
        return (type(x) is type(y) and len(x) == len(y) and
                all(same_value(i, j) for i, j in zip(x, y)))
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return type(x) is type(y) and same_value(vars(x), vars(y))
    return x == y


def same_file(pa, pb):
    if filecmp.cmp(pa, pb, shallow=False):
        return True
    # Legacy torch.save names storages by their address (str(storage._cdata)): the bytes
    # differ from run to run, the loaded values must not.
    with open(pa, "rb") as f:
        legacy = pa.endswith(".pt") and f.read(2) == b"\x80\x02"
    return legacy and same_value(load(pa), load(pb))


def compare_dirs(a, b):
    bad = []
    for root, _, files in os.walk(a):
        for f in files:
            pa = os.path.join(root, f)
            pb = os.path.join(b, os.path.relpath(pa, a))
            if not os.path.exists(pb) or not same_file(pa, pb):
                bad.append(os.path.relpath(pa, a))
    for root, _, files in os.walk(b):
        for f in files:
            pb = os.path.join(root, f)
            if not os.path.exists(os.path.join(a, os.path.relpath(pb, b))):
                bad.append(os.path.relpath(pb, b) + " (extra)")
    return bad


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    here = os.path.dirname(os.path.abspath(__file__))
    out = args[0] if args else os.path.normpath(os.path.join(here, "..", "..", "deepspeed"))
    torch.manual_seed(0)
    if not check:
        generate(out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        bad = []
        for c in CASES:
            bad += [c + "/" + p for p in compare_dirs(os.path.join(tmp, c), os.path.join(out, c))]
    if bad:
        print("fixtures differ from the generator:\n  " + "\n  ".join(bad))
        return 1
    print("deepspeed fixtures match the generator (%d cases)" % len(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
