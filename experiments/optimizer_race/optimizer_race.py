#!/usr/bin/python3
"""Which optimizer wins: each family raced to a target validation loss, tuned fairly (issue 39).

usage: optimizer_race.py [--config C.yaml] [--target LOSS|budget|adamw] [--steps N] [--eval-every N]
                         [--families adamw,muon,normuon,soap,rekls] [--lr-factors 0.5,1,2] [--extend 2]
                         [--center FAMILY=LR,...] [--seeds 3] [--tune-seed S] [--report-seeds S,S,...]
                         [--embed-head-factors 0.5,2] [--np 2] [--threads T] [--out DIR] [--reuse DIR]
                         [--set KEY=VALUE ...] [--engine PATH] [--table-only] [--no-times] [--no-plot]

The families differ only in the optimizer of the hidden matrices (the config's group that holds
blocks.*.attn.qkv.weight): AdamW, Muon, NorMuon, SOAP and REKLS; every other group (embeddings,
head) keeps the config's own AdamW; --set applies on top of every family's groups (so
--set optim.2.lr=0.22 retunes a group the race keeps). Dense models only: a config with experts is
refused. Each family first trains at its documented default learning rate (or the one --center
names for it, e.g. the best of an earlier race) times each of --lr-factors (seed: the config's),
then its best learning rate (fewest steps to the target; else the lowest final validation loss)
(where that is the smallest or largest swept, the sweep goes on past it by the same ratio, at most
--extend more runs, until the best is inside) at --seeds seeds (the sweep's run is the first).
--tune-seed sweeps at another seed and --report-seeds names the seeds the best rate is reported
at: a rate picked on a seed that is not reported keeps the pick's luck out of the reported mean
(issue 50).
--embed-head-factors then tunes the rates of the groups the race keeps (the embeddings, the head,
and the scalars where a config has them) per family (issue 50): at the family's best hidden-matrix
rate and the tuning seed, each kept group's lr times each factor (all kept groups by the same
factor, the config's ratios between them kept), extended past an edge as the lr sweep is; the
best of the lr sweep (factor 1) and these runs is what the report seeds run. A run at factor f
other than 1 is named <family>_lr<LR>_eh<f>_seed<S>. Every run is --steps steps with a validation every
--eval-every; a run stops early at the target (train.target_val_loss), and its steps and train
time to the target, median tokens/s and peak memory are kept; each family's optimizer state bytes
per rank are measured once, at its best lr, from a 2-step run's checkpoint (the optim/ tensors of
each rank's file).
Steps and time to the target are interpolated linearly between the validation that reaches it
and the one before (the first validation at or below it, alone, would round every count up to a
multiple of --eval-every).

Results go to OUT (default runs/race/<config name>): one folder per run while it trains (its
metrics.jsonl and log.txt, and result.json once it is done), and every finished run in
OUT/runs.jsonl.xz (experiments/runpack.py: its result, its metrics thinned to the step, losses,
lr, times and memory, every 10th step's training row and every validation, its log), the compact form a race commits (the run folders are not
committed); race.json, race.md (the table: steps and time to the target, mean and spread over
seeds, speedups over tuned AdamW, the chosen learning rates) and race.png (validation loss
against steps and against time, the best run of each family). An interrupted race resumes at
the first run without a result in its folder or in runs.jsonl.xz (a fresh clone holds only the
latter); --table-only rewrites the table from the results already there (--no-plot: without
race.png); --reuse DIR copies a run that an earlier race of the same config, steps and world
size finished in DIR (same run name, its folder or DIR/runs.jsonl.xz) instead of training it
again. Times are only comparable on a quiet machine.

--target budget races at a fixed budget instead, as Wen et al. (2025) tune: every run trains all
--steps, each family's best learning rate is the one with the lowest final validation loss, and
the target is set afterwards to the highest final validation loss among the tuned runs of every
family (so the slowest family's worst seed reaches it at its last validation); steps and time to
it are read from each run's validation curve. A schedule with a cooldown makes a run's curve
depend on --steps, which is why the budget, not the target, is what a family is tuned for.
--target adamw is the same budget race with the target set to tuned AdamW's loss instead (the
highest final val loss among its seeds): how much sooner each family reaches what AdamW reaches
in the whole budget, Wen et al.'s question; a family that ends above it does not reach it.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "experiments"))
import runlog  # noqa: E402
import figures  # noqa: E402
import runpack  # noqa: E402
HIDDEN = "blocks.*.attn.qkv.weight"
# The metrics a race's pack keeps of each row: its tables read the results (the validation curve,
# median tokens/s, peak memory), the rows keep the train curve and what those came from.
KEEP = ("step", "train_loss", "val_loss", "lr", "elapsed_ms", "step_ms", "tokens_per_s",
        "peak_mem_bytes")
# No table reads a training row (the results hold what they came from): the pack keeps every
# EVERY-th step's and every validation's.
EVERY = 10

# Each family's optimizer for the hidden matrices and its documented default learning rate
# (AdamW and Muon: the engine's own defaults and cpu_small's; SOAP and REKLS: configs/soap.yaml's,
# the reference's lr being required).
FAMILIES = {
    "adamw": ({"optimizer": "adamw", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.0}, 0.008),
    "muon": ({"optimizer": "muon", "momentum": 0.95, "matrix_views": {"*.attn.qkv.weight": 3}}, 0.02),
    "normuon": ({"optimizer": "normuon", "momentum": 0.95, "matrix_views": {"*.attn.qkv.weight": 3}}, 0.02),
    "soap": ({"optimizer": "soap", "weight_decay": 0.0}, 0.004),
    "rekls": ({"optimizer": "rekls", "weight_decay": 0.0}, 0.004),
}


def optim_groups(config_path):
    """The config's optimizer groups (a list, or a preset file's optim.groups)."""
    with open(config_path) as f:
        cfg = yaml.safe_load(f) or {}
    optim = cfg.get("optim")
    if isinstance(optim, str):
        with open(os.path.join(REPO, "configs", optim)) as f:
            optim = (yaml.safe_load(f) or {}).get("optim")
    if isinstance(optim, dict):
        optim = optim.get("groups")
    if not isinstance(optim, list):
        sys.exit("optimizer_race: %s: no optim groups" % config_path)
    return cfg, optim


def family_groups(groups, family, lr, eh=1.0):
    """The config's groups with the hidden-matrix group's optimizer replaced by the family's, and
    every other group's lr times eh."""
    hyper, _ = FAMILIES[family]
    out, found = [], False
    for g in groups:
        if HIDDEN in g.get("params", []):
            out.append(dict({"params": g["params"]}, lr=lr, **hyper))
            found = True
        elif eh != 1.0:
            if "lr" not in g:
                sys.exit("optimizer_race: --embed-head-factors: the group of %s names no lr" % g.get("params"))
            out.append(dict(g, lr=g["lr"] * eh))
        else:
            out.append(g)
    if not found:
        sys.exit("optimizer_race: no optimizer group holds %s" % HIDDEN)
    return out


def parse_center(ap, text):
    """--center's FAMILY=LR,... as {family: lr}; a bad item is a usage error naming it."""
    center = {}
    for item in (x for x in text.split(",") if x):
        family, _, lr = item.partition("=")
        try:
            center[family] = float(lr)
        except ValueError:
            ap.error("--center: %r is not FAMILY=LR" % item)
        if family not in FAMILIES or center[family] <= 0:
            ap.error("--center: %r: a known family (%s) and a positive lr" % (item, ", ".join(FAMILIES)))
    return center


def scored(result, target):
    """The run's result with its steps and time to the target (interpolated linearly between the
    first validation at or below it and the one before) and the val loss at that validation
    (None where it never got there)."""
    curve = result["val_curve"]
    i = next((i for i, (_, _, v) in enumerate(curve) if v <= target), None) if target is not None else None
    if i is None:
        return dict(result, target_step=None, target_ms=None, val_loss_at_target=None)
    step, ms, v = curve[i]
    if i > 0 and curve[i - 1][2] > target:
        s0, ms0, v0 = curve[i - 1]
        f = (v0 - target) / (v0 - v)  # in (0, 1]: where the line between the two crosses target
        step, ms = s0 + f * (step - s0), ms0 + f * (ms - ms0)
    return dict(result, target_step=step, target_ms=ms, val_loss_at_target=v)


def run_result(run_dir, target):
    """What a finished run's log folder says, as one dict."""
    rows = runlog.read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    tps = sorted(r["tokens_per_s"] for r in rows if r.get("tokens_per_s"))
    peak = max((r.get("peak_mem_bytes", 0) for r in rows), default=0)
    val = [(r["step"], r.get("elapsed_ms", 0.0), r["val_loss"]) for r in runlog.with_key(rows, "val_loss")]
    return scored({"final_val_loss": runlog.final_val_loss(rows),
                   "tokens_per_s": tps[len(tps) // 2] if tps else None, "peak_mem_bytes": peak or None,
                   "val_curve": val}, target)


def optimizer_state_bytes(ckpt_dir):
    """Bytes of optimizer state in each rank's file of the last checkpoint under ckpt_dir (the
    tensors named optim/..., read from the safetensors headers)."""
    step = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step_"))[-1]
    sizes = []
    for name in sorted(os.listdir(os.path.join(ckpt_dir, step))):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(ckpt_dir, step, name), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        sizes.append(sum(t["data_offsets"][1] - t["data_offsets"][0]
                         for k, t in header.items() if k.startswith("optim/")))
    return sizes


def rank(r):
    """A run's place in its family's sweep, best first: fewer steps to the target (a tie: the
    lower val loss there), then the runs that missed it by their final val loss."""
    if r["target_step"] is not None:
        return (0, r["target_step"], r["val_loss_at_target"])
    return (1, 0, r["final_val_loss"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(REPO, "configs/cpu_small.yaml"))
    ap.add_argument("--target", default=None,
                    help="a val loss, 'budget' or 'adamw' (see above); default: train.target_val_loss")
    ap.add_argument("--steps", type=int, default=None, help="default: the config's train.steps")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--families", default="adamw,muon,normuon,soap,rekls")
    ap.add_argument("--lr-factors", default="0.5,1,2")
    ap.add_argument("--extend", type=int, default=2,
                    help="sweep past an edge that holds the best lr at most this many times")
    ap.add_argument("--center", default="", metavar="FAMILY=LR,...",
                    help="centre these families' sweeps on these learning rates, not their defaults")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tune-seed", type=int, default=None, help="the sweep's seed (default: the config's train.seed)")
    ap.add_argument("--report-seeds", default=None, metavar="S,S,...",
                    help="the seeds the best lr runs at (default: the tune seed and the next --seeds - 1)")
    ap.add_argument("--reuse", default=None, metavar="DIR",
                    help="copy a run finished in DIR (same folder name) instead of training it")
    ap.add_argument("--embed-head-factors", default="", metavar="F,F,...",
                    help="tune the kept groups' lrs per family at these factors (see above)")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--engine", default=os.path.join(REPO, "build/apps/engine/engine"))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--no-plot", action="store_true", help="write no race.png")
    ap.add_argument("--no-times", action="store_true",
                    help="leave times and tokens/s out of the table (runs not trained on a quiet machine)")
    a = ap.parse_args()
    families = [f for f in a.families.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            ap.error("--families: unknown family %r (known: %s)" % (f, ", ".join(FAMILIES)))
    factors = [float(x) for x in a.lr_factors.split(",") if x]
    try:
        eh_factors = sorted({float(x) for x in a.embed_head_factors.split(",") if x} - {1.0})
    except ValueError:
        ap.error("--embed-head-factors: %r is not a list of numbers" % a.embed_head_factors)
    if any(f <= 0 for f in eh_factors):
        ap.error("--embed-head-factors: factors must be positive")
    center = parse_center(ap, a.center)
    if not factors or a.seeds < 1 or a.np < 1:
        ap.error("--lr-factors, --seeds and --np must be non-empty and positive")
    cfg, groups = optim_groups(a.config)
    # A --set of a group's key (optim.<i>.<key>=<value>) is folded into the groups here, so that
    # the family's hidden group and the embed/head factors apply on top of it.
    engine_sets = []
    for item in a.sets:
        key, eq, value = item.partition("=")
        parts = key.split(".")
        if parts[0] != "optim":
            engine_sets.append(item)
            continue
        if not eq or len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(groups):
            ap.error("--set %s: a group's key is optim.<i>.<key>=<value> with i below %d" % (item, len(groups)))
        groups[int(parts[1])] = dict(groups[int(parts[1])], **{parts[2]: yaml.safe_load(value)})
    a.sets = engine_sets
    if ((cfg.get("model", {}) or {}).get("moe", {}) or {}).get("experts"):
        ap.error("%s has experts: the race covers dense models (StackedSoap's 3-D banks need a "
                 "group of their own)" % a.config)
    budget = a.target in ("budget", "adamw")  # every run trains all steps; the target comes after
    if a.target == "adamw" and "adamw" not in families:
        ap.error("--target adamw needs the adamw family in --families")
    try:
        target = None if budget else float(a.target) if a.target is not None else \
            (cfg.get("train", {}) or {}).get("target_val_loss")
    except ValueError:
        ap.error("--target: a val loss, 'budget' or 'adamw', not %r" % a.target)
    if not budget and not target:
        ap.error("no target: pass --target (a loss or 'budget') or set train.target_val_loss in the config")
    steps = a.steps or (cfg.get("train", {}) or {}).get("steps")
    name = os.path.splitext(os.path.basename(a.config))[0]
    out = a.out or os.path.join(REPO, "runs", "race", name)
    os.makedirs(out, exist_ok=True)
    pack = os.path.join(out, runpack.FILE)
    packed = runpack.read(pack)  # the finished runs in compact form (a fresh clone's only copy)
    reuse_packed = runpack.read(os.path.join(a.reuse, runpack.FILE)) if a.reuse else {}
    base_seed = a.tune_seed if a.tune_seed is not None else int((cfg.get("train", {}) or {}).get("seed", 1337))
    try:
        report_seeds = [int(x) for x in a.report_seeds.split(",") if x] if a.report_seeds else \
            [base_seed + i for i in range(a.seeds)]
    except ValueError:
        ap.error("--report-seeds: %r is not a list of integers" % a.report_seeds)
    if not report_seeds:
        ap.error("--report-seeds: no seed")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def train(family, lr, seed, run_dir, extra, eh=1.0):
        """Trains one run into run_dir (its logs; --set extra last)."""
        optim = yaml.safe_dump(family_groups(groups, family, lr, eh), default_flow_style=True, width=1 << 30)
        cmd = ["mpirun", "--oversubscribe"] + (["--bind-to", "none"] if a.threads > 1 else []) + \
            ["-np", str(a.np), a.engine, "--config", a.config]
        for s in ["optim=" + optim.strip()] + a.sets + ["train.seed=%d" % seed, "train.steps=%d" % steps,
                           "train.eval_every=%d" % a.eval_every,
                           "train.target_val_loss=%g" % (0 if budget else target),
                           "log.dir=" + run_dir, "checkpoint.dir=" + os.path.join(run_dir, "ckpt"),
                           "checkpoint.every=0", "checkpoint.at_end=false",
                           "checkpoint.overwrite=true"] + extra:
            cmd += ["--set", s]
        print("race: %s lr %g%s seed %d%s" % (family, lr, "" if eh == 1.0 else " embed/head x%g" % eh, seed,
                                               " (state probe)" if extra else ""), flush=True)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            sys.exit("race: %s lr %g seed %d failed (exit %d); its output ends:\n%s" %
                     (family, lr, seed, p.returncode, p.stdout[-3000:]))

    def finished(name):
        """A run's result.json from its folder, else from the pack (None: not finished); a
        finished folder missing from the pack is packed."""
        done = os.path.join(out, name, "result.json")
        if os.path.exists(done):
            if name not in packed:
                packed[name] = runpack.pack_run(os.path.join(out, name), name, KEEP, every=EVERY)
                runpack.add(pack, [packed[name]])
            return json.load(open(done))
        return packed[name].get("result") if name in packed else None

    def run(family, lr, seed, eh=1.0):
        """One run's result, training it unless it is finished."""
        name = "%s_lr%g%s_seed%d" % (family, lr, "" if eh == 1.0 else "_eh%g" % eh, seed)
        run_dir = os.path.join(out, name)
        result = finished(name)
        if result is not None:
            return dict(result, eh=eh)
        if a.table_only:
            return None
        shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run starts over, logs and all
        earlier = os.path.join(a.reuse, name) if a.reuse else None
        if earlier and (os.path.exists(os.path.join(earlier, "result.json")) or name in reuse_packed):
            print("race: %s lr %g seed %d (reused from %s)" % (family, lr, seed, a.reuse), flush=True)
            if os.path.exists(os.path.join(earlier, "result.json")):
                shutil.copytree(earlier, run_dir)
            else:
                runpack.unpack_run(reuse_packed[name], run_dir)
            return dict(finished(name), eh=eh)
        train(family, lr, seed, run_dir, [], eh)
        r = dict(run_result(run_dir, target), family=family, lr=lr, eh=eh, seed=seed)
        done = os.path.join(run_dir, "result.json")
        json.dump(r, open(done + ".tmp", "w"))
        os.replace(done + ".tmp", done)  # a result is there whole or not at all
        finished(name)
        return r

    results = {}
    for family in families:
        default_lr = center.get(family, FAMILIES[family][1])
        sweep = [r for r in (run(family, default_lr * f, base_seed) for f in factors) if r]
        if not sweep:
            continue
        best = min(sweep, key=rank)
        # A best learning rate at an edge of the sweep is not yet tuned: go on past that edge by
        # the sweep's outer ratio until one is inside, at most --extend times.
        for _ in range(a.extend if len(sweep) > 1 else 0):
            lrs = sorted(r["lr"] for r in sweep)
            if best["lr"] == lrs[0]:
                lr = lrs[0] * lrs[0] / lrs[1]
            elif best["lr"] == lrs[-1]:
                lr = lrs[-1] * lrs[-1] / lrs[-2]
            else:
                break
            r = run(family, lr, base_seed)
            if not r:
                break
            sweep.append(r)
            best = min(sweep, key=rank)
        # The kept groups' rates at the best hidden rate, swept and extended the same way.
        if eh_factors:
            eh_sweep = [best] + [r for r in (run(family, best["lr"], base_seed, f) for f in eh_factors) if r]
            for _ in range(a.extend if len(eh_sweep) > 1 else 0):
                ehs = sorted(r["eh"] for r in eh_sweep)
                top = min(eh_sweep, key=rank)["eh"]
                if top == ehs[0]:
                    f = ehs[0] * ehs[0] / ehs[1]
                elif top == ehs[-1]:
                    f = ehs[-1] * ehs[-1] / ehs[-2]
                else:
                    break
                r = run(family, best["lr"], base_seed, f)
                if not r:
                    break
                eh_sweep.append(r)
            sweep += eh_sweep[1:]
            best = min(sweep, key=rank)
        seeds = [r for r in (run(family, best["lr"], s, best["eh"]) for s in report_seeds) if r]
        if not seeds:
            continue
        results[family] = {"sweep": sweep, "best_lr": best["lr"], "best_eh": best["eh"], "seeds": seeds}
    # Optimizer state per rank, measured: each family at its best lr for 2 steps, then a
    # checkpoint whose optim/ tensors are summed per rank file (the state has its full size after
    # the first step; the checkpoint is removed).
    for family, r in results.items():
        name = "%s_state_probe" % family
        probe = os.path.join(out, name)
        if finished(name) is None and not a.table_only:
            shutil.rmtree(probe, ignore_errors=True)
            train(family, r["best_lr"], base_seed, probe,
                  ["train.steps=2", "train.eval_every=0", "train.target_val_loss=0", "checkpoint.at_end=true"],
                  r["best_eh"])
            json.dump({"state_bytes": optimizer_state_bytes(os.path.join(probe, "ckpt"))},
                      open(os.path.join(probe, "result.json"), "w"))
            shutil.rmtree(os.path.join(probe, "ckpt"))
        done = finished(name)
        r["state_bytes"] = done["state_bytes"] if done is not None else None
    if budget and results:  # the slowest family's (AdamW's) worst tuned seed reaches it at its last validation
        target = max(s["final_val_loss"] for f, r in results.items() for s in r["seeds"]
                     if a.target == "budget" or f == "adamw")
        for r in results.values():
            r["sweep"] = [scored(s, target) for s in r["sweep"]]
            r["seeds"] = [scored(s, target) for s in r["seeds"]]
    if not results:
        sys.exit("race: no results yet")
    write_tables(out, results, target, steps, a)
    return 0


def write_tables(out, results, target, steps, a):
    def mean_sd(xs):
        return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (None, None)
    rows = []
    for family, r in results.items():
        hit = [s for s in r["seeds"] if s["target_step"] is not None]
        st = mean_sd([s["target_step"] for s in hit])
        tm = mean_sd([s["target_ms"] / 1e3 for s in hit])
        rows.append({"family": family, "lr": r["best_lr"], "eh": r["best_eh"], "seeds": len(r["seeds"]), "reached": len(hit),
                     "steps": st, "seconds": tm, "final": mean_sd([s["final_val_loss"] for s in r["seeds"]]),
                     "tokens_per_s": statistics.median(s["tokens_per_s"] for s in r["seeds"] if s["tokens_per_s"]),
                     "peak_mib": max((s["peak_mem_bytes"] or 0) for s in r["seeds"]) / 2**20,
                     "state_mib": max(r["state_bytes"]) / 2**20 if r.get("state_bytes") else None,
                     "swept": ", ".join("%g%s: %.3f%s" % (s["lr"], "" if s["eh"] == 1.0 else " eh x%g" % s["eh"],
                                                          s["final_val_loss"],
                                                        "" if s["target_step"] is None else " @%.0f" % s["target_step"])
                                        for s in r["sweep"])})
    ref = next((x for x in rows if x["family"] == "adamw" and x["steps"][0]), None)
    how = ("set after the runs to the highest final val loss among the tuned %s (--target %s: "
           "every run trains all %d steps, learning rates tuned for the lowest final val loss)" %
           ("runs" if a.target == "budget" else "AdamW seeds", a.target, steps)
           if a.target in ("budget", "adamw") else "at most %d steps, a run stops there" % steps)
    # --no-times: runs trained beside other work (or copied from a quiet machine's race) have
    # times that say nothing, so the table leaves them out.
    timed = not a.no_times
    L = ["Target val loss %.4f, %s; np %d x %d thread(s); steps%s to the "
         "target: mean ± standard deviation over the seeds that reached it (interpolated between "
         "the validations, every %d steps, that bracket it)%s." % (
             target, how, a.np, a.threads, " and seconds" if timed else "", a.eval_every,
             "" if timed else "; times left out (--no-times: not trained on a quiet machine)"), "",
         "| family | lr (swept, lr [embed/head factor]: final val loss @ steps to target) | reached | steps to target | x AdamW (steps) | " +
         ("seconds to target | x AdamW (time) | " if timed else "") + "final val loss | " +
         ("tok/s | " if timed else "") + "peak MiB | optimizer state MiB (largest rank) |",
         "|---|---|---|---|---|" + ("---|---|" if timed else "") + "---|" + ("---|" if timed else "") + "---|---|"]
    for x in rows:
        s, t = x["steps"], x["seconds"]
        cells = [x["family"], "%g%s (%s)" % (x["lr"], "" if x["eh"] == 1.0 else ", embed/head x%g" % x["eh"], x["swept"]), "%d of %d" % (x["reached"], x["seeds"]),
                 "%.1f ± %.1f" % s if s[0] else "-", "%.2f" % (ref["steps"][0] / s[0]) if ref and s[0] else "-"]
        if timed:
            cells += ["%.1f ± %.1f" % t if t[0] else "-", "%.2f" % (ref["seconds"][0] / t[0]) if ref and t[0] else "-"]
        cells.append("%.4f ± %.4f" % x["final"])
        if timed:
            cells.append("%.0f" % x["tokens_per_s"])
        cells += ["%.0f" % x["peak_mib"], "-" if x["state_mib"] is None else "%.1f" % x["state_mib"]]
        L.append("| " + " | ".join(cells) + " |")
    # The runs' validation curves stay in the pack (runs.jsonl.xz) alone; race.json keeps the rest.
    no_curves = {f: {k: ([{x: v for x, v in run.items() if x != "val_curve"} for run in r[k]]
                         if k in ("sweep", "seeds") else r[k]) for k in r} for f, r in results.items()}
    figures.write_json({"target": target, "steps": steps, "np": a.np, "threads": a.threads, "rows": rows,
                        "results": no_curves}, os.path.join(out, "race.json"))
    open(os.path.join(out, "race.md"), "w").write("\n".join(L) + "\n")
    print("\n".join(L))
    if a.no_plot:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 5.8, 4.2), squeeze=False)
    axes = axes[0]
    for family, r in results.items():
        best = min(r["seeds"], key=rank)
        curve = best["val_curve"]
        axes[0].plot([c[0] for c in curve], [c[2] for c in curve], label="%s lr %g" % (family, r["best_lr"]))
        if timed:
            axes[1].plot([c[1] / 1e3 for c in curve], [c[2] for c in curve], label=family)
    # The curves part only near the target: show from a little below the lowest to 0.5 above it.
    lowest = min(c[2] for r in results.values() for s in r["seeds"] for c in s["val_curve"])
    for ax, xlabel in zip(axes, ("step", "train time (s)")):
        ax.set_ylim(min(lowest, target) - 0.03, target + 0.5)
        ax.axhline(target, color="k", lw=0.8, ls=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("val loss")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    figures.save_png(fig, os.path.join(out, "race.png"), dpi=110)


if __name__ == "__main__":
    sys.exit(main())
