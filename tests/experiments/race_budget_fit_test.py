#!/usr/bin/python3
"""experiments/optimizer_race/race_budget_fit.py's arithmetic on synthetic runs whose answers are known.

AdamW's final loss follows L(B) = 3 + 10 B^-0.5 at budgets 100, 200 and 400 (seed means; the
seeds at -0.01, 0, +0.01), tuned on a seed that is not reported, with a decoy: a reported seed
at another lr that ends lower (picking on the reported seeds would take it). Every validation
curve is a straight line from 10 at step 0 to its final loss, so the crossing is exact. Families at
budget 100: one ending at L(200) (speedup 2), one between L(100) and L(200) (log-linear
interpolation), one below L(400) and one above L(100) (extrapolated, marked). Checked: the tuned lr,
the speedups (linear in log B and in B), the power law and the interval spanning them, Welch's,
the pooled and the paired t, Holm's correction, the crossing speedup, the bootstrap interval around the
point, a folder's own tuning seed (DIR=SEED), and the error for a family with no run at the
tuning seed.

    race_budget_fit_test.py REPO WORK
"""
import json
import math
import os
import shutil
import subprocess
import sys

repo, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
STEP = 10


def L(b):
    return 3 + 10 * b ** -0.5


def write(folder, family, lr, seed, budget, final):
    run = os.path.join(work, folder, "%s_lr%g_seed%d" % (family, lr, seed))
    os.makedirs(run)
    curve = [[s, 10.0 * s, 10 - (10 - final) * s / budget] for s in range(0, budget + 1, STEP)]
    json.dump({"final_val_loss": final, "val_curve": curve, "family": family, "lr": lr, "seed": seed},
              open(os.path.join(run, "result.json"), "w"))


offsets = {1: -0.01, 2: 0.0, 3: 0.01}
for b in (100, 200, 400):
    folder = "adamw%d" % b
    for lr, extra in ((0.001, 0.05), (0.002, 0.0), (0.004, 0.03)):
        write(folder, "adamw", lr, 1000, b, L(b) + extra)  # the tuning seed: 0.002 is best
    for seed, off in offsets.items():
        write(folder, "adamw", 0.002, seed, b, L(b) + off)
    write(folder, "adamw", 0.004, 1, b, L(b) - 0.2)  # the decoy: a reported seed, not the tuned lr
means = {"fast": L(200), "mid": 3.85, "far": 3.45, "slow": 4.1}
for family, m in means.items():
    for lr, extra in ((0.01, 0.0), (0.02, 0.04)):
        write("race", family, lr, 1, 100, m + offsets[1] + extra)  # tuned on seed 1 (the race's way)
    for seed in (2, 3):
        write("race", family, 0.01, seed, 100, m + offsets[seed] * 2)


def fit(*extra):
    return subprocess.run(["/usr/bin/python3", os.path.join(repo, "experiments/optimizer_race/race_budget_fit.py"), "--adamw"] +
                          [os.path.join(work, "adamw%d" % b) for b in (400, 100, 200)] +
                          ["--race", os.path.join(work, "race"), "--families", "fast,mid,far,slow",
                           "--tune-seed", "1000", "--race-tune-seed", "1", "--seeds", "1,2,3",
                           "--bootstrap", "2000", "--out", os.path.join(work, "fit")] + list(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


p = fit()
assert p.returncode == 0, p.stdout
out = json.load(open(os.path.join(work, "fit.json")))
assert out["budgets"] == [100, 200, 400], out["budgets"]
assert [x["lr"] for x in out["adamw"]] == [0.002] * 3, "AdamW not tuned on the tuning seed: %s" % out["adamw"]
for got, b in zip(out["adamw_curve"], (100, 200, 400)):
    assert abs(got - L(b)) < 1e-12, (got, L(b))
a, b, c = out["power_law"]
assert abs(a - 3) < 1e-3 and abs(b - 10) < 1e-2 and abs(c - 0.5) < 1e-3, out["power_law"]
rows = {r["family"]: r for r in out["rows"]}
log2 = math.log(2)


def between(budget, hi, lo, loss):  # log-linear between budget and 2 * budget
    return budget * math.exp((hi - loss) / (hi - lo) * log2)


# The family means: seed 1 at m - 0.01, seeds 2 and 3 at m + 0 and m + 0.02.
fam_mean = {f: m + (-0.01 + 0.0 + 0.02) / 3 for f, m in means.items()}
want = {"fast": (between(100, L(100), L(200), fam_mean["fast"]), False),
        "mid": (between(100, L(100), L(200), fam_mean["mid"]), False),
        "far": (between(200, L(200), L(400), fam_mean["far"]), True),
        "slow": (between(100, L(100), L(200), fam_mean["slow"]), True)}
for f, (budget, extrapolated) in want.items():
    r = rows[f]
    assert r["lr"] == 0.01, (f, r["lr"])
    assert abs(r["adamw_budget"] - budget) < 1e-9, (f, r["adamw_budget"], budget)
    assert abs(r["speedup"] - budget / 100) < 1e-12 and r["extrapolated"] == extrapolated, (f, r)
    assert abs(r["power_law_speedup"] - ((10 / (fam_mean[f] - 3)) ** 2) / 100) < 1e-2, (f, r["power_law_speedup"])
    # Welch's t from its formula: the difference of means over the root of the summed variances of the means.
    xs = [means[f] - 0.01, means[f], means[f] + 0.02]
    ys = [L(100) + o for o in offsets.values()]
    mx, my = sum(xs) / 3, sum(ys) / 3
    vx, vy = sum((x - mx) ** 2 for x in xs) / 2, sum((y - my) ** 2 for y in ys) / 2
    assert abs(r["t"] - (mx - my) / math.sqrt(vx / 3 + vy / 3)) < 1e-9, (f, r["t"])
    assert abs(r["delta"] - (mx - my)) < 1e-12
    # The paired t: the mean of the seed-by-seed differences over its standard error.
    d = [x - y for x, y in zip(xs, ys)]
    md = sum(d) / 3
    assert abs(r["paired_t"] - md / math.sqrt(sum((v - md) ** 2 for v in d) / 2 / 3)) < 1e-9, (f, r["paired_t"])
    # The crossing: straight curves reach the target (AdamW's worst final, L(100) + 0.01) at
    # 100 (10 - target) / (10 - final).
    target = L(100) + 0.01
    steps = lambda final: 100 * (10 - target) / (10 - final)
    if max(xs) <= target:
        want_x = sum(steps(y) for y in ys) / 3 / (sum(steps(x) for x in xs) / 3)
        assert abs(r["crossing_speedup"] - want_x) < 1e-9 and r["crossing_reached"] == 3, (f, r, want_x)
    # Linear in B between the bracketing budgets, and the pooled t from its formula.
    b0 = 200 if f == "far" else 100
    lin = b0 + (L(b0) - fam_mean[f]) / (L(b0) - L(2 * b0)) * b0
    assert abs(r["speedup_linear_b"] - lin / 100) < 1e-9, (f, r["speedup_linear_b"], lin / 100)
    sp = math.sqrt((vx + vy) / 2 * (2 / 3))
    assert abs(r["pooled_t"] - (mx - my) / sp) < 1e-9, (f, r["pooled_t"])
    span = r["speedup_span"]
    assert span[0] <= min(r["speedup"], r["speedup_linear_b"], r["power_law_speedup"]) and \
        span[1] >= max(r["speedup"], r["speedup_linear_b"], r["power_law_speedup"]), (f, span)
# Holm: the smallest p times 4, the next times 3 (at least the one before), ...
ps = sorted((rows[f]["p"], f) for f in rows)
running = 0
for k, (p, f) in enumerate(ps):
    running = max(running, min(1.0, (4 - k) * p))
    assert abs(rows[f]["p_holm"] - running) < 1e-15, (f, rows[f]["p_holm"], running)
lo, hi = rows["fast"]["speedup_ci95"]
assert lo < rows["fast"]["speedup"] < hi, rows["fast"]["speedup_ci95"]
assert rows["slow"]["crossing_reached"] == 0 and rows["slow"]["crossing_speedup"] is None
md = open(os.path.join(work, "fit.md")).read()
assert "| far | 0.01 | 3 |" in md and "*" in md.split("| far |")[1].split("\n")[0], md
print("PASS: tuned lr, log-linear and linear speedups (2 extrapolated), power law, the span over "
      "them, Welch, pooled and paired t, Holm's correction, crossing")

# DIR=SEED tunes that folder on another seed: on seed 1, budget 100 takes the decoy lr 0.004.
p = fit("--adamw", os.path.join(work, "adamw100") + "=1", *(os.path.join(work, "adamw%d" % b) for b in (200, 400)))
assert p.returncode == 0, p.stdout
first = json.load(open(os.path.join(work, "fit.json")))["adamw"][0]
assert (first["tune_seed"], first["lr"], first["final"]) == (1, 0.004, [L(100) - 0.2]), first
print("PASS: a folder's own tuning seed")

# An embed/head factor (optimizer_race.py --embed-head-factors): a run at lr 0.01 and factor 2 that
# ends lowest at the tuning seed is the pick, and the reported runs are that pair's, not lr 0.01's
# at factor 1 (which would give "far" its mean of 3.45).
def write_eh(family, lr, eh, seed, final):
    run = os.path.join(work, "race", "%s_lr%g_eh%g_seed%d" % (family, lr, eh, seed))
    os.makedirs(run)
    json.dump({"final_val_loss": final, "val_curve": [[0, 0.0, 10.0], [100, 1e3, final]], "family": family,
               "lr": lr, "eh": eh, "seed": seed}, open(os.path.join(run, "result.json"), "w"))


for seed in (1, 2, 3):
    write_eh("far", 0.01, 2.0, seed, 3.3 + offsets[seed])
p = fit()
assert p.returncode == 0, p.stdout
far = {r["family"]: r for r in json.load(open(os.path.join(work, "fit.json")))["rows"]}["far"]
assert (far["lr"], far["eh"], far["seeds"]) == (0.01, 2.0, [1, 2, 3]), far
assert abs(far["final_mean_sd"][0] - 3.3) < 1e-12, far["final_mean_sd"]
assert "| far | 0.01, embed/head x2 |" in open(os.path.join(work, "fit.md")).read()
print("PASS: the embed/head factor is part of the pick")

# A family with no run at the tuning seed is an error that names the folder and the family.
shutil.rmtree(os.path.join(work, "race", "mid_lr0.01_seed1"))
shutil.rmtree(os.path.join(work, "race", "mid_lr0.02_seed1"))
p = fit()
assert p.returncode != 0 and "no mid run at the tuning seed 1" in p.stdout and "race" in p.stdout, p.stdout
print("PASS: a family with no tuning run is refused by name")
