#!/usr/bin/env python3
"""The golden output of modded-nanogpt's bfloat16 Newton-Schulz (record #24, train_gpt.py at
3e121a6e: zeropower_via_newtonschulz5 applied to G.bfloat16()) for the inputs of
tests/fixtures/golden/newton_schulz/ns5.safetensors, computed by PyTorch on the CPU in bfloat16
(every op stores bf16; matmuls sum in float), as eager PyTorch runs it (ns5_bf16.safetensors) and
as torch.compile runs it, b A + P and a X + Q each rounded once (ns5_bf16_compiled.safetensors).
Each file beside ns5: init/<case> the input (as in ns5), param/1/<case> the bf16 output widened to
float32.

    /usr/bin/python3 tests/optim/golden_ns_bf16.py   # Debian's python3-torch
"""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                    "golden", "newton_schulz")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(info["shape"])
    return out, meta


def write_safetensors(path, tensors, meta):
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def scale(s, T):
    """s * T for a bf16 tensor T and a Python float s as CUDA computes it (the record's device):
    in float (the op math type of bf16), rounded once. PyTorch's CPU kernels (1.13) round s to
    bf16 first, so the product is written out here."""
    return (s * T.float()).bfloat16()


def fused_axpy(s, X, P):
    """s * X + P for bf16 tensors X, P and a Python float s as the record's compiled function
    computes it: Inductor fuses the scalar product and the sum into one kernel that reads the
    stored bf16 values, computes in float32 (s a float32 kernel argument) with the multiply and
    add contracted to one FMA (Triton's default fp fusion) and rounds once to bf16. The FMA is
    written out in float64: s X is exact there (24 + 8 significant bits), and so is the sum with
    P unless the two are 2^21 apart, then rounded once to float32 as fmaf rounds."""
    s32 = torch.tensor(s, dtype=torch.float32).double()
    return (s32 * X.double() + P.double()).float().bfloat16()


def zeropower_bf16(G, steps=5, compiled=False):
    """The record's orthogonaliser as it runs there: X = G.bfloat16(), then bf16 tensor ops. The
    norm is summed in float and rounded once, as CUDA reduces bf16 (PyTorch 1.13's CPU norm over
    two dimensions of a batch loses bits), and its + eps is in float, as CUDA adds a scalar.
    Its `c * A @ A` is (c * A) @ A: Python's * and @ bind equally, left to right. compiled: the
    function as torch.compile runs it, b A + P and a X + Q each rounded once (fused_axpy)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    norm = X.float().norm(dim=(-2, -1), keepdim=True).bfloat16()
    X = X / (norm.float() + 1e-7).bfloat16()
    for _ in range(steps):
        A = X @ X.mT
        if compiled:
            B = fused_axpy(b, A, scale(c, A) @ A)
            X = fused_axpy(a, X, B @ X)
        else:
            B = scale(b, A) + scale(c, A) @ A
            X = scale(a, X) + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def main():
    torch.set_num_threads(1)
    src, _ = read_safetensors(os.path.join(HERE, "ns5.safetensors"))
    for compiled, file, how in (
            (False, "ns5_bf16.safetensors",
             "eager PyTorch: every op rounds its result to bf16"),
            (True, "ns5_bf16_compiled.safetensors",
             "torch.compile (Inductor): every op rounds its result to bf16 but b A + P and a X + Q, "
             "each one float32 FMA rounded once")):
        out = {}
        for name in sorted(k for k in src if k.startswith("init/")):
            case = name[len("init/"):]
            g = torch.from_numpy(src[name].copy())
            out[name] = src[name]
            out["param/1/" + case] = zeropower_bf16(g, compiled=compiled).float().numpy()
        meta = {
            "optimizer": "newton_schulz5_bf16",
            "steps": "1",
            "reference": "KellerJordan/modded-nanogpt@3e121a6ef079f37614b98369ead081aade5c87b4 "
                         "train_gpt.py zeropower_via_newtonschulz5(G.bfloat16(), 5)",
            "notes": "PyTorch %s on the CPU, 1 thread, bfloat16 tensors as %s; matmuls accumulate "
                     "in float32, products with the coefficients in float as CUDA computes them. "
                     "Made by tests/optim/golden_ns_bf16.py from ns5.safetensors' inputs."
                     % (torch.__version__, how),
        }
        path = os.path.join(HERE, file)
        write_safetensors(path, out, meta)
        print(f"wrote {path}: {len(out) // 2} cases")


if __name__ == "__main__":
    sys.exit(main())
