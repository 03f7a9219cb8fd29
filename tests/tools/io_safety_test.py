"""The tools' input and output safety, end to end (fc/io/env.h, fc/io/output_dir.h).

usage: io_safety_test.py BUILD_ROOT TESTDATA CASE
CASE: fifo | symlink | nested | lock | sigterm | sigkill
"""
import fcntl
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
EXPORT, INSPECT, CONVERT = fcio.tools(BUILD, "fc-export", "fc-inspect", "fc-convert")
MAKE_CKPT = os.path.join(BUILD, "bench", "make_synthetic_ckpt")
FIXTURE = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
tmp = tempfile.mkdtemp(prefix="fc-io-safety-")
# Every tensor whole on one rank (a layout of degrees only: no preset names these tensors).
MERGE = os.path.join(tmp, "merge.json")
with open(MERGE, "w") as f:
    f.write('{"degrees": {}}')


def run(args, expect=0, limit=60):
    # Every tool runs under a time limit: a FIFO that made a tool block would show as 124.
    p = fcio.run(args, None, limit)
    assert p.returncode != 124, f"{args}: timed out (blocked?)\n{p.stderr}"
    fcio.check_exit(p, args, expect)
    return p


def leftovers(out):
    return sorted(glob.glob(out + ".fc-tmp-*") + glob.glob(out + ".fc-lock"))


def copy_fixture(name):
    d = os.path.join(tmp, name)
    shutil.copytree(FIXTURE, d)
    return d


def case_fifo():
    # A FIFO in place of a data file, and of the metadata: refused with exit 3 naming the
    # path, without blocking (run() fails on a timeout).
    for victim in ("__0_0.distcp", ".metadata"):
        ckpt = copy_fixture("fifo-" + victim.strip("."))
        path = os.path.join(ckpt, victim)
        os.remove(path)
        os.mkfifo(path)
        out = os.path.join(tmp, "out-fifo-" + victim.strip("."))
        for args in ([EXPORT, ckpt, out, "--quiet"], [INSPECT, ckpt],
                     [CONVERT, ckpt, out + "-c", "--quiet", "--target-like", FIXTURE]):
            p = run(args, expect=3, limit=20)
            assert "is a FIFO, expected a regular file" in p.stderr and victim in p.stderr, p.stderr
        assert not os.path.exists(out) and not leftovers(out), leftovers(out)
    print("ok fifo")


def case_symlink():
    ckpt = copy_fixture("links")
    outside = os.path.join(tmp, "outside")
    os.makedirs(outside)
    # One data file moved out of the checkpoint and linked back; another linked inside.
    shutil.move(os.path.join(ckpt, "__1_0.distcp"), os.path.join(outside, "__1_0.distcp"))
    os.symlink(os.path.join(outside, "__1_0.distcp"), os.path.join(ckpt, "__1_0.distcp"))
    shutil.move(os.path.join(ckpt, "__2_0.distcp"), os.path.join(ckpt, "real_2_0"))
    os.symlink("real_2_0", os.path.join(ckpt, "__2_0.distcp"))
    for tool, args in (("fc-inspect", [INSPECT, ckpt, "--verify"]),
                       ("fc-export", [EXPORT, ckpt, os.path.join(tmp, "links-out"), "--quiet"]),
                       ("fc-convert", [CONVERT, ckpt, os.path.join(tmp, "links-conv"), "--quiet",
                                       "--target-like", FIXTURE])):
        p = run(args, expect=3)
        assert "outside the checkpoint directory" in p.stderr and "--follow-symlinks" in p.stderr, p.stderr
        assert "__1_0.distcp" in p.stderr, p.stderr
        run(args + ["--follow-symlinks"])
    clean = os.path.join(tmp, "links-clean")
    run([EXPORT, FIXTURE, clean, "--quiet"])
    assert fcio.snapshot(clean) == fcio.snapshot(os.path.join(tmp, "links-out"))
    print("ok symlink")


def case_nested():
    ckpt = copy_fixture("nest")
    before = fcio.snapshot(ckpt)
    for out in (ckpt, os.path.join(ckpt, "out"), ckpt + "/", tmp):
        for args in ([EXPORT, ckpt, out, "--quiet"],
                     [CONVERT, ckpt, out, "--quiet", "--target-like", FIXTURE]):
            p = run(args, expect=3)
            assert "input" in p.stderr, p.stderr
    assert fcio.snapshot(ckpt) == before, "the input changed"
    # fc-export, like fc-convert, writes only into a new or empty OUT.
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    open(os.path.join(full, "notes.txt"), "w").write("mine")
    p = run([EXPORT, ckpt, full, "--quiet"], expect=8)
    assert "not empty" in p.stderr, p.stderr
    assert os.listdir(full) == ["notes.txt"]
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    run([EXPORT, ckpt, empty, "--quiet"])
    assert os.listdir(empty) == ["model.safetensors"], os.listdir(empty)
    assert not leftovers(empty)
    # --objects inside OUT: written with the export.
    withobj = os.path.join(tmp, "withobj")
    run([EXPORT, ckpt, withobj, "--quiet", "--objects", os.path.join(withobj, "objects")])
    assert sorted(os.listdir(withobj)) == ["model.safetensors", "objects"], os.listdir(withobj)
    assert len(os.listdir(os.path.join(withobj, "objects"))) == 3
    print("ok nested")


def big_checkpoint():
    src = os.path.join(tmp, "big")
    run([MAKE_CKPT, src, "96000000", "2", "256"], limit=300)
    return src


SLOW_BUDGETS = {}


def staged_bytes(staging):
    total = 0
    for root, _, files in os.walk(staging):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def start_slow(tool, src, out):
    """Starts TOOL on SRC -> OUT and returns it stopped (SIGSTOP) inside its data writes:
    its staging directory holds bytes and nothing is committed. Stopping it, rather than
    hoping it is still running after a sleep, keeps this independent of the machine's
    speed: a fast disk ends a slow-budget run in well under a second. Signal it with
    signal_stopped (or kill it)."""
    # 8 KiB for tensor data beyond what the job's own bookkeeping needs (the minimum the tool
    # names for a budget of 1 byte): slabs of ~700 elements, many small writes. (The
    # bookkeeping, ~15 MiB of plan plus the process itself, sits near the 32 MiB the budget
    # leaves uncharged, and where exactly depends on the allocator: a fixed budget of 8 KiB
    # was refused now and then.)
    args = [tool, src, out, "--quiet", "--threads", "1"]
    if tool == CONVERT:
        args += ["--target-layout", MERGE]
    else:
        args += ["--max-shard-size", "8MB", "--dtype", "float32"]
    for attempt in range(3):
        if tool not in SLOW_BUDGETS:
            probe = run(args + ["--memory-budget", "1"], expect=10)
            m = re.search(r"is below the (\d+) bytes", probe.stderr)
            assert m, probe.stderr
            SLOW_BUDGETS[tool] = int(m.group(1)) + 8192
        p = subprocess.Popen(args + ["--memory-budget", str(SLOW_BUDGETS[tool])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        staging = []
        while not staging:
            staging = glob.glob(out + ".fc-tmp-%d-*" % p.pid)
            if staging or p.poll() is not None:
                break
            assert time.time() < deadline, "no staging directory appeared"
            time.sleep(0.002)
        if staging:
            p.send_signal(signal.SIGSTOP)
        if p.poll() is None or p.returncode != 10 or attempt == 2:
            break
        # Refused: this run's process measured a little more of itself than the probe's
        # (the heap's huge pages). Probe again.
        p.communicate()
        del SLOW_BUDGETS[tool]
    assert p.poll() is None, f"{tool} ended before writing: {p.communicate()}"
    # Let it run in steps of 5 ms until its staging holds data: inside the data writes.
    while staged_bytes(staging[0]) == 0:
        assert time.time() < deadline, "no data written to the staging directory"
        p.send_signal(signal.SIGCONT)
        time.sleep(0.005)
        p.send_signal(signal.SIGSTOP)
        assert p.poll() is None, f"{tool} finished before the signal: {p.communicate()}"
    assert not os.path.exists(out), f"{tool} committed {out} before the signal"
    return p


def signal_stopped(p, sig):
    """Sends SIG to a process start_slow stopped, then lets it go on to handle it."""
    p.send_signal(sig)
    p.send_signal(signal.SIGCONT)


def case_lock():
    ckpt = copy_fixture("lock")
    out = os.path.join(tmp, "locked")
    # A lock held by another process (here: this one) is reported with its PID: exit 8.
    with open(out + ".fc-lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("%d\n" % os.getpid())
        f.flush()
        p = run([EXPORT, ckpt, out, "--quiet"], expect=8)
        assert "output in use by PID %d" % os.getpid() in p.stderr, p.stderr
        run([CONVERT, ckpt, out, "--quiet", "--target-like", FIXTURE], expect=8)
    # A stale lock file (holder gone) does not block.
    run([EXPORT, ckpt, out, "--quiet"])
    assert not leftovers(out), leftovers(out)
    # Two real runs at once: the second one is refused while the first writes.
    src = big_checkpoint()
    out2 = os.path.join(tmp, "concurrent")
    first = start_slow(EXPORT, src, out2)
    p = run([EXPORT, src, out2, "--quiet"], expect=8)
    assert "output in use by PID %d" % first.pid in p.stderr, p.stderr
    signal_stopped(first, signal.SIGTERM)
    first.communicate()
    print("ok lock")


def case_sigterm():
    src = big_checkpoint()
    for tool in (EXPORT, CONVERT):
        out = os.path.join(tmp, "term-" + os.path.basename(tool))
        for sig in (signal.SIGTERM, signal.SIGINT):
            p = start_slow(tool, src, out)
            signal_stopped(p, sig)
            _, err = p.communicate(timeout=60)
            assert p.returncode == 128 + sig, (p.returncode, err)
            assert "interrupted" in err, err
            assert not os.path.exists(out), os.listdir(out)
            assert not leftovers(out), leftovers(out)
        # The rerun succeeds.
        run([tool, src, out, "--quiet"] + (["--target-layout", MERGE] if tool == CONVERT else []),
            limit=300)
        assert os.listdir(out) and not leftovers(out)
    print("ok sigterm")


def case_sigkill():
    src = big_checkpoint()
    for tool in (EXPORT, CONVERT):
        out = os.path.join(tmp, "kill-" + os.path.basename(tool))
        p = start_slow(tool, src, out)
        p.kill()
        p.communicate()
        # OUT does not look complete: absent; the staging stays behind.
        assert not os.path.exists(out), os.listdir(out)
        assert glob.glob(out + ".fc-tmp-%d-*" % p.pid)
        extra = ["--target-layout", MERGE] if tool == CONVERT else ["--max-shard-size", "8MB"]
        r = run([tool, src, out, *extra], limit=300)
        assert "which is gone" in r.stderr, r.stderr  # the dead run's staging was swept
        assert not leftovers(out), leftovers(out)
        names = os.listdir(out)
        if tool == EXPORT:
            assert "model.safetensors.index.json" in names, names
        else:
            assert "fc.metadata.json" in names, names
        run([INSPECT, out, "--verify"], limit=300)
    print("ok sigkill")


fcio.run_case(globals(), CASE, tmp)
