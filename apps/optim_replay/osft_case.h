// Replay of an OSFT golden file (tests/fixtures/golden/osft/, README there): every stage of every
// step.
//
// The file holds dense weights and upstream gradients dW; the replay decomposes each weight
// itself (float64 SVD spread over the ranks, canonical signs), splits every factor by rows with
// torch.chunk counts over the ranks, and per step compares: the chain-rule gradients (grad/t),
// the clipped ones (grad_clipped/t), the projection of the file's own gradient (projected/t, and
// per world size shard/wsP/...: local V_high rows, batched U coefficients at step 1), the
// projected gradient of our trajectory, the parameters after AdamW (adamw/t), after the step
// (param/t factors and the dense W) and the AdamW moments (state/t).
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace replay {

struct OsftCheck {
  int64_t step = 0;  // 0: the decomposition
  std::string key;   // the golden key compared, e.g. "param/2/blocks.0.mlp.fc.weight.U_low"
  double max_abs = 0;
  double atol = 0;
};

// Whether `path` is an OSFT golden file (metadata optimizer "osft").
bool is_osft_golden(const std::string& path);

// Replays the case over `comm` (every rank calls it); `sets` ("key=value") change the osft
// group built from the file's hyperparameters. Returns every comparison (identical on all ranks).
std::vector<OsftCheck> replay_osft(const std::string& path, comm::Communicator& comm,
                                   const std::vector<std::string>& sets = {});

// optim_replay's report for an OSFT file: 0 when every check is within its tolerance.
int osft_main(const std::string& path, const std::vector<std::string>& sets, bool json, bool quiet,
              comm::Communicator& comm);

}  // namespace replay
