"""Checks that fc and a peer did the same work: their outputs hold the same tensors, bit for
bit (the interop env's python; torch and safetensors).

usage: python bench/peers/compare.py KIND PEER_OUT FC_OUT
  st    both directories of safetensors files (*.safetensors, any sharding)
  pt    PEER_OUT/full.pt (dcp_to_torch_save), flattened with DCP's key names, against the
        safetensors files of FC_OUT
  ucp   two Universal Checkpoints: every zero/<param>/<state>.pt (fp32.pt as a dict: its
        "param"; step as a number)
  dcp   two torch DCP checkpoints, each loaded whole in one process (dcp.load into tensors
        allocated from its own .metadata); tensors and bytes items compared

Prints one line "same: N tensors, B bytes" and exits 0, or lists what differs and exits 1.
Names on one side only count as a difference, except in `ucp`, where zero/ entries that
only the peer has and that hold no optimizer state are listed but allowed (ds_to_universal
0.19 writes fp32.pt for module entries without Adam state, which fc does not).
"""
import glob
import os
import sys

import torch


def raw(t):
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def load_st(d):
    from safetensors import safe_open
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, framework="pt") as g:
            for k in g.keys():
                assert k not in out, f"{k} twice in {d}"
                out[k] = g.get_tensor(k)
    return out


def load_pt(d):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    sd = torch.load(os.path.join(d, "full.pt"), mmap=True, weights_only=False)
    flat, _ = flatten_state_dict(sd)
    return {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}


def load_ucp(d):
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "zero", "*", "*.pt"))):
        v = torch.load(p, map_location="cpu", weights_only=False)
        if isinstance(v, dict):
            v = v["param"]
        if not isinstance(v, torch.Tensor):
            v = torch.tensor(float(v), dtype=torch.float64)
        elif v.dim() == 0 and os.path.basename(p) == "step.pt":
            v = v.to(torch.float64)
        out[os.path.relpath(p, os.path.join(d, "zero"))[:-3]] = v
    return out


def load_dcp(d):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = dcp.FileSystemReader(d).read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype)
          if isinstance(v, TensorStorageMetadata) else None
          for k, v in md.state_dict_metadata.items()}
    dcp.load(sd, checkpoint_id=d, no_dist=True)
    return sd


def main():
    import warnings
    warnings.simplefilter("ignore")
    kind, peer_dir, fc_dir = sys.argv[1:4]
    peer = {"st": load_st, "pt": load_pt, "ucp": load_ucp, "dcp": load_dcp}[kind](peer_dir)
    fc = (load_st if kind == "pt" else {"st": load_st, "ucp": load_ucp,
                                        "dcp": load_dcp}[kind])(fc_dir)
    bad, allowed = [], []
    for k in sorted(set(peer) - set(fc)):
        if kind == "ucp" and os.path.dirname(k) + "/exp_avg" not in peer:
            allowed.append(k)
        else:
            bad.append(f"only in the peer's output: {k}")
    bad += [f"only in fc's output: {k}" for k in sorted(set(fc) - set(peer))]
    n = nbytes = 0
    for k in sorted(set(peer) & set(fc)):
        a, b = peer[k], fc[k]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if a != b:
                bad.append(f"{k}: {a!r} != {b!r}")
            continue
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            bad.append(f"{k}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}")
        elif not torch.equal(raw(a), raw(b)):
            bad.append(f"{k}: values differ")
        else:
            n += 1
            nbytes += a.numel() * a.element_size()
    if allowed:
        print(f"(only in the peer's output, no optimizer state, allowed: {len(allowed)}: "
              f"{', '.join(allowed[:5])})")
    if bad:
        print(f"MISMATCH ({len(bad)}):")
        for line in bad[:30]:
            print("  " + line)
        sys.exit(1)
    print(f"same: {n} tensors, {nbytes} bytes")


if __name__ == "__main__":
    main()
