"""fc-export on DeepSpeed checkpoints written by the real DeepSpeed (0.19.8, CPU), compared
bit for bit with what DeepSpeed's own tools gave back (testdata/real/deepspeed/make_fixtures.py):

  fc-export CKPT                        == zero_to_fp32's consolidated fp32 state dict
                                           (expected_fp32.safetensors): names, dtypes, bytes
  fc-export CKPT --weights module       == rank 0's module state dict (expected_module)
  fc-export CKPT --include-optimizer    fp32 masters and Adam moments == ds_to_universal's
                                           zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt
                                           (expected_ucp) and == the live engine's
                                           safe_get_full_* values (expected_live)
  fc-export CKPT/step1 (two tags)       == zero_to_fp32 of that tag
  a Trainer save (info saved_by):       the same checks on its tag dir, and fc-export of the
                                        Trainer's checkpoint dir with --format deepspeed

No framework is needed (numpy reads both sides).

usage: deepspeed_fixtures_check.py BUILD_ROOT FIXTURES_DIR [CASE...]
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402

import numpy as np  # noqa: E402


def upcast(dt, arr):
    """A 16-bit value as the float32 a Universal Checkpoint stores (exact)."""
    if dt == "BF16":
        return "F32", fcio.bf16_bits_to_f32(arr).reshape(arr.shape)
    if dt == "F16":
        return "F32", arr.astype(np.float32)
    return dt, arr


def same(got, want, label, subset=False, upcast_got=False):
    """fcio.same_tensors; upcast_got: fc's 16-bit tensors compared as float32 where want
    holds float32 (ds_to_universal stores everything as fp32)."""
    if upcast_got:
        got = {n: (upcast(*v) if n in want and want[n][0] == "F32" else v)
               for n, v in got.items()}
    fcio.same_tensors(got, want, label, subset=subset)


def export(tools, src, out, *flags):
    shutil.rmtree(out, ignore_errors=True)
    fcio.run([os.path.join(tools, "fc-export"), src, out, "-q", *flags])
    got, _ = fcio.read_hf_dir(out)
    return got


def check_case(tools, fx, case, tmp):
    d = os.path.join(fx, case)
    info = json.load(open(os.path.join(d, "info.json")))
    ckpt = os.path.join(d, "ckpt")
    done = []
    if info.get("saved_by") == "transformers.Trainer":
        # The Trainer's checkpoint-N dir holds its own model.safetensors (the module weights)
        # beside DeepSpeed's `latest` and tag dir: without --format fc refuses to guess, naming
        # both; the DeepSpeed checkpoint is read as --format deepspeed there, or by its tag dir
        # (below).
        p = fcio.run([os.path.join(tools, "fc-export"), ckpt, os.path.join(tmp, "guess")],
                     expect=None)
        assert p.returncode == 3 and "holds both HuggingFace safetensors weights and a " \
            "DeepSpeed checkpoint" in p.stderr and "--format deepspeed" in p.stderr, \
            (case, p.returncode, p.stderr)
        assert not os.path.exists(os.path.join(tmp, "guess")), case
        want = fcio.read_safetensors(os.path.join(d, "expected_fp32.safetensors"))
        same(export(tools, ckpt, os.path.join(tmp, "trainer"), "--format", "deepspeed"), want,
             f"{case}: zero_to_fp32 (the Trainer's dir, --format deepspeed)")
        same(fcio.read_safetensors(os.path.join(ckpt, "model.safetensors")),
             fcio.read_safetensors(os.path.join(d, "expected_module.safetensors")),
             f"{case}: the Trainer's model.safetensors vs the DeepSpeed module")
        with open(os.path.join(ckpt, "latest")) as f:
            ckpt = os.path.join(ckpt, f.read().strip())
        done.append("Trainer dir --format deepspeed")
    p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", ckpt])
    assert "verify: OK" in p.stdout, (case, p.stdout)
    exp = lambda n: os.path.join(d, n)  # noqa: E731
    if os.path.exists(exp("expected_fp32.safetensors")):
        got = export(tools, ckpt, os.path.join(tmp, "fp32"))
        want = fcio.read_safetensors(exp("expected_fp32.safetensors"))
        if info["zero_stage"] == 1:
            # ZeRO-1 saves no frozen_param_shapes (DeepSpeed writes them only when gradients
            # are partitioned, stage 2+), so zero_to_fp32 drops the frozen params; fc exports
            # them as the module holds them. Every extra must be such a param.
            live = fcio.read_safetensors(exp("expected_live.safetensors"))
            module = fcio.read_safetensors(exp("expected_module.safetensors"))
            extra = sorted(set(got) - set(want))
            assert all(k in module and k not in live for k in extra), (case, extra)
            same({k: got[k] for k in extra}, {k: module[k] for k in extra},
                 f"{case}: ZeRO-1 frozen params")
            got = {k: v for k, v in got.items() if k not in extra}
        same(got, want, f"{case}: zero_to_fp32")
        done.append("zero_to_fp32")
    if os.path.exists(exp("expected_fp32_step1.safetensors")):
        same(export(tools, os.path.join(ckpt, "step1"), os.path.join(tmp, "step1")),
             fcio.read_safetensors(exp("expected_fp32_step1.safetensors")),
             f"{case}: zero_to_fp32 tag step1")
        done.append("step1")
    module = export(tools, ckpt, os.path.join(tmp, "module"), "--weights", "module")
    want_module = fcio.read_safetensors(exp("expected_module.safetensors"))
    # The fall-back to fp32 masters is said, never silent; and only where it happens.
    shutil.rmtree(os.path.join(tmp, "module_warn"), ignore_errors=True)
    warned = fcio.run([os.path.join(tools, "fc-export"), ckpt, os.path.join(tmp, "module_warn"),
                       "--weights", "module"]).stderr
    placeholders = [k for k, (dt, a) in want_module.items() if a.size == 0]
    if placeholders:
        head = (f"--weights module: {len(placeholders)} param(s) have no values in the module "
                "state dict (ZeRO-3 saves empty placeholders), exported as their fp32 master "
                "weights: ")
        assert head in warned, (case, warned)
        named = warned.split(head, 1)[1].splitlines()[0].split(" and ")[0].split(", ")
        assert named and set(named) <= set(placeholders), (case, named, placeholders)
    else:
        assert "--weights module:" not in warned, (case, warned)
    if info["zero_stage"] == 3:
        # ZeRO-3 saves only empty placeholders for the partitioned params in the module state
        # dict; fc's --weights module falls back to the fp32 masters for them (the frozen
        # params and buffers stay as stored): zero_to_fp32's values.
        placeholders = [k for k, (dt, a) in want_module.items() if a.size == 0]
        assert placeholders, f"{case}: ZeRO-3 module without placeholders?"
        want_module = fcio.read_safetensors(exp("expected_fp32.safetensors"))
    same(module, want_module, f"{case}: module")
    done.append("module")
    full = export(tools, ckpt, os.path.join(tmp, "opt"), "--include-optimizer")
    if os.path.exists(exp("expected_ucp.safetensors")):
        want = {}
        for k, v in fcio.read_safetensors(exp("expected_ucp.safetensors")).items():
            name, state = k.rsplit("/", 1)
            if name in info["shared_params"]:
                # a tied alias: ds_to_universal writes the module's copy (16-bit rounded under
                # bf16) where the owner has the fp32 master; fc's alias is the owner's master
                continue
            if info["zero_stage"] == 3 and v[1].ndim == 1 and name in full:
                # ZeRO-3's UCP files hold the params flat (1-D); fc's are shaped
                v = (v[0], v[1].reshape(full[name][1].shape))
            if state == "fp32":
                want[name] = v
            elif state in ("exp_avg", "exp_avg_sq"):
                want[f"optimizer.{state}.{name}"] = v
        same(full, want, f"{case}: ds_to_universal", subset=True, upcast_got=True)
        done.append("ds_to_universal")
    same(full, fcio.read_safetensors(exp("expected_live.safetensors")), f"{case}: live engine",
         subset=True)
    done.append("live")
    # fc's re-partition (--output-format deepspeed --dp N) reads back to the same values.
    # DeepSpeed 0.19 saves partition_count as a list (one per param group): issue 29 item 6.
    if "sub_group_size" in info["extra"]:
        # ZeRO-3 sub-groups cut at other boundaries at another DP size: fc refuses (exit 6)
        # rather than regroup as DeepSpeed would
        p = fcio.run([os.path.join(tools, "fc-convert"), ckpt, os.path.join(tmp, "dp3"),
                      "--output-format", "deepspeed", "--dp", "3", "-q"], expect=6)
        assert "does not regroup" in p.stderr, p.stderr
        done.append("dp 3 refused: sub-groups")
    elif info["zero_stage"] in (1, 2, 3) and "moe" not in info["extra"]:
        for n in (3, 1):
            out = os.path.join(tmp, f"dp{n}")
            fcio.run([os.path.join(tools, "fc-convert"), ckpt, out, "--output-format",
                      "deepspeed", "--dp", str(n), "-q"])
            same(export(tools, out, os.path.join(tmp, f"dp{n}-x"), "--include-optimizer"), full,
                 f"{case}: --output-format deepspeed --dp {n}")
            shutil.rmtree(out)
        done.append("dp 3/1 re-partition")
    return done


def main():
    build, fx = sys.argv[1], sys.argv[2]
    # the AutoTP saves (make_autotp.py: no expected_live) have their own check, autotp_check.py
    cases = sys.argv[3:] or sorted(c for c in os.listdir(fx)
                                   if os.path.isdir(os.path.join(fx, c, "ckpt")) and
                                   os.path.exists(os.path.join(fx, c, "expected_live.safetensors")))
    tools = os.path.join(build, "tools")
    failed = []
    for case in cases:
        with fcio.temp_dir("fc-real-ds-") as tmp:
            try:
                done = check_case(tools, fx, case, tmp)
                print(f"{case}: equal ({', '.join(done)})", flush=True)
            except AssertionError as e:
                failed.append(case)
                print(f"FAIL {case}: {e}", flush=True)
    if failed:
        print(f"{len(failed)} of {len(cases)} cases differ: {' '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
