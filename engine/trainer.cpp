#include "engine/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "comm/shard_ops.h"
#include "core/check.h"
#include "core/cpu_affinity.h"
#include "data/data_loader.h"
#include "data/val_loader.h"
#include "engine/checkpoint.h"
#include "engine/console_log.h"
#include "engine/osft_reparam.h"
#include "engine/precision.h"
#include "engine/resume_check.h"
#include "engine/sharded_state.h"
#include "engine/stop_signal.h"
#include "engine/trainable.h"
#include "model/hf_gpt2.h"
#include "model/weights_io.h"

namespace engine {

// Micro-steps per optimizer step beyond which a batch plan is refused as absurd.
constexpr int64_t kMaxMicroSteps = 4096;

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Largest divisor of n that is <= cap (>= 1).
int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = std::min(n, cap); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

std::string double_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string state_value(const Manifest& m, const std::string& key, const std::string& dir) {
  auto it = m.state.find(key);
  ENGINE_CHECK(it != m.state.end(),
               "checkpoint " + dir + ": the manifest has no state '" + key + "'");
  return it->second;
}

}  // namespace

model::ModelConfig model_config_of(const Config& c) {
  model::ModelConfig m;
  m.n_layer = static_cast<int>(c.model.n_layer);
  m.n_head = static_cast<int>(c.model.n_head);
  m.d_model = static_cast<int>(c.model.d_model);
  m.seq_len = static_cast<int>(c.model.seq_len);
  m.vocab_size = static_cast<int>(c.model.vocab_size);
  m.arch = model::parse_arch(c.model.arch);
  m.softcap = static_cast<float>(c.model.softcap);
  m.moe_experts = static_cast<int>(c.model.moe_experts);
  m.moe_top_k = static_cast<int>(c.model.moe_top_k);
  m.moe_aux_weight = static_cast<float>(c.model.moe_aux_weight);
  m.seed = static_cast<uint64_t>(c.train.seed);
  m.precision = model::parse_precision(c.train.precision);
  m.validate();
  return m;
}

Trainer::Trainer(Config config, comm::Communicator& control, comm::Communicator& tensors,
                 core::Backend& backend, bool with_train_data, bool with_val_data)
    : config_(std::move(config)),
      comm_(control),
      tensors_(tensors),
      backend_(backend),
      health_(config_.train.diverge_loss_factor, config_.train.diverge_zero_grad_steps),
      schedule_(config_.train.steps, config_.train.lr_warmup_steps, config_.train.lr_cooldown_frac,
                config_.train.lr_floor, parse_decay_shape(config_.train.lr_schedule)) {
  const int W = comm_.size();
  const int rank = comm_.rank();
  const int64_t T = config_.model.seq_len;
  const std::string source = config_.source.empty() ? "config" : config_.source;
  ENGINE_CHECK(tensors_.size() == W && tensors_.rank() == rank,
               "trainer: the tensor communicator " + tensors_.name() +
                   " does not match the control communicator " + comm_.name());
  ENGINE_CHECK(tensors_.device() == backend_.device(),
               "trainer: rank " + std::to_string(rank) + " computes on " + backend_.device().str() +
                   " but its tensor communicator " + tensors_.name() + " moves buffers on " +
                   tensors_.device().str());
  // zero.progress = thread drives MPI's blocking collectives from a thread; NCCL progresses on
  // its own stream.
  ENGINE_CHECK(config_.zero.progress != "thread" || tensors_.device().is_cpu(),
               "config error: " + source + ": key 'zero.progress' = thread is for the CPU (MPI); " +
                   "on " + backend_.device().str() + " use poll");

  // Batch geometry: the global batch is fixed; each rank takes rows_per_rank of it in
  // grad_accum micro-steps of micro_rows rows.
  const int64_t batch_rows = config_.train.batch_tokens / T;
  ENGINE_CHECK(batch_rows % W == 0, "config error: " + source + ": key 'train.batch_tokens' = " +
                                        std::to_string(config_.train.batch_tokens) + " gives " +
                                        std::to_string(batch_rows) +
                                        " sequences per step, not divisible by the " +
                                        "world size " + std::to_string(W));
  const int64_t rows_per_rank = batch_rows / W;
  grad_accum_ = (rows_per_rank + config_.train.micro_batch - 1) / config_.train.micro_batch;
  // A plan this far beyond any real batch is a typo (a step would run for hours with no line
  // printed): refused at once with its numbers.
  ENGINE_CHECK(grad_accum_ <= kMaxMicroSteps,
               "config error: " + source +
                   ": key 'train.batch_tokens' = " + std::to_string(config_.train.batch_tokens) +
                   " gives " + std::to_string(rows_per_rank) + " sequences per rank per step, " +
                   std::to_string(grad_accum_) + " micro-steps of train.micro_batch = " +
                   std::to_string(config_.train.micro_batch) + " (at most " +
                   std::to_string(kMaxMicroSteps) +
                   "): lower train.batch_tokens or raise train.micro_batch");
  while (rows_per_rank % grad_accum_ != 0)
    ++grad_accum_;
  micro_rows_ = rows_per_rank / grad_accum_;

  const int64_t val_seqs = config_.train.val_tokens / T;
  ENGINE_CHECK(val_seqs % W == 0,
               "config error: " + source + ": key 'train.val_tokens' = " +
                   std::to_string(config_.train.val_tokens) + " gives " + std::to_string(val_seqs) +
                   " sequences, not divisible by the world size " + std::to_string(W));
  val_rows_ = largest_divisor_at_most(val_seqs / W, micro_rows_);

  // Model: every rank initialises the same full parameters from the seed, in the precision
  // this device makes pay (engine/precision.h).
  model::ModelConfig model_config = model_config_of(config_);
  const PrecisionChoice precision = choose_precision(model_config.precision, backend_);
  if (!precision.warning.empty()) spdlog::warn("{}", precision.warning);
  model_config.precision = precision.precision;
  gpt_ = std::make_unique<model::Gpt>(model_config, backend_);
  gpt_->init_weights();
  const model::ParamTable& table = gpt_->table();

  // Optimizer groups decide each trainable's placement; the plan resolves it for this world.
  std::vector<Trainable> trainables = model_trainables(*gpt_);
  std::vector<optim::ParamSpec> specs;
  for (const Trainable& t : trainables)
    specs.push_back({t.name, t.shape});
  YAML::Node groups(YAML::NodeType::Sequence);
  for (const auto& g : config_.optim)
    groups.push_back(g.node);
  try {
    optim_ = std::make_unique<optim::OptimizerSet>(groups, specs);
  } catch (const core::Error& e) {
    const std::string file = config_.optim.empty() ? source : config_.optim.front().file;
    throw core::Error("config error: " + file + ": optim: " + e.what());
  }
  // OSFT targets train as factors held beside the model (engine/osft_reparam.h), row-sharded
  // like the plan splits them; they rest whole on every rank, which stage 3 does not provide.
  osft_ = OsftReparam::create_if_targeted(*gpt_, *optim_, &tensors_, &tensors_, &comm::shard_range);
  if (osft_) {
    ENGINE_CHECK(config_.zero.stage <= 2 || !with_train_data,
                 "config error: " + source + ": key 'zero.stage' = 3 is not supported with " +
                     "osft targets (their factors rest whole on every rank); use 1 or 2");
    trainables = osft_->replace_trainables(std::move(trainables));
  }
  std::vector<comm::ParamInfo> infos;
  for (Trainable& t : trainables) {
    t.placement = optim_->placement(t.name);
    infos.push_back({t.name, t.shape, t.placement, t.layer});
  }
  plan_ =
      std::make_unique<comm::ShardingPlan>(infos, W, rank, static_cast<int>(config_.zero.stage));
  ZeroOptions zo;
  zo.training = with_train_data;
  zo.overlap = config_.zero.overlap;
  zo.bucket_bytes = static_cast<int64_t>(config_.zero.bucket_mb * (1 << 20));
  zo.progress_thread = config_.zero.progress == "thread";
  zo.sparse_rows = config_.zero.sparse_rows && tensors_.device().is_cpu();  // a host scan
  zo.release_full_storage = [this] { gpt_->release_storage(); };
  zero_ = ZeroState::create(tensors_, *plan_, std::move(trainables), backend_, zo);
  gpt_->set_layer_hook(
      [this](model::Gpt::LayerEvent event, int layer) { on_layer_event(event, layer); });

  if (with_train_data) {
    data::LoaderOptions lo;
    lo.pattern = config_.data.train;
    lo.seq_len = T;
    lo.batch_rows = batch_rows;
    lo.grad_accum = grad_accum_;
    lo.rank = rank;
    lo.world = W;
    lo.seed = static_cast<uint64_t>(config_.train.seed);
    lo.shuffle = config_.data.shuffle;
    lo.vocab_size = config_.model.vocab_size;
    loader_ = std::make_unique<data::DataLoader>(lo);
    // Fewer sequences than one batch: every step would repeat the same data.
    ENGINE_CHECK(loader_->sequences_per_epoch() >= batch_rows,
                 "config error: " + source + ": key 'data.train' = " + config_.data.train +
                     " holds " + std::to_string(loader_->sequences_per_epoch()) + " sequences of " +
                     std::to_string(T) + " tokens, fewer than one batch of " +
                     std::to_string(batch_rows) +
                     " (train.batch_tokens = " + std::to_string(config_.train.batch_tokens) + ")");
  }
  if (with_val_data) {
    data::ValOptions vo;
    vo.pattern = config_.data.val;
    vo.seq_len = T;
    vo.batch_rows = val_rows_ * W;
    vo.val_tokens = val_seqs * T;
    vo.rank = rank;
    vo.world = W;
    vo.vocab_size = config_.model.vocab_size;
    val_loader_ = std::make_unique<data::ValLoader>(vo);
  }

  if (!config_.optim.empty() && config_.optim.front().node["lr"])
    base_lr_ = config_.optim.front().node["lr"].as<double>();
  // 6 flops per weight per token (forward + backward) for every weight used in a matmul, plus
  // attention (llm.c's 6 * layers * d_model * seq_len). Embedding lookups are no matmul, unless
  // the embedding is also the (tied) head.
  int64_t matmul_weights = 0;
  for (const auto& p : table.params())
    if (p.kind != model::ParamKind::Embedding) matmul_weights += p.numel;
  if (!table.find("lm_head.weight")) matmul_weights += table.at("embed.weight").numel;
  flops_per_token_ = 6.0 * static_cast<double>(matmul_weights) +
                     6.0 * static_cast<double>(config_.model.n_layer * config_.model.d_model * T);
}

Trainer::~Trainer() = default;

void Trainer::backward(bool last) {
  zero_->begin_backward(last);
  gpt_->backward();
  zero_->end_backward();
}

void Trainer::on_layer_event(model::Gpt::LayerEvent event, int layer) {
  using Event = model::Gpt::LayerEvent;
  switch (event) {
    case Event::kBeforeForward:
      zero_->before_forward(layer);
      break;
    case Event::kBeforeBackward:
      zero_->before_backward(layer);
      break;
    case Event::kAfterBackward:
      // dL/dW -> the layer's trained OSFT factors, before the ZeRO state may start reducing
      // them (with zero.overlap, right after this layer's backward).
      if (osft_) osft_->map_grads(layer);
      zero_->after_backward(layer);
      break;
  }
}

StepRecord Trainer::train_step() {
  const auto t0 = Clock::now();
  const comm::CommStats before = tensors_.stats();
  const int64_t T = config_.model.seq_len;

  std::vector<std::pair<std::string, double>> phases;
  auto t_phase = Clock::now();
  // log.device_timing: a mark in the device's order of work at each phase boundary.
  std::vector<core::TimeMark> marks;
  if (config_.log.device_timing) marks.push_back(backend_.mark());
  auto end_phase = [&](const char* name) {
    phases.emplace_back(name, ms_since(t_phase));
    t_phase = Clock::now();
    if (config_.log.device_timing) marks.push_back(backend_.mark());
  };

  // Forward and backward over the micro-batches; the gradient of the mean loss over the global
  // batch is the mean over micro-steps and ranks (the sums of finish_grads, scaled below).
  backend_.allocator().reset_peak();
  zero_->begin_step();
  data::Batch batch;
  for (int64_t m = 0; m < grad_accum_; ++m) {
    loader_->load(step_, m, batch);
    gpt_->forward_accumulate(batch.inputs.data(), batch.targets.data(),
                             static_cast<int>(batch.rows), static_cast<int>(T));
    backward(m == grad_accum_ - 1);
  }
  // The micro-steps' losses were summed on the device; this is the step's one read of them.
  double loss = gpt_->take_loss_sum() / static_cast<double>(grad_accum_);
  comm_.all_reduce(&loss, 1, comm::ReduceOp::Sum);
  loss /= comm_.size();
  end_phase("forward_backward");

  zero_->finish_grads();
  end_phase("reduce_grads");

  // The reduced gradients are sums over ranks and micro-steps; one pass scales them to the mean
  // and clips them together.
  const double mean = 1.0 / static_cast<double>(grad_accum_ * comm_.size());
  const double grad_norm = zero_->grad_norm() * mean;
  health_.check(step_ + 1, loss, grad_norm);
  float clip = 1.0f;
  if (config_.train.grad_clip > 0 && grad_norm > config_.train.grad_clip)
    clip = static_cast<float>(config_.train.grad_clip / (grad_norm + 1e-6));
  zero_->scale_grads(static_cast<float>(mean * clip));
  end_phase("clip");

  // Optimizer step on the local parts, then the parameters back where the model reads them.
  const double lr_scale = schedule_.multiplier(step_);
  optim::StepContext ctx;
  ctx.step = step_ + 1;
  ctx.total_steps = config_.train.steps;
  ctx.lr_scale = lr_scale;
  ctx.backend = &backend_;
  ctx.comm = &tensors_;
  optim_->step(zero_->optimizer_shards(), ctx);
  end_phase("optimizer");
  zero_->publish_params();
  if (osft_) osft_->write_all();  // the dense weights the model reads, from the new factors
  gpt_->params_updated();         // bf16: the matmul weights' copies follow the new values
  end_phase("gather_params");

  ++step_;
  const double step_ms = ms_since(t0);
  train_time_ms_ += step_ms;
  tokens_ += config_.train.batch_tokens;

  StepRecord r;
  r.step = step_;
  r.train_loss = loss;
  r.lr = base_lr_ * lr_scale;
  r.grad_norm = grad_norm;
  r.tokens = tokens_;
  r.train_time_ms = train_time_ms_;
  r.step_ms = step_ms;
  r.tokens_per_s = static_cast<double>(config_.train.batch_tokens) / (step_ms / 1000.0);
  r.gflops = flops_per_token_ * r.tokens_per_s / 1e9;
  const comm::CommStats& after = tensors_.stats();
  for (int k = 0; k < comm::kNumCollectives; ++k) {
    auto kind = static_cast<comm::Collective>(k);
    int64_t bytes = after[kind].bytes - before[kind].bytes;
    if (kind != comm::Collective::Barrier)
      r.comm_bytes.emplace_back(comm::collective_name(kind), bytes);
  }
  r.comm_wait_ms = after.wait_ms() - before.wait_ms();
  for (size_t i = 0; i + 1 < marks.size(); ++i)
    r.device_phase_ms.emplace_back(phases[i].first, backend_.elapsed_ms(marks[i], marks[i + 1]));
  r.phase_ms = std::move(phases);
  r.peak_mem_bytes = static_cast<int64_t>(backend_.allocator().peak_bytes());
  r.live_mem_bytes = static_cast<int64_t>(backend_.allocator().live_bytes());
  return r;
}

double Trainer::evaluate() {
  ENGINE_CHECK(val_loader_ != nullptr, "evaluate: no validation data was configured");
  data::Batch batch;
  double sum = 0;
  for (int64_t s = 0; s < val_loader_->num_steps(); ++s) {
    val_loader_->load(s, batch);
    sum += gpt_->eval_loss(batch.inputs.data(), batch.targets.data(), static_cast<int>(batch.rows),
                           static_cast<int>(config_.model.seq_len));
    zero_->end_forward();  // no backward events release what the forward gathered
  }
  // Every rank and step averages the same number of tokens: the mean of means is the mean.
  comm_.all_reduce(&sum, 1, comm::ReduceOp::Sum);
  return sum / static_cast<double>(val_loader_->num_steps() * comm_.size());
}

std::string Trainer::save_checkpoint() {
  const std::string& root = config_.checkpoint.dir;
  const int rank = comm_.rank();
  if (rank == 0) prepare_staging(root, step_);
  comm_.barrier();

  RankState state = sharded_rank_state(*plan_, zero_->local_values(), *optim_);
  if (osft_) osft_->save_frozen(state.slices, rank);
  stage_to_host(state, backend_);
  write_rank_file(staging_path(root, step_), rank, state.slices, state.counters);
  comm_.barrier();

  std::string dir;
  if (rank == 0) {
    Manifest m;
    m.step = step_;
    m.world_size = comm_.size();
    m.config_yaml = config_to_yaml(config_);
    m.state["data.seed"] = std::to_string(config_.train.seed);
    m.state["data.step"] = std::to_string(step_);
    m.state["train.tokens"] = std::to_string(tokens_);
    m.state["train.time_ms"] = double_text(train_time_ms_);
    if (loader_) record_data_state(m, *loader_);
    dir = commit_checkpoint(root, m, static_cast<int>(config_.checkpoint.keep));
  }
  comm_.barrier();
  return dir.empty() ? (fs::path(root) / checkpoint_dir_name(step_)).string() : dir;
}

void Trainer::load_checkpoint(const std::string& dir, bool params_only) {
  CheckpointReader reader(dir);
  const Manifest& m = reader.manifest();
  if (!params_only) {
    std::vector<std::string> names;
    for (size_t i = 0; i < plan_->num_params(); ++i)
      names.push_back(plan_->param(i).name);
    check_same_optimizers(dir, m, config_, names);
    if (loader_) check_same_data(dir, m, *loader_);
  }
  read_local_params(reader, *plan_, zero_->local_values(), backend_);
  zero_->publish_params();
  if (osft_) {
    osft_->load_frozen(reader);
    osft_->write_all();
  }
  if (params_only) return;
  optim_->load_state(
      read_optimizer_state(reader, *plan_, zero_->local_values(), *optim_, backend_));

  ENGINE_CHECK(std::stoll(state_value(m, "data.seed", dir)) == config_.train.seed,
               "checkpoint " + dir + " was trained with train.seed " +
                   state_value(m, "data.seed", dir) + ", this run has " +
                   std::to_string(config_.train.seed) + ": the data order would differ");
  step_ = std::stoll(state_value(m, "data.step", dir));
  tokens_ = std::stoll(state_value(m, "train.tokens", dir));
  train_time_ms_ = std::stod(state_value(m, "train.time_ms", dir));
}

void Trainer::init_params_from(const std::string& source) {
  const bool checkpoint = fs::exists(fs::path(source) / "manifest.yaml");
  if (checkpoint && !osft_) {
    load_checkpoint(source, /*params_only=*/true);
    return;
  }
  std::map<std::string, core::Tensor> weights;
  if (checkpoint) {  // OSFT reads the dense weights whole, then decomposes them
    weights = dense_checkpoint_weights(source, gpt_->table());
  } else if (model::is_hf_gpt2_dir(source)) {
    weights = model::read_hf_gpt2(source, model_config_of(config_));
  } else {
    ENGINE_CHECK(fs::is_regular_file(source),
                 "train.init_from: '" + source +
                     "' is neither a checkpoint folder (manifest.yaml), a Hugging Face GPT-2 "
                     "folder (config.json, model.safetensors) nor a safetensors file");
    weights = model::read_weights(source, gpt_->table());
  }
  // Every rank holds the whole weights: it keeps its local parts, then publishes them as a
  // checkpoint load does.
  for (size_t i = 0; i < plan_->num_params(); ++i) {
    const core::Tensor& local = zero_->local_value(i);
    if (local.defined() && !(osft_ && osft_->is_factor(plan_->param(i).name)))
      comm::copy_local_part(tensors_, *plan_, i,
                            like_device(backend_, weights.at(plan_->param(i).name), local), local);
  }
  zero_->publish_params();
  if (osft_) {  // the targets' pretrained weights into the model, then their fresh SVDs
    for (const OsftReparam::Target& t : osft_->targets()) {
      const core::Tensor& w = weights.at(t.name);
      backend_.copy_from_host(gpt_->param(t.param).raw_data(), w.raw_data(), w.nbytes());
    }
    osft_->redecompose(&comm_);
  }
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
  const model::ModelConfig mc = model_config_of(config_);
  spdlog::info(
      "engine: config {} | world size {} | threads per rank {} | backend {} | tensors over {}",
      config_.source.empty() ? "(built in code)" : config_.source, comm_.size(),
      omp_get_max_threads(), gpt_->backend().name(), tensors_.name());
  log_rank_devices(comm_, backend_);
  spdlog::info("model: {} {} layers, d_model {}, {} heads, seq_len {}, vocab {} (padded {}){}",
               model::arch_name(mc.arch), mc.n_layer, mc.d_model, mc.n_head, mc.seq_len,
               mc.vocab_size, mc.padded_vocab(),
               mc.moe() ? ", MoE " + std::to_string(mc.moe_experts) + " experts" : "");
  spdlog::info("parameters: {} ({:.2f} M) | ZeRO stage {} | optimizer state elements on rank 0: {}",
               gpt_->table().total_numel(), gpt_->table().total_numel() / 1e6, plan_->stage(),
               plan_->state_numel(0));
  spdlog::info("{}", zero_->describe());
  spdlog::info("batch: {} tokens per step = {} ranks x {} micro-steps x {} rows x {} tokens",
               config_.train.batch_tokens, comm_.size(), grad_accum_, micro_rows_,
               config_.model.seq_len);
  for (size_t g = 0; g < optim_->num_groups(); ++g)
    spdlog::info("optim group {}: {} for {} parameters", g, optim_->optimizer(g).kind(),
                 optim_->group_params(g).size());
  spdlog::info("effective config:\n{}", config_to_yaml(config_));
}

void Trainer::warm_up() {
  if (config_.train.warmup_steps <= 0 || loader_ == nullptr) return;
  data::Batch batch;
  loader_->load(step_, 0, batch);
  for (int64_t i = 0; i < config_.train.warmup_steps; ++i) {
    gpt_->forward(batch.inputs.data(), batch.targets.data(), static_cast<int>(batch.rows),
                  static_cast<int>(config_.model.seq_len));
    backward(false);
  }
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
    check_steps_left(resume, step_, config_);
    spdlog::info("resumed from {} at step {}", resume, step_);
  } else if (!config_.train.init_from.empty()) {
    init_params_from(config_.train.init_from);
    spdlog::info("initialised the weights from {}", config_.train.init_from);
  }
  print_banner();
  const int64_t total = config_.train.steps;
  // All ranks' peak, for the console's mfu.
  std::optional<double> peak_gflops = config_.log.peak_gflops > 0
                                          ? std::optional<double>(config_.log.peak_gflops)
                                          : gpu_peak_gflops(gpt_->backend().name());
  if (peak_gflops) *peak_gflops *= comm_.size();
  std::unique_ptr<MetricsWriter> metrics;
  if (comm_.rank() == 0) {
    fs::create_directories(config_.log.dir);
    std::ofstream(fs::path(config_.log.dir) / "config.yaml") << config_to_yaml(config_);
    if (config_.log.metrics)
      metrics = std::make_unique<MetricsWriter>(
          (fs::path(config_.log.dir) / "metrics.jsonl").string(), resume.empty() ? -1 : step_);
  }
  started_ = true;
  warm_up();

  auto eval_and_log = [&](StepRecord& r) {
    const double val = evaluate();
    r.val_loss = val;
    summary.final_val_loss = val;
    spdlog::info("{}", format_val_line(step_, total, val, train_time_ms_));
    return val;
  };

  const int64_t eval_every = config_.train.eval_every;
  if (step_ == 0 && eval_every > 0 && val_loader_) {
    StepRecord r;
    r.step = 0;
    eval_and_log(r);
    if (metrics) metrics->write(r);
  }
  bool stop = false;
  while (step_ < total && !stop) {
    StepRecord r = train_step();
    if (step_ % config_.log.every == 0 || step_ == total) {
      const double eta_s = (train_time_ms_ / step_) * static_cast<double>(total - step_) / 1e3;
      spdlog::info(
          "{} {}",
          format_train_line(step_, total, *r.train_loss, train_time_ms_, r.lr, r.tokens_per_s),
          format_progress_fields(
              eta_s, peak_gflops ? std::optional<double>(r.gflops / *peak_gflops) : std::nullopt));
      spdlog::info(
          "{}", format_stats_line(step_, total, r.grad_norm, r.peak_mem_bytes, r.live_mem_bytes));
    }
    const bool last = step_ == total;
    if (val_loader_ && (last || (eval_every > 0 && step_ % eval_every == 0))) {
      const double val = eval_and_log(r);
      if (config_.train.target_val_loss > 0 && val <= config_.train.target_val_loss) {
        summary.target_step = step_;
        summary.target_time_ms = train_time_ms_;
        spdlog::info("reached target val_loss {:.4f} <= {} at step {}: train_time {:.0f} ms", val,
                     config_.train.target_val_loss, step_, train_time_ms_);
        stop = true;
      }
    }
    if (metrics) metrics->write(r);
    const bool periodic = config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0;
    bool saved = periodic || ((last || stop) && config_.checkpoint.at_end);
    // A step whose gradient norm is exactly 0 may be a dead model the health check will stop
    // in a step or two: it is not saved, so rotation cannot drop good checkpoints for it.
    if (saved && health_.suspect()) {
      spdlog::warn("step {}: checkpoint skipped: the gradient norm is exactly 0", step_);
      saved = false;
    }
    if (saved) {
      summary.last_checkpoint = save_checkpoint();
      spdlog::info("checkpoint saved: {}", summary.last_checkpoint);
    }
    if (const int signal = agreed_stop_signal(comm_)) {
      if (config_.checkpoint.on_signal && !saved) {
        summary.last_checkpoint = save_checkpoint();
        spdlog::info("checkpoint saved: {}", summary.last_checkpoint);
      }
      throw StoppedBySignal(signal, step_);
    }
  }
  summary.steps_done = step_;
  summary.train_time_ms = train_time_ms_;
  spdlog::info("done: {} steps, train_time {:.0f} ms ({:.2f} ms/step){}{}", step_, train_time_ms_,
               train_time_ms_ / std::max<int64_t>(step_, 1),
               summary.final_val_loss
                   ? fmt::format(", final val_loss {:.4f}", *summary.final_val_loss)
                   : std::string(),
               summary.target_time_ms ? fmt::format(", target reached at step {} after {:.0f} ms",
                                                    *summary.target_step, *summary.target_time_ms)
                                      : std::string());
  return summary;
}

}  // namespace engine
