"""What a torch 2.15 user runs instead of fc, for bench/peers.sh (the interop env's python).

usage: python bench/peers/torch_peer.py to-pt SRC OUT_DIR
       python bench/peers/torch_peer.py to-safetensors SRC OUT_DIR
       python bench/peers/torch_peer.py reshard SRC OUT_DIR

to-pt           torch.distributed.checkpoint.format_utils.dcp_to_torch_save(SRC, OUT/full.pt):
                torch's own DCP -> one file converter (a torch.save pickle, not safetensors)
to-safetensors  the same, then the .pt loaded back (torch.load(mmap=True)), its state dict
                flattened as DCP names the keys (torch's flatten_state_dict:
                "optim.state.0.weight.exp_avg"), tensors only (param_groups' floats
                dropped), and written with safetensors.torch.save_file to
                OUT/model.safetensors; OUT/full.pt is left as written (it is part of the
                work). Tensors sharing storage are cloned first (save_file refuses them).
reshard         2 ranks -> 1 in one process: the state dict allocated from the checkpoint's
                .metadata (torch.empty of each tensor's global size and dtype, a placeholder
                for each bytes item, under the flattened keys), dcp.load(no_dist=True) into
                it (every rank's shards read into the full tensors), dcp.save(no_dist=True)
                of it to OUT_DIR (one __0_0.distcp + .metadata)
"""
import os
import sys


def main():
    mode, src, out = sys.argv[1:4]
    import torch
    import torch.distributed.checkpoint as dcp
    os.makedirs(out, exist_ok=True)
    if mode in ("to-pt", "to-safetensors"):
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        pt = os.path.join(out, "full.pt")
        dcp_to_torch_save(src, pt)
        if mode == "to-safetensors":
            from safetensors.torch import save_file
            from torch.distributed.checkpoint._nested_dict import flatten_state_dict
            sd = torch.load(pt, mmap=True, weights_only=False)
            flat, _ = flatten_state_dict(sd)
            tensors, seen = {}, set()
            for k, v in flat.items():
                if isinstance(v, torch.Tensor):
                    key = (v.untyped_storage().data_ptr(), v.storage_offset())
                    tensors[k] = v.clone() if key in seen else v.contiguous()
                    seen.add(key)
            save_file(tensors, os.path.join(out, "model.safetensors"))
    elif mode == "reshard":
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        md = dcp.FileSystemReader(src).read_metadata()
        sd = {k: torch.empty(v.size, dtype=v.properties.dtype)
              if isinstance(v, TensorStorageMetadata) else None
              for k, v in md.state_dict_metadata.items()}
        dcp.load(sd, checkpoint_id=src, no_dist=True)
        dcp.save(sd, checkpoint_id=out, no_dist=True)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
