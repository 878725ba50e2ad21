#!/usr/bin/python3
"""The forgetting-versus-gain frontier of experiments/forgetting/forgetting.sh's grid (issue 38).

    forgetting_frontier.py OUT [--pretrain-steps N] [--finetune-steps N] [--np N] [--elapsed S] [--no-plot]

Reads OUT/runs.tsv (one row per fine-tuning run: method, unfreeze_rank_ratio, lr, seed and the
whole-split validation losses of both splits; a first row for the pretrained model) and writes
OUT/frontier.json, OUT/frontier.md and OUT/frontier.png. The two loss columns (the sixth and
seventh) are the pretraining split's and the fine-tuning split's, each headed by its split's name
(an older header's informative / imaginative read as brown_informative / brown_imaginative).

Per run: gain = the drop of the fine-tuning split's validation loss, forgetting = the rise of the
pretraining split's, both against the pretrained model. When the two splits are one (the control:
fine-tuning on the pretraining split itself), gain is minus forgetting and only the forgetting of
each configuration, what re-warming the lr costs alone, is reported. A method's frontier is its Pareto set (no
other run of the method has as much gain and less forgetting) joined by straight lines, forgetting
as a function of gain. Methods are compared at equal gain by interpolating along their frontiers
at gains both reach, seed by seed (each seed's runs make its own frontiers), never by one picked
pair; the table gives the mean over seeds and half their range, and the two-sided p of a paired
t-test of the per-seed differences against 0 (each seed pairs the two methods on its own data
order; with 3 seeds, 2 degrees of freedom).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import figures  # noqa: E402


def frontier(points):
    """The Pareto set of (gain, forgetting) points, by increasing gain: each point has more gain
    than the one before and forgets more (else the one before would not be on it)."""
    best = []
    for g, f in sorted(points, key=lambda p: (-p[0], p[1])):  # most gain first
        if not best or f < best[-1][1]:
            best.append((g, f))
    return best[::-1]


def at_gain(front, g):
    """Forgetting interpolated along a frontier at gain g (None outside its gains)."""
    if not front or g < front[0][0] - 1e-12 or g > front[-1][0] + 1e-12:
        return None
    for (g0, f0), (g1, f1) in zip(front, front[1:]):
        if g0 <= g <= g1:
            return f0 + (f1 - f0) * (g - g0) / (g1 - g0) if g1 > g0 else min(f0, f1)
    return front[0][1]


def half_range(xs):
    return (max(xs) - min(xs)) / 2 if xs else float("nan")


def paired_p(differences):
    """Two-sided p of a one-sample t-test of per-seed differences against 0 (None below 2 seeds;
    0 or 1 when the differences do not vary)."""
    if len(differences) < 2:
        return None
    mean, sd = statistics.mean(differences), statistics.stdev(differences)
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    from scipy.stats import t as student_t
    t = mean / (sd / len(differences) ** 0.5)
    return float(2 * student_t.sf(abs(t), df=len(differences) - 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pretrain-steps", type=int, default=0)
    ap.add_argument("--finetune-steps", type=int, default=0)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--elapsed", type=int, default=0)
    ap.add_argument("--levels", type=int, default=5, help="gains compared along the overlap")
    ap.add_argument("--no-plot", action="store_true", help="write no frontier.png")
    a = ap.parse_args()
    path = os.path.join(a.out, "runs.tsv")
    rows = [l.rstrip("\n").split("\t") for l in open(path)]
    head = rows[0]
    if head[:5] != ["run", "method", "urr", "lr", "seed"] or len(head) != 8 or head[7] != "seconds":
        sys.exit("forgetting_frontier: %s: header %r is not run method urr lr seed <split> <split> seconds"
                 % (path, "\t".join(head)))
    legacy = {"informative": "brown_informative", "imaginative": "brown_imaginative"}
    pre, ft = legacy.get(head[5], head[5]), legacy.get(head[6], head[6])
    control = pre == ft
    for n, r in enumerate(rows[1:], 2):
        if len(r) != 8:
            sys.exit("forgetting_frontier: %s line %d: %d columns, not 8" % (path, n, len(r)))
    rows = [dict(zip(head[:5] + ["pre", "ft", "seconds"], r)) for r in rows[1:]]
    # The pretrained model: one row "pretrained" that every seed shares, or a row per seed
    # (pretrained_seed<S>, forgetting.sh's PRETRAIN_PER_SEED), each seed's runs measured from its own.
    bases = {r["seed"]: (float(r["pre"]), float(r["ft"])) for r in rows if r["method"] == "pretrained"}
    if not bases:
        sys.exit("forgetting_frontier: no pretrained row in runs.tsv")
    per_seed_base = "-" not in bases
    if not per_seed_base and len(bases) > 1:
        sys.exit("forgetting_frontier: %s holds a shared pretrained row and per-seed ones" % path)
    b_pre = statistics.mean(b[0] for b in bases.values())
    b_ft = statistics.mean(b[1] for b in bases.values())
    runs = []
    for r in rows:
        if r["method"] == "pretrained":
            continue
        base = bases.get(r["seed"] if per_seed_base else "-")
        if base is None:
            sys.exit("forgetting_frontier: %s: run %s has no pretrained_seed%s row" % (
                path, r["run"], r["seed"]))
        arm = "adamw" if r["method"] == "adamw" else "osft urr %s" % r["urr"]
        runs.append({"run": r["run"], "method": r["method"], "arm": arm, "urr": r["urr"],
                     "lr": r["lr"], "seed": int(r["seed"]),
                     "loss_pretraining_split": float(r["pre"]), "loss_finetuning_split": float(r["ft"]),
                     "forgetting": float(r["pre"]) - base[0],
                     "gain": base[1] - float(r["ft"]), "seconds": int(r["seconds"])})
    seeds = sorted({r["seed"] for r in runs})
    # A seed counts when both methods have at least two runs in it (a partial grid's last seed
    # may not).
    full = [s for s in seeds if all(len([r for r in runs if r["seed"] == s and r["method"] == m]) >= 2
                                    for m in ("adamw", "osft"))]

    # Every configuration: mean over seeds and half the range.
    configs = []
    for key in sorted({(r["arm"], float(r["lr"])) for r in runs}):
        rs = [r for r in runs if (r["arm"], float(r["lr"])) == key]
        configs.append({"arm": key[0], "lr": key[1], "seeds": len(rs),
                        "gain": statistics.mean(r["gain"] for r in rs),
                        "gain_halfrange": half_range([r["gain"] for r in rs]),
                        "forgetting": statistics.mean(r["forgetting"] for r in rs),
                        "forgetting_halfrange": half_range([r["forgetting"] for r in rs]),
                        "seconds": statistics.mean(r["seconds"] for r in rs)})

    # Equal-gain comparison, seed by seed: OSFT against AdamW, each ratio alone and every ratio
    # together. Together is the lower envelope of the ratios' own frontiers (at each gain the
    # least forgetting any ratio's frontier reaches there), not the Pareto set of the pooled
    # points joined by lines: a point of one ratio that survives the pooled Pareto cut by a hair
    # would bend that line above another ratio's frontier.
    def envelope(fronts):
        """(curve(g), lowest gain, highest gain) of the lower envelope of frontiers."""
        fronts = [f for f in fronts if f]
        curve = lambda g: min((v for v in (at_gain(f, g) for f in fronts) if v is not None), default=None)
        return curve, min(f[0][0] for f in fronts), max(f[-1][0] for f in fronts)

    def compare(arms):
        """`arms`: the OSFT ratios (urr strings) compared together against AdamW."""
        per_seed = {}
        for s in full:
            fa = frontier([(r["gain"], r["forgetting"]) for r in runs if r["seed"] == s and r["method"] == "adamw"])
            fronts = []
            for urr in arms:
                mine = [r for r in runs if r["seed"] == s and r["method"] == "osft" and r["urr"] == urr]
                if len(mine) >= 2:
                    fronts.append(frontier([(r["gain"], r["forgetting"]) for r in mine]))
            if not fronts or len(fronts) < len(arms):  # this seed's runs are not all in yet
                continue
            curve, lo, hi = envelope(fronts)
            per_seed[s] = (fa, curve, max(fa[0][0], lo), min(fa[-1][0], hi))
        if not per_seed:
            return None
        lo = max(v[2] for v in per_seed.values())
        hi = min(v[3] for v in per_seed.values())
        if hi < lo:
            return {"overlap": None, "levels": []}
        levels = []
        count = a.levels if hi > lo else 1
        for i in range(count):
            g = lo + (hi - lo) * i / (count - 1) if count > 1 else lo
            fa = [at_gain(v[0], g) for v in per_seed.values()]
            fo = [v[1](g) for v in per_seed.values()]
            if any(x is None for x in fo):  # a gap between the ratios' frontiers in some seed
                continue
            d = [o - x for o, x in zip(fo, fa)]
            ratio = [o / x for o, x in zip(fo, fa) if x > 0]
            levels.append({"gain": g, "adamw": statistics.mean(fa), "adamw_halfrange": half_range(fa),
                           "osft": statistics.mean(fo), "osft_halfrange": half_range(fo),
                           "difference": statistics.mean(d), "difference_halfrange": half_range(d),
                           "difference_per_seed": d, "p_paired": paired_p(d),
                           "ratio": statistics.mean(ratio) if ratio else None,
                           "ratio_of_means": (statistics.mean(fo) / statistics.mean(fa)
                                              if statistics.mean(fa) > 0 else None)})
        return {"overlap": [lo, hi], "levels": levels, "seeds": sorted(per_seed)}

    # At the same lr, no interpolation: each OSFT run against AdamW's run of its seed and lr.
    def matched(urr):
        out = []
        adamw = {(r["seed"], float(r["lr"])): r for r in runs if r["method"] == "adamw" and r["seed"] in full}
        for lr in sorted({float(r["lr"]) for r in runs if r["method"] == "osft" and r["urr"] == urr}):
            pairs = [(r, adamw[(r["seed"], lr)]) for r in runs
                     if r["method"] == "osft" and r["urr"] == urr and float(r["lr"]) == lr
                     and (r["seed"], lr) in adamw]
            if not pairs:
                continue
            dg = [o["gain"] - x["gain"] for o, x in pairs]
            df = [o["forgetting"] - x["forgetting"] for o, x in pairs]
            out.append({"lr": lr, "seeds": [o["seed"] for o, _ in pairs],
                        "gain_difference": statistics.mean(dg), "gain_difference_halfrange": half_range(dg),
                        "forgetting_difference": statistics.mean(df),
                        "forgetting_difference_halfrange": half_range(df),
                        "forgetting_difference_per_seed": df, "p_paired": paired_p(df)})
        return out

    # Each OSFT run at its own gain against its seed's AdamW frontier there (the ratio of the
    # run's forgetting to the frontier's; no OSFT frontier interpolated): what the higher-gain
    # points show seed by seed, where the levels above need every seed's frontiers to overlap.
    def on_adamw_frontier(urr):
        out = []
        for s in full:
            fa = frontier([(r["gain"], r["forgetting"]) for r in runs if r["seed"] == s and r["method"] == "adamw"])
            for r in sorted((r for r in runs if r["seed"] == s and r["method"] == "osft" and r["urr"] == urr),
                            key=lambda r: float(r["lr"])):
                x = at_gain(fa, r["gain"])
                out.append({"lr": float(r["lr"]), "seed": s, "gain": r["gain"], "forgetting": r["forgetting"],
                            "adamw_at_gain": x,
                            "ratio": r["forgetting"] / x if x is not None and x > 0 else None})
        return out

    comparisons, at_matched_lr, on_frontier = {}, {}, {}
    if not control:  # on the control every run lies on forgetting = -gain: nothing to compare
        urrs = sorted({r["urr"] for r in runs if r["method"] == "osft"}, reverse=True)
        comparisons["osft (all ratios)"] = compare(urrs)
        for urr in urrs:
            comparisons["osft urr %s" % urr] = compare([urr])
            at_matched_lr["osft urr %s" % urr] = matched(urr)
            on_frontier["osft urr %s" % urr] = on_adamw_frontier(urr)
    max_gain = {m: max((r["gain"] for r in runs if r["method"] == m), default=None) for m in ("adamw", "osft")}

    doc = {"splits": {"pretraining": pre, "finetuning": ft}, "control": control,
           "pretrained": {"loss_pretraining_split": b_pre, "loss_finetuning_split": b_ft},
           "pretrained_per_seed": ({s: {"loss_pretraining_split": b[0], "loss_finetuning_split": b[1]}
                                    for s, b in sorted(bases.items())} if per_seed_base else None),
           "runs": runs, "configs": configs,
           "seeds": seeds, "seeds_compared": full, "comparisons": comparisons,
           "at_matched_lr": at_matched_lr, "on_adamw_frontier": on_frontier, "max_gain": max_gain,
           "np": a.np, "pretrain_steps": a.pretrain_steps, "finetune_steps": a.finetune_steps,
           "elapsed_s": a.elapsed}
    figures.write_json(doc, os.path.join(a.out, "frontier.json"))

    on = "it" if control else pre  # the split pretrained on
    if per_seed_base:  # each seed's own pretraining: its mean and half the range
        pres, fts = [b[0] for b in bases.values()], [b[1] for b in bases.values()]
        model = (", each seed from its own cpu_small pretrained %d steps on %s at train.seed = "
                 "the seed" % (a.pretrain_steps, on))
        loss_pre = "%.4f ± %.4f" % (b_pre, half_range(pres))
        loss_ft = "%.4f ± %.4f" % (b_ft, half_range(fts))
        of = (", mean ± half the range of %d pretrainings; each run's gain and forgetting against "
              "its seed's" % len(bases))
    else:
        model = " from cpu_small pretrained %d steps on %s" % (a.pretrain_steps, on)
        loss_pre, loss_ft, of = "%.4f" % b_pre, "%.4f" % b_ft, ""
    if control:
        intro = ("Fine-tuning %d steps on %s, the pretraining split itself (the control),%s "
                 "(validation loss %s%s)" % (a.finetune_steps, ft, model, loss_pre, of))
    else:
        intro = ("Fine-tuning %d steps on %s%s (validation loss there %s, on %s %s%s)"
                 % (a.finetune_steps, ft, model, loss_pre, ft, loss_ft, of))
    L = [intro + "; np %d; whole validation splits; %d runs, %d s of grid and pretraining in all."
         % (a.np, len(runs), a.elapsed), ""]
    if control:
        L += ["The fine-tuning data is the pretraining data, so gain is minus forgetting: each "
              "configuration's forgetting is what re-warming the lr after the annealed pretraining "
              "costs alone, to set beside the same configuration's forgetting on another split.", ""]
    L += ["Every configuration (mean over seeds ± half the range):", "",
          "| arm | lr | seeds | gain (−Δ %s val) | forgetting (Δ %s val) | s / run |" % (ft, pre),
          "|---|---|---|---|---|---|"]
    for c in configs:
        L.append("| %s | %g | %d | %.4f ± %.4f | %.4f ± %.4f | %.0f |" % (
            c["arm"], c["lr"], c["seeds"], c["gain"], c["gain_halfrange"], c["forgetting"],
            c["forgetting_halfrange"], c["seconds"]))
    for name, cmp in comparisons.items():
        L += ["", "At equal gain, %s against full fine-tuning (AdamW), along each seed's frontiers "
              "(seeds %s):" % (name, ", ".join(map(str, full))), ""]
        if not cmp or not cmp["levels"]:
            L.append("no gain both frontiers reach in every seed")
            continue
        L += ["| gain | forgetting, AdamW | forgetting, %s | %s − AdamW | p (paired t) | %s / AdamW: "
              "mean of the seeds' ratios; ratio of the means |" % (name, name, name), "|---|---|---|---|---|---|"]
        for v in cmp["levels"]:
            L.append("| %.4f | %.4f ± %.4f | %.4f ± %.4f | %+.4f ± %.4f | %s | %s; %s |" % (
                v["gain"], v["adamw"], v["adamw_halfrange"], v["osft"], v["osft_halfrange"],
                v["difference"], v["difference_halfrange"],
                "%.3f" % v["p_paired"] if v["p_paired"] is not None else "-",
                "%.2f" % v["ratio"] if v["ratio"] is not None else "-",
                "%.2f" % v["ratio_of_means"] if v["ratio_of_means"] is not None else "-"))
    for name, pairs in at_matched_lr.items():
        if not pairs:
            continue
        L += ["", "At the same lr, %s against AdamW seed by seed, without interpolating (mean ± half the "
              "range over the seeds):" % name, "",
              "| lr | seeds | gain, %s − AdamW | forgetting, %s − AdamW | p (paired t) |" % (name, name),
              "|---|---|---|---|---|"]
        for v in pairs:
            L.append("| %g | %d | %+.4f ± %.4f | %+.4f ± %.4f | %s |" % (
                v["lr"], len(v["seeds"]), v["gain_difference"], v["gain_difference_halfrange"],
                v["forgetting_difference"], v["forgetting_difference_halfrange"],
                "%.3f" % v["p_paired"] if v["p_paired"] is not None else "-"))
    for name, points in on_frontier.items():
        if not points:
            continue
        L += ["", "Each %s run against its own seed's AdamW frontier at the run's gain (\"-\": outside "
              "the gains that frontier reaches):" % name, "",
              "| lr | seed | gain | forgetting | AdamW's frontier there | ratio |", "|---|---|---|---|---|---|"]
        for v in points:
            L.append("| %g | %d | %.4f | %.4f | %s | %s |" % (
                v["lr"], v["seed"], v["gain"], v["forgetting"],
                "%.4f" % v["adamw_at_gain"] if v["adamw_at_gain"] is not None else "-",
                "%.2f" % v["ratio"] if v["ratio"] is not None else "-"))
    L += ["", "Largest gain reached: AdamW %s, OSFT %s." % tuple(
        "%.4f" % max_gain[m] if max_gain[m] is not None else "-" for m in ("adamw", "osft"))]
    open(os.path.join(a.out, "frontier.md"), "w").write("\n".join(L) + "\n")
    print("\n".join(L))
    if a.no_plot:
        return

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 5))
    colors = {}
    markers = ["o", "s", "^", "D"]
    for c in configs:
        colors.setdefault(c["arm"], "C%d" % len(colors))
    if control:  # gain is minus forgetting: forgetting against the lr, each arm a line of seed means
        for arm, color in colors.items():
            for i, s in enumerate(seeds):
                rs = [r for r in runs if r["arm"] == arm and r["seed"] == s]
                ax.scatter([float(r["lr"]) for r in rs], [r["forgetting"] for r in rs], color=color,
                           marker=markers[i % len(markers)], s=30, alpha=0.6,
                           label="%s, seed %d" % (arm, s))
            cs = [c for c in configs if c["arm"] == arm]
            ax.plot([c["lr"] for c in cs], [c["forgetting"] for c in cs], "-", color=color,
                    label="%s (seed means)" % arm)
        ax.set_xscale("log")
        ax.set_xlabel("fine-tuning lr")
        ax.set_ylabel("forgetting of %s (validation loss rise)" % pre)
        ax.set_title("The control: fine-tuning %d steps on %s, the pretraining split (%d steps)" % (
            a.finetune_steps, ft, a.pretrain_steps), fontsize=9)
    else:
        for arm, color in colors.items():
            for i, s in enumerate(seeds):
                rs = [r for r in runs if r["arm"] == arm and r["seed"] == s]
                ax.scatter([r["gain"] for r in rs], [r["forgetting"] for r in rs], color=color,
                           marker=markers[i % len(markers)], s=30, alpha=0.6,
                           label="%s, seed %d" % (arm, s))
            cs = [c for c in configs if c["arm"] == arm]
            for c in cs:
                ax.annotate("%g" % c["lr"], (c["gain"], c["forgetting"]), fontsize=7, color=color,
                            xytext=(3, 3), textcoords="offset points")
        for m, color, style in (("adamw", colors.get("adamw", "C0"), "-"), ("osft", "k", "--")):
            front = frontier([(c["gain"], c["forgetting"]) for c in configs
                              if (c["arm"] == "adamw") == (m == "adamw")])
            if front:
                ax.plot([p[0] for p in front], [p[1] for p in front], style, color=color,
                        label="%s frontier (seed means)" % ("AdamW" if m == "adamw" else "OSFT, all ratios"))
        ax.set_xlabel("gain on %s (validation loss drop)" % ft)
        ax.set_ylabel("forgetting of %s (validation loss rise)" % pre)
        ax.set_title("Fine-tuning %d steps on %s after %d pretraining steps on %s\n(labels: lr)" % (
            a.finetune_steps, ft, a.pretrain_steps, pre), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figures.save_png(fig, os.path.join(a.out, "frontier.png"), dpi=120)


if __name__ == "__main__":
    main()
