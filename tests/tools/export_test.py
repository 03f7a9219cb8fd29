"""fc-export end to end on real PyTorch DCP fixtures, read back with an independent reader.

usage: export_test.py BUILD_ROOT TESTDATA CASE   (CASE: values|shards|dtype|filter|errors|megatron|diskfull|mpi|paddle)
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

# numpy missing: the independent reader cannot run
np = fcio.import_or_skip("numpy")

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
EXPORT, INSPECT, CONVERT = fcio.tools(BUILD, "fc-export", "fc-inspect", "fc-convert")
FIXTURES = sorted(d for d in glob.glob(os.path.join(TESTDATA, "torch_dcp", "*"))
                  if os.path.isdir(os.path.join(d, "expected")))
assert FIXTURES, "no torch DCP fixtures"
tmp = tempfile.mkdtemp(prefix="fc-export-test-")


def merge_layout():
    """A layout of degrees only: every tensor whole on one rank, whatever its name."""
    path = os.path.join(tmp, "merge.json")
    with open(path, "w") as f:
        f.write('{"degrees": {}}')
    return path


def export(fixture, out, *flags, expect=0):
    return fcio.run([EXPORT, os.path.join(fixture, "ckpt"), out, "--quiet", *flags], expect=expect)


def case_values():
    for fx in FIXTURES:
        out = os.path.join(tmp, os.path.basename(fx))
        export(fx, out)
        got, index = fcio.read_hf_dir(out)
        assert index is None
        fcio.same_values(got, fcio.expected_values(fx), fx, subset=True)
        assert not [f for f in os.listdir(out) if f.startswith(".fc-")], os.listdir(out)
        print("ok", fx, len(got), "tensors")


def case_shards():
    fx = max(FIXTURES, key=lambda d: len(fcio.expected_values(d)))
    out = os.path.join(tmp, "shards")
    export(fx, out, "--max-shard-size", "64")
    names = sorted(os.listdir(out))
    assert "model.safetensors.index.json" in names, names
    shards = [n for n in names if n.endswith(".safetensors")]
    n = len(shards)
    assert n >= 2 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], shards
    got, index = fcio.read_hf_dir(out)
    fcio.same_values(got, fcio.expected_values(fx), "shards", subset=True)
    for s in shards:  # no shard above the limit unless it holds a single larger tensor
        t = fcio.read_safetensors(os.path.join(out, s))
        size = sum(a.nbytes for _, a in t.values())
        assert size <= 64 or len(t) == 1, (s, size)
    print("ok", n, "shards")


def case_dtype():
    for fx in FIXTURES:
        exp = fcio.expected_values(fx)
        out = os.path.join(tmp, "bf16-" + os.path.basename(fx))
        export(fx, out, "--dtype", "bfloat16")
        got, _ = fcio.read_hf_dir(out)
        for name, want in exp.items():
            dt, arr = got[name]
            if want.dtype in (np.float32, np.float64, np.float16):
                assert dt == "BF16", (name, dt)
                ref = fcio.f32_to_bf16_bits(want.astype(np.float32))
                assert np.array_equal(arr.reshape(-1), ref.reshape(-1)), f"{fx}: {name} bf16 rounding"
            elif want.dtype == np.uint16 and dt == "BF16":  # already bf16 (bit patterns)
                assert np.array_equal(arr, want)
            else:
                assert np.array_equal(fcio.bits(arr), fcio.bits(want)), (name, dt)
        out32 = os.path.join(tmp, "f32-" + os.path.basename(fx))
        export(fx, out32, "--dtype", "float32")
        got32, _ = fcio.read_hf_dir(out32)
        for name, (dt, arr) in got32.items():
            if dt == "F32" and exp[name].dtype == np.uint16:  # bf16 -> f32 is exact
                assert np.array_equal(arr.reshape(-1), fcio.bf16_bits_to_f32(exp[name])), name
    print("ok dtype")


def case_filter():
    fx = max(FIXTURES, key=lambda d: len(fcio.expected_values(d)))
    exp = fcio.expected_values(fx)
    first = sorted(exp)[0]
    out = os.path.join(tmp, "inc")
    export(fx, out, "--include", first)
    got, _ = fcio.read_hf_dir(out)
    assert sorted(got) == [first], sorted(got)
    out = os.path.join(tmp, "exc")
    export(fx, out, "--exclude", first)
    got, _ = fcio.read_hf_dir(out)
    assert first not in got and len(got) == len(exp) - 1
    p = export(fx, os.path.join(tmp, "none"), "--include", "nothing", expect=3)
    assert "no tensors to export" in p.stderr, p.stderr
    # Tensors the program adds are written with their fill value in their dtype.
    aoa = os.path.join(tmp, "add.aoa")
    open(aoa, "w").write("_ -> added.ones, shape='[3, 5]', dtype='bfloat16', fill='ones'\n"
                         "_ -> added.half, shape='[7]', dtype='float32', fill='0.5'\n"
                         "_ -> added.zeros, shape='[2]', dtype='int64'\n")
    out = os.path.join(tmp, "added")
    export(fx, out, "--aoa", aoa)
    got, _ = fcio.read_hf_dir(out)
    assert got["added.ones"][0] == "BF16" and np.array_equal(
        got["added.ones"][1].reshape(-1), np.full(15, 0x3F80, np.uint16)), got["added.ones"]
    assert np.array_equal(got["added.half"][1], np.full(7, 0.5, np.float32))
    assert np.array_equal(got["added.zeros"][1], np.zeros(2, np.int64))
    assert len(got) == len(exp) + 3, sorted(got)
    print("ok filter")


def case_errors():
    fx = FIXTURES[0]
    # A missing data file: exit 4 (not found, fc-export(1)) naming it, nothing written.
    broken = os.path.join(tmp, "broken")
    shutil.copytree(os.path.join(fx, "ckpt"), broken)
    victim = sorted(f for f in os.listdir(broken) if f.endswith(".distcp"))[-1]
    os.remove(os.path.join(broken, victim))
    out = os.path.join(tmp, "out-broken")
    p = fcio.run([EXPORT, broken, out, "--quiet"], expect=4)
    assert "fc-export: error: " in p.stderr and victim in p.stderr, p.stderr
    assert not os.path.exists(out) or not os.listdir(out), os.listdir(out)
    # The output directory cannot be created (a regular file is in the way): exit 7.
    blocker = os.path.join(tmp, "blocker")
    open(blocker, "w").close()
    p = export(fx, os.path.join(blocker, "sub"), expect=7)
    assert "blocker" in p.stderr, p.stderr
    # An earlier export in the output directory is not overwritten: exit 8.
    out = os.path.join(tmp, "twice")
    export(fx, out)
    p = export(fx, out, expect=8)
    assert "not empty" in p.stderr, p.stderr
    # A value outside its flag's syntax is a usage error (2); what a pattern or program holds
    # is an invalid argument (3).
    p = export(fx, os.path.join(tmp, "x"), "--max-shard-size", "lots", expect=2)
    assert "--max-shard-size: value 'lots': expected a size" in p.stderr, p.stderr
    p = export(fx, os.path.join(tmp, "x"), "--include", "[a-", expect=3)
    assert "--include" in p.stderr and "[a-" in p.stderr, p.stderr
    export(fx, os.path.join(tmp, "x"), "--dtype", "int3", expect=2)
    # An AOA program naming a tensor that does not exist: exit 3 (invalid argument, fc-aoa(7)),
    # the file, line and name in the message.
    aoa = os.path.join(tmp, "bad.aoa")
    open(aoa, "w").write("no_such_tensor -> renamed\n")
    p = export(fx, os.path.join(tmp, "aoa-out"), "--aoa", aoa, expect=3)
    assert "fc-export: error: " + aoa + ":1: 'no_such_tensor'" in p.stderr, p.stderr
    assert "the source checkpoint has no such tensor" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "aoa-out", "model.safetensors"))
    print("ok errors")


def megatron_to_hf_reference(m, heads=4, groups=2, head_dim=2, vocab=10, tp=2):
    """The HF Llama tensors from Megatron ones, written independently with numpy."""
    hf = {}
    hf["model.embed_tokens.weight"] = m["embedding.word_embeddings.weight"][:vocab]
    hf["lm_head.weight"] = m["output_layer.weight"][:vocab]
    hf["model.norm.weight"] = m["decoder.final_layernorm.weight"]
    per_group = heads // groups
    for layer in (0, 1):
        src = f"decoder.layers.{layer}."
        dst = f"model.layers.{layer}."
        qkv = m[src + "self_attention.linear_qkv.weight"]
        rows = (per_group + 2) * head_dim
        q, k, v = [], [], []
        for g in range(groups):
            block = qkv[g * rows:(g + 1) * rows]
            q.append(block[:per_group * head_dim])
            k.append(block[per_group * head_dim:(per_group + 1) * head_dim])
            v.append(block[(per_group + 1) * head_dim:])
        hf[dst + "self_attn.q_proj.weight"] = np.concatenate(q)
        hf[dst + "self_attn.k_proj.weight"] = np.concatenate(k)
        hf[dst + "self_attn.v_proj.weight"] = np.concatenate(v)
        hf[dst + "self_attn.o_proj.weight"] = m[src + "self_attention.linear_proj.weight"]
        fc1 = m[src + "mlp.linear_fc1.weight"]
        per_rank = fc1.shape[0] // tp
        gate = [fc1[r * per_rank:r * per_rank + per_rank // 2] for r in range(tp)]
        up = [fc1[r * per_rank + per_rank // 2:(r + 1) * per_rank] for r in range(tp)]
        hf[dst + "mlp.gate_proj.weight"] = np.concatenate(gate)
        hf[dst + "mlp.up_proj.weight"] = np.concatenate(up)
        hf[dst + "mlp.down_proj.weight"] = m[src + "mlp.linear_fc2.weight"]
        hf[dst + "input_layernorm.weight"] = m[src + "self_attention.linear_qkv.layer_norm_weight"]
        hf[dst + "post_attention_layernorm.weight"] = m[src + "mlp.linear_fc1.layer_norm_weight"]
    return hf


def case_megatron():
    fx = os.path.join(TESTDATA, "torch_dcp", "megatron_tiny_tp2_pp2")
    aoa = os.path.join(TESTDATA, "aoa", "megatron_tiny_to_hf_llama.aoa")
    want = megatron_to_hf_reference(fcio.expected_values(fx))
    out = os.path.join(tmp, "hf")
    export(fx, out, "--aoa", aoa, "--max-shard-size", "400")
    got, index = fcio.read_hf_dir(out)
    assert index is not None, "expected a sharded export"
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    fcio.same_values(got, want, "megatron", subset=True)
    # The same through --dtype float32: bf16 widens exactly.
    out32 = os.path.join(tmp, "hf32")
    export(fx, out32, "--aoa", aoa, "--dtype", "float32")
    got32, _ = fcio.read_hf_dir(out32)
    for name, w in want.items():
        arr = got32[name][1]
        ref = fcio.bf16_bits_to_f32(w) if w.dtype == np.uint16 else w.reshape(-1)
        assert np.array_equal(arr.reshape(-1), ref), name
    print("ok megatron: TP2 x PP2 fused checkpoint to", len(got), "HF tensors")


def case_diskfull():
    if os.geteuid() != 0:
        print("skipping: mounting a small tmpfs needs root")
        sys.exit(77)
    src = os.path.join(tmp, "big")
    fcio.run([os.path.join(BUILD, "bench", "make_synthetic_ckpt"), src, "2000000", "2", "128"])
    mnt = os.path.join(tmp, "small")
    os.makedirs(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt])
    if r.returncode != 0:
        print("skipping: cannot mount tmpfs here")
        sys.exit(77)
    try:
        out = os.path.join(mnt, "hf")
        p = fcio.run([EXPORT, src, out, "--quiet"], expect=7)
        assert "No space left" in p.stderr, p.stderr
        left = os.listdir(out) if os.path.exists(out) else []
        assert not left, f"left behind after disk full: {left}"
    finally:
        subprocess.run(["umount", mnt])
    print("ok diskfull")


def case_mpi():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("skipping: no mpirun")
        sys.exit(77)
    fx = max(FIXTURES, key=lambda d: len(fcio.expected_values(d)))
    single = os.path.join(tmp, "single")
    export(fx, single, "--max-shard-size", "64")
    for np_ in (2, 3):
        multi = os.path.join(tmp, f"mpi{np_}")
        fcio.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np_), EXPORT,
                  os.path.join(fx, "ckpt"), multi, "--quiet", "--max-shard-size", "64"])
        a, b = sorted(os.listdir(single)), sorted(os.listdir(multi))
        assert a == b, (a, b)
        for f in a:
            assert open(os.path.join(single, f), "rb").read() == open(os.path.join(multi, f), "rb").read(), f
    print("ok mpi: byte-identical to the single-process export")
    # More processes than files: the idle ones still agree on the outcome.
    one = os.path.join(tmp, "mpi-one-file")
    fcio.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3", EXPORT,
              os.path.join(fx, "ckpt"), one, "--quiet"])
    assert sorted(os.listdir(one)) == ["model.safetensors"], os.listdir(one)
    # A failure seen by one process (process 0 finds an earlier export): every process
    # stops, the error is printed once, nothing new appears.
    p = fcio.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3", EXPORT,
                  os.path.join(fx, "ckpt"), one, "--quiet"], expect=8)
    assert p.stderr.count("fc-export: error") == 1 and "not empty" in p.stderr, p.stderr
    assert sorted(os.listdir(one)) == ["model.safetensors"], os.listdir(one)
    print("ok mpi errors")


def case_paddle():
    """PaddlePaddle FlexCheckpoint fixtures (emulated paddle.save pickles, see
    testdata/paddle_flex/README.md): TP splits, an uneven bf16 split, a replicated tensor, a
    column-major array, flattened ZeRO ranges, the older metadata module. Exported values
    must equal the full tensors bit for bit; converted copies must too; damage is reported
    with the file's name."""
    fixtures = sorted(glob.glob(os.path.join(TESTDATA, "paddle_flex", "*", "ckpt")))
    assert len(fixtures) >= 3, fixtures
    for ckpt in fixtures:
        fx = os.path.dirname(ckpt)
        label = os.path.basename(fx)
        out = os.path.join(tmp, "paddle-" + label)
        fcio.run([EXPORT, ckpt, out, "--quiet", "--include-optimizer"])
        got, _ = fcio.read_hf_dir(out)
        fcio.same_values(got, fcio.expected_values(fx), "paddle " + label, subset=True)
        assert sorted(got) == sorted(fcio.expected_values(fx)), (label, sorted(got))
        # Resharded to one whole chunk per tensor (fc distcp), then exported again.
        conv = os.path.join(tmp, "paddle-conv-" + label)
        fcio.run([CONVERT, ckpt, conv, "--quiet", "--target-layout", merge_layout()])
        again = os.path.join(tmp, "paddle-again-" + label)
        fcio.run([EXPORT, conv, again, "--quiet", "--include-optimizer"])
        got2, _ = fcio.read_hf_dir(again)
        fcio.same_values(got2, fcio.expected_values(fx), "paddle converted " + label, subset=True)
        # A Paddle checkpoint as the target layout (ranks from <rank>_<id>.distcp names).
        like = os.path.join(tmp, "paddle-like-" + label)
        fcio.run([CONVERT, conv, like, "--quiet", "--target-like", ckpt])
        want = {(t["key"], str(c["global_offset"]), str(c["local_shape"]), str(c["flattened_range"]))
                for t in json.loads(fcio.run([INSPECT, ckpt, "--json"]).stdout)["tensors"] for c in t["chunks"]}
        have = {(t["key"], str(c["global_offset"]), str(c["local_shape"]), str(c["flattened_range"]))
                for t in json.loads(fcio.run([INSPECT, like, "--json"]).stdout)["tensors"] for c in t["chunks"]}
        assert want == have, (label, want ^ have)
        print("ok paddle", label)
    # A truncated data file: exit 5 naming it, no output.
    broken = os.path.join(tmp, "paddle-broken")
    shutil.copytree(fixtures[-1], broken)
    victim = os.path.join(broken, "1_0.distcp")
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 2])
    p = fcio.run([EXPORT, broken, os.path.join(tmp, "paddle-broken-out"), "--quiet"], expect=5)
    assert "1_0.distcp" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "paddle-broken-out", "model.safetensors"))
    # A missing data file: exit 4 naming it.
    os.remove(victim)
    p = fcio.run([INSPECT, broken], expect=4)
    assert "1_0.distcp" in p.stderr, p.stderr
    print("ok paddle errors")


fcio.run_case(globals(), CASE, tmp)
