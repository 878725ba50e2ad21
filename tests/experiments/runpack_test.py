#!/usr/bin/python3
"""experiments/runpack.py's thinning: the keys kept (step and val_loss whatever the list) and,
with every = N, only every N-th step's training row besides the first, the last and every row
with a val_loss; every = 1 keeps every row.

    runpack_test.py REPO
"""
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "experiments"))
import runpack  # noqa: E402

rows = [{"step": s, "train_loss": 10.0 - s, "lr": 0.1, "elapsed_ms": 7.0 * s} for s in range(1, 24)]
for r in rows:
    if r["step"] % 7 == 0:
        r["val_loss"] = 9.0 - r["step"]
assert runpack.thin(rows, None) == rows
kept = runpack.thin(rows, ["train_loss"], every=10)
assert [r["step"] for r in kept] == [1, 7, 10, 14, 20, 21, 23], [r["step"] for r in kept]
assert all(set(r) <= {"step", "train_loss", "val_loss"} for r in kept), kept
assert all(("val_loss" in r) == (r["step"] % 7 == 0) for r in kept), kept
print("PASS: keys kept, every 10th training row, the first, the last and every validation")
