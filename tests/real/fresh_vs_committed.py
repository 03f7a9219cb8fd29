"""A fresh save by the real framework against the committed fixture made from the same script.

The saves hold trained values (one or two optimizer steps), and the frameworks' CPU kernels
(matmul blocking, vectorized reductions) round differently on different processors: the
committed fixtures were written on one machine, CI and developers run on others (an AMD EPYC
gives last-bit differences in 17 of 29 tensors of the torch saves, at most 5e-5 relative, all
in values of 1e-6 or less). So names, dtypes and shapes must match exactly, integer and bool
tensors bit for bit, and floating values bit for bit or, where this processor rounds
differently, every element within rtol 1e-4 / atol 1e-6 of the committed one (16-bit floats:
within 2 units of their last place, rtol 2^-6 for bfloat16, 2^-9 for float16): a change of
the script (seed, step count, model) moves values far past that. An optimizer step can carry
a last-bit difference of a tiny gradient into a larger one of the updated weight (Adam divides
by the root of the second moment: Paddle's fc.weight had 2 of 600 elements 1e-3 apart), so up
to 1% of a tensor's elements (at least one) may differ by up to 1e-2 relative.

compare() takes torch tensors (torch venv), compare_numpy() the {name: (safetensors dtype,
array)} dicts of testdata/real/paddle/make_fixtures.py's read_st (bfloat16 as uint16 bits).
"""
import numpy as np

RTOL, ATOL = 1e-4, 1e-6
# two units in the last place of the 16-bit formats (8 and 11 significant bits)
RTOL_16 = {"bfloat16": 2.0 ** -6, "float16": 2.0 ** -9}
OUTLIER_RTOL, OUTLIER_FRACTION = 1e-2, 0.01


class _Verdict:
    def __init__(self, total):
        self.total, self.rounded, self.worst, self.outliers = total, 0, 0.0, 0

    def close(self, g64, w64, label, k, dtype):
        """g64, w64: float64 arrays (fresh, committed) of tensor k, known to differ in bytes;
        dtype: "bfloat16", "float16" or another float type's name."""
        g64, w64 = g64.reshape(-1), w64.reshape(-1)
        rtol = RTOL_16.get(dtype, RTOL)
        ok = np.isclose(g64, w64, rtol=rtol, atol=ATOL, equal_nan=True)
        near = np.isclose(g64, w64, rtol=max(rtol, OUTLIER_RTOL), atol=ATOL, equal_nan=True)
        outliers = int((~ok).sum())
        if not near.all() or outliers > max(1, int(OUTLIER_FRACTION * w64.size)):
            i = int(np.flatnonzero(~near)[0]) if not near.all() else int(np.flatnonzero(~ok)[0])
            raise AssertionError(f"{label}: {k} element {i} is {g64[i]!r} fresh, {w64[i]!r} "
                                 f"committed ({outliers} of {w64.size} elements beyond rtol "
                                 f"{rtol:g} / atol {ATOL}, {int((~near).sum())} beyond rtol "
                                 f"{max(rtol, OUTLIER_RTOL):g})")
        self.outliers += outliers
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.abs(g64 - w64) / np.maximum(np.abs(w64), 1e-30)
        self.worst = max(self.worst, float(np.nanmax(rel)) if rel.size else 0.0)
        self.rounded += 1

    def text(self):
        if not self.rounded:
            return "bit for bit"
        return (f"equal up to this processor's rounding ({self.rounded} of {self.total} tensors "
                f"differ in the last bits, at most {self.worst:.2g} relative, "
                f"{self.outliers} elements beyond rtol {RTOL:g})")


def compare(got, want, label):
    """Asserts `got` (name -> torch tensor, the fresh save) matches `want` (the committed one)
    as the module docstring says; returns a phrase for the log."""
    import torch
    assert sorted(got) == sorted(want), f"{label}: names differ: {sorted(set(got) ^ set(want))}"
    v = _Verdict(len(want))
    for k in sorted(want):
        g, w = got[k].detach().contiguous(), want[k].detach().contiguous()
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), \
            (label, k, g.dtype, tuple(g.shape), w.dtype, tuple(w.shape))
        if torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)):
            continue
        assert g.is_floating_point(), f"{label}: {k} ({g.dtype}) differs"
        v.close(g.double().numpy(), w.double().numpy(), label, k, str(g.dtype).split(".")[-1])
    return v.text()


_FLOAT = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


def _as_f64(dtype, x):
    if dtype == "BF16":  # uint16 bit patterns: the high half of a float32
        return (np.ascontiguousarray(x).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.ascontiguousarray(x).view(_FLOAT[dtype]).astype(np.float64)


def compare_numpy(got, want, label):
    """compare() for {name: (safetensors dtype name, numpy array)} dicts."""
    assert sorted(got) == sorted(want), f"{label}: names differ: {sorted(set(got) ^ set(want))}"
    v = _Verdict(len(want))
    for k in sorted(want):
        (dg, g), (dw, w) = got[k], want[k]
        assert dg == dw and tuple(g.shape) == tuple(w.shape), (label, k, dg, g.shape, dw, w.shape)
        if np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes():
            continue
        assert dg in _FLOAT or dg == "BF16", f"{label}: {k} ({dg}) differs"
        v.close(_as_f64(dg, g), _as_f64(dw, w), label, k,
                {"BF16": "bfloat16", "F16": "float16"}.get(dg, dg))
    return v.text()
