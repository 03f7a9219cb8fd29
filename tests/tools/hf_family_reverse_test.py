"""fc-convert --from-hf-family NAME (HuggingFace -> Megatron-Core GPT) on the real Megatron-Core
saves (testdata/real/megatron), numpy only: the round trip Megatron --(fc-export --hf-family
NAME --copy-from DIR)--> HF --(fc-convert HF OUT --from-hf-family NAME --target-like the
original --output-format torch-dcp)--> Megatron gives back every model tensor bit for bit
(fc-export of both compared), for per-layer keys with Transformer Engine norm names
(gpt_tp2_pp2_layers), layer-stacked keys (gpt_tp2_pp2), Qwen2's QKV bias with a tied
output layer (qwen2_tp2), GPT-2's learned positions, LayerNorm and linear biases and
[q; k; v] c_attn (gpt2_tp2), Mixtral's router and experts (mixtral_tp2) and Qwen2-MoE's
experts with the gated shared expert (qwen2_moe_tp2); OUT holds the target's metadata.json and
common.pt and its non-tensor objects (Megatron's _extra_state ShardedObjects, byte for byte:
dist_checkpointing.load requires them). `--preset megatron-gpt --tp 2 --pp 2` as the target
instead of a save gives the same tensors, cut as Megatron cuts them. A config.json that disagrees with the HF tensors or with the target (layer count,
QKV shape, tied output) is exit 3 naming both values, with no OUT; --from-hf-family with
--hf-family, with --output-format ucp, or an unknown family is exit 2.

usage: hf_family_reverse_test.py BUILD_ROOT TESTDATA_DIR [mpi]
  mpi: the round trips under `mpirun -np 2` (the target's objects read by process 0 and sent to
       the writer), nothing else.
"""
import filecmp
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fcio  # noqa: E402
from hf_family_convert_test import (GPT2, LLAMA, MIXTRAL, QWEN2, QWEN2_MOE,  # noqa: E402
                                    write_config)


def objects_of(export, ckpt, where):
    """{key file name: bytes} of CKPT's non-tensor objects (fc-export --objects)."""
    fcio.run([export, ckpt, where + "_t", "--objects", where, "-q"])
    got = {}
    for name in sorted(os.listdir(where)):
        with open(os.path.join(where, name), "rb") as f:
            got[name] = f.read()
    return got


def chunks_of(inspect, ckpt):
    """{tensor key: [(global_offset, local_shape, file)]} from fc-inspect --json."""
    p = fcio.run([inspect, ckpt, "--json"])
    return {t["key"]: [(c["global_offset"], c["local_shape"], c["file"]) for c in t["chunks"]]
            for t in json.loads(p.stdout)["tensors"]}


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    launch = []
    if sys.argv[3:] == ["mpi"]:
        mpirun = shutil.which("mpirun")
        if not mpirun:
            print("SKIP: no mpirun on PATH (Debian: openmpi-bin; scripts/install-deps.sh)")
            sys.exit(77)
        launch = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    tools = os.path.join(build, "tools")
    convert, export = os.path.join(tools, "fc-convert"), os.path.join(tools, "fc-export")
    real = os.path.join(testdata, "real", "megatron")
    with fcio.temp_dir("fc-hf-family-reverse-") as tmp:
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
            fcio.run([*launch, convert, hf, out, "--from-hf-family", family, "--target-like",
                      ckpt, "--output-format", "torch-dcp", "--exclude", "optimizer.*", "-q"])
            for sidecar in ("metadata.json", "common.pt"):
                assert filecmp.cmp(os.path.join(out, sidecar), os.path.join(ckpt, sidecar),
                                   shallow=False), (src, sidecar)
            want_objects = objects_of(export, ckpt, os.path.join(tmp, "wo_" + tag))
            got_objects = objects_of(export, out, os.path.join(tmp, "go_" + tag))
            assert want_objects and any("_extra_state" in k for k in want_objects), want_objects
            assert got_objects == want_objects, (src, sorted(got_objects), sorted(want_objects))
            want_dir, got_dir = os.path.join(tmp, "want_" + tag), os.path.join(tmp, "got_" + tag)
            fcio.run([export, ckpt, want_dir, "--exclude", "optimizer.*", "-q"])
            fcio.run([export, out, got_dir, "-q"])
            want, _ = fcio.read_hf_dir(want_dir)
            got, _ = fcio.read_hf_dir(got_dir)
            assert len(want) == count, (src, sorted(want))
            assert sorted(got) == sorted(want), (src, sorted(got), sorted(want))
            fcio.same_tensors(got, want, f"{family} {src} round trip")
            print(f"{family} {src}: HF -> fc-convert --from-hf-family {family} gives back the "
                  f"{count} model tensors bit for bit; metadata.json, common.pt and the "
                  f"{len(want_objects)} _extra_state objects copied", flush=True)
        if launch:
            return

        # --preset megatron-gpt as the target: Megatron's names (Transformer Engine, one key
        # per layer), the tensors of the per-layer save, cut TP 2 x PP 2 as Megatron cuts them
        hf = os.path.join(tmp, "hf_gpt_tp2_pp2_layers_ckpt")
        ckpt = os.path.join(real, "gpt_tp2_pp2_layers", "ckpt")
        out = os.path.join(tmp, "preset")
        fcio.run([convert, hf, out, "--from-hf-family", "llama", "--preset", "megatron-gpt",
                  "--tp", "2", "--pp", "2", "-q"])
        fcio.run([export, out, os.path.join(tmp, "preset_hf"), "-q"])
        got, _ = fcio.read_hf_dir(os.path.join(tmp, "preset_hf"))
        want, _ = fcio.read_hf_dir(os.path.join(tmp, "want_gpt_tp2_pp2_layers_ckpt"))
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        fcio.same_tensors(got, want, "--preset megatron-gpt target")
        chunks = chunks_of(os.path.join(tools, "fc-inspect"), out)
        for key, axis in [("decoder.layers.0.self_attention.linear_qkv.weight", 0),
                          ("decoder.layers.0.mlp.linear_fc1.weight", 0),
                          ("decoder.layers.3.self_attention.linear_proj.weight", 1),
                          ("decoder.layers.3.mlp.linear_fc2.weight", 1)]:
            shape = list(want[key][1].shape)
            cut = sorted((off, local) for off, local, _ in chunks[key])
            half = shape[axis] // 2
            assert len(cut) == 2 and all(l[axis] == half for _, l in cut), (key, cut)
            assert [o[axis] for o, _ in cut] == [0, half], (key, cut)
        first = {f for k, c in chunks.items() if k.startswith("decoder.layers.0.") for *_, f in c}
        last = {f for k, c in chunks.items() if k.startswith("decoder.layers.3.") for *_, f in c}
        assert len(first) == 2 and len(last) == 2 and not first & last, (first, last)
        print("--from-hf-family llama --preset megatron-gpt --tp 2 --pp 2: the 27 tensors of the "
              "per-layer save, QKV/fc1 cut on axis 0 and proj/fc2 on axis 1 in 2, layers 0 and "
              "3 in different pipeline stages", flush=True)

        # fc-inspect --from-hf-family --print-aoa prints the program fc-convert runs: run
        # through --aoa with the same target it gives the same tensors
        inspect = os.path.join(tools, "fc-inspect")
        for src in ("gpt_tp2_pp2_layers/ckpt", "qwen2_tp2/ckpt"):
            tag = src.replace("/", "_")
            family = "qwen2" if "qwen2" in src else "llama"
            hf, ckpt = os.path.join(tmp, "hf_" + tag), os.path.join(real, src)
            p = fcio.run([inspect, hf, "--from-hf-family", family, "--target-like", ckpt,
                          "--print-aoa"])
            assert "# target: " in p.stdout and "linear_qkv" in p.stdout, p.stdout
            program = os.path.join(tmp, "printed_" + tag + ".aoa")
            with open(program, "w") as f:
                f.write(p.stdout)
            out = os.path.join(tmp, "via_aoa_" + tag)
            fcio.run([convert, hf, out, "--aoa", program, "--target-like", ckpt,
                      "--output-format", "torch-dcp", "--exclude", "optimizer.*", "-q"])
            fcio.run([export, out, out + "_hf", "-q"])
            got, _ = fcio.read_hf_dir(out + "_hf")
            want, _ = fcio.read_hf_dir(os.path.join(tmp, "want_" + tag))
            assert sorted(got) == sorted(want), (src, sorted(got), sorted(want))
            fcio.same_tensors(got, want, f"fc-inspect --print-aoa program for {src}")
            # the preview names what the program gives, with the target's shapes
            p = fcio.run([inspect, hf, "--from-hf-family", family, "--target-like", ckpt])
            for key in want:
                assert key in p.stdout, (src, key, p.stdout)
        for args, words in [(["--print-aoa"], "--print-aoa needs --hf-family or --from-hf-family"),
                            (["--target-like", ckpt], "--target-like needs --from-hf-family"),
                            (["--from-hf-family", "llama", "--verify"],
                             "--verify cannot be combined with --from-hf-family")]:
            p = fcio.run([inspect, os.path.join(tmp, "hf_gpt_tp2_pp2_layers_ckpt"), *args],
                         expect=2)
            assert words in p.stderr, (args, p.stderr)
        print("fc-inspect --from-hf-family --target-like --print-aoa: the printed program run "
              "by fc-convert --aoa gives the same tensors; its preview lists them; misuse exit 2",
              flush=True)

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


if __name__ == "__main__":
    main()
