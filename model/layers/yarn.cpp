#include "model/layers/yarn.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/kernel_math.h"

namespace model {

Yarn::Yarn(const ModelConfig& config) {
  const int64_t half = config.head_dim() / 2;
  freq_.resize(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)
    freq_[static_cast<size_t>(j)] =
        core::kmath::rotary_inv_freq(j, half, double(config.rotary_base), config.rotary_truncate);
}

void Yarn::set_window(int window, bool rescale) {
  if (window_ == 0 || !rescale) {
    if (window_ == 0) window_ = window;
    return;
  }
  if (window == window_) return;
  // train_gpt.py Yarn.apply(old, new) with alpha 1, beta 32.
  const double old_w = window_, new_w = window, s = old_w / new_w;
  for (double& f : freq_) {
    const double turns = old_w * f / (2.0 * std::numbers::pi);
    const double w = std::clamp((turns - 1.0) / 31.0, 0.0, 1.0);
    f *= s + w * (1.0 - s);
  }
  scale_ *= 1.0 + 0.2 * std::log(new_w / old_w);
  window_ = window;
}

}  // namespace model
