"""Peak memory of fc-inspect on hostile torch DCP .metadata files (issue 14, item 2).

A ~1 MB .metadata whose pickle memoizes one 512 KB string and references it (BINGET) from
3000 storage entries as their relative_path: copying the string per reference would need
1.5 GB. fc must keep the peak RSS within 20x the metadata size + 64 MiB and refuse the file
with exit 5 ("shares values so heavily"); the same structure with a short path must stay
within the same bound. A 4 MB pickle of nothing but empty lists ("]]]]...", the most tree
per input byte) must be refused within the same bound (exit 10, the pickle memory budget).
The pickle is written here opcode by opcode (same structure as the
generator in tests/format/torch/torch_dcp_corruption_test.cc), so no torch is needed.

usage: metadata_memory_test.py BUILD_ROOT TESTDATA CASE     CASE: shared_string | shared_short | tiny_containers
"""
import os
import pickletools
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
INSPECT = os.path.join(BUILD, "tools", "fc-inspect")
MODULE = "torch.distributed.checkpoint.metadata"
ENTRIES = 3000


class Pickle:
    def __init__(self):
        self.b = bytearray(b"\x80\x04")  # PROTO 4

    def op(self, code):
        self.b += code
        return self

    def str(self, s):
        data = s.encode()
        if len(data) < 256:
            self.b += b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE
        else:
            self.b += b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE
        return self

    def glob(self, module, name):
        return self.str(module).str(name).op(b"\x93")  # STACK_GLOBAL

    def new_obj(self, module, name):
        # cls() with an empty dict state to be filled: cls EMPTY_TUPLE NEWOBJ EMPTY_DICT MARK
        return self.glob(module, name).op(b")\x81}(")


def shared_path_metadata(path):
    p = Pickle()
    p.str(path).op(b"\x940")  # MEMOIZE (memo 0 = the path), POP
    p.new_obj(MODULE, "Metadata")
    p.str("state_dict_metadata").op(b"}")
    p.str("storage_data").op(b"}(")
    for i in range(ENTRIES):
        p.new_obj(MODULE, "MetadataIndex")
        p.str("fqn").str(f"t{i}").str("offset").op(b"N").str("index").op(b"N").op(b"ub")
        p.new_obj("torch.distributed.checkpoint.filesystem", "_StorageInfo")
        p.str("relative_path").op(b"h\x00")  # BINGET 0: the shared path
        p.str("offset").op(b"K\x00").str("length").op(b"K\x01").op(b"ub")
    p.op(b"u")  # SETITEMS of storage_data
    p.op(b"ub.")  # SETITEMS of the Metadata state, BUILD, STOP
    data = bytes(p.b)
    for _ in pickletools.genops(data):  # a well-formed pickle by Python's own reader
        pass
    return data


def peak_rss_kib(args):
    """Runs args; returns (exit code, stderr, the child's own peak RSS in KiB)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read().decode(errors="replace"), usage.ru_maxrss


def main():
    with fcio.temp_dir("fc-metadata-memory-") as tmp:
        if CASE == "tiny_containers":
            data = b"\x80\x02" + b"]" * (4 << 20) + b"."  # PROTO 2, EMPTY_LIST..., STOP
        else:
            path = "x" * (512 * 1024) if CASE == "shared_string" else "__0_0.distcp"
            data = shared_path_metadata(path)
        ckpt = os.path.join(tmp, "ckpt")
        os.mkdir(ckpt)
        with open(os.path.join(ckpt, ".metadata"), "wb") as f:
            f.write(data)
        code, stderr, rss_kib = peak_rss_kib([INSPECT, ckpt])
        limit_kib = (20 * len(data) + (64 << 20)) // 1024
        print(f"{CASE}: .metadata {len(data)} bytes, fc-inspect exit {code}, peak RSS "
              f"{rss_kib / 1024:.1f} MiB ({rss_kib * 1024 / len(data):.1f}x the metadata), "
              f"limit {limit_kib / 1024:.1f} MiB")
        assert rss_kib <= limit_kib, f"peak RSS {rss_kib} KiB > {limit_kib} KiB\n{stderr}"
        if CASE == "tiny_containers":
            assert code == 10, f"exit {code}, expected 10\n{stderr}"
            assert "pickle" in stderr and "MiB allowed" in stderr, stderr
        elif CASE == "shared_string":
            assert len(data) > 1 << 20, len(data)
            assert code == 5, f"exit {code}, expected 5\n{stderr}"
            assert "shares values so heavily" in stderr, stderr
            assert ".metadata" in stderr, stderr
        else:
            # The short shared path is ordinary: the metadata reads, and fc-inspect (without
            # --verify) lists it without opening the data files.
            assert code == 0, f"exit {code}, expected 0\n{stderr}"
            assert "shares values so heavily" not in stderr, stderr


main()
