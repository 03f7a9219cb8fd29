"""The real DeepSpeed (0.19.8, CPU) as the oracle for fc on AutoTP checkpoints.

usage: autotp_oracle_test.py BUILD_ROOT TESTDATA [CASE]     (run through venv_run.py torch)

CASE ucp (the default):
1. make_autotp.py saves every case anew (torchrun, gloo): its ds_to_universal values and the
   keys of each zero/<param>/<state>.pt dict equal the committed ones, and autotp_check.py
   (fc-inspect --verify, fc-export --include-optimizer == ds_to_universal) passes on them;
2. fc-convert --output-format ucp of each committed save equals ds_to_universal's output
   file for file: the same zero/<param>/<state>.pt files, each holding the same keys and
   the same values (DeepSpeed writes no cat_dim for a param its affine_map covers).

CASE load (fc's output loaded by DeepSpeed itself; make_autotp.py's model and config, another
seed, so what is checked comes from the checkpoint):
3. fc-convert --output-format deepspeed --dp 2 of autotp_tp2 and autotp_tp2_bf16 (TP 2, DP 1,
   ZeRO-1; fp32, bf16) loaded by engine.load_checkpoint in a TP 2 x DP 2 job (4 processes):
   on every rank, each param's fp32
   master and Adam moments (safe_get_full_*: the rank's TP shard, gathered over its DP group)
   equal those of the source loaded at TP 2 x DP 1 by the same harness (bitwise, per TP
   rank; the DP replicas agree), and those shards are the blocks of ds_to_universal's values
   (expected_ucp.safetensors); then one step on a fixed batch: the loss before the step and
   after it equal the source run's;
4. load_universal of fc-convert --output-format ucp of autotp_tp2_dp2 (TP 2 x DP 2, ZeRO-2) in
   a TP 2 x DP 1 ZeRO-2 job equals the load of ds_to_universal's UCP, bitwise (masters,
   moments per TP rank, the losses of one step), and equals the trained values.
"""
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import fresh_vs_committed as fvc  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402
PORT = 29681
LOAD_PORT = 29691


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
        how = fvc.compare(a, b, f"{case}: fresh vs committed")
        for f in ("expected_ucp_keys.json", "info.json"):
            assert json.load(open(os.path.join(fresh, case, f))) == \
                json.load(open(os.path.join(real, case, f))), (case, f)
        print(f"{case}: a fresh save gives the committed ds_to_universal values ({how})",
              flush=True)
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


# --- load: fc's output loaded by DeepSpeed ----------------------------------------------

STEP_IDS = (torch.arange(8).reshape(1, 8) * 5 + 3) % 64  # a batch the saves never trained on


def load_worker(testdata, stage, dtype, ckpt, out, universal):
    """torchrun rank: make_autotp.py's model and config at this world size (TP 2, DP = world
    / 2), seeded otherwise, loads ckpt (load_universal if universal == "1"). Every rank's
    fp32 masters and Adam moments (safe_get_full_*: its TP shard) -> out/live.safetensors as
    tp<R>/<name>, tp<R>/optimizer.exp_avg.<name>, ...; the DP replicas of a TP rank must
    agree. One step on STEP_IDS -> out/loss.json."""
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import groups, safe_get_full_fp32_param, safe_get_full_optimizer_state
    from transformers import LlamaConfig, LlamaForCausalLM
    sys.path.insert(0, os.path.join(HERE, "..", "deepspeed"))
    from deepspeed_oracle_test import link_loaded_optimizer_state
    sys.path.insert(0, os.path.join(testdata, "real", "deepspeed"))
    import make_autotp
    import make_fixtures as mf
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(99)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float()
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "tensor_parallel": {"autotp_size": make_autotp.TP},
          "zero_optimization": {"stage": int(stage)},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "steps_per_print": 1000}
    if dtype == "bf16":
        ds["bf16"] = {"enabled": True}
    if universal == "1":
        ds["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds)
    path, _ = engine.load_checkpoint(ckpt, load_lr_scheduler_states=False)
    assert path is not None, f"load_checkpoint({ckpt}) loaded nothing"
    link_loaded_optimizer_state(engine)
    tp = groups.get_tensor_model_parallel_rank()
    mine = {}
    for name, p in engine.module.named_parameters():
        fp32 = safe_get_full_fp32_param(p)
        assert fp32 is not None, f"{name}: no fp32 master"
        mine[f"tp{tp}/{name}"] = fp32.detach().float().cpu().clone()
        for state in ("exp_avg", "exp_avg_sq"):
            v = safe_get_full_optimizer_state(p, state)
            assert v is not None, f"{name}: no {state}"
            mine[f"tp{tp}/optimizer.{state}.{name}"] = v.detach().float().cpu().clone()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    before = engine(input_ids=STEP_IDS, labels=STEP_IDS).loss
    engine.backward(before)
    engine.step()
    with torch.no_grad():
        after = engine(input_ids=STEP_IDS, labels=STEP_IDS).loss
    if dist.get_rank() == 0:
        merged, disagree = {}, []
        for r, d in enumerate(every):
            for k, v in d.items():
                if k in merged and not torch.equal(merged[k], v):
                    disagree.append(f"{k} (rank {r})")
                merged.setdefault(k, v)
        assert not disagree, f"the DP replicas of a TP rank differ: {disagree[:8]}"
        mf.write(merged, os.path.join(out, "live.safetensors"))
        with open(os.path.join(out, "loss.json"), "w") as f:
            json.dump({"before": before.item(), "after": after.item()}, f)
    dist.barrier()


def run_load(testdata, stage, dtype, ckpt, nproc, out, universal=False):
    """(live values, losses, None) or (None, None, the output's tail)."""
    sys.path.insert(0, os.path.join(testdata, "real", "deepspeed"))
    import make_fixtures as mf
    os.makedirs(out, exist_ok=True)
    p = mf.torchrun(nproc, LOAD_PORT, [os.path.abspath(__file__), "--load-worker", testdata,
                                       str(stage), dtype, ckpt, out, "1" if universal else "0"],
                    mf.env())
    if p.returncode != 0:
        return None, None, (p.stdout + p.stderr)[-4000:]
    from safetensors.torch import load_file
    return (load_file(os.path.join(out, "live.safetensors")),
            json.load(open(os.path.join(out, "loss.json"))), None)


def blocks_of(live, ucp):
    """The per-TP-rank shards (tp<R>/<key>) against ds_to_universal's full tensors
    (<param>/<fp32|exp_avg|exp_avg_sq>): each full tensor is either every rank's shard
    (replicated) or their concatenation along dim 0 or 1. Returns the mismatches."""
    bad = []
    keys = sorted({k.split("/", 1)[1] for k in live})
    for key in keys:
        state, name = "fp32", key
        for s in ("exp_avg_sq", "exp_avg"):
            if key.startswith(f"optimizer.{s}."):
                state, name = s, key[len(f"optimizer.{s}."):]
                break
        full = ucp.get(f"{name}/{state}")
        shards = [live.get(f"tp{r}/{key}") for r in range(2)]
        if full is None or any(s is None for s in shards):
            bad.append(f"{key}: missing ({'no ds_to_universal value' if full is None else 'a TP rank'})")
            continue
        if all(s.shape == full.shape for s in shards):
            ok = all(torch.equal(s, full) for s in shards)
        else:
            ok = any(full.dim() > d and torch.equal(torch.cat(shards, d), full)
                     for d in (0, 1))
        if not ok:
            bad.append(f"{key}: TP shards {[list(s.shape) for s in shards]} are not the blocks "
                       f"of ds_to_universal's {list(full.shape)}")
    return bad


def diff(a, b):
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or
                  not torch.equal(a[k], b[k]))


def load_dp2(build, testdata, tmp):
    """3.: fc's --dp 2 re-partition of autotp_tp2 (fp32) and autotp_tp2_bf16 loaded at
    TP 2 x DP 2."""
    for case in ("autotp_tp2", "autotp_tp2_bf16"):
        load_dp2_case(build, testdata, tmp, case)


def load_dp2_case(build, testdata, tmp, case):
    real = os.path.join(testdata, "real", "deepspeed")
    sys.path.insert(0, real)
    import make_autotp
    _, stage, dtype = make_autotp.CASES[case]
    tmp = os.path.join(tmp, case)
    src = os.path.join(real, case, "ckpt")
    from safetensors.torch import load_file
    ucp = load_file(os.path.join(real, case, "expected_ucp.safetensors"))
    live_src, loss_src, err = run_load(testdata, stage, dtype, src, 2, os.path.join(tmp, "src"))
    assert err is None, f"{case}: engine.load_checkpoint of the source at TP 2 x DP 1:\n{err}"
    bad = blocks_of(live_src, ucp)
    assert not bad, f"{case}: the harness: the source's loaded shards vs ds_to_universal: {bad}"
    conv = os.path.join(tmp, case + "-dp2")
    p = subprocess.run([os.path.join(build, "tools", "fc-convert"), src, conv,
                        "--output-format", "deepspeed", "--dp", "2", "-q"],
                       capture_output=True, text=True)
    assert p.returncode == 0, (case, p.returncode, p.stderr)
    got, loss_fc, err = run_load(testdata, stage, dtype, conv, 4, os.path.join(tmp, "fc"))
    assert err is None, f"{case}: engine.load_checkpoint of fc's dp 2 output at TP 2 x DP 2:\n{err}"
    bad = diff(got, live_src)
    assert not bad, f"{case}: loaded at TP 2 x DP 2 differs from the source: {bad[:12]}"
    print(f"{case}: fc's dp 2 re-partition loads in DeepSpeed at TP 2 x DP 2; {len(got)} "
          f"per-TP-rank fp32 masters / Adam moments equal the source's (loaded at TP 2 x DP 1), "
          f"which are the blocks of ds_to_universal's values; one step: loss before "
          f"{loss_fc['before']!r} (source {loss_src['before']!r}), after {loss_fc['after']!r} "
          f"(source {loss_src['after']!r})", flush=True)
    # Every rank steps on the same batch: DeepSpeed's DP average g/2 + g/2 is g exactly.
    assert loss_fc == loss_src, (case, loss_fc, loss_src)


def load_universal_tp(build, testdata, tmp):
    """4.: both UCPs of autotp_tp2_dp2 loaded (load_universal) at TP 2 x DP 1."""
    real = os.path.join(testdata, "real", "deepspeed")
    case = "autotp_tp2_dp2"
    tag_dir = os.path.join(real, case, "ckpt", "step2")
    from safetensors.torch import load_file
    ucp_vals = load_file(os.path.join(real, case, "expected_ucp.safetensors"))
    got = {}
    for side in ("ds", "fc"):
        ucp = os.path.join(tmp, f"{case}-{side}", "ucp")
        if side == "ds":
            subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                            "--input_folder", tag_dir, "--output_folder", ucp,
                            "--num_extract_workers", "1", "--num_merge_workers", "1"],
                           check=True, capture_output=True)
        else:
            p = subprocess.run([os.path.join(build, "tools", "fc-convert"),
                                os.path.dirname(tag_dir), ucp, "--output-format", "ucp", "-q"],
                               capture_output=True, text=True)
            assert p.returncode == 0, (case, p.returncode, p.stderr)
        got[side] = run_load(testdata, 2, "fp32", os.path.dirname(ucp), 2,
                             os.path.join(tmp, f"{case}-{side}-loaded"), universal=True)
    (live_ds, loss_ds, err_ds), (live_fc, loss_fc, err_fc) = got["ds"], got["fc"]
    assert err_ds is None and err_fc is None, (
        f"{case}: load_universal at TP 2 x DP 1 of ds_to_universal's UCP: "
        f"{'ok' if err_ds is None else err_ds}\nof fc's UCP: {'ok' if err_fc is None else err_fc}")
    bad = diff(live_ds, live_fc)
    trained = blocks_of(live_ds, ucp_vals)
    print(f"{case} (TP 2 x DP 2, ZeRO-2) -> TP 2 x DP 1 ZeRO-2 load_universal: {len(live_fc)} "
          f"per-TP-rank fp32 masters / Adam moments from fc's UCP "
          f"{'==' if not bad else '!='} from ds_to_universal's "
          f"({'the blocks of' if not trained else 'NOT the blocks of'} the trained values); "
          f"loss before / after one step: fc {loss_fc['before']!r} / {loss_fc['after']!r}, "
          f"DeepSpeed's UCP {loss_ds['before']!r} / {loss_ds['after']!r}", flush=True)
    assert not bad, (case, bad[:12])
    assert not trained, (case, trained[:12])
    assert loss_fc == loss_ds, (case, loss_fc, loss_ds)


def main():
    if sys.argv[1] == "--load-worker":
        load_worker(*sys.argv[2:8])
        return
    build, testdata = sys.argv[1], os.path.abspath(sys.argv[2])
    case = sys.argv[3] if len(sys.argv) > 3 else "ucp"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with fcio.temp_dir("fc-autotp-oracle-") as tmp:
        if case == "ucp":
            ucp_vs_ds(build, testdata, tmp)
            fresh_vs_committed(build, testdata, tmp)
        elif case == "load":
            load_dp2(build, testdata, tmp)
            load_universal_tp(build, testdata, tmp)
        else:
            raise SystemExit(f"unknown case {case!r} (ucp, load)")


if __name__ == "__main__":
    main()
