// The model's loss reduction and MoE routing ops on the CPU: routing ties and dispatch order,
// bit for bit against the host formulas the model used before they became backend ops, and the
// router backward against central finite differences of moe_route in float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/classifier_kernels.h"
#include "core/cpu/moe_kernels.h"
#include "grad_check.h"

namespace {

using core::test::expect_gradient;
using core::test::random_vec;
namespace cpu = core::cpu;

// Softmax rows [N, E] from seeded logits (the router's output).
template <typename T>
std::vector<T> softmax_rows(int64_t N, int64_t E, uint64_t seed) {
  std::vector<double> z = random_vec(N * E, seed, 2.0);
  std::vector<T> p(N * E);
  for (int64_t t = 0; t < N; ++t) {
    double mx = *std::max_element(z.begin() + t * E, z.begin() + (t + 1) * E), sum = 0.0;
    for (int64_t e = 0; e < E; ++e)
      sum += std::exp(z[t * E + e] - mx);
    for (int64_t e = 0; e < E; ++e)
      p[t * E + e] = static_cast<T>(std::exp(z[t * E + e] - mx) / sum);
  }
  return p;
}

// Host storage for one routing, with the MoeRoutingOf view the kernels take.
template <typename T>
struct RoutingBuffers {
  std::vector<int32_t> chosen, slot_row, row_token, offset;
  std::vector<T> row_gate, sel_sum, frac;
  std::vector<double> mass;
  RoutingBuffers(int64_t N, int64_t E, int64_t K)
      : chosen(N * K, -7),
        slot_row(N * K, -7),
        row_token(N * K, -7),
        offset(E + 1, -7),
        row_gate(N * K, T(-7)),
        sel_sum(N, T(-7)),
        frac(E, T(-7)),
        mass(E, -7.0) {}
  core::MoeRoutingOf<T> view() {
    return {chosen.data(),  slot_row.data(), row_token.data(), row_gate.data(),
            sel_sum.data(), frac.data(),     offset.data(),    mass.data()};
  }
};

// The routing exactly as model/gpt.cpp computed it on the host before moe_route (the oracle
// for bit-identical CPU results): partial_sort top-k, fill counters, float64 aux.
struct HostRouting {
  std::vector<int32_t> chosen, slot_row, row_token;
  std::vector<float> row_gate, sel_sum, frac;
  std::vector<int64_t> offset;
  float aux_loss = 0.0f;
};

HostRouting host_route(const std::vector<float>& probs, int64_t N, int64_t E, int64_t K,
                       float aux_weight) {
  HostRouting r;
  r.chosen.resize(N * K);
  r.slot_row.resize(N * K);
  r.sel_sum.resize(N);
  std::vector<int64_t> count(E, 0);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < N; ++t) {
    const float* pt = &probs[t * E];
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [pt](int32_t x, int32_t y) {
      return pt[x] > pt[y] || (pt[x] == pt[y] && x < y);
    });
    float sum = 0.0f;
    for (int64_t s = 0; s < K; ++s) {
      r.chosen[t * K + s] = order[s];
      sum += pt[order[s]];
      ++count[order[s]];
    }
    r.sel_sum[t] = sum;
  }
  r.offset.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e)
    r.offset[e + 1] = r.offset[e] + count[e];
  std::vector<int64_t> fill(r.offset.begin(), r.offset.end() - 1);
  r.row_token.resize(N * K);
  r.row_gate.resize(N * K);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t s = 0; s < K; ++s) {
      const int32_t e = r.chosen[t * K + s];
      const int64_t row = fill[e]++;
      r.slot_row[t * K + s] = static_cast<int32_t>(row);
      r.row_token[row] = static_cast<int32_t>(t);
      r.row_gate[row] = probs[t * E + e] / r.sel_sum[t];
    }
  }
  r.frac.resize(E);
  double aux = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    double pe = 0.0;
    for (int64_t t = 0; t < N; ++t)
      pe += probs[t * E + e];
    r.frac[e] = static_cast<float>(count[e]) / static_cast<float>(N);
    aux += double(r.frac[e]) * (pe / double(N));
  }
  r.aux_loss += static_cast<float>(aux_weight * E * aux);
  return r;
}

// The router backward as the model computed it on the host before moe_router_backward.
std::vector<float> host_router_backward(const HostRouting& r, const std::vector<float>& dgate,
                                        int64_t N, int64_t E, int64_t K, float aux_weight) {
  std::vector<float> dprobs(N * E, 0.0f);
  const float aux_scale = aux_weight * static_cast<float>(E) / static_cast<float>(N);
  for (int64_t t = 0; t < N; ++t) {
    float* dp = &dprobs[t * E];
    for (int64_t e = 0; e < E; ++e)
      dp[e] = aux_scale * r.frac[e];
    float weighted = 0.0f;
    for (int64_t s = 0; s < K; ++s) {
      const int32_t row = r.slot_row[t * K + s];
      weighted += dgate[row] * r.row_gate[row];
    }
    for (int64_t s = 0; s < K; ++s) {
      const int32_t row = r.slot_row[t * K + s];
      dp[r.chosen[t * K + s]] += (dgate[row] - weighted) / r.sel_sum[t];
    }
  }
  return dprobs;
}

// Bitwise equality of float arrays (EXPECT_EQ on floats would pass -0 == +0 and fail NaN).
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

TEST(MoeRoute, TiesGoToTheLowerExpert) {
  const int64_t N = 4, E = 4, K = 2;
  std::vector<float> probs = {0.25f, 0.25f, 0.25f, 0.25f,  // all equal: experts 0, 1
                              0.1f,  0.4f,  0.1f,  0.4f,   // tie at the top: 1, 3
                              0.3f,  0.2f,  0.3f,  0.2f,   // tie at the top: 0, 2
                              0.1f,  0.2f,  0.3f,  0.4f};  // most probable first: 3, 2
  RoutingBuffers<float> b(N, E, K);
  float aux = 0.0f;
  cpu::moe_route(b.view(), &aux, probs.data(), N, E, K, 0.01f);
  EXPECT_EQ(b.chosen, (std::vector<int32_t>{0, 1, 1, 3, 0, 2, 3, 2}));
  EXPECT_EQ(b.offset, (std::vector<int32_t>{0, 2, 4, 6, 8}));
  // Rows of each expert in token order; row_token and slot_row point at each other.
  EXPECT_EQ(b.row_token, (std::vector<int32_t>{0, 2, 0, 1, 2, 3, 1, 3}));
  for (int64_t i = 0; i < N * K; ++i)
    EXPECT_EQ(b.row_token[b.slot_row[i]], i / K) << "slot " << i;
  EXPECT_FLOAT_EQ(b.row_gate[b.slot_row[6]], 0.4f / 0.7f);  // token 3, expert 3
  EXPECT_FLOAT_EQ(b.sel_sum[1], 0.8f);
}

TEST(MoeRoute, EqualsTheHostFormulaBitForBit) {
  struct Case {
    int64_t N, E, K;
  };
  for (Case c : {Case{37, 5, 2}, Case{64, 8, 3}, Case{9, 3, 3}, Case{20, 6, 1}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " E=" + std::to_string(c.E) +
                 " K=" + std::to_string(c.K));
    auto probs = softmax_rows<float>(c.N, c.E, 11 + c.N);
    probs[3 * c.E + 1] = probs[3 * c.E];  // one exact tie among the candidates
    const float aux_weight = 0.01f;
    HostRouting want = host_route(probs, c.N, c.E, c.K, aux_weight);
    RoutingBuffers<float> b(c.N, c.E, c.K);
    float aux = 0.5f;  // the op adds to the layer sum
    cpu::moe_route(b.view(), &aux, probs.data(), c.N, c.E, c.K, aux_weight);
    EXPECT_EQ(b.chosen, want.chosen);
    EXPECT_EQ(b.slot_row, want.slot_row);
    EXPECT_EQ(b.row_token, want.row_token);
    EXPECT_TRUE(same_bits(b.row_gate, want.row_gate));
    EXPECT_TRUE(same_bits(b.sel_sum, want.sel_sum));
    EXPECT_TRUE(same_bits(b.frac, want.frac));
    EXPECT_EQ(std::vector<int64_t>(b.offset.begin(), b.offset.end()), want.offset);
    EXPECT_TRUE(same_bits({aux}, {0.5f + want.aux_loss}));

    auto dgate = core::test::to_float(random_vec(c.N * c.K, 5));
    std::vector<float> dprobs(c.N * c.E, 0.0f);
    cpu::moe_router_backward(dprobs.data(), b.view(), dgate.data(), c.N, c.E, c.K, aux_weight);
    EXPECT_TRUE(same_bits(dprobs, host_router_backward(want, dgate, c.N, c.E, c.K, aux_weight)));
  }
}

// L(p) = sum_rows w_row g_row(p) + aux(p) with the routing (top-k, f_e) held fixed, which is
// what moe_route computes for small moves of p away from ties; moe_router_backward with
// dgate = w must be its gradient. It accumulates into a prefilled dprobs.
TEST(MoeRouterBackward, MatchesFiniteDifferencesInFloat64) {
  const int64_t N = 13, E = 5, K = 2;
  const double aux_weight = 0.3;  // large enough that the aux term shows in the gradient
  std::vector<double> probs = softmax_rows<double>(N, E, 3);
  std::vector<double> w = random_vec(N * K, 4);
  RoutingBuffers<double> b(N, E, K);
  auto loss = [&] {
    double aux = 0.0;
    cpu::moe_route(b.view(), &aux, probs.data(), N, E, K, aux_weight);
    return core::test::dot(b.row_gate, w) + aux;
  };
  loss();
  std::vector<double> dprobs = random_vec(N * E, 6), before = dprobs;
  cpu::moe_router_backward(dprobs.data(), b.view(), w.data(), N, E, K, aux_weight);
  for (int64_t i = 0; i < N * E; ++i)
    dprobs[i] -= before[i];
  expect_gradient("moe router backward", probs, loss, dprobs);
}

TEST(MoeRoute, RefusesMoreExpertsPerTokenThanExperts) {
  RoutingBuffers<float> b(2, 2, 3);
  std::vector<float> probs(4, 0.5f);
  float aux = 0.0f;
  try {
    cpu::moe_route(b.view(), &aux, probs.data(), 2, 2, 3, 0.01f);
    FAIL() << "K = 3 > E = 2 was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_route"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("K=3"), std::string::npos) << e.what();
  }
}

// The loss ops give what the model's host loop gave: the float64 sum in index order rounded
// once, and the step sum of float(ce + aux) in float64.
TEST(LossReduction, MeanAndAccumulateEqualTheHostLoop) {
  auto losses = core::test::to_float(random_vec(1001, 8, 3.0));
  double sum = 0.0;
  for (float x : losses)
    sum += x;
  float mean = -1.0f;
  cpu::mean_loss(&mean, losses.data(), static_cast<int64_t>(losses.size()));
  EXPECT_TRUE(same_bits({mean}, {static_cast<float>(sum / 1001.0)}));

  const float ce = 2.7182817f, aux = 0.0123f;
  double acc = 1.25;
  cpu::accumulate_loss(&acc, std::vector<float>{ce, aux}.data(), 2);
  EXPECT_EQ(acc, 1.25 + static_cast<double>(ce + aux));
  cpu::accumulate_loss(&acc, &ce, 1);
  EXPECT_EQ(acc, 1.25 + static_cast<double>(ce + aux) + static_cast<double>(ce));
  EXPECT_THROW(cpu::mean_loss(&mean, losses.data(), 0), core::Error);
}

}  // namespace
