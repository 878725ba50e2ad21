#!/usr/bin/env bash
# bench_model --op-groups on the CPU: the measured step in each precision asked for, then one row
# per op group of the gpt2 architecture (none of the GPU-only attention paths) and the two sums;
# every time positive, and the f32 sum at least its matmuls.
#
#   bench_model_op_groups_test.sh BENCH_MODEL
set -euo pipefail
bench=$1
out=$("$bench" --op-groups --threads 1 --steps 1 --precision fp32,bf16 --json)
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(line) for line in sys.argv[1].splitlines()]
steps = [r for r in rows if "step_ms" in r]
groups = {r["group"]: r["ms_per_step"] for r in rows if "group" in r}
assert [r["precision"] for r in steps] == ["fp32", "bf16"], steps
assert all(r["threads"] == 1 for r in rows), rows
for name in ["matmul (linear layers and head)", "matmul bf16", "attention", "layernorm", "gelu",
             "classifier (cross-entropy, dlogits)", "classifier capped (tanh cap 15)",
             "adamw (multi-tensor, every parameter)",
             "sum of the groups", "sum of the groups, bf16 run"]:
    assert name in groups, (name, sorted(groups))
assert not any("tf32" in g and "GEMM" not in g or "TF32" in g for g in groups), sorted(groups)
assert all(ms > 0 for ms in groups.values()), groups
assert groups["sum of the groups"] >= groups["matmul (linear layers and head)"], groups
print(f"PASS: bench_model --op-groups ({len(groups)} groups)")
PY
