#!/usr/bin/env python3
"""GPT-2 as Hugging Face lays it out, written independently of the engine, for tests/model/hf_gpt2_test.cpp.

The module below has transformers' GPT2LMHeadModel parameter names and layouts
(transformer.wte / wpe / h.{i}.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj /
ln_f; Conv1D weights stored [in, out], y = x W + b; head tied to wte) and reads a folder the way
from_pretrained does: config.json for the shape, model.safetensors for the weights, keys with or
without the "transformer." prefix. It needs only PyTorch and numpy (the transformers package is
not installed here, and no network is needed).

usage:
  gpt2_hf_reference.py logits --model DIR --tokens FILE --out FILE
      FILE of tokens: one row of space-separated ids per line; writes the logits of every
      position as float32 [rows, T, vocab_size], row-major, computed in float64.
  gpt2_hf_reference.py random --out DIR --n_layer L --n_head H --n_embd D --n_positions T
                        --vocab_size V [--seed S]
      writes config.json and model.safetensors of random weights (keys without the prefix and
      with the attention-mask buffers, as the hub's gpt2 file has them).
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch
from torch import nn


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name}: dtype {info['dtype']}, expected F32")
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + e], dtype="<f4")
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors, meta


def write_safetensors(path, tensors, meta, dtype="F32"):
    """Float32 arrays written as F32, or rounded to BF16 or F16 (torch's conversions: nearest,
    ties to even), as Hugging Face checkpoints stored in half precision are."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype="<f4")
        if dtype == "BF16":
            raw = torch.from_numpy(arr).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        elif dtype == "F16":
            raw = arr.astype("<f2").tobytes()
        else:
            raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [nx, nf], y = x @ weight + bias."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["n_embd"]
        self.n_head = cfg["n_head"]
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.n_head
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, D))


def gelu_new(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["n_embd"]
        self.c_fc = Conv1D(4 * d, d)
        self.c_proj = Conv1D(d, 4 * d)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=eps)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=eps)
        self.mlp = Mlp(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
        self.wpe = nn.Embedding(cfg["n_positions"], cfg["n_embd"])
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(cfg["n_embd"], eps=cfg.get("layer_norm_epsilon", 1e-5))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class Gpt2LMHeadModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.transformer = Gpt2Model(cfg)

    def forward(self, idx):
        return self.transformer(idx) @ self.transformer.wte.weight.T  # tied head

    @staticmethod
    def from_folder(path):
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new", cfg
        tensors, meta = read_safetensors(os.path.join(path, "model.safetensors"))
        assert meta.get("format") == "pt", "metadata format must be pt, got %r" % meta
        model = Gpt2LMHeadModel(cfg)
        state = {}
        for key, arr in tensors.items():
            if key.endswith(".attn.bias") and arr.ndim == 4 or key.endswith(".attn.masked_bias"):
                continue  # the causal-mask buffers of older files
            if key == "lm_head.weight":
                continue  # tied to wte
            state[key if key.startswith("transformer.") else "transformer." + key] = \
                torch.from_numpy(arr)
        model.load_state_dict(state, strict=True)
        return model


def cmd_logits(args):
    model = Gpt2LMHeadModel.from_folder(args.model).double()
    with open(args.tokens) as f:
        rows = [[int(t) for t in line.split()] for line in f if line.strip()]
    with torch.no_grad():
        logits = model(torch.tensor(rows, dtype=torch.long))
    logits.float().numpy().astype("<f4").tofile(args.out)


def cmd_random(args):
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
           "vocab_size": args.vocab_size, "n_positions": args.n_positions, "n_ctx": args.n_positions,
           "n_embd": args.n_embd, "n_layer": args.n_layer, "n_head": args.n_head,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    torch.manual_seed(args.seed)
    model = Gpt2LMHeadModel(cfg)
    tensors = {}
    for name, p in model.state_dict().items():
        tensors[name[len("transformer."):]] = (torch.randn(p.shape) * 0.1).numpy()
    for i in range(args.n_layer):
        T = args.n_positions
        tensors["h.%d.attn.bias" % i] = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, {"format": "pt"},
                      args.dtype)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    lo = sub.add_parser("logits")
    lo.add_argument("--model", required=True)
    lo.add_argument("--tokens", required=True)
    lo.add_argument("--out", required=True)
    ra = sub.add_parser("random")
    ra.add_argument("--out", required=True)
    for key in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        ra.add_argument("--" + key, type=int, required=True)
    ra.add_argument("--seed", type=int, default=0)
    ra.add_argument("--dtype", choices=["F32", "BF16", "F16"], default="F32")
    args = ap.parse_args()
    cmd_logits(args) if args.command == "logits" else cmd_random(args)


if __name__ == "__main__":
    main()
