#!/usr/bin/env python3
"""Write a torch DCP checkpoint as Megatron-Core 0.8 to 0.13's torch_dist saves a bf16 model and
its distributed optimizer in the fully_sharded_model_space form, at TP 2 x DP 2 (rank =
dp * 2 + tp): a real multi-rank save by Debian's torch 1.13 (shared fixture writer), then the
metadata's mcore_data attribute added as Megatron's MCoreSavePlanner adds it.

Model weights: embedding.word_embeddings.weight [8, 4] (TP split on axis 0),
decoder.layers.mlp.linear_fc1.weight [2, 6, 4] (2 layers stacked on a prepended axis, TP split
on axis 1), decoder.final_layernorm.weight [4] (replicated). The optimizer states
optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key> are "N-D reformulated"
(dist_checkpointing/strategies/torch.py before 0.14): DCP shape axis_fragmentations + (fragment
numel,), each DP rank's flattened range of a fragment one chunk at (fragment index..., range
start) of sizes (1, ..., 1, range length), ranges cutting rows; mcore_data[key] =
{"nd_reformulated_orig_global_shape": original shape}. common.pt: iteration and step 44,
sharding type fully_sharded_model_space.

OUT_DIR/megatron_flattened/expected/<key>.npy holds every tensor in its ORIGINAL shape (the
optimizer states put back from their fragments), what a reader must give.

usage: /usr/bin/python3 make_megatron_flattened.py SHARED_TOOLS_DIR OUT_DIR
"""
import json, os, pickle, sys, tempfile
sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402
import torch_dcp_fixture as fixture  # noqa: E402
import torch  # noqa: E402
import torch.distributed._shard.checkpoint  # noqa: E402,F401  (classes for pickle.load)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fsdp_adam import write_megatron_common  # noqa: E402

TP, DP = 2, 2
# key: (original shape, fragments per axis, rank of each TP fragment along the TP axis or
#       None when replicated, DP cut of a fragment's flattened range)
PARAMS = {
    "embedding.word_embeddings.weight": ([8, 4], [2, 1], 10),
    "decoder.layers.mlp.linear_fc1.weight": ([2, 6, 4], [2, 2, 1], 5),
    "decoder.final_layernorm.weight": ([4], [1], 2),
}
STATES = ("fp32_param", "exp_avg", "exp_avg_sq")


def fragments(frags):
    out = [[]]
    for f in frags:
        out = [o + [i] for o in out for i in range(f)]
    return out


def tp_of(key, frag):
    """The TP rank that holds fragment `frag` of `key` (0 for a replicated param)."""
    if key == "embedding.word_embeddings.weight":
        return frag[0]
    if key == "decoder.layers.mlp.linear_fc1.weight":
        return frag[1]
    return 0


def spec():
    tensors = []
    for key, (shape, frags, cut) in PARAMS.items():
        local = [s // f for s, f in zip(shape, frags)]
        chunks = []
        for frag in fragments(frags):
            chunks.append([tp_of(key, frag), [c * l for c, l in zip(frag, local)], local])
        tensors.append({"name": key, "shape": shape, "dtype": "bfloat16", "chunks": chunks})
        numel = int(np.prod(local))
        for state in STATES:
            chunks = []
            for frag in fragments(frags):
                tp = tp_of(key, frag)
                for dp, (lo, hi) in enumerate(((0, cut), (cut, numel))):
                    chunks.append([dp * TP + tp, frag + [lo], [1] * len(frag) + [hi - lo]])
            tensors.append({"name": f"optimizer.state.{state}.{key}", "shape": frags + [numel],
                            "dtype": "float32", "chunks": chunks})
    return {"world": TP * DP, "seed": 37, "tensors": tensors,
            "objects": {"rng_state/shard_0.0_1.4": 7}}


def main():
    out = os.path.join(sys.argv[2], "megatron_flattened")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec(), f)
    try:
        sys.argv = [sys.argv[0], f.name, out]
        fixture.main()
    finally:
        os.unlink(f.name)
    ckpt = os.path.join(out, "ckpt")
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = pickle.load(f)
    md.mcore_data = {f"optimizer.state.{state}.{key}":
                     {"nd_reformulated_orig_global_shape": tuple(shape)}
                     for key, (shape, _, _) in PARAMS.items() for state in STATES}
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    write_megatron_common(ckpt, "fully_sharded_model_space", 44)
    # The expected optimizer states in their original shapes.
    expected = os.path.join(out, "expected")
    for key, (shape, frags, _) in PARAMS.items():
        local = [s // f for s, f in zip(shape, frags)]
        for state in STATES:
            name = f"optimizer.state.{state}.{key}"
            stored = np.load(os.path.join(expected, name + ".npy"))
            full = np.zeros(shape, np.float32)
            for frag in fragments(frags):
                box = tuple(slice(c * l, (c + 1) * l) for c, l in zip(frag, local))
                full[box] = stored[tuple(frag)].reshape(local)
            np.save(os.path.join(expected, name + ".npy"), full)
    check_truth(out)
    print("wrote", out, "(expected/ equal to the spec's values in their original shapes)")


def original(stored, shape, frags):
    """The original-shape tensor of an N-D reformulated one, element by element: element i of
    the original lies in fragment i // local, at position ravel(i % local) of that fragment's
    flattened range (what nd_reformulated_orig_global_shape means)."""
    local = np.array(shape) // np.array(frags)
    idx = np.indices(shape).reshape(len(shape), -1)
    frag = idx // local[:, None]
    pos = np.ravel_multi_index(tuple(idx % local[:, None]), tuple(local))
    return stored[tuple(frag) + (pos,)].reshape(shape)


def check_truth(out):
    """Ground truth (issue 34 item 3): the spec's seeded draws, redrawn by dcp_truth. The
    checkpoint (read back by dcp_truth's own reader) holds them as drawn; expected/ holds the
    model weights as drawn and the optimizer states in their original shapes by original()
    (apart from main()'s fragment boxes)."""
    import dcp_truth
    sp = spec()
    drawn = dcp_truth.spec_truth(sp)
    dcp_truth.assert_checkpoint(os.path.join(out, "ckpt"), drawn, sp["objects"])
    truth = {}
    for key, (shape, frags, _) in PARAMS.items():
        truth[key] = drawn[key]
        for state in STATES:
            name = f"optimizer.state.{state}.{key}"
            truth[name] = torch.from_numpy(original(drawn[name].numpy(), shape, frags))
    dcp_truth.assert_expected(os.path.join(out, "expected"), truth)


if __name__ == "__main__":
    main()
