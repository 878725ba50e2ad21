// Record #89's YaRN (model.yarn; train_gpt.py Yarn.apply): at each change of the long attention
// window from `old` to `new` tokens the rotary frequencies become f (s + w (1 - s)), with
// s = old / new and w = clamp((old f / 2 pi - 1) / 31, 0, 1) (a pair that turns less than once
// over the old window is interpolated by s, one that turns 32 times or more kept), and the
// attention scale is multiplied by 1 + 0.2 ln(new / old). The record's attention scale 0.1 so
// becomes 0.11695, 0.12752, 0.13178 over its windows 384 -> 896 -> 1408 -> 1664. The first window
// set anchors it; a window set without rescaling (the final validation's wider window,
// apply_final_ws_ext) changes neither. One history for the plain and the paired tables: the
// record applies the same growths to both.
#pragma once

#include <vector>

#include "model/model_config.h"

namespace model {

class Yarn {
 public:
  // The unscaled frequencies of model.rotary_base and model.rotary_truncate
  // (kmath::rotary_inv_freq).
  explicit Yarn(const ModelConfig& config);
  // The long window is now `window` tokens: rescaled from the last one when `rescale` (and the
  // window changed), else only remembered when it is the first.
  void set_window(int window, bool rescale);
  // The frequency of each pair (j, j + head_dim / 2).
  const std::vector<double>& frequencies() const { return freq_; }
  // The attention scale's factor, the product of the growths' 1 + 0.2 ln(new / old).
  double scale() const { return scale_; }

 private:
  std::vector<double> freq_;
  double scale_ = 1.0;
  int window_ = 0;  // the window the frequencies are for; 0: none set yet
};

}  // namespace model
