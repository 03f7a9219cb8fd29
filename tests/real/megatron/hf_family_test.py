"""fc-export --hf-family llama on the real Megatron-Core 0.16.1 saves (testdata/real/megatron),
checked by transformers 5 and Megatron-Core's own forward (suite `real`; run through
venv_run.py torch).

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
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402
sys.path.insert(0, HERE)
import megatron_oracle_test as oracle  # noqa: E402  (its forward worker, torchrun, INPUT, mf)

PORT = int(os.environ.get("FC_MEGATRON_PORT", "29710")) + 60
TOLERANCE = 1e-6
INPUT = oracle.INPUT  # the same tokens as real_megatron_hf
mf = oracle.mf


def megatron_logits(testdata, ckpt, per_layer, tmp, port):
    """Megatron-Core's TP 1 model loaded from `ckpt`: its logits on INPUT (one gloo process
    running megatron_oracle_test.forward_worker, with its CPU patches)."""
    out = os.path.join(tmp, f"logits_{port}.pt")
    oracle.torchrun(1, port, "--forward", testdata, ckpt, out, "1" if per_layer else "0")
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


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    import torch
    from transformers import LlamaForCausalLM
    torch.set_num_threads(1)
    m = mf(testdata)
    real = os.path.join(testdata, "real", "megatron")
    tools = os.path.join(build, "tools")
    tmp = tempfile.mkdtemp(prefix="fc-real-hf-family-")
    try:
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
            assert os.path.isfile(os.path.join(out, "config.json")), os.listdir(out)
            model, info = LlamaForCausalLM.from_pretrained(out, local_files_only=True,
                                                           dtype=torch.float32,
                                                           attn_implementation="eager",
                                                           output_loading_info=True)
            assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
            assert not info.get("mismatched_keys"), (name, info)
            model.eval()
            with torch.no_grad():
                got = model(input_ids=torch.tensor(INPUT)).logits
            assert got.shape == want.shape, (name, got.shape, want.shape)
            diff = (got - want).abs().max().item()
            print(f"{name}: LlamaForCausalLM loads fc-export --hf-family llama (no missing/"
                  f"unexpected keys); logits vs Megatron-Core's forward: max |d| {diff:.3g}",
                  flush=True)
            assert diff <= TOLERANCE, f"{name}: logits differ by {diff}"
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
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
