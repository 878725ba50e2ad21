#!/usr/bin/env bash
# scripts/gpu_run.sh --rehearse: the GPU run's every part on the CPU, from a bundle packed and
# archived as for the GPU machine (bundle.sh --tests as gpu_check.sh packs it, then a fast xz
# archive unpacked by gpu_run.sh into a scratch folder), run from a copy of the checkout's files
# that the run reads. Passes when the summary names every part, each ok or skip (llm.c and the
# SOAP reference are peers outside the repository: llm.c stand-ins whose command lines the
# rehearsal prints, the SOAP reference located if present, else a skip).
#
#   gpu_run_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
bash "$repo/scripts/bundle.sh" "$work/engine_bundle" --build "$build" --no-cuda-libs \
  --tests 'tests/.*(cuda|device|nccl|gpu)' >/dev/null
tar -C "$work" -cf - engine_bundle | xz -0 -T0 >"$work/engine_bundle.tar.xz"
rm -rf "$work/engine_bundle"
# llm.c's two builds are peers built in a session, never in the repository: stand-ins here, whose
# command lines the rehearsal prints.
printf '#!/bin/sh\nexit 0\n' >"$work/llmc_stand_in" && chmod +x "$work/llmc_stand_in"
status=0
bash "$repo/scripts/gpu_run.sh" "$work/out" --archive "$work/engine_bundle.tar.xz" --rehearse \
  --budget 400 --llmc "$work/llmc_stand_in" --llmc-cudnn "$work/llmc_stand_in" \
  >"$work/console.txt" 2>&1 || status=$?
cat "$work/out/summary.txt" 2>/dev/null || tail -20 "$work/console.txt"
python3 - "$work/out/summary.json" "$status" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
parts = {p["part"]: p for p in s["parts"]}
want = "gpu tests speed recipe ranks resume families refresh soap ops".split()
missing = [p for p in want if p not in parts]
bad = ["%s: %s" % (p, parts[p]["state"]) for p in want if p in parts and parts[p]["state"] not in ("ok", "skip")]
assert s["rehearsal"], "the summary does not say it was a rehearsal"
assert not missing, "parts missing from the summary: %s" % missing
assert not bad, "parts not ok: %s" % bad
assert sys.argv[2] == "0", "gpu_run.sh exited %s with every part ok" % sys.argv[2]
speed = parts["speed"]["data"]["rows"]
assert {r["run"] for r in speed} >= {"engine fp32", "engine tf32", "engine bf16", "engine bf16 Muon",
                                    "engine bf16, earlier kernels", "engine bf16, residual add unfused",
                                    "engine bf16, attention on TF32 operands",
                                    "engine bf16 Muon ns f32"}, speed
no_issue = [r["run"] for r in speed if r["run"].startswith("engine") and "host_issue_fb_ms" not in r]
assert not no_issue, "speed rows without the host's issue time: %s" % no_issue
detail = parts["speed"]["detail"]
for peer in ("llmc", "llmc_cudnn"):
    assert "%s: would run " % peer in detail and "-e d12 -b 8 -t 1024" in detail, detail
print("PASS: %d parts in %d s" % (len(parts), s["seconds"]))
PY
# (grep reads the whole listing: with -q it would stop early and fail tar under pipefail)
tar -tzf "$work/out/logs.tar.gz" | grep 'ranks/np4_stage3/metrics.jsonl' >/dev/null ||
  { echo "FAIL: logs.tar.gz lacks the runs' metrics"; exit 1; }
