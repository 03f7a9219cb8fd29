#!/usr/bin/env python3
"""Write a torch DCP checkpoint as Megatron-Core 0.14+'s torch_dist saves a bf16 GPT and its
distributed optimizer in the dp_reshardable form (the default of 0.14/0.15), at TP 2 x DP 2
(global rank = dp * 2 + tp): a real multi-rank save by Debian's torch 1.13 (shared fixture
writer), values computed here.

Model (Transformer-Engine names, SwiGLU, 2 layers stacked on a prepended axis, untied output):
  embedding.word_embeddings.weight                 [16, 8]      TP split on axis 0
  decoder.layers.self_attention.linear_proj.weight [2, 8, 8]    TP split on axis 2
  decoder.layers.self_attention.linear_qkv.layer_norm_weight [2, 8]  replicated
  decoder.layers.self_attention.linear_qkv.weight  [2, 24, 8]   TP split on axis 1
  decoder.layers.mlp.linear_fc1.layer_norm_weight  [2, 8]       replicated, every element of both
                                                                layers 1.0 in bf16 (the masters
                                                                differ): only the layer order
                                                                tells them apart
  decoder.layers.mlp.linear_fc1.weight             [2, 24, 8]   SwiGLU: gate rows [0, 12), up
                                                                rows [12, 24); TP rank t holds
                                                                gate [6t, 6t+6) + up [12+6t, ..)
                                                                as one [12, 8] param, saved as
                                                                two chunks (Megatron's factory)
  decoder.layers.mlp.linear_fc2.weight             [2, 8, 12]   TP split on axis 2
  decoder.final_layernorm.weight                   [8]          replicated
  output_layer.weight                              [16, 8]      TP split on axis 0

The optimizer (per TP rank t, dp_group_idx_t): the params in the REVERSE of named_parameters()
order laid into a buffer (each start padded to 64 elements, a bucket closed once it holds 400
elements or more, bucket ends padded to lcm(DP, 128)), each DP rank owning an even share of
every bucket. Saved as Megatron's sharded_param_state_dp_reshardable saves it: per bucket b,
tensors optimizer.distributed.dp_group_idx_<t>.gbuf_idx_0.dtype_(torch.bfloat16,
torch.float32).bucket_idx_<b>.{param,exp_avg,exp_avg_sq} of the bucket's unpadded length,
one chunk per param piece and per padding gap in each DP rank's share (the gaps hold garbage,
12345.0). The bf16 weights are the fp32 masters rounded to nearest even. The replicated params'
masters are the same on both TP ranks, their moments are not (TP rank 1's are 1.0 larger):
a reader must take TP rank 0's, as Megatron's fully_reshardable form would.

A second checkpoint, megatron_dp_buckets_aligned, is the same with linear_fc1.weight [2, 32, 8]
and linear_fc2.weight [2, 8, 16]: each fc1 half is then 64 elements, and a DP share ends exactly
between them, so a piece holds SwiGLU's gate rows alone (where megatron_dp_buckets has a piece
that holds the end of the gate rows and the start of the up rows).

A third, megatron_dp_zero, holds the same optimizer in the dp_zero_gather_scatter form (Megatron-
Core 0.8-0.13 without fully parallel save): per TP rank one ShardedObject
optimizer.distributed.dp_group_idx_<t>.param_state, the dict get_parameter_state_dp_zero
returns ({"buckets_coalesced": True, 0: {(torch.bfloat16, torch.float32): {"param", "exp_avg",
"exp_avg_sq": the buckets' unpadded parts back to back, gaps zero; "numel_unpadded"}}}).

OUT_DIR/<name>/expected/<key>.npy: the model weights and
optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key> in the model's global shapes (bfloat16
as uint16 bit patterns), what a reader mapping the buckets must give. common.pt: iteration and
step 45, sharding type dp_reshardable.

usage: /usr/bin/python3 make_megatron_dp_buckets.py SHARED_TOOLS_DIR OUT_DIR
"""
import json, math, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402
import torch_dcp_fixture as fixture  # noqa: E402
import torch  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fsdp_adam import write_megatron_common  # noqa: E402

TP, DP, L = 2, 2, 2
ALIGN, BUCKET_SIZE, GARBAGE = 64, 400, 12345.0
STATES = ("param", "exp_avg", "exp_avg_sq")
OUT_STATE = {"param": "fp32_param", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
# key: (global shape, TP axis or None (replicated) or "swiglu", layer-stacked)
KEYS = {
    "embedding.word_embeddings.weight": ([16, 8], 0, False),
    "decoder.layers.self_attention.linear_proj.weight": ([L, 8, 8], 2, True),
    "decoder.layers.self_attention.linear_qkv.layer_norm_weight": ([L, 8], None, True),
    "decoder.layers.self_attention.linear_qkv.weight": ([L, 24, 8], 1, True),
    "decoder.layers.mlp.linear_fc1.layer_norm_weight": ([L, 8], None, True),
    "decoder.layers.mlp.linear_fc1.weight": ([L, 24, 8], "swiglu", True),
    "decoder.layers.mlp.linear_fc2.weight": ([L, 8, 12], 2, True),
    "decoder.final_layernorm.weight": ([8], None, False),
    "output_layer.weight": ([16, 8], 0, False),
}
# named_parameters() order of one TP rank's model: (key, layer or None)
LAYER_KEYS = ["decoder.layers.self_attention.linear_proj.weight",
              "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
              "decoder.layers.self_attention.linear_qkv.weight",
              "decoder.layers.mlp.linear_fc1.layer_norm_weight",
              "decoder.layers.mlp.linear_fc1.weight",
              "decoder.layers.mlp.linear_fc2.weight"]
ORDER = ([("embedding.word_embeddings.weight", None)]
         + [(k, layer) for layer in range(L) for k in LAYER_KEYS]
         + [("decoder.final_layernorm.weight", None), ("output_layer.weight", None)])
BUCKET = ("optimizer.distributed.dp_group_idx_{t}.gbuf_idx_0.dtype_(torch.bfloat16, "
          "torch.float32).bucket_idx_{b}")


def bf16(a):
    """fp32 -> bf16 round to nearest even, returned as fp32 values."""
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16).float().numpy()


def boxes(key, layer, t):
    """The local param of TP rank t as a list of (offset, size) boxes of the global tensor
    (two for SwiGLU's fc1: its gate rows, then its up rows)."""
    shape, axis, stacked = KEYS[key]
    off, size = [0] * len(shape), list(shape)
    if stacked:
        off[0], size[0] = layer, 1
    if axis is None:
        return [(off, size)]
    if axis == "swiglu":
        half = shape[1] // 2 // TP
        gate, up = list(off), list(off)
        gate[1], up[1] = t * half, shape[1] // 2 + t * half
        size[1] = half
        return [(gate, list(size)), (up, list(size))]
    size[axis] = shape[axis] // TP
    off[axis] = t * size[axis]
    return [(off, size)]


def numel(bs):
    return sum(int(np.prod(s)) for _, s in bs)


def sl(off, size):
    return tuple(slice(o, o + s) for o, s in zip(off, size))


def layout(t):
    """[(key, layer, boxes, bucket, start in bucket)], per-bucket unpadded and padded sizes."""
    placed, unpadded, padded = [], [], []
    bucket_start = start = 0
    unit = math.lcm(DP, 128)
    for key, layer in reversed(ORDER):
        bs = boxes(key, layer, t)
        start = -(-start // ALIGN) * ALIGN
        end = start + numel(bs)
        placed.append((key, layer, bs, len(unpadded), start - bucket_start))
        if end - bucket_start >= BUCKET_SIZE:
            unpadded.append(end - bucket_start)
            padded.append(-(-(end - bucket_start) // unit) * unit)
            bucket_start = start = bucket_start + padded[-1]
        else:
            start = end
    if placed[-1][3] == len(unpadded):
        unpadded.append(end - bucket_start)
        padded.append(-(-(end - bucket_start) // unit) * unit)
    return placed, unpadded, padded


def pieces(placed, b, unpadded, padded):
    """The chunks of bucket b as Megatron saves them: [(rank's DP index, start, length)]."""
    share = padded // DP
    spans = sorted((s, s + numel(bs)) for _, _, bs, bb, s in placed if bb == b)
    out = []
    for r in range(DP):
        lo, hi = r * share, (r + 1) * share
        local = [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]
        assert local, "a DP share without params (Megatron asserts too)"
        cur = lo
        for s, e in local + [(hi, hi)]:
            if s != cur and cur < unpadded:  # padding before the next param (or the share end)
                out.append((r, cur, s - cur))
            if s < e:
                out.append((r, s, e - s))
            cur = e
    return out


def main(fixture_name, form="dp_reshardable"):
    rng = np.random.default_rng(41)
    values, tensors, expected = {}, [], {}
    master = {k: rng.standard_normal(s).astype(np.float32) for k, (s, _, _) in KEYS.items()}
    ln = "decoder.layers.mlp.linear_fc1.layer_norm_weight"
    master[ln] = (1.0 + rng.uniform(-1e-3, 1e-3, KEYS[ln][0])).astype(np.float32)
    moments = {k: (rng.standard_normal(s).astype(np.float32) * 1e-3,
                   rng.uniform(1e-8, 1e-6, s).astype(np.float32)) for k, (s, _, _) in KEYS.items()}
    for key, (shape, axis, stacked) in KEYS.items():
        values[key] = bf16(master[key])
        chunks = []
        for t in range(TP if axis is not None else 1):
            for layer in (range(L) if stacked else [None]):
                for off, size in boxes(key, layer, t):
                    chunks.append([t, off, size])
        tensors.append({"name": key, "shape": shape, "dtype": "bfloat16", "chunks": chunks})
        expected["optimizer.state.fp32_param." + key] = master[key]
        expected["optimizer.state.exp_avg." + key] = moments[key][0]
        expected["optimizer.state.exp_avg_sq." + key] = moments[key][1]
    objects = {"rng_state/shard_0.0_1.4": 7}
    for t in range(TP):
        placed, unpadded, padded = layout(t)
        coalesced = {s: [] for s in STATES}
        for b in range(len(unpadded)):
            gap = GARBAGE if form == "dp_reshardable" else 0.0  # dp_zero gathers into zeros
            flat = {s: np.full(unpadded[b], gap, np.float32) for s in STATES}
            for key, layer, bs, bb, start in placed:
                if bb != b:
                    continue
                replicated = KEYS[key][1] is None
                for s, src in zip(STATES, (master[key],) + moments[key]):
                    parts = [src[sl(o, z)].reshape(-1) for o, z in bs]
                    v = np.concatenate(parts)
                    if s != "param" and replicated and t == 1:
                        v = v + 1.0
                    flat[s][start:start + v.size] = v
            for s in STATES:
                coalesced[s].append(flat[s])
            if form != "dp_reshardable":
                continue
            for s in STATES:
                name = BUCKET.format(t=t, b=b) + "." + s
                values[name] = flat[s]
                tensors.append({"name": name, "shape": [unpadded[b]], "dtype": "float32",
                                "chunks": [[r * TP + t, [lo], [n]]
                                           for r, lo, n in pieces(placed, b, unpadded[b],
                                                                  padded[b])]})
        if form == "dp_reshardable":
            group = f"optimizer.distributed.dp_group_idx_{t}."
            objects[group + "per_bucket_numel/shard_0_1"] = padded
            objects[group + "per_bucket_numel_unpadded/shard_0_1"] = unpadded
        else:
            # get_parameter_state_dp_zero's dict, one ShardedObject per TP x PP group
            for st in STATES:
                values[f"dp_zero.{t}.{st}"] = np.concatenate(coalesced[st])
            objects[f"optimizer.distributed.dp_group_idx_{t}.param_state/shard_0_1"] = \
                {"__dp_zero__": t, "numel_unpadded": int(sum(unpadded))}
    out = os.path.join(OUT_ROOT, fixture_name)
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(os.path.join(tmp, "values.npz"), **{k.replace("/", "|"): v
                                                     for k, v in values.items()})
        os.environ["FC_FIXTURE_VALUES"] = os.path.join(tmp, "values.npz")
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump({"world": TP * DP, "seed": 0, "tensors": tensors, "objects": objects}, f)
        sys.argv = [ARGV0, spec_path, out]
        fixture.main()
    ckpt = os.path.join(out, "ckpt")
    write_megatron_common(ckpt, form if form == "dp_reshardable" else "dp_zero_gather_scatter",
                          45)
    exp_dir = os.path.join(out, "expected")
    for name in os.listdir(exp_dir):  # the flat buckets are not what a reader must give
        if name.startswith("optimizer.distributed."):
            os.unlink(os.path.join(exp_dir, name))
    for name, v in expected.items():
        np.save(os.path.join(exp_dir, name + ".npy"), v)
    check_truth(exp_dir, master, moments)
    print("wrote", out, "(expected/ equal to the masters, moments and their bf16 roundings)")


def nearest_bf16(a):
    """fp32 -> bfloat16, the nearest of the two bfloat16 neighbours by distance, ties to the
    even one (apart from bf16(), which lets torch round)."""
    a = np.ascontiguousarray(a, np.float32)
    down = a.view(np.uint32) & np.uint32(0xFFFF0000)  # toward zero
    up = down + np.uint32(0x10000)                     # away from zero (finite values here)
    d_down = np.abs(a.astype(np.float64) - down.view(np.float32).astype(np.float64))
    d_up = np.abs(a.astype(np.float64) - up.view(np.float32).astype(np.float64))
    even_down = ((down >> 16) & 1) == 0
    pick = np.where((d_up < d_down) | ((d_up == d_down) & ~even_down), up, down)
    return torch.from_numpy((pick >> 16).astype(np.uint16).view(np.int16)).view(torch.bfloat16)


def check_truth(exp_dir, master, moments):
    """Ground truth (issue 34 item 3): expected/ holds exactly every model weight as its fp32
    master rounded to the nearest bfloat16 and the masters and moments as drawn (the
    replicated params' moments of TP rank 0), whatever the buckets made of them."""
    import dcp_truth
    truth = {}
    for key in KEYS:
        truth[key] = nearest_bf16(master[key])
        for state, v in (("fp32_param", master[key]), ("exp_avg", moments[key][0]),
                         ("exp_avg_sq", moments[key][1])):
            truth[f"optimizer.state.{state}.{key}"] = torch.from_numpy(v)
    dcp_truth.assert_expected(exp_dir, truth)


def _full_value(t, seed):
    """The fixture writer's value hook: this file's values (spawned ranks re-import it)."""
    with np.load(os.environ["FC_FIXTURE_VALUES"]) as z:
        v = torch.from_numpy(np.array(z[t["name"].replace("/", "|")]))
    return v.to(getattr(torch, t["dtype"]))


fixture.full_value = _full_value
_save_state_dict = fixture.dcp.save_state_dict


def _save_with_dp_zero(sd, writer):
    """The writer's save hook: a {"__dp_zero__": t} object becomes the dict Megatron's
    get_parameter_state_dp_zero returns for TP rank t (buckets coalesced, one fp32 tensor per
    state of its one buffer)."""
    for key, v in list(sd.items()):
        if isinstance(v, dict) and "__dp_zero__" in v:
            t = v["__dp_zero__"]
            with np.load(os.environ["FC_FIXTURE_VALUES"]) as z:
                states = {st: torch.from_numpy(np.array(z[f"dp_zero.{t}.{st}"])) for st in STATES}
            states["numel_unpadded"] = v["numel_unpadded"]
            sd[key] = {"buckets_coalesced": True, 0: {(torch.bfloat16, torch.float32): states}}
    return _save_state_dict(sd, writer)


fixture.dcp.save_state_dict = _save_with_dp_zero

if __name__ == "__main__":
    ARGV0, OUT_ROOT = sys.argv[0], sys.argv[2]
    main("megatron_dp_buckets")
    KEYS["decoder.layers.mlp.linear_fc1.weight"] = ([L, 32, 8], "swiglu", True)
    KEYS["decoder.layers.mlp.linear_fc2.weight"] = ([L, 8, 16], 2, True)
    main("megatron_dp_buckets_aligned")
    main("megatron_dp_zero", "dp_zero")
