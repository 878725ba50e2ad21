#!/usr/bin/python3
"""The record recipe on the CPU, second pass (issue 50, section 3): every run, resumable.

usage: recipe_study.sh [--plan | --collect]

Five stages, one after the other, each run at np 2 x 1 thread on Brown (speedrun_cpu's data and
validation), every run to the end of its schedule (train.target_val_loss 0: no stop):
  tune             configs/speedrun_cpu_recipe.yaml on TUNE_SEED (not reported), STEPS steps:
                   its AdamW lrs tuned coordinate-wise, head (optim.2) over HEAD_LRS, then the
                   embedding and value tables (optim.1) over EMBED_LRS, then the scalars
                   (optim.3) over SCALAR_LRS, each with the others at their pick so far (at first
                   the config's); the pick is the lowest final val loss. A pick at the edge of
                   its sweep adds one point past it (x2 or /2) while the stage stays within
                   TUNE_MAX_RUNS runs, the later coordinates' points counted first;
  tuned            at each of SEEDS: the tuned recipe, the recipe with speedrun_cpu's tanh cap
                   (model.softcap 15, softcap_form tanh; the config's rates, as probed), and
                   speedrun_cpu itself, STEPS steps;
  no_value_embeds  at each of SEEDS: the recipe with head lr 0.22 (records/2026-11-27_recipe_
                   head_lr_022's runs) and model.value_embeds 0, STEPS steps;
  under_epoch      at each of SEEDS: speedrun_cpu and the tuned recipe for UNDER_EPOCH_STEPS
                   steps, each on its own schedule for that budget; refused unless the steps'
                   sequences fit in one epoch of the training shards (no sequence seen twice);
  probes           at each of SEEDS: the per-key probes of docs/records.md on the PROBE_STEPS
                   schedule: speedrun_cpu, speedrun_cpu with the recipe's sigmoid cap, the
                   recipe, the recipe with a random head, with head lr 0.22, with the tanh cap.
Within a stage the runs go seed by seed, the arms in that order. Each run lives in
RUNS_DIR/<stage>/<run>/ (log.dir: metrics.jsonl, log.txt, config.yaml; checkpoints every
CHECKPOINT_EVERY steps, deleted when it is done) and its console in RUNS_DIR/<stage>/<run>.out.
A finished run has a result.json, in RUNS_DIR or committed in RECORDS_DIR's runs.jsonl.xz (a
fresh clone holds only those), and is skipped; a cut run (killed, machine restarted) resumes
from its newest checkpoint (checkpoint.resume=auto; on the CPU bit-identical to an uncut run):
run the same command again. SIGTERM or SIGINT to this script is passed to the run, which saves
a checkpoint and stops. After every run the finished runs are packed into
RECORDS_DIR/runs.jsonl.xz (experiments/runpack.py, run <stage>/<run>: result.json, log.txt and
the metrics rows thinned to the step, losses, lr and train time; no checkpoints) and the tables
regenerated (recipe_study_tables.py: RECORDS_DIR/tables.md, tables.json); committing them is
left to whoever runs this. RUNS_DIR/study.json fixes the step counts, np and SETS: a call with others is
refused (give another RUNS_DIR).

  mkdir -p runs && nohup nice -n 10 bash experiments/recipe_study/recipe_study.sh > runs/recipe_study.log 2>&1 &

--plan prints each stage's runs, those finished and the hours left, and stops; the estimate
takes the median step of the committed records of each config (records/2026-11-27_recipe*,
records/2026-11-27_normuon_lr_sbs: np 2 on the quiet 2-core machine) and a validation at a
third of a step's forward-backward per batch of validation tokens. --collect copies and
regenerates the tables, training nothing (safe beside a running study).
Knobs (environment): STAGES (the list above, in its order), SEEDS (1337 1338 1339), TUNE_SEED
(1000), HEAD_LRS (0.0275 0.055 0.11 0.22 0.44), EMBED_LRS (0.04 0.08 0.16), SCALAR_LRS (0.02 0.04
0.08), TUNE_MAX_RUNS (10), STEPS (850), UNDER_EPOCH_STEPS (560), PROBE_STEPS (200), NP (2),
CHECKPOINT_EVERY (100), BUILD_DIR (build), RUNS_DIR (runs/recipe_study), RECORDS_DIR
(experiments/recipe_study/results), SETS (KEY=VALUE overrides, space-separated, after the
script's own for every run, e.g. a tiny model and data: tests/e2e/recipe_study_test.sh).
"""
import fcntl
import glob
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recipe_study_tables as tables  # noqa: E402
import runlog  # noqa: E402  (scripts/ and experiments/ on the path through the tables)
import runpack  # noqa: E402

REPO = tables.REPO
RECIPE = "configs/speedrun_cpu_recipe.yaml"
SPEEDRUN = "configs/speedrun_cpu.yaml"
# Which optimizer group holds which learning rate, per config.
LR_GROUP = {RECIPE: {"head": 2, "embed": 1, "scalar": 3}, SPEEDRUN: {"head": 2, "embed": 1}}
TANH = ["model.softcap=15", "model.softcap_form=tanh"]
SIGMOID = ["model.softcap=30", "model.softcap_form=sigmoid",
           "model.softcap_scale=84.85281374238571"]
# The committed runs whose step times the plan's estimate takes, per config.
STEP_TIME_RUNS = {RECIPE: ["records/2026-11-27_recipe", "records/2026-11-27_recipe_head_lr_022"],
                  SPEEDRUN: ["records/2026-11-27_normuon_lr_sbs"]}
RESULT = "result.json"
# What the pack keeps of each metrics row: the tables read the losses.
KEEP = ("step", "train_loss", "val_loss", "lr", "elapsed_ms")


def fail(msg, code=1):
    print("recipe_study: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def env_list(key, default, kind=float):
    text = os.environ.get(key, default)
    try:
        return [kind(x) for x in text.split()]
    except ValueError:
        fail("%s: expected a space-separated list of numbers, got '%s'" % (key, text), 2)


def env_int(key, default):
    text = os.environ.get(key, str(default))
    try:
        return int(text)
    except ValueError:
        fail("%s: expected an integer, got '%s'" % (key, text), 2)


def apply_sets(cfg, sets):
    """The config dict with KEY=VALUE overrides applied (dotted keys, list indices as numbers)."""
    for kv in sets:
        key, value = kv.split("=", 1)
        node, parts = cfg, key.split(".")
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = yaml.safe_load(value)
        else:
            node[last] = yaml.safe_load(value)
    return cfg


def effective(config, sets):
    with open(config) as f:
        return apply_sets(yaml.safe_load(f), sets)


def lr_sets(config, lrs):
    return ["optim.%d.lr=%g" % (LR_GROUP[config][c], lrs[c]) for c in LR_GROUP[config]]


def lrs_of(config, cfg):
    return {c: float(cfg["optim"][g]["lr"]) for c, g in LR_GROUP[config].items()}


def train_sequences(pattern, seq_len):
    """Sequences of one epoch of the shards matching `pattern`, counted as the loader does
    (data/shard_set.cpp: (tokens - 1) // seq_len a shard)."""
    files = sorted(glob.glob(pattern))
    if not files:
        fail("no training shards match %s (run scripts/prepare_data.sh)" % pattern, 2)
    total = 0
    for path in files:
        with open(path, "rb") as f:
            magic, version, n = struct.unpack("<3i", f.read(12))
        if magic != 20240520:
            fail("%s: not a token shard (magic %d)" % (path, magic), 2)
        total += (n - 1) // seq_len if n > seq_len else 0
    return total


class Study:
    def __init__(self):
        self.stages = os.environ.get("STAGES", " ".join(tables.STAGES)).split()
        for s in self.stages:
            if s not in tables.STAGES:
                fail("STAGES: unknown stage '%s' (the stages: %s)" %
                     (s, " ".join(tables.STAGES)), 2)
        self.stages = [s for s in tables.STAGES if s in self.stages]  # always in the fixed order
        self.seeds = env_list("SEEDS", "1337 1338 1339", int)
        self.tune_seed = env_int("TUNE_SEED", 1000)
        if self.tune_seed in self.seeds:
            fail("TUNE_SEED %d is one of SEEDS: tune on a seed that is not reported" %
                 self.tune_seed, 2)
        self.grids = {"head": sorted(env_list("HEAD_LRS", "0.0275 0.055 0.11 0.22 0.44")),
                      "embed": sorted(env_list("EMBED_LRS", "0.04 0.08 0.16")),
                      "scalar": sorted(env_list("SCALAR_LRS", "0.02 0.04 0.08"))}
        for c, g in self.grids.items():
            if not g or min(g) <= 0:
                fail("%s_LRS: expected positive learning rates" % c.upper(), 2)
        self.tune_max = env_int("TUNE_MAX_RUNS", 10)
        self.steps = env_int("STEPS", 850)
        self.under_steps = env_int("UNDER_EPOCH_STEPS", 560)
        self.probe_steps = env_int("PROBE_STEPS", 200)
        self.np = env_int("NP", 2)
        self.ckpt_every = env_int("CHECKPOINT_EVERY", 100)
        self.engine = os.path.join(os.environ.get("BUILD_DIR", "build"), "apps/engine/engine")
        self.runs_dir = os.environ.get("RUNS_DIR", "runs/recipe_study")
        self.records_dir = os.environ.get("RECORDS_DIR", "experiments/recipe_study/results")
        self.packed = runpack.read(os.path.join(self.records_dir, runpack.FILE))
        self.extra = os.environ.get("SETS", "").split()
        for kv in self.extra:
            if "=" not in kv:
                fail("SETS: '%s' is not KEY=VALUE" % kv, 2)
        base = effective(RECIPE, self.extra)
        self.centers = lrs_of(RECIPE, base)
        self.seq_len = int(base["model"]["seq_len"])
        self.batch_tokens = int(base["train"]["batch_tokens"])
        self.eval_every = int(base["train"]["eval_every"])
        self.val_tokens = int(base["train"]["val_tokens"])
        self.train_pattern = base["data"]["train"]
        self.child = None
        self.stopping = 0

    # ---- the runs ----------------------------------------------------------------------------
    def spec(self, stage, arm, config, seed, steps, sets, what, name=None, tune=None):
        cfg = effective(config, sets + self.extra)
        rows = self.batch_tokens // self.seq_len
        return {"stage": stage, "arm": arm, "what": what,
                "name": name or "%s_seed%d" % (arm, seed), "config": config, "seed": seed,
                "steps": steps, "sets": sets, "extra_sets": self.extra,
                "lrs": lrs_of(config, cfg), "np": self.np, "threads": 1,
                "batch_tokens": self.batch_tokens, "seq_len": self.seq_len,
                "epoch_sequences": None, "epoch_fraction": None, "tune": tune,
                "sequences": steps * rows}

    def run_dir(self, spec):
        return os.path.join(self.runs_dir, spec["stage"], spec["name"])

    def record(self, spec):
        """The run's record in RECORDS_DIR's pack (a fresh clone holds only those), or None."""
        rec = self.packed.get("%s/%s" % (spec["stage"], spec["name"]))
        return rec if rec is not None and "result" in rec else None

    def finished(self, spec):
        return os.path.isfile(os.path.join(self.run_dir(spec), RESULT)) or self.record(spec) is not None

    def final_loss(self, spec):
        d = self.run_dir(spec)
        try:
            if not os.path.isfile(os.path.join(d, RESULT)) and self.record(spec) is not None:
                return tables.read_record(self.record(spec))["final_val_loss"]
            return tables.read_run(d)["final_val_loss"]
        except (runlog.RunLogError, OSError, ValueError) as e:
            fail("%s: %s" % (d, e))

    def tune_point(self, lrs, coord, extension=False):
        name = "head%g_embed%g_scalar%g_seed%d" % (lrs["head"], lrs["embed"], lrs["scalar"],
                                                  self.tune_seed)
        return self.spec("tune", "recipe", RECIPE, self.tune_seed, self.steps,
                         lr_sets(RECIPE, lrs), "the recipe at " + tables.lrs_text(lrs), name,
                         {"coordinate": coord, "extension": extension, "centers": self.centers})

    def new_points(self, k):
        """Runs the coordinates from the k-th on add at least (each one's center was run)."""
        return sum(len([v for v in self.grids[c] if not tables.close(v, self.centers[c])])
                   for c in tables.COORDS[k:])

    def tune_specs(self):
        """The tune stage's runs so far, in order, walking the coordinates over the finished
        ones: (specs, complete, picks, k) with k the coordinate it stopped at."""
        current = dict(self.centers)
        specs, names = [], set()

        def add(lrs, coord, extension=False):
            s = self.tune_point(lrs, coord, extension)
            if s["name"] not in names:
                names.add(s["name"])
                s["order"] = len(specs)
                specs.append(s)
            return s

        def done_runs():
            return [dict(s, final_val_loss=self.final_loss(s)) for s in specs if self.finished(s)]

        for k, coord in enumerate(tables.COORDS):
            points = [add(dict(current, **{coord: v}), coord) for v in self.grids[coord]]
            if not all(self.finished(s) for s in points):
                return specs, False, current, k
            best = tables.pick_lr(done_runs(), coord, current)
            if best is None:
                fail("tune: every run of the %s lr sweep diverged (%s): give %s_LRS lower rates" % (
                    coord, ", ".join(s["name"] for s in points), coord.upper()), 2)
            values = sorted({r["lrs"][coord] for r in done_runs()
                             if all(tables.close(r["lrs"][c], current[c])
                                    for c in tables.COORDS if c != coord)})
            v = best["lrs"][coord]
            at_edge = len(values) > 1 and (tables.close(v, values[0]) or
                                           tables.close(v, values[-1]))
            if at_edge and len(specs) + 1 + self.new_points(k + 1) <= self.tune_max:
                ext = add(dict(current, **{coord: v * 2 if tables.close(v, values[-1]) else v / 2}),
                          coord, extension=True)
                if not self.finished(ext):
                    return specs, False, current, k
                best = tables.pick_lr(done_runs(), coord, current)
            current[coord] = best["lrs"][coord]
        return specs, True, current, len(tables.COORDS)

    def picks(self):
        specs, complete, current, _ = self.tune_specs()
        return current if complete else None

    def tuned_sets(self, picks):
        return lr_sets(RECIPE, picks)

    def stage_specs(self, stage):
        """(specs in run order, blocked): blocked when the stage needs tune's unfinished pick
        (its tuned-recipe runs then carry the config's rates as placeholders)."""
        if stage == "tune":
            specs, complete, _, _ = self.tune_specs()
            return specs, False
        picks = self.picks()
        blocked = picks is None and stage in ("tuned", "under_epoch")
        tuned = self.tuned_sets(picks or self.centers)
        tuned_what = "the tuned recipe (%s)" % tables.lrs_text(picks or self.centers)
        specs = []
        for seed in self.seeds:
            if stage == "tuned":
                arms = [("recipe_tuned", RECIPE, tuned, tuned_what),
                        ("recipe_tanh", RECIPE, TANH,
                         "the recipe with speedrun_cpu's tanh cap 15, the config's rates"),
                        ("speedrun_cpu", SPEEDRUN, [], "speedrun_cpu to the end")]
                steps = self.steps
            elif stage == "no_value_embeds":
                arms = [("recipe_head022_no_ve", RECIPE,
                         ["optim.2.lr=0.22", "model.value_embeds=0"],
                         "the recipe with head lr 0.22, no value embeddings")]
                steps = self.steps
            elif stage == "under_epoch":
                arms = [("speedrun_cpu", SPEEDRUN, [], "speedrun_cpu"),
                        ("recipe_tuned", RECIPE, tuned, tuned_what)]
                steps = self.under_steps
            else:
                arms = [("speedrun_cpu", SPEEDRUN, [], "speedrun_cpu"),
                        ("speedrun_cpu_sigmoid", SPEEDRUN, SIGMOID,
                         "speedrun_cpu with the recipe's cap 30 sigmoid(z / 84.85)"),
                        ("recipe", RECIPE, [], "the recipe (sigmoid cap, head lr 0.008)"),
                        ("recipe_random_head", RECIPE, ["model.zero_init_head=false"],
                         "the recipe with a randomly initialised head"),
                        ("recipe_head022", RECIPE, ["optim.2.lr=0.22"],
                         "the recipe with head lr 0.22"),
                        ("recipe_tanh", RECIPE, TANH, "the recipe with the tanh cap 15")]
                steps = self.probe_steps
            for arm, config, sets, what in arms:
                s = self.spec(stage, arm, config, seed, steps, sets, what)
                s["order"] = len(specs)
                specs.append(s)
        return specs, blocked

    def check_tuned(self, specs):
        """A finished tuned-recipe run trained at other rates than tune's pick is refused."""
        for s in specs:
            if s["arm"] != "recipe_tuned" or not self.finished(s):
                continue
            d = self.run_dir(s)
            if os.path.isfile(os.path.join(d, RESULT)):
                with open(os.path.join(d, RESULT)) as f:
                    lrs = json.load(f)["lrs"]
            else:
                d, lrs = "%s (%s)" % (d, runpack.FILE), self.record(s)["result"]["lrs"]
            if any(not tables.close(lrs[c], s["lrs"][c]) for c in s["lrs"]):
                fail("%s trained the recipe at %s, but tune now picks %s: move it away" % (
                    d, tables.lrs_text(lrs), tables.lrs_text(s["lrs"])), 2)

    # ---- study.json, the epoch check, the plan ---------------------------------------------
    def study_about(self):
        return {"steps": self.steps, "under_epoch_steps": self.under_steps,
                "probe_steps": self.probe_steps, "np": self.np, "sets": self.extra,
                "val_tokens": self.val_tokens, "eval_every": self.eval_every,
                "batch_tokens": self.batch_tokens, "seq_len": self.seq_len,
                "tune_seed": self.tune_seed}

    def check_study(self, write):
        # The study's own study.json, else the committed one (a fresh clone): both must agree.
        path = os.path.join(self.runs_dir, "study.json")
        about = self.study_about()
        for held_path in (path, os.path.join(self.records_dir, "study.json")):
            if not os.path.isfile(held_path):
                continue
            with open(held_path) as f:
                held = json.load(f)
            diff = [k for k in about if held.get(k) != about[k]]
            if diff:
                fail("%s holds a study with %s, not %s: give another RUNS_DIR and RECORDS_DIR" % (
                    held_path, ", ".join("%s %s" % (k, held.get(k)) for k in diff),
                    ", ".join("%s %s" % (k, about[k]) for k in diff)), 2)
        if write and not os.path.isfile(path):
            os.makedirs(self.runs_dir, exist_ok=True)
            with open(path, "w") as f:
                json.dump(about, f, indent=1)

    def epoch(self):
        seqs = train_sequences(self.train_pattern, self.seq_len)
        used = self.under_steps * (self.batch_tokens // self.seq_len)
        return seqs, used

    def check_epoch(self):
        seqs, used = self.epoch()
        if used > seqs:
            fail("UNDER_EPOCH_STEPS %d reads %d sequences of %d tokens, more than the %d of one "
                 "epoch of %s: at most %d steps" % (
                     self.under_steps, used, self.seq_len, seqs, self.train_pattern,
                     seqs // (self.batch_tokens // self.seq_len)), 2)
        return seqs

    def step_seconds(self):
        """{config: (s per train step, s per validation)} from the committed runs' metrics."""
        out = {}
        for config, dirs in STEP_TIME_RUNS.items():
            steps, fb = [], []
            for d in dirs:
                for seed in sorted(glob.glob(os.path.join(d, "seed*"))):
                    rows = runlog.step_rows(os.path.join(seed, "metrics.jsonl"))
                    if rows:
                        step_ms, _, timed = runlog.steady_state(rows)
                        steps.append(step_ms)
                        fb += [r["phase_ms"]["forward_backward"] for r in timed
                               if "phase_ms" in r]
            step_s = statistics.median(steps) / 1e3 if steps else 1.0
            fb_s = statistics.median(fb) / 1e3 if fb else step_s
            out[config] = (step_s, self.val_tokens / self.batch_tokens * fb_s / 3)
        return out

    def run_seconds(self, spec, rates):
        step_s, val_s = rates[spec["config"]]
        evals = 1 + (spec["steps"] // self.eval_every if self.eval_every > 0 else 0) + \
            (1 if self.eval_every <= 0 or spec["steps"] % self.eval_every else 0)
        return spec["steps"] * step_s + evals * val_s + 10  # start-up and checkpoints: ~10 s

    def plan(self):
        rates = self.step_seconds()
        print("%-16s %5s %5s %6s %8s" % ("stage", "runs", "done", "steps", "hours left"))
        total = done_all = 0
        left_s = all_s = 0.0
        notes = []
        for stage in self.stages:
            specs, blocked = self.stage_specs(stage)
            runs = len(specs)
            done = sum(1 for s in specs if self.finished(s))
            s_left = sum(self.run_seconds(s, rates) for s in specs if not self.finished(s))
            s_all = sum(self.run_seconds(s, rates) for s in specs)
            extra = ""
            if stage == "tune":
                _, complete, _, k = self.tune_specs()
                if not complete:
                    # The later coordinates' points, not named before the earlier picks; an
                    # undecided edge may add one more each, within TUNE_MAX_RUNS.
                    more = self.new_points(k + 1)
                    one = self.run_seconds(self.tune_point(self.centers, "head"), rates)
                    runs += more
                    s_left += more * one
                    s_all += more * one
                    undecided = len([c for c in tables.COORDS[k:] if len(self.grids[c]) > 1])
                    top = min(self.tune_max, runs + undecided)
                    if top > runs:
                        extra = "-%d" % top
            left_s += s_left
            all_s += s_all
            total += runs
            done_all += done
            print("%-16s %5s %5d %6d %8.1f" % (stage, "%d%s" % (runs, extra), done,
                                               specs[0]["steps"] if specs else 0, s_left / 3600))
            if blocked:
                notes.append("%s runs the tuned recipe: it waits for tune's picks" % stage)
        print("%-16s %5d %5d %6s %8.1f" % ("all", total, done_all, "", left_s / 3600))
        print("estimate: %.1f h left of %.1f h in all, np %d x 1 thread on a quiet 2-core "
              "machine: %s (median steps of the committed runs; a validation of %d tokens at a "
              "third of a step's forward-backward a batch; ~10 s start-up a run)" % (
                  left_s / 3600, all_s / 3600, self.np,
                  ", ".join("%s %.3f s/step + %.1f s/validation" % (
                      os.path.basename(c)[:-5], r[0], r[1]) for c, r in rates.items()),
                  self.val_tokens))
        if "under_epoch" in self.stages:
            seqs, used = self.epoch()
            print("under_epoch: %d steps x %d tokens = %d tokens, %d of one epoch's %d "
                  "sequences of %s (%.1f%%)%s" % (
                      self.under_steps, self.batch_tokens, self.under_steps * self.batch_tokens,
                      used, seqs, self.train_pattern, 100.0 * used / seqs,
                      "" if used <= seqs else ": MORE THAN AN EPOCH, refused"))
        for n in notes:
            print("note: " + n)

    # ---- running and collecting --------------------------------------------------------------
    def command(self, spec):
        d = self.run_dir(spec)
        sets = ["train.seed=%d" % spec["seed"], "train.steps=%d" % spec["steps"],
                "train.target_val_loss=0", "log.dir=" + d, "checkpoint.dir=" + d + "/checkpoints",
                "checkpoint.every=%d" % self.ckpt_every, "checkpoint.keep=1",
                "checkpoint.at_end=false", "checkpoint.resume=auto"] + spec["sets"] + self.extra
        cmd = ["mpirun", "--oversubscribe", "-np", str(self.np), self.engine, "--config",
               spec["config"]]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    def forward_signal(self, signum, _frame):
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)  # mpirun passes it on; the engine saves and stops
        self.stopping = signum

    def train(self, spec, seqs):
        d = self.run_dir(spec)
        os.makedirs(d, exist_ok=True)
        cmd = self.command(spec)
        resumed = any(os.path.isfile(m) for m in
                      glob.glob(os.path.join(d, "checkpoints", "step_*", "manifest.yaml")))
        print("== %s/%s (%s; %s) %s" % (spec["stage"], spec["name"], spec["what"],
                                        "resumes" if resumed else "starts",
                                        time.strftime("%F %T UTC", time.gmtime())), flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        t0 = time.monotonic()
        with open(d + ".out", "a") as out:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            # Its own session: a signal to this script's process group reaches the run once,
            # through forward_signal (a second one would end the ranks before they save).
            self.child = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            rc = self.child.wait()
            self.child = None
        wall_file = os.path.join(d, "wall_s")
        wall = float(open(wall_file).read()) if os.path.isfile(wall_file) else 0.0
        wall += time.monotonic() - t0
        with open(wall_file, "w") as f:
            f.write("%.1f\n" % wall)
        if self.stopping:
            fail("stopped by signal %d in %s; run the same command again to resume it" % (
                self.stopping, spec["name"]), 128 + self.stopping)
        # Exit 3: the model died (non-finite or exploding loss, zero gradients; nothing saved):
        # a result, the same on every resume, kept with no final loss.
        diverged = rc == 3
        if rc != 0 and not diverged:
            fail("%s failed (exit %d; see %s.out); run the same command again to resume" % (
                d, rc, d))
        try:
            r = tables.read_run(d, {})
        except (runlog.RunLogError, OSError) as e:
            fail("%s: %s" % (d, e))
        if diverged:
            r["final_val_loss"] = None
        elif r["last_step"] != spec["steps"] or r["final_val_loss"] is None:
            fail("%s ended at step %d without the final validation of step %d (see %s.out)" % (
                d, r["last_step"], spec["steps"], d))
        result = {k: v for k, v in spec.items() if k != "sequences"}
        if seqs:
            result["epoch_sequences"] = seqs
            result["epoch_fraction"] = spec["sequences"] / seqs
        result.update({"final_val_loss": r["final_val_loss"], "diverged": diverged,
                       "wall_s": round(wall, 1), "command": " ".join(cmd)})
        shutil.rmtree(os.path.join(d, "checkpoints"), ignore_errors=True)
        with open(os.path.join(d, RESULT + ".tmp"), "w") as f:
            json.dump(result, f, indent=1)
        os.replace(os.path.join(d, RESULT + ".tmp"), os.path.join(d, RESULT))
        outcome = ("diverged at step %d (see %s.out)" % (r["last_step"], d) if diverged
                   else "final val loss %.4f" % r["final_val_loss"])
        print("   %s, %.0f s" % (outcome, wall), flush=True)

    def collect(self, quiet=False):
        # Every finished run of RUNS_DIR into the pack (the runs it holds already stay), in the
        # order the driver ran them.
        records = []
        for stage in tables.STAGES:
            src = os.path.join(self.runs_dir, stage)
            if not os.path.isdir(src):
                continue
            for name in sorted(os.listdir(src)):
                d = os.path.join(src, name)
                if os.path.isfile(os.path.join(d, RESULT)):
                    records.append(runpack.pack_run(d, "%s/%s" % (stage, name), KEEP))
        os.makedirs(self.records_dir, exist_ok=True)
        pack = os.path.join(self.records_dir, runpack.FILE)
        if records:
            runpack.add(pack, records)
        self.packed = runpack.read(pack)
        n = len(self.packed)
        about = os.path.join(self.runs_dir, "study.json")
        if os.path.isfile(about):
            shutil.copyfile(about, os.path.join(self.records_dir, "study.json"))
        try:
            tables.write_tables(self.records_dir)
        except (runlog.RunLogError, OSError, ValueError, KeyError) as e:
            fail("the tables of %s: %s" % (self.records_dir, e))
        if not quiet:
            print("recipe_study: %d finished runs -> %s (runs.jsonl.xz, tables.md)" % (n, self.records_dir),
                  flush=True)

    def run(self):
        os.makedirs(self.runs_dir, exist_ok=True)
        lock = open(os.path.join(self.runs_dir, "recipe_study.lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fail("another recipe_study.sh holds %s/recipe_study.lock" % self.runs_dir, 2)
        if not os.access(self.engine, os.X_OK):
            fail("no engine at %s (cmake --build build --target engine, or set BUILD_DIR)" %
                 self.engine, 2)
        self.check_study(write=True)
        seqs = self.check_epoch() if "under_epoch" in self.stages else None
        self.plan()
        signal.signal(signal.SIGTERM, self.forward_signal)
        signal.signal(signal.SIGINT, self.forward_signal)
        for stage in self.stages:
            print("==== stage %s (%s UTC)" % (stage, time.strftime("%F %T", time.gmtime())),
                  flush=True)
            while True:
                if self.stopping:
                    fail("stopped by signal %d between runs" % self.stopping, 128 + self.stopping)
                specs, blocked = self.stage_specs(stage)
                if blocked:
                    fail("stage %s runs the tuned recipe, and tune has not picked its rates: "
                         "run stage tune first (STAGES)" % stage, 2)
                self.check_tuned(specs)
                todo = [s for s in specs if not self.finished(s)]
                if not todo:
                    break
                self.train(todo[0], seqs if stage == "under_epoch" else None)
                self.collect(quiet=True)
        self.collect()
        print("recipe_study: done; commit %s (git add %s)" % (self.records_dir, self.records_dir))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "run"
    if mode in ("--help", "-h"):
        print(__doc__)
        return 0
    if len(sys.argv) > 2 or mode not in ("run", "--plan", "--collect"):
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    os.chdir(REPO)
    study = Study()
    if mode == "--plan":
        study.check_study(write=False)
        study.plan()
    elif mode == "--collect":
        study.collect()
    else:
        study.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
