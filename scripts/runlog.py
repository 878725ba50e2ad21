"""Reading what an engine run leaves in its log folder, for the scripts that compare runs.

metrics.jsonl holds one JSON object per logged step (train_loss, val_loss, elapsed_ms = train time
in ms, excluding validation and checkpoints, ...); log.txt holds the console lines. Shared by
loss_regression.py, plot_loss.py, speedrun.py and gpu_run.sh, so a run is parsed one way everywhere.
A committed record keeps them compressed (metrics.jsonl.xz, log.txt.xz): a file that is not there
is read from its .xz beside it.
"""
import json
import lzma
import os
import re
import statistics


class RunLogError(Exception):
    """A metrics or log file that cannot be read; the message names the file and line."""


def compress(path, rows=None):
    """Replaces the text file at path by path + ".xz" (what open_text reads back); with rows, a
    metrics file is written from those rows instead (a thinned copy). Returns the new path."""
    if rows is None:
        with open(path, errors="replace") as f:
            text = f.read()
    else:
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    tmp = path + ".xz.tmp"
    with lzma.open(tmp, "wt", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(text)
    os.replace(tmp, path + ".xz")
    os.remove(path)
    return path + ".xz"


def open_text(path):
    """The text file at path, or its compressed copy path + ".xz" when path is not there."""
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        return lzma.open(path + ".xz", "rt")
    return open(path)


def read_metrics(path):
    """The rows of a metrics.jsonl file in file order; every row must be JSON with a 'step'."""
    rows = []
    try:
        f = open_text(path)
    except OSError as e:
        raise RunLogError("%s: cannot read (%s)" % (path, e.strerror))
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunLogError("%s:%d: not JSON (%s)" % (path, n, e))
            if not isinstance(row, dict) or "step" not in row:
                raise RunLogError("%s:%d: no 'step' field" % (path, n))
            rows.append(row)
    return rows


def by_step(rows):
    """{step: row}; a step logged twice (a resumed run) keeps its last row."""
    return {r["step"]: r for r in rows}


def with_key(rows, key):
    """The rows that carry a value for `key` (val_loss rows, train_loss rows, ...)."""
    return [r for r in rows if r.get(key) is not None]


def time_to_target(rows, target):
    """(step, train time in ms) of the first validation at or below `target`, or None."""
    for r in with_key(rows, "val_loss"):
        if r["val_loss"] <= target:
            return r["step"], r.get("elapsed_ms", 0.0)
    return None


def final_val_loss(rows):
    """The last validation loss of the run, or None when it never validated."""
    val = with_key(rows, "val_loss")
    return val[-1]["val_loss"] if val else None


BUILD = re.compile(r"^engine \S+ \(commit \S+\)$")
BANNER = re.compile(r"world size (\d+) \| threads per rank (\d+) \| backend (.*)$")


def read_banner(path):
    """{'world': int, 'threads': int, 'backend': str, 'build': str} from log.txt's banner: its
    first line (or the second, after the `engine VERSION (commit C)` line builds since 2026-12-07
    print first; 'build' is that line, '' in an older log)."""
    try:
        with open_text(path) as f:
            lines = [f.readline().strip(), f.readline().strip()]
    except OSError as e:
        raise RunLogError("%s: cannot read (%s)" % (path, e.strerror))
    build = lines[0] if BUILD.match(lines[0]) else ""
    banner = lines[1] if build else lines[0]
    m = BANNER.search(banner)
    if not m:
        raise RunLogError("%s:%d: not an engine banner: %r" % (path, 2 if build else 1, banner[:120]))
    return {"world": int(m.group(1)), "threads": int(m.group(2)), "backend": m.group(3),
            "build": build}


def step_rows(path):
    """The train-step rows (a step time and a train loss) of a metrics.jsonl; [] without the file."""
    try:
        rows = read_metrics(path)
    except RunLogError:
        return []
    return [r for r in rows if "step_ms" in r and r.get("train_loss") is not None]


def steady_state(steps):
    """Past the warm-up (the first quarter of the step rows; a short run's all): the median step
    time in ms, each device phase's median in ms (log.device_timing; {} without), and the rows."""
    timed = steps[len(steps) // 4:] or steps
    phases = {k: round(statistics.median(r["device_phase_ms"].get(k, 0) for r in timed), 2)
              for k in timed[0].get("device_phase_ms", {})}
    return statistics.median(r["step_ms"] for r in timed), phases, timed
