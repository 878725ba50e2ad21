#!/usr/bin/python3
"""The record recipe study's tables (issue 50, section 3), regenerated from committed runs.

usage: recipe_study_tables.py RECORD_DIR [--quiet]

RECORD_DIR (experiments/recipe_study/results, filled by recipe_study.sh --collect) holds every
finished run in runs.jsonl.xz (experiments/runpack.py), run <stage>/<run>: its metrics.jsonl rows,
log.txt and result.json (the run's stage, arm, seed, steps, config, --set overrides and learning
rates); a folder <stage>/<run>/ with those files counts too. Every number below is read from the
metrics; result.json only says which run is which. Writes RECORD_DIR/tables.md and tables.json
and prints the markdown. Per arm: the final val loss as
mean +- sample standard deviation over its seeds; against a reference arm the difference of the
means and the two-sided Welch t-test p (unequal variances; '-' with fewer than 2 seeds on a
side); the gap val - train, the final val loss less the mean train loss of the last 25 steps.
Stage tune's picks are recomputed here with the rule the driver used (pick_lr).
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "experiments"))
import runlog  # noqa: E402
import runpack  # noqa: E402
STAGES = ["tune", "tuned", "no_value_embeds", "under_epoch", "probes"]
# Coordinate-wise tuning order of the recipe's AdamW learning rates (experiments/recipe_study/recipe_study.py).
COORDS = ["head", "embed", "scalar"]
TARGET = 6.07  # speedrun_cpu's target (configs/speedrun_cpu.yaml)
GAP_STEPS = 25  # train-loss window at the end for the val - train gap
# Earlier committed runs (speedrun.sh, 3 seeds each) the study compares with.
EARLIER = {
    "recipe_config_rates": ("records/2026-11-27_recipe",
                            "the recipe at speedrun_cpu's rates (head 0.008), 2026-11-27"),
    "recipe_head022": ("records/2026-11-27_recipe_head_lr_022",
                       "the recipe with head lr 0.22, 2026-11-27"),
}


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def pick_lr(runs, coord, current):
    """Coordinate-wise tuning: of the finished runs whose other coordinates equal `current`,
    the one with the lowest final val loss (the first in run order on a tie), or None."""
    cands = [r for r in runs if r["final_val_loss"] is not None and
             all(close(r["lrs"][c], current[c]) for c in COORDS if c != coord)]
    return min(cands, key=lambda r: r["final_val_loss"]) if cands else None


def tune_walk(runs, centers):
    """The picks, coordinate by coordinate: [(coord, pick run, candidate runs)], and the picked
    learning rates ({coord: lr}; a coordinate with no finished candidate keeps its center)."""
    current = dict(centers)
    out = []
    for coord in COORDS:
        best = pick_lr(runs, coord, current)
        if best is None:
            break
        cands = [r for r in runs
                 if all(close(r["lrs"][c], current[c]) for c in COORDS if c != coord)]
        current[coord] = best["lrs"][coord]
        out.append((coord, best, cands))
    return out, current


def read_run(run_dir, about=None):
    """A run's result.json (or `about` for an earlier record's seed folder) with what its
    metrics say: final val loss, val loss by step, steps to the target, the val - train gap."""
    if about is None:
        with open(os.path.join(run_dir, "result.json")) as f:
            about = json.load(f)
    metrics = runlog.read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    try:
        with runlog.open_text(os.path.join(run_dir, "log.txt")) as f:
            log = f.read()
    except OSError:
        log = ""
    return run_of(about, metrics, log)


def read_record(rec):
    """read_run's reading of a pack record (runpack.py)."""
    return run_of(rec["result"], rec.get("metrics", []), rec.get("log", ""))


def run_of(about, metrics, log):
    """read_run's dict from a run's result, metrics rows and log text."""
    r = dict(about)
    rows = sorted(runlog.by_step(metrics).values(), key=lambda x: x["step"])
    val = {x["step"]: x["val_loss"] for x in runlog.with_key(rows, "val_loss")}
    train = runlog.with_key(rows, "train_loss")
    last = rows[-1]["step"] if rows else 0
    tail = [x["train_loss"] for x in train if x["step"] > last - GAP_STEPS]
    r["last_step"] = last
    r["val"] = val
    r["final_val_loss"] = val.get(last)
    hit = runlog.time_to_target(rows, TARGET)
    r["target_step"] = hit[0] if hit else None
    r["final_train_loss"] = statistics.fmean(tail) if tail else None
    r["gap"] = (r["final_val_loss"] - r["final_train_loss"]
                if r["final_val_loss"] is not None and tail else None)
    r["diverged"] = bool(about.get("diverged"))
    if r["diverged"]:
        r["final_val_loss"] = None
    m = re.search(r"^parameters: (\d+)", log, re.M)
    r["parameters"] = int(m.group(1)) if m else None
    return r


def load_stage(root, stage):
    """The finished runs of one stage (root's pack, and folders root/<stage>/<run>/ with a
    result.json), in the order the driver ran them."""
    runs = {name: read_record(rec) for name, rec in runpack.read(os.path.join(root, runpack.FILE)).items()
            if name.startswith(stage + "/") and "result" in rec}
    d = os.path.join(root, stage)
    if os.path.isdir(d):
        runs.update({stage + "/" + n: read_run(os.path.join(d, n)) for n in os.listdir(d)
                     if os.path.isfile(os.path.join(d, n, "result.json"))})
    return [runs[n] for n in sorted(runs, key=lambda n: (runs[n]["order"], n))]


def load_earlier(key):
    """The seed folders of an earlier committed record, as runs of arm `key`."""
    path, what = EARLIER[key]
    d = os.path.join(REPO, path)
    runs = []
    if os.path.isdir(d):
        for n in sorted(os.listdir(d)):
            if n.startswith("seed") and n[4:].isdigit():
                runs.append(read_run(os.path.join(d, n), {"arm": key, "seed": int(n[4:]),
                                                          "what": what, "source": path}))
    return runs


def mean_sd(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def welch_p(a, b):
    """Two-sided Welch t-test p of equal means; None with fewer than 2 values on a side or no
    spread in either."""
    a = [x for x in a if x is not None]
    b = [x for x in b if x is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import ttest_ind
    p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def fmt_ms(m, s, spec=".4f"):
    if m is None:
        return "-"
    return format(m, spec) + (" ± " + format(s, spec) if s is not None else "")


def arm_stats(label, what, runs, refs, at_steps):
    """One table row's numbers: the arm's runs against each (ref label, ref runs)."""
    finals = [r["final_val_loss"] for r in runs]
    m, s = mean_sd(finals)
    row = {"arm": label, "what": what, "seeds": [r["seed"] for r in runs],
           "steps": sorted({r["last_step"] for r in runs}), "final_val": finals,
           "final_val_mean": m, "final_val_sd": s,
           "val_at": {str(k): mean_sd([r["val"].get(k) for r in runs])[0] for k in at_steps},
           "target_steps": [r["target_step"] for r in runs],
           "gap_mean": mean_sd([r["gap"] for r in runs])[0],
           "gap_sd": mean_sd([r["gap"] for r in runs])[1],
           "parameters": runs[0]["parameters"] if runs else None,
           "diverged": sum(1 for r in runs if r.get("diverged")), "against": {}}
    for ref_label, ref_runs in refs:
        if ref_label == label or not ref_runs or not runs:
            continue
        rm = mean_sd([r["final_val_loss"] for r in ref_runs])[0]
        row["against"][ref_label] = {"delta": None if m is None or rm is None else m - rm,
                                     "p": welch_p(finals, [r["final_val_loss"] for r in ref_runs])}
    return row


def markdown_rows(rows, ref_labels, at_steps, params=False):
    head = ["arm", "what", "seeds", "final val loss (mean ± sd)"]
    head += ["Δ vs %s (Welch p)" % x for x in ref_labels]
    head += ["val at step %s" % " / ".join(str(k) for k in at_steps)] if at_steps else []
    head += ["steps to %.2f" % TARGET, "val − train"]
    head += ["parameters"] if params else []
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = ["`%s`" % row["arm"], row["what"], str(len(row["seeds"])) + (
                     " (%d diverged)" % row["diverged"] if row["diverged"] else ""),
                 fmt_ms(row["final_val_mean"], row["final_val_sd"])]
        for x in ref_labels:
            a = row["against"].get(x)
            cells.append("-" if a is None else "%s (p = %s)" % (fmt(a["delta"], "+.4f"),
                                                                fmt(a["p"], ".2g")))
        if at_steps:
            cells.append(" / ".join(fmt(row["val_at"][str(k)], ".3f") for k in at_steps))
        cells.append(", ".join("-" if t is None else str(t) for t in row["target_steps"]))
        cells.append(fmt_ms(row["gap_mean"], row["gap_sd"], ".3f"))
        if params:
            cells.append(fmt(None if row["parameters"] is None else row["parameters"] / 1e6,
                             ".2f") + " M")
        out.append("| " + " | ".join(cells) + " |")
    return out


def by_arm(runs, arm):
    return [r for r in runs if r["arm"] == arm]


def lrs_text(lrs):
    return "head %g, embed %g, scalar %g" % (lrs["head"], lrs["embed"], lrs["scalar"])


def tune_section(runs):
    lines = ["## 1. tune: the recipe's head, embedding and scalar lrs, coordinate-wise", ""]
    if not runs:
        return lines + ["No finished run yet.", ""], {}
    seeds = sorted({r["seed"] for r in runs})
    centers = runs[0]["tune"]["centers"]
    lines += ["Seed %s (not reported), %d steps each; each coordinate swept with the others at "
              "their pick so far (at first the config's: %s); the pick is the lowest final val "
              "loss." % (", ".join(map(str, seeds)), runs[0]["steps"],
                         ", ".join("%s %g" % (c, centers[c]) for c in COORDS[1:])), "",
              "| run | swept | head lr | embed lr | scalar lr | final val loss | val at step 400 |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(runs):
        lines.append("| %d | %s | %g | %g | %g | %s | %s |" % (
            i + 1, r["tune"]["coordinate"] + (" (past the edge)" if r["tune"].get(
                "extension") else ""), r["lrs"]["head"], r["lrs"]["embed"],
            r["lrs"]["scalar"], "diverged" if r["diverged"] else fmt(r["final_val_loss"], ".4f"),
            fmt(r["val"].get(400), ".4f")))
    walk, picked = tune_walk(runs, centers)
    lines.append("")
    for coord, best, cands in walk:
        values = sorted({c["lrs"][coord] for c in cands})
        edge = len(values) > 1 and (close(best["lrs"][coord], values[0]) or
                                    close(best["lrs"][coord], values[-1]))
        lines.append("- %s lr: %g of %s (final val %.4f)%s" % (
            coord, best["lrs"][coord], ", ".join("%g" % v for v in values),
            best["final_val_loss"],
            "; at the edge of its sweep" if edge else ""))
    done = len(walk) == len(COORDS)
    lines += ["", ("The tuned recipe: " if done else "Picks so far (tuning unfinished): ") +
              lrs_text(picked) + ".", ""]
    return lines, {"runs": [{"lrs": r["lrs"], "swept": r["tune"]["coordinate"], "seed": r["seed"],
                             "final_val_loss": r["final_val_loss"]} for r in runs],
                   "picked": picked, "complete": done}


def arms_section(title, intro, arms, refs, at_steps, params=False):
    """arms: [(label, what, runs)]; refs: [(label, runs)] (each arm against each, itself not)."""
    rows = [arm_stats(label, what, runs, refs, at_steps) for label, what, runs in arms if runs]
    lines = ["## " + title, ""] + intro + [""]
    if not rows:
        return lines + ["No finished run yet.", ""], []
    lines += markdown_rows(rows, [x for x, _ in refs], at_steps, params) + [""]
    return lines, rows


def what_of(runs, default):
    return runs[0].get("what", default) if runs else default


def write_tables(root):
    """Writes root/tables.md and root/tables.json; returns the markdown. Raises
    runlog.RunLogError, OSError, ValueError or KeyError naming what it could not read."""
    stage = {s: load_stage(root, s) for s in STAGES}
    earlier = {k: load_earlier(k) for k in EARLIER}
    study = {}
    if os.path.isfile(os.path.join(root, "study.json")):
        with open(os.path.join(root, "study.json")) as f:
            study = json.load(f)
    lines = ["# The record recipe on the CPU: the study of issue 50, section 3", "",
             "Generated by `experiments/recipe_study/recipe_study_tables.py` from the runs in "
             "this folder's runs.jsonl.xz (`experiments/recipe_study/recipe_study.sh`; "
             "experiments/recipe_study/README.md). np %s x 1 thread, Brown, val loss on "
             "the first %s validation tokens; every run to the end of its schedule (no stop at "
             "the target). Losses, not times: the runs shared the machine." % (
                 study.get("np", "?"), study.get("val_tokens", "?")), ""]
    out = {"study": study}
    t_lines, out["tune"] = tune_section(stage["tune"])
    lines += t_lines

    tuned = stage["tuned"]
    speed = by_arm(tuned, "speedrun_cpu")
    ref_speed = [("speedrun_cpu", speed)]
    arms = [("speedrun_cpu", "speedrun_cpu to the end", speed),
            ("recipe_tuned", what_of(by_arm(tuned, "recipe_tuned"), "the tuned recipe"),
             by_arm(tuned, "recipe_tuned")),
            ("recipe_tanh", "the recipe with speedrun_cpu's tanh cap 15, the config's rates",
             by_arm(tuned, "recipe_tanh"))]
    arms += [(k, EARLIER[k][1] + " (`%s`)" % EARLIER[k][0], earlier[k]) for k in EARLIER]
    s_lines, out["tuned"] = arms_section(
        "2. the tuned recipe and the tanh-cap variant, to the end",
        ["Report seeds %s, %s steps each; Δ is the arm's mean final val loss less "
         "speedrun_cpu's (run to the end here)." % (
             ", ".join(str(s) for s in sorted({r["seed"] for r in tuned})) or "-",
             ", ".join(str(s) for s in sorted({r["steps"] for r in tuned})) or "-")],
        arms, ref_speed, [100, 400])
    lines += s_lines

    nove = stage["no_value_embeds"]
    head022 = earlier["recipe_head022"]
    arms = [("recipe_head022_no_ve", "the recipe with head lr 0.22, no value embeddings",
             by_arm(nove, "recipe_head022_no_ve")),
            ("recipe_head022", EARLIER["recipe_head022"][1] + " (`%s`)" %
             EARLIER["recipe_head022"][0], head022),
            ("speedrun_cpu", "speedrun_cpu to the end (stage 2)", speed)]
    s_lines, out["no_value_embeds"] = arms_section(
        "3. the head-lr recipe without value embeddings",
        ["Does the value table's overfitting cost the recipe? The same config and seeds as the "
         "committed head-lr runs with `model.value_embeds=0` (its 6.4 M parameters gone)."],
        arms, [("recipe_head022", head022), ("speedrun_cpu", speed)], [100, 400], params=True)
    lines += s_lines

    under = stage["under_epoch"]
    u_speed = by_arm(under, "speedrun_cpu")
    intro = ["Both configs on a budget under one epoch of Brown's training split, each on its "
             "own schedule for that budget (warm-up 10, linear cool-down over the last 40%)."]
    if under:
        r0 = under[0]
        intro = ["%d steps x %d tokens = %d tokens, %d of the epoch's %d sequences (%.1f%%): no "
                 "training sequence is seen twice; each config on its own schedule for that "
                 "budget (warm-up 10, linear cool-down over the last 40%%)." % (
                     r0["steps"], r0["batch_tokens"], r0["steps"] * r0["batch_tokens"],
                     r0["steps"] * r0["batch_tokens"] // r0["seq_len"], r0["epoch_sequences"],
                     100.0 * r0["epoch_fraction"])]
    arms = [("speedrun_cpu", "speedrun_cpu", u_speed),
            ("recipe_tuned", what_of(by_arm(under, "recipe_tuned"), "the tuned recipe"),
             by_arm(under, "recipe_tuned"))]
    s_lines, out["under_epoch"] = arms_section(
        "4. under one epoch", intro, arms, [("speedrun_cpu", u_speed)], [100, 400])
    lines += s_lines

    probes = stage["probes"]
    p_speed = by_arm(probes, "speedrun_cpu")
    p_recipe = by_arm(probes, "recipe")
    names = ["speedrun_cpu", "speedrun_cpu_sigmoid", "recipe", "recipe_random_head",
             "recipe_head022", "recipe_tanh"]
    arms = [(n, what_of(by_arm(probes, n), n), by_arm(probes, n)) for n in names]
    steps = sorted({r["steps"] for r in probes})
    s_lines, out["probes"] = arms_section(
        "5. the per-key probes behind the causal story",
        ["The short-schedule probes of docs/records.md (%s, its own schedule), now over %s: "
         "the keys named as the cause of the recipe's gap (the sigmoid cap at speedrun_cpu's "
         "head lr 0.008) switched one at a time on each side." % (
             "%s steps" % ", ".join(map(str, steps)) if steps else "the probe steps",
             "seeds " + ", ".join(str(s) for s in sorted({r["seed"] for r in probes}))
             if probes else "the report seeds")],
        arms, [("speedrun_cpu", p_speed), ("recipe", p_recipe)], [100])
    lines += s_lines

    text = "\n".join(lines).rstrip() + "\n"
    with open(os.path.join(root, "tables.md"), "w") as f:
        f.write(text)
    with open(os.path.join(root, "tables.json"), "w") as f:
        json.dump(out, f, indent=1)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 usage=__doc__.splitlines()[2].strip()[7:])
    ap.add_argument("root")
    ap.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    a = ap.parse_args()
    if not os.path.isdir(a.root):
        sys.exit("recipe_study_tables: %s: no such folder" % a.root)
    try:
        text = write_tables(a.root)
    except (runlog.RunLogError, OSError, ValueError, KeyError) as e:
        sys.exit("recipe_study_tables: %s" % e)
    if not a.quiet:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
