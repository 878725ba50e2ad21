#!/usr/bin/python3
"""experiments/forgetting/forgetting_frontier.py's comparisons on synthetic runs whose answers are known.

One seed pair (2 seeds, identical runs but for a shift, so the paired tests are defined). AdamW's
points lie on forgetting = gain - 1 (a straight frontier: interpolation is exact). OSFT ratio 0.5
lies 0.01 below that line at every point; ratio 0.25 has one point 0.0006 more gain than 0.5's
middle point and far more forgetting, which survives the pooled Pareto cut. Checked: each ratio
against AdamW (-0.01 everywhere for ratio 0.5), both ratios together as the lower envelope of their
frontiers (never above ratio 0.5's own frontier, where the pooled points joined by lines would
bend above it), the ratio of the means beside the mean of the ratios, and the matched-lr table
(OSFT minus AdamW at the same lr and seed, without interpolation), and each OSFT run against its
own seed's AdamW frontier at the run's gain (ratio 0.25's first point lies inside AdamW's gains:
0.30 against 0.12 plus the seed's shift; each ratio 0.5 point 0.01 below the line).

    forgetting_frontier_test.py REPO WORK
"""
import json
import os
import shutil
import subprocess
import sys

repo, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
PRE_FT = 5.0  # the pretrained model's loss on the fine-tuning split
rows = [["run", "method", "urr", "lr", "seed", "brown_informative", "brown_imaginative", "seconds"],
        ["pretrained", "pretrained", "-", "-", "-", "4.0", str(PRE_FT), "0"]]
for seed, shift in ((1, 0.0), (2, 0.002)):
    def add(method, urr, lr, gain, forgetting):
        rows.append(["%s_%s_%s_seed%d" % (method, urr, lr, seed), method, urr, lr, str(seed),
                     repr(4.0 + forgetting + shift), repr(PRE_FT - gain), "1"])
    for lr, gain in (("1e-4", 1.1), ("3e-4", 1.2), ("1e-3", 1.3), ("3e-3", 1.4)):
        add("adamw", "-", lr, gain, gain - 1.0)
    for lr, gain in (("1e-4", 1.15), ("3e-4", 1.25), ("1e-3", 1.35)):
        add("osft", "0.5", lr, gain, gain - 1.0 - 0.01)
    add("osft", "0.25", "1e-4", 1.12, 0.30)
    add("osft", "0.25", "3e-4", 1.2506, 0.2496)  # a hair more gain than 0.5's middle point
with open(os.path.join(work, "runs.tsv"), "w") as f:
    f.write("".join("\t".join(r) + "\n" for r in rows))
subprocess.run(["/usr/bin/python3", os.path.join(repo, "experiments/forgetting/forgetting_frontier.py"),
                work, "--no-plot", "--levels", "5"], check=True, stdout=subprocess.DEVNULL)
doc = json.load(open(os.path.join(work, "frontier.json")))
c = doc["comparisons"]
for v in c["osft urr 0.5"]["levels"]:
    assert abs(v["difference"] + 0.01) < 1e-9, v
    assert abs(v["ratio_of_means"] - v["osft"] / v["adamw"]) < 1e-12, v
for v in c["osft (all ratios)"]["levels"]:
    own = v["gain"] - 1.0 - 0.01 + 0.001  # ratio 0.5's frontier, mean over the two seeds
    if 1.15 <= v["gain"] <= 1.35:
        assert v["osft"] <= own + 1e-9, ("the envelope lies above ratio 0.5's frontier", v)
m = {x["lr"]: x for x in doc["at_matched_lr"]["osft urr 0.5"]}
assert sorted(m) == [1e-4, 3e-4, 1e-3], sorted(m)
for lr, x in m.items():
    assert abs(x["gain_difference"] - 0.05) < 1e-9 and abs(x["forgetting_difference"] - (0.05 - 0.01)) < 1e-9, x
for x in doc["on_adamw_frontier"]["osft urr 0.5"]:
    shift = 0.002 if x["seed"] == 2 else 0.0  # the seed's own line
    assert abs(x["adamw_at_gain"] - (x["gain"] - 1.0 + shift)) < 1e-9, x
    assert abs(x["forgetting"] - (x["adamw_at_gain"] - 0.01)) < 1e-9, x
    assert abs(x["ratio"] - x["forgetting"] / x["adamw_at_gain"]) < 1e-12, x
quarter = [x for x in doc["on_adamw_frontier"]["osft urr 0.25"] if x["lr"] == 1e-4]
assert len(quarter) == 2 and all(abs(x["adamw_at_gain"] - 0.12 - (0.002 if x["seed"] == 2 else 0)) < 1e-9
                                  for x in quarter), quarter
md = open(os.path.join(work, "frontier.md")).read()
assert "At the same lr, osft urr 0.5 against AdamW" in md and "ratio of the means" in md, md
assert "against its own seed's AdamW frontier" in md, md
print("PASS: each ratio at equal gain, the lower envelope of both, the ratio of the means, the matched lr, "
      "each run on its seed's AdamW frontier")
