"""fc-convert --from-hf-family NAME (HuggingFace -> Megatron-Core GPT) on the real Megatron-Core
saves (testdata/real/megatron), numpy only: the round trip Megatron --(fc-export --hf-family
NAME --copy-from DIR)--> HF --(fc-convert HF OUT --from-hf-family NAME --target-like the
original --output-format torch-dcp)--> Megatron gives back every model tensor bit for bit
(fc-export of both compared), for per-layer keys with Transformer Engine norm names
(gpt_tp2_pp2_layers), layer-stacked keys (gpt_tp2_pp2), Qwen2's QKV bias with a tied
output layer (qwen2_tp2), GPT-2's learned positions, LayerNorm and linear biases and
[q; k; v] c_attn (gpt2_tp2), Mixtral's router and experts (mixtral_tp2) and Qwen2-MoE's
experts with the gated shared expert (qwen2_moe_tp2); OUT holds the target's metadata.json and
common.pt. A config.json that disagrees with the HF tensors or with the target (layer count,
QKV shape, tied output) is exit 3 naming both values, with no OUT; --from-hf-family with
--hf-family, with --output-format ucp, or an unknown family is exit 2.

usage: hf_family_reverse_test.py BUILD_ROOT TESTDATA_DIR
"""
import filecmp
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fcio  # noqa: E402
from hf_family_convert_test import (GPT2, LLAMA, MIXTRAL, QWEN2, QWEN2_MOE,  # noqa: E402
                                    write_config)


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    convert, export = os.path.join(tools, "fc-convert"), os.path.join(tools, "fc-export")
    real = os.path.join(testdata, "real", "megatron")
    tmp = tempfile.mkdtemp(prefix="fc-hf-family-reverse-")
    try:
        cases = [("llama", LLAMA, "gpt_tp2_pp2_layers/ckpt", 27),
                 ("llama", LLAMA, "gpt_tp2_pp2/ckpt", 9),
                 ("qwen2", QWEN2, "qwen2_tp2/ckpt", 9),
                 ("gpt2", GPT2, "gpt2_tp2/ckpt", 16),
                 ("mixtral", MIXTRAL, "mixtral_tp2/ckpt", 10),
                 ("qwen2-moe", QWEN2_MOE, "qwen2_moe_tp2/ckpt", 14)]
        for family, fields, src, count in cases:
            tag = src.replace("/", "_")
            ref = write_config(os.path.join(tmp, "ref_" + family.replace("-", "_")), fields)
            ckpt = os.path.join(real, src)
            hf = os.path.join(tmp, "hf_" + tag)
            fcio.run([export, ckpt, hf, "--hf-family", family, "--copy-from", ref, "-q"])
            out = os.path.join(tmp, "mg_" + tag)
            # (gpt_tp2_pp2 also holds Adam states: the HF weights have none to give them)
            fcio.run([convert, hf, out, "--from-hf-family", family, "--target-like", ckpt,
                      "--output-format", "torch-dcp", "--exclude", "optimizer.*", "-q"])
            for sidecar in ("metadata.json", "common.pt"):
                assert filecmp.cmp(os.path.join(out, sidecar), os.path.join(ckpt, sidecar),
                                   shallow=False), (src, sidecar)
            want_dir, got_dir = os.path.join(tmp, "want_" + tag), os.path.join(tmp, "got_" + tag)
            fcio.run([export, ckpt, want_dir, "--exclude", "optimizer.*", "-q"])
            fcio.run([export, out, got_dir, "-q"])
            want, _ = fcio.read_hf_dir(want_dir)
            got, _ = fcio.read_hf_dir(got_dir)
            assert len(want) == count, (src, sorted(want))
            assert sorted(got) == sorted(want), (src, sorted(got), sorted(want))
            fcio.same_tensors(got, want, f"{family} {src} round trip")
            print(f"{family} {src}: HF -> fc-convert --from-hf-family {family} gives back the "
                  f"{count} model tensors bit for bit; metadata.json, common.pt copied", flush=True)

        hf = os.path.join(tmp, "hf_gpt_tp2_pp2_layers_ckpt")
        ckpt = os.path.join(real, "gpt_tp2_pp2_layers", "ckpt")
        never = os.path.join(tmp, "never")
        # config.json against the HF tensors: exit 3 naming both values
        shutil.copytree(hf, os.path.join(tmp, "hf_bad"))
        write_config(os.path.join(tmp, "hf_bad"), dict(LLAMA, num_key_value_heads=2))
        p = fcio.run([convert, os.path.join(tmp, "hf_bad"), never, "--from-hf-family", "llama",
                      "--target-like", ckpt, "--output-format", "torch-dcp"], expect=3)
        assert "k_proj.weight is [8, 16]" in p.stderr and "num_key_value_heads 2" in p.stderr \
            and "[4, 16]" in p.stderr, p.stderr
        assert not os.path.exists(never)
        # config.json against the target (--target-like): exit 3 naming both values
        for hf_src, like, words in [
                # 4 layers (LLAMA) into a 2-layer save
                ("hf_gpt_tp2_pp2_ckpt", "mixtral_tp2",
                 ["the target (--target-like) has 2 layers", "num_hidden_layers is 4"]),
                # Qwen2's 8 heads in 4 groups into GPT-2's 8 heads with a K/V head each
                ("hf_qwen2_tp2_ckpt", "gpt2_tp2",
                 ["decoder.layers.self_attention.linear_qkv.weight is [4, 48, 16]",
                  "num_attention_heads 8, num_key_value_heads 4", "gives [4, 32, 16]"]),
                # an untied output layer into GPT-2's tied save
                ("hf_gpt_tp2_pp2_ckpt", "gpt2_tp2",
                 ["no output_layer.weight", "tie_word_embeddings false"])]:
            family = "qwen2" if "qwen2" in hf_src else "llama"
            p = fcio.run([convert, os.path.join(tmp, hf_src), never, "--from-hf-family", family,
                          "--target-like", os.path.join(real, like, "ckpt"),
                          "--output-format", "torch-dcp", "--exclude", "optimizer.*"], expect=3)
            for w in words:
                assert w in p.stderr, (hf_src, like, w, p.stderr)
            assert not os.path.exists(never)
        for args, words in [
                (["--hf-family", "llama", "--copy-from", hf, "--target-like", ckpt],
                 "exclude each other"),
                (["--output-format", "ucp"], "--from-hf-family applies to --output-format fc"),
                (["--target-like", ckpt, "--from-hf-family", "deepseek"],
                 "deepseek"),
        ]:
            fam = [] if "deepseek" in args else ["--from-hf-family", "llama"]
            p = fcio.run([convert, hf, never, *fam, *args], expect=2)
            assert words in p.stderr, (args, p.stderr)
            assert not os.path.exists(never)
        print("fc-convert --from-hf-family: config.json mismatch with the HF tensors or the "
              "target (layers, QKV shape, tied output) exit 3; with --hf-family, "
              "--output-format ucp, an unknown family: exit 2", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
