"""fc-convert --output-format deepspeed --dp N on the DeepSpeed fixtures (testdata/deepspeed):
every written file is loaded with torch.load (Debian's torch 1.13) and compared with what the
fixture generator writes for the same model at that DP size (gen.gen_at_dp): the same keys in
the same order, tensors bit for bit (dtype, shape, strides, storage offset), pickled objects
(fragment_address, loss scaler, ZeroStageEnum, argparse.Namespace, numpy RNG state) by their
decoded structure. Then fc-export of the converted checkpoint is byte-identical to fc-export of
the source, and dp N -> dp M -> dp N gives back the source's tensors.

usage: deepspeed_write_test.py BUILD_ROOT TESTDATA CASE   (CASE: write|roundtrip|errors)
"""
import filecmp
import os
import shutil
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
# (case, source dp, target dps): stage 1 and 2, one and two param groups, BF16_Optimizer,
# TP 2 with Megatron client state (no export: fc-diff only), TP 2 with
# universal_checkpoint_info and strided module weights, frozen params and tied weights, a
# pipeline (layer files copied), ZeRO-3 (two sub-groups, a frozen param, per-param padding),
# MoE (expert groups re-cut over each expert-parallel rank's new expert-DP group; expert
# files copied), in DeepSpeed's default rank order and with use_data_before_expert_parallelism.
JOBS = [("zero1", 2, [3, 1, 4]), ("zero2", 3, [2, 1, 5]), ("bf16", 2, [3, 1]),
        ("tp2", 2, [3]), ("tp2_ucp", 2, [3]), ("frozen_tied", 2, [3, 1]), ("pp2", 2, [3, 1]),
        ("zero3", 2, [3, 1, 4]), ("moe_zero2", 4, [2, 6, 8]), ("moe_zero1_dbe", 6, [3, 9]),
        ("moe_bf16", 4, [2, 6])]
NO_EXPORT = {"tp2"}  # TP 2 without universal_checkpoint_info: fc-export refuses it
tmp = tempfile.mkdtemp(prefix="fc-ds-write-test-")


def load(path):
    return torch.load(path, map_location="cpu")


INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same(x, y, where):
    """Structural equality; tensors bit for bit with their view (shape, strides, offset)."""
    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor), (where, type(y))
        assert (x.dtype, x.shape, x.stride(), x.storage_offset()) == \
            (y.dtype, y.shape, y.stride(), y.storage_offset()), \
            (where, x.dtype, x.shape, x.stride(), x.storage_offset(),
             y.dtype, y.shape, y.stride(), y.storage_offset())
        i = INT_OF[x.element_size()]
        assert torch.equal(x.contiguous().view(i), y.contiguous().view(i)), (where, x, y)
        return
    if isinstance(x, np.ndarray):
        assert isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y), where
        return
    assert type(x) is type(y), (where, type(x), type(y))
    if isinstance(x, dict):
        assert list(x) == list(y), (where, list(x), list(y))
        for k in x:
            same(x[k], y[k], f"{where}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), (where, len(x), len(y))
        for i, (a, b) in enumerate(zip(x, y)):
            same(a, b, f"{where}[{i}]")
    elif hasattr(x, "__dict__") and not isinstance(x, type):
        same(vars(x), vars(y), where + ".__dict__")
    else:
        assert x == y, (where, x, y)


def tag_dir(ckpt):
    return os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())


def convert(src, out, dp, extra=()):
    return fcio.run([CONVERT, src, out, "--output-format", "deepspeed", "--dp", str(dp),
                     "--quiet", *extra])


def expected(case, dp):
    """The generator's checkpoint of `case` at `dp`."""
    root = os.path.join(tmp, "expected-%s-%d" % (case, dp))
    if not os.path.isdir(root):
        gen.gen_at_dp(root, case, dp)
    return os.path.join(root, case, "ckpt")


def check_same_checkpoint(got, want, label):
    """Same files; every file's loaded object equal (the generator's module weights are views
    of a flat buffer padded for its DP size: views compared, not whole storages)."""
    assert open(os.path.join(got, "latest")).read() == open(os.path.join(want, "latest")).read()
    g, w = tag_dir(got), tag_dir(want)
    assert sorted(os.listdir(g)) == sorted(os.listdir(w)), (label, os.listdir(g), os.listdir(w))
    for n in sorted(os.listdir(w)):
        assert zipfile.ZipFile(os.path.join(g, n)).testzip() is None, (label, n)
        same(load(os.path.join(g, n)), load(os.path.join(w, n)), f"{label}: {n}")
        if n.endswith("_optim_states.pt") and not n.startswith("expp_rank_"):
            # The padded storage of the lean fp32 partition holds zeros after the view.
            osd = load(os.path.join(g, n))["optimizer_state_dict"]
            for t in osd.get("single_partition_of_fp32_groups", []):
                s = torch.tensor([], dtype=t.dtype).set_(t.storage())
                assert torch.count_nonzero(s[t.numel():]) == 0, (label, n)


def diff_equal(a, b, label):
    p = fcio.run([DIFF, a, b])
    assert "bit-identical" in p.stdout, (label, p.stdout)


def exports_equal(a, b, label):
    for extra in ([], ["--weights", "module"]):
        ea, eb = os.path.join(tmp, "exp-a"), os.path.join(tmp, "exp-b")
        for d in (ea, eb):
            shutil.rmtree(d, ignore_errors=True)
        fcio.run([EXPORT, a, ea, "--quiet", "--include-optimizer", *extra])
        fcio.run([EXPORT, b, eb, "--quiet", "--include-optimizer", *extra])
        names = sorted(os.listdir(ea))
        assert names == sorted(os.listdir(eb)), (label, names, os.listdir(eb))
        for n in names:
            assert filecmp.cmp(os.path.join(ea, n), os.path.join(eb, n), shallow=False), \
                (label, extra, n)


def case_write():
    for case, source_dp, dps in JOBS:
        src = os.path.join(DS, case, "ckpt")
        model = [n for n in sorted(os.listdir(tag_dir(src))) if n.endswith("model_states.pt")][-1]
        assert load(os.path.join(tag_dir(src), model))["dp_world_size"] == source_dp
        for dp in dps:
            out = os.path.join(tmp, "%s-dp%d" % (case, dp))
            convert(src, out, dp)
            check_same_checkpoint(out, expected(case, dp), f"{case} dp {source_dp} -> {dp}")
            diff_equal(src, out, f"{case} dp {dp}")
            if case not in NO_EXPORT:
                exports_equal(src, out, f"{case} dp {dp}")
            print("ok write", case, source_dp, "->", dp)
    # Sources at dp 4 (written by the generator): to dp 3 and dp 1.
    for case in ("zero1", "bf16", "zero3"):
        src = expected(case, 4)
        for dp in (3, 1):
            out = os.path.join(tmp, "%s-dp4-dp%d" % (case, dp))
            convert(src, out, dp)
            check_same_checkpoint(out, expected(case, dp), f"{case} dp 4 -> {dp}")
            diff_equal(src, out, f"{case} dp 4 -> {dp}")
        print("ok write", case, "4 -> 3, 1")
    # Streaming under a tiny budget (slabs of a few elements, one thread): the same bytes.
    a = os.path.join(tmp, "zero2-dp2")
    b = os.path.join(tmp, "zero2-dp2-small")
    convert(os.path.join(DS, "zero2", "ckpt"), b, 2, ["--memory-budget", "192", "--threads", "1"])
    for dirpath, _, files in os.walk(a):
        for f in files:
            p = os.path.join(dirpath, f)
            assert filecmp.cmp(p, os.path.join(b, os.path.relpath(p, a)), shallow=False), p
    # A legacy-serialized source (checkpoint_serialization: false) is written as zips: the
    # same tensors (fc-diff), the same exports; its round trip: case_roundtrip.
    leg = os.path.join(tmp, "legacy-dp3")
    convert(os.path.join(DS, "legacy", "ckpt"), leg, 3)
    for n in os.listdir(tag_dir(leg)):
        assert zipfile.is_zipfile(os.path.join(tag_dir(leg), n)), n
    diff_equal(os.path.join(DS, "legacy", "ckpt"), leg, "legacy dp 3")
    exports_equal(os.path.join(DS, "legacy", "ckpt"), leg, "legacy dp 3")
    # A tag dir as input: the same output.
    c = os.path.join(tmp, "zero1-tagdir")
    convert(tag_dir(os.path.join(DS, "zero1", "ckpt")), c, 3)
    check_same_checkpoint(c, os.path.join(tmp, "zero1-dp3"), "zero1 from the tag dir")
    # No optimizer files (stage 0 or a weights-only copy): the model states alone, with the
    # new dp_world_size.
    w0 = os.path.join(tmp, "weights-only")
    os.makedirs(w0)
    shutil.copy(os.path.join(tag_dir(os.path.join(DS, "zero1", "ckpt")),
                             "mp_rank_00_model_states.pt"), w0)
    w4 = os.path.join(tmp, "weights-only-dp4")
    convert(w0, w4, 4)
    assert open(os.path.join(w4, "latest")).read() == "weights-only"
    assert os.listdir(tag_dir(w4)) == ["mp_rank_00_model_states.pt"]
    got = load(os.path.join(tag_dir(w4), "mp_rank_00_model_states.pt"))
    want = load(os.path.join(w0, "mp_rank_00_model_states.pt"))
    assert got["dp_world_size"] == 4 and want["dp_world_size"] == 2
    want["dp_world_size"] = 4
    same(got, want, "weights-only")
    # --dry-run: the plan, nothing written.
    p = convert(os.path.join(DS, "zero1", "ckpt"), os.path.join(tmp, "dry"), 3, ["--dry-run"])
    assert "dp 2 -> 3" in p.stdout and "zero" in p.stdout, p.stdout
    assert not os.path.exists(os.path.join(tmp, "dry"))
    print("ok write small budget, legacy source, tag dir, dry run")


def case_roundtrip():
    # dp N -> dp M -> dp N: every file equal to the source's (model states storages included:
    # they are copied byte for byte).
    for case, source_dp, middle in [("zero1", 2, 3), ("zero2", 3, 4), ("bf16", 2, 3),
                                    ("frozen_tied", 2, 1), ("tp2", 2, 5), ("pp2", 2, 1),
                                    ("tp2_ucp", 2, 3), ("zero3", 2, 3), ("legacy", 2, 3),
                                    ("moe_zero2", 4, 6), ("moe_zero1_dbe", 6, 3),
                                    ("moe_bf16", 4, 2)]:
        src = os.path.join(DS, case, "ckpt")
        mid = os.path.join(tmp, case + "-mid")
        back = os.path.join(tmp, case + "-back")
        convert(src, mid, middle)
        convert(mid, back, source_dp)
        check_same_checkpoint(back, src, f"{case} {source_dp} -> {middle} -> {source_dp}")
        print("ok roundtrip", case)


def case_errors():
    def refused(src, code, words, extra=(), dp="3"):
        out = os.path.join(tmp, "refused", "out")
        args = [CONVERT, src, out, "--output-format", "deepspeed", *extra]
        if dp is not None:
            args += ["--dp", dp]
        p = fcio.run(args, expect=code)
        assert p.stderr.startswith("fc-convert: error: "), p.stderr
        for w in words:
            assert w in p.stderr, (src, w, p.stderr)
        assert not os.path.exists(out), src
    ckpt = lambda c: os.path.join(DS, c, "ckpt")  # noqa: E731
    refused(ckpt("moe"), 6, ["MoE"])
    refused(ckpt("moe_zero2"), 3, ["--dp 3", "expert group over 2 expert-parallel ranks"])
    refused(ckpt("ucp"), 6, ["Universal Checkpoint"])
    refused(os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt"), 6, ["DeepSpeed checkpoints only"])
    refused(ckpt("zero1"), 2, ["needs --dp"], dp=None)
    refused(ckpt("zero1"), 2, ["takes no target"], extra=["--preset", "megatron-gpt"])
    refused(ckpt("zero1"), 3, ["--dp 0"], dp="0")
    refused(ckpt("tp2"), 2, ["data-parallel size only", "--tp does not apply"], extra=["--tp", "1"])
    refused(ckpt("zero1"), 3, ["--dtype does not apply"], extra=["--dtype", "float16"])
    # A source whose DP rank files disagree with partition_count: exit 5 naming the file.
    broken = os.path.join(tmp, "broken")
    shutil.copytree(ckpt("zero2"), broken)
    os.remove(os.path.join(tag_dir(broken), "zero_pp_rank_2_mp_rank_00_optim_states.pt"))
    p = fcio.run([CONVERT, broken, os.path.join(tmp, "refused", "out"), "--output-format",
                  "deepspeed", "--dp", "2"], expect=5)
    assert "fc-convert: error: " in p.stderr and "partition_count" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "refused"))
    # ZeRO-3 whose sub_group_size (10) gives the fixture's split at dp 2 ([embed, bias],
    # [weight, bias]: slices 8+2, 5+1) but another at dp 1 (15 >= 10 closes the first
    # sub-group after one param): DeepSpeed would regroup, fc refuses.
    sized = os.path.join(tmp, "zero3-sized")
    shutil.copytree(ckpt("zero3"), sized)
    for n in os.listdir(tag_dir(sized)):
        if n.endswith("model_states.pt"):
            path = os.path.join(tag_dir(sized), n)
            sd = load(path)
            sd["ds_config"]["zero_optimization"]["sub_group_size"] = 10
            torch.save(sd, path)
    refused(sized, 6, ["sub_group_size 10", "dp 1", "regroup"], dp="1")
    convert(sized, os.path.join(tmp, "zero3-sized-dp2"), 2)
    print("ok zero3 sub-groups")
    # round_robin_gradients: the flat buffers' param order depends on the DP size.
    rr = os.path.join(tmp, "zero1-rr")
    shutil.copytree(ckpt("zero1"), rr)
    path = os.path.join(tag_dir(rr), "mp_rank_00_model_states.pt")
    sd = load(path)
    sd["ds_config"]["zero_optimization"]["round_robin_gradients"] = True
    torch.save(sd, path)
    refused(rr, 6, ["round_robin_gradients"])
    # MoE model states carry no ds_config: the optimizer files' copy says it.
    rr = os.path.join(tmp, "moe-rr")
    shutil.copytree(ckpt("moe_zero2"), rr)
    path = os.path.join(tag_dir(rr), "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    sd = load(path)
    sd["ds_config"]["zero_optimization"]["round_robin_gradients"] = True
    torch.save(sd, path)
    refused(rr, 6, ["round_robin_gradients", "zero_pp_rank_1_mp_rank_00_optim_states.pt"], dp="2")
    # An OUT that is not empty: exit 8, nothing written into it.
    busy = os.path.join(tmp, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep"), "w").close()
    p = fcio.run([CONVERT, ckpt("zero1"), busy, "--output-format", "deepspeed", "--dp", "3"],
                 expect=8)
    assert os.listdir(busy) == ["keep"]
    print("ok errors")


fcio.run_case(globals(), CASE, tmp)
