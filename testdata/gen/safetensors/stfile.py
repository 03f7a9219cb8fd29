"""A small, independent safetensors writer and validating reader (json + numpy only), for
the fixture generators and their --check modes. Written from the format description
(shared/reference/formats.md section 6), not from fc's code.

write(path, tensors, metadata): tensors is a list of (name, dtype string, shape, raw bytes);
  laid out like the reference writer: sorted by descending dtype rank (upstream Dtype enum
  order, see RANK), then name; header padded with spaces to a multiple of 8.
read(path) -> (metadata dict or None, {name: (dtype string, shape tuple, raw bytes)}),
  checking the header length, the byte size of every tensor and the exact tiling.
"""
import json
import struct

# Upstream Dtype enum order (newest): the reference writer sorts by it, descending.
# F8_E5M2FNUZ / F8_E4M3FNUZ are placed after F8_E4M3 (their place upstream is not known here).
ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3",
         "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32", "U32",
         "F32", "C64", "F64", "I64", "U64"]
RANK = {d: i for i, d in enumerate(ORDER)}
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E5M2FNUZ": 8, "F8_E4M3FNUZ": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
        "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
        "I64": 64, "U64": 64}


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    bits = n * BITS[dtype]
    assert bits % 8 == 0, (dtype, shape)
    return bits // 8


def encode(tensors, metadata=None):
    tensors = sorted(tensors, key=lambda t: (-RANK[t[1]], t[0].encode()))
    header, blobs, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        assert len(raw) == nbytes(dtype, shape), (name, len(raw))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(encode(tensors, metadata))


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), path
    header = json.loads(raw[8:8 + n].decode())
    metadata = header.pop("__metadata__", None)
    buf = raw[8 + n:]
    out, spans = {}, []
    for name, e in header.items():
        b, end = e["data_offsets"]
        assert end - b == nbytes(e["dtype"], e["shape"]), (path, name)
        spans.append((b, end))
        out[name] = (e["dtype"], tuple(e["shape"]), buf[b:end])
    pos = 0
    for b, end in sorted(spans):
        assert b == pos, (path, "tiling", b, pos)
        pos = end
    assert pos == len(buf), (path, "tail")
    return metadata, out


def data_offsets(path):
    """name -> absolute file offset of the tensor's data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode())
    header.pop("__metadata__", None)
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items()}
