#!/usr/bin/env python3
"""Write tiny Megatron-LM legacy checkpoints (torch.save per rank, `model_optim_rng.pt`) with
Debian's torch 1.13 (/usr/bin/python3), without Megatron (it is not installed here), laid out
as shared/reference/formats-recent.md ("Megatron legacy") says:

  <save dir>/latest_checkpointed_iteration.txt     "3" or "release"
  <save dir>/iter_0000003/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt   (+ distrib_optim.pt)
  <save dir>/release/mp_rank_TT/model_optim_rng.pt

Each model_optim_rng.pt is generate_state_dict's dict: args (a real argparse.Namespace),
checkpoint_version 3.0, iteration, model (or model0, model1 for virtual pipeline stages: the
rank's state dict, layer numbers local to the stage), optimizer, opt_param_scheduler,
rng_state (random / numpy / torch RNG states), num_floating_point_operations_so_far.
Megatron classes are stand-ins registered under their real module names, so the pickles name
them (megatron.core.transformer.enums.AttnBackend: an unknown global fc keeps opaque);
Transformer-Engine `_extra_state` entries are io.BytesIO objects, as TE < 1.13 saves them.

The rank tensors are cut from FULL tensors by Megatron's rules (what its checkpoint
converters, tools/checkpoint, undo): column-parallel (linear_qkv, linear_fc1, word_embeddings,
output_layer) split along dim 0, row-parallel (linear_proj, linear_fc2) along dim 1, the rest
replicated; with swiglu, linear_fc1 = [gate; up] and TP rank r holds [gate_r; up_r]. Most
rank tensors are contiguous clones (as Megatron saves them); linear_fc2.weight is saved as a
strided view of the full tensor (the file then holds the full storage) to exercise strides.

Fixtures (OUT_ROOT/<case>/ckpt is the save dir; OUT_ROOT/<case>/expected/<name>.npy is every
FULL tensor, C order, bfloat16 as uint16 bits, the names fc gives them):
  gpt_tp2_pp2   Megatron-Core GPT, TE names, 2 layers, hidden 8, swiglu, TP 2 x PP 2, iteration
                3, bf16, distributed optimizer (distrib_optim.pt beside each file: fp32
                master weights and Adam moments in Megatron-Core's coalesced buffer layout,
                buckets of 100 elements on the first stage, dp 2)
  gpt_tp1       the same full tensors at TP 1 x PP 1 as a `release` dir, no optimizer
  gpt_pp2_vpp2  local (non-TE) names, 4 layers, no swiglu, TP 1 x PP 2 x virtual PP 2
                (model0/model1), Float16 optimizer state (groups by weight decay, both
                chunks' params, fp32_from_fp16_params)
  moe_tp2_ep2   local names, 2 layers, 4 experts, TP 2 x EP 2 (mp_rank_TT_EEE), layer 0 a
                SequentialMLP (local_experts.I), layer 1 TEGroupedMLP names (weightI), and
                decoder.layers.1.mlp.custom_scale, a name outside fc's TP table (expected
                per rank as mp_rank_TT.<name>), Float16 optimizers [dense, expert]
  legacy_tp2_pp2 pre-Core Megatron names (language_model.{embedding,encoder,output_layer}
                nested dicts; query_key_value, dense, dense_h_to_4h (swiglu), dense_4h_to_h),
                TP 2 x PP 2
  no_swiglu_arg gpt_tp2_pp2's tensors at TP 2 x PP 1, args without `swiglu` (fc refuses to
                merge linear_fc1); no expected/
  gpt_vpp2_tied local names, 4 layers, TP 1 x PP 2 x virtual PP 2, tied embeddings, dp 4,
                distributed optimizer saved as a one-element list (ChainedOptimizer), one
                buffer per model chunk, the shared embedding params in buckets of their own
  moe_distopt   local names, 2 layers, swiglu, 4 experts (layer 1 TEGroupedMLP names), TP 2 x
                EP 2, distributed optimizer: each rank's distrib_optim.pt a ChainedOptimizer's
                [dense, expert] list (dense None on EP rank 1), buckets of 60 elements
  gpt_buckets_tied  4 layers, local names, TP 2 x PP 2, tied embeddings (vocabulary 20), dp 2,
                distrib_optim.pt in Megatron-Core 0.4/0.5's per-bucket form (per_bucket_numel;
                per state a list of bucket tensors, each padded to a multiple of dp; params
                back to back, no alignment; buckets of 100 elements on the first stage, the
                shared embedding params in buckets of their own), the buffer keyed by the
                grad dtype alone
  gpt_whole_tp2 2 layers, local names, TP 2, dp 3, distrib_optim.pt as Megatron-LM wrote it
                before buckets (2023): per state one tensor of the whole grad buffer (params
                back to back in reverse order, padded at the end to a multiple of dp)
  gpt_num_buckets TE names, 2 layers, TP 1, dp 2, coalesced distrib_optim.pt with
                args.ddp_num_buckets 3 (buckets of the rank's parameter count // 3)
  gpt_fp32_tp2  TE names, 2 layers, swiglu, TP 2, trained in fp32 (no --bf16: params_dtype
                float32, fp32 weights), FP32Optimizer: model_optim_rng.pt's optimizer is the
                torch optimizer's own state dict {state, param_groups}; the master weights
                are the weights (expected_optimizer/optimizer.fp32.* equal expected/*)
  gpt_vpp2_chunked TE names, 4 layers, swiglu, TP 1 x PP 2 x virtual PP 2, dp 2,
                overlap_param_gather_with_optimizer_step: distrib_optim.pt a list of one
                coalesced optimizer state per model chunk, no buckets
Cases with a distributed optimizer also have expected_optimizer/optimizer.<role>.<name>.npy
(role fp32, exp_avg, exp_avg_sq: full fp32 tensors). Every fp32 master weight rounds to its
bf16 model weight (asserted), which is what fc checks to trust its layout.

usage: /usr/bin/python3 testdata/gen/megatron/gen_legacy.py [OUT_ROOT]
       /usr/bin/python3 testdata/gen/megatron/gen_legacy.py --check [OUT_ROOT]
OUT_ROOT defaults to testdata/megatron_legacy; --check regenerates into a temporary
directory and compares every file byte for byte.
"""
import argparse
import collections
import enum
import filecmp
import io
import math
import os
import random
import shutil
import sys
import tempfile
import types

import numpy as np
import torch


def _fake_module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
    return sys.modules[name]


class AttnBackend(enum.Enum):
    flash = 1
    fused = 2
    auto = 5


AttnBackend.__module__ = "megatron.core.transformer.enums"
_fake_module("megatron.core.transformer.enums").AttnBackend = AttnBackend

HIDDEN, HEADS, FFN, VOCAB = 8, 2, 12, 16


def values(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(torch.bfloat16)


def gpt_full(layers, te, swiglu, seed, experts=0, grouped_layers=(), unknown=None, vocab=VOCAB):
    """{name: full bf16 tensor} of a tiny Megatron-Core GPT (global layer numbers)."""
    full = collections.OrderedDict()
    s = [seed]

    def add(name, shape):
        s[0] += 1
        full[name] = values(shape, s[0])

    add("embedding.word_embeddings.weight", (vocab, HIDDEN))
    fc1_rows = 2 * FFN if swiglu else FFN
    for l in range(layers):
        p = "decoder.layers.%d." % l
        if te:
            add(p + "self_attention.linear_qkv.layer_norm_weight", (HIDDEN,))
        else:
            add(p + "input_layernorm.weight", (HIDDEN,))
            add(p + "input_layernorm.bias", (HIDDEN,))
        add(p + "self_attention.linear_qkv.weight", (3 * HIDDEN, HIDDEN))
        add(p + "self_attention.linear_qkv.bias", (3 * HIDDEN,))
        add(p + "self_attention.linear_proj.weight", (HIDDEN, HIDDEN))
        add(p + "self_attention.linear_proj.bias", (HIDDEN,))
        if te:
            add(p + "mlp.linear_fc1.layer_norm_weight", (HIDDEN,))
        else:
            add(p + "pre_mlp_layernorm.weight", (HIDDEN,))
        if experts:
            add(p + "mlp.router.weight", (experts, HIDDEN))
            for e in range(experts):
                if l in grouped_layers:
                    add(p + "mlp.experts.linear_fc1.weight%d" % e, (fc1_rows, HIDDEN))
                    add(p + "mlp.experts.linear_fc2.weight%d" % e, (HIDDEN, FFN))
                else:
                    q = p + "mlp.experts.local_experts.%d." % e
                    add(q + "linear_fc1.weight", (fc1_rows, HIDDEN))
                    add(q + "linear_fc2.weight", (HIDDEN, FFN))
        else:
            add(p + "mlp.linear_fc1.weight", (fc1_rows, HIDDEN))
            add(p + "mlp.linear_fc2.weight", (HIDDEN, FFN))
            add(p + "mlp.linear_fc2.bias", (HIDDEN,))
    if unknown:
        add(unknown, (2, 4))  # a name outside fc's TP table: saved whole by every TP rank
    add("decoder.final_layernorm.weight", (HIDDEN,))
    add("output_layer.weight", (vocab, HIDDEN))
    return full


def role(name):
    """Megatron's split dim of a param: 0 (column), 1 (row) or None (replicated)."""
    parts = name.split(".")
    module, param = parts[-2], parts[-1].rstrip("0123456789")
    if module in ("word_embeddings", "output_layer", "linear_qkv", "linear_fc1",
                  "query_key_value", "dense_h_to_4h") and param in ("weight", "bias"):
        return 0
    if (module in ("linear_proj", "linear_fc2", "dense_4h_to_h") or
            (module == "dense" and parts[-3] == "self_attention")) and param == "weight":
        return 1
    return None


def tp_slice(name, t, tp, r, swiglu):
    d = role(name)
    if d is None:
        return t.clone()
    if d == 0 and swiglu and (".linear_fc1." in name or ".dense_h_to_4h." in name):
        gate, up = t.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[r], up.chunk(tp, dim=0)[r]]).clone()
    piece = t.chunk(tp, dim=d)[r]
    if name.endswith("linear_fc2.weight") and tp > 1:
        return piece  # a strided view of the full tensor (the file holds the full storage)
    return piece.clone()


def layer_of(name):
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return i, int(parts[i + 1])
    return None, None


def expert_of(name):
    parts = name.split(".")
    if "local_experts" in parts:
        i = parts.index("local_experts")
        return ("local", i + 1, int(parts[i + 1]))
    if "experts" in parts and parts[-1].rstrip("0123456789") != parts[-1]:
        p = parts[-1]
        stem = p.rstrip("0123456789")
        return ("grouped", len(parts) - 1, int(p[len(stem):]))
    return None


def rank_state_dict(full, tp, r, swiglu, layers, chunks, ep, e_rank, experts, te):
    """{chunk: state dict} of TP rank r, EP rank e_rank for each (stage, virtual chunk)."""
    out = {}
    per = layers // len(chunks) if chunks else layers
    for (stage, v), (lo, hi, first, last) in chunks.items():
        sd = collections.OrderedDict()
        for name, t in full.items():
            li, l = layer_of(name)
            if li is None:
                if "embedding." in name and not first:
                    continue
                if ("output_layer." in name or "final_layernorm." in name) and not last:
                    continue
                sd[name] = tp_slice(name, t, tp, r, swiglu)
                continue
            if not lo <= l < hi:
                continue
            parts = name.split(".")
            parts[li + 1] = str(l - lo)
            ex = expert_of(name)
            if ex is not None:
                kind, pos, e = ex
                local = experts // ep
                if e // local != e_rank:
                    continue
                stem = parts[pos].rstrip("0123456789") if kind == "grouped" else ""
                parts[pos] = stem + str(e % local)
            local_name = ".".join(parts)
            sd[local_name] = tp_slice(name, t, tp, r, swiglu)
            if te and local_name.endswith("linear_qkv.weight"):
                sd[local_name.replace(".weight", "._extra_state")] = io.BytesIO()
        out[(stage, v)] = sd
    return out


def legacy_gpt_full(layers, seed):
    """Pre-Core Megatron GPT (megatron/legacy/model) names, flattened as fc names them."""
    full = collections.OrderedDict()
    s = [seed]

    def add(name, shape):
        s[0] += 1
        full[name] = values(shape, s[0])

    add("language_model.embedding.word_embeddings.weight", (VOCAB, HIDDEN))
    for l in range(layers):
        p = "language_model.encoder.layers.%d." % l
        add(p + "input_layernorm.weight", (HIDDEN,))
        add(p + "self_attention.query_key_value.weight", (3 * HIDDEN, HIDDEN))
        add(p + "self_attention.dense.weight", (HIDDEN, HIDDEN))
        add(p + "self_attention.dense.bias", (HIDDEN,))
        add(p + "post_attention_layernorm.weight", (HIDDEN,))
        add(p + "mlp.dense_h_to_4h.weight", (2 * FFN, HIDDEN))
        add(p + "mlp.dense_4h_to_h.weight", (HIDDEN, FFN))
    add("language_model.encoder.final_layernorm.weight", (HIDDEN,))
    add("language_model.output_layer.weight", (VOCAB, HIDDEN))
    return full


def nest_legacy(sd):
    """The pre-Core state dict's nesting: language_model -> embedding / encoder / output_layer
    dicts; the encoder's own keys stay dotted ("layers.0.input_layernorm.weight")."""
    out = collections.OrderedDict()
    for name, t in sd.items():
        parts = name.split(".")
        if parts[:2] == ["language_model", "encoder"]:
            path, leaf = parts[:2], ".".join(parts[2:])
        else:
            path, leaf = parts[:-1], parts[-1]
        d = out
        for p in path:
            d = d.setdefault(p, collections.OrderedDict())
        d[leaf] = t
    return out


def make_args(**kw):
    a = argparse.Namespace(
        num_layers=kw["num_layers"], hidden_size=HIDDEN, ffn_hidden_size=FFN,
        num_attention_heads=HEADS, padded_vocab_size=kw.get("vocab", VOCAB), swiglu=kw["swiglu"],
        tensor_model_parallel_size=kw["tp"], pipeline_model_parallel_size=kw["pp"],
        virtual_pipeline_model_parallel_size=kw.get("vpp"),
        expert_model_parallel_size=kw.get("ep", 1), num_experts=kw.get("experts") or None,
        transformer_impl="transformer_engine" if kw["te"] else "local",
        use_distributed_optimizer=kw.get("distopt", False), bf16=True, fp16=False,
        params_dtype=torch.bfloat16, untie_embeddings_and_output_weights=True,
        attention_backend=AttnBackend.auto, iteration=3, data_parallel_size=kw.get("dp", 1),
        context_parallel_size=1, accumulate_allreduce_grads_in_fp32=True,
        overlap_grad_reduce=kw.get("bucket_size") is not None,
        ddp_bucket_size=kw.get("bucket_size"), overlap_param_gather_with_optimizer_step=False)
    if kw.get("tied"):
        a.untie_embeddings_and_output_weights = False
    if kw.get("fp32"):
        a.bf16, a.params_dtype = False, torch.float32
    return a


def rng_state(seed):
    random.seed(seed)
    return [{"random_rng_state": random.getstate(),
             "np_rng_state": np.random.RandomState(seed).get_state(),
             "torch_rng_state": torch.Generator().manual_seed(seed).get_state()[:64].clone(),
             "cuda_rng_state": None, "rng_tracker_states": {}}]


def float16_optimizer(chunk_states, optim_chunks, iteration, mine=lambda n: True):
    """Float16OptimizerWithFloat16Params.state_dict() of one rank: the torch optimizer's
    state (indices in group order) and param groups, and fp32_from_fp16_params. Groups as
    Megatron-Core's _get_param_groups makes them (r0.6 on): keyed by (wd_mult, lr_mult,
    is_expert_parallel, is_decoupled_lr), no weight decay for ".bias" and 1-D params, in
    order of first appearance over the model chunks' params; params in that order."""
    groups = collections.OrderedDict()
    for key in sorted(chunk_states):
        for name, t in chunk_states[key].items():
            if not isinstance(t, torch.Tensor) or not mine(name):
                continue
            wd = 0.0 if name.endswith(".bias") or t.dim() == 1 else 1.0
            kind = (wd, 1.0, expert_of(name) is not None, False)
            groups.setdefault(kind, []).append((key, name))
    param_groups, state, masters, index = [], {}, [], 0
    for (wd, lr, expert, decoupled), members in groups.items():
        ids = []
        for key, name in members:
            o = optim_chunks[key]
            state[index] = {"exp_avg": o["exp_avg"][name].contiguous(),
                            "exp_avg_sq": o["exp_avg_sq"][name].contiguous()}
            ids.append(index)
            index += 1
        param_groups.append({"lr": 1e-4, "bias_correction": True, "betas": (0.9, 0.95),
                             "eps": 1e-8, "weight_decay": 0.1 * wd, "step": iteration,
                             "params": ids, "wd_mult": wd, "lr_mult": lr,
                             "is_expert_parallel": expert, "is_decoupled_lr": decoupled,
                             "max_lr": 1e-4, "min_lr": 1e-5})
        masters.append([optim_chunks[key]["fp32"][name].contiguous() for key, name in members])
    return {"optimizer": {"state": state, "param_groups": param_groups},
            "fp32_from_fp16_params": masters}


def master_of(t, seed):
    """An fp32 master weight that rounds (to nearest even) to the bf16 model weight `t`: the
    value plus noise below a quarter of its bf16 ulp, as after Megatron's
    _copy_main_params_to_model_params."""
    x = t.float()
    _, e = torch.frexp(x)
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(x.shape, generator=g) * 2 - 1
    m = torch.where(x == 0, torch.zeros_like(x), x + u * torch.pow(2.0, (e - 10).float()))
    assert torch.equal(m.to(torch.bfloat16).view(torch.int16), t.view(torch.int16))
    return m


def optimizer_full(full, seed):
    """{role: {name: full fp32 tensor}}: master weights and Adam moments of every param."""
    out = {"fp32": collections.OrderedDict(), "exp_avg": collections.OrderedDict(),
           "exp_avg_sq": collections.OrderedDict()}
    for i, (name, t) in enumerate(full.items()):
        # An fp32 weight (training in fp32) is its own master.
        out["fp32"][name] = t.clone() if t.dtype == torch.float32 else master_of(t, seed + 3 * i)
        g = torch.Generator().manual_seed(seed + 3 * i + 1)
        out["exp_avg"][name] = torch.randn(t.shape, generator=g) * 1e-3
        g = torch.Generator().manual_seed(seed + 3 * i + 2)
        out["exp_avg_sq"][name] = torch.rand(t.shape, generator=g) * 1e-6
    return out


def coalesced_layout(params, bucket_size, align, shared, dp):
    """Megatron-Core (>= 0.8) ParamAndGradBuffer layout as distrib_optim.pt saves it.

    params: [(name, numel)] in named_parameters order. The buffer takes them in reverse
    order, each start padded to `align` elements; a bucket closes once it holds
    `bucket_size` elements, and around a shared embedding (tied, PP > 1); bucket ends are
    padded to lcm(dp, 128). The saved tensor is the buckets back to back, each cut at its
    unpadded end (the alignment gaps inside a bucket stay). Returns ({name: offset in the
    saved tensor}, numel_unpadded)."""
    def pad(x, m):
        return -(-x // m) * m
    index, bucket_starts, unpadded = {}, [0], []
    state = {"start": 0, "bstart": 0, "nonempty": False, "end": 0}

    def close(end_index):
        unpadded.append(end_index - state["bstart"])
        bend = pad(end_index, math.lcm(dp, 128))
        state["bstart"] = bend
        bucket_starts.append(bend)
        state["nonempty"] = False
        return bend
    for name, n in reversed(params):
        start = pad(state["start"], align)
        if name in shared and state["nonempty"]:
            start = close(start)
        index[name] = (start, len(unpadded))
        end = start + n
        state["end"] = end
        state["nonempty"] = True
        if (bucket_size is not None and end - state["bstart"] >= bucket_size) or name in shared:
            state["start"] = close(end)
        else:
            state["start"] = end
    if state["nonempty"]:
        close(state["end"])
    offsets = {name: s - bucket_starts[b] + sum(unpadded[:b]) for name, (s, b) in index.items()}
    return offsets, sum(unpadded)


def older_layout(params, bucket_size, shared, dp):
    """Megatron-Core 0.4/0.5 ParamAndGradBuffer.__init__ with the distributed optimizer,
    replayed: params in reverse order, back to back (no alignment); a bucket closes once it
    holds `bucket_size` elements, and around a shared embedding (tied, PP > 1); each bucket's
    end is padded to a multiple of dp (_pad_if_needed). With bucket_size None and no shared
    params this is also Megatron-LM's GradBuffer before buckets (one padded buffer).
    Returns ({name: (bucket, start within the bucket)}, [padded bucket sizes])."""
    def pad(x):
        return -(-x // dp) * dp
    index, sizes = {}, []
    state = {"data_start": 0, "bucket_start": 0, "members": 0}

    def new_bucket(end):
        end = pad(end)
        sizes.append(end - state["bucket_start"])
        state["bucket_start"] = end
        state["members"] = 0
        return end
    for name, n in reversed(params):
        if name in shared and state["members"]:
            state["data_start"] = new_bucket(state["data_start"])
        start = state["data_start"]
        end = start + n
        index[name] = (len(sizes), start - state["bucket_start"])
        state["members"] += 1
        if (bucket_size is not None and end - state["bucket_start"] >= bucket_size) or name in shared:
            end = new_bucket(end)
        state["data_start"] = end
    if state["members"]:
        new_bucket(state["data_start"])
    return index, sizes


def older_optimizer_state(chunk_states, optim_chunks, bucket_size, stage, tied, pp, dp, form):
    """save_parameter_state before the coalesced form: "per_bucket" (Megatron-Core 0.4/0.5:
    {"per_bucket_numel": [{dtype: [bucket sizes]} per buffer], v: {dtype: {state: [bucket
    tensors]}}}) or "whole" (Megatron-LM 2023: {v: {dtype: {state: buffer tensor}}}); dtype
    is the grad buffer's (fp32: grads accumulated in fp32)."""
    state = {"per_bucket_numel": []} if form == "per_bucket" else {}
    for v, key in enumerate(sorted(chunk_states)):
        sd = chunk_states[key]
        params = [(n, t.numel()) for n, t in sd.items() if isinstance(t, torch.Tensor)]
        shared = set()
        if form == "per_bucket" and tied and pp > 1:
            shared = {n for n, _ in params
                      if n.endswith("word_embeddings.weight") or n.endswith("output_layer.weight")}
        size = bucket_size if form == "per_bucket" and stage == 0 and v == 0 else None
        index, sizes = older_layout(params, size, shared, dp)
        world = {}
        for role in ("param", "exp_avg", "exp_avg_sq"):
            buckets = [torch.zeros(n) for n in sizes]
            src = optim_chunks[key]["fp32" if role == "param" else role]
            for n, count in params:
                b, start = index[n]
                buckets[b][start:start + count] = src[n].reshape(-1)
            world[role] = buckets if form == "per_bucket" else buckets[0]
        state[v] = {torch.float32: world}
        if form == "per_bucket":
            state["per_bucket_numel"].append({torch.float32: sizes})
    return state


def distrib_optim(chunk_states, optim_chunks, bucket_size, stage, tied, pp, dp, as_list,
                  ep_rank=0, moe=False, form="coalesced", per_chunk=False, frozen=()):
    """distrib_optim.pt of one rank (get_parameter_state_dp_zero, coalesced buckets): one
    buffer per model chunk (all params bf16, grads reduced in fp32). With MoE a
    ChainedOptimizer's list: [dense, expert], the dense state only where this process is
    DP rank 0 of the dense group (EP rank 0), None elsewhere. Other forms: older_optimizer_state."""
    if form != "coalesced":
        return older_optimizer_state(chunk_states, optim_chunks, bucket_size, stage, tied, pp,
                                     dp, form)
    if per_chunk:
        # overlap_param_gather_with_optimizer_step: a DistributedOptimizer per model chunk
        # (buffer indices from 0 in each), bucketing off (Megatron's DDP disables it).
        return [optimizer_state(chunk_states, optim_chunks, None, stage, tied, pp, dp,
                                lambda n: True, only=key) for key in sorted(chunk_states)]
    if moe:
        dense = (optimizer_state(chunk_states, optim_chunks, bucket_size, stage, tied, pp, dp,
                                 lambda n: expert_of(n) is None) if ep_rank == 0 else None)
        return [dense, optimizer_state(chunk_states, optim_chunks, bucket_size, stage, tied, pp,
                                       dp, lambda n: expert_of(n) is not None)]
    # Frozen params (requires_grad False) are in no buffer: Megatron's DDP skips them.
    state = optimizer_state(chunk_states, optim_chunks, bucket_size, stage, tied, pp, dp,
                            lambda n: n not in frozen)
    return [state] if as_list else state


def optimizer_state(chunk_states, optim_chunks, bucket_size, stage, tied, pp, dp, mine,
                    only=None):
    """One DistributedOptimizer's get_parameter_state_dp_zero over the params `mine` keeps
    (of every model chunk, or of chunk `only`)."""
    state = {"buckets_coalesced": True}
    keys = [k for k in sorted(chunk_states) if only is None or k == only]
    for v, key in enumerate(keys):
        sd = chunk_states[key]
        params = [(n, t.numel()) for n, t in sd.items()
                  if isinstance(t, torch.Tensor) and mine(n)]
        shared = set()
        if tied and pp > 1:
            shared = {n for n, _ in params
                      if n.endswith("word_embeddings.weight") or n.endswith("output_layer.weight")}
        # No buckets on later stages and chunks (Megatron's disable_bucketing).
        size = bucket_size if stage == 0 and v == 0 else None
        offsets, numel = coalesced_layout(params, size, 64, shared, dp)
        world = {}
        for role in ("param", "exp_avg", "exp_avg_sq"):
            flat = torch.zeros(numel)
            src = optim_chunks[key]["fp32" if role == "param" else role]
            for n, count in params:
                flat[offsets[n]:offsets[n] + count] = src[n].reshape(-1)
            world[role] = flat
        world["numel_unpadded"] = numel
        state[v] = {(torch.bfloat16, torch.float32): world}
    return state


def write_checkpoint(out, full, tp, pp, layers, swiglu, te, iteration=3, vpp=None, ep=1,
                     experts=0, optimizer=None, release=False, drop_args=(), nest=None,
                     optim_full=None, bucket_size=None, dp=1, tied=False, as_list=False,
                     vocab=VOCAB, form="coalesced", num_buckets=None, per_chunk=False,
                     frozen=()):
    os.makedirs(out, exist_ok=True)
    sub = "release" if release else "iter_%07d" % iteration
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release" if release else str(iteration))
    nv = vpp or 1
    per = layers // (pp * nv)
    chunks_of = {}
    for p in range(pp):
        chunks_of[p] = collections.OrderedDict()
        for v in range(nv):
            lo = v * (layers // nv) + p * per
            chunks_of[p][(p, v)] = (lo, lo + per, p == 0 and v == 0, p == pp - 1 and v == nv - 1)
    args = make_args(num_layers=layers, swiglu=swiglu, tp=tp, pp=pp, vpp=vpp, ep=ep,
                     experts=experts, te=te, distopt=optimizer == "distributed", dp=dp,
                     fp32=optimizer == "fp32",
                     bucket_size=bucket_size, tied=tied, vocab=vocab)
    for a in drop_args:
        delattr(args, a)
    if per_chunk:
        args.overlap_param_gather_with_optimizer_step = True
    if num_buckets:  # --ddp-num-buckets: overlap_grad_reduce without ddp_bucket_size
        args.overlap_grad_reduce = True
        args.ddp_num_buckets = num_buckets
    for p in range(pp):
        for e in range(ep):
            for r in range(tp):
                name = "mp_rank_%02d" % r
                if pp > 1:
                    name += "_%03d" % p
                if ep > 1:
                    name += "_%03d" % e
                d = os.path.join(out, sub, name)
                os.makedirs(d, exist_ok=True)
                sds = rank_state_dict(full, tp, r, swiglu, layers, chunks_of[p], ep, e, experts, te)
                state = {"args": args, "checkpoint_version": 3.0, "iteration": iteration}
                if nest:
                    sds = {c: nest(sd) for c, sd in sds.items()}
                if vpp:
                    for (_, v), sd in sds.items():
                        state["model%d" % v] = sd
                else:
                    state["model"] = sds[(p, 0)]
                optim_chunks = {}
                if optim_full is not None:
                    for c in sds:
                        optim_chunks[c] = {
                            role: rank_state_dict(optim_full[role], tp, r, swiglu, layers,
                                                  {c: chunks_of[p][c]}, ep, e, experts, te)[c]
                            for role in optim_full}
                if optimizer == "fp32":  # FP32Optimizer.state_dict(): the torch optimizer's
                    state["optimizer"] = float16_optimizer(sds, optim_chunks, iteration)["optimizer"]
                    state["opt_param_scheduler"] = {"max_lr": 1e-4, "num_steps": 3}
                elif optimizer == "float16":
                    if ep > 1:  # a ChainedOptimizer: [dense, expert], both in every file
                        state["optimizer"] = [
                            float16_optimizer(sds, optim_chunks, iteration,
                                              lambda n: expert_of(n) is None),
                            float16_optimizer(sds, optim_chunks, iteration,
                                              lambda n: expert_of(n) is not None)]
                    else:
                        state["optimizer"] = float16_optimizer(sds, optim_chunks, iteration)
                    state["opt_param_scheduler"] = {"max_lr": 1e-4, "num_steps": 3}
                elif optimizer == "distributed":
                    groups = [{"lr": 1e-4, "weight_decay": wd, "step": iteration}
                              for wd in (0.1, 0.0)]
                    # param_state_sharding_type came with the coalesced form.
                    opt = ({"param_state_sharding_type": "dp_zero_gather_scatter"}
                           if form == "coalesced" else {})
                    opt.update({"optimizer": {"param_groups": groups}, "grad_scaler": None})
                    state["optimizer"] = opt
                    state["opt_param_scheduler"] = {"max_lr": 1e-4, "num_steps": 3}
                    size = bucket_size
                    if num_buckets:
                        # Megatron's get_model: the rank's parameter count (every chunk)
                        # // ddp_num_buckets.
                        size = sum(t.numel() for sd in sds.values() for t in sd.values()
                                   if isinstance(t, torch.Tensor)) // num_buckets
                    torch.save(distrib_optim(sds, optim_chunks, size, p, tied, pp, dp,
                                             as_list, e, experts > 0, form, per_chunk, frozen),
                               os.path.join(d, "distrib_optim.pt"))
                if optimizer is not None:
                    state["rng_state"] = rng_state(100 + r + 10 * p + 100 * e)
                    state["num_floating_point_operations_so_far"] = 12345
                torch.save(state, os.path.join(d, "model_optim_rng.pt"))


def to_numpy(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def assert_file_is(path, truth):
    """The .npy at path holds truth (a ground-truth tensor: a FULL tensor before the TP/PP/EP
    split, or its optimizer state), bit for bit, read back apart from to_numpy: bfloat16
    as its uint16 bits, other dtypes as themselves."""
    a = np.load(path)
    if truth.dtype == torch.bfloat16:
        assert a.dtype == np.uint16, (path, a.dtype)
        got = torch.from_numpy(a.astype(np.int32)).to(torch.int16).view(torch.bfloat16)
    else:
        got = torch.from_numpy(a)
    assert got.dtype == truth.dtype and tuple(got.shape) == tuple(truth.shape), (
        path, got.dtype, truth.dtype, got.shape, truth.shape)
    assert torch.equal(got.view(-1).view(torch.uint8), truth.contiguous().view(-1).view(torch.uint8)), \
        "expected != ground truth: " + path


def check_expected_dir(d, keys):
    """keys: file stem -> ground-truth tensor; the directory holds exactly these."""
    assert sorted(os.listdir(d)) == sorted(k + ".npy" for k in keys), (d, sorted(
        set(os.listdir(d)) ^ {k + ".npy" for k in keys}))
    for k, v in keys.items():
        assert_file_is(os.path.join(d, k + ".npy"), v)


def write_expected(case_dir, full, per_rank=(), tp=1):
    """per_rank: names fc does not merge (outside its TP table): one mp_rank_TT.<name> each."""
    d = os.path.join(case_dir, "expected")
    os.makedirs(d, exist_ok=True)
    for k, v in full.items():
        keys = ["mp_rank_%02d.%s" % (r, k) for r in range(tp)] if k in per_rank else [k]
        for key in keys:
            np.save(os.path.join(d, key + ".npy"), to_numpy(v))
    truth = {}
    for k, v in full.items():
        for key in (["mp_rank_%02d.%s" % (r, k) for r in range(tp)] if k in per_rank else [k]):
            truth[key] = v
    check_expected_dir(d, truth)


def write_expected_optimizer(case_dir, optim_full, per_rank=(), tp=1):
    """expected_optimizer/optimizer.<role>.<name>.npy: the full fp32 tensors fc exposes (names
    outside fc's TP table: mp_rank_TT.optimizer.<role>.<name>, one per TP rank)."""
    d = os.path.join(case_dir, "expected_optimizer")
    os.makedirs(d, exist_ok=True)
    for role, tensors in optim_full.items():
        for k, v in tensors.items():
            key = "optimizer.%s.%s" % (role, k)
            keys = ["mp_rank_%02d.%s" % (r, key) for r in range(tp)] if k in per_rank else [key]
            for name in keys:
                np.save(os.path.join(d, name + ".npy"), to_numpy(v))
    truth = {}
    for role, tensors in optim_full.items():
        for k, v in tensors.items():
            key = "optimizer.%s.%s" % (role, k)
            for name in (["mp_rank_%02d.%s" % (r, key) for r in range(tp)] if k in per_rank
                         else [key]):
                truth[name] = v
    check_expected_dir(d, truth)


CASES = ["gpt_tp2_pp2", "gpt_tp1", "gpt_pp2_vpp2", "moe_tp2_ep2", "legacy_tp2_pp2",
         "no_swiglu_arg", "gpt_vpp2_tied", "moe_distopt", "gpt_buckets_tied", "gpt_whole_tp2",
         "gpt_num_buckets", "gpt_vpp2_chunked", "gpt_fp32_tp2", "gpt_frozen_tp2"]


def generate(out):
    for c in CASES:
        shutil.rmtree(os.path.join(out, c), ignore_errors=True)
    gpt = gpt_full(2, te=True, swiglu=True, seed=1)
    gpt_optim = optimizer_full(gpt, 1000)
    # Buckets of 100 elements on the first stage (overlap_grad_reduce, ddp_bucket_size 100).
    write_checkpoint(os.path.join(out, "gpt_tp2_pp2", "ckpt"), gpt, tp=2, pp=2, layers=2,
                     swiglu=True, te=True, optimizer="distributed", optim_full=gpt_optim,
                     bucket_size=100, dp=2)
    write_expected(os.path.join(out, "gpt_tp2_pp2"), gpt)
    write_expected_optimizer(os.path.join(out, "gpt_tp2_pp2"), gpt_optim)
    write_checkpoint(os.path.join(out, "gpt_tp1", "ckpt"), gpt, tp=1, pp=1, layers=2,
                     swiglu=True, te=True, release=True)
    write_expected(os.path.join(out, "gpt_tp1"), gpt)
    vp = gpt_full(4, te=False, swiglu=False, seed=50)
    vp_optim = optimizer_full(vp, 4000)
    write_checkpoint(os.path.join(out, "gpt_pp2_vpp2", "ckpt"), vp, tp=1, pp=2, layers=4,
                     swiglu=False, te=False, vpp=2, iteration=7, optimizer="float16",
                     optim_full=vp_optim)
    write_expected(os.path.join(out, "gpt_pp2_vpp2"), vp)
    write_expected_optimizer(os.path.join(out, "gpt_pp2_vpp2"), vp_optim)
    unknown = "decoder.layers.1.mlp.custom_scale"
    moe = gpt_full(2, te=False, swiglu=False, seed=90, experts=4, grouped_layers=(1,),
                   unknown=unknown)
    moe_optim = optimizer_full(moe, 5000)
    write_checkpoint(os.path.join(out, "moe_tp2_ep2", "ckpt"), moe, tp=2, pp=1, layers=2,
                     swiglu=False, te=False, ep=2, experts=4, iteration=5, optimizer="float16",
                     optim_full=moe_optim)
    write_expected(os.path.join(out, "moe_tp2_ep2"), moe, per_rank=(unknown,), tp=2)
    write_expected_optimizer(os.path.join(out, "moe_tp2_ep2"), moe_optim, per_rank=(unknown,),
                             tp=2)
    old = legacy_gpt_full(2, seed=120)
    write_checkpoint(os.path.join(out, "legacy_tp2_pp2", "ckpt"), old, tp=2, pp=2, layers=2,
                     swiglu=True, te=False, iteration=9, nest=nest_legacy)
    write_expected(os.path.join(out, "legacy_tp2_pp2"), old)
    # args without `swiglu` at TP 2: fc cannot tell how linear_fc1 splits (refused).
    write_checkpoint(os.path.join(out, "no_swiglu_arg", "ckpt"), gpt, tp=2, pp=1, layers=2,
                     swiglu=True, te=True, drop_args=("swiglu",))
    # Distributed optimizer with virtual pipeline chunks (one buffer each) and tied
    # embeddings at PP 2 (the shared embedding params get buckets of their own), saved by a
    # ChainedOptimizer of one optimizer as a list.
    # Vocabulary 20: the embeddings' 160 elements are not a multiple of the 64-element
    # alignment, so their buckets of their own move the params after them.
    vt = gpt_full(4, te=False, swiglu=False, seed=300, vocab=20)
    vt_optim = optimizer_full(vt, 2000)
    write_checkpoint(os.path.join(out, "gpt_vpp2_tied", "ckpt"), vt, tp=1, pp=2, layers=4,
                     swiglu=False, te=False, vpp=2, iteration=11, optimizer="distributed",
                     optim_full=vt_optim, dp=4, tied=True, as_list=True, vocab=20)
    write_expected(os.path.join(out, "gpt_vpp2_tied"), vt)
    write_expected_optimizer(os.path.join(out, "gpt_vpp2_tied"), vt_optim)
    # MoE with the distributed optimizer: TP 2 x EP 2, each rank's file [dense, expert]
    # (dense on EP rank 0 only), experts with buckets of 60 elements.
    md = gpt_full(2, te=False, swiglu=True, seed=400, experts=4, grouped_layers=(1,))
    md_optim = optimizer_full(md, 3000)
    write_checkpoint(os.path.join(out, "moe_distopt", "ckpt"), md, tp=2, pp=1, layers=2,
                     swiglu=True, te=False, ep=2, experts=4, iteration=13,
                     optimizer="distributed", optim_full=md_optim, bucket_size=60, dp=4)
    write_expected(os.path.join(out, "moe_distopt"), md)
    write_expected_optimizer(os.path.join(out, "moe_distopt"), md_optim)
    # Older distrib_optim.pt forms. Per-bucket (Megatron-Core 0.4/0.5): TP 2 x PP 2, tied
    # embeddings of vocabulary 20, buckets of 100 elements on the first stage, dp 2.
    bt = gpt_full(4, te=False, swiglu=False, seed=500, vocab=20)
    bt_optim = optimizer_full(bt, 6000)
    write_checkpoint(os.path.join(out, "gpt_buckets_tied", "ckpt"), bt, tp=2, pp=2, layers=4,
                     swiglu=False, te=False, iteration=17, optimizer="distributed",
                     optim_full=bt_optim, bucket_size=100, dp=2, tied=True, vocab=20,
                     form="per_bucket")
    write_expected(os.path.join(out, "gpt_buckets_tied"), bt)
    write_expected_optimizer(os.path.join(out, "gpt_buckets_tied"), bt_optim)
    # --ddp-num-buckets 3: buckets of a third of the rank's parameter count (TP 1, dp 2).
    nb = gpt_full(2, te=True, swiglu=False, seed=700)
    nb_optim = optimizer_full(nb, 8000)
    write_checkpoint(os.path.join(out, "gpt_num_buckets", "ckpt"), nb, tp=1, pp=1, layers=2,
                     swiglu=False, te=True, iteration=23, optimizer="distributed",
                     optim_full=nb_optim, dp=2, num_buckets=3)
    write_expected(os.path.join(out, "gpt_num_buckets"), nb)
    write_expected_optimizer(os.path.join(out, "gpt_num_buckets"), nb_optim)
    # overlap_param_gather_with_optimizer_step with virtual PP 2: a ChainedOptimizer of one
    # DistributedOptimizer per model chunk (bucketing off, though args ask for buckets of 100).
    pc = gpt_full(4, te=True, swiglu=True, seed=800)
    pc_optim = optimizer_full(pc, 9000)
    write_checkpoint(os.path.join(out, "gpt_vpp2_chunked", "ckpt"), pc, tp=1, pp=2, layers=4,
                     swiglu=True, te=True, vpp=2, iteration=29, optimizer="distributed",
                     optim_full=pc_optim, bucket_size=100, dp=2, per_chunk=True)
    write_expected(os.path.join(out, "gpt_vpp2_chunked"), pc)
    write_expected_optimizer(os.path.join(out, "gpt_vpp2_chunked"), pc_optim)
    # Trained in fp32 (FP32Optimizer): the weights are the masters.
    f32 = collections.OrderedDict((k, v.float()) for k, v in gpt_full(2, te=True, swiglu=True,
                                                                     seed=900).items())
    f32_optim = optimizer_full(f32, 9500)
    write_checkpoint(os.path.join(out, "gpt_fp32_tp2", "ckpt"), f32, tp=2, pp=1, layers=2,
                     swiglu=True, te=True, iteration=31, optimizer="fp32", optim_full=f32_optim)
    write_expected(os.path.join(out, "gpt_fp32_tp2"), f32)
    write_expected_optimizer(os.path.join(out, "gpt_fp32_tp2"), f32_optim)
    # Frozen params (requires_grad False: in no buffer, no optimizer state): the embedding
    # (the last place in the buffer), layer 0's qkv layer norm and weight (a run of two) and
    # layer 1's fc2 bias; TP 2, dp 2, buckets of 100 elements.
    fz = gpt_full(2, te=True, swiglu=True, seed=950)
    fz_optim = optimizer_full(fz, 9700)
    frozen = ("embedding.word_embeddings.weight",
              "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
              "decoder.layers.0.self_attention.linear_qkv.weight",
              "decoder.layers.1.mlp.linear_fc2.bias")
    write_checkpoint(os.path.join(out, "gpt_frozen_tp2", "ckpt"), fz, tp=2, pp=1, layers=2,
                     swiglu=True, te=True, iteration=37, optimizer="distributed",
                     optim_full=fz_optim, bucket_size=100, dp=2, frozen=frozen)
    write_expected(os.path.join(out, "gpt_frozen_tp2"), fz)
    write_expected_optimizer(os.path.join(out, "gpt_frozen_tp2"),
                             {role: {k: v for k, v in t.items() if k not in frozen}
                              for role, t in fz_optim.items()})
    # Before buckets (Megatron-LM 2023): TP 2, dp 3, one padded buffer per state.
    wh = gpt_full(2, te=False, swiglu=True, seed=600)
    wh_optim = optimizer_full(wh, 7000)
    write_checkpoint(os.path.join(out, "gpt_whole_tp2", "ckpt"), wh, tp=2, pp=1, layers=2,
                     swiglu=True, te=False, iteration=19, optimizer="distributed",
                     optim_full=wh_optim, dp=3, form="whole")
    write_expected(os.path.join(out, "gpt_whole_tp2"), wh)
    write_expected_optimizer(os.path.join(out, "gpt_whole_tp2"), wh_optim)


def compare_dirs(a, b):
    bad = []
    for root, _, files in os.walk(a):
        for f in files:
            pa = os.path.join(root, f)
            pb = os.path.join(b, os.path.relpath(pa, a))
            if not os.path.exists(pb) or not filecmp.cmp(pa, pb, shallow=False):
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
    out = args[0] if args else os.path.normpath(os.path.join(here, "..", "..", "megatron_legacy"))
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
    print("megatron legacy fixtures match the generator (%d cases)" % len(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
