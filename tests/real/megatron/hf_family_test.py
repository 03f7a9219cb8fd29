"""fc-export --hf-family llama, qwen2 and gpt2 on the real Megatron-Core 0.16.1 saves
(testdata/real/megatron), checked by transformers 5 and Megatron-Core's own forward (suite
`real`; run through venv_run.py torch).

usage: hf_family_test.py BUILD_ROOT TESTDATA_DIR

For each form of the same kind of model (torch_dist layer-stacked keys: gpt_tp2_pp2; torch_dist
per-layer keys: gpt_tp2_pp2_layers; Megatron-LM legacy per-rank files: gpt_tp2_vpp2/legacy),
`fc-export CKPT OUT --hf-family llama --copy-from REF` (REF: a LlamaConfig written by
save_pretrained, no AOA program written by hand) gives a directory that
LlamaForCausalLM.from_pretrained loads with no missing, unexpected or mismatched keys, whose
fp32 logits equal the forward of Megatron-Core's TP 1 model loaded from the torch_dist save
within 1e-6 (megatron_oracle_test.py LOGITS_NOTE: silu on a strided view). The legacy save
holds the training state of gpt_tp2_vpp2/ckpt, whose forward is its reference. Then a
config.json that disagrees with the source (heads, layers, vocabulary) is exit 3 naming both
values, and `fc-inspect --hf-family llama --print-aoa` prints the program fc-export used.

qwen2: the TP 2 save of a GPTModel with add_qkv_bias=True and the output layer tied to the
embedding (qwen2_tp2; its QKV biases drawn, not Megatron's zeros), exported with
`--hf-family qwen2` against a Qwen2Config: Qwen2ForCausalLM loads it with no missing,
unexpected or mismatched keys (q/k/v_proj.bias included) and its fp32 logits equal the forward
of Megatron-Core's TP 1 model loaded from the save within 1e-6. The llama family refuses that
save (its bias against attention_bias false) and qwen2 refuses the bias-less Llama save, each
exit 3.

fc-convert --hf-family qwen2 --preset hf-llama --tp 2 --output-format torch-dcp of the same
save: torch.distributed.checkpoint reads the DCP (dcp_to_torch_save), Qwen2ForCausalLM
load_state_dict takes it with no unexpected key and no missing one but the tied lm_head, and
its logits equal Megatron's forward within 1e-6.

gpt2: the TP 2 save of a GPTModel with learned absolute positions, LayerNorm, biases on every
linear (drawn), GeLU and a tied output layer (gpt2_tp2), exported with `--hf-family gpt2`
against a GPT2Config (activation_function "gelu": Megatron's default GeLU is the exact one):
GPT2LMHeadModel loads it with no missing, unexpected or mismatched keys (c_attn: [q; k; v]
reordered from Megatron's per-head QKV, Conv1D weights transposed) and its fp32 logits equal
Megatron's forward within 1e-6; with GPT2Config's default activation_function (gelu_new) the
export is exit 3 naming it.

mixtral: the TP 2 save of a 2-layer GPTModel whose MLPs are MoE layers (4 SwiGLU experts,
SequentialMLP, top-2; mixtral_tp2), exported with `--hf-family mixtral` against a
MixtralConfig: MixtralForCausalLM loads it with no missing, unexpected or mismatched keys and
its fp32 logits equal Megatron's forward within 1e-6; a num_local_experts that disagrees is
exit 3 (num_experts_per_tok is checked against args.moe_router_topk, which this save, like
every torch_dist save without Megatron-LM's args, does not hold).

qwen2-moe: the TP 2 save of a 2-layer GPTModel with QKV bias and MoE MLPs (4 SwiGLU experts,
top-2 of the softmax over all experts: moe_router_pre_softmax) plus a shared expert with a
sigmoid gate (qwen2_moe_tp2), exported with `--hf-family qwen2-moe` against a Qwen2MoeConfig
(norm_topk_prob false): Qwen2MoeForCausalLM loads it with no missing, unexpected or
mismatched keys and its fp32 logits equal Megatron's forward within 1e-6.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402
sys.path.insert(0, HERE)
import megatron_oracle_test as oracle  # noqa: E402  (its forward worker, torchrun, INPUT, mf)

PORT = int(os.environ.get("FC_MEGATRON_PORT", "29710")) + 60
TOLERANCE = 1e-6
INPUT = oracle.INPUT  # the same tokens as real_megatron_hf
mf = oracle.mf


def megatron_logits(testdata, ckpt, per_layer, tmp, port, arch="llama"):
    """Megatron-Core's TP 1 model loaded from `ckpt`: its logits on INPUT (one gloo process
    running megatron_oracle_test.forward_worker, with its CPU patches)."""
    out = os.path.join(tmp, f"logits_{port}.pt")
    oracle.torchrun(1, port, "--forward", testdata, ckpt, out, "1" if per_layer else "0", arch)
    import torch
    return torch.load(out)


def write_config(m, path, **override):
    from transformers import LlamaConfig
    M = m.MODEL
    fields = dict(vocab_size=M["vocab_size"], hidden_size=M["hidden_size"],
                  intermediate_size=M["ffn_hidden_size"], num_hidden_layers=M["num_layers"],
                  num_attention_heads=M["num_attention_heads"],
                  num_key_value_heads=M["num_query_groups"],
                  head_dim=M["hidden_size"] // M["num_attention_heads"],
                  max_position_embeddings=M["seq_len"], rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                  hidden_act="silu")
    fields.update(override)
    LlamaConfig(**fields).save_pretrained(path)


def load_and_compare(cls, out, want, name, family):
    """cls.from_pretrained(out): no missing/unexpected/mismatched keys; fp32 logits on INPUT
    within TOLERANCE of `want`. Returns the model."""
    import torch
    assert os.path.isfile(os.path.join(out, "config.json")), os.listdir(out)
    model, info = cls.from_pretrained(out, local_files_only=True, dtype=torch.float32,
                                      attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
    assert not info.get("mismatched_keys"), (name, info)
    model.eval()
    with torch.no_grad():
        got = model(input_ids=torch.tensor(INPUT)).logits
    assert got.shape == want.shape, (name, got.shape, want.shape)
    diff = (got - want).abs().max().item()
    print(f"{name}: {cls.__name__} loads fc-export --hf-family {family} (no missing/"
          f"unexpected keys); logits vs Megatron-Core's forward: max |d| {diff:.3g}",
          flush=True)
    assert diff <= TOLERANCE, f"{name}: logits differ by {diff}"
    return model


def qwen2_case(m, testdata, real, tools, tmp, port):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    M = m.MODEL
    ref = os.path.join(tmp, "ref_qwen2")
    Qwen2Config(vocab_size=M["vocab_size"], hidden_size=M["hidden_size"],
                intermediate_size=M["ffn_hidden_size"], num_hidden_layers=M["num_layers"],
                num_attention_heads=M["num_attention_heads"],
                num_key_value_heads=M["num_query_groups"],
                max_position_embeddings=M["seq_len"], rms_norm_eps=1e-5, rope_theta=10000.0,
                tie_word_embeddings=True, hidden_act="silu").save_pretrained(ref)
    ckpt = os.path.join(real, "qwen2_tp2", "ckpt")
    want = megatron_logits(testdata, ckpt, False, tmp, port, arch="qwen2")
    out = os.path.join(tmp, "hf_qwen2")
    fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--hf-family", "qwen2",
              "--copy-from", ref, "-q"])
    model = load_and_compare(Qwen2ForCausalLM, out, want, "qwen2 (torch_dist TP 2, QKV bias, "
                             "tied)", "qwen2")
    # the biases are Megatron's saved values (drawn, not zero): a wrong split changes logits
    bias = model.model.layers[0].self_attn.k_proj.bias
    assert bias.abs().min().item() > 0, bias
    # fc-convert to HF names in torch DCP at TP 2: torch reads it into the same model
    dcp = os.path.join(tmp, "dcp_qwen2")
    fcio.run([os.path.join(tools, "fc-convert"), ckpt, dcp, "--hf-family", "qwen2",
              "--copy-from", ref, "--preset", "hf-llama", "--tp", "2", "--output-format",
              "torch-dcp", "-q"])
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    saved = os.path.join(tmp, "dcp_qwen2.pt")
    dcp_to_torch_save(dcp, saved)
    sd = torch.load(saved)
    fresh = Qwen2ForCausalLM(Qwen2Config.from_pretrained(dcp)).float().eval()
    missing, unexpected = fresh.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        got = fresh(input_ids=torch.tensor(INPUT)).logits
    diff = (got - want).abs().max().item()
    print(f"qwen2: fc-convert --hf-family qwen2 torch DCP (TP 2) read by torch into "
          f"Qwen2ForCausalLM; logits vs Megatron-Core's forward: max |d| {diff:.3g}", flush=True)
    assert diff <= TOLERANCE, f"qwen2 fc-convert: logits differ by {diff}"
    # each family refuses the other's save: exit 3 naming the bias
    llama_ref = os.path.join(tmp, "ref")
    for src, family, cfg, words in [
            ("qwen2_tp2/ckpt", "llama", llama_ref, ["has linear_qkv.bias", "attention_bias is false"]),
            ("gpt_tp2_pp2/ckpt", "qwen2", ref, ["no linear_qkv.bias"])]:
        r = subprocess.run([os.path.join(tools, "fc-export"), os.path.join(real, src),
                            os.path.join(tmp, "never"), "--hf-family", family, "--copy-from",
                            cfg], capture_output=True, text=True)
        assert r.returncode == 3, (src, family, r.returncode, r.stderr)
        for w in words:
            assert w in r.stderr, (src, family, w, r.stderr)
    print("--hf-family llama on the QKV-bias save and qwen2 on the bias-less save: exit 3",
          flush=True)


def gpt2_case(m, testdata, real, tools, tmp, port):
    from transformers import GPT2Config, GPT2LMHeadModel
    M = m.MODEL
    fields = dict(vocab_size=M["vocab_size"], n_embd=M["hidden_size"], n_layer=M["num_layers"],
                  n_head=M["num_attention_heads"],
                  n_inner=m.ARCHS["gpt2"]["config"]["ffn_hidden_size"],
                  n_positions=M["seq_len"], layer_norm_epsilon=1e-5, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    ref = os.path.join(tmp, "ref_gpt2")
    GPT2Config(activation_function="gelu", **fields).save_pretrained(ref)
    ckpt = os.path.join(real, "gpt2_tp2", "ckpt")
    want = megatron_logits(testdata, ckpt, False, tmp, port, arch="gpt2")
    out = os.path.join(tmp, "hf_gpt2")
    fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--hf-family", "gpt2",
              "--copy-from", ref, "-q"])
    model = load_and_compare(GPT2LMHeadModel, out, want, "gpt2 (torch_dist TP 2, learned "
                             "positions, LayerNorm, biases, tied)", "gpt2")
    assert model.transformer.h[0].attn.c_attn.bias.abs().min().item() > 0
    # GPT2Config's default activation_function is gelu_new (tanh): not the source's GeLU
    tanh = os.path.join(tmp, "ref_gpt2_tanh")
    GPT2Config(**fields).save_pretrained(tanh)
    r = subprocess.run([os.path.join(tools, "fc-export"), ckpt, os.path.join(tmp, "never"),
                        "--hf-family", "gpt2", "--copy-from", tanh], capture_output=True,
                       text=True)
    assert r.returncode == 3 and "activation_function is 'gelu_new'" in r.stderr, r.stderr
    print("gpt2 with activation_function gelu_new (GPT2Config's default): exit 3", flush=True)


def mixtral_case(m, testdata, real, tools, tmp, port):
    from transformers import MixtralConfig, MixtralForCausalLM
    M, A = m.MODEL, m.ARCHS["mixtral"]["config"]
    fields = dict(vocab_size=M["vocab_size"], hidden_size=M["hidden_size"],
                  intermediate_size=A["moe_ffn_hidden_size"], num_hidden_layers=A["num_layers"],
                  num_attention_heads=M["num_attention_heads"],
                  num_key_value_heads=M["num_query_groups"],
                  head_dim=M["hidden_size"] // M["num_attention_heads"],
                  num_local_experts=A["num_moe_experts"],
                  num_experts_per_tok=A["moe_router_topk"], max_position_embeddings=M["seq_len"],
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                  router_jitter_noise=0.0, hidden_act="silu")
    ref = os.path.join(tmp, "ref_mixtral")
    MixtralConfig(**fields).save_pretrained(ref)
    ckpt = os.path.join(real, "mixtral_tp2", "ckpt")
    want = megatron_logits(testdata, ckpt, False, tmp, port, arch="mixtral")
    out = os.path.join(tmp, "hf_mixtral")
    fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--hf-family", "mixtral",
              "--copy-from", ref, "-q"])
    load_and_compare(MixtralForCausalLM, out, want, "mixtral (torch_dist TP 2, 4 experts, "
                     "top-2)", "mixtral")
    bad = os.path.join(tmp, "ref_mixtral_bad")
    MixtralConfig(**dict(fields, num_local_experts=8)).save_pretrained(bad)
    r = subprocess.run([os.path.join(tools, "fc-export"), ckpt, os.path.join(tmp, "never"),
                        "--hf-family", "mixtral", "--copy-from", bad], capture_output=True,
                       text=True)
    assert r.returncode == 3, (r.returncode, r.stderr)
    for w in ("num_local_experts 8", "[4, 16]"):
        assert w in r.stderr, (w, r.stderr)
    print("mixtral with num_local_experts 8 against 4 experts: exit 3", flush=True)


def qwen2_moe_case(m, testdata, real, tools, tmp, port):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    M, A = m.MODEL, m.ARCHS["qwen2_moe"]["config"]
    ref = os.path.join(tmp, "ref_qwen2_moe")
    Qwen2MoeConfig(vocab_size=M["vocab_size"], hidden_size=M["hidden_size"],
                   intermediate_size=M["ffn_hidden_size"], num_hidden_layers=A["num_layers"],
                   num_attention_heads=M["num_attention_heads"],
                   num_key_value_heads=M["num_query_groups"], num_experts=A["num_moe_experts"],
                   num_experts_per_tok=A["moe_router_topk"],
                   moe_intermediate_size=A["moe_ffn_hidden_size"],
                   shared_expert_intermediate_size=A["moe_shared_expert_intermediate_size"],
                   norm_topk_prob=False, max_position_embeddings=M["seq_len"], rms_norm_eps=1e-5,
                   rope_theta=10000.0, tie_word_embeddings=False,
                   hidden_act="silu").save_pretrained(ref)
    ckpt = os.path.join(real, "qwen2_moe_tp2", "ckpt")
    want = megatron_logits(testdata, ckpt, False, tmp, port, arch="qwen2_moe")
    out = os.path.join(tmp, "hf_qwen2_moe")
    fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--hf-family", "qwen2-moe",
              "--copy-from", ref, "-q"])
    load_and_compare(Qwen2MoeForCausalLM, out, want, "qwen2-moe (torch_dist TP 2, QKV bias, "
                     "4 experts, top-2, shared expert)", "qwen2-moe")


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    import torch
    from transformers import LlamaForCausalLM
    torch.set_num_threads(1)
    m = mf(testdata)
    real = os.path.join(testdata, "real", "megatron")
    tools = os.path.join(build, "tools")
    with fcio.temp_dir("fc-real-hf-family-") as tmp:
        ref = os.path.join(tmp, "ref")
        write_config(m, ref)
        cases = [("torch_dist stacked", "gpt_tp2_pp2/ckpt", "gpt_tp2_pp2/ckpt", False),
                 ("torch_dist per-layer", "gpt_tp2_pp2_layers/ckpt", "gpt_tp2_pp2_layers/ckpt", True),
                 ("legacy", "gpt_tp2_vpp2/legacy", "gpt_tp2_vpp2/ckpt", False)]
        port = PORT
        for name, src, twin, per_layer in cases:
            ckpt = os.path.join(real, src)
            want = megatron_logits(testdata, os.path.join(real, twin), per_layer, tmp, port)
            port += 1
            out = os.path.join(tmp, "hf_" + str(port))
            fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--hf-family", "llama",
                      "--copy-from", ref, "-q"])
            load_and_compare(LlamaForCausalLM, out, want, name, "llama")
            printed = subprocess.run([os.path.join(tools, "fc-inspect"), ckpt, "--hf-family",
                                      "llama", "--copy-from", ref, "--print-aoa"],
                                     capture_output=True, text=True, check=True).stdout
            assert "fused_qkv, num_heads=8, num_key_value_groups=4" in printed, printed
        # config.json against the source's facts: exit 3 naming both values
        M = m.MODEL
        for override, words in [
                (dict(num_attention_heads=4, head_dim=4, num_key_value_heads=4),
                 ["num_attention_heads", " 4"]),
                (dict(num_hidden_layers=6), ["4 layers", "num_hidden_layers is 6"]),
                (dict(vocab_size=80), ["vocab_size 80", "vocabulary 64"])]:
            bad = os.path.join(tmp, "bad_" + "_".join(override))
            write_config(m, bad, **override)
            for src in ("gpt_tp2_pp2/ckpt", "gpt_tp2_vpp2/legacy"):
                r = subprocess.run([os.path.join(tools, "fc-export"), os.path.join(real, src),
                                    os.path.join(tmp, "never"), "--hf-family", "llama",
                                    "--copy-from", bad], capture_output=True, text=True)
                assert r.returncode == 3, (src, override, r.returncode, r.stderr)
                for w in words:
                    assert w in r.stderr, (src, override, w, r.stderr)
                assert not os.path.exists(os.path.join(tmp, "never"))
        print(f"mismatching config.json (heads, layers, vocabulary; {M['num_attention_heads']} "
              f"heads, {M['num_layers']} layers, {M['vocab_size']} rows in the source): exit 3 "
              "naming both values", flush=True)
        qwen2_case(m, testdata, real, tools, tmp, port + 1)
        gpt2_case(m, testdata, real, tools, tmp, port + 2)
        mixtral_case(m, testdata, real, tools, tmp, port + 3)
        qwen2_moe_case(m, testdata, real, tools, tmp, port + 4)


if __name__ == "__main__":
    main()
