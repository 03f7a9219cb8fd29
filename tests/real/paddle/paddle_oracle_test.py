"""The real PaddlePaddle 3.3.1 (interop environment) as the oracle for fc's FlexCheckpoint
reader and AOA.

usage: paddle_oracle_test.py BUILD_ROOT TESTDATA CASE      (run through venv_run.py paddle)

CASE
  fixtures  make_fixtures.py writes every case anew with this Paddle (one process, and
            paddle.distributed.launch 2 ranks on CPU with gloo); fc-inspect --verify, fc-export
            and fc-export --aoa equal what Paddle's load_state_dict gives
            (paddle_fixtures_check.py), and the fresh values equal the committed
            testdata/real/paddle ones
  load_fc   Paddle reads fc's output: fc-export's HF safetensors directory (several files)
            loaded by dist.load_state_dict(..., safetensors=True) (FlexCheckpoint's HF path,
            which writes flex-ckpt.auto_generated.metadata into the directory) into a fresh
            model's sharded state dict and into zero tensors: values equal Paddle's own load
            of the source checkpoint; the same for a 2-rank source and an AOA export
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
sys.path.insert(0, os.path.join(HERE, ".."))
import fcio  # noqa: E402
import fresh_vs_committed  # noqa: E402


def make_fixtures_module(testdata):
    sys.path.insert(0, os.path.join(testdata, "real", "paddle"))
    import make_fixtures
    return make_fixtures


def case_fixtures(build, testdata, tmp):
    mf = make_fixtures_module(testdata)
    fresh = os.path.join(tmp, "fresh")
    subprocess.run([sys.executable, os.path.join(testdata, "real", "paddle", "make_fixtures.py"),
                    fresh], check=True)
    subprocess.run([sys.executable, os.path.join(HERE, "paddle_fixtures_check.py"), build, fresh],
                   check=True)
    committed = os.path.join(testdata, "real", "paddle")
    n = 0
    for case in mf.CASES:
        for root, _, names in os.walk(os.path.join(fresh, case)):
            rel = os.path.relpath(root, fresh)
            for f in sorted(names):
                path = os.path.join(rel, f)
                if f.endswith(".safetensors") and os.sep + "ckpt" not in os.sep + rel:
                    how = fresh_vs_committed.compare_numpy(
                        mf.read_st(os.path.join(fresh, path)),
                        mf.read_st(os.path.join(committed, path)), f"{path}: fresh vs committed")
                    print(f"{path}: fresh vs committed: {how}")
                elif f.endswith(".json"):  # AOA programs, Paddle's recorded outcomes
                    with open(os.path.join(fresh, path)) as a, \
                            open(os.path.join(committed, path)) as b:
                        assert a.read() == b.read(), f"{path}: fresh vs committed"
                else:
                    continue
                n += 1
    print(f"fixtures: fresh saves read by fc equal Paddle; {n} expected files, programs "
          f"and recorded Paddle outcomes equal the committed ones")


def load_hf(hf, names_shapes):
    """dist.load_state_dict(zeros, hf, safetensors=True): {name: (dtype, numpy)}."""
    import paddle
    import paddle.distributed as dist
    mf = sys.modules["make_fixtures"]
    state = {k: paddle.zeros(list(shape), dtype=dt) for k, (shape, dt) in names_shapes.items()}
    dist.load_state_dict(state, hf, safetensors=True)
    return {k: (mf.dtype_name(v), mf.np_of(v)) for k, v in state.items()}


def export(build, ckpt, out, *extra):
    exe = fcio.tools(build, "fc-export")
    fcio.run([exe, ckpt, out, "--max-shard-size", "100B", "-q"] + list(extra))
    files = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    assert len(files) > 1, files
    return out


def case_load_fc(build, testdata, tmp):
    import paddle
    import paddle.distributed as dist
    mf = make_fixtures_module(testdata)
    real = os.path.join(testdata, "real", "paddle")
    inspect = fcio.tools(build, "fc-inspect")

    # 1. One-process save -> fc-export (model weights, bf16/fp16 extras) -> a fresh model.
    want = mf.read_st(os.path.join(real, "single_pickle", "expected.safetensors"))
    hf = export(build, os.path.join(real, "single_pickle", "ckpt"), os.path.join(tmp, "single"),
                "--exclude", "extra.step")
    paddle.seed(99)  # other initial values: everything checked must come from hf
    model = mf.tiny_model()
    dist.load_state_dict(model.sharded_state_dict(), hf, safetensors=True)
    assert any(f.endswith(".auto_generated.metadata") for f in os.listdir(hf)), os.listdir(hf)
    got = {k: (mf.dtype_name(v), mf.np_of(v)) for k, v in model.state_dict().items()}
    mf.same(got, {k: want[k] for k in got}, "fresh model loaded from fc-export")
    extras = {k: (want[k][1].shape, {"BF16": "bfloat16", "F16": "float16"}[want[k][0]])
              for k in ("extra.bf16", "extra.fp16")}
    got = load_hf(hf, extras)
    mf.same(got, {k: want[k] for k in extras}, "bf16/fp16 from fc-export")
    print(f"single_pickle: fc-export ({len(os.listdir(hf))} files) loaded by Paddle into a "
          f"fresh model: {len(model.state_dict())} weights + bf16/fp16 equal", flush=True)
    # fc still reads the directory after Paddle put its auto-generated metadata there.
    p = fcio.run([inspect, "--verify", hf])
    assert "format:   safetensors" in p.stdout and "verify: OK" in p.stdout, p.stdout

    # 2. The 2-rank save (uneven row/column shards, bf16 pieces) -> export -> load.
    want = mf.read_st(os.path.join(real, "two_ranks", "expected.safetensors"))
    hf = export(build, os.path.join(real, "two_ranks", "ckpt"), os.path.join(tmp, "two"))
    got = load_hf(hf, {k: (a.shape, {"BF16": "bfloat16", "F32": "float32"}[d])
                       for k, (d, a) in want.items()})
    mf.same(got, want, "two_ranks through fc-export")
    print(f"two_ranks: fc-export loaded by Paddle: {len(want)} tensors equal", flush=True)

    # 3. An AOA export (fused_qkv_old at TP 2 -> q, k, v) loaded by Paddle equals Paddle's own
    #    load of the checkpoint through the same program.
    aoa = os.path.join(real, "aoa_tp2", "aoa")
    want = mf.read_st(os.path.join(aoa, "fused_qkv_old.safetensors"))
    hf = export(build, os.path.join(real, "aoa_tp2", "ckpt"), os.path.join(tmp, "aoa"),
                "--aoa", os.path.join(aoa, "fused_qkv_old.json"), "--include", "model.*")
    got = load_hf(hf, {k: (a.shape, "float32") for k, (d, a) in want.items()})
    mf.same(got, want, "fc-export --aoa fused_qkv_old loaded by Paddle")
    print(f"aoa fused_qkv_old: fc-export --aoa loaded by Paddle: {len(want)} tensors equal "
          f"Paddle's load_state_dict(aoa_config=...)", flush=True)

    # 4. int64: Paddle's auto-generated metadata has no mapping for I64 (create_hf_ckpt_metadata
    #    knows U16 U8 I8 I16 BOOL F16 F32 F64 BF16) and asserts "I64 is not supported yet.";
    #    a directory holding one cannot be loaded by Paddle (a Paddle limit, not fc's).
    hf = os.path.join(tmp, "i64")
    fcio.run([fcio.tools(build, "fc-export"), os.path.join(real, "single_pickle", "ckpt"), hf,
              "--include", "extra.step", "-q"])
    try:
        load_hf(hf, {"extra.step": ((3,), "int64")})
        print("int64: Paddle now loads an I64 safetensors tensor (update the test)", flush=True)
    except AssertionError as e:
        assert "I64 is not supported yet" in str(e), e
        print(f"int64: Paddle's HF path refuses I64 ({e}), as known", flush=True)


def main():
    build, testdata, case = sys.argv[1:4]
    with fcio.temp_dir("fc-real-paddle-") as tmp:
        {"fixtures": case_fixtures, "load_fc": case_load_fc}[case](build, testdata, tmp)


if __name__ == "__main__":
    main()
