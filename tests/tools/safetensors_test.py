#!/usr/bin/env python3
"""CLI checks of the newer safetensors inputs, read back with an independent reader
(testdata/gen/safetensors/stfile.py, json + numpy, no fc code):
  dtypes: U16/U32/U64, C64, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0 export bit for bit, every
          tensor of the output at a multiple of its element size (reference order);
          sub-byte F4/F6 files are refused as unsupported (6), a misaligned F4 as corrupt (5)
  hf_dcp: torch HuggingFaceStorageWriter layouts (distributed shards, consolidated + sharded/,
          sharded/ alone) export to exactly the bytes of the plain file of the same tensors;
          fc-inspect shows the split.
usage: safetensors_test.py BUILD_ROOT TESTDATA CASE   (CASE: dtypes|hf_dcp)
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(TESTDATA, "gen", "safetensors"))
import stfile  # noqa: E402

EXPORT = os.path.join(BUILD, "tools", "fc-export")
INSPECT = os.path.join(BUILD, "tools", "fc-inspect")


def run(args, expect=0):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != expect:
        raise AssertionError(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p


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
    for name in ("f4", "f6"):
        p = run([INSPECT, os.path.join(st, name + ".safetensors")], expect=6)
        assert "sub-byte" in p.stderr and ("'w4'" in p.stderr or "'w6'" in p.stderr), p.stderr
        run([EXPORT, os.path.join(st, name + ".safetensors"), os.path.join(tmp, "x" + name),
             "--quiet"], expect=6)
    p = run([INSPECT, os.path.join(st, "f4_misaligned.safetensors")], expect=5)
    assert "12 bits" in p.stderr, p.stderr
    print("ok dtypes")


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
    info = json.loads(run([INSPECT, os.path.join(hf, "distributed"), "--json"]).stdout)
    chunks = {t["key"]: t["chunks"] for t in info["tensors"]}
    assert len(chunks["w"]) == 2 and len(chunks["e"]) == 2 and len(chunks["b"]) == 1, chunks
    text = run([INSPECT, os.path.join(hf, "sharded_only")]).stdout
    assert "axis 1 in 2" in text, text
    print("ok hf_dcp")


with tempfile.TemporaryDirectory() as tmp:
    {"dtypes": case_dtypes, "hf_dcp": case_hf_dcp}[CASE](tmp)
