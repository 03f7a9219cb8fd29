"""One consistent command line across the fc tools (issue 11): flags in --help and the man
pages agree, the same mistake gets the same exit code and message form in every tool, flags
that would have no effect are refused, globs filter names everywhere, warnings name what an
output leaves out, fc-export --copy-from, and --dry-run lines fit 120 columns.

usage: cli_test.py BUILD_ROOT TESTDATA CASE
  CASE: helpman|exitcodes|noeffect|globs|warnings|copyfrom|dryrunwidth|dryruntime
"""
import glob
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

np = fcio.import_or_skip("numpy")

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = {t: os.path.join(BUILD, "tools", t) for t in ("fc-inspect", "fc-export", "fc-convert", "fc-diff")}
INSPECT, EXPORT, CONVERT, DIFF = (TOOLS[t] for t in ("fc-inspect", "fc-export", "fc-convert", "fc-diff"))
MIXED = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
MEGATRON = os.path.join(TESTDATA, "torch_dcp", "megatron_tiny_tp2_pp2", "ckpt")
tmp = tempfile.mkdtemp(prefix="fc-cli-test-")


def run(args, expect=0):
    return fcio.run([str(a) for a in args], expect=expect)


def keys(ckpt, *flags):
    return [t["key"] for t in json.loads(run([INSPECT, ckpt, "--json", *flags]).stdout)["tensors"]]


def help_flags(tool):
    """Long flags of the option lines of --help (CLI11: lines starting with spaces, then -x,
    --flag or --flag)."""
    out = run([TOOLS[tool], "--help"]).stdout
    flags = set()
    for line in out.splitlines():
        m = re.match(r"\s+(-\w,)?(--[a-z][a-z0-9-]*)", line)
        if m:
            flags.add(m.group(2))
    return flags - {"--help", "--version"}


def man_flags(tool):
    """Long flags named in the SYNOPSIS and on the tag lines of OPTIONS (the line after .TP)."""
    text = open(os.path.join(SOURCE_ROOT, "man", tool + ".1")).read()
    section, flags, after_tp = None, set(), False
    for line in text.splitlines():
        if line.startswith(".SH"):
            section = line[4:].strip()
            continue
        tagged = section == "OPTIONS" and after_tp
        after_tp = line.startswith(".TP")
        if section == "SYNOPSIS" or tagged:
            for f in re.findall(r"\\-\\-([a-z](?:[a-z0-9]|\\-)*)", line):
                flags.add("--" + f.replace("\\-", "-"))
    return flags


def case_helpman():
    for tool in TOOLS:
        h, m = help_flags(tool), man_flags(tool)
        assert h, f"{tool}: no flags parsed from --help"
        assert h == m, (f"{tool}: --help and man/{tool}.1 differ: only in --help: {sorted(h - m)}, "
                        f"only in the man page: {sorted(m - h)}")
        # --help names the pattern syntax wherever names are filtered.
        if "--include" in h or "--tensors" in h:
            assert "glob (* ? [..])" in run([TOOLS[tool], "--help"]).stdout, tool
    # fc-convert: --format is the input format (as everywhere), the output --output-format.
    out = run([CONVERT, "--help"]).stdout
    assert re.search(r"--format TEXT\s+force the input format", out), out
    assert "--output-format" in out and "--input-format" not in out, out
    # Every tool names the same six input formats, in --help and in its man page.
    formats = "torch-dcp, safetensors, fc, paddle, deepspeed, megatron-legacy"
    for tool, path in TOOLS.items():
        flag = "--format-a" if tool == "fc-diff" else "--format"
        line = next(l for l in run([path, "--help"]).stdout.splitlines() if l.strip().startswith(flag + " "))
        assert line.rstrip().endswith(formats), (tool, line)
        page = open(os.path.join(SOURCE_ROOT, "man", tool + ".1")).read()
        assert "(" + formats + ")" in page, tool
    # A flag's prose names every value it accepts (fc-export's --dtype left out float64).
    for tool in ("fc-export", "fc-convert"):
        out = run([TOOLS[tool], "--help"]).stdout
        m = re.search(r"--dtype TEXT:\{([^}]*)\}\s+(.*?)(?:\n  -|\Z)", out, re.S)
        assert m, (tool, out)
        for value in m.group(1).split(","):
            assert value in m.group(2), (tool, value, m.group(2))
    # An object's encoding is spelled one way: fc-inspect (text and JSON) as fc.metadata.json.
    conv = os.path.join(tmp, "enc")
    run([CONVERT, MIXED, conv, "--quiet", "--target-like", MIXED])
    stored = {o["key"]: o["encoding"] for o in json.load(open(os.path.join(conv, "fc.metadata.json")))["objects"]}
    assert stored and set(stored.values()) <= {"raw", "torch_save"}, stored
    for ckpt in (MIXED, conv):
        shown = {o["key"]: o["encoding"] for o in json.loads(run([INSPECT, ckpt, "--json"]).stdout)["objects"]}
        assert shown == stored, (ckpt, shown, stored)
        text = run([INSPECT, ckpt]).stdout
        assert all(f"  {k}  {e}, " in text for k, e in stored.items()), text
    print("ok helpman")


def case_exitcodes():
    missing = os.path.join(tmp, "no-such-ckpt")
    out = os.path.join(tmp, "out")
    for args in ([INSPECT, missing], [EXPORT, missing, out], [CONVERT, missing, out, "--target-like", MIXED],
                 [DIFF, missing, MIXED], [DIFF, MIXED, missing]):
        p = run(args, expect=4)
        tool = os.path.basename(args[0])
        assert p.stderr.startswith(tool + ": error: ") and "no-such-ckpt" in p.stderr, p.stderr
        assert not os.path.exists(out)
    # Usage errors: 2, one "<tool>: error:" line first, in every tool.
    usage = {
        "fc-inspect": [[INSPECT, MIXED, "--no-such-flag"], [INSPECT]],
        "fc-export": [[EXPORT, MIXED, out, "--no-such-flag"], [EXPORT, MIXED], [EXPORT, MIXED, out, "--threads", "0"],
                      [EXPORT, MIXED, out, "--threads", "-2"], [EXPORT, MIXED, out, "--dtype", "int3"]],
        "fc-convert": [[CONVERT, MIXED, out, "--no-such-flag", "--target-like", MIXED],
                       [CONVERT, MIXED, out, "--target-like", MIXED, "--threads", "0"],
                       [CONVERT, MIXED, out, "--target-like", MIXED, "--output-format", "paddle"]],
        "fc-diff": [[DIFF, MIXED, MIXED, "--no-such-flag"], [DIFF, MIXED], [DIFF, MIXED, MIXED, "--threads", "-1"]],
    }
    for tool, cases in usage.items():
        for args in cases:
            p = run(args, expect=2)
            assert p.stderr.startswith(tool + ": error: "), (args, p.stderr)
            assert not os.path.exists(out)
    # A value outside its flag's own syntax (a size, a format name, a tolerance) is a usage
    # error, 2, in every tool that has the flag (issue 32: "--memory-budget 4gigs" was 3),
    # with the flag and the value named, and nothing written.
    for args in ([INSPECT, MIXED, "--format", "nope"], [EXPORT, MIXED, out, "--format", "nope"],
                 [CONVERT, MIXED, out, "--target-like", MIXED, "--format", "nope"],
                 [CONVERT, MIXED, out, "--target-like", MIXED, "--input-format", "nope"],
                 [DIFF, MIXED, MIXED, "--format-a", "nope"], [DIFF, MIXED, MIXED, "--format-b", "nope"],
                 [EXPORT, MIXED, out, "--memory-budget", "4gigs"],
                 [EXPORT, MIXED, out, "--max-shard-size", "4gigs"],
                 [CONVERT, MIXED, out, "--target-like", MIXED, "--memory-budget", "4gigs"],
                 [DIFF, MIXED, MIXED, "--memory-budget", "4gigs"],
                 [DIFF, MIXED, MIXED, "--rtol", "-1"], [DIFF, MIXED, MIXED, "--atol", "nan"]):
        p = run(args, expect=2)
        flag, value = args[-2], args[-1]
        assert p.stderr.startswith(f"{os.path.basename(args[0])}: error: {flag}: "), (args, p.stderr)
        assert f"'{value}'" in p.stderr, p.stderr
        assert not os.path.exists(out)
    # What a value holds or means is 3 (invalid argument): a bad glob, a bad AOA program.
    bad_aoa = os.path.join(tmp, "bad.aoa")
    open(bad_aoa, "w").write("a ->\n")
    for args in ([EXPORT, MIXED, out, "--include", "[w"], [DIFF, MIXED, MIXED, "--include", "[w"],
                 [EXPORT, MIXED, out, "--aoa", bad_aoa]):
        p = run(args, expect=3)
        assert p.stderr.startswith(os.path.basename(args[0]) + ": error: "), (args, p.stderr)
        assert not os.path.exists(out)
    # The run directory above the checkpoint: the error points at the subdirectory that holds
    # one (issue 32 item 7), in every tool; an empty directory gets no hint.
    run_dir = os.path.dirname(MIXED)
    for args in ([INSPECT, run_dir], [EXPORT, run_dir, out], [DIFF, run_dir, MIXED]):
        p = run(args, expect=3)
        assert p.stderr.rstrip().endswith(f"{MIXED} holds a torch-dcp checkpoint: give that path"), p.stderr
    os.makedirs(os.path.join(tmp, "empty", "sub"))
    p = run([INSPECT, os.path.join(tmp, "empty")], expect=3)
    assert "no checkpoint found" in p.stderr and "holds" not in p.stderr, p.stderr
    # --help and --version exit 0 and print on stdout.
    for tool, path in TOOLS.items():
        assert run([path, "--version"]).stdout.startswith(tool + " "), tool
    print("ok exitcodes")


def case_noeffect():
    out = os.path.join(tmp, "out")
    aoa = os.path.join(tmp, "id.aoa")
    first = keys(MIXED)[0]
    open(aoa, "w").write(f"{first} -> renamed\n")
    refused = [
        ([CONVERT, MIXED, out, "--target-like", MIXED, "--tp", "2"], "--tp applies to --preset only"),
        ([CONVERT, MIXED, out, "--target-manifest", aoa, "--sharding", "2"], "--sharding applies to --preset"),
        ([CONVERT, MIXED, out, "--target-like", MIXED, "--torch-version", "2"],
         "--torch-version applies to --output-format torch-dcp"),
        ([CONVERT, MIXED, out, "--target-like", MIXED, "--json"], "--json needs --dry-run"),
        ([CONVERT, MIXED, out, "--target-like", MIXED, "--format", "fc", "--input-format", "fc"], "--input-format"),
        ([EXPORT, MIXED, out, "--json"], "--json needs --dry-run"),
        ([INSPECT, MIXED, "--aoa", aoa, "--tensors", "*"], "--tensors cannot be combined with --aoa"),
        ([INSPECT, MIXED, "--aoa", aoa, "--verify"], "--verify cannot be combined with --aoa"),
    ]
    for args, message in refused:
        p = run(args, expect=2)
        assert message in p.stderr, (args, p.stderr)
        assert not os.path.exists(out)
    # The combinations that do have an effect still work.
    run([CONVERT, MEGATRON, "--dry-run", "--preset", "megatron-gpt", "--tp", "1"])
    run([CONVERT, MIXED, os.path.join(tmp, "t"), "--quiet", "--target-like", MIXED,
         "--output-format", "torch-dcp", "--torch-version", "2"])
    # -v does what it says: debug lines about the input and the plan.
    quiet_run = run([EXPORT, MIXED, "--dry-run", os.path.join(tmp, "v")]).stderr
    verbose = run([EXPORT, MIXED, "--dry-run", os.path.join(tmp, "v"), "-v"]).stderr
    assert "fc-export: output model.safetensors: process 0" in verbose, verbose
    assert "output model.safetensors" not in quiet_run, quiet_run
    verbose = run([CONVERT, MIXED, "--dry-run", "--target-like", MIXED, "-v"]).stderr
    assert "fc-convert: target rank 0 (" in verbose, verbose
    verbose = run([DIFF, MIXED, MIXED, "-v"]).stderr
    assert "fc-diff: comparing " in verbose and "bit-exact" in verbose, verbose
    # The old name of the input-format flag still works.
    run([CONVERT, MIXED, "--dry-run", "--target-like", MIXED, "--input-format", "torch-dcp"])
    # fc-convert's --format is the input format now: the old `--format torch-dcp` meaning the
    # output reads an fc distcp input as torch DCP and fails instead of writing.
    fc_ckpt = os.path.join(tmp, "as-fc")
    run([CONVERT, MIXED, fc_ckpt, "--quiet", "--target-like", MIXED])
    p = run([CONVERT, fc_ckpt, os.path.join(tmp, "bad"), "--target-like", fc_ckpt, "--format", "torch-dcp"],
            expect=None)
    assert p.returncode not in (0, 1), p.returncode
    assert not os.path.exists(os.path.join(tmp, "bad"))
    print("ok noeffect")


def case_globs():
    all_keys = keys(MIXED)
    assert len(all_keys) >= 3, all_keys
    a = all_keys[0]
    prefix = a.split(".")[0]
    # fc-inspect --tensors: a glob on the whole key.
    assert keys(MIXED, "--tensors", a) == [a]
    assert keys(MIXED, "--tensors", prefix + ".*") == [k for k in all_keys if k.startswith(prefix + ".")]
    assert keys(MIXED, "--tensors", a[:-1]) == [] or a[:-1] in all_keys  # whole name, not a search
    p = run([INSPECT, MIXED, "--tensors", "[x"], expect=3)
    assert p.stderr.startswith("fc-inspect: error: --tensors") and "[x" in p.stderr, p.stderr
    # fc-export and fc-convert: the same syntax, repeatable.
    out = os.path.join(tmp, "exp")
    run([EXPORT, MIXED, out, "--quiet", "--include", all_keys[0], "--include", all_keys[1]])
    got, _ = fcio.read_hf_dir(out)
    assert sorted(got) == sorted(all_keys[:2]), sorted(got)
    conv = os.path.join(tmp, "conv")
    run([CONVERT, MIXED, conv, "--quiet", "--target-like", MIXED, "--exclude", all_keys[0],
         "--exclude", all_keys[1]])
    assert keys(conv) == all_keys[2:], keys(conv)
    run([INSPECT, conv, "--verify"])
    # Excluded tensors are in no rank and not in the emitted manifest.
    man = os.path.join(tmp, "m.json")
    run([CONVERT, MIXED, "--dry-run", "--target-like", MIXED, "--include", all_keys[0], "--emit-manifest", man])
    m = json.load(open(man))
    assert [t["key"] for t in m["tensors"]] == [all_keys[0]], m["tensors"]
    assert all(c["key"] == all_keys[0] for r in m["ranks"] for c in r["chunks"])
    p = run([CONVERT, MIXED, os.path.join(tmp, "none"), "--target-like", MIXED, "--include", "nothing*"], expect=3)
    assert "no target tensor" in p.stderr, p.stderr
    p = run([CONVERT, MIXED, os.path.join(tmp, "none"), "--target-like", MIXED, "--exclude", "[z-a]"], expect=3)
    assert "--exclude" in p.stderr, p.stderr
    # fc-convert --dtype: floating tensors cast, like fc-export --dtype; values agree.
    bf = os.path.join(tmp, "conv-bf16")
    run([CONVERT, MIXED, bf, "--quiet", "--target-like", MIXED, "--dtype", "bfloat16"])
    run([INSPECT, bf, "--verify"])
    src = {t["key"]: t["dtype"] for t in json.loads(run([INSPECT, MIXED, "--json"]).stdout)["tensors"]}
    got = {t["key"]: t["dtype"] for t in json.loads(run([INSPECT, bf, "--json"]).stdout)["tensors"]}
    for k, dt in src.items():
        want = "bfloat16" if dt in ("float32", "float16", "float64", "bfloat16") else dt
        assert got[k] == want, (k, dt, got[k])
    e1, e2 = os.path.join(tmp, "e1"), os.path.join(tmp, "e2")
    run([EXPORT, bf, e1, "--quiet"])
    run([EXPORT, MIXED, e2, "--quiet", "--dtype", "bfloat16"])
    g1, _ = fcio.read_hf_dir(e1)
    g2, _ = fcio.read_hf_dir(e2)
    assert sorted(g1) == sorted(g2)
    for k in g1:
        assert g1[k][0] == g2[k][0] and np.array_equal(g1[k][1], g2[k][1]), k
    # A target layout that declares another dtype: --dtype decides.
    run([CONVERT, bf, os.path.join(tmp, "conv-f32"), "--quiet", "--target-like", MIXED, "--dtype", "float32"])
    print("ok globs")


def case_warnings():
    all_keys = keys(MIXED)
    # A target that lacks some source tensors: counted and named, hidden by --quiet.
    man = os.path.join(tmp, "m.json")
    run([CONVERT, MIXED, "--dry-run", "--target-like", MIXED, "--exclude", all_keys[0], "--emit-manifest", man])
    p = run([CONVERT, MIXED, os.path.join(tmp, "c1"), "--target-manifest", man])
    assert "fc-convert: 1 source tensor(s) are not in the output (no target tensor reads them): " \
        + all_keys[0] + "\n" in p.stderr, p.stderr
    p = run([CONVERT, MIXED, os.path.join(tmp, "c2"), "--target-manifest", man, "--quiet"])
    assert p.stderr == "", p.stderr
    # --exclude is the user's own choice: not listed.
    p = run([CONVERT, MIXED, os.path.join(tmp, "c3"), "--target-like", MIXED, "--exclude", all_keys[0]])
    assert "not in the output" not in p.stderr, p.stderr
    # Optimizer states left out of an export: counted and named.
    ds = os.path.join(TESTDATA, "deepspeed", "zero1", "ckpt")
    opt = [k for k in keys(ds) if k.startswith("optimizer.")]
    assert opt, keys(ds)
    p = run([EXPORT, ds, os.path.join(tmp, "e1")])
    shown = ", ".join(opt[:5]) + (f" and {len(opt) - 5} more" if len(opt) > 5 else "")
    assert (f"leaving out {len(opt)} optimizer state tensor(s) (--include-optimizer exports them): "
            f"{shown}\n") in p.stderr, (p.stderr, shown)
    p = run([EXPORT, ds, os.path.join(tmp, "e2"), "--quiet"])
    assert p.stderr == "", p.stderr
    p = run([EXPORT, ds, os.path.join(tmp, "e3"), "--include-optimizer"])
    assert "leaving out" not in p.stderr, p.stderr
    # Sources an AOA program's outputs do not read.
    aoa = os.path.join(tmp, "drop.aoa")
    open(aoa, "w").write(f"{all_keys[0]} -> _\n")
    p = run([EXPORT, MIXED, os.path.join(tmp, "e4"), "--aoa", aoa])
    assert "1 source tensor(s) are in no output of the AOA program: " + all_keys[0] in p.stderr, p.stderr
    print("ok warnings")


def case_printlayout():
    """Issue 32 item 6: --print-layout prints the layout file a preset stands for; converting
    with that file as --target-layout gives the same output, file for file."""
    p = run([CONVERT, "--preset", "megatron-gpt", "--tp", "1", "--pp", "2", "--print-layout"])
    layout = json.loads(p.stdout)
    assert layout["degrees"] == {"tp": 1, "pp": 2, "dp": 1, "sharding": 1, "ep": 1}, layout
    assert "preset" not in layout and layout["pipeline"]["layer_regex"], layout
    path = os.path.join(tmp, "layout.json")
    open(path, "w").write(p.stdout)
    by_preset, by_file = os.path.join(tmp, "by_preset"), os.path.join(tmp, "by_file")
    run([CONVERT, MEGATRON, by_preset, "-q", "--preset", "megatron-gpt", "--tp", "1", "--pp", "2"])
    run([CONVERT, MEGATRON, by_file, "-q", "--target-layout", path])
    names = sorted(os.listdir(by_preset))
    assert names == sorted(os.listdir(by_file)) and len(names) > 2, (names, os.listdir(by_file))
    for n in names:
        with open(os.path.join(by_preset, n), "rb") as a, open(os.path.join(by_file, n), "rb") as b:
            assert a.read() == b.read(), n
    # It reads no checkpoint and needs a preset; an unknown preset is exit 3 as elsewhere.
    p = run([CONVERT, "--print-layout"], expect=2)
    assert "--print-layout needs --preset NAME" in p.stderr, p.stderr
    p = run([CONVERT, MEGATRON, "--preset", "megatron-gpt", "--print-layout"], expect=2)
    assert "reads no checkpoint: leave out CKPT" in p.stderr, p.stderr
    run([CONVERT, "--preset", "no-such-preset", "--print-layout"], expect=3)
    p = run([CONVERT, "--preset", "megatron-gpt"], expect=2)
    assert "CKPT is required" in p.stderr, p.stderr
    print("ok printlayout")


def case_copyfrom():
    hf = os.path.join(tmp, "hf_model")
    os.makedirs(os.path.join(hf, "subdir"))
    small = {"config.json": '{"model_type": "llama"}', "generation_config.json": "{}",
             "tokenizer.json": "{}", "tokenizer_config.json": "{}", "special_tokens_map.json": "{}",
             "tokenizer.model": "\x00\x01", "vocab.txt": "a\nb\n", "merges.txt": "#v\n", "README.md": "hi"}
    for name, text in small.items():
        open(os.path.join(hf, name), "w").write(text)
    for name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "x.pt",
                 "__0_0.distcp", ".metadata", ".hidden", "subdir/config.json"):
        open(os.path.join(hf, name), "w").write("not copied")
    with open(os.path.join(hf, "big.dat"), "wb") as f:  # sparse, over 64 MiB
        f.truncate((64 << 20) + 1)
    os.symlink("config.json", os.path.join(hf, "config_link.json"))  # inside: fine
    out = os.path.join(tmp, "out")
    p = run([EXPORT, MIXED, out, "--dry-run", "--copy-from", hf])
    assert "copy from" in p.stdout and "config.json" in p.stdout, p.stdout
    assert not os.path.exists(out)
    run([EXPORT, MIXED, out, "--quiet", "--copy-from", hf])
    want = sorted(list(small) + ["config_link.json", "model.safetensors"])
    assert sorted(os.listdir(out)) == want, sorted(os.listdir(out))
    for name, text in small.items():
        assert open(os.path.join(out, name)).read() == text, name
    assert open(os.path.join(out, "model.safetensors"), "rb").read(1) != b"n"  # the export's own
    assert not os.path.islink(os.path.join(out, "config_link.json"))
    # A symlink out of the directory: refused unless --follow-symlinks; nothing written.
    outside = os.path.join(tmp, "outside.json")
    open(outside, "w").write('{"o": 1}')
    os.symlink(outside, os.path.join(hf, "tokenizer_extra.json"))
    out2 = os.path.join(tmp, "out2")
    p = run([EXPORT, MIXED, out2, "--quiet", "--copy-from", hf], expect=3)
    assert p.stderr.startswith("fc-export: error: ") and "tokenizer_extra.json" in p.stderr, p.stderr
    assert "--follow-symlinks" in p.stderr, p.stderr
    assert not os.path.exists(out2)
    run([EXPORT, MIXED, out2, "--quiet", "--copy-from", hf, "--follow-symlinks"])
    assert open(os.path.join(out2, "tokenizer_extra.json")).read() == '{"o": 1}'
    # A missing --copy-from directory: 4, before anything is written.
    out3 = os.path.join(tmp, "out3")
    p = run([EXPORT, MIXED, out3, "--copy-from", os.path.join(tmp, "nope")], expect=4)
    assert "--copy-from" in p.stderr, p.stderr
    assert not os.path.exists(out3)
    # fc-convert creates OUT's parent directories, like fc-export.
    deep = os.path.join(tmp, "a", "b", "c", "out")
    run([CONVERT, MIXED, deep, "--quiet", "--target-like", MIXED])
    run([INSPECT, deep, "--verify"])
    deep = os.path.join(tmp, "x", "y", "out")
    run([EXPORT, MIXED, deep, "--quiet"])
    assert os.path.exists(os.path.join(deep, "model.safetensors"))
    print("ok copyfrom")


def case_dryrunwidth():
    ckpts = sorted(d for d in glob.glob(os.path.join(TESTDATA, "torch_dcp", "*", "ckpt")))
    ckpts += [os.path.join(TESTDATA, "deepspeed", "zero2", "ckpt")]
    assert len(ckpts) >= 4, ckpts
    for ckpt in ckpts:
        runs = [[EXPORT, ckpt, os.path.join(tmp, "o"), "--dry-run", "--max-shard-size", "1k"]]
        if "deepspeed" not in ckpt:
            runs.append([CONVERT, ckpt, "--dry-run", "--target-like", ckpt])
            runs.append([CONVERT, ckpt, "--dry-run", "--preset", "hf-llama", "--tp", "2"])
        for args in runs:
            p = run(args, expect=None)
            if p.returncode != 0:
                assert "convert" in args[0], (args, p.stderr)  # a preset may not fit a fixture
                continue
            for line in p.stdout.splitlines():
                assert len(line) <= 120, (args, len(line), line)
    print("ok dryrunwidth")


def estimate_lines(stdout):
    """The seconds of the "time estimate:" line and the rates of the "rates:" line."""
    lines = stdout.splitlines()
    est = [l for l in lines if l.startswith("time estimate: ")]
    rates = [l for l in lines if l.startswith("rates: read ")]
    assert len(est) == 1 and len(rates) == 1, stdout
    assert all(len(l) <= 120 for l in lines), stdout
    m = re.match(r"time estimate: (?:(\d+) h (\d+) min|(\d+) min (\d+) s|([\d.]+) s|(under) 0.1 s) "
                 r"\(slowest: process (\d+), reads ", est[0])
    assert m, est[0]
    h, hm, mi, ms, sec, under, proc = m.groups()
    seconds = (int(h) * 3600 + int(hm) * 60 if h else int(mi) * 60 + int(ms) if mi
               else float(sec) if sec else 0.0)

    def rate(what):
        r = re.search(what + r" ([\d.]+) (MB|GB)/s", rates[0])
        assert r, (what, rates[0])
        return float(r.group(1)) * (1e6 if r.group(2) == "MB" else 1e9)
    network = rate("network") if "network" in rates[0] else None
    return seconds, int(proc), rate("read"), rate("write"), network, rates[0]


def check_estimate(args):
    """The text's estimate is the plan's bytes over the printed rates, slowest process first."""
    p = run(args)
    seconds, slowest, read, write, network, rates = estimate_lines(p.stdout)
    plan = json.loads(run(args + ["--json"]).stdout)
    plan = plan.get("plan", plan)
    per = [q["bytes_read"] / read + q["bytes_written"] / write +
           ((q["bytes_sent"] + q["bytes_received"]) / network if network else 0)
           for q in plan["per_process"]]
    want = max(per)
    # Printed rates are rounded to 1 MB/s (or 0.1 GB/s), the seconds to 0.1 s.
    assert abs(seconds - want) <= 0.06 + 0.06 * want, (seconds, want, per, rates)
    assert per[slowest] == want, (slowest, per)
    return seconds, plan, rates


def case_dryruntime():
    # The estimate is in every dry-run summary, within 120 columns, and is the plan's bytes
    # over the rates it prints; assumed rates for a small input, which nothing measures.
    _, _, rates = check_estimate([EXPORT, MIXED, os.path.join(tmp, "o"), "--dry-run"])
    assert rates == "rates: read 1.0 GB/s and write 500 MB/s assumed", rates
    check_estimate([CONVERT, MIXED, "--dry-run", "--target-like", MIXED])
    _, plan, rates = check_estimate([CONVERT, MIXED, "--dry-run", "--target-like", MIXED,
                                     "--simulate-processes", "3"])
    assert rates == "rates: read 1.0 GB/s, write 500 MB/s and network 1.0 GB/s assumed", rates
    # A 48 MB input: its read rate is measured on the file read most (each run measures
    # anew, so two runs compare through the formula checked above, which grows with the bytes;
    # tests/ops/time_estimate_test.cc checks that monotonicity on random plans).
    src = os.path.join(tmp, "big")
    run([os.path.join(BUILD, "bench", "make_synthetic_ckpt"), src, "48000000", "2", "256"])
    estimates = []
    for flags in (["--include", "layers.0.*"], []):
        seconds, plan, rates = check_estimate([EXPORT, src, os.path.join(tmp, "o"), "--dry-run",
                                               *flags])
        assert re.match(r"rates: read \S+ [MG]B/s \(measured: \d+(\.\d)? MiB of \S+\.distcp in "
                        r"[\d.]+ s\), write 500 MB/s assumed$", rates), rates
        estimates.append((plan["bytes_needed"], seconds))
    assert estimates[0][0] < estimates[1][0], estimates
    print("ok dryruntime", estimates)


fcio.run_case(globals(), CASE, tmp)
