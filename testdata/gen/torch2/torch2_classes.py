"""Stand-ins for the torch >= 2.4 DCP classes, registered under torch's module names so that
pickle writes the globals a real torch 2.x `.metadata` holds (no torch 2.x is installable
here). Field order, defaults and __getstate__ follow torch/distributed/checkpoint/metadata.py
and filesystem.py at main (shared/reference/formats.md 2.2-2.3, formats-recent.md).

Import after torch 1.13 (which owns torch.distributed._shard.*, the 1.13/2.0-2.2 home of
TensorProperties, reused by `legacy_tensor_properties`).
"""
import dataclasses
import enum
import sys
import types

import torch


def _module(name):
    m = sys.modules.get(name)
    if m is None:
        m = types.ModuleType(name)
        sys.modules[name] = m
    return m


MD = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"
_module("torch.distributed.checkpoint")
_md = _module(MD)
_fs = _module(FS)


def _put(mod, cls):
    cls.__module__ = mod.__name__
    cls.__qualname__ = cls.__name__
    setattr(mod, cls.__name__, cls)
    return cls


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2

    def __reduce_ex__(self, proto):  # by value: REDUCE(cls, (0,))
        return self.__class__, (self._value_,)


@dataclasses.dataclass
class TensorProperties:
    dtype: object
    layout: object = torch.strided
    requires_grad: bool = False
    memory_format: object = None
    pin_memory: bool = False

    def __getstate__(self):
        return (self.dtype, self.layout, self.requires_grad,
                _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: object
    sizes: object


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: object
    size: object
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
    transform_descriptors: object = None

    def __getstate__(self):  # newer torch drops None-valued fields
        return {k: v for k, v in self.__dict__.items() if v is not None}


for _c in (_MEM_FORMAT_ENCODING, TensorProperties, ChunkStorageMetadata, TensorStorageMetadata,
           BytesStorageMetadata, MetadataIndex, StorageMeta, Metadata):
    _put(_md, _c)
_put(_fs, _StorageInfo)


def legacy_tensor_properties(dtype, requires_grad=False):
    """TensorProperties from torch.distributed._shard.sharded_tensor.metadata (1.13 - 2.2),
    which 2.x pickles keep referencing (test_compatibility.py); enum pickled by name."""
    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties as Old
    return Old(dtype=dtype, requires_grad=requires_grad)


def tensor_meta(m, chunks=None, legacy=False):
    """2.x TensorStorageMetadata from a 1.13 one (chunks: a subset of m.chunks)."""
    props = (legacy_tensor_properties if legacy else
             lambda d, requires_grad: TensorProperties(d, requires_grad=requires_grad))(
        m.properties.dtype, requires_grad=m.properties.requires_grad)
    cs = m.chunks if chunks is None else chunks
    return TensorStorageMetadata(props, m.size,
                                 [ChunkStorageMetadata(c.offsets, c.sizes) for c in cs])
