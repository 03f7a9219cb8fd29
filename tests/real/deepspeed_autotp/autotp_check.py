"""fc on DeepSpeed AutoTP checkpoints written by the real DeepSpeed 0.19.8
(testdata/real/deepspeed/make_autotp.py: TP 2, TP 2 x DP 2, bf16), against what
ds_to_universal gives back from them (expected_ucp.safetensors): fc-inspect --verify, and
fc-export --include-optimizer, whose every fp32 master, exp_avg, exp_avg_sq and step equals
DeepSpeed's merged zero/<param>/<state>.pt, names included. numpy only.

usage: autotp_check.py BUILD_ROOT FIXTURES_DIR   (testdata/real/deepspeed, or a fresh OUT_DIR)
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import fcio  # noqa: E402

CASES = ["autotp_tp2", "autotp_tp2_dp2", "autotp_tp2_bf16"]
FC_NAME = {"fp32": "{}", "exp_avg": "optimizer.exp_avg.{}", "exp_avg_sq": "optimizer.exp_avg_sq.{}",
           "step": "optimizer.step.{}"}


def check_case(tools, fixtures, case, tmp):
    d = os.path.join(fixtures, case)
    info = json.load(open(os.path.join(d, "info.json")))
    ckpt = os.path.join(d, "ckpt")
    p = fcio.run([os.path.join(tools, "fc-inspect"), "--verify", ckpt])
    assert "verify: OK" in p.stdout, (case, p.stdout[-500:])
    assert f"deepspeed.tp_degree {info['tp']}" in p.stdout, (case, p.stdout.splitlines()[0])
    out = os.path.join(tmp, case)
    fcio.run([os.path.join(tools, "fc-export"), ckpt, out, "--include-optimizer", "-q"])
    got, _ = fcio.read_hf_dir(out)
    want = {}
    for key, value in fcio.read_safetensors(os.path.join(d, "expected_ucp.safetensors")).items():
        param, state = key.rsplit("/", 1)
        want[FC_NAME[state].format(param)] = value
    steps = {k: v for k, v in want.items() if k.startswith("optimizer.step.")}
    for k, (dt, arr) in steps.items():
        assert k in got, (case, k)
        assert float(got[k][1].reshape(-1)[0]) == float(arr.reshape(-1)[0]), (case, k)
    fcio.same_tensors({k: v for k, v in got.items() if k not in steps},
                      {k: v for k, v in want.items() if k not in steps}, case)
    print(f"{case}: TP {info['tp']} x DP {info['dp']}, ZeRO-{info['zero_stage']} "
          f"{info['dtype']}: {len(want)} tensors equal ds_to_universal's", flush=True)


def main():
    build, fixtures = sys.argv[1], sys.argv[2]
    tools = os.path.join(build, "tools")
    with fcio.temp_dir("fc-autotp-") as tmp:
        for case in CASES:
            check_case(tools, fixtures, case, tmp)


if __name__ == "__main__":
    main()
