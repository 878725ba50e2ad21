#!/usr/bin/python3
"""Draws a run's trace (log.trace's <log.dir>/trace.json, Chrome trace events) as a timeline PNG.

usage: plot_trace.py TRACE.json OUT.png [--step N] [--title TEXT]

One row per thread row of the trace, grouped by rank (the main thread, the communication
thread, collectives in flight, the device); a span is a bar, nested spans are drawn inside their
parent, one band per nesting depth; the lanes of collectives in flight at once ("main in flight
0", "... 1", ...) share one row, each lane a band of it; colours by category (step, phase, micro-step,
forward/backward pass, layer, collective, wait, evaluation, checkpoint, device). --step N draws
only the time of traced step N (from its start on the earliest rank to its end on the latest).
Prints the rows it drew.
"""
import argparse
import json
import re

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
    # A row per (rank, thread row name), lanes "<name> k" of one in-flight row merged.
    lanes = {}
    for s in spans:
        name = names.get((s["pid"], s["tid"]), "thread %d" % s["tid"])
        m = re.fullmatch(r"(.* in flight) (\d+)", name)
        s["row"] = (s["pid"], s["tid"] if not m else -1, m.group(1) if m else name)
        s["lane"] = int(m.group(2)) if m else 0
        lanes[s["row"]] = max(lanes.get(s["row"], 0), s["lane"] + 1)
    rows = sorted(lanes, key=lambda r: (r[0], r[1] if r[1] >= 0 else 10 ** 9, r[2]))
    # Each row is a stack of bands, top down: the nesting levels of a thread's spans (a parent
    # above its children), or the lanes of an in-flight row.
    for row in rows:
        row_spans = [s for s in spans if s["row"] == row]
        if lanes[row] > 1:
            for s in row_spans:
                s["band"] = s["lane"]
        else:
            for s, d in zip(row_spans, depths(row_spans)):
                s["band"] = d
    bands = {row: 1 + max(s["band"] for s in spans if s["row"] == row) for row in rows}
    # A band's height; the lanes of an in-flight row share at most 4 bands' height.
    band_h = 0.32
    height = {row: band_h * (bands[row] if lanes[row] == 1 else min(bands[row], 4)) for row in rows}
    tops, y = {}, 0.0
    for row in rows:
        tops[row] = y
        y += height[row] + 0.35
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.75 * y))
    for s in spans:
        begin, end = max(s["begin"], lo) - lo, min(s["end"], hi) - lo
        h = height[s["row"]] / bands[s["row"]]
        centre = tops[s["row"]] + h * (s["band"] + 0.5)
        ax.barh(centre, end - begin, left=begin, height=h * 0.9,
                color=COLOURS.get(s["cat"], "#bbbbbb"), edgecolor="black", linewidth=0.15)
        if end - begin > (hi - lo) / 18 and h >= band_h:
            ax.text(begin + (end - begin) / 2, centre, s["name"], ha="center", va="center",
                    fontsize=5.5, clip_on=True)
    labels = ["rank %d: %s" % (pid, name) for pid, _, name in rows]
    ax.set_yticks([tops[r] + height[r] / 2 for r in rows])
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(y, -0.2)
    ax.set_xlim(0, hi - lo)
    ax.set_xlabel("ms from the start" + (" of step %d" % args.step if args.step else ""))
    used = sorted({s["cat"] for s in spans})
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#bbbbbb"), label=c) for c in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.1),
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
