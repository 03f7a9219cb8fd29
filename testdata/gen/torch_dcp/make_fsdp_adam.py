#!/usr/bin/env python3
"""Write torch DCP checkpoints holding a model and its Adam states under the names
torch.distributed.checkpoint gives a flattened {"model": ..., "optim": ...} state dict
(get_state_dict / FSDP optim_state_dict): model.<fqn>, optim.state.<fqn>.exp_avg,
.exp_avg_sq and .step (a 0-d float32 tensor, as torch's Adam keeps it), with the shared
fixture writer (real multi-rank saves by Debian's torch 1.13). The steps are whole numbers
(the writer's random values are replaced for them).

  fsdp_adam        3 params (fp32 row-split, bf16 column-split with bf16 states, fp32 whole)
                   + a buffer without optimizer state; every step 12
  fsdp_adam_steps  the same with the norm's step 11 (params that disagree on the step)
  megatron_dist    the names Megatron-Core's dist checkpointing (torch_dist) gives a bf16
                   model and its mixed-precision Adam: model keys without a prefix (a
                   layer-stacked [2, 6, 4] fc1 weight), optimizer.state.fp32_param.<key>,
                   optimizer.state.exp_avg.<key>, optimizer.state.exp_avg_sq.<key> (fp32, cut
                   like the weights), no step tensor, a bf16 buffer-like tensor without state,
                   an object item; beside the DCP files what Megatron's dist checkpointing
                   adds: common.pt (torch.save of the state dict's unsharded rest: args,
                   checkpoint_version, iteration 40, optimizer param groups with step 40,
                   opt_param_scheduler) and metadata.json (the sharded backend)
  megatron_reshardable  the same tensors as the distributed optimizer's fully_reshardable
                   form saves them (Megatron-Core 0.14 on): the fp32 master weight as
                   optimizer.state.param.<key>; common.pt with that sharding type, step 41
  megatron_dp_reshardable  the distributed optimizer's dp_reshardable form (Megatron-Core
                   0.14/0.15's default): flat per-bucket fp32 buffers
                   optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16,
                   torch.float32).bucket_idx_0.{param,exp_avg,exp_avg_sq}, cut between the 2
                   DP ranks, that name no param; common.pt with that sharding type, step 42

usage: /usr/bin/python3 make_fsdp_adam.py SHARED_TOOLS_DIR OUT_DIR  (writes OUT_DIR/<name>)
"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch_dcp_fixture as fixture  # noqa: E402
import torch  # noqa: E402

STEPS = {"fsdp_adam": {}, "fsdp_adam_steps": {"optim.state.norm.weight.step": 11.0},
         "megatron_dist": {}, "megatron_reshardable": {}, "megatron_dp_reshardable": {}}


def split(axis, sizes=None):
    s = {"axis": axis, "ranks": [0, 1]}
    if sizes:
        s["sizes"] = sizes
    return s


def param(fqn, shape, dtype, placement):
    tensors = [dict(name="model." + fqn, shape=shape, dtype=dtype, **placement)]
    for state in ("exp_avg", "exp_avg_sq"):
        tensors.append(dict(name=f"optim.state.{fqn}.{state}", shape=shape, dtype=dtype,
                            **placement))
    tensors.append({"name": f"optim.state.{fqn}.step", "shape": [], "dtype": "float32", "on": 0})
    return tensors


SPEC = {"world": 2, "seed": 11, "tensors": (
    param("embed.weight", [8, 4], "float32", {"split": split(0)})
    + param("layers.0.proj.weight", [6, 4], "bfloat16", {"split": split(1, [1, 3])})
    + param("norm.weight", [4], "float32", {"on": 1})
    + [{"name": "model.rope.inv_freq", "shape": [2], "dtype": "float32", "on": 0}]),
    "objects": {"optim.param_groups.lr": 0.001}}


def megatron_param(key, shape, placement, master="fp32_param"):
    tensors = [dict(name=key, shape=shape, dtype="bfloat16", **placement)]
    for state in (master, "exp_avg", "exp_avg_sq"):
        tensors.append(dict(name=f"optimizer.state.{state}.{key}", shape=shape, dtype="float32",
                            **placement))
    return tensors


MEGATRON_SPEC = {"world": 2, "seed": 23, "tensors": (
    megatron_param("embedding.word_embeddings.weight", [8, 4], {"split": split(0)})
    + megatron_param("decoder.layers.mlp.linear_fc1.weight", [2, 6, 4], {"split": split(1)})
    + megatron_param("decoder.final_layernorm.weight", [4], {"on": 1})
    + [{"name": "decoder.layers.self_attention.core_attention.inv_freq", "shape": [2],
        "dtype": "bfloat16", "on": 0}]),
    "objects": {"rng_state/shard_0.0_1.2": 7}}
RESHARDABLE_SPEC = {"world": 2, "seed": 29, "tensors": (
    megatron_param("embedding.word_embeddings.weight", [8, 4], {"split": split(0)}, "param")
    + megatron_param("decoder.final_layernorm.weight", [4], {"on": 1}, "param")),
    "objects": {"rng_state/shard_0.0_1.2": 7}}
BUCKET = "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0"
DP_RESHARDABLE_SPEC = {"world": 2, "seed": 31, "tensors": (
    [{"name": "embedding.word_embeddings.weight", "shape": [8, 4], "dtype": "bfloat16",
      "split": split(0)},
     {"name": "decoder.final_layernorm.weight", "shape": [4], "dtype": "bfloat16", "on": 1}]
    + [{"name": BUCKET + "." + state, "shape": [100], "dtype": "float32",
        "split": split(0, [36, 64])} for state in ("param", "exp_avg", "exp_avg_sq")]),
    "objects": {"rng_state/shard_0.0_1.2": 7}}
SPECS = {"fsdp_adam": SPEC, "fsdp_adam_steps": SPEC, "megatron_dist": MEGATRON_SPEC,
         "megatron_reshardable": RESHARDABLE_SPEC,
         "megatron_dp_reshardable": DP_RESHARDABLE_SPEC}

# The writer's ranks are spawned processes that import this file again (not its main
# block): the step values reach them through the environment.
_random_value = fixture.full_value


def _full_value(t, seed):
    if t["name"].endswith(".step"):
        steps = json.loads(os.environ.get("FC_FIXTURE_STEPS", "{}"))
        return torch.tensor(steps.get(t["name"], 12.0), dtype=torch.float32)
    return _random_value(t, seed)


fixture.full_value = _full_value

def step_truth(name, fqn):
    """The step each fixture's docstring promises (apart from STEPS and _full_value)."""
    return 11.0 if (name, fqn) == ("fsdp_adam_steps", "optim.state.norm.weight.step") else 12.0


def check_truth(name, out):
    """Ground truth (issue 34 item 3): expected/ and the checkpoint the ranks wrote (read back
    by dcp_truth's own reader) hold the spec's seeded draws, steps the whole numbers above."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import dcp_truth
    spec = SPECS[name]
    truth = dcp_truth.spec_truth(spec)
    for fqn in truth:
        if fqn.endswith(".step"):
            truth[fqn] = torch.tensor(step_truth(name, fqn), dtype=torch.float32)
    dcp_truth.assert_expected(os.path.join(out, "expected"), truth)
    dcp_truth.assert_checkpoint(os.path.join(out, "ckpt"), truth, spec.get("objects", {}))


def write_megatron_common(ckpt, sharding="fully_sharded_model_space", step=40):
    """common.pt and metadata.json as megatron.core.dist_checkpointing.save writes them
    (save_common: torch.save of the common state dict; save_config: the backends)."""
    import argparse
    args = argparse.Namespace(num_layers=2, hidden_size=4, bf16=True,
                              use_distributed_optimizer=True, ckpt_format="torch_dist")
    groups = [{"lr": 1e-4, "weight_decay": wd, "betas": (0.9, 0.95), "eps": 1e-8, "step": step}
              for wd in (0.1, 0.0)]
    common = {"args": args, "checkpoint_version": 3.0, "iteration": step,
              "optimizer": {"optimizer": {"param_groups": groups},
                            "param_state_sharding_type": sharding},
              "opt_param_scheduler": {"max_lr": 1e-4, "num_steps": step},
              "num_floating_point_operations_so_far": 1234}
    torch.save(common, os.path.join(ckpt, "common.pt"))
    with open(os.path.join(ckpt, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)


if __name__ == "__main__":
    out_root = sys.argv[2]
    for name, steps in STEPS.items():
        os.environ["FC_FIXTURE_STEPS"] = json.dumps(steps)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(SPECS[name], f)
        try:
            sys.argv = [sys.argv[0], f.name, os.path.join(out_root, name)]
            fixture.main()
        finally:
            os.unlink(f.name)
        check_truth(name, os.path.join(out_root, name))
        if name == "megatron_dist":
            write_megatron_common(os.path.join(out_root, name, "ckpt"))
        if name == "megatron_reshardable":
            write_megatron_common(os.path.join(out_root, name, "ckpt"), "fully_reshardable", 41)
        if name == "megatron_dp_reshardable":
            write_megatron_common(os.path.join(out_root, name, "ckpt"), "dp_reshardable", 42)
