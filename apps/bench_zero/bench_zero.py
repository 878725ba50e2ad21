#!/usr/bin/env python3
"""bench_zero: exposed communication and throughput of the engine's ZeRO stages, side by side.

Runs the engine on one config (default configs/cpu_small.yaml) for every variant below, in
interleaved rounds (round 1 runs every variant once, then round 2, ...) so that a busy machine
slows all variants alike, and prints one table of medians over the measured steps of all rounds:
step time, comm_wait_ms (time blocked waiting for collectives, metrics.jsonl), its share of the
step, the reduce_grads phase, tokens/s, and tokens/s relative to the first variant.

Variants (the config's defaults unless named): np 1 x 2 threads; np 2 x 1 thread and np 4 x 1
thread (oversubscribed on 2 cores) at ZeRO stages 1, 2, 3 with overlap on and off; np 2 stages 1
and 2 with zero.progress=poll, =thread, and with the embedding reduced dense
(zero.sparse_rows=false); np 2 stages 1 and 3 with log.trace recording every step ("trace on")
and with a trace range after the last step (the tracer and its communicator wrappers present but
idle, "trace idle"): the cost of tracing against the "overlap on" rows. --only REGEX picks
variants by name.

    python3 apps/bench_zero/bench_zero.py --engine build/apps/engine/engine --steps 12 --rounds 2
    python3 apps/bench_zero/bench_zero.py --only 'np2x1 stage[13] (overlap on|trace)' --rounds 3
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def variants(quick):
    out = [("np1x2 stage1", 1, 2, ["zero.stage=1"])]
    for np_ in (2, 4):
        for stage in (1, 2, 3):
            for overlap in ("true", "false"):
                if quick and np_ == 4 and overlap == "false":
                    continue
                name = "np%dx1 stage%d overlap %s" % (np_, stage, "on" if overlap == "true" else "off")
                out.append((name, np_, 1, ["zero.stage=%d" % stage, "zero.overlap=" + overlap]))
    for stage in (1, 2):
        out.append(("np2x1 stage%d poll" % stage, 2, 1,
                    ["zero.stage=%d" % stage, "zero.progress=poll"]))
        out.append(("np2x1 stage%d thread" % stage, 2, 1,
                    ["zero.stage=%d" % stage, "zero.progress=thread"]))
        out.append(("np2x1 stage%d dense embedding" % stage, 2, 1,
                    ["zero.stage=%d" % stage, "zero.sparse_rows=false"]))
    for stage in (1, 3):
        out.append(("np2x1 stage%d trace on" % stage, 2, 1,
                    ["zero.stage=%d" % stage, "log.trace=1-1000000"]))
        out.append(("np2x1 stage%d trace idle" % stage, 2, 1,
                    ["zero.stage=%d" % stage, "log.trace=1000000"]))
    return out


def run(args, name, np_, threads, sets, log_dir):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Several threads per rank need as many cores (Open MPI binds a rank to one at np <= 2).
    bind = ["--bind-to", "none"] if threads > 1 else []
    cmd = ["mpirun", "--oversubscribe"] + bind + ["-np", str(np_), args.engine, "--config",
                                                  args.config]
    for s in sets + ["train.steps=%d" % args.steps, "train.eval_every=0", "checkpoint.every=0",
                     "checkpoint.at_end=false", "log.dir=" + log_dir, "log.every=1000"]:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("bench_zero: %s failed (%d):\n%s" % (name, p.returncode, p.stderr[-3000:]))
    rows = [json.loads(line) for line in open(os.path.join(log_dir, "metrics.jsonl"))]
    return [r for r in rows if "train_loss" in r and r["step"] > args.skip]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="build/apps/engine/engine")
    ap.add_argument("--config", default="configs/cpu_small.yaml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="np 4 with overlap on only")
    ap.add_argument("--only", help="run only the variants whose name matches this regex")
    ap.add_argument("--json", help="also write every measured row here")
    args = ap.parse_args()
    vs = [v for v in variants(args.quick) if not args.only or re.search(args.only, v[0])]
    rows = {name: [] for name, *_ in vs}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for i, (name, np_, threads, sets) in enumerate(vs):
                rows[name] += run(args, name, np_, threads, sets,
                                  os.path.join(tmp, "r%d_v%d" % (rnd, i)))
                print("round %d: %s done" % (rnd + 1, name), file=sys.stderr, flush=True)
    print("bench_zero: %s, %d steps per run (first %d left out), %d interleaved rounds; medians"
          % (args.config, args.steps, args.skip, args.rounds))
    print("%-28s %9s %9s %7s %9s %8s %7s" % ("variant", "step_ms", "wait_ms", "wait%",
                                            "reduce_ms", "tok/s", "vs np1"))
    base = None
    for name, *_ in vs:
        r = rows[name]
        med = lambda f: statistics.median(f(x) for x in r)
        step = med(lambda x: x["step_ms"])
        wait = med(lambda x: x.get("comm_wait_ms", 0.0))
        red = med(lambda x: x["phase_ms"]["reduce_grads"])
        tok = med(lambda x: x["tokens_per_s"])
        base = base or tok
        print("%-28s %9.1f %9.1f %6.1f%% %9.1f %8.0f %6.2fx" % (name, step, wait, 100 * wait / step,
                                                             red, tok, tok / base))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
