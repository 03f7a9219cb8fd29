"""The committed torch 1.13 DCP fixtures are what their generators write today (issue 34
item 3): testdata/gen/torch_dcp/regen.sh and testdata/gen/megatron/regen.sh run into a
temporary directory with the repository's copies of the fixture writer and shim
(tests/support), and every file they write must equal the committed one byte for byte. Each
generator asserts, while it writes, that its expected values equal the values it built the
files from (dcp_truth.py), so the committed expected values are tied to that ground truth
from a plain clone.

usage: /usr/bin/python3 torch_dcp_generators_test.py SOURCE_ROOT
Skips (77), saying why, without Debian's torch 1.13 or the zstd CLI.
"""
import filecmp
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import fcio  # noqa: E402


def main():
    src = sys.argv[1]
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"skipping: the generators need Debian's torch 1.13 and numpy ({e})")
        return 77
    if shutil.which("zstd") is None:
        print("skipping: the torch2 generator needs the zstd CLI (apt-get install zstd)")
        return 77
    with fcio.temp_dir("fc-torch-gen-") as tmp:
        env = dict(os.environ, FC_TESTDATA_OUT=tmp)
        env.pop("FC_TOOLS", None)
        for script in ("testdata/gen/torch_dcp/regen.sh", "testdata/gen/megatron/regen.sh"):
            p = subprocess.run([os.path.join(src, script)], env=env, capture_output=True,
                               text=True)
            if p.returncode != 0:
                print(p.stdout[-4000:], p.stderr[-4000:])
                print(f"FAIL: {script} exited {p.returncode}")
                return 1
        written = bad = 0
        for root, dirs, files in os.walk(tmp):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                fresh = os.path.join(root, f)
                rel = os.path.relpath(fresh, tmp)
                committed = os.path.join(src, "testdata", rel)
                written += 1
                if not os.path.exists(committed):
                    print(f"not committed: testdata/{rel}")
                    bad += 1
                elif not filecmp.cmp(fresh, committed, shallow=False):
                    print(f"differs from the committed file: testdata/{rel}")
                    bad += 1
        if written < 100:
            print(f"FAIL: the generators wrote only {written} files")
            return 1
        if bad:
            print(f"FAIL: {bad} of {written} regenerated files differ from testdata/")
            return 1
        print(f"{written} regenerated files equal the committed testdata/ byte for byte")
        return 0


if __name__ == "__main__":
    sys.exit(main())
