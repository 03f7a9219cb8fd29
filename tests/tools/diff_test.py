"""fc-diff end to end: equal checkpoints in other formats and layouts, changed values,
tolerances, missing keys, dtype mismatches, --json, AOA on one side, bad input.

usage: diff_test.py BUILD_ROOT TESTDATA CASE   (CASE: layouts|values|keys|json|aoa|errors|onlycommon)
"""
import glob
import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

# numpy missing: skipped
np = fcio.import_or_skip("numpy")

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
TOOLS = os.path.join(BUILD, "tools")
DIFF, EXPORT, CONVERT = (os.path.join(TOOLS, t) for t in ("fc-diff", "fc-export", "fc-convert"))
MEGATRON = os.path.join(TESTDATA, "torch_dcp", "megatron_tiny_tp2_pp2", "ckpt")
AOA = os.path.join(TESTDATA, "aoa", "megatron_tiny_to_hf_llama.aoa")
tmp = tempfile.mkdtemp(prefix="fc-diff-test-")

NP_TO_ST = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.float16): "F16",
            np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


def write_safetensors(path, tensors, dtypes=None):
    """tensors: {name: numpy array}; dtypes overrides the safetensors dtype (e.g. BF16 for
    uint16 bit patterns). An independent writer: json header + packed little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        dt = (dtypes or {}).get(name) or NP_TO_ST[arr.dtype]
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return path


def diff(a, b, *flags, expect=0):
    return fcio.run([DIFF, a, b, "--quiet" if "--json" in flags else "-v", *flags], expect=expect)


def export(out, *flags):
    fcio.run([EXPORT, MEGATRON, out, "--quiet", *flags])
    return out


def case_layouts():
    """The same tensors in other formats and shardings compare equal, both ways."""
    hf = export(os.path.join(tmp, "hf"))
    sharded = export(os.path.join(tmp, "hf-sharded"), "--max-shard-size", "200")
    assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json"))
    p = diff(MEGATRON, hf)
    assert "equal: 15 tensors" in p.stdout and "bit-identical" in p.stdout, p.stdout
    diff(hf, MEGATRON)
    diff(sharded, MEGATRON)
    runs = {"tp1": ["--preset", "megatron-gpt", "--tp", "1", "--pp", "1"],
            "tp1-torch": ["--preset", "megatron-gpt", "--tp", "1", "--pp", "1",
                          "--output-format", "torch-dcp", "--torch-version", "1.13"]}
    for name, flags in runs.items():
        out = os.path.join(tmp, name)
        fcio.run([CONVERT, MEGATRON, out, "--quiet", *flags])
        diff(MEGATRON, out)
        diff(out, hf, "--memory-budget", "4KiB", "--threads", "3")
        print("ok", name)
    # Other input formats against their exports (optimizer states included on both sides).
    others = [os.path.join(TESTDATA, "fc_distcp", "sample"),
              os.path.join(TESTDATA, "safetensors", "hf_sharded")]
    others += sorted(glob.glob(os.path.join(TESTDATA, "paddle_flex", "*", "ckpt")))
    for i, src in enumerate(others):
        out = os.path.join(tmp, f"other{i}")
        fcio.run([EXPORT, src, out, "--quiet", "--include-optimizer"])
        p = diff(src, out)
        assert "bit-identical" in p.stdout, (src, p.stdout)
        print("ok", src)
    print("ok layouts")


def changed_copy(src_dir, name, index, value, out_name):
    """A copy of the export in src_dir with one element of `name` set to `value`."""
    tensors = {k: arr.copy() for k, (dt, arr) in fcio.read_safetensors(
        os.path.join(src_dir, "model.safetensors")).items()}
    dtypes = {k: dt for k, (dt, _) in fcio.read_safetensors(os.path.join(src_dir, "model.safetensors")).items()}
    tensors[name][index] = value
    out = os.path.join(tmp, out_name)
    os.makedirs(out)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtypes)
    return out, tensors


def case_values():
    hf = export(os.path.join(tmp, "hf"), "--dtype", "float32")
    name = "decoder.layers.1.mlp.linear_fc2.weight"
    orig = fcio.read_safetensors(os.path.join(hf, "model.safetensors"))[name][1]
    assert orig.ndim == 2 and orig.shape[1] > 3, orig.shape
    old = float(orig[1, 3])
    changed, _ = changed_copy(hf, name, (1, 3), old + 0.5, "changed")
    p = diff(hf, changed, expect=1)
    want = f"values differ: '{name}' [{orig.shape[0]}, {orig.shape[1]}] float32: 1 of {orig.size} elements; first at [1, 3]: A="
    assert want in p.stdout, p.stdout
    line = [l for l in p.stdout.splitlines() if l.startswith("values differ")][0]
    a_text = line.split("A=")[1].split(" ")[0]
    b_text = line.split("B=")[1].split(";")[0]
    assert np.float32(float(a_text)) == np.float32(old), (a_text, old)
    assert np.float32(float(b_text)) == np.float32(old + 0.5), (b_text, old)
    assert "max abs diff 0.5" in line, line
    assert p.stdout.splitlines()[-1].startswith("different: 1 difference(s)"), p.stdout
    # Tolerances: 0.5 passes atol 0.6, fails atol 0.4; rtol relative to B.
    diff(hf, changed, "--atol", "0.6")
    diff(hf, changed, "--atol", "0.4", expect=1)
    rel = 0.5 / abs(old + 0.5)
    diff(hf, changed, "--rtol", str(rel * 1.01))
    diff(hf, changed, "--rtol", str(rel * 0.99), expect=1)
    # --exclude the changed tensor (glob) and the rest is equal; --include only it differs.
    diff(hf, changed, "--exclude", "*.linear_fc2.*")
    diff(hf, changed, "--include", "decoder.layers.[01].mlp.*", expect=1)
    # A bfloat16 export against the float32 one: different dtypes (exact), close with rtol.
    bf = export(os.path.join(tmp, "bf16"), "--dtype", "bfloat16")
    p = diff(bf, hf, expect=1)
    assert "dtype differs" in p.stdout, p.stdout
    diff(bf, hf, "--rtol", "0.004")  # bfloat16 keeps 8 bits: rel error <= 2^-9
    # NaN: equal bits are equal in exact mode; in tolerance mode only with --equal-nan.
    nan_a = write_safetensors(os.path.join(tmp, "nan_a.safetensors"), {"x": np.array([np.nan, 1], np.float32)})
    nan_b = write_safetensors(os.path.join(tmp, "nan_b.safetensors"), {"x": np.array([np.nan, 1], np.float32)})
    diff(nan_a, nan_b)
    diff(nan_a, nan_b, "--atol", "1", expect=1)
    diff(nan_a, nan_b, "--atol", "1", "--equal-nan")
    print("ok values")


def case_keys():
    a = write_safetensors(os.path.join(tmp, "a.safetensors"),
                          {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                           "gone": np.zeros(2, np.float32), "i": np.arange(3, dtype=np.int64)})
    b = write_safetensors(os.path.join(tmp, "b.safetensors"),
                          {"w": np.arange(6, dtype=np.float32).reshape(3, 2),
                           "new": np.zeros(1, np.int32), "i": np.arange(3, dtype=np.int32)})
    p = diff(a, b, expect=1)
    for want in ["only in A: 'gone' float32 [2]", "only in B: 'new' int32 [1]",
                 "shape differs: 'w' A [2, 3], B [3, 2]", "dtype differs: 'i' A int64, B int32"]:
        assert want in p.stdout, (want, p.stdout)
    # Across dtypes with a tolerance the integers are equal; the shape and keys still differ.
    p = diff(a, b, "--atol", "0", expect=1)
    assert "'i'" not in p.stdout, p.stdout
    diff(a, b, "--include", "i", "--atol", "0")
    # One pattern per flag: the positionals after --include stay A and B.
    fcio.run([DIFF, "--include", "i", "--include", "w", a, b, "--quiet"], expect=1)
    fcio.run([DIFF, "--include", "i", a, b, "--quiet", "--atol", "0"], expect=0)
    print("ok keys")


def case_json():
    a = write_safetensors(os.path.join(tmp, "a.safetensors"),
                          {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "gone": np.zeros(2, np.float32)})
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    w[1, 0] = np.inf
    b = write_safetensors(os.path.join(tmp, "b.safetensors"), {"w": w})
    p = diff(a, b, "--json", expect=1)
    r = json.loads(p.stdout)
    assert r["equal"] is False and r["mode"] == "exact", r
    assert r["tensors_a"] == 2 and r["tensors_b"] == 1 and r["tensors_compared"] == 1, r
    kinds = {d["name"]: d for d in r["differences"]}
    assert kinds["gone"]["kind"] == "only_in_a" and "dtype_b" not in kinds["gone"], kinds
    d = kinds["w"]
    assert d["kind"] == "values" and d["first_index"] == [1, 0], d
    assert d["first_a"] == "3" and d["first_b"] == "inf" and d["first_b_value"] == "inf", d
    assert d["max_abs_diff"] == "inf" and d["differing_elements"] == 1 and d["elements"] == 6, d
    p = diff(a, a, "--json")
    assert json.loads(p.stdout) == {"equal": True, "mode": "exact", "tensors_a": 2, "tensors_b": 2,
                                    "tensors_compared": 2, "bytes_compared": 32, "differences": [],
                                    "tensors": [{"name": "w", "max_abs_diff": 0, "max_rel_diff": 0},
                                                {"name": "gone", "max_abs_diff": 0, "max_rel_diff": 0}]}, p.stdout
    # Tolerance mode: the per-tensor maxima of tensors that pass are reported too.
    w2 = np.arange(6, dtype=np.float32).reshape(2, 3)
    w2[0, 1] = 1.25
    c = write_safetensors(os.path.join(tmp, "c.safetensors"), {"w": w2})
    r = json.loads(diff(b, c, "--json", "--atol", "0.5", "--include", "w", expect=1).stdout)
    assert [d["name"] for d in r["differences"]] == ["w"], r  # inf vs 3 fails
    r = json.loads(diff(a, c, "--json", "--atol", "0.5", "--include", "w").stdout)
    assert r["equal"] and r["mode"] == "tolerance" and r["differences"] == [], r
    assert r["tensors"] == [{"name": "w", "max_abs_diff": 0.25, "max_rel_diff": 0.2}], r
    p = diff(a, c, "--atol", "0.5", "--include", "w")
    assert "within tolerance; largest abs diff 0.25 ('w'), largest rel diff 0.2 ('w')" in p.stdout, p.stdout
    # --quiet alone prints nothing, the exit status says it all.
    p = fcio.run([DIFF, a, b, "--quiet"], expect=1)
    assert p.stdout == "", p.stdout
    print("ok json")


def case_aoa():
    llama = export(os.path.join(tmp, "llama"), "--aoa", AOA)
    p = diff(MEGATRON, llama, "--aoa-a", AOA)
    assert "equal:" in p.stdout, p.stdout
    diff(llama, MEGATRON, "--aoa-b", AOA)
    # Without the program nothing lines up.
    p = diff(MEGATRON, llama, expect=1)
    assert "only in A: 'decoder.final_layernorm.weight'" in p.stdout, p.stdout
    assert "only in B: 'model.norm.weight'" in p.stdout, p.stdout
    print("ok aoa")


def case_onlycommon():
    """Issue 32 item 4: after a plain export the source's optimizer states and DeepSpeed's
    16-bit module copies are on one side only; --only-common lists them and compares the rest."""
    src = os.path.join(TESTDATA, "deepspeed", "bf16", "ckpt")
    out = os.path.join(tmp, "ds_export")
    fcio.run([EXPORT, src, out, "--quiet"])
    p = diff(src, out, expect=1)
    assert "different: 17 difference(s)" in p.stdout, p.stdout
    p = diff(src, out, "--only-common")
    lines = p.stdout.splitlines()
    unmatched = [l for l in lines if l.startswith("not compared, only in A: ")]
    assert len(unmatched) == 17, p.stdout
    assert "not compared, only in A: 'optimizer.exp_avg.embed.weight' float32 [6, 4]" in lines, p.stdout
    assert "not compared, only in A: 'module.embed.weight' bfloat16 [6, 4]" in lines, p.stdout
    assert lines[-1] == ("equal: 5 tensors (232 B) bit-identical; 17 name(s) on one side only, "
                         "not compared (--only-common)"), p.stdout
    r = json.loads(diff(src, out, "--only-common", "--json").stdout)
    assert r["equal"] is True and r["differences"] == [] and r["tensors_compared"] == 5, r
    assert len(r["unmatched"]) == 17 and {u["kind"] for u in r["unmatched"]} == {"only_in_a"}, r
    assert r["unmatched"][0] == {"kind": "only_in_a", "name": "module.embed.weight",
                                 "dtype_a": "bfloat16", "shape_a": [6, 4]}, r["unmatched"][0]
    assert "unmatched" not in json.loads(diff(out, out, "--json").stdout)
    # A changed common tensor still differs; one-sided names in B are listed too.
    changed, _ = changed_copy(out, "layer.bias", 0, 7.0, "changed")
    p = diff(changed, src, "--only-common", expect=1)
    assert "values differ: 'layer.bias'" in p.stdout, p.stdout
    assert "not compared, only in B: 'optimizer.step.layer.bias' float32 []" in p.stdout, p.stdout
    assert "different: 1 difference(s);" in p.stdout, p.stdout
    # Nothing in common is never "equal".
    other = write_safetensors(os.path.join(tmp, "other.safetensors"), {"x": np.zeros(2, np.float32)})
    p = diff(other, out, "--only-common", expect=1)
    assert "different: no name in common (A has 1, B has 5); nothing compared" in p.stdout, p.stdout
    assert json.loads(diff(other, out, "--only-common", "--json", expect=1).stdout)["equal"] is False
    print("ok onlycommon")


def case_errors():
    a = write_safetensors(os.path.join(tmp, "a.safetensors"), {"w": np.zeros(4, np.float32)})
    p = diff(a, os.path.join(tmp, "nope"), expect=4)
    assert p.stderr.splitlines()[-1].startswith("fc-diff: error: B: "), p.stderr  # after -v lines
    bad = os.path.join(tmp, "bad.safetensors")
    with open(bad, "wb") as f:
        f.write(open(a, "rb").read()[:-4])  # truncated data
    p = diff(bad, a, expect=5)
    assert "A: " in p.stderr and "bad.safetensors" in p.stderr, p.stderr
    diff(a, a, "--include", "[w", expect=3)
    diff(a, a, "--rtol", "-1", expect=2)  # a bad flag value is a usage error
    diff(a, a, "--aoa-a", os.path.join(tmp, "missing.aoa"), expect=4)
    diff(a, a, "--memory-budget", "10", expect=10)
    diff(a, a, "--no-such-flag", expect=2)
    fcio.run([DIFF, a], expect=2)
    # Every newer dtype compares (through the library's conversions); complex64 has no real
    # value to compare within a tolerance and is refused, naming the tensor.
    all_dtypes = os.path.join(TESTDATA, "st_dtypes", "all_dtypes.safetensors")
    diff(all_dtypes, all_dtypes)
    p = diff(all_dtypes, all_dtypes, "--rtol", "0.1", expect=6)
    assert "'c64' is complex64" in p.stderr, p.stderr
    p = diff(all_dtypes, all_dtypes, "--rtol", "0", "--equal-nan", "--exclude", "c64")
    assert "within tolerance" in p.stdout, p.stdout
    print("ok errors")


fcio.run_case(globals(), CASE, tmp)
