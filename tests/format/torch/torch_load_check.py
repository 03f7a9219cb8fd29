#!/usr/bin/env python3
"""Loads a torch DCP checkpoint with real torch (Debian's torch 1.13) and compares every
tensor element and object with expected values. Used to prove that checkpoints written by
fc's TorchDcpWriter are accepted by torch's own `load_state_dict`.

usage: /usr/bin/python3 torch_load_check.py CKPT EXPECTED_DIR
           [--objects OBJECTS.json] [--layout saved,whole,resplit] [--no-zip-check]

CKPT          a DCP directory (.metadata + __<rank>_<n>.distcp), 1.13 generation
EXPECTED_DIR  <fqn>.npy with the full value of every tensor (bfloat16 as uint16 bit patterns)
--objects     JSON {fqn: value} of the non-tensor items to check (others are ignored)
--layout      comma-separated list of the shardings to load into (torch reshards on load);
              each is a separate load_state_dict into fresh tensors:
                saved    each rank holds exactly the chunks stored in its __<rank>_* files
                whole    rank 0 holds every tensor whole; the other ranks hold nothing
                resplit  axis 0 split evenly over the ranks in reverse rank order (0-d:
                         the last rank), a sharding that differs from the saved one
              default: saved
--no-zip-check  skip validating every item with Python's zipfile (names, CRC-32s)

The world is max(rank in the file names) + 1 gloo processes on 127.0.0.1. Each builds a
state dict of ShardedTensors (init_from_local_shards) filled with a sentinel, calls
torch.distributed._shard.checkpoint.load_state_dict(sd, FileSystemReader(CKPT)), and
compares its local shards bit-exactly with the slices of the expected arrays.

The parent process reads .metadata with a stub unpickler (CPython's own pickle machinery,
but no torch classes), so it never imports torch; only the ranks do.

Exit status: 0 all equal; 1 mismatch or load failure (messages on stderr); 77 torch cannot
be imported (the meson "skipped" code); torch that imports without its DCP module is a
failure. The torch 1.13 / Python 3.11 shim is the repository's tests/support/torch113_shim.py.
"""
import argparse
import io
import json
import multiprocessing
import os
import pickle
import re
import socket
import sys
import tempfile
import time
import traceback
import zipfile
from datetime import timedelta

SKIP = 77
IMPORT_FAILED = "IMPORT_FAILED: "
LAYOUTS = ("saved", "whole", "resplit")


def install_shim():
    """torch 1.13's DCP does not import on Python 3.11 without the shim. Installed when this
    file is imported, so that the spawned ranks (which re-import it) get it too."""
    here = os.path.dirname(os.path.abspath(__file__))
    # The project's own copy (tests/support), so that a plain clone has it.
    candidates = [os.path.join(here, "..", "..", "support")]
    for c in candidates:
        if os.path.exists(os.path.join(c, "torch113_shim.py")):
            sys.path.insert(0, os.path.abspath(c))
            try:
                import torch113_shim  # noqa: F401
            except ImportError:
                pass
            return


install_shim()


# --- .metadata without torch -----------------------------------------------------------

class Stub:
    """Any class or function named by the pickle: remembers call args and BUILD state."""
    module = ""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class StubUnpickler(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f)
        self.classes = {}
        self.globals = set()

    def find_class(self, module, name):
        self.globals.add(f"{module}.{name}")
        if (module, name) == ("builtins", "getattr"):
            return lambda obj, attr: (obj, attr)
        key = (module, name)
        if key not in self.classes:
            self.classes[key] = type(name, (Stub,), {"module": module})
        return self.classes[key]


def load_metadata_stub(path):
    """(Metadata stub, set of 'module.name' globals) via CPython's unpickler."""
    with open(path, "rb") as f:
        u = StubUnpickler(f)
        md = u.load()
    return md, u.globals


def size_of(v):
    """A torch.Size stub -> list of ints."""
    return list(v.args[0])


RANK_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


def saved_chunks(md):
    """{fqn: [(rank, offsets, sizes)]} and the world size, from .metadata alone."""
    chunks, world = {}, 1
    for index, info in md.storage_data.items():
        m = RANK_RE.match(info.relative_path)
        if not m:
            raise RuntimeError(f"unexpected data file name {info.relative_path}")
        world = max(world, int(m.group(1)) + 1)
        offset = getattr(index, "offset", None)
        if offset is None:
            continue
        item = md.state_dict_metadata[index.fqn]
        sizes = [size_of(c.sizes) for c in item.chunks if size_of(c.offsets) == size_of(offset)]
        if len(sizes) != 1:
            raise RuntimeError(f"{index.fqn}: storage_data offset {size_of(offset)} is no chunk")
        chunks.setdefault(index.fqn, []).append((int(m.group(1)), size_of(offset), sizes[0]))
    return chunks, world


def zip_check(ckpt, md):
    """Every item is a zip Python reads, with matching CRC-32s."""
    for index, info in md.storage_data.items():
        with open(os.path.join(ckpt, info.relative_path), "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        where = f"{info.relative_path}: item {index.fqn}"
        if len(blob) != info.length:
            raise RuntimeError(f"{where} passes the end of the file")
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            bad = z.testzip()
            if bad is not None:
                raise RuntimeError(f"{where}: bad CRC-32 in {bad}")
            names = z.namelist()
            if "archive/data.pkl" not in names or "archive/version" not in names:
                raise RuntimeError(f"{where}: records {names}")


# --- the ranks ---------------------------------------------------------------------------

def target_boxes(layout, fqn, shape, saved, rank, world):
    """The (offsets, sizes) this rank holds for one tensor under `layout`."""
    if layout == "saved":
        return [(o, s) for r, o, s in saved.get(fqn, []) if r == rank]
    if layout == "whole":
        return [([0] * len(shape), list(shape))] if rank == 0 else []
    # resplit: axis 0 in `world` near-equal parts, part k on rank world-1-k.
    if len(shape) == 0:
        return [([], [])] if rank == world - 1 else []
    n, k = shape[0], world - 1 - rank
    lo, hi = n * k // world, n * (k + 1) // world
    if hi <= lo:
        return []
    return [([lo] + [0] * (len(shape) - 1), [hi - lo] + list(shape[1:]))]


def to_numpy_bits(t):
    import numpy as np
    import torch
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def check_layout(rank, world, args, layout, saved, expected_objects, errors):
    import numpy as np
    import torch
    import torch.distributed._shard.checkpoint as dcp
    from torch.distributed._shard.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards

    reader = dcp.FileSystemReader(args.ckpt)
    md = reader.read_metadata()  # real torch classes this time
    gen = torch.Generator().manual_seed(1234 + rank)
    sd, boxes = {}, {}
    for fqn, item in md.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            sd[fqn] = None  # replaced by the loaded object
            continue
        shape = list(item.size)
        boxes[fqn] = target_boxes(layout, fqn, shape, saved, rank, world)
        shards = []
        for o, s in boxes[fqn]:
            # A sentinel the load must overwrite.
            local = (torch.randint(0, 100, s, generator=gen) + 7).to(item.properties.dtype)
            shards.append(Shard(local, ShardMetadata(o, s, f"rank:{rank}/cpu")))
        sd[fqn] = init_from_local_shards(shards, shape)
    dcp.load_state_dict(sd, reader)

    tag = f"[{layout}] "
    for fqn, bl in boxes.items():
        path = os.path.join(args.expected, fqn + ".npy")
        if not os.path.exists(path):
            errors.append(f"{tag}{fqn}: no expected value {path}")
            continue
        full = np.load(path)
        shape = list(sd[fqn].size())
        if list(full.shape) != shape and full.size == int(np.prod(shape)):
            full = full.reshape(shape)  # e.g. a 0-d tensor saved as shape (1,)
        local = sd[fqn].local_shards()
        if len(local) != len(bl):
            errors.append(f"{tag}{fqn}: {len(local)} local shards, expected {len(bl)}")
            continue
        for shard in local:
            o = list(shard.metadata.shard_offsets)
            s = list(shard.metadata.shard_sizes)
            want = np.array(full[tuple(slice(a, a + b) for a, b in zip(o, s))], order="C")
            got = to_numpy_bits(shard.tensor)
            if got.shape != want.shape or got.dtype != want.dtype:
                errors.append(f"{tag}{fqn} shard at {o} size {s}: got {got.dtype}{got.shape}, "
                              f"expected {want.dtype}{want.shape}")
            elif got.tobytes() != want.tobytes():
                diff = [i for i in np.ndindex(*got.shape) if got[i].tobytes() != want[i].tobytes()]
                errors.append(f"{tag}{fqn} shard at {o} size {s}: {len(diff)} elements differ, "
                              f"first at {list(diff[0])}: got {got[diff[0]]}, "
                              f"expected {want[diff[0]]}")
    for k, v in (expected_objects or {}).items():
        if k not in sd:
            errors.append(f"{tag}object {k}: not in the checkpoint")
        elif sd[k] != v:
            errors.append(f"{tag}object {k}: got {sd[k]!r}, expected {v!r}")


def worker(rank, world, port, args, saved, expected_objects, result_dir):
    errors = []
    try:
        import numpy  # noqa: F401
        import torch
    except ImportError as e:  # torch (or numpy) absent: the check cannot run here
        errors.append(f"{IMPORT_FAILED}{e}")
    try:
        # torch imports, so its DCP module must too: a failure here is a failure, not a skip.
        import torch.distributed as dist
        import torch.distributed._shard.checkpoint  # noqa: F401
    except Exception as e:  # noqa: BLE001
        if not errors:
            errors.append(f"torch {torch.__version__} imports but its DCP module does not: "
                          f"{type(e).__name__}: {e}")
    if not errors:
        try:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("gloo", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=120))
            for layout in args.layouts:
                check_layout(rank, world, args, layout, saved, expected_objects, errors)
                dist.barrier()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            errors.append(traceback.format_exc())
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(errors, f)
    if errors:
        os._exit(3)  # lets the parent stop the ranks still waiting in a collective


def run_ranks(world, args, saved, expected_objects):
    """Runs the ranks; returns the list of error strings (IMPORT_FAILED-prefixed ones mean
    torch is unusable)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as result_dir:
        procs = [ctx.Process(target=worker,
                             args=(r, world, port, args, saved, expected_objects, result_dir))
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.time() + 600
        failed_at = None
        while any(p.is_alive() for p in procs):
            if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                failed_at = time.time()
            if (failed_at is not None and time.time() > failed_at + 5) or time.time() > deadline:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                break
            time.sleep(0.05)
        for p in procs:
            p.join()
        errors = []
        for r in range(world):
            path = os.path.join(result_dir, f"rank{r}.json")
            if not os.path.exists(path):
                errors.append(f"rank {r}: no result (exit code {procs[r].exitcode})")
                continue
            with open(path) as f:
                errors += [e if e.startswith(IMPORT_FAILED) else f"rank {r}: {e}"
                           for e in json.load(f)]
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("expected")
    ap.add_argument("--objects")
    ap.add_argument("--layout", default="saved")
    ap.add_argument("--no-zip-check", action="store_true")
    args = ap.parse_args()
    args.layouts = args.layout.split(",")
    for layout in args.layouts:
        if layout not in LAYOUTS:
            ap.error(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"torch_load_check: skipped, cannot import numpy: {e}", file=sys.stderr)
        return SKIP

    try:
        md, _ = load_metadata_stub(os.path.join(args.ckpt, ".metadata"))
        if not args.no_zip_check:
            zip_check(args.ckpt, md)
        saved, world = saved_chunks(md)
    except Exception as e:  # noqa: BLE001
        print(f"torch_load_check: {args.ckpt}: {e}", file=sys.stderr)
        return 1
    expected_objects = None
    if args.objects:
        with open(args.objects) as f:
            expected_objects = json.load(f)

    errors = run_ranks(world, args, saved, expected_objects)
    if any(e.startswith(IMPORT_FAILED) for e in errors):
        print(f"torch_load_check: skipped, cannot import torch: "
              f"{next(e for e in errors if e.startswith(IMPORT_FAILED))}", file=sys.stderr)
        return SKIP
    if errors:
        for e in errors:
            print(f"torch_load_check: {args.ckpt}: {e}", file=sys.stderr)
        return 1
    print(f"torch_load_check: {args.ckpt}: {len(saved)} sharded tensors, "
          f"{len(md.state_dict_metadata) - len(saved)} other items, world {world}, "
          f"layouts {','.join(args.layouts)}: torch loaded every element as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
