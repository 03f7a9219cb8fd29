"""The real Megatron-Core (0.16.1, CPU, gloo) as the oracle for fc's torch_dist reader and
torch DCP writer (suite `real`; run through venv_run.py torch).

usage: megatron_oracle_test.py BUILD_ROOT TESTDATA_DIR NAME

NAME
  fixtures  testdata/real/megatron/make_fixtures.py writes every case afresh (torchrun,
            gloo), and megatron_fixtures_check.py compares fc-export of each with what
            Megatron-Core loads into a TP 1 x PP 1 model (bit for bit)
  convert   fc-convert of the fresh TP 2 x PP 2 and TP 2 x VPP 2 saves to TP 1 x PP 1
            (--preset megatron-gpt) and to TP 4 (--preset megatron-gpt --tp 4, model and
            optimizer; and --target-like the real TP 4 save, model only), written as torch
            DCP (--output-format torch-dcp --torch-version 2): Megatron-Core's
            dist_checkpointing.load reads each into a model (and FP32Optimizer) of that layout
            (1 or 4 gloo processes), and every loaded ShardedTensor equals its box of the
            expected full tensors bit for bit
  hf        the per-layer-keys save (gpt_tp2_pp2_layers) exported through an AOA program
            from Megatron-Core names to HF Llama names: transformers' LlamaForCausalLM loads
            it with no missing or unexpected keys, and its fp32 logits on a fixed input equal
            the forward of Megatron-Core's TP 1 model loaded from the checkpoint within
            TOLERANCE (1e-6; not bit for bit: see LOGITS_NOTE)

fc-convert's torch-dcp output holds .metadata and the __R_0.distcp files, and, from a
torch_dist source, copies of the save's metadata.json (the backend) and common.pt (the
non-sharded state: iteration, the optimizer's param groups and step), which Megatron's
dist_checkpointing.load also needs. Both are layout independent (Megatron loads any TP x PP
from them); the test loads fc's output directory as fc wrote it.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402

PORT = int(os.environ.get("FC_MEGATRON_PORT", "29710"))
TOLERANCE = 1e-6
LOGITS_NOTE = (
    "layer by layer, the embedding, every RMSNorm and the whole attention block are bit-equal; "
    "the MLP is not: Megatron's glu takes torch.chunk(fc1_out, 2, dim=-1), so silu runs on a "
    "non-contiguous view of the gate half, and torch's CPU silu on a strided view rounds some "
    "elements differently (1 ulp) from HF's silu of the contiguous gate_proj output; fp32 "
    "logits (|max| ~0.4) then differ by ~3e-8")


def generator(testdata):
    return os.path.join(testdata, "real", "megatron", "make_fixtures.py")


def regenerate(testdata, out, cases):
    env = dict(os.environ, FC_TORCHRUN_PORT=str(PORT), PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, generator(testdata), out, *cases], check=True, env=env)


def torchrun(n, port, *args, script=__file__):
    """The workers of `script` (this file by default) under torch.distributed.run; a worker
    killed by a signal is run again (testdata/real/torchrun.py says why)."""
    sys.path.insert(0, os.path.join(os.environ.get(
        "FC_TESTDATA", os.path.join(HERE, "..", "..", "..", "testdata")), "real"))
    import torchrun as torchrun_module
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    torchrun_module.check_run(n, port, [os.path.abspath(script), *args], env)


def mf(testdata):
    """The generator as a module (its model, optimizer and load helpers)."""
    sys.dont_write_bytecode = True  # no __pycache__ in testdata
    sys.path.insert(0, os.path.dirname(generator(testdata)))
    import make_fixtures
    return make_fixtures


# --- load-check worker: Megatron-Core loads a checkpoint into a TP x PP layout ---------------

def load_check_worker(testdata, ckpt, tp, pp, with_opt, expected):
    """Every rank: build the model (and FP32Optimizer) at tp x pp, dist_checkpointing.load the
    checkpoint, load_state_dict, then compare each ShardedTensor of the re-made sharded state
    dict with its box of the expected full tensors."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import apply_factories
    m = mf(testdata)
    m.init(tp, pp, None)
    chunks = m.build_models(tp, pp, None)
    model = chunks[0]
    opt = m.build_optimizer(chunks) if with_opt else None
    md = m.sharded_metadata()
    sd = {"model": model.sharded_state_dict(metadata=md)}
    if opt is not None:
        sd["optimizer"] = opt.sharded_state_dict(sd, is_loading=True, metadata=md)
    loaded = dist_checkpointing.load(sd, ckpt)
    model.load_state_dict(loaded["model"])
    if opt is not None:
        opt.load_state_dict(loaded["optimizer"])
    again = {"model": model.sharded_state_dict(metadata=md)}
    if opt is not None:
        again["optimizer"] = opt.sharded_state_dict(again, metadata=md)
    apply_factories(again)
    want = load_file(expected)
    n = 0
    for st in m.walk_sharded(again, []):
        full = want[st.key]
        idx = tuple(slice(o, o + s) for o, s in zip(
            st.global_offset, (1,) * st.prepend_axis_num + tuple(st.local_shape)))
        box = full[idx].reshape(st.data.shape)
        assert m.tensors_equal(st.data.detach().contiguous(), box.contiguous()), (
            f"rank {dist.get_rank()}: {st.key} {st.global_offset} differs")
        n += 1
    names = {st.key for st in m.walk_sharded(again, [])}
    if not with_opt:
        names_want = {k for k in want if not k.startswith("optimizer.")}
    else:
        names_want = set(want)
    if dist.get_world_size() == 1:
        assert names == names_want, sorted(names ^ names_want)
    print(f"rank {dist.get_rank()}: {n} shards equal", flush=True)
    dist.destroy_process_group()


def convert_cases(build, testdata, tmp):
    tools = os.path.join(build, "tools")
    gen = os.path.join(tmp, "gen")
    regenerate(testdata, gen, ["gpt_tp2_pp2", "gpt_tp2_vpp2", "gpt_tp4"])
    port = PORT + 20
    for src_case in ("gpt_tp2_pp2", "gpt_tp2_vpp2"):
        src = os.path.join(gen, src_case, "ckpt")
        expected = os.path.join(gen, src_case, "expected.safetensors")
        targets = [
            ("tp1", ["--preset", "megatron-gpt", "--tp", "1", "--pp", "1"], 1, True),
            ("tp4", ["--preset", "megatron-gpt", "--tp", "4", "--pp", "1"], 4, True),
            ("tp4_like", ["--target-like", os.path.join(gen, "gpt_tp4", "ckpt")], 4, False),
        ]
        for name, flags, tp, with_opt in targets:
            out = os.path.join(tmp, f"{src_case}_{name}")
            fcio.run([os.path.join(tools, "fc-convert"), src, out, *flags, "--output-format",
                      "torch-dcp", "--torch-version", "2", "-q"])
            torchrun(tp, port, "--load-check", testdata, out, str(tp), "1",
                     "1" if with_opt else "0", expected)
            port += 1
            print(f"{src_case} -> {name}: Megatron-Core loads fc's torch DCP at TP {tp}, "
                  f"{'model and optimizer' if with_opt else 'model'} equal", flush=True)


# --- hf: transformers on the AOA export vs Megatron's forward ---------------------------------

INPUT = [[1, 5, 9, 13, 17, 21, 33, 40, 2, 3, 63, 0], [7, 11, 50, 12, 4, 8, 15, 16, 23, 42, 6, 1]]


def aoa_program(m):
    heads, groups = m.MODEL["num_attention_heads"], m.MODEL["num_query_groups"]
    L = "decoder.layers.$LAYER_ID."
    H = "model.layers.$LAYER_ID."
    return "\n".join([
        "# Megatron-Core GPT names (per-layer keys) -> HF Llama names",
        "embedding.word_embeddings.weight -> model.embed_tokens.weight",
        "output_layer.weight -> lm_head.weight",
        "decoder.final_layernorm.weight -> model.norm.weight",
        f"{L}self_attention.linear_qkv.layer_norm_weight -> {H}input_layernorm.weight",
        f"{L}self_attention.linear_qkv.weight -> {H}self_attn.q_proj.weight, "
        f"{H}self_attn.k_proj.weight, {H}self_attn.v_proj.weight, fused_qkv, "
        f"num_heads={heads}, num_key_value_groups={groups}, axis=0",
        f"{L}self_attention.linear_proj.weight -> {H}self_attn.o_proj.weight",
        f"{L}mlp.linear_fc1.layer_norm_weight -> {H}post_attention_layernorm.weight",
        f"{L}mlp.linear_fc1.weight -> {H}mlp.gate_proj.weight, {H}mlp.up_proj.weight, axis=0",
        f"{L}mlp.linear_fc2.weight -> {H}mlp.down_proj.weight",
        ""])


def hf_case(build, testdata, tmp):
    import torch
    torch.set_num_threads(1)
    m = mf(testdata)
    gen = os.path.join(tmp, "gen")
    regenerate(testdata, gen, ["gpt_tp2_pp2_layers"])
    ckpt = os.path.join(gen, "gpt_tp2_pp2_layers", "ckpt")
    # Megatron's forward: TP 1 x PP 1 model loaded from the checkpoint (one gloo process)
    meg = os.path.join(tmp, "megatron_logits.pt")
    torchrun(1, PORT + 40, "--forward", testdata, ckpt, meg)
    want = torch.load(meg)
    from transformers import LlamaConfig, LlamaForCausalLM
    M = m.MODEL
    cfg = LlamaConfig(vocab_size=M["vocab_size"], hidden_size=M["hidden_size"],
                      intermediate_size=M["ffn_hidden_size"], num_hidden_layers=M["num_layers"],
                      num_attention_heads=M["num_attention_heads"],
                      num_key_value_heads=M["num_query_groups"],
                      head_dim=M["hidden_size"] // M["num_attention_heads"],
                      max_position_embeddings=M["seq_len"], rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, hidden_act="silu")
    ref = os.path.join(tmp, "hf_config")
    cfg.save_pretrained(ref)
    aoa = os.path.join(tmp, "megatron_to_hf.aoa")
    with open(aoa, "w") as f:
        f.write(aoa_program(m))
    out = os.path.join(tmp, "hf")
    fcio.run([os.path.join(build, "tools", "fc-export"), ckpt, out, "--aoa", aoa,
              "--copy-from", ref, "-q"])
    model, info = LlamaForCausalLM.from_pretrained(out, local_files_only=True,
                                                   dtype=torch.float32,
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    model.eval()
    with torch.no_grad():
        got = model(input_ids=torch.tensor(INPUT)).logits
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    diff = (got - want).abs().max().item()
    exact = torch.equal(got, want)
    print(f"hf: LlamaForCausalLM loads fc-export --aoa of the real save (no missing/unexpected "
          f"keys); logits {tuple(got.shape)} vs Megatron-Core's forward: "
          f"{'bit-equal' if exact else f'max |d| {diff:.3g}'}", flush=True)
    assert diff <= TOLERANCE, f"logits differ by {diff} > {TOLERANCE} ({LOGITS_NOTE})"


def forward_worker(testdata, ckpt, out, per_layer="1", arch="llama"):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    m = mf(testdata)
    m.init(1, 1, None)
    chunks, _, _, _ = m.load_tp1(ckpt, False, per_layer=per_layer == "1", arch=arch)
    torch.save(megatron_forward(chunks[0]), out)
    dist.destroy_process_group()


def megatron_forward(model):
    """The fp32 logits of a TP 1 x PP 1 GPTModel on INPUT (eval, no grad), with the CPU
    patches its forward needs."""
    import torch
    model.eval()
    ids = torch.tensor(INPUT)
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    # the causal mask given (True = masked, Megatron's convention): without one,
    # get_default_causal_mask makes it on device="cuda"
    s = ids.shape[1]
    mask = torch.triu(torch.ones(s, s), diagonal=1).bool()[None, None]
    # CPU patches for the forward (Megatron-Core 0.16.1), scoped to it: RotaryEmbedding.get_emb
    # moves inv_freq to torch.cuda.current_device() (-> "cpu"), and DotProductAttention runs
    # its (p = 0, eval) dropout inside get_cuda_rng_tracker().fork(), which needs the CUDA RNG
    # state model_parallel_cuda_manual_seed adds (-> a null context: no random draw happens).
    import contextlib
    from megatron.core import tensor_parallel
    tracker = tensor_parallel.get_cuda_rng_tracker()
    cur = torch.cuda.current_device
    tracker.fork = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    # MoE (arch mixtral): router_gating_linear tests `te_general_gemm is not None`, a name
    # moe_utils defines only when Transformer Engine imports (NameError without it): None
    # takes its torch matmul path.
    import megatron.core.transformer.moe.moe_utils as moe_utils
    had_te = hasattr(moe_utils, "te_general_gemm")
    if not had_te:
        moe_utils.te_general_gemm = None
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=pos, attention_mask=mask)
    finally:
        torch.cuda.current_device = cur
        if not had_te:
            del moe_utils.te_general_gemm
    return logits.detach().float().contiguous()


def main():
    if sys.argv[1] == "--load-check":
        testdata, ckpt, tp, pp, with_opt, expected = sys.argv[2:8]
        load_check_worker(testdata, ckpt, int(tp), int(pp), with_opt == "1", expected)
        return
    if sys.argv[1] == "--forward":
        # TESTDATA CKPT OUT [PER_LAYER (1, default, or 0) [ARCH (make_fixtures.ARCHS)]]
        forward_worker(*sys.argv[2:7])
        return
    build, testdata, name = sys.argv[1], sys.argv[2], sys.argv[3]
    with fcio.temp_dir("fc-real-megatron-") as tmp:
        if name == "fixtures":
            gen = os.path.join(tmp, "gen")
            regenerate(testdata, gen, [])
            subprocess.run([sys.executable, os.path.join(HERE, "megatron_fixtures_check.py"),
                            build, gen], check=True)
        elif name == "convert":
            convert_cases(build, testdata, tmp)
        elif name == "hf":
            hf_case(build, testdata, tmp)
        else:
            raise SystemExit(f"unknown test {name}")


if __name__ == "__main__":
    main()
