"""Checkpoints whose readers read data files when they open (safetensors headers, DeepSpeed,
Megatron legacy and Paddle pickles, UCP tensors, Megatron torch_dist's flat optimizer states), spread over per-process directories
(`{rank}`), files in subdirectories included (DeepSpeed tag dirs, Megatron iter and rank
dirs, UCP zero/<param>/): fc-export under mpirun gives the same bytes as one process on the
whole directory (issue 10, item 1). Each file lies on one process's disk only; `latest`
files and other metadata on the last process only.

usage: distributed_formats_test.py BUILD_ROOT TESTDATA
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA = sys.argv[1], sys.argv[2]
EXPORT, CONVERT = fcio.tools(BUILD, "fc-export", "fc-convert")
MPIRUN = shutil.which("mpirun")
if not MPIRUN:
    print("skipping: no mpirun")
    sys.exit(77)
MPI = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
       "self,vader", "-np"]
tmp = tempfile.mkdtemp(prefix="fc-dist-formats-")

# (name, checkpoint dir under testdata, extra export flags)
CASES = [
    ("deepspeed_zero2", "deepspeed/zero2/ckpt", ["--include-optimizer"]),
    ("deepspeed_pp2_tp2", "deepspeed/pp2_tp2/ckpt", []),
    ("deepspeed_ucp", "deepspeed/ucp/ckpt", ["--include-optimizer"]),
    ("deepspeed_moe_zero2", "deepspeed/moe_zero2/ckpt", ["--include-optimizer"]),
    ("megatron_tp2_pp2", "megatron_legacy/gpt_tp2_pp2/ckpt", ["--include-optimizer"]),
    ("megatron_moe_distopt", "megatron_legacy/moe_distopt/ckpt", ["--include-optimizer"]),
    ("safetensors_sharded", "safetensors/hf_sharded", []),
    ("paddle_tp2", "paddle_flex/tp2/ckpt", []),
    # torch DCP opens from its metadata, except Megatron's flat optimizer states, whose
    # params are found by reading the data (src/format/megatron/megatron_buckets.h)
    ("megatron_dp_buckets", "torch_dcp_adam/megatron_dp_buckets/ckpt", ["--include-optimizer"]),
    ("megatron_dp_zero", "torch_dcp_adam/megatron_dp_zero/ckpt", ["--include-optimizer"]),
]
METADATA = ("latest", "latest_universal", "latest_checkpointed_iteration.txt")


def split(src, dst, n):
    """Every file of `src` onto one of n per-process directories dst_{r}: round robin in name
    order, metadata-like files on the last process only."""
    files = sorted(os.path.relpath(os.path.join(d, f), src)
                   for d, _, names in os.walk(src) for f in names)
    for i, rel in enumerate(files):
        r = n - 1 if os.path.basename(rel) in METADATA or rel.endswith(".json") else i % n
        out = os.path.join(f"{dst}_{r}", rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), out)
    for r in range(n):
        os.makedirs(f"{dst}_{r}", exist_ok=True)


def main():
    checked = 0
    for name, rel, flags in CASES:
        src = os.path.join(TESTDATA, rel)
        if not os.path.exists(src):
            raise SystemExit(f"missing fixture {src}")
        ref = os.path.join(tmp, name + "_ref")
        fcio.run([EXPORT, src, ref, "--quiet"] + flags)
        for n in (2, 3):
            parts = os.path.join(tmp, f"{name}_np{n}")
            split(src, parts, n)
            out = os.path.join(tmp, f"{name}_np{n}_out")
            r = subprocess.run(MPI + [str(n), EXPORT, parts + "_{rank}", out, "--quiet"] + flags,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (name, n, r.returncode, r.stdout, r.stderr)
            fcio.same_tree(ref, out, f"{name} np {n}")
            checked += 1
    # Convert too: the DeepSpeed ZeRO-2 checkpoint (with its optimizer states) to fc
    # distcp, split over 2 processes.
    src = os.path.join(TESTDATA, "deepspeed/zero2/ckpt")
    merge = os.path.join(tmp, "merge.json")
    with open(merge, "w") as f:
        f.write('{"degrees": {}}')  # every tensor whole on one rank
    ref = os.path.join(tmp, "convert_ref")
    fcio.run([CONVERT, src, ref, "--quiet", "--target-layout", merge])
    parts = os.path.join(tmp, "convert_np2")
    split(src, parts, 2)
    out = os.path.join(tmp, "convert_np2_out")
    r = subprocess.run(MPI + ["2", CONVERT, parts + "_{rank}", out, "--quiet", "--target-layout", merge],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, ("convert", r.returncode, r.stdout, r.stderr)
    a, b = os.path.join(tmp, "convert_ref_export"), os.path.join(tmp, "convert_np2_export")
    fcio.run([EXPORT, ref, a, "--quiet", "--include-optimizer"])
    fcio.run([EXPORT, out, b, "--quiet", "--include-optimizer"])
    fcio.same_tree(a, b, "convert np 2")
    # A directory that only one process has, named like another format's metadata (an empty
    # `.metadata`): that process alone would detect torch DCP and skip the fetch protocol
    # process 0 runs (a hang); process 0's detection holds for all.
    src = os.path.join(TESTDATA, "safetensors/hf_sharded")
    ref = os.path.join(tmp, "odd_dir_ref")
    fcio.run([EXPORT, src, ref, "--quiet"])
    parts = os.path.join(tmp, "odd_dir")
    split(src, parts, 2)
    os.makedirs(parts + "_1/.metadata")
    out = os.path.join(tmp, "odd_dir_out")
    r = subprocess.run(MPI + ["2", EXPORT, parts + "_{rank}", out, "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, ("odd dir", r.returncode, r.stdout, r.stderr)
    fcio.same_tree(ref, out, "odd dir")
    # The input with a trailing slash: readers then build "dir//name".
    src = os.path.join(TESTDATA, "deepspeed/zero2/ckpt")
    ref = os.path.join(tmp, "slash_ref")
    fcio.run([EXPORT, src, ref, "--quiet"])
    parts = os.path.join(tmp, "slash")
    split(src, parts, 2)
    out = os.path.join(tmp, "slash_out")
    r = subprocess.run(MPI + ["2", EXPORT, parts + "_{rank}/", out, "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, ("trailing slash", r.returncode, r.stdout, r.stderr)
    fcio.same_tree(ref, out, "trailing slash")
    print(f"ok: {checked} split exports and a split convert give one process's bytes")


try:
    main()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
