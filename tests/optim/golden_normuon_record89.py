#!/usr/bin/env python3
"""Golden trajectory of record #89's NorMuon on the matrices of one block, as the record lays them
out (KellerJordan/modded-nanogpt f411b3d3, train_gpt.py: NorMuonAndAdam._normuon_update, lines
843-890; polar_express, 177-255; the banks, 1267-1301), in float64 with the standard library only.

What the record does that the file pins down:
- Q and K orthogonalised per head pair: qk_bank holds [2 head_dim, D] blocks, the Q pairs of a
  layer then its K pairs; V is one [D, D] matrix of vo_bank. The engine's merged QKV weight
  [3 D, D] (rows Q, K, V) is therefore the runs [[2 H/2, 2 hd, D], [1, D, D]].
- The shape factor sqrt(max(1, r / c)) of the matrix as the record stores it: the MLP projection is
  stored [4 D, D] (c_proj transposed), so it gets 2 where the engine's [D, 4 D] gets 1, and the
  record's per-matrix 2x of c_proj on top: the engine's group for it runs lr_mul 4 (the file's
  param_overrides). This script steps the projection the record's way, transposed.
- Nesterov momentum by lerp, Polar Express (5 iterations, X / (1.02 ||X||_F + 1e-6)), NorMuon's
  variance reduction along the long side, cautious weight decay W -= lr_e (wd_e [V W >= 0] W + V)
  with lr_e = lr lr_mul shape per_matrix and wd_e = weight_decay wd_mul lr.
The record keeps bf16 weights with a 16-bit mantissa buffer (a float32 master) and runs Polar
Express in bf16; this reference is the float64 rule those approximate, stored rounded to float32.

    python3 tests/optim/golden_normuon_record89.py   # writes tests/fixtures/golden/normuon/record89_head_pairs.safetensors
"""
import json
import math
import os
import random
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "golden",
                   "normuon", "record89_head_pairs.safetensors")

PE_COEFFS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
LR, MOMENTUM, BETA2, WEIGHT_DECAY, STEPS = 0.023, 0.95, 0.9, 1.2, 5
D, HEADS, HEAD_DIM = 12, 6, 2  # three head pairs of Q and of K, as the record's 6 heads of 128


# Matrices are lists of rows of floats.
def zeros(r, c):
    return [[0.0] * c for _ in range(r)]


def transpose(a):
    return [list(col) for col in zip(*a)]


def matmul(a, b):
    bt = transpose(b)
    return [[math.fsum(x * y for x, y in zip(row, col)) for col in bt] for row in a]


def polar_express(g):
    """The record's polar_express after its momentum: normalise, then five iterations on the
    small Gram matrix (tall: A = X^T X, X <- a X + X B; wide: A = X X^T, X <- a X + B X)."""
    norm = math.sqrt(math.fsum(x * x for row in g for x in row))
    x = [[v / (norm * (1 + 2e-2) + 1e-6) for v in row] for row in g]
    tall = len(g) > len(g[0])
    for a, b, c in PE_COEFFS:
        gram = matmul(transpose(x), x) if tall else matmul(x, transpose(x))
        gg = matmul(gram, gram)
        bm = [[b * p + c * q for p, q in zip(r1, r2)] for r1, r2 in zip(gram, gg)]
        prod = matmul(x, bm) if tall else matmul(bm, x)
        x = [[a * p + q for p, q in zip(r1, r2)] for r1, r2 in zip(x, prod)]
    return x


def normuon_variance(v, s):
    """_apply_normuon_variance_reduction: statistics along the short side's axis (one per row when
    rows >= cols, else one per column); s is updated in place."""
    rows, cols = len(v), len(v[0])
    per_row = rows >= cols
    if per_row:
        mean = [math.fsum(x * x for x in row) / cols for row in v]
        red = cols
    else:
        mean = [math.fsum(v[i][j] ** 2 for i in range(rows)) / rows for j in range(cols)]
        red = rows
    v_norm = math.sqrt(math.fsum(mean) * red)
    for k in range(len(s)):
        s[k] = s[k] + (1 - BETA2) * (mean[k] - s[k])
    step = [1 / math.sqrt(max(x, 1e-10)) for x in s]
    v_norm_new = math.sqrt(math.fsum(m * red * t * t for m, t in zip(mean, step)))
    scale = [t * (v_norm / max(v_norm_new, 1e-10)) for t in step]
    if per_row:
        return [[x * scale[i] for x in row] for i, row in enumerate(v)]
    return [[x * scale[j] for j, x in enumerate(row)] for row in v]


class Matrix:
    """One matrix of a bank: its momentum and second-moment buffers, its lr factors."""

    def __init__(self, rows, cols, per_matrix_lr=1.0):
        self.b = zeros(rows, cols)
        self.s = [0.0] * max(rows, cols)
        self.lr_mul = max(1.0, rows / cols) ** 0.5 * per_matrix_lr

    def step(self, w, g):
        self.b = [[p + (1 - MOMENTUM) * (q - p) for p, q in zip(r1, r2)]
                  for r1, r2 in zip(self.b, g)]  # buf.lerp_(g, 1 - mu)
        u = [[q + MOMENTUM * (p - q) for p, q in zip(r1, r2)]
             for r1, r2 in zip(self.b, g)]  # g.lerp_(buf, mu)
        v = normuon_variance(polar_express(u), self.s)
        lr_e = LR * self.lr_mul
        wd_e = WEIGHT_DECAY * 1.0 * LR  # wd_mul 1 for every NorMuon bank of the record
        return [[x - x * (1.0 if vi * x >= 0 else 0.0) * wd_e * lr_e - vi * lr_e
                 for x, vi in zip(wr, vr)] for wr, vr in zip(w, v)]


def rows_of(m, begin, n):
    return [list(r) for r in m[begin:begin + n]]


def main():
    if len(sys.argv) > 1:
        print(__doc__)
        return
    rng = random.Random(89)
    bound = 3 ** 0.5 * 0.5 * D ** -0.5

    def uniform(r, c):
        return [[rng.uniform(-bound, bound) for _ in range(c)] for _ in range(r)]

    def gauss(r, c):
        return [[rng.gauss(0.0, 1e-2) for _ in range(c)] for _ in range(r)]

    pair = 2 * HEAD_DIM
    shapes = {"blocks.0.attn.qkv.weight": (3 * D, D), "blocks.0.attn.proj.weight": (D, D),
              "blocks.0.mlp.fc.weight": (4 * D, D), "blocks.0.mlp.proj.weight": (D, 4 * D)}
    params = {name: uniform(*shape) for name, shape in shapes.items()}
    # The record's matrices of each engine parameter: (first row, rows, Matrix), on the record's
    # orientation; the projection is stepped transposed, as the record stores c_proj.
    qkv = [(k * pair, pair, Matrix(pair, D)) for k in range(2 * HEADS // 2)]
    qkv.append((2 * D, D, Matrix(D, D)))
    banks = {"blocks.0.attn.qkv.weight": qkv,
             "blocks.0.attn.proj.weight": [(0, D, Matrix(D, D))],
             "blocks.0.mlp.fc.weight": [(0, 4 * D, Matrix(4 * D, D))]}
    proj = Matrix(4 * D, D, per_matrix_lr=2.0)

    tensors = {f"init/{n}": p for n, p in params.items()}
    for t in range(1, STEPS + 1):
        for name, shape in shapes.items():
            g = gauss(*shape)
            tensors[f"grad/{t}/{name}"] = g
            w = params[name]
            if name == "blocks.0.mlp.proj.weight":
                params[name] = transpose(proj.step(transpose(w), transpose(g)))
            else:
                out = []
                for begin, n, m in banks[name]:
                    out += m.step(rows_of(w, begin, n), rows_of(g, begin, n))
                params[name] = out
            tensors[f"param/{t}/{name}"] = params[name]

    hyper = {
        "lr": LR, "momentum": MOMENTUM, "beta2": BETA2, "weight_decay": WEIGHT_DECAY,
        "matrix_views": {"blocks.0.attn.qkv.weight": [[2 * HEADS // 2, pair, D], [1, D, D]]},
        "param_overrides": {"blocks.0.mlp.proj.weight": {"lr_mul": 4.0}},
        "pe_coefficients": [list(c) for c in PE_COEFFS], "pe_eps": 1e-6, "pe_safety": 0.02,
        "mlp_proj_rule": "the record stores c_proj as [4D, D]: shape factor sqrt(4) = 2 times its "
                         "per-matrix 2x; the engine's [D, 4D] has shape factor 1, so lr_mul 4",
        "head_pair_rule": "Q and K per head pair ([2 head_dim, D] each, qk_bank), V one [D, D]",
    }
    meta = {
        "optimizer": "normuon",
        "steps": str(STEPS),
        "hyperparameters": json.dumps(hyper),
        "reference": "KellerJordan/modded-nanogpt@f411b3d346aa52d3504324ca93c230fd84c6c07f "
                     "train_gpt.py (NorMuonAndAdam, record 89); tests/optim/"
                     "golden_normuon_record89.py, float64, standard library only",
        "notes": "Record #89 NorMuon on one block's matrices in the record's layout: QKV [36, 12] "
                 "as three Q head pairs [4, 12], three K head pairs, V [12, 12]; the MLP "
                 "projection stepped transposed as the record stores it, with its 2x. Float64, "
                 "stored rounded to float32.",
        "suggested_atol": "1e-06",
    }
    write_safetensors(OUT, tensors, meta)
    print("wrote", os.path.normpath(OUT))


def write_safetensors(path, tensors, meta):
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name, m in tensors.items():
        flat = [x for row in m for x in row]
        blob = struct.pack(f"<{len(flat)}f", *flat)  # float64 rounded to nearest float32
        header[name] = {"dtype": "F32", "shape": [len(m), len(m[0])],
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


if __name__ == "__main__":
    main()
