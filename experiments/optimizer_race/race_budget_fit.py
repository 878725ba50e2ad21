#!/usr/bin/python3
"""The optimizer race's speedups by Wen et al.'s budget method (issue 50), from the runs' results.

usage: race_budget_fit.py --adamw DIR[=SEED] [DIR[=SEED] ...] --race DIR [--families muon,normuon,...]
                          [--tune-seed 1000] [--race-tune-seed 1337] [--seeds 1337,1338,1339]
                          [--out PREFIX] [--bootstrap 10000]

--adamw names tuned AdamW's folders, one per budget (experiments/optimizer_race/race_budgets.sh: every run trains its
whole budget on its own schedule); --race the race of the other families at one of those budgets
(experiments/optimizer_race/optimizer_race.py --target budget). In each folder a family's learning rate is the one
with the lowest final validation loss among its runs at the tuning seed (--tune-seed for AdamW's
folders, or the SEED after a folder's name; --race-tune-seed for the race's), and its reported
runs are that rate's runs at --seeds.
A folder's budget is the step of its runs' last validation.

AdamW's final loss against its budget, L(B), is the mean over the reported seeds at each budget,
joined piecewise linearly in log B: it goes through every measured point and assumes nothing about
the curve's shape between them (with three budgets a three-parameter law a + b B^-c has no
degree of freedom left to check its shape, and it is given beside as a check). Beyond the
largest or below the smallest budget the end segment is extended, and such a speedup is marked
as extrapolated. A family's speedup is B_AdamW(L_family) / B, the AdamW budget whose fitted loss
equals the family's mean final loss at the race's budget B, over B. Its interval is a bootstrap
over seeds (each group's seeds resampled with replacement, the fit and the speedup recomputed;
the 2.5 and 97.5 percentiles; with three seeds per group a rough one). Beside it: the difference
of final losses from AdamW's at the race's budget, mean and the spread of each, and Welch's
t-test on the seeds' final losses (two-sided), with a paired t-test beside it (a seed fixes the
initial weights and the data order in every family, so the seeds pair up and the pairing removes
their shared part of the spread); and the earlier crossing method (steps at which a
family's validation curve first reaches tuned AdamW's worst seed's final loss, interpolated
between validations, against AdamW's own steps to it).

A second table reads the speedup three ways (L(B) linear in B, linear in log B, the power law)
with an interval spanning them (the bootstraps of the two piecewise curves and the power law's
value), and gives Welch's, the pooled (Student's) and the paired test's p with Holm's correction
over the families raced, so a claim of significance holds for the family of comparisons made.

Writes PREFIX.md and PREFIX.json (default: the race folder's budget_fit.{md,json}) and prints
the table.
"""
import argparse
import fnmatch
import glob
import json
import math
import os
import statistics
import sys

import numpy as np
from scipy import optimize, stats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import runpack  # noqa: E402
from optimizer_race import scored  # noqa: E402  the crossing, interpolated as the race does it


def load_runs(folder):
    """Every finished run of a folder, in run-name order: {family: [result, ...]} (a run's
    result.json, from its folder or from the folder's runs.jsonl.xz, with its budget)."""
    results = {name: rec["result"] for name, rec in runpack.read(os.path.join(folder, runpack.FILE)).items()
               if fnmatch.fnmatch(name, "*_lr*_seed*") and "result" in rec}
    for path in glob.glob(os.path.join(folder, "*_lr*_seed*", "result.json")):
        results[os.path.basename(os.path.dirname(path))] = json.load(open(path))
    runs = {}
    for name in sorted(results):
        r, path = results[name], os.path.join(folder, name)
        if not r.get("val_curve"):
            sys.exit("race_budget_fit: %s: no validation curve" % path)
        r["budget"] = r["val_curve"][-1][0]
        runs.setdefault(r["family"], []).append(r)
    return runs


def tuned(runs, family, tune_seed, seeds, folder):
    """((tuned lr, its embed/head factor), the sweep at the tuning seed, the reported runs at that
    pair) of one family (a run without an "eh" is at factor 1: races without --embed-head-factors)."""
    sweep = sorted((r for r in runs.get(family, []) if r["seed"] == tune_seed), key=lambda r: r["lr"])
    if not sweep:
        sys.exit("race_budget_fit: %s: no %s run at the tuning seed %d" % (folder, family, tune_seed))
    top = min(sweep, key=lambda r: r["final_val_loss"])
    best = (top["lr"], top.get("eh", 1.0))
    reported = sorted((r for r in runs[family] if (r["lr"], r.get("eh", 1.0)) == best and r["seed"] in seeds),
                      key=lambda r: r["seed"])
    if not reported:
        sys.exit("race_budget_fit: %s: no %s run at lr %g, embed/head x%g at the seeds %s" % ((folder, family) + best + (seeds,)))
    return best, sweep, reported


def setting(lr_eh):
    """A tuned (lr, embed/head factor) as the tables write it."""
    lr, eh = lr_eh
    return "%g" % lr if eh == 1.0 else "%g, embed/head x%g" % (lr, eh)


def mean_sd(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else float("nan"))


def budget_for_loss(budgets, losses, loss, in_log=True):
    """The budget at which the piecewise linear L(B) through (budgets, losses), linear in log B
    (in_log) or in B, equals loss, and whether it lies outside the measured budgets (the end
    segment extended). None where the curve does not fall there (a flat or rising segment)."""
    if len(budgets) < 2:
        return None, False
    to_x, from_x = (math.log, math.exp) if in_log else (float, float)
    logb = [to_x(b) for b in budgets]
    for i in range(len(budgets) - 1):
        hi, lo = losses[i], losses[i + 1]
        if hi > lo and lo <= loss <= hi:  # inside a falling segment: interpolate
            return from_x(logb[i] + (hi - loss) / (hi - lo) * (logb[i + 1] - logb[i])), False
    i = 0 if loss > losses[0] else len(budgets) - 2  # above the first point or below the last
    hi, lo = losses[i], losses[i + 1]
    if not hi > lo or losses[0] >= loss >= losses[-1]:
        return None, False
    x = logb[i] + (hi - loss) / (hi - lo) * (logb[i + 1] - logb[i])
    return (from_x(x), True) if in_log or x > 0 else (None, True)


def power_law(budgets, losses):
    """(a, b, c) of L(B) = a + b B^-c through the points (least squares, b > 0, c > 0), or None."""
    if len(budgets) < 3:
        return None
    x, y = np.array(budgets, float), np.array(losses, float)
    try:
        p, _ = optimize.curve_fit(lambda B, a, b, c: a + b * B ** -c, x, y, p0=(y.min() - 0.1, 10.0, 0.5),
                                  bounds=([-np.inf, 0, 1e-3], [np.inf, np.inf, 10]), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    return tuple(float(v) for v in p)


def power_law_budget(p, loss):
    """The budget where a + b B^-c equals loss, or None (loss at or below the asymptote a)."""
    a, b, c = p
    return (b / (loss - a)) ** (1 / c) if loss > a else None


def welch(xs, ys):
    """Welch's two-sided t-test of two samples: (t, degrees of freedom, p)."""
    t = stats.ttest_ind(xs, ys, equal_var=False)
    vx, vy = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    dof = (vx + vy) ** 2 / (vx ** 2 / (len(xs) - 1) + vy ** 2 / (len(ys) - 1))
    return float(t.statistic), dof, float(t.pvalue)


def pooled(xs, ys):
    """Student's two-sided t-test of two samples with the variances pooled: (t, p)."""
    t = stats.ttest_ind(xs, ys, equal_var=True)
    return float(t.statistic), float(t.pvalue)


def holm(ps):
    """Holm's step-down adjustment of a family of p-values (None stays None): each adjusted p is
    the running maximum of (m - k) p_(k) over the sorted p's, at most 1; the family-wise error
    rate of rejecting where the adjusted p < alpha is at most alpha."""
    known = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out, running = [None] * len(ps), 0.0
    for k, (p, i) in enumerate(known):
        running = max(running, min(1.0, (len(known) - k) * p))
        out[i] = running
    return out


def paired(xs, ys):
    """A paired two-sided t-test of two samples matched by position: (t, p)."""
    t = stats.ttest_rel(xs, ys)
    return float(t.statistic), float(t.pvalue)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adamw", nargs="+", required=True, metavar="DIR")
    ap.add_argument("--race", required=True, metavar="DIR")
    ap.add_argument("--families", default="muon,normuon,soap,rekls")
    ap.add_argument("--tune-seed", type=int, default=1000)
    ap.add_argument("--race-tune-seed", type=int, default=1337)
    ap.add_argument("--seeds", default="1337,1338,1339")
    ap.add_argument("--bootstrap", type=int, default=10000)
    ap.add_argument("--out", default=None, metavar="PREFIX")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s]
    families = [f for f in a.families.split(",") if f]

    # Tuned AdamW at each budget.
    adamw = []
    for item in a.adamw:
        folder, _, seed = item.partition("=")
        try:
            tune_seed = int(seed) if seed else a.tune_seed
        except ValueError:
            ap.error("--adamw: %r is not DIR or DIR=SEED" % item)
        runs = load_runs(folder)
        lr, sweep, reported = tuned(runs, "adamw", tune_seed, seeds, folder)
        budgets = {r["budget"] for r in sweep + reported}
        if len(budgets) != 1:
            sys.exit("race_budget_fit: %s: runs of different budgets %s" % (folder, sorted(budgets)))
        adamw.append({"folder": folder, "tune_seed": tune_seed, "budget": budgets.pop(), "lr": lr[0], "eh": lr[1],
                      "sweep": sweep,
                      "runs": reported})
    adamw.sort(key=lambda x: x["budget"])
    if len({x["budget"] for x in adamw}) != len(adamw):
        sys.exit("race_budget_fit: two AdamW folders of the same budget")
    budgets = [x["budget"] for x in adamw]
    curve = [statistics.mean(r["final_val_loss"] for r in x["runs"]) for x in adamw]
    law = power_law(budgets, curve)

    race = load_runs(a.race)
    race_budget = {r["budget"] for f in families for r in race.get(f, [])}
    if len(race_budget) != 1:
        sys.exit("race_budget_fit: %s: the families' runs have budgets %s, not one" % (a.race, sorted(race_budget)))
    B = race_budget.pop()
    base = next((x for x in adamw if x["budget"] == B), None)
    if base is None:
        sys.exit("race_budget_fit: no AdamW folder at the race's budget %d (have %s)" % (B, budgets))
    base_final = [r["final_val_loss"] for r in base["runs"]]
    target = max(base_final)  # the crossing method's target: tuned AdamW's worst seed's final loss
    base_steps = [scored(r, target)["target_step"] for r in base["runs"]]

    rng = np.random.default_rng(0)
    rows = []
    for family in families:
        lr, sweep, reported = tuned(race, family, a.race_tune_seed, seeds, a.race)
        final = [r["final_val_loss"] for r in reported]
        m = statistics.mean(final)
        budget, extrapolated = budget_for_loss(budgets, curve, m)
        budget_lin, _ = budget_for_loss(budgets, curve, m, in_log=False)
        # Bootstrap over seeds: every group's seeds resampled, the curve and the speedup recomputed
        # (the same resamples read through the curve linear in log B and linear in B).
        boot, boot_lin, undefined = [], [], 0
        for _ in range(a.bootstrap):
            c = [float(np.mean(rng.choice([r["final_val_loss"] for r in x["runs"]], len(x["runs"])))) for x in adamw]
            fm = float(np.mean(rng.choice(final, len(final))))
            bb, _ = budget_for_loss(budgets, c, fm)
            if bb is None:
                undefined += 1
            else:
                boot.append(bb / B)
            bl, _ = budget_for_loss(budgets, c, fm, in_log=False)
            if bl is not None:
                boot_lin.append(bl / B)
        lo, hi = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))) if boot else (None, None)
        t, dof, p = welch(final, base_final) if len(final) > 1 and len(base_final) > 1 else (None, None, None)
        by_seed = {r["seed"]: r["final_val_loss"] for r in base["runs"]}
        common = [r["seed"] for r in reported if r["seed"] in by_seed]
        pt, pp = paired([r["final_val_loss"] for r in reported if r["seed"] in by_seed],
                        [by_seed[s] for s in common]) if len(common) > 1 else (None, None)
        crossing = [scored(r, target)["target_step"] for r in reported]
        hit = [s for s in crossing if s is not None]
        law_budget = power_law_budget(law, m) if law else None
        # The speedup as each interpolant of L(B) reads it, and the interval widened to all of them:
        # the log-B bootstrap's, the linear-B bootstrap's, and the power law's point (its own
        # bootstrap would refit the law 10^4 times; with three budgets it has no spare degree of
        # freedom, so it is one more reading of the same three points, not a tighter one).
        readings = [x / B for x in (budget_lin, budget, law_budget) if x is not None]
        ends = [e for e in (lo, hi) if e is not None]
        if boot_lin:
            ends += [float(np.percentile(boot_lin, 2.5)), float(np.percentile(boot_lin, 97.5))]
        span = (min(ends + readings), max(ends + readings)) if ends else (None, None)
        pt_pooled, p_pooled = pooled(final, base_final) if len(final) > 1 and len(base_final) > 1 else (None, None)
        rows.append({
            "family": family, "lr": lr[0], "eh": lr[1], "seeds": [r["seed"] for r in reported], "final": final,
            "final_mean_sd": mean_sd(final), "delta": m - statistics.mean(base_final),
            "t": t, "dof": dof, "p": p, "paired_seeds": common, "paired_t": pt, "paired_p": pp,
            "adamw_budget": budget, "extrapolated": extrapolated,
            "speedup": budget / B if budget else None, "speedup_ci95": (lo, hi),
            "speedup_linear_b": budget_lin / B if budget_lin else None, "speedup_span": span,
            "pooled_t": pt_pooled, "pooled_p": p_pooled,
            "bootstrap_undefined": undefined, "power_law_speedup": law_budget / B if law_budget else None,
            "crossing_steps": crossing, "crossing_reached": len(hit),
            "crossing_speedup": statistics.mean(base_steps) / statistics.mean(hit) if hit else None,
            "sweep": [(r["lr"], r.get("eh", 1.0), r["final_val_loss"]) for r in sweep]})

    # Holm's correction over the families raced against AdamW here, for each test.
    for key in ("p", "pooled_p", "paired_p"):
        for r, adjusted in zip(rows, holm([r[key] for r in rows])):
            r[key + "_holm"] = adjusted

    def fmt(v, f="%.2f"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f % v

    L = ["Tuned AdamW against its budget (learning rate: the lowest final val loss of the sweep at the "
         "tuning seed; final val loss: mean ± standard deviation over the seeds %s):" % a.seeds, "",
         "| budget (steps) | tuning seed | tuned lr [embed/head factor] (sweep, lr: final val loss) | seeds | final val loss |",
         "|---|---|---|---|---|"]
    for x in adamw:
        f = mean_sd([r["final_val_loss"] for r in x["runs"]])
        L.append("| %d | %d | %s (%s) | %d | %.4f ± %s |" % (
            x["budget"], x["tune_seed"], setting((x["lr"], x["eh"])),
            "; ".join("%s: %.4f" % (setting((r["lr"], r.get("eh", 1.0))), r["final_val_loss"]) for r in x["sweep"]),
            len(x["runs"]), f[0], fmt(f[1], "%.4f")))
    L += ["", "L(B): the seed means joined linearly in log B%s." % (
        "; the power law through them: L = %.4f + %.4g B^-%.4f" % law if law else
        " (no power law: fewer than three budgets or no fit)"), ""]
    L += ["Each family at %d steps against it (the race's runs, learning rate picked on seed %d; Δ: the "
          "family's mean final val loss minus tuned AdamW's at %d steps, %.4f; speedup: the AdamW budget "
          "whose L(B) equals the family's mean final loss, over %d; * extrapolated past the measured "
          "budgets %d-%d; crossing: steps to %.4f, tuned AdamW's worst seed's final loss, AdamW taking "
          "%.1f):" % (B, a.race_tune_seed, B, statistics.mean(base_final), B, budgets[0], budgets[-1], target,
                      statistics.mean(base_steps)), "",
          "| family | lr | seeds | final val loss | Δ vs AdamW | Welch t (dof), p | paired t, p | AdamW budget | "
          "speedup (budget) | 95% bootstrap | power law | speedup (crossing) | reached |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append("| %s | %s | %d | %.4f ± %s | %+.4f | %s | %s | %s | %s%s | %s | %s | %s | %d of %d |" % (
            r["family"], setting((r["lr"], r["eh"])), len(r["final"]), r["final_mean_sd"][0], fmt(r["final_mean_sd"][1], "%.4f"),
            r["delta"], "%.2f (%.1f), %.2g" % (r["t"], r["dof"], r["p"]) if r["p"] is not None else "-",
            "%.2f, %.2g" % (r["paired_t"], r["paired_p"]) if r["paired_p"] is not None else "-",
            fmt(r["adamw_budget"], "%.0f"), fmt(r["speedup"]), "*" if r["extrapolated"] else "",
            "%.2f-%.2f" % r["speedup_ci95"] if r["speedup_ci95"][0] is not None else "-",
            fmt(r["power_law_speedup"]), fmt(r["crossing_speedup"]), r["crossing_reached"], len(r["final"])))
    L += ["", "The speedup as each reading of L(B) gives it, and the tests with Holm's correction over the "
          "%d families (adjusted p; a family-wise error rate of 5%% rejects where it is below 0.05). The "
          "interval spans every reading: the 95%% bootstraps of the curves linear in B and in log B "
          "and the power law's value:" % len(rows), "",
          "| family | speedup: linear in B / linear in log B / power law | interval over the readings | "
          "Welch p (Holm) | pooled t, p (Holm) | paired p (Holm) |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        L.append("| %s | %s / %s / %s | %s | %s (%s) | %s | %s (%s) |" % (
            r["family"], fmt(r["speedup_linear_b"]), fmt(r["speedup"]), fmt(r["power_law_speedup"]),
            "%.2f-%.2f" % r["speedup_span"] if r["speedup_span"][0] is not None else "-",
            fmt(r["p"], "%.2g"), fmt(r["p_holm"], "%.2g"),
            "%.2f, %.2g (%.2g)" % (r["pooled_t"], r["pooled_p"], r["pooled_p_holm"]) if r["pooled_p"] is not None else "-",
            fmt(r["paired_p"], "%.2g"), fmt(r["paired_p_holm"], "%.2g")))
    prefix = a.out or os.path.join(a.race, "budget_fit")
    json.dump({"budgets": budgets, "adamw_curve": curve, "power_law": law, "race_budget": B, "target": target,
               "adamw": [{k: x[k] for k in ("folder", "tune_seed", "budget", "lr", "eh")} |
                         {"final": [r["final_val_loss"] for r in x["runs"]], "seeds": [r["seed"] for r in x["runs"]]}
                         for x in adamw],
               "rows": rows}, open(prefix + ".json", "w"), indent=1)
    open(prefix + ".md", "w").write("\n".join(L) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
