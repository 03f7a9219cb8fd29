"""fc on checkpoints written by the real PaddlePaddle 3.3.1, compared bit for bit with what
Paddle itself loads from them (testdata/real/paddle/make_fixtures.py): fc-inspect --verify,
fc-export --include-optimizer against each case's expected.safetensors, and fc-export --aoa
of every AOA program in aoa_tp2/aoa/ against the tensors Paddle's load_state_dict(...,
aoa_config=...) filled; fc-convert --aoa of each program (resharded, then exported) equals
fc-export --aoa of it. No framework is needed (numpy reads both sides).

usage: paddle_fixtures_check.py BUILD_ROOT FIXTURES_DIR
  FIXTURES_DIR: testdata/real/paddle (committed), or a directory make_fixtures.py just wrote
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import fcio  # noqa: E402

CASES = ["single_pickle", "single_safetensors", "two_ranks", "two_ranks_safetensors",
         "zero_sharding", "aoa_tp2"]




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
    "two_casts_one_source": None,
    "reverse_fused_ffn": None,
}


def check_two_casts(got, want, stored):
    """two_casts_one_source: Paddle keys a postprocess by its source slice, so of two casts of
    llama.norm.weight the second (float16) wins for both destinations: its norm.bf16 holds
    norm.half's float16 bit patterns. fc casts each: norm.bf16 is the stored float32 rounded
    to bfloat16 (nearest even), norm.half equals Paddle's."""
    assert want["norm.bf16"][1].tobytes() == want["norm.half"][1].tobytes(), \
        "two_casts_one_source: Paddle's norm.bf16 is no longer norm.half's float16 bits"
    src = stored["llama.norm.weight"][1]
    assert got["norm.bf16"][0] == "BF16" and \
        got["norm.bf16"][1].tobytes() == fcio.f32_to_bf16_bits(src).tobytes()
    fcio.same_tensors({"norm.half": got["norm.half"]}, {"norm.half": want["norm.half"]},
            "two_casts_one_source")


def check_reverse_ffn(got, want, aoa_dir, stored):
    """reverse_fused_ffn (G, U -> gate_up, fused_ffn run in reverse over the TP-2 save):
    Paddle takes the stored gate_up's degree as 1, so its gate is the first half of the
    columns (rank 0's [gate | up]) and its up the second; fc's equal the forward fused_ffn
    program's, on which both agree."""
    fwd = fcio.read_safetensors(os.path.join(aoa_dir, "fused_ffn.safetensors"))
    for L in range(2):
        x = stored[_ffn(L)][1]
        for p, cols in (("gate", slice(0, INTER)), ("up", slice(INTER, 2 * INTER))):
            assert want[f"m.{L}.{p}"][1].tobytes() == x[:, cols].copy().tobytes(), \
                f"reverse_fused_ffn: Paddle's m.{L}.{p} is no longer half of {_ffn(L)}"
            fcio.same_tensors({"x": got[f"m.{L}.{p}"]}, {"x": fwd[f"model.layers.{L}.mlp.{p}_proj.weight"]},
                    f"reverse_fused_ffn m.{L}.{p} vs fused_ffn")


def check_known_difference(name, got, want, aoa_dir, stored):
    if name == "two_casts_one_source":
        check_two_casts(got, want, stored)
        return
    if name == "reverse_fused_ffn":
        check_reverse_ffn(got, want, aoa_dir, stored)
        return
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


def export_aoa(tools, tmp, ckpt, program, expect=0):
    out = os.path.join(tmp, "aoa-" + os.path.basename(os.path.dirname(program)) + "-" +
                       os.path.basename(program)[:-5])
    p = fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--aoa", program, "-q",
                  "--include-optimizer"], expect=expect)
    return p if expect else fcio.read_hf_dir(out)[0]


# fc-convert --aoa: the program applied while resharding to TP 2, written as fc distcp, then
# exported without a program. Every tensor is cut along axis 0 (as torch.chunk), except for
# programs with a fused macro: there the destination's degree is the number of its distinct
# chunk offsets (as in Paddle's get_dst_state_shard_num), so a destination cut in two would
# be re-laid for TP 2 ([gate_0 | up_0 | gate_1 | up_1]) and differ from the one-process
# load Paddle did; those are written whole, at TP 1 (a TP 2 layout with every tensor whole
# is refused: rank 1 would hold nothing).
TP2_ALL_ROWS = {"degrees": {"tp": 2},
                "tensor_parallel": [{"regex": ".", "axis": 0, "uneven": "chunk"}]}
TP1 = {"degrees": {"tp": 1}}


def convert_aoa(tools, tmp, ckpt, program):
    """fc-convert CKPT --aoa PROGRAM to TP 2 (TP 1 with a fused macro), then fc-export of that: {name: (dtype, array)}."""
    base = os.path.join(tmp, "convert-" + os.path.basename(os.path.dirname(program)) + "-" +
                        os.path.basename(program)[:-5])
    fused = any("fused_" in s for s in json.load(open(program))["aoa_statements"])
    layout = os.path.join(tmp, "tp1.json" if fused else "tp2_all_rows.json")
    with open(layout, "w") as f:
        json.dump(TP1 if fused else TP2_ALL_ROWS, f)
    fcio.run([os.path.join(tools, "fc-convert"), ckpt, base + ".fc", "--aoa", program,
              "--target-layout", layout, "-q"])
    meta = json.load(open(os.path.join(base + ".fc", "fc.metadata.json")))
    files = {c["file"] for t in meta["tensors"] for c in t["chunks"]}
    assert files == ({"0_0.distcp"} if fused else {"0_0.distcp", "1_0.distcp"}), \
        (program, files)
    fcio.run([os.path.join(tools, "fc-export"), base + ".fc", base + ".hf", "-q",
              "--include-optimizer"])
    return fcio.read_hf_dir(base + ".hf")[0]


def check_convert_equals_export(tools, tmp, ckpt, program, exported):
    """fc-convert --aoa gives, tensor for tensor and bit for bit, what fc-export --aoa gives
    (which check_program compares with Paddle): the same program through the resharding path."""
    converted = convert_aoa(tools, tmp, ckpt, program)
    assert sorted(converted) == sorted(exported), \
        (program, sorted(set(converted) ^ set(exported)))
    fcio.same_tensors(converted, exported, "fc-convert --aoa " + os.path.basename(program))


def check_program(tools, tmp, ckpt, aoa, name, stored):
    want = fcio.read_safetensors(os.path.join(aoa, name + ".safetensors"))
    got = export_aoa(tools, tmp, ckpt, os.path.join(aoa, name + ".json"))
    check_convert_equals_export(tools, tmp, ckpt, os.path.join(aoa, name + ".json"), got)
    if name in KNOWN_DIFFERENCES:
        check_known_difference(name, got, want, aoa, stored)
        why = {"two_casts_one_source": "Paddle: norm.bf16 holds norm.half's float16 bits; fc "
                                       "casts each",
               "reverse_fused_ffn": "Paddle: degree 1 for the stored gate_up; fc: its degree 2"
               }.get(name, "Paddle: degree 1 on X^T; fc: X's degree 2")
        print(f"aoa {name}: differs from Paddle as documented ({why})", flush=True)
        return
    fcio.same_tensors(got, want, f"aoa {name}", subset=True)
    stmts = json.load(open(os.path.join(aoa, name + ".json")))["aoa_statements"]
    print(f"aoa {name} ({len(stmts)} statements): {len(want)} tensors equal Paddle's "
          f"load_state_dict(aoa_config=...) (fc-export --aoa, and fc-convert --aoa to TP "
          f"{1 if any('fused_' in s for s in stmts) else 2})", flush=True)


def check_relay(tools, tmp, fixtures):
    """aoa_tp2/relay: programs Paddle ran in a multi-process load, each rank's destination a
    block of the cut <name>.layout.json describes, so that the fused macros re-lay for the
    destination's degree (TP 2 -> TP 3 gate/up; merges into TP 2 destinations). fc-convert
    --aoa with that layout as --target-layout gives the same global tensors."""
    d = os.path.join(fixtures, "aoa_tp2", "relay")
    ckpt = os.path.join(fixtures, "aoa_tp2", "ckpt")
    names = sorted(f[:-5] for f in os.listdir(d)
                   if f.endswith(".json") and not f.endswith(".layout.json"))
    assert names, d
    for name in names:
        want = fcio.read_safetensors(os.path.join(d, name + ".safetensors"))
        layout = json.load(open(os.path.join(d, name + ".layout.json")))
        out = os.path.join(tmp, "relay-" + name)
        fcio.run([os.path.join(tools, "fc-convert"), ckpt, out + ".fc", "--aoa",
                  os.path.join(d, name + ".json"), "--target-layout",
                  os.path.join(d, name + ".layout.json"), "-q"])
        meta = json.load(open(os.path.join(out + ".fc", "fc.metadata.json")))
        degree = layout["degrees"]["tp"]
        for t in meta["tensors"]:
            if t["key"] in want:
                assert len(t["chunks"]) == degree, (name, t["key"], len(t["chunks"]))
        fcio.run([os.path.join(tools, "fc-export"), out + ".fc", out + ".hf", "-q"])
        got = fcio.read_hf_dir(out + ".hf")[0]
        fcio.same_tensors(got, want, f"relay {name}", subset=True)
        print(f"relay {name}: {len(want)} tensors cut over {degree} ranks equal Paddle's "
              f"{degree}-process load_state_dict(aoa_config=...)", flush=True)


def check_refused(tools, tmp, fixtures):
    """Programs fc refuses (exit 3) that Paddle runs or fails on differently (what Paddle did
    is in <name>.paddle.json, checked at each regeneration), and fc's $LAYER_ID over
    temporaries, which Paddle does not expand: fc's output equals Paddle's for the same
    program written out per layer (aoa/chain_explicit)."""
    d = os.path.join(fixtures, "aoa_tp2", "refused")
    ckpt = os.path.join(fixtures, "aoa_tp2", "ckpt")
    for name, fc_message in (("no_match", "matches 'nothing.$LAYER_ID.w'"),
                             ("remove_after_use", "cannot remove 'lm_head.weight'"),
                             ("degree_not_dividing", "must divide num_heads (4) and "
                                                     "num_key_value_groups (1)")):
        paddle = json.load(open(os.path.join(d, name + ".paddle.json")))
        p = export_aoa(tools, tmp, ckpt, os.path.join(d, name + ".json"), expect=3)
        assert fc_message in p.stderr, (name, p.stderr)
        print(f"refused {name}: fc exit 3; Paddle: {paddle.get('error', paddle['paddle'])}",
              flush=True)
    got = export_aoa(tools, tmp, ckpt, os.path.join(d, "reverse_fused_qkv_old_gqa.json"))
    fwd = fcio.read_safetensors(os.path.join(fixtures, "aoa_tp2", "aoa", "fused_qkv_old.safetensors"))
    fcio.same_tensors({k: got[k] for k in got if k.startswith("m.")},
            {f"m.{L}.{p}": fwd[f"model.layers.{L}.self_attn.{p}_proj.weight"]
             for L in range(2) for p in "qkv"}, "reverse_fused_qkv_old_gqa vs fused_qkv_old")
    paddle = json.load(open(os.path.join(d, "reverse_fused_qkv_old_gqa.paddle.json")))
    print(f"reverse_fused_qkv_old_gqa: fc equals Paddle's forward fused_qkv_old; Paddle itself: "
          f"{paddle['error'][:80]}...", flush=True)
    got = export_aoa(tools, tmp, ckpt, os.path.join(d, "chain_layer_id.json"))
    want = fcio.read_safetensors(os.path.join(fixtures, "aoa_tp2", "aoa",
                                              "chain_explicit.safetensors"))
    fcio.same_tensors(got, want, "chain_layer_id vs Paddle's chain_explicit", subset=True)
    paddle = json.load(open(os.path.join(d, "chain_layer_id.paddle.json")))
    print(f"chain_layer_id: fc equals Paddle's chain_explicit; Paddle itself: {paddle['error']}",
          flush=True)


def main():
    build, fixtures = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    with fcio.temp_dir("fc-real-paddle-") as tmp:
        for case in CASES:
            ckpt = os.path.join(fixtures, case, "ckpt")
            want = fcio.read_safetensors(os.path.join(fixtures, case, "expected.safetensors"))
            # No --format: save_state_dict(..., safetensors=True)'s <id>.metadata +
            # <rank>_<id>.safetensors must be detected as Paddle, not HF safetensors.
            fmt = []
            p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", ckpt] + fmt)
            assert "verify: OK" in p.stdout, (case, p.stdout)
            assert "format:   paddle" in p.stdout, (case, p.stdout.splitlines()[:2])
            out = os.path.join(tmp, case)
            fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--include-optimizer", "-q"]
                     + fmt)
            got, _ = fcio.read_hf_dir(out)
            fcio.same_tensors(got, want, case)
            print(f"{case}: {len(want)} tensors equal Paddle's load_state_dict", flush=True)
        stored = fcio.read_safetensors(os.path.join(fixtures, "aoa_tp2", "expected.safetensors"))
        for case in ("aoa_tp2", "single_pickle"):
            aoa = os.path.join(fixtures, case, "aoa")
            ckpt = os.path.join(fixtures, case, "ckpt")
            for f in sorted(os.listdir(aoa)):
                if f.endswith(".json"):
                    check_program(tools, tmp, ckpt, aoa, f[:-5], stored)
        check_refused(tools, tmp, fixtures)
        check_relay(tools, tmp, fixtures)


if __name__ == "__main__":
    main()
