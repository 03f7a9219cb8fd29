"""fc-convert refuses at plan time what it cannot write (issue 11 items 2 and 3): --dry-run
exits with the same code and message as the real run, and neither leaves an output.

usage: convert_checks_test.py BUILD_ROOT TESTDATA CASE
CASE: torchflat | preset | emptyrank | outdir
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
CONVERT, EXPORT = fcio.tools(BUILD, "fc-convert", "fc-export")
MEGATRON = os.path.join(TESTDATA, "torch_dcp", "megatron_tiny_tp2_pp2", "ckpt")
tmp = tempfile.mkdtemp(prefix="fc-convert-checks-")


def run(args, expect=0, limit=120):
    return fcio.run(args, expect, limit)


def error_line(p):
    lines = [l for l in p.stderr.splitlines() if "error" in l]
    assert lines, p.stderr
    return lines[-1]


def same_refusal(args, code, needles):
    """The dry run and the real run both exit `code` with the same error line naming every
    needle; neither creates OUT. Returns the error line."""
    out = os.path.join(tmp, "out")
    dry = run([CONVERT, *args[:1], out, *args[1:], "--dry-run"], expect=code)
    real = run([CONVERT, *args[:1], out, *args[1:]], expect=code)
    assert error_line(dry) == error_line(real), (dry.stderr, real.stderr)
    for n in needles:
        assert n in error_line(real), f"'{n}' not in: {real.stderr}"
    assert not os.path.exists(out), os.listdir(tmp)
    assert os.listdir(tmp) == [], f"left behind: {os.listdir(tmp)}"
    return error_line(real)


def case_torchflat():
    # The fc distcp sample stores optim.exp_avg as flattened ranges; torch DCP has no
    # flattened chunks, so --target-like the sample with torch DCP output is refused, by the
    # dry run too (before this, only the real run found it, at write time).
    sample = os.path.join(TESTDATA, "fc_distcp", "sample")
    same_refusal([sample, "--target-like", sample, "--output-format", "torch-dcp"], 3,
                 ["optim.exp_avg", "flattened range"])
    # Same layout as fc distcp output, and a torch DCP output without flattened ranges: fine.
    run([CONVERT, sample, os.path.join(tmp, "dry"), "--target-like", sample, "--dry-run"])
    mixed = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
    run([CONVERT, mixed, os.path.join(tmp, "dry"), "--target-like", mixed, "--output-format",
         "torch-dcp", "--dry-run"])


def case_preset():
    # hf-llama rules on a Megatron checkpoint name no tensor: refused, naming the preset and
    # the first key (before: a checkpoint of replicas with an empty rank 1 was written).
    line = same_refusal([MEGATRON, "--preset", "hf-llama", "--tp", "2", "--quiet"], 3,
                        ["--preset hf-llama", "the rules match no tensor"])
    key = re.search(r"first unmatched key '([^']+)'", line).group(1)
    expected = os.listdir(os.path.join(os.path.dirname(MEGATRON), "expected"))
    assert key + ".npy" in expected, (key, expected)
    # Also with pp = 2 (before: every tensor "matched no pipeline rule", naming no preset).
    same_refusal([MEGATRON, "--preset", "hf-llama", "--pp", "2", "--quiet"], 3,
                 ["--preset hf-llama"])
    # Also with one rank (before: a silent merge into one file), naming the preset and key.
    line = same_refusal([MEGATRON, "--preset", "hf-llama", "--tp", "1", "--quiet"], 3,
                        ["--preset hf-llama", "the rules match no tensor"])
    assert re.search(r"first unmatched key '([^']+)'", line).group(1) == key, line
    # A merge into one rank is a layout of degrees only; a matching preset at tp 1 also is.
    merge = os.path.join(tmp, "merge.json")
    with open(merge, "w") as f:
        json.dump({"degrees": {}}, f)
    for target in (["--target-layout", merge], ["--preset", "megatron-gpt", "--tp", "1"]):
        out = os.path.join(tmp, "merged-" + target[0].strip("-"))
        run([CONVERT, MEGATRON, out, *target, "--quiet"])
        meta = json.load(open(os.path.join(out, "fc.metadata.json")))
        assert len(meta["files"]) == 1, meta["files"]
        assert all(len(t["chunks"]) == 1 and t["chunks"][0]["local_shape"] == t["global_shape"]
                   for t in meta["tensors"]), target
    # The right preset plans.
    run([CONVERT, MEGATRON, os.path.join(tmp, "dry"), "--preset", "megatron-gpt", "--tp", "2",
         "--pp", "2", "--dry-run", "--quiet"])


def case_emptyrank():
    # A layout file whose layer regex matches nothing: every tensor goes to stage 0, the pp=1
    # ranks would be empty files. Refused, naming the file, the rank and the first key no
    # rule places.
    layout = os.path.join(tempfile.mkdtemp(prefix="fc-layout-"), "layout.json")
    with open(layout, "w") as f:
        json.dump({"degrees": {"tp": 1, "pp": 2},
                   "pipeline": {"layer_regex": r"(?:^|\.)blocks\.(\d+)\.",
                                "first_stage": [r"(?:^|\.)embedding\."], "other": "first"}}, f)
    line = same_refusal([MEGATRON, "--target-layout", layout, "--quiet"], 3,
                        ["--target-layout " + layout, "target rank 1 (tp 0, pp 1",
                         "holds no tensor", "first key no rule matches: 'decoder."])
    assert "embedding" not in line.split("first key no rule matches")[1], line


def case_outdir():
    # OUT checked as the real run claims it: not empty (exit 8), the input itself or inside
    # it (exit 3); the dry run leaves it as it was.
    mixed = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    open(os.path.join(full, "keep"), "w").close()
    for out, code, needle in ((full, 8, "output directory exists and is not empty"),
                              (mixed, 3, "output is the input"),
                              (os.path.join(mixed, "sub"), 3, "inside the input")):
        args = [mixed, out, "--target-like", mixed, "--quiet"]
        dry = run([CONVERT, *args, "--dry-run"], expect=code)
        real = run([CONVERT, *args], expect=code)
        assert error_line(dry) == error_line(real) and needle in error_line(dry), \
            (dry.stderr, real.stderr)
    # fc-export's dry run checks OUT as its real run does (it exited 0 into a full OUT).
    for out, code, needle in ((full, 8, "output directory exists and is not empty"),
                              (mixed, 3, "output is the input"),
                              (os.path.join(mixed, "sub"), 3, "inside the input")):
        dry = run([EXPORT, mixed, out, "--quiet", "--dry-run"], expect=code)
        real = run([EXPORT, mixed, out, "--quiet"], expect=code)
        assert error_line(dry) == error_line(real) and needle in error_line(dry), \
            (dry.stderr, real.stderr)
    assert os.listdir(full) == ["keep"], os.listdir(full)
    assert not os.path.exists(os.path.join(mixed, "sub"))
    # An empty or absent OUT plans.
    os.remove(os.path.join(full, "keep"))
    run([CONVERT, mixed, full, "--target-like", mixed, "--dry-run"])
    run([CONVERT, mixed, os.path.join(tmp, "absent"), "--target-like", mixed, "--dry-run"])


def case_presetstates():
    # --sharding flattens the optimizer states under the names fc's readers give them
    # (before: only '<param>.exp_avg' matched, and a Megatron checkpoint stopped with
    # "target rank 4 (tp 0, pp 0, dp 0, sharding 1) holds no tensor"). Each conversion holds
    # flattened chunks on every sharding rank and equals its source (fc-diff exit 0).
    diff, inspect = fcio.tools(BUILD, "fc-diff", "fc-inspect")
    cases = [  # (source, preset args, the states' names as the reader gives them)
        (os.path.join(TESTDATA, "megatron_legacy", "gpt_tp2_pp2", "ckpt"),  # Megatron legacy
         ["megatron-gpt", "--tp", "4", "--pp", "2", "--sharding", "2"], "optimizer."),
        (os.path.join(TESTDATA, "torch_dcp_adam", "megatron_dist", "ckpt"),  # torch_dist
         ["megatron-gpt", "--tp", "1", "--sharding", "2"], "optimizer.state."),
        (os.path.join(TESTDATA, "torch_dcp_adam", "fsdp_adam", "ckpt"),  # torch optim.state.*
         ["hf-llama", "--tp", "1", "--sharding", "2"], "optim.state."),
    ]
    for i, (src, preset, states) in enumerate(cases):
        out = os.path.join(tmp, f"presetstates{i}")
        run([CONVERT, src, out, "--preset", *preset, "--quiet"])
        j = json.loads(run([inspect, out, "--json"]).stdout)
        flat = {}
        for t in j["tensors"]:
            for c in t["chunks"]:
                if c["flattened_range"] is not None:
                    assert t["key"].startswith(states), (src, t["key"])
                    flat.setdefault(c["file"], 0)
                    flat[c["file"]] += 1
        sharding = int(preset[preset.index("--sharding") + 1])
        assert len(flat) >= sharding, (src, flat)
        run([diff, src, out, "--quiet"])


fcio.run_case(globals(), CASE, tmp)
print("ok")
