"""The one helper module of the Python tests (tests/tools, tests/real, tests/format): skipping
when a module is missing, running the fc tools, temporary directories, and independent
readers and comparisons: safetensors via json + numpy (no fc code), .npy via numpy.

Importing it needs only the standard library, so a test can import it first and then skip
(exit 77) through import_or_skip when numpy or a framework is missing; the readers and
comparisons need numpy."""
import contextlib
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # import_or_skip("numpy") skips the test before anything needs it
    np = None

SKIP = 77  # meson's exit code for a skipped test

ST_DTYPES = {} if np is None else {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


def import_or_skip(*names):
    """Imports the modules named, in order, and returns them (one module, or a tuple for
    several); when one cannot be imported, prints "skipping: <why>" and exits 77."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as e:
            print("skipping:", e)
            sys.exit(SKIP)
    return modules[0] if len(modules) == 1 else tuple(modules)


def tools(build, *names):
    """The paths of the fc tools named ("fc-export", ...) in BUILD/tools, in order (one path
    for one name)."""
    paths = tuple(os.path.join(build, "tools", n) for n in names)
    return paths[0] if len(paths) == 1 else paths


@contextlib.contextmanager
def temp_dir(prefix):
    """A fresh directory (tempfile.mkdtemp), removed with its contents, errors ignored, when
    the block ends however it ends."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_case(namespace, case, tmp):
    """Runs namespace["case_" + case]() (a test script's globals() and its CASE argument),
    then removes `tmp`, errors ignored, however it ended."""
    try:
        namespace["case_" + case]()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def snapshot(d):
    """{name: bytes} of the files of directory d (not recursive)."""
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def read_safetensors(path):
    """{name: (dtype string, numpy array)}; bf16/f8 come back as raw bit patterns."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    buf = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(buf[b:e], dtype=ST_DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
    return out


def read_hf_dir(path):
    """Reads model.safetensors or the sharded layout; checks the index's consistency."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(path, "model.safetensors")), None
    index = json.load(open(index_path))
    tensors = {}
    total = 0
    for f in sorted(set(index["weight_map"].values())):
        for name, (dt, arr) in read_safetensors(os.path.join(path, f)).items():
            assert index["weight_map"][name] == f, (name, f)
            tensors[name] = (dt, arr)
            total += arr.nbytes
    assert set(tensors) == set(index["weight_map"]), "index and files disagree"
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    return tensors, index


def expected_values(fixture):
    exp = os.path.join(fixture, "expected")
    return {f[:-4]: np.load(os.path.join(exp, f)) for f in sorted(os.listdir(exp))
            if f.endswith(".npy")}


def bits(a):
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8) if a.ndim else a.reshape(1).view(np.uint8)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).reshape(-1).astype(np.uint32) << 16).view(np.float32)


def same_tensors(got, want, label, subset=False):
    """Asserts that got and want ({name: (safetensors dtype, array)}, as read_safetensors
    gives them) hold the same names (subset: every name of want is in got), dtypes, shapes
    and bytes; the message lists every tensor that differs."""
    missing = sorted(set(want) - set(got))
    extra = [] if subset else sorted(set(got) - set(want))
    assert not missing and not extra, f"{label}: missing {missing}, unexpected {extra}"
    bad = []
    for name, (dt, arr) in want.items():
        gdt, garr = got[name]
        if gdt != dt or garr.shape != arr.shape:
            bad.append(f"{name}: fc {gdt}{list(garr.shape)} vs {dt}{list(arr.shape)}")
        elif bits(garr).tobytes() != bits(arr).tobytes():
            bad.append(f"{name}: values differ (max |d| "
                       f"{np.max(np.abs(garr.astype(np.float64) - arr.astype(np.float64)))})")
    assert not bad, f"{label}:\n  " + "\n  ".join(bad)


def same_values(got, expected, label, subset=False, dtype=None):
    """Asserts that got ({name: (safetensors dtype, array)}, as read_safetensors gives them)
    holds expected's values ({name: numpy array}, as expected_values gives them): the same
    names (subset: every name of expected is in got), shapes and bytes; with dtype, each
    tensor's safetensors dtype is dtype(expected array)."""
    if not subset:
        assert sorted(got) == sorted(expected), (label, sorted(set(got) ^ set(expected)))
    for name, want in expected.items():
        assert name in got, f"{label}: {name} missing from export ({sorted(got)})"
        dt, arr = got[name]
        if dtype is not None:
            assert dt == dtype(want), (label, name, dt)
        assert tuple(arr.shape) == tuple(want.shape), (label, name, arr.shape, want.shape)
        assert np.array_equal(bits(arr), bits(want)), f"{label}: {name} differs"


def same_tree(a, b, label):
    """Asserts that directories a and b hold the same file names with the same bytes."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert fa == fb, (label, fa, fb)
    for f in fa:
        with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
            assert x.read() == y.read(), (label, f)


def run(args, expect=0, limit=None, **kw):
    """Runs args (text output captured; kw goes to subprocess.run), under `timeout LIMIT`
    when a limit (seconds) is given; unless expect is None, fails naming the command and its
    output when the exit code is not `expect`. Returns the CompletedProcess."""
    command = list(args) if limit is None else ["timeout", str(limit), *args]
    p = subprocess.run(command, capture_output=True, text=True, **kw)
    check_exit(p, args, expect)
    return p


def check_exit(p, args, expect):
    """Fails naming args and p's output when p's exit code is not expect (None: any)."""
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{' '.join(map(str, args))}: exit {p.returncode}, expected {expect}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
