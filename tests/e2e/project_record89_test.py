"""scripts/project_record.py record89: the arithmetic on record #89's own numbers (the spec's
sections 2.7, 2.11 and 4).

- the stage steps round(1270 k / 3): 423 / 424 / 423 + 15 = 1285 steps, 338,821,120 tokens;
- per stage step_8 = t1 / 8 + c from the one-GPU logs (231.0 / 429.9 / 633.1 / 636.3 ms) and the
  overhead 2.6 / 2.8 / 3.2 ms: 31.475 / 56.5375 / 82.3375 / 82.7375 ms, 73.36 s in all, within 1%
  of the table's 73.8 s (-0.6%); the dense FLOPs of a step 89.9 / 179.8 / 269.7 TFLOP;
- the model against the pair of logs it came from: the 8-GPU log of the same code
  (prefix-1375-8x: 31.5 / 56.6 / 82.4 / 83.0 ms over its own 1365 + 10 steps, 78.49 s mean
  total) from its one-GPU twin, with c computed from the stage means (so each stage is exact by
  construction); the total lands within 0.3% of the log's (the rest is the logs' first steps and
  rounding);
- --json rows, --one-gpu-json input, and clear errors for bad input.

Usage: project_record89_test.py REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = sys.argv[1]
SCRIPT = os.path.join(ROOT, "scripts", "project_record.py")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run(["/usr/bin/python3", SCRIPT, "record89", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def rows(*args):
    rc, out, err = run("--json", *args)
    if rc != 0:
        raise SystemExit(f"project_record.py record89 {args}: status {rc}: {err}")
    return [json.loads(line) for line in out.splitlines()]


def main():
    r = rows()
    stages, total = r[:-1], r[-1]
    check([x["stage"] for x in r] == ["1", "2", "3", "ext", "total"], "one JSON row per stage and the total")
    check([x["steps"] for x in stages] == [423, 424, 423, 15] and total["steps"] == 1285,
          "steps 423 / 424 / 423 + 15 = 1285")
    tokens = sum(x["steps"] * x["tokens_per_step"] for x in stages)
    check(tokens == 338821120, f"training tokens {tokens} = 338,821,120")
    want = [231.0 / 8 + 2.6, 429.9 / 8 + 2.8, 633.1 / 8 + 3.2, 636.3 / 8 + 3.2]
    check(all(abs(x["step_8_ms"] - w) < 1e-9 for x, w in zip(stages, want)),
          "step_8 = t1 / 8 + c: 31.475 / 56.5375 / 82.3375 / 82.7375 ms")
    secs = sum(w * n for w, n in zip(want, (423, 424, 423, 15))) / 1e3
    check(abs(total["seconds"] - secs) < 1e-3 and abs(secs - 73.36) < 0.01,
          f"total {total['seconds']} s = sum of steps x step_8 ({secs:.3f} s)")
    check(abs(total["vs_table"]) < 0.01 and abs(total["vs_table"] + 0.006) < 0.001,
          f"within 1% of the table's 73.8 s ({100 * total['vs_table']:+.2f}%)")
    check([round(x["dense_tflop_per_step"], 1) for x in stages] == [89.9, 179.8, 269.7, 269.7],
          "dense TFLOP a step 89.9 / 179.8 / 269.7 (6 x 114.33 M MACs a token)")
    check(all(x["dominant"].startswith("compute") for x in stages) and "stage 3" in total["dominant"],
          f"dominant: the compute in every stage, stage 3 overall ({total['dominant']})")

    # The pair of logs the model came from: c from the stage means reproduces each stage exactly,
    # the total over the logs' own 1365 + 10 steps the 8-GPU log's 78.49 s mean within 0.3%.
    one, eight = [231.0, 429.9, 633.1, 636.3], [31.5, 56.6, 82.4, 83.0]
    c = ",".join(str(round((8 * b - a) / 8, 6)) for a, b in zip(one, eight))
    r8 = rows("--overhead-ms", c, "--scheduled", "1365", "--extension", "10")
    check(all(abs(x["step_8_ms"] - b) < 1e-9 for x, b in zip(r8, eight)),
          f"c = (8 t8 - t1) / 8 = {c} gives the 8-GPU log's stage steps")
    check([x["steps"] for x in r8[:-1]] == [455, 455, 455, 10] and abs(r8[-1]["seconds"] / 78.49 - 1) < 0.003,
          f"the 8-GPU log's schedule: {r8[-1]['seconds']} s against its 78.49 s "
          f"({100 * (r8[-1]['seconds'] / 78.49 - 1):+.2f}%)")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "one_gpu.json")
        with open(path, "w") as f:
            json.dump({"one_gpu_ms": {"1": 800, "2": 1600, "3": 2400}, "source": "engine device run"}, f)
        rj = rows("--one-gpu-json", path)
        check(rj[3]["one_gpu_ms"] == 2400 and abs(rj[0]["step_8_ms"] - 102.6) < 1e-9,
              "--one-gpu-json: the engine's times; ext takes stage 3's")
        rc, out, _ = run("--one-gpu-json", path)
        check(rc == 0 and "engine device run" in out and "total 1285 steps" in out, "table output names its source")
        with open(path, "w") as f:
            json.dump({"one_gpu_ms": {"1": 800, "2": 1600}}, f)
        rc, _, err = run("--one-gpu-json", path)
        check(rc != 0 and path in err and '"3"' in err, "a JSON without stage 3 is refused by name")
    rc, _, err = run("--one-gpu-ms", "1,2")
    check(rc != 0 and "--one-gpu-ms 1,2" in err, "--one-gpu-ms with 2 numbers is refused")
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
