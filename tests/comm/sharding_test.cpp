// Sharding under MPI: round trips of every placement (bit for bit, uneven and empty parts),
// gradient reduction against a serial reference at every stage, the byte counters against the
// theory of a plan, and stage-3 residency (no gathered buffer outlives its layer).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/layer_gatherer.h"
#include "comm/shard_ops.h"
#include "comm/sharding_plan.h"
#include "core/allocator.h"
#include "core/check.h"
#include "test_data.h"

using comm::Collective;
using comm::Communicator;
using comm::ParamDesc;
using comm::Placement;
using comm::ShardingPlan;
using core::Tensor;

namespace {

std::unique_ptr<Communicator> fresh_world() {
  static std::unique_ptr<Communicator> w = comm::make_mpi_world();
  return w->split(0, w->rank());  // own counters per test
}

// A scaled-down model table: a vocabulary that does not divide by 3 or 4, a column-sharded
// matrix, owned matrices for a matrix optimizer, tiny and empty tensors, a scalar.
std::vector<ParamDesc> table() {
  return {
      {"embed.weight", {503, 6}, Placement::shard(0), 0},
      {"blocks.0.attn.qkv.weight", {18, 6}, Placement::owned(), 1},
      {"blocks.0.attn.proj.weight", {6, 6}, Placement::owned(), 1},
      {"blocks.0.mlp.fc.weight", {24, 6}, Placement::shard(1), 1},
      {"blocks.0.ln1.weight", {6}, Placement::replicate(), 1},
      {"blocks.0.tiny", {2}, Placement::shard(0), 1},
      {"blocks.0.empty", {0, 5}, Placement::shard(0), 1},
      {"blocks.0.experts", {3, 5, 4}, Placement::shard(1), 1},
      {"lm_head.scale", {}, Placement::owned(), 2},
      {"lm_head.weight", {503, 6}, Placement::shard(0), 2},
  };
}

Tensor full_values(const ShardingPlan& plan, size_t i, uint64_t stream) {
  Tensor t = Tensor::empty(plan.param(i).shape);
  float* p = t.data<float>();
  for (int64_t k = 0; k < t.numel(); ++k)
    p[k] = comm_test::value(900 + i, stream, k);
  return t;
}

// Reference local part: slice the full tensor along the placement's dimension by hand.
std::vector<float> local_ref(const ShardingPlan& plan, size_t i, int r, const Tensor& full) {
  const Placement& pl = plan.placement(i);
  if (pl.is_replicate()) return full.to_vector();
  if (pl.is_owned()) return r == pl.owner ? full.to_vector() : std::vector<float>{};
  comm::Range range = plan.range(i, r);
  return full.slice(pl.dim, range.begin, range.size()).to_vector();
}

}  // namespace

TEST(Sharding, ShardThenGatherIsBitExactAtEveryStage) {
  auto c = fresh_world();
  for (int stage = 0; stage <= 3; ++stage) {
    ShardingPlan plan(table(), c->size(), c->rank(), stage);
    for (size_t i = 0; i < plan.num_params(); ++i) {
      Tensor full = full_values(plan, i, 1);
      Tensor local = Tensor::empty(plan.local_shape(i));
      comm::copy_local_part(*c, plan, i, full, local);
      EXPECT_EQ(local.to_vector(), local_ref(plan, i, c->rank(), full)) << plan.param(i).name;
      Tensor back = Tensor::empty(plan.param(i).shape);
      comm::all_gather_param(*c, plan, i, local, back);
      EXPECT_EQ(back.to_vector(), full.to_vector()) << plan.param(i).name << " stage " << stage;
    }
  }
}

TEST(Sharding, ScatterFromRootThenGather) {
  auto c = fresh_world();
  ShardingPlan plan(table(), c->size(), c->rank(), 3);
  const int root = c->size() - 1;
  for (size_t i = 0; i < plan.num_params(); ++i) {
    Tensor truth = full_values(plan, i, 2);
    Tensor full = c->rank() == root ? truth.clone() : Tensor::zeros(plan.param(i).shape);
    Tensor local = Tensor::empty(plan.local_shape(i));
    c->broadcast(full.data<float>(), full.numel(), root);
    comm::copy_local_part(*c, plan, i, full, local);
    EXPECT_EQ(local.to_vector(), local_ref(plan, i, c->rank(), truth)) << plan.param(i).name;
  }
}

TEST(Sharding, LocalPartAsViewOfTheFullTensorGathersInPlace) {
  auto c = fresh_world();
  ShardingPlan plan(table(), c->size(), c->rank(), 2);
  const size_t i = plan.index("embed.weight");
  Tensor truth = full_values(plan, i, 3);
  Tensor full = Tensor::zeros(plan.param(i).shape);
  comm::Range own = plan.range(i, c->rank());
  Tensor local = full.slice(0, own.begin, own.size());
  local.copy_from(truth.slice(0, own.begin, own.size()));
  comm::all_gather_param(*c, plan, i, local, full);
  EXPECT_EQ(full.to_vector(), truth.to_vector());
}

TEST(Sharding, ReduceGradMatchesSerialMeanAtEveryStage) {
  auto c = fresh_world();
  const int W = c->size();
  for (int stage = 0; stage <= 3; ++stage) {
    ShardingPlan plan(table(), W, c->rank(), stage);
    std::vector<Tensor> locals, fulls;
    std::vector<std::unique_ptr<comm::Work>> works;
    for (size_t i = 0; i < plan.num_params(); ++i) {
      fulls.push_back(full_values(plan, i, 10 + c->rank()));  // this rank's gradient
      locals.push_back(Tensor::empty(plan.local_shape(i)));
      works.push_back(comm::reduce_grad_async(*c, plan, i, fulls[i], locals[i]));
    }
    for (auto& w : works)
      w->wait();
    for (size_t i = 0; i < plan.num_params(); ++i) {
      // Serial mean over all ranks' gradients (integers: exact sum), then the own part.
      Tensor mean = Tensor::zeros(plan.param(i).shape);
      float* m = mean.data<float>();
      for (int r = 0; r < W; ++r) {
        Tensor g = full_values(plan, i, 10 + r);
        for (int64_t k = 0; k < g.numel(); ++k)
          m[k] += g.data<float>()[k];
      }
      for (int64_t k = 0; k < mean.numel(); ++k)
        m[k] *= 1.0f / static_cast<float>(W);
      EXPECT_EQ(locals[i].to_vector(), local_ref(plan, i, c->rank(), mean))
          << plan.param(i).name << " stage " << stage;
    }
  }
}

// One step of the trainer's communication for a plan: what the counters must show.
TEST(Sharding, ByteCountersEqualTheTheoryOfEachStage) {
  for (int stage = 1; stage <= 3; ++stage) {
    auto c = fresh_world();
    const int W = c->size();
    ShardingPlan plan(table(), W, c->rank(), stage);
    int64_t replicated_bytes = 0, sharded_bytes = 0, local_bytes = 0, sharded_params = 0;
    for (size_t i = 0; i < plan.num_params(); ++i) {
      if (plan.placement(i).is_replicate()) {
        replicated_bytes += plan.numel(i) * 4;
      } else {
        sharded_bytes += plan.numel(i) * 4;
        local_bytes += plan.local_numel(i) * 4;
        sharded_params += 1;
      }
    }
    std::vector<Tensor> locals(plan.num_params());
    comm::LayerGatherer gatherer(*c, plan, core::cpu_allocator());
    for (size_t i = 0; i < plan.num_params(); ++i) {
      locals[i] = Tensor::zeros(plan.local_shape(i));
      gatherer.set_local(i, locals[i]);
    }
    // Stage 3: gather every layer for the forward and again for the backward.
    if (stage == 3) {
      for (int pass = 0; pass < 2; ++pass) {
        for (int layer : plan.layers()) {
          gatherer.gather(layer);
          gatherer.release(layer);
        }
      }
    }
    for (size_t i = 0; i < plan.num_params(); ++i) {
      Tensor grad = Tensor::zeros(plan.param(i).shape);
      comm::reduce_grad(*c, plan, i, grad, locals[i]);
    }
    if (stage < 3) {
      for (size_t i = 0; i < plan.num_params(); ++i) {
        Tensor full = Tensor::zeros(plan.param(i).shape);
        comm::all_gather_param(*c, plan, i, locals[i], full);
      }
    }
    const comm::CommStats& s = c->stats();
    const int64_t n = static_cast<int64_t>(plan.num_params());
    if (stage == 1) {
      EXPECT_EQ(s[Collective::AllReduce].calls, n);
      EXPECT_EQ(s[Collective::AllReduce].bytes, replicated_bytes + sharded_bytes);
      EXPECT_EQ(s[Collective::ReduceScatter].calls, 0);
    } else {
      EXPECT_EQ(s[Collective::AllReduce].calls, n - sharded_params);
      EXPECT_EQ(s[Collective::AllReduce].bytes, replicated_bytes);
      EXPECT_EQ(s[Collective::ReduceScatter].calls, sharded_params);
      EXPECT_EQ(s[Collective::ReduceScatter].bytes, sharded_bytes);
    }
    const int64_t gathers = stage == 3 ? 2 : 1;
    EXPECT_EQ(s[Collective::AllGather].calls, gathers * sharded_params) << "stage " << stage;
    EXPECT_EQ(s[Collective::AllGather].bytes, gathers * local_bytes) << "stage " << stage;
    // Summed over ranks, one all-gather moves each parameter's bytes exactly once.
    int64_t gathered = s[Collective::AllGather].bytes;
    c->all_reduce(&gathered, 1, comm::ReduceOp::Sum);
    EXPECT_EQ(gathered, gathers * sharded_bytes);
  }
}

TEST(Sharding, Stage3GatherAndReleaseLeaveNoLiveBuffer) {
  auto c = fresh_world();
  ShardingPlan plan(table(), c->size(), c->rank(), 3);
  std::vector<Tensor> truth, locals;
  for (size_t i = 0; i < plan.num_params(); ++i) {
    truth.push_back(full_values(plan, i, 4));
    locals.push_back(Tensor::empty(plan.local_shape(i)));
    comm::copy_local_part(*c, plan, i, truth[i], locals[i]);
  }
  core::CpuAllocator& alloc = core::cpu_allocator();
  const size_t baseline = alloc.live_bytes();
  {
    comm::LayerGatherer gatherer(*c, plan, alloc);
    for (size_t i = 0; i < plan.num_params(); ++i)
      gatherer.set_local(i, locals[i]);
    for (int layer : plan.layers()) {
      // Prefetch the next layer while this one is "in use".
      auto work = gatherer.gather_async(layer);
      work->wait();
      size_t expected = 0;
      for (size_t i : plan.layer_params(layer)) {
        EXPECT_EQ(gatherer.full(i).to_vector(), truth[i].to_vector()) << plan.param(i).name;
        if (!plan.placement(i).is_replicate()) expected += plan.numel(i) * 4;
      }
      EXPECT_EQ(alloc.live_bytes(), baseline + expected) << "layer " << layer;
      gatherer.release(layer);
      EXPECT_EQ(alloc.live_bytes(), baseline) << "after release of layer " << layer;
      EXPECT_THROW(gatherer.full(plan.layer_params(layer).front()), core::Error);
    }
    gatherer.gather(1);
    gatherer.gather(2);
    EXPECT_THROW(gatherer.gather(1), core::Error);
    EXPECT_TRUE(gatherer.is_gathered(1) && gatherer.is_gathered(2));
    gatherer.release(2);
    gatherer.release(1);
    EXPECT_THROW(gatherer.release(1), core::Error);
  }
  EXPECT_EQ(alloc.live_bytes(), baseline);
}

TEST(Sharding, BadTensorsAreRefusedWithTheParameterName) {
  auto c = fresh_world();
  ShardingPlan plan(table(), c->size(), c->rank(), 2);
  const size_t i = plan.index("embed.weight");
  Tensor grad = Tensor::zeros(plan.param(i).shape);
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Wrong local shape.
  std::string m = message([&] {
    comm::reduce_grad(*c, plan, i, grad, Tensor::zeros({plan.local_numel(i) + 1, 6}));
  });
  EXPECT_NE(m.find("embed.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("rank " + std::to_string(c->rank())), std::string::npos) << m;
  // A reduce-scatter cannot write into the buffer it reads.
  comm::Range own = plan.range(i, c->rank());
  if (own.size() > 0) {
    m = message(
        [&] { comm::reduce_grad(*c, plan, i, grad, grad.slice(0, own.begin, own.size())); });
    EXPECT_NE(m.find("must not share storage"), std::string::npos) << m;
  }
  // Wrong full shape.
  m = message([&] {
    comm::all_gather_param(*c, plan, i, Tensor::zeros(plan.local_shape(i)), Tensor::zeros({3}));
  });
  EXPECT_NE(m.find("full tensor is [3]"), std::string::npos) << m;
}

// Three SGD steps through the plan's data movement (the trainer's flow) give, at every stage, the
// parameters a single process computes from the mean of all ranks' gradients. Each rank's
// gradient depends on the current full parameter, so a wrong gather shows up in later steps.
TEST(Sharding, SgdStepsMatchTheSingleProcessResultAtEveryStage) {
  auto c = fresh_world();
  const int W = c->size();
  const float lr = 0.5f;
  const int kSteps = 3;
  auto grad_of = [](const Tensor& param, int step, int rank) {
    Tensor g = Tensor::empty(param.shape());
    const float* p = param.data<float>();
    float* out = g.data<float>();
    for (int64_t k = 0; k < g.numel(); ++k) {
      out[k] =
          static_cast<float>(static_cast<int>(p[k] * 4.0f) % 5) + comm_test::value(step, rank, k);
    }
    return g;
  };
  // The single-process reference.
  ShardingPlan reference_plan(table(), 1, 0, 0);
  std::vector<Tensor> expected;
  for (size_t i = 0; i < reference_plan.num_params(); ++i) {
    expected.push_back(full_values(reference_plan, i, 5));
  }
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < expected.size(); ++i) {
      Tensor mean = Tensor::zeros(expected[i].shape());
      for (int r = 0; r < W; ++r) {
        Tensor g = grad_of(expected[i], step, r);
        for (int64_t k = 0; k < g.numel(); ++k)
          mean.data<float>()[k] += g.data<float>()[k];
      }
      for (int64_t k = 0; k < mean.numel(); ++k) {
        mean.data<float>()[k] *= 1.0f / static_cast<float>(W);
        expected[i].data<float>()[k] -= lr * mean.data<float>()[k];
      }
    }
  }

  for (int stage = 0; stage <= 3; ++stage) {
    ShardingPlan plan(table(), W, c->rank(), stage);
    const size_t n = plan.num_params();
    std::vector<Tensor> full(n), local(n), local_grad(n);
    for (size_t i = 0; i < n; ++i) {
      Tensor init = full_values(plan, i, 5);
      local[i] = Tensor::empty(plan.local_shape(i));
      local_grad[i] = Tensor::empty(plan.local_shape(i));
      comm::copy_local_part(*c, plan, i, init, local[i]);
      if (stage < 3) full[i] = init;  // stage 3 keeps only the local parts between steps
    }
    comm::LayerGatherer gatherer(*c, plan, core::cpu_allocator());
    for (size_t i = 0; i < n; ++i)
      gatherer.set_local(i, local[i]);
    for (int step = 0; step < kSteps; ++step) {
      for (int layer : plan.layers()) {
        if (stage == 3) gatherer.gather(layer);
        for (size_t i : plan.layer_params(layer)) {
          const Tensor& param = stage == 3 ? gatherer.full(i) : full[i];
          Tensor grad = grad_of(param, step, c->rank());
          comm::reduce_grad(*c, plan, i, grad, local_grad[i]);
        }
        if (stage == 3) gatherer.release(layer);
      }
      for (size_t i = 0; i < n; ++i) {
        float* p = local[i].data<float>();
        const float* g = local_grad[i].data<float>();
        for (int64_t k = 0; k < local[i].numel(); ++k)
          p[k] -= lr * g[k];
        if (stage < 3) comm::all_gather_param(*c, plan, i, local[i], full[i]);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      Tensor result = Tensor::empty(plan.param(i).shape);
      comm::all_gather_param(*c, plan, i, local[i], result);
      EXPECT_EQ(result.to_vector(), expected[i].to_vector())
          << plan.param(i).name << " stage " << stage << " on " << W << " ranks";
      if (stage < 3) {
        EXPECT_EQ(full[i].to_vector(), expected[i].to_vector()) << plan.param(i).name;
      }
    }
  }
}
