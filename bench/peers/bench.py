"""The timing loop of bench/peers.sh (system python3, stdlib only; see peers.sh's header).

usage: python3 bench/peers/bench.py --dir BENCH_DIR --size SIZE --runs RUNS --build BUILD
                                    [--pairs p1,p2,...] [--cold auto|yes|no]

First every pair warm, then every pair cold (where the page cache can be dropped: the cold
runs come last so that no drop falls between warm runs; before the warm phase the
interpreters' libraries are imported once, untimed). Per pair and cache state, RUNS rounds; in each round every peer variant and fc run once, the order rotating by round
(on this kind of VM the second of two back-to-back multi-GB writes waits for the first's
write-back; rotating spreads that over every tool). Warm: the source files are read once
(cat > /dev/null) before each run. Cold: sync + echo 3 > /proc/sys/vm/drop_caches before
each run, then the tool's own code read back into the cache (untimed: `fc-export --help`, or
the peer's interpreter importing its libraries, about 1.2 GB of torch + DeepSpeed files),
so that cold measures the input coming off the disk, not the loading of the tools. Each run goes through measure.py; its output is deleted (and synced) after it,
except in the first warm round, where every peer's output is compared with fc's by
compare.py (interop env's python) before it is deleted. Beside the tools, in the same
rotation, two disk rows: `dd if=/dev/zero bs=4M oflag=direct conv=fsync` of fc's output byte
count (the durable write limit; direct as fc's large writes are, fc/io/env.h, and on this kind
of VM faster than a buffered dd with one final fsync: 4 GiB in 2.7-3.3 s against 8.9-9.1 s)
and, cold only, `cat` of the input files (the sequential read limit; for the 10 GB ZeRO-2
input one `dd iflag=direct bs=16M` stream took 5.9-8.2 s at 17:00 UTC on 2026-12-07, cat
4.2-6.3 s earlier that day);
the slower (the read's time scaled to the share of the source fc reads) is the floor, and peer
time / floor the largest ratio any converter could show (their sum, what reading and then
writing takes, is printed beside it). Results: BENCH_DIR/peers-SIZEg.json
(peers-SIZEg-PAIR+PAIR.json for a subset)
and a table on stdout.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_PY = os.path.expanduser("~/.cache/fc-interop/torch/bin/python")
PADDLE_PY = os.path.expanduser("~/.cache/fc-interop/paddle/bin/python")


def pairs(d, size, build):
    fx = lambda n: os.path.join(build, "tools", n)  # noqa: E731
    z2, z3 = f"{d}/peers-ds-zero2-{size}g", f"{d}/peers-ds-zero3-{size}g"
    dcp_src, pd = f"{d}/peers-dcp-{size}g", f"{d}/peers-paddle-{size}g"
    layout = f"{d}/peers-one-rank.json"
    with open(layout, "w") as f:
        json.dump({"degrees": {}}, f)
    z2f = [TORCH_PY, "-m", "deepspeed.utils.zero_to_fp32"]
    d2u = [TORCH_PY, "-m", "deepspeed.checkpoint.ds_to_universal", "--inject_missing_state"]
    tp = [TORCH_PY, "-W", "ignore", os.path.join(HERE, "torch_peer.py")]
    # name: (source, [(peer label, argv(src, out))], fc argv(src, out, stats), compare kind,
    #        {peer label: compare kind} overrides, where the outputs go)
    return {
        "ds-zero2-fp32": (z2, [("zero_to_fp32 --safe_serialization",
                                lambda s, o: z2f + [s, o, "--safe_serialization"])],
                          lambda s, o, st: [fx("fc-export"), s, o, "--quiet", "--stats", st],
                          "st", {}),
        "ds-zero3-fp32": (z3, [("zero_to_fp32 --safe_serialization",
                                lambda s, o: z2f + [s, o, "--safe_serialization"])],
                          lambda s, o, st: [fx("fc-export"), s, o, "--quiet", "--stats", st],
                          "st", {}),
        "ds-zero2-ucp": (z2 + "/global_step1", [
            ("ds_to_universal (4 extract, 2 merge workers)",
             lambda s, o: d2u + ["--input_folder", s, "--output_folder", o]),
            ("ds_to_universal --num_extract_workers 2 --num_merge_workers 2",
             lambda s, o: d2u + ["--input_folder", s, "--output_folder", o,
                                 "--num_extract_workers", "2", "--num_merge_workers", "2"])],
            lambda s, o, st: [fx("fc-convert"), s, o, "--output-format", "ucp", "--quiet",
                              "--stats", st],
            "ucp", {}),
        "dcp-export": (dcp_src, [
            ("dcp_to_torch_save (.pt)", lambda s, o: tp + ["to-pt", s, o]),
            ("dcp_to_torch_save + safetensors save_file",
             lambda s, o: tp + ["to-safetensors", s, o])],
            lambda s, o, st: [fx("fc-export"), s, o, "--include-optimizer", "--quiet",
                              "--stats", st],
            "st", {"dcp_to_torch_save (.pt)": "pt"}),
        "dcp-reshard": (dcp_src, [("dcp.load + dcp.save (1 process)",
                                   lambda s, o: tp + ["reshard", s, o])],
                        lambda s, o, st: [fx("fc-convert"), s, o, "--target-layout", layout,
                                          "--output-format", "torch-dcp", "--torch-version",
                                          "2", "--quiet", "--stats", st],
                        "dcp", {}),
        "paddle-merge": (pd, [("merge_sharded_state_dict",
                               lambda s, o: [PADDLE_PY, os.path.join(HERE, "make_paddle.py"),
                                             "--merge", s, o])],
                         lambda s, o, st: [fx("fc-export"), s, o, "--include-optimizer",
                                           "--quiet", "--stats", st],
                         "st", {}),
    }


def src_files(src):
    root = src
    if os.path.basename(src).startswith("global_step"):
        root = os.path.dirname(src)
    return [p for p in glob.glob(os.path.join(root, "**"), recursive=True)
            + glob.glob(os.path.join(root, "**", ".*"), recursive=True) if os.path.isfile(p)]


# The disk's limits, measured in the same rounds as the tools (rotating with them): the
# durable write of fc's output byte count, and (cold only) the sequential read of the input.
# The slower of the two is the floor no converter can beat; peer time / floor is the
# largest peer/fc ratio this disk allows.
DD, CAT = "disk: dd write (direct)", "disk: cat read"
DISK = [(DD, None), (CAT, None)]


def disk_argv(label, src, out, out_bytes):
    if label == DD:
        count = max(1, -(-out_bytes // (4 << 20)))
        return ["dd", "if=/dev/zero", f"of={out}.dd", "bs=4M", f"count={count}",
                "oflag=direct", "conv=fsync", "status=none"]
    return ["bash", "-c", 'cat "$@" > /dev/null', "cat"] + sorted(src_files(src))


def src_bytes(src):
    return sum(os.path.getsize(p) for p in src_files(src))


def warm(src):
    for p in src_files(src):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def code_warmup(cmd):
    """An untimed command that reads the tool's code (binary, or the interpreter and the
    libraries its peer imports) into the page cache, and none of the input."""
    if cmd[0] == TORCH_PY:
        return [TORCH_PY, "-c", "import deepspeed, safetensors.torch, "
                "torch.distributed.checkpoint.format_utils"]
    if cmd[0] == PADDLE_PY:
        return [PADDLE_PY, "-c", "import paddle.distributed.flex_checkpoint.dcp.load_state_dict"]
    return [cmd[0], "--help"]


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def rm(path):
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def measure(argv, res_path, env):
    p = subprocess.run([sys.executable, os.path.join(HERE, "measure.py"), res_path, "--"]
                       + argv, env=env, capture_output=True, text=True)
    r = json.load(open(res_path))
    if r["exit"] != 0:
        r["error"] = (p.stdout + p.stderr)[-3000:]
    return r


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", required=True)
    ap.add_argument("--pairs", default="")
    ap.add_argument("--cold", default="auto", choices=["auto", "yes", "no"])
    a = ap.parse_args()
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore")
    all_pairs = pairs(a.dir, a.size, a.build)
    chosen = [p for p in (a.pairs.split(",") if a.pairs else all_pairs) if p]
    can_drop = drop_caches() if a.cold != "no" else False
    if a.cold == "yes" and not can_drop:
        sys.exit("--cold yes: cannot write /proc/sys/vm/drop_caches here")
    states = ["warm"] + (["cold"] if can_drop else [])
    print(f"page cache: {'dropped before each cold run (sync; echo 3 > /proc/sys/vm/drop_caches)' if can_drop else 'CANNOT be dropped here (or --cold no): warm cache only'}",
          flush=True)
    work = os.path.join(a.dir, "peers-out")
    results = {"size": a.size, "runs": a.runs, "states": states, "pairs": {},
               "date": time.strftime("%Y-%m-%d %H:%M"), "nproc": os.cpu_count(),
               "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30}
    failed = []
    ready = {}
    for name in chosen:
        src, peers, fc_argv, kind, kinds = all_pairs[name]
        if not os.path.exists(src):
            print(f"{name}: SKIPPED, no source {src}", flush=True)
            results["pairs"][name] = {"skipped": f"no source {src}"}
            continue
        ready[name] = [("fc", None)] + peers + DISK
        results["pairs"][name] = {"source": src, "source_bytes": src_bytes(src), "tools": {}}
    for state in states:
        if state == "warm":  # the interpreters' libraries into the page cache, untimed
            subprocess.run([TORCH_PY, "-c", "import deepspeed, safetensors.torch, "
                            "torch.distributed.checkpoint"], env=env, capture_output=True)
            if os.path.exists(PADDLE_PY) and "paddle-merge" in ready:
                subprocess.run([PADDLE_PY, "-c", "import paddle.distributed"], env=env,
                               capture_output=True)
        for name, tools in ready.items():
            src, peers, fc_argv, kind, kinds = all_pairs[name]
            pr = results["pairs"][name]
            print(f"== {name} {state}: {src} ({pr['source_bytes'] / 1e9:.2f} GB), load "
                  f"{open('/proc/loadavg').read().split()[0]}", flush=True)
            for rnd in range(a.runs):
                order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
                outs = {}
                for label, argv in order:
                    if label == CAT and state == "warm":
                        continue  # a read from the page cache is no limit
                    out = os.path.join(work, label.split()[0].replace("/", "_") + "-"
                                       + str(tools.index((label, argv))), "out")
                    rm(os.path.dirname(out))
                    os.makedirs(os.path.dirname(out))
                    stats = os.path.join(work, "stats.json")
                    if label in (DD, CAT):
                        fc_out = [r["out_bytes"] for rs in pr["tools"]["fc"].values()
                                  for r in rs if r["exit"] == 0]
                        if not fc_out:
                            continue  # fc has not written yet: nothing to size dd by
                        cmd = disk_argv(label, src, out, fc_out[0])
                    elif label == "fc":
                        cmd = fc_argv(src, out, stats)
                    else:
                        cmd = argv(src, out)
                    if state == "warm":
                        warm(src)
                    else:  # the input cold; the tool's own code read back in, untimed
                        drop_caches()
                        subprocess.run(code_warmup(cmd), env=env, capture_output=True)
                    load = float(open("/proc/loadavg").read().split()[0])
                    r = measure(cmd, os.path.join(work, "measure.json"), env)
                    r["load1_before"] = load
                    if label == "fc" and r["exit"] == 0:
                        s = json.load(open(stats))
                        r["fc_bytes_read"] = sum(p["bytes_read"] for p in s["processes"])
                        r["fc_bytes_needed"] = s.get("bytes_needed")
                        r["fc_stats"] = s
                    r["out_bytes"] = sum(os.path.getsize(p) for p in glob.glob(
                        os.path.join(out, "**"), recursive=True) if os.path.isfile(p))
                    if label == DD and os.path.exists(out + ".dd"):
                        r["out_bytes"] = os.path.getsize(out + ".dd")
                    pr["tools"].setdefault(label, {}).setdefault(state, []).append(r)
                    print(f"  {state} round {rnd + 1} {label}: {r['wall_sync_s']:.2f} s "
                          f"(exit {r['exit']}), tree RSS {r['tree_rss_kib'] / 1024:.0f} MiB, "
                          f"rchar {r['rchar'] / 1e9:.3f} GB, read_bytes "
                          f"{r['read_bytes'] / 1e9:.3f} GB", flush=True)
                    if r["exit"] != 0:
                        print("    FAILED:\n" + r["error"], flush=True)
                        failed.append(f"{name}: {label}: exit {r['exit']}")
                    if state == "warm" and rnd == 0 and r["exit"] == 0 and label not in (DD, CAT):
                        outs[label] = out
                    else:
                        rm(os.path.dirname(out))
                if state == "warm" and rnd == 0:
                    pr["compare"] = {}
                    for label, _ in peers:
                        if label not in outs or "fc" not in outs:
                            pr["compare"][label] = "not compared (a run failed)"
                            continue
                        c = subprocess.run([TORCH_PY, os.path.join(HERE, "compare.py"),
                                            kinds.get(label, kind), outs[label], outs["fc"]],
                                           capture_output=True, text=True, env=env)
                        verdict = (c.stdout + c.stderr).strip()
                        pr["compare"][label] = verdict
                        if c.returncode != 0:
                            failed.append(f"{name}: {label} against fc: MISMATCH")
                            print(f"  !!! MISMATCH {label} vs fc:\n{verdict}", flush=True)
                        else:
                            print(f"  check {label} vs fc: {verdict.splitlines()[-1]}",
                                  flush=True)
                    for out in outs.values():
                        rm(os.path.dirname(out))
    subset = "" if not a.pairs else "-" + "+".join(chosen)  # a subset does not overwrite all
    with open(os.path.join(a.dir, f"peers-{a.size}g{subset}.json"), "w") as f:
        json.dump(results, f, indent=1)
    report(results)
    if failed:
        print("\nFAILURES / MISMATCHES:\n  " + "\n  ".join(failed))
        sys.exit(1)


def report(res):
    print(f"\nSIZE {res['size']} GB, {res['runs']} runs, medians; {res['nproc']} cores, "
          f"{res['mem_gib']:.0f} GiB; time = command + sync(2)")
    print("| pair | tool | cache | time s (no sync) | peak RSS MiB (1 proc / tree) | rchar GB |"
          " read_bytes GB | fc --stats read GB | peer/fc time | peer/fc RSS | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, pr in res["pairs"].items():
        if "skipped" in pr:
            print(f"| {name} | skipped: {pr['skipped']} |")
            continue
        for state in res["states"]:
            fc = pr["tools"]["fc"].get(state, [])
            fc_t = median([r["wall_sync_s"] for r in fc])
            fc_rss = median([r["tree_rss_kib"] for r in fc])
            for label, runs in pr["tools"].items():
                rs = [r for r in runs.get(state, []) if r["exit"] == 0]
                if not runs.get(state):
                    continue  # not run in this state (the read row, warm)
                if not rs:
                    print(f"| {name} | {label} | {state} | failed | | | | | | |")
                    continue
                t = median([r["wall_sync_s"] for r in rs])
                t0 = median([r["wall_s"] for r in rs])
                m1 = median([r["maxrss_kib"] for r in rs]) / 1024
                mt = median([r["tree_rss_kib"] for r in rs]) / 1024
                rc = median([r["rchar"] for r in rs]) / 1e9
                rb = median([r["read_bytes"] for r in rs]) / 1e9
                st = (f"{median([r['fc_bytes_read'] for r in rs]) / 1e9:.3f}"
                      if label == "fc" else "")
                disk = label in (DD, CAT)
                ratio = ("" if label == "fc" else
                         f"fc at {t / fc_t:.2f} of it" if disk else f"{t / fc_t:.1f}x")
                rss_ratio = "" if label == "fc" or disk else f"{mt * 1024 / fc_rss:.1f}x"
                print(f"| {name} | {label} | {state} | {t:.2f} ({t0:.2f}) | {m1:.0f} / {mt:.0f}"
                      f" | {rc:.3f} | {rb:.3f} | {st} | {ratio} | {rss_ratio} | "
                      f"{median([r['load1_before'] for r in rs]):.1f} |")
            # The read row reads the whole source; fc may need part of it (fp32 weights out of
            # files that hold the moments too): its time scaled to the bytes fc read.
            fc_ok = [r for r in fc if r["exit"] == 0 and r.get("rchar")]
            share = (min(1.0, median([r["rchar"] for r in fc_ok]) / pr["source_bytes"])
                     if fc_ok and pr.get("source_bytes") else 1.0)
            limits = [median([r["wall_sync_s"] * (share if d == CAT else 1.0)
                              for r in pr["tools"].get(d, {}).get(state, [])
                              if r["exit"] == 0]) for d in (DD, CAT)]
            limits = [x for x in limits if x == x]  # drop NaN (not measured)
            if limits:
                # The slower of the two bounds every converter from below (a disk that reads
                # and writes at once at full speed); their sum is what reading everything,
                # then writing it, takes (where reads and writes share one channel, close to
                # the real floor).
                floor = max(limits)
                best = ", ".join(
                    f"{label} {median([r['wall_sync_s'] for r in runs[state] if r['exit'] == 0]) / floor:.1f}x"
                    for label, runs in pr["tools"].items()
                    if label not in ("fc", DD, CAT) and runs.get(state))
                both = (f"; read + write {sum(limits):.2f} s, fc at {sum(limits) / fc_t:.2f} of it"
                        if len(limits) > 1 else "")
                if share < 1.0:
                    print(f"|   | (the read scaled to the {share:.0%} of the source fc "
                          f"reads) |")
                print(f"|   | disk floor {state} | slower {floor:.2f} s, fc at "
                      f"{floor / fc_t:.2f} of it{both}; peer/slower, the most any tool could "
                      f"show: {best} |")
        for label, v in pr.get("compare", {}).items():
            print(f"|   | check: {label} vs fc | {v.splitlines()[-1] if v else ''} |")


if __name__ == "__main__":
    main()
