#!/usr/bin/python3
"""project_record: the record's step time on 8 GPUs projected from one GPU, and a check of the
same model of a step against CPU runs at np 2, 4 and 8 (docs/record_recipe.md).

A ZeRO step of W ranks, each with its share of the batch (the trainer's phases, engine/trainer.cpp):

    step_W = F_W + clip + O / W + (1 - h) t_red + t_ag

  F_W   forward_backward of one rank's share of the batch (a one-device run of that share);
  O     the optimizer phase over every parameter (one rank); with W ranks each steps its 1/W;
  t_red the gradient reduction of G bytes (the f32 gradients of every parameter): ZeRO stage 1
        all-reduces them, G 2 (W - 1) / W / busbw_allreduce; stages 2-3 reduce-scatter them,
        G (W - 1) / W / busbw (nccl-tests' bus bandwidth definitions);
  h     the fraction of t_red hidden behind the backward (ZeRO's buckets start as layers finish):
        1 - reduce_grads / t_red, the reduce_grads phase being what the step still waits for after
        the backward, measured on the CPU at np 8 (zero.overlap on);
  t_ag  the updated parameters' all-gather, G (W - 1) / W / busbw (gather_params runs after the
        optimizer: nothing to hide behind).

gpu mode: F_8 is a one-GPU step of one rank's share of the record's batch (49152 tokens: the
device run's recipe part, `--one-gpu RUN_DIR`, or --provisional: the last GPU run's numbers,
docs/gpu_runs/2026-11-27_h200 run2, GPT-2 124M bf16 Muon at 8192 tokens a step on an H200,
scaled linearly to 49152 tokens - not the recipe, not an H100); busbw is NCCL's bus bandwidth on
8 x H100 SXM (NVLink4, NVSwitch), NVIDIA's figures: 370 GB/s for reduce-scatter and all-gather
("NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe as BusBw when
running non-allreduce operations": the 450 GB/s line rate less ~20% protocol overhead) and
~480 GB/s for all-reduce with NVLink SHARP ("On 8 GPUs, you should reach a peak busBw of
~480GB/s"), S. Jeaugey, NVIDIA/nccl-tests issue #212, 2024-05-06. The projection times the
record's 1770 steps, beside its 2.966 minutes (record #24, 8 x H100).

cpu-check mode: the same model on this machine. As the GPU projection starts from one device
running one rank's share, F_W is an np 1 run of the config at batch_tokens / W (--share W=DIR);
the optimizer is the np 1 full-batch run's (--np1). W ranks on C cores time-share them:
compute phases times s(W) = W / min(W, C) (a GPU node: C = W, s = 1). h is the np 8 run's; the
reduction and the all-gather take bench_comm's measured busbw (the async column) at the bucket
size (zero.bucket_mb) and at the parameter size (the largest bench size at most that). The
predicted np 2, 4, 8 steps are compared with measured runs (--run W=DIR).

record89 mode: record #89's 8 x H100 training time, stage by stage, from one-GPU step times
(the project's record #89 spec, modded_nanogpt_record89.md, sections 2.7, 2.11 and 4). Per stage s:

    step_8(s) = t1(s) / 8 + c(s)

  t1    one GPU's step of the stage's full global batch (8 micro-steps of one rank's share, the
        optimizer once: 8 F + O), as the record's own one-GPU logs time it;
  c     the exposed 8-GPU overhead (communication and sync not hidden): c = (8 t8 - t1) / 8 from
        the record's pair of logs of the same code on 1 and 8 H100s (2026-07-13_PrefixToken-
        Prediction, prefix-1375 and prefix-1375-8x): 2.6 / 2.8 / 3.2 ms (stage 3's for the
        extension). The model's other form, F + O / 8 + c, is this one with t1 = 8 F + O.
The steps are the record's: stage bounds round(N k / 3) of its N = 1270 scheduled steps (423 /
424 / 423) and 15 extension steps at stage 3's shape; tokens per step 131072 / 262144 / 393216.
By default t1 is the record's own one-GPU log (prefix-1375, 10 runs: 231.0 / 429.9 / 633.1 /
636.3 ms), so the script reproduces the record's 8-GPU time from its 1-GPU logs, beside the
table's 1.23 min = 73.8 s (no log runs HEAD itself). --one-gpu-ms or --one-gpu-json put in the
engine's own one-GPU step times at the record's stage shapes (a device run fills the JSON).
Each row: the stage's one-GPU and projected 8-GPU step, its steps, seconds, share of the total,
the dense model FLOPs of a step (6 x 114.33 M MACs a token, section 2.11) and what they make per
GPU, and the part that dominates (the compute t1 / 8 or the overhead c).

Run folders are engine log.dir folders: metrics.jsonl and config.yaml (the effective config).
"""
import argparse
import json
import os
import statistics
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402

RECORD_STEPS = 1770
RECORD_MINUTES = 2.966  # record #24 (PR #102): 2.966 min on 8 x H100
NCCL_H100_BUSBW_GBS = 370.0  # reduce_scatter / all_gather, 8 x H100 NVLink4 (nccl-tests #212)
NCCL_H100_ALLREDUCE_BUSBW_GBS = 480.0  # all_reduce with NVLink SHARP, same source
# docs/gpu_runs/2026-11-27_h200/run2.summary.txt, "engine bf16 Muon": GPT-2 124M, B 8 x 1024
PROVISIONAL = {"source": "docs/gpu_runs/2026-11-27_h200 run2 'engine bf16 Muon' (H200, GPT-2 124M, "
                         "8192 tokens a step, bf16), forward_backward scaled to 49152 tokens",
               "tokens": 8192, "forward_backward": 68.16, "clip": 2.36, "optimizer": 153.24}


# Record #89 (modded-nanogpt f411b3d3; the spec's sections 2.7, 2.11 and 4).
R89_TABLE_SECONDS = 73.8  # README: 1.23 min on 8 x H100
R89_SCHEDULED, R89_EXTENSION = 1270, 15
R89_STAGE_TOKENS = (131072, 262144, 393216, 393216)
R89_ONE_GPU_MS = (231.0, 429.9, 633.1, 636.3)  # prefix-1375 on 1 x H100, full global batch
R89_OVERHEAD_MS = (2.6, 2.8, 3.2, 3.2)  # (8 t8 - t1) / 8, prefix-1375-8x against prefix-1375
R89_MACS_PER_TOKEN = 114.33e6  # matmul MACs a token, forward (section 2.11)
R89_STAGES = ("1", "2", "3", "ext")


class ProjectionError(Exception):
    pass


def load_yaml(path):
    try:
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except OSError as e:
        raise ProjectionError(f"{path}: cannot read ({e.strerror})")


def model_section(config_path):
    """The model keys of an engine config (defaults as engine/config.h declares them)."""
    m = dict(load_yaml(config_path).get("model") or {})
    defaults = {"arch": "modern", "n_layer": 4, "n_head": 4, "d_model": 256, "vocab_size": 50257,
                "vocab_pad": 64, "no_attn_layers": "", "value_embeds": 0, "unet_skips": False,
                "x0_lambdas": False, "v_lambdas_all": False, "moe": {}}
    for k, v in defaults.items():
        m.setdefault(k, v)
    return m


def parameter_count(m, where):
    """Parameters of the modern dense model (model/param_table.cpp's list)."""
    if m["arch"] != "modern" or (m.get("moe") or {}).get("experts", 0):
        raise ProjectionError(f"{where}: the projection counts the modern dense model's parameters "
                              f"(arch modern, no MoE)")
    D, L = int(m["d_model"]), int(m["n_layer"])
    Vp = -(-int(m["vocab_size"]) // int(m["vocab_pad"])) * int(m["vocab_pad"])
    no_attn = {int(t) for t in str(m["no_attn_layers"]).split(",") if t.strip()}
    n_ve = int(m["value_embeds"])
    total = Vp * D * (2 + n_ve)  # embedding, lm_head, value tables
    total += L // 2 if m["unet_skips"] else 0
    for layer in range(L):
        total += 2 if m["x0_lambdas"] else 0
        total += 8 * D * D  # MLP fc and proj
        if layer in no_attn:
            continue
        total += 4 * D * D  # qkv and proj
        has_table = layer < n_ve or layer >= L - n_ve
        total += 2 if (m["v_lambdas_all"] or has_table) else 0
    return total


def run_phases(run_dir, device):
    """Median step ms and phase ms (device_phase_ms with device, else phase_ms) past the warm-up
    quarter, the median comm_wait_ms and the comm bytes of the last row."""
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = runlog.step_rows(path)
    if not rows:
        raise ProjectionError(f"{path}: no training step rows")
    ms, _, timed = runlog.steady_state(rows)
    key = "device_phase_ms" if device and timed[0].get("device_phase_ms") else "phase_ms"
    phases = {k: statistics.median(r[key].get(k, 0.0) for r in timed) for k in timed[0].get(key, {})}
    need = {"forward_backward", "reduce_grads", "clip", "optimizer", "gather_params"}
    if not need <= set(phases):
        raise ProjectionError(f"{path}: rows lack the phases {sorted(need - set(phases))}")
    return {"step_ms": ms, "phases": phases,
            "comm_wait_ms": statistics.median(r.get("comm_wait_ms", 0.0) for r in timed),
            "comm_bytes": timed[-1].get("comm_bytes", {}), "rows": len(timed)}


def collective_ms(nbytes, world, busbw_gbs, kind="reduce_scatter"):
    """nccl-tests: busbw = size / time * (W - 1) / W for reduce_scatter (size: the input of all
    blocks) and all_gather (size: the output), * 2 (W - 1) / W for all_reduce."""
    if world <= 1:
        return 0.0
    factor = 2 if kind == "all_reduce" else 1
    return nbytes * factor * (world - 1) / world / (busbw_gbs * 1e9) * 1e3


def reduction_kind(config):
    """The collective that reduces the gradients: ZeRO stage 1 all-reduces, 2 and 3 reduce-scatter."""
    stage = int((config.get("zero") or {}).get("stage", 1))
    return "all_reduce" if stage == 1 else "reduce_scatter"


def read_bench_comm(paths):
    """{np: {collective: [(bytes, busbw)]}} from bench_comm --json lines (the async column: the
    engine's nonblocking collectives, as ZeRO issues them)."""
    out = {}
    for path in paths:
        try:
            lines = open(path).read().splitlines()
        except OSError as e:
            raise ProjectionError(f"{path}: cannot read ({e.strerror})")
        for n, line in enumerate(lines, 1):
            if not line.strip().startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ProjectionError(f"{path}:{n}: not JSON ({e})")
            out.setdefault(int(r["np"]), {}).setdefault(r["collective"], []).append(
                (int(r["bytes"]), float(r["async_busbw_gbs"])))
    return out


def busbw_at(bench, world, collective, nbytes, where):
    rows = sorted(bench.get(world, {}).get(collective, []))
    if not rows:
        raise ProjectionError(f"{where}: bench_comm has no {collective} rows at np {world}")
    fitting = [bw for b, bw in rows if b <= nbytes]
    return fitting[-1] if fitting else rows[0][1]


def hidden_fraction(np8, grad_bytes, busbw_gbs, kind):
    """h = 1 - reduce_grads / t_red of the np 8 run, in [0, 1]."""
    t_red = collective_ms(grad_bytes, 8, busbw_gbs, kind)
    exposed = np8["phases"]["reduce_grads"]
    return (max(0.0, min(1.0, 1.0 - exposed / t_red)) if t_red > 0 else 0.0), t_red, exposed


def project_step(world, fb, clip, optimizer, grad_bytes, red_busbw, ag_busbw, h, kind):
    """The step model above: fb, clip and optimizer are this rank's (already scaled)."""
    t_red = collective_ms(grad_bytes, world, red_busbw, kind)
    t_ag = collective_ms(grad_bytes, world, ag_busbw)
    parts = {"forward_backward": fb, "clip": clip, "optimizer": optimizer,
             "reduce_grads (exposed)": (1.0 - h) * t_red, "gather_params": t_ag}
    return sum(parts.values()), parts, t_red


def overlap_of(run_dir, bench_paths, bucket_mb):
    """h from a CPU np 8 run folder and bench_comm outputs, with its source."""
    np8 = run_phases(run_dir, device=False)
    cfg = load_yaml(os.path.join(run_dir, "config.yaml"))
    kind = reduction_kind(cfg)
    params = parameter_count(model_section(os.path.join(run_dir, "config.yaml")), run_dir)
    bw = busbw_at(read_bench_comm(bench_paths), 8, kind, bucket_mb * 2**20, "--bench-comm")
    h, t_red, exposed = hidden_fraction(np8, 4 * params, bw, kind)
    return h, (f"measured: {run_dir} (CPU np 8, {kind}: reduce_grads {exposed:.2f} ms of "
               f"{t_red:.2f} ms at bench_comm's {bw:.2f} GB/s)")


def gpu_mode(args):
    # The measured run's own config when there is one (its model is the one timed), else --config.
    config = os.path.join(args.one_gpu, "config.yaml") if args.one_gpu else args.config
    kind = reduction_kind(load_yaml(config))
    params = parameter_count(model_section(config), config)
    grad_bytes = 4 * params
    if args.one_gpu:
        r = run_phases(args.one_gpu, device=True)
        cfg = load_yaml(os.path.join(args.one_gpu, "config.yaml"))
        tokens = int((cfg.get("train") or {}).get("batch_tokens", 0))
        src = f"{args.one_gpu} (measured, {tokens} tokens a step)"
        scale = args.rank_tokens / tokens if tokens else 1.0
        fb, clip, opt = (r["phases"]["forward_backward"] * scale, r["phases"]["clip"],
                         r["phases"]["optimizer"])
    elif args.provisional:
        p = PROVISIONAL
        src = "PROVISIONAL: " + p["source"]
        fb, clip, opt = p["forward_backward"] * args.rank_tokens / p["tokens"], p["clip"], p["optimizer"]
    else:
        raise ProjectionError("gpu mode needs --one-gpu RUN_DIR or --provisional")
    if args.overlap_np8:
        h, h_src = overlap_of(args.overlap_np8, args.bench_comm, args.bucket_mb)
    else:
        h, h_src = args.hidden, "given (--hidden)"
    red_bw = args.allreduce_busbw if kind == "all_reduce" else args.busbw
    total, parts, t_red = project_step(8, fb, clip, opt / 8, grad_bytes, red_bw, args.busbw, h,
                                       kind)
    minutes = total * RECORD_STEPS / 6e4
    result = {"parameters": params, "grad_bytes": grad_bytes, "reduction": kind,
              "one_gpu_source": src, "busbw_gbs": red_bw, "allgather_busbw_gbs": args.busbw,
              "hidden_fraction": round(h, 3), "hidden_source": h_src,
              "t_reduction_ms": round(t_red, 3),
              "parts_ms": {k: round(v, 2) for k, v in parts.items()},
              "step_ms": round(total, 2), "steps": RECORD_STEPS, "minutes": round(minutes, 3),
              "record_minutes": RECORD_MINUTES, "ratio_to_record": round(minutes / RECORD_MINUTES, 3),
              "dominant": max(parts, key=parts.get)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"projected 8 x H100 step of the record ({config}, {params} parameters, "
          f"{grad_bytes / 1e9:.3f} GB of f32 gradients by {kind}, the parameters all-gathered)")
    print(f"  one-GPU input: {src}")
    print(f"  NCCL busbw {red_bw} GB/s ({kind}), {args.busbw} GB/s (all_gather); hidden fraction "
          f"of the reduction h = {h:.3f} ({h_src})")
    for k, v in parts.items():
        print(f"  {k:24s} {v:9.2f} ms")
    print(f"  step {total:.2f} ms x {RECORD_STEPS} steps = {minutes:.2f} min "
          f"(record #24: {RECORD_MINUTES} min; x{minutes / RECORD_MINUTES:.2f}); "
          f"dominant: {result['dominant']}")


def parse_runs(specs, flag):
    runs = {}
    for spec in specs:
        w, _, d = spec.partition("=")
        if not w.isdigit() or not d:
            raise ProjectionError(f"{flag} {spec}: expected NP=RUN_DIR")
        runs[int(w)] = d
    return runs


def cpu_check(args):
    one = run_phases(args.np1, device=False)
    cfg = load_yaml(os.path.join(args.np1, "config.yaml"))
    kind = reduction_kind(cfg)
    params = parameter_count(model_section(os.path.join(args.np1, "config.yaml")), args.np1)
    grad_bytes = 4 * params
    bucket = float((cfg.get("zero") or {}).get("bucket_mb", 4.0)) * 2**20
    bench = read_bench_comm(args.bench_comm)
    runs = {w: run_phases(d, device=False) for w, d in parse_runs(args.run, "--run").items()}
    shares = {w: run_phases(d, device=False) for w, d in parse_runs(args.share, "--share").items()}
    if 8 not in runs:
        raise ProjectionError("cpu-check needs the np 8 run (--run 8=DIR): it gives the overlap h")
    bw8 = busbw_at(bench, 8, kind, bucket, "--bench-comm")
    h, t_red8, exposed8 = hidden_fraction(runs[8], grad_bytes, bw8, kind)
    out = []
    for w in sorted(runs):
        if w not in shares:
            raise ProjectionError(f"np {w}: no np 1 run of its share (--share {w}=DIR, "
                                  f"train.batch_tokens / {w})")
        s = w / min(w, args.cores)
        red_bw = busbw_at(bench, w, kind, bucket, "--bench-comm")
        ag_bw = busbw_at(bench, w, "all_gather", grad_bytes, "--bench-comm")
        share = shares[w]["phases"]
        pred, parts, _ = project_step(w, share["forward_backward"] * s, share["clip"],
                                      one["phases"]["optimizer"] * s / w, grad_bytes, red_bw,
                                      ag_bw, h, kind)
        meas = runs[w]["step_ms"]
        out.append({"np": w, "predicted_ms": round(pred, 2), "measured_ms": round(meas, 2),
                    "error": round(pred / meas - 1, 4),
                    "predicted_phases": {k: round(v, 2) for k, v in parts.items()},
                    "measured_phases": {k: round(v, 2) for k, v in runs[w]["phases"].items()},
                    "gradient_bytes": {"computed": grad_bytes,
                                       "measured": runs[w]["comm_bytes"].get(kind)}})
    if args.json:
        for row in out:
            print(json.dumps(row))
        return
    print(f"cpu-check: np 1 step {one['step_ms']:.1f} ms ({args.np1}), {params} parameters, "
          f"{args.cores} cores, gradients by {kind}, h = {h:.3f} (np 8: reduce_grads "
          f"{exposed8:.2f} ms of {t_red8:.2f} ms at {bw8:.3f} GB/s)")
    print(f"{'np':>3} {'predicted':>10} {'measured':>10} {'error':>8}  gradient bytes computed / "
          f"measured (rank 0's {kind})")
    for r in out:
        b = r["gradient_bytes"]
        print(f"{r['np']:>3} {r['predicted_ms']:>10.1f} {r['measured_ms']:>10.1f} "
              f"{100 * r['error']:>7.1f}%  {b['computed']} / {b['measured']}")
        print(f"      predicted {r['predicted_phases']}")
        print(f"      measured  {r['measured_phases']}")


def record89_steps(scheduled, extension):
    """Steps per stage: the record's bounds round(N k / 3) (Python's round, as the record's
    TrainingSchedule), then the extension."""
    bounds = [0] + [round(scheduled * k / 3) for k in (1, 2)] + [scheduled]
    return [b - a for a, b in zip(bounds, bounds[1:])] + [extension]


def four_values(text, what):
    try:
        v = [float(t) for t in text.split(",")]
    except ValueError:
        raise ProjectionError(f"{what} {text}: expected 4 numbers (stages 1, 2, 3, ext)")
    if len(v) != 4 or min(v) < 0:
        raise ProjectionError(f"{what} {text}: expected 4 non-negative numbers (stages 1, 2, 3, ext)")
    return v


def read_one_gpu_json(path):
    """{"one_gpu_ms": {"1": ms, "2": ms, "3": ms, "ext": ms}, "source": "..."}; a missing "ext"
    takes stage 3's time (the same shape)."""
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise ProjectionError(f"{path}: cannot read ({e.strerror})")
    except json.JSONDecodeError as e:
        raise ProjectionError(f"{path}: not JSON ({e})")
    ms = d.get("one_gpu_ms") if isinstance(d, dict) else None
    if not isinstance(ms, dict) or not all(k in ms for k in ("1", "2", "3")):
        raise ProjectionError(f"{path}: needs one_gpu_ms with stages \"1\", \"2\", \"3\" (and \"ext\")")
    try:
        vals = [float(ms[k]) for k in ("1", "2", "3")] + [float(ms.get("ext", ms["3"]))]
    except (TypeError, ValueError):
        raise ProjectionError(f"{path}: one_gpu_ms values must be numbers of milliseconds")
    return vals, str(d.get("source", path))


def record89_projection(one_gpu_ms, overhead_ms, steps, world=8):
    """Rows per stage and the total (see the module's record89 section)."""
    rows = []
    for name, t1, c, n, tokens in zip(R89_STAGES, one_gpu_ms, overhead_ms, steps, R89_STAGE_TOKENS):
        compute = t1 / world
        step = compute + c
        flop = 6 * R89_MACS_PER_TOKEN * tokens
        rows.append({"stage": name, "one_gpu_ms": t1, "compute_ms": round(compute, 4), "overhead_ms": c,
                     "step_8_ms": round(step, 4), "steps": n, "seconds": round(step * n / 1e3, 4),
                     "tokens_per_step": tokens, "dense_tflop_per_step": round(flop / 1e12, 2),
                     "tflops_per_gpu": round(flop / (world * step * 1e-3) / 1e12, 1),
                     "dominant": "compute (t1 / 8)" if compute >= c else "overhead c"})
    total = sum(r["seconds"] for r in rows)
    for r in rows:
        r["share"] = round(r["seconds"] / total, 4)
    compute_s = sum(r["compute_ms"] * r["steps"] for r in rows) / 1e3
    top = max(rows, key=lambda r: r["seconds"])
    rows.append({"stage": "total", "steps": sum(steps), "seconds": round(total, 3),
                 "compute_seconds": round(compute_s, 3), "overhead_seconds": round(total - compute_s, 3),
                 "table_seconds": R89_TABLE_SECONDS,
                 "vs_table": round(total / R89_TABLE_SECONDS - 1, 4),
                 "dominant": f"stage {top['stage']} ({100 * top['share']:.0f}% of the time); compute "
                             f"{100 * compute_s / total:.0f}%, overhead {100 * (1 - compute_s / total):.0f}%"})
    return rows


def record89_mode(args):
    if args.one_gpu_json and args.one_gpu_ms:
        raise ProjectionError("give --one-gpu-ms or --one-gpu-json, not both")
    if args.one_gpu_json:
        one, src = read_one_gpu_json(args.one_gpu_json)
    elif args.one_gpu_ms:
        one, src = four_values(args.one_gpu_ms, "--one-gpu-ms"), "--one-gpu-ms"
    else:
        one, src = list(R89_ONE_GPU_MS), "the record's 1 x H100 logs (prefix-1375, 10 runs)"
    over = four_values(args.overhead_ms, "--overhead-ms")
    if args.scheduled < 3 or args.extension < 0:
        raise ProjectionError("--scheduled must be at least 3 and --extension non-negative")
    rows = record89_projection(one, over, record89_steps(args.scheduled, args.extension))
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"record #89 on 8 x H100, step_8 = t1 / 8 + c per stage; t1: {src}")
    print(f"{'stage':>5} {'t1 ms':>7} {'t1/8':>7} {'c':>5} {'step_8':>7} {'steps':>5} {'s':>7} "
          f"{'share':>6} {'TFLOP/step':>10} {'TFLOP/s/GPU':>11}  dominant")
    for r in rows[:-1]:
        print(f"{r['stage']:>5} {r['one_gpu_ms']:7.1f} {r['compute_ms']:7.2f} {r['overhead_ms']:5.1f} "
              f"{r['step_8_ms']:7.2f} {r['steps']:5d} {r['seconds']:7.2f} {100 * r['share']:5.1f}% "
              f"{r['dense_tflop_per_step']:10.1f} {r['tflops_per_gpu']:11.0f}  {r['dominant']}")
    t = rows[-1]
    print(f"total {t['steps']} steps, {t['seconds']:.2f} s ({t['seconds'] / 60:.3f} min) beside the table's "
          f"1.23 min = {R89_TABLE_SECONDS} s ({100 * t['vs_table']:+.1f}%); compute {t['compute_seconds']:.2f} s, "
          f"overhead {t['overhead_seconds']:.2f} s; dominant: {t['dominant']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("gpu", help="project the record's 8 x H100 time")
    g.add_argument("--config", default="configs/speedrun_gpu.yaml",
                   help="the model whose bytes move (with --one-gpu: that run's config.yaml)")
    g.add_argument("--one-gpu", help="run folder of the one-GPU recipe step (np 1)")
    g.add_argument("--provisional", action="store_true",
                   help="use the last GPU run's numbers (not the recipe: stated as provisional)")
    g.add_argument("--rank-tokens", type=int, default=49152, help="one rank's tokens a step")
    g.add_argument("--busbw", type=float, default=NCCL_H100_BUSBW_GBS,
                   help="reduce_scatter / all_gather bus bandwidth, GB/s")
    g.add_argument("--allreduce-busbw", type=float, default=NCCL_H100_ALLREDUCE_BUSBW_GBS)
    g.add_argument("--overlap-np8", help="CPU np 8 run folder whose reduce_grads gives h")
    g.add_argument("--bench-comm", nargs="*", default=[], help="bench_comm --json outputs")
    g.add_argument("--bucket-mb", type=float, default=4.0)
    g.add_argument("--hidden", type=float, default=0.0,
                   help="h without --overlap-np8 (default 0: none of the reduction hidden)")
    g.add_argument("--json", action="store_true")
    c = sub.add_parser("cpu-check", help="predict CPU np 2/4/8 steps from np 1 and compare")
    c.add_argument("--np1", required=True, help="np 1 run folder")
    c.add_argument("--run", action="append", default=[], help="NP=RUN_DIR, measured (repeat)")
    c.add_argument("--share", action="append", default=[],
                   help="NP=RUN_DIR: np 1 at batch_tokens / NP (repeat)")
    c.add_argument("--bench-comm", nargs="+", required=True, help="bench_comm --json outputs")
    c.add_argument("--cores", type=int, default=os.cpu_count())
    c.add_argument("--json", action="store_true")
    r = sub.add_parser("record89", help="record #89's 8 x H100 time by stage from one-GPU steps")
    r.add_argument("--one-gpu-ms", help="one GPU's full-batch step, ms, stages 1,2,3,ext "
                                        "(default: the record's own one-GPU logs)")
    r.add_argument("--one-gpu-json", help='JSON {"one_gpu_ms": {"1": ms, "2": ms, "3": ms, "ext": ms}, '
                                          '"source": "..."} (a device run writes it)')
    r.add_argument("--overhead-ms", default=",".join(str(v) for v in R89_OVERHEAD_MS),
                   help="exposed 8-GPU overhead c per stage, ms (default: the record's logs)")
    r.add_argument("--scheduled", type=int, default=R89_SCHEDULED, help="scheduled steps (3 stages)")
    r.add_argument("--extension", type=int, default=R89_EXTENSION, help="extension steps")
    r.add_argument("--json", action="store_true", help="one JSON object per row")
    args = ap.parse_args()
    try:
        {"gpu": gpu_mode, "cpu-check": cpu_check, "record89": record89_mode}[args.mode](args)
    except ProjectionError as e:
        sys.exit(f"project_record: {e}")


if __name__ == "__main__":
    main()
