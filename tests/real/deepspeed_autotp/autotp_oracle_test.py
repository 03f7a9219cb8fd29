"""The real DeepSpeed (0.19.8, CPU) as the oracle for fc on AutoTP checkpoints.

usage: autotp_oracle_test.py BUILD_ROOT TESTDATA     (run through venv_run.py torch)

1. make_autotp.py saves every case anew (torchrun, gloo): its ds_to_universal values and the
   keys of each zero/<param>/<state>.pt dict equal the committed ones, and autotp_check.py
   (fc-inspect --verify, fc-export --include-optimizer == ds_to_universal) passes on them;
2. fc-convert --output-format ucp of each committed save equals ds_to_universal's output
   file for file: the same zero/<param>/<state>.pt files, each holding the same keys and
   the same values (DeepSpeed writes no cat_dim for a param its affine_map covers).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = 29681


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def ucp_files(ucp):
    zero = os.path.join(ucp, "zero")
    return {f"{n}/{f[:-3]}": os.path.join(zero, n, f) for n in sorted(os.listdir(zero))
            if os.path.isdir(os.path.join(zero, n)) for f in sorted(os.listdir(os.path.join(zero, n)))}


def value(v):
    v = v["param"] if isinstance(v, dict) else v
    return v if isinstance(v, torch.Tensor) else torch.tensor(v)


def fresh_vs_committed(build, testdata, tmp):
    real = os.path.join(testdata, "real", "deepspeed")
    fresh = os.path.join(tmp, "fresh")
    env = dict(os.environ, FC_TORCHRUN_PORT=str(PORT))
    subprocess.run([sys.executable, os.path.join(real, "make_autotp.py"), fresh], check=True,
                   env=env)
    from safetensors.torch import load_file
    sys.path.insert(0, real)
    import make_autotp
    for case in make_autotp.CASES:
        a = load_file(os.path.join(fresh, case, "expected_ucp.safetensors"))
        b = load_file(os.path.join(real, case, "expected_ucp.safetensors"))
        assert sorted(a) == sorted(b), (case, sorted(set(a) ^ set(b)))
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (case, k)
        for f in ("expected_ucp_keys.json", "info.json"):
            assert json.load(open(os.path.join(fresh, case, f))) == \
                json.load(open(os.path.join(real, case, f))), (case, f)
        print(f"{case}: a fresh save gives the committed ds_to_universal values", flush=True)
    subprocess.run(["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                    os.path.join(HERE, "autotp_check.py"), build, fresh], check=True)


def ucp_vs_ds(build, testdata, tmp):
    real = os.path.join(testdata, "real", "deepspeed")
    sys.path.insert(0, real)
    import make_autotp
    failed = []
    for case in make_autotp.CASES:
        ckpt = os.path.join(real, case, "ckpt")
        ds, fc = os.path.join(tmp, case + "-ds"), os.path.join(tmp, case + "-fc")
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(ckpt, "step2"), "--output_folder", ds,
                        "--num_extract_workers", "1", "--num_merge_workers", "1"],
                       check=True, capture_output=True)
        p = subprocess.run([os.path.join(build, "tools", "fc-convert"), ckpt, fc,
                            "--output-format", "ucp", "-q"], capture_output=True, text=True)
        assert p.returncode == 0, (case, p.stderr)
        want, got = ucp_files(ds), ucp_files(fc)
        bad = []
        if sorted(want) != sorted(got):
            bad.append(f"files: only DeepSpeed {sorted(set(want) - set(got))}, "
                       f"only fc {sorted(set(got) - set(want))}")
        for k in sorted(set(want) & set(got)):
            w, g = load(want[k]), load(got[k])
            wk = sorted(w) if isinstance(w, dict) else None
            gk = sorted(g) if isinstance(g, dict) else None
            if wk != gk:
                bad.append(f"{k}: DeepSpeed's keys {wk}, fc's {gk}")
            for extra in set(wk or []) & set(gk or []) - {"param"}:
                if w[extra] != g[extra]:
                    bad.append(f"{k}: {extra} DeepSpeed {w[extra]!r} fc {g[extra]!r}")
            wv, gv = value(w), value(g)
            if k.endswith("/step"):
                ok = float(wv) == float(gv)
            else:
                ok = wv.dtype == gv.dtype and wv.shape == gv.shape and torch.equal(wv, gv)
            if not ok:
                bad.append(f"{k}: DeepSpeed {wv.dtype}{list(wv.shape)} fc {gv.dtype}{list(gv.shape)}")
        if bad:
            failed.append(case)
            print(f"FAIL {case}: fc's UCP vs ds_to_universal:\n  " + "\n  ".join(bad[:20]) +
                  (f"\n  ... {len(bad) - 20} more" if len(bad) > 20 else ""), flush=True)
        else:
            print(f"{case}: fc's UCP == ds_to_universal ({len(want)} files, keys and values)",
                  flush=True)
    assert not failed, failed


def main():
    build, testdata = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="fc-autotp-oracle-")
    try:
        ucp_vs_ds(build, testdata, tmp)
        fresh_vs_committed(build, testdata, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
