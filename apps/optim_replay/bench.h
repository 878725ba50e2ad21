// optim_replay --bench: time of one optimizer step for a GPT parameter table (modern
// architecture, untied head, no norm weights), split by optimizer, with Newton-Schulz GFLOP/s
// and the GEMM rate of this machine for comparison. One table row (or JSON object) per line.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"

namespace replay {

struct BenchOptions {
  std::string preset;  // YAML file with optim.groups; default: configs/presets/distadam_muon.yaml
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t vocab = 50304;
  int repeat = 5;
};

int bench_main(const BenchOptions& options, bool json, comm::Communicator& comm);

}  // namespace replay
