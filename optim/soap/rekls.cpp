#include "optim/soap/rekls.h"

namespace optim {

SoapConfig rekls_config(HyperReader& r, bool precision_key) {
  if (!precision_key && r.has("fp32_matmul_prec"))
    r.fail("fp32_matmul_prec", "is fixed by rekls (highest)");
  for (const char* key :
       {"nesterov", "correct_bias", "correct_shampoo_beta_bias", "qr_fp32_matmul_prec", "use_eigh",
        "power_iter_steps", "max_update_rms", "use_kl_shampoo", "precondition_frequency",
        "adam_warmup_steps", "use_adaptive_criteria", "adaptive_update_tolerance", "qr_sort",
        "precondition_1d", "adam_eps"})
    if (r.has(key)) r.fail(key, "is fixed by rekls (eigh every step, KL-Shampoo factors)");
  SoapConfig defaults;
  defaults.use_eigh = true;
  defaults.use_kl_shampoo = true;
  if (precision_key) defaults.fp32_matmul_prec = "high";
  return SoapConfig::from_yaml(r, defaults);
}

}  // namespace optim
