"""Writes PaddlePaddle FlexCheckpoint saves with the real PaddlePaddle (3.3.1, CPU wheel, the
interop environment), each with the full tensors Paddle itself loads back as the expected
values, and AOA programs with what Paddle's own load_state_dict(..., aoa_config=...) gives.

usage: python make_fixtures.py OUT_DIR
  (run with the interop environment's python: ~/.cache/fc-interop/paddle/bin/python)

OUT_DIR/<case>/ckpt                   the checkpoint as paddle.distributed.save_state_dict wrote it
OUT_DIR/<case>/expected.safetensors   every tensor of the checkpoint, full, as Paddle's
                                      load_state_dict fills zero tensors of the metadata's
                                      global shapes and dtypes (bfloat16 as BF16)
OUT_DIR/aoa_tp2/aoa/<prog>.json       an AOA program ({"aoa_statements": [...]})
OUT_DIR/aoa_tp2/aoa/<prog>.safetensors  its outputs as Paddle's load_state_dict(dest, ckpt,
                                      aoa_config=<prog>) fills them
OUT_DIR/versions.json                 paddle, numpy, safetensors, Python versions

Cases:
  single_pickle       one process, no launch: a small model (Embedding, Linear, LayerNorm;
                      fp32) after one AdamW step, model.sharded_state_dict() +
                      optimizer.sharded_state_dict() (moment1_0/moment2_0/beta*_pow_acc_0),
                      plus a bfloat16, a float16 and an int64 tensor; paddle.save pickles
  single_safetensors  the same state with save_state_dict(..., safetensors=True)
  two_ranks           paddle.distributed.launch --nproc_per_node 2 (CPU, gloo): dist.shard_tensor
                      Shard(0) uneven (5 rows: 3 + 2), Shard(1) uneven (5 cols: 3 + 2), a
                      replicated tensor (stored once), and a bfloat16 [6, 3] split on axis 0
                      given as ShardedWeight pieces (dist.shard_tensor of a bfloat16 tensor
                      fails on CPU: 'function "Slice" is not implemented for data type
                      `bfloat16`'); paddle.save pickles
  two_ranks_safetensors  the same with safetensors=True (<rank>_0.safetensors data files)
  zero_sharding       2 ranks, fleet sharding_degree 2 with split_param (DygraphShardingOptimizerV2,
                      ZeRO stage 1 "V2"), one AdamW step, model + optimizer.sharded_state_dict():
                      moments as flattened shards (is_flattened, flattened_range), one of them
                      cut inside a parameter. Runs on CPU only with two patches of the test
                      process (see PATCHES below)
  aoa_tp2             2 ranks: a Llama-like model in Paddle's naming ([in, out] weights), the
                      fused qkv_proj ([Q_r | K_r | V_r] per TP rank: Paddle's old layout) and
                      gate_up_fused_proj ([gate_r | up_r] per rank) column-parallel at TP 2,
                      o_proj/down_proj row-parallel, norms (bf16 input_layernorm) replicated,
                      and a few whole tensors for the merge forms; the AOA programs of
                      AOA_PROGRAMS run against it

PATCHES (zero_sharding only; the save path itself is not touched):
  - paddle.distributed.fleet.utils.tensor_fusion_helper.alignment["unknown"] = 256: on the CPU
    wheel get_current_device_type() is "unknown" and the sharding optimizer's buffer builder
    asserts "tensor fusion helper now only support dict_keys(['gpu', 'npu', 'xpu']), but got
    device unknown instead." (256 is the gpu/npu/xpu value);
  - paddle.distributed.reduce_scatter replaced by all_reduce + the rank's slice: the gradient
    reduce-scatter of the step fails with "(Unimplemented) ProcessGroupGLOO does not support
    reduce_scatter with sync_op flag."
"""
import json
import os
import platform
import shutil
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

SINGLE_CASES = ["single_pickle", "single_safetensors"]
LAUNCH_CASES = ["two_ranks", "two_ranks_safetensors", "zero_sharding", "aoa_tp2"]
CASES = SINGLE_CASES + LAUNCH_CASES
SAFETENSORS_CASES = {"single_safetensors", "two_ranks_safetensors"}

# ---- safetensors, written by hand (numpy has no bfloat16: bf16 travels as uint16 bits) ----
ST_NAMES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
            "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
            "bool": "BOOL"}
NP_OF = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": np.uint16,
         "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
         "BOOL": np.bool_}


def write_st(tensors, path):
    """tensors: {name: (paddle dtype name, numpy array)}; names sorted, no __metadata__."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": ST_NAMES[dt], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], np.frombuffer(data[8 + n + b:8 + n + e],
                                                  NP_OF[info["dtype"]]).reshape(info["shape"]))
    return out


def dtype_name(t):
    return str(t.dtype).split(".")[1]


def np_of(t):
    """A paddle tensor's bytes as numpy (bfloat16 as its uint16 bit patterns)."""
    return np.array(t.cpu().numpy())  # bfloat16 -> uint16


def same(a, b, label):
    """a, b: {name: (dtype, array)}; bit-for-bit."""
    assert sorted(a) == sorted(b), f"{label}: names differ: {sorted(set(a) ^ set(b))}"
    for k in a:
        (da, xa), (db, xb) = a[k], b[k]
        assert ST_NAMES.get(da, da) == ST_NAMES.get(db, db), (label, k, da, db)
        assert tuple(xa.shape) == tuple(xb.shape), (label, k, xa.shape, xb.shape)
        assert np.ascontiguousarray(xa).tobytes() == np.ascontiguousarray(xb).tobytes(), \
            f"{label}: {k} differs"


# ---- the models ----
def tiny_model():
    import paddle

    class Tiny(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(11, 6)
            self.fc = paddle.nn.Linear(6, 100)
            self.norm = paddle.nn.LayerNorm(100)

        def forward(self, x):
            return self.norm(self.fc(self.emb(x)))

    return Tiny()


def train_one_step(model, opt):
    import paddle
    x = paddle.arange(12).reshape([3, 4]) % 11
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.clear_grad()


def single_state():
    import paddle
    paddle.seed(1234)
    model = tiny_model()
    opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    train_one_step(model, opt)
    msd = model.sharded_state_dict()
    state = dict(msd)
    state.update(opt.sharded_state_dict(msd))
    rng = np.random.default_rng(7)
    state["extra.bf16"] = paddle.to_tensor(rng.standard_normal((7, 3), dtype=np.float32)
                                           ).astype("bfloat16")
    state["extra.fp16"] = paddle.to_tensor(rng.standard_normal((2, 5), dtype=np.float32)
                                           ).astype("float16")
    state["extra.step"] = paddle.to_tensor(np.array([3, 1 << 40, -1], dtype=np.int64))
    return model, state


def local_of(v):
    """(numpy local data, dtype name, global_offset, local_shape, global_shape, flat range)."""
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight
    if isinstance(v, ShardedWeight):
        fr = v.flattened_range
        return (np_of(v.local_tensor), dtype_name(v.local_tensor), tuple(v.global_offset),
                tuple(v.local_shape), tuple(v.global_shape),
                (int(fr.start), int(fr.stop)) if v.is_flattened else None)
    return (np_of(v), dtype_name(v), (0,) * len(v.shape), tuple(v.shape), tuple(v.shape), None)


def assemble(pieces):
    """{key: [(data, dtype, offset, local_shape, global_shape, flat)]} -> full {key: (dt, arr)}."""
    out = {}
    for key, ps in pieces.items():
        dt, gshape = ps[0][1], ps[0][4]
        full = np.zeros(gshape, dtype=ps[0][0].dtype)
        filled = np.zeros(gshape, dtype=bool)
        for data, _, off, lshape, _, flat in ps:
            sl = tuple(slice(o, o + s) for o, s in zip(off, lshape))
            if flat is None:
                block = data.reshape(lshape)
                full[sl] = block
                filled[sl] = True
            else:
                block = full[sl].copy().reshape(-1)
                f = filled[sl].copy().reshape(-1)
                block[flat[0]:flat[1]] = data.reshape(-1)
                f[flat[0]:flat[1]] = True
                full[sl] = block.reshape(lshape)
                filled[sl] = f.reshape(lshape)
        assert filled.all(), f"{key}: pieces do not cover the tensor"
        out[key] = (dt, full)
    return out


# ---- Paddle as the reader ----
def paddle_load_full(ckpt, safetensors):
    """Every tensor of ckpt as Paddle's load_state_dict fills zeros of the metadata's shapes."""
    import paddle
    import paddle.distributed as dist
    meta_files = [f for f in os.listdir(ckpt) if f.endswith(".metadata")]
    assert len(meta_files) == 1, meta_files
    md = paddle.load(os.path.join(ckpt, meta_files[0]))
    state = {}
    for key, metas in md.state_dict_metadata.items():
        gshape = metas[0].global_shape
        state[key] = paddle.zeros(list(gshape), dtype=metas[0].dtype)
    dist.load_state_dict(state, ckpt, safetensors=safetensors)
    return {k: (dtype_name(v), np_of(v)) for k, v in state.items()}


def paddle_load_aoa(ckpt, program, dests):
    """load_state_dict(..., aoa_config=program) into zero ShardedWeights of dests
    ({name: (shape, dtype)}), one process."""
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.flex_checkpoint.dcp import load_state_dict as lsd
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight
    # A load that raised leaves its metadata in Paddle's module-level _metadata_manager, and
    # the next AOA load would use it for another checkpoint ("fc.weight should be assigned
    # before!"): start clean.
    lsd._metadata_manager.clear()
    state = {}
    for name, (shape, dt) in dests.items():
        t = paddle.zeros(list(shape), dtype=dt)
        state[name] = ShardedWeight(key=name, local_tensor=t, local_shape=tuple(shape),
                                    global_shape=tuple(shape), global_offset=(0,) * len(shape))
    dist.load_state_dict(state, ckpt, aoa_config=program)
    return {k: (dtype_name(v.local_tensor), np_of(v.local_tensor)) for k, v in state.items()}


# ---- the Llama-like model for AOA (Paddle naming, [in, out] weights) ----
HID, HEADS, KV, HD, INTER, VOCAB, LAYERS = 8, 4, 2, 2, 6, 10, 2
QKV = (HEADS + 2 * KV) * HD  # 16


def aoa_full_tensors():
    """{key: (dtype, full numpy array, how it is split at TP 2: None | axis)}."""
    rng = np.random.default_rng(2024)

    def f32(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    t = {"llama.embed_tokens.weight": ("float32", f32(VOCAB, HID), 0),
         "llama.norm.weight": ("float32", f32(HID), None),
         "lm_head.weight": ("float32", f32(HID, VOCAB), 1)}
    for L in range(LAYERS):
        p = f"llama.layers.{L}."
        t[p + "self_attn.qkv_proj.weight"] = ("float32", f32(HID, QKV), 1)
        t[p + "self_attn.o_proj.weight"] = ("float32", f32(HEADS * HD, HID), 0)
        t[p + "mlp.gate_up_fused_proj.weight"] = ("float32", f32(HID, 2 * INTER), 1)
        t[p + "mlp.down_proj.weight"] = ("float32", f32(INTER, HID), 0)
        t[p + "input_layernorm.weight"] = ("bfloat16", f32(HID), None)
        t[p + "post_attention_layernorm.weight"] = ("float32", f32(HID), None)
    # Whole tensors for the merge forms (q, k, v -> fused; gate, up -> fused) and
    # Megatron's grouped fused_qkv ([out, in]).
    t["sep.q"] = ("float32", f32(HEADS * HD, HID), None)
    t["sep.k"] = ("float32", f32(KV * HD, HID), None)
    t["sep.v"] = ("float32", f32(KV * HD, HID), None)
    t["sep.gate"] = ("float32", f32(HID, INTER), None)
    t["sep.up"] = ("float32", f32(HID, INTER), None)
    t["grouped.qkv"] = ("float32", f32(QKV, HID), None)
    return t


def _layers(fmt):
    return [fmt.format(L=L) for L in range(LAYERS)]


def aoa_programs():
    """{name: (statements, {dest name: (shape, dtype)})}."""
    P = {}
    dests = {f"model.layers.{L}.self_attn.o_proj.weight": ((HEADS * HD, HID), "float32")
             for L in range(LAYERS)}
    dests["model.embed_tokens.weight"] = ((VOCAB, HID), "float32")
    P["rename_layer_id"] = ([
        "llama.layers.$LAYER_ID.self_attn.o_proj.weight -> "
        "model.layers.$LAYER_ID.self_attn.o_proj.weight",
        "llama.embed_tokens.weight -> model.embed_tokens.weight"], dests)
    dests = {f"model.layers.{L}.mlp.down_proj.weight": ((HID, INTER), "float32")
             for L in range(LAYERS)}
    dests["lm_head.t"] = ((VOCAB, HID), "float32")
    P["transpose"] = ([
        "llama.layers.$LAYER_ID.mlp.down_proj.weight^T -> model.layers.$LAYER_ID.mlp.down_proj.weight",
        "lm_head.weight -> lm_head.t, permute='[1, 0]'"], dests)
    P["split_concat"] = ([
        "lm_head.weight -> lm_head.a, lm_head.b, axis=1",
        "llama.embed_tokens.weight -> emb.0, emb.1, axis=0",
        "llama.layers.0.input_layernorm.weight, llama.layers.1.input_layernorm.weight -> "
        "input_norms, axis=0",
        "llama.layers.0.mlp.down_proj.weight, llama.layers.1.mlp.down_proj.weight -> "
        "downs, axis=1"],
        {"lm_head.a": ((HID, VOCAB // 2), "float32"), "lm_head.b": ((HID, VOCAB // 2), "float32"),
         "emb.0": ((VOCAB // 2, HID), "float32"), "emb.1": ((VOCAB // 2, HID), "float32"),
         "input_norms": ((2 * HID,), "bfloat16"), "downs": ((INTER, 2 * HID), "float32")})
    qkv = "llama.layers.$LAYER_ID.self_attn.qkv_proj.weight"
    dests = {}
    for L in range(LAYERS):
        dests[f"model.layers.{L}.self_attn.q_proj.weight"] = ((HID, HEADS * HD), "float32")
        dests[f"model.layers.{L}.self_attn.k_proj.weight"] = ((HID, KV * HD), "float32")
        dests[f"model.layers.{L}.self_attn.v_proj.weight"] = ((HID, KV * HD), "float32")
    P["fused_qkv_old"] = ([
        f"{qkv} -> model.layers.$LAYER_ID.self_attn.q_proj.weight, "
        "model.layers.$LAYER_ID.self_attn.k_proj.weight, "
        "model.layers.$LAYER_ID.self_attn.v_proj.weight, "
        f"fused_qkv_old, num_heads={HEADS}, num_key_value_groups={KV}"], dests)
    dests = {}
    for L in range(LAYERS):
        dests[f"hf.layers.{L}.q_proj.weight"] = ((HEADS * HD, HID), "float32")
        dests[f"hf.layers.{L}.k_proj.weight"] = ((KV * HD, HID), "float32")
        dests[f"hf.layers.{L}.v_proj.weight"] = ((KV * HD, HID), "float32")
    P["fused_qkv_old_transposed"] = ([
        f"{qkv}^T -> hf.layers.$LAYER_ID.q_proj.weight, hf.layers.$LAYER_ID.k_proj.weight, "
        f"hf.layers.$LAYER_ID.v_proj.weight, fused_qkv_old, num_heads={HEADS}, "
        f"num_key_value_groups={KV}, axis=0"], dests)
    dests = {}
    for L in range(LAYERS):
        dests[f"model.layers.{L}.mlp.gate_proj.weight"] = ((HID, INTER), "float32")
        dests[f"model.layers.{L}.mlp.up_proj.weight"] = ((HID, INTER), "float32")
    P["fused_ffn"] = ([
        "llama.layers.$LAYER_ID.mlp.gate_up_fused_proj.weight -> "
        "model.layers.$LAYER_ID.mlp.gate_proj.weight, model.layers.$LAYER_ID.mlp.up_proj.weight, "
        "fused_ffn"], dests)
    dests = {}
    for L in range(LAYERS):
        dests[f"hf.layers.{L}.gate_proj.weight"] = ((INTER, HID), "float32")
        dests[f"hf.layers.{L}.up_proj.weight"] = ((INTER, HID), "float32")
    P["fused_ffn_transposed"] = ([
        "llama.layers.$LAYER_ID.mlp.gate_up_fused_proj.weight^T -> "
        "hf.layers.$LAYER_ID.gate_proj.weight, hf.layers.$LAYER_ID.up_proj.weight, "
        "fused_ffn, axis=0"], dests)
    P["fused_merge"] = ([
        f"sep.q, sep.k, sep.v -> merged.qkv, fused_qkv, num_heads={HEADS}, "
        f"num_key_value_groups={KV}, axis=0",
        "sep.gate, sep.up -> merged.gate_up, fused_ffn"],
        {"merged.qkv": ((QKV, HID), "float32"), "merged.gate_up": ((HID, 2 * INTER), "float32")})
    P["fused_qkv_grouped"] = ([
        f"grouped.qkv -> g.q, g.k, g.v, fused_qkv, num_heads={HEADS}, "
        f"num_key_value_groups={KV}, axis=0"],
        {"g.q": ((HEADS * HD, HID), "float32"), "g.k": ((KV * HD, HID), "float32"),
         "g.v": ((KV * HD, HID), "float32")})
    P["star"] = (["llama.layers.*.post_attention_layernorm.weight -> post_norms, axis=0"],
                 {"post_norms": ((LAYERS * HID,), "float32")})
    P["array"] = (["lm_head.weight -> lm[0:2], axis=1", "lm_1 -> lm_second"],
                  {"lm_0": ((HID, VOCAB // 2), "float32"),
                   "lm_second": ((HID, VOCAB // 2), "float32")})
    P["remove"] = (["lm_head.weight -> _", "llama.norm.weight -> norm"],
                   {"norm": ((HID,), "float32")})
    P["fused_qkv_old_merge"] = ([
        f"sep.q, sep.k, sep.v -> old.qkv, fused_qkv_old, num_heads={HEADS}, "
        f"num_key_value_groups={KV}, axis=0"], {"old.qkv": ((QKV, HID), "float32")})
    # Temporaries of a fused macro, then transposed: written out per layer (Paddle expands
    # $LAYER_ID only from stored keys; see chain_layer_id in REFUSED).
    stmts = ["llama.layers.$LAYER_ID.mlp.gate_up_fused_proj.weight -> "
             "tmp.$LAYER_ID.g, tmp.$LAYER_ID.u, fused_ffn"]
    for L in range(LAYERS):
        stmts += [f"tmp.{L}.g^T -> hf.{L}.gate", f"tmp.{L}.u^T -> hf.{L}.up"]
    P["chain_explicit"] = (stmts, {f"hf.{L}.{p}": ((INTER, HID), "float32")
                                   for L in range(LAYERS) for p in ("gate", "up")})
    # Reverse mode (statements in the loading direction, run backwards over this checkpoint).
    P["reverse_rename"] = ({"aoa_statements": [
        "model.layers.$LAYER_ID.self_attn.o_proj.weight -> "
        "llama.layers.$LAYER_ID.self_attn.o_proj.weight"], "aoa_config_reverse": True},
        {f"model.layers.{L}.self_attn.o_proj.weight": ((HEADS * HD, HID), "float32")
         for L in range(LAYERS)})
    # Paddle takes the stored gate_up's degree as 1 here (a documented difference).
    P["reverse_fused_ffn"] = ({"aoa_statements": [
        "m.$LAYER_ID.gate, m.$LAYER_ID.up -> llama.layers.$LAYER_ID.mlp.gate_up_fused_proj.weight, "
        "fused_ffn"], "aoa_config_reverse": True},
        {f"m.{L}.{p}": ((HID, INTER), "float32") for L in range(LAYERS) for p in ("gate", "up")})
    P["reversible_cast"] = (
        ["llama.norm.weight -> norm.half, src_dtype='float32', dst_dtype='float16'"],
        {"norm.half": ((HID,), "float16")})
    # Two casts of one stored tensor: Paddle keys the postprocess by the source slice, so the
    # second cast wins for both destinations, and norm.bf16 receives norm.half's float16 bit
    # patterns (a documented difference; fc casts each).
    P["two_casts_one_source"] = ([
        "llama.norm.weight -> norm.bf16, dtype='bfloat16'",
        "llama.norm.weight -> norm.half, src_dtype='float32', dst_dtype='float16'"],
        {"norm.bf16": ((HID,), "bfloat16"), "norm.half": ((HID,), "float16")})
    dests = {"norm.bf16": ((HID,), "bfloat16"), "lm_head.f16": ((HID, VOCAB), "float16")}
    for L in range(LAYERS):
        dests[f"ln.{L}.f32"] = ((HID,), "float32")
    P["casts"] = ([
        "llama.norm.weight -> norm.bf16, dtype='bfloat16'",
        "lm_head.weight -> lm_head.f16, dtype='float16'",
        "llama.layers.$LAYER_ID.input_layernorm.weight -> ln.$LAYER_ID.f32, dtype='float32'"],
        dests)
    return P


def single_aoa_programs():
    """Programs over single_pickle (AdamW states follow their parameter)."""
    return {"optimizer_states": (["fc.weight^T -> fc_t"], {
        "fc_t": ((100, 6), "float32"), "fc_t.moment1_0": ((100, 6), "float32"),
        "fc_t.moment2_0": ((100, 6), "float32")})}


# Programs fc refuses (exit 3) or extends, with what the real Paddle does with them:
# {name: (statements, dests, outcome)}; outcome "ok" (Paddle loads; its output is kept as
# <name>.safetensors), "zeros" (loads, leaves these dests zero), or an exception type and a
# piece of its message. Checked at every regeneration (a change of Paddle's behaviour fails it).
def refused_programs():
    qkv = "llama.layers.$LAYER_ID.self_attn.qkv_proj.weight"
    return {
        # A placeholder that matches nothing: Paddle ignores the statement.
        "no_match": (["nothing.$LAYER_ID.w -> x.$LAYER_ID.w", "llama.norm.weight -> norm"],
                     {"norm": ((HID,), "float32")}, "ok"),
        # Removing a name after a statement used it: Paddle drops every read of it.
        "remove_after_use": (["lm_head.weight -> lm_t, permute='[1, 0]'", "lm_head.weight -> _"],
                             {"lm_t": ((VOCAB, HID), "float32")}, "zeros"),
        # A TP degree (2) that does not divide num_key_value_groups (1).
        "degree_not_dividing": ([
            f"{qkv} -> q.$LAYER_ID, k.$LAYER_ID, v.$LAYER_ID, fused_qkv_old, num_heads={HEADS}, "
            "num_key_value_groups=1"],
            {f"{p}.{L}": ((HID, n), "float32") for L in range(LAYERS)
             for p, n in (("q", HEADS * HD), ("k", HD), ("v", HD))},
            ("SyntaxError", "Expected TokenType.IDENTIFIER, got TokenType.COMMA")),
        # Reverse of q, k, v -> D, fused_qkv_old with grouped-query attention: Paddle splits
        # the concatenation of q, k, v into 3 equal pieces; fc's output equals fused_qkv_old.
        "reverse_fused_qkv_old_gqa": ({"aoa_statements": [
            f"m.$LAYER_ID.q, m.$LAYER_ID.k, m.$LAYER_ID.v -> {qkv}, fused_qkv_old, "
            f"num_heads={HEADS}, num_key_value_groups={KV}"], "aoa_config_reverse": True},
            {f"m.{L}.{p}": ((HID, n), "float32") for L in range(LAYERS)
             for p, n in (("q", HEADS * HD), ("k", KV * HD), ("v", KV * HD))},
            ("AssertionError", "is not divisible by the number of right_vars")),
        # $LAYER_ID over temporaries (names no stored key has): fc expands it from the names
        # earlier statements define (an extension); Paddle expands it to nothing and the
        # load finds no source for the destinations. fc's output equals chain_explicit.
        "chain_layer_id": ([
            "llama.layers.$LAYER_ID.mlp.gate_up_fused_proj.weight -> "
            "tmp.$LAYER_ID.g, tmp.$LAYER_ID.u, fused_ffn",
            "tmp.$LAYER_ID.g^T -> hf.$LAYER_ID.gate", "tmp.$LAYER_ID.u^T -> hf.$LAYER_ID.up"],
            {f"hf.{L}.{p}": ((INTER, HID), "float32") for L in range(LAYERS)
             for p in ("gate", "up")}, ("KeyError", "hf.0.gate")),
    }


def relay_programs():
    """Programs whose destination Paddle loads cut over several ranks (a multi-process
    load_state_dict, each rank a ShardedWeight of its block): the fused macros re-lay for the
    destination's degree, the number of distinct offsets of its shards.
    {name: (processes, statements, {dest: (shape, dtype, axis cut in `processes` blocks)})}"""
    gate_up = "llama.layers.$LAYER_ID.mlp.gate_up_fused_proj.weight"
    return {
        # Stored at TP 2 ([gate_r | up_r] per rank), re-laid for TP 3: lcm(2, 3) = 6 pieces
        # of gate and of up, rank r of 3 gets [gate pieces 2r, 2r+1 | up pieces 2r, 2r+1].
        "relay_fused_ffn_tp3": (3, [f"{gate_up} -> relay.$LAYER_ID.gate_up, fused_ffn"],
                                {f"relay.{L}.gate_up": ((HID, 2 * INTER), "float32", 1)
                                 for L in range(LAYERS)}),
        # Merges into destinations cut at TP 2: per rank [Q_r | K_r | V_r] rows, [gate_r | up_r]
        # columns.
        "relay_merge_tp2": (2, [
            f"sep.q, sep.k, sep.v -> relay.qkv, fused_qkv_old, num_heads={HEADS}, "
            f"num_key_value_groups={KV}, axis=0",
            "sep.gate, sep.up -> relay.gate_up, fused_ffn"],
            {"relay.qkv": ((QKV, HID), "float32", 0),
             "relay.gate_up": ((HID, 2 * INTER), "float32", 1)}),
    }


def relay_truth(name):
    """What relay_programs() must give, from aoa_full_tensors() by hand: the ground truth the
    Paddle load is checked against before it becomes an expected value."""
    t = {k: v[1] for k, v in aoa_full_tensors().items()}
    if name == "relay_fused_ffn_tp3":
        out = {}
        for L in range(LAYERS):
            x = t[f"llama.layers.{L}.mlp.gate_up_fused_proj.weight"]
            h = INTER // 2  # stored at TP 2: [gate_0 | up_0 | gate_1 | up_1], h columns each
            gate = np.concatenate([x[:, 0:h], x[:, 2 * h:3 * h]], axis=1)
            up = np.concatenate([x[:, h:2 * h], x[:, 3 * h:4 * h]], axis=1)
            w = INTER // 3
            out[f"relay.{L}.gate_up"] = np.concatenate(
                [np.concatenate([gate[:, r * w:(r + 1) * w], up[:, r * w:(r + 1) * w]], axis=1)
                 for r in range(3)], axis=1)
        return out
    assert name == "relay_merge_tp2", name
    q, k, v = t["sep.q"], t["sep.k"], t["sep.v"]
    qh, kh = HEADS * HD // 2, KV * HD // 2
    qkv = np.concatenate([np.concatenate([q[r * qh:(r + 1) * qh], k[r * kh:(r + 1) * kh],
                                          v[r * kh:(r + 1) * kh]]) for r in range(2)])
    g, u = t["sep.gate"], t["sep.up"]
    h = INTER // 2
    gate_up = np.concatenate([g[:, 0:h], u[:, 0:h], g[:, h:], u[:, h:]], axis=1)
    return {"relay.qkv": qkv, "relay.gate_up": gate_up}


def relay_layout(processes, dests):
    """The fc-layout(5) file of a relay program's destination cut (fc-convert --target-layout)."""
    return {"degrees": {"tp": processes},
            "tensor_parallel": [{"regex": "^" + k.replace(".", "\\.") + "$", "axis": axis}
                                for k, (_, _, axis) in sorted(dests.items())]}


def write_program(aoa_dir, name, stmts):
    """stmts: the statements, or a whole program (dict, e.g. with aoa_config_reverse)."""
    program = stmts if isinstance(stmts, dict) else {"aoa_statements": stmts}
    with open(os.path.join(aoa_dir, name + ".json"), "w") as f:
        json.dump(program, f, indent=1)
        f.write("\n")
    return program


def run_refused(ckpt, aoa_dir):
    for name, (stmts, dests, outcome) in refused_programs().items():
        program = write_program(aoa_dir, name, stmts)
        try:
            got = paddle_load_aoa(ckpt, program, dests)
            err = None
        except Exception as e:  # what Paddle raises is the point here
            got, err = None, (type(e).__name__, str(e))
        record = {"program": program}
        if outcome in ("ok", "zeros"):
            assert err is None, f"refused {name}: Paddle now raises {err}"
            if outcome == "zeros":
                assert all(not a.any() for _, a in got.values()), f"{name}: Paddle now loads"
            record["paddle"] = outcome
            write_st(got, os.path.join(aoa_dir, name + ".safetensors"))
        else:
            assert err is not None and err[0] == outcome[0] and outcome[1] in err[1], \
                f"refused {name}: Paddle gave {err or 'no error'}, expected {outcome}"
            record["paddle"] = "error"
            record["error"] = f"{err[0]}: {err[1]}"
        with open(os.path.join(aoa_dir, name + ".paddle.json"), "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


# ---- single process ----
def single(out):
    import paddle.distributed as dist
    _, state = single_state()
    truth = {k: (v[1], v[0]) for k, v in ((k, local_of(v)) for k, v in state.items())}
    for case, st in (("single_pickle", False), ("single_safetensors", True)):
        ckpt = os.path.join(out, case, "ckpt")
        dist.save_state_dict(state, ckpt, safetensors=st)
        got = paddle_load_full(ckpt, st)
        same(got, truth, case)
        write_st(got, os.path.join(out, case, "expected.safetensors"))


# ---- 2 ranks (paddle.distributed.launch) ----
def gather_pieces(state):
    """All ranks' local pieces of state, on every rank: {key: [piece, ...]}."""
    import paddle.distributed as dist
    mine = {}
    for k, v in state.items():
        if hasattr(v, "is_dist") and v.is_dist():
            from paddle.distributed.flex_checkpoint.dcp.utils import \
                compute_local_shape_and_global_offset
            lshape, off = compute_local_shape_and_global_offset(v.shape, v.process_mesh,
                                                                v.placements)
            mine[k] = (np_of(v._local_value()), dtype_name(v), tuple(off), tuple(lshape),
                       tuple(v.shape), None)
        else:
            mine[k] = local_of(v)
    everyone = []
    dist.all_gather_object(everyone, mine)
    pieces = {}
    for m in everyone:
        for k, p in m.items():
            pieces.setdefault(k, []).append(p)
    return pieces


def worker_two_ranks(out):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight
    rank = dist.get_rank()
    mesh = dist.ProcessMesh([0, 1], dim_names=["x"])
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal((5, 4), dtype=np.float32)
    w1 = rng.standard_normal((3, 5), dtype=np.float32)
    rep = rng.standard_normal((3,), dtype=np.float32)
    b = rng.standard_normal((6, 3), dtype=np.float32)
    state = {
        "rows.w": dist.shard_tensor(paddle.to_tensor(w0), mesh, [dist.Shard(0)]),
        "cols.w": dist.shard_tensor(paddle.to_tensor(w1), mesh, [dist.Shard(1)]),
        "rep.b": dist.shard_tensor(paddle.to_tensor(rep), mesh, [dist.Replicate()]),
        "half.bf16": ShardedWeight("half.bf16",
                                   paddle.to_tensor(b[3 * rank:3 * rank + 3]).astype("bfloat16"),
                                   (3, 3), (6, 3), (3 * rank, 0)),
    }
    pieces = gather_pieces(state)
    for case, st in (("two_ranks", False), ("two_ranks_safetensors", True)):
        dist.save_state_dict(state, os.path.join(out, case, "ckpt"), safetensors=st)
        dist.barrier()
    if rank == 0:
        write_st(assemble(pieces), os.path.join(out, "two_ranks", "truth.safetensors"))


def patch_for_cpu_sharding():
    import paddle
    import paddle.distributed.fleet.utils.tensor_fusion_helper as tfh
    tfh.alignment["unknown"] = 256

    class Done:
        def wait(self):
            pass

        def is_completed(self):
            return True

    def reduce_scatter(output, input, op=None, group=None, sync_op=True):
        full = input.clone()
        paddle.distributed.all_reduce(full, op=op, group=group)
        n = output._numel()
        r = max(group.rank, 0)
        paddle.assign(full.flatten()[r * n:(r + 1) * n].reshape(output.shape), output)
        return Done()

    paddle.distributed.reduce_scatter = reduce_scatter


def worker_zero(out):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet
    patch_for_cpu_sharding()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1,
                               "sharding_degree": 2}
    strategy.hybrid_configs["sharding_configs"].split_param = True
    fleet.init(is_collective=True, strategy=strategy)
    paddle.seed(1234)
    model = tiny_model()
    opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    dmodel = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(opt)
    train_one_step(dmodel, opt)
    msd = model.sharded_state_dict()
    state = dict(msd)
    state.update(opt.sharded_state_dict(msd))
    assert any(v.is_flattened and (v.flattened_range.start > 0 or
                                   v.flattened_range.stop < int(np.prod(v.local_shape)))
               for v in state.values()), "no flattened shard cut inside a parameter"
    pieces = gather_pieces(state)
    dist.save_state_dict(state, os.path.join(out, "zero_sharding", "ckpt"))
    dist.barrier()
    if dist.get_rank() == 0:
        write_st(assemble(pieces), os.path.join(out, "zero_sharding", "truth.safetensors"))


def worker_aoa(out):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight
    rank = dist.get_rank()
    state = {}
    for key, (dt, full, axis) in aoa_full_tensors().items():
        if axis is None:
            state[key] = paddle.to_tensor(full).astype(dt)
            continue
        n = full.shape[axis] // 2
        sl = [slice(None)] * full.ndim
        sl[axis] = slice(rank * n, rank * n + n)
        off = [0] * full.ndim
        off[axis] = rank * n
        local = np.ascontiguousarray(full[tuple(sl)])
        state[key] = ShardedWeight(key, paddle.to_tensor(local).astype(dt), local.shape,
                                   full.shape, tuple(off))
    pieces = gather_pieces(state)
    # Replicated whole tensors are listed by both ranks; save_state_dict stores them once.
    dist.save_state_dict(state, os.path.join(out, "aoa_tp2", "ckpt"))
    dist.barrier()
    if rank == 0:
        write_st(assemble({k: p[:1] if p[0][3] == p[0][4] else p for k, p in pieces.items()}),
                 os.path.join(out, "aoa_tp2", "truth.safetensors"))


def worker_relay(out):
    """One rank of the multi-process AOA loads of relay_programs(): loads aoa_tp2/ckpt into
    this rank's block of every destination, writes it to relay/<name>.rank<R>.safetensors."""
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.flex_checkpoint.dcp import load_state_dict as lsd
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight
    rank, world = dist.get_rank(), dist.get_world_size()
    relay_dir = os.path.join(out, "aoa_tp2", "relay")
    # CPU patch (this worker only): every communicator of the multi-process load
    # (reshard_comm.py, "broadcast" by default) moves each piece to the GPU first with
    # Tensor.cuda(), which on the CPU wheel raises "ValueError: No available device found.";
    # here it returns the CPU tensor itself, which gloo broadcasts.
    paddle.Tensor.cuda = lambda self, *args, **kwargs: self
    for name, (processes, stmts, dests) in relay_programs().items():
        if processes != world:
            continue
        lsd._metadata_manager.clear()
        state = {}
        for key, (shape, dt, axis) in dests.items():
            n = shape[axis] // world
            local = list(shape)
            local[axis] = n
            off = [0] * len(shape)
            off[axis] = rank * n
            state[key] = ShardedWeight(key=key, local_tensor=paddle.zeros(local, dtype=dt),
                                       local_shape=tuple(local), global_shape=tuple(shape),
                                       global_offset=tuple(off))
        dist.load_state_dict(state, os.path.join(out, "aoa_tp2", "ckpt"),
                             aoa_config={"aoa_statements": stmts})
        write_st({k: (dtype_name(v.local_tensor), np_of(v.local_tensor))
                  for k, v in state.items()},
                 os.path.join(relay_dir, f"{name}.rank{rank}.safetensors"))
        dist.barrier()


def relay_expected(out):
    """relay/<name>.json (program), .layout.json (fc-layout of the cut) and .safetensors:
    the ranks' blocks put together along the cut axis."""
    relay_dir = os.path.join(out, "aoa_tp2", "relay")
    for name, (processes, stmts, dests) in relay_programs().items():
        write_program(relay_dir, name, stmts)
        with open(os.path.join(relay_dir, name + ".layout.json"), "w") as f:
            json.dump(relay_layout(processes, dests), f, indent=1)
            f.write("\n")
        blocks = [read_st(os.path.join(relay_dir, f"{name}.rank{r}.safetensors"))
                  for r in range(processes)]
        full = {}
        for key, (shape, _, axis) in dests.items():
            dt = {v: k for k, v in ST_NAMES.items()}[blocks[0][key][0]]
            full[key] = (dt, np.concatenate([b[key][1] for b in blocks], axis=axis))
            assert full[key][1].shape == tuple(shape), (name, key, full[key][1].shape)
            assert full[key][1].any(), f"relay {name}: Paddle loaded nothing into {key}"
        same({k: (d, a) for k, (d, a) in full.items()},
             {k: ("float32", a) for k, a in relay_truth(name).items()}, "relay " + name)
        write_st(full, os.path.join(relay_dir, name + ".safetensors"))
        for r in range(processes):
            os.remove(os.path.join(relay_dir, f"{name}.rank{r}.safetensors"))


def worker(out):
    import paddle.distributed as dist
    what = os.environ["FC_PADDLE_WORKER"]
    if what != "zero":
        dist.init_parallel_env()
    {"two": worker_two_ranks, "zero": worker_zero, "aoa": worker_aoa,
     "relay": worker_relay}[what](out)


def launch(out, what, processes=2):
    env = dict(os.environ, OMP_NUM_THREADS="1", FC_PADDLE_WORKER=what)
    log = os.path.join(out, f".launch-{what}-{processes}")
    p = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                        str(processes),
                        "--log_dir", log,
                        os.path.abspath(__file__), "--worker", out],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        logs = ""
        for f in sorted(os.listdir(log)) if os.path.isdir(log) else []:
            logs += f"--- {f}\n" + open(os.path.join(log, f), errors="replace").read()[-4000:]
        raise SystemExit(f"paddle.distributed.launch ({what}) failed: exit {p.returncode}\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}\n{logs}")
    shutil.rmtree(log, ignore_errors=True)


def expected_after_launch(out):
    for case in ("two_ranks", "two_ranks_safetensors", "zero_sharding", "aoa_tp2"):
        src = "two_ranks" if case.startswith("two_ranks") else case
        truth_path = os.path.join(out, src, "truth.safetensors")
        truth = read_st(truth_path)
        got = paddle_load_full(os.path.join(out, case, "ckpt"), case in SAFETENSORS_CASES)
        same(got, truth, case)
        write_st(got, os.path.join(out, case, "expected.safetensors"))
    for src in ("two_ranks", "zero_sharding", "aoa_tp2"):
        os.remove(os.path.join(out, src, "truth.safetensors"))
    aoa_dir = os.path.join(out, "aoa_tp2", "aoa")
    os.makedirs(aoa_dir, exist_ok=True)
    ckpt = os.path.join(out, "aoa_tp2", "ckpt")
    for name, (stmts, dests) in aoa_programs().items():
        program = write_program(aoa_dir, name, stmts)
        got = paddle_load_aoa(ckpt, program, dests)
        write_st(got, os.path.join(aoa_dir, name + ".safetensors"))
    refused = os.path.join(out, "aoa_tp2", "refused")
    os.makedirs(refused, exist_ok=True)
    run_refused(ckpt, refused)
    aoa_dir = os.path.join(out, "single_pickle", "aoa")
    os.makedirs(aoa_dir, exist_ok=True)
    for name, (stmts, dests) in single_aoa_programs().items():
        program = write_program(aoa_dir, name, stmts)
        got = paddle_load_aoa(os.path.join(out, "single_pickle", "ckpt"), program, dests)
        write_st(got, os.path.join(aoa_dir, name + ".safetensors"))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    out = os.path.abspath(sys.argv[1])
    for case in CASES:
        shutil.rmtree(os.path.join(out, case), ignore_errors=True)
        os.makedirs(os.path.join(out, case))
    import paddle
    paddle.set_device("cpu")
    single(out)
    launch(out, "two")
    launch(out, "zero")
    launch(out, "aoa")
    expected_after_launch(out)
    os.makedirs(os.path.join(out, "aoa_tp2", "relay"), exist_ok=True)
    for processes in sorted({p for p, _, _ in relay_programs().values()}):
        launch(out, "relay", processes)
    relay_expected(out)
    import safetensors
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({"paddlepaddle": paddle.__version__, "numpy": np.__version__,
                   "safetensors": safetensors.__version__,
                   "python": platform.python_version()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
