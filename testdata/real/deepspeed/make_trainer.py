"""Writes a DeepSpeed checkpoint saved by transformers' Trainer (its DeepSpeed integration,
through accelerate) with the real DeepSpeed 0.19.8 on CPU, and beside it what DeepSpeed's
own tools give back, as make_fixtures.py does for its cases.

usage: python make_trainer.py OUT_DIR
  (the interop environment's python; the Trainer needs accelerate, pinned in scripts/interop/torch.txt)

The model: transformers' LlamaForCausalLM (vocabulary 64, hidden 16, 2 layers, 4 heads in 2
KV groups, FFN 24, untied lm_head), fp32, seeded. TrainingArguments(deepspeed=<ZeRO-2 config,
"torch_adam": true AdamW, batch sizes "auto">, max_steps 2, save_steps 2): Trainer.train()
saves OUT/trainer_zero2/ckpt = the Trainer's checkpoint-2 dir (global_step2/ with the
DeepSpeed files, `latest`, and the Trainer's own model.safetensors, trainer_state.json, ...;
zero_to_*.py dropped).

One process only (torchrun --nproc-per-node 1): on CPU the Trainer does not run DeepSpeed over
several processes. Without an accelerator, accelerate (1.16) gives a non-`use_cpu` run no
distributed backend (DistributedType.NO, world size 1) while deepspeed.initialize joins all
the torchrun processes, so the Trainer's "auto" batch size (per device x 1) is refused by
DeepSpeed; `use_cpu=True` turns DeepSpeed off. The 2-process attempt is run too and its error
recorded in OUT/errors.json under "trainer_zero2_dp2" (merged into that file).

OUT/trainer_zero2/expected_fp32.safetensors   zero_to_fp32 of ckpt (get_fp32_state_dict_
                                              from_zero_checkpoint; it follows `latest`)
OUT/trainer_zero2/expected_module.safetensors the saved module state dict
                                              (global_step2/mp_rank_00_model_states.pt);
                                              equal to the Trainer's model.safetensors
OUT/trainer_zero2/expected_ucp.safetensors    ds_to_universal of global_step2
OUT/trainer_zero2/expected_live.safetensors   the trained engine through safe_get_full_*
OUT/trainer_zero2/info.json                   as make_fixtures.py writes it
"""
import glob
import json
import os
import re
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  (torchrun, env, write, expect helpers)

CASE = "trainer_zero2"
PORT = 29621


def worker(out, case):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float()
    data = [{"input_ids": x, "labels": x}
            for x in ((torch.arange(8) * (3 + i)) % 64 for i in range(8))]
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
          "steps_per_print": 1000}
    run = os.path.join(out, case, "run")
    args = TrainingArguments(output_dir=run, deepspeed=ds, max_steps=2, save_steps=2,
                             save_strategy="steps", per_device_train_batch_size=2,
                             learning_rate=1e-2, report_to=[], logging_steps=1000, seed=1234,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    mf.live_values(trainer.model_wrapped, trainer.model, out, case)


def expect(out, case):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file
    run = os.path.join(out, case, "run")
    ckpt = os.path.join(out, case, "ckpt")
    os.rename(os.path.join(run, "checkpoint-2"), ckpt)
    shutil.rmtree(run)
    for f in glob.glob(os.path.join(ckpt, "zero_to_*.py")):
        os.remove(f)
    tag_dir = os.path.join(ckpt, "global_step2")
    info = dict(mf.case_info(tag_dir), dp=1, zero_stage=2, dtype="fp32", extra={},
                saved_by="transformers.Trainer")
    import transformers
    info["transformers"] = transformers.__version__
    with open(os.path.join(out, case, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    module = mf.module_state(tag_dir)
    hf = load_file(os.path.join(ckpt, "model.safetensors"))
    assert sorted(hf) == sorted(module) and all(torch.equal(hf[k], module[k]) for k in hf), \
        "the Trainer's model.safetensors differs from the DeepSpeed module state dict"
    mf.write(module, os.path.join(out, case, "expected_module.safetensors"))
    mf.write(get_fp32_state_dict_from_zero_checkpoint(ckpt),
             os.path.join(out, case, "expected_fp32.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        ucp = os.path.join(tmp, "ucp")
        mf.ds_to_universal(tag_dir, ucp)
        mf.write(mf.ucp_values(ucp), os.path.join(out, case, "expected_ucp.safetensors"))


def first_error(p):
    lines = [l for l in (p.stdout + p.stderr).splitlines()
             if re.search(r"^(\[rank\d+\]: )?\w+(Error|Exception): ", l)]
    return re.sub(r"^\[rank\d+\]: ", "", lines[-1].strip()) if lines else f"exit {p.returncode}"


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    out = os.path.abspath(sys.argv[1])
    port = int(os.environ.get("FC_TORCHRUN_PORT", str(PORT)))
    errors_path = os.path.join(out, "errors.json")
    errors = json.load(open(errors_path)) if os.path.exists(errors_path) else {}
    errors.pop(f"{CASE}_dp2", None)
    # two processes: refused (see the docstring); the error is recorded, not a fixture
    tmp = tempfile.mkdtemp(prefix="fc-trainer-dp2-")
    try:
        p = mf.torchrun(2, port, [os.path.abspath(__file__), "--worker", tmp, CASE], mf.env())
        if p.returncode == 0:
            raise SystemExit("the Trainer ran DeepSpeed on 2 CPU processes: make it a fixture")
        errors[f"{CASE}_dp2"] = first_error(p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    d = os.path.join(out, CASE)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    p = mf.torchrun(1, port, [os.path.abspath(__file__), "--worker", out, CASE], mf.env(), d)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
        raise SystemExit(f"{CASE}: torchrun exited {p.returncode}: {first_error(p)}")
    expect(out, CASE)
    with open(errors_path, "w") as f:
        json.dump(errors, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps({k: v for k, v in errors.items() if k.startswith(CASE)}, indent=1))


if __name__ == "__main__":
    main()
