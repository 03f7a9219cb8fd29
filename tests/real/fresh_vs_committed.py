"""A fresh save by the real framework against the committed fixture made from the same script.

The saves hold trained values (one or two optimizer steps), and the frameworks' CPU kernels
(matmul blocking, vectorized reductions) round differently on different processors: the
committed fixtures were written on one machine, CI and developers run on others (an AMD EPYC
gives last-bit differences in 17 of 29 tensors of the torch saves, at most 5e-5 relative, all
in values of 1e-6 or less). So names, dtypes and shapes must match exactly, integer and bool
tensors bit for bit, and floating values bit for bit or, where this processor rounds
differently, every element within rtol 1e-4 / atol 1e-6 of the committed one: a change of
the script (seed, step count, model) moves values far past that.
"""
import torch

RTOL, ATOL = 1e-4, 1e-6


def compare(got, want, label):
    """Asserts `got` (name -> tensor, the fresh save) matches `want` (the committed one) as the
    module docstring says; returns a phrase for the log ("bit for bit" or the rounding seen)."""
    assert sorted(got) == sorted(want), f"{label}: names differ: {sorted(set(got) ^ set(want))}"
    rounded, worst = [], 0.0
    for k in sorted(want):
        g, w = got[k].detach().contiguous(), want[k].detach().contiguous()
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), \
            (label, k, g.dtype, tuple(g.shape), w.dtype, tuple(w.shape))
        if torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)):
            continue
        assert g.is_floating_point(), f"{label}: {k} ({g.dtype}) differs"
        g64, w64 = g.double().reshape(-1), w.double().reshape(-1)
        close = torch.isclose(g64, w64, rtol=RTOL, atol=ATOL, equal_nan=True)
        if not bool(close.all()):
            i = int((~close).nonzero()[0])
            raise AssertionError(f"{label}: {k} element {i} is {g64[i].item()!r} fresh, "
                                 f"{w64[i].item()!r} committed (beyond rtol {RTOL}, atol {ATOL}; "
                                 f"{int((~close).sum())} of {w64.numel()} elements)")
        rel = ((g64 - w64).abs() / w64.abs().clamp_min(1e-30)).max().item()
        worst = max(worst, rel)
        rounded.append(k)
    if not rounded:
        return "bit for bit"
    return (f"equal up to this processor's rounding ({len(rounded)} of {len(want)} tensors "
            f"differ in the last bits, at most {worst:.2g} relative)")
