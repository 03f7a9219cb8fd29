"""fc-convert --hf-family NAME --copy-from DIR on the real Megatron-Core saves
(testdata/real/megatron), numpy only: the converted output holds, under HF names, exactly the
tensors fc-export --hf-family writes (bit for bit), for fc distcp and torch DCP output at
another TP degree (--preset hf-llama); DIR's config.json is copied into OUT and Megatron's
metadata.json / common.pt and the save's non-tensor objects are not (they describe a
Megatron save); a config.json that
disagrees with the source is exit 3 naming both values, in --dry-run too, with no OUT; and
the flag is refused (exit 2) with --aoa, without --copy-from, and with --output-format ucp.
transformers on the converted output: tests/real/megatron/hf_family_test.py.

usage: hf_family_convert_test.py BUILD_ROOT TESTDATA_DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fcio  # noqa: E402

# The committed saves' model (testdata/real/megatron/make_fixtures.py MODEL)
LLAMA = dict(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=16,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=2,
             tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
             rms_norm_eps=1e-5, hidden_act="silu", max_position_embeddings=16)
QWEN2 = dict(LLAMA, model_type="qwen2", tie_word_embeddings=True)
del QWEN2["attention_bias"], QWEN2["mlp_bias"], QWEN2["head_dim"]
# GPT2Config.save_pretrained's names; tie_word_embeddings left out (GPT-2's default: tied)
MIXTRAL = dict(LLAMA, model_type="mixtral", num_hidden_layers=2, intermediate_size=8,
               num_local_experts=4, num_experts_per_tok=2)
del MIXTRAL["attention_bias"], MIXTRAL["mlp_bias"]
QWEN2_MOE = dict(QWEN2, model_type="qwen2_moe", num_hidden_layers=2, tie_word_embeddings=False,
                 num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                 shared_expert_intermediate_size=16, norm_topk_prob=False)
GPT2 = dict(model_type="gpt2", vocab_size=64, n_embd=16, n_layer=4, n_head=8, n_inner=32,
            n_positions=16, activation_function="gelu", layer_norm_epsilon=1e-5)


def write_config(path, fields):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(fields, f, indent=1)
    return path


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    convert, export = os.path.join(tools, "fc-convert"), os.path.join(tools, "fc-export")
    real = os.path.join(testdata, "real", "megatron")
    with fcio.temp_dir("fc-hf-family-convert-") as tmp:
        # (the hf-llama preset has no rule for GPT-2's names or the MoE families': their
        # target is the layout of the fc-export output, every tensor whole, --target-like)
        cases = [("llama", LLAMA, "gpt_tp2_pp2/ckpt", 39, "2"),
                 ("llama", LLAMA, "gpt_tp2_vpp2/legacy", 39, "2"),
                 ("qwen2", QWEN2, "qwen2_tp2/ckpt", 50, "2"),
                 ("gpt2", GPT2, "gpt2_tp2/ckpt", 4 + 4 * 12, None),
                 ("mixtral", MIXTRAL, "mixtral_tp2/ckpt", 3 + 2 * (6 + 1 + 4 * 3), None),
                 ("qwen2-moe", QWEN2_MOE, "qwen2_moe_tp2/ckpt",
                  3 + 2 * (9 + 1 + 4 * 3 + 4), None)]
        for family, fields, src, count, dcp_tp in cases:
            ref = write_config(os.path.join(tmp, "ref_" + family.replace("-", "_")), fields)
            ckpt = os.path.join(real, src)
            label = f"{family} {src}"
            want_dir = os.path.join(tmp, "export_" + src.replace("/", "_"))
            fcio.run([export, ckpt, want_dir, "--hf-family", family, "--copy-from", ref, "-q"])
            want, _ = fcio.read_hf_dir(want_dir)
            assert len(want) == count, (label, sorted(want))
            for fmt, tp in (("fc", "1"), ("torch-dcp", dcp_tp)):
                out = os.path.join(tmp, f"convert_{fmt}_" + src.replace("/", "_"))
                target = (["--preset", "hf-llama", "--tp", tp] if dcp_tp
                          else ["--target-like", want_dir])
                fcio.run([convert, ckpt, out, "--hf-family", family, "--copy-from", ref,
                          *target, "--output-format", fmt, "-q"])
                with open(os.path.join(out, "config.json"), "rb") as a, \
                        open(os.path.join(ref, "config.json"), "rb") as b:
                    assert a.read() == b.read(), (label, fmt)
                for sidecar in ("metadata.json", "common.pt"):
                    assert not os.path.exists(os.path.join(out, sidecar)), (label, fmt, sidecar)
                # Megatron's non-tensor objects (_extra_state, ...) stay behind
                info = json.loads(fcio.run([os.path.join(tools, "fc-inspect"), "--json",
                                            out]).stdout)
                assert not info.get("objects"), (label, fmt, info.get("objects"))
                back = os.path.join(out + "_export")
                fcio.run([export, out, back, "-q"])
                got, _ = fcio.read_hf_dir(back)
                fcio.same_tensors(got, want, f"{label} fc-convert --output-format {fmt} --tp {tp}")
            layouts = f"fc TP 1, torch-dcp TP {dcp_tp}" if dcp_tp else "fc, torch-dcp"
            print(f"{label}: fc-convert --hf-family {family} ({layouts}) holds the "
                  f"{count} tensors fc-export --hf-family writes, bit for bit; config.json copied",
                  flush=True)

        # Pre-Core Megatron names (megatron/legacy/model, Megatron-DeepSpeed): the real saves'
        # tensors renamed as the legacy GPTModel names them (an AOA program through fc-export,
        # per-layer keys as the legacy model has; input_norm and final_norm are the 2023
        # spellings, input_layernorm and final_layernorm the older), then --hf-family reads
        # them: the same HF tensors as from the Megatron-Core names, bit for bit
        inspect = os.path.join(tools, "fc-inspect")
        for family, fields, src, spellings in [
                ("llama", LLAMA, "gpt_tp2_pp2_layers/ckpt", ("input_norm", "final_norm")),
                ("gpt2", GPT2, "gpt2_tp2/ckpt", ("input_layernorm", "final_layernorm"))]:
            ckpt = os.path.join(real, src)
            ref = os.path.join(tmp, "ref_" + family)
            in_norm, final = spellings
            top = {"embedding.word_embeddings.weight":
                   "language_model.embedding.word_embeddings.weight",
                   "embedding.position_embeddings.weight":
                   "language_model.embedding.position_embeddings.weight",
                   "output_layer.weight": "language_model.output_layer.weight",
                   "decoder.final_layernorm.weight": f"language_model.encoder.{final}.weight",
                   "decoder.final_layernorm.bias": f"language_model.encoder.{final}.bias"}
            per_layer = {"self_attention.linear_qkv.layer_norm_weight": f"{in_norm}.weight",
                         "self_attention.linear_qkv.layer_norm_bias": f"{in_norm}.bias",
                         "self_attention.linear_qkv.weight": "self_attention.query_key_value.weight",
                         "self_attention.linear_qkv.bias": "self_attention.query_key_value.bias",
                         "self_attention.linear_proj.weight": "self_attention.dense.weight",
                         "self_attention.linear_proj.bias": "self_attention.dense.bias",
                         "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
                         "mlp.linear_fc1.layer_norm_bias": "post_attention_layernorm.bias",
                         "mlp.linear_fc1.weight": "mlp.dense_h_to_4h.weight",
                         "mlp.linear_fc1.bias": "mlp.dense_h_to_4h.bias",
                         "mlp.linear_fc2.weight": "mlp.dense_4h_to_h.weight",
                         "mlp.linear_fc2.bias": "mlp.dense_4h_to_h.bias"}
            info = json.loads(fcio.run([inspect, ckpt, "--json"]).stdout)
            lines = []
            for t in info["tensors"]:
                key, shape = t["key"], t["global_shape"]
                if key.startswith("optimizer."):
                    continue
                if key in top:
                    lines.append(f"{key} -> {top[key]}")
                    continue
                rest = key[len("decoder.layers."):]
                head, _, suffix = rest.partition(".")
                if head.isdigit():  # per-layer keys
                    lines.append(f"{key} -> language_model.encoder.layers.{head}."
                                 f"{per_layer[suffix]}")
                    continue
                # layer-stacked keys: cut into layers, each without the layer axis
                suffix = rest
                lines.append(f"{key} -> " + ", ".join(f"cut.{i}.{suffix}"
                                                      for i in range(shape[0])) + ", axis=0")
                for i in range(shape[0]):
                    lines.append(f"cut.{i}.{suffix} -> language_model.encoder.layers.{i}."
                                 f"{per_layer[suffix]}, shape='{shape[1:]}'")
            program = os.path.join(tmp, f"pre_core_{family}.aoa")
            with open(program, "w") as f:
                f.write("\n".join(lines) + "\n")
            old = os.path.join(tmp, f"pre_core_{family}")
            fcio.run([export, ckpt, old, "--aoa", program, "--exclude", "optimizer.*", "-q"])
            names = [t["key"] for t in json.loads(fcio.run([inspect, old, "--json"]).stdout)
                     ["tensors"]]
            assert names and all(n.startswith("language_model.") for n in names), names
            got_dir = os.path.join(tmp, f"pre_core_{family}_hf")
            fcio.run([export, old, got_dir, "--hf-family", family, "--copy-from", ref, "-q"])
            got, _ = fcio.read_hf_dir(got_dir)
            want_dir = os.path.join(tmp, "core_" + family)
            fcio.run([export, ckpt, want_dir, "--hf-family", family, "--copy-from", ref, "-q"])
            want, _ = fcio.read_hf_dir(want_dir)
            assert sorted(got) == sorted(want), (family, sorted(got), sorted(want))
            fcio.same_tensors(got, want, f"{family} pre-Core names")
            printed = fcio.run([inspect, old, "--hf-family", family, "--copy-from", ref,
                                "--print-aoa"]).stdout
            assert "language_model.encoder.layers.$LAYER_ID.self_attention.query_key_value" \
                ".weight ->" in printed and "pre-Core" in printed, printed
            print(f"{family} {src} under pre-Core Megatron names (language_model.encoder.layers.N"
                  f".self_attention.query_key_value, {in_norm}, {final}, dense_h_to_4h, ...): "
                  f"fc-export --hf-family {family} gives the {len(want)} tensors of the "
                  f"Megatron-Core names, bit for bit", flush=True)
        # a tensor the family has no place for is named as the source spells it
        p = fcio.run([inspect, old, "--hf-family", "llama", "--copy-from",
                      os.path.join(tmp, "ref_llama")], expect=6)
        assert "'language_model.embedding.position_embeddings.weight' has no place in family " \
            "llama" in p.stderr, p.stderr

        ckpt = os.path.join(real, "qwen2_tp2", "ckpt")
        ref = os.path.join(tmp, "ref_qwen2")
        never = os.path.join(tmp, "never")
        # config.json against the source: exit 3 naming both values, dry run or not
        bad = write_config(os.path.join(tmp, "bad"), dict(QWEN2, num_hidden_layers=6))
        for extra in ([], ["--dry-run"]):
            p = fcio.run([convert, ckpt, never, "--hf-family", "qwen2", "--copy-from", bad,
                          "--preset", "hf-llama", *extra], expect=3)
            assert "4 layers" in p.stderr and "num_hidden_layers is 6" in p.stderr, p.stderr
            assert not os.path.exists(never)
        # refused combinations: exit 2 before reading anything
        for args, words in [
                (["--aoa", os.path.join(tmp, "x.aoa")], "excludes"),
                (["--output-format", "ucp"], "--hf-family applies to --output-format fc and "
                                             "torch-dcp"),
        ]:
            p = fcio.run([convert, ckpt, never, "--hf-family", "qwen2", "--copy-from", ref,
                          *(["--preset", "hf-llama"] if "ucp" not in args else []), *args],
                         expect=2)
            assert words in p.stderr, (args, p.stderr)
            assert not os.path.exists(never)
        p = fcio.run([convert, ckpt, never, "--hf-family", "qwen2", "--preset", "hf-llama"],
                     expect=2)
        assert "--hf-family needs --copy-from DIR" in p.stderr, p.stderr
        p = fcio.run([convert, ckpt, never, "--hf-family", "deepseek", "--copy-from", ref,
                      "--preset", "hf-llama"], expect=2)
        assert "deepseek" in p.stderr and "gpt2,llama,mixtral,qwen2,qwen2-moe" in p.stderr, p.stderr
        print("fc-convert --hf-family: config.json mismatch exit 3 (dry run too); with --aoa, "
              "--output-format ucp, without --copy-from, an unverified family: exit 2",
              flush=True)


if __name__ == "__main__":
    main()
