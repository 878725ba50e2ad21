// REKLS, "Realtime Eigen KL Soap" (registry `rekls`, spec section 2): SOAP with KL-Shampoo
// factors and an eigendecomposition of both factors every step, whose eigen data the next step's
// KL weights use. Every other SOAP setting is fixed at its default, as in the reference.
#pragma once

#include "optim/hyper_reader.h"
#include "optim/soap/soap.h"

namespace optim {

// Reads lr (required), betas, shampoo_beta, eps, weight_decay, weight_decay_method,
// batched_refresh, max_precond_dim (and fp32_matmul_prec, default "high", when
// `precision_key`: TpRekls exposes it); any other SOAP key is refused as fixed by REKLS.
SoapConfig rekls_config(HyperReader& reader, bool precision_key = false);

}  // namespace optim
