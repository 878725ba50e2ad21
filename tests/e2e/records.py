#!/usr/bin/env python3
"""End-to-end tests of the speedrun track: the multi-seed runner, the PyTorch side by side, and
the loss-curve regression of the record recipe.

usage: records.py --engine PATH --repo DIR --work DIR CASE

Shares the tiny-config set-up of e2e.py. The record_recipe cases train configs/speedrun_cpu.yaml
on the Brown shards (the ctest fixture brown_data prepares them).
"""
import json
import lzma
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402
from e2e import Failure, check  # noqa: E402


def tiny_sets(env):
    return ["data.train=" + os.path.join(env.data, "tiny_train_*.bin"),
            "data.val=" + os.path.join(env.data, "tiny_val_*.bin")]


def run(cmd, expect_ok=True, timeout=300):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if expect_ok and p.returncode != 0:
        raise Failure("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:]))
    if not expect_ok and p.returncode == 0:
        raise Failure("succeeded but should have failed: " + " ".join(cmd))
    return p


def compact_metrics(seed_dir):
    """{step: row} of a record's metrics.jsonl.xz (the compact form speedrun.py keeps)."""
    with lzma.open(os.path.join(seed_dir, "metrics.jsonl.xz"), "rt") as f:
        return {r["step"]: r for r in map(json.loads, f)}


def case_speedrun(env):
    """Three seeds of the tiny config: one folder per seed with log, metrics and config, a
    summary whose numbers are those of the metrics files, --rescore against another target, and a
    refusal to overwrite a record."""
    records = os.path.join(env.work, "records")
    cmd = [os.path.join(env.repo, "scripts/speedrun.sh"), env.config, "--seeds", "3", "--np", "2",
           "--threads", "1", "--name", "tiny", "--target", "4.0", "--records", records,
           "--engine", env.engine, "--set", "data.shuffle=true", "--set", "train.eval_every=5"]
    for s in tiny_sets(env):
        cmd += ["--set", s]
    p = run(cmd)
    dirs = [d for d in os.listdir(records) if d.endswith("_tiny")]
    check(len(dirs) == 1, "expected one record folder, found %s" % dirs)
    out = os.path.join(records, dirs[0])
    summary = json.load(open(os.path.join(out, "summary.json")))
    runs, s = summary["runs"], summary["summary"]
    check([r["seed"] for r in runs] == [1234, 1235, 1236], "seeds %s" % [r["seed"] for r in runs])
    finals = []
    for r in runs:
        seed_dir = os.path.join(out, "seed%d" % r["seed"])
        for f in ("log.txt.xz", "metrics.jsonl.xz", "config.yaml"):
            check(os.path.isfile(os.path.join(seed_dir, f)), "no %s for seed %d" % (f, r["seed"]))
        m = compact_metrics(seed_dir)
        check(m[20]["val_loss"] == r["final_val_loss"], "final val loss of seed %d" % r["seed"])
        first = min(k for k in m if m[k].get("val_loss", 99) <= 4.0)
        check(r["target_step"] == first and r["time_to_target_ms"] == m[first]["elapsed_ms"],
              "time to target of seed %d: %s vs step %d" % (r["seed"], r, first))
        check("seed: %d" % r["seed"] in open(os.path.join(seed_dir, "config.yaml")).read(),
              "seed %d not in its effective config" % r["seed"])
        finals.append(r["final_val_loss"])
    check(len(set(finals)) == 3, "the seeds trained the same run: %s" % finals)
    check(abs(s["final_val_mean"] - sum(finals) / 3) < 1e-12, "mean of the final losses")
    check(s["reached"] == 3 and 0 <= s["p_value"] < 0.01, "summary %s" % s)
    check(os.path.isfile(os.path.join(out, "recipe.yaml")), "no recipe.yaml")
    check("time to target:" in p.stdout and "p = " in p.stdout, "no summary printed:\n" + p.stdout)
    rescored = run([os.path.join(env.repo, "scripts/speedrun.sh"), "--rescore", out,
                    "--target", "1.0"])
    s2 = json.load(open(os.path.join(out, "summary.json")))
    for r, r2 in zip(runs, s2["runs"]):
        m = compact_metrics(os.path.join(out, "seed%d" % r["seed"]))
        hit = [k for k in sorted(m) if m[k].get("val_loss", 99) <= 1.0]
        check(r2["target_step"] == (hit[0] if hit else None),
              "rescored seed %d: %s, metrics say %s" % (r["seed"], r2, hit[:1]))
    check(s2["summary"]["target"] == 1.0 and s2["summary"]["command"].endswith("--target 1"),
          "rescored summary %s" % s2["summary"])
    check("target val loss 1.0000" in rescored.stdout, "rescore printed:\n" + rescored.stdout)
    again = run(cmd, expect_ok=False)
    check("exists" in again.stdout and "nothing was overwritten" in again.stdout,
          "second run into the same record: " + again.stdout[-500:])
    print(open(os.path.join(out, "summary.md")).read())


def case_speedrun_ttest(env):
    """The one-sided t-test against the closed form of Student's t with 2 degrees of freedom,
    F(x) = 1/2 + x / (2 sqrt(2 + x^2)): losses 1, 2, 3 against target 4 give t = -2 sqrt(3)."""
    code = ("import sys; sys.path.insert(0, %r); import speedrun as s; "
            "print(repr(s.one_sided_p([1.0, 2.0, 3.0], 4.0)))" % os.path.join(env.repo, "scripts"))
    p = run(["/usr/bin/python3", "-c", code])
    x = -2 * 3 ** 0.5
    want = 0.5 + x / (2 * (2 + x * x) ** 0.5)
    got = float(p.stdout.strip())
    check(abs(got - want) < 1e-12, "p = %r, closed form %r" % (got, want))
    print("p = %.6f (closed form %.6f)" % (got, want))


def case_time_to_target(env):
    """PyTorch and the engine train the same tiny AdamW config from the same weights on the same
    batches: their train losses agree to float32 rounding over 20 steps, and the side-by-side
    table reports each one's time to the target."""
    config = os.path.join(env.work, "adamw.yaml")
    with open(env.config) as f:
        text = f.read()
    head = text[:text.index("optim:")]
    with open(config, "w") as f:
        f.write(head.replace("grad_clip: 1.0", "grad_clip: 0.0")
                .replace("  train: data/tiny/tiny_train_*.bin",
                         "  train: " + os.path.join(env.data, "tiny_train_*.bin") +
                         "\n  shuffle: true")
                .replace("  val: data/tiny/tiny_val_*.bin",
                         "  val: " + os.path.join(env.data, "tiny_val_*.bin")))
        f.write("optim:\n  - params: [\"*\"]\n    optimizer: adamw\n    lr: 3.0e-3\n"
                "    betas: [0.9, 0.95]\n    eps: 1.0e-8\n    eps_mode: torch\n"
                "    weight_decay: 0.1\n")
    dump = os.path.join(os.path.dirname(os.path.dirname(env.engine)), "dump_batches",
                        "dump_batches")
    p = run(["/usr/bin/python3", os.path.join(env.repo, "scripts/time_to_target.py"),
             "--config", config, "--target", "5.0", "--np", "2", "--threads", "1",
             "--work", os.path.join(env.work, "ttt"), "--engine", env.engine, "--dump", dump,
             "--json"])
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    check([r["impl"] for r in rows] == ["pytorch adamw", "engine adamw"], "rows %s" % rows)
    for r in rows:
        check(r["target_step"] is not None and r["time_to_target_s"] > 0,
              "%s did not reach the target: %s" % (r["impl"], r))
    check(rows[0]["target_step"] == rows[1]["target_step"],
          "the two reached the target at different steps: %s" % rows)
    gap = rows[1]["curve_gap_first_20"]
    check(gap is not None and gap < 1e-4, "train losses 1-20 differ by %s" % gap)
    print("same curve (largest relative difference %.2e); target at step %d; engine %.3fx "
          "pytorch's time" % (gap, rows[1]["target_step"], rows[1]["vs_pytorch"]))


# The short record recipe: configs/speedrun_cpu.yaml for 12 steps on Brown. The stored curve
# (tests/e2e/reference/speedrun_cpu_short.jsonl) was written by np 1; np 2 sums its gradients in
# another order.
RECORD_SHORT = ["train.steps=12", "train.eval_every=6", "train.val_tokens=8192",
                "train.warmup_steps=0", "log.every=1"]
RECORD_RTOL = {1: 1e-5, 2: 1e-4}


def case_record_recipe(env, np):
    run_dir = os.path.join(env.work, "record_np%d" % np)
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(np), env.engine,
           "--config", os.path.join(env.repo, "configs/speedrun_cpu.yaml")]
    for s in RECORD_SHORT + [
            "data.train=" + os.path.join(env.repo, "data/brown/brown_train_*.bin"),
            "data.val=" + os.path.join(env.repo, "data/brown/brown_val_*.bin"),
            "log.dir=" + run_dir, "checkpoint.dir=" + os.path.join(run_dir, "ckpt")]:
        cmd += ["--set", s]
    run(cmd)
    ref = os.path.join(env.repo, "tests/e2e/reference/speedrun_cpu_short.jsonl")
    p = run([sys.executable, os.path.join(env.repo, "scripts/loss_regression.py"),
             os.path.join(run_dir, "metrics.jsonl"), ref, "--rtol", str(RECORD_RTOL[np])],
            )
    print(p.stdout)


CASES = {
    "speedrun": case_speedrun,
    "speedrun_ttest": case_speedrun_ttest,
    "time_to_target": case_time_to_target,
    "record_recipe_np1": lambda env: case_record_recipe(env, 1),
    "record_recipe_np2": lambda env: case_record_recipe(env, 2),
}

if __name__ == "__main__":
    sys.exit(e2e.main(CASES))
