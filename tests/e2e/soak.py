#!/usr/bin/env python3
"""Soak: one training run killed at random moments and resumed with checkpoint.resume=auto, again
and again, then let finish and compared with one uninterrupted run of the same config and steps.
Started by tools/soak.sh (which documents the options); see docs/checkpoints_and_faults.md.

Each round starts the run (the first round fresh, every later one with checkpoint.resume=auto),
waits until the run has logged a drawn number of steps past its start and holds a complete
checkpoint (before the first one there is nothing to resume: a restart with resume=auto starts
afresh, as docs/checkpoints_and_faults.md says, and the round would test nothing), and stops it one of
these ways:

  kill_one        SIGKILL to one rank (drawn), a drawn fraction of a step later
  kill_all        SIGKILL to every rank and mpirun, a drawn fraction of a step later
  term            SIGTERM to every rank, a drawn fraction of a step later (the ranks finish the
                  step, save a checkpoint and exit 143)
  write_kill_one  SIGKILL to one rank the moment a step_XXXXXXXX.tmp folder (a checkpoint being
  write_kill_all  written) appears; or to every rank and mpirun; or SIGTERM to every rank
  write_term

The schedule (each round's kind, steps, fraction and rank) is drawn from --seed alone; where the
kills land in time depends on the machine. After each round:

  - every step_XXXXXXXX folder holds a manifest and is read whole by the engine's own reader
    (`engine export --checkpoint DIR`: the manifest's checksum, every file's size and FNV-1a 64,
    every slice against its file), once per folder and manifest;
  - a step_XXXXXXXX.tmp or .old folder (a save or a removal that was cut short) does not outlive
    the next round's first save: every save removes those of others;
  - a SIGTERM left the checkpoint of the step it stopped after, and the run exited 143;
  - the checkpoint folder's bytes, sampled every few milliseconds while the run ran, stayed within
    (checkpoint.keep + 2 [+ 1 with keep_best]) checkpoints: the kept ones, the one just renamed
    before the rotation removes the oldest, and one being written;
  - the next round resumes from the newest complete checkpoint (its "resumed from" line).

metrics.jsonl of a resumed run: the engine drops the lines after the checkpoint's step and
continues the file, so the finished run's file must hold every step exactly once, in order; its
train_loss, val_loss, grad_norm and lr are compared with the uninterrupted run's as JSON text (bit
for bit). Exit status 0 only when every check held, at least --kills kills (and --minutes
minutes) were done, and at least one resume re-did steps that a killed run had already logged.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e import kill_session  # noqa: E402
from faults import engine_pids  # noqa: E402

KINDS = ("kill_one", "kill_all", "term", "write_kill_one", "write_kill_all", "write_term")
COMPARED = ("train_loss", "val_loss", "grad_norm", "lr")
STEP_LINE = re.compile(r"^step:(\d+)/(\d+) train_loss:")
CKPT_DIR = re.compile(r"^step_(\d{8})$")
STAGING_DIR = re.compile(r"^step_(\d{8})\.(tmp|old)$")


class SoakFailure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise SoakFailure(message)


def folder_bytes(root):
    """Bytes of every file under root; files that vanish while it counts are skipped."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


class Run:
    """One mpirun of the engine: its output goes to a log file and is watched for step lines."""

    def __init__(self, cmd, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.steps = []          # steps logged, in order
        self.step_times = []     # when each was logged
        self.resumed_from = None
        self.saves = 0
        self.stopped_after = None
        self.tail = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.tail = (self.tail + [line])[-40:]
            m = STEP_LINE.match(line)
            if m:
                self.steps.append(int(m.group(1)))
                self.step_times.append(time.time())
            self.saves += line.startswith("checkpoint saved: ")
            m = re.search(r"resumed from (\S+) at step (\d+)", line)
            if m:
                self.resumed_from = int(m.group(2))
            m = re.search(r"stopped by SIG\w+ after step (\d+)", line)
            if m:
                self.stopped_after = int(m.group(1))

    def step_seconds(self):
        t = self.step_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.05

    def finish(self, timeout=180):
        try:
            self.proc.wait(timeout=timeout)
        finally:
            kill_session(self.proc.pid)
            self.proc.wait()
            self.reader.join(timeout=10)
            self.log.close()
        return self.proc.returncode


class Soak:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.data = os.path.join(self.out, "data")
        self.run_dir = os.path.join(self.out, "run")
        self.ckpt = os.path.join(self.run_dir, "ckpt")
        self.logs = os.path.join(self.out, "logs")
        self.rng = random.Random(args.seed)
        self.sets = ["train.steps=%d" % args.steps, "checkpoint.every=%d" % args.every,
                     "checkpoint.keep=%d" % args.keep, "checkpoint.keep_best=false"] + args.set
        self.verified = {}       # checkpoint folder -> its manifest's checksum line
        self.leftovers = set()   # (name, inode) of the .tmp / .old folders after the last round
        self.ckpt_bytes = 0      # largest complete checkpoint seen
        self.max_bytes = 0       # largest checkpoint folder seen
        self.kills = {k: 0 for k in KINDS}
        self.during_write = 0    # kills fired while a .tmp folder existed
        self.resumes = []        # (checkpoint step resumed from, steps the killed run had logged)
        self.rounds = []

    def command(self, resume, log_name, extra=()):
        cmd = ["mpirun", "--oversubscribe", "-np", str(self.args.np), self.args.engine,
               "--config", self.args.config,
               "--set", "data.train=" + os.path.join(self.data, "tiny_train_*.bin"),
               "--set", "data.val=" + os.path.join(self.data, "tiny_val_*.bin")]
        for s in list(self.sets) + list(extra) + (["checkpoint.resume=auto"] if resume else []):
            cmd += ["--set", s]
        return cmd, os.path.join(self.logs, log_name)

    def folders(self):
        """(complete checkpoint steps, {(name, inode)} of .tmp / .old folders) in the checkpoint
        folder."""
        complete, staging = [], set()
        if os.path.isdir(self.ckpt):
            for entry in os.scandir(self.ckpt):
                if CKPT_DIR.match(entry.name):
                    complete.append(int(entry.name[5:]))
                elif STAGING_DIR.match(entry.name):
                    try:
                        staging.add((entry.name, entry.inode()))
                    except OSError:
                        pass
        return sorted(complete), staging

    def writing(self):
        """Whether a checkpoint is being written (a step_XXXXXXXX.tmp folder exists)."""
        return any(name.endswith(".tmp") for name, _ in self.folders()[1])

    def bound(self):
        return (self.args.keep + 2) * self.ckpt_bytes

    def check_folder(self, what, saved):
        complete, staging = self.folders()
        for step in complete:
            d = os.path.join(self.ckpt, "step_%08d" % step)
            manifest = os.path.join(d, "manifest.yaml")
            check(os.path.isfile(manifest), "%s: %s has no manifest (half-written)" % (what, d))
            with open(manifest, "rb") as f:
                sum_line = f.read().rstrip().rsplit(b"\n", 1)[-1]
            if self.verified.get(d) != sum_line:
                p = subprocess.run([self.args.engine, "export", "--checkpoint", d, "--out",
                                    os.path.join(self.out, "verify.safetensors")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   timeout=300)
                check(p.returncode == 0, "%s: the engine cannot read %s (exit %d):\n%s" %
                      (what, d, p.returncode, p.stdout[-3000:]))
                self.verified[d] = sum_line
            self.ckpt_bytes = max(self.ckpt_bytes, folder_bytes(d))
        check(len(complete) <= self.args.keep + 1, "%s: %d complete checkpoints, keep is %d: %s" %
              (what, len(complete), self.args.keep, complete))
        if saved:
            kept = sorted(name for name, _ in staging & self.leftovers)
            check(not kept, "%s: %s, left by an earlier kill, outlived this round's saves" %
                  (what, kept))
        self.leftovers = staging
        total = folder_bytes(self.ckpt)
        self.max_bytes = max(self.max_bytes, total)
        check(self.max_bytes <= self.bound(), "%s: the checkpoint folder held %d bytes, over the "
              "bound of %d (keep %d + 2 checkpoints of %d)" %
              (what, self.max_bytes, self.bound(), self.args.keep, self.ckpt_bytes))
        return complete

    def draw(self):
        """The next round's kill, from the seed alone."""
        return {"kind": self.rng.choice(KINDS),
                "steps": self.rng.randint(1, self.args.max_steps_per_round),
                "fraction": self.rng.random(),
                "rank": self.rng.randrange(self.args.np)}

    def fire(self, run, plan):
        ranks = engine_pids(run.proc.pid)
        check(sorted(ranks) == list(range(self.args.np)), "engine ranks found: %s (is the "
              "executable named 'engine'?)" % ranks)
        self.during_write += self.writing()
        if plan["kind"].endswith("term"):
            for pid in ranks.values():
                os.kill(pid, signal.SIGTERM)
        elif plan["kind"].endswith("kill_one"):
            os.kill(ranks[plan["rank"]], signal.SIGKILL)
        else:
            kill_session(run.proc.pid)

    def round(self, index, plan, deadline):
        """Runs one round; returns the run's exit status."""
        complete_before = self.folders()[0]
        cmd, log = self.command(index > 0, "round_%04d.log" % index)
        run = Run(cmd, log)
        fired = False
        next_sample = 0.0
        while run.proc.poll() is None:
            now = time.time()
            if now >= next_sample:
                self.max_bytes = max(self.max_bytes, folder_bytes(self.ckpt))
                next_sample = now + 0.005
            armed = len(run.steps) >= plan["steps"] and self.folders()[0]
            if not fired and armed:
                if plan["kind"].startswith("write_"):
                    if self.writing():
                        self.fire(run, plan)
                        fired = True
                elif now >= run.step_times[plan["steps"] - 1] + plan["fraction"] * \
                        run.step_seconds():
                    self.fire(run, plan)
                    fired = True
            check(time.time() < deadline, "round %d: no end within %d s (see %s)" %
                  (index, self.args.round_timeout, log))
            time.sleep(0.001)
        rc = run.finish()
        what = "round %d (%s)" % (index, plan["kind"])
        if index > 0:
            check(run.resumed_from is not None or not complete_before,
                  "%s: the run did not resume (exit %d):\n%s" % (what, rc, "".join(run.tail)))
            if complete_before:
                check(run.resumed_from == complete_before[-1],
                      "%s: resumed from step %s, the newest complete checkpoint was step %d" %
                      (what, run.resumed_from, complete_before[-1]))
                self.resumes.append((run.resumed_from, self.rounds[-1]["last_step"]))
        if rc == 0:
            check(run.steps and run.steps[-1] == self.args.steps,
                  "%s: exit 0 before step %d" % (what, self.args.steps))
        elif plan["kind"].endswith("term") and fired:
            check(rc == 143, "%s: exit %d after SIGTERM, expected 143:\n%s" %
                  (what, rc, "".join(run.tail)))
            check(run.stopped_after is not None and run.stopped_after in self.folders()[0],
                  "%s: stopped after step %s without its checkpoint" % (what, run.stopped_after))
        else:
            check(fired, "%s: the run failed (exit %d) before it was killed:\n%s" %
                  (what, rc, "".join(run.tail)))
        if fired:
            self.kills[plan["kind"]] += 1
        self.check_folder(what, run.saves > 0)
        last = run.steps[-1] if run.steps else None
        self.rounds.append(dict(plan, index=index, rc=rc, fired=fired, last_step=last,
                                resumed_from=run.resumed_from))
        print("round %d: %-14s after %d step(s): %s, exit %d, logged steps %s-%s, "
              "checkpoints %s" % (index, plan["kind"], plan["steps"],
                                  "fired" if fired else "not fired", rc,
                                  run.steps[0] if run.steps else "-", last, self.folders()[0]),
              flush=True)
        return rc

    def limits_met(self, started):
        kills = sum(self.kills.values())
        minutes = (time.time() - started) / 60
        return kills >= self.args.kills and minutes >= self.args.minutes

    def run(self):
        a = self.args
        print("soak: seed %d, np %d, %d steps, checkpoint.every %d, keep %d, until %d kills and "
              "%g minutes; out %s" % (a.seed, a.np, a.steps, a.every, a.keep, a.kills, a.minutes,
                                       self.out), flush=True)
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.logs)
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                     "make_tiny_data.py"), self.data], check=True)
        ref_dir = os.path.join(self.out, "reference")
        cmd, log = self.command(False, "reference.log", ["log.dir=" + ref_dir,
                                                         "checkpoint.dir=" + ref_dir + "/ckpt"])
        t0 = time.time()
        rc = Run(cmd, log).finish(timeout=a.round_timeout)
        check(rc == 0, "the uninterrupted run failed (exit %d), see %s" % (rc, log))
        print("uninterrupted run: %d steps in %.0f s" % (a.steps, time.time() - t0), flush=True)
        self.sets += ["log.dir=" + self.run_dir, "checkpoint.dir=" + self.ckpt]

        started = time.time()
        index = 0
        while True:
            plan = self.draw()
            if self.limits_met(started):
                plan = {"kind": "finish", "steps": a.steps + 1, "fraction": 0, "rank": 0}
            rc = self.round(index, plan, time.time() + a.round_timeout)
            index += 1
            if rc == 0:
                break
        elapsed = time.time() - started
        complete, staging = self.folders()
        check(not staging, "interrupted saves left after the run finished: %s" % staging)
        check(complete[-1] == a.steps, "the finished run's newest checkpoint is step %d" %
              complete[-1])
        return self.compare(ref_dir, elapsed)

    def compare(self, ref_dir, elapsed):
        a = self.args

        def rows(d):
            with open(os.path.join(d, "metrics.jsonl")) as f:
                return [json.loads(line, parse_float=str) for line in f]

        run, ref = rows(self.run_dir), rows(ref_dir)
        check([r["step"] for r in run] == list(range(a.steps + 1)),
              "the soaked run's metrics.jsonl does not hold steps 0-%d once each, in order: %s" %
              (a.steps, [r["step"] for r in run][:50]))
        check([r["step"] for r in ref] == list(range(a.steps + 1)),
              "the uninterrupted run's metrics.jsonl does not hold steps 0-%d" % a.steps)
        compared = 0
        for r, s in zip(run, ref):
            for key in COMPARED:
                check(r.get(key) == s.get(key), "step %d %s: soaked %s, uninterrupted %s" %
                      (r["step"], key, r.get(key), s.get(key)))
                compared += key in s
        kills = sum(self.kills.values())
        redone = sum(max(0, (logged or 0) - start) for start, logged in self.resumes)
        check(kills >= a.kills, "only %d kills (wanted %d): the run reached step %d first; give "
              "more --steps" % (kills, a.kills, a.steps))
        check(elapsed / 60 >= a.minutes, "only %.1f minutes (wanted %g): the run reached step %d "
              "first; give more --steps" % (elapsed / 60, a.minutes, a.steps))
        check(any((logged or 0) > start for start, logged in self.resumes),
              "no resume re-did a step the killed run had logged: nothing was lost and found")
        return {"seed": a.seed, "np": a.np, "steps": a.steps, "minutes": round(elapsed / 60, 1),
                "kills": kills, "kills_by_kind": self.kills, "kills_during_write":
                self.during_write, "resumes": len(self.resumes), "steps_redone": redone,
                "checkpoints_verified": len(self.verified), "max_checkpoint_bytes":
                self.max_bytes, "bound_bytes": self.bound(), "values_compared": compared}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--max-steps-per-round", type=int, default=4)
    ap.add_argument("--round-timeout", type=int, default=600)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    soak = Soak(args)
    try:
        summary = soak.run()
        verdict = "PASS"
    except SoakFailure as e:
        summary = {"seed": args.seed, "kills_by_kind": soak.kills, "failure": str(e)}
        verdict = "FAIL"
    summary["verdict"] = verdict
    print("soak summary: seed %d; kills %s (%d landed while a checkpoint was being written); "
          "resumes %s, steps re-done %s; checkpoint folder at most %s bytes, bound %s; %s" %
          (args.seed, summary["kills_by_kind"], soak.during_write, summary.get("resumes", "-"),
           summary.get("steps_redone", "-"), summary.get("max_checkpoint_bytes", soak.max_bytes),
           summary.get("bound_bytes", soak.bound()), verdict))
    if verdict == "FAIL":
        print("soak: FAIL: " + summary["failure"])
    if args.json:
        print(json.dumps(summary))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
