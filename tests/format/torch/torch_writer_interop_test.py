#!/usr/bin/env python3
"""Interop test of fc's TorchDcpWriter against real torch 1.13 (meson suite interop,torch).

usage: torch_writer_interop_test.py TORCH_DCP_REWRITE TORCH_LOAD_CHECK_PY
env:   FC_TESTDATA (testdata/) as set by tests/meson.build

For each real torch fixture (testdata/torch_dcp), torch_dcp_rewrite reads it with fc's
reader and writes it again with TorchDcpWriter (1.13 generation) under a new random chunk
layout; torch_load_check.py then makes real torch load the result into the saved sharding,
into one whole copy on rank 0, and into a different split, comparing every element with the
values torch itself saved (the fixture's expected/*.npy) and every object with the fixture's
spec. Also:
  - a checkpoint whose .metadata spans several pickle frames and SETITEMS batches (1100
    single-row chunks);
  - a negative control: one flipped tensor byte must be caught (by the zip CRC check, and by
    the value comparison when the CRC check is off), so the checks are not vacuous;
  - the 2.x generation, which no torch here can load: its .metadata goes through CPython's
    unpickler with stub classes and must name exactly the ~2.3+ classes of formats.md 2.3.
Exit status 0 pass, 1 fail, 77 skipped (torch not importable).
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

SKIP = 77
PY = "/usr/bin/python3"

rewrite, check = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(check)))
import torch_load_check as tlc  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import fcio  # noqa: E402

testdata = os.environ.get("FC_TESTDATA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "testdata")
fixtures = os.path.join(testdata, "torch_dcp")
specs = os.path.join(testdata, "gen", "torch_dcp")
failures = []


def objects_of(name):
    if name == "strided":  # testdata/gen/torch_dcp/make_strided.py
        return {"step": 7, "cfg": {"a": [1, 2], "b": "x"}}
    path = os.path.join(specs, name + ".json")
    with open(path) as f:
        return json.load(f).get("objects", {})


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    return p.returncode


def torch_check(ckpt, expected, objects, layouts, extra=()):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(objects, f)
    try:
        rc = run([PY, check, ckpt, expected, "--objects", f.name, "--layout", layouts, *extra])
    finally:
        os.unlink(f.name)
    if rc == SKIP:
        print("torch cannot be imported: skipping")
        sys.exit(SKIP)
    return rc


def rewrite_cmd(src, out, generation, ranks, files, seed, pieces=3, extra=()):
    return [rewrite, src, out, "--generation", generation, "--ranks", str(ranks),
            "--files-per-rank", str(files), "--seed", str(seed), "--max-pieces", str(pieces),
            "--threads", "3", *extra]


def data_record_offset(ckpt, rel, offset, length):
    """Absolute file offset of the first byte of archive/data/0 of the item at `offset`."""
    with open(os.path.join(ckpt, rel), "rb") as f:
        f.seek(offset)
        blob = f.read(length)
    info = zipfile.ZipFile(io.BytesIO(blob)).getinfo("archive/data/0")
    h = info.header_offset
    name_len = int.from_bytes(blob[h + 26:h + 28], "little")
    extra_len = int.from_bytes(blob[h + 28:h + 30], "little")
    return offset + h + 30 + name_len + extra_len, info.file_size


def expected_globals(generation, md_globals):
    if generation == "1.13":
        m = "torch.distributed._shard.checkpoint.metadata."
        p = "torch.distributed._shard.sharded_tensor.metadata."
        required = {m + "Metadata", m + "TensorStorageMetadata", m + "ChunkStorageMetadata",
                    m + "MetadataIndex", p + "TensorProperties", p + "MEM_FORMAT_ENCODING",
                    "torch.distributed._shard.checkpoint.filesystem._StorageInfo",
                    "builtins.getattr"}
    elif generation == "2.0":  # torch 2.0-2.3: TensorProperties at its 2.0-2.2 home
        m = "torch.distributed.checkpoint.metadata."
        p = "torch.distributed._shard.sharded_tensor.metadata."
        required = {m + "Metadata", m + "TensorStorageMetadata", m + "ChunkStorageMetadata",
                    m + "MetadataIndex", p + "TensorProperties", p + "MEM_FORMAT_ENCODING",
                    "torch.distributed.checkpoint.filesystem._StorageInfo"}
    else:  # torch 2.4+: storage_meta with a pathlib checkpoint_id
        m = "torch.distributed.checkpoint.metadata."
        required = {m + "Metadata", m + "TensorStorageMetadata", m + "ChunkStorageMetadata",
                    m + "MetadataIndex", m + "TensorProperties", m + "_MEM_FORMAT_ENCODING",
                    "torch.distributed.checkpoint.filesystem._StorageInfo",
                    m + "StorageMeta", "pathlib.PosixPath"}
    allowed = required | {m + "BytesStorageMetadata", "torch.Size",
                          "torch.serialization._get_layout"}
    allowed |= {g for g in md_globals if g.startswith("torch.") and g.count(".") == 1}  # dtypes
    return required, allowed


def check_structure(ckpt, generation, fixture):
    """CPython unpickles .metadata (stub classes); the class paths are the generation's."""
    md, globs = tlc.load_metadata_stub(os.path.join(ckpt, ".metadata"))
    tlc.zip_check(ckpt, md)
    required, allowed = expected_globals(generation, globs)
    where = f"{fixture} ({generation})"
    if not required <= globs:
        failures.append(f"{where}: .metadata lacks {sorted(required - globs)}")
    if not globs <= allowed:
        failures.append(f"{where}: .metadata names unexpected {sorted(globs - allowed)}")
    if type(md).__name__ != "Metadata":
        failures.append(f"{where}: root is {type(md).__name__}")
    planner = getattr(md, "planner_data", "absent")
    if generation in ("2", "2.0"):
        want = {k: (k,) for k in md.state_dict_metadata}
        if planner != want:
            failures.append(f"{where}: planner_data {planner!r}, expected {want!r}")
        want_version = "1.0.0" if generation == "2" else None
        if getattr(md, "version", None) != want_version:
            failures.append(f"{where}: version {getattr(md, 'version', None)!r}")
        if (getattr(md, "storage_meta", None) is None) != (generation == "2.0"):
            failures.append(f"{where}: storage_meta {getattr(md, 'storage_meta', None)!r}")
    elif planner is not None or hasattr(md, "version"):
        failures.append(f"{where}: 1.13 metadata has planner_data/version")
    return md


def main():
    cases = [  # fixture, ranks, files per rank, seed
        ("even_2d_f32", 3, 2, 11),
        ("uneven_1d_bf16", 2, 1, 12),
        ("mixed", 3, 2, 13),
        ("strided", 2, 2, 14),
    ]
    with fcio.temp_dir("fc_torch_writer_interop_") as work:
        for name, ranks, files, seed in cases:
            src = os.path.join(fixtures, name, "ckpt")
            expected = os.path.join(fixtures, name, "expected")
            for generation in ("1.13", "2.0", "2"):
                out = os.path.join(work, f"{name}_{generation}")
                if run(rewrite_cmd(src, out, generation, ranks, files, seed)) != 0:
                    failures.append(f"{name}: torch_dcp_rewrite --generation {generation} failed")
                    continue
                check_structure(out, generation, name)
                if generation == "1.13" and torch_check(out, expected, objects_of(name),
                                                        "saved,whole,resplit") != 0:
                    failures.append(f"{name}: torch could not load fc's checkpoint")

        # Large .metadata: several 64 KiB pickle frames, batches of 1000 dict items.
        out = os.path.join(work, "synthetic")
        exp = os.path.join(work, "synthetic_expected")
        os.makedirs(exp)
        for f in os.listdir(os.path.join(fixtures, "even_2d_f32", "expected")):
            shutil.copy(os.path.join(fixtures, "even_2d_f32", "expected", f), exp)
        src = os.path.join(fixtures, "even_2d_f32", "ckpt")
        if run(rewrite_cmd(src, out, "1.13", 2, 1, 15, extra=(
                "--synthetic-rows", "1100", "--synthetic-npy", os.path.join(exp, "synthetic.npy")))) != 0:
            failures.append("synthetic: torch_dcp_rewrite failed")
        else:
            if os.path.getsize(os.path.join(out, ".metadata")) <= 2 * 64 * 1024:
                failures.append("synthetic: .metadata is smaller than two pickle frames")
            check_structure(out, "1.13", "synthetic")
            if torch_check(out, exp, objects_of("even_2d_f32"), "saved,resplit") != 0:
                failures.append("synthetic: torch could not load fc's checkpoint")

        # Negative control: flip one tensor byte of an fc checkpoint.
        src = os.path.join(work, "even_2d_f32_1.13")
        bad = os.path.join(work, "corrupt")
        shutil.copytree(src, bad)
        md, _ = tlc.load_metadata_stub(os.path.join(bad, ".metadata"))
        index, info = next((k, v) for k, v in md.storage_data.items()
                           if getattr(k, "offset", None) is not None)
        pos, size = data_record_offset(bad, info.relative_path, info.offset, info.length)
        assert size > 0
        with open(os.path.join(bad, info.relative_path), "r+b") as f:
            f.seek(pos + size - 1)
            b = f.read(1)
            f.seek(pos + size - 1)
            f.write(bytes([b[0] ^ 0x40]))
        try:
            tlc.zip_check(bad, md)
            failures.append("negative control: the zip check missed a flipped tensor byte")
        except RuntimeError as e:
            print(f"negative control (zip): caught: {e}")
        if torch_check(bad, os.path.join(fixtures, "even_2d_f32", "expected"), {},
                       "saved", extra=("--no-zip-check",)) != 1:
            failures.append("negative control: torch_load_check did not report a flipped byte")
        else:
            print("negative control (values): caught")

    for f in failures:
        print("FAIL:", f)
    print("torch writer interop:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
