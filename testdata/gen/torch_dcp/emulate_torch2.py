#!/usr/bin/env python3
"""Turn a torch 1.13 DCP fixture into one laid out as torch >= 2.6 writes it, for reader
tests of the 2.x pickle variants without a 2.x torch (none is installable here).

What changes (shared/reference/formats.md 2.3-2.6):
  - every class pickles under torch.distributed.checkpoint.{metadata,filesystem};
    TensorProperties lives in ...checkpoint.metadata, the enum is _MEM_FORMAT_ENCODING
    and pickles *by value* (REDUCE(cls, (0,)), CPython >= 3.11.7 behaviour);
  - single_file_per_rank=True: each rank's items are concatenated into __<rank>_0.distcp,
    BYTE_IO items first, and _StorageInfo offsets point inside it;
  - planner_data = {fqn: (fqn,)}, storage_meta = StorageMeta(checkpoint_id=PosixPath as
    CPython 3.13 pickles it (pathlib._local, one string), save_id, load_id, modules),
    version = "1.0.0", and a Megatron-style mcore_data extra attribute.
The data items are the 1.13 torch.save bytes, unchanged (2.x items differ only by an extra
"byteorder" record, which readers ignore).

usage: /usr/bin/python3 emulate_torch2.py SHARED_TOOLS_DIR SRC_FIXTURE OUT_FIXTURE
"""
import dataclasses, enum, os, pickle, re, shutil, sys, types
sys.path.insert(0, sys.argv[1])
import torch113_shim  # noqa: F401
import torch
import torch.distributed._shard.checkpoint  # noqa: F401  (classes for pickle.load)

src, out = sys.argv[2], sys.argv[3]
with open(os.path.join(src, "ckpt", ".metadata"), "rb") as f:
    old = pickle.load(f)


def fake_module(name):
    m = types.ModuleType(name)
    sys.modules[name] = m
    return m


pkg = fake_module("torch.distributed.checkpoint")
md_mod = fake_module("torch.distributed.checkpoint.metadata")
fs_mod = fake_module("torch.distributed.checkpoint.filesystem")
path_mod = fake_module("pathlib._local")


def put(mod, cls):
    cls.__module__ = mod.__name__
    setattr(mod, cls.__name__, cls)
    return cls


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: torch.Size
    sizes: torch.Size


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2

    def __reduce_ex__(self, proto):  # by value, as CPython >= 3.11.7 does
        return self.__class__, (self._value_,)


@dataclasses.dataclass
class TensorProperties:
    dtype: torch.dtype
    layout: torch.layout = torch.strided
    requires_grad: bool = False
    memory_format: object = None
    pin_memory: bool = False

    def __getstate__(self):
        return (self.dtype, self.layout, self.requires_grad,
                _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: torch.Size
    chunks: list


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: object = None
    index: object = dataclasses.field(hash=False, compare=False, default=None)


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None
    save_id: object = None
    load_id: object = None
    modules: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
    storage_meta: object = None
    version: object = None


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int

    def __getstate__(self):  # newer torch drops None-valued fields
        return {k: v for k, v in self.__dict__.items() if v is not None}


class PosixPath:
    def __init__(self, s):
        self.s = s

    def __reduce__(self):  # CPython 3.13: pathlib._local.PosixPath('/full/path')
        return self.__class__, (self.s,)


for c in (ChunkStorageMetadata, _MEM_FORMAT_ENCODING, TensorProperties, TensorStorageMetadata,
          BytesStorageMetadata, MetadataIndex, StorageMeta, Metadata):
    put(md_mod, c)
put(fs_mod, _StorageInfo)
put(path_mod, PosixPath)

# Concatenate each rank's items into __<rank>_0.distcp, BYTE_IO items first.
ckpt_out = os.path.join(out, "ckpt")
shutil.rmtree(out, ignore_errors=True)
os.makedirs(ckpt_out)
shutil.copytree(os.path.join(src, "expected"), os.path.join(out, "expected"))
by_rank = {}
for idx, info in old.storage_data.items():
    rank = int(re.match(r"__(\d+)_\d+\.distcp", info.relative_path).group(1))
    is_bytes = idx.offset is None
    by_rank.setdefault(rank, []).append((not is_bytes, info.relative_path, idx, info))
storage_data = {}
for rank, items in sorted(by_rank.items()):
    name = f"__{rank}_0.distcp"
    with open(os.path.join(ckpt_out, name), "wb") as f:
        for _, _, idx, info in sorted(items, key=lambda x: (x[0], x[1])):
            with open(os.path.join(src, "ckpt", info.relative_path), "rb") as g:
                g.seek(info.offset)
                data = g.read(info.length)
            off = f.tell()
            f.write(data)
            storage_data[MetadataIndex(idx.fqn, idx.offset, idx.index)] = \
                _StorageInfo(name, off, len(data))

sdm = {}
for fqn, m in old.state_dict_metadata.items():
    if hasattr(m, "chunks"):
        sdm[fqn] = TensorStorageMetadata(
            TensorProperties(m.properties.dtype, requires_grad=m.properties.requires_grad),
            m.size, [ChunkStorageMetadata(c.offsets, c.sizes) for c in m.chunks])
    else:
        sdm[fqn] = BytesStorageMetadata()
new = Metadata(
    state_dict_metadata=sdm,
    planner_data={fqn: (fqn,) for fqn in sdm},
    storage_data=storage_data,
    storage_meta=StorageMeta(PosixPath("/ckpt/step_100"), "5f1e1ab0-0000-4000-8000-000000000001",
                             None, []),
    version="1.0.0",
)
new.mcore_data = {"decoder.w": {"nd_reformulated_orig_global_shape": (8, 4)}}
with open(os.path.join(ckpt_out, ".metadata"), "wb") as f:
    pickle.dump(new, f)

# Ground truth (issue 34 item 3): SRC's spec (<here>/<SRC name>.json) redrawn; expected/ must
# hold it, and the emulated checkpoint, read back by dcp_truth's own reader, must too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcp_truth  # noqa: E402
import json  # noqa: E402
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       os.path.basename(os.path.normpath(src)) + ".json")) as f:
    spec = json.load(f)
truth = dcp_truth.spec_truth(spec)
dcp_truth.assert_expected(os.path.join(out, "expected"), truth)
dcp_truth.assert_checkpoint(ckpt_out, truth, spec.get("objects", {}))
print("wrote", out, "(expected/ and ckpt/ equal to the spec's values)")
