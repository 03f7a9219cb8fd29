"""fc-inspect and fc-export on the Megatron legacy fixtures (testdata/megatron_legacy, torch
1.13 files written by testdata/gen/megatron/gen_legacy.py), read back with an independent
safetensors reader (fcio: json + numpy) and compared element by element with the full tensors
the generator cut the ranks from (expected/*.npy).

The distributed optimizer's states (distrib_optim.pt: fp32 master weights and Adam moments)
are compared with expected_optimizer/*.npy, and every master weight is checked to round to
its bf16 model weight.

usage: megatron_test.py BUILD_ROOT TESTDATA CASE
       (CASE: export|inspect|errors|source_layout|optimizer)
"""
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
ROOT = os.path.join(TESTDATA, "megatron_legacy")
CASES = ["gpt_tp2_pp2", "gpt_tp1", "gpt_pp2_vpp2", "moe_tp2_ep2", "legacy_tp2_pp2",
         "gpt_vpp2_tied", "moe_distopt", "gpt_buckets_tied", "gpt_whole_tp2", "gpt_num_buckets",
         "gpt_vpp2_chunked", "gpt_fp32_tp2", "gpt_frozen_tp2"]
OPTIMIZER_CASES = ["gpt_tp2_pp2", "gpt_vpp2_tied", "moe_distopt", "gpt_pp2_vpp2", "moe_tp2_ep2",
                   "gpt_buckets_tied", "gpt_whole_tp2", "gpt_num_buckets", "gpt_vpp2_chunked",
                   "gpt_fp32_tp2", "gpt_frozen_tp2"]
# gpt_frozen_tp2's params in no buffer of the distributed optimizer (gen_legacy.py)
FROZEN = ["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
          "decoder.layers.0.self_attention.linear_qkv.weight",
          "decoder.layers.1.mlp.linear_fc2.bias", "embedding.word_embeddings.weight"]
tmp = tempfile.mkdtemp(prefix="fc-megatron-test-")


def expected_optimizer(label):
    d = os.path.join(ROOT, label, "expected_optimizer")
    if not os.path.isdir(d):
        return {}
    return {f[:-4]: np.load(os.path.join(d, f)) for f in sorted(os.listdir(d))}


def st_dtype(want):
    """The safetensors dtype fc exports a fixture value of want's numpy dtype as."""
    return "F32" if want.dtype == np.float32 else "BF16"


def case_export():
    for label in CASES:
        fx = os.path.join(ROOT, label)
        out = os.path.join(tmp, label)
        fcio.run([EXPORT, os.path.join(fx, "ckpt"), out, "--quiet"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, fcio.expected_values(fx), label, dtype=st_dtype)
        print("ok export", label)
    # TP 2 x PP 2 (SwiGLU halves merged, stage-local layers renumbered) exports exactly what
    # the TP 1 release checkpoint of the same full tensors does, byte for byte.
    a = open(os.path.join(tmp, "gpt_tp2_pp2", "model.safetensors"), "rb").read()
    b = open(os.path.join(tmp, "gpt_tp1", "model.safetensors"), "rb").read()
    assert a == b, "TP2xPP2 and TP1 exports differ"
    # An iteration dir given directly, with --format.
    out = os.path.join(tmp, "iterdir")
    fcio.run([EXPORT, os.path.join(ROOT, "gpt_tp2_pp2", "ckpt", "iter_0000003"), out, "--quiet",
              "--format", "megatron-legacy"])
    assert open(os.path.join(out, "model.safetensors"), "rb").read() == a
    print("ok export tp2xpp2 == tp1")


def case_inspect():
    want = {"gpt_tp2_pp2": ("3", "2", "2", "1", "iter_0000003"),
            "gpt_tp1": ("3", "1", "1", "1", "release"),
            "gpt_pp2_vpp2": ("7", "1", "2", "1", "iter_0000007"),
            "moe_tp2_ep2": ("5", "2", "1", "2", "iter_0000005"),
            "legacy_tp2_pp2": ("9", "2", "2", "1", "iter_0000009"),
            "gpt_vpp2_tied": ("11", "1", "2", "1", "iter_0000011"),
            "moe_distopt": ("13", "2", "1", "2", "iter_0000013"),
            "gpt_buckets_tied": ("17", "2", "2", "1", "iter_0000017"),
            "gpt_whole_tp2": ("19", "2", "1", "1", "iter_0000019"),
            "gpt_num_buckets": ("23", "1", "1", "1", "iter_0000023"),
            "gpt_vpp2_chunked": ("29", "1", "2", "1", "iter_0000029"),
            "gpt_fp32_tp2": ("31", "2", "1", "1", "iter_0000031"),
            "gpt_frozen_tp2": ("37", "2", "1", "1", "iter_0000037")}
    for label in CASES:
        ckpt = os.path.join(ROOT, label, "ckpt")
        j = json.loads(fcio.run([INSPECT, ckpt, "--json"]).stdout)
        a = j["attributes"]
        it, tp, pp, ep, d = want[label]
        assert j["format"] == "megatron-legacy", j["format"]
        # --json types the values: numbers as JSON numbers, true/false as booleans.
        assert (a["megatron.iteration"], a["megatron.tp_degree"], a["megatron.pp_degree"],
                a["megatron.ep_degree"], a["megatron.checkpoint_dir"]) == \
            (int(it), int(tp), int(pp), int(ep), d), (label, a)
        assert a["megatron.checkpoint_version"] == 3.0, (label, a)
        assert a.get("megatron.swiglu") in (None, True, False), (label, a)
        exp = fcio.expected_values(os.path.join(ROOT, label))
        exp.update(expected_optimizer(label))
        assert sorted(t["key"] for t in j["tensors"]) == sorted(exp), label
        for t in j["tensors"]:
            assert t["global_shape"] == list(exp[t["key"]].shape), (label, t)
        text = fcio.run([INSPECT, ckpt]).stdout
        for s in ("megatron-legacy", "megatron.iteration " + it, "megatron.tp_degree " + tp,
                  "megatron.pp_degree " + pp, "megatron.ep_degree " + ep,
                  "megatron.checkpoint_version 3.0"):
            assert s in text, (label, s, text)
        print("ok inspect", label)
    text = fcio.run([INSPECT, os.path.join(ROOT, "gpt_tp2_pp2", "ckpt")]).stdout
    assert "megatron.swiglu true" in text and "megatron.distrib_optim 4 files, read" in text
    assert "megatron.core.transformer.enums.AttnBackend" in text, text  # opaque, reported
    # Frozen params are in no buffer: found by the walk, named, and without states.
    text = fcio.run([INSPECT, os.path.join(ROOT, "gpt_frozen_tp2", "ckpt")]).stdout
    assert ("megatron.distrib_optim 2 files, read (params aligned to 64 elements, buckets of "
            "100 elements); 4 param(s) in no buffer (frozen: no optimizer state): " +
            ", ".join(FROZEN)) in text, text


def case_errors():
    save = os.path.join(tmp, "missing")
    shutil.copytree(os.path.join(ROOT, "gpt_tp2_pp2", "ckpt"), save)
    shutil.rmtree(os.path.join(save, "iter_0000003", "mp_rank_01_001"))
    for tool in (INSPECT, EXPORT):
        args = [tool, save] + ([os.path.join(tmp, "out")] if tool == EXPORT else [])
        p = fcio.run(args, expect=4)
        assert "mp_rank_01_001/model_optim_rng.pt" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "out", "model.safetensors"))
    # Dirs of one TP rank while args say TP 2: corrupt input (exit 5) naming the arg.
    save = os.path.join(tmp, "mismatch")
    shutil.copytree(os.path.join(ROOT, "gpt_tp2_pp2", "ckpt"), save)
    for d in ("mp_rank_01_000", "mp_rank_01_001"):
        shutil.rmtree(os.path.join(save, "iter_0000003", d))
    p = fcio.run([INSPECT, save], expect=5)
    assert "tensor_model_parallel_size is 2" in p.stderr, p.stderr
    # args without swiglu at TP 2: linear_fc1 is refused (exit 6) naming it.
    p = fcio.run([EXPORT, os.path.join(ROOT, "no_swiglu_arg", "ckpt"), os.path.join(tmp, "o2"),
                  "--quiet"], expect=6)
    assert "linear_fc1.weight" in p.stderr and "swiglu" in p.stderr, p.stderr
    # latest_checkpointed_iteration.txt naming a missing iteration: not found.
    save = os.path.join(tmp, "latest")
    shutil.copytree(os.path.join(ROOT, "gpt_tp1", "ckpt"), save)
    open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w").write("9")
    p = fcio.run([INSPECT, save, "--format", "megatron-legacy"], expect=4)
    assert "iter_0000009" in p.stderr, p.stderr
    print("ok errors")


def case_source_layout():
    """--source-layout FILE: a layout file's tensor_parallel rules replace the built-in TP
    table; a name no rule matches is replicated (TP rank 0's copy)."""
    ckpt = os.path.join(ROOT, "gpt_tp2_pp2", "ckpt")
    expected = fcio.expected_values(os.path.join(ROOT, "gpt_tp2_pp2"))

    def rules(name, tp):
        path = os.path.join(tmp, name + ".json")
        json.dump({"tensor_parallel": tp}, open(path, "w"))
        return path
    column = r"(word_embeddings|output_layer)\.weight$|linear_qkv\.(weight|bias)$|linear_fc1\.weight$"
    row = r"(linear_proj|linear_fc2)\.weight$"
    # The built-in table written as rules: the same bytes (SwiGLU halves still merged).
    same = rules("same", [{"regex": column, "axis": 0}, {"regex": row, "axis": 1}])
    fcio.run([EXPORT, ckpt, os.path.join(tmp, "default"), "--quiet"])
    fcio.run([EXPORT, ckpt, os.path.join(tmp, "same"), "--quiet", "--source-layout", same])
    a = open(os.path.join(tmp, "default", "model.safetensors"), "rb").read()
    assert open(os.path.join(tmp, "same", "model.safetensors"), "rb").read() == a
    p = fcio.run([INSPECT, ckpt, "--source-layout", same])
    assert "tp_merge tensor_parallel rules of --source-layout " + same in p.stdout, p.stdout
    # Rules without linear_proj: it is replicated, TP rank 0's columns only.
    fewer = rules("fewer", [{"regex": column, "axis": 0}, {"regex": r"linear_fc2\.weight$", "axis": 1}])
    out = os.path.join(tmp, "fewer")
    fcio.run([EXPORT, ckpt, out, "--quiet", "--source-layout", fewer])
    got, _ = fcio.read_hf_dir(out)
    for name, want in expected.items():
        dt, arr = got[name]
        if name.endswith("linear_proj.weight"):
            want = want[:, : want.shape[1] // 2]
        assert tuple(arr.shape) == tuple(want.shape), (name, arr.shape, want.shape)
        assert np.array_equal(fcio.bits(arr), fcio.bits(want)), name
    # An axis the tensor does not have: exit 3 naming the tensor and the file.
    bad = rules("bad", [{"regex": r"linear_qkv\.bias$", "axis": 1}])
    p = fcio.run([INSPECT, ckpt, "--source-layout", bad], expect=3)
    assert "linear_qkv.bias" in p.stderr and "bad.json" in p.stderr and "axis 1" in p.stderr, p.stderr
    # Not a Megatron checkpoint: refused, the files say how it is split.
    p = fcio.run([EXPORT, os.path.join(TESTDATA, "fc_distcp", "sample"), os.path.join(tmp, "o"),
                  "--source-layout", same], expect=3)
    assert "Megatron legacy and DeepSpeed checkpoints only" in p.stderr, p.stderr
    # A rules file with a typo: exit 3 naming the member and the file.
    typo = os.path.join(tmp, "typo.json")
    open(typo, "w").write('{"tensor_paralel": []}')
    p = fcio.run([INSPECT, ckpt, "--source-layout", typo], expect=3)
    assert "tensor_paralel" in p.stderr and "typo.json" in p.stderr, p.stderr
    print("ok source_layout")


def case_optimizer():
    """The distributed optimizer's states: --include-optimizer exports them (fp32), --weights
    fp32 puts the master weights under the param names; a distrib_optim.pt that does not
    belong to its rank is not read, and the tools say so."""
    for label in OPTIMIZER_CASES:
        ckpt = os.path.join(ROOT, label, "ckpt")
        model = fcio.expected_values(os.path.join(ROOT, label))
        optim = expected_optimizer(label)
        out = os.path.join(tmp, label + "_opt")
        fcio.run([EXPORT, ckpt, out, "--quiet", "--include-optimizer"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, dict(model, **optim), label, dtype=st_dtype)
        # Independent of fc's layout: each master weight rounds to its bf16 model weight
        # (trained in fp32: is the weight).
        def master_name(name):  # per-rank names: mp_rank_TT.optimizer.fp32.<name>
            if name.startswith("mp_rank_"):
                rank, rest = name.split(".", 1)
                return rank + ".optimizer.fp32." + rest
            return "optimizer.fp32." + name
        # Frozen params (gpt_frozen_tp2) have no master: --weights fp32 keeps their weight.
        frozen = sorted(n for n in model if master_name(n) not in optim)
        assert frozen == (FROZEN if label == "gpt_frozen_tp2" else []), (label, frozen)
        for name, want in model.items():
            if name in frozen:
                continue
            master = optim[master_name(name)]
            if want.dtype == np.float32:
                assert np.array_equal(fcio.bits(master), fcio.bits(want)), (label, name)
                continue
            assert np.array_equal(fcio.f32_to_bf16_bits(master).reshape(want.shape),
                                  want.view(np.uint16)), (label, name)
        out = os.path.join(tmp, label + "_fp32")
        fcio.run([EXPORT, ckpt, out, "--quiet", "--weights", "fp32"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, {n: optim.get(master_name(n), model[n]) for n in model}, label + " fp32",
                         dtype=st_dtype)
        # --weights module is the default.
        out = os.path.join(tmp, label + "_module")
        fcio.run([EXPORT, ckpt, out, "--quiet", "--weights", "module"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, model, label + " module", dtype=st_dtype)
        print("ok optimizer", label)
    # Stage 0's TP ranks' optimizer files swapped: not read, reported; the weights still export.
    save = os.path.join(tmp, "swapped")
    shutil.copytree(os.path.join(ROOT, "gpt_tp2_pp2", "ckpt"), save)
    it = os.path.join(save, "iter_0000003")
    a, b = (os.path.join(it, d, "distrib_optim.pt") for d in ("mp_rank_00_000", "mp_rank_01_000"))
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)
    text = fcio.run([INSPECT, save]).stdout
    assert "megatron.distrib_optim 4 files, not read: mp_rank_00_000/distrib_optim.pt" in text, text
    assert "optimizer.fp32." not in text, text
    p = fcio.run([EXPORT, save, os.path.join(tmp, "sw"), "--include-optimizer"])
    assert "the optimizer states are not exported: distrib_optim.pt 4 files, not read" in p.stderr, p.stderr
    got, _ = fcio.read_hf_dir(os.path.join(tmp, "sw"))
    fcio.same_values(got, fcio.expected_values(os.path.join(ROOT, "gpt_tp2_pp2")), "swapped",
                     dtype=st_dtype)
    p = fcio.run([EXPORT, save, os.path.join(tmp, "sw32"), "--weights", "fp32"], expect=6)
    assert "no fp32 master weights" in p.stderr and "not read" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "sw32", "model.safetensors"))
    print("ok optimizer not read")
    # A Universal Checkpoint from the distributed optimizer: fp32.pt holds the master weight
    # (not the bf16 weight cast), the moments as saved, step.pt the param groups' step.
    try:
        import torch
    except ImportError as e:  # the checks above ran; the case as a whole cannot
        print("skipping: the Universal Checkpoint is read back with torch:", e)
        sys.exit(77)
    parent = os.path.join(tmp, "ucp_parent")
    os.makedirs(parent)
    ucp = os.path.join(parent, "global_step3_universal")
    fcio.run([CONVERT, os.path.join(ROOT, "gpt_tp2_pp2", "ckpt"), ucp, "--output-format", "ucp",
              "--quiet"])
    optim = expected_optimizer("gpt_tp2_pp2")
    model = fcio.expected_values(os.path.join(ROOT, "gpt_tp2_pp2"))
    assert sorted(os.listdir(os.path.join(ucp, "zero"))) == sorted(list(model) + ["optimizer_state.pt"])
    for name in model:
        for role in ("fp32", "exp_avg", "exp_avg_sq"):
            t = torch.load(os.path.join(ucp, "zero", name, role + ".pt"))
            t = t["param"] if isinstance(t, dict) else t
            assert t.dtype == torch.float32, (name, role, t.dtype)
            assert np.array_equal(t.numpy(), optim["optimizer.%s.%s" % (role, name)]), (name, role)
        assert torch.load(os.path.join(ucp, "zero", name, "step.pt")) == 3, name
    assert open(os.path.join(parent, "latest_universal")).read() == "global_step3_universal"
    print("ok optimizer ucp")


fcio.run_case(globals(), CASE, tmp)
