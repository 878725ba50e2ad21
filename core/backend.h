// The compute floor: coarse, fused operations in the style of llm.c, general ones only. The
// Backend is the union of the op families, one header each in core/ops/ (memory, gemm,
// elementwise, norms, embedding, attention, classifier, moe, reductions, linalg, timing), and one
// implementation per device (cpu/cpu_backend, cuda/cuda_backend) with one file per family
// (cpu/<family>.cpp, cuda/<family>.cu). Everything above (model, optimizers) calls these and never
// touches a device API directly; an optimizer's own kernels live in its folder (optim/<family>/).
//
// Conventions (every family)
// - Pointers are device pointers of this backend; matrices are row-major, f32 (the GEMM family
//   also takes bf16 inputs, and the elementwise family converts to and from bf16).
// - Shapes: N rows (N = B*T tokens), C or D columns; attention tensors are [B, H, T, hd]
//   ("BH" = B*H independent heads); logits are [N, Vp] with only the first V columns real.
// - Forward ops overwrite their outputs. Backward ops ACCUMULATE (+=) into every gradient they
//   produce (dinp, dweight, ...), so residual branches and tied weights sum naturally; zero the
//   gradient buffers once per step. Where an op says "in place allowed", out may equal inp.
// - Ops run in stream order; synchronize() waits for everything issued.
#pragma once

#include <memory>

#include "core/allocator.h"
#include "core/device.h"
#include "core/ops/attention.h"
#include "core/ops/classifier.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/gemm.h"
#include "core/ops/linalg.h"
#include "core/ops/memory.h"
#include "core/ops/moe.h"
#include "core/ops/norms.h"
#include "core/ops/reductions.h"
#include "core/ops/timing.h"

namespace core {

class Backend : public MemoryOps,
                public GemmOps,
                public ElementwiseOps,
                public NormOps,
                public EmbeddingOps,
                public AttentionOps,
                public ClassifierOps,
                public MoeOps,
                public ReductionOps,
                public LinalgOps,
                public TimingOps {
 public:
  ~Backend() override = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual const char* name() const = 0;  // "cpu (OpenBLAS, 2 threads)", "cuda:0 (H100)"
  virtual void synchronize() = 0;
};

// The process-wide CPU backend (OpenMP threads from OMP_NUM_THREADS).
Backend& cpu_backend();

// True when this build has the CUDA backend and a device is present.
bool cuda_available();
// True when this build has the CUDA backend (whether or not a device is present).
bool cuda_built();
// The number of CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 without the
// CUDA backend, a driver or a device.
int cuda_device_count();
// The CUDA backend for one device; throws core::Error naming the reason when the build has no
// CUDA support or no device is present.
std::unique_ptr<Backend> make_cuda_backend(int device_index);

}  // namespace core
