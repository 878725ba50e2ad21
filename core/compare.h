// Difference measures for checking computed numbers against a reference, shared by the tests
// and apps/optim_replay. Every measure is NaN-proof: a non-finite value on either side makes
// the measure +infinity, which fails every tolerance (a plain std::max(worst, NaN) keeps
// `worst`, and |NaN - b| <= tol is never asked if the NaN was dropped on the way).
//
// Which measure fits which quantity:
//   norm_rel  ||a - b||_2 / ||b||_2    tensors (kernels, gradients): independent of the scale
//                                      of the values, unlike an absolute floor max(1, |b|)
//   max_ulp   max_i |a_i - b_i| / ulp_f32(b_i)
//                                      elementwise float math against a float64 reference
//   max_abs   max_i |a_i - b_i|        golden trajectories, whose files give an absolute tolerance
//   max_rel   max_abs / max_i |b_i|
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace core {

class Difference {
 public:
  // One pair: a computed value and its reference.
  void add(double a, double b);

  double norm_rel() const;
  double max_abs() const;
  double max_rel() const;
  double max_ulp() const;
  int64_t count() const { return count_; }
  int64_t nonfinite() const { return nonfinite_; }
  // The element of the largest absolute difference (or the first non-finite one).
  int64_t worst_index() const { return worst_index_; }

 private:
  double finite_or_inf(double x) const {
    return nonfinite_ > 0 ? std::numeric_limits<double>::infinity() : x;
  }
  int64_t count_ = 0, nonfinite_ = 0, worst_index_ = -1;
  double sum_sq_diff_ = 0, sum_sq_ref_ = 0, max_abs_ = 0, max_ref_ = 0, max_ulp_ = 0;
};

template <typename A, typename B>
Difference compare(const A* a, const B* b, int64_t n) {
  Difference d;
  for (int64_t i = 0; i < n; ++i)
    d.add(static_cast<double>(a[i]), static_cast<double>(b[i]));
  return d;
}

// Both vectors must have the same size; a size mismatch counts as a non-finite difference.
template <typename A, typename B>
Difference compare(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) {
    Difference d;
    d.add(std::numeric_limits<double>::quiet_NaN(), 0.0);
    return d;
  }
  return compare(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

// The spacing of float numbers at |x| rounded to float (the smallest denormal at 0): one unit
// in the last place of a float result whose exact value is x.
double ulp_f32(double x);

// err <= tol, false for NaN and +infinity: the one pass/fail rule of every comparison.
inline bool within(double err, double tol) {
  return err <= tol;
}

}  // namespace core
