"""fc-export, fc-convert and fc-inspect on the torch 2.x DCP variants (issue 13), compared
bit-exactly with the same tools on the plain torch 1.13 save they were made from
(testdata/gen/torch2/make_torch2.py: rank_local, zstd, details, safetensors <- mixed), and
the refusals (big-endian items, unknown transforms, conflicting rank files).

usage: torch_dcp2_cli_test.py BUILD_ROOT TESTDATA
"""
import io
import os
import shutil
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import fcio  # noqa: E402

BUILD, TESTDATA = sys.argv[1], sys.argv[2]
EXPORT, CONVERT, INSPECT = fcio.tools(BUILD, "fc-export", "fc-convert", "fc-inspect")
DCP = os.path.join(TESTDATA, "torch_dcp")
tmp = tempfile.mkdtemp(prefix="fc-torch2-cli-")


run = fcio.run


def export(ckpt, name):
    out = os.path.join(tmp, name)
    run([EXPORT, ckpt, out, "--quiet", "--objects", out + ".objects"])
    return out


plain = export(os.path.join(DCP, "mixed", "ckpt"), "plain")
for variant in ("rank_local", "zstd", "details", "safetensors"):
    ckpt = os.path.join(DCP, variant, "ckpt")
    got = export(ckpt, variant)
    fcio.same_tree(plain, got, variant + " export")
    if variant == "details":  # re-archived with the recent records: same data.pkl
        for name in os.listdir(plain + ".objects"):
            pkl = [zipfile.ZipFile(os.path.join(d, name)).read("archive/data.pkl")
                   for d in (plain + ".objects", got + ".objects")]
            assert pkl[0] == pkl[1], (variant, name)
    else:
        fcio.same_tree(plain + ".objects", got + ".objects", variant + " objects")
    run([INSPECT, ckpt, "--verify"])
    # fc-convert to fc distcp and to torch DCP (2), exported again: the same bytes.
    for fmt in ("fc", "torch-dcp"):
        conv = os.path.join(tmp, f"{variant}-{fmt}")
        run([CONVERT, ckpt, conv, "--quiet", "--output-format", fmt,
             "--target-like", os.path.join(DCP, "mixed", "ckpt")])
        fcio.same_tree(plain, export(conv, f"{variant}-{fmt}-export"), f"{variant} via {fmt}")
    print("ok", variant)

# fc-convert --torch-serialization safetensors (torch ~2.8's SAFETENSORS form) reads back
# to the same export; torch 1.13 has no such form (exit 3).
st_out = os.path.join(tmp, "to-safetensors")
run([CONVERT, os.path.join(DCP, "mixed", "ckpt"), st_out, "--quiet", "--output-format", "torch-dcp",
     "--torch-version", "2", "--torch-serialization", "safetensors",
     "--target-like", os.path.join(DCP, "mixed", "ckpt")])
got = export(st_out, "to-safetensors-export")
fcio.same_tree(plain, got, "safetensors serialization")
fcio.same_tree(plain + ".objects", got + ".objects", "safetensors serialization objects")
run([INSPECT, st_out, "--verify"])
first = open(os.path.join(st_out, "__1_0.distcp"), "rb").read()
assert b'"DCP_SHARDING_INFO":"{\\"grid\\": {\\"saved_offsets\\": [0, 3]}' in first, first[:200]
run([CONVERT, os.path.join(DCP, "mixed", "ckpt"), os.path.join(tmp, "st113"), "--quiet",
     "--output-format", "torch-dcp", "--torch-version", "1.13", "--torch-serialization", "safetensors",
     "--target-like", os.path.join(DCP, "mixed", "ckpt")], expect=3)
print("ok safetensors serialization output")


# fc-convert --output-format torch-dcp --torch-version 2 writes what torch 2.4+'s
# FileSystemWriter writes (formats.md 2.2, 2.5; filesystem.py at main): Metadata fields in
# dataclass order with storage_meta = StorageMeta(checkpoint_id=pathlib.PosixPath(OUT),
# save_id=str(uuid4()), load_id=None, modules=[]) and version "1.0.0". --torch-version 2.0
# (torch 2.0-2.3) writes the three original fields, TensorProperties from its 2.0-2.2 home.
# Decoded with pickle and stand-in classes (no torch needed): each class global becomes a
# recording class named after its module and name, as testdata/gen/torch2 stands them in.
class StandIn:
    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)  # what BUILD does for a dataclass: key order kept
        else:
            self.state = state  # TensorProperties.__getstate__: a 5-tuple


def stand_in_loads(raw):
    import pathlib
    import pickle
    classes = {}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("pathlib", "PosixPath"):
                return pathlib.PosixPath
            if module == "torch" and name == "Size":
                return lambda dims: tuple(dims)
            if module == "torch":
                return "torch." + name  # dtypes
            if (module, name) == ("torch.serialization", "_get_layout"):
                return lambda layout: layout
            if name.endswith("MEM_FORMAT_ENCODING"):
                return lambda v: (module + "." + name, v)
            key = (module, name)
            if key not in classes:
                classes[key] = type(name, (StandIn,), {"__module__": module})
            return classes[key]
    return Unpickler(io.BytesIO(raw)).load()


def check_v2_metadata():
    import json
    import pathlib
    import pickletools
    import uuid

    src = os.path.join(DCP, "mixed", "ckpt")
    for version, fields in (("2", ["state_dict_metadata", "planner_data", "storage_data",
                                   "storage_meta", "version"]),
                            ("2.0", ["state_dict_metadata", "planner_data", "storage_data"])):
        out = os.path.join(tmp, "v" + version)
        run([CONVERT, src, out, "--quiet", "--output-format", "torch-dcp", "--torch-version",
             version, "--target-like", src])
        raw = open(os.path.join(out, ".metadata"), "rb").read()
        # Class references, following the memo (a module string is memoized once).
        globals_, memo, pushed = set(), [], []
        for op, arg, _ in pickletools.genops(raw):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE"):
                pushed.append(arg)
            elif op.name in ("BINGET", "LONG_BINGET"):
                pushed.append(memo[arg])
            elif op.name == "MEMOIZE":
                memo.append(pushed[-1])
            elif op.name == "STACK_GLOBAL":
                globals_.add((pushed[-2], pushed[-1]))
                pushed.append(None)
            elif op.name == "GLOBAL":
                globals_.add(tuple(arg.split(" ", 1)))
                pushed.append(None)
            else:
                pushed.append(None)
        md = stand_in_loads(raw)
        MD = "torch.distributed.checkpoint.metadata"
        cls = lambda v: (type(v).__module__, type(v).__name__)  # noqa: E731
        assert cls(md) == (MD, "Metadata"), cls(md)
        assert list(md.__dict__) == fields, (version, list(md.__dict__))
        assert md.planner_data == {k: (k,) for k in md.state_dict_metadata}, md.planner_data
        for k, v in md.storage_data.items():
            assert cls(k) == (MD, "MetadataIndex"), cls(k)
            assert cls(v) == ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), cls(v)
            assert list(v.__dict__) == ["relative_path", "offset", "length"], v.__dict__
        want = {t["key"]: "torch." + t["dtype"] for t in
                json.loads(run([INSPECT, src, "--json"]).stdout)["tensors"]}
        got = {k: m.properties for k, m in md.state_dict_metadata.items()
               if cls(m) == (MD, "TensorStorageMetadata")}
        assert {k: p.state[0] for k, p in got.items()} == want, (got, want)
        props = list(got.values())
        assert all(p.state[1:3] == ("torch.strided", False) and p.state[4] is False
                   for p in props), [p.state for p in props]
        if version == "2":
            assert all(cls(p) == (MD, "TensorProperties") for p in props)
            assert all(p.state[3] == (MD + "._MEM_FORMAT_ENCODING", 0) for p in props)
            sm = md.storage_meta
            assert cls(sm) == (MD, "StorageMeta"), cls(sm)
            assert list(sm.__dict__) == ["checkpoint_id", "save_id", "load_id", "modules"], sm
            assert type(sm.checkpoint_id) is pathlib.PosixPath, type(sm.checkpoint_id)
            assert sm.checkpoint_id == pathlib.PosixPath(out), sm.checkpoint_id
            assert str(uuid.UUID(sm.save_id)) == sm.save_id and uuid.UUID(sm.save_id).version == 4
            assert sm.load_id is None and sm.modules == [], sm
            assert md.version == "1.0.0", md.version
            assert (MD, "StorageMeta") in globals_ and ("pathlib", "PosixPath") in globals_
            assert (MD, "TensorProperties") in globals_, globals_
        else:
            old = "torch.distributed._shard.sharded_tensor.metadata"
            assert all(cls(p) == (old, "TensorProperties") for p in props), props
            assert all(p.state[3] == (old + ".MEM_FORMAT_ENCODING", 0) for p in props)
            assert not any(name == "StorageMeta" for _, name in globals_), globals_
            assert ("torch.distributed._shard.sharded_tensor.metadata",
                    "MEM_FORMAT_ENCODING") in globals_, globals_
        assert all(mod.startswith(("torch.distributed.checkpoint.", "torch.distributed._shard."
                                   "sharded_tensor.", "torch", "pathlib"))
                   for mod, _ in globals_), globals_
        fcio.same_tree(plain, export(out, "v" + version + "-export"), "torch-version " + version)
    print("ok torch-version 2 / 2.0 metadata")


check_v2_metadata()

# fc-inspect --json marks the compressed items with their stored range.
import json  # noqa: E402
doc = json.loads(run([INSPECT, os.path.join(DCP, "zstd", "ckpt"), "--json"]).stdout)
for t in doc["tensors"]:
    for c in t["chunks"]:
        e = c["encoded_item"]
        assert e["codec"] == "zstd" and e["length"] > 0, c
for o in doc["objects"]:
    assert o["encoded_item"]["codec"] == "zstd" and o["byte_length"] == 431, o
plain_doc = json.loads(run([INSPECT, os.path.join(DCP, "mixed", "ckpt"), "--json"]).stdout)
assert all("encoded_item" not in c for t in plain_doc["tensors"] for c in t["chunks"])

# Refusals: exit 6 (unsupported) naming the cause, exit 5 for conflicting rank files.
p = run([EXPORT, os.path.join(TESTDATA, "torch_dcp_refused", "big_endian", "ckpt"),
         os.path.join(tmp, "be"), "--quiet"], expect=6)
assert "big-endian" in p.stderr, p.stderr

odd = os.path.join(tmp, "odd_transform")
shutil.copytree(os.path.join(DCP, "zstd", "ckpt"), odd)
md = open(os.path.join(odd, ".metadata"), "rb").read()
assert md.count(b"stream.zstd/1") >= 1
open(os.path.join(odd, ".metadata"), "wb").write(md.replace(b"stream.zstd/1", b"stream.zstx/1"))
p = run([EXPORT, odd, os.path.join(tmp, "odd"), "--quiet"], expect=6)
assert "transform 'stream.zstx/1' is not supported" in p.stderr, p.stderr
p = run([INSPECT, odd], expect=6)

# A zstd item overwritten in place by a decompression bomb of the same length (RLE blocks
# of 128 KiB, far more than the chunk's bytes + 64 KiB): exit 5 naming file, tensor and the
# cap, without decoding (or holding) the claimed size.
import resource  # noqa: E402
bomb_dir = os.path.join(tmp, "bomb")
shutil.copytree(os.path.join(DCP, "zstd", "ckpt"), bomb_dir)
md = stand_in_loads(open(os.path.join(bomb_dir, ".metadata"), "rb").read())
info = next(v for k, v in md.storage_data.items() if k.fqn == "grid")
L = info.length
k = (L - 9) // 4
assert k >= 1, L
frame = (0xFD2FB528).to_bytes(4, "little") + bytes([0, 7 << 3])
for _ in range(k):
    frame += ((128 * 1024 << 3) | (1 << 1)).to_bytes(3, "little") + b"\x42"  # RLE, not last
r = L - len(frame) - 3
frame += ((r << 3) | 1).to_bytes(3, "little") + b"\x00" * r  # raw, last
assert len(frame) == L
with open(os.path.join(bomb_dir, info.relative_path), "r+b") as f:
    f.seek(info.offset)
    f.write(frame)
p = run([EXPORT, bomb_dir, os.path.join(tmp, "bomb-out"), "--quiet"], expect=5)
assert "tensor 'grid'" in p.stderr and info.relative_path in p.stderr, p.stderr
assert "decodes to more than" in p.stderr and "tensor bytes" in p.stderr, p.stderr
assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 512 * 1024, "child RSS"
print("ok zstd bomb")

conflict = os.path.join(tmp, "conflict")
shutil.copytree(os.path.join(DCP, "rank_local", "ckpt"), conflict)
md = open(os.path.join(conflict, "__2.metadata"), "rb").read()
assert b"float32" in md
open(os.path.join(conflict, "__2.metadata"), "wb").write(md.replace(b"float32", b"float16"))
p = run([INSPECT, conflict], expect=5)
assert "__0.metadata says float32" in p.stderr and "__2.metadata says float16" in p.stderr, p.stderr
print("ok refusals")
shutil.rmtree(tmp, ignore_errors=True)
