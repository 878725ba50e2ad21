#!/usr/bin/python3
"""PyTorch reference of the GPT in docs/specs/model.md, written independently of the engine.

Parity mode: reads the weights (safetensors, F32; the model config travels in the file's
metadata as model.* keys, as the engine writes it) and B*(T+1) tokens from a token shard
(row b = tokens [b(T+1), (b+1)(T+1)): inputs the first T, targets the last T), runs forward and
backward in float64 (default), writes `loss`, `ce_loss` and `grad/<param>` to safetensors.

Bench mode (--bench): times forward+backward+AdamW of a seeded float32 model and prints
tokens/s (one JSON object with --json).

torch 1.13 has no safetensors package, so the format (u64 LE header length, JSON header, raw
little-endian data) is parsed and written here with numpy.
"""
import argparse
import json
import math
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
        self.padded_vocab = (self.vocab_size + 63) // 64 * 64


def rmsnorm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


def rotary(x):
    # x [B, H, T, hd]; pairs (x_j, x_{j+half}) rotated by angle t * 10000^(-j/half).
    T, hd = x.shape[-2], x.shape[-1]
    half = hd // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def model_loss(cfg, p, idx, targets):
    """Returns (objective, cross-entropy); objective = ce + MoE auxiliary losses."""
    B, T = idx.shape
    D, H = cfg.d_model, cfg.n_head
    hd = D // H
    gpt2 = cfg.arch == "gpt2"
    act = gelu_tanh if gpt2 else (lambda u: torch.relu(u) ** 2)

    def norm(x, name):
        if gpt2:
            return F.layer_norm(x, (D,), p[name + ".weight"], p[name + ".bias"], 1e-5)
        return rmsnorm(x)

    def lin(x, name, bias=True):
        y = x @ p[name + ".weight"].t()
        if gpt2 and bias:
            y = y + p[name + ".bias"]
        return y

    x = p["embed.weight"][idx]
    if gpt2:
        x = x + p["pos_embed.weight"][:T]
    aux_total = 0.0
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        h = norm(x, b + "ln1")
        qkv = lin(h, b + "attn.qkv")
        q, k, v = [t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(D, dim=-1)]
        if not gpt2:
            q, k = rotary(rmsnorm(q)), rotary(rmsnorm(k))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        x = x + lin(a.transpose(1, 2).reshape(B, T, D), b + "attn.proj")
        h = norm(x, b + "ln2")
        if cfg.experts:
            E, K = cfg.experts, cfg.top_k
            hf = h.reshape(B * T, D)
            probs = torch.softmax(hf @ p[b + "moe.router.weight"].t(), dim=-1)
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
                y = act(hf[tok] @ p[b + "moe.fc.weight"][e].t()) @ p[b + "moe.proj.weight"][e].t()
                out = out.index_add(0, tok, y * gate[tok, slot][:, None])
            frac = counts / (B * T)  # not differentiated
            aux_total = aux_total + cfg.aux_weight * E * (frac * probs.mean(0)).sum()
            x = x + out.view(B, T, D)
        else:
            x = x + lin(act(lin(h, b + "mlp.fc")), b + "mlp.proj")
    if gpt2:
        x = norm(x, "ln_f")
        head = p["embed.weight"]
    else:
        x = rmsnorm(x)
        head = p["lm_head.weight"]
    logits = (x @ head.t())[..., :cfg.vocab_size]
    if cfg.softcap > 0:
        logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
    ce = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    return ce + aux_total, ce


def parity(args):
    weights, meta = read_safetensors(args.weights)
    cfg = Config(meta)
    dtype = torch.float32 if args.float32 else torch.float64
    p = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in weights.items()}
    T = args.seq if args.seq else cfg.seq_len
    tokens = read_shard(args.tokens)
    need = args.batch * (T + 1)
    if len(tokens) < need:
        raise SystemExit(f"{args.tokens}: needs {need} tokens for batch {args.batch} x (T+1), has {len(tokens)}")
    rows = torch.tensor(tokens[:need].reshape(args.batch, T + 1))
    loss, ce = model_loss(cfg, p, rows[:, :-1], rows[:, 1:])
    loss.backward()
    out = {"loss": np.array(loss.item()), "ce_loss": np.array(ce.item())}
    for k, v in p.items():
        out["grad/" + k] = v.grad.detach().numpy()
    write_safetensors(args.out, out)
    print(f"torch_reference: loss {loss.item():.8f} ce {ce.item():.8f} ({args.out})")


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
           "tokens_per_s": tok_s}
    if args.json:
        print(json.dumps(row))
    else:
        print(f"pytorch {args.arch} threads={args.threads} step {dt * 1e3:.1f} ms  {tok_s:.0f} tok/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights")
    ap.add_argument("--tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: model.seq_len)")
    ap.add_argument("--out")
    ap.add_argument("--float32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--arch", default="modern")
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.bench:
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
