"""Writes DeepSpeed checkpoints with the real DeepSpeed (0.19.8, torch 2.15, the interop
environment) on CPU, and beside each the values DeepSpeed's own tools give back.

usage: python make_fixtures.py OUT_DIR [CASE...]
  (the interop environment's python: ~/.cache/fc-interop/torch/bin/python)

Each case runs `python -m torch.distributed.run --nproc-per-node DP` (gloo, the CPU
accelerator: DS_ACCELERATOR=cpu), deepspeed.initialize with "torch_adam": true (no FusedAdam
build), trains two steps of a tiny model and engine.save_checkpoint()s:

OUT_DIR/<case>/ckpt/                       the save dir as DeepSpeed wrote it (`latest`, the
                                           tag dir(s); the zero_to_fp32.py copy dropped)
OUT_DIR/<case>/expected_fp32.safetensors   deepspeed.utils.zero_to_fp32's
                                           get_fp32_state_dict_from_zero_checkpoint(ckpt):
                                           the consolidated fp32 state dict, DeepSpeed's names
OUT_DIR/<case>/expected_module.safetensors rank 0's module state dict as saved
                                           (mp_rank_00_model_states.pt 'module', ZeRO-3:
                                           zero_pp_rank_0_mp_rank_00_model_states.pt; pipelines:
                                           the live PipelineModule's state dict; MoE: plus
                                           the layer_L_expert_E_* files' tensors)
OUT_DIR/<case>/expected_ucp.safetensors    python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state of
                                           the latest tag: every zero/<param>/<state>.pt value
                                           as "<param>/<state>" (0-d step: float32 scalar)
OUT_DIR/<case>/expected_live.safetensors   the trained engine's values through DeepSpeed's
                                           API (safe_get_full_fp32_param / _optimizer_state,
                                           see live_values): the oracle where zero_to_fp32
                                           and ds_to_universal fail (pipeline, MoE)
OUT_DIR/<case>/info.json                   dp, zero stage, dtype, and from the model states
                                           shared_params, frozen_param_shapes' names,
                                           buffer_names, dp_world_size, ds_version
OUT_DIR/versions.json                      deepspeed, torch, safetensors, Python
OUT_DIR/errors.json                        cases (or steps) DeepSpeed could not run on CPU,
                                           with the exception text

The model (Tiny): an embedding tied with the output head (shared_params), a frozen Linear
(requires_grad False: frozen_param_shapes/fragments), a LayerNorm, a persistent buffer.
Sizes are odd so the flat partitions split params unevenly across ranks.
"""
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrun as torchrun_module  # noqa: E402  (testdata/real/torchrun.py)

# name: (dp, zero stage, dtype, extra config)
CASES = {
    "zero0_fp32": (2, 0, "fp32", {}),
    "zero1_fp32": (2, 1, "fp32", {}),
    "zero2_fp32": (2, 2, "fp32", {}),
    "zero3_fp32": (2, 3, "fp32", {}),
    "zero1_bf16": (2, 1, "bf16", {}),
    "zero2_bf16": (2, 2, "bf16", {}),
    "zero3_bf16": (2, 3, "bf16", {}),
    "zero0_bf16": (2, 0, "bf16", {}),
    "bf16_optimizer": (2, 1, "bf16", {"grad_accum_dtype": "fp32"}),
    "zero2_fp32_dp3": (3, 2, "fp32", {}),
    "zero3_fp32_dp3": (3, 3, "fp32", {}),
    "zero3_subgroup": (2, 3, "fp32", {"sub_group_size": 100}),
    "pp2": (2, 1, "fp32", {"pipeline": 2}),
    "moe_ep2": (2, 2, "fp32", {"moe": 2}),
}
TWO_TAGS = {"zero2_fp32"}  # saves tags step1 and step2 (latest -> step2); the others step2 only
VOCAB, HID, FF = 25, 8, 12


class Tiny(nn.Module):
    def __init__(self, moe_ep=0):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HID)
        self.proj = nn.Linear(HID, FF)
        self.norm = nn.LayerNorm(FF)
        self.out = nn.Linear(FF, HID)
        self.frozen = nn.Linear(HID, HID)
        self.frozen.weight.requires_grad_(False)
        self.frozen.bias.requires_grad_(False)
        self.head = nn.Linear(HID, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.linspace(0.5, 1.5, VOCAB))
        self.moe = None
        if moe_ep:
            from deepspeed.moe.layer import MoE
            self.moe = MoE(hidden_size=HID, expert=nn.Linear(HID, HID), num_experts=2,
                           ep_size=moe_ep, k=1)

    def forward(self, ids):
        h = self.embed(ids)
        h = self.out(self.norm(torch.relu(self.proj(h))))
        h = self.frozen(h)
        if self.moe is not None:
            h, _, _ = self.moe(h)
        return self.head(h) * self.scale.to(h.dtype)


def pipeline_model(stages):
    from deepspeed.pipe import PipelineModule, LayerSpec, TiedLayerSpec

    class Embed(nn.Embedding):
        def forward(self, ids):
            return super().forward(ids)

    def head_fn(module, h):
        return torch.nn.functional.linear(h, module.weight)

    class Relu(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    layers = [TiedLayerSpec("embed", Embed, VOCAB, HID),
              LayerSpec(nn.Linear, HID, FF), LayerSpec(Relu), LayerSpec(nn.LayerNorm, FF),
              LayerSpec(nn.Linear, FF, HID),
              TiedLayerSpec("embed", Embed, VOCAB, HID, forward_fn=head_fn)]
    return PipelineModule(layers=layers, num_stages=stages,
                          loss_fn=lambda out, _: out.float().square().mean(),
                          partition_method="uniform")


def config(dp, stage, dtype, extra):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "train_batch_size": 2 * dp,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "steps_per_print": 1000,
           "wall_clock_breakdown": False}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if "grad_accum_dtype" in extra:  # ZeRO-1 + bf16 + fp32 accumulation: BF16_Optimizer
        cfg["data_types"] = {"grad_accum_dtype": extra["grad_accum_dtype"]}
    if "sub_group_size" in extra:
        cfg["zero_optimization"]["sub_group_size"] = extra["sub_group_size"]
    return cfg


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, VOCAB, (2, 6), generator=g)


def live_values(engine, model, out, case):
    """DeepSpeed's own view of the trained state, through its API (safe_get_full_fp32_param,
    safe_get_full_optimizer_state: collectives, every rank calls them for its params), gathered
    to rank 0 -> expected_live.safetensors: <name>, optimizer.exp_avg.<name>,
    optimizer.exp_avg_sq.<name> under the module's parameter names (MoE experts: the global
    expert id, local id + ep_rank * local experts)."""
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    mine = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        fp32 = safe_get_full_fp32_param(p)
        if fp32 is None:
            continue
        m = re.search(r"deepspeed_experts\.(\d+)\.", name)
        if m is not None:
            from deepspeed.utils import groups
            ep = groups._get_expert_parallel_rank(p.group_name)
            local = len(model.moe.deepspeed_moe.experts.deepspeed_experts)
            name = name[:m.start(1)] + str(int(m.group(1)) + ep * local) + name[m.end(1):]
        mine[name] = fp32.detach().float().cpu().clone()
        for state in ("exp_avg", "exp_avg_sq"):
            try:
                v = safe_get_full_optimizer_state(p, state)
            except ValueError:  # an expert no token was routed to: no Adam state yet
                v = None
            if v is not None:
                mine[f"optimizer.{state}.{name}"] = v.detach().float().cpu().clone()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        merged = {}
        for d in every:
            for k, v in d.items():
                merged.setdefault(k, v)
        write(merged, os.path.join(out, case, "expected_live.safetensors"))


def live_module(engine, out, case):
    """Pipelines: the PipelineModule's own state dict names (tied_modules.<key>.<name>,
    <layer>.<name>), each stage's DP rank 0, gathered -> expected_module.safetensors. The
    layer files hold these tensors (layer_LL-model_states.pt) without the names."""
    import torch.distributed as dist
    mine = {}
    if engine.grid.get_data_parallel_rank() == 0:
        mine = {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        merged = {}
        for d in every:
            for k, v in d.items():
                merged.setdefault(k, v)
        write(merged, os.path.join(out, case, "expected_module.safetensors"))


def worker(out, case):
    import deepspeed
    import torch.distributed as dist
    dp, stage, dtype, extra = CASES[case]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    ckpt = os.path.join(out, case, "ckpt")
    if "pipeline" in extra:
        model = pipeline_model(extra["pipeline"])
        dp = dist.get_world_size() // extra["pipeline"]
        cfg = config(dp, stage, dtype, extra)
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=cfg)
        for step in (1, 2):
            ids = batch(step, 0)
            engine.train_batch(data_iter=iter([(ids, ids)]))
        engine.save_checkpoint(ckpt, tag="step2")
        live_values(engine, model, out, case)
        live_module(engine, out, case)
        dist.barrier()
        return
    model = Tiny(moe_ep=extra.get("moe", 0))
    params = [p for p in model.parameters() if p.requires_grad]
    if "moe" in extra:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        params = split_params_into_different_moe_groups_for_optimizer(
            {"params": params, "name": "dense"})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params,
                                           config=config(dp, stage, dtype, extra))
    for step in (1, 2):
        logits = engine(batch(step, rank))
        loss = logits.float().square().mean()
        engine.backward(loss)
        engine.step()
        if step == 1 and case in TWO_TAGS:
            engine.save_checkpoint(ckpt, tag="step1")
    engine.save_checkpoint(ckpt, tag="step2")
    live_values(engine, model, out, case)
    dist.barrier()


def clone_all(sd):
    """Tensors of a state dict, each its own storage (safetensors refuses shared ones)."""
    return {k: v.detach().clone().contiguous() for k, v in sd.items()
            if isinstance(v, torch.Tensor)}


def write(tensors, path):
    from safetensors.torch import save_file
    save_file(clone_all(tensors), path)


def module_state(tag_dir):
    files = sorted(f for f in glob.glob(os.path.join(tag_dir, "layer_*-model_states.pt"))
                   if re.fullmatch(r"layer_\d+-(model_00-)?model_states\.pt", os.path.basename(f)))
    if files:
        out = {}
        for f in files:
            layer = int(os.path.basename(f).split("-")[0][len("layer_"):])
            for k, v in torch.load(f, map_location="cpu", weights_only=False).items():
                out[f"{layer}.{k}"] = v
        return out
    name = "mp_rank_00_model_states.pt"
    if not os.path.exists(os.path.join(tag_dir, name)):
        name = "zero_pp_rank_0_mp_rank_00_model_states.pt"  # ZeRO-3
    sd = torch.load(os.path.join(tag_dir, name), map_location="cpu", weights_only=False)
    out = dict(sd["module"])
    # MoE: the experts' weights are in layer_L_expert_E_mp_rank_00_model_states.pt, under
    # their global names (what DeepSpeed's load_moe_state_dict puts back into the module)
    for f in sorted(glob.glob(os.path.join(tag_dir, "layer_*_expert_*_mp_rank_00_model_states.pt"))):
        out.update(torch.load(f, map_location="cpu", weights_only=False))
    return out


def case_info(tag_dir):
    """info.json: what the tests need to know about a save (from its model states)."""
    name = "mp_rank_00_model_states.pt"
    if not os.path.exists(os.path.join(tag_dir, name)):
        name = "zero_pp_rank_0_mp_rank_00_model_states.pt"
    sd = torch.load(os.path.join(tag_dir, name), map_location="cpu", weights_only=False)
    return {"shared_params": dict(sd.get("shared_params") or {}),
            "frozen_param_shapes": sorted((sd.get("frozen_param_shapes") or {}).keys()),
            "buffer_names": list(sd.get("buffer_names") or []),
            "dp_world_size": sd.get("dp_world_size"), "ds_version": sd.get("ds_version")}


def ucp_loaded(ucp):
    """Every zero/<param>/<state>.pt of a UCP dir, loaded: ("<param>/<state>", value), sorted."""
    zero = os.path.join(ucp, "zero")
    for name in sorted(os.listdir(zero)):
        d = os.path.join(zero, name)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            yield (f"{name}/{f[:-3]}",
                   torch.load(os.path.join(d, f), map_location="cpu", weights_only=False))


def ucp_values(ucp):
    out = {}
    for key, v in ucp_loaded(ucp):
        if isinstance(v, dict):
            v = v["param"]
        if not isinstance(v, torch.Tensor):
            v = torch.tensor(v, dtype=torch.float32)
        out[key] = v
    return out


def ds_to_universal(tag_dir, ucp):
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                    "--input_folder", tag_dir, "--output_folder", ucp, "--inject_missing_state",
                    "--num_extract_workers",
                    "1", "--num_merge_workers", "1"], check=True, capture_output=True, text=True)


def expect(out, case, errors):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    ckpt = os.path.join(out, case, "ckpt")
    for f in glob.glob(os.path.join(ckpt, "zero_to_*.py")):
        os.remove(f)
    tag_dir = os.path.join(ckpt, "step2")
    dp, stage, dtype, extra = CASES[case]
    info = dict(case_info(tag_dir), dp=dp, zero_stage=stage, dtype=dtype, extra=extra)
    with open(os.path.join(out, case, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    try:
        if "pipeline" not in extra:  # pipelines: written by the worker (live_module)
            write(module_state(tag_dir), os.path.join(out, case, "expected_module.safetensors"))
    except Exception as e:  # noqa: BLE001
        errors[f"{case}: module state"] = f"{type(e).__name__}: {e}"
    try:
        write(get_fp32_state_dict_from_zero_checkpoint(ckpt),
              os.path.join(out, case, "expected_fp32.safetensors"))
        if case in TWO_TAGS:
            write(get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="step1"),
                  os.path.join(out, case, "expected_fp32_step1.safetensors"))
    except Exception as e:  # noqa: BLE001
        errors[f"{case}: zero_to_fp32"] = f"{type(e).__name__}: {e}"
    with tempfile.TemporaryDirectory() as tmp:
        ucp = os.path.join(tmp, "ucp")
        try:
            ds_to_universal(tag_dir, ucp)
            write(ucp_values(ucp), os.path.join(out, case, "expected_ucp.safetensors"))
        except subprocess.CalledProcessError as e:
            tail = (e.stderr or "").strip().splitlines()[-1:] or [""]
            errors[f"{case}: ds_to_universal"] = tail[0]
        except Exception as e:  # noqa: BLE001
            errors[f"{case}: ds_to_universal"] = f"{type(e).__name__}: {e}"


def torchrun(nproc, port, args, env, clean_dir=None):
    """Runs args under torch.distributed.run; returns the CompletedProcess (output captured).
    A worker killed by a signal is repeated (testdata/real/torchrun.py says why)."""
    return torchrun_module.run(nproc, port, args, env, [clean_dir] if clean_dir else [])


def run_case(out, case, port, errors):
    dp, stage, dtype, extra = CASES[case]
    nproc = dp * extra.get("pipeline", 1)
    shutil.rmtree(os.path.join(out, case), ignore_errors=True)
    os.makedirs(os.path.join(out, case))
    p = torchrun(nproc, port, [os.path.abspath(__file__), "--worker", out, case], env(),
                 os.path.join(out, case))
    if p.returncode != 0:
        lines = [l for l in (p.stdout + p.stderr).splitlines()
                 if re.search(r"^(\[rank\d+\]: )?\w+(Error|Exception): ", l)]
        errors[case] = lines[-1].strip() if lines else f"exit {p.returncode}"
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
        shutil.rmtree(os.path.join(out, case), ignore_errors=True)
        return
    expect(out, case, errors)


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    e.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache",
                                                      "fc-interop", "torch_extensions"))
    return e


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    out = os.path.abspath(sys.argv[1])
    cases = sys.argv[2:] or list(CASES)
    os.makedirs(out, exist_ok=True)
    os.environ.update(env())
    errors = {}
    port = int(os.environ.get("FC_TORCHRUN_PORT", "29611"))
    for case in cases:
        print(f"{case} ...", flush=True)
        run_case(out, case, port, errors)
    import deepspeed
    import safetensors
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                   "safetensors": safetensors.__version__,
                   "python": platform.python_version()}, f, indent=1)
        f.write("\n")
    errors = {k: v.replace(out + os.sep, "OUT/") for k, v in errors.items()}
    with open(os.path.join(out, "errors.json"), "w") as f:
        json.dump(errors, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(errors, indent=1))


if __name__ == "__main__":
    main()
