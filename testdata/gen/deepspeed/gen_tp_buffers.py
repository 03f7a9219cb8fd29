#!/usr/bin/env python3
"""The tp2_buffers fixture (issue 29 item 5): module buffers at TP 2.

A DeepSpeed save at tp 2 x dp 2 (ZeRO-1, fp16, universal_checkpoint_info: row parallel
`dense\\.`, replicated `norm\\.`) written by gen.py's gen_zero12, whose model states then get
the persistent buffers a Megatron/HF model registers (in `module` and `buffer_names`):

  position_ids         int64 [1, 37], arange expanded (strides (0, 1)), equal on both ranks
  rotary.inv_freq      float32 [4], equal on both ranks
  rotary.cos_cached    float32 [3, 2], equal values, column-major on TP rank 1
  bn.num_batches_tracked  int64 0-d, equal on both ranks
  alibi.slopes         float32 [2], each rank its own heads' slopes (differ)
  attn.cache           float16 [2] on TP rank 0, [3] on TP rank 1 (shapes differ)
  dense.mask           float32 [4, 1] per rank (differ), matching the row-parallel pattern
  norm.running_mean    (gen_zero12's) equal, matching the replicated pattern

Buffers are in no optimizer group: ds_to_universal's merge_tp_slices never sees them (it
merges the params of param_shapes; for other module entries it saves the first mp_rank
file's copy), and each TP rank loads its own from its model states. The expected values
follow fc's rule for them: a buffer that an explicit universal_checkpoint_info pattern
matches follows it (dense.mask: cat along dim 1; norm.*: replicated, TP rank 0's copy when
the copies are equal, as here, per rank otherwise); any other buffer
whose TP copies have equal dtype, shape and values is one tensor (TP rank 0's); copies that
differ stay per rank, as mp_rank_XX.<name> and module.mp_rank_XX.<name>. The params merge
as gen.py's merge_tp does (ds_to_universal's rules).

usage: /usr/bin/python3 testdata/gen/deepspeed/gen_tp_buffers.py [OUT_ROOT]
       /usr/bin/python3 testdata/gen/deepspeed/gen_tp_buffers.py --check [OUT_ROOT]
OUT_ROOT defaults to testdata/deepspeed; --check regenerates into a temporary directory and
compares with OUT_ROOT/tp2_buffers byte for byte (gen.py's comparison)."""
import collections
import math
import os
import re
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402  (the stand-in DeepSpeed classes, gen_zero12, the reconstruction)

CASE = "tp2_buffers"
INFO = {"universal_checkpoint_version": 0.4,
        "tp_replicated_parameter_patterns": [r"norm\."],
        "parameter_with_row_parallelism_patterns": [r"dense\."]}
EXPLICIT = ("tp_replicated_parameter_patterns", "parameter_to_average_patterns",
            "parameter_with_row_parallelism_patterns", "parameter_with_2_sub_params_cat_dim_0",
            "vocabulary_parameter_patterns")


def buffers(m):
    b = collections.OrderedDict()
    b["position_ids"] = torch.arange(37, dtype=torch.int64).expand((1, -1))
    b["rotary.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    # Equal values, stored row-major on TP rank 0 and column-major on TP rank 1.
    cos = torch.cos(torch.arange(6, dtype=torch.float32)).reshape(3, 2)
    b["rotary.cos_cached"] = cos if m == 0 else cos.t().contiguous().t()
    b["bn.num_batches_tracked"] = torch.tensor(3, dtype=torch.int64)
    # ALiBi: 4 heads, slopes 2^-2, 2^-4, 2^-6, 2^-8; TP rank m holds heads 2m, 2m + 1.
    b["alibi.slopes"] = torch.tensor([2.0 ** -(2 * (2 * m + h + 1)) for h in range(2)])
    b["attn.cache"] = gen.values(2 + m, 40 + m).to(torch.float16)
    b["dense.mask"] = gen.values(4, 50 + m).reshape(4, 1)
    return b


def generate(out):
    shutil.rmtree(os.path.join(out, CASE), ignore_errors=True)
    gen.gen_zero12(out, CASE, 1, 2,
                   [gen.od(("layer.weight", (2, 4)), ("dense.weight", (4, 2)),
                           ("norm.weight", (4,)))],
                   seed=20, mp=2, same=("norm.weight",),
                   client={"universal_checkpoint_info": INFO})
    tagdir = os.path.join(out, CASE, "ckpt", gen.TAG)
    for m in range(2):
        path = os.path.join(tagdir, "mp_rank_%02d_model_states.pt" % m)
        sd = gen.load(path)
        for name, t in buffers(m).items():
            sd["module"][name] = t
            sd["buffer_names"].append(name)
        gen.save(sd, path)
    write_expected(os.path.join(out, CASE))


def explicit(name):
    if any(re.match(p, name) for k in EXPLICIT for p in INFO.get(k, [])):
        return True
    return gen.match_sub_params(INFO, name)[0] is not None


def write_expected(case_dir):
    ckpt = os.path.join(case_dir, "ckpt")
    tagdir = os.path.join(ckpt, gen.TAG)
    names = sorted(os.listdir(tagdir))
    mp_files = [n for n in names if n.startswith("mp_rank_")]
    per_rank = [gen.reconstruct_mp(tagdir, names, mf, m) for m, mf in enumerate(mp_files)]
    buffer_names = set(gen.load(os.path.join(tagdir, mp_files[0]))["buffer_names"])

    def buffer_of(key):
        name = key[len("module."):] if key.startswith("module.") else key
        return name if name in buffer_names and not explicit(name) else None

    params = [collections.OrderedDict((k, v) for k, v in sd.items() if not buffer_of(k))
              for sd in per_rank]
    exp = gen.merge_tp(params, INFO)
    for key in per_rank[0]:
        name = buffer_of(key)
        if name is None:
            continue
        copies = [sd[key] for sd in per_rank]
        if all(c.dtype == copies[0].dtype and c.shape == copies[0].shape and
               torch.equal(c, copies[0]) for c in copies):
            exp[key] = copies[0]
            continue
        for t, c in enumerate(copies):
            exp[("module.mp_rank_%02d.%s" if key.startswith("module.") else "mp_rank_%02d.%s")
                % (t, name)] = c
    d = os.path.join(case_dir, "expected")
    os.makedirs(d, exist_ok=True)
    for k, v in exp.items():
        gen.np.save(os.path.join(d, k + ".npy"), gen.to_numpy(v))
    # The defect this fixture guards against: position_ids concatenated to [2, 37].
    assert tuple(exp["position_ids"].shape) == (1, 37), exp["position_ids"].shape
    assert math.isclose(float(exp["rotary.inv_freq"][1]), 0.1, rel_tol=1e-6)


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    here = os.path.dirname(os.path.abspath(__file__))
    out = args[0] if args else os.path.normpath(os.path.join(here, "..", "..", "deepspeed"))
    torch.manual_seed(0)
    if not check:
        generate(out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        bad = gen.compare_dirs(os.path.join(tmp, CASE), os.path.join(out, CASE))
    if bad:
        print("%s differs from gen_tp_buffers.py:\n  %s" % (CASE, "\n  ".join(bad)))
        return 1
    print("%s matches gen_tp_buffers.py" % CASE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
