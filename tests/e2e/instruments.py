#!/usr/bin/env python3
"""The run's instruments end to end (tests/e2e/e2e.py's harness): log.trace's timeline of an np 2
run and log.tensorboard's event file read back by an independent decoder.

usage: instruments.py --engine PATH --repo DIR --work DIR CASE
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402
from e2e import Failure, check, metrics  # noqa: E402

PHASES = ("forward_backward", "reduce_grads", "clip", "optimizer", "gather_params")
# Chrome's ts and dur are printed to 1 ns; a child's end may exceed its parent's by their rounding.
EPS_US = 0.002


def load_trace(run_dir):
    with open(os.path.join(run_dir, "trace.json")) as f:
        trace = json.load(f)
    rows, spans = {}, []
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            rows[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "X":
            spans.append(dict(e, end=e["ts"] + e["dur"]))
    for s in spans:
        s["row"] = rows.get((s["pid"], s["tid"]), "?")
    return spans


def check_nesting(spans):
    """On each thread row a span lies inside the spans it overlaps or around them."""
    by_row = {}
    for s in spans:
        by_row.setdefault((s["pid"], s["tid"]), []).append(s)
    for row, items in by_row.items():
        items.sort(key=lambda s: (s["ts"], -s["end"]))
        stack = []
        for s in items:
            while stack and stack[-1]["end"] <= s["ts"] + EPS_US:
                stack.pop()
            if stack:
                parent = stack[-1]
                check(s["end"] <= parent["end"] + EPS_US,
                      "rank %d row %s: %s [%.3f, %.3f] crosses the end of %s [%.3f, %.3f]" %
                      (row[0], s["row"], s["name"], s["ts"], s["end"], parent["name"],
                       parent["ts"], parent["end"]))
            stack.append(s)


def inside(s, outer):
    return s["pid"] == outer["pid"] and outer["ts"] - EPS_US <= s["ts"] and \
        s["end"] <= outer["end"] + EPS_US


def check_steps(spans, steps, ranks, layers, micro_steps):
    """Every phase, micro-step and layer of every traced step on every rank, inside its step."""
    for rank in ranks:
        for step in steps:
            own = [s for s in spans if s["pid"] == rank and s["name"] == "step %d" % step]
            check(len(own) == 1 and own[0]["row"] == "main",
                  "rank %d: %d spans 'step %d'" % (rank, len(own), step))
            in_step = [s for s in spans if inside(s, own[0])]
            names = [s["name"] for s in in_step if s["row"] == "main"]
            for phase in PHASES:
                check(names.count(phase) == 1, "rank %d step %d: phase %s %d times" %
                      (rank, step, phase, names.count(phase)))
            for m in range(micro_steps):
                check(names.count("micro-step %d" % m) == 1,
                      "rank %d step %d: no micro-step %d" % (rank, step, m))
            for layer in ["embeddings", "head"] + ["block %d" % l for l in range(layers)]:
                for pass_ in ("forward", "backward"):
                    n = names.count("%s %s" % (pass_, layer))
                    check(n == micro_steps, "rank %d step %d: %s %s %d times, expected %d" %
                          (rank, step, pass_, layer, n, micro_steps))
    for s in spans:
        check(s["dur"] >= 0, "negative duration: %s" % s)


def reductions_during_backward(spans, rank, step, names):
    """The reductions (spans named in `names`) of `step` on `rank` that start before its
    forward_backward phase ends, i.e. while the backward still computes."""
    own = [s for s in spans if s["pid"] == rank and s["name"] == "step %d" % step][0]
    fb = [s for s in spans if s["pid"] == rank and s["name"] == "forward_backward" and
          inside(s, own)][0]
    return [s for s in spans if s["pid"] == rank and s["name"] in names and
            fb["ts"] <= s["ts"] < fb["end"] - EPS_US and s["row"] != "main"]


def case_trace(env):
    """log.trace at np 2: trace.json parses, holds every phase, micro-step and layer of each traced
    step on both ranks, nests on every thread row, holds the checkpoint write and evaluation of a
    traced step, and shows the ZeRO reduction overlapping the backward exactly where the config
    overlaps it (stage 1 polled, stage 2 on the communication thread; not with overlap off), and at
    stage 3 the layers' parameter gathers inside the layers' spans; plot_trace.py draws it."""
    sets = ["train.steps=4", "log.trace=2-3", "checkpoint.every=3", "train.eval_every=3"]
    runs = {
        "poll": ["zero.stage=1", "zero.overlap=true", "zero.progress=poll"],
        "thread": ["zero.stage=2", "zero.overlap=true", "zero.progress=thread"],
        "off": ["zero.stage=1", "zero.overlap=false", "zero.progress=poll"],
        "stage3": ["zero.stage=3", "zero.overlap=true", "zero.progress=thread"],
    }
    traces = {}
    for name, zero in runs.items():
        p, d = env.run(2, name, sets + zero)
        line = re.search(r"trace of steps 2-3 written to \S+ \((\d+) spans of 2 ranks\)", p.stdout)
        check(line, "no trace line:\n" + p.stdout[-2000:])
        spans = load_trace(d)
        check(int(line.group(1)) == len(spans), "%s: the log says %s spans, the file holds %d" %
              (name, line.group(1), len(spans)))
        traces[name] = spans
        check({s["pid"] for s in spans} == {0, 1}, "%s: ranks %s" % (name, {s["pid"] for s in spans}))
        check(not [s for s in spans if s["name"] in ("step 1", "step 4")],
              "%s: spans of untraced steps" % name)
        # np 2 of the tiny config's 16 rows of 4: two micro-steps per rank.
        check_steps(spans, (2, 3), (0, 1), layers=2, micro_steps=2)
        check_nesting(spans)
        for rank in (0, 1):
            for what in ("checkpoint write", "evaluate"):
                n = len([s for s in spans if s["pid"] == rank and s["name"] == what])
                check(n == 1, "%s rank %d: %d spans '%s'" % (name, rank, n, what))
    # Overlap: a bucket's collective in flight (poll) or a layer's reduction on the communication
    # thread starts inside the forward_backward phase, while later layers' backward run.
    for rank in (0, 1):
        for step in (2, 3):
            early = reductions_during_backward(traces["poll"], rank, step, ("all_reduce",))
            check(early and all(s["row"].startswith("main in flight") for s in early),
                  "poll rank %d step %d: no all_reduce in flight during the backward" %
                  (rank, step))
            # Stage 2 on the thread: each layer's reduction is issued after its backward, in
            # flight (queued, then run on the thread) while the layers below compute. When the
            # thread runs it depends on the scheduler (on a loaded machine it may wake late).
            layers = ["reduce layer %d" % l for l in range(-1, 3)]
            early = [s for s in reductions_during_backward(traces["thread"], rank, step, layers)
                     if s["row"].startswith("main in flight")]
            check(early,
                  "thread rank %d step %d: no reduction issued during the backward" % (rank, step))
            backward = [s for s in traces["thread"] if s["pid"] == rank and
                        s["name"].startswith("backward block") and s["row"] == "main"]
            check(any(r["ts"] < b["end"] and b["ts"] < r["end"] for r in early for b in backward),
                  "thread rank %d step %d: no reduction in flight overlaps a layer's backward" %
                  (rank, step))
            ran = [s for s in traces["thread"] if s["pid"] == rank and s["row"] == "comm thread" and
                   s["name"] in layers]
            check(len(ran) == 2 * len(layers), "thread rank %d: %d reductions ran on the comm "
                  "thread, expected %d" % (rank, len(ran), 2 * len(layers)))
            late = reductions_during_backward(traces["off"], rank, step,
                                              ("all_reduce", "reduce_scatter"))
            check(not late, "overlap off, rank %d step %d: reductions during the backward: %s" %
                  (rank, step, [(s["name"], s["row"]) for s in late]))
    # Stage 3: each layer's parameters are gathered (in flight from the main thread, then waited
    # for) inside the layer's forward and backward spans; the reductions run on the thread.
    for rank in (0, 1):
        spans = [s for s in traces["stage3"] if s["pid"] == rank]
        layers = [s for s in spans if s["cat"] == "layer"]
        gathers = [s for s in spans if s["name"] == "all_gather" and
                   s["row"].startswith("main in flight")]
        waits = [s for s in spans if s["name"] == "wait all_gather" and s["row"] == "main"]
        check(gathers and waits and all(any(inside(w, l) for l in layers) for w in waits),
              "stage 3 rank %d: %d gathers in flight, %d waits, not all inside a layer's span" %
              (rank, len(gathers), len(waits)))
        ran = [s for s in spans if s["row"] == "comm thread" and s["name"].startswith("reduce layer")]
        check(len(ran) == 2 * 2 * 4, "stage 3 rank %d: %d reductions on the comm thread, expected "
              "16 (2 steps x 2 micro-steps x 4 layers)" % (rank, len(ran)))
    png = os.path.join(env.work, "trace.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(env.repo, "scripts/plot_trace.py"),
                        os.path.join(env.work, "thread", "trace.json"), png, "--step", "3"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode == 0 and "rank 1: comm thread" in p.stdout, "plot_trace: " + p.stdout)
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", "plot_trace did not write a PNG")
    print("trace: 4 runs, %d spans (poll), phases/micro-steps/layers of steps 2-3 on both ranks, "
          "nested; overlap seen with it on, none with it off; PNG drawn" % len(traces["poll"]))


def decode(path):
    p = subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(__file__),
                                                         "tfevents_reader.py"), path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines()], p.stderr


def f32(v):
    import struct
    return struct.unpack("<f", struct.pack("<f", v))[0]


def case_tensorboard(env):
    """log.tensorboard at np 2: one events.out.tfevents.* in the run folder, read back by an
    independent decoder (python3-protobuf with the messages declared in the test, its own CRC-32C),
    holds every metrics.jsonl value the console shows (each equal to the record's value rounded
    to float32), and a flipped byte fails the decoder's CRC check."""
    _, d = env.run(2, "run", ["train.steps=6", "train.eval_every=3", "log.tensorboard=true",
                              "log.peak_gflops=50"])
    files = [f for f in os.listdir(d) if f.startswith("events.out.tfevents.")]
    check(len(files) == 1, "event files in %s: %s" % (d, os.listdir(d)))
    path = os.path.join(d, files[0])
    rc, events, err = decode(path)
    check(rc == 0, "decoder: " + err)
    check(events[0].get("file_version") == "brain.Event:2", "first event: %s" % events[0])
    by_step = {}
    for e in events[1:]:
        check("scalars" in e and e["step"] not in by_step, "event %s" % e)
        by_step[e["step"]] = e["scalars"]
    rows = metrics(d)
    check(sorted(by_step) == sorted(rows), "steps %s against metrics.jsonl's %s" %
          (sorted(by_step), sorted(rows)))
    mib = float(1 << 20)
    compared = 0
    for step, r in rows.items():
        expected = {}
        if "train_loss" in r:
            expected.update({
                "train/loss": r["train_loss"], "train/lr": r["lr"],
                "train/grad_norm": r["grad_norm"], "perf/tokens_per_s": r["tokens_per_s"],
                "perf/step_ms": r["step_ms"], "perf/mfu": r["mfu"],
                "mem/peak_mib": r["peak_mem_bytes"] / mib, "mem/live_mib": r["live_mem_bytes"] / mib,
                "comm/wait_ms": r["comm_wait_ms"]})
            for g, lr in enumerate(r["group_lr"]):
                expected["lr/group_%d" % g] = lr
            check(len(r["group_lr"]) == 3, "step %d: group_lr %s" % (step, r["group_lr"]))
        if "val_loss" in r:
            expected["val/loss"] = r["val_loss"]
        got = by_step[step]
        check(set(got) == set(expected), "step %d: tags %s, expected %s" %
              (step, sorted(got), sorted(expected)))
        for tag, v in expected.items():
            check(got[tag] == f32(v), "step %d %s: %r in the event file, %r (f32 %r) in "
                  "metrics.jsonl" % (step, tag, got[tag], v, f32(v)))
            compared += 1
    check(any("val/loss" in s for s in by_step.values()) and 0 in by_step, "no validation events")
    # A flipped byte in the last record's data: the decoder's CRC check must catch it.
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    blob[-6] ^= 0x01
    bad = os.path.join(env.work, "events.out.tfevents.bad")
    with open(bad, "wb") as f:
        f.write(blob)
    rc, _, err = decode(bad)
    check(rc == 1 and "CRC mismatch" in err, "a corrupted file decoded: rc %d %s" % (rc, err))
    print("tensorboard: %d events, %d values equal to metrics.jsonl's; a corrupted record refused"
          % (len(events), compared))


CASES = {
    "trace": case_trace,
    "tensorboard": case_tensorboard,
}

if __name__ == "__main__":
    sys.exit(e2e.main(CASES))
