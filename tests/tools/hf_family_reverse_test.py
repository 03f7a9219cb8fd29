"""fc-convert --from-hf-family NAME (HuggingFace -> Megatron-Core GPT) on the real Megatron-Core
saves (testdata/real/megatron), numpy only: the round trip Megatron --(fc-export --hf-family
NAME --copy-from DIR)--> HF --(fc-convert HF OUT --from-hf-family NAME --target-like the
original --output-format torch-dcp)--> Megatron gives back every model tensor bit for bit
(fc-export of both compared), for per-layer keys with Transformer Engine norm names
(gpt_tp2_pp2_layers), layer-stacked keys (gpt_tp2_pp2) and Qwen2's QKV bias with a tied
output layer (qwen2_tp2); OUT holds the target's metadata.json and common.pt. A config.json
that disagrees with the HF tensors is exit 3 naming both values, with no OUT; --from-hf-family
with --hf-family, with --output-format ucp, or an unknown family is exit 2.

usage: hf_family_reverse_test.py BUILD_ROOT TESTDATA_DIR
"""
import filecmp
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fcio  # noqa: E402
from hf_family_convert_test import LLAMA, QWEN2, write_config  # noqa: E402


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    convert, export = os.path.join(tools, "fc-convert"), os.path.join(tools, "fc-export")
    real = os.path.join(testdata, "real", "megatron")
    tmp = tempfile.mkdtemp(prefix="fc-hf-family-reverse-")
    try:
        cases = [("llama", LLAMA, "gpt_tp2_pp2_layers/ckpt", 27),
                 ("llama", LLAMA, "gpt_tp2_pp2/ckpt", 9),
                 ("qwen2", QWEN2, "qwen2_tp2/ckpt", 9)]
        for family, fields, src, count in cases:
            tag = src.replace("/", "_")
            ref = write_config(os.path.join(tmp, "ref_" + family), fields)
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
        for args, words in [
                (["--hf-family", "llama", "--copy-from", hf, "--target-like", ckpt],
                 "exclude each other"),
                (["--output-format", "ucp"], "--from-hf-family applies to --output-format fc"),
                (["--target-like", ckpt, "--from-hf-family", "gpt2"], "gpt2"),
        ]:
            fam = [] if "gpt2" in args else ["--from-hf-family", "llama"]
            p = fcio.run([convert, hf, never, *fam, *args], expect=2)
            assert words in p.stderr, (args, p.stderr)
            assert not os.path.exists(never)
        print("fc-convert --from-hf-family: config.json mismatch exit 3; with --hf-family, "
              "--output-format ucp, a family without a reverse: exit 2", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
