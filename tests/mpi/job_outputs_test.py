"""fc-convert --output-format ucp and deepspeed under mpirun (issue 33: one job path): the
param files / archives are shared out among the processes like every plan's files; the
output must be byte-identical to the single-process run's, at -np 2 and at -np 3, from the
committed fixtures (testdata/deepspeed, testdata/torch_dcp_adam); a refusal is reported
once and leaves nothing behind.

usage: job_outputs_test.py BUILD_ROOT TESTDATA CASE   (CASE: ucp|deepspeed)
"""
import os
import shutil
import sys
import tempfile

BUILD, TESTDATA, CASE = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import fcio  # noqa: E402

CONVERT = os.path.join(BUILD, "tools", "fc-convert")
DS = os.path.join(TESTDATA, "deepspeed")
tmp = tempfile.mkdtemp(prefix="fc-mpi-job-test-")


def mpirun():
    found = shutil.which("mpirun")
    if not found:
        print("skipping: no mpirun")
        sys.exit(77)
    return [found, "--allow-run-as-root", "--oversubscribe", "-np"]


def walk(root):
    """Every file under root (relative paths), sorted."""
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def same_tree(a, b, label):
    fa, fb = walk(a), walk(b)
    assert fa == fb, (label, fa, fb)
    for f in fa:
        with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
            assert x.read() == y.read(), (label, f)


def no_leftovers(parent):
    left = [n for n in os.listdir(parent) if ".fc-tmp-" in n]
    assert not left, left


def compare(label, src, flags, nps=(2, 3)):
    """Runs src -> OUT once alone and under mpirun -np N; each OUT in its own parent (a UCP
    writes <parent>/latest_universal), compared with the parent."""
    single = os.path.join(tmp, label, "np1")
    os.makedirs(single)
    fcio.run([CONVERT, src, os.path.join(single, "out"), "--quiet", *flags])
    for np_ in nps:
        multi = os.path.join(tmp, label, f"np{np_}")
        os.makedirs(multi)
        fcio.run([*mpirun(), str(np_), CONVERT, src, os.path.join(multi, "out"), "--quiet",
                  *flags])
        same_tree(single, multi, f"{label} -np {np_}")
        no_leftovers(multi)
        print(f"ok {label} -np {np_}: byte-identical to the single-process run")


def case_ucp():
    for case in ["zero1", "zero2", "bf16", "zero3", "pp2_tp2", "tp2_ucp", "legacy", "ucp",
                 "ucp_zero3"]:
        compare("ucp-" + case, os.path.join(DS, case, "ckpt"), ["--output-format", "ucp"])
    compare("ucp-tp2-inject", os.path.join(DS, "tp2", "ckpt"),
            ["--output-format", "ucp", "--inject-missing-state"])
    # Sources DeepSpeed did not write: the model states and optimizer state written by fc.
    fsdp = os.path.join(TESTDATA, "torch_dcp_adam", "fsdp_adam", "ckpt")
    compare("ucp-fsdp", fsdp, ["--output-format", "ucp"])
    compare("ucp-fsdp-zero3", fsdp, ["--output-format", "ucp", "--ucp-zero3"])
    # A tiny budget: many write items per file, spread over the processes' threads.
    compare("ucp-zero2-budget", os.path.join(DS, "zero2", "ckpt"),
            ["--output-format", "ucp", "--memory-budget", "64K", "--threads", "2"], nps=(2,))
    # A refusal at plan time: reported once, nothing written.
    out = os.path.join(tmp, "refused", "out")
    p = fcio.run([*mpirun(), "2", CONVERT, os.path.join(DS, "tp2", "ckpt"), out,
                  "--output-format", "ucp", "--quiet"], expect=None)
    assert p.returncode != 0 and p.stderr.count("fc-convert: error") == 1, p.stderr
    assert not os.path.exists(out)


def case_deepspeed():
    for case, dp in [("zero1", 3), ("zero2", 5), ("bf16", 3), ("bf16", 1), ("zero3", 4),
                     ("pp2", 3), ("tp2", 3), ("frozen_tied", 1), ("moe_zero2", 6),
                     ("moe_bf16", 2)]:
        compare(f"ds-{case}-dp{dp}", os.path.join(DS, case, "ckpt"),
                ["--output-format", "deepspeed", "--dp", str(dp)])
    compare("ds-zero3-budget", os.path.join(DS, "zero3", "ckpt"),
            ["--output-format", "deepspeed", "--dp", "3", "--memory-budget", "64K",
             "--threads", "2"], nps=(2,))
    busy = os.path.join(tmp, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep"), "w").write("x")
    p = fcio.run([*mpirun(), "2", CONVERT, os.path.join(DS, "zero1", "ckpt"), busy,
                  "--output-format", "deepspeed", "--dp", "3", "--quiet"], expect=8)
    assert p.stderr.count("fc-convert: error") == 1, p.stderr
    assert os.listdir(busy) == ["keep"]


try:
    {"ucp": case_ucp, "deepspeed": case_deepspeed}[CASE]()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
