#!/usr/bin/python3
"""Time to a target validation loss: the engine and PyTorch side by side, one after the other.

usage: time_to_target.py --target LOSS [--config configs/torch_compare_adamw.yaml]
                         [--recipe configs/torch_compare_recipe.yaml ...] [--np 1] [--threads 2]
                         [--work DIR] [--engine PATH] [--skip-torch | --torch-metrics FILE]
                         [--json]

--config is an engine config with one AdamW group over every parameter; PyTorch
(tests/model/torch_reference.py --train) trains the same model from the same initial weights on the
same batches in the same order (written by apps/dump_batches), with torch.optim.AdamW and the
same learning-rate schedule, and validates on the same tokens. The engine then trains --config
itself, and every --recipe (the same model trained the engine's own way, e.g. Muon + AdamW). Each
run stops at the target; the table gives the train time to it (validation excluded), the step,
and the ratio to PyTorch's time, plus how far apart the two AdamW curves are over their first
steps (same model, data and optimizer: they should agree to float32 rounding). PyTorch is the
slow side: --torch-metrics reads the metrics of an earlier PyTorch run of the same --config
(WORK/torch/metrics.jsonl) instead of training again.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env, what):
    print("time_to_target: %s: %s" % (what, " ".join(cmd)), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("time_to_target: %s failed (exit %d); its output ends:\n%s" %
                 (what, p.returncode, p.stdout[-3000:]))


def curve_gap(a, b, steps):
    """Largest relative difference of train_loss over the first `steps` steps both logged."""
    ra, rb = runlog.by_step(a), runlog.by_step(b)
    gaps = [abs(ra[s]["train_loss"] - rb[s]["train_loss"]) / abs(rb[s]["train_loss"])
            for s in range(1, steps + 1)
            if s in ra and s in rb and "train_loss" in ra[s] and "train_loss" in rb[s]]
    return max(gaps) if gaps else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--config", default=os.path.join(REPO, "configs/torch_compare_adamw.yaml"))
    ap.add_argument("--recipe", action="append", default=[])
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="threads per rank (and PyTorch's)")
    ap.add_argument("--work", default=os.path.join(REPO, "runs/time_to_target"))
    ap.add_argument("--engine", default=os.path.join(REPO, "build/apps/engine/engine"))
    ap.add_argument("--dump", default=os.path.join(REPO, "build/apps/dump_batches/dump_batches"))
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--torch-metrics", help="an earlier PyTorch run's metrics.jsonl to reuse")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for exe in (a.engine, a.dump):
        if not os.access(exe, os.X_OK):
            sys.exit("time_to_target: no executable %s (build it first)" % exe)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    os.makedirs(a.work, exist_ok=True)
    batches = os.path.join(a.work, "batches")
    import yaml
    with open(a.config) as f:
        steps = int(yaml.safe_load(f)["train"]["steps"])
    run([a.dump, "--config", a.config, "--steps", str(steps), "--out", batches], env,
        "dump_batches")

    results = []

    def record(impl, config, metrics_path, world, threads):
        rows = runlog.read_metrics(metrics_path)
        hit = runlog.time_to_target(rows, a.target)
        results.append({"impl": impl, "config": os.path.relpath(config, REPO), "world": world,
                        "threads": threads, "target": a.target,
                        "target_step": hit[0] if hit else None,
                        "time_to_target_s": hit[1] / 1e3 if hit else None,
                        "final_val_loss": runlog.final_val_loss(rows), "metrics": metrics_path})

    if a.torch_metrics:
        record("pytorch adamw", a.config, a.torch_metrics, 1, a.threads)
    elif not a.skip_torch:
        torch_metrics = os.path.join(a.work, "torch", "metrics.jsonl")
        os.makedirs(os.path.dirname(torch_metrics), exist_ok=True)
        run(["/usr/bin/python3", os.path.join(REPO, "tests/model/torch_reference.py"), "--train",
             "--config", a.config, "--batches", batches, "--metrics", torch_metrics,
             "--threads", str(a.threads), "--target", str(a.target)], env, "pytorch")
        record("pytorch adamw", a.config, torch_metrics, 1, a.threads)
    for i, config in enumerate([a.config] + a.recipe):
        log_dir = os.path.join(a.work, "engine%d" % i)
        # Several threads per rank need as many cores (Open MPI binds a rank to one at np <= 2).
        bind = ["--bind-to", "none"] if a.threads > 1 else []
        run(["mpirun", "--oversubscribe"] + bind + ["-np", str(a.np), a.engine, "--config", config,
             "--set", "train.target_val_loss=%g" % a.target, "--set", "log.dir=" + log_dir,
             "--set", "checkpoint.dir=" + os.path.join(log_dir, "ckpt"),
             "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false",
             "--set", "checkpoint.overwrite=true"], env, "engine %s" % config)
        record("engine adamw" if i == 0 else "engine recipe", config,
               os.path.join(log_dir, "metrics.jsonl"), a.np, a.threads)

    torch_time = results[0]["time_to_target_s"] if not a.skip_torch else None
    for r in results:
        t = r["time_to_target_s"]
        r["vs_pytorch"] = t / torch_time if t is not None and torch_time else None
    if not a.skip_torch:
        results[1]["curve_gap_first_20"] = curve_gap(
            runlog.read_metrics(results[1]["metrics"]), runlog.read_metrics(results[0]["metrics"]),
            20)
    if a.json:
        for r in results:
            print(json.dumps(r))
        return 0
    print("\ntime to val loss %.4f (train time, validation excluded)" % a.target)
    print("%-14s %-36s %5s %7s %8s %12s %10s" % ("impl", "config", "ranks", "threads", "step",
                                                 "time (s)", "vs pytorch"))
    for r in results:
        t = r["time_to_target_s"]
        print("%-14s %-36s %5d %7d %8s %12s %10s" % (
            r["impl"], r["config"], r["world"], r["threads"],
            "-" if r["target_step"] is None else r["target_step"],
            "not reached" if t is None else "%.1f" % t,
            "-" if r["vs_pytorch"] is None else "%.3fx" % r["vs_pytorch"]))
    if not a.skip_torch and results[1].get("curve_gap_first_20") is not None:
        print("engine adamw vs pytorch adamw, train loss over steps 1-20: largest relative "
              "difference %.2e" % results[1]["curve_gap_first_20"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
