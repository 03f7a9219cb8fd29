"""fc-export and fc-convert --overwrite (issue 32 item 7): OUT is replaced only once the
new output is complete; without the flag a full OUT is refused (exit 8) with the hint; a
directory that holds no checkpoint, a file or a symlink is never replaced; a failed run
leaves the old output byte for byte; nothing is left beside OUT.

usage: overwrite_test.py BUILD_ROOT TESTDATA
"""
import filecmp
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA = sys.argv[1], sys.argv[2]
EXPORT, CONVERT = fcio.tools(BUILD, "fc-export", "fc-convert")
SAMPLE = os.path.join(TESTDATA, "fc_distcp", "sample")
tmp = tempfile.mkdtemp(prefix="fc-overwrite-")


def run(args, expect=0):
    return fcio.run(args, expect, 120)


def dtypes(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def beside(parent):
    """Names in `parent` other than the expected ones: staging, old copies, locks."""
    return sorted(n for n in os.listdir(parent) if ".fc-" in n)


try:
    out = os.path.join(tmp, "out")
    run([EXPORT, SAMPLE, out, "-q"])
    model = os.path.join(out, "model.safetensors")
    assert "F32" in dtypes(model), dtypes(model)
    # Without the flag: refused, with the hint, OUT untouched; the dry run says the same.
    before = fcio.snapshot(out)
    for extra in ([], ["--dry-run"]):
        p = run([EXPORT, SAMPLE, out, "-q", *extra], expect=8)
        assert "output directory exists and is not empty (--overwrite replaces a checkpoint " \
            "there)" in p.stderr, p.stderr
    assert fcio.snapshot(out) == before
    # With it: the dry run passes and writes nothing; the run replaces OUT.
    run([EXPORT, SAMPLE, out, "-q", "--overwrite", "--dry-run"])
    assert fcio.snapshot(out) == before
    run([EXPORT, SAMPLE, out, "-q", "--overwrite", "--dtype", "bfloat16"])
    assert "BF16" in dtypes(model) and "F32" not in dtypes(model), dtypes(model)
    assert beside(tmp) == [], beside(tmp)
    assert os.listdir(out) == ["model.safetensors"], os.listdir(out)

    # A run that fails (a data file cut short) leaves the old output as it was.
    broken = os.path.join(tmp, "broken")
    shutil.copytree(SAMPLE, broken)
    data = os.path.join(broken, "1_0.distcp")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    before = fcio.snapshot(out)
    p = subprocess.run([EXPORT, broken, out, "-q", "--overwrite"], capture_output=True,
                       text=True)
    assert p.returncode not in (0, 8), (p.returncode, p.stderr)
    assert "1_0.distcp" in p.stderr, p.stderr
    assert fcio.snapshot(out) == before
    assert beside(tmp) == [], beside(tmp)

    # Never replaced: a directory of other files, a file, a symlink to a checkpoint.
    notes = os.path.join(tmp, "notes")
    os.mkdir(notes)
    with open(os.path.join(notes, "todo.txt"), "w") as f:
        f.write("keep me\n")
    p = run([EXPORT, SAMPLE, notes, "-q", "--overwrite"], expect=8)
    assert "--overwrite replaces a checkpoint directory only, and this one holds no " \
        "checkpoint fc recognizes (1 entries, e.g. 'todo.txt')" in p.stderr, p.stderr
    run([EXPORT, SAMPLE, notes, "-q", "--overwrite", "--dry-run"], expect=8)
    assert open(os.path.join(notes, "todo.txt")).read() == "keep me\n"
    a_file = os.path.join(tmp, "a_file")
    with open(a_file, "w") as f:
        f.write("x")
    p = run([EXPORT, SAMPLE, a_file, "-q", "--overwrite"], expect=8)
    assert "output exists and is not a directory; --overwrite replaces a directory only" \
        in p.stderr, p.stderr
    link = os.path.join(tmp, "link")
    os.symlink(out, link)
    before = fcio.snapshot(out)
    p = run([EXPORT, SAMPLE, link, "-q", "--overwrite"], expect=8)
    assert "not a directory" in p.stderr, p.stderr
    assert fcio.snapshot(out) == before and os.path.islink(link)

    # fc-convert: an fc distcp output replaced by a torch DCP one; an empty OUT needs no flag.
    mixed = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
    conv = os.path.join(tmp, "conv")
    os.mkdir(conv)
    run([CONVERT, mixed, conv, "--target-like", mixed, "-q"])
    assert os.path.exists(os.path.join(conv, "fc.metadata.json"))
    run([CONVERT, mixed, conv, "--target-like", mixed, "--output-format", "torch-dcp", "-q"],
        expect=8)
    run([CONVERT, mixed, conv, "--target-like", mixed, "--output-format", "torch-dcp", "-q",
         "--overwrite"])
    assert os.path.exists(os.path.join(conv, ".metadata"))
    assert not os.path.exists(os.path.join(conv, "fc.metadata.json"))
    # The replacement is the whole new output: it exports to the source's bytes.
    run([EXPORT, conv, os.path.join(tmp, "check"), "-q"])
    run([EXPORT, mixed, os.path.join(tmp, "want"), "-q"])
    assert filecmp.cmp(os.path.join(tmp, "check", "model.safetensors"),
                       os.path.join(tmp, "want", "model.safetensors"), shallow=False)
    assert beside(tmp) == [], beside(tmp)
    print("overwrite: OK")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
