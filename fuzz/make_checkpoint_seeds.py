#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/checkpoint_fuzz.cpp into fuzz/corpus/checkpoint/: a valid
two-rank checkpoint (a [5, 3] tensor split along dim 0, a [2, 4] tensor split along dim 1, a
whole [3] tensor) in the target's input format, and the hostile manifests the reader must
refuse: file entries leaving the folder, slices past or before their tensors, an inverted
range, a dim past the tensor's, overflowing and negative shapes, a slice that disagrees with
the tensor in its file.

usage: make_checkpoint_seeds.py OUT_DIR
"""
import json
import os
import struct
import sys


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def safetensors(tensors):
    """tensors: name -> (shape, list of floats)."""
    header, blob = {}, b""
    for name, (shape, values) in tensors.items():
        data = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blob


def checkpoint():
    a = [float(i) for i in range(15)]
    b = [100.0 + i for i in range(8)]
    rank0 = safetensors({"a": ([2, 3], a[:6]), "b": ([2, 1], [b[0], b[4]]),
                         "c": ([3], [200.0, 201.0, 202.0])})
    rank1 = safetensors({"a": ([3, 3], a[6:]), "b": ([2, 3], b[1:4] + b[5:8])})
    files = [("rank_00000.safetensors", rank0), ("rank_00001.safetensors", rank1)]
    slices = [("a", 0, 0, 0, 2, [5, 3]), ("b", 0, 1, 0, 1, [2, 4]), ("c", 0, 0, 0, 3, [3]),
              ("a", 1, 0, 2, 5, [5, 3]), ("b", 1, 1, 1, 4, [2, 4])]
    lines = ["format: engine-checkpoint-1", "step: 20", "world_size: 2", "state:",
             "  data.step: 20", "counters:", "  a/step: 20", "files:"]
    for name, data in files:
        lines.append("  - {file: %s, bytes: %d, fnv1a64: %016x}" % (name, len(data),
                                                                   fnv1a64(data)))
    lines.append("slices:")
    for name, rank, dim, begin, end, shape in slices:
        lines.append("  - {name: %s, file: rank_%05d.safetensors, dim: %d, begin: %d, end: %d, "
                     "shape: [%s]}" % (name, rank, dim, begin, end, ", ".join(map(str, shape))))
    lines += ["config: |", "  train:", "    steps: 10"]
    manifest = "\n".join(lines) + "\n"
    return manifest, files


def pack(manifest, files):
    out = manifest.rstrip("\n").encode()
    for name, data in files:
        out += b"\n@@file " + name.encode() + b"\n" + data
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    manifest, files = checkpoint()
    seeds = {"valid": manifest}
    hostile = {
        "file_parent": ("file: rank_00001.safetensors,", "file: ../../../outside.safetensors,"),
        "file_absolute": ("file: rank_00001.safetensors,", "file: /etc/passwd,"),
        "slice_end_past": ("begin: 2, end: 5", "begin: 2, end: 100000"),
        "slice_begin_negative": ("begin: 2, end: 5", "begin: -100000, end: 5"),
        "slice_inverted": ("begin: 2, end: 5", "begin: 4, end: 3"),
        "slice_dim_past": ("dim: 1, begin: 0, end: 1", "dim: 7, begin: 0, end: 1"),
        "shape_overflow": ("shape: [5, 3]", "shape: [4294967296, 4294967296]"),
        "shape_negative": ("shape: [5, 3]", "shape: [5, -3]"),
        "slice_not_the_file": ("begin: 0, end: 2", "begin: 0, end: 3"),
    }
    for name, (old, new) in hostile.items():
        assert old in manifest, old
        seeds[name] = manifest.replace(old, new, 1)
    for name, text in seeds.items():
        with open(os.path.join(out_dir, name + ".ckpt"), "wb") as f:
            f.write(pack(text, files))


if __name__ == "__main__":
    main()
