"""fc-inspect and fc-export on the DeepSpeed fixtures (testdata/deepspeed, torch 1.13 files
written by testdata/gen/deepspeed/gen.py), read back with an independent safetensors reader
(fcio: json + numpy) and compared element by element with the generator's zero_to_fp32-style
reconstruction (expected/*.npy).

usage: deepspeed_test.py BUILD_ROOT TESTDATA CASE
       (CASE: export|inspect|errors|refusals|fused|source_layout|buffers)
"""
import collections
import glob
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

# numpy missing: the independent reader cannot run
np = fcio.import_or_skip("numpy")

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
EXPORT, INSPECT, CONVERT = fcio.tools(BUILD, "fc-export", "fc-inspect", "fc-convert")
FIXTURES = sorted(glob.glob(os.path.join(TESTDATA, "deepspeed", "*", "ckpt")))
assert len(FIXTURES) >= 15, FIXTURES
tmp = tempfile.mkdtemp(prefix="fc-deepspeed-test-")


def case_export():
    for ckpt in FIXTURES:
        fx = os.path.dirname(ckpt)
        label = os.path.basename(fx)
        exp = fcio.expected_values(fx)
        if label in ("tp2", "tp2_avg"):
            continue  # refused, see case_errors
        if label == "moe":  # 16-bit weights only (fp32 export refused, see case_errors)
            out = os.path.join(tmp, label + "-module")
            fcio.run([EXPORT, ckpt, out, "--quiet", "--weights", "module"])
            got, _ = fcio.read_hf_dir(out)
            fcio.same_values(got, {k: v for k, v in exp.items() if not k.startswith("module.")}, label)
            print("ok export", label)
            continue
        # Default: fp32 master weights under the plain names, optimizer states left out.
        out = os.path.join(tmp, label)
        fcio.run([EXPORT, ckpt, out, "--quiet"])
        got, _ = fcio.read_hf_dir(out)
        want = {k: v for k, v in exp.items()
                if not k.startswith("module.") and not k.startswith("optimizer.")}
        fcio.same_values(got, want, label)
        # With the optimizer states (exp_avg, exp_avg_sq, step).
        out = os.path.join(tmp, label + "-opt")
        fcio.run([EXPORT, ckpt, out, "--quiet", "--include-optimizer"])
        got, _ = fcio.read_hf_dir(out)
        want = {k: v for k, v in exp.items() if not k.startswith("module.")}
        fcio.same_values(got, want, label + " --include-optimizer")
        # The 16-bit module weights instead, where the model states hold them.
        out = os.path.join(tmp, label + "-module")
        fcio.run([EXPORT, ckpt, out, "--quiet", "--weights", "module"])
        got, _ = fcio.read_hf_dir(out)
        want = {k: exp.get("module." + k, v) for k, v in exp.items()
                if not k.startswith("module.") and not k.startswith("optimizer.")}
        fcio.same_values(got, want, label + " --weights module")
        if label not in ("zero3", "ucp_zero3", "pp2", "pp2_tp2"):
            key = next(k for k in ("embed.weight", "layer.weight", "attn.qkv.weight") if k in got)
            assert got[key][0] in ("F16", "BF16"), (label, key)
        print("ok export", label)
    # A Universal Checkpoint exports exactly what the ZeRO checkpoint it came from does.
    pairs = (("ucp", "frozen_tied"), ("ucp_tp2", "tp2_ucp"), ("ucp_zero3", "zero3"),
             ("ucp_tp2_fused", "tp2_fused"))
    for extra, (ucp, zero) in [(e, p) for e in ([], ["--include-optimizer"], ["--weights", "module"])
                               for p in pairs]:
        outs = []
        for label in (ucp, zero):
            out = os.path.join(tmp, "same-" + label + "".join(extra))
            fcio.run([EXPORT, os.path.join(TESTDATA, "deepspeed", label, "ckpt"), out, "--quiet"]
                     + extra)
            got = fcio.read_hf_dir(out)[0]
            if ucp == "ucp_zero3":  # a stage-3 UCP has no step.pt
                got = {k: v for k, v in got.items() if not k.startswith("optimizer.step.")}
            outs.append(got)
        fcio.same_values(outs[0], {k: v[1] for k, v in outs[1].items()}, ucp + " == " + zero + str(extra))
        assert all(outs[0][k][0] == outs[1][k][0] for k in outs[0]), extra
    print("ok export ucp == zero")


def case_inspect():
    stages = {"zero1": ("1", "zero", "2"), "zero2": ("2", "zero", "3"),
              "bf16": ("1", "bf16_optimizer", "2"), "tp2": ("1", "zero", "2"),
              "frozen_tied": ("2", "zero", "2"), "zero3": ("3", "zero3", "2"),
              "pp2": ("1", "zero", "2"), "pp2_tp2": ("1", "zero", "2"),
              "tp2_ucp": ("1", "zero", "2"),
              "tp2_avg": ("1", "zero", "2"), "ucp": ("2", "universal", "2"),
              "ucp_tp2": ("1", "universal", "2"), "legacy": ("2", "zero", "2"),
              "ucp_zero3": ("3", "universal", "2"),
              "moe": ("not read (MoE)", "not read (MoE)", "2"),
              "tp2_fused": ("1", "zero", "2"), "tp2_fused_v02": ("2", "zero", "2"),
              "ucp_tp2_fused": ("1", "universal", "2"),
              "moe_zero2": ("2", "zero", "4"), "moe_zero1_dbe": ("1", "zero", "6"),
              "moe_bf16": ("1", "bf16_optimizer", "4"), "tp2_buffers": ("1", "zero", "2")}
    for ckpt in FIXTURES:
        fx = os.path.dirname(ckpt)
        label = os.path.basename(fx)
        j = json.loads(fcio.run([INSPECT, ckpt, "--json"]).stdout)
        a = j["attributes"]
        stage, opt, dp = stages[label]
        # --json types the values: integers as numbers, the rest (versions, tags) as strings.
        assert a["deepspeed.zero_stage"] == (int(stage) if stage.isdigit() else stage), (label, a)
        assert a["deepspeed.optimizer"] == opt, (label, a)
        assert a["deepspeed.dp_degree"] == int(dp), (label, a)
        assert a["deepspeed.tp_degree"] == (2 if "tp2" in label else 1), (label, a)
        assert a["deepspeed.pp_degree"] == (2 if label.startswith("pp2") else 1), (label, a)
        assert isinstance(a["deepspeed.tag"], str), (label, a)
        exp = fcio.expected_values(fx)
        assert sorted(t["key"] for t in j["tensors"]) == sorted(exp), label
        dtypes = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
                  "int64": np.int64}
        for t in j["tensors"]:
            assert np.dtype(dtypes[t["dtype"]]) == exp[t["key"]].dtype, (label, t["key"], t["dtype"])
            assert t["global_shape"] == list(exp[t["key"]].shape), (label, t["key"], t["global_shape"])
        text = fcio.run([INSPECT, ckpt]).stdout
        assert "deepspeed.zero_stage " + stage in text, text
        # --format deepspeed on the tag dir gives the same tensors.
        tag = os.path.join(ckpt, "global_step3" + ("_universal" if label.startswith("ucp") else ""))
        j2 = json.loads(fcio.run([INSPECT, tag, "--json", "--format", "deepspeed"]).stdout)
        assert [t["key"] for t in j2["tensors"]] == [t["key"] for t in j["tensors"]], label
        print("ok inspect", label)


def case_errors():
    tp2 = os.path.join(TESTDATA, "deepspeed", "tp2", "ckpt")
    p = fcio.run([EXPORT, tp2, os.path.join(tmp, "tp2"), "--quiet"], expect=6)
    assert "tensor parallelism" in p.stderr and "universal_checkpoint_info" in p.stderr, p.stderr
    avg = os.path.join(TESTDATA, "deepspeed", "tp2_avg", "ckpt")
    p = fcio.run([EXPORT, avg, os.path.join(tmp, "tp2_avg"), "--quiet"], expect=6)
    assert "layer.bias" in p.stderr and "parameter_to_average_patterns" in p.stderr, p.stderr
    moe = os.path.join(TESTDATA, "deepspeed", "moe", "ckpt")
    p = fcio.run([EXPORT, moe, os.path.join(tmp, "moe"), "--quiet"], expect=6)
    assert "MoE" in p.stderr and "--weights module" in p.stderr, p.stderr
    # Truncated partition: exit 5 naming the file, no output.
    broken = os.path.join(tmp, "broken")
    shutil.copytree(os.path.join(TESTDATA, "deepspeed", "zero2", "ckpt"), broken)
    victim = os.path.join(broken, "global_step3", "zero_pp_rank_2_mp_rank_00_optim_states.pt")
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) - 300])
    p = fcio.run([EXPORT, broken, os.path.join(tmp, "broken-out"), "--quiet"], expect=5)
    assert "zero_pp_rank_2_mp_rank_00_optim_states.pt" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "broken-out", "model.safetensors"))
    p = fcio.run([INSPECT, broken], expect=5)
    assert "zero_pp_rank_2_mp_rank_00_optim_states.pt" in p.stderr, p.stderr
    # Wrong sizes: a partition file of another model in place of rank 1.
    shutil.copy(os.path.join(TESTDATA, "deepspeed", "zero1", "ckpt", "global_step3",
                             "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
                os.path.join(broken, "global_step3", "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    open(victim, "wb").write(data)
    p = fcio.run([INSPECT, broken], expect=5)
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in p.stderr, p.stderr
    assert "partition_count" in p.stderr, p.stderr  # refused before the sizes: see case_refusals
    # --weights on another format is an invalid argument.
    st = sorted(glob.glob(os.path.join(TESTDATA, "torch_dcp", "*", "ckpt")))[0]
    fcio.run([EXPORT, st, os.path.join(tmp, "st"), "--quiet", "--weights", "module"], expect=3)
    print("ok errors")


def case_refusals():
    """Inputs built to reach one refusal each (the files rewritten with torch: needs Debian's
    torch): the message names the file and the numbers that disagree."""
    try:
        import torch
        sys.path.insert(0, os.path.join(TESTDATA, "gen", "deepspeed"))
        import gen  # noqa: F401 (registers the DeepSpeed stand-in classes)
    except ImportError as e:
        print("skipping: the refusal inputs are rewritten with torch:", e)
        sys.exit(77)
    partition_errors(torch)
    fused_errors(torch)


def partition_errors(torch):
    """zero2 (3 ranks; group 0: 8 + 8 + 8 elements, group 1: 2 + 2 + 0 and 2 padding) with
    one rank's optimizer state rewritten: the partition_count check passes, so these reach
    the partition-size and param_slice_mappings checks."""
    optim = "zero_pp_rank_%d_mp_rank_00_optim_states.pt"

    def variant(name, rank, change):
        root = os.path.join(tmp, name)
        shutil.copytree(os.path.join(TESTDATA, "deepspeed", "zero2", "ckpt"), root)
        path = os.path.join(root, "global_step3", optim % rank)
        sd = torch.load(path)
        change(sd["optimizer_state_dict"])
        torch.save(sd, path)
        return root

    def refused(root, *parts):
        for tool in ([INSPECT, root], [EXPORT, root, os.path.join(tmp, "out"), "--quiet"]):
            p = fcio.run(tool, expect=5)
            for part in parts:
                assert part in p.stderr, (part, p.stderr)
        assert not os.path.exists(os.path.join(tmp, "out"))

    def one_short(osd):  # rank 1, group 0: 7 elements + 1 padding (padded size still 8)
        osd["single_partition_of_fp32_groups"][0] = osd["single_partition_of_fp32_groups"][0][:7].clone()
        osd["group_paddings"][0] = 1
    refused(variant("one-short", 1, one_short), optim % 1 + ": group 0 partition holds 7 "
            "elements + 1 padding; with 24 elements in param_shapes over 3 ranks of 8 it must "
            "hold 8 + 0")

    def short_padded(osd):  # rank 1, group 0: 7 elements, no padding (padded size 7, not 8)
        osd["single_partition_of_fp32_groups"][0] = osd["single_partition_of_fp32_groups"][0][:7].clone()
    refused(variant("short-padded", 1, short_padded), optim % 1 + ": group 0 partition holds 7 "
            "elements + 0 padding; with 24 elements in param_shapes over 3 ranks of 8 it must "
            "hold 8 + 0")

    def last_full(osd):  # rank 2, group 1: 1 element + 1 padding where the params end
        osd["single_partition_of_fp32_groups"][1] = torch.zeros(1)
        osd["group_paddings"][1] = 1
    refused(variant("last-full", 2, last_full), optim % 2 + ": group 1 partition holds 1 "
            "elements + 1 padding; with 4 elements in param_shapes over 3 ranks of 2 it must "
            "hold 0 + 2")

    def moved(osd):  # rank 1, group 0: layer.weight's fragment one element early
        osd["param_slice_mappings"][0]["layer.weight"].start = 6
    refused(variant("moved", 1, moved), optim % 1 + ": param_slice_mappings[0]: 'layer.weight' "
            "should be fragment_address(numel=1, start=7) but is (1, 6)")

    def longer(osd):  # rank 1, group 0: embed.weight's fragment one element longer
        osd["param_slice_mappings"][0]["embed.weight"].numel = 8
    refused(variant("longer", 1, longer), optim % 1 + ": param_slice_mappings[0]: 'embed.weight' "
            "should be fragment_address(numel=7, start=0) but is (8, 0)")

    def dropped(osd):  # rank 0, group 1: layer.bias left out
        del osd["param_slice_mappings"][1]["layer.bias"]
    refused(variant("dropped", 0, dropped), optim % 0 + ": param_slice_mappings[1]: 'layer.bias' "
            "should be fragment_address(numel=2, start=0) but is absent")

    def extra(osd):  # rank 2, group 1 (padding only): lists a param it does not hold
        import gen
        osd["param_slice_mappings"][1]["head.bias"] = gen.fragment_address(numel=1, start=0)
    refused(variant("extra", 2, extra), optim % 2 + ": param_slice_mappings[1] lists params "
            "outside this rank's partition")
    print("ok partition sizes and param_slice_mappings refused")


def fused_errors(torch):
    """Fused sub-params whose layout is unknown or contradicts the slices: refused, naming
    the param and pattern."""

    def variant(name, change):
        root = os.path.join(tmp, name)
        shutil.copytree(os.path.join(TESTDATA, "deepspeed", "tp2_fused", "ckpt"), root)
        for m in ("mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"):
            path = os.path.join(root, "global_step3", m)
            sd = torch.load(path)
            change(sd["universal_checkpoint_info"])
            torch.save(sd, path)
        return root

    def no_widths(info):
        del info["sub_param_shard_widths"][r"attn\.qkv\.weight"]
    p = fcio.run([EXPORT, variant("no-widths", no_widths), os.path.join(tmp, "o1"), "--quiet"],
                 expect=5)
    assert "sub_param_shard_widths has no entry" in p.stderr and "attn.qkv.weight" in p.stderr, p.stderr

    def bad_widths(info):
        info["sub_param_shard_widths"][r"attn\.qkv\.weight"] = [[3, 3], [1, 1], [1, 1]]
    p = fcio.run([EXPORT, variant("bad-widths", bad_widths), os.path.join(tmp, "o2"), "--quiet"],
                 expect=5)
    assert "TP rank 0 holds [6, 3]" in p.stderr, p.stderr

    def old_version(info):  # sub-params of odd sizes, but no widths before 0.4
        info["universal_checkpoint_version"] = 0.3
        info["parameter_with_sub_params"][0]["shape"] = ((5, 3, 2), -1)
        info["parameter_with_sub_params"][2]["shape"] = (3, (5, 1))
    p = fcio.run([EXPORT, variant("v03", old_version), os.path.join(tmp, "o3"), "--quiet"],
                 expect=6)
    assert "sub-param size 5 is not divisible by the TP degree 2" in p.stderr, p.stderr
    assert "< 0.4" in p.stderr and "mlp.fused.weight" in p.stderr, p.stderr
    print("ok fused sub-param errors")
    # MoE-style per-group partition counts: the layout of a group partitioned over another
    # DP size is not known (deepspeed.md gives none): refused, not guessed.
    root = os.path.join(tmp, "pc-list")
    shutil.copytree(os.path.join(TESTDATA, "deepspeed", "zero2", "ckpt"), root)
    for r in range(3):
        path = os.path.join(root, "global_step3", "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r)
        sd = torch.load(path)
        sd["optimizer_state_dict"]["partition_count"] = [3, 1]
        torch.save(sd, path)
    p = fcio.run([INSPECT, root], expect=6)
    assert "partition_count differs per param group ([3, 1]" in p.stderr, p.stderr
    print("ok per-group partition_count refused")


def case_fused():
    """Random fused sub-param layouts (UCP 0.4 widths; TP 2-3, DP 1-3, 1-3 dims, any
    partition_dim, sub-params a rank holds none of, column-major module weights) written by
    the generator, exported by fc and compared element by element with the generator's
    merge (needs Debian's torch)."""
    sys.path.insert(0, os.path.join(TESTDATA, "gen", "deepspeed"))
    random, torch, gen = fcio.import_or_skip("random", "torch", "gen")
    rng = random.Random(12)
    for case in range(10):
        tp, dp = rng.choice((2, 3)), rng.choice((1, 2, 3))
        rank = rng.choice((1, 2, 2, 3))
        pd = rng.randrange(rank)
        other = [rng.randint(1, 4) for _ in range(rank)]
        widths = []
        while not widths or any(sum(w[t] for w in widths) == 0 for t in range(tp)):
            widths = [[rng.randint(0, 3) for _ in range(tp)] for _ in range(rng.randint(1, 3))]
        sizes = [sum(w) for w in widths]
        shape = [tuple(sizes) if d == pd else other[d] for d in range(rank)]
        if rank > 1 and rng.random() < 0.5:  # a placeholder dim
            shape[rng.choice([d for d in range(rank) if d != pd])] = -1
        info = {"universal_checkpoint_version": 0.4,
                "parameter_with_sub_params": [{"patterns": [r"fused\."], "shape": tuple(shape),
                                               "partition_dim": pd}],
                "sub_param_shard_widths": {r"fused\.": widths}}
        groups = []
        for t in range(tp):
            local = [sum(w[t] for w in widths) if d == pd else other[d] for d in range(rank)]
            groups.append([collections.OrderedDict((("a.weight", (rng.randint(1, 5),)),
                                                    ("fused.weight", tuple(local)),
                                                    ("b.weight", (3, 2))))])
        label = "fused%d" % case
        strided = ("fused.weight",) if rank == 2 and rng.random() < 0.5 else ()
        gen.gen_zero12(tmp, label, rng.choice((1, 2)), dp, None, seed=40 + case, mp=tp,
                       strided=strided, client={"universal_checkpoint_info": info},
                       rank_groups=groups)
        exp = gen.write_expected(os.path.join(tmp, label))
        exp = {k: gen.to_numpy(v) for k, v in exp.items()}
        what = "%s: tp %d dp %d shape %s pd %d widths %s strided %s" % (
            label, tp, dp, shape, pd, widths, bool(strided))
        out = os.path.join(tmp, label + "-out")
        fcio.run([EXPORT, os.path.join(tmp, label, "ckpt"), out, "--quiet", "--include-optimizer"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, {k: v for k, v in exp.items() if not k.startswith("module.")}, what)
        out = os.path.join(tmp, label + "-module")
        fcio.run([EXPORT, os.path.join(tmp, label, "ckpt"), out, "--quiet", "--weights", "module"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, {k: exp.get("module." + k, v) for k, v in exp.items()
                               if not k.startswith(("module.", "optimizer."))}, what + " module")
        # The Universal Checkpoint fc writes: the merged fp32 param and Adam states, and
        # sub_param_shape as ds_to_universal saves it.
        ucp = os.path.join(tmp, label + "-ucp", "universal")
        fcio.run([CONVERT, os.path.join(tmp, label, "ckpt"), ucp, "--output-format", "ucp",
                  "--quiet"])
        for state, key in (("fp32", "fused.weight"), ("exp_avg", "optimizer.exp_avg.fused.weight"),
                           ("exp_avg_sq", "optimizer.exp_avg_sq.fused.weight")):
            saved = torch.load(os.path.join(ucp, "zero", "fused.weight", state + ".pt"))
            want = gen.ucp_keys("fused.weight", info, [torch.from_numpy(exp[key])])
            assert list(saved) == list(want) + ["param"], (what, list(saved))
            assert saved["sub_param_shape"] == want["sub_param_shape"], (what, saved)
            assert np.array_equal(fcio.bits(saved["param"].numpy()), fcio.bits(exp[key])), what
        print("ok", what)


def case_buffers():
    """Issue 29 item 5: module buffers at TP 2 (tp2_buffers, gen_tp_buffers.py) are not
    concatenated like params: equal TP copies export as one tensor, differing ones per rank,
    named in a warning; fc-inspect shows them in deepspeed.tp_buffers_per_rank."""
    ckpt = os.path.join(TESTDATA, "deepspeed", "tp2_buffers", "ckpt")
    for extra in ([], ["--weights", "module"]):
        out = os.path.join(tmp, "buffers" + "".join(extra))
        p = fcio.run([EXPORT, ckpt, out] + extra)
        got, _ = fcio.read_hf_dir(out)
        dt, pos = got["position_ids"]
        assert dt == "I64" and pos.shape == (1, 37), (dt, pos.shape)
        assert np.array_equal(pos, np.arange(37, dtype=np.int64).reshape(1, 37)), pos
        assert got["rotary.inv_freq"][1].shape == (4,)
        assert got["bn.num_batches_tracked"][1].shape == ()
        assert got["dense.mask"][1].shape == (4, 2)  # row-parallel pattern: cat along dim 1
        for name, shapes in (("alibi.slopes", (2, 2)), ("attn.cache", (2, 3))):
            assert name not in got, sorted(got)
            for t, shape in enumerate(shapes):
                assert got["mp_rank_%02d.%s" % (t, name)][1].shape == (shape,), (name, t)
        assert "mp_rank_00.position_ids" not in got and "mp_rank_01.position_ids" not in got
        warn = [line for line in p.stderr.splitlines() if "TP copies differ" in line]
        assert len(warn) == 1, p.stderr
        assert "alibi.slopes (values differ" in warn[0] and "attn.cache (float16 [2]" in warn[0], warn
        assert "position_ids" not in warn[0], warn
    # fc-convert says the same, and writes the per-rank copies under their rank names.
    conv = os.path.join(tmp, "buffers-conv")
    src = json.loads(fcio.run([INSPECT, ckpt, "--json"]).stdout)["tensors"]
    whole = os.path.join(tmp, "buffers-whole.json")  # every tensor whole on one rank
    json.dump({"format": "fc-layout-manifest", "version": 1,
               "tensors": [{"key": t["key"], "dtype": t["dtype"],
                            "global_shape": t["global_shape"]} for t in src],
               "ranks": [{"rank": 0, "chunks": [
                   {"key": t["key"], "global_offset": [0] * len(t["global_shape"]),
                    "local_shape": t["global_shape"], "flattened_range": None,
                    "replica_id": 0} for t in src]}]}, open(whole, "w"))
    p = fcio.run([CONVERT, ckpt, conv, "--target-manifest", whole])
    warn = [line for line in p.stderr.splitlines() if "TP copies differ" in line]
    assert len(warn) == 1 and "alibi.slopes (values differ" in warn[0], p.stderr
    conv_keys = {t["key"] for t in json.loads(fcio.run([INSPECT, conv, "--json"]).stdout)["tensors"]}
    assert "mp_rank_01.alibi.slopes" in conv_keys and "position_ids" in conv_keys, sorted(conv_keys)
    j = json.loads(fcio.run([INSPECT, ckpt, "--json"]).stdout)
    per_rank = j["attributes"]["deepspeed.tp_buffers_per_rank"]
    assert "alibi.slopes" in per_rank and "attn.cache" in per_rank, per_rank
    keys = {t["key"]: t for t in j["tensors"]}
    assert keys["position_ids"]["global_shape"] == [1, 37], keys["position_ids"]
    assert "module.mp_rank_01.alibi.slopes" in keys, sorted(keys)
    text = fcio.run([INSPECT, ckpt]).stdout
    assert "deepspeed.tp_buffers_per_rank" in text, text
    print("ok buffers")


def case_source_layout():
    """--source-layout FILE merges a TP 2 checkpoint without universal_checkpoint_info (tp2):
    each rule's axis concatenates the TP slices; the norm buffer, which no rule splits and
    whose TP copies differ, stays per rank (as without rules: each TP rank loads its own
    buffers), named in deepspeed.tp_buffers_per_rank; compared element by element with the
    per-rank tensors the generator wrote, for the fp32 weights, the module weights and the
    Adam states. A param without an axis whose copies differ is refused (a replicated
    tensor is exported once only after its TP copies are found equal)."""
    fx = os.path.join(TESTDATA, "deepspeed", "tp2")
    exp = fcio.expected_values(fx)
    ckpt = os.path.join(fx, "ckpt")
    # Without rules: refused, and the message points to --source-layout.
    p = fcio.run([EXPORT, ckpt, os.path.join(tmp, "refused"), "--quiet"], expect=6)
    assert "--source-layout" in p.stderr, p.stderr
    for axis in (0, 1):
        rules = os.path.join(tmp, f"rules{axis}.json")
        json.dump({"tensor_parallel": [{"regex": r"layer\.weight$", "axis": axis},
                                       {"regex": r"layer\.bias$", "axis": 0}]}, open(rules, "w"))
        for weights, prefix in (("fp32", ""), ("module", "module.")):
            out = os.path.join(tmp, f"axis{axis}_{weights}")
            fcio.run([EXPORT, ckpt, out, "--quiet", "--weights", weights, "--include-optimizer",
                      "--source-layout", rules])
            got, _ = fcio.read_hf_dir(out)
            want = {}
            for name in ("layer.weight", "layer.bias"):
                ax = axis if name == "layer.weight" else 0
                want[name] = np.concatenate([exp[f"mp_rank_0{t}.{prefix}{name}"] for t in (0, 1)], axis=ax)
                for state in ("exp_avg", "exp_avg_sq"):
                    key = f"optimizer.{state}.{name}"
                    want[key] = np.concatenate([exp[f"mp_rank_0{t}.{key}"] for t in (0, 1)], axis=ax)
                want[f"optimizer.step.{name}"] = exp[f"mp_rank_00.optimizer.step.{name}"]
            for t in (0, 1):
                want[f"mp_rank_0{t}.norm.running_mean"] = exp[
                    f"mp_rank_0{t}." + ("module." if weights == "module" else "") + "norm.running_mean"]
            assert "norm.running_mean" not in got, (axis, weights, sorted(got))
            for name, w in want.items():
                assert name in got, (axis, weights, name, sorted(got))
                _, arr = got[name]
                if weights == "fp32" and name.endswith("norm.running_mean"):
                    w = w.astype(arr.dtype)  # buffers export as fp32 (zero_to_fp32)
                assert tuple(arr.shape) == tuple(w.shape), (axis, weights, name, arr.shape, w.shape)
                assert np.array_equal(fcio.bits(arr), fcio.bits(w)), (axis, weights, name)
        p = fcio.run([INSPECT, ckpt, "--source-layout", rules])
        assert "deepspeed.tp_merge tensor_parallel rules of --source-layout " + rules in p.stdout, p.stdout
        assert "norm.running_mean (values differ between TP rank 0 and TP rank 1" in p.stdout, p.stdout
    # layer.bias without an axis: replicated by the rules, but its TP copies differ.
    bad = os.path.join(tmp, "rules_bad.json")
    json.dump({"tensor_parallel": [{"regex": r"layer\.weight$", "axis": 0}]}, open(bad, "w"))
    p = fcio.run([EXPORT, ckpt, os.path.join(tmp, "bad"), "--quiet", "--source-layout", bad],
                 expect=5)
    assert ("'layer.bias' (float32 [2]) is replicated across TP (no tensor_parallel axis for it "
            "in --source-layout " + bad + "), but its TP copies differ: element 0 is ") in p.stderr and (
        "fc exports one copy only (give it an axis if it is split across TP)") in p.stderr, p.stderr
    # UCP output records its merge as universal_checkpoint_info: refused with rules.
    p = fcio.run([CONVERT, ckpt, os.path.join(tmp, "ucp"), "--output-format", "ucp",
                  "--source-layout", rules], expect=6)
    assert "merged by --source-layout" in p.stderr, p.stderr
    # DeepSpeed output keeps the TP shards as they are: the rules would have no effect.
    p = fcio.run([CONVERT, ckpt, os.path.join(tmp, "ds"), "--output-format", "deepspeed",
                  "--dp", "1", "--source-layout", rules], expect=2)
    assert "--source-layout has no effect" in p.stderr, p.stderr
    # An axis a tensor lacks: exit 3 naming it (layer.weight gets its axis: without one its
    # differing TP copies would be refused first).
    bad = os.path.join(tmp, "bad.json")
    json.dump({"tensor_parallel": [{"regex": r"layer\.weight$", "axis": 0},
                                   {"regex": r"layer\.bias$", "axis": 1}]}, open(bad, "w"))
    p = fcio.run([INSPECT, ckpt, "--source-layout", bad], expect=3)
    assert "layer.bias" in p.stderr and "axis 1" in p.stderr, p.stderr
    print("ok source_layout")


fcio.run_case(globals(), CASE, tmp)
