#!/usr/bin/env python3
"""End-to-end tests of train.precision (docs/precision.md) on the tiny config: bf16 across world
sizes, bit-exact resume in bf16 (also with model.mlp_fp8's delayed scales), checkpoints crossing
precisions, and the fallbacks (bf16 on a CPU
without bf16 instructions, forced with ENGINE_CPU_NO_BF16=1; tf32 on any CPU) equal to the fp32
run bit for bit with one warning line.

usage: precision.py --engine PATH --repo DIR --work DIR CASE

Shares the tiny-config set-up of e2e.py (Env: token shards generated per case, mpirun command).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402
from e2e import SAME_BATCH_768, check, check_bit_identical, compare_losses, metrics  # noqa: E402

BF16 = ["train.precision=bf16"]
NO_CHECKPOINTS = ["checkpoint.every=0", "checkpoint.at_end=false"]

# bf16 at another world size. Step 1 starts from the same weights and meets the fp32 bars
# (e2e.py, WORLD_SIZE_*; measured 0 for the loss, 2e-9 for the global gradient norm at np 2).
# From then on the world sizes' weights differ in their last float bits, and now and then such a
# weight or an activation rounds to the other bf16 neighbour, a step of 2^-8 relative in that
# element, which the following steps carry on: over 20 steps the losses drift up to 1.5e-4 and
# the global gradient norms up to 1.2e-3 apart (modern, np 2, 3, 4; gpt2 np 2: 1.9e-4 and
# 3.5e-3, one step's spike, 1.3e-4 and 1.7e-3 before attention's backward read its bf16 output:
# a flip of a stored output now moves the gradients too), still below the bf16-vs-fp32
# difference itself (up to 6.3e-4 in the loss). Since the residual stream is stored in bf16 too
# (every element of it rounded at every block, so such flips are far more frequent) the losses
# drift up to 6.7e-4 apart (modern np 2, 3, 4, 8: 3.9e-4, 6.7e-4, 4.5e-4, 5.4e-4; gpt2 np 2, 4:
# 2.7e-4, 2.4e-4) and the gradient norms up to 3.8e-3 (gpt2 np 2; modern 1.3e-3): the size of
# the bf16-vs-fp32 difference on this config (6.2e-4 and 2.5e-3 modern, 4.0e-4 and 7.5e-3 gpt2),
# as on cpu_small's 200 steps (docs/precision.md). The loss bar moved from 5e-4 to 1.5e-3 for it
# (2.2x above); step 1 still meets the fp32 bars.
BF16_LATER_LOSS_RTOL = 1.5e-3
BF16_LATER_NORM_RTOL = 7e-3


def case_bf16_world_size(env):
    """bf16 on np 1, 2 (stage 1), 3 (stage 3: each layer's copies remade after its gather), 4
    (stage 2) and 8 (stage 3) on the same global batch; gpt2 (LayerNorm and GELU storing bf16,
    the bias gradients read from the bf16 d pre and d qkv) on np 1, 2 and 4."""
    base = BF16 + SAME_BATCH_768 + NO_CHECKPOINTS
    runs = [("", [], ((2, 1), (3, 3), (4, 2), (8, 3))),
            ("gpt2 ", ["model.arch=gpt2"], ((2, 1), (4, 2)))]
    for arch, arch_sets, others in runs:
        compare_world_sizes(env, arch, base + arch_sets, others)


def compare_world_sizes(env, arch, sets, others):
    name = arch.strip() or "modern"
    one = metrics(env.run(1, name + "_np1", sets)[1])
    for np, stage in others:
        other = metrics(env.run(np, "%s_np%d" % (name, np), sets + ["zero.stage=%d" % stage])[1])
        what = "%sbf16 np %d stage %d vs np 1" % (arch, np, stage)
        first = compare_losses(other, one, range(0, 2), e2e.WORLD_SIZE_LOSS_RTOL, what)
        first_norm = compare_losses(other, one, range(1, 2), e2e.WORLD_SIZE_NORM_RTOL, what,
                                    keys=("grad_norm",))
        later = compare_losses(other, one, range(2, 21), BF16_LATER_LOSS_RTOL, what)
        later_norm = compare_losses(other, one, range(2, 21), BF16_LATER_NORM_RTOL, what,
                                    keys=("grad_norm",))
        print("%sbf16: np %d stage %d vs np 1, largest relative difference: step 1 loss %.2e, "
              "grad norm %.2e; steps 2-20 losses %.2e, grad norm %.2e" %
              (arch, np, stage, first, first_norm, later, later_norm))


# A checkpoint continued in the other precision against the straight run in the first: the same
# weights and optimizer state, every GEMM input rounded (or not) to bf16, for ten steps: the
# losses move by the bf16 effect itself (measured 1.7e-4 and 2.4e-4; bf16 against fp32 from step
# 0 differs by up to 6.3e-4 on this config).
CROSS_PRECISION_LOSS_RTOL = 1e-3


def case_bf16_resume(env):
    """A bf16 run's step-10 checkpoint resumed on the same world size: steps 11-20 bit-identical
    (the copies are remade from the restored f32 weights exactly as the straight run had them)."""
    for stage in (1, 3):
        sets = BF16 + ["zero.stage=%d" % stage]
        _, straight = env.run(2, "straight_stage%d" % stage, sets)
        ckpt10 = os.path.join(straight, "ckpt", "step_00000010")
        _, resumed = env.run(2, "resumed_stage%d" % stage, sets + ["checkpoint.resume=" + ckpt10])
        check(min(metrics(resumed)) == 11, "the resumed run did not start at step 11")
        check_bit_identical(metrics(resumed), metrics(straight), range(11, 21),
                            "bf16 stage %d resumed" % stage)
        print("bf16 stage %d: steps 11-20 bit-identical after resume" % stage)


def case_mlp_fp8_resume(env):
    """model.mlp_fp8 in bf16 on np 2 (two micro-steps a rank; two warm-up forwards, whose scales
    are put back): the step-20 checkpoint, past the 16 steps whose projection scales are their
    own amax, resumed: steps 21-30 bit-identical, so every rank got its own delayed scales back
    (model/fp8_mlp_scales in the manifest, from both ranks)."""
    sets = BF16 + ["model.mlp_fp8=true", "train.steps=30", "train.warmup_steps=2"]
    _, straight = env.run(2, "straight", sets)
    ckpt20 = os.path.join(straight, "ckpt", "step_00000020")
    with open(os.path.join(ckpt20, "manifest.yaml")) as f:
        manifest = f.read()
    check(manifest.count("model/fp8_mlp_scales") >= 2,
          "the checkpoint's manifest lists no model/fp8_mlp_scales slice per rank")
    _, resumed = env.run(2, "resumed", sets + ["checkpoint.resume=" + ckpt20])
    check(min(metrics(resumed)) == 21, "the resumed run did not start at step 21")
    check_bit_identical(metrics(resumed), metrics(straight), range(21, 31), "mlp_fp8 resumed")
    print("mlp_fp8 bf16 np 2: steps 21-30 bit-identical after resume")


def case_cross_precision_resume(env):
    """A bf16 checkpoint continued in fp32 and an fp32 one continued in bf16: the checkpoints
    hold the same f32 tensors whatever the precision (file for file, the same names and sizes),
    and each continuation stays within the bf16 bar of the straight run it left."""
    _, b16 = env.run(2, "bf16", BF16)
    _, f32 = env.run(2, "fp32", [])
    for run in (b16, f32):
        check(os.path.isdir(os.path.join(run, "ckpt", "step_00000010")), "no step-10 checkpoint")
    sizes = {}
    for name, run in (("bf16", b16), ("fp32", f32)):
        ckpt = os.path.join(run, "ckpt", "step_00000010")
        sizes[name] = {f: os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)
                       if f.endswith(".safetensors")}
    check(sizes["bf16"] == sizes["fp32"], "checkpoint files differ: %s" % sizes)
    for source, target, sets in (("bf16", b16, []), ("fp32", f32, BF16)):
        ckpt10 = os.path.join(target, "ckpt", "step_00000010")
        _, d = env.run(2, "%s_continued" % source, sets + ["checkpoint.resume=" + ckpt10])
        check(min(metrics(d)) == 11, "the %s checkpoint did not resume at step 11" % source)
        worst = compare_losses(metrics(d), metrics(target), range(11, 21),
                               CROSS_PRECISION_LOSS_RTOL,
                               "%s checkpoint continued in the other precision" % source)
        print("%s checkpoint continued in %s: largest relative loss difference %.2e" %
              (source, "fp32" if source == "bf16" else "bf16", worst))


def warnings_about(output, key):
    return [line for line in output.splitlines() if "train.precision=" + key in line]


def case_fallbacks(env):
    """bf16 with ENGINE_CPU_NO_BF16=1 (a CPU without AVX512_BF16 or AMX) and tf32 (a GPU format)
    run fp32, saying so in one line: the metrics equal the fp32 run's bit for bit."""
    sets = NO_CHECKPOINTS
    _, f32 = env.run(2, "fp32", sets)
    os.environ["ENGINE_CPU_NO_BF16"] = "1"
    try:
        p, forced = env.run(2, "bf16_forced", sets + BF16)
    finally:
        del os.environ["ENGINE_CPU_NO_BF16"]
    p_tf32, tf32 = env.run(2, "tf32", sets + ["train.precision=tf32"])
    for what, proc, run, key in (("bf16 without bf16 instructions", p, forced, "bf16"),
                                 ("tf32 on the CPU", p_tf32, tf32, "tf32")):
        lines = warnings_about(proc.stdout + proc.stderr, key)
        check(len(lines) == 1, "%s: expected one warning line, got %s" % (what, lines))
        check("running fp32" in lines[0], "%s: the warning does not say fp32: %s" % (what, lines))
        check_bit_identical(metrics(run), metrics(f32), range(0, 21), what + " vs fp32")
        print("%s: one line (%s), metrics bit-identical to fp32" % (what, lines[0].strip()))
    # The real thing differs: bf16 took effect where the CPU has the instructions.
    p_b16, b16 = env.run(2, "bf16", sets + BF16)
    if not warnings_about(p_b16.stdout + p_b16.stderr, "bf16"):
        check(metrics(b16)[20]["train_loss"] != metrics(f32)[20]["train_loss"],
              "bf16 with bf16 instructions gave the fp32 losses")


CASES = {
    "bf16_world_size": case_bf16_world_size,
    "bf16_resume": case_bf16_resume,
    "cross_precision_resume": case_cross_precision_resume,
    "mlp_fp8_resume": case_mlp_fp8_resume,
    "fallbacks": case_fallbacks,
}

if __name__ == "__main__":
    sys.exit(e2e.main(CASES))
