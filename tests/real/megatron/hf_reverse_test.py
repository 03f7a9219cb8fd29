"""fc-convert --from-hf-family (HuggingFace -> Megatron-Core GPT, torch DCP) read back by the
real Megatron-Core 0.16.1 (suite `real`; run through venv_run.py torch; CPU, gloo).

usage: hf_reverse_test.py BUILD_ROOT TESTDATA_DIR

For each committed save in CASES (testdata/real/megatron): `fc-export SAVE HF --hf-family F
--copy-from REF` (REF: the family's config.json, tests/tools/hf_family_convert_test.py), then
`fc-convert HF OUT --from-hf-family F --target-like SAVE --output-format torch-dcp` (the
save's Adam states excluded: HF weights have none). Then Megatron-Core itself:
  load   at the save's own layout (torchrun, TP x PP gloo processes, one launch per layout for
         all its cases), a fresh GPTModel of the save's config (build_models of
         make_fixtures.py: per-layer keys, arch) with every parameter set to NaN first (a
         fresh model equals an untrained save's weights: a load that wrote nothing would
         otherwise pass), dist_checkpointing.load of its sharded state dict from OUT as fc
         wrote it (fc's .metadata and __R_0.distcp, the save's metadata.json and common.pt),
         load_state_dict; every ShardedTensor of the re-made sharded state dict equals its box
         of the save's expected.safetensors (what Megatron-Core loads from the save) bit for
         bit, and the keys of all ranks together are exactly the save's model keys;
  forward  one process at TP 1 x PP 1: the same fresh-NaN model loaded from the original save
         and from OUT, each run on a fixed input (megatron_oracle_test.megatron_forward):
         the fp32 logits are bit-equal.

Megatron-Core's sharded state dict of every GPTModel holds ShardedObjects for each linear's
`_extra_state` (BytesStorageMetadata items in the save's DCP) that dist_checkpointing.load
requires (strict, as Megatron-LM loads): fc-convert --from-hf-family carries the
--target-like checkpoint's objects into the output, which this test first found missing
("Missing key in checkpoint state_dict: decoder.layers.self_attention.linear_proj.
_extra_state/shard_0_4").
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402
from hf_family_convert_test import GPT2, LLAMA, MIXTRAL, QWEN2, QWEN2_MOE, write_config  # noqa: E402
sys.path.insert(0, HERE)
import megatron_oracle_test as oracle  # noqa: E402  (torchrun, mf, megatron_forward)

PORT = int(os.environ.get("FC_MEGATRON_PORT", "29710")) + 70  # 29780-29789

# (save under testdata/real/megatron, --hf-family / --from-hf-family, the HF config.json);
# layout, key form and arch: make_fixtures.CASES[save]
CASES = [
    ("gpt_tp2_pp2_layers", "llama", LLAMA),  # TP 2 x PP 2, per-layer keys
    ("gpt_tp2_pp2", "llama", LLAMA),         # TP 2 x PP 2, layer-stacked keys, Adam states
    ("qwen2_tp2", "qwen2", QWEN2),           # TP 2, QKV bias, tied output layer
    ("gpt2_tp2", "gpt2", GPT2),              # TP 2, LayerNorm, biases, learned positions
    ("mixtral_tp2", "mixtral", MIXTRAL),     # TP 2, MoE: router, 4 experts
    ("qwen2_moe_tp2", "qwen2-moe", QWEN2_MOE),  # TP 2, MoE with a gated shared expert
]


def load_fresh(m, ckpt, tp, pp, case):
    """A fresh model of the save's config at tp x pp (this process group's layout), every
    parameter NaN, then Megatron-Core's dist_checkpointing.load from `ckpt` and
    load_state_dict. Returns (model, its re-made ShardedTensors)."""
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import apply_factories
    c = m.CASES[case]
    model = m.build_models(tp, pp, None, c.get("per_layer", False), c.get("arch", "llama"))[0]
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    md = m.sharded_metadata()
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict(metadata=md)}, ckpt)
    model.load_state_dict(loaded["model"])
    again = {"model": model.sharded_state_dict(metadata=md)}
    apply_factories(again)
    return model, m.walk_sharded(again, [])


def load_worker(testdata, tp, pp, pairs):
    """Every rank: each (case, OUT) loaded at tp x pp, each ShardedTensor against its box of
    the case's expected.safetensors, bit for bit; rank 0: all ranks' keys == the model keys."""
    import torch.distributed as dist
    from safetensors.torch import load_file
    m = oracle.mf(testdata)
    m.init(tp, pp, None)
    for case, out in pairs:
        _, sharded = load_fresh(m, out, tp, pp, case)
        want = load_file(os.path.join(testdata, "real", "megatron", case,
                                      "expected.safetensors"))
        for st in sharded:
            assert st.key in want, (case, st.key)
            idx = tuple(slice(o, o + s) for o, s in zip(
                st.global_offset, (1,) * st.prepend_axis_num + tuple(st.local_shape)))
            box = want[st.key][idx].reshape(st.data.shape)
            assert m.tensors_equal(st.data.detach().contiguous(), box.contiguous()), (
                f"{case} rank {dist.get_rank()}: {st.key} {st.global_offset} differs from "
                f"the save")
        keys = [None] * dist.get_world_size()
        dist.all_gather_object(keys, sorted({st.key for st in sharded}))
        if dist.get_rank() == 0:
            got = set().union(*keys)
            model_keys = {k for k in want if not k.startswith("optimizer.")}
            assert got == model_keys, (case, sorted(got ^ model_keys))
            print(f"{case}: Megatron-Core (TP {tp} x PP {pp}, {dist.get_world_size()} gloo "
                  f"processes) loads fc's reverse torch DCP; {len(got)} model tensors equal "
                  f"the save's bit for bit", flush=True)
    dist.destroy_process_group()


def forward_worker(testdata, pairs):
    """One process, TP 1 x PP 1: for each (case, OUT), the logits of the model loaded from the
    save and from OUT, bit-equal."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    m = oracle.mf(testdata)
    m.init(1, 1, None)
    for case, out in pairs:
        save = os.path.join(testdata, "real", "megatron", case, "ckpt")
        want = oracle.megatron_forward(load_fresh(m, save, 1, 1, case)[0])
        got = oracle.megatron_forward(load_fresh(m, out, 1, 1, case)[0])
        assert not torch.isnan(want).any(), case
        assert torch.equal(got, want), (
            f"{case}: logits differ, max |d| {(got - want).abs().max().item()}")
        print(f"{case}: Megatron-Core's TP 1 forward of fc's reverse output: logits "
              f"{tuple(got.shape)} bit-equal to the save's", flush=True)
    dist.destroy_process_group()


def main():
    if sys.argv[1] == "--load":
        testdata, tp, pp, rest = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
        load_worker(testdata, tp, pp, list(zip(rest[::2], rest[1::2])))
        return
    if sys.argv[1] == "--forward":
        rest = sys.argv[3:]
        forward_worker(sys.argv[2], list(zip(rest[::2], rest[1::2])))
        return
    build, testdata = sys.argv[1], sys.argv[2]
    m = oracle.mf(testdata)
    tools = os.path.join(build, "tools")
    real = os.path.join(testdata, "real", "megatron")
    with fcio.temp_dir("fc-real-hf-reverse-") as tmp:
        layouts, pairs = {}, []
        for case, family, fields in CASES:
            ckpt = os.path.join(real, case, "ckpt")
            ref = write_config(os.path.join(tmp, "ref_" + case), fields)
            hf, out = os.path.join(tmp, "hf_" + case), os.path.join(tmp, "mg_" + case)
            fcio.run([os.path.join(tools, "fc-export"), ckpt, hf, "--hf-family", family,
                      "--copy-from", ref, "-q"])
            fcio.run([os.path.join(tools, "fc-convert"), hf, out, "--from-hf-family", family,
                      "--target-like", ckpt, "--output-format", "torch-dcp", "--exclude",
                      "optimizer.*", "-q"])
            c = m.CASES[case]
            layouts.setdefault((c["tp"], c["pp"]), []).extend([case, out])
            pairs.extend([case, out])
        port = PORT
        for (tp, pp), args in sorted(layouts.items()):
            oracle.torchrun(tp * pp, port, "--load", testdata, str(tp), str(pp), *args,
                            script=__file__)
            port += 1
        oracle.torchrun(1, port, "--forward", testdata, *pairs, script=__file__)


if __name__ == "__main__":
    main()
