#!/usr/bin/python3
"""Record attempts: runs an engine config with several seeds and summarises them.

usage: speedrun.sh CONFIG [--seeds N] [--np N] [--threads T] [--name NAME] [--target LOSS]
                   [--set key=value ...] [--records DIR] [--engine PATH] [--json]
       speedrun.sh --rescore RECORD_DIR --target LOSS

Seed i of N trains CONFIG with train.seed = (the config's seed) + i, which changes both the
initialisation and, with data.shuffle, the data order. Each run's console log (log.txt.xz),
metrics (metrics.jsonl.xz, thinned to what a summary reads and the step's phase times) and
effective config (config.yaml) are kept under RECORDS/<date>_<NAME>/seed<S>/, next to a copy of
CONFIG as recipe.yaml. The summary
(summary.md, summary.json, printed) gives per seed the train time to the target (the first
validation at or below it; train time excludes validation and the untimed warm-up) and the final
validation loss; then their mean and standard deviation, and a one-sided t-test of the final val
losses against the target (H0: mean >= target; a record needs p < 0.01). A stop-at-target config
(train.target_val_loss) is read for its times; a fixed-steps one for its final losses and p.
The target is train.target_val_loss unless --target gives one. --rescore summarises the seeds
of an existing record folder against another target without training (the time to a target is
read from the metrics, so a run that went on past it scores the same as one that stopped there).
"""
import argparse
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_sided_p(values, target):
    """p of H0 'mean >= target' against 'mean < target' (Student t, n - 1 degrees of freedom)."""
    n = len(values)
    if n < 2:
        return None
    sd = statistics.stdev(values)
    mean = statistics.fmean(values)
    if sd == 0:
        return 0.0 if mean < target else 1.0
    from scipy.stats import t as student_t
    return float(student_t.cdf((mean - target) / (sd / math.sqrt(n)), df=n - 1))


def summarise(runs, target):
    """Mean, spread and p-value over the runs' dicts (seed, time_to_target_ms, final_val_loss)."""
    finals = [r["final_val_loss"] for r in runs if r["final_val_loss"] is not None]
    times = [r["time_to_target_ms"] for r in runs if r["time_to_target_ms"] is not None]
    s = {"target": target, "seeds": len(runs), "reached": len(times)}
    if finals:
        s["final_val_mean"] = statistics.fmean(finals)
        s["final_val_std"] = statistics.stdev(finals) if len(finals) > 1 else 0.0
        s["p_value"] = one_sided_p(finals, target)
    if times:
        s["time_to_target_mean_s"] = statistics.fmean(times) / 1e3
        s["time_to_target_std_s"] = statistics.stdev(times) / 1e3 if len(times) > 1 else 0.0
    return s


def run_summary(run_dir, seed, target):
    rows = runlog.read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    banner = runlog.read_banner(os.path.join(run_dir, "log.txt"))
    hit = runlog.time_to_target(rows, target)
    return {"seed": seed, "steps": rows[-1]["step"] if rows else 0,
            "train_time_ms": rows[-1].get("elapsed_ms", 0.0) if rows else 0.0,
            "target_step": hit[0] if hit else None,
            "time_to_target_ms": hit[1] if hit else None,
            "final_val_loss": runlog.final_val_loss(rows),
            "world": banner["world"], "threads": banner["threads"]}


# What a committed record's metrics keep of each row (a row with a val_loss keeps it too): the
# summary's and --rescore's fields, the build, and where the step's time went.
RECORD_KEYS = ("step", "train_loss", "val_loss", "lr", "grad_norm", "elapsed_ms", "step_ms",
               "tokens_per_s", "phase_ms", "engine", "commit")


def keep_compact(run_dir):
    """A seed's log.txt and metrics.jsonl as the record keeps them: xz-compressed, the metrics
    thinned to RECORD_KEYS (runlog reads either form)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = [{k: v for k, v in r.items() if k in RECORD_KEYS} for r in runlog.read_metrics(path)]
    runlog.compress(path, rows)
    runlog.compress(os.path.join(run_dir, "log.txt"))


def repo_path(path):
    """`path` relative to the repository when it lies inside it, else absolute."""
    rel = os.path.relpath(os.path.abspath(path), REPO)
    return os.path.abspath(path) if rel.startswith("..") else rel


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(name, command, runs, s):
    lines = ["# %s" % name, "", "`%s`" % command, "",
             "| seed | steps | time to target (s) | target step | final val loss |",
             "| --- | --- | --- | --- | --- |"]
    for r in runs:
        t = r["time_to_target_ms"]
        lines.append("| %d | %d | %s | %s | %s |" % (
            r["seed"], r["steps"], fmt(None if t is None else t / 1e3, ".1f"),
            fmt(r["target_step"], "d"), fmt(r["final_val_loss"], ".4f")))
    lines += ["", "target val loss %.4f: reached by %d of %d seeds" %
              (s["target"], s["reached"], s["seeds"])]
    if "time_to_target_mean_s" in s:
        lines.append("time to target: %.1f +- %.1f s (mean +- std)" %
                     (s["time_to_target_mean_s"], s["time_to_target_std_s"]))
    if "final_val_mean" in s:
        lines.append("final val loss: %.4f +- %.4f; one-sided t-test against the target: p = %s" %
                     (s["final_val_mean"], s["final_val_std"], fmt(s.get("p_value"), ".2g")))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 usage=__doc__.splitlines()[2].strip()[7:])
    ap.add_argument("config", nargs="?")
    ap.add_argument("--rescore", metavar="RECORD_DIR")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0,
                    help="OpenMP threads per rank (default: cores / np, at least 1)")
    ap.add_argument("--name", default="", help="record name (default: the config's file name)")
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--records", default=os.path.join(REPO, "records"))
    ap.add_argument("--engine", default=os.path.join(REPO, "build/apps/engine/engine"))
    ap.add_argument("--json", action="store_true", help="one JSON object per seed, then the summary")
    a = ap.parse_args()
    if a.seeds < 1 or a.np < 1:
        ap.error("--seeds and --np must be positive")
    for s in a.sets:
        if "=" not in s:
            ap.error("--set %r: expected KEY=VALUE" % s)
    if a.rescore:
        if a.target is None:
            ap.error("--rescore needs --target")
        return rescore(a.rescore, a.target, a.json)
    if not a.config:
        ap.error("CONFIG is required (or --rescore RECORD_DIR)")
    try:
        with open(a.config) as f:
            recipe = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        sys.exit("speedrun: %s: cannot read the config (%s)" % (a.config, e))
    train = recipe.get("train", {}) or {}
    target = a.target if a.target is not None else train.get("target_val_loss")
    for s in a.sets:
        key, value = s.split("=", 1)
        if key == "train.target_val_loss" and a.target is None:
            target = float(value)
    if not target or target <= 0:
        sys.exit("speedrun: %s: no target: set train.target_val_loss or pass --target" % a.config)
    if not os.access(a.engine, os.X_OK):
        sys.exit("speedrun: no engine at %s (build it, or pass --engine)" % a.engine)
    base_seed = int(train.get("seed", 1337))
    name = a.name or os.path.splitext(os.path.basename(a.config))[0]
    out = os.path.join(a.records, "%s_%s" % (datetime.date.today().isoformat(), name))
    if os.path.exists(out):
        sys.exit("speedrun: %s exists; pass another --name (nothing was overwritten)" % out)
    os.makedirs(out)
    shutil.copyfile(a.config, os.path.join(out, "recipe.yaml"))
    threads = a.threads or max(1, (os.cpu_count() or 1) // a.np)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = "scripts/speedrun.sh %s --seeds %d --np %d%s%s%s" % (
        repo_path(os.path.join(out, "recipe.yaml")), a.seeds, a.np,
        " --threads %d" % a.threads if a.threads else "",
        " --target %g" % a.target if a.target is not None else "",
        "".join(" --set " + s for s in a.sets))
    runs = []
    for i in range(a.seeds):
        seed = base_seed + i
        run_dir = os.path.join(out, "seed%d" % seed)
        scratch = os.path.join(out, ".checkpoints")
        # Several threads per rank need as many cores (Open MPI binds a rank to one at np <= 2).
        cmd = ["mpirun", "--oversubscribe"] + (["--bind-to", "none"] if threads > 1 else []) + \
            ["-np", str(a.np), a.engine, "--config", a.config]
        for s in a.sets + ["train.seed=%d" % seed, "log.dir=" + run_dir,
                           "checkpoint.dir=" + scratch, "checkpoint.every=0",
                           "checkpoint.at_end=false", "checkpoint.overwrite=true"]:
            cmd += ["--set", s]
        print("speedrun: seed %d (%d of %d): %s" % (seed, i + 1, a.seeds, " ".join(cmd)),
              flush=True)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if p.returncode != 0:
            sys.exit("speedrun: seed %d failed (exit %d); its output ends:\n%s" %
                     (seed, p.returncode, p.stdout[-3000:]))
        try:
            r = run_summary(run_dir, seed, target)
            keep_compact(run_dir)
        except runlog.RunLogError as e:
            sys.exit("speedrun: seed %d: %s" % (seed, e))
        runs.append(r)
        if a.json:
            print(json.dumps(r), flush=True)
        else:
            t = r["time_to_target_ms"]
            print("speedrun: seed %d: final val %s, target %s" % (
                seed, fmt(r["final_val_loss"], ".4f"),
                "reached at step %d, %.1f s" % (r["target_step"], t / 1e3) if t is not None
                else "not reached"), flush=True)
    write_summary(out, runs, target, {"name": name, "command": command, "np": a.np,
                                      "threads": threads}, a.json)
    return 0


def write_summary(out, runs, target, about, as_json):
    s = summarise(runs, target)
    s.update(about)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"summary": s, "runs": runs}, f, indent=1)
    text = markdown(s["name"], s["command"], runs, s)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(json.dumps(s) if as_json else text, end="" if not as_json else "\n", flush=True)
    print("speedrun: logs and summary in %s" % out, file=sys.stderr)


def rescore(out, target, as_json):
    """The summary of the record folder `out` against `target`, from its seeds' metrics."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            about = json.load(f)["summary"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("speedrun: %s: no readable summary.json (%s)" % (out, e))
    seeds = sorted(int(d[4:]) for d in os.listdir(out) if d.startswith("seed") and d[4:].isdigit())
    if not seeds:
        sys.exit("speedrun: %s holds no seed folders" % out)
    try:
        runs = [run_summary(os.path.join(out, "seed%d" % s), s, target) for s in seeds]
    except runlog.RunLogError as e:
        sys.exit("speedrun: %s" % e)
    about_command = about["command"]
    about = {k: about[k] for k in ("name", "np", "threads")}
    about["command"] = re.sub(r" --target \S+", "", about_command) + " --target %g" % target
    write_summary(out, runs, target, about, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
