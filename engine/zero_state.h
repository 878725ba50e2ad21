// ZeroState: where the trainables' values and gradients live between the phases of a train
// step, and the communication that moves them (ZeRO, docs/DESIGN.md "One training step").
//
// The train step calls it by phase:
//   begin_step                      zero the gradients
//   per micro-step: begin_backward(last), the model's backward with the layer events
//                   (before_forward / before_backward / after_backward), end_backward
//   finish_grads                    every gradient reduced to its placement in local_grad: the
//                                   SUM over ranks and micro-steps (the trainer's one
//                                   scale applies the mean and the clipping together)
//   grad_sum_squares, scale_grads   the local parts' sum of squares and their scaling, on the
//                                   device (no read back in the middle of a step)
//   optimizer_shards                what the optimizer steps (local values and gradients)
//   publish_params                  the updated parameters back where the model reads them
// The stage is a strategy chosen once by create():
//   stages 1-2: the full values and gradients stay resident
//     in the trainables' tensors; local parts are views of the full value where they are a
//     contiguous block, own buffers otherwise. A layer's gradients are reduced in buckets of at
//     most zero.bucket_mb (all-reduce at stage 1, reduce-scatter at stage 2, comm/shard_ops.h);
//     with overlap, on the last micro-step each layer's buckets start as soon as its backward
//     is done, while the layers below compute; finish_grads starts the rest and waits. A
//     sparse-rows trainable (the embedding) is reduced as its nonzero rows only when they are at
//     most a quarter of its rows (zero.sparse_rows). Updated parameters are all-gathered.
//   stage 3: values rest as own copies of the local parts; the trainables' owner frees its full
//     buffers. A layer's full values are all-gathered into allocator buffers and bound into the
//     consumer just before its forward (layer -1, the embeddings, from the start of forward to
//     the end of backward; block l until block l+1 starts, the last block until its backward);
//     its backward gets zeroed full gradient buffers, which are reduce-scattered into the local
//     parts (accumulating over micro-steps) after that backward, then freed; with overlap and a
//     communication thread the reduction runs while the next layer below computes (one layer
//     in flight at a time, so it costs one layer's gradient buffers), finish_grads waits for
//     the last.
// Progress of collectives in flight on the CPU (zero.progress): `thread` queues every bucket on
// a communication thread (comm/comm_stream.h) with its own communicator, which runs MPI's
// blocking algorithms while the main thread computes; `poll` (the default: faster on 2 shared
// cores, apps/bench_zero/RESULTS.md) starts MPI's nonblocking collectives and tests them at
// every layer event.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_stream.h"
#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "core/backend.h"
#include "core/tracer.h"
#include "engine/trainable.h"
#include "optim/optimizer.h"

namespace engine {

struct ZeroOptions {
  bool overlap = true;             // zero.overlap
  int64_t bucket_bytes = 4 << 20;  // zero.bucket_mb; 0 = one reduction per tensor
  bool progress_thread = false;    // zero.progress == thread
  bool sparse_rows = true;         // zero.sparse_rows
  // Called with "reduce L" when a bucket of layer L's gradients is started (main thread), and
  // "running L" / "reduced L" when the communication thread begins and ends it; for tests and
  // tracing, may be called from two threads.
  std::function<void(const std::string&)> trace;
  // log.trace: the communication thread's operations and the waits for them become spans
  // (null: none; the collectives themselves are the traced communicator's).
  core::Tracer* tracer = nullptr;
  // Stage 3 calls this once it holds its own copies of the local parts, to free the full
  // buffers of the trainables' owner (the model's flat buffers).
  std::function<void()> release_full_storage;
};

class ZeroState {
 public:
  // `plan` has one entry per trainable, in the same order; comm, plan and backend must outlive
  // the state. The local parts are taken from the trainables' full values.
  static std::unique_ptr<ZeroState> create(comm::Communicator& comm, const comm::ShardingPlan& plan,
                                           std::vector<Trainable> trainables,
                                           core::Backend& backend, const ZeroOptions& options);
  virtual ~ZeroState();
  ZeroState(const ZeroState&) = delete;
  ZeroState& operator=(const ZeroState&) = delete;

  // ---- the phases of a train step (see the header comment) ------------------------------------
  virtual void begin_step() = 0;
  // `last`: the last micro-step of the step (gradients are final after each layer's backward).
  virtual void begin_backward(bool last) = 0;
  virtual void end_backward() = 0;
  virtual void before_forward(int layer) = 0;
  virtual void before_backward(int layer) = 0;
  virtual void after_backward(int layer) = 0;
  virtual void finish_grads() = 0;
  // This rank's share of the reduced gradients' sum of squares, each element counted once over
  // the ranks, written to *out (a float64 on the backend's device); the ranks' sum is the
  // squared global norm.
  void grad_sum_squares(double* out);
  // Every local gradient times *factor (on the device), but those of the trainables for which
  // `scaled_by_optimizer(name)` holds (their optimizer folds the factor into its update).
  void scale_grads(const float* factor,
                   const std::function<bool(const std::string&)>& scaled_by_optimizer);
  std::vector<optim::ParamShard> optimizer_shards() const;
  virtual void publish_params() = 0;
  // After a forward without backward (evaluation): frees the layers it gathered.
  virtual void end_forward() = 0;

  // ---- state ----------------------------------------------------------------------------------
  const comm::ShardingPlan& plan() const { return plan_; }
  const std::vector<Trainable>& trainables() const { return trainables_; }
  // This rank's local part of trainable i (undefined where it holds nothing). Writing into the
  // local values and then calling publish_params() sets the parameters (checkpoint loading).
  const core::Tensor& local_value(size_t i) const { return local_value_.at(i); }
  const core::Tensor& local_grad(size_t i) const { return local_grad_.at(i); }
  const std::vector<core::Tensor>& local_values() const { return local_value_; }
  // One line for the start-up banner: the strategy and what rests on this rank.
  virtual std::string describe() const = 0;

 protected:
  ZeroState(comm::Communicator& comm, const comm::ShardingPlan& plan,
            std::vector<Trainable> trainables, core::Backend& backend);

  // Collectives in flight (see "Progress" in the header comment). start_stream starts the
  // communication thread when options ask for it and there is more than one rank; submit queues
  // op on it (op gets the thread's communicator), or runs it here, blocking, without a thread;
  // traced, op is a span "<what> <layer>" (no layer: core::kNoIndex) on the thread that runs it,
  // and on the thread's queue from issue to completion on the issuing thread's in-flight track.
  void start_stream(const ZeroOptions& options);
  bool has_stream() const { return stream_ != nullptr; }
  void submit(const char* what, int layer, std::function<void(comm::Communicator&)> op);
  void add_pending(std::unique_ptr<comm::Work> work) { pending_.push_back(std::move(work)); }
  void poll_pending();  // without a thread: nonblocking MPI collectives advance in test()
  void wait_pending();  // every pending one; the thread's calls and bytes count as this rank's
  // A buffer in the backend's memory shaped like parameter i's local part (zero-filled on ask).
  core::Tensor local_tensor(size_t i, bool zeroed) const;

  comm::Communicator& comm_;
  const comm::ShardingPlan& plan_;
  std::vector<Trainable> trainables_;
  core::Backend& backend_;
  std::vector<core::Tensor> local_value_;
  std::vector<core::Tensor> local_grad_;

 private:
  core::Tracer* tracer_ = nullptr;
  std::vector<std::unique_ptr<comm::Work>> pending_;
  std::unique_ptr<comm::Communicator> stream_comm_;  // used only by stream_'s thread
  std::unique_ptr<comm::CommStream> stream_;
};

}  // namespace engine
