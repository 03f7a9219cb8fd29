"""fc-inspect --verify reports every problem it finds, not only the first (issue 11 item 4).
Damaged checkpoints are built at test time from testdata.

usage: verify_test.py BUILD_ROOT TESTDATA CASE
CASE: fcdistcp | torchdcp | fcdistcp_open | torchdcp_open | safetensors_open
The *_open cases damage three files so that the checkpoint no longer opens (exit 5 without
--verify, on the first problem); --verify opens it leniently and lists all three.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
CONVERT, INSPECT, EXPORT = fcio.tools(BUILD, "fc-convert", "fc-inspect", "fc-export")
MIXED = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
tmp = tempfile.mkdtemp(prefix="fc-verify-")


def run(args, expect=0, limit=120):
    return fcio.run(args, expect, limit)


def check_reported(ckpt, needles, count):
    """Text and JSON reports list every needle; the count and the exit status are right."""
    p = run([INSPECT, ckpt, "--verify"], expect=11)
    assert f"verify: {count} problem(s)" in p.stdout, p.stdout
    for n in needles:
        assert any(all(part in line for part in n) for line in p.stdout.splitlines()), \
            f"{n} not on one line of the report:\n{p.stdout}"
    assert f"(and {count - 1} more)" in p.stderr, p.stderr
    j = json.loads(run([INSPECT, ckpt, "--verify", "--json"], expect=11).stdout)["verify"]
    assert not j["ok"] and j["problem_count"] == count and len(j["problems"]) == count, j
    for n in needles:
        assert any(all(part in json.dumps(q) for part in n) for q in j["problems"]), (n, j)


def case_fcdistcp():
    # Bytes flipped in three chunks of three tensors: three checksum mismatches, each named.
    ckpt = os.path.join(tmp, "fc")
    run([CONVERT, MIXED, ckpt, "--quiet", "--target-like", MIXED])
    run([INSPECT, ckpt, "--verify"])
    meta = json.load(open(os.path.join(ckpt, "fc.metadata.json")))
    damaged = []
    for t in meta["tensors"]:
        c = max(t["chunks"], key=lambda c: c["byte_length"])
        if c["byte_length"] == 0 or len(damaged) == 3:
            continue
        path = os.path.join(ckpt, c["file"])
        data = bytearray(open(path, "rb").read())
        data[c["byte_offset"] + c["byte_length"] // 2] ^= 0x10
        open(path, "wb").write(data)
        damaged.append((c["file"], t["key"], "xxh3-64 of the bytes is"))
    assert len(damaged) == 3, damaged
    check_reported(ckpt, damaged, 3)


def case_torchdcp():
    # Three item files of the torch DCP fixture with their torch.save archive damaged (zip
    # signature zeroed): each chunk fails to be located, and all three are reported.
    # (Item ranges past the end of a file are refused when the checkpoint is opened, exit 5;
    # --verify lists them: case_torchdcp_open.)
    ckpt = os.path.join(tmp, "dcp")
    subprocess.run(["cp", "-r", MIXED, ckpt], check=True)
    names = sorted(f for f in os.listdir(ckpt) if f.endswith(".distcp"))
    sizes = {f: os.path.getsize(os.path.join(ckpt, f)) for f in names}
    # The three largest items (tensor data; objects are small pickles).
    cut = sorted(names, key=lambda f: (-sizes[f], f))[:3]
    for f in cut:
        with open(os.path.join(ckpt, f), "r+b") as g:
            g.write(bytes(4))
    check_reported(ckpt, [(f,) for f in cut], 3)


def refused_at_open(ckpt, message):
    """Without --verify the damaged checkpoint does not open: exit 5 on the first problem."""
    p = run([INSPECT, ckpt], expect=5)
    assert message in p.stderr, p.stderr


def safetensors_header(path):
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), n, data


def case_fcdistcp_open():
    # Three open-time problems in three data files: one has bytes appended (its size is not
    # the metadata's), one's safetensors header names another dtype for a chunk than
    # fc.metadata.json, and the metadata places a chunk of the third past its end.
    ckpt = os.path.join(tmp, "fc-open")
    run([CONVERT, MIXED, ckpt, "--quiet", "--target-like", MIXED])
    meta_path = os.path.join(ckpt, "fc.metadata.json")
    meta = json.load(open(meta_path))
    files = [f["name"] for f in meta["files"]]
    assert len(files) >= 3, files
    grown, retyped, moved = files[:3]
    size = os.path.getsize(os.path.join(ckpt, grown))
    with open(os.path.join(ckpt, grown), "ab") as f:
        f.write(bytes(16))
    # A chunk entry of `retyped`: F32 <-> I32 (same size, so the header stays valid).
    path = os.path.join(ckpt, retyped)
    header, n, data = safetensors_header(path)
    swap = {"F32": "I32", "I32": "F32", "F16": "BF16", "BF16": "F16", "I64": "F64", "F64": "I64"}
    entry = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] in swap
                 and "@obj" not in k)
    old = header[entry]["dtype"]
    header[entry]["dtype"] = swap[old]
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n, (len(text), n)
    open(path, "wb").write(data[:8] + text + b" " * (n - len(text)) + data[8 + n:])
    retyped_key = entry.rsplit("@", 1)[0]
    # A chunk of `moved` placed past the end of its file.
    moved_size = os.path.getsize(os.path.join(ckpt, moved))
    t, c = next((t, c) for t in meta["tensors"] for c in t["chunks"]
                if c["file"] == moved and c["byte_length"] > 0)
    c["byte_offset"] = moved_size + 64
    json.dump(meta, open(meta_path, "w"))
    refused_at_open(ckpt, "fc.metadata.json")
    check_reported(ckpt, [
        (grown, f"file is {size + 16} bytes, fc.metadata.json says {size}"),
        (retyped, retyped_key, f"is {swap[old]}", f"fc.metadata.json says {old}"),
        (moved, t["key"], f"pass the end of the file ({moved_size} bytes)"),
    ], 3)


def case_torchdcp_open():
    # Three data files of the torch DCP fixture cut short by one byte: the item each holds
    # (two tensor chunks, one object) passes the end of its file.
    ckpt = os.path.join(tmp, "dcp-open")
    subprocess.run(["cp", "-r", MIXED, ckpt], check=True)
    j = json.loads(run([INSPECT, ckpt, "--json"]).stdout)
    chunk_files = [(c["file"], t["key"]) for t in j["tensors"] for c in t["chunks"]]
    object_files = [(o["file"], o["key"]) for o in j["objects"]]
    cut = [chunk_files[0], chunk_files[-1], object_files[0]]
    assert len({f for f, _ in cut}) == 3, cut
    for f, _ in cut:
        path = os.path.join(ckpt, f)
        os.truncate(path, os.path.getsize(path) - 1)
    refused_at_open(ckpt, "pass end of file")
    needles = [(f, key, "pass", "end of") for f, key in cut]
    check_reported(ckpt, needles, 3)
    # A data file gone as well (an object's): named, its item left out, the others still listed.
    gone, key = object_files[1]
    os.remove(os.path.join(ckpt, gone))
    p = run([INSPECT, ckpt], expect=4)
    assert gone in p.stderr, p.stderr
    check_reported(ckpt, needles + [(gone, f"data of object '{key}'; its items are left out")], 4)


def case_safetensors_open():
    # An HF export in several files; two are cut short (the last tensor of each passes the
    # end of its file), one has 8 bytes appended (the data buffer is longer than its
    # tensors, a tiling error).
    ckpt = os.path.join(tmp, "st-open")
    run([EXPORT, MIXED, ckpt, "--quiet", "--max-shard-size", "150"])
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    assert len(files) >= 3, files
    needles = []
    for f in files[:2]:
        path = os.path.join(ckpt, f)
        header, n, data = safetensors_header(path)
        last = max((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][1])
        assert header[last]["data_offsets"][1] > header[last]["data_offsets"][0], (f, header)
        os.truncate(path, len(data) - 1)
        needles.append((f, last, "pass the end of the file"))
    with open(os.path.join(ckpt, files[2]), "ab") as g:
        g.write(bytes(8))
    needles.append((files[2], "but the tensors end at"))
    refused_at_open(ckpt, ".safetensors: ")
    check_reported(ckpt, needles, 3)


fcio.run_case(globals(), CASE, tmp)
print("ok")
