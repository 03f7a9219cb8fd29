"""fc-convert --output-format ucp on the DeepSpeed fixtures (testdata/deepspeed): every
written file is loaded with torch.load (Debian's torch 1.13) and compared with the
generator's independent reconstruction (expected/*.npy: zero_to_fp32's algorithm,
merge_tp_slices for TP) element by element; dict keys against ds_to_universal's rules
(deepspeed.md 5.5) evaluated here with Python's re.match on the source's
universal_checkpoint_info; optimizer_state.pt against rank 0's optimizer state (5.3); model
states byte for byte. Then fc reads the UCP back: fc-export and fc-diff against the source.
Case torch: a UCP written from a torch DCP checkpoint (torch's Adam state names), checked
against the values torch saved; case others: from Megatron torch_dist's and PaddlePaddle's
names, with --ucp-step.

usage: ucp_write_test.py BUILD_ROOT TESTDATA CASE   (CASE: write|readback|torch|others|errors)
"""
import filecmp
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

BUILD, TESTDATA, CASE = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(TESTDATA, "gen", "deepspeed"))
import fcio  # noqa: E402

# torch or numpy missing: nothing can load the files (gen registers the DeepSpeed stand-in
# classes the pickles name)
np, torch, gen = fcio.import_or_skip("numpy", "torch", "gen")

CONVERT, EXPORT, DIFF = fcio.tools(BUILD, "fc-convert", "fc-export", "fc-diff")
DS = os.path.join(TESTDATA, "deepspeed")
# Sources a UCP is written from, and the form of their param files.
DEEPSPEED = ["zero1", "zero2", "bf16", "frozen_tied", "zero3", "pp2", "pp2_tp2", "tp2_ucp",
             "legacy",  # legacy: every source file in torch.save's non-zip format
             "tp2_fused", "tp2_fused_v02"]  # fused sub-params: sub_param_shape
UNIVERSAL = ["ucp", "ucp_tp2", "ucp_zero3", "ucp_tp2_fused"]
RAW = {"zero3", "ucp_zero3"}  # stage 3, TP 1: raw 1-D tensors, no step.pt
tmp = tempfile.mkdtemp(prefix="fc-ucp-write-test-")


def load(path):
    return torch.load(path, map_location="cpu")


def tag_dir(case):
    ckpt = os.path.join(DS, case, "ckpt")
    for pointer in ("latest", "latest_universal"):
        p = os.path.join(ckpt, pointer)
        if os.path.exists(p):
            return os.path.join(ckpt, open(p).read().strip())
    raise AssertionError(case + ": no latest file")


def convert(case, extra=()):
    root = os.path.join(tmp, case)
    out = os.path.join(root, "universal")
    fcio.run([CONVERT, os.path.join(DS, case, "ckpt"), out, "--output-format", "ucp", "--quiet",
              *extra])
    return root, out


def expected_meta(name, info, merged):
    """The keys ds_to_universal's merge_tp_slices puts beside 'param' (deepspeed.md 5.5)."""
    if gen.match_sub_params(info or {}, name)[0] is not None:
        # Fused sub-params: the generator's ds_to_universal keys (sub_param_shape as the
        # SubparamShape object; a pre-0.4 count sized from the merged tensor).
        return gen.ucp_keys(name, info, [torch.from_numpy(np.ascontiguousarray(merged))])
    def match(key):
        return any(re.match(p, name) for p in (info or {}).get(key, []))
    keys = {}
    if not (match("tp_replicated_parameter_patterns") or match("parameter_to_average_patterns")):
        if match("parameter_with_2_sub_params_cat_dim_0"):
            keys.update(cat_dim=0, param_n_sub_params=2)
        else:
            keys["cat_dim"] = 1 if match("parameter_with_row_parallelism_patterns") else 0
    if match("vocabulary_parameter_patterns"):
        keys["vocab_tensor"] = True
    return keys


def same_bits(got, want, label):
    want = np.asarray(want)
    assert got.dtype == torch.float32, (label, got.dtype)
    g = got.numpy()
    assert g.shape == want.shape, (label, g.shape, want.shape)
    assert np.array_equal(fcio.bits(g), fcio.bits(want.astype(np.float32))), label + " differs"


def expected_optimizer_state(src, zero3):
    """deepspeed.md 5.3 on rank 0's optimizer state, minus entries holding tensors."""
    names = [n for n in os.listdir(src) if n.endswith("zero_pp_rank_0_mp_rank_00_optim_states.pt")]
    assert len(names) == 1, names
    osd = load(os.path.join(src, names[0]))["optimizer_state_dict"]
    base = osd["optimizer_state_dict" if zero3 else "base_optimizer_state"]
    holds = lambda v: isinstance(v, torch.Tensor) or (  # noqa: E731
        isinstance(v, (list, tuple)) and any(holds(x) for x in v)) or (
        isinstance(v, dict) and any(holds(x) for x in v.values()))
    out = {}
    for k, v in osd.items():
        if k in ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups"):
            continue
        if zero3 and k == "optimizer_state_dict":
            # what DeepSpeed's ZeRO-3 universal loader reads: each state's step, param_groups
            out[k] = {"state": {sk: {"step": sv["step"]} for sk, sv in v["state"].items()},
                      "param_groups": v["param_groups"]}
        elif not holds(v):
            out[k] = v
    out["param_groups"] = base["param_groups"]
    return out


def expected_module_only(src, params, raw):
    """ds_to_universal (0.19, stage <= 2): zero/<name>/fp32.pt = {'param': value.float()} for
    each module state dict entry of the mp_rank_*_model_states.pt files (in order, the first
    copy of a name) that has no optimizer state; a pipeline's files hold no module."""
    out = {}
    if raw:
        return out
    for f in sorted(n for n in os.listdir(src) if re.fullmatch(r"mp_rank_\d+_model_states\.pt", n)):
        module = load(os.path.join(src, f)).get("module")
        for k, v in (module or {}).items():
            if k not in params and k not in out:
                out[k] = v
    return out


def check_module_only(case, out, module_only):
    for name, v in module_only.items():
        got = load(os.path.join(out, "zero", name, "fp32.pt"))
        assert list(got) == ["param"], (case, name, list(got))
        assert got["param"].dtype == torch.float32 and torch.equal(got["param"], v.float()), \
            (case, name)
        assert sorted(os.listdir(os.path.join(out, "zero", name))) == ["fp32.pt"], (case, name)


def check_ucp(case, root, out):
    src = tag_dir(case)
    universal = case in UNIVERSAL
    exp = fcio.expected_values(os.path.join(DS, case))
    params = sorted(k[len("optimizer.exp_avg."):] for k in exp if k.startswith("optimizer.exp_avg."))
    assert open(os.path.join(root, "latest_universal")).read() == "universal"
    module_only = expected_module_only(src, params, case in RAW)
    assert sorted(os.listdir(os.path.join(out, "zero"))) == \
        sorted(params + list(module_only) + ["optimizer_state.pt"]), case
    check_module_only(case, out, module_only)
    info = None
    if not universal:
        names = sorted(os.listdir(src))
        model = ("mp_rank_00_model_states.pt" if "mp_rank_00_model_states.pt" in names
                 else [n for n in names if n.endswith("model_states.pt")][0])
        info = load(os.path.join(src, model)).get("universal_checkpoint_info")
    raw = case in RAW
    for p in params:
        d = os.path.join(out, "zero", p)
        want_files = ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt"] + ([] if raw else ["step.pt"])
        assert sorted(os.listdir(d)) == want_files, (case, p, os.listdir(d))
        for state, key in (("fp32", p), ("exp_avg", "optimizer.exp_avg." + p),
                           ("exp_avg_sq", "optimizer.exp_avg_sq." + p)):
            got = load(os.path.join(d, state + ".pt"))
            label = f"{case}: {p}/{state}.pt"
            if raw:
                assert isinstance(got, torch.Tensor) and got.dim() == 1, label
                same_bits(got, exp[key].reshape(-1), label)
                continue
            assert isinstance(got, dict), (label, type(got))
            if universal:  # the source file's keys, in order, values equal
                want_keys = list(load(os.path.join(src, "zero", p, state + ".pt")))
                assert list(got) == want_keys, (label, list(got), want_keys)
            else:
                meta = expected_meta(p, info, exp[key])
                assert list(got) == list(meta) + ["param"], (label, list(got), meta)
                for k, v in meta.items():
                    assert got[k] == v and type(got[k]) is type(v), (label, k, got[k], v)
            same_bits(got["param"], exp[key], label)
        if not raw:
            step = load(os.path.join(d, "step.pt"))
            want = exp["optimizer.step." + p]
            assert isinstance(step, torch.Tensor) and step.dim() == 0, (case, p, step)
            assert np.array_equal(fcio.bits(step.numpy()), fcio.bits(want)), (case, p, step)
    # Every written archive is a valid zip (CRC-32s combined from the slabs' are right).
    for dirpath, _, files in os.walk(os.path.join(out, "zero")):
        for f in files:
            assert zipfile.ZipFile(os.path.join(dirpath, f)).testzip() is None, (case, dirpath, f)
    osd_path = os.path.join(out, "zero", "optimizer_state.pt")
    if universal:
        assert filecmp.cmp(osd_path, os.path.join(src, "zero", "optimizer_state.pt"), shallow=False)
    else:
        want = expected_optimizer_state(src, case in RAW)
        assert gen.same_value(load(osd_path), want), (case, load(osd_path), want)
    copied = sorted(n for n in os.listdir(src)
                    if n.endswith("model_states.pt") and "_expert_" not in n)
    assert copied, case
    top = sorted(n for n in os.listdir(out) if n != "zero")
    assert top == copied, (case, top, copied)
    for n in copied:
        assert filecmp.cmp(os.path.join(out, n), os.path.join(src, n), shallow=False), (case, n)


def case_write():
    for case in DEEPSPEED + UNIVERSAL:
        root, out = convert(case)
        check_ucp(case, root, out)
        print("ok write", case)
    # TP 2 without universal_checkpoint_info: refused (case_errors), or with
    # --inject-missing-state every param's TP slices concatenated along dim 0, cat_dim 0.
    root, out = convert("tp2", ["--inject-missing-state"])
    exp = fcio.expected_values(os.path.join(DS, "tp2"))
    params = sorted(k[len("mp_rank_00.optimizer.exp_avg."):] for k in exp
                    if k.startswith("mp_rank_00.optimizer.exp_avg."))
    assert params == ["layer.bias", "layer.weight"], params
    module_only = expected_module_only(tag_dir("tp2"), params, False)
    assert sorted(os.listdir(os.path.join(out, "zero"))) == \
        sorted(params + list(module_only) + ["optimizer_state.pt"])
    check_module_only("tp2", out, module_only)
    for p in params:
        for state, key in (("fp32", p), ("exp_avg", "optimizer.exp_avg." + p),
                           ("exp_avg_sq", "optimizer.exp_avg_sq." + p)):
            got = load(os.path.join(out, "zero", p, state + ".pt"))
            assert list(got) == ["cat_dim", "param"] and got["cat_dim"] == 0, got
            want = np.concatenate([exp["mp_rank_00." + key], exp["mp_rank_01." + key]])
            same_bits(got["param"], want, "tp2: " + p + "/" + state)
        step = load(os.path.join(out, "zero", p, "step.pt"))
        assert np.array_equal(fcio.bits(step.numpy()), fcio.bits(exp["mp_rank_00.optimizer.step." + p]))
    assert sorted(n for n in os.listdir(out) if n != "zero") == [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    print("ok write tp2 --inject-missing-state")
    # Streaming under a tiny budget (slabs of a few elements, one thread): the same bytes.
    out = os.path.join(tmp, "zero2", "universal")
    small = os.path.join(tmp, "zero2-small", "universal")
    fcio.run([CONVERT, os.path.join(DS, "zero2", "ckpt"), small, "--output-format", "ucp",
              "--quiet", "--memory-budget", "192", "--threads", "1"])
    for dirpath, _, files in os.walk(out):
        for f in files:
            a = os.path.join(dirpath, f)
            assert filecmp.cmp(a, os.path.join(small, os.path.relpath(a, out)), shallow=False), a
    # Written from a UCP, a UCP holds the same values (tensors bit for bit, dict keys in order).
    for case in UNIVERSAL:
        src = tag_dir(case)
        out = os.path.join(tmp, case, "universal")
        for dirpath, _, files in os.walk(os.path.join(src, "zero")):
            for f in files:
                a = os.path.join(dirpath, f)
                b = os.path.join(out, "zero", os.path.relpath(a, os.path.join(src, "zero")))
                assert gen.same_value(load(a), load(b)), (case, a)
        print("ok roundtrip", case)


def case_readback():
    for case in DEEPSPEED + UNIVERSAL:
        _, out = convert(case)
        source = os.path.join(DS, case, "ckpt")
        # fc reads the UCP: what it exports equals the export of the source, for the UCP's
        # params (fp32 master weights and Adam states) and everything else (module weights,
        # frozen params, buffers: from the copied model states). Stage 3's UCP form has no step.
        a, b = os.path.join(tmp, case + "-exp-src"), os.path.join(tmp, case + "-exp-ucp")
        fcio.run([EXPORT, source, a, "--quiet", "--include-optimizer"])
        fcio.run([EXPORT, out, b, "--quiet", "--include-optimizer"])
        ga, _ = fcio.read_hf_dir(a)
        gb, _ = fcio.read_hf_dir(b)
        params = [k[len("optimizer.exp_avg."):] for k in ga if k.startswith("optimizer.exp_avg.")]
        keys = [k for p in params for k in (p, "optimizer.exp_avg." + p, "optimizer.exp_avg_sq." + p)]
        if case not in RAW:
            keys += ["optimizer.step." + p for p in params]
        for k in keys:
            assert k in gb, (case, k)
            assert np.array_equal(fcio.bits(ga[k][1]), fcio.bits(gb[k][1])), (case, k)
        if case not in RAW:
            assert sorted(ga) == sorted(gb), (case, sorted(set(ga) ^ set(gb)))
            assert filecmp.cmp(os.path.join(a, "model.safetensors"),
                               os.path.join(b, "model.safetensors"), shallow=False), case
        # fc-diff: identical (the stage-3 form drops the step).
        args = [DIFF, source, out]
        if case in RAW and case not in UNIVERSAL:
            args += ["--exclude", "optimizer.step.*"]
        assert "bit-identical" in fcio.run(args).stdout, case
        print("ok readback", case)


def case_torch():
    """A UCP from a torch DCP checkpoint (testdata/torch_dcp_adam/fsdp_adam: model.<fqn> and
    optim.state.<fqn>.{exp_avg,exp_avg_sq,step} as torch.distributed.checkpoint flattens a
    {"model", "optim"} state dict): the files DeepSpeed's universal loader reads, with the
    values torch saved (bf16 weights and states as fp32), one int step, synthesized model
    states and optimizer state; read back by fc."""
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "fsdp_adam")
    root = os.path.join(tmp, "torch")
    out = os.path.join(root, "universal")
    plan = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp",
                     "--dry-run"]).stdout
    assert "left out (no Adam state): 1 tensor(s): model.rope.inv_freq" in plan, plan
    assert not os.path.exists(root)
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp", "--quiet"])
    expected = fcio.expected_values(fixture)
    params = {"embed.weight": [8, 4], "layers.0.proj.weight": [6, 4], "norm.weight": [4]}
    assert sorted(os.listdir(os.path.join(out, "zero"))) == sorted(params) + ["optimizer_state.pt"]
    assert sorted(os.listdir(root)) == ["latest_universal", "universal"]
    assert open(os.path.join(root, "latest_universal")).read() == "universal"
    for p, shape in params.items():
        folder = os.path.join(out, "zero", p)
        assert sorted(os.listdir(folder)) == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"]
        for state, key in (("fp32", "model." + p), ("exp_avg", f"optim.state.{p}.exp_avg"),
                           ("exp_avg_sq", f"optim.state.{p}.exp_avg_sq")):
            d = load(os.path.join(folder, state + ".pt"))
            assert list(d) == ["cat_dim", "param"] and d["cat_dim"] == 0, (p, state, d.keys())
            want = expected[key]
            if want.dtype == np.uint16:  # bfloat16 bit patterns: exact in fp32
                want = fcio.bf16_bits_to_f32(want).reshape(want.shape)
            assert list(d["param"].shape) == shape, (p, state, d["param"].shape)
            same_bits(d["param"], want, p + "/" + state)
        step = load(os.path.join(folder, "step.pt"))
        assert type(step) is int and step == 12, (p, step)
    model = load(os.path.join(out, "mp_rank_00_model_states.pt"))
    assert list(model["param_shapes"][0].items()) == [(p, torch.Size(s)) for p, s in params.items()]
    assert len(model["param_shapes"]) == 1 and len(model["module"]) == 0, model
    assert model["buffer_names"] == [] and model["shared_params"] == {}, model
    assert model["frozen_param_shapes"] is None and model["skipped_steps"] == 0, model
    assert (model["global_steps"], model["dp_world_size"], model["mp_world_size"]) == (12, 1, 1)
    assert model["ds_version"] == "0.14.1" and "lr_scheduler" not in model, model
    osd = load(os.path.join(out, "zero", "optimizer_state.pt"))
    assert osd == {"ds_version": "0.14.1", "param_groups": []}, osd
    # fc reads it back as a UCP: the exported fp32 weights and states are torch's values.
    exported = os.path.join(tmp, "torch-exported")
    fcio.run([EXPORT, out, exported, "--quiet", "--include-optimizer"])
    got, _ = fcio.read_hf_dir(exported)
    for p in params:
        for name, key in ((p, "model." + p), ("optimizer.exp_avg." + p, f"optim.state.{p}.exp_avg"),
                          ("optimizer.exp_avg_sq." + p, f"optim.state.{p}.exp_avg_sq")):
            want = expected[key]
            if want.dtype == np.uint16:
                want = fcio.bf16_bits_to_f32(want).reshape(want.shape)
            assert got[name][0] == "F32", (name, got[name][0])
            assert np.array_equal(fcio.bits(got[name][1]), fcio.bits(want.astype(np.float32))), name
    # --ucp-zero3: the form DeepSpeed's stage-3 loader reads (raw flat tensors, the step in
    # optimizer_state_dict, zero_pp_rank_0 model states), read back by fc through param_shapes.
    out3 = os.path.join(tmp, "torch-z3", "universal")
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out3, "--output-format", "ucp", "--quiet",
              "--ucp-zero3"])
    assert sorted(os.listdir(out3)) == ["zero", "zero_pp_rank_0_mp_rank_00_model_states.pt"]
    for p in params:
        folder = os.path.join(out3, "zero", p)
        assert sorted(os.listdir(folder)) == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt"], folder
        for state, key in (("fp32", "model." + p), ("exp_avg", f"optim.state.{p}.exp_avg"),
                           ("exp_avg_sq", f"optim.state.{p}.exp_avg_sq")):
            t = load(os.path.join(folder, state + ".pt"))
            assert torch.is_tensor(t) and t.dim() == 1, (p, state, type(t))
            want = expected[key]
            if want.dtype == np.uint16:
                want = fcio.bf16_bits_to_f32(want)
            same_bits(t, np.asarray(want).reshape(-1), p + "/" + state + " (zero3)")
    osd = load(os.path.join(out3, "zero", "optimizer_state.pt"))
    assert osd == {"ds_version": "0.14.1", "optimizer_state_dict": {
        "state": {0: {"step": 12}}, "param_groups": [{}]}}, osd
    model3 = load(os.path.join(out3, "zero_pp_rank_0_mp_rank_00_model_states.pt"))
    assert model3.keys() == model.keys() and model3["global_steps"] == 12, model3
    exported3 = os.path.join(tmp, "torch-z3-exported")
    fcio.run([EXPORT, out3, exported3, "--quiet", "--include-optimizer"])
    got3, _ = fcio.read_hf_dir(exported3)
    assert sorted(got3) == sorted(k for k in got if not k.startswith("optimizer.step.")), got3
    for k in got3:
        assert np.array_equal(fcio.bits(got3[k][1]), fcio.bits(got[k][1])), k
    p = fcio.run([CONVERT, os.path.join(DS, "zero1", "ckpt"), os.path.join(tmp, "z3ds"),
                  "--output-format", "ucp", "--ucp-zero3"], expect=3)
    assert "takes its form from the source's ZeRO stage" in p.stderr, p.stderr
    # --ucp-fresh-optimizer: weights without Adam states (HF safetensors) become params with
    # zero moments and step 0; integer and bool tensors are left out.
    hf = os.path.join(TESTDATA, "safetensors", "hf_sharded")
    fresh = os.path.join(tmp, "fresh", "universal")
    plan = fcio.run([CONVERT, hf, fresh, "--output-format", "ucp", "--ucp-fresh-optimizer",
                     "--dry-run"]).stdout
    assert "left out (not floating point): 2 tensor(s)" in plan, plan
    fcio.run([CONVERT, hf, fresh, "--output-format", "ucp", "--ucp-fresh-optimizer", "--quiet"])
    source, _ = fcio.read_hf_dir(hf)
    floating = {k: v for k, v in source.items() if v[0] in ("F32", "F16", "BF16")}
    assert sorted(os.listdir(os.path.join(fresh, "zero"))) == sorted(floating) + ["optimizer_state.pt"]
    for name, (dt, arr) in floating.items():
        want = fcio.bf16_bits_to_f32(arr).reshape(arr.shape) if dt == "BF16" else arr
        folder = os.path.join(fresh, "zero", name)
        same_bits(load(os.path.join(folder, "fp32.pt"))["param"], want, name + " (fresh)")
        for state in ("exp_avg", "exp_avg_sq"):
            same_bits(load(os.path.join(folder, state + ".pt"))["param"],
                      np.zeros(arr.shape, np.float32), name + "/" + state + " (fresh)")
        assert load(os.path.join(folder, "step.pt")) == 0, name
    assert load(os.path.join(fresh, "mp_rank_00_model_states.pt"))["global_steps"] == 0
    p = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), os.path.join(tmp, "fresh2"),
                  "--output-format", "ucp", "--ucp-fresh-optimizer"], expect=3)
    assert "is an Adam state: leave out --ucp-fresh-optimizer" in p.stderr, p.stderr
    # Refusals on hand-made safetensors files (torch's names, one problem each): exit 3 with
    # the message naming what is wrong, nothing written.
    def st(tensors):
        path = os.path.join(tmp, "bad-%d.safetensors" % len(os.listdir(tmp)))
        header, blob = {}, b""
        for name, (dtype, shape, values) in tensors.items():
            np_type = {"F32": np.float32, "I64": np.int64}[dtype]
            data = np.asarray(values, np_type).reshape(shape).tobytes()
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [len(blob), len(blob) + len(data)]}
            blob += data
        text = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + blob)
        return path
    def refused_st(tensors, words, extra=()):
        out = os.path.join(tmp, "bad-out", "universal")
        p = fcio.run([CONVERT, st(tensors), out, "--output-format", "ucp", *extra], expect=3)
        for w in words:
            assert w in p.stderr, (w, p.stderr)
        assert not os.path.exists(os.path.dirname(out)), out
    avg = {"optim.state.w.exp_avg": ("F32", [2], [1, 2])}
    sq = {"optim.state.w.exp_avg_sq": ("F32", [2], [3, 4])}
    w = {"w": ("F32", [2], [5, 6])}
    step = {"optim.state.w.step": ("F32", [], [3])}
    refused_st(avg, ["optim.state.w.exp_avg has no weight (looked for w, model.w, module.w)"])
    refused_st({**avg, **w}, ["has no optim.state.w.exp_avg_sq"])
    refused_st({**avg, **w, **sq}, ["has no step tensor optim.state.w.step"])
    refused_st({**avg, **w, **sq, "optim.state.w.step": ("F32", [2], [3, 3])},
               ["optim.state.w.step: a step of shape", "expected one element"])
    refused_st({**avg, **w, **sq, "optim.state.w.step": ("F32", [], [1.5])},
               ["optim.state.w.step: step 1.5", "is not a count of steps"])
    refused_st({**avg, **sq, **step, "w": ("I64", [2], [5, 6])},
               ["w is int64, not a floating-point weight or Adam state"])
    refused_st({**avg, **sq, **step, "w": ("F32", [3], [5, 6, 7])}, ["has shape", "its weight w"])
    refused_st({"ids": ("I64", [2], [1, 2])}, ["no floating-point tensors"],
               ["--ucp-fresh-optimizer"])
    for bad in ("a/b", ".."):
        refused_st({bad: ("F32", [2], [1, 2])},
                   ["param name '%s' cannot be a directory name under zero/" % bad],
                   ["--ucp-fresh-optimizer"])
    # An int64 step (older torch) is read as well.
    int_step = os.path.join(tmp, "int-step", "universal")
    fcio.run([CONVERT, st({**avg, **w, **sq, "optim.state.w.step": ("I64", [], [7])}), int_step,
              "--output-format", "ucp", "--quiet"])
    assert load(os.path.join(int_step, "zero", "w", "step.pt")) == 7
    # Params whose steps differ: refused, naming both, nothing written.
    p = fcio.run([CONVERT, os.path.join(TESTDATA, "torch_dcp_adam", "fsdp_adam_steps", "ckpt"),
                  os.path.join(tmp, "steps", "universal"), "--output-format", "ucp"], expect=6)
    for w in ("optim.state.embed.weight.step is 12", "optim.state.norm.weight.step is 11",
              "one step"):
        assert w in p.stderr, (w, p.stderr)
    assert not os.path.exists(os.path.join(tmp, "steps"))
    print("ok torch")


def check_named_ucp(out, params, step):
    """OUT is a UCP (ZeRO 1/2 form) of `params`: {param: {state: want}}, want the source's
    values (bfloat16 bit patterns widened), every file a {"param", "cat_dim"} dict of fp32
    and step.pt the int `step`; fc exports it back to the same values."""
    assert sorted(os.listdir(os.path.join(out, "zero"))) == sorted([*params, "optimizer_state.pt"])
    for p, states in params.items():
        folder = os.path.join(out, "zero", p)
        assert sorted(os.listdir(folder)) == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"]
        for state, want in states.items():
            d = load(os.path.join(folder, state + ".pt"))
            assert list(d) == ["cat_dim", "param"] and d["cat_dim"] == 0, (p, state, d.keys())
            if want.dtype == np.uint16:  # bfloat16 bit patterns: exact in fp32
                want = fcio.bf16_bits_to_f32(want).reshape(want.shape)
            assert d["param"].dtype == torch.float32, (p, state, d["param"].dtype)
            assert list(d["param"].shape) == list(want.shape), (p, state, d["param"].shape)
            same_bits(d["param"], want, p + "/" + state)
        got_step = load(os.path.join(folder, "step.pt"))
        assert type(got_step) is int and got_step == step, (p, got_step)
    model = load(os.path.join(out, "mp_rank_00_model_states.pt"))
    assert list(model["param_shapes"][0]) == list(params), model["param_shapes"]
    assert model["global_steps"] == step, model["global_steps"]
    exported = out + "-exported"
    fcio.run([EXPORT, out, exported, "--quiet", "--include-optimizer"])
    got, _ = fcio.read_hf_dir(exported)
    for p, states in params.items():
        for state, name in (("fp32", p), ("exp_avg", "optimizer.exp_avg." + p),
                            ("exp_avg_sq", "optimizer.exp_avg_sq." + p)):
            want = states[state]
            if want.dtype == np.uint16:
                want = fcio.bf16_bits_to_f32(want).reshape(want.shape)
            assert got[name][0] == "F32", (name, got[name][0])
            assert np.array_equal(fcio.bits(got[name][1]), fcio.bits(want.astype(np.float32))), name


def torch_dist_states(expected, keys, master="fp32_param"):
    """What a UCP of Megatron torch_dist params `keys` holds: their optimizer.state.* values."""
    return {k: {"fp32": expected[f"optimizer.state.{master}.{k}"],
                "exp_avg": expected["optimizer.state.exp_avg." + k],
                "exp_avg_sq": expected["optimizer.state.exp_avg_sq." + k]} for k in keys}


def case_others():
    """UCPs from the other namings of Adam states: Megatron-Core's dist checkpointing
    (testdata/torch_dcp_adam/megatron_dist: optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key>,
    bf16 weights, the step in common.pt's param groups) and PaddlePaddle
    (testdata/paddle_flex/adam: <key>.w_0 master weights, .moment1_0, .moment2_0 flattened ZeRO
    shards, the beta powers). Where no step is stored (Paddle, torch_dist without common.pt)
    --ucp-step gives it, and without it nothing is written. The fp32 master weight wins over
    the 16-bit weight where both exist."""
    # Megatron torch_dist: the step from common.pt's param groups (40).
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "megatron_dist")
    root = os.path.join(tmp, "megatron-dist")
    out = os.path.join(root, "universal")
    plan = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp",
                     "--dry-run"]).stdout
    assert ("left out (no Adam state): 1 tensor(s): "
            "decoder.layers.self_attention.core_attention.inv_freq") in plan, plan
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp", "--quiet"])
    expected = fcio.expected_values(fixture)
    keys = ["embedding.word_embeddings.weight", "decoder.layers.mlp.linear_fc1.weight",
            "decoder.final_layernorm.weight"]
    params = torch_dist_states(expected, keys)
    for k in keys:  # random values: a UCP of the bf16 weights would differ
        assert not np.array_equal(fcio.bf16_bits_to_f32(expected[k]),
                                  params[k]["fp32"].reshape(-1)), k
    check_named_ucp(out, params, 40)
    assert open(os.path.join(root, "latest_universal")).read() == "universal"
    # Without common.pt nothing says the step: --ucp-step gives it.
    bare = os.path.join(tmp, "megatron-dist-bare")
    shutil.copytree(os.path.join(fixture, "ckpt"), bare)
    os.remove(os.path.join(bare, "common.pt"))
    out2 = os.path.join(tmp, "megatron-dist-2", "universal")
    p = fcio.run([CONVERT, bare, out2, "--output-format", "ucp"], expect=3)
    for w in ("Megatron torch_dist keeps no Adam step", "--ucp-step"):
        assert w in p.stderr, (w, p.stderr)
    assert not os.path.exists(os.path.dirname(out2))
    fcio.run([CONVERT, bare, out2, "--output-format", "ucp", "--quiet", "--ucp-step", "41"])
    check_named_ucp(out2, params, 41)
    # The fully_reshardable form (Megatron-Core 0.14 on): the master weight is
    # optimizer.state.param.<key>; the bf16 weights it stands for are not left out.
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "megatron_reshardable")
    out3 = os.path.join(tmp, "megatron-reshardable", "universal")
    plan = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out3, "--output-format", "ucp",
                     "--dry-run"]).stdout
    assert "left out" not in plan, plan
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out3, "--output-format", "ucp", "--quiet"])
    expected = fcio.expected_values(fixture)
    keys = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    params = torch_dist_states(expected, keys, master="param")
    for k in keys:
        assert not np.array_equal(fcio.bf16_bits_to_f32(expected[k]),
                                  params[k]["fp32"].reshape(-1)), k
    check_named_ucp(out3, params, 41)
    inspect = fcio.run([os.path.join(BUILD, "tools", "fc-inspect"), os.path.join(fixture, "ckpt")])
    assert "megatron.optimizer_sharding_type fully_reshardable" in inspect.stdout, inspect.stdout
    # Megatron-Core 0.8-0.13's fully_sharded_model_space as its torch_dist saves it: the states
    # N-D reformulated (fragments x fragment numel, DP ranges cutting rows), their original
    # shapes in the metadata's mcore_data. fc reads them in their original shapes: the export
    # gives expected/ (put back from the fragments by the generator), and so does the UCP.
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "megatron_flattened")
    expected = fcio.expected_values(fixture)
    exported = os.path.join(tmp, "megatron-flattened-export")
    fcio.run([EXPORT, os.path.join(fixture, "ckpt"), exported, "--quiet", "--include-optimizer"])
    got, _ = fcio.read_hf_dir(exported)
    assert sorted(got) == sorted(expected), sorted(set(got) ^ set(expected))
    for k, want in expected.items():
        assert list(got[k][1].shape) == list(want.shape), (k, got[k][1].shape, want.shape)
        assert np.array_equal(fcio.bits(got[k][1]), fcio.bits(want)), k
    out5 = os.path.join(tmp, "megatron-flattened", "universal")
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out5, "--output-format", "ucp", "--quiet"])
    keys = ["embedding.word_embeddings.weight", "decoder.layers.mlp.linear_fc1.weight",
            "decoder.final_layernorm.weight"]
    params = torch_dist_states(expected, keys)
    check_named_ucp(out5, params, 44)
    # The dp_reshardable form (Megatron-Core 0.14+'s default: flat per-bucket buffers that
    # name no param) as Megatron saves a TP 2 x DP 2 SwiGLU GPT: the params' places are found
    # from the data, and the UCP holds every param's master and moments (TP rank 0's copy of
    # the replicated ones, the tied layer norms in layer order).
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "megatron_dp_buckets")
    expected = fcio.expected_values(fixture)
    out6 = os.path.join(tmp, "megatron-dp-buckets", "universal")
    plan = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out6, "--output-format", "ucp",
                     "--dry-run"]).stdout
    assert "left out" not in plan, plan
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out6, "--output-format", "ucp", "--quiet"])
    layer = "decoder.layers."
    keys = (["embedding.word_embeddings.weight"]
            + [layer + k for k in ("self_attention.linear_proj.weight",
                                   "self_attention.linear_qkv.layer_norm_weight",
                                   "self_attention.linear_qkv.weight",
                                   "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight",
                                   "mlp.linear_fc2.weight")]
            + ["decoder.final_layernorm.weight", "output_layer.weight"])  # the model's order
    assert sorted(keys) == sorted(k for k in expected if not k.startswith("optimizer.")), keys
    params = torch_dist_states(expected, keys)
    check_named_ucp(out6, params, 45)
    # The deprecated dp_zero_gather_scatter form (one pickled dict per TP rank, the buckets
    # back to back): the same mapping, from the tensors inside the objects.
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "megatron_dp_zero")
    expected = fcio.expected_values(fixture)
    out7 = os.path.join(tmp, "megatron-dp-zero", "universal")
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out7, "--output-format", "ucp", "--quiet"])
    params = torch_dist_states(expected, keys)
    check_named_ucp(out7, params, 45)
    # Buckets whose masters round to no weight (random values) stay flat: refused, exit 6,
    # saying why and with the flag that makes Megatron save a per-param form; nothing written.
    fixture = os.path.join(TESTDATA, "torch_dcp_adam", "megatron_dp_reshardable")
    out4 = os.path.join(tmp, "megatron-dp-reshardable", "universal")
    p = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out4, "--output-format", "ucp"], expect=6)
    for w in ("flat per-bucket buffers", "bucket_idx_0.param", "sharding type dp_reshardable",
              "position 0: no model param's weight is the master weights there rounded",
              "--dist-ckpt-optim-fully-reshardable"):
        assert w in p.stderr, (w, p.stderr)
    assert not os.path.exists(os.path.dirname(out4))
    print("ok megatron torch_dist")
    # PaddlePaddle.
    fixture = os.path.join(TESTDATA, "paddle_flex", "adam")
    root = os.path.join(tmp, "paddle")
    out = os.path.join(root, "universal")
    p = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp"], expect=3)
    for w in ("PaddlePaddle keeps no Adam step", "--ucp-step"):
        assert w in p.stderr, (w, p.stderr)
    assert not os.path.exists(root)
    # The beta powers stand for the step: only the tensor without state is left out.
    plan = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp",
                     "--ucp-step", "30", "--dry-run"]).stdout
    assert "left out (no Adam state): 1 tensor(s): rope.inv_freq\n" in plan, plan
    fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp", "--quiet",
              "--ucp-step", "30"])
    expected = fcio.expected_values(fixture)
    params = {"emb.w": {"fp32": expected["emb.w.w_0"]}, "norm.w": {"fp32": expected["norm.w"]}}
    for k, states in params.items():
        states["exp_avg"] = expected[k + ".moment1_0"]
        states["exp_avg_sq"] = expected[k + ".moment2_0"]
    # The master weight is not the bf16 weight widened (it rounds to it).
    assert not np.array_equal(fcio.bf16_bits_to_f32(expected["emb.w"]),
                              expected["emb.w.w_0"].reshape(-1))
    check_named_ucp(out, params, 30)
    print("ok paddle")
    # --ucp-step where the source stores a step: refused, nothing written.
    for src, words in ((os.path.join(TESTDATA, "torch_dcp_adam", "fsdp_adam", "ckpt"),
                        ["--ucp-step applies to sources that store no Adam step",
                         "optim.state.embed.weight.step"]),
                       (os.path.join(DS, "zero1", "ckpt"), ["DeepSpeed's optimizer files"]),
                       (os.path.join(TESTDATA, "megatron_legacy", "gpt_tp2_pp2", "ckpt"),
                        ["megatron.optimizer_step"]),
                       (os.path.join(TESTDATA, "torch_dcp_adam", "megatron_dist", "ckpt"),
                        ["param groups hold step 40"])):
        p = fcio.run([CONVERT, src, os.path.join(tmp, "step-given", "universal"),
                      "--output-format", "ucp", "--ucp-step", "5"], expect=3)
        for w in words:
            assert w in p.stderr, (src, w, p.stderr)
        assert not os.path.exists(os.path.join(tmp, "step-given"))
    for extra, words in ((["--ucp-step", "5", "--preset", "megatron-gpt"], "applies to --output-format ucp only"),
                         (["--output-format", "ucp", "--ucp-step", "5", "--ucp-fresh-optimizer"],
                          "does not apply with --ucp-fresh-optimizer"),
                         (["--output-format", "ucp", "--ucp-step", "-1"], "--ucp-step")):
        p = fcio.run([CONVERT, os.path.join(fixture, "ckpt"), os.path.join(tmp, "x"), *extra],
                     expect=2)
        assert words in p.stderr, (extra, p.stderr)
    print("ok others")


def case_aoa():
    """--aoa with --output-format ucp: the program sees the params under their UCP names and
    moves each param's Adam states with it (rename, transpose, split, removal), on a torch
    DCP source (bf16 weights), a Megatron torch_dist one (the fp32 master weight is what is
    mapped) and weights without states (--ucp-fresh-optimizer); a DeepSpeed source and a
    cast are refused."""
    def program(name, text):
        path = os.path.join(tmp, name + ".aoa")
        with open(path, "w") as f:
            f.write(text)
        return path

    def widen(a):
        return fcio.bf16_bits_to_f32(a).reshape(a.shape) if a.dtype == np.uint16 else a

    def convert_with(name, text):
        """Converts fixture torch_dcp_adam/NAME with program TEXT; returns OUT and the
        fixture's expected values."""
        fixture = os.path.join(TESTDATA, "torch_dcp_adam", name)
        out = os.path.join(tmp, "aoa-" + name, "universal")
        fcio.run([CONVERT, os.path.join(fixture, "ckpt"), out, "--output-format", "ucp",
                  "--quiet", "--aoa", program(name, text)])
        return out, fcio.expected_values(fixture)

    out, expected = convert_with("fsdp_adam", "embed.weight -> model.embed_tokens.weight\n"
                                              "layers.0.proj.weight^T -> proj_t\n"
                                              "proj_t -> proj_a, proj_b, axis=1\n"
                                              "norm.weight -> _\n")
    params = {"model.embed_tokens.weight": {}, "proj_a": {}, "proj_b": {}}
    for state, fmt in (("fp32", "model.{}"), ("exp_avg", "optim.state.{}.exp_avg"),
                       ("exp_avg_sq", "optim.state.{}.exp_avg_sq")):
        params["model.embed_tokens.weight"][state] = widen(expected[fmt.format("embed.weight")])
        proj_t = np.ascontiguousarray(widen(expected[fmt.format("layers.0.proj.weight")]).T)
        assert proj_t.shape == (4, 6), proj_t.shape
        params["proj_a"][state] = np.ascontiguousarray(proj_t[:, :3])
        params["proj_b"][state] = np.ascontiguousarray(proj_t[:, 3:])
    check_named_ucp(out, params, 12)
    print("ok torch")
    # Megatron torch_dist: the fp32 master weight is the param the program maps.
    out, expected = convert_with("megatron_dist",
                                 "embedding.word_embeddings.weight -> emb\n"
                                 "decoder.layers.mlp.linear_fc1.weight -> fc1\n"
                                 "decoder.final_layernorm.weight -> norm\n")
    params = {}
    for new, key in (("emb", "embedding.word_embeddings.weight"),
                     ("fc1", "decoder.layers.mlp.linear_fc1.weight"),
                     ("norm", "decoder.final_layernorm.weight")):
        params[new] = {"fp32": expected["optimizer.state.fp32_param." + key],
                       "exp_avg": expected["optimizer.state.exp_avg." + key],
                       "exp_avg_sq": expected["optimizer.state.exp_avg_sq." + key]}
    check_named_ucp(out, dict(sorted(params.items())), 40)
    print("ok megatron torch_dist")
    # Weights without states: renamed, zero moments of the new shape.
    hf = os.path.join(TESTDATA, "safetensors", "hf_sharded")
    source, _ = fcio.read_hf_dir(hf)
    floating = sorted(k for k, v in source.items() if v[0] in ("F32", "F16", "BF16"))
    first = floating[0]
    aoa = program("fresh", first + "^T -> renamed\n")
    out = os.path.join(tmp, "aoa-fresh", "universal")
    fcio.run([CONVERT, hf, out, "--output-format", "ucp", "--ucp-fresh-optimizer", "--quiet",
              "--aoa", aoa])
    names = sorted(os.listdir(os.path.join(out, "zero")))
    assert names == sorted(floating[1:] + ["renamed", "optimizer_state.pt"]), names
    dt, arr = source[first]
    want = np.ascontiguousarray((fcio.bf16_bits_to_f32(arr).reshape(arr.shape) if dt == "BF16"
                                 else arr.astype(np.float32)).T)
    same_bits(load(os.path.join(out, "zero", "renamed", "fp32.pt"))["param"], want, "renamed")
    for state in ("exp_avg", "exp_avg_sq"):
        same_bits(load(os.path.join(out, "zero", "renamed", state + ".pt"))["param"],
                  np.zeros(want.shape, np.float32), "renamed/" + state)
    print("ok fresh")
    # Refusals (exit 3, nothing written).
    cast = program("cast", "embed.weight -> e, dtype='float16'\n")
    none = program("none", "embed.weight -> _\nlayers.0.proj.weight -> _\nnorm.weight -> _\n")
    fsdp = os.path.join(TESTDATA, "torch_dcp_adam", "fsdp_adam", "ckpt")
    for src, aoa, words in ((os.path.join(DS, "zero1", "ckpt"), cast,
                             "--aoa applies to sources DeepSpeed did not write"),
                            (fsdp, cast, "'e' is cast to float16"),
                            (fsdp, none, "the program leaves no param to write")):
        target = os.path.join(tmp, "aoa-refused", "universal")
        p = fcio.run([CONVERT, src, target, "--output-format", "ucp", "--aoa", aoa], expect=3)
        assert words in p.stderr, (words, p.stderr)
        assert not os.path.exists(os.path.dirname(target))
    print("ok refusals")


def case_errors():
    def refused(case_or_path, code, words, extra=(), out=None):
        src = case_or_path if os.path.isabs(case_or_path) else os.path.join(DS, case_or_path, "ckpt")
        out = out or os.path.join(tmp, "refused", "universal")
        p = fcio.run([CONVERT, src, out, "--output-format", "ucp", *extra], expect=code)
        assert p.stderr.startswith("fc-convert: error: "), p.stderr
        for w in words:
            assert w in p.stderr, (case_or_path, w, p.stderr)
        return p
    refused("tp2", 6, ["without universal_checkpoint_info", "--inject-missing-state"])
    p = fcio.run([CONVERT, os.path.join(DS, "tp2", "ckpt"), os.path.join(tmp, "x"),
                  "--preset", "megatron-gpt", "--inject-missing-state"], expect=2)
    assert "applies to --output-format ucp only" in p.stderr, p.stderr
    refused("tp2_avg", 6, ["layer.bias", "parameter_to_average_patterns"])
    refused("moe", 6, ["MoE"])
    refused("moe_zero2", 6, ["MoE", "does not support expert parallelism"])
    # No fp32 master weights: the model states alone (stage 0 / weights-only copy).
    weights_only = os.path.join(tmp, "weights-only")
    os.makedirs(weights_only)
    shutil.copy(os.path.join(tag_dir("zero1"), "mp_rank_00_model_states.pt"), weights_only)
    refused(weights_only, 3, ["no fp32 master weights"])
    # Other formats: Adam states by torch's or fc's names (case_torch); none here.
    refused(os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt"), 3,
            ["no Adam states found", "optim.state.<param>.exp_avg"])
    # Usage: a target with ucp, none without.
    refused("zero1", 2, ["takes no target"], extra=["--preset", "megatron-gpt"])
    p = fcio.run([CONVERT, os.path.join(DS, "zero1", "ckpt"), os.path.join(tmp, "x")], expect=2)
    assert "give exactly one target" in p.stderr, p.stderr
    # Nothing complete-looking after a refusal: no OUT, no latest_universal.
    assert not os.path.exists(os.path.join(tmp, "refused"))
    # An OUT that is not empty: exit 8, and latest_universal is not written.
    busy = os.path.join(tmp, "busy", "universal")
    os.makedirs(busy)
    open(os.path.join(busy, "keep"), "w").close()
    refused("zero1", 8, ["not empty"], out=busy)
    assert sorted(os.listdir(os.path.join(tmp, "busy"))) == ["universal"]
    # latest_universal is replaced atomically by the next run beside it.
    root = os.path.join(tmp, "twice")
    for name in ("a", "b"):
        fcio.run([CONVERT, os.path.join(DS, "zero1", "ckpt"), os.path.join(root, name),
                  "--output-format", "ucp", "--quiet"])
        assert open(os.path.join(root, "latest_universal")).read() == name
    assert sorted(os.listdir(root)) == ["a", "b", "latest_universal"], os.listdir(root)
    print("ok errors")


try:
    {"write": case_write, "readback": case_readback, "torch": case_torch,
     "others": case_others, "aoa": case_aoa, "errors": case_errors}[CASE]()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
