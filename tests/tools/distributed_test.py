"""The distributed data path end to end, under mpirun (issue 10): a checkpoint whose files are
spread over per-process directories (`{rank}` in the input path, as node-local disks would
hold them) converts and exports to the same bytes as one process on the whole directory;
--stats shows every needed byte read once, by one process, with checksums verified (the
default) exactly as many bytes as without, and as many bytes received as sent; a shared
directory gives the same bytes with balanced reads; a file on no process's disk and a killed
process fail cleanly.

usage: distributed_test.py BUILD_ROOT TESTDATA CASE   (CASE: split|shared|errors)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
EXPORT, CONVERT, INSPECT = fcio.tools(BUILD, "fc-export", "fc-convert", "fc-inspect")
MAKE = os.path.join(BUILD, "bench", "make_synthetic_ckpt")
MPIRUN = shutil.which("mpirun")
if not MPIRUN:
    print("skipping: no mpirun")
    sys.exit(77)
MPI = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np"]
MiB = 1 << 20
tmp = tempfile.mkdtemp(prefix="fc-dist-test-")


def source():
    """A TP-8 fc distcp checkpoint of about 4 MB (8 data files) and a target layout over 3
    ranks that cuts every tensor into uneven row blocks (every target needs every source rank)."""
    src = os.path.join(tmp, "src")
    fcio.run([MAKE, src, str(4 * MiB), "8", "256"])
    info = json.loads(fcio.run([INSPECT, src, "--json"]).stdout)
    ranks = [{"rank": r, "chunks": []} for r in range(3)]
    for t in info["tensors"]:
        shape = t["global_shape"]
        cuts = [0, shape[0] // 3, shape[0] - shape[0] // 4, shape[0]]
        for r in range(3):
            ranks[r]["chunks"].append({"key": t["key"], "global_offset": [cuts[r]] + [0] * (len(shape) - 1),
                                       "local_shape": [cuts[r + 1] - cuts[r]] + shape[1:],
                                       "flattened_range": None, "replica_id": 0})
    manifest = {"format": "fc-layout-manifest", "version": 1, "tensors": [{"key": t["key"], "dtype": t["dtype"], "global_shape": t["global_shape"]}
                            for t in info["tensors"]], "ranks": ranks}
    layout = os.path.join(tmp, "rows3.json")
    json.dump(manifest, open(layout, "w"))
    return src, layout


def split(src, np_, name="split"):
    """src's files over per-process directories split-R/ckpt_{r}: data file k on process
    k % np_, the metadata on process 0 only. Returns the input pattern."""
    base = os.path.join(tmp, f"{name}-{np_}")
    for r in range(np_):
        os.makedirs(os.path.join(base, f"ckpt_{r}"))
    data = sorted(f for f in os.listdir(src) if f.endswith(".distcp"))
    for k, f in enumerate(data):
        shutil.copy(os.path.join(src, f), os.path.join(base, f"ckpt_{k % np_}", f))
    for f in os.listdir(src):
        if not f.endswith(".distcp"):
            shutil.copy(os.path.join(src, f), os.path.join(base, "ckpt_0", f))
    return os.path.join(base, "ckpt_{rank}")


def stats(path):
    with open(path) as f:
        return json.load(f)


def check_stats(s, label, moved):
    read = sum(p["bytes_read"] for p in s["processes"])
    sent = sum(p["bytes_sent"] for p in s["processes"])
    received = sum(p["bytes_received"] for p in s["processes"])
    needed = s["bytes_needed"]
    assert sent == received, f"{label}: sent {sent} != received {received}"
    if moved:
        assert sent > 0, f"{label}: nothing moved between processes"
    # Every needed byte read once; metadata reads on top (fc.metadata.json, 57 KB here, read
    # by one process, plus each process's look at its files): at most 128 KiB per process.
    assert needed <= read <= needed + 128 * 1024 * len(s["processes"]), \
        f"{label}: read {read} for {needed} needed"
    print(f"ok {label}: read {read} / needed {needed}, sent {sent} = received {received}")
    return s


def read_once(tool, np_, pattern, out, budgets, flags, label, moved):
    """Runs the job with checksums verified (the default) at each budget and once without
    (--no-verify-checksums, the first budget): the outputs are the same bytes, and the
    verified runs read exactly as many bytes as the unverified one (verification rereads
    nothing: each checksummed chunk is read by one process, hashed over that one pass)."""
    runs = [(budgets[0], False)] + [(b, True) for b in budgets]
    unverified = None
    results = []
    for budget, verify in runs:
        o = f"{out}-{budget}-{'v' if verify else 'nv'}"
        st = o + ".stats.json"
        fcio.run([*MPI, str(np_), tool, pattern, o, "--quiet", "--memory-budget", budget,
                  "--stats", st, *([] if verify else ["--no-verify-checksums"]), *flags])
        s = check_stats(stats(st), f"{label} {budget}{'' if verify else ' unverified'}", moved)
        read = sum(p["bytes_read"] for p in s["processes"])
        if unverified is None:
            unverified = read
        else:
            assert read == unverified, \
                f"{label} {budget}: verification read {read - unverified} bytes again ({read} vs {unverified})"
        results.append((o, s))
    return results


def jobs(layout):
    return [("convert", CONVERT, ["--target-manifest", layout]),
            ("export", EXPORT, ["--max-shard-size", "1MB"])]


def case_split():
    src, layout = source()
    for name, tool, flags in jobs(layout):
        single = os.path.join(tmp, f"{name}-single")
        fcio.run([tool, src, single, "--quiet", *flags])
        for np_ in (2, 3, 4):
            pattern = split(src, np_) if name == "convert" else os.path.join(tmp, f"split-{np_}", "ckpt_{rank}")
            # One round, then many rounds.
            for o, _ in read_once(tool, np_, pattern, os.path.join(tmp, f"{name}-{np_}"), ("64MiB", "256KiB"),
                                  flags, f"{name} np {np_} split", moved=True):
                fcio.same_tree(single, o, f"{name} np {np_} {o}")
        # The dry run under mpirun shows the exchange: several rounds with the small budget.
        p = fcio.run([*MPI, "3", tool, os.path.join(tmp, "split-3", "ckpt_{rank}"),
                      os.path.join(tmp, "never"), "--dry-run", "--json", "--memory-budget", "256KiB", *flags])
        plan = json.loads(p.stdout)
        plan = plan.get("plan", plan)
        assert plan["exchange"]["rounds"] > 1, plan["exchange"]
        assert plan["exchange"]["rounds"] >= plan["exchange"]["rounds_lower_bound"], plan["exchange"]
        assert not os.path.exists(os.path.join(tmp, "never"))
        p = fcio.run([*MPI, "3", tool, os.path.join(tmp, "split-3", "ckpt_{rank}"), "--dry-run",
                      "--memory-budget", "256KiB", *flags] + ([] if name == "convert" else [os.path.join(tmp, "never")]))
        assert "exchange:" in p.stdout and "read balance" in p.stdout, p.stdout
        assert max(len(line) for line in p.stdout.splitlines()) <= 120, p.stdout
    # A ZeRO-flattened source (flat ranges that cut rows) split over processes, back to rows.
    flat = os.path.join(tmp, "flat")
    info = json.loads(fcio.run([INSPECT, src, "--json"]).stdout)
    ranks = [{"rank": r, "chunks": []} for r in range(4)]
    for t in info["tensors"]:
        n = t["global_shape"][0] * t["global_shape"][1]
        cuts = [0, n // 4 + 3, n // 2 + 7, 3 * n // 4 + 1, n]
        for r in range(4):
            ranks[r]["chunks"].append({"key": t["key"], "global_offset": [0, 0],
                                       "local_shape": t["global_shape"],
                                       "flattened_range": [cuts[r], cuts[r + 1]], "replica_id": 0})
    flat_layout = os.path.join(tmp, "flat4.json")
    json.dump({"format": "fc-layout-manifest", "version": 1, "ranks": ranks,
               "tensors": [{"key": t["key"], "dtype": t["dtype"], "global_shape": t["global_shape"]}
                           for t in info["tensors"]]}, open(flat_layout, "w"))
    fcio.run([CONVERT, src, flat, "--quiet", "--target-manifest", flat_layout])
    single = os.path.join(tmp, "from-flat-single")
    fcio.run([CONVERT, flat, single, "--quiet", "--target-manifest", layout])
    for o, _ in read_once(CONVERT, 3, split(flat, 3, "flatsplit"), os.path.join(tmp, "from-flat-3"),
                          ("256KiB",), ["--target-manifest", layout], "flat source np 3 split", moved=True):
        fcio.same_tree(single, o, "flat source np 3")
    # torch DCP with non-tensor objects, its .metadata on the last process only: the objects
    # are read where they lie and sent to the writer of target file 0.
    mixed = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
    base = os.path.join(tmp, "mixed-3")
    for r in range(3):
        os.makedirs(os.path.join(base, f"c{r}"))
    for k, f in enumerate(sorted(os.listdir(mixed))):
        dest = 2 if f == ".metadata" else k % 3
        shutil.copy(os.path.join(mixed, f), os.path.join(base, f"c{dest}", f))
    single = os.path.join(tmp, "mixed-single")
    fcio.run([CONVERT, mixed, single, "--quiet", "--target-like", mixed])
    out = os.path.join(tmp, "mixed-np3")
    fcio.run([*MPI, "3", CONVERT, os.path.join(base, "c{rank}"), out, "--quiet", "--target-like", mixed])
    fcio.same_tree(single, out, "torch DCP with objects np 3")
    # fc-export --objects under the same split: each object is read by a process whose disk
    # holds its file and written by process 0; the same files as one process's dump.
    single = os.path.join(tmp, "mixed-export-single")
    fcio.run([EXPORT, mixed, single, "--quiet", "--objects", single + "-objects"])
    out = os.path.join(tmp, "mixed-export-np3")
    fcio.run([*MPI, "3", EXPORT, os.path.join(base, "c{rank}"), out, "--quiet", "--objects", out + "-objects"])
    fcio.same_tree(single, out, "torch DCP export np 3")
    assert os.listdir(single + "-objects"), "the fixture has objects"
    fcio.same_tree(single + "-objects", out + "-objects", "torch DCP export --objects np 3")
    print("ok split")


def case_shared():
    src, layout = source()
    for name, tool, flags in jobs(layout):
        single = os.path.join(tmp, f"{name}-single")
        fcio.run([tool, src, single, "--quiet", *flags])
        for np_ in (2, 3, 4):
            for o, s in read_once(tool, np_, src, os.path.join(tmp, f"{name}-shared-{np_}"), ("64MiB",),
                                  flags, f"{name} np {np_} shared", moved=False):
                fcio.same_tree(single, o, f"{name} shared np {np_}")
                reads = [p["bytes_read"] for p in s["processes"]]
                balance = max(reads) * len(reads) / sum(reads)
                # The planner's bound is 1.15 on tensor bytes; metadata (read by one process) on top.
                assert balance <= 1.2, f"{name} np {np_}: read balance {balance:.3f} ({reads})"
                print(f"ok {name} np {np_} shared: read balance {balance:.3f}")
    # Progress without an exchange (TP 8 to TP 8 at np 2: each process writes 4 rank files
    # from 4 source files, nothing moves): process 0's last line counts every process's bytes
    # (4.0 MiB), not only its own half; it is the only process that prints one.
    out = os.path.join(tmp, "progress-np2")
    st = out + ".stats.json"
    p = fcio.run([*MPI, "2", CONVERT, src, out, "--stats", st, "--target-like", src])
    assert sum(q["bytes_sent"] for q in stats(st)["processes"]) == 0, stats(st)
    lines = [line for line in p.stderr.splitlines() if "converting" in line]
    assert lines and all("(all processes)" in line for line in lines), p.stderr
    assert "converting (all processes): 4.0 MiB / 4.0 MiB" in lines[-1] and "done in" in lines[-1], lines
    print("ok progress np 2 without an exchange: " + lines[-1])
    # Other formats on a shared directory (metadata broadcast, files in subdirectories).
    for rel in (("hf_dcp", "sharded_only"), ("deepspeed", "pp2", "ckpt"), ("torch_dcp", "mixed", "ckpt")):
        ckpt = os.path.join(TESTDATA, *rel)
        single, multi = os.path.join(tmp, "-".join(rel) + "-1"), os.path.join(tmp, "-".join(rel) + "-2")
        fcio.run([EXPORT, ckpt, single, "--quiet", "--include-optimizer"])
        fcio.run([*MPI, "2", EXPORT, ckpt, multi, "--quiet", "--include-optimizer"])
        fcio.same_tree(single, multi, "/".join(rel))
        print(f"ok {'/'.join(rel)} np 2 shared")


def case_errors():
    src, layout = source()
    pattern = split(src, 3)
    # A data file on no process's disk: exit 4 naming it, one message, nothing written.
    gone = os.path.join(tmp, "split-3", "ckpt_1", "1_0.distcp")
    os.rename(gone, gone + ".away")
    for name, tool, flags in jobs(layout):
        out = os.path.join(tmp, f"{name}-missing")
        p = fcio.run([*MPI, "3", tool, pattern, out, "--quiet", *flags], expect=4)
        assert "1_0.distcp" in p.stderr and p.stderr.count(f"fc-{name}: error") == 1, p.stderr
        assert not os.path.exists(out) and not [n for n in os.listdir(tmp) if ".fc-tmp-" in n]
    os.rename(gone + ".away", gone)
    # The same file name with two sizes on two disks: refused naming both processes (exit 8).
    clash = os.path.join(tmp, "split-3", "ckpt_2", "1_0.distcp")
    with open(gone, "rb") as f:
        open(clash, "wb").write(f.read() + b"x")
    p = fcio.run([*MPI, "3", CONVERT, pattern, os.path.join(tmp, "clash"), "--quiet",
                  "--target-manifest", layout], expect=8)
    assert "1_0.distcp differs between processes" in p.stderr and "process 1" in p.stderr \
        and "process 2" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "clash"))
    os.remove(clash)
    # OUT that a writing process does not see (issue 32 item 8): each process runs in its
    # own directory and OUT is relative, so the path names another directory on each, as a
    # node-local disk would on each host. Refused at the claim with exit 4 naming the
    # process, its host and process 0's; nothing is left. An export whose one file process 0
    # writes needs no other process to see OUT.
    hosts = os.path.join(tmp, "hosts")
    for r in range(3):
        os.makedirs(os.path.join(hosts, f"host{r}"))
    in_own_dir = 'cd "$HOSTS/host$OMPI_COMM_WORLD_RANK" && exec "$@"'
    local = [*MPI, "3", "-x", "HOSTS=" + hosts, "sh", "-c", in_own_dir, "sh"]
    p = fcio.run([*local, CONVERT, pattern, "out", "--quiet", "--target-manifest", layout],
                 expect=4)
    assert "does not see out.fc-tmp-" in p.stderr and "on host " in p.stderr and \
        "made next to out on host" in p.stderr and "put OUT on a file system all hosts share" \
        in p.stderr and p.stderr.count("fc-convert: error") == 1, p.stderr
    assert "process 1 on host" in p.stderr or "process 2 on host" in p.stderr, p.stderr
    for r in range(3):
        assert os.listdir(os.path.join(hosts, f"host{r}")) == [], (r, os.listdir(hosts))
    fcio.run([*local, EXPORT, pattern, "out", "--quiet"])
    assert os.listdir(os.path.join(hosts, "host0", "out")) == ["model.safetensors"]
    # --target-like on process 0's host only: read there once and sent to the others; the
    # output is the one a single process writes.
    shutil.copytree(src, os.path.join(hosts, "host0", "like"))
    liked = os.path.join(tmp, "liked")
    fcio.run([*local, CONVERT, pattern, liked, "--quiet", "--target-like", "like"])
    one = os.path.join(tmp, "liked-one")
    fcio.run([CONVERT, src, one, "--quiet", "--target-like", src])
    for d in (liked, one):
        fcio.run([EXPORT, d, d + "-hf", "--quiet"])
    assert open(liked + "-hf/model.safetensors", "rb").read() == \
        open(one + "-hf/model.safetensors", "rb").read()
    # --simulate-processes: only with --dry-run (usage, exit 2), and not under mpirun (exit 3).
    p = fcio.run([CONVERT, src, os.path.join(tmp, "sim"), "--simulate-processes", "4",
                  "--target-manifest", layout], expect=2)
    assert "--simulate-processes needs --dry-run" in p.stderr, p.stderr
    p = fcio.run([*MPI, "2", CONVERT, src, "--dry-run", "--simulate-processes", "4",
                  "--target-manifest", layout], expect=3)
    assert "not under mpirun" in p.stderr and p.stderr.count("fc-convert: error") == 1, p.stderr
    p = fcio.run([CONVERT, src, "--dry-run", "--simulate-processes", "4", "--target-manifest", layout])
    assert "exchange:" in p.stdout and "read balance" in p.stdout, p.stdout
    # A process killed mid-run (SIGKILL, rank 1, as soon as the staging directory exists,
    # that is, while the processes read and exchange): every process ends, mpirun fails, OUT
    # does not appear; the next run on OUT succeeds.
    out = os.path.join(tmp, "killed")
    big = os.path.join(tmp, "big")
    fcio.run([MAKE, big, str(48 * MiB), "8", "512"])
    bigpattern = split(big, 3, "bigsplit")
    killer = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (while ! ls -d "$OUT".fc-tmp-* '
              '>/dev/null 2>&1; do sleep 0.01; done; kill -KILL $$) & fi; exec "$@"')
    cmd = [*MPI, "3", "-x", "OUT=" + out, "sh", "-c", killer, "sh", CONVERT, bigpattern, out,
           "--quiet", "--memory-budget", "64KiB", "--threads", "1", "--target-like", big]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0, "the killed run reported success (it ran in under a second?)"
    assert not os.path.exists(out), os.listdir(out)
    fcio.run([*MPI, "3", CONVERT, bigpattern, out, "--quiet", "--target-like", big])
    assert not [n for n in os.listdir(tmp) if ".fc-tmp-" in n], os.listdir(tmp)
    fcio.run([INSPECT, out, "--verify"])
    print("ok errors")


if __name__ == "__main__":  # gpu_test.py imports the helpers above
    try:
        {"split": case_split, "shared": case_shared, "errors": case_errors}[CASE]()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
