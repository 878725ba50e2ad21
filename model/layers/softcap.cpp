#include "model/layers/softcap.h"

#include <cmath>

namespace model {

LogitCap::LogitCap(const ModelConfig& config)
    : form_(config.softcap_form),
      cap_(config.softcap),
      scale_(config.softcap_scale),
      offset_(config.softcap_offset),
      gain_(config.logit_gain()),
      tanh_cap_(config.tanh_cap()) {}

float LogitCap::apply(float z) const {
  if (form_ == SoftcapForm::Sigmoid) return cap_ / (1.0f + std::exp(-(z + offset_) / scale_));
  return cap_ > 0.0f ? cap_ * std::tanh(z / cap_) : z;
}

}  // namespace model
