// OSFT math on one process: the k_high rule of the reference, the torch.chunk row split, the
// decomposition, the chain rule, and the invariants of a 50-step run of the optimizer.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <Eigen/Dense>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "optim/osft/osft.h"
#include "optim/osft/osft_factors.h"
#include "optim/registry.h"
#include "tests/optim/cpu_context.h"
#include "tests/test_util.h"

using core::Tensor;
using test_util::error_of;

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

MatD mat(const Tensor& t) {
  const int64_t rows = t.dim() == 2 ? t.size(0) : t.numel();
  const int64_t cols = t.dim() == 2 ? t.size(1) : 1;
  MatD m(rows, cols);
  const float* p = t.data<float>();
  for (int64_t i = 0; i < rows * cols; ++i)
    m.data()[i] = p[i];
  return m;
}

Tensor random(const core::Shape& shape, uint64_t seed, float stddev = 1.0f) {
  Tensor t = Tensor::empty(shape);
  core::fill_normal(t, seed, 0.0f, stddev);
  return t;
}

optim::OsftConfig osft_config(const std::string& yaml) {
  optim::HyperReader r(YAML::Load(yaml), "test");
  optim::OsftConfig c = optim::OsftConfig::from_yaml(r);
  r.finish();
  return c;
}

// One target trained by Osft on one process, the way a trainer drives it.
struct FactorRun {
  optim::OsftFactors f;
  optim::Osft osft;
  FactorRun(const Tensor& w, int64_t k, const optim::OsftConfig& config)
      : f(optim::osft_decompose(w, k)), osft(config) {
    osft.set_communicator(nullptr, nullptr, core::cpu_backend());
    osft.add_target("w", w.size(0), w.size(1), k, f.U_high, f.V_high);
  }
  void step(int64_t t, const Tensor& dW) {
    const optim::OsftLowGrads g = optim::osft_factor_grads(f, dW);
    const core::Shape su = f.U_low.shape(), ss = f.S_low.shape(), sv = f.V_low.shape();
    const std::vector<optim::ParamShard> parts = {{"w.U_low", su, 0, f.U_low, g.U_low},
                                                  {"w.S_low", ss, 0, f.S_low, g.S_low},
                                                  {"w.V_low", sv, 0, f.V_low, g.V_low}};
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = t;
    osft.step(parts, ctx);
  }
};

}  // namespace

// The reference's own cases (spec section 4) and the golden files' splits.
TEST(OsftRankRule, MatchesTheReference) {
  EXPECT_EQ(optim::osft_k_high(10, 10, 0.0), 9);  // URR 0 still leaves one direction
  EXPECT_EQ(optim::osft_k_high(10, 10, 0.9), 0);  // floor(10 * 0.09999999999999998)
  EXPECT_EQ(optim::osft_k_high(10, 10, 0.7), 3);
  EXPECT_EQ(optim::osft_k_high(48, 48, 0.4), 28);
  EXPECT_EQ(optim::osft_k_high(32, 32, 0.25), 24);
  EXPECT_EQ(optim::osft_k_high(24, 64, 0.5), 12);
  EXPECT_EQ(optim::osft_k_high(64, 16, 0.3), 11);
  EXPECT_EQ(optim::osft_k_high(56, 14, 0.5), 7);
  EXPECT_EQ(optim::osft_k_high(9, 9, 0.5), 4);
  EXPECT_EQ(optim::osft_k_high(9, 9, 1.0), 0);  // everything trains: not decomposed
  EXPECT_NE(error_of([] { optim::osft_k_high(9, 9, 1.5); }).find("unfreeze_rank_ratio"),
            std::string::npos);
}

TEST(OsftRankRule, KHighGlobsOverrideTheRatio) {
  const optim::OsftConfig c = osft_config(
      "{unfreeze_rank_ratio: 0.5, lr: 1.0e-3, k_high: {'blocks.0.*': 3, '*.mlp.fc.weight': 0}}");
  EXPECT_EQ(c.k_high_for("blocks.0.attn.qkv.weight", 48, 16), 3);
  EXPECT_EQ(c.k_high_for("blocks.1.mlp.fc.weight", 64, 16), 0);
  EXPECT_EQ(c.k_high_for("blocks.1.attn.qkv.weight", 48, 16), 8);
  const std::string err = error_of([&] { c.k_high_for("blocks.0.attn.proj.weight", 3, 16); });
  EXPECT_NE(err.find("blocks.0.attn.proj.weight"), std::string::npos) << err;
  EXPECT_NE(error_of([] { osft_config("{lr: 1.0}"); }).find("unfreeze_rank_ratio"),
            std::string::npos);
  EXPECT_NE(error_of([] { osft_config("{unfreeze_rank_ratio: 0.5}"); }).find("lr"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              osft_config("{unfreeze_rank_ratio: 0.5, lr: 1, k_high: {a: -1}}");
            }).find("k_high entry 'a'"),
            std::string::npos);
  EXPECT_TRUE(optim::Registry::global().contains("osft"));
}

// A targeted matrix reaching the optimizer dense would silently train as plain AdamW: refused.
TEST(OsftRankRule, DenseTargetsAreRefusedVectorsAndUntargetedMatricesStep) {
  optim::Osft osft(
      osft_config("{unfreeze_rank_ratio: 0.5, lr: 1.0e-3, "
                  "k_high: {'blocks.1.*': 0}}"));
  auto step = [&](const std::string& name, const core::Shape& shape) {
    const Tensor w = Tensor::zeros(shape), g = Tensor::zeros(shape);
    const optim::ParamShard p{name, shape, 0, w, g};
    osft.step({&p, 1}, cpu_context());
  };
  const std::string err = error_of([&] { step("blocks.0.mlp.fc.weight", {64, 16}); });
  EXPECT_NE(err.find("'blocks.0.mlp.fc.weight' [64, 16] is an OSFT target (k_high 8)"),
            std::string::npos)
      << err;
  step("blocks.1.mlp.fc.weight", {64, 16});  // k_high 0: trains dense
  step("ln_f.weight", {16});
}

// FSDP2 Shard(0): ceil(n / P) rows each, the last non-empty rank short, trailing ranks empty.
TEST(OsftRows, FollowTorchChunk) {
  auto sizes = [](int64_t n, int p) {
    std::vector<int64_t> out;
    for (int r = 0; r < p; ++r)
      out.push_back(optim::osft_rows(n, p, r).size());
    return out;
  };
  EXPECT_EQ(sizes(56, 3), (std::vector<int64_t>{19, 19, 18}));
  EXPECT_EQ(sizes(7, 3), (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(sizes(4, 3), (std::vector<int64_t>{2, 2, 0}));
  EXPECT_EQ(sizes(9, 2), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(sizes(1, 3), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(optim::osft_rows(5, 4, 3).begin, 5);
}

TEST(OsftFactors, DecompositionIsACanonicalThinSvd) {
  for (const auto& [n, m, k] : {std::tuple{12, 7, 3}, {7, 12, 5}, {16, 16, 15}}) {
    const Tensor w = random({n, m}, 11 + n);
    const optim::OsftFactors f = optim::osft_decompose(w, k);
    EXPECT_LT((mat(optim::osft_reconstruct(f)) - mat(w)).cwiseAbs().maxCoeff(), 2e-6);
    MatD u(n, std::min(n, m)), v(std::min(n, m), m);
    u << mat(f.U_high), mat(f.U_low);
    v << mat(f.V_high), mat(f.V_low);
    const MatD eye = MatD::Identity(u.cols(), u.cols());
    EXPECT_LT((u.transpose() * u - eye).cwiseAbs().maxCoeff(), 1e-6);
    EXPECT_LT((v * v.transpose() - eye).cwiseAbs().maxCoeff(), 1e-6);
    MatD s(u.cols(), 1);
    s << mat(f.S_high), mat(f.S_low);
    for (int64_t i = 0; i < u.cols(); ++i) {
      EXPECT_GT(u.col(i).sum(), 0.0) << "canonical sign of pair " << i;
      if (i > 0) {
        EXPECT_GE(s(i - 1), s(i));
      }
    }
  }
  EXPECT_NE(error_of([] {
              optim::osft_decompose(random({4, 6}, 1), 4);
            }).find("k_high 4"),
            std::string::npos);
}

// L(factors) = <dW, W(factors)> is linear in each factor, so a step E changes it by exactly
// <grad, E>: compared in double for random directions.
TEST(OsftFactors, ChainRuleMatchesDirectionalDerivatives) {
  const Tensor w = random({9, 6}, 3);
  const Tensor dW = random({9, 6}, 4);
  optim::OsftFactors f = optim::osft_decompose(w, 2);
  const optim::OsftLowGrads g = optim::osft_factor_grads(f, dW);
  const MatD dw = mat(dW);
  auto loss = [&](const MatD& ul, const MatD& sl, const MatD& vl) {
    const MatD low = ul * sl.col(0).asDiagonal() * vl;
    return dw.cwiseProduct(low).sum();  // the high part does not depend on the trained factors
  };
  const MatD ul = mat(f.U_low), sl = mat(f.S_low), vl = mat(f.V_low);
  const double base = loss(ul, sl, vl);
  const MatD eu = MatD::Random(ul.rows(), ul.cols()), es = MatD::Random(sl.rows(), 1);
  const MatD ev = MatD::Random(vl.rows(), vl.cols());
  EXPECT_NEAR(loss(ul + eu, sl, vl) - base, mat(g.U_low).cwiseProduct(eu).sum(), 1e-5);
  EXPECT_NEAR(loss(ul, sl + es, vl) - base, mat(g.S_low).cwiseProduct(es).sum(), 1e-5);
  EXPECT_NEAR(loss(ul, sl, vl + ev) - base, mat(g.V_low).cwiseProduct(ev).sum(), 1e-5);
}

// 50 steps at a large learning rate: with the post-step projection U_high^T U_low and
// V_low V_high^T stay at round-off and the frozen triplets remain singular triplets of W;
// without it (the PR #74-era reference) AdamW leaks into the frozen subspaces.
TEST(Osft, InvariantsHoldAfterFiftySteps) {
  const Tensor w = random({24, 16}, 21, 0.5f);
  for (const bool project : {true, false}) {
    FactorRun run(
        w, 10,
        osft_config(std::string("{unfreeze_rank_ratio: 0.4, lr: 1.0e-2, weight_decay: 0.01, "
                                "project_params: ") +
                    (project ? "true}" : "false}")));
    for (int64_t t = 1; t <= 50; ++t)
      run.step(t, random({24, 16}, 1000 + t, 0.1f));
    const MatD uh = mat(run.f.U_high), vh = mat(run.f.V_high);
    const double orth_u = (uh.transpose() * mat(run.f.U_low)).cwiseAbs().maxCoeff();
    const double orth_v = (mat(run.f.V_low) * vh.transpose()).cwiseAbs().maxCoeff();
    const MatD frozen = uh.transpose() * mat(optim::osft_reconstruct(run.f)) * vh.transpose();
    const double drift =
        (frozen - MatD(mat(run.f.S_high).col(0).asDiagonal())).cwiseAbs().maxCoeff();
    if (project) {
      EXPECT_LT(orth_u, 1e-6);
      EXPECT_LT(orth_v, 1e-6);
      EXPECT_LT(drift, 1e-5);
    } else {
      EXPECT_GT(orth_u, 1e-3);
      EXPECT_GT(drift, 1e-4);
    }
  }
}

// Saving the AdamW state of the factors after 4 steps and loading it into a fresh optimizer
// continues the run bit for bit; dropping the state does not.
TEST(Osft, ResumeFromSavedStateIsBitExact) {
  const Tensor w = random({10, 8}, 5);
  const optim::OsftConfig c = osft_config("{unfreeze_rank_ratio: 0.5, lr: 1.0e-2}");
  FactorRun whole(w, 4, c), first(w, 4, c);
  for (int64_t t = 1; t <= 8; ++t)
    whole.step(t, random({10, 8}, 50 + t));
  for (int64_t t = 1; t <= 4; ++t)
    first.step(t, random({10, 8}, 50 + t));
  optim::OptimizerState state;
  first.osft.save_state(state);
  FactorRun resumed(w, 4, c), fresh(w, 4, c);
  for (FactorRun* r : {&resumed, &fresh})
    for (const char* f : {"U_low", "S_low", "V_low"})
      optim::factor_by_name(r->f, f).copy_from(optim::factor_by_name(first.f, f));
  resumed.osft.load_state(state);
  for (int64_t t = 5; t <= 8; ++t) {
    resumed.step(t, random({10, 8}, 50 + t));
    fresh.step(t, random({10, 8}, 50 + t));
  }
  bool fresh_differs = false;
  for (const char* f : {"U_low", "S_low", "V_low"}) {
    const Tensor& a = optim::factor_by_name(resumed.f, f);
    const Tensor& b = optim::factor_by_name(whole.f, f);
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << f;
    fresh_differs |=
        std::memcmp(optim::factor_by_name(fresh.f, f).raw_data(), b.raw_data(), b.nbytes()) != 0;
  }
  EXPECT_TRUE(fresh_differs);
}

// Parameters of the group that are not factors (vectors, k_high 0 matrices) train as plain
// torch AdamW with the group's hyperparameters.
TEST(Osft, OrdinaryParametersTrainAsTorchAdamW) {
  optim::Osft osft(
      osft_config("{unfreeze_rank_ratio: 0.5, lr: 0.1, betas: [0.9, 0.99], "
                  "eps: 1.0e-3, weight_decay: 0.5}"));
  Tensor w = Tensor::from_vector({1}, std::vector<float>{1.0f});
  Tensor g = Tensor::from_vector({1}, std::vector<float>{0.3f});
  optim::ParamShard p{"ln.bias", {1}, 0, w, g};
  osft.step({&p, 1}, cpu_context());
  // t = 1: m = 0.03, v = 9e-4, W = 1 (1 - 0.1 * 0.5) - 0.1 (m / 0.1) / (sqrt(v / 0.01) + eps)
  const double expected = 0.95 - 0.1 * 0.3 / (0.3 + 1e-3);
  EXPECT_NEAR(w.at({0}), expected, 1e-6);
}
