// TrainingHealth: stops a run whose model died, before it saves anything of the dead model.
//
// Checked after every step's loss and global gradient norm (the same global values on every
// rank, so every rank reaches the same verdict at the same step):
//   - a non-finite loss or gradient norm;
//   - a loss above train.diverge_loss_factor times the lowest loss of the run so far (an AdamW
//     blow-up at lr 1e6 jumps from 5.5 to 9.4e6, then sits at ln(vocab));
//   - a gradient norm of exactly zero for train.diverge_zero_grad_steps steps in a row (dead
//     units: nothing will train again).
// A verdict is thrown as TrainingDiverged, which main turns into exit status 3 with one line; the
// step that tripped is not saved, nor is any step whose gradient norm was exactly 0, so checkpoint
// rotation keeps the good checkpoints.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace engine {

class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  static constexpr int kExitStatus = 3;
};

class TrainingHealth {
 public:
  // loss_factor <= 0 or zero_grad_steps <= 0 turns that check off.
  TrainingHealth(double loss_factor, int64_t zero_grad_steps)
      : loss_factor_(loss_factor), zero_grad_steps_(zero_grad_steps) {}

  // Throws TrainingDiverged naming the step, the values and the key that governs the check.
  void check(int64_t step, double loss, double grad_norm);
  // The last step checked had a gradient norm of exactly 0: its model may be dead, not worth a
  // checkpoint.
  bool suspect() const { return zero_grad_run_ > 0; }

 private:
  double loss_factor_;
  int64_t zero_grad_steps_;
  double lowest_loss_ = std::numeric_limits<double>::infinity();
  int64_t zero_grad_run_ = 0;
};

}  // namespace engine
