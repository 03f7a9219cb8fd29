"""transformers 5 end to end: a model trained one step under FSDP2 on 2 ranks and saved as a
torch DCP checkpoint, exported by fc-export, loaded back by transformers.

usage: hf_test.py BUILD_ROOT CASE          (run through venv_run.py torch)

CASE
  llama         LlamaForCausalLM (GQA: 4 query heads, 2 KV heads; 2 layers), saved under
                its own names
  qwen2_tied    Qwen2ForCausalLM (q/k/v biases, tie_word_embeddings)
  megatron_aoa  the Llama's weights under Megatron-Core names (query-group fused QKV,
                [gate; up] fc1, vocabulary padded 64 -> 72 rows), exported through an AOA
                program back to HF names

Each: `fc-export CKPT OUT --copy-from REF` (REF: the trained model's save_pretrained, for
config.json and generation_config.json) gives a directory that
from_pretrained(OUT, local_files_only=True) loads with no missing or unexpected keys,
whose weights equal REF's bit for bit and whose logits on a fixed input equal REF's bit for
bit (fp32, one thread). `--dtype bfloat16`: loaded in bfloat16, its weights and logits equal
those of REF loaded by from_pretrained(REF, dtype=torch.bfloat16) bit for bit: fc rounds
fp32 to bf16 as torch does (nearest even).
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402
sys.path.insert(0, os.path.join(os.environ.get("FC_TESTDATA", os.path.join(HERE, "..", "..", "..",
                                                                           "testdata")), "real"))
import torchrun  # noqa: E402  (testdata/real/torchrun.py: repeats a worker killed by a signal)

VOCAB, PADDED_VOCAB, HEADS, KV_HEADS, HEAD_DIM = 64, 72, 4, 2, 8
INPUT = torch.tensor([[1, 5, 9, 13, 17, 21, 33, 40], [2, 3, 63, 0, 7, 11, 50, 12]])


def config(case):
    from transformers import LlamaConfig, Qwen2Config
    common = dict(vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                  max_position_embeddings=64)
    if case == "qwen2_tied":
        return Qwen2Config(tie_word_embeddings=True, **common)
    return LlamaConfig(tie_word_embeddings=False, **common)


def model_class(case_or_model_type):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    return Qwen2ForCausalLM if case_or_model_type.startswith("qwen2") else LlamaForCausalLM


def megatron_names(full):
    """The HF Llama state dict under Megatron-Core GPT names and fused layouts."""
    g = torch.Generator().manual_seed(7)
    out = {}
    emb = full["model.embed_tokens.weight"]
    pad = torch.randn(PADDED_VOCAB - VOCAB, emb.shape[1], generator=g)
    out["embedding.word_embeddings.weight"] = torch.cat([emb, pad])
    out["output_layer.weight"] = torch.cat([full["lm_head.weight"], pad * 2])
    out["decoder.final_layernorm.weight"] = full["model.norm.weight"]
    per_group = HEADS // KV_HEADS
    for i in range(2):
        p = f"model.layers.{i}."
        m = f"decoder.layers.{i}."
        q = full[p + "self_attn.q_proj.weight"].reshape(HEADS, HEAD_DIM, -1)
        k = full[p + "self_attn.k_proj.weight"].reshape(KV_HEADS, HEAD_DIM, -1)
        v = full[p + "self_attn.v_proj.weight"].reshape(KV_HEADS, HEAD_DIM, -1)
        groups = [torch.cat([q[j * per_group:(j + 1) * per_group], k[j:j + 1], v[j:j + 1]])
                  for j in range(KV_HEADS)]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat(groups).reshape(
            (HEADS + 2 * KV_HEADS) * HEAD_DIM, -1)
        out[m + "self_attention.linear_qkv.layer_norm_weight"] = full[p + "input_layernorm.weight"]
        out[m + "self_attention.linear_proj.weight"] = full[p + "self_attn.o_proj.weight"]
        out[m + "mlp.linear_fc1.layer_norm_weight"] = full[p + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([full[p + "mlp.gate_proj.weight"],
                                                     full[p + "mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = full[p + "mlp.down_proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


AOA = f"""# Megatron-Core GPT names (this test's tiny Llama) -> HF Llama names
embedding.word_embeddings.weight -> model.embed_tokens.weight, embed_pad, axis=0, sizes='[{VOCAB},{PADDED_VOCAB - VOCAB}]'
embed_pad -> _
output_layer.weight -> lm_head.weight, lm_head_pad, axis=0, sizes='[{VOCAB},{PADDED_VOCAB - VOCAB}]'
lm_head_pad -> _
decoder.final_layernorm.weight -> model.norm.weight
decoder.layers.$LAYER_ID.self_attention.linear_qkv.layer_norm_weight -> model.layers.$LAYER_ID.input_layernorm.weight
decoder.layers.$LAYER_ID.self_attention.linear_qkv.weight -> model.layers.$LAYER_ID.self_attn.q_proj.weight, model.layers.$LAYER_ID.self_attn.k_proj.weight, model.layers.$LAYER_ID.self_attn.v_proj.weight, fused_qkv, num_heads={HEADS}, num_key_value_groups={KV_HEADS}, axis=0
decoder.layers.$LAYER_ID.self_attention.linear_proj.weight -> model.layers.$LAYER_ID.self_attn.o_proj.weight
decoder.layers.$LAYER_ID.mlp.linear_fc1.layer_norm_weight -> model.layers.$LAYER_ID.post_attention_layernorm.weight
decoder.layers.$LAYER_ID.mlp.linear_fc1.weight -> model.layers.$LAYER_ID.mlp.gate_proj.weight, model.layers.$LAYER_ID.mlp.up_proj.weight, axis=0
decoder.layers.$LAYER_ID.mlp.linear_fc2.weight -> model.layers.$LAYER_ID.mlp.down_proj.weight
"""


def worker(case, ckpt, ref):
    """torchrun rank: build, FSDP2-shard, train one step, save DCP; rank 0 saves REF."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor, Shard
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict)
    dist.init_process_group("gloo")
    torch.manual_seed(2024)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    kind = "llama" if case == "megatron_aoa" else case
    model = model_class(kind)(config(kind))
    model.config._attn_implementation = "eager"
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=INPUT, labels=INPUT).loss.backward()
    optim.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if case == "megatron_aoa":
        state = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in megatron_names(full).items()}
    else:
        state = get_model_state_dict(model)  # DTensors, each rank its Shard(0) piece
    dcp.save(state, checkpoint_id=ckpt)
    if dist.get_rank() == 0:
        plain = model_class(kind)(config(kind))
        missing, unexpected = plain.load_state_dict(full, strict=True)
        plain.save_pretrained(ref)
    dist.barrier()
    dist.destroy_process_group()


def load(path, dtype):
    with open(os.path.join(path, "config.json")) as f:
        cls = model_class(json.load(f)["model_type"])
    model, info = cls.from_pretrained(path, local_files_only=True, dtype=dtype,
                                      attn_implementation="eager", output_loading_info=True)
    model.eval()
    return model, info


def logits(model):
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8 if a.dtype != torch.bool else torch.bool),
        b.contiguous().view(torch.uint8 if b.dtype != torch.bool else torch.bool))


def main():
    if sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
        return
    build, case = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    export = os.path.join(build, "tools", "fc-export")
    with fcio.temp_dir("fc-real-hf-") as tmp:
        ckpt, ref = os.path.join(tmp, "ckpt"), os.path.join(tmp, "ref")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        torchrun.check_run(2, 29551, [os.path.abspath(__file__), "--worker", case, ckpt, ref],
                           env, [ckpt, ref])
        extra = []
        if case == "megatron_aoa":
            aoa = os.path.join(tmp, "megatron_to_hf.aoa")
            with open(aoa, "w") as f:
                f.write(AOA)
            extra = ["--aoa", aoa]
        ref_model, _ = load(ref, torch.float32)
        ref_sd = ref_model.state_dict()
        ref_logits = logits(ref_model)
        for dtype in (torch.float32, torch.bfloat16):
            out = os.path.join(tmp, f"out_{str(dtype)[6:]}")
            args = [export, ckpt, out, "--copy-from", ref, "-q"] + extra
            if dtype == torch.bfloat16:
                args += ["--dtype", "bfloat16"]
            fcio.run(args)
            for f in ("config.json", "generation_config.json"):
                assert os.path.isfile(os.path.join(out, f)), (f, os.listdir(out))
            model, info = load(out, dtype)
            assert not info["missing_keys"] and not info["unexpected_keys"], info
            assert not info.get("mismatched_keys"), info
            # bf16: REF loaded by transformers in bf16 (its fp32 weights rounded by torch).
            # Not REF.to(bf16), which also rounds the rotary inv_freq buffers that
            # from_pretrained keeps in fp32 (Qwen2's logits then differ by 1 bf16 ulp).
            want_model = ref_model if dtype == torch.float32 else load(ref, dtype)[0]
            sd = model.state_dict()
            for k, v in want_model.state_dict().items():
                assert bits_equal(sd[k], v), f"{case} {dtype}: {k} differs from the trained model's"
            got = logits(model)
            want = ref_logits if dtype == torch.float32 else logits(want_model)
            assert bits_equal(got, want), (
                f"{case} {dtype}: logits differ, max abs diff "
                f"{(got.float() - want.float()).abs().max().item()}")
            print(f"{case} {str(dtype)[6:]}: from_pretrained loads fc-export's output, no missing "
                  f"or unexpected keys; {len(sd)} weights and the logits {tuple(got.shape)} "
                  f"equal bit for bit", flush=True)
        if case == "qwen2_tied":
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


if __name__ == "__main__":
    main()
