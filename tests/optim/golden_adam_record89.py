#!/usr/bin/env python3
"""Golden trajectory of record #89's Adam stepped every other step, in float64 with the standard
library only (KellerJordan/modded-nanogpt f411b3d3, train_gpt.py: NorMuonAndAdam._adam_update and
_adam_update_step, lines 829-862; step(do_adam), 724-827; _is_adam_step, 2104-2106; the group
table, 2026-2040).

The record's step s (counted from 0) updates its Adam parameters only when s is odd. On the even
steps their gradients are neither reduced nor cleared, so the backward of the next step adds to
them: an update sees the sum of two steps' gradients, with the lr of its own step. The step
counter t of the bias corrections counts updates. Per element, with lr_p = lr lr_mul:
    m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2
    u = lr_p sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
    u <- u + lr_p^2 wd wd_mul W  where u W > 0            (cautious weight decay)
    W <- W - u
The file's step t (1-based) is the record's step t - 1: the parameters change at t = 2, 4, 6 and
stay at t = 1, 3, 5, 7 (step 7's gradient is accumulated and never applied).

    python3 tests/optim/golden_adam_record89.py   # writes tests/fixtures/golden/adam_cwd/every_other_step.safetensors
"""
import json
import math
import os
import random
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "golden",
                   "adam_cwd", "every_other_step.safetensors")
LR, EPS, WEIGHT_DECAY, STEPS = 0.008, 1e-10, 0.005, 7
# Rows from the record's table (betas, lr_mul, wd_mul), on small shapes whose rows do not divide
# evenly among 2, 3 or 8 ranks.
PARAMS = {
    "embed.weight": ([13, 6], {"betas": [0.5, 0.95], "lr_mul": 1.0, "wd_mul": 150.0}),
    "value_embeds.weight": ([10, 6], {"betas": [0.75, 0.95], "lr_mul": 75.0, "wd_mul": 5.0}),
    "scalars": ([7], {"betas": [0.9, 0.99], "lr_mul": 5.0, "wd_mul": 0.0}),
    "blocks.0.attn.gate.weight": ([5, 3], {"betas": [0.9, 0.99], "lr_mul": 1.0, "wd_mul": 1.0}),
}


def adam_update(w, g, m, v, t, cfg):
    b1, b2 = cfg["betas"]
    lr = LR * cfg["lr_mul"]
    step_size = lr * (math.sqrt(1 - b2 ** t) / (1 - b1 ** t))
    eff_wd = lr * lr * WEIGHT_DECAY * cfg["wd_mul"]
    for i in range(len(w)):
        m[i] = b1 * m[i] + (1 - b1) * g[i]
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
        u = m[i] / (math.sqrt(v[i]) + EPS) * step_size
        if u * w[i] > 0:
            u += w[i] * eff_wd
        w[i] -= u


def main():
    if len(sys.argv) > 1:
        print(__doc__)
        return
    rng = random.Random(8902)
    shapes = {n: s for n, (s, _) in PARAMS.items()}
    numel = {n: math.prod(s) for n, s in shapes.items()}
    w = {n: [rng.gauss(0.0, 0.5) for _ in range(numel[n])] for n in PARAMS}
    m = {n: [0.0] * numel[n] for n in PARAMS}
    v = {n: [0.0] * numel[n] for n in PARAMS}
    acc = {n: [0.0] * numel[n] for n in PARAMS}
    t_adam = 0
    tensors = {f"init/{n}": (shapes[n], list(w[n])) for n in PARAMS}
    for t in range(1, STEPS + 1):
        step = t - 1  # the record's step index
        grads = {n: [rng.gauss(0.0, 1e-2) for _ in range(numel[n])] for n in PARAMS}
        do_adam = step % 2 == 1
        if do_adam:
            t_adam += 1
        for n, (_, cfg) in PARAMS.items():
            tensors[f"grad/{t}/{n}"] = (shapes[n], grads[n])
            acc[n] = [a + b for a, b in zip(acc[n], grads[n])]  # backward adds into .grad
            if do_adam:
                adam_update(w[n], acc[n], m[n], v[n], t_adam, cfg)
                acc[n] = [0.0] * numel[n]  # param.grad = None after an Adam step
            tensors[f"param/{t}/{n}"] = (shapes[n], list(w[n]))

    hyper = {
        "lr": LR, "eps": EPS, "weight_decay": WEIGHT_DECAY, "betas": [0.9, 0.99],
        "update_every": 2,
        "param_overrides": {n: cfg for n, (_, cfg) in PARAMS.items()},
        "update_every_rule": "the record's 0-based odd steps (the file's even t) update, on the "
                             "two steps' gradients summed; t of the bias correction counts updates",
    }
    meta = {
        "optimizer": "adam_cwd",
        "steps": str(STEPS),
        "hyperparameters": json.dumps(hyper),
        "reference": "KellerJordan/modded-nanogpt@f411b3d346aa52d3504324ca93c230fd84c6c07f "
                     "train_gpt.py (NorMuonAndAdam._adam_update, step(do_adam), record 89); "
                     "tests/optim/golden_adam_record89.py, float64, standard library only",
        "notes": "Record #89's Adam (cautious weight decay, its table's betas, lr_mul and wd_mul) "
                 "stepped every other step on the sum of two steps' gradients. Float64, stored "
                 "rounded to float32.",
        "suggested_atol": "1e-06",
    }
    write_safetensors(OUT, tensors, meta)
    print("wrote", os.path.normpath(OUT))


def write_safetensors(path, tensors, meta):
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name, (shape, flat) in tensors.items():
        blob = struct.pack(f"<{len(flat)}f", *flat)  # float64 rounded to nearest float32
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


if __name__ == "__main__":
    main()
