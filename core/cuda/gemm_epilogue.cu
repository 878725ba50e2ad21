// The CUDA backend's GEMM with an epilogue (core/ops/gemm.h, GemmOps::gemm_epilogue): one
// cuBLASLt matmul with the epilogue fused (cublaslt_gemm.h), or, where cuBLASLt has no kernel for
// the call or ENGINE_CUDA_GEMM_EPILOGUE=0 asks for it, the unfused ops the model ran before (the
// GEMM, then add_bias, gelu_forward, gelu_backward, bias_backward), kept for side-by-side timings
// and as the fallback. ENGINE_CUDA_GEMM_EPILOGUE_BF16_C=0 takes only the bf16 D with a bf16 C
// (the bf16 residual add) unfused: C widened into an f32 scratch, the GEMM, the bias, rounded.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_backend.h"

namespace core {

namespace {

// A transient f32 device buffer from the backend's allocator (stream-ordered reuse).
class Scratch {
 public:
  Scratch(Allocator& allocator, int64_t n)
      : allocator_(allocator), bytes_(static_cast<size_t>(n) * sizeof(float)) {
    ptr_ = static_cast<float*>(allocator_.allocate(bytes_));
  }
  ~Scratch() { allocator_.deallocate(ptr_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return ptr_; }

 private:
  Allocator& allocator_;
  size_t bytes_;
  float* ptr_;
};

// An f32 D, unfused.
template <typename In>
void unfused_f32(CudaBackend& be, const GemmArgs& r, const GemmEpilogueArgs& ep, const In* a,
                 const In* b, float* d, float* aux) {
  const int64_t mn = r.m * r.n;
  switch (ep.kind) {
    case GemmEpilogue::none:
    case GemmEpilogue::bias:
    case GemmEpilogue::bgrad:
      if (r.beta != 0.0f && ep.c && ep.c != d) be.copy_block_2d(d, r.ldc, ep.c, r.ldc, r.m, r.n);
      if (ep.kind == GemmEpilogue::bgrad) be.bias_backward(ep.dbias, a, r.k, r.m);
      be.gemm(r, a, b, d);
      if (ep.kind == GemmEpilogue::bias) be.add_bias(d, ep.bias, r.m, r.n);
      return;
    case GemmEpilogue::bias_gelu:
      be.gemm(r, a, b, aux);
      be.add_bias(aux, ep.bias, r.m, r.n);
      be.gelu_forward(d, aux, mn);
      return;
    case GemmEpilogue::dgelu: {
      Scratch x(be.allocator(), mn);
      be.gemm(r, a, b, x.get());
      be.fill_zero(d, static_cast<size_t>(mn) * sizeof(float));
      be.gelu_backward(d, aux, x.get(), mn);
      return;
    }
  }
}

// A bf16 D, unfused: X in an f32 scratch (with beta != 0 from C widened: ep.c_bf16, or D in
// place), then the bf16-storing ops.
void unfused_bf16(CudaBackend& be, const GemmArgs& r, const GemmEpilogueArgs& ep, const bf16* a,
                  const bf16* b, bf16* d, bf16* aux) {
  const int64_t mn = r.m * r.n;
  const int64_t span = (r.m - 1) * r.ldc + r.n;
  Scratch x(be.allocator(), span);
  if (r.beta != 0.0f) be.bf16_to_f32(x.get(), ep.c_bf16 ? ep.c_bf16 : d, span);
  be.gemm(r, a, b, x.get());
  switch (ep.kind) {
    case GemmEpilogue::none:
      for (int64_t row = 0; row < (r.ldc == r.n ? 1 : r.m); ++row)
        be.f32_to_bf16(d + row * r.ldc, x.get() + row * r.ldc, r.ldc == r.n ? mn : r.n);
      return;
    case GemmEpilogue::bias:
      be.add_bias(x.get(), ep.bias, r.m, r.n);
      be.f32_to_bf16(d, x.get(), mn);
      return;
    case GemmEpilogue::bias_gelu:
      be.add_bias(x.get(), ep.bias, r.m, r.n);
      be.f32_to_bf16(aux, x.get(), mn);
      be.gelu_forward(d, x.get(), mn);
      return;
    case GemmEpilogue::dgelu: {
      Scratch pre(be.allocator(), mn);
      be.bf16_to_f32(pre.get(), aux, mn);
      be.gelu_backward(d, pre.get(), x.get(), mn);
      return;
    }
    case GemmEpilogue::bgrad:
      return;  // refused by resolve_gemm_epilogue_args
  }
}

}  // namespace

bool CudaBackend::fused_epilogues_enabled() {
  const char* v = std::getenv("ENGINE_CUDA_GEMM_EPILOGUE");
  return !(v && std::strcmp(v, "0") == 0);
}

bool CudaBackend::fused_bf16_c_enabled() {
  const char* v = std::getenv("ENGINE_CUDA_GEMM_EPILOGUE_BF16_C");
  return !(v && std::strcmp(v, "0") == 0);
}

bool CudaBackend::lt_gemm_epilogue(const GemmArgs& r, const GemmEpilogueArgs& ep, bool inputs_bf16,
                                   const void* a, const void* b, bool output_bf16, void* d,
                                   void* aux) {
  if (!fused_epilogues_) return false;
  LtMatmulCall call;
  call.g = r;
  call.kind = ep.kind;
  call.inputs_bf16 = inputs_bf16;
  call.output_bf16 = output_bf16;
  call.a = a;
  call.b = b;
  // A bf16 D reads a bf16 C (cuBLASLt's C has D's type and layout).
  if (output_bf16 && r.beta != 0.0f && !fused_bf16_c_) return false;
  call.c = r.beta == 0.0f ? nullptr
           : output_bf16  ? static_cast<const void*>(ep.c_bf16)
                          : static_cast<const void*>(ep.c);
  call.d = d;
  call.bias = ep.bias;
  call.aux = aux;
  if (ep.kind != GemmEpilogue::bgrad) return lt_->matmul(call);
  // cuBLASLt writes the bias gradient (=); the op accumulates it.
  Scratch sums(allocator_, r.m);
  call.bgrad = sums.get();
  if (!lt_->matmul(call)) return false;
  add(ep.dbias, ep.dbias, sums.get(), r.m);
  return true;
}

void CudaBackend::gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const float* a,
                                const float* b, float* d, float* aux) {
  const GemmArgs r = resolve_gemm_epilogue_args(args, ep, false, aux != nullptr);
  if (r.m == 0 || r.n == 0) return;
  if (!lt_gemm_epilogue(r, ep, false, a, b, false, d, aux)) unfused_f32(*this, r, ep, a, b, d, aux);
}

void CudaBackend::gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                                const bf16* b, float* d, float* aux) {
  const GemmArgs r = resolve_gemm_epilogue_args(args, ep, false, aux != nullptr);
  if (r.m == 0 || r.n == 0) return;
  if (!lt_gemm_epilogue(r, ep, true, a, b, false, d, aux)) unfused_f32(*this, r, ep, a, b, d, aux);
}

void CudaBackend::gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                                const bf16* b, bf16* d, bf16* aux) {
  const GemmArgs r = resolve_gemm_epilogue_args(args, ep, true, aux != nullptr);
  if (r.m == 0 || r.n == 0) return;
  if (!lt_gemm_epilogue(r, ep, true, a, b, true, d, aux)) unfused_bf16(*this, r, ep, a, b, d, aux);
}

}  // namespace core
