"""Writes Megatron-Core torch_dist checkpoints with the real Megatron-Core (0.16.1, CPU, gloo),
each with the full tensors Megatron-Core itself loads back as the expected values.

usage: python make_fixtures.py OUT_DIR [CASE...]
  (run with the interop environment's python: scripts/interop.sh --python torch)

OUT_DIR/<case>/ckpt                    the checkpoint as dist_checkpointing.save wrote it
OUT_DIR/<case>/expected.safetensors    every tensor of the checkpoint, full, under its
                                       sharded-state-dict key (what fc-export names it), as
                                       Megatron-Core loads it into a TP 1 x PP 1 model
OUT_DIR/<case>/info.json               the case's layout and config
OUT_DIR/<case>/legacy                  (gpt_tp2_vpp2) the same training state
                                       saved as Megatron-LM's legacy per-rank files
OUT_DIR/<case>/expected_legacy.safetensors  its expected tensors (see legacy_expected)
OUT_DIR/versions.json                  torch, megatron-core, safetensors, Python versions
OUT_DIR/errors.json                    what does not run on CPU, with the exact error and
                                       where in Megatron-Core (written when no CASE is given)

The model: a GPTModel from the local layer spec (no Transformer Engine), built with
TransformerConfig(use_cpu_initialization=True): 4 layers, hidden 16, 8 heads of 2 in 4 query
groups (GQA), SwiGLU (gated_linear_unit, silu) with ffn 16, RMSNorm, no biases, RoPE, vocab 64,
untied output layer: a tiny Llama. Its weights are the same at every TP x PP (Megatron's CPU
initialization draws the full master weight and splits it), so a fresh TP 1 model only
differs from the saved one by the training steps.

Cases (each one torchrun of gloo processes on the CPU; two optimizer steps with fixed
gradients g = sin(3 w) + 0.1, elementwise, so replicated params stay equal across ranks; the
Adam step 2, iteration 7):
  gpt_tp2_pp2       TP 2 x PP 2 (4 processes), fp32 params, the FP32Optimizer (torch AdamW)
                    state through its sharded_state_dict: optimizer.state.{exp_avg,
                    exp_avg_sq}.<key>, the step in common.pt
  gpt_tp2_vpp2      TP 2 x PP 2 x virtual PP 2 (4 processes): model0/model1 chunks, one
                    FP32Optimizer over both chunks; the same state also saved as Megatron-LM's
                    legacy per-rank files (legacy/, see save_legacy)
  gpt_tp4           TP 4 (4 processes), model only: the target layout of fc-convert --tp 4
  gpt_tp2_pp2_layers  TP 2 x PP 2 trained as gpt_tp2_pp2, model only,
                    TransformerConfig(hetereogenous_dist_checkpoint=True): one key per layer
                    (decoder.layers.<i>.<name>) instead of the layer-stacked keys
                    (decoder.layers.<name>, layer on axis 0)
  qwen2_tp2         TP 2 (2 processes), model only: a tiny Qwen2 (ARCHS["qwen2"]: QKV bias,
                    output layer tied to the embedding), its biases drawn (set_biases) since
                    Megatron initializes them to zero; the target of --hf-family qwen2
  gpt2_tp2          TP 2 (2 processes), model only: a tiny GPT-2 (ARCHS["gpt2"]: learned
                    absolute positions, LayerNorm, every linear biased, GeLU, tied), biases
                    drawn as for qwen2_tp2; the target of --hf-family gpt2
  mixtral_tp2       TP 2 (2 processes), model only: a tiny Mixtral (ARCHS["mixtral"]: 2 layers,
                    MoE MLPs of 4 SwiGLU experts, top-2): the router
                    (decoder.layers.mlp.router.weight) and the SequentialMLP experts, saved
                    one tensor per name with the expert on axis 1 after the layer
                    (decoder.layers.mlp.experts.experts.linear_fc{1,2}.weight); the target of
                    --hf-family mixtral
  qwen2_moe_tp2     TP 2 (2 processes), model only: a tiny Qwen2-MoE (ARCHS["qwen2_moe"]: QKV
                    bias, 2 MoE layers with a gated shared expert,
                    decoder.layers.mlp.shared_experts.{linear_fc1,linear_fc2,gate_weight}); the
                    target of --hf-family qwen2-moe

Every save passes the sharded_state_dict metadata Megatron-LM 0.16's
_build_sharded_state_dict_metadata gives a non-distributed optimizer
(singleton_local_shards False, chained_optim_avoid_prefix True, dp_cp_group).

The expected values: a single process (world 1, TP 1 x PP 1) builds the same model and
optimizer, dist_checkpointing.load's its sharded_state_dict from the checkpoint,
load_state_dict's the result into the model and optimizer, then assembles every
ShardedTensor of the model's and optimizer's (re-made) sharded_state_dict by its key,
global offset and global shape into the full tensor.

CPU patches, scoped to the calls that need them (Megatron-Core 0.16.1 calls CUDA
unconditionally there; none changes what is saved):
  - dist_checkpointing.save (torch_dist): FileSystemWriterAsync.preload_tensors calls
    torch.cuda.synchronize() after its D2H copies, and save_state_dict_async_finalize makes
    its failure flag with device=torch.cuda.current_device(): during save, torch.cuda.
    synchronize is a no-op and torch.cuda.current_device returns "cpu".
  - FP32Optimizer.__init__ makes its loss scale torch.tensor([1.0], device='cuda'): during
    construction, torch.tensor's device='cuda' becomes 'cpu'.
  - model_parallel_cuda_manual_seed is not called (it seeds CUDA): torch.manual_seed only.
What does not run on CPU (errors in errors.json, recorded by this script): the mixed-precision
Float16OptimizerWithFloat16Params (bf16 params), the distributed optimizer, MoE experts as a
grouped GEMM (the grouped_gemm CUDA package), and the MoE router's forward without Transformer
Engine unless moe_utils.te_general_gemm is set to None (megatron_oracle_test.forward_worker
does, scoped to the forward).
"""
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = {
    "gpt_tp2_pp2": dict(tp=2, pp=2, vpp=None, world=4, optimizer=True),
    "gpt_tp2_vpp2": dict(tp=2, pp=2, vpp=2, world=4, optimizer=True, legacy=True),
    "gpt_tp4": dict(tp=4, pp=1, vpp=None, world=4, optimizer=False),
    "gpt_tp2_pp2_layers": dict(tp=2, pp=2, vpp=None, world=4, optimizer=False, per_layer=True,
                               train=True),
    "qwen2_tp2": dict(tp=2, pp=1, vpp=None, world=2, optimizer=False, arch="qwen2"),
    "gpt2_tp2": dict(tp=2, pp=1, vpp=None, world=2, optimizer=False, arch="gpt2"),
    "mixtral_tp2": dict(tp=2, pp=1, vpp=None, world=2, optimizer=False, arch="mixtral"),
    "qwen2_moe_tp2": dict(tp=2, pp=1, vpp=None, world=2, optimizer=False, arch="qwen2_moe"),
}
# The model variants beside the tiny Llama (ARCHS[case's "arch"]): TransformerConfig fields
# and GPTModel arguments that differ from it.
#   qwen2  a tiny Qwen2: QKV bias (add_qkv_bias=True, no other linear bias), output layer
#          tied to the embedding (share_embeddings_and_output_weights=True)
#   mixtral  a tiny Mixtral, 2 layers (a smaller save): every MLP a MoE layer of 4 SwiGLU
#          experts (ffn 8), top-2
#          routing (Megatron's default: softmax over the top-k logits), SequentialMLP local
#          experts (moe_grouped_gemm=False: the grouped GEMM needs Transformer Engine), the
#          allgather token dispatcher, no aux loss
#   qwen2_moe  a tiny Qwen2-MoE: QKV bias, 2 layers of MoE MLPs (4 SwiGLU experts of ffn 8,
#          top-2 of the softmax over all experts: moe_router_pre_softmax, as Qwen2-MoE's
#          norm_topk_prob false) plus a shared expert (ffn 16) scaled by a sigmoid gate
#          (moe_shared_expert_gate)
#   gpt2   a tiny GPT-2: learned absolute position embeddings, LayerNorm (with bias), every
#          linear with a bias, GeLU (torch's exact erf form, Megatron's default) without a
#          gate, no GQA (8 query groups of 1 head), ffn 32, tied output layer
ARCHS = {
    "llama": dict(config={}, tied=False),
    "qwen2": dict(config=dict(add_qkv_bias=True), tied=True),
    "gpt2": dict(config=dict(normalization="LayerNorm", add_bias_linear=True,
                             gated_linear_unit=False, activation_func=torch.nn.functional.gelu,
                             num_query_groups=8, ffn_hidden_size=32),
                 tied=True, position="learned_absolute"),
    "mixtral": dict(config=dict(num_layers=2, num_moe_experts=4, moe_router_topk=2,
                                moe_ffn_hidden_size=8,
                                moe_grouped_gemm=False, moe_aux_loss_coeff=0.0,
                                moe_token_dispatcher_type="allgather"),
                    tied=False, experts=4),
    "qwen2_moe": dict(config=dict(num_layers=2, num_moe_experts=4, moe_router_topk=2,
                                  moe_ffn_hidden_size=8, moe_shared_expert_intermediate_size=16,
                                  moe_shared_expert_gate=True, moe_router_pre_softmax=True,
                                  add_qkv_bias=True, moe_grouped_gemm=False,
                                  moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="allgather"),
                      tied=False, experts=4),
}
MODEL = dict(num_layers=4, hidden_size=16, num_attention_heads=8, num_query_groups=4,
             ffn_hidden_size=16, vocab_size=64, seq_len=16)
ITERATION = 7


@contextlib.contextmanager
def cpu_save_patches():
    """dist_checkpointing.save's two unconditional CUDA calls (see the module doc)."""
    sync, cur = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = sync, cur


@contextlib.contextmanager
def cuda_tensors_on_cpu():
    """FP32Optimizer.__init__'s torch.tensor([1.0], device='cuda') (see the module doc)."""
    orig = torch.tensor

    def tensor(*a, **k):
        if str(k.get("device", "")).startswith("cuda"):
            k["device"] = "cpu"
        return orig(*a, **k)
    torch.tensor = tensor
    try:
        yield
    finally:
        torch.tensor = orig


def init(tp, pp, vpp):
    from megatron.core import parallel_state
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp)
    torch.manual_seed(1234)
    # model_parallel_cuda_manual_seed needs CUDA; the CPU initialization draws from the
    # default generator, seeded the same on every rank (the full master weight, then split).
    return parallel_state


def config(tp, pp, vpp, per_layer=False, arch="llama"):
    from megatron.core.transformer.transformer_config import TransformerConfig
    fields = dict(
        num_layers=MODEL["num_layers"], hidden_size=MODEL["hidden_size"],
        num_attention_heads=MODEL["num_attention_heads"],
        num_query_groups=MODEL["num_query_groups"], ffn_hidden_size=MODEL["ffn_hidden_size"],
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        normalization="RMSNorm", add_bias_linear=False, use_cpu_initialization=True,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, pipeline_dtype=torch.float32,
        params_dtype=torch.float32, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        attention_dropout=0.0, hidden_dropout=0.0, hetereogenous_dist_checkpoint=per_layer)
    fields.update(ARCHS[arch]["config"])
    return TransformerConfig(**fields)


def build_models(tp, pp, vpp, per_layer=False, arch="llama"):
    """The model chunks of this rank (one, or vpp of them)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    cfg = config(tp, pp, vpp, per_layer, arch)
    spec = get_gpt_layer_local_spec(num_experts=ARCHS[arch].get("experts"),
                                    moe_grouped_gemm=False, normalization=cfg.normalization)
    chunks = []
    for v in range(vpp or 1):
        vp = v if vpp else None
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        torch.manual_seed(1234 + 17 * v)
        chunks.append(GPTModel(config=cfg, transformer_layer_spec=spec,
                               vocab_size=MODEL["vocab_size"],
                               max_sequence_length=MODEL["seq_len"], pre_process=pre,
                               post_process=post,
                               share_embeddings_and_output_weights=ARCHS[arch]["tied"],
                               position_embedding_type=ARCHS[arch].get("position", "rope"),
                               vp_stage=vp))
    return chunks


def build_optimizer(chunks):
    """Megatron-Core's non-distributed fp32 path as get_megatron_optimizer takes it (which
    itself needs DDP-wrapped chunks): the param groups of all model chunks
    (_get_param_groups) and _get_megatron_optimizer_based_on_param_groups -> FP32Optimizer
    over torch AdamW (no TE, no Apex)."""
    from megatron.core.optimizer import (OptimizerConfig, _get_param_groups,
                                         _get_megatron_optimizer_based_on_param_groups)
    ocfg = OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.1, bf16=False, fp16=False,
                           use_distributed_optimizer=False, clip_grad=0.0,
                           params_dtype=torch.float32)
    groups = _get_param_groups(chunks, ocfg, None)
    with cuda_tensors_on_cpu():
        return _get_megatron_optimizer_based_on_param_groups(ocfg, chunks, groups)


def set_biases(chunks):
    """Megatron initializes every bias to zero, which no layout error would change: each bias
    (this rank's shard of it) gets values drawn, from a generator seeded by its name, for the
    full tensor (PP 1 only: there a layer's name is its global number)."""
    from megatron.core import parallel_state as ps
    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    for c in chunks:
        for name, p in c.named_parameters():
            if not name.endswith("bias"):
                continue
            shape = list(p.shape)
            dim = getattr(p, "partition_dim", -1) if getattr(p, "tensor_model_parallel", False) else -1
            if dim >= 0:
                shape[dim] *= tp
            g = torch.Generator().manual_seed(sum((i + 1) * ord(ch) for i, ch in enumerate(name)))
            full = torch.randn(shape, generator=g) * 0.5
            if dim >= 0:
                full = full.narrow(dim, rank * p.shape[dim], p.shape[dim])
            with torch.no_grad():
                p.copy_(full)


def fake_step(chunks, opt, steps=1):
    for _ in range(steps):
        for c in chunks:
            for p in c.parameters():
                p.grad = torch.sin(3 * p.detach()) + 0.1
        opt.step()


def sharded_metadata():
    """Megatron-LM 0.16's _build_sharded_state_dict_metadata (training/checkpointing.py)
    without the distributed optimizer's sharding type."""
    from megatron.core import parallel_state
    return {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
            "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}


def state_dict_for_save(chunks, opt):
    """The shape of Megatron-LM's generate_state_dict: model (model0, model1... with virtual
    pipeline), optimizer, iteration, checkpoint_version."""
    md = sharded_metadata()
    sd = {"iteration": ITERATION, "checkpoint_version": 3.0}
    if len(chunks) == 1:
        sd["model"] = chunks[0].sharded_state_dict(metadata=md)
    else:
        for i, c in enumerate(chunks):
            sd[f"model{i}"] = c.sharded_state_dict(metadata=md)
    if opt is not None:
        # built from the model's sharded state dict (its params' keys), as
        # generate_state_dict passes the whole state dict
        sd["optimizer"] = opt.sharded_state_dict(sd, metadata=md)
    return sd


def legacy_args(c):
    """The argparse.Namespace Megatron-LM saves as "args" (the fields of this model under
    Megatron-LM's argument names; megatron.training, which builds it, is not in the
    megatron-core wheel)."""
    import argparse
    M = MODEL
    return argparse.Namespace(
        num_layers=M["num_layers"], hidden_size=M["hidden_size"],
        ffn_hidden_size=M["ffn_hidden_size"], num_attention_heads=M["num_attention_heads"],
        group_query_attention=True, num_query_groups=M["num_query_groups"],
        kv_channels=M["hidden_size"] // M["num_attention_heads"],
        max_position_embeddings=M["seq_len"], seq_length=M["seq_len"],
        padded_vocab_size=M["vocab_size"], swiglu=True, normalization="RMSNorm",
        add_bias_linear=False, position_embedding_type="rope",
        untie_embeddings_and_output_weights=True, transformer_impl="local",
        tensor_model_parallel_size=c["tp"], pipeline_model_parallel_size=c["pp"],
        virtual_pipeline_model_parallel_size=c["vpp"], expert_model_parallel_size=1,
        context_parallel_size=1, data_parallel_size=1, num_experts=None,
        use_distributed_optimizer=False, bf16=False, fp16=False, params_dtype=torch.float32,
        optimizer="adam", lr=1e-2, weight_decay=0.1, clip_grad=0.0, iteration=ITERATION,
        ckpt_format="torch", use_dist_ckpt=False)


def legacy_rng_state():
    """Megatron-LM's get_rng_state() shape; its cuda_rng_state (torch.cuda.get_rng_state())
    and the CUDA tracker's states do not exist on CPU: None and {}."""
    import random
    import numpy as np
    return [{"random_rng_state": random.getstate(),
             "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(),
             "cuda_rng_state": None, "rng_tracker_states": {}}]


def save_legacy(c, chunks, opt, save_dir):
    """Megatron-LM's legacy save (ckpt_format torch; training/checkpointing.py save_checkpoint
    -> generate_state_dict -> torch.save), replayed: the model chunks'
    state_dict_for_save_checkpoint() and the optimizer's state_dict() are Megatron-Core's own;
    the dict around them, the file names (get_checkpoint_name: iter_NNNNNNN/mp_rank_TT_PPP/
    model_optim_rng.pt, _PPP when PP > 1) and latest_checkpointed_iteration.txt follow
    Megatron-LM 0.16."""
    from megatron.core import parallel_state as ps
    sd = {"args": legacy_args(c), "checkpoint_version": 3.0, "iteration": ITERATION,
          "num_floating_point_operations_so_far": 0}
    if len(chunks) == 1:
        sd["model"] = chunks[0].state_dict_for_save_checkpoint()
    else:
        for i, m in enumerate(chunks):
            sd[f"model{i}"] = m.state_dict_for_save_checkpoint()
    sd["optimizer"] = opt.state_dict()
    sd["rng_state"] = legacy_rng_state()
    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    rank_dir = f"mp_rank_{tp:02d}" + (f"_{pp:03d}" if c["pp"] > 1 else "")
    d = os.path.join(save_dir, f"iter_{ITERATION:07d}", rank_dir)
    os.makedirs(d, exist_ok=True)
    torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))


def save_worker(case, out):
    from megatron.core import dist_checkpointing
    c = CASES[case]
    init(c["tp"], c["pp"], c["vpp"])
    chunks = build_models(c["tp"], c["pp"], c["vpp"], c.get("per_layer", False),
                          c.get("arch", "llama"))
    if c.get("arch"):
        assert c["pp"] == 1, case
        set_biases(chunks)
    opt = None
    if c["optimizer"] or c.get("train"):
        opt = build_optimizer(chunks)
        fake_step(chunks, opt, steps=2)
    sd = state_dict_for_save(chunks, opt if c["optimizer"] else None)
    ckpt = os.path.join(out, case, "ckpt")
    if dist.get_rank() == 0:
        os.makedirs(ckpt, exist_ok=True)
    dist.barrier()
    with cpu_save_patches():
        dist_checkpointing.save(sd, ckpt, sharded_strategy=("torch_dist", 1))
    dist.barrier()
    if c.get("legacy"):
        save_legacy(c, chunks, opt, os.path.join(out, case, "legacy"))
    dist.destroy_process_group()


def walk_sharded(obj, out):
    """Every ShardedTensor in a (factory-applied) sharded state dict."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    if isinstance(obj, ShardedTensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            walk_sharded(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            walk_sharded(v, out)
    return out


def assemble(sharded):
    """{key: full tensor} from ShardedTensors whose pieces cover each global tensor."""
    full, covered = {}, {}
    for st in sharded:
        if st.key not in full:
            full[st.key] = torch.full(st.global_shape, float("nan"), dtype=st.data.dtype)
            covered[st.key] = torch.zeros(st.global_shape, dtype=torch.bool)
        assert st.flattened_range is None, st.key
        idx = tuple(slice(o, o + n) for o, n in zip(st.global_offset,
                                                      (1,) * st.prepend_axis_num
                                                      + tuple(st.local_shape)))
        data = st.data.reshape((1,) * st.prepend_axis_num + tuple(st.data.shape))
        full[st.key][idx] = data.detach()
        covered[st.key][idx] = True
    for k in full:
        assert bool(covered[k].all()), f"{k}: not covered"
    return full


def load_tp1(ckpt, with_optimizer, per_layer=False, arch="llama"):
    """Megatron-Core loading the checkpoint into a TP 1 x PP 1 model (and optimizer). Returns
    (chunks, opt, {key: full tensor})."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import apply_factories
    chunks = build_models(1, 1, None, per_layer, arch)
    model = chunks[0]
    opt = build_optimizer(chunks) if with_optimizer else None
    md = sharded_metadata()
    sd = {"model": model.sharded_state_dict(metadata=md)}
    if opt is not None:
        sd["optimizer"] = opt.sharded_state_dict(sd, is_loading=True, metadata=md)
    loaded = dist_checkpointing.load(sd, ckpt)
    model.load_state_dict(loaded["model"])
    if opt is not None:
        opt.load_state_dict(loaded["optimizer"])
    # what was loaded, as sharded tensors again (the live params and states)
    again = {"model": model.sharded_state_dict(metadata=md)}
    if opt is not None:
        again["optimizer"] = opt.sharded_state_dict(again, metadata=md)
    apply_factories(again)
    return chunks, opt, assemble(walk_sharded(again, [])), loaded


def tensors_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def walk_common_steps(obj, out):
    """FP32Optimizer.sharded_state_dict's state["common_step"] wherever it is (a
    ChainedOptimizer's is a list of its optimizers' dicts)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "common_step":
                out.add(int(v))
            else:
                walk_common_steps(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            walk_common_steps(v, out)


def legacy_expected(model, opt):
    """The legacy save's expected tensors, from the same training state as Megatron-Core loads
    it from the torch_dist twin into the TP 1 x PP 1 model: the model's state dict (the names
    state_dict_for_save_checkpoint gives at TP 1 x PP 1, every layer number global), and per
    param the FP32Optimizer's state as fc names it: optimizer.fp32.<name> (its own master:
    the weight), optimizer.exp_avg.<name>, optimizer.exp_avg_sq.<name>."""
    out = {k: v.detach().contiguous() for k, v in model.state_dict_for_save_checkpoint().items()
           if isinstance(v, torch.Tensor)}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            n = names[id(p)]
            st = opt.optimizer.state[p]
            out[f"optimizer.fp32.{n}"] = p.detach().clone().contiguous()
            out[f"optimizer.exp_avg.{n}"] = st["exp_avg"].detach().contiguous()
            out[f"optimizer.exp_avg_sq.{n}"] = st["exp_avg_sq"].detach().contiguous()
    return out


def expected_worker(case, out):
    c = CASES[case]
    init(1, 1, None)
    ckpt = os.path.join(out, case, "ckpt")
    chunks, opt, full, loaded = load_tp1(ckpt, c["optimizer"], c.get("per_layer", False),
                                         c.get("arch", "llama"))
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in full.items()},
              os.path.join(out, case, "expected.safetensors"))
    if c.get("legacy"):
        save_file(legacy_expected(chunks[0], opt),
                  os.path.join(out, case, "expected_legacy.safetensors"))
    info = dict(c, model=MODEL, iteration=ITERATION, tensors=len(full))
    if opt is not None:
        # the Adam step: not a sharded tensor, so dist_checkpointing keeps it in common.pt
        common = torch.load(os.path.join(ckpt, "common.pt"), weights_only=False)
        steps = set()
        walk_common_steps(common["optimizer"], steps)
        assert len(steps) == 1, steps
        info["optimizer_step"] = steps.pop()
    with open(os.path.join(out, case, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    dist.destroy_process_group()


def error_of(fn):
    """The exception fn raises, as 'Type: message' (first line), or None when it runs."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 (a probe: whatever it raises is the answer)
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
        # where in Megatron-Core: its innermost frame
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if "/megatron/core/" in f.filename]
        if frames:
            f = frames[-1]
            where = f.filename[f.filename.index("/megatron/") + 1:]
            msg += f" (at {where}:{f.lineno} {f.name}: {f.line})"
        return msg
    return None


def errors_worker(out):
    """What does not run on CPU, each tried as Megatron-Core's code takes it (one gloo
    process, TP 1 x PP 1); the exact errors go to errors.json."""
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer import (OptimizerConfig, _get_param_groups,
                                         _get_megatron_optimizer_based_on_param_groups,
                                         get_megatron_optimizer)
    init(1, 1, None)
    errors = {}

    def bf16_float16_optimizer():
        chunks = build_models(1, 1, None)
        for c in chunks:
            c.bfloat16()
        ocfg = OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True,
                               use_distributed_optimizer=False, clip_grad=0.0)
        groups = _get_param_groups(chunks, ocfg, None)
        with cuda_tensors_on_cpu():  # its unity loss scale on 'cuda', as for FP32Optimizer
            _get_megatron_optimizer_based_on_param_groups(ocfg, chunks, groups)
    errors["Float16OptimizerWithFloat16Params (bf16 params, non-distributed)"] = \
        error_of(bf16_float16_optimizer)

    def distributed_optimizer():
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        chunks = build_models(1, 1, None)
        ddp = [DistributedDataParallel(c.config, DistributedDataParallelConfig(
            use_distributed_optimizer=True), c) for c in chunks]
        get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True,
                                               use_distributed_optimizer=True), ddp)
    errors["DistributedOptimizer (DistributedDataParallel's grad buffers)"] = \
        error_of(distributed_optimizer)

    def fp32_optimizer_unpatched():
        chunks = build_models(1, 1, None)
        ocfg = OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=False)
        _get_megatron_optimizer_based_on_param_groups(
            ocfg, chunks, _get_param_groups(chunks, ocfg, None))
    errors["FP32Optimizer without the torch.tensor(device='cuda') patch"] = \
        error_of(fp32_optimizer_unpatched)

    def save_unpatched():
        chunks = build_models(1, 1, None)
        d = os.path.join(out, "_unpatched_save")
        os.makedirs(d, exist_ok=True)
        try:
            dist_checkpointing.save({"model": chunks[0].sharded_state_dict()}, d,
                                    sharded_strategy=("torch_dist", 1))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    errors["dist_checkpointing.save (torch_dist) without the CUDA patches"] = \
        error_of(save_unpatched)

    def legacy_save():
        import importlib
        importlib.import_module("megatron.training.checkpointing")
    errors["Megatron-LM legacy per-rank save (megatron.training.checkpointing.save_checkpoint)"] = \
        error_of(legacy_save)

    def moe_grouped_gemm():
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        cfg = config(1, 1, None, arch="mixtral")
        cfg.moe_grouped_gemm = True
        GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(
                     num_experts=ARCHS["mixtral"]["experts"], moe_grouped_gemm=True,
                     normalization="RMSNorm"),
                 vocab_size=MODEL["vocab_size"], max_sequence_length=MODEL["seq_len"])
    errors["MoE experts as grouped GEMM (moe_grouped_gemm=True)"] = error_of(moe_grouped_gemm)

    def moe_forward_unpatched():
        import megatron.core.transformer.moe.moe_utils as moe_utils
        assert not hasattr(moe_utils, "te_general_gemm")
        model = build_models(1, 1, None, arch="mixtral")[0]
        model.eval()
        cur = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"  # as the forward patches it (RotaryEmbedding)
        try:
            with torch.no_grad():
                model.decoder.layers[0].mlp.router(torch.zeros(2, 1, MODEL["hidden_size"]))
        finally:
            torch.cuda.current_device = cur
    errors["MoE router forward without Transformer Engine (torch.cuda.current_device "
           "patched to cpu, no te_general_gemm patch)"] = \
        error_of(moe_forward_unpatched)

    with open(os.path.join(out, "errors.json"), "w") as f:
        json.dump(errors, f, indent=1)
        f.write("\n")
    dist.destroy_process_group()


def torchrun(n, port, *args, clean_dirs=()):
    """This file's workers under torch.distributed.run; a worker killed by a signal is run
    again (testdata/real/torchrun.py says why)."""
    sys.path.insert(0, os.path.dirname(HERE))
    import torchrun as torchrun_module
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun_module.check_run(n, port, [os.path.abspath(__file__), *args], env, clean_dirs)


def main():
    if sys.argv[1] == "--save":
        save_worker(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "--errors":
        errors_worker(sys.argv[2])
        return
    if sys.argv[1] == "--expected":
        expected_worker(sys.argv[2], sys.argv[3])
        return
    out = os.path.abspath(sys.argv[1])
    cases = sys.argv[2:] or list(CASES)
    port = int(os.environ.get("FC_TORCHRUN_PORT", "29700"))
    for case in cases:
        shutil.rmtree(os.path.join(out, case), ignore_errors=True)
        os.makedirs(os.path.join(out, case))
        torchrun(CASES[case]["world"], port, "--save", case, out,
                 clean_dirs=[os.path.join(out, case)])
        torchrun(1, port + 1, "--expected", case, out)
    if not sys.argv[2:]:
        torchrun(1, port, "--errors", out)
    import megatron.core
    import safetensors
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({"torch": torch.__version__, "megatron-core": megatron.core.__version__,
                   "safetensors": safetensors.__version__,
                   "python": platform.python_version()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
