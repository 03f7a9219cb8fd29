#!/usr/bin/python3
"""Independent reader for the numpy interop test (tests/format/safetensors).

Parses a safetensors file with nothing but json + numpy, checks the layout rules, and
prints one line per tensor:   <name> <dtype> <shape> <sum of values> <hex of bytes>
where the sum is computed by numpy from the decoded values (bfloat16 decoded by hand,
float8 skipped as "-"). Exit 0 on success, 1 on a rule violation, 77 when numpy is absent.
"""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(77)

NUMPY = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
         "F16": "<f2", "F32": "<f4", "F64": "<f8", "BF16": "<u2", "F8_E4M3": "|u1",
         "F8_E5M2": "|u1"}


def main(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    header = json.loads(data[8:8 + n].decode("utf-8"))
    buf = data[8 + n:]
    header.pop("__metadata__", None)
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1]) for v in header.values())
    pos = 0
    for b, e in spans:
        assert b == pos, "gap or overlap at %d" % b
        pos = e
    assert pos == len(buf), "buffer is %d bytes, tensors end at %d" % (len(buf), pos)
    for name, v in header.items():
        b, e = v["data_offsets"]
        shape = tuple(v["shape"])
        dt = np.dtype(NUMPY[v["dtype"]])
        arr = np.frombuffer(buf, dtype=dt, count=int(np.prod(shape, dtype=np.int64)),
                            offset=b).reshape(shape)
        assert arr.nbytes == e - b
        if v["dtype"] == "BF16":
            values = (arr.astype(np.uint32) << 16).view(np.float32)
            total = repr(int(values.astype(np.float64).sum()))
        elif v["dtype"].startswith("F8"):
            total = "-"
        else:
            total = repr(int(arr.astype(np.float64).sum()))
        print(name, v["dtype"], "x".join(map(str, shape)) or "scalar", total, arr.tobytes().hex())


if __name__ == "__main__":
    main(sys.argv[1])
