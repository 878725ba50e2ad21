#include "engine/zero_state.h"

#include <cmath>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "comm/comm_stream.h"
#include "comm/composite_work.h"
#include "comm/layer_gatherer.h"
#include "comm/mpi_session.h"
#include "comm/shard_ops.h"
#include "core/check.h"

namespace engine {

namespace {

void wait_all(std::vector<std::unique_ptr<comm::Work>>& works) {
  for (auto& w : works)
    w->wait();
  works.clear();
}

// "<what> <layer>", a line of ZeroOptions::trace.
std::string trace_line(const char* what, int layer) {
  std::string line = what;
  line += ' ';
  line += std::to_string(layer);
  return line;
}

// Stages 1-2: the full values and gradients stay resident.
class ResidentParams final : public ZeroState {
 public:
  ResidentParams(comm::Communicator& comm, const comm::ShardingPlan& plan,
                 std::vector<Trainable> trainables, core::Backend& backend,
                 const ZeroOptions& options)
      : ZeroState(comm, plan, std::move(trainables), backend),
        overlap_(options.overlap),
        sparse_rows_(options.sparse_rows),
        trace_(options.trace) {
    for (size_t i = 0; i < trainables_.size(); ++i) {
      full_grad_.push_back(trainables_[i].grad);
      if (plan_.local_numel(i) == 0) continue;
      const comm::Placement& pl = plan_.placement(i);
      const core::Tensor& full = trainables_[i].value;
      if (!pl.is_shard()) {
        local_value_[i] = full;
      } else if (pl.dim == 0) {
        const comm::Range r = plan_.local_slice(i).range;
        local_value_[i] = full.slice(0, r.begin, r.size());
      } else {  // not a contiguous block of the full tensor: an own copy
        local_value_[i] = local_tensor(i, false);
        comm::copy_local_part(comm_, plan_, i, full, local_value_[i]);
      }
      // Own buffers: a reduce-scatter must not read and write one buffer.
      local_grad_[i] = local_tensor(i, true);
    }
    make_buckets(options.bucket_bytes);
    start_stream(options);
  }

  ~ResidentParams() override {
    try {
      wait_pending();
    } catch (const std::exception&) {
      // A destructor cannot report; the failure already surfaced.
    }
  }

  void begin_step() override {
    wait_pending();  // after a backward without finish_grads (warm-up)
    for (const Trainable& t : trainables_)
      backend_.fill_zero(t.grad.raw_data(), t.grad.nbytes());
  }
  void begin_backward(bool last) override { last_micro_ = last; }
  void end_backward() override { last_micro_ = false; }
  void before_forward(int) override { poll_pending(); }
  void before_backward(int) override { poll_pending(); }

  void after_backward(int layer) override {
    if (overlap_ && last_micro_)
      for (size_t b : layer_buckets_.at(layer))
        launch(b);
    poll_pending();
  }

  void finish_grads() override {
    // Layers in the order their backward finishes, as with overlap.
    for (auto it = layer_buckets_.rbegin(); it != layer_buckets_.rend(); ++it)
      for (size_t b : it->second)
        if (!launched_[b]) launch(b);
    wait_pending();
    launched_.assign(buckets_.size(), false);
  }

  void publish_params() override {
    auto gather_all = [this](comm::Communicator& c) {
      std::vector<std::unique_ptr<comm::Work>> works;
      for (size_t i = 0; i < trainables_.size(); ++i)
        works.push_back(
            comm::all_gather_param_async(c, plan_, i, local_value_[i], trainables_[i].value));
      wait_all(works);
    };
    submit("gather params", core::kNoIndex, gather_all);
    wait_pending();
  }

  void end_forward() override {}

  std::string describe() const override {
    return "ZeRO stage " + std::to_string(plan_.stage()) +
           ": full parameters and gradients resident on every rank; " +
           std::to_string(buckets_.size()) + " gradient buckets, overlap " +
           (overlap_ ? "on" : "off") + ", progress " + (has_stream() ? "thread" : "poll");
  }

 private:
  // Each layer's trainables in table order, cut into buckets of at most `bytes` (a larger
  // tensor alone).
  void make_buckets(int64_t bytes) {
    for (int layer : plan_.layers()) {
      std::vector<size_t> bucket;
      int64_t size = 0;
      for (size_t i : plan_.layer_params(layer)) {
        const int64_t b = plan_.numel(i) * static_cast<int64_t>(sizeof(float));
        if (!bucket.empty() && (size + b > bytes || is_sparse(i) || is_sparse(bucket.back()))) {
          layer_buckets_[layer].push_back(buckets_.size());
          buckets_.push_back(std::move(bucket));
          bucket.clear();
          size = 0;
        }
        bucket.push_back(i);
        size += b;
      }
      if (!bucket.empty()) {
        layer_buckets_[layer].push_back(buckets_.size());
        buckets_.push_back(std::move(bucket));
      }
    }
    launched_.assign(buckets_.size(), false);
  }

  // A sparse-rows trainable whose parts are blocks of rows: its own bucket, reduced by rows.
  bool is_sparse(size_t i) const {
    return sparse_rows_ && trainables_[i].sparse_rows && plan_.local_slice(i).dim == 0 &&
           !trainables_[i].shape.empty();
  }

  // Reduces bucket b on communicator c; blocking for a sparse bucket, else started.
  std::unique_ptr<comm::Work> reduce_bucket(comm::Communicator& c, size_t b) {
    const std::vector<size_t>& bucket = buckets_[b];
    if (bucket.size() == 1 && is_sparse(bucket[0])) {
      const size_t i = bucket[0];
      comm::reduce_sparse_rows(c, plan_, i, full_grad_[i], local_grad_[i], comm::ReduceOp::Sum);
      return std::make_unique<comm::DoneWork>();
    }
    return comm::reduce_grads_async(c, plan_, bucket, full_grad_, local_grad_, comm::ReduceOp::Sum);
  }

  void launch(size_t b) {
    launched_[b] = true;
    const int layer = plan_.param(buckets_[b].front()).layer;
    if (trace_) trace_(trace_line("reduce", layer));
    if (!has_stream()) {
      add_pending(reduce_bucket(comm_, b));
      return;
    }
    submit("reduce layer", layer, [this, b, layer](comm::Communicator& c) {
      if (trace_) trace_(trace_line("running", layer));
      reduce_bucket(c, b)->wait();
      if (trace_) trace_(trace_line("reduced", layer));
    });
  }

  bool overlap_;
  bool sparse_rows_;
  std::function<void(const std::string&)> trace_;
  std::vector<core::Tensor> full_grad_;               // the trainables' full gradients
  std::vector<std::vector<size_t>> buckets_;          // trainable indices
  std::map<int, std::vector<size_t>> layer_buckets_;  // layer -> bucket indices
  std::vector<bool> launched_;
  bool last_micro_ = false;
};

// Stage 3: values rest as local parts, layers are gathered while in use.
class ShardedParams final : public ZeroState {
 public:
  ShardedParams(comm::Communicator& comm, const comm::ShardingPlan& plan,
                std::vector<Trainable> trainables, core::Backend& backend,
                const ZeroOptions& options)
      : ZeroState(comm, plan, std::move(trainables), backend),
        gatherer_(comm, plan, backend.allocator()),
        last_layer_(plan.layers().back()),
        overlap_(options.overlap) {
    for (size_t i = 0; i < trainables_.size(); ++i) {
      if (plan_.local_numel(i) > 0) {
        local_value_[i] = local_tensor(i, false);
        comm::copy_local_part(comm_, plan_, i, trainables_[i].value, local_value_[i]);
        local_grad_[i] = local_tensor(i, true);
      }
      gatherer_.set_local(i, local_value_[i]);
    }
    for (Trainable& t : trainables_) {
      t.value = core::Tensor();
      t.grad = core::Tensor();
    }
    if (options.release_full_storage) options.release_full_storage();
    start_stream(options);
  }

  ~ShardedParams() override {
    try {
      wait_pending();
    } catch (const std::exception&) {
      // A destructor cannot report; the failure already surfaced.
    }
  }

  void begin_step() override {
    wait_pending();  // after a backward without finish_grads (warm-up)
    for (const core::Tensor& g : local_grad_)
      if (g.defined()) backend_.fill_zero(g.raw_data(), g.nbytes());
    first_micro_ = true;
  }

  // Layer -1's backward (the head) runs before any layer event.
  void begin_backward(bool) override { bind_layer_grads(-1); }
  void end_backward() override { first_micro_ = false; }

  void before_forward(int layer) override {
    // Block l-1 is done once block l starts, except the last block before the head (the next
    // backward starts there); layer -1 stays until the end of backward.
    if (layer >= 1 && layer != last_layer_ && gatherer_.is_gathered(layer - 1))
      release_layer(layer - 1);
    if (!gatherer_.is_gathered(layer)) gather_layer(layer);
  }

  void before_backward(int layer) override {
    if (!gatherer_.is_gathered(layer)) gather_layer(layer);  // the last block still is
    bind_layer_grads(layer);
  }

  // The layer's values are freed now; its full gradients go to the reduction, which frees them
  // when done (on the communication thread, while the layers below compute).
  void after_backward(int layer) override {
    std::vector<size_t> params = plan_.layer_params(layer);
    std::vector<core::Tensor> fulls;
    for (size_t i : params)
      fulls.push_back(full_grad_.at(i));
    release_layer(layer);
    // At most one layer's reduction in flight: its gradient buffers are all the memory overlap
    // adds.
    wait_pending();
    submit("reduce layer", layer,
           [this, params = std::move(params), fulls = std::move(fulls), first = first_micro_](
               comm::Communicator& c) { reduce_into_local(c, params, fulls, first); });
    if (!overlap_) wait_pending();  // the same operations, one at a time
    poll_pending();
  }

  void finish_grads() override {
    wait_pending();
    for (int layer : plan_.layers())
      ENGINE_CHECK(!gatherer_.is_gathered(layer),
                   "stage 3: layer " + std::to_string(layer) + " is still gathered after backward");
  }

  void publish_params() override {}  // each layer is gathered when it is next used

  void end_forward() override {
    for (int layer : plan_.layers())
      if (gatherer_.is_gathered(layer)) release_layer(layer);
  }

  std::string describe() const override {
    int64_t resting = 0;
    for (const core::Tensor& t : local_value_)
      if (t.defined()) resting += t.numel();
    return "ZeRO stage 3: resting parameter elements on this rank: " + std::to_string(resting) +
           "; gradient reductions " + (has_stream() ? "on a communication thread" : "in place");
  }

 private:
  void gather_layer(int layer) {
    gatherer_.gather(layer);
    for (size_t i : plan_.layer_params(layer))
      trainables_[i].bind_value(gatherer_.full(i));
  }

  void release_layer(int layer) {
    for (size_t i : plan_.layer_params(layer)) {
      trainables_[i].bind_value(core::Tensor());
      trainables_[i].bind_grad(core::Tensor());
      full_grad_.erase(i);
    }
    gatherer_.release(layer);
  }

  void bind_layer_grads(int layer) {
    for (size_t i : plan_.layer_params(layer)) {
      core::Tensor g =
          core::Tensor::empty(plan_.param(i).shape, core::DType::F32, backend_.allocator());
      backend_.fill_zero(g.raw_data(), g.nbytes());
      trainables_[i].bind_grad(g);
      full_grad_[i] = std::move(g);
    }
  }

  // The first micro-step reduces straight into the local parts, later ones add to them (in
  // order: the reductions of one layer run one after the other).
  void reduce_into_local(comm::Communicator& c, const std::vector<size_t>& params,
                         const std::vector<core::Tensor>& fulls, bool first) {
    std::vector<std::unique_ptr<comm::Work>> works;
    std::vector<std::pair<size_t, core::Tensor>> partial;
    for (size_t k = 0; k < params.size(); ++k) {
      const size_t i = params[k];
      core::Tensor target = local_grad_[i];
      if (!first && target.defined()) {
        target = local_tensor(i, false);
        partial.emplace_back(i, target);
      }
      works.push_back(comm::reduce_grad_async(c, plan_, i, fulls[k], target, comm::ReduceOp::Sum));
    }
    wait_all(works);
    for (const auto& [i, t] : partial)
      backend_.add(local_grad_[i].data<float>(), local_grad_[i].data<float>(), t.data<float>(),
                   t.numel());
  }

  comm::LayerGatherer gatherer_;
  int last_layer_;  // the head, whose forward follows the last block
  bool overlap_;
  std::map<size_t, core::Tensor> full_grad_;  // the bound full gradients of gathered layers
  bool first_micro_ = true;                   // the next reduction overwrites local_grad_
};

}  // namespace

ZeroState::ZeroState(comm::Communicator& comm, const comm::ShardingPlan& plan,
                     std::vector<Trainable> trainables, core::Backend& backend)
    : comm_(comm),
      plan_(plan),
      trainables_(std::move(trainables)),
      backend_(backend),
      local_value_(trainables_.size()),
      local_grad_(trainables_.size()) {
  ENGINE_CHECK(plan_.num_params() == trainables_.size(),
               "ZeRO state: the sharding plan has " + std::to_string(plan_.num_params()) +
                   " entries for " + std::to_string(trainables_.size()) + " trainables");
  for (size_t i = 0; i < trainables_.size(); ++i)
    ENGINE_CHECK(plan_.param(i).name == trainables_[i].name,
                 "ZeRO state: sharding plan entry " + std::to_string(i) + " is " +
                     plan_.param(i).name + ", the trainable " + trainables_[i].name);
}

ZeroState::~ZeroState() = default;

core::Tensor ZeroState::local_tensor(size_t i, bool zeroed) const {
  core::Tensor t =
      core::Tensor::empty(plan_.local_shape(i), core::DType::F32, backend_.allocator());
  if (zeroed && t.nbytes() > 0) backend_.fill_zero(t.raw_data(), t.nbytes());
  return t;
}

void ZeroState::start_stream(const ZeroOptions& options) {
  tracer_ = options.tracer;
  if (!options.progress_thread || comm_.size() == 1) return;
  ENGINE_CHECK(comm::mpi_thread_multiple(),
               "zero.progress = thread needs MPI_THREAD_MULTIPLE, which this MPI does not "
               "provide on rank " +
                   std::to_string(comm_.rank()) + " (use zero.progress = poll)");
  stream_comm_ = comm_.split(0, comm_.rank());
  stream_comm_->set_blocking_async(true);
  stream_ = std::make_unique<comm::CommStream>();
  if (tracer_) stream_->submit([tracer = tracer_] { tracer->name_thread("comm thread"); })->wait();
}

void ZeroState::submit(const char* what, int layer, std::function<void(comm::Communicator&)> op) {
  if (!stream_) {
    core::TraceScope span(tracer_, "comm", what, layer);
    op(comm_);
    return;
  }
  // Traced, the operation is also a span from its issue here to its completion on the thread,
  // on this thread's in-flight track (queued behind others, then run).
  const bool traced = tracer_ != nullptr && tracer_->active();
  const int in_flight = traced ? tracer_->in_flight_track() : 0;
  const double issued = traced ? core::Tracer::now_us() : 0;
  pending_.push_back(stream_->submit(
      [this, what, layer, op = std::move(op), traced, in_flight, issued] {
        {
          core::TraceScope span(traced ? tracer_ : nullptr, "comm", what, layer);
          op(*stream_comm_);
        }
        if (traced) tracer_->record(what, layer, "comm", in_flight, issued, core::Tracer::now_us());
      },
      &comm_.stats()));
}

void ZeroState::poll_pending() {
  if (stream_) return;
  for (auto& w : pending_)
    w->test();
}

void ZeroState::wait_pending() {
  {
    core::TraceScope span(pending_.empty() ? nullptr : tracer_, "wait", "wait for collectives");
    wait_all(pending_);
  }
  if (!stream_comm_) return;
  comm_.stats().add_counts(stream_comm_->stats());
  stream_comm_->stats().reset();
}

std::unique_ptr<ZeroState> ZeroState::create(comm::Communicator& comm,
                                             const comm::ShardingPlan& plan,
                                             std::vector<Trainable> trainables,
                                             core::Backend& backend, const ZeroOptions& options) {
  if (plan.stage() == 3)
    return std::make_unique<ShardedParams>(comm, plan, std::move(trainables), backend, options);
  return std::make_unique<ResidentParams>(comm, plan, std::move(trainables), backend, options);
}

void ZeroState::grad_sum_squares(double* out) {
  // Replicate parts are whole on every rank: rank 0 counts them. One backend call over all the
  // local parts.
  std::vector<std::span<const float>> parts;
  for (size_t i = 0; i < local_grad_.size(); ++i) {
    const core::Tensor& g = local_grad_[i];
    if (!g.defined() || (plan_.placement(i).is_replicate() && comm_.rank() != 0)) continue;
    parts.emplace_back(g.data<float>(), static_cast<size_t>(g.numel()));
  }
  backend_.sum_squares_many(parts, out);
}

void ZeroState::scale_grads(const float* factor,
                            const std::function<bool(const std::string&)>& scaled_by_optimizer) {
  std::vector<std::span<float>> grads;  // one backend call: one launch on a device
  for (size_t i = 0; i < local_grad_.size(); ++i) {
    const core::Tensor& g = local_grad_[i];
    if (g.defined() && !scaled_by_optimizer(trainables_[i].name))
      grads.emplace_back(g.data<float>(), static_cast<size_t>(g.numel()));
  }
  backend_.scale_many_by(grads, factor);
}

std::vector<optim::ParamShard> ZeroState::optimizer_shards() const {
  std::vector<optim::ParamShard> shards;
  for (size_t i = 0; i < trainables_.size(); ++i) {
    if (!local_value_[i].defined()) continue;
    const comm::ShardingPlan::LocalSlice s = plan_.local_slice(i);
    shards.push_back({trainables_[i].name, trainables_[i].shape, s.range.begin, local_value_[i],
                      local_grad_[i], s.dim});
  }
  return shards;
}

}  // namespace engine
