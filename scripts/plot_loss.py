#!/usr/bin/python3
"""Draws loss curves from engine metrics files (JSON Lines) to a PNG.

usage: plot_loss.py OUT.png METRICS.jsonl[:LABEL] [METRICS.jsonl[:LABEL] ...]
                    [--x step|tokens|time] [--title TEXT]

Training loss is a thin line, validation loss markers of the same colour.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

X_KEYS = {"step": ("step", "step"), "tokens": ("tokens", "tokens"),
          "time": ("elapsed_ms", "train time (ms)")}


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("runs", nargs="+")
    p.add_argument("--x", choices=sorted(X_KEYS), default="step")
    p.add_argument("--title", default="loss")
    a = p.parse_args()
    key, label = X_KEYS[a.x]
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in a.runs:
        path, _, name = run.partition(":")
        rows = load(path)
        train = [(r[key], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
        val = [(r[key], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
        line = None
        if train:
            (line,) = ax.plot(*zip(*train), lw=1, label="%s train" % (name or path))
        if val:
            ax.plot(*zip(*val), "o-", ms=4, color=line.get_color() if line else None,
                    label="%s val" % (name or path))
    ax.set_xlabel(label)
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
