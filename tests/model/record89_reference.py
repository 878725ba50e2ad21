#!/usr/bin/python3
"""An independent float64 reading of modded-nanogpt record #89's model (train_gpt.py at f411b3d3:
GPT.forward, CausalSelfAttention, Yarn; the soft-capped multi-token loss of triton_kernels.py's
CE kernel; the DC correction of dc_triton_kernels.py), written from the record's code and the spec
(the project's spec modded_nanogpt_record89.md, sections 2 and 6) without the engine. A second
reference beside torch_reference.py, for the engine's #89 mechanisms one at a time.

Parity mode (--weights W --tokens SHARD --out OUT): reads the parameters in the RECORD's own
names and layouts (safetensors; `name` or `name.weight`), B*(T+1) tokens from a token shard (row
b = tokens [b(T+1), (b+1)(T+1)): inputs the first T, targets the last T; each row is one flat
micro-batch of packed documents, as one rank's row in the record), runs forward and backward in
float64 and writes `loss` (the objective: grad_scale x the sum over rows and positions of the
per-position loss, as the record's `.sum() * grad_scale`), `loss_per_token` ([B, T]) and
`grad/<name>` for every parameter (F64). --check K instead compares the gradient with float64
central differences at K sampled entries of every parameter and exits 1 past --tol.
Init mode (--init OUT): writes a seeded parameter file at the given dims (--init-style random:
every tensor nonzero, so every path carries gradient; record: the record's own init, zeros
included), with the record's buffers `bigram_sign_table` (random +-1) and `prefix_table`
(synthetic at a small vocabulary: token t maps to a random smaller token or -1).

The model, per row of T tokens x (targets y), n(.) = RMS norm without weight (eps 2^-23, the
default of F.rms_norm for the record's bf16 input: its opmath type is f32):
  x    = embed[x_t]; smear: x_t += smear_lambda sigmoid(x_t[:12] . smear_gate) x_{t-1} (t >= 1)
  x0   = n(x); gate0 = MuddGate(0, x0): XSA alphas of layers 1 and 3, output gate of 3, the x0
         and bigram gates of layers 0..3
  bg_t = bigram_embed[hash_t] * bigram_sign_table[(x_{t-1} XOR x_t) mod rows] (row 0 at t = 0)
  cache0 = x0 + g_bg[0] bg  (bg enters the first bigram_dim dims)
  layers 0..10: at 4, gate1 = MuddGate(1, x) (XSA of 4, 7; gate of 10; x0/bigram gates of 4, 5,
  7, 8, 9; the skip gate; DC's w1 and w2); layer 6 has no attention: x += sigmoid(skip_lambda)
  g_skip cache3; else the attention input is n(cache7) from layer 8 on, n(x) before; layer 10
  runs MUDD(0, x) first (cache9 = x): v gets mu0 cache0 + mu1 cache7 + mu2 x, x becomes (1 + mu5)
  x + mu3 cache0 + mu4 cache7, the value embedding's gate is mu6 (heads < H/2) / mu7, and the
  residual updates take mu8..mu13; elsewhere x = rho_a x + pi_a y + g_x0 x0 (+ g_bg bg for i > 0)
  and x = rho_m x + pi_m MLP(n(x)), MLP(h) = relu(h W1^T)^2 W2 (mlp_bank[i] = (W1, W2), both
  [4D, D]); after the MLPs of 3 and 7 the caches; after the loop MUDD(1, x): x += mu'0 cache0 +
  mu'1 cache7 + mu'2 cache9 + mu'3 VE0[x_t] + mu'4 cache3; logits = n(x) @ lm_head ([D, V]),
  z = 23 sigmoid((logits + 5) / 7.5).
  MUDD(id, x) = (gelu(x W1[id]^T) W2[id]^T + b2[id]) 0.1 (exact GELU); MuddGate the same with
  the learnable _mudd_gate_scale; gate outputs are used raw (XSA through tanh).
  Attention of layer i (j = i - (i > 6) indexes the banks): q, k, v = a (scalars[2i] W)^T, W = the
  H qk_bank groups of layer j ([2 hd, D] each: Q head pairs then K head pairs) over vo_bank[2j]
  (V); QK norm per head; rotary over the first hd/2 dims in adjacent pairs, hd/4 frequencies
  (1/1024)^linspace(0, 1), out[2m] = cos x[2m] + sin x[2m+1], out[2m+1] = cos x[2m+1] - sin x[2m],
  at the position in the packed row; windows [S S S L S S - S S S L] (FA3's (W, 0): keys
  t-W..t within the document); long layers shift k[:, hd/2:] one token forward (key offset,
  across documents); v += aux_v (value embeddings at 1, 2, 8, 9, 10: tables 0..4 of value_embeds,
  gated 2 sigmoid(ve_gate_bank[k] [a[:6], ve[:6]]) per head, layer 10 by MUDD); paired layers 0,
  2, 5, 9 rotate head h at 2t + (h mod 2) and attend over 2T slots: slot 2t + s of group p holds
  head s H/2 + p (the (h, h + H/2) pairing of the spec's section 6 item 1), the document bounds
  doubled, the window W unchanged; DC at 10: y_h += w2_h sum_j (sum_g n6(w1)_g p_g[t, j]) v_h[j],
  p_g the softmax over the last dc_window keys (the query's own included) of the document,
  n6 the RMS norm over heads with eps 1e-6; XSA at 1, 3, 4, 7: y -= tanh(alpha) (y.v / max(|v|^2,
  1e-8)) v; output gates at 3, 10: y *= gate; out = y (scalars[2i+1] vo_bank[2j+1])^T.
  Loss at position t: sum_k w_k (lse - z[y_{t+k}]) over t + k < T (MTP, no document masking) +
  w_p (lse - z[prefix[y_t]]) where prefix[y_t] >= 0. The record's CE kernel normalises the last
  rows over every MTP weight even where the later target does not exist (spec section 6 item 3):
  --tail kernel adds w_k (lse - stop_gradient(lse)) for those, giving the kernel's gradient at the
  same loss value; --tail loss (default) is the gradient of the loss.
  YaRN (yarn_apply): at a long-window growth old -> new, f *= s + w (1 - s) with s = old / new,
  w = clamp((old f / 2 pi - 1) / 31, 0, 1), and attn_scale *= 1 + 0.2 ln(new / old); --yarn
  "384:896,896:1408" applies growths in order (the record's stages 2, 3; 1408:1664 the extension).
  Bigram hash (bigram_hash): h_0 = m = rows - 1, h_1 = (36313 x_1 XOR 27191 m) mod m, h_t =
  (36313 x_t XOR 27191 x_{t-1}) mod m, the products wrapping as int32, mod taking the divisor's
  sign (spec section 6 item 2).

Scaled to small dims (each a choice; at the record's dims they are the record's values):
  - the structure stays the record's: 11 layers, the layer sets above; H must be even;
  - the MUDD-gate layouts put H where the record has its 6 heads: gate 0 has 3H + 8 outputs
    (xsa1, xsa3, gate3 of H each, then x0/bigram pairs of layers 0..3), gate 1 has 5H + 11 (xsa4,
    xsa7, gate10, pairs of 4, 5, 7, 8, 9, skip, dc_w1, dc_w2); MUDD's 14 and 5 coefficients do not
    depend on H; the hidden sizes (64) are read from mudd_w1 / mudd_gate_w1;
  - the smear gate reads 12 dims and the value-embedding gate 6 + 6, as the record (D >= 12);
  - the bigram table's rows, its dim (<= D; the record: D) and the sign table's rows come from
    the tensors; the hash's multipliers stay 36313 and 27191;
  - windows (--ws-short, --ws-long, tokens), the DC window (--dc-window, the record 112), the
    attention scale (--attn-scale, 0.1) and the row length are arguments; the bank paddings are
    whatever the file holds (init mode pads to 8 ranks as the record: 64 / 24 / 12 / 24 at H 6);
  - documents start at each --bos token of the input (not at position 0 unless it is one: the
    first document starts at 0 regardless), as the record's cu_seqlens from its BOS index.

Mechanisms off by --off a,b,... (default: all on, the record): bigram (no bigram term), bigram_sign
(sign table all +1), smear, paired (paired layers attend as unpaired ones), key_offset, xsa,
attn_gate (gates 1), dc, mudd (no MUDD: layer 10 is an ordinary layer with resid/post_lambdas[10],
its value embedding gated by ve_gate_bank[4] like layers 1, 2, 8, 9, no x0/bigram term there, no
cache9 and no post-loop mix), mudd_gate (each gate is its constant b2 _mudd_gate_scale: the
hidden layer dropped), ve (no value embeddings anywhere), ve_gate (gate 1), cache7 (layers 8-10
read n(x)), skip, lambdas (resid_lambdas and post_lambdas read as 1), mtp (weights [1]), prefix,
softcap_offset (23 sigmoid(logits / 7.5)).

torch 1.13 has no safetensors package: the format (u64 LE header length, JSON header, raw
little-endian data) is read and written here with numpy.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

N_LAYER = 11
PAIRED = (0, 2, 5, 9)
XSA = (1, 3, 4, 7)
ATTN_GATED = (3, 10)
DC_LAYERS = (10,)
NO_ATTN = 6
CACHED = (3, 7)
VE_TABLE = {1: 0, 2: 1, 8: 2, 9: 3, 10: 4}  # layer -> value_embeds table / ve_gate_bank row
LONG = (3, 10)
GATE1_AT = 4
SMEAR_DIMS = 12
VE_GATE_DIMS = 6
MUDD_SCALE = 0.1
CAP, CAP_OFFSET, CAP_SCALE = 23.0, 5.0, 7.5
HASH_MUL_CUR, HASH_MUL_PREV = 36313, 27191
MECHANISMS = ("bigram", "bigram_sign", "smear", "paired", "key_offset", "xsa", "attn_gate", "dc",
              "mudd", "mudd_gate", "ve", "ve_gate", "cache7", "skip", "lambdas", "mtp", "prefix",
              "softcap_offset")
PARAMS = ("embed", "lm_head", "bigram_embed", "smear_gate", "value_embeds", "ve_gate_bank",
          "qk_bank", "vo_bank", "mlp_bank", "scalars", "resid_lambdas", "post_lambdas", "mudd_w1",
          "mudd_w2", "mudd_b2", "mudd_gate_w1", "mudd_gate_w2", "mudd_gate_b2", "_mudd_gate_scale")
BUFFERS = ("bigram_sign_table", "prefix_table")

ST_READ = {"F32": np.float32, "F64": np.float64, "BF16": None, "I32": np.int32, "I64": np.int64}
ST_WRITE = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("int64"): "I64",
            np.dtype("int32"): "I32"}


class InputError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Files

def read_safetensors(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})")
    if len(data) < 8:
        raise InputError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: bad safetensors header ({e})")
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = data[8 + n + b:8 + n + e]
        if info["dtype"] == "BF16":  # the record's own dtype for most tensors: widen exactly
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif info["dtype"] in ST_READ:
            arr = np.frombuffer(raw, dtype=np.dtype(ST_READ[info["dtype"]]).newbyteorder("<"))
        else:
            raise InputError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.array(arr, order="C", copy=False)  # (ascontiguousarray makes a 0-d array 1-d)
        if arr.dtype not in ST_WRITE:
            arr = arr.astype(np.float64)
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": ST_WRITE[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_shard(path):
    """A token shard: 256 int32 of header (magic 20240520, version 1, count), uint16 tokens."""
    try:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(1024), dtype="<i4")
            tokens = np.frombuffer(f.read(), dtype="<u2")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})")
    if len(header) < 3 or header[0] != 20240520 or header[1] != 1:
        raise InputError(f"{path}: not a token shard")
    if len(tokens) != header[2]:
        raise InputError(f"{path}: header says {header[2]} tokens, file holds {len(tokens)}")
    return tokens.astype(np.int64)


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


def gpt2_byte_decoder():
    """GPT-2's encoder.json spells bytes as printable characters: printable bytes as themselves,
    the others as chr(256 + n) in byte order. The inverse map, character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def prefix_table_from_vocab(encoder_json, vocab):
    """For each token id < vocab: the id of the longest proper byte prefix of its byte string
    that is itself a token (ids < vocab), else -1; <|endoftext|> (a special token, not a byte
    string) maps to -1 and is no one's prefix. Looks each prefix up by length, longest first."""
    try:
        with open(encoder_json, encoding="utf-8") as f:
            encoder = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{encoder_json}: cannot read the GPT-2 vocabulary ({e})")
    decode = gpt2_byte_decoder()
    ids = {}
    for text, tid in encoder.items():
        if text == "<|endoftext|>" or tid >= vocab:
            continue
        ids[bytes(decode[c] for c in text)] = tid
    table = np.full(vocab, -1, dtype=np.int64)
    for b, tid in ids.items():
        for n in range(len(b) - 1, 0, -1):
            if b[:n] in ids:
                table[tid] = ids[b[:n]]
                break
    return table


# ---------------------------------------------------------------------------------------------
# Host-side tables

def wrap_int32(a):
    return ((np.asarray(a, dtype=np.int64) + 2**31) % 2**32) - 2**31


def bigram_hash(tokens, rows):
    """The bigram table row of each position (spec section 6 item 2): position 0 reads the
    reserved row m = rows - 1, position 1 hashes its token with m, later ones with the token
    before; int32 products, torch's remainder (non-negative for m > 0)."""
    x = np.asarray(tokens, dtype=np.int64)
    m = rows - 1
    prev = x[:-1].copy()  # the token before positions 1..T-1, position 0's replaced by m
    prev[:1] = m
    h = np.empty(len(x), dtype=np.int64)
    h[0] = m
    h[1:] = np.mod(wrap_int32(HASH_MUL_CUR * x[1:]) ^ wrap_int32(HASH_MUL_PREV * prev), m)
    return h


def sign_rows(tokens, rows):
    """The sign-table row of each position: (x_{t-1} XOR x_t) mod rows, row 0 at t = 0."""
    x = np.asarray(tokens, dtype=np.int64)
    s = np.zeros(len(x), dtype=np.int64)
    s[1:] = np.mod(x[:-1] ^ x[1:], rows)
    return s


def rotary_frequencies(head_dim, base=1024.0):
    """hd/4 frequencies (1/base)^linspace(0, 1), each for an adjacent pair, then hd/2 zeros."""
    f = (1.0 / base) ** torch.linspace(0, 1, head_dim // 4, dtype=torch.float64)
    return torch.cat([f.repeat_interleave(2), torch.zeros(head_dim // 2, dtype=torch.float64)])


def yarn_apply(freqs, attn_scale, old_window, new_window, alpha=1.0, beta=32.0):
    """YaRN at a long-window growth old -> new (tokens): frequencies that turn fewer than alpha
    times over the old window are interpolated by old / new, those that turn more than beta
    times are kept, linear in between; the attention scale grows by 1 + 0.2 ln(new / old).
    Returns (freqs, attn_scale)."""
    s = old_window / new_window
    w = torch.clamp((old_window * freqs / (2 * math.pi) - alpha) / (beta - alpha), 0, 1)
    return freqs * (s + w * (1 - s)), attn_scale * (1 + 0.2 * math.log(new_window / old_window))


# ---------------------------------------------------------------------------------------------
# The model

class Setup:
    """What the forward needs beside the parameters: dims, schedule values, switches."""

    def __init__(self, p, args, on):
        self.on = on
        self.V, self.D = p["embed"].shape
        self.H = p["ve_gate_bank"].shape[1]
        if self.H % 2 or self.D % self.H:
            raise InputError(f"ve_gate_bank gives H = {self.H}: H must be even and divide D = {self.D}")
        self.hd = self.D // self.H
        if self.hd % 4:
            raise InputError(f"head_dim {self.hd} must be a multiple of 4 (rotary pairs over half)")
        if self.D < SMEAR_DIMS:
            raise InputError(f"D = {self.D}: the smear gate reads {SMEAR_DIMS} dims")
        self.ws_short, self.ws_long = args.ws_short, args.ws_long
        self.dc_window = args.dc_window
        self.norm_eps = args.norm_eps
        self.freqs = rotary_frequencies(self.hd, args.rotary_base)
        self.attn_scale = args.attn_scale
        for g in (args.yarn.split(",") if args.yarn else []):
            old, _, new = g.partition(":")
            try:
                self.freqs, self.attn_scale = yarn_apply(self.freqs, self.attn_scale, int(old), int(new))
            except ValueError:
                raise InputError(f"--yarn {args.yarn}: expected OLD:NEW window pairs")
        self.mtp = [float(w) for w in args.mtp.split(",")] if on["mtp"] else [1.0]
        self.prefix_weight = args.prefix_weight if on["prefix"] else 0.0
        self.bos = args.bos
        self.grad_scale = args.grad_scale
        self.kernel_tail = args.tail == "kernel"
        self.windows = [None if i == NO_ATTN else (self.ws_long if i in LONG else self.ws_short)
                        for i in range(N_LAYER)]
        self.pre_n, self.post_n = 3 * self.H + 8, 5 * self.H + 11


def rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def inject(x, v):
    """x with v added to its first v.shape[-1] dims (the bigram term's dims)."""
    d = v.shape[-1]
    return torch.cat([x[:, :d] + v, x[:, d:]], dim=-1) if d < x.shape[-1] else x + v


def rotate(x, pos, freqs):
    """x [T, H, hd] rotated at positions pos [T, H] (adjacent pairs)."""
    theta = pos[..., None] * freqs
    cos, sin = torch.cos(theta), torch.sin(theta)
    swapped = x.reshape(*x.shape[:-1], -1, 2).flip(-1).reshape(x.shape)
    sign = torch.tensor([1.0, -1.0], dtype=x.dtype).repeat(x.shape[-1] // 2)
    return cos * x + sin * sign * swapped


def window_mask(doc, window):
    """[n, n] True where query i may see key j: same document, j <= i, i - j <= window."""
    i = torch.arange(len(doc))
    rel = i[:, None] - i[None, :]
    return (doc[:, None] == doc[None, :]) & (rel >= 0) & (rel <= window)


def softmax_attend(q, k, v, mask, scale):
    """q, k, v [G, n, hd], mask [n, n]: per group, softmax(scale q k^T) v over the mask."""
    s = scale * q @ k.transpose(-1, -2)
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def mudd_mlp(p, x, which, n, gate, on):
    """MUDD (gate False) or MUDD gate: (gelu(x W1^T) W2^T + b2) s, n coefficients [T, n]."""
    pre = "mudd_gate_" if gate else "mudd_"
    scale = p["_mudd_gate_scale"] if gate else MUDD_SCALE
    b2 = p[pre + "b2"][which, :n]
    if gate and not on["mudd_gate"]:
        return (b2 * scale).expand(x.shape[0], n)
    h = F.gelu(x @ p[pre + "w1"][which].T)
    return (h @ p[pre + "w2"][which, :n].T + b2) * scale


def attention(p, s, i, a, doc, aux_v, xsa_alpha, gate, dc_w):
    T, D, H, hd = a.shape[0], s.D, s.H, s.hd
    j = i - (i > NO_ATTN)
    lam_qkv, lam_o = p["scalars"][2 * i], p["scalars"][2 * i + 1]
    w_qk = p["qk_bank"][j * H:(j + 1) * H].reshape(2 * D, D)
    w_qkv = torch.cat([w_qk, p["vo_bank"][2 * j]])
    qkv = a @ (lam_qkv * w_qkv).T
    q = rms(qkv[:, :D].reshape(T, H, hd), s.norm_eps)  # QK norm per head
    k = rms(qkv[:, D:2 * D].reshape(T, H, hd), s.norm_eps)
    v = qkv[:, 2 * D:].reshape(T, H, hd)
    t = torch.arange(T, dtype=torch.float64)
    heads = torch.arange(H)
    paired = i in PAIRED and s.on["paired"]
    if paired:
        pos = 2 * t[:, None] + (heads % 2)[None, :]
    else:
        pos = t[:, None].expand(T, H)
    q, k = rotate(q, pos, s.freqs), rotate(k, pos, s.freqs)
    if not paired and s.windows[i] == s.ws_long and s.on["key_offset"]:
        k = torch.cat([k[:, :, :hd // 2], torch.cat([k[:1, :, hd // 2:], k[:-1, :, hd // 2:]])], dim=-1)
    if aux_v is not None:
        v = v + aux_v.reshape(T, H, hd)
    if paired:
        # Slot 2t + s of group p holds head s H/2 + p: [T, 2, H/2, hd] -> [H/2, 2T, hd].
        def interleave(z):
            return z.reshape(T, 2, H // 2, hd).permute(2, 0, 1, 3).reshape(H // 2, 2 * T, hd)
        mask = window_mask(doc.repeat_interleave(2), s.windows[i])
        y = softmax_attend(interleave(q), interleave(k), interleave(v), mask, s.attn_scale)
        y = y.reshape(H // 2, T, 2, hd).permute(1, 2, 0, 3).reshape(T, H, hd)
    else:
        qh, kh, vh = (z.transpose(0, 1) for z in (q, k, v))  # [H, T, hd]
        y = softmax_attend(qh, kh, vh, window_mask(doc, s.windows[i]), s.attn_scale).transpose(0, 1)
        if dc_w is not None:
            # DC: the heads' softmaxes over the last dc_window keys (the query's own included),
            # mixed by the RMS-normed w1 and added to each head's output with weight w2.
            w1, w2 = dc_w
            w1 = w1 * torch.rsqrt(w1.pow(2).mean(-1, keepdim=True) + 1e-6)
            probs = torch.softmax((s.attn_scale * qh @ kh.transpose(-1, -2)).masked_fill(
                ~window_mask(doc, s.dc_window - 1), float("-inf")), dim=-1)  # [H, T, T]
            mix = torch.einsum("tg,gtj->tj", w1, probs)
            y = y + w2[..., None] * torch.einsum("tj,hjd->thd", mix, vh)
    if xsa_alpha is not None and not paired:
        proj = (y * v).sum(-1, keepdim=True) / v.pow(2).sum(-1, keepdim=True).clamp_min(1e-8)
        y = y - torch.tanh(xsa_alpha)[..., None] * proj * v
    if gate is not None:
        y = y * gate[..., None]
    return y.reshape(T, D) @ (lam_o * p["vo_bank"][2 * j + 1]).T


def forward_row(p, s, inp, tgt, prefix_table):
    """The per-position loss [T] of one row (inputs inp, targets tgt: int64 numpy arrays)."""
    on, T, H = s.on, len(inp), s.H
    L = N_LAYER
    x_ids = torch.from_numpy(inp)
    doc = torch.from_numpy(np.cumsum((inp == s.bos) & (np.arange(T) > 0)))
    scalars = p["scalars"]
    smear_lambda, skip_lambda = scalars[2 * L], scalars[2 * L + 1]
    one = torch.ones((), dtype=torch.float64)

    def lam(name, i, sub):
        return p[name][i, sub] if on["lambdas"] else one

    x = p["embed"][x_ids]
    if on["smear"]:
        g = smear_lambda * torch.sigmoid(x[1:, :SMEAR_DIMS] @ p["smear_gate"][0])
        x = torch.cat([x[:1], x[1:] + g[:, None] * x[:-1]])
    x0 = rms(x, s.norm_eps)

    bg = None
    if on["bigram"]:
        rows = torch.from_numpy(bigram_hash(inp, p["bigram_embed"].shape[0]))
        bg = p["bigram_embed"][rows]
        if on["bigram_sign"]:
            bg = bg * p["bigram_sign_table"][torch.from_numpy(sign_rows(inp, p["bigram_sign_table"].shape[0]))]
    ve = None
    if on["ve"]:
        tables = p["value_embeds"].reshape(5, s.V, s.D)
        ve = {layer: tables[t][x_ids] for layer, t in VE_TABLE.items()}

    xsa, gates, x0g, bgg, dc_w = {}, {}, {}, {}, {}
    g0 = mudd_mlp(p, x0, 0, s.pre_n, True, on)
    xsa[1], xsa[3], gates[3] = g0[:, :H], g0[:, H:2 * H], g0[:, 2 * H:3 * H]
    for n, layer in enumerate((0, 1, 2, 3)):
        x0g[layer], bgg[layer] = g0[:, 3 * H + 2 * n:3 * H + 2 * n + 1], g0[:, 3 * H + 2 * n + 1:3 * H + 2 * n + 2]
    skip_gate = None

    x = inject(x0, bgg[0] * bg) if bg is not None else x0
    cache = {0: x}
    for i in range(L):
        mu = None
        if i == GATE1_AT:
            g1 = mudd_mlp(p, x, 1, s.post_n, True, on)
            xsa[4], xsa[7], gates[10] = g1[:, :H], g1[:, H:2 * H], g1[:, 2 * H:3 * H]
            for n, layer in enumerate((4, 5, 7, 8, 9)):
                x0g[layer] = g1[:, 3 * H + 2 * n:3 * H + 2 * n + 1]
                bgg[layer] = g1[:, 3 * H + 2 * n + 1:3 * H + 2 * n + 2]
            skip_gate = g1[:, 3 * H + 10:3 * H + 11]
            dc_w[10] = (g1[:, 3 * H + 11:4 * H + 11], g1[:, 4 * H + 11:5 * H + 11])
        if i == NO_ATTN:
            if on["skip"]:
                x = x + torch.sigmoid(skip_lambda) * skip_gate * cache[3]
        else:
            a = rms(cache[7] if (on["cache7"] and 7 in cache) else x, s.norm_eps)
            aux_v = None
            if i == L - 1 and on["mudd"]:
                cache[9] = x
                mu = mudd_mlp(p, x, 0, 14, False, on).split(1, dim=-1)
                aux_v = mu[0] * cache[0] + mu[1] * cache[7] + mu[2] * x
                if ve is not None:
                    per_head = torch.cat([mu[6].expand(T, H // 2), mu[7].expand(T, H // 2)], dim=-1)
                    aux_v = aux_v + (per_head[..., None] * ve[i].reshape(T, H, s.hd)).reshape(T, s.D)
                x = (1 + mu[5]) * x + mu[3] * cache[0] + mu[4] * cache[7]
            elif ve is not None and i in VE_TABLE:
                if on["ve_gate"]:
                    gate_in = torch.cat([a[:, :VE_GATE_DIMS], ve[i][:, :VE_GATE_DIMS]], dim=-1)
                    g = 2 * torch.sigmoid(gate_in @ p["ve_gate_bank"][VE_TABLE[i]].T)
                    aux_v = (g[..., None] * ve[i].reshape(T, H, s.hd)).reshape(T, s.D)
                else:
                    aux_v = ve[i]
            y = attention(p, s, i, a, doc, aux_v, xsa.get(i) if (on["xsa"] and i in XSA) else None,
                          gates.get(i) if (on["attn_gate"] and i in ATTN_GATED) else None,
                          dc_w.get(i) if (on["dc"] and i in DC_LAYERS) else None)
            if mu is not None:
                x = mu[8] * x + mu[9] * y + mu[10] * cache[0]
                if bg is not None:
                    x = inject(x, mu[11] * bg)
            else:
                x = lam("resid_lambdas", i, 0) * x + lam("post_lambdas", i, 0) * y
                if i in x0g:
                    x = x + x0 * x0g[i]
                    if i != 0 and bg is not None:
                        x = inject(x, bgg[i] * bg)
        h = rms(x, s.norm_eps)
        m = torch.relu(h @ p["mlp_bank"][i, 0].T).pow(2) @ p["mlp_bank"][i, 1]
        if mu is not None:
            x = mu[12] * x + mu[13] * m
        else:
            x = lam("resid_lambdas", i, 1) * x + lam("post_lambdas", i, 1) * m
        if i in CACHED:
            cache[i] = x
    if on["mudd"]:
        mu = mudd_mlp(p, x, 1, 5, False, on).split(1, dim=-1)
        x = x + mu[0] * cache[0] + mu[1] * cache[7] + mu[2] * cache[9] + mu[4] * cache[3]
        if ve is not None:
            x = x + mu[3] * ve[1]
    logits = rms(x, s.norm_eps) @ p["lm_head"]
    offset = CAP_OFFSET if on["softcap_offset"] else 0.0
    z = CAP * torch.sigmoid((logits + offset) / CAP_SCALE)
    return soft_capped_loss(z, tgt, s, prefix_table)


def soft_capped_loss(z, tgt, s, prefix_table):
    """Per position: sum_k w_k (lse - z[y_{t+k}]) while t + k < T, plus w_p (lse - z[prefix])."""
    T = z.shape[0]
    lse = torch.logsumexp(z, dim=-1)
    y = torch.from_numpy(tgt)
    loss = torch.zeros(T, dtype=torch.float64)
    for k, w in enumerate(s.mtp):
        if w == 0.0 or k >= T:
            continue
        n = T - k
        term = w * (lse[:n] - z[torch.arange(n), y[k:]])
        loss = loss + torch.cat([term, torch.zeros(k, dtype=torch.float64)])
        if s.kernel_tail and k > 0:
            # The kernel's softmax term for the missing targets: no value, the gradient w p.
            tail = w * (lse[n:] - lse[n:].detach())
            loss = loss + torch.cat([torch.zeros(n, dtype=torch.float64), tail])
    if s.prefix_weight != 0.0 and prefix_table is not None:
        pt = torch.from_numpy(prefix_table[tgt])
        valid = (pt >= 0) & (pt < z.shape[1])
        if bool(valid.any()):
            rows = torch.nonzero(valid)[:, 0]
            term = s.prefix_weight * (lse[rows] - z[rows, pt[rows]])
            loss = loss.index_add(0, rows, term)
    return loss


def objective(p, s, rows_in, rows_tgt, prefix_table):
    per = torch.stack([forward_row(p, s, a, b, prefix_table) for a, b in zip(rows_in, rows_tgt)])
    return s.grad_scale * per.sum(), per


def gradients(p, loss):
    """d loss / d parameter for every parameter (zeros for those a switch leaves unused)."""
    loss.backward()
    return {k: (p[k].grad if p[k].grad is not None else torch.zeros_like(p[k])) for k in PARAMS}


# ---------------------------------------------------------------------------------------------
# Parameters

def load_params(path):
    raw = read_safetensors(path)
    named = {(k[:-len(".weight")] if k.endswith(".weight") else k): v for k, v in raw.items()}
    missing = [k for k in PARAMS if k not in named]
    if missing:
        raise InputError(f"{path}: missing record parameters {missing}")
    if "bigram_sign_table" not in named:
        raise InputError(f"{path}: missing the buffer bigram_sign_table (the record's random +-1 rows)")
    p = {k: torch.tensor(named[k], dtype=torch.float64, requires_grad=True) for k in PARAMS}
    p["bigram_sign_table"] = torch.tensor(named["bigram_sign_table"], dtype=torch.float64)
    prefix = named.get("prefix_table")
    check_shapes(p, path)
    return p, (None if prefix is None else np.asarray(prefix, dtype=np.int64))


def expected_shapes(V, D, H, Vb, bd, Ns, Hm, Hg, banks):
    hd = D // H
    nqk, nvo, nmlp, nsc = banks
    return {"embed": (V, D), "lm_head": (D, V), "bigram_embed": (Vb, bd), "smear_gate": (1, SMEAR_DIMS),
            "value_embeds": (5 * V, D), "ve_gate_bank": (5, H, 2 * VE_GATE_DIMS),
            "qk_bank": (nqk, 2 * hd, D), "vo_bank": (nvo, D, D), "mlp_bank": (nmlp, 2, 4 * D, D),
            "scalars": (nsc,), "resid_lambdas": (N_LAYER, 2), "post_lambdas": (N_LAYER, 2),
            "mudd_w1": (2, Hm, D), "mudd_w2": (2, 14, Hm), "mudd_b2": (2, 14),
            "mudd_gate_w1": (2, Hg, D), "mudd_gate_w2": (2, 5 * H + 11, Hg),
            "mudd_gate_b2": (2, 5 * H + 11), "_mudd_gate_scale": (), "bigram_sign_table": (Ns, bd)}


def check_shapes(p, where):
    V, D = p["embed"].shape
    H = p["ve_gate_bank"].shape[1]
    banks = (p["qk_bank"].shape[0], p["vo_bank"].shape[0], p["mlp_bank"].shape[0], p["scalars"].shape[0])
    want = expected_shapes(V, D, H, p["bigram_embed"].shape[0], p["bigram_embed"].shape[1],
                           p["bigram_sign_table"].shape[0], p["mudd_w1"].shape[1],
                           p["mudd_gate_w1"].shape[1], banks)
    for k, shape in want.items():
        if tuple(p[k].shape) != tuple(shape):
            raise InputError(f"{where}: {k} has shape {list(p[k].shape)}, expected {list(shape)} "
                             f"(V {V}, D {D}, H {H})")
    if banks[0] < 10 * H or banks[1] < 20 or banks[2] < N_LAYER or banks[3] < 2 * N_LAYER + 2:
        raise InputError(f"{where}: banks too small for 11 layers: qk_bank {banks[0]} (>= {10 * H}), "
                         f"vo_bank {banks[1]} (>= 20), mlp_bank {banks[2]} (>= 11), scalars {banks[3]} (>= 24)")
    if p["bigram_embed"].shape[1] > D:
        raise InputError(f"{where}: bigram_embed's dim {p['bigram_embed'].shape[1]} exceeds D {D}")


def pad8(n):
    return -(-n // 8) * 8


def init_params(args):
    """The record's init (GPT.__init__) at the given dims, or every tensor random and nonzero."""
    g = torch.Generator().manual_seed(args.seed)
    V, D, H = args.vocab, args.d_model, args.n_head
    bd = args.bigram_dim or D
    banks = (pad8(10 * H), pad8(20), N_LAYER + 1, pad8(2 * N_LAYER + 2))
    shapes = expected_shapes(V, D, H, args.bigram_rows, bd, args.sign_rows, args.mudd_dim,
                             args.mudd_gate_dim, banks)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    def uniform(shape, bound):
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound

    bound = math.sqrt(3) * 0.5 / math.sqrt(D)
    random = args.init_style == "random"
    small = (lambda shape, std: normal(shape, std)) if random else (lambda shape, std: torch.zeros(shape, dtype=torch.float64))
    p = {}
    p["lm_head"] = normal(shapes["lm_head"], 0.005 if not random else 0.05)
    p["embed"] = p["lm_head"].T.clone() if not random else normal(shapes["embed"], 1.0)
    p["value_embeds"] = normal(shapes["value_embeds"], 0.01 if not random else 0.3)
    p["ve_gate_bank"] = small(shapes["ve_gate_bank"], 0.3)
    qk = uniform(shapes["qk_bank"], bound)
    qk[10 * H:] = 0
    vo = uniform(shapes["vo_bank"], bound)
    vo[20:] = 0
    p["qk_bank"], p["vo_bank"] = qk, vo
    mlp = torch.zeros(shapes["mlp_bank"], dtype=torch.float64)
    mlp[:, 0] = uniform(mlp[:, 0].shape, bound)
    mlp[:, 1] = small(mlp[:, 1].shape, bound)
    p["mlp_bank"] = mlp
    sc = torch.ones(banks[3], dtype=torch.float64)
    sc[:2 * N_LAYER] = torch.tensor([0.5, 1.0] * N_LAYER, dtype=torch.float64)
    sc[2 * N_LAYER], sc[2 * N_LAYER + 1] = 0.0, -1.5
    p["scalars"] = sc + small(sc.shape, 0.1)
    p["resid_lambdas"] = torch.full((N_LAYER, 2), 1.1 ** 0.5, dtype=torch.float64) + small((N_LAYER, 2), 0.1)
    p["post_lambdas"] = torch.ones(N_LAYER, 2, dtype=torch.float64) + small((N_LAYER, 2), 0.1)
    p["smear_gate"] = small(shapes["smear_gate"], 0.5)
    p["bigram_embed"] = small(shapes["bigram_embed"], 0.3)
    # kaiming_uniform_(a = sqrt 5) over fan_in D: bound 1 / sqrt(D).
    p["mudd_w1"] = uniform(shapes["mudd_w1"], 1 / math.sqrt(D))
    p["mudd_gate_w1"] = uniform(shapes["mudd_gate_w1"], 1 / math.sqrt(D))
    p["mudd_w2"] = small(shapes["mudd_w2"], 1.0)
    p["mudd_gate_w2"] = small(shapes["mudd_gate_w2"], 1.0)
    b = torch.zeros(2, 14, dtype=torch.float64)
    b[0, 6] = b[0, 7] = 2.0 / MUDD_SCALE
    b[0, 8] = b[0, 12] = 1.1 ** 0.5 / MUDD_SCALE
    b[0, 9] = b[0, 13] = 1.0 / MUDD_SCALE
    b[0, 11] = 0.05 / MUDD_SCALE
    b[1, 1] = -0.5 / MUDD_SCALE
    p["mudd_b2"] = b + small(b.shape, 1.0)
    gb = torch.zeros(2, 5 * H + 11, dtype=torch.float64)
    gb[0, 2 * H:3 * H] = 0.25 / 0.1
    gb[0, 3 * H + 1:3 * H + 8:2] = 0.05 / 0.1
    gb[1, 2 * H:3 * H] = 0.25 / 0.1
    gb[1, 3 * H + 1:3 * H + 10:2] = 0.05 / 0.1
    gb[1, 3 * H + 10] = 0.5 / 0.1
    gb[1, 3 * H + 11:4 * H + 11] = 1.0 / 0.1
    p["mudd_gate_b2"] = gb + small(gb.shape, 1.0)
    p["_mudd_gate_scale"] = torch.tensor(0.1, dtype=torch.float64)
    p["bigram_sign_table"] = torch.randn(shapes["bigram_sign_table"], generator=g, dtype=torch.float64).sign()
    # A synthetic prefix table: token t maps to a random smaller token with probability 1/2.
    prefix = np.full(V, -1, dtype=np.int64)
    coin = torch.rand(V, generator=g).numpy()
    pick = torch.randint(0, 2**31 - 1, (V,), generator=g).numpy()
    for t in range(1, V):
        if coin[t] < 0.5:
            prefix[t] = pick[t] % t
    out = {k: v.numpy() for k, v in p.items()}
    out["prefix_table"] = prefix
    return out


# ---------------------------------------------------------------------------------------------
# Modes

def load_rows(args):
    tokens = read_shard(args.tokens)
    need = args.batch * (args.seq + 1)
    if len(tokens) < need:
        raise InputError(f"{args.tokens}: needs {need} tokens for batch {args.batch} x (seq {args.seq} + 1), "
                         f"has {len(tokens)}")
    rows = tokens[:need].reshape(args.batch, args.seq + 1)
    return [r[:-1].copy() for r in rows], [r[1:].copy() for r in rows]


def switches(off):
    names = [n for n in (off.split(",") if off else []) if n]
    bad = [n for n in names if n not in MECHANISMS]
    if bad:
        raise InputError(f"--off: unknown mechanisms {bad} (known: {', '.join(MECHANISMS)})")
    return {m: m not in names for m in MECHANISMS}


def prepare(args):
    p, prefix = load_params(args.weights)
    if prefix is None and args.vocab_dir:
        prefix = prefix_table_from_vocab(os.path.join(args.vocab_dir, "encoder.json"), p["embed"].shape[0])
    s = Setup(p, args, switches(args.off))
    rows_in, rows_tgt = load_rows(args)
    for r in rows_in + rows_tgt:
        if r.max() >= s.V:
            raise InputError(f"{args.tokens}: token {int(r.max())} outside the vocabulary of {s.V} rows")
    if s.prefix_weight and prefix is None:
        print("record89_reference: no prefix_table in the weights and no --vocab-dir: the prefix "
              "term is off", file=sys.stderr)
    return p, s, rows_in, rows_tgt, prefix


def parity(args):
    p, s, rows_in, rows_tgt, prefix = prepare(args)
    loss, per = objective(p, s, rows_in, rows_tgt, prefix)
    grads = gradients(p, loss)
    out = {"loss": np.array(loss.item()), "loss_per_token": per.detach().numpy()}
    for k in PARAMS:
        out["grad/" + k] = grads[k].detach().numpy()
    write_safetensors(args.out, out)
    print(f"record89_reference: loss {loss.item():.10f} ({args.out}; attn_scale {s.attn_scale:.6f})")


def self_check(args):
    """Autograd's gradient against float64 central differences at sampled entries."""
    p, s, rows_in, rows_tgt, prefix = prepare(args)
    loss, _ = objective(p, s, rows_in, rows_tgt, prefix)
    grads = gradients(p, loss)
    g = torch.Generator().manual_seed(args.seed)
    scale = max(float(grads[k].abs().max()) for k in PARAMS)
    worst, report = 0.0, []
    for k in PARAMS:
        flat, grad = p[k].data.view(-1), grads[k].reshape(-1)
        nz = torch.nonzero(grad != 0)[:, 0]
        pool = nz if len(nz) else torch.arange(flat.numel())
        picks = pool[torch.randperm(len(pool), generator=g)[:args.check]]
        err_k = 0.0
        for idx in picks.tolist():
            keep = flat[idx].item()
            with torch.no_grad():
                flat[idx] = keep + args.fd_eps
                up = objective(p, s, rows_in, rows_tgt, prefix)[0].item()
                flat[idx] = keep - args.fd_eps
                down = objective(p, s, rows_in, rows_tgt, prefix)[0].item()
                flat[idx] = keep
            fd = (up - down) / (2 * args.fd_eps)
            err = abs(fd - grad[idx].item()) / (abs(grad[idx].item()) + 1e-3 * scale)
            err_k = max(err_k, err)
        report.append((k, len(nz), flat.numel(), err_k))
        worst = max(worst, err_k)
    for k, nnz, n, e in report:
        print(f"  {k:18s} nonzero grad {nnz:7d}/{n:<7d} max rel err {e:.2e}")
    ok = worst <= args.tol
    print(f"record89_reference --check: loss {loss.item():.10f}, worst {worst:.2e} "
          f"(tol {args.tol:.0e}): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", help="parameters in the record's names (safetensors)")
    ap.add_argument("--tokens", help="token shard")
    ap.add_argument("--batch", type=int, default=1, help="rows (each one rank's flat micro-batch)")
    ap.add_argument("--seq", type=int, default=40, help="row length T")
    ap.add_argument("--out", help="parity mode: output safetensors")
    ap.add_argument("--check", type=int, default=0, help="self-check: K entries per parameter")
    ap.add_argument("--fd-eps", type=float, default=1e-5)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--off", default="", help="mechanisms off, comma-separated: " + ", ".join(MECHANISMS))
    ap.add_argument("--ws-short", type=int, default=128, help="short window W in tokens (record stage 1: 128)")
    ap.add_argument("--ws-long", type=int, default=384, help="long window W in tokens (record stage 1: 384)")
    ap.add_argument("--dc-window", type=int, default=112, help="DC's keys, the query's own included")
    ap.add_argument("--attn-scale", type=float, default=0.1, help="softmax scale before YaRN")
    ap.add_argument("--yarn", default="", help="long-window growths applied in order, OLD:NEW,...")
    ap.add_argument("--rotary-base", type=float, default=1024.0)
    ap.add_argument("--norm-eps", type=float, default=2.0**-23)
    ap.add_argument("--mtp", default="1,0.5,0.25", help="multi-token weights (record step 0)")
    ap.add_argument("--prefix-weight", type=float, default=0.25)
    ap.add_argument("--tail", choices=["loss", "kernel"], default="loss",
                    help="last rows' gradient: the loss's, or the CE kernel's (all MTP weights)")
    ap.add_argument("--bos", type=int, default=50256, help="the token that starts a document")
    ap.add_argument("--grad-scale", type=float, default=1.0, help="the objective's factor (1/grad_accum)")
    ap.add_argument("--vocab-dir", help="folder with GPT-2's encoder.json: the prefix table, when "
                                        "the weights hold no prefix_table")
    ap.add_argument("--init", metavar="OUT", help="init mode: write a parameter file")
    ap.add_argument("--init-style", choices=["random", "record"], default="random")
    ap.add_argument("--d-model", type=int, default=48)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--bigram-rows", type=int, default=97)
    ap.add_argument("--bigram-dim", type=int, default=0, help="default: D")
    ap.add_argument("--sign-rows", type=int, default=16)
    ap.add_argument("--mudd-dim", type=int, default=8)
    ap.add_argument("--mudd-gate-dim", type=int, default=8)
    args = ap.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    try:
        if args.init:
            write_safetensors(args.init, init_params(args))
            print(f"record89_reference: wrote {args.init}")
            return 0
        for k in ("weights", "tokens"):
            if getattr(args, k) is None:
                ap.error(f"--{k} is required (or use --init)")
        if args.check:
            return self_check(args)
        if not args.out:
            ap.error("--out is required (or use --check K)")
        parity(args)
        return 0
    except InputError as e:
        print(f"record89_reference: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
