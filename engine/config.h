// The engine's configuration: typed sections read from YAML, then `--set a.b=c` overrides.
//
// Every scalar field is declared exactly once, in the ENGINE_CONFIG_FIELDS table below, with its
// section, C++ type, member, YAML key, default, whether it is required and a one-line doc. That
// one declaration makes the struct member, the YAML parser entry, the override parser, the
// printed effective config and docs/configuration.md's config reference. The `optim` section is
// the ordered list of parameter groups; its shape is checked here and each group's
// hyperparameters are left to the optimizer registry.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace engine {

inline constexpr bool kRequired = true;
inline constexpr bool kOptional = false;

// Top-level keys (no section): F(top, type, member, "key", default, required, "doc").
#define ENGINE_TOP_FIELDS(F)                                                                  \
  F(top, std::string, device, "device", "auto", kOptional,                                    \
    "auto (cuda when the build has it and the rank sees a GPU, else cpu) | cpu | cuda (rank " \
    "r of a node drives its GPU r; refused without a CUDA build or GPU)")

// Each section's fields: F(section, type, member, "key.in.section", default, required, "doc").
#define ENGINE_MODEL_FIELDS(F)                                                                  \
  F(model, std::string, arch, "arch", "modern", kOptional,                                      \
    "gpt2 (learned positions, LayerNorm, GELU, tied head) | modern (rotary, RMSNorm, ReLU^2)")  \
  F(model, int64_t, n_layer, "n_layer", 4, kOptional, "transformer blocks")                     \
  F(model, int64_t, n_head, "n_head", 4, kOptional, "attention heads (d_model % n_head == 0)")  \
  F(model, int64_t, d_model, "d_model", 256, kOptional, "residual stream width D")              \
  F(model, int64_t, seq_len, "seq_len", 256, kOptional, "tokens per sequence T")                \
  F(model, int64_t, vocab_size, "vocab_size", 50257, kOptional,                                 \
    "vocabulary V (padded to a multiple of 64 inside the model)")                               \
  F(model, double, softcap, "softcap", 0.0, kOptional, "logit soft-cap (0 = off)")              \
  F(model, int64_t, moe_experts, "moe.experts", 0, kOptional,                                   \
    "mixture-of-experts MLP with this many experts (0 = dense MLP)")                            \
  F(model, int64_t, moe_top_k, "moe.top_k", 2, kOptional, "experts per token")                  \
  F(model, double, moe_aux_weight, "moe.aux_weight", 0.01, kOptional,                           \
    "weight of the load-balancing loss")                                                        \
  F(model, int64_t, vocab_pad, "vocab_pad", 64, kOptional,                                      \
    "pad the vocabulary to a multiple of this (the record: 128)")                               \
  F(model, std::string, softcap_form, "softcap_form", "tanh", kOptional,                        \
    "tanh (softcap tanh(z / softcap)) | sigmoid (softcap sigmoid(z / softcap_scale))")          \
  F(model, double, softcap_scale, "softcap_scale", 0.0, kOptional,                              \
    "the sigmoid soft-cap's s (the record: 7.5 sqrt(d_model))")                                 \
  F(model, double, softcap_offset, "softcap_offset", 0.0, kOptional,                            \
    "the sigmoid cap's b: softcap sigmoid((z + b) / softcap_scale) (#89: 5)")                   \
  F(model, double, attn_scale, "attn_scale", 0.0, kOptional,                                    \
    "attention score scale (0 = 1/sqrt(head size); the record: 0.12; modern only)")             \
  F(model, std::string, no_attn_layers, "no_attn_layers", "", kOptional,                        \
    "comma list of blocks without attention, MLP only (the record: \"7\"; modern only)")        \
  F(model, int64_t, value_embeds, "value_embeds", 0, kOptional,                                 \
    "value-embedding tables: block i and block n_layer - n + i mix table i into V (modern)")    \
  F(model, std::string, value_embed_layers, "value_embed_layers", "", kOptional,                \
    "#89: comma list of the attention blocks with a value table, table i in block i of the "    \
    "list (in place of value_embeds' placement; the record: \"1, 2, 8, 9, 10\"; modern)")       \
  F(model, bool, unet_skips, "unet_skips", false, kOptional,                                    \
    "U-net: the second half's blocks add the mirrored first-half outputs with learned weights") \
  F(model, bool, x0_lambdas, "x0_lambdas", false, kOptional,                                    \
    "each block's input is l0 x + l1 x0 (x0 the embedding output; learned, init 1, 0)")         \
  F(model, bool, zero_init_head, "zero_init_head", false, kOptional,                            \
    "lm_head starts at zero (modern)")                                                          \
  F(model, int64_t, doc_bos, "doc_bos", -1, kOptional,                                          \
    "token that starts a document: attention stays within documents (-1 = off; modern)")        \
  F(model, int64_t, window, "window", 0, kOptional,                                             \
    "sliding attention window in tokens of the long blocks, short ones half (0 = off; modern)") \
  F(model, std::string, window_pattern, "window_pattern", "", kOptional,                        \
    "one L (long window) or S (short) per block; '' = every block long")                        \
  F(model, bool, window_grow, "window_grow", false, kOptional,                                  \
    "grow the long window linearly from 128 to model.window over train.steps, in 128s; a "      \
    "validation after k steps (and `engine eval` of the step-k checkpoint) uses step k's "      \
    "window (with window_block: the record's rule, docs/record_recipe.md)")                     \
  F(model, int64_t, window_block, "window_block", 0, kOptional,                                 \
    "windows in blocks of this many tokens, as the record's block masks (the record: 128): "    \
    "a query in block b sees its document's keys in blocks b - n + 1 .. b, n = window / "       \
    "block (short: n / 2, at least 1); 0 = token-granular")                                     \
  F(model, bool, x0_norm, "x0_norm", false, kOptional,                                          \
    "x0 = rmsnorm(embedding) feeds block 0 and the x0 lambdas (the record; modern)")            \
  F(model, double, norm_eps, "norm_eps", 1e-6, kOptional,                                       \
    "eps of every RMSNorm (the record: float32's machine epsilon 1.1920929e-07; modern)")       \
  F(model, double, rotary_base, "rotary_base", 10000.0, kOptional,                              \
    "rotary base (the record: 1024; modern)")                                                   \
  F(model, bool, rotary_truncate, "rotary_truncate", false, kOptional,                          \
    "the record's half-truncated rotary: head_dim/4 pairs at base^(-j/(head_dim/4 - 1)), "      \
    "the other head_dim/4 unrotated (modern)")                                                  \
  F(model, bool, v_lambdas_all, "v_lambdas_all", false, kOptional,                              \
    "every attention block scales v by a learned l0 (init 0.5), plus l1 ve where a value "      \
    "table feeds it (the record; else only the blocks with a table; modern)")                   \
  F(model, bool, loss_over_padding, "loss_over_padding", false, kOptional,                      \
    "the loss's softmax runs over all padded logits, as the record's (else the vocabulary)")    \
  F(model, double, embed_std, "embed_std", 0.02, kOptional,                                     \
    "init std of the embedding and value-embedding tables (the record's nn.Embedding: 1)")      \
  F(model, bool, uniform_matrix_init, "uniform_matrix_init", false, kOptional,                  \
    "QKV and MLP fc weights start U(-sqrt(3) s, sqrt(3) s), s = 0.5 / sqrt(fan in), the "       \
    "record's (else normal, std 0.02; modern)")                                                 \
  F(model, bool, head_fp8, "head_fp8", false, kOptional,                                        \
    "training runs lm_head in FP8 as the record: e4m3 inputs over sqrt(D)/448 and 24/448, "     \
    "e5m2 output gradient over 1/448 (cuBLASLt FP8 GEMMs on GPUs sm_89+, refused below; the "   \
    "CPU rounds in software; modern)")                                                          \
  F(model, bool, mlp_fp8, "mlp_fp8", false, kOptional,                                          \
    "training runs the MLP's forward GEMMs in FP8 as the record: e4m3 input over amax/448, fc " \
    "over its amax/448, the activation over the previous forward's amax x 1.80/448, proj over " \
    "the previous step's amax x 1.12/448 (its own through step 16); backward as without it "    \
    "(modern, not MoE; GPUs sm_89+)")                                                           \
  F(model, double, head_fp8_x_scale, "head_fp8_x_scale", 0.0, kOptional,                        \
    "model.head_fp8's scale of the final norm in units of 1/448 (0 = sqrt(d_model); "           \
    "record #89: 100)")                                                                         \
  F(model, double, head_fp8_w_scale, "head_fp8_w_scale", 24.0, kOptional,                       \
    "model.head_fp8's scale of lm_head.weight in units of 1/448 (record #89: 1.6)")             \
  F(model, double, head_fp8_grad_scale, "head_fp8_grad_scale", 1.0, kOptional,                  \
    "model.head_fp8's scale of a token loss's logit gradient in units of 1/448 (record "        \
    "#89: 0.75)")                                                                               \
  F(model, bool, key_offset, "key_offset", false, kOptional,                                    \
    "#89: long-window blocks shift the keys' unrotated half a position (needs rotary_truncate " \
    "and window; modern)")                                                                      \
  F(model, int64_t, bigram_rows, "bigram_rows", 0, kOptional,                                   \
    "#89: rows of the bigram hash embedding added with a learned gate at block 0's start and "  \
    "after each later attention (the record: 377280); 0: off (modern)")                         \
  F(model, bool, smear, "smear", false, kOptional,                                              \
    "#89: each embedding row adds lambda sigmoid(x[t, :12] . w) x[t-1] before x0's norm "       \
    "(needs x0_norm; modern)")                                                                  \
  F(model, bool, sublayer_lambdas, "sublayer_lambdas", false, kOptional,                        \
    "#89: each attention and MLP output y is mixed as x = resid x + post y (learned per "       \
    "sublayer, init sqrt 1.1 and 1; dense MLP; modern)")                                        \
  F(model, bool, qkvo_lambdas, "qkvo_lambdas", false, kOptional,                                \
    "#89: q, k, v from a (l_qkv W_qkv)^T and the attention output from atty (l_o W_o)^T "       \
    "(learned per block, init 0.5 and 1; modern)")                                              \
  F(model, bool, mudd, "mudd", false, kOptional,                                                \
    "#89: the record's block wiring with its MUDD blocks and gates (11 blocks of 6 heads, "     \
    "no_attn_layers 6, sublayer_lambdas; no value tables yet; modern)")                         \
  F(model, std::string, paired_head_layers, "paired_head_layers", "", kOptional,                \
    "#89: comma list of blocks with paired heads: heads h and h + n_head/2 attend as one head " \
    "over the interleaved sequence of 2T (the record: \"0,2,5,9\"; modern)")                    \
  F(model, bool, yarn, "yarn", false, kOptional,                                                \
    "#89: each change of the stages' long window rescales the rotary frequencies and the "      \
    "attention scale (YaRN; not the final validation's window; needs window, train.stages; "    \
    "modern)")                                                                                  \
  F(model, std::string, xsa_layers, "xsa_layers", "", kOptional,                                \
    "#89: comma list of blocks whose attention output loses tanh(alpha) of its part along v "   \
    "per token and head (XSA; alpha blocks.<i>.attn.xsa_alpha, 0 at init; the record: "         \
    "\"1,3,4,7\"; not paired blocks; modern)")                                                  \
  F(model, std::string, attn_gate_layers, "attn_gate_layers", "", kOptional,                    \
    "#89: comma list of blocks whose attention output is scaled per token and head before the " \
    "projection (blocks.<i>.attn.out_gate, 1 at init; the record: \"3,10\"; modern)")

#define ENGINE_DATA_FIELDS(F)                                                                   \
  F(data, std::string, train, "train", "", kRequired, "glob of training token shards (.bin)")   \
  F(data, std::string, val, "val", "", kRequired, "glob of validation token shards (.bin)")     \
  F(data, bool, shuffle, "shuffle", false, kOptional,                                           \
    "shuffle sequence start positions each epoch (seeded by train.seed)")                       \
  F(data, bool, shard_whole_batches, "shard_whole_batches", false, kOptional,                   \
    "each training shard gives whole global batches only and skips the rest (modded-nanogpt's " \
    "generator: 2032 rows of 49152 from a 100M-token shard at 8 a step)")                       \
  F(data, int64_t, bos, "bos", 50256, kOptional,                                                \
    "the token that starts a document, for the document loader of train.stages")

#define ENGINE_TRAIN_FIELDS(F)                                                                     \
  F(train, int64_t, seed, "seed", 1337, kOptional, "seed of initialisation and data order")        \
  F(train, int64_t, steps, "steps", 1000, kOptional, "optimizer steps")                            \
  F(train, int64_t, batch_tokens, "batch_tokens", 65536, kOptional,                                \
    "global batch in tokens per step, independent of the world size")                              \
  F(train, int64_t, micro_batch, "micro_batch", 8, kOptional,                                      \
    "sequences per rank per micro-step (gradient accumulation makes up the rest)")                 \
  F(train, double, grad_clip, "grad_clip", 1.0, kOptional,                                         \
    "clip the global gradient norm to this (0 = off)")                                             \
  F(train, std::string, precision, "precision", "fp32", kOptional,                                 \
    "what the matmuls compute in: fp32 | tf32 (TF32 tensor cores; GPUs, the CPU runs fp32) | "     \
    "bf16 (bf16 GEMM inputs, f32 accumulation; f32 weights, gradients and optimizer state; a "     \
    "CPU without AVX512_BF16 or AMX runs fp32); docs/precision.md")                                \
  F(train, std::string, lr_schedule, "lr_schedule", "linear", kOptional,                           \
    "decay shape after warmup: constant | linear | cosine (warmup-stable-decay)")                  \
  F(train, int64_t, lr_warmup_steps, "lr_warmup_steps", 0, kOptional,                              \
    "steps of linear warmup of the lr multiplier")                                                 \
  F(train, double, lr_cooldown_frac, "lr_cooldown_frac", 0.4, kOptional,                           \
    "fraction of train.steps spent decaying at the end")                                           \
  F(train, double, lr_floor, "lr_floor", 0.0, kOptional, "lr multiplier reached at the last step") \
  F(train, bool, lr_at_step_start, "lr_at_step_start", false, kOptional,                           \
    "step s takes the schedule at progress s / steps, as the record's get_lr (else (s + 1) / "     \
    "steps: the decay reaches lr_floor at the last step)")                                         \
  F(train, bool, rank_sum_loss, "rank_sum_loss", false, kOptional,                                 \
    "the gradient of each rank's summed token losses averaged over ranks (the record's "           \
    "reduction='sum', ReduceOp.AVG): batch_tokens / world times the mean loss's")                  \
  F(train, int64_t, eval_every, "eval_every", 100, kOptional,                                      \
    "validate every N steps and at the end (0 = only at the end)")                                 \
  F(train, int64_t, val_tokens, "val_tokens", 65536, kOptional,                                    \
    "validation tokens per evaluation (the first tokens of the val shards)")                       \
  F(train, double, target_val_loss, "target_val_loss", 0.0, kOptional,                             \
    "stop when val_loss <= this and report the time to reach it (0 = off)")                        \
  F(train, double, diverge_loss_factor, "diverge_loss_factor", 4.0, kOptional,                     \
    "stop (exit 3, nothing saved) when the train loss exceeds this times the run's lowest "        \
    "(0 = off)")                                                                                   \
  F(train, int64_t, diverge_zero_grad_steps, "diverge_zero_grad_steps", 3, kOptional,              \
    "stop (exit 3, nothing saved) after this many steps in a row with a gradient norm "            \
    "of exactly 0 (0 = off)")                                                                      \
  F(train, int64_t, warmup_steps, "warmup_steps", 0, kOptional,                                    \
    "untimed warm-up forward/backward passes before step 1 (no update)")                           \
  F(train, std::string, init_from, "init_from", "", kOptional,                                     \
    "start from trained weights (fresh optimizer state, step 0): a checkpoint folder, an engine "  \
    "export .safetensors or a Hugging Face GPT-2 folder; ignored when resuming")                   \
  F(train, std::string, stages_batch_tokens, "stages.batch_tokens", "", kOptional,                 \
    "batch stages (record #89, docs/record_recipe.md#batch-stages-record-89): tokens per step of " \
    "each stage, ';' "                                                                             \
    "between stages, the last the extension stage ('' = off: train.batch_tokens every step). "     \
    "On: the BOS-aligned document loader, train.lr_cooldown_frac and lr_floor over the "           \
    "scheduled steps, each stage's lr multiplier")                                                 \
  F(train, std::string, stages_durations, "stages.durations", "", kOptional,                       \
    "each scheduled stage's share of the scheduled steps ('1/3; 1/3; 1/3'); stage k ends at "      \
    "round(S x the running sum)")                                                                  \
  F(train, int64_t, stages_extension_steps, "stages.extension_steps", 0, kOptional,                \
    "the last stage's steps, after the S = train.steps - this scheduled ones (the record: 15)")    \
  F(train, int64_t, stages_rows, "stages.rows", 8, kOptional,                                      \
    "rows per step (all ranks and micro-steps): a row holds a stage's tokens / rows (the record: " \
    "8 GPUs x 1)")                                                                                 \
  F(train, std::string, stages_max_doc_tokens, "stages.max_doc_tokens", "", kOptional,             \
    "each stage's longest document: the loader truncates documents to it ('896; 2048; ...')")      \
  F(train, std::string, stages_max_docs, "stages.max_docs", "", kOptional,                         \
    "each stage's cu_seqlens entries a row ('' = the record's 64 / 96 / 128 for rows of 16384 / "  \
    "32768 / 49152, else the next multiple of 128 of T / 300); a row of more documents fails")     \
  F(train, std::string, stages_windows, "stages.windows", "", kOptional,                           \
    "each stage's short and long attention windows in tokens ('128 384; 384 896; ...')")           \
  F(train, std::string, stages_lr_mul, "stages.lr_mul", "", kOptional,                             \
    "each stage's lr multiplier ('1.0; 1.52; 1.73; 1.0')")                                         \
  F(train, std::string, stages_mtp, "stages.mtp", "", kOptional,                                   \
    "each stage's multi-token weights for t+1, t+2, ..., 'a>b' ramping within the stage "          \
    "('1 0.5 0.25>0; 1 0.5>0; 1; 1')")                                                             \
  F(train, int64_t, stages_final_window, "stages.final_window", 0, kOptional,                      \
    "the long window of the validation after the last step (the record: 2560; 0 = the last "       \
    "stage's)")                                                                                    \
  F(train, std::string, stages_prefix, "stages.prefix", "", kOptional,                             \
    "each stage's prefix-loss weight, 'a>b' ramping within the stage ('0.25; 0.25>0; 0; 0')")      \
  F(train, std::string, stages_prefix_vocab, "stages.prefix_vocab", "data/tokenizer", kOptional,   \
    "the GPT-2 tokenizer folder (encoder.json, vocab.bpe) the prefix targets are built from, "     \
    "read when a train.stages.prefix weight is not 0")

#define ENGINE_ZERO_FIELDS(F)                                                               \
  F(zero, int64_t, stage, "stage", 1, kOptional,                                            \
    "1 = optimizer state sharded, 2 = + gradients, 3 = + parameters (rest as local parts, " \
    "gathered layer by layer; full gradients exist one layer at a time)")                   \
  F(zero, bool, overlap, "overlap", true, kOptional,                                        \
    "reduce gradients while the layers below compute: stages 1-2 start a layer's buckets "  \
    "when its backward of the last micro-step is done; stage 3 with zero.progress=thread "  \
    "reduces each layer on the communication thread (false: after the backward)")           \
  F(zero, double, bucket_mb, "bucket_mb", 4.0, kOptional,                                   \
    "gradient reduction bucket size in MiB: a layer's gradients are reduced in buckets of " \
    "at most this size (a larger tensor alone); 0 = one reduction per tensor")              \
  F(zero, std::string, progress, "progress", "poll", kOptional,                             \
    "how collectives in flight progress on the CPU: poll (nonblocking MPI collectives, "    \
    "tested at every layer event; faster on 2 shared cores, apps/bench_zero) or thread (a " \
    "communication thread runs them)")                                                      \
  F(zero, bool, sparse_rows, "sparse_rows", true, kOptional,                                \
    "stages 1-2: reduce the embedding gradient as its nonzero rows only, when they are at " \
    "most a quarter of its rows (the tokens of a small batch)")

#define ENGINE_CHECKPOINT_FIELDS(F)                                                        \
  F(checkpoint, std::string, dir, "dir", "checkpoints", kOptional,                         \
    "directory holding the step_%08d checkpoint folders")                                  \
  F(checkpoint, int64_t, every, "every", 0, kOptional, "save every N steps (0 = off)")     \
  F(checkpoint, bool, at_end, "at_end", true, kOptional, "save after the last step")       \
  F(checkpoint, int64_t, keep, "keep", 3, kOptional, "keep the newest K checkpoints")      \
  F(checkpoint, bool, keep_best, "keep_best", false, kOptional,                            \
    "also keep the checkpoint with the lowest validation loss (of those saved at a step "  \
    "with an evaluation) out of the rotation")                                             \
  F(checkpoint, std::string, resume, "resume", "", kOptional,                              \
    "empty = fresh start, auto = newest complete checkpoint in dir, or a checkpoint path") \
  F(checkpoint, bool, overwrite, "overwrite", false, kOptional,                            \
    "a fresh start first deletes an earlier run's step_* checkpoints in dir and "          \
    "metrics.jsonl and TensorBoard event files in log.dir, a resume from a checkpoint "    \
    "older than others in dir deletes the newer ones (false: both are refused)")           \
  F(checkpoint, bool, on_signal, "on_signal", true, kOptional,                             \
    "on SIGTERM / SIGINT finish the current step, save a checkpoint, exit 143 / 130")

#define ENGINE_COMM_FIELDS(F)                                                                    \
  F(comm, double, timeout_s, "timeout_s", 300.0, kOptional,                                      \
    "abort the job when a collective waits longer than this for a rank, naming the "             \
    "collective and the ranks that did not arrive (0 = wait forever; else at least 1)")          \
  F(comm, std::string, device_collectives, "device_collectives", "nccl", kOptional,              \
    "how GPU tensors move: nccl | mpi (staged through host buffers over MPI: several ranks may " \
    "share one GPU; a cluster without NCCL)")

#define ENGINE_LOG_FIELDS(F)                                                                   \
  F(log, std::string, dir, "dir", "runs/default", kOptional,                                   \
    "run directory for metrics.jsonl, log.txt and config.yaml")                                \
  F(log, int64_t, every, "every", 1, kOptional, "print a training line every N steps")         \
  F(log, bool, metrics, "metrics", true, kOptional, "write metrics.jsonl (rank 0)")            \
  F(log, double, peak_gflops, "peak_gflops", 0.0, kOptional,                                   \
    "peak GFLOP/s of one rank's device, for the console's mfu (0 = the GPU table; unknown on " \
    "the CPU)")                                                                                \
  F(log, bool, device_timing, "device_timing", false, kOptional,                               \
    "also time the step's phases in the device's order of work (CUDA events on a GPU) into "   \
    "metrics.jsonl's device_phase_ms; each step then waits for its last phase")                \
  F(log, std::string, trace, "trace", "", kOptional,                                           \
    "steps FIRST-LAST (or one STEP) to trace: every rank's phases, micro-steps, layers, "      \
    "collectives, waits and checkpoint writes into <log.dir>/trace.json (Chrome trace "        \
    "events; docs/performance.md); '' = off")                                                  \
  F(log, bool, tensorboard, "tensorboard", false, kOptional,                                   \
    "also write the console's scalars to <log.dir>/events.out.tfevents.* (rank 0) for "        \
    "TensorBoard")

#define ENGINE_CONFIG_MEMBER(section, type, member, key, def, required, doc) type member = def;

struct ModelSection {
  ENGINE_MODEL_FIELDS(ENGINE_CONFIG_MEMBER)
};
struct DataSection {
  ENGINE_DATA_FIELDS(ENGINE_CONFIG_MEMBER)
};
struct TrainSection {
  ENGINE_TRAIN_FIELDS(ENGINE_CONFIG_MEMBER)
};
struct ZeroSection {
  ENGINE_ZERO_FIELDS(ENGINE_CONFIG_MEMBER)
};
struct CheckpointSection {
  ENGINE_CHECKPOINT_FIELDS(ENGINE_CONFIG_MEMBER)
};
struct CommSection {
  ENGINE_COMM_FIELDS(ENGINE_CONFIG_MEMBER)
};
struct LogSection {
  ENGINE_LOG_FIELDS(ENGINE_CONFIG_MEMBER)
};

// One parameter group: the globs it claims, the optimizer's name and the whole YAML map (the
// registry reads the hyperparameters from it and reports errors at `line`).
struct OptimGroup {
  std::vector<std::string> params;
  std::string optimizer;
  YAML::Node node;
  std::string file;
  int line = 0;
};

struct Config {
  ENGINE_TOP_FIELDS(ENGINE_CONFIG_MEMBER)
  ModelSection model;
  DataSection data;
  TrainSection train;
  std::vector<OptimGroup> optim;
  ZeroSection zero;
  CheckpointSection checkpoint;
  CommSection comm;
  LogSection log;
  std::string source;  // the YAML file it came from ("" when built in code)
  // Where each key given was set: "file.yaml:LINE" or "--set key=value" (the last one wins).
  std::map<std::string, std::string> origins;
};

using FieldValue = std::variant<int64_t*, double*, bool*, std::string*>;

// The table made from the declarations above, in declaration order.
struct FieldInfo {
  std::string key;   // "model.moe.experts"
  const char* type;  // "int", "float", "bool", "string"
  std::string default_value;
  bool required;
  const char* doc;
  FieldValue (*get)(Config&);
};
const std::vector<FieldInfo>& config_fields();

// What the reader of a config needs of it: a whole training run (every required key, the optim
// groups, every rule), or only the model section (a tool that builds a model and nothing else,
// such as model_grad: the other sections may be present and their keys are checked for name and
// type, but none of them is required and only the model's rules apply).
enum class ConfigUse { Training, ModelOnly };

// Reads `path`, applies `overrides` ("a.b=c", parsed with the key's type), checks required keys
// and cross-field rules for `use`. Errors name the key and the file and line (or the --set
// argument).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   ConfigUse use = ConfigUse::Training);
// The same from YAML text; `source` names it in messages.
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {},
                    ConfigUse use = ConfigUse::Training);
// Applies one "a.b=c" override to a config.
void apply_override(Config& config, const std::string& assignment);
// model.no_attn_layers' text ("", "7", "3, 7") as block indices; nullopt when it is not a comma
// list of non-negative integers.
std::optional<std::vector<int>> parse_block_list(const std::string& text);
// log.trace's text: "FIRST-LAST" or "STEP" (1-based optimizer steps, FIRST <= LAST); nullopt
// for anything else ("" included: tracing off).
std::optional<std::pair<int64_t, int64_t>> parse_step_range(const std::string& text);
// Cross-field checks (also run by load/parse): choices, positivity, head divisibility...
// (ModelOnly: the device and the model section's). Errors name the key and where it was set
// (config_origin).
void validate_config(const Config& config, ConfigUse use = ConfigUse::Training);
// Where `key` got its value, for messages: "file.yaml:LINE", "--set key=value", or the config
// file (the key kept its default).
std::string config_origin(const Config& config, const std::string& key);
// Settings that are allowed but most likely not meant (e.g. a warmup longer than the run), one
// line each naming the key; printed at start.
std::vector<std::string> config_warnings(const Config& config);

// The effective config as YAML (every field, then the optim groups); parses back to itself.
std::string config_to_yaml(const Config& config);
// Markdown table: key | type | default | description.
std::string config_reference_markdown();
// A field's current value as text (for banners and messages).
std::string field_value_string(const Config& config, const FieldInfo& field);

}  // namespace engine
