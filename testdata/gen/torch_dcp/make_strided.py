#!/usr/bin/env python3
"""Write a torch 1.13 DCP checkpoint whose tensor items are stored as *views*: transposed,
with a storage_offset, with row strides wider than the row, broadcast (stride 0), plus a
0-d tensor and non-tensor objects. One process (no_dist), one file (single_file_per_rank).

DCP itself clones a tensor whose storage is larger than its view (filesystem._trim); that
step is disabled here so the items keep their storage_offset and strides exactly as
torch.save writes them for a view. A transposed tensor whose storage is exactly its size is
saved without cloning even by stock DCP (formats.md 2.7).

usage: /usr/bin/python3 make_strided.py SHARED_TOOLS_DIR OUT_DIR
writes OUT_DIR/ckpt and OUT_DIR/expected/<name>.npy (bfloat16 as uint16 bit patterns)
"""
import os, sys
sys.path.insert(0, sys.argv[1])
import torch113_shim  # noqa: F401
import numpy as np
import torch
import torch.distributed._shard.checkpoint as dcp
import torch.distributed._shard.checkpoint.filesystem as fs

out = sys.argv[2]
fs._trim = lambda t: t.detach().cpu()  # keep views as views

base = torch.arange(20, dtype=torch.float32).reshape(4, 5)
tensors = {
    "t": torch.arange(6, dtype=torch.float32).reshape(3, 2).t(),     # (2,3) stride (1,2)
    "s": torch.arange(10, dtype=torch.int64)[2:5],                   # offset 2
    "m": base[1:3, 1:4],                                             # (2,3) stride (5,1) offset 6
    "e": torch.tensor([1.5, -2.0, 3.25]).expand(2, 3),               # stride (0,1)
    "c": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64),  # plain
    "scalar": torch.tensor(1.5, dtype=torch.bfloat16),               # 0-d
}
for k, v in tensors.items():
    print(k, tuple(v.shape), v.stride(), v.storage_offset(), v.dtype)
sd = dict(tensors)
sd["step"] = 7
sd["cfg"] = {"a": [1, 2], "b": "x"}
dcp.save_state_dict(sd, dcp.FileSystemWriter(os.path.join(out, "ckpt"), single_file_per_rank=True),
                    no_dist=True)
os.makedirs(os.path.join(out, "expected"), exist_ok=True)
for k, v in tensors.items():
    v = v.contiguous()
    a = v.view(torch.int16).numpy().view(np.uint16) if v.dtype == torch.bfloat16 else v.numpy()
    np.save(os.path.join(out, "expected", k + ".npy"), a)

# Ground truth (issue 34 item 3): each view's logical values, written out by hand (not through
# the views or .contiguous()); expected/ and the checkpoint (its items read back by dcp_truth's
# own reader) must hold exactly these, bit for bit.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcp_truth  # noqa: E402
TRUTH = {
    "t": torch.tensor([[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]),
    "s": torch.tensor([2, 3, 4], dtype=torch.int64),
    "m": torch.tensor([[6.0, 7.0, 8.0], [11.0, 12.0, 13.0]]),
    "e": torch.tensor([[1.5, -2.0, 3.25], [1.5, -2.0, 3.25]]),
    "c": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64),
    "scalar": torch.tensor(0x3FC0, dtype=torch.int16).view(torch.bfloat16),  # 1.5
}
dcp_truth.assert_expected(os.path.join(out, "expected"), TRUTH)
dcp_truth.assert_checkpoint(os.path.join(out, "ckpt"), TRUTH, {"step": 7, "cfg": {"a": [1, 2], "b": "x"}})
print("wrote", out, "(expected/ and ckpt/ equal to the views' values)")
