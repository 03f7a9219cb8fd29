"""The plan/exec layer end to end: every needed source byte read once (measured by --stats,
not taken from the plan), dry runs, and the memory minimum.

usage: plan_test.py BUILD_ROOT TESTDATA CASE   (CASE: readonce|smallitems|dryrun|budget|mpi)

Inputs are written here with numpy (a safetensors file of one [512, 256] float32 tensor,
512 KiB); budgets are small so that every job is cut into many write items, which is what
made the old data path read a reshaped, transposed or column-cut source again per item.
smallitems (and mpi): a torch DCP checkpoint of many small items, one per file (issue 31:
locating each item's data must not read its data too, nor 4 KiB windows of it).
"""
import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

np = fcio.import_or_skip("numpy")

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
EXPORT, CONVERT, INSPECT = fcio.tools(BUILD, "fc-export", "fc-convert", "fc-inspect")
tmp = tempfile.mkdtemp(prefix="fc-plan-test-")
MiB = 1 << 20


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": {"float32": "F32", "float16": "F16"}[str(arr.dtype)],
                        "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


W = (np.arange(512 * 256, dtype=np.float64) * 0.37 % 1000).astype(np.float32).reshape(512, 256)
SRC = os.path.join(tmp, "src.safetensors")
write_safetensors(SRC, {"w": W})
SRC_BYTES = W.nbytes


def stats_of(path):
    with open(path) as f:
        s = json.load(f)
    assert set(s) == {"tool", "bytes_needed", "processes"}, s
    for p in s["processes"]:
        assert set(p) == {"rank", "bytes_read", "read_calls", "bytes_written", "write_calls",
                          "bytes_sent", "bytes_received", "peak_buffer_bytes", "seconds"}, p
    return s


def check_read_once(s, label, needed):
    read = sum(p["bytes_read"] for p in s["processes"])
    assert s["bytes_needed"] == needed, (label, s["bytes_needed"], needed)
    # The bound: bytes read <= 1.05 x needed + 1 MiB (metadata reads included).
    assert read <= 1.05 * needed + MiB, f"{label}: read {read} bytes for {needed} needed"
    assert read >= needed, (label, read, needed)
    print(f"ok {label}: read {read} / needed {needed} = {read / needed:.3f}")


def aoa(text, name):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text + "\n")
    return path


def manifest(chunks_per_rank, name, dtype="float32"):
    doc = {"format": "fc-layout-manifest", "version": 1,
           "tensors": [{"key": "w", "dtype": dtype, "global_shape": [512, 256]}],
           "ranks": [{"rank": r, "chunks": [
               {"key": "w", "global_offset": off, "local_shape": shape,
                "flattened_range": flat, "replica_id": 0} for off, shape, flat in chunks]}
               for r, chunks in enumerate(chunks_per_rank)]}
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def export_case(label, program, expected_name, expected, budget="48KiB"):
    out = os.path.join(tmp, "out-" + label)
    stats = os.path.join(tmp, label + ".stats.json")
    fcio.run([EXPORT, SRC, out, "--quiet", "--threads", "1", "--memory-budget", budget,
              "--aoa", aoa(program, label + ".aoa"), "--stats", stats])
    got, _ = fcio.read_hf_dir(out)
    assert np.array_equal(got[expected_name][1], expected), label
    s = stats_of(stats)
    assert s["tool"] == "fc-export"
    check_read_once(s, label, SRC_BYTES)


def convert_values(out):
    """Reassembles 'w' from an fc distcp output through fc-export."""
    hf = out + "-hf"
    fcio.run([EXPORT, out, hf, "--quiet"])
    got, _ = fcio.read_hf_dir(hf)
    return got["w"][1]


def convert_case(label, layout):
    out = os.path.join(tmp, "out-" + label)
    stats = os.path.join(tmp, label + ".stats.json")
    fcio.run([CONVERT, SRC, out, "--quiet", "--threads", "2", "--memory-budget", "48KiB",
              "--target-manifest", layout, "--stats", stats])
    assert np.array_equal(convert_values(out), W), label
    s = stats_of(stats)
    assert s["tool"] == "fc-convert"
    check_read_once(s, label, SRC_BYTES)


def case_readonce():
    export_case("identity", "w -> w", "w", W)
    # A reshaped block is held whole (3 x 512 KiB): the rest of the budget makes ~15 items.
    export_case("reshape", "w -> v, reshape='[2, 256, 256]'", "v", W.reshape(2, 256, 256),
                budget="1700KiB")
    export_case("transpose", "w^T -> wt", "wt", W.T, budget="1700KiB")
    # Column cuts: each target chunk needs half of every source row.
    convert_case("columns", manifest([[([0, 0], [512, 128], None)],
                                      [([0, 128], [512, 128], None)]], "columns.json"))
    # ZeRO-style: the whole tensor flattened and cut mid-row over 3 ranks.
    n = 512 * 256
    convert_case("flattened", manifest([[([0, 0], [512, 256], [0, 40000])],
                                        [([0, 0], [512, 256], [40000, 90001])],
                                        [([0, 0], [512, 256], [90001, n])]], "flat.json"))


def small_items_ckpt():
    """A torch DCP checkpoint (torch 1.13 style, written by fc-convert): 81 [15, 260] float32
    params with exp_avg and exp_avg_sq, 243 items of 15,600 tensor bytes, each in its own
    file (244 files with .metadata, ~4 MB). Returns (dir, bytes needed, a 4-rank layout)."""
    names = []
    for i in range(81):
        k = f"layers.{i}.weight"
        names += [k, f"optim.{k}.exp_avg", f"optim.{k}.exp_avg_sq"]
    arrays = {n: (np.arange(15 * 260, dtype=np.float32) + j).reshape(15, 260)
              for j, n in enumerate(names)}
    st = os.path.join(tmp, "small.safetensors")
    write_safetensors(st, arrays)

    def layout(ranks, name):
        doc = {"format": "fc-layout-manifest", "version": 1,
               "tensors": [{"key": n, "dtype": "float32", "global_shape": [15, 260]} for n in names],
               "ranks": [{"rank": r, "chunks": [
                   {"key": n, "global_offset": [0, 0], "local_shape": [15, 260],
                    "flattened_range": None, "replica_id": 0}
                   for j, n in enumerate(names) if j % ranks == r]} for r in range(ranks)]}
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            json.dump(doc, f)
        return path

    dcp = os.path.join(tmp, "small-dcp")
    fcio.run([CONVERT, st, dcp, "--quiet", "--target-manifest", layout(len(names), "small-243.json"),
              "--output-format", "torch-dcp", "--torch-version", "1.13"])
    files = os.listdir(dcp)
    assert len(files) == 244 and ".metadata" in files, sorted(files)
    return dcp, 243 * 15 * 260 * 4, layout(4, "small-4.json")


def case_smallitems():
    dcp, needed, layout = small_items_ckpt()
    for threads in ("1", "2"):
        out = os.path.join(tmp, "small-out-" + threads)
        stats = os.path.join(tmp, f"small-{threads}.stats.json")
        fcio.run([CONVERT, dcp, out, "--quiet", "--threads", threads, "--target-manifest", layout,
                  "--stats", stats])
        s = stats_of(stats)
        check_read_once(s, f"small items convert, {threads} thread(s)", needed)
    stats = os.path.join(tmp, "small-export.stats.json")
    fcio.run([EXPORT, dcp, os.path.join(tmp, "small-hf"), "--quiet", "--include-optimizer",
              "--stats", stats])
    check_read_once(stats_of(stats), "small items export", needed)


def case_dryrun():
    out = os.path.join(tmp, "never")
    p = fcio.run([EXPORT, SRC, out, "--dry-run"])
    assert "export plan:" in p.stdout and "model.safetensors" in p.stdout, p.stdout
    assert max(len(line) for line in p.stdout.splitlines()) <= 120, p.stdout
    p = fcio.run([EXPORT, SRC, out, "--dry-run", "--json", "--memory-budget", "1MiB"])
    plan = json.loads(p.stdout)
    assert plan["format"] == "fc-plan" and plan["kind"] == "export", plan
    assert plan["bytes_needed"] == SRC_BYTES and plan["bytes_written"] == SRC_BYTES, plan
    assert plan["memory"]["budget"] == MiB and plan["memory"]["peak"] <= MiB, plan
    assert plan["per_process"][0]["bytes_read"] == SRC_BYTES, plan
    assert not os.path.exists(out)
    fcio.run([EXPORT, SRC, out, "--json"], expect=2)  # a usage error
    layout = manifest([[([0, 0], [512, 128], None)], [([0, 128], [512, 128], None)]], "dry.json")
    p = fcio.run([CONVERT, SRC, out, "--target-manifest", layout, "--dry-run", "--json"])
    plan = json.loads(p.stdout)
    fcio.run([CONVERT, SRC, out, "--target-manifest", layout, "--json"], expect=2)  # a usage error
    assert plan["plan"]["format"] == "fc-plan" and plan["plan"]["kind"] == "convert", plan
    assert [r["bytes_read"] for r in plan["ranks"]] == [SRC_BYTES // 2] * 2, plan["ranks"]
    assert not os.path.exists(out)
    print("ok dryrun")


def case_budget():
    out = os.path.join(tmp, "small")
    p = fcio.run([EXPORT, SRC, out, "--quiet", "--memory-budget", "100",
                  "--aoa", aoa("w -> v, reshape='[2, 256, 256]'", "b.aoa")], expect=10)
    assert "below the" in p.stderr and "reshaped source block" in p.stderr, p.stderr
    assert not os.path.exists(out) or not os.listdir(out), os.listdir(out)
    # The minimum it names is enough.
    minimum = int(p.stderr.split("below the ")[1].split(" ")[0])
    fcio.run([EXPORT, SRC, out, "--quiet", "--memory-budget", str(minimum),
              "--aoa", aoa("w -> v, reshape='[2, 256, 256]'", "b.aoa")])
    got, _ = fcio.read_hf_dir(out)
    assert np.array_equal(got["v"][1], W.reshape(2, 256, 256))
    print("ok budget: minimum", minimum)


def case_mpi():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("skipping: no mpirun")
        sys.exit(77)
    layout = manifest([[([0, 0], [512, 128], None)], [([0, 128], [512, 128], None)],
                       []], "mpi.json")
    for np_ in (2, 3):
        out = os.path.join(tmp, f"mpi-{np_}")
        stats = os.path.join(tmp, f"mpi-{np_}.stats.json")
        fcio.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np_), CONVERT,
                  SRC, out, "--quiet", "--memory-budget", "64KiB", "--target-manifest", layout,
                  "--stats", stats])
        s = stats_of(stats)
        assert [p["rank"] for p in s["processes"]] == list(range(np_)), s
        check_read_once(s, f"mpi np {np_}", SRC_BYTES)
        assert np.array_equal(convert_values(out), W)
    # Small items over per-process directories (file k on process k % 4, .metadata on 0):
    # bytes another process read and broadcast (the metadata) count once, where they were read.
    dcp, needed, small_layout = small_items_ckpt()
    base = os.path.join(tmp, "small-split")
    for r in range(4):
        os.makedirs(os.path.join(base, f"ckpt_{r}"))
    for k, f in enumerate(sorted(f for f in os.listdir(dcp) if f.endswith(".distcp"))):
        shutil.copy(os.path.join(dcp, f), os.path.join(base, f"ckpt_{k % 4}", f))
    shutil.copy(os.path.join(dcp, ".metadata"), os.path.join(base, "ckpt_0", ".metadata"))
    stats = os.path.join(tmp, "small-mpi.stats.json")
    fcio.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", CONVERT,
              os.path.join(base, "ckpt_{rank}"), os.path.join(tmp, "small-mpi"), "--quiet",
              "--target-manifest", small_layout, "--stats", stats])
    check_read_once(stats_of(stats), "small items, mpi np 4, per-process directories", needed)


fcio.run_case(globals(), CASE, tmp)
