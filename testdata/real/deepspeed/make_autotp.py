"""Writes DeepSpeed AutoTP (tensor parallel training, "tensor_parallel": {"autotp_size": 2})
checkpoints with the real DeepSpeed (0.19.8, CPU, gloo), each with what ds_to_universal
gives back from it as the expected values.

usage: python make_autotp.py OUT_DIR [CASE...]
  (the interop environment's python: ~/.cache/fc-interop/torch/bin/python)

The model: transformers' LlamaForCausalLM (vocabulary 64, hidden 16, 2 layers, 4 heads in 2
KV groups, FFN 24, untied lm_head), fp32, seeded. deepspeed.initialize with autotp_size 2
shards it as AutoTP does: q/k/v/gate/up column parallel, o/down row parallel, lm_head
vocabulary parallel (original_vocab_size 64), embeddings and norms replicated. Two AdamW steps
("torch_adam": true) on a fixed batch, then engine.save_checkpoint(OUT/<case>/ckpt, "step2").
DeepSpeed writes universal_checkpoint_info version 0.4 with the category patterns and, beside
them, an `affine_map` (where each rank's block of every param lies in the full tensor).

Cases (torch.distributed.run, DS_ACCELERATOR=cpu):
  autotp_tp2        2 processes: TP 2, DP 1, ZeRO-1, fp32
  autotp_tp2_dp2    4 processes: TP 2 x DP 2, ZeRO-2, fp32 (the flat partitions cut the TP
                    blocks)
  autotp_tp2_bf16   2 processes: TP 2, ZeRO-1, bf16 (fp32 masters, bf16 module weights)

OUT/<case>/ckpt                    the save dir (latest, step2/), zero_to_*.py removed
OUT/<case>/expected_ucp.safetensors  `python -m deepspeed.checkpoint.ds_to_universal` of it:
                                   every zero/<param>/<state>.pt value as "<param>/<state>"
                                   (fp32, exp_avg, exp_avg_sq, step)
OUT/<case>/expected_ucp_keys.json  the keys of each of those .pt dicts ({"<param>/fp32":
                                   ["param", "vocab_tensor"], ...}): which ones DeepSpeed writes
                                   next to the value
OUT/<case>/info.json               layout and versions
"""
import glob
import json
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  (torchrun, env, ds_to_universal, write)

# case: (processes, zero stage, dtype)
CASES = {
    "autotp_tp2": (2, 1, "fp32"),
    "autotp_tp2_dp2": (4, 2, "fp32"),
    "autotp_tp2_bf16": (2, 1, "bf16"),
}
TP = 2


def worker(out, case):
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM
    nproc, stage, dtype = CASES[case]
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float()
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "tensor_parallel": {"autotp_size": TP},
          "zero_optimization": {"stage": stage},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "steps_per_print": 1000}
    if dtype == "bf16":
        ds["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds)
    ids = (torch.arange(8).reshape(1, 8) * 7) % 64
    for _ in range(2):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(os.path.join(out, case, "ckpt"), tag="step2")


def ucp_keys(ucp):
    return {key: sorted(v) if isinstance(v, dict) else None for key, v in mf.ucp_loaded(ucp)}


def expect(out, case):
    ckpt = os.path.join(out, case, "ckpt")
    for f in glob.glob(os.path.join(ckpt, "zero_to_*.py")):
        os.remove(f)
    tag_dir = os.path.join(ckpt, "step2")
    ucp = tempfile.mkdtemp(prefix="fc-autotp-ucp-")
    try:
        mf.ds_to_universal(tag_dir, ucp)
        mf.write(mf.ucp_values(ucp), os.path.join(out, case, "expected_ucp.safetensors"))
        with open(os.path.join(out, case, "expected_ucp_keys.json"), "w") as f:
            json.dump(ucp_keys(ucp), f, indent=1, sort_keys=True)
            f.write("\n")
    finally:
        shutil.rmtree(ucp, ignore_errors=True)
    sd = torch.load(os.path.join(tag_dir, "mp_rank_00_model_states.pt"), map_location="cpu",
                    weights_only=False)
    uci = sd["universal_checkpoint_info"]
    import deepspeed
    import transformers
    nproc, stage, dtype = CASES[case]
    info = {"tp": TP, "dp": nproc // TP, "zero_stage": stage, "dtype": dtype,
            "ds_version": sd["ds_version"], "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "universal_checkpoint_version": uci.get("universal_checkpoint_version"),
            "affine_map_params": len(uci.get("affine_map", {}).get("params", {}))}
    assert info["affine_map_params"] > 0, f"{case}: DeepSpeed wrote no affine_map"
    with open(os.path.join(out, case, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    out = os.path.abspath(sys.argv[1])
    cases = sys.argv[2:] or list(CASES)
    port = int(os.environ.get("FC_TORCHRUN_PORT", "29681"))
    for case in cases:
        print(f"{case} ...", flush=True)
        shutil.rmtree(os.path.join(out, case), ignore_errors=True)
        os.makedirs(os.path.join(out, case))
        p = mf.torchrun(CASES[case][0], port, [os.path.abspath(__file__), "--worker", out, case],
                        mf.env(), os.path.join(out, case))
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
            raise SystemExit(f"{case}: torchrun exited {p.returncode}")
        expect(out, case)


if __name__ == "__main__":
    main()
