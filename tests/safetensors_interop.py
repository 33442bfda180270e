#!/usr/bin/env python3
"""Interop check between segtape's safetensors code and Hugging Face's package.

  safetensors_interop.py check FILE   load FILE (written by segtape) and verify it
  safetensors_interop.py write FILE   write FILE for segtape to load and verify

Both sides compute the expected values from the same formulas (see
tests/safetensors_test.cpp, InteropTensors), so no data is passed around:
  float tensors: element i = i * 0.5 - 3
  int64 tensors: element i = i * 1000000007 - 3
check also verifies that the metadata is a flat str -> str map holding
METADATA plus one "segtape.crc32.<name>" key per tensor whose value is
zlib.crc32 of the tensor's bytes as 8 lowercase hex digits. write stores no
checksums, as any other writer: segtape must load such files.
Exit status: 0 ok, 1 mismatch (reason on stderr), 2 usage error.
"""
import sys
import zlib

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

# name -> (numpy dtype, shape); must match InteropTensors in safetensors_test.cpp.
SPEC = {
    "w": (np.float32, (2, 3)),
    "b": (np.float64, (5,)),
    "steps": (np.int64, (3,)),
    "scalar": (np.float32, ()),
    "empty": (np.float32, (0, 4)),
}
METADATA = {"producer": "segtape", "step": "17"}
CHECKSUM_PREFIX = "segtape.crc32."


def expected(dtype, shape):
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    v = i * 1000000007 - 3 if dtype == np.int64 else i * 0.5 - 3
    return v.astype(dtype).reshape(shape)


def check(path):
    tensors = load_file(path)
    if set(tensors) != set(SPEC):
        return f"tensor names {sorted(tensors)} != {sorted(SPEC)}"
    for name, (dtype, shape) in SPEC.items():
        t = tensors[name]
        if t.dtype != dtype or t.shape != shape:
            return f"{name}: got {t.dtype}{t.shape}, want {np.dtype(dtype)}{shape}"
        if not np.array_equal(t, expected(dtype, shape)):
            return f"{name}: values differ: {t.ravel()[:8]}"
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        return f"metadata is not str -> str: {meta!r}"
    user = {k: v for k, v in meta.items() if not k.startswith(CHECKSUM_PREFIX)}
    if user != METADATA:
        return f"metadata {user} != {METADATA}"
    sums = {k[len(CHECKSUM_PREFIX):]: v for k, v in meta.items() if k.startswith(CHECKSUM_PREFIX)}
    if set(sums) != set(SPEC):
        return f"checksum keys for {sorted(sums)}, want one per tensor {sorted(SPEC)}"
    for name, stored in sums.items():
        want = format(zlib.crc32(np.ascontiguousarray(tensors[name]).tobytes()), "08x")
        if stored != want:
            return f"{name}: stored checksum {stored!r}, zlib.crc32 of its bytes is {want!r}"
    return None


def write(path):
    tensors = {name: expected(dtype, shape) for name, (dtype, shape) in SPEC.items()}
    # A dtype segtape reads only as raw bytes: -3.0, -2.5, -2.0 as float16.
    tensors["half"] = expected(np.float16, (3,))
    save_file(tensors, path, metadata=METADATA)


def main(argv):
    if len(argv) != 3 or argv[1] not in ("check", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "write":
        write(argv[2])
        return 0
    problem = check(argv[2])
    if problem:
        print(f"safetensors_interop: {argv[2]}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
