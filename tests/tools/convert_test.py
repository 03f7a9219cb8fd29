"""fc-convert end to end: real PyTorch DCP fixtures resharded into other layouts (split,
merged, flattened ZeRO-style with ranges that cut rows), verified with fc-inspect --verify,
exported, and compared bit-exactly with the values torch wrote; then converted back.

usage: convert_test.py BUILD_ROOT TESTDATA CASE   (CASE: reshard|roundtrip|dryrun|errors|aoa|torch|mpi)
"""
import glob
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

np = fcio.import_or_skip("numpy")

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
TOOLS = os.path.join(BUILD, "tools")
CONVERT, EXPORT, INSPECT = (os.path.join(TOOLS, t) for t in ("fc-convert", "fc-export", "fc-inspect"))
FIXTURES = sorted(d for d in glob.glob(os.path.join(TESTDATA, "torch_dcp", "*"))
                  if os.path.isdir(os.path.join(d, "expected")))
tmp = tempfile.mkdtemp(prefix="fc-convert-test-")


def inspect_json(ckpt):
    return json.loads(fcio.run([INSPECT, ckpt, "--json"]).stdout)


def chunk(key, off, shape, flat=None, replica=0):
    return {"key": key, "global_offset": off, "local_shape": shape,
            "flattened_range": flat, "replica_id": replica}


def layout_manifest(tensors, kind, world=3):
    """A target layout over `world` ranks. kind: whole | rows | flat."""
    ranks = [{"rank": r, "chunks": []} for r in range(world)]
    for i, t in enumerate(tensors):
        shape = t["global_shape"]
        n = int(np.prod(shape)) if shape else 1
        if kind == "whole" or not shape or n < world:
            ranks[i % world]["chunks"].append(chunk(t["key"], [0] * len(shape), shape))
        elif kind == "rows" and shape[0] >= world:
            cuts = [0, shape[0] // 3, shape[0] - shape[0] // 4, shape[0]]  # uneven
            for r in range(world):
                if cuts[r + 1] > cuts[r]:
                    off = [cuts[r]] + [0] * (len(shape) - 1)
                    ranks[r]["chunks"].append(chunk(t["key"], off, [cuts[r + 1] - cuts[r]] + shape[1:]))
        else:  # flat: ZeRO-style ranges over the whole tensor, cutting rows
            cuts = [0, n // 3 + 1, 2 * n // 3 + 1, n]
            cuts = sorted(set(min(max(c, 0), n) for c in cuts))
            for r in range(len(cuts) - 1):
                ranks[r]["chunks"].append(chunk(t["key"], [0] * len(shape), shape, [cuts[r], cuts[r + 1]]))
    return {"format": "fc-layout-manifest", "version": 1,
            "tensors": [{"key": t["key"], "dtype": t["dtype"], "global_shape": t["global_shape"]}
                        for t in tensors],
            "ranks": ranks}


def write_json(obj, name):
    path = os.path.join(tmp, name)
    json.dump(obj, open(path, "w"))
    return path


def check_export_matches(ckpt, fixture, label, rename=None):
    out = os.path.join(tmp, "export-" + label)
    fcio.run([EXPORT, ckpt, out, "--quiet"])
    got, _ = fcio.read_hf_dir(out)
    for name, want in fcio.expected_values(fixture).items():
        key = (rename or {}).get(name, name)
        assert key in got, f"{label}: {key} missing ({sorted(got)})"
        arr = got[key][1]
        assert tuple(arr.shape) == tuple(want.shape), (label, key)
        assert np.array_equal(fcio.bits(arr), fcio.bits(want)), f"{label}: {key} differs"


def convert(src, out, *flags, expect=0):
    return fcio.run([CONVERT, src, out, "--quiet", *flags], expect=expect)


def case_reshard():
    for fx in FIXTURES:
        src = os.path.join(fx, "ckpt")
        tensors = inspect_json(src)["tensors"]
        for kind in ("whole", "rows", "flat"):
            label = f"{os.path.basename(fx)}-{kind}"
            man = write_json(layout_manifest(tensors, kind), label + ".json")
            out = os.path.join(tmp, label)
            convert(src, out, "--target-manifest", man)
            fcio.run([INSPECT, out, "--verify"])
            got = inspect_json(out)
            want_chunks = sum(len(r["chunks"]) for r in json.load(open(man))["ranks"])
            assert sum(len(t["chunks"]) for t in got["tensors"]) == want_chunks, label
            if kind == "flat":
                assert any(c["flattened_range"] for t in got["tensors"] for c in t["chunks"]), label
            assert [o["key"] for o in got["objects"]] == [o["key"] for o in inspect_json(src)["objects"]]
            check_export_matches(out, fx, label)
            print("ok", label)


def case_roundtrip():
    for fx in FIXTURES:
        src = os.path.join(fx, "ckpt")
        tensors = inspect_json(src)["tensors"]
        flat = os.path.join(tmp, "flat-" + os.path.basename(fx))
        convert(src, flat, "--target-manifest", write_json(layout_manifest(tensors, "flat"), "f.json"))
        back = os.path.join(tmp, "back-" + os.path.basename(fx))
        convert(flat, back, "--target-like", src)
        a, b = inspect_json(src), inspect_json(back)
        boxes = lambda j: sorted((t["key"], str(c["global_offset"]), str(c["local_shape"]))
                                 for t in j["tensors"] for c in t["chunks"])
        assert boxes(a) == boxes(b), "layout not restored"
        check_export_matches(back, fx, "back-" + os.path.basename(fx))
        print("ok roundtrip", fx)


def case_dryrun():
    fx = FIXTURES[0]
    src = os.path.join(fx, "ckpt")
    out = os.path.join(tmp, "never")
    p = convert(src, out, "--target-like", src, "--dry-run", "--json")
    plan = json.loads(p.stdout)
    total = sum(int(np.prod(t["global_shape"] or [1])) * {"float32": 4, "bfloat16": 2, "int64": 8,
                "float16": 2}[t["dtype"]] for t in inspect_json(src)["tensors"])
    assert plan["bytes_written"] == total and plan["bytes_read"] == total, (plan, total)
    assert all(r["files_read"] for r in plan["ranks"] if r["chunks"])
    assert not os.path.exists(out)
    p = convert(src, out, "--target-like", src, "--dry-run")
    assert "plan:" in p.stdout and "RANK" in p.stdout
    print("ok dryrun")


def case_errors():
    fx = max(FIXTURES, key=lambda d: len(fcio.expected_values(d)))
    src = os.path.join(fx, "ckpt")
    tensors = inspect_json(src)["tensors"]
    t0 = next(t for t in tensors if t["global_shape"])

    def expect_fail(manifest, code, words, label, extra=()):
        out = os.path.join(tmp, "fail-" + label)
        p = convert(src, out, "--target-manifest", write_json(manifest, label + ".json"), *extra,
                    expect=code)
        for w in words:
            assert w in p.stderr, (label, p.stderr)
        assert not os.path.exists(out), f"{label}: output left behind"
        assert not glob.glob(out + ".fc-tmp-*"), f"{label}: staging left behind"

    m = layout_manifest(tensors, "whole")
    m["tensors"][0]["global_shape"] = [d + 1 for d in t0["global_shape"]]
    m["ranks"][0]["chunks"][0]["local_shape"] = m["tensors"][0]["global_shape"]
    expect_fail(m, 3, [t0["key"], "shape"], "shape")
    m = layout_manifest(tensors, "whole")
    m["tensors"].append({"key": "nope", "dtype": "float32", "global_shape": [2]})
    m["ranks"][0]["chunks"].append(chunk("nope", [0], [2]))
    expect_fail(m, 4, ["nope", "no source"], "nosource")
    m = layout_manifest(tensors, "whole")
    ft = next(t for t in m["tensors"] if t["dtype"] == "float32")
    ft["dtype"] = "float16"
    expect_fail(m, 3, [ft["key"], "cast"], "dtype")
    m = layout_manifest(tensors, "whole")
    m["ranks"][0]["chunks"] = m["ranks"][0]["chunks"][1:]  # a target element nobody writes
    expect_fail(m, 3, [], "hole")
    # A source missing a data file.
    broken = os.path.join(tmp, "broken")
    shutil.copytree(src, broken)
    victim = sorted(f for f in os.listdir(broken) if f.endswith(".distcp"))[-1]
    os.remove(os.path.join(broken, victim))
    out = os.path.join(tmp, "fail-missing")
    p = convert(broken, out, "--target-like", src, expect=4)  # not found (fc-convert(1))
    assert "fc-convert: error: " in p.stderr and victim in p.stderr, p.stderr
    assert not os.path.exists(out)
    # Output exists and is not empty.
    out = os.path.join(tmp, "full")
    os.makedirs(out)
    open(os.path.join(out, "x"), "w").close()
    convert(src, out, "--target-like", src, expect=8)
    # No target, two targets.
    convert(src, os.path.join(tmp, "t"), expect=2)
    convert(src, os.path.join(tmp, "t"), "--target-like", src, "--preset", "hf-llama", expect=2)
    print("ok errors")


def case_aoa():
    fx = os.path.join(TESTDATA, "torch_dcp", "mixed")
    src = os.path.join(fx, "ckpt")
    tensors = inspect_json(src)["tensors"]
    t0 = next(t for t in tensors if len(t["global_shape"]) == 2 and t["dtype"] == "float32")
    aoa = os.path.join(tmp, "rename.aoa")
    open(aoa, "w").write(f"# rename one tensor\n{t0['key']} -> renamed\n")
    renamed = [dict(t, key="renamed") if t["key"] == t0["key"] else t for t in tensors]
    man = layout_manifest(renamed, "rows")
    out = os.path.join(tmp, "aoa-out")
    convert(src, out, "--target-manifest", write_json(man, "aoa.json"), "--aoa", aoa)
    fcio.run([INSPECT, out, "--verify"])
    check_export_matches(out, fx, "aoa", rename={t0["key"]: "renamed"})
    # A dtype change through the program's cast is allowed, and rounds like numpy.
    aoa2 = os.path.join(tmp, "cast.aoa")
    open(aoa2, "w").write(f"{t0['key']} -> {t0['key']}, dtype='bfloat16'\n")
    man = layout_manifest([dict(t, dtype="bfloat16") if t["key"] == t0["key"] else t for t in tensors], "rows")
    out = os.path.join(tmp, "aoa-cast")
    convert(src, out, "--target-manifest", write_json(man, "cast.json"), "--aoa", aoa2)
    got, _ = fcio.read_hf_dir(fcio.run([EXPORT, out, os.path.join(tmp, "cast-x"), "--quiet"]) and os.path.join(tmp, "cast-x"))
    want = fcio.f32_to_bf16_bits(fcio.expected_values(fx)[t0["key"]])
    assert np.array_equal(got[t0["key"]][1].reshape(-1), want.reshape(-1))
    print("ok aoa")


def case_torch():
    """A torch-written TP=2 x PP=2 checkpoint converted to TP=4, TP=1 and PP=4, written as
    torch DCP (1.13 metadata), then loaded by real torch 1.13 into that sharding (and into
    another one) and compared bit-exactly."""
    check = os.path.join(os.path.dirname(__file__), "..", "format", "torch", "torch_load_check.py")
    fx = os.path.join(TESTDATA, "torch_dcp", "megatron_tiny_tp2_pp2")
    src = os.path.join(fx, "ckpt")
    tensors = inspect_json(src)["tensors"]

    def tp4():
        ranks = [{"rank": r, "chunks": []} for r in range(4)]
        for t in tensors:
            shape = t["global_shape"]
            axis = next((a for a in range(len(shape)) if shape[a] % 4 == 0), None)
            if axis is None:
                ranks[0]["chunks"].append(chunk(t["key"], [0] * len(shape), shape))
                continue
            for r in range(4):
                off = [0] * len(shape); loc = list(shape)
                off[axis] = r * shape[axis] // 4; loc[axis] = shape[axis] // 4
                ranks[r]["chunks"].append(chunk(t["key"], off, loc))
        return ranks

    def pp4():
        def stage(key):
            if key.startswith("embedding"): return 0
            if key.startswith("decoder.layers.0."): return 1
            if key.startswith("decoder.layers.1."): return 2
            return 3
        ranks = [{"rank": r, "chunks": []} for r in range(4)]
        for t in tensors:
            ranks[stage(t["key"])]["chunks"].append(chunk(t["key"], [0] * len(t["global_shape"]), t["global_shape"]))
        return ranks

    manifest = lambda ranks: {"format": "fc-layout-manifest", "version": 1, "ranks": ranks,
                              "tensors": [{"key": t["key"], "dtype": t["dtype"],
                                           "global_shape": t["global_shape"]} for t in tensors]}
    targets = {"tp4": ["--target-manifest", write_json(manifest(tp4()), "tp4.json")],
               "tp1": ["--preset", "megatron-gpt", "--tp", "1", "--pp", "1"],
               "pp4": ["--target-manifest", write_json(manifest(pp4()), "pp4.json")]}
    for name, flags in targets.items():
        out = os.path.join(tmp, "torch-" + name)
        convert(src, out, *flags, "--output-format", "torch-dcp", "--torch-version", "1.13")
        p = fcio.run([sys.executable, check, out, os.path.join(fx, "expected"),
                      "--layout", "saved,resplit"], expect=None)
        if p.returncode == 77:
            print("skipping: torch cannot be imported here:", p.stdout, p.stderr)
            sys.exit(77)
        assert p.returncode == 0, (name, p.stdout, p.stderr)
        print("ok torch", name, p.stdout.strip())
    # Flattened target chunks cannot be expressed in torch DCP: a clear error, no output.
    out = os.path.join(tmp, "torch-flat")
    p = convert(src, out, "--target-manifest", write_json(layout_manifest(tensors, "flat"), "tf.json"),
                "--output-format", "torch-dcp", expect=3)
    assert "flat" in p.stderr, p.stderr
    assert not os.path.exists(out)


def case_mpi():
    """Under mpirun the target files are shared out between processes; the result must be
    byte-identical to the single-process run, in both output formats, also with more
    processes than target files; failures are reported once and leave nothing behind."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("skipping: no mpirun")
        sys.exit(77)
    mpi = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np"]
    fx = max(FIXTURES, key=lambda d: len(fcio.expected_values(d)))
    src = os.path.join(fx, "ckpt")
    tensors = inspect_json(src)["tensors"]

    def no_leftovers():
        left = [n for n in os.listdir(tmp) if ".fc-tmp-" in n]
        assert not left, left

    runs = [("flat", ["--target-manifest", write_json(layout_manifest(tensors, "flat"), "m-flat.json")]),
            ("rows-torch", ["--target-manifest", write_json(layout_manifest(tensors, "rows"), "m-rows.json"),
                            "--output-format", "torch-dcp", "--torch-version", "1.13"])]
    for label, flags in runs:
        single = os.path.join(tmp, "single-" + label)
        convert(src, single, *flags)
        for np_ in (2, 5):  # 5 > the 3 target files: two processes write nothing
            multi = os.path.join(tmp, f"mpi{np_}-{label}")
            fcio.run([*mpi, str(np_), CONVERT, src, multi, "--quiet", *flags])
            fcio.same_tree(single, multi, f"{label} -np {np_}")
            print(f"ok mpi {label} -np {np_}: byte-identical to the single-process run")
    fcio.run([INSPECT, os.path.join(tmp, "mpi2-flat"), "--verify"])
    check_export_matches(os.path.join(tmp, "mpi5-flat"), fx, "mpi5-flat")
    no_leftovers()

    # An output directory that is not empty: every process fails, one message, nothing left.
    busy = os.path.join(tmp, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep"), "w").write("x")
    p = fcio.run([*mpi, "3", CONVERT, src, busy, "--quiet", *runs[0][1]], expect=8)
    assert p.stderr.count("fc-convert: error") == 1, p.stderr
    assert os.listdir(busy) == ["keep"]
    # A target tensor with no source: a planning error, reported once by every process.
    bad = layout_manifest(tensors, "rows")
    bad["tensors"].append({"key": "ghost.weight", "dtype": "float32", "global_shape": [2]})
    bad["ranks"][2]["chunks"].append(chunk("ghost.weight", [0], [2]))
    out = os.path.join(tmp, "mpi-ghost")
    p = fcio.run([*mpi, "2", CONVERT, src, out, "--quiet", "--target-manifest",
                  write_json(bad, "ghost.json")], expect=4)
    assert "ghost.weight" in p.stderr and p.stderr.count("fc-convert: error") == 1, p.stderr
    assert not os.path.exists(out)
    no_leftovers()
    # A failure while writing, on a process other than 0: a tensor the program adds with a
    # value int8 cannot hold, in the smallest target file (process 0 takes the largest).
    aoa = os.path.join(tmp, "overflow.aoa")
    open(aoa, "w").write("_ -> ghost.weight, shape='[2]', dtype='int8', fill='1000000'\n")
    bad["tensors"][-1]["dtype"] = "int8"
    man = write_json(bad, "ghost8.json")
    for fmt in (["--output-format", "fc"], ["--output-format", "torch-dcp", "--torch-version", "1.13"]):
        out = os.path.join(tmp, "mpi-overflow")
        p = fcio.run([*mpi, "3", CONVERT, src, out, "--quiet", "--target-manifest", man,
                      "--aoa", aoa, *fmt], expect=3)
        assert "ghost.weight" in p.stderr and "fill value" in p.stderr, p.stderr
        assert p.stderr.count("fc-convert: error: rank ") == 1, p.stderr
        assert "rank 0:" not in p.stderr, p.stderr
        assert not os.path.exists(out)
        no_leftovers()
    print("ok mpi errors")


fcio.run_case(globals(), CASE, tmp)
