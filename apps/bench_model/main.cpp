// bench_model: time of one training step (forward + backward + AdamW) of the GPT on the CPU,
// beside PyTorch's (tests/model/torch_reference.py --bench) measured in the same run, at 1 and 2
// threads, for the two models of issue 3. Each measurement runs in its own process with
// OMP_NUM_THREADS set, so OpenBLAS and our OpenMP loops use exactly that many threads.
//
//   bench_model [--json] [--steps N] [--threads 1,2] [--models gpt2,modern] [--precision fp32,bf16]
//               [--no-torch]
//   bench_model --keys all [--json] [--steps N] [--rounds R] [--threads 1,2]
//               [--models speedrun_cpu]
//   bench_model --device cuda [--json] [--steps N] [--models gpt2_124m] [--precision fp32,bf16]
//               [--op-groups]
//   bench_model --op-groups [--json] [--steps N] [--threads 1,2] [--models gpt2]
//               [--precision fp32,bf16]
//
// --keys times the record recipe's model keys (docs/specs/modded_nanogpt.md c.1) one at a time:
// one row for the model without them ("none"), one per key with only that key on, set as
// configs/speedrun_cpu_recipe.yaml sets it (or one of the record's exact forms, docs/
// record_recipe.md: x0_norm, rotary_truncate, window_block, v_lambdas_all, loss_over_padding,
// head_fp8), and one with all of the recipe's ("all"), each with its step
// time against "none", the median of --rounds rounds over all keys (no PyTorch column:
// torch_reference.py's bench mode has none of the keys). speedrun_cpu is that config's size (4
// blocks, d_model 128, 128 tokens, 8 rows: one micro-batch). The tokens are uniform over the
// vocabulary, so the document token starts a document about once in 50,000 tokens and doc_bos costs
// its masked-attention path, not a shorter attention.
//
// --device cuda times forward + backward on GPU 0 in this process (no PyTorch, no optimizer:
// the fused device AdamW is not part of this measurement) in each precision of --precision (fp32:
// f32 with TF32 off), and reports the achieved TFLOP/s and the MFU against the GPU's peak in that
// precision (engine/console_log.h: CUDA-core f32, tensor-core TF32 or bf16). gpt2_124m is
// the size of configs/gpt2_124m.yaml (12 layers, d_model 768, seq_len 1024, batch 8). With
// --op-groups it then times one step's worth of each op group of the gpt2 architecture at the
// model's shapes (the matmuls, attention, layernorm, ..., and the multi-tensor AdamW over every
// parameter) with the backend's device marks (CUDA events), one row each, in f32; and the
// matmuls, attention and the classifier again as bf16 runs take them ("matmul bf16": bf16 GEMMs
// with their roundings, the head writing bf16 logits; "classifier bf16": the cross-entropy on
// them, d logits in place; "layernorm bf16": reading the bf16 residual stream; "attention bf16":
// the flash kernels on bf16 tensor-core products storing the bf16 output and d qkv, or with
// ENGINE_CUDA_ATTENTION_BF16_VIA_F32=1 the f32 kernels and rounding passes), with a second sum for
// a bf16 run, and beside them "attention bf16 on TF32 operands" (the same kernels' TF32 products,
// ENGINE_CUDA_ATTENTION_BF16_ON_TF32=1), "attention tf32" (a tf32 run's, f32 storage) and
// "attention tf32 by GEMM" (core/attention_by_gemm.h, the path head dims past 128 take), in
// neither sum; "classifier capped" (the tanh cap 15 of cpu_small and speedrun_cpu) is in neither
// sum either.
//
// --precision takes a list of train.precision values (docs/precision.md); each row runs the model
// in that precision (bf16 GEMMs through oneDNN where the CPU has AVX512_BF16 or AMX, else as f32
// GEMMs of the bf16 values, which the header says), and PyTorch's column runs the same model under
// torch.autocast("cpu", dtype=torch.bfloat16) for the bf16 rows. The bf16 step includes
// remaking the weights' bf16 copies after the update.
//
// --op-groups without --device cuda times the same op groups on the CPU backend, one child process
// per thread count of --threads (OMP_NUM_THREADS set, as the step's rows), at the CPU models'
// shapes (gpt2: 4 blocks, d_model 256, 8 x 128 tokens), beside the measured step of that model in
// each precision of --precision, in the same process; a table's last column is each row's share
// of the first precision's measured step. The CPU computes attention in f32 whatever the
// precision, so its "attention bf16" differs from "attention" only by the bf16 stores, and the
// GPU's other attention paths (TF32 operands, tf32) are not rows there.
//
// FLOPs per token are model::training_flops_per_token's (model/flops.h), as the trainer's.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/attention_by_gemm.h"
#include "core/backend.h"
#include "core/check.h"
#include "core/json.h"
#include "core/rng.h"
#include "engine/console_log.h"
#include "model/flops.h"
#include "model/gpt.h"
#include "optim/adamw/adamw_ops.h"

namespace {

struct Spec {
  std::string name;
  model::ModelConfig config;
  int batch;
};

Spec spec_of(const std::string& name, const std::string& precision) {
  model::ModelConfig c;
  c.n_layer = 4;
  c.d_model = 256;
  c.n_head = 4;
  c.vocab_size = 50257;
  if (name == "gpt2") {
    c.arch = model::Arch::Gpt2;
    c.seq_len = 128;
  } else if (name == "gpt2_124m") {
    c.arch = model::Arch::Gpt2;
    c.n_layer = 12;
    c.d_model = 768;
    c.n_head = 12;
    c.seq_len = 1024;
  } else if (name == "modern") {
    c.arch = model::Arch::Modern;
    c.seq_len = 256;
  } else if (name == "speedrun_cpu") {
    c.arch = model::Arch::Modern;
    c.d_model = 128;
    c.seq_len = 128;
    c.softcap = 15.0f;
  } else {
    ENGINE_FAIL("bench_model: unknown model '" + name +
                "' (gpt2, modern, speedrun_cpu or gpt2_124m)");
  }
  c.precision = model::parse_precision(precision);
  return {name, c, 8};
}

// The record recipe's keys as --keys names them, in configs/speedrun_cpu_recipe.yaml's values.
const std::vector<std::string> kRecipeKeys = {
    "attn_scale",     "no_attn_layers", "value_embeds",    "unet_skips", "x0_lambdas",
    "zero_init_head", "vocab_pad",      "softcap_sigmoid", "doc_bos",    "window"};
// The record's exact forms (docs/record_recipe.md), each alone (not in "all"): their cost.
const std::vector<std::string> kRecordExactKeys = {
    "x0_norm", "rotary_truncate", "window_block", "v_lambdas_all", "loss_over_padding", "head_fp8"};

void apply_recipe_key(model::ModelConfig& c, const std::string& key) {
  if (key == "none") return;
  if (key == "all") {
    for (const auto& k : kRecipeKeys)
      apply_recipe_key(c, k);
    return;
  }
  if (key == "attn_scale") {
    c.attn_scale = 0.12f;
  } else if (key == "no_attn_layers") {
    c.no_attn_layers = {c.n_layer / 2};
  } else if (key == "value_embeds") {
    c.value_embeds = 1;
  } else if (key == "unet_skips") {
    c.unet_skips = true;
  } else if (key == "x0_lambdas") {
    c.x0_lambdas = true;
  } else if (key == "zero_init_head") {
    c.zero_init_head = true;
  } else if (key == "vocab_pad") {
    c.vocab_pad = 128;
  } else if (key == "softcap_sigmoid") {
    // speedrun_cpu's tanh cap 15 becomes the record's 30 sigmoid(z / (7.5 sqrt(d_model)))
    c.softcap = 30.0f;
    c.softcap_form = model::SoftcapForm::Sigmoid;
    c.softcap_scale = 7.5f * std::sqrt(static_cast<float>(c.d_model));
  } else if (key == "doc_bos") {
    c.doc_bos = c.vocab_size - 1;
  } else if (key == "window") {  // long window = the row, short = half of it, as L S S L
    c.window = c.seq_len;
    c.window_pattern = "LSSL";
  } else if (key == "x0_norm") {
    c.x0_norm = true;
  } else if (key == "rotary_truncate") {
    c.rotary_base = 1024.0f;
    c.rotary_truncate = true;
  } else if (key == "window_block") {  // the window key's windows in blocks of a quarter row
    apply_recipe_key(c, "window");
    c.window_block = c.seq_len / 4;
  } else if (key == "v_lambdas_all") {
    c.v_lambdas_all = true;
  } else if (key == "loss_over_padding") {
    apply_recipe_key(c, "vocab_pad");
    c.loss_over_padding = true;
  } else if (key == "head_fp8") {
    c.head_fp8 = true;
  } else {
    std::string known = "none, all";
    for (const auto& k : kRecipeKeys)
      known += ", " + k;
    for (const auto& k : kRecordExactKeys)
      known += ", " + k;
    ENGINE_FAIL("bench_model: unknown --keys entry '" + key + "' (" + known + ")");
  }
}

// Forward + backward of one model on a GPU, in this process: prints one JSON object.
int cuda_measurement(const std::string& name, int steps, const std::string& precision) {
  const Spec s = spec_of(name, precision);
  const int B = s.batch, T = s.config.seq_len;
  std::unique_ptr<core::Backend> backend = core::make_cuda_backend(0);
  double fb = 0;
  double flops = 0;
  int64_t n = 0;
  {
    model::Gpt gpt(s.config, *backend);
    gpt.init_weights();
    flops = model::training_flops_per_token(gpt.config());
    n = gpt.table().total_numel();
    core::Rng rng(7);
    std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
    for (auto& t : x)
      t = static_cast<int32_t>(rng.next_below(s.config.vocab_size));
    for (auto& t : y)
      t = static_cast<int32_t>(rng.next_below(s.config.vocab_size));
    using clock = std::chrono::steady_clock;
    for (int i = 0; i < steps + 1; ++i) {  // the first step is warm-up
      backend->synchronize();
      const auto t0 = clock::now();
      gpt.zero_grad();
      gpt.forward(x.data(), y.data(), B, T);
      gpt.backward();
      backend->synchronize();
      if (i > 0) fb += std::chrono::duration<double>(clock::now() - t0).count();
    }
  }
  fb /= steps;
  const double tokens = double(B) * T, tflops = flops * tokens / fb / 1e12;
  const std::optional<double> peak = engine::gpu_peak_gflops(backend->name(), precision);
  std::printf(
      "{\"impl\": \"engine\", \"arch\": \"%s\", \"precision\": \"%s\", \"device\": \"%s\", "
      "\"batch\": %d, \"seq_len\": %d, \"fwd_bwd_ms\": %.2f, \"tokens_per_s\": %.1f, "
      "\"tflops\": %.3f, \"peak_tflops\": %.1f, \"mfu\": %.4f, \"flops_per_token\": %.0f, "
      "\"params\": %lld}\n",
      name.c_str(), precision.c_str(), backend->name(), B, T, fb * 1e3, tokens / fb, tflops,
      peak ? *peak / 1e3 : 0.0, peak ? tflops / (*peak / 1e3) : 0.0, flops,
      static_cast<long long>(n));
  return 0;
}

// Milliseconds of one call of `run` on the device: the mean of `reps` after one warm-up, between
// two of the backend's marks.
double device_ms(core::Backend& be, const std::function<void()>& run, int reps) {
  run();
  const core::TimeMark from = be.mark();
  for (int r = 0; r < reps; ++r)
    run();
  return be.elapsed_ms(from, be.mark()) / reps;
}

// One step's worth of each op group of the gpt2 architecture (the calls of model/gpt.cpp for all
// layers and the head) at the model's shapes, on the backend: one JSON object per group, then one
// for their sum. Buffers are shared between layers (the shapes repeat), so memory stays small.
int op_groups_of(const std::string& name, int reps, core::Backend& be) {
  const Spec s = spec_of(name, "fp32");
  ENGINE_CHECK(
      s.config.arch == model::Arch::Gpt2 && !s.config.moe(),
      "bench_model --op-groups: covers the gpt2 architecture without MoE, not '" + name + "'");
  const bool cuda = be.device().is_cuda();
  const int64_t B = s.batch, T = s.config.seq_len, N = B * T, D = s.config.d_model,
                H = s.config.n_head, hd = s.config.head_dim(), F = s.config.d_ff(),
                V = s.config.vocab_size, Vp = s.config.padded_vocab(), L = s.config.n_layer;
  std::vector<core::Tensor> held;
  auto buffer = [&](int64_t n) {
    held.push_back(core::Tensor::empty({n}, core::DType::F32, be.allocator()));
    be.fill_zero(held.back().raw_data(), held.back().nbytes());
    return held.back().data<float>();
  };
  float *x = buffer(N * F), *y = buffer(N * F), *dx = buffer(N * F), *dy = buffer(N * F);
  float *w = buffer(Vp * D), *dw = buffer(Vp * D), *dwpe = buffer(T * D);
  float *bias = buffer(F), *dbias = buffer(F), *dgain = buffer(F);
  float *q = buffer(N * D), *k = buffer(N * D), *v = buffer(N * D), *att = buffer(N * D);
  float *dq = buffer(N * D), *dk = buffer(N * D), *dv = buffer(N * D), *lse = buffer(B * H * T);
  float *qkv = buffer(3 * N * D), *dqkv = buffer(3 * N * D);
  float *mean = buffer(N), *rstd = buffer(N), *losses = buffer(N), *logits = buffer(N * Vp);
  float* loss = buffer(1);
  // The gradient buffer the backward zeroes each layer (gpt.cpp: d pre in f32 runs).
  float* zeroed = buffer(N * F);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i)
    ids[i] = static_cast<int32_t>((i * 7919) % V);
  auto* tokens = reinterpret_cast<int32_t*>(buffer(N));
  be.copy_from_host(tokens, ids.data(), ids.size() * sizeof(int32_t));

  // y [N, out] = x [N, in] W^T, and its backward dx, dW (model/gpt.cpp's linear layers); the head
  // (out = Vp) writes the logits and reads its output gradient from them, as the model does.
  auto linear_fwd_bwd = [&](int64_t in, int64_t out) {
    float* yo = out == Vp ? logits : y;
    const float* dyo = out == Vp ? logits : dy;
    core::GemmArgs f;
    f.trans_b = true, f.m = N, f.n = out, f.k = in;
    be.gemm(f, x, w, yo);
    core::GemmArgs gx;
    gx.m = N, gx.n = in, gx.k = out;
    be.gemm(gx, dyo, w, dx);
    core::GemmArgs gw;
    gw.trans_a = true, gw.m = out, gw.n = in, gw.k = N, gw.beta = 1.0f;
    be.gemm(gw, dyo, x, dw);
  };
  // The same layers as bf16 runs take them (model/gpt.cpp's linear and linear_backward): the
  // input and the output gradient rounded to bf16 each time, the weight once a step, bf16 GEMMs
  // with f32 accumulation and output.
  std::vector<core::Tensor> held_bf16;
  auto buffer_bf16 = [&](int64_t n) {
    held_bf16.push_back(core::Tensor::empty({n}, core::DType::BF16, be.allocator()));
    be.fill_zero(held_bf16.back().raw_data(), held_bf16.back().nbytes());
    return held_bf16.back().data<core::bf16>();
  };
  core::bf16 *xb = buffer_bf16(N * F), *wb = buffer_bf16(Vp * D), *dyb = buffer_bf16(N * F);
  core::bf16* logits_b = buffer_bf16(N * Vp);
  // The head (out = Vp) writes its logits in bf16, and its output gradient is the bf16 d logits
  // the cross-entropy wrote over them (no rounding pass).
  core::bf16 *attb = buffer_bf16(N * D), *dqkvb = buffer_bf16(3 * N * D);
  auto linear_fwd_bwd_bf16 = [&](int64_t in, int64_t out) {
    be.f32_to_bf16(wb, w, out * in);
    be.f32_to_bf16(xb, x, N * in);
    core::GemmArgs f;
    f.trans_b = true, f.m = N, f.n = out, f.k = in;
    if (out == Vp) {
      be.gemm(f, xb, wb, logits_b);
    } else {
      be.gemm(f, xb, wb, y);
      be.f32_to_bf16(dyb, dy, N * out);
    }
    const core::bf16* dyr = out == Vp ? logits_b : dyb;
    core::GemmArgs gx;
    gx.m = N, gx.n = in, gx.k = out;
    be.gemm(gx, dyr, wb, dx);
    core::GemmArgs gw;
    gw.trans_a = true, gw.m = out, gw.n = in, gw.k = N, gw.beta = 1.0f;
    be.gemm(gw, dyr, xb, dw);
  };
  // GPT-2's block linear layers as model/gpt.cpp calls them, with the GEMM epilogues: the bias,
  // the residual through C != D, GELU with its pre-activation kept and its derivative (f32 runs),
  // the bias gradients fused into the dW GEMMs where dy is stored as the GEMM reads it. With
  // ENGINE_CUDA_GEMM_EPILOGUE=0 the same calls run unfused (the side-by-side timing).
  float* pre = buffer(N * F);
  core::bf16* act_bf16 = buffer_bf16(N * F);
  // bf16 runs' residual stream: the projections add into it with a bf16 C and D.
  core::bf16 *stream_in = buffer_bf16(N * D), *stream_out = buffer_bf16(N * D);
  auto linear_epilogues = [&](bool bf16, int64_t in, int64_t out) {
    const bool gelu_out = out == F, gelu_in = in == F, residual = out == D;
    core::GemmArgs f;
    f.trans_b = true, f.m = N, f.n = out, f.k = in;
    core::GemmEpilogueArgs fe{core::GemmEpilogue::bias, nullptr, bias, nullptr};
    if (residual) f.beta = 1.0f, fe.c = x;
    core::GemmArgs gx;
    gx.m = N, gx.n = in, gx.k = out;
    core::GemmArgs gw;
    gw.trans_a = true, gw.m = out, gw.n = in, gw.k = N, gw.beta = 1.0f;
    const core::GemmEpilogueArgs bgrad{core::GemmEpilogue::bgrad, nullptr, nullptr, dbias};
    if (!bf16) {
      if (gelu_out) fe.kind = core::GemmEpilogue::bias_gelu;
      be.gemm_epilogue(f, fe, x, w, y, gelu_out ? pre : nullptr);
      core::GemmEpilogueArgs xe;
      if (gelu_in) xe.kind = core::GemmEpilogue::dgelu;
      be.gemm_epilogue(gx, xe, dy, w, dx, gelu_in ? pre : nullptr);
      be.gemm_epilogue(gw, bgrad, dy, x, dw, nullptr);
      return;
    }
    // bf16: the weight's copy once a step; the forward's input and d qkv, d pre stored bf16 by
    // their producers; the projections add into the bf16 residual stream (bf16 C and D); their
    // dy rounded from the f32 residual gradient, whose bias gradient sums the f32 values.
    be.f32_to_bf16(wb, w, out * in);
    if (residual) {
      fe.c = nullptr, fe.c_bf16 = stream_in;
      be.gemm_epilogue(f, fe, xb, wb, stream_out, nullptr);
    } else {
      be.gemm_epilogue(f, fe, xb, wb, gelu_out ? pre : y, nullptr);
    }
    if (gelu_out) be.gelu_forward(act_bf16, pre, N * F);
    if (residual) {
      be.bias_backward(dbias, dy, N, out);
      be.f32_to_bf16(dyb, dy, N * out);
    }
    be.gemm(gx, dyb, wb, gelu_in ? y : dx);
    if (gelu_in) be.gelu_backward(act_bf16, pre, y, N * F);
    be.gemm_epilogue(gw, residual ? core::GemmEpilogueArgs{} : bgrad, dyb, xb, dw, nullptr);
  };
  auto each_block_linear = [&](bool bf16) {
    for (int64_t l = 0; l < L; ++l) {
      linear_epilogues(bf16, D, 3 * D);
      linear_epilogues(bf16, D, D);
      linear_epilogues(bf16, D, F);
      linear_epilogues(bf16, F, D);
    }
  };
  // Every linear layer of the model and the head, through one of the two lambdas above.
  auto each_linear = [&](const std::function<void(int64_t, int64_t)>& fwd_bwd) {
    for (int64_t l = 0; l < L; ++l) {
      fwd_bwd(D, 3 * D);
      fwd_bwd(D, D);
      fwd_bwd(D, F);
      fwd_bwd(F, D);
    }
    fwd_bwd(D, Vp);
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Every layer's attention as GPT-2's blocks run it: q, k, v read in place from qkv, the output
  // [N, D], d q, d k, d v written into d qkv (core::AttentionLayout). tf32 is what tf32 and bf16
  // runs take (on a GPU the flash kernels on TF32 tensor cores; the CPU computes f32 either way);
  // bf16 runs store the output and d qkv in bf16.
  const core::HeadStrides qkv_rows = core::AttentionLayout::token_rows(T, hd, 3 * D);
  const core::AttentionLayout layout{H, qkv_rows, qkv_rows, qkv_rows,
                                     core::AttentionLayout::token_rows(T, hd, D)};
  auto each_attention = [&](bool tf32) {
    for (int64_t l = 0; l < L; ++l) {
      be.attention_forward(att, lse, qkv, qkv + D, qkv + 2 * D, B * H, T, hd, scale, {}, tf32,
                           layout);
      be.attention_backward(dqkv, dqkv + D, dqkv + 2 * D, dy, att, lse, qkv, qkv + D, qkv + 2 * D,
                            B * H, T, hd, scale, {}, tf32, layout);
    }
  };
  auto each_attention_bf16 = [&] {
    for (int64_t l = 0; l < L; ++l) {
      be.attention_forward(attb, lse, qkv, qkv + D, qkv + 2 * D, B * H, T, hd, scale, {}, true,
                           layout);
      be.attention_backward(dqkvb, dqkvb + D, dqkvb + 2 * D, dy, attb, lse, qkv, qkv + D,
                            qkv + 2 * D, B * H, T, hd, scale, {}, true, layout);
    }
  };
  // Which run's sum a group belongs to: both, only an f32 (bf16) run's, or neither (a path the
  // runs do not take at these shapes, timed beside the one they take).
  enum class Run { kBoth, kF32, kBf16, kNeither };
  struct Group {
    std::string name;
    Run run;
    std::function<void()> fn;
    bool cuda_only = false;  // a GPU path the CPU has no second form of
  };
  const std::vector<Group> groups = {
      {"matmul (linear layers and head)", Run::kF32, [&] { each_linear(linear_fwd_bwd); }},
      {"matmul bf16", Run::kBf16, [&] { each_linear(linear_fwd_bwd_bf16); }},
      {"block linear layers with their epilogues", Run::kNeither,
       [&] { each_block_linear(false); }},
      {"block linear layers with their epilogues bf16", Run::kNeither,
       [&] { each_block_linear(true); }},
      {"attention", Run::kF32, [&] { each_attention(false); }},
      {"attention bf16", Run::kBf16, [&] { each_attention_bf16(); }},
      {"attention bf16 on TF32 operands", Run::kNeither,
       [&] {
         setenv("ENGINE_CUDA_ATTENTION_BF16_ON_TF32", "1", 1);
         each_attention_bf16();
         unsetenv("ENGINE_CUDA_ATTENTION_BF16_ON_TF32");
       },
       true},
      {"attention tf32", Run::kNeither, [&] { each_attention(true); }, true},
      {"attention tf32 by GEMM", Run::kNeither,
       [&] {
         for (int64_t l = 0; l < L; ++l) {
           core::attention_forward_by_gemm(be, att, lse, qkv, qkv + D, qkv + 2 * D, B * H, T, hd,
                                           scale, {}, {}, layout);
           core::attention_backward_by_gemm(be, dqkv, dqkv + D, dqkv + 2 * D, dy, att, qkv, qkv + D,
                                            qkv + 2 * D, B * H, T, hd, scale, {}, {}, layout);
         }
       }},
      // Only the modern blocks split heads (for the QK-norm and rotary); GPT-2's take none.
      {"head split and merge (modern blocks)", Run::kNeither,
       [&] {
         for (int64_t l = 0; l < L; ++l) {
           be.split_heads(q, k, v, x, B, T, H, hd);
           be.merge_heads(y, att, B, T, H, hd);
           be.merge_heads_backward(dq, dy, B, T, H, hd);
           be.split_heads_backward(dx, dq, dk, dv, B, T, H, hd);
         }
       }},
      {"layernorm", Run::kF32,
       [&] {
         for (int64_t l = 0; l < 2 * L + 1; ++l) {
           be.layernorm_forward(y, mean, rstd, x, bias, bias, N, D, 1e-5f);
           be.layernorm_backward(dx, dgain, dbias, dy, x, bias, mean, rstd, N, D);
         }
       }},
      // bf16 runs: the bf16 residual stream in, the bf16 GEMM input out, f32 gradients.
      {"layernorm bf16", Run::kBf16,
       [&] {
         for (int64_t l = 0; l < 2 * L + 1; ++l) {
           be.layernorm_forward(act_bf16, mean, rstd, stream_in, bias, bias, N, D, 1e-5f);
           be.layernorm_backward(dx, dgain, dbias, dy, stream_in, bias, mean, rstd, N, D);
         }
       }},
      {"gelu", Run::kBoth,
       [&] {
         for (int64_t l = 0; l < L; ++l) {
           be.gelu_forward(y, x, N * F);
           be.gelu_backward(dx, x, dy, N * F);
         }
       }},
      {"bias, residual, zeroing", Run::kBoth,
       [&] {
         for (int64_t l = 0; l < L; ++l) {
           for (int64_t c : {3 * D, D, F, D}) {
             be.add_bias(y, bias, N, c);
             be.bias_backward(dbias, dy, N, c);
           }
           be.copy(y, x, N * D * sizeof(float));  // the two residual copies
           be.copy(dx, x, N * D * sizeof(float));
           be.fill_zero(zeroed, N * F * sizeof(float));  // d pre
         }
       }},
      {"classifier (cross-entropy, dlogits)", Run::kF32,
       [&] {
         be.cross_entropy(losses, logits, logits, tokens, N, V, Vp, 0.0f, 1.0f / N);
         be.mean_loss(loss, losses, N);
       }},
      {"classifier bf16 (bf16 logits, dlogits in place)", Run::kBf16,
       [&] {
         be.cross_entropy(losses, logits_b, logits_b, tokens, N, V, Vp, 0.0f, 1.0f / N);
         be.mean_loss(loss, losses, N);
       }},
      // The logit cap of cpu_small, speedrun_cpu and the record's recipe (not gpt2's): a second
      // exponential per logit.
      {"classifier capped (tanh cap 15)", Run::kNeither,
       [&] {
         be.cross_entropy(losses, logits, logits, tokens, N, V, Vp, 15.0f, 1.0f / N);
         be.mean_loss(loss, losses, N);
       }},
      {"embedding", Run::kBoth,
       [&] {
         be.embedding_forward(y, tokens, w, w, B, T, D);
         be.embedding_backward(dw, dwpe, dy, tokens, B, T, D);
       }},
  };
  auto emit = [&](const std::string& group, double ms) {
    std::printf(
        "{\"impl\": \"engine\", \"arch\": \"%s\", \"device\": \"%s\", \"threads\": %d, "
        "\"batch\": %d, \"seq_len\": %d, \"group\": \"%s\", \"ms_per_step\": %.3f}\n",
        name.c_str(), be.name(), cuda ? 0 : omp_get_max_threads(), s.batch, s.config.seq_len,
        group.c_str(), ms);
    std::fflush(stdout);
  };
  // Two sums: an f32 run's groups, and a bf16 run's (its matmuls and attention instead).
  double total = 0, total_bf16 = 0;
  for (const Group& g : groups) {
    if (g.cuda_only && !cuda) continue;
    const double ms = device_ms(be, g.fn, reps);
    if (g.run == Run::kBoth || g.run == Run::kF32) total += ms;
    if (g.run == Run::kBoth || g.run == Run::kBf16) total_bf16 += ms;
    emit(g.name, ms);
  }
  {
    // AdamW over every parameter of the model in one multi-tensor launch (its tensors' sizes).
    model::Gpt gpt(s.config, be);
    const std::unique_ptr<optim::AdamWOps> adamw = optim::make_adamw_ops(be);
    std::vector<optim::AdamWTensor> tensors;
    float* m = buffer(gpt.table().total_numel());
    float* vv = buffer(gpt.table().total_numel());
    for (const auto& p : gpt.table().params()) {
      optim::AdamWTensor t;
      t.w = gpt.params().data<float>() + p.offset;
      t.g = gpt.grads().data<float>() + p.offset;
      t.m = m + p.offset;
      t.v = vv + p.offset;
      t.n = p.numel;
      tensors.push_back(t);
    }
    const double ms = device_ms(
        be, [&] { adamw->update(tensors); }, reps);
    total += ms;
    total_bf16 += ms;
    emit("adamw (multi-tensor, every parameter)", ms);
  }
  emit("sum of the groups", total);
  emit("sum of the groups, bf16 run", total_bf16);
  return 0;
}

// One measurement in this process: prints one JSON object.
int child(const std::string& name, int steps, const std::string& precision,
          const std::string& key) {
  Spec s = spec_of(name, precision);
  apply_recipe_key(s.config, key);
  const int B = s.batch, T = s.config.seq_len;
  model::Gpt gpt(s.config, core::cpu_backend());
  gpt.init_weights();
  core::Rng rng(7);
  std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
  for (auto& t : x)
    t = static_cast<int32_t>(rng.next_below(s.config.vocab_size));
  for (auto& t : y)
    t = static_cast<int32_t>(rng.next_below(s.config.vocab_size));

  // The engine's own AdamW op (optim/adamw/adamw_ops.h: float64 element math, the trainer's) over
  // every parameter, one tensor a parameter, lr 1e-4, betas 0.9 and 0.999, eps 1e-8, no decay.
  const int64_t n = gpt.table().total_numel();
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const std::unique_ptr<optim::AdamWOps> adamw_ops = optim::make_adamw_ops(core::cpu_backend());
  std::vector<optim::AdamWTensor> tensors;
  for (const auto& prm : gpt.table().params()) {
    optim::AdamWTensor t;
    t.w = gpt.params().data<float>() + prm.offset;
    t.g = gpt.grads().data<float>() + prm.offset;
    t.m = m.data() + prm.offset;
    t.v = v.data() + prm.offset;
    t.n = prm.numel;
    tensors.push_back(t);
  }
  int t_step = 0;
  auto adamw = [&]() {
    ++t_step;
    const double lr = 1e-4, bc1 = 1 - std::pow(0.9, t_step), bc2 = 1 - std::pow(0.999, t_step);
    for (optim::AdamWTensor& t : tensors) {
      t.step.step_size = lr / bc1;  // torch's eps, as PyTorch's column
      t.step.v_scale = 1 / std::sqrt(bc2);
    }
    adamw_ops->update(tensors);
  };
  using clock = std::chrono::steady_clock;
  double fb = 0, opt = 0;
  for (int i = 0; i < steps + 1; ++i) {  // the first step is warm-up
    auto t0 = clock::now();
    gpt.zero_grad();
    gpt.forward(x.data(), y.data(), B, T);
    gpt.backward();
    auto t1 = clock::now();
    adamw();
    gpt.params_updated();  // bf16: the weights' copies are remade in the next forward
    auto t2 = clock::now();
    if (i > 0) {
      fb += std::chrono::duration<double>(t1 - t0).count();
      opt += std::chrono::duration<double>(t2 - t1).count();
    }
  }
  fb /= steps;
  opt /= steps;
  const double step = fb + opt, tokens = double(B) * T;
  const double flops = model::training_flops_per_token(gpt.config());
  std::printf(
      "{\"impl\": \"engine\", \"arch\": \"%s\", \"key\": \"%s\", \"precision\": \"%s\", "
      "\"threads\": %d, \"fwd_bwd_ms\": %.2f, \"adamw_ms\": %.2f, \"step_ms\": %.2f, "
      "\"tokens_per_s\": %.1f, \"gflops\": %.2f, \"flops_per_token\": %.0f, \"params\": %lld, "
      "\"activation_mb\": %.1f}\n",
      name.c_str(), key.c_str(), precision.c_str(), omp_get_max_threads(), fb * 1e3, opt * 1e3,
      step * 1e3, tokens / step, flops * tokens / step / 1e9, flops, static_cast<long long>(n),
      gpt.activation_bytes() / 1048576.0);
  return 0;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  ENGINE_CHECK(f != nullptr, "bench_model: cannot run " + cmd);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f))
    out += buf;
  ENGINE_CHECK(pclose(f) == 0, "bench_model: command failed: " + cmd + "\n" + out);
  return out;
}

// A number from the JSON object a child process printed (its output's last line).
double json_number(const std::string& output, const std::string& key) {
  std::string line = output;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
    line.pop_back();
  line = line.substr(line.rfind('\n') + 1);  // npos + 1 == 0: the whole text
  const core::JsonValue row = core::parse_json(line, "bench_model: child output");
  const core::JsonValue* value = row.find(key);
  ENGINE_CHECK(value != nullptr, "bench_model: no '" + key + "' in " + line);
  return value->as_double("bench_model: '" + key + "'");
}

// A JSON string literal of s (quotes and backslashes escaped; the texts here have no controls).
std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The child's last output line as a JSON object.
core::JsonValue child_row(const std::string& output) {
  std::string line = output;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
    line.pop_back();
  return core::parse_json(line.substr(line.rfind('\n') + 1), "bench_model: child output");
}

// What the PyTorch side ran on, from its row (tests/model/torch_reference.py --bench): a line for
// the table's head, so that a baseline on pinned or slow kernels is seen as one.
std::string torch_runtime_line(const core::JsonValue& row) {
  auto text = [&](const char* key) {
    const core::JsonValue* v = row.find(key);
    return v == nullptr ? std::string("?") : v->as_string(key);
  };
  const std::string coretype = text("openblas_coretype");
  return "PyTorch " + text("torch_version") + ": " + text("torch_blas") + ", CPU capability " +
         text("torch_cpu_capability") +
         (coretype.empty() ? std::string(", OPENBLAS_CORETYPE unset")
                           : ", OPENBLAS_CORETYPE=" + coretype +
                                 " pins its OpenBLAS kernels (not necessarily its fastest: unset "
                                 "it in the bench's command to compare at its best)");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    out.push_back(item);
  return out;
}

// --keys: one child process per model, thread count, precision, key and round; the rounds go
// over every key in turn, so a drift of the machine's speed reaches all keys alike, and each
// row is the key's median round, with its step time against the model's "none" row.
int time_keys(const std::string& exe, const std::string& models, const std::string& threads,
              const std::string& precisions, const std::string& keys, int steps, int rounds,
              bool json) {
  for (const auto& name : split(models)) {
    for (const auto& th : split(threads)) {
      for (const auto& prec : split(precisions)) {
        const std::string env = "OMP_NUM_THREADS=" + th + " OPENBLAS_NUM_THREADS=" + th + " ";
        std::map<std::string, std::vector<std::string>> outs;  // key -> one child output a round
        for (int r = 0; r < rounds; ++r)
          for (const auto& key : split(keys))
            outs[key].push_back(run_capture(env + exe + " --child " + name + " --key " + key +
                                            " --steps " + std::to_string(steps) + " --precision " +
                                            prec));
        auto median_round = [&](const std::string& key) {
          std::vector<std::string> v = outs[key];
          std::sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) {
            return json_number(a, "step_ms") < json_number(b, "step_ms");
          });
          return v[v.size() / 2];
        };
        const double none_ms = json_number(median_round("none"), "step_ms");
        for (const auto& key : split(keys)) {
          const std::string out = median_round(key);
          const double step_ms = json_number(out, "step_ms"), rel = step_ms / none_ms;
          if (json) {
            std::string row = out.substr(0, out.rfind('}'));
            std::printf("%s, \"rounds\": %d, \"step_vs_none\": %.3f}\n", row.c_str(), rounds, rel);
          } else {
            std::printf("%-12s %-15s %4s %3s %11.1f %10.1f %10.1f %11.0f %9.0f %8.3f\n",
                        name.c_str(), key.c_str(), prec.c_str(), th.c_str(),
                        json_number(out, "fwd_bwd_ms"), json_number(out, "adamw_ms"), step_ms,
                        json_number(out, "tokens_per_s"), json_number(out, "params"), rel);
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

// --op-groups on the CPU: one child process per model and thread count, which prints the
// measured step in each precision and then the op groups (op_groups_of); the table gives each
// row's share of the first precision's measured step.
int time_op_groups(const std::string& exe, const std::string& models, const std::string& threads,
                   const std::string& precisions, int steps, bool json) {
  if (!json)
    std::printf("%-7s %3s %-52s %10s %9s\n", "model", "thr", "op group", "ms a step", "% of step");
  for (const auto& name : split(models)) {
    for (const auto& th : split(threads)) {
      const std::string env = "OMP_NUM_THREADS=" + th + " OPENBLAS_NUM_THREADS=" + th + " ";
      const std::string out = run_capture(env + exe + " --child-op-groups " + name + " --steps " +
                                          std::to_string(steps) + " --precision " + precisions);
      std::stringstream lines(out);
      double step_ms = 0;
      for (std::string line; std::getline(lines, line);) {
        if (line.empty() || line.front() != '{') continue;
        if (json) {
          std::printf("%s\n", line.c_str());
          continue;
        }
        const core::JsonValue row = core::parse_json(line, "bench_model: child output");
        std::string label;
        double ms = 0;
        if (const core::JsonValue* group = row.find("group")) {
          label = group->as_string("group");
          ms = row.find("ms_per_step")->as_double("ms_per_step");
        } else {
          label = "measured step, " + row.find("precision")->as_string("precision") +
                  " (forward, backward, AdamW)";
          ms = row.find("step_ms")->as_double("step_ms");
          if (step_ms == 0) step_ms = ms;
        }
        std::printf("%-7s %3s %-52s %10.2f %9.1f\n", name.c_str(), th.c_str(), label.c_str(), ms,
                    100.0 * ms / step_ms);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

constexpr const char* kUsage =
    "usage: bench_model [--json] [--steps N] [--threads 1,2] [--models gpt2,modern]\n"
    "                   [--precision fp32,bf16] [--no-torch] [--torch-script PATH]\n"
    "       bench_model --keys all|KEY,... [--json] [--steps N] [--rounds R] [--threads 1,2]\n"
    "                   [--models speedrun_cpu] [--precision fp32]\n"
    "       bench_model --device cuda [--json] [--steps N] [--models gpt2_124m]\n"
    "                   [--precision fp32,bf16] [--op-groups]\n"
    "       bench_model --op-groups [--json] [--steps N] [--threads 1,2] [--models gpt2]\n"
    "                   [--precision fp32,bf16]\n"
    "One training step (forward, backward, AdamW) of the GPT beside PyTorch's; the header of\n"
    "apps/bench_model/main.cpp says what each column measures.\n";

int run(int argc, char** argv) {
  bool json = false, torch = true, op_groups = false;
  int steps = 3, rounds = 3;
  std::string threads = "1,2", models = "gpt2,modern", child_model, script = TORCH_REFERENCE;
  std::string precisions = "fp32";
  std::string device = "cpu";
  std::string keys, child_key = "none", child_op_groups;
  bool models_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() {
      ENGINE_CHECK(i + 1 < argc, "bench_model: " + a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--no-torch") {
      torch = false;
    } else if (a == "--op-groups") {
      op_groups = true;
    } else if (a == "--steps") {
      steps = std::stoi(value());
    } else if (a == "--threads") {
      threads = value();
    } else if (a == "--models") {
      models = value();
      models_given = true;
    } else if (a == "--keys") {
      keys = value();
    } else if (a == "--rounds") {
      rounds = std::stoi(value());
    } else if (a == "--key") {
      child_key = value();
    } else if (a == "--precision") {
      precisions = value();
    } else if (a == "--torch-script") {
      script = value();
    } else if (a == "--device") {
      device = value();
    } else if (a == "--child") {
      child_model = value();
    } else if (a == "--child-op-groups") {
      child_op_groups = value();
    } else {
      ENGINE_FAIL("bench_model: unknown argument '" + a + "'\n" + kUsage);
    }
  }
  ENGINE_CHECK(steps > 0, "bench_model: --steps must be positive");
  ENGINE_CHECK(rounds > 0, "bench_model: --rounds must be positive");
  ENGINE_CHECK(device == "cpu" || device == "cuda",
               "bench_model: --device must be cpu or cuda, got '" + device + "'");
  for (const auto& p : split(precisions))
    model::parse_precision(p);  // an unknown name fails here, naming it
  if (!child_model.empty()) return child(child_model, steps, precisions, child_key);
  if (!child_op_groups.empty()) {  // the measured step in each precision, then the groups
    for (const auto& p : split(precisions))
      child(child_op_groups, steps, p, "none");
    return op_groups_of(child_op_groups, steps, core::cpu_backend());
  }
  if (!keys.empty()) {
    ENGINE_CHECK(device == "cpu", "bench_model: --keys times the CPU step");
    model::ModelConfig probe;
    for (const auto& k : split(keys))
      apply_recipe_key(probe, k);  // an unknown key fails here, naming it
    if (keys == "all") {           // every key alone, then all of them together
      keys = "none";
      for (const auto& k : kRecipeKeys)
        keys += "," + k;
      keys += ",all";
    }
    if (split(keys).front() != "none") keys = "none," + keys;  // the row the others compare with
    if (!models_given) models = "speedrun_cpu";
    torch = false;  // torch_reference.py's bench mode has none of the recipe's keys
  }
  if (device == "cuda") {
    ENGINE_CHECK(core::cuda_built(), "bench_model --device cuda: this build has no CUDA backend");
    ENGINE_CHECK(core::cuda_device_count() > 0,
                 "bench_model --device cuda: this machine shows no GPU");
    if (!json)
      std::printf(
          "bench_model --device cuda: forward + backward in each precision, mean of %d "
          "steps after one warm-up; MFU against the GPU's peak in that precision\n",
          steps);
    for (const auto& name : split(models)) {  // one JSON object per model and precision
      for (const auto& p : split(precisions)) {
        cuda_measurement(name, steps, p);
        std::fflush(stdout);
      }
      if (op_groups) op_groups_of(name, steps, *core::make_cuda_backend(0));
    }
    return 0;
  }

  const std::string self = "/proc/self/exe";
  char exe[4096];
  const ssize_t len = readlink(self.c_str(), exe, sizeof exe - 1);
  ENGINE_CHECK(len > 0, "bench_model: cannot find its own executable");
  exe[len] = '\0';
  if (op_groups) {
    if (!json)
      std::printf(
          "bench_model --op-groups: each op group of one step on the CPU at the model's shapes, "
          "mean of %d after one warm-up, beside the measured step\n",
          steps);
    return time_op_groups(exe, models_given ? models : "gpt2", threads, precisions, steps, json);
  }
  if (!json) {
    std::printf(
        "bench_model: one training step = forward + backward + AdamW, mean of %d steps "
        "after one warm-up\nFLOPs as llm.c: 6 N per token (N = matmul weights, head "
        "included) + 6 L D T per token (attention)\n",
        steps);
    const std::string slow = core::cpu_backend().bf16_gemm_slow_reason();
    if (precisions.find("bf16") != std::string::npos)
      std::printf("bf16 GEMMs: %s; PyTorch: torch.autocast(\"cpu\", dtype=torch.bfloat16)\n",
                  slow.empty() ? "oneDNN on this CPU's bf16 instructions" : slow.c_str());
    if (keys.empty())
      std::printf("%-7s %4s %3s %11s %10s %10s %9s %11s %11s %7s\n", "model", "prec", "thr",
                  "fwd+bwd ms", "adamw ms", "step ms", "GFLOP/s", "tok/s", "torch tok/s", "ratio");
    else
      std::printf("%-12s %-15s %4s %3s %11s %10s %10s %11s %9s %8s\n", "model", "key", "prec",
                  "thr", "fwd+bwd ms", "adamw ms", "step ms", "tok/s", "params", "x none");
  }
  if (!keys.empty()) return time_keys(exe, models, threads, precisions, keys, steps, rounds, json);
  std::string torch_line;  // what PyTorch ran on
  std::map<std::string, std::pair<int, double>>
      torch_best;  // model/prec: (threads, its best tok/s)
  std::vector<std::string> flags;
  for (const auto& name : split(models)) {
    for (const auto& th : split(threads)) {
      for (const auto& prec : split(precisions)) {
        const std::string env = "OMP_NUM_THREADS=" + th + " OPENBLAS_NUM_THREADS=" + th + " ";
        const std::string ours = run_capture(env + exe + " --child " + name + " --steps " +
                                             std::to_string(steps) + " --precision " + prec);
        std::string theirs;
        if (torch) {
          const Spec s = spec_of(name, prec);
          theirs =
              run_capture(env + "/usr/bin/python3 " + script + " --bench --json --arch " + name +
                          " --n_layer 4 --n_head 4 --d_model 256 --vocab 50257" + " --seq " +
                          std::to_string(s.config.seq_len) + " --batch " + std::to_string(s.batch) +
                          " --threads " + th + " --steps " + std::to_string(steps) +
                          " --precision " + (prec == "bf16" ? "bf16" : "fp32"));
        }
        const double tok = json_number(ours, "tokens_per_s");
        const double ttok = torch ? json_number(theirs, "tokens_per_s") : 0.0;
        // A PyTorch row below its own row at fewer threads, or on other threads than asked,
        // is a baseline not at its best: flagged, with why, under the table.
        std::string flag, runtime;
        if (torch) {
          runtime = torch_runtime_line(child_row(theirs));
          if (torch_line.empty()) torch_line = runtime;
          const int asked = std::stoi(th);
          if (static_cast<int>(json_number(theirs, "torch_threads")) != asked)
            flag = "PyTorch ran " +
                   std::to_string(static_cast<int>(json_number(theirs, "torch_threads"))) +
                   " threads, not " + th;
          const std::string key = name + "/" + prec;
          if (auto it = torch_best.find(key);
              it != torch_best.end() && asked > it->second.first && ttok < it->second.second) {
            char text[256];
            std::snprintf(text, sizeof text,
                          "PyTorch %s %s at %s threads: %.0f tok/s, below its %.0f at %d "
                          "thread(s)",
                          name.c_str(), prec.c_str(), th.c_str(), ttok, it->second.second,
                          it->second.first);
            flag = text;
          }
          if (!torch_best.count(key) || ttok > torch_best[key].second)
            torch_best[key] = {asked, ttok};
          if (!flag.empty()) flags.push_back(flag);
        }
        if (json) {
          std::string row = ours.substr(0, ours.rfind('}'));
          if (torch) {
            char extra[128];
            std::snprintf(extra, sizeof extra, ", \"torch_tokens_per_s\": %.1f, \"ratio\": %.2f",
                          ttok, tok / ttok);
            row += extra;
            row += ", \"torch_runtime\": " + json_quote(runtime);
            if (!flag.empty()) row += ", \"torch_flag\": " + json_quote(flag);
          }
          std::printf("%s}\n", row.c_str());
        } else {
          std::printf("%-7s %4s %3s %11.1f %10.1f %10.1f %9.1f %11.0f %11.0f %7.2f%s\n",
                      name.c_str(), prec.c_str(), th.c_str(), json_number(ours, "fwd_bwd_ms"),
                      json_number(ours, "adamw_ms"), json_number(ours, "step_ms"),
                      json_number(ours, "gflops"), tok, ttok, torch ? tok / ttok : 0.0,
                      flag.empty() ? "" : " !");
        }
        std::fflush(stdout);
      }
    }
  }
  if (!json && torch) {
    std::printf("%s\n", torch_line.c_str());
    for (const std::string& f : flags)
      std::printf("! %s: that baseline is not PyTorch at its best on this machine\n", f.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
