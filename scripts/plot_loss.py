#!/usr/bin/python3
"""Draws loss curves from engine metrics files (JSON Lines) to a PNG.

usage: plot_loss.py OUT.png METRICS.jsonl[:LABEL] [METRICS.jsonl[:LABEL] ...]
                    [--smooth A] [--lr] [--no-time] [--title TEXT]

Two panels side by side: loss against steps and against train time (seconds, or minutes for
runs longer than 10 minutes; validation and checkpointing are not train time). One colour per
run, named in the legend; the training loss is a thin line (with --smooth A, an exponential
moving average with weight A on the past, the raw curve faint behind it) and the validation
losses are marked points on a line of the same colour. --lr adds a panel of the learning rate
against steps. --no-time leaves the train-time panel out (runs timed on a machine shared with
other jobs, whose times say nothing about the runs).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402


def time_unit(max_ms):
    """(divisor of milliseconds, axis label) for a run whose train time reaches max_ms."""
    if max_ms > 10 * 60 * 1000:
        return 60000.0, "train time (min)"
    return 1000.0, "train time (s)"


def ema(values, weight):
    """Exponential moving average, bias-corrected so the first points are not pulled to 0."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** i))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("runs", nargs="+", help="METRICS.jsonl[:LABEL]")
    p.add_argument("--smooth", type=float, default=0.0,
                   help="EMA weight on the past for the train curve, in [0, 1) (default 0: raw)")
    p.add_argument("--lr", action="store_true", help="add a learning-rate panel")
    p.add_argument("--no-time", action="store_true", help="leave out the train-time panel")
    p.add_argument("--title", default="")
    a = p.parse_args()
    # The plot usually goes into a run's log folder: never through a link planted there (it was
    # followed, and the file it named replaced).
    if os.path.islink(a.out):
        sys.exit("plot_loss: %s is a symbolic link (to %s): refusing to write through it; remove "
                 "the link or choose another output" % (a.out, os.readlink(a.out)))
    if not 0 <= a.smooth < 1:
        p.error("--smooth must be in [0, 1)")

    runs = []
    for run in a.runs:
        path, _, name = run.partition(":")
        try:
            rows = runlog.read_metrics(path)
        except runlog.RunLogError as e:
            p.error(str(e))
        if not rows:
            p.error("%s holds no metrics" % path)
        runs.append((name or path, rows))
    max_ms = max(r.get("elapsed_ms", 0) for _, rows in runs for r in rows)
    divisor, time_label = time_unit(max_ms)

    panels = 1 + (0 if a.no_time else 1) + (1 if a.lr else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.5), squeeze=False)
    axes = list(axes[0])
    by_step = axes.pop(0)
    by_time = None if a.no_time else axes.pop(0)
    lr_axis = axes.pop(0) if a.lr else None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, rows) in enumerate(runs):
        color = colors[i % len(colors)]
        train = runlog.with_key(rows, "train_loss")
        val = runlog.with_key(rows, "val_loss")
        for ax, x in ((by_step, lambda r: r["step"]),
                      (by_time, lambda r: r.get("elapsed_ms", 0) / divisor)):
            if ax is None:
                continue
            if train:
                xs = [x(r) for r in train]
                ys = [r["train_loss"] for r in train]
                if a.smooth > 0:
                    ax.plot(xs, ys, lw=0.8, color=color, alpha=0.25)
                    ys = ema(ys, a.smooth)
                ax.plot(xs, ys, lw=1.2, color=color, label=name + " train")
            if val:
                ax.plot([x(r) for r in val], [r["val_loss"] for r in val], "o--", ms=4, lw=0.8,
                        color=color, label=name + " val")
        lr = [r for r in train if "lr" in r]
        if lr_axis and lr:
            lr_axis.plot([r["step"] for r in lr], [r["lr"] for r in lr], color=color, label=name)
    by_step.set_xlabel("step")
    if by_time:
        by_time.set_xlabel(time_label)
    for ax in (by_step, by_time):
        if ax:
            ax.set_ylabel("cross-entropy (nats)")
            ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    if lr_axis:
        lr_axis.set_xlabel("step")
        lr_axis.set_ylabel("learning rate (first group)")
        lr_axis.grid(alpha=0.3)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    # Written beside it and renamed over it: a link planted meanwhile is replaced, not followed.
    tmp = "%s.tmp.%d" % (a.out, os.getpid())
    fig.savefig(tmp, dpi=110, format=os.path.splitext(a.out)[1][1:] or "png")
    os.replace(tmp, a.out)
    if by_time:
        print("wrote %s (%d runs, time axis in %s)" % (a.out, len(runs),
                                                      time_label.split("(")[1][:-1]))
    else:
        print("wrote %s (%d runs, no time axis)" % (a.out, len(runs)))


if __name__ == "__main__":
    main()
