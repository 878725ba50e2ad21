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

The second file, tied_untie, adds the record's tied embedding and head (step(), lines 755-812;
copy_lm_state_to_embed, 657-697): the head is stored transposed, lm_head [D, V], and the
embedding starts as its transpose. While tied, an Adam step adds embed.grad^T (two steps' worth)
into lm_head.grad, steps lm_head alone and sets embed = lm_head^T. At the split step (odd, here
the record's step 5, the file's t = 6), after that step, lm_head's exp_avg and exp_avg_sq are
transposed into embed's and its step counter copied; from then on the two step apart. The file
stores both in the engine's orientation [V, D] (lm_head.weight = the record's lm_head^T).

    python3 tests/optim/golden_adam_record89.py   # writes adam_cwd/every_other_step and adam_cwd/tied_untie
"""
import json
import math
import os
import random
import struct
import sys

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "golden",
                      "adam_cwd")
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
    every_other_step()
    tied_untie()


def every_other_step():
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
    write_safetensors(os.path.join(GOLDEN, "every_other_step.safetensors"), tensors, meta)


def transpose(flat, rows, cols):
    """The [cols, rows] transpose of a row-major [rows, cols] list."""
    return [flat[r * cols + c] for c in range(cols) for r in range(rows)]


def tied_untie():
    V, D, SPLIT, T = 13, 6, 5, 11  # the record's split step 5 (odd): the file's untie_step 6
    cfg = {"betas": [0.5, 0.95], "lr_mul": 1.0, "wd_mul": 150.0}
    scalars_cfg = PARAMS["scalars"][1]
    rng = random.Random(8903)
    head = [rng.gauss(0.0, 0.5) for _ in range(D * V)]  # the record's lm_head [D, V]
    embed = transpose(head, D, V)                        # embed.weight.copy_(lm_head.weight.T)
    scalars = [rng.gauss(0.0, 0.5) for _ in range(7)]
    state = {n: {"m": [0.0] * k, "v": [0.0] * k, "t": 0}
             for n, k in (("head", D * V), ("embed", V * D), ("scalars", 7))}
    grad = {"head": [0.0] * (D * V), "embed": [0.0] * (V * D), "scalars": [0.0] * 7}
    split = False
    tensors = {"init/embed.weight": ([V, D], list(embed)),
               "init/lm_head.weight": ([V, D], transpose(head, D, V)),
               "init/scalars": ([7], list(scalars))}

    def adam(name, w, cfg_):
        st = state[name]
        st["t"] += 1
        adam_update(w, grad[name], st["m"], st["v"], st["t"], cfg_)
        grad[name] = [0.0] * len(w)

    for step in range(T):
        t = step + 1
        g_embed = [rng.gauss(0.0, 1e-2) for _ in range(V * D)]
        g_head = [rng.gauss(0.0, 1e-2) for _ in range(V * D)]  # the engine's [V, D]
        g_scalars = [rng.gauss(0.0, 1e-2) for _ in range(7)]
        tensors[f"grad/{t}/embed.weight"] = ([V, D], g_embed)
        tensors[f"grad/{t}/lm_head.weight"] = ([V, D], g_head)
        tensors[f"grad/{t}/scalars"] = ([7], g_scalars)
        # backward adds into .grad (the head's in its [D, V] storage)
        grad["embed"] = [a + b for a, b in zip(grad["embed"], g_embed)]
        grad["head"] = [a + b for a, b in zip(grad["head"], transpose(g_head, V, D))]
        grad["scalars"] = [a + b for a, b in zip(grad["scalars"], g_scalars)]
        if step % 2 == 1:  # do_adam
            adam("scalars", scalars, scalars_cfg)
            if not split:
                grad["head"] = [a + b for a, b in zip(grad["head"], transpose(grad["embed"], V, D))]
                adam("head", head, cfg)
                grad["embed"] = [0.0] * (V * D)
                embed[:] = transpose(head, D, V)  # transpose_copy(lm_head, embed)
            else:
                adam("head", head, cfg)
                adam("embed", embed, cfg)
        if step == SPLIT:  # copy_lm_state_to_embed
            state["embed"]["t"] = state["head"]["t"]
            state["embed"]["m"] = transpose(state["head"]["m"], D, V)
            state["embed"]["v"] = transpose(state["head"]["v"], D, V)
            split = True
        tensors[f"param/{t}/embed.weight"] = ([V, D], list(embed))
        tensors[f"param/{t}/lm_head.weight"] = ([V, D], transpose(head, D, V))
        tensors[f"param/{t}/scalars"] = ([7], list(scalars))

    hyper = {
        "lr": LR, "eps": EPS, "weight_decay": WEIGHT_DECAY, "betas": [0.9, 0.99],
        "update_every": 2,
        "param_overrides": {
            "embed.weight": dict(cfg, tied_to="lm_head.weight", untie_step=SPLIT + 1),
            "lm_head.weight": cfg, "scalars": scalars_cfg},
        "tie_rule": "embed tied to lm_head through the record's split step 5 (the file's 6): "
                    "embed's gradient added into the head's, embed = head after each update, "
                    "the head's Adam state carried into embed's after the split step's update",
    }
    meta = {
        "optimizer": "adam_cwd",
        "steps": str(T),
        "hyperparameters": json.dumps(hyper),
        "reference": "KellerJordan/modded-nanogpt@f411b3d346aa52d3504324ca93c230fd84c6c07f "
                     "train_gpt.py (NorMuonAndAdam.step, copy_lm_state_to_embed, record 89); "
                     "tests/optim/golden_adam_record89.py, float64, standard library only",
        "notes": "Record #89's tied embedding and head, untied at its split step with the head's "
                 "Adam state carried over, Adam every other step. Float64, stored rounded to "
                 "float32; both tensors in the engine's [V, D].",
        "suggested_atol": "1e-06",
    }
    write_safetensors(os.path.join(GOLDEN, "tied_untie.safetensors"), tensors, meta)


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
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
