"""Checksums are verified on every read of an fc distcp checkpoint, and an uncaught
std::bad_alloc is exit 10 (fc/format/chunk_reader.h, tools/cli_common.h).

usage: checksum_test.py BUILD_ROOT TESTDATA CASE
CASE: damaged | oom
"""
import json
import os
import resource
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import fcio  # noqa: E402

BUILD, TESTDATA, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
EXPORT, CONVERT, DIFF, INSPECT = fcio.tools(BUILD, "fc-export", "fc-convert", "fc-diff", "fc-inspect")
FIXTURE = os.path.join(TESTDATA, "torch_dcp", "mixed", "ckpt")
tmp = tempfile.mkdtemp(prefix="fc-checksum-")


def run(args, expect=0, limit=120, preexec_fn=None):
    return fcio.run(args, expect, limit, preexec_fn=preexec_fn)


def case_damaged():
    # A converted fc distcp checkpoint with one flipped byte in one chunk.
    ckpt = os.path.join(tmp, "fc")
    run([CONVERT, FIXTURE, ckpt, "--quiet", "--target-like", FIXTURE])
    meta = json.load(open(os.path.join(ckpt, "fc.metadata.json")))
    tensor = max(meta["tensors"], key=lambda t: max(c["byte_length"] for c in t["chunks"]))
    chunk = max(tensor["chunks"], key=lambda c: c["byte_length"])
    path = os.path.join(ckpt, chunk["file"])
    data = bytearray(open(path, "rb").read())
    data[chunk["byte_offset"] + chunk["byte_length"] // 2] ^= 0x40
    open(path, "wb").write(data)
    names = [chunk["file"], f"tensor '{tensor['key']}' chunk", "checksum mismatch"]

    def refused(p, tool):
        for n in names:
            assert n in p.stderr, f"{tool}: '{n}' not in the message:\n{p.stderr}"

    out = os.path.join(tmp, "export")
    refused(run([EXPORT, ckpt, out, "--quiet"], expect=5), "fc-export")
    assert not os.path.exists(out), "a refused export left its output"
    run([EXPORT, ckpt, out, "--quiet", "--no-verify-checksums"], expect=0)
    assert os.path.exists(os.path.join(out, "model.safetensors"))

    out = os.path.join(tmp, "convert")
    refused(run([CONVERT, ckpt, out, "--quiet", "--target-like", ckpt], expect=5), "fc-convert")
    assert not os.path.exists(out)
    run([CONVERT, ckpt, out, "--quiet", "--target-like", ckpt, "--no-verify-checksums"])
    # The damage was copied, under fresh checksums: only because it was asked for.
    run([INSPECT, out, "--verify"], expect=0)

    # A damaged object: fc-convert refuses to copy it, naming it.
    objckpt = os.path.join(tmp, "fc-obj")
    run([CONVERT, FIXTURE, objckpt, "--quiet", "--target-like", FIXTURE])
    obj = json.load(open(os.path.join(objckpt, "fc.metadata.json")))["objects"][0]
    path = os.path.join(objckpt, obj["file"])
    data = bytearray(open(path, "rb").read())
    data[obj["byte_offset"] + obj["byte_length"] - 1] ^= 0x01
    open(path, "wb").write(data)
    p = run([CONVERT, objckpt, os.path.join(tmp, "obj-out"), "--quiet", "--target-like", objckpt],
            expect=5)
    assert f"{obj['file']}: object '{obj['key']}': checksum mismatch" in p.stderr, p.stderr
    run([CONVERT, objckpt, os.path.join(tmp, "obj-out2"), "--quiet", "--target-like", objckpt,
         "--no-verify-checksums"])

    refused(run([DIFF, ckpt, FIXTURE, "--quiet"], expect=5), "fc-diff")
    run([DIFF, ckpt, FIXTURE, "--quiet", "--no-verify-checksums"], expect=1)  # differs
    # fc-inspect --verify names it as before (exit 11), and intact copies pass everywhere.
    run([INSPECT, ckpt, "--verify"], expect=11)
    run([DIFF, out, ckpt, "--quiet"], expect=5)  # out is intact, ckpt is not


def case_oom():
    # An uncaught std::bad_alloc must be exit 10 with a message, not SIGABRT. The fixture's
    # torch DCP .metadata with a 64 MiB string pushed (and popped) in front, then a protocol 0
    # INT (pushed and popped) that sends it from the compact decoder (which views strings in
    # place) to the general one (which copies them): reading it needs about 130 MiB (the
    # file, then the string); under a 100 MiB address-space limit an allocation fails
    # wherever it happens.
    ckpt = os.path.join(tmp, "oom")
    shutil.copytree(FIXTURE, ckpt)
    size = 64 << 20
    payload = b"\x80\x02" + b"X" + size.to_bytes(4, "little") + b"a" * size + b"0"  # BINUNICODE, POP
    payload += b"I01\n0"  # INT True, POP
    original = open(os.path.join(ckpt, ".metadata"), "rb").read()
    assert original[:1] == b"\x80", original[:4]
    open(os.path.join(ckpt, ".metadata"), "wb").write(payload + original[2:])
    run([INSPECT, ckpt], expect=0)  # unlimited, it reads

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (100 << 20, 100 << 20))

    p = run([INSPECT, ckpt], expect=None, preexec_fn=limit)
    assert p.returncode == 10, f"exit {p.returncode}, expected 10\n{p.stderr}"
    assert p.stderr.startswith("fc-inspect: error: out of memory"), p.stderr
    assert "(exit 10)" in p.stderr, p.stderr


fcio.run_case(globals(), CASE, tmp)
print(f"checksum_test {CASE}: ok")
