#!/usr/bin/env python3
"""Write tiny PaddlePaddle FlexCheckpoint checkpoints, as `paddle.distributed.save_state_dict`
lays them out, without Paddle (it cannot be installed here). Pure Debian python3 + numpy 1.24.

What is emulated (shared/reference/formats.md section 5; upstream PaddlePaddle/Paddle
python/paddle/distributed/flex_checkpoint/dcp/{metadata.py, save_state_dict.py, utils.py},
python/paddle/distributed/checkpoint/{metadata.py, save_state_dict.py} and
python/paddle/framework/io.py):

  ckpt/0.metadata      paddle.save(Metadata): a protocol-4 pickle. Metadata,
                       LocalTensorMetadata and LocalTensorIndex are dataclasses that pickle
                       the default way: STACK_GLOBAL '<module>' '<class>', EMPTY_TUPLE, NEWOBJ
                       (copyreg.__newobj__), then BUILD with the instance __dict__.
                       Module `paddle.distributed.flex_checkpoint.dcp.metadata` (current) or
                       `paddle.distributed.checkpoint.metadata` (older); both are registered
                       here as fake modules in sys.modules so pickle writes those names.
  ckpt/{rank}_0.distcp paddle.save(local_state_dict): a protocol-4 pickle of a dict
                       {tensor key: numpy.ndarray (the rank's local shard), ...,
                        "StructuredToParameterName@@": {tensor key: paddle tensor name}}
                       (io.py _build_saved_state_dict + _legacy_save). Arrays are real
                       ndarrays pickled by numpy: numpy.core.multiarray._reconstruct, then
                       BUILD (1, shape, dtype, is_fortran, raw bytes).

Current classes (flex_checkpoint/dcp/metadata.py):
  Metadata(state_dict_metadata: {key: [LocalTensorMetadata]},
           storage_metadata: {LocalTensorIndex: data-file name},
           flat_mapping: {key: tuple path}, model_type=None, checkpoint_version=None,
           erniebot_commit_id=None, paddle_commit_id=None)
  LocalTensorMetadata (frozen)(global_offset, local_shape, dtype: "float32"|"bfloat16"|...,
           global_shape=None, is_flattened=False, flattened_range=(start, stop)|None)
  LocalTensorIndex (frozen)(tensor_key, global_offset, is_flattened=False,
           flattened_range=None, replica_id=None, local_shape=None)
Older classes (checkpoint/metadata.py): Metadata(state_dict_metadata, storage_metadata,
  flat_mapping); LocalTensorMetadata(global_offset, local_shape) not frozen, no dtype;
  LocalTensorIndex(tensor_key, global_offset) frozen.

Facts the writers below reproduce from the upstream save path:
  - offsets, shapes and flattened_range are plain tuples of ints; dtype is
    str(tensor.dtype).split('.')[1];
  - keys are '.'.join(path) of the nested state dict; flat_mapping keeps the tuple path
    (a flat key that itself contains a dot maps to a 1-tuple);
  - storage_metadata: LocalTensorIndex(key, global_offset, is_flattened, flattened_range,
    local_shape=local_shape), replica_id None; replicated tensors are deduplicated by
    balanced_dedup_key_in_dict (least-loaded file, ties to the smallest name) and popped
    from the other ranks' data files (dedup_tensor);
  - with more than one rank, per-rank metadata goes through all_gather_object, i.e. a
    pickle round trip, before it is merged (this only affects pickle memo sharing);
  - bfloat16 arrays are uint16 bit patterns in the data file ('<u2'); the metadata says
    "bfloat16";
  - a flattened shard (is_flattened) is a 1-D array holding [start, stop) of the row-major
    flattening of the block at global_offset with shape local_shape.
Fixture tp2_safetensors is tp2 saved with save_state_dict(..., safetensors=True): the same
0.metadata, and each .distcp a safetensors file (testdata/gen/safetensors/stfile.py, reference
order, no __metadata__) of the rank's arrays, C order, bfloat16 as "U16".
Not from Paddle, added for reader coverage: `conv.w` in fixture tp2 is a Fortran-order
array (its pickle has is_fortran=True); np.array(tensor) in Paddle gives C order.
The paddle tensor names in the name table are plausible guesses; readers ignore them.

Output (deterministic: fixed values, dicts built in a fixed order, no time, no randomness):
  OUT_ROOT/<fixture>/ckpt/{0.metadata, <rank>_0.distcp}
  OUT_ROOT/<fixture>/expected/<tensor key>.npy   full value, C order; bfloat16 as uint16 bits

usage: /usr/bin/python3 testdata/gen/paddle_flex/gen.py [OUT_ROOT]
       /usr/bin/python3 testdata/gen/paddle_flex/gen.py --check [OUT_ROOT]
OUT_ROOT defaults to testdata/paddle_flex of the repository holding this script.
--check unpickles every file with plain pickle (an allow-list of globals, the fake modules
registered), reassembles every tensor from metadata + data files, compares it with
expected/*.npy, and regenerates into a temporary folder to confirm byte-identical files.
"""
import copyreg
import dataclasses
import io
import os
import pickle
import pickletools
import shutil
import sys
import tempfile
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "safetensors"))
import stfile  # noqa: E402  (testdata/gen/safetensors/stfile.py)

CURRENT = "paddle.distributed.flex_checkpoint.dcp.metadata"
OLDER = "paddle.distributed.checkpoint.metadata"
NAME_TABLE = "StructuredToParameterName@@"
FIXTURES = ("tp2", "zero_flat", "older", "tp2_safetensors", "adam")


# ---------------------------------------------------------------- fake paddle modules

def _fake_module(name):
    """Register `name` and every parent package in sys.modules (idempotent)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            mod = types.ModuleType(sub)
            mod.__path__ = []  # a package, so that submodules resolve
            sys.modules[sub] = mod
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], mod)
    return sys.modules[name]


def _put(module_name, cls, name):
    """Give cls the upstream module and class name, so pickle writes
    STACK_GLOBAL '<module_name>' '<name>' and can find it again on load."""
    cls.__module__ = module_name
    cls.__name__ = name
    cls.__qualname__ = name
    setattr(_fake_module(module_name), name, cls)
    return cls


# current: python/paddle/distributed/flex_checkpoint/dcp/metadata.py
@dataclasses.dataclass(frozen=True)
class _LocalTensorMetadata:
    global_offset: tuple
    local_shape: tuple
    dtype: str
    global_shape: object = None
    is_flattened: bool = False
    flattened_range: object = None


@dataclasses.dataclass(frozen=True)
class _LocalTensorIndex:
    tensor_key: str
    global_offset: tuple
    is_flattened: bool = False
    flattened_range: object = None
    replica_id: object = None
    local_shape: object = None


@dataclasses.dataclass
class _Metadata:
    state_dict_metadata: dict = None
    storage_metadata: dict = None
    flat_mapping: dict = None
    model_type: object = None
    checkpoint_version: object = None
    erniebot_commit_id: object = None
    paddle_commit_id: object = None


# older: python/paddle/distributed/checkpoint/metadata.py
@dataclasses.dataclass
class _OldLocalTensorMetadata:
    global_offset: tuple
    local_shape: tuple


@dataclasses.dataclass(frozen=True)
class _OldLocalTensorIndex:
    tensor_key: str
    global_offset: tuple


@dataclasses.dataclass
class _OldMetadata:
    state_dict_metadata: dict = None
    storage_metadata: dict = None
    flat_mapping: dict = None


LocalTensorMetadata = _put(CURRENT, _LocalTensorMetadata, "LocalTensorMetadata")
LocalTensorIndex = _put(CURRENT, _LocalTensorIndex, "LocalTensorIndex")
Metadata = _put(CURRENT, _Metadata, "Metadata")
OldLocalTensorMetadata = _put(OLDER, _OldLocalTensorMetadata, "LocalTensorMetadata")
OldLocalTensorIndex = _put(OLDER, _OldLocalTensorIndex, "LocalTensorIndex")
OldMetadata = _put(OLDER, _OldMetadata, "Metadata")


# ---------------------------------------------------------------- tensors and shards

def bf16_bits(values):
    """float values that are exact in bfloat16 -> their uint16 bit patterns."""
    f = np.asarray(values, dtype=np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(back, f), "value not exact in bfloat16"
    return bits


@dataclasses.dataclass
class Local:
    """One rank's view of a tensor: what a dist paddle.Tensor (or a ShardedWeight) gives
    extract_tensor_metadata. `data` is np.array(local_tensor) (bfloat16 -> uint16)."""
    data: np.ndarray
    dtype: str              # paddle dtype name
    global_offset: tuple
    local_shape: tuple
    global_shape: tuple
    name: str               # paddle tensor name (goes to the name table)
    flattened_range: tuple = None


def balanced_split(total, pieces):
    """utils.balanced_split: ceil-sized pieces, the remainder on the last one."""
    size = (total + pieces - 1) // pieces
    out = [size] * pieces
    if total % pieces:
        out[-1] = size - (size * pieces - total)
    return out


def whole(value, dtype, name):
    shape = tuple(value.shape)
    return Local(value, dtype, (0,) * len(shape), shape, shape, name)


def shard(value, dtype, name, axis, nranks, rank):
    """Shard(axis) over a 1-D mesh of nranks (compute_local_shape_and_global_offset)."""
    chunks = balanced_split(value.shape[axis], nranks)
    start = sum(chunks[:rank])
    index = [slice(None)] * value.ndim
    index[axis] = slice(start, start + chunks[rank])
    local = np.ascontiguousarray(value[tuple(index)])
    offset = [0] * value.ndim
    offset[axis] = start
    return Local(local, dtype, tuple(offset), tuple(local.shape), tuple(value.shape), name)


def flat_shard(value, dtype, name, start, stop):
    """A ZeRO-style ShardedWeight: [start, stop) of the row-major flattening of the
    whole tensor (block at offset 0 with the full shape)."""
    shape = tuple(value.shape)
    local = np.ascontiguousarray(value).reshape(-1)[start:stop].copy()
    return Local(local, dtype, (0,) * len(shape), shape, shape, name, (start, stop))


# ---------------------------------------------------------------- paddle.save emulation

def paddle_save_object(obj, path):
    """paddle.save of a non-state-dict object (the Metadata): io._pickle_save."""
    with open(path, "wb") as f:
        pickler = pickle.Pickler(f, 4)
        pickler.dispatch_table = copyreg.dispatch_table.copy()
        pickler.dump(obj)


def paddle_save_state_dict(local_state_dict, path, safetensors=False):
    """paddle.save of a dict of tensors: io._build_saved_state_dict + _legacy_save, or with
    safetensors=True (save_state_dict(..., safetensors=True), Paddle PR#74752) a safetensors
    file of the arrays (C order; bfloat16 as its uint16 bits, "U16"), no name table.
    [U] the exact __metadata__ Paddle writes is not known; none is written here."""
    if safetensors:
        st_names = {"<f4": "F32", "<f2": "F16", "<f8": "F64", "<u2": "U16", "<i8": "I64",
                    "<i4": "I32", "|i1": "I8", "|u1": "U8", "|b1": "BOOL"}
        tensors = []
        for key, val in local_state_dict.items():
            arr = np.ascontiguousarray(val.data)
            tensors.append((key, st_names[arr.dtype.str], arr.shape, arr.tobytes()))
        stfile.write(path, tensors)
        return
    save_dict, name_table = {}, {}
    for key, val in local_state_dict.items():
        save_dict[key] = np.array(val.data)  # keeps the memory order, like np.array(t.cpu())
        name_table[key] = val.name
    save_dict[NAME_TABLE] = name_table
    with open(path, "wb") as f:
        pickle.dump(save_dict, f, protocol=4)


def flatten_state_dict(state_dict):
    flat, mapping = {}, {}

    def _flatten(key, value):
        if isinstance(value, dict):
            for k, v in value.items():
                _flatten((*key, k), v)
        else:
            flat_key = ".".join(key)
            flat[flat_key] = value
            mapping[flat_key] = key

    _flatten((), state_dict)
    return flat, mapping


def _all_gather_object(objs):
    """all_gather_object pickles each rank's object and unpickles it on every rank."""
    return [pickle.loads(pickle.dumps(o)) for o in objs]


def save_state_dict_current(rank_state_dicts, ckpt_dir, unique_id=0, safetensors=False):
    """flex_checkpoint/dcp/save_state_dict.py: save_state_dict, run by every rank."""
    os.makedirs(ckpt_dir, exist_ok=True)
    world = len(rank_state_dicts)
    locals_, g_md, g_storage, g_mapping = [], [], [], []
    for rank, state_dict in enumerate(rank_state_dicts):
        flat, mapping = flatten_state_dict(state_dict)
        file_name = f"{rank}_{unique_id}.distcp"
        local_sd, local_md, local_storage = {}, {}, {}
        for key, val in flat.items():
            # extract_tensor_metadata
            dtype = ("paddle." + val.dtype).split(".")[1]
            is_flattened = val.flattened_range is not None
            ltm = LocalTensorMetadata(tuple(val.global_offset), tuple(val.local_shape), dtype,
                                      tuple(val.global_shape), is_flattened,
                                      tuple(val.flattened_range) if is_flattened else None)
            local_sd[key] = val
            local_md[key] = ltm
            local_storage[LocalTensorIndex(tensor_key=key, global_offset=ltm.global_offset,
                                           is_flattened=ltm.is_flattened,
                                           flattened_range=ltm.flattened_range,
                                           local_shape=ltm.local_shape)] = file_name
        locals_.append((file_name, local_sd, local_storage))
        g_md.append(local_md)
        g_storage.append(local_storage)
        g_mapping.append(mapping)
    if world > 1:
        g_md, g_storage, g_mapping = (_all_gather_object(g) for g in (g_md, g_storage, g_mapping))

    metadata = Metadata()
    metadata.state_dict_metadata = _merge_state_dict_metadata(g_md)
    metadata.storage_metadata = _balanced_dedup_key_in_dict(g_storage)
    metadata.flat_mapping = _dedup_key_in_dict(g_mapping)
    paddle_save_object(metadata, os.path.join(ckpt_dir, f"{unique_id}.metadata"))

    for rank, (file_name, local_sd, local_storage) in enumerate(locals_):
        for index, fname in metadata.storage_metadata.items():  # dedup_tensor
            owner = int(fname.split(".")[0].split("_")[0])
            if index in local_storage and owner != rank:
                local_sd.pop(index.tensor_key)
        paddle_save_state_dict(local_sd, os.path.join(ckpt_dir, file_name), safetensors)


def _merge_state_dict_metadata(gathered):
    out = {}
    for state_dict in gathered:
        for key, val in state_dict.items():
            out.setdefault(key, [])
            if val not in out[key]:
                out[key].append(val)
    return out


def _dedup_key_in_dict(gathered):
    out = {}
    for d in gathered:
        for key, val in d.items():
            if key not in out:
                out[key] = val
    return out


def _balanced_dedup_key_in_dict(gathered):
    lti_to_files = {}
    for storage in gathered:
        for lti, fname in storage.items():
            lti_to_files.setdefault(lti, set()).add(fname)
    file_load, out = {}, {}
    for lti, files in lti_to_files.items():
        candidates = sorted(files)
        chosen = min(candidates, key=lambda f: file_load.get(f, 0))
        file_load[chosen] = file_load.get(chosen, 0) + 1
        out[lti] = chosen
    return out


def save_state_dict_older(state_dict, ckpt_dir):
    """checkpoint/save_state_dict.py of the dtype-less era, one process (world size 1):
    LocalTensorMetadata(global_offset, local_shape), LocalTensorIndex(key, global_offset)."""
    os.makedirs(ckpt_dir, exist_ok=True)
    flat, mapping = flatten_state_dict(state_dict)
    file_name = "0_0.distcp"
    local_sd, local_md, local_storage = {}, {}, {}
    for key, val in flat.items():
        local_shape = tuple(val.local_shape)
        global_offset = tuple([0] * len(val.local_shape)) if len(val.local_shape) > 0 else ()
        local_sd[key] = val
        local_md[key] = OldLocalTensorMetadata(global_offset, local_shape)
        local_storage[OldLocalTensorIndex(key, tuple(global_offset))] = file_name
    metadata = OldMetadata()
    metadata.state_dict_metadata = _merge_state_dict_metadata([local_md])
    metadata.storage_metadata = _dedup_key_in_dict([local_storage])
    metadata.flat_mapping = _dedup_key_in_dict([mapping])
    paddle_save_object(metadata, os.path.join(ckpt_dir, "0.metadata"))
    paddle_save_state_dict(local_sd, os.path.join(ckpt_dir, file_name))


# ---------------------------------------------------------------- fixtures

def write_expected(out_dir, tensors):
    exp = os.path.join(out_dir, "expected")
    os.makedirs(exp, exist_ok=True)
    for key in sorted(tensors):
        np.save(os.path.join(exp, key + ".npy"), np.ascontiguousarray(tensors[key]))


def fixture_tp2(out_dir, safetensors=False):
    linear_w = np.arange(24, dtype=np.float32).reshape(6, 4)
    linear_b = np.array([0.5, -1.0, 2.25, 100.0], dtype=np.float32)
    emb_w = bf16_bits((np.arange(15, dtype=np.float32) - 7.0).reshape(5, 3) * 0.5)
    step = np.array([7, -1, 2 ** 40 + 3], dtype=np.int64)
    conv_w = (np.arange(12, dtype=np.float32) * 1.5 - 4.0).reshape(3, 4)
    half_w = np.array([[0.5, -2.0], [1024.0, 0.0009765625]], dtype=np.float16)

    def rank_sd(rank):
        sd = {
            # replicated: the same block on both ranks, saved once (goes to 0_0.distcp)
            "linear": {"b": whole(linear_b, "float32", "linear_0.b_0"),
                       "w": shard(linear_w, "float32", "linear_0.w_0", 0, 2, rank)},
            "emb": {"w": shard(emb_w, "bfloat16", "embedding_0.w_0", 1, 2, rank)},
        }
        if rank == 0:
            sd["half"] = {"w": whole(half_w, "float16", "linear_1.w_0")}
        else:
            sd["step"] = whole(step, "int64", "generated_tensor_0")
            sd["conv"] = {"w": whole(np.asfortranarray(conv_w), "float32", "conv2d_0.w_0")}
        return sd

    save_state_dict_current([rank_sd(0), rank_sd(1)], os.path.join(out_dir, "ckpt"),
                            safetensors=safetensors)
    write_expected(out_dir, {"linear.w": linear_w, "linear.b": linear_b, "emb.w": emb_w,
                             "step": step, "conv.w": conv_w, "half.w": half_w})


def fixture_zero_flat(out_dir):
    moment = np.arange(20, dtype=np.float32).reshape(4, 5) * 0.5
    w = (np.arange(20, dtype=np.float32) - 10.0).reshape(4, 5)
    ranges = [(0, 9), (9, 20)]  # the cut falls inside row 1

    def rank_sd(rank):
        # flat keys (a ShardedWeight dict): "w.moment1_0" maps to the 1-tuple ("w.moment1_0",)
        return {"w": shard(w, "float32", "linear_0.w_0", 0, 2, rank),
                "w.moment1_0": flat_shard(moment, "float32", "linear_0.w_0_moment1_0",
                                          *ranges[rank])}

    save_state_dict_current([rank_sd(0), rank_sd(1)], os.path.join(out_dir, "ckpt"))
    write_expected(out_dir, {"w": w, "w.moment1_0": moment})


def fixture_older(out_dir):
    a_w = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32) * 0.25
    a_b = np.array([10, 20, -30], dtype=np.int64)
    sd = {"a": {"w": whole(a_w, "float32", "linear_0.w_0"),
                "b": whole(a_b, "int64", "linear_0.b_0")}}
    save_state_dict_older(sd, os.path.join(out_dir, "ckpt"))
    write_expected(out_dir, {"a.w": a_w, "a.b": a_b})


def bf16_round_bits(values):
    """float32 values -> the uint16 bit patterns of their bfloat16 roundings (to nearest,
    ties to even), as a bf16 model weight is its fp32 master weight cast."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def check_bf16_rounding(bits, values):
    """bits are the nearest bfloat16 to values (ties to even), checked by distances, apart
    from bf16_round_bits' integer trick: no neighbour is nearer, and a tie is even."""
    x = np.asarray(values, dtype=np.float32).astype(np.float64).reshape(-1)
    b = np.asarray(bits, dtype=np.uint16).reshape(-1).astype(np.int64)
    def widen(u):
        return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    d = np.abs(x - widen(b))
    for nb in (b - 1, b + 1):
        with np.errstate(invalid="ignore"):
            dn = np.abs(x - widen(nb & 0xFFFF))
        dn[np.isnan(dn)] = np.inf  # a NaN pattern next to +-0 or the largest values
        assert ((d < dn) | ((d == dn) & (b % 2 == 0))).all(), \
            "bf16 rounding differs from nearest-even"


def fixture_adam(out_dir):
    """A bf16 model with master weights and AdamW states under PaddlePaddle's optimizer
    state keys (<key>.w_0, .moment1_0, .moment2_0, .beta1_pow_acc_0, .beta2_pow_acc_0),
    the states flattened ZeRO shards (sharding stage 1), as an optimizer's sharded state
    dict is saved beside the model's. Step 30: the beta powers are 0.9^30 and 0.999^30."""
    emb_master = ((np.arange(24, dtype=np.float32) - 11.0) * 0.1).reshape(6, 4)
    norm = np.array([1.0, 0.75, -0.5, 2.0], dtype=np.float32)
    inv_freq = np.array([1.0, 0.01], dtype=np.float32)
    states = {
        "emb.w": (emb_master, np.arange(24, dtype=np.float32).reshape(6, 4) * -0.01,
                  np.arange(24, dtype=np.float32).reshape(6, 4) * 0.001 + 0.5, [(0, 10), (10, 24)]),
        "norm.w": (norm, np.array([0.25, -0.125, 4.0, 0.0], dtype=np.float32),
                   np.array([1e-8, 2.0, 0.5, 3.0], dtype=np.float32), [(0, 1), (1, 4)]),
    }
    pows = {"beta1_pow_acc_0": np.array([0.9 ** 30], dtype=np.float32),
            "beta2_pow_acc_0": np.array([0.999 ** 30], dtype=np.float32)}
    expected = {"emb.w": bf16_round_bits(emb_master), "norm.w": norm, "rope.inv_freq": inv_freq,
                "emb.w.w_0": emb_master}
    check_bf16_rounding(expected["emb.w"], emb_master)  # the one derived expected value

    def rank_sd(rank):
        sd = {"emb.w": shard(expected["emb.w"], "bfloat16", "embedding_0.w_0", 0, 2, rank),
              "norm.w": whole(norm, "float32", "rms_norm_0.w_0"),
              "emb.w.w_0": flat_shard(emb_master, "float32", "embedding_0.w_0_fp32_master_0",
                                      *states["emb.w"][3][rank])}
        if rank == 0:
            sd["rope.inv_freq"] = whole(inv_freq, "float32", "generated_tensor_0")
        for key, (_, m1, m2, ranges) in states.items():
            name = "embedding_0.w_0" if key == "emb.w" else "rms_norm_0.w_0"
            sd[key + ".moment1_0"] = flat_shard(m1, "float32", name + "_moment1_0", *ranges[rank])
            sd[key + ".moment2_0"] = flat_shard(m2, "float32", name + "_moment2_0", *ranges[rank])
            for suffix, value in pows.items():
                sd[key + "." + suffix] = whole(value, "float32", name + "_" + suffix)
        return sd

    for key, (_, m1, m2, _) in states.items():
        expected[key + ".moment1_0"] = m1
        expected[key + ".moment2_0"] = m2
        for suffix, value in pows.items():
            expected[key + "." + suffix] = value
    save_state_dict_current([rank_sd(0), rank_sd(1)], os.path.join(out_dir, "ckpt"))
    write_expected(out_dir, expected)


WRITERS = {"tp2": fixture_tp2, "zero_flat": fixture_zero_flat, "older": fixture_older,
           "tp2_safetensors": lambda d: fixture_tp2(d, safetensors=True), "adam": fixture_adam}


def generate(out_root):
    os.makedirs(out_root, exist_ok=True)
    for name in FIXTURES:
        d = os.path.join(out_root, name)
        shutil.rmtree(d, ignore_errors=True)
        WRITERS[name](d)


# ---------------------------------------------------------------- --check

ALLOWED_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
                   ("numpy", "dtype")}
ALLOWED_GLOBALS |= {(m, c) for m in (CURRENT, OLDER)
                    for c in ("Metadata", "LocalTensorMetadata", "LocalTensorIndex")}
ALLOWED_OPCODES = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_LIST",
                   "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND",
                   "APPENDS", "NONE", "NEWTRUE", "NEWFALSE", "BININT1", "BININT2", "BININT",
                   "LONG1", "SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES", "BINBYTES",
                   "STACK_GLOBAL", "REDUCE", "NEWOBJ", "BUILD", "MEMOIZE", "BINGET",
                   "LONG_BINGET"}
NP_STORAGE = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "bfloat16": "<u2",
              "int64": "<i8", "int32": "<i4", "int8": "|i1", "uint8": "|u1", "bool": "|b1"}


class _CheckUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global not allowed: {module}.{name}")
        return super().find_class(module, name)


def _load(path):
    with open(path, "rb") as f:
        raw = f.read()
    ops = {op.name for op, _, _ in pickletools.genops(raw)}
    assert raw[:2] == b"\x80\x04", f"{path}: not protocol 4"
    assert ops <= ALLOWED_OPCODES, f"{path}: unexpected opcodes {sorted(ops - ALLOWED_OPCODES)}"
    return _CheckUnpickler(io.BytesIO(raw)).load()


ST_NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "U16": "<u2", "I64": "<i8", "I32": "<i4",
            "I8": "|i1", "U8": "|u1", "BOOL": "|b1"}


def _load_data(path):
    """A .distcp file: the paddle.save pickle, or (safetensors=True) a safetensors file."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:1] == b"\x80":
        return _load(path)
    assert head[8:9] == b"{", path
    _, tensors = stfile.read(path)
    return {k: np.frombuffer(raw, dtype=ST_NUMPY[dt]).reshape(shape)
            for k, (dt, shape, raw) in tensors.items()}


def check_fixture(fx_dir):
    ckpt = os.path.join(fx_dir, "ckpt")
    names = sorted(os.listdir(ckpt))
    md_files = [n for n in names if n.endswith(".metadata")]
    assert md_files == ["0.metadata"], md_files
    md = _load(os.path.join(ckpt, md_files[0]))
    module = type(md).__module__
    assert module in (CURRENT, OLDER), module
    data = {n: _load_data(os.path.join(ckpt, n)) for n in names if n.endswith(".distcp")}
    for n, d in data.items():
        if NAME_TABLE not in d:  # safetensors form: no name table
            continue
        table = d[NAME_TABLE]
        assert isinstance(table, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()), n
        assert set(table) == set(d) - {NAME_TABLE}, n
    used = set()
    result = {}
    for key, ltms in md.state_dict_metadata.items():
        indices = [i for i in md.storage_metadata if i.tensor_key == key]
        if module == CURRENT:
            dtypes = {m.dtype for m in ltms}
            assert len(dtypes) == 1, dtypes
            storage = np.dtype(NP_STORAGE[dtypes.pop()])
            gshape = ltms[0].global_shape
            assert all(m.global_shape == gshape for m in ltms)
        else:
            storage = None
            gshape = tuple(max(m.global_offset[d] + m.local_shape[d] for m in ltms)
                           for d in range(len(ltms[0].local_shape)))
        full = None
        cover = np.zeros(gshape, dtype=np.int64)
        for m in ltms:
            flat = getattr(m, "flattened_range", None) if getattr(m, "is_flattened", False) else None
            hits = [i for i in indices if i.global_offset == m.global_offset
                    and getattr(i, "flattened_range", None) == flat
                    and getattr(i, "local_shape", None) in (None, m.local_shape)]
            assert len(hits) == 1, (key, m, hits)
            fname = md.storage_metadata[hits[0]]
            arr = data[fname][key]
            assert isinstance(arr, np.ndarray)
            if storage is None:
                storage = arr.dtype
            assert arr.dtype == storage, (key, arr.dtype, storage)
            if full is None:
                full = np.zeros(gshape, dtype=storage)
            block = tuple(slice(o, o + s) for o, s in zip(m.global_offset, m.local_shape))
            if flat is not None:
                start, stop = flat
                assert arr.shape == (stop - start,), (key, arr.shape)
                piece = full[block].copy().reshape(-1)
                piece[start:stop] = arr
                full[block] = piece.reshape(m.local_shape)
                c = cover[block].copy().reshape(-1)
                c[start:stop] += 1
                cover[block] = c.reshape(m.local_shape)
            else:
                assert arr.shape == tuple(m.local_shape), (key, arr.shape)
                full[block] = arr
                cover[block] += 1
            used.add((fname, key))
        assert (cover == 1).all(), (key, cover)
        result[key] = full
    stored = {(n, k) for n, d in data.items() for k in d if k != NAME_TABLE}
    assert stored == used, sorted(stored ^ used)
    exp_dir = os.path.join(fx_dir, "expected")
    assert sorted(os.listdir(exp_dir)) == sorted(k + ".npy" for k in result)
    for key, full in result.items():
        want = np.load(os.path.join(exp_dir, key + ".npy"))
        assert want.dtype == full.dtype and want.shape == full.shape, (key, want.dtype, full.dtype)
        assert want.tobytes() == full.tobytes(), key
    return md, data, result


def check(out_root):
    for name in FIXTURES:
        md, data, result = check_fixture(os.path.join(out_root, name))
        print(f"{name}: {type(md).__module__}.Metadata, {len(data)} data file(s), "
              f"{len(result)} tensor(s) reassembled and equal to expected")
    # fixture-specific properties the readers are meant to exercise
    md, data, _ = check_fixture(os.path.join(out_root, "tp2"))
    conv = data["1_0.distcp"]["conv.w"]
    assert conv.flags.f_contiguous and not conv.flags.c_contiguous
    assert "linear.b" in data["0_0.distcp"] and "linear.b" not in data["1_0.distcp"]
    assert data["0_0.distcp"]["emb.w"].dtype == np.uint16
    md, data, _ = check_fixture(os.path.join(out_root, "tp2_safetensors"))
    assert all(open(os.path.join(out_root, "tp2_safetensors", "ckpt", n), "rb").read(1) != b"\x80"
               for n in data)
    md, data, _ = check_fixture(os.path.join(out_root, "zero_flat"))
    assert md.flat_mapping["w.moment1_0"] == ("w.moment1_0",)
    # regenerate and compare byte for byte
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        # The fresh output too: its files reassemble to its expected/, which the fixtures
        # write from the source arrays (the ground truth) before sharding.
        for name in FIXTURES:
            check_fixture(os.path.join(tmp, name))
        for name in FIXTURES:
            for root, _, files in os.walk(os.path.join(tmp, name)):
                for f in files:
                    a = os.path.join(root, f)
                    b = os.path.join(out_root, os.path.relpath(a, tmp))
                    with open(a, "rb") as fa, open(b, "rb") as fb:
                        assert fa.read() == fb.read(), f"stale or nondeterministic: {b}"
        n_new = sum(len(fs) for _, _, fs in os.walk(tmp))
        n_old = sum(len(fs) for n in FIXTURES for _, _, fs in os.walk(os.path.join(out_root, n)))
        assert n_new == n_old, (n_new, n_old)
    print("regenerated output is byte-identical")


def main(argv):
    args = argv[1:]
    do_check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) > 1:
        sys.exit(__doc__)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    out_root = args[0] if args else os.path.join(repo, "testdata", "paddle_flex")
    if do_check:
        check(out_root)
    else:
        generate(out_root)


if __name__ == "__main__":
    main(sys.argv)
