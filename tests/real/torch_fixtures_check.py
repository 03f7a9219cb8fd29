"""fc-inspect --verify and fc-export --include-optimizer on checkpoints written by the real
torch, compared bit for bit with the full tensors torch itself gave back (each case's
expected.safetensors, written by testdata/real/torch/make_fixtures.py): same names, dtypes,
shapes and bytes. No framework is needed to run it (numpy reads both sides).

usage: torch_fixtures_check.py BUILD_ROOT FIXTURES_DIR
  FIXTURES_DIR: testdata/real/torch (committed), or a directory make_fixtures.py just wrote
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import fcio  # noqa: E402

CASES = ["single_plain", "fsdp2_plain", "fsdp2_zstd", "fsdp2_safetensors", "fsdp2_rank_local",
         "hf_consolidated"]




def main():
    build, fixtures = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    with fcio.temp_dir("fc-real-torch-") as tmp:
        for case in CASES:
            ckpt = os.path.join(fixtures, case, "ckpt")
            want = fcio.read_safetensors(os.path.join(fixtures, case, "expected.safetensors"))
            p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", ckpt])
            assert "verify: OK" in p.stdout, (case, p.stdout)
            out = os.path.join(tmp, case)
            fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--include-optimizer", "-q"])
            got, _ = fcio.read_hf_dir(out)
            fcio.same_tensors(got, want, case)
            print(f"{case}: {len(want)} tensors equal torch's", flush=True)


if __name__ == "__main__":
    main()
