#!/usr/bin/python3
"""PyTorch reference of the GPT in docs/specs/model.md, written independently of the engine.

Parity mode: reads the weights (safetensors, F32; the model config travels in the file's
metadata as model.* keys, as the engine writes it) and B*(T+1) tokens from a token shard
(row b = tokens [b(T+1), (b+1)(T+1)): inputs the first T, targets the last T), runs forward and
backward in float64 (default), writes `loss`, `ce_loss` and `grad/<param>` to safetensors.

With --precision bf16 the model rounds where the engine's bf16 precision rounds
(docs/precision.md): each matmul weight and the activation it multiplies to bf16 (nearest, ties
to even) in the forward, the output gradient to bf16 in the backward (for the qkv and MLP fc
outputs before their bias gradients too, as the engine stores those gradients in bf16), the MoE
router's input (stored bf16; the router's weight and product stay f32), every write of the
residual stream (the embedding output, the recipe's skip and x0 mixes, each block's sums after
attention and after the MLP or MoE; stored bf16, its gradient f32), the logits of the
ordinary head (stored bf16 as g z, g the sigmoid cap's gain), straight through
otherwise; attention's own products stay unrounded. --fd K adds K central finite
differences of the same model with its roundings frozen at the given weights (the function whose
gradient the straight-through rule computes), along seeded random directions, and writes how far
the straight-through gradient without the backward's roundings (check/fd_rel_err) and the one
with them (check/fd_rel_err_rounded) are from them.

Bench mode (--bench): times forward+backward+AdamW of a seeded float32 model and prints
tokens/s (one JSON object with --json, with what PyTorch ran on: its version, threads, BLAS and
OpenBLAS kernel, CPU capability, oneDNN); --precision bf16 runs the same model under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's own bf16 mixed precision.

Train mode (--train --config C.yaml --batches DIR --metrics OUT.jsonl [--target LOSS]): trains the
float32 model the way the engine trains config C with a single AdamW group, for the side-by-side
time to target (scripts/time_to_target.py): the initial weights, the batches in order and the
validation rows are those apps/dump_batches wrote to DIR, the learning-rate schedule and the AdamW
hyperparameters are read from C, and the metrics are written in the engine's metrics.jsonl format
(train time excludes validation and the untimed warm-up steps, as in the engine).

torch 1.13 has no safetensors package, so the format (u64 LE header length, JSON header, raw
little-endian data) is parsed and written here with numpy.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    base = 8 + n
    for name, info in header.items():
        if info["dtype"] not in ST_DTYPES:
            raise SystemExit(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[base + b:base + e], dtype=np.dtype(ST_DTYPES[info["dtype"]]).newbyteorder("<"))
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors, meta


def write_safetensors(path, tensors, meta=None):
    header = {}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype="<f4")
        raw = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        if header[0] != 20240520 or header[1] != 1:
            raise SystemExit(f"{path}: not a token shard (magic {header[0]}, version {header[1]})")
        tokens = np.frombuffer(f.read(), dtype="<u2")
    if len(tokens) != header[2]:
        raise SystemExit(f"{path}: header says {header[2]} tokens, file holds {len(tokens)}")
    return tokens.astype(np.int64)


class Config:
    def __init__(self, meta=None, **kw):
        meta = dict(meta or {})
        get = lambda k, d: kw.get(k, meta.get("model." + k, d))
        self.arch = str(get("arch", "modern"))
        self.n_layer = int(get("n_layer", 2))
        self.n_head = int(get("n_head", 2))
        self.d_model = int(get("d_model", 64))
        self.seq_len = int(get("seq_len", 64))
        self.vocab_size = int(get("vocab_size", 50257))
        self.softcap = float(get("softcap", 0.0))
        self.experts = int(get("moe.experts", 0))
        self.top_k = int(get("moe.top_k", 2))
        self.aux_weight = float(get("moe.aux_weight", 0.01))
        # The record recipe's keys (docs/specs/model.md), all off by default.
        flag = lambda k: str(get(k, "false")).lower() == "true"
        self.vocab_pad = int(get("vocab_pad", 64))
        self.softcap_form = str(get("softcap_form", "tanh"))
        self.softcap_scale = float(get("softcap_scale", 0.0))
        # Record #89's asymmetric cap A sigmoid((x + B) / C) (triton_kernels.py's A, B, C).
        self.softcap_offset = float(get("softcap_offset", 0.0))
        self.attn_scale = float(get("attn_scale", 0.0))
        self.no_attn_layers = [int(t) for t in str(get("no_attn_layers", "")).split(",") if t.strip()]
        self.value_embeds = int(get("value_embeds", 0))
        # Record #89: table i serves block value_embed_layers[i].
        self.value_embed_layers = [int(t) for t in str(get("value_embed_layers", "")).split(",") if t.strip()]
        self.unet_skips = flag("unet_skips")
        self.x0_lambdas = flag("x0_lambdas")
        self.doc_bos = int(get("doc_bos", -1))
        self.window = int(get("window", 0))
        self.window_pattern = str(get("window_pattern", ""))
        self.padded_vocab = (self.vocab_size + self.vocab_pad - 1) // self.vocab_pad * self.vocab_pad
        # The record's exact forms (docs/record_recipe.md), read from train_gpt.py at 3e121a6e.
        self.window_block = int(get("window_block", 0))
        self.x0_norm = flag("x0_norm")
        self.norm_eps = float(get("norm_eps", 1e-6))
        self.rotary_base = float(get("rotary_base", 10000.0))
        self.rotary_truncate = flag("rotary_truncate")
        self.v_lambdas_all = flag("v_lambdas_all")
        self.loss_over_padding = flag("loss_over_padding")
        self.embed_std = float(get("embed_std", 0.02))
        self.uniform_matrix_init = flag("uniform_matrix_init")
        self.head_fp8 = flag("head_fp8")
        # head_fp8's scales in units of 1/448 (x 0: sqrt(d_model)).
        self.head_fp8_scales = (float(get("head_fp8_x_scale", 0.0)),
                                float(get("head_fp8_w_scale", 24.0)),
                                float(get("head_fp8_grad_scale", 1.0)))
        # Record #89 (train_gpt.py at f411b3d3), each off by default.
        self.key_offset = flag("key_offset")
        self.bigram_rows = int(get("bigram_rows", 0))
        self.smear = flag("smear")
        self.sublayer_lambdas = flag("sublayer_lambdas")
        self.qkvo_lambdas = flag("qkvo_lambdas")
        self.mudd = flag("mudd")
        blocks = lambda k: [int(t) for t in str(get(k, "")).split(",") if t.strip()]
        self.paired_head_layers = blocks("paired_head_layers")
        self.xsa_layers = blocks("xsa_layers")
        self.attn_gate_layers = blocks("attn_gate_layers")
        self.yarn = flag("yarn")
        self.inv_freq = None  # YaRN's rescaled rotary frequencies (set_windows)
        self.yarn_scale = 1.0

    def set_windows(self, windows):
        """The long window set to each of `windows` in turn (model_grad --windows): the last is
        the mask's; with yarn each change applies train_gpt.py's Yarn.apply(old, new) (alpha 1,
        beta 32) to the frequencies and the attention scale, in float64."""
        hd = self.d_model // self.n_head
        freq = rotary_inv_freq(hd, self.rotary_base, self.rotary_truncate)
        for old, new in zip(windows, windows[1:]):
            if self.yarn and new != old:
                rotations = old * freq / (2 * math.pi)
                weight = torch.clamp((rotations - 1) / (32 - 1), 0, 1)
                freq = freq * (old / new + weight * (1 - old / new))
                self.yarn_scale *= 0.2 * math.log(new / old) + 1
        self.inv_freq = freq if self.yarn else None
        self.window = windows[-1]

    def value_embed_of(self, layer):
        if self.value_embed_layers:
            return self.value_embed_layers.index(layer) if layer in self.value_embed_layers else -1
        n = self.value_embeds
        return layer if layer < n else layer - (self.n_layer - n) if layer >= self.n_layer - n else -1

    def attention_mask(self, idx, layer):
        """[B, 1, T, T] bool: causal, within documents (doc_bos), within the block's window."""
        B, T = idx.shape
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        mask = (j <= i)[None, None].expand(B, 1, T, T)
        if self.doc_bos >= 0:
            doc = (idx == self.doc_bos).long().cumsum(-1)  # a document token starts a new one
            mask = mask & (doc[:, None, :, None] == doc[:, None, None, :])
        short = self.window_pattern and self.window_pattern[layer] == "S"
        if self.window > 0 and self.window_block > 0:
            blocks = self.window // self.window_block
            return torch.stack([self.record_block_mask(row, blocks // 2 if short else blocks)
                                for row in idx])[:, None]
        if self.window > 0:
            w = max(1, self.window // 2) if short else self.window
            mask = mask & (i - j < w)[None, None]
        return mask

    def paired_attention_mask(self, idx, layer):
        """[B, 1, 2T, 2T] bool: a paired-head block's mask over its interleaved sequence (position
        p holds token p // 2): causal, within documents (train_gpt.py doubles cu_seqlens), within
        the block's token window counted in positions of that sequence (flash attention's
        window_size, unchanged)."""
        B, T = idx.shape
        i = torch.arange(2 * T)[:, None]
        j = torch.arange(2 * T)[None, :]
        mask = (j <= i)[None, None].expand(B, 1, 2 * T, 2 * T)
        if self.doc_bos >= 0:
            doc = (idx == self.doc_bos).long().cumsum(-1).repeat_interleave(2, dim=-1)
            mask = mask & (doc[:, None, :, None] == doc[:, None, None, :])
        short = self.window_pattern and self.window_pattern[layer] == "S"
        if self.window > 0:
            w = max(1, self.window // 2) if short else self.window
            mask = mask & (i - j < w)[None, None]
        return mask

    def record_block_mask(self, seq, window_blocks):
        """[T, T] bool: the mask FlexAttention applies with train_gpt.py's create_blockmasks /
        build_bm(window_blocks) on one row. A row whose length is not a multiple of the block is
        padded at its end with tokens that start no document (the record asserts a multiple;
        padding after the row changes no earlier query's keys)."""
        bs, T = self.window_block, len(seq)
        nb = -(-T // bs)
        padded = torch.cat([seq, torch.full((nb * bs - T,), -1, dtype=seq.dtype)])
        docs = (padded == self.doc_bos).long().cumsum(0) if self.doc_bos >= 0 else \
            torch.zeros(nb * bs, dtype=torch.long)
        blk = torch.arange(nb)
        causal_any = blk[:, None] >= blk[None, :]
        causal_all = blk[:, None] > blk[None, :]
        low, high = docs.view(nb, bs)[:, 0], docs.view(nb, bs)[:, -1]
        doc_any = (low[:, None] <= high[None, :]) & (high[:, None] >= low[None, :])
        doc_all = (low[:, None] == high[None, :]) & (high[:, None] == low[None, :])
        any_, all_ = causal_any & doc_any, causal_all & doc_all

        def dense_to_ordered(dense):
            # each row's True blocks, the highest index first (argsort of the bools, flipped)
            order = torch.sort(dense.long(), dim=-1, stable=True).indices.flip(-1)
            return dense.sum(-1), order

        partial_n, partial_i = dense_to_ordered(any_ & ~all_)
        full_n, full_i = dense_to_ordered(all_)
        w = torch.tensor(window_blocks)
        partial_keep = torch.minimum(partial_n, torch.clamp(w - full_n, min=1))
        full_keep = torch.minimum(full_n, w - 1)  # may be -1: FlexAttention then visits none
        kept = torch.zeros(nb, nb, dtype=torch.bool)
        for q in range(nb):
            kept[q, partial_i[q, :int(partial_keep[q])]] = True
            kept[q, full_i[q, :max(int(full_keep[q]), 0)]] = True
        t = torch.arange(nb * bs)
        token = kept[t[:, None] // bs, t[None, :] // bs] & (t[None, :] <= t[:, None]) & \
            (docs[:, None] == docs[None, :])  # document_causal, the mask_mod
        return token[:T, :T]


def rmsnorm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


def rotary_inv_freq(hd, base, truncate):
    """The frequency of each pair (j, j + hd/2): base^(-j/half), or truncate's."""
    half = hd // 2
    if truncate:
        q = hd // 4
        return torch.cat([(1.0 / base) ** torch.linspace(0, 1, q, dtype=torch.float64),
                          torch.zeros(q, dtype=torch.float64)])
    return base ** (-torch.arange(half, dtype=torch.float64) / half)


def rotary(x, base=10000.0, truncate=False, inv=None):
    # x [B, H, T, hd]; pairs (x_j, x_{j+half}) rotated by angle t * base^(-j/half). truncate:
    # train_gpt.py's Rotary, (1/base) ** linspace(0, 1, hd/4) then hd/4 zeros. inv: YaRN's.
    T, hd = x.shape[-2], x.shape[-1]
    half = hd // 2
    inv = rotary_inv_freq(hd, base, truncate) if inv is None else inv
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def paired_view(x):
    """[B, H, T, hd] -> [B, H/2, 2T, hd]: train_gpt.py's x.view(B, T * 2, H // 2, hd) of the
    token rows [B, T, H, hd] (position 2t + i of slot s is head s + i H/2 of token t)."""
    B, H, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, 2 * T, H // 2, hd).transpose(1, 2)


def rotary_paired(x, base, truncate, inv=None):
    """train_gpt.py's paired Yarn.rotary: x [B, H, T, hd] viewed as [B, T, H/2, 2 hd] and turned
    with the paired table (the first hd dims of a row at position 2t, the second at 2t + 1: head
    2p + i at 2t + i), each head's pairs as the engine's (j, j + hd/2); then the paired view."""
    B, H, T, hd = x.shape
    half = hd // 2
    xt = x.transpose(1, 2).reshape(B, T, H // 2, 2, hd)
    pos = 2 * torch.arange(T, dtype=torch.float64)[:, None] + torch.arange(2)[None, :]
    inv = rotary_inv_freq(hd, base, truncate) if inv is None else inv
    ang = pos[..., None] * inv  # [T, 2, half]
    cos, sin = ang.cos()[:, None].to(x.dtype), ang.sin()[:, None].to(x.dtype)
    x1, x2 = xt[..., :half], xt[..., half:]
    turned = torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)
    return turned.reshape(B, 2 * T, H // 2, hd).transpose(1, 2)


def key_offset(k, base, truncate):
    """Record #89's CausalSelfAttention with key_offset: after rotary, the keys' stationary head
    dims (those the rotary leaves unrotated: a zero frequency) of position t take position
    t - 1's, k[:, 1:, :, stationary] = k[:, :-1, :, stationary], across documents."""
    hd = k.shape[-1]
    stationary = rotary_inv_freq(hd, base, truncate).repeat(2) == 0
    shifted = torch.cat([k[:, :, :1], k[:, :, :-1]], dim=2)
    return torch.where(stationary, shifted, k)


def bigram_hash(idx, rows):
    """train_gpt.py's get_bigram_hash on each row of idx [B, T]: out[0] = m = rows - 1, then
    out[1:] = (36313 out[1:] ^ 27191 out[:-1]) % m over the row with out[0] already m, in int32
    (here int64 products wrapped to int32 by hand; torch's % takes the divisor's sign)."""
    m = rows - 1

    def wrap32(v):
        return ((v + 2 ** 31) % 2 ** 32) - 2 ** 31

    x = idx.to(torch.int64).clone()
    x[:, 0] = m
    mixed = torch.bitwise_xor(wrap32(36313 * x[:, 1:]), wrap32(27191 * x[:, :-1]))
    out = x.clone()
    out[:, 1:] = torch.remainder(mixed, m)
    return out


def splitmix64(seed, counter):
    """The engine's core::rng_hash (core/rng.cpp) over a numpy uint64 array of counters."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) * np.uint64(0xD1B54A32D192ED03) + \
            (counter + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


BIGRAM_SIGN_ROWS = 8192
BIGRAM_SIGN_STREAM = 0x5167


def bigram_signs(D):
    """The engine's fixed sign table S [8192, D] (model/layers/bigram_embedding.h): -1 where the
    top bit of rng_hash(0x5167, r D + d) is set, else +1 (the record draws torch.randn().sign()
    and keeps it as a buffer; the engine's weight files have no buffers)."""
    bits = splitmix64(BIGRAM_SIGN_STREAM, np.arange(BIGRAM_SIGN_ROWS * D, dtype=np.uint64))
    s = np.where(bits >> np.uint64(63) != 0, -1.0, 1.0).reshape(BIGRAM_SIGN_ROWS, D)
    return torch.from_numpy(s)


def bigram_embedding(table, idx):
    """train_gpt.py's x0_bigram per row: bigram_embed(hash) * sign_table[sign_idx], sign_idx[0] =
    0 and sign_idx[t] = (x[t-1] ^ x[t]) % 8192."""
    sign_idx = torch.zeros_like(idx, dtype=torch.int64)
    sign_idx[:, 1:] = torch.bitwise_xor(idx[:, :-1].to(torch.int64),
                                        idx[:, 1:].to(torch.int64)) % BIGRAM_SIGN_ROWS
    signs = bigram_signs(table.shape[1]).to(table.dtype)
    return table[bigram_hash(idx, table.shape[0])] * signs[sign_idx]


def smear(x, gate_w, lam):
    """train_gpt.py's smear over each row of x [B, T, D]: x[1:] += lam sigmoid(x[1:, :12] . w)
    x[:-1] (the gate reads the position's own first 12 dims)."""
    k = gate_w.shape[0]
    g = lam * torch.sigmoid(x[:, 1:, :k] @ gate_w)[..., None]
    return torch.cat([x[:, :1], x[:, 1:] + g * x[:, :-1]], dim=1)


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def bf16_round(x):
    """The bf16 nearest to each element of a float64 tensor, ties to even, as float64: 8
    significant bits, a value in [2^(e-1), 2^e) a multiple of 2^(e-8), the subnormal step 2^-133,
    infinity beyond the largest finite bf16 (255 * 2^120); NaN and infinity kept."""
    _, e = torch.frexp(x)
    q = torch.clamp(e - 8, min=-133)
    r = torch.ldexp(torch.round(torch.ldexp(x, -q)), q)  # torch.round: half to even
    r = torch.where(r.abs() > 255.0 * 2.0 ** 120, torch.copysign(torch.full_like(r, math.inf), x), r)
    return torch.where(torch.isfinite(x), r, x)


class Rounding:
    """Where the bf16 model rounds. mode None: nowhere (fp32). "bf16": each matmul input in the
    forward, the output gradient in the backward (round_grad), straight through otherwise; the
    offsets bf16(x) - x of the forward are recorded in call order. "frozen": the recorded offsets
    added instead (the function the straight-through gradient is the gradient of)."""

    def __init__(self, mode=None, round_grad=True):
        self.mode, self.round_grad, self.offsets, self.calls = mode, round_grad, [], 0

    def start(self):
        self.calls = 0

    def value(self, x):
        if self.mode == "frozen":
            self.calls += 1
            return x + self.offsets[self.calls - 1]
        r = bf16_round(x.detach())
        self.offsets.append(r - x.detach())
        return r

    def stored(self, x):
        """x as stored in bf16 where no matmul rounds it (the MoE router's input, the residual
        stream): rounded, straight through."""
        if self.mode is None:
            return x
        if self.mode == "frozen":
            return self.value(x)
        return x + (self.value(x) - x.detach())

    def scaled_stored(self, z, gain):
        """z as stored in bf16 after a scaling by gain (the head's logits: the engine's head GEMM
        writes bf16(gain z)), over gain again; straight through."""
        if self.mode is None:
            return z
        if self.mode == "frozen":
            self.calls += 1
            return z + self.offsets[self.calls - 1]
        r = bf16_round(gain * z.detach()) / gain
        self.offsets.append(r - z.detach())
        return z + (r - z.detach())

    def grad_stored(self, y):
        """y whose gradient the engine stores in bf16 before any use (d qkv, d pre: their bias
        gradients read it rounded)."""
        if self.mode == "bf16" and self.round_grad:
            return RoundedGrad.apply(y)
        return y

    def matmul(self, x, w):
        """x @ w.T as the model's linear layers compute it."""
        if self.mode is None:
            return x @ w.t()
        if self.mode == "frozen":
            return self.value(x) @ self.value(w).t()
        return RoundedMatmul.apply(x, w, self)


class RoundedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, rounding):
        xr, wr = rounding.value(x), rounding.value(w)
        ctx.save_for_backward(xr, wr)
        ctx.round_grad = rounding.round_grad
        return xr @ wr.t()

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        if ctx.round_grad:
            dy = bf16_round(dy)
        return dy @ wr, (dy.reshape(-1, dy.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])), None


class RoundedGrad(torch.autograd.Function):
    """The identity whose backward rounds the gradient to bf16."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):
        return bf16_round(dy)


NO_ROUNDING = Rounding()


FP8_FORMATS = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}  # mantissa bits, emin, largest


def fp8_round(x, fmt):
    """The FP8 (OCP e4m3fn / e5m2) value nearest each element of a float64 tensor, ties to even,
    saturating beyond the largest finite value (PTX cvt.rn.satfinite, the record's compiled
    casts): a value in [2^e, 2^(e+1)) a multiple of 2^(e - mantissa bits), below 2^emin a
    multiple of 2^(emin - mantissa bits)."""
    mbits, emin, largest = FP8_FORMATS[fmt]
    a = x.abs()
    _, e = torch.frexp(a)
    q = torch.clamp(e - 1, min=emin) - mbits
    r = torch.ldexp(torch.round(torch.ldexp(a, -q)), q)
    r = torch.where(a >= largest, torch.full_like(a, largest), r)
    return torch.where(torch.isnan(x), x, torch.copysign(r, x))


class Fp8Head:
    """train_gpt.py's lm_head in training (CastedLinear(use_fp8=True): mm_op, mm_backward_op) with
    x_s = sqrt(D)/448, w_s = 24/448, grad_s = 1/448 (model.head_fp8_*_scale: other multiples of
    1/448, set in `units` by model_loss): out = (x_s w_s) e4m3(x/x_s) e4m3(w/w_s)^T;
    backward g8 = e5m2(g/grad_s) with g the gradient of the sum of the token losses (the record's
    reduction='sum'), dx = (grad_s w_s) g8 w8, dw = (grad_s x_s) g8^T x8. mode "fp8"
    records the forward's offsets e4m3(v/s) s - v; round_grad False leaves g unrounded (then the
    gradient is exactly that of the "frozen" model, which adds the recorded offsets)."""

    def __init__(self, mode="fp8", round_grad=True):
        self.mode, self.round_grad, self.offsets, self.calls = mode, round_grad, [], 0
        self.units = (0.0, 24.0, 1.0)

    def __call__(self, x, w):
        ux, uw, ug = self.units
        xs, ws, gs = (ux or math.sqrt(x.shape[-1])) / 448, uw / 448, ug / 448
        if self.mode == "frozen":
            ox, ow = self.offsets[self.calls]
            self.calls += 1
            return (x + ox) @ (w + ow).t()
        return Fp8Matmul.apply(x, w, self, (xs, ws, gs))


class Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, head, scales):
        xs, ws, gs = scales
        x8 = fp8_round(x.detach() / xs, "e4m3") * xs
        w8 = fp8_round(w.detach() / ws, "e4m3") * ws
        head.offsets.append((x8 - x.detach(), w8 - w.detach()))
        ctx.save_for_backward(x8, w8)
        ctx.gs, ctx.round_grad = gs, head.round_grad
        return x8 @ w8.t()

    @staticmethod
    def backward(ctx, g):
        x8, w8 = ctx.saved_tensors
        if ctx.round_grad:
            # The record rounds the gradient of its training loss, the sum of the token losses
            # (reduction='sum'): g is the mean's, n times smaller.
            n = g.numel() // g.shape[-1]
            g = fp8_round(g * n / ctx.gs, "e5m2") * ctx.gs / n
        gw = g.reshape(-1, g.shape[-1]).t() @ x8.reshape(-1, x8.shape[-1])
        return g @ w8, gw, None, None


def model_loss(cfg, p, idx, targets, rounding=NO_ROUNDING, head_fp8=None, terms=None):
    """Returns (objective, cross-entropy); objective = ce + MoE auxiliary losses. With
    cfg.head_fp8 the head is `head_fp8` (an Fp8Head; a fresh one when None)."""
    rounding.start()
    if cfg.head_fp8 and head_fp8 is None:
        head_fp8 = Fp8Head()
    if head_fp8 is not None:
        head_fp8.calls = 0
        head_fp8.units = cfg.head_fp8_scales
    B, T = idx.shape
    D, H = cfg.d_model, cfg.n_head
    hd = D // H
    gpt2 = cfg.arch == "gpt2"
    act = gelu_tanh if gpt2 else (lambda u: torch.relu(u) ** 2)

    def norm(x, name):
        if gpt2:
            return F.layer_norm(x, (D,), p[name + ".weight"], p[name + ".bias"], 1e-5)
        return rmsnorm(x, cfg.norm_eps)

    def lin(x, name, bias=True, scale=None):
        # train_gpt.py at f411b3d3 pre-multiplies its QKV and O weights by sa_lambdas.
        w = p[name + ".weight"] if scale is None else scale * p[name + ".weight"]
        y = rounding.matmul(x, w)
        if gpt2 and bias:
            y = y + p[name + ".bias"]
        return y

    # The residual stream: every value written to it is stored (bf16: rounded, straight through).
    x = p["embed.weight"][idx]
    if cfg.smear:  # record #34: before the norm
        x = smear(x, p["smear_gate"], p["smear_lambda"][0])
    if cfg.x0_norm:  # train_gpt.py: x = x0 = norm(self.embed(input_seq)[None])
        x = rmsnorm(x, cfg.norm_eps)
    if gpt2:
        x = x + p["pos_embed.weight"][:T]
    x = x0 = rounding.stored(x)
    # Record #89's bigram hash embedding: x = x0 + g_0 bg before block 0, + g_i bg after each
    # later block's attention.
    bg = bigram_embedding(p["bigram_embed.weight"], idx) if cfg.bigram_rows else None
    if bg is not None:
        x = rounding.stored(x + p["blocks.0.bigram_gate"][0] * bg)
    aux_total = 0.0
    scale = (cfg.attn_scale if cfg.attn_scale > 0 else 1.0 / math.sqrt(hd)) * cfg.yarn_scale
    skips = cfg.n_layer // 2 if cfg.unet_skips else 0
    outputs = []

    def sublayer(x, y, b, k):
        """x + y, or with sublayer_lambdas (record #89) resid x + post y, y stored first."""
        if not cfg.sublayer_lambdas:
            return rounding.stored(x + y)
        y = rounding.stored(y)
        return rounding.stored(p[b + "resid_lambdas"][k] * x + p[b + "post_lambdas"][k] * y)

    def attention(i, x_in, aux_v=None):
        """Block i's attention output y (before the residual) over x_in; aux_v (record #89's
        v_mudd, [B, T, D]) is added to v."""
        b = f"blocks.{i}."
        qkvo = p[b + "attn.qkvo_lambdas"] if cfg.qkvo_lambdas else None
        h = norm(x_in, b + "ln1")
        qkv = rounding.grad_stored(lin(h, b + "attn.qkv", scale=None if qkvo is None else qkvo[0]))
        q, k, v = [t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(D, dim=-1)]
        paired = i in cfg.paired_head_layers
        if paired:  # train_gpt.py CausalSelfAttention(paired=True): no key offset
            q = rotary_paired(rmsnorm(q, cfg.norm_eps), cfg.rotary_base, cfg.rotary_truncate,
                              cfg.inv_freq)
            k = rotary_paired(rmsnorm(k, cfg.norm_eps), cfg.rotary_base, cfg.rotary_truncate,
                              cfg.inv_freq)
        elif not gpt2:
            q = rotary(rmsnorm(q, cfg.norm_eps), cfg.rotary_base, cfg.rotary_truncate, cfg.inv_freq)
            k = rotary(rmsnorm(k, cfg.norm_eps), cfg.rotary_base, cfg.rotary_truncate, cfg.inv_freq)
            long_window = not (cfg.window_pattern and cfg.window_pattern[i] == "S")
            if cfg.key_offset and long_window:
                k = key_offset(k, cfg.rotary_base, cfg.rotary_truncate)
        ve = cfg.value_embed_of(i)
        if ve >= 0:
            ve_heads = p[f"value_embeds.{ve}.weight"][idx].view(B, T, H, hd).transpose(1, 2)
            v = p[b + "attn.v_lambdas"][0] * v + p[b + "attn.v_lambdas"][1] * ve_heads
        elif cfg.v_lambdas_all:  # train_gpt.py: v = lambdas[0] * v without a table
            v = p[b + "attn.v_lambdas"][0] * v
        if aux_v is not None:
            v = v + aux_v.view(B, T, H, hd).transpose(1, 2)
        if paired:
            v = paired_view(v)
        s = (q @ k.transpose(-1, -2)) * scale
        mask = cfg.paired_attention_mask(idx, i) if paired else cfg.attention_mask(idx, i)
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        # [B, H(/2), T(x2), hd] -> [B, T, H, hd]: a paired block's view undone by the same reshape
        y = a.transpose(1, 2).reshape(B, T, H, hd)
        if i in cfg.xsa_layers or i in cfg.attn_gate_layers:
            y = rounding.stored(y)
        if i in cfg.xsa_layers:  # train_gpt.py's gated XSA, v the value attention read
            vt = v.transpose(1, 2)
            dot = (y * vt).sum(-1, keepdim=True)
            denom = vt.square().sum(-1, keepdim=True).clamp_min(1e-8)
            y = y - torch.tanh(p[b + "attn.xsa_alpha"]).view(1, 1, H, 1) * (dot / denom) * vt
        if i in cfg.attn_gate_layers:  # y *= attn_gate_w, per head
            y = y * p[b + "attn.out_gate"].view(1, 1, H, 1)
        return lin(y.reshape(B, T, D), b + "attn.proj", scale=None if qkvo is None else qkvo[1])

    def mlp(i, x_in):
        b = f"blocks.{i}."
        h = norm(x_in, b + "ln2")
        return lin(act(rounding.grad_stored(lin(h, b + "mlp.fc"))), b + "mlp.proj")

    def coefficients(x_in, prefix, s):
        """Record #89's MUDD block / gate: (gelu(x W1^T) W2^T + b) s, exact GELU; [B, T, K]."""
        hidden = F.gelu(rounding.matmul(x_in, p[prefix + ".w1"]))
        return (hidden @ p[prefix + ".w2"].t() + p[prefix + ".b2"]) * s

    def mudd_blocks(x, x0):
        """train_gpt.py at f411b3d3's GPT.forward from x0 on (no value tables, bigram, XSA,
        attention gates or DC: the layers for them are not on this branch)."""
        g0 = coefficients(x0, "mudd_gate.0", p["mudd_gate.scale"])
        cache = {0: x}
        g1 = None
        for i in range(cfg.n_layer):
            b = f"blocks.{i}."
            mu = None
            if i == 4:
                g1 = coefficients(x, "mudd_gate.1", p["mudd_gate.scale"])
            if i == 6:
                x = rounding.stored(x + torch.sigmoid(p["skip_lambda"][0]) * g1[..., 28:29] * cache[3])
            elif i < cfg.n_layer - 1:
                gate, col = (g0, 18 + 2 * i) if i < 4 else (g1, 18 + 2 * [4, 5, 7, 8, 9].index(i))
                y = rounding.stored(attention(i, cache[7] if i >= 8 else x))
                x = rounding.stored(p[b + "resid_lambdas"][0] * x + p[b + "post_lambdas"][0] * y)
                x = rounding.stored(x + gate[..., col:col + 1] * x0)
            else:
                cache[9] = x
                mu = coefficients(x, "mudd.0", 0.1)
                c = lambda j: mu[..., j:j + 1]
                v_mudd = c(0) * cache[0] + c(1) * cache[7] + c(2) * x
                x = (1 + c(5)) * x + c(3) * cache[0] + c(4) * cache[7]
                y = rounding.stored(attention(i, cache[7], v_mudd))
                x = c(8) * x + c(9) * y + c(10) * cache[0]
            y = rounding.stored(mlp(i, x))
            if mu is not None:
                x = rounding.stored(mu[..., 12:13] * x + mu[..., 13:14] * y)
            else:
                x = rounding.stored(p[b + "resid_lambdas"][1] * x + p[b + "post_lambdas"][1] * y)
            if i in (3, 7):
                cache[i] = x
        mu = coefficients(x, "mudd.1", 0.1)
        return x + mu[..., 0:1] * cache[0] + mu[..., 1:2] * cache[7] + mu[..., 2:3] * cache[9] + \
            mu[..., 4:5] * cache[3]

    for i in range(cfg.n_layer if not cfg.mudd else 0):
        b = f"blocks.{i}."
        if i >= cfg.n_layer - skips:  # U-net: the mirrored first-half output
            x = rounding.stored(
                x + p["skip_weights"][i - (cfg.n_layer - skips)] * outputs[cfg.n_layer - 1 - i])
        if cfg.x0_lambdas:
            x = rounding.stored(p[b + "lambdas"][0] * x + p[b + "lambdas"][1] * x0)
        if i not in cfg.no_attn_layers:
            x = sublayer(x, attention(i, x), b, 0)
            if bg is not None and i > 0:
                x = rounding.stored(x + p[b + "bigram_gate"][0] * bg)
        h = norm(x, b + "ln2")
        if cfg.experts:
            E, K = cfg.experts, cfg.top_k
            hf = h.reshape(B * T, D)
            probs = torch.softmax(rounding.stored(hf) @ p[b + "moe.router.weight"].t(), dim=-1)
            # k largest per token, ties to the lower index (a stable descending sort).
            order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :K]
            sel = probs.gather(1, order)
            gate = sel / sel.sum(-1, keepdim=True)
            out = torch.zeros_like(hf)
            counts = torch.zeros(E, dtype=hf.dtype)
            for e in range(E):
                tok, slot = (order == e).nonzero(as_tuple=True)
                counts[e] = len(tok)
                if len(tok) == 0:
                    continue
                y = rounding.matmul(act(rounding.matmul(hf[tok], p[b + "moe.fc.weight"][e])),
                                    p[b + "moe.proj.weight"][e])
                out = out.index_add(0, tok, y * gate[tok, slot][:, None])
            frac = counts / (B * T)  # not differentiated
            aux_total = aux_total + cfg.aux_weight * E * (frac * probs.mean(0)).sum()
            x = rounding.stored(x + out.view(B, T, D))
        else:
            x = sublayer(x, mlp(i, x), b, 1)
        outputs.append(x)
    if cfg.mudd:
        x = mudd_blocks(x, x0)
    if gpt2:
        x = norm(x, "ln_f")
        head = p["embed.weight"]
    else:
        x = rmsnorm(x, cfg.norm_eps)
        head = p["lm_head.weight"]
    # The softmax's columns: the vocabulary, or with loss_over_padding all padded logits.
    V = cfg.padded_vocab if cfg.loss_over_padding else cfg.vocab_size
    if cfg.head_fp8:
        logits = head_fp8(x, head)[..., :V]
    else:
        # The engine's logits are gain z (the sigmoid cap's gain cap / (4 scale), else 1), which
        # its bf16 head stores rounded.
        sigmoid = cfg.softcap > 0 and cfg.softcap_form == "sigmoid"
        gain = cfg.softcap / (4 * cfg.softcap_scale) if sigmoid else 1.0
        logits = rounding.scaled_stored(rounding.matmul(x, head), gain)[..., :V]
    if cfg.softcap > 0 and cfg.softcap_form == "sigmoid":
        logits = cfg.softcap * torch.sigmoid((logits + cfg.softcap_offset) / cfg.softcap_scale)
    elif cfg.softcap > 0:
        logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
    if terms is None:
        ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    else:
        ce = loss_terms(logits, targets, terms)
    return ce + aux_total, ce


def loss_terms(logits, targets, terms):
    """Record #89's training loss (triton_kernels.py's ce_fwd_bwd), written from its definition:
    the mean over the B x T positions of sum_k w_k CE(z_t, y[t + k]) over the offsets k with
    t + k < T (within the row) plus w_p CE(z_t, prefix(y[t])) where the prefix exists (>= 0)."""
    mtp, prefix_of, prefix_weight = terms
    B, T, V = logits.shape
    logp = torch.log_softmax(logits, dim=-1)
    total = logits.new_zeros(())
    for k, w in enumerate(mtp):
        if k < T:
            total = total - w * logp[:, :T - k].gather(-1, targets[:, k:, None]).sum()
    if prefix_weight:
        pre = torch.tensor(prefix_of)[targets]
        has = pre >= 0
        total = total - prefix_weight * logp.gather(-1, pre.clamp(min=0)[..., None])[..., 0][has].sum()
    return total / (B * T)


def read_terms(args):
    """--mtp and --prefix_weight / --prefix_table as loss_terms takes them, or None."""
    if args.mtp is None and not args.prefix_weight:
        return None
    mtp = [float(w) for w in (args.mtp or "1").split()]
    prefix_of = np.loadtxt(args.prefix_table, dtype=np.int64) if args.prefix_table else None
    return mtp, prefix_of, args.prefix_weight


def parity(args):
    weights, meta = read_safetensors(args.weights)
    cfg = Config(meta)
    if args.windows:
        cfg.set_windows([int(w) for w in args.windows.split(",")])
    dtype = torch.float32 if args.float32 else torch.float64
    p = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in weights.items()}
    T = args.seq if args.seq else cfg.seq_len
    tokens = read_shard(args.tokens)
    need = args.batch * (T + 1)
    if len(tokens) < need:
        raise SystemExit(f"{args.tokens}: needs {need} tokens for batch {args.batch} x (T+1), has {len(tokens)}")
    rows = torch.tensor(tokens[:need].reshape(args.batch, T + 1))
    x, y = rows[:, :-1], rows[:, 1:]
    rounding = Rounding("bf16") if args.precision == "bf16" else NO_ROUNDING
    terms = read_terms(args)
    loss, ce = model_loss(cfg, p, x, y, rounding, terms=terms)
    loss.backward()
    out = {"loss": np.array(loss.item()), "ce_loss": np.array(ce.item())}
    for k, v in p.items():
        out["grad/" + k] = v.grad.detach().numpy()
    if args.fd:
        if terms is not None:
            raise SystemExit("--fd checks the plain cross-entropy: use it without --mtp / --prefix_weight")
        out.update(finite_difference_check(cfg, p, x, y, rounding, args.fd))
    write_safetensors(args.out, out)
    print(f"torch_reference: loss {loss.item():.8f} ce {ce.item():.8f} ({args.out})")


def finite_difference_check(cfg, p, x, y, rounding, k):
    """Directional derivatives of the model with its roundings frozen at p, by central
    differences in float64 (whatever the parity run's dtype) along k seeded directions, against
    <g, v> for the straight-through gradient g without the backward's roundings and with them."""
    if rounding.mode is None and not cfg.head_fp8:
        raise SystemExit("--fd checks the rounded model: use it with --precision bf16 or a "
                         "model with head_fp8")
    p = {k_: v.detach().to(torch.float64).requires_grad_() for k_, v in p.items()}
    exact = Rounding("bf16", round_grad=False) if rounding.mode else Rounding()
    exact_head = Fp8Head(round_grad=False) if cfg.head_fp8 else None
    for v in p.values():
        v.grad = None
    model_loss(cfg, p, x, y, exact, exact_head)[0].backward()
    straight = {k_: v.grad.detach().clone() for k_, v in p.items()}
    for v in p.values():
        v.grad = None
    model_loss(cfg, p, x, y, rounding)[0].backward()
    rounded = {k_: v.grad.detach().clone() for k_, v in p.items()}
    frozen = Rounding("frozen") if rounding.mode else Rounding()
    frozen.offsets = exact.offsets
    frozen_head = Fp8Head("frozen") if cfg.head_fp8 else None
    if frozen_head:
        frozen_head.offsets = exact_head.offsets
    g = torch.Generator().manual_seed(99)
    fd, dot_exact, dot_rounded = [], [], []
    eps = 1e-6
    with torch.no_grad():
        for _ in range(k):
            d = {k_: torch.randn(v.shape, generator=g, dtype=v.dtype) for k_, v in p.items()}
            plus = model_loss(cfg, {k_: v + eps * d[k_] for k_, v in p.items()}, x, y, frozen,
                              frozen_head)[0]
            minus = model_loss(cfg, {k_: v - eps * d[k_] for k_, v in p.items()}, x, y, frozen,
                               frozen_head)[0]
            fd.append((plus - minus).item() / (2 * eps))
            dot_exact.append(sum((straight[k_] * d[k_]).sum().item() for k_ in p))
            dot_rounded.append(sum((rounded[k_] * d[k_]).sum().item() for k_ in p))
    fd, dot_exact, dot_rounded = map(np.array, (fd, dot_exact, dot_rounded))
    scale = np.linalg.norm(fd)
    return {"check/fd_rel_err": np.array(np.linalg.norm(dot_exact - fd) / scale),
            "check/fd_rel_err_rounded": np.array(np.linalg.norm(dot_rounded - fd) / scale)}


def init_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    D, F4, Vp, L = cfg.d_model, 4 * cfg.d_model, cfg.padded_vocab, cfg.n_layer
    gpt2 = cfg.arch == "gpt2"
    p = {}

    def normal(name, shape, std=0.02):
        p[name] = (torch.randn(shape, generator=g) * std).requires_grad_()

    def const(name, shape, value):
        p[name] = torch.full(shape, float(value)).requires_grad_()

    proj_std = 0.02 / math.sqrt(2 * L) if gpt2 else 0.0
    normal("embed.weight", (Vp, D))
    if gpt2:
        normal("pos_embed.weight", (cfg.seq_len, D))
    for i in range(L):
        b = f"blocks.{i}."
        if gpt2:
            const(b + "ln1.weight", (D,), 1), const(b + "ln1.bias", (D,), 0)
            const(b + "ln2.weight", (D,), 1), const(b + "ln2.bias", (D,), 0)
            const(b + "attn.qkv.bias", (3 * D,), 0), const(b + "attn.proj.bias", (D,), 0)
        normal(b + "attn.qkv.weight", (3 * D, D))
        normal(b + "attn.proj.weight", (D, D), proj_std)
        if cfg.experts:
            normal(b + "moe.router.weight", (cfg.experts, D))
            normal(b + "moe.fc.weight", (cfg.experts, F4, D))
            normal(b + "moe.proj.weight", (cfg.experts, D, F4), proj_std)
        else:
            normal(b + "mlp.fc.weight", (F4, D))
            normal(b + "mlp.proj.weight", (D, F4), proj_std)
            if gpt2:
                const(b + "mlp.fc.bias", (F4,), 0), const(b + "mlp.proj.bias", (D,), 0)
    if gpt2:
        const("ln_f.weight", (D,), 1), const("ln_f.bias", (D,), 0)
    else:
        normal("lm_head.weight", (Vp, D))
    return p


def torch_runtime():
    """What this PyTorch computes on: its version, threads, the BLAS library loaded into the process
    (and OpenBLAS's kernel, which OPENBLAS_CORETYPE may pin below the CPU's best), its kernels' CPU
    capability and oneDNN (mkldnn, which autocast's bf16 matmuls use)."""
    shown = torch.__config__.show()
    capability = next((line.split(":", 1)[1].strip() for line in shown.splitlines()
                       if "CPU capability usage" in line), "unknown")
    blas = "unknown"
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
        names = sorted(os.path.basename(p) for p in libs
                       if any(k in os.path.basename(p) for k in ("openblas", "blas", "mkl_rt")))
        if names:
            blas = ", ".join(names)
        openblas = [p for p in libs if "openblas" in os.path.basename(p)]
        if openblas:
            import ctypes
            lib = ctypes.CDLL(openblas[0])
            lib.openblas_get_corename.restype = ctypes.c_char_p
            blas = "OpenBLAS %s kernels (%s)" % (lib.openblas_get_corename().decode(), blas)
    except (OSError, AttributeError):
        pass
    return {"torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "torch_blas": blas, "torch_cpu_capability": capability,
            "torch_mkldnn": torch.backends.mkldnn.is_available(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}


def bench(args):
    torch.set_num_threads(args.threads)
    cfg = Config(arch=args.arch, n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model,
                 seq_len=args.seq, vocab_size=args.vocab, softcap=args.softcap)
    p = init_params(cfg, 1337)
    opt = torch.optim.AdamW(p.values(), lr=1e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(7)
    rows = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=g)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss, _ = model_loss(cfg, p, rows[:, :-1], rows[:, 1:])
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = (time.perf_counter() - t0) / args.steps
    tok_s = args.batch * args.seq / dt
    row = {"impl": "pytorch", "arch": args.arch, "threads": args.threads, "step_ms": dt * 1e3,
           "tokens_per_s": tok_s, "precision": args.precision}
    row.update(torch_runtime())
    if args.json:
        print(json.dumps(row))
    else:
        print(f"pytorch {args.arch} threads={args.threads} step {dt * 1e3:.1f} ms  {tok_s:.0f} tok/s")


def lr_multiplier(step, total, warmup, cooldown_frac, floor, shape):
    """The engine's schedule (engine/lr_schedule.cpp) at 0-based step `step`."""
    if step < warmup:
        return (step + 1) / warmup
    decay_start = total if shape == "constant" else max(warmup,
                                                        total - int(round(cooldown_frac * total)))
    if step < decay_start:
        return 1.0
    p = min(1.0, (step - decay_start + 1) / (total - decay_start))
    if shape == "linear":
        return 1.0 - p * (1.0 - floor)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


def adamw_group(config_path, config):
    """The one AdamW group of an engine config, refusing anything torch.optim.AdamW is not."""
    groups = config.get("optim") or []
    if len(groups) != 1 or groups[0].get("optimizer") != "adamw":
        raise SystemExit(f"{config_path}: train mode needs exactly one optim group with optimizer "
                         f"adamw (found {[g.get('optimizer') for g in groups]})")
    g = groups[0]
    if g.get("params") not in (["*"], "*"):
        raise SystemExit(f"{config_path}: the adamw group must cover params: [\"*\"], has {g.get('params')}")
    if g.get("eps_mode") != "torch":
        raise SystemExit(f"{config_path}: set eps_mode: torch in the adamw group (torch.optim.AdamW "
                         "adds eps after the bias correction)")
    if g.get("weight_decay_mode", "decoupled") != "decoupled" or g.get("lr_mul", 1) != 1 or \
            g.get("wd_mul", 1) != 1:
        raise SystemExit(f"{config_path}: train mode supports decoupled weight decay without "
                         "lr_mul / wd_mul only")
    betas = g.get("betas", [0.8, 0.95])
    return dict(lr=float(g["lr"]), betas=(float(betas[0]), float(betas[1])),
                eps=float(g.get("eps", 1e-10)), weight_decay=float(g.get("weight_decay", 0.0)))


def train(args):
    import yaml
    torch.set_num_threads(args.threads)
    with open(args.config) as f:
        config = yaml.safe_load(f)
    t = config.get("train", {})
    hyper = adamw_group(args.config, config)
    weights, meta = read_safetensors(os.path.join(args.batches, "init.safetensors"))
    cfg = Config(meta)
    T = cfg.seq_len
    p = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in weights.items()}
    opt = torch.optim.AdamW(p.values(), **hyper)
    rows_per_step = int(t.get("batch_tokens", 0)) // T
    train_rows = torch.tensor(read_shard(os.path.join(args.batches, "train.bin"))).view(-1, T + 1)
    val_rows = torch.tensor(read_shard(os.path.join(args.batches, "val.bin"))).view(-1, T + 1)
    total = int(t.get("steps", 1))
    steps = min(total, len(train_rows) // rows_per_step)
    clip = float(t.get("grad_clip", 0.0))
    warmup_lr = int(t.get("lr_warmup_steps", 0))
    schedule = (total, warmup_lr, float(t.get("lr_cooldown_frac", 0.0)),
                float(t.get("lr_floor", 0.0)), str(t.get("lr_schedule", "linear")))
    eval_every = int(t.get("eval_every", 0))
    micro = int(t.get("micro_batch", rows_per_step))

    def evaluate():
        with torch.no_grad():
            losses = [model_loss(cfg, p, b[:, :-1], b[:, 1:])[1].item()
                      for b in val_rows.split(micro)]
        return sum(losses) / len(losses)

    def step_rows(step):
        return train_rows[step * rows_per_step:(step + 1) * rows_per_step]

    # Untimed warm-up passes (forward and backward, no update), as the engine's train.warmup_steps.
    for _ in range(int(t.get("warmup_steps", 0))):
        rows = step_rows(0)
        model_loss(cfg, p, rows[:, :-1], rows[:, 1:])[0].backward()
    out = open(args.metrics, "w")
    val = evaluate()
    out.write(json.dumps({"step": 0, "val_loss": val, "elapsed_ms": 0.0}) + "\n")
    elapsed = 0.0
    for step in range(steps):
        t0 = time.perf_counter()
        lr = hyper["lr"] * lr_multiplier(step, *schedule)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=False)
        rows = step_rows(step)
        chunks = rows.split(micro)
        loss_sum = 0.0
        for c in chunks:
            loss, _ = model_loss(cfg, p, c[:, :-1], c[:, 1:])
            (loss / len(chunks)).backward()
            loss_sum += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            p.values(), clip if clip > 0 else float("inf")).item()
        opt.step()
        elapsed += (time.perf_counter() - t0) * 1e3
        row = {"step": step + 1, "train_loss": loss_sum / len(chunks), "lr": lr,
               "grad_norm": grad_norm, "elapsed_ms": elapsed}
        reached = False
        if eval_every > 0 and ((step + 1) % eval_every == 0 or step + 1 == steps):
            row["val_loss"] = evaluate()
            reached = args.target is not None and row["val_loss"] <= args.target
        out.write(json.dumps(row) + "\n")
        out.flush()
        if (step + 1) % 10 == 0 or "val_loss" in row:
            print(f"torch step {step + 1}/{steps} train_loss {row['train_loss']:.4f}"
                  + (f" val_loss {row['val_loss']:.4f}" if "val_loss" in row else "")
                  + f" train_time {elapsed:.0f}ms", flush=True)
        if reached:
            print(f"torch: reached target val_loss {row['val_loss']:.4f} <= {args.target} at step "
                  f"{step + 1}: train_time {elapsed:.0f} ms", flush=True)
            break
    out.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights")
    ap.add_argument("--tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: model.seq_len)")
    ap.add_argument("--out")
    ap.add_argument("--windows", default="",
                    help="the long windows set in turn before the step (model_grad --windows)")
    ap.add_argument("--float32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="parity: round as the engine's bf16 precision does; bench: torch.autocast bf16")
    ap.add_argument("--fd", type=int, default=0,
                    help="parity with --precision bf16: this many finite-difference directions")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--arch", default="modern")
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--mtp", help="record #89's multi-token weights of t+1, t+2, ... ('1 0.5 0.25')")
    ap.add_argument("--prefix_weight", type=float, default=0.0, help="the prefix target's weight")
    ap.add_argument("--prefix_table", help="each token's prefix token (-1: none), white-space separated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--config", help="train mode: the engine config to follow")
    ap.add_argument("--batches", help="train mode: the folder apps/dump_batches wrote")
    ap.add_argument("--metrics", help="train mode: metrics.jsonl to write")
    ap.add_argument("--target", type=float, default=None, help="train mode: stop at this val loss")
    args = ap.parse_args()
    if args.train:
        for k in ("config", "batches", "metrics"):
            if getattr(args, k) is None:
                ap.error(f"--{k} is required with --train")
        train(args)
    elif args.bench:
        if not args.seq:
            args.seq = 128
        bench(args)
    else:
        for k in ("weights", "tokens", "out"):
            if getattr(args, k) is None:
                ap.error(f"--{k} is required (or use --bench)")
        parity(args)


if __name__ == "__main__":
    main()
