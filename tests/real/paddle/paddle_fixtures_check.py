"""fc on checkpoints written by the real PaddlePaddle 3.3.1, compared bit for bit with what
Paddle itself loads from them (testdata/real/paddle/make_fixtures.py): fc-inspect --verify,
fc-export --include-optimizer against each case's expected.safetensors, and fc-export --aoa
of every AOA program in aoa_tp2/aoa/ against the tensors Paddle's load_state_dict(...,
aoa_config=...) filled. No framework is needed (numpy reads both sides).

usage: paddle_fixtures_check.py BUILD_ROOT FIXTURES_DIR
  FIXTURES_DIR: testdata/real/paddle (committed), or a directory make_fixtures.py just wrote
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import fcio  # noqa: E402

# save_state_dict(..., safetensors=True) writes <id>.metadata + <rank>_<id>.safetensors; format
# detection (src/format/open.cc) asks the safetensors reader first and takes such a directory
# for HF safetensors (wrong as soon as a tensor is sharded: two_ranks_safetensors), so these
# cases name the format until detection prefers <id>.metadata.
FORMAT_FLAG = {"single_safetensors": ["--format", "paddle"],
               "two_ranks_safetensors": ["--format", "paddle"]}

CASES = ["single_pickle", "single_safetensors", "two_ranks", "two_ranks_safetensors",
         "zero_sharding", "aoa_tp2"]


def compare(got, want, label, subset=False):
    if subset:
        missing = sorted(set(want) - set(got))
        assert not missing, f"{label}: fc produced no {missing} (it produced {sorted(got)})"
    else:
        assert sorted(got) == sorted(want), \
            f"{label}: names differ: {sorted(set(got) ^ set(want))}"
    for name, (dt, arr) in want.items():
        gdt, garr = got[name]
        assert gdt == dt and garr.shape == arr.shape, (label, name, gdt, garr.shape, dt, arr.shape)
        if fcio.bits(garr).tobytes() != fcio.bits(arr).tobytes():
            raise AssertionError(f"{label}: {name} differs\n fc:     {garr.reshape(-1)[:12]}\n"
                                 f" Paddle: {arr.reshape(-1)[:12]}")


# Documented differences (man/fc-aoa.7, DIFFERENCES FROM PADDLE): a fused macro on X^T. The
# stored X (qkv_proj / gate_up_fused_proj, [in, out]) is column-parallel at TP 2; Paddle 3.3.1
# counts the shards of the temporary X_transpose_tmp, finds none, takes degree 1 and splits
# X^T as if one rank had written it; fc counts X's shards (2) and splits per rank, so that
# its output is the transpose of the program without ^T (which both agree on).
# {program: (program without ^T, [(dest, untransposed dest, stored key, Paddle's rows)])}
HEADS, KV, HD, INTER = 4, 2, 2, 6
Q, K = HEADS * HD, KV * HD


def _qkv(L):
    return f"llama.layers.{L}.self_attn.qkv_proj.weight"


def _ffn(L):
    return f"llama.layers.{L}.mlp.gate_up_fused_proj.weight"


KNOWN_DIFFERENCES = {
    "fused_qkv_old_transposed": ("fused_qkv_old", [
        (f"hf.layers.{L}.{p}_proj.weight", f"model.layers.{L}.self_attn.{p}_proj.weight",
         _qkv(L), rows) for L in range(2)
        for p, rows in (("q", (0, Q)), ("k", (Q, Q + K)), ("v", (Q + K, Q + 2 * K)))]),
    "fused_ffn_transposed": ("fused_ffn", [
        (f"hf.layers.{L}.{p}_proj.weight", f"model.layers.{L}.mlp.{p}_proj.weight", _ffn(L), rows)
        for L in range(2) for p, rows in (("gate", (0, INTER)), ("up", (INTER, 2 * INTER)))]),
}


def check_known_difference(name, got, want, aoa_dir, stored):
    plain, items = KNOWN_DIFFERENCES[name]
    untransposed = fcio.read_safetensors(os.path.join(aoa_dir, plain + ".safetensors"))
    for dest, plain_dest, key, (r0, r1) in items:
        xt = stored[key][1].T
        pdt, parr = want[dest]
        assert fcio.bits(parr).tobytes() == fcio.bits(xt[r0:r1]).tobytes(), \
            f"aoa {name}: Paddle's {dest} is no longer rows {r0}:{r1} of {key}^T (degree 1)"
        gdt, garr = got[dest]
        ut = untransposed[plain_dest][1].T
        assert gdt == pdt and fcio.bits(garr).tobytes() == fcio.bits(ut).tobytes(), \
            f"aoa {name}: fc's {dest} is not {plain_dest}^T of program {plain}"
        assert fcio.bits(garr).tobytes() != fcio.bits(parr).tobytes(), (name, dest)


def main():
    build, fixtures = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    tmp = tempfile.mkdtemp(prefix="fc-real-paddle-")
    try:
        for case in CASES:
            ckpt = os.path.join(fixtures, case, "ckpt")
            want = fcio.read_safetensors(os.path.join(fixtures, case, "expected.safetensors"))
            fmt = FORMAT_FLAG.get(case, [])
            p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", ckpt] + fmt)
            assert "verify: OK" in p.stdout, (case, p.stdout)
            assert "format:   paddle" in p.stdout, (case, p.stdout.splitlines()[:2])
            out = os.path.join(tmp, case)
            fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--include-optimizer", "-q"]
                     + fmt)
            got, _ = fcio.read_hf_dir(out)
            compare(got, want, case)
            print(f"{case}: {len(want)} tensors equal Paddle's load_state_dict", flush=True)
        aoa = os.path.join(fixtures, "aoa_tp2", "aoa")
        ckpt = os.path.join(fixtures, "aoa_tp2", "ckpt")
        stored = fcio.read_safetensors(os.path.join(fixtures, "aoa_tp2", "expected.safetensors"))
        for f in sorted(os.listdir(aoa)):
            if not f.endswith(".json"):
                continue
            name = f[:-5]
            want = fcio.read_safetensors(os.path.join(aoa, name + ".safetensors"))
            out = os.path.join(tmp, "aoa-" + name)
            fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--aoa", os.path.join(aoa, f),
                      "-q"])
            got, _ = fcio.read_hf_dir(out)
            stmts = json.load(open(os.path.join(aoa, f)))["aoa_statements"]
            if name in KNOWN_DIFFERENCES:
                check_known_difference(name, got, want, aoa, stored)
                print(f"aoa {name}: differs from Paddle as documented (Paddle: degree 1 on "
                      f"X^T; fc: X's degree 2)", flush=True)
                continue
            compare(got, want, f"aoa {name}", subset=True)
            print(f"aoa {name} ({len(stmts)} statements): {len(want)} tensors equal Paddle's "
                  f"load_state_dict(aoa_config=...)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
