#!/usr/bin/env python3
"""Compares a run's metrics (JSON Lines) with a stored reference curve.

usage: loss_regression.py METRICS.jsonl REFERENCE.jsonl [--rtol R] [--atol A]
                          [--tolerance FIRST-LAST=R ...] [--keys train_loss,val_loss]

For every step of the reference and every key it holds, the run must have the same key with
|run - ref| <= atol + rtol * |ref|. `--tolerance 1-50=1e-5` overrides rtol for steps 1..50
(`100-` means 100 and later); later --tolerance arguments win. Prints a per-step table of the
differences; exits 1 at drift, printing the first drifting step, 0 otherwise.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402


def load(path):
    try:
        return runlog.by_step(runlog.read_metrics(path))
    except runlog.RunLogError as e:
        sys.exit(str(e))


def parse_tolerance(text):
    try:
        span, value = text.split("=")
        first, _, last = span.partition("-")
        lo = int(first)
        hi = int(last) if last else (lo if "-" not in span else sys.maxsize)
        return lo, hi, float(value)
    except ValueError:
        sys.exit("bad --tolerance %r (expected FIRST-LAST=RTOL, e.g. 1-50=1e-5 or 100-=1e-3)" %
                 text)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics")
    p.add_argument("reference")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=0.0)
    p.add_argument("--tolerance", action="append", default=[], type=parse_tolerance)
    p.add_argument("--keys", default="train_loss,val_loss")
    p.add_argument("--quiet", action="store_true", help="no per-step table")
    a = p.parse_args()
    run, ref = load(a.metrics), load(a.reference)
    keys = a.keys.split(",")

    def rtol_at(step):
        r = a.rtol
        for lo, hi, value in a.tolerance:
            if lo <= step <= hi:
                r = value
        return r

    first_drift = None
    checked = 0
    if not a.quiet:
        print("%6s %-11s %14s %14s %10s %9s" % ("step", "key", "run", "reference", "rel diff",
                                                "rtol"))
    for step in sorted(ref):
        for key in keys:
            if key not in ref[step]:
                continue
            want = ref[step][key]
            got = run.get(step, {}).get(key)
            tol = rtol_at(step)
            if got is None or want is None:
                ok, diff = got == want, float("inf")
            else:
                diff = abs(got - want) / max(abs(want), 1e-30)
                ok = abs(got - want) <= a.atol + tol * abs(want)
            checked += 1
            if not a.quiet:
                print("%6d %-11s %14s %14.8g %10.2e %9.1e%s" %
                      (step, key, "missing" if got is None else "%.8g" % got, want, diff, tol,
                       "" if ok else "  DRIFT"))
            if not ok and first_drift is None:
                first_drift = (step, key, got, want, diff, tol)
    if checked == 0:
        print("no reference values for keys %s in %s" % (keys, a.reference))
        return 1
    if first_drift:
        step, key, got, want, diff, tol = first_drift
        print("DRIFT: first at step %d: %s = %s, reference %.8g (relative %.2e > %.1e)" %
              (step, key, got, want, diff, tol))
        return 1
    print("OK: %d values within tolerance of %s" % (checked, a.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
