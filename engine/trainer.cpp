#include "engine/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <map>
#include <sstream>

#include "comm/shard_ops.h"
#include "comm/traced_communicator.h"
#include "core/check.h"
#include "core/cpu_affinity.h"
#include "core/output_file.h"
#include "core/transfer.h"
#include "data/data_loader.h"
#include "data/gpt2_tokenizer.h"
#include "data/prefix_tokens.h"
#include "data/val_loader.h"
#include "engine/build_info.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/resume_check.h"
#include "engine/console_log.h"
#include "engine/model_loading.h"
#include "engine/precision.h"
#include "engine/preflight.h"
#include "engine/reparam/reparam_kinds.h"
#include "engine/stop_signal.h"
#include "engine/tensorboard_writer.h"
#include "engine/trainable.h"
#include "engine/validation.h"
#include "model/flops.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// log.trace: the run's timeline (collective: measures the clock offsets), or null.
std::unique_ptr<RunTrace> make_run_trace(const Config& config, comm::Communicator& control) {
  const auto steps = parse_step_range(config.log.trace);
  if (!steps) return nullptr;
  return std::make_unique<RunTrace>(control, steps->first, steps->second,
                                    (fs::path(config.log.dir) / "trace.json").string());
}

// `comm` recording its collectives into `tracer`, or null without one.
std::unique_ptr<comm::Communicator> traced(comm::Communicator& comm, core::Tracer* tracer) {
  if (tracer == nullptr) return nullptr;
  return std::make_unique<comm::TracedCommunicator>(comm, *tracer);
}

// "block 3", "embeddings" (layer -1), "head" (layer n_layer).
std::string layer_name(int layer, int n_layer) {
  if (layer < 0) return "embeddings";
  if (layer >= n_layer) return "head";
  return "block " + std::to_string(layer);
}

}  // namespace

Trainer::Trainer(Config config, comm::Communicator& control, comm::Communicator& tensors,
                 core::Backend& backend)
    : config_(std::move(config)),
      trace_(make_run_trace(config_, control)),
      tracer_(trace_ ? &trace_->tracer() : nullptr),
      traced_control_(traced(control, tracer_)),
      traced_tensors_(&tensors == &control ? nullptr : traced(tensors, tracer_)),
      comm_(traced_control_ ? *traced_control_ : control),
      tensors_(!tracer_               ? tensors
               : &tensors == &control ? *traced_control_
                                      : *traced_tensors_),
      backend_(backend),
      health_(config_.train.diverge_loss_factor, config_.train.diverge_zero_grad_steps),
      schedule_(config_.train.steps, config_.train.lr_warmup_steps, config_.train.lr_cooldown_frac,
                config_.train.lr_floor, parse_decay_shape(config_.train.lr_schedule),
                config_.train.lr_at_step_start),
      stages_(StageSchedule::of(config_)) {
  const int W = comm_.size();
  const int rank = comm_.rank();
  const std::string source = config_.source.empty() ? "config" : config_.source;
  ENGINE_CHECK(tensors_.size() == W && tensors_.rank() == rank,
               "trainer: the tensor communicator " + tensors_.name() +
                   " does not match the control communicator " + comm_.name());
  ENGINE_CHECK(tensors_.device() == backend_.device(),
               "trainer: rank " + std::to_string(rank) + " computes on " + backend_.device().str() +
                   " but its tensor communicator " + tensors_.name() + " moves buffers on " +
                   tensors_.device().str());
  // zero.progress = thread drives MPI's blocking collectives on host buffers from a thread;
  // NCCL progresses on its own stream.
  const bool host_tensors = core::is_host_memory(tensors_.device());
  ENGINE_CHECK(config_.zero.progress != "thread" || host_tensors,
               "config error: " + source + ": key 'zero.progress' = thread is for the CPU (MPI); " +
                   "on " + backend_.device().str() + " use poll");
  geometry_ = BatchGeometry::of(config_, W);

  // Model: every rank initialises the same full parameters from the seed, in the precision
  // this device makes pay (engine/precision.h).
  model::ModelConfig model_config = model_config_of(config_);
  for (const std::string& fp8_refusal :
       {fp8_head_refusal(model_config.head_fp8, backend_.fp8_gemm_missing_reason()),
        fp8_key_refusal("model.mlp_fp8", model_config.mlp_fp8, backend_.fp8_gemm_missing_reason())})
    ENGINE_CHECK(fp8_refusal.empty(), "config error: " + source + ": " + fp8_refusal);
  const PrecisionChoice precision = choose_precision(model_config.precision, backend_);
  if (!precision.warning.empty()) spdlog::warn("{}", precision.warning);
  model_config.precision = precision.precision;
  gpt_ = std::make_unique<model::Gpt>(model_config, backend_);
  gpt_->init_weights();
  if (stages_.uses_prefix()) {
    // Record #89's prefix targets, from the GPT-2 vocabulary (built once; the stages weight them).
    const std::string& dir = config_.train.stages_prefix_vocab;
    try {
      const data::Gpt2Tokenizer tokenizer(dir);
      gpt_->set_prefix_table(data::prefix_tokens(tokenizer, model_config.vocab_size));
    } catch (const core::Error& e) {
      throw core::Error("config error: " + source + ": key 'train.stages.prefix_vocab' = '" + dir +
                        "': " + e.what());
    }
  }

  // Optimizer groups decide each trainable's placement; the plan resolves it for this world.
  std::vector<Trainable> trainables = model_trainables(*gpt_);
  YAML::Node groups(YAML::NodeType::Sequence);
  for (const auto& g : config_.optim)
    groups.push_back(g.node);
  try {
    const std::vector<comm::ParamDesc> params(trainables.begin(), trainables.end());
    optim_ = std::make_unique<optim::OptimizerSet>(groups, params);
  } catch (const core::Error& e) {
    const std::string file = config_.optim.empty() ? source : config_.optim.front().file;
    throw core::Error("config error: " + file + ": optim: " + e.what());
  }
  reparams_ = make_reparams({config_, *gpt_, *optim_, tensors_});
  for (const auto& reparam : reparams_)
    trainables = reparam->replace_trainables(std::move(trainables));
  for (Trainable& t : trainables)
    t.placement = optim_->placement(t.name);
  plan_ = std::make_unique<comm::ShardingPlan>(
      std::vector<comm::ParamDesc>(trainables.begin(), trainables.end()), W, rank,
      static_cast<int>(config_.zero.stage));
  ZeroOptions zo;
  zo.overlap = config_.zero.overlap;
  zo.bucket_bytes = static_cast<int64_t>(config_.zero.bucket_mb * (1 << 20));
  zo.progress_thread = config_.zero.progress == "thread";
  zo.sparse_rows = config_.zero.sparse_rows && host_tensors;  // a host scan
  zo.release_full_storage = [this] { gpt_->release_storage(); };
  zo.tracer = tracer_;
  zero_ = ZeroState::create(tensors_, *plan_, std::move(trainables), backend_, zo);
  step_sums_ = core::Tensor::empty({2}, core::DType::F64, backend_.allocator());
  grad_scale_ = core::Tensor::empty({1}, core::DType::F32, backend_.allocator());
  gpt_->set_layer_hook(
      [this](model::Gpt::LayerEvent event, int layer) { on_layer_event(event, layer); });

  loader_ = make_train_loader(config_, geometry_, rank, W);
  val_loader_ = make_val_loader(config_, geometry_, rank, W);
  checkpointer_ = std::make_unique<Checkpointer>(
      config_, comm_, backend_,
      CheckpointedState{*plan_, *zero_, *optim_, reparams_, *loader_, *gpt_});

  flops_per_token_ = model::training_flops_per_token(gpt_->config());
}

Trainer::~Trainer() = default;

void Trainer::backward(bool last) {
  zero_->begin_backward(last);
  gpt_->backward();
  zero_->end_backward();
}

void Trainer::trace_layer(model::Gpt::LayerEvent event, int layer) {
  using Event = model::Gpt::LayerEvent;
  if (event == Event::kBeforeForward || event == Event::kBeforeBackward) {
    layer_begin_us_ = core::Tracer::now_us();
    return;
  }
  std::string name = event == Event::kAfterForward ? "forward " : "backward ";
  name += layer_name(layer, static_cast<int>(gpt_->config().n_layer));
  const double now = core::Tracer::now_us();
  tracer_->record(name, core::kNoIndex, "layer", tracer_->thread_track(), layer_begin_us_, now);
  // The embeddings' backward has no kBeforeBackward: it starts where block 0's ended.
  layer_begin_us_ = now;
}

void Trainer::on_layer_event(model::Gpt::LayerEvent event, int layer) {
  using Event = model::Gpt::LayerEvent;
  // A layer's span holds what the ZeRO state does for it before it runs (a stage-3 gather) and
  // ends before what follows its backward (the start of its reduction).
  const bool tracing = tracer_ != nullptr && tracer_->active();
  if (tracing && event != Event::kAfterBackward) trace_layer(event, layer);
  switch (event) {
    case Event::kBeforeForward:
      zero_->before_forward(layer);
      break;
    case Event::kAfterForward:
      break;
    case Event::kBeforeBackward:
      zero_->before_backward(layer);
      break;
    case Event::kAfterBackward:
      if (tracing) trace_layer(event, layer);
      // The reparametrisations map their gradients before the ZeRO state may start reducing
      // them (with zero.overlap, right after this layer's backward).
      for (const auto& reparam : reparams_)
        reparam->on_layer_event(event, layer);
      zero_->after_backward(layer);
      return;
  }
  for (const auto& reparam : reparams_)
    reparam->on_layer_event(event, layer);
}

void Trainer::forward_backward() {
  // The gradient of the mean loss over the global batch is the mean over micro-steps and ranks
  // (the sums of finish_grads, scaled by clip_grads).
  zero_->begin_step();
  apply_window_schedule(*gpt_, counters_.step, config_.train.steps);
  gpt_->take_expert_rows();  // warm-up and validation forwards route too: this step from 0
  apply_stage(counters_.step);
  data::Batch batch;
  for (int64_t m = 0; m < step_micro_steps_; ++m) {
    core::TraceScope micro_step(tracer_, "micro-step", "micro-step", static_cast<int>(m));
    loader_->load(counters_.step, m, batch);
    {
      core::TraceScope forward(tracer_, "pass", "forward");
      gpt_->forward_accumulate(batch.inputs.data(), batch.targets.data(),
                               static_cast<int>(batch.rows), static_cast<int>(batch.seq_len));
    }
    core::TraceScope backward_span(tracer_, "pass", "backward");
    backward(m == step_micro_steps_ - 1);
  }
  // The micro-steps' losses were summed on the device; they stay there (clip_grads reduces them
  // with the gradient's sum of squares).
  gpt_->take_loss_sum(step_sums_.data<double>());
  expert_rows_ = gpt_->take_expert_rows();  // MoE: the whole batch's routing, for the metrics
  if (!expert_rows_.empty())
    comm_.all_reduce(expert_rows_.data(), static_cast<int64_t>(expert_rows_.size()),
                     comm::ReduceOp::Sum);
}

void Trainer::apply_stage(int64_t step) {
  gpt_->set_weights_step(step);
  step_micro_steps_ = loader_->micro_steps(step);
  step_tokens_ = config_.train.batch_tokens;
  if (!stages_.enabled()) return;
  stage_settings_ = stages_.settings(step);
  step_tokens_ = stage_settings_.batch_tokens;
  gpt_->set_loss_weights(stage_settings_.mtp_weights, stage_settings_.prefix_weight);
  apply_stage_window(step);
}

void Trainer::apply_stage_window(int64_t step) {
  if (!stages_.enabled() || config_.model.window <= 0) return;
  // model.yarn rescales at each change of the long window: each stage's window is set once, in
  // order, from the first stage on (a resumed run's fresh model takes the same growths). The
  // final validation's wider window (from total_steps on) is set without rescaling.
  const int64_t stage = stages_.stage_index(std::min(step, stages_.total_steps() - 1));
  for (; windows_set_ < stage; ++windows_set_) {
    const TrainingStage& s = stages_.stages()[static_cast<size_t>(windows_set_ + 1)];
    gpt_->set_attention_window(static_cast<int>(s.window_long), true,
                               static_cast<int>(s.window_short));
  }
  // Both of the stage's windows (the record's short one is not half the long one).
  const StageSettings now = stages_.settings(step);
  gpt_->set_attention_window(static_cast<int>(now.window_long), step < stages_.total_steps(),
                             static_cast<int>(now.window_short));
}

double Trainer::gradient_mean() const {
  double mean = 1.0 / static_cast<double>(step_micro_steps_ * comm_.size());
  // train.rank_sum_loss: the record's gradient, each rank's token losses summed (its share of
  // the batch times the mean) and averaged over ranks.
  if (config_.train.rank_sum_loss)
    mean *= static_cast<double>(step_tokens_) / static_cast<double>(comm_.size());
  return mean;
}

bool Trainer::clip_grads() {
  // The reduced gradients are sums over ranks and micro-steps; one factor scales them to the
  // mean and clips them together. It is computed and applied on the device: the host reads
  // nothing until the step's end (read_step_sums).
  double* sums = step_sums_.data<double>();  // {loss sum, gradient sum of squares}
  zero_->grad_sum_squares(sums + 1);
  tensors_.all_reduce_on_device(sums, 2, comm::ReduceOp::Sum);
  const double mean = gradient_mean();
  // One rank, one micro-step and no clip: the factor is 1.
  if (config_.train.grad_clip <= 0 && static_cast<float>(mean) == 1.0f) return false;
  float* scale = grad_scale_.data<float>();
  backend_.grad_clip_scale(scale, sums + 1, mean, config_.train.grad_clip);
  // An optimizer that folds the factor into its update (AdamW) saves this pass over its share.
  zero_->scale_grads(scale,
                     [this](const std::string& name) { return optim_->folds_grad_scale(name); });
  return true;
}

void Trainer::optimizer_step(double lr_scale, bool scaled) {
  optim::StepContext ctx;
  ctx.step = counters_.step + 1;
  ctx.total_steps = config_.train.steps;
  ctx.lr_scale = lr_scale;
  ctx.backend = &backend_;
  ctx.comm = &tensors_;
  ctx.grad_scale = scaled ? grad_scale_.data<float>() : nullptr;
  try {
    optim_->step(zero_->optimizer_shards(), ctx);
  } catch (const core::Error&) {
    // An optimizer may fail on what a diverged step handed it (a non-finite eigenbasis, say):
    // the divergence is the cause to report, where it is one.
    const StepSums sums = read_step_sums();
    health_.check(counters_.step + 1, sums.loss, sums.grad_norm);
    throw;
  }
}

Trainer::StepSums Trainer::read_step_sums() {
  double sums[2];
  backend_.copy_to_host(sums, step_sums_.data<double>(), sizeof sums);
  StepSums out;
  out.loss = sums[0] / static_cast<double>(step_micro_steps_) / comm_.size();
  out.grad_norm = std::sqrt(sums[1]) * gradient_mean();
  return out;
}

StepRecord Trainer::train_step() {
  const auto t0 = Clock::now();
  const comm::CommStats before = tensors_.stats();
  const bool tracing = tracer_ != nullptr && tracer_->active();
  core::TraceScope step_span(tracer_, "step", "step", static_cast<int>(counters_.step + 1));

  std::vector<std::pair<std::string, double>> phases;
  auto t_phase = Clock::now();
  double phase_begin_us = tracing ? core::Tracer::now_us() : 0;
  const double step_begin_us = phase_begin_us;
  // log.device_timing (and log.trace on a device other than the CPU): a mark in the device's
  // order of work at each phase boundary.
  const bool device_marks =
      config_.log.device_timing || (tracing && !core::is_host_memory(backend_.device()));
  std::vector<core::TimeMark> marks;
  if (device_marks) marks.push_back(backend_.mark());
  auto end_phase = [&](const char* name) {
    phases.emplace_back(name, ms_since(t_phase));
    t_phase = Clock::now();
    if (tracing) {
      const double now = core::Tracer::now_us();
      tracer_->record(name, core::kNoIndex, "phase", tracer_->thread_track(), phase_begin_us, now);
      phase_begin_us = now;
    }
    if (device_marks) marks.push_back(backend_.mark());
  };

  backend_.allocator().reset_peak();
  forward_backward();
  end_phase("forward_backward");
  zero_->finish_grads();
  end_phase("reduce_grads");
  const bool scaled = clip_grads();
  end_phase("clip");
  // Optimizer step on the local parts, then the parameters back where the model reads them.
  const double lr_scale = stages_.enabled() ? stages_.lr_multiplier(counters_.step)
                                            : schedule_.multiplier(counters_.step);
  optimizer_step(lr_scale, scaled);
  end_phase("optimizer");
  zero_->publish_params();
  for (const auto& reparam : reparams_)
    reparam->after_step();
  gpt_->params_updated();  // bf16: the matmul weights' copies follow the new values
  // The step's one read back, the loss and the gradient norm, then the health checks: a step
  // that diverged throws before its counters move, and run() saves nothing after it.
  const StepSums sums = read_step_sums();
  const double loss = sums.loss, grad_norm = sums.grad_norm;
  health_.check(counters_.step + 1, loss, grad_norm);
  end_phase("gather_params");

  ++counters_.step;
  const double step_ms = ms_since(t0);
  counters_.train_time_ms += step_ms;
  counters_.tokens += step_tokens_;

  StepRecord r;
  r.step = counters_.step;
  r.train_loss = loss;
  r.lr = optim_->optimizer(0).lr() * lr_scale;  // the first group's, its default included
  for (size_t g = 0; g < optim_->num_groups(); ++g)
    r.group_lr.push_back(optim_->optimizer(g).lr() * lr_scale);
  r.grad_norm = grad_norm;
  r.tokens = counters_.tokens;
  r.train_time_ms = counters_.train_time_ms;
  r.step_ms = step_ms;
  r.tokens_per_s = static_cast<double>(step_tokens_) / (step_ms / 1000.0);
  r.gflops = flops_per_token_ * r.tokens_per_s / 1e9;
  const comm::CommStats& after = tensors_.stats();
  for (int k = 0; k < comm::kNumCollectives; ++k) {
    auto kind = static_cast<comm::Collective>(k);
    int64_t bytes = after[kind].bytes - before[kind].bytes;
    if (kind != comm::Collective::Barrier)
      r.comm_bytes.emplace_back(comm::collective_name(kind), bytes);
  }
  r.comm_wait_ms = after.wait_ms() - before.wait_ms();
  if (config_.log.device_timing)
    for (size_t i = 0; i + 1 < marks.size(); ++i)
      r.device_phase_ms.emplace_back(phases[i].first, backend_.elapsed_ms(marks[i], marks[i + 1]));
  if (tracing && !marks.empty()) trace_device_phases(phases, marks, step_begin_us);
  r.phase_ms = std::move(phases);
  r.peak_mem_bytes = static_cast<int64_t>(backend_.allocator().peak_bytes());
  r.live_mem_bytes = static_cast<int64_t>(backend_.allocator().live_bytes());
  r.moe_expert_rows = expert_rows_;
  return r;
}

void Trainer::trace_device_phases(const std::vector<std::pair<std::string, double>>& phases,
                                  const std::vector<core::TimeMark>& marks, double begin_us) {
  // Events give times between marks only: the device row starts at the host's first mark, so
  // its spans show each phase's device time and their order, not the device's lag behind the
  // host.
  const int track = tracer_->named_track("device");
  double at = begin_us;
  for (size_t i = 0; i + 1 < marks.size() && i < phases.size(); ++i) {
    const double end = begin_us + 1e3 * backend_.elapsed_ms(marks[0], marks[i + 1]);
    tracer_->record(phases[i].first, core::kNoIndex, "device", track, at, end);
    at = end;
  }
}

double Trainer::evaluate() {
  core::TraceScope span(tracer_, "evaluate", "evaluate");
  // Validation sees the window the next step trains with (at step 0 the schedule's first, not
  // the full model.window), as modded-nanogpt evaluates.
  apply_window_schedule(*gpt_, counters_.step, config_.train.steps);
  apply_stage_window(counters_.step);
  // No backward events release what a forward gathered (stage 3).
  const double val = validation_loss(*gpt_, *val_loader_, comm_, [this] { zero_->end_forward(); });
  last_val_ = {counters_.step, val};
  return val;
}

std::string Trainer::save_checkpoint() {
  std::optional<double> val_loss;
  if (last_val_ && last_val_->first == counters_.step) val_loss = last_val_->second;
  core::TraceScope span(tracer_, "checkpoint", "checkpoint write");
  return checkpointer_->save(counters_, val_loss);
}

void Trainer::load_checkpoint(const std::string& dir) {
  counters_ = checkpointer_->load(dir);
  gpt_->params_updated();
}

void Trainer::init_params_from(const std::string& source) {
  std::map<std::string, core::Tensor> weights;
  try {
    weights = read_model_weights(source, config_, gpt_->table(), backend_);
  } catch (const core::Error& e) {
    throw core::Error(std::string("train.init_from: ") + e.what());
  }
  // Every rank holds the whole weights: it keeps its local parts of the model's parameters,
  // then publishes them as a checkpoint load does; the reparametrisations derive theirs.
  for (size_t i = 0; i < plan_->num_params(); ++i) {
    const core::Tensor& local = zero_->local_value(i);
    const std::string& name = plan_->param(i).name;
    bool reparametrised = false;
    for (const auto& reparam : reparams_)
      reparametrised |= reparam->owns(name);
    if (local.defined() && !reparametrised)
      comm::copy_local_part(tensors_, *plan_, i, core::to_backend(backend_, weights.at(name)),
                            local);
  }
  zero_->publish_params();
  for (const auto& reparam : reparams_)
    reparam->init_from(weights);
  gpt_->params_updated();
}

void log_rank_devices(comm::Communicator& comm, core::Backend& backend) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const core::RankCpus mine{omp_get_max_threads(), core::affinity_cpus()};
  const std::vector<std::string> devices = comm::all_gather_text(
      comm, std::string(backend.name()) + " on " + host + ", " + core::describe(mine));
  for (size_t r = 0; r < devices.size(); ++r)
    spdlog::info("rank {}: {}", r, devices[r]);
  // Every rank's threads and cores, so that rank 0 says once which ranks share cores.
  std::string cpus = std::to_string(mine.threads);
  for (int c : mine.cpus) {
    cpus += ' ';
    cpus += std::to_string(c);
  }
  std::vector<core::RankCpus> ranks;
  for (const std::string& text : comm::all_gather_text(comm, cpus)) {
    std::istringstream in(text);
    core::RankCpus r;
    in >> r.threads;
    r.cpus.assign(std::istream_iterator<int>(in), std::istream_iterator<int>());
    ranks.push_back(std::move(r));
  }
  const std::string warning = core::oversubscription_warning(ranks);
  if (!warning.empty()) spdlog::warn("{}", warning);
}

void Trainer::print_banner() const {
  const model::ModelConfig& mc = gpt_->config();
  spdlog::info("{}", engine_build_line());
  spdlog::info(
      "engine: config {} | world size {} | threads per rank {} | backend {} | tensors over {}",
      config_.source.empty() ? "(built in code)" : config_.source, comm_.size(),
      omp_get_max_threads(), gpt_->backend().name(), tensors_.name());
  log_rank_devices(comm_, backend_);
  spdlog::info("model: {} {} layers, d_model {}, {} heads, seq_len {}, vocab {} (padded {}){}",
               model::arch_name(mc.arch), mc.n_layer, mc.d_model, mc.n_head, mc.seq_len,
               mc.vocab_size, mc.padded_vocab(),
               mc.moe() ? ", MoE " + std::to_string(mc.moe_experts) + " experts" : "");
  // The optimizer's state is per parameter element it steps (its size per element depends on
  // the optimizer and is known only once the state exists).
  spdlog::info(
      "parameters: {} ({:.2f} M) | ZeRO stage {} | rank 0 steps {} of them (and holds their "
      "optimizer state)",
      gpt_->table().total_numel(), gpt_->table().total_numel() / 1e6, plan_->stage(),
      plan_->state_numel(0));
  spdlog::info("{}", zero_->describe());
  if (stages_.enabled()) {
    for (const TrainingStage& st : stages_.stages())
      spdlog::info(
          "stage steps {}-{}: {} tokens per step = {} ranks x {} micro-steps x 1 row x {} tokens, "
          "documents to {} tokens, windows {} / {}, lr x {}",
          st.begin_step, st.end_step - 1, st.batch_tokens, comm_.size(),
          stages_.rows() / comm_.size(), st.row_tokens, st.max_doc_tokens, st.window_short,
          st.window_long, st.lr_mul);
  } else {
    spdlog::info("batch: {} tokens per step = {} ranks x {} micro-steps x {} rows x {} tokens",
                 config_.train.batch_tokens, comm_.size(), geometry_.grad_accum,
                 geometry_.micro_rows, geometry_.seq_len);
  }
  for (size_t g = 0; g < optim_->num_groups(); ++g)
    spdlog::info("optim group {}: {} for {} parameters", g, optim_->optimizer(g).kind(),
                 optim_->group_params(g).size());
  spdlog::info("effective config:\n{}", config_to_yaml(config_));
}

void Trainer::warm_up() {
  if (config_.train.warmup_steps <= 0) return;
  // model.mlp_fp8's delayed scales as they were (1 at the start, or a checkpoint's), as the
  // record restores them after its warm-up.
  const std::vector<float> fp8_scales = gpt_->fp8_mlp_scales();
  data::Batch batch;
  apply_stage(counters_.step);
  loader_->load(counters_.step, 0, batch);
  for (int64_t i = 0; i < config_.train.warmup_steps; ++i) {
    gpt_->forward(batch.inputs.data(), batch.targets.data(), static_cast<int>(batch.rows),
                  static_cast<int>(batch.seq_len));
    backward(false);
  }
  gpt_->set_fp8_mlp_scales(fp8_scales);
  zero_->begin_step();
  comm_.barrier();
}

TrainSummary Trainer::run() {
  TrainSummary summary;
  const std::string resume = resolve_resume(config_.checkpoint.dir, config_.checkpoint.resume);
  std::unique_ptr<LogFile> log_file;  // every console line also in <log.dir>/log.txt
  if (comm_.rank() == 0)
    log_file = std::make_unique<LogFile>((fs::path(config_.log.dir) / "log.txt").string(),
                                         /*append=*/!resume.empty());
  if (!resume.empty()) {
    load_checkpoint(resume);
    check_steps_left(resume, counters_.step, config_);
    // Checkpoints newer than this one: rank 0's verdict (it holds the run lock), shared, once
    // every other check passed, so that a refused resume deletes nothing.
    std::string refused;
    if (comm_.rank() == 0) {
      try {
        prepare_resume_from_older(config_, resume, counters_.step);
      } catch (const core::Error& e) {
        refused = e.what();
      }
    }
    int64_t failed = refused.empty() ? 0 : 1;
    comm_.all_reduce(&failed, 1, comm::ReduceOp::Max);
    if (failed != 0) throw core::Error(refused.empty() ? "rank 0 refused the resume" : refused);
    spdlog::info("resumed from {} at step {}", resume, counters_.step);
  } else if (!config_.train.init_from.empty()) {
    init_params_from(config_.train.init_from);
    spdlog::info("initialised the weights from {}", weights_origin(config_.train.init_from));
  }
  print_banner();
  const int64_t total = config_.train.steps;
  // All ranks' peak, for the console's mfu.
  std::optional<double> peak_gflops =
      config_.log.peak_gflops > 0
          ? std::optional<double>(config_.log.peak_gflops)
          : gpu_peak_gflops(gpt_->backend().name(), config_.train.precision);
  if (peak_gflops)
    *peak_gflops *= comm_.size();
  else
    spdlog::info("{}", unknown_peak_note(gpt_->backend().name()));
  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (comm_.rank() == 0) {
    fs::create_directories(config_.log.dir);
    core::write_output_file((fs::path(config_.log.dir) / "config.yaml").string(),
                            config_to_yaml(config_), "the config copy");
    if (config_.log.metrics)
      metrics =
          std::make_unique<MetricsWriter>((fs::path(config_.log.dir) / "metrics.jsonl").string(),
                                          resume.empty() ? -1 : counters_.step);
    if (config_.log.tensorboard) tensorboard = std::make_unique<TensorBoardWriter>(config_.log.dir);
  }
  started_ = true;
  warm_up();

  // The record to metrics.jsonl and TensorBoard; the first one this process writes names the
  // build, so a file a resume appended to says which code wrote which steps.
  bool build_written = false;
  auto publish = [&](StepRecord& r) {
    if (!build_written) {
      r.engine_version = engine_version();
      r.engine_commit = engine_commit();
      build_written = true;
    }
    if (metrics) metrics->write(r);
    if (tensorboard) tensorboard->write(r);
  };

  auto eval_and_log = [&](StepRecord& r) {
    const double val = evaluate();
    r.val_loss = val;
    summary.final_val_loss = val;
    spdlog::info("{}", format_val_line(counters_.step, total, val, counters_.train_time_ms));
    return val;
  };

  const int64_t eval_every = config_.train.eval_every;
  if (counters_.step == 0 && eval_every > 0) {
    StepRecord r;
    r.step = 0;
    eval_and_log(r);
    publish(r);
  }
  bool stop = false;
  while (counters_.step < total && !stop) {
    if (trace_) trace_->begin_step(counters_.step + 1);
    StepRecord r = train_step();
    if (peak_gflops) r.mfu = r.gflops / *peak_gflops;
    if (counters_.step % config_.log.every == 0 || counters_.step == total) {
      const double eta_s = (counters_.train_time_ms / counters_.step) *
                           static_cast<double>(total - counters_.step) / 1e3;
      spdlog::info("{} {}",
                   format_train_line(counters_.step, total, *r.train_loss, counters_.train_time_ms,
                                     r.lr, r.tokens_per_s),
                   format_progress_fields(eta_s, r.mfu));
      spdlog::info("{}", format_stats_line(counters_.step, total, r.grad_norm, r.peak_mem_bytes,
                                           r.live_mem_bytes));
    }
    const bool last = counters_.step == total;
    if (last || (eval_every > 0 && counters_.step % eval_every == 0)) {
      const double val = eval_and_log(r);
      if (config_.train.target_val_loss > 0 && val <= config_.train.target_val_loss) {
        summary.target_step = counters_.step;
        summary.target_time_ms = counters_.train_time_ms;
        spdlog::info("reached target val_loss {:.4f} <= {} at step {}: train_time {:.0f} ms", val,
                     config_.train.target_val_loss, counters_.step, counters_.train_time_ms);
        stop = true;
      }
    }
    publish(r);
    const bool periodic =
        config_.checkpoint.every > 0 && counters_.step % config_.checkpoint.every == 0;
    bool saved = periodic || ((last || stop) && config_.checkpoint.at_end);
    // A step whose gradient norm is exactly 0 may be a dead model the health check will stop
    // in a step or two: it is not saved, so rotation cannot drop good checkpoints for it.
    if (saved && health_.suspect()) {
      spdlog::warn("step {}: checkpoint skipped: the gradient norm is exactly 0", counters_.step);
      saved = false;
    }
    if (saved) {
      summary.last_checkpoint = save_checkpoint();
      spdlog::info("checkpoint saved: {}", summary.last_checkpoint);
    }
    if (trace_) trace_->end_step(counters_.step);
    if (const int signal = agreed_stop_signal(comm_)) {
      if (config_.checkpoint.on_signal && !saved) {
        summary.last_checkpoint = save_checkpoint();
        spdlog::info("checkpoint saved: {}", summary.last_checkpoint);
      }
      throw StoppedBySignal(signal, counters_.step);
    }
  }
  if (trace_) trace_->finish();
  summary.steps_done = counters_.step;
  summary.train_time_ms = counters_.train_time_ms;
  spdlog::info(
      "done: {} steps, train_time {:.0f} ms ({:.2f} ms/step){}{}", counters_.step,
      counters_.train_time_ms, counters_.train_time_ms / std::max<int64_t>(counters_.step, 1),
      summary.final_val_loss ? fmt::format(", final val_loss {:.4f}", *summary.final_val_loss)
                             : std::string(),
      summary.target_time_ms ? fmt::format(", target reached at step {} after {:.0f} ms",
                                           *summary.target_step, *summary.target_time_ms)
                             : std::string());
  return summary;
}

}  // namespace engine
