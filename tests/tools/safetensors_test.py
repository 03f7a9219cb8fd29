#!/usr/bin/env python3
"""CLI checks of the newer safetensors inputs, read back with an independent reader
(testdata/gen/safetensors/stfile.py, json + numpy, no fc code):
  dtypes: U16/U32/U64, C64, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0 export bit for bit, every
          tensor of the output at a multiple of its element size (reference order);
          sub-byte F4/F6_E2M3/F6_E3M2 export bit for bit (whole and after row splits through
          fc distcp), F4 rows that are not whole bytes are refused (6), a misaligned F4 is
          corrupt (5)
  hf_dcp: torch HuggingFaceStorageWriter layouts (distributed shards, consolidated + sharded/,
          sharded/ alone) export to exactly the bytes of the plain file of the same tensors;
          fc-inspect shows the split; a plain directory with Paddle's auto-generated
          metadata beside it reads as safetensors.
usage: safetensors_test.py BUILD_ROOT TESTDATA CASE   (CASE: dtypes|hf_dcp)
"""
import json
import os
import sys
import tempfile

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(TESTDATA, "gen", "safetensors"))
import stfile  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

EXPORT, CONVERT, INSPECT = fcio.tools(BUILD, "fc-export", "fc-convert", "fc-inspect")


run = fcio.run


def check_aligned(path):
    offs = stfile.data_offsets(path)
    _, tensors = stfile.read(path)
    for name, (dt, _, _) in tensors.items():
        size = max(1, stfile.BITS[dt] // 8)
        assert offs[name] % size == 0, (path, name, offs[name], size)


def case_dtypes(tmp):
    st = os.path.join(TESTDATA, "st_dtypes")
    for name in ("all_dtypes", "fnuz_only"):
        src = os.path.join(st, name + ".safetensors")
        out = os.path.join(tmp, name)
        run([EXPORT, src, out, "--quiet"])
        got_path = os.path.join(out, "model.safetensors")
        _, got = stfile.read(got_path)
        _, want = stfile.read(src)
        assert got == want, name  # dtype strings, shapes and bytes
        check_aligned(got_path)
        if name == "all_dtypes":  # same metadata ("format": "pt"), reference order
            with open(src, "rb") as a, open(got_path, "rb") as b:
                assert a.read() == b.read(), "export of all_dtypes is not byte-identical"
    info = json.loads(run([INSPECT, os.path.join(st, "all_dtypes.safetensors"), "--json"]).stdout)
    dtypes = {t["key"]: t["dtype"] for t in info["tensors"]}
    assert dtypes["f8_e8m0"] == "float8_e8m0fnu" and dtypes["c64"] == "complex64", dtypes
    assert dtypes["f8_e5m2fnuz"] == "float8_e5m2fnuz" and dtypes["u64"] == "uint64", dtypes
    case_subbyte(tmp, st)
    p = run([INSPECT, os.path.join(st, "f4_misaligned.safetensors")], expect=5)
    assert "12 bits" in p.stderr, p.stderr
    print("ok dtypes")


def case_subbyte(tmp, st):
    """F4, F6_E2M3, F6_E3M2 (packed: the reference's rule, values x bits / 8 whole bytes):
    fc-inspect shows them as whole-byte elements (2 or 4 values), fc-export writes the same
    dtype strings, shapes and bytes, whole and after row splits through fc distcp and back;
    a tensor whose rows are not whole bytes is refused (exit 6); torch DCP output is refused
    naming the dtype (exit 3)."""
    for name in ("f4", "f6", "subbyte"):
        src = os.path.join(st, name + ".safetensors")
        out = os.path.join(tmp, "sub-" + name)
        run([EXPORT, src, out, "--quiet"])
        _, got = stfile.read(os.path.join(out, "model.safetensors"))
        _, want = stfile.read(src)
        assert got == want, (name, got, want)  # dtype strings, value shapes, bytes
    src = os.path.join(st, "subbyte.safetensors")
    with open(src, "rb") as a, open(os.path.join(tmp, "sub-subbyte", "model.safetensors"), "rb") as b:
        assert a.read() == b.read(), "export of subbyte is not byte-identical"
    info = json.loads(run([INSPECT, src, "--json"]).stdout)
    got = {t["key"]: (t["dtype"], t["global_shape"]) for t in info["tensors"]}
    assert got == {"f4": ("float4_e2m1fn_x2", [4, 4]), "f6a": ("float6_e2m3fn_x4", [2, 2]),
                   "f6b": ("float6_e3m2fn_x4", [3, 1]), "x": ("float32", [2])}, got
    text = run([INSPECT, src]).stdout
    assert "float4_e2m1fn_x2" in text and "float6_e3m2fn_x4" in text, text
    # Row splits (and a cut of the last dimension between whole elements) through fc distcp.
    ranks = [{"rank": r, "chunks": []} for r in range(2)]
    for t in info["tensors"]:
        shape = t["global_shape"]
        if shape[0] >= 2:
            half = shape[0] // 2
            for r, (off, n) in enumerate(((0, half), (half, shape[0] - half))):
                ranks[r]["chunks"].append({"key": t["key"], "global_offset": [off] + [0] * (len(shape) - 1),
                                           "local_shape": [n] + shape[1:], "flattened_range": None,
                                           "replica_id": 0})
        else:
            ranks[0]["chunks"].append({"key": t["key"], "global_offset": [0] * len(shape),
                                       "local_shape": shape, "flattened_range": None,
                                       "replica_id": 0})
    cols = [c for c in ranks[0]["chunks"] if c["key"] == "f4"][0]
    ranks[0]["chunks"].remove(cols)  # f4 rows [0, 2): two column blocks of 1 + 3 elements
    ranks[0]["chunks"].append(dict(cols, local_shape=[2, 1]))
    ranks[1]["chunks"].append(dict(cols, global_offset=[0, 1], local_shape=[2, 3]))
    manifest = {"format": "fc-layout-manifest", "version": 1,
                "tensors": [{"key": t["key"], "dtype": t["dtype"], "global_shape": t["global_shape"]}
                            for t in info["tensors"]], "ranks": ranks}
    man = os.path.join(tmp, "subbyte-rows.json")
    with open(man, "w") as f:
        json.dump(manifest, f)
    conv = os.path.join(tmp, "subbyte-fc")
    run([CONVERT, src, conv, "--quiet", "--target-manifest", man])
    run([INSPECT, conv, "--verify"])
    conv_info = json.loads(run([INSPECT, conv, "--json"]).stdout)
    assert sum(len(t["chunks"]) for t in conv_info["tensors"]) == 9, conv_info
    out = os.path.join(tmp, "subbyte-fc-export")
    run([EXPORT, conv, out, "--quiet"])
    with open(src, "rb") as a, open(os.path.join(out, "model.safetensors"), "rb") as b:
        assert a.read() == b.read(), "subbyte through fc distcp row splits is not byte-identical"
    # A layout counted in values (the header's F4 [4, 8]) does not match the tensor.
    bad = json.loads(json.dumps(manifest))
    bad["tensors"][[t["key"] for t in bad["tensors"]].index("f4")]["global_shape"] = [4, 8]
    with open(man, "w") as f:
        json.dump(bad, f)
    p = run([CONVERT, src, os.path.join(tmp, "bad"), "--quiet", "--target-manifest", man], expect=3)
    assert "f4" in p.stderr, p.stderr
    # torch DCP cannot hold them.
    p = run([CONVERT, src, os.path.join(tmp, "dcp"), "--quiet", "--output-format", "torch-dcp",
             "--target-like", src], expect=3)
    assert "float4_e2m1fn_x2 (safetensors F4) cannot be written to torch DCP" in p.stderr or \
        "F6_E" in p.stderr, p.stderr
    # Rows of 3 F4 values (12 bits) are not whole bytes: refused, naming tensor and sizes.
    for tool in (INSPECT, EXPORT):
        args = [tool, os.path.join(st, "f4_odd_rows.safetensors")]
        if tool == EXPORT:
            args += [os.path.join(tmp, "odd"), "--quiet"]
        p = run(args, expect=6)
        assert "tensor 'w' (F4 [2, 3]): its rows of 3 values are 12 bits, not whole bytes" in \
            p.stderr, p.stderr
    print("ok sub-byte")


def case_hf_dcp(tmp):
    hf = os.path.join(TESTDATA, "hf_dcp")
    with open(os.path.join(hf, "plain", "model.safetensors"), "rb") as f:
        plain = f.read()
    for layout in ("distributed", "consolidated", "sharded_only", "sharded_only/sharded",
                   "consolidated/sharded"):
        out = os.path.join(tmp, layout.replace("/", "_"))
        run([EXPORT, os.path.join(hf, layout), out, "--quiet"])
        assert sorted(os.listdir(out)) == ["model.safetensors"], (layout, os.listdir(out))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            assert f.read() == plain, f"{layout}: export differs from plain/model.safetensors"
    # Paddle's load_state_dict on a plain HF directory writes an auto-generated metadata
    # pickle beside the files (load_state_dict.py: create_hf_ckpt_metadata,
    # "*.auto_generated.metadata"): the directory still reads as safetensors, the same bytes.
    import shutil
    auto = os.path.join(tmp, "paddle_auto")
    shutil.copytree(os.path.join(hf, "plain"), auto)
    for name in ("model.auto_generated.metadata", "0.metadata"):
        with open(os.path.join(auto, name), "wb") as f:
            f.write(b"\x80\x04N.")  # a pickle fc must not need
    out = os.path.join(tmp, "paddle_auto_export")
    run([EXPORT, auto, out, "--quiet"])
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        assert f.read() == plain, "a safetensors directory with Paddle's auto metadata differs"
    info = json.loads(run([INSPECT, os.path.join(hf, "distributed"), "--json"]).stdout)
    chunks = {t["key"]: t["chunks"] for t in info["tensors"]}
    assert len(chunks["w"]) == 2 and len(chunks["e"]) == 2 and len(chunks["b"]) == 1, chunks
    text = run([INSPECT, os.path.join(hf, "sharded_only")]).stdout
    assert "axis 1 in 2" in text, text
    print("ok hf_dcp")


with tempfile.TemporaryDirectory() as tmp:
    {"dtypes": case_dtypes, "hf_dcp": case_hf_dcp}[CASE](tmp)
