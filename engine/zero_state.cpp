#include "engine/zero_state.h"

#include <cmath>
#include <map>
#include <utility>

#include "comm/layer_gatherer.h"
#include "comm/shard_ops.h"
#include "engine/core/check.h"

namespace engine {

namespace {

void wait_all(std::vector<std::unique_ptr<comm::Work>>& works) {
  for (auto& w : works)
    w->wait();
  works.clear();
}

// Stages 1-2, and every stage without training: the full values and gradients stay resident.
class ResidentParams final : public ZeroState {
 public:
  ResidentParams(comm::Communicator& comm, const comm::ShardingPlan& plan,
                 std::vector<Trainable> trainables, core::Backend& backend)
      : ZeroState(comm, plan, std::move(trainables), backend) {
    for (size_t i = 0; i < trainables_.size(); ++i) {
      if (plan_.local_numel(i) == 0) continue;
      const comm::Placement& pl = plan_.placement(i);
      const core::Tensor& full = trainables_[i].value;
      if (!pl.is_shard()) {
        local_value_[i] = full;
      } else if (pl.dim == 0) {
        const comm::Range r = plan_.local_slice(i).range;
        local_value_[i] = full.slice(0, r.begin, r.size());
      } else {  // not a contiguous block of the full tensor: an own copy
        local_value_[i] = core::Tensor::empty(plan_.local_shape(i));
        comm::copy_local_part(comm_, plan_, i, full, local_value_[i]);
      }
      // Own buffers: a reduce-scatter must not read and write one buffer.
      local_grad_[i] = core::Tensor::zeros(plan_.local_shape(i));
    }
  }

  void begin_step() override {
    for (const Trainable& t : trainables_)
      backend_.fill_zero(t.grad.raw_data(), t.grad.nbytes());
  }
  void begin_backward(bool) override {}
  void end_backward() override {}
  void before_forward(int) override {}
  void before_backward(int) override {}
  void after_backward(int) override {}

  void finish_grads(double scale) override {
    if (scale != 1.0)
      for (const Trainable& t : trainables_)
        backend_.scale(t.grad.data<float>(), static_cast<float>(scale), t.grad.numel());
    // Every reduction in flight at once.
    std::vector<std::unique_ptr<comm::Work>> works;
    for (size_t i = 0; i < trainables_.size(); ++i)
      works.push_back(
          comm::reduce_grad_async(comm_, plan_, i, trainables_[i].grad, local_grad_[i]));
    wait_all(works);
  }

  void publish_params() override {
    std::vector<std::unique_ptr<comm::Work>> works;
    for (size_t i = 0; i < trainables_.size(); ++i)
      works.push_back(
          comm::all_gather_param_async(comm_, plan_, i, local_value_[i], trainables_[i].value));
    wait_all(works);
  }

  void end_forward() override {}

  std::string describe() const override {
    return "ZeRO stage " + std::to_string(plan_.stage()) +
           ": full parameters and gradients resident on every rank";
  }
};

// Stage 3 while training: values rest as local parts, layers are gathered while in use.
class ShardedParams final : public ZeroState {
 public:
  ShardedParams(comm::Communicator& comm, const comm::ShardingPlan& plan,
                std::vector<Trainable> trainables, core::Backend& backend,
                const ZeroOptions& options)
      : ZeroState(comm, plan, std::move(trainables), backend),
        gatherer_(comm, plan, backend.allocator()) {
    for (size_t i = 0; i < trainables_.size(); ++i) {
      if (plan_.local_numel(i) > 0) {
        local_value_[i] = core::Tensor::empty(plan_.local_shape(i));
        comm::copy_local_part(comm_, plan_, i, trainables_[i].value, local_value_[i]);
        local_grad_[i] = core::Tensor::zeros(plan_.local_shape(i));
      }
      gatherer_.set_local(i, local_value_[i]);
    }
    for (Trainable& t : trainables_) {
      t.value = core::Tensor();
      t.grad = core::Tensor();
    }
    if (options.release_full_storage) options.release_full_storage();
  }

  void begin_step() override {
    for (const core::Tensor& g : local_grad_)
      if (g.defined()) backend_.fill_zero(g.raw_data(), g.nbytes());
    first_micro_ = true;
  }

  // Layer -1's backward (the head) runs before any layer event.
  void begin_backward(bool) override { bind_layer_grads(-1); }
  void end_backward() override { first_micro_ = false; }

  void before_forward(int layer) override {
    // Block l-1 is done once block l starts; layer -1 stays until the end of backward.
    if (layer >= 1 && gatherer_.is_gathered(layer - 1)) release_layer(layer - 1);
    if (!gatherer_.is_gathered(layer)) gather_layer(layer);
  }

  void before_backward(int layer) override {
    if (!gatherer_.is_gathered(layer)) gather_layer(layer);  // the last block still is
    bind_layer_grads(layer);
  }

  void after_backward(int layer) override {
    reduce_layer_grads(layer);
    release_layer(layer);
  }

  void finish_grads(double scale) override {
    for (int layer : plan_.layers())
      ENGINE_CHECK(!gatherer_.is_gathered(layer),
                   "stage 3: layer " + std::to_string(layer) + " is still gathered after backward");
    if (scale != 1.0) scale_grads(static_cast<float>(scale));
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
    return "ZeRO stage 3: resting parameter elements on this rank: " + std::to_string(resting);
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
          core::Tensor::zeros(plan_.param(i).shape, core::DType::F32, backend_.allocator());
      trainables_[i].bind_grad(g);
      full_grad_[i] = std::move(g);
    }
  }

  void reduce_layer_grads(int layer) {
    // The first micro-step reduces straight into the local parts, later ones add to them.
    std::vector<std::unique_ptr<comm::Work>> works;
    std::vector<std::pair<size_t, core::Tensor>> partial;
    for (size_t i : plan_.layer_params(layer)) {
      core::Tensor target = local_grad_[i];
      if (!first_micro_ && target.defined()) {
        target = core::Tensor::empty(plan_.local_shape(i));
        partial.emplace_back(i, target);
      }
      works.push_back(comm::reduce_grad_async(comm_, plan_, i, full_grad_.at(i), target));
    }
    wait_all(works);
    for (const auto& [i, t] : partial)
      backend_.add(local_grad_[i].data<float>(), local_grad_[i].data<float>(), t.data<float>(),
                   t.numel());
  }

  comm::LayerGatherer gatherer_;
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

std::unique_ptr<ZeroState> ZeroState::create(comm::Communicator& comm,
                                             const comm::ShardingPlan& plan,
                                             std::vector<Trainable> trainables,
                                             core::Backend& backend, const ZeroOptions& options) {
  if (plan.stage() == 3 && options.training)
    return std::make_unique<ShardedParams>(comm, plan, std::move(trainables), backend, options);
  return std::make_unique<ResidentParams>(comm, plan, std::move(trainables), backend);
}

double ZeroState::grad_norm() {
  // Replicate parts are whole on every rank: rank 0 counts them.
  double sq = 0;
  for (size_t i = 0; i < local_grad_.size(); ++i) {
    const core::Tensor& g = local_grad_[i];
    if (!g.defined() || (plan_.placement(i).is_replicate() && comm_.rank() != 0)) continue;
    sq += backend_.sum_squares(g.data<float>(), g.numel());
  }
  comm_.all_reduce(&sq, 1, comm::ReduceOp::Sum);
  return std::sqrt(sq);
}

void ZeroState::scale_grads(float factor) {
  for (const core::Tensor& g : local_grad_)
    if (g.defined()) backend_.scale(g.data<float>(), factor, g.numel());
}

std::vector<optim::ParamShard> ZeroState::optimizer_shards() const {
  std::vector<optim::ParamShard> shards;
  for (size_t i = 0; i < trainables_.size(); ++i) {
    if (!local_value_[i].defined()) continue;
    shards.push_back({trainables_[i].name, trainables_[i].shape, plan_.local_slice(i).range.begin,
                      local_value_[i], local_grad_[i]});
  }
  return shards;
}

}  // namespace engine
