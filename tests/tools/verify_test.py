"""fc-inspect --verify reports every problem it finds, not only the first (issue 11 item 4).
Damaged checkpoints are built at test time from testdata.

usage: verify_test.py BUILD_ROOT TESTDATA CASE
CASE: fcdistcp | torchdcp
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
TOOLS = os.path.join(BUILD, "tools")
CONVERT, INSPECT = (os.path.join(TOOLS, t) for t in ("fc-convert", "fc-inspect"))
MIXED = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
tmp = tempfile.mkdtemp(prefix="fc-verify-")


def run(args, expect=0, limit=120):
    p = subprocess.run(["timeout", str(limit), *args], capture_output=True, text=True)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p


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
    # (Item ranges past the end of a file are refused when the checkpoint is opened, exit 5.)
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


{"fcdistcp": case_fcdistcp, "torchdcp": case_torchdcp}[CASE]()
print("ok")
