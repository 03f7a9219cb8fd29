"""--transport nccl (issue 10, item 4).

  refusal (unit): without mpirun, --transport is refused; --transport nccl says first what
      is missing: a build without NCCL (exit 6), no CUDA device (exit 8).
  refusal_mpi (mpi): under mpirun -np 2, a missing capability is one message, one exit
      code, no output.
  nccl (gpu): convert and export under mpirun -np 2 --transport nccl, the input split over
      per-process directories ({rank}), give the bytes of one process; every needed byte is
      read once and as many bytes are received as sent; a process killed mid-run fails the
      job and leaves no output. Exit 77 (skipped) without NCCL in the build, without a CUDA
      device, or without mpirun; a GPU that nvidia-smi lists but fc does not see fails.

usage: gpu_test.py BUILD_ROOT TESTDATA CASE HAVE_NCCL(true|false)
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE, HAVE_NCCL = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "true"
EXPORT, CONVERT = fcio.tools(BUILD, "fc-export", "fc-convert")
CKPT = os.path.join(TESTDATA, "hf_dcp", "sharded_only")
# This process may itself run under mpirun (meson does not, but a user might): the tools
# must not think so.
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith(("OMPI_", "PMI_", "PMIX_"))}


def target(tool):
    return ["--target-like", CKPT] if tool == CONVERT else []


def nccl_refusal(tool, out):
    """--transport nccl without mpirun: (exit code, stderr)."""
    p = fcio.run([tool, CKPT, out, "--transport", "nccl", *target(tool)], expect=None, env=ENV)
    return p.returncode, p.stderr


def gpu_listed():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    p = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return p.returncode == 0 and "GPU" in p.stdout


def case_refusal():
    with fcio.temp_dir("fc-gpu-test-") as tmp:
        out = os.path.join(tmp, "out")
        for tool in (EXPORT, CONVERT):
            name = os.path.basename(tool)
            code, err = nccl_refusal(tool, out)
            assert err.count(f"{name}: error:") == 1, err
            if not HAVE_NCCL:
                assert code == 6 and "built without NCCL" in err, (code, err)
            elif code == 8:
                assert "no CUDA device" in err and "cudaGetDeviceCount" in err, err
                assert not gpu_listed(), f"nvidia-smi lists a GPU, fc finds none: {err}"
            else:
                assert code == 2 and "--transport applies under mpirun only" in err, (code, err)
            p = fcio.run([tool, CKPT, out, "--transport", "mpi", *target(tool)], expect=2, env=ENV)
            assert "--transport applies under mpirun only" in p.stderr, p.stderr
            p = fcio.run([tool, CKPT, out, "--transport", "gloo", *target(tool)], expect=2, env=ENV)
            assert "--transport" in p.stderr and "nccl" in p.stderr, p.stderr
            assert not os.path.exists(out)
            print(f"ok {name}: --transport nccl here: exit {code}: {err.strip()}")


def case_refusal_mpi():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("skipping: no mpirun")
        sys.exit(77)
    with fcio.temp_dir("fc-gpu-test-") as tmp:
        out = os.path.join(tmp, "out")
        code, _ = nccl_refusal(EXPORT, out)
        if code == 2:
            print("skipping: this machine can run --transport nccl (the gpu suite tests it)")
            sys.exit(77)
        for tool in (EXPORT, CONVERT):
            name = os.path.basename(tool)
            p = fcio.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", tool, CKPT,
                          out, "--quiet", "--transport", "nccl", *target(tool)], expect=code)
            assert p.stderr.count(f"{name}: error:") == 1, p.stderr
            assert ("built without NCCL" if code == 6 else "no CUDA device") in p.stderr, p.stderr
            assert not os.path.exists(out)
            print(f"ok {name} np 2: exit {code}, one message")


def case_nccl():
    if not HAVE_NCCL:
        print("skipping: fc was built without NCCL")
        sys.exit(77)
    probe = tempfile.mkdtemp(prefix="fc-gpu-probe-")
    code, err = nccl_refusal(EXPORT, os.path.join(probe, "out"))
    shutil.rmtree(probe, ignore_errors=True)
    if code == 8:
        assert not gpu_listed(), f"nvidia-smi lists a GPU, fc finds none: {err}"
        print(f"skipping: {err.strip()}")
        sys.exit(77)
    assert code == 2, (code, err)
    sys.argv = [sys.argv[0], BUILD, TESTDATA, "split"]
    import distributed_test as dt  # exits 77 without mpirun

    try:
        src, layout = dt.source()
        for name, tool, flags in dt.jobs(layout):
            single = os.path.join(dt.tmp, f"{name}-single")
            fcio.run([tool, src, single, "--quiet", *flags])
            pattern = dt.split(src, 2) if name == "convert" else os.path.join(dt.tmp, "split-2", "ckpt_{rank}")
            for budget in ("64MiB", "256KiB"):  # one round; many rounds
                out = os.path.join(dt.tmp, f"{name}-nccl-{budget}")
                st = out + ".stats.json"
                fcio.run([*dt.MPI, "2", tool, pattern, out, "--quiet", "--transport", "nccl",
                          "--memory-budget", budget, "--stats", st, "--no-verify-checksums", *flags])
                fcio.same_tree(single, out, f"{name} nccl np 2 budget {budget}")
                dt.check_stats(dt.stats(st), f"{name} nccl np 2 {budget}", moved=True)
        # A process killed mid-run: the job fails, OUT does not appear.
        out = os.path.join(dt.tmp, "killed")
        big = os.path.join(dt.tmp, "big")
        fcio.run([dt.MAKE, big, str(48 * dt.MiB), "8", "512"])
        bigpattern = dt.split(big, 2, "bigsplit")
        killer = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (while ! ls -d "$OUT".fc-tmp-* '
                  '>/dev/null 2>&1; do sleep 0.01; done; kill -KILL $$) & fi; exec "$@"')
        cmd = [*dt.MPI, "2", "-x", "OUT=" + out, "sh", "-c", killer, "sh", CONVERT, bigpattern, out,
               "--quiet", "--transport", "nccl", "--memory-budget", "64KiB", "--threads", "1",
               "--target-like", big]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert p.returncode != 0, "the killed run reported success"
        assert not os.path.exists(out), os.listdir(out)
        print("ok nccl")
    finally:
        shutil.rmtree(dt.tmp, ignore_errors=True)


{"refusal": case_refusal, "refusal_mpi": case_refusal_mpi, "nccl": case_nccl}[CASE]()
