// The logit soft-cap forms (model.softcap, model.softcap_form): cap tanh(z / cap), or the record's
// cap sigmoid((z + b) / scale) (b: model.softcap_offset, record #89's asymmetric cap 23 sigmoid((z
// + 5) / 7.5); 0 before it), which is a tanh cap of cap / 2 on (z + b) cap / (4 scale) shifted by
// cap / 2 (the softmax does not see the shift). The loss kernel takes the tanh form: the logits
// enter it times gain() plus bias() and capped at tanh_cap().
#pragma once

#include "model/model_config.h"

namespace model {

struct LogitCap {
  explicit LogitCap(const ModelConfig& config);
  // z's multiplier before the loss kernel's tanh cap, and that cap (<= 0: none).
  float gain() const { return gain_; }
  float tanh_cap() const { return tanh_cap_; }
  // What is added to gain() z before the loss kernel: gain() b (0 without an offset).
  float bias() const { return gain_ * offset_; }
  // The capped logit of z as the model's output gives it (with the sigmoid form's shift), on the
  // host.
  float apply(float z) const;

 private:
  SoftcapForm form_;
  float cap_, scale_, offset_, gain_, tanh_cap_;
};

}  // namespace model
