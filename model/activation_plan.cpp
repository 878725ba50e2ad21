#include "model/activation_plan.h"

#include <algorithm>

namespace model {

namespace {

int64_t rounded(int64_t n) {
  return (n + 15) / 16 * 16;
}

}  // namespace

void ActivationPlan::begin(float* base) {
  base_ = base;
  used_ = 0;
  if (!base) shared_.clear();
}

int64_t ActivationPlan::finish_count() {
  int64_t end = used_;
  for (auto& [name, region] : shared_) {
    region.offset = end;
    end += rounded(region.floats);
  }
  return end;
}

float* ActivationPlan::f32(int64_t n) {
  float* p = base_ ? base_ + used_ : nullptr;
  used_ += rounded(n);
  return p;
}

float* ActivationPlan::shared(const std::string& name, int64_t n) {
  Region& r = shared_[name];
  if (!base_) {
    r.floats = std::max(r.floats, n);
    return nullptr;
  }
  return base_ + r.offset;
}

}  // namespace model
