// ZeroState on 1-4 ranks, driven as the trainer drives it: a small GPT's micro-steps on
// rank-specific batches, the model's layer events forwarded to the state, then finish_grads.
// - The reduced local gradients equal the sum of every rank's gradients computed on one rank
//   (stages 1, 2, 3, with and without overlap).
// - Overlap, bucket sizes, both ways of progress and the sparse-row reduction of the embedding
//   give bit-identical gradients to the sequential path (overlap off) at the same world size;
//   at np <= 2 all of them agree exactly.
// - With a communication thread, the head's reduction starts and completes while the model is
//   still in the backward of layer 0 (the recorded order of events).
#include "engine/zero_state.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/rng.h"
#include "engine/trainable.h"
#include "model/gpt.h"

namespace {

// 64 tokens per rank and step touch at most an eighth of the 512 embedding rows: the sparse-row
// reduction runs (at np <= 2; beyond, the union may pass a quarter and fall back to dense).
constexpr int kLayers = 2, kVocab = 512, kRows = 2, kSeq = 8;

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.arch = model::Arch::Modern;
  c.n_layer = kLayers;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = kSeq;
  c.vocab_size = kVocab;
  c.seed = 7;
  return c;
}

std::vector<int32_t> tokens(int rank, int micro, int which) {
  core::Rng rng(1000 * rank + 10 * micro + which);
  std::vector<int32_t> t(kRows * kSeq);
  for (auto& x : t)
    x = static_cast<int32_t>(rng.next_below(kVocab));
  return t;
}

// Matrices Owned by one rank (the Muon way), everything else Shard(0) (the AdamW way).
comm::Placement placement_of(const engine::Trainable& t) {
  return t.shape.size() == 2 && t.name.rfind("blocks.", 0) == 0 ? comm::Placement::owned()
                                                                : comm::Placement::shard(0);
}

// A thread-safe log of model events and ZeRO trace lines, with a wait for a line to appear.
class EventLog {
 public:
  void add(const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(line);
    }
    changed_.notify_all();
  }
  bool wait_for(const std::string& line, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return index_locked(line) >= 0; });
  }
  int index(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex_);
    return index_locked(line);
  }
  std::string str() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    for (const auto& l : lines_)
      out += l + " | ";
    return out;
  }

 private:
  int index_locked(const std::string& line) const {
    for (size_t i = 0; i < lines_.size(); ++i)
      if (lines_[i] == line) return static_cast<int>(i);
    return -1;
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> lines_;
};

// One step of `micro` micro-steps through a ZeroState; returns this rank's reduced local
// gradients (sums over ranks and micro-steps), flattened in trainable order.
struct StepSetup {
  int stage = 1;
  int micro = 2;
  bool warm_up = true;
  engine::ZeroOptions options;
  // Called at every model layer event, before the state handles it.
  std::function<void(model::Gpt::LayerEvent, int)> on_event;
  // Called after finish_grads, before the gradients are read.
  std::function<void(engine::ZeroState&)> after_finish;
};

std::vector<float> reduced_grads(comm::Communicator& comm, const StepSetup& setup) {
  model::Gpt gpt(tiny(), core::cpu_backend());
  gpt.init_weights();
  std::vector<engine::Trainable> trainables = engine::model_trainables(gpt);
  std::vector<comm::ParamDesc> infos;
  for (engine::Trainable& t : trainables) {
    t.placement = placement_of(t);
    infos.push_back({t.name, t.shape, t.placement, t.layer});
  }
  comm::ShardingPlan plan(infos, comm.size(), comm.rank(), setup.stage);
  engine::ZeroOptions options = setup.options;
  options.release_full_storage = [&gpt] { gpt.release_storage(); };
  auto zero = engine::ZeroState::create(comm, plan, std::move(trainables), gpt.backend(), options);
  gpt.set_layer_hook([&](model::Gpt::LayerEvent e, int layer) {
    if (setup.on_event) setup.on_event(e, layer);
    if (e == model::Gpt::LayerEvent::kBeforeForward) zero->before_forward(layer);
    if (e == model::Gpt::LayerEvent::kBeforeBackward) zero->before_backward(layer);
    if (e == model::Gpt::LayerEvent::kAfterBackward) zero->after_backward(layer);
  });
  // A warm-up pass as the trainer's (train.warmup_steps): begin_step drops its gradients, also
  // those still being reduced.
  if (setup.warm_up) {
    auto x = tokens(comm.rank(), 99, 0), y = tokens(comm.rank(), 99, 1);
    gpt.forward(x.data(), y.data(), kRows, kSeq);
    zero->begin_backward(false);
    gpt.backward();
    zero->end_backward();
  }
  zero->begin_step();
  for (int m = 0; m < setup.micro; ++m) {
    auto x = tokens(comm.rank(), m, 0), y = tokens(comm.rank(), m, 1);
    gpt.forward(x.data(), y.data(), kRows, kSeq);
    zero->begin_backward(m == setup.micro - 1);
    gpt.backward();
    zero->end_backward();
  }
  zero->finish_grads();
  if (setup.after_finish) setup.after_finish(*zero);
  std::vector<float> out;
  for (size_t i = 0; i < plan.num_params(); ++i) {
    const core::Tensor& g = zero->local_grad(i);
    if (!g.defined()) continue;
    out.insert(out.end(), g.data<float>(), g.data<float>() + g.numel());
  }
  return out;
}

// The same sums computed on this rank alone: every rank's micro-batches through one model, then
// this rank's local parts cut out of the full gradients.
std::vector<float> expected_grads(comm::Communicator& comm, int stage, int micro) {
  model::Gpt gpt(tiny(), core::cpu_backend());
  gpt.init_weights();
  gpt.zero_grad();
  for (int r = 0; r < comm.size(); ++r)
    for (int m = 0; m < micro; ++m) {
      auto x = tokens(r, m, 0), y = tokens(r, m, 1);
      gpt.forward(x.data(), y.data(), kRows, kSeq);
      gpt.backward();
    }
  std::vector<engine::Trainable> trainables = engine::model_trainables(gpt);
  std::vector<comm::ParamDesc> infos;
  for (engine::Trainable& t : trainables)
    infos.push_back({t.name, t.shape, placement_of(t), t.layer});
  comm::ShardingPlan plan(infos, comm.size(), comm.rank(), stage);
  std::vector<float> out;
  for (size_t i = 0; i < plan.num_params(); ++i) {
    if (plan.local_numel(i) == 0) continue;
    const comm::ShardingPlan::LocalSlice s = plan.local_slice(i);
    EXPECT_EQ(s.dim, 0);  // Shard(0) or whole: a contiguous block of rows
    const core::Tensor& g = trainables[i].grad;
    const int64_t row = g.numel() / (g.shape().empty() ? 1 : g.shape()[0]);
    const float* p = g.data<float>() + s.range.begin * row;
    out.insert(out.end(), p, p + s.range.size() * row);
  }
  return out;
}

// "<what><layer>": a model event ("A0") or, with a space, a trace line ("reduce 2").
std::string line(const char* what, int layer) {
  std::string out = what;
  out += std::to_string(layer);
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<comm::Communicator> world() {
  return comm::make_mpi_world();
}

TEST(ZeroState, ReducedGradientsAreTheSumOverRanksAtEveryStage) {
  auto comm = world();
  for (int stage : {1, 2, 3}) {
    for (bool overlap : {false, true}) {
      StepSetup setup;
      setup.stage = stage;
      setup.options.overlap = overlap;
      const std::vector<float> got = reduced_grads(*comm, setup);
      const std::vector<float> want = expected_grads(*comm, stage, setup.micro);
      ASSERT_EQ(got.size(), want.size()) << "stage " << stage;
      double worst = 0;
      for (size_t k = 0; k < got.size(); ++k)
        worst = std::max(worst, std::abs(double(got[k]) - want[k]) / (std::abs(want[k]) + 1e-3));
      EXPECT_LT(worst, 1e-5) << "stage " << stage << " overlap " << overlap << " np "
                             << comm->size();
    }
  }
}

// The trainer's clip phase on the device's terms: the ranks' grad_sum_squares add up to the
// squared norm of the reduced gradients (each element once), and scale_grads multiplies by the
// factor it reads in memory every local gradient but those an optimizer scales itself.
TEST(ZeroState, GradSumSquaresAndScaleGradsSkippingTheFoldedOnes) {
  auto comm = world();
  for (int stage : {1, 2, 3}) {
    double sum_squares = -1, want = 0;
    std::map<std::string, std::vector<float>> before, after;
    StepSetup setup;
    setup.stage = stage;
    setup.after_finish = [&](engine::ZeroState& zero) {
      zero.grad_sum_squares(&sum_squares);
      comm->all_reduce(&sum_squares, 1, comm::ReduceOp::Sum);
      for (const optim::ParamShard& p : zero.optimizer_shards()) {
        const float* g = p.grad.data<float>();
        before[p.name].assign(g, g + p.grad.numel());
        for (int64_t i = 0; i < p.grad.numel(); ++i)
          want += static_cast<double>(g[i]) * g[i];
      }
      comm->all_reduce(&want, 1, comm::ReduceOp::Sum);
      const float factor = 0.375f;
      zero.scale_grads(&factor,
                       [](const std::string& name) { return name.find("attn") != name.npos; });
      for (const optim::ParamShard& p : zero.optimizer_shards())
        after[p.name].assign(p.grad.data<float>(), p.grad.data<float>() + p.grad.numel());
    };
    reduced_grads(*comm, setup);
    EXPECT_NEAR(sum_squares, want, 1e-12 * want) << "stage " << stage;
    EXPECT_GT(want, 0.0);
    int folded = 0, scaled = 0;
    for (const auto& [name, g] : before) {
      std::vector<float> expect = g;
      if (name.find("attn") == name.npos) {
        for (float& x : expect)
          x *= 0.375f;
        ++scaled;
      } else {
        ++folded;
      }
      EXPECT_TRUE(bit_equal(after[name], expect)) << name << " stage " << stage;
    }
    // Over the ranks both kinds were seen (a small tensor may lie whole on one rank).
    int64_t counts[2] = {folded, scaled};
    comm->all_reduce(counts, 2, comm::ReduceOp::Sum);
    EXPECT_GT(counts[0], 0) << "stage " << stage;
    EXPECT_GT(counts[1], 0) << "stage " << stage;
  }
}

TEST(ZeroState, OverlapBucketsAndProgressAreBitIdenticalToTheSequentialPath) {
  auto comm = world();
  for (int stage : {1, 2, 3}) {
    std::vector<float> first;
    // Progress poll / thread x buckets per tensor / 4 KiB / 4 MiB, sparse rows on; then off.
    for (int variant = 0; variant < 7; ++variant) {
      const bool thread = variant % 2 == 1, sparse = variant < 6;
      const int64_t bucket = variant < 2 ? 0 : variant < 4 ? 4096 : int64_t{4} << 20;
      StepSetup setup;
      setup.stage = stage;
      setup.options.progress_thread = thread;
      setup.options.bucket_bytes = bucket;
      setup.options.sparse_rows = sparse;
      setup.options.overlap = false;
      const std::vector<float> sequential = reduced_grads(*comm, setup);
      setup.options.overlap = true;
      const std::vector<float> overlapped = reduced_grads(*comm, setup);
      std::ostringstream what;
      what << "stage " << stage << " thread " << thread << " bucket " << bucket << " sparse "
           << sparse << " np " << comm->size();
      EXPECT_TRUE(bit_equal(overlapped, sequential)) << what.str();
      // Two ranks add two numbers whatever the algorithm: every variant agrees exactly.
      if (first.empty()) first = sequential;
      if (comm->size() <= 2) {
        EXPECT_TRUE(bit_equal(sequential, first)) << what.str();
      }
    }
  }
}

TEST(ZeroState, ReductionsRunWhileTheFirstLayerIsStillInBackward) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  for (int stage : {1, 2}) {
    EventLog log;
    StepSetup setup;
    setup.stage = stage;
    setup.micro = 1;  // every event below is of the last micro-step
    setup.warm_up = false;
    setup.options.progress_thread = true;
    setup.options.trace = [&log](const std::string& line) { log.add(line); };
    bool head_done_in_time = false;
    setup.on_event = [&](model::Gpt::LayerEvent e, int layer) {
      if (e == model::Gpt::LayerEvent::kBeforeBackward) log.add(line("B", layer));
      if (e == model::Gpt::LayerEvent::kAfterBackward) log.add(line("A", layer));
      // Layer 0's backward is running: this thread makes no MPI call until it ends, so the
      // head's reduction can only complete on the communication threads.
      if (e == model::Gpt::LayerEvent::kBeforeBackward && layer == 0 && log.index("A1") >= 0 &&
          log.index(line("reduce ", kLayers)) >= 0)
        head_done_in_time = log.wait_for(line("reduced ", kLayers), std::chrono::seconds(30));
    };
    reduced_grads(*comm, setup);
    const std::string order = log.str();
    EXPECT_TRUE(head_done_in_time) << order;
    EXPECT_LT(log.index(line("reduce ", kLayers)), log.index(line("running ", kLayers))) << order;
    EXPECT_LT(log.index(line("reduced ", kLayers)), log.index("A0")) << order;
    EXPECT_LT(log.index("reduce 1"), log.index("A0")) << order;
    EXPECT_LT(log.index("A0"), log.index("reduce 0")) << order;
  }
}

}  // namespace
