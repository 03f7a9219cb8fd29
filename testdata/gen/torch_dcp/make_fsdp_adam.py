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

usage: /usr/bin/python3 make_fsdp_adam.py SHARED_TOOLS_DIR OUT_DIR  (writes OUT_DIR/<name>)
"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch_dcp_fixture as fixture  # noqa: E402
import torch  # noqa: E402

STEPS = {"fsdp_adam": {}, "fsdp_adam_steps": {"optim.state.norm.weight.step": 11.0}}


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

# The writer's ranks are spawned processes that import this file again (not its main
# block): the step values reach them through the environment.
_random_value = fixture.full_value


def _full_value(t, seed):
    if t["name"].endswith(".step"):
        steps = json.loads(os.environ.get("FC_FIXTURE_STEPS", "{}"))
        return torch.tensor(steps.get(t["name"], 12.0), dtype=torch.float32)
    return _random_value(t, seed)


fixture.full_value = _full_value

if __name__ == "__main__":
    out_root = sys.argv[2]
    for name, steps in STEPS.items():
        os.environ["FC_FIXTURE_STEPS"] = json.dumps(steps)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(SPEC, f)
        try:
            sys.argv = [sys.argv[0], f.name, os.path.join(out_root, name)]
            fixture.main()
        finally:
            os.unlink(f.name)
