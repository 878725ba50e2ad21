#!/usr/bin/env bash
# forgetting.sh: does OSFT keep a first task better than plain AdamW at a similar gain on a second
# one? (issue 11; docs/specs/osft.md section 11)
#   1. pretrains the default CPU model (configs/cpu_small.yaml) on the informative-prose Brown
#      split (data/brown_informative, scripts/prepare_data.sh);
#   2. fine-tunes it on the imaginative-prose split for FT_STEPS steps from the pretrained weights
#      (train.init_from): with torch AdamW on every weight (configs/osft_finetune_baseline.yaml)
#      and with OSFT at each unfreeze_rank_ratio of URRS (configs/osft_finetune.yaml), once per
#      seed of SEEDS (the seed draws the fine-tuning data order: data.shuffle on);
#   3. evaluates the pretrained and every fine-tuned checkpoint on both splits' validation tokens
#      (engine eval) and writes runs/forgetting/forgetting.{md,json,png}.
# Knobs (environment): PRETRAIN_STEPS (300), FT_STEPS (150), SEEDS ("1 2"), URRS ("0.5 0.25"),
# NP (2 ranks, OMP_NUM_THREADS 1 each), BUILD_DIR (build), OUT (runs/forgetting).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-build}"
out="${OUT:-runs/forgetting}"
np="${NP:-2}"
pretrain_steps="${PRETRAIN_STEPS:-300}"
ft_steps="${FT_STEPS:-150}"
seeds="${SEEDS:-1 2}"
urrs="${URRS:-0.5 0.25}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Several threads per rank need as many cores: Open MPI binds each rank to one core at np <= 2.
bind=()
if ((OMP_NUM_THREADS > 1)); then bind=(--bind-to none); fi
engine="$build/apps/engine/engine"
[[ -x "$engine" ]] || { echo "forgetting.sh: $engine not built (cmake --build $build --target engine)" >&2; exit 2; }
for split in brown_informative brown_imaginative; do
  compgen -G "data/$split/${split}_train_*.bin" > /dev/null ||
    { echo "forgetting.sh: no data/$split shards: run bash scripts/prepare_data.sh" >&2; exit 2; }
done
start=$SECONDS
mkdir -p "$out"
run() { mpirun --oversubscribe "${bind[@]}" -np "$np" "$engine" "$@"; }
split_sets() {  # train and val shards of one split
  echo --set "data.train=data/$1/$1_train_*.bin" --set "data.val=data/$1/$1_val_*.bin"
}
# The validation loss of a checkpoint on one split.
val_loss() {
  run eval --checkpoint "$1" --set "data.val=data/$2/$2_val_*.bin" 2>&1 |
    sed -n 's/.*val_loss:\([0-9.]*\).*/\1/p' | tail -1
}

echo "== pretraining on brown_informative ($pretrain_steps steps)"
run --config configs/cpu_small.yaml $(split_sets brown_informative) \
  --set "train.steps=$pretrain_steps" --set checkpoint.every=0 --set checkpoint.keep=1 \
  --set "checkpoint.dir=$out/pretrain/checkpoints" --set "log.dir=$out/pretrain" \
  > "$out/pretrain.log" 2>&1
pretrained="$(ls -d "$out"/pretrain/checkpoints/step_* | tail -1)"
results="$out/results.tsv"
printf 'arm\tseed\tinformative\timaginative\n' > "$results"
printf 'pretrained\t-\t%s\t%s\n' "$(val_loss "$pretrained" brown_informative)" \
  "$(val_loss "$pretrained" brown_imaginative)" >> "$results"

finetune() {  # arm config seed
  local dir="$out/$1_seed$3"
  echo "== fine-tuning $1, seed $3 ($ft_steps steps on brown_imaginative)"
  run --config "$2" $(split_sets brown_imaginative) --set "train.init_from=$pretrained" \
    --set "train.seed=$3" --set data.shuffle=true --set "train.steps=$ft_steps" \
    --set checkpoint.every=0 \
    --set checkpoint.keep=1 --set "checkpoint.dir=$dir/checkpoints" --set "log.dir=$dir" \
    > "$dir.log" 2>&1
  local ckpt
  ckpt="$(ls -d "$dir"/checkpoints/step_* | tail -1)"
  printf '%s\t%s\t%s\t%s\n' "$1" "$3" "$(val_loss "$ckpt" brown_informative)" \
    "$(val_loss "$ckpt" brown_imaginative)" >> "$results"
}
for seed in $seeds; do
  finetune adamw configs/osft_finetune_baseline.yaml "$seed"
  for urr in $urrs; do
    config="$out/osft_urr$urr.yaml"
    sed "s/unfreeze_rank_ratio: .*/unfreeze_rank_ratio: $urr/" configs/osft_finetune.yaml > "$config"
    finetune "osft_urr$urr" "$config" "$seed"
  done
done
elapsed=$((SECONDS - start))

/usr/bin/python3 - "$out" "$elapsed" "$np" "$pretrain_steps" "$ft_steps" <<'PY'
import json, statistics, sys
out, elapsed, np_, pre, ft = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/results.tsv")][1:]
base = next(r for r in rows if r[0] == "pretrained")
b_inf, b_img = float(base[2]), float(base[3])
runs = [{"arm": r[0], "seed": int(r[1]), "informative": float(r[2]), "imaginative": float(r[3]),
         "forgetting": float(r[2]) - b_inf, "gain": b_img - float(r[3])}
        for r in rows if r[0] != "pretrained"]
arms = sorted({r["arm"] for r in runs}, key=lambda a: (a != "adamw", a))
summary = []
for a in arms:
    rs = [r for r in runs if r["arm"] == a]
    mean = lambda k: statistics.mean(r[k] for r in rs)
    spread = lambda k: (max(r[k] for r in rs) - min(r[k] for r in rs)) / 2
    summary.append({"arm": a, "seeds": len(rs), "informative": mean("informative"),
                    "imaginative": mean("imaginative"), "forgetting": mean("forgetting"),
                    "forgetting_halfrange": spread("forgetting"), "gain": mean("gain"),
                    "gain_halfrange": spread("gain")})
doc = {"pretrained": {"informative": b_inf, "imaginative": b_img}, "runs": runs,
       "summary": summary, "np": int(np_), "pretrain_steps": int(pre), "finetune_steps": int(ft),
       "elapsed_s": elapsed}
json.dump(doc, open(f"{out}/forgetting.json", "w"), indent=2)
lines = [f"Validation loss (lower is better) before and after {ft} fine-tuning steps on "
         f"brown_imaginative, from a model pretrained {pre} steps on brown_informative; "
         f"np {np_}, mean over seeds (± half the range); {elapsed} s in all.", "",
         "| arm | seeds | informative val (before → after) | forgetting (Δ informative) | "
         "imaginative val (before → after) | gain (−Δ imaginative) |",
         "|---|---|---|---|---|---|"]
for s in summary:
    lines.append(f"| {s['arm']} | {s['seeds']} | {b_inf:.4f} → {s['informative']:.4f} | "
                 f"{s['forgetting']:+.4f} ± {s['forgetting_halfrange']:.4f} | "
                 f"{b_img:.4f} → {s['imaginative']:.4f} | "
                 f"{s['gain']:+.4f} ± {s['gain_halfrange']:.4f} |")
open(f"{out}/forgetting.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 4.5))
for a in arms:
    rs = [r for r in runs if r["arm"] == a]
    ax.scatter([r["gain"] for r in rs], [r["forgetting"] for r in rs], label=a, s=40)
ax.set_xlabel("gain on brown_imaginative (val loss drop)")
ax.set_ylabel("forgetting of brown_informative (val loss rise)")
ax.set_title(f"Fine-tuning {ft} steps after {pre} pretraining steps")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(f"{out}/forgetting.png", dpi=120)
PY
echo "forgetting.sh: $out/forgetting.{md,json,png} ($((SECONDS - start)) s)"
