#!/usr/bin/python3
"""The optimizer race's step times, measured interleaved (issue 50): what a step of each family costs
beside the others on one machine state, and how far the machine drifts while they are measured.

usage: race_step_times.py [--config C.yaml] [--families adamw,muon,...] [--center FAMILY=LR,...]
                          [--rounds 3] [--steps 30] [--np 2] [--threads 1] [--set KEY=VALUE ...]
                          [--engine PATH] [--out DIR] [--json] [--table-only]

A race's "x AdamW (time)" is its step speedup times the ratio of the families' step times; its
runs were trained one after the other, so the ratio carries the throughput drift between them
(about 5% run to run on these machines). Here every family trains --steps steps (no validation,
no checkpoint; the groups and rates are optimizer_race.py's, --center as there) in each of
--rounds rounds, the order rotated each round (round r starts at family r), so each family is
measured early and late. A run's step time is its median over the steps past the first quarter.
Per family: the mean over rounds, the spread (standard deviation) and the drift (the largest
round over the smallest, minus 1); per family against AdamW: the ratio of their step times in
each round (the pair measured minutes apart), its mean and spread. Run it on a quiet machine.
Writes OUT/step_times.md and step_times.json (default runs/race/step_times_<config name>) and
prints the table (--json: one JSON object per family); each run's metrics.jsonl and log.txt stay in
OUT/<family>_round<r>/ and go to OUT/runs.jsonl.xz (experiments/runpack.py; the rows thinned to
the step, train loss and step times), the compact form committed, and --table-only remakes the
table from them (a run's folder, else the pack), training nothing.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optimizer_race import FAMILIES, REPO, family_groups, optim_groups, parse_center  # noqa: E402
import runlog  # noqa: E402  (scripts/, on the path through optimizer_race)
import runpack  # noqa: E402

# What the pack keeps of each metrics row: the step rows' times are the table.
KEEP = ("step", "train_loss", "step_ms", "device_phase_ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(REPO, "configs/cpu_small.yaml"))
    ap.add_argument("--families", default="adamw,muon,normuon,soap,rekls")
    ap.add_argument("--center", default="", metavar="FAMILY=LR,...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--engine", default=os.path.join(REPO, "build/apps/engine/engine"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--table-only", action="store_true", help="the table from OUT's runs; no training")
    a = ap.parse_args()
    families = [f for f in a.families.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            ap.error("--families: unknown family %r (known: %s)" % (f, ", ".join(FAMILIES)))
    if "adamw" not in families:
        ap.error("--families must hold adamw: every ratio is against it")
    center = parse_center(ap, a.center)
    if a.rounds < 2 or a.steps < 4:
        ap.error("--rounds must be at least 2 (a drift needs two) and --steps at least 4")
    _, groups = optim_groups(a.config)
    name = os.path.splitext(os.path.basename(a.config))[0]
    out = a.out or os.path.join(REPO, "runs", "race", "step_times_" + name)
    os.makedirs(out, exist_ok=True)
    pack = os.path.join(out, runpack.FILE)
    packed = runpack.read(pack)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def step_ms(family, run_dir):
        lr = center.get(family, FAMILIES[family][1])
        optim = yaml.safe_dump(family_groups(groups, family, lr), default_flow_style=True, width=1 << 30)
        cmd = ["mpirun", "--oversubscribe"] + (["--bind-to", "none"] if a.threads > 1 else []) + \
            ["-np", str(a.np), a.engine, "--config", a.config]
        for s in ["optim=" + optim.strip()] + a.sets + [
                "train.steps=%d" % a.steps, "train.eval_every=0", "train.target_val_loss=0", "log.every=1",
                "log.dir=" + run_dir, "checkpoint.dir=" + os.path.join(run_dir, "ckpt"), "checkpoint.every=0",
                "checkpoint.at_end=false", "checkpoint.overwrite=true"]:
            cmd += ["--set", s]
        if not a.table_only:
            shutil.rmtree(run_dir, ignore_errors=True)
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode != 0:
                sys.exit("race_step_times: %s failed (exit %d); its output ends:\n%s" %
                         (family, p.returncode, p.stdout[-3000:]))
            shutil.rmtree(os.path.join(run_dir, "ckpt"), ignore_errors=True)  # only its lock file
            name = os.path.basename(run_dir)
            packed[name] = runpack.pack_run(run_dir, name, KEEP)
            runpack.add(pack, [packed[name]])
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if os.path.exists(metrics) or os.path.basename(run_dir) not in packed:
            rows = runlog.step_rows(metrics)
        else:  # as runlog.step_rows reads a metrics.jsonl
            rows = [r for r in packed[os.path.basename(run_dir)].get("metrics", [])
                    if "step_ms" in r and r.get("train_loss") is not None]
        if len(rows) < 4:
            sys.exit("race_step_times: %s: %d step rows in %s" % (family, len(rows), run_dir))
        ms, _, _ = runlog.steady_state(rows)
        return ms

    times = {f: [] for f in families}  # per family, one step time per round, in round order
    order = []
    for r in range(a.rounds):
        k = r % len(families)
        for family in families[k:] + families[:k]:
            ms = step_ms(family, os.path.join(out, "%s_round%d" % (family, r + 1)))
            times[family].append(ms)
            order.append((r + 1, family, ms))
            print("step_times: round %d %s %.1f ms" % (r + 1, family, ms), flush=True)

    def sd(xs):
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    rows = []
    for f in families:
        ratio = [t / a_ for t, a_ in zip(times[f], times["adamw"])]
        rows.append({"family": f, "rounds": times[f], "step_ms": statistics.mean(times[f]), "sd_ms": sd(times[f]),
                     "drift": max(times[f]) / min(times[f]) - 1, "ratio_to_adamw": statistics.mean(ratio),
                     "ratio_sd": sd(ratio), "ratios": ratio})
    drift = max(r["drift"] for r in rows)
    L = ["Step times, %d rounds of %d steps per family, interleaved (round r starts at family r); np %d x %d "
         "thread(s); `%s`. A run's step time: the median past its first quarter of steps. Drift: a "
         "family's largest round over its smallest, minus 1 (largest here: %.1f%%)." % (
             a.rounds, a.steps, a.np, a.threads, os.path.relpath(a.config, REPO), 100 * drift), "",
         "| family | ms a step (rounds) | mean ± sd | drift | x AdamW's step time (per round: mean ± sd) |",
         "|---|---|---|---|---|"]
    for r in rows:
        L.append("| %s | %s | %.1f ± %.1f | %.1f%% | %.3f ± %.3f |" % (
            r["family"], ", ".join("%.1f" % t for t in r["rounds"]), r["step_ms"], r["sd_ms"], 100 * r["drift"],
            r["ratio_to_adamw"], r["ratio_sd"]))
    json.dump({"config": os.path.relpath(a.config, REPO), "np": a.np, "threads": a.threads, "steps": a.steps,
               "rounds": a.rounds, "order": order, "rows": rows}, open(os.path.join(out, "step_times.json"), "w"),
              indent=1)
    open(os.path.join(out, "step_times.md"), "w").write("\n".join(L) + "\n")
    if a.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
