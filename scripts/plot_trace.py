#!/usr/bin/python3
"""Draws a run's trace (log.trace's <log.dir>/trace.json, Chrome trace events) as a timeline PNG.

usage: plot_trace.py TRACE.json OUT.png [--step N] [--title TEXT]

One row per thread row of the trace, grouped by rank (the main thread, the communication
thread, collectives in flight, the device); a span is a bar, nested spans are drawn inside their
parent, thinner, one level per nesting depth; colours by category (step, phase, micro-step,
forward/backward pass, layer, collective, wait, evaluation, checkpoint, device). --step N draws
only the time of traced step N (from its start on the earliest rank to its end on the latest).
Prints the rows it drew.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {
    "step": "#d9d9d9", "phase": "#9ecae1", "micro-step": "#c6dbef", "pass": "#fdd0a2",
    "layer": "#fd8d3c", "comm": "#31a354", "wait": "#de2d26", "evaluate": "#9e9ac8",
    "checkpoint": "#756bb1", "device": "#6baed6",
}


def load(path):
    """(spans, row names): spans as dicts with pid, tid, name, cat, begin, end in ms."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names, spans = {}, []
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "X":
            spans.append({"pid": e["pid"], "tid": e["tid"], "name": e["name"],
                          "cat": e.get("cat", ""), "begin": e["ts"] / 1e3,
                          "end": (e["ts"] + e["dur"]) / 1e3})
    return spans, names


def depths(spans):
    """Each span's nesting depth within its row (spans sorted by begin, parents first)."""
    stack, out = [], []
    for s in spans:
        while stack and stack[-1] <= s["begin"]:
            stack.pop()
        out.append(len(stack))
        stack.append(s["end"])
    return out


def step_window(spans, step):
    own = [s for s in spans if s["cat"] == "step" and s["name"] == "step %d" % step]
    if not own:
        raise SystemExit("plot_trace: no span 'step %d' in the trace" % step)
    return min(s["begin"] for s in own), max(s["end"] for s in own)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--step", type=int)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    spans, names = load(args.trace)
    if not spans:
        raise SystemExit("plot_trace: %s holds no spans" % args.trace)
    lo, hi = (step_window(spans, args.step) if args.step is not None
              else (min(s["begin"] for s in spans), max(s["end"] for s in spans)))
    spans = [s for s in spans if s["end"] >= lo and s["begin"] <= hi]
    spans.sort(key=lambda s: (s["pid"], s["tid"], s["begin"], -s["end"]))
    rows = sorted({(s["pid"], s["tid"]) for s in spans})
    by_row = {r: [s for s in spans if (s["pid"], s["tid"]) == r] for r in rows}
    fig, ax = plt.subplots(figsize=(14, 0.9 + 0.55 * len(rows)))
    for y, row in enumerate(rows):
        row_spans = by_row[row]
        for s, d in zip(row_spans, depths(row_spans)):
            height = 0.8 * (0.8 ** d)
            begin, end = max(s["begin"], lo) - lo, min(s["end"], hi) - lo
            ax.barh(y, end - begin, left=begin, height=height,
                    color=COLOURS.get(s["cat"], "#bbbbbb"), edgecolor="black", linewidth=0.2)
            if end - begin > (hi - lo) / 25 and d <= 2:
                ax.text(begin + (end - begin) / 2, y - height / 2 + 0.02, s["name"],
                        ha="center", va="bottom", fontsize=6, clip_on=True)
    labels = ["rank %d: %s" % (pid, names.get((pid, tid), "thread %d" % tid)) for pid, tid in rows]
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, hi - lo)
    ax.set_xlabel("ms from the start" + (" of step %d" % args.step if args.step else ""))
    used = sorted({s["cat"] for s in spans})
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#bbbbbb"), label=c) for c in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(rows) > 4 else -0.25),
              ncol=min(len(used), 10), fontsize=7, frameon=False)
    if args.title:
        ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print("plot_trace: %d rows, %d spans, %.1f ms -> %s" % (len(rows), len(spans), hi - lo,
                                                           args.out))
    for label in labels:
        print("  " + label)


if __name__ == "__main__":
    main()
