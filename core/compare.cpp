#include "core/compare.h"

#include <algorithm>
#include <cmath>

namespace core {

void Difference::add(double a, double b) {
  const int64_t i = count_++;
  if (!std::isfinite(a) || !std::isfinite(b)) {
    if (nonfinite_++ == 0) worst_index_ = i;
    return;
  }
  const double d = std::abs(a - b);
  sum_sq_diff_ += d * d;
  sum_sq_ref_ += b * b;
  if (nonfinite_ == 0 && (worst_index_ < 0 || d > max_abs_)) worst_index_ = i;
  max_abs_ = std::max(max_abs_, d);
  max_ref_ = std::max(max_ref_, std::abs(b));
  max_ulp_ = std::max(max_ulp_, d / ulp_f32(b));
}

double Difference::norm_rel() const {
  const double num = std::sqrt(sum_sq_diff_);
  return finite_or_inf(sum_sq_ref_ > 0 ? num / std::sqrt(sum_sq_ref_) : num);
}

double Difference::max_abs() const {
  return finite_or_inf(max_abs_);
}

double Difference::max_rel() const {
  return finite_or_inf(max_ref_ > 0 ? max_abs_ / max_ref_ : max_abs_);
}

double Difference::max_ulp() const {
  return finite_or_inf(max_ulp_);
}

double ulp_f32(double x) {
  const float f = std::abs(static_cast<float>(x));
  if (f == 0.0f) return std::numeric_limits<float>::denorm_min();
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity())) - f;
}

}  // namespace core
