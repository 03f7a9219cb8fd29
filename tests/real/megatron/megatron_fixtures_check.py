"""fc-inspect --verify and fc-export --include-optimizer on checkpoints written by the real
Megatron-Core (0.16.1, CPU, gloo; testdata/real/megatron/make_fixtures.py), compared bit for
bit with the full tensors Megatron-Core itself loads into a TP 1 x PP 1 model and optimizer
(each case's expected.safetensors): same names, dtypes, shapes and bytes; and the attributes
fc reads from common.pt (iteration, the Adam step) equal the case's info.json. Where a case has
the same training state saved as Megatron-LM's legacy per-rank files (legacy/), fc-export of
those equals expected_legacy.safetensors (the TP 1 model's state dict and its FP32Optimizer's
per-param states, optimizer.{fp32,exp_avg,exp_avg_sq}.<name>). No framework is
needed (numpy reads both sides).

usage: megatron_fixtures_check.py BUILD_ROOT FIXTURES_DIR [CASE...]
  FIXTURES_DIR: testdata/real/megatron (committed), or a directory make_fixtures.py just wrote
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import fcio  # noqa: E402


CASES = ["gpt_tp2_pp2", "gpt_tp2_vpp2", "gpt_tp4", "gpt_tp2_pp2_layers", "qwen2_tp2",
         "gpt2_tp2", "mixtral_tp2", "qwen2_moe_tp2"]




def ucp(tools, ckpt, out, label):
    """A Universal Checkpoint needs the Adam step: fc finds it (it refused these saves when it
    missed the non-distributed optimizers' step)."""
    p = fcio.run([os.path.join(tools, "fc-convert"), ckpt, out, "--output-format", "ucp", "-q"],
                 expect=None)
    assert p.returncode == 0, (label, p.stdout, p.stderr)


def fcio_export(tools, src, out):
    fcio.run([os.path.join(tools, "fc-export"), src, out, "--include-optimizer", "-q"])
    return out


def check_case(tools, fixtures, case, tmp):
    d = os.path.join(fixtures, case)
    info = json.load(open(os.path.join(d, "info.json")))
    ckpt = os.path.join(d, "ckpt")
    p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", ckpt])
    assert "verify: OK" in p.stdout, (case, p.stdout)
    attrs = json.loads(fcio.run([os.path.join(tools, "fc-inspect"), "--json", ckpt]).stdout)
    attrs = attrs["attributes"]
    assert attrs.get("megatron.iteration") == info["iteration"], (case, attrs)
    if info.get("optimizer_step") is not None:
        assert attrs.get("megatron.optimizer_step") == info["optimizer_step"], (case, attrs)
        ucp(tools, ckpt, os.path.join(tmp, case + "_ucp"), case)
    out = os.path.join(tmp, case)
    fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--include-optimizer", "-q"])
    got, _ = fcio.read_hf_dir(out)
    want = fcio.read_safetensors(os.path.join(d, "expected.safetensors"))
    fcio.same_tensors(got, want, case)
    print(f"{case}: {len(want)} tensors equal Megatron-Core's", flush=True)
    # fc-convert's torch DCP output carries the save's metadata.json and common.pt, which
    # dist_checkpointing.load needs (real_megatron_convert loads it with Megatron-Core);
    # fc's own distcp output does not.
    dcp = os.path.join(tmp, case + "_dcp_tp1")
    fcio.run([os.path.join(tools, "fc-convert"), ckpt, dcp, "--preset", "megatron-gpt", "--tp",
              "1", "--pp", "1", "--output-format", "torch-dcp", "--torch-version", "2", "-q"])
    for f in ("metadata.json", "common.pt"):
        with open(os.path.join(dcp, f), "rb") as a, open(os.path.join(ckpt, f), "rb") as b:
            assert a.read() == b.read(), (case, f)
    got, _ = fcio.read_hf_dir(fcio_export(tools, dcp, os.path.join(tmp, case + "_dcp_export")))
    fcio.same_tensors(got, want, case + " via fc-convert torch-dcp")
    fc_out = os.path.join(tmp, case + "_fc")
    fcio.run([os.path.join(tools, "fc-convert"), ckpt, fc_out, "--preset", "megatron-gpt",
              "--tp", "1", "--pp", "1", "-q"])
    assert not os.path.exists(os.path.join(fc_out, "common.pt")), case
    legacy = os.path.join(d, "legacy")
    if os.path.isdir(legacy):
        p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", legacy])
        assert "verify: OK" in p.stdout, (case, p.stdout)
        attrs = json.loads(fcio.run([os.path.join(tools, "fc-inspect"), "--json",
                                     legacy]).stdout)["attributes"]
        assert attrs.get("megatron.iteration") == info["iteration"], (case, attrs)
        # torch AdamW's per-param step (FP32Optimizer.state_dict()), the same as common.pt's
        assert attrs.get("megatron.optimizer_step") == info["optimizer_step"], (case, attrs)
        ucp(tools, legacy, os.path.join(tmp, case + "_legacy_ucp"), case + " legacy")
        out = os.path.join(tmp, case + "_legacy")
        fcio.run([os.path.join(tools, "fc-export"), legacy, out, "--include-optimizer", "-q"])
        got, _ = fcio.read_hf_dir(out)
        want = fcio.read_safetensors(os.path.join(d, "expected_legacy.safetensors"))
        fcio.same_tensors(got, want, case + " legacy")
        print(f"{case} legacy: {len(want)} tensors equal Megatron-Core's", flush=True)


def main():
    build, fixtures = sys.argv[1], sys.argv[2]
    cases = sys.argv[3:] or CASES
    tools = os.path.join(build, "tools")
    with fcio.temp_dir("fc-real-megatron-") as tmp:
        for case in cases:
            check_case(tools, fixtures, case, tmp)


if __name__ == "__main__":
    main()
